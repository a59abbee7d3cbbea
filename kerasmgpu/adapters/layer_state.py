"""What a layer holds besides its variables, carried from a model to its copy.

A copy made from `get_config()` and given the variables by `set_weights()` misses:

* plain Python attributes a layer reads in `call()` (a temperature, a scale, a flag)
  that its config does not list, or that were changed after the layer was made - also
  Keras's own, as tf_keras's `Discretization.bin_boundaries` after `adapt()`;
* what an adapted preprocessing layer keeps beside its variables: Keras 3's
  `Normalization` computes its mean and variance tensors from its variables only in
  `finalize_state()`, the lookups keep their vocabulary in a table. Keras's own saving
  carries both (`save_own_variables` / `save_assets`, the public protocol of the
  `.keras` format, on Keras 3 and tf_keras 2.12+), and so does the copy here.

Only public methods and attributes of the layers are used. A layer of a class of the
user's own (defined outside keras, tf_keras and tensorflow) also carries the private
plain-data attributes its own classes assign (`self._temperature = t` in their source),
never Keras's private bookkeeping, and the framework tensors they assign (the same
tensor object).

Functions a layer holds (Keras's own public ones, as `Dense.activation`; those the user's
classes assign, private too), and other objects the user's classes assign (a helper of
the user's own holding parameters, a bound method), are carried as the same object
where they are *portable*: nothing they capture or hold reaches a Keras object with
state (`portable`). One that does (the layer itself, another layer, a variable) would
read the template's state, not the copy's: not carried; where a function the user's
classes assign differs in the copy, remade from the config, in code or in what it
captures, `not_carried` names it and the copy is refused; a function or object set on
the template after the copy was made is refused at the next call
(`unportable_changes`). One holding such a Keras object that the layer held when the
copy was made is the copy's own, as its class made it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import tempfile
import textwrap
import types
from typing import Any, Dict, FrozenSet, List, Optional, Set, Tuple

import numpy as np

from kerasmgpu.env.versions import frameworks_own

# Attributes Keras manages itself and kerasmgpu keeps equal another way (trainable
# flags: training.sync) or that must stay the copy's own.
_SKIPPED = frozenset({"built", "trainable", "name"})
_SCALARS = (bool, int, float, str, bytes, type(None), np.generic)


def _plain(value: Any, depth: int = 0) -> bool:
    """A value that is data, not an object with identity: numbers, strings, NumPy
    arrays, and short lists, tuples and dicts of those."""
    if isinstance(value, _SCALARS) or isinstance(value, np.ndarray):
        return True
    if depth < 2 and isinstance(value, (list, tuple)):
        return len(value) <= 10_000 and all(_plain(v, depth + 1) for v in value)
    if depth < 2 and isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _users_classes(cls: type) -> List[type]:
    """The classes of `cls`'s MRO defined outside the frameworks, up to the first
    framework class (a user's layer and its own bases)."""
    found = []
    for klass in cls.__mro__:
        if frameworks_own(klass) or klass is object:
            break
        found.append(klass)
    return found


def _assigned_private(cls: type) -> FrozenSet[str]:
    return frozenset(n for n in _assigned(cls) if n.startswith("_"))


@functools.cache
def _assigned(cls: type) -> FrozenSet[str]:
    """The names `cls`'s own source assigns on its instances (`self.x = ...`, `+=`,
    annotated), private ones name-mangled as Python stores them; none where the source
    cannot be read (a class made by exec, or in some interactive sessions)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    names = set()
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = function.args.posonlyargs + function.args.args
        if not arguments:
            continue
        me = arguments[0].arg  # `self`, as the method names it
        for node in ast.walk(function):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                       else [])
            for target in targets:
                for leaf in ast.walk(target):  # `self._a, self._b = ...` too
                    if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                            and leaf.value.id == me):
                        names.add(leaf.attr)
    mangled = {f"_{cls.__name__.lstrip('_')}{n}" if n.startswith("__") and not n.endswith(
        "__") else n for n in names}
    return frozenset(n for n in mangled if not (n.startswith("__") and n.endswith("__")))


@functools.cache
def _bookkeeping(base: type) -> FrozenSet[str]:
    """The attributes a fresh instance of the framework's base `Layer` holds: Keras's
    own even where a user's class assigns them too (`self._name = ...`)."""
    try:
        return frozenset(vars(base()))
    except Exception:  # a base that cannot be made bare: nothing excluded
        return frozenset()


def _users_private(layer: Any) -> FrozenSet[str]:
    return frozenset(n for n in _users_own(layer) if n.startswith("_"))


def _users_own(layer: Any) -> FrozenSet[str]:
    """The names the layer's user-defined classes assign, less Keras's bookkeeping."""
    cls = type(layer)
    users = _users_classes(cls)
    if not users:
        return frozenset()
    names: FrozenSet[str] = frozenset()
    for klass in users:
        names = names | _assigned(klass)
    bases = [k for k in cls.__mro__ if k.__name__ == "Layer"
             and frameworks_own(k)]
    return names - _bookkeeping(bases[-1]) if names and bases else names


def attributes(layer: Any) -> Dict[str, Any]:
    """The layer's public plain-data attributes (its own `__dict__`, not its class's),
    the private ones its user-defined classes assign (`_users_private`), the framework
    tensors those classes assign (values: a copy remade from the config would draw a
    random one anew, or derive it from weights it did not have yet), the functions
    among all of these but a model's own (an activation replaced after the copy was
    made: compared by identity, carried where `portable`), and the other objects those
    classes assign (`_other_object`: by identity, carried where `portable`)."""
    found = {}
    own = _users_own(layer)
    # A model's public functions are Keras's step functions (`train_function`, made
    # anew at every compile, capturing the model) or kerasmgpu's wrappers of its calls
    # (the Keras 2.3 engine's `fit`, `evaluate`, ...): the copy's own, never carried.
    # A model is what has `fit` (Keras 2.3's has no `train_step`).
    model = hasattr(type(layer), "fit")
    for key, value in vars(layer).items():
        if (key.startswith("_") and key not in own) or key in _SKIPPED:
            continue
        if (_plain(value) or (key in own and (_tensors(value) or _other_object(value)))
                or (_function(value) and (key in own or not model))):
            found[key] = value
    return found


def _function(value: Any) -> bool:
    return isinstance(value, (types.FunctionType, types.BuiltinFunctionType,
                              functools.partial))


def _stateful(value: Any) -> bool:
    """A Keras object with state: a layer, a model, a variable, an optimizer, a metric."""
    return any(hasattr(type(value), n) for n in ("assign", "trainable_weights", "variables"))


def _other_object(value: Any) -> bool:
    """An object that is not data, a tensor, a function, a module, a class, nor itself
    a Keras object with state (a sub-layer is a layer of the model: copied as one): a
    helper of the user's own, a bound method."""
    return not (_plain(value) or _tensors(value) or _function(value) or _stateful(value)
                or isinstance(value, (types.ModuleType, type)))


def portable(value: Any) -> bool:
    """A function or object a copy may hold as the template's own: nothing it reaches
    (a function's closure, its defaults, a partial's arguments, a method's object, an
    object's attributes, the objects those hold) is a Keras object the copy has its own
    counterpart of (`_reaches_state`)."""
    return _reaches_state(value, set()) is None


# Followed at most this many objects deep into what a function captures; beyond, it is
# not known what it reads, so it is not carried.
_FOLLOWED = 500


def _reaches_state(value: Any, seen: Set[int]) -> Optional[str]:
    """What of a template's own state `value` reaches, for a message ("a Dense"); None
    when nothing. A layer, a model, a variable, an optimizer or a metric is state the
    copy has its own of: a function reading the template's would train the copy with
    it. Data, tensors, modules, classes and other objects are one object either way
    (TensorFlow's own functions capture its dispatchers: shared, as on one device)."""
    if _plain(value) or _tensors(value) or isinstance(value, (types.ModuleType, type)):
        return None
    if id(value) in seen:  # a recursive closure captures itself
        return None
    seen.add(id(value))
    if len(seen) > _FOLLOWED:
        return f"more than {_FOLLOWED} objects"
    if _stateful(value):
        return f"a {type(value).__name__}"
    if isinstance(value, functools.partial):
        parts = [value.func, *value.args, *value.keywords.values()]
    elif isinstance(value, types.MethodType):
        parts = [value.__self__, value.__func__]
    elif isinstance(value, types.FunctionType):
        cells = value.__closure__ or ()
        if not all(_filled(c) for c in cells):
            return "a name not yet assigned"
        parts = ([c.cell_contents for c in cells] + list(value.__defaults__ or ())
                 + list((value.__kwdefaults__ or {}).values()))
    elif isinstance(value, (list, tuple, set, frozenset)):
        parts = list(value)
    elif isinstance(value, dict):
        parts = list(value.values())
    else:
        parts = list(getattr(value, "__dict__", {}).values())
    for part in parts:
        found = _reaches_state(part, seen)
        if found:
            return found
    return None


def _tensors(value: Any, depth: int = 0) -> bool:
    """A framework tensor, or a short list, tuple or dict of them and plain data."""
    if _framework_array(value):
        return True
    items = (list(value.values()) if isinstance(value, dict) else
             list(value) if isinstance(value, (list, tuple)) else [])
    return (depth < 2 and 0 < len(items) <= 10_000 and any(_tensors(v, depth + 1) for v in items)
            and all(_plain(v, depth + 1) or _tensors(v, depth + 1) for v in items))


def snapshot(layer: Any) -> Dict[str, Any]:
    """The layer's plain attributes now, kept apart from later in-place changes."""
    return {k: _copied(v) for k, v in attributes(layer).items()}


def same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if _framework_array(a) or _framework_array(b) or _tensors(a) or _tensors(b):
        # Immutable: replaced, not changed in place; comparing values at every call
        # would read them back from the device.
        return False
    if _other_object(a) or _other_object(b):
        # By identity: an equal object is still another one, which a later change in
        # place would reach on one side only.
        return False
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b)))
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # a list holding arrays
        return False


def carry_attributes(source: Any, target: Any, keys: Any = None) -> List[str]:
    """Set on `target` the plain attributes of `source` that differ (only `keys` when
    given); the names set."""
    theirs = vars(target)
    carried = []
    for key, value in attributes(source).items():
        if keys is not None and key not in keys:
            continue
        if key in theirs and same(theirs[key], value):
            continue
        if key not in theirs and not _plain(getattr(type(target), key, None)):
            continue  # a property or method of the copy's class: not data it holds
        if (_function(value) or _other_object(value)) and not portable(value):
            continue  # it would read `source`'s state: refused where it differs instead
        setattr(target, key, _copied(value))
        carried.append(key)
    return carried


# --- what a copy does not take: refused, naming it ----------------------------------------


def held(layer: Any) -> Dict[str, Any]:
    """The attributes the layer's own classes assign that hold what a copy remakes from
    its config: functions (not carried: one may read the template's own variables) and
    framework tensors (carried, `attributes`), and short lists, tuples and dicts of them.
    A Keras object (a layer, a variable, an initializer) is the copy's own, made as
    Keras copies it."""
    own = vars(layer)
    return {key: own[key] for key in _users_own(layer) - _SKIPPED
            if key in own and not _plain(own[key]) and _holds(own[key])}


def _holds(value: Any, depth: int = 0) -> bool:
    if _framework_array(value) or isinstance(value, types.FunctionType):
        return True
    if depth < 2 and isinstance(value, (list, tuple)) and value:
        return (len(value) <= 10_000 and any(_holds(v, depth + 1) for v in value)
                and all(_plain(v, depth + 1) or _holds(v, depth + 1) for v in value))
    if depth < 2 and isinstance(value, dict) and value:
        return (any(_holds(v, depth + 1) for v in value.values())
                and all(_plain(v, depth + 1) or _holds(v, depth + 1) for v in value.values()))
    return False


def _framework_array(value: Any) -> bool:
    """A concrete tensor or array of TensorFlow, JAX or torch: values, not a variable
    (which has `assign`: carried as a weight) nor a symbolic tensor (no values)."""
    if isinstance(value, np.ndarray) or not hasattr(value, "__array__"):
        return False
    if not (hasattr(value, "shape") and hasattr(value, "dtype")) or hasattr(value, "assign"):
        return False
    name = type(value).__name__
    # TensorFlow's graph tensor is a `Tensor` without `numpy` (torch's has it); a JAX
    # tracer is a value only inside the function tracing it.
    return (name not in ("KerasTensor", "SymbolicTensor") and "Tracer" not in name
            and (name != "Tensor" or hasattr(value, "numpy")))


def equivalent(a: Any, b: Any, depth: int = 0) -> bool:
    """Whether a copy's attribute holds what the layer's does: equal values for tensors
    and arrays, the same code and captured values for functions (to a few levels of
    functions capturing functions: a recursive closure captures itself)."""
    if a is b:
        return True
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(equivalent(x, y, depth) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equivalent(a[k], b[k], depth) for k in a)
    if _plain(a) or _plain(b):
        return same(a, b)
    if _framework_array(a) or _framework_array(b):
        try:
            x, y = np.asarray(a), np.asarray(b)
        except Exception:  # not readable as values: nothing to compare, so not equal
            return False
        return x.shape == y.shape and x.dtype == y.dtype and bool(np.array_equal(x, y))
    if isinstance(a, types.FunctionType) and isinstance(b, types.FunctionType):
        if a.__code__ is not b.__code__:
            return False
        if depth >= 3:
            return True
        cells = [(c.cell_contents, d.cell_contents) for c, d in
                 zip(a.__closure__ or (), b.__closure__ or ())
                 if _filled(c) and _filled(d)]
        return (len(a.__closure__ or ()) == len(b.__closure__ or ())
                and len(a.__defaults__ or ()) == len(b.__defaults__ or ())
                and all(_captured_alike(x, y, depth + 1) for x, y in
                        cells + list(zip(a.__defaults__ or (), b.__defaults__ or ()))))
    return False


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # a name the function captures, not yet assigned
        return False
    return True


def _captured_alike(x: Any, y: Any, depth: int) -> bool:
    """A value a function captures: data, tensors and functions must be alike; another
    object (the layer itself, a sub-layer, a variable) is the copy's own counterpart."""
    if x is y:
        return True
    if _plain(x) or _tensors(x) or isinstance(x, types.FunctionType) or _holds(x):
        return equivalent(x, y, depth)
    return type(x) is type(y)


def unportable_changes(layer: Any, copy: Any, keys: Any) -> List[str]:
    """Of the attributes `keys` changed on `layer` since it and its copy agreed, the
    functions and objects the copy cannot take (not `portable`) and does not hold
    alike: "name (a function reaching a Dense)"."""
    mine, theirs = vars(layer), vars(copy)
    refused = []
    for key in keys:
        value = mine.get(key)
        other = _other_object(value)
        reached = _reaches_state(value, set()) if _function(value) or other else None
        if reached and not (key in theirs and equivalent(value, theirs[key])):
            kind = f"a {type(value).__name__}" if other else "a function"
            refused.append(f"{key} ({kind} reaching {reached})")
    return refused


def not_carried(layer: Any, copy: Any) -> List[str]:
    """The attributes of `held(layer)` the copy does not hold alike: "name (type)"."""
    theirs = vars(copy)
    return [f"{key} ({type(value).__name__})" for key, value in held(layer).items()
            if key not in theirs or not equivalent(value, theirs[key])]


def _copied(value: Any) -> Any:
    # The copy must not share a mutable container with the template: a later in-place
    # change on one side would reach the other unseen.
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return value


def adaptable(layer: Any) -> bool:
    """A preprocessing layer whose state `adapt()` sets (Normalization, Discretization,
    the lookups, TextVectorization), on a Keras with the saving protocol that carries it."""
    return callable(getattr(layer, "adapt", None)) and _saves_itself(layer)


def adapts(layer: Any) -> bool:
    """A preprocessing layer whose state `adapt()` sets, on any Keras."""
    return callable(getattr(layer, "adapt", None))


def _saves_itself(layer: Any) -> bool:
    return callable(getattr(layer, "save_own_variables", None))


def carry_adapted_again(layer: Any, copy: Any) -> None:
    """The copy takes a layer's state after a new `adapt()`: as `carry_adapted`, or
    where the saving protocol is missing (tf.keras 2.12), its weights - a lookup's
    vocabulary among them there - then `finalize_state()`, which derives what the
    layer computes from its variables (Normalization's mean and variance tensors); a
    lookup's would rebuild its table from counts the copy never took, so not there."""
    if _saves_itself(layer):
        carry_adapted([(layer, copy)])
        return
    copy.set_weights(layer.get_weights())
    if not callable(getattr(copy, "get_vocabulary", None)) and callable(
            getattr(copy, "finalize_state", None)):
        copy.finalize_state()


def adapted_state(layer: Any) -> List[Any]:
    """What `adapt()` set on the layer, as values to compare later: its own variables as
    Keras's saving stores them (its weights where that protocol is missing: tf.keras
    2.12), and its vocabulary where it has one (a lookup keeps it in a table)."""
    state: List[Any] = []
    if _saves_itself(layer) and getattr(layer, "built", True):
        store: Dict[str, Any] = {}
        layer.save_own_variables(store)
        state = [np.array(store[key]) for key in sorted(store)]
    elif not _saves_itself(layer):
        state = [np.array(w) for w in layer.get_weights()]
    vocabulary = getattr(layer, "get_vocabulary", None)
    if callable(vocabulary):
        state.append([str(token) for token in vocabulary()])
    return state


def same_state(a: List[Any], b: List[Any]) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def carry_adapted(pairs: List[Tuple[Any, Any]]) -> None:
    """Each copy takes its layer's saved state as Keras's own saving would restore it
    (its own variables - which also recomputes what is derived from them, as
    Normalization's mean and variance tensors - then its assets, as a vocabulary)."""
    for layer, copy in pairs:
        if not (getattr(layer, "built", True) and getattr(copy, "built", True)):
            continue
        store: Dict[str, Any] = {}
        layer.save_own_variables(store)
        if store:
            copy.load_own_variables(store)
        if callable(getattr(layer, "save_assets", None)):
            with tempfile.TemporaryDirectory(prefix="kerasmgpu-assets-") as folder:
                layer.save_assets(folder)
                copy.load_assets(folder)
