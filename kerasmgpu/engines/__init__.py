"""The engines: one module per route, all with the surface of `engines.base.Engine`.

| route                | module                 | engine                                   |
|----------------------|------------------------|------------------------------------------|
| `multi_gpu_model`    | `multi_gpu_model.py`   | Keras <= 2.3's own multi_gpu_model       |
| `mirrored`           | `mirrored.py`          | tf.distribute (Mirrored / MultiWorkerMirrored) |
| `keras_distribution` | `keras_distribution.py`| keras.distribution.DataParallel (JAX)    |
| `torch_ddp`          | `torch_ddp.py`         | torch.distributed all-reduce             |

The registry names modules; an engine module (and its framework) is imported only
when its route is chosen.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Dict, Type

from kerasmgpu.routes import Route

if TYPE_CHECKING:
    from kerasmgpu.engines.base import BaseRoute

# Route -> "module:Class"; imported only when the route is used.
_REGISTRY: Dict[Route, str] = {
    Route.MULTI_GPU_MODEL: "kerasmgpu.engines.multi_gpu_model:MultiGpuModelRoute",
    Route.MIRRORED: "kerasmgpu.engines.mirrored:MirroredRoute",
    Route.KERAS_DISTRIBUTION: "kerasmgpu.engines.keras_distribution:KerasDistributionRoute",
    Route.TORCH_DDP: "kerasmgpu.engines.torch_ddp:TorchDDPRoute",
}


def load_route(route: Route) -> Type[BaseRoute]:
    """The engine class of a route (imports its module, not yet its framework)."""
    module_name, _, class_name = _REGISTRY[route].partition(":")
    route_class: Type[BaseRoute] = getattr(importlib.import_module(module_name), class_name)
    return route_class


__all__ = ["load_route"]
