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
that `collect()` fills from the running machine; tests pass made-up `Facts`. The
package's modules: `facts.py` (the record, `collect()`), `checks.py` (the findings and
the route, pure), `report.py` (the JSON object and the text); `main()` is here.

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
import sys
from typing import Any, Dict, List, Mapping, Optional

from kerasmgpu.cli import _common
from kerasmgpu.cli.doctor.checks import (
    BLOCKING,
    INFO,
    INSTALL,
    SEVERITIES,
    WARNING,
    Finding,
    can_train,
    device_count,
    findings,
    route_info,
)
from kerasmgpu.cli.doctor.facts import WATCHED, Facts, collect, nvml_reason, user_variables
from kerasmgpu.cli.doctor.report import build_report, render
from kerasmgpu.env.versions import VIRTUAL_DEVICES_ENV

__all__ = [
    "BLOCKING",
    "INFO",
    "INSTALL",
    "SEVERITIES",
    "WARNING",
    "WATCHED",
    "Facts",
    "Finding",
    "build_report",
    "can_train",
    "collect",
    "device_count",
    "diagnose",
    "findings",
    "main",
    "nvml_reason",
    "render",
    "route_info",
    "user_variables",
]


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
