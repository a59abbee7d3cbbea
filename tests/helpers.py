"""Shared test helpers: the active Keras, small models, and exactness checks.

`requires(...)` is the one skip factory (Lightning's RunIf): its reason names what the
test needs and what this env has, so a skipped test in a CI log explains itself.
"""

from __future__ import annotations

import importlib
import itertools
import os
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pytest

import kerasmgpu
from kerasmgpu import registry
from kerasmgpu.env.versions import KerasLine

_ACTIVE = registry.active()
LINE, _VERSION, BACKEND = _ACTIVE.line, _ACTIVE.version, _ACTIVE.backend
ENV = kerasmgpu.environment()
ROUTE = ENV.route
TF_LINES = (KerasLine.TF_KERAS, KerasLine.TF_KERAS_LEGACY)
ON_TF = LINE in TF_LINES or (LINE is KerasLine.KERAS_3 and BACKEND == "tensorflow")
ON_JAX = LINE is KerasLine.KERAS_3 and BACKEND == "jax"
ON_TORCH = LINE is KerasLine.KERAS_3 and BACKEND == "torch"
ON_LEGACY = LINE is KerasLine.LEGACY
# Routes whose multi-device code runs in one process (torch needs `launch`).
IN_PROCESS = ON_TF or ON_JAX
VIRTUAL = int(os.environ.get("KERASMGPU_VIRTUAL_DEVICES", "1"))
REPLICAS = [n for n in (2, 3) if n <= VIRTUAL]


def grid(**axes: Sequence[Any]) -> Any:
    """`pytest.mark.parametrize` over the product of `axes`, its combinations outside a
    covering diagonal marked `wide`.

    The diagonal - combination t takes value t mod len of each axis - shows every value of
    every axis at least once; the older releases of the matrix run `core and not wide`
    (the diagonal), the newest run the whole grid (compat/README.md). The values of several
    names at once are given as one axis of tuples under a comma-joined key.
    """
    names = list(axes)
    values = [list(v) for v in axes.values()]
    if not all(values):  # an empty axis: no combination (pytest skips, saying so)
        return pytest.mark.parametrize(",".join(names), [])
    diagonal = {tuple(t % len(v) for v in values) for t in range(max(len(v) for v in values))}
    params = []
    for index in itertools.product(*(range(len(v)) for v in values)):
        row: tuple = ()
        for axis, i in zip(values, index):
            value = axis[i]
            row += value if isinstance(value, tuple) else (value,)
        marks = () if index in diagonal else (pytest.mark.wide,)
        params.append(pytest.param(*row, marks=marks))
    return pytest.mark.parametrize(",".join(names), params)


def one_replica_count(count: int) -> Any:
    """`parametrize("replicas", REPLICAS)` for a test whose subject is not the replica
    count: `count` runs in every env, the other counts are `wide` (the envs that run
    the whole grid run them all). The tests that use it pick 2 or 3 so that both counts
    run on every route (test_fastpath.py's tests of even and padded steps, and the
    acceptance tests of test_parallelize.py, keep both everywhere)."""
    return pytest.mark.parametrize("replicas", [
        n if n == count else pytest.param(n, marks=pytest.mark.wide) for n in REPLICAS])


def requires(*, tf: bool = False, jax: bool = False, torch: bool = False,
             in_process: bool = False, legacy: bool = False, tf_data: bool = False,
             lines: Optional[Sequence[KerasLine]] = None) -> Any:
    """Skip unless this env runs what the test needs; the reason says both sides."""
    needs = []
    ok = True
    if tf:
        needs.append("a TensorFlow route (tf.keras, tf_keras, Keras 3 + TF)")
        ok = ok and ON_TF
    if jax:
        needs.append("Keras 3 on JAX")
        ok = ok and ON_JAX
    if torch:
        needs.append("Keras 3 on PyTorch")
        ok = ok and ON_TORCH
    if legacy:
        needs.append("standalone Keras <= 2.3")
        ok = ok and ON_LEGACY
    if in_process:
        needs.append("an in-process multi-device route (TF or JAX)")
        ok = ok and IN_PROCESS
    if tf_data:
        needs.append("tensorflow installed (tf.data)")
        ok = ok and importlib.util.find_spec("tensorflow") is not None
    if lines is not None:
        needs.append("one of " + ", ".join(line.value for line in lines))
        ok = ok and LINE in lines
    have = f"this env: {LINE.value} {_VERSION}, backend {BACKEND or '-'}, route {ROUTE}"
    return pytest.mark.skipif(not ok, reason=f"needs {' and '.join(needs)}; {have}")


def keras_module() -> Any:
    if LINE is KerasLine.TF_KERAS_LEGACY:
        return importlib.import_module("tf_keras")
    if LINE is KerasLine.TF_KERAS:
        return importlib.import_module("tensorflow").keras
    return importlib.import_module("keras")


def seed_all(keras: Any, seed: int) -> None:
    setter = getattr(keras.utils, "set_random_seed", None)
    if setter is not None:
        setter(seed)
    np.random.seed(seed)


def deterministic_weights(model: Any, seed: int) -> Any:
    """Same initial weights on every Keras line (Keras 2.3 has no global seed)."""
    rng = np.random.default_rng(seed)
    model.set_weights([
        (rng.normal(scale=0.3, size=w.shape) if w.ndim > 1 else np.zeros(w.shape)).astype(w.dtype)
        for w in model.get_weights()
    ])
    return model


def mlp(keras: Any, *, seed: int = 1, features: int = 20, classes: int = 3,
        compile: bool = True, optimizer: Any = None, metrics: Any = ("accuracy",),
        **compile_kwargs: Any) -> Any:
    """A small functional classifier with deterministic initial weights."""
    seed_all(keras, seed)
    inputs = keras.Input((features,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    outputs = keras.layers.Dense(classes, activation="softmax")(hidden)
    model = deterministic_weights(keras.Model(inputs, outputs), seed)
    if compile:
        model.compile(
            optimizer=optimizer or keras.optimizers.SGD(learning_rate=0.1),
            loss="sparse_categorical_crossentropy",
            metrics=list(metrics),
            **compile_kwargs,
        )
    return model


def gan_run(keras: Any, gpus: Optional[int], steps: int = 4, **options: Any) -> Any:
    """Keras-GAN's pattern: a discriminator compiled, then frozen to build and compile
    the combined model with the generator; each step trains the discriminator on real
    and generated rows (unfrozen around its calls) and the generator through the
    combined model, on batches of 7 (uneven on 2 and 3 replicas). `gpus`: both models
    parallelized on that many devices (with `options`); None: plain Keras. Returns (the losses, the
    weights of both models, the discriminator's optimizer state)."""
    seed_all(keras, 1)
    layers = keras.layers
    real = keras.Input((3,))
    d = keras.Model(real, layers.Dense(1, activation="sigmoid")(
        layers.Dense(4, activation="tanh")(real)))
    d.compile(loss="binary_crossentropy", optimizer=keras.optimizers.Adam(0.01))
    noise = keras.Input((2,))
    g = keras.Model(noise, layers.Dense(3)(noise))
    d.trainable = False
    c = keras.Model(noise, d(g(noise)))
    c.compile(loss="binary_crossentropy", optimizer=keras.optimizers.Adam(0.01))
    for model in (d, g):
        deterministic_weights(model, 1)
    pd, pc = (d, c) if gpus is None else (kerasmgpu.parallelize(d, gpus, **options),
                                          kerasmgpu.parallelize(c, gpus, **options))
    rng = np.random.default_rng(0)
    ones, zeros = np.ones((7, 1), "float32"), np.zeros((7, 1), "float32")
    losses = []
    for _ in range(steps):
        x = rng.normal(size=(7, 3)).astype("float32")
        z = rng.normal(size=(7, 2)).astype("float32")
        fake = g.predict(z, verbose=0)
        d.trainable = True
        losses += [pd.train_on_batch(x, ones), pd.train_on_batch(fake, zeros)]
        d.trainable = False
        losses.append(pc.train_on_batch(z, ones))
    state = getattr(d.optimizer, "variables", None)  # Keras 2.3: `weights`
    state = state() if callable(state) else d.optimizer.weights if state is None else state
    read = getattr(keras.backend, "batch_get_value", lambda values: values)  # Keras 2.3's graph
    return ([float(np.ravel(v)[0]) for v in losses],
            [np.asarray(w) for w in d.get_weights() + g.get_weights()],
            [np.asarray(v) for v in read(state)])


def classification_data(rows: int = 1001, features: int = 20, classes: int = 3,
                         seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    w = rng.normal(size=(features, classes)).astype("float32")
    y = np.argmax(x @ w + rng.normal(scale=0.5, size=(rows, classes)), axis=1)
    return x, y.astype("int64")


def short_batch_data(rows: int = 22, features: int = 5) -> Any:
    """(x, y): rows of a linear regression target, for the tests of what a batch that
    does not divide does (22 rows in batches of 8 on 3 replicas: batches of 8 that do not
    divide, a last one of 6 that does)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features)).astype("float32")
    return x, (x @ rng.normal(size=(features, 1))).astype("float32")


def assert_refused_untouched(model: Any, call: Callable[[], Any], match: str) -> None:
    """`call()` raises a ValueError matching `match`, and `model`'s weights are as they
    were: refused before any weight moved."""
    start = [np.array(w) for w in model.get_weights()]
    with pytest.raises(ValueError, match=match):
        call()
    for a, b in zip(start, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def assert_weights_close(a: Any, b: Any, atol: float = 1e-5) -> None:
    wa, wb = a.get_weights(), b.get_weights()
    assert len(wa) == len(wb)
    for i, (u, v) in enumerate(zip(wa, wb)):
        np.testing.assert_allclose(u, v, atol=atol, rtol=1e-5, err_msg=f"weight {i}")


def assert_history_close(a: Any, b: Any, rtol: float = 1e-5) -> None:
    assert set(a.history) == set(b.history), (a.history.keys(), b.history.keys())
    for key in a.history:
        np.testing.assert_allclose(a.history[key], b.history[key], rtol=rtol, atol=1e-6,
                                   err_msg=key)


def engine_replicas(pmodel: Any) -> int:
    """The replica count the framework itself reports, not ours."""
    state = pmodel.__dict__["_kerasmgpu"]
    route = state.engine
    if hasattr(route, "strategy"):
        return int(route.strategy.num_replicas_in_sync)
    if hasattr(route, "distribution"):
        return int(np.prod(route.distribution.device_mesh.shape))
    return int(route.replicas)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, poll: float = 0.05) -> bool:
    """Poll until `condition()` holds; returns at once when it does. The bound only has
    to survive a loaded CI machine (every tox env at once on 2 cores)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return condition()
