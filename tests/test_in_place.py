"""Keras 3 on JAX trains the user's own model: parallelize() lays its variables out on
the route's devices in place (replicated) and makes no copy - against one device.

So what a copy could miss is right by construction: a private Python attribute a layer
reads in `call()`, changed after parallelize(), and a layer that holds another layer (an
output projection tied to an Embedding: no config rebuilds it, so a copy was refused).
Every batch size leaves an uneven last batch (padded on the replicas).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    REPLICAS,
    assert_history_close,
    assert_weights_close,
    classification_data,
    keras_module,
    mlp,
    requires,
    seed_all,
)

import kerasmgpu

pytestmark = requires(jax=True, in_process=True)
if IN_PROCESS:
    keras = keras_module()

X, Y = classification_data(203)  # batches of 40: the last one has 3 rows
FIT = dict(batch_size=40, epochs=2, shuffle=False, verbose=0)


def _devices(variable):
    return set(variable.value.sharding.device_set)


@pytest.mark.core
def test_the_parallel_model_is_the_users_model_laid_out_in_place(tmp_path) -> None:
    single = mlp(keras, optimizer=keras.optimizers.Adam(0.01))
    template = mlp(keras, optimizer=keras.optimizers.Adam(0.01))
    single.fit(X[:40], Y[:40], batch_size=40, verbose=0)  # built optimizer and metrics
    template.fit(X[:40], Y[:40], batch_size=40, verbose=0)
    variables = [*template.variables, *template.metrics_variables,
                 *template.optimizer.variables]
    assert all(len(_devices(v)) == 1 for v in variables)
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    assert pmodel is template
    devices = set(pmodel.__dict__["_kerasmgpu"].engine.jax_devices)
    assert len(devices) == REPLICAS[-1]
    # The same variable objects, every one replicated over the devices: no copy.
    after = [*template.variables, *template.metrics_variables, *template.optimizer.variables]
    assert [id(v) for v in after] == [id(v) for v in variables]
    for variable in after:
        assert _devices(variable) == devices, variable.path
        assert variable.value.is_fully_replicated, variable.path
    assert_history_close(single.fit(X, Y, **FIT), pmodel.fit(X, Y, **FIT))
    assert_weights_close(single, template)
    for variable in [*template.variables, *template.optimizer.variables]:
        assert _devices(variable) == devices, variable.path
    np.testing.assert_allclose(single.evaluate(X, Y, verbose=0),
                               pmodel.evaluate(X, Y, verbose=0), rtol=1e-5)
    # A weight set by the user stays laid out (the layout is the variable's own).
    template.set_weights(single.get_weights())
    assert all(_devices(v) == devices for v in template.weights)
    path = str(tmp_path / "model.keras")
    template.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(single.predict(X, verbose=0), loaded.predict(X, verbose=0),
                               rtol=1e-5, atol=1e-6)


if IN_PROCESS:

    class Scaled(keras.layers.Layer):
        """Multiplies by a private Python attribute read in `call()` (no variable holds
        it, no config names it)."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._scale = 1.0

        def call(self, inputs):
            return inputs * self._scale

    class Tied(keras.layers.Layer):
        """An output projection tied to an Embedding: holds that layer, no config for it."""

        def __init__(self, embedding, **kwargs):
            super().__init__(**kwargs)
            self.embedding = embedding

        def call(self, inputs):
            return keras.ops.matmul(inputs, keras.ops.transpose(self.embedding.embeddings))


def _scaled():
    seed_all(keras, 2)
    inputs = keras.Input((20,))
    hidden = Scaled(name="scaled")(keras.layers.Dense(16, activation="relu")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


@pytest.mark.core
def test_a_private_attribute_changed_after_parallelize_trains_as_on_one_device() -> None:
    # The copy path: the copy kept the attribute as parallelize() found it.
    single, template = _scaled(), _scaled()
    template.set_weights(single.get_weights())
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    for model in (single, template):
        model.get_layer("scaled")._scale = 3.0
    assert_history_close(single.fit(X, Y, **FIT), pmodel.fit(X, Y, **FIT))
    assert_weights_close(single, template)


@pytest.mark.core
def test_a_layer_holding_another_layer_trains_as_on_one_device() -> None:
    # The copy path refused it ("cannot be rebuilt from its get_config()").
    def build():
        seed_all(keras, 6)
        ids = keras.Input((3,), dtype="int32")
        embedding = keras.layers.Embedding(10, 4)
        model = keras.Model(ids, Tied(embedding, name="tied")(embedding(ids)))
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return model

    rng = np.random.default_rng(4)
    x = rng.integers(0, 10, size=(23, 3)).astype("int32")
    y = rng.normal(size=(23, 3, 10)).astype("float32")
    single, template = build(), build()
    template.set_weights(single.get_weights())
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    assert pmodel is template
    fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert_history_close(single.fit(x, y, **fit), pmodel.fit(x, y, **fit))
    assert_weights_close(single, template)
    np.testing.assert_allclose(single.predict(x, verbose=0), pmodel.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


class _DeviceFull(RuntimeError):
    """Stands for what no CPU here raises: a device out of memory part of the way."""


@pytest.mark.parametrize("where", ["laying-out", "after"])
def test_a_parallelize_that_fails_leaves_the_model_as_it_was(monkeypatch, where: str) -> None:
    """A failure part of the way through laying the variables out (the 5th variable: a
    device out of memory), or after it (building the parallel model), puts every
    variable back on its one device with its value: the model trains on as one device's,
    and a parallelize() after it works. Before: a model left half laid out."""
    single = mlp(keras, optimizer=keras.optimizers.Adam(0.01))
    template = mlp(keras, optimizer=keras.optimizers.Adam(0.01))
    for model in (single, template):
        model.fit(X[:40], Y[:40], batch_size=40, verbose=0)
    variables = [*template.variables, *template.metrics_variables,
                 *template.optimizer.variables]
    before = [(v._layout, _devices(v), np.array(v.value)) for v in variables]
    if where == "laying-out":
        victim = variables[4]
        own = victim._direct_assign
        calls = []

        def full(value):
            calls.append(value)
            if len(calls) == 1:  # the laying out; the putting back succeeds
                raise _DeviceFull("RESOURCE_EXHAUSTED: out of memory")
            return own(value)

        monkeypatch.setattr(victim, "_direct_assign", full)
    else:
        from kerasmgpu.training import model as parallel_model

        def adopt(*args, **kwargs):
            raise _DeviceFull("failed after the layout")

        monkeypatch.setattr(parallel_model, "adopt", adopt)
    with pytest.raises(_DeviceFull):
        kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    monkeypatch.undo()
    for variable, (layout, devices, value) in zip(variables, before):
        assert variable._layout is layout, variable.path
        assert _devices(variable) == devices, variable.path
        np.testing.assert_array_equal(np.array(variable.value), value)
    one = dict(FIT, epochs=1)
    assert_history_close(single.fit(X, Y, **one), template.fit(X, Y, **one))
    assert_weights_close(single, template)
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    assert_history_close(single.fit(X, Y, **one), pmodel.fit(X, Y, **one))
    assert_weights_close(single, template)
