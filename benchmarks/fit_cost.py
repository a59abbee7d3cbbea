"""kerasmgpu's fixed cost per `fit` apart from its cost per step, against the engine by hand.

    KERASMGPU_VIRTUAL_DEVICES=2 python benchmarks/fit_cost.py [--model lstm]
        [--steps 1,2,4,8,16] [--repeats 9] [--profile STEPS]

Times fits of 1, 2, 4, ... steps of one epoch (global batch 256, even batches), the
two contenders alternately in one process (the suite's `by_hand` baseline), and fits
time = fixed + steps x per-step to each contender's medians. `--profile N` instead
runs `--repeats` fits of N steps of each under cProfile and prints where the host time
goes (kerasmgpu's functions, and the totals and call counts of both).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time
from typing import Any, Dict, List

os.environ.setdefault("KERASMGPU_VIRTUAL_DEVICES", "2")

from _common import MODELS, compile_model, keras_module, model_data
from suite import by_hand

import kerasmgpu


def profile(contenders: Dict[str, Any], fit: Any, repeats: int) -> None:
    for name, model in contenders.items():
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(repeats):
            fit(model)
        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        print(f"\n== {name}: {stats.total_calls} calls, {stats.total_tt * 1000 / repeats:.1f} "
              "ms per fit (under cProfile)")
        stats.sort_stats("cumulative").print_stats("kerasmgpu/", 25)
        print("\n".join(line for line in out.getvalue().splitlines()
                        if "kerasmgpu/" in line or "ncalls" in line))


def main() -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lstm", choices=list(MODELS))
    parser.add_argument("--steps", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS")
    args = parser.parse_args()
    keras = keras_module()
    counts = [int(s) for s in args.steps.split(",")]
    batch = args.batch_size
    x, y = model_data(args.model, batch * max(counts + [args.profile]))

    def build() -> Any:
        return MODELS[args.model](keras)

    contenders = {"hand": by_hand(keras, build, 2),
                  "ours": kerasmgpu.parallelize(compile_model(keras, build()), gpus=2)}
    options = dict(batch_size=batch, epochs=1, verbose=0, shuffle=False)
    for model in contenders.values():
        for steps in set(counts + [args.profile or 1]):
            model.fit(x[:steps * batch], y[:steps * batch], **options)  # trace first
    if args.profile:
        profile(contenders, lambda m: m.fit(x[:args.profile * batch],
                                            y[:args.profile * batch], **options),
                args.repeats)
        return 0
    times: Dict[str, Dict[int, List[float]]] = {n: {s: [] for s in counts} for n in contenders}
    for round_ in range(args.repeats):
        for steps in counts:
            order = list(contenders) if round_ % 2 == 0 else list(contenders)[::-1]
            for name in order:
                start = time.perf_counter()
                contenders[name].fit(x[:steps * batch], y[:steps * batch], **options)
                times[name][steps].append(time.perf_counter() - start)
    print(f"{args.model}, global batch {batch}, {args.repeats} alternating rounds; "
          "median ms per fit of N steps")
    for name in contenders:
        medians = [statistics.median(times[name][s]) for s in counts]
        slope, fixed = np.polyfit(counts, medians, 1)
        cells = " ".join(f"{s}:{m * 1000:.1f}" for s, m in zip(counts, medians))
        print(f"  {name}: {cells}  -> fixed {fixed * 1000:.1f} ms + {slope * 1000:.2f} ms/step")
    for steps in counts:
        ratios = [a / b for a, b in zip(times["ours"][steps], times["hand"][steps])]
        extra = statistics.median(times["ours"][steps]) - statistics.median(times["hand"][steps])
        print(f"  {steps:3d} steps: ours/hand {statistics.median(ratios):.3f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f}), ours - hand {extra * 1000:+.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
