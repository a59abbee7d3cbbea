"""A parallel fit resumed from Keras's `BackupAndRestore` ends where an uninterrupted one ends.

Keras 3's `BackupAndRestore(save_freq=N)` writes the weights and optimizer state every N
steps, but restores only the epoch: a job stopped after step k of epoch e restarts
epoch e from its first batch with the weights of step k, trains the first k batches a
second time, and its History of epoch e holds only the steps after the restart. Here,
while the user's backup saves, kerasmgpu writes beside it where training stood (the
epoch and the steps done in it) and the values of the epoch's metrics
(`kerasmgpu_position.npz`). A fit that restores such a backup runs the epoch's first k
steps again (every process reads the same stream, so no batch order changes), keeps no
backup of them, and after step k puts back the restored weights, optimizer state and
metrics: from step k+1 on, training and its History are the uninterrupted run's.

The cost is those k steps' time (less than one epoch). A backup without the file (written
by plain Keras, or from another epoch) resumes as Keras resumes it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np

from kerasmgpu.adapters import Adapter

POSITION_FILE = "kerasmgpu_position.npz"


@dataclass
class Position:
    epoch: int
    steps: int  # steps done in `epoch`
    metrics: List[Any]


def _backups(callbacks: List[Any]) -> List[Any]:
    return [c for c in callbacks if type(c).__name__ == "BackupAndRestore"]


def _local_dir(backup: Any) -> Optional[str]:
    path = getattr(backup, "backup_dir", None)
    if not isinstance(path, (str, os.PathLike)) or "://" in str(path):
        return None  # a remote file system: Keras's own resume
    return os.fspath(path)


def _metric_variables(model: Any) -> List[Any]:
    return [v for metric in model.metrics for v in metric.variables]


def _keras_metadata(directory: str) -> Optional[Tuple[int, int]]:
    try:
        with open(os.path.join(directory, "training_metadata.json")) as f:
            meta = json.load(f)
        return int(meta["epoch"]), int(meta["batch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_position(directory: str) -> Optional[Position]:
    """Where the backup in `directory` stands, if kerasmgpu wrote it beside Keras's."""
    path = os.path.join(directory, POSITION_FILE)
    if not os.path.exists(path):
        return None
    with np.load(path) as data:
        epoch, steps, batch = (int(v) for v in data["position"])
        metrics = [data[f"metric_{i}"] for i in range(int(data["metric_count"]))]
    # Keras's own record must be the one this file was written with.
    if _keras_metadata(directory) != (epoch, batch):
        return None
    return Position(epoch, steps, metrics)


def _write_position(directory: str, epoch: int, steps: int, batch: int,
                    metrics: List[Any]) -> None:
    arrays = {f"metric_{i}": np.asarray(m) for i, m in enumerate(metrics)}
    temporary = os.path.join(directory, POSITION_FILE + ".tmp.npz")
    np.savez(temporary, position=np.array([epoch, steps, batch]),
             metric_count=np.array(len(metrics)), **arrays)
    os.replace(temporary, os.path.join(directory, POSITION_FILE))


def callbacks(adapter: Adapter, user_callbacks: List[Any]) -> Tuple[List[Any], List[Any]]:
    """The callbacks a fit runs before and after the user's: ([], []) without a
    BackupAndRestore kerasmgpu can follow."""
    backups = [b for b in _backups(user_callbacks) if _local_dir(b) is not None]
    if len(backups) != 1:
        return [], []
    tracker = _Tracker(adapter, backups[0])
    if not adapter.follow_backup(backups[0], tracker.saved, tracker.may_save):
        return [], []
    return [tracker.front()], [tracker.back()]


class _Tracker:
    """The position in training, the backup being followed, and the replay after a resume."""

    def __init__(self, adapter: Adapter, backup: Any) -> None:
        self.adapter = adapter
        self.backup = backup
        self.directory = _local_dir(backup) or ""
        self.epoch = 0
        self.steps = 0
        self.batch = 0
        self.model: Any = None
        # After a resume: the restored position and state, until the replay reaches it.
        self.resume: Optional[Position] = None
        self.restored: List[Any] = []
        self.settle = False  # the replay just ended: set Keras's counters at the next step

    def may_save(self) -> bool:
        return self.resume is None and not self.settle

    def saved(self) -> None:
        """After the backup wrote: where training stands, and the epoch's metrics."""
        values = self.adapter.read_values(_metric_variables(self.model))
        _write_position(self.directory, self.epoch, self.steps, self.batch, values)

    def state(self) -> List[Any]:
        model = self.model
        return list(model.weights) + self.adapter.optimizer_variables(model.optimizer)

    def restore_now(self) -> None:
        assert self.resume is not None
        self.adapter.write_values(self.state(), self.restored)
        metrics = _metric_variables(self.model)
        if len(metrics) == len(self.resume.metrics):
            self.adapter.write_values(metrics, self.resume.metrics)
        self.resume = None
        self.settle = True

    def end_settling(self) -> None:
        if self.settle:
            self.settle = False
            self.adapter.set_backup_position(self.backup, self.epoch, self.batch)

    def front(self) -> Any:
        tracker = self

        class KeepPosition(self.adapter.keras.callbacks.Callback):  # type: ignore[misc,name-defined]
            """Runs before the user's callbacks: counts steps, ends the replay."""

            def on_train_begin(self, logs: Any = None) -> None:
                tracker.model = self.model
                position = read_position(tracker.directory)
                if position is not None and position.steps == 0:
                    # An epoch boundary: Keras resumes it exactly, but would record
                    # epoch 0 in its next mid-epoch backup.
                    tracker.adapter.set_backup_position(tracker.backup, position.epoch, 0)
                    position = None
                tracker.resume = position

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                tracker.epoch, tracker.steps = epoch, 0

            def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
                tracker.end_settling()

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                tracker.steps, tracker.batch = batch + 1, batch
                resume = tracker.resume
                if resume is not None and (tracker.epoch, tracker.steps) == (
                        resume.epoch, resume.steps):
                    tracker.model = self.model  # JAX: the step's state into the variables
                    tracker.restore_now()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                tracker.end_settling()
                # Keras's epoch-end backup: the next epoch, nothing done in it.
                tracker.epoch, tracker.steps, tracker.batch = epoch + 1, 0, 0

        return KeepPosition()

    def back(self) -> Any:
        tracker = self

        class TakeRestored(self.adapter.keras.callbacks.Callback):  # type: ignore[misc,name-defined]
            """Runs after the user's BackupAndRestore restored: keeps what it restored."""

            def on_train_begin(self, logs: Any = None) -> None:
                if tracker.resume is not None:
                    tracker.model = self.model
                    tracker.restored = tracker.adapter.read_values(tracker.state())

        return TakeRestored()
