"""`parallelize(model, gpus=1)` against plain `fit`, side by side in one process.

    python benchmarks/passthrough.py [--repeats 7] [--rows 20000] [--batch-size 256]

One device is a passthrough: the call returns the model itself, so the ratio should be
1.00 up to noise. Target: <= 1.02x.
"""

from __future__ import annotations

import argparse

from _common import alternate, compile_model, data, keras_module, mlp, report

import kerasmgpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs per timed fit() (longer runs, less noise)")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    keras = keras_module()
    x, y = data(args.rows)
    plain = compile_model(keras, mlp(keras))
    ours = kerasmgpu.parallelize(compile_model(keras, mlp(keras)), gpus=1)
    fit = dict(batch_size=args.batch_size, epochs=args.epochs, verbose=0, shuffle=False)
    plain.fit(x, y, **fit)  # warm up both: tracing and compilation are not measured
    ours.fit(x, y, **fit)
    times = alternate(
        {"plain model.fit": lambda: plain.fit(x, y, **fit),
         "parallelize(gpus=1).fit": lambda: ours.fit(x, y, **fit)},
        args.repeats,
    )
    report(f"one device, {args.rows} rows, batch {args.batch_size}, "
           f"{args.epochs} epochs per fit, "
           f"{kerasmgpu.environment().keras_line.value}",
           times, "parallelize(gpus=1).fit", "plain model.fit", 1.02)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
