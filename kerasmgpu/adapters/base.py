"""The surface every Keras-line adapter has, and what all lines share.

An adapter is the only object in kerasmgpu that reaches into Keras: its namespace, the
few tensor ops the step hooks need, and - in the per-line subclasses - every private
name (`_attr`, `keras.src.*`, `tensorflow.python.*`). Everything above it (feeds, the
training hooks, the engines) calls the named methods here, so a Keras release that
moves an internal breaks one adapter with a clear `InternalsChanged`, never the
numbers.

Each subclass states the releases it was verified on (`VERIFIED`, from
`kerasmgpu.env.versions`); `kerasmgpu.adapters.load` refuses a release outside them
unless the user opts in.
"""

from __future__ import annotations

import contextlib
import weakref
from types import ModuleType
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

from packaging.version import Version

from kerasmgpu._errors import bad_type, bad_value
from kerasmgpu.adapters.copying import ModelCopying
from kerasmgpu.adapters.python_dataset import batches_class
from kerasmgpu.adapters.step_ops import StepOps
from kerasmgpu.env.versions import KerasLine

COMPILE_KEYS = (
    "optimizer",
    "loss",
    "loss_weights",
    "metrics",
    "weighted_metrics",
    "run_eagerly",
    "steps_per_execution",
    "jit_compile",
)


class InternalsChanged(RuntimeError):
    """A Keras internal kerasmgpu relies on is missing or has another shape."""


class Held:
    """A change token for an immutable value (a JAX array): equal to another token only
    while both hold the very same object. Holds it weakly, so a replaced value is freed
    (a dead reference means it was replaced: the token then differs)."""

    __slots__ = ("ref",)

    def __init__(self, value: Any) -> None:
        self.ref = weakref.ref(value)

    def __eq__(self, other: object) -> bool:
        mine = self.ref()
        return mine is not None and isinstance(other, Held) and mine is other.ref()

    def __hash__(self) -> int:
        return id(self.ref())


# Reads one change token per variable (see `Adapter.state_reader`).
StateReader = Callable[[], List[Any]]


def class_weight_error(class_weight: Any, allowed: str, fix: str) -> ValueError:
    """A `class_weight` the active Keras refuses too (ValueError, as Keras raises)."""
    return bad_value("class_weight", class_weight, allowed, fix)


def following_save(save: Callable[..., Any], on_save: Callable[[Callable[[str], None]], None],
                   allow: Callable[[], bool],
                   redirect: Callable[[str, Callable[[], None]], None]) -> Callable[..., Any]:
    """`save` (a BackupAndRestore's own save method) replaced: nothing while `allow()` is
    False, else `on_save(write_into)`, where `write_into(directory)` writes that backup's
    Keras files into `directory` - `redirect(directory, run)` points Keras's paths there
    around `run()`, Keras's own save with the arguments it was called with. The original
    stays reachable as `__wrapped__`, so a later fit replaces the wrapper, not stacks it."""

    def saved(*args: Any, **kwargs: Any) -> None:
        if not allow():
            return
        on_save(lambda directory: redirect(directory, lambda: save(*args, **kwargs)))

    saved.__wrapped__ = save  # type: ignore[attr-defined]
    return saved


class Adapter(ModelCopying, StepOps):
    """One Keras line as kerasmgpu sees it. Subclasses: keras3 (one per backend:
    keras3_tensorflow, keras3_jax, keras3_torch), tfkeras2, keras23."""

    # [min, below): the releases of this line the tox matrix verifies (set per instance:
    # it depends on the line and backend).
    VERIFIED: Tuple[Version, Version]
    LABEL: str = "Keras"
    DIST: str = "keras"

    def __init__(self, line: KerasLine, keras: ModuleType, backend: str,
                 version: Optional[Version]) -> None:
        self.line = line
        self.keras = keras
        self.backend = backend
        self.version = version

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.LABEL} {self.version} backend={self.backend}>"

    # Adapters are compared and hashed by what they adapt, so that caches keyed on them
    # (one PackedLoss-style class per line, say) are shared between instances.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Adapter) and (self.line, self.backend) == (other.line,
                                                                          other.backend)

    def __hash__(self) -> int:
        return hash((self.line, self.backend))

    @property
    def keras3(self) -> bool:
        return self.line is KerasLine.KERAS_3

    @property
    def stateless_steps(self) -> bool:
        """Steps take `(state, data)` (Keras 3 on JAX) instead of `(data)`."""
        return False

    @property
    def weights_follow_output_rank(self) -> bool:
        """Expand the padding weights to each output's rank (see Keras3)."""
        return False

    @property
    def weights_in_loss_values(self) -> bool:
        """Each compiled loss weighs its own values (`steps.loss_values`, shaped like
        them) instead of the compiled loss's sample weight (shaped for the output)."""
        return False

    @property
    def output_losses_weigh_steps(self) -> bool:
        """One device's per-output loss trackers weigh every step alike: Keras weighs
        them by the static batch size, and one device's step has none (Keras 3 on TF:
        the feed's last batch may be short, so the batch dimension is unknown)."""
        return False

    @property
    def counts_per_replica(self) -> bool:
        """Each replica reduces its own rows (tf.distribute, torch DDP), so a count a loss
        divides by is the replica's, not the global batch's."""
        return False

    @property
    def whole_batch_on_batch(self) -> bool:
        """The `*_on_batch` calls hand every replica the whole batch (Keras 3 on TF: the
        step runs in `strategy.run` on the undistributed arguments): each replica then
        takes its share in the step (`replica_share`), and the results are read across
        replicas (`flat_metric_results`)."""
        return False

    def replica_share(self, structures: Any) -> Any:
        """The rows of this replica in every array of `structures` (a tuple), whose first
        axis is a batch padded to a multiple of the replicas; outside a replica as is."""
        return structures

    def flat_metric_results(self, model: Any, logs: Dict[str, Any]) -> Any:
        """`logs` in the order Keras returns `*_on_batch` results without `return_dict`."""
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def total(self, x: Any) -> Any:
        raise NotImplementedError

    def replica_mean(self, x: Any) -> Any:
        """The mean of `x` over all replicas (identity where one program sees them all)."""
        return x

    def count_ratio(self, a: Any, b: Any) -> Any:
        """`a / b`, 0 where `b` is 0 (a batch with nothing valid)."""
        raise NotImplementedError

    @property
    def identity_tokens(self) -> bool:
        """`state_reader` tokens are taken without running anything on a device (the
        identity of a JAX array, a torch tensor's version), so reading them for the
        replica too costs nothing (`kerasmgpu.training.sync.after_training`)."""
        return False

    def fail(self, what: str, detail: str) -> InternalsChanged:
        """The error for an internal that moved: names the release and the fix."""
        low, below = self.VERIFIED
        return InternalsChanged(
            f"kerasmgpu cannot train on {self.LABEL} {self.version}: {what} ({detail}). "
            f"kerasmgpu is verified on {self.LABEL} {low} to below {below}, and refuses to "
            "guess rather than give different numbers. Fix: install a verified release, "
            f'e.g. `pip install "{self.pin_hint()}"`, or upgrade kerasmgpu.'
        )

    def pin_hint(self) -> str:
        low, below = self.VERIFIED
        return f"{self.DIST}>={low},<{below}"

    # --- Keras objects ------------------------------------------------------------------

    @property
    def Model(self) -> type:
        model_class: type = self.keras.Model
        return model_class

    def is_model(self, obj: Any) -> bool:
        return isinstance(obj, self.keras.Model)

    def is_compiled(self, model: Any) -> bool:
        raise NotImplementedError

    def compile_args(self, model: Any) -> Dict[str, Any]:
        """The arguments `model.compile()` was called with, as live objects."""
        raise NotImplementedError

    def pack_data(self, x: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """Data as Keras hands it to a step: `x`, `(x,)`, `(x, y)` or `(x, y, sw)`."""
        return self.keras.utils.pack_x_y_sample_weight(x, y, sample_weight)

    def python_dataset(self, source: Any, workers: int = 1, use_multiprocessing: bool = False,
                       max_queue_size: int = 10) -> Any:
        """`source` (a length, batches by index, maybe `on_epoch_end`) as the
        `keras.utils.Sequence` fit reads. The reader options are a Keras 3 PyDataset's
        (`Keras3Data`); the Keras 2 lines take theirs from fit's arguments."""
        return batches_class(self.keras.utils.Sequence)(source)

    # Whether a Python batch that needs no padding runs the engine's plain step - as
    # the user's data where the feed's batches may change structure
    # (`allow_changing_structure`), else with an empty packing (`bundle.unpadded`):
    # Keras 3 takes Python batches one at a time and kerasmgpu's step tells that
    # packing by its static shape. On the Keras 2 lines every batch carries its packing.
    even_batches_run_plain = False

    def lays_out_replicated(self, ours: Callable[[Any], bool],
                            replicated: Callable[[Any], bool]) -> bool:
        """Whether a fed batch whose rows do not divide over the devices can be laid out
        replicated - every device all rows, one program computing them once
        (`batching.BatchPlan.replicated`): Keras 3 on JAX. `ours` / `replicated`: whether
        a batch is kerasmgpu's / fed whole by every process of a job. Arranges it."""
        return False

    def steps_per_call(self, model: Any) -> int:
        """Steps one call of the model's step function runs (`steps_per_execution`)."""
        return int(getattr(model, "steps_per_execution", 1) or 1)

    def allow_changing_structure(self, dataset: Any, kind_of: Callable[[Any], Any],
                                 replicated: Callable[[Any], bool]) -> bool:
        """Whether the batches of `dataset`, a PyDataset of kerasmgpu's, may change
        structure from one batch to the next (a full batch as the user's data, a padded
        one as `(x, bundle)`), `kind_of(batch)` telling the kinds apart; arranged here
        where Keras needs it. `replicated(batch)`: whether every process of a job feeds
        that batch whole, to be laid out replicated. Asked only where `even_batches_run_plain`; False keeps one
        structure per feed (an empty packing on full batches): slower, never wrong."""
        return False

    def fresh_optimizer(self, optimizer: Any) -> Any:
        """A new optimizer with the same configuration, to be built inside a scope.

        An optimizer's variables belong to the device layout it was built under; Keras 3
        on JAX fails with "Received incompatible devices ... sgd/iteration" when one
        created outside a `DataParallel` scope is reused, so replicas get a fresh one.
        """
        if optimizer is None:
            return None
        if isinstance(optimizer, str):
            return self.keras.optimizers.get(optimizer)
        try:
            return type(optimizer).from_config(optimizer.get_config())
        except Exception as exc:
            raise bad_type(
                "optimizer",
                optimizer,
                "an optimizer that round-trips through get_config()/from_config()",
                "build and compile the model inside `with kerasmgpu.scope():` (no copy is "
                "made then), or give your optimizer a get_config() that from_config() "
                "accepts",
            ) from exc

    def check_sample_weight_structure(self, y: Any, sample_weight: Any) -> None:
        """Refuse, as this Keras refuses on one device, sample weights given as arrays in
        a structure that is not the targets' (None: Keras takes any)."""

    def generator_replays(self) -> int:
        """How many of a Python generator's first batches every further iterator Keras
        makes of it reads again, before reading on (0: none, it reads on)."""
        return 0

    def fresh_metric(self, metric: Any) -> Any:
        """Metric objects hold state; a replica gets its own copy, strings stay strings."""
        if isinstance(metric, self.keras.metrics.Metric):
            return type(metric).from_config(metric.get_config())
        return metric

    def optimizer_variables(self, optimizer: Any) -> List[Any]:
        variables = getattr(optimizer, "variables", None)
        if callable(variables):  # tf.keras 2.x optimizers expose it as a method
            variables = variables()
        return list(variables or [])

    def learning_rate_variable(self, optimizer: Any) -> Any:
        """The optimizer's learning-rate variable when `optimizer_variables` leaves it out
        (tf.keras 2.x and tf_keras keep it apart), else None."""
        return None

    def own_accumulation(self, optimizer: Any) -> int:
        """The micro-batches per step of the optimizer's own gradient accumulation (1:
        none; only Keras 3 optimizers have it)."""
        return 1

    def strategy_loss_problem(self, model: Any) -> Optional[str]:
        """What of `model` a tf.distribute strategy of this release trains otherwise than
        one device, named for a refusal (None: nothing)."""
        return None

    def carry_own_accumulation(self, optimizer: Any) -> None:
        """Where Keras's own `gradient_accumulation_steps` cannot run under the engine
        (Keras 3 on TF), kerasmgpu carries it out with the same groups and weights; or
        the error. Elsewhere nothing."""

    def accumulation_problem(self) -> Optional[str]:
        """Why this release cannot accumulate gradients exactly (None: it can)."""
        return f"{self.LABEL} {self.version} optimizers do not accumulate gradients"

    def steps_per_epoch_accumulation_problem(self) -> Optional[str]:
        """Why `fit(steps_per_epoch=)` cannot accumulate exactly here (None: it can)."""
        return None

    def optimizer_accumulation_problem(self, optimizer: Any) -> Optional[str]:
        """Why `optimizer` cannot accumulate exactly with this release (None: it can)."""
        return None

    def accumulate_gradients(self, optimizer: Any, steps: int) -> bool:
        """Make `optimizer` (not built yet) average its gradients over `steps` calls
        before it applies them; False where this Keras cannot."""
        return False

    def accumulate_by_calls(self, model: Any) -> None:
        """Where kerasmgpu accumulates between the calls of `model`'s train function
        (Keras 3 on TensorFlow), set that up; elsewhere nothing."""

    def finish_group(self, model: Any, factor: float) -> None:
        """Apply the incomplete group of a fit that stops inside it: the gradient
        accumulated so far, times `factor` (the mean over the rows it has), as one
        optimizer step. Only lines that accumulate are asked."""
        raise NotImplementedError(f"{self.LABEL} does not accumulate gradients")

    def mask_batch_statistics(self, model: Any, row_mask: Callable[[], Any],
                              every: bool = True) -> bool:
        """Make every BatchNormalization layer of `model` (`every`; else those built with
        `synchronized=True`) take its batch statistics over the whole global batch,
        leaving out the rows that `row_mask()` marks 0 (padding), while it trains; False
        where this Keras cannot."""
        return False

    def optimizer_state(self, optimizer: Any) -> List[Any]:
        """Every variable of the optimizer's state: iterations, slots, learning rate."""
        variables = self.optimizer_variables(optimizer)
        rate = self.learning_rate_variable(optimizer)
        if rate is not None and not any(rate is v for v in variables):
            variables.append(rate)
        return variables

    def build_optimizer(self, optimizer: Any, variables: List[Any]) -> None:
        """Create the optimizer's slots for `variables` (no-op once built)."""
        build = getattr(optimizer, "build", None)
        if build is not None:
            build(variables)

    # --- class_weight: Keras's own rule, per Keras line ---------------------------------

    def class_weigher(self, class_weight: Any, kind: str
                      ) -> Optional[Callable[[Any, Any], Any]]:
        """`weigh(y, sample_weight) -> sample weights` for one batch (or all rows) of an
        input of `kind` ("arrays", "pydataset", "generator", "batch"), as this line's
        `fit` / `train_on_batch` turn `class_weight` into sample weights - raising what
        Keras raises, before anything runs where Keras checks up front. None when Keras
        ignores the `class_weight` given."""
        raise NotImplementedError

    def class_weight_map_fn(self, class_weight: Any) -> Optional[Callable[..., Any]]:
        """The `tf.data` map function this line's `fit` applies to a dataset's
        `(x, y[, sample_weight])` for `class_weight` (Keras's own), or None."""
        raise NotImplementedError

    def model_inputs(self, model: Any) -> Optional[List[Tuple[str, Tuple[Optional[int], ...]]]]:
        """(name, shape) of each declared model input, or None when unknown."""
        inputs = None
        try:
            inputs = model.inputs
        except (AttributeError, ValueError):
            return None
        if not inputs:
            return None
        out = []
        for tensor in inputs:
            shape = getattr(tensor, "shape", None)
            if shape is None:
                return None
            dims = tuple(None if d is None else int(d) for d in tuple(shape))
            name = str(getattr(tensor, "name", "") or "input").split(":")[0]
            out.append((name, dims))
        return out

    # --- the training state, template <-> replica (kerasmgpu.training.sync) ---------------

    def state_reader(self, variables: List[Any]) -> StateReader:
        """A function giving one token per variable, equal between two reads exactly when
        the variable was not changed in between - by any path (assign, set_weights,
        load_weights, an optimizer step, a restore) - and cheap enough for every call."""
        raise NotImplementedError

    def read_values(self, variables: List[Any]) -> List[Any]:
        """The variables' values as NumPy arrays."""
        return [v.numpy() for v in variables]

    def write_values(self, variables: List[Any], values: List[Any]) -> None:
        for variable, value in zip(variables, values):
            variable.assign(value)

    # --- BackupAndRestore (kerasmgpu.training.resume) ----------------------------------

    def follow_backup(self, backup: Any, on_save: Callable[[Callable[[str], None]], None],
                      allow: Callable[[], bool]) -> bool:
        """Make `backup` (a BackupAndRestore) call `on_save(write_into)` in place of each
        backup it would write, and nothing while `allow()` is False: `write_into(directory)`
        writes Keras's files of that backup into `directory` (kerasmgpu.process.backups
        makes them one generation). False where this line's BackupAndRestore is not one
        kerasmgpu can follow (it then resumes as Keras does)."""
        return False

    def unfollow_backup(self, backup: Any) -> None:
        """Undo `follow_backup` and `restore_from` (after the fit: the callback is the
        user's again)."""

    def restore_from(self, backup: Any, directory: Optional[str]) -> None:
        """Make `backup`'s restore at train begin read Keras's files from `directory` (a
        generation); None: from where Keras reads them itself."""

    # True where Keras's fit itself continues a restored epoch at the next step (tf.keras
    # 2.x): kerasmgpu then skips the batches already trained; False where it restarts
    # the epoch at step 0 (Keras 3): kerasmgpu replays them and restores the state.
    backup_resumes_mid_epoch = False
    # True where every process of a job takes part in writing a backup (tf.keras under
    # MultiWorkerMirroredStrategy): no process can write one alone at a signal.
    backups_are_collective = False

    def set_backup_position(self, backup: Any, epoch: int, batch: int) -> None:
        """Tell `backup` that training stands after `batch` of `epoch`, as it would if
        it had trained there itself (where it next saves, what epoch it records)."""

    def save_backup(self, backup: Any, epoch: int, batch: int) -> bool:
        """Write `backup`'s backup now, after `batch` of `epoch`; False where this
        line cannot."""
        return False

    def place_replicated(self, variables: List[Any], layouts: List[Any],
                         values: List[Any]) -> Optional[Callable[[], None]]:
        """Lay each variable out in place with its layout, holding its value (Keras 3 on
        JAX), and return what puts them back as they were; None where this line cannot
        (the engine then trains a copy)."""
        return None

    def assign_locally(self, variables: List[Any]) -> None:
        """Variables laid out over several processes take a value one process assigns
        alone without a collective (Keras 3 on JAX); elsewhere nothing to do."""

    def after_symbolic_build(self, model: Any, then: Callable[[], None]) -> bool:
        """Run `then` each time a call (fit, evaluate, *_on_batch) has built what its
        step carries - the compile metrics, the optimizer - and before the step's
        layouts are read (Keras 3 on JAX); False where this line has no such moment."""
        return False

    # --- parallelize(verify=True) (kerasmgpu.training.verify) ----------------------------

    def global_batch(self, data: Any) -> Any:
        """`data` laid out over the devices as a one-program step lays out its batch
        (inside the engine's scope; Keras 3 on JAX), else as it is."""
        return data

    def loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                           training: bool, class_weight: Any = None
                           ) -> Optional[Tuple[Any, List[Any]]]:
        """The compiled loss of one batch and its gradients per trainable variable, as
        numpy, computed without assigning anything (no optimizer or moving statistic
        changes; a line whose compiled loss updates its loss trackers restores them in
        `kept_metrics`). `class_weight`: Keras 2.3 only (elsewhere it is in the sample
        weights already). None: not on this line."""
        return None

    def replica_loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                                   training: bool) -> List[Any]:
        """`[loss, *gradients]` of one replica's rows as backend tensors, computed inside
        that replica (a tf.distribute replica context, a torch process) as its step
        computes them, nothing assigned but loss trackers (`kept_metrics`)."""
        raise NotImplementedError(f"the self-check's replica side on {self.LABEL}")

    def numpy(self, value: Any) -> Any:
        """A backend tensor as a NumPy array."""
        import numpy as np

        return np.asarray(value)

    def kept_metrics(self, model: Any) -> ContextManager[Any]:
        """Metric state the check's compiled loss updates, put back when it leaves."""
        return contextlib.nullcontext()

    def outputs_of(self, model: Any, x: Any) -> Optional[List[Any]]:
        """The model's outputs on `x` in inference mode, as NumPy, where calling the
        model does not compute them (Keras 2.3's graph); None: call it."""
        return None

    def layer_outputs(self, model: Any, x: Any) -> Optional[Tuple[List[Any], List[Any]]]:
        """(layers, their outputs on `x` in inference mode) where a probe model cannot
        compute them (Keras 2.3's graph); None: a probe model of Keras's does."""
        return None

    def replica_layer_outputs(self, parallel: Any, x: Any, replicas: int) -> List[Any]:
        """`layer_outputs` of the template's layers as the parallel model runs them on
        `x` (Keras 2.3)."""
        raise NotImplementedError(f"the layer-by-layer probe on {self.LABEL}")

    def layers_of(self, model: Any) -> List[Any]:
        """The model and every layer inside it, each before the layers it holds."""
        out = [model]
        for layer in getattr(model, "layers", None) or []:
            out.extend(self.layers_of(layer))
        return out

    def compile_token(self, model: Any) -> Tuple[Any, ...]:
        """Objects that `compile()` replaces: a new compile gives other objects."""
        return (getattr(model, "optimizer", None),)

    def optimizer_strategy(self, optimizer: Any) -> Any:
        """The tf.distribute strategy an optimizer was created under (None off TF)."""
        return None

    # --- hooks the training layer installs -----------------------------------------------

    def install_loss_hook(self, model: Any, hook: Callable[[Any, Any, Any], Any],
                          values: Optional[Callable[[Any, Any, Any], Any]] = None) -> None:
        """Make Keras's compiled loss call `hook(y_true, y_pred, sample_weight)` for the
        sample weight it uses (the hook returns it, or a new one); where the adapter
        `weights_in_loss_values`, also `values(values, mask, reduction)` for the values
        of each loss it holds (`steps.loss_values`)."""
        raise NotImplementedError

    def install_metrics_hook(self, model: Any, on_metric: Callable[[Any], None]) -> None:
        """Call `on_metric(metric)` for every compiled metric before Keras updates it."""
        raise NotImplementedError

    def loss_trackers(self, model: Any) -> List[Any]:
        """The loss `Mean`s Keras updates each step: the model's total first, then the
        per-output ones."""
        raise NotImplementedError

    def has_call_time_losses(self, model: Any) -> bool:
        """Whether the last call added losses computed from its inputs (add_loss)."""
        raise NotImplementedError

    def check_internals(self, model: Any) -> None:
        """Raise `InternalsChanged` if an internal the hooks need is not where expected."""

    # --- engines ------------------------------------------------------------------------

    def distribution_strategy_of(self, model: Any) -> Any:
        return None

    def equalize_replica_state(self, model: Any, strategy: Any) -> None:
        """Make every replica's copy of non-trainable state equal (BatchNorm moments)."""

    def optimizers_of(self, model: Any) -> List[Any]:
        """`model.optimizer` and the optimizers a model's own step keeps as attributes
        (a GAN's `d_optimizer`, `g_optimizer`), each once."""
        found: List[Any] = []
        kind = getattr(self.keras.optimizers, "Optimizer", None)
        candidates = [getattr(model, "optimizer", None), *vars(model).values()]
        for value in candidates:
            is_optimizer = value is not None and (
                isinstance(value, kind) if isinstance(kind, type) else False)
            if is_optimizer and all(value is not seen for seen in found):
                found.append(value)
        return found

    def build_without_peeking(self, model: Any) -> None:
        """Make `fit`/`evaluate` build `model` without reading a batch of the data
        first where one device reads none (nothing to do where Keras does not)."""

    def losses_per_replica(self, model: Any) -> None:
        """Keep what `model`'s layers add in a call (`add_loss`, activity regularizers)
        apart per replica where replicas call the same layer objects at once (nothing
        to do where Keras already does)."""

    def reduce_gradients_first(self, optimizer: Any) -> None:
        """Make `optimizer` clip and transform the all-reduced gradient of a step
        rather than each replica's (nothing to do where Keras already does)."""
