"""The worker processes: their output passed on line by line, their process groups
signalled, stopped and reaped, and the launcher's own signal handlers."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any, Callable, Optional, Sequence, TextIO

# Poll period of the supervising loop: short enough that a failure is noticed at once,
# long enough to cost nothing on a busy machine.
_POLL = 0.05
# After SIGKILL the kernel needs a moment to tear processes down; bound the wait so the
# launcher always returns (a process stuck in uninterruptible sleep cannot be helped).
_KILL_WAIT = 5.0


@dataclass
class _Worker:
    rank: int
    proc: subprocess.Popen[bytes]
    started: float
    ended: Optional[float] = None
    threads: list[threading.Thread] = field(default_factory=list)
    # When the process exited, taken by a thread blocked in wait(): when one worker's
    # death makes another fail a moment later, both may be found in one poll, and only
    # these times tell which came first (the launcher must name the first).
    exited: Optional[float] = None

    @property
    def running(self) -> bool:
        return self.ended is None


class _Interrupt:
    """Records SIGINT/SIGTERM; the handler only sets fields (no locks: it runs re-entrantly)."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.count = 0

    def __call__(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.signum is None:
            self.signum = signum
        self.count += 1


def _pump(pipe: IO[bytes], sink: Callable[[], TextIO], prefix: str, lock: threading.Lock) -> None:
    # Bytes in, text out with errors replaced: a worker printing invalid UTF-8 must not
    # stop its output (or the whole pump) mid-run.
    try:
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", "replace")
            if not text.endswith("\n"):
                text += "\n"
            with lock:
                try:
                    stream = sink()
                    stream.write(prefix + text)
                    stream.flush()
                except (OSError, ValueError):
                    # Our own output is gone (closed pipe); keep draining so the worker
                    # never blocks on a full pipe.
                    pass
    finally:
        pipe.close()


def _live_groups(pgids: set[int]) -> set[int]:
    """Process groups among `pgids` that still hold a process that is not a zombie.

    Zombies are skipped because an orphan is reaped by PID 1, which in some containers
    never reaps; a dead-but-unreaped process must not keep the launcher waiting.
    """
    if not pgids:
        return set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        entries = []
    if not entries:  # no procfs (e.g. macOS): signal 0 tells whether the group exists
        alive = set()
        for pgid in pgids:
            try:
                os.killpg(pgid, 0)
                alive.add(pgid)
            except ProcessLookupError:
                pass
            except PermissionError:
                alive.add(pgid)
        return alive
    found: set[int] = set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                data = handle.read()
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            fields = data[data.rindex(b")") + 2:].split()
            state, pgrp = fields[0], int(fields[2])
        except (OSError, ValueError, IndexError):
            continue
        if pgrp in pgids and state not in (b"Z", b"X"):
            found.add(pgrp)
    return found


def _signal_groups(pgids: set[int], sig: int) -> None:
    # Only groups known to be alive are signalled, which keeps a recycled PID safe.
    for pgid in _live_groups(pgids):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_for_exit(worker: _Worker) -> None:
    worker.proc.wait()
    worker.exited = time.monotonic()


def _reap(workers: Sequence[_Worker]) -> None:
    now = time.monotonic()
    for w in workers:
        if w.running and w.proc.poll() is not None:
            w.ended = w.exited if w.exited is not None else now


def _stop(workers: Sequence[_Worker], grace: float, interrupt: _Interrupt) -> None:
    """SIGTERM every worker's group, SIGKILL what is left after `grace` s, and reap."""
    pgids = {w.proc.pid for w in workers}
    # Groups of workers that already exited are included: their children may live on.
    _signal_groups(pgids, signal.SIGTERM)
    presses = interrupt.count
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(workers)
        if not _live_groups(pgids):
            return
        if interrupt.count > presses:  # a second Ctrl-C means "now"
            break
        time.sleep(_POLL)
    # JAX and many native runtimes ignore or block SIGTERM; SIGKILL cannot be ignored.
    _signal_groups(pgids, signal.SIGKILL)
    deadline = time.monotonic() + _KILL_WAIT
    while time.monotonic() < deadline:
        _reap(workers)
        if not _live_groups(pgids) and not any(w.running for w in workers):
            return
        time.sleep(_POLL)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _install_handlers(handler: _Interrupt, preempt: Optional[int]) -> dict[int, Any]:
    # signal.signal works only in the main thread; elsewhere the caller handles signals.
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {}
    for sig in {signal.SIGINT, signal.SIGTERM, *(() if preempt is None else (preempt,))}:
        previous[sig] = signal.signal(sig, handler)
    return previous


def _restore_handlers(previous: dict[int, Any]) -> None:
    for sig, old in previous.items():
        if old is not None:  # None: installed outside Python, cannot be put back
            signal.signal(sig, old)
