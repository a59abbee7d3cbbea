"""Python sources: a `keras.utils.PyDataset` / `Sequence` (indexable) or a generator.

Each element is padded in Python (`kerasmgpu.batching` plans it) as Keras reads it. An
indexable source becomes a PyDataset on every route; a generator becomes a `tf.data`
pipeline on the TensorFlow routes (read through `Replay`) and stays a generator
elsewhere.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, List, Optional

import numpy as np

from kerasmgpu import batching
from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.data.base import (
    Feed,
    Input,
    Request,
    Weigh,
    gather,
    no_autoshard,
    num_rows,
    user_weights,
)
from kerasmgpu.data.bundle import bundle, for_share, order_key
from kerasmgpu.data.structure import as_tuples, to_numpy, unpack


def pad_element(element: Any, weigh: Weigh, planner: batching.Planner, predict: bool,
                number: int = 0, even: Optional[str] = None) -> Any:
    """One element a Python source yields, as `(x, bundle)`, padded and packed; with
    `even` (a `bundle.even_batch` form), a batch that needs no padding as that form."""
    x, y, sw = unpack(element)
    x, y, sw = to_numpy(x), to_numpy(y), to_numpy(sw)
    weights = None if predict else user_weights(y, sw, weigh)
    share = planner.plan(num_rows({"x": x, "y": None if predict else y,
                                   "sample_weight": weights}))
    take = share.source_rows()
    if predict:
        return gather(x, take), bundle(share.packed(), order=order_key(number, len(take)))
    return for_share(share, len(take), gather(x, take), gather(y, take),
                     gather(weights, take), even)


class Indexed(Input):
    """A `keras.utils.PyDataset` / `Sequence`: a length and batches by index.

    In a job of several processes with `shuffle`, the batch order is drawn from the
    job's shared seed (`SeededOrder`) rather than by Keras, so every process reads the
    same batch at the same step.
    """

    REPLICATES = True  # read through PaddedBatches, a PyDataset of kerasmgpu's

    def __init__(self, adapter: Adapter, planner: batching.Planner, request: Request) -> None:
        super().__init__(adapter, planner, request)
        self.weigh = adapter.class_weigher(request.class_weight, "pydataset")

    def tf_feed(self) -> Feed:
        return self.python_feed()

    def python_feed(self) -> Feed:
        request = self.request
        if request.shuffle and request.seed is not None and self.planner.process_count > 1:
            feed = self._batches(SeededOrder(request.x, request.seed))
            return dataclasses.replace(feed, keras_shuffles=False)
        return self._batches(request.x)

    def _batches(self, source: Any) -> Feed:
        if len(source) == 0:
            raise bad_value("x", f"a {type(source).__name__} of length 0", "at least one batch",
                            "check its __len__ (the data it reads may be empty)", raw=True)
        padded = PaddedBatches(source, self.weigh, self.planner, self.predict)
        data = self.adapter.python_dataset(
            padded, workers=getattr(source, "workers", 1),
            use_multiprocessing=getattr(source, "use_multiprocessing", False),
            max_queue_size=getattr(source, "max_queue_size", 10))
        padded.even = self.even_form(data)
        return Feed(data, steps=len(source), keras_shuffles=True)


class PaddedBatches:
    """An indexable source's batches, each padded as Keras reads it (the adapter's
    `python_dataset` hands them to Keras as a PyDataset / Sequence)."""

    def __init__(self, source: Any, weigh: Weigh, planner: batching.Planner, predict: bool
                 ) -> None:
        self.source, self.weigh, self.planner = source, weigh, planner
        self.predict = predict
        # How a batch without padding reaches Keras (`Input.even_form`), set once the
        # adapter made the PyDataset.
        self.even: Optional[str] = None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        return pad_element(self.source[index], self.weigh, self.planner, self.predict, index,
                           self.even)

    def on_epoch_end(self) -> None:
        if hasattr(self.source, "on_epoch_end"):
            self.source.on_epoch_end()


class Generator(Input):
    """A generator or iterator: batches in order, of a length nobody knows."""

    # Handed to Keras as a generator (Keras 3); `pad_element` marks a batch every
    # process of a job feeds whole.
    REPLICATES_ALONE = True

    def __init__(self, adapter: Adapter, planner: batching.Planner, request: Request) -> None:
        super().__init__(adapter, planner, request)
        # An iterator that also has __getitem__ weighs classes as a PyDataset does,
        # and is read in Python on every route.
        self.indexable = hasattr(request.x, "__getitem__")
        self.weigh = adapter.class_weigher(
            request.class_weight, "pydataset" if self.indexable else "generator")

    def python_feed(self) -> Feed:
        source, weigh, planner, predict = self.request.x, self.weigh, self.planner, self.predict
        even: List[Optional[str]] = [None]

        def generate() -> Iterator[Any]:
            for number, element in enumerate(source):
                yield pad_element(element, weigh, planner, predict, number, even[0])

        batches = generate()
        even[0] = self.even_form(batches)
        return Feed(batches)

    def tf_feed(self) -> Feed:
        if self.indexable:
            return self.python_feed()
        import tensorflow as tf

        source, weigh, planner, predict = (iter(self.request.x), self.weigh, self.planner,
                                           self.predict)

        def padded() -> Iterator[Any]:
            for number, element in enumerate(source):
                yield as_tuples(pad_element(element, weigh, planner, predict, number))

        replay = Replay(padded(), self.adapter.generator_replays())
        first = replay.peek()
        signature = tf.nest.map_structure(
            lambda a: tf.TensorSpec((None,) + tuple(a.shape[1:]), tf.as_dtype(a.dtype)), first
        )
        data = tf.data.Dataset.from_generator(replay, output_signature=signature)
        return Feed(no_autoshard(tf, data.prefetch(tf.data.AUTOTUNE)))


class Replay:
    """A one-pass generator read through whichever iterator Keras made last.

    Keras may make more than one iterator of a feed during one run (Keras 3 makes a new
    one at every epoch end; under a plain MirroredStrategy it also reads a batch
    through one of its own before fit, which kerasmgpu turns off). With a plain
    generator every batch an older iterator prefetched would be lost. Here a newer
    iterator starts where the older ones stopped handing batches out, and older
    iterators stop: no batch is lost or trained on twice.

    Keras 3 reads a generator through a dataset whose every new iterator starts with
    the first `replays` batches it peeked once (its validation pass, a new iterator each
    epoch, validates on those again): a newer iterator here does the same.
    """

    def __init__(self, iterator: Iterator[Any], replays: int = 0) -> None:
        import threading

        self._replays = replays
        self._first: List[Any] = []  # the stream's first `replays` elements
        self._source = iterator
        self._buffer: List[Any] = []
        self._base = 0  # stream index of _buffer[0]
        self._generation = 0
        self._lock = threading.Lock()

    def _get(self, index: int) -> Any:
        while index >= self._base + len(self._buffer):
            self._buffer.append(next(self._source))  # StopIteration ends the stream
            if len(self._first) < self._replays:
                self._first.append(self._buffer[-1])
        return self._buffer[index - self._base]

    def peek(self) -> Any:
        """The first element; the first `replays` are read now, as Keras peeks them."""
        with self._lock:
            for index in range(self._base, self._base + self._replays):
                try:
                    self._get(index)
                except StopIteration:
                    break
            return self._get(self._base)

    def __call__(self) -> Iterator[Any]:
        with self._lock:
            self._generation += 1
            generation = self._generation
            position = self._base
            again = list(self._first) if generation > 1 else []
        yield from again
        while True:
            with self._lock:
                if generation != self._generation:
                    return  # a newer iterator took over
                try:
                    element = self._get(position)
                except StopIteration:
                    return
                if position > self._base:
                    # Batches before this one were taken by the newest iterator.
                    del self._buffer[: position - self._base]
                    self._base = position
            yield element
            position += 1


# --- several processes: every process sees the same global batches ------------------------
# (kerasmgpu.engines: the seed is rank 0's; each process then takes its own share.)


class SeededOrder:
    """An indexable source read in an order drawn from `seed`, re-drawn every epoch.

    Keras shuffles a PyDataset/Sequence with the process's own random state, so the
    processes of a job would read different batches at the same step: in a job of
    several, we shuffle instead, alike everywhere, and Keras is told not to.
    """

    def __init__(self, source: Any, seed: int) -> None:
        self._source = source
        self._rng = np.random.default_rng(seed)
        self._order = self._rng.permutation(len(source))

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> Any:
        return self._source[int(self._order[index])]

    def on_epoch_end(self) -> None:
        if hasattr(self._source, "on_epoch_end"):
            self._source.on_epoch_end()
        self._order = self._rng.permutation(len(self._source))

    def __getattr__(self, name: str) -> Any:  # workers, use_multiprocessing, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._source, name)
