"""`kerasmgpu doctor`: what kerasmgpu sees, the route it would take, and what to fix.

    kerasmgpu doctor                # readable report
    kerasmgpu doctor --json         # one JSON object on stdout (schema below)
    kerasmgpu doctor --virtual 2    # without GPUs: 2 virtual CPU devices, as demo and bench
    kerasmgpu doctor --verbose      # also the frameworks' own start-up log lines

It shows the Keras line and backend, the versions of Python, Keras, TensorFlow,
tf_keras, JAX and PyTorch, the devices as the framework lists them, what NVIDIA's
management library (NVML) sees (driver, each GPU's name, memory and utilization),
CUDA_VISIBLE_DEVICES and KERASMGPU_VIRTUAL_DEVICES, the route `parallelize()` would
take, the all-reduce it would use and why - then findings, each with a severity
(info, warning, blocking) and advice.

Exit status: 0 when multi-device training can run here (at least 2 devices, real or
virtual, and no blocking finding), 1 otherwise. The doctor never ends in a traceback:
an unexpected error becomes a blocking finding with code `internal_error`.

The findings are computed by a pure function, `findings(Facts)`, from a `Facts` record
that `collect()` fills from the running machine; tests pass made-up `Facts`.

JSON schema (every key is always present - but XLA_FLAGS, listed for the JAX backend
only; unknown values are null):

    {
      "kerasmgpu": "0.1.0",
      "environment": {
        "keras_line": "keras 3" | "tf.keras 2.x" | "tf_keras" | "keras<=2.3" | "none",
        "keras_version": str | null,           # the active line's version
        "backend": str,                         # "" without Keras
        "python": str, "keras": str | null, "tensorflow": str | null,
        "tf_keras": str | null, "jax": str | null, "torch": str | null,
        "platform": str,                        # sys.platform
        "variables": {"CUDA_VISIBLE_DEVICES": str | null,
                      "KERASMGPU_VIRTUAL_DEVICES": str | null,
                      "TF_USE_LEGACY_KERAS": str | null, "KERAS_BACKEND": str | null,
                      "XLA_FLAGS": str | null,    # the JAX backend only (its devices)
                      "TF_CONFIG": str | null, "KERASMGPU_LAUNCHED": str | null},
        "launched": bool, "process_index": int, "process_count": int,
        "cluster": str                          # the launcher detected, in words
      },
      "devices": [{"name": str, "kind": "gpu" | "cpu" | "tpu", "index": int,
                   "virtual": bool, "memory_mb": int | null}],   # [] if not listed
      "nvml": {"available": bool, "reason": str | null, "driver": str | null,
               "cuda_visible_devices": str | null,
               "devices": [{"index", "physical_index", "name", "memory_total_mb",
                            "memory_used_mb", "utilization_percent"}]},
      "route": {"route": str | null, "engine": str | null, "replicas": int,
                "devices": [str], "all_reduce": str | null, "why": str,
                "error": str | null},
      "findings": [{"severity": "info" | "warning" | "blocking", "code": str,
                    "message": str, "advice": str}],
      "ok": bool
    }

Finding codes: internal_error, no_keras, keras_import_failed, framework_import_failed,
device_listing_failed, bad_virtual_devices, backend_cannot_train, keras_too_old,
keras3_with_old_tensorflow, tf_keras_mismatch, tf_keras_without_tensorflow,
keras_tensorflow_mismatch, tf_keras_not_selected, torch_outside_launch, launched,
launcher_variables,
no_gpu, one_gpu, gpus_invisible_to_framework, virtual_devices_ignored,
route_unavailable, kerasmgpu_warning.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.version import InvalidVersion, Version

from kerasmgpu import engines, registry
from kerasmgpu._version import __version__
from kerasmgpu.cli import _common
from kerasmgpu.env.versions import (
    TF_SPLIT_KERAS,
    TF_WITH_KERAS_3,
    VIRTUAL_DEVICES_ENV,
    KerasLine,
    _truthy,
    variable_applies,
)
from kerasmgpu.registry import Route

INFO, WARNING, BLOCKING = "info", "warning", "blocking"
SEVERITIES = (INFO, WARNING, BLOCKING)

WATCHED = (
    "CUDA_VISIBLE_DEVICES",
    VIRTUAL_DEVICES_ENV,
    "TF_USE_LEGACY_KERAS",
    "KERAS_BACKEND",
    "XLA_FLAGS",
    "TF_CONFIG",
    _common.LAUNCHED_ENV,
)

INSTALL = {
    "tensorflow": 'pip install "tensorflow[and-cuda]" (GPUs) or pip install tensorflow',
    "jax": 'pip install "jax[cuda12]" (GPUs) or pip install "jax[cpu]"',
    "torch": "pip install torch (the CUDA build from pytorch.org for GPUs)",
}


@dataclass(frozen=True)
class Finding:
    """One thing the doctor noticed: how serious, a stable code, what, and what to do."""

    severity: str
    code: str
    message: str
    advice: str

    def as_dict(self) -> Dict[str, str]:
        return {"severity": self.severity, "code": self.code, "message": self.message,
                "advice": self.advice}


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


# --- pure logic -----------------------------------------------------------------------


def _version(text: Optional[str]) -> Optional[Version]:
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _major_minor(version: Version) -> Tuple[int, int]:
    return version.major, version.minor


def _gpus(facts: Facts) -> List[Mapping[str, Any]]:
    return [d for d in facts.devices or () if d.get("kind") == "gpu"]


def _nvml_gpus(facts: Facts) -> List[Mapping[str, Any]]:
    if not facts.nvml.get("available"):
        return []
    return list(facts.nvml.get("devices") or [])


def _framework(facts: Facts) -> str:
    """The package that starts the devices for this line ("tensorflow", "jax", ...)."""
    if facts.keras_line == KerasLine.KERAS_3:
        return facts.backend or "tensorflow"
    return "tensorflow"


def device_count(facts: Facts) -> int:
    """Replicas parallelize() could run: this process's devices, times the processes."""
    local = len(facts.devices or ())
    if facts.multi_process:
        return max(local, 1) * facts.process_count
    return local


def _below_verified_floor(facts: Facts) -> Optional[Finding]:
    """The active release below the first one its registry entry is verified on (the
    floor of its line on its backend: Keras 3 on TensorFlow's is not Keras 3 on JAX's)."""
    line_version = _version(facts.keras_version)
    try:
        line = KerasLine(facts.keras_line)
    except ValueError:
        return None
    entry = registry.find(line, facts.backend or None)
    if line_version is None or entry is None:
        return None
    floor = entry.verified[0]
    if Version(line_version.base_version) >= floor:
        return None
    on = f" on {entry.backend}" if line is KerasLine.KERAS_3 else ""
    older = (" (for older tf.keras code, Keras 2.3 and `kerasmgpu migrate` also work)"
             if line in (KerasLine.TF_KERAS, KerasLine.TF_KERAS_LEGACY) else "")
    return Finding(
        BLOCKING, "keras_too_old",
        f"{line.value} {line_version}{on} is older than {floor}, the oldest release "
        f"kerasmgpu is verified on there.",
        f'pip install "{entry.dist}>={floor}"{older}')


def _version_findings(facts: Facts) -> List[Finding]:
    out: List[Finding] = []
    line = facts.keras_line
    tf, keras, tf_keras = (_version(facts.tensorflow), _version(facts.keras),
                           _version(facts.tf_keras))
    legacy_requested = _truthy(facts.variables.get("TF_USE_LEGACY_KERAS"))
    uses_tf = _framework(facts) == "tensorflow"
    if keras is not None and keras.major >= 3 and tf is not None and tf < TF_WITH_KERAS_3:
        blocking = line == KerasLine.KERAS_3 and uses_tf
        out.append(Finding(
            BLOCKING if blocking else WARNING, "keras3_with_old_tensorflow",
            f"Keras {keras} (Keras 3) is installed with TensorFlow {tf}: TensorFlow before "
            f"{TF_WITH_KERAS_3} expects Keras 2 as tf.keras, so tf.keras and Keras 3's "
            "TensorFlow backend break each other."
            + ("" if blocking else " Your backend is not TensorFlow, but tf.keras is broken."),
            f'either pip install "tensorflow>={TF_WITH_KERAS_3}" (Keras 3 becomes tf.keras), '
            f'or pip install "keras=={tf.major}.{tf.minor}.*" to stay on Keras 2',
        ))
    if tf_keras is not None:
        if tf is None and line == KerasLine.TF_KERAS_LEGACY:
            out.append(Finding(
                BLOCKING, "tf_keras_without_tensorflow",
                f"tf_keras {tf_keras} is selected (TF_USE_LEGACY_KERAS=1) but TensorFlow "
                "is not installed.",
                f'pip install "tensorflow=={tf_keras.major}.{tf_keras.minor}.*"',
            ))
        elif tf is not None and _major_minor(tf_keras) != _major_minor(tf):
            blocking = line == KerasLine.TF_KERAS_LEGACY
            out.append(Finding(
                BLOCKING if blocking else WARNING, "tf_keras_mismatch",
                f"tf_keras {tf_keras} does not match TensorFlow {tf}: tf_keras must have "
                "TensorFlow's major.minor version."
                + ("" if blocking else " (Unused now; it breaks once TF_USE_LEGACY_KERAS=1.)"),
                f'pip install "tf_keras=={tf.major}.{tf.minor}.*"',
            ))
        if tf is not None and tf >= TF_WITH_KERAS_3 and not legacy_requested:
            out.append(Finding(
                INFO, "tf_keras_not_selected",
                f"tf_keras {tf_keras} is installed but TF_USE_LEGACY_KERAS is not set: with "
                f"TensorFlow {tf}, tf.keras is Keras 3.",
                "set TF_USE_LEGACY_KERAS=1 to use tf_keras (Keras 2); leave it unset to "
                "stay on Keras 3",
            ))
    if (line == KerasLine.TF_KERAS and keras is not None and keras.major == 2 and tf is not None
            and tf >= TF_SPLIT_KERAS and _major_minor(keras) != _major_minor(tf)):
        out.append(Finding(
            BLOCKING, "keras_tensorflow_mismatch",
            f"keras {keras} does not match TensorFlow {tf}: since TensorFlow "
            f"{TF_SPLIT_KERAS}, tf.keras is the `keras` package of the same major.minor.",
            f'pip install "keras=={tf.major}.{tf.minor}.*"',
        ))
    torch_note = _common.untested_torch(facts.torch) if facts.backend == "torch" else None
    if torch_note:
        text, fix = torch_note.split(" Fix: ", 1)
        out.append(Finding(WARNING, "torch_untested", text, fix))
    too_old = _below_verified_floor(facts)
    if too_old is not None:
        out.append(too_old)
    return out


def _device_findings(facts: Facts) -> List[Finding]:
    out: List[Finding] = []
    if facts.devices is None:
        return out
    gpus = _gpus(facts)
    nvml_gpus = _nvml_gpus(facts)
    count = len(facts.devices)
    cuda = facts.variables.get("CUDA_VISIBLE_DEVICES")
    cuda_text = (f"CUDA_VISIBLE_DEVICES={cuda!r}" if cuda is not None
                 else "CUDA_VISIBLE_DEVICES (unset)")
    virtual = facts.variables.get(VIRTUAL_DEVICES_ENV)
    source = (f"--virtual {facts.virtual_flag}" if facts.virtual_flag
              else f"{VIRTUAL_DEVICES_ENV}={virtual}")
    framework = _framework(facts)
    if not gpus:
        if nvml_gpus:
            names = ", ".join(sorted({str(g.get("name")) for g in nvml_gpus}))
            out.append(Finding(
                WARNING, "gpus_invisible_to_framework",
                f"NVML sees {len(nvml_gpus)} GPU(s) ({names}) but {framework} lists none: "
                f"this {framework} build has no CUDA support or cannot load the CUDA "
                "libraries.",
                INSTALL.get(framework, "install the framework's CUDA build")
                + f"; then check `{cuda_text}`",
            ))
        if count >= 2 and all(d.get("virtual") for d in facts.devices):
            out.append(Finding(
                INFO, "no_gpu",
                f"no GPU: {count} virtual CPU devices stand in ({source}), so "
                "multi-device code runs here, but they share the CPU cores: no speed-up.",
                "use a machine with GPUs for speed; keep this set to test multi-device code",
            ))
        elif facts.multi_process:
            out.append(Finding(
                INFO, "no_gpu",
                f"no GPU: each of the {facts.process_count} processes trains on the CPU.",
                "use a machine with GPUs for speed",
            ))
        else:
            out.append(Finding(
                WARNING, "no_gpu",
                "no GPU visible and no virtual devices: one CPU device, nothing to parallelize. "
                f"(`kerasmgpu demo` and `kerasmgpu bench` run here anyway: without GPUs they "
                f"split the CPU into {_common.DEFAULT_VIRTUAL} virtual devices by themselves.)",
                f"run `kerasmgpu doctor --virtual {_common.DEFAULT_VIRTUAL}` to check the setup "
                f"demo and bench use; for your own scripts, {_common.virtual_hint()} "
                f"multi-device code on the CPU (e.g. {VIRTUAL_DEVICES_ENV}="
                f"{_common.DEFAULT_VIRTUAL}); on a GPU machine, check `nvidia-smi` and {cuda_text}",
            ))
    elif len(gpus) == 1 and not facts.multi_process:
        out.append(Finding(
            WARNING, "one_gpu",
            f"only one GPU is visible ({gpus[0].get('name')}): nothing to parallelize, "
            "parallelize() returns the model unchanged.",
            f"check {cuda_text}"
            + (f" (NVML sees {len(nvml_gpus)} GPU(s))" if len(nvml_gpus) > 1 else "")
            + " and `nvidia-smi -L`",
        ))
    if gpus and (virtual or facts.virtual_flag):
        out.append(Finding(
            INFO, "virtual_devices_ignored",
            f"{source} asks for virtual devices but GPUs are visible: the GPUs are used.",
            "drop --virtual to silence this" if facts.virtual_flag
            else f"unset {VIRTUAL_DEVICES_ENV} to silence this",
        ))
    return out


def findings(facts: Facts) -> List[Finding]:
    """What is wrong or worth knowing, most serious first. Pure: reads only `facts`."""
    out = _install_findings(facts) + _start_findings(facts) + _process_findings(facts)
    out.extend(_device_findings(facts))
    route_error = facts.description.get("error")
    if route_error and not _torch_outside(facts) and not facts.devices_error and (
            not facts.keras_import_error):
        out.append(Finding(
            BLOCKING, "route_unavailable",
            f"parallelize() cannot build its route here: {route_error}",
            "fix the findings above; if none applies, report this with "
            "`kerasmgpu doctor --json`",
        ))
    for text in facts.warnings:
        out.append(Finding(INFO, "kerasmgpu_warning", text, "see the message"))
    rank = {BLOCKING: 0, WARNING: 1, INFO: 2}
    return sorted(out, key=lambda f: rank.get(f.severity, 3))


def _install_findings(facts: Facts) -> List[Finding]:
    """What is installed and asked for: Keras, versions, virtual devices, the backend."""
    out: List[Finding] = []
    for error in facts.internal_errors:
        out.append(Finding(
            BLOCKING, "internal_error", f"the doctor itself failed: {error}",
            "please report this with the output of `kerasmgpu doctor --json`",
        ))
    if facts.keras_line == KerasLine.NONE:
        out.append(Finding(
            BLOCKING, "no_keras", "no Keras is installed (nor TensorFlow's tf.keras).",
            # Framework packages by name: the kerasmgpu[...] extras resolve only once
            # kerasmgpu is on the package index.
            'install one: pip install tensorflow (tf.keras; Keras 3 on TensorFlow), '
            'pip install keras "jax[cpu]" or pip install keras torch',
        ))
    out.extend(_version_findings(facts))
    if facts.virtual_error:
        out.append(Finding(
            BLOCKING, "bad_virtual_devices", facts.virtual_error,
            f"set {VIRTUAL_DEVICES_ENV} to an integer >= 1, or unset it",
        ))
    if facts.route_error and facts.keras_line != KerasLine.NONE:
        out.append(Finding(
            BLOCKING, "backend_cannot_train", facts.route_error,
            "set KERAS_BACKEND=tensorflow, jax or torch",
        ))
    return out


def _backend_hint(facts: Facts) -> Optional[str]:
    """Keras 3 takes TensorFlow when KERAS_BACKEND is unset: where TensorFlow is missing
    and jax or torch is installed, setting the variable is the fix, not installing it."""
    if (facts.keras_line != KerasLine.KERAS_3.value or facts.backend != "tensorflow"
            or facts.tensorflow or facts.variables.get("KERAS_BACKEND")):
        return None
    found = [name for name in ("jax", "torch") if getattr(facts, name)]
    if not found:
        return None
    return (f"KERAS_BACKEND is not set, so Keras 3 takes TensorFlow, which is not "
            f"installed; {' and '.join(found)} is: export KERAS_BACKEND={found[0]}")


def _start_findings(facts: Facts) -> List[Finding]:
    """Whether the framework and Keras started (imported, listed their devices)."""
    out: List[Finding] = []
    framework = _framework(facts)
    hint = _backend_hint(facts)
    if facts.devices_error and facts.devices_error_is_import:
        out.append(Finding(
            BLOCKING, "framework_import_failed",
            f"{framework} failed to import: {facts.devices_error}",
            hint or (f"check the install with `python -c \"import {framework}\"`; "
                     f"{INSTALL.get(framework, '')}"),
        ))
    elif facts.devices_error:
        out.append(Finding(
            BLOCKING, "device_listing_failed",
            f"{framework} could not list its devices: {facts.devices_error}",
            f"run `python -c \"import {framework}\"` to see the framework's own error; "
            f"with virtual devices, set {VIRTUAL_DEVICES_ENV} before the process starts",
        ))
    if facts.keras_import_error:
        out.append(Finding(
            BLOCKING, "keras_import_failed",
            f"{facts.keras_line} failed to import: {facts.keras_import_error}",
            "reinstall Keras and its framework with matching versions "
            '(e.g. pip install -U tensorflow)',
        ))
    return out


def _torch_outside(facts: Facts) -> bool:
    """A route whose replicas are processes (torch), in a process no launcher started."""
    return _common.needs_launcher(facts.route) and not facts.launched


def _process_findings(facts: Facts) -> List[Finding]:
    """Whether this process is one of several, and what its launcher said."""
    out: List[Finding] = []
    if _torch_outside(facts):
        out.append(Finding(
            WARNING, "torch_outside_launch",
            "the torch backend trains one process per device, and this process is not "
            "one of several (no kerasmgpu launch, torchrun, mpirun or srun detected): "
            "parallelize() cannot spread a model here.",
            "run your script with `kerasmgpu launch --nproc N your_script.py` (or "
            "torchrun, mpirun, srun)",
        ))
    if facts.cluster_error:
        out.append(Finding(
            BLOCKING, "launcher_variables",
            f"the launcher's variables contradict each other: {facts.cluster_error}",
            "check what your launcher sets (see the variables above)",
        ))
    if facts.multi_process:
        out.append(Finding(
            INFO, "launched",
            f"process {facts.process_index} of {facts.process_count}, started by "
            f"{facts.cluster.split(':', 1)[0]} ({facts.cluster}).",
            "each process reports its own devices; replicas = processes x devices",
        ))
    return out


def can_train(facts: Facts, found: Sequence[Finding]) -> bool:
    """Multi-device training can run: >= 2 devices, nothing blocking, and a route that
    builds (its error is printed under the route: an OK below it would contradict it)."""
    return (device_count(facts) >= 2 and not facts.description.get("error")
            and not any(f.severity == BLOCKING for f in found))


def route_info(facts: Facts) -> Dict[str, Any]:
    """The route, engine and all-reduce parallelize() would use, and why. Pure."""
    desc = dict(facts.description)
    route = facts.route
    gpus = len(_gpus(facts))
    multi_process = facts.multi_process
    names = [str(d.get("name")) for d in facts.devices or ()]
    engine: Optional[str] = None
    all_reduce: Optional[str] = None
    reported_class = False
    if route:  # the engine explains itself (its module imports no framework)
        cls = engines.load_route(Route(route))
        told = cls.explain(gpus, multi_process, facts.platform)
        engine, all_reduce, why = told.engine, told.all_reduce, told.why
        reported_class = cls.reports_all_reduce_class
    elif facts.keras_line == KerasLine.NONE:
        why = "no Keras is installed."
    else:
        why = facts.route_error or "no route for this Keras line and backend."
    if str(desc.get("route", "")).startswith("none"):
        why += " With one device, parallelize() returns the model unchanged."
    if desc.get("all_reduce"):
        # What the engine itself reports beats the prediction; TensorFlow reports a class
        # name (CollectiveAllReduce), so the prediction stays beside it as the reading.
        reported = str(desc["all_reduce"])
        all_reduce = f"{reported} - {all_reduce}" if reported_class and all_reduce else (
            reported)
    try:
        replicas = int(desc.get("replicas") or 0) or device_count(facts)
    except ValueError:
        replicas = device_count(facts)
    return {
        "route": route,
        "engine": desc.get("engine") or engine,
        "replicas": replicas,
        "devices": names,
        "all_reduce": all_reduce,
        "why": why,
        "error": desc.get("error"),
    }


def build_report(facts: Facts) -> Dict[str, Any]:
    """The doctor's JSON object (schema in the module docstring). Pure."""
    found = findings(facts)
    return {
        "kerasmgpu": __version__,
        "environment": {
            "keras_line": facts.keras_line,
            "keras_version": facts.keras_version,
            "backend": facts.backend,
            "python": facts.python,
            "keras": facts.keras,
            "tensorflow": facts.tensorflow,
            "tf_keras": facts.tf_keras,
            "jax": facts.jax,
            "torch": facts.torch,
            "platform": facts.platform,
            "variables": {name: facts.variables.get(name) for name in WATCHED
                          if variable_applies(name, facts.backend)},
            "launched": facts.launched,
            "process_index": facts.process_index,
            "process_count": facts.process_count,
            "cluster": facts.cluster,
        },
        "devices": [
            {"name": str(d.get("name")), "kind": str(d.get("kind")),
             "index": int(d.get("index") or 0), "virtual": bool(d.get("virtual")),
             "memory_mb": d.get("memory_mb")}
            for d in facts.devices or ()
        ],
        "nvml": {
            "available": bool(facts.nvml.get("available")),
            "reason": facts.nvml.get("reason"),
            "driver": facts.nvml.get("driver"),
            "cuda_visible_devices": facts.nvml.get("cuda_visible_devices"),
            "devices": list(facts.nvml.get("devices") or []),
        },
        "route": route_info(facts),
        "findings": [f.as_dict() for f in found],
        "ok": can_train(facts, found),
    }


def render(report: Mapping[str, Any]) -> str:
    """The readable report from `build_report`'s object."""
    env = report["environment"]
    lines = [f"kerasmgpu doctor (kerasmgpu {report['kerasmgpu']})", "", "Environment"]
    line = env["keras_line"]
    version = f" {env['keras_version']}" if env["keras_version"] else ""
    backend = f", backend {env['backend']}" if env["backend"] else ""
    lines.append(f"  Keras line   : {line}{version}{backend}")
    for key in ("python", "keras", "tensorflow", "tf_keras", "jax", "torch"):
        lines.append(f"  {key:<13}: {env[key] or '-'}")
    for key, value in env["variables"].items():
        if value is not None or key in ("CUDA_VISIBLE_DEVICES", VIRTUAL_DEVICES_ENV):
            lines.append(f"  {key} = {value if value is not None else '(unset)'}")
    lines.append(f"  launcher     : {env['cluster']}")
    lines += ["", f"Devices ({'as the framework lists them' if report['devices'] else 'none listed'})"]
    for d in report["devices"]:
        tag = " (virtual)" if d["virtual"] else ""
        lines.append(f"  {d['name']}{tag}")
    nvml = report["nvml"]
    lines += ["", "NVIDIA GPUs (NVML)"]
    if nvml["available"]:
        lines.append(f"  driver {nvml['driver']}")
        for g in nvml["devices"]:
            util = g.get("utilization_percent")
            util_text = f", {util:.0f}% busy" if isinstance(util, (int, float)) else ""
            lines.append(f"  GPU {g.get('index')}: {g.get('name')}, "
                         f"{g.get('memory_used_mb', 0):.0f}/{g.get('memory_total_mb', 0):.0f} "
                         f"MiB used{util_text}")
    else:
        lines.append(f"  not available: {nvml['reason']}")
    route = report["route"]
    lines += ["", "Route parallelize() would take"]
    lines.append(f"  route      : {route['route'] or '-'}")
    lines.append(f"  engine     : {route['engine'] or '-'}")
    lines.append(f"  replicas   : {route['replicas']}")
    lines.append(f"  all-reduce : {route['all_reduce'] or '-'}")
    lines.append(f"  why        : {route['why']}")
    if route["error"]:
        lines.append(f"  error      : {route['error']}")
    lines += ["", "Findings"]
    if not report["findings"]:
        lines.append("  none")
    for f in report["findings"]:
        lines.append(f"  [{f['severity']}] {f['code']}: {f['message']}")
        lines.append(f"      fix: {f['advice']}")
    lines.append("")
    if report["ok"]:
        lines.append(f"OK: multi-device training can run here ({route['replicas']} replicas).")
    else:
        blocking = [f["code"] for f in report["findings"] if f["severity"] == BLOCKING]
        if blocking:
            reason = f"blocking: {', '.join(blocking)}"
        elif route["error"]:
            reason = "parallelize() cannot build its route: the error above"
        else:
            reason = f"{route['replicas']} device(s); at least 2 are needed"
        lines.append(f"NOT READY: multi-device training cannot run here ({reason}).")
        processes = _common.needs_launcher(route.get("route"))
        if processes and not blocking:
            lines.append("(On torch a replica is a process: `kerasmgpu launch --nproc 2 -m "
                         "kerasmgpu demo` runs the demo on 2 processes.)")
        elif not blocking and not any(d["kind"] == "gpu" for d in report["devices"]):
            n = _common.DEFAULT_VIRTUAL
            lines.append(f"(`kerasmgpu demo` and `bench` still run: without GPUs they make {n} "
                         f"virtual CPU devices themselves - `kerasmgpu doctor --virtual {n}` "
                         "checks that setup.)")
    return "\n".join(lines)


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
    from kerasmgpu.env import cluster
    from kerasmgpu.env import versions as detection

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
        keras=_dist("keras"), tensorflow=_str(detection.tensorflow_version()),
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


def diagnose(verbose: bool = False, virtual_flag: Optional[int] = None,
             variables: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """The doctor's JSON object for this machine; never raises."""
    try:
        facts = collect(verbose, virtual_flag, variables)
    except Exception as exc:
        facts = Facts(internal_errors=(f"{type(exc).__name__}: {exc}",))
    try:
        return build_report(facts)
    except Exception as exc:
        facts = Facts(internal_errors=(f"building the report: {type(exc).__name__}: {exc}",))
        return build_report(facts)


def main(argv: List[str]) -> int:
    """`kerasmgpu doctor [--json]`; exit 0 when multi-device training can run here."""
    parser = argparse.ArgumentParser(
        prog="kerasmgpu doctor",
        description="Show the Keras line, versions, devices, GPUs and the route kerasmgpu "
        "would take; list findings with advice. Exit 0 when multi-device training can run.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--virtual", type=_common.positive_int("--virtual", str(_common.DEFAULT_VIRTUAL)),
        default=None, metavar="N",
        help="without GPUs, split the CPU into N virtual devices first, as `kerasmgpu demo` "
        f"and `bench` do ({_common.DEFAULT_VIRTUAL} there); the same as "
        f"{VIRTUAL_DEVICES_ENV}=N",
    )
    parser.add_argument("--verbose", action="store_true", help=_common.VERBOSE_HELP)
    args = parser.parse_args(argv)
    _common.quiet_frameworks(args.verbose)
    # Environment shows what the user set: `--virtual` writes KERASMGPU_VIRTUAL_DEVICES
    # (and XLA_FLAGS on JAX) itself, and the report names the flag as their source.
    variables = user_variables()
    if args.virtual is not None:
        try:
            _common.request_devices(args.virtual)  # before any framework starts
        except (TypeError, ValueError) as exc:
            print(f"kerasmgpu doctor: {exc}", file=sys.stderr)
            return 2
    real_stdout = sys.stdout
    # Frameworks print while they start ("Using TensorFlow backend."); stdout must stay
    # one JSON object, so anything they print goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        report = diagnose(args.verbose, args.virtual, variables)
    if args.json:
        print(_common.to_json(report), file=real_stdout)
    else:
        print(render(report), file=real_stdout)
    return 0 if report["ok"] else 1
