"""What the data means is what plain Keras on one device makes of it, on every line.

`class_weight` (Keras 3 weighs a class the dict does not list 1; tf.keras wants every
class listed and refuses otherwise), shuffled `tf.data` pipelines (the permutation of
each epoch), and target structures (a dict keyed by output names for a model whose
outputs are a list, ...). Every case runs a plain one-device model and the parallel
model from the same weights on the same data - 101 rows, batches of 10, so that 3
replicas pad every batch and 2 the last - and compares weights, History and
evaluate; where Keras refuses the data, the parallel model must refuse it too, with
the same exception type.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, Dict

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    LINE,
    REPLICAS,
    assert_history_close,
    assert_weights_close,
    classification_data,
    keras_module,
    mlp,
    requires,
)

import kerasmgpu
from kerasmgpu.env.versions import KerasLine

pytestmark = requires(in_process=True)

if IN_PROCESS:
    keras = keras_module()
KERAS3 = LINE is KerasLine.KERAS_3
HAS_TF = importlib.util.find_spec("tensorflow") is not None
X, Y = classification_data(rows=101)
ROWS = len(X)


def _python_batches(*arrays: np.ndarray, batch: int = 10) -> Any:
    base = getattr(keras.utils, "PyDataset", None) or keras.utils.Sequence

    class Batches(base):  # type: ignore[misc, valid-type]
        def __len__(self) -> int:
            return -(-ROWS // batch)

        def __getitem__(self, i: int) -> Any:
            return tuple(a[i * batch:(i + 1) * batch] for a in arrays)

    return Batches()


def _generator(*arrays: np.ndarray, batch: int = 10) -> Any:
    for i in range(-(-ROWS // batch)):
        yield tuple(a[i * batch:(i + 1) * batch] for a in arrays)


def _dataset(*arrays: np.ndarray, batch: int = 10) -> Any:
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(tuple(arrays)).batch(batch)


# fit() arguments for one input kind: a fresh generator or dataset per call.
INPUTS: Dict[str, Callable[..., Dict[str, Any]]] = {
    "arrays": lambda *a: dict(x=a[0], y=a[1], sample_weight=a[2] if len(a) > 2 else None,
                              batch_size=10),
    "pydataset": lambda *a: dict(x=_python_batches(*a)),
    "generator": lambda *a: dict(x=_generator(*a), steps_per_epoch=-(-ROWS // 10)),
}
if HAS_TF:
    INPUTS["tf.data"] = lambda *a: dict(x=_dataset(*a))


def _fit_both(replicas: int, inputs: str, arrays: tuple, epochs: int = 2,
              **fit: Any) -> None:
    """One device and the parallel model on the same data: equal weights, History,
    evaluate. A generator is one pass: one epoch."""
    if inputs == "generator":
        epochs = 1
    single, template = mlp(keras), mlp(keras)
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    h1 = single.fit(epochs=epochs, shuffle=False, verbose=0, **INPUTS[inputs](*arrays), **fit)
    h2 = pmodel.fit(epochs=epochs, shuffle=False, verbose=0, **INPUTS[inputs](*arrays), **fit)
    assert_weights_close(single, template)
    assert_history_close(h1, h2)
    np.testing.assert_allclose(single.evaluate(X, Y, batch_size=10, verbose=0),
                               pmodel.evaluate(X, Y, batch_size=10, verbose=0), rtol=1e-5)


def _refused_by_both(replicas: int, inputs: str, arrays: tuple,
                     expected: type = ValueError, **fit: Any) -> None:
    """Keras refuses the data on one device; the parallel model refuses it too, with
    the same exception type, before its weights change."""
    single, template = mlp(keras), mlp(keras)
    with pytest.raises(expected):
        single.fit(epochs=1, shuffle=False, verbose=0, **INPUTS[inputs](*arrays), **fit)
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    before = template.get_weights()
    with pytest.raises(expected):
        pmodel.fit(epochs=1, shuffle=False, verbose=0, **INPUTS[inputs](*arrays), **fit)
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)


# --- class_weight -------------------------------------------------------------------------

LISTED = {0: 1.0, 1: 2.5, 2: 0.5}
UNLISTED_MIDDLE = {0: 1.0, 2: 3.0}  # class 1 not listed
UNLISTED_TOP = {0: 0.5, 1: 2.0}  # class 2, above every key, not listed
INTEGERS = {0: 1, 1: 3, 2: 2}  # integer weights: a padded batch multiplies fractions in
# Keras 3 takes class_weight with arrays, a tf.data.Dataset or a PyDataset, not with a
# Python generator; tf.keras with all four.
WEIGHABLE = [k for k in INPUTS if not (KERAS3 and k == "generator")]


@pytest.mark.core
@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize("inputs", WEIGHABLE)
def test_class_weight_listing_every_class(replicas: int, inputs: str) -> None:
    _fit_both(replicas, inputs, (X, Y), class_weight=LISTED)
    _fit_both(replicas, inputs, (X, Y), class_weight=INTEGERS)


@pytest.mark.core
@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize("inputs", WEIGHABLE)
def test_class_weight_not_listing_a_class(replicas: int, inputs: str) -> None:
    """Keras 3 weighs an unlisted class 1 (the parallel model gave it 0 on a batched
    tf.data and refused arrays); tf.keras refuses keys that are not 0 .. K-1."""
    if KERAS3:
        _fit_both(replicas, inputs, (X, Y), class_weight=UNLISTED_MIDDLE)
        onehot = np.eye(3, dtype="float32")[Y]
        if inputs in ("arrays", "tf.data"):
            _fit_both_categorical(replicas, inputs, onehot)
    else:
        _refused_by_both(replicas, inputs, (X, Y), class_weight=UNLISTED_MIDDLE)


def _fit_both_categorical(replicas: int, inputs: str, onehot: np.ndarray) -> None:
    def build() -> Any:
        model = mlp(keras, compile=False)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="categorical_crossentropy",
                      metrics=["accuracy"])
        return model

    single, template = build(), build()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    fit = dict(epochs=2, shuffle=False, verbose=0, class_weight=UNLISTED_MIDDLE)
    h1 = single.fit(**INPUTS[inputs](X, onehot), **fit)
    h2 = pmodel.fit(**INPUTS[inputs](X, onehot), **fit)
    assert_weights_close(single, template)
    assert_history_close(h1, h2)


@pytest.mark.core
@pytest.mark.parametrize("inputs", WEIGHABLE)
def test_a_class_above_every_key(inputs: str) -> None:
    """Keras 3 weighs it 1 for arrays and a PyDataset; a tf.data pipeline (Keras 3)
    and every input on tf.keras look it up in a table and fail."""
    replicas = REPLICAS[-1]
    if KERAS3 and inputs != "tf.data":
        _fit_both(replicas, inputs, (X, Y), class_weight=UNLISTED_TOP)
        return
    import tensorflow as tf

    _refused_by_both(replicas, inputs, (X, Y), expected=tf.errors.InvalidArgumentError,
                     class_weight=UNLISTED_TOP)


def _combines_class_and_sample_weights() -> bool:
    """tf.keras 2.12 multiplies them; 2.13+ fail (an unknown batch size in a reshape);
    Keras 3 refuses them."""
    if KERAS3:
        return False
    from kerasmgpu.env.versions import detect_keras_line

    return detect_keras_line()[1].release[:2] == (2, 12)


@pytest.mark.core
@pytest.mark.parametrize("inputs", list(INPUTS))
def test_class_weight_beside_sample_weight(inputs: str) -> None:
    replicas = REPLICAS[-1]
    weights = np.linspace(0.5, 1.5, ROWS).astype("float32")
    if KERAS3 and inputs == "generator":
        _refused_by_both(replicas, inputs, (X, Y, weights), class_weight=LISTED)
    elif _combines_class_and_sample_weights():
        _fit_both(replicas, inputs, (X, Y, weights), class_weight=LISTED)
    else:
        _refused_by_both(replicas, inputs, (X, Y, weights), class_weight=LISTED)


@pytest.mark.core
def test_class_weight_with_a_generator_on_keras3_or_a_nested_target() -> None:
    replicas = REPLICAS[-1]
    if KERAS3:
        _refused_by_both(replicas, "generator", (X, Y), class_weight=LISTED)
    single, template = mlp(keras), mlp(keras)
    with pytest.raises(ValueError):
        single.fit(X, [Y], batch_size=10, class_weight=LISTED, verbose=0)
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    with pytest.raises(ValueError, match="single output"):
        pmodel.fit(X, [Y], batch_size=10, class_weight=LISTED, verbose=0)


@pytest.mark.core
def test_train_on_batch_with_class_weight() -> None:
    replicas = REPLICAS[-1]
    single, template = mlp(keras), mlp(keras)
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    cw = UNLISTED_MIDDLE if KERAS3 else LISTED
    for start in range(0, 40, 10):
        l1 = single.train_on_batch(X[start:start + 10], Y[start:start + 10], class_weight=cw)
        l2 = pmodel.train_on_batch(X[start:start + 10], Y[start:start + 10], class_weight=cw)
        np.testing.assert_allclose(l1, l2, rtol=1e-5)
    assert_weights_close(single, template)
