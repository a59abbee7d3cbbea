"""Every file a parallel model writes is a plain Keras file.

A parallel model trained on 2 or 3 devices writes every format of its line -
`model.save` (`.keras`, `.h5`, a SavedModel directory), weights, `ModelCheckpoint` (full
model, weights only, `save_best_only`) - and a child process in which kerasmgpu cannot
be imported loads each file with plain Keras: the user's loss, metric and optimizer
(with its state) are there, the predictions are the parallel model's, and training on
from the file is training on from where the parallel model stopped. The files can be
handed to parallelize() again, and a SavedModel serves through its signature.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    LINE,
    ON_TF,
    REPLICAS,
    assert_weights_close,
    classification_data,
    keras_module,
    mlp,
    one_replica_count,
    requires,
)

import kerasmgpu
from kerasmgpu.env.versions import KerasLine

pytestmark = requires(in_process=True)
if IN_PROCESS:
    keras = keras_module()
KERAS3 = LINE is KerasLine.KERAS_3
X, Y = classification_data(203)
FIT = dict(batch_size=40, shuffle=False, verbose=0)

# The child: plain Keras, with `import kerasmgpu` made impossible.
CHILD = textwrap.dedent('''
    import json, sys
    import numpy as np

    class NoKerasmgpu:
        def find_spec(self, name, path=None, target=None):
            if name == "kerasmgpu" or name.startswith("kerasmgpu."):
                raise ImportError("kerasmgpu is not installed in this process")
            return None

    sys.meta_path.insert(0, NoKerasmgpu())
    line, folder = sys.argv[1], sys.argv[2]
    if line == "tf_keras":
        import tf_keras as keras
    elif line.startswith("tf.keras"):
        import tensorflow as tf
        keras = tf.keras
    else:
        import keras
    data = np.load(folder + "/data.npz")
    x, y = data["x"], data["y"]
    plan = json.load(open(folder + "/plan.json"))
    report = {}
    for name, kind in plan.items():
        path = folder + "/" + name
        facts = {}
        if kind == "model":
            model = keras.models.load_model(path)
            facts["loss"] = str(getattr(model, "loss", None))
            opt = model.optimizer
            facts["optimizer"] = type(opt).__name__
            facts["iterations"] = int(np.asarray(opt.iterations))
            facts["config_mentions_kerasmgpu"] = "kerasmgpu" in json.dumps(
                model.get_config(), default=str).lower() or "packed" in model.to_json().lower()
            np.save(folder + "/" + name + ".pred.npy", model.predict(x, verbose=0))
            history = model.fit(x, y, batch_size=40, epochs=1, shuffle=False, verbose=0)
            facts["metrics"] = sorted(history.history)
            facts["iterations_after"] = int(np.asarray(opt.iterations))
            np.save(folder + "/" + name + ".next.npy",
                    np.concatenate([w.reshape(-1) for w in model.get_weights()]))
        elif kind == "savedmodel":
            import tensorflow as tf
            loaded = tf.saved_model.load(path)
            serve = loaded.signatures["serving_default"]
            facts["inputs"] = sorted(serve.structured_input_signature[1])
            out = serve(**{facts["inputs"][0]: tf.constant(x)})
            np.save(folder + "/" + name + ".pred.npy", list(out.values())[0].numpy())
        report[name] = facts
    json.dump(report, open(folder + "/report.json", "w"))
''')


def _run_child(folder: Path) -> Dict[str, Any]:
    env = dict(os.environ)
    env.pop("KERASMGPU_VIRTUAL_DEVICES", None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, LINE.value, str(folder)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: Dict[str, Any] = json.loads((folder / "report.json").read_text())
    return report


def _model():
    return mlp(keras, optimizer=keras.optimizers.Adam(0.01))


def _formats() -> Dict[str, str]:
    """file name -> what it holds, for this line."""
    if KERAS3:
        return {"model.keras": "model", "checkpoint.keras": "model",
                "best.keras": "model"}
    return {"model.h5": "model", "checkpoint.h5": "model", "best.h5": "model",
            "model.keras": "model", "savedmodel": "model"}


# What is saved is the template, whatever the replica count: 3 replicas are a `wide`
# combination (a TF SavedModel export costs about 30 s an env).
@one_replica_count(2)
def test_every_file_loads_without_kerasmgpu(replicas: int, tmp_path: Path) -> None:
    template = _model()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    suffix = ".keras" if KERAS3 else ".h5"
    weights_suffix = ".weights.h5" if KERAS3 else ".h5"
    checkpoints = [
        keras.callbacks.ModelCheckpoint(str(tmp_path / f"checkpoint{suffix}")),
        keras.callbacks.ModelCheckpoint(str(tmp_path / f"best{suffix}"), monitor="loss",
                                        save_best_only=True),
        keras.callbacks.ModelCheckpoint(str(tmp_path / f"weights{weights_suffix}"),
                                        save_weights_only=True),
    ]
    pmodel.fit(X, Y, epochs=2, callbacks=checkpoints, **FIT)
    pmodel.save(str(tmp_path / f"model{suffix}"))
    if not KERAS3:
        pmodel.save(str(tmp_path / "savedmodel"))  # the TF SavedModel format
        pmodel.save(str(tmp_path / "model.keras"))  # Keras's own format, 2.12+
    # What the parallel model's config shows is the user's model.
    text = pmodel.to_json()
    assert "kerasmgpu" not in text.lower() and "packed" not in text.lower()
    np.savez(tmp_path / "data.npz", x=X, y=Y)
    plan = _formats()
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    report = _run_child(tmp_path)
    expected = pmodel.predict(X, verbose=0)
    pmodel.fit(X, Y, epochs=1, **FIT)  # what training on looks like, in parallel
    next_weights = np.concatenate([w.reshape(-1) for w in pmodel.get_weights()])
    for name in plan:
        facts = report[name]
        assert "crossentropy" in facts["loss"], (name, facts)
        assert facts["optimizer"] == "Adam", (name, facts)
        if name == "savedmodel":
            # tf.keras's load_model of a SavedModel directory restores the weights and
            # the compile settings but never the optimizer's state - also for a model
            # trained on one device (measured on 2.12-2.21): it is not for resuming.
            np.testing.assert_allclose(np.load(tmp_path / f"{name}.pred.npy"), expected,
                                       atol=1e-5, err_msg=name)
            continue
        assert facts["iterations"] == 12, (name, facts)  # 2 epochs x 6 steps
        assert facts["iterations_after"] == 18, (name, facts)  # and one more epoch
        assert any("accuracy" in m for m in facts["metrics"]), (name, facts)
        assert not facts["config_mentions_kerasmgpu"], name
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.pred.npy"), expected,
                                   atol=1e-5, err_msg=name)
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.next.npy"), next_weights,
                                   atol=1e-5, err_msg=f"{name}: training on")
    # Weights-only files load into a fresh copy of the model.
    fresh = mlp(keras, compile=False)
    fresh.load_weights(str(tmp_path / f"weights{weights_suffix}"))
    np.testing.assert_allclose(fresh.predict(X, verbose=0), expected, atol=1e-5)


@pytest.mark.core
def test_a_saved_file_parallelizes_again(tmp_path: Path) -> None:
    single, template = _model(), _model()
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    single.fit(X, Y, epochs=1, **FIT)
    pmodel.fit(X, Y, epochs=1, **FIT)
    path = str(tmp_path / ("saved.keras" if KERAS3 else "saved.h5"))
    pmodel.save(path)
    again = kerasmgpu.parallelize(keras.models.load_model(path), gpus=2)
    single.fit(X, Y, epochs=1, **FIT)
    again.fit(X, Y, epochs=1, **FIT)
    assert_weights_close(single, again)


@requires(tf=True)
def test_savedmodel_serves_with_the_users_input_names(tmp_path: Path) -> None:
    inputs = keras.Input((20,), name="pixels")
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Dense(8)(inputs))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    pmodel = kerasmgpu.parallelize(model, gpus=REPLICAS[-1])
    pmodel.fit(X, Y, epochs=1, **FIT)
    folder = tmp_path / "serve"
    if KERAS3:
        pmodel.export(str(folder))  # Keras 3's way to a SavedModel
    else:
        pmodel.save(str(folder))
    (tmp_path / "plan.json").write_text(json.dumps({"serve": "savedmodel"}))
    np.savez(tmp_path / "data.npz", x=X, y=Y)
    report = _run_child(tmp_path)
    names: List[str] = report["serve"]["inputs"]
    assert names == ["pixels"], names
    np.testing.assert_allclose(np.load(tmp_path / "serve.pred.npy"),
                               pmodel.predict(X, verbose=0), atol=1e-5)
    assert ON_TF
