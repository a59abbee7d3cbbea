"""Keras 2.3 docs, `multi_gpu_model` Example 1: the template model built on the CPU.

As in the docs, with a tiny MLP in place of Xception and a few hundred samples.
Run by tests/test_legacy_projects.py; LEGACY_OUT names the folder it writes to.
"""
import os

import numpy as np
import tensorflow as tf
from keras.layers import Dense
from keras.models import Sequential
from keras.utils import multi_gpu_model

num_samples = 163  # 5 batches of 32, then a last batch of 3
num_features = 8
num_classes = 3
batch_size = 32
out_dir = os.environ.get('LEGACY_OUT', '.')

# Instantiate the base model (or "template" model).
# We recommend doing this with under a CPU device scope,
# so that the model's weights are hosted on CPU memory.
# Otherwise they may end up hosted on a GPU, which would
# complicate weight sharing.
with tf.device('/cpu:0'):
    model = Sequential()
    model.add(Dense(32, activation='relu', input_shape=(num_features,)))
    model.add(Dense(num_classes, activation='softmax'))

initial_weights = model.get_weights()

# Replicates the model on 2 GPUs.
parallel_model = multi_gpu_model(model, gpus=2)
parallel_model.compile(loss='categorical_crossentropy',
                       optimizer='rmsprop')

# Generate dummy data.
# The last feature is 0 everywhere but in the very last sample, so its weights
# only move if that sample (the batch remainder) reaches the gradient.
np.random.seed(0)
x = np.random.random((num_samples, num_features))
x[:, -1] = 0.
x[-1, -1] = 1.
y = np.eye(num_classes)[np.random.randint(num_classes, size=num_samples)]

# This `fit` call will be distributed on 2 GPUs.
# Since the batch size is 32, each GPU will process 16 samples.
parallel_model.fit(x, y, epochs=2, batch_size=batch_size, shuffle=False)
trained_weights = model.get_weights()

# Save model via the template model (which shares the same weights):
model.save(os.path.join(out_dir, 'my_model.h5'))

arrays = {'parallel': (parallel_model is not model  # Keras 3 on JAX trains the model in place
                      or __import__('kerasmgpu').route_for(parallel_model) is not None), 'marker_feature': num_features - 1}
for i, w in enumerate(initial_weights):
    arrays['initial_%d' % i] = w
for i, w in enumerate(trained_weights):
    arrays['trained_%d' % i] = w
np.savez(os.path.join(out_dir, 'weights.npz'), **arrays)
