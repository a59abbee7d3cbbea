"""Metric objects the user made: Keras's own made before parallelize(), and the user's
`Metric` subclasses whose code breaks what the engines do with a metric's state.

* `metrics=[keras.metrics.MeanAbsoluteError()]` compiled before parallelize(): on Keras 3
  with JAX its variables stayed on one device and the first fit crashed ("Received
  incompatible devices for jitted computation"); a recompile of the parallel model with
  new metric objects, the same.
* A subclass whose `update_state` ignores `sample_weight`: the padding rows of a batch
  that does not divide counted in it, silently, on every line. Exact on JAX (short
  batches go whole), a warning naming it where each replica runs its own step.
* A subclass whose state is not a sum over rows (a running maximum): where each replica
  runs its own step the replicas' states are summed (TensorFlow read 2.5x one device's
  maximum, silently). Exact on JAX; refused before training elsewhere (torch: the job of
  tests/test_distributed.py).

Keras 2.3's multi_gpu_model updates the metrics once, on its merged outputs: nothing to
tell there.

Each is compared with plain Keras on one device: 22 rows in batches of 8 on 3 replicas
(a last batch of 6 that divides, batches of 8 that do not).
"""

from __future__ import annotations

from typing import Any, List

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
KERAS3 = hasattr(keras, "ops")
if KERAS3:
    ops = keras.ops
    reduce_max, reduce_sum, reduce_mean = ops.max, ops.sum, ops.mean
    maximum, cast = ops.maximum, ops.cast
else:
    import tensorflow as tf

    reduce_max, reduce_sum, reduce_mean = tf.reduce_max, tf.reduce_sum, tf.reduce_mean
    maximum, cast = tf.maximum, tf.cast

X, Y = short_batch_data()
FIT = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)


def _errors(y_true: Any, y_pred: Any) -> Any:
    return reduce_sum(abs(y_pred - y_true), axis=-1)


class Weighted(keras.metrics.Metric):
    """Sums over rows, each row weighed by its sample weight: as Keras's own metrics."""

    def __init__(self, name: str = "weighted", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.total = self.add_weight(name="total", shape=(), initializer="zeros")
        self.count = self.add_weight(name="count", shape=(), initializer="zeros")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        errors = _errors(y_true, y_pred)
        weight = (errors * 0 + 1) if sample_weight is None else reduce_sum(
            cast(sample_weight, "float32"), axis=-1) if len(sample_weight.shape) > 1 else (
            cast(sample_weight, "float32"))
        self.total.assign_add(reduce_sum(errors * weight))
        self.count.assign_add(reduce_sum(weight))

    def result(self) -> Any:
        return self.total / self.count


class Unweighted(Weighted):
    """Takes sample_weight and ignores it: the habit of many hand-written metrics."""

    def __init__(self, name: str = "unweighted", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        errors = _errors(y_true, y_pred)
        self.total.assign_add(reduce_sum(errors))
        self.count.assign_add(reduce_sum(errors * 0 + 1))


class Worst(keras.metrics.Metric):
    """A running maximum: a state that is not a sum over rows."""

    def __init__(self, name: str = "worst", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.worst = self.add_weight(name="worst", shape=(), initializer="zeros")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        self.worst.assign(maximum(self.worst, reduce_max(_errors(y_true, y_pred))))

    def result(self) -> Any:
        return self.worst * 1.0


class Net(keras.Model):
    """Subclassed, no get_config: its outputs are not declared (the metrics are tried
    with its targets' shapes, at its first call), and on TensorFlow it is built in
    kerasmgpu.scope(), its metric objects too."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, x: Any) -> Any:
        return self.out(self.hidden(x))


def _model(make_metrics: Any, subclassed: bool = False, parallel: bool = False) -> Any:
    if subclassed and parallel and ON_TF:
        with kerasmgpu.scope():
            return _built(make_metrics, subclassed)
    return _built(make_metrics, subclassed)


def _built(make_metrics: Any, subclassed: bool) -> Any:
    seed_all(keras, 1)
    if subclassed:
        model = Net()
        model(X[:2])
    else:
        inputs = keras.Input((5,))
        model = keras.Model(inputs, keras.layers.Dense(1)(
            keras.layers.Dense(8, activation="tanh")(inputs)))
    deterministic_weights(model, 1)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=make_metrics())
    return model


def _as_on_one_device(make_metrics: Any, refit: Any = None, subclassed: bool = False) -> Any:
    """Fit and evaluate plain Keras on one device and the parallel model, each with its
    own metric objects made before parallelize(); returns the one-device History."""
    one = _model(make_metrics, subclassed)
    template = _model(make_metrics, subclassed, parallel=True)
    expected = one.fit(X, Y, **FIT)
    evaluated = one.evaluate(X, Y, batch_size=8, verbose=0, return_dict=True)
    pmodel = kerasmgpu.parallelize(template, gpus=3)
    assert_history_close(expected, pmodel.fit(X, Y, **FIT))
    got = pmodel.evaluate(X, Y, batch_size=8, verbose=0, return_dict=True)
    for name, value in evaluated.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, err_msg=name)
    assert_weights_close(one, template)
    if refit is not None:  # recompiled, after parallelize(), with new objects
        for model in (one, pmodel):
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=refit())
        assert_history_close(one.fit(X, Y, **FIT), pmodel.fit(X, Y, **FIT))
        assert_weights_close(one, template)
    return expected


@pytest.mark.skipif(not IN_PROCESS, reason="an in-process multi-device route (torch: "
                    "tests/test_distributed.py, whose job compiles a metric object)")
def test_metric_objects_made_before_parallelize_train_as_on_one_device() -> None:
    _as_on_one_device(lambda: [keras.metrics.MeanAbsoluteError(), Weighted()],
                      refit=lambda: [keras.metrics.MeanSquaredError(), Weighted("again")])


@pytest.mark.skipif(not IN_PROCESS, reason="an in-process multi-device route")
@pytest.mark.parametrize("subclassed", [False, True])
def test_a_metric_that_counts_rows_of_weight_0_is_exact_on_jax_and_named_elsewhere(
        subclassed: bool) -> None:
    def metrics() -> List[Any]:
        return [Unweighted(), Weighted()]

    if ON_JAX:  # one program: short batches go whole, no padding row in them
        expected = _as_on_one_device(metrics, subclassed=subclassed)
        # Its padded value differs from its own: the comparison can fail.
        assert expected.history["unweighted"] == pytest.approx(expected.history["weighted"])
        return
    with pytest.warns(UserWarning, match=r"its metric 'unweighted' counts rows whose "
                      r"sample_weight is 0, so kerasmgpu cannot keep padding rows out of it"):
        kerasmgpu.parallelize(_model(metrics, subclassed, parallel=True), gpus=3).fit(X, Y, **FIT)


@pytest.mark.skipif(not IN_PROCESS, reason="an in-process multi-device route (torch: "
                    "tests/test_distributed.py)")
@pytest.mark.parametrize("subclassed", [False, True])
def test_a_metric_whose_state_is_not_a_sum_is_exact_on_jax_and_refused_elsewhere(
        subclassed: bool) -> None:
    def metrics() -> List[Any]:
        return [Worst(), Weighted()]

    if ON_JAX:
        _as_on_one_device(metrics, subclassed=subclassed)
        return
    template = _model(metrics, subclassed, parallel=True)
    refused = (r"Invalid `metrics`\. Received: metrics=metric 'worst' \(its state is not a "
               r"sum over rows\)\. Allowed: metrics whose state variables are sums over rows "
               r".* Fix: keep sums over rows in the metric's variables")
    if subclassed:  # no declared outputs: told by the targets, at its first call
        pmodel = kerasmgpu.parallelize(template, gpus=3)
        assert_refused_untouched(template, lambda: pmodel.fit(X, Y, **FIT), refused)
    else:
        assert_refused_untouched(
            template, lambda: kerasmgpu.parallelize(template, gpus=3), refused)


@pytest.mark.skipif(ON_LEGACY, reason="Keras 2.3's multi_gpu_model updates the metrics "
                    "once, on its merged outputs: nothing to tell (and its graph mode runs "
                    "nothing eagerly)")
def test_metric_states_are_told_by_trying_each_metric_on_made_up_rows() -> None:
    """What the engines act on, told on every line (torch's own route needs a job):
    Keras's own metrics are not tried; a maximum is not a sum; a metric that ignores its
    weights counts rows of weight 0; one that takes none is named so."""
    from kerasmgpu import adapters, registry
    from kerasmgpu.adapters import metric_states

    class NoWeight(Weighted):
        def update_state(self, y_true: Any, y_pred: Any) -> None:  # type: ignore[override]
            super().update_state(y_true, y_pred)

    adapter = adapters.load(registry.active())
    blind, unsummed = metric_states.rules(adapter, {
        "metrics": [keras.metrics.MeanAbsoluteError(), Worst(), Unweighted()],
        "weighted_metrics": [Weighted(), NoWeight("no_weight")],
    }, [((None, 4), "float32")])
    assert blind == ["metric 'unweighted' counts rows whose sample_weight is 0",
                     "metric 'no_weight' takes no sample_weight"]
    assert unsummed == ["metric 'worst' (its state is not a sum over rows)"]
    # The metric's own state is as it was after the trying (tf.keras tries it on its
    # own variables and puts them back).
    worst = Worst("worst_again")
    worst.update_state(np.zeros((2, 1), "float32"), np.full((2, 1), 3.0, "float32"))
    blind, unsummed = metric_states.rules(adapter, {"metrics": [worst]},
                                          [((None, 1), "float32")])
    assert unsummed == ["metric 'worst_again' (its state is not a sum over rows)"]
    assert float(np.asarray(worst.result())) == 3.0
