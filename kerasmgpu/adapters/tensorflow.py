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
TensorFlow variables (`Adapter.state_reader` on every TF-backed line), and
`replica_moments`, the synchronized masked BatchNorm moments of every TF-backed line.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from typing import Any, Callable, Iterator, List, Tuple

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


def reduce_before(apply: Callable[[Any, Any], Any],
                  reduce: Callable[[Any], Any]) -> Tuple[Callable[..., Any], Callable[..., Any]]:
    """(apply, reduce) that sum a replica's gradients on entry to `apply`, once.

    `apply(grads, variables)` transforms the gradients and calls `reduce(pairs)` - an
    all-reduce sum over the replicas - before the update. The new `apply` reduces first
    (in a replica of several; elsewhere it is the old one) and, while it runs on this
    thread (each replica runs on its own), the new `reduce` hands the pairs back as they
    are: one all-reduce per step, as before, and every transform sees the sum.
    """
    local = threading.local()

    def reduce_once(grads_and_vars: Any) -> Any:
        if getattr(local, "reduced", False):
            return list(grads_and_vars)
        return reduce(grads_and_vars)

    def apply_reduced(grads: Any, trainable_variables: Any) -> Any:
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if (context is None or context.num_replicas_in_sync == 1
                or getattr(local, "reduced", False)):
            return apply(grads, trainable_variables)
        trainable_variables = list(trainable_variables)
        summed = [g for g, _ in reduce(list(zip(grads, trainable_variables)))]
        local.reduced = True
        try:
            return apply(summed, trainable_variables)
        finally:
            local.reduced = False

    return apply_reduced, reduce_once


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


def replica_moments(context: Any, inputs: Any, mask: Any, axes: Any) -> Tuple[Any, Any]:
    """Mean and variance (dimensions kept) over every replica's rows that `mask` keeps.

    Each replica holds its shard of the global batch: the masked sums and row count are
    all-reduced (a SUM over `context`'s replicas, differentiable: its gradient is
    all-reduced too), the mean taken, then the masked sum of squared deviations from it -
    two passes, as one device's `tf.nn.moments`, not E[x^2] - E[x]^2 as Keras's own
    synchronized moments (which also keep the padding rows in). No mask: every row.
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
    return mean, tf.math.divide_no_nan(squares, total[1])
