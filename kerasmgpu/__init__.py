"""kerasmgpu: train any Keras model on all of a machine's GPUs with one call.

    import kerasmgpu
    pmodel = kerasmgpu.parallelize(model)      # all GPUs; gpus=2 or gpus=[0, 3]
    pmodel.fit(x, y, batch_size=256)           # global batch, split over replicas

`import kerasmgpu` imports no framework: names below load on first use.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from kerasmgpu._version import __version__

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from kerasmgpu._errors import VerificationError
    from kerasmgpu.api import (
        describe,
        environment,
        parallelize,
        route_for,
        scope,
        virtual_devices,
    )
    from kerasmgpu.env.cluster import is_chief, process_count, process_index
    from kerasmgpu.env.devices import Device
    from kerasmgpu.env.versions import KerasLine
    from kerasmgpu.inventory import Environment
    from kerasmgpu.routes import Route

_LAZY = {
    "parallelize": "kerasmgpu.api",
    "scope": "kerasmgpu.api",
    "virtual_devices": "kerasmgpu.api",
    "environment": "kerasmgpu.api",
    "describe": "kerasmgpu.api",
    "route_for": "kerasmgpu.api",
    "VerificationError": "kerasmgpu._errors",
    "Environment": "kerasmgpu.inventory",
    "KerasLine": "kerasmgpu.env.versions",
    "Device": "kerasmgpu.env.devices",
    "Route": "kerasmgpu.routes",
    "process_index": "kerasmgpu.env.cluster",
    "process_count": "kerasmgpu.env.cluster",
    "is_chief": "kerasmgpu.env.cluster",
}
_SUBMODULES = {"legacy", "callbacks", "batching", "cli", "migrate"}

__all__ = [
    "Device",
    "Environment",
    "KerasLine",
    "Route",
    "VerificationError",
    "__version__",
    "describe",
    "environment",
    "is_chief",
    "parallelize",
    "process_count",
    "process_index",
    "route_for",
    "scope",
    "virtual_devices",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"kerasmgpu.{name}")
    raise AttributeError(f"module 'kerasmgpu' has no attribute {name!r}")


def __dir__() -> list:
    return __all__


# KERASMGPU_VIRTUAL_DEVICES=n must act before the framework starts its runtime: record it
# now (XLA_FLAGS for JAX, a post-import hook for TensorFlow) without importing either.
if os.environ.get("KERASMGPU_VIRTUAL_DEVICES"):
    from kerasmgpu.env.devices import apply_environment_request as _apply

    _apply()
# In a process of a multi-process job (kerasmgpu launch, torchrun, mpirun, srun, a
# cluster's TF_CONFIG), the engines must start before their frameworks' runtimes do:
# register that now, again without importing a framework. One of these variables is
# required by every environment of `kerasmgpu.env.cluster` (checked by the tests), so a
# plain process does not even import that module.
_LAUNCHER_VARIABLES = ("KERASMGPU_PROCESS_COUNT", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                       "SLURM_STEP_NUM_TASKS", "TF_CONFIG")
if any(os.environ.get(name) for name in _LAUNCHER_VARIABLES):
    from kerasmgpu.env import cluster as _cluster

    try:
        _job = _cluster.job()  # this process's job, from now on
    except ValueError:  # contradictory launcher variables: parallelize() reports them
        _job = _cluster.SingleProcess()
    if _job.world_size() > 1:
        from kerasmgpu.engines.startup import setup_at_import as _setup

        _setup(_job)
