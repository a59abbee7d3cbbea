"""The self-check: `parallelize(verify=True)` or KERASMGPU_VERIFY=1.

Before a fit trains, its first global batch - and its first padded one, the short last
batch - is run through the parallel model's padded path (the padding weights of its
compiled loss, its variables, its layers' state) and through the template on one device,
and the losses and gradients are compared; evaluate and predict compare their first
batch's outputs. Nothing is assigned (the JAX trainer's stateless loss), so the check
changes no weight, metric, optimizer or moving statistic; a difference raises
`VerificationError` before the optimizer applies anything, naming the first layer (in
the model's layer order) whose output on that batch differs in inference mode.

Layers that cannot agree exactly between one device and replicas (dropout and noise
layers, BatchNormalization without sync_batchnorm) make the loss and gradients compared
in inference mode (training=False); the message and the debug log say which.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Tuple

import numpy as np

from kerasmgpu import batching
from kerasmgpu._errors import VerificationError, bad_type, bad_value
from kerasmgpu.adapters import Adapter
from kerasmgpu.data import feeds, structure
from kerasmgpu.data.bundle import split
from kerasmgpu.registry import Route
from kerasmgpu.training import steps as step_hooks

VERIFY_ENV = "KERASMGPU_VERIFY"

_log = logging.getLogger("kerasmgpu.verify")

# Layers whose training-mode output depends on the device split or on random draws.
_RANDOM = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
           "GaussianDropout", "GaussianNoise", "AlphaDropout")
_BATCH_STATISTICS = ("BatchNormalization",)


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


def check_route(route: Any, adapter: Adapter) -> None:
    """verify=True where the check runs: Keras 3 on JAX and on TensorFlow."""
    if route is Route.KERAS_DISTRIBUTION or (route is Route.MIRRORED and adapter.keras3):
        return
    raise bad_value(
        "verify", True, f"False on the {route} route of {adapter.line.value} in this "
        "release (verify=True: Keras 3 on JAX or TensorFlow)",
        f"leave verify out (and {VERIFY_ENV} unset) on this route, or run the check "
        "with Keras 3 on JAX or TensorFlow")


def tolerance(model: Any) -> float:
    """Relative tolerance by the compute dtype: 16-bit policies sum in another order."""
    policy = getattr(model, "dtype_policy", None)
    dtype = str(getattr(policy, "compute_dtype", None) or getattr(model, "dtype", "float32"))
    return 1e-2 if "16" in dtype else 1e-5


def _inexact_layers(adapter: Adapter, model: Any, sync_batchnorm: bool) -> List[str]:
    names = []
    for layer in adapter.layers_of(model):
        kind = type(layer).__name__
        if kind in _RANDOM or (kind in _BATCH_STATISTICS and not sync_batchnorm
                               and not getattr(layer, "synchronized", False)):
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
    """The fit's first batch, and its first padded one when that is another."""
    sizes = batching.batch_sizes(rows, batch_size)
    chosen, start = [slice(0, sizes[0])] if sizes else [], 0
    for size in sizes:
        if size % replicas:
            if start:
                chosen.append(slice(start, start + size))
            break
        start += size
    return chosen


def _take(value: Any, rows: slice) -> Any:
    if value is None:
        return None
    return structure.map_structure(lambda leaf: np.asarray(leaf)[rows], value)


def before_fit(state: Any, replica: Any, x: Any, y: Any, sample_weight: Any,
               class_weight: Any, batch_size: Any, sync_batchnorm: bool) -> None:
    """The check of a fit's first (and first padded) global batch; raises on a
    difference, before the fit starts."""
    if not _arrays(state, x, "fit"):
        return
    x, y, sample_weight = (structure.to_numpy(v) for v in (x, y, sample_weight))
    rows = int(structure.leaves(x)[0].shape[0])
    template, adapter = state.template, state.adapter
    # Only JAX computes the loss statelessly: elsewhere a training-mode
    # BatchNormalization would move its statistics.
    stateless = state.engine.route is Route.KERAS_DISTRIBUTION
    inexact = _inexact_layers(adapter, template, sync_batchnorm and stateless)
    training = not inexact
    how = ("in training mode" if training else "in inference mode (training=False), since "
           f"{', '.join(inexact)} cannot agree exactly between one device and replicas")
    for rows_of in _batches(rows, int(batch_size or 32), state.engine.planner.replicas):
        batch = (_take(x, rows_of), _take(y, rows_of), _take(sample_weight, rows_of))
        _log.debug("kerasmgpu verify: fit batch rows %s-%s, loss and gradients compared %s",
                   rows_of.start, rows_of.stop, how)
        _check_step(state, replica, batch, class_weight, training, how)


def _arrays(state: Any, x: Any, call: str) -> bool:
    if structure.is_array_like(x):
        return True
    import warnings

    warnings.warn(f"kerasmgpu verify: {call}() on {type(x).__name__} checked nothing: the "
                  "self-check reads in-memory arrays in this release (pass numpy arrays "
                  "to run it)", stacklevel=4)
    return False


def _padded(state: Any, x: Any, y: Any, sample_weight: Any, class_weight: Any,
            replicas: Optional[int] = None) -> Tuple[Any, Any, Any, Any]:
    planner = state.engine.planner if replicas is None else batching.Planner(replicas)
    parts = split(feeds.pad_batch(state.adapter, x, y, sample_weight, class_weight, planner))
    assert parts is not None  # pad_batch always bundles
    return parts


def _check_step(state: Any, replica: Any, batch: Tuple[Any, Any, Any], class_weight: Any,
                training: bool, how: str) -> None:
    adapter, template = state.adapter, state.template
    x, y, sample_weight = batch
    if not adapter.is_compiled(template):
        _check_outputs(state, replica, x, "fit", how + "; outputs only (the template is "
                       "not compiled)")
        return
    tx, ty, tsw, _ = _padded(state, x, y, sample_weight, class_weight, replicas=1)
    reference = adapter.loss_and_gradients(template, tx, ty, tsw, training)
    parallel = _replicas_loss(state, replica, _padded(state, x, y, sample_weight,
                                                     class_weight), training)
    assert reference is not None and parallel is not None
    tol = tolerance(template)
    found = []
    loss_off = _difference(parallel[0], reference[0])
    if loss_off > tol:
        found.append(f"loss {parallel[0]!r} against one device's {reference[0]!r} "
                     f"(relative {loss_off:.3g})")
    names = [v.path if hasattr(v, "path") else v.name for v in template.trainable_variables]
    for name, g, ref in zip(names, parallel[1], reference[1]):
        off = _difference(g, ref)
        if off > tol:
            found.append(f"gradient of {name} off by {off:.3g} (relative)")
            break
    if found:
        raise VerificationError(
            f"kerasmgpu verify: the parallel model's first checked training batch "
            f"({int(structure.leaves(x)[0].shape[0])} rows) differs from the template on "
            f"one device beyond {tol:g}: {'; '.join(found)}. Compared {how}. "
            f"{_locate(state, replica, x, tol)} Nothing was applied.")


def _replicas_loss(state: Any, replica: Any, padded: Tuple[Any, Any, Any, Any],
                   training: bool) -> Optional[Tuple[float, List[Any]]]:
    """The parallel model's loss and gradients of a padded global batch, as its step
    computes them: on JAX one program over the whole batch; under tf.distribute each
    replica's loss over its own rows, divided by the replica count, then summed (what
    the strategy's all-reduce of the gradients adds up)."""
    rx, ry, rsw, packed = padded
    adapter = state.adapter
    if state.engine.route is Route.KERAS_DISTRIBUTION:
        with state.engine.scope(), step_hooks.active(packed):
            return adapter.loss_and_gradients(replica, rx, ry, rsw, training)
    replicas = state.engine.planner.replicas
    size = int(np.asarray(packed).shape[0]) // replicas
    total: Optional[Tuple[float, List[Any]]] = None
    for r in range(replicas):
        rows = slice(r * size, (r + 1) * size)
        with step_hooks.active(np.asarray(packed)[rows]):
            part = adapter.loss_and_gradients(replica, _take(rx, rows), _take(ry, rows),
                                              _take(rsw, rows), training)
        if part is None:
            return None
        loss, grads = part[0] / replicas, [g / replicas for g in part[1]]
        total = (loss, grads) if total is None else (
            total[0] + loss, [a + b for a, b in zip(total[1], grads)])
    return total


def check_outputs(state: Any, replica: Any, x: Any, batch_size: Any, call: str) -> None:
    """evaluate / predict: the first batch's outputs against the template's."""
    if not _arrays(state, x, call):
        return
    x = structure.to_numpy(x)
    first = _take(x, slice(0, int(batch_size or 32)))
    _check_outputs(state, replica, first, call, "in inference mode")


def _check_outputs(state: Any, replica: Any, x: Any, call: str, how: str) -> None:
    tol = tolerance(state.template)
    rows = int(structure.leaves(x)[0].shape[0])
    reference = _forward(state.template, x, rows)
    rx, _, _, packed = _padded(state, x, None, None, None)
    with state.engine.scope(), step_hooks.active(packed):
        parallel = _forward(replica, rx, rows)
    _log.debug("kerasmgpu verify: %s batch of %s rows, outputs compared %s", call, rows, how)
    off = max((_difference(a, b) for a, b in zip(parallel, reference)), default=0.0)
    if off > tol or len(parallel) != len(reference):
        raise VerificationError(
            f"kerasmgpu verify: {call}()'s first batch ({rows} rows): the parallel model's "
            f"outputs differ from the template's on one device by {off:.3g} (relative, "
            f"beyond {tol:g}), compared {how}. {_locate(state, replica, x, tol)}")


def _forward(model: Any, x: Any, rows: int) -> List[Any]:
    return [np.asarray(leaf)[:rows] for leaf in structure.leaves(model(x, training=False))]


def _probed(model: Any) -> List[Any]:
    return [layer for layer in model.layers if type(layer).__name__ != "InputLayer"]


def _inputs(model: Any) -> Any:
    inputs = model.inputs
    return inputs[0] if isinstance(inputs, (list, tuple)) and len(inputs) == 1 else inputs


def _locate(state: Any, replica: Any, x: Any, tol: float) -> str:
    """The first layer, in the model's layer order, whose output on `x` differs (both
    models in inference mode, on the real rows only)."""
    keras = state.adapter.keras
    template = state.template
    try:
        t_layers, r_layers = _probed(template), _probed(replica)
        t_probe = keras.Model(_inputs(template), [layer.output for layer in t_layers])
        with state.engine.scope():
            r_probe = keras.Model(_inputs(replica), [layer.output for layer in r_layers])
            r_out = r_probe(x, training=False)
        t_out = t_probe(x, training=False)
    except Exception as exc:  # a model without a functional graph: no layer to name
        return (f"(Layer by layer: not available for this model, {type(exc).__name__}; "
                "look for state a copy misses.)")
    for layer, a, b in zip(t_layers, structure.leaves(r_out), structure.leaves(t_out)):
        off = _difference(a, b)
        if off > tol:
            return (f"First layer whose output differs (inference mode): {layer.name!r} "
                    f"({type(layer).__name__}), by {off:.3g} relative.")
    return ("No layer's output differs in inference mode: the difference is in the loss's "
            "weighting of the batch (padding rows, sample weights) or in training-mode "
            "behaviour.")
