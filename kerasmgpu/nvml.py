"""Per-GPU readings from NVIDIA's management library (NVML), for monitors and `doctor`.

    from kerasmgpu import nvml
    if nvml.available():
        for gpu in nvml.read_gpus():
            print(gpu.index, gpu.name, gpu.utilization_percent, gpu.memory_used_mb)

NVML is what ``nvidia-smi`` reads: it sees every GPU of the machine whatever the
framework does, and it costs about a millisecond a call. The Python binding is the
optional ``nvidia-ml-py`` distribution (module ``pynvml``, the ``tools`` extra); it is
imported inside functions so that ``import kerasmgpu.nvml`` works, and imports nothing,
on machines without it.

Indices follow the framework, not the driver: when ``CUDA_VISIBLE_DEVICES`` lists
integer ids, only those GPUs are read, in that order, and ``index`` is the position
in that list (what TensorFlow calls ``/gpu:0``, JAX ``cuda:0``, PyTorch ``cuda:0``)
while ``physical_index`` keeps NVML's own id (what ``nvidia-smi`` shows).
"""

from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "GpuReading",
    "NvmlUnavailable",
    "available",
    "driver_version",
    "read_gpus",
    "reset",
    "summary",
]

NOT_INSTALLED = "nvidia-ml-py is not installed: pip install nvidia-ml-py"
NO_GPU = "no NVIDIA GPU"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
_BYTES_PER_MB = 1024.0 * 1024.0  # MiB, as nvidia-smi reports them


class NvmlUnavailable(RuntimeError):
    """NVML cannot give readings here; ``reason`` says why in one line, with the fix."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment.

    ``index`` is the framework's index (position in ``CUDA_VISIBLE_DEVICES``);
    ``physical_index`` is NVML's / nvidia-smi's (left out: the same as ``index``).
    Memory is in MiB. Temperature and power are None where the board does not report
    them (some datacenter and MIG configurations).
    """

    index: int
    name: str
    utilization_percent: float
    memory_used_mb: float
    memory_total_mb: float
    temperature_c: Optional[float] = None
    power_w: Optional[float] = None
    physical_index: int = -1

    def __post_init__(self) -> None:
        # -1 means "same as index": hand-built readings (tests, fake readers) stay short
        # while NVML readings always carry both.
        if self.physical_index < 0:
            object.__setattr__(self, "physical_index", self.index)


# --- One lazy, thread-safe NVML initialisation ------------------------------------
# nvmlInit is reference counted and costs tens of milliseconds; the monitor reads from a
# background thread while `doctor` may read from the main one, so initialise once under
# a lock and remember a failure too (a driver does not appear in a running process).
_lock = threading.Lock()
_module: Optional[Any] = None
_failure: Optional[str] = None


def _nvml() -> Any:
    """The initialised ``pynvml`` module, or NvmlUnavailable with the reason."""
    global _module, _failure
    with _lock:
        if _module is not None:
            return _module
        if _failure is not None:
            raise NvmlUnavailable(_failure)
        try:
            module = importlib.import_module("pynvml")
        except ImportError:
            _failure = NOT_INSTALLED
            raise NvmlUnavailable(_failure) from None
        try:
            module.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            _failure = f"no NVIDIA driver (NVML init failed: {_text(exc)})"
            raise NvmlUnavailable(_failure) from None
        _module = module
        return module


def reset() -> None:
    """Forget the cached NVML state (shutting NVML down if it was started).

    For tests that swap the ``pynvml`` module, and for long-lived processes that want
    to retry after a driver was installed.
    """
    global _module, _failure
    with _lock:
        module, _module, _failure = _module, None, None
    if module is not None:
        try:
            module.nvmlShutdown()
        except Exception:  # a failed shutdown leaves nothing for us to undo
            pass


def _text(value: Any) -> str:
    # nvidia-ml-py < 11.515 returned bytes for names and versions; newer ones return str.
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _visible_physical_ids(count: int) -> Optional[List[int]]:
    """Physical ids CUDA will expose, in order; None where the variable does not say.

    Follows CUDA's own parsing: entries are read up to the first invalid one (negative,
    out of range or repeated), so "-1" and "" hide every GPU and "0,-1,1" shows only 0.
    UUID and MIG entries ("GPU-...", "MIG-...") are not resolved here: None, all GPUs.
    """
    raw = os.environ.get(CUDA_VISIBLE_DEVICES)
    if raw is None:
        return None
    entries = [part.strip() for part in raw.split(",")]
    if entries and entries[0] and not _is_int(entries[0]):
        return None
    ids: List[int] = []
    for entry in entries:
        if not _is_int(entry):
            break
        value = int(entry)
        if value < 0 or value >= count or value in ids:
            break
        ids.append(value)
    return ids


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _handles(nvml: Any) -> List[Tuple[int, int, Any]]:
    """(visible index, physical index, handle) for every GPU the framework sees."""
    count = int(nvml.nvmlDeviceGetCount())
    if count <= 0:
        raise NvmlUnavailable(NO_GPU)
    physical = _visible_physical_ids(count)
    if physical is None:
        physical = list(range(count))
    if not physical:
        raise NvmlUnavailable(
            f"{NO_GPU} visible: {CUDA_VISIBLE_DEVICES}={os.environ.get(CUDA_VISIBLE_DEVICES)!r} "
            f"hides all {count}"
        )
    return [(i, p, nvml.nvmlDeviceGetHandleByIndex(p)) for i, p in enumerate(physical)]


def _optional(read: Any, *args: Any) -> Optional[float]:
    # Temperature and power are NOT_SUPPORTED on some boards and under MIG; a missing
    # optional figure must not cost the whole reading.
    try:
        return float(read(*args))
    except Exception:
        return None


def read_gpus() -> List[GpuReading]:
    """Read every visible GPU now; NvmlUnavailable when there is nothing to read.

    Raises NvmlUnavailable (not installed, no driver, no GPU); an NVML error on a
    required figure (utilization, memory) propagates as pynvml's own NVMLError.
    """
    nvml = _nvml()
    readings = []
    for index, physical, handle in _handles(nvml):
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
        temperature_sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        power_mw = _optional(nvml.nvmlDeviceGetPowerUsage, handle)
        readings.append(
            GpuReading(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                utilization_percent=float(utilization.gpu),
                memory_used_mb=float(memory.used) / _BYTES_PER_MB,
                memory_total_mb=float(memory.total) / _BYTES_PER_MB,
                temperature_c=_optional(nvml.nvmlDeviceGetTemperature, handle, temperature_sensor),
                power_w=None if power_mw is None else power_mw / 1000.0,  # NVML: milliwatts
                physical_index=physical,
            )
        )
    return readings


def available() -> bool:
    """True when pynvml imports, NVML starts, and at least one GPU is visible."""
    try:
        nvml = _nvml()
        return bool(_handles(nvml))
    except Exception:
        return False


def driver_version() -> str:
    """The NVIDIA driver version, e.g. "550.54.15"; NvmlUnavailable when there is none."""
    return _text(_nvml().nvmlSystemGetDriverVersion())


def summary() -> Dict[str, Any]:
    """What `kerasmgpu doctor` prints about GPUs; never raises.

    Keys: ``available`` (bool), ``reason`` (why not, or None), ``driver`` (str or
    None), ``cuda_visible_devices`` (the variable, or None) and ``devices``: one dict
    per visible GPU with ``index``, ``physical_index``, ``name``, ``memory_total_mb``
    and ``memory_used_mb``.
    """
    result: Dict[str, Any] = {
        "available": False,
        "reason": None,
        "driver": None,
        "cuda_visible_devices": os.environ.get(CUDA_VISIBLE_DEVICES),
        "devices": [],
    }
    try:
        result["driver"] = driver_version()
        gpus = read_gpus()
    except NvmlUnavailable as exc:
        result["reason"] = exc.reason
        return result
    except Exception as exc:  # an NVML error on one board must not break `doctor`
        result["reason"] = f"NVML read failed: {_text(exc)}"
        return result
    result["available"] = True
    result["devices"] = [
        {
            "index": gpu.index,
            "physical_index": gpu.physical_index,
            "name": gpu.name,
            "memory_total_mb": round(gpu.memory_total_mb, 1),
            "memory_used_mb": round(gpu.memory_used_mb, 1),
        }
        for gpu in gpus
    ]
    return result
