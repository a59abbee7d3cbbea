"""What the optimizer does to a step's gradient acts on the global batch's gradient.

Clipping (`clipnorm`, `global_clipnorm`, `clipvalue`) is not linear: one device clips
the gradient of the whole batch, so N replicas must clip the all-reduced gradient, not
each its own (plain Keras 3 under `MirroredStrategy` clips each replica's). The same
for what the optimizer does around the clip - weight decay, EMA, a loss scale, and a
LossScaleOptimizer's check for non-finite gradients (one replica's overflow must skip
the step everywhere, as one device skips it). Each case against a plain one-device
model from the same weights on the same batches: 101 rows, global batch 10 (3
replicas pad every batch, 2 replicas the last one).
"""

from __future__ import annotations

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
    grid,
    keras_module,
    mlp,
    requires,
)

import kerasmgpu
from kerasmgpu.env.versions import KerasLine

# heavy: trains the most models; the middle releases leave it out (tox.ini).
pytestmark = [requires(in_process=True), pytest.mark.heavy]

if IN_PROCESS:
    keras = keras_module()
KERAS3 = LINE is KerasLine.KERAS_3


def _cases() -> Dict[str, Callable[[], Any]]:
    if not IN_PROCESS:
        return {}
    opt = keras.optimizers
    cases: Dict[str, Callable[[], Any]] = {
        "clipnorm": lambda: opt.SGD(0.1, clipnorm=0.05),
        "global_clipnorm": lambda: opt.SGD(0.1, global_clipnorm=0.05),
        "clipvalue": lambda: opt.SGD(0.1, clipvalue=0.01),
        "adam_clipnorm": lambda: opt.Adam(0.01, clipnorm=0.05),
        "adamw_weight_decay_clipnorm": lambda: opt.AdamW(0.01, weight_decay=0.1,
                                                         clipnorm=0.05),
        "ema_clipnorm": lambda: opt.SGD(0.1, use_ema=True, clipnorm=0.05),
    }
    if KERAS3:
        cases["loss_scale_factor_clipnorm"] = lambda: opt.SGD(0.1, clipnorm=0.05,
                                                              loss_scale_factor=64.0)
        cases["loss_scale_optimizer_clipnorm"] = lambda: opt.LossScaleOptimizer(
            opt.SGD(0.1, clipnorm=0.05))
    else:  # tf.keras's legacy optimizers transform gradients by their own code
        cases["legacy_clipnorm"] = lambda: opt.legacy.SGD(0.1, clipnorm=0.05)
        cases["legacy_global_clipnorm"] = lambda: opt.legacy.SGD(0.1, global_clipnorm=0.05)
        cases["legacy_clipvalue"] = lambda: opt.legacy.SGD(0.1, clipvalue=0.01)
    return cases


CASES = _cases()


def _train_both(make: Callable[[], Any], replicas: int, x: Any, y: Any,
                atol: float = 1e-5, rtol: float = 1e-5) -> None:
    single = mlp(keras, optimizer=make())
    template = mlp(keras, optimizer=make())
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    h1 = single.fit(x, y, batch_size=10, epochs=3, shuffle=False, verbose=0)
    h2 = pmodel.fit(x, y, batch_size=10, epochs=3, shuffle=False, verbose=0)
    assert_weights_close(single, template, atol=atol)
    assert_history_close(h1, h2, rtol=rtol)
    np.testing.assert_allclose(single.evaluate(x, y, batch_size=10, verbose=0),
                               pmodel.evaluate(x, y, batch_size=10, verbose=0),
                               rtol=rtol, atol=1e-6)


@pytest.mark.core
@grid(case=list(CASES), replicas=REPLICAS)
def test_gradient_transforms_act_on_the_global_gradient(case: str, replicas: int) -> None:
    x, y = classification_data(rows=101)
    _train_both(CASES[case], replicas, x, y)


def _loss_scale(optimizer: Any) -> float:
    scale = getattr(optimizer, "dynamic_scale", None)  # Keras 3
    if scale is None:
        scale = optimizer.loss_scale  # tf.keras
    return float(np.asarray(scale))


@pytest.mark.core
@grid(replicas=REPLICAS, clip=[False, True])
def test_a_non_finite_gradient_on_one_replica_skips_the_step_everywhere(replicas: int,
                                                                        clip: bool) -> None:
    """A LossScaleOptimizer (what mixed precision compiles in) skips a step whose
    gradient is not finite and halves its scale. One row of batch 1 is infinite, on the
    last replica only: every replica must skip that step as one device does (Keras 3 on
    TF took replica 0's verdict and trained on the NaN: NaN weights everywhere). In
    float32, so that the rest is exact (float16 sums the replicas' shares in another
    order than one device sums the batch)."""
    x, y = classification_data(rows=101)
    x[17] = np.inf  # batch 1 (rows 10-19), row 7: on the last replica for 2 and 3
    scaled = (keras.optimizers.LossScaleOptimizer if KERAS3
              else keras.mixed_precision.LossScaleOptimizer)

    def make() -> Any:
        inner = keras.optimizers.SGD(0.1, clipnorm=0.5) if clip else keras.optimizers.SGD(0.1)
        return scaled(inner)

    single = mlp(keras, optimizer=make())
    template = mlp(keras, optimizer=make())
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    single.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    pmodel.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    assert all(np.isfinite(w).all() for w in single.get_weights())
    assert_weights_close(single, template)
    assert _loss_scale(single.optimizer) == _loss_scale(pmodel.optimizer) < 2.0**15
    finite = np.isfinite(x).all(axis=1)
    np.testing.assert_allclose(
        single.evaluate(x[finite], y[finite], batch_size=10, verbose=0),
        pmodel.evaluate(x[finite], y[finite], batch_size=10, verbose=0), rtol=1e-5)
