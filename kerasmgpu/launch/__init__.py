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

import sys
from typing import Optional

from kerasmgpu.launch.arguments import (
    DEFAULT_GRACE,
    PREEMPT_SIGNALS,
    PROG,
    LaunchError,
    _command,
    _error,
    _number,
    _parser,
    _split,
    _validate,
    _validate_recovery,
    parse_coordinator,
)
from kerasmgpu.launch.contract import MAX_RESTARTS_ENV, RESTART_COUNT_ENV, worker_environments
from kerasmgpu.launch.contract import binding_note as binding_note
from kerasmgpu.launch.contract import free_port_block as free_port_block
from kerasmgpu.launch.supervise import LaunchResult, launch

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


def main(argv: Optional[list[str]] = None) -> int:
    """`kerasmgpu launch ...`; returns the exit code (see LaunchResult.returncode)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    head, target = _split(args_list)
    try:
        try:
            ns = _parser(__doc__).parse_args(head)
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
