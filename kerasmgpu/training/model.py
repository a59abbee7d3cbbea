"""The model `parallelize()` returns: a real Keras model whose training entry points pad.

The replica is a clone of the user's model built in the route's scope (or the user's
model itself when it was built in `kerasmgpu.scope()`). Its class is untouched - it
saves, loads and prints as what it is - but `fit`, `evaluate`, `predict`, the
`*_on_batch` calls and `compile` are replaced on the instance by the functions below,
which hand Keras padded, packed batches (`parallel.feeds`) and keep the template
model holding the trained weights (synced at the end of every epoch and of every call).
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from kerasmgpu import adapters as family_module
from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import Family
from kerasmgpu.data import feeds
from kerasmgpu.env import cluster
from kerasmgpu.training import steps as overrides

if TYPE_CHECKING:
    from kerasmgpu.engines.base import BaseRoute

STATE_ATTR = "_kerasmgpu"


@dataclass
class ParallelState:
    template: Any
    route: BaseRoute
    family: Family
    all_weighted: bool = False
    user_compile: Optional[Dict[str, Any]] = None
    originals: Dict[str, Callable[..., Any]] = field(default_factory=dict)

    def feed(self, x: Any, *, training: bool = True, **kwargs: Any) -> feeds.Feed:
        """`training`: a feed of fit() (train or validation), read epoch after epoch."""
        if cluster.launched() and kwargs.get("shuffle"):
            # Every worker must shuffle the same way, or shards would overlap.
            kwargs.setdefault("seed", cluster.shared_seed())
        feed = feeds.build(self.family, self.route.feed_kind, self.route.planner, x, **kwargs)
        if training:
            # Keras re-creates a dataset's iterator every epoch unless it is told the
            # steps (for a distributed dataset that costs as much as half an epoch of a
            # small model); one repeated iterator reads the epochs back to back.
            feed = feeds.repeated(feed)
        return self.route.distribute_feed(feed)


def state_of(model: Any) -> Optional[ParallelState]:
    return getattr(model, "__dict__", {}).get(STATE_ATTR)


def is_parallel(model: Any) -> bool:
    return state_of(model) is not None


# --- weights ----------------------------------------------------------------------------


def sync_template(replica: Any) -> None:
    """Copy the replica's weights into the template (no-op when they are one model)."""
    state = state_of(replica)
    if state is None or state.template is replica:
        return
    template = state.template
    weights = replica.get_weights()
    if len(template.weights) != len(weights) and hasattr(replica, "input_shape"):
        # A Sequential model given without an input shape: the replica was built by
        # the first batch; build the template the same way so it can hold the weights.
        template.build(replica.input_shape)
    template.set_weights(weights)


def copy_weights(source: Any, target: Any) -> None:
    if source.weights:
        target.set_weights(source.get_weights())


def carry_optimizer_state(state: ParallelState, source: Any, replica: Any) -> bool:
    """Give the replica's fresh optimizer the template optimizer's slots, if it has any."""
    old = family_module.optimizer_variables(source)
    if not old or replica.optimizer is None:
        return False
    with state.route.scope():
        if hasattr(replica.optimizer, "build"):
            replica.optimizer.build(replica.trainable_variables)
    new = family_module.optimizer_variables(replica.optimizer)
    if len(new) != len(old) or any(
        tuple(a.shape) != tuple(b.shape) for a, b in zip(old, new)
    ):
        return False
    for target, value in zip(new, old):
        target.assign(value.numpy() if hasattr(value, "numpy") else value)
    return True


# --- compile -----------------------------------------------------------------------------


def compile_replica(replica: Any, args: Dict[str, Any]) -> None:
    """Compile the replica in scope with padding-aware losses and metrics."""
    state = state_of(replica)
    assert state is not None
    fam = state.family
    args = {k: v for k, v in args.items() if v is not None or k == "loss"}
    state.user_compile = dict(args)
    compiled = dict(args)
    with state.route.scope():
        if state.template is replica:
            compiled["optimizer"] = args.get("optimizer")
        else:
            compiled["optimizer"] = family_module.fresh_optimizer(fam, args.get("optimizer"))
        compiled["loss"] = overrides.wrap_losses(fam, args.get("loss"), replica)
        metrics = family_module.map_leaves(
            lambda m: family_module.fresh_metric(fam, m), args.get("metrics")
        )
        weighted = family_module.map_leaves(
            lambda m: family_module.fresh_metric(fam, m), args.get("weighted_metrics")
        )
        state.all_weighted = False
        if fam.keras3 and not weighted:
            # Keras 3 gives sample weights only to weighted metrics; making every metric
            # weighted lets the mask keep padding rows out of all of them.
            compiled["weighted_metrics"], compiled["metrics"] = metrics, None
            state.all_weighted = True
        else:
            compiled["metrics"], compiled["weighted_metrics"] = metrics, weighted
        compiled = {k: v for k, v in compiled.items() if v is not None or k == "loss"}
        state.originals["compile"](replica, **compiled)
    state.route.prepare_compiled(replica)


def _compile_args_from_call(original: Callable[..., Any], replica: Any, *a: Any, **kw: Any) -> Dict[str, Any]:
    bound = inspect.signature(original).bind(replica, *a, **kw)
    bound.apply_defaults()
    args = dict(bound.arguments)
    args.pop("self", None)
    extra = args.pop("kwargs", {}) or {}
    args.update(extra)
    return args


# --- the replaced methods ---------------------------------------------------------------------


def _fit(self: Any, x: Any = None, y: Any = None, batch_size: Any = None, epochs: int = 1,
         verbose: Any = "auto", callbacks: Any = None, validation_split: float = 0.0,
         validation_data: Any = None, shuffle: Any = True, class_weight: Any = None,
         sample_weight: Any = None, initial_epoch: int = 0, steps_per_epoch: Any = None,
         validation_steps: Any = None, validation_batch_size: Any = None,
         validation_freq: Any = 1, **kwargs: Any) -> Any:
    state = state_of(self)
    assert state is not None
    if validation_split and validation_data is None:
        train, held_out = feeds.split_validation(x, y, sample_weight, validation_split)
        (x, y, sample_weight), validation_data = train, held_out
    train_feed = state.feed(
        x, y=y, sample_weight=sample_weight, class_weight=class_weight,
        batch_size=batch_size, shuffle=shuffle,
    )
    if steps_per_epoch is None and train_feed.needs_steps:
        steps_per_epoch = train_feed.steps
    val_data = None
    if validation_data is not None:
        vx, vy, vsw = feeds._unpack(validation_data)
        val_feed = state.feed(
            vx, y=vy, sample_weight=vsw, batch_size=validation_batch_size or batch_size,
            training=False,
        )
        val_data = val_feed.data
        if validation_steps is None and val_feed.needs_steps:
            validation_steps = val_feed.steps
    callbacks = state.route.worker_callbacks(list(callbacks or [])) + [_sync_callback(state, self)]
    with state.route.scope():
        history = state.originals["fit"](
            self, train_feed.data, epochs=epochs, verbose=verbose, callbacks=callbacks,
            validation_data=val_data, shuffle=bool(shuffle) and train_feed.keras_shuffles,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
            validation_freq=validation_freq, **kwargs,
        )
    sync_template(self)
    return history


def _evaluate(self: Any, x: Any = None, y: Any = None, batch_size: Any = None,
              verbose: Any = "auto", sample_weight: Any = None, steps: Any = None,
              callbacks: Any = None, return_dict: bool = False, **kwargs: Any) -> Any:
    state = state_of(self)
    assert state is not None
    if kwargs.get("_use_cached_eval_dataset"):
        # fit()'s own validation pass: the data is already a padded feed.
        return state.originals["evaluate"](
            self, x, y, batch_size=batch_size, verbose=verbose, sample_weight=sample_weight,
            steps=steps, callbacks=callbacks, return_dict=return_dict, **kwargs,
        )
    feed = state.feed(x, y=y, sample_weight=sample_weight, batch_size=batch_size,
                      training=False)
    if steps is None and feed.needs_steps:
        steps = feed.steps
    with state.route.scope():
        return state.originals["evaluate"](
            self, feed.data, verbose=verbose, steps=steps, callbacks=callbacks,
            return_dict=return_dict, **kwargs,
        )


def _predict(self: Any, x: Any, batch_size: Any = None, verbose: Any = "auto",
             steps: Any = None, callbacks: Any = None, **kwargs: Any) -> Any:
    state = state_of(self)
    assert state is not None
    if cluster.launched():
        # Each worker would only see its own rows; every worker holds all the weights,
        # so each predicts everything on its own (on the template, one device).
        sync_template(self)
        template = state.template
        return type(template).predict(template, x, batch_size=batch_size, verbose=verbose,
                                      steps=steps, callbacks=callbacks, **kwargs)
    feed = state.feed(x, batch_size=batch_size, predict=True, training=False)
    with state.route.scope():
        outputs = state.originals["predict"](
            self, feed.data, verbose=verbose, steps=steps, callbacks=callbacks, **kwargs
        )
    return overrides.strip_padding(outputs)


def _train_on_batch(self: Any, x: Any, y: Any = None, sample_weight: Any = None,
                    class_weight: Any = None, **kwargs: Any) -> Any:
    state = state_of(self)
    assert state is not None
    xb, yb, packed = feeds.pad_batch(x, y, sample_weight, class_weight, state.route.planner)
    with state.route.scope():
        logs = state.originals["train_on_batch"](self, xb, yb, sample_weight=packed, **kwargs)
    sync_template(self)
    return logs


def _test_on_batch(self: Any, x: Any, y: Any = None, sample_weight: Any = None,
                   **kwargs: Any) -> Any:
    state = state_of(self)
    assert state is not None
    xb, yb, packed = feeds.pad_batch(x, y, sample_weight, None, state.route.planner)
    with state.route.scope():
        return state.originals["test_on_batch"](self, xb, yb, sample_weight=packed, **kwargs)


def _predict_on_batch(self: Any, x: Any) -> Any:
    # One batch: predict() with a batch size that covers it keeps the padding logic
    # in one place.
    rows = max(int(leaf.shape[0]) for leaf in feeds._leaves(feeds._to_numpy(x)))
    return _predict(self, x, batch_size=max(rows, 1), verbose=0)


def _compile(self: Any, *args: Any, **kwargs: Any) -> None:
    state = state_of(self)
    assert state is not None
    user_args = _compile_args_from_call(state.originals["compile"], self, *args, **kwargs)
    compile_replica(self, user_args)
    template = state.template
    if template is not self:
        # The template is compiled too, with its own optimizer and metric objects, so
        # `template.save()` records the compile configuration like a one-device model.
        fam = state.family
        own = dict(user_args)
        own["optimizer"] = family_module.fresh_optimizer(fam, user_args.get("optimizer"))
        for key in ("metrics", "weighted_metrics"):
            own[key] = family_module.map_leaves(
                lambda m: family_module.fresh_metric(fam, m), user_args.get(key)
            )
        own = {k: v for k, v in own.items() if v is not None or k == "loss"}
        type(template).compile(template, **own)


def _get_compile_config(self: Any) -> Any:
    """The user's compile configuration, not the padding-aware one we compiled with."""
    state = state_of(self)
    assert state is not None
    template = state.template
    if template is not self and family_module.is_compiled(template):
        return template.get_compile_config()
    if state.user_compile is None:
        return None
    config_type: Any = type(getattr(self, "_compile_config", None))
    return config_type(**state.user_compile).serialize()


def _sync_callback(state: ParallelState, replica: Any) -> Any:
    base = state.family.keras.callbacks.Callback

    class SyncTemplate(base):  # type: ignore[misc, valid-type]
        """Keeps the template holding the trained weights after every epoch."""

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            state.route.epoch_end(replica)
            sync_template(replica)

    return SyncTemplate()


_REPLACED: Dict[str, Callable[..., Any]] = {
    "fit": _fit,
    "evaluate": _evaluate,
    "predict": _predict,
    "train_on_batch": _train_on_batch,
    "test_on_batch": _test_on_batch,
    "predict_on_batch": _predict_on_batch,
    "compile": _compile,
    "get_compile_config": _get_compile_config,
}


def attach(replica: Any, template: Any, route: BaseRoute, fam: Family) -> Any:
    """Make `replica` the parallel model for `template` on `route`; returns `replica`."""
    if is_parallel(replica):
        raise bad_value(
            "model", "a model already returned by parallelize()",
            "the original (template) model", "call parallelize() once, on the template",
        )
    klass = type(replica)
    state = ParallelState(template=template, route=route, family=fam)
    for name in list(_REPLACED) + ["compute_loss", "compute_metrics", "predict_step"]:
        state.originals[name] = getattr(klass, name)
    # Written straight into __dict__: Keras's attribute tracking must not see them
    # (the template is not a sub-model of the replica).
    replica.__dict__[STATE_ATTR] = state
    for name, fn in _REPLACED.items():
        replica.__dict__[name] = types.MethodType(fn, replica)
    replica.__dict__["compute_loss"] = types.MethodType(
        overrides.make_compute_loss(fam, state.originals["compute_loss"]), replica
    )
    replica.__dict__["compute_metrics"] = types.MethodType(
        overrides.make_compute_metrics(
            fam, state.originals["compute_metrics"], lambda: state.all_weighted
        ),
        replica,
    )
    replica.__dict__["predict_step"] = types.MethodType(
        overrides.make_predict_step(fam, state.originals["predict_step"]), replica
    )
    route.prepare_replica(replica)
    return replica


def parallel_copy(route: BaseRoute, fam: Family, template: Any) -> Any:
    """Clone `template` into the route's scope, copy weights, compile like it."""
    with route.scope():
        replica = family_module.clone_model(fam, template)
        copy_weights(template, replica)
    attach(replica, template, route, fam)
    if family_module.is_compiled(template):
        compile_replica(replica, family_module.compile_args(template))
        carry_optimizer_state(state_of(replica), template.optimizer, replica)  # type: ignore[arg-type]
    return replica


def adopt(route: BaseRoute, fam: Family, model: Any) -> Any:
    """A model built in the route's scope trains as it is: no copy, weights shared."""
    attach(model, model, route, fam)
    if family_module.is_compiled(model):
        compile_replica(model, family_module.compile_args(model))
    return model
