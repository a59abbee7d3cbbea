"""Supervising a job: start its workers, wait for the first failure, the timeout or a
signal, stop whatever is left, say how the run ended, and start the job again while
--max-restarts allows."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, TextIO, Union

from kerasmgpu.env.cluster import join_address
from kerasmgpu.launch.arguments import (
    DEFAULT_GRACE,
    PROG,
    _error,
    _validate,
    _validate_recovery,
)
from kerasmgpu.launch.contract import (
    RESTART_COUNT_ENV,
    binding_note,
    free_port_block,
    worker_environments,
)
from kerasmgpu.launch.workers import (
    _POLL,
    _install_handlers,
    _Interrupt,
    _live_groups,
    _pump,
    _reap,
    _restore_handlers,
    _signal_name,
    _stop,
    _wait_for_exit,
    _Worker,
)
from kerasmgpu.process import status
from kerasmgpu.process.ending import FAILURE_FILE_ENV

# How long a worker that noted its failure first, and is still exiting, is waited for
# before the launcher names the first one seen exiting instead.
_SETTLE = 10.0


@dataclass
class LaunchResult:
    """How a launch ended.

    returncode: 0 when every worker exited 0; the failed worker's code (1 when it died
    from a signal); 124 on timeout; 143 (requeue) after SIGTERM or the preemption
    signal; 128+signal for another signal (SIGINT: 130).
    failed_rank: global rank of the first worker seen failing, else None.
    durations: seconds from start to exit, by global rank.
    restarts: how many times the job was started again; the other fields describe the
    last run.
    """

    returncode: int
    failed_rank: Optional[int] = None
    timed_out: bool = False
    durations: dict[int, float] = field(default_factory=dict)
    returncodes: dict[int, Optional[int]] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)
    interrupted_by: Optional[str] = None
    message: Optional[str] = None
    restarts: int = 0
    preempted: bool = False


def launch(
    cmd: Sequence[str],
    nproc: int,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    coordinator: Optional[str] = None,
    worker_hosts: Optional[Sequence[str]] = None,
    gpus_per_proc: Optional[int] = None,
    backend: str = "auto",
    timeout: Optional[float] = None,
    grace: float = DEFAULT_GRACE,
    max_restarts: int = 0,
    preempt_signal: Union[str, int, None] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    stdout: Optional[TextIO] = None,
    stderr: Optional[TextIO] = None,
    handle_signals: bool = True,
) -> LaunchResult:
    """Run `cmd` as `nproc` workers of a W = nproc*nnodes world and supervise them.

    `env` is the base environment (default: os.environ) that the contract variables are
    added to. Output goes to `stdout`/`stderr` (default: sys.stdout/sys.stderr at the time
    of each line) prefixed with `[rank R] `; the launcher's notes and final line go to
    `stderr`. Raises LaunchError for invalid arguments and OSError when `cmd` cannot start.

    When a worker fails, every worker is stopped and, up to `max_restarts` times, the
    whole job starts again (on fresh ports unless `coordinator` is given) with
    KERASMGPU_RESTART_COUNT raised by one; `timeout` bounds all runs together.

    With `handle_signals` (and when called from the main thread) SIGINT, SIGTERM and
    `preempt_signal` (e.g. "USR1") to this process are caught while the workers run, the
    workers get SIGTERM, then SIGKILL after `grace` s, nothing restarts, and the
    result's returncode is 143 (requeue) for SIGTERM and `preempt_signal`, 130 for
    SIGINT; the previous handlers are restored before returning.
    """
    cmd = list(cmd)
    if not cmd:
        raise _error("cmd", cmd, "a non-empty command", "pass e.g. [sys.executable, 'train.py']")
    _validate(nproc, nnodes, node_rank, coordinator, worker_hosts, gpus_per_proc, backend,
              timeout)
    preempt = _validate_recovery(grace, max_restarts, nnodes, preempt_signal)
    layout = _Layout(nproc, coordinator, dict(
        nnodes=nnodes, node_rank=node_rank, worker_hosts=worker_hosts,
        gpus_per_proc=gpus_per_proc, backend=backend, base_env=env,
        max_restarts=max_restarts,
    ))
    envs, notes = layout.environments(0)  # every LaunchError comes before any start
    output = _Output(stdout, stderr)
    for note in notes:
        output.say(note)
    output.say(binding_note(envs[0]["KERASMGPU_COORDINATOR"]))
    job = _Job(cmd, envs, first_rank=node_rank * nproc, cwd=cwd, timeout=timeout,
               grace=grace, preempt=preempt,
               deadline=None if timeout is None else time.monotonic() + timeout)
    interrupt = _Interrupt()
    previous = _install_handlers(interrupt, preempt) if handle_signals else {}
    try:
        return _attempts(job, layout, max_restarts, output, interrupt)
    finally:
        _restore_handlers(previous)


@dataclass
class _Layout:
    """Where the workers of each run find each other: the same ranks every run, fresh
    loopback ports for each run unless a coordinator was given."""

    nproc: int
    coordinator: Optional[str]
    options: dict[str, Any]

    def environments(self, restart: int) -> tuple[list[dict[str, str]], list[str]]:
        # A new port block per run: the last run's sockets may linger in TIME_WAIT, and
        # a worker of it killed mid-start must not be joined by the next run's.
        address = self.coordinator or join_address(
            "127.0.0.1", free_port_block(2 + self.nproc * self.options["nnodes"]))
        return worker_environments(self.nproc, address, restart_count=restart,
                                   **self.options)


def _attempts(job: _Job, layout: _Layout, max_restarts: int, output: _Output,
              interrupt: _Interrupt) -> LaunchResult:
    """Run the job, and again after each failure while restarts are left."""
    restart = 0
    while True:
        workers, result = _run(job, output, interrupt)
        result.restarts = restart
        failed = result.failed_rank is not None
        if failed and restart < max_restarts and interrupt.signum is not None:
            _signalled_while_stopping(result, interrupt.signum, job)
        if max_restarts and result.message:
            result.message = result.message.replace(
                f"{PROG}: ", f"{PROG}: run {restart + 1} of at most {max_restarts + 1}: ", 1)
        _report(workers, result, output)
        if not failed or not max_restarts or result.interrupted_by is not None:
            return result
        if restart >= max_restarts:
            output.say(f"{PROG}: no restart left (--max-restarts {max_restarts}); "
                       f"exit {result.returncode}")
            return result
        if job.deadline is not None and time.monotonic() >= job.deadline:
            output.say(f"{PROG}: no restart: --timeout {job.timeout:g} s has passed; "
                       f"exit {result.returncode}")
            return result
        restart += 1
        output.say(f"{PROG}: restarting the whole job, restart {restart} of {max_restarts} "
                   f"({RESTART_COUNT_ENV}={restart})")
        job.envs = layout.environments(restart)[0]


def _signalled_while_stopping(result: LaunchResult, signum: int, job: _Job) -> None:
    """A signal that came while a failure was being stopped: the launcher was asked to
    end (a preemption: the machine is going away), so it ends as the signal says
    instead of starting the job again."""
    code, result.preempted = _signal_status(signum, job.preempt)
    result.returncode, result.interrupted_by = code, _signal_name(signum)
    result.message = f"{result.message}; received {result.interrupted_by}, not restarting; " \
                     f"exit {code}"


@dataclass
class _Job:
    """What every run of this node's workers starts from."""

    cmd: list[str]
    envs: list[dict[str, str]]  # by local rank
    first_rank: int  # global rank of local rank 0
    cwd: Optional[str]
    timeout: Optional[float]
    grace: float
    preempt: Optional[int]  # the preemption signal besides SIGTERM
    deadline: Optional[float]  # time.monotonic() when `timeout` ends every run


class _Output:
    """Where the workers' lines and the launcher's own go, one whole line at a time."""

    def __init__(self, stdout: Optional[TextIO], stderr: Optional[TextIO]) -> None:
        self._stdout, self._stderr = stdout, stderr
        self.lock = threading.Lock()

    def out(self) -> TextIO:
        return self._stdout if self._stdout is not None else sys.stdout

    def err(self) -> TextIO:
        return self._stderr if self._stderr is not None else sys.stderr

    def say(self, line: str) -> None:
        with self.lock:
            try:
                self.err().write(line + "\n")
                self.err().flush()
            except (OSError, ValueError):
                pass


@dataclass
class _Outcome:
    """Why supervision stopped waiting: the first failure, the timeout, a signal, or
    (none of them) every worker exited 0."""

    failed: Optional[_Worker] = None
    timed_out: bool = False
    signum: Optional[int] = None


def _run(job: _Job, output: _Output,
         interrupt: _Interrupt) -> tuple[list[_Worker], LaunchResult]:
    """One run of the job's workers: start them, wait, stop whatever is left."""
    workers: list[_Worker] = []
    notes = tempfile.mkdtemp(prefix="kerasmgpu-launch-")  # each worker's failure note
    try:
        _spawn(job, output, workers, notes)
        outcome = _wait(workers, job.deadline, interrupt, notes)
        return workers, _conclude(workers, outcome, job, interrupt)
    except BaseException:
        # A start that failed half-way, or KeyboardInterrupt when handle_signals=False:
        # never return or raise with workers left running.
        _stop(workers, job.grace if workers else 0.0, interrupt)
        raise
    finally:
        shutil.rmtree(notes, ignore_errors=True)


def _spawn(job: _Job, output: _Output, workers: list[_Worker], notes: str) -> None:
    """Start every local worker, appending each to `workers` as soon as it runs."""
    for local, worker_env in enumerate(job.envs):
        rank = job.first_rank + local
        noted = {FAILURE_FILE_ENV: os.path.join(notes, f"failed.{rank}")}
        proc = subprocess.Popen(
            job.cmd, env={**worker_env, **noted}, cwd=job.cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            # Own session: the worker and everything it starts share one process
            # group that can be signalled as a whole, and a Ctrl-C at the terminal
            # reaches only the launcher, which then stops the workers in order.
            start_new_session=True,
        )
        worker = _Worker(rank=rank, proc=proc, started=time.monotonic())
        workers.append(worker)
        threading.Thread(target=_wait_for_exit, args=(worker,), daemon=True,
                         name=f"kerasmgpu-launch-wait{rank}").start()
        for pipe, sink in ((proc.stdout, output.out), (proc.stderr, output.err)):
            assert pipe is not None
            thread = threading.Thread(
                target=_pump, args=(pipe, sink, f"[rank {rank}] ", output.lock),
                name=f"kerasmgpu-launch-rank{rank}", daemon=True,
            )
            thread.start()
            worker.threads.append(thread)


def _wait(workers: list[_Worker], deadline: Optional[float],
          interrupt: _Interrupt, notes: str) -> _Outcome:
    """Poll until a worker fails, all exit 0, the timeout passes or a signal comes."""
    outcome = _Outcome()
    while True:
        _reap(workers)
        if interrupt.signum is not None:
            break
        failures = [w for w in workers if not w.running and w.proc.returncode != 0]
        if failures:
            outcome.failed = _first_failure(workers, failures, notes)
            break
        if not any(w.running for w in workers):
            break
        if deadline is not None and time.monotonic() >= deadline:
            outcome.timed_out = True
            break
        time.sleep(_POLL)
    # Fixed now: a Ctrl-C while a failure is being cleaned up only hurries the stop.
    if outcome.failed is None and not outcome.timed_out:
        outcome.signum = interrupt.signum
    return outcome


def _noted_failures(workers: Sequence[_Worker], notes: str,
                    peers: Optional[set] = None) -> dict[int, float]:
    """rank -> the instant a worker noted it failed (`process.ending`), for the notes
    written by the worker process itself (its PID), not by a child it started; `peers`
    collects the ranks whose note says another process was gone."""
    noted: dict[int, float] = {}
    for w in workers:
        try:
            with open(os.path.join(notes, f"failed.{w.rank}"), encoding="ascii") as f:
                pid, when, *how = f.read().split()
            if int(pid) == w.proc.pid:
                noted[w.rank] = float(when)
                if peers is not None and how == ["peer"]:
                    peers.add(w.rank)
        except (OSError, ValueError):
            continue
    return noted


def _first_failure(workers: list[_Worker], failures: list[_Worker], notes: str) -> _Worker:
    """The worker that failed first. A failure makes the others fail in their collectives
    a moment later, and the exit times the launcher takes can put a consequence first:
    a worker that raised may still be exiting (a framework's teardown) when another,
    failing because of it, is gone - measured, 1 job in 8 on a loaded 2-core machine
    named the wrong rank. A worker's own note of the instant it failed precedes every
    failure it causes, so the noted instants order the workers that noted one. A worker
    that died without a note (a signal, `os._exit`) is placed by its exit only: the
    kernel closes a dying process's sockets before it tells the launcher, so the others'
    notes may come before that exit is seen."""
    by_exit = min(failures, key=lambda w: (w.ended or 0.0, w.rank))
    peers: set = set()
    noted = _noted_failures(workers, notes, peers)
    if by_exit.rank not in noted:
        return by_exit
    first = min((w for w in workers if w.rank in noted and (w.running or w in failures)),
                key=lambda w: (noted[w.rank], w.rank))
    settle = time.monotonic() + _SETTLE
    while first.running and time.monotonic() < settle:  # still exiting: its status
        time.sleep(_POLL)
        _reap(workers)
    chosen = by_exit if first.running or first.proc.returncode == 0 else first
    if chosen.rank in peers:
        return _own_failure(workers, notes, settle) or chosen
    return chosen


def _own_failure(workers: list[_Worker], notes: str, settle: float) -> Optional[_Worker]:
    """The worker that failed on its own, where the first noted failure says another
    process was gone: a worker killed by a signal notes nothing, and its exit may be
    seen after the failures it caused were noted (measured: a JAX worker SIGKILLed,
    the other's note and exit came first, 1 job in 10 on a loaded 2-core machine).
    Waits, bounded, for one to be seen; None if none is."""
    while True:
        _reap(workers)
        peers: set = set()
        noted = _noted_failures(workers, notes, peers)
        own = [w for w in workers if not w.running and w.proc.returncode != 0
               and w.rank not in peers]
        if own:
            return min(own, key=lambda w: (noted.get(w.rank, w.ended or 0.0), w.rank))
        if time.monotonic() >= settle or all(
                w.rank in peers or not w.running for w in workers):
            return None
        time.sleep(_POLL)


def _conclude(workers: list[_Worker], outcome: _Outcome, job: _Job,
              interrupt: _Interrupt) -> LaunchResult:
    """Stop what still runs and say how the run ended."""
    still_running = [w for w in workers if w.running]
    pgids = {w.proc.pid for w in workers}
    message: Optional[str] = None
    if outcome.signum is None and outcome.failed is None and not outcome.timed_out:
        # Every worker exited 0; anything left in their groups was started by them and
        # would otherwise outlive the run (and hold its pipes open).
        leftover = _live_groups(pgids)
        if leftover:
            ranks = sorted(w.rank for w in workers if w.proc.pid in leftover)
            message = (f"{PROG}: stopped processes left running by rank(s) "
                       f"{', '.join(map(str, ranks))} after they exited")
    if still_running or _live_groups(pgids):
        _stop(workers, job.grace, interrupt)
    returncode, verdict = _verdict(outcome, len(still_running), job)
    return LaunchResult(
        returncode=returncode,
        failed_rank=None if outcome.failed is None else outcome.failed.rank,
        timed_out=outcome.timed_out,
        durations={w.rank: (w.ended if w.ended is not None else time.monotonic()) - w.started
                   for w in workers},
        returncodes={w.rank: w.proc.returncode for w in workers},
        pids={w.rank: w.proc.pid for w in workers},
        interrupted_by=None if outcome.signum is None else _signal_name(outcome.signum),
        message=verdict or message,
        preempted=outcome.signum is not None and _signal_status(outcome.signum, job.preempt)[1],
    )


def _signal_status(signum: int, preempt: Optional[int]) -> tuple[int, bool]:
    """The launcher's status after signal `signum`, and whether it means preemption."""
    if signum in (signal.SIGTERM, preempt):
        return status.REQUEUE, True
    return status.by_signal(signum), False


def _verdict(outcome: _Outcome, stopped: int, job: _Job) -> tuple[int, Optional[str]]:
    """The launcher's exit status and its last line (see LaunchResult.returncode)."""
    if outcome.signum is not None:
        code, preempted = _signal_status(outcome.signum, job.preempt)
        line = f"{PROG}: received {_signal_name(outcome.signum)}; stopped {stopped} worker(s)"
        if preempted:
            line += (f" (SIGTERM, SIGKILL after {job.grace:g} s); exit {code}: preempted, "
                     "not restarted - run the same command again to resume from the last "
                     "backup")
        return code, line
    if outcome.failed is not None:
        code = outcome.failed.proc.returncode
        if code < 0:
            how, returncode = f"was killed by signal {_signal_name(-code)}", status.FAILURE
        else:
            how, returncode = f"exited with code {code}", code
        return returncode, (f"{PROG}: rank {outcome.failed.rank} {how}; "
                            f"stopped the other {stopped} worker(s)")
    if outcome.timed_out:
        assert job.timeout is not None
        return status.TIMEOUT, (f"{PROG}: timed out after {job.timeout:g} s; "
                                f"stopped {stopped} worker(s)")
    return status.SUCCESS, None


def _report(workers: list[_Worker], result: LaunchResult, output: _Output) -> None:
    # Let the pumps print the last lines before the summary; a grandchild that escaped
    # into its own session could hold a pipe open forever, hence the bound.
    join_until = time.monotonic() + 2.0
    for w in workers:
        for thread in w.threads:
            thread.join(max(0.0, join_until - time.monotonic()))
    if result.message:
        output.say(result.message)
