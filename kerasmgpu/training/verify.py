"""The self-check: `parallelize(verify=True)` or KERASMGPU_VERIFY=1.

Before a fit trains, its first global batch - and the first one the replicas share the
other way (`_batches`: padded or whole after a first that divides, divided after a first
that does not) - is run through the template on one device and through the parallel
model as its step runs it, and the losses (with their `add_loss` terms) and gradients
are compared; evaluate and predict compare their first batch's outputs. A dataset or
PyDataset is read for its first batch without taking it from the call (`_peek`); a
generator's first batch is taken and handed back in front of the rest (the call reads
the generator the check returns). Nothing
is assigned, so the check changes no weight, metric, optimizer or moving statistic; a
difference raises `VerificationError` before the optimizer applies anything, naming the
first layer (in the model's layer order) whose output on that batch differs in
inference mode.

The parallel model's side, per route:
* keras_distribution (JAX): one program over the padded global batch laid out over the
  devices as the step lays it out (the trainer's stateless loss); the template's side
  reads one device's piece of each variable, the replicas' side each device's own;
* mirrored (TensorFlow) and torch_ddp: every replica computes its loss and gradients
  over its own rows of the padded batch where it trains - its device, its own copy of the
  variables, its replica context (so the step's own all-reduces, of a count say, take
  place) - and the engine reduces them as its step reduces gradients
  (`EngineOps.step_gradients`);
* multi_gpu_model (Keras 2.3): the parallel model's own compiled loss over the whole
  batch, which Keras slices over the replicas inside its graph (a backend function that
  updates nothing).

In a job of several processes the truth is rank 0's template: its figures are broadcast
and every process reaches the same verdict (`EngineOps.any_process`), so all raise
together and none is left waiting in a collective.

Layers that cannot agree exactly between one device and replicas (dropout and noise
layers, BatchNormalization without sync_batchnorm) make the loss and gradients compared
in inference mode (training=False); the message and the debug log say which.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from kerasmgpu import batching
from kerasmgpu._errors import VerificationError, bad_type, bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.data import feeds, peek, structure
from kerasmgpu.data.base import is_dataset
from kerasmgpu.data.bundle import split
from kerasmgpu.data.datasets import refuse_unbatched
from kerasmgpu.training import steps as step_hooks

VERIFY_ENV = "KERASMGPU_VERIFY"

_log = logging.getLogger("kerasmgpu.verify")

# Layers whose training-mode output depends on the device split or on random draws.
_RANDOM = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
           "GaussianDropout", "GaussianNoise", "AlphaDropout")
_BATCH_STATISTICS = ("BatchNormalization",)

Figures = Tuple[float, List[Any]]


def resolve(verify: Any, environ_value: str = "") -> bool:
    """verify= as given (True / False), or KERASMGPU_VERIFY (read by api, passed here:
    nothing below api reads the process environment) when left out (None)."""
    if isinstance(verify, bool):
        return verify
    if verify is not None:
        raise bad_type("verify", verify, "True, False or None (None: KERASMGPU_VERIFY=1 "
                       "turns it on)", "pass verify=True or leave it out")
    value = environ_value.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise bad_value(VERIFY_ENV, value, "1 (on) or 0 / unset (off)",
                    f"set {VERIFY_ENV}=1 or unset it")


def tolerance(model: Any) -> float:
    """Relative tolerance by the compute dtype: 16-bit policies sum in another order."""
    policy = getattr(model, "dtype_policy", None)
    dtype = str(getattr(policy, "compute_dtype", None) or getattr(model, "dtype", "float32"))
    return 1e-2 if "16" in dtype else 1e-5


def _stateless(engine: Any) -> bool:
    """Whether the check computes training-mode batch statistics without assigning them
    (Keras's own slicing graph, or one program over the global batch): a synchronized
    BatchNormalization is compared in training mode there."""
    return bool(engine.slices_in_graph or engine.one_program)


def _inexact_layers(adapter: Adapter, model: Any, sync_batchnorm: bool, stateless: bool
                    ) -> List[str]:
    """Layers compared in inference mode: random ones, and batch statistics unless they
    are synchronized and the check computes them without assigning them."""
    names = []
    for layer in adapter.layers_of(model):
        kind = type(layer).__name__
        synchronized = sync_batchnorm or getattr(layer, "synchronized", False) is True
        if kind in _RANDOM or (kind in _BATCH_STATISTICS and not (stateless and synchronized)):
            names.append(f"{layer.name} ({kind})")
    return names


def _difference(a: Any, b: Any) -> float:
    """max |a - b| relative to max |b| (absolute where b is all zeros)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if not a.size:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


def _batches(rows: int, batch_size: int, replicas: int) -> List[slice]:
    """The fit's first batch, and the first after it that the replicas share the other
    way: the first padded one (or whole on every replica, `BatchPlan.whole`) after a
    first batch that divides over them, the first that divides after one that does not
    (a fault may show on one kind alone: a loss term that sums over a replica's rows)."""
    sizes = batching.batch_sizes(rows, batch_size)
    if not sizes:
        return []
    chosen, start = [slice(0, sizes[0])], sizes[0]
    divides = sizes[0] % replicas == 0
    for size in sizes[1:]:
        if (size % replicas == 0) != divides:
            chosen.append(slice(start, start + size))
            break
        start += size
    return chosen


def _take(value: Any, rows: slice) -> Any:
    if value is None:
        return None
    return structure.map_structure(lambda leaf: np.asarray(leaf)[rows], value, skip_none=True)


def _rows(x: Any) -> int:
    return int(structure.leaves(x)[0].shape[0])


def before_fit(state: Any, replica: Any, x: Any, y: Any, sample_weight: Any,
               class_weight: Any, batch_size: Any, sync_batchnorm: bool) -> Any:
    """The check of a fit's first global batch and the first one the replicas share the
    other way (`_batches`; for a dataset, `_peeked_batches`); raises on a difference,
    before the fit starts. Returns what the fit must read in place of `x`: `x` itself, or
    for a generator, one that yields the batch the check took and then the rest."""
    inexact = _inexact_layers(state.adapter, state.template, sync_batchnorm,
                              _stateless(state.engine))
    training = not inexact
    how = ("in training mode" if training else "in inference mode (training=False), since "
           f"{', '.join(inexact)} cannot agree exactly between one device and replicas")
    replicas = state.engine.planner.replicas
    given = x
    if structure.is_array_like(x):
        x, y, sample_weight = (structure.to_numpy(v) for v in (x, y, sample_weight))
        chosen = _batches(_rows(x), int(batch_size or 32), replicas)
    else:
        peeked, given = _peek(state, replica, x, "fit")
        if peeked is None:
            return given
        x, y, sample_weight = peeked
        chosen = _peeked_batches(_rows(x), replicas)
    for rows_of in chosen:
        batch = (_take(x, rows_of), _take(y, rows_of), _take(sample_weight, rows_of))
        _log.debug("kerasmgpu verify: fit batch rows %s-%s, loss and gradients compared %s",
                   rows_of.start, rows_of.stop, how)
        _check_step(state, replica, batch, class_weight, training, how)
    return given


def _peeked_batches(rows: int, replicas: int) -> List[slice]:
    """A dataset's first batch, and its first rows as a batch the replicas share the
    other way (`_batches`'s rule; the dataset's later batch sizes are not known before
    it is read): one row fewer than a batch that divides, the rows that divide of one
    that does not."""
    other = rows - 1 if rows % replicas == 0 else rows // replicas * replicas
    return [slice(0, rows)] + ([slice(0, other)] if other >= 1 else [])


def _peek(state: Any, replica: Any, x: Any, call: str
          ) -> Tuple[Optional[Tuple[Any, Any, Any]], Any]:
    """The first element of `x` as NumPy `(x, y, sample_weight)`, and what the call then
    reads in place of `x` (`data.peek`). None, with a warning, for what a read would
    change (a pipeline with a shuffle or random stage) or an iterator that is also
    indexed (Keras weighs its classes as a PyDataset's); None without one for an empty
    source or what the call refuses anyway."""
    import warnings

    if is_dataset(x):
        # Refused as the call's own feed refuses it, before a sample is taken for rows.
        refuse_unbatched(x, state.adapter.model_inputs(replica))
    peeked = peek.first(x)
    if peeked.why:
        warnings.warn(f"kerasmgpu verify: {call}() on a {type(x).__name__} checked nothing: "
                      f"{peeked.why} (arrays, a keras.utils.PyDataset or Sequence, a "
                      "generator, or a tf.data pipeline without random or Python stages are "
                      "checked)", stacklevel=4)
    if peeked.element is None:
        return None, peeked.source
    first, y, sample_weight = structure.unpack(peeked.element)
    return (structure.to_numpy(first), structure.to_numpy(y),
            structure.to_numpy(sample_weight)), peeked.source


def _padded(state: Any, x: Any, y: Any, sample_weight: Any, class_weight: Any,
            replicas: int) -> Tuple[Any, Any, Any, Any]:
    """The whole global batch padded over `replicas` - all of the job's, in every
    process alike (a process's share is its replicas' rows of it) - or 1 (one device)."""
    # The replicas' side is planned as the model's feeds are (`ParallelState.planner`).
    planner = batching.Planner(replicas, whole=replicas > 1 and state.planner.whole,
                               copies=state.planner.copies)
    parts = split(feeds.pad_batch(state.adapter, x, y, sample_weight, class_weight, planner,
                                  replicated=True))
    assert parts is not None  # pad_batch always bundles
    return parts


def _check_step(state: Any, replica: Any, batch: Tuple[Any, Any, Any], class_weight: Any,
                training: bool, how: str) -> None:
    adapter, template, engine = state.adapter, state.template, state.engine
    x, y, sample_weight = batch
    if not adapter.is_compiled(template):
        _check_outputs(state, replica, x, "fit", how + "; outputs only (the template is "
                       "not compiled)")
        return
    reference = _reference(state, batch, class_weight, training)
    parallel = _replicas_loss(state, replica, batch, class_weight, training)
    tol = tolerance(template)
    found = _differences(template, parallel, reference, tol)
    if engine.any_process(bool(found)):
        found = found or ["on another process of the job (its message names it)"]
        raise VerificationError(
            f"kerasmgpu verify: the parallel model's first checked training batch "
            f"({_rows(x)} rows) differs from the template on one device beyond {tol:g}: "
            f"{'; '.join(found)}. Compared {how}. {_locate(state, replica, x, tol)} "
            "Nothing was applied.")


def _differences(template: Any, parallel: Figures, reference: Figures, tol: float
                 ) -> List[str]:
    found = []
    loss_off = _difference(parallel[0], reference[0])
    if loss_off > tol:
        found.append(f"loss {parallel[0]!r} against one device's {reference[0]!r} "
                     f"(relative {loss_off:.3g})")
    if len(parallel[1]) != len(reference[1]):
        found.append(f"the parallel model trains {len(parallel[1])} variables, one device "
                     f"{len(reference[1])}")
        return found
    names = [getattr(v, "path", None) or v.name for v in template.trainable_weights]
    for name, g, ref in zip(names, parallel[1], reference[1]):
        off = _difference(g, ref)
        if off > tol:
            found.append(f"gradient of {name} off by {off:.3g} (relative)")
            break
    return found


def _reference(state: Any, batch: Tuple[Any, Any, Any], class_weight: Any,
               training: bool) -> Figures:
    """The template's loss and gradients of the batch on one device (rank 0's in a job
    of several processes)."""
    adapter, template = state.adapter, state.template
    x, y, sample_weight = batch
    if state.engine.slices_in_graph:
        # Keras 2.3 takes class_weight itself; nothing is padded on this route.
        figures = adapter.loss_and_gradients(template, x, y, sample_weight, training,
                                             class_weight=class_weight)
    else:
        tx, ty, tsw, _ = _padded(state, x, y, sample_weight, class_weight, replicas=1)
        with adapter.kept_metrics(template):
            figures = adapter.loss_and_gradients(template, tx, ty, tsw, training)
    assert figures is not None
    shared = state.engine.broadcast_arrays([np.asarray(figures[0])] + list(figures[1]))
    return float(np.asarray(shared[0])), list(shared[1:])


def _replica_parts(value: Sequence[Any], replicas: int) -> Tuple[List[List[Any]],
                                                                   Callable[..., Any]]:
    """`value`'s leaves cut into each replica's rows, and how to rebuild a replica's
    structure from its leaves."""
    size = _rows(value) // replicas
    cuts = [_take(value, slice(r * size, (r + 1) * size)) for r in range(replicas)]

    def rebuild(*leaves: Any) -> Any:
        given = iter(leaves)
        return structure.map_structure(lambda _: next(given), cuts[0], skip_none=True)

    return [structure.leaves(cut) for cut in cuts], rebuild


def _replicas_loss(state: Any, replica: Any, batch: Tuple[Any, Any, Any],
                   class_weight: Any, training: bool) -> Figures:
    """The parallel model's loss and gradients of the batch, as its step computes them
    (see the module doc, per route)."""
    adapter, engine = state.adapter, state.engine
    x, y, sample_weight = batch
    if engine.slices_in_graph:
        figures = adapter.loss_and_gradients(replica, x, y, sample_weight, training,
                                             class_weight=class_weight)
        assert figures is not None
        return figures
    if engine.one_program:
        # One program over the global batch: in a job of several processes each runs
        # it on the same (whole) batch, as the step's global array holds it.
        rx, ry, rsw, packed = _padded(state, x, y, sample_weight, class_weight,
                                      replicas=engine.planner.replicas)
        with engine.scope(), step_hooks.active(packed):
            rx, ry, rsw = adapter.global_batch((rx, ry, rsw))
            figures = adapter.loss_and_gradients(replica, rx, ry, rsw, training)
        assert figures is not None
        return figures
    padded = _padded(state, x, y, sample_weight, class_weight,
                     replicas=engine.planner.replicas)
    parts, rebuild = _replica_parts(padded, engine.planner.replicas)

    def make() -> Callable[..., List[Any]]:
        def compute(*leaves: Any) -> List[Any]:
            rx, ry, rsw, packed = rebuild(*leaves)
            with step_hooks.active(packed):
                return adapter.replica_loss_and_gradients(replica, rx, ry, rsw, training)

        return compute

    # A compile or a changed trainable flag makes another computation.
    reads = tuple(replica.trainable_weights) + tuple(adapter.compile_token(replica))
    compute = _kept(state, ("loss", training, _signature(parts[0])), reads, make)
    with adapter.kept_metrics(replica):
        total = engine.step_gradients(compute, parts)
    return float(np.asarray(total[0])), list(total[1:])


def _signature(leaves: Sequence[Any]) -> Tuple[Any, ...]:
    return tuple((np.asarray(leaf).dtype.str, np.shape(leaf)) for leaf in leaves)


def _kept(state: Any, key: Any, reads: Tuple[Any, ...],
          make: Callable[[], Callable[..., List[Any]]]) -> Callable[..., List[Any]]:
    """The computation kept for `key` while the objects it reads are these very ones
    (the same function object lets an engine reuse what it traced for it)."""
    held = state.checks.get(key)
    if held is None or len(held[0]) != len(reads) or any(
            a is not b for a, b in zip(held[0], reads)):
        held = state.checks[key] = (reads, make())
    return held[1]


def check_outputs(state: Any, replica: Any, x: Any, batch_size: Any, call: str) -> Any:
    """evaluate / predict: the first batch's outputs against the template's. Returns what
    the call must read in place of `x` (`before_fit`)."""
    if structure.is_array_like(x):
        first = _take(structure.to_numpy(x), slice(0, int(batch_size or 32)))
    else:
        peeked, x = _peek(state, replica, x, call)
        if peeked is None:
            return x
        first = peeked[0]
    _check_outputs(state, replica, first, call, "in inference mode")
    return x


def _check_outputs(state: Any, replica: Any, x: Any, call: str, how: str) -> None:
    tol = tolerance(state.template)
    rows = _rows(x)
    reference = state.engine.broadcast_arrays(
        [state.adapter.numpy(a) for a in _forward(state.adapter, state.template, x)])
    parallel = _parallel_outputs(state, replica, x, lambda model, inputs: _forward(
        state.adapter, model, inputs), kept=True)
    _log.debug("kerasmgpu verify: %s batch of %s rows, outputs compared %s", call, rows, how)
    off = max((_difference(a, b) for a, b in zip(parallel, reference)), default=0.0)
    if state.engine.any_process(off > tol or len(parallel) != len(reference)):
        raise VerificationError(
            f"kerasmgpu verify: {call}()'s first batch ({rows} rows): the parallel model's "
            f"outputs differ from the template's on one device by {off:.3g} (relative, "
            f"beyond {tol:g}), compared {how}. {_locate(state, replica, x, tol)}")


def _forward(adapter: Adapter, model: Any, x: Any) -> List[Any]:
    """The model's outputs on `x` in inference mode (NumPy on Keras 2.3's graph)."""
    given = adapter.outputs_of(model, x)
    if given is not None:
        return given
    return structure.leaves(model(x, training=False))


def _parallel_outputs(state: Any, replica: Any, x: Any,
                      run: Callable[[Any, Any], List[Any]], kept: bool = False) -> List[Any]:
    """`run(model, inputs)` on the parallel model for the rows of `x`, as its calls run
    it: Keras 2.3's own slicing; one program on JAX; each replica its own rows elsewhere
    (`kept`: the same `run` every time, its computation kept as the loss's is)."""
    engine = state.engine
    rows = _rows(x)
    if engine.slices_in_graph:
        return [np.asarray(a) for a in run(replica, x)]
    replicas = engine.planner.replicas
    rx, _, _, packed = _padded(state, x, None, None, None, replicas=replicas)
    if engine.one_program:
        with engine.scope(), step_hooks.active(packed):
            rx = state.adapter.global_batch(rx)
            return [state.adapter.numpy(a)[:rows] for a in run(replica, rx)]
    parts, rebuild = _replica_parts((rx, packed), replicas)

    def make() -> Callable[..., List[Any]]:
        def compute(*leaves: Any) -> List[Any]:
            inputs, rows_packed = rebuild(*leaves)
            with step_hooks.active(rows_packed):
                return run(replica, inputs)

        return compute

    compute = _kept(state, ("outputs", _signature(parts[0])), (), make) if kept else make()
    return [np.asarray(a)[:rows] for a in engine.replica_outputs(compute, parts)]


def _probed(model: Any) -> List[Any]:
    return [layer for layer in model.layers if type(layer).__name__ != "InputLayer"]


def _inputs(model: Any) -> Any:
    inputs = model.inputs
    return inputs[0] if isinstance(inputs, (list, tuple)) and len(inputs) == 1 else inputs


def _layer_outputs(state: Any, replica: Any, x: Any) -> Tuple[List[Any], List[Any],
                                                                List[Any]]:
    """The template's layers, and their outputs on `x` in inference mode on the template
    (rank 0's) and on the parallel model (as its calls run it)."""
    adapter, template = state.adapter, state.template
    given = adapter.layer_outputs(template, x)
    if given is not None:  # Keras 2.3: its graph, and its own slicing for the replicas
        layers, reference = given
        parallel = adapter.replica_layer_outputs(replica, x, state.engine.planner.replicas)
        return layers, state.engine.broadcast_arrays(reference), parallel
    keras = adapter.keras
    layers, r_layers = _probed(template), _probed(replica)
    t_probe = keras.Model(_inputs(template), [layer.output for layer in layers])
    with state.engine.scope():
        r_probe = keras.Model(_inputs(replica), [layer.output for layer in r_layers])
    reference = [adapter.numpy(a) for a in structure.leaves(t_probe(x, training=False))]
    parallel = _parallel_outputs(state, replica, x, lambda model, inputs: structure.leaves(
        r_probe(inputs, training=False)))
    return layers, state.engine.broadcast_arrays(reference), parallel


def _locate(state: Any, replica: Any, x: Any, tol: float) -> str:
    """The first layer, in the model's layer order, whose output on `x` differs (both
    models in inference mode, on the real rows only)."""
    try:
        layers, reference, parallel = _layer_outputs(state, replica, x)
    except Exception as exc:  # a model without a functional graph: no layer to name
        # (A subclassed model: no graph to probe; a term of the batch it adds is named.)
        return (f"(Layer by layer: not available for this model, {type(exc).__name__}; "
                f"look for state a copy misses{_terms_hint(state).rstrip(',')}.)")
    for layer, a, b in zip(layers, parallel, reference):
        off = _difference(a, b)
        if off > tol:
            return (f"First layer whose output differs (inference mode): {layer.name!r} "
                    f"({type(layer).__name__}), by {off:.3g} relative.")
    built = (", or in a value a layer read when the parallel model's graph was built (a "
             "Python attribute changed since the template's graph was)"
             if state.engine.slices_in_graph else "")
    return ("No layer's output differs in inference mode: the difference is in the loss's "
            "weighting of the batch (padding rows, sample weights)"
            f"{_terms_hint(state)} or in training-mode behaviour (a layer reading the "
            f"batch's other rows in training only){built}.")


def _terms_hint(state: Any) -> str:
    """Where each replica runs its own step, its loss terms are over its own rows."""
    if not state.batch_terms or _stateless(state.engine):
        return ""
    return (", in a loss term computed from the batch (" + ", ".join(state.batch_terms[:3])
            + "): each replica computes it over its own rows and the replicas' terms are "
            "averaged, one device's only for a mean over the rows (a sum or a statistic of "
            "the whole batch is not); make it a mean over the batch, or train on Keras 3 "
            "with JAX (one program over the global batch),")
