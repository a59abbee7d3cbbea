"""Choosing one device: `gpus=[k]` trains on device k, `gpus=1` / `gpus=[0]` is the model.

On 3 virtual devices (conftest), every route: the replica's variables live on the chosen
device and training there gives the one-device results; where a route cannot move a
model (torch outside `kerasmgpu launch`), an error says so before anything is touched.
"""

from __future__ import annotations

import warnings
from typing import Any, List

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    ON_JAX,
    ON_LEGACY,
    ON_TORCH,
    VIRTUAL,
    assert_history_close,
    assert_weights_close,
    classification_data,
    keras_module,
    mlp,
    requires,
)

import kerasmgpu
from kerasmgpu import api
from kerasmgpu.adapters import keras23

if IN_PROCESS or ON_LEGACY or ON_TORCH:
    keras = keras_module()
X, Y = classification_data(101)
CHOSEN = VIRTUAL - 1  # the last device: never the default one


def _tf_device(variable: Any) -> str:
    """Where TensorFlow holds a variable (Keras 3 wraps the tf.Variable in `.value`)."""
    return str(getattr(variable, "device", None) or variable.value.device)


def _devices_of(model: Any) -> List[str]:
    if ON_JAX:
        return sorted({str(d) for v in model.weights for d in v.value.sharding.device_set})
    return sorted({_tf_device(v).rsplit("/", 1)[-1].upper() for v in model.weights})


def _expected() -> List[str]:
    return [f"cpu:{CHOSEN}"] if ON_JAX else [f"DEVICE:CPU:{CHOSEN}"]


def _placed_on(graph: Any, op: Any) -> str:
    """An op's device. An op with none of its own goes where TensorFlow's placer puts
    it: with the op its colocation group names (a variable's initial value), or with
    the variable whose resource it reads (ReadVariableOp)."""
    if op.device:
        return str(op.device)
    names = [g.decode()[len("loc:@"):] for g in op.colocation_groups()]
    peers = [graph.get_operation_by_name(n) for n in names if n != op.name]
    peers += [t.op for t in op.inputs if t.dtype.name == "resource"]
    return ",".join(sorted({_placed_on(graph, peer) for peer in peers})) or "(none)"


def _train_like_one_device(pmodel: Any, single: Any, template: Any) -> None:
    h1 = single.fit(X, Y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(X, Y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(single, template)  # the template holds the trained weights
    assert_history_close(h1, h2)
    np.testing.assert_allclose(pmodel.predict(X, verbose=0), single.predict(X, verbose=0),
                               rtol=1e-5, atol=1e-6)


@requires(in_process=True)
def test_gpus_k_trains_a_replica_on_device_k() -> None:
    single, template = mlp(keras), mlp(keras)
    pmodel = kerasmgpu.parallelize(template, gpus=[CHOSEN])
    # JAX lays the user's own variables out on the chosen device (no copy); the
    # TensorFlow routes train a copy there.
    assert (pmodel is template) == ON_JAX
    assert _devices_of(pmodel) == _expected()
    assert _devices_of(single) != _expected()  # the default device is another one
    _train_like_one_device(pmodel, single, template)
    described = kerasmgpu.describe(model=pmodel)
    assert described["replicas"] == "1"
    assert described["devices"].rstrip().endswith(f"{CHOSEN}")


@requires(legacy=True)
def test_gpus_k_on_keras23_builds_and_runs_every_op_on_device_k() -> None:
    import tensorflow as tf

    template = mlp(keras)
    graph = tf.compat.v1.get_default_graph()
    before = {op.name for op in graph.get_operations()}
    pmodel = kerasmgpu.parallelize(template, gpus=[CHOSEN])
    assert pmodel is not template
    assert {v.device for v in pmodel.weights} == {f"/device:CPU:{CHOSEN}"}
    built = {op.name for op in graph.get_operations()} - before
    pmodel.fit(X, Y, batch_size=10, epochs=1, shuffle=False, verbose=0)
    pmodel.evaluate(X, Y, verbose=0)
    pmodel.predict(X, verbose=0)
    # Keras 2.3 makes its training, test and predict functions on first use: those
    # ops too must sit on the chosen device, not on the default one. (kerasmgpu's own
    # reads of the template's change tokens sit with the template, and so do the reads of
    # its optimizer's learning rate and momentum: the copy trains with that optimizer.)
    hyper = {v.op.name for v in vars(template.optimizer).values() if hasattr(v, "op")}
    made = [op for op in graph.get_operations() if op.name not in before
            and not op.name.startswith(keras23.TOKENS_SCOPE)
            and not any(t.op.name in hyper for t in op.inputs)]
    assert len(made) > len(built)
    assert {_placed_on(graph, op) for op in made} == {f"/device:CPU:{CHOSEN}"}
    fresh, template2 = mlp(keras), mlp(keras)
    _train_like_one_device(kerasmgpu.parallelize(template2, gpus=[CHOSEN]), fresh, template2)


@requires(torch=True)
def test_gpus_k_on_torch_outside_launch_says_how_to_choose_a_device() -> None:
    model = mlp(keras)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError) as raised:
        kerasmgpu.parallelize(model, gpus=[CHOSEN])
    message = str(raised.value)
    assert f"Received: gpus=[{CHOSEN}]" in message
    assert "Allowed: gpus=1 or gpus=[0]" in message
    assert "kerasmgpu launch --nproc N" in message
    for old, new in zip(before, model.get_weights()):
        np.testing.assert_array_equal(old, new)
    assert "error" in kerasmgpu.describe(gpus=[CHOSEN])


@pytest.mark.skipif(not (IN_PROCESS or ON_LEGACY or ON_TORCH), reason="needs a Keras")
@pytest.mark.parametrize("gpus", [1, [0]])
def test_the_default_device_is_the_model_itself_and_no_warning(
        gpus: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The one-time warning must not have been spent by an earlier test.
    monkeypatch.setattr(api, "_warned_single", False)
    model = mlp(keras)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kerasmgpu.parallelize(model, gpus=gpus) is model
    # Asked for one device of the 3 there are: nothing to warn about.
    assert not [w for w in caught if "kerasmgpu" in str(w.message)], [
        str(w.message) for w in caught]
    assert kerasmgpu.describe(gpus=gpus)["route"].startswith("none")
