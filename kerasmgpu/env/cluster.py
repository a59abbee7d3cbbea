"""Where this process runs in a multi-process job: which launcher started it, its rank,
the world size, rank 0's address, and which process is the chief.

One small class per environment, each answering from environment variables only (no
framework is imported here) - Lightning Fabric's `plugins/environments` are the model:

| environment            | detected by                                          | name          |
|------------------------|------------------------------------------------------|---------------|
| `kerasmgpu launch`     | KERASMGPU_PROCESS_INDEX/_COUNT                       | kerasmgpu launch |
| torchrun, torch elastic, Kubeflow PyTorchJob | RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT | torchrun / torch.distributed env |
| Open MPI `mpirun`      | OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK               | Open MPI      |
| SLURM `srun`           | SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS    | SLURM         |
| a cluster's TF_CONFIG (TFJob) | TF_CONFIG with a chief/worker cluster         | TF_CONFIG     |

`detect()` asks them in that order - the innermost launcher first: `kerasmgpu launch` and
torchrun can run inside an `srun` or `mpirun` step, and `mpirun` starts its daemons with
`srun`, so their variables are more specific than SLURM's. The first one that recognises
the process describes it; without any, the process is a job of one.

The base class, the variables `kerasmgpu launch` sets, ports and loopback:
`kerasmgpu.env.cluster_base`; the classes: `kerasmgpu.env.launchers`. Their public
names are importable from here too.
"""

from __future__ import annotations

import os
import threading
from typing import Mapping, Optional, Tuple, Type

from kerasmgpu.env.cluster_base import (  # noqa: F401 - re-exported
    COORDINATOR_ENV,
    DEFAULT_TIMEOUT,
    LOCAL_PROCESS_COUNT_ENV,
    LOCAL_PROCESS_INDEX_ENV,
    LOOPBACK,
    PROCESS_COUNT_ENV,
    PROCESS_INDEX_ENV,
    TIMEOUT_ENV,
    TORCH_BACKEND_ENV,
    ClusterEnvironment,
    join_address,
    split_address,
)
from kerasmgpu.env.launchers import (  # noqa: F401 - re-exported
    KerasmgpuLaunch,
    OpenMPI,
    SingleProcess,
    Slurm,
    TFConfigCluster,
    TorchElastic,
    first_host,
    tasks_per_node,
)

__all__ = [
    "ClusterEnvironment",
    "ENVIRONMENTS",
    "detect",
    "is_chief",
    "job",
    "join_address",
    "launched",
    "local_process_index",
    "process_count",
    "process_index",
    "reset",
    "shared_seed",
    "split_address",
]


# Innermost launcher first; see the module docstring.
ENVIRONMENTS: Tuple[Type[ClusterEnvironment], ...] = (
    KerasmgpuLaunch, TorchElastic, OpenMPI, Slurm, TFConfigCluster,
)


def detect(env: Optional[Mapping[str, str]] = None) -> ClusterEnvironment:
    """The environment this process runs in (a job of one when none is recognised)."""
    env = os.environ if env is None else env
    for kind in ENVIRONMENTS:
        if kind.detect(env):
            return kind(env).check()
    return SingleProcess(env)


_job: Optional[ClusterEnvironment] = None
_job_lock = threading.Lock()


def job() -> ClusterEnvironment:
    """The job this process belongs to, detected once (at `import kerasmgpu` in a
    launched process, else at first use) and kept: a launcher sets its variables before
    the process starts, and a process does not change jobs while it runs. Contradictory
    variables raise here every time, saying which. `reset()` forgets it (tests)."""
    global _job
    with _job_lock:
        if _job is None:
            # A copy: what the process's environment says later is not this job's.
            _job = detect(dict(os.environ))
        return _job


def reset() -> None:
    """Forget this process's job, to detect it again (tests that set launcher
    variables in-process)."""
    global _job
    with _job_lock:
        _job = None


def process_index() -> int:
    """This process's rank in a multi-process job (0 outside one)."""
    return job().global_rank()


def process_count() -> int:
    """How many processes the job has (1 outside one)."""
    return job().world_size()


def is_chief() -> bool:
    """True in the process that writes checkpoints and the template (rank 0)."""
    return job().is_chief()


def launched() -> bool:
    """True in a process of a job of several (whichever launcher started it)."""
    return job().multi_process()


def local_process_index() -> int:
    return job().local_rank()


def shared_seed() -> int:
    """A seed every process of one run agrees on (from what the run's processes share)."""
    return job().shared_seed()
