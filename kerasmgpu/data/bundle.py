"""The second element of every batch kerasmgpu feeds: `(x, bundle)`.

The bundle is a dict holding the *packing* of the batch (per fed row, the batch's scale
`padded / real` and a mask 1 real / 0 padding, see `kerasmgpu.batching`) and, when the
user gave them, the targets and sample weights, gathered like the rows. Its keys are
part of the structure a traced step is specialised on, so only present parts have one.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

PACKING_KEY = "kerasmgpu_packing"
Y_KEY = "y"
SAMPLE_WEIGHT_KEY = "sample_weight"
# Predict only: (rows, 2) int32, the batch number and each fed row's position in it.
# Keras 3.3-3.9 on JAX hand the shards of a batch to the devices in set order
# (`distribute_data_input` zips them with `layout.addressable_devices`), so the rows of
# a predicted batch can come back permuted; the order key puts them back.
ORDER_KEY = "kerasmgpu_order"
# A batch every process of a job feeds whole, to be laid out replicated
# (`batching.BatchPlan.replicated`): (rows, 0), no value at all (a tf.data pipeline's
# every batch: (rows, 1), ones where so). In one process such a batch is told by its
# rows, which do not divide over the devices; in a job each process feeds a share of the
# others, whose rows can be as many, so the batch says so itself.
REPLICATED_KEY = "kerasmgpu_replicated"


def bundle(packed: Any, y: Any = None, sample_weight: Any = None, order: Any = None,
           replicated: bool = False) -> Dict[str, Any]:
    out: Dict[str, Any] = {PACKING_KEY: packed}
    if order is not None:
        out[ORDER_KEY] = order
    if replicated:
        out[REPLICATED_KEY] = np.zeros((len(packed), 0), np.float32)
    if y is not None:
        out[Y_KEY] = y
    if sample_weight is not None:
        out[SAMPLE_WEIGHT_KEY] = sample_weight
    return out


# How a Python feed hands Keras a batch that needs no padding (`even_batch`): as the
# user's data (`plain`), what a one-device fit sends; or, where the batches of a feed
# must keep one structure, with an empty packing (`unpadded`). Either way the step is
# the engine's plain one (`steps.make_step`).
PLAIN = "plain"
EMPTY_PACKING = "empty packing"


def unpadded(rows: int) -> np.ndarray:
    """The packing of a batch that needs no padding: (rows, 0), no column at all.

    Its shape is static in a JAX trace (and in torch), so the step tells the fast
    path from it without looking at a value (`steps.make_step`): the engine's plain
    step, no weight or mask of kerasmgpu's. Only where a feed's batches must keep one
    structure (a generator on Keras 3.8+ with JAX, which lays an epoch's batches out
    like its first); JAX traces one step per packing shape there.
    """
    return np.zeros((rows, 0), np.float32)


def even_batch(form: str, rows: int, x: Any, y: Any, sample_weight: Any) -> Tuple[Any, ...]:
    """A batch of `rows` rows without padding in the feed's `form` (PLAIN or
    EMPTY_PACKING)."""
    if form == PLAIN:
        return plain(x, y, sample_weight)
    return (x, bundle(unpadded(rows), y, sample_weight))


def for_share(share: Any, rows: int, x: Any, y: Any, sample_weight: Any,
              even: Optional[str]) -> Tuple[Any, ...]:
    """A training batch of `rows` fed rows, planned as `share` (a
    `batching.ProcessShard`), with its rows gathered: `(x, bundle)`, or with `even` (an
    `even_batch` form) one that needs no padding in that form. In a job, a batch every
    process feeds whole says so (REPLICATED_KEY) and is never in the plain form."""
    marked = share.whole_in_every_process
    if even is not None and not share.plan.pad and not marked:
        return even_batch(even, rows, x, y, sample_weight)
    return (x, bundle(share.packed(), y, sample_weight, replicated=marked))


def is_padded(batch: Any) -> bool:
    """Whether a fed batch carries a packing (`(x, bundle)`), as opposed to the user's
    data: the two kinds of batch a feed's structure may change between."""
    return isinstance(batch, tuple) and len(batch) == 2 and is_bundle(batch[1])


def is_replicated(batch: Any) -> bool:
    """Whether a fed batch is one every process of a job feeds whole (REPLICATED_KEY):
    present with no column (a Python feed marks only such a batch), or with one column
    of ones (a tf.data pipeline, whose structure cannot change, marks every batch of
    such a feed: 0 for a share)."""
    if not is_padded(batch) or REPLICATED_KEY not in batch[1]:
        return False
    mark = batch[1][REPLICATED_KEY]
    shape: Tuple[int, ...] = tuple(getattr(mark, "shape", ()))
    return len(shape) < 2 or shape[-1] == 0 or bool(np.all(np.asarray(mark) == 1))


def plain(x: Any, y: Any = None, sample_weight: Any = None) -> Tuple[Any, ...]:
    """A whole feed without padding on TensorFlow, batch by batch: the data as Keras
    packs it for one device, `(x,)`, `(x, y)` or `(x, y, sample_weight)` (the user's
    weights only). Not an empty packing: tf.function relaxes a shape it sees change
    (`reduce_retracing`), so only the structure tells a traced TensorFlow step."""
    if sample_weight is not None:
        return (x, y, sample_weight)
    return (x,) if y is None else (x, y)


def is_bundle(obj: Any) -> bool:
    return isinstance(obj, dict) and PACKING_KEY in obj


def order_key(batch: int, rows: int) -> np.ndarray:
    """The ORDER_KEY array of batch number `batch` with `rows` fed rows."""
    key = np.empty((rows, 2), np.int32)
    key[:, 0] = batch
    key[:, 1] = np.arange(rows, dtype=np.int32)
    return key


def split(data: Any) -> Optional[Tuple[Any, Any, Any, Any]]:
    """(x, y, sample_weight, packed) of a batch kerasmgpu fed; None for any other data.

    `(x, bundle)` from a feed, or `(x, bundle, placeholder)` from the *_on_batch calls
    (Keras packs their `x, y, sample_weight` arguments as they are; the bundle holds the
    real sample weights).
    """
    if isinstance(data, (tuple, list)) and len(data) in (2, 3) and is_bundle(data[1]):
        b = data[1]
        return data[0], b.get(Y_KEY), b.get(SAMPLE_WEIGHT_KEY), b[PACKING_KEY]
    return None


def on_batch(data: Any) -> bool:
    """Whether a step's data came from an `*_on_batch` call: `(x, bundle, placeholder)`
    (a feed's batches are `(x, bundle)`)."""
    return isinstance(data, (tuple, list)) and len(data) == 3 and is_bundle(data[1])
