"""The exit statuses of a job's processes, read alike by `kerasmgpu launch` and the shell."""

from __future__ import annotations

from typing import Any

SUCCESS = 0
# An uncaught exception in a worker; the launcher's status when a worker was killed by a
# signal (the shell would show 128+signal for the worker itself).
FAILURE = 1
# What coreutils `timeout` returns, so shell scripts read `launch --timeout` the same way.
TIMEOUT = 124


def by_signal(signum: int) -> int:
    """The shell's status of a process ended by signal `signum` (SIGINT: 130)."""
    return 128 + signum


def of_exit(code: Any) -> int:
    """The status Python gives `sys.exit(code)`: None is 0, an int itself, anything
    else (a message) 1."""
    if code is None:
        return SUCCESS
    if isinstance(code, int):
        return code
    return FAILURE
