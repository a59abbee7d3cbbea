"""N replicas through kerasmgpu against the same native engine written by hand.

    KERASMGPU_VIRTUAL_DEVICES=2 python benchmarks/overhead.py [--replicas 2] [--repeats 7]

The hand-written baseline is what a user writes without kerasmgpu: the model built and
compiled inside `tf.distribute.MirroredStrategy().scope()` (TensorFlow lines) or under
`keras.distribution.DataParallel` (Keras 3 on JAX), with a global batch divisible by the
replica count (native Keras 3 fails otherwise). Both run the same model, data and batch
size in one process, alternately. Target: <= 1.05x.

`--uneven`: kerasmgpu gets one sample more than the baseline, so every epoch ends with
a batch of 1 row that it pads to the replica count (the path users with any dataset
size hit); the baseline, which cannot take that batch, trains on the divisible rows.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("KERASMGPU_VIRTUAL_DEVICES", "2")

from _common import alternate, compile_model, data, keras_module, mlp, report

import kerasmgpu


def native(keras: os.PathLike, replicas: int) -> object:
    env = kerasmgpu.environment()
    if env.backend == "jax":
        import jax

        dist = keras.distribution.DataParallel(devices=jax.devices()[:replicas])
        with dist.scope():
            model = compile_model(keras, mlp(keras))

        class InScope:
            def fit(self, *args: object, **kwargs: object) -> object:
                with dist.scope():
                    return model.fit(*args, **kwargs)

        return InScope()
    import tensorflow as tf

    # The GPUs where there are any (as kerasmgpu takes them), else the virtual CPUs.
    listed = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    devices = [d.name for d in listed][:replicas]
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        return compile_model(keras, mlp(keras))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rows", type=int, default=20480)
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs per timed fit() (longer runs, less noise)")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--uneven", action="store_true",
                        help="one extra sample for kerasmgpu: a padded last batch of 1")
    args = parser.parse_args()
    keras = keras_module()
    x, y = data(args.rows + (1 if args.uneven else 0))
    hx, hy = x[:args.rows], y[:args.rows]
    hand = native(keras, args.replicas)
    ours = kerasmgpu.parallelize(compile_model(keras, mlp(keras)), gpus=args.replicas)
    fit = dict(batch_size=args.batch_size, epochs=args.epochs, verbose=0, shuffle=False)
    hand.fit(hx, hy, **fit)
    ours.fit(x, y, **fit)
    times = alternate(
        {"native strategy by hand": lambda: hand.fit(hx, hy, **fit),
         "kerasmgpu.parallelize": lambda: ours.fit(x, y, **fit)},
        args.repeats,
    )
    env = kerasmgpu.environment()
    rows = f"{args.rows} (+1 padded for kerasmgpu)" if args.uneven else str(args.rows)
    report(f"{args.replicas} virtual devices, {rows} rows, batch {args.batch_size}, "
           f"{args.epochs} epochs per fit, "
           f"{env.keras_line.value} ({env.backend})",
           times, "kerasmgpu.parallelize", "native strategy by hand", 1.05)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
