"""`mirrored`: tf.distribute on tf.keras 2.x, tf_keras and Keras 3 with TensorFlow.

One process: `MirroredStrategy` over the chosen GPUs (or virtual CPU devices); NCCL
all-reduce on Linux GPUs, hierarchical copy elsewhere, reduction to one device on CPU.
Several processes (`kerasmgpu launch`): `MultiWorkerMirroredStrategy` (see
`kerasmgpu.distributed`).
"""

from __future__ import annotations

import itertools
from typing import Any, ContextManager, Dict, List, Sequence

from kerasmgpu import devices as devices_module
from kerasmgpu.detection import Device
from kerasmgpu.parallel.family import Family
from kerasmgpu.routes import Route
from kerasmgpu.routes.base import BaseRoute

# Every strategy numbers its collective groups from 1 + `_collective_key_base` (0 by
# default), so a second strategy of another size in the same process (gpus=2, then
# gpus=3) joins the first one's groups and aborts: "Device CPU:0 is joining a group
# with size3, but that group has size 2". Each of ours gets its own key range.
_KEY_RANGE = 1_000_000
_key_bases = itertools.count(1)


def _new_strategy(tf: Any, devices: List[str]) -> Any:
    strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
    strategy._collective_key_base = next(_key_bases) * _KEY_RANGE  # read by __init__
    strategy.__init__(devices=devices)
    return strategy


class MirroredRoute(BaseRoute):
    route = Route.MIRRORED
    feed_kind = "tf"

    def __init__(self, family: Family, devices: Sequence[Device]) -> None:
        super().__init__(family, devices)
        import tensorflow as tf

        self.strategy = _new_strategy(tf, [d.name for d in self.devices])

    @classmethod
    def available_devices(cls, family: Family) -> List[Device]:
        return devices_module.list_devices(family.line, "tensorflow")

    @property
    def replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync)

    def scope(self) -> ContextManager[Any]:
        scope: ContextManager[Any] = self.strategy.scope()
        return scope

    def owns(self, model: Any) -> bool:
        strategy = getattr(model, "_distribution_strategy", None) or getattr(
            model, "_distribute_strategy", None
        )
        return strategy is self.strategy

    def describe(self) -> Dict[str, str]:
        ops = type(self.strategy.extended._cross_device_ops).__name__
        return {
            "route": self.route.value,
            "engine": "tf.distribute.MirroredStrategy",
            "replicas": str(self.replicas),
            "devices": ", ".join(d.name for d in self.devices),
            "all_reduce": ops,
        }

