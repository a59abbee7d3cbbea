"""TensorFlow's own runtime internals (tf.distribute), shared by every TF-backed line.

Not a Keras line: the `mirrored` engine drives tf.distribute the same way under tf.keras
2.x, tf_keras and Keras 3 on TensorFlow. Verified on TensorFlow 2.12-2.21 (the TF
releases of the tox matrix). What is touched:

* `MirroredStrategy._collective_key_base`, read by `__init__`: every strategy numbers
  its collective groups from 1 + this base (0 by default), so a second strategy of
  another size in one process (gpus=2, then gpus=3) joins the first one's groups and
  aborts ("Device CPU:0 is joining a group with size3, but that group has size 2").
* `strategy.extended._cross_device_ops` / `_collective_ops`: only to name the
  all-reduce in `describe()`.
* `tensorflow.python.data.ops.multi_device_iterator_ops._create_device_dataset`: how
  each device's stream of a distributed dataset is built (`plain_device_streams`).

Also here, with public TensorFlow ops only: `value_hasher`, the change tokens of
TensorFlow variables (`Adapter.state_reader` on every TF-backed line);
`Accumulation`, the gradient sums of `accumulate_steps` on every TF-backed line (the
Keras side of it is in each line's adapter); and `replica_moments`, the synchronized masked BatchNorm moments of every TF-backed line.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np

_KEY_RANGE = 1_000_000
_key_bases = itertools.count(1)


def new_mirrored_strategy(devices: List[str]) -> Any:
    """A MirroredStrategy over `devices` whose collective keys clash with no other."""
    import tensorflow as tf

    cls = tf.distribute.MirroredStrategy
    strategy = cls.__new__(cls)
    strategy._collective_key_base = next(_key_bases) * _KEY_RANGE
    strategy.__init__(devices=devices)
    return strategy


def all_reduce_name(strategy: Any) -> str:
    """The class name of the strategy's all-reduce implementation (for describe())."""
    extended = strategy.extended
    ops = getattr(extended, "_cross_device_ops", None) or getattr(
        extended, "_collective_ops", None)
    return type(ops).__name__ if ops is not None else "unknown"


def equalize_across_replicas(variables: List[Any], strategy: Any) -> None:
    """Give every replica's copy of each variable the mean of the copies.

    Uses public tf.distribute calls only (`experimental_local_results`, a cross-replica
    `assign`, which sets every copy of a mirrored or MEAN sync-on-read variable).
    """
    with strategy.scope():
        for variable in variables:
            copies = strategy.experimental_local_results(variable)
            if len(copies) <= 1:
                continue
            values = [np.asarray(copy) for copy in copies]
            if all(np.array_equal(values[0], other) for other in values[1:]):
                continue
            variable.assign(np.mean(values, axis=0).astype(values[0].dtype))


# --- each device's stream of a distributed dataset -------------------------------------------
# MirroredStrategy feeds the devices through a MultiDeviceIterator: one stream per device,
# a generator dataset reading the shared iterator, then a prefetch
# (`multi_device_iterator_ops._create_device_dataset`). When a stream's iterator starts,
# tf.data tries its default graph rewrites on it; a generator dataset cannot be written
# as a graph, so TensorFlow logs "Input of GeneratorDatasetOp::Dataset will not be
# optimized because the dataset does not implement the AsGraphDefInternal() method" and
# runs the stream unchanged. Those rewrites have nothing to act on there (a prefetch
# after an opaque generator), and the source pipeline - kerasmgpu's feed - keeps its
# own, so while kerasmgpu's calls run the streams are built with the default rewrites
# off: the same streams, no attempt, no log line. (Plain MirroredStrategy logs it as
# well; one-device `fit` has no such streams.) Verified on TensorFlow 2.12, 2.13, 2.15,
# 2.16, 2.18, 2.19, 2.20 and 2.21. Where the function has moved nothing is changed: the
# line is only a log line, so no InternalsChanged here.

_plain_streams: contextvars.ContextVar = contextvars.ContextVar(
    "kerasmgpu_plain_device_streams", default=False)
_streams_lock = threading.Lock()
_streams_hooked = False


def _hook_device_streams() -> None:
    global _streams_hooked
    with _streams_lock:
        if _streams_hooked:
            return
        _streams_hooked = True
        try:
            from tensorflow.python.data.ops import multi_device_iterator_ops as streams
        except ImportError:
            return
        original = getattr(streams, "_create_device_dataset", None)
        if not callable(original):
            return

        def _create_device_dataset(*args: Any, **kwargs: Any) -> Any:
            dataset = original(*args, **kwargs)
            if not _plain_streams.get():
                return dataset
            import tensorflow as tf

            options = tf.data.Options()
            options.experimental_optimization.apply_default_optimizations = False
            return dataset.with_options(options)

        streams._create_device_dataset = _create_device_dataset


@contextlib.contextmanager
def plain_device_streams() -> Iterator[None]:
    """While inside, the per-device streams of distributed datasets are built without
    tf.data's default rewrites (see above); other code is untouched."""
    _hook_device_streams()
    token = _plain_streams.set(True)
    try:
        yield
    finally:
        _plain_streams.reset(token)


# --- change tokens: a hash of each variable's bits, computed on its device -----------------

_GOLDEN = 0x9E3779B9  # spreads the element index over all 32 bits
_MIX = (0x85EBCA6B, 0xC2B2AE35)  # MurmurHash3's 32-bit finalizer


def bits_hash(tf: Any, tensor: Any) -> Any:
    """A uint32 hash of a tensor's bits: any change of one element changes it, and other
    changes leave it equal with probability ~2**-32 (each element's bits, xor its index,
    go through MurmurHash3's finalizer before the sum, so that a uniform change - every
    element doubled - does not cancel out as it would in a plain weighted sum)."""
    size = tensor.dtype.size
    if size >= 4 and tensor.dtype != tf.bool:
        bits = tf.bitcast(tensor, tf.uint32)  # 8-byte types: two words per element
    elif size == 2:
        bits = tf.cast(tf.bitcast(tensor, tf.uint16), tf.uint32)
    else:
        bits = tf.cast(tensor, tf.uint32)
    bits = tf.reshape(bits, [-1])
    index = tf.cast(tf.range(tf.size(bits)), tf.uint32)
    x = tf.bitwise.bitwise_xor(bits, index * tf.constant(_GOLDEN, tf.uint32))
    for multiplier, shift in zip(_MIX, (16, 13)):
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(shift, tf.uint32)))
        x = x * tf.constant(multiplier, tf.uint32)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(16, tf.uint32)))
    return tf.reduce_sum(x)


def value_hasher(variables: List[Any]) -> Callable[[], List[int]]:
    """One hash per variable, read in one call: a tf.function over the variables, run
    where they live - XLA-compiled for variables on a GPU (one fused kernel, and TF's
    own uint32 kernels would run on the host). The hashes cross to the host, the values
    never do."""
    import tensorflow as tf

    if not variables:
        return lambda: []
    on_gpu = any("GPU" in str(getattr(v, "device", "") or "").upper() for v in variables)

    def hashes() -> Any:
        return tf.stack([bits_hash(tf, tf.convert_to_tensor(v)) for v in variables])

    compiled = [tf.function(hashes, jit_compile=True, autograph=False)] if on_gpu else []
    compiled.append(tf.function(hashes, autograph=False))

    def read() -> List[int]:
        while len(compiled) > 1:
            try:
                return [int(h) for h in compiled[0]().numpy()]
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
                compiled.pop(0)  # no XLA for these devices or types: the plain function
        return [int(h) for h in compiled[0]().numpy()]

    return read


class Accumulation:
    """The gradient sums of one optimizer step's micro-batches, kept between the calls
    of a train function (`parallelize(accumulate_steps=k)` on TensorFlow).

    Keras 3's own `gradient_accumulation_steps` chooses between accumulating and
    applying with a `cond` inside the replica function, and the update's `merge_call`
    cannot run inside a `cond` under MirroredStrategy. Here the choice is made on the
    host instead: the train function is traced twice - once accumulating, once applying
    (`applying` is read while each traces) - and `next_applies` says which one the next
    micro-batch runs. The sums are mirrored variables written by the first replica (the
    all-reduced sum is the same on every replica).
    """

    def __init__(self, steps: int, counted: Optional[Callable[[], int]] = None,
                 update: Optional[Callable[[Any, Any], Any]] = None) -> None:
        self.steps = steps
        self.applying = False
        self.fed = 0
        self.sums: dict = {}
        # The optimizer's own `gradient_accumulation_steps`, carried out here (Keras 3 on
        # TF): its groups follow the optimizer's micro-batch counter (`counted()`, across
        # epochs and fits, as its own accumulators do), every micro-batch weighs alike,
        # and the group's mean goes to `update` (its update without the accumulation).
        self.counted, self.update = counted, update

    @property
    def own(self) -> bool:
        return self.counted is not None

    def start(self, variables: List[Any]) -> None:
        """Before a fit: a zero sum for each trainable variable (made here, eagerly, in
        the strategy's scope; a tf.function may not create them on a second trace); the
        optimizer's own accumulation keeps the sums a group has so far."""
        import tensorflow as tf

        for variable in variables:
            value = tf.zeros(variable.shape, variable.dtype)
            if id(variable) not in self.sums:
                self.sums[id(variable)] = tf.Variable(
                    value, trainable=False,
                    synchronization=tf.VariableSynchronization.ON_WRITE,
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            elif not self.own:
                self.sums[id(variable)].assign(value)
        self.fed = self.counted() if self.counted is not None else 0

    def next_applies(self) -> bool:
        """Whether the next micro-batch ends its group (the optimizer then applies)."""
        applies = self.fed % self.steps == self.steps - 1
        self.fed += 1
        return applies

    def _sums(self, variables: List[Any]) -> List[Any]:
        missing = [getattr(v, "path", getattr(v, "name", "?")) for v in variables
                   if id(v) not in self.sums]
        if missing:
            raise ValueError(
                f"Invalid variables for accumulate_steps={self.steps}: the optimizer "
                f"updates {missing}, which are not the model's trainable_variables. Allowed: "
                "a train step that applies gradients to model.trainable_variables. Fix: "
                "parallelize() with accumulate_steps=1 for this model.")
        return [self.sums[id(v)] for v in variables]

    def add(self, grads: List[Any], variables: List[Any]) -> None:
        for total, grad in zip(self._sums(variables), grads):
            total.assign_add(grad)

    def group_mean(self, grads: List[Any], variables: List[Any]) -> List[Any]:
        """The group's gradient: each micro-batch is weighted by its rows in the feed
        (`kerasmgpu.accumulation`), so the mean of the `steps` gradients is it."""
        return [(total.read_value() + grad) / self.steps
                for total, grad in zip(self._sums(variables), grads)]

    def clear(self, variables: List[Any]) -> None:
        import tensorflow as tf

        for total in self._sums(variables):
            total.assign(tf.zeros(total.shape, total.dtype))


def finish_group(group: Accumulation, optimizer: Any, variables: List[Any],
                 factor: float) -> None:
    """Apply `group`'s incomplete sums now (a fit stopped inside the group): the sums
    times `factor`, through the optimizer's hooked `apply_gradients` in its applying
    mode, given zero gradients - in a replica function of the current strategy, as the
    applying trace does it (its all-reduce of zeros adds nothing), so clipping, the step
    count and the update are those of a group's last micro-batch."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    for total in group._sums(variables):
        total.assign(total * factor)

    def apply() -> None:
        optimizer.apply_gradients([(tf.zeros_like(v), v) for v in variables])

    group.applying = True
    try:
        tf.function(lambda: strategy.run(apply), autograph=False)()
    finally:
        group.applying = False
        group.fed = 0


def switching_train_function(model: Any, original: Callable[..., Any],
                             accumulation: Callable[[], Any],
                             steps_per_execution: Callable[[], int]) -> Callable[..., Any]:
    """`model.make_train_function`, accumulating (`accumulation()` not None): the
    original traced twice - accumulating, applying - and a `train_function` that picks
    one before each micro-batch. `fit` calls `make_train_function` once at its start
    (Keras 3.10 - 3.15, tf.keras 2.12 - tf_keras 2.21), which starts a group with zero
    sums; `original(force=True)` leaves its function in `model.train_function`."""
    switch: dict = {}

    def make_train_function(force: bool = False) -> Any:
        group = accumulation()
        if group is None:
            return original(force=force)
        spe = steps_per_execution()
        if spe > 1:
            raise ValueError(
                f"Invalid steps_per_execution={spe} with accumulate_steps={group.steps} on "
                "TensorFlow. Allowed: 1 (the host chooses, before each micro-batch, whether "
                "the optimizer applies). Fix: compile with steps_per_execution=1.")
        group.start(list(model.trainable_variables))
        # Traced anew after a compile (which drops train_function) or a new optimizer.
        if force or switch.get("held") != (group, model.train_function):
            traced = {}
            for applying in (False, True):
                original(force=True)
                traced[applying] = model.train_function

            def train_function(iterator: Any) -> Any:
                group.applying = group.next_applies()
                return traced[group.applying](iterator)

            switch["held"] = (group, train_function)
            model.train_function = train_function
        return model.train_function

    return make_train_function


def reduce_before(
    apply: Callable[[Any, Any], Any], reduce: Callable[[Any], Any],
    accumulation: Callable[[], Any] = lambda: None,
) -> Tuple[Callable[..., Any], Callable[..., Any]]:
    """(apply, reduce) that sum a replica's gradients on entry to `apply`, once.

    `apply(grads, variables)` transforms the gradients and calls `reduce(pairs)` - an
    all-reduce sum over the replicas - before the update. The new `apply` reduces first
    (in a replica of several; elsewhere it is the old one) and, while it runs on this
    thread (each replica runs on its own), the new `reduce` hands the pairs back as they
    are: one all-reduce per step, as before, and every transform sees the sum.
    With an `Accumulation` (`accumulation()`), the summed gradient is added to its sums,
    and only the applying trace hands the group's gradient to `apply` (clipping then
    sees the whole group's gradient, as on one device).
    """
    local = threading.local()

    def reduce_once(grads_and_vars: Any) -> Any:
        if getattr(local, "reduced", False):
            return list(grads_and_vars)
        return reduce(grads_and_vars)

    def apply_reduced(grads: Any, trainable_variables: Any) -> Any:
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        group = accumulation()
        if (context is None or getattr(local, "reduced", False)
                or (group is None and context.num_replicas_in_sync == 1)):
            return apply(grads, trainable_variables)
        trainable_variables = list(trainable_variables)
        summed = [g for g, _ in reduce(list(zip(grads, trainable_variables)))]
        if group is not None:
            if not group.applying:
                group.add(summed, trainable_variables)
                return None
            summed = group.group_mean(summed, trainable_variables)
            group.clear(trainable_variables)
        local.reduced = True
        try:
            if group is not None and group.update is not None:
                return group.update(summed, trainable_variables)
            return apply(summed, trainable_variables)
        finally:
            local.reduced = False

    return apply_reduced, reduce_once


def accumulating_apply(apply: Callable[..., Any], reduce: Callable[[Any], Any],
                       accumulation: Callable[[], Any],
                       unscale: Callable[[], Any]) -> Callable[..., Any]:
    """An optimizer's public `apply(grads, variables)` that, in the accumulating trace
    of an `Accumulation`, only adds the replicas' summed gradient (unscaled by the
    optimizer's `loss_scale_factor`, as `apply` does) to the group's sums: no update, no
    constraint, no step counted. Elsewhere it is `apply`."""

    def apply_or_add(grads: Any, trainable_variables: Any = None) -> Any:
        import tensorflow as tf

        group = accumulation()
        if (group is None or group.applying
                or tf.distribute.get_replica_context() is None):
            return apply(grads, trainable_variables)
        if trainable_variables is None:
            raise ValueError(
                f"Invalid optimizer.apply(grads) with accumulate_steps={group.steps}: no "
                "variables. Allowed: optimizer.apply(grads, variables). Fix: pass the "
                "variables the gradients belong to.")
        pairs = [(g, v) for g, v in zip(grads, trainable_variables) if g is not None]
        summed = reduce(pairs)
        factor = unscale()
        group.add([g if factor is None else g / factor for g, _ in summed],
                  [v for _, v in summed])
        return None

    return apply_or_add


def accumulating_apply_gradients(apply: Callable[..., Any], aggregate: Callable[[Any], Any],
                                 accumulation: Callable[[], Any]) -> Callable[..., Any]:
    """tf.keras's `apply_gradients(grads_and_vars)` with an `Accumulation`: the pairs
    are summed over the replicas (`aggregate`, the optimizer's own all-reduce), added to
    the sums in the accumulating trace (no update, no step counted), and in the applying
    one the group's mean is applied without a second all-reduce. Elsewhere `apply`."""

    def apply_or_add(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        group = accumulation()
        if group is None or tf.distribute.get_replica_context() is None:
            return apply(grads_and_vars, *args, **kwargs)
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        summed = aggregate(pairs)
        grads, variables = [g for g, _ in summed], [v for _, v in summed]
        if not group.applying:
            group.add(grads, variables)
            return None
        mean = group.group_mean(grads, variables)
        group.clear(variables)
        kwargs["skip_gradients_aggregation"] = True
        return apply(list(zip(mean, variables)), *args, **kwargs)

    return apply_or_add


def all_replicas_agree(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A boolean `check(grads)` that holds in a replica only if it holds in every one."""

    def agreed(grads: Any) -> Any:
        import tensorflow as tf

        value = check(grads)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return value
        failed = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                    tf.cast(tf.logical_not(value), tf.float32))
        return tf.equal(failed, 0.0)

    return agreed


def replica_moments(context: Any, inputs: Any, mask: Any, axes: Any,
                    idle: Optional[Tuple[Any, Any]] = None) -> Tuple[Any, Any]:
    """Mean and variance (dimensions kept) over every replica's rows that `mask` keeps.

    Each replica holds its shard of the global batch: the masked sums and row count are
    all-reduced (a SUM over `context`'s replicas, differentiable: its gradient is
    all-reduced too), the mean taken, then the masked sum of squared deviations from it -
    two passes, as one device's `tf.nn.moments`, not E[x^2] - E[x]^2 as Keras's own
    synchronized moments (which also keep the padding rows in). No mask: every row.
    With `idle` (the layer's moving mean and variance), a global batch without a kept
    row - an accumulation filler - returns them, so the moving averages stay as they are
    (one device never runs that batch).
    """
    import tensorflow as tf

    kept = tf.ones_like(inputs) if mask is None else tf.cast(
        tf.broadcast_to(tf.expand_dims(tf.cast(mask, inputs.dtype), -1), tf.shape(inputs)),
        inputs.dtype)
    total = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.stack([
        tf.reduce_sum(inputs * kept, axes, keepdims=True),
        tf.reduce_sum(kept, axes, keepdims=True)]))
    mean = tf.math.divide_no_nan(total[0], total[1])
    squares = context.all_reduce(
        tf.distribute.ReduceOp.SUM,
        tf.reduce_sum(tf.square(inputs - mean) * kept, axes, keepdims=True))
    variance = tf.math.divide_no_nan(squares, total[1])
    if idle is None:
        return mean, variance
    empty = total[1] <= 0

    def or_moving(moving: Any, value: Any) -> Any:
        return tf.where(empty, tf.reshape(tf.cast(moving, inputs.dtype), tf.shape(value)),
                        value)

    return or_moving(idle[0], mean), or_moving(idle[1], variance)
