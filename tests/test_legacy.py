"""kerasmgpu.legacy: Keras 2.3's `multi_gpu_model` and keras-extras' `make_parallel`.

In-process, on 2 and 3 virtual devices: the drop-ins train to single-device results
(batch 50 over 1001 samples, so the last batch has 1 row), the template holds the
trained weights, and the Keras 2.3 contract holds - a ValueError for fewer than 2
devices (legacy code catches it to fall back to one device) or for devices that do
not exist, a TypeError for non-bool `cpu_merge` / `cpu_relocation`. `install()` runs
in a subprocess, so the patched Keras modules never leak into other tests.

The legacy scripts under tests/legacy_projects/ are run by test_legacy_projects.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Union

import numpy as np
import pytest
from helpers import (
    _VERSION,
    BACKEND,
    IN_PROCESS,
    LINE,
    ON_JAX,
    ON_LEGACY,
    ON_TF,
    REPLICAS,
    ROUTE,
    assert_history_close,
    assert_weights_close,
    classification_data,
    engine_replicas,
    gan_run,
    keras_module,
    mlp,
    requires,
)

import kerasmgpu
from kerasmgpu import legacy
from kerasmgpu.env.devices import Device
from kerasmgpu.env.versions import KerasLine

pytestmark = pytest.mark.skipif(
    not (IN_PROCESS or ON_LEGACY),
    reason="needs an in-process multi-device route (TF or JAX) or standalone Keras <= 2.3; "
    f"this env: {LINE.value} {_VERSION}, backend {BACKEND or '-'}, route {ROUTE} "
    "(torch trains on several devices only under `kerasmgpu launch`)",
)

TESTS = Path(__file__).resolve().parent
if IN_PROCESS or ON_LEGACY:
    keras = keras_module()
X, Y = classification_data(1001)
MARKER = X.shape[1] - 1

def _compile(model: Any) -> None:
    """What legacy code does: compile the model multi_gpu_model returned."""
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def _fit(model: Any, x: Any = X, y: Any = Y) -> Any:
    return model.fit(x, y, batch_size=50, epochs=2, shuffle=False, verbose=0)


def _gpus_params() -> List[Any]:
    params: List[Any] = [pytest.param(n, id=f"gpus={n}") for n in REPLICAS]
    params.append(pytest.param([0, 1], id="gpus=[0,1]"))
    params.append(pytest.param(None, id="gpus=None"))
    return params


def _listed() -> List[Any]:
    """The devices the active engine lists here."""
    return list(kerasmgpu.environment(devices=True).devices or ())


def _device_count() -> int:
    """Devices multi_gpu_model can use here (the virtual ones, or real GPUs)."""
    return len(_listed())


def _replicas(gpus: Union[None, int, List[int]]) -> int:
    if gpus is None:
        return _device_count()
    return gpus if isinstance(gpus, int) else len(gpus)


def _marker_data() -> Any:
    """X with one feature that only the very last sample has (see test_legacy_projects)."""
    x = X.copy()
    x[:, MARKER] = 0.0
    x[-1, MARKER] = 1.0
    return x


# --- multi_gpu_model trains like one device ---------------------------------------------


@pytest.mark.core
@pytest.mark.parametrize("gpus", _gpus_params())
def test_multi_gpu_model_trains_like_one_device(gpus: Any, tmp_path: Any) -> None:
    single = mlp(keras)
    template = mlp(keras, compile=False)  # as in the Keras docs: compile the result
    pmodel = legacy.multi_gpu_model(template, gpus=gpus)
    assert (pmodel is template) == ON_JAX  # JAX trains the template in place
    assert kerasmgpu.route_for(pmodel).value == ROUTE
    assert engine_replicas(pmodel) == _replicas(gpus)
    _compile(pmodel)
    h1 = _fit(single)
    h2 = _fit(pmodel)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)  # "save the template model" saves these
    assert_weights_close(single, pmodel)
    # The saved template predicts what the parallel model and one device predict.
    path = str(tmp_path / ("template.keras" if LINE is KerasLine.KERAS_3 else "template.h5"))
    template.save(path)
    loaded = keras.models.load_model(path)
    expected = single.predict(X, batch_size=47, verbose=0)
    np.testing.assert_allclose(loaded.predict(X, batch_size=47, verbose=0), expected, atol=1e-5)
    np.testing.assert_allclose(pmodel.predict(X, batch_size=47, verbose=0), expected, atol=1e-5)


@pytest.mark.parametrize(
    "cpu_merge,cpu_relocation",
    [
        pytest.param(False, False, id="merge-on-first-device"),
        pytest.param(True, True, id="relocation"),
    ],
)
def test_cpu_merge_and_cpu_relocation_train_like_one_device(cpu_merge: bool,
                                                            cpu_relocation: bool) -> None:
    single = mlp(keras)
    template = mlp(keras, compile=False)
    pmodel = legacy.multi_gpu_model(template, gpus=2, cpu_merge=cpu_merge,
                                    cpu_relocation=cpu_relocation)
    _compile(pmodel)
    _fit(single)
    _fit(pmodel)
    assert_weights_close(single, template)


# Calls Keras refuses on an uncompiled model (tf.keras and Keras 2.3 also have the
# *_generator forms); predict and predict_on_batch work uncompiled on every line.
NEEDS_COMPILE = ["fit", "evaluate", "train_on_batch", "test_on_batch"] + (
    [] if LINE is KerasLine.KERAS_3 else ["fit_generator", "evaluate_generator"])


def _call(model: Any, name: str) -> Any:
    def batches() -> Any:
        while True:
            yield X[:50], Y[:50]

    if name in ("fit", "evaluate"):
        return getattr(model, name)(X, Y, batch_size=50, verbose=0)
    if name in ("train_on_batch", "test_on_batch"):
        return getattr(model, name)(X[:50], Y[:50])
    if name == "fit_generator":
        return model.fit_generator(batches(), steps_per_epoch=2, verbose=0)
    return model.evaluate_generator(batches(), steps=2)


@pytest.mark.core
@pytest.mark.parametrize("make", ["parallelize", "multi_gpu_model", "parallelize(gpus=[1])"])
def test_an_uncompiled_parallel_model_says_to_compile(make: str) -> None:
    from kerasmgpu._errors import NotCompiledError

    plain = mlp(keras, compile=False)  # one device, the same weights: what Keras does
    template = mlp(keras, compile=False)
    before = template.get_weights()
    pmodel = {"parallelize": lambda: kerasmgpu.parallelize(template, gpus=2),
              "multi_gpu_model": lambda: legacy.multi_gpu_model(template, gpus=2),
              "parallelize(gpus=[1])": lambda: kerasmgpu.parallelize(template, gpus=[1]),
              }[make]()
    assert (pmodel is template) == ON_JAX  # JAX trains the template in place
    for name in NEEDS_COMPILE:
        with pytest.raises(Exception) as keras_own:
            _call(plain, name)
        with pytest.raises(NotCompiledError) as info:
            _call(pmodel, name)
        # Caught by what catches Keras's own error on this line (RuntimeError on tf.keras
        # and Keras 2.3, ValueError on Keras 3), and in our received / allowed / fix form.
        assert isinstance(info.value, type(keras_own.value)), (name, keras_own.value)
        # tf.keras's fit_generator / evaluate_generator are fit / evaluate underneath.
        call = name if ON_LEGACY else name.replace("_generator", "")
        assert str(info.value).startswith("Invalid `model`. Received: model=")
        assert f"not compiled, in {call}()" in str(info.value)
        assert "Allowed: a compiled model for fit(), evaluate()" in str(info.value)
        assert ("Fix: call `compile(optimizer=..., loss=...)` on your model before "
                f"`parallelize()`, or on the model `parallelize()` returned, before {call}()"
                ) in str(info.value)
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)  # nothing touched
    # What Keras allows uncompiled still works, with one device's results.
    np.testing.assert_allclose(pmodel.predict(X, batch_size=50, verbose=0),
                               plain.predict(X, batch_size=50, verbose=0), atol=1e-6)
    np.testing.assert_allclose(pmodel.predict_on_batch(X[:7]), plain.predict_on_batch(X[:7]),
                               atol=1e-6)
    # Compiled afterwards, it trains like one device.
    _compile(pmodel)
    _compile(plain)
    _fit(plain)
    _fit(pmodel)
    assert_weights_close(plain, template)


def _double(variable: Any) -> None:
    if ON_LEGACY:  # graph mode: an assign is an op to run
        keras.backend.set_value(variable, keras.backend.get_value(variable) * 2.0)
    else:
        variable.assign(variable.numpy() * 2.0)


def _weights_of(model: Any) -> List[Any]:
    return [np.array(w) for w in model.get_weights()]


def _assert_same_predictions(single: Any, pmodel: Any) -> None:
    np.testing.assert_allclose(pmodel.predict(X, batch_size=47, verbose=0),
                               single.predict(X, batch_size=47, verbose=0), atol=1e-5)


SHARING = ["multi_gpu_model", "cpu_relocation=True", "parallelize(gpus=[1])"]


def _drop_in(template: Any, how: str) -> Any:
    if how == "parallelize(gpus=[1])":
        pmodel = kerasmgpu.parallelize(template, gpus=[1])
    else:
        pmodel = legacy.multi_gpu_model(template, gpus=2,
                                        cpu_relocation=how == "cpu_relocation=True")
    _compile(pmodel)
    return pmodel


@pytest.mark.core
@pytest.mark.parametrize("how", SHARING)
def test_the_drop_in_and_its_template_share_weights_both_ways(how: str) -> None:
    """As Keras 2.3's own multi_gpu_model (whose parallel model is built on the
    template's variables): the template's weights are the parallel model's - set,
    assigned, or read by a callback at an epoch end - on every line."""
    single = mlp(keras)
    template = mlp(keras, compile=False)
    pmodel = _drop_in(template, how)
    donor = mlp(keras, seed=7, compile=False).get_weights()
    for model in (single, template):
        model.set_weights(donor)
    _assert_same_predictions(single, pmodel)
    for model in (single, template):
        _double(model.layers[-1].kernel)
    _assert_same_predictions(single, pmodel)
    seen: List[Any] = []

    class SaveTemplate(keras.callbacks.Callback):  # the Keras 2.3 docs' pattern
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            seen.append(_weights_of(template))

    single.fit(X, Y, batch_size=50, epochs=1, shuffle=False, verbose=0)
    first = _weights_of(single)
    single.fit(X, Y, batch_size=50, epochs=1, shuffle=False, verbose=0)
    pmodel.fit(X, Y, batch_size=50, epochs=2, shuffle=False, verbose=0,
               callbacks=[SaveTemplate()])
    for saved, expected in zip(seen[0], first):  # this epoch's weights, not the last one's
        np.testing.assert_allclose(saved, expected, atol=1e-5)
    assert_weights_close(single, template)
    assert_weights_close(single, pmodel)


def test_points_new_code_to_parallelize(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(legacy, "_warned", False)
    with pytest.warns(DeprecationWarning, match=r"kerasmgpu\.parallelize"):
        legacy.multi_gpu_model(mlp(keras, compile=False), gpus=2)


# --- the ValueError contract, and the fallback legacy code builds on it --------------------


@pytest.mark.parametrize("gpus", [1, [0]], ids=["gpus=1", "gpus=[0]"])
def test_fewer_than_two_gpus_is_a_value_error(gpus: Any) -> None:
    with pytest.raises(ValueError, match="gpus >= 2"):
        legacy.multi_gpu_model(mlp(keras, compile=False), gpus=gpus)


def test_gpus_none_on_one_device_is_a_value_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(legacy, "_available", lambda *args: [Device("cpu", 0, "/cpu:0")])
    with pytest.raises(ValueError, match=r"gpus >= 2.*shows 1"):
        legacy.multi_gpu_model(mlp(keras, compile=False))


def test_more_gpus_than_exist_says_what_exists() -> None:
    available = [str(d) for d in _listed()]
    too_many = len(available) + 2  # gpus=5 on the 3 virtual devices of the test envs
    with pytest.raises(ValueError) as info:
        legacy.multi_gpu_model(mlp(keras, compile=False), gpus=too_many)
    message = str(info.value)
    assert str([f"/gpu:{i}" for i in range(too_many)]) in message
    for name in available:
        assert name in message
    assert "Try reducing `gpus`" in message
    with pytest.raises(ValueError, match="Try reducing `gpus`"):
        legacy.multi_gpu_model(mlp(keras, compile=False), gpus=[0, too_many])


@pytest.mark.core
@pytest.mark.parametrize(
    "gpus,error",
    [("2", TypeError), (True, TypeError), (2.0, TypeError), ([0, "1"], TypeError),
     ([0, 0], ValueError)],
    ids=["str", "bool", "float", "list-of-str", "duplicates"],
)
def test_bad_gpus_say_what_is_allowed(gpus: Any, error: type) -> None:
    with pytest.raises(error, match=r"Received: gpus=.*Allowed: .*Fix: "):
        legacy.multi_gpu_model(mlp(keras, compile=False), gpus=gpus)


def test_not_a_model_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="Keras model"):
        legacy.multi_gpu_model(object(), gpus=2)


def test_legacy_fallback_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Keras docs' Example 2: `except ValueError` falls back to the model itself."""
    single = mlp(keras)
    model = mlp(keras, compile=False)
    monkeypatch.setattr(legacy, "_available", lambda *args: [Device("cpu", 0, "/cpu:0")])
    try:
        parallel_model = legacy.multi_gpu_model(model, cpu_relocation=True)
    except ValueError:
        parallel_model = model
    assert parallel_model is model
    _compile(parallel_model)
    _fit(single)
    _fit(parallel_model)
    assert_weights_close(single, model)
    monkeypatch.undo()
    # With every device visible, the same code goes parallel (no ValueError this time).
    parallel_model = legacy.multi_gpu_model(mlp(keras, compile=False))
    assert engine_replicas(parallel_model) == _device_count()


@pytest.mark.parametrize(
    "name,value",
    [("cpu_merge", "yes"), ("cpu_merge", 1), ("cpu_relocation", None), ("cpu_relocation", 0)],
)
def test_cpu_flags_must_be_bool(name: str, value: Any) -> None:
    with pytest.raises(TypeError, match=rf"Received: {name}=.*True or False"):
        legacy.multi_gpu_model(mlp(keras, compile=False), gpus=2, **{name: value})


# --- make_parallel ---------------------------------------------------------------------------


def test_make_parallel_one_gpu_is_the_model_itself() -> None:
    model = mlp(keras, compile=False)
    assert legacy.make_parallel(model, 1) is model


@pytest.mark.parametrize(
    "gpu_count,error",
    [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError), ("2", TypeError)],
)
def test_make_parallel_bad_gpu_count(gpu_count: Any, error: type) -> None:
    with pytest.raises(error, match="gpu_count"):
        legacy.make_parallel(mlp(keras, compile=False), gpu_count)


@pytest.mark.core
def test_make_parallel_drops_nothing() -> None:
    """keras-extras' slices dropped `rows % gpu_count` rows; the last row must train here.

    The marker feature is nonzero only in the very last sample, which sits alone in the
    last batch (1001 = 20 * 50 + 1): its first-layer weights move only if that row
    reaches the gradient. A single-device run without it shows they stay put otherwise.
    """
    x = _marker_data()
    without_last = mlp(keras)
    _fit(without_last, x[:-1], Y[:-1])
    initial = mlp(keras, compile=False).get_weights()[0][MARKER]
    np.testing.assert_array_equal(without_last.get_weights()[0][MARKER], initial)

    single = mlp(keras)
    template = mlp(keras, compile=False)
    pmodel = legacy.make_parallel(template, 2)
    assert engine_replicas(pmodel) == 2
    _compile(pmodel)
    h1 = _fit(single, x)
    h2 = _fit(pmodel, x)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)
    assert np.any(template.get_weights()[0][MARKER] != initial)


# --- install(): unchanged legacy imports find the drop-in ---------------------------------

_INSTALL = """
import importlib, importlib.util, json, sys
sys.path.insert(0, {tests!r})
import kerasmgpu
import kerasmgpu.legacy as legacy
from helpers import keras_module, mlp

assert legacy.installed() is None
names = legacy.install()
assert legacy.installed() == names
ours = legacy.multi_gpu_model
from keras.utils import multi_gpu_model as a
import keras.utils.multi_gpu_utils
import keras.utils.training_utils
from keras.utils.multi_gpu_utils import multi_gpu_model as b
import keras
assert a is ours and b is ours
assert keras.utils.multi_gpu_utils.multi_gpu_model is ours
assert keras.utils.training_utils.multi_gpu_model is ours
tf_utils = None
if importlib.util.find_spec("tensorflow") is not None:
    try:
        importlib.import_module("tensorflow.keras.utils")
        tf_utils = True
    except ImportError:
        tf_utils = False
if tf_utils:
    from tensorflow.keras.utils import multi_gpu_model as c
    assert c is ours
print("RESULT", json.dumps({{"names": names, "tf_utils": tf_utils}}))
if {build}:
    pmodel = a(mlp(keras_module(), compile=False), gpus=2)
    print("ROUTE", kerasmgpu.route_for(pmodel).value)
"""


def _run_install(build: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["KERASMGPU_VIRTUAL_DEVICES"] = "2"
    code = _INSTALL.format(tests=str(TESTS), build=build)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.timeout(600)
def test_install_makes_legacy_imports_resolve_and_build() -> None:
    """One interpreter (each costs a framework import): the names, then a build."""
    out = _run_install(build=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    line = [row for row in out.stdout.splitlines() if row.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    names = result["names"]
    for module in ("keras.utils", "keras.utils.multi_gpu_utils", "keras.utils.training_utils"):
        assert f"{module}.multi_gpu_model" in names
    tf_names = [n for n in names if n.startswith("tensorflow.keras.utils")]
    assert bool(tf_names) == bool(result["tf_utils"]), result
    if ON_TF:
        assert result["tf_utils"], "tensorflow.keras.utils should import on a TF line"
    assert f"ROUTE {ROUTE}" in out.stdout


# --- parallelize() on Keras 2.3 goes through Keras's own multi_gpu_model -------------------


@requires(legacy=True)
@pytest.mark.parametrize("replicas", REPLICAS)
def test_parallelize_on_keras23_is_keras_multi_gpu_model(replicas: int) -> None:
    single = mlp(keras)
    template = mlp(keras)  # compiled: the route compiles the parallel model like it
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    assert kerasmgpu.route_for(pmodel).value == "multi_gpu_model"
    assert engine_replicas(pmodel) == replicas
    h1 = _fit(single)
    h2 = _fit(pmodel)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)


@requires(legacy=True)
def test_keras23_the_template_optimizer_and_flags_are_the_parallel_models() -> None:
    # Keras's multi_gpu_model kept an optimizer of its own and a graph built once: a
    # learning rate set on the template was not used (History 1.6e-1 off), the
    # template's `iterations` stayed 0, and a layer frozen on it and recompiled kept
    # training. 203 rows, batch 40: the last batch has 3 rows on 3 replicas.
    K = keras.backend
    x, y = X[:203], Y[:203]
    fit = dict(batch_size=40, epochs=1, shuffle=False, verbose=0)
    one, template = (mlp(keras, optimizer=keras.optimizers.Adam(0.001)) for _ in range(2))
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    for model in (one, template):
        K.set_value(model.optimizer.learning_rate, 0.01)
    assert_history_close(one.fit(x, y, **fit), pmodel.fit(x, y, **fit))
    assert K.get_value(template.optimizer.iterations) == K.get_value(one.optimizer.iterations)
    # The template trained alone goes on with the moments the parallel fit made.
    assert_history_close(one.fit(x, y, **fit), template.fit(x, y, **fit))
    for model in (one, template):
        model.layers[1].trainable = False
        model.compile(model.optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
    frozen = template.layers[1].get_weights()
    assert_history_close(one.fit(x, y, **fit), pmodel.fit(x, y, **fit))
    for before, after in zip(frozen, template.layers[1].get_weights()):
        np.testing.assert_array_equal(before, after)
    assert_weights_close(one, template)
    for u, v in zip(one.optimizer.get_weights(), template.optimizer.get_weights()):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pmodel.evaluate(x, y, batch_size=40, verbose=0),
                               one.evaluate(x, y, batch_size=40, verbose=0), rtol=1e-5)


@requires(legacy=True)
@pytest.mark.parametrize("sync_batchnorm", [True, False])
def test_keras23_a_gan_trains_each_model_as_compiled(sync_batchnorm: bool) -> None:
    # Keras 2.3 trains the weights a compile collected: the discriminator, compiled and
    # then frozen to build the combined model, was parallelized frozen, and the parallel
    # model compiled then never trained it (3e-2 off in weights, silently).
    got = gan_run(keras, REPLICAS[-1], sync_batchnorm=sync_batchnorm)
    expected = gan_run(keras, None)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for a, b in zip(got[1] + got[2], expected[1] + expected[2]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@requires(legacy=True)
def test_keras23_a_batchnorm_frozen_after_parallelize_stays_put() -> None:
    # The replicas' update ops were gathered into the template's lists when
    # multi_gpu_model built them: a BatchNormalization frozen afterwards (and
    # recompiled) kept updating its moving statistics in the parallel fit, and one
    # frozen before never updated again once unfrozen. One device follows the flags.
    x, y = X[:203], Y[:203]
    fit = dict(batch_size=40, epochs=1, shuffle=False, verbose=0)

    def build() -> Any:
        inputs = keras.Input((X.shape[1],))
        hidden = keras.layers.BatchNormalization(name="bn")(
            keras.layers.Dense(8, name="hidden")(inputs))
        model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))
        return model

    def recompile(model: Any, trainable: bool) -> Any:
        model.get_layer("bn").trainable = trainable
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
        return model.get_layer("bn").get_weights()

    moved = {}
    for trainable in (False, True):  # at parallelize(): the opposite
        one, template = build(), build()
        template.set_weights(one.get_weights())
        recompile(template, not trainable)
        pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
        for name, model, trains in (("one", one, one), ("parallel", template, pmodel)):
            before = recompile(model, trainable)
            trains.fit(x, y, **fit)
            moved[name, trainable] = max(float(np.max(np.abs(a - b))) for a, b in
                                         zip(before, model.get_layer("bn").get_weights()))
    assert moved["one", False] == moved["parallel", False] == 0.0, moved
    assert moved["one", True] > 1e-3 and moved["parallel", True] > 1e-3, moved


@requires(legacy=True)
def test_keras23_a_batch_with_fewer_rows_than_replicas_leaves_no_replica_empty() -> None:
    # Keras's slicing gave the first replicas of such a batch 0 rows, on which oneDNN's
    # Conv2D fails (TensorFlow 2.15 on a CPU where oneDNN is on: `Incompatible shapes`);
    # now its rows are repeated up to one per replica and the merged outputs cut back.
    rng = np.random.default_rng(4)
    x = rng.normal(size=(25, 6, 6, 1)).astype("float32")  # batches of 8: the last has 1
    y = rng.integers(0, 3, size=25)

    def build() -> Any:
        model = keras.Sequential([keras.layers.Conv2D(4, 3, input_shape=(6, 6, 1)),
                                  keras.layers.Flatten(),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        return model

    one, template = build(), build()
    template.set_weights(one.get_weights())
    pmodel = kerasmgpu.parallelize(template, gpus=3)
    slices = [layer.output for layer in pmodel.layers
              if set(getattr(layer, "arguments", None) or {}) == {"i", "parts"}]
    assert len(slices) == 3
    rows = [len(s) for s in keras.backend.function(pmodel.inputs, slices)([x[:1]])]
    assert min(rows) >= 1, rows
    fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert_history_close(one.fit(x, y, **fit), pmodel.fit(x, y, **fit))
    assert_weights_close(one, template)
    np.testing.assert_allclose(pmodel.evaluate(x, y, batch_size=8, verbose=0),
                               one.evaluate(x, y, batch_size=8, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(pmodel.predict(x, batch_size=8), one.predict(x, batch_size=8),
                               atol=1e-6)
