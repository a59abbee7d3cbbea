"""The keras-extras recipe (kuza55's `make_parallel`, from the multi-GPU GitHub thread)
on an MNIST-style MLP, as Keras 2.x users copied it into their training scripts.

Its `get_slice` takes `shape[:1] // parts` rows per GPU, so the rows of a batch that do
not divide by the GPU count are dropped and Keras fails on the last, short batch:
"Incompatible shapes [483,1] vs [482,1]". Here 197 samples in batches of 32 leave a
last batch of 5 (2 + 2 rows kept, the 5th lost). GPU_COUNT sets the GPU count (2);
LEGACY_OUT names the folder it writes to (run by tests/test_legacy_projects.py).
"""
from __future__ import print_function

import os

import numpy as np
import tensorflow as tf
from keras.layers import Dense, Dropout, Input, Lambda, concatenate
from keras.models import Model
from keras.optimizers import RMSprop
from keras.utils import to_categorical


def make_parallel(model, gpu_count):
    def get_slice(data, idx, parts):
        shape = tf.shape(data)
        size = tf.concat([ shape[:1] // parts, shape[1:] ],axis=0)
        stride = tf.concat([ shape[:1] // parts, shape[1:]*0 ],axis=0)
        start = stride * idx
        return tf.slice(data, start, size)

    outputs_all = []
    for i in range(len(model.outputs)):
        outputs_all.append([])

    #Place a copy of the model on each GPU, each getting a slice of the batch
    for i in range(gpu_count):
        with tf.device('/gpu:%d' % i):
            with tf.name_scope('tower_%d' % i) as scope:

                inputs = []
                #Slice each input into a piece for processing on this GPU
                for x in model.inputs:
                    input_shape = tuple(x.get_shape().as_list())[1:]
                    slice_n = Lambda(get_slice, output_shape=input_shape, arguments={'idx':i,'parts':gpu_count})(x)
                    inputs.append(slice_n)

                outputs = model(inputs)

                if not isinstance(outputs, list):
                    outputs = [outputs]

                #Save all the outputs for merging back together later
                for l in range(len(outputs)):
                    outputs_all[l].append(outputs[l])

    # merge outputs on CPU
    with tf.device('/cpu:0'):
        merged = []
        for outputs in outputs_all:
            merged.append(concatenate(outputs, axis=0))

        return Model(inputs=model.inputs, outputs=merged)


gpu_count = int(os.environ.get('GPU_COUNT', '2'))
batch_size = 16 * gpu_count  # 16 samples per GPU
num_classes = 10
epochs = 2
num_pixels = 20  # a tiny stand-in for MNIST's 784
out_dir = os.environ.get('LEGACY_OUT', '.')

# fake MNIST: 197 samples, so the last batch has 5 rows
np.random.seed(3)
x_train = np.random.random((197, num_pixels)).astype('float32')
# The last pixel is 0 everywhere but in the very last sample, so its weights
# only move if that sample (the batch remainder) reaches the gradient.
x_train[:, -1] = 0.
x_train[-1, -1] = 1.
y_train = to_categorical(np.random.randint(num_classes, size=197), num_classes)

# build the template on the CPU, the keras-extras way
with tf.device('/cpu:0'):
    inputs = Input(shape=(num_pixels,))
    x = Dense(32, activation='relu')(inputs)
    x = Dropout(0.2)(x)
    x = Dense(32, activation='relu')(x)
    predictions = Dense(num_classes, activation='softmax')(x)
    model = Model(inputs=inputs, outputs=predictions)

template = model  # keep the single-GPU model: it is the one to save
initial_weights = template.get_weights()

if gpu_count > 1:
    model = make_parallel(model, gpu_count)

model.compile(loss='categorical_crossentropy',
              optimizer=RMSprop(),
              metrics=['accuracy'])

history = model.fit(x_train, y_train,
                    batch_size=batch_size,
                    epochs=epochs,
                    verbose=1,
                    shuffle=False)
trained_weights = template.get_weights()

template.save(os.path.join(out_dir, 'mnist_mlp.h5'))

arrays = {'parallel': (model is not template  # Keras 3 on JAX trains the model in place
                      or __import__('kerasmgpu').route_for(model) is not None), 'marker_feature': num_pixels - 1}
for i, w in enumerate(initial_weights):
    arrays['initial_%d' % i] = w
for i, w in enumerate(trained_weights):
    arrays['trained_%d' % i] = w
np.savez(os.path.join(out_dir, 'weights.npz'), **arrays)
