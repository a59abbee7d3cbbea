"""Keras 3 on JAX: what differs from TensorFlow and torch (one program, stateless steps).

Verified on the releases of `env.versions.KERAS3_MIN` (3.3) to below
`KERAS3_VERIFIED_BELOW` with JAX (the tox matrix runs 3.3, 3.8 and 3.15); the internals
every backend shares are in `keras3`. What is read or wrapped here:

* `layer.add_loss` (public), wrapped on every layer's instance: a stateless step leaves
  no `_losses` behind, so a loss added in `call` is noticed there
  (`has_call_time_losses`).
* `keras3_losses.owned_in_scope` (Keras's `Layer` methods, once a process): every JAX
  step is a stateless scope that collects losses; see that module.
* `BatchNormalization._moments`: a batch whose mask keeps no row leaves the moving
  statistics as they are (`_batch_moments`); the one program sees the global batch.
* verify=True: the JAX trainer's `compute_loss_and_updates`; nothing it returns is
  assigned. The one-device side (no distribution active) reads each replicated
  variable's piece on one device (`jax.Array.addressable_data`, public).
* `place_replicated` (the user's own model trained in place, no copy): each variable's
  `_layout` (the layout its `_direct_assign` distributes every later assign with) and
  `_direct_assign`, as the JAX `Variable._initialize` of each release sets them when a
  distribution is active; the layout converted by `TensorLayout.backend_layout` (3.10+)
  or `keras.src.backend.jax.distribution_lib._to_jax_layout` (3.3 - 3.8); verify=True's
  parallel side lays its batch out with the same conversion (`global_batch`). Read in the
  sources of 3.3, 3.8, 3.10 and 3.15; where they are not what was read, the answer is
  False and the engine trains a copy made in its scope, as before.
* `Trainer._symbolic_build` (3.3 - 3.15), wrapped on the instance
  (`after_symbolic_build`): every call builds there what its step carries and was not
  built yet - the compile metrics, the optimizer - before it reads the variables'
  layouts for the jitted step (`_record_training_state_sharding_spec`, 3.3 - 3.14;
  `make_train_function`, 3.15). A metric object the user made before parallelize()
  (`keras.metrics.AUC()`) has its variables on one device then. Read in the sources of
  3.3, 3.8 and 3.15.
* `assign_locally` (a model built in `kerasmgpu.scope()` in a job of several
  processes): each variable's `_direct_assign` and `_layout` again, wrapped on the
  instance so that a host value assigned by one process alone (a checkpoint loaded on
  the chief) becomes the global array from this process's value, with no collective.
  Read in the sources of 3.3, 3.8, 3.10 and 3.15 (`Variable._direct_assign`
  distributes through `distribute_variable` / `distribute_tensor`, a `jax.device_put`
  that checks across processes that they all pass one value).
* change tokens (`state_reader`): `variable._value`, the JAX array the public `value`
  returns (outside an autocast or stateless scope, where it is a copy), replaced by
  every assign.
* `JAXEpochIterator._get_distributed_iterator` (Keras 3.8+): how a Python feed's batches
  reach the devices (`allow_changing_structure`). kerasmgpu hands a batch that needs no
  padding to the step as the user's data, `(x, y)`, and only a padded one as
  `(x, bundle)` (`kerasmgpu.data.bundle`): a full batch then sends what a one-device fit
  sends, no packing beside it. Keras 3.8+ lays an epoch's batches out on the devices
  with the layouts of its *first* batch (one `distribution.get_data_layout` per leaf,
  then every later batch is mapped against them), so a padded batch after full ones
  fails there ("... a subtree of different type"). The wrapped method makes each run of
  batches of one kind its own layout pass, for kerasmgpu's own PyDatasets only (marked
  with `KIND_ATTR`); Keras 3.3 lays each batch out by itself (`_distribute_data(data)`
  with no layouts) and needs nothing. Read in the sources of Keras 3.3, 3.8 and 3.15
  (the same method in 3.8-3.15); where the method is not what was read, the answer is
  False and kerasmgpu keeps one structure per feed (an empty packing on full batches):
  slower, never wrong. The same runs lay a batch whose rows do not divide over the
  devices out replicated (`keras.distribution.TensorLayout` with no sharded axis, public,
  handed to the method in place of the distribution's own data layout): kerasmgpu feeds
  such a batch, in one process, only for a model whose loss has terms of the whole
  batch (`batching.BatchPlan.replicated`); `lays_out_replicated` says where it can.
  A generator or tf.data pipeline kerasmgpu pads reaches Keras as a generator or a
  dataset, which no attribute can mark: its batches are told by their packing (the
  data layer's tests, handed to `lays_out_replicated`), and a run of them whose rows do
  not divide is laid out replicated the same way - in a job, a batch every process
  feeds whole, as it marks itself (`bundle.is_replicated`); any other feed's first
  batch is handed back and the method runs as Keras's.
* `keras.src.backend.jax.trainer._distribute_data` (Keras 3.3 - 3.9, whose
  `distribute_data_input` splits every batch over the replicas whatever its layout):
  wrapped in the module, in one process, to lay such a batch out replicated itself
  (`jax.device_put` with the replicated layout's sharding); any batch whose rows divide
  goes to Keras's own function as before. Read in 3.3.3 and 3.8.0; where the function
  is not what was read, such a model's short batches are padded, with a warning.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable, Iterator, List, Optional, Tuple

from kerasmgpu.adapters.base import Held, StateReader
from kerasmgpu.adapters.keras3 import Keras3
from kerasmgpu.adapters.keras3_losses import owned_in_scope
from kerasmgpu.adapters.step_ops import HOOKED
from kerasmgpu.env.versions import KERAS3_JAX_DATA_AS_LAID_OUT


class Keras3Jax(Keras3):
    """Keras 3 on JAX: `keras.distribution.DataParallel` runs one program over every
    device, on the global batch, with stateless steps."""

    @property
    def stateless_steps(self) -> bool:
        return True

    @property
    def identity_tokens(self) -> bool:
        return True  # see state_reader

    def allow_changing_structure(self, dataset: Any, kind_of: Callable[[Any], Any],
                                 replicated: Callable[[Any], bool]) -> bool:
        return _allow_changing_structure(dataset, kind_of, replicated)

    def lays_out_replicated(self, ours: Callable[[Any], bool],
                            replicated: Callable[[Any], bool]) -> bool:
        # Arranges what it answers for, as allow_changing_structure does.
        # The per-kind runs (`_per_kind`) lay a run of batches whose rows do not divide
        # over the devices out replicated (3.10+: Keras lays a batch out as given).
        # Keras 3.3 - 3.9 split every batch over the replicas whatever its layout
        # (env/versions.py KERAS3_JAX_DATA_AS_LAID_OUT): there kerasmgpu lays such a
        # batch out itself, in the trainer's `_distribute_data` (`_lay_out_uneven`).
        if self.version is None:
            return False
        trainer = _trainer()
        epoch_iterator: Any = getattr(trainer, "JAXEpochIterator", None)
        method = getattr(epoch_iterator, "_get_distributed_iterator", None)
        if method is None:
            # Keras 3.3: `_distribute_data(data)` lays out every batch by itself.
            runs = self.version < KERAS3_JAX_DATA_AS_LAID_OUT
        else:
            runs = getattr(method, _PATCHED_ATTR, False) or list(
                inspect.signature(method).parameters) == ["self", "distribution"]
            if runs and not getattr(method, _PATCHED_ATTR, False):
                epoch_iterator._get_distributed_iterator = _per_kind(method)
        _OURS[:] = [ours, replicated]
        if not runs or self.version >= KERAS3_JAX_DATA_AS_LAID_OUT:
            return runs
        return _lay_out_uneven(trainer)

    def install_loss_hook(self, model: Any, hook: Callable[[Any, Any, Any], Any],
                          values: Optional[Callable[[Any, Any, Any], Any]] = None) -> None:
        owned_in_scope()  # before `_watch_add_loss` binds each layer's add_loss
        self._watch_add_loss(model)
        super().install_loss_hook(model, hook, values)

    def _watch_add_loss(self, model: Any) -> None:
        for layer in [model, *model._flatten_layers(include_self=False)]:
            original = getattr(layer, "add_loss", None)
            if original is None or layer.__dict__.get(HOOKED + "_add_loss"):
                continue

            def add_loss(loss: Any, _original: Any = original) -> Any:
                model.__dict__[HOOKED + "_added_loss"] = True
                return _original(loss)

            layer.__dict__["add_loss"] = add_loss
            layer.__dict__[HOOKED + "_add_loss"] = True

    def _batch_moments(self, layer: Any) -> Callable[[Any, Any], Any]:
        return self._idle_keeps_moving(layer)

    def state_reader(self, variables: List[Any]) -> StateReader:
        variables = self._backend_values(list(variables))
        # JAX arrays are immutable: an assign puts a new array in the variable.
        return lambda: [Held(v._value) for v in variables]

    def place_replicated(self, variables: List[Any], layouts: List[Any],
                         values: List[Any]) -> Optional[Callable[[], None]]:
        """Put each variable's value on its route's devices with its layout
        (`distribution.get_variable_layout`), and keep that layout for every later
        assign (set_weights, a callback's assign, the trainer's own state sync), as a
        variable created in the distribution's scope keeps it. Returns what puts every
        variable back as it was (its layout, its value on its device); None, changing
        nothing, where this Keras is not what was read (see the module doc). A failure
        part of the way (a device out of memory) puts back those laid out already."""
        if not all(hasattr(v, "_direct_assign") and hasattr(v, "_layout") for v in variables):
            return None
        try:
            backend = importlib.import_module("keras.src.backend.jax.distribution_lib")
        except ImportError:
            return None
        shardings = [_sharding(backend, layout) for layout in layouts]
        if any(sharding is None for sharding in shardings):
            return None
        before = [(v, v._layout, v.value) for v in variables]
        done: List[Tuple[Any, Any, Any]] = []

        def undo() -> None:
            for variable, layout, value in reversed(done):
                variable._layout = layout
                variable._direct_assign(value)  # with its own layout: as it was
            done.clear()

        try:
            for (variable, layout, value), sharding, new in zip(before, shardings, values):
                done.append((variable, layout, value))
                variable._layout = sharding
                # distribute_variable / distribute_tensor: a local array is put on the
                # mesh, equal values of several processes make one global array.
                variable._direct_assign(new)
        except BaseException:
            undo()
            raise
        return undo

    def after_symbolic_build(self, model: Any, then: Callable[[], None]) -> bool:
        original = getattr(model, "_symbolic_build", None)
        if not callable(original):
            return False
        if getattr(original, HOOKED, False):
            original.__dict__["then"] = then  # a recompile: the latest engine's
            return True

        def symbolic_build(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            symbolic_build.__dict__["then"]()
            return result

        symbolic_build.__dict__.update({HOOKED: True, "then": then})
        model.__dict__["_symbolic_build"] = symbolic_build
        return True

    def assign_locally(self, variables: List[Any]) -> None:
        """Variables laid out over several processes' devices take a value one process
        assigns alone (the chief loads a checkpoint, a callback on rank 0 sets a
        learning rate) as the global array built from this process's value on its own
        devices. Keras's own assign puts a host value on such a layout with
        `jax.device_put`, which first checks, collectively, that every process passes
        the same value: the others are not in that collective, and the job crashed
        (gloo: "collective mismatch") or could hang. The processes' values then differ
        until their next call together, which gives every process the chief's
        (`training.sync`), as for a template."""
        import jax
        import numpy as np

        try:
            backend = importlib.import_module("keras.src.backend.jax.distribution_lib")
        except ImportError:
            return
        for variable in variables:
            if getattr(variable, _LOCAL_ATTR, False) or not (
                    hasattr(variable, "_direct_assign") and hasattr(variable, "_layout")):
                continue
            own = variable._direct_assign

            def direct_assign(value: Any, variable: Any = variable, own: Any = own) -> None:
                layout = variable._layout
                sharding = None if layout is None else _sharding(backend, layout)
                if (sharding is None or sharding.is_fully_addressable or (
                        isinstance(value, jax.Array) and not value.is_fully_addressable)):
                    return own(value)  # one process's devices, or a global array already
                host = np.asarray(value)
                return own(jax.make_array_from_callback(host.shape, sharding,
                                                        lambda index: host[index]))

            variable._direct_assign = direct_assign
            setattr(variable, _LOCAL_ATTR, True)

    def numpy(self, value: Any) -> Any:
        if getattr(value, "is_fully_addressable", True) or value.is_fully_replicated:
            return super().numpy(value)
        # Rows on other processes' devices (verify's parallel side, laid out as the
        # step lays its batch out): every process gathers them, together.
        import numpy as np
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(value, tiled=True))

    def global_batch(self, data: Any) -> Any:
        # The step's layout of a batch (`distribution.get_data_layout`, public), one
        # global array from the whole batch every process holds (public JAX): each
        # device computes its rows with its own piece of every variable.
        distribution = self.keras.distribution.distribution()
        if distribution is None:
            return data
        backend = importlib.import_module("keras.src.backend.jax.distribution_lib")
        import jax
        import numpy as np

        split = _batch_split(distribution)

        def lay_out(leaf: Any) -> Any:
            array = np.asarray(leaf)
            layout = (_replicated_layout(distribution, array.shape)
                      if not _rows_divide(split, array) else
                      distribution.get_data_layout(array.shape))
            sharding = _sharding(backend, layout) if array.ndim else None
            if sharding is None:
                return leaf
            return jax.make_array_from_callback(array.shape, sharding,
                                                lambda index: array[index])

        return jax.tree_util.tree_map(lay_out, data)

    def loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                           training: bool, class_weight: Any = None
                           ) -> Optional[Tuple[Any, List[Any]]]:
        import jax
        import numpy as np

        # JAX's trainer computes the loss statelessly (`compute_loss_and_updates`,
        # public on Keras 3.0 - 3.15): the new states it returns are dropped, so the
        # check assigns nothing.
        # No distribution active: the one-device side of the check (the template), on
        # one device even where its variables are replicated over the mesh (the user's
        # model trained in place): each one's piece on this process's first device.
        one_device = self.keras.distribution.distribution() is None

        def values(variables: List[Any]) -> List[Any]:
            return [_on_one_device(v.value) if one_device else v.value for v in variables]

        owned_in_scope()  # the template's losses too (it may not have trained here)
        optimizer = getattr(model, "optimizer", None)
        grad = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
        (loss, _), grads = grad(
            values(model.trainable_variables), values(model.non_trainable_variables),
            values(model.metrics_variables), x, y, sample_weight, training=training,
            optimizer_variables=values(optimizer.variables) if optimizer is not None else [])
        return float(np.asarray(loss)), [np.asarray(g) for g in grads]


_LOCAL_ATTR = "_kerasmgpu_assigns_locally"


def _sharding(backend: Any, layout: Any) -> Any:
    """A Keras `TensorLayout` as JAX's sharding: `backend_layout` (3.10+), the backend's
    `_to_jax_layout` (3.3 - 3.8); None on a Keras that has neither."""
    if hasattr(layout, "backend_layout"):
        return layout.backend_layout
    convert = getattr(backend, "_to_jax_layout", None)
    return convert(layout) if convert is not None else None


def _on_one_device(value: Any) -> Any:
    sharding = getattr(value, "sharding", None)
    if sharding is None or len(sharding.device_set) < 2 or not value.is_fully_replicated:
        return value
    return value.addressable_data(0)


# --- a Python feed whose batches change structure (allow_changing_structure) ---------

# Set on a kerasmgpu PyDataset whose batches may change structure: the function that
# tells the kind of a batch (batches of one kind have one structure), and the one that
# tells a batch every process of a job feeds whole.
KIND_ATTR = "kerasmgpu_batch_kind"
_PATCHED_ATTR = "kerasmgpu_per_kind"

_END = object()
# The data layer's tests of a batch (`lays_out_replicated`): whether kerasmgpu fed it,
# whether every process of a job feeds it whole - how the runs tell a generator or
# tf.data pipeline of kerasmgpu's, which carries no KIND_ATTR, and its kinds of batch.
_OURS: List[Callable[[Any], bool]] = []


def _trainer() -> Optional[Any]:
    try:
        return importlib.import_module("keras.src.backend.jax.trainer")
    except ImportError:
        return None


def _allow_changing_structure(dataset: Any, kind_of: Callable[[Any], Any],
                              replicated: Callable[[Any], bool]) -> bool:
    """Whether the batches of `dataset` (a kerasmgpu PyDataset) may change structure
    from one batch to the next on Keras 3 with JAX; arranges it where needed."""
    trainer = _trainer()
    if trainer is None:
        return False
    epoch_iterator: Any = getattr(trainer, "JAXEpochIterator", None)
    method = getattr(epoch_iterator, "_get_distributed_iterator", None)
    if method is None:
        # Keras 3.3: `_distribute_data(data)` lays out every batch by itself.
        distribute = getattr(trainer, "_distribute_data", None)
        return distribute is not None and list(inspect.signature(distribute).parameters) == [
            "data"]
    if not getattr(method, _PATCHED_ATTR, False):
        if list(inspect.signature(method).parameters) != ["self", "distribution"]:
            return False
        epoch_iterator._get_distributed_iterator = _per_kind(method)
    try:
        setattr(dataset, KIND_ATTR, (kind_of, replicated))
    except (AttributeError, TypeError):  # a generator: Keras reads no `py_dataset` of it
        return False
    return True


def _chained(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    if first is not _END:
        yield first
    yield from rest


class _Source:
    """What Keras's `_get_distributed_iterator` reads of its epoch iterator: one run."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self.data_adapter = self
        self._batches = batches

    def get_jax_iterator(self) -> Iterator[Any]:
        return self._batches


def _batch_split(distribution: Any) -> int:
    """How many pieces the distribution splits a batch's rows into (one process), read
    once per feed, not per batch."""
    mesh = distribution.device_mesh
    axes = dict(zip(mesh.axis_names, mesh.shape))
    # The axis rows are sharded over, from the public data layout (Keras 3.3 has no
    # public `batch_dim_name`; 3.8 on do). The first axis is the same for every rank.
    return int(axes.get(distribution.get_data_layout((1,)).axes[0], 1))


def _rows_divide(split: int, leaf: Any) -> bool:
    """Whether `leaf`'s rows divide into `split` pieces (`_batch_split`)."""
    shape = getattr(leaf, "shape", None)
    return not shape or shape[0] % split == 0


def _replicated_layout(distribution: Any, shape: Tuple[int, ...]) -> Any:
    """Every device holds every row (public `keras.distribution.TensorLayout`)."""
    from keras.distribution import TensorLayout

    return TensorLayout([None] * len(shape), distribution.device_mesh)


_UNEVEN_ATTR = "kerasmgpu_lays_out_uneven"


def _lay_out_uneven(trainer: Any) -> bool:
    """Keras 3.3 - 3.9 (whose `distribute_data_input` splits a batch over the replicas
    whatever its layout): whether the trainer's `_distribute_data` lays a batch whose
    rows do not divide over the devices out replicated, in one process; arranges it.
    That module function is what the epoch iterators and the `*_on_batch` calls look up
    when they run: `_distribute_data(data)` in 3.3, `(data, layouts=None)` in 3.8 (read
    in 3.3.3 and 3.8.0); another signature: False, and the batch is padded (warned).
    Such a batch reaches it only from a kerasmgpu feed planned whole
    (`batching.BatchPlan.replicated`); on any other the wrapper hands Keras the batch
    as before (Keras itself fails on rows that do not divide)."""
    original = getattr(trainer, "_distribute_data", None)
    if original is None:
        return False
    if getattr(original, _UNEVEN_ATTR, False):
        return True
    if list(inspect.signature(original).parameters) not in (["data"], ["data", "layouts"]):
        return False
    import jax
    import keras

    backend = importlib.import_module("keras.src.backend.jax.distribution_lib")

    def replicated(distribution: Any, leaf: Any) -> Any:
        shape = tuple(getattr(leaf, "shape", ()))
        return jax.device_put(leaf, _sharding(backend, _replicated_layout(distribution, shape)))

    current = keras.distribution.distribution
    leaves_of = jax.tree_util.tree_leaves
    splits: dict = {}  # id(distribution) -> (distribution, its batch split): per batch

    @functools.wraps(original)
    def distribute_data(data: Any, *args: Any, **kwargs: Any) -> Any:
        distribution = current()
        if distribution is not None:
            known = splits.get(id(distribution))
            if known is None or known[0] is not distribution:
                known = splits[id(distribution)] = (distribution, _batch_split(distribution))
            split = known[1]
            for leaf in leaves_of(data):  # `_rows_divide`, inline: every batch pays it
                shape = getattr(leaf, "shape", None)
                if shape and shape[0] % split:
                    if jax.process_count() == 1:
                        return jax.tree_util.tree_map(
                            lambda leaf: replicated(distribution, leaf), data)
                    break
        return original(data, *args, **kwargs)

    setattr(distribute_data, _UNEVEN_ATTR, True)
    trainer._distribute_data = distribute_data
    return True


class _Replicated:
    """The distribution as Keras's `_get_distributed_iterator` reads it, with every
    batch's layout replicated: a run of batches whose rows do not divide over the
    devices (`batching.BatchPlan.replicated`: kerasmgpu feeds such a batch only for a
    model whose loss has terms of the whole batch, one process)."""

    def __init__(self, distribution: Any) -> None:
        self._distribution = distribution

    def get_data_layout(self, shape: Tuple[int, ...]) -> Any:
        return _replicated_layout(self._distribution, shape)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._distribution, name)


def _per_kind(original: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def per_kind(self: Any, distribution: Any) -> Iterator[Any]:
        kinds = getattr(getattr(self.data_adapter, "py_dataset", None), KIND_ATTR, None)
        batches = iter(self.data_adapter.get_jax_iterator())
        pending = [next(batches, _END)]
        if kinds is None:
            if pending[0] is _END or not (_OURS and _OURS[0](pending[0])):
                # Not kerasmgpu's: Keras's own method, on the same batches.
                yield from original(_Source(_chained(pending[0], batches)), distribution)
                return
            # A generator or tf.data pipeline kerasmgpu pads: a batch every process
            # of a job feeds whole has a structure of its own (the mark).
            kinds = (_OURS[1], _OURS[1])
        kind_of, replicated = kinds

        import jax

        # In a job of several processes each feeds its share of a batch, or the whole
        # batch where it says so (its rows cannot tell: a share can have as many).
        alone = jax.process_count() == 1
        split = _batch_split(distribution) if alone else 1

        def key(batch: Any) -> Tuple[Any, bool]:
            if not alone:
                return kind_of(batch), not replicated(batch)
            divides = all(_rows_divide(split, leaf) for leaf in jax.tree_util.tree_leaves(batch))
            return kind_of(batch), divides

        def run(kind: Any) -> Iterator[Any]:
            yield pending[0]
            for batch in batches:
                if key(batch) != kind:
                    pending[0] = batch
                    return
                yield batch
            pending[0] = _END

        while pending[0] is not _END:
            kind = key(pending[0])
            yield from original(_Source(run(kind)),
                                distribution if kind[1] else _Replicated(distribution))

    setattr(per_kind, _PATCHED_ATTR, True)
    return per_kind
