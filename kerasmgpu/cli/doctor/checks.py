"""The doctor's findings: a pure function of `Facts` - what is wrong or worth knowing,
each with a severity and advice - and the route parallelize() would take, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.version import InvalidVersion, Version

from kerasmgpu import engines, registry
from kerasmgpu.cli import _common
from kerasmgpu.cli.doctor.facts import Facts
from kerasmgpu.env.versions import (
    TF_SPLIT_KERAS,
    TF_WITH_KERAS_3,
    VIRTUAL_DEVICES_ENV,
    KerasLine,
    _truthy,
)
from kerasmgpu.registry import Route

INFO, WARNING, BLOCKING = "info", "warning", "blocking"
SEVERITIES = (INFO, WARNING, BLOCKING)

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
