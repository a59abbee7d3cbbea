"""`kerasmgpu.environment()`: what kerasmgpu sees, in one printable, frozen dataclass.

Composed from `env` (versions, devices, cluster) and `routes` (the route choice);
`environment(devices=True)` is the one call here that starts a framework.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

from packaging.version import Version

from kerasmgpu.env import cluster
from kerasmgpu.env import devices as devices_module
from kerasmgpu.env.devices import Device
from kerasmgpu.env.versions import (
    VIRTUAL_DEVICES_ENV,
    KerasLine,
    dist_version,
    tensorflow_version,
    variable_applies,
)
from kerasmgpu.registry import Active


@dataclass(frozen=True)
class Environment:
    """What kerasmgpu sees: print it, or read its fields; `kerasmgpu doctor` shows it."""

    keras_line: KerasLine
    keras_version: Optional[str]
    backend: str
    tensorflow_version: Optional[str]
    tf_keras_version: Optional[str]
    jax_version: Optional[str]
    torch_version: Optional[str]
    python_version: str
    route: Optional[str]
    virtual_devices: Optional[int]
    process_index: int
    process_count: int
    variables: Dict[str, str] = field(default_factory=dict)
    devices: Optional[Tuple[Device, ...]] = None

    def __str__(self) -> str:
        lines = [
            f"Keras line      : {self.keras_line.value} ({self.keras_version or '-'})",
            f"backend         : {self.backend or '-'}",
            f"tensorflow      : {self.tensorflow_version or '-'}",
            f"tf_keras        : {self.tf_keras_version or '-'}",
            f"jax             : {self.jax_version or '-'}",
            f"torch           : {self.torch_version or '-'}",
            f"python          : {self.python_version}",
            f"route           : {self.route or '-'}",
            f"virtual devices : {self.virtual_devices or '-'}",
            f"process         : {self.process_index} of {self.process_count}",
        ]
        for key, value in sorted(self.variables.items()):
            lines.append(f"{key:<16}: {value}")
        if self.devices is not None:
            shown = ", ".join(str(d) for d in self.devices) or "none"
            lines.append(f"devices         : {shown}")
        return "\n".join(lines)


_WATCHED_VARIABLES = (
    "KERAS_BACKEND",
    "TF_USE_LEGACY_KERAS",
    "CUDA_VISIBLE_DEVICES",
    VIRTUAL_DEVICES_ENV,
    "XLA_FLAGS",
    "TF_CONFIG",
)


def _v(version: Optional[Version]) -> Optional[str]:
    return str(version) if version is not None else None


def environment(active: Active, job: cluster.ClusterEnvironment,
                devices: Optional[Sequence[Device]] = None) -> Environment:
    """Describe what this process runs: the active Keras, its job, and the devices
    listed by its engine (None: not listed - that starts the framework)."""
    line, keras_version, backend = active.line, active.version, active.backend
    route = active.entry.route.value if active.entry is not None else None
    listed = tuple(devices) if devices is not None else None
    return Environment(
        keras_line=line,
        keras_version=_v(keras_version),
        backend=backend,
        tensorflow_version=_v(tensorflow_version()),
        tf_keras_version=_v(dist_version("tf-keras")),
        jax_version=_v(dist_version("jax")),
        torch_version=_v(dist_version("torch")),
        python_version=platform.python_version(),
        route=route,
        virtual_devices=devices_module.requested(),
        process_index=job.global_rank(),
        process_count=job.world_size(),
        variables={k: os.environ[k] for k in _WATCHED_VARIABLES
                   if k in os.environ and variable_applies(k, backend)},
        devices=listed,
    )
