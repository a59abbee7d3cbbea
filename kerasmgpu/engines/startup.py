"""Several processes: the engines that must start before their frameworks' runtimes, and
how a process of such a job ends.

Whatever started the processes - `kerasmgpu launch`, torchrun, `mpirun`, `srun`, or a
cluster's TF_CONFIG (see `kerasmgpu.env.cluster`) - `import kerasmgpu` in each one
registers what its engine needs before the runtime starts, without importing any
framework itself:

* TensorFlow (tf.keras 2.x, tf_keras): a `MultiWorkerMirroredStrategy`, created the
  moment `tensorflow` finishes importing ("Collective ops must be configured at program
  startup"), with TensorFlow's own cluster resolver where one fits the environment
  (TF_CONFIG: `TFConfigClusterResolver`; srun on several machines: `SlurmClusterResolver`)
  and the job's addresses otherwise;
* JAX: gloo CPU collectives and `jax.distributed.initialize` (coordinator, process count
  and id, bounded start-up, heartbeat and shutdown), before the first JAX computation;
* torch: the process's GPU (local rank), and later, in `parallelize()`, the process
  group (gloo on CPU, nccl on GPUs) with a bounded timeout.

So a multi-process script must `import kerasmgpu` before it imports TensorFlow or JAX
(and before Keras, which imports them); otherwise parallelize() explains that.

Ending. A process that fails must not wait for the others at exit: they may be blocked
in a collective with it, and JAX's exit handler waits for every process to shut down
together. So, in a process of a job of several, an uncaught exception or
`sys.exit(n)` with n != 0 ends the process right after its traceback and the exit
handlers registered after the framework started, without the framework's own
shutdown; the launcher then sees the failure and stops the others. A process that ends
normally tears down what was started (torch's process group; JAX shuts itself down),
every wait bounded by `KERASMGPU_COLLECTIVE_TIMEOUT`.
"""

from __future__ import annotations

import atexit
import datetime
import inspect
import os
import socket
import sys
import threading
from typing import Any, NoReturn, Optional

from kerasmgpu import _hooks
from kerasmgpu.env import cluster
from kerasmgpu.env.versions import KerasLine, backend_for, detect_keras_line

_tf_strategy: Any = None
_tf_error: Optional[BaseException] = None
_jax_error: Optional[BaseException] = None


# --- set-up at import -------------------------------------------------------------------


def _one_gpu_each(environment: cluster.ClusterEnvironment) -> bool:
    """Several processes per machine started by another launcher: one GPU each, by local
    rank (what torchrun, srun and JAX's own cluster detection assume). `kerasmgpu
    launch` hands out GPUs itself (`--gpus-per-proc`)."""
    return (not isinstance(environment, cluster.KerasmgpuLaunch)
            and environment.local_world_size() > 1)


def _tf_resolver(tf: Any, environment: cluster.ClusterEnvironment) -> Any:
    """TensorFlow's view of the job: its own resolvers where they apply."""
    resolvers = tf.distribute.cluster_resolver
    if isinstance(environment, (cluster.KerasmgpuLaunch, cluster.TFConfigCluster)):
        if environment.tf_workers() is not None:
            return resolvers.TFConfigClusterResolver()
    elif isinstance(environment, cluster.Slurm) and environment.multi_node():
        most = max(cluster.tasks_per_node(environment.env["SLURM_STEP_TASKS_PER_NODE"]))
        # GPUs are srun's business (--gpus-per-task); the resolver's own GPU split is
        # turned off, and these counts only satisfy its bookkeeping.
        return resolvers.SlurmClusterResolver(
            port_base=environment.main_port + 2, gpus_per_node=most, gpus_per_task=1,
            auto_set_gpu=False)
    workers = environment.tf_workers()
    if workers is None:
        raise RuntimeError(
            f"Invalid cluster for TensorFlow: {environment.describe()}. TensorFlow needs "
            "every process's address, which this launcher does not give. Allowed: one "
            "machine, srun, a TF_CONFIG naming every worker, or `kerasmgpu launch "
            "--worker-hosts`. Fix: set TF_CONFIG on every process, or start the job with "
            "srun or `kerasmgpu launch`."
        )
    return resolvers.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": workers}), task_type="worker",
        task_id=environment.global_rank(), rpc_layer="grpc")


def _start_tensorflow() -> None:
    global _tf_strategy, _tf_error
    line, _ = detect_keras_line()
    if line not in (KerasLine.TF_KERAS, KerasLine.TF_KERAS_LEGACY):
        return  # Keras 3 on TF cannot train under it (keras-team/keras#20585)
    try:
        import tensorflow as tf

        environment = cluster.current()
        gpus = tf.config.list_physical_devices("GPU")
        if len(gpus) > 1 and _one_gpu_each(environment):
            tf.config.set_visible_devices(gpus[environment.local_rank() % len(gpus)], "GPU")
        _tf_strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=_tf_resolver(tf, environment))
    except Exception as exc:  # reported by parallelize(), never at import
        _tf_error = exc
    _register_exit()


def _jax_arguments(jax: Any, environment: cluster.ClusterEnvironment) -> dict:
    timeout = int(cluster.collective_timeout())
    port = environment.jax_coordinator().rsplit(":", 1)[1]
    wanted = {
        "coordinator_address": environment.jax_coordinator(),
        "num_processes": environment.world_size(),
        "process_id": environment.global_rank(),
        "local_device_ids": [environment.local_rank()] if _one_gpu_each(environment) else None,
        # Everything is given: JAX must not replace it with what it guesses itself.
        "cluster_detection_method": "deactivate",
        # Rank 0's coordinator listens on loopback unless other machines take part
        # (JAX's default is every interface).
        "coordinator_bind_address": (f"{environment.bind_host()}:{port}"
                                     if not environment.multi_node() else f"[::]:{port}"),
        "initialization_timeout": timeout,
        "heartbeat_timeout_seconds": min(timeout, 100),
        "shutdown_timeout_seconds": timeout,
    }
    accepted = inspect.signature(jax.distributed.initialize).parameters
    # Older releases lack some of these; what they lack keeps JAX's default.
    return {k: v for k, v in wanted.items() if k in accepted}


def _start_jax() -> None:
    global _jax_error
    try:
        import jax

        # CPU devices of different processes only reach each other through gloo.
        try:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        except (AttributeError, ValueError):  # older/newer jax: default is fine
            pass
        jax.distributed.initialize(**_jax_arguments(jax, cluster.current()))
    except Exception as exc:
        _jax_error = exc
    _register_exit()


def _start_torch() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count():
        # Each worker sees its own GPUs (`launch --gpus-per-proc`) or all of them.
        torch.cuda.set_device(cluster.local_process_index() % torch.cuda.device_count())
    _register_exit()


def setup_at_import() -> None:
    """In a process of a multi-process job, start each engine before its runtime does."""
    if not cluster.launched():
        return
    _catch_failures()
    line, _ = detect_keras_line()
    backend = backend_for(line)
    if backend == "tensorflow":
        _hooks.after_import("tensorflow", _start_tensorflow)
    elif backend == "jax":
        _hooks.after_import("jax", _start_jax)
    elif backend == "torch":
        _hooks.after_import("torch", _start_torch)


# --- how a process of the job ends ----------------------------------------------------------

_failure_code: Optional[int] = None
_caught = False
_exit_registered = False


def _exit_status(code: Any) -> int:
    """The status Python gives `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


class _EndsTheProcess:
    """Rides on the SystemExit raised by `sys.exit` and dies with it.

    When the interpreter itself handles that SystemExit (nobody caught it), it releases
    the exception with no Python frame left on the main thread's stack, just before the
    exit handlers run: that is how we learn the process is exiting with this status. A
    SystemExit caught by the script dies inside the script's frames and changes nothing.
    """

    def __init__(self, status: int) -> None:
        self.status = status

    def __del__(self) -> None:
        global _failure_code
        if threading.current_thread() is not threading.main_thread():
            return
        frame = inspect.currentframe()  # this method's own frame
        if frame is not None and frame.f_back is None and self.status:
            _failure_code = self.status
        del frame


def _exit(status: Any = None) -> NoReturn:
    raise _system_exit(status)


def _system_exit(status: Any) -> SystemExit:
    # Built here, not in _exit: a local there would tie the exception to its own
    # traceback in a cycle, and only the garbage collector would then release it.
    error = SystemExit(status)
    error._kerasmgpu_exit = _EndsTheProcess(_exit_status(status))  # type: ignore[attr-defined]
    return error


def _catch_failures() -> None:
    """Learn how the process ends: uncaught exceptions and `sys.exit(n)`."""
    global _caught
    if _caught:
        return
    _caught = True
    previous = sys.excepthook

    def excepthook(kind: Any, value: Any, traceback: Any) -> None:
        global _failure_code
        previous(kind, value, traceback)  # the traceback first, as always
        _failure_code = 130 if issubclass(kind, KeyboardInterrupt) else 1

    sys.excepthook = excepthook
    sys.exit = _exit


def _register_exit() -> None:
    """Called once a framework is imported, so that ours runs before its exit handlers
    (they run last-registered first)."""
    global _exit_registered
    if not _exit_registered:
        _exit_registered = True
        atexit.register(_at_exit)


def _at_exit() -> None:
    code = _failure_code
    if code:
        # The others may be blocked in a collective with this process, and the
        # framework's own shutdown would wait for them: leave now, so that the launcher
        # sees this process fail and stops the rest.
        rank = cluster.process_index()
        try:
            sys.stderr.write(f"kerasmgpu: process {rank} failed (exit status {code}); "
                             "exiting without waiting for the other processes\n")
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(code)
    _bounded(_teardown_torch, cluster.collective_timeout())


def _bounded(work: Any, seconds: float) -> None:
    """Run `work` but give up after `seconds` (it may wait on a process that is gone)."""
    thread = threading.Thread(target=work, name="kerasmgpu-teardown", daemon=True)
    thread.start()
    thread.join(seconds)


def _teardown_torch() -> None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # at exit there is nobody left to report to
        pass


# --- what the routes ask for ---------------------------------------------------------------


def _too_late(engine: str, detail: Any) -> RuntimeError:
    return RuntimeError(
        f"Invalid import order: {engine} started before kerasmgpu could set up the "
        f"multi-process engine ({detail}). Allowed: `import kerasmgpu` before "
        "tensorflow, jax, keras or tf_keras in a script run by several processes "
        "(kerasmgpu launch, torchrun, mpirun, srun). Fix: move `import kerasmgpu` to the "
        "top of the script."
    )


def tf_strategy() -> Any:
    """The worker's MultiWorkerMirroredStrategy (created when TF was imported)."""
    if _tf_strategy is not None:
        return _tf_strategy
    if isinstance(_tf_error, RuntimeError) and str(_tf_error).startswith("Invalid cluster"):
        raise _tf_error
    if _tf_error is not None:
        raise _too_late("TensorFlow", _tf_error) from _tf_error
    raise _too_late("TensorFlow", "no strategy was created at import")


def ensure_jax() -> None:
    if _jax_error is not None:
        raise _too_late("JAX", _jax_error) from _jax_error
    import jax

    if jax.process_count() != cluster.process_count():
        raise _too_late("JAX", f"jax.process_count() is {jax.process_count()}")


def _loopback_interface() -> Optional[str]:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((name for name in names if name == "lo" or name.startswith("lo")), None)


def torch_process_group() -> Any:
    """Join (once) the job's torch.distributed group; gloo on CPU, nccl on GPUs.

    Under torchrun (or a PyTorchJob) torch's own env:// joins the launcher's store.
    Elsewhere rank 0 serves the store itself, on loopback when the job runs on this
    machine only; every wait (the store, each collective) is bounded by
    `KERASMGPU_COLLECTIVE_TIMEOUT`.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return dist
    environment = cluster.current()
    backend = os.environ.get("KERASMGPU_TORCH_BACKEND") or (
        "nccl" if _torch_has_gpu() else "gloo"
    )
    timeout = datetime.timedelta(seconds=cluster.collective_timeout())
    rank, world = environment.global_rank(), environment.world_size()
    if backend == "gloo" and not environment.multi_node():
        # gloo listens on the address the host name resolves to unless told otherwise.
        interface = _loopback_interface()
        if interface:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    at = environment.torch_store()
    if at is None:
        dist.init_process_group(backend=backend, init_method="env://", rank=rank,
                                world_size=world, timeout=timeout)
        return dist
    host, port = at
    store = _tcp_store(dist, host, port, rank, world, environment.bind_host(), timeout)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world,
                            timeout=timeout)
    return dist


def _tcp_store(dist: Any, host: str, port: int, rank: int, world: int, bind: str,
               timeout: datetime.timedelta) -> Any:
    if rank != 0:
        return dist.TCPStore(host, port, world, False, timeout)
    # TCPStore itself listens on every interface; handed a socket we bound, it uses that.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((bind, port))
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return dist.TCPStore(host, port, world, True, timeout, master_listen_fd=listener.detach())


def _torch_has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.device_count())
