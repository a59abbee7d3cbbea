"""What a layer's own `call` does with the rows it is given beyond the loss, against plain
Keras on one device: values it adds with `add_metric`, variables it assigns.

Values a layer adds with `add_metric` in its `call` (tf.keras, tf_keras; Keras 3 has no
`add_metric`): Keras averages them over the steps, each computed from the rows the step
is given - on one device the whole batch.

Where each replica runs its own step each computes the value over its share and the
replicas' values are averaged: before, a mean over the rows went off on padded batches
(0.4044 for one device's 0.4063) and a maximum on every batch (0.83 for 0.87), silently.
Now a layer's added values are tried on made-up rows before anything trains: a mean over
the rows is exact (short batches go whole), anything else is refused; a layer that
cannot be tried is named in a warning. Keras 2.3's multi_gpu_model computes the
template's added values on the whole batch, from the template's own inputs, as one device
does - any value is exact - but dropped them from History and evaluate (it names a
nested model's metrics one level deep): now named.

Variables a layer assigns in `call` (a moving average of its input's mean, a count of
rows): JAX counted the padding rows (48 rows for one device's 44); TensorFlow averaged
the replicas' updates (a count of 16 for 44, the loss 3e-2 off), silently. Now short
batches go whole for them (JAX, TensorFlow: exact where the replicas' updates combine,
as a moving average of a mean does), a variable whose updates do not combine is refused
on TensorFlow (tried on made-up rows), and any on torch (each process keeps its own:
tests/test_distributed.py).

22 rows in batches of 8 on 3 replicas: batches of 8 do not divide (whole), the last 6 do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import (
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
adds_metrics = pytest.mark.skipif(
    not (ON_TF or ON_LEGACY) or hasattr(keras_module(), "ops"),
    reason="add_metric in a layer's call: Keras 2.3, tf.keras and tf_keras (Keras 3 "
    "removed it)")

keras = keras_module()
X, Y = short_batch_data()
FIT = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)


class Watch(keras.layers.Layer):
    """Adds the mean absolute activation (a mean over the rows), and with `worst` the
    largest one (not a mean)."""

    def __init__(self, worst: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.worst = worst

    def call(self, x: Any) -> Any:
        backend = keras.backend
        self.add_metric(backend.mean(backend.abs(x)), name="activation")
        if self.worst:
            self.add_metric(backend.max(backend.abs(x)), name="worst_activation")
        return x


class Net(keras.Model):
    """Subclassed, adding a metric in its own call: its inputs are not declared, so it
    cannot be tried."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, x: Any) -> Any:
        hidden = self.hidden(x)
        self.add_metric(keras.backend.mean(keras.backend.abs(hidden)), name="activation")
        return self.out(hidden)


class Moving(keras.layers.Layer):
    """A moving average of its input's mean, subtracted from it: a variable assigned from
    the rows, whose replicas' updates, aggregated by their mean, combine into the whole
    batch's; with `count` also a count of the rows seen (Keras's default aggregation,
    none, or with `summed` aggregated by the sum), which they do not: summed, a batch
    that does not divide goes whole to every replica and counts once per replica."""

    def __init__(self, count: bool = False, summed: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.count, self.summed = count, summed

    def build(self, shape: Any) -> None:
        # Their mean is the whole batch's update where TensorFlow combines the replicas'.
        mean = "mean" if hasattr(keras, "ops") else __import__(
            "tensorflow").VariableAggregation.MEAN
        self.average = self.add_weight(name="average", shape=(), initializer="zeros",
                                       trainable=False, aggregation=mean)
        summed = {} if not self.summed else {"aggregation": "sum" if hasattr(
            keras, "ops") else __import__("tensorflow").VariableAggregation.SUM}
        self.rows = self.add_weight(name="rows", shape=(), initializer="zeros",
                                    trainable=False, **summed)

    def call(self, x: Any, training: Any = None) -> Any:
        backend = keras.ops if hasattr(keras, "ops") else keras.backend
        if training:
            self.average.assign(0.5 * self.average + 0.5 * backend.mean(x))
            if self.count:
                self.rows.assign_add(backend.sum(backend.ones_like(x[:, 0])))
        return x - self.average


def _model(worst: bool = False, subclassed: bool = False, parallel: bool = False,
           batchnorm: bool = False, state: Any = None) -> Any:
    seed_all(keras, 1)
    if subclassed:
        if parallel:
            with kerasmgpu.scope():
                return _model(worst, subclassed)
        model = Net()
        model(X[:2])
    else:
        inputs = keras.Input((5,))
        hidden = keras.layers.Dense(8, activation="tanh")(inputs)
        hidden = (Moving(state in ("count", "summed"), state == "summed")(hidden) if state
                  else Watch(worst)(hidden))
        if batchnorm:
            hidden = keras.layers.BatchNormalization()(hidden)
        model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    deterministic_weights(model, 1)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _evaluated(model: Any) -> Any:
    return dict(zip(model.metrics_names, model.evaluate(X, Y, batch_size=8, verbose=0)))


def _as_on_one_device(subclassed: bool = False, **kwargs: Any) -> None:
    one = _model(subclassed=subclassed, **kwargs)
    template = _model(subclassed=subclassed, parallel=True, **kwargs)
    expected = one.fit(X, Y, **FIT)
    evaluated = _evaluated(one)
    pmodel = kerasmgpu.parallelize(template, gpus=3,
                                   sync_batchnorm=bool(kwargs.get("batchnorm")))
    assert_history_close(expected, pmodel.fit(X, Y, **FIT))
    got = _evaluated(pmodel)
    for name, value in evaluated.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, err_msg=name)
    assert_weights_close(one, template)
    if kwargs.get("state") is None:
        assert "activation" in expected.history


@adds_metrics
@pytest.mark.parametrize("batchnorm", [False, True])
def test_an_added_mean_over_the_rows_is_one_devices_value(batchnorm: bool) -> None:
    # (A BatchNormalization layer, synchronized: Keras 2.3 then builds the replicas
    # itself.)
    _as_on_one_device(batchnorm=batchnorm)


@adds_metrics
def test_an_added_value_that_is_not_a_mean_is_refused_before_anything_trains() -> None:
    if ON_LEGACY:  # computed from the template's own inputs: the whole batch
        _as_on_one_device(worst=True)
        return
    template = _model(worst=True)
    assert_refused_untouched(
        template, lambda: kerasmgpu.parallelize(template, gpus=3),
        r"Invalid `model`\. Received: model=add_metric 'worst_activation' in Watch\.call "
        r"\(layer '.*'\) \(not a mean over the rows\)\. Allowed: add_metric values that are "
        r"means over the rows, .* Fix: add a mean over the rows")


@adds_metrics
@pytest.mark.skipif(ON_LEGACY, reason="Keras 2.3's multi_gpu_model copies no subclassed "
                    "model")
def test_a_layer_that_cannot_be_tried_is_named_and_its_mean_still_exact() -> None:
    with pytest.warns(UserWarning, match=r"add_metric in Net\.call \(layer '.*'\) could "
                      r"not be tried on made-up rows: .* one device's for a mean over the "
                      r"rows only"):
        _as_on_one_device(subclassed=True)


def _moving(model: Any) -> Any:
    return [layer for layer in model.layers if isinstance(layer, Moving)][0]


in_process = pytest.mark.skipif(not (ON_TF or ON_JAX), reason="an in-process route where "
                                "a layer's assigned variables are combined or one program "
                                "runs (torch refuses them: tests/test_distributed.py; Keras "
                                "2.3 updates through add_update)")


@in_process
def test_a_moving_average_of_the_rows_is_one_devices() -> None:
    one = _model(state="average")
    template = _model(state="average", parallel=True)
    expected = one.fit(X, Y, **FIT)
    assert_history_close(expected, kerasmgpu.parallelize(template, gpus=3).fit(X, Y, **FIT))
    assert_weights_close(one, template)  # the average among them


@in_process
@pytest.mark.parametrize("state", ["count", "summed"])
def test_a_count_of_rows_is_one_devices_on_jax_and_refused_where_replicas_combine(
        state: str) -> None:
    """Summed (aggregation "sum"): trained before, 108 for one device's 44 on tf_keras
    (each replica counted a whole batch), 19731 for 48 on Keras 3 + TensorFlow on
    batches that divide (Keras 3's `assign_add` is an `assign`, summed), silently."""
    template = _model(state=state, parallel=True)
    if ON_JAX:
        one = _model(state=state)
        one.fit(X, Y, **FIT)
        kerasmgpu.parallelize(template, gpus=3).fit(X, Y, **FIT)
        assert float(np.asarray(_moving(one).rows)) == 44.0  # 22 rows, 2 epochs
        assert_weights_close(one, template)
        return
    # (Untouched: the trying put back what it assigned.)
    assert_refused_untouched(
        template, lambda: kerasmgpu.parallelize(template, gpus=3),
        r"Invalid `model`\. Received: model=the variable 'rows' Moving\.call assigns "
        r"\(layer '.*'\) \(updated otherwise from a share of the rows\)\. Allowed: "
        r"variables a layer assigns .* Fix: train with Keras 3 on JAX")


class Keras2Moving(Moving):
    """`Moving` written the Keras 2 way: the backend's update functions, handed to
    `add_update` (tf.keras and tf_keras run them where they are made)."""

    def call(self, x: Any, training: Any = None) -> Any:
        if training:
            backend = keras.backend
            updates = [backend.moving_average_update(self.average, backend.mean(x), 0.5)]
            if self.count:
                updates.append(backend.update_add(self.rows,
                                                  backend.sum(backend.ones_like(x[:, 0]))))
            self.add_update(updates)
        return x - self.average


def _keras2_moving(count: bool) -> Any:
    seed_all(keras, 1)
    inputs = keras.Input((5,))
    hidden = Keras2Moving(count)(keras.layers.Dense(8, activation="tanh")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    deterministic_weights(model, 1)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


@pytest.mark.skipif(not ON_TF or hasattr(keras, "ops"), reason="the Keras 2 backend's "
                    "update functions: tf.keras and tf_keras (Keras 2.3 runs add_update's "
                    "ops from the whole batch: tests/test_keras23_models.py)")
def test_the_keras_2_update_functions_are_tried_as_assignments() -> None:
    """`K.update_add` and `K.moving_average_update` assign as `assign_add` does, and
    were not looked for: a count of rows read 16 for one device's 44, silently. They
    are tried as any assignment: the moving average (aggregated by the mean) is exact,
    the count refused."""
    one, template = _keras2_moving(False), _keras2_moving(False)
    expected = one.fit(X, Y, **FIT)
    assert_history_close(expected, kerasmgpu.parallelize(template, gpus=3).fit(X, Y, **FIT))
    assert_weights_close(one, template)
    counting = _keras2_moving(True)
    assert_refused_untouched(
        counting, lambda: kerasmgpu.parallelize(counting, gpus=3),
        r"Invalid `model`\. Received: model=the variable 'rows' Keras2Moving\.call assigns "
        r"\(layer '.*'\) \(updated otherwise from a share of the rows\)")


class Summed(keras.layers.Layer):
    """Adds a term that sums over the rows of its batch (not a mean)."""

    def call(self, x: Any) -> Any:
        backend = keras.ops if hasattr(keras, "ops") else keras.backend
        self.add_loss(0.01 * backend.sum(backend.square(x)))
        return x


@pytest.mark.skipif(not ON_TF, reason="where replicas average their terms in one process: "
                    "the TF lines (JAX and Keras 2.3 compute it over the global batch: "
                    "tests/test_models.py; torch: tests/test_verify.py's job)")
def test_an_added_term_that_sums_over_the_rows_is_refused_before_anything_trains() -> None:
    seed_all(keras, 1)
    inputs = keras.Input((5,))
    hidden = Summed(name="summed")(keras.layers.Dense(8, activation="tanh")(inputs))
    template = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    template.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    assert_refused_untouched(
        template, lambda: kerasmgpu.parallelize(template, gpus=3),
        r"Invalid `model`\. Received: model=add_loss in Summed\.call \(layer 'summed'\) \(a "
        r"term that is not a mean over the rows\)\. Allowed: add_loss terms that are means "
        r"over the rows.* Fix: divide the term by the batch's rows")


class Centred(keras.layers.Layer):
    """Each row less the batch's mean: an output read from the batch's other rows (as a
    minibatch standard deviation in a GAN's discriminator), in inference as in training."""

    def call(self, x: Any) -> Any:
        backend = keras.ops if hasattr(keras, "ops") else keras.backend
        return x - backend.mean(x, axis=0, keepdims=True)


class Noisy(keras.layers.Layer):
    """Row by row, with a dropout inside: its training outputs are drawn at random, which
    no two runs on the same rows repeat - not told, and not refused."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.drop = keras.layers.Dropout(0.5)

    def call(self, x: Any, training: Any = None) -> Any:
        return self.drop(x * 2.0, training=training)


def _centred(how: str) -> Any:
    seed_all(keras, 1)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    hidden = Noisy()(keras.layers.Lambda(lambda x: x * 0.5)(hidden))  # row by row
    hidden = (Centred() if how == "layer" else keras.layers.Lambda(
        lambda x: x - (keras.ops if hasattr(keras, "ops") else keras.backend).mean(
            x, axis=0, keepdims=True)))(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    deterministic_weights(model, 1)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


@pytest.mark.skipif(not (ON_TF or ON_JAX or ON_LEGACY), reason="an in-process route, or "
                    "Keras 2.3 (torch: the same refusal as TensorFlow's, at parallelize())")
@pytest.mark.parametrize("how", ["layer", "Lambda"])
def test_a_layer_reading_the_batchs_other_rows_is_exact_or_refused(how: str) -> None:
    """TensorFlow and Keras 2.3: each replica centred its rows on its share's mean (5e-2
    off in weights, silently): refused before anything trains, naming the layer. JAX:
    the padding rows joined the mean (2e-2 off): short batches go whole now. The
    row-by-row layers beside it, a dropout among them, are not named. (The dropout is
    left out of the comparison with one device: a random draw.)"""
    template = _centred(how)
    if ON_TF or ON_LEGACY:
        assert_refused_untouched(
            template, lambda: kerasmgpu.parallelize(template, gpus=3),
            r"Invalid `model`\. Received: model=(Centred|Lambda)\.call reading the batch's "
            r"other rows \(layer '.*'\)\. Allowed: layers whose output for a row is computed "
            r"from that row alone.* Fix: compute each row's output from its row alone")
        return
    one = _centred(how)
    for model in (one, template):
        model.get_layer(index=3).drop.rate = 0.0  # no draw: comparable
    expected = one.fit(X, Y, **FIT)
    assert_history_close(expected, kerasmgpu.parallelize(template, gpus=3).fit(X, Y, **FIT))
    assert_weights_close(one, template)

