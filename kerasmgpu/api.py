"""The public calls. They validate, pick a route and forward; nothing else.

The two choices a process makes once - the active Keras (`registry.active()`) and the
job it belongs to (`cluster.job()`) - are read here and handed down as objects: the
adapter and the engine class come from the entry in hand, the engine is given the job,
and a call's options travel as one `Options` value.

Every argument is checked before the model is touched: a bad `gpus`, an unknown
`route`, a non-model or a model of another Keras raise here, with what was received,
what is allowed and the fix.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Tuple, TypeVar, Union

from kerasmgpu import engines, inventory, registry
from kerasmgpu.env import cluster
from kerasmgpu.env import devices as devices_module
from kerasmgpu.env.devices import Device
from kerasmgpu.env.versions import VIRTUAL_DEVICES_ENV
from kerasmgpu.options import Options
from kerasmgpu.routes import Route, check_route_fits, parse_route

if TYPE_CHECKING:
    from kerasmgpu.adapters import Adapter
    from kerasmgpu.engines.base import Engine

ModelT = TypeVar("ModelT")

_warned_single = False
_lock = threading.Lock()
# One engine per route and device set, for the life of the process: every `scope()` and
# `parallelize()` over the same devices shares one tf.distribute strategy or JAX layout,
# so a model built in one `with kerasmgpu.scope():` block can be recompiled in another,
# or parallelized, and trained (TF refuses to mix the variables of two strategies, JAX
# to mix two layouts' arrays); each new strategy would also take its own collective keys.
_engines: Dict[Tuple[Any, ...], Engine] = {}


def _engine_key(cls: type[Engine], adapter: Adapter, devices: Tuple[Device, ...]
                ) -> Tuple[Any, ...]:
    # The release too: an engine keeps its adapter, whose hooks are the release's (a
    # test that pretends another release must not leave its adapter to the next call).
    return (cls, adapter.line, adapter.backend, str(adapter.version), devices)


def _engine(cls: type[Engine], adapter: Adapter, devices: Tuple[Device, ...],
            job: cluster.ClusterEnvironment) -> Engine:
    """The engine of this route over these devices, made once (a process's job does
    not change while it runs)."""
    key = _engine_key(cls, adapter, devices)
    with _lock:
        engine = _engines.get(key)
    if engine is None:
        engine = cls(adapter, devices, job=job)
        with _lock:
            engine = _engines.setdefault(key, engine)
    return engine


def _warn_single_device(devices: Tuple[Device, ...]) -> None:
    global _warned_single
    with _lock:
        if _warned_single:
            return
        _warned_single = True
    warnings.warn(
        "kerasmgpu: one device available "
        f"({', '.join(str(d) for d in devices) or 'cpu'}): training on it as usual. "
        f"On a machine without GPUs, set {VIRTUAL_DEVICES_ENV}=N or call "
        "kerasmgpu.virtual_devices(N) first to run N replicas on the CPU.",
        stacklevel=3,
    )


def _prepare(
    gpus: devices_module.GpusArg, route: Union[str, Route, None], model: Any = None
) -> Tuple[Adapter, type[Engine], Tuple[Device, ...], cluster.ClusterEnvironment]:
    """Detect, validate every argument, and choose the devices - touching nothing.

    The choices made once here - the registry entry of the active Keras and backend, and
    the job this process belongs to - are what the engine is built from."""
    from kerasmgpu import adapters
    from kerasmgpu._errors import bad_value
    from kerasmgpu.training import model as parallel_model

    chosen = parse_route(route)
    active = registry.active()
    adapters.check_release(active)
    job = cluster.job()
    if job.multi_process():
        adapters.check_multi_process(active)
    entry = active.entry_or_raise()
    if chosen is not None:
        check_route_fits(chosen, entry)
    adapter = adapters.load(active)
    if model is not None:
        adapters.check_model(model, adapter)
        state = parallel_model.state_of(model)
        # A model trained in place (JAX, torch, built in scope) is its own template: a
        # second parallelize() of it on other devices trains a copy there (the same
        # devices: refused by the engine, as here).
        if state is not None and state.template is not model:
            raise bad_value(
                "model", "a model already returned by parallelize()",
                "the model you built (the template)",
                "call parallelize() once, on the model you built",
            )
    cls = engines.load(entry)
    selected = devices_module.resolve_gpus(gpus, cls.available_devices(adapter, job))
    return adapter, cls, selected, job


def parallelize(
    model: ModelT,
    gpus: devices_module.GpusArg = None,
    *,
    route: Union[str, Route, None] = None,
    accumulate_steps: int = 1,
    sync_batchnorm: Optional[bool] = None,
    verify: Optional[bool] = None,
) -> ModelT:
    """A model that trains on all requested devices, for whatever Keras is installed.

    `gpus`: None (every device), a count, or a list of device ids. The model may be
    built and compiled anywhere. `fit(batch_size=B)` means B samples per step in total,
    split evenly over the replicas (a remainder is padded and masked, never dropped);
    losses, metrics and weights equal single-device training on the same batches.
    The model you pass keeps receiving the trained weights (save it as usual).
    With one device - `gpus=1`, `gpus=[0]`, or the only one there is - the model is
    returned unchanged; `gpus=[k]` trains a one-replica copy on device k.
    `accumulate_steps=k`: k consecutive batches of `fit()` make one optimizer step,
    equal to one step over their rows together on one device (README, Semantics).
    `sync_batchnorm=True`: BatchNormalization normalizes over the whole global batch,
    padding rows left out, as one device does (every line; on Keras 2.3 a functional or
    Sequential model). False: each replica's own statistics, as tf.distribute. None (left
    out): False, and a model with BatchNormalization layers gets a warning saying its
    results differ from one device's.
    `verify=True` (None: the environment variable KERASMGPU_VERIFY=1; an explicit value
    wins): each fit checks its first global batch and the first the replicas share the
    other way (padded or whole after one that divides, and the reverse) - loss and gradients
    on the template on one device against the parallel model - and evaluate / predict
    their first batch's outputs, raising `kerasmgpu.VerificationError` before anything is
    applied (every route; docs/semantics.md says what each compares).
    """
    from kerasmgpu.accumulation import check_accumulate_steps
    from kerasmgpu.training import verify as self_check

    steps = check_accumulate_steps(accumulate_steps)
    checked = self_check.resolve(verify, os.environ.get(self_check.VERIFY_ENV, ""))
    if model is None:
        from kerasmgpu._errors import bad_type

        raise bad_type("model", None, "a Keras model", "pass the model you built")
    adapter, cls, selected, job = _prepare(gpus, route, model)
    _check_options(adapter, cls, model, steps, sync_batchnorm,
                   several=job.multi_process())
    options = Options(accumulate_steps=steps, sync_batchnorm=bool(sync_batchnorm),
                      verify=checked)
    parallel = _parallelize(model, gpus, adapter, cls, selected, job, options)
    if sync_batchnorm is None:
        _warn_unsynchronized_batchnorm(adapter, cls, model, parallel)
    return parallel


def _warn_unsynchronized_batchnorm(adapter: Adapter, cls: type[Engine], model: Any,
                                   parallel: Any) -> None:
    """sync_batchnorm left out on a model with BatchNormalization layers: their
    statistics are not one device's (each replica's, or over padding rows too on one
    program), which the user did not choose - said once, on the chief."""
    from kerasmgpu.training.state import state_of

    state = state_of(parallel)
    if state is None or state.engine.planner.replicas < 2 or (
            state.engine.job.multi_process() and not state.engine.job.is_chief()):
        return
    norm = getattr(adapter.keras.layers, "BatchNormalization", None)
    layers = [layer.name for layer in adapter.layers_of(model) if norm is not None
              and isinstance(layer, norm) and not getattr(layer, "synchronized", False)]
    if not layers:
        return
    how = ("take their batch statistics over the global batch with the padding rows of a "
           "batch that does not divide counted" if state.engine.one_program else
           "normalize each replica's share of the batch with its own statistics (as "
           "tf.distribute does)")
    fix = ("pass sync_batchnorm=True for one device's statistics over the global batch, "
           "padding left out (one all-reduce per layer per step where each replica runs "
           "its own step), or sync_batchnorm=False to keep them as they are and silence "
           "this" if cls.syncs_batchnorm else "pass sync_batchnorm=False to keep them as "
           "they are (this route cannot synchronize them) and silence this")
    warnings.warn(
        f"kerasmgpu: {type(model).__name__}: its BatchNormalization layers "
        f"{', '.join(repr(n) for n in layers[:4])}{' ...' if len(layers) > 4 else ''} {how}: "
        f"training and its figures differ from one device's. Fix: {fix}.", stacklevel=3)


def _check_options(adapter: Adapter, cls: type[Engine], model: Any, steps: int,
                   sync_batchnorm: Any, several: bool = False) -> None:
    """The options beyond the devices, refused before anything is touched where this
    route cannot honour them exactly (what each engine can do is its class's flags)."""
    from kerasmgpu._errors import bad_type, bad_value
    from kerasmgpu.training.compiling import own_accumulation_error

    if sync_batchnorm is not None and not isinstance(sync_batchnorm, bool):
        raise bad_type("sync_batchnorm", sync_batchnorm, "True, False or None",
                       "pass sync_batchnorm=True or leave it out")
    if sync_batchnorm and not cls.syncs_batchnorm:
        raise bad_value(
            "sync_batchnorm", True,
            f"False on the {cls.route} route of {adapter.line.value} in this release "
            "(sync_batchnorm=True: tf.keras, tf_keras and Keras 3)",
            "leave sync_batchnorm out (BatchNormalization then normalizes each replica's "
            "rows: README, Semantics), or train with tf.keras 2.12+ or Keras 3")
    optimizer = getattr(model, "optimizer", None)
    own = adapter.own_accumulation(optimizer) if optimizer is not None else 1
    if own > 1 and steps > 1:
        raise own_accumulation_error(own, steps)
    if steps > 1 and not cls.accumulates:
        raise bad_value(
            "accumulate_steps", steps,
            f"1 on the {cls.route} route of {adapter.line.value} in this release "
            "(accumulate_steps > 1: Keras 3 - before 3.8 with SGD or RMSprop -, tf.keras "
            "2.12+ or tf_keras)",
            "raise batch_size instead, or train with Keras 3 or tf_keras")
    if steps > 1 and several and not cls.accumulates_in_processes:
        raise bad_value(
            "accumulate_steps", steps, f"1 on the {cls.route} route with several processes "
            "in this release (accumulate_steps > 1 on TensorFlow: one process)",
            "train in one process on the machine's GPUs, or on JAX or torch")
    problem = adapter.accumulation_problem() if steps > 1 else None
    if problem is not None:
        raise bad_value("accumulate_steps", steps, f"1 here: {problem}",
                        "upgrade Keras (Keras 3, tf.keras 2.12+ and tf_keras "
                        "accumulate), or raise batch_size instead")


def _parallelize(model: ModelT, gpus: devices_module.GpusArg, adapter: Adapter,
                 cls: type[Engine], selected: Tuple[Device, ...],
                 job: cluster.ClusterEnvironment, options: Options) -> ModelT:
    steps = options.accumulate_steps
    scoped = _engines.get(_engine_key(cls, adapter, selected))
    if scoped is not None and scoped.owns(model):
        # Built in `kerasmgpu.scope()` over these devices (even after the `with`
        # block): adopted as it is, also on one device.
        adopted: ModelT = scoped.parallelize(model, options)
        _chief_writes_the_template(model, adopted, scoped)
        _saves_replace_atomically(model, adopted, scoped)
        return adopted
    if devices_module.default_device_only(selected) and cls.single_device_passthrough(
            adapter, job):
        if steps > 1:
            from kerasmgpu._errors import bad_value

            raise bad_value(
                "accumulate_steps", steps, "1 when parallelize() returns the model as it is "
                f"(one device: {', '.join(str(d) for d in selected) or 'cpu'})",
                "compile with the optimizer's own gradient_accumulation_steps on one device")
        # Only "every device" can surprise with one: gpus=1 / gpus=[0] got what they asked.
        if gpus is None and not any(d.kind == "gpu" for d in selected):
            _warn_single_device(selected)
        return model
    engine = _engine(cls, adapter, selected, job)
    parallel: ModelT = engine.parallelize(model, options)
    _chief_writes_the_template(model, parallel, engine)
    _saves_replace_atomically(model, parallel, engine)
    return parallel


def _saves_replace_atomically(model: Any, parallel: Any, engine: Engine) -> None:
    """The files kerasmgpu writes for the user - the parallel model's (a ModelCheckpoint
    of the fit), and in a job of several processes the chief's template - are written
    under a temporary name and renamed over the old file (`process.backups`): a kill
    while one is written leaves the previous one whole."""
    from kerasmgpu.process import backups

    # The parallel model may be the user's own (Keras 3 on JAX trains it in place, a
    # model built in kerasmgpu.scope(), torch): its saves are the fit's all the same -
    # but not on a process other than the chief, where the user's own model's saves
    # write nothing (_chief_writes_the_template) or are TensorFlow's collective.
    job = engine.job
    mine = parallel is not model or not job.multi_process() or job.is_chief()
    owners = [parallel] if mine else []
    if job.multi_process() and job.is_chief() and model is not parallel:
        owners.append(model)
    for owner in owners:
        for name in ("save", "save_weights"):
            method = getattr(owner, name, None)
            if callable(method) and not getattr(method, "_kerasmgpu_atomic", False):
                owner.__dict__[name] = backups.saving_atomically(method)


def _chief_writes_the_template(model: Any, parallel: Any, engine: Engine) -> None:
    """The saving policy of a job of several processes: only the chief (process 0)
    writes the template's files. Every process holds the same weights, and N processes
    writing one file would corrupt it, so on the others `save()` / `save_weights()`
    write nothing and say so once (a `KerasMGPUSaveSkipped` warning naming the call).

    Not when the template is the parallel model itself and saving it is a collective
    (TensorFlow reads its synchronised variables with every worker): then every process
    must save. On torch the template is the parallel model and saves locally.
    """
    job = engine.job
    if not job.multi_process() or job.is_chief():
        return
    if parallel is model and not engine.saves_locally:
        return
    import types

    def skipper(name: str) -> Any:
        def skip(self: Any, *args: Any, **kwargs: Any) -> None:
            _tell_save_skipped(job, name, args[0] if args else kwargs.get("filepath"))
        return skip

    for name in ("save", "save_weights"):
        model.__dict__[name] = types.MethodType(skipper(name), model)


class KerasMGPUSaveSkipped(UserWarning):
    """A process other than the chief was asked to save the template: it wrote nothing."""


_told_save_skipped = False


def _tell_save_skipped(job: cluster.ClusterEnvironment, name: str, target: Any
                       ) -> None:
    global _told_save_skipped
    if _told_save_skipped:
        return
    _told_save_skipped = True
    warnings.warn(
        f"kerasmgpu: process {job.global_rank()} of {job.world_size()} did "
        f"not write {name}({target!r}): in a job of several processes only the chief "
        "(process 0) writes the model's files - every process holds the same weights. "
        "Nothing is lost; to skip the call yourself, guard it with "
        "`if kerasmgpu.is_chief():` (said once per process)",
        KerasMGPUSaveSkipped, stacklevel=3)


@contextlib.contextmanager
def scope(
    gpus: devices_module.GpusArg = None, *, route: Union[str, Route, None] = None
) -> Iterator[Engine]:
    """Build (and compile) a model in here to place it on every device with no copy.

    ``with kerasmgpu.scope(): model = build(); model.compile(...)`` then
    ``kerasmgpu.parallelize(model)`` adopts that model as it is.
    """
    adapter, cls, selected, job = _prepare(gpus, route)
    active = _engine(cls, adapter, selected, job)
    with active.scope():
        yield active


def environment(devices: bool = False) -> inventory.Environment:
    """What kerasmgpu detects; `devices=True` also starts the framework to list devices."""
    active = registry.active()
    listed = None
    if devices:  # no Keras, or a backend that cannot train: nothing to list
        listed = engines.load(active.entry).list_devices() if active.entry else []
    return inventory.environment(active, cluster.job(), devices=listed)


def virtual_devices(n: int) -> int:
    """Show `n` CPU devices in place of GPUs (call before building any model)."""
    return devices_module.virtual_devices(n)


def route_for(model: Any) -> Optional[Route]:
    """The route a model returned by `parallelize()` trains on (None for others)."""
    from kerasmgpu.training import model as parallel_model

    state = parallel_model.state_of(model)
    return state.engine.route if state is not None else None


def describe(gpus: devices_module.GpusArg = None, *, model: Any = None) -> Dict[str, str]:
    """The route parallelize() would take (or took, for a parallel `model`), in words.

    Keys: route, engine, replicas, devices, all_reduce, step (what one training step
    does with the batch on this route), remainder (`padded`: a global batch that does not
    divide is padded and the padding masked; `sliced`: split unpadded, the last replica
    taking the remainder); `error` instead when no route can be built here, e.g. torch
    outside `kerasmgpu launch`.
    """
    from kerasmgpu.training import model as parallel_model

    state = parallel_model.state_of(model) if model is not None else None
    if state is not None:
        return _described(state.engine)
    try:
        adapter, cls, selected, job = _prepare(gpus, None)
        if devices_module.default_device_only(selected) and cls.single_device_passthrough(
                adapter, job):
            return {"route": "none (one device: the model trains as it is)",
                    "replicas": "1", "devices": ", ".join(str(d) for d in selected)}
        return _described(_engine(cls, adapter, selected, job))
    except Exception as exc:  # doctor reports it; nothing else should see this path fail
        return {"error": f"{type(exc).__name__}: {exc}"}


def _described(engine: Any) -> Dict[str, str]:
    return {**engine.describe(), "remainder": "padded" if engine.pads_remainders else "sliced"}
