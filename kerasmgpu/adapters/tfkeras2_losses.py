"""tf.keras 2.x / tf_keras: the compiled loss as kerasmgpu weighs it (part of `tfkeras2`).

Verified on the releases `tfkeras2` names (the sources read here are the same in tf.keras
2.12, 2.15 and tf_keras 2.21; run on 2.12, 2.15, 2.16, 2.21). What is read or wrapped:

* `model.compiled_loss` (a `LossesContainer`): replaced on the instance by a proxy whose
  call adds the padding weights to the sample weight; `build(y_pred)` and `built` are
  used to build it first, `_conform_to_outputs` to conform a dict of sample weights.
* Its built losses, `_losses` (a flat list of `Loss` objects or None): `call` wrapped on
  the instance. `Loss.__call__` divides a masked mean (`ignore_class`, `mask_zero`) by
  the valid entries of `y_pred._keras_mask & values._keras_mask` - inside a replica, the
  replica's own; `steps.loss_values` makes that count the global batch's real rows'.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from kerasmgpu.adapters.base import Adapter
from kerasmgpu.adapters.step_ops import HOOKED


class CompiledLoss:
    """Stands in for `model.compiled_loss`: Keras's own container, with our weights.

    `LossesContainer.__call__` is where tf.keras (and every custom `train_step` written
    in its style: `self.compiled_loss(y, y_pred, regularization_losses=self.losses)`)
    computes the compiled loss; a special method cannot be replaced on an instance, so
    the model gets this proxy, which forwards everything else to the container.
    """

    def __init__(self, container: Any, hook: Callable[[Any, Any, Any], Any],
                 on_built: Callable[[Any], None]) -> None:
        self.__dict__["_kerasmgpu_container"] = container
        self.__dict__["_kerasmgpu_fn"] = hook
        self.__dict__["_kerasmgpu_on_built"] = on_built
        self.__dict__[HOOKED] = True

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None,
                 regularization_losses: Any = None) -> Any:
        container = self.__dict__["_kerasmgpu_container"]
        if not container.built:
            container.build(y_pred)
        self.__dict__["_kerasmgpu_on_built"](container)
        if isinstance(sample_weight, dict):
            # Weights for some outputs only ({"price": w}): Keras's own conforming gives
            # the others None, which the padding weight then stands in for (left a dict,
            # they got no weight, and their padded rows counted).
            sample_weight = container._conform_to_outputs(y_pred, sample_weight)
        weights = self.__dict__["_kerasmgpu_fn"](y_true, y_pred, sample_weight)
        import tensorflow as tf

        # A loss's call may widen an output's Keras mask for Keras's division (see
        # `TfKeras2Losses._values_call`): the metrics after it read the output's own.
        masks = [(leaf, leaf._keras_mask) for leaf in tf.nest.flatten(y_pred)
                 if getattr(leaf, "_keras_mask", None) is not None]
        try:
            return container(y_true, y_pred, sample_weight=weights,
                             regularization_losses=regularization_losses)
        finally:
            for leaf, mask in masks:
                leaf._keras_mask = mask

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_kerasmgpu_container"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_kerasmgpu_container"], name, value)


class TfKeras2Losses(Adapter):
    """The compiled-loss part of the tf.keras 2.x / tf_keras adapter (`tfkeras2`)."""

    @property
    def counts_per_replica(self) -> bool:
        # Each replica runs Keras's step on its own rows (tf.distribute): a masked mean
        # divides by the replica's count unless `steps.loss_values` makes it global.
        return True

    def total(self, x: Any) -> Any:
        return self._tf.reduce_sum(x)

    def count_ratio(self, a: Any, b: Any) -> Any:
        return self._tf.math.divide_no_nan(a, b)

    def replica_mean(self, x: Any) -> Any:
        tf = self._tf
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return x
        return context.all_reduce(tf.distribute.ReduceOp.MEAN, x)

    @staticmethod
    def _container(model: Any, name: str) -> Any:
        value = model.__dict__.get(name)
        if isinstance(value, CompiledLoss):
            return value.__dict__["_kerasmgpu_container"]
        return getattr(model, name, None)

    def install_loss_hook(self, model: Any, hook: Callable[[Any, Any, Any], Any],
                          values: Optional[Callable[[Any, Any, Any], Any]] = None) -> None:
        container = self._container(model, "compiled_loss")
        if container is None:
            return

        def on_built(built: Any) -> None:
            if values is not None:
                self._hook_loss_values(built, values)

        model.__dict__["compiled_loss"] = CompiledLoss(container, hook, on_built)

    def _hook_loss_values(self, container: Any, loss_values: Callable[..., Any]) -> None:
        """Wrap `call` of every loss the built container holds (`_losses`, 2.12 - 2.21)
        so that `steps.loss_values` sees each loss's values and the mask
        `Loss.__call__` divides by (`y_pred`'s and the values' `_keras_mask`, anded as
        it does; the same in 2.12, 2.15, 2.21): a replica's count of valid entries is
        its own, one device's is the global batch's real rows'."""
        losses = getattr(container, "_losses", None)
        if not isinstance(losses, list):
            raise self.fail("a built `compiled_loss` has no `_losses` list",
                            "a masked loss divided by one device's count")
        for loss in losses:
            if loss is None or loss.__dict__.get(HOOKED):
                continue
            if not callable(getattr(loss, "call", None)):
                # A masked mean would divide by the replica's count, silently.
                raise self.fail("a compiled loss has no call() to weigh its values",
                                type(loss).__name__)
            loss.__dict__["call"] = self._values_call(loss, loss.call, loss_values)
            loss.__dict__[HOOKED] = True

    def _values_call(self, loss: Any, original: Callable[..., Any],
                     loss_values: Callable[..., Any]) -> Callable[..., Any]:
        tf = self._tf

        def call(y_true: Any, y_pred: Any) -> Any:
            values = original(y_true, y_pred)
            given, own = (getattr(t, "_keras_mask", None) for t in (y_pred, values))
            masks = [m for m in (given, own) if m is not None]
            mask = masks[0] if len(masks) == 1 else (masks[0] & masks[1] if masks else None)
            out = loss_values(values, mask, getattr(loss, "reduction", None))
            if out is not values:
                # Loss.__call__ reads both masks back after this call and divides by
                # their valid entries: a replica with none (its labels all ignored, its
                # steps all masked) read 0 * inf = NaN - its loss, and under mask_zero
                # the weights - where one device's batch has some. Its values are 0
                # (the count ratio is) and the container zeroed the masked steps'
                # weights already, so there the masks may hold every entry.
                empty = tf.logical_not(tf.reduce_any(mask))
                if own is not None:
                    out._keras_mask = tf.logical_or(own, empty)
                if given is not None:  # put back by CompiledLoss.__call__
                    y_pred._keras_mask = tf.logical_or(given, empty)
            return out

        return call
