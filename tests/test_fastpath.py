"""The fast path: a batch that divides by the replica count runs the engine's plain step.

Which step a batch took is counted where `kerasmgpu.training.steps` decides it (the plain
step, or the masked step with the batch's packing active); on JAX and TensorFlow a
traced step counts once per trace, which is what runs for every later batch of that
shape. Exactness is against plain Keras on one device, on even and on padded batches.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
from helpers import (
    _VERSION,
    IN_PROCESS,
    LINE,
    ON_JAX,
    ON_TF,
    REPLICAS,
    assert_history_close,
    assert_weights_close,
    classification_data,
    keras_module,
    mlp,
    requires,
    seed_all,
)
from packaging.version import Version

import kerasmgpu
from kerasmgpu.env.versions import KerasLine
from kerasmgpu.training import steps

pytestmark = requires(in_process=True)

if IN_PROCESS:
    keras = keras_module()


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Dict[str, List[Any]]:
    """The steps run (or traced): 'plain' per fast-path step (the rows of its x),
    'masked' per packing activated by a train/test step (its packing's shape)."""
    seen: Dict[str, List[Any]] = {"plain": [], "masked": []}
    plain_step, active = steps.plain_step, steps.active

    def counted_plain(data: Any, call: Any, kind: Any = None) -> Any:
        # The rows of its x as the step sees them (static in a trace, else None).
        x = data[0] if isinstance(data, (tuple, list)) else data
        leaf = next(iter(x.values())) if isinstance(x, dict) else x
        rows = getattr(leaf, "shape", [None])[0]
        seen["plain"].append(None if rows is None else int(rows))
        return plain_step(data, call, kind)

    def counted_active(packed: Any, kind: Any = None) -> Iterator[Any]:
        if packed is not None and not steps.unpadded(packed):
            seen["masked"].append(tuple(packed.shape))
        return active(packed, kind)

    monkeypatch.setattr(steps, "plain_step", counted_plain)
    monkeypatch.setattr(steps, "active", counted_active)
    return seen


def _fit_both(replicas: int, rows: int, batch: int, **fit: Any) -> Any:
    x, y = classification_data(rows)
    single, template = mlp(keras, metrics=("accuracy",)), mlp(keras, metrics=("accuracy",))
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    h1 = single.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, **fit)
    h2 = pmodel.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, **fit)
    assert_history_close(h1, h2)
    assert_weights_close(single, pmodel)
    e1 = single.evaluate(x, y, batch_size=batch, verbose=0)
    e2 = pmodel.evaluate(x, y, batch_size=batch, verbose=0)
    np.testing.assert_allclose(e1, e2, rtol=1e-5)
    return pmodel


@pytest.mark.core
@pytest.mark.parametrize("replicas", REPLICAS)
def test_even_batches_take_the_plain_step(replicas: int, taken: Dict[str, List[Any]]) -> None:
    """Every batch divides by the replicas: no step ever activates a packing."""
    batch = 20 * replicas
    _fit_both(replicas, rows=batch * 12, batch=batch)
    assert taken["plain"], "the even batches never reached the plain step"
    assert taken["masked"] == [], f"even batches took the masked step: {taken['masked']}"


@pytest.mark.core
@pytest.mark.parametrize("replicas", REPLICAS)
def test_user_weights_on_even_batches_stay_the_users(replicas: int,
                                                      taken: Dict[str, List[Any]]) -> None:
    """sample_weight and class_weight reach the plain step as the user gave them."""
    batch = 20 * replicas
    rows = batch * 10
    weights = np.random.default_rng(3).uniform(0.2, 2.0, size=rows).astype("float32")
    _fit_both(replicas, rows=rows, batch=batch, sample_weight=weights)
    _fit_both(replicas, rows=rows, batch=batch, class_weight={0: 1.0, 1: 2.5, 2: 0.5})
    assert taken["plain"] and taken["masked"] == []


@pytest.mark.core
@pytest.mark.parametrize("replicas", REPLICAS)
def test_a_padded_last_batch_takes_the_masked_step(replicas: int,
                                                   taken: Dict[str, List[Any]]) -> None:
    """The last batch of an epoch needs padding: it, and only it, takes the masked
    step, exactly; the full batches take the plain one."""
    batch = 20 * replicas
    _fit_both(replicas, rows=batch * 12 + 1, batch=batch)
    assert taken["masked"], "the padded batch never took the masked step"
    assert all(shape[-1] == 2 for shape in taken["masked"]), taken["masked"]
    assert taken["plain"], "the full batches did not take the plain step"
    # Its step is traced (train, test) for its own static shape, which no full batch
    # has: JAX's one program over the padded global batch, a TF replica's one row.
    padded_rows = replicas if ON_JAX else 1
    assert {shape[0] for shape in taken["masked"]} == {padded_rows}, taken["masked"]


@pytest.mark.core
@pytest.mark.parametrize("replicas", REPLICAS)
def test_uneven_batch_size_takes_the_masked_step_every_batch(
        replicas: int, taken: Dict[str, List[Any]]) -> None:
    """A batch size that does not divide: every batch is padded and masked, exactly."""
    _fit_both(replicas, rows=20 * replicas * 6, batch=20 * replicas + 1)
    assert taken["masked"]


# --- with accumulate_steps and sync_batchnorm -----------------------------------------


@pytest.mark.core
@pytest.mark.skipif(not (ON_JAX and _VERSION is not None
                         and Version(str(_VERSION)) >= Version("3.8")),
                    reason="accumulate_steps > 1 needs Keras >= 3.8 on JAX in one process")
def test_accumulation_keeps_the_masked_step_on_even_batches(
        taken: Dict[str, List[Any]]) -> None:
    """Every micro-batch divides by the replicas, yet each takes the masked step: its
    loss weight is its share of the group's rows (the last group here is one batch of
    6 rows and a masked filler). One device at the whole group's batch is the reference."""
    replicas, batch, k = 3, 6, 2
    x, y = classification_data(batch * 7)
    one = mlp(keras, optimizer=keras.optimizers.Adam(0.01))
    h_one = one.fit(x, y, batch_size=batch * k, epochs=2, shuffle=False, verbose=0)
    template = mlp(keras, optimizer=keras.optimizers.Adam(0.01))
    parallel = kerasmgpu.parallelize(template, gpus=replicas, accumulate_steps=k)
    h_par = parallel.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
    assert taken["plain"] == [], "a micro-batch took the plain step"
    assert taken["masked"], "the micro-batches never took the masked step"
    assert_history_close(h_one, h_par)
    for a, b in zip(one.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def _norm_model() -> Any:
    seed_all(keras, 3)
    inputs = keras.Input((6,))
    hidden = keras.layers.BatchNormalization()(keras.layers.Dense(8)(inputs))
    outputs = keras.layers.Dense(1)(keras.layers.Activation("relu")(hidden))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse", metrics=["mae"])
    return model


@pytest.mark.core
@pytest.mark.skipif(not (ON_JAX or (ON_TF and LINE is KerasLine.KERAS_3)),
                    reason="sync_batchnorm needs Keras 3 on JAX or TensorFlow")
@pytest.mark.parametrize("rows", [48, 47])
def test_sync_batchnorm_on_even_batches_takes_the_plain_step(
        rows: int, taken: Dict[str, List[Any]]) -> None:
    """Even batches take the plain step with moments over every row of the global batch
    (still synchronized); 47 rows leave a padded last batch (masked moments)."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(rows, 6)) * 3 + 1).astype("float32")
    y = rng.normal(size=(rows, 1)).astype("float32")
    one = _norm_model()
    h_one = one.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
    template = _norm_model()
    parallel = kerasmgpu.parallelize(template, gpus=3, sync_batchnorm=True)
    h_par = parallel.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
    assert taken["plain"], "the full batches did not take the plain step"
    assert bool(taken["masked"]) == (rows == 47), taken["masked"]
    assert_history_close(h_one, h_par, rtol=1e-4)
    for a, b in zip(one.get_weights(), template.get_weights()):  # moving statistics too
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(one.evaluate(x, y, verbose=0),
                               parallel.evaluate(x, y, batch_size=12, verbose=0),
                               rtol=1e-4, atol=1e-5)


# --- what a step costs, counted (issue 32) -------------------------------------------------
# Counts are exact under any load, so they catch what no exactness test sees: a retrace
# per epoch, a second collective per step, the masked step on full batches, an extra
# transfer, more Python per step. benchmarks/counts.py counts the same on the suite's
# four models; here a small MLP, one padded case.


@pytest.mark.core
def test_a_fit_traces_each_step_once_and_full_batches_statically(
        taken: Dict[str, List[Any]]) -> None:
    """Later fits and epochs trace (JAX: compile) nothing new; the full batches' step
    has the static batch shape of a hand-written fit, the padded batch a step of its
    own shape."""
    replicas, batch = 2, 8
    x, y = classification_data(6 * batch + 1)
    pmodel = kerasmgpu.parallelize(mlp(keras, metrics=("accuracy",)), gpus=replicas)
    pmodel.fit(x[:2 * batch + 1], y[:2 * batch + 1], batch_size=batch, shuffle=False,
               verbose=0)
    traced = {kind: list(found) for kind, found in taken.items()}
    pmodel.fit(x, y, batch_size=batch, epochs=3, shuffle=False, verbose=0)
    pmodel.fit(x[:3 * batch], y[:3 * batch], batch_size=batch, epochs=2, shuffle=True,
               verbose=0)
    assert taken == traced, f"traced again: {taken} after {traced}"
    full = batch if ON_JAX else batch // replicas  # JAX: one program over the batch
    assert set(traced["plain"]) == {full}, traced
    assert {shape[0] for shape in traced["masked"]} == {replicas if ON_JAX else 1}, traced


def _counts(case: str) -> Any:
    """benchmarks/counts.py's figures of a small MLP, kerasmgpu and the hand-written
    engine on 2 replicas, global batch 8: fits of 2 and 4 steps."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import counts

    replicas, batch = 2, 8
    probe = counts.probe_for(kerasmgpu.environment().backend)
    probe.install(keras)
    try:
        hand = _hand_written(replicas)
        ours = kerasmgpu.parallelize(mlp(keras, metrics=("accuracy",)), gpus=replicas)
        if ON_TF:
            probe.watch_strategy(ours.distribute_strategy)
        x, y = classification_data(4 * batch + replicas)
        results = counts.measure_pair(
            probe, {"hand": hand, "ours": (ours, ours)}, x, y, batch, case, replicas,
            fits={"A": (2, 1), "B": (4, 1)})
    finally:
        probe.uninstall()
    return counts, results


def _hand_written(replicas: int) -> Any:
    """(what to fit, its Keras model): the MLP built and fit under the engine by hand."""
    if ON_JAX:
        import jax

        layout = keras.distribution.DataParallel(devices=jax.devices()[:replicas])
        with layout.scope():
            model = mlp(keras, metrics=("accuracy",))

        class InScope:
            def fit(self, *args: Any, **kwargs: Any) -> Any:
                with layout.scope():
                    return model.fit(*args, **kwargs)

        return InScope(), model
    import tensorflow as tf

    from kerasmgpu.adapters import tensorflow as tf_internals

    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:replicas]
    # kerasmgpu's own maker: a strategy with collective keys of its own, as every
    # strategy of this test process has.
    with tf_internals.new_mirrored_strategy(devices).scope():
        model = mlp(keras, metrics=("accuracy",))
    return model, model


@pytest.mark.core
def test_a_step_costs_what_the_hand_written_step_costs() -> None:
    """Padded case (the last batch of each fit padded and masked): per full step, the
    same collectives and bytes, the same transfers, no masked step, Python calls within
    1.10x the hand-written fit's, and on TensorFlow the same ops; the masked step once
    per epoch, within 1.50x the ops of the hand-written step of that batch."""
    counts, results = _counts("padded")
    gates = counts.gates(results["hand"], results["ours"], "padded",
                         kerasmgpu.environment().backend)
    missed = [f"{gate}: {figures}" for gate, ok, figures in gates if not ok]
    assert not missed, missed
    assert {gate for gate, _, _ in gates} >= {
        "collectives/step", "transfers/step", "masked step only for the padded batch",
        "Python calls/step <= 1.1x"}
    if ON_TF:
        assert results["ours"]["full_program"] is not None
        assert results["ours"]["collectives"]["step"] > 0  # the gradients, at least
    # What the hand-written fit hands over, nothing of kerasmgpu's: x and y (on
    # TensorFlow of each of the 2 replicas; Keras 3.3 and 3.8's JAX fits put 4 by hand too).
    assert results["ours"]["transfers"]["step"] == results["hand"]["transfers"]["step"]
    assert results["ours"]["transfers"]["step"] <= 4
