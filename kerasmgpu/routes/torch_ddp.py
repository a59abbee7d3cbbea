"""`torch_ddp`: Keras 3 on PyTorch, one process per device, gradients all-reduced."""

from __future__ import annotations

from typing import Any, ContextManager, List, Sequence

from kerasmgpu import devices as devices_module
from kerasmgpu._errors import NotYetSupportedError
from kerasmgpu.detection import Device
from kerasmgpu.parallel.family import Family
from kerasmgpu.routes import Route
from kerasmgpu.routes.base import BaseRoute, nothing


class TorchDDPRoute(BaseRoute):
    route = Route.TORCH_DDP

    def __init__(self, family: Family, devices: Sequence[Device]) -> None:
        super().__init__(family, devices)
        raise NotYetSupportedError("torch_ddp is not implemented yet")

    @classmethod
    def available_devices(cls, family: Family) -> List[Device]:
        return devices_module.list_devices(family.line, "torch")

    @property
    def replicas(self) -> int:
        return len(self.devices)

    def scope(self) -> ContextManager[Any]:
        return nothing()

    def owns(self, model: Any) -> bool:
        return False
