"""Keras 3: what every backend (TensorFlow, JAX, PyTorch) shares, every internal it touches.

One subclass per backend, one module each, overrides what differs there:
`keras3_tensorflow.Keras3TensorFlow`, `keras3_jax.Keras3Jax`, `keras3_torch.Keras3Torch`
(the registry names them); Keras's data rules are in `keras3_data`, its
`BackupAndRestore` in `keras3_backup`. Verified on the releases of
`env.versions.KERAS3_VERIFIED` (the tox matrix runs the oldest, a middle and the
newest: 3.3, 3.8, 3.15). What is read or wrapped here:

* `model._compile_loss` (a `CompileLoss`): its `call` is wrapped on the instance so
  the padding weights join the sample weight of every compiled loss; its `metrics` are
  the per-output loss trackers (3.5+; absent before, so `getattr(..., [])`).
* `model._compile_metrics` (a `CompileMetrics`): its `update_state` is wrapped on the
  instance, and its `metrics` (public property) lists the metrics it builds lazily.
* `model._loss_tracker`: the `Mean` every backend's step updates with the fed rows.
* `layer._losses`: losses added by a call (`add_loss`), as opposed to regularizers (on
  JAX see `keras3_jax`).
* `keras.src.utils.rng_utils.get_random_seed`: whether the user seeded Keras.
* `CompileLoss._flat_losses` ((path, loss, weight, name), 3.3-3.15): each loss's `call`
  is wrapped on the instance, so that the padding weight is shaped like its values and a
  masked mean divides by one device's count (`steps.loss_values`); for that the mask
  `Loss.__call__` applies is read with `keras.src.backend.get_keras_mask` (and the
  values' mask put back with `set_keras_mask`). Metrics get the padding mask as a weight.
* `keras.src.metrics.reduction_metrics` (`Mean`, `Sum`, `MeanMetricWrapper`, 3.3-3.15)
  and the values' Keras mask (`_keras_mask`, `get_keras_mask`): a metric updated
  without a sample weight that ignores that mask sees it ignored on a padded batch too
  (`unmasked_for_metric`).
* `BatchNormalization.call`'s public `mask` and `_moments` (each backend's
  `_batch_moments`), read by `_idle_keeps_moving` and `_kept_moving`.
* optimizers on JAX and torch: Keras's own accumulation, `gradient_accumulation_steps`,
  and to finish a group `_accumulated_gradients` and `_iterations` (`finish_group`).
* verify=True: the public `stateless_call` / `stateless_compute_loss` with the terms
  they collect (`keras3_losses.stateless_loss`, for TF and torch); nothing they return
  is assigned.
* change tokens (`state_reader`, per backend): `variable._value`, checked here.
* `model._compile_config`: a new object at every `compile()` (3.3+).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Optional, Tuple

from kerasmgpu.adapters import keras3_losses
from kerasmgpu.adapters.base import COMPILE_KEYS
from kerasmgpu.adapters.keras3_backup import Keras3Backups
from kerasmgpu.adapters.keras3_data import Keras3Data
from kerasmgpu.adapters.step_ops import HOOKED
from kerasmgpu.env.versions import (
    KERAS3_ACCUMULATION_COUNTS_STEPS,
    KERAS3_ACTIVITY_LOSS_IS_A_MEAN,
    KERAS3_METRICS_MASK_WITHOUT_WEIGHT,
)
from kerasmgpu.registry import verified_range


class Keras3(Keras3Data, Keras3Backups):
    """Keras 3, the part every backend shares; the registry names a subclass per backend
    (`Keras3TensorFlow`, `Keras3Jax`, `Keras3Torch`), each overriding what differs."""

    LABEL = "Keras"
    DIST = "keras"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        span = verified_range(self.line, self.backend)
        assert span is not None
        self.VERIFIED = span

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

    def unmasked_for_metric(self, metric: Any, values: Any) -> Any:
        # reduction_metrics.py (3.3 - 3.15): `Mean` / `Sum` apply their values' Keras
        # mask only given a sample weight; `MeanMetricWrapper` its y_pred's likewise
        # before 3.12 (env/versions.py KERAS3_METRICS_MASK_WITHOUT_WEIGHT), always after.
        try:
            reduction = importlib.import_module("keras.src.metrics.reduction_metrics")
        except ImportError:  # moved in a release after 3.15: its masking is not known
            return values
        if isinstance(metric, reduction.MeanMetricWrapper):
            if self.version is None or self.version >= KERAS3_METRICS_MASK_WITHOUT_WEIGHT:
                return values
        elif not isinstance(metric, (reduction.Mean, reduction.Sum)):
            return values
        if getattr(values, "_keras_mask", None) is None and self._keras_mask(values) is None:
            return values
        # A new tensor carries no Keras mask (an attribute of the tensor, or 3.8+'s
        # table keyed by it); the original keeps its own for the rest of the step.
        return self.keras.ops.copy(values)

    def _keras_mask(self, x: Any) -> Any:
        try:
            from keras.src.backend import get_keras_mask
        except ImportError:  # 3.3: the tensor attribute alone (read above)
            return None
        return get_keras_mask(x)

    # --- hooks -----------------------------------------------------------------------------

    def _compile_loss(self, model: Any) -> Any:
        return getattr(model, "_compile_loss", None)

    def install_loss_hook(self, model: Any, hook: Callable[[Any, Any, Any], Any],
                          values: Optional[Callable[[Any, Any, Any], Any]] = None) -> None:
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
                # The per-output loss trackers are made here too, inside the first
                # traced step: hooked now, before this step updates them, or that
                # program would keep Keras's own weighting for every step it runs.
                on_tracker = container.__dict__.get(HOOKED + "_tracker_fn")
                if on_tracker is not None:
                    for tracker in list(getattr(container, "metrics", None) or []):
                        on_tracker(tracker)
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

    def install_metrics_hook(self, model: Any, on_metric: Callable[[Any], None]) -> None:
        losses = self._compile_loss(model)
        if losses is not None:  # its trackers, as `install_loss_hook`'s build makes them
            losses.__dict__[HOOKED + "_tracker_fn"] = on_metric
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

    def strategy_loss_problem(self, model: Any) -> Optional[str]:
        """Keras 3 before 3.15: layers with an activity regularizer, whose loss is a sum
        over the rows each replica holds (env/versions.py KERAS3_ACTIVITY_LOSS_IS_A_MEAN);
        asked by the routes where each replica runs its own step."""
        if self.version is None or self.version >= KERAS3_ACTIVITY_LOSS_IS_A_MEAN:
            return None
        named = [f"{layer.name!r}" for layer in self.layers_of(model)
                 if getattr(layer, "activity_regularizer", None) is not None]
        if not named:
            return None
        return (f"layers {', '.join(named)} with an activity_regularizer on Keras "
                f"{self.version} with {self.keras.backend.backend()}")

    def has_call_time_losses(self, model: Any) -> bool:
        # On JAX a stateless step collects the added losses in its scope and leaves no
        # `_losses` behind: an activity regularizer is seen on the layer, an `add_loss`
        # by the wrapper `_watch_add_loss` put on every layer.
        for layer in [model, *model._flatten_layers(include_self=False)]:
            if getattr(layer, "_losses", None) or getattr(layer, "activity_regularizer",
                                                          None) is not None:
                return True
        return bool(model.__dict__.get(HOOKED + "_added_loss"))

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
            layer.__dict__["_moments"] = self._batch_moments(layer)
            layer.__dict__[HOOKED + "_moments"] = True
        return True

    def _batch_moments(self, layer: Any) -> Callable[[Any, Any], Any]:
        """`BatchNormalization._moments(inputs, mask)` as this backend's replicas take the
        global batch's moments (one per backend)."""
        raise NotImplementedError

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
        # Public since Keras 3.3: the accumulators are made when the optimizer is built,
        # and `iterations` then counts optimizer steps (3.15: `_iterations // steps`).
        if self.own_accumulation(optimizer) == steps:
            return True
        if getattr(optimizer, "built", False):
            return False
        optimizer.gradient_accumulation_steps = steps
        return True

    def finish_group(self, model: Any, factor: float) -> None:
        """Keras's own accumulators (JAX, torch; TF: `Keras3TensorFlow`):
        `_accumulated_gradients`, the sum of the group's gradients, and `_iterations`,
        which counts micro-batches (3.8 - 3.15; on 3.3 - 3.7 `iterations` counts them) -
        scaled, the counter set to a group's last micro-batch, and `apply` given zero
        gradients, which then applies their mean and clears them as at any group's end."""
        optimizer = model.optimizer
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

    def optimizer_variables(self, optimizer: Any) -> List[Any]:
        # Gradient accumulators are left out of the state kerasmgpu mirrors: the template
        # trains without them (its optimizer is the user's), and kerasmgpu's accumulation
        # ends every epoch on a whole step, where they are zero.
        variables = super().optimizer_variables(optimizer)
        accumulators = getattr(optimizer, "_accumulated_gradients", None) or []
        skip = {id(v) for v in accumulators}
        return [v for v in variables if id(v) not in skip]

    def loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                           training: bool, class_weight: Any = None
                           ) -> Optional[Tuple[Any, List[Any]]]:
        # Outside a tf.distribute replica (the template: one device) the same
        # stateless computation as a replica's.
        loss, *grads = self.replica_loss_and_gradients(model, x, y, sample_weight, training)
        return float(self.numpy(loss)), [self.numpy(g) for g in grads]

    def numpy(self, value: Any) -> Any:
        return self.keras.ops.convert_to_numpy(value)  # torch: detached, on the CPU

    def _stateless_loss(self, model: Any, x: Any, y: Any, sample_weight: Any,
                        training: bool) -> Callable[[List[Any], List[Any], List[Any]], Any]:
        # `keras3_losses.stateless_loss`: every backend's, its loss terms included.
        return keras3_losses.stateless_loss(model, x, y, sample_weight, training, self.fail)

    def layers_of(self, model: Any) -> List[Any]:
        metric = self.keras.metrics.Metric
        return [layer for layer in model._flatten_layers(include_self=True, recursive=True)
                if not isinstance(layer, metric)]

    def compile_token(self, model: Any) -> Tuple[Any, ...]:
        return (getattr(model, "optimizer", None), getattr(model, "_compile_config", None))

    # --- engines ----------------------------------------------------------------------------

    def random_seed(self) -> Optional[int]:
        """The seed given to `keras.utils.set_random_seed`, or None."""
        rng_utils = importlib.import_module("keras.src.utils.rng_utils")
        getter = getattr(rng_utils, "get_random_seed", None)
        if getter is None:
            raise self.fail("`keras.src.utils.rng_utils.get_random_seed` is missing",
                            "needed to agree on a seed across processes")
        seed: Optional[int] = getter()
        return seed
