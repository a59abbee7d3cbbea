"""The model `parallelize()` returns: a real Keras model whose training entry points pad.

The replica is a copy of the user's model built in the engine's scope (or the user's
model itself when it was built in `kerasmgpu.scope()`), compiled with the user's own
compile arguments. Its class is untouched - it saves, loads and prints as what it is,
and what it writes holds nothing of kerasmgpu - but `fit`, `evaluate`, `predict`, the
`*_on_batch` calls, `compile` and the three steps are replaced on the instance: the
calls hand Keras padded batches (`kerasmgpu.data.feeds`), the steps hand the model's
own steps the user's data and keep padding rows out of losses and metrics
(`kerasmgpu.training.steps`).

The template - the model the user passed - and the replica agree both ways
(`kerasmgpu.training.sync`): what the user changes in the template reaches the next
call, and what a call changes - weights, optimizer state, (BatchNorm) moving statistics -
reaches the template at every epoch end and after every call that trains, so "save the
template model" resumes where training stopped. Several parallel models of one template
stay correct: each takes what another one wrote into the template.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from kerasmgpu import accumulation
from kerasmgpu._errors import bad_value, not_compiled
from kerasmgpu.adapters import Adapter
from kerasmgpu.data import feeds, structure
from kerasmgpu.options import Options
from kerasmgpu.training import resume, sync
from kerasmgpu.training import steps as step_hooks
from kerasmgpu.training import verify as self_check
from kerasmgpu.training.ops import EngineOps

STATE_ATTR = "_kerasmgpu"

_STEP_KINDS = {"train_step": "train", "test_step": "test"}


@dataclass
class ParallelState:
    template: Any
    engine: EngineOps
    adapter: Adapter
    # None on the multi_gpu_model route, where Keras's own multi_gpu_model feeds itself.
    report: Optional[step_hooks.StepReport] = None
    has_compiled_loss: bool = False
    originals: Dict[str, Callable[..., Any]] = field(default_factory=dict)
    # Keeps the template and the replica equal (set once the replica is compiled).
    mirror: Optional[sync.Mirror] = None
    # Step kinds whose step is the user's own ("train", "test"), not Keras's.
    custom_steps: set = field(default_factory=set)
    # The train metrics' results, read before fit's validation pass resets them.
    train_results: Optional[Dict[str, Any]] = None
    # parallelize(accumulate_steps=k): training batches per optimizer step.
    accumulate_steps: int = 1
    # parallelize(verify=True): the self-check (`kerasmgpu.training.verify`) runs.
    verify: bool = False
    sync_batchnorm: bool = False
    # The self-check's per-replica computations, kept while what they read stays (an
    # engine that traces them - TensorFlow - then traces each once, not once a fit).
    checks: Dict[Any, Any] = field(default_factory=dict)

    def feed(self, x: Any, *, kind: str, training: bool = True, model: Any = None,
             position: Optional[resume.Plan] = None, **kwargs: Any) -> feeds.Feed:
        """A feed for one step kind ("train", "test", "predict"); `training`: read epoch
        after epoch by fit()."""
        if kwargs.get("shuffle"):
            # Every process must shuffle alike, or their shares would overlap.
            kwargs.setdefault("seed", self.engine.shuffle_seed())
        inputs = self.adapter.model_inputs(model) if model is not None else None
        if kind == "train":
            kwargs["accumulate_steps"] = self.accumulate_steps
        feed = feeds.build(self.adapter, self.engine.feed_kind, self.engine.planner, x,
                           inputs=inputs, predict=kind == "predict", **kwargs)
        if kind != "predict" and self.report is not None:
            self.report.feeding(kind, feed.pads, feed.padding_example)
        if training:
            # Keras re-creates a dataset's iterator every epoch unless it is told the
            # steps (for a distributed dataset that costs as much as half an epoch of a
            # small model); one repeated iterator reads the epochs of kerasmgpu's own
            # pipelines back to back. A user's tf.data pipeline is read as Keras reads
            # it on one device (`Feed.per_epoch_iterators`).
            feed = feeds.repeated(feed)
        if position is not None:
            feed = _skip_trained(feed, position)
        return self.engine.distribute_feed(feed)


def _skip_trained(feed: feeds.Feed, position: resume.Plan) -> feeds.Feed:
    """A resumed fit's feed without the batches its restored epoch already trained."""
    skip = position.skip_steps(feed.steps)
    if not skip:
        return feed
    skipped = feeds.skipped(feed, skip)
    if skipped is None:
        position.cannot_skip()
        return feed
    return skipped


def state_of(model: Any) -> Optional[ParallelState]:
    return getattr(model, "__dict__", {}).get(STATE_ATTR)


def hold(parallel: Any, template: Any, engine: EngineOps, adapter: Adapter,
         options: Options) -> ParallelState:
    """Mark `parallel` as the parallel model of `template` on `engine`, for a model
    whose steps are Keras's own (Keras 2.3's multi_gpu_model feeds itself, so no step
    report and no hooks): `state_of`, `describe()` and `route_for()` then see it."""
    state = ParallelState(template=template, engine=engine, adapter=adapter,
                          verify=options.verify, sync_batchnorm=options.sync_batchnorm)
    parallel.__dict__[STATE_ATTR] = state
    if state.verify:
        _checked_calls(parallel, state)
    return state


def _checked_calls(model: Any, state: ParallelState) -> None:
    """parallelize(verify=True) on a model whose calls are Keras's own (`hold`): fit
    checks its first (and first uneven) batch, evaluate and predict their first batch's
    outputs, then Keras's call runs. Wraps the calls as they are now, so that wrappers
    the engine puts around them later (the template's changes reaching a copy first)
    run before the check."""
    klass = type(model)
    for name in ("fit", "evaluate", "predict"):
        own = getattr(model, name, None)
        if own is None:
            continue
        signature = inspect.signature(getattr(klass, name))

        def checked(*args: Any, _own: Any = own, _name: str = name,
                    _signature: Any = signature, **kwargs: Any) -> Any:
            given = _signature.bind(model, *args, **kwargs)
            given.apply_defaults()
            call = given.arguments
            if _name != "fit":
                self_check.check_outputs(state, model, call["x"], call["batch_size"], _name)
                return _own(*args, **kwargs)
            x, y, weights = call["x"], call["y"], call["sample_weight"]
            if call["validation_split"] and call["validation_data"] is None and \
                    structure.is_array_like(x):
                (x, y, weights), _ = feeds.split_validation(x, y, weights,
                                                            call["validation_split"])
            self_check.before_fit(state, model, x, y, weights, call["class_weight"],
                                  call["batch_size"], state.sync_batchnorm)
            return _own(*args, **kwargs)

        model.__dict__[name] = checked


def is_parallel(model: Any) -> bool:
    return state_of(model) is not None


# --- compile -----------------------------------------------------------------------------


def hook_metrics(replica: Any) -> None:
    """Wrap the replica's loss trackers and metrics (idempotent; new ones as they come)."""
    state = state_of(replica)
    assert state is not None
    adapter = state.adapter
    trackers = adapter.loss_trackers(replica)
    for position, tracker in enumerate(trackers):  # the model's total loss comes first
        adapter.wrap_update_state(tracker, step_hooks.tracker_update(adapter, position == 0))
    tracked = {id(t) for t in trackers}
    for metric in adapter.metric_leaves(replica):
        if id(metric) not in tracked:
            adapter.wrap_update_state(metric, step_hooks.masked_update(adapter, metric))


def _on_compiled_metric(replica: Any) -> Callable[[Any], None]:
    def on_metric(metric: Any) -> None:
        state = state_of(replica)
        if state is None:
            return
        adapter = state.adapter
        trackers = adapter.loss_trackers(replica)
        if any(metric is t for t in trackers):
            adapter.wrap_update_state(
                metric, step_hooks.tracker_update(adapter, metric is trackers[0]))
        else:
            adapter.wrap_update_state(metric, step_hooks.masked_update(adapter, metric))

    return on_metric


def compile_replica(replica: Any, args: Dict[str, Any]) -> None:
    """Compile the replica in scope with the user's arguments, then hook its losses and
    metrics. Nothing of kerasmgpu is compiled in: what the model saves is the user's."""
    state = state_of(replica)
    assert state is not None
    adapter = state.adapter
    args = {k: v for k, v in args.items() if v is not None or k == "loss"}
    scaled = _loss_scaling(adapter, args.get("loss"))
    with state.engine.scope():
        optimizer = _replica_optimizer(state, replica, args.get("optimizer"))
        compiled = _compile_arguments(adapter, args, optimizer,
                                      fresh_metrics=state.template is not replica)
        state.originals["compile"](replica, **compiled)
    install_hooks(replica, args.get("loss"), scaled)


def _compile_arguments(adapter: Adapter, args: Dict[str, Any], optimizer: Any, *,
                       fresh_metrics: bool) -> Dict[str, Any]:
    """One model's compile arguments: the user's `args` with `optimizer`, fresh metric
    objects when `fresh_metrics` (a metric object belongs to one model: the replica and
    the template each get their own), and Nones other than `loss` left out, so that
    Keras applies its own defaults."""
    compiled = dict(args)
    compiled["optimizer"] = optimizer
    if fresh_metrics:
        for key in ("metrics", "weighted_metrics"):
            if compiled.get(key) is not None:
                compiled[key] = structure.map_structure(adapter.fresh_metric, compiled[key])
    return {k: v for k, v in compiled.items() if v is not None or k == "loss"}


def _in_scope(state: ParallelState, replica: Any, optimizer: Any) -> bool:
    """Whether an optimizer lives where the replica trains: the replica's own, or made
    in the engine's scope."""
    return optimizer is getattr(replica, "optimizer", None) or state.engine.owns_optimizer(
        optimizer)


def _replica_optimizer(state: ParallelState, replica: Any, given: Any) -> Any:
    """The optimizer the replica compiles with (inside the engine's scope): the one
    given when it lives there - recompiling with the model's own optimizer keeps its
    state, as in Keras - else a fresh copy made there (an optimizer's variables belong
    to the devices it was created for: TF refuses to mix strategies, JAX devices)."""
    if given is None or isinstance(given, str) or not _in_scope(state, replica, given):
        given = state.adapter.fresh_optimizer(given)
    return accumulating(state, given)


def accumulating(state: ParallelState, optimizer: Any) -> Any:
    """`optimizer`, made to accumulate `state.accumulate_steps` micro-batches per step
    (`kerasmgpu.accumulation`), or the error when it cannot be."""
    steps = state.accumulate_steps
    if optimizer is None:
        return optimizer
    if steps == 1:
        state.adapter.carry_own_accumulation(optimizer)
        return optimizer
    own = state.adapter.own_accumulation(optimizer)
    if own > 1 and own != steps:
        raise own_accumulation_error(own, steps)
    problem = state.adapter.optimizer_accumulation_problem(optimizer)
    if problem is not None:
        raise bad_value(
            "accumulate_steps", steps, f"1 with {type(optimizer).__name__} here: {problem}",
            "upgrade Keras 3 to 3.8+, or compile with one of those optimizers, or raise "
            "batch_size instead")
    if not state.adapter.accumulate_gradients(optimizer, steps):
        raise bad_value(
            "optimizer", f"{type(optimizer).__name__}, already built, with accumulate_steps="
            f"{steps}", "an optimizer that has not trained yet when accumulate_steps > 1",
            "compile with a new optimizer before parallelize(), or parallelize() before "
            "the first fit()")
    return optimizer


def own_accumulation_error(own: int, steps: int) -> ValueError:
    return bad_value(
        "accumulate_steps", steps,
        f"1 when the optimizer accumulates itself (gradient_accumulation_steps={own})",
        "use one of the two: parallelize(accumulate_steps=k) - exact for any batch - or "
        "the optimizer's gradient_accumulation_steps, not both")


def _template_optimizer(state: ParallelState, given: Any, previous: Any) -> Any:
    """The optimizer the template compiles with: the one given, which the template
    then holds (changes to it - a new learning rate - reach the replica), unless it
    lives in the engine's scope; the replica's own keeps the template's own."""
    template = state.template
    if given is None or isinstance(given, str):
        return given
    if given is previous and getattr(template, "optimizer", None) is not None:
        return template.optimizer
    if given is previous or state.engine.owns_optimizer(given):
        return state.adapter.fresh_optimizer(given)
    return given


def _loss_scaling(adapter: Adapter, loss: Any) -> bool:
    scaled = step_hooks.reduction_is_mean(adapter, loss)
    if scaled is None:
        raise bad_value(
            "loss", loss,
            "losses that all reduce by a mean (the default) or all by a sum",
            "give every output's loss the same `reduction`, or train with batches that "
            "divide by the replica count",
        )
    return scaled


def install_hooks(replica: Any, loss: Any, scaled: Optional[bool] = None) -> None:
    """Hook a compiled replica's loss, metrics and loss trackers (no recompile)."""
    state = state_of(replica)
    assert state is not None
    adapter = state.adapter
    if scaled is None:
        scaled = _loss_scaling(adapter, loss)
    state.has_compiled_loss = loss is not None
    _install_steps(replica)
    adapter.check_internals(replica)
    adapter.install_loss_hook(
        replica, step_hooks.loss_hook(adapter, scaled, lambda: hook_metrics(replica)),
        lambda values, mask, reduction: step_hooks.loss_values(adapter, values, mask, reduction))
    adapter.install_metrics_hook(replica, _on_compiled_metric(replica))
    state.engine.prepare_compiled(replica)


def _compile_args_from_call(original: Callable[..., Any], replica: Any, *a: Any, **kw: Any
                            ) -> Dict[str, Any]:
    bound = inspect.signature(original).bind(replica, *a, **kw)
    bound.apply_defaults()
    args = dict(bound.arguments)
    args.pop("self", None)
    extra = args.pop("kwargs", {}) or {}
    args.update(extra)
    return args


# --- the replaced methods ---------------------------------------------------------------------


def _state(model: Any, *, training: bool, collective: bool = True) -> ParallelState:
    """The model's state, after the template's changes reached the replica."""
    state = state_of(model)
    assert state is not None and state.mirror is not None
    sync.before_call(state.mirror, training=training, collective=collective)
    return state


def _compiled_for(model: Any, call: str) -> None:
    """Keras trains and evaluates only a compiled model: say so in our words, before
    anything is copied or fed (predict needs no compile, as in Keras)."""
    state = state_of(model)
    if state is not None and not state.adapter.is_compiled(model):
        raise not_compiled(model, call)


def _trained(state: ParallelState, *, unless_unchanged: bool = False) -> None:
    """After the replica's state changed: the template receives it (`unless_unchanged`:
    not again when the replica still holds what the last epoch end copied)."""
    if state.mirror is not None:
        sync.after_training(state.mirror, unless_unchanged=unless_unchanged)


def _fit(self: Any, x: Any = None, y: Any = None, batch_size: Any = None, epochs: int = 1,
         verbose: Any = "auto", callbacks: Any = None, validation_split: float = 0.0,
         validation_data: Any = None, shuffle: Any = True, class_weight: Any = None,
         sample_weight: Any = None, initial_epoch: int = 0, steps_per_epoch: Any = None,
         validation_steps: Any = None, validation_batch_size: Any = None,
         validation_freq: Any = 1, **kwargs: Any) -> Any:
    _compiled_for(self, "fit")
    accumulate_state = state_of(self)
    if accumulate_state is not None:
        accumulation.check_steps_per_epoch(steps_per_epoch, accumulate_state.accumulate_steps)
        accumulation.check_loss_reduction(getattr(self, "loss", None),
                                          accumulate_state.accumulate_steps)
        accumulation.check_callbacks(callbacks, accumulate_state.accumulate_steps)
        problem = accumulate_state.adapter.steps_per_epoch_accumulation_problem()
        # (Other inputs are refused with accumulate_steps anyway, saying so.)
        if (steps_per_epoch is not None and accumulate_state.accumulate_steps > 1 and problem
                and structure.is_array_like(x)):
            raise bad_value("steps_per_epoch", steps_per_epoch,
                            f"None with accumulate_steps > 1 here: {problem}",
                            "leave steps_per_epoch out (fit the rows you mean), or upgrade "
                            "Keras 3 to 3.8+")
    state = _state(self, training=True)
    if validation_split and validation_data is None:
        train, held_out = feeds.split_validation(x, y, sample_weight, validation_split)
        (x, y, sample_weight), validation_data = train, held_out
    if state.verify:
        self_check.before_fit(state, self, x, y, sample_weight, class_weight, batch_size,
                              state.sync_batchnorm)
    # Before the chief-only ones are dropped: every process must decide alike.
    state.engine.note_callbacks(list(callbacks or []))  # fit's validation passes included
    user_callbacks = state.engine.worker_callbacks(list(callbacks or []))
    environment = state.engine.environment
    position = resume.plan(state.adapter, user_callbacks,
                           rank=environment.global_rank() if environment.multi_process() else 0,
                           alone=not environment.multi_process(),
                           own_metrics=state.engine.metrics_per_process,
                           layout=resume.Layout.of(self, state.engine.planner.process_count,
                                                   state.engine.planner.replicas,
                                                   _global_batch(x, batch_size)))
    train_feed = state.feed(
        x, kind="train", model=self, y=y, sample_weight=sample_weight,
        class_weight=class_weight, batch_size=batch_size, shuffle=shuffle,
        position=position,
    )
    if steps_per_epoch is None and train_feed.needs_steps:
        steps_per_epoch = train_feed.steps
    val_data = None
    if validation_data is not None:
        vx, vy, vsw = structure.unpack(validation_data)
        val_feed = state.feed(
            vx, kind="test", model=self, y=vy, sample_weight=vsw,
            batch_size=validation_batch_size or batch_size, training=False,
        )
        val_data = val_feed.data
        if validation_steps is None and val_feed.needs_steps:
            validation_steps = val_feed.steps
    before, after = position.callbacks() if position is not None else ([], [])
    callbacks = (before + [_logs_callback(state, self), _to_template(state, self)]
                 + user_callbacks + after + [_from_template(state)]
                 + _stopped_group(state, self, train_feed))
    preemption = position.preemption() if position is not None else contextlib.nullcontext()
    with state.engine.scope(), preemption:
        history = state.originals["fit"](
            self, train_feed.data, epochs=epochs, verbose=verbose, callbacks=callbacks,
            validation_data=val_data, shuffle=bool(shuffle) and train_feed.keras_shuffles,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
            validation_freq=validation_freq, **kwargs,
        )
    # The last epoch end already copied; a callback's on_train_end may have changed
    # the replica since.
    _trained(state, unless_unchanged=True)
    return history


def _global_batch(x: Any, batch_size: Any) -> Optional[int]:
    """The rows of a training step, where fit knows them: arrays, in batches of
    `batch_size` (Keras's 32 by default). A dataset's or generator's are its own."""
    if not structure.is_array_like(x):
        return None
    return 32 if batch_size is None else int(batch_size)


def _evaluate(self: Any, x: Any = None, y: Any = None, batch_size: Any = None,
              verbose: Any = "auto", sample_weight: Any = None, steps: Any = None,
              callbacks: Any = None, return_dict: bool = False, **kwargs: Any) -> Any:
    _compiled_for(self, "evaluate")
    state = state_of(self)
    assert state is not None
    if kwargs.get("_use_cached_eval_dataset"):
        # fit()'s own validation pass: the data is already a padded feed.
        if "train" in state.custom_steps:
            state.train_results = _metric_results(self)
        results = state.originals["evaluate"](
            self, x, y, batch_size=batch_size, verbose=verbose, sample_weight=sample_weight,
            steps=steps, callbacks=callbacks, return_dict=return_dict, **kwargs,
        )
        return _fixed_results(state, self, results, return_dict)
    state = _state(self, training=False)
    if state.verify:
        self_check.check_outputs(state, self, x, batch_size, "evaluate")
    feed = state.feed(x, kind="test", model=self, y=y, sample_weight=sample_weight,
                      batch_size=batch_size, training=False)
    if steps is None and feed.needs_steps:
        steps = feed.steps
    state.engine.note_callbacks(list(callbacks or []))
    with state.engine.scope():
        results = state.originals["evaluate"](
            self, feed.data, verbose=verbose, steps=steps, callbacks=callbacks,
            return_dict=return_dict or "test" in state.custom_steps, **kwargs,
        )
    return _fixed_results(state, self, results, return_dict)


def _metric_results(model: Any) -> Dict[str, Any]:
    import numpy as np

    out = {}
    for key, value in dict(model.get_metrics_result()).items():
        array = np.asarray(value)
        out[key] = float(array) if array.ndim == 0 else array
    return out


def _fixed_results(state: ParallelState, model: Any, results: Any, return_dict: bool) -> Any:
    """A user's own test_step returns what each replica's metrics read locally (e.g.
    `{m.name: m.result() ...}` inside a tf.distribute replica), and replicas hold
    unequal real-row counts when a batch was padded; the metrics' own results, read
    across replicas, are the one-device numbers."""
    if "test" not in state.custom_steps or not isinstance(results, dict):
        return results
    fixed = dict(results)
    for key, value in _metric_results(model).items():
        if key in fixed:
            fixed[key] = value
    if return_dict:
        return fixed
    values = list(fixed.values())
    return values[0] if len(values) == 1 else values


def _predict(self: Any, x: Any, batch_size: Any = None, verbose: Any = "auto",
             steps: Any = None, callbacks: Any = None, **kwargs: Any) -> Any:
    held = state_of(self)
    if held is not None and held.engine.environment.multi_process():
        # Each worker would only see its own rows; every worker holds all the weights,
        # so each predicts everything on its own (on the template, one device, as it
        # is: a change made on one process alone reaches the others at the next call
        # they make together).
        template = held.template
        return type(template).predict(template, x, batch_size=batch_size, verbose=verbose,
                                      steps=steps, callbacks=callbacks, **kwargs)
    state = _state(self, training=False, collective=False)
    if state.verify:
        self_check.check_outputs(state, self, x, batch_size, "predict")
    feed = state.feed(x, kind="predict", model=self, batch_size=batch_size, training=False)
    with state.engine.scope():
        outputs = state.originals["predict"](
            self, feed.data, verbose=verbose, steps=steps, callbacks=callbacks, **kwargs
        )
    return step_hooks.strip_padding(outputs)


def _train_on_batch(self: Any, x: Any, y: Any = None, sample_weight: Any = None,
                    class_weight: Any = None, **kwargs: Any) -> Any:
    _compiled_for(self, "train_on_batch")
    held = state_of(self)
    if held is not None and held.accumulate_steps > 1:
        raise bad_value(
            "train_on_batch", f"a call on a model parallelized with accumulate_steps="
            f"{held.accumulate_steps}", "fit() when accumulate_steps > 1 (it weighs every "
            "batch of an optimizer step by its rows and ends each epoch on a whole step)",
            "train with fit(), or parallelize() with accumulate_steps=1")
    state = _state(self, training=True)
    xb, packed = feeds.pad_batch(state.adapter, x, y, sample_weight, class_weight,
                                 state.engine.planner)
    with state.engine.scope():
        logs = _on_batch(state, self, "train_on_batch", xb, packed, kwargs)
    _trained(state)
    return logs


def _test_on_batch(self: Any, x: Any, y: Any = None, sample_weight: Any = None,
                   **kwargs: Any) -> Any:
    _compiled_for(self, "test_on_batch")
    state = _state(self, training=False)
    xb, packed = feeds.pad_batch(state.adapter, x, y, sample_weight, None, state.engine.planner)
    with state.engine.scope():
        return _on_batch(state, self, "test_on_batch", xb, packed, kwargs)


def _on_batch(state: ParallelState, model: Any, name: str, x: Any, packed: Any,
              kwargs: Dict[str, Any]) -> Any:
    """Keras's own `name` on the padded batch. Where it hands every replica the whole
    batch (Keras 3 on TF), each replica's step takes its share and the results are the
    metrics read across replicas: one device's, also over the state a fit left (Keras
    3.10 - 3.12 do not reset it there)."""
    call = state.originals[name]
    if not state.adapter.whole_batch_on_batch:
        return call(model, x, packed, _placeholder(x), **kwargs)
    return_dict = kwargs.pop("return_dict", False)
    logs = call(model, x, packed, _placeholder(x), return_dict=True, **kwargs)
    import numpy as np

    read = dict(model.get_metrics_result())  # outside a replica: summed over replicas
    logs = {key: np.array(read.get(key, value)) for key, value in logs.items()}
    return logs if return_dict else state.adapter.flat_metric_results(model, logs)


def _placeholder(x: Any) -> Any:
    """A sample_weight argument for the *_on_batch calls: the bundle carries the real
    ones, but Keras 3.3-3.9 on JAX fail on `sample_weight=None` there ('NoneType' object
    has no attribute 'shape' when distributing the batch)."""
    import numpy as np

    rows = int(structure.leaves(x)[0].shape[0])
    return np.ones((rows,), np.float32)


def _predict_on_batch(self: Any, x: Any) -> Any:
    # One batch: predict() with a batch size that covers it keeps the padding logic
    # in one place.
    rows = max(int(leaf.shape[0]) for leaf in structure.leaves(structure.to_numpy(x)))
    return _predict(self, x, batch_size=max(rows, 1), verbose=0)


def _compile(self: Any, *args: Any, **kwargs: Any) -> None:
    state = state_of(self)
    assert state is not None and state.mirror is not None
    # Flags frozen on the template since the last call count in this compile.
    sync.before_call(state.mirror, training=True, collective=False)
    user_args = _compile_args_from_call(state.originals["compile"], self, *args, **kwargs)
    previous = getattr(self, "optimizer", None)
    compile_replica(self, user_args)
    template = state.template
    if template is not self:
        # The template is compiled too, with its own metric objects, so that
        # `template.save()` records the compile configuration like a one-device model.
        optimizer = _template_optimizer(state, user_args.get("optimizer"), previous)
        own = _compile_arguments(state.adapter, user_args, optimizer, fresh_metrics=True)
        type(template).compile(template, **own)
    sync.relink(state.mirror)


def _set_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
    state = state_of(self)
    assert state is not None
    result = state.originals["set_weights"](self, *args, **kwargs)
    _trained(state)  # set on the parallel model: the template holds them too
    return result


def _load_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
    state = state_of(self)
    assert state is not None
    result = state.originals["load_weights"](self, *args, **kwargs)
    _trained(state)  # loaded into the parallel model: into the template too
    return result


def _logs_callback(state: ParallelState, replica: Any) -> Any:
    """First of the callbacks: an epoch's logs as one device reports them.

    A user's own train_step returns what each replica's metrics read locally; Keras
    averages those over the replicas, which is the one-device figure only when every
    replica saw as many real rows. The metrics' results read across replicas are.
    """
    base = state.adapter.keras.callbacks.Callback

    class OneDeviceLogs(base):  # type: ignore[misc, valid-type]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            results, state.train_results = state.train_results, None
            if "train" not in state.custom_steps or logs is None:
                return
            for key, value in (results or _metric_results(replica)).items():
                if key in logs:
                    logs[key] = value

    return OneDeviceLogs()


def _to_template(state: ParallelState, replica: Any) -> Any:
    """Second of the callbacks: at every epoch end, before the user's callbacks run,
    the template receives the epoch's training state (a callback that saves the
    template - the Keras 2.3 pattern - saves this epoch's weights)."""
    base = state.adapter.keras.callbacks.Callback

    class StateToTemplate(base):  # type: ignore[misc, valid-type]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            state.engine.epoch_end(replica)
            _trained(state)

    return StateToTemplate()


def _from_template(state: ParallelState) -> Any:
    """Last of the callbacks: what the user's callbacks changed in the template at an
    epoch end reaches the replica before the next epoch."""
    base = state.adapter.keras.callbacks.Callback

    class StateFromTemplate(base):  # type: ignore[misc, valid-type]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            assert state.mirror is not None
            sync.before_call(state.mirror, training=True, collective=True)

    return StateFromTemplate()


def _stopped_group(state: ParallelState, replica: Any, feed: feeds.Feed) -> List[Any]:
    """Accumulating, after every other callback: a fit stopped inside an optimizer
    step's group (a callback set `stop_training` in on_train_batch_end) applies the group
    over the rows it has, at once - before validation and the epoch end, as one device's
    short last batch would be."""
    if feed.stopped_group is None:
        return []
    stopped: Callable[[int], Optional[float]] = feed.stopped_group
    base = state.adapter.keras.callbacks.Callback

    class StoppedGroup(base):  # type: ignore[misc, valid-type]
        fed = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.fed += 1
            if not getattr(replica, "stop_training", False):
                return
            factor = stopped(self.fed)
            if factor is not None:
                state.adapter.finish_group(replica, factor)

    return [StoppedGroup()]


_REPLACED: Dict[str, Callable[..., Any]] = {
    "fit": _fit,
    "evaluate": _evaluate,
    "predict": _predict,
    "train_on_batch": _train_on_batch,
    "test_on_batch": _test_on_batch,
    "predict_on_batch": _predict_on_batch,
    "compile": _compile,
    "set_weights": _set_weights,
    "load_weights": _load_weights,
}


def attach(replica: Any, template: Any, engine: EngineOps, adapter: Adapter,
           options: Options) -> Any:
    """Make `replica` the parallel model for `template` on `engine`; returns `replica`."""
    if is_parallel(replica):
        raise bad_value(
            "model", "a model already returned by parallelize()",
            "the original (template) model", "call parallelize() once, on the template",
        )
    klass = type(replica)
    report = step_hooks.StepReport(adapter, engine.planner.replicas, type(template).__name__)
    state = ParallelState(template=template, engine=engine, adapter=adapter, report=report,
                          accumulate_steps=options.accumulate_steps,
                          verify=options.verify, sync_batchnorm=options.sync_batchnorm)
    names = list(_REPLACED) + ["train_step", "test_step", "predict_step", "compute_loss",
                               "compute_metrics"]
    for name in names:
        original = getattr(klass, name, None)
        if original is not None:
            state.originals[name] = original
    for name, kind in _STEP_KINDS.items():
        if not _is_keras_own(state.originals[name]):
            state.custom_steps.add(kind)
    # Written straight into __dict__: Keras's attribute tracking must not see them
    # (the template is not a sub-model of the replica).
    replica.__dict__[STATE_ATTR] = state
    for name, fn in _REPLACED.items():
        replica.__dict__[name] = types.MethodType(fn, replica)
    _install_steps(replica)
    _synchronized_batchnorm(replica, adapter, options.sync_batchnorm)
    engine.prepare_replica(replica)
    return replica


def _synchronized_batchnorm(replica: Any, adapter: Adapter, every: bool) -> None:
    """parallelize(sync_batchnorm=True) - `every` BatchNormalization layer - and a
    layer's own `synchronized=True` (Keras 3 on TensorFlow): moments over the global
    batch with the padding rows left out."""
    from kerasmgpu.batching import MASK

    def row_mask() -> Any:
        frame = step_hooks.current()
        # No packing (the fast path: a batch without padding rows): every row counts.
        if frame is None or frame.packed is None:
            return None
        return adapter.column(frame.packed, MASK)

    if not adapter.mask_batch_statistics(replica, row_mask, every) and every:
        raise bad_value("sync_batchnorm", True, "False with this Keras",
                        "leave sync_batchnorm out")


def _install_steps(replica: Any) -> None:
    """The replica's steps, hooked (see `kerasmgpu.training.steps`).

    Made anew at every compile: JAX caches what it traced by the step function, and a
    step kept from before a compile would bring back the old compile's metrics.
    """
    state = state_of(replica)
    assert state is not None
    adapter, report = state.adapter, state.report
    assert report is not None

    def after(kind: str, frame: step_hooks.Frame, model: Any) -> None:
        report.after(kind, frame, model, state.has_compiled_loss)

    for name, kind in _STEP_KINDS.items():
        original = state.originals[name]
        if kind in state.custom_steps:
            original = _users_step(original)
        replica.__dict__[name] = types.MethodType(
            step_hooks.make_step(adapter, original, kind, hook_metrics, after), replica)
    replica.__dict__["predict_step"] = types.MethodType(
        step_hooks.make_predict_step(adapter, state.originals["predict_step"], hook_metrics), replica)
    for name in ("compute_loss", "compute_metrics"):
        if name in state.originals:
            unbundled = step_hooks.make_unbundling(state.originals[name])
            if name == "compute_loss":
                unbundled = _read_as_one_device(adapter, unbundled)
            replica.__dict__[name] = types.MethodType(unbundled, replica)


# Set while a user's own train_step / test_step runs (on each replica's thread).
_in_users_step = threading.local()


def _users_step(original: Callable[..., Any]) -> Callable[..., Any]:
    def step(*args: Any, **kwargs: Any) -> Any:
        previous = getattr(_in_users_step, "on", False)
        _in_users_step.on = True
        try:
            return original(*args, **kwargs)
        finally:
            _in_users_step.on = previous

    return step


def _read_as_one_device(adapter: Adapter, compute_loss: Callable[..., Any]
                        ) -> Callable[..., Any]:
    """`compute_loss` as a user's own step sees it: one device's value (Keras 3 on TF
    divides it by the replicas inside a replica, and the Keras guide's `Mean("loss")`
    tracker would read 1/replicas of it), the replica's gradient. Keras's own steps
    unscale for their tracker themselves: unchanged there."""

    def compute(*args: Any, **kwargs: Any) -> Any:
        loss = compute_loss(*args, **kwargs)
        if not getattr(_in_users_step, "on", False):
            return loss
        loss = adapter.loss_reading_as_one_device(loss)
        frame = step_hooks.current()
        if frame is not None:  # its loss tracker must not unscale it again
            frame.one_device_losses.add(id(loss))
        return loss

    return compute


def _is_keras_own(function: Any) -> bool:
    module = getattr(function, "__module__", "") or ""
    return module.split(".")[0] in ("keras", "tf_keras", "tensorflow")


def parallel_copy(engine: EngineOps, adapter: Adapter, template: Any, options: Options
                  ) -> Any:
    """Copy `template` into the engine's scope, copy its state, compile like it."""
    with engine.scope():
        replica = adapter.clone_model(template)
        if template.weights:
            replica.set_weights(template.get_weights())
        adapter.carry_state(template, replica)
    attach(replica, template, engine, adapter, options)
    if adapter.is_compiled(template):
        compile_replica(replica, adapter.compile_args(template))
    _link(replica)
    return replica


def adopt(engine: EngineOps, adapter: Adapter, model: Any, options: Options) -> Any:
    """A model built in the engine's scope trains as it is: no copy, weights shared."""
    attach(model, model, engine, adapter, options)
    if adapter.is_compiled(model):
        # Compiled in scope by the user (maybe through its own compile signature, as a
        # GAN's): hook what is there, recompile nothing. The optimizer is made to
        # accumulate first: the engine's hooks (prepare_compiled) read that.
        state = state_of(model)
        assert state is not None
        accumulating(state, getattr(model, "optimizer", None))
        install_hooks(model, adapter.compile_args(model).get("loss"))
    _link(model)
    return model


def _link(replica: Any) -> None:
    state = state_of(replica)
    assert state is not None
    state.mirror = sync.link(
        state.template, replica, state.adapter, state.engine,
        job=state.engine.environment.multi_process(),
        recompile=lambda args: compile_replica(replica, args))
