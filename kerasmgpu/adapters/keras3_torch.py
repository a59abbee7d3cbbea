"""Keras 3 on PyTorch: what differs from TensorFlow and JAX (one process per device).

Verified on the releases of `env.versions.KERAS3_MIN` (3.3) to below
`KERAS3_VERIFIED_BELOW` with torch (the tox matrix runs 3.3, 3.8 and 3.15); the
internals every backend shares are in `keras3`. What is read or wrapped here:

* `BatchNormalization._moments` / `_reduction_axes`: the moments over every process's
  kept rows, all-reduced (`_batch_moments`).
* verify=True: the public `stateless_call` / `stateless_compute_loss` under
  `torch.autograd.grad`; nothing they return is assigned.
* change tokens (`state_reader`): `variable._value`, the torch tensor the public `value`
  returns (outside an autocast or stateless scope, where it is a copy), whose
  `_version` counts in-place writes.
"""

from __future__ import annotations

from typing import Any, Callable, List

from kerasmgpu.adapters.base import StateReader
from kerasmgpu.adapters.keras3 import Keras3


class Keras3Torch(Keras3):
    """Keras 3 on PyTorch: one process per device, each running the step on its shard of
    the global batch, gradients all-reduced (`torch.distributed`)."""

    @property
    def identity_tokens(self) -> bool:
        return True  # see state_reader

    def allow_changing_structure(self, dataset: Any, kind_of: Callable[[Any], Any],
                                 replicated: Callable[[Any], bool]) -> bool:
        return True  # Keras 3 on torch reads every batch as it comes

    @property
    def counts_per_replica(self) -> bool:
        return True

    def replica_mean(self, x: Any) -> Any:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return x
        total = x.detach().clone()
        dist.all_reduce(total)
        return total / dist.get_world_size()

    def _batch_moments(self, layer: Any) -> Callable[[Any, Any], Any]:
        """`BatchNormalization._moments(inputs, mask)` over every process's kept rows.

        On torch each process holds its shard of the global batch: the masked sums and
        row count are all-reduced, then the masked squared deviations from the global
        mean (two passes, as one device's moments). The all-reduce is torch's
        differentiable one (`torch.distributed.nn.functional.all_reduce`, whose backward
        all-reduces the gradients), so every process's gradient also carries what its rows
        did to the other processes' losses through the shared statistics, and the
        averaged gradient is one device's. Verified on Keras 3.3 and 3.15 (`_moments`,
        `_reduction_axes`).
        """
        import torch
        import torch.distributed as dist
        from torch.distributed.nn.functional import all_reduce

        original = getattr(layer, "_moments", None)
        if not callable(original) or not hasattr(layer, "_reduction_axes"):
            raise self.fail("`BatchNormalization._moments` / `_reduction_axes` is missing",
                            "synchronized BatchNorm")
        alone = self._idle_keeps_moving(layer, original)

        def moments(inputs: Any, mask: Any) -> Any:
            if not (dist.is_available() and dist.is_initialized()):
                return alone(inputs, mask)
            axes = tuple(layer._reduction_axes)
            # No mask: a step without padding rows (every row counts), still synchronized.
            kept = torch.ones_like(inputs) if mask is None else (
                mask.unsqueeze(-1).expand_as(inputs).to(inputs.dtype))
            total = all_reduce(torch.stack([
                torch.sum(inputs * kept, dim=axes, keepdim=True),
                torch.sum(kept, dim=axes, keepdim=True)]))
            count = torch.clamp(total[1], min=1.0)  # a channel without rows: 0, not nan
            mean = total[0] / count
            squares = all_reduce(
                torch.sum(torch.square(inputs - mean) * kept, dim=axes, keepdim=True))
            # A filler (no kept row in any process) leaves the moving statistics alone.
            return self._kept_moving(layer, torch.squeeze(total[1]), torch.squeeze(mean),
                                     torch.squeeze(squares / count))

        return moments

    def state_reader(self, variables: List[Any]) -> StateReader:
        variables = self._backend_values(list(variables))
        # A tensor's version counter grows with every in-place write (copy_, the
        # optimizers' foreach updates).
        return lambda: [(id(v._value), v._value._version) for v in variables]

    def replica_loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                                   training: bool) -> List[Any]:
        import torch

        loss_of = self._stateless_loss(model, x, y, sample_weight, training)
        trainable = [v.value.detach().clone().requires_grad_(True)
                     for v in model.trainable_variables]
        with torch.enable_grad():
            loss = loss_of(trainable, [v.value.detach() for v in model.non_trainable_variables],
                           [v.value.detach() for v in model.metrics_variables])
            grads = torch.autograd.grad(loss, trainable, allow_unused=True)
        return [loss.detach()] + [torch.zeros_like(v) if g is None else g
                                  for g, v in zip(grads, trainable)]
