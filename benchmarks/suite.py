"""kerasmgpu against the same engine written by hand, on four model shapes, even and padded.

    KERASMGPU_VIRTUAL_DEVICES=2 python benchmarks/suite.py [--models mlp,convnet,lstm,transformer]
        [--cases even,padded] [--replicas 2] [--repeats 5]

Run it once per route, in that route's environment (the active Keras decides):
Keras 3 on JAX (baseline: the model built and fit under `keras.distribution.DataParallel`
by hand), on TensorFlow, tf_keras and tf.keras 2 (baseline: built and fit in
`tf.distribute.MirroredStrategy(devices).scope()` by hand). Keras 3 on PyTorch trains
in several processes: `kerasmgpu launch --nproc 2 benchmarks/suite.py ...` (baseline:
Keras's own fit in each process on its share of every global batch, gradients averaged
by one hand-written all-reduce per step; see `_torch_by_hand`).

Models: `mlp` (64-256-256-10), `convnet` (two 3x3 convolutions on 16x16x3),
`lstm` (embedding, LSTM(32) text classifier on 40 tokens) and `transformer` (one
encoder block: 2-head self-attention, feed-forward, layer norms, on 32 tokens).
Cases: `even` - both get the same rows, every batch divides by the replica count;
`padded` - every epoch ends with a short batch: kerasmgpu's of 1 row, which it pads to
the replica count and masks; the baseline cannot take a batch that does not divide, so
its last batch has `replicas` rows (one row more per replica than kerasmgpu's real
one). Both take the same steps on the same shapes; what differs is kerasmgpu's padding
and mask. (Against a baseline that drops the remainder instead, kerasmgpu would also
pay for a whole step the baseline skips: up to 1/steps of the fit on a model whose step
time does not shrink with the rows, such as the LSTM's.) The contenders run alternately
in one process; each line gives the median time of each, the median of the per-round
ratios and their spread (min-max). Targets: even <= 1.03x, padded <= 1.05x.

Each round also times a fit of one batch (in `padded`: plus the short last batch), so
that each fit's time splits into time = fixed + steps x per-step: the right-hand
columns give the median ratio of the per-step times (the full steps, in both cases: the
issue's target is the overhead per step, checked against 1.03x) and kerasmgpu's extra
fixed time per fit in ms (its template copy, feed and callbacks - and in `padded` the
short last batch, padded and masked against the baseline's plain one). Both come from
differences of noisy timings: on a busy machine a single round can be far off; read
the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Any, Callable, Dict, List, Tuple

os.environ.setdefault("KERASMGPU_VIRTUAL_DEVICES", "2")
if os.environ.get("KERAS_BACKEND") == "jax" and "multi_thread_eigen" not in os.environ.get(
        "XLA_FLAGS", ""):
    # JAX's virtual CPU devices share XLA's intra-op thread pool; with it multi-threaded,
    # an all-reduce can wait for a device whose work is queued behind it, until XLA
    # aborts the process ("Termination timeout for all reduce"; measured with the
    # hand-written DataParallel alone too). One thread per device makes that rarer
    # (not impossible) and matches one device per core. Both contenders run so.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_multi_thread_eigen=false").strip()

from _common import MODELS, alternate, compile_model, keras_module, model_data

import kerasmgpu

TARGETS = {"even": 1.03, "padded": 1.05}
# Rows per model: a timed fit of a second or so on a 2-core CPU.
ROWS = {"mlp": 32768, "convnet": 4096, "lstm": 4096, "transformer": 8192}


def by_hand(keras: Any, build: Callable[[], Any], replicas: int) -> Any:
    """The same model on the route's own engine, as a user writes it without kerasmgpu."""
    if kerasmgpu.environment().backend == "torch":
        return _torch_by_hand(keras, build)
    if kerasmgpu.environment().backend == "jax":
        import jax

        dist = keras.distribution.DataParallel(devices=jax.devices()[:replicas])
        with dist.scope():
            model = compile_model(keras, build())

        class InScope:
            def __init__(self) -> None:
                self.model = model  # for benchmarks/counts.py

            def fit(self, *args: Any, **kwargs: Any) -> Any:
                with dist.scope():
                    return model.fit(*args, **kwargs)

        return InScope()
    import tensorflow as tf

    # The GPUs where there are any (as kerasmgpu takes them), else the virtual CPUs.
    listed = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    devices = [d.name for d in listed][:replicas]
    with tf.distribute.MirroredStrategy(devices).scope():
        return compile_model(keras, build())


def _torch_by_hand(keras: Any, build: Callable[[], Any]) -> Any:
    """Keras 3 on PyTorch has no multi-device form of its own: Keras's own `fit` in
    every process (`kerasmgpu launch --nproc N`) on that process's contiguous share of
    each global batch, the gradients averaged by hand over the processes - one flat
    `torch.distributed.all_reduce` per step before the optimizer applies them. That is
    kerasmgpu's torch engine without kerasmgpu (its feed, padding, metric sums and
    template), so the ratio is kerasmgpu's overhead. Call it after `parallelize()`,
    which has joined the process group."""
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    model = compile_model(keras, build())
    for variable in model.weights:  # built from one seed everywhere; make sure
        dist.broadcast(variable.value.data, 0)
    optimizer = model.optimizer
    own_apply = optimizer.apply

    def apply(grads: Any, trainable_variables: Any = None) -> Any:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= world
        averaged, start = [], 0
        for g in grads:
            averaged.append(flat[start:start + g.numel()].view_as(g))
            start += g.numel()
        return own_apply(averaged, trainable_variables)

    optimizer.apply = apply

    shares: Dict[Any, Any] = {}

    class Shares:
        def __init__(self) -> None:
            self.model = model  # for benchmarks/counts.py

        def fit(self, x: Any, y: Any, batch_size: int, **kwargs: Any) -> Any:
            import numpy as np

            share = batch_size // world
            key = (len(x), batch_size)  # one data set per length in the suite
            if key not in shares:  # sharded once, as a user would, outside the timing
                # Every hand batch divides by the processes (the suite sees to it): this
                # process's contiguous share of each, its short last batch included.
                rows = np.concatenate([
                    np.arange(start, min(start + batch_size, len(x))).reshape(world, -1)[rank]
                    for start in range(0, len(x), batch_size)])
                shares[key] = (x[rows], y[rows])
            local_x, local_y = shares[key]
            return model.fit(local_x, local_y, batch_size=share, **kwargs)

    return Shares()


def one(keras: Any, name: str, case: str, args: argparse.Namespace) -> Dict[str, Any]:
    rows = ROWS[name] // args.batch_size * args.batch_size
    # `padded`: kerasmgpu's epoch ends with a batch of 1 row, which it pads to the
    # replica count and masks; the hand-written engine cannot take that batch, so its
    # epoch ends with a batch of `replicas` rows instead - the same steps, the same
    # shapes, no mask: the difference is what kerasmgpu's padding costs.
    extra = args.replicas if case == "padded" else 0
    hx, hy = model_data(name, rows + extra)
    x, y = hx[:rows + min(extra, 1)], hy[:rows + min(extra, 1)]
    # One batch (and the short last batch): with the whole fit, splits each fit's time
    # into a fixed part and a part per step (see `split`).
    one_rows = args.batch_size
    ox, oy = _one_batch(x, y, one_rows, rows)
    ohx, ohy = _one_batch(hx, hy, one_rows, rows)

    def build() -> Any:
        return MODELS[name](keras)

    # On torch, one device per process of `kerasmgpu launch`: all of them.
    gpus = None if kerasmgpu.environment().backend == "torch" else args.replicas
    ours = kerasmgpu.parallelize(compile_model(keras, build()), gpus=gpus)
    hand = by_hand(keras, build, args.replicas)
    fit = dict(batch_size=args.batch_size, epochs=args.epochs, verbose=0, shuffle=False)
    hand.fit(hx, hy, **fit)  # compile/trace both before timing
    ours.fit(x, y, **fit)
    hand.fit(ohx, ohy, **fit)
    ours.fit(ox, oy, **fit)
    times = alternate({"hand": lambda: hand.fit(hx, hy, **fit),
                       "ours": lambda: ours.fit(x, y, **fit),
                       "hand1": lambda: hand.fit(ohx, ohy, **fit),
                       "ours1": lambda: ours.fit(ox, oy, **fit)}, args.repeats)
    if args.raw:
        for label, values in times.items():
            print(f"    {label:<6}" + " ".join(f"{v * 1000:6.0f}" for v in values), flush=True)
    ratios = [a / b for a, b in zip(times["ours"], times["hand"])]
    steps = rows // args.batch_size
    per_step, fixed = split(times, steps)
    return {"model": name, "case": case, "hand": statistics.median(times["hand"]),
            "ours": statistics.median(times["ours"]), "ratio": statistics.median(ratios),
            "low": min(ratios), "high": max(ratios), "steps": steps,
            "best": min(times["ours"]) / min(times["hand"]),
            "step_ratio": statistics.median(per_step), "step_low": min(per_step),
            "step_high": max(per_step), "fixed_ms": statistics.median(fixed) * 1000}


def _one_batch(x: Any, y: Any, one_rows: int, rows: int) -> Tuple[Any, Any]:
    """The first batch of `x`, and the rows after `rows` (the short last batch)."""
    take = list(range(one_rows)) + list(range(rows, len(x)))
    return x[take], y[take]


def split(times: Dict[str, List[float]], steps: int) -> Tuple[List[float], List[float]]:
    """Per round: the ratio of the two contenders' time per step, and kerasmgpu's extra
    fixed time per fit (seconds), from a fit of `steps` steps and a fit of one step,
    time = fixed + steps * per_step. The short last batch of `padded` rides in both fits
    of each contender, so its cost is in the fixed part, not the per-step part."""
    step_ratios, fixed = [], []
    for hand, ours, hand1, ours1 in zip(times["hand"], times["ours"], times["hand1"],
                                        times["ours1"]):
        hand_step = (hand - hand1) / (steps - 1)
        ours_step = (ours - ours1) / (steps - 1)
        step_ratios.append(ours_step / hand_step if hand_step > 0 else float("nan"))
        fixed.append((ours1 - ours_step) - (hand1 - hand_step))
    return step_ratios, fixed


def _each_in_its_own_process(pairs: List[Tuple[str, str]]) -> int:
    """One process per (model, case). With several hand-written `MirroredStrategy`s in
    one TensorFlow process, a later one can abort with "Shape mismatch in the collective
    instance" (measured on tf_keras 2.21 and Keras 3.15 + TF: the strategies' collective
    keys meet); and on JAX's CPU devices an all-reduce can stall XLA's thread pool and
    abort the process (see `main`) - then only that line is lost."""
    failed = 0
    for name, case in pairs:
        argv = sys.argv[1:] + ["--models", name, "--cases", case, "--child"]  # the last of a flag wins
        done = subprocess.run([sys.executable, os.path.abspath(__file__), *argv],
                              stdout=subprocess.PIPE, text=True)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith(name) or
                 ln.startswith("    ")]
        print("\n".join(lines) if lines else
              f"{name:<12}{case:<8}no result: the process ended with {done.returncode} "
              "(its error output is above)", flush=True)
        failed += done.returncode != 0
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--cases", default="even,padded")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1, help="epochs per timed fit()")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--raw", action="store_true", help="print every timed fit (ms)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    keras = keras_module()
    env = kerasmgpu.environment()
    if env.backend == "torch":
        args.replicas = int(os.environ.get("WORLD_SIZE", "1"))
        if args.replicas < 2:
            raise SystemExit("Keras 3 on PyTorch: run the suite with `kerasmgpu launch "
                             "--nproc 2 benchmarks/suite.py ...` (one process per replica)")
    quiet = os.environ.get("RANK", "0") != "0"  # several processes: rank 0 reports
    where = "processes" if env.backend == "torch" else "virtual devices"
    say = (lambda *a, **k: None) if quiet else print
    if not args.child:
        say(f"{env.keras_line.value} ({env.backend}), {args.replicas} {where}, global "
            f"batch {args.batch_size}, {args.epochs} epoch(s) per fit, {args.repeats} "
            "alternating rounds")
        say(f"{'model':<12}{'case':<8}{'hand ms':>9}{'ours ms':>9}{'ratio':>8}  spread"
            "       target        best   | steps  per-step ratio (spread)  fixed ms/fit")
    pairs = [(name, case) for name in args.models.split(",") for case in args.cases.split(",")]
    if len(pairs) > 1 and env.backend != "torch":
        return _each_in_its_own_process(pairs)
    for name, case in pairs:
        r = one(keras, name, case, args)
        target = TARGETS[case]
        say(f"{name:<12}{case:<8}{r['hand'] * 1000:9.0f}{r['ours'] * 1000:9.0f}"
            f"{r['ratio']:7.3f}x  {r['low']:.2f}-{r['high']:.2f}x  <= {target:.2f}x "
            f"{'ok   ' if r['ratio'] <= target else 'ABOVE'} {r['best']:6.3f}x | "
            f"{r['steps']:5d}  "
            f"{r['step_ratio']:6.3f}x ({r['step_low']:.2f}-{r['step_high']:.2f}x) "
            f"{'ok   ' if r['step_ratio'] <= TARGETS['even'] else 'ABOVE'} "
            f"{r['fixed_ms']:+7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
