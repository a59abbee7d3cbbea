"""What every launcher's environment answers (`ClusterEnvironment`, the base of the
classes in `kerasmgpu.env.launchers`; `kerasmgpu.env.cluster` detects which one this
process runs in), the variables `kerasmgpu launch` sets, and "host:port" addresses.

Ports. Every environment names rank 0's host (`main_address`) and one port (`main_port`,
torch.distributed's MASTER_PORT). The other listeners kerasmgpu starts take the next
ports: the JAX coordinator `main_port + 1`, TensorFlow worker r `main_port + 2 + r`
(`kerasmgpu launch` and TF_CONFIG name their own). Under SLURM and Open MPI, which give
no port, MASTER_PORT is read if set, else a port derived from the job id (15000-29999),
the same on every rank.

Loopback. When every process of the job runs on this machine, the listeners kerasmgpu
starts are reached at 127.0.0.1 and bind 127.0.0.1 only (`bind_host()`); a job spread
over several machines binds every interface, since other machines must reach rank 0.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import ClassVar, List, Mapping, Optional, Tuple

from kerasmgpu._errors import explain

# Set by `kerasmgpu launch` in each worker.
PROCESS_INDEX_ENV = "KERASMGPU_PROCESS_INDEX"
PROCESS_COUNT_ENV = "KERASMGPU_PROCESS_COUNT"
COORDINATOR_ENV = "KERASMGPU_COORDINATOR"
LOCAL_PROCESS_INDEX_ENV = "KERASMGPU_LOCAL_PROCESS_INDEX"
LOCAL_PROCESS_COUNT_ENV = "KERASMGPU_LOCAL_PROCESS_COUNT"
# How long a process waits for the others in a collective, at start-up and at exit.
TIMEOUT_ENV = "KERASMGPU_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT = 300.0
# Set by `kerasmgpu launch`: the torch.distributed backend of each worker.
TORCH_BACKEND_ENV = "KERASMGPU_TORCH_BACKEND"

LOOPBACK = "127.0.0.1"


def _bad(variable: str, received: object, allowed: str, fix: str) -> ValueError:
    return ValueError(explain(variable, received, allowed, fix))


class ClusterEnvironment:
    """One way of being started as one of several processes.

    Subclasses answer from the environment mapping they are given and never start or
    import anything. `creates_processes_externally`: the processes were started by a
    launcher outside the script (all of ours; only a job of one is not).
    """

    name: ClassVar[str] = "single process"
    creates_processes_externally: ClassVar[bool] = True
    # The launcher hands out the GPUs itself (`kerasmgpu launch --gpus-per-proc`); others
    # leave one GPU per process by local rank to the engines.
    assigns_devices: ClassVar[bool] = False
    # Which of TensorFlow's cluster resolvers describes this job: "tf_config" (a
    # TF_CONFIG), "slurm" (srun's variables), or None (the job's addresses).
    tf_resolver: ClassVar[Optional[str]] = None

    def __init__(self, env: Optional[Mapping[str, str]] = None) -> None:
        self.env: Mapping[str, str] = os.environ if env is None else env

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        raise NotImplementedError

    def world_size(self) -> int:
        raise NotImplementedError

    def global_rank(self) -> int:
        raise NotImplementedError

    def local_rank(self) -> int:
        return 0

    def local_world_size(self) -> int:
        """Processes of this job on this machine."""
        return 1

    @property
    def main_address(self) -> str:
        """Rank 0's host, as this process reaches it (127.0.0.1 on one machine)."""
        raise NotImplementedError

    @property
    def main_port(self) -> int:
        """torch.distributed's store port (MASTER_PORT); see the module docstring."""
        raise NotImplementedError

    # --- derived from the above ---------------------------------------------------------

    def multi_node(self) -> bool:
        return self.local_world_size() < self.world_size()

    def bind_host(self) -> str:
        """Where the listeners we start bind: loopback unless other machines take part."""
        return "0.0.0.0" if self.multi_node() else LOOPBACK

    def jax_coordinator(self) -> str:
        return join_address(self.main_address, self.main_port + 1)

    def torch_store(self) -> Optional[Tuple[str, int]]:
        """(host, port) of a TCPStore rank 0 starts, or None when the launcher runs one."""
        return self.main_address, self.main_port

    def torch_agent_store(self) -> Optional[Tuple[str, int, int]]:
        """(host, port, run) of a launcher's store kept over its restarts, that this
        process joins for run `run` (torchrun's agent store), or None."""
        return None

    def tf_workers(self) -> Optional[List[str]]:
        """Every rank's "host:port" for TensorFlow, or None when it cannot be known."""
        if self.multi_node():
            return None  # other machines' addresses are not in this environment
        base = self.main_port + 2
        return [join_address(LOOPBACK, base + rank) for rank in range(self.world_size())]

    def run_id(self) -> str:
        """Text that every process of this run shares (seeds agreement on it)."""
        return f"{self.name}:{self.main_address}:{self.main_port}"

    def multi_process(self) -> bool:
        """Whether this is a job of several processes (what `launched()` asks)."""
        return self.world_size() > 1

    def is_chief(self) -> bool:
        """Whether this process writes checkpoints and the template (rank 0)."""
        return self.global_rank() == 0

    def shared_seed(self) -> int:
        """A seed every process of one run agrees on (from what they share)."""
        return int(hashlib.sha256(self.run_id().encode()).hexdigest()[:8], 16)

    def collective_timeout(self) -> float:
        """Seconds a process waits for the others (start-up, collectives, shutdown)."""
        return _collective_timeout(self.env)

    def torch_backend(self) -> Optional[str]:
        """The torch.distributed backend the launcher chose (`kerasmgpu launch` sets
        it by the worker's GPUs), or None to choose by this process's devices."""
        return self.env.get(TORCH_BACKEND_ENV) or None

    def check(self) -> ClusterEnvironment:
        """Raise a fixable error when the variables contradict each other."""
        world, rank = self.world_size(), self.global_rank()
        if world < 1 or not 0 <= rank < world:
            raise _bad("rank", f"rank {rank} of {world} process(es) ({self.name})",
                       "0 <= rank < world size >= 1",
                       "check the variables your launcher sets (`kerasmgpu doctor` lists them)")
        return self

    def describe(self) -> str:
        if self.world_size() == 1:
            return f"{self.name}: process 0 of 1"
        return (f"{self.name}: process {self.global_rank()} of {self.world_size()} "
                f"(local {self.local_rank()} of {self.local_world_size()}), rank 0 at "
                f"{self.main_address}, {'several machines' if self.multi_node() else 'this machine only'}")


def join_address(host: str, port: int) -> str:
    """"host:port", with an IPv6 address in brackets ("[::1]:29500")."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_address(text: str) -> Optional[Tuple[str, int]]:
    """"host:port" or "[ipv6]:port" -> (host, port); None when `text` is neither."""
    match = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]\s]+):(\d+)", text.strip())
    if not match:
        return None
    return (match.group(1) or match.group(3)), int(match.group(2) or match.group(4))


def _collective_timeout(env: Mapping[str, str]) -> float:
    text = env.get(TIMEOUT_ENV)
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise _bad(TIMEOUT_ENV, text, "a number of seconds > 0",
                   f"unset it for the default {DEFAULT_TIMEOUT:g} s")
    return value
