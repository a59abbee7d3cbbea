"""`keras_distribution`: Keras 3 on JAX, through `keras.distribution.DataParallel`.

The global batch is one array sharded over the devices and the step is one SPMD
program, so the loss is computed over the whole (padded) batch at once; several
processes use `jax.distributed`, started by `KerasDistributionEngine.start` the moment JAX
is imported (gloo CPU collectives; coordinator, process count and id, bounded start-up,
heartbeat and shutdown), before the first JAX computation.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, ClassVar, ContextManager, Dict, Iterator, List, Optional, Sequence

from kerasmgpu.adapters import Adapter
from kerasmgpu.engines.base import Engine, Explanation, one_gpu_each, too_late
from kerasmgpu.env import devices as devices_module
from kerasmgpu.env.cluster import ClusterEnvironment
from kerasmgpu.env.devices import Device
from kerasmgpu.options import DEFAULT_OPTIONS, Options
from kerasmgpu.process import ending
from kerasmgpu.registry import Route


def _same_seed_everywhere(adapter: Adapter, job: ClusterEnvironment) -> None:
    """Variables created under a multi-process layout must start equal everywhere.

    `keras.distribution.initialize()` agrees on a seed across processes unless one was
    set; we start JAX ourselves (before Keras is imported), so we do the same here.
    """
    if adapter.random_seed() is None:  # type: ignore[attr-defined]
        adapter.keras.utils.set_random_seed(job.shared_seed() % (2**31))


@contextlib.contextmanager
def _no_distribution(keras: Any) -> Iterator[None]:
    active = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(active)


def _save_outside_the_layout(keras: Any, callback: Any) -> None:
    """Only the chief saves; Keras's saving creates throw-away variables (an optimizer
    to compare attributes against), which under a multi-process layout every process
    would have to create together. Saving runs on local arrays instead."""
    for name in ("on_epoch_end", "on_train_batch_end", "on_train_end"):
        hook = getattr(callback, name)

        def local(*args: Any, _hook: Any = hook, **kwargs: Any) -> Any:
            with _no_distribution(keras):
                return _hook(*args, **kwargs)

        setattr(callback, name, local)


def _jax_arguments(jax: Any, job: ClusterEnvironment) -> dict:
    timeout = int(job.collective_timeout())
    port = job.jax_coordinator().rsplit(":", 1)[1]
    wanted = {
        "coordinator_address": job.jax_coordinator(),
        "num_processes": job.world_size(),
        "process_id": job.global_rank(),
        "local_device_ids": [job.local_rank()] if one_gpu_each(job) else None,
        # Everything is given: JAX must not replace it with what it guesses itself.
        "cluster_detection_method": "deactivate",
        # Rank 0's coordinator listens on loopback unless other machines take part
        # (JAX's default is every interface).
        "coordinator_bind_address": (f"{job.bind_host()}:{port}"
                                     if not job.multi_node() else f"[::]:{port}"),
        "initialization_timeout": timeout,
        "heartbeat_timeout_seconds": min(timeout, 100),
        "shutdown_timeout_seconds": timeout,
    }
    accepted = inspect.signature(jax.distributed.initialize).parameters
    # Older releases lack some of these; what they lack keeps JAX's default.
    return {k: v for k, v in wanted.items() if k in accepted}


class KerasDistributionEngine(Engine):
    route = Route.KERAS_DISTRIBUTION
    device_lister = staticmethod(devices_module.jax_devices)
    one_program = True  # one program over the global batch, sharded by the layout
    engine_name = "keras.distribution.DataParallel (jax.sharding)"
    # DataParallel replicates every variable: each process reads a whole copy on its own
    # devices, so a model built in scope is saved by the chief alone, as a template is
    # (every process wrote the same file before).
    saves_locally = True
    # Why `jax.distributed` did not start at import, for the engine built later.
    _start_error: ClassVar[Optional[BaseException]] = None

    @classmethod
    def start(cls, job: ClusterEnvironment) -> None:
        try:
            import jax

            # CPU devices of different processes only reach each other through gloo.
            try:
                jax.config.update("jax_cpu_collectives_implementation", "gloo")
            except (AttributeError, ValueError):  # older/newer jax: default is fine
                pass
            jax.distributed.initialize(**_jax_arguments(jax, job))
        except Exception as exc:
            cls._start_error = exc
        ending.framework_started()

    @classmethod
    def ensure_started(cls, job: ClusterEnvironment) -> None:
        """Raise when `jax.distributed` did not start for `job`."""
        if cls._start_error is not None:
            raise too_late("JAX", cls._start_error) from cls._start_error
        import jax

        if jax.process_count() != job.world_size():
            raise too_late("JAX", f"jax.process_count() is {jax.process_count()}")

    @classmethod
    def explain(cls, gpus: int, multi_process: bool, platform: str) -> Explanation:
        return Explanation(
            cls.engine_name,
            "XLA collectives" + (" (NCCL between GPUs)" if gpus else " (host memory)"),
            "Keras 3 on JAX shards each batch over a device mesh and XLA compiles the "
            "gradient all-reduce into the training step"
            + (" - across processes too." if multi_process else "."))

    def __init__(self, adapter: Adapter, devices: Sequence[Device], *,
                 job: ClusterEnvironment) -> None:
        super().__init__(adapter, devices, job=job)
        import jax

        keras = adapter.keras
        if job.multi_process():
            # Every process's devices, in process order: process p feeds the p-th
            # contiguous slice of each padded global batch (see kerasmgpu.batching.shard).
            self.ensure_started(job)
            self.jax_devices = list(jax.devices())
            _same_seed_everywhere(adapter, job)
        else:
            gpus = [d for d in jax.devices() if d.platform == "gpu"]
            pool = gpus if gpus else jax.devices("cpu")
            self.jax_devices = [pool[d.index] for d in self.devices]
        self.distribution = keras.distribution.DataParallel(devices=self.jax_devices)
        if hasattr(self.distribution, "auto_shard_dataset"):
            # kerasmgpu shards the data itself; Keras must not shard it again (the
            # attribute, and Keras's sharding of datasets, exist from Keras 3.6 on).
            self.distribution.auto_shard_dataset = False

    @property
    def replicas(self) -> int:
        # One data-parallel axis over exactly these devices (we built the mesh).
        return len(self.jax_devices)

    def scope(self) -> ContextManager[Any]:
        scope: ContextManager[Any] = self.distribution.scope()
        return scope

    def owns(self, model: Any) -> bool:
        return self._placed_here(getattr(model, "weights", []))

    def parallelize(self, model: Any, options: Options = DEFAULT_OPTIONS) -> Any:
        """The user's own model trains, its variables laid out in place: no copy.

        A model built outside the scope has its variables on one device; every Keras
        variable a train step carries - the model's (seed generators' states included),
        its metrics', its optimizer's - is put on this route's devices with the layout
        `DataParallel` gives a variable created in its scope (replicated), so the
        trainer's jitted steps (which take their output layouts from the variables)
        run as for a model built in `kerasmgpu.scope()`. What a layer holds besides
        its variables - a Python attribute read in `call`, an adapted layer's derived
        tensors, a layer it holds - is the user's own object, right by construction.
        A copy made in this scope (the base engine's) where the user's model cannot
        be the parallel model:
        * in a job of several processes: the template is each process's own, changed
          by one process alone where the script does so (a checkpoint loaded on the
          chief: rank 0's template is the truth, `training.sync`), and a variable laid
          out over every process's devices is one global array, which every process
          must assign together;
        * a model already trained in place on other devices (a second parallelize() of
          one template, with another `gpus=`): it keeps its layout, and the second
          parallel model is a copy, its template the user's model."""
        from kerasmgpu.training import model as parallel_model
        from kerasmgpu.training.state import is_parallel

        if not self.owns(model) and (self.job.multi_process() or is_parallel(model)):
            return super().parallelize(model, options)
        undo: Optional[Callable[[], None]] = None
        if self.job.multi_process():  # built in scope: one global array per variable
            self.adapter.assign_locally(self._carried(model))
        if not self.owns(model):
            variables = self._carried(model)
            values: List[Any] = [v.value for v in variables]
            layouts = [self.distribution.get_variable_layout(v) for v in variables]
            undo = self.adapter.place_replicated(variables, layouts, values)
            if undo is None:
                # A Keras whose variables are not what adapters.keras3_jax read.
                return super().parallelize(model, options)
        # A step traced before (a fit on one device) knows neither the mesh nor the
        # hooked steps: made anew at the next call, as Keras's own compile() does.
        for name in ("train_function", "test_function", "predict_function"):
            if getattr(model, name, None) is not None:
                setattr(model, name, None)
        try:
            return parallel_model.adopt(self, self.adapter, model, options)
        except BaseException:
            # Your model as it was: on its one device, not laid out for a parallel
            # model that was never made.
            if undo is not None:
                undo()
            raise

    def prepare_compiled(self, replica: Any) -> None:
        # A call builds its compile metrics lazily, after parallelize(): a metric object
        # the user made (`metrics=[keras.metrics.AUC()]`) has its variables on one
        # device, and the jitted step, which takes its layouts from the variables,
        # failed at the first fit ("Received incompatible devices for jitted
        # computation"). Laid out as they join, before the step reads the layouts.
        self.adapter.after_symbolic_build(replica, lambda: self._lay_out_joined(replica))

    def _lay_out_joined(self, model: Any) -> None:
        joined = [v for v in self._carried(model) if not self._placed_here([v])]
        if not joined:
            return
        layouts = [self.distribution.get_variable_layout(v) for v in joined]
        if self.adapter.place_replicated(joined, layouts, [v.value for v in joined]) is None:
            raise self.adapter.fail("variables cannot be laid out in place",
                                    "the variables a call's step carries")
        if self.job.multi_process():
            self.adapter.assign_locally(joined)

    def epoch_end(self, replica: Any) -> None:
        # The optimizer's variables are made at the first step: laid out over every
        # process's devices too where the model was built in scope (see parallelize).
        if self.job.multi_process() and self.owns(replica):
            self.adapter.assign_locally(self._carried(replica))

    @staticmethod
    def _carried(model: Any) -> List[Any]:
        """Every variable of `model`'s train step, each once."""
        optimizer = getattr(model, "optimizer", None)
        found: Dict[int, Any] = {}
        for variable in [*model.variables, *getattr(model, "metrics_variables", []),
                         *(getattr(optimizer, "variables", None) or [])]:
            found.setdefault(id(variable), variable)
        return list(found.values())

    def owns_optimizer(self, optimizer: Any) -> bool:
        return self._placed_here(self.adapter.optimizer_variables(optimizer))

    def _placed_here(self, variables: List[Any]) -> bool:
        """Whether every variable lies on exactly this route's devices."""
        wanted = set(self.jax_devices)
        if not variables:
            return False
        for variable in variables:
            sharding = getattr(getattr(variable, "value", None), "sharding", None)
            if sharding is None or set(sharding.device_set) != wanted:
                return False
        return True

    def any_process(self, flag: bool) -> bool:
        if not self.job.multi_process():
            return flag
        import numpy as np
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))

    def any_processes(self, flags: Sequence[bool]) -> List[bool]:
        if not self.job.multi_process():
            return list(flags)
        import numpy as np
        from jax.experimental import multihost_utils

        every = multihost_utils.process_allgather(np.asarray(flags, np.int32).reshape(1, -1))
        return [bool(v) for v in np.any(np.asarray(every).reshape(-1, len(flags)), axis=0)]

    def broadcast_arrays(self, arrays: List[Any]) -> List[Any]:
        if not self.job.multi_process():
            return list(arrays)
        import numpy as np
        from jax.experimental import multihost_utils

        return [np.asarray(a) for a in multihost_utils.broadcast_one_to_all(list(arrays))]

    def worker_callbacks(self, callbacks: List[Any]) -> List[Any]:
        callbacks = super().worker_callbacks(callbacks)
        if self.job.multi_process():
            for callback in callbacks:
                if type(callback).__name__ in ("ModelCheckpoint", "BackupAndRestore"):
                    _save_outside_the_layout(self.adapter.keras, callback)
        return callbacks

    def describe(self) -> Dict[str, str]:
        return {
            "route": self.route.value,
            "engine": "keras.distribution.DataParallel (jax.sharding, XLA all-reduce)",
            "replicas": str(self.replicas),
            "devices": ", ".join(str(d) for d in self.jax_devices),
            "all_reduce": "XLA collective (NCCL on GPUs)",
            "step": "each device computes the gradients of its shard of the batch; XLA "
            "all-reduces them before every update",
        }
