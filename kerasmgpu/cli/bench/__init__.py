"""`kerasmgpu bench`: samples/s and scaling efficiency for 1, 2, 4... replicas.

    kerasmgpu bench                                   # 1, 2, 4... up to every GPU
    kerasmgpu bench --replicas 1,2,4 --model cnn --batch-size 128 \\
                    --batch-policy per-replica --seconds 2 --rounds 5 --output bench-out [--json]

One process builds the same model (seeded weights, synthetic data) once per replica
count: the plain model for 1, `kerasmgpu.parallelize(model, gpus=N)` for N > 1. Each
gets `--warmup` untimed steps (compilation, first-batch allocation), which also time a
step to size the measurements: enough steps for `--seconds` each (or exactly
`--steps`). Then `--rounds` rounds measure every count once each, interleaved (the
order reversed every other round), so a machine that gets busier or quieter during the
run weighs on every count alike. A step counts as done when its loss is on the host;
the time between epochs of a measurement (its input repeats every `CHUNK_STEPS` steps)
is left out, as it holds per-epoch work that real, long epochs spread thin.

Reported per count: the median samples/s over the rounds and its min-max, the speedup
over 1 replica (1 is always measured) as the median of each round's ratio with its
min-max, and efficiency = speedup / N. A spread of a few percent is normal; a wide one
says the machine was busy - raise `--seconds` or `--rounds`.

`--batch-policy per-replica` (default): the global batch is B x N, so each replica
keeps B rows however many there are (weak scaling - how data-parallel training is
meant to be scaled). `--batch-policy global`: the global batch is B for every N, so each
replica gets B / N rows (strong scaling; small per-replica batches leave GPUs idle).

Without GPUs, max(replicas) virtual CPU devices are requested up front (before any
framework starts). They share the same CPU cores, so efficiency there measures the cost
of splitting and all-reducing, not a speed-up.

Writes `DIR/bench.json` (default DIR: ./bench-out) and `DIR/scaling.png` (throughput
against replicas with the ideal linear line, and efficiency, each with its min-max;
needs matplotlib - without it the JSON is written and the plot skipped, exit 0). A
progress line goes to stderr on a terminal. Framework start-up log lines are hidden
unless `--verbose`. Exit status: 0 on success, 2 for a bad command line or replica
counts this machine cannot run (checked before anything trains).

bench.json (`--json` prints the same object on stdout; the table goes to stderr):

    {"kerasmgpu": str,
     "config": {"replicas": [int], "model": "mlp" | "cnn" | "lstm" | "transformer", "batch_size": int,
                "batch_policy": "per-replica" | "global", "seconds": float,
                "rounds": int, "steps": int | null, "warmup": int, "output": str},
     "environment": {"keras_line", "keras_version", "backend", "tensorflow_version",
                     "jax_version", "torch_version", "python_version", "route",
                     "device_kind": "gpu" | "virtual cpu" | "cpu", "devices": [str],
                     "gpu_name": str | null, "cpu_cores": int,
                     "virtual_devices": int | null},
     "route": {"route": str, "engine": str, "replicas": int, "devices": [str],
               "all_reduce": str} | null   (kerasmgpu.describe() for max(replicas);
              null when only 1 replica is measured),
     "results": [{"replicas": int, "global_batch": int, "per_replica_batch": int,
                  "padding_rows": int, "steps": int, "rounds": int, "seconds": float,
                  "samples_per_s": float, "samples_per_s_min": float,
                  "samples_per_s_max": float, "samples_per_s_rounds": [float],
                  "speedup": float, "speedup_min": float, "speedup_max": float,
                  "efficiency": float}],
     "plot": str | null, "notes": [str]}

`steps` is the timed steps of one measurement, `seconds` their median duration.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from typing import Any, Dict, List, Optional, Sequence

from kerasmgpu._errors import explain
from kerasmgpu.cli import _common
from kerasmgpu.cli._common import Report, UsageError
from kerasmgpu.cli.bench.measure import (
    CHUNK_STEPS,
    MAX_STEPS,
    MODELS,
    SEED,
    SEQUENCE,
    VOCABULARY,
    Contender,
    _measure,
    build_model,
    global_batch,
    make_data,
    plan_steps,
    scaling,
    timed_steps,
    within_epochs,
)
from kerasmgpu.cli.bench.output import (
    SHARED_CORES_PLOT_NOTE,
    _device_label,
    _device_notes,
    _print_plan,
    _print_results,
    _write,
    learning_rate_notes,
    plot_title,
    write_plot,
)

__all__ = [
    "CHUNK_STEPS",
    "DEFAULT_BATCH",
    "DEFAULT_OUTPUT",
    "DEFAULT_ROUNDS",
    "DEFAULT_SECONDS",
    "DEFAULT_WARMUP",
    "MAX_STEPS",
    "MODELS",
    "POLICIES",
    "SEED",
    "SEQUENCE",
    "SHARED_CORES_PLOT_NOTE",
    "VOCABULARY",
    "Contender",
    "build_model",
    "default_counts",
    "global_batch",
    "learning_rate_notes",
    "main",
    "make_data",
    "plan_steps",
    "plot_title",
    "run",
    "scaling",
    "timed_steps",
    "within_epochs",
    "write_plot",
]

POLICIES = ("per-replica", "global")
DEFAULT_BATCH = 128
# 30 steps (~0.2 s on a small CPU model) gave 1.37x and then 0.90x for the same
# command: a measurement that short is the machine's noise. Seconds, not steps, make
# it long enough whatever the model and devices; rounds give the median and spread.
DEFAULT_SECONDS = 2.0
DEFAULT_ROUNDS = 5
DEFAULT_WARMUP = 5
DEFAULT_OUTPUT = "bench-out"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerasmgpu bench",
        description="Measure samples/s and scaling efficiency for each replica count; write "
        "DIR/bench.json and DIR/scaling.png.",
    )
    parser.add_argument("--replicas", default=None,
                        help="comma-separated replica counts, e.g. 1,2,4 (default: 1, 2, "
                        "4... up to every device; 1 is always measured, as the baseline)")
    parser.add_argument("--model", choices=MODELS, default="mlp",
                        help="mlp: 784-512-512-10 dense; cnn: two conv layers on 28x28x1; "
                        "lstm: an LSTM(64) text classifier on 64 tokens; transformer: one "
                        "encoder block (4-head self-attention, feed-forward) on 64 tokens "
                        "(default mlp)")
    parser.add_argument("--batch-size", type=_common.positive_int("--batch-size", "128"),
                        default=DEFAULT_BATCH,
                        help=f"rows per replica (per-replica policy) or per step (global "
                        f"policy); default {DEFAULT_BATCH}")
    parser.add_argument("--batch-policy", choices=POLICIES, default="per-replica",
                        help="per-replica: global batch = B x N (weak scaling, default); "
                        "global: global batch = B for every N (strong scaling)")
    parser.add_argument("--seconds", type=_positive_float("--seconds", "2"),
                        default=DEFAULT_SECONDS,
                        help=f"length of each timed measurement, in seconds (default "
                        f"{DEFAULT_SECONDS:g}); the steps are sized from the warm-up")
    parser.add_argument("--rounds", type=_common.positive_int("--rounds", "5"),
                        default=DEFAULT_ROUNDS,
                        help=f"measurements per replica count, interleaved; the median is "
                        f"reported with its min-max (default {DEFAULT_ROUNDS})")
    parser.add_argument("--steps", type=_common.positive_int("--steps", "100"), default=None,
                        help="timed steps per measurement instead of --seconds")
    parser.add_argument("--warmup", type=_common.positive_int("--warmup", "5"),
                        default=DEFAULT_WARMUP, help=f"untimed steps first, per count "
                        f"(default {DEFAULT_WARMUP})")
    parser.add_argument("--output", default=DEFAULT_OUTPUT,
                        help=f"folder for bench.json and scaling.png (default ./{DEFAULT_OUTPUT})")
    parser.add_argument("--json", action="store_true",
                        help="print the bench.json object on stdout (the table goes to stderr)")
    parser.add_argument("--verbose", action="store_true", help=_common.VERBOSE_HELP)
    return parser


def _positive_float(flag: str, example: str) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = 0.0
        if not value > 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(
                explain(flag, text, "a number of seconds > 0", f"pass e.g. {flag} {example}")
            )
        return value

    parse.__name__ = flag
    return parse


# --- pure helpers ------------------------------------------------------------------------


def default_counts(devices: int) -> List[int]:
    """1, 2, 4, ... below `devices`, and `devices` itself: [1, 2, 3] for 3."""
    counts = {devices}
    power = 1
    while power < devices:
        counts.add(power)
        power *= 2
    return sorted(counts)


# --- the command ---------------------------------------------------------------------------


def _check_counts(counts: List[int], devices: Sequence[Any], text: str) -> None:
    available = len(devices)
    if counts[-1] <= available:
        return
    shown = ", ".join(str(d) for d in devices) or "none"
    fitting = ",".join(str(c) for c in counts if c <= available) or "1"
    if _common.has_gpu(devices):
        fix = f"pass --replicas {fitting}, or check CUDA_VISIBLE_DEVICES"
    else:
        fix = (f"pass --replicas {fitting}, or run bench in a fresh process (it asks for "
               f"{counts[-1]} virtual CPU devices before the framework starts), or set "
               f"KERASMGPU_VIRTUAL_DEVICES={counts[-1]}")
    raise UsageError(explain(
        "--replicas", text, f"counts up to {available}: this machine shows {shown}", fix,
        raw=True,
    ))


def run(args: argparse.Namespace, report: Report) -> Dict[str, Any]:
    """The benchmark; returns bench.json's object."""
    from kerasmgpu import api

    counts = _asked_counts(args)
    env = api.environment()
    _refuse_here(env)
    asked = _common.requested_virtual()
    wanted = counts[-1] if counts else (asked or _common.DEFAULT_VIRTUAL)
    env, keras, devices = _common.start(env, wanted, verbose=args.verbose)
    notes: List[str] = []
    text = args.replicas or ""
    if counts is None:
        counts = default_counts(len(devices))
        text = ",".join(map(str, counts))
    elif counts[0] != 1:
        counts = [1] + counts
        notes.append("added replicas=1: speedup and efficiency are measured against it")
    _check_counts(counts, devices, text)
    route = _route(api, counts, text)
    notes += _device_notes(devices, asked)
    notes += learning_rate_notes(args.batch_size, args.batch_policy, counts)
    summary = _common.environment_summary(env, devices)
    label = _device_label(devices, summary)
    _print_plan(report, args, env, counts, route, label)
    measured = _measure(keras, args, counts, report)
    result, written = _write(args, env, label, counts, summary, route, measured, notes)
    _print_results(report, args, measured, notes, written)
    return result


def _asked_counts(args: argparse.Namespace) -> Optional[List[int]]:
    """--replicas as given (None: every count up to the devices), checked against
    --batch-size before anything starts."""
    counts = _common.parse_counts(args.replicas) if args.replicas is not None else None
    if args.batch_policy == "global" and counts and args.batch_size < counts[-1]:
        raise UsageError(explain(
            "--batch-size", args.batch_size,
            f"at least {counts[-1]} with --batch-policy global (one row per replica)",
            f"pass --batch-size {max(counts[-1], DEFAULT_BATCH)} or --batch-policy per-replica",
        ))
    return counts


def _refuse_here(env: Any) -> None:
    """Where bench cannot measure: no Keras, a launched worker, a route whose replicas
    are processes (torch)."""
    if _common.keras_missing(env):
        raise UsageError(_common.no_keras_message())
    if _common.started_by_launcher():
        raise UsageError(explain(
            "kerasmgpu launch", "bench in a launched worker", "bench in one plain process",
            "run `kerasmgpu bench` directly; it measures every replica count itself",
            raw=True,
        ))
    if _common.needs_launcher(env.route):
        raise UsageError(explain(
            "KERAS_BACKEND", env.backend,
            "tensorflow or jax (bench runs every replica count in one process, and on "
            "torch each replica is a process)",
            "run bench with KERAS_BACKEND=jax or tensorflow; on torch, time your script "
            "under `kerasmgpu launch --nproc N`", raw=True,
        ))


def _route(api: Any, counts: List[int], text: str) -> Optional[Dict[str, str]]:
    """describe() for the largest count (None when only 1 replica is measured)."""
    if counts[-1] == 1:
        return None
    route = dict(api.describe(gpus=counts[-1]))
    if "error" in route:
        raise UsageError(explain(
            "--replicas", text, "replica counts the route can build here",
            f"see `kerasmgpu doctor` ({route['error']})", raw=True,
        ))
    return route


def main(argv: List[str]) -> int:
    """`kerasmgpu bench`; see the module docstring for options, files and exit status."""
    args = _parser().parse_args(argv)
    _common.quiet_frameworks(args.verbose)
    report = Report(args.json)
    real_stdout = sys.stdout
    try:
        # With --json, stdout is the JSON object alone; stray framework prints go to stderr.
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            result = run(args, report)
    except UsageError as exc:
        report.end_progress()
        print(f"kerasmgpu bench: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(_common.to_json(result), file=real_stdout)
    return 0
