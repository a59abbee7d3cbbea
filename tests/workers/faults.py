"""Fault injection for train.py (`--faults`): a process dies at a chosen point of a save.

    --faults HOW:POINT@RANK,HOW:POINT@RANK,...

Run r of a job (KERASMGPU_RESTART_COUNT=r under a restarting launcher) applies the r-th
fault, later runs none: process RANK dies by HOW (sigkill: SIGKILL to itself; raise: an
uncaught exception) at POINT of the second backup that run writes (the first completes,
so that every run moves the job on), reached through `kerasmgpu.process.backups.reached`:

* before, position, commit, share, after: those points of the write (`POINTS`);
* weights: Keras's files of the backup are written, kerasmgpu's not yet ("between the
  weights and the position");
* weights-truncated: the same, after cutting the largest of those files to half its
  length - the disk as a kill during the weights write leaves it;
* replace: the ModelCheckpoint file of --checkpoint about to replace the one an earlier
  write left;
* step: not at a save - after the third step of the run (between backups).

At `share` on a process other than the chief, it first waits (bounded) for the chief's
backup to be complete on disk: the kill falls between two processes' writes.
"""

import os
import re
import signal
import time

from kerasmgpu.process import backups

POINTS = ("before", "weights", "weights-truncated", "position", "commit", "share", "after",
          "replace", "step")


class Faults:
    def __init__(self, spec, out, rank, run):
        self.out, self.rank, self.run = out, rank, run
        faults = []
        for item in filter(None, (spec or "").split(",")):
            how, where = item.split(":")
            point, _, target = where.partition("@")
            assert how in ("sigkill", "raise") and point in POINTS, item
            faults.append((how, point, int(target or 0)))
        self.fault = faults[run] if run < len(faults) else None
        self.saves = 0
        if self.fault is not None and self.fault[2] == rank and self.fault[1] != "step":
            backups.reached = self.reached

    def reached(self, point, path):
        if point == "before":
            self.saves += 1
        how, target, _ = self.fault
        if target == "replace":
            # The ModelCheckpoint's file (not the backup's weights, which the same save
            # writes), where an earlier write left one to keep.
            final = os.path.join(os.path.dirname(path), "checkpoint.weights.h5")
            if point != "replace" or not path.endswith("-checkpoint.weights.h5") or \
                    not os.path.exists(final):
                return
        elif point != target.split("-")[0] or self.saves != 2:
            return
        if target == "weights-truncated":
            files = [os.path.join(root, name) for root, _, names in os.walk(path)
                     for name in names]
            largest = max(files, key=os.path.getsize)
            with open(largest, "r+b") as f:
                f.truncate(os.path.getsize(largest) // 2)
        if point == "share":
            number = int(re.search(r"-(\d{6})\.process", path).group(1))
            chief = os.path.join(os.path.dirname(path), backups.GENERATION.format(number))
            deadline = time.time() + 60
            while not os.path.exists(chief) and time.time() < deadline:
                time.sleep(0.05)
        self.fail(f"{target} of backup write {self.saves}")

    def at_step(self, steps):
        """Called after every training step of the run."""
        if (self.fault is not None and self.fault[1] == "step" and self.fault[2] == self.rank
                and steps == 3):
            self.fail("after step 3")

    def fail(self, where):
        how = self.fault[0]
        with open(os.path.join(self.out, "crashed"), "w") as f:  # when, for the bounds
            f.write(repr(time.time()))
        with open(os.path.join(self.out, f"fault{self.run}.txt"), "w") as f:
            f.write(f"{how} at {where} on rank {self.rank}")
        print(f"rank {self.rank}: fault {self.run}: {how} at {where}", flush=True)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"rank {self.rank} fails on purpose at {where}")


def check_checkpoint(model, path, out, run):
    """At a run's start: whether the ModelCheckpoint file an earlier run left loads (a
    kill while it was replaced must leave the previous one whole); the model's weights
    are put back."""
    if not os.path.exists(path):
        return
    initial = model.get_weights()
    try:
        model.load_weights(path)
        outcome = "loads"
    except Exception as error:  # what a truncated file raises varies by line
        outcome = f"fails: {type(error).__name__}: {error}"
    model.set_weights(initial)
    with open(os.path.join(out, f"checkpoint-check.run{run}.txt"), "w") as f:
        f.write(outcome)
