"""Where this process runs in a multi-process job: rank, world size, coordinator, chief.

Read from environment variables only (no framework is imported). Today the one
environment recognised is `kerasmgpu launch`, which gives every worker the variables
below; other launchers (torchrun, SLURM, Open MPI, a cluster's TF_CONFIG) plug in here.
"""

from __future__ import annotations

import hashlib
import os

# Set by `kerasmgpu launch` in each worker.
PROCESS_INDEX_ENV = "KERASMGPU_PROCESS_INDEX"
PROCESS_COUNT_ENV = "KERASMGPU_PROCESS_COUNT"
COORDINATOR_ENV = "KERASMGPU_COORDINATOR"
LOCAL_PROCESS_INDEX_ENV = "KERASMGPU_LOCAL_PROCESS_INDEX"
LOCAL_PROCESS_COUNT_ENV = "KERASMGPU_LOCAL_PROCESS_COUNT"

__all__ = [
    "process_index",
    "process_count",
    "is_chief",
    "launched",
    "local_process_index",
    "shared_seed",
]


def process_index() -> int:
    """This process's rank in a `kerasmgpu launch` run (0 outside one)."""
    return int(os.environ.get(PROCESS_INDEX_ENV, "0") or 0)


def process_count() -> int:
    """How many processes the `kerasmgpu launch` run has (1 outside one)."""
    return max(1, int(os.environ.get(PROCESS_COUNT_ENV, "1") or 1))


def is_chief() -> bool:
    """True in the process that writes checkpoints and the template (rank 0)."""
    return process_index() == 0


def launched() -> bool:
    """True in a worker of a multi-process run."""
    return process_count() > 1


def local_process_index() -> int:
    return int(os.environ.get(LOCAL_PROCESS_INDEX_ENV, "0") or 0)


def shared_seed() -> int:
    """A seed every worker of one run agrees on (from the run's coordinator address)."""
    text = os.environ.get(COORDINATOR_ENV, "kerasmgpu")
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
