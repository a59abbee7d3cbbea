"""The cost of `parallelize(verify=True)`: the same fit with the self-check on and off.

    KERASMGPU_VIRTUAL_DEVICES=2 python benchmarks/verify_cost.py [--replicas 2] [--repeats 5]

Two parallel copies of one MLP train on the same data alternately in one process, one
with `verify=True`, one without. The check runs at the start of every `fit` call, on
its first global batch and its first padded one (the default 4100 rows in batches of
256 end on a padded batch of 4 rows: two checked batches), each one loss and gradient
pass on the template on one device and one through the replicas; the other steps cost
nothing. Printed: each fit's median, the check's extra seconds per fit, and what one
training step of that fit costs, for scale. In-process routes only (TensorFlow, JAX);
the target is a loose bound on the whole fit.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("KERASMGPU_VIRTUAL_DEVICES", "2")

from _common import alternate, compile_model, data, keras_module, mlp, report

import kerasmgpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=4100)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    keras = keras_module()
    x, y = data(args.rows)
    checked = kerasmgpu.parallelize(compile_model(keras, mlp(keras)), gpus=args.replicas,
                                    verify=True)
    plain = kerasmgpu.parallelize(compile_model(keras, mlp(keras)), gpus=args.replicas,
                                  verify=False)
    fit = dict(batch_size=args.batch_size, epochs=1, verbose=0, shuffle=False)
    checked.fit(x, y, **fit)
    plain.fit(x, y, **fit)
    times = alternate({"verify=True": lambda: checked.fit(x, y, **fit),
                       "verify=False": lambda: plain.fit(x, y, **fit)}, args.repeats)
    env = kerasmgpu.environment()
    steps = -(-args.rows // args.batch_size)
    extra = statistics.median(a - b for a, b in zip(times["verify=True"],
                                                    times["verify=False"]))
    report(f"{args.replicas} virtual devices, {args.rows} rows, batch {args.batch_size} "
           f"({steps} steps, 2 checked), {env.keras_line.value} ({env.backend})",
           times, "verify=True", "verify=False", 2.0)
    step = statistics.median(times["verify=False"]) / steps
    print(f"  the check: {extra * 1000:.1f} ms per fit; one training step: "
          f"{step * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
