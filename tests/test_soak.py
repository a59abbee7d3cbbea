"""Soak: jobs SIGKILLed at random instants over a long fit, restarted, counted exact or not.

Not in CI (minutes): marked `soak`, skipped unless KERASMGPU_SOAK=1.

    KERASMGPU_SOAK=1 KERASMGPU_SOAK_TRIALS=10 pytest -s -m soak tests/test_soak.py

Each trial launches `tests/workers/train.py` under `kerasmgpu launch --max-restarts 1`
(2 processes where the line has a multi-process route, else 1 process on 2 devices): 4
epochs of 21 steps with a backup after every step, so that a random instant often falls
inside a backup's write. The test draws one of the fit's backups, waits until it is
complete, then 0-50 ms more (into the next step's compute or its backup's write), and
SIGKILLs one process (the chief and the other in turn); the launcher restarts the job,
which resumes.
A trial is exact when the job ends within 1e-5 of the same fit run without a kill
(weights, optimizer state, the History of the epochs the last run trained). The summary
line (printed, and written to $KERASMGPU_SOAK_REPORT if set) is the figure in
docs/processes.md.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from pathlib import Path
from typing import Dict, List

import jobs
import numpy as np
import pytest
from helpers import LINE, ON_JAX, ON_TORCH, wait_until
from jobs import group_members
from test_distributed import (
    LOCAL_DEVICES,
    MULTI_WORKER_LINES,
    WORKER,
    _env,
    _single,
    trains_in_processes,
)

pytestmark = [pytest.mark.soak, pytest.mark.multiprocess, pytest.mark.timeout(7200),
              pytest.mark.skipif(os.environ.get("KERASMGPU_SOAK") != "1",
                                 reason="a soak of minutes: KERASMGPU_SOAK=1")]

OPTIONS = ["--epochs", "4", "--rows", "201", "--save-freq", "1", "--momentum", "0.9"]
BACKUPS = 4 * 21  # one a step: 201 rows in batches of 10, 4 epochs
_COMPLETE = re.compile(r"^kerasmgpu-backup-(\d{6})$")


def _newest(backup: Path) -> int:
    """The newest complete backup's number (its directory renamed into place), or -1."""
    names = os.listdir(backup) if backup.is_dir() else []
    return max((int(m.group(1)) for m in map(_COMPLETE.match, names) if m), default=-1)


def _exact(expected: Path, got: Path) -> str:
    """'' when `got` ends where `expected` does (within 1e-5), else what differs."""
    a, b = np.load(expected, allow_pickle=True), np.load(got, allow_pickle=True)
    keys = sorted(k for k in a.files if k.startswith(("arr_", "optimizer_")))
    for key in keys:
        if not np.allclose(a[key], b[key], rtol=1e-5, atol=1e-5):
            return f"{key} differs by {np.abs(a[key] - b[key]).max():.2e}"
    trained = len(b["loss"])
    for key in ("loss", "val_loss"):
        if not np.allclose(a[key][-trained:], b[key], rtol=1e-5, atol=1e-6):
            return f"{key} {b[key]} != {a[key][-trained:]}"
    return ""


def _trial(root: Path, nproc: int, rank: int, rng: random.Random) -> Dict[str, object]:
    out, backup = root / "run", root / "backup"
    out.mkdir(parents=True)
    env = {**_env(), **({"KERASMGPU_VIRTUAL_DEVICES": "2"} if nproc == 1 else {})}
    command = jobs.launch_command([WORKER, str(out), *OPTIONS, "--backup", str(backup)],
                                  nproc=nproc, timeout=900, restarts=1)
    record: Dict[str, object] = {}
    with jobs.Job() as launched:
        job = launched.start(command, env=env, merge_stderr=True)
        # The instant: a backup drawn from the fit's (one a step), then 0-50 ms into the
        # step after it - its compute, or its backup's write. A time drawn from a
        # fixed window instead fell after the end of a fit this short on an idle machine.
        target = rng.randint(1, BACKUPS - 4)
        started = wait_until(lambda: _newest(backup) >= target, timeout=600, poll=0.002)
        assert started, f"no backup {target} within 600 s"
        began = time.time()
        time.sleep(rng.uniform(0.0, 0.05))
        pid = int((out / f"pid{rank}.run0").read_text())
        writing = any(backup.glob(".kerasmgpu-staging-*"))
        try:
            os.kill(pid, signal.SIGKILL)
            killed = True
        except ProcessLookupError:  # the job had ended: a trial without a kill
            killed = False
        record.update(rank=rank, after_backup=target,
                      after_it_s=round(time.time() - began, 3), killed=killed,
                      a_write_under_way=writing)
        output = launched.wait(job, 1200).stdout
    record["status"] = job.returncode
    record["restarted"] = "restarting the whole job" in output
    resumed = [line for line in output.splitlines() if "resuming from backup" in line]
    record["resumed"] = resumed[0].split("kerasmgpu: ")[-1] if resumed else None
    pids = jobs.pids(out, "pid*.run*")
    record["left_behind"] = [] if wait_until(lambda: not group_members(pids)) else \
        group_members(pids)
    record["output_tail"] = output[-1500:] if job.returncode else ""
    return record


@trains_in_processes
def test_random_kills_resume_exactly(tmp_path: Path) -> None:
    nproc = 2 if ON_JAX or ON_TORCH or LINE in MULTI_WORKER_LINES else 1
    trials = int(os.environ.get("KERASMGPU_SOAK_TRIALS", "5"))
    rng = random.Random(int(os.environ.get("KERASMGPU_SOAK_SEED", "0")))
    reference = tmp_path / "reference"
    done = _single(reference, *OPTIONS, env={"KERASMGPU_VIRTUAL_DEVICES": str(LOCAL_DEVICES)}
                   if LOCAL_DEVICES > 1 else None)
    assert done.returncode == 0, done.stderr[-3000:]
    records: List[Dict[str, object]] = []
    for trial in range(trials):
        # The chief (the writer) and the other process in turn.
        record = _trial(tmp_path / f"trial{trial}", nproc, trial % nproc, rng)
        got = tmp_path / f"trial{trial}" / "run" / "rank0.npz"
        record["difference"] = (_exact(reference / "rank0.npz", got) if got.exists()
                                else "no result")
        records.append(record)
        print(json.dumps({"trial": trial, **record}), flush=True)
    exact = sum(1 for r in records if not r["difference"] and r["status"] == 0)
    during = sum(1 for r in records if r["a_write_under_way"])
    killed = sum(1 for r in records if r["killed"])
    summary = (f"soak: {exact} of {trials} jobs ended exactly, {killed} of them SIGKILLed "
               f"at a random instant and restarted ({during} while a backup's files were "
               f"being written; {nproc} "
               f"process(es), {os.environ.get('KERASMGPU_TEST_ENV', 'this env')})")
    print(summary, flush=True)
    if os.environ.get("KERASMGPU_SOAK_REPORT"):
        with open(os.environ["KERASMGPU_SOAK_REPORT"], "a") as f:
            f.write(json.dumps({"summary": summary, "trials": records}) + "\n")
    assert all(not r["left_behind"] for r in records), records
    assert exact == trials, [r for r in records if r["difference"] or r["status"]]
