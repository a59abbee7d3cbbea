"""`torch_ddp`: Keras 3 on PyTorch - one process per device, DDP-style.

`keras.distribution` is silently ignored on the torch backend, so data parallelism
there means `torch.distributed`: `kerasmgpu launch --nproc N script.py` starts one
process per device and, in each, `parallelize(model)`:

* joins the process group (gloo on CPU, nccl on GPUs) and broadcasts rank 0's
  weights (and optimizer state), so every replica starts identical;
* makes `fit` feed each process its own slice of every padded global batch
  (`kerasmgpu.batching.shard`: same number of steps everywhere, nothing dropped);
* averages the gradients over the processes (one flat all-reduce per step) before the
  optimizer applies them - with the packed weights each process's loss is its share
  of the global mean, so the average is the single-device gradient;
* sums the metric states (totals, counts, confusion matrices) over the processes when
  an epoch's results are read, so History and `evaluate` report the global figures;
  and at every step too when a callback of yours reads the per-batch logs (see
  `_reads_batch_logs`): they are then one device's, and a callback that stops the fit
  on them (TerminateOnNaN) stops every process at the same step. Otherwise a step
  costs no collective beyond the gradients' (the progress bar shows this process's
  running values);
* keeps non-trainable state (e.g. BatchNorm statistics) equal by broadcasting rank 0's
  at every epoch end (one flat broadcast).

Its life: `TorchDDPEngine.start`, the moment torch is imported in a process of a job,
gives the process its GPU (local rank) and registers the process group's teardown at a
normal end; `parallelize()` joins the group (`torch_process_group`: torchrun's store, or
rank 0's own on loopback for one machine), every wait bounded by
`KERASMGPU_COLLECTIVE_TIMEOUT`.

Outside `kerasmgpu launch`, asking for more than one device is an error that says how
to launch; `gpus=1` / `gpus=[0]` is the model as it is, and any other single device an
error that says how to make it the process's first (`_one_device_hint`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import threading
import types
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence

from kerasmgpu._errors import explain
from kerasmgpu.adapters import Adapter
from kerasmgpu.engines.base import Engine, Explanation
from kerasmgpu.env import devices as devices_module
from kerasmgpu.env.cluster import TIMEOUT_ENV, ClusterEnvironment
from kerasmgpu.env.devices import Device
from kerasmgpu.process import ending
from kerasmgpu.registry import Route

_local = threading.local()


def _launch_hint(devices: Sequence[Device]) -> str:
    return explain(
        "gpus",
        f"{len(devices)} devices in one process on the torch backend",
        "one device per process: on PyTorch, data parallelism runs one process per "
        "device (keras.distribution is ignored there)",
        f"run the script with `kerasmgpu launch --nproc {len(devices)} script.py` "
        "(each process then calls parallelize(model)), or pass gpus=1",
        raw=True,
    )


def _one_device_hint(device: Device) -> str:
    """`gpus=[k]` outside `kerasmgpu launch`: why torch cannot move the model to k.

    Keras on torch puts every tensor it makes (weights, inputs, optimizer state) on one
    device for the whole process, so moving one model from the outside would leave the
    rest on the first device. Making device k the process's first one does move it all.
    """
    if device.kind == "gpu":
        physical = devices_module.physical_gpu(device.index)
        fix = (f"make it the process's first GPU: run with CUDA_VISIBLE_DEVICES={physical} "
               "and pass gpus=1")
    else:
        fix = ("pass gpus=1 (without GPUs torch has one CPU device per process), or run the "
               "script with `kerasmgpu launch --nproc N` for N replicas")
    return explain(
        "gpus",
        f"[{device.index}] ({device}) on the torch backend outside `kerasmgpu launch`",
        "gpus=1 or gpus=[0]: torch's default device, where the model trains as it is "
        "(Keras on torch keeps every tensor of a process on one device)",
        fix,
        raw=True,
    )


def _teardown_torch() -> None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # at exit there is nobody left to report to
        pass


def _loopback_interface() -> Optional[str]:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((name for name in names if name == "lo" or name.startswith("lo")), None)


def torch_process_group(job: ClusterEnvironment) -> Any:
    """Join (once) the torch.distributed group of `job`; gloo on CPU, nccl
    on GPUs (or what the launcher chose).

    Under torchrun (or a PyTorchJob) torch's own env:// joins the launcher's store.
    Elsewhere rank 0 serves the store itself, on loopback when the job runs on this
    machine only; every wait (the store, each collective) is bounded by
    `KERASMGPU_COLLECTIVE_TIMEOUT`.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return dist
    backend = job.torch_backend() or ("nccl" if _torch_has_gpu() else "gloo")
    timeout = datetime.timedelta(seconds=job.collective_timeout())
    rank, world = job.global_rank(), job.world_size()
    if backend == "gloo" and not job.multi_node():
        # gloo listens on the address the host name resolves to unless told otherwise.
        interface = _loopback_interface()
        if interface:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    at = job.torch_store()
    if at is None:
        restarted = _torchrun_attempt_store(dist, job, world, timeout)
        if restarted is not None:
            dist.init_process_group(backend=backend, store=restarted, rank=rank,
                                    world_size=world, timeout=timeout)
            return dist
        dist.init_process_group(backend=backend, init_method="env://", rank=rank,
                                world_size=world, timeout=timeout)
        return dist
    host, port = at
    store = _tcp_store(dist, host, port, rank, world, job.bind_host(), timeout)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world,
                            timeout=timeout)
    return dist


def _torchrun_attempt_store(dist: Any, job: ClusterEnvironment, world: int,
                            timeout: datetime.timedelta) -> Any:
    """torchrun's store, with this run's keys apart from an earlier run's (None: not a
    torchrun worker on its agent's store).

    torchrun (torch 2.13) keeps its agent's store across `--max-restarts` runs, and env://
    joins it without a run's prefix: a restarted process could read the address an
    earlier run's rank 0 published and wait on it until gloo gives up ("Connection
    refused", measured 2 of 4 restarted jobs on a loaded machine).
    """
    agent = job.torch_agent_store()
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


class TorchDDPEngine(Engine):
    route = Route.TORCH_DDP
    saves_locally = True
    device_lister = staticmethod(devices_module.torch_devices)
    # One process per device (gloo or NCCL), started by a launcher.
    needs_launcher = True
    metrics_per_process = True
    engine_name = "torch.distributed, one process per device"

    @classmethod
    def start(cls, job: ClusterEnvironment) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count():
            # Each worker sees its own GPUs (`launch --gpus-per-proc`) or all of them.
            torch.cuda.set_device(job.local_rank() % torch.cuda.device_count())
        # What starts also stops: the process group parallelize() joins, at a normal end.
        ending.framework_started(teardown=_teardown_torch)

    @classmethod
    def explain(cls, gpus: int, multi_process: bool, platform: str) -> Explanation:
        return Explanation(
            cls.engine_name, "nccl" if gpus else "gloo",
            "torch.distributed all-reduces gradients between processes: nccl between "
            "GPUs, gloo on the CPU; `kerasmgpu launch --nproc N` starts one process per "
            "device.")

    def __init__(self, adapter: Adapter, devices: Sequence[Device], *,
                 job: ClusterEnvironment) -> None:
        super().__init__(adapter, devices, job=job)
        if not job.multi_process():
            if len(devices) == 1:
                raise ValueError(_one_device_hint(devices[0]))
            raise ValueError(_launch_hint(devices))
        self.dist = torch_process_group(job)
        self.timeout = job.collective_timeout()
        self.world = int(self.dist.get_world_size())
        # Whether the metric states are summed at every step (`use_callback_flags`).
        self.sum_every_step = True

    @classmethod
    def available_devices(cls, adapter: Adapter, job: ClusterEnvironment
                          ) -> List[Device]:
        if not job.multi_process():
            return cls.list_devices()
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count():
            index = torch.cuda.current_device()
            return [Device("gpu", index, f"cuda:{index}")]
        return [Device("cpu", 0, "cpu")]

    @property
    def replicas(self) -> int:
        return self.world

    def scope(self) -> ContextManager[Any]:
        return contextlib.nullcontext()

    def owns(self, model: Any) -> bool:
        # No scope on torch: every process trains the model it built, in place.
        return True

    def owns_optimizer(self, optimizer: Any) -> bool:
        return True

    def any_process(self, flag: bool) -> bool:
        return self.any_processes([flag])[0]

    def any_processes(self, flags: Sequence[bool]) -> List[bool]:
        import torch

        value = torch.tensor([int(flag) for flag in flags], dtype=torch.int32)
        if self.dist.get_backend() == "nccl":
            value = value.cuda()
        _collective(self.timeout, self.dist.all_reduce, value, op=self.dist.ReduceOp.MAX)
        return [bool(v) for v in value.tolist()]

    def step_gradients(self, compute: Callable[..., List[Any]],
                       parts: Sequence[Sequence[Any]]) -> List[Any]:
        # The step averages the processes' gradients (`prepare_compiled`).
        totals = _all_reduce_flat(self.timeout, self.dist, self._mine(compute, parts))
        return [(total / self.world).cpu().numpy() for total in totals]

    def replica_outputs(self, compute: Callable[..., List[Any]],
                        parts: Sequence[Sequence[Any]]) -> List[Any]:
        import torch

        out = []
        for value in self._mine(compute, parts):
            pieces = [torch.empty_like(value) for _ in range(self.world)]
            _collective(self.timeout, self.dist.all_gather, pieces, value)
            out.append(torch.cat(pieces).cpu().numpy())
        return out

    def _mine(self, compute: Callable[..., List[Any]], parts: Sequence[Sequence[Any]]
              ) -> List[Any]:
        """`compute` on this process's part (one replica a process), as float64 tensors
        on its device (Keras's own conversion places the inputs there)."""
        import torch

        convert = self.adapter.keras.ops.convert_to_tensor
        mine = compute(*[convert(part) for part in parts[int(self.dist.get_rank())]])
        return [torch.as_tensor(value).detach().to(torch.float64).contiguous()
                for value in mine]

    # --- the DDP pieces ---------------------------------------------------------------

    def _broadcast(self, variables: Sequence[Any]) -> None:
        for variable in variables:
            _collective(self.timeout, self.dist.broadcast, variable.value.data, src=0)

    def broadcast_arrays(self, arrays: List[Any]) -> List[Any]:
        import torch

        tensors = [torch.as_tensor(a).clone() for a in arrays]
        if self.dist.get_backend() == "nccl":
            tensors = [t.cuda() for t in tensors]
        for tensor in tensors:
            _collective(self.timeout, self.dist.broadcast, tensor, src=0)
        return [t.cpu().numpy() for t in tensors]

    def prepare_replica(self, replica: Any) -> None:
        if not getattr(replica, "built", True):
            # Built later, by its first batch, each process would draw its own initial
            # weights and nothing would make them equal again.
            raise ValueError(explain(
                "model", f"an unbuilt {type(replica).__name__} (no weights yet)",
                "a model whose weights exist when parallelize() is called, so that rank "
                "0's can be broadcast to every process",
                "give it an input shape (`keras.Input(shape)` as the first layer of a "
                "Sequential) or call `model.build(input_shape)` before parallelize()",
                raw=True,
            ))
        self._broadcast(replica.weights)
        if getattr(replica, "optimizer", None) is not None and replica.optimizer.built:
            self._broadcast(replica.optimizer.variables)
        original = replica.get_metrics_result

        def get_metrics_result(model: Any) -> Dict[str, Any]:
            if getattr(_local, "in_step", False) and not self.sum_every_step:
                return original()  # the per-step logs: this process's running values
            with self._summed_metric_states(model):
                return original()

        replica.__dict__["get_metrics_result"] = types.MethodType(get_metrics_result, replica)
        _mark_steps(replica)

    def callback_flags(self, callbacks: List[Any]) -> List[bool]:
        # Agreed by the job: a callback given to the chief alone (TensorBoard
        # `if is_chief()`) must make every process sum at every step, or their
        # collectives would no longer pair up.
        base = self.adapter.keras.callbacks.Callback
        return [any(_reads_batch_logs(c, base) for c in callbacks)]

    def use_callback_flags(self, flags: List[bool]) -> None:
        self.sum_every_step = flags[0]

    def prepare_compiled(self, replica: Any) -> None:
        # Every compile installs the replica's step methods anew (compute_metrics
        # among them): mark the new one. Before, the mark was lost at the compile,
        # and every step summed the metric states - one collective per step more.
        _mark_steps(replica)
        optimizer = replica.optimizer
        if optimizer is None or getattr(optimizer, "_kerasmgpu_all_reduce", False):
            return
        original: Callable[..., Any] = optimizer.apply
        world = self.world
        dist = self.dist

        def apply(grads: Sequence[Any], trainable_variables: Any = None) -> Any:

            present = [g for g in grads if g is not None]
            if present:
                for g, total in zip(present, _all_reduce_flat(self.timeout, dist, present)):
                    g.copy_(total / world)
            return original(grads, trainable_variables)

        optimizer.apply = apply
        optimizer._kerasmgpu_all_reduce = True

    @contextlib.contextmanager
    def _summed_metric_states(self, model: Any) -> Iterator[None]:
        """Metric states summed over the processes while the results are read."""
        import torch

        variables = [v for metric in model.metrics for v in metric.variables]
        if not variables:
            yield
            return
        saved = [v.value.detach().clone() for v in variables]
        for variable, value, total in zip(
            variables, saved, _all_reduce_flat(self.timeout, self.dist, saved, torch.float64)
        ):
            variable.assign(total.to(value.dtype))
        try:
            yield
        finally:
            for variable, value in zip(variables, saved):
                variable.assign(value)

    def epoch_end(self, replica: Any) -> None:
        # Rank 0's non-trainable state (BatchNorm statistics, which each process moved on
        # its own rows), in one flat broadcast; none for a model without any.
        variables = [v for v in replica.non_trainable_weights if hasattr(v, "assign")]
        if not variables:
            return
        values = [v.value.data for v in variables]
        for variable, value in zip(variables, _broadcast_flat(self.timeout, self.dist, values)):
            variable.assign(value)

    def describe(self) -> Dict[str, str]:
        backend = self.dist.get_backend() if self.dist.is_initialized() else "-"
        return {
            "route": self.route.value,
            "engine": "torch.distributed (one process per device, gradients all-reduced)",
            "replicas": str(self.replicas),
            "devices": ", ".join(d.name for d in self.devices),
            "all_reduce": f"{backend} all_reduce of one flat gradient buffer per step",
            "step": "each process computes the gradients of its share of the batch; they are "
            "all-reduced before every update",
        }


def _mark_steps(replica: Any) -> None:
    """`compute_metrics` - Keras's per-step logs - marks that it runs (once per method)."""
    compute_metrics = replica.compute_metrics
    if getattr(compute_metrics, "_kerasmgpu_marks_steps", False):
        return

    def compute_metrics_local(model: Any, *args: Any, **kwargs: Any) -> Any:
        _local.in_step = True
        try:
            return compute_metrics(*args, **kwargs)
        finally:
            _local.in_step = False

    compute_metrics_local._kerasmgpu_marks_steps = True  # type: ignore[attr-defined]
    replica.__dict__["compute_metrics"] = types.MethodType(compute_metrics_local, replica)


# Keras's own callbacks that show the per-batch logs but decide nothing on them.
_DISPLAY_ONLY = ("ProgbarLogger", "History")


def _reads_batch_logs(callback: Any, base: Any) -> bool:
    """Whether `callback` has a batch-end hook of its own (so may read, and act on, the
    per-batch logs): a method overridden in its class, or set on the instance
    (LambdaCallback). kerasmgpu's own callbacks and Keras's progress bar do not act
    on them."""
    kind = type(callback)
    package = kind.__module__.split(".")[0]
    if package == "kerasmgpu" or (package in ("keras", "tf_keras")
                                  and kind.__name__ in _DISPLAY_ONLY):
        return False
    for name in ("on_train_batch_end", "on_test_batch_end", "on_batch_end"):
        hook = getattr(callback, name, None)
        if getattr(hook, "__func__", hook) is not getattr(base, name, None):
            return True
    return False


def _all_reduce_flat(timeout: float, dist: Any, tensors: Sequence[Any], dtype: Any = None
                     ) -> List[Any]:
    """The sums of `tensors` over the processes, shaped like them, in one collective
    (one flat all-reduce per step instead of one per weight)."""
    import torch

    flat = torch.cat([t.reshape(-1) if dtype is None else t.reshape(-1).to(dtype)
                      for t in tensors])
    _collective(timeout, dist.all_reduce, flat)
    pieces = torch.split(flat, [t.numel() for t in tensors])
    return [piece.view_as(t) for piece, t in zip(pieces, tensors)]


def _broadcast_flat(timeout: float, dist: Any, tensors: Sequence[Any]) -> List[Any]:
    """Rank 0's `tensors`, shaped like them, in one collective (of one dtype each)."""
    import torch

    out: List[Any] = [None] * len(tensors)
    groups: Dict[Any, List[int]] = {}
    for index, tensor in enumerate(tensors):
        groups.setdefault(tensor.dtype, []).append(index)
    for members in groups.values():
        flat = torch.cat([tensors[i].reshape(-1) for i in members])
        _collective(timeout, dist.broadcast, flat, src=0)
        pieces = torch.split(flat, [tensors[i].numel() for i in members])
        for i, piece in zip(members, pieces):
            out[i] = piece.view_as(tensors[i])
    return out


def _collective(timeout: float, operation: Callable[..., Any], *args: Any, **kwargs: Any
                ) -> Any:
    """A torch.distributed call whose failure says what went wrong in our words
    (`timeout`: the seconds the process group waits, for the message)."""
    try:
        return operation(*args, **kwargs)
    except RuntimeError as exc:  # DistBackendError is one; gloo's timeouts are others
        raise RuntimeError(
            f"A collective with the other processes failed ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}). Every "
            "process of the job must call fit/evaluate/train_on_batch together; one "
            "that stopped, failed or called it alone makes the others wait until "
            f"{TIMEOUT_ENV} ({timeout:g} s) passes. Fix: "
            "call these methods on every process (predict runs on each alone), and "
            "look for an earlier error in the other processes' output."
        ) from exc
