"""Losses that divide by a count, against one device: padding rows and the replica split
must not change the count (issue 28, items 2, 15, 16).

A mean-reduced loss divides by a count of entries: every element, or with a Keras mask
(`ignore_class`, `Embedding(mask_zero=True)`) the valid ones. One device divides by the
valid entries of the real rows of the whole batch; each replica holds only its share,
padding copies included. Each model trains on batches that divide by 2 and 3 replicas
and on ones with a padded last batch, on every in-process route (Keras 3 + TF / JAX,
tf.keras 2.12-2.15 and tf_keras 2.16+ under tf.distribute).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import (
    LINE,
    ON_JAX,
    ON_TF,
    REPLICAS,
    assert_history_close,
    assert_weights_close,
    deterministic_weights,
    grid,
    keras_module,
    requires,
    seed_all,
)

import kerasmgpu
from kerasmgpu import registry
from kerasmgpu.env.versions import (
    KERAS3_ACTIVITY_LOSS_IS_A_MEAN,
    KerasLine,
)

pytestmark = [requires(in_process=True)]

keras = keras_module()

RNG = np.random.default_rng(28)
TOKENS = RNG.integers(1, 9, size=(40, 6))
for _row, _length in enumerate(RNG.integers(1, 7, size=40)):
    TOKENS[_row, _length:] = 0  # mask_zero: a different number of valid steps per row
TAGS = RNG.integers(0, 3, size=(40, 6)).astype("int64")
LABELS = np.where(RNG.uniform(size=40) < 0.35, -1, RNG.integers(0, 3, size=40)).astype("int64")


def _per_row(y_true, y_pred):
    """A loss reducing a sequence output to one value per row (as CTC does)."""
    if LINE is KerasLine.KERAS_3:
        onehot = keras.ops.one_hot(keras.ops.cast(y_true, "int32"), 3)
        return keras.ops.mean(keras.ops.square(onehot - y_pred), axis=(1, 2))
    import tensorflow as tf

    onehot = tf.one_hot(tf.cast(y_true, "int32"), 3)
    return tf.reduce_mean(tf.square(onehot - y_pred), axis=(1, 2))


def _model(kind: str):
    seed_all(keras, 28)
    inputs = keras.Input((6,), dtype="int32")
    hidden = keras.layers.Embedding(9, 4, mask_zero=(kind == "mask_zero"))(inputs)
    if kind == "ignore_class":
        hidden = keras.layers.Flatten()(hidden)
    # ignore_class on logits: Keras 3.3 - 3.13 zero an ignored row's probabilities before
    # normalising them, a 0/0 whose NaN gradient trained one device to NaN too.
    logits = kind == "ignore_class"
    outputs = keras.layers.Dense(3, activation=None if logits else "softmax")(hidden)
    model = deterministic_weights(keras.Model(inputs, outputs), 28)
    if kind == "per_row":
        loss = _per_row
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(
            from_logits=logits, ignore_class=-1 if logits else None)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss, metrics=["accuracy"])
    return model


# Each kind on 2 and on 3 replicas, not each on both (`wide`: the newest envs of the
# TensorFlow routes run the diagonal, 100 - 130 s an env less, measured), on both row counts.
@pytest.mark.parametrize("rows", [36, 37])  # 36: batches of 6 divide; 37: a 1-row last batch
@grid(kind=["ignore_class", "mask_zero", "per_row"], replicas=REPLICAS)
def test_counted_losses_match_one_device(kind: str, rows: int, replicas: int) -> None:
    if rows == 36 and ON_JAX:
        pytest.skip("one program over the global batch: only padding can change its count")
    _fit_and_compare(kind, rows, replicas)


@pytest.mark.core
@pytest.mark.skipif(LINE is not KerasLine.KERAS_3, reason="Keras 3's metric masking")
def test_an_unweighted_masked_metric_on_a_padded_batch() -> None:
    """Keras 3 before 3.12 ignores a Keras mask (mask_zero) in an accuracy updated
    without a sample weight: the padding weight must not turn it on for the padded batch
    alone (evaluate's accuracy 0.3604 against 0.3641 on one device, 3.8 on JAX). Core:
    the oldest releases run it, one case (15 s on JAX on a loaded 2-core machine)."""
    _fit_and_compare("mask_zero", 37, REPLICAS[0])


def _fit_and_compare(kind: str, rows: int, replicas: int) -> None:
    x = TOKENS[:rows]
    y = (LABELS if kind == "ignore_class" else TAGS)[:rows]
    single, template = _model(kind), _model(kind)
    # verify=True: the self-check sees each replica's count all-reduced, as the step
    # does (on TF it raised here, a per-replica count against one device's).
    pmodel = kerasmgpu.parallelize(template, gpus=replicas, verify=True)
    h1 = single.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    assert np.isfinite(h1.history["loss"]).all()  # NaN against NaN would pass
    assert_weights_close(single, template, atol=1e-5)
    assert_history_close(h1, h2)
    e1 = single.evaluate(x, y, batch_size=6, verbose=0)
    e2 = pmodel.evaluate(x, y, batch_size=6, verbose=0)
    np.testing.assert_allclose(e1, e2, rtol=1e-5)


@pytest.mark.skipif(LINE is not KerasLine.KERAS_3, reason="keras.ops")
@pytest.mark.parametrize("term", ["activity_regularizer", "add_loss"])
def test_batch_loss_terms_on_a_padded_batch_need_no_warning(term: str) -> None:
    """A loss term computed from the batch (an activity regularizer, `add_loss`) would
    count padding copies: the short batch goes whole to every replica instead, silently,
    on every Keras 3 route (exact: tests/test_models.py). Keras 3.3 - 3.9 on JAX padded
    it and warned, until kerasmgpu laid it out replicated itself there."""

    class Penalty(keras.layers.Layer):
        def call(self, inputs):
            self.add_loss(0.01 * keras.ops.mean(keras.ops.square(inputs)))
            return inputs

    if term == "activity_regularizer" and ON_TF and \
            registry.active().version < KERAS3_ACTIVITY_LOSS_IS_A_MEAN:
        pytest.skip("refused before 3.15 on TensorFlow (test_copy_state checks the refusal)")
    seed_all(keras, 28)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(
        4, activity_regularizer="l2" if term == "activity_regularizer" else None)(inputs)
    if term == "add_loss":
        hidden = Penalty()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer="sgd", loss="mse")
    pmodel = kerasmgpu.parallelize(model, gpus=REPLICAS[0])
    x = RNG.normal(size=(9, 6)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        pmodel.fit(x, x[:, :1], batch_size=9, epochs=1, verbose=0)


def _penalize(layer, values):
    """A module-level helper that adds a layer's loss term (found up front)."""
    layer.add_loss(0.01 * keras.ops.mean(values * values))


class _Penalizer:
    """A helper object whose method adds a layer's loss term (found up front)."""

    def apply(self, layer, values):
        _penalize(layer, values)


def _helper_model(helper: str):
    # One class per helper: the code read up front is every branch of `call`.
    class ByMethod(keras.layers.Layer):
        def penalize(self, values):
            self.add_loss(0.01 * keras.ops.mean(values * values))

        def call(self, inputs):
            self.penalize(inputs)
            return inputs

    class ByFunction(keras.layers.Layer):
        def call(self, inputs):
            _penalize(self, inputs)
            return inputs

    class ByObject(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.penalizer = _Penalizer()

        def call(self, inputs):
            self.penalizer.apply(self, inputs)
            return inputs

    class ByName(ByMethod):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.how = "penalize"  # the method to call, chosen by a name held as data

        def call(self, inputs):
            getattr(self, self.how)(inputs)
            return inputs

    Penalized = {"method": ByMethod, "function": ByFunction, "object": ByObject,
                 "by-name": ByName}[helper]
    seed_all(keras, 28)
    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Dense(1)(Penalized()(inputs)))
    deterministic_weights(model, 28)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


@requires(lines=[KerasLine.KERAS_3])
@pytest.mark.parametrize("helper", ["method", "function", "object", "by-name"])
def test_a_term_added_by_a_helper(helper: str) -> None:
    """`add_loss` called from code `call` reaches. A method of the layer's own class, a
    module-level function or a method of a helper object the layer holds is read before
    the batches are planned: the padded batch goes whole to every replica, one device's
    terms, nothing to warn (before, only a term named in `call` itself was read, and
    these were padded, with a warning). A method `call` reaches only by a name it
    computes (`getattr(self, self.how)`) is found only once the step is traced, after
    the batches were planned: its copies count in the term, and kerasmgpu warns once,
    naming the term and the fix - and says nothing while every batch divides. (tf.keras
    and tf_keras keep the terms of the functional model's symbolic call on the layer,
    so kerasmgpu finds them all up front.)"""
    replicas = REPLICAS[-1]
    x = RNG.normal(size=(4 * replicas + 1, 6)).astype("float32")
    fit = dict(batch_size=2 * replicas, epochs=1, shuffle=False, verbose=0)
    single, template = _helper_model(helper), _helper_model(helper)
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        single.fit(x[:-1], x[:-1, :1], **fit)
        pmodel.fit(x[:-1], x[:-1, :1], **fit)
        if helper != "by-name":
            h1 = single.fit(x, x[:, :1], **fit)
            h2 = pmodel.fit(x, x[:, :1], **fit)
            assert_history_close(h1, h2)
            assert_weights_close(single, template)
            return
    with pytest.warns(UserWarning, match="add_loss") as record:
        pmodel.fit(x, x[:, :1], **fit)
    message = next(str(w.message) for w in record if "add_loss" in str(w.message))
    assert f"multiple of the {replicas} replicas" in message and "Fix:" in message, message


def _two_term_model(victim: str, stale: bool):
    """Two loss terms computed from the batch: an activity regularizer (L2 of the hidden
    layer) and a layer's add_loss. `stale`: the regularizer's loss, once added, has its
    id put in the `_loss_ids` of the `victim` layer, as when that new loss was allocated
    at the address of a loss the victim added in an earlier trace (freed since, its id
    kept until the victim's next call): "next" is the add_loss layer called after it,
    "idle" a layer the model holds but does not call."""

    class Penalty(keras.layers.Layer):
        def call(self, inputs):
            self.add_loss(0.3 * keras.ops.mean(keras.ops.square(inputs - 0.2)))
            return inputs

    class Hidden(keras.layers.Dense):
        def add_loss(self, loss):
            super().add_loss(loss)
            if stale:
                victims[0]._loss_ids.add(id(loss))

    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = Hidden(8, activation="tanh",
                                 activity_regularizer=keras.regularizers.L2(0.2))
            self.penalty, self.idle, self.out = Penalty(), Penalty(), keras.layers.Dense(1)

        def call(self, inputs):
            return self.out(self.penalty(self.hidden(inputs)))

    victims: list = []
    model = Model()
    victims.append(model.penalty if victim == "next" else model.idle)
    model(np.zeros((1, 6), "float32"))  # builds every layer it calls
    deterministic_weights(model, 28)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


@pytest.mark.core
@requires(jax=True)
@pytest.mark.parametrize("victim", ["next", "idle"])
def test_a_loss_is_told_by_the_scope_not_by_a_freed_id(victim: str) -> None:
    """Keras 3 tells the losses a layer added in a JAX step by the ids in its
    `_loss_ids`, which keep the previous trace's ids until the layer's next call: a new
    loss at a freed one's address was taken for that layer's, and the step compiled
    without the term ("next": the next layer's call removes it) or with it twice
    ("idle": a layer not called counts it) - seen in a two-process job (rank 0's
    val_loss 1.4e-2 off, the weights exact) and, with plain Keras, in about 1 trace in
    100 of this model. Every trace here sees that state: the parallel model's steps
    count each term once, as one device's do without it."""
    x = RNG.normal(size=(20, 6)).astype("float32")
    y = x[:, :1] * 0.5
    single = _two_term_model(victim, stale=False)
    model = _two_term_model(victim, stale=True)
    pmodel = kerasmgpu.parallelize(model, gpus=REPLICAS[-1])
    fit = {"batch_size": 10, "epochs": 2, "shuffle": False, "verbose": 0}
    h1 = single.fit(x, y, validation_data=(x[:7], y[:7]), **fit)
    h2 = pmodel.fit(x, y, validation_data=(x[:7], y[:7]), **fit)
    assert_history_close(h1, h2)
    assert_weights_close(single, model)
    np.testing.assert_allclose(pmodel.evaluate(x, y, batch_size=10, verbose=0),
                               single.evaluate(x, y, batch_size=10, verbose=0), rtol=1e-5)


@grid(kind=["ignore_class", "mask_zero"], replicas=REPLICAS)
def test_a_replica_with_nothing_valid_matches_one_device(kind: str, replicas: int) -> None:
    """A replica whose rows hold no valid entry (every label ignored, every step masked)
    while the batch has some: one device's loss is finite, and so must the replicas' be
    (Keras's count of 0 made NaN of a replica's loss, and of the weights for mask_zero)."""
    x, y = TOKENS[:12].copy(), (LABELS if kind == "ignore_class" else TAGS)[:12].copy()
    for start in (0, 6):  # in each batch of 6 the first 4 rows: whole replicas' shares
        if kind == "ignore_class":
            y[start:start + 4] = -1
        else:
            x[start:start + 4] = 0
    single, template = _model(kind), _model(kind)
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    h1 = single.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    assert np.isfinite(h1.history["loss"]).all()
    assert_weights_close(single, template, atol=1e-5)
    assert_history_close(h1, h2)
