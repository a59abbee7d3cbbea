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
never Keras's private bookkeeping.
"""

from __future__ import annotations

import ast
import functools
import inspect
import tempfile
import textwrap
from typing import Any, Dict, FrozenSet, List, Tuple

import numpy as np

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


# Top-level packages whose classes are Keras's (their private attributes are its
# bookkeeping), not the user's.
_FRAMEWORKS = frozenset({"keras", "tf_keras", "tensorflow"})


def _users_classes(cls: type) -> List[type]:
    """The classes of `cls`'s MRO defined outside the frameworks, up to the first
    framework class (a user's layer and its own bases)."""
    found = []
    for klass in cls.__mro__:
        if (klass.__module__ or "").split(".")[0] in _FRAMEWORKS or klass is object:
            break
        found.append(klass)
    return found


@functools.cache
def _assigned_private(cls: type) -> FrozenSet[str]:
    """The private names `cls`'s own source assigns on its instances (`self._x = ...`,
    `+=`, annotated), name-mangled as Python stores them; none where the source cannot
    be read (a class made by exec, or in some interactive sessions)."""
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
                            and leaf.value.id == me and leaf.attr.startswith("_")):
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
    cls = type(layer)
    users = _users_classes(cls)
    if not users:
        return frozenset()
    names: FrozenSet[str] = frozenset()
    for klass in users:
        names = names | _assigned_private(klass)
    bases = [k for k in cls.__mro__ if k.__name__ == "Layer"
             and (k.__module__ or "").split(".")[0] in _FRAMEWORKS]
    return names - _bookkeeping(bases[-1]) if names and bases else names


def attributes(layer: Any) -> Dict[str, Any]:
    """The layer's public plain-data attributes (its own `__dict__`, not its class's),
    and the private ones its user-defined classes assign (`_users_private`)."""
    found = {}
    private = _users_private(layer)
    for key, value in vars(layer).items():
        if (key.startswith("_") and key not in private) or key in _SKIPPED:
            continue
        if _plain(value):
            found[key] = value
    return found


def snapshot(layer: Any) -> Dict[str, Any]:
    """The layer's plain attributes now, kept apart from later in-place changes."""
    return {k: _copied(v) for k, v in attributes(layer).items()}


def same(a: Any, b: Any) -> bool:
    if a is b:
        return True
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
        setattr(target, key, _copied(value))
        carried.append(key)
    return carried


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
