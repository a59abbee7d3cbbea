"""What keeping the template the truth costs per call: a predict_on_batch loop and a fit.

    KERASMGPU_VIRTUAL_DEVICES=2 python benchmarks/template_sync.py [--layers 8] [--width 256]

Before every call the parallel model asks whether the template changed
(`kerasmgpu.training.sync.before_call`: one token per variable - JAX array identity, a
torch version counter, an on-device hash on TensorFlow - and nothing is copied when
nothing changed). Timed in one process, alternately, on the same parallel model:

* `predict_on_batch` x N with the check, and with it switched off (the ratio is the
  cost of the check on the cheapest call there is);
* the same loop copying the whole template into the replica before every call (what
  a check that cannot tell "unchanged" would cost);
* a small `fit` (one short epoch) with and without the check;
* the check alone (`before_call` as predict makes it, and as fit makes it, which also
  reads the optimizer state and the trainable flags), per call, beside one copy of the
  whole template into the replica - the figure least disturbed by a busy machine.

Target: the check adds <= 10% to a predict_on_batch loop and <= 2% to a fit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable, Dict

os.environ.setdefault("KERASMGPU_VIRTUAL_DEVICES", "2")

from _common import alternate, data, keras_module, report

import kerasmgpu
from kerasmgpu.training import model as parallel_model
from kerasmgpu.training import sync


def build(keras: Any, layers: int, width: int, features: int = 64) -> Any:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((features,))
    hidden = inputs
    for _ in range(layers):
        hidden = keras.layers.Dense(width, activation="relu")(hidden)
        hidden = keras.layers.BatchNormalization()(hidden)
    outputs = keras.layers.Dense(10, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def unchecked(call: Callable[[], Any]) -> Callable[[], Any]:
    """`call` with the template check switched off (what the calls cost without it)."""

    def run() -> Any:
        original = sync.before_call
        sync.before_call = lambda *args, **kwargs: None  # type: ignore[assignment]
        try:
            return call()
        finally:
            sync.before_call = original  # type: ignore[assignment]

    return run


def copying(pmodel: Any, call: Callable[[], Any]) -> Callable[[], Any]:
    """`call` after copying the whole template into the replica (no check)."""
    template = parallel_model.state_of(pmodel).template  # type: ignore[union-attr]

    def run() -> Any:
        pmodel.__dict__["_kerasmgpu"].originals["set_weights"](pmodel, template.get_weights())
        return call()

    return unchecked(run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--calls", type=int, default=50, help="predict_on_batch calls per round")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rows", type=int, default=2048, help="rows of the timed fit")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    keras = keras_module()
    x, y = data(args.rows)
    pmodel = kerasmgpu.parallelize(build(keras, args.layers, args.width), gpus=args.replicas)
    batch = x[:args.batch]

    def loop() -> None:
        for _ in range(args.calls):
            pmodel.predict_on_batch(batch)

    def fit() -> None:
        pmodel.fit(x, y, batch_size=256, epochs=1, verbose=0, shuffle=False)

    loop()
    fit()
    # Two contenders per comparison: with three, one would always run in the middle.
    times = alternate({"predict_on_batch, template checked": loop,
                       "predict_on_batch, no check": unchecked(loop)}, args.repeats)
    copied = alternate({"predict_on_batch, template copied": copying(pmodel, loop),
                        "predict_on_batch, no check": unchecked(loop)}, args.repeats)
    env = kerasmgpu.environment()
    variables = len(pmodel.weights) + len(parallel_model.state_of(pmodel).mirror.adapter  # type: ignore[union-attr]
                                          .optimizer_state(pmodel.optimizer))
    title = (f"{args.replicas} devices, {args.layers}x{args.width} MLP + BatchNorm "
             f"({variables} state variables), {env.keras_line.value} ({env.backend})")
    report(f"{title}: {args.calls} predict_on_batch calls of {args.batch} rows", times,
           "predict_on_batch, template checked", "predict_on_batch, no check", 1.10)
    _per_call(times, args.calls, "predict_on_batch, template checked")
    _per_call(copied, args.calls, "predict_on_batch, template copied")
    fits = alternate({"fit, template checked": fit, "fit, no check": unchecked(fit)},
                     args.repeats)
    report(f"{title}: fit, {args.rows} rows, batch 256", fits, "fit, template checked",
           "fit, no check", 1.02)
    _check_alone(pmodel, statistics.median(times["predict_on_batch, no check"]) / args.calls)
    return 0


def _check_alone(pmodel: Any, call: float) -> None:
    state = parallel_model.state_of(pmodel)
    assert state is not None and state.mirror is not None
    mirror, template = state.mirror, state.template
    copy = pmodel.__dict__["_kerasmgpu"].originals["set_weights"]

    def per_call(run: Callable[[], Any], count: int = 200) -> float:
        run()
        start = time.perf_counter()
        for _ in range(count):
            run()
        return (time.perf_counter() - start) / count

    checks = {
        "check before predict (weights)":
            per_call(lambda: sync.before_call(mirror, training=False, collective=False)),
        "check before fit (+ optimizer, flags)":
            per_call(lambda: sync.before_call(mirror, training=True, collective=False)),
        "one copy of the whole template": per_call(
            lambda: copy(pmodel, template.get_weights()), 20),
    }
    print(f"\nthe check alone, per call (one unchecked predict_on_batch: {call * 1e3:.2f} ms)")
    for name, seconds in checks.items():
        print(f"  {name:<40} {seconds * 1e3:8.3f} ms ({seconds / call:.1%} of that call)")


def _per_call(times: Dict[str, Any], calls: int, name: str) -> None:
    base = statistics.median(times["predict_on_batch, no check"])
    extra = (statistics.median(times[name]) - base) / calls
    print(f"  {name}: {extra * 1e3:+.3f} ms per call "
          f"({statistics.median(times[name]) / base:.2f}x the unchecked loop beside it)")


if __name__ == "__main__":
    raise SystemExit(main())
