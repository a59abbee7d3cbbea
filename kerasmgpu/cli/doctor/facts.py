"""The doctor's facts: the `Facts` record, and `collect()`, which fills it from the
running machine (versions, variables, devices - it starts the framework -, NVML)."""

from __future__ import annotations

import os
import platform
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from kerasmgpu.cli import _common
from kerasmgpu.env.versions import VIRTUAL_DEVICES_ENV, KerasLine

WATCHED = (
    "CUDA_VISIBLE_DEVICES",
    VIRTUAL_DEVICES_ENV,
    "TF_USE_LEGACY_KERAS",
    "KERAS_BACKEND",
    "XLA_FLAGS",
    "TF_CONFIG",
    _common.LAUNCHED_ENV,
)


@dataclass(frozen=True)
class Facts:
    """Everything the findings depend on, as plain data (tests build their own).

    Versions are strings ("2.15.1") or None when not installed; `devices` is None when
    they could not be listed, else dicts with name, kind, index, virtual, memory_mb.
    """

    keras_line: str = KerasLine.NONE.value
    keras_version: Optional[str] = None  # the active line's version
    backend: str = ""
    keras: Optional[str] = None  # the `keras` distribution, whatever line is active
    tensorflow: Optional[str] = None
    tf_keras: Optional[str] = None
    jax: Optional[str] = None
    torch: Optional[str] = None
    python: str = field(default_factory=platform.python_version)
    platform: str = sys.platform
    variables: Mapping[str, str] = field(default_factory=dict)
    launched: bool = False
    process_index: int = 0
    process_count: int = 1
    cluster: str = "single process"  # kerasmgpu.env.cluster's description of the job
    cluster_error: Optional[str] = None
    route: Optional[str] = None
    route_error: Optional[str] = None
    virtual_error: Optional[str] = None
    # `doctor --virtual N`: N virtual devices asked for on the command line (as `demo`
    # and `bench` ask for them), not by KERASMGPU_VIRTUAL_DEVICES.
    virtual_flag: Optional[int] = None
    devices: Optional[Tuple[Mapping[str, Any], ...]] = None
    devices_error: Optional[str] = None
    devices_error_is_import: bool = False
    keras_import_error: Optional[str] = None
    description: Mapping[str, str] = field(default_factory=dict)
    nvml: Mapping[str, Any] = field(default_factory=dict)
    warnings: Tuple[str, ...] = ()
    internal_errors: Tuple[str, ...] = ()

    @property
    def multi_process(self) -> bool:
        """A process among several (any launcher): the processes are the replicas."""
        return self.launched and self.process_count > 1


# --- gathering the facts ----------------------------------------------------------------


def _device_dict(device: Any) -> Dict[str, Any]:
    return {"name": str(device.name), "kind": str(device.kind), "index": int(device.index),
            "virtual": bool(device.virtual), "memory_mb": device.memory_mb}


def _nvidia_driver_present() -> bool:
    """Whether an NVIDIA GPU could be here: its kernel driver is loaded (Linux)."""
    return os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidiactl")


def nvml_reason(reason: Optional[str], driver_present: bool) -> Optional[str]:
    """Why NVML is unavailable, with the install hint only where a GPU could be: on a
    machine without NVIDIA's driver, nvidia-ml-py would have nothing to read."""
    from kerasmgpu import nvml

    if reason == nvml.NOT_INSTALLED and not driver_present:
        return "no NVIDIA driver on this machine (nvidia-ml-py, which reads GPUs, is not needed)"
    return reason


def _nvml_facts() -> Dict[str, Any]:
    from kerasmgpu import nvml

    summary = dict(nvml.summary())
    summary["reason"] = nvml_reason(summary.get("reason"), _nvidia_driver_present())
    if summary.get("available"):
        try:
            busy = {g.index: g.utilization_percent for g in nvml.read_gpus()}
        except Exception:  # the summary stands without utilization
            busy = {}
        summary["devices"] = [dict(d, utilization_percent=busy.get(d.get("index")))
                              for d in summary.get("devices", [])]
    return summary


def collect(verbose: bool = False, virtual_flag: Optional[int] = None,
            variables: Optional[Mapping[str, str]] = None) -> Facts:
    """Read the machine: versions, variables, devices (starts the framework), NVML.

    `variables`: the watched variables as the user set them, read before `--virtual`
    wrote its own (default: the environment now). Unless `verbose`, the framework's
    start-up log lines are dropped.
    """
    from kerasmgpu import registry
    from kerasmgpu.env import cluster, versions

    internal: List[str] = []
    values: Dict[str, Any] = {}
    active: Optional[registry.Active] = None
    try:
        active = registry.active()
        line, version, backend = active.line, active.version, active.backend
    except Exception as exc:
        internal.append(f"detecting Keras: {type(exc).__name__}: {exc}")
        line, version, backend = KerasLine.NONE, None, ""
    values.update(
        keras_line=line.value, keras_version=str(version) if version else None,
        backend=backend,
        keras=_dist("keras"), tensorflow=_str(versions.tensorflow_version()),
        tf_keras=_dist("tf-keras"), jax=_dist("jax"), torch=_dist("torch"),
        variables=dict(variables) if variables is not None else user_variables(),
    )
    try:
        job = cluster.job()
        values.update(launched=_common.started_by_launcher(), process_index=job.global_rank(),
                      process_count=job.world_size(), cluster=job.describe())
    except ValueError as exc:  # contradictory launcher variables
        values["cluster_error"] = str(exc)
    try:
        from kerasmgpu.env import devices as devices_module

        devices_module.requested()
    except (TypeError, ValueError) as exc:
        values["virtual_error"] = str(exc)
    entry = None
    if active is not None and line is not KerasLine.NONE:
        try:
            entry = active.entry_or_raise()
            values["route"] = entry.route.value
        except ValueError as exc:
            values["route_error"] = str(exc)
    caught: List[warnings.WarningMessage] = []
    if active is not None and entry is not None and "virtual_error" not in values:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _common.framework_output_filtered(verbose):
                values.update(_start_framework(active))
    values["warnings"] = tuple(
        sorted({str(w.message) for w in caught if str(w.message).startswith("kerasmgpu")})
    )
    try:
        values["nvml"] = _nvml_facts()
    except Exception as exc:  # nvml.summary() does not raise; this is belt and braces
        internal.append(f"reading NVML: {type(exc).__name__}: {exc}")
    values["internal_errors"] = tuple(internal)
    values["virtual_flag"] = virtual_flag
    return Facts(**values)


def _start_framework(active: Any) -> Dict[str, Any]:
    """List devices, import Keras and describe the route, each failure kept as a fact."""
    from kerasmgpu import adapters, api, engines

    values: Dict[str, Any] = {}
    try:
        engine = engines.load(active.entry_or_raise())
        values["devices"] = tuple(_device_dict(d) for d in engine.list_devices())
    except Exception as exc:
        values["devices_error"] = f"{type(exc).__name__}: {exc}"
        values["devices_error_is_import"] = isinstance(exc, ImportError)
        return values
    try:
        adapters.load(active)
    except Exception as exc:
        values["keras_import_error"] = f"{type(exc).__name__}: {exc}"
        return values
    values["description"] = dict(api.describe())  # never raises: {"error": ...} instead
    return values


def _dist(name: str) -> Optional[str]:
    from kerasmgpu.env.versions import dist_version

    return _str(dist_version(name))


def _str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def user_variables() -> Dict[str, str]:
    """The watched variables set in this process's environment now."""
    return {k: os.environ[k] for k in WATCHED if k in os.environ}
