"""What `kerasmgpu bench` reports: its notes, the plan and the results table on the
terminal, bench.json and the scaling plot."""

from __future__ import annotations

import argparse
import io
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from kerasmgpu._atomic import write_atomic
from kerasmgpu._version import __version__
from kerasmgpu.cli import _common
from kerasmgpu.cli._common import Report


def learning_rate_notes(batch_size: int, policy: str, counts: Sequence[int]) -> List[str]:
    """What a global batch that grows with the replicas asks of the learning rate."""
    if policy != "per-replica" or max(counts) <= 1:
        return []
    n = max(counts)
    return [f"the global batch grows from {batch_size} to {batch_size * n} rows at "
            f"{n} replicas (fewer, larger steps): scale the learning rate by {n} with a "
            "warmup (linear scaling rule, Goyal et al. 2017), e.g. keras.optimizers."
            f"schedules.CosineDecay(lr, decay_steps, warmup_target=lr * {n}, "
            "warmup_steps=5 * steps_per_epoch); --batch-policy global keeps one device's "
            "steps (README, Semantics)"]


SHARED_CORES_PLOT_NOTE = ("virtual CPU devices sharing the CPU's cores: not a speed "
                          "measurement (the ideal lines are for real devices)")


def plot_title(title: str, shared_cores: bool) -> str:
    """The plot's title; on virtual devices it says the figures measure no speed-up, as
    the ideal lines would otherwise read as a target the run missed."""
    return f"{title}\n{SHARED_CORES_PLOT_NOTE}" if shared_cores else title


def write_plot(results: Sequence[Dict[str, Any]], path: str, title: str,
               shared_cores: bool = False) -> Optional[str]:
    """Throughput (with the ideal line) and efficiency against replicas, as a PNG.

    Returns the path, or None when matplotlib is not installed. Uses the Agg canvas
    directly, so no pyplot window or global backend is involved.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    counts = [int(r["replicas"]) for r in results]
    throughput = [float(r["samples_per_s"]) for r in results]
    efficiency = [100.0 * float(r["efficiency"]) for r in results]
    # min-max over the rounds, as error bars (absent in rows from older bench.json)
    spread = [[t - float(r.get("samples_per_s_min", t)) for t, r in zip(throughput, results)],
              [float(r.get("samples_per_s_max", t)) - t for t, r in zip(throughput, results)]]
    spread_eff = [[e - 100.0 * float(r.get("speedup_min", r["speedup"])) / int(r["replicas"])
                   for e, r in zip(efficiency, results)],
                  [100.0 * float(r.get("speedup_max", r["speedup"])) / int(r["replicas"]) - e
                   for e, r in zip(efficiency, results)]]
    base = next((t for n, t in zip(counts, throughput) if n == 1), throughput[0])
    figure = Figure(figsize=(10, 4.2))
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    left.plot(counts, [base * n for n in counts], "--", color="gray", label="ideal (linear)")
    left.errorbar(counts, throughput, yerr=spread, fmt="o-", color="tab:blue", capsize=4,
                  label="measured (median, min-max)")
    left.set_xlabel("replicas")
    left.set_ylabel("samples/s")
    left.set_xticks(counts)
    left.set_ylim(bottom=0)
    left.grid(alpha=0.3)
    left.legend()
    left.set_title("throughput")
    right.axhline(100.0, linestyle="--", color="gray", label="ideal (100%)")
    right.errorbar(counts, efficiency, yerr=spread_eff, fmt="o-", color="tab:orange",
                   capsize=4, label="measured (median, min-max)")
    right.set_xlabel("replicas")
    right.set_ylabel("scaling efficiency (%)")
    right.set_xticks(counts)
    right.set_ylim(0, max([110.0] + [(e + up) * 1.1 for e, up in zip(efficiency, spread_eff[1])]))
    right.grid(alpha=0.3)
    right.legend()
    right.set_title("efficiency = speedup / replicas")
    figure.suptitle(plot_title(title, shared_cores))
    figure.tight_layout()
    # Drawn into memory and written whole, as bench.json is: savefig writes the file in
    # place, and a kill during it left a truncated image over the last good one.
    drawn = io.BytesIO()
    figure.savefig(drawn, format="png", dpi=100)
    write_atomic(path, drawn.getvalue())
    return path


def _device_notes(devices: Sequence[Any], asked: Optional[int]) -> List[str]:
    if _common.device_kind(devices) != "virtual cpu":
        return []
    notes = [_common.shared_cores_note(measure="efficiency")]
    made = _common.made_virtual_note("bench", len(devices), asked)
    return notes + [made] if made else notes


def _device_label(devices: Sequence[Any], summary: Dict[str, Any]) -> str:
    kind = _common.device_kind(devices)
    if kind == "gpu":
        return f"{summary['gpu_name'] or 'GPU'} x{len(devices)}"
    return f"{kind} devices ({summary['cpu_cores']} cores)"


def _print_plan(report: Report, args: argparse.Namespace, env: Any, counts: List[int],
                route: Optional[Dict[str, str]], label: str) -> None:
    report.line(f"kerasmgpu bench {__version__}: {args.model}, {_common.line_label(env)}, "
                f"{label}")
    length = f"{args.steps} timed steps" if args.steps else f"{args.seconds:g} s"
    report.line(f"replicas {','.join(map(str, counts))}; batch {args.batch_size} "
                f"({args.batch_policy}); {args.warmup} warm-up steps, then {args.rounds} "
                f"rounds of {length} per count, interleaved")
    if route is not None:
        report.line(f"route: {route.get('route')} - {route.get('engine', '-')}, all-reduce: "
                    f"{route.get('all_reduce', '-')}")


def _write(args: argparse.Namespace, env: Any, label: str, counts: List[int],
           summary: Dict[str, Any], route: Optional[Dict[str, str]],
           measured: List[Dict[str, Any]], notes: List[str]) -> Tuple[Dict[str, Any], str]:
    """bench.json and the plot in --output; returns the JSON object and what was written."""
    os.makedirs(args.output, exist_ok=True)
    title = f"kerasmgpu bench: {args.model}, {_common.line_label(env)}, {label}"
    shared = summary.get("device_kind") == "virtual cpu"
    plot = write_plot(measured, os.path.join(args.output, "scaling.png"), title, shared)
    if plot is None:
        notes.append("plot skipped: matplotlib is not installed (pip install matplotlib, "
                     "or kerasmgpu's `tools` extra)")
    result: Dict[str, Any] = {
        "kerasmgpu": __version__,
        "config": {"replicas": counts, "model": args.model, "batch_size": args.batch_size,
                   "batch_policy": args.batch_policy, "seconds": args.seconds,
                   "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
                   "output": args.output},
        "environment": summary,
        "route": _common.route_json(route),
        "results": measured,
        "plot": plot,
        "notes": notes,
    }
    json_path = os.path.join(args.output, "bench.json")
    write_atomic(json_path, (_common.to_json(result) + "\n").encode("utf-8"))
    return result, json_path + (f" and {plot}" if plot else "")


def _print_results(report: Report, args: argparse.Namespace,
                   measured: List[Dict[str, Any]], notes: List[str], written: str) -> None:
    report.line()
    rows = [["replicas", "global batch", "per replica", "steps", "samples/s", "min-max",
             "speedup", "min-max", "efficiency"]]
    for r in measured:
        rows.append([str(r["replicas"]), str(r["global_batch"]), str(r["per_replica_batch"]),
                     str(r["steps"]), f"{r['samples_per_s']:.0f}",
                     f"{r['samples_per_s_min']:.0f}-{r['samples_per_s_max']:.0f}",
                     f"{r['speedup']:.2f}x",
                     f"{r['speedup_min']:.2f}-{r['speedup_max']:.2f}",
                     f"{100 * r['efficiency']:.0f}%"])
    for line in _common.table(rows, [True] * len(rows[0])):
        report.line(line)
    report.line(f"medians of {args.rounds} round(s); min-max over the rounds (speedup: each "
                "round's ratio to replicas=1 in the same round)")
    report.line()
    for note in notes:
        report.line(f"note: {note}")
    report.line(f"wrote {written}")
