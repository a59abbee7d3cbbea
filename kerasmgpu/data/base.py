"""What every kind of input shares: the `Feed` handed to Keras, the `Input` base class,
the row count and weight rules, and the pieces of a tf.data pipeline that pads.

One `Input` subclass per kind of input (`arrays.Arrays`, `datasets.Dataset`,
`python.Indexed`, `python.Generator`); `feeds.build` chooses the class once and asks
it for the feed of the engine's kind (`FeedKind`).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, List, Mapping, Optional, Tuple

import numpy as np

from kerasmgpu import batching
from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.data import bundle
from kerasmgpu.data.structure import is_array_like, leaves, map_structure
from kerasmgpu.registry import FeedKind

# The model's declared inputs: (name, shape) each, None for a free dimension.
InputSpecs = Optional[List[Tuple[str, Tuple[Optional[int], ...]]]]


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
    # A tf.data feed in parts (`arrays.Arrays._tf_parts`): the pipeline of the epoch's
    # last batch, which has a shape (or a padding) of its own and so a step program of
    # its own. Keras reads `data`, `steps - 1` batches per epoch; the `steps`-th step
    # of every `steps` - counted from `offset` steps already taken - must read this
    # one (`training.parts`).
    tail: Any = None
    offset: int = 0
    # Accumulating: after n micro-batches of a fit that stops there, the factor of the
    # incomplete group's gradient (`accumulation.stopped_group`), None when it is whole.
    stopped_group: Optional[Callable[[int], Optional[float]]] = None
    # A batch that does not divide goes whole to every replica (`batching.BatchPlan.whole`).
    whole: bool = False


@dataclass
class Request:
    """What fit/evaluate/predict was given, as `feeds.build` received it."""

    x: Any
    y: Any = None
    sample_weight: Any = None
    class_weight: Any = None
    batch_size: Optional[int] = None
    shuffle: Any = False
    predict: bool = False
    seed: Optional[int] = None
    inputs: InputSpecs = None
    # Training batches per optimizer step (`kerasmgpu.accumulation`); arrays only.
    accumulate_steps: int = 1
    # Whether a tf.data array feed may come in parts (`Feed.tail`): the model's step
    # function runs one step per call and the engine reads a second pipeline.
    parts: bool = False


class Input:
    """One kind of input: what every engine needs from it, a method per feed kind."""

    # Whether its batches reach Keras through kerasmgpu's own PyDataset, which one
    # program can lay out replicated (`batching.BatchPlan.replicated`), in a job too.
    REPLICATES: ClassVar[bool] = False
    # Whether they reach Keras as a generator or a tf.data pipeline, whose batches one
    # program lays out replicated told by their packing, and in a job by the mark a
    # batch every process feeds whole carries (a generator's batch changes structure for
    # it, a pipeline's every batch carries a column, ones where the batch is whole).
    REPLICATES_ALONE: ClassVar[bool] = False

    def __init__(self, adapter: Adapter, planner: batching.Planner, request: Request) -> None:
        self.adapter = adapter
        replicates = (self.REPLICATES and adapter.even_batches_run_plain or
                      self.REPLICATES_ALONE)
        if planner.whole and (request.predict or not planner.copies and not (
                replicates and adapter.lays_out_replicated(bundle.is_padded,
                                                           bundle.is_replicated))):
            # predict computes no loss: padded as for any model. One program cannot be
            # given copies (a sum would count each): where it cannot lay the batch out
            # replicated either, it is padded, and the step's report warns that padding
            # rows count in its terms (`Feed.whole` False).
            planner = dataclasses.replace(planner, whole=False)
        self.planner = planner
        self.request = request
        self.predict = request.predict
        # Whether a batch that divides by the replica count takes the engine's plain
        # step - decided per batch where Python batches reach Keras one at a time (the
        # adapter's `even_batches_run_plain`: Keras 3 on JAX and torch; `even_form`).
        # The TensorFlow array feed decides per part of its epoch (`arrays.Arrays.tf_feed`).
        self.plain_even = False

    def feed(self, kind: FeedKind) -> Feed:
        """The padded feed in the form an engine of `kind` consumes."""
        if kind is FeedKind.TF:
            feed = self.tf_feed()
        else:
            self.plain_even = self.adapter.even_batches_run_plain and not self.predict
            feed = self.python_feed()
        return dataclasses.replace(feed, whole=True) if self.planner.whole else feed

    def even_form(self, dataset: Any) -> Optional[str]:
        """How the PyDataset `dataset` hands a batch without padding rows to Keras
        (`bundle.even_batch`), None for the masked step: as the user's data where its
        batches may change structure (the adapter's `allow_changing_structure`), else
        with an empty packing."""
        if not self.plain_even:
            return None
        if self.adapter.allow_changing_structure(dataset, bundle.is_padded,
                                                 bundle.is_replicated):
            return bundle.PLAIN
        if self.planner.whole and not self.planner.copies and self.REPLICATES:
            # `lays_out_replicated` promised the runs that lay such a batch out (a
            # generator's are told by their packing, in one structure).
            raise RuntimeError(
                f"kerasmgpu: {type(dataset).__name__} cannot be laid out per run of "
                "batches on this Keras, though a replicated batch was planned for it; "
                "please report this with your Keras and JAX versions")
        return bundle.EMPTY_PACKING

    def tf_feed(self) -> Feed:
        """For TensorFlow's strategies (a tf.data pipeline where the input allows)."""
        raise NotImplementedError

    def python_feed(self) -> Feed:
        """For JAX, torch and Keras 2.3 (Python batches: a PyDataset or a generator)."""
        raise NotImplementedError


def num_rows(named: Mapping[str, Any]) -> int:
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


def check_inputs(x: Any, expected: InputSpecs) -> None:
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


def is_dataset(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return module.startswith("tensorflow") and hasattr(obj, "element_spec")


def is_split_dataset(obj: Any) -> bool:
    """tf.distribute's DistributedDataset (`experimental_distribute_dataset`): batches
    already split over another strategy's replicas, with none of tf.data's methods; no
    call takes it (`feeds.input_kind` refuses it)."""
    return is_dataset(obj) and not callable(getattr(obj, "enumerate", None))


def is_python_source(obj: Any) -> bool:
    return (
        inspect.isgenerator(obj)
        or (hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and not is_array_like(obj))
        or (hasattr(obj, "__next__") and hasattr(obj, "__iter__"))
    )


# `weigh(y, sample_weight)`: the sample weights Keras makes of `class_weight` for these
# rows (the adapter's `class_weigher`, Keras's own rule for the active line), or None.
Weigh = Optional[Callable[[Any, Any], Any]]


def user_weights(y: Any, sample_weight: Any, weigh: Weigh) -> Any:
    """The rows' sample weights (class weights made into them), as float."""
    if weigh is None:
        return float_weights(sample_weight)
    if y is None:
        raise bad_value("class_weight", "class weights without targets",
                        "class_weight with data that has targets (x, y)",
                        "pass the targets, or drop class_weight", raw=True)
    return float_weights(weigh(y, sample_weight))


def float_weights(weights: Any) -> Any:
    """Integer (or boolean) sample weights as float32, as Keras's loss reads them: the
    padding weights, fractions, are multiplied into them in the step."""
    def one(w: Any) -> Any:
        w = np.asarray(w)
        return w if np.issubdtype(w.dtype, np.floating) else w.astype(np.float32)

    return map_structure(one, weights, skip_none=True)


def gather(structure: Any, rows: np.ndarray) -> Any:
    """Every array of `structure` at `rows` (None stays None)."""
    return map_structure(lambda a: np.asarray(a)[rows], structure, skip_none=True)


# --- tf.data pieces ------------------------------------------------------------------------


def tf_pad(tf: Any, real: Any, planner: batching.Planner) -> Tuple[Any, Any, Any]:
    """(source rows, packed, whole) for a batch of `real` rows, planned by
    kerasmgpu.batching; `whole`: 1.0 where every process of a job feeds it whole, else
    0.0 (a float32 scalar)."""

    def plan_rows(count: Any) -> Tuple[np.ndarray, np.ndarray, np.float32]:
        share = planner.plan(int(count))  # numpy scalars come in
        return (share.source_rows(), share.packed(),
                np.float32(share.whole_in_every_process))

    rows, packed, whole = tf.numpy_function(
        plan_rows, [real], [tf.int64, tf.float32, tf.float32], stateful=False
    )
    rows.set_shape([None])
    packed.set_shape([None, batching.PACKED_COLUMNS])
    whole.set_shape([])
    return rows, packed, whole


def tf_float_weights(tf: Any, weights: Any) -> Any:
    """`float_weights` in tf.data: integer sample weights (or class weights given as ints)
    as float32."""
    if weights is None:
        return None
    return tf.nest.map_structure(
        lambda w: w if w.dtype.is_floating else tf.cast(w, tf.float32), weights)


def tf_order(tf: Any, number: Any, rows: Any) -> Any:
    count = tf.shape(rows)[0]
    batch = tf.fill([count], tf.cast(number, tf.int32))
    return tf.stack([batch, tf.range(count, dtype=tf.int32)], axis=1)


def no_autoshard(tf: Any, dataset: Any) -> Any:
    # We shard between workers ourselves (kerasmgpu.batching.shard); tf.data must not
    # shard again, or each worker would drop rows.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)
