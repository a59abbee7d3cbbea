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
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from kerasmgpu import batching
from kerasmgpu._errors import bad_type, bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.data.bundle import bundle, order_key
from kerasmgpu.data.structure import (
    as_tuples,
    is_array_like,
    leaves,
    map_structure,
    to_numpy,
    unpack,
)
from kerasmgpu.registry import FeedKind


@dataclass
class Feed:
    """What is handed to Keras, and what we know about it."""

    data: Any
    steps: Optional[int] = None  # batches per epoch when known
    # Keras shuffles the batch order of an indexable Python source itself when fit()
    # gets shuffle=True; such feeds pass the user's `shuffle` on to Keras.
    keras_shuffles: bool = False
    # Keras cannot count the batches of this data (a distributed dataset): pass `steps`.
    needs_steps: bool = False
    # Whether a batch gets padding rows: True / False when the batch sizes are known
    # (arrays), None when they are not (datasets, generators).
    pads: Optional[bool] = None
    # Which batch is padded, in words, for the one-time warning of an opaque step.
    padding_example: Optional[str] = None
    # The user's own tf.data pipeline: Keras must make its iterators as it does on one
    # device - one per epoch, and the throw-away ones Keras 3 makes too - because each
    # new iterator draws the next reshuffle (`shuffle(seed=s)`) and restarts seeded
    # random ops; one repeated iterator would see other permutations and numbers.
    per_epoch_iterators: bool = False


def _num_rows(named: Mapping[str, Any]) -> int:
    """The common row count of named array structures, or an error naming each count."""
    counts: List[Tuple[str, int]] = []
    for name, structure in named.items():
        if structure is None:
            continue
        found = leaves(structure)
        for position, leaf in enumerate(found):
            shape = getattr(leaf, "shape", None)
            if shape is None or len(shape) == 0:
                raise bad_value(
                    name, f"a scalar ({type(leaf).__name__})",
                    "arrays whose first axis is the samples",
                    f"pass {name} as an array with one row per sample",
                )
            label = name if len(found) == 1 else f"{name}[{position}]"
            counts.append((label, int(shape[0])))
    sizes = {count for _, count in counts}
    if len(sizes) > 1:
        shown = ", ".join(f"{label} has {count}" for label, count in counts)
        raise bad_value(
            "/".join(name for name in named if named[name] is not None),
            f"arrays with different numbers of rows ({shown})",
            "inputs, targets and weights with the same number of rows",
            "check that they describe the same samples (one row per sample in each)",
            raw=True,
        )
    rows = sizes.pop() if sizes else 0
    if rows == 0:
        raise bad_value(
            "x", "arrays with 0 rows", "at least one sample",
            "pass the data to train on (was a filter or a split left empty?)",
            raw=True,
        )
    return rows


def check_inputs(x: Any, expected: Optional[List[Tuple[str, Tuple[Optional[int], ...]]]]
                 ) -> None:
    """Feature shapes against the model's declared inputs, before anything runs.

    Shapes are global (what the user passed), never a replica's slice.
    """
    if not expected:
        return
    if isinstance(x, Mapping):
        by_name = dict(expected)
        pairs = [(f"x[{key!r}]", x[key], key, by_name.get(key)) for key in x if key in by_name]
    else:
        found = leaves(x)
        if len(found) != len(expected):
            return  # Keras explains structure mismatches itself
        pairs = [(f"x[{i}]" if len(found) > 1 else "x", leaf, name, shape)
                 for i, (leaf, (name, shape)) in enumerate(zip(found, expected))]
    for label, leaf, name, shape in pairs:
        got = tuple(int(d) for d in getattr(leaf, "shape", ()) or ())
        if shape is None or len(got) != len(shape):
            continue  # rank differences are Keras's to reconcile or explain
        if any(want is not None and have != want for have, want in zip(got[1:], shape[1:])):
            raise bad_value(
                label,
                f"an array of shape {got}",
                f"the model's input {name!r} takes shape {shape} (None: any size)",
                "pass features of that shape, or rebuild the model for your data's shape",
                raw=True,
            )


def _is_dataset(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return module.startswith("tensorflow") and hasattr(obj, "element_spec")


def _is_python_source(obj: Any) -> bool:
    return (
        inspect.isgenerator(obj)
        or (hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and not is_array_like(obj))
        or (hasattr(obj, "__next__") and hasattr(obj, "__iter__"))
    )


# `weigh(y, sample_weight)`: the sample weights Keras makes of `class_weight` for these
# rows (the adapter's `class_weigher`, Keras's own rule for the active line), or None.
Weigh = Optional[Callable[[Any, Any], Any]]


def _user_weights(y: Any, sample_weight: Any, weigh: Weigh) -> Any:
    if weigh is None:
        return _float(sample_weight)
    if y is None:
        raise bad_value("class_weight", "class weights without targets",
                        "class_weight with data that has targets (x, y)",
                        "pass the targets, or drop class_weight", raw=True)
    return _float(weigh(y, sample_weight))


def _float(weights: Any) -> Any:
    """Integer (or boolean) sample weights as float32, as Keras's loss reads them: the
    padding weights, fractions, are multiplied into them in the step."""
    def one(w: Any) -> Any:
        w = np.asarray(w)
        return w if np.issubdtype(w.dtype, np.floating) else w.astype(np.float32)

    return map_structure(one, weights, skip_none=True)


def _gather(structure: Any, rows: np.ndarray) -> Any:
    return map_structure(lambda a: np.asarray(a)[rows], structure, skip_none=True)


# --- arrays: one batch ---------------------------------------------------------------------


def pad_batch(
    adapter: Adapter, x: Any, y: Any, sample_weight: Any, class_weight: Any,
    planner: batching.Planner,
) -> Tuple[Any, Any]:
    """One in-memory batch as `(x, bundle)`, padded and packed (the *_on_batch calls)."""
    x, y, sample_weight = to_numpy(x), to_numpy(y), to_numpy(sample_weight)
    weigh = adapter.class_weigher(class_weight, "batch")
    weights = _user_weights(y, sample_weight, weigh)
    share = planner.plan(_num_rows({"x": x, "y": y, "sample_weight": weights}))
    take = share.source_rows()
    return _gather(x, take), bundle(share.packed(), _gather(y, take), _gather(weights, take))


# --- arrays: a whole epoch -------------------------------------------------------------------


class _ArraySource:
    """Index plan over in-memory arrays; shared by the tf.data and PyDataset feeds."""

    def __init__(
        self,
        x: Any,
        y: Any,
        weights: Any,
        batch_size: int,
        shuffle: bool,
        planner: batching.Planner,
        seed: Optional[int] = None,
    ) -> None:
        self.x, self.y, self.weights = x, y, weights
        self.rows = _num_rows({"x": x, "y": y, "sample_weight": weights})
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.planner = planner
        self.rng = np.random.default_rng(seed)
        self.order = np.arange(self.rows)
        self.sizes = batching.batch_sizes(self.rows, batch_size)
        if shuffle:
            self.rng.shuffle(self.order)

    def padding(self) -> Tuple[bool, Optional[str]]:
        """Whether some batch gets padding rows, and which, in words."""
        replicas = self.planner.replicas
        uneven = [size for size in self.sizes if size % replicas]
        if not uneven:
            return False, None
        if len(self.sizes) > 1 and uneven == [self.sizes[-1]]:
            return True, (f"the last batch of each pass over the {self.rows} samples "
                          f"({self.sizes[-1]} rows)")
        return True, f"every batch of {uneven[0]} rows"

    def reshuffle(self) -> None:
        if self.shuffle:
            self.rng.shuffle(self.order)

    def batch(self, index: int, predict: bool) -> Tuple[Any, ...]:
        start = index * self.batch_size
        ids = self.order[start : start + self.batch_size]
        share = self.planner.plan(len(ids))
        take = ids[share.source_rows()]
        x = _gather(self.x, take)
        if predict:
            return (x, bundle(share.packed(), order=order_key(index, len(take))))
        return (x, bundle(share.packed(), _gather(self.y, take), _gather(self.weights, take)))


def _array_python_feed(adapter: Adapter, source: _ArraySource, predict: bool) -> Feed:
    base = adapter.python_dataset_type()

    class ArrayBatches(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            if adapter.keras3:
                super().__init__(workers=1, use_multiprocessing=False)

        def __len__(self) -> int:
            return len(source.sizes)

        def __getitem__(self, index: int) -> Any:
            return source.batch(index, predict)

        def on_epoch_end(self) -> None:
            source.reshuffle()

    pads, example = source.padding()
    return Feed(ArrayBatches(), steps=len(source.sizes), pads=pads, padding_example=example)


def _tf_pad(tf: Any, real: Any, planner: batching.Planner) -> Tuple[Any, Any]:
    """(source rows, packed) for a batch of `real` rows, planned by kerasmgpu.batching."""

    def plan_rows(count: Any) -> Tuple[np.ndarray, np.ndarray]:
        share = planner.plan(int(count))  # numpy scalars come in
        return share.source_rows(), share.packed()

    rows, packed = tf.numpy_function(
        plan_rows, [real], [tf.int64, tf.float32], stateful=False
    )
    rows.set_shape([None])
    packed.set_shape([None, batching.PACKED_COLUMNS])
    return rows, packed


def _array_tf_feed(source: _ArraySource, predict: bool, seed: Optional[int]) -> Feed:
    import tensorflow as tf

    def tensors(structure: Any) -> Any:
        return map_structure(tf.convert_to_tensor, as_tuples(structure), skip_none=True)

    x = tensors(source.x)
    y = None if predict else tensors(source.y)
    weights = None if predict else tensors(source.weights)
    planner = source.planner
    indices = tf.data.Dataset.range(source.rows)
    if source.shuffle:
        indices = indices.shuffle(source.rows, seed=seed, reshuffle_each_iteration=True)
    indices = indices.batch(source.batch_size).enumerate()

    def fetch(number: Any, ids: Any) -> Any:
        rows, packed = _tf_pad(tf, tf.size(ids), planner)
        take = tf.gather(ids, rows)

        def gather(structure: Any) -> Any:
            return map_structure(lambda t: tf.gather(t, take), structure, skip_none=True)

        if predict:
            return gather(x), bundle(packed, order=_tf_order(tf, number, rows))
        return gather(x), bundle(packed, gather(y), gather(weights))

    data = indices.map(fetch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    pads, example = source.padding()
    return Feed(_no_autoshard(tf, data), steps=len(source.sizes), pads=pads,
                padding_example=example)


def _float_weights(tf: Any, weights: Any) -> Any:
    """`_float` in tf.data: integer sample weights (or class weights given as ints)
    as float32."""
    if weights is None:
        return None
    return tf.nest.map_structure(
        lambda w: w if w.dtype.is_floating else tf.cast(w, tf.float32), weights)


def _tf_order(tf: Any, number: Any, rows: Any) -> Any:
    count = tf.shape(rows)[0]
    batch = tf.fill([count], tf.cast(number, tf.int32))
    return tf.stack([batch, tf.range(count, dtype=tf.int32)], axis=1)


def repeated(feed: Feed) -> Feed:
    """A tf.data feed of known length read as one endless stream (pass `steps`); the
    user's own pipelines stay as Keras reads them (`Feed.per_epoch_iterators`)."""
    if feed.steps is None or not _is_dataset(feed.data) or feed.per_epoch_iterators:
        return feed
    return dataclasses.replace(feed, data=feed.data.repeat(), needs_steps=True)


def _no_autoshard(tf: Any, dataset: Any) -> Any:
    # We shard between workers ourselves (kerasmgpu.batching.shard); tf.data must not
    # shard again, or each worker would drop rows.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


# --- tf.data.Dataset input --------------------------------------------------------------------


def _dataset_tf_feed(dataset: Any, planner: batching.Planner, predict: bool) -> Feed:
    import tensorflow as tf

    def pad(number: Any, data: Any) -> Any:
        x, y, sw = unpack(data)
        real = tf.shape(leaves(x)[0])[0]
        rows, packed = _tf_pad(tf, real, planner)

        def gather(structure: Any) -> Any:
            return None if structure is None else tf.nest.map_structure(
                lambda t: tf.gather(t, rows), structure)

        if predict:
            return gather(x), bundle(packed, order=_tf_order(tf, number, rows))
        return gather(x), bundle(packed, gather(y), gather(_float_weights(tf, sw)))

    data = dataset.enumerate().map(pad, num_parallel_calls=tf.data.AUTOTUNE,
                                   deterministic=True)
    steps = None
    cardinality = int(dataset.cardinality())
    if cardinality == 0:
        raise _empty_dataset()
    if cardinality >= 0:
        steps = cardinality
    return Feed(_no_autoshard(tf, data.prefetch(tf.data.AUTOTUNE)), steps=steps,
                per_epoch_iterators=True)


# --- Python sources: PyDataset, Sequence, generators -----------------------------------------


def _empty_dataset() -> ValueError:
    return bad_value("x", "an empty tf.data.Dataset (0 batches)", "at least one batch",
                     "check the pipeline (a filter, take() or batch(drop_remainder=True) "
                     "may have left nothing)", raw=True)


def _pad_element(element: Any, weigh: Weigh, planner: batching.Planner, predict: bool,
                 number: int = 0) -> Any:
    x, y, sw = unpack(element)
    x, y, sw = to_numpy(x), to_numpy(y), to_numpy(sw)
    weights = None if predict else _user_weights(y, sw, weigh)
    share = planner.plan(_num_rows({"x": x, "y": None if predict else y,
                                    "sample_weight": weights}))
    take = share.source_rows()
    if predict:
        return _gather(x, take), bundle(share.packed(), order=order_key(number, len(take)))
    return _gather(x, take), bundle(share.packed(), _gather(y, take), _gather(weights, take))


def _python_feed(
    adapter: Adapter, source: Any, weigh: Weigh, planner: batching.Planner, predict: bool
) -> Feed:
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        base = adapter.python_dataset_type()
        if len(source) == 0:
            raise bad_value("x", f"a {type(source).__name__} of length 0", "at least one batch",
                            "check its __len__ (the data it reads may be empty)", raw=True)

        class PaddedBatches(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                if adapter.keras3:
                    super().__init__(
                        workers=getattr(source, "workers", 1),
                        use_multiprocessing=getattr(source, "use_multiprocessing", False),
                        max_queue_size=getattr(source, "max_queue_size", 10),
                    )

            def __len__(self) -> int:
                return len(source)

            def __getitem__(self, index: int) -> Any:
                return _pad_element(source[index], weigh, planner, predict, index)

            def on_epoch_end(self) -> None:
                if hasattr(source, "on_epoch_end"):
                    source.on_epoch_end()

        return Feed(PaddedBatches(), steps=len(source), keras_shuffles=True)

    def generate() -> Iterator[Any]:
        for number, element in enumerate(source):
            yield _pad_element(element, weigh, planner, predict, number)

    return Feed(generate())


class _Replay:
    """A one-pass generator read through whichever iterator Keras made last.

    Keras may make more than one iterator of a feed during one run (Keras 3 makes a new
    one at every epoch end; under a plain MirroredStrategy it also reads a batch
    through one of its own before fit, which kerasmgpu turns off). With a plain
    generator every batch an older iterator prefetched would be lost. Here a newer
    iterator starts where the older ones stopped handing batches out, and older
    iterators stop: no batch is lost or trained on twice.
    """

    def __init__(self, iterator: Iterator[Any]) -> None:
        import threading

        self._source = iterator
        self._buffer: List[Any] = []
        self._base = 0  # stream index of _buffer[0]
        self._generation = 0
        self._lock = threading.Lock()

    def _get(self, index: int) -> Any:
        while index >= self._base + len(self._buffer):
            self._buffer.append(next(self._source))  # StopIteration ends the stream
        return self._buffer[index - self._base]

    def peek(self) -> Any:
        with self._lock:
            return self._get(self._base)

    def __call__(self) -> Iterator[Any]:
        with self._lock:
            self._generation += 1
            generation = self._generation
            position = self._base
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


def _generator_tf_feed(
    adapter: Adapter, source: Iterator[Any], weigh: Weigh, planner: batching.Planner, predict: bool
) -> Feed:
    import tensorflow as tf

    def padded() -> Iterator[Any]:
        for number, element in enumerate(source):
            yield as_tuples(_pad_element(element, weigh, planner, predict, number))

    replay = _Replay(padded())
    first = replay.peek()
    signature = tf.nest.map_structure(
        lambda a: tf.TensorSpec((None,) + tuple(a.shape[1:]), tf.as_dtype(a.dtype)), first
    )
    data = tf.data.Dataset.from_generator(replay, output_signature=signature)
    return Feed(_no_autoshard(tf, data.prefetch(tf.data.AUTOTUNE)))


# --- several processes: every process sees the same global batches ------------------------
# (kerasmgpu.engines: the seed is rank 0's; each process then takes its own share.)


class _SeededOrder:
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


def _same_order_everywhere(
    adapter: Adapter, source: Any, seed: int, weigh: Weigh, planner: batching.Planner,
    predict: bool,
) -> Feed:
    feed = _python_feed(adapter, _SeededOrder(source, seed), weigh, planner, predict)
    return dataclasses.replace(feed, keras_shuffles=False)


def _refuse_unseeded_shuffle(dataset: Any, processes: int) -> None:
    """Every process reads the whole pipeline and trains its share of each batch: an
    unseeded shuffle would give each process other batches (samples twice or never)."""
    from kerasmgpu.adapters import tf_data

    unseeded = tf_data.unseeded_shuffles(dataset)
    if unseeded:
        raise bad_value(
            "x", f"a tf.data.Dataset with {unseeded} unseeded shuffle(s), in a job of "
            f"{processes} processes",
            "a pipeline that shuffles alike in every process: each process reads it "
            "whole and trains its own share of every batch",
            "pass a seed, the same in every process: `dataset.shuffle(buffer, seed=S)`, "
            "or call `keras.utils.set_random_seed(S)` before building the pipeline; or "
            "pass arrays with fit(shuffle=True)",
            raw=True,
        )


# --- entry point -------------------------------------------------------------------------------


def _dataset_feed(adapter: Adapter, dataset: Any, class_weight: Any,
                  planner: batching.Planner, predict: bool) -> Feed:
    if planner.process_count > 1:
        _refuse_unseeded_shuffle(dataset, planner.process_count)
    map_fn = None if predict else adapter.class_weight_map_fn(class_weight)
    if map_fn is not None:
        # What Keras's fit does to a dataset for class_weight, before we pad it.
        dataset = dataset.map(map_fn)
    # A tf.data pipeline stays one on every backend (Keras 3 on JAX and PyTorch take
    # it too), so that Keras iterates it as it iterates the user's on one device.
    return _dataset_tf_feed(dataset, planner, predict)


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
    inputs: Optional[List[Tuple[str, Tuple[Optional[int], ...]]]] = None,
) -> Feed:
    """A padded feed for `x` (and `y`, weights), in the form the engine consumes (`kind`).

    `y` may be None (a model trained by add_loss or by its own step). `inputs`: the
    model's declared (name, shape) inputs, to check array features against up front.
    """
    if x is None:
        raise bad_value("x", None, "arrays, a tf.data.Dataset, a PyDataset or a generator",
                        "pass the training inputs")
    if _is_dataset(x) or _is_python_source(x):
        if y is not None:
            raise bad_value(
                "y", "targets next to a dataset/generator `x`",
                "y=None when x is a dataset, PyDataset or generator (it yields the targets)",
                "drop the `y` argument",
            )
        if sample_weight is not None:
            raise bad_value(
                "sample_weight", "weights next to a dataset/generator `x`",
                "sample_weight=None when x yields batches (yield (x, y, sample_weight))",
                "yield the weights with each batch",
            )
        if _is_dataset(x):
            return _dataset_feed(adapter, x, class_weight, planner, predict)
        if kind is FeedKind.TF and not hasattr(x, "__getitem__"):
            weigh = adapter.class_weigher(class_weight, "generator")
            return _generator_tf_feed(adapter, iter(x), weigh, planner, predict)
        weigh = adapter.class_weigher(
            class_weight, "pydataset" if hasattr(x, "__getitem__") else "generator")
        if shuffle and seed is not None and planner.process_count > 1 and hasattr(x, "__len__"):
            return _same_order_everywhere(adapter, x, seed, weigh, planner, predict)
        return _python_feed(adapter, x, weigh, planner, predict)
    if not is_array_like(x):
        raise bad_type(
            "x", f"an object of type {type(x).__qualname__}",
            "numpy-like arrays (or lists/dicts of them), a tf.data.Dataset, a "
            "keras.utils.PyDataset/Sequence, or a generator",
            "convert the inputs to numpy arrays",
            raw=True,
        )
    x, y, sample_weight = to_numpy(x), to_numpy(y), to_numpy(sample_weight)
    if predict:
        y = sample_weight = None
    weigh = None if predict else adapter.class_weigher(class_weight, "arrays")
    weights = None if predict else _user_weights(y, sample_weight, weigh)
    check_inputs(x, inputs)
    size = 32 if batch_size is None else batch_size
    shuffle_rows = bool(shuffle) and not predict
    source = _ArraySource(x, y, weights, size, shuffle_rows, planner, seed)
    if kind is FeedKind.TF:
        return _array_tf_feed(source, predict, seed)
    return _array_python_feed(adapter, source, predict)


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
    rows = _num_rows({"x": x, "y": y, "sample_weight": sample_weight})
    at = batching.validation_split_at(rows, validation_split)

    def head(s: Any) -> Any:
        return map_structure(lambda a: a[:at], s, skip_none=True)

    def tail(s: Any) -> Any:
        return map_structure(lambda a: a[at:], s, skip_none=True)

    return (head(x), head(y), head(sample_weight)), (tail(x), tail(y), tail(sample_weight))
