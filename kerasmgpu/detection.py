"""Which Keras, which backend, which versions, which devices: the one place that knows.

Everything here is answered from package metadata and environment variables, so that
``import kerasmgpu`` and ``kerasmgpu.environment()`` import no framework. Only
``environment(devices=True)`` starts the active framework, because only it can list
devices. Version facts live in this module and nowhere else: routes read the flags
below, they never parse a version themselves (accelerate's ``utils/imports.py``,
Lightning's ``utilities/imports.py``).
"""

from __future__ import annotations

import enum
import functools
import json
import os
import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Dict, Optional, Tuple

from packaging.version import Version

# --- Version facts -------------------------------------------------------------------
# Breakpoint: keras 2.4 (June 2020) dropped the multi-backend code and became tf.keras;
# `keras.utils.multi_gpu_model` exists up to standalone Keras 2.3.1.
LEGACY_KERAS_MAX = Version("2.3.99")
# Breakpoint: TF 2.4 removed `tf.keras.utils.multi_gpu_model` (tensorflow#44158).
TF_WITHOUT_MULTI_GPU_MODEL = Version("2.4")
# Breakpoint: Keras 3.0 (Nov 2023) - multi-backend again, `keras.distribution` on JAX.
KERAS_3 = Version("3.0")
# Breakpoint: from TF 2.6 on, tf.keras is the separate `keras` package, released in
# step with TF (same major.minor).
TF_SPLIT_KERAS = Version("2.6")
# Breakpoint: TF 2.16 ships Keras 3 as `tf.keras`; tf_keras + TF_USE_LEGACY_KERAS=1 is
# the way back to Keras 2 there.
TF_WITH_KERAS_3 = Version("2.16")
# Breakpoint: `Model.compute_loss` / `compute_metrics` became public in tf.keras 2.9;
# the mirrored route overrides both to keep padded rows out of losses and metrics.
TF_KERAS_MIN = Version("2.9")
# Breakpoint: Keras 3.3 added `training=` to `compute_loss`.
KERAS3_MIN = Version("3.3")
# Breakpoint: jax 0.4.34 added the `jax_num_cpu_devices` option; older releases only
# read XLA_FLAGS=--xla_force_host_platform_device_count.
JAX_NUM_CPU_DEVICES_OPTION = Version("0.4.34")

# Distribution names under which TensorFlow is published.
_TF_DISTS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-intel",
    "tensorflow-macos",
    "tf-nightly",
    "tf-nightly-cpu",
)

VIRTUAL_DEVICES_ENV = "KERASMGPU_VIRTUAL_DEVICES"
# Set by `kerasmgpu launch` in each worker.
PROCESS_INDEX_ENV = "KERASMGPU_PROCESS_INDEX"
PROCESS_COUNT_ENV = "KERASMGPU_PROCESS_COUNT"
COORDINATOR_ENV = "KERASMGPU_COORDINATOR"
LOCAL_PROCESS_INDEX_ENV = "KERASMGPU_LOCAL_PROCESS_INDEX"
LOCAL_PROCESS_COUNT_ENV = "KERASMGPU_LOCAL_PROCESS_COUNT"


class KerasLine(str, enum.Enum):
    """The Keras a project runs; each line has its own route."""

    LEGACY = "keras<=2.3"  # standalone multi-backend Keras (or tf.keras on TF < 2.4)
    TF_KERAS = "tf.keras 2.x"  # the `keras` 2.4-2.15 package behind `tf.keras`
    TF_KERAS_LEGACY = "tf_keras"  # the `tf-keras` package, TF_USE_LEGACY_KERAS=1
    KERAS_3 = "keras 3"
    NONE = "none"

    def __str__(self) -> str:
        return self.value


@functools.cache
def dist_version(name: str) -> Optional[Version]:
    """The installed version of a distribution, or None; never imports it."""
    try:
        return Version(metadata.version(name))
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # a broken dist-info must not break detection
        return None


def tensorflow_version() -> Optional[Version]:
    for name in _TF_DISTS:
        found = dist_version(name)
        if found is not None:
            return found
    return None


def _truthy(value: Optional[str]) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def keras_backend_name() -> str:
    """Keras 3's backend as Keras itself will pick it: env, then keras.json, then TF."""
    name = os.environ.get("KERAS_BACKEND")
    if name:
        return name.strip().lower()
    home = os.environ.get("KERAS_HOME") or str(Path.home() / ".keras")
    config = Path(home) / "keras.json"
    try:
        value = json.loads(config.read_text()).get("backend")
        if value:
            return str(value).lower()
    except (OSError, ValueError):
        pass
    return "tensorflow"


def detect_keras_line() -> Tuple[KerasLine, Optional[Version]]:
    """The active Keras line and its version, from metadata and the environment."""
    keras = dist_version("keras")
    tf = tensorflow_version()
    tf_keras = dist_version("tf-keras") or dist_version("tf_keras")
    legacy_requested = _truthy(os.environ.get("TF_USE_LEGACY_KERAS"))
    if keras is not None and keras >= KERAS_3:
        # With TF_USE_LEGACY_KERAS=1, `tf.keras` is tf_keras even though Keras 3 is
        # installed; that is how TF 2.16+ users stay on Keras 2.
        if legacy_requested and tf_keras is not None:
            return KerasLine.TF_KERAS_LEGACY, tf_keras
        return KerasLine.KERAS_3, keras
    if keras is not None and keras <= LEGACY_KERAS_MAX:
        return KerasLine.LEGACY, keras
    if keras is not None:
        return KerasLine.TF_KERAS, keras
    if tf_keras is not None and legacy_requested:
        return KerasLine.TF_KERAS_LEGACY, tf_keras
    if tf is not None:
        # TF <= 2.5 carried tf.keras inside tensorflow itself.
        if tf < TF_WITHOUT_MULTI_GPU_MODEL:
            return KerasLine.LEGACY, tf
        return KerasLine.TF_KERAS, tf
    return KerasLine.NONE, None


def backend_for(line: KerasLine) -> str:
    if line is KerasLine.KERAS_3:
        return keras_backend_name()
    if line is KerasLine.NONE:
        return ""
    return "tensorflow"


@dataclass(frozen=True)
class Device:
    """One device a replica can run on."""

    kind: str  # "gpu", "cpu", "tpu"
    index: int
    name: str  # the framework's own name, e.g. "/device:GPU:0" or "cpu:0"
    virtual: bool = False  # a CPU device standing in for a GPU
    memory_mb: Optional[int] = None

    def __str__(self) -> str:
        tag = " (virtual)" if self.virtual else ""
        return f"{self.name}{tag}"


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


def requested_virtual_devices() -> Optional[int]:
    """The virtual device count asked for by `virtual_devices()` or the env variable."""
    from kerasmgpu import devices  # local: devices imports this module

    return devices.requested()


def process_index() -> int:
    """This process's rank in a `kerasmgpu launch` run (0 outside one)."""
    return int(os.environ.get(PROCESS_INDEX_ENV, "0") or 0)


def process_count() -> int:
    """How many processes the `kerasmgpu launch` run has (1 outside one)."""
    return max(1, int(os.environ.get(PROCESS_COUNT_ENV, "1") or 1))


def is_chief() -> bool:
    """True in the process that writes checkpoints and the template (rank 0)."""
    return process_index() == 0


def _v(version: Optional[Version]) -> Optional[str]:
    return str(version) if version is not None else None


def environment(devices: bool = False) -> Environment:
    """Describe the environment; `devices=True` also starts the framework to list devices."""
    from kerasmgpu.routes import choose_route  # local: routes import this module

    line, keras_version = detect_keras_line()
    backend = backend_for(line)
    try:
        route: Optional[str] = choose_route(line, backend).value
    except (ValueError, NotImplementedError):
        route = None
    listed: Optional[Tuple[Device, ...]] = None
    if devices:
        from kerasmgpu import devices as devices_module

        listed = tuple(devices_module.list_devices(line, backend))
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
        virtual_devices=requested_virtual_devices(),
        process_index=process_index(),
        process_count=process_count(),
        variables={k: os.environ[k] for k in _WATCHED_VARIABLES if k in os.environ},
        devices=listed,
    )


# --- Flags the routes read ------------------------------------------------------------


def is_imported(module: str) -> bool:
    """Whether a framework is already imported (cheap; imports nothing)."""
    return module in sys.modules


def jax_has_num_cpu_devices_option() -> bool:
    version = dist_version("jax")
    return version is not None and version >= JAX_NUM_CPU_DEVICES_OPTION


def unsupported_version(line: KerasLine, version: Optional[Version]) -> Optional[str]:
    """Why this Keras release is too old for kerasmgpu's route, or None."""
    if version is None:
        return None
    if line is KerasLine.TF_KERAS and version < TF_KERAS_MIN:
        return f"tf.keras {version} (kerasmgpu needs >= {TF_KERAS_MIN})"
    if line is KerasLine.KERAS_3 and version < KERAS3_MIN:
        return f"Keras {version} (kerasmgpu needs >= {KERAS3_MIN})"
    return None
