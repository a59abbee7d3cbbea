"""Turn whatever the user passes to fit/evaluate/predict into padded, packed batches.

Every batch a replica sees is `(x, bundle)` (`kerasmgpu.data.bundle`): the rows were
padded by `kerasmgpu.batching`, and the bundle carries the packing (scale and mask per
row) and the user's targets and sample weights, gathered like the rows.
Inputs handled: numpy-like arrays (and lists/dicts of them), `tf.data.Dataset`,
`keras.utils.PyDataset` / `Sequence`, and Python generators. On the TensorFlow routes
arrays go through a `tf.data` index pipeline (the padding plan comes from
`kerasmgpu.batching` through `tf.numpy_function`), elsewhere through a `PyDataset`; a
`tf.data.Dataset` is padded by a `tf.data` map on every route, and Keras iterates it
as it iterates the user's pipeline on one device.

One class per kind of input - `arrays.Arrays`, `datasets.Dataset`, `python.Indexed`
(PyDataset/Sequence), `python.Generator` - holds what every engine needs from it, a
feed per `FeedKind`; `build` chooses the class once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple, Type

from kerasmgpu import batching
from kerasmgpu._errors import bad_type, bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.data.arrays import Arrays, pad_batch
from kerasmgpu.data.base import (
    Feed,
    Input,
    InputSpecs,
    Request,
    check_inputs,
    is_dataset,
    is_python_source,
    is_split_dataset,
    num_rows,
)
from kerasmgpu.data.datasets import Dataset
from kerasmgpu.data.python import Generator, Indexed
from kerasmgpu.data.structure import is_array_like, map_structure, to_numpy
from kerasmgpu.registry import FeedKind

__all__ = ["Feed", "build", "check_inputs", "pad_batch", "repeated", "skipped", "split_validation"]


def build(
    adapter: Adapter,
    kind: FeedKind,
    planner: batching.Planner,
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    class_weight: Any = None,
    batch_size: Optional[int] = None,
    shuffle: Any = False,
    predict: bool = False,
    seed: Optional[int] = None,
    inputs: InputSpecs = None,
    accumulate_steps: int = 1,
    parts: bool = False,
) -> Feed:
    """A padded feed for `x` (and `y`, weights), in the form the engine consumes (`kind`).

    `y` may be None (a model trained by add_loss or by its own step). `inputs`: the
    model's declared (name, shape) inputs, to check array features against up front.
    """
    request = Request(x, y, sample_weight, class_weight, batch_size, shuffle, predict, seed,
                      inputs, accumulate_steps, parts)
    cls = input_kind(request)
    if accumulate_steps > 1 and cls is not Arrays:
        raise bad_value(
            "x", f"a {cls.__name__.lower()} with accumulate_steps={accumulate_steps}",
            "in-memory arrays when parallelize(accumulate_steps>1) trains (the rows of every "
            "optimizer step must be known to weigh its batches exactly)",
            "pass numpy arrays to fit(), or parallelize() with accumulate_steps=1",
        )
    return cls(adapter, planner, request).feed(kind)


def input_kind(request: Request) -> Type[Input]:
    """The `Input` class for what the user passed as `x` (and refuses what it cannot be)."""
    x = request.x
    if x is None:
        raise bad_value("x", None, "arrays, a tf.data.Dataset, a PyDataset or a generator",
                        "pass the training inputs")
    if not (is_dataset(x) or is_python_source(x)):
        return Arrays
    if request.y is not None:
        raise bad_value(
            "y", "targets next to a dataset/generator `x`",
            "y=None when x is a dataset, PyDataset or generator (it yields the targets)",
            "drop the `y` argument",
        )
    if request.sample_weight is not None:
        raise bad_value(
            "sample_weight", "weights next to a dataset/generator `x`",
            "sample_weight=None when x yields batches (yield (x, y, sample_weight))",
            "yield the weights with each batch",
        )
    if is_dataset(x):
        if is_split_dataset(x):
            # It failed inside the feed before: "no attribute 'enumerate'".
            raise bad_type(
                "x", f"a {type(x).__name__} (tf.distribute's, each batch already split "
                "over a strategy's replicas)",
                "a tf.data.Dataset of global batches: kerasmgpu splits each over its own "
                "replicas", "pass the dataset you gave `experimental_distribute_dataset` "
                "(or the function you gave `distribute_datasets_from_function`, called), "
                "not what it returned", raw=True)
        return Dataset
    if hasattr(x, "__getitem__") and hasattr(x, "__len__"):
        return Indexed
    return Generator


def repeated(feed: Feed) -> Feed:
    """A tf.data feed of known length read as one endless stream (pass `steps`); the
    user's own pipelines stay as Keras reads them (`Feed.per_epoch_iterators`)."""
    if feed.steps is None or not is_dataset(feed.data) or feed.per_epoch_iterators:
        return feed
    tail = None if feed.tail is None else feed.tail.repeat()
    return dataclasses.replace(feed, data=feed.data.repeat(), tail=tail, needs_steps=True)


def skipped(feed: Feed, steps: int) -> Optional[Feed]:
    """The repeated feed without its first `steps` batches (already trained before a
    resume); None for a feed read epoch by epoch, which cannot skip them."""
    if not feed.needs_steps or not is_dataset(feed.data) or feed.per_epoch_iterators:
        return None
    if feed.tail is None:
        return dataclasses.replace(feed, data=feed.data.skip(steps))
    assert feed.steps is not None
    tails = (feed.offset + steps) // feed.steps - feed.offset // feed.steps
    return dataclasses.replace(feed, data=feed.data.skip(steps - tails),
                               tail=feed.tail.skip(tails), offset=feed.offset + steps)


def split_validation(
    x: Any, y: Any, sample_weight: Any, validation_split: float
) -> Tuple[Tuple[Any, Any, Any], Tuple[Any, Any, Any]]:
    """Keras's validation_split on arrays: the last fraction of rows validates."""
    if not is_array_like(x):
        raise bad_value(
            "validation_split", validation_split,
            "validation_split only with array inputs",
            "pass `validation_data` instead when x is a dataset or generator",
        )
    x, y, sample_weight = to_numpy(x), to_numpy(y), to_numpy(sample_weight)
    rows = num_rows({"x": x, "y": y, "sample_weight": sample_weight})
    at = batching.validation_split_at(rows, validation_split)

    def head(s: Any) -> Any:
        return map_structure(lambda a: a[:at], s, skip_none=True)

    def tail(s: Any) -> Any:
        return map_structure(lambda a: a[at:], s, skip_none=True)

    return (head(x), head(y), head(sample_weight)), (tail(x), tail(y), tail(sample_weight))
