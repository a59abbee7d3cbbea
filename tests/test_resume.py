"""A parallel fit resumed from `BackupAndRestore(save_freq=N)` mid-epoch ends where an
uninterrupted fit of plain Keras on one device ends: weights, optimizer state and the
History of the epochs the resumed fit trains (`kerasmgpu.training.resume`).

The interruption is a callback raising after step k (in-process); the job then runs
again, as a restarted script would: a fresh model, a fresh parallel fit with the same
backup directory. Several processes: tests/test_distributed.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, List, Sequence

import numpy as np
import pytest
from helpers import (
    ON_TORCH,
    assert_history_close,
    assert_weights_close,
    classification_data,
    keras_module,
    mlp,
    requires,
)

import kerasmgpu
from kerasmgpu.env.versions import KerasLine

# 1001 rows, batch 64: 16 steps an epoch, the last one of 41 rows (3 replicas: padded).
EPOCHS, BATCH, SAVE_FREQ = 3, 64, 5

in_process = pytest.mark.skipif(ON_TORCH, reason="the torch route trains one device a "
                                "process: tests/test_distributed.py resumes it")
# heavy: trains the most models; the middle releases leave it out (tox.ini).
pytestmark = [in_process, pytest.mark.heavy, requires(lines=[KerasLine.KERAS_3, KerasLine.TF_KERAS,
                                           KerasLine.TF_KERAS_LEGACY])]


class Interrupted(RuntimeError):
    pass


def _model(keras: Any) -> Any:
    return mlp(keras, optimizer=keras.optimizers.Adam(1e-2))


def _optimizer_values(model: Any) -> List[np.ndarray]:
    variables = model.optimizer.variables
    variables = variables() if callable(variables) else variables
    return [v.numpy() for v in variables]


def _fit(keras: Any, backup: str, stop_after: int = 0, gpus: int = 3) -> Any:
    class Stop(keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.steps += 1
            if self.steps == stop_after:
                raise Interrupted(f"after step {stop_after}")

    model = _model(keras)
    x, y = classification_data(rows=1001)
    parallel = kerasmgpu.parallelize(model, gpus=gpus)
    callbacks = [keras.callbacks.BackupAndRestore(backup, save_freq=SAVE_FREQ)]
    if stop_after:
        callbacks.append(Stop())
    history = parallel.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                           callbacks=callbacks)
    return model, history


@pytest.mark.core
@pytest.mark.parametrize("stops, gpus", [
    pytest.param((27,), 3, id="mid-epoch"),
    # Older releases run the mid-epoch case (`not wide`: compat/README.md).
    pytest.param((27, 3), 3, id="again-in-the-replay", marks=pytest.mark.wide),
    pytest.param((16,), 3, id="last-step", marks=pytest.mark.wide),
    pytest.param((27,), 2, id="on-fewer-devices", marks=pytest.mark.wide),
])
def test_a_resumed_fit_ends_where_an_uninterrupted_one_ends(
        tmp_path: Path, stops: Sequence[int], gpus: int) -> None:
    """27: after step 11 of epoch 1 (the backup holds step 9: two steps are lost);
    then 3: stopped again in the resumed epoch before it reaches the backup's step;
    16: after the last step of epoch 0, before its end (the backup holds that step);
    on fewer devices: trained on 3, resumed on 2 (the global batch is the same)."""
    keras = keras_module()
    x, y = classification_data(rows=1001)
    reference = _model(keras)
    expected = reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    backup = str(tmp_path / "backup")
    for stop in stops:
        with pytest.raises(Interrupted):
            _fit(keras, backup, stop)
    assert os.path.exists(os.path.join(backup, "kerasmgpu_position.npz"))
    model, history = _fit(keras, backup, gpus=gpus)
    assert_weights_close(model, reference)
    for ours, theirs in zip(_optimizer_values(model), _optimizer_values(reference)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    # The resumed fit's History holds the epochs it ran, the interrupted one complete.
    trained = len(history.history["loss"])
    assert trained >= EPOCHS - 1
    tail = type(expected)()
    tail.history = {k: v[-trained:] for k, v in expected.history.items()}
    assert_history_close(history, tail)
    # Deleted with the backup at the end, as BackupAndRestore deletes its own.
    assert not os.path.exists(os.path.join(backup, "kerasmgpu_position.npz"))


@pytest.mark.core
def test_an_unwritable_backup_dir_fails_before_training(tmp_path: Path) -> None:
    keras = keras_module()
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    model = _model(keras)
    before = [w.copy() for w in model.get_weights()]
    x, y = classification_data(rows=64)
    parallel = kerasmgpu.parallelize(model, gpus=3)
    backup = keras.callbacks.BackupAndRestore(str(blocked / "backup"), save_freq=SAVE_FREQ)
    with pytest.raises(ValueError, match=r"backup_dir.*not a directory"):
        parallel.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[backup])
    for ours, theirs in zip(model.get_weights(), before):
        np.testing.assert_array_equal(ours, theirs)


def _one_more_layer(keras: Any) -> Any:
    inputs = keras.Input((20,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.Dense(3)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss="sparse_categorical_crossentropy")
    return model


@pytest.mark.core
@pytest.mark.parametrize("other", ["other-inputs", "one-more-layer"])
def test_a_backup_of_another_model_fails_before_training(tmp_path: Path, other: str) -> None:
    """kerasmgpu records the weight shapes with each backup: another model's backup is
    refused in our words before Keras's restore touches a weight. Keras's own restore
    (measured, 3.15 and tf_keras 2.21): 7 inputs instead of 20 - a ValueError about
    assigning a (20, 16) value to a (7, 16) variable; one more layer - Keras 3 "Layer
    'dense_2' expected 2 variables, but received 0", tf_keras trains on silently with
    the restored layers and a fresh one."""
    keras = keras_module()
    backup = str(tmp_path / "backup")
    with pytest.raises(Interrupted):
        _fit(keras, backup, stop_after=SAVE_FREQ + 1)
    if other == "other-inputs":
        model = mlp(keras, features=7, optimizer=keras.optimizers.Adam(1e-2))
        x, y = classification_data(rows=64, features=7)
        shapes = r"7x16, 16, 16x3, 3\)"
    else:
        model = _one_more_layer(keras)
        x, y = classification_data(rows=64)
        shapes = r"20x16, 16, 16x3, 3, 3x3, 3\)"
    before = [w.copy() for w in model.get_weights()]
    parallel = kerasmgpu.parallelize(model, gpus=3)
    with pytest.raises(ValueError, match=rf"this model \(weight shapes {shapes}.*another "
                       r"model's weights \(shapes 20x16, 16, 16x3, 3\)"):
        parallel.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
                     callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=SAVE_FREQ)])
    for ours, theirs in zip(model.get_weights(), before):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.core
def test_a_backup_of_a_job_of_other_processes_fails_before_training(tmp_path: Path) -> None:
    """The chief records the job's processes and replicas with each backup; one process
    resuming a backup of two is refused before anything is restored (the real two-process
    jobs: tests/test_distributed.py). The record is edited here as a job of two processes
    on 2 devices each would have written it."""
    keras = keras_module()
    backup = tmp_path / "backup"
    with pytest.raises(Interrupted):
        _fit(keras, str(backup), stop_after=SAVE_FREQ + 1)
    position = backup / "kerasmgpu_position.npz"
    with np.load(position) as data:
        arrays = {k: data[k] for k in data.files}
    layout = json.loads(str(arrays["layout"]))
    assert (layout["processes"], layout["replicas"]) == (1, 3), layout
    arrays["layout"] = np.array(json.dumps({**layout, "processes": 2, "replicas": 4}))
    np.savez(position, **arrays)
    model = _model(keras)
    before = [w.copy() for w in model.get_weights()]
    x, y = classification_data(rows=1001)
    parallel = kerasmgpu.parallelize(model, gpus=3)
    with pytest.raises(ValueError, match=r"written by 2 process\(es\) and 4 replica\(s\): "
                       r"resume it with 2 process"):
        parallel.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(str(backup), save_freq=SAVE_FREQ)])
    for ours, theirs in zip(model.get_weights(), before):
        np.testing.assert_array_equal(ours, theirs)
