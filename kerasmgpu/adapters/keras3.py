"""Keras 3 (TensorFlow, JAX and PyTorch backends): every internal kerasmgpu touches.

Verified on the releases of `env.versions.KERAS3_VERIFIED` (the tox matrix runs the
oldest, a middle and the newest: 3.3, 3.8, 3.15). What is read or wrapped here:

* `model._compile_loss` (a `CompileLoss`): its `call` is wrapped on the instance so
  the padding weights join the sample weight of every compiled loss; its `metrics` are
  the per-output loss trackers (3.5+; absent before, so `getattr(..., [])`).
* `model._compile_metrics` (a `CompileMetrics`): its `update_state` is wrapped on the
  instance, and its `metrics` (public property) lists the metrics it builds lazily.
* `model._loss_tracker`: the `Mean` every backend's step updates with the fed rows.
* `layer._losses`: losses added by a call (`add_loss`), as opposed to regularizers; on
  JAX, where a stateless step leaves none there, the public `add_loss` of every layer is
  wrapped on the instance to notice them (`has_call_time_losses`).
* `keras.src.utils.rng_utils.get_random_seed`: whether the user seeded Keras.
* `keras.src.trainers.data_adapters`: `data_adapter_utils.class_weight_to_sample_weights`
  and `tf_dataset_adapter.make_class_weight_map_fn`, Keras's own `class_weight` rule;
  `generator_data_adapter.peek_and_restore` and `NUM_BATCHES_FOR_TENSOR_SPEC`, the
  batches every new iterator of a generator starts with (`generator_replays`).
* optimizers on TF: `_backend_apply_gradients`, `_all_reduce_sum_gradients` (see
  `reduce_gradients_first`; with accumulate_steps also the public `apply`, wrapped on
  the instance); models on TF: `_maybe_symbolic_build`, given an element spec
  (`build_without_peeking`), and with accumulate_steps `make_train_function` /
  `train_function` (`accumulate_by_calls`).
* `CompileLoss._flat_losses` ((path, loss, weight, name), 3.3-3.15): each loss's `call`
  is wrapped on the instance, so that the padding weight is shaped like its values and a
  masked mean divides by one device's count (`steps.loss_values`); for that the mask
  `Loss.__call__` applies is read with `keras.src.backend.get_keras_mask` (and the
  values' mask put back with `set_keras_mask`). Metrics get the padding mask as a weight.
* verify=True: the public `stateless_call` / `stateless_compute_loss` (TF, torch) and
  the JAX trainer's `compute_loss_and_updates`; nothing they return is assigned.
* change tokens (`state_reader`): `variable._value`, the backend value the public
  `value` returns (outside an autocast or stateless scope, where it is a copy) - a JAX
  array, replaced by every assign, or a torch tensor, whose `_version` counts in-place
  writes; on TensorFlow a hash of the tf.Variable (`tensorflow.value_hasher`).
* `model._compile_config`: a new object at every `compile()` (3.3+).
* `optimizer._distribution_strategy`: the tf.distribute strategy it was created under.
* `BackupAndRestore` (the same in the sources of 3.3, 3.8, 3.10, 3.12 and 3.15; run
  on 3.15): `_save_model` (wrapped on the instance: a backup
  kerasmgpu follows, a save at SIGTERM), the paths it writes and `_load_model` reads,
  `_weights_path` and `_training_metadata_path` (pointed into a generation directory
  while it saves, and at the generation a resume restores), and its position counters
  `_current_epoch`, `_last_batch_seen`, `_batches_seen_since_last_saving` (set after a
  mid-epoch resume: Keras restores only the epoch and would record epoch 0 in its next
  backup).
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import tensorflow as tf_internals
from kerasmgpu.adapters.base import (
    COMPILE_KEYS,
    HOOKED,
    Adapter,
    Held,
    StateReader,
    class_weight_error,
    following_save,
)
from kerasmgpu.env.versions import (
    KERAS3_ACCUMULATION_COUNTS_STEPS,
    KERAS3_TF_ACTIVITY_LOSS_AS_ONE_DEVICE,
)
from kerasmgpu.registry import verified_range


class Keras3(Adapter):
    LABEL = "Keras"
    DIST = "keras"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        span = verified_range(self.line, self.backend)
        assert span is not None
        self.VERIFIED = span

    @property
    def stateless_steps(self) -> bool:
        return self.backend == "jax"

    @property
    def identity_tokens(self) -> bool:
        return self.backend in ("jax", "torch")  # see state_reader

    @property
    def weights_follow_output_rank(self) -> bool:
        # Keras 3 multiplies a (batch,) sample weight into the loss values as they are:
        # a per-element loss of shape (batch, 4) does not broadcast against it (tf.keras
        # weights per row). A (batch, 1, ...) weight broadcasts against both, and Keras
        # squeezes it where the loss values have one axis less.
        return True

    def is_compiled(self, model: Any) -> bool:
        return bool(getattr(model, "compiled", False))

    def compile_args(self, model: Any) -> Dict[str, Any]:
        config = getattr(getattr(model, "_compile_config", None), "config", None)
        if not isinstance(config, dict):
            raise self.fail("a compiled model has no `_compile_config.config`",
                            f"found {type(getattr(model, '_compile_config', None)).__name__}")
        args = {k: v for k, v in config.items() if k in COMPILE_KEYS}
        args["optimizer"] = getattr(model, "optimizer", None) or args.get("optimizer")
        return args

    def clone_model(self, model: Any) -> Any:
        # Keras 3.9+ compile a functional clone from the model's *serialized* compile
        # config (models/cloning.py), which fails for losses and metrics that do not
        # serialize (a local function) - and kerasmgpu compiles the copy itself, with the
        # live objects. Clone the model as if uncompiled.
        compiled = bool(getattr(model, "compiled", False))
        if not compiled:
            return super().clone_model(model)
        model.compiled = False
        try:
            return super().clone_model(model)
        finally:
            model.compiled = compiled

    def build_like(self, clone: Any, model: Any) -> None:
        clone.build_from_config(model.get_build_config())

    def copy_layer(self, layer: Any) -> Any:
        # A Lambda's config holds its function as bytecode, which Keras 3's safe mode
        # refuses to load (and plain clone_model with it): the copy calls the very
        # function the template calls. `_output_shape` (read in the 3.15 source) is what the layer
        # was given, a shape, a function or None.
        lambda_layer = self.keras.layers.Lambda
        if type(layer) is lambda_layer and hasattr(layer, "_output_shape"):
            config = layer.get_config()
            kwargs = {k: config[k] for k in ("name", "dtype", "trainable") if k in config}
            return lambda_layer(layer.function, output_shape=layer._output_shape,
                                mask=layer.mask, arguments=dict(layer.arguments), **kwargs)
        copy = super().copy_layer(layer)
        # Keras 3.3 - 3.7 leave `activity_regularizer` out of `Layer.get_config()` (3.8
        # put it in): the copy trained without the layer's activity loss (History 3.6
        # against 22.0 on one device, 3.3 on JAX). A regularizer holds no state.
        regularizer = getattr(layer, "activity_regularizer", None)
        if regularizer is not None and getattr(copy, "activity_regularizer", None) is None:
            copy.activity_regularizer = regularizer
        return copy

    # --- class_weight ---------------------------------------------------------------------

    def _data_adapters(self, name: str) -> Any:
        try:
            return importlib.import_module(f"keras.src.trainers.data_adapters.{name}")
        except ImportError as exc:
            raise self.fail(f"`keras.src.trainers.data_adapters.{name}` is missing",
                            "Keras's class_weight rule") from exc

    def check_sample_weight_structure(self, y: Any, sample_weight: Any) -> None:
        # Keras 3 (3.3 - 3.15, `ArrayDataAdapter`): a list, tuple or dict of sample
        # weights must have the structure of the targets (one array per output).
        if not isinstance(sample_weight, (list, tuple, dict)):
            return
        try:
            self.keras.tree.assert_same_structure(y, sample_weight)
        except (ValueError, TypeError) as exc:
            shown = (sorted(sample_weight) if isinstance(sample_weight, dict)
                     else f"{len(sample_weight)} arrays")
            raise bad_value(
                "sample_weight", f"weights for {shown}",
                "one sample_weight array per output in y, in y's structure (Keras 3 refuses "
                "others)", "give every output a weight (ones where it has none)",
                raw=True) from exc

    def generator_replays(self) -> int:
        # Keras 3.4+ (`generator_data_adapter.peek_and_restore` returns a function; 3.3
        # returns one chain): every iterator Keras makes of a generator's dataset starts
        # with the first `NUM_BATCHES_FOR_TENSOR_SPEC` batches it peeked, then reads on
        # (checked in the sources of 3.3, 3.10, 3.12 and 3.15; measured on 3.15).
        adapter = self._data_adapters("generator_data_adapter")
        peek = getattr(adapter, "peek_and_restore", None)
        count = getattr(self._data_adapters("data_adapter_utils"),
                        "NUM_BATCHES_FOR_TENSOR_SPEC", None)
        if peek is None or not isinstance(count, int):
            raise self.fail("`peek_and_restore` or `NUM_BATCHES_FOR_TENSOR_SPEC` is missing",
                            "how Keras reads a generator again")
        _, restore = peek(iter(()))
        return count if callable(restore) else 0

    def class_weigher(self, class_weight: Any, kind: str
                      ) -> Optional[Callable[[Any, Any], Any]]:
        # Keras 3 (3.3 - 3.15): `class_weight_to_sample_weights` gives a class the dict
        # does not list weight 1; arrays and PyDatasets refuse sample weights beside it,
        # arrays a nested target; generators refuse class_weight (`get_data_adapter`).
        if class_weight is None:
            return None
        if kind == "generator":
            raise class_weight_error(
                class_weight, "arrays, a tf.data.Dataset or a PyDataset: Keras 3 takes no "
                "class_weight with a Python generator",
                "yield (x, y, sample_weight) batches, or read the data through a "
                "keras.utils.PyDataset")
        to_weights = getattr(self._data_adapters("data_adapter_utils"),
                             "class_weight_to_sample_weights", None)
        if to_weights is None:
            raise self.fail("`class_weight_to_sample_weights` is missing", "class_weight")

        def weigh(y: Any, sample_weight: Any) -> Any:
            if sample_weight is not None:
                raise class_weight_error(
                    class_weight, "`class_weight` or `sample_weight`, not both (Keras 3 "
                    "refuses both at once)", "fold the class weights into `sample_weight`")
            if kind == "arrays" and isinstance(y, (list, tuple, dict)):
                raise class_weight_error(
                    class_weight, "a model with a single output (one target array)",
                    "weight each output's samples with `sample_weight` instead")
            return to_weights(y, class_weight)

        return weigh

    def class_weight_map_fn(self, class_weight: Any) -> Optional[Callable[..., Any]]:
        if class_weight is None:
            return None
        make = getattr(self._data_adapters("tf_dataset_adapter"), "make_class_weight_map_fn",
                       None)
        if make is None:
            raise self.fail("`make_class_weight_map_fn` is missing", "class_weight")
        map_fn: Callable[..., Any] = make(class_weight)
        return map_fn

    # --- ops ------------------------------------------------------------------------------

    def to_float(self, x: Any, like: Any = None) -> Any:
        ops = self.keras.ops
        dtype = getattr(like, "dtype", None) or "float32"
        return ops.cast(x, dtype)

    def multiply(self, a: Any, b: Any) -> Any:
        return self.keras.ops.multiply(a, b)

    def expand_to_rank(self, w: Any, rank: int) -> Any:
        ops = self.keras.ops
        while len(w.shape) < rank:
            w = ops.expand_dims(w, -1)
        return w

    def broadcast_like(self, w: Any, like: Any, rank: int) -> Any:
        ops = self.keras.ops
        # A new tensor, not a broadcast view: Keras writes into it in place (torch).
        return ops.multiply(self.expand_to_rank(w, rank),
                            ops.ones(ops.shape(like)[:rank], dtype=w.dtype))

    def unscale_for_replicas(self, loss: Any) -> Any:
        # Keras 3 on TensorFlow divides every loss by the replica count inside a
        # tf.distribute replica (losses/loss.py scale_loss_for_distribution; its own
        # steps multiply back before tracking). JAX and torch see global values.
        if self.backend != "tensorflow":
            return loss
        import tensorflow as tf

        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return loss * tf.cast(replicas, loss.dtype) if replicas > 1 else loss

    def loss_reading_as_one_device(self, loss: Any) -> Any:
        # The value of `unscale_for_replicas`, the gradient of the scaled loss: what the
        # replicas' gradients sum to stays one device's gradient.
        if self.backend != "tensorflow" or loss is None:
            return loss
        import tensorflow as tf

        return loss + tf.stop_gradient(self.unscale_for_replicas(loss) - loss)

    # --- hooks -----------------------------------------------------------------------------

    def _compile_loss(self, model: Any) -> Any:
        return getattr(model, "_compile_loss", None)

    def install_loss_hook(self, model: Any, hook: Callable[[Any, Any, Any], Any],
                          values: Optional[Callable[[Any, Any, Any], Any]] = None) -> None:
        if self.backend == "jax":
            self._watch_add_loss(model)
        container = self._compile_loss(model)
        if container is None:
            return  # compiled without a loss: only add_loss terms, nothing to weight
        if getattr(container, HOOKED, False):
            container.__dict__[HOOKED + "_fn"] = hook
            return
        original = getattr(container, "call", None)
        if original is None or not callable(original):
            raise self.fail("`CompileLoss.call` is missing", type(container).__name__)

        def call(y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
            current = container.__dict__[HOOKED + "_fn"]
            if values is not None and getattr(container, "built", True):
                self._hook_loss_values(container, values)
            return original(y_true, y_pred, current(y_true, y_pred, sample_weight))

        if values is not None and callable(getattr(container, "build", None)):
            # The losses to weigh exist once Keras has built the container, which it
            # does inside `call`, after it matched y_true to y_pred (3.8+: targets keyed
            # by output name for list outputs). Built here on the raw targets, it failed
            # on them; so the values are hooked right after Keras's own build.
            build = container.build

            def build_then_hook(*args: Any, **kwargs: Any) -> Any:
                out = build(*args, **kwargs)
                self._hook_loss_values(container, values)
                return out

            container.__dict__["build"] = build_then_hook
        container.__dict__["call"] = call
        container.__dict__[HOOKED + "_fn"] = hook
        container.__dict__[HOOKED] = True

    def _hook_loss_values(self, container: Any, loss_values: Callable[..., Any]) -> None:
        """Wrap `call` of every loss `CompileLoss` built (`_flat_losses`: (path, loss,
        weight, name), 3.3-3.15) so that `steps.loss_values` sees the values it reduces
        and the mask `Loss.__call__` will apply (`y_pred`'s and the values' Keras masks,
        `keras.src.backend.get_keras_mask`, anded as `Loss.__call__` does)."""
        try:
            from keras.src.backend import get_keras_mask, set_keras_mask
        except ImportError:
            # Breakpoint: before the masking helpers (3.3 verified; 3.8 has them), a
            # Keras mask is the tensor attribute `_keras_mask`, which 3.3's
            # `Loss.__call__` reads with getattr.
            def get_keras_mask(x: Any) -> Any:
                return getattr(x, "_keras_mask", None)

            def set_keras_mask(x: Any, mask: Any) -> None:
                x._keras_mask = mask

        entries = getattr(container, "_flat_losses", None)
        if entries is None:
            # Breakpoint: 3.3 (verified) keeps the built losses as `flat_losses`, a list
            # of Loss objects (None for an output without a loss); 3.8+ as tuples.
            entries = getattr(container, "flat_losses", None)
        for entry in entries or []:
            loss = entry[1] if isinstance(entry, (tuple, list)) and len(entry) > 1 else entry
            if loss is None or getattr(loss, HOOKED, False):
                continue
            if not callable(getattr(loss, "call", None)):
                # The padding weight is applied in the loss's values only: a loss that
                # cannot be wrapped would count the padding rows, silently.
                raise self.fail("a compiled loss has no call() to weigh its values",
                                type(loss).__name__)
            loss.__dict__["call"] = self._values_call(
                loss, loss.call, (get_keras_mask, set_keras_mask), loss_values)
            loss.__dict__[HOOKED] = True

    def _values_call(self, loss: Any, original: Callable[..., Any], masking: Any,
                     loss_values: Any) -> Callable[..., Any]:
        get_mask, set_mask = masking

        def call(y_true: Any, y_pred: Any) -> Any:
            values = original(y_true, y_pred)
            masks = [m for m in (get_mask(y_pred), get_mask(values)) if m is not None]
            mask = masks[0] if len(masks) == 1 else (
                self.keras.ops.logical_and(*masks) if masks else None)
            out = loss_values(values, mask, getattr(loss, "reduction", None))
            if out is not values and get_mask(values) is not None:
                set_mask(out, get_mask(values))  # Loss.__call__ reads it back
            return out

        return call

    @property
    def weights_in_loss_values(self) -> bool:
        return True

    @property
    def counts_per_replica(self) -> bool:
        return self.backend in ("tensorflow", "torch")

    @property
    def whole_batch_on_batch(self) -> bool:
        # Keras 3 on TF (3.10 - 3.15): `train_on_batch` / `test_on_batch` run the step
        # through `strategy.run` on their arguments as they are, one whole batch per
        # replica; a replica's metric updates then counted it N times, which Keras 3.10 -
        # 3.12, whose *_on_batch keep the state a fit left behind, added to fit's counts.
        return self.backend == "tensorflow"

    def replica_share(self, structures: Any) -> Any:
        if self.backend != "tensorflow":
            return structures
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return structures
        replicas = context.num_replicas_in_sync
        replica = context.replica_id_in_sync_group

        def share(t: Any) -> Any:
            rows = tf.shape(t)[0] // replicas
            return t[rows * replica:rows * (replica + 1)]

        return tuple(None if s is None else tf.nest.map_structure(share, s)
                     for s in structures)

    def flat_metric_results(self, model: Any, logs: Dict[str, Any]) -> Any:
        # `Trainer._flatten_metrics_in_order` (3.3 - 3.15): what *_on_batch return.
        flatten = getattr(model, "_flatten_metrics_in_order", None)
        if flatten is None:
            raise self.fail("`Trainer._flatten_metrics_in_order` is missing",
                            "the order of the *_on_batch results")
        return flatten(logs)

    def total(self, x: Any) -> Any:
        return self.keras.ops.sum(x)

    def count_ratio(self, a: Any, b: Any) -> Any:
        return self.keras.ops.divide_no_nan(a, b)

    def replica_mean(self, x: Any) -> Any:
        if self.backend == "tensorflow":
            import tensorflow as tf

            context = tf.distribute.get_replica_context()
            if context is None or context.num_replicas_in_sync == 1:
                return x
            return context.all_reduce(tf.distribute.ReduceOp.MEAN, x)
        if self.backend == "torch":
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
                return x
            total = x.detach().clone()
            dist.all_reduce(total)
            return total / dist.get_world_size()
        return x

    def install_metrics_hook(self, model: Any, on_metric: Callable[[Any], None]) -> None:
        container = getattr(model, "_compile_metrics", None)
        if container is None:
            return
        container.__dict__[HOOKED + "_fn"] = on_metric
        if getattr(container, HOOKED, False):
            return
        original = container.update_state

        def update_state(y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
            if not container.built:
                # Built lazily from the first batch; build now so that the metrics it
                # makes can be hooked before this very update.
                container.build(y_true, y_pred)
            for metric in self.inner_metrics(container):
                container.__dict__[HOOKED + "_fn"](metric)
            return original(y_true, y_pred, sample_weight)

        container.__dict__["update_state"] = update_state
        container.__dict__[HOOKED] = True

    def inner_metrics(self, metric: Any) -> List[Any]:
        inner = getattr(metric, "metrics", None)
        if isinstance(inner, (list, tuple)):
            flat: List[Any] = []
            for m in inner:
                nested = self.inner_metrics(m)
                flat.extend(nested if nested else [m])
            return [m for m in flat if m is not None]
        return []

    def loss_trackers(self, model: Any) -> List[Any]:
        trackers = []
        total = getattr(model, "_loss_tracker", None)
        if total is not None:
            trackers.append(total)
        container = self._compile_loss(model)
        if container is not None:
            # Per-output loss trackers (Keras >= 3.5); they exist once the container is
            # built, which fit's symbolic build does before the first step.
            trackers.extend(list(getattr(container, "metrics", None) or []))
        return trackers

    def has_call_time_losses(self, model: Any) -> bool:
        # On JAX a stateless step collects the added losses in its scope and leaves no
        # `_losses` behind: an activity regularizer is seen on the layer, an `add_loss`
        # by the wrapper `_watch_add_loss` put on every layer.
        for layer in [model, *model._flatten_layers(include_self=False)]:
            if getattr(layer, "_losses", None) or getattr(layer, "activity_regularizer",
                                                          None) is not None:
                return True
        return bool(model.__dict__.get(HOOKED + "_added_loss"))

    def _watch_add_loss(self, model: Any) -> None:
        for layer in [model, *model._flatten_layers(include_self=False)]:
            original = getattr(layer, "add_loss", None)
            if original is None or layer.__dict__.get(HOOKED + "_add_loss"):
                continue

            def add_loss(loss: Any, _original: Any = original) -> Any:
                model.__dict__[HOOKED + "_added_loss"] = True
                return _original(loss)

            layer.__dict__["add_loss"] = add_loss
            layer.__dict__[HOOKED + "_add_loss"] = True

    def check_internals(self, model: Any) -> None:
        if not self.is_compiled(model):
            return
        if getattr(model, "_loss_tracker", None) is None:
            raise self.fail("a compiled model has no `_loss_tracker`",
                            "the loss Mean that Keras weights by fed rows")
        container = self._compile_loss(model)
        if container is not None and not callable(getattr(container, "call", None)):
            raise self.fail("`_compile_loss.call` is missing", type(container).__name__)
        if not hasattr(model, "_compile_metrics"):
            raise self.fail("a compiled model has no `_compile_metrics`", "CompileMetrics")
        if not hasattr(model, "_flatten_layers"):
            raise self.fail("models have no `_flatten_layers`", "layer traversal")

    # --- the training state -------------------------------------------------------------

    def _backend_values(self, variables: List[Any]) -> List[Any]:
        if any(not hasattr(v, "_value") for v in variables):
            raise self.fail("a variable has no `_value`", "the backend value of a Variable")
        return variables

    def mask_batch_statistics(self, model: Any, row_mask: Callable[[], Any],
                              every: bool = True) -> bool:
        # Public since Keras 3.0: `BatchNormalization.call(inputs, training, mask)` takes
        # the moments over the rows the mask keeps (`_moments` with a mask, 3.3 - 3.15)
        # and updates the moving statistics with them, as one device does with its rows.
        ops = self.keras.ops
        norm = self.keras.layers.BatchNormalization
        for layer in self.layers_of(model):
            if not isinstance(layer, norm) or layer.__dict__.get(HOOKED + "_moments"):
                continue
            if not every and not getattr(layer, "synchronized", False):
                continue

            def call(inputs: Any, training: Any = None, mask: Any = None,
                     _original: Any = layer.call) -> Any:
                rows = row_mask() if training else None
                if rows is not None:
                    shape = ops.shape(inputs)
                    rows = ops.reshape(ops.cast(rows, inputs.dtype),
                                       (-1,) + (1,) * (len(shape) - 2))
                    rows = ops.broadcast_to(rows, shape[:-1])
                    if mask is not None:
                        rows = rows * ops.cast(mask, inputs.dtype)
                    mask = rows
                return _original(inputs, training=training, mask=mask)

            layer.__dict__["call"] = call
            if self.backend == "tensorflow":
                layer.__dict__["_moments"] = self._synchronized_moments(layer)
            elif self.backend == "torch":
                layer.__dict__["_moments"] = self._torch_synchronized_moments(layer)
            else:
                layer.__dict__["_moments"] = self._idle_keeps_moving(layer)
            layer.__dict__[HOOKED + "_moments"] = True
        return True

    def _idle_keeps_moving(self, layer: Any,
                           original: Optional[Callable[[Any, Any], Any]] = None
                           ) -> Callable[[Any, Any], Any]:
        """`BatchNormalization._moments(inputs, mask)` that, for a batch whose mask keeps
        no row (an accumulation filler: one device never runs it), returns the moving
        mean and variance, so the moving averages stay as they are. The mask must be the
        whole global batch's (JAX's one program, or one process/replica)."""
        ops = self.keras.ops
        original = original or getattr(layer, "_moments", None)
        if not callable(original):
            raise self.fail("`BatchNormalization._moments` is missing", "synchronized BatchNorm")

        def moments(inputs: Any, mask: Any) -> Any:
            mean, variance = original(inputs, mask)
            if mask is None:
                return mean, variance
            return self._kept_moving(layer, ops.sum(ops.cast(mask, inputs.dtype)),
                                     mean, variance)

        return moments

    def _kept_moving(self, layer: Any, count: Any, mean: Any, variance: Any) -> Any:
        """(mean, variance), or the layer's moving ones where `count` (kept rows) is 0."""
        ops = self.keras.ops
        empty = count <= 0

        def kept(moving: Any, value: Any) -> Any:
            return ops.where(empty, ops.reshape(ops.cast(moving, value.dtype),
                                                ops.shape(value)), value)

        return kept(layer.moving_mean, mean), kept(layer.moving_variance, variance)

    def _synchronized_moments(self, layer: Any) -> Callable[[Any, Any], Any]:
        """`BatchNormalization._moments(inputs, mask)` over every replica's kept rows.

        Under tf.distribute each replica holds its shard (`tensorflow.replica_moments`).
        Keras's own `synchronized=True` keeps the padding rows in.
        Verified on Keras 3.10 - 3.15 (`_moments`, `_reduction_axes`).
        """
        import tensorflow as tf

        original = getattr(layer, "_moments", None)
        if not callable(original) or not hasattr(layer, "_reduction_axes"):
            raise self.fail("`BatchNormalization._moments` / `_reduction_axes` is missing",
                            "synchronized BatchNorm")

        def moments(inputs: Any, mask: Any) -> Any:
            context = tf.distribute.get_replica_context()
            if context is None:
                return original(inputs, mask)
            mean, variance = tf_internals.replica_moments(
                context, inputs, mask, layer._reduction_axes,
                idle=(layer.moving_mean, layer.moving_variance))
            return tf.squeeze(mean), tf.squeeze(variance)

        return moments

    def _torch_synchronized_moments(self, layer: Any) -> Callable[[Any, Any], Any]:
        """`BatchNormalization._moments(inputs, mask)` over every process's kept rows.

        On torch each process holds its shard of the global batch: the masked sums and
        row count are all-reduced, then the masked squared deviations from the global
        mean (two passes, as one device's moments). The all-reduce is torch's
        differentiable one (`torch.distributed.nn.functional.all_reduce`, whose backward
        all-reduces the gradients), so every process's gradient also carries what its rows
        did to the other processes' losses through the shared statistics, and the
        averaged gradient is one device's. Verified on Keras 3.3 and 3.15 (`_moments`,
        `_reduction_axes`).
        """
        import torch
        import torch.distributed as dist
        from torch.distributed.nn.functional import all_reduce

        original = getattr(layer, "_moments", None)
        if not callable(original) or not hasattr(layer, "_reduction_axes"):
            raise self.fail("`BatchNormalization._moments` / `_reduction_axes` is missing",
                            "synchronized BatchNorm")
        alone = self._idle_keeps_moving(layer, original)

        def moments(inputs: Any, mask: Any) -> Any:
            if not (dist.is_available() and dist.is_initialized()):
                return alone(inputs, mask)
            axes = tuple(layer._reduction_axes)
            # No mask: a step without padding rows (every row counts), still synchronized.
            kept = torch.ones_like(inputs) if mask is None else (
                mask.unsqueeze(-1).expand_as(inputs).to(inputs.dtype))
            total = all_reduce(torch.stack([
                torch.sum(inputs * kept, dim=axes, keepdim=True),
                torch.sum(kept, dim=axes, keepdim=True)]))
            count = torch.clamp(total[1], min=1.0)  # a channel without rows: 0, not nan
            mean = total[0] / count
            squares = all_reduce(
                torch.sum(torch.square(inputs - mean) * kept, dim=axes, keepdim=True))
            # A filler (no kept row in any process) leaves the moving statistics alone.
            return self._kept_moving(layer, torch.squeeze(total[1]), torch.squeeze(mean),
                                     torch.squeeze(squares / count))

        return moments

    def own_accumulation(self, optimizer: Any) -> int:
        return int(getattr(optimizer, "gradient_accumulation_steps", None) or 1)

    # Keras 3.3 - 3.7: the optimizers whose update does not read `iterations` (measured
    # exact on 3.3 against one device at k*B; SGD with momentum too).
    _STEPLESS = ("SGD", "RMSprop")

    @property
    def _accumulation_counts_steps(self) -> bool:
        """Whether this Keras's `iterations` counts optimizer steps when it accumulates
        (env/versions.py KERAS3_ACCUMULATION_COUNTS_STEPS; an unknown version: newest)."""
        return self.version is None or self.version >= KERAS3_ACCUMULATION_COUNTS_STEPS

    def strategy_loss_problem(self, model: Any) -> Optional[str]:
        """Keras 3 on TF before 3.15: layers with an activity regularizer, whose loss a
        tf.distribute strategy computes otherwise than one device
        (env/versions.py KERAS3_TF_ACTIVITY_LOSS_AS_ONE_DEVICE)."""
        if (self.backend != "tensorflow" or self.version is None
                or self.version >= KERAS3_TF_ACTIVITY_LOSS_AS_ONE_DEVICE):
            return None
        named = [f"{layer.name!r}" for layer in self.layers_of(model)
                 if getattr(layer, "activity_regularizer", None) is not None]
        if not named:
            return None
        return (f"layers {', '.join(named)} with an activity_regularizer on Keras "
                f"{self.version} with TensorFlow")

    def accumulation_problem(self) -> Optional[str]:
        return None  # 3.3+; before 3.8 per optimizer (optimizer_accumulation_problem)

    def steps_per_epoch_accumulation_problem(self) -> Optional[str]:
        # Measured on 3.3: given steps_per_epoch, fit on arrays trains on batches 1 .. s
        # (the first is read and left out); accumulating, that batch is a micro-batch,
        # so every group would start one micro-batch late. 3.8+ trains on 0 .. s-1.
        if self._accumulation_counts_steps:
            return None
        return (f"Keras {self.version} leaves the first batch of an epoch out when given "
                "steps_per_epoch, which with accumulate_steps is one micro-batch of a "
                "group, not one device's batch of k*B (Keras >= 3.8 does not)")

    def optimizer_accumulation_problem(self, optimizer: Any) -> Optional[str]:
        # Before 3.8 (3.3 measured) `iterations` is the micro-batch counter (3.8+: steps,
        # `_iterations // k`), and Adam's bias correction (Adamax, Nadam, Adafactor) and
        # EMA read it: k times one device's step count there. An update that does not
        # read it is one device's.
        # It also clips and decays the weights at every micro-batch (3.8+: the group's
        # gradient, once per step).
        if self._accumulation_counts_steps:
            return None
        name = type(optimizer).__name__
        stepless = any(type(optimizer) is getattr(self.keras.optimizers, each, None)
                       for each in self._STEPLESS)
        per_micro = [f"{option}={getattr(optimizer, option)}" for option in (
            "clipnorm", "clipvalue", "global_clipnorm", "weight_decay", "use_ema")
            if getattr(optimizer, option, None)]
        if stepless and not per_micro:
            return None
        why = (f"it clips, decays or averages ({', '.join(per_micro)}) each micro-batch"
               if stepless else f"{name}'s update reads `iterations` (Adam's bias "
               "correction), which counts micro-batches here")
        return (f"on Keras {self.version} {why}, not once per optimizer step as one device "
                f"at k*B (Keras >= 3.8 does; here {' and '.join(self._STEPLESS)} without "
                "clipping, weight decay or EMA accumulate exactly)")

    def accumulate_gradients(self, optimizer: Any, steps: int) -> bool:
        if self.backend == "tensorflow":
            return self._accumulate_on_tensorflow(optimizer, steps)
        # Public since Keras 3.3: the accumulators are made when the optimizer is built,
        # and `iterations` then counts optimizer steps (3.15: `_iterations // steps`).
        if self.own_accumulation(optimizer) == steps:
            return True
        if getattr(optimizer, "built", False):
            return False
        optimizer.gradient_accumulation_steps = steps
        return True

    def _accumulate_on_tensorflow(self, optimizer: Any, steps: int) -> bool:
        """Keras 3 on TF: kerasmgpu accumulates (Keras's own fails under MirroredStrategy:
        `merge_call` inside its `cond`) - `tensorflow.Accumulation`, read by the hooks of
        `reduce_gradients_first` and `accumulate_by_calls`."""
        held = optimizer.__dict__.get(HOOKED + "_accumulation")
        if held is not None and held.steps == steps:
            return True
        if getattr(optimizer, "inner_optimizer", None) is not None:
            raise bad_value(
                "optimizer", f"{type(optimizer).__name__} with accumulate_steps={steps} on "
                "TensorFlow", "an optimizer without loss scaling when accumulate_steps > 1 "
                "on TensorFlow (its finiteness check and scale would count micro-batches)",
                "train in float32 (no mixed_float16 policy), or parallelize() with "
                "accumulate_steps=1")
        if getattr(optimizer, "built", False):
            return False
        optimizer.__dict__[HOOKED + "_accumulation"] = tf_internals.Accumulation(steps)
        return True

    def carry_own_accumulation(self, optimizer: Any) -> None:
        steps = self.own_accumulation(optimizer)
        if self.backend != "tensorflow" or steps == 1:
            return  # JAX and torch run Keras's own accumulation as it is
        held = optimizer.__dict__.get(HOOKED + "_accumulation")
        if held is not None and held.steps == steps:
            return
        problem = (
            "an optimizer with loss scaling (its finiteness check would count micro-batches)"
            if getattr(optimizer, "inner_optimizer", None) is not None else
            "EMA (use_ema=True: its averages move at every micro-batch, outside the update)"
            if getattr(optimizer, "use_ema", False) else
            "an optimizer that has trained already (its accumulators hold a group)"
            if getattr(optimizer, "built", False) else None)
        if problem is not None:
            raise bad_value(
                "optimizer", f"{type(optimizer).__name__}(gradient_accumulation_steps="
                f"{steps}) on TensorFlow with {problem}",
                "gradient_accumulation_steps on TensorFlow without loss scaling or EMA, "
                "before the first fit (kerasmgpu carries it out: Keras's own fails under "
                "MirroredStrategy, merge_call inside a cond)",
                "drop gradient_accumulation_steps and pass parallelize(model, "
                "accumulate_steps=k), or train without use_ema / mixed_float16")
        for name in ("_iterations", "_clip_gradients", "_apply_weight_decay",
                     "_backend_update_step"):
            if not hasattr(optimizer, name):
                raise self.fail(f"`{name}` is missing", "gradient_accumulation_steps")

        def update(grads: Any, variables: Any) -> Any:
            # BaseOptimizer._backend_apply_gradients's update branch (3.10 - 3.15): the
            # group's mean clipped, weight decay, the update step.
            grads = optimizer._clip_gradients(grads)
            optimizer._apply_weight_decay(variables)
            return optimizer._backend_update_step(grads, variables, optimizer.learning_rate)

        optimizer.__dict__[HOOKED + "_accumulation"] = tf_internals.Accumulation(
            steps, counted=lambda: int(optimizer._iterations.numpy()), update=update)

    def finish_group(self, model: Any, factor: float) -> None:
        """TF: kerasmgpu's sums (`tensorflow.finish_group`). JAX and torch: Keras's own
        accumulators (`_accumulated_gradients`, the sum of the group's gradients, and
        `_iterations`, which counts micro-batches; 3.8 - 3.15; on 3.3 - 3.7 `iterations`
        counts them) - scaled, the counter set
        to a group's last micro-batch, and `apply` given zero gradients, which then
        applies their mean and clears them as at any group's end."""
        optimizer = model.optimizer
        if self.backend == "tensorflow":
            tf_internals.finish_group(optimizer.__dict__[HOOKED + "_accumulation"],
                                      optimizer, list(model.trainable_variables), factor)
            return
        sums = getattr(optimizer, "_accumulated_gradients", None)
        # 3.8+: `_iterations` (`iterations` is steps); 3.3 - 3.7: `iterations` itself.
        counter = getattr(optimizer, "_iterations" if self._accumulation_counts_steps
                          else "iterations", None)
        if sums is None or counter is None:
            raise self.fail("`_accumulated_gradients` / `_iterations` are missing",
                            "accumulate_steps")
        sync = getattr(model, "jax_state_sync", None)
        if callable(sync):  # JAX: the loop's state into the variables (public method)
            sync()
        ops = self.keras.ops
        for total in sums:
            if total is not None:
                total.assign(total * factor)
        steps = self.own_accumulation(optimizer)
        done = int(ops.convert_to_numpy(counter))
        counter.assign(done + steps - 1 - done % steps)
        variables = list(model.trainable_variables)
        optimizer.apply([ops.zeros(v.shape, v.dtype) for v in variables], variables)

    def accumulate_by_calls(self, model: Any) -> None:
        """Keras 3 on TF, accumulating: the train function, traced twice (accumulating,
        applying), and the one to run chosen before each micro-batch.

        `TensorFlowTrainer.make_train_function` (3.10 - 3.15: it stores
        `_make_function(train_step)` in `train_function`, which `fit` calls once per
        micro-batch after one `make_train_function()` at its start) is wrapped on the
        instance: each fit starts a group with zero sums.
        """
        optimizer = getattr(model, "optimizer", None)
        if (self.backend != "tensorflow" or model.__dict__.get(HOOKED + "_calls")
                or HOOKED + "_accumulation" not in getattr(optimizer, "__dict__", {})):
            return
        original = getattr(model, "make_train_function", None)
        if not callable(original) or not hasattr(model, "train_function"):
            raise self.fail("`make_train_function` / `train_function` are missing",
                            "accumulate_steps on TensorFlow")

        model.__dict__["make_train_function"] = tf_internals.switching_train_function(
            model, original, lambda: model.optimizer.__dict__.get(HOOKED + "_accumulation"),
            lambda: int(getattr(model, "steps_per_execution", 1) or 1))
        model.__dict__[HOOKED + "_calls"] = True

    def optimizer_variables(self, optimizer: Any) -> List[Any]:
        # Gradient accumulators are left out of the state kerasmgpu mirrors: the template
        # trains without them (its optimizer is the user's), and kerasmgpu's accumulation
        # ends every epoch on a whole step, where they are zero.
        variables = super().optimizer_variables(optimizer)
        accumulators = getattr(optimizer, "_accumulated_gradients", None) or []
        skip = {id(v) for v in accumulators}
        return [v for v in variables if id(v) not in skip]

    def state_reader(self, variables: List[Any]) -> StateReader:
        variables = self._backend_values(list(variables))
        if self.backend == "jax":
            # JAX arrays are immutable: an assign puts a new array in the variable.
            return lambda: [Held(v._value) for v in variables]
        if self.backend == "torch":
            # A tensor's version counter grows with every in-place write (copy_, the
            # optimizers' foreach updates).
            return lambda: [(id(v._value), v._value._version) for v in variables]
        return tf_internals.value_hasher([v.value for v in variables])

    def loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                           training: bool, class_weight: Any = None
                           ) -> Optional[Tuple[Any, List[Any]]]:
        import numpy as np

        if self.backend != "jax":
            # Outside a tf.distribute replica (the template: one device) the same
            # stateless computation as a replica's.
            loss, *grads = self.replica_loss_and_gradients(model, x, y, sample_weight,
                                                           training)
            return float(self.numpy(loss)), [self.numpy(g) for g in grads]
        import jax

        # JAX's trainer computes the loss statelessly (`compute_loss_and_updates`,
        # public on Keras 3.0 - 3.15): the new states it returns are dropped, so the
        # check assigns nothing.
        def values(variables: List[Any]) -> List[Any]:
            return [v.value for v in variables]

        optimizer = getattr(model, "optimizer", None)
        grad = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
        (loss, _), grads = grad(
            values(model.trainable_variables), values(model.non_trainable_variables),
            values(model.metrics_variables), x, y, sample_weight, training=training,
            optimizer_variables=values(optimizer.variables) if optimizer is not None else [])
        return float(np.asarray(loss)), [np.asarray(g) for g in grads]

    def numpy(self, value: Any) -> Any:
        return self.keras.ops.convert_to_numpy(value)  # torch: detached, on the CPU

    def replica_loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                                   training: bool) -> List[Any]:
        """`stateless_call` and `stateless_compute_loss` (public on Keras 3.0 - 3.15; the
        `training` argument of the latter from 3.8) on the variables' current values:
        the new states they return are dropped, nothing is assigned. Inside a
        tf.distribute replica a variable's value is the replica's own copy, and Keras
        divides the loss by the replica count there, as in its step."""
        import inspect

        kwargs = {}
        if "training" in inspect.signature(model.stateless_compute_loss).parameters:
            kwargs["training"] = training

        def loss_of(trainable: List[Any], others: List[Any], metrics: List[Any]) -> Any:
            y_pred, _ = model.stateless_call(trainable, others, x, training=training)
            loss, _ = model.stateless_compute_loss(trainable, others, metrics, x=x, y=y,
                                                   y_pred=y_pred,
                                                   sample_weight=sample_weight, **kwargs)
            return loss

        if self.backend == "torch":
            import torch

            trainable = [v.value.detach().clone().requires_grad_(True)
                         for v in model.trainable_variables]
            with torch.enable_grad():
                loss = loss_of(trainable, [v.value.detach() for v in model.non_trainable_variables],
                               [v.value.detach() for v in model.metrics_variables])
                grads = torch.autograd.grad(loss, trainable, allow_unused=True)
            return [loss.detach()] + [torch.zeros_like(v) if g is None else g
                                      for g, v in zip(grads, trainable)]
        import tensorflow as tf

        trainable = [tf.convert_to_tensor(v.value) for v in model.trainable_variables]
        with tf.GradientTape() as tape:
            tape.watch(trainable)
            loss = loss_of(trainable,
                           [tf.convert_to_tensor(v.value) for v in model.non_trainable_variables],
                           [tf.convert_to_tensor(v.value) for v in model.metrics_variables])
        grads = tape.gradient(loss, trainable)
        # An Embedding's gradient is IndexedSlices: dense, to be summed and compared.
        return [loss] + [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                         for g, v in zip(grads, trainable)]

    def layers_of(self, model: Any) -> List[Any]:
        metric = self.keras.metrics.Metric
        return [layer for layer in model._flatten_layers(include_self=True, recursive=True)
                if not isinstance(layer, metric)]

    def compile_token(self, model: Any) -> Tuple[Any, ...]:
        return (getattr(model, "optimizer", None), getattr(model, "_compile_config", None))

    def optimizer_strategy(self, optimizer: Any) -> Any:
        """The tf.distribute strategy an optimizer's variables belong to (TF backend)."""
        return getattr(optimizer, "_distribution_strategy", None)

    # --- engines ----------------------------------------------------------------------------

    def distribution_strategy_of(self, model: Any) -> Any:
        return getattr(model, "_distribute_strategy", None)

    def build_without_peeking(self, model: Any) -> None:
        """Keras 3 on TF: fit/evaluate build the model from the data's element spec, as
        on one device, instead of a batch pulled through a throw-away iterator.

        With a strategy, `TensorFlowTrainer._maybe_symbolic_build` reads one batch of a
        fresh iterator (one device builds when the step is traced), and each new
        iterator of a tf.data pipeline draws its next reshuffle: one device's first
        epoch would be the parallel model's second permutation. `_symbolic_build` uses
        only each tensor's shape and dtype, which a `tf.data` element spec holds.
        Verified on Keras 3.10 - 3.15 (`backend/tensorflow/trainer.py`).
        """
        if self.backend != "tensorflow" or model.__dict__.get(HOOKED + "_build"):
            return
        original = getattr(model, "_maybe_symbolic_build", None)
        if not callable(original):
            raise self.fail("`TensorFlowTrainer._maybe_symbolic_build` is missing",
                            "the build fit/evaluate run under a strategy")
        dataset_adapter = getattr(self._data_adapters("tf_dataset_adapter"),
                                  "TFDatasetAdapter", None)

        def maybe_symbolic_build(iterator: Any = None, data_batch: Any = None) -> Any:
            adapter = getattr(iterator, "data_adapter", None)
            if (data_batch is None and dataset_adapter is not None
                    and isinstance(adapter, dataset_adapter)):
                return original(data_batch=adapter.get_tf_dataset().element_spec)
            return original(iterator=iterator, data_batch=data_batch)

        model.__dict__["_maybe_symbolic_build"] = maybe_symbolic_build
        model.__dict__[HOOKED + "_build"] = True

    def reduce_gradients_first(self, optimizer: Any) -> None:
        """Keras 3 on TF: the optimizer transforms the global batch's gradient.

        Under tf.distribute, `BaseOptimizer._backend_apply_gradients` clips (clipnorm,
        global_clipnorm, clipvalue) and accumulates each replica's own gradient; only
        `TFOptimizer._backend_update_step` sums them over the replicas
        (`_all_reduce_sum_gradients`). One device clips the sum. Here the sum is taken
        on entry to `_backend_apply_gradients` - the same one all-reduce, moved before
        the transforms - and the later one passes the reduced gradients through. A
        LossScaleOptimizer's inner optimizer is reduced the same way, and its finiteness
        check is agreed by every replica (Keras takes replica 0's). Verified on Keras
        3.10 - 3.15 (`keras/src/optimizers/base_optimizer.py`,
        `keras/src/backend/tensorflow/optimizer.py`, `loss_scale_optimizer.py`).
        """
        if self.backend != "tensorflow" or optimizer is None:
            return
        inner = getattr(optimizer, "inner_optimizer", None)
        if inner is not None:
            self._agree_on_finite(optimizer)
            optimizer = inner
        self._skip_apply_while_accumulating(optimizer)
        if optimizer.__dict__.get(HOOKED + "_reduce"):
            return
        apply = getattr(optimizer, "_backend_apply_gradients", None)
        reduce = getattr(optimizer, "_all_reduce_sum_gradients", None)
        if not callable(apply) or not callable(reduce):
            raise self.fail("`_backend_apply_gradients` / `_all_reduce_sum_gradients` are "
                            "missing", type(optimizer).__name__)
        marked = optimizer.__dict__
        group = lambda: marked.get(HOOKED + "_accumulation")  # noqa: E731
        early_apply, late_reduce = tf_internals.reduce_before(apply, reduce, group)
        optimizer.__dict__["_backend_apply_gradients"] = early_apply
        optimizer.__dict__["_all_reduce_sum_gradients"] = late_reduce
        optimizer.__dict__[HOOKED + "_reduce"] = True

    def _skip_apply_while_accumulating(self, optimizer: Any) -> None:
        # Accumulating, `apply` itself is skipped: it counts a step (`_iterations`, which
        # Adam's bias correction reads) and applies constraints after the update. Not for
        # the optimizer's own accumulation, whose `apply` counts every micro-batch.
        marked = optimizer.__dict__
        group = marked.get(HOOKED + "_accumulation")
        if group is None or group.own or marked.get(HOOKED + "_skip"):
            return
        reduce = getattr(optimizer, "_all_reduce_sum_gradients", None)
        if not callable(reduce):
            raise self.fail("`_all_reduce_sum_gradients` is missing", type(optimizer).__name__)
        marked["apply"] = tf_internals.accumulating_apply(
            optimizer.apply, reduce, lambda: marked.get(HOOKED + "_accumulation"),
            lambda: getattr(optimizer, "loss_scale_factor", None))
        marked[HOOKED + "_skip"] = True

    def _agree_on_finite(self, optimizer: Any) -> None:
        check = getattr(optimizer, "check_finite", None)
        if not callable(check):
            raise self.fail("`LossScaleOptimizer.check_finite` is missing",
                            type(optimizer).__name__)
        if not optimizer.__dict__.get(HOOKED + "_finite"):
            optimizer.__dict__["check_finite"] = tf_internals.all_replicas_agree(check)
            optimizer.__dict__[HOOKED + "_finite"] = True

    def random_seed(self) -> Optional[int]:
        """The seed given to `keras.utils.set_random_seed`, or None."""
        rng_utils = importlib.import_module("keras.src.utils.rng_utils")
        getter = getattr(rng_utils, "get_random_seed", None)
        if getter is None:
            raise self.fail("`keras.src.utils.rng_utils.get_random_seed` is missing",
                            "needed to agree on a seed across processes")
        seed: Optional[int] = getter()
        return seed

    def equalize_replica_state(self, model: Any, strategy: Any) -> None:
        if strategy is None:
            return
        # BatchNormalization's moving statistics are mirrored on-write variables in
        # Keras 3 whose per-replica copies each follow their own shard (reads return
        # replica 0's); kerasmgpu averages them, so every replica and the template hold
        # one state.
        tf_internals.equalize_across_replicas(
            [getattr(v, "value", v) for v in model.non_trainable_variables], strategy)

    # --- BackupAndRestore ----------------------------------------------------------------

    _BACKUP_COUNTERS = ("_current_epoch", "_last_batch_seen", "_batches_seen_since_last_saving")

    def _backup_internals(self, backup: Any) -> Any:
        save = getattr(backup, "_save_model", None)
        missing = [n for n in self._BACKUP_COUNTERS if not hasattr(backup, n)]
        if not callable(save) or missing:
            raise self.fail("BackupAndRestore has no `_save_model` or position counters "
                            f"{missing}", "an exact mid-epoch resume")
        # A wrapper from an earlier fit of the same callback is replaced, not stacked.
        return getattr(save, "__wrapped__", save)

    # Where Keras reads and writes its backup's files (set in __init__ from backup_dir).
    _BACKUP_PATHS = ("_weights_path", "_training_metadata_path")

    def _own_paths(self, backup: Any) -> Dict[str, str]:
        """Keras's own paths of `backup`, kept the first time kerasmgpu moves them."""
        kept: Optional[Dict[str, str]] = backup.__dict__.get("_kerasmgpu_paths")
        if kept is None:
            missing = [n for n in self._BACKUP_PATHS if not isinstance(getattr(backup, n, None), str)]
            if missing:
                raise self.fail(f"BackupAndRestore has no {missing}", "a backup written as one set")
            kept = {n: getattr(backup, n) for n in ("backup_dir", *self._BACKUP_PATHS)}
            backup.__dict__["_kerasmgpu_paths"] = kept
        return kept

    def _point_at(self, backup: Any, directory: Optional[str]) -> None:
        kept = self._own_paths(backup)
        for name in self._BACKUP_PATHS:
            setattr(backup, name, kept[name] if directory is None
                    else os.path.join(directory, os.path.basename(kept[name])))

    def follow_backup(self, backup: Any, on_save: Callable[[Callable[[str], None]], None],
                      allow: Callable[[], bool]) -> bool:
        save = self._backup_internals(backup)
        self._own_paths(backup)

        def redirect(directory: str, run: Callable[[], None]) -> None:
            # Keras's own _save_model, its files put in `directory` (it makes
            # `backup_dir` if missing, then writes the weights and the epoch record).
            before = {n: getattr(backup, n) for n in ("backup_dir", *self._BACKUP_PATHS)}
            self._point_at(backup, directory)
            backup.backup_dir = directory
            try:
                run()
            finally:
                for name, value in before.items():
                    setattr(backup, name, value)

        backup._save_model = following_save(save, on_save, allow, redirect)
        return True

    def restore_from(self, backup: Any, directory: Optional[str]) -> None:
        # `_load_model` (on_train_begin) reads the two paths.
        self._point_at(backup, directory)

    def set_backup_position(self, backup: Any, epoch: int, batch: int) -> None:
        self._backup_internals(backup)
        backup._current_epoch = epoch
        backup._last_batch_seen = batch
        backup._batches_seen_since_last_saving = 0

    def unfollow_backup(self, backup: Any) -> None:
        original = getattr(getattr(backup, "_save_model", None), "__wrapped__", None)
        if original is not None:
            backup._save_model = original
        if "_kerasmgpu_paths" in backup.__dict__:
            self._point_at(backup, None)

    def save_backup(self, backup: Any, epoch: int, batch: int) -> bool:
        self.set_backup_position(backup, epoch, batch)
        # As the chief saves under a multi-process layout (engines.keras_distribution):
        # on local arrays, not creating variables every process would have to create.
        distribution: Any = getattr(self.keras, "distribution", None)
        active = distribution.distribution() if distribution is not None else None
        if active is not None:
            distribution.set_distribution(None)
        try:
            backup._save_model()
        finally:
            if active is not None:
                distribution.set_distribution(active)
        return True
