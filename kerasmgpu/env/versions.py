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

# Top-level packages whose classes and functions are the frameworks' own, not the user's.
FRAMEWORK_PACKAGES = frozenset({"keras", "tf_keras", "tensorflow"})


def frameworks_own(obj: object) -> bool:
    """Whether `obj` (a class or a function) is defined in a FRAMEWORK_PACKAGES package."""
    return (getattr(obj, "__module__", "") or "").split(".")[0] in FRAMEWORK_PACKAGES

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
# --- Verified ranges: [min, below) of each line, what the tox matrix tests -------------
# (`kerasmgpu.registry` puts each in its line and backend's entry: the one table.)
# tf.keras 2.x: 2.12 is the oldest TensorFlow with wheels for Python 3.11, where our CI
# runs; 2.9-2.11 cannot be installed there, so they are not claimed (compat/README.md).
TF_KERAS_MIN = Version("2.12")
TF_KERAS_VERIFIED_BELOW = Version("2.16")
# tf_keras (TF_USE_LEGACY_KERAS=1) starts with TF 2.16.
TF_KERAS_LEGACY_MIN = Version("2.16")
TF_KERAS_LEGACY_VERIFIED_BELOW = Version("2.22")
# Keras 3 on JAX and PyTorch: 3.3, the first release with `training=` in compute_loss.
KERAS3_MIN = Version("3.3")
KERAS3_VERIFIED_BELOW = Version("3.16")
# Breakpoint: Keras 3 on TensorFlow trains correctly under MirroredStrategy from 3.10
# on (measured natively, no kerasmgpu, compat/README.md): 3.3-3.4 never all-reduce the
# gradients (backend/tensorflow/optimizer.py reduces inside merge_call, where there is
# no replica context), 3.5-3.7 end with other weights than one device, and 3.8-3.9
# train right but report metrics from mirrored on-write variables that keep one
# replica's counts; 3.10 made metric variables sync-on-read.
KERAS3_TF_MIN = Version("3.10")
# Breakpoint: several processes on Keras 3 JAX need 3.11. Before it, `fit` under a
# multi-process `DataParallel` accepts only a tf.data.Dataset ("When using multi-worker
# distribution, the data must be provided as a `tf.data.Dataset`",
# keras/src/trainers/data_adapters/__init__.py, checked on 3.3.3, 3.8.0, 3.9.2, 3.10.0);
# 3.11 made that check depend on `auto_shard_dataset`, which kerasmgpu turns off.
KERAS3_JAX_MULTI_PROCESS_MIN = Version("3.11")
# Breakpoint: Keras 3 before 3.15 makes a layer's activity regularization loss a sum
# over the batch's rows (3.15 divides it by the batch size: keras/src/layers/layer.py,
# read in 3.3.3, 3.8.0, 3.10.0 and 3.15.1). Where each replica runs its own step
# (TensorFlow's strategy, torch's processes) the replicas' sums over their own rows are
# averaged: 1/N of one device's term (measured: Keras 3.10/3.12 TF History 37.7 and
# 12.0 against 326.7 and 10784 on one device, plain MirroredStrategy the same; Keras
# 3.8 torch, 2 processes, loss 6.99 against 8.37). JAX's one program over the global
# batch sums all rows, as one device does.
KERAS3_ACTIVITY_LOSS_IS_A_MEAN = Version("3.15")
# Breakpoint: Keras 3 on JAX lays a batch out with the layout it is given from 3.10
# (`distribute_data_input` is `jax.make_array_from_process_local_data(layout, batch)`,
# read in 3.10.0 and 3.15.1); 3.8 splits every batch over the replicas itself whatever
# the layout (read in 3.8.0; 3.9 not read), so the JAX adapter lays a batch whose rows
# do not divide out replicated itself there (`keras3_jax._lay_out_uneven`).
KERAS3_JAX_DATA_AS_LAID_OUT = Version("3.10")
# Standalone Keras: 2.3.1, the last release with `multi_gpu_model`.
# Breakpoint: Keras 3 accumulation (`gradient_accumulation_steps`) counts optimizer steps
# in `iterations` from 3.8 (the micro-batches in `_iterations`), and clips and decays the
# group's gradient once; before it (3.3 measured) `iterations` counts micro-batches, which
# Adam's bias correction and EMA read, and clipping and decay act on each micro-batch;
# `fit(steps_per_epoch=)` on arrays also leaves an epoch's first batch out there.
KERAS3_ACCUMULATION_COUNTS_STEPS = Version("3.8")
# Breakpoint: Keras 3 before 3.12 applies a Keras mask (`Embedding(mask_zero=True)`) to a
# `MeanMetricWrapper` (accuracy and the like) only when the update has a sample weight
# (keras/src/metrics/reduction_metrics.py, read in 3.3.3, 3.8.0, 3.10.0 and 3.11.3;
# keras#21569, in 3.12.0, applies it always). `Mean` and `Sum` apply their values' mask
# only with a weight on every release to 3.15.
KERAS3_METRICS_MASK_WITHOUT_WEIGHT = Version("3.12")

LEGACY_KERAS_MIN = Version("2.3.1")
LEGACY_KERAS_VERIFIED_BELOW = Version("2.3.2")
# A release above a verified range is refused (kerasmgpu would have to guess where its
# hooks go); this variable lets a maintainer run the canary env on it anyway.
UNVERIFIED_OK_ENV = "KERASMGPU_UNVERIFIED_OK"
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
# Variables that only one backend reads for its devices. XLA_FLAGS carries JAX's host
# device count, which `kerasmgpu.virtual_devices()` writes whatever the backend (it runs
# before any framework starts); TensorFlow's devices and the other routes ignore it.
BACKEND_ONLY_VARIABLES = {"XLA_FLAGS": "jax"}


def variable_applies(name: str, backend: str) -> bool:
    """Whether environment variable `name` means anything to `backend`'s devices."""
    return BACKEND_ONLY_VARIABLES.get(name, backend) == backend


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


def unverified_ok() -> bool:
    return _truthy(os.environ.get(UNVERIFIED_OK_ENV))
