"""What in a model's step is computed from the whole batch beyond Keras's compiled loss
(`batch_terms`): what no per-row weight reaches, so padding rows would count in it.

Read from the classes' code before any step runs, since a feed is planned before the
step is traced; `steps.StepReport` reports what only the traced step shows.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Sequence

from kerasmgpu.adapters import Adapter
from kerasmgpu.env.versions import FRAMEWORK_PACKAGES, frameworks_own

# Functions `_names` follows at most per question: a class's helpers, not a program.
_FOLLOWED_AT_MOST = 200


def _users_function(value: Any) -> Optional[Any]:
    """`value` as a plain function defined outside the frameworks, else None."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if not inspect.isfunction(value):
        return None
    return None if frameworks_own(value) else value


def _names(function: Any, owner: Optional[type] = None,
           held: Sequence[Any] = ()) -> frozenset:
    """The global and attribute names a function's code reads, and those of the code
    it reaches that the user wrote: its nested functions and lambdas, the methods of
    `owner` (the class it belongs to) it names (a helper `call` calls,
    `self.penalize(x)`), the methods and function attributes of the `held` objects
    (the layer, the helpers it holds: `self.penalizer.apply(self, x)`), and the
    module-level functions it names, each followed once. Keras's own methods are not
    followed (they name everything)."""
    # Looked up on the objects themselves: a function held as an attribute
    # (`self.penalty = penalize`) is found as well as their classes' methods.
    owners = ([owner] if owner is not None else []) + list(held)
    names: set = set()
    seen: set = set()
    pending = [function]
    while pending and len(seen) < _FOLLOWED_AT_MOST:
        item = pending.pop()
        fn = inspect.unwrap(getattr(item, "__func__", item))
        code = getattr(fn, "__code__", None)
        if code is None or code in seen:
            continue
        seen.add(code)
        own: set = set()
        codes = [code]
        while codes:  # the function's code and the functions defined in it
            current = codes.pop()
            own.update(current.co_names)
            codes.extend(c for c in current.co_consts if inspect.iscode(c))
        names |= own
        scope = getattr(fn, "__globals__", {})
        for name in own:
            found = next((f for f in (_users_function(inspect.getattr_static(cls, name, None))
                                      for cls in owners) if f is not None), None)
            found = found or _users_function(scope.get(name))
            if found is not None:
                pending.append(found)
    return frozenset(names)


# Classes whose methods never add a loss term and would only spend `_FOLLOWED_AT_MOST`:
# Python's own and the array libraries' (a layer holds arrays and tensors).
_NOT_HELPERS = FRAMEWORK_PACKAGES | {"builtins", "numpy", "jax", "jaxlib", "torch"}


def _helpers(obj: Any, depth: int = 0) -> List[Any]:
    """The objects of the user's classes `obj` holds as attributes (a helper a layer
    reads in `call`, `self.penalizer = Penalizer()`), and those they hold: two levels,
    sixteen objects at most. Keras objects (sub-layers: batch_terms reads them itself),
    containers and arrays are not helpers."""
    try:
        held = list(vars(obj).values())
    except Exception:  # no __dict__, or a proxy whose __getattr__ raises anything
        return []
    found: List[Any] = []
    for value in held:
        module = (getattr(type(value), "__module__", "") or "").split(".")[0]
        if module in _NOT_HELPERS or inspect.isroutine(value) or isinstance(value, type):
            continue
        found.append(value)
        if depth < 1:
            found.extend(_helpers(value, depth + 1))
    return found[:16]


def batch_terms(adapter: Adapter, model: Any, custom_steps: Dict[str, Any]) -> List[str]:
    """What in `model`'s step is computed from the whole batch beyond Keras's compiled
    loss, which a padding row's weight cannot reach - each in words, [] when nothing.

    Read from the classes' code before any step runs (a feed is planned before the step
    is traced): an activity regularizer; `add_loss` named in a layer's (or the model's)
    own `call` or in the code of the user's it reaches (`_names`: its class's methods,
    module-level functions, the methods of the helper objects the layer holds); a
    `train_step` / `test_step` of the user's that names neither `compute_loss` nor
    `compiled_loss` there (its loss is its own). A term added by code that `call`
    reaches only by a name it computes (`getattr(self, self.how)`) is found only when
    the step is traced (`StepReport` warns then).
    `custom_steps`: step kind -> the user's step function.
    """
    found: List[str] = []
    for layer in adapter.layers_of(model):
        name = getattr(layer, "name", type(layer).__name__)
        if getattr(layer, "activity_regularizer", None) is not None:
            found.append(f"the activity regularizer of layer {name!r}")
        elif "add_loss" in _call_names(layer):
            found.append(f"add_loss in {type(layer).__name__}.call (layer {name!r})")
    if not found and adapter.has_call_time_losses(model):
        found.append("loss terms added by its last call (add_loss)")
    for kind, step in sorted(custom_steps.items()):
        if not {"compute_loss", "compiled_loss"} & _names(step, type(model)):
            found.append(f"its own {kind}_step's loss")
    return found


def _call_names(layer: Any) -> frozenset:
    """The names a layer's `call` reads, and the user's code it reaches (`_names`)."""
    return _names(getattr(type(layer), "call", None), type(layer), [layer, *_helpers(layer)])


def _users_layers_naming(adapter: Adapter, model: Any, wanted: frozenset) -> List[Any]:
    """The user's layers (the model among them) whose `call` names one of `wanted`;
    Keras's own layers are not read."""
    return [layer for layer in adapter.layers_of(model)
            if not frameworks_own(type(layer)) and wanted & _call_names(layer)]


def metric_layers(adapter: Adapter, model: Any) -> List[Any]:
    """The user's layers whose `call`, or the code of the user's it reaches, names
    `add_metric` (tf.keras, tf_keras, Keras 2.3: a value Keras averages over the steps,
    computed in the step from the rows it is given). Keras's own layers add none."""
    return _users_layers_naming(adapter, model, frozenset({"add_metric"}))


def state_layers(adapter: Adapter, model: Any) -> List[Any]:
    """The user's layers whose `call`, or the code of the user's it reaches, assigns
    variables (`self.ema.assign(...)`, or the Keras 2 way, `K.update_add`,
    `K.moving_average_update`, `self.add_update(...)`): state updated from the rows the
    step is given. Keras's own layers are not among them (BatchNormalization's moving
    statistics: `sync_batchnorm`). (`K.update` is not looked for: a dict's `update`
    would be taken for it.)"""
    return _users_layers_naming(adapter, model, _ASSIGNING)


_ASSIGNING = frozenset({"assign", "assign_add", "assign_sub", "update_add", "update_sub",
                        "moving_average_update", "add_update"})


def assigning_steps(model: Any, methods: Dict[str, Any]) -> List[str]:
    """The names of the user's own step methods (name -> function: a train_step, a
    compute_loss) whose code, or the code of the user's it reaches (the model class's
    methods, module-level functions), assigns variables - `self.seen.assign_add(...)`,
    an average of its own."""
    return [name for name, method in methods.items()
            if _ASSIGNING & _names(method, type(model))]


def loss_layers(adapter: Adapter, model: Any) -> List[Any]:
    """The user's layers whose `call`, or the code of the user's it reaches, names
    `add_loss` (as `batch_terms` finds them)."""
    return _users_layers_naming(adapter, model, frozenset({"add_loss"}))


def row_layers(adapter: Adapter, model: Any) -> List[Any]:
    """The layers whose `call` is the user's code - the user's layer classes, and Keras's
    `Lambda` (a function of the user's) - but the models (their layers are among these)
    and BatchNormalization's subclasses (their batch statistics: `sync_batchnorm`): each
    is tried for outputs read from the batch's other rows (`tried_layers.mixed_rows`)."""
    layers = adapter.keras.layers
    own = tuple(c for c in (getattr(layers, "Lambda", None),) if c is not None)
    norm = tuple(c for c in (getattr(layers, "BatchNormalization", None),) if c is not None)
    return [layer for layer in adapter.layers_of(model)
            if (not frameworks_own(type(layer)) or isinstance(layer, own))
            and not isinstance(layer, norm) and not adapter.is_model(layer)]

