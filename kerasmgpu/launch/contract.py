"""The contract with the workers: the environment of each one (the variables of the
`kerasmgpu.launch` docstring), the ports they are derived from, and the launcher's line
saying where the rendezvous listens. No framework is imported: GPUs are found from
CUDA_VISIBLE_DEVICES, /dev/nvidiaN or nvidia-smi."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from typing import Mapping, Optional, Sequence

from kerasmgpu.env import devices
from kerasmgpu.env.cluster import (
    COORDINATOR_ENV,
    LOCAL_PROCESS_COUNT_ENV,
    LOCAL_PROCESS_INDEX_ENV,
    PROCESS_COUNT_ENV,
    PROCESS_INDEX_ENV,
    join_address,
)
from kerasmgpu.launch.arguments import PROG, _error, parse_coordinator

RESTART_COUNT_ENV = "KERASMGPU_RESTART_COUNT"
MAX_RESTARTS_ENV = "KERASMGPU_MAX_RESTARTS"


def _visible_gpus(env: Mapping[str, str]) -> list[str]:
    """GPU ids the workers can see, found without importing any framework."""
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids: list[str] = []
        for item in (part.strip() for part in listed.split(",")):
            # CUDA stops at the first invalid entry, and "-1" is the usual way to hide all.
            if not item or item.startswith("-"):
                break
            ids.append(item)
        return ids
    # /dev/nvidiaN exists per GPU the driver exposes (also inside containers, where only
    # the granted ones are mounted); it is a directory listing, not a driver call.
    try:
        count = sum(1 for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        count = 0
    if count == 0 and shutil.which("nvidia-smi"):
        # e.g. WSL has no /dev/nvidiaN; nvidia-smi is slower but still framework-free.
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=10, check=False).stdout
            count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            count = 0
    return [str(i) for i in range(count)]


def worker_environments(
    nproc: int,
    coordinator: str,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    worker_hosts: Optional[Sequence[str]] = None,
    gpus_per_proc: Optional[int] = None,
    backend: str = "auto",
    base_env: Optional[Mapping[str, str]] = None,
    restart_count: int = 0,
    max_restarts: int = 0,
) -> tuple[list[dict[str, str]], list[str]]:
    """The full environment of each local worker (index = local rank), and notes to print.

    Pure apart from GPU detection, so the contract can be tested without starting anything.
    """
    base = dict(os.environ if base_env is None else base_env)
    host, port = parse_coordinator(coordinator)
    world = nproc * nnodes
    if port + 2 + world - 1 > 65535:
        raise _error("--coordinator", coordinator,
                     f"a port P with P+{1 + world} <= 65535 (P+1 is torch's, P+2.. TF's)",
                     "pick a lower port, e.g. 29500")
    tf_cluster, tf_note = _tf_cluster(nproc, nnodes, port, worker_hosts, backend, base)
    gpus = _visible_gpus(base)
    slices, gpu_note = _gpu_slices(nproc, gpus_per_proc, gpus)
    envs: list[dict[str, str]] = []
    for local in range(nproc):
        rank = node_rank * nproc + local
        env = dict(base)
        own_gpus = gpus if slices is None else slices[local]
        if slices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(own_gpus)
        env.update(_contract(rank, local, nproc, world, host, port, own_gpus))
        env.update(_restart_variables(restart_count, max_restarts))
        if tf_cluster is not None:
            env["TF_CONFIG"] = json.dumps(
                {"cluster": {"worker": tf_cluster}, "task": {"type": "worker", "index": rank}}
            )
        else:
            env.pop("TF_CONFIG", None)
        if backend != "auto":
            env["KERAS_BACKEND"] = backend
        if nproc > 1 and "OMP_NUM_THREADS" not in base:
            env["OMP_NUM_THREADS"] = str(_threads_per_worker(nproc))
        envs.append(env)
    return envs, [note for note in (tf_note, gpu_note) if note]


def _threads_per_worker(nproc: int) -> int:
    """CPU threads per worker when the user set none: this node's cores shared out.

    Each framework sizes its CPU thread pools to every core of the machine, so N
    workers on one node ran N times too many threads; on a CPU they fought for the
    cores (measured: Keras 3 on torch, 2 workers on 2 cores, a fit took 2.3 s and
    varied 0.9x-2.5x between runs; with one thread each, 0.95 s and 1.2x-1.6x).
    torchrun sets OMP_NUM_THREADS=1 for the same reason; here, cores // N.
    """
    return max(1, devices.cpu_cores() // nproc)


def _tf_cluster(
    nproc: int, nnodes: int, port: int, worker_hosts: Optional[Sequence[str]], backend: str,
    base: Mapping[str, str],
) -> tuple[Optional[list[str]], Optional[str]]:
    """Every global rank's "host:port" for TF_CONFIG, or None and why when unknown."""
    if worker_hosts is not None:
        hosts = [h.strip("[]") for h in worker_hosts]
    elif nnodes == 1:
        hosts = ["127.0.0.1"]
    else:
        if backend not in ("auto", "tensorflow"):
            return None, None
        dropped = " (the inherited TF_CONFIG is removed)" if "TF_CONFIG" in base else ""
        return None, (
            f"{PROG}: TF_CONFIG not set{dropped}: TensorFlow needs every worker's address; "
            "pass --worker-hosts host0,host1,... (one per node) to set it"
        )
    return [join_address(hosts[rank // nproc], port + 2 + rank)
            for rank in range(nproc * nnodes)], None


def _gpu_slices(
    nproc: int, gpus_per_proc: Optional[int], gpus: list[str],
) -> tuple[Optional[list[list[str]]], Optional[str]]:
    """Each local worker's own GPUs with `--gpus-per-proc`, else None (all visible)."""
    if gpus_per_proc is None:
        return None, None
    if not gpus:
        return None, f"{PROG}: no GPU visible; --gpus-per-proc {gpus_per_proc} is ignored"
    if nproc * gpus_per_proc > len(gpus):
        raise _error("--gpus-per-proc", gpus_per_proc,
                     f"at most {len(gpus) // nproc} for --nproc {nproc} on the "
                     f"{len(gpus)} visible GPU(s) {','.join(gpus)}",
                     "lower --gpus-per-proc or --nproc, or leave it out to show all GPUs")
    return [gpus[i * gpus_per_proc:(i + 1) * gpus_per_proc] for i in range(nproc)], None


def _contract(rank: int, local: int, nproc: int, world: int, host: str, port: int,
              own_gpus: list[str]) -> dict[str, str]:
    """The variables of the module docstring's contract for one worker, TF_CONFIG aside."""
    coordinator = join_address(host, port)
    return {
        PROCESS_INDEX_ENV: str(rank),
        PROCESS_COUNT_ENV: str(world),
        LOCAL_PROCESS_INDEX_ENV: str(local),
        LOCAL_PROCESS_COUNT_ENV: str(nproc),
        COORDINATOR_ENV: coordinator,
        "KERASMGPU_LAUNCHED": "1",
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port + 1),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(nproc),
        "KERASMGPU_TORCH_BACKEND": "nccl" if own_gpus else "gloo",
        "JAX_COORDINATOR_ADDRESS": coordinator,
        "JAX_NUM_PROCESSES": str(world),
        "JAX_PROCESS_ID": str(rank),
    }


def _restart_variables(restart_count: int, max_restarts: int) -> dict[str, str]:
    """Which run of the job this is, under kerasmgpu's names and torchrun's (a script
    written for torchrun reads TORCHELASTIC_RESTART_COUNT to decide to resume)."""
    return {
        RESTART_COUNT_ENV: str(restart_count),
        MAX_RESTARTS_ENV: str(max_restarts),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
    }


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(count: int, host: str = "127.0.0.1", attempts: int = 50) -> int:
    """A port P such that P .. P+count-1 are all free on `host` right now.

    The OS picks P (bind to port 0); the others are checked because every worker's TF
    server and torch's store use P+1.. . Another program may still take one before the
    workers bind it; that race is inherent to choosing ports ahead of time.
    """
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            base = int(sock.getsockname()[1])
        if base + count - 1 <= 65535 and all(
            _port_free(host, p) for p in range(base, base + count)
        ):
            return base
    raise RuntimeError(f"{PROG}: found no {count} consecutive free ports on {host}")


def binding_note(coordinator: str) -> str:
    """The launcher's line saying where the job's rendezvous listens.

    The engines' rendezvous (JAX's coordinator, torch's store, TensorFlow's gRPC servers)
    take any connection without authentication, so the user is told whether the job is
    reachable from other machines."""
    host, _ = parse_coordinator(coordinator)
    if host in ("localhost", "::1") or host.startswith("127."):
        return (f"{PROG}: rendezvous on {coordinator} (loopback: this machine only; "
                "TensorFlow's gRPC servers listen on every interface)")
    return (f"{PROG}: rendezvous on {coordinator}: its ports listen without "
            "authentication; keep the job on a private network")
