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
import json
import os
import re
import threading
import zlib
from typing import ClassVar, List, Mapping, Optional, Tuple, Type

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
_LOCAL_NAMES = {"localhost", "::1", "[::1]"}
_JOB_PORTS = (15000, 15000)  # first port, how many: below Linux's ephemeral range

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


def _bad(variable: str, received: object, allowed: str, fix: str) -> ValueError:
    return ValueError(explain(variable, received, allowed, fix))


def _int(env: Mapping[str, str], name: str, default: Optional[int] = None) -> int:
    text = env.get(name)
    if text is None or text.strip() == "":
        if default is None:
            raise _bad(name, text, "an integer", f"set {name} (the launcher normally does)")
        return default
    try:
        return int(text)
    except ValueError:
        raise _bad(name, text, "an integer", f"set {name} to a whole number or unset it") from None


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    return host in _LOCAL_NAMES or host.startswith("127.")


def _job_port(job_id: str) -> int:
    """A port every rank of one job derives alike, and other jobs most likely do not."""
    first, span = _JOB_PORTS
    return first + zlib.crc32(job_id.encode()) % span


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'node[003-005,9],gpu1' -> 'node003'."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?", nodelist.strip())
    if not match or not (match.group(1) or match.group(2)):
        raise _bad("SLURM_STEP_NODELIST", nodelist, "a SLURM node list such as node[1-4]",
                   "run the script with srun inside the allocation")
    prefix, ranges = match.group(1), match.group(2)
    if ranges is None:
        return prefix
    return prefix + re.split(r"[,-]", ranges, maxsplit=1)[0]


def tasks_per_node(text: str) -> List[int]:
    """SLURM_STEP_TASKS_PER_NODE '2(x3),1' -> [2, 2, 2, 1]."""
    counts: List[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise _bad("SLURM_STEP_TASKS_PER_NODE", text, "counts such as 2(x3),1",
                       "run the script with srun inside the allocation")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


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


def _address_in(text: str, variable: str) -> Tuple[str, int]:
    parts = split_address(text)
    if parts is None:
        raise _bad(variable, text, "HOST:PORT", f"set {variable} to rank 0's host:port")
    return parts


class SingleProcess(ClusterEnvironment):
    """No launcher: a job of one."""

    name = "single process"
    creates_processes_externally = False

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return True

    def world_size(self) -> int:
        return 1

    def global_rank(self) -> int:
        return 0

    @property
    def main_address(self) -> str:
        return LOOPBACK

    @property
    def main_port(self) -> int:
        return 0


class KerasmgpuLaunch(ClusterEnvironment):
    """`kerasmgpu launch`: its contract (see kerasmgpu.launch) names every port."""

    name = "kerasmgpu launch"
    assigns_devices = True
    tf_resolver = "tf_config"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return PROCESS_COUNT_ENV in env and PROCESS_INDEX_ENV in env

    def world_size(self) -> int:
        return _int(self.env, PROCESS_COUNT_ENV)

    def global_rank(self) -> int:
        return _int(self.env, PROCESS_INDEX_ENV)

    def local_rank(self) -> int:
        return _int(self.env, LOCAL_PROCESS_INDEX_ENV, 0)

    def local_world_size(self) -> int:
        return _int(self.env, LOCAL_PROCESS_COUNT_ENV, self.world_size())

    @property
    def main_address(self) -> str:
        return self.env.get("MASTER_ADDR") or self._coordinator()[0]

    @property
    def main_port(self) -> int:
        return _int(self.env, "MASTER_PORT", self._coordinator()[1] + 1)

    def _coordinator(self) -> Tuple[str, int]:
        return _address_in(self.env.get(COORDINATOR_ENV, f"{LOOPBACK}:0"), COORDINATOR_ENV)

    def jax_coordinator(self) -> str:
        return self.env.get("JAX_COORDINATOR_ADDRESS") or join_address(*self._coordinator())

    def tf_workers(self) -> Optional[List[str]]:
        return _tf_config_workers(self.env)

    def run_id(self) -> str:
        return self.env.get(COORDINATOR_ENV, "kerasmgpu")


class TorchElastic(ClusterEnvironment):
    """torchrun / torch elastic, and anything that sets torch's env:// variables
    (Kubeflow's PyTorchJob: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE per pod)."""

    name = "torchrun"
    _required = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return all(env.get(name) for name in cls._required)

    @property
    def label(self) -> str:
        return "torchrun" if "TORCHELASTIC_RUN_ID" in self.env else "torch.distributed env"

    def world_size(self) -> int:
        return _int(self.env, "WORLD_SIZE")

    def global_rank(self) -> int:
        return _int(self.env, "RANK")

    def local_rank(self) -> int:
        return _int(self.env, "LOCAL_RANK", 0)

    def local_world_size(self) -> int:
        # PyTorchJob runs one process per pod and says nothing: one per machine.
        return _int(self.env, "LOCAL_WORLD_SIZE", 1)

    @property
    def main_address(self) -> str:
        return LOOPBACK if not self.multi_node() else self.env["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        return _int(self.env, "MASTER_PORT")

    def torch_store(self) -> Optional[Tuple[str, int]]:
        # torchrun's agent already serves MASTER_ADDR:MASTER_PORT (and a PyTorchJob's
        # rank 0 pod is named by MASTER_ADDR): torch's own env:// joins it as it is.
        return None

    def torch_agent_store(self) -> Optional[Tuple[str, int, int]]:
        run = self.env.get("TORCHELASTIC_RESTART_COUNT")
        if run is None or self.env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            return None
        return self.env["MASTER_ADDR"], self.main_port, _int(self.env,
                                                             "TORCHELASTIC_RESTART_COUNT")

    def run_id(self) -> str:
        return (f"{self.env.get('TORCHELASTIC_RUN_ID', '')}:{self.env['MASTER_ADDR']}:"
                f"{self.main_port}")

    def describe(self) -> str:
        return super().describe().replace(self.name, self.label, 1)


class OpenMPI(ClusterEnvironment):
    """`mpirun` / `mpiexec` of Open MPI. Its variables do not say where rank 0 runs:
    on one machine that is 127.0.0.1; across machines set MASTER_ADDR (e.g. `mpirun -x
    MASTER_ADDR=$(hostname)` when rank 0 runs where mpirun does)."""

    name = "Open MPI"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env

    def world_size(self) -> int:
        return _int(self.env, "OMPI_COMM_WORLD_SIZE")

    def global_rank(self) -> int:
        return _int(self.env, "OMPI_COMM_WORLD_RANK")

    def local_rank(self) -> int:
        return _int(self.env, "OMPI_COMM_WORLD_LOCAL_RANK", 0)

    def local_world_size(self) -> int:
        return _int(self.env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1)

    def _job_id(self) -> str:
        for name in ("OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE"):
            if self.env.get(name):
                return self.env[name]
        return "ompi"

    @property
    def main_address(self) -> str:
        if not self.multi_node():
            return LOOPBACK
        host = self.env.get("MASTER_ADDR")
        if not host:
            raise _bad(
                "MASTER_ADDR", None,
                "the host name or address of the machine that runs rank 0, when mpirun "
                "starts processes on several machines",
                "pass it to every rank: `mpirun -x MASTER_ADDR=<rank 0's host> ...`",
            )
        return host

    @property
    def main_port(self) -> int:
        return _int(self.env, "MASTER_PORT", _job_port(self._job_id()))

    def run_id(self) -> str:
        return f"ompi:{self._job_id()}"


class Slurm(ClusterEnvironment):
    """A task of an `srun` step (not the batch script itself, which is one process).

    Rank 0 runs on the first node of the step (SLURM's default block distribution);
    MASTER_PORT is read if set, else the port comes from the job id.
    """

    name = "SLURM"
    tf_resolver = "slurm"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        # srun sets the SLURM_STEP_* variables; an sbatch script or salloc shell has
        # SLURM_PROCID/SLURM_NTASKS too but is a single process that srun has not started.
        return all(name in env for name in ("SLURM_PROCID", "SLURM_LOCALID",
                                            "SLURM_STEP_NUM_TASKS"))

    def world_size(self) -> int:
        return _int(self.env, "SLURM_STEP_NUM_TASKS")

    def global_rank(self) -> int:
        return _int(self.env, "SLURM_PROCID")

    def local_rank(self) -> int:
        return _int(self.env, "SLURM_LOCALID")

    def local_world_size(self) -> int:
        if self.env.get("SLURM_GTIDS"):  # this node's tasks of the step
            return len(self.env["SLURM_GTIDS"].split(","))
        node = _int(self.env, "SLURM_NODEID", 0)
        counts = tasks_per_node(self.env.get("SLURM_STEP_TASKS_PER_NODE")
                                or str(self.world_size()))
        return counts[node] if node < len(counts) else 1

    def multi_node(self) -> bool:
        return _int(self.env, "SLURM_STEP_NUM_NODES", 1) > 1 or super().multi_node()

    @property
    def main_address(self) -> str:
        if not self.multi_node():
            return LOOPBACK
        return self.env.get("MASTER_ADDR") or first_host(
            self.env.get("SLURM_STEP_NODELIST") or self.env.get("SLURM_JOB_NODELIST", ""))

    @property
    def main_port(self) -> int:
        return _int(self.env, "MASTER_PORT", _job_port(self._job_id()))

    def _job_id(self) -> str:
        return f"{self.env.get('SLURM_JOB_ID', '')}.{self.env.get('SLURM_STEP_ID', '')}"

    def run_id(self) -> str:
        return f"slurm:{self._job_id()}"


class TFConfigCluster(ClusterEnvironment):
    """A TF_CONFIG set by a cluster (Kubeflow's TFJob, or by hand): `chief` then
    `worker` tasks are the ranks, in that order (TensorFlow's own numbering)."""

    name = "TF_CONFIG"
    tf_resolver = "tf_config"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        config = _tf_config(env)
        if not config:
            return False
        task = config.get("task") or {}
        return task.get("type") in ("chief", "worker") and bool(_ranks(config))

    def _config(self) -> dict:
        return _tf_config(self.env) or {}

    def world_size(self) -> int:
        return len(_ranks(self._config()))

    def global_rank(self) -> int:
        config = self._config()
        task = config["task"]
        offset = len(config["cluster"].get("chief", [])) if task["type"] == "worker" else 0
        return offset + int(task.get("index", 0))

    def local_world_size(self) -> int:
        hosts = [_address_in(a, "TF_CONFIG")[0] for a in _ranks(self._config())]
        if all(_is_loopback(h) for h in hosts):
            return len(hosts)
        return 1

    @property
    def main_address(self) -> str:
        host = _address_in(_ranks(self._config())[0], "TF_CONFIG")[0]
        return LOOPBACK if not self.multi_node() else host

    @property
    def main_port(self) -> int:
        return _address_in(_ranks(self._config())[0], "TF_CONFIG")[1]

    def jax_coordinator(self) -> str:
        # The cluster opened rank 0's TF port for this job; no TF server uses it on JAX.
        return join_address(self.main_address, self.main_port)

    def tf_workers(self) -> Optional[List[str]]:
        return _ranks(self._config())

    def run_id(self) -> str:
        return "tf_config:" + json.dumps(self._config().get("cluster", {}), sort_keys=True)


def _tf_config(env: Mapping[str, str]) -> Optional[dict]:
    text = env.get("TF_CONFIG")
    if not text:
        return None
    try:
        config = json.loads(text)
    except ValueError:
        raise _bad("TF_CONFIG", text, 'JSON such as {"cluster": {"worker": ["h0:2222", '
                   '"h1:2222"]}, "task": {"type": "worker", "index": 0}}',
                   "fix or unset TF_CONFIG") from None
    return config if isinstance(config, dict) else None


def _ranks(config: dict) -> List[str]:
    cluster = config.get("cluster") or {}
    return list(cluster.get("chief", [])) + list(cluster.get("worker", []))


def _tf_config_workers(env: Mapping[str, str]) -> Optional[List[str]]:
    config = _tf_config(env)
    return _ranks(config) if config else None


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
