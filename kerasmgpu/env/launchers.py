"""One `ClusterEnvironment` per launcher, each answering from environment variables
only (the table and the order `detect()` asks them in: `kerasmgpu.env.cluster`)."""

from __future__ import annotations

import json
import re
import zlib
from typing import List, Mapping, Optional, Tuple

from kerasmgpu.env.cluster_base import (
    COORDINATOR_ENV,
    LOCAL_PROCESS_COUNT_ENV,
    LOCAL_PROCESS_INDEX_ENV,
    LOOPBACK,
    PROCESS_COUNT_ENV,
    PROCESS_INDEX_ENV,
    ClusterEnvironment,
    _bad,
    join_address,
    split_address,
)

_LOCAL_NAMES = {"localhost", "::1", "[::1]"}
_JOB_PORTS = (15000, 15000)  # first port, how many: below Linux's ephemeral range


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
