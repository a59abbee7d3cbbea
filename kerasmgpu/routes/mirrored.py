"""`mirrored`: tf.distribute on tf.keras 2.x, tf_keras and Keras 3 with TensorFlow.

One process: `MirroredStrategy` over the chosen GPUs (or virtual CPU devices); NCCL
all-reduce on Linux GPUs, hierarchical copy elsewhere, reduction to one device on CPU.
Several processes (`kerasmgpu launch`): `MultiWorkerMirroredStrategy` (see
`kerasmgpu.distributed`).
"""

from __future__ import annotations

from typing import Any, ContextManager, Dict, List, Sequence

from kerasmgpu import devices as devices_module
from kerasmgpu.detection import Device
from kerasmgpu.parallel.family import Family
from kerasmgpu.routes import Route
from kerasmgpu.routes.base import BaseRoute

class MirroredRoute(BaseRoute):
    route = Route.MIRRORED
    feed_kind = "tf"

    def __init__(self, family: Family, devices: Sequence[Device]) -> None:
        super().__init__(family, devices)
        import tensorflow as tf

        self.strategy = tf.distribute.MirroredStrategy(devices=[d.name for d in self.devices])

    @classmethod
    def available_devices(cls, family: Family) -> List[Device]:
        return devices_module.list_devices(family.line, "tensorflow")

    @property
    def replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync)

    def scope(self) -> ContextManager[Any]:
        return self.strategy.scope()  # type: ignore[no-any-return]

    def owns(self, model: Any) -> bool:
        strategy = getattr(model, "_distribution_strategy", None) or getattr(
            model, "_distribute_strategy", None
        )
        return strategy is self.strategy

    def describe(self) -> Dict[str, str]:
        ops = type(self.strategy.extended._cross_device_ops).__name__  # noqa: SLF001
        return {
            "route": self.route.value,
            "engine": "tf.distribute.MirroredStrategy",
            "replicas": str(self.replicas),
            "devices": ", ".join(d.name for d in self.devices),
            "all_reduce": ops,
        }

