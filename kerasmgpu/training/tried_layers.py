"""Values a layer adds with `add_metric` (tf.keras, tf_keras) where each replica runs its
own step.

`self.add_metric(value, name=...)` in a layer's `call` is averaged by Keras over the
steps, each step's value computed from the rows the step is given: on one device the
whole batch. Each replica computes it from its share, and the replicas' values are
averaged - one device's value where it is a mean over the rows and the shares are equal
(a batch that does not divide then goes whole to every replica: `ParallelState.
whole_batches`), another number for a maximum, a sum or a standard deviation (a maximum
read 0.83 where one device's was 0.87, silently).

What a layer's code adds cannot be read from it, so each such layer of a functional
model is tried before anything trains: its `call` run on made-up inputs shaped like its
own (`layer.input`, public), once on 6 rows and once on each half, its `add_metric` (and
`add_loss`, which it must not leave behind) caught on the instance for the run. A value
whose mean over the whole rows is not the mean of the halves' is not a mean over the
rows. Run on a thread of its own, where no strategy's scope is entered, with
`training=False` where `call` takes it; a stateful layer is not run. A layer that cannot
be run so (a subclassed model's own `call`, inputs of several nodes, a layer that
raises) is not told: its values are then exact for a mean over the rows only, and
parallelize() says so.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from typing import Any, Dict, List, Optional, Tuple

ROWS = 6
_TIMEOUT_S = 60.0


def tried(adapter: Any, layers: List[Any]) -> Tuple[List[str], List[str]]:
    """(values that are not a mean over the rows, layers that could not be tried), in
    words."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kerasmgpu-metric")
    try:
        return pool.submit(_tried, adapter, layers).result(timeout=_TIMEOUT_S)
    except concurrent.futures.TimeoutError:  # (never seen: a layer's call on 6 rows)
        return [], [_named(layer) for layer in layers]
    finally:
        pool.shutdown(wait=False)


def _named(layer: Any) -> str:
    return (f"add_metric in {type(layer).__name__}.call (layer "
            f"{getattr(layer, 'name', '?')!r})")


def _tried(adapter: Any, layers: List[Any]) -> Tuple[List[str], List[str]]:
    not_means: List[str] = []
    untried: List[str] = []
    for layer in layers:
        means = _means(adapter, layer)
        if means is None:
            untried.append(_named(layer))
            continue
        not_means.extend(f"add_metric {name!r} in {type(layer).__name__}.call (layer "
                         f"{layer.name!r})" for name, same in means.items() if not same)
    return not_means, untried


def _means(adapter: Any, layer: Any) -> Optional[Dict[str, bool]]:
    """Per added metric name, whether its value is a mean over the rows; None where the
    layer cannot be run on made-up rows."""
    import numpy as np

    if getattr(layer, "stateful", False):
        return None
    try:
        given = layer.input  # raises for a layer of several nodes, or of none
    except Exception:
        return None
    leaves = given if isinstance(given, (list, tuple)) else [given]
    rng = np.random.default_rng(0)
    made = []
    for leaf in leaves:
        shape = getattr(leaf, "shape", None)
        if shape is None:
            return None
        dims = [2 if d is None else int(d) for d in list(shape)[1:]]
        dtype = np.dtype(getattr(getattr(leaf, "dtype", None), "name", None) or "float32")
        made.append(rng.uniform(size=(ROWS, *dims)).astype(dtype) if dtype.kind == "f"
                    else np.zeros((ROWS, *dims), dtype))
    try:
        takes_training = "training" in inspect.signature(layer.call).parameters
    except (TypeError, ValueError):
        takes_training = False

    def added(rows: slice) -> Dict[str, float]:
        values: Dict[str, float] = {}

        def add_metric(value: Any, name: Optional[str] = None, *args: Any, **kwargs: Any
                       ) -> None:
            values[str(name)] = float(np.mean(np.asarray(value, "float64")))

        inputs = [adapter.keras.backend.constant(m[rows]) for m in made]
        held = {key: layer.__dict__.get(key) for key in ("add_metric", "add_loss")}
        layer.__dict__["add_metric"] = add_metric
        layer.__dict__["add_loss"] = lambda *args, **kwargs: None
        try:
            layer.call(inputs if isinstance(given, (list, tuple)) else inputs[0],
                       **({"training": False} if takes_training else {}))
        finally:
            for key, value in held.items():
                if value is None:
                    layer.__dict__.pop(key, None)
                else:
                    layer.__dict__[key] = value
        return values

    try:
        whole = added(slice(0, ROWS))
        first, second = added(slice(0, ROWS // 2)), added(slice(ROWS // 2, ROWS))
    except Exception:  # not runnable on made-up rows: nothing to tell
        return None
    if not whole or set(whole) != set(first) or set(first) != set(second) or not all(
            np.isfinite(list(part.values())).all() for part in (whole, first, second)):
        return None
    return {name: bool(np.isclose((first[name] + second[name]) / 2, value, rtol=1e-4,
                                  atol=1e-6))
            for name, value in whole.items()}
