"""The parallel model's calls: `fit`, `evaluate`, `predict`, the `*_on_batch` calls,
`compile`, `set_weights` and `load_weights`, as `kerasmgpu.training.model.attach` puts
them on the replica (`_REPLACED`). They hand Keras padded feeds (`kerasmgpu.data.feeds`)
and keep the template equal to the replica (`kerasmgpu.training.sync`)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kerasmgpu import accumulation, batching
from kerasmgpu._errors import bad_value, not_compiled, part_of
from kerasmgpu.data import feeds, structure
from kerasmgpu.data.base import num_rows
from kerasmgpu.env.versions import frameworks_own
from kerasmgpu.training import agree, parts, resume, sync
from kerasmgpu.training import steps as step_hooks
from kerasmgpu.training import verify as self_check
from kerasmgpu.training.compiling import (
    _compile_args_from_call,
    _compile_arguments,
    _template_optimizer,
    compile_replica,
)
from kerasmgpu.training.state import ParallelState, state_of

# --- the replaced methods ---------------------------------------------------------------------


def _state(model: Any, *, training: bool, collective: bool = True) -> ParallelState:
    """The model's state, after the template's changes reached the replica."""
    return _state_agreeing(model, training=training, collective=collective)[0]


def _several_processes(model: Any) -> bool:
    held = state_of(model)
    assert held is not None
    return held.engine.job.multi_process()


def _state_of_batch_call(model: Any, name: str, *, training: bool, x: Any, y: Any,
                         sample_weight: Any, class_weight: Any = None) -> ParallelState:
    """`_state` of a *_on_batch call; the first of each kind also has the job agree that
    every process was given it alike (`agree`: a digest a step would cost on every call,
    and a loop feeding each process its own batches shows at its first)."""
    held = state_of(model)
    assert held is not None
    first = name not in held.described_calls
    described = agree.describe(first and _several_processes(model), name, x, y,
                               sample_weight, {"class_weight": class_weight})
    state, agreed = _state_agreeing(model, training=training,
                                    flags=described.flags() if described else [])
    agree.check(state.engine, described, agreed)
    state.described_calls.add(name)
    return state


def _state_agreeing(model: Any, *, training: bool, collective: bool = True,
                    flags: Sequence[bool] = ()) -> Tuple[ParallelState, List[bool]]:
    """`_state`, and `flags` of this process as the job agreed on them - in the one
    collective that starts a call of every process (alone: as they are)."""
    state = state_of(model)
    assert state is not None and state.mirror is not None
    agreed = sync.before_call(state.mirror, training=training, collective=collective,
                              also=flags)
    return state, agreed


def _agreed_callbacks(model: Any, callbacks: List[Any], *, training: bool,
                      described: Optional[agree.Described] = None
                      ) -> Tuple[ParallelState, bool]:
    """`_state` of a fit/evaluate, the job agreeing in the same collective on what the
    engine needs to know of the user's callbacks (`Engine.callback_flags`: before the
    chief-only ones are dropped, fit's validation passes included), for a fit, whether
    one may change a model (then the template is checked at every epoch end), and
    whether every process was given the call alike (`agree`: raises where not)."""
    held = state_of(model)
    assert held is not None
    flags = held.engine.callback_flags(callbacks)
    extra = [_callbacks_may_change_models(callbacks)] if training else []
    inputs = described.flags() if described is not None else []
    state, agreed = _state_agreeing(model, training=training, flags=flags + extra + inputs)
    agree.check(state.engine, described, agreed[len(flags) + len(extra):])
    state.engine.use_callback_flags(agreed[:len(flags)])
    return state, bool(extra and agreed[len(flags)])


def _callbacks_may_change_models(callbacks: List[Any]) -> bool:
    """Whether a callback of the user's may change a model during a fit (then the
    template and the processes must agree again at every epoch end): any but Keras's
    progress bar and history, which change nothing."""
    for callback in callbacks:
        kind = type(callback)
        if not (frameworks_own(kind) and kind.__name__ in ("ProgbarLogger", "History")):
            return True
    return False


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
    callbacks = list(callbacks or [])
    described = agree.describe(
        _several_processes(self), "fit", x, y, sample_weight, {
            "batch_size": batch_size, "epochs": epochs, "initial_epoch": initial_epoch,
            "steps_per_epoch": steps_per_epoch, "shuffle": shuffle,
            "class_weight": class_weight, "validation_split": validation_split,
            "validation_steps": validation_steps,
            "validation_batch_size": validation_batch_size,
            "validation_freq": validation_freq}, validation_data, with_validation=True)
    state, may_change = _agreed_callbacks(self, callbacks, training=True, described=described)
    if described is not None:  # a generator's first batch, taken, is handed back
        x, validation_data = described.x, described.validation
    if validation_split and validation_data is None:
        train, held_out = feeds.split_validation(x, y, sample_weight, validation_split)
        (x, y, sample_weight), validation_data = train, held_out
    if state.accumulate_steps > 1 and state.batch_terms and structure.is_array_like(x):
        accumulation.check_batch_terms(
            state.batch_terms, batching.batch_sizes(
                num_rows({"x": x, "y": y, "sample_weight": sample_weight}),
                batch_size or 32), state.accumulate_steps)
    if state.verify:
        x = self_check.before_fit(state, self, x, y, sample_weight, class_weight, batch_size,
                                  state.sync_batchnorm)
    user_callbacks = state.engine.worker_callbacks(callbacks)
    job = state.engine.job
    position = resume.plan(state.adapter, user_callbacks,
                           rank=job.global_rank() if job.multi_process() else 0,
                           alone=not job.multi_process(),
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
    val_data = val_feed = None
    if validation_data is not None:
        vx, vy, vsw = structure.unpack(validation_data)
        with part_of("validation_data"):
            val_feed = state.feed(
                vx, kind="test", model=self, y=vy, sample_weight=vsw,
                batch_size=validation_batch_size or batch_size, training=False,
            )
        val_data = val_feed.data
        if validation_steps is None and val_feed.needs_steps:
            validation_steps = val_feed.steps
    before, after = position.callbacks() if position is not None else ([], [])
    # Without callbacks of the user's nothing changes the template during the fit: no
    # check (and, in a job, no collective) at its epoch ends.
    callbacks = (before + [_logs_callback(state, self), _to_template(state, self)]
                 + user_callbacks + after + ([_from_template(state)] if may_change else [])
                 + _stopped_group(state, self, train_feed))
    preemption = position.preemption() if position is not None else contextlib.nullcontext()
    with state.engine.scope(), preemption, parts.split_steps(
            state.engine, self, {"train": train_feed, "test": val_feed}):
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
    described = agree.describe(_several_processes(self), "evaluate", x, y, sample_weight,
                               {"batch_size": batch_size, "steps": steps})
    state, _ = _agreed_callbacks(self, list(callbacks or []), training=False,
                                 described=described)
    if described is not None:
        x = described.x
    if state.verify:
        x = self_check.check_outputs(state, self, x, batch_size, "evaluate")
    feed = state.feed(x, kind="test", model=self, y=y, sample_weight=sample_weight,
                      batch_size=batch_size, training=False)
    if steps is None and feed.needs_steps:
        steps = feed.steps
    with state.engine.scope(), parts.split_steps(state.engine, self, {"test": feed}):
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
    if held is not None and held.engine.job.multi_process():
        # Each worker would only see its own rows; every worker holds all the weights,
        # so each predicts everything on its own (on the template, one device, as it
        # is: a change made on one process alone reaches the others at the next call
        # they make together).
        template = held.template
        return type(template).predict(template, x, batch_size=batch_size, verbose=verbose,
                                      steps=steps, callbacks=callbacks, **kwargs)
    state = _state(self, training=False, collective=False)
    if state.verify:
        x = self_check.check_outputs(state, self, x, batch_size, "predict")
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
    state = _state_of_batch_call(self, "train_on_batch", training=True, x=x, y=y,
                                 sample_weight=sample_weight, class_weight=class_weight)
    xb, packed = feeds.pad_batch(state.adapter, x, y, sample_weight, class_weight,
                                 state.planner)
    with state.engine.scope():
        logs = _on_batch(state, self, "train_on_batch", xb, packed, kwargs)
    _trained(state)
    return logs


def _test_on_batch(self: Any, x: Any, y: Any = None, sample_weight: Any = None,
                   **kwargs: Any) -> Any:
    _compiled_for(self, "test_on_batch")
    state = _state_of_batch_call(self, "test_on_batch", training=False, x=x, y=y,
                                 sample_weight=sample_weight)
    xb, packed = feeds.pad_batch(state.adapter, x, y, sample_weight, None, state.planner)
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
    _changed_here(state)
    return result


def _load_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
    state = state_of(self)
    assert state is not None
    result = state.originals["load_weights"](self, *args, **kwargs)
    _trained(state)  # loaded into the parallel model: into the template too
    _changed_here(state)
    return result


def _changed_here(state: ParallelState) -> None:
    # Set by this process alone, maybe (a checkpoint loaded on the chief): the next
    # call all processes make tells them, and each takes the chief's.
    if state.mirror is not None and state.mirror.job:
        state.mirror.changed_here = True


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
