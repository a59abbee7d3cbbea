"""Synchronized BatchNorm on Keras 2.3's multi_gpu_model: the internals it touches.

Keras's `multi_gpu_model` builds its replicas one after the other, each the whole
template applied to its slice of the batch, so a BatchNormalization layer of one replica
never sees the others' rows. `synchronized_multi_gpu_model` builds the same graph layer
by layer instead - every node of the template applied to each replica's slice in turn
(the functional model's `_nodes_by_depth`, Keras's own order) - so that a
BatchNormalization node takes all replicas' inputs at once: one mean and variance over
the whole global batch (the slices are unpadded: the last replica takes the remainder,
so every row counts), each replica normalized with them, and the layer's moving
statistics updated once with them, as on one device. The gradients flow through the
shared moments to every replica. A layer of the user's own that makes update ops
(`add_update`: a moving average, a count of rows) keeps those of the template's own
call, on the whole batch, as one device makes them (`keras23_template.keep_own_updates`).

Verified on keras 2.3.1 over TensorFlow 2.15.1 with the runtime patches of
`keras23_runtime` (`import kerasmgpu.keras23`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import keras23_slicing, keras23_template


def _slicer(keras: Any, i: int, parts: int) -> Any:
    """Keras 2.3's own slicing (multi_gpu_utils): equal parts, the last the remainder; a
    batch with fewer rows than replicas with its rows repeated (`keras23_slicing`)."""

    def get_slice(data: Any) -> Any:
        return keras23_slicing.padded_slice(data, i, parts)

    return get_slice


def _holds_batchnorm(keras: Any, layer: Any) -> bool:
    if isinstance(layer, keras.layers.BatchNormalization):
        return True
    return any(_holds_batchnorm(keras, inner) for inner in getattr(layer, "layers", None) or [])


def _nodes(keras: Any, model: Any) -> List[Any]:
    """The template's nodes in Keras's own order (deepest first), or the error."""
    by_depth = getattr(model, "_nodes_by_depth", None)
    if not getattr(model, "_is_graph_network", False) or not by_depth:
        raise bad_value(
            "sync_batchnorm", True, f"False for the subclassed {type(model).__name__} on "
            "Keras 2.3 (sync_batchnorm=True: a functional or Sequential model, whose layers "
            "are rebuilt one by one for all replicas)",
            "build the model with keras.Model(inputs, outputs) or Sequential, or leave "
            "sync_batchnorm out")
    nodes = [node for depth in sorted(by_depth, reverse=True) for node in by_depth[depth]]
    for node in nodes:
        layer = node.outbound_layer
        if hasattr(layer, "layers") and _holds_batchnorm(keras, layer):
            raise bad_value(
                "sync_batchnorm", True, f"False with a BatchNormalization inside the nested "
                f"model {layer.name!r} on Keras 2.3 (sync_batchnorm=True: BatchNormalization "
                "layers of the model itself)",
                "build the model flat (call the nested model's layers directly), or leave "
                "sync_batchnorm out")
    return nodes


def synchronized_multi_gpu_model(keras: Any, model: Any, gpus: Sequence[int],
                                 cpu_merge: bool) -> Any:
    """Keras 2.3's `multi_gpu_model(model, gpus)` with every BatchNormalization layer
    normalizing over the whole global batch (see the module doc)."""
    import tensorflow as tf

    nodes = _nodes(keras, model)
    whole = keras23_template.own_ops(keras, model)
    before = keras23_template.update_keys(model)
    synced = synchronized_layer(keras)
    parts = len(gpus)
    # Per replica: template tensor (by id) -> that replica's tensor.
    maps: List[Dict[int, Any]] = [{} for _ in gpus]
    # The replicas form one inner model, as the template does in Keras's (the template's
    # layer names are then free for the merged outputs, which keep its output names).
    own_inputs = [keras.Input(batch_shape=keras.backend.int_shape(x),
                              dtype=keras.backend.dtype(x)) for x in model.inputs]
    for i, gpu in enumerate(gpus):
        with tf.device(f"/gpu:{gpu}"), tf.name_scope(f"replica_{gpu}"):
            for x, own in zip(model.inputs, own_inputs):
                with tf.device(x.device):
                    maps[i][id(x)] = keras.layers.Lambda(
                        _slicer(keras, i, parts),
                        output_shape=keras.backend.int_shape(x)[1:])(own)
    for node in nodes:
        layer = node.outbound_layer
        if isinstance(layer, keras.layers.InputLayer):
            continue
        ins = [[m[id(t)] for t in node.input_tensors] for m in maps]
        if isinstance(layer, keras.layers.BatchNormalization):
            # The whole batch beside the slices: its rows tell the repeats apart.
            outs = [[o] for o in synced(layer, list(gpus))(
                [each[0] for each in ins] + [own_inputs[0]], **node.arguments)]
        else:
            outs = []
            for gpu, each in zip(gpus, ins):
                with tf.device(f"/gpu:{gpu}"), tf.name_scope(f"replica_{gpu}"):
                    out = layer(each[0] if len(each) == 1 else each, **node.arguments)
                outs.append(out if isinstance(out, list) else [out])
        for m, out in zip(maps, outs):
            for t, r in zip(node.output_tensors, out):
                m[id(t)] = r
    replicas = keras.Model(own_inputs, [m[id(o)] for o in model.outputs for m in maps],
                           name=f"{model.name}_replicas")
    outputs = replicas(model.inputs)
    keras23_template.keep_own_updates(model, whole, before, replicas)
    outputs = outputs if isinstance(outputs, list) else [outputs]
    with tf.device("/cpu:0" if cpu_merge else f"/gpu:{gpus[0]}"):
        merged = [keras.layers.Lambda(keras23_slicing.real_rows,
                                      output_shape=keras23_slicing.first_shape, name=name)(
            [keras.layers.concatenate(outputs[k * parts:(k + 1) * parts], axis=0,
                                      name=f"{name}_replicas"), model.inputs[0]])
                  for k, name in enumerate(_output_names(model.output_names))]
    parallel = keras.Model(model.inputs, merged)
    keras23_template.train_after_own_inputs(parallel, model, whole)
    return parallel


def _output_names(names: Sequence[str]) -> List[str]:
    """Keras 2.3's merged output names: a repeated name gets _1, _2..."""
    repeated = {n for n in names if list(names).count(n) > 1}
    seen: Dict[str, int] = {}
    out = []
    for n in names:
        if n in repeated:
            seen[n] = seen.get(n, 0) + 1
            n = f"{n}_{seen[n]}"
        out.append(n)
    return out


def synchronized_layer(keras: Any) -> Any:
    """The layer that stands for one BatchNormalization node across all replicas."""
    K = keras.backend
    import tensorflow as tf

    class SynchronizedBatchNormalization(keras.layers.Layer):
        """All replicas' inputs of one BatchNormalization node in, each normalized with
        the moments of all their rows out; its weights are the layer's own."""

        def __init__(self, norm: Any, gpus: List[int]) -> None:
            super().__init__(name=f"{norm.name}_synchronized")
            # Not tracked as a sub-layer: the weights are exposed once, below.
            self.__dict__["_norm"], self.__dict__["_gpus"] = norm, gpus

        @property
        def trainable_weights(self) -> List[Any]:
            return list(self._norm.trainable_weights)

        @property
        def non_trainable_weights(self) -> List[Any]:
            return list(self._norm.non_trainable_weights)

        def compute_output_shape(self, input_shape: Any) -> Any:
            return list(input_shape)[:-1]

        def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
            return None if mask is None else list(mask)[:-1]

        def call(self, inputs: List[Any], training: Any = None) -> List[Any]:
            # The replicas' slices, then the whole batch (its rows: a repeat of a batch
            # with fewer rows than replicas is left out of the moments).
            given, inputs, whole = inputs, list(inputs[:-1]), inputs[-1]
            batch = K.shape(whole)[0]
            norm = self._norm
            placed = [f"/gpu:{gpu}" for gpu in self._gpus]
            inference = []
            for where, x in zip(placed, inputs):
                with tf.device(where):
                    inference.append(norm.call(x, training=False))
            if isinstance(training, (bool, int)) and not training:  # static inference
                return inference
            ndim = len(K.int_shape(inputs[0]))
            axis = norm.axis % ndim
            axes = [a for a in range(ndim) if a != axis]
            shape = [1] * ndim
            shape[axis] = K.int_shape(inputs[0])[axis]
            parts = len(inputs)
            masks = [keras23_slicing.real_row_mask(x, i, parts, batch)
                     for i, x in enumerate(inputs)]
            sums, counts = [], []
            for where, x, real in zip(placed, inputs, masks):
                with tf.device(where):
                    sums.append(K.sum(x * real, axis=axes))
                    # Real rows times the entries per row and channel (none past
                    # the rows for a Dense layer's 2-D input: an empty product, 1).
                    counts.append(K.sum(real) * K.cast(tf.reduce_prod(tf.gather(
                        K.shape(x), tf.constant(axes[1:], tf.int32))), K.dtype(x)))
            rows = tf.add_n(counts)
            mean = tf.add_n(sums) / rows
            squares = []
            for where, x, real in zip(placed, inputs, masks):
                with tf.device(where):
                    squares.append(K.sum(K.square(x - K.reshape(mean, shape)) * real,
                                         axis=axes))
            variance = tf.add_n(squares) / rows
            outputs = []
            for where, x, fallback in zip(placed, inputs, inference):
                with tf.device(where):
                    normed = K.batch_normalization(
                        x, K.reshape(mean, shape), K.reshape(variance, shape),
                        None if norm.beta is None else K.reshape(norm.beta, shape),
                        None if norm.gamma is None else K.reshape(norm.gamma, shape),
                        axis=axis, epsilon=norm.epsilon)
                    outputs.append(K.in_train_phase(normed, fallback, training=training))
            # Keras 2.3's moving variance: the sample variance (its own correction).
            unbiased = variance * rows / (rows - (1.0 + norm.epsilon))
            # After every replica's output: in inference mode (learning phase 0) the
            # outputs read the moving statistics these assign, and Keras 2.3's train
            # function orders its updates after nothing (they are made here, before it
            # exists), so the session could run an assignment before a replica's read -
            # seen once in CI, a moving mean 5e-4 from one device's, under load.
            with tf.control_dependencies(outputs):
                updates = [K.moving_average_update(norm.moving_mean, mean, norm.momentum),
                           K.moving_average_update(norm.moving_variance, unbiased,
                                                   norm.momentum)]
            self.add_update(updates, given)
            return outputs

    return SynchronizedBatchNormalization
