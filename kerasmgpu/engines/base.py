"""The surface every route has, so that the public API never branches on the engine.

A route owns an engine (a tf.distribute strategy, a keras.distribution layout, a torch
process group) built for a fixed set of devices, and knows:

* `list_devices()` / `available_devices()` - what its backend shows / it could run on;
* `replicas` - how many copies of the model train in step;
* `scope()` - the context that models and optimizers must be built in;
* `parallelize(model)` - a model that trains on all of them;
* `describe()` - the engine, all-reduce and a training step in words (for `doctor` and
  `demo`);
* `broadcast(value)` - rank 0's integer on every process (one process: the value);
* `any_process(flag)` - whether the flag is set on any process (one process: the flag);
  `any_processes(flags)` - the same for several flags, in one collective where it can;
* `shuffle_seed()` - the seed `fit(shuffle=True)` shuffles with, the same everywhere;
* `owns_optimizer(optimizer)` - whether an optimizer was made in its scope;

and says what it can do in class-level flags (`syncs_batchnorm`, `accumulates`, ...),
which `kerasmgpu.api`'s checks, training, doctor, demo and bench read instead of
comparing routes.
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, ContextManager, Dict, List, Optional, Sequence

import numpy as np

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.batching import Planner
from kerasmgpu.data.feeds import Feed
from kerasmgpu.env import devices as devices_module
from kerasmgpu.env.cluster import ClusterEnvironment
from kerasmgpu.env.devices import Device
from kerasmgpu.env.versions import KERAS3_ACTIVITY_LOSS_IS_A_MEAN
from kerasmgpu.options import DEFAULT_OPTIONS, Options
from kerasmgpu.registry import FeedKind, Route


def one_gpu_each(job: ClusterEnvironment) -> bool:
    """Several processes per machine started by another launcher: one GPU each, by local
    rank (what torchrun, srun and JAX's own cluster detection assume). `kerasmgpu
    launch` hands out GPUs itself (`--gpus-per-proc`)."""
    return not job.assigns_devices and job.local_world_size() > 1


def refuse_stateful(adapter: Adapter, model: Any, on: str, allowed: str, fix: str) -> None:
    """Refuse a model with stateful RNN layers before anything is copied or trained: their
    state lives in variables of the fixed batch size, and a replica runs a slice of the
    batch, which that shape does not fit. `on`, `allowed`, `fix`: the route's words."""
    stateful = [layer for layer in adapter.layers_of(model)[1:]
                if getattr(layer, "stateful", False) is True and hasattr(layer, "reset_states")]
    if stateful:
        names = ", ".join(f"{layer.name!r} ({type(layer).__name__})" for layer in stateful)
        raise bad_value("model", f"stateful RNN layers {names} on {on}", allowed, fix,
                        raw=True)


def too_late(engine: str, detail: Any) -> RuntimeError:
    return RuntimeError(
        f"Invalid import order: {engine} started before kerasmgpu could set up the "
        f"multi-process engine ({detail}). Allowed: `import kerasmgpu` before "
        "tensorflow, jax, keras or tf_keras in a script run by several processes "
        "(kerasmgpu launch, torchrun, mpirun, srun). Fix: move `import kerasmgpu` to the "
        "top of the script."
    )


@dataclass(frozen=True)
class Explanation:
    """How an engine would train here, in words, before anything starts (`doctor`)."""

    engine: str  # what spreads the model, e.g. "tf.distribute.MirroredStrategy"
    all_reduce: Optional[str]  # how gradients meet (None: nothing to all-reduce)
    why: str


class Engine(abc.ABC):
    route: ClassVar[Route]
    # The framework's name for what this route drives, and whether the all-reduce it
    # reports once running (`describe()`) is a class name, best read beside our words.
    engine_name: ClassVar[str]
    reports_all_reduce_class: ClassVar[bool] = False
    # Whether saving the model reads this process's memory only (no collective), so
    # that processes other than the chief can skip it.
    saves_locally: ClassVar[bool] = False
    # Whether a global batch that does not divide by the replicas is padded to a multiple
    # and the padding masked (kerasmgpu's own steps), or sliced unpadded as Keras 2.3's
    # multi_gpu_model does (the last replica takes the remainder).
    pads_remainders: ClassVar[bool] = True
    # How fit() input reaches it: a tf.data pipeline (TensorFlow's strategies) or Python
    # batches (Keras's PyDataset / Sequence).
    feed_kind: ClassVar[FeedKind] = FeedKind.PYTHON

    # --- What it can do (read instead of comparing routes) ---
    # parallelize(sync_batchnorm=True): moments over the global batch, padding left out.
    syncs_batchnorm: ClassVar[bool] = True
    # parallelize(accumulate_steps=k > 1), in one process / in a job of several.
    accumulates: ClassVar[bool] = True
    accumulates_in_processes: ClassVar[bool] = True
    # Trains on several devices only as several processes, one each (`kerasmgpu launch`):
    # demo, bench and doctor say so instead of running replicas in one process.
    needs_launcher: ClassVar[bool] = False
    # Each process's metrics hold its own share of the rows, summed when read.
    metrics_per_process: ClassVar[bool] = False
    # How a step meets the batch, for the self-check (`training.verify`): Keras's own
    # graph slices it (nothing padded, Keras 2.3), or one program runs over the whole
    # global batch (JAX); else each replica runs its own rows.
    slices_in_graph: ClassVar[bool] = False
    one_program: ClassVar[bool] = False
    # A variable a layer assigns in its step takes the replicas' values combined by its
    # aggregation (TensorFlow's mirrored variables); else each replica keeps its own.
    combines_assigned_variables: ClassVar[bool] = False

    def __init__(self, adapter: Adapter, devices: Sequence[Device], *,
                 job: ClusterEnvironment) -> None:
        self.adapter = adapter
        self.devices = tuple(devices)
        # The job this process belongs to, detected once by the caller (`kerasmgpu.api`):
        # engines read the cluster from it, never from environment variables.
        self.job = job

    @classmethod  # noqa: B027 - optional hook
    def start(cls, job: ClusterEnvironment) -> None:
        """In a process of `job`, start the framework's multi-process
        runtime right after the framework is imported (`engines.startup`, where the
        registry entry starts at import). Nothing by default."""

    @classmethod
    @abc.abstractmethod
    def explain(cls, gpus: int, multi_process: bool, platform: str) -> Explanation:
        """How it would train on `gpus` GPUs (0: CPU devices), in one process or
        several, on `platform` (sys.platform): pure, nothing started."""

    @staticmethod
    def device_lister(n: Optional[int]) -> List[Device]:
        """Its backend's device lister (`env.devices`, set by each engine): given the
        virtual-device count asked for, the GPUs, else the (virtual) CPU devices."""
        raise NotImplementedError

    @classmethod
    def list_devices(cls) -> List[Device]:
        """The devices its backend shows this process: GPUs if any, else (virtual) CPU
        devices (imports the framework)."""
        return cls.device_lister(devices_module.requested())

    @classmethod
    def available_devices(cls, adapter: Adapter, job: ClusterEnvironment
                          ) -> List[Device]:
        """Devices this route could place replicas on: its backend's, as listed there."""
        return cls.list_devices()

    @property
    @abc.abstractmethod
    def replicas(self) -> int:
        """How many replicas the engine reports (its own count, not ours)."""

    @abc.abstractmethod
    def scope(self) -> ContextManager[Any]:
        """Build models and optimizers in here to place them on every replica."""

    @abc.abstractmethod
    def owns(self, model: Any) -> bool:
        """Whether `model` was built in this route's scope (then no copy is needed)."""

    @classmethod
    def single_device_passthrough(cls, adapter: Adapter, job: ClusterEnvironment
                                  ) -> bool:
        """Whether one local device means "return the model unchanged".

        Not in a process of a job of several: its one device is one of several replicas.
        """
        return not job.multi_process()

    @functools.cached_property
    def planner(self) -> Planner:
        """How batches are planned: over every replica, then this process's share.

        Built once: the step overrides read it on every `*_on_batch` call, and neither
        the replica count nor the process layout changes during a route's life.
        """
        return Planner(self.replicas, self.job.global_rank(),
                       self.job.world_size())

    def distribute_feed(self, feed: Feed) -> Feed:
        """Hand a feed to the engine (multi-worker TF needs a distributed dataset)."""
        return feed

    def step_iterator(self, dataset: Any) -> Any:
        """An iterator over a tf.data pipeline of a feed in parts (`Feed.tail`), as
        Keras reads the feed's own under this engine."""
        return iter(dataset)

    def prepare_replica(self, replica: Any) -> None:  # noqa: B027 - optional hook
        """Called once a replica is attached (torch: broadcast the initial weights)."""

    def prepare_compiled(self, replica: Any) -> None:  # noqa: B027 - optional hook
        """Called after every compile of a replica (torch: all-reduce the gradients)."""

    def epoch_end(self, replica: Any) -> None:  # noqa: B027 - optional hook
        """Called at every epoch end (torch: re-broadcast non-trainable state)."""

    def equalize(self, replica: Any) -> None:  # noqa: B027 - optional hook
        """Make every replica's non-trainable state equal before it is read (mirrored:
        sync-on-read BatchNorm statistics)."""

    def broadcast(self, value: int) -> int:
        """Rank 0's `value` (an integer below 2**31) on every process."""
        return int(self.broadcast_arrays([np.asarray(value, np.int32)])[0])

    def broadcast_arrays(self, arrays: List[Any]) -> List[Any]:
        """Rank 0's NumPy arrays on every process (one process: the arrays)."""
        return list(arrays)

    def any_process(self, flag: bool) -> bool:
        """Whether `flag` is set on any process of the job (one collective); every
        process must call it together."""
        return flag

    def any_processes(self, flags: Sequence[bool]) -> List[bool]:
        """`any_process` of each flag (one collective where the engine can)."""
        return [self.any_process(flag) for flag in flags]

    def step_gradients(self, compute: Callable[..., List[Any]],
                       parts: Sequence[Sequence[Any]]) -> List[Any]:
        """`compute(*parts[r])` - a loss and its gradients, as backend tensors - run by
        every replica r of the job where it trains (its device, its own copy of the
        variables, its replica context), reduced as this engine's step reduces the
        replicas' gradients: the parallel model's figures for the whole batch, as NumPy,
        the same on every process (`parallelize(verify=True)`). Every process must call
        it together. Routes whose step is one program over the batch have none."""
        raise NotImplementedError(f"the {self.route} route checks the whole batch at once")

    def replica_outputs(self, compute: Callable[..., List[Any]],
                        parts: Sequence[Sequence[Any]]) -> List[Any]:
        """`compute(*parts[r])` run as in `step_gradients`, its results concatenated over
        the replicas in replica order (each replica's outputs for its rows)."""
        raise NotImplementedError(f"the {self.route} route checks the whole batch at once")

    def owns_optimizer(self, optimizer: Any) -> bool:
        """Whether `optimizer` was made in this route's scope (then a model trained
        here can use it as it is)."""
        return False

    def shuffle_seed(self) -> int:
        """The seed of `fit(shuffle=True)`: drawn from NumPy's global generator, so
        `keras.utils.set_random_seed` (which seeds it) makes shuffles reproducible, and
        rank 0's draw on every process, so that all shuffle alike and each trains its
        own share of the same global batches - every sample once per epoch."""
        return self.broadcast(int(np.random.randint(0, 2**31 - 1)))

    def callback_flags(self, callbacks: List[Any]) -> List[bool]:
        """What the user's callbacks of the fit/evaluate about to run ask of the engine,
        as this process sees them (torch: whether one reads the per-batch logs, which
        then cost a collective per step); the job agrees on them
        (`use_callback_flags`), in the collective that starts every call."""
        return []

    def use_callback_flags(self, flags: List[bool]) -> None:  # noqa: B027 - optional hook
        """The flags of `callback_flags`, as the job agreed on them."""

    def worker_callbacks(self, callbacks: List[Any]) -> List[Any]:
        """Only the chief writes: other workers keep no ModelCheckpoint, and restore
        from - but never write - a BackupAndRestore backup."""
        if not self.job.multi_process() or self.job.is_chief():
            return callbacks
        kept = []
        for callback in callbacks:
            kind = type(callback).__name__
            if kind == "ModelCheckpoint":
                continue
            if kind == "BackupAndRestore":
                kept.append(_restore_only(self.adapter, callback))
                continue
            kept.append(callback)
        return kept

    def parallelize(self, model: Any, options: Options = DEFAULT_OPTIONS) -> Any:
        from kerasmgpu.training import model as parallel_model

        if not self.one_program and not self.slices_in_graph:
            self.refuse_summed_terms(model)
        if self.owns(model):
            return parallel_model.adopt(self, self.adapter, model, options)
        if self.job.multi_process() and model.weights:
            # Each process built its own template, with its own random initial weights
            # unless the script seeded them alike: all start from rank 0's.
            model.set_weights(self.broadcast_arrays(model.get_weights()))
        return parallel_model.parallel_copy(self, self.adapter, model, options)

    def refuse_summed_terms(self, model: Any) -> None:
        """Each replica runs its own step: a loss term that sums over the rows a replica
        holds would be averaged over the replicas, 1/N of one device's (Keras 3 before
        3.15's activity regularizers); refused before anything is built."""
        problem = self.adapter.strategy_loss_problem(model)
        if problem is not None:
            raise bad_value(
                "model", problem, f"activity regularizers on Keras 3 from "
                f"{KERAS3_ACTIVITY_LOSS_IS_A_MEAN} on this route: before it Keras sums their "
                "loss over the rows, and each replica sums over its own rows, which are "
                "averaged (plain MirroredStrategy too: History 37.7 against 326.7 on one "
                "device)", f"upgrade Keras to >= {KERAS3_ACTIVITY_LOSS_IS_A_MEAN}, train "
                "with Keras 3 on JAX (KERAS_BACKEND=jax: one program over the global "
                "batch), or drop activity_regularizer", raw=True)

    def describe(self) -> Dict[str, str]:
        return {"route": self.route.value, "replicas": str(self.replicas)}


def _restore_only(adapter: Adapter, backup: Any) -> Any:
    """A non-chief worker's BackupAndRestore: restores at train begin, writes nothing."""
    base = adapter.keras.callbacks.Callback

    class RestoreOnly(base):  # type: ignore[misc, valid-type]
        # The backup it restores (kerasmgpu.training.resume follows it on every worker).
        restores = backup

        def set_model(self, model: Any) -> None:
            super().set_model(model)
            backup.set_model(model)

        def set_params(self, params: Any) -> None:
            super().set_params(params)
            backup.set_params(params)

        def on_train_begin(self, logs: Any = None) -> None:
            backup.on_train_begin(logs)

    return RestoreOnly()
