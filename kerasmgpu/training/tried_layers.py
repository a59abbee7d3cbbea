"""What a layer's own `call` does with the rows it is given, where each replica runs its
own step: tried on made-up rows before anything trains, since it cannot be read.

* Values it adds with `add_metric` (tf.keras, tf_keras): Keras averages them over the
  steps, each step's value computed from the rows the step is given - on one device the
  whole batch. Each replica computes it from its share and the replicas' values are
  averaged: one device's value where it is a mean over the rows and the shares are equal
  (a batch that does not divide then goes whole to every replica: `ParallelState.
  whole_batches`), another number for a maximum, a sum or a standard deviation (a maximum
  read 0.83 where one device's was 0.87, silently). `added_values`.
* Terms it adds with `add_loss` (a penalty on its activations): each replica adds its
  term over its share, and the replicas' losses - their gradients - are averaged: one
  device's term for a mean over the rows, a third of it on 3 replicas for a sum over
  them, silently unless `verify=True` caught it. `added_losses`.
* Outputs it computes from the batch's other rows too (a batch mean or standard
  deviation, minibatch discrimination, rows compared with each other): each replica
  gives its rows outputs computed from its share only (5e-2 off in weights on 3
  replicas, silently), and padding rows join them. `mixed_rows`, tried for every layer
  whose `call` is the user's code, in inference mode.
* Variables it assigns (`self.ema.assign(...)`, a row counter's `assign_add`): each
  replica updates them from its share, and TensorFlow combines the replicas' values by
  the variable's aggregation - their mean or sum where it says so; with none (Keras's
  default) each replica keeps its own, and the first's is what is read: one device's
  update where the combination of the shares' updates is the whole batch's (a moving
  average of a mean over the rows, aggregated by the mean; a state that does not depend
  on the rows), another state for a count of rows (a third of one device's on 3
  replicas), a maximum or a moving average without an aggregation, silently.
  `variable_updates`.

Each such layer of a functional model has its `call` run on made-up inputs shaped like
its own (`layer.input`, public), once on 6 rows and once on each half - the values it
adds caught on the instance (`add_metric`, and `add_loss`, which it must not leave
behind), the variables it assigns read after each run and put back (a random draw's
seed state too) - on a thread of its own, where no strategy's scope is entered. A
stateful layer is not run. A layer that
cannot be run so (a subclassed model's own `call`, inputs of several nodes, a layer that
raises) is not told: parallelize() says so - but for outputs read from other rows, which
every layer of the user's is tried for, and most are not: there `verify=True` compares.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

from kerasmgpu.adapters.aside import outside_scopes
from kerasmgpu.adapters.metric_values import leaves

ROWS = 6
_TIMEOUT_S = 60.0
Tried = Tuple[List[str], List[str]]  # (what cannot be combined, layers not tried)


def added_values(adapter: Any, layers: List[Any]) -> Tried:
    """(values added with `add_metric` that are not a mean over the rows, layers that
    could not be tried), in words."""
    return _on_a_thread(lambda: _each(layers, lambda layer: _added(adapter, layer),
                                      "add_metric {name!r} in {cls}.call (layer {layer!r})",
                                      "add_metric in {cls}.call (layer {layer!r})"), layers,
                        "add_metric in {cls}.call (layer {layer!r})")


def added_losses(adapter: Any, layers: List[Any]) -> Tried:
    """(layers whose `add_loss` terms are not a mean over the rows, layers that could not
    be tried), in words: each replica's term over its share is averaged over the
    replicas, one device's for a mean over the rows, 1/N of it for a sum."""
    return _on_a_thread(lambda: _each(layers, lambda layer: _losses(adapter, layer),
                                      "add_loss in {cls}.call (layer {layer!r})",
                                      "add_loss in {cls}.call (layer {layer!r})"), layers,
                        "add_loss in {cls}.call (layer {layer!r})")


def variable_updates(adapter: Any, layers: List[Any]) -> Tried:
    """(variables a layer's `call` assigns whose replicas' updates do not combine into
    the whole batch's, layers that could not be tried), in words."""
    return _on_a_thread(lambda: _each(layers, lambda layer: _assigned(adapter, layer),
                                      "the variable {name!r} {cls}.call assigns (layer "
                                      "{layer!r})", "{cls}.call assigning variables (layer "
                                      "{layer!r})"), layers,
                        "{cls}.call assigning variables (layer {layer!r})")


def mixed_rows(adapter: Any, layers: List[Any]) -> List[str]:
    """The layers whose output for a row, in inference mode, depends on the other rows
    they are given, in words; a layer that cannot be run on made-up rows, or draws at
    random, is not told. Inference mode only: a layer's training `call` may record
    what it is given (a callback, a count), which made-up rows must not reach, and its
    output may read what it assigns from the rows (a moving average of the batch's
    mean), which the replicas combine as `variable_updates` tells."""
    return outside_scopes(
        lambda: [f"{type(layer).__name__}.call reading the batch's other rows (layer "
                 f"{getattr(layer, 'name', '?')!r})" for layer in layers
                 if _mixes(adapter, layer)],
        _TIMEOUT_S, "layer", lambda: [])


def _on_a_thread(run: Callable[[], Tried], layers: List[Any], untried: str) -> Tried:
    # Outside any strategy's scope (`adapters.aside`): the made-up rows run eagerly on
    # the layer's variables as they are.
    return outside_scopes(run, _TIMEOUT_S, "layer", lambda: ([], [
        untried.format(cls=type(layer).__name__, layer=layer.name) for layer in layers]))


def _each(layers: List[Any], told: Callable[[Any], Optional[Dict[str, bool]]],
          found: str, untried: str) -> Tried:
    bad: List[str] = []
    not_tried: List[str] = []
    for layer in layers:
        combined = told(layer)
        words = {"cls": type(layer).__name__, "layer": getattr(layer, "name", "?")}
        if combined is None:
            not_tried.append(untried.format(**words))
            continue
        bad.extend(found.format(name=name, **words) for name, ok in combined.items() if not ok)
    return bad, not_tried


def _made_inputs(layer: Any) -> Optional[Tuple[Any, List[Any]]]:
    """(the layer's input as given, made-up rows for each of its leaves)."""
    import numpy as np

    if getattr(layer, "stateful", False):
        return None
    try:
        given = layer.input  # raises for a layer of several nodes, or of none
    except Exception:
        return None
    given_leaves = given if isinstance(given, (list, tuple)) else [given]
    rng = np.random.default_rng(0)
    made = []
    for leaf in given_leaves:
        shape = getattr(leaf, "shape", None)
        if shape is None:
            return None
        dims = [2 if d is None else int(d) for d in list(shape)[1:]]
        given_dtype = getattr(leaf, "dtype", None)  # Keras 3: a name; TensorFlow's DType
        try:
            dtype = np.dtype(given_dtype if isinstance(given_dtype, str) else getattr(
                given_dtype, "name", None) or "float32")
        except TypeError:  # strings, resources: no made-up rows
            return None
        if dtype.kind not in "fiub":
            return None
        made.append(rng.uniform(size=(ROWS, *dims)).astype(dtype) if dtype.kind == "f"
                    else np.zeros((ROWS, *dims), dtype))
    return given, made


def _call(adapter: Any, layer: Any, given: Any, made: List[Any], rows: slice,
          training: bool) -> Any:
    try:
        takes_training = "training" in inspect.signature(layer.call).parameters
    except (TypeError, ValueError):
        takes_training = False
    ops = getattr(adapter.keras, "ops", None)  # Keras 3; tf.keras's backend else
    tensor = ops.convert_to_tensor if ops is not None else adapter.keras.backend.constant
    inputs = [tensor(m[rows]) for m in made]
    return layer.call(inputs if isinstance(given, (list, tuple)) else inputs[0],
                      **({"training": training} if takes_training else {}))


def _caught(layer: Any, **methods: Callable[..., Any]) -> Callable[[], None]:
    """`methods` put on the layer's instance; returns what takes them away."""
    held = {key: layer.__dict__.get(key) for key in methods}
    layer.__dict__.update(methods)

    def restore() -> None:
        for key, value in held.items():
            if value is None:
                layer.__dict__.pop(key, None)
            else:
                layer.__dict__[key] = value

    return restore


def _state(adapter: Any, layer: Any) -> Tuple[List[Any], Callable[[], None]]:
    """The layer's variables - Keras 3's seed states of its random draws among them -
    and what puts back the values they have now."""
    variables = [v for v in list(getattr(layer, "variables", None) or
                                 getattr(layer, "weights", None) or []) if hasattr(v, "assign")]
    start = adapter.read_values(variables)

    def restore() -> None:
        adapter.write_values(variables, start)

    return variables, restore


def _mixes(adapter: Any, layer: Any) -> bool:
    """Whether the layer's inference outputs for made-up rows differ from its outputs
    for each half of them (where two runs on the same rows differ, it draws at random:
    not told)."""
    import numpy as np

    inputs = _made_inputs(layer)
    if inputs is None:
        return False
    try:
        _, put_back = _state(adapter, layer)
    except Exception:  # a variable that cannot be read back: not run
        return False

    def outputs(rows: slice, put_back_after: bool = True) -> List[Any]:
        restore = _caught(layer, add_metric=lambda *args, **kwargs: None,
                          add_loss=lambda *args, **kwargs: None)
        try:
            out = _call(adapter, layer, *inputs, rows, training=False)
            return [np.asarray(adapter.numpy(leaf), "float64") for leaf in leaves(out)]
        finally:
            restore()
            if put_back_after:  # else the next run draws on: a random draw then differs
                put_back()

    def same(a: List[Any], b: List[Any]) -> bool:
        return len(a) == len(b) and all(
            u.shape == v.shape and np.allclose(u, v, rtol=1e-4, atol=1e-6) for u, v in zip(a, b))

    try:
        whole = outputs(slice(0, ROWS), put_back_after=False)
        again = outputs(slice(0, ROWS))
        first, second = outputs(slice(0, ROWS // 2)), outputs(slice(ROWS // 2, ROWS))
    except Exception:  # not runnable on made-up rows: nothing to tell
        return False
    if not whole or any(w.ndim == 0 or w.shape[0] != ROWS or not np.isfinite(w).all()
                        for w in whole) or not same(whole, again):
        return False  # not one output row per row, or a random draw
    if len(first) != len(whole) or len(second) != len(whole):
        return False
    return not same(whole, [np.concatenate(pair) for pair in zip(first, second)])


def _added(adapter: Any, layer: Any) -> Optional[Dict[str, bool]]:
    """Per added metric name, whether its value is a mean over the rows; None where the
    layer cannot be run on made-up rows."""
    import numpy as np

    inputs = _made_inputs(layer)
    if inputs is None:
        return None

    def added(rows: slice) -> Dict[str, float]:
        values: Dict[str, float] = {}

        def add_metric(value: Any, name: Optional[str] = None, *args: Any, **kwargs: Any
                       ) -> None:
            values[str(name)] = float(np.mean(np.asarray(value, "float64")))

        restore = _caught(layer, add_metric=add_metric,
                          add_loss=lambda *args, **kwargs: None)
        try:
            _call(adapter, layer, *inputs, rows, training=False)
        finally:
            restore()
        return values

    try:
        parts = [added(slice(0, ROWS)), added(slice(0, ROWS // 2)),
                 added(slice(ROWS // 2, ROWS))]
    except Exception:  # not runnable on made-up rows: nothing to tell
        return None
    whole, first, second = parts
    if not whole or any(set(p) != set(whole) for p in parts) or not all(
            np.isfinite(list(p.values())).all() for p in parts):
        return None
    return {name: bool(np.isclose((first[name] + second[name]) / 2, value, rtol=1e-4,
                                  atol=1e-6))
            for name, value in whole.items()}


def _losses(adapter: Any, layer: Any) -> Optional[Dict[str, bool]]:
    """{"": whether the terms the layer's training `call` adds sum to a mean over the
    rows}; None where it cannot be run on made-up rows, adds nothing on them, or gives
    two runs on the same rows different terms (a random draw)."""
    import numpy as np

    inputs = _made_inputs(layer)
    if inputs is None:
        return None

    def added(rows: slice) -> float:
        terms: List[float] = []

        def add_loss(value: Any, *args: Any, **kwargs: Any) -> None:
            for term in value if isinstance(value, (list, tuple)) else [value]:
                if not callable(term):  # (a weight's regularizer: not from the rows)
                    terms.append(float(np.sum(np.asarray(term, "float64"))))

        restore = _caught(layer, add_loss=add_loss, add_metric=lambda *a, **k: None)
        try:
            _call(adapter, layer, *inputs, rows, training=True)
        finally:
            restore()
        if not terms:
            raise LookupError("no term on these rows")
        return float(sum(terms))

    try:
        whole, again = added(slice(0, ROWS)), added(slice(0, ROWS))
        first, second = added(slice(0, ROWS // 2)), added(slice(ROWS // 2, ROWS))
    except Exception:  # not runnable on made-up rows, or nothing added: nothing to tell
        return None
    if not np.isfinite([whole, again, first, second]).all() or not np.isclose(
            whole, again, rtol=1e-6, atol=0.0):
        return None
    return {"": bool(np.isclose((first + second) / 2, whole, rtol=1e-4, atol=1e-6))}


def _assigned(adapter: Any, layer: Any) -> Optional[Dict[str, bool]]:
    """Per variable the layer's training `call` assigns, whether the replicas' updates
    from the two halves, combined by its aggregation, are the whole rows' update; None
    where the layer cannot be run on made-up rows."""
    import numpy as np

    inputs = _made_inputs(layer)
    variables = list(getattr(layer, "weights", None) or [])
    if inputs is None or not variables:
        return None
    start = [np.array(v) for v in variables]

    def after(rows: slice) -> List[Any]:
        restore = _caught(layer, add_metric=lambda *args, **kwargs: None,
                          add_loss=lambda *args, **kwargs: None)
        try:
            _call(adapter, layer, *inputs, rows, training=True)
            return [np.array(v, "float64") for v in variables]
        finally:
            restore()
            for variable, value in zip(variables, start):
                variable.assign(value)

    try:
        whole, first, second = (after(slice(0, ROWS)), after(slice(0, ROWS // 2)),
                                after(slice(ROWS // 2, ROWS)))
    except Exception:  # not runnable on made-up rows: nothing to tell
        return None
    told: Dict[str, bool] = {}
    for variable, begun, w, a, b in zip(variables, start, whole, first, second):
        if np.array_equal(w, begun) and np.array_equal(a, begun) and np.array_equal(b, begun):
            continue  # not assigned
        if not (np.isfinite(w).all() and np.isfinite(a).all() and np.isfinite(b).all()):
            return None
        how = str(getattr(variable, "aggregation", "none")).lower()
        # What the replicas' updates combine into, from a share each (a batch that
        # divides) and from the whole batch each (one that does not: it goes whole to
        # every replica for such a layer, `ParallelState.whole_batches`); both must be
        # the whole batch's update.
        if "mean" in how:
            shares, copies = (a + b) / 2, w
        elif "sum" in how:
            # Each replica's update counts: a whole batch once per replica (a count of
            # rows 108 for one device's 44 on 3 replicas, tf_keras). And Keras 3 makes
            # `assign_add` an `assign` of the variable plus the update, which TensorFlow
            # sums over the replicas - the old value once per replica (19731 for 48 on
            # batches that divide): never one device's where it changes.
            shares = begun + (a - begun) + (b - begun)
            copies = begun + 2 * (w - begun)
        else:
            # ONLY_FIRST_REPLICA, or none (the default): each replica keeps its own
            # update, and the first's is read - one device's only where every share
            # gives the whole batch's (a state that does not depend on the rows).
            shares = a if "first" in how else np.where(np.isclose(a, b), a, np.nan)
            copies = w
        name = getattr(variable, "path", None) or getattr(variable, "name", "?")
        told[str(name).split("/")[-1].split(":")[0]] = bool(
            np.allclose(shares, w, rtol=1e-4, atol=1e-6)
            and np.allclose(copies, w, rtol=1e-4, atol=1e-6))
    return told
