"""Compile metrics and losses whose value for a batch is one number (`def rmse(y_true,
y_pred): return sqrt(mean(square(y_pred - y_true)))`, a batch maximum, a mean without an
axis): Keras averages them over batches, each computed over its whole batch on one
device.

Where one program runs the global batch (Keras 3 on JAX) they train exactly as on one
device - short batches go whole, as for a loss term of the batch - and where each replica
runs its own step (the TensorFlow lines; torch in tests/test_distributed.py's job) they
are refused before any weight moves: before, TensorFlow averaged the replicas' values
(a batch maximum 1.58 for one device's 1.85, silently) and a padded batch crashed
inside Keras; so did JAX. Keras 2.3's multi_gpu_model computes them over its merged
outputs, as one device. A metric of one value per row, beside them, is unaffected.

22 rows in batches of 8 on 3 replicas: 8 rows do not divide (padded, or whole), the last
6 do; 2 epochs.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    ON_JAX,
    ON_LEGACY,
    ON_TF,
    assert_history_close,
    assert_refused_untouched,
    assert_weights_close,
    deterministic_weights,
    keras_module,
    seed_all,
    short_batch_data,
)

import kerasmgpu

pytestmark = pytest.mark.core

keras = keras_module()
ops = keras.ops if hasattr(keras, "ops") else keras.backend

X, Y = short_batch_data()
FIT = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)


def rmse(y_true: Any, y_pred: Any) -> Any:  # one value per batch
    return ops.sqrt(ops.mean(ops.square(y_pred - y_true)))


def worst(y_true: Any, y_pred: Any) -> Any:  # one value per batch
    return ops.max(ops.abs(y_pred - y_true))


def per_row(y_true: Any, y_pred: Any) -> Any:  # one value per row: not one of them
    return ops.mean(ops.abs(y_pred - y_true), axis=-1)


class Net(keras.Model):
    """Subclassed: no declared outputs, so its targets tell the metrics (arrays), or its
    first step (a generator)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, x: Any) -> Any:
        return self.out(self.hidden(x))


def _model(subclassed: bool = False) -> Any:
    if subclassed and ON_TF:
        # Net has no get_config to be copied by: built in scope, trained as it is.
        with kerasmgpu.scope():
            return _built(subclassed)
    return _built(subclassed)


def _built(subclassed: bool) -> Any:
    seed_all(keras, 1)
    if subclassed:
        model = Net()
        model(X[:2])  # built: weights to copy, but still no declared outputs
    else:
        inputs = keras.Input((5,))
        model = keras.Model(inputs, keras.layers.Dense(1)(
            keras.layers.Dense(8, activation="tanh")(inputs)))
    deterministic_weights(model, 1)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                  metrics=[rmse, worst, per_row])
    return model


def _untouched(model: Any, start: Any) -> None:
    for a, b in zip(start, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not (ON_JAX or ON_LEGACY), reason="one program over the global batch "
                    "(Keras 3 on JAX) or merged outputs (Keras 2.3); the TF lines refuse")
@pytest.mark.parametrize("subclassed", [False, True])
def test_a_metric_of_the_batch_trains_as_on_one_device(subclassed: bool) -> None:
    if subclassed and ON_LEGACY:
        pytest.skip("Keras 2.3's multi_gpu_model copies no subclassed model")
    # A subclassed model declares no outputs: its targets' shapes tell the metrics.
    one, template = _model(subclassed), _model(subclassed)
    expected = one.fit(X, Y, **FIT)
    evaluated = one.evaluate(X, Y, batch_size=8, verbose=0)
    pmodel = kerasmgpu.parallelize(template, gpus=3)
    got = pmodel.fit(X, Y, **FIT)
    assert_history_close(expected, got)
    np.testing.assert_allclose(pmodel.evaluate(X, Y, batch_size=8, verbose=0), evaluated,
                               rtol=1e-5)
    assert_weights_close(one, template)
    # The metrics differ from the shares' averages here: the comparison can fail.
    assert abs(expected.history["worst"][0] - expected.history["per_row"][0]) > 0.1


@pytest.mark.skipif(not ON_JAX, reason="one program over the global batch: Keras 3 on JAX")
def test_a_metric_of_the_batch_on_a_padded_generator_batch_without_declared_outputs(
        ) -> None:
    """Neither the model's outputs nor arrays of targets tell the metric up front, so a
    generator's short batch is padded as for any model: refused at its first padded
    step. (Keras 3
    on JAX leaves a model's variables unset after any exception inside a step, as on one
    device: the weights are not compared.)"""
    pmodel = kerasmgpu.parallelize(_model(subclassed=True), gpus=3)
    with pytest.raises(ValueError, match=r"Invalid `metrics`\. Received: metrics=metric "
                       r"'rmse' \(one value per batch\)\. Allowed: such a metric on a model "
                       r"whose outputs are declared .* Fix: build the model"):
        # (Several batches: Keras 3.3 reads one ahead of the step.) 8 rows: padded.
        pmodel.evaluate((b for b in [(X[:8], Y[:8])] * 3), steps=1, verbose=0)


@pytest.mark.skipif(not ON_TF, reason="replicas that run their own step: the TF lines "
                    "(torch: tests/test_distributed.py)")
@pytest.mark.parametrize("subclassed", [False, True])
def test_a_metric_of_the_batch_is_refused_where_each_replica_runs_its_step(
        subclassed: bool) -> None:
    template = _model(subclassed)
    start = template.get_weights()
    expected = (r"Invalid `metrics`\. Received: metrics=metric 'rmse' \(one value per "
                r"batch\)(, metric 'worst' \(one value per batch\))?\. Allowed: metrics of "
                r"one value per row.* Fix: return one value per row")
    if subclassed:  # told at its first step, before anything is applied
        pmodel = kerasmgpu.parallelize(template, gpus=3)
        with pytest.raises(ValueError, match=expected):
            pmodel.fit(X, Y, **dict(FIT, batch_size=6))  # even batches: nothing padded
        _untouched(pmodel, start)
    else:
        with pytest.raises(ValueError, match=expected):
            kerasmgpu.parallelize(template, gpus=3)
    _untouched(template, start)


def mean_square(y_true: Any, y_pred: Any) -> Any:  # a loss of one value per batch
    return ops.mean(ops.square(y_pred - y_true))


@pytest.mark.skipif(not IN_PROCESS, reason="an in-process multi-device route")
def test_a_loss_of_one_value_per_batch_is_exact_or_refused() -> None:
    """`mean(square(...))` without an axis, the Keras 2 habit: on JAX exact on padded
    batches (they went 1e-2 off in weights); on the TF lines refused before training
    (Keras 3 on TensorFlow reported 3x one device's loss, even on batches that divide)."""
    def built() -> Any:
        model = _model()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=mean_square,
                      metrics=[per_row])
        return model

    one, template = built(), built()
    if ON_TF:
        start = template.get_weights()
        with pytest.raises(ValueError, match=r"Invalid `loss`\. Received: loss=loss "
                           r"'mean_square' \(one value per batch\)\. .* Fix: reduce over "
                           r"the last axis only"):
            kerasmgpu.parallelize(template, gpus=3)
        _untouched(template, start)
        return
    expected = one.fit(X, Y, **FIT)
    pmodel = kerasmgpu.parallelize(template, gpus=3)
    assert_history_close(expected, pmodel.fit(X, Y, **FIT))
    assert_weights_close(one, template)
    # A generator's short batch goes whole too, in one process (it was padded, with a
    # warning: a generator reaches Keras 3 on JAX as a generator, which kerasmgpu cannot
    # mark; its batches are told by their packing now). 8 rows on 3 devices.
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "kerasmgpu", UserWarning)
        got = pmodel.evaluate((b for b in [(X[:8], Y[:8])] * 3), steps=1, verbose=0)
    np.testing.assert_allclose(
        got, one.evaluate((b for b in [(X[:8], Y[:8])] * 3), steps=1, verbose=0), rtol=1e-5)


@pytest.mark.skipif(not IN_PROCESS, reason="an in-process multi-device route")
def test_a_recompile_with_a_metric_of_the_batch_is_told_too() -> None:
    template = _model()
    template.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=[per_row])
    pmodel = kerasmgpu.parallelize(template, gpus=3)
    pmodel.fit(X, Y, **FIT)  # per-row only: padded batches, as before
    if ON_TF:
        with pytest.raises(ValueError, match=r"metric 'worst' \(one value per batch\)"):
            pmodel.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                           metrics=[worst])
        return
    one = _model()
    one.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=[per_row])
    one.fit(X, Y, **FIT)
    one.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=[worst])
    pmodel.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=[worst])
    assert_history_close(one.fit(X, Y, **FIT), pmodel.fit(X, Y, **FIT))
    assert_weights_close(one, template)


def in_batch_negatives(y_true: Any, y_pred: Any) -> Any:
    """InfoNCE: each row's output against every row's of the batch, itself the positive
    - one value per row, computed from the batch's other rows too."""
    if hasattr(keras, "ops"):
        logits = ops.matmul(y_pred, ops.transpose(y_pred)) * 2.0
        labels = ops.arange(ops.shape(y_pred)[0])
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    logits = ops.dot(y_pred, ops.transpose(y_pred)) * 2.0
    labels = ops.arange(ops.shape(y_pred)[0])
    return ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def centred_error(y_true: Any, y_pred: Any) -> Any:
    """One value per row, each row's error about the batch's mean."""
    return ops.mean(ops.abs((y_pred - ops.mean(y_pred, axis=0)) - (y_true - ops.mean(
        y_true, axis=0))), axis=-1)


def _comparing(rows: int = 4) -> Any:
    seed_all(keras, 1)
    inputs = keras.Input((5,))
    model = keras.Model(inputs, keras.layers.Dense(rows)(inputs))
    deterministic_weights(model, 1)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=in_batch_negatives,
                  metrics=[centred_error, per_row])
    return model


@pytest.mark.skipif(not (IN_PROCESS or ON_LEGACY), reason="an in-process route (TF, JAX), "
                    "or Keras 2.3 (torch: tests/test_distributed.py)")
def test_a_loss_comparing_the_batchs_rows_is_exact_or_refused() -> None:
    """A contrastive loss with in-batch negatives and a metric about the batch's mean are
    one value per row, each read from the other rows too: on the TF lines each replica
    compared its share's rows only (tf_keras and Keras 3 + TF 2e-1 off in weights,
    silently): refused before any weight moves; on JAX the padding rows joined the
    comparison (1e-2 off): short batches now go whole. Keras 2.3 computes both over its
    merged outputs. A loss or metric of the row alone (`per_row`) stays as it was."""
    y = np.zeros((len(X), 1), "float32")
    one, template = _comparing(), _comparing()
    if ON_TF:
        assert_refused_untouched(
            template, lambda: kerasmgpu.parallelize(template, gpus=3),
            r"Invalid `loss`\. Received: loss=loss 'in_batch_negatives' \(each row's value "
            r"computed from the batch's other rows too\)\. .* a loss that compares rows "
            r"needs them all: train it with Keras 3 on JAX")
        template.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse",
                         metrics=[centred_error, per_row])
        assert_refused_untouched(
            template, lambda: kerasmgpu.parallelize(template, gpus=3),
            r"Invalid `metrics`\. Received: metrics=metric 'centred_error' \(each row's "
            r"value computed from the batch's other rows too\)\. Allowed: metrics of one "
            r"value per row, each computed from its row alone")
        return
    expected = one.fit(X, y, **FIT)
    pmodel = kerasmgpu.parallelize(template, gpus=3)
    assert_history_close(expected, pmodel.fit(X, y, **FIT))
    assert_weights_close(one, template)
    np.testing.assert_allclose(pmodel.evaluate(X, y, batch_size=8, verbose=0),
                               one.evaluate(X, y, batch_size=8, verbose=0), rtol=1e-5)

