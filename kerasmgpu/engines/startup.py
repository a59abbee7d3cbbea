"""Several processes: the engines that must start before their frameworks' runtimes.

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

Each start-up function is given the job's detected `ClusterEnvironment`. How a process
of such a job ends (at once when it fails, without the frameworks' shutdown) is
`kerasmgpu.process.ending`'s; this module tells it when a framework has started.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import os
import socket
import sys
from typing import Any, Callable, Optional

from kerasmgpu import _hooks, registry
from kerasmgpu._errors import InvalidClusterError
from kerasmgpu.env import cluster
from kerasmgpu.process import ending

_tf_strategy: Any = None
_tf_error: Optional[BaseException] = None
_jax_error: Optional[BaseException] = None


# --- set-up at import -------------------------------------------------------------------


def setup_at_import(environment: cluster.ClusterEnvironment) -> None:
    """In a process of `environment`'s multi-process job, start the engine of the active
    Keras (its registry entry's start-up) before its runtime does, and learn how the
    process ends."""
    if environment.world_size() < 2:
        return
    ending.watch(environment)
    entry = registry.active().entry
    if entry is not None and entry.startup is not None:
        start: Callable[[cluster.ClusterEnvironment], None] = registry.resolve(entry.startup)
        _hooks.after_import(entry.backend, functools.partial(start, environment))


def _one_gpu_each(environment: cluster.ClusterEnvironment) -> bool:
    """Several processes per machine started by another launcher: one GPU each, by local
    rank (what torchrun, srun and JAX's own cluster detection assume). `kerasmgpu
    launch` hands out GPUs itself (`--gpus-per-proc`)."""
    return not environment.assigns_devices and environment.local_world_size() > 1


def _tf_resolver(tf: Any, environment: cluster.ClusterEnvironment) -> Any:
    """TensorFlow's view of the job: its own resolvers where they apply."""
    resolvers = tf.distribute.cluster_resolver
    if environment.tf_resolver == "tf_config":
        if environment.tf_workers() is not None:
            return resolvers.TFConfigClusterResolver()
    elif environment.tf_resolver == "slurm" and environment.multi_node():
        most = max(cluster.tasks_per_node(environment.env["SLURM_STEP_TASKS_PER_NODE"]))
        # GPUs are srun's business (--gpus-per-task); the resolver's own GPU split is
        # turned off, and these counts only satisfy its bookkeeping.
        return resolvers.SlurmClusterResolver(
            port_base=environment.main_port + 2, gpus_per_node=most, gpus_per_task=1,
            auto_set_gpu=False)
    workers = environment.tf_workers()
    if workers is None:
        raise InvalidClusterError(
            f"Invalid cluster for TensorFlow: {environment.describe()}. TensorFlow needs "
            "every process's address, which this launcher does not give. Allowed: one "
            "machine, srun, a TF_CONFIG naming every worker, or `kerasmgpu launch "
            "--worker-hosts`. Fix: set TF_CONFIG on every process, or start the job with "
            "srun or `kerasmgpu launch`."
        )
    return resolvers.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": workers}), task_type="worker",
        task_id=environment.global_rank(), rpc_layer="grpc")


def start_tensorflow(environment: cluster.ClusterEnvironment) -> None:
    """The worker's MultiWorkerMirroredStrategy, the moment TensorFlow is imported."""
    global _tf_strategy, _tf_error
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if len(gpus) > 1 and _one_gpu_each(environment):
            tf.config.set_visible_devices(gpus[environment.local_rank() % len(gpus)], "GPU")
        _tf_strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=_tf_resolver(tf, environment))
    except Exception as exc:  # reported by parallelize(), never at import
        _tf_error = exc
    ending.framework_started()


def _jax_arguments(jax: Any, environment: cluster.ClusterEnvironment) -> dict:
    timeout = int(environment.collective_timeout())
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


def start_jax(environment: cluster.ClusterEnvironment) -> None:
    global _jax_error
    try:
        import jax

        # CPU devices of different processes only reach each other through gloo.
        try:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        except (AttributeError, ValueError):  # older/newer jax: default is fine
            pass
        jax.distributed.initialize(**_jax_arguments(jax, environment))
    except Exception as exc:
        _jax_error = exc
    ending.framework_started()


def start_torch(environment: cluster.ClusterEnvironment) -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count():
        # Each worker sees its own GPUs (`launch --gpus-per-proc`) or all of them.
        torch.cuda.set_device(environment.local_rank() % torch.cuda.device_count())
    # What starts also stops: the process group parallelize() joins, at a normal end.
    ending.framework_started(teardown=_teardown_torch)


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
    if isinstance(_tf_error, InvalidClusterError):
        raise _tf_error
    if _tf_error is not None:
        raise _too_late("TensorFlow", _tf_error) from _tf_error
    raise _too_late("TensorFlow", "no strategy was created at import")


def ensure_jax(environment: cluster.ClusterEnvironment) -> None:
    """Raise when `jax.distributed` did not start for `environment`'s job."""
    if _jax_error is not None:
        raise _too_late("JAX", _jax_error) from _jax_error
    import jax

    if jax.process_count() != environment.world_size():
        raise _too_late("JAX", f"jax.process_count() is {jax.process_count()}")


def _loopback_interface() -> Optional[str]:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((name for name in names if name == "lo" or name.startswith("lo")), None)


def torch_process_group(environment: cluster.ClusterEnvironment) -> Any:
    """Join (once) the torch.distributed group of `environment`'s job; gloo on CPU, nccl
    on GPUs (or what the launcher chose).

    Under torchrun (or a PyTorchJob) torch's own env:// joins the launcher's store.
    Elsewhere rank 0 serves the store itself, on loopback when the job runs on this
    machine only; every wait (the store, each collective) is bounded by
    `KERASMGPU_COLLECTIVE_TIMEOUT`.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return dist
    backend = environment.torch_backend() or ("nccl" if _torch_has_gpu() else "gloo")
    timeout = datetime.timedelta(seconds=environment.collective_timeout())
    rank, world = environment.global_rank(), environment.world_size()
    if backend == "gloo" and not environment.multi_node():
        # gloo listens on the address the host name resolves to unless told otherwise.
        interface = _loopback_interface()
        if interface:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    at = environment.torch_store()
    if at is None:
        restarted = _torchrun_attempt_store(dist, environment, world, timeout)
        if restarted is not None:
            dist.init_process_group(backend=backend, store=restarted, rank=rank,
                                    world_size=world, timeout=timeout)
            return dist
        dist.init_process_group(backend=backend, init_method="env://", rank=rank,
                                world_size=world, timeout=timeout)
        return dist
    host, port = at
    store = _tcp_store(dist, host, port, rank, world, environment.bind_host(), timeout)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world,
                            timeout=timeout)
    return dist


def _torchrun_attempt_store(dist: Any, environment: cluster.ClusterEnvironment, world: int,
                            timeout: datetime.timedelta) -> Any:
    """torchrun's store, with this run's keys apart from an earlier run's (None: not a
    torchrun worker on its agent's store).

    torchrun (torch 2.13) keeps its agent's store across `--max-restarts` runs, and env://
    joins it without a run's prefix: a restarted process could read the address an
    earlier run's rank 0 published and wait on it until gloo gives up ("Connection
    refused", measured 2 of 4 restarted jobs on a loaded machine).
    """
    agent = environment.torch_agent_store()
    if agent is None:
        return None
    host, port, run = agent
    store = dist.TCPStore(host, port, world, False, timeout)
    return dist.PrefixStore(f"kerasmgpu/run_{run}", store)


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
