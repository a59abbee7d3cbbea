"""Keras 2.3 (`multi_gpu_model`): models whose layers add losses or keep state, against
plain Keras 2.3.1 on one device.

Activity regularizers and `add_loss` terms (each replica used to add its slice's term,
and an `add_loss` in `call` also stayed on the template once per replica); a stateful
RNN (refused before anything happens); BatchNormalization frozen by learning phase 0
(a global of Keras's backend, so that test runs in its own interpreter).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ON_LEGACY, REPLICAS, assert_history_close, assert_weights_close, requires

import kerasmgpu

pytestmark = requires(legacy=True)

if ON_LEGACY:
    import keras
    from keras import backend as K

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300  # a TensorFlow import alone takes 10-25 s on a loaded 2-core CI machine


def _regularized(model_loss: bool = False) -> Any:
    """A Dense with an activity regularizer (a sum over the rows, Keras 2.3's own), a
    layer adding a mean over the rows by `add_loss` in `call`, and a weight regularizer;
    with `model_loss`, also a term the model adds on its own output (`Model.add_loss`)."""

    class MeanSquare(keras.layers.Layer):
        def call(self, inputs):
            self.add_loss(0.1 * K.mean(K.square(inputs)))
            return inputs

    inputs = keras.layers.Input((5,))
    hidden = keras.layers.Dense(6, activation="tanh",
                                activity_regularizer=keras.regularizers.l2(0.01))(inputs)
    outputs = keras.layers.Dense(1, kernel_regularizer=keras.regularizers.l2(0.001))(
        MeanSquare()(hidden))
    model = keras.models.Model(inputs, outputs)
    if model_loss:
        model.add_loss(0.05 * K.mean(K.abs(outputs)))
    rng = np.random.RandomState(3)
    model.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    return model


# 24 rows in batches of 8 divide on 2 and 3 replicas; 27 leave a last batch of 3 (uneven
# on 2); 25 leave a last batch of 1 row, fewer than the replicas (repeated to one each).
@pytest.mark.parametrize("model_loss", [False, True], ids=["layers", "and-model"])
@pytest.mark.parametrize("rows", [24, 27, 25])
@pytest.mark.parametrize("replicas", REPLICAS)
def test_activity_regularizers_and_add_loss_train_as_on_one_device(
        replicas: int, rows: int, model_loss: bool) -> None:
    rng = np.random.RandomState(1)
    x = rng.normal(size=(rows, 5)).astype("float32")
    y = rng.normal(size=(rows, 1)).astype("float32")
    one, template = _regularized(model_loss), _regularized(model_loss)
    own_terms = len(template.losses)
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    assert len(template.losses) == own_terms  # no replica's copy left on the template
    h1 = one.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(one, template)
    np.testing.assert_allclose(pmodel.evaluate(x, y, batch_size=8, verbose=0),
                               one.evaluate(x, y, batch_size=8, verbose=0), rtol=1e-5)


def _updating(conditional: bool, nested: bool = False) -> Any:
    """A layer of the user's own keeping a moving average of its input's mean and a count
    of the rows it saw, by `add_update` - on its input (`conditional`) or not - between
    two Dense layers; `nested`: inside a model of its own, after a Dense layer of that
    model (its update reads a tensor of the model's call). Its output reads neither
    variable: a read of a variable the same step assigns has no order against the
    assign in Keras 2.3's graph, on one device too."""

    class Averaging(keras.layers.Layer):
        def build(self, shape):
            self.average = self.add_weight("average", (), initializer="zeros",
                                           trainable=False)
            self.rows = self.add_weight("rows", (), initializer="zeros", trainable=False)
            super().build(shape)

        def call(self, inputs):
            updates = [K.moving_average_update(self.average, K.mean(inputs), 0.9),
                       K.update_add(self.rows, K.cast(K.shape(inputs)[0], "float32"))]
            self.add_update(updates, inputs if conditional else None)
            return 2.0 * inputs

    inputs = keras.layers.Input((5,))
    hidden = keras.layers.Dense(4, activation="tanh")(inputs)
    if nested:
        inner = keras.layers.Input((4,))
        averaged = Averaging(name="averaging")(keras.layers.Dense(4, name="pre")(inner))
        hidden = keras.models.Model(inner, averaged, name="inner")(hidden)
    else:
        hidden = Averaging(name="averaging")(hidden)
    model = keras.models.Model(inputs, keras.layers.Dense(1)(hidden))
    rng = np.random.RandomState(3)
    K.batch_set_value([(w, rng.normal(scale=0.3, size=K.int_shape(w)).astype("float32"))
                       for w in model.trainable_weights])
    model.compile(keras.optimizers.Adam(0.01), "mse")  # slots the template shares
    return model


@pytest.mark.parametrize("sync_batchnorm", [False, True], ids=["keras", "layer-by-layer"])
@pytest.mark.parametrize("conditional,nested", [(True, False), (False, False), (True, True)],
                         ids=["on-inputs", "unconditional", "nested-on-inputs"])
def test_a_layer_making_update_ops_updates_once_from_the_whole_batch(
        conditional: bool, nested: bool, sync_batchnorm: bool) -> None:
    """Each replica ran a layer's `add_update` ops on its slice, one after the other: a
    moving average read 0.47 where one device's is 0.19, silently (a count of rows was
    right: a sum). The template's own call, on the whole batch, makes them now - in
    Keras's multi_gpu_model and in the replicas built layer by layer (sync_batchnorm);
    inside a nested model too (its replicas' ops, a moving average -0.35 for -0.19
    before, with a warning), from the template's own call of that model."""
    rng = np.random.RandomState(1)
    x = rng.normal(size=(22, 5)).astype("float32")  # batches of 8: the last one 6 rows
    y = rng.normal(size=(22, 1)).astype("float32")
    one, template = _updating(conditional, nested), _updating(conditional, nested)
    one.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # nothing to warn about
        pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1],
                                       sync_batchnorm=sync_batchnorm)
    pmodel.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    ours, theirs = ((template.get_layer("inner"), one.get_layer("inner")) if nested
                    else (template, one))
    layer = ours.get_layer("averaging")
    assert K.get_value(layer.rows) == 44.0  # every row once an epoch
    np.testing.assert_allclose(K.get_value(layer.average),
                               K.get_value(theirs.get_layer("averaging").average), atol=1e-6)
    assert_weights_close(one, template)
    # The template trains on with the moments the parallel fit left (shared slots).
    one.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    template.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert_weights_close(one, template)


def test_a_nested_layer_making_unconditional_update_ops_is_warned_about() -> None:
    """Inside a nested model, a layer's unconditional ops were made by the model's own
    graph too, reading its inputs, which no step feeds (plain Keras 2.3 cannot train it
    on one device either): its replicas keep their ops, and parallelize() says so,
    naming it."""
    with pytest.warns(UserWarning, match=r"Averaging 'averaging' in the nested model .* "
                      r"makes update ops \(add_update\) with no inputs.*Fix: pass the layer's inputs "
                      r".*or call the layer in the model itself"):
        kerasmgpu.parallelize(_updating(False, nested=True), gpus=REPLICAS[-1])


def test_a_stateful_rnn_is_refused_before_anything_happens() -> None:
    # Before: parallelize() passed and the first step failed in TensorFlow
    # ("Incompatible shapes: [2,16] vs. [6,16]"): the state has the batch's rows, each
    # replica a slice of them.
    model = keras.models.Sequential([
        keras.layers.LSTM(4, stateful=True, batch_input_shape=(6, 3, 2), name="memory"),
        keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"Received: .*'memory' \(LSTM\).*Allowed: .*"
                       r"stateful.*Fix: .*one device.*stateful=False"):
        kerasmgpu.parallelize(model, gpus=REPLICAS[-1])
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # One device (gpus=1 passes the model through) still trains it.
    kerasmgpu.parallelize(model, gpus=1).fit(
        np.ones((12, 3, 2), "float32"), np.ones((12, 1), "float32"), batch_size=6,
        shuffle=False, verbose=0)


FROZEN_BATCHNORM = """
    import sys
    import numpy as np
    import tensorflow as tf

    # One device's own step (plain Keras 2.3) reads a moving statistic and assigns it in
    # one session.run, nothing ordering the two: with several inter-op threads a loaded
    # machine can run the assign first (CI once: one device's mean 3e-5 from its usual
    # value). One thread runs the reads, ready first, before it, every time - the order
    # kerasmgpu's step enforces (checked below). Keras 2.3's session takes TF's config.
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    from keras import backend as K
    import kerasmgpu

    K.set_learning_phase(0)  # fine-tuning: every BatchNormalization in inference mode

    def build():
        inputs = keras.layers.Input((4,))
        hidden = keras.layers.Dense(6)(inputs)
        hidden = keras.layers.BatchNormalization(name="norm")(hidden)
        hidden._keras_history[0].trainable = sys.argv[2] != "frozen"
        model = keras.models.Model(inputs, keras.layers.Dense(1)(hidden))
        rng = np.random.RandomState(3)
        # Statistics unlike the data's (mean 3, variance 4): a step that moved them shows.
        model.set_weights([(rng.normal(scale=0.3, size=w.shape) if w.ndim > 1 else
                            rng.uniform(0.5, 1.5, size=w.shape)).astype("float32")
                           for w in model.get_weights()])
        model.compile(keras.optimizers.SGD(0.01), "mse")
        return model

    rng = np.random.RandomState(1)
    x = (3 + 2 * rng.normal(size=(25, 4))).astype("float32")
    y = rng.normal(size=(25, 1)).astype("float32")
    one, template = build(), build()
    statistics = [w.name for w in template.get_layer("norm").weights]
    before = template.get_layer("norm").get_weights()
    h1 = one.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    pmodel = kerasmgpu.parallelize(template, gpus=int(sys.argv[1]),
                                   sync_batchnorm=sys.argv[2] == "sync")
    h2 = pmodel.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    if sys.argv[2] == "sync":
        # Every replica's read of a moving statistic (the inference-mode outputs) runs
        # before the step assigns it: nothing else orders them in Keras 2.3's session,
        # and a race once moved a mean 5e-4 off under CI's load.
        def ancestors(op):
            seen, stack = set(), [op]
            while stack:
                o = stack.pop()
                if o not in seen:
                    seen.add(o)
                    stack.extend([i.op for i in o.inputs] + list(o.control_inputs))
            return seen
        step = pmodel.train_function  # Keras 2.3 on TF 2: tf.keras's GraphExecutionFunction
        loss_side, update_side = ancestors(step.outputs[0].op), ancestors(step.updates_op)
        norm = template.get_layer("norm")
        for variable in (norm.moving_mean, norm.moving_variance):
            handle = variable.handle.op
            assigns = [op for op in update_side if op.type.startswith("Assign")
                       and op.inputs[0].op is handle]
            reads = [op for op in loss_side if op.type == "ReadVariableOp"
                     and op.inputs[0].op is handle]
            unordered = sum(r not in ancestors(a) for a in assigns for r in reads)
            print("ORDER", variable.name, len(assigns), len(reads), unordered)
    norm_one = one.get_layer("norm").get_weights()
    norm_many = template.get_layer("norm").get_weights()
    for name, b, a, m in zip(statistics, before, norm_one, norm_many):
        if "moving" in name:
            print("STATISTIC", name, float(np.max(np.abs(a - b))),
                  float(np.max(np.abs(m - b))), float(np.max(np.abs(m - a))))
    w = max(float(np.max(np.abs(a - b))) for a, b in zip(one.get_weights(),
                                                         template.get_weights()))
    h = max(abs(a - b) for a, b in zip(h1["loss"], h2["loss"]))
    e = abs(one.evaluate(x, y, batch_size=8, verbose=0)
            - pmodel.evaluate(x, y, batch_size=8, verbose=0))
    print("DIFF", w, h, e)
"""


# "frozen": learning phase 0 and `trainable = False` (Keras 2.3 gathers no update of a
# frozen layer): the statistics must not move at all. "sync": learning phase 0 alone -
# plain Keras 2.3.1 still updates the statistics, once per batch from the whole batch,
# which `sync_batchnorm=True` does too (without it each replica updates them in turn).
@pytest.mark.parametrize("mode", ["frozen", "sync"])
@pytest.mark.parametrize("replicas", REPLICAS)
def test_batchnorm_in_learning_phase_0_keeps_one_devices_statistics(
        replicas: int, mode: str, tmp_path: Path) -> None:
    # K.set_learning_phase(0) is global to Keras's backend: its own interpreter.
    script = tmp_path / "frozen.py"
    script.write_text(textwrap.dedent(FROZEN_BATCHNORM))
    done = subprocess.run([sys.executable, str(script), str(replicas), mode],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=str(tmp_path),
                          env={**os.environ, "KERASMGPU_VIRTUAL_DEVICES": str(replicas)})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split() for line in done.stdout.splitlines()]
    statistics = [line[1:] for line in lines if line[:1] == ["STATISTIC"]]
    assert len(statistics) == 2, done.stdout  # moving_mean, moving_variance
    if mode == "sync":
        orders = [line[1:] for line in lines if line[:1] == ["ORDER"]]
        assert len(orders) == 2, done.stdout
        for name, assigns, reads, unordered in orders:
            # One assignment a step; each replica's output reads the statistic once.
            assert (int(assigns), int(reads), int(unordered)) == (1, replicas, 0), name
    for name, on_one, on_many, apart in statistics:
        assert float(apart) < 1e-6, (name, on_one, on_many)
        if mode == "frozen":
            assert float(on_one) == 0.0 and float(on_many) == 0.0, (name, on_one, on_many)
        else:
            assert float(on_one) > 1e-3, (name, on_one)  # the data's statistics differ
    weights, history, evaluate = (float(d) for d in next(
        line[1:] for line in lines if line[:1] == ["DIFF"]))
    assert weights < 1e-5 and history < 1e-5 and evaluate < 1e-5, done.stdout
