"""Devices: listing them, choosing them from `gpus=`, and CPU stand-ins for GPUs.

On a machine without GPUs, `virtual_devices(n)` (or KERASMGPU_VIRTUAL_DEVICES=n) splits
the CPU into n devices that the active backend treats as separate replicas:
TensorFlow logical CPU devices, JAX host-platform devices. Both must be configured
before the framework starts its runtime, so the request is recorded at once and applied
by a post-import hook when TensorFlow is imported later; asking after the runtime has
started raises `TooLateError` instead of silently training on one device.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

from kerasmgpu import _hooks
from kerasmgpu._errors import TooLateError, bad_type, bad_value
from kerasmgpu.env import versions
from kerasmgpu.env.versions import VIRTUAL_DEVICES_ENV


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


GpusArg = Union[None, int, Sequence[int]]

_lock = threading.Lock()
_requested: Optional[int] = None
_tf_applied: Optional[int] = None
_tf_error: Optional[BaseException] = None

_XLA_FLAG = "--xla_force_host_platform_device_count"


def _parse_count(value: Any, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value.strip())
            else:
                raise ValueError
        except ValueError:
            raise bad_type(
                source,
                value,
                "an integer >= 1",
                f"pass the number of CPU devices to create, e.g. {source}=2",
            ) from None
    if value < 1:
        raise bad_value(
            source, value, "an integer >= 1", f"pass the number of CPU devices, e.g. {source}=2"
        )
    return int(value)


def requested() -> Optional[int]:
    """The virtual device count asked for, by call or environment, or None."""
    if _requested is not None:
        return _requested
    raw = os.environ.get(VIRTUAL_DEVICES_ENV, "").strip()
    if not raw:
        return None
    return _parse_count(raw, VIRTUAL_DEVICES_ENV)


def virtual_devices(n: int) -> int:
    """Show `n` CPU devices to the active backend so multi-device code runs without GPUs.

    Call it before building any model (or set KERASMGPU_VIRTUAL_DEVICES=n before the
    process starts). Returns `n`. Raises `TooLateError` if the framework's runtime has
    already started with a different device count.
    """
    global _requested
    n = _parse_count(n, "n")
    with _lock:
        _requested = n
        os.environ[VIRTUAL_DEVICES_ENV] = str(n)
    _apply(n, strict=True)
    return n


def apply_environment_request() -> None:
    """Honour KERASMGPU_VIRTUAL_DEVICES at `import kerasmgpu`, importing no framework."""
    try:
        n = requested()
    except (TypeError, ValueError) as exc:
        warnings.warn(f"kerasmgpu: ignoring {VIRTUAL_DEVICES_ENV}: {exc}", stacklevel=2)
        return
    if n is not None:
        _apply(n, strict=False)


def _apply(n: int, strict: bool) -> None:
    _set_xla_flag(n)
    if versions.is_imported("jax"):
        _apply_jax(n, strict)
    if versions.is_imported("tensorflow"):
        _apply_tf(n, strict)
    else:
        _install_tf_hook()


# --- JAX -----------------------------------------------------------------------------


def without_device_count(flags: str) -> str:
    """XLA_FLAGS less the host device count virtual devices write (the other flags stay)."""
    return re.sub(rf"{_XLA_FLAG}=\d+", "", flags).strip()


def _set_xla_flag(n: int) -> None:
    # Rewritten, not appended: a second call must not leave two counts behind.
    flags = without_device_count(os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} {_XLA_FLAG}={n}".strip()


def _apply_jax(n: int, strict: bool) -> None:
    import jax

    if versions.jax_has_num_cpu_devices_option():
        try:
            jax.config.update("jax_num_cpu_devices", n)
        except RuntimeError as exc:  # the backend already started
            if strict:
                raise _too_late("jax", n, exc) from None
    if strict:
        count = len(jax.devices("cpu"))
        if count != n and not _has_jax_gpu(jax):
            raise _too_late("jax", n, f"JAX already shows {count} CPU device(s)")


def _has_jax_gpu(jax: Any) -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


# --- TensorFlow ----------------------------------------------------------------------


def _apply_tf(n: int, strict: bool) -> None:
    global _tf_applied, _tf_error
    import tensorflow as tf

    if _tf_applied == n:
        return
    try:
        if tf.config.list_physical_devices("GPU"):
            warnings.warn(
                f"kerasmgpu: {n} virtual devices requested but GPUs are visible; "
                "training uses the GPUs.",
                stacklevel=3,
            )
            _tf_applied = n
            return
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
        _tf_applied = n
        _tf_error = None
    except RuntimeError as exc:
        # TF refuses once its runtime is up; it may already have the right layout.
        count = len(tf.config.list_logical_devices("CPU"))
        if count == n:
            _tf_applied = n
            return
        _tf_error = _too_late("tensorflow", n, exc)
        if strict:
            raise _tf_error from None


def _too_late(framework: str, n: int, detail: Any) -> TooLateError:
    return TooLateError(
        f"Invalid call order: virtual_devices({n}) came after {framework} started its "
        f"runtime ({detail}). Allowed: call kerasmgpu.virtual_devices(n) before building "
        f"any model or tensor. Fix: call it at the top of your script, right after "
        f"`import kerasmgpu`, or set {VIRTUAL_DEVICES_ENV}={n} before the process starts."
    )


_hook_installed = False


def _install_tf_hook() -> None:
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True

    def on_import() -> None:
        global _tf_error
        n = requested()
        if n is not None:
            try:
                _apply_tf(n, strict=False)
            except Exception as exc:  # never break the user's `import tensorflow`
                _tf_error = exc

    _hooks.after_import("tensorflow", on_import)


# --- Listing and choosing ----------------------------------------------------------------
# One lister per backend; each engine names its own (`engines.base.Engine.device_lister`).


def tf_devices(n: Optional[int]) -> List[Device]:
    import tensorflow as tf

    if n is not None:
        _apply_tf(n, strict=False)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return [Device("gpu", i, f"/gpu:{i}") for i in range(len(gpus))]
    cpus = tf.config.list_logical_devices("CPU")
    if n is not None and len(cpus) != n:
        raise _tf_error or _too_late("tensorflow", n, f"TensorFlow shows {len(cpus)} CPU device(s)")
    virtual = len(cpus) > 1
    return [Device("cpu", i, f"/cpu:{i}", virtual=virtual) for i in range(len(cpus))]


def jax_devices(n: Optional[int]) -> List[Device]:
    import jax

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if gpus:
        return [Device("gpu", i, f"gpu:{d.id}") for i, d in enumerate(gpus)]
    cpus = jax.devices("cpu")
    if n is not None and len(cpus) != n and jax.process_count() == 1:
        raise _too_late("jax", n, f"JAX shows {len(cpus)} CPU device(s)")
    virtual = len(cpus) > 1
    return [Device("cpu", i, f"cpu:{d.id}", virtual=virtual) for i, d in enumerate(cpus)]


def torch_devices(n: Optional[int]) -> List[Device]:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count:
        return [Device("gpu", i, f"cuda:{i}") for i in range(count)]
    # On torch a virtual device is a gloo process (see `kerasmgpu launch`).
    total = n or 1
    return [Device("cpu", i, f"cpu:{i}", virtual=total > 1) for i in range(total)]


def physical_gpu(index: int) -> Union[int, str]:
    """The physical GPU that visible GPU `index` is (CUDA_VISIBLE_DEVICES' entry)."""
    visible = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if e.strip()]
    return visible[index] if index < len(visible) else index


def default_device_only(selected: Sequence[Device]) -> bool:
    """Whether `selected` is at most the device a framework uses when none is named.

    That is the first one it lists (GPU 0; CPU 0 without GPUs): a model trains there
    as it is, so `gpus=1` and `gpus=[0]` need no engine. Any other single device does
    (`gpus=[3]` must train on GPU 3, not on GPU 0).
    """
    return len(selected) == 0 or (len(selected) == 1 and selected[0].index == 0)


def resolve_gpus(gpus: GpusArg, available: Sequence[Device]) -> Tuple[Device, ...]:
    """Turn `gpus=` into devices, or explain exactly what is wrong with it."""
    names = [str(d) for d in available]
    shown = f"{len(available)} device(s): {names}" if available else "no devices"
    if gpus is None:
        return tuple(available)
    if isinstance(gpus, bool):
        raise bad_type(
            "gpus", gpus, "None (all devices), an int >= 1, or a list of device ids",
            "pass gpus=None to use every device, or a count such as gpus=2",
        )
    if isinstance(gpus, int):
        if gpus < 1:
            raise bad_value(
                "gpus", gpus, f"an int from 1 to {len(available)} ({shown})",
                "pass gpus=None to use every device, or a positive count",
            )
        if gpus > len(available):
            raise bad_value(
                "gpus", gpus, f"at most {len(available)}: this machine shows {shown}",
                "Try reducing `gpus`, or check CUDA_VISIBLE_DEVICES / "
                f"{VIRTUAL_DEVICES_ENV}",
            )
        return tuple(available[:gpus])
    if isinstance(gpus, (list, tuple, range)):
        ids = list(gpus)
        if not ids:
            raise bad_value(
                "gpus", gpus, "a non-empty list of device ids", "pass e.g. gpus=[0, 1]"
            )
        if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise bad_type(
                "gpus", gpus, "a list of integer device ids", "pass e.g. gpus=[0, 1]"
            )
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise bad_value(
                "gpus", gpus, "each device id at most once",
                f"remove the duplicate id(s) {dupes}",
            )
        missing = [i for i in ids if not 0 <= i < len(available)]
        if missing:
            raise bad_value(
                "gpus", gpus,
                f"ids 0 to {len(available) - 1}; expected devices {missing} do not exist, "
                f"available: {names}",
                "Try reducing `gpus` to ids that exist, or check CUDA_VISIBLE_DEVICES",
            )
        return tuple(available[i] for i in ids)
    raise bad_type(
        "gpus", gpus, "None, an int >= 1, or a list of device ids",
        "pass gpus=None, gpus=2 or gpus=[0, 3]",
    )


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity, where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1
