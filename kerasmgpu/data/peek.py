"""A call's first batch, read before the call reads it, without changing what it reads.

`first(x)` serves the self-check (`training.verify`, which compares that batch on one
device and on the replicas) and the job's agreement check (`training.agree`, which
compares it across processes). A tf.data.Dataset is read through an iterator of its own
where no stage of it has state a read could change (`tf_data.state_a_read_changes`), a
PyDataset / Sequence by index 0 (`item_zero`): the call reads `x` itself. A generator or
iterator has its first element taken, and the call reads one that yields it back first
(`handed_back`). Nothing is read - and `why` says why, where it is worth saying - from
what a read would change (a pipeline with a shuffle or random stage), an iterator that
is also indexed, an empty source, or what no call reads (the call refuses it).
"""

from __future__ import annotations

import inspect
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from kerasmgpu.data.base import is_dataset, is_split_dataset


@dataclass
class Peeked:
    element: Any  # the first element as the source gives it; None when nothing was read
    source: Any  # what the call reads in place of `x`
    why: str = ""  # why nothing was read, where a caller should say so


def first_element(dataset: Any) -> Any:
    """A tf.data.Dataset's first element, through an iterator of its own."""
    return next(iter(dataset.take(1)), None)


def item_zero(source: Any) -> Any:
    """A PyDataset's / Sequence's batch 0, read once more (as Keras's TensorFlow data
    adapters read it for its structure), with the process's NumPy and Python random
    states put back, so an augmentation drawing from them draws the same for the call."""
    import random

    if not len(source):
        return None
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        return source[0]
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)


def handed_back(first: Any, rest: Iterator[Any], generator: bool) -> Iterator[Any]:
    """`first`, then what `rest` yields: a generator where the source was one (Keras
    tells a generator by its type), else an iterator as the source was."""
    if not generator:
        return itertools.chain((first,), rest)

    def again() -> Iterator[Any]:
        yield first
        yield from rest

    return again()


def first(x: Any) -> Peeked:
    """`x`'s first element and what the call then reads (module docstring)."""
    from kerasmgpu.adapters import tf_data

    read: Callable[[Any], Any] = item_zero  # or the dataset's own reader, below
    if is_split_dataset(x):
        return Peeked(None, x)  # the call refuses it (`feeds.input_kind`)
    if is_dataset(x):
        changed = tf_data.state_a_read_changes(x)
        if changed is None:
            return Peeked(None, x, "its graph cannot be read to tell whether a read changes "
                                   "what the next gets")
        if changed:
            return Peeked(None, x, f"one more read could change what the call then reads "
                                   f"from it (stateful ops: {', '.join(changed[:4])}: a "
                                   "shuffle's seeds, random ops, Python code)")
        read = first_element
    elif not (hasattr(x, "__getitem__") and hasattr(x, "__len__")):
        if not hasattr(x, "__next__"):
            # Not an input any call reads (a torch DataLoader, an object): the call
            # refuses it, saying what it takes (`data.arrays`).
            return Peeked(None, x)
        if hasattr(x, "__getitem__"):
            return Peeked(None, x, "an iterator that is also indexed cannot be handed back "
                                   "as it was")
        element = next(x, None)
        if element is None:
            return Peeked(None, x)
        return Peeked(element, handed_back(element, x, inspect.isgenerator(x)))
    return Peeked(read(x), x)
