"""The doctor's report: the JSON object (`build_report`) and the readable text
(`render`) made from it."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from kerasmgpu._version import __version__
from kerasmgpu.cli import _common
from kerasmgpu.cli.doctor.checks import BLOCKING, can_train, findings, route_info
from kerasmgpu.cli.doctor.facts import WATCHED, Facts
from kerasmgpu.env.versions import VIRTUAL_DEVICES_ENV, variable_applies


def build_report(facts: Facts) -> Dict[str, Any]:
    """The doctor's JSON object (schema in the docstring of kerasmgpu.cli.doctor). Pure."""
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
