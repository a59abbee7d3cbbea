"""`kerasmgpu migrate`, the losses family: integer labels in the user's own loss functions.

The source tests need libcst only. The run test trains Keras 2.3.1's mnist_siamese loss on
integer labels: as written on the keras23 env, migrated on tf_keras and Keras 3, and checks
the loss Keras reports against the same formula in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import requires
from migrate_cases import assert_idempotent, found, migrate, run_keras23, src

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity

LOSS = """
    from keras import backend as K

    def contrastive_loss(y_true, y_pred):
        '''Keras 2.3.1 examples/mnist_siamese.py.'''
        margin = 1
        square_pred = K.square(y_pred)
        margin_square = K.square(K.maximum(margin - y_pred, 0))
        return K.mean(y_true * square_pred + (1 - y_true) * margin_square)

    def plain(a, b):
        return K.mean(K.abs(a))

    def mine(yt, yp):
        return K.mean(K.square(yp - yt))

    model.compile(loss={"out": contrastive_loss}, optimizer="sgd")
    model.compile("sgd", [mine, plain])
    """


@pytest.mark.text
def test_tf_keras_casts_the_labels_where_the_function_computes_with_them() -> None:
    after = assert_idempotent(LOSS, "tf_keras")
    assert "'''Keras 2.3.1 examples/mnist_siamese.py.'''\n    y_true = tf.cast(y_true, " \
        "y_pred.dtype)\n    margin = 1\n" in after
    assert "def mine(yt, yp):\n    yt = tf.cast(yt, yp.dtype)\n" in after
    assert "def plain(a, b):\n    return" in after  # no arithmetic on its labels
    assert "import tensorflow as tf\n" in after
    casts = [(line, sev) for line, sev, message in found(LOSS, "tf_keras")
             if "tf.cast" in message]
    assert casts == [(3, Severity.INFO), (13, Severity.INFO)]


@pytest.mark.text
def test_keras3_and_keras23_leave_it() -> None:
    assert not [m for _, _, m in found(LOSS) if "tf.cast" in m]
    assert migrate(LOSS, "keras23") == "import kerasmgpu.keras23\n" + src(LOSS)


@pytest.mark.text
def test_a_function_that_casts_itself_or_is_not_a_loss_is_left() -> None:
    text = """
        def casts(y_true, y_pred):
            y_true = K.cast(y_true, "float32")
            return y_true * y_pred

        def unused(y_true, y_pred):
            return y_true * y_pred

        model.compile(loss=casts)
        """
    assert migrate(text, "tf_keras") == src(text)


RUN = '''
import numpy as np
import pytest
from keras import backend as K
from keras.layers import Dense
from keras.models import Sequential

def contrastive_loss(y_true, y_pred):
    margin = 1
    square_pred = K.square(y_pred)
    margin_square = K.square(K.maximum(margin - y_pred, 0))
    return K.mean(y_true * square_pred + (1 - y_true) * margin_square)

rng = np.random.RandomState(0)
x = rng.randn(16, 3).astype("float32")
labels = np.array([i % 2 for i in range(16)])  # int64, as the example's np.array(labels)
model = Sequential([Dense(1, input_shape=(3,), kernel_initializer="ones",
                          bias_initializer="zeros")])
model.compile(loss=contrastive_loss, optimizer="sgd")
result = float(model.evaluate(x, labels, batch_size=16, verbose=0))
'''


@requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
def test_integer_labels_give_keras23s_loss() -> None:
    result = run_keras23(RUN, "siamese_loss.py")["result"]
    rng = np.random.RandomState(0)
    pred = rng.randn(16, 3).astype("float64").sum(axis=1, keepdims=True)
    y = np.array([[i % 2] for i in range(16)], dtype="float64")
    expected = np.mean(y * pred ** 2 + (1 - y) * np.maximum(1 - pred, 0) ** 2)
    np.testing.assert_allclose(result, expected, rtol=1e-5)
