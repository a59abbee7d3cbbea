"""`mirrored`: tf.distribute on tf.keras 2.x, tf_keras and Keras 3 with TensorFlow.

One process: `MirroredStrategy` over the chosen GPUs (or virtual CPU devices); NCCL
all-reduce on Linux GPUs, hierarchical copy elsewhere, reduction to one device on CPU.
Several processes (`kerasmgpu launch`, srun, a TF_CONFIG): `MultiWorkerMirroredStrategy`,
made by `MirroredEngine.start` the moment TensorFlow is imported, with TensorFlow's own
cluster resolver where one fits the job (TF_CONFIG: `TFConfigClusterResolver`; srun on
several machines: `SlurmClusterResolver`) and the job's addresses otherwise.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ClassVar, Dict, Iterator, List, Optional, Sequence

from kerasmgpu import registry
from kerasmgpu._errors import InvalidClusterError, NotYetSupportedError, bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.adapters import tensorflow as tf_internals
from kerasmgpu.data.feeds import Feed
from kerasmgpu.engines.base import (
    Engine,
    Explanation,
    one_gpu_each,
    refuse_stateful,
    too_late,
)
from kerasmgpu.env import cluster
from kerasmgpu.env import devices as devices_module
from kerasmgpu.env.cluster import ClusterEnvironment
from kerasmgpu.env.devices import Device
from kerasmgpu.options import DEFAULT_OPTIONS, Options
from kerasmgpu.process import ending
from kerasmgpu.registry import FeedKind, Route

MULTI_WORKER_KERAS3 = (
    "Keras 3 with the TensorFlow backend cannot train under "
    "tf.distribute.MultiWorkerMirroredStrategy (keras-team/keras#20585: fit() fails with "
    "'Attempt to convert a value (PerReplica...)'). Allowed on several processes: tf_keras "
    "(TF_USE_LEGACY_KERAS=1 with tf-keras installed), tf.keras <= 2.15, or Keras 3 on "
    "JAX (KERAS_BACKEND=jax) or PyTorch (KERAS_BACKEND=torch). Fix: switch to one of those "
    "lines for multi-process runs, or train in one process on all local GPUs."
)


def _split_per_replica(tf: Any, dataset: Any, local_replicas: int) -> Any:
    """A worker's rows of each step become `local_replicas` per-replica batches."""
    if local_replicas == 1:
        return dataset

    def split(*element: Any) -> Any:
        def pieces(t: Any) -> Any:
            shape = tf.shape(t)
            return tf.reshape(t, tf.concat([[local_replicas, shape[0] // local_replicas],
                                            shape[1:]], 0))

        structure = element if len(element) > 1 else element[0]
        return tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(pieces, structure))

    return dataset.flat_map(split)


def _refuse_stateful(adapter: Adapter, model: Any) -> None:
    """Under MirroredStrategy a stateful RNN's batch-sized state does not fit a replica's
    slice (Keras 3 + TF: a graph execution error at the first step; tf_keras cannot copy
    it)."""
    refuse_stateful(
        adapter, model, "the mirrored route (TensorFlow)",
        "layers without stateful=True here: TensorFlow's replicas cannot share one "
        "batch-sized state",
        "train it with Keras 3 on JAX (KERAS_BACKEND=jax), which trains a stateful RNN "
        "as one device does, or with stateful=False (or on one device)")


def _tf_resolver(tf: Any, job: ClusterEnvironment) -> Any:
    """TensorFlow's view of the job: its own resolvers where they apply."""
    resolvers = tf.distribute.cluster_resolver
    if job.tf_resolver == "tf_config":
        if job.tf_workers() is not None:
            return resolvers.TFConfigClusterResolver()
    elif job.tf_resolver == "slurm" and job.multi_node():
        most = max(cluster.tasks_per_node(job.env["SLURM_STEP_TASKS_PER_NODE"]))
        # GPUs are srun's business (--gpus-per-task); the resolver's own GPU split is
        # turned off, and these counts only satisfy its bookkeeping.
        return resolvers.SlurmClusterResolver(
            port_base=job.main_port + 2, gpus_per_node=most, gpus_per_task=1,
            auto_set_gpu=False)
    workers = job.tf_workers()
    if workers is None:
        raise InvalidClusterError(
            f"Invalid cluster for TensorFlow: {job.describe()}. TensorFlow needs "
            "every process's address, which this launcher does not give. Allowed: one "
            "machine, srun, a TF_CONFIG naming every worker, or `kerasmgpu launch "
            "--worker-hosts`. Fix: set TF_CONFIG on every process, or start the job with "
            "srun or `kerasmgpu launch`."
        )
    return resolvers.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": workers}), task_type="worker",
        task_id=job.global_rank(), rpc_layer="grpc")


class MirroredEngine(Engine):
    route = Route.MIRRORED
    engine_name = "tf.distribute.MirroredStrategy"
    reports_all_reduce_class = True  # TensorFlow reports e.g. CollectiveAllReduce
    feed_kind = FeedKind.TF  # TensorFlow's strategies consume datasets
    device_lister = staticmethod(devices_module.tf_devices)
    # The micro-batches are fed as a Python sequence, which several TF workers cannot
    # share out (`distribute_feed`); not tested there.
    accumulates_in_processes = False
    # A layer's assigned variable takes the replicas' values combined by its aggregation.
    combines_assigned_variables = True

    # A worker's MultiWorkerMirroredStrategy, made by `start` the moment TensorFlow was
    # imported (or why it could not be), for the engine built later in that process.
    _worker_strategy: ClassVar[Any] = None
    _worker_error: ClassVar[Optional[BaseException]] = None

    @classmethod
    def start(cls, job: ClusterEnvironment) -> None:
        """The worker's MultiWorkerMirroredStrategy, the moment TensorFlow is imported
        ("Collective ops must be configured at program startup")."""
        try:
            import tensorflow as tf

            gpus = tf.config.list_physical_devices("GPU")
            if len(gpus) > 1 and one_gpu_each(job):
                tf.config.set_visible_devices(gpus[job.local_rank() % len(gpus)], "GPU")
            cls._worker_strategy = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=_tf_resolver(tf, job))
        except Exception as exc:  # reported by parallelize(), never at import
            cls._worker_error = exc
        ending.framework_started()

    @classmethod
    def worker_strategy(cls) -> Any:
        """The worker's MultiWorkerMirroredStrategy (created when TF was imported)."""
        if cls._worker_strategy is not None:
            return cls._worker_strategy
        if isinstance(cls._worker_error, InvalidClusterError):
            raise cls._worker_error
        if cls._worker_error is not None:
            raise too_late("TensorFlow", cls._worker_error) from cls._worker_error
        raise too_late("TensorFlow", "no strategy was created at import")

    @classmethod
    def explain(cls, gpus: int, multi_process: bool, platform: str) -> Explanation:
        if multi_process:
            return Explanation(
                "tf.distribute.MultiWorkerMirroredStrategy",
                "CollectiveAllReduce across processes",
                "one process per device group: TensorFlow's collective ops all-reduce "
                "gradients between processes - NCCL between GPUs, a ring over gRPC between "
                "CPUs.")
        if gpus >= 2 and platform.startswith("linux"):
            return Explanation(
                cls.engine_name, "NCCL (NcclAllReduce)",
                "MirroredStrategy's default for several GPUs on Linux: NCCL sums the "
                "gradients GPU to GPU (NVLink or PCIe), without going through the CPU.")
        if gpus >= 2:
            return Explanation(
                cls.engine_name, "hierarchical copy (HierarchicalCopyAllReduce)",
                "NCCL exists only on Linux, so MirroredStrategy sums gradients by copying "
                "them between GPUs in a tree.")
        return Explanation(
            cls.engine_name, "reduction on the CPU",
            "CPU devices have no NCCL: gradients are summed in host memory (a CPU "
            "collective or ReductionToOneDevice, as the TensorFlow version picks).")

    def __init__(self, adapter: Adapter, devices: Sequence[Device], *,
                 job: ClusterEnvironment) -> None:
        super().__init__(adapter, devices, job=job)

        self.multi_worker = job.multi_process()
        if self.multi_worker:
            if not registry.active().entry_or_raise().starts_at_import:
                # The registry's fact: no MultiWorkerMirroredStrategy is made at import
                # for this line (Keras 3 on TensorFlow).
                raise NotYetSupportedError(MULTI_WORKER_KERAS3)
            self.strategy = self.worker_strategy()
        else:
            # Each strategy gets its own collective key range: a second one of another
            # size in this process would otherwise join the first one's groups.
            self.strategy = tf_internals.new_mirrored_strategy([d.name for d in self.devices])
        self._any_process: Dict[int, Any] = {}

    @property
    def replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync)

    @contextlib.contextmanager
    def scope(self) -> Iterator[Any]:
        # The devices' streams without tf.data's futile rewrite (and its log line): see
        # adapters/tensorflow.py, plain_device_streams.
        with self.strategy.scope() as strategy, tf_internals.plain_device_streams():
            yield strategy

    def owns(self, model: Any) -> bool:
        return self.adapter.distribution_strategy_of(model) is self.strategy

    def owns_optimizer(self, optimizer: Any) -> bool:
        return self.adapter.optimizer_strategy(optimizer) is self.strategy

    def equalize(self, replica: Any) -> None:
        self.adapter.equalize_replica_state(replica, self.strategy)

    def any_process(self, flag: bool) -> bool:
        return self.any_processes([flag])[0]

    def any_processes(self, flags: Sequence[bool]) -> List[bool]:
        if not self.multi_worker or not flags:
            return list(flags)
        import tensorflow as tf

        # One all-reduce for all the flags, traced once for each number of flags (a
        # call's start agrees on a fixed number: a fit's, an evaluate's...).
        if len(flags) not in self._any_process:
            # The flags travel in a variable of this process: a tensor passed to
            # `strategy.run` inside a tf.function fails under MultiWorkerMirroredStrategy
            # ("destinations can not be empty"), and a new function per call retraces.
            mine = tf.Variable(tf.zeros([len(flags)]), trainable=False)

            def add() -> Any:
                context = tf.distribute.get_replica_context()
                return context.all_reduce(tf.distribute.ReduceOp.SUM, mine.read_value())

            total = tf.function(lambda: self.strategy.run(add))
            self._any_process[len(flags)] = (mine, total)
        mine, total = self._any_process[len(flags)]
        mine.assign([float(flag) for flag in flags])
        result = self.strategy.experimental_local_results(total())[0]
        return [float(value) > 0 for value in result.numpy()]

    def broadcast_arrays(self, arrays: List[Any]) -> List[Any]:
        if not self.multi_worker:
            return list(arrays)
        import tensorflow as tf

        values = [tf.constant(a) for a in arrays]
        # One all-reduce per dtype: TF packs a list into one buffer of a single type
        # (an optimizer's int64 iterations beside its float slots would not concatenate).
        groups: dict = {}
        for index, value in enumerate(values):
            groups.setdefault(value.dtype, []).append(index)

        def rank0_only() -> Any:
            # A sum to which only the first replica of rank 0 adds anything.
            context = tf.distribute.get_replica_context()
            first = context.replica_id_in_sync_group == 0
            mine = [tf.where(first, v, tf.zeros_like(v)) for v in values]
            return [context.all_reduce(tf.distribute.ReduceOp.SUM, [mine[i] for i in group])
                    for group in groups.values()]

        # In a tf.function: run eagerly, the strategy warns that it is slow.
        totals = tf.function(lambda: self.strategy.run(rank0_only))()
        out: List[Any] = [None] * len(values)
        for group, reduced in zip(groups.values(), totals):
            for index, total in zip(group, reduced):
                out[index] = self.strategy.experimental_local_results(total)[0].numpy()
        return out

    def step_gradients(self, compute: Callable[..., List[Any]],
                       parts: Sequence[Sequence[Any]]) -> List[Any]:
        # The step all-reduces the replicas' gradients by a sum: inside a replica
        # Keras divides a mean loss by the replica count, so the sum is one device's.
        return self._on_replicas(compute, parts, gather=False)

    def replica_outputs(self, compute: Callable[..., List[Any]],
                        parts: Sequence[Sequence[Any]]) -> List[Any]:
        return self._on_replicas(compute, parts, gather=True)

    def _on_replicas(self, compute: Callable[..., List[Any]], parts: Sequence[Sequence[Any]],
                     gather: bool) -> List[Any]:
        """One `strategy.run` in a tf.function, as Keras runs a step: each replica takes
        its own part (by its id in the job, from the parts stacked) and the results are
        all-reduced (or all-gathered) in float64, on every worker alike. The tf.function
        is kept on `compute` itself (it lives as long as `compute` does): traced once per
        shape and strategy, not once a call."""
        import numpy as np
        import tensorflow as tf

        held = getattr(compute, "_kerasmgpu_traced", None)
        function = held[1] if held is not None and held[0] is self.strategy else None
        if function is None:
            def run(*stacked: Any) -> Any:
                def replica() -> Any:
                    context = tf.distribute.get_replica_context()
                    mine = [tf.gather(leaf, context.replica_id_in_sync_group)
                            for leaf in stacked]
                    out = [tf.cast(value, tf.float64) for value in compute(*mine)]
                    if gather:
                        return [context.all_gather(value, axis=0) for value in out]
                    return context.all_reduce(tf.distribute.ReduceOp.SUM, out)

                return self.strategy.run(replica)

            function = tf.function(run)
            compute._kerasmgpu_traced = (self.strategy, function)  # type: ignore[attr-defined]
        stacked = [tf.constant(np.stack([np.asarray(part[i]) for part in parts]))
                   for i in range(len(parts[0]))]
        with self.scope():
            results = function(*stacked)
        return [self.strategy.experimental_local_results(value)[0].numpy()
                for value in results]

    def parallelize(self, model: Any, options: Options = DEFAULT_OPTIONS) -> Any:
        theirs = self.adapter.distribution_strategy_of(model)
        if theirs is not None and theirs is not self.strategy:
            raise bad_value(
                "model", f"a model built under your own tf.distribute."
                f"{type(theirs).__name__} (its variables belong to that strategy's "
                "devices)", "a model built outside any tf.distribute strategy scope, or in "
                "`kerasmgpu.scope()`", "build and compile the model without "
                "`strategy.scope()` and pass it to parallelize(), which places it on the "
                "devices itself", raw=True)
        self.refuse_compiled(model)
        _refuse_stateful(self.adapter, model)
        return super().parallelize(model, options)

    def refuse_compiled(self, model: Any) -> None:
        """Compile settings this route cannot train with, refused before any step."""
        if getattr(model, "jit_compile", False) is True and any(
                d.kind == "cpu" for d in self.devices):
            raise bad_value(
                "jit_compile", True, "False (or \"auto\") on CPU devices: XLA compiles "
                "the step for one device, and a MirroredStrategy replica's variables on "
                "the others cannot be reached from it (plain MirroredStrategy fails too: "
                "'Trying to access resource ... located in device CPU:1 from device CPU:0')",
                "compile with jit_compile=False, or train on GPUs")
        if not self.adapter.keras3:
            return
        steps = int(getattr(model, "steps_per_execution", 1) or 1)
        if steps > 1:
            raise bad_value(
                "steps_per_execution", steps, "1 with Keras 3 on TensorFlow under "
                "parallelize() (Keras 3's multi-step function under a MirroredStrategy "
                "fails: 'You must feed a value for placeholder tensor ... "
                "multi_step_on_iterator'); larger values: JAX, tf_keras, tf.keras 2.15",
                "compile with steps_per_execution=1, or train on JAX (KERAS_BACKEND=jax)")
        for optimizer in self.adapter.optimizers_of(model):
            every = getattr(optimizer, "ema_overwrite_frequency", None)
            if getattr(optimizer, "use_ema", False) and every:
                raise bad_value(
                    "optimizer", f"{type(optimizer).__name__}(use_ema=True, "
                    f"ema_overwrite_frequency={every}) with Keras 3 on TensorFlow",
                    "use_ema=True without ema_overwrite_frequency here (the overwrite is a "
                    "merge_call inside a cond, which MirroredStrategy cannot run: plain "
                    "Keras fails mid-fit)", "leave ema_overwrite_frequency out and call "
                    "`optimizer.finalize_variable_values(model.trainable_variables)` "
                    "where you want the averages (fit does at its end)")

    def prepare_replica(self, replica: Any) -> None:
        # Keras 3 reads a batch through an iterator of its own before fit/evaluate
        # under a strategy; one device does not (a reshuffle would be drawn by it).
        self.adapter.build_without_peeking(replica)
        # Each replica's step runs in a thread of its own on the same layers.
        self.adapter.losses_per_replica(replica)

    def prepare_compiled(self, replica: Any) -> None:
        self.refuse_compiled(replica)  # a compile of the parallel model
        # Keras 3 clips a replica's own gradient; one device clips the batch's.
        for optimizer in self.adapter.optimizers_of(replica):
            self.adapter.reduce_gradients_first(optimizer)
        # accumulate_steps > 1: the optimizer applies at every k-th call (Keras 3 on TF).
        self.adapter.accumulate_by_calls(replica)

    def worker_callbacks(self, callbacks: List[Any]) -> List[Any]:
        # tf.keras's own ModelCheckpoint/BackupAndRestore already write on the chief
        # only, and every worker must take part in their (collective) saves.
        return callbacks

    def distribute_feed(self, feed: Feed) -> Feed:
        """Several workers: each feeds its own rows through distribute_datasets_from_function.

        The feed already holds only this worker's rows of every padded global batch
        (`Planner`); tf.data's auto-sharding and re-batching must not touch them again.
        """
        if not self.multi_worker:
            return feed
        import tensorflow as tf

        if feed.steps is None:
            raise ValueError(
                "Invalid input for several workers: the number of batches is unknown. "
                "Allowed: arrays, a tf.data.Dataset of known size, or a generator with "
                "`steps_per_epoch`. Fix: pass steps_per_epoch= (and validation_steps=)."
            )
        dataset = feed.data
        if feed.per_epoch_iterators and isinstance(dataset, tf.data.Dataset):
            # Told the steps, tf.keras reads a distributed dataset through one iterator
            # across epochs: it must not end (a user's reshuffles there are drawn by
            # one iterator, not one per epoch as in one process).
            dataset = dataset.repeat()
        if not isinstance(dataset, tf.data.Dataset):
            raise ValueError(
                "Invalid input for several workers on TensorFlow: a Python "
                "PyDataset/Sequence. Allowed: arrays, a tf.data.Dataset or a generator. "
                "Fix: wrap it with tf.data.Dataset.from_generator."
            )
        per_worker = _split_per_replica(tf, dataset, self.planner.replicas_per_process)
        distributed_data = self.strategy.distribute_datasets_from_function(
            lambda _context: per_worker
        )
        return Feed(distributed_data, steps=feed.steps, needs_steps=True)

    def step_iterator(self, dataset: Any) -> Any:
        # In the scope, as Keras distributes the feed it reads (one process: a feed in
        # parts is not made for several).
        with self.scope():
            return iter(self.strategy.experimental_distribute_dataset(dataset))

    def describe(self) -> Dict[str, str]:
        ops = tf_internals.all_reduce_name(self.strategy)
        return {
            "route": self.route.value,
            "engine": "tf.distribute." + type(self.strategy).__name__,
            "replicas": str(self.replicas),
            "devices": ", ".join(d.name for d in self.devices),
            "all_reduce": ops,
            "step": "each replica computes the gradients of its share of the batch; they are "
            "all-reduced before every update",
        }
