"""Shared by the benchmarks: the active Keras, a model, data, and side-by-side timing.

The machine these run on is shared and noisy, so every benchmark times its two
contenders alternately in one process, repeats, and reports the median of the ratios.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def keras_module() -> Any:
    """The active Keras namespace, as kerasmgpu itself loads it."""
    from kerasmgpu import adapters, registry

    return adapters.load(registry.active()).keras


def mlp(keras: Any, features: int = 64, width: int = 256, classes: int = 10,
        seed: int = 0) -> Any:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((features,))
    hidden = keras.layers.Dense(width, activation="relu")(inputs)
    hidden = keras.layers.Dense(width, activation="relu")(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax")(hidden)
    return keras.Model(inputs, outputs)


def convnet(keras: Any, side: int = 16, classes: int = 10, seed: int = 0) -> Any:
    """A small convnet on side x side x 3 images."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((side, side, 3))
    hidden = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    hidden = keras.layers.MaxPooling2D()(hidden)
    hidden = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(hidden)
    hidden = keras.layers.GlobalAveragePooling2D()(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax")(hidden)
    return keras.Model(inputs, outputs)


def lstm(keras: Any, vocabulary: int = 1000, length: int = 40, classes: int = 2,
         seed: int = 0) -> Any:
    """An LSTM text classifier on token ids."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((length,), dtype="int32")
    hidden = keras.layers.Embedding(vocabulary, 32)(inputs)
    hidden = keras.layers.LSTM(32)(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax")(hidden)
    return keras.Model(inputs, outputs)


def transformer(keras: Any, vocabulary: int = 1000, length: int = 32, classes: int = 2,
                seed: int = 0) -> Any:
    """One transformer encoder block (self-attention, feed-forward, residuals and layer
    norms) on token ids, pooled into a classifier."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inputs = keras.Input((length,), dtype="int32")
    tokens = layers.Embedding(vocabulary, 32)(inputs)
    attended = layers.MultiHeadAttention(num_heads=2, key_dim=16)(tokens, tokens)
    hidden = layers.LayerNormalization()(layers.Add()([tokens, attended]))
    forward = layers.Dense(32)(layers.Dense(64, activation="relu")(hidden))
    hidden = layers.LayerNormalization()(layers.Add()([hidden, forward]))
    outputs = layers.Dense(classes, activation="softmax")(layers.GlobalAveragePooling1D()(hidden))
    return keras.Model(inputs, outputs)


# The suite's model shapes: builder, and the data each takes (see `model_data`).
MODELS: Dict[str, Callable[..., Any]] = {
    "mlp": mlp, "convnet": convnet, "lstm": lstm, "transformer": transformer}


def model_data(name: str, rows: int) -> Tuple[Any, Any]:
    """Inputs and integer targets for the suite's model `name`."""
    import numpy as np

    rng = np.random.default_rng(0)
    if name == "mlp":
        return data(rows)
    if name == "convnet":
        return (rng.normal(size=(rows, 16, 16, 3)).astype("float32"),
                rng.integers(0, 10, size=rows))
    length = 40 if name == "lstm" else 32
    return (rng.integers(0, 1000, size=(rows, length)).astype("int32"),
            rng.integers(0, 2, size=rows))


def compile_model(keras: Any, model: Any) -> Any:
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def data(rows: int, features: int = 64, classes: int = 10) -> Tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = rng.integers(0, classes, size=rows)
    return x, y


def alternate(contenders: Dict[str, Callable[[], None]], repeats: int) -> Dict[str, List[float]]:
    """Run each contender once per round, alternating order, and record seconds."""
    times: Dict[str, List[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(repeats):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return times


def ratio(times: Dict[str, List[float]], ours: str, baseline: str) -> float:
    return statistics.median(a / b for a, b in zip(times[ours], times[baseline]))


def report(title: str, times: Dict[str, List[float]], ours: str, baseline: str,
           target: float) -> float:
    value = ratio(times, ours, baseline)
    print(f"\n{title}")
    for name, values in times.items():
        print(f"  {name:<34} median {statistics.median(values) * 1000:9.1f} ms "
              f"(n={len(values)})")
    verdict = "ok" if value <= target else "ABOVE TARGET"
    print(f"  ratio {ours} / {baseline} = {value:.3f}x (target <= {target:.2f}x): {verdict}")
    return value
