"""Compiled metric and loss functions whose value for a batch is one number, not one
per row.

`def rmse(y_true, y_pred): return sqrt(mean(square(y_pred - y_true)))` - the Keras 2
habit - is averaged by Keras over batches, each batch counting once: one device
computes it over each whole batch. Replicas that each compute it over their share and
average their values compute another number (a mean of square roots, a mean of maxima),
and a padding weight cannot reach inside it: no per-row weight applies to one value.
`batch_metrics` finds such functions before a step runs, by the shape of what they
return for the model's outputs, so that the engine can compute them over the whole
batch (one program over the global batch: Keras 3 on JAX, short batches whole) or refuse
them (replicas that run their own step).

The same holds for a function of one value per row that computes each row's value from
the batch's other rows too - an in-batch contrastive loss (each row against the others
as negatives), a value normalised by a batch statistic: replicas that each see their
share compare each row with other rows than one device (tf_keras: 2e-1 off in weights),
and padding rows join the comparison. Shapes cannot tell it: each such function is run
on a few made-up rows (`reads_other_rows`), the whole rows' values against two halves'.

Private names read here, guarded, verified on Keras 3.3.3, 3.8.0, 3.10.0, 3.15.1 and
tf_keras / tf.keras 2.12 - 2.21: `MeanMetricWrapper._fn` / `_fn_kwargs` (the function a
metric averages) and Keras 3's `keras.src.backend.compute_output_spec` (the shape a
function returns for symbolic inputs, traced by the backend: JAX `eval_shape`, a TF
graph, torch meta tensors). Where they are missing a function is taken as one value per
row, as before.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from kerasmgpu.adapters.aside import outside_scopes
from kerasmgpu.env.versions import frameworks_own

Spec = Tuple[Tuple[Optional[int], ...], str]  # (shape, dtype) of one model output
ROWS = 6  # made-up rows a function is tried on: two halves of 3
_TIMEOUT_S = 60.0


def leaves(structure: Any) -> Iterator[Any]:
    if isinstance(structure, dict):
        for value in structure.values():
            yield from leaves(value)
    elif isinstance(structure, (list, tuple)):
        for value in structure:
            yield from leaves(value)
    elif structure is not None:
        yield structure


def averaged_function(adapter: Any, metric: Any
                      ) -> Optional[Tuple[Callable[..., Any], Dict[str, Any]]]:
    """The user's function a compile metric averages and its keyword arguments: the
    function itself, or the one a `MeanMetricWrapper` holds; None for a name, a class,
    any other Metric, and the frameworks' own functions (one value per row)."""
    keras_metric = adapter.keras.metrics.Metric
    if isinstance(metric, str) or isinstance(metric, type):
        return None
    if isinstance(metric, keras_metric):
        wrapper = getattr(adapter.keras.metrics, "MeanMetricWrapper", None)
        if wrapper is None or not isinstance(metric, wrapper):
            return None
        fn, kwargs = getattr(metric, "_fn", None), getattr(metric, "_fn_kwargs", None)
    else:
        fn, kwargs = metric, {}
    if not callable(fn) or frameworks_own(fn):
        return None
    return fn, dict(kwargs or {})


def value_rank(adapter: Any, fn: Callable[..., Any], kwargs: Dict[str, Any], spec: Spec
               ) -> Optional[int]:
    """The rank of what `fn(y_true, y_pred, **kwargs)` returns for targets and outputs
    of `spec`, traced symbolically (no data, no step); None where it cannot be told."""
    shape, dtype = spec
    try:
        if adapter.keras3:
            backend = importlib.import_module("keras.src.backend")
            tensor = adapter.keras.KerasTensor
            out = backend.compute_output_spec(
                lambda a, b: fn(a, b, **kwargs), tensor(shape, dtype), tensor(shape, dtype))
        else:
            import tensorflow as tf

            concrete = tf.function(lambda a, b: fn(a, b, **kwargs)).get_concrete_function(
                tf.TensorSpec(shape, dtype), tf.TensorSpec(shape, dtype))
            out = concrete.structured_outputs
        return len(tuple(out.shape))
    except Exception:  # a function these specs cannot trace: its rank is not known
        return None


def reads_other_rows(adapter: Any, fn: Callable[..., Any], kwargs: Dict[str, Any],
                     spec: Spec) -> bool:
    """Whether `fn(y_true, y_pred, **kwargs)`, of one value per row for outputs of
    `spec`, computes a row's value from other rows of the batch too: told on `ROWS`
    made-up rows - their values together against two halves' - run eagerly on a thread
    of its own (outside any strategy's scope and any trace); False where it cannot be
    told (the function wants other targets, raises, or gives no finite value)."""
    import numpy as np

    dims = tuple(2 if d is None else int(d) for d in spec[0][1:])
    rng = np.random.default_rng(0)
    y_true = rng.uniform(size=(ROWS, *dims)).astype("float32")
    y_pred = rng.uniform(size=(ROWS, *dims)).astype("float32")

    if adapter.keras3:
        tensor = adapter.keras.ops.convert_to_tensor
    else:  # tf.keras's backend functions take tensors only, as Keras gives them
        import tensorflow as tf

        tensor = tf.convert_to_tensor

    def values(rows: slice) -> Any:
        out = fn(tensor(y_true[rows]), tensor(y_pred[rows]), **kwargs)
        return np.asarray(adapter.numpy(out), "float64")

    def tried() -> bool:
        whole = values(slice(None))
        if whole.ndim == 0 or whole.shape[0] != ROWS:
            return False
        halves = np.concatenate([values(slice(0, ROWS // 2)), values(slice(ROWS // 2, None))])
        if halves.shape != whole.shape or not (np.all(np.isfinite(whole))
                                               and np.all(np.isfinite(halves))):
            return False
        return not np.allclose(halves, whole, rtol=1e-4, atol=1e-6)

    try:
        return outside_scopes(tried, _TIMEOUT_S, "function", lambda: False)
    except Exception:  # not runnable on these rows: nothing to tell
        return False


def _dtype_name(dtype: Any) -> str:
    """'float32' from a NumPy, JAX, TensorFlow or torch dtype."""
    name = getattr(dtype, "name", None)
    return str(name if isinstance(name, str) else dtype).replace("torch.", "")


def output_specs(model: Any) -> List[Spec]:
    """(shape, dtype) of each declared model output; [] where they are not declared (a
    subclassed model before its first call)."""
    try:
        outputs = list(model.outputs or [])
    except (AttributeError, ValueError):
        return []
    specs = []
    for output in outputs:
        shape = getattr(output, "shape", None)
        if shape is None:
            return []
        specs.append((tuple(None if d is None else int(d) for d in tuple(shape)),
                      _dtype_name(getattr(output, "dtype", "float32"))))
    return specs


def loss_function(adapter: Any, loss: Any
                  ) -> Optional[Tuple[Callable[..., Any], Dict[str, Any]]]:
    """The user's function a compile loss computes and its keyword arguments: the
    function itself, the one a `LossFunctionWrapper` holds (`fn`, `_fn_kwargs`), or a
    `Loss` subclass's own `call`; None for a name and the frameworks' own losses."""
    if isinstance(loss, str) or isinstance(loss, type):
        return None
    keras_loss = getattr(adapter.keras.losses, "Loss", None)
    if keras_loss is not None and isinstance(loss, keras_loss):
        wrapper = getattr(adapter.keras.losses, "LossFunctionWrapper", None)
        if wrapper is not None and isinstance(loss, wrapper):
            fn, kwargs = getattr(loss, "fn", None), getattr(loss, "_fn_kwargs", None)
        elif not frameworks_own(type(loss)):
            fn, kwargs = loss.call, {}
        else:
            return None
    else:
        fn, kwargs = loss, {}
    if not callable(fn) or frameworks_own(fn):
        return None
    return fn, dict(kwargs or {})


Unwrap = Callable[[Any, Any], Optional[Tuple[Callable[..., Any], Dict[str, Any]]]]


def _one_value(adapter: Any, given: Any, unwrap: Unwrap, kind: str, specs: Sequence[Spec]
               ) -> List[str]:
    """The compile `given` (a structure of losses or metrics) whose function (`unwrap`)
    returns one number for a batch of outputs of `specs`, each in words."""
    found: List[str] = []
    for item in leaves(given) if specs else ():
        computed = unwrap(adapter, item)
        if computed is None:
            continue
        ranks = [value_rank(adapter, computed[0], computed[1], spec) for spec in specs]
        if 0 in ranks:
            what = "one value per batch"
        elif any(reads_other_rows(adapter, *computed, spec) for spec in specs):
            what = "each row's value computed from the batch's other rows too"
        else:
            continue
        name = (getattr(item, "name", None) if kind == "metric" else None) or getattr(
            computed[0], "__name__", None) or getattr(item, "name", kind)
        found.append(f"{kind} {name!r} ({what})")
    return found


def batch_metrics(adapter: Any, compile_args: Dict[str, Any], specs: Sequence[Spec]
                  ) -> List[str]:
    """The compile metrics (`metrics`, `weighted_metrics`) whose value for a batch of
    outputs of `specs` (`output_specs`) is one number, each in words."""
    return _one_value(adapter, [compile_args.get("metrics"),
                                compile_args.get("weighted_metrics")],
                      averaged_function, "metric", specs)


def batch_losses(adapter: Any, compile_args: Dict[str, Any], specs: Sequence[Spec]
                 ) -> List[str]:
    """The compile losses whose value for a batch of outputs of `specs` is one number
    (a `mean` without an axis): Keras then weighs no row of it, and replicas that each
    compute it over their share compute another loss and gradient than one device."""
    return _one_value(adapter, compile_args.get("loss"), loss_function, "loss", specs)


def one_value(adapter: Any, metric: Any, values: Sequence[Any]) -> bool:
    """Whether a built compile metric averages a function that returns one value for
    the batch it is given (`values`: its y_true and y_pred as the step has them); told
    once per metric object."""
    cached = metric.__dict__.get("_kerasmgpu_one_value")
    if cached is not None:
        return bool(cached)
    if len(values) != 2:  # given by keyword: told at a call that gives them by position
        return False
    averaged = averaged_function(adapter, metric)
    answer = False
    if averaged is not None:
        y_pred = values[1]
        shape = tuple(None if d is None else int(d) for d in tuple(y_pred.shape))
        answer = value_rank(adapter, *averaged, (shape, _dtype_name(y_pred.dtype))) == 0
    metric.__dict__["_kerasmgpu_one_value"] = answer
    return answer
