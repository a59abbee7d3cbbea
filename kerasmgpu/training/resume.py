"""A parallel fit resumed from Keras's `BackupAndRestore` ends where an uninterrupted one ends.

Keras 3's `BackupAndRestore(save_freq=N)` writes the weights and optimizer state every N
steps, but restores only the epoch: a job stopped after step k of epoch e restarts
epoch e from its first batch with the weights of step k, trains the first k batches a
second time, and its History of epoch e holds only the steps after the restart.
tf.keras's continues at step k+1, but reads the epoch's data from its start. Here
each backup is one generation (`kerasmgpu.process.backups`): Keras's files, where
training stood (the epoch and the steps done in it) and the epoch's metric states
(`kerasmgpu_position.npz`; on torch every process writes its own share), and a
manifest written last - all visible together or not at all, the previous generation
kept until the new one is complete. A fit that restores such a backup then either
* (Keras 3) runs the epoch's first k steps again (every process reads the same stream),
  keeps no backup of them, and after step k puts back the restored weights, optimizer
  state and metrics - the cost is those k steps' time; or
* (tf.keras) reads a feed without the k batches already trained, and adds the restored
  metric states to those of its first step (every built-in metric's state is a sum).
From there on, training and its History are the uninterrupted run's. A directory without
a generation (written by plain Keras) resumes as Keras resumes it; one whose every
generation is damaged fails before training, naming the file and the fault.

The manifest also records the job (`Layout`: processes, replicas, the global batch, the
model's weight shapes). A backup of another model, of another global batch (the batches
after it would be others), or of a job of another number of processes (with several
processes: of replicas), is refused before Keras restores anything: exact on JAX
(measured), but a torch process's share of the metrics, or a tf.keras worker's part of
the backup, has no place in a job of another size. One process on other devices is exact
(the global batch is fixed).

`Plan.preemption` also makes SIGTERM during the fit end the current step, back it up
through the user's callback, and exit 143 (what `kerasmgpu launch` reports as requeue).
Private names of each Keras line's BackupAndRestore are in the adapters.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.process import backups, status

POSITION_FILE = "kerasmgpu_position.npz"


class KerasMGPUBackupWarning(UserWarning):
    """A backup newer than the one resumed could not be restored (it is named, with why)."""


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
    global_batch: Optional[int] = None  # rows per step, where fit knows it (arrays)

    def to_record(self) -> Dict[str, Any]:
        return {"processes": self.processes, "replicas": self.replicas,
                "global_batch": self.global_batch, "weights": self.weights}

    @classmethod
    def from_record(cls, fields: Dict[str, Any]) -> Layout:
        batch = fields.get("global_batch")
        return cls(int(fields["processes"]), int(fields["replicas"]),
                   [list(s) for s in fields["weights"]],
                   None if batch is None else int(batch))

    @classmethod
    def of(cls, model: Any, processes: int, replicas: int,
           global_batch: Optional[int] = None) -> Layout:
        shapes = [[-1 if d is None else int(d) for d in v.shape]
                  for v in getattr(model, "weights", None) or []
                  if hasattr(v, "shape")]  # not tf_keras's vocabulary handler
        return cls(processes, replicas, shapes, global_batch)


def _local_dir(backup: Any) -> Optional[str]:
    path = getattr(backup, "backup_dir", None)
    if not isinstance(path, (str, os.PathLike)) or "://" in str(path):
        return None  # a remote file system: Keras's own resume
    return os.fspath(path)


def _metric_variables(model: Any) -> List[Any]:
    return [v for metric in model.metrics for v in metric.variables]


def _write_arrays(path: str, number: int, position: Tuple[int, int, int],
                  metrics: List[Any]) -> None:
    arrays: Dict[str, Any] = {f"metric_{i}": np.asarray(m) for i, m in enumerate(metrics)}
    np.savez(path, position=np.array(position), generation=np.array(number),
             metric_count=np.array(len(metrics)), **arrays)


def _read_arrays(path: str) -> Tuple[Tuple[int, ...], List[Any]]:
    with np.load(path) as data:
        position = tuple(int(v) for v in data["position"])
        return position, [data[f"metric_{i}"] for i in range(int(data["metric_count"]))]


def check_layout(directory: str, written: Layout, job: Layout) -> None:
    """A backup resumed by another model, another global batch, or a job with another
    number of processes fails here, before Keras restores anything into the model."""
    if written.weights and job.weights and written.weights != job.weights:
        raise bad_value(
            "BackupAndRestore(backup_dir)", directory,
            f"a backup of this model (weight shapes {_shapes(job.weights)})",
            f"it holds another model's weights (shapes {_shapes(written.weights)}): "
            "resume with the model that wrote it, or pass a new backup_dir to start "
            "this model from its first epoch")
    if (written.global_batch is not None and job.global_batch is not None
            and written.global_batch != job.global_batch):
        raise bad_value(
            "BackupAndRestore(backup_dir)", directory,
            f"a backup of a fit with this global batch ({job.global_batch} rows a step)",
            f"it was written by a fit of {written.global_batch} rows a step, and the "
            "batches after it would be others: resume with "
            f"batch_size={written.global_batch}, or pass a new backup_dir to start again "
            "from the first epoch")
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


@dataclass
class Restored:
    """The generation a resume restores, and where it stands."""
    generation: backups.Generation
    position: Position
    layout: Optional[Layout]


def choose(directory: str, rank: int, job: Optional[Layout]) -> Tuple[Optional[Restored], int]:
    """The newest complete backup in `directory` (None: none; a directory whose every
    backup is damaged is an error), checked against `job`; and the next backup's number.
    Every process of a job reads the same listing and chooses alike."""
    choice = backups.choose(directory)
    chosen = choice.chosen
    if chosen is None and choice.problems:
        faults = "; ".join(f"backup {number}: {problem}" for number, problem in choice.problems)
        raise bad_value(
            "BackupAndRestore(backup_dir)", directory,
            "a directory holding a complete backup, or none (a new fit)",
            f"no backup in it can be restored - {faults}. Restore the file, or pass a new "
            "backup_dir (or empty this one) to start again from the first epoch")
    if chosen is None:
        return None, choice.next_number
    manifest = chosen.manifest
    layout = Layout.from_record(manifest["job"]) if manifest.get("job") else None
    if layout is not None and job is not None:
        check_layout(directory, layout, job)
    epoch, steps, batch = (int(manifest["position"][k]) for k in ("epoch", "steps", "batch"))
    own = (os.path.join(directory, backups.SHARE.format(chosen.number, rank))
           if rank in manifest.get("shares", []) else os.path.join(chosen.path, POSITION_FILE))
    position, metrics = _read_arrays(own)
    if position != (epoch, steps, batch):
        raise bad_value(
            "BackupAndRestore(backup_dir)", directory, "files of one backup",
            f"{own} was written at epoch {position[0]}, step {position[1]} and the backup "
            f"at epoch {epoch}, step {steps}: pass a new backup_dir to start again")
    if rank == 0:
        for number, problem in choice.problems:
            warnings.warn(f"kerasmgpu: backup {number} cannot be restored - {problem}; "
                          f"resuming from backup {chosen.number}, the newest complete one",
                          KerasMGPUBackupWarning, stacklevel=4)
        sys.stderr.write(f"kerasmgpu: resuming from backup {chosen.number} in {directory} "
                         f"(epoch {epoch + 1}, {steps} step(s) done in it)\n")
    return Restored(chosen, Position(epoch, steps, metrics), layout), choice.next_number


def plan(adapter: Adapter, user_callbacks: List[Any], *, rank: int = 0,
         alone: bool = True, own_metrics: bool = False,
         layout: Optional[Layout] = None) -> Optional[Plan]:
    """How a fit with these callbacks keeps its position: None without a (local)
    BackupAndRestore kerasmgpu can follow. `rank`: this process's; the chief (0) writes
    the backups, every process reads them. `alone`: the only process of its job.
    `own_metrics`: each process's metrics hold its share (summed when read). `layout`:
    this job's, recorded with each backup and checked against a restored one."""
    found = [getattr(c, "restores", c) for c in user_callbacks]
    candidates = [b for b in found if type(b).__name__ == "BackupAndRestore"]
    for backup in candidates:
        adapter.unfollow_backup(backup)  # what an earlier fit that failed left pointed
    backups_ = [b for b in candidates if _local_dir(b) is not None]
    if len(backups_) != 1:
        return None
    backup = backups_[0]
    directory = _local_dir(backup) or ""
    if rank == 0:
        _check_writable(directory)
        # Made now, before the first step: a process writing its share of the metrics
        # into it (torch) could otherwise make it while the chief does.
        os.makedirs(directory, exist_ok=True)
    restored, number = choose(directory, rank, layout)
    tracker = Plan(adapter, backup, rank, directory, number)
    tracker.layout = layout
    tracker.own_metrics = own_metrics
    tracker.resume = restored.position if restored is not None else None
    # A worker that only restores (kerasmgpu's RestoreOnly) and holds its own share of
    # the metrics still counts the steps as the chief's backup does, to write its share
    # where the chief backs up (elsewhere the metrics are the chief's).
    tracker.counts_for_chief = own_metrics and backup not in user_callbacks
    # At SIGTERM, a backup only where the chief can write one without the others: not
    # where they all take part in it, nor where each keeps its share of the metrics
    # (the others' shares of that step are not written). The last periodic backup
    # stands there.
    tracker.saves_at_signal = rank == 0 and (
        alone or not (adapter.backups_are_collective or own_metrics))
    if not adapter.follow_backup(backup, tracker.save, tracker.may_save):
        return None
    if restored is not None:
        adapter.restore_from(backup, restored.generation.path)
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

    def __init__(self, adapter: Adapter, backup: Any, rank: int, directory: str,
                 number: int) -> None:
        self.adapter = adapter
        self.backup = backup
        self.rank = rank
        self.directory = directory
        self.number = number  # the next backup's generation
        self.counts_for_chief = False
        self.own_metrics = False
        self.epoch = 0
        self.steps = 0
        self.batch = 0
        self.model: Any = None
        # After a resume: the restored position, until training reaches it again.
        self.resume: Optional[Position] = None
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

    def save(self, write_into: Callable[[str], None]) -> None:
        """One backup, as one generation: on the chief, Keras's files (`write_into`), the
        position and the manifest, renamed into place; on a process that keeps its own
        metrics, its share; on a tf.keras worker, its part of the collective save."""
        number, self.number = self.number, self.number + 1
        backups.reached("before", self.directory)
        position = (int(self.epoch), int(self.steps), int(self.batch))
        if self.rank == 0:
            self._write_generation(number, position, write_into)
        else:
            if self.adapter.backups_are_collective:
                scratch = os.path.join(self.directory, f".kerasmgpu-process{self.rank}")
                try:
                    write_into(scratch)
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
            # Read after Keras's save on every process, in the same order: a tf.keras
            # worker's metric states are synchronised variables, and reading one is a
            # collective every worker takes part in.
            values = self._metric_values()
            if self.own_metrics:
                backups.write_share(self.directory, number, self.rank,
                                    lambda path: _write_arrays(path, number, position, values))
        backups.reached("after", self.directory)

    def _metric_values(self) -> List[Any]:
        # After Keras's own save, which on JAX has put the step's state into the
        # variables (its callbacks' `model` does).
        return self.adapter.read_values(_metric_variables(self.model))

    def _write_generation(self, number: int, position: Tuple[int, int, int],
                          write_into: Callable[[str], None]) -> None:
        staging = backups.stage(self.directory, number)
        write_into(staging)
        values = self._metric_values()
        backups.reached("weights", staging)
        _write_arrays(os.path.join(staging, POSITION_FILE), number, position, values)
        backups.reached("position", staging)
        processes = self.layout.processes if self.layout is not None else 1
        record = {"position": dict(zip(("epoch", "steps", "batch"), position)),
                  "job": self.layout.to_record() if self.layout is not None else None,
                  "shares": list(range(1, processes)) if self.own_metrics else []}
        backups.commit(self.directory, number, staging, record)
        # Double checkpointing (Keras 3's option): the previous complete one stays too.
        keep = 2 if getattr(self.backup, "double_checkpoint", False) else 1
        backups.prune(self.directory, below=number + 1, keep=keep)

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
                # The backup is deleted at the end, as Keras deletes its own (tf.keras
                # only its chief/ folder): by the chief alone, every process's share too
                # (the others wrote their last one before the epoch end's collective).
                if plan.rank == 0 and getattr(plan.backup, "delete_checkpoint", True):
                    backups.remove_all(plan.directory)

        return KeepPosition()

    def _back(self) -> Any:
        plan = self

        class TakeRestored(self.adapter.keras.callbacks.Callback):  # type: ignore[name-defined]
            """Runs after the user's BackupAndRestore restored: keeps what it restored."""

            def on_train_begin(self, logs: Any = None) -> None:
                # Keras restored: its next backups are kerasmgpu's generations anyway.
                plan.adapter.restore_from(plan.backup, None)
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
