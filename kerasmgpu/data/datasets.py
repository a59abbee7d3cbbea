"""The user's `tf.data.Dataset`: padded by a `tf.data` map on every route.

A tf.data pipeline stays one on every backend (Keras 3 on JAX and PyTorch take it
too), so that Keras iterates it as it iterates the user's pipeline on one device.
"""

from __future__ import annotations

from typing import Any

from kerasmgpu import batching
from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.data.base import (
    Feed,
    Input,
    Request,
    no_autoshard,
    tf_float_weights,
    tf_order,
    tf_pad,
)
from kerasmgpu.data.bundle import REPLICATED_KEY, bundle
from kerasmgpu.data.structure import leaves, unpack


class Dataset(Input):
    """A `tf.data.Dataset` of batches: x, (x, y) or (x, y, sample_weight)."""

    # Handed to Keras as a pipeline (Keras 3 on JAX); in a job every batch marked where
    # one may go whole (`tf_feed`).
    REPLICATES_ALONE = True

    def __init__(self, adapter: Adapter, planner: batching.Planner, request: Request) -> None:
        super().__init__(adapter, planner, request)
        dataset = request.x
        refuse_unbatched(dataset, request.inputs)
        if planner.process_count > 1:
            refuse_unseeded_shuffle(dataset, planner.process_count)
        map_fn = None if self.predict else adapter.class_weight_map_fn(request.class_weight)
        if map_fn is not None:
            # What Keras's fit does to a dataset for class_weight, before we pad it.
            dataset = dataset.map(map_fn)
        self.dataset = dataset

    def python_feed(self) -> Feed:
        return self.tf_feed()

    def tf_feed(self) -> Feed:
        import tensorflow as tf

        planner, predict, dataset = self.planner, self.predict, self.dataset
        # A job feeding a short batch whole in every process (one program, JAX): a
        # pipeline's structure cannot change, so every batch carries the mark.
        marks = planner.whole and not planner.copies and planner.process_count > 1

        def pad(number: Any, data: Any) -> Any:
            x, y, sw = unpack(data)
            real = tf.shape(leaves(x)[0])[0]
            rows, packed, whole = tf_pad(tf, real, planner)

            def gather(structure: Any) -> Any:
                return None if structure is None else tf.nest.map_structure(
                    lambda t: tf.gather(t, rows), structure)

            if predict:
                return gather(x), bundle(packed, order=tf_order(tf, number, rows))
            out = bundle(packed, gather(y), gather(tf_float_weights(tf, sw)))
            if marks:
                out[REPLICATED_KEY] = tf.fill([tf.shape(rows)[0], 1], whole)
            return gather(x), out

        data = dataset.enumerate().map(pad, num_parallel_calls=tf.data.AUTOTUNE,
                                       deterministic=True)
        steps = None
        cardinality = int(dataset.cardinality())
        if cardinality == 0:
            raise bad_value("x", "an empty tf.data.Dataset (0 batches)", "at least one batch",
                            "check the pipeline (a filter, take() or "
                            "batch(drop_remainder=True) may have left nothing)", raw=True)
        if cardinality >= 0:
            steps = cardinality
        return Feed(no_autoshard(tf, data.prefetch(tf.data.AUTOTUNE)), steps=steps,
                    per_epoch_iterators=True)


def refuse_unseeded_shuffle(dataset: Any, processes: int) -> None:
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


def refuse_unbatched(dataset: Any, inputs: Any) -> None:
    """A dataset of single samples (no `.batch()`): each element's inputs have one axis
    less than the model's, and kerasmgpu would split a sample's first feature axis over
    the replicas as if it were rows."""
    if not inputs:
        return
    spec = getattr(dataset, "element_spec", None)
    if isinstance(spec, (tuple, list)) and len(spec) > 3:
        return  # not x / (x, y) / (x, y, w): Keras's own message says so
    x = unpack(spec)[0]
    found = [getattr(getattr(leaf, "shape", None), "rank", None) for leaf in leaves(x)]
    ranks = sorted(int(rank) for rank in found if rank is not None)
    expected = sorted(len(shape) - 1 for _, shape in inputs)
    if not ranks or ranks != expected:
        return
    shapes = [tuple(leaf.shape) for leaf in leaves(x)]
    raise bad_value(
        "x", f"an unbatched tf.data.Dataset (elements of shape {shapes}; the model takes "
        f"{[tuple(shape) for _, shape in inputs]}, batch axis first)",
        "a dataset of batches, as Keras takes", "call `dataset.batch(batch_size)` before "
        "passing it (kerasmgpu splits each batch over the replicas)", raw=True)
