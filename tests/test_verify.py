"""parallelize(verify=True): the self-check passes on what is right and raises on what
is broken on purpose, before any weight moves (Keras 3 on JAX and TensorFlow); refused
elsewhere.

One small model, 101 rows in batches of 40 on 3 replicas: the first batch is padded
(40 = 3 x 14 - 2) and the last (21 rows) is short.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    BACKEND,
    IN_PROCESS,
    LINE,
    assert_weights_close,
    classification_data,
    keras_module,
    mlp,
    requires,
)

import kerasmgpu
from kerasmgpu import batching
from kerasmgpu.env.versions import KerasLine

# The routes the check runs on: Keras 3 on JAX and on TensorFlow.
CHECKED = IN_PROCESS and LINE is KerasLine.KERAS_3 and BACKEND in ("jax", "tensorflow")

X, Y = classification_data(101)
FIT = dict(batch_size=40, epochs=1, shuffle=False, verbose=0)


def test_bad_verify_value_is_refused_before_anything() -> None:
    with pytest.raises(TypeError, match=r"Received: verify='yes'.*Allowed: True, False or None"
                       r".*Fix:"):
        kerasmgpu.parallelize(object(), verify="yes")


def test_verification_error_is_public_without_a_framework() -> None:
    assert issubclass(kerasmgpu.VerificationError, RuntimeError)
    assert "VerificationError" in kerasmgpu.__all__


@requires(in_process=True)
@pytest.mark.skipif(CHECKED, reason="Keras 3 on JAX and TensorFlow run the check")
def test_verify_is_refused_where_it_does_not_run_yet(monkeypatch) -> None:
    keras = keras_module()
    with pytest.raises(ValueError, match=r"Received: verify=True.*Allowed: False on the.*Fix:"):
        kerasmgpu.parallelize(mlp(keras), gpus=3, verify=True)
    monkeypatch.setenv("KERASMGPU_VERIFY", "1")
    with pytest.raises(ValueError, match="verify"):
        kerasmgpu.parallelize(mlp(keras), gpus=3)
    assert kerasmgpu.parallelize(mlp(keras), gpus=3, verify=False) is not None


checked = pytest.mark.skipif(not CHECKED, reason="needs Keras 3 on JAX or TensorFlow")

if CHECKED:
    keras = keras_module()

    class Scale(keras.layers.Layer):
        """Multiplies by a Python attribute read in call (no variable holds it)."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.factor = 1.0

        def call(self, x):
            return x * self.factor


def _model(scaled: bool = False):
    if not scaled:
        return mlp(keras)
    keras.utils.set_random_seed(1)
    inputs = keras.Input((20,))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    scaled_out = Scale(name="scale")(hidden)
    outputs = keras.layers.Dense(3, activation="softmax", name="out")(scaled_out)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


@checked
def test_verify_changes_nothing_on_a_correct_model() -> None:
    one, plain, checked = _model(), _model(), _model()
    one.fit(X, Y, **FIT)
    kerasmgpu.parallelize(plain, gpus=3).fit(X, Y, **FIT)
    pchecked = kerasmgpu.parallelize(checked, gpus=3, verify=True)
    pchecked.fit(X, Y, **FIT)
    assert_weights_close(checked, plain, atol=0)
    assert_weights_close(checked, one, atol=1e-5)
    np.testing.assert_allclose(pchecked.predict(X, batch_size=40, verbose=0),
                               one.predict(X, batch_size=40, verbose=0), atol=1e-5)
    pchecked.evaluate(X, Y, batch_size=40, verbose=0)


def _kernel_changed(pmodel):
    kernel = pmodel.layers[1].kernel
    kernel.assign(np.asarray(kernel.value) + 0.5)
    return "dense"


def _padding_wrong(pmodel, monkeypatch):
    monkeypatch.setattr(batching.BatchPlan, "mask", lambda self: np.ones(self.padded, "float32"))
    return "loss"


def _state_missed(pmodel):
    pmodel.get_layer("scale").factor = 3.0
    return "'scale'"


@checked
@pytest.mark.parametrize("fault", ["kernel", "padding", "state"])
def test_verify_raises_before_any_weight_moves(fault, monkeypatch) -> None:
    template = _model(scaled=fault == "state")
    pmodel = kerasmgpu.parallelize(template, gpus=3, verify=True)
    if fault == "kernel":
        named = _kernel_changed(pmodel)
    elif fault == "padding":
        named = _padding_wrong(pmodel, monkeypatch)
    else:
        named = _state_missed(pmodel)
    before = [w.copy() for w in pmodel.get_weights()]
    before_template = [w.copy() for w in template.get_weights()]
    with pytest.raises(kerasmgpu.VerificationError, match=named) as raised:
        pmodel.fit(X, Y, **FIT)
    assert "Nothing was applied" in str(raised.value)
    for a, b in zip(pmodel.get_weights() + template.get_weights(), before + before_template):
        np.testing.assert_array_equal(a, b)
    assert int(np.asarray(template.optimizer.iterations)) == 0


@checked
def test_predict_and_evaluate_compare_their_first_batch() -> None:
    pmodel = kerasmgpu.parallelize(_model(), gpus=3, verify=True)
    _kernel_changed(pmodel)
    for call in (lambda: pmodel.predict(X, batch_size=40, verbose=0),
                 lambda: pmodel.evaluate(X, Y, batch_size=40, verbose=0)):
        with pytest.raises(kerasmgpu.VerificationError, match="dense"):
            call()


@checked
def test_environment_variable_turns_it_on_and_an_explicit_false_wins(monkeypatch) -> None:
    monkeypatch.setenv("KERASMGPU_VERIFY", "1")
    pmodel = kerasmgpu.parallelize(_model(), gpus=3)
    _kernel_changed(pmodel)
    with pytest.raises(kerasmgpu.VerificationError):
        pmodel.fit(X, Y, **FIT)
    unchecked = kerasmgpu.parallelize(_model(), gpus=3, verify=False)
    _kernel_changed(unchecked)
    unchecked.fit(X, Y, **FIT)  # explicit verify=False: no check, trains
