"""The engines: one module per route, all with the surface of `engines.base.Engine`.

| route                | module                 | engine                                   |
|----------------------|------------------------|------------------------------------------|
| `multi_gpu_model`    | `multi_gpu_model.py`   | Keras <= 2.3's own multi_gpu_model       |
| `mirrored`           | `mirrored.py`          | tf.distribute (Mirrored / MultiWorkerMirrored) |
| `keras_distribution` | `keras_distribution.py`| keras.distribution.DataParallel (JAX)    |
| `torch_ddp`          | `torch_ddp.py`         | torch.distributed all-reduce             |

`kerasmgpu.registry` names each entry's engine; an engine module (and its framework) is
imported only when its entry is chosen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Type

from kerasmgpu import registry
from kerasmgpu.registry import Entry, Route

if TYPE_CHECKING:
    from kerasmgpu.engines.base import Engine


def load(entry: Entry) -> Type[Engine]:
    """The engine class of a registry entry (imports its module, not yet its framework)."""
    engine: Type[Engine] = registry.resolve(entry.engine)
    return engine


def load_route(route: Route) -> Type[Engine]:
    """The engine class of a route (every entry of a route names the same engine)."""
    return load(registry.entries_of(route)[0])


__all__ = ["load", "load_route"]
