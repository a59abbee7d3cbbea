"""A parallel fit resumed from Keras's `BackupAndRestore` ends where an uninterrupted one ends.

Keras 3's `BackupAndRestore(save_freq=N)` writes the weights and optimizer state every N
steps, but restores only the epoch: a job stopped after step k of epoch e restarts
epoch e from its first batch with the weights of step k, trains the first k batches a
second time, and its History of epoch e holds only the steps after the restart.
tf.keras's continues at step k+1, but reads the epoch's data from its start. Here,
while the user's backup saves, kerasmgpu writes beside it where training stood (the
epoch and the steps done in it) and the epoch's metric states
(`kerasmgpu_position.npz`; on torch every process writes its own share). A fit that
restores such a backup then either
* (Keras 3) runs the epoch's first k steps again (every process reads the same stream),
  keeps no backup of them, and after step k puts back the restored weights, optimizer
  state and metrics - the cost is those k steps' time; or
* (tf.keras) reads a feed without the k batches already trained, and adds the restored
  metric states to those of its first step (every built-in metric's state is a sum).
From there on, training and its History are the uninterrupted run's. A backup without
the file (written by plain Keras, or another position) resumes as Keras resumes it.

The chief's file also records the job (`Layout`: processes, replicas, the model's weight
shapes). A backup of another model, or of a job of another number of processes (with
several processes: of replicas), is refused before Keras restores anything: exact on
JAX (measured), but a torch process's share of the metrics, or a tf.keras worker's part
of the backup, has no place in a job of another size. One process on other devices is
exact (the global batch is fixed).

`Plan.preemption` also makes SIGTERM during the fit end the current step, back it up
through the user's callback, and exit 143 (what `kerasmgpu launch` reports as requeue).
Private names of each Keras line's BackupAndRestore are in the adapters.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.process import status

POSITION_FILE = "kerasmgpu_position.npz"


@dataclass
class Position:
    epoch: int
    steps: int  # steps done in `epoch`
    metrics: List[Any]


@dataclass
class Layout:
    """The job a backup was written by: what a resume must match to be exact."""
    processes: int
    replicas: int
    weights: List[List[int]]  # the model's weight shapes, in order

    def to_text(self) -> str:
        return json.dumps({"processes": self.processes, "replicas": self.replicas,
                           "weights": self.weights})

    @classmethod
    def of(cls, model: Any, processes: int, replicas: int) -> Layout:
        shapes = [[-1 if d is None else int(d) for d in v.shape]
                  for v in getattr(model, "weights", None) or []
                  if hasattr(v, "shape")]  # not tf_keras's vocabulary handler
        return cls(processes, replicas, shapes)


def _local_dir(backup: Any) -> Optional[str]:
    path = getattr(backup, "backup_dir", None)
    if not isinstance(path, (str, os.PathLike)) or "://" in str(path):
        return None  # a remote file system: Keras's own resume
    return os.fspath(path)


def _metric_variables(model: Any) -> List[Any]:
    return [v for metric in model.metrics for v in metric.variables]


def _metrics_file(rank: int) -> str:
    return POSITION_FILE if rank == 0 else f"kerasmgpu_metrics.{rank}.npz"


def read_position(adapter: Adapter, backup: Any, rank: int = 0) -> Optional[Position]:
    """Where `backup`'s last backup stands, if kerasmgpu wrote it beside Keras's, with
    this process's metrics (on the torch route each process holds its own share)."""
    directory = _local_dir(backup)
    if directory is None:
        return None
    chief = _read(os.path.join(directory, POSITION_FILE))
    if chief is None:
        return None
    (epoch, steps, batch), metrics = chief
    # Every process resumes at the chief's position; its metrics are its own where it
    # kept them there (each torch process holds its share), else the chief's.
    own = _read(os.path.join(directory, _metrics_file(rank))) if rank else None
    if own is not None and own[0] == chief[0]:
        metrics = own[1]
    # Keras's own record must be the one this file was written with.
    if adapter.backup_record(backup) != (epoch, batch):
        return None
    return Position(epoch, steps, metrics)


def _read(path: str) -> Optional[Tuple[Tuple[int, ...], List[Any]]]:
    if not os.path.exists(path):
        return None
    with np.load(path) as data:
        position = tuple(int(v) for v in data["position"])
        return position, [data[f"metric_{i}"] for i in range(int(data["metric_count"]))]


def read_layout(backup: Any) -> Optional[Layout]:
    """The job that wrote `backup`'s last backup, where the chief recorded it beside
    Keras's files (None: no such backup, or one written without kerasmgpu)."""
    directory = _local_dir(backup)
    path = os.path.join(directory, POSITION_FILE) if directory is not None else ""
    if not path or not os.path.exists(path):
        return None
    with np.load(path) as data:
        if "layout" not in data.files:
            return None
        fields = json.loads(str(data["layout"]))
    return Layout(int(fields["processes"]), int(fields["replicas"]),
                  [list(s) for s in fields["weights"]])


def check_layout(backup: Any, job: Layout) -> None:
    """A backup resumed by another model, or by a job with another number of processes,
    fails here, before Keras restores anything into the model."""
    written = read_layout(backup)
    if written is None:  # no backup, or one kerasmgpu did not write: Keras's resume
        return
    directory = _local_dir(backup)
    if written.weights and job.weights and written.weights != job.weights:
        raise bad_value(
            "BackupAndRestore(backup_dir)", directory,
            f"a backup of this model (weight shapes {_shapes(job.weights)})",
            f"it holds another model's weights (shapes {_shapes(written.weights)}): "
            "resume with the model that wrote it, or pass a new backup_dir to start "
            "this model from its first epoch")
    # The global batch, hence the mathematics, would be the same, but what a process
    # keeps of its own (torch: its share of the metrics; tf.keras multi-worker: its
    # part of the backup) would be lost or doubled; several processes on another
    # number of devices each is not tested. One process on other devices is exact.
    if written.processes != job.processes or (
            job.processes > 1 and written.replicas != job.replicas):
        raise bad_value(
            "BackupAndRestore(backup_dir)", directory,
            f"a backup written by a job of {job.processes} process(es) and "
            f"{job.replicas} replica(s), as this one (in one process, any number of "
            "devices)",
            f"it was written by {written.processes} process(es) and {written.replicas} "
            f"replica(s): resume it with {written.processes} process(es) (kerasmgpu launch "
            f"--nproc {written.processes}, on as many devices each), or pass a new "
            "backup_dir to start again from the first epoch")


def _shapes(weights: List[List[int]]) -> str:
    text = ", ".join("x".join(str(d) for d in shape) or "scalar" for shape in weights)
    return text if len(text) <= 200 else text[:197] + "..."


def _write_position(path: str, epoch: int, steps: int, batch: int,
                    metrics: List[Any], layout: Optional[Layout] = None) -> None:
    arrays: Dict[str, Any] = {f"metric_{i}": np.asarray(m) for i, m in enumerate(metrics)}
    if layout is not None:
        arrays["layout"] = np.array(layout.to_text())
    os.makedirs(os.path.dirname(path), exist_ok=True)  # the chief may not have made it yet
    temporary = path + ".tmp.npz"
    np.savez(temporary, position=np.array([epoch, steps, batch]),
             metric_count=np.array(len(metrics)), **arrays)
    os.replace(temporary, path)


def plan(adapter: Adapter, user_callbacks: List[Any], *, rank: int = 0,
         alone: bool = True, own_metrics: bool = False,
         layout: Optional[Layout] = None) -> Optional[Plan]:
    """How a fit with these callbacks keeps its position: None without a (local)
    BackupAndRestore kerasmgpu can follow. `rank`: this process's; the chief (0) writes
    the backups, every process reads them. `alone`: the only process of its job.
    `own_metrics`: each process's metrics hold its share (summed when read). `layout`:
    this job's, recorded with each backup and checked against a restored one."""
    found = [getattr(c, "restores", c) for c in user_callbacks]
    backups = [b for b in found
               if type(b).__name__ == "BackupAndRestore" and _local_dir(b) is not None]
    if len(backups) != 1:
        return None
    if rank == 0:
        directory = _local_dir(backups[0]) or ""
        _check_writable(directory)
        # Made now, before the first step: Keras's save checks for the directory, then
        # makes it without exist_ok, and a process writing its share of the metrics into
        # it (torch) could make it in between (FileExistsError on the chief, measured).
        os.makedirs(directory, exist_ok=True)
    if layout is not None:
        check_layout(backups[0], layout)
    tracker = Plan(adapter, backups[0], rank)
    tracker.layout = layout
    # A worker that only restores (kerasmgpu's RestoreOnly) and holds its own share of
    # the metrics still counts the steps as the chief's backup does, to keep its share
    # where the chief backs up (elsewhere the metrics are the chief's).
    tracker.counts_for_chief = own_metrics and backups[0] not in user_callbacks
    # At SIGTERM, a backup only where the chief can write one without the others: not
    # where they all take part in it, nor where each keeps its share of the metrics
    # (the others' shares of that step are not written). The last periodic backup
    # stands there.
    tracker.saves_at_signal = rank == 0 and (
        alone or not (adapter.backups_are_collective or own_metrics))
    if not adapter.follow_backup(backups[0], tracker.saved, tracker.may_save,
                                 write=not tracker.counts_for_chief):
        return None
    return tracker


def _check_writable(directory: str) -> None:
    """A backup that cannot be written fails now, not at its first save mid-training."""
    existing = directory
    while existing and not os.path.exists(existing):
        existing = os.path.dirname(existing.rstrip(os.sep)) or "."
    if os.path.isdir(existing) and os.access(existing, os.W_OK | os.X_OK):
        return
    raise bad_value(
        "BackupAndRestore(backup_dir)", directory,
        "a directory this process can create and write (or one it can write into)",
        f"{existing!r} is {'not a directory' if os.path.exists(existing) else 'missing'} "
        "or not writable: pass a backup_dir on writable storage that outlives the job")


class Plan:
    """The position in training, the backup being followed, and the way back to the
    backup's position after a resume."""

    def __init__(self, adapter: Adapter, backup: Any, rank: int) -> None:
        self.adapter = adapter
        self.backup = backup
        self.rank = rank
        self.writes = rank == 0
        self.counts_for_chief = False
        self.directory = _local_dir(backup) or ""
        self.epoch = 0
        self.steps = 0
        self.batch = 0
        self.model: Any = None
        # After a resume: the restored position, until training reaches it again.
        self.resume = read_position(adapter, backup, rank)
        self.restored: List[Any] = []
        self.settle = False  # the replay just ended: set Keras's counters at the next step
        self.saves_at_signal = False
        self.preempted = False  # SIGTERM came: back up at the end of this step, then exit
        self.ended_batch = 0  # the last batch of the epoch that ended last
        self.layout: Optional[Layout] = None  # the job's, written by the chief

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
        values = self.adapter.read_values(_metric_variables(self.model))
        _write_position(os.path.join(self.directory, _metrics_file(self.rank)),
                        self.epoch, self.steps, self.batch, values,
                        self.layout if self.rank == 0 else None)

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

    @contextlib.contextmanager
    def preemption(self) -> Iterator[None]:
        """While the fit runs: SIGTERM (what a scheduler sends before it stops the job,
        and `kerasmgpu launch` passes on) ends the current step, writes a backup of it,
        and exits with 143, the status the launcher reports as "requeue". After it, the
        user's BackupAndRestore is no longer followed."""
        if threading.current_thread() is not threading.main_thread():
            try:
                yield
            finally:
                self.adapter.unfollow_backup(self.backup)
            return

        def asked(signum: int, frame: Any) -> None:
            self.preempted = True

        previous = signal.signal(signal.SIGTERM, asked)
        try:
            yield
        finally:
            self.adapter.unfollow_backup(self.backup)
            signal.signal(signal.SIGTERM, previous)
            if self.preempted:  # after the last step: the signal is the script's again
                os.kill(os.getpid(), signal.SIGTERM)

    def answer_preemption(self, *, epoch_end: bool = False) -> None:
        """After a step (or an epoch) ended: if SIGTERM came, back up here and exit."""
        if not self.preempted:
            return
        if self.saves_at_signal and self.may_save():
            epoch, batch = self.epoch, self.batch
            if epoch_end and self.adapter.backup_resumes_mid_epoch:
                # tf.keras reads (epoch, last batch) as "the next epoch, from its start".
                epoch, batch = self.epoch - 1, self.ended_batch
            self.adapter.save_backup(self.backup, epoch, batch)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        # At once: the other processes may wait in a collective for this one.
        os._exit(status.REQUEUE)

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
        self.ended_batch = self.batch
        self.epoch, self.steps, self.batch = epoch + 1, 0, 0

    def _front(self) -> Any:
        plan = self

        class KeepPosition(self.adapter.keras.callbacks.Callback):  # type: ignore[name-defined]
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
                # The backup is deleted at the end (tf.keras keeps its directory). The
                # chief removes every process's file, before Keras's own deletion of the
                # directory (this callback runs first): another process removing its own
                # while that deletion lists the directory fails it (measured on torch).
                # The others wrote their last share before the epoch end's collective.
                if plan.rank == 0 and getattr(plan.backup, "delete_checkpoint", True):
                    names = glob.glob(os.path.join(glob.escape(plan.directory),
                                                   "kerasmgpu_metrics.*.npz"))
                    for name in [os.path.join(plan.directory, _metrics_file(0)), *names]:
                        try:
                            os.remove(name)
                        except FileNotFoundError:
                            pass

        return KeepPosition()

    def _back(self) -> Any:
        plan = self

        class TakeRestored(self.adapter.keras.callbacks.Callback):  # type: ignore[name-defined]
            """Runs after the user's BackupAndRestore restored: keeps what it restored."""

            def on_train_begin(self, logs: Any = None) -> None:
                if plan.resume is not None and not plan.adapter.backup_resumes_mid_epoch:
                    plan.model = self.model
                    plan.restored = plan.adapter.read_values(plan.state())

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if plan.counts_for_chief:
                    plan.backup.on_train_batch_end(batch, logs)
                if plan.preempted:
                    plan.model = self.model  # JAX: the step's state into the variables
                    plan.answer_preemption()

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                if plan.counts_for_chief:
                    plan.backup.on_epoch_begin(epoch, logs)

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                if plan.counts_for_chief:
                    plan.backup.on_epoch_end(epoch, logs)
                plan.answer_preemption(epoch_end=True)

        return TakeRestored()
