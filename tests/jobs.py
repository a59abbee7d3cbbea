"""The one way the tests start processes: a job's environment, bounded waits, cleanup.

Every test that starts workers (test_distributed, test_launchers, test_sync_batchnorm,
test_soak, test_cli's demo under launch) goes through `run`, or `Job` where it acts on
the processes while they run:

- `worker_env(...)`: this process's environment less its kerasmgpu settings and the
  device count that `import kerasmgpu` wrote into XLA_FLAGS (a worker starts as a user's
  script does; the env's own XLA flags stay), the
  repository on PYTHONPATH (tests/workers import kerasmgpu from it), plus the test's own.
- `launch_command(...)`: `python -m kerasmgpu launch --nproc N --timeout T ...`.
- every process in a new session (its own process group), waited for with a bound; one
  still running at the bound, or when the test ends, is SIGKILLed with its process group
  and the groups of every process under it (`kerasmgpu launch` starts each worker as the
  leader of a group of its own), and the test fails with the end of its output.
- `pids(out)`, `group_members(pids)`, `alive(pid)`: what a job left running (each worker
  writes its pid to OUT/pid{rank}); `weights(path)`: the weights a worker saved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set

import numpy as np
import pytest

from kerasmgpu.env.devices import without_device_count

REPO = Path(__file__).parent.parent
WORKERS = Path(__file__).parent / "workers"


def worker_env(**extra: str) -> Dict[str, str]:
    """The environment of a job's processes: see the module's docstring."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KERASMGPU_") and k != "XLA_FLAGS"}
    # The XLA flags the env set (tox.ini: the JAX envs' optimization level) stay; the
    # device count that `import kerasmgpu` added goes.
    flags = without_device_count(os.environ.get("XLA_FLAGS", ""))
    if flags:
        env["XLA_FLAGS"] = flags
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    env.update(extra)
    return env


def launch_command(program: Sequence[str], *, nproc: int, timeout: int,
                   grace: Optional[int] = 3, restarts: Optional[int] = None) -> List[str]:
    """`kerasmgpu launch` of `program` (a script and its arguments, or `-m module ...`);
    a None option is left to the launcher's default."""
    command = [sys.executable, "-m", "kerasmgpu", "launch", "--nproc", str(nproc),
               "--timeout", str(timeout)]
    if grace is not None:
        command += ["--grace", str(grace)]
    if restarts is not None:
        command += ["--max-restarts", str(restarts)]
    return [*command, *program]


def runs_args(runs: Mapping[str, Sequence[str]]) -> List[str]:
    """tests/workers/runs.py's arguments for these runs (NAME -> script and options, one
    model each, one after another in the same processes)."""
    args: List[str] = []
    for name, run in runs.items():
        args += ["--", name, *run] if args else [name, *run]
    return args


def _children() -> Dict[int, List[int]]:
    tree: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _stat(int(entry))
        if stat is not None:
            tree.setdefault(int(stat[1]), []).append(int(entry))
    return tree


def _stat(pid: int) -> Optional[List[bytes]]:
    """/proc/PID/stat after the command name: state, ppid, pgrp, ... (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].split()


def kill_tree(pid: int) -> None:
    """SIGKILL the process group of `pid` and of every process under it (never this
    test process's own group)."""
    tree, below, todo = _children(), [], [pid]
    while todo:
        below.append(todo.pop())
        todo += tree.get(below[-1], [])
    groups: Set[int] = {pid}
    for each in below:
        stat = _stat(each)
        if stat is not None:
            groups.add(int(stat[2]))
    groups.discard(os.getpgrp())
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for each in below:  # one that shares this process's group
        try:
            os.kill(each, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Job:
    """Processes started in their own sessions; every one still running when the `with`
    block ends is killed with everything under it."""

    def __init__(self) -> None:
        self.procs: List[subprocess.Popen] = []

    def start(self, command: Sequence[str], *, env: Mapping[str, str],
              cwd: Optional[Path] = None, merge_stderr: bool = False) -> subprocess.Popen:
        proc = subprocess.Popen(
            list(command), env=dict(env), cwd=None if cwd is None else str(cwd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            text=True, start_new_session=True)
        self.procs.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
        """Its status and output; past `timeout` seconds the test fails (killed first)."""
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            out, err = proc.communicate()
            pytest.fail(f"{proc.args[0]} still running after {timeout} s:\n"
                        f"{((out or '') + (err or ''))[-3000:]}")
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err or "")

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.communicate()


def run(command: Sequence[str], *, timeout: float, env: Mapping[str, str],
        cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """One process (a launcher, a worker, a script), bounded: see `Job.wait`."""
    with Job() as job:
        return job.wait(job.start(command, env=env, cwd=cwd), timeout)


def launch(program: Sequence[str], *, nproc: int, timeout: int, env: Mapping[str, str],
           grace: Optional[int] = 3, restarts: Optional[int] = None,
           margin: int = 60, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """`kerasmgpu launch --timeout TIMEOUT`, waited for TIMEOUT + `margin` seconds."""
    return run(launch_command(program, nproc=nproc, timeout=timeout, grace=grace,
                              restarts=restarts), timeout=timeout + margin, env=env, cwd=cwd)


def pids(out: Path, pattern: str = "pid*") -> List[int]:
    """The pids the workers wrote to `out` (pid{rank}, or pid{rank}.run{r} on restarts)."""
    return [int(p.read_text()) for p in out.glob(pattern)]


def alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in (b"Z", b"X")


def group_members(pgids: Iterable[int]) -> List[int]:
    """Live processes in any of these process groups (each worker leads its own)."""
    wanted = set(pgids)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _stat(int(entry))
        if stat is not None and int(stat[2]) in wanted and stat[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def weights(path: Path) -> List[np.ndarray]:
    """The weights a worker saved (np.savez: arr_0, arr_1, ... in order)."""
    data = np.load(path, allow_pickle=True)
    return [data[k] for k in sorted((k for k in data.files if k.startswith("arr_")),
                                    key=lambda k: int(k[4:]))]
