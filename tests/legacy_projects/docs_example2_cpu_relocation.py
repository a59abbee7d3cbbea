"""Keras 2.3 docs, `multi_gpu_model` Example 2: weights merged on the CPU with
`cpu_relocation=True`, falling back to one device when multi_gpu_model says no.

The model is built outside any device scope (the docs: "Not needed to change the
device scope for model definition"); a tiny functional MLP stands in for Xception.
Run by tests/test_legacy_projects.py; LEGACY_OUT names the folder it writes to.
"""
import os

import numpy as np
from keras.layers import Dense, Input
from keras.models import Model
from keras.utils import multi_gpu_model, to_categorical

num_samples = 163  # 5 batches of 32, then a last batch of 3
num_features = 8
num_classes = 3
out_dir = os.environ.get('LEGACY_OUT', '.')

# Not needed to change the device scope for model definition:
inputs = Input(shape=(num_features,))
hidden = Dense(32, activation='relu')(inputs)
outputs = Dense(num_classes, activation='softmax')(hidden)
model = Model(inputs=inputs, outputs=outputs)
initial_weights = model.get_weights()

try:
    parallel_model = multi_gpu_model(model, cpu_relocation=True)
    print("Training using multiple GPUs..")
except ValueError:
    parallel_model = model
    print("Training using single GPU or CPU..")
parallel_model.compile(loss='categorical_crossentropy', optimizer='rmsprop',
                       metrics=['accuracy'])

# The last feature is 0 everywhere but in the very last sample, so its weights
# only move if that sample (the batch remainder) reaches the gradient.
np.random.seed(1)
x = np.random.random((num_samples, num_features))
x[:, -1] = 0.
x[-1, -1] = 1.
y = to_categorical(np.random.randint(num_classes, size=num_samples), num_classes)

parallel_model.fit(x, y, epochs=2, batch_size=32, shuffle=False)
trained_weights = model.get_weights()

# Save model via the template model, as in Example 1:
model.save(os.path.join(out_dir, 'my_model.h5'))

arrays = {'parallel': (parallel_model is not model  # Keras 3 on JAX trains the model in place
                      or __import__('kerasmgpu').route_for(parallel_model) is not None), 'marker_feature': num_features - 1}
for i, w in enumerate(initial_weights):
    arrays['initial_%d' % i] = w
for i, w in enumerate(trained_weights):
    arrays['trained_%d' % i] = w
np.savez(os.path.join(out_dir, 'weights.npz'), **arrays)
