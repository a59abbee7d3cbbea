"""Keras 2.3: how a batch is sliced over the replicas, and the merged outputs cut back.

Keras's `multi_gpu_model` slices a batch into equal parts, the last replica taking the
remainder; a batch with fewer rows than replicas left the first ones an empty slice, on
which oneDNN's Conv2D fails (TensorFlow 2.15 on a CPU where oneDNN is on, as it is by
default on CPUs with AVX-512 VNNI: `Incompatible shapes`). Here such a batch is sliced
as if its rows were repeated up to one per replica, and each merged output keeps its
first rows, as many as the batch has: the loss and metrics see the batch's own rows
once, and the repeats get no gradient. Other batches are sliced as Keras slices them.

Keras backend functions only, as Keras's own `get_slice`: a Lambda's function is saved
as bytecode and loaded with the globals of keras.layers.core, where `K` is the backend.
"""

from __future__ import annotations

from typing import Any


def padded_slice(data: Any, i: int, parts: int) -> Any:
    """Keras's `get_slice` of a batch whose rows are repeated up to `parts` when it has
    fewer (`K.switch`: another batch is not copied)."""
    from keras import backend as K

    rows = K.shape(data)[0]
    data = K.switch(rows < parts,
                    lambda: K.gather(data, K.arange(0, parts) % rows), lambda: data)
    shape = K.shape(data)
    batch_size, input_shape = shape[:1], shape[1:]
    step = batch_size // parts
    size = batch_size - step * i if i == parts - 1 else step
    size = K.concatenate([size, input_shape], axis=0)
    stride = K.concatenate([step, input_shape * 0], axis=0)
    return K.slice(data, stride * i, size)


def real_rows(tensors: Any) -> Any:
    """The merged output's first rows, as many as the batch has (the inputs' rows)."""
    from keras import backend as K

    merged, inputs = tensors
    return merged[:K.shape(inputs)[0]]


def first_shape(shapes: Any) -> Any:
    return shapes[0]


def real_row_mask(x: Any, i: int, parts: int, rows: Any) -> Any:
    """1 for each row of replica `i`'s slice `x` that is one of the batch's `rows`, 0 for
    a repeat (`padded_slice`), shaped to broadcast over `x`'s other axes."""
    from keras import backend as K

    padded = K.maximum(rows, parts)
    start = (padded // parts) * i
    mask = K.cast(K.arange(0, K.shape(x)[0]) + start < rows, K.dtype(x))
    return K.reshape(mask, [-1] + [1] * (len(K.int_shape(x)) - 1))
