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
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kerasmgpu._errors import explain
from kerasmgpu._version import __version__
from kerasmgpu.cli import _common
from kerasmgpu.cli._common import Report, UsageError

MODELS = ("mlp", "cnn", "lstm", "transformer")
SEQUENCE, VOCABULARY = 64, 2000  # the lstm and transformer models' token ids
POLICIES = ("per-replica", "global")
DEFAULT_BATCH = 128
# 30 steps (~0.2 s on a small CPU model) gave 1.37x and then 0.90x for the same
# command: a measurement that short is the machine's noise. Seconds, not steps, make
# it long enough whatever the model and devices; rounds give the median and spread.
DEFAULT_SECONDS = 2.0
DEFAULT_ROUNDS = 5
DEFAULT_WARMUP = 5
DEFAULT_OUTPUT = "bench-out"
SEED = 7
# Steps per epoch of a measurement's input: it repeats, epoch after epoch, so that a
# long measurement does not need its whole length of data in memory. Only the steps
# inside an epoch are timed: the gap across an epoch boundary holds per-epoch work
# (Keras 3 on TensorFlow re-creates its dataset iterator: 80 ms against 7 ms steps
# here; kerasmgpu syncs the template's weights) that a real epoch of thousands of
# steps spreads thin, and that would dominate epochs this short.
CHUNK_STEPS = 32
MAX_STEPS = 100_000


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


def global_batch(batch_size: int, policy: str, replicas: int) -> int:
    return batch_size * replicas if policy == "per-replica" else batch_size


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


def scaling(rounds: Dict[int, Sequence[float]]) -> List[Dict[str, float]]:
    """Per count: samples/s median and min-max over the rounds, and the speedup over 1
    replica - each round's ratio to the 1-replica figure of the same round, so that
    the ratios pair measurements taken moments apart - as median and min-max, with
    efficiency = median speedup / N."""
    base = list(rounds.get(1, ()))
    rows = []
    for replicas, values in rounds.items():
        ratios = ([v / b if b else float("nan") for v, b in zip(values, base)]
                  if base else [float("nan")])
        speedup = statistics.median(ratios)
        rows.append({
            "replicas": replicas,
            "samples_per_s": statistics.median(values),
            "samples_per_s_min": min(values),
            "samples_per_s_max": max(values),
            "speedup": speedup,
            "speedup_min": min(ratios),
            "speedup_max": max(ratios),
            "efficiency": speedup / replicas,
        })
    return rows


def plan_steps(step_seconds: float, seconds: float, fixed: Optional[int]) -> Tuple[int, int]:
    """(steps per epoch, epochs) of one measurement: at least `fixed` timed steps, or
    enough for `seconds` at `step_seconds` a step. An epoch's first step only starts
    its clock, so an epoch of c steps times c - 1 (see `timed_steps`)."""
    if fixed is not None:
        wanted = fixed
    elif step_seconds > 0 and math.isfinite(step_seconds):
        wanted = math.ceil(seconds / step_seconds)
    else:
        wanted = CHUNK_STEPS - 1
    wanted = max(2, min(wanted, MAX_STEPS))
    chunk = min(CHUNK_STEPS, wanted + 1)
    return chunk, math.ceil(wanted / (chunk - 1))


def timed_steps(chunk: int, epochs: int) -> int:
    return epochs * (chunk - 1)


def within_epochs(times: Sequence[float], chunk: int) -> float:
    """Seconds between step ends inside each epoch, the gaps across epochs left out."""
    return sum(times[i + 1] - times[i] for i in range(len(times) - 1)
               if (i + 1) % chunk != 0)


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
    figure.savefig(path, dpi=100)
    return path


# --- models and data ----------------------------------------------------------------------


def build_model(keras: Any, kind: str) -> Any:
    """The benchmark model, seeded, compiled with SGD."""
    if kind in ("lstm", "transformer"):
        return _compiled(keras, _sequence_model(keras, kind))
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
    return _compiled(keras, keras.Model(inputs, outputs))


def _sequence_model(keras: Any, kind: str) -> Any:
    """A text classifier on SEQUENCE token ids: an LSTM, or one transformer encoder block."""
    layers = keras.layers
    inputs = keras.Input((SEQUENCE,), dtype="int32")
    tokens = layers.Embedding(VOCABULARY, 64)(inputs)
    if kind == "lstm":
        x = layers.LSTM(64)(tokens)
    else:
        attended = layers.MultiHeadAttention(num_heads=4, key_dim=16)(tokens, tokens)
        x = layers.LayerNormalization()(layers.Add()([tokens, attended]))
        forward = layers.Dense(64)(layers.Dense(128, activation="relu")(x))
        x = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(layers.Add()([x, forward])))
    return keras.Model(inputs, layers.Dense(10, activation="softmax")(x))


def _compiled(keras: Any, model: Any) -> Any:
    _common.seeded_weights(model, SEED)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01),
                  loss="sparse_categorical_crossentropy")
    return model


def make_data(kind: str, rows: int) -> Tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(SEED)
    if kind in ("lstm", "transformer"):
        return (rng.integers(0, VOCABULARY, size=(rows, SEQUENCE)).astype(np.int32),
                rng.integers(0, 10, size=rows))
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


class Contender:
    """One replica count: its model, built and warmed up once, then measured each round."""

    def __init__(self, keras: Any, args: argparse.Namespace, replicas: int,
                 data: Tuple[Any, Any], report: Report) -> None:
        from kerasmgpu import api, batching

        self.keras, self.args, self.replicas, self.report = keras, args, replicas, report
        self.batch = global_batch(args.batch_size, args.batch_policy, replicas)
        self.plan = batching.plan_batch(self.batch, replicas)
        self.data = data
        self.template = build_model(keras, args.model)
        # gpus=1 would be the template itself; measure the plain model for 1 replica.
        self.model = (self.template if replicas == 1
                      else api.parallelize(self.template, gpus=replicas))
        self.chunk, self.epochs = 1, 1
        self.seconds: List[float] = []
        self.samples_per_s: List[float] = []

    def _fit(self, steps_per_epoch: int, epochs: int, label: str) -> List[float]:
        total = steps_per_epoch * epochs
        rows = self.batch * steps_per_epoch
        x, y = self.data[0][:rows], self.data[1][:rows]
        shown = [0.0]

        def progress(done: int) -> None:
            # A terminal line costs little, but not on every step of a fast model.
            now = time.perf_counter()
            if done == total or now - shown[0] > 0.25:
                shown[0] = now
                self.report.progress(f"{label} replicas={self.replicas} step {done}/{total}")

        callback, times = _step_timer(self.keras, progress)
        self.model.fit(x, y, batch_size=self.batch, epochs=epochs, shuffle=False, verbose=0,
                       callbacks=[callback])
        self.report.end_progress()
        if len(times) != total:
            raise RuntimeError(f"expected {total} steps, the callback saw {len(times)}")
        return times

    def warm_up(self, label: str) -> None:
        """Compile, and time a step to size the measurements."""
        warmup = max(self.args.warmup, 2)
        times = self._fit(warmup, 1, label)
        # The first step compiles; the ones after it are what a measurement repeats.
        step = (times[-1] - times[1]) / (len(times) - 2) if len(times) > 2 else (
            times[-1] - times[0])
        self.chunk, self.epochs = plan_steps(step, self.args.seconds, self.args.steps)

    @property
    def timed_steps(self) -> int:
        return timed_steps(self.chunk, self.epochs)

    def measure(self, label: str) -> float:
        times = self._fit(self.chunk, self.epochs, label)
        seconds = within_epochs(times, self.chunk)
        self.seconds.append(seconds)
        self.samples_per_s.append(self.batch * self.timed_steps / seconds
                                  if seconds > 0 else float("nan"))
        return self.samples_per_s[-1]

    def result(self) -> Dict[str, Any]:
        return {
            "replicas": self.replicas,
            "global_batch": self.batch,
            "per_replica_batch": self.plan.per_replica,
            "padding_rows": self.plan.pad,
            "steps": self.timed_steps,
            "rounds": len(self.samples_per_s),
            "seconds": round(statistics.median(self.seconds), 4),
            "samples_per_s_rounds": [round(v, 2) for v in self.samples_per_s],
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


def _measure(keras: Any, args: argparse.Namespace, counts: List[int],
             report: Report) -> List[Dict[str, Any]]:
    """Warm every count up, then time them in interleaved rounds; one row per count."""
    largest = global_batch(args.batch_size, args.batch_policy, counts[-1])
    data = make_data(args.model, largest * max(CHUNK_STEPS, args.warmup, 2))
    contenders = [Contender(keras, args, n, data, report) for n in counts]
    for i, contender in enumerate(contenders, start=1):
        contender.warm_up(f"warm-up [{i}/{len(counts)}]")
    for done in range(args.rounds):
        # Reversed every other round: no count always runs right after another.
        order = contenders if done % 2 == 0 else contenders[::-1]
        for contender in order:
            contender.measure(f"round {done + 1}/{args.rounds}")
        report.line(f"  round {done + 1}/{args.rounds}: " + ", ".join(
            f"replicas={c.replicas} {c.samples_per_s[-1]:.0f}/s" for c in contenders))
    figures = scaling({c.replicas: c.samples_per_s for c in contenders})
    measured = []
    for contender, extra in zip(contenders, figures):
        row = contender.result()
        row.update({k: v for k, v in extra.items() if k != "replicas"})
        measured.append(row)
    return measured


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
    with open(json_path, "w", encoding="utf-8") as handle:
        handle.write(_common.to_json(result) + "\n")
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
