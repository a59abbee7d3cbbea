"""The launchers people already use start a job with no change to the script, for real.

`tests/workers/train.py` (the script of test_distributed.py) runs as 2 processes under
torchrun, Open MPI's `mpirun`, SLURM's `srun` (a single-node slurmctld + slurmd, which
`.ci/run` starts), and as 2 processes started here with a cluster-style TF_CONFIG: each
job must name its launcher, end with the weights of one process trained on the same
global batches, and listen on loopback where kerasmgpu starts the listener. A process
that fails under an external launcher must not keep the others waiting: the launcher
ends the job (torchrun, `mpirun`, `srun --kill-on-bad-exit=1`) within the bound.
The docs' SLURM batch script (docs/processes.md), preempted with USR1 and requeued by its own
`scontrol requeue` under sbatch, resumes in its second run and ends where an
uninterrupted run ends (the last section).

A launcher that is not installed here is skipped, and the skip says how to get it.
Every run is bounded (`timeout`), in its own process group, and checked for leftovers
(tests/jobs.py).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import jobs
import numpy as np
import pytest
from helpers import LINE, ON_JAX, ON_TORCH, wait_until
from jobs import alive, group_members
from test_distributed import (
    LOCAL_DEVICES,
    MID_EPOCH,
    MULTI_WORKER_LINES,
    WORKER,
    _assert_resumed_exactly,
    _assert_same,
    _env,
    _loopback,
    _paired_weights,
    one_process_references,
    trains_in_processes,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600), trains_in_processes]
RUN_TIMEOUT = 300


def _torchrun() -> Optional[str]:
    """torchrun ships with torch: this env's, or the torch env's next to it (tox puts
    every env under one .tox folder), so that JAX and TensorFlow scripts run under it too."""
    chosen = os.environ.get("KERASMGPU_TEST_TORCHRUN") or shutil.which("torchrun")
    if not chosen:
        siblings = sorted(Path(sys.executable).parents[1].parent.glob("*torch*/bin/torchrun"))
        chosen = str(siblings[-1]) if siblings else None
    if chosen is None:
        return None
    try:  # a torch env still being installed (tox -p) is not one to use
        ok = subprocess.run([chosen, "--help"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return chosen if ok else None


def _slurm_ready() -> bool:
    if not (shutil.which("srun") and shutil.which("sinfo")):
        return False
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                                timeout=20).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return False
    return any(state in ("idle", "mix", "alloc") for state in states)


TORCHRUN = _torchrun()
MPIRUN = shutil.which("mpirun")
SLURM = _slurm_ready()
needs = {
    "torchrun": pytest.mark.skipif(
        TORCHRUN is None, reason="torchrun not found: pip install torch (it ships torchrun), "
        "or set KERASMGPU_TEST_TORCHRUN"),
    "mpirun": pytest.mark.skipif(
        MPIRUN is None, reason="mpirun not found: apt-get install openmpi-bin (.ci/run does)"),
    "srun": pytest.mark.skipif(
        not SLURM, reason="no SLURM node answers sinfo: .ci/run starts slurmctld and "
        "slurmd from Debian's slurm-wlm packages"),
}


# Where CI runs each external launcher: one line each. What a launcher gives a process
# (rank, world size, rank 0's address) is read by env/cluster.py, which imports no
# framework; each line's rendezvous is the same under any launcher (and runs under
# `kerasmgpu launch` on every multi-process line, test_distributed.py). So a launcher x line
# pair adds time (20-50 s each), not a path: torchrun on torch, its own; mpirun on JAX,
# whose processes waited at exit; srun on tf_keras (TensorFlow's gRPC servers); the README's
# batch script on torch. KERASMGPU_LAUNCHERS=all runs every launcher on every line.
LAUNCHER_LINE = {"torchrun": "torch", "mpirun": "jax", "srun": "tf", "sbatch": "torch"}
_THIS_LINE = "torch" if ON_TORCH else "jax" if ON_JAX else "tf"


def on_its_line(launcher: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        os.environ.get("KERASMGPU_LAUNCHERS") != "all"
        and LAUNCHER_LINE[launcher] != _THIS_LINE,
        reason=f"{launcher} runs on the {LAUNCHER_LINE[launcher]} line (LAUNCHER_LINE: the "
        f"launcher is read without a framework); this env: {_THIS_LINE}; "
        "KERASMGPU_LAUNCHERS=all runs it here")


def _command(launcher: str, out: Path, *args: str) -> List[str]:
    script = [sys.executable, WORKER, str(out), *args]
    if launcher == "torchrun":
        assert TORCHRUN is not None
        return [TORCHRUN, "--standalone", "--nproc_per_node", "2", "--no-python", *script]
    if launcher == "mpirun":
        assert MPIRUN is not None
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return [MPIRUN, *root, "--oversubscribe", "--bind-to", "none", "-np", "2", *script]
    # --overcommit/--oversubscribe: envs testing at once share the node's cores
    # instead of queueing behind each other.
    return ["srun", "--ntasks", "2", "--overcommit", "--oversubscribe", "--kill-on-bad-exit=1",
            "--time", "10", *script]


def _run(command: List[str], env: Dict[str, str]) -> subprocess.CompletedProcess:
    """Run a launcher in its own process group, killed with everything in it on timeout."""
    return jobs.run(command, env=env, timeout=RUN_TIMEOUT)


def _assert_nothing_left(out: Path) -> None:
    pids = jobs.pids(out)
    assert pids
    assert wait_until(lambda: not group_members(pids) and not any(
        os.path.exists(f"/proc/{pid}") and alive(pid) for pid in pids)), "left behind"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process on the same global batches, 3 epochs without a stop (shared by every
    launcher's test, and with test_distributed.py: trained once a session)."""
    return one_process_references(tmp_path_factory) / "arrays" / "rank0.npz"


def _check_job(out: Path, reference: Path, name: str) -> None:
    import numpy as np

    rank0, rank1 = out / "rank0.npz", out / "rank1.npz"
    for u, v in _paired_weights(rank0, rank1):
        np.testing.assert_allclose(u, v, atol=1e-6)
    _assert_same(reference, rank0)
    for rank, path in enumerate((rank0, rank1)):
        described = str(np.load(path, allow_pickle=True)["cluster"])
        assert described.startswith(f"{name}: process {rank} of 2"), described
    assert str(np.load(rank0, allow_pickle=True)["replicas"]) == str(2 * LOCAL_DEVICES)
    assert sorted(p.name for p in out.glob("template-from-rank*")) == [
        "template-from-rank0.weights.h5"]
    seen = [json.loads((out / f"listeners{rank}.json").read_text()) for rank in (0, 1)]
    by_port = {port: host for job in seen for host, port in job["sockets"]}
    if ON_JAX:
        assert seen[0]["jax"] in by_port and _loopback(by_port[seen[0]["jax"]]), seen
    if ON_TORCH and seen[0]["torch"] is not None:
        assert seen[0]["torch"] in by_port and _loopback(by_port[seen[0]["torch"]]), seen


@pytest.mark.parametrize("launcher, name", [
    pytest.param("torchrun", "torchrun", marks=[needs["torchrun"], on_its_line("torchrun")]),
    pytest.param("mpirun", "Open MPI", marks=[needs["mpirun"], on_its_line("mpirun")]),
    pytest.param("srun", "SLURM", marks=[needs["srun"], on_its_line("srun")]),
])
def test_two_processes_of_an_external_launcher_train_as_one_job(
        tmp_path: Path, reference: Path, launcher: str, name: str) -> None:
    out = tmp_path / "job"
    out.mkdir()
    run = _run(_command(launcher, out, "--listeners"), _env())
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    _check_job(out, reference, name)
    _assert_nothing_left(out)


@needs["torchrun"]
# On torch only in CI, torchrun's own line: 2.5-4 min an env; it also passed on Keras 3
# JAX and tf_keras 2.21 when it was built (the same resume code is tested there under
# `kerasmgpu launch --max-restarts` and a SLURM requeue).
@pytest.mark.skipif(not ON_TORCH, reason="torchrun's restarts are tested on Keras 3 torch "
                    "(CI time); the resume path of the other lines runs under kerasmgpu "
                    "launch and SLURM")
def test_torchrun_restarts_a_killed_worker_and_the_job_resumes_exactly(
        tmp_path: Path, reference: Path) -> None:
    """`torchrun --max-restarts 1`: rank 1 SIGKILLs itself at step 17 (epoch 1, its 6th
    step; the last backup holds step 16); torchrun starts both workers again, they
    resume from the BackupAndRestore and end with the uninterrupted run's weights and
    History of the epochs they train."""
    assert TORCHRUN is not None
    out, backup = tmp_path / "job", tmp_path / "backup"
    out.mkdir()
    command = [TORCHRUN, "--standalone", "--nproc_per_node", "2", "--max-restarts", "1",
               "--no-python", sys.executable, WORKER, str(out), *MID_EPOCH,
               "--backup", str(backup), "--crash-rank", "1", "--crash-step", "17",
               "--crash-epoch", "1", "--crash-how", "sigkill"]
    run = _run(command, _env())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-8000:]
    assert (out / "crashed").exists() and (out / "pid1.run1").exists(), sorted(
        p.name for p in out.iterdir())
    _assert_resumed_exactly(reference, out)
    _assert_nothing_left(out)


@pytest.mark.skipif(LINE not in MULTI_WORKER_LINES,
                    reason="TF_CONFIG drives TensorFlow's MultiWorkerMirroredStrategy")
def test_a_cluster_tf_config_trains_as_one_job(tmp_path: Path, reference: Path) -> None:
    from kerasmgpu.launch import free_port_block

    out = tmp_path / "job"
    out.mkdir()
    port = free_port_block(2)
    workers = [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]
    with jobs.Job() as job:
        procs = []
        for index in range(2):
            config = {"cluster": {"worker": workers},
                      "task": {"type": "worker", "index": index}}
            procs.append(job.start([sys.executable, WORKER, str(out), "--listeners"],
                                   env={**_env(), "TF_CONFIG": json.dumps(config)}))
        results = [job.wait(proc, RUN_TIMEOUT) for proc in procs]
    for result in results:
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    _check_job(out, reference, "TF_CONFIG")
    _assert_nothing_left(out)


@pytest.mark.skipif(not ON_JAX, reason="the line whose processes waited for each other at "
                    "exit (Keras 3 on JAX); the others end sooner")
@needs["mpirun"]
def test_a_failing_process_does_not_keep_the_others_waiting(tmp_path: Path) -> None:
    # One launcher is enough here: what ends the job is the launcher's own reaction to a
    # process that exits non-zero (torchrun and `srun --kill-on-bad-exit=1` do the same);
    # what kerasmgpu must do is exit that process instead of waiting at its exit.
    launcher = "mpirun"
    out = tmp_path / "job"
    out.mkdir()
    run = _run(_command(launcher, out, "--epochs", "2", "--crash-rank", "1",
                        "--crash-epoch", "0", "--crash-how", "sys_exit"), _env())
    returned = time.time()
    assert run.returncode != 0
    died = float((out / "crashed").read_text())
    assert returned - died < 60, f"{launcher} returned {returned - died:.0f} s after the failure"
    assert not (out / "rank0.npz").exists()
    _assert_nothing_left(out)


# --- SLURM: the docs' batch script, preempted and requeued for real ----------------------
#
# The batch script of docs/processes.md "Restarts and preemption", as printed but for two processes and
# no GPU request (this node has none), submitted with sbatch to the one-node cluster. After
# step 17 (epoch 1, its 6th step) rank 0 asks SLURM for USR1 to the batch script
# (`scancel --batch --signal=USR1`, the delivery `--signal=B:USR1@120` uses at the time
# limit); the script's trap passes it to `kerasmgpu launch`, which stops the workers and
# exits 143, and the script runs `scontrol requeue`. SLURM runs the script again
# (SLURM_RESTART_COUNT=1): the same command resumes from the BackupAndRestore backup and
# must end where an uninterrupted run ends (within 1e-5).

JOB_TIMEOUT = 400  # both runs of the job, and the wait between them
_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
          "BOOT_FAIL", "DEADLINE")


def _job(job_id: str) -> Dict[str, str]:
    """`scontrol show job` as a dict ({} once SLURM has forgotten the job)."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                           text=True, timeout=30).stdout
    return dict(field.split("=", 1) for field in shown.split() if "=" in field)


def _cancelled(job_id: str) -> bool:
    """SIGKILL to every process of the job, then cancel it: a plain scancel sends SIGTERM,
    which the docs' script reads as preemption and requeues the job (seen here)."""
    subprocess.run(["scancel", "--full", "--signal=KILL", job_id], capture_output=True,
                   timeout=30)
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    return _job(job_id).get("JobState", "") in _ENDED + ("",)


def _processes_mentioning(text: str) -> List[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return [pid for pid in found if alive(pid) and pid != os.getpid()]


def _sbatch_script(out: Path, *args: str) -> str:
    from test_launch import _readme_sbatch

    script = _readme_sbatch()
    assert "#SBATCH --gpus=4\n" in script and "--nproc 4 " in script and " train.py &" in script
    return (script.replace("#SBATCH --gpus=4\n", "")
            .replace("--nproc 4 ", "--nproc 2 ")
            .replace(" train.py &", f" {shlex.join([WORKER, str(out), *args])} &"))


@needs["srun"]
@on_its_line("sbatch")
def test_the_readme_batch_script_preempted_and_requeued_by_slurm_resumes_exactly(
        tmp_path: Path, reference: Path) -> None:
    out, backup, log = tmp_path / "run", tmp_path / "backup", tmp_path / "slurm.log"
    out.mkdir()
    (tmp_path / "job.sbatch").write_text(_sbatch_script(
        out, *MID_EPOCH, "--backup", str(backup), "--preempt-step", "17", "--preempt-slurm"))
    env = {**_env(), "PATH": os.pathsep.join([os.path.dirname(sys.executable),
                                              os.environ.get("PATH", "")])}
    # --oversubscribe: envs testing at once share the node's cores (as the srun tests do).
    job_id = subprocess.run(
        ["sbatch", "--parsable", "--oversubscribe", f"--output={log}", "job.sbatch"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=True,
    ).stdout.strip().split(";")[0]
    job: Dict[str, str] = {}
    released = False
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        while time.monotonic() < deadline:
            job = _job(job_id)
            if job.get("JobState") in _ENDED:
                break
            if (not released and job.get("Restarts", "0") != "0"
                    and job.get("JobState") == "PENDING" and job.get("Reason") == "BeginTime"):
                # SLURM holds a requeued job until the first run's credentials expire
                # (120 s); an operator may start it sooner, but not in the second the
                # first run was killed: slurmd compares a credential's creation with that
                # kill in whole seconds and refuses one from the same second ("Job
                # credential revoked": the job ends FAILED, exit 1:0; seen in CI). Two
                # seconds on is always a later second. (Not StartTime=now+2: a begin time
                # in the future waits for the backfill pass, up to 30 s.)
                time.sleep(2)
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
                               capture_output=True, timeout=30)
                released = True
            time.sleep(1)
    finally:
        if job.get("JobState") not in _ENDED:
            wait_until(lambda: _cancelled(job_id), timeout=60, poll=1)
            for pid in _processes_mentioning(str(out)):  # only this test's: its own folder
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    text = log.read_text() if log.exists() else "(no log)"
    state = {k: job.get(k) for k in ("JobState", "Reason", "Restarts", "ExitCode")}
    assert state["JobState"] == "COMPLETED", f"{state}\n{text[-4000:]}"
    assert state["Restarts"] == "1" and state["ExitCode"] == "0:0", state
    assert "received SIGUSR1" in text and "exit 143: preempted, not restarted" in text, text
    _assert_resumed_exactly(reference, out)
    for u, v in _paired_weights(out / "rank0.npz", out / "rank1.npz"):
        np.testing.assert_allclose(u, v, atol=1e-6)
    # Nothing of either run is left: no job step, no worker, no launcher.
    assert not subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True,
                              text=True, timeout=30).stdout.strip()
    assert wait_until(lambda: not _processes_mentioning(str(out))), \
        f"left behind: {_processes_mentioning(str(out))}"
