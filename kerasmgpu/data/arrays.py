"""In-memory arrays (numpy-like, and lists/dicts of them): an index plan over the rows.

On the TensorFlow routes the arrays go through a `tf.data` index pipeline (the padding
plan comes from `kerasmgpu.batching` through `tf.numpy_function`), elsewhere through a
`PyDataset`; both read batches of the same plan (`ArrayPlan`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import numpy as np

from kerasmgpu import accumulation, batching
from kerasmgpu._errors import bad_type
from kerasmgpu.adapters import Adapter
from kerasmgpu.data.base import (
    Feed,
    Input,
    Request,
    check_inputs,
    gather,
    no_autoshard,
    num_rows,
    tf_order,
    tf_pad,
    user_weights,
)
from kerasmgpu.data.bundle import PACKING_KEY, bundle, for_share, order_key, plain
from kerasmgpu.data.structure import as_tuples, is_array_like, map_structure, to_numpy


def pad_batch(
    adapter: Adapter, x: Any, y: Any, sample_weight: Any, class_weight: Any,
    planner: batching.Planner, replicated: bool = False,
) -> Tuple[Any, Any]:
    """One in-memory batch as `(x, bundle)`, padded and packed (the *_on_batch calls).

    `replicated`: the caller lays a batch that does not divide out replicated itself
    (verify=True's one-program side); Keras's *_on_batch calls lay every batch out
    sharded, so there a whole plan without copies pads as for any model."""
    if planner.whole and not planner.copies and not replicated:
        planner = dataclasses.replace(planner, whole=False)
    x, y, sample_weight = to_numpy(x), to_numpy(y), to_numpy(sample_weight)
    weigh = adapter.class_weigher(class_weight, "batch")
    weights = user_weights(y, sample_weight, weigh)
    share = planner.plan(num_rows({"x": x, "y": y, "sample_weight": weights}))
    take = share.source_rows()
    return gather(x, take), bundle(share.packed(), gather(y, take), gather(weights, take))


class ArrayPlan:
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
        accumulate_steps: int = 1,
    ) -> None:
        self.x, self.y, self.weights = x, y, weights
        self.rows = num_rows({"x": x, "y": y, "sample_weight": weights})
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.planner = planner
        self.rng = np.random.default_rng(seed)
        self.order = np.arange(self.rows)
        self._shares: Dict[int, Tuple[batching.ProcessShard, Optional[np.ndarray]]] = {}
        self.sizes = batching.batch_sizes(self.rows, batch_size)
        self.accumulate_steps = accumulate_steps
        # With accumulation the feed is read by micro-batches (`kerasmgpu.accumulation`).
        self.micro = (accumulation.micro_batches(self.sizes, accumulate_steps)
                      if accumulate_steps > 1 else None)
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

    @property
    def steps(self) -> int:
        """Batches fed per epoch (micro-batches, fillers included, when accumulating)."""
        return len(self.sizes) if self.micro is None else len(self.micro)

    def fed_batch(self, index: int, even: Optional[str] = None) -> Tuple[Any, ...]:
        """Training batch `index` of the feed: the epoch's batch, or with accumulation its
        micro-batch, weighted for the group's optimizer step.

        With accumulation every micro-batch takes the masked step, even one without
        padding: its loss weight (the scale column) is its share of the group's real rows,
        not 1, and a filler's rows are all masked - the packing carries both.
        """
        if self.micro is None:
            return self.batch(index, False, even)
        micro = self.micro[index]
        x, packed = self.batch(micro.batch, False)
        packed = dict(packed)
        column = np.array(packed[PACKING_KEY], dtype=np.float32, copy=True)
        padded = self.planner.plan(self.sizes[micro.batch]).plan.padded
        column[:, batching.SCALE] = accumulation.group_scale(
            padded, micro.group_rows, self.accumulate_steps)
        if micro.filler:
            column[:, batching.MASK] = 0.0
        packed[PACKING_KEY] = column
        return x, packed

    def _share(self, size: int) -> Tuple[batching.ProcessShard, Optional[np.ndarray]]:
        """The plan of a batch of `size` rows and the rows it feeds (None: all of them,
        in order), planned once per size: a fit has two sizes at most."""
        found = self._shares.get(size)
        if found is None:
            share = self.planner.plan(size)
            rows = share.source_rows()
            whole = len(rows) == size and bool(np.all(rows == np.arange(size)))
            found = self._shares[size] = (share, None if whole else rows)
        return found

    def batch(self, index: int, predict: bool, even: Optional[str] = None) -> Tuple[Any, ...]:
        """Batch `index` as `(x, bundle)`; with `even` (a `bundle.even_batch` form), one
        that needs no padding as that form."""
        start = index * self.batch_size
        ids = self.order[start : start + self.batch_size]
        share, rows = self._share(len(ids))
        take = ids if rows is None else ids[rows]
        x = gather(self.x, take)
        if predict:
            return (x, bundle(share.packed(), order=order_key(index, len(take))))
        return for_share(share, len(take), x, gather(self.y, take),
                         gather(self.weights, take), even)


class ArrayBatches:
    """The batches of an `ArrayPlan` by index, as Keras reads a PyDataset / Sequence
    (the adapter's `python_dataset` hands them to Keras)."""

    def __init__(self, plan: ArrayPlan, predict: bool) -> None:
        self.plan, self.predict = plan, predict
        # How a batch without padding reaches Keras (`Input.even_form`), set once the
        # adapter made the PyDataset.
        self.even: Optional[str] = None

    def __len__(self) -> int:
        return len(self.plan.sizes) if self.predict else self.plan.steps

    def __getitem__(self, index: int) -> Any:
        if self.predict:
            return self.plan.batch(index, True)
        return self.plan.fed_batch(index, self.even)

    def on_epoch_end(self) -> None:
        self.plan.reshuffle()


def _not_an_input(x: Any) -> TypeError:
    allowed = ("numpy-like arrays (or lists/dicts of them), a tf.data.Dataset, a "
               "keras.utils.PyDataset/Sequence, or a generator")
    if not hasattr(x, "__iter__") or hasattr(x, "__getitem__"):
        return bad_type("x", f"an object of type {type(x).__qualname__}", allowed,
                        "convert the inputs to numpy arrays", raw=True)
    # A torch DataLoader (Keras 3 reads one itself): each iter() of it may read another
    # order (its sampler draws a shuffle per iterator), and nothing tells kerasmgpu which
    # order the other processes of a job read, so its batches come through a generator
    # the user makes, whose order the user states.
    return bad_type(
        "x", f"a {type(x).__qualname__}: an iterable that is neither an iterator nor "
        "indexed (a torch DataLoader is one)", allowed,
        "read it through a generator, `(batch for _ in itertools.count() for batch in "
        "loader)`, with steps_per_epoch=len(loader) (steps=len(loader) for evaluate and "
        "predict); in a job of several processes every process must read the same "
        "batches, so a shuffling loader needs generator=torch.Generator().manual_seed(S)",
        raw=True)


class Arrays(Input):
    """Numpy-like arrays (and lists/dicts of them), with targets and weights beside."""

    REPLICATES = True  # read through ArrayBatches, a PyDataset of kerasmgpu's

    def __init__(self, adapter: Adapter, planner: batching.Planner, request: Request) -> None:
        super().__init__(adapter, planner, request)
        if not is_array_like(request.x):
            raise _not_an_input(request.x)
        predict = self.predict
        x, y, sample_weight = (to_numpy(request.x), to_numpy(request.y),
                               to_numpy(request.sample_weight))
        if predict:
            y = sample_weight = None
        else:
            adapter.check_sample_weight_structure(y, sample_weight)
        weigh = None if predict else adapter.class_weigher(request.class_weight, "arrays")
        weights = None if predict else user_weights(y, sample_weight, weigh)
        check_inputs(x, request.inputs)
        size = 32 if request.batch_size is None else request.batch_size
        shuffle_rows = bool(request.shuffle) and not predict
        self.plan = ArrayPlan(x, y, weights, size, shuffle_rows, self.planner, request.seed,
                              1 if predict else request.accumulate_steps)

    def python_feed(self) -> Feed:
        plan, predict = self.plan, self.predict
        batches = ArrayBatches(plan, predict)
        data = self.adapter.python_dataset(batches)
        batches.even = self.even_form(data)
        pads, example = plan.padding()
        steps = len(plan.sizes) if predict else plan.steps
        micro = None if predict else plan.micro
        stopped = None if micro is None else (
            lambda fed: accumulation.stopped_group(micro, plan.sizes, fed,
                                                   plan.accumulate_steps))
        return Feed(data, steps=steps, pads=pads,
                    padding_example=example, stopped_group=stopped)

    def tf_feed(self) -> Feed:
        import tensorflow as tf

        plan, predict = self.plan, self.predict
        if plan.micro is not None:
            # Accumulating (Keras 3 on TF, one process): the PyDataset of micro-batches,
            # which Keras 3 reads through tf.data itself.
            return self.python_feed()

        def tensors(structure: Any) -> Any:
            return map_structure(tf.convert_to_tensor, as_tuples(structure), skip_none=True)

        x = tensors(plan.x)
        y = None if predict else tensors(plan.y)
        weights = None if predict else tensors(plan.weights)
        planner = plan.planner
        full = plan.rows // plan.batch_size
        if (self.request.parts and not predict and planner.process_count == 1
                and (full == 0 or plan.batch_size % planner.replicas == 0)):
            return self._tf_parts(tf, x, y, weights)
        # One pipeline (every batch padded, several processes, several steps per call):
        # its elements share one traced step, the plain one only when no batch of the
        # epoch needs padding. One process only: with several, the packing is what
        # gives each process its own slice of the global batch (auto-sharding is off); a
        # plain element made every tf.keras worker train on the whole global batch
        # (tests/test_distributed.py, test_every_sample_once_per_epoch, tf_keras 2.21).
        pads, example = plan.padding()
        plain_all = not predict and not pads and planner.process_count == 1
        indices = self._tf_permutation(tf).batch(plan.batch_size).enumerate()

        def fetch(number: Any, ids: Any) -> Any:
            if plain_all:
                def same(structure: Any) -> Any:
                    return map_structure(lambda t: tf.gather(t, ids), structure,
                                         skip_none=True)

                return plain(same(x), same(y), same(weights))
            rows, packed, _ = tf_pad(tf, tf.size(ids), planner)
            take = tf.gather(ids, rows)

            def pick(structure: Any) -> Any:
                return map_structure(lambda t: tf.gather(t, take), structure, skip_none=True)

            if predict:
                return pick(x), bundle(packed, order=tf_order(tf, number, rows))
            return pick(x), bundle(packed, pick(y), pick(weights))

        data = indices.map(fetch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
        return Feed(no_autoshard(tf, data), steps=len(plan.sizes), pads=pads,
                    padding_example=example)

    def _tf_permutation(self, tf: Any) -> Any:
        """The rows of an epoch in order: shuffled anew every epoch when asked (the same
        permutations in every pipeline made with the seed)."""
        indices = tf.data.Dataset.range(self.plan.rows)
        if self.plan.shuffle:
            indices = indices.shuffle(self.plan.rows, seed=self.request.seed,
                                      reshuffle_each_iteration=True)
        return indices

    def _tf_parts(self, tf: Any, x: Any, y: Any, weights: Any) -> Feed:
        """The epoch in parts, each with the static shape of its batches: the full
        batches, which divide by the replicas, as the user's data (`bundle.plain`: the
        engine's plain step, the program a one-device-style fit traces), and a last
        batch of another size - as the user's data too when it divides, else padded and
        masked - in a pipeline of its own (`Feed.tail`), which only that batch's step
        reads. A pipeline's elements share one traced step: in one pipeline a short
        batch left the batch axis unknown in every step, and a padded one put the
        masked step on every batch of the epoch. Both pipelines draw the same
        permutation of the rows each epoch."""
        plan = self.plan
        size = plan.batch_size
        full, rest = divmod(plan.rows, size)

        def part(indices: Any, rows: int) -> Any:
            share = plan.planner.plan(rows)
            if share.plan.pad:
                source = tf.constant(share.source_rows())
                packed = tf.constant(share.packed())

            def fetch(ids: Any) -> Any:
                def pick(structure: Any, take: Any) -> Any:
                    return map_structure(lambda t: tf.gather(t, take), structure,
                                         skip_none=True)

                if not share.plan.pad:
                    return plain(pick(x, ids), pick(y, ids), pick(weights, ids))
                take = tf.gather(ids, source)
                return pick(x, take), bundle(packed, pick(y, take), pick(weights, take))

            data = indices.batch(rows, drop_remainder=True).map(
                fetch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
            return no_autoshard(tf, data)

        pads, example = plan.padding()
        head = part(self._tf_permutation(tf).take(full * size), size) if full else None
        tail = part(self._tf_permutation(tf).skip(full * size), rest) if rest else None
        if head is None:
            head, tail = tail, None
        return Feed(head, steps=len(plan.sizes), pads=pads, padding_example=example, tail=tail)
