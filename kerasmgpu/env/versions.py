"""Which Keras, which backend, which versions: the one module that knows version facts.

Everything here is answered from package metadata and environment variables, so that
``import kerasmgpu`` imports no framework. Version facts live in this module and nowhere
else: engines and adapters read the flags below, they never parse a version themselves
(accelerate's ``utils/imports.py``, Lightning's ``utilities/imports.py``).
"""

from __future__ import annotations

import enum
import functools
import json
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional, Tuple

from packaging.version import Version

# --- Version facts -------------------------------------------------------------------
# Breakpoint: keras 2.4 (June 2020) dropped the multi-backend code and became tf.keras;
# `keras.utils.multi_gpu_model` exists up to standalone Keras 2.3.1.
LEGACY_KERAS_MAX = Version("2.3.99")
# Standalone Keras 2.3.x is the legacy release `kerasmgpu.keras23` runs on a modern
# TensorFlow; its runtime patches were verified with exactly these releases.
KERAS23 = Version("2.3")
KERAS23_VERIFIED = {"keras": "2.3.1", "tensorflow": "2.15.1", "numpy": "1.26.4",
                    "h5py": "3.16.0", "python": "3.11"}
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


def standalone_keras23() -> Optional[Version]:
    """The installed standalone Keras 2.3.x release (it needs `kerasmgpu.keras23` on a
    TensorFlow that Python >= 3.9 can install), or None."""
    keras = dist_version("keras")
    if keras is not None and KERAS23 <= keras <= LEGACY_KERAS_MAX:
        return keras
    return None


def backend_for(line: KerasLine) -> str:
    if line is KerasLine.KERAS_3:
        return keras_backend_name()
    if line is KerasLine.NONE:
        return ""
    return "tensorflow"


# --- Flags the engines and adapters read ---------------------------------------------


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
