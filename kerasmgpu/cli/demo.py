"""`kerasmgpu demo`: one small model trained on every device and on one device, compared.

    kerasmgpu demo                     # all GPUs; 2 virtual CPU devices without GPUs
    kerasmgpu demo --replicas 3 --epochs 5 --batch-size 100 [--json]

It trains an MLP (64-128-10) on scikit-learn's 8x8 digits (1797 images shipped with
scikit-learn: no download; a fixed split of 1437 training and 360 validation images,
pixels scaled to [0, 1]) twice from the same initial weights and on the same batches
(shuffled once, in a fixed order): once as a plain model on one device, once through
`kerasmgpu.parallelize()` on N replicas. It prints the Keras line, the route and
all-reduce, the devices, how a global batch (and the epoch's last, short batch) is
split, padded and masked, samples/s of both runs over the epochs after the first (the
first one compiles), the validation accuracy of both and the largest weight difference
between them - which is kerasmgpu's promise: N replicas train what one device trains.
The verdict says what a training step did on the route taken (`describe()["step"]`):
gradients all-reduced, or, on Keras 2.3's multi_gpu_model, outputs concatenated.

Without GPUs the replicas are virtual CPU devices (`kerasmgpu.virtual_devices(N)`,
asked for before any framework starts; KERASMGPU_VIRTUAL_DEVICES=N, when set, is the
default N). They share the same CPU cores, so their speed is not a GPU's: no samples/s
is shown there (null in the JSON), only the results. The report says when the demo
made them itself: `kerasmgpu doctor` sees them only with `--virtual N` (or
KERASMGPU_VIRTUAL_DEVICES=N). Framework start-up log lines are hidden unless `--verbose`.

The torch backend: a replica is a process there, so outside `kerasmgpu launch` the demo
trains the single-device model only, says how to run the rest
(`kerasmgpu launch --nproc 2 -m kerasmgpu demo`), and exits 0. Under `kerasmgpu launch`
every worker trains and rank 0 prints.

Exit status: 0 when the runs agree (max weight difference <= TOLERANCE), 1 when they
do not or the multi-device run fails, 2 for a bad command line, a missing scikit-learn
or Keras, or more replicas than devices.

`--json`: standard output is one JSON object (the readable report goes to stderr):

    {"kerasmgpu": str, "environment": {keras_line, keras_version, backend, ...,
     device_kind, devices, gpu_name, cpu_cores, virtual_devices},
     "route": {"route": str, "engine": str, "replicas": int, "devices": [str],
               "all_reduce": str, "step": str} | {"error": str} | null,
              (kerasmgpu.describe(); null on torch outside `kerasmgpu launch`)
     "replicas": int, "virtual": bool,
     "virtual_devices_made_by_demo": bool,   (no GPU and none asked for: the demo split
              the CPU itself, which `kerasmgpu doctor` alone does not - see --virtual)
     "epochs": int, "batch_size": int,
     "data": {dataset, train, validation, features, classes},
     "batch_split": {"full": str, "last": str | null},
     "single": RUN, "parallel": RUN | null,
     "throughput_compared": bool,   (false on virtual devices: samples_per_s is null)
     "max_weight_difference": float | null, "tolerance": float,
     "agree": bool | null, "verdict": str, "notes": [str], "seconds": float}

    RUN = {"replicas": int, "samples_per_s": float | null, "timed_epochs": [int, ...],
           "epoch_seconds": [float, ...], "val_accuracy": float, "val_loss": float,
           "seconds": float}
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import textwrap
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from kerasmgpu._errors import explain
from kerasmgpu._version import __version__
from kerasmgpu.cli import _common
from kerasmgpu.cli._common import Report, UsageError

# Float32 sums in another order (per replica, then all-reduced) differ in the last bits;
# after a few epochs that stays around 1e-7 on CPU devices and 1e-6 on GPUs (NCCL and
# cuDNN reduce in their own order). A wrong split or scale would be off by 1e-2 or more.
TOLERANCE = 1e-4
TRAIN_ROWS = 1437  # 80% of 1797; the other 360 validate
HIDDEN = 128
SEED = 1234
DEFAULT_EPOCHS = 5
# 1437 = 14 x 100 + 37: every epoch ends on a short batch, and 100 splits unevenly
# over 3 replicas, so the padding and masking is visible in the printed split.
DEFAULT_BATCH = 100
# Said on virtual devices instead of a samples/s row (true of every route: it names no
# all-reduce, which Keras 2.3's multi_gpu_model does not do).
VIRTUAL_NOTE = (
    "these replicas are {what} sharing this machine's {cores} CPU core(s): "
    "how fast they train says nothing about GPUs (it is the cost of splitting each batch "
    "and combining the replicas' work, on the same cores), so the demo shows no samples/s "
    "here. What it shows is the result: the same model as 1 device. On GPUs each replica "
    "has a device of its own; `kerasmgpu bench` measures scaling there."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerasmgpu demo",
        description="Train a small model (MLP on scikit-learn's 8x8 digits) on every device "
        "and on one device from the same weights; compare speed, accuracy and weights.",
    )
    parser.add_argument(
        "--replicas", type=_common.positive_int("--replicas", "2"), default=None,
        help="replicas to train on (default: all GPUs; without GPUs, "
        f"KERASMGPU_VIRTUAL_DEVICES or {_common.DEFAULT_VIRTUAL} virtual CPU devices)",
    )
    parser.add_argument("--epochs", type=_common.positive_int("--epochs", "5"),
                        default=DEFAULT_EPOCHS, help=f"epochs (default {DEFAULT_EPOCHS})")
    parser.add_argument(
        "--batch-size", type=_common.positive_int("--batch-size", "100"), default=DEFAULT_BATCH,
        help=f"global batch size, split over the replicas (default {DEFAULT_BATCH})",
    )
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout (the report goes to stderr)")
    parser.add_argument("--verbose", action="store_true", help=_common.VERBOSE_HELP)
    return parser


def load_digits_split() -> Tuple[Any, Any, Any, Any]:
    """scikit-learn's digits: (x_train, y_train, x_val, y_val), fixed split, x in [0, 1]."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))
    x = (digits.data[order] / 16.0).astype("float32")
    y = digits.target[order].astype("int64")
    return x[:TRAIN_ROWS], y[:TRAIN_ROWS], x[TRAIN_ROWS:], y[TRAIN_ROWS:]


def build_model(keras: Any) -> Any:
    """The demo's MLP with seeded weights, compiled with plain SGD + momentum."""
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(inputs)
    outputs = keras.layers.Dense(10, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs)
    _common.seeded_weights(model, SEED)
    # SGD rather than Adam: Adam divides by the root of tiny second moments, which turns
    # last-bit float differences into visible ones; SGD shows the split's exactness.
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _epoch_timer(keras: Any, report: Report, label: str, epochs: int) -> Tuple[Any, List[float]]:
    """A callback that records each epoch's seconds and shows progress."""
    seconds: List[float] = []
    started: List[float] = []

    def begin(epoch: int, logs: Any = None) -> None:
        report.progress(f"{label}: epoch {epoch + 1}/{epochs}")
        started.append(time.perf_counter())

    def end(epoch: int, logs: Any = None) -> None:
        seconds.append(time.perf_counter() - started[-1])

    return keras.callbacks.LambdaCallback(on_epoch_begin=begin, on_epoch_end=end), seconds


def _train(model: Any, keras: Any, data: Tuple[Any, Any, Any, Any], args: argparse.Namespace,
           report: Report, label: str, replicas: int) -> Dict[str, Any]:
    x, y, x_val, y_val = data
    callback, seconds = _epoch_timer(keras, report, label, args.epochs)
    start = time.perf_counter()
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=False, verbose=0,
              callbacks=[callback])
    loss, accuracy = _common.evaluate(model, x_val, y_val, args.batch_size)
    total = time.perf_counter() - start
    report.end_progress()
    # The first epoch traces and compiles the step; it measures the compiler.
    timed = list(range(1, len(seconds))) if len(seconds) > 1 else [0]
    busy = sum(seconds[i] for i in timed)
    return {
        "replicas": replicas,
        "samples_per_s": len(x) * len(timed) / busy if busy > 0 else float("nan"),
        "timed_epochs": [i + 1 for i in timed],
        "epoch_seconds": [round(s, 4) for s in seconds],
        "val_accuracy": accuracy,
        "val_loss": loss,
        "seconds": round(total, 3),
    }


def _choose_replicas(args: argparse.Namespace, devices: Tuple[Any, ...], wanted: int) -> int:
    count = len(devices)
    if _common.has_gpu(devices):
        replicas = args.replicas or count
    else:
        replicas = wanted
    if replicas > count:
        shown = ", ".join(str(d) for d in devices) or "none"
        fix = (
            f"pass --replicas {count} or less, or check CUDA_VISIBLE_DEVICES"
            if _common.has_gpu(devices)
            else f"set KERASMGPU_VIRTUAL_DEVICES={replicas} before the framework starts "
            f"(or run `kerasmgpu demo --replicas {replicas}` in a fresh process)"
        )
        raise UsageError(explain("--replicas", replicas,
                                 f"at most {count}: this machine shows {shown}", fix))
    return replicas


@dataclass
class _Setup:
    """What the demo found and built before training: the environment, Keras, the
    devices, the replica count, the two models and the parallel one (or why not)."""

    env: Any
    keras: Any
    devices: Tuple[Any, ...]
    replicas: int
    torch_single: bool
    asked: Optional[int]
    single: Any = None
    template: Any = None
    parallel: Optional[Any] = None
    route: Optional[Dict[str, str]] = None
    failure: Optional[str] = None
    notes: List[str] = field(default_factory=list)

    @property
    def virtual(self) -> bool:
        """Replicas on virtual CPU devices: they share the cores, their speed is not
        a GPU's."""
        return not _common.has_gpu(self.devices) and self.replicas > 1


def _set_up(args: argparse.Namespace) -> _Setup:
    """Start the framework with the devices the demo needs and build the models."""
    from kerasmgpu import api

    if importlib.util.find_spec("sklearn") is None:
        raise UsageError(
            "the demo trains on scikit-learn's digits, and scikit-learn is not installed. "
            "Fix: pip install scikit-learn"
        )
    env = api.environment()
    if _common.keras_missing(env):
        raise UsageError(_common.no_keras_message())
    torch_single = _common.needs_launcher(env.route) and not _common.started_by_launcher()
    asked = _common.requested_virtual()
    wanted = args.replicas or asked or _common.DEFAULT_VIRTUAL
    # On torch outside launch one process is one replica: no virtual devices to ask for.
    env, keras, devices = _common.start(env, None if torch_single else wanted,
                                        verbose=args.verbose)
    # Under `kerasmgpu launch` the processes are the replicas: parallelize() takes them all.
    in_launch = _common.started_by_launcher()
    replicas = 1 if torch_single or in_launch else _choose_replicas(args, devices, wanted)
    setup = _Setup(env, keras, devices, replicas, torch_single, asked)
    setup.single = build_model(keras)
    setup.template = build_model(keras)  # same seeded weights as `single`
    if torch_single:
        setup.notes.append(
            "on the torch backend each replica is its own process: run `kerasmgpu launch "
            "--nproc 2 -m kerasmgpu demo` for the multi-device run."
        )
        return setup
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="kerasmgpu: one device available")
            setup.parallel = api.parallelize(setup.template,
                                             gpus=None if in_launch else replicas)
        setup.route = dict(api.describe(model=setup.parallel))
        if in_launch:
            setup.replicas = int(setup.route.get("replicas") or 1)
    except Exception as exc:  # reported, with the fix, as the demo's result
        setup.failure = f"{type(exc).__name__}: {exc}"
        setup.route = {"error": setup.failure}
    if setup.virtual:
        setup.notes.append(VIRTUAL_NOTE.format(what=_cpu_replicas(), cores=_common.cpu_cores()))
    return setup


def _cpu_replicas() -> str:
    """What replicas without a GPU are: processes under `kerasmgpu launch` (one CPU
    device each), virtual CPU devices of one process otherwise."""
    return "processes on the CPU" if _common.started_by_launcher() else "virtual CPU devices"


def _print_header(setup: _Setup, args: argparse.Namespace, report: Report, made: Optional[str],
                  split_full: str, split_last: Optional[str], rows: int, rows_val: int) -> None:
    replicas, route = setup.replicas, setup.route
    if setup.torch_single:
        report.line(f"kerasmgpu demo {__version__}: one small model trained on 1 device "
                    "(torch backend, outside `kerasmgpu launch`)")
    else:
        report.line(f"kerasmgpu demo {__version__}: one small model trained on "
                    f"{_plural(replicas, 'replica')} and on 1 device, from the same weights, "
                    "on the same batches")
    report.line()
    report.line(f"Keras      : {_common.line_label(setup.env)}")
    if setup.env.backend == "torch":
        from importlib import metadata

        try:
            torch_note = _common.untested_torch(metadata.version("torch"))
        except metadata.PackageNotFoundError:
            torch_note = None
        if torch_note:
            report.line(f"             note: {torch_note}")
    shown = ", ".join(str(d) for d in setup.devices) or "none listed"
    if _common.started_by_launcher():
        shown += f" in each of {_common.process_count()} processes"
    if setup.virtual:
        shown += f" - {_cpu_replicas()}, sharing {_common.cpu_cores()} CPU core(s)"
    report.line(f"devices    : {shown}")
    for text in textwrap.wrap(made or "", width=90):
        report.line(f"             {text}")
    if route is not None and "error" not in route:
        count = route.get("replicas", "?")
        engine = (f" - {route['engine']}, {count} replica{'' if count == '1' else 's'}, "
                  f"all-reduce: {route.get('all_reduce', '-')}" if route.get("engine") else "")
        report.line(f"route      : {route.get('route')}{engine}")
    report.line(f"data       : scikit-learn 8x8 digits, {rows} training / {rows_val} "
                "validation images, 64 pixels, 10 classes")
    report.line(f"model      : MLP 64-{HIDDEN}-10, SGD(0.1, momentum 0.9), {args.epochs} "
                f"epoch(s), global batch {args.batch_size}")
    if replicas > 1:
        report.line(f"batch split: {split_full}")
        if split_last:
            report.line(f"             last batch of each epoch: {split_last}")
    else:
        report.line("batch split: none - one replica takes every batch whole")
    report.line()


def _print_table(runs: List[Dict[str, Any]], replicas: int, throughput: bool,
                 report: Report) -> None:
    """Validation results side by side; samples/s only where it can be compared."""
    rows = [["", "1 device"] + ([_plural(replicas, "replica")] if len(runs) > 1 else [])]
    if throughput:
        timed = runs[0]["timed_epochs"]
        span = f"epochs {timed[0]}-{timed[-1]}" if len(timed) > 1 else f"epoch {timed[0]}"
        rows.append([f"samples/s ({span})"] + [f"{r['samples_per_s']:.0f}" for r in runs])
    rows.append(["validation accuracy"] + [f"{r['val_accuracy']:.4f}" for r in runs])
    rows.append(["validation loss"] + [f"{r['val_loss']:.4f}" for r in runs])
    for text in _common.table(rows, [False] + [True] * (len(rows[0]) - 1)):
        report.line(text)
    report.line()


def _verdict(setup: _Setup, difference: Optional[float], report: Report
             ) -> Tuple[str, int, Optional[bool]]:
    """The demo's verdict, its exit status and whether the runs agree. What it says a
    step did is the route's own account (`describe()["step"]`): an all-reduce on the
    routes that have one, concatenated outputs on Keras 2.3's multi_gpu_model."""
    replicas = setup.replicas
    if setup.failure is not None:
        return (f"FAILED: the {replicas}-replica run did not train: {setup.failure}. "
                "Run `kerasmgpu doctor` to see what is missing.", 1, None)
    if difference is None:
        return "1 device only - " + setup.notes[0], 0, None
    agree = difference <= TOLERANCE
    report.line(f"max weight difference: {difference:.2e} (tolerance {TOLERANCE:.0e})")
    if agree and replicas > 1:
        step = (setup.route or {}).get("step")
        how = f" In every step, {step}." if step else ""
        verdict = f"OK: {replicas} replicas trained the same model as 1 device.{how}"
    elif agree:
        verdict = ("OK, but with 1 replica there was nothing to split: "
                   "run `kerasmgpu doctor` to see why only one device is used.")
    else:
        verdict = (f"MISMATCH: the {replicas}-replica weights differ from 1 device's by "
                   f"{difference:.2e} (> {TOLERANCE:.0e}). Please report it with the "
                   "output of `kerasmgpu doctor --json`.")
    return verdict, 0 if agree else 1, agree


def run(args: argparse.Namespace, report: Report) -> Tuple[Dict[str, Any], int]:
    """The demo; returns the JSON result and the exit status."""
    from kerasmgpu import batching

    began = time.perf_counter()
    setup = _set_up(args)
    replicas, devices = setup.replicas, setup.devices
    made = (_common.made_virtual_note("the demo", len(devices), setup.asked)
            if _common.all_virtual(devices) and not _common.started_by_launcher() else None)
    data = load_digits_split()
    x, _, x_val, _ = data
    sizes = batching.batch_sizes(len(x), args.batch_size)
    padded = (setup.route or {}).get("remainder") != "sliced"
    split_full = batching.describe_split(sizes[0], replicas, padded=padded)
    split_last = (batching.describe_split(sizes[-1], replicas, padded=padded)
                  if sizes[-1] != sizes[0] else None)
    _print_header(setup, args, report, made, split_full, split_last, len(x), len(x_val))

    single, parallel, difference = _train_both(setup, data, args, report)
    verdict, status, agree = _conclude(setup, args, report, len(x), single, parallel,
                                       difference)
    result: Dict[str, Any] = {
        "kerasmgpu": __version__,
        "environment": _common.environment_summary(setup.env, devices),
        "route": _common.route_json(setup.route),
        "replicas": replicas,
        "virtual": setup.virtual,
        "virtual_devices_made_by_demo": made is not None,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "data": {"dataset": "sklearn.datasets.load_digits", "train": len(x),
                 "validation": len(x_val), "features": 64, "classes": 10},
        "batch_split": {"full": split_full, "last": split_last},
        "single": single,
        "parallel": parallel,
        "throughput_compared": not setup.virtual,
        "max_weight_difference": difference,
        "tolerance": TOLERANCE,
        "agree": agree,
        "verdict": verdict,
        "notes": setup.notes,
        "seconds": round(time.perf_counter() - began, 3),
    }
    return result, status


def _train_both(setup: _Setup, data: Tuple[Any, Any, Any, Any], args: argparse.Namespace,
                report: Report
                ) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]], Optional[float]]:
    """Train the one-device model, then the parallel one (when there is one): their runs
    and the largest weight difference between them. A failure of the parallel run is
    the demo's result (`setup.failure`), not an exception."""
    keras, replicas = setup.keras, setup.replicas
    single = _train(setup.single, keras, data, args, report, "1 device", 1)
    report.line(f"trained on 1 device in {single['seconds']:.1f} s")
    parallel: Optional[Dict[str, Any]] = None
    difference: Optional[float] = None
    if setup.parallel is not None:
        label = _plural(replicas, "replica")
        try:
            parallel = _train(setup.parallel, keras, data, args, report, label, replicas)
            shared = " (wall time on shared cores: not a speed, see the note)" if (
                setup.virtual) else ""
            report.line(f"trained on {label} in {parallel['seconds']:.1f} s{shared}")
            # The template receives the trained weights (parallelize()'s contract).
            difference = _common.max_weight_difference(setup.single, setup.template)
        except Exception as exc:  # reported as the demo's result
            report.end_progress()
            setup.failure = f"{type(exc).__name__}: {exc}"
    report.line()
    return single, parallel, difference


def _conclude(setup: _Setup, args: argparse.Namespace, report: Report, rows: int,
              single: Dict[str, Any], parallel: Optional[Dict[str, Any]],
              difference: Optional[float]) -> Tuple[str, int, Optional[bool]]:
    """The table of both runs, the note and the verdict; returns the verdict, the exit
    status and whether the weights agree (None: nothing compared)."""
    from kerasmgpu import batching

    replicas = setup.replicas
    runs = [single] + ([parallel] if parallel else [])
    # Virtual devices share the CPU's cores: their samples/s is no GPU's, so none is
    # shown (or written) for either run, rather than two figures that read as a speed-up.
    throughput = not setup.virtual
    if not throughput:
        for r in runs:
            r["samples_per_s"] = None
    _print_table(runs, replicas, throughput, report)
    verdict, status, agree = _verdict(setup, difference, report)
    if parallel is not None and replicas > 1 and throughput:
        setup.notes.append(
            f"this model is tiny ({batching.steps_per_epoch(rows, args.batch_size)} steps "
            f"of {args.batch_size} rows an epoch), so per-step overhead dominates samples/s: "
            "it shows that the replicas run, not how training scales. `kerasmgpu bench` "
            "measures scaling."
        )
    if parallel is not None and setup.notes:
        report.line("note: " + setup.notes[0])
    report.line(f"verdict: {verdict}")
    return verdict, status, agree


def main(argv: List[str]) -> int:
    """`kerasmgpu demo`; see the module docstring for options and exit status."""
    args = _parser().parse_args(argv)
    _common.quiet_frameworks(args.verbose)
    from kerasmgpu.env.cluster import is_chief

    report = Report(args.json, silent=not is_chief())
    real_stdout = sys.stdout
    try:
        # With --json, stdout is the JSON object alone; stray framework prints go to stderr.
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            result, status = run(args, report)
    except UsageError as exc:
        report.end_progress()
        print(f"kerasmgpu demo: {exc}", file=sys.stderr)
        return 2
    if args.json and is_chief():
        print(_common.to_json(result), file=real_stdout)
    return status
