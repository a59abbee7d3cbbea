"""How a process of a job of several ends: at once when the script fails, as usual when
it ends well.

A process that fails must not wait for the others at exit: they may be blocked in a
collective with it, and JAX's exit handler waits for every process to shut down
together. So an uncaught exception, or `sys.exit(n)` with n != 0, ends the process right
after its traceback and the exit handlers registered after the framework started,
without the framework's own shutdown; the launcher then sees the failure and stops the
others. A process that ends normally runs the engines' teardowns (torch's process
group), each bounded by `KERASMGPU_COLLECTIVE_TIMEOUT`, then the framework's shutdown.

How the ending is learnt - Python does not tell an exit handler its exit status:

* An uncaught exception reaches `sys.excepthook`, which records it (after printing the
  traceback, as always).
* `sys.exit(n)` raises SystemExit, which the interpreter handles without the excepthook,
  and which the script may also catch and carry on. Only one moment tells these apart:
  when the exception is released. One nobody caught is released by the interpreter
  itself, with no Python frame left on the main thread, just before the exit handlers
  run; one the script caught dies inside the script's frames. So `sys.exit` is replaced
  by one that raises the same SystemExit carrying a `_Marker`, whose finalizer looks at
  that. (Recording the status when `sys.exit` is called is simpler, but would turn a
  caught `sys.exit(2)` followed by a normal end into a failure.)
* A SystemExit the script raises itself (`raise SystemExit(3)`, the shell's `exit(3)`)
  carries no marker and ends like a normal end: every wait is then bounded by
  `KERASMGPU_COLLECTIVE_TIMEOUT`, not skipped.
* `os._exit` and signals end the process without exit handlers; the launcher sees them.

Which process failed first: a process that fails makes the others fail in their
collectives a moment later, and when they exit within milliseconds of each other the
launcher's view of the exits can order them wrongly. So, under `kerasmgpu launch`, a
process notes the instant it fails (before printing its traceback) in the file that
`KERASMGPU_FAILURE_FILE` names: that instant precedes the failures it causes. It notes too
whether it failed because another process is gone (a collective whose connection was
reset or closed, `from_a_peer`): a process killed by a signal notes nothing, and the
launcher may see its exit after the others noted the failures it caused (a large
process's memory is freed before its parent learns it died), so a failure from a peer
makes the launcher look for the one that failed on its own.

Nothing here imports a framework; `kerasmgpu.engines.startup` calls `watch` when the
job's process starts, and each engine's start-up `framework_started` once its framework
is imported.
"""

from __future__ import annotations

import atexit
import inspect
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, List, NoReturn, Optional

from kerasmgpu.env import cluster
from kerasmgpu.process import status

__all__ = ["FAILURE_FILE_ENV", "framework_started", "watch"]

# Set by `kerasmgpu launch` for each worker: where it notes "PID MONOTONIC-TIME HOW" when
# it fails, HOW "own" or "peer" (read by the launcher, which compares the PID with its
# worker's).
FAILURE_FILE_ENV = "KERASMGPU_FAILURE_FILE"
# What a collective says, in each framework, when another process of the job is gone:
# JAX's gloo ("Read error ... Connection reset by peer"), torch's gloo and NCCL, TF's
# gRPC ("Socket closed", UnavailableError), kerasmgpu's own bounded collectives.
_PEER_GONE = ("connection reset", "connection closed", "connection refused", "broken pipe",
              "socket closed", "unavailableerror", "by peer", "remote process exited",
              "a collective with the other processes failed")


class _Ending:
    """What this process has learnt about how it ends."""

    def __init__(self) -> None:
        self.job: Optional[cluster.ClusterEnvironment] = None
        self.failure: Optional[int] = None  # the status of an uncaught failure
        self.handler_registered = False
        self.teardowns: List[Callable[[], None]] = []
        self.noted = False


_ending = _Ending()


def watch(job: cluster.ClusterEnvironment) -> None:
    """Learn how this process of `job` ends: uncaught exceptions and
    `sys.exit(n)`. Once per process; later calls change nothing."""
    if _ending.job is not None:
        return
    _ending.job = job
    previous = sys.excepthook

    def excepthook(kind: Any, value: Any, traceback: Any) -> None:
        _note_failure(from_a_peer(value))  # the instant, before the traceback takes its time
        previous(kind, value, traceback)  # the traceback first, as always
        _ending.failure = (status.by_signal(signal.SIGINT) if issubclass(kind, KeyboardInterrupt)
                           else status.FAILURE)

    sys.excepthook = excepthook
    sys.exit = _exit


def framework_started(teardown: Optional[Callable[[], None]] = None) -> None:
    """Call right after a framework is imported: the exit handler is registered then
    (once), so that it runs before the framework's own (handlers run last-registered
    first). `teardown` runs, bounded, when the process ends normally."""
    if teardown is not None:
        _ending.teardowns.append(teardown)
    if not _ending.handler_registered:
        _ending.handler_registered = True
        atexit.register(_at_exit)


class _Marker:
    """Rides on the SystemExit that `sys.exit` raises, and dies with it: released with no
    Python frame left on the main thread, that exception was not caught (see the module
    docstring), and the process exits with its status."""

    def __init__(self, code: int) -> None:
        self.code = code

    def __del__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        frame = inspect.currentframe()  # this method's own frame
        if frame is not None and frame.f_back is None and self.code:
            _note_failure()
            _ending.failure = self.code
        del frame


def _exit(code: Any = None) -> NoReturn:
    raise _system_exit(code)


def _system_exit(code: Any) -> SystemExit:
    # Built here, not in _exit: a local there would tie the exception to its own
    # traceback in a cycle, and only the garbage collector - after the exit handlers -
    # would then release it.
    error = SystemExit(code)
    error._kerasmgpu_marker = _Marker(status.of_exit(code))  # type: ignore[attr-defined]
    return error


def from_a_peer(error: Optional[BaseException]) -> bool:
    """Whether `error` (or an exception it was raised from) says another process of the
    job is gone: a failure that process caused, not this one's own."""
    seen = 0
    while error is not None and seen < 8:
        text = f"{type(error).__name__}: {error}".lower()
        if any(words in text for words in _PEER_GONE):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def _note_failure(peer: bool = False) -> None:
    """Note for the launcher the instant this process failed, and whether because
    another process is gone (once; a write that fails only leaves the launcher its own
    view of the exits)."""
    path = os.environ.get(FAILURE_FILE_ENV)
    if not path or _ending.noted:
        return
    _ending.noted = True
    line = f"{os.getpid()} {time.monotonic()!r} {'peer' if peer else 'own'}\n"
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "w", encoding="ascii") as f:
            f.write(line)
        os.replace(partial, path)  # whole or absent: the launcher may read it any time
    except OSError:
        pass


def _at_exit() -> None:
    code = _ending.failure
    if code:
        _leave(code)
    job = _ending.job
    # The job's own bound (its KERASMGPU_COLLECTIVE_TIMEOUT, read when it was detected).
    seconds = (job.collective_timeout() if job is not None
               else cluster.DEFAULT_TIMEOUT)
    for teardown in _ending.teardowns:
        _bounded(teardown, seconds)


def _leave(code: int) -> NoReturn:
    # The others may be blocked in a collective with this process, and the framework's
    # own shutdown would wait for them: leave now, so that the launcher sees this
    # process fail and stops the rest.
    job = _ending.job
    rank = job.global_rank() if job is not None else 0
    try:
        sys.stderr.write(f"kerasmgpu: process {rank} failed (exit status {code}); "
                         "exiting without waiting for the other processes\n")
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


def _bounded(work: Callable[[], None], seconds: float) -> None:
    """Run `work` but give up after `seconds` (it may wait on a process that is gone)."""
    thread = threading.Thread(target=work, name="kerasmgpu-teardown", daemon=True)
    thread.start()
    thread.join(seconds)
