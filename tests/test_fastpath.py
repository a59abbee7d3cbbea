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
    IN_PROCESS,
    ON_JAX,
    ON_TF,
    REPLICAS,
    assert_history_close,
    assert_weights_close,
    classification_data,
    keras_module,
    mlp,
    requires,
)

import kerasmgpu
from kerasmgpu.training import steps

pytestmark = requires(in_process=True)

if IN_PROCESS:
    keras = keras_module()


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Dict[str, List[Any]]:
    """The steps run (or traced): 'plain' per fast-path step, 'masked' per packing
    activated by a train/test step (its packing's shape)."""
    seen: Dict[str, List[Any]] = {"plain": [], "masked": []}
    plain_step, active = steps.plain_step, steps.active

    def counted_plain(data: Any, call: Any) -> Any:
        seen["plain"].append(True)
        return plain_step(data, call)

    def counted_active(packed: Any) -> Iterator[Any]:
        if packed is not None and not steps.unpadded(packed):
            seen["masked"].append(tuple(packed.shape))
        return active(packed)

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
    """The last batch of an epoch needs padding: it (and only it, where batches reach
    Keras one at a time) takes the masked step, exactly."""
    batch = 20 * replicas
    _fit_both(replicas, rows=batch * 12 + 1, batch=batch)
    assert taken["masked"], "the padded batch never took the masked step"
    assert all(shape[-1] == 2 for shape in taken["masked"]), taken["masked"]
    if ON_JAX:
        # Per batch: the full batches stay on the plain step; the padded one's step is
        # traced (train, test) once for its own shape.
        assert taken["plain"], "the full batches did not take the plain step"
        assert {shape[0] for shape in taken["masked"]} == {replicas}, taken["masked"]
    if ON_TF:
        # A tf.data pipeline has one traced step: decided per feed, every batch masked.
        assert taken["plain"] == []


@pytest.mark.core
@pytest.mark.parametrize("replicas", REPLICAS)
def test_uneven_batch_size_takes_the_masked_step_every_batch(
        replicas: int, taken: Dict[str, List[Any]]) -> None:
    """A batch size that does not divide: every batch is padded and masked, exactly."""
    _fit_both(replicas, rows=20 * replicas * 6, batch=20 * replicas + 1)
    assert taken["masked"]
