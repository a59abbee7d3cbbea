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
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, List, Tuple

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
