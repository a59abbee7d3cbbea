"""Keras 3 on JAX: what differs from TensorFlow and torch (one program, stateless steps).

Verified on the releases of `env.versions.KERAS3_MIN` (3.3) to below
`KERAS3_VERIFIED_BELOW` with JAX (the tox matrix runs 3.3, 3.8 and 3.15); the internals
every backend shares are in `keras3`. What is read or wrapped here:

* `layer.add_loss` (public), wrapped on every layer's instance: a stateless step leaves
  no `_losses` behind, so a loss added in `call` is noticed there
  (`has_call_time_losses`).
* `BatchNormalization._moments`: a batch whose mask keeps no row leaves the moving
  statistics as they are (`_batch_moments`); the one program sees the global batch.
* verify=True: the JAX trainer's `compute_loss_and_updates`; nothing it returns is
  assigned.
* change tokens (`state_reader`): `variable._value`, the JAX array the public `value`
  returns (outside an autocast or stateless scope, where it is a copy), replaced by
  every assign.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from kerasmgpu.adapters.base import Held, StateReader
from kerasmgpu.adapters.keras3 import Keras3
from kerasmgpu.adapters.step_ops import HOOKED


class Keras3Jax(Keras3):
    """Keras 3 on JAX: `keras.distribution.DataParallel` runs one program over every
    device, on the global batch, with stateless steps."""

    @property
    def stateless_steps(self) -> bool:
        return True

    @property
    def identity_tokens(self) -> bool:
        return True  # see state_reader

    def install_loss_hook(self, model: Any, hook: Callable[[Any, Any, Any], Any],
                          values: Optional[Callable[[Any, Any, Any], Any]] = None) -> None:
        self._watch_add_loss(model)
        super().install_loss_hook(model, hook, values)

    def _watch_add_loss(self, model: Any) -> None:
        for layer in [model, *model._flatten_layers(include_self=False)]:
            original = getattr(layer, "add_loss", None)
            if original is None or layer.__dict__.get(HOOKED + "_add_loss"):
                continue

            def add_loss(loss: Any, _original: Any = original) -> Any:
                model.__dict__[HOOKED + "_added_loss"] = True
                return _original(loss)

            layer.__dict__["add_loss"] = add_loss
            layer.__dict__[HOOKED + "_add_loss"] = True

    def _batch_moments(self, layer: Any) -> Callable[[Any, Any], Any]:
        return self._idle_keeps_moving(layer)

    def state_reader(self, variables: List[Any]) -> StateReader:
        variables = self._backend_values(list(variables))
        # JAX arrays are immutable: an assign puts a new array in the variable.
        return lambda: [Held(v._value) for v in variables]

    def loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                           training: bool, class_weight: Any = None
                           ) -> Optional[Tuple[Any, List[Any]]]:
        import jax
        import numpy as np

        # JAX's trainer computes the loss statelessly (`compute_loss_and_updates`,
        # public on Keras 3.0 - 3.15): the new states it returns are dropped, so the
        # check assigns nothing.
        def values(variables: List[Any]) -> List[Any]:
            return [v.value for v in variables]

        optimizer = getattr(model, "optimizer", None)
        grad = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
        (loss, _), grads = grad(
            values(model.trainable_variables), values(model.non_trainable_variables),
            values(model.metrics_variables), x, y, sample_weight, training=training,
            optimizer_variables=values(optimizer.variables) if optimizer is not None else [])
        return float(np.asarray(loss)), [np.asarray(g) for g in grads]
