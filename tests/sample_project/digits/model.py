"""Build and train the classifier, Keras 2.3 style: the template model is built, wrapped by
multi_gpu_model, the wrapper compiled and trained from a generator, the template saved."""
import numpy as np
from keras.layers.core import Dense, Dropout
from keras.models import Sequential
from keras.optimizers import Adam
from keras.utils import multi_gpu_model


def build(n_features, n_classes):
    model = Sequential()
    model.add(Dense(64, activation='relu', input_shape=(n_features,)))
    model.add(Dropout(0.1))
    model.add(Dense(n_classes, activation='softmax'))
    return model


def batches(x, y, batch_size):
    while True:
        for start in range(0, len(x), batch_size):
            yield x[start:start + batch_size], y[start:start + batch_size]


def train(x, y, path, epochs=8, batch_size=64, gpus=2):
    template = build(x.shape[1], y.shape[1])
    parallel = multi_gpu_model(template, gpus=gpus)
    parallel.compile(loss='categorical_crossentropy', optimizer=Adam(lr=0.01),
                     metrics=['accuracy'])
    steps = int(np.ceil(len(x) / float(batch_size)))
    history = parallel.fit_generator(batches(x, y, batch_size), steps_per_epoch=steps,
                                     epochs=epochs, workers=1, verbose=0)
    template.save(path)
    return template, history
