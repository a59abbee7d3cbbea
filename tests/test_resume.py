"""A parallel fit resumed from `BackupAndRestore(save_freq=N)` mid-epoch ends where an
uninterrupted fit of plain Keras on one device ends: weights, optimizer state and the
History of the epochs the resumed fit trains (`kerasmgpu.training.resume`).

The interruption is a callback raising after step k, or an exception at a point of a
backup's write (in-process); the job then runs again, as a restarted script would: a
fresh model, a fresh parallel fit with the same backup directory. Backups are atomic
sets (`kerasmgpu.process.backups`): an interrupted write is never restored, a damaged
backup never silently. Several processes, and SIGKILL at every point: test_distributed.py.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

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
from kerasmgpu.process import backups

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


@pytest.fixture(scope="module")
def uninterrupted() -> Tuple[Any, Any]:
    """Plain Keras on one device, 3 epochs without a stop: (model, History), once."""
    keras = keras_module()
    x, y = classification_data(rows=1001)
    reference = _model(keras)
    return reference, reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                                    verbose=0)


def _optimizer_values(model: Any) -> List[np.ndarray]:
    variables = model.optimizer.variables
    variables = variables() if callable(variables) else variables
    return [v.numpy() for v in variables]


def _generations(backup: str) -> List[str]:
    return sorted(p.name for p in Path(backup).glob("kerasmgpu-backup-*"))


def _newest(backup: str) -> Path:
    return Path(backup) / _generations(backup)[-1]


def _fit(keras: Any, backup: str, stop_after: int = 0, gpus: int = 3,
         batch: int = BATCH) -> Any:
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
    history = parallel.fit(x, y, batch_size=batch, epochs=EPOCHS, shuffle=False, verbose=0,
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
        tmp_path: Path, stops: Sequence[int], gpus: int, uninterrupted: Tuple[Any, Any]) -> None:
    """27: after step 11 of epoch 1 (the backup holds step 9: two steps are lost);
    then 3: stopped again in the resumed epoch before it reaches the backup's step;
    16: after the last step of epoch 0, before its end (the backup holds that step);
    on fewer devices: trained on 3, resumed on 2 (the global batch is the same)."""
    keras = keras_module()
    reference, expected = uninterrupted
    backup = str(tmp_path / "backup")
    for stop in stops:
        with pytest.raises(Interrupted):
            _fit(keras, backup, stop)
    assert (_newest(backup) / "kerasmgpu_position.npz").exists()
    model, history = _fit(keras, backup, gpus=gpus)
    _assert_resumed(model, history, reference, expected)
    # Deleted with the backup at the end, as BackupAndRestore deletes its own.
    assert not _generations(backup)


def _assert_resumed(model: Any, history: Any, reference: Any, expected: Any) -> None:
    """Weights, optimizer state and the History of the epochs the resumed fit ran (the
    interrupted one complete) are the uninterrupted fit's."""
    assert_weights_close(model, reference)
    for ours, theirs in zip(_optimizer_values(model), _optimizer_values(reference)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    trained = len(history.history["loss"])
    assert trained >= 1
    tail = type(expected)()
    tail.history = {k: v[-trained:] for k, v in expected.history.items()}
    assert_history_close(history, tail)


class Fault:
    """Replaces `backups.reached` while installed: raises at `point` of the `save`-th
    backup write of a fit (`weights-truncated`: after cutting the largest of Keras's
    files to half - the disk as a kill during that write leaves it)."""

    def __init__(self, point: str, save: int = 2) -> None:
        self.point, self.save, self.saves = point, save, 0

    def __call__(self, point: str, path: str) -> None:
        self.saves += point == "before"
        if point != self.point.split("-")[0] or self.saves != self.save:
            return
        if self.point == "weights-truncated":
            files = [p for p in Path(path).rglob("*") if p.is_file()]
            largest = max(files, key=lambda p: p.stat().st_size)
            with open(largest, "r+b") as f:
                f.truncate(largest.stat().st_size // 2)
        raise Interrupted(f"at {self.point} of backup write {self.saves}")


# Every point of a backup's write an exception can interrupt, in one process (there is
# no other process's share): each interrupted fit is followed by a fresh one that resumes.
POINTS = ["before", "weights-truncated", "weights", "position", "commit", "after"]
# CI's: where each line's own writer is (Keras's files truncated, and written whole
# without kerasmgpu's), and a complete backup; the rest are kerasmgpu's own steps
# (test_backups.py), all of them with KERASMGPU_SWEEP=1 (a fit each: 15-20 s on TF).
CI_POINTS = ["weights-truncated", "weights", "after"]
SWEEP = [pytest.mark.sweep, pytest.mark.skipif(
    os.environ.get("KERASMGPU_SWEEP") != "1", reason="every point: KERASMGPU_SWEEP=1")]


def _expected_resumes(points: List[str]) -> List[int]:
    """The backup each run after the first resumes: a run writes one backup, then is
    interrupted in its second; a number a leftover holds is not used again."""
    resumed: List[int] = []
    number, chosen = 1, None
    for point in points:
        if chosen is not None:
            resumed.append(chosen)
        chosen = number + 1 if point == "after" else number
        number += 1 if point == "before" else 2
    return resumed + [chosen] if chosen is not None else resumed


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
    manifest = _newest(str(backup)) / backups.MANIFEST
    record = json.loads(manifest.read_text())
    assert (record["job"]["processes"], record["job"]["replicas"]) == (1, 3), record["job"]
    assert record["job"]["global_batch"] == BATCH
    record["job"].update(processes=2, replicas=4)
    manifest.write_text(json.dumps(record))
    _refused(keras, str(backup), r"written by 2 process\(es\) and 4 replica\(s\): "
             r"resume it with 2 process")


def _refused(keras: Any, backup: str, match: str, batch: int = BATCH) -> None:
    """A fit resuming `backup` fails with `match` before a weight changes."""
    model = _model(keras)
    before = [w.copy() for w in model.get_weights()]
    x, y = classification_data(rows=1001)
    parallel = kerasmgpu.parallelize(model, gpus=3)
    with pytest.raises(ValueError, match=match):
        parallel.fit(x, y, batch_size=batch, epochs=EPOCHS, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(backup, save_freq=SAVE_FREQ)])
    for ours, theirs in zip(model.get_weights(), before):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.core
def test_a_backup_of_another_global_batch_is_refused(tmp_path: Path) -> None:
    """A backup records the global batch: another one would train other batches after
    it, so it is refused before anything is restored, naming both and the fix."""
    keras = keras_module()
    backup = str(tmp_path / "backup")
    with pytest.raises(Interrupted):
        _fit(keras, backup, stop_after=SAVE_FREQ + 1)
    _refused(keras, backup, r"global batch \(32 rows a step\).*fit of 64 rows a step.*"
             r"batch_size=64", batch=32)


def _resume_with_fault(keras: Any, backup: str, fault: Optional[Callable[..., None]],
                       monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
                       ) -> Tuple[Any, Any, str]:
    """One fit of the job (a fresh model, as a restarted script builds it), with
    `fault` in place of `backups.reached`; (model, History or None, its stderr)."""
    monkeypatch.setattr(backups, "reached", fault or (lambda point, path: None))
    result: Tuple[Any, Any] = (None, None)
    try:
        result = _fit(keras, backup)
    except Interrupted:
        pass
    return result[0], result[1], capfd.readouterr().err


@pytest.mark.parametrize("points", [pytest.param(CI_POINTS, id="ci"),
                                    pytest.param(POINTS, id="sweep", marks=SWEEP)])
def test_an_exception_at_every_point_of_a_save_resumes_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture,
        uninterrupted: Tuple[Any, Any], points: List[str]) -> None:
    """One job interrupted at each point of a backup's write in turn (its second write
    of each run, so that the job moves on), every run resuming the last complete backup
    and saying which; it ends with the uninterrupted fit's weights, optimizer state and
    History. An interrupted write is never restored, and no more than the backup being
    written and the last complete one are ever on disk."""
    keras = keras_module()
    reference, expected = uninterrupted
    backup = str(tmp_path / "backup")
    resumed_from = []
    for point in points:
        model, _, err = _resume_with_fault(keras, backup, Fault(point), monkeypatch, capfd)
        assert model is None, f"the fault at {point} did not interrupt the fit"
        resumed_from += [int(n) for n in _resuming(err)]
        assert len(_generations(backup)) == 1, (point, _generations(backup))
    model, history, err = _resume_with_fault(keras, backup, None, monkeypatch, capfd)
    resumed_from += [int(n) for n in _resuming(err)]
    # Each run resumed the last complete backup: the first one the run before wrote,
    # or its second where the fault came after that write was complete (all points:
    # 1, 2, 4, 6, 8, 11 - nothing of backup 2 was left, so 2 was used again).
    assert resumed_from == _expected_resumes(points), (resumed_from, err)
    assert _expected_resumes(POINTS) == [1, 2, 4, 6, 8, 11]
    _assert_resumed(model, history, reference, expected)


def _resuming(err: str) -> List[str]:
    import re

    return re.findall(r"kerasmgpu: resuming from backup (\d+) in ", err)


def _two_backups(keras: Any, backup: str, monkeypatch: pytest.MonkeyPatch) -> List[Path]:
    """A job stopped after its second backup, with the first still on disk (pruning held
    back, as `double_checkpoint=True` keeps it on Keras 3)."""
    monkeypatch.setattr(backups, "prune", lambda *args, **kwargs: None)
    with pytest.raises(Interrupted):
        _fit(keras, backup, stop_after=2 * SAVE_FREQ + 1)
    monkeypatch.undo()
    return [Path(backup) / name for name in _generations(backup)]


def _largest(generation: Path) -> Path:
    return max((p for p in generation.rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)


@pytest.mark.core
def test_a_damaged_backup_is_never_restored_silently(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uninterrupted: Tuple[Any, Any]) -> None:
    """Both backups damaged - the newest truncated (as by a disk that lost its tail), the
    one before with a byte changed: the fit fails before training, naming each file and
    its fault. The older one whole again: it is resumed, with a warning naming the
    newest's file and fault, and the job ends exactly."""
    keras = keras_module()
    reference, expected = uninterrupted
    backup = str(tmp_path / "backup")
    older, newest = _two_backups(keras, backup, monkeypatch)
    truncated, changed = _largest(newest), _largest(older)
    with open(truncated, "r+b") as f:
        f.truncate(truncated.stat().st_size - 100)
    whole = changed.read_bytes()
    changed.write_bytes(whole[:len(whole) // 2] + bytes([whole[len(whole) // 2] ^ 0xFF])
                        + whole[len(whole) // 2 + 1:])
    _refused(keras, backup, rf"no backup in it can be restored - backup {int(newest.name[-6:])}"
             rf": {truncated} holds \d+ bytes where \d+ were written \(truncated\); backup "
             rf"{int(older.name[-6:])}: {changed} does not match its checksum.*pass a new "
             "backup_dir")
    changed.write_bytes(whole)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, history = _fit(keras, backup)
    said = [str(w.message) for w in caught if "cannot be restored" in str(w.message)]
    assert len(said) == 1 and str(truncated) in said[0] and "truncated" in said[0], said
    assert f"resuming from backup {int(older.name[-6:])}" in said[0]
    _assert_resumed(model, history, reference, expected)


@pytest.mark.core
@pytest.mark.parametrize("built", ["anywhere", "in-scope"])
def test_a_killed_model_save_leaves_the_previous_file(tmp_path: Path, built: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The parallel model's save_weights (what a ModelCheckpoint of the fit calls) writes
    a temporary file and renames it: interrupted just before the rename, with the new file
    half written, the old file is still whole and nothing else is left. Also for a model
    built in `kerasmgpu.scope()` (adopted as it is: before, its saves were left as Keras's
    own, and the kill left half a file)."""
    keras = keras_module()
    if built == "in-scope":
        with kerasmgpu.scope(gpus=3):
            model = _model(keras)
    else:
        model = _model(keras)
    parallel = kerasmgpu.parallelize(model, gpus=3)
    path = tmp_path / "checkpoint.weights.h5"
    parallel.save_weights(str(path))
    first = [w.copy() for w in parallel.get_weights()]

    def cut(point: str, temporary: str) -> None:
        if point == "replace":
            with open(temporary, "r+b") as f:
                f.truncate(os.path.getsize(temporary) // 2)
            raise Interrupted("before the rename")

    parallel.set_weights([w + 1 for w in first])
    monkeypatch.setattr(backups, "reached", cut)
    with pytest.raises(Interrupted):
        parallel.save_weights(str(path))
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.weights.h5"]
    fresh = _model(keras)
    fresh.load_weights(str(path))
    for ours, theirs in zip(fresh.get_weights(), first):
        np.testing.assert_array_equal(ours, theirs)
