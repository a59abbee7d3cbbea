"""`parallelize(accumulate_steps=k)`: k batches of B rows make one step over k*B rows.

Against plain Keras on one device with batch k*B on the same rows in the same order:
47 rows, B=5 on 3 replicas (every batch padded), k=4 - two whole optimizer steps, then a
short one of 7 rows (a batch of 5 and a padded batch of 2, completed by masked fillers;
on Keras 2.3's multi_gpu_model, which does not pad, a batch of 5 and a short one of 2,
against plain Keras 2.3.1). Keras 3's own `gradient_accumulation_steps` under
parallelize() against plain Keras on one device (carried out by kerasmgpu on
TensorFlow). Bad values and the routes that cannot accumulate yet are errors before any
weight is touched.
"""

from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest
from helpers import (
    _VERSION,
    IN_PROCESS,
    LINE,
    ON_JAX,
    ON_LEGACY,
    ON_TF,
    assert_history_close,
    classification_data,
    keras_module,
    mlp,
    requires,
    seed_all,
)
from packaging.version import Version

import kerasmgpu
from kerasmgpu.accumulation import check_accumulate_steps, micro_batches, stopped_group
from kerasmgpu.env.versions import KerasLine

if IN_PROCESS or ON_LEGACY:
    keras = keras_module()

ROWS, BATCH, STEPS = 47, 5, 4
# In process: JAX, the TensorFlow lines (kerasmgpu accumulates there itself) and Keras
# 2.3's multi_gpu_model (two train functions; 47 rows in batches of 5 end on a short one).
ACCUMULATES = ON_TF or ON_JAX or ON_LEGACY
accumulates = pytest.mark.skipif(not ACCUMULATES, reason=f"accumulate_steps > 1 needs "
                                 f"Keras 3 on JAX or TensorFlow here; this env: {_VERSION}")
# Keras 3.3 - 3.7 count micro-batches in `iterations` (read by Adam's bias correction)
# and clip and decay each micro-batch: there only SGD and RMSprop without either.
STEP_COUNTS = ON_TF or ON_LEGACY or (ON_JAX and Version(str(_VERSION)) >= Version("3.8"))
counts_steps = pytest.mark.skipif(not STEP_COUNTS, reason="needs Keras >= 3.8 on JAX or "
                                  f"TensorFlow (iterations counts steps); this env: {_VERSION}")


def _optimizer() -> Any:
    """Adam where the optimizer counts steps; RMSprop (a state, no step count) before."""
    return keras.optimizers.Adam(0.01) if STEP_COUNTS else keras.optimizers.RMSprop(0.01)


def _optimizer_state(optimizer: Any) -> List[np.ndarray]:
    """The optimizer's slots and step count, without Keras's gradient accumulators."""
    if ON_LEGACY:  # [iterations] + slots
        return list(keras.backend.batch_get_value(optimizer.weights))
    skip = {id(v) for v in getattr(optimizer, "_accumulated_gradients", None) or []}
    variables = optimizer.variables
    variables = variables() if callable(variables) else variables  # tf.keras 2.x: a method
    names = [v for v in variables if id(v) not in skip and "iteration" not in v.name]
    # Keras < 3.8 counts micro-batches (checked apart).
    steps = [np.asarray(optimizer.iterations)] if STEP_COUNTS else []
    return [np.asarray(v) for v in names] + steps


def _optimizer_steps(optimizer: Any) -> int:
    """Optimizer steps taken (Keras < 3.8: micro-batches // accumulate_steps)."""
    if ON_LEGACY:  # graph mode: a variable of Keras's session
        return int(keras.backend.get_value(optimizer.iterations))
    return int(np.asarray(optimizer.iterations)) // (1 if STEP_COUNTS else STEPS)


# --- the pure plan -----------------------------------------------------------------------


@pytest.mark.core
def test_micro_batches_complete_each_group_with_fillers() -> None:
    sizes = [5] * 9 + [2]
    micro = micro_batches(sizes, 4)
    assert len(micro) == 12
    assert [m.batch for m in micro] == list(range(10)) + [9, 9]
    assert [m.filler for m in micro] == [False] * 10 + [True, True]
    assert [m.group_rows for m in micro] == [20] * 8 + [7] * 4


@pytest.mark.core
def test_a_stopped_group_is_weighed_by_the_rows_it_has() -> None:
    sizes = [5] * 9 + [2]
    micro = micro_batches(sizes, 4)
    assert stopped_group(micro, sizes, 8, 4) is None  # two whole groups
    assert stopped_group(micro, sizes, 6, 4) == 20 / 10  # 2 of 4 batches of 5
    assert stopped_group(micro, sizes, 9, 4) == 7 / 5  # the short group: 5 of its 7 rows
    assert stopped_group(micro, sizes, 11, 4) == 1.0  # a filler fed: every row is in
    assert stopped_group(micro, sizes, 12 + 3, 4) == 20 / 15  # next epoch, 3 batches
    assert stopped_group(micro, sizes, 3, 1) is None


@pytest.mark.core
@pytest.mark.parametrize("value", [0, -2])
def test_accumulate_steps_below_one_is_a_value_error(value: int) -> None:
    with pytest.raises(ValueError, match=r"accumulate_steps=.*Allowed: an integer >= 1"):
        check_accumulate_steps(value)


@pytest.mark.core
@pytest.mark.parametrize("value", [True, 2.0, "4", None])
def test_accumulate_steps_not_an_int_is_a_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match=r"accumulate_steps=.*Fix:"):
        check_accumulate_steps(value)


# --- through parallelize -----------------------------------------------------------------


@pytest.mark.core
@pytest.mark.skipif(not (IN_PROCESS or ON_LEGACY), reason="needs a route in this process")
@pytest.mark.parametrize("value, error", [(0, ValueError), (-1, ValueError),
                                          (True, TypeError), (4.0, TypeError)])
def test_bad_accumulate_steps_fail_before_anything(value: Any, error: type) -> None:
    model = mlp(keras)
    before = model.get_weights()
    with pytest.raises(error, match="accumulate_steps"):
        kerasmgpu.parallelize(model, accumulate_steps=value)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.core
@pytest.mark.skipif(not ON_JAX or STEP_COUNTS, reason="needs Keras 3 < 3.8 on JAX")
@pytest.mark.parametrize("optimizer, why", [
    ("Adam", r"Adam's update reads `iterations`"),
    ("SGD(clipnorm)", r"clipnorm=1.0.*each micro-batch"),
    ("RMSprop(weight_decay)", r"weight_decay=0.1.*each micro-batch")])
def test_what_keras_before_3_8_cannot_accumulate_is_an_error(optimizer: str, why: str) -> None:
    made = {"Adam": lambda: keras.optimizers.Adam(0.01),
            "SGD(clipnorm)": lambda: keras.optimizers.SGD(0.1, clipnorm=1.0),
            "RMSprop(weight_decay)": lambda: keras.optimizers.RMSprop(0.01, weight_decay=0.1)}
    model = mlp(keras, optimizer=made[optimizer]())
    before = model.get_weights()
    with pytest.raises(ValueError, match=rf"accumulate_steps=4.*{why}.*Keras >= 3.8.*Fix:"):
        kerasmgpu.parallelize(model, accumulate_steps=4)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.core
@requires(jax=True)
def test_optimizer_accumulation_with_accumulate_steps_is_an_error() -> None:
    model = mlp(keras, optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2))
    with pytest.raises(ValueError, match=r"accumulate_steps=2.*gradient_accumulation_steps"):
        kerasmgpu.parallelize(model, accumulate_steps=2)


@requires(tf=True, lines=[KerasLine.KERAS_3])
def test_optimizer_accumulation_with_ema_on_the_mirrored_route_is_an_error() -> None:
    # kerasmgpu carries Keras's own accumulation out on TensorFlow (plain Keras fails
    # under MirroredStrategy: merge_call inside a cond), but not with EMA, whose averages
    # move at every micro-batch: refused before anything is copied, saying what to do.
    model = mlp(keras, optimizer=keras.optimizers.SGD(0.1, use_ema=True,
                                                      gradient_accumulation_steps=2))
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=2.*EMA.*Fix:"):
        kerasmgpu.parallelize(model).fit(*classification_data(ROWS), batch_size=BATCH,
                                         verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.core
@accumulates
def test_accumulation_equals_one_device_with_the_whole_batch() -> None:
    x, y = classification_data(ROWS)

    def model() -> Any:
        return mlp(keras, optimizer=_optimizer(), metrics=["accuracy"])

    one = model()
    h_one = one.fit(x, y, batch_size=BATCH * STEPS, epochs=2, shuffle=False, verbose=0)
    template = model()
    parallel = kerasmgpu.parallelize(template, accumulate_steps=STEPS)
    h_par = parallel.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(one.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(_optimizer_state(one.optimizer), _optimizer_state(parallel.optimizer)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert _optimizer_steps(parallel.optimizer) == 2 * 3  # steps, not batches
    assert_history_close(h_one, h_par)
    np.testing.assert_allclose(one.evaluate(x, y, verbose=0),
                               parallel.evaluate(x, y, batch_size=BATCH, verbose=0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.core
@requires(legacy=True)
@pytest.mark.parametrize("gpus", [None, [1]], ids=["3 replicas", "gpus=[1]"])
def test_keras23_accumulation_with_shuffle_and_validation_equals_one_device(gpus: Any) -> None:
    """Keras 2.3's fit shuffles its batches and holds out validation_split rows: the
    groups follow its own batch plan (38 training rows: 2 groups of 20, 18). Also on
    one named device (a copy placed there, its fit wrapped twice)."""
    x, y = classification_data(ROWS)

    def model() -> Any:
        return mlp(keras, optimizer=keras.optimizers.SGD(0.1, momentum=0.9, decay=0.01))

    def fit(m: Any, batch: int) -> Any:
        np.random.seed(3)  # Keras 2.3 shuffles with numpy's global generator
        return m.fit(x, y, batch_size=batch, epochs=3, validation_split=0.2, verbose=0)

    one = model()
    h_one = fit(one, BATCH * STEPS)
    template = model()
    h_par = fit(kerasmgpu.parallelize(template, gpus=gpus, accumulate_steps=STEPS), BATCH)
    for a, b in zip(one.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert_history_close(h_one, h_par)


@pytest.mark.core
@counts_steps
def test_clipping_applies_to_the_group_gradient() -> None:
    """global_clipnorm clips the whole group's gradient, as one device clips its batch's
    (a per-micro-batch or per-replica clip would give other weights)."""
    x, y = classification_data(ROWS)

    def model() -> Any:
        # Keras 2.3's clipnorm is the norm over all gradients (global_clipnorm's).
        clip = {"clipnorm" if ON_LEGACY else "global_clipnorm": 0.05}
        return mlp(keras, optimizer=keras.optimizers.SGD(0.5, **clip))

    one = model()
    one.fit(x, y, batch_size=BATCH * STEPS, epochs=1, shuffle=False, verbose=0)
    template = model()
    kerasmgpu.parallelize(template, accumulate_steps=STEPS).fit(
        x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(one.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.core
@requires(tf=True)
@accumulates
def test_steps_per_execution_with_accumulation_on_tf_is_an_error() -> None:
    # The host chooses, before each micro-batch, whether the optimizer applies.
    x, y = classification_data(ROWS)
    template = mlp(keras)
    template.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                     steps_per_execution=2)
    before = template.get_weights()
    if LINE is KerasLine.KERAS_3:  # refused there at any accumulate_steps (test_errors.py)
        with pytest.raises(ValueError, match=r"steps_per_execution=2"):
            kerasmgpu.parallelize(template, accumulate_steps=STEPS)
    else:
        parallel = kerasmgpu.parallelize(template, accumulate_steps=STEPS)
        with pytest.raises(ValueError, match=r"steps_per_execution=2.*accumulate_steps=4"):
            parallel.fit(x, y, batch_size=BATCH, verbose=0)
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)


def _scaling_or_legacy(kind: str) -> Any:
    if kind == "legacy":
        return keras.optimizers.legacy.SGD(0.1)
    scaling = (keras.optimizers.LossScaleOptimizer if LINE is KerasLine.KERAS_3
               else keras.mixed_precision.LossScaleOptimizer)
    return scaling(keras.optimizers.SGD(0.1))


@pytest.mark.core
@requires(tf=True)
@accumulates
@pytest.mark.parametrize("kind", ["loss scaling", "legacy"])
def test_optimizers_accumulation_cannot_drive_on_tf_are_an_error(kind: str) -> None:
    # Loss scaling: its finiteness check and dynamic scale would count micro-batches;
    # tf.keras's legacy optimizers have no apply without a second all-reduce.
    if kind == "legacy" and LINE is KerasLine.KERAS_3:
        pytest.skip("Keras 3 has no legacy optimizers")
    template = mlp(keras, optimizer=_scaling_or_legacy(kind))
    before = template.get_weights()
    with pytest.raises(ValueError, match=r"(LossScale|SGD)\w* with accumulate_steps=4"):
        kerasmgpu.parallelize(template, accumulate_steps=STEPS)
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.core
@requires(in_process=True, lines=[KerasLine.KERAS_3])
def test_keras_own_accumulation_equals_one_device() -> None:
    """SGD(momentum, clipnorm, gradient_accumulation_steps=3) under parallelize() against
    plain Keras on one device, over two fits: 10 batches an epoch (the last padded), so
    groups run across epochs and fits. JAX runs Keras's own accumulation; on TensorFlow,
    where Keras's own fails under MirroredStrategy, kerasmgpu carries it out (the group's
    mean clipped, then the update; `iterations` counting micro-batches as Keras's)."""
    x, y = classification_data(ROWS)

    def model() -> Any:
        return mlp(keras, optimizer=keras.optimizers.SGD(
            0.1, momentum=0.9, clipnorm=0.5, gradient_accumulation_steps=3))

    one, template = model(), model()
    template.set_weights(one.get_weights())
    parallel = kerasmgpu.parallelize(template)
    fit = dict(batch_size=BATCH, shuffle=False, verbose=0)
    for epochs in (2, 1):
        assert_history_close(one.fit(x, y, epochs=epochs, **fit),
                             parallel.fit(x, y, epochs=epochs, **fit))
    for a, b in zip(one.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert int(np.asarray(template.optimizer.iterations)) == int(
        np.asarray(one.optimizer.iterations))
    for a, b in zip(_optimizer_state(one.optimizer), _optimizer_state(template.optimizer)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.core
@accumulates
def test_what_cannot_be_weighed_exactly_is_an_error() -> None:
    x, y = classification_data(ROWS)
    parallel = kerasmgpu.parallelize(mlp(keras), accumulate_steps=STEPS)
    # Keras 2.3's steps_per_epoch reads whole tensors, not batches of arrays: refused.
    steps_error = (r"steps_per_epoch=8.*None with accumulate_steps" if ON_LEGACY
                   else r"steps_per_epoch=8.*multiple of accumulate_steps")
    with pytest.raises(ValueError, match=steps_error.replace("=8", "=6")):
        parallel.fit(x, y, batch_size=BATCH, steps_per_epoch=6, verbose=0)
    if ON_LEGACY:
        with pytest.raises(ValueError, match=steps_error):
            parallel.fit(x, y, batch_size=BATCH, steps_per_epoch=8, verbose=0)
    with pytest.raises(ValueError, match=r"train_on_batch.*fit\(\)"):
        parallel.train_on_batch(x[:BATCH], y[:BATCH])

    def batches() -> Any:
        while True:
            yield x[:BATCH], y[:BATCH]

    with pytest.raises(ValueError, match=r"in-memory arrays"):
        parallel.fit(batches(), steps_per_epoch=STEPS, verbose=0)


@pytest.mark.core
@accumulates
def test_what_accumulation_cannot_weigh_is_an_error_before_training(tmp_path: Any) -> None:
    """A sum has no mean to weigh by rows (its gradient would be off by accumulate_steps);
    a mid-epoch resume counts batches, not optimizer steps (untested, so refused)."""
    x, y = classification_data(ROWS)
    template = mlp(keras)
    template.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
        reduction="sum"))
    parallel = kerasmgpu.parallelize(template, accumulate_steps=STEPS)
    before = template.get_weights()
    with pytest.raises(ValueError, match=r"reduction='sum'.*accumulate_steps=4"):
        parallel.fit(x, y, batch_size=BATCH, verbose=0)
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)
    if ON_LEGACY:  # Keras 2.3 has no BackupAndRestore
        return
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    resumable = kerasmgpu.parallelize(mlp(keras), accumulate_steps=STEPS)
    with pytest.raises(ValueError, match=r"BackupAndRestore with accumulate_steps=4"):
        resumable.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[backup])
    assert not (tmp_path / "backup").exists()


@pytest.mark.core
@pytest.mark.skipif(not ON_JAX or STEP_COUNTS, reason="needs Keras 3 < 3.8 on JAX")
def test_steps_per_epoch_before_keras_3_8_is_an_error() -> None:
    # Keras 3.3 leaves an epoch's first batch out given steps_per_epoch: a micro-batch.
    x, y = classification_data(ROWS)
    template = mlp(keras)
    before = template.get_weights()
    parallel = kerasmgpu.parallelize(template, accumulate_steps=STEPS)
    with pytest.raises(ValueError, match=r"steps_per_epoch=8.*first batch.*Fix:"):
        parallel.fit(x, y, batch_size=BATCH, steps_per_epoch=2 * STEPS, verbose=0)
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.core
@counts_steps
@pytest.mark.skipif(ON_LEGACY, reason="Keras 2.3: steps_per_epoch with accumulate_steps is "
                    "refused (test_what_cannot_be_weighed_exactly_is_an_error)")
def test_steps_per_epoch_counts_micro_batches() -> None:
    x, y = classification_data(BATCH * STEPS * 3)
    one = mlp(keras)
    one.fit(x, y, batch_size=BATCH * STEPS, epochs=1, steps_per_epoch=2, shuffle=False,
            verbose=0)
    template = mlp(keras)
    parallel = kerasmgpu.parallelize(template, accumulate_steps=STEPS)
    parallel.fit(x, y, batch_size=BATCH, steps_per_epoch=2 * STEPS, shuffle=False, verbose=0)
    for a, b in zip(one.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)



# --- with synchronized BatchNorm -----------------------------------------------------------
# One device accumulating k batches of B rows normalizes each batch by its own B rows and
# updates the moving statistics once per batch; k*B rows in one batch would normalize by
# all k*B, which no accumulation can reproduce. So the reference here is one device with
# batch B accumulating k batches: Keras 3's own `gradient_accumulation_steps` where the
# groups are whole (it averages k gradients and carries an incomplete group over the
# epoch end), and a `GradientTape` loop of plain Keras on TensorFlow, which also applies
# an incomplete group at the epoch's end over the rows it has (the mean over its rows).

BN_FEATURES = 6


def _bn_model(accumulation: int = 0) -> Any:
    seed_all(keras, 3)
    inputs = keras.Input((BN_FEATURES,))
    hidden = keras.layers.BatchNormalization()(keras.layers.Dense(8)(inputs))
    outputs = keras.layers.Dense(1)(keras.layers.Activation("relu")(hidden))
    model = keras.Model(inputs, outputs)
    own = {"gradient_accumulation_steps": accumulation} if accumulation else {}
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9, **own), "mse", metrics=["mae"])
    return model


def _bn_data(rows: int) -> Any:
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(rows, BN_FEATURES)) * 3 + 1).astype("float32")
    return x, rng.normal(size=(rows, 1)).astype("float32")


def _moving_statistics(model: Any) -> List[np.ndarray]:
    norm = [layer for layer in model.layers
            if isinstance(layer, keras.layers.BatchNormalization)][0]
    return [np.asarray(norm.moving_mean), np.asarray(norm.moving_variance)]


def _tape_reference(x: Any, y: Any, epochs: int) -> Any:
    """Plain Keras on one TensorFlow device, batch BATCH, STEPS batches per optimizer step:
    each group's gradient is the mean over its rows; the last group of an epoch is applied
    over the rows it has."""
    import tensorflow as tf

    model = _bn_model()
    variables = model.trainable_variables
    for _ in range(epochs):
        starts = list(range(0, len(x), BATCH))
        for first in range(0, len(starts), STEPS):
            group = starts[first:first + STEPS]
            rows = sum(len(x[s:s + BATCH]) for s in group)
            total = [tf.zeros_like(v) for v in variables]
            for s in group:
                with tf.GradientTape() as tape:
                    pred = model(x[s:s + BATCH], training=True)
                    loss = tf.reduce_sum(tf.square(pred - y[s:s + BATCH])) / rows
                total = [t + g for t, g in zip(total, tape.gradient(loss, variables))]
            model.optimizer.apply_gradients(zip(total, variables))
    return model


def _assert_bn_close(one: Any, template: Any) -> None:
    for name, a, b in zip(("moving_mean", "moving_variance"), _moving_statistics(one),
                          _moving_statistics(template)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=name)
    for a, b in zip(one.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.core
@accumulates
@pytest.mark.skipif(LINE is not KerasLine.KERAS_3, reason="needs Keras 3's own "
                    "gradient_accumulation_steps as the one-device reference")
def test_sync_batchnorm_with_accumulation_equals_one_device_accumulating() -> None:
    # 40 rows: 8 batches of 5 (each padded to 6 on 3 replicas), two whole groups of 4.
    x, y = _bn_data(BATCH * STEPS * 2)
    one = _bn_model(accumulation=STEPS)
    h_one = one.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    template = _bn_model()
    parallel = kerasmgpu.parallelize(template, accumulate_steps=STEPS, sync_batchnorm=True)
    h_par = parallel.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    _assert_bn_close(one, template)
    assert_history_close(h_one, h_par, rtol=1e-4)
    np.testing.assert_allclose(one.evaluate(x, y, verbose=0),
                               parallel.evaluate(x, y, batch_size=BATCH, verbose=0),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.core
@accumulates
@requires(tf=True)
def test_sync_batchnorm_with_accumulation_and_a_short_group_equals_one_device() -> None:
    # 47 rows: groups of 4, 4 and 2 batches (the last of 2 rows): fillers complete the
    # last group and must leave the moving statistics alone.
    x, y = _bn_data(ROWS)
    one = _tape_reference(x, y, epochs=2)
    template = _bn_model()
    kerasmgpu.parallelize(template, accumulate_steps=STEPS, sync_batchnorm=True).fit(
        x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    _assert_bn_close(one, template)


@pytest.mark.core
@accumulates
@requires(jax=True)
def test_fillers_leave_the_moving_statistics_alone() -> None:
    # 45 rows: two whole groups, then one batch and three masked fillers. The moving
    # statistics see the 9 batches, as on one device accumulating (whose weights differ
    # only by the last group, which Keras carries over the epoch end).
    x, y = _bn_data(BATCH * (2 * STEPS + 1))
    one = _bn_model(accumulation=STEPS)
    one.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    template = _bn_model()
    kerasmgpu.parallelize(template, accumulate_steps=STEPS, sync_batchnorm=True).fit(
        x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for name, a, b in zip(("moving_mean", "moving_variance"), _moving_statistics(one),
                          _moving_statistics(template)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=name)


# --- a fit stopped inside a group ----------------------------------------------------------


def _stop_after(batches: int) -> Any:
    class Stop(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.seen += 1
            if self.seen == batches:
                self.model.stop_training = True

    return Stop()


@pytest.mark.core
@accumulates
def test_a_fit_stopped_inside_a_group_applies_it_over_its_rows() -> None:
    """Stopped after 6 batches of 5 in its second epoch (k=4): the second group has 10
    rows and is applied over them, as one device's epoch of batches of 20 ending on a
    batch of 10; a later fit starts a new group (the optimizer's counters realigned)."""
    x, y = classification_data(ROWS)

    def model() -> Any:
        return mlp(keras, optimizer=_optimizer())

    one = model()
    one.fit(x, y, batch_size=BATCH * STEPS, epochs=1, shuffle=False, verbose=0)
    one.fit(x[:6 * BATCH], y[:6 * BATCH], batch_size=BATCH * STEPS, shuffle=False,
            verbose=0)
    template = model()
    parallel = kerasmgpu.parallelize(template, accumulate_steps=STEPS)
    # 10 batches, completed by 2 fillers (Keras 2.3's multi_gpu_model: no fillers)
    per_epoch = 10 if ON_LEGACY else 3 * STEPS
    parallel.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
                 callbacks=[_stop_after(per_epoch + 6)])
    for a, b in zip(one.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(_optimizer_state(one.optimizer), _optimizer_state(parallel.optimizer)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert _optimizer_steps(parallel.optimizer) == 3 + 2
    one.fit(x, y, batch_size=BATCH * STEPS, shuffle=False, verbose=0)
    parallel.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    for a, b in zip(one.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.core
@pytest.mark.skipif(not (ON_TF or ON_JAX), reason="Keras 3 on JAX or TensorFlow, tf.keras "
                    f"(in process); this env: {LINE.value} {_VERSION}")
def test_a_term_of_the_batch_accumulates_only_over_equal_micro_batches() -> None:
    """An add_loss mean is computed per micro-batch and the group's gradients averaged:
    one device's over k*B rows when the micro-batches hold equal rows (exact), not when
    a group has a short one (55 rows in batches of 10, k=2: a group of 10 + 5 was 9e-4
    off in weights, silently) - refused before training, naming the group and the fix."""
    from test_models import X, Y, _batch_term_model

    # Micro-batches of 10 rows do not divide over 3 replicas: exact because each goes
    # whole to every replica (a copy each, or laid out replicated on JAX).
    batch = 10
    single, template = _batch_term_model("add_loss"), _batch_term_model("add_loss")
    single.fit(X[:60], Y[:60], batch_size=2 * batch, epochs=2, shuffle=False, verbose=0)
    parallel = kerasmgpu.parallelize(template, accumulate_steps=2)
    parallel.fit(X[:60], Y[:60], batch_size=batch, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(single.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    before = template.get_weights()
    short = 55 % batch
    with pytest.raises(ValueError, match=rf"(?s)add_loss in BatchTerm\.call.*\[{batch}, {short}\]"
                                          rf".*multiple of batch_size \* 2 \({2 * batch}\)"):
        parallel.fit(X[:55], Y[:55], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)
