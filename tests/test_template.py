"""The template is the truth both ways, against one device given the same state.

Every change a user makes to the model they built after `parallelize()` - set or load
weights, train or evaluate it, assign a variable, set the learning rate, freeze or
unfreeze layers and recompile - is what the next parallel call starts from, and every
state a parallel call changes (weights, optimizer state and learning rate) is in the
template afterwards. The reference is always a plain one-device model put through the
same changes and calls (203 rows, batch 40, so that the last batch is padded on 3
replicas). Keras 2.3's route is tested in test_legacy.py, several processes in
test_distributed.py.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    LINE,
    ON_JAX,
    ON_TORCH,
    REPLICAS,
    TF_LINES,
    assert_history_close,
    assert_weights_close,
    classification_data,
    deterministic_weights,
    gan_run,
    grid,
    keras_module,
    mlp,
    requires,
    seed_all,
)

import kerasmgpu
from kerasmgpu.env.versions import KerasLine
from kerasmgpu.training import model as parallel_model

# heavy: trains the most models; the middle releases leave it out (tox.ini).
pytestmark = [requires(in_process=True), pytest.mark.heavy]
if IN_PROCESS:
    keras = keras_module()
X, Y = classification_data(203)
FIT = dict(batch_size=40, epochs=1, shuffle=False, verbose=0)
N = REPLICAS[-1]
WEIGHTS_FILE = "w.weights.h5" if LINE is KerasLine.KERAS_3 else "w.h5"
MODEL_FILE = "m.keras" if LINE is KerasLine.KERAS_3 else "m.h5"


def _adam() -> Any:
    return keras.optimizers.Adam(0.01)


def _pair(optimizer: Callable[[], Any] = _adam) -> Any:
    return mlp(keras, optimizer=optimizer()), mlp(keras, optimizer=optimizer())


def _lr(model: Any) -> float:
    return float(np.asarray(model.optimizer.learning_rate))


def _optimizer_state(model: Any) -> list:
    variables = model.optimizer.variables
    variables = variables() if callable(variables) else variables
    return [np.asarray(v) for v in variables]


def _assert_optimizers_close(a: Any, b: Any) -> None:
    sa, sb = _optimizer_state(a), _optimizer_state(b)
    assert len(sa) == len(sb) > 1
    for u, v in zip(sa, sb):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
    assert _lr(a) == pytest.approx(_lr(b))


def _assert_same_outputs(single: Any, pmodel: Any) -> None:
    np.testing.assert_allclose(pmodel.predict(X, batch_size=40, verbose=0),
                               single.predict(X, batch_size=40, verbose=0), atol=1e-5)
    np.testing.assert_allclose(pmodel.evaluate(X, Y, batch_size=40, verbose=0),
                               single.evaluate(X, Y, batch_size=40, verbose=0), rtol=1e-5)


# --- template -> next parallel call --------------------------------------------------------


def _legacy_adam() -> Any:
    return keras.optimizers.legacy.Adam(0.01)


@pytest.mark.core
@pytest.mark.parametrize("optimizer", [
    _adam,
    # What `keras.optimizers.Adam` is on tf.keras 2.12 under `import keras`: it has no
    # `build`, and the template's optimizer got no state (a warning; Adam restarted on
    # the template).
    pytest.param(_legacy_adam, marks=requires(lines=TF_LINES), id="legacy")])
def test_training_the_template_between_parallel_calls(optimizer: Callable[[], Any]) -> None:
    """p.fit, m.fit, p.fit equals three epochs on one device (Adam: its moments too,
    and the learning rate a callback set while the template trained)."""
    single, template = _pair(optimizer)
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    # By position: on JAX the template is the parallel model itself (no copy).
    for turn, model in enumerate((pmodel, template, pmodel)):
        callbacks = [_lr_callback("LearningRateScheduler")] if turn == 1 else []
        single.fit(X, Y, callbacks=callbacks, **FIT)
        model.fit(X, Y, callbacks=[_lr_callback("LearningRateScheduler")] if callbacks else [],
                  **FIT)
    assert _lr(template) == pytest.approx(0.005)
    for model in (template, pmodel):
        single.train_on_batch(X[:40], Y[:40])
        model.train_on_batch(X[:40], Y[:40])
    assert_weights_close(single, template)
    assert_weights_close(single, pmodel)
    _assert_optimizers_close(single, template)
    _assert_same_outputs(single, pmodel)


def _change_weights(model: Any, how: str, tmp_path: Any) -> None:
    donor = mlp(keras, seed=7)
    if how == "set_weights":
        model.set_weights(donor.get_weights())
    elif how == "load_weights":  # the resume pattern: a checkpoint into the template
        path = str(tmp_path / WEIGHTS_FILE)
        if not (tmp_path / WEIGHTS_FILE).exists():
            donor.save_weights(path)
        model.load_weights(path)
    elif how == "one element assigned":
        kernel = model.layers[-1].kernel
        value = np.array(kernel.numpy())
        value[0, 0] += 0.25
        kernel.assign(value)
    elif how == "a kernel doubled":  # every element changed alike
        kernel = model.layers[1].kernel
        kernel.assign(kernel.numpy() * 2.0)


CHANGES = ["set_weights", "load_weights", "one element assigned", "a kernel doubled"]
CALLS = ["predict", "evaluate", "predict_on_batch", "test_on_batch", "train_on_batch", "fit"]


def _call(model: Any, call: str) -> Any:
    if call == "predict":
        return model.predict(X, batch_size=40, verbose=0)
    if call == "evaluate":
        return model.evaluate(X, Y, batch_size=40, verbose=0)
    if call == "predict_on_batch":
        return model.predict_on_batch(X[:41])
    if call == "test_on_batch":
        return model.test_on_batch(X[:41], Y[:41])
    if call == "train_on_batch":
        return model.train_on_batch(X[:41], Y[:41])
    return model.fit(X, Y, **FIT).history["loss"]


@pytest.mark.core
@grid(how=CHANGES, call=CALLS)
def test_a_change_to_the_template_reaches_the_next_call(how: str, call: str,
                                                        tmp_path: Any) -> None:
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    single.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)  # the replica has trained: a stale copy would show
    for model in (single, template):
        _change_weights(model, how, tmp_path)
    np.testing.assert_allclose(np.asarray(_call(pmodel, call), dtype=float),
                               np.asarray(_call(single, call), dtype=float),
                               rtol=1e-5, atol=1e-5)
    assert_weights_close(single, template)  # the call did not overwrite the change
    single.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)
    assert_weights_close(single, template)
    _assert_optimizers_close(single, template)


@pytest.mark.core
def test_a_learning_rate_set_on_either_model_is_used_and_kept() -> None:
    single, template = _pair(lambda: keras.optimizers.SGD(0.1, momentum=0.9))
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    pmodel.fit(X, Y, **FIT)
    single.fit(X, Y, **FIT)
    for model in (single, template):
        model.optimizer.learning_rate = 0.01
    pmodel.fit(X, Y, **FIT)
    single.fit(X, Y, **FIT)
    assert_weights_close(single, template)
    assert _lr(template) == _lr(pmodel) == pytest.approx(0.01)
    for model in (single, pmodel):  # set on the parallel model between two fits
        model.optimizer.learning_rate = 0.05
    pmodel.fit(X, Y, **FIT)
    single.fit(X, Y, **FIT)
    assert_weights_close(single, template)
    _assert_optimizers_close(single, template)


def _lr_callback(kind: str) -> Any:
    if kind == "ReduceLROnPlateau":
        return keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0,
                                                 min_delta=10.0)
    return keras.callbacks.LearningRateScheduler(lambda epoch, rate: float(rate) * 0.5)


@pytest.mark.core
@pytest.mark.parametrize("kind", ["ReduceLROnPlateau", "LearningRateScheduler"])
def test_a_learning_rate_changed_by_a_callback_is_in_the_template(kind: str,
                                                                  tmp_path: Any) -> None:
    """The parallel model's callbacks change its rate; the saved template resumes at
    the changed rate (tf_keras keeps it outside `optimizer.variables`)."""
    single, template = _pair(lambda: keras.optimizers.SGD(0.1, momentum=0.9))
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    fit = dict(FIT, epochs=3)
    h1 = _outcome(lambda: single.fit(X, Y, callbacks=[_lr_callback(kind)], **fit))
    h2 = _outcome(lambda: pmodel.fit(X, Y, callbacks=[_lr_callback(kind)], **fit))
    if isinstance(h1, Exception):  # Keras 3.3's ReduceLROnPlateau reads NumPy 2's np.Inf
        assert type(h2) is type(h1), (h2, h1)
        return
    assert_history_close(h1, h2)
    assert _lr(single) < 0.1
    assert _lr(template) == pytest.approx(_lr(single)) == pytest.approx(_lr(pmodel))
    template.save(str(tmp_path / MODEL_FILE))
    loaded = keras.models.load_model(str(tmp_path / MODEL_FILE))
    assert _lr(loaded) == pytest.approx(_lr(single))
    single.fit(X, Y, **FIT)
    loaded.fit(X, Y, **FIT)
    assert_weights_close(single, loaded)


@pytest.mark.core
def test_the_template_compiled_anew() -> None:
    """A new optimizer, loss and metrics compiled into the template after
    parallelize() are what the parallel model trains with."""
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    single.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)
    for model in (single, template):
        model.compile(keras.optimizers.SGD(0.05, momentum=0.5),
                      loss="sparse_categorical_crossentropy",
                      metrics=["sparse_categorical_accuracy"])
    h1 = single.fit(X, Y, **dict(FIT, epochs=2))
    h2 = pmodel.fit(X, Y, **dict(FIT, epochs=2))
    assert_history_close(h1, h2)
    assert_weights_close(single, template)
    _assert_optimizers_close(single, template)


# --- fine-tuning: trainable flags ------------------------------------------------------------


def _tunable() -> Any:
    seed_all(keras, 1)
    inputs = keras.Input((20,))
    hidden = keras.layers.Dense(16, activation="relu", name="base")(inputs)
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(hidden)
    return deterministic_weights(keras.Model(inputs, outputs), 1)


def _compile(model: Any, rate: float = 0.1) -> None:
    model.compile(keras.optimizers.SGD(rate, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def _base(model: Any) -> np.ndarray:
    return np.array(model.get_layer("base").get_weights()[0])


@pytest.mark.core
@pytest.mark.parametrize("where", ["template", "parallel model", "parallel model's layer"])
def test_fine_tuning_freeze_train_unfreeze_recompile_train(where: str) -> None:
    single, template = _tunable(), _tunable()
    for model in (single, template):
        model.get_layer("base").trainable = False
        _compile(model)
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    before = _base(single)
    single.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)
    np.testing.assert_array_equal(_base(template), before)
    single.get_layer("base").trainable = True
    _compile(single, 0.05)
    unfrozen = pmodel if where == "parallel model's layer" else template
    unfrozen.get_layer("base").trainable = True
    _compile(template if where == "template" else pmodel, 0.05)
    h1 = single.fit(X, Y, **dict(FIT, epochs=2))
    h2 = pmodel.fit(X, Y, **dict(FIT, epochs=2))
    assert_history_close(h1, h2)
    assert np.max(np.abs(_base(template) - before)) > 1e-3  # the base trains again
    assert_weights_close(single, template)
    assert template.get_layer("base").trainable and pmodel.get_layer("base").trainable


@pytest.mark.core
def test_a_layer_frozen_after_parallelize_does_not_move() -> None:
    single, template = _tunable(), _tunable()
    _compile(single)
    _compile(template)
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    single.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)
    for model in (single, template):
        model.get_layer("base").trainable = False
        _compile(model)
    before = _base(template)
    single.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)
    np.testing.assert_array_equal(_base(template), before)
    np.testing.assert_array_equal(_base(pmodel), before)
    assert_weights_close(single, template)


def _outcome(call: Callable[[], Any]) -> Any:
    """What `call` returns, or the exception it raised: what Keras does is the
    reference, an error included."""
    try:
        return call()
    except Exception as exc:
        return exc


@pytest.mark.core
def test_frozen_without_recompile_does_what_keras_does_on_one_device() -> None:
    """Keras applies a trainable flag at the next compile (tf.keras), at once (torch,
    an untraced step), or refuses (JAX: "must be a list of tensors corresponding 1:1"):
    the parallel model does the same."""
    single, template = _tunable(), _tunable()
    _compile(single)
    _compile(template)
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    single.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)
    for model in (single, template):
        model.get_layer("base").trainable = False
    expected = _outcome(lambda: single.fit(X, Y, **FIT))
    got = _outcome(lambda: pmodel.fit(X, Y, **FIT))
    if isinstance(expected, Exception):
        assert type(got) is type(expected), (got, expected)
        assert str(expected).split(".")[0] in str(got)
        return
    assert not isinstance(got, Exception), got
    assert_weights_close(single, template)


@pytest.mark.core
def test_a_gan_trains_each_model_as_compiled() -> None:
    """A discriminator compiled, then frozen to build the combined model, then
    parallelized: tf.keras / tf_keras train the layers trainable at compile, and the
    replica was compiled frozen (it never trained, silently: 5e-2 off in weights); on
    Keras 3 + TF the template's optimizer, built while nothing was trainable, missed the
    state of the parallel fit (a warning, and saving the template restarted Adam)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "layout" warning either
        got = gan_run(keras, N)
    expected = gan_run(keras, None)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for name, a, b in (("weights", got[1], expected[1]), ("optimizer", got[2], expected[2])):
        assert len(a) == len(b) > 1, name
        for u, v in zip(a, b):
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6, err_msg=name)


# --- the parallel model's own changes, BatchNorm, and the cost -----------------------------


@pytest.mark.core
@pytest.mark.parametrize("how", ["set_weights", "load_weights"])
def test_weights_put_into_the_parallel_model_are_in_the_template(how: str,
                                                                 tmp_path: Any) -> None:
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    pmodel.fit(X, Y, **FIT)
    single.fit(X, Y, **FIT)
    for model in (single, pmodel):
        _change_weights(model, how, tmp_path)
    assert_weights_close(single, template)  # at once, before any call
    _assert_same_outputs(single, pmodel)
    single.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)
    assert_weights_close(single, template)


def _with_batchnorm() -> Any:
    seed_all(keras, 3)
    inputs = keras.Input((20,))
    hidden = keras.layers.Dense(16)(inputs)
    hidden = keras.layers.BatchNormalization(name="bn")(hidden)
    outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    model = deterministic_weights(keras.Model(inputs, outputs), 3)
    _compile(model)
    return model


@pytest.mark.core
def test_batchnorm_statistics_set_on_the_template_reach_the_parallel_model() -> None:
    single, template = _with_batchnorm(), _with_batchnorm()
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    pmodel.fit(X, Y, **FIT)
    rng = np.random.default_rng(5)
    statistics = [rng.normal(size=w.shape).astype(w.dtype) ** 2
                  for w in template.get_layer("bn").get_weights()]
    for model in (single, template):
        model.set_weights(pmodel.get_weights())
        model.get_layer("bn").set_weights(statistics)
    _assert_same_outputs(single, pmodel)
    np.testing.assert_allclose(pmodel.get_layer("bn").get_weights()[3], statistics[3])


@pytest.mark.core
def test_batchnorm_statistics_of_a_model_built_in_scope_are_one() -> None:
    """Built in scope, the parallel model is the template: after training every replica
    holds the replicas' mean statistics, so it predicts as one model with its weights."""
    with kerasmgpu.scope(gpus=N):
        model = _with_batchnorm()
    pmodel = kerasmgpu.parallelize(model, gpus=N)
    pmodel.fit(X, Y, **FIT)
    single = _with_batchnorm()
    single.set_weights(pmodel.get_weights())
    np.testing.assert_allclose(pmodel.predict(X, batch_size=40, verbose=0),
                               single.predict(X, batch_size=40, verbose=0), atol=1e-5)


def _count_copies(monkeypatch: pytest.MonkeyPatch, pmodel: Any) -> list:
    adapter = parallel_model.state_of(pmodel).mirror.adapter  # type: ignore[union-attr]
    copied: list = []
    original = adapter.read_values

    def read_values(variables: Any) -> Any:
        copied.extend(variables)
        return original(variables)

    monkeypatch.setattr(adapter, "read_values", read_values)
    return copied


@pytest.mark.core
def test_a_predict_loop_copies_nothing_when_nothing_changed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    pmodel.fit(X, Y, **FIT)
    single.fit(X, Y, **FIT)
    pmodel.predict_on_batch(X[:8])
    copied = _count_copies(monkeypatch, pmodel)
    for start in range(0, 40, 8):
        pmodel.predict_on_batch(X[start:start + 8])
    assert copied == []
    bias = template.layers[-1].bias
    for model in (single, template):
        model.layers[-1].bias.assign(np.full(bias.shape, 0.5, "float32"))
    np.testing.assert_allclose(pmodel.predict_on_batch(X[:8]), single.predict_on_batch(X[:8]),
                               atol=1e-6)
    if pmodel is template:  # JAX trains the template itself: nothing is ever copied
        assert copied == []
        return
    assert len(copied) == 1 and copied[0] is bias  # one variable, not the model


@pytest.mark.core
@pytest.mark.parametrize("side", ["the model being fit", "the template"])
def test_a_change_made_at_train_end_is_kept(side: str) -> None:
    """fit() ends by giving the template the replica's state unless the replica still
    holds what the last epoch end copied: a callback's on_train_end changes one side."""
    if side == "the template" and not ON_JAX and not ON_TORCH:
        pytest.skip("on the TensorFlow routes fit's end copies the replica's state again, "
                    "over a template change made in on_train_end (README, Semantics: "
                    "telling would cost a hash on the devices)")
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=N)

    class SetBias(keras.callbacks.Callback):
        def on_train_end(self, logs: Any = None) -> None:
            model = template if side == "the template" and self.model is pmodel else self.model
            bias = model.layers[-1].bias
            bias.assign(np.full(bias.shape, 0.5, "float32"))

    history = pmodel.fit(X, Y, callbacks=[SetBias()], **FIT)
    expected = single.fit(X, Y, callbacks=[SetBias()], **FIT)
    assert_history_close(history, expected)
    # A change to the template is kept: the replica takes it at the next call.
    assert_weights_close(template, single)
    _assert_optimizers_close(template, single)
    _assert_same_outputs(single, pmodel)


@pytest.mark.core
@requires(jax=True)
def test_fit_copies_its_state_to_the_template_once_per_epoch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not once more at fit()'s end when nothing changed after the last epoch end (JAX:
    the change tokens of both sides are free to read)."""
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    pmodel.fit(X, Y, **FIT)
    copied = _count_copies(monkeypatch, pmodel)
    pmodel.fit(X, Y, **FIT)
    once = len(copied)
    # JAX trains the template itself: nothing is ever copied.
    assert once >= len(template.weights) or (pmodel is template and once == 0)
    pmodel.fit(X, Y, **dict(FIT, epochs=2))
    assert len(copied) == 3 * once  # before: 2 + 3 copies
    for _ in range(2):
        single.fit(X, Y, **FIT)
    single.fit(X, Y, **dict(FIT, epochs=2))
    assert_weights_close(template, single)
    _assert_optimizers_close(template, single)


# --- kerasmgpu.scope(): recompiling (issue 15, item 8) ---------------------------------------


@pytest.mark.core
@pytest.mark.parametrize("where", ["outside any scope", "in a new scope"])
def test_a_model_built_in_scope_recompiled_with_a_new_optimizer(where: str) -> None:
    single = mlp(keras, optimizer=keras.optimizers.SGD(0.1))
    with kerasmgpu.scope(gpus=N):
        model = mlp(keras, optimizer=keras.optimizers.SGD(0.1))
    pmodel = kerasmgpu.parallelize(model, gpus=N)
    assert pmodel is model
    single.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)
    single.compile(_adam(), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    if where == "in a new scope":
        with kerasmgpu.scope(gpus=N):
            pmodel.compile(_adam(), loss="sparse_categorical_crossentropy",
                           metrics=["accuracy"])
    else:
        pmodel.compile(_adam(), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    h1 = single.fit(X, Y, **dict(FIT, epochs=2))
    h2 = pmodel.fit(X, Y, **dict(FIT, epochs=2))
    assert_history_close(h1, h2)
    assert_weights_close(single, pmodel)
    _assert_optimizers_close(single, pmodel)


@pytest.mark.core
@pytest.mark.parametrize("built_in_scope", [False, True])
def test_recompiling_with_the_models_own_optimizer_keeps_its_state(
        built_in_scope: bool) -> None:
    """`compile(optimizer=model.optimizer, ...)` keeps the optimizer's state, as in Keras."""
    single = mlp(keras, optimizer=_adam())
    if built_in_scope:
        with kerasmgpu.scope(gpus=N):
            template = mlp(keras, optimizer=_adam())
    else:
        template = mlp(keras, optimizer=_adam())
    pmodel = kerasmgpu.parallelize(template, gpus=N)
    single.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)
    for model in (single, pmodel):
        model.compile(optimizer=model.optimizer, loss="sparse_categorical_crossentropy",
                      metrics=["sparse_categorical_accuracy"])
    h1 = single.fit(X, Y, **FIT)
    h2 = pmodel.fit(X, Y, **FIT)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)
    _assert_optimizers_close(single, template)


@pytest.mark.core
def test_one_engine_per_device_set() -> None:
    """Every scope() and parallelize() over the same devices shares one engine."""
    with kerasmgpu.scope(gpus=N) as first:
        pass
    with kerasmgpu.scope(gpus=N) as second:
        pass
    pmodel = kerasmgpu.parallelize(mlp(keras), gpus=N)
    assert first is second is parallel_model.state_of(pmodel).engine  # type: ignore[union-attr]
    if ON_JAX:
        assert first.distribution is second.distribution


@pytest.mark.core
@requires(tf=True)
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int64", "bool"])
def test_the_tensorflow_change_token_sees_every_change(dtype: str) -> None:
    """The on-device hash (TF lines) changes with any one element, and with changes
    that cancel out in a plain weighted sum (every element doubled, two swapped); XLA
    (used for variables on a GPU) computes the same hashes."""
    import tensorflow as tf

    from kerasmgpu.adapters import tensorflow as tf_internals

    rng = np.random.default_rng(0)
    start = (rng.normal(size=64) > 0) if dtype == "bool" else rng.normal(size=64) * 8 + 1
    variable = tf.Variable(start.astype(dtype))
    read = tf_internals.value_hasher([variable])
    xla = tf.function(lambda: tf_internals.bits_hash(tf, tf.convert_to_tensor(variable)),
                      jit_compile=True)
    first = read()[0]
    seen = {first}
    assert int(xla()) == first
    changes = [lambda v: np.logical_not(v) if dtype == "bool" else v * 2,
               lambda v: v[::-1].copy()]
    if dtype != "bool":
        changes.append(lambda v: np.where(np.arange(64) == 5, v + 1, v))
    for change in changes:
        variable.assign(change(variable.numpy()).astype(dtype))
        token = read()[0]
        assert token not in seen and int(xla()) == token
        seen.add(token)
    variable.assign(start.astype(dtype))
    assert read()[0] == first  # the same bits, the same token
