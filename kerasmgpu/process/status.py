"""The exit statuses of a job's processes, read alike by `kerasmgpu launch` and the shell."""

from __future__ import annotations

from typing import Any

SUCCESS = 0
# An uncaught exception in a worker; the launcher's status when a worker was killed by a
# signal (the shell would show 128+signal for the worker itself).
FAILURE = 1
# What coreutils `timeout` returns, so shell scripts read `launch --timeout` the same way.
TIMEOUT = 124
# The launcher's status after a preemption signal (SIGTERM, or `--preempt-signal`): it
# stopped the workers and the job should be run again, not counted as done or as a bug.
# 143 = 128+SIGTERM is what SLURM and Kubernetes record for a job a SIGTERM ended, so a
# scheduler's rule for an evicted process (a Kubernetes podFailurePolicy on exit code
# 143, a SLURM script testing `$? -eq 143` before `scontrol requeue`) reads it the same.
# A worker's own failure never gives 143 from the launcher unless the worker exits 143.
REQUEUE = 143


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
