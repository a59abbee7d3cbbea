"""Compiling the parallel model: the replica compiled with the user's arguments (the
optimizer made where the replica trains, and made to accumulate), and its losses,
metrics and steps hooked (`kerasmgpu.training.steps`) at every compile."""

from __future__ import annotations

import inspect
import threading
import types
from contextlib import nullcontext
from typing import Any, Callable, Dict, Optional

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.data import structure
from kerasmgpu.env.versions import FRAMEWORK_PACKAGES
from kerasmgpu.training import steps as step_hooks
from kerasmgpu.training.state import ParallelState, state_of

_STEP_KINDS = {"train_step": "train", "test_step": "test"}


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
            adapter.wrap_update_state(metric, step_hooks.masked_update(
                adapter, metric, one_program=state.engine.one_program,
                whole=lambda kind: bool(state.report and state.report.whole.get(kind))))

    return on_metric


def compile_replica(replica: Any, args: Dict[str, Any], like: Any = None) -> None:
    """Compile the replica in scope with the user's arguments, then hook its losses and
    metrics. Nothing of kerasmgpu is compiled in: what the model saves is the user's.
    `like`: the template whose compile this repeats (its trainable layers as compiled:
    `Adapter.compiled_as`); None: a compile of the parallel model itself."""
    state = state_of(replica)
    assert state is not None
    adapter = state.adapter
    args = {k: v for k, v in args.items() if v is not None or k == "loss"}
    scaled = _loss_scaling(state, args.get("loss"))
    with state.engine.scope():
        optimizer = _replica_optimizer(state, replica, args.get("optimizer"))
        compiled = _compile_arguments(adapter, args, optimizer,
                                      fresh_metrics=state.template is not replica)
        with adapter.compiled_as(like, replica) if like is not None else nullcontext():
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


def _loss_scaling(state: ParallelState, loss: Any) -> bool:
    """Whether the compile `loss=` reduces by a mean (its padding weight is scaled);
    refuses, before anything is compiled, what no padding weight makes one device's."""
    unreduced = step_hooks.unreduced_losses(loss)
    own = state.originals.get("train_step")
    # A step of the user's reduces the values itself - unless it hands over to Keras's
    # (`super().train_step(data)` names it).
    keras_reduces = "train" not in state.custom_steps or "train_step" in getattr(
        getattr(own, "__code__", None), "co_names", ())
    if unreduced and keras_reduces:
        raise bad_value(
            "loss", ", ".join(unreduced),
            "a compiled loss reduced over the batch where Keras's own step trains: with "
            "reduction='none' Keras differentiates the per-row losses as their sum and "
            "History averages them weighing each by its batch's size, which no "
            "combination of the replicas' shares reproduces (weights one device's, "
            "History's loss 1.04 for one device's 0.41 on Keras 3 + TensorFlow)",
            "compile with reduction='sum' (the same gradients: Keras sums the per-row "
            "losses to differentiate them) or the default 'sum_over_batch_size'", raw=True)
    scaled = step_hooks.reduction_is_mean(state.adapter, loss)
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
        scaled = _loss_scaling(state, loss)
    state.has_compiled_loss = loss is not None
    _install_steps(replica)
    adapter.check_internals(replica)
    adapter.install_loss_hook(
        replica, step_hooks.loss_hook(adapter, scaled, lambda: hook_metrics(replica)),
        lambda values, mask, reduction: step_hooks.loss_values(adapter, values, mask, reduction))
    adapter.install_metrics_hook(replica, _on_compiled_metric(replica))
    # Compile losses and metrics of one value per batch: whole short batches on one
    # program, refused where each replica runs its own step.
    state.tell_batch_metrics(replica)
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


def frameworks_own_caller(depth: int) -> bool:
    """Whether the function `depth` frames above the one calling this is the
    frameworks' own code (1: its direct caller - Keras's `Trainer._compute_loss`
    calling `compute_loss`)."""
    frame = inspect.currentframe()
    for _ in range(depth + 1):
        frame = frame.f_back if frame is not None else None
    if frame is None:
        return False
    return (frame.f_globals.get("__name__", "") or "").split(".")[0] in FRAMEWORK_PACKAGES


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
    unscale for their tracker themselves: unchanged there - also where a user's step
    hands over to Keras's (`return super().train_step(data)`), told by the caller being
    Keras's own code (History read 3 times one device's loss on 3 replicas)."""

    def compute(*args: Any, **kwargs: Any) -> Any:
        loss = compute_loss(*args, **kwargs)
        if not getattr(_in_users_step, "on", False) or frameworks_own_caller(1):
            return loss
        loss = adapter.loss_reading_as_one_device(loss)
        frame = step_hooks.current()
        if frame is not None:  # its loss tracker must not unscale it again
            frame.one_device_losses.append(loss)
        return loss

    return compute
