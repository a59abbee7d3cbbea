"""The cost of `parallelize(sync_batchnorm=True)`: a BatchNorm convnet, sync on vs off.

    KERASMGPU_VIRTUAL_DEVICES=2 python benchmarks/sync_batchnorm.py [--replicas 2] [--repeats 7]

Two parallel copies of one convnet (two Conv -> BatchNormalization -> ReLU blocks, global
pooling, softmax) train on the same data, one with `sync_batchnorm=True` (masked moments
over the global batch: two all-reduces per BatchNormalization layer and step on the
TensorFlow routes, unfused layers; a masked moment on JAX), one without (each replica's
own statistics), alternately in one process. In-process routes only (TensorFlow, JAX);
on PyTorch the same all-reduces run between `kerasmgpu launch` processes. The ratio is
the price of one device's BatchNorm semantics; the target is a loose bound.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

os.environ.setdefault("KERASMGPU_VIRTUAL_DEVICES", "2")

from _common import alternate, keras_module, report

import kerasmgpu


def convnet(keras: Any, size: int, classes: int = 10) -> Any:
    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((size, size, 3))
    hidden = inputs
    for filters in (16, 32):
        hidden = layers.Conv2D(filters, 3, padding="same", use_bias=False)(hidden)
        hidden = layers.Activation("relu")(layers.BatchNormalization()(hidden))
    hidden = layers.GlobalAveragePooling2D()(hidden)
    model = keras.Model(inputs, layers.Dense(classes, activation="softmax")(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def main() -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--size", type=int, default=16, help="image side")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    keras = keras_module()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows, args.size, args.size, 3)).astype("float32")
    y = rng.integers(0, 10, size=args.rows)
    synced = kerasmgpu.parallelize(convnet(keras, args.size), gpus=args.replicas,
                                   sync_batchnorm=True)
    apart = kerasmgpu.parallelize(convnet(keras, args.size), gpus=args.replicas,
                                  sync_batchnorm=False)
    fit = dict(batch_size=args.batch_size, epochs=args.epochs, verbose=0, shuffle=False)
    synced.fit(x, y, **fit)
    apart.fit(x, y, **fit)
    times = alternate({"sync_batchnorm=True": lambda: synced.fit(x, y, **fit),
                       "sync_batchnorm=False": lambda: apart.fit(x, y, **fit)},
                      args.repeats)
    env = kerasmgpu.environment()
    report(f"{args.replicas} virtual devices, {args.rows} images {args.size}x{args.size}x3, "
           f"batch {args.batch_size}, {args.epochs} epochs per fit, "
           f"{env.keras_line.value} ({env.backend})",
           times, "sync_batchnorm=True", "sync_batchnorm=False", 1.25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
