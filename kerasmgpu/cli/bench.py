"""`kerasmgpu bench`: samples/s and scaling efficiency for 1, 2, 4... replicas.

    kerasmgpu bench                                   # 1, 2, 4... up to every GPU
    kerasmgpu bench --replicas 1,2,4 --model cnn --batch-size 128 \\
                    --batch-policy per-replica --steps 30 --output bench-out [--json]

One process trains the same model (seeded weights, synthetic data) once per replica
count: the plain model for 1, `kerasmgpu.parallelize(model, gpus=N)` for N > 1. Each
run does `--warmup` steps (compilation, first-batch allocation) and then `--steps`
timed steps; a step counts as done when its loss is on the host. Reported per count:
samples/s, speedup over 1 replica (1 is always measured) and efficiency = speedup / N.

`--batch-policy per-replica` (default): the global batch is B x N, so each replica
keeps B rows however many there are (weak scaling - how data-parallel training is
meant to be scaled). `--batch-policy global`: the global batch is B for every N, so each
replica gets B / N rows (strong scaling; small per-replica batches leave GPUs idle).

Without GPUs, max(replicas) virtual CPU devices are requested up front (before any
framework starts). They share the same CPU cores, so efficiency there measures the cost
of splitting and all-reducing, not a speed-up.

Writes `DIR/bench.json` (default DIR: ./bench-out) and `DIR/scaling.png` (throughput
against replicas with the ideal linear line, and efficiency; needs matplotlib - without
it the JSON is written and the plot skipped, exit 0). A progress line goes to stderr.
Exit status: 0 on success, 2 for a bad command line or replica counts this machine
cannot run (checked before anything trains).

bench.json (`--json` prints the same object on stdout; the table goes to stderr):

    {"kerasmgpu": str,
     "config": {"replicas": [int], "model": "mlp" | "cnn", "batch_size": int,
                "batch_policy": "per-replica" | "global", "steps": int, "warmup": int,
                "output": str},
     "environment": {"keras_line", "keras_version", "backend", "tensorflow_version",
                     "jax_version", "torch_version", "python_version", "route",
                     "device_kind": "gpu" | "virtual cpu" | "cpu", "devices": [str],
                     "gpu_name": str | null, "cpu_cores": int,
                     "virtual_devices": int | null},
     "route": {route, engine, replicas, devices, all_reduce} | null   (kerasmgpu.describe()
              for max(replicas), string values; null when only 1 replica is measured),
     "results": [{"replicas": int, "global_batch": int, "per_replica_batch": int,
                  "padding_rows": int, "steps": int, "seconds": float,
                  "samples_per_s": float, "speedup": float, "efficiency": float}],
     "plot": str | null, "notes": [str]}
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kerasmgpu._errors import explain
from kerasmgpu._version import __version__
from kerasmgpu.cli import _common
from kerasmgpu.cli._common import Report, UsageError

MODELS = ("mlp", "cnn")
POLICIES = ("per-replica", "global")
DEFAULT_BATCH = 128
DEFAULT_STEPS = 30
DEFAULT_WARMUP = 3
DEFAULT_OUTPUT = "bench-out"
SEED = 7


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
                        help="mlp: 784-512-512-10 dense; cnn: two conv layers on 28x28x1 "
                        "(default mlp)")
    parser.add_argument("--batch-size", type=_common.positive_int("--batch-size", "128"),
                        default=DEFAULT_BATCH,
                        help=f"rows per replica (per-replica policy) or per step (global "
                        f"policy); default {DEFAULT_BATCH}")
    parser.add_argument("--batch-policy", choices=POLICIES, default="per-replica",
                        help="per-replica: global batch = B x N (weak scaling, default); "
                        "global: global batch = B for every N (strong scaling)")
    parser.add_argument("--steps", type=_common.positive_int("--steps", "30"),
                        default=DEFAULT_STEPS, help=f"timed steps per count (default "
                        f"{DEFAULT_STEPS})")
    parser.add_argument("--warmup", type=_common.positive_int("--warmup", "3"),
                        default=DEFAULT_WARMUP, help=f"untimed steps first (default "
                        f"{DEFAULT_WARMUP})")
    parser.add_argument("--output", default=DEFAULT_OUTPUT,
                        help=f"folder for bench.json and scaling.png (default ./{DEFAULT_OUTPUT})")
    parser.add_argument("--json", action="store_true",
                        help="print the bench.json object on stdout (the table goes to stderr)")
    return parser


# --- pure helpers ------------------------------------------------------------------------


def default_counts(devices: int) -> List[int]:
    """1, 2, 4, ... below `devices`, and `devices` itself: [1, 2, 3] for 3."""
    counts = {devices}
    power = 1
    while power < devices:
        counts.add(power)
        power *= 2
    return sorted(counts)


def global_batch(batch_size: int, policy: str, replicas: int) -> int:
    return batch_size * replicas if policy == "per-replica" else batch_size


def scaling(samples_per_s: Sequence[Tuple[int, float]]) -> List[Dict[str, float]]:
    """Speedup over the 1-replica figure and efficiency (speedup / N) for each count."""
    base = dict(samples_per_s).get(1)
    rows = []
    for replicas, value in samples_per_s:
        speedup = value / base if base else float("nan")
        rows.append({"replicas": replicas, "speedup": speedup, "efficiency": speedup / replicas})
    return rows


def write_plot(results: Sequence[Dict[str, Any]], path: str, title: str) -> Optional[str]:
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
    base = next((t for n, t in zip(counts, throughput) if n == 1), throughput[0])
    figure = Figure(figsize=(10, 4.2))
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    left.plot(counts, [base * n for n in counts], "--", color="gray", label="ideal (linear)")
    left.plot(counts, throughput, "o-", color="tab:blue", label="measured")
    left.set_xlabel("replicas")
    left.set_ylabel("samples/s")
    left.set_xticks(counts)
    left.set_ylim(bottom=0)
    left.grid(alpha=0.3)
    left.legend()
    left.set_title("throughput")
    right.axhline(100.0, linestyle="--", color="gray", label="ideal (100%)")
    right.plot(counts, efficiency, "o-", color="tab:orange", label="measured")
    right.set_xlabel("replicas")
    right.set_ylabel("scaling efficiency (%)")
    right.set_xticks(counts)
    right.set_ylim(0, max([110.0] + [e * 1.1 for e in efficiency]))
    right.grid(alpha=0.3)
    right.legend()
    right.set_title("efficiency = speedup / replicas")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path


# --- models and data ----------------------------------------------------------------------


def build_model(keras: Any, kind: str) -> Any:
    """The benchmark model, seeded, compiled with SGD."""
    if kind == "cnn":
        inputs = keras.Input((28, 28, 1))
        x = keras.layers.Conv2D(32, 3, activation="relu")(inputs)
        x = keras.layers.Conv2D(64, 3, activation="relu")(x)
        x = keras.layers.MaxPooling2D(2)(x)
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dense(128, activation="relu")(x)
    else:
        inputs = keras.Input((784,))
        x = keras.layers.Dense(512, activation="relu")(inputs)
        x = keras.layers.Dense(512, activation="relu")(x)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    _common.seeded_weights(model, SEED)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01),
                  loss="sparse_categorical_crossentropy")
    return model


def make_data(kind: str, rows: int) -> Tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(SEED)
    shape = (rows, 28, 28, 1) if kind == "cnn" else (rows, 784)
    return rng.random(shape, dtype=np.float32), rng.integers(0, 10, size=rows)


def _step_timer(keras: Any, on_step: Callable[[int], None]) -> Tuple[Any, List[float]]:
    """A callback that records when each training step's loss reached the host."""
    times: List[float] = []

    def on_train_batch_end(self: Any, batch: int, logs: Any = None) -> None:
        # Reading the loss waits for the step (JAX dispatches asynchronously).
        for value in (logs or {}).values():
            with contextlib.suppress(TypeError, ValueError):
                float(value)
            break
        times.append(time.perf_counter())
        on_step(len(times))

    cls = type("StepTimer", (keras.callbacks.Callback,),
               {"on_train_batch_end": on_train_batch_end})
    return cls(), times


def _measure(keras: Any, args: argparse.Namespace, replicas: int, data: Tuple[Any, Any],
             report: Report, label: str) -> Dict[str, Any]:
    from kerasmgpu import api, batching

    batch = global_batch(args.batch_size, args.batch_policy, replicas)
    total = args.warmup + args.steps
    x, y = data[0][: batch * total], data[1][: batch * total]
    model = build_model(keras, args.model)
    trained = model if replicas == 1 else api.parallelize(model, gpus=replicas)
    callback, times = _step_timer(
        keras, lambda done: report.progress(f"{label} replicas={replicas} step {done}/{total}")
    )
    trained.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                callbacks=[callback])
    report.end_progress()
    if len(times) < args.steps + 1:
        raise RuntimeError(f"expected {total} steps, the callback saw {len(times)}")
    seconds = times[-1] - times[-args.steps - 1]
    plan = batching.plan_batch(batch, replicas)
    del trained, model
    gc.collect()
    return {
        "replicas": replicas,
        "global_batch": batch,
        "per_replica_batch": plan.per_replica,
        "padding_rows": plan.pad,
        "steps": args.steps,
        "seconds": round(seconds, 4),
        "samples_per_s": batch * args.steps / seconds if seconds > 0 else float("nan"),
    }


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

    counts = _common.parse_counts(args.replicas) if args.replicas is not None else None
    if args.batch_policy == "global" and counts and args.batch_size < counts[-1]:
        raise UsageError(explain(
            "--batch-size", args.batch_size,
            f"at least {counts[-1]} with --batch-policy global (one row per replica)",
            f"pass --batch-size {max(counts[-1], DEFAULT_BATCH)} or --batch-policy per-replica",
        ))
    env = api.environment()
    if _common.keras_missing(env):
        raise UsageError(_common.no_keras_message())
    if _common.launched():
        raise UsageError(explain(
            "kerasmgpu launch", "bench in a launched worker", "bench in one plain process",
            "run `kerasmgpu bench` directly; it measures every replica count itself",
            raw=True,
        ))
    if env.backend == "torch":
        raise UsageError(explain(
            "KERAS_BACKEND", "torch",
            "tensorflow or jax (bench runs every replica count in one process, and on "
            "torch each replica is a process)",
            "run bench with KERAS_BACKEND=jax or tensorflow; on torch, time your script "
            "under `kerasmgpu launch --nproc N`", raw=True,
        ))
    wanted = counts[-1] if counts else (_common.requested_virtual() or _common.DEFAULT_VIRTUAL)
    env, keras, devices = _common.start(env, wanted)
    notes: List[str] = []
    text = args.replicas or ""
    if counts is None:
        counts = default_counts(len(devices))
        text = ",".join(map(str, counts))
    elif counts[0] != 1:
        counts = [1] + counts
        notes.append("added replicas=1: speedup and efficiency are measured against it")
    _check_counts(counts, devices, text)
    route: Optional[Dict[str, str]] = None
    if counts[-1] > 1:
        route = dict(api.describe(gpus=counts[-1]))
        if "error" in route:
            raise UsageError(explain(
                "--replicas", text, "replica counts the route can build here",
                f"see `kerasmgpu doctor` ({route['error']})", raw=True,
            ))
    kind = _common.device_kind(devices)
    if kind == "virtual cpu":
        notes.append(_common.shared_cores_note(measure="efficiency"))
    summary = _common.environment_summary(env, devices)
    device_label = (f"{summary['gpu_name'] or 'GPU'} x{len(devices)}" if kind == "gpu"
                    else f"{kind} devices ({summary['cpu_cores']} cores)")
    report.line(f"kerasmgpu bench {__version__}: {args.model}, {_common.line_label(env)}, "
                f"{device_label}")
    report.line(f"replicas {','.join(map(str, counts))}; batch {args.batch_size} "
                f"({args.batch_policy}); {args.warmup} warm-up + {args.steps} timed steps each")
    if route is not None:
        report.line(f"route: {route.get('route')} - {route.get('engine', '-')}, all-reduce: "
                    f"{route.get('all_reduce', '-')}")

    largest = global_batch(args.batch_size, args.batch_policy, counts[-1])
    data = make_data(args.model, largest * (args.warmup + args.steps))
    measured = []
    for i, n in enumerate(counts, start=1):
        measured.append(_measure(keras, args, n, data, report, f"[{i}/{len(counts)}]"))
        report.line(f"  replicas={n}: {measured[-1]['samples_per_s']:.0f} samples/s")
    for row, extra in zip(measured, scaling([(r["replicas"], r["samples_per_s"])
                                             for r in measured])):
        row["speedup"] = extra["speedup"]
        row["efficiency"] = extra["efficiency"]

    os.makedirs(args.output, exist_ok=True)
    title = f"kerasmgpu bench: {args.model}, {_common.line_label(env)}, {device_label}"
    plot = write_plot(measured, os.path.join(args.output, "scaling.png"), title)
    if plot is None:
        notes.append("plot skipped: matplotlib is not installed (pip install matplotlib)")
    result: Dict[str, Any] = {
        "kerasmgpu": __version__,
        "config": {"replicas": counts, "model": args.model, "batch_size": args.batch_size,
                   "batch_policy": args.batch_policy, "steps": args.steps,
                   "warmup": args.warmup, "output": args.output},
        "environment": summary,
        "route": route,
        "results": measured,
        "plot": plot,
        "notes": notes,
    }
    json_path = os.path.join(args.output, "bench.json")
    with open(json_path, "w", encoding="utf-8") as handle:
        handle.write(_common.to_json(result) + "\n")

    report.line()
    rows = [["replicas", "global batch", "per replica", "samples/s", "speedup", "efficiency",
             "seconds"]]
    for r in measured:
        rows.append([str(r["replicas"]), str(r["global_batch"]), str(r["per_replica_batch"]),
                     f"{r['samples_per_s']:.0f}", f"{r['speedup']:.2f}x",
                     f"{100 * r['efficiency']:.0f}%", f"{r['seconds']:.2f}"])
    for line in _common.table(rows, [True] * len(rows[0])):
        report.line(line)
    report.line()
    for note in notes:
        report.line(f"note: {note}")
    report.line(f"wrote {json_path}" + (f" and {plot}" if plot else ""))
    return result


def main(argv: List[str]) -> int:
    """`kerasmgpu bench`; see the module docstring for options, files and exit status."""
    args = _parser().parse_args(argv)
    _common.quiet_tensorflow()
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
