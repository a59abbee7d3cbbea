"""parallelize() gives single-device results on the same global batches - for real.

Every test trains a model built outside any scope on 2 or 3 virtual devices and the
same model on one device, and compares weights, losses, metrics, evaluation and
predictions. Batch and dataset sizes are chosen not to divide by the replica count,
and to leave a last batch shorter than the replica count.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    ON_JAX,
    ON_TF,
    REPLICAS,
    assert_history_close,
    assert_weights_close,
    classification_data,
    engine_replicas,
    keras_module,
    mlp,
    requires,
)

import kerasmgpu

pytestmark = requires(in_process=True)

if IN_PROCESS:
    keras = keras_module()
X, Y = classification_data(1001)


def _pair(**build: object):
    return mlp(keras, **build), mlp(keras, **build)


@pytest.mark.core
@pytest.mark.parametrize("replicas", REPLICAS)
def test_done_when_1001_samples_batch_50(replicas: int) -> None:
    """The issue's acceptance case: batch 50 over 1001 samples, built outside any scope."""
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    assert engine_replicas(pmodel) == replicas
    h1 = single.fit(X, Y, batch_size=50, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(X, Y, batch_size=50, epochs=2, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)  # the template holds the trained weights
    assert_weights_close(single, pmodel)
    e1 = single.evaluate(X, Y, batch_size=50, verbose=0)
    e2 = pmodel.evaluate(X, Y, batch_size=50, verbose=0)
    np.testing.assert_allclose(e1, e2, rtol=1e-5)
    p1 = single.predict(X, batch_size=50, verbose=0)
    p2 = pmodel.predict(X, batch_size=50, verbose=0)
    assert p2.shape == (1001, 3)
    np.testing.assert_allclose(p1, p2, atol=1e-5)


@pytest.mark.core
@pytest.mark.parametrize(
    "rows,batch",
    [(101, 50), (7, 4), (3, 10), (64, 32)],
    ids=["last-batch-1", "odd-batches", "one-short-batch", "divisible"],
)
def test_any_batch_and_dataset_size(rows: int, batch: int) -> None:
    replicas = REPLICAS[-1]
    x, y = X[:rows], Y[:rows]
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    h1 = single.fit(x, y, batch_size=batch, epochs=3, shuffle=False, verbose=0)
    h2 = pmodel.fit(x, y, batch_size=batch, epochs=3, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)
    assert pmodel.predict(x, batch_size=batch, verbose=0).shape == (rows, 3)


@pytest.mark.core
@pytest.mark.parametrize("replicas", REPLICAS)
def test_sample_weight_class_weight_and_validation(replicas: int) -> None:
    rng = np.random.default_rng(3)
    weights = rng.uniform(0.0, 2.0, size=len(X)).astype("float32")
    weights[:5] = 0.0  # zero-weight real rows still count in the mean's denominator
    val = (X[:203], Y[:203])
    single, template = _pair(weighted_metrics=["accuracy"])
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    kwargs = dict(batch_size=50, epochs=2, shuffle=False, verbose=0, validation_data=val)
    h1 = single.fit(X, Y, sample_weight=weights, **kwargs)
    h2 = pmodel.fit(X, Y, sample_weight=weights, **kwargs)
    assert "val_loss" in h2.history
    assert_history_close(h1, h2)
    assert_weights_close(single, template)
    cw = {0: 1.0, 1: 2.5, 2: 0.5}
    h1 = single.fit(X, Y, class_weight=cw, batch_size=64, epochs=1, shuffle=False,
                    verbose=0, validation_split=0.2)
    h2 = pmodel.fit(X, Y, class_weight=cw, batch_size=64, epochs=1, shuffle=False,
                    verbose=0, validation_split=0.2)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)
    e1 = single.evaluate(X, Y, sample_weight=weights, batch_size=77, verbose=0)
    e2 = pmodel.evaluate(X, Y, sample_weight=weights, batch_size=77, verbose=0)
    np.testing.assert_allclose(e1, e2, rtol=1e-5)


def _python_batches(x: np.ndarray, y: np.ndarray, batch: int):
    base = getattr(keras.utils, "PyDataset", None) or keras.utils.Sequence

    class Batches(base):  # type: ignore[misc, valid-type]
        def __len__(self) -> int:
            return -(-len(x) // batch)

        def __getitem__(self, i: int):
            return x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]

    return Batches()


@pytest.mark.core
def test_pydataset_or_sequence_input() -> None:
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    h1 = single.fit(_python_batches(X, Y, 64), epochs=2, verbose=0, shuffle=False)
    h2 = pmodel.fit(_python_batches(X, Y, 64), epochs=2, verbose=0, shuffle=False)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)
    p = pmodel.predict(_python_batches(X, Y, 64), verbose=0)
    assert p.shape == (1001, 3)


def test_generator_input() -> None:
    def gen():
        for i in range(0, len(X), 100):
            yield X[i:i + 100], Y[i:i + 100]

    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    h1 = single.fit(gen(), epochs=1, verbose=0)
    h2 = pmodel.fit(gen(), epochs=1, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)


@pytest.mark.core
@requires(tf=True)
def test_tf_data_input_with_partial_batch() -> None:
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(64)
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    h1 = single.fit(ds, epochs=2, verbose=0, validation_data=ds.take(2))
    h2 = pmodel.fit(ds, epochs=2, verbose=0, validation_data=ds.take(2))
    assert_history_close(h1, h2)
    assert_weights_close(single, template)
    np.testing.assert_allclose(single.evaluate(ds, verbose=0), pmodel.evaluate(ds, verbose=0),
                               rtol=1e-5)
    p = pmodel.predict(ds.map(lambda a, b: a), verbose=0)
    np.testing.assert_allclose(p, single.predict(X, verbose=0), atol=1e-5)


@pytest.mark.core
def test_on_batch_calls() -> None:
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    # After a fit whose last batch is padded: Keras 3.10 - 3.12 add the *_on_batch
    # results to the metric state fit left; on TF the parallel model's replicas each
    # counted the whole batch (test_on_batch 1.09 against 1.12 on one device).
    for model in (single, pmodel):
        model.fit(X[:203], Y[:203], batch_size=40, epochs=1, shuffle=False, verbose=0)
    for start in (0, 50, 100):
        xb, yb = X[start:start + 47], Y[start:start + 47]
        l1 = single.train_on_batch(xb, yb)
        l2 = pmodel.train_on_batch(xb, yb)
        np.testing.assert_allclose(l1, l2, rtol=1e-5)
    assert_weights_close(single, template)
    np.testing.assert_allclose(single.test_on_batch(X[:31], Y[:31]),
                               pmodel.test_on_batch(X[:31], Y[:31]), rtol=1e-5)
    out = pmodel.predict_on_batch(X[:31])
    assert np.asarray(out).shape == (31, 3)
    np.testing.assert_allclose(single.predict_on_batch(X[:31]), out, atol=1e-5)


def test_uncompiled_template_is_compiled_on_the_result(tmp_path) -> None:
    single = mlp(keras)
    template = mlp(keras, compile=False)
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    pmodel.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                   loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    h1 = single.fit(X, Y, batch_size=40, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(X, Y, batch_size=40, epochs=2, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    # "Save the template model": it reloads on one device with the trained weights.
    path = str(tmp_path / "template.keras") if hasattr(keras, "saving") else str(tmp_path / "t.h5")
    template.save(path)
    loaded = keras.models.load_model(path)
    assert_weights_close(single, loaded)
    np.testing.assert_allclose(loaded.evaluate(X, Y, verbose=0), single.evaluate(X, Y, verbose=0),
                               rtol=1e-5)


@pytest.mark.core
def test_compiled_template_optimizer_state_is_carried() -> None:
    single = mlp(keras, optimizer=keras.optimizers.Adam(1e-2))
    template = mlp(keras, optimizer=keras.optimizers.Adam(1e-2))
    single.fit(X, Y, batch_size=100, epochs=1, shuffle=False, verbose=0)
    template.fit(X, Y, batch_size=100, epochs=1, shuffle=False, verbose=0)
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    h1 = single.fit(X, Y, batch_size=100, epochs=1, shuffle=False, verbose=0)
    h2 = pmodel.fit(X, Y, batch_size=100, epochs=1, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)


def test_checkpoint_and_early_stopping(tmp_path) -> None:
    ext = ".keras" if hasattr(keras, "saving") else ".h5"
    path = str(tmp_path / f"best{ext}")
    single, template = _pair()
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])

    def callbacks():
        return [
            keras.callbacks.EarlyStopping(monitor="loss", patience=1,
                                          restore_best_weights=True, min_delta=0.5),
        ]

    h1 = single.fit(X, Y, batch_size=64, epochs=4, shuffle=False, verbose=0,
                    callbacks=callbacks())
    h2 = pmodel.fit(X, Y, batch_size=64, epochs=4, shuffle=False, verbose=0,
                    callbacks=callbacks() + [keras.callbacks.ModelCheckpoint(path)])
    assert len(h2.history["loss"]) == len(h1.history["loss"]) < 4
    assert_weights_close(single, template)  # restored best, then synced to the template
    loaded = keras.models.load_model(path)  # written by the parallel model, loads on one device
    assert len(loaded.get_weights()) == len(single.get_weights())
    np.testing.assert_allclose(loaded.predict(X[:10], verbose=0).shape, (10, 3))


def test_scope_is_zero_copy() -> None:
    single = mlp(keras)
    with kerasmgpu.scope(gpus=REPLICAS[-1]):
        model = mlp(keras)
    pmodel = kerasmgpu.parallelize(model, gpus=REPLICAS[-1])
    assert pmodel is model
    assert engine_replicas(pmodel) == REPLICAS[-1]
    h1 = single.fit(X, Y, batch_size=50, epochs=1, shuffle=False, verbose=0)
    h2 = pmodel.fit(X, Y, batch_size=50, epochs=1, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(single, model)


def test_multi_output_regularized_model() -> None:
    def build():
        keras.utils.set_random_seed(5)
        inputs = keras.Input((20,), name="features")
        hidden = keras.layers.Dense(
            12, activation="tanh", kernel_regularizer=keras.regularizers.l2(1e-3)
        )(inputs)
        a = keras.layers.Dense(3, activation="softmax", name="cls")(hidden)
        b = keras.layers.Dense(1, name="reg")(hidden)
        model = keras.Model(inputs, [a, b])
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss=["sparse_categorical_crossentropy", "mse"],
            loss_weights=[1.0, 0.5],
            metrics=[["accuracy"], ["mae"]],
        )
        return model

    target = (X[:, :1] * 2.0).astype("float32")
    single, template = build(), build()
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    h1 = single.fit(X, [Y, target], batch_size=50, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(X, [Y, target], batch_size=50, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(single, template)
    assert_history_close(h1, h2)  # total, per-output losses, and every metric
    out = pmodel.predict(X, batch_size=50, verbose=0)
    assert [o.shape[0] for o in out] == [1001, 1001]


def test_one_gpu_is_a_passthrough() -> None:
    model = mlp(keras)
    assert kerasmgpu.parallelize(model, gpus=1) is model
    assert kerasmgpu.parallelize(model, gpus=[0]) is model


def test_all_devices_by_default() -> None:
    pmodel = kerasmgpu.parallelize(mlp(keras))
    assert engine_replicas(pmodel) == kerasmgpu.environment(devices=True).virtual_devices
    assert kerasmgpu.route_for(pmodel).value == ("keras_distribution" if ON_JAX else "mirrored")
    assert ON_TF or ON_JAX
