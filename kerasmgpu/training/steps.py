"""Per-step overrides that make padded batches give single-device results.

A replica built by kerasmgpu always receives, as its `sample_weight`, the packed
(rows, 3) array of `kerasmgpu.batching` (scale, mask, user weight). These overrides use
only Keras's public override points (`compute_loss`, `compute_metrics`,
`predict_step`, a `Loss` subclass) so they work the same on tf.keras 2.x, tf_keras and
Keras 3 on every backend:

* losses: each compiled loss is wrapped in `PackedLoss`, which weights rows by
  `scale * mask * weight` (mean reductions) or `mask * weight` (sums): the exact
  single-device value and gradient;
* metrics: padding rows get weight 0 through the metric sample weights (Keras 3: every
  compiled metric is made a weighted metric) or through a Keras mask (tf.keras 2.x,
  where unweighted metrics are updated with the mask);
* the loss tracker: Keras weights each step's loss by the *fed* row count; one extra
  update with weight `rows * (1/scale - 1)` (negative for padded steps) brings the
  running mean back to real-count weighting, so epoch losses match single-device ones;
* predict: the step returns the mask beside the outputs so the padding rows can be
  dropped whatever the input was.
"""

from __future__ import annotations

import functools
import importlib
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

from kerasmgpu.adapters import Family
from kerasmgpu.batching import MASK, PACKED_COLUMNS, SCALE, WEIGHT

PRED_KEY = "kerasmgpu_outputs"
MASK_KEY = "kerasmgpu_mask"

# Reductions whose value is a mean over rows: they need the padded/real scale.
_MEAN_REDUCTIONS = {"sum_over_batch_size", "mean", "auto"}


def _flatten(structure: Any) -> list:
    if structure is None:
        return []
    if isinstance(structure, dict):
        return [leaf for key in sorted(structure) for leaf in _flatten(structure[key])]
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in _flatten(item)]
    return [structure]


def _map(fn: Callable[[Any], Any], structure: Any) -> Any:
    if isinstance(structure, dict):
        return {k: _map(fn, v) for k, v in structure.items()}
    if isinstance(structure, (list, tuple)):
        return type(structure)(_map(fn, v) for v in structure)
    return fn(structure)


def is_packed(sample_weight: Any) -> bool:
    leaves = _flatten(sample_weight)
    if not leaves:
        return False
    shape = getattr(leaves[0], "shape", None)
    if shape is None or len(shape) != 2:
        return False
    # Generator-fed datasets can lose the static width (tf.keras 2.x relaxes it).
    return shape[-1] in (PACKED_COLUMNS, None)


def first_packed(sample_weight: Any) -> Any:
    return _flatten(sample_weight)[0]


# --- losses ------------------------------------------------------------------------------


def _reduction_name(loss: Any) -> str:
    return str(getattr(loss, "reduction", "sum_over_batch_size") or "none").lower()


@functools.cache
def packed_loss_type(family: Family) -> type:
    """`PackedLoss` for this Keras: a `Loss` that reads the packed sample weights."""
    losses = family.keras.losses
    base = losses.Loss
    root = family.keras.__name__.split(".")[0]
    wrapper: Any = getattr(losses, "LossFunctionWrapper", None)
    if wrapper is None:  # tf.keras 2.x does not export it
        wrapper = importlib.import_module(
            ("keras" if root == "tensorflow" else root) + ".src.losses"
        ).LossFunctionWrapper

    class PackedLoss(base):  # type: ignore[misc, valid-type]
        """The user's loss, weighted so padding rows count for nothing."""

        def __init__(self, identifier: Any) -> None:
            self.identifier = identifier
            self.owner: Any = None  # weakref to the replica, for its per-output tracker
            self._inner: Any = None
            if not (isinstance(identifier, str) and identifier.lower() in ("crossentropy", "ce")):
                self._inner = self._resolve(identifier)
            name = getattr(self._inner, "name", None) or str(identifier)
            reduction = getattr(self._inner, "reduction", None) or (
                "sum_over_batch_size" if family.keras3 else "auto"
            )
            if family.keras3:
                super().__init__(name=name, reduction=reduction)
            else:
                super().__init__(reduction=reduction, name=name)

        @staticmethod
        def _resolve(identifier: Any) -> Any:
            loss = losses.get(identifier)
            if not isinstance(loss, base):
                name = identifier if isinstance(identifier, str) else getattr(
                    loss, "__name__", "loss"
                )
                loss = wrapper(loss, name=name)
            if not family.keras3:
                # tf.keras refuses mean reductions inside a strategy unless the loss
                # is owned by `compile`; this one is, through the wrapper.
                loss._allow_sum_over_batch_size = True
            return loss

        def inner(self, y_true: Any, y_pred: Any) -> Any:
            if self._inner is None:
                # "crossentropy" picks binary / sparse / categorical from the shapes,
                # as Keras 3's compile does (keras/src/trainers/compile_utils.py).
                compile_utils = importlib.import_module("keras.src.trainers.compile_utils")
                self._inner = compile_utils.get_loss(self.identifier, y_true, y_pred)
            return self._inner

        def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
            inner = self.inner(y_true, y_pred)
            if not is_packed(sample_weight):
                return inner(y_true, y_pred, sample_weight=sample_weight)
            packed = sample_weight
            weight = packed[:, MASK] * packed[:, WEIGHT]
            if _reduction_name(inner) in _MEAN_REDUCTIONS:
                weight = weight * packed[:, SCALE]
            value = inner(y_true, y_pred, sample_weight=weight)
            self._correct_output_tracker(value, packed, y_pred)
            return value

        def _correct_output_tracker(self, value: Any, packed: Any, y_pred: Any) -> None:
            """Multi-output models track each output's loss too, weighted by fed rows."""
            model = self.owner() if self.owner is not None else None
            tracker = _output_loss_tracker(family, model, self) if model is not None else None
            if tracker is None:
                return
            if family.keras3:
                # Keras 3 weights this tracker by the *static* batch size; when that is
                # unknown (TF graphs) every step counts once, padded or not: nothing to
                # correct.
                if _flatten(y_pred)[0].shape[0] is None:
                    return
                value = value * _traced_replicas(family)  # what the tracker receives
            elif _reduction_name(self._inner) == "sum":
                value = value * _traced_replicas(family)
            _reweight_to_real_rows(family, tracker, value, packed)

        def call(self, y_true: Any, y_pred: Any) -> Any:  # pragma: no cover - unused
            return self._inner.call(y_true, y_pred)

        def get_config(self) -> Dict[str, Any]:
            inner = self._inner
            return inner.get_config() if inner is not None else {"name": self.name}

    PackedLoss.__name__ = PackedLoss.__qualname__ = "PackedLoss"
    return PackedLoss


def wrap_losses(family: Family, loss: Any, model: Any = None) -> Any:
    """Every loss leaf in a `PackedLoss`; one object per output, owned by `model`."""
    cls = packed_loss_type(family)
    outputs = len(getattr(model, "outputs", None) or []) if model is not None else 0
    if outputs > 1 and loss is not None and not isinstance(loss, (list, tuple, dict)):
        # One loss for every output: Keras would share one object between outputs;
        # separate objects let each find its own per-output tracker.
        loss = [loss] * outputs

    def wrap(leaf: Any) -> Any:
        if leaf is None:
            return leaf
        identifier: Any = getattr(leaf, "identifier", leaf) if isinstance(leaf, cls) else leaf
        wrapped = cls(identifier)
        if model is not None:
            wrapped.owner = weakref.ref(model)
        return wrapped

    return _map(wrap, loss)


def _output_loss_tracker(family: Family, model: Any, loss: Any) -> Any:
    """The per-output loss `Mean` Keras updates for `loss`, if the model has several."""
    if family.keras3:
        container = getattr(model, "_compile_loss", None)
        flat = getattr(container, "_flat_losses", None) or []
        trackers = list(getattr(container, "metrics", None) or [])
        owners = [getattr(entry, "loss", None) for entry in flat]
    else:
        container = getattr(model, "compiled_loss", None)
        trackers = list(getattr(container, "_per_output_metrics", None) or [])
        owners = list(getattr(container, "_losses", None) or [])
    if len(trackers) != len(owners) or len(trackers) < 2:
        return None
    for owner, tracker in zip(owners, trackers):
        if owner is loss:
            return tracker
    return None


# --- the overrides --------------------------------------------------------------------------


def _traced_replicas(family: Family) -> Any:
    """How many replica traces each add to the loss tracker (TF: one per replica)."""
    if family.backend == "tensorflow" or not family.keras3:
        import tensorflow as tf

        return tf.distribute.get_strategy().num_replicas_in_sync
    return 1


def _loss_tracker(family: Family, model: Any) -> Any:
    if family.keras3:
        return getattr(model, "_loss_tracker", None)
    container = getattr(model, "compiled_loss", None)
    # tf.keras 2.13+ / tf_keras: `_total_loss_mean`; 2.9-2.12: `_loss_metric`.
    return getattr(container, "_total_loss_mean", None) or getattr(container, "_loss_metric", None)


def correct_tracker(family: Family, model: Any, total: Any, sample_weight: Any) -> None:
    """Re-weight this step's tracked loss from fed rows to real rows (see module doc)."""
    tracker = _loss_tracker(family, model)
    if tracker is None or total is None:
        return
    _reweight_to_real_rows(family, tracker, total * _traced_replicas(family),
                           first_packed(sample_weight))


def _reweight_to_real_rows(family: Family, tracker: Any, value: Any, packed: Any) -> None:
    """Top up a loss tracker that weighted this step by its fed rows: with the extra
    weight rows * (real/fed - 1) it has counted the step by its real rows."""
    rows = family.cast(family.rows(packed), "float32")
    tracked = family.stop_gradient(value)
    weight = family.cast(rows * (1.0 / packed[0, SCALE] - 1.0), tracked.dtype)
    tracker.update_state(tracked, sample_weight=weight)


def make_compute_loss(family: Family, original: Callable[..., Any]) -> Callable[..., Any]:
    if family.keras3:

        def compute_loss(
            self: Any,
            x: Any = None,
            y: Any = None,
            y_pred: Any = None,
            sample_weight: Any = None,
            training: bool = True,
        ) -> Any:
            total = original(self, x, y, y_pred, sample_weight, training=training)
            if is_packed(sample_weight):
                correct_tracker(family, self, total, sample_weight)
            return total

    else:

        def compute_loss(  # type: ignore[misc]
            self: Any, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None
        ) -> Any:
            total = original(self, x, y, y_pred, sample_weight)
            if is_packed(sample_weight):
                correct_tracker(family, self, total, sample_weight)
            return total

    return compute_loss


def _set_mask(family: Family, tensor: Any, mask: Any) -> None:
    """Attach a Keras mask (padding rows False) to an output, keeping any it has."""
    if family.keras3:
        masking = importlib.import_module("keras.src.backend")
        existing = masking.get_keras_mask(tensor)
        ops = family.keras.ops
        mask = ops.cast(mask, "bool")
        if existing is not None:
            while len(mask.shape) < len(existing.shape):
                mask = ops.expand_dims(mask, -1)
            mask = ops.logical_and(existing, mask)
        masking.set_keras_mask(tensor, mask)
    else:
        import tensorflow as tf

        mask = tf.cast(mask, tf.bool)
        existing = getattr(tensor, "_keras_mask", None)
        if existing is not None:
            while mask.shape.rank < existing.shape.rank:
                mask = tf.expand_dims(mask, -1)
            mask = tf.logical_and(existing, mask)
        tensor._keras_mask = mask


def make_compute_metrics(
    family: Family, original: Callable[..., Any], all_weighted: Callable[[], bool]
) -> Callable[..., Any]:
    def compute_metrics(self: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        if not is_packed(sample_weight):
            return original(self, x, y, y_pred, sample_weight)
        if family.keras3 and all_weighted():
            # Every compiled metric was made a weighted one: the mask is its weight.
            weights = _map(lambda p: p[:, MASK], sample_weight)
        else:
            packed = first_packed(sample_weight)
            for output in _flatten(y_pred):
                _set_mask(family, output, packed[:, MASK])
            weights = _map(lambda p: p[:, WEIGHT] * p[:, MASK], sample_weight)
        return original(self, x, y, y_pred, weights)

    return compute_metrics


def split_predict_data(data: Any) -> Tuple[Any, Optional[Any]]:
    """Our predict feeds yield (x, packed); anything else is passed through."""
    if isinstance(data, tuple) and len(data) == 2 and is_packed(data[1]):
        return data[0], data[1]
    return data, None


def make_predict_step(family: Family, original: Callable[..., Any]) -> Callable[..., Any]:
    if family.keras3 and family.backend == "jax":

        def predict_step(self: Any, state: Any, data: Any) -> Any:
            x, packed = split_predict_data(data)
            if packed is None:
                return original(self, state, data)
            outputs, non_trainable = original(self, state, (x,))
            return {PRED_KEY: outputs, MASK_KEY: packed[:, MASK]}, non_trainable

        return predict_step

    def predict_step_one(self: Any, data: Any) -> Any:
        x, packed = split_predict_data(data)
        if packed is None:
            return original(self, data)
        outputs = original(self, (x,))
        return {PRED_KEY: outputs, MASK_KEY: packed[:, MASK]}

    return predict_step_one


def strip_padding(outputs: Any) -> Any:
    """Drop padding rows from predict's concatenated outputs using the returned mask."""
    import numpy as np

    if not isinstance(outputs, dict) or MASK_KEY not in outputs:
        return outputs
    keep = np.asarray(outputs[MASK_KEY]).reshape(-1) > 0.5
    return _map(lambda leaf: np.asarray(leaf)[keep], outputs[PRED_KEY])
