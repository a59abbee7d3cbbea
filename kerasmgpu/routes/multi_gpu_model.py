"""`multi_gpu_model`: Keras <= 2.3 through its own multi_gpu_model."""

from __future__ import annotations

from typing import Any, ContextManager, List, Sequence

from kerasmgpu import devices as devices_module
from kerasmgpu._errors import NotYetSupportedError
from kerasmgpu.detection import Device
from kerasmgpu.parallel.family import Family
from kerasmgpu.routes import Route
from kerasmgpu.routes.base import BaseRoute, nothing


class MultiGpuModelRoute(BaseRoute):
    route = Route.MULTI_GPU_MODEL

    def __init__(self, family: Family, devices: Sequence[Device]) -> None:
        super().__init__(family, devices)
        raise NotYetSupportedError("multi_gpu_model is not implemented yet")

    @classmethod
    def available_devices(cls, family: Family) -> List[Device]:
        return devices_module.list_devices(family.line, "tensorflow")

    @property
    def replicas(self) -> int:
        return len(self.devices)

    def scope(self) -> ContextManager[Any]:
        return nothing()

    def owns(self, model: Any) -> bool:
        return False
