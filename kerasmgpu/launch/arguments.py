"""The launcher's arguments: the command line's parser, and the checks that `launch()`
and `main()` share, each failing with a LaunchError that says how to fix it."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any, Callable, NoReturn, Optional, Sequence, Union

from kerasmgpu._errors import explain
from kerasmgpu.env.cluster import split_address

PROG = "kerasmgpu launch"
DEFAULT_GRACE = 5.0
BACKENDS = ("auto", "tensorflow", "jax", "torch")
# Signals a scheduler sends ahead of a preemption or a time limit (SLURM --signal, spot
# notices) that a handler can catch; SIGTERM always counts as one.
PREEMPT_SIGNALS = ("TERM", "USR1", "USR2", "HUP", "INT", "QUIT")


class LaunchError(ValueError):
    """An argument the launcher cannot run with (the CLI exits 2 on it)."""


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


def _parser(doc: Optional[str]) -> argparse.ArgumentParser:
    # `doc` is the package docstring: its environment contract is the help's epilog.
    parser = _Parser(
        prog=PROG, allow_abbrev=False,
        usage=f"{PROG} --nproc N [options] (script.py | -m module) [args ...]",
        description="Start N workers of a Python script on this node, with the environment "
                    "that TensorFlow, JAX and PyTorch multi-process training read.",
        epilog="Environment contract" + doc.split("Environment contract", 1)[1]
        if doc else None,
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
