"""`parallelize(sync_batchnorm=True)`: BatchNormalization as on one device.

Keras 3 on JAX and TensorFlow (and a layer's own `synchronized=True` there). A Dense ->
BatchNormalization -> Dense model, 47 rows at batch 10 on 3 replicas (every
batch padded to 12, the last one of 7 rows to 9), against plain Keras on one device
from the same weights: weights, moving mean and variance, History, evaluate. Without
the option the padding rows enter the statistics (the check can fail). The routes that
cannot synchronize yet refuse the option before anything is touched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    LINE,
    ON_JAX,
    ON_TF,
    assert_history_close,
    keras_module,
    requires,
    seed_all,
)

import kerasmgpu
from kerasmgpu.env.versions import KerasLine

KERAS3_TF = ON_TF and LINE is KerasLine.KERAS_3
SYNCHRONIZES = ON_JAX or KERAS3_TF
needs_sync = pytest.mark.skipif(not SYNCHRONIZES, reason="synchronized BatchNorm needs "
                                "Keras 3 on JAX or TensorFlow")

if IN_PROCESS:
    keras = keras_module()

ROWS, BATCH = 47, 10


def _model(**norm: Any) -> Any:
    seed_all(keras, 3)
    inputs = keras.Input((6,))
    hidden = keras.layers.BatchNormalization(**norm)(keras.layers.Dense(8)(inputs))
    outputs = keras.layers.Dense(1)(keras.layers.Activation("relu")(hidden))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse", metrics=["mae"])
    return model


def _data() -> Any:
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(ROWS, 6)) * 3 + 1).astype("float32")
    return x, rng.normal(size=(ROWS, 1)).astype("float32")


def _max_difference(a: Any, b: Any) -> float:
    return max(float(np.abs(u - v).max()) for u, v in zip(a.get_weights(), b.get_weights()))


def _synchronized(layer_own: bool) -> None:
    x, y = _data()
    norm = {"synchronized": True} if layer_own else {}
    one = _model(**norm)
    h_one = one.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    template = _model(**norm)
    parallel = kerasmgpu.parallelize(template, **({} if layer_own else {"sync_batchnorm": True}))
    h_par = parallel.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    norm = [layer for layer in template.layers
            if isinstance(layer, keras.layers.BatchNormalization)][0]
    reference = [layer for layer in one.layers
                 if isinstance(layer, keras.layers.BatchNormalization)][0]
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_allclose(np.asarray(getattr(norm, name)),
                                   np.asarray(getattr(reference, name)),
                                   atol=1e-4, rtol=1e-4, err_msg=name)
    assert _max_difference(one, template) < 1e-4
    assert_history_close(h_one, h_par, rtol=1e-4)
    np.testing.assert_allclose(one.evaluate(x, y, verbose=0),
                               parallel.evaluate(x, y, batch_size=BATCH, verbose=0),
                               rtol=1e-4, atol=1e-5)
    # Without the option the padding rows count in the moments: the check above can fail.
    other = _model()
    kerasmgpu.parallelize(other).fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                                     verbose=0)
    assert _max_difference(one, other) > 1e-2


@pytest.mark.core
@needs_sync
def test_sync_batchnorm_equals_one_device_on_padded_batches() -> None:
    _synchronized(layer_own=False)


@pytest.mark.core
@pytest.mark.skipif(not KERAS3_TF, reason="BatchNormalization(synchronized=True) is Keras 3 "
                    "on TensorFlow only")
def test_a_layers_own_synchronized_is_honoured_with_padding_left_out() -> None:
    # Keras's own synchronized moments would count the padding rows.
    _synchronized(layer_own=True)


@pytest.mark.core
@requires(in_process=True)
def test_sync_batchnorm_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"sync_batchnorm=.*Allowed: True or False"):
        kerasmgpu.parallelize(_model(), sync_batchnorm="yes")


@pytest.mark.core
@pytest.mark.skipif(not IN_PROCESS or SYNCHRONIZES, reason="needs an in-process route that "
                    "cannot synchronize BatchNorm yet (tf.keras, tf_keras)")
def test_sync_batchnorm_elsewhere_is_refused_before_anything() -> None:
    model = _model()
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"sync_batchnorm=True.*mirrored.*Fix:"):
        kerasmgpu.parallelize(model, sync_batchnorm=True)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
