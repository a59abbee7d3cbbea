"""`multi_gpu_model`: standalone Keras <= 2.3 (and tf.keras on TF < 2.4), Keras's own way.

`keras.utils.multi_gpu_model` builds one graph: the batch is sliced over the replicas
(the last one takes the remainder, so nothing is dropped), each replica is the
template applied to its slice, and the outputs are concatenated before the loss - so
the loss, gradients and metrics are those of the whole batch, and the replicas share
the template's variables (the template always holds the trained weights).

On a machine without GPUs, Keras's device check only accepts "/gpu:N" names. With
virtual devices we show it that many GPU names while it builds the graph; the
session's soft placement (on in Keras 2.3's default session config) runs those ops on
the CPU, so the slicing and merging still run for real.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, ContextManager, Dict, Sequence

from kerasmgpu.adapters.keras23 import Keras23
from kerasmgpu.engines.base import BaseRoute
from kerasmgpu.env.devices import Device
from kerasmgpu.routes import Route


class MultiGpuModelRoute(BaseRoute):
    route = Route.MULTI_GPU_MODEL

    def __init__(self, family: Keras23, devices: Sequence[Device],
                 cpu_merge: bool = True, cpu_relocation: bool = False) -> None:
        super().__init__(family, devices)
        self.cpu_merge = cpu_merge
        self.cpu_relocation = cpu_relocation

    @property
    def replicas(self) -> int:
        return len(self.devices)

    def scope(self) -> ContextManager[Any]:
        # Keras 2.3 has no strategy scope: models are built anywhere.
        return contextlib.nullcontext()

    def owns(self, model: Any) -> bool:
        return False

    def _gpu_names_for_virtual_devices(self) -> ContextManager[Any]:
        if all(d.kind == "gpu" for d in self.devices):
            return contextlib.nullcontext()
        count = len(self.available_devices(self.family))
        return self.family.shown_gpu_names(["/cpu:0"] + [f"/gpu:{i}" for i in range(count)])

    def parallelize(self, model: Any) -> Any:
        from kerasmgpu.training.model import STATE_ATTR, ParallelState

        ids = [d.index for d in self.devices]
        # After kerasmgpu.legacy.install(), utils.multi_gpu_model is the drop-in itself.
        keras_multi_gpu_model = self.family.keras_multi_gpu_model()
        inner = model
        if self.cpu_relocation:
            # Keras's own relocation clones the template with fresh weights and trains
            # the clone, so "save the template" saved untrained weights. Relocate here
            # with the template's weights, and give them back after training.
            import tensorflow as tf

            with tf.device("/cpu:0"):
                inner = self.family.keras.models.clone_model(model)
            inner.set_weights(model.get_weights())
        with self._gpu_names_for_virtual_devices():
            parallel = keras_multi_gpu_model(
                inner, gpus=ids, cpu_merge=self.cpu_merge, cpu_relocation=False
            )
        if self.family.is_compiled(model):
            parallel.compile(**self.family.compile_args(model))
        parallel.__dict__[STATE_ATTR] = ParallelState(template=model, route=self,
                                                      family=self.family)
        if inner is not model:
            _give_weights_back(parallel, inner, model)
        return parallel

    def describe(self) -> Dict[str, str]:
        return {
            "route": self.route.value,
            "engine": "keras.utils.multi_gpu_model (Keras <= 2.3)",
            "replicas": str(self.replicas),
            "devices": ", ".join(d.name for d in self.devices),
            "all_reduce": "none: outputs concatenated on "
            + ("the CPU" if self.cpu_merge else "the first GPU")
            + ", one loss and one gradient over the whole batch",
        }


def _give_weights_back(parallel: Any, inner: Any, template: Any) -> None:
    """After each training call, the relocated copy's weights go to the template."""
    klass = type(parallel)
    for name in ("fit", "fit_generator", "train_on_batch"):
        original = getattr(klass, name, None)
        if original is None:
            continue

        def synced(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            result = _original(self, *args, **kwargs)
            template.set_weights(inner.get_weights())
            return result

        parallel.__dict__[name] = types.MethodType(synced, parallel)
