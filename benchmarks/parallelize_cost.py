"""What `parallelize()` itself costs on Keras 3 with JAX: its time and the device memory
it adds, for an MLP of 1.1M parameters trained once (Adam: its slots exist) on 3
virtual devices.

    KERAS_BACKEND=jax python benchmarks/parallelize_cost.py in-place
    KERAS_BACKEND=jax python benchmarks/parallelize_cost.py copy    # the old path

`in-place`: the user's model laid out on the devices (no copy); `copy`: the copy
kerasmgpu made before (forced by making `place_replicated` answer None). Run each in
a process of its own: JAX's device count is fixed at start-up.
"""

from __future__ import annotations

import gc
import sys
import time

import kerasmgpu


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "in-place"
    kerasmgpu.virtual_devices(3)
    import jax
    import keras
    import numpy as np

    from kerasmgpu.adapters.keras3_jax import Keras3Jax

    if mode == "copy":
        Keras3Jax.place_replicated = lambda self, *a: None  # type: ignore[method-assign]

    def held() -> int:  # bytes of every live array, each device's piece counted
        return sum(s.data.nbytes for a in jax.live_arrays() for s in a.addressable_shards)

    keras.utils.set_random_seed(0)
    inputs = keras.Input((1000,))
    hidden = keras.layers.Dense(640, activation="relu")(inputs)
    hidden = keras.layers.Dense(512, activation="relu")(hidden)
    hidden = keras.layers.Dense(256, activation="relu")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    x = np.random.rand(256, 1000).astype("float32")
    y = np.random.rand(256, 10).astype("float32")
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    # The engine (device listing, mesh) once on a small model: only the model is timed.
    kerasmgpu.parallelize(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), gpus=3)
    gc.collect()
    before = held()
    start = time.perf_counter()
    pmodel = kerasmgpu.parallelize(model, gpus=3)
    took = time.perf_counter() - start
    gc.collect()
    after = held()
    print(f"{mode}: {model.count_params()} parameters, parallelize() {took * 1000:.0f} ms, "
          f"device memory {before / 2**20:.1f} -> {after / 2**20:.1f} MiB, "
          f"returns the model itself: {pmodel is model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
