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


def _local_dir(backup: Any) -> Optional[str]:
    path = getattr(backup, "backup_dir", None)
    if not isinstance(path, (str, os.PathLike)) or "://" in str(path):
        return None  # a remote file system: Keras's own resume
    return os.fspath(path)


def _metric_variables(model: Any) -> List[Any]:
    return [v for metric in model.metrics for v in metric.variables]


def read_position(adapter: Adapter, backup: Any) -> Optional[Position]:
    """Where `backup`'s last backup stands, if kerasmgpu wrote it beside Keras's."""
    directory = _local_dir(backup)
    path = os.path.join(directory or "", POSITION_FILE)
    if directory is None or not os.path.exists(path):
        return None
    with np.load(path) as data:
        epoch, steps, batch = (int(v) for v in data["position"])
        metrics = [data[f"metric_{i}"] for i in range(int(data["metric_count"]))]
    # Keras's own record must be the one this file was written with.
    if adapter.backup_record(backup) != (epoch, batch):
        return None
    return Position(epoch, steps, metrics)


def _write_position(directory: str, epoch: int, steps: int, batch: int,
                    metrics: List[Any]) -> None:
    arrays = {f"metric_{i}": np.asarray(m) for i, m in enumerate(metrics)}
    temporary = os.path.join(directory, POSITION_FILE + ".tmp.npz")
    np.savez(temporary, position=np.array([epoch, steps, batch]),
             metric_count=np.array(len(metrics)), **arrays)
    os.replace(temporary, os.path.join(directory, POSITION_FILE))


def plan(adapter: Adapter, user_callbacks: List[Any], *, writes: bool) -> Optional["Plan"]:
    """How a fit with these callbacks keeps its position: None without a (local)
    BackupAndRestore kerasmgpu can follow. `writes`: this process writes the backups
    (the chief); every process reads them."""
    found = [getattr(c, "restores", c) for c in user_callbacks]
    backups = [b for b in found
               if type(b).__name__ == "BackupAndRestore" and _local_dir(b) is not None]
    if len(backups) != 1:
        return None
    tracker = Plan(adapter, backups[0], writes)
    if not adapter.follow_backup(backups[0], tracker.saved, tracker.may_save):
        return None
    return tracker


class Plan:
    """The position in training, the backup being followed, and the way back to the
    backup's position after a resume."""

    def __init__(self, adapter: Adapter, backup: Any, writes: bool) -> None:
        self.adapter = adapter
        self.backup = backup
        self.writes = writes
        self.directory = _local_dir(backup) or ""
        self.epoch = 0
        self.steps = 0
        self.batch = 0
        self.model: Any = None
        # After a resume: the restored position, until training reaches it again.
        self.resume = read_position(adapter, backup)
        self.restored: List[Any] = []
        self.settle = False  # the replay just ended: set Keras's counters at the next step

    def skip_steps(self, steps_per_epoch: Optional[int]) -> int:
        """Batches the feed must skip: where Keras continues the restored epoch at its
        next step (tf.keras), the steps it already trained."""
        resume = self.resume
        if not self.adapter.backup_resumes_mid_epoch:
            return 0  # Keras restarts the epoch: the replay brings it back
        if (resume is None or not steps_per_epoch or not 0 < resume.steps < steps_per_epoch):
            self.resume = None
            return 0
        return resume.steps

    def cannot_skip(self) -> None:
        self.resume = None

    def may_save(self) -> bool:
        return self.resume is None and not self.settle

    def saved(self) -> None:
        """After the backup wrote: where training stands, and the epoch's metrics."""
        if self.writes:
            values = self.adapter.read_values(_metric_variables(self.model))
            _write_position(self.directory, self.epoch, self.steps, self.batch, values)

    def state(self) -> List[Any]:
        model = self.model
        return list(model.weights) + self.adapter.optimizer_variables(model.optimizer)

    def put_metrics(self, *, add: bool = False) -> None:
        """The restored epoch's metrics back in the model's metrics; `add`: to what one
        step after the restore added (a metric's state is a sum: a total and a count,
        a confusion matrix - every Keras built-in metric)."""
        assert self.resume is not None
        metrics = _metric_variables(self.model)
        if len(metrics) != len(self.resume.metrics):
            return
        values = self.resume.metrics
        if add:
            values = [r + c for r, c in zip(values, self.adapter.read_values(metrics))]
        self.adapter.write_values(metrics, values)

    def restore_now(self) -> None:
        self.adapter.write_values(self.state(), self.restored)
        self.put_metrics()
        self.resume = None
        self.settle = True

    def end_settling(self) -> None:
        if self.settle:
            self.settle = False
            self.adapter.set_backup_position(self.backup, self.epoch, self.batch)

    def callbacks(self) -> Tuple[List[Any], List[Any]]:
        """The callbacks a fit runs before and after the user's."""
        return [self._front()], [self._back()]

    def _on_train_begin(self, model: Any) -> None:
        self.model = model
        resume = self.resume
        if resume is not None and resume.steps == 0:
            # An epoch boundary: Keras resumes it exactly, but Keras 3 would record
            # epoch 0 in its next mid-epoch backup.
            self.adapter.set_backup_position(self.backup, resume.epoch, 0)
            self.resume = None

    def _on_epoch_begin(self, epoch: int) -> None:
        self.epoch, self.steps = epoch, 0
        resume = self.resume
        if resume is not None and self.adapter.backup_resumes_mid_epoch:
            # Keras continues this epoch at step `resume.steps` with reset metrics, which
            # it builds in its first step: their restored values are added after it.
            if epoch == resume.epoch:
                self.steps = resume.steps
            else:
                self.resume = None

    def _on_batch_end(self, batch: int, model: Callable[[], Any]) -> None:
        self.steps, self.batch = batch + 1, batch
        resume = self.resume
        if resume is not None and self.adapter.backup_resumes_mid_epoch:
            self.put_metrics(add=True)
            self.resume = None
        elif resume is not None and (self.epoch, self.steps) == (resume.epoch, resume.steps):
            self.model = model()  # JAX: the step's state into the variables
            self.restore_now()

    def _on_epoch_end(self, epoch: int) -> None:
        self.end_settling()
        # Keras's epoch-end backup: the next epoch, nothing done in it.
        self.epoch, self.steps, self.batch = epoch + 1, 0, 0

    def _front(self) -> Any:
        plan = self

        class KeepPosition(self.adapter.keras.callbacks.Callback):  # type: ignore[misc,name-defined]
            """Runs before the user's callbacks: counts steps, ends the replay."""

            def on_train_begin(self, logs: Any = None) -> None:
                plan._on_train_begin(self.model)

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                plan._on_epoch_begin(epoch)

            def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
                plan.end_settling()

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                plan._on_batch_end(batch, lambda: self.model)

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                plan._on_epoch_end(epoch)

            def on_train_end(self, logs: Any = None) -> None:
                # The backup is deleted at the end (tf.keras keeps its directory).
                if plan.writes and getattr(plan.backup, "delete_checkpoint", True):
                    try:
                        os.remove(os.path.join(plan.directory, POSITION_FILE))
                    except FileNotFoundError:
                        pass

        return KeepPosition()

    def _back(self) -> Any:
        plan = self

        class TakeRestored(self.adapter.keras.callbacks.Callback):  # type: ignore[misc,name-defined]
            """Runs after the user's BackupAndRestore restored: keeps what it restored."""

            def on_train_begin(self, logs: Any = None) -> None:
                if plan.resume is not None and not plan.adapter.backup_resumes_mid_epoch:
                    plan.model = self.model
                    plan.restored = plan.adapter.read_values(plan.state())

        return TakeRestored()
