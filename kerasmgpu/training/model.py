"""The model `parallelize()` returns: a real Keras model whose training entry points pad.

The replica is the user's model itself where the engine owns it (built in
`kerasmgpu.scope()`; always on torch; on JAX in one process once its variables are laid
out in place), else a copy built in the engine's scope (TensorFlow; JAX in several
processes), compiled with the user's own compile arguments. Its class is untouched - it saves, loads and prints as what it is,
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

The parts: `state` (`ParallelState`, `state_of`, the feeds), `compiling` (compile and
the step hooks installed at each compile), `calls` (the replaced calls) and this module,
which attaches them to a model (`attach`, `adopt`, `hold`, `parallel_copy`).
"""

from __future__ import annotations

import inspect
import types
import warnings
from typing import Any, Callable, Dict, List, Tuple

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.data import feeds, structure
from kerasmgpu.env.versions import frameworks_own
from kerasmgpu.options import Options
from kerasmgpu.training import refusals, sync, terms, tried_layers
from kerasmgpu.training import steps as step_hooks
from kerasmgpu.training import verify as self_check
from kerasmgpu.training.calls import _REPLACED
from kerasmgpu.training.compiling import (
    _STEP_KINDS,
    _install_steps,
    accumulating,
    compile_replica,
    install_hooks,
)
from kerasmgpu.training.ops import EngineOps
from kerasmgpu.training.state import STATE_ATTR, ParallelState, is_parallel, state_of


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


# Keras 2.3's calls and the argument each reads its data from; the `*_generator` calls
# are how Keras 2.3 code trains on a generator or Sequence.
_CHECKED_CALLS = {"fit": "x", "evaluate": "x", "predict": "x", "fit_generator": "generator",
                  "evaluate_generator": "generator", "predict_generator": "generator"}


def _checked_calls(model: Any, state: ParallelState) -> None:
    """parallelize(verify=True) on a model whose calls are Keras's own (`hold`): fit
    checks its first (and first uneven) batch, evaluate and predict their first batch's
    outputs, then Keras's call runs, on a generator the one the check handed back.
    Wraps the calls as they are now, so that wrappers the engine puts around them later
    (the template's changes reaching a copy first) run before the check."""
    klass = type(model)
    # Calls made while a checked call runs are Keras's own (fit hands a generator to
    # self.fit_generator, which validates through self.evaluate_generator) or a
    # callback's: they run unchecked, as the batches they read are not the call's first.
    running: List[str] = []

    def checking(name: str, data: str, own: Any) -> Callable[..., Any]:
        signature = inspect.signature(getattr(klass, name))
        call_name = name.replace("_generator", "")
        place = list(signature.parameters).index(data) - 1  # its position after self

        def checked(*args: Any, **kwargs: Any) -> Any:
            if running:
                return own(*args, **kwargs)
            given = signature.bind(model, *args, **kwargs)
            given.apply_defaults()
            call = given.arguments
            given_data = call[data]
            running.append(name)
            try:
                if call_name != "fit":
                    call[data] = self_check.check_outputs(
                        state, model, given_data, call.get("batch_size"), call_name)
                else:
                    call[data] = _checked_fit(call, data)
                if call[data] is not given_data:  # the generator the check handed back
                    args, kwargs = _replaced(args, kwargs, place, data, call[data])
                return own(*args, **kwargs)
            finally:
                running.pop()

        return checked

    def _checked_fit(call: Dict[str, Any], data: str) -> Any:
        """What fit reads in place of `call[data]` once its first batches are checked."""
        x, y, weights = call[data], call.get("y"), call.get("sample_weight")
        if call.get("validation_split") and call.get("validation_data") is None and \
                structure.is_array_like(x):
            (x, y, weights), _ = feeds.split_validation(x, y, weights, call["validation_split"])
        handed = self_check.before_fit(state, model, x, y, weights, call["class_weight"],
                                       call.get("batch_size"), state.sync_batchnorm)
        return call[data] if handed is x else handed

    for name, data in _CHECKED_CALLS.items():
        own = getattr(model, name, None)
        if own is not None:
            model.__dict__[name] = checking(name, data, own)


def _replaced(args: Tuple[Any, ...], kwargs: Dict[str, Any], place: int, name: str,
              value: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """The call's arguments as given, with argument `name` (positional `place`) set to
    `value` (Keras 2.3's *_generator calls take few positional arguments: the others
    must stay keywords)."""
    if len(args) > place:
        return args[:place] + (value,) + args[place + 1:], kwargs
    return args, {**kwargs, name: value}


def attach(replica: Any, template: Any, engine: EngineOps, adapter: Adapter,
           options: Options) -> Any:
    """Make `replica` the parallel model for `template` on `engine`; returns `replica`."""
    if is_parallel(replica):
        raise bad_value(
            "model", "a model already returned by parallelize()",
            "the original (template) model", "call parallelize() once, on the template",
        )
    _warn_assigning_steps(engine, template)
    klass = type(replica)
    report = step_hooks.StepReport(adapter, engine.planner.replicas, type(template).__name__,
                                   one_program=engine.one_program)
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
    if not engine.slices_in_graph and engine.planner.replicas > 1:
        state.batch_terms = terms.batch_terms(
            adapter, template, {kind: state.originals[name]
                                for name, kind in _STEP_KINDS.items()
                                if kind in state.custom_steps})
        # A short batch whole on every replica computes one device's terms, whatever
        # they are (`batching.BatchPlan.whole`): as copies where each replica runs its
        # own step, laid out replicated under one program (in a job, every process
        # feeding it whole).
        state.layer_terms = _tried_layers(engine, adapter, template)
        state.whole_batches = bool(state.batch_terms or state.layer_terms)
        report.layer_terms = state.layer_terms
    # Written straight into __dict__: Keras's attribute tracking must not see them
    # (the template is not a sub-model of the replica).
    replica.__dict__[STATE_ATTR] = state
    for name, fn in _REPLACED.items():
        replica.__dict__[name] = types.MethodType(fn, replica)
    _install_steps(replica)
    _synchronized_batchnorm(replica, adapter, options.sync_batchnorm)
    engine.prepare_replica(replica)
    return replica


# The methods of a model that run in its step: a user's own that assigns variables is
# named where each replica runs its own step.
_STEP_METHODS = ("train_step", "test_step", "compute_loss", "compute_metrics")


def _warn_assigning_steps(engine: EngineOps, template: Any) -> None:
    """A train_step / test_step / compute_loss / compute_metrics of the user's that
    assigns variables, where each replica runs its own step, is named in a warning: each
    replica runs it on its share, which gives one device's state where the value is
    computed from what every replica holds alike (an average of the weights after the
    step, as Keras's DDIM example keeps: exact, tested) and not where it is computed
    from the rows (a count of them). No made-up rows tell the two apart without running
    an optimizer step, so it is said, not refused - as for a layer that cannot be tried
    (`_tried_layers`)."""
    if engine.one_program or engine.slices_in_graph or engine.planner.replicas <= 1:
        return
    methods = {name: getattr(type(template), name, None) for name in _STEP_METHODS}
    names = terms.assigning_steps(template, {
        name: method for name, method in methods.items()
        if method is not None and not _is_keras_own(method)})
    if names:
        warnings.warn(
            f"kerasmgpu: {type(template).__name__}: its own {' and '.join(names)} assigns "
            "variables (read from its code). Each replica runs it on its share of the "
            "batch, and TensorFlow combines the replicas' values by each variable's "
            "aggregation (PyTorch: each process keeps its own): one device's state where "
            "the value is computed from what every replica holds alike (an average of the "
            "weights after the step), not where it is computed from the rows (a count of "
            "them read 8232 for one device's 44 aggregated by the sum, 36 by the mean, on "
            "Keras 3 + TensorFlow). Fix: update state computed from the rows in a "
            "callback (on_train_batch_end runs once per global batch), or train with "
            "gpus=1.", stacklevel=4)


def _tried_layers(engine: EngineOps, adapter: Adapter, template: Any) -> List[str]:
    """What the user's layers do with the rows they are given beyond the loss - values
    added with `add_metric`, variables assigned in `call`, outputs read from the batch's
    other rows - in words; short batches go whole for them (`tried_layers`). Where each
    replica runs its own step what does not combine over replicas as one device's is
    refused, before anything trains - those and the terms added with `add_loss` (found
    and made whole by `terms.batch_terms`) that are not a mean over the rows; on torch an
    assigned variable is (each process keeps its own, rank 0's at each epoch end)."""
    found: List[str] = []
    untried: List[str] = []
    metric_layers = [] if engine.one_program else terms.metric_layers(adapter, template)
    if metric_layers:
        bad, not_tried = tried_layers.added_values(adapter, metric_layers)
        if bad:
            raise refusals.not_a_mean_refused(bad)
        untried += not_tried
        found += [f"add_metric in {type(layer).__name__}.call (layer {layer.name!r})"
                  for layer in metric_layers]
    loss_layers = [] if engine.one_program else terms.loss_layers(adapter, template)
    if loss_layers:
        bad, not_tried = tried_layers.added_losses(adapter, loss_layers)
        if bad:
            raise refusals.not_a_mean_refused(bad, what="add_loss")
        untried += not_tried
    state_layers = terms.state_layers(adapter, template)
    assigning = [f"{type(layer).__name__}.call assigning variables (layer {layer.name!r})"
                 for layer in state_layers]
    if state_layers and not engine.one_program:
        if not engine.combines_assigned_variables:
            raise refusals.assigned_refused(assigning, combined=False)
        bad, not_tried = tried_layers.variable_updates(adapter, state_layers)
        if bad:
            raise refusals.assigned_refused(bad, combined=True)
        untried += not_tried
    found += assigning
    mixing = tried_layers.mixed_rows(adapter, terms.row_layers(adapter, template))
    if mixing and not engine.one_program:
        raise refusals.mixed_rows_refused(mixing)
    found += mixing
    if untried:
        warnings.warn(
            f"kerasmgpu: {type(template).__name__}: {', '.join(untried)} could not be tried "
            "on made-up rows: each replica computes such a value, or updates such a "
            "variable, from its share of the batch, and the replicas' results are "
            "averaged - one device's for a mean over the rows only (batches that do not "
            "divide go whole to every replica for them). Fix: add and update only means "
            "over the rows, or train with Keras 3 on JAX.", stacklevel=3)
    return found


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


def _is_keras_own(function: Any) -> bool:
    return frameworks_own(function)


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
        compile_replica(replica, adapter.compile_args(template), like=template)
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
    # A template trained in place by another parallel model (JAX, other devices).
    own = state_of(state.template) if state.template is not replica else None
    state.mirror = sync.link(
        state.template, replica, state.adapter, state.engine,
        job=state.engine.job.multi_process(),
        recompile=lambda args: compile_replica(replica, args, like=state.template),
        template_scope=own.engine.scope if own is not None else None)
