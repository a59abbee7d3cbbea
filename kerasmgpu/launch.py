"""`kerasmgpu launch`: start N copies of a training script on this machine (M machines).

    kerasmgpu launch --nproc 4 train.py --epochs 3            # 4 workers, this machine
    kerasmgpu launch --nproc 4 -m mypkg.train                 # like `python -m`
    kerasmgpu launch --nproc 8 --nnodes 2 --node-rank 0 \\
        --coordinator 10.0.0.1:29500 --worker-hosts 10.0.0.1,10.0.0.2 train.py

The launcher imports no ML framework: it only starts processes, gives each one the
environment below, prefixes their output with `[rank R] `, and stops all of them when
one fails, when `--timeout` passes, or when the launcher itself gets SIGINT/SIGTERM.

Restarts and preemption:

    --max-restarts K   when a worker fails, stop every worker, then start the whole job
                       again (fresh ports unless --coordinator), at most K times; the
                       last failure's status ends the launcher. A job that ends 0, times
                       out or is interrupted is never restarted. One machine only.
    SIGTERM, and the signal of --preempt-signal (e.g. USR1): send SIGTERM to every
                       worker, SIGKILL what is left after --grace s, exit 143 ("requeue":
                       128+SIGTERM, what SLURM and Kubernetes record for a job a SIGTERM
                       ended); never restarted, as the machine is going away.

Environment contract (every value is a string; W = nproc * nnodes, N = nproc,
global rank = node_rank * N + local_rank, P = the coordinator port):

    KERASMGPU_PROCESS_INDEX        global rank, 0 .. W-1
    KERASMGPU_PROCESS_COUNT        W
    KERASMGPU_LOCAL_PROCESS_INDEX  local rank on this node, 0 .. N-1
    KERASMGPU_LOCAL_PROCESS_COUNT  N
    KERASMGPU_COORDINATOR          "host:P" (127.0.0.1 and a free port unless --coordinator)
    KERASMGPU_LAUNCHED             "1"
    KERASMGPU_RESTART_COUNT        restarts before this run: "0" first, then 1 .. K
    KERASMGPU_MAX_RESTARTS         K of --max-restarts ("0" by default)
    TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS   the same two, as torchrun
                                   names them, for scripts written for torchrun
    PYTHONUNBUFFERED               "1" (so lines reach the launcher as they are printed)
    KERASMGPU_FAILURE_FILE         where the worker notes the instant it fails, so that the
                                   launcher names the first failure (kerasmgpu.process.ending)

  PyTorch (torch.distributed "env://"):
    MASTER_ADDR, MASTER_PORT (= P+1), RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    KERASMGPU_TORCH_BACKEND        "nccl" when the worker can see a GPU, else "gloo"

  JAX (jax.distributed.initialize):
    JAX_COORDINATOR_ADDRESS ("host:P"), JAX_NUM_PROCESSES, JAX_PROCESS_ID
    jax (checked on 0.10.2) reads only JAX_COORDINATOR_ADDRESS by itself; the caller passes
    num_processes and process_id from the other two.

  TensorFlow (MultiWorkerMirroredStrategy):
    TF_CONFIG  {"cluster": {"worker": [one "host:port" per global rank]},
                "task": {"type": "worker", "index": rank}}
    with port P+2+rank for global rank `rank`. On one node the hosts are 127.0.0.1. On
    several nodes TensorFlow needs every worker's address, which only the user knows:
    pass `--worker-hosts host0,host1,...` (one per node, in node-rank order); without it
    TF_CONFIG is not set (an inherited one is removed, as it could not be right for N
    local workers) and a note says so (unless --backend is jax or torch).

  Optional:
    CUDA_VISIBLE_DEVICES   with `--gpus-per-proc K`, local rank i gets devices
                           [i*K, (i+1)*K) of the visible ones; otherwise left as it is.
    KERAS_BACKEND          set to the `--backend` value when it is not "auto".
    OMP_NUM_THREADS        with N > 1 workers and none set: this node's CPU cores // N
                           (at least 1), so the workers' CPU thread pools share the cores
                           instead of each sizing itself to all of them (torchrun sets 1).

All of them are set whatever the backend: they cost nothing, and the script, not the
launcher, decides which framework it runs. The ports are derived from P so that one
coordinator address fixes every port and the frameworks' servers never collide.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any, Callable, Mapping, NoReturn, Optional, Sequence, TextIO, Union

from kerasmgpu._errors import explain
from kerasmgpu.env import devices
from kerasmgpu.env.cluster import (
    COORDINATOR_ENV,
    LOCAL_PROCESS_COUNT_ENV,
    LOCAL_PROCESS_INDEX_ENV,
    PROCESS_COUNT_ENV,
    PROCESS_INDEX_ENV,
    join_address,
    split_address,
)
from kerasmgpu.process import status
from kerasmgpu.process.ending import FAILURE_FILE_ENV

__all__ = [
    "DEFAULT_GRACE",
    "MAX_RESTARTS_ENV",
    "PREEMPT_SIGNALS",
    "RESTART_COUNT_ENV",
    "LaunchError",
    "LaunchResult",
    "launch",
    "main",
    "parse_coordinator",
    "worker_environments",
]

PROG = "kerasmgpu launch"
DEFAULT_GRACE = 5.0
BACKENDS = ("auto", "tensorflow", "jax", "torch")
RESTART_COUNT_ENV = "KERASMGPU_RESTART_COUNT"
MAX_RESTARTS_ENV = "KERASMGPU_MAX_RESTARTS"
# Signals a scheduler sends ahead of a preemption or a time limit (SLURM --signal, spot
# notices) that a handler can catch; SIGTERM always counts as one.
PREEMPT_SIGNALS = ("TERM", "USR1", "USR2", "HUP", "INT", "QUIT")
# Poll period of the supervising loop: short enough that a failure is noticed at once,
# long enough to cost nothing on a busy machine.
_POLL = 0.05
# After SIGKILL the kernel needs a moment to tear processes down; bound the wait so the
# launcher always returns (a process stuck in uninterruptible sleep cannot be helped).
_KILL_WAIT = 5.0
# How long a worker that noted its failure first, and is still exiting, is waited for
# before the launcher names the first one seen exiting instead.
_SETTLE = 10.0


class LaunchError(ValueError):
    """An argument the launcher cannot run with (the CLI exits 2 on it)."""


@dataclass
class LaunchResult:
    """How a launch ended.

    returncode: 0 when every worker exited 0; the failed worker's code (1 when it died
    from a signal); 124 on timeout; 143 (requeue) after SIGTERM or the preemption
    signal; 128+signal for another signal (SIGINT: 130).
    failed_rank: global rank of the first worker seen failing, else None.
    durations: seconds from start to exit, by global rank.
    restarts: how many times the job was started again; the other fields describe the
    last run.
    """

    returncode: int
    failed_rank: Optional[int] = None
    timed_out: bool = False
    durations: dict[int, float] = field(default_factory=dict)
    returncodes: dict[int, Optional[int]] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)
    interrupted_by: Optional[str] = None
    message: Optional[str] = None
    restarts: int = 0
    preempted: bool = False


# --- arguments --------------------------------------------------------------------------


def _error(argument: str, received: Any, allowed: str, fix: str) -> LaunchError:
    return LaunchError(explain(argument, received, allowed, fix))


def parse_coordinator(text: str) -> tuple[str, int]:
    """Split "host:port" (or "[ipv6]:port") into its parts, with a fixable error."""
    parts = split_address(text)
    if parts is None or not 1 <= parts[1] <= 65535:
        raise _error(
            "--coordinator", text, "HOST:PORT with a port in 1..65535 ([addr]:PORT for IPv6)",
            "pass the address of node 0 that every node can reach, e.g. 10.0.0.1:29500",
        )
    return parts


def _validate(
    nproc: int, nnodes: int, node_rank: int, coordinator: Optional[str],
    worker_hosts: Optional[Sequence[str]], gpus_per_proc: Optional[int], backend: str,
    timeout: Optional[float],
) -> None:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise _error("--nproc", nproc, "an integer >= 1",
                     "pass the number of workers for this node, usually its GPU count")
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise _error("--nnodes", nnodes, "an integer >= 1",
                     "pass the number of machines taking part (1 for this one only)")
    if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not (
        0 <= node_rank < nnodes
    ):
        raise _error("--node-rank", node_rank, f"an integer in 0..{nnodes - 1} (--nnodes {nnodes})",
                     "give every node a distinct rank, 0 on the coordinator's node")
    if nnodes > 1 and not coordinator:
        raise _error("--coordinator", coordinator,
                     "HOST:PORT of node 0, required when --nnodes > 1",
                     "pass the same --coordinator HOST:PORT on every node")
    # A host with exactly one colon is "host:port"; ports are derived, not given per host.
    if worker_hosts is not None and (
        len(worker_hosts) != nnodes
        or not all(h.strip("[]") and h.strip("[]").count(":") != 1 for h in worker_hosts)
    ):
        raise _error("--worker-hosts", ",".join(worker_hosts),
                     f"{nnodes} comma-separated host names or addresses, one per node, "
                     "in node-rank order, without ports",
                     "list every node's address, e.g. --worker-hosts 10.0.0.1,10.0.0.2")
    if gpus_per_proc is not None and (
        isinstance(gpus_per_proc, bool) or not isinstance(gpus_per_proc, int) or gpus_per_proc < 1
    ):
        raise _error("--gpus-per-proc", gpus_per_proc, "an integer >= 1",
                     "pass how many GPUs each worker gets, or leave it out to show all")
    if backend not in BACKENDS:
        raise _error("--backend", backend, " | ".join(BACKENDS),
                     "use auto unless the script needs KERAS_BACKEND set for it")
    if timeout is not None and not timeout > 0:
        raise _error("--timeout", timeout, "a number of seconds > 0",
                     "leave it out for no limit")


def _validate_recovery(grace: float, max_restarts: int, nnodes: int,
                       preempt_signal: Union[str, int, None]) -> Optional[int]:
    """Check the stopping and restarting options; the preemption signal's number."""
    # 0 would SIGKILL at once: a worker could never write its backup after SIGTERM.
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace > 0:
        raise _error("--grace", grace, "a number of seconds > 0",
                     "give the workers time to save after SIGTERM; leave it out for the "
                     f"default {DEFAULT_GRACE:g} s")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise _error("--max-restarts", max_restarts, "an integer >= 0 (0: never restart)",
                     "pass how many times the job may be started again after a failure")
    if max_restarts > 0 and nnodes > 1:
        # Each node's launcher would restart its own workers with no rendezvous telling
        # the other nodes, which then wait for peers of another attempt.
        raise _error("--max-restarts", max_restarts,
                     "0 with --nnodes > 1 (the nodes have no rendezvous to restart together)",
                     "let the scheduler restart the whole job (SLURM --requeue, a "
                     "Kubernetes Job's backoffLimit), or use torchrun's --max-restarts")
    return None if preempt_signal is None else _signal_number(preempt_signal)


def _signal_number(name: Union[str, int]) -> int:
    """The number of a preemption signal given as "USR1", "SIGUSR1" or a Signals value."""
    text = name.name if isinstance(name, signal.Signals) else str(name)
    short = text.upper()[3:] if text.upper().startswith("SIG") else text.upper()
    if short not in PREEMPT_SIGNALS or not hasattr(signal, "SIG" + short):
        raise _error("--preempt-signal", name, " | ".join(PREEMPT_SIGNALS) +
                     " (with or without SIG; SIGTERM always counts)",
                     "pass the signal your scheduler sends before it stops the job, e.g. "
                     "USR1 for SLURM's --signal=USR1@60")
    return int(getattr(signal, "SIG" + short))


# --- environment ------------------------------------------------------------------------


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


# --- supervising ------------------------------------------------------------------------


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


def launch(
    cmd: Sequence[str],
    nproc: int,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    coordinator: Optional[str] = None,
    worker_hosts: Optional[Sequence[str]] = None,
    gpus_per_proc: Optional[int] = None,
    backend: str = "auto",
    timeout: Optional[float] = None,
    grace: float = DEFAULT_GRACE,
    max_restarts: int = 0,
    preempt_signal: Union[str, int, None] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    stdout: Optional[TextIO] = None,
    stderr: Optional[TextIO] = None,
    handle_signals: bool = True,
) -> LaunchResult:
    """Run `cmd` as `nproc` workers of a W = nproc*nnodes world and supervise them.

    `env` is the base environment (default: os.environ) that the contract variables are
    added to. Output goes to `stdout`/`stderr` (default: sys.stdout/sys.stderr at the time
    of each line) prefixed with `[rank R] `; the launcher's notes and final line go to
    `stderr`. Raises LaunchError for invalid arguments and OSError when `cmd` cannot start.

    When a worker fails, every worker is stopped and, up to `max_restarts` times, the
    whole job starts again (on fresh ports unless `coordinator` is given) with
    KERASMGPU_RESTART_COUNT raised by one; `timeout` bounds all runs together.

    With `handle_signals` (and when called from the main thread) SIGINT, SIGTERM and
    `preempt_signal` (e.g. "USR1") to this process are caught while the workers run, the
    workers get SIGTERM, then SIGKILL after `grace` s, nothing restarts, and the
    result's returncode is 143 (requeue) for SIGTERM and `preempt_signal`, 130 for
    SIGINT; the previous handlers are restored before returning.
    """
    cmd = list(cmd)
    if not cmd:
        raise _error("cmd", cmd, "a non-empty command", "pass e.g. [sys.executable, 'train.py']")
    _validate(nproc, nnodes, node_rank, coordinator, worker_hosts, gpus_per_proc, backend,
              timeout)
    preempt = _validate_recovery(grace, max_restarts, nnodes, preempt_signal)
    layout = _Layout(nproc, coordinator, dict(
        nnodes=nnodes, node_rank=node_rank, worker_hosts=worker_hosts,
        gpus_per_proc=gpus_per_proc, backend=backend, base_env=env,
        max_restarts=max_restarts,
    ))
    envs, notes = layout.environments(0)  # every LaunchError comes before any start
    output = _Output(stdout, stderr)
    for note in notes:
        output.say(note)
    output.say(binding_note(envs[0]["KERASMGPU_COORDINATOR"]))
    job = _Job(cmd, envs, first_rank=node_rank * nproc, cwd=cwd, timeout=timeout,
               grace=grace, preempt=preempt,
               deadline=None if timeout is None else time.monotonic() + timeout)
    interrupt = _Interrupt()
    previous = _install_handlers(interrupt, preempt) if handle_signals else {}
    try:
        return _attempts(job, layout, max_restarts, output, interrupt)
    finally:
        _restore_handlers(previous)


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


@dataclass
class _Layout:
    """Where the workers of each run find each other: the same ranks every run, fresh
    loopback ports for each run unless a coordinator was given."""

    nproc: int
    coordinator: Optional[str]
    options: dict[str, Any]

    def environments(self, restart: int) -> tuple[list[dict[str, str]], list[str]]:
        # A new port block per run: the last run's sockets may linger in TIME_WAIT, and
        # a worker of it killed mid-start must not be joined by the next run's.
        address = self.coordinator or join_address(
            "127.0.0.1", free_port_block(2 + self.nproc * self.options["nnodes"]))
        return worker_environments(self.nproc, address, restart_count=restart,
                                   **self.options)


def _attempts(job: _Job, layout: _Layout, max_restarts: int, output: _Output,
              interrupt: _Interrupt) -> LaunchResult:
    """Run the job, and again after each failure while restarts are left."""
    restart = 0
    while True:
        workers, result = _run(job, output, interrupt)
        result.restarts = restart
        failed = result.failed_rank is not None
        if failed and restart < max_restarts and interrupt.signum is not None:
            _signalled_while_stopping(result, interrupt.signum, job)
        if max_restarts and result.message:
            result.message = result.message.replace(
                f"{PROG}: ", f"{PROG}: run {restart + 1} of at most {max_restarts + 1}: ", 1)
        _report(workers, result, output)
        if not failed or not max_restarts or result.interrupted_by is not None:
            return result
        if restart >= max_restarts:
            output.say(f"{PROG}: no restart left (--max-restarts {max_restarts}); "
                       f"exit {result.returncode}")
            return result
        if job.deadline is not None and time.monotonic() >= job.deadline:
            output.say(f"{PROG}: no restart: --timeout {job.timeout:g} s has passed; "
                       f"exit {result.returncode}")
            return result
        restart += 1
        output.say(f"{PROG}: restarting the whole job, restart {restart} of {max_restarts} "
                   f"({RESTART_COUNT_ENV}={restart})")
        job.envs = layout.environments(restart)[0]


def _signalled_while_stopping(result: LaunchResult, signum: int, job: _Job) -> None:
    """A signal that came while a failure was being stopped: the launcher was asked to
    end (a preemption: the machine is going away), so it ends as the signal says
    instead of starting the job again."""
    code, result.preempted = _signal_status(signum, job.preempt)
    result.returncode, result.interrupted_by = code, _signal_name(signum)
    result.message = f"{result.message}; received {result.interrupted_by}, not restarting; " \
                     f"exit {code}"


@dataclass
class _Job:
    """What every run of this node's workers starts from."""

    cmd: list[str]
    envs: list[dict[str, str]]  # by local rank
    first_rank: int  # global rank of local rank 0
    cwd: Optional[str]
    timeout: Optional[float]
    grace: float
    preempt: Optional[int]  # the preemption signal besides SIGTERM
    deadline: Optional[float]  # time.monotonic() when `timeout` ends every run


class _Output:
    """Where the workers' lines and the launcher's own go, one whole line at a time."""

    def __init__(self, stdout: Optional[TextIO], stderr: Optional[TextIO]) -> None:
        self._stdout, self._stderr = stdout, stderr
        self.lock = threading.Lock()

    def out(self) -> TextIO:
        return self._stdout if self._stdout is not None else sys.stdout

    def err(self) -> TextIO:
        return self._stderr if self._stderr is not None else sys.stderr

    def say(self, line: str) -> None:
        with self.lock:
            try:
                self.err().write(line + "\n")
                self.err().flush()
            except (OSError, ValueError):
                pass


@dataclass
class _Outcome:
    """Why supervision stopped waiting: the first failure, the timeout, a signal, or
    (none of them) every worker exited 0."""

    failed: Optional[_Worker] = None
    timed_out: bool = False
    signum: Optional[int] = None


def _run(job: _Job, output: _Output,
         interrupt: _Interrupt) -> tuple[list[_Worker], LaunchResult]:
    """One run of the job's workers: start them, wait, stop whatever is left."""
    workers: list[_Worker] = []
    notes = tempfile.mkdtemp(prefix="kerasmgpu-launch-")  # each worker's failure note
    try:
        _spawn(job, output, workers, notes)
        outcome = _wait(workers, job.deadline, interrupt, notes)
        return workers, _conclude(workers, outcome, job, interrupt)
    except BaseException:
        # A start that failed half-way, or KeyboardInterrupt when handle_signals=False:
        # never return or raise with workers left running.
        _stop(workers, job.grace if workers else 0.0, interrupt)
        raise
    finally:
        shutil.rmtree(notes, ignore_errors=True)


def _spawn(job: _Job, output: _Output, workers: list[_Worker], notes: str) -> None:
    """Start every local worker, appending each to `workers` as soon as it runs."""
    for local, worker_env in enumerate(job.envs):
        rank = job.first_rank + local
        noted = {FAILURE_FILE_ENV: os.path.join(notes, f"failed.{rank}")}
        proc = subprocess.Popen(
            job.cmd, env={**worker_env, **noted}, cwd=job.cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            # Own session: the worker and everything it starts share one process
            # group that can be signalled as a whole, and a Ctrl-C at the terminal
            # reaches only the launcher, which then stops the workers in order.
            start_new_session=True,
        )
        worker = _Worker(rank=rank, proc=proc, started=time.monotonic())
        workers.append(worker)
        threading.Thread(target=_wait_for_exit, args=(worker,), daemon=True,
                         name=f"kerasmgpu-launch-wait{rank}").start()
        for pipe, sink in ((proc.stdout, output.out), (proc.stderr, output.err)):
            assert pipe is not None
            thread = threading.Thread(
                target=_pump, args=(pipe, sink, f"[rank {rank}] ", output.lock),
                name=f"kerasmgpu-launch-rank{rank}", daemon=True,
            )
            thread.start()
            worker.threads.append(thread)


def _wait(workers: list[_Worker], deadline: Optional[float],
          interrupt: _Interrupt, notes: str) -> _Outcome:
    """Poll until a worker fails, all exit 0, the timeout passes or a signal comes."""
    outcome = _Outcome()
    while True:
        _reap(workers)
        if interrupt.signum is not None:
            break
        failures = [w for w in workers if not w.running and w.proc.returncode != 0]
        if failures:
            outcome.failed = _first_failure(workers, failures, notes)
            break
        if not any(w.running for w in workers):
            break
        if deadline is not None and time.monotonic() >= deadline:
            outcome.timed_out = True
            break
        time.sleep(_POLL)
    # Fixed now: a Ctrl-C while a failure is being cleaned up only hurries the stop.
    if outcome.failed is None and not outcome.timed_out:
        outcome.signum = interrupt.signum
    return outcome


def _noted_failures(workers: Sequence[_Worker], notes: str) -> dict[int, float]:
    """rank -> the instant a worker noted it failed (`process.ending`), for the notes
    written by the worker process itself (its PID), not by a child it started."""
    noted: dict[int, float] = {}
    for w in workers:
        try:
            with open(os.path.join(notes, f"failed.{w.rank}"), encoding="ascii") as f:
                pid, when = f.read().split()
            if int(pid) == w.proc.pid:
                noted[w.rank] = float(when)
        except (OSError, ValueError):
            continue
    return noted


def _first_failure(workers: list[_Worker], failures: list[_Worker], notes: str) -> _Worker:
    """The worker that failed first. A failure makes the others fail in their collectives
    a moment later, and the exit times the launcher takes can put a consequence first:
    a worker that raised may still be exiting (a framework's teardown) when another,
    failing because of it, is gone - measured, 1 job in 8 on a loaded 2-core machine
    named the wrong rank. A worker's own note of the instant it failed precedes every
    failure it causes, so the noted instants order the workers that noted one. A worker
    that died without a note (a signal, `os._exit`) is placed by its exit only: the
    kernel closes a dying process's sockets before it tells the launcher, so the others'
    notes may come before that exit is seen."""
    by_exit = min(failures, key=lambda w: (w.ended or 0.0, w.rank))
    noted = _noted_failures(workers, notes)
    if by_exit.rank not in noted:
        return by_exit
    first = min((w for w in workers if w.rank in noted and (w.running or w in failures)),
                key=lambda w: (noted[w.rank], w.rank))
    settle = time.monotonic() + _SETTLE
    while first.running and time.monotonic() < settle:  # still exiting: its status
        time.sleep(_POLL)
        _reap(workers)
    return by_exit if first.running or first.proc.returncode == 0 else first


def _conclude(workers: list[_Worker], outcome: _Outcome, job: _Job,
              interrupt: _Interrupt) -> LaunchResult:
    """Stop what still runs and say how the run ended."""
    still_running = [w for w in workers if w.running]
    pgids = {w.proc.pid for w in workers}
    message: Optional[str] = None
    if outcome.signum is None and outcome.failed is None and not outcome.timed_out:
        # Every worker exited 0; anything left in their groups was started by them and
        # would otherwise outlive the run (and hold its pipes open).
        leftover = _live_groups(pgids)
        if leftover:
            ranks = sorted(w.rank for w in workers if w.proc.pid in leftover)
            message = (f"{PROG}: stopped processes left running by rank(s) "
                       f"{', '.join(map(str, ranks))} after they exited")
    if still_running or _live_groups(pgids):
        _stop(workers, job.grace, interrupt)
    returncode, verdict = _verdict(outcome, len(still_running), job)
    return LaunchResult(
        returncode=returncode,
        failed_rank=None if outcome.failed is None else outcome.failed.rank,
        timed_out=outcome.timed_out,
        durations={w.rank: (w.ended if w.ended is not None else time.monotonic()) - w.started
                   for w in workers},
        returncodes={w.rank: w.proc.returncode for w in workers},
        pids={w.rank: w.proc.pid for w in workers},
        interrupted_by=None if outcome.signum is None else _signal_name(outcome.signum),
        message=verdict or message,
        preempted=outcome.signum is not None and _signal_status(outcome.signum, job.preempt)[1],
    )


def _signal_status(signum: int, preempt: Optional[int]) -> tuple[int, bool]:
    """The launcher's status after signal `signum`, and whether it means preemption."""
    if signum in (signal.SIGTERM, preempt):
        return status.REQUEUE, True
    return status.by_signal(signum), False


def _verdict(outcome: _Outcome, stopped: int, job: _Job) -> tuple[int, Optional[str]]:
    """The launcher's exit status and its last line (see LaunchResult.returncode)."""
    if outcome.signum is not None:
        code, preempted = _signal_status(outcome.signum, job.preempt)
        line = f"{PROG}: received {_signal_name(outcome.signum)}; stopped {stopped} worker(s)"
        if preempted:
            line += (f" (SIGTERM, SIGKILL after {job.grace:g} s); exit {code}: preempted, "
                     "not restarted - run the same command again to resume from the last "
                     "backup")
        return code, line
    if outcome.failed is not None:
        code = outcome.failed.proc.returncode
        if code < 0:
            how, returncode = f"was killed by signal {_signal_name(-code)}", status.FAILURE
        else:
            how, returncode = f"exited with code {code}", code
        return returncode, (f"{PROG}: rank {outcome.failed.rank} {how}; "
                            f"stopped the other {stopped} worker(s)")
    if outcome.timed_out:
        assert job.timeout is not None
        return status.TIMEOUT, (f"{PROG}: timed out after {job.timeout:g} s; "
                                f"stopped {stopped} worker(s)")
    return status.SUCCESS, None


def _report(workers: list[_Worker], result: LaunchResult, output: _Output) -> None:
    # Let the pumps print the last lines before the summary; a grandchild that escaped
    # into its own session could hold a pipe open forever, hence the bound.
    join_until = time.monotonic() + 2.0
    for w in workers:
        for thread in w.threads:
            thread.join(max(0.0, join_until - time.monotonic()))
    if result.message:
        output.say(result.message)


# --- command line -----------------------------------------------------------------------

_VALUE_OPTIONS = {
    "--nproc", "--nnodes", "--node-rank", "--coordinator", "--timeout", "--grace",
    "--backend", "--gpus-per-proc", "--worker-hosts", "--max-restarts", "--preempt-signal",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors, in our form
        raise LaunchError(
            f"Invalid arguments. Received: {message}. Allowed: the options of "
            f"`{PROG} --help`, then a script or -m module. Fix: correct the option above."
        )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, allow_abbrev=False,
        usage=f"{PROG} --nproc N [options] (script.py | -m module) [args ...]",
        description="Start N workers of a Python script on this node, with the environment "
                    "that TensorFlow, JAX and PyTorch multi-process training read.",
        epilog="Environment contract" + __doc__.split("Environment contract", 1)[1]
        if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--nproc", help="workers on this node (usually its GPU count)")
    add("--nnodes", default="1", help="machines taking part (default 1)")
    add("--node-rank", default="0", help="this machine's rank, 0..nnodes-1 (default 0)")
    add("--coordinator", help="HOST:PORT of node 0 (default 127.0.0.1 and a free port; "
                              "required with --nnodes > 1)")
    add("--worker-hosts", help="host of every node, comma-separated, for TF_CONFIG on "
                               "several nodes")
    add("--timeout", help="stop everything after this many seconds (exit 124)")
    add("--grace", default=str(DEFAULT_GRACE),
        help=f"seconds between SIGTERM and SIGKILL when stopping: the workers' time to "
             f"save a backup (default {DEFAULT_GRACE:g})")
    add("--max-restarts", default="0",
        help="start the whole job again after a worker fails, at most this many times "
             "(default 0; the run's number is in $KERASMGPU_RESTART_COUNT)")
    add("--preempt-signal",
        help=f"a signal that means preemption like SIGTERM does: {', '.join(PREEMPT_SIGNALS)} "
             "(workers get SIGTERM, the launcher exits 143 and does not restart)")
    add("--backend", default="auto", help="auto | tensorflow | jax | torch; other than auto "
                                          "sets KERAS_BACKEND (default auto)")
    add("--gpus-per-proc", help="give each worker its own K GPUs via CUDA_VISIBLE_DEVICES")
    return parser


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """Launcher options, then the worker's Python arguments (script or -m module and args).

    Split by hand because everything after the script belongs to it, even options that
    look like ours (argparse.REMAINDER is unreliable with leading dashes).
    """
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv[:i], argv[i + 1:]
        if token == "-m":
            return argv[:i], argv[i:]
        if token.startswith("-m") and not token.startswith("--"):
            return argv[:i], ["-m", token[2:], *argv[i + 1:]]
        if token.startswith("-") and token != "-":
            i += 2 if token in _VALUE_OPTIONS else 1
            continue
        return argv[:i], argv[i:]
    return argv, []


def _number(option: str, text: Optional[str], kind: Callable[[str], Union[int, float]],
            allowed: str, fix: str) -> Any:
    if text is None:
        return None
    try:
        return kind(text)
    except ValueError:
        raise _error(option, text, allowed, fix) from None


def _command(target: list[str]) -> list[str]:
    if not target:
        raise _error("script", None, "a Python file, or -m module, after the options",
                     f"e.g. {PROG} --nproc 2 train.py --epochs 3")
    if target[0] == "-m":
        if len(target) < 2 or not target[1]:
            raise _error("-m", None, "a module name after -m",
                         f"e.g. {PROG} --nproc 2 -m mypkg.train")
        return [sys.executable, *target]
    script = target[0]
    if not os.path.isfile(script):
        raise _error("script", script, "an existing Python file (or -m module)",
                     f"check the path; relative paths start at {os.getcwd()}")
    return [sys.executable, *target]


def main(argv: Optional[list[str]] = None) -> int:
    """`kerasmgpu launch ...`; returns the exit code (see LaunchResult.returncode)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    head, target = _split(args_list)
    try:
        try:
            ns = _parser().parse_args(head)
        except SystemExit as exc:  # --help
            return int(exc.code or 0)
        if ns.nproc is None:
            raise _error("--nproc", None, "an integer >= 1",
                         "pass --nproc N, usually the number of GPUs on this node")
        intfix = "pass a whole number"
        nproc = _number("--nproc", ns.nproc, int, "an integer >= 1", intfix)
        nnodes = _number("--nnodes", ns.nnodes, int, "an integer >= 1", intfix)
        node_rank = _number("--node-rank", ns.node_rank, int, "an integer >= 0", intfix)
        gpus = _number("--gpus-per-proc", ns.gpus_per_proc, int, "an integer >= 1", intfix)
        timeout = _number("--timeout", ns.timeout, float, "a number of seconds > 0",
                          "pass seconds, e.g. --timeout 3600")
        grace = _number("--grace", ns.grace, float, "a number of seconds > 0",
                        "pass seconds, e.g. --grace 30")
        restarts = _number("--max-restarts", ns.max_restarts, int, "an integer >= 0", intfix)
        hosts = None if ns.worker_hosts is None else [
            h.strip() for h in ns.worker_hosts.split(",")
        ]
        if ns.coordinator is not None:
            parse_coordinator(ns.coordinator)
        _validate(nproc, nnodes, node_rank, ns.coordinator, hosts, gpus, ns.backend,
                  timeout)
        _validate_recovery(grace, restarts, nnodes, ns.preempt_signal)
        cmd = _command(target)
        result = launch(
            cmd, nproc, nnodes=nnodes, node_rank=node_rank, coordinator=ns.coordinator,
            worker_hosts=hosts, gpus_per_proc=gpus, backend=ns.backend, timeout=timeout,
            grace=grace, max_restarts=restarts, preempt_signal=ns.preempt_signal,
        )
    except LaunchError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:  # the interpreter itself could not be started
        print(f"{PROG}: could not start workers: {exc}", file=sys.stderr, flush=True)
        return 127
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
