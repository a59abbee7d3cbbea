"""Keras 2.3: the template's optimizer and trainable flags are the parallel model's.

Keras's own `multi_gpu_model` shares the template's variables, not its optimizer, and
builds the replicas' graph once: a learning rate set on the template, its `iterations`,
and a layer frozen on it and recompiled did not reach the parallel fit. kerasmgpu
compiles the parallel model with the template's own optimizer object (one learning
rate, one `iterations`) and with one set of slots: Keras 2.3 makes an optimizer's slots
(moments, accumulators) anew in every `get_updates`, that is in every train function
it builds, so the template's and the parallel model's train functions would otherwise
keep moments apart. Here a train function built for the same compile of the template
takes the slots the other one made (`share_slots`); a compile of the template makes
fresh ones, as Keras does on one device.

Keras's `Network.updates` leaves out a frozen layer's updates (a BatchNormalization's
moving statistics), reading `trainable` when the train function is built; but the
replicas' update ops were collected into the template's own lists (its
`_per_input_updates`, per replica input) when `multi_gpu_model` built them, with the
flags of that moment. `ReplicaUpdates` gives the parallel model's train function, when
it is built, the update ops of the layers trainable then - a layer frozen after
`parallelize()` and recompiled stays put, one unfrozen updates again. A layer of the
user's own that makes update ops (`add_update`: a moving average of its input, a count
of rows) made them for each replica's slice, run one after the other: a moving average
0.47 where one device's is 0.19, silently. Its ops are taken from the template's own
call instead (`own_ops`), whose inputs are the parallel model's - the whole batch, as
one device makes them - and its replicas' left out; inside a nested model, from the
template's own calls of that model (Keras 2.3 files a nested layer's conditional ops
under its model's call inputs too). Keras's own layers keep theirs (BatchNormalization:
`sync_batchnorm`).

Verified on keras 2.3.1 over TensorFlow 2.15.1 with the runtime patches of
`keras23_runtime` (`import kerasmgpu.keras23`). Read there: `Layer._per_input_updates`
and `_inbound_nodes`, `Network._network_nodes` and `_node_key`; wrapped on the instance:
`Model._make_train_function`, and while it runs `Optimizer.get_updates`, whose
assignments get control inputs by TensorFlow's `Operation._add_control_inputs`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

# The attribute of an optimizer whose slots are shared (see `share_slots`).
SHARED = "_kerasmgpu_shared_slots"
# Keras 2.3's per-input update lists of a layer.
UPDATES = "_per_input_updates"
# How many unconditional update ops a layer of the user's own had when kerasmgpu first
# met its template: its own call's; each replica's call adds as many (`own_ops`).
_UNCONDITIONAL = "_kerasmgpu_own_unconditional_updates"


def compile_token(model: Any) -> Tuple[Any, ...]:
    """Objects a compile replaces: the optimizer, and the list of trainable weights
    Keras 2.3 collects at every compile (a new list each time, also when nothing else
    changed)."""
    return (getattr(model, "optimizer", None),
            getattr(model, "_collected_trainable_weights", None))


class _Slots:
    """The slots an optimizer made for one compile of the template, in the order its
    `get_updates` asked `K.zeros` for them."""

    def __init__(self) -> None:
        self.key: Any = None
        self.made: List[Any] = []


def share_slots(keras: Any, optimizer: Any, template: Any) -> None:
    """`optimizer`'s `get_updates` makes its slots once per compile of `template`: a
    train function built later for the same compile (the template's, the parallel
    model's or a copy's, whose trainable weights are in the same order) takes the ones
    made first, so one set of moments sees every step, as on one device."""
    if optimizer is None or SHARED in vars(optimizer):
        return
    backend = keras.backend
    own = optimizer.get_updates
    slots = _Slots()
    if getattr(template, "train_function", None) is not None:
        # The template trained since its last compile: the slots it made are the ones.
        slots.key = getattr(template, "_collected_trainable_weights", None)
        slots.made = [w for w in (getattr(optimizer, "weights", None) or [])
                      if not any(w is value for value in vars(optimizer).values())]

    def get_updates(*args: Any, **kwargs: Any) -> Any:
        key = getattr(template, "_collected_trainable_weights", None)
        reuse = slots.made if key is not None and key is slots.key else []
        made: List[Any] = []
        zeros = backend.zeros
        backend.zeros = _slot_maker(backend, zeros, reuse, made)
        try:
            updates = own(*args, **kwargs)
        finally:
            backend.zeros = zeros
        slots.key, slots.made = key, made
        return updates

    optimizer.__dict__["get_updates"] = get_updates
    optimizer.__dict__[SHARED] = slots


def _slot_maker(backend: Any, zeros: Callable[..., Any], reuse: List[Any],
                made: List[Any]) -> Callable[..., Any]:
    """`K.zeros` that hands out the slots in `reuse` in order while their shape and
    dtype match what is asked for (kerasmgpu's own variables are always made anew)."""

    def slot(shape: Any, dtype: Optional[str] = None, name: Optional[str] = None) -> Any:
        index = len(made)
        wanted = (tuple(shape) if isinstance(shape, (list, tuple)) else (shape,),
                  dtype or backend.floatx())
        if (index < len(reuse) and not str(name or "").startswith("kerasmgpu")
                and (tuple(backend.int_shape(reuse[index])), backend.dtype(reuse[index]))
                == wanted):
            variable = reuse[index]
        else:
            variable = zeros(shape, dtype=dtype, name=name)
        made.append(variable)
        return variable

    return slot


# --- the replicas' update ops, by the layers' trainable flags when a train function is made -


def _inner(layer: Any) -> List[Any]:
    return list(getattr(layer, "layers", None) or [])


def _owners(layer: Any) -> List[Any]:
    """The layer and the layers it wraps (TimeDistributed(BatchNormalization()): the
    inner layer registers the updates)."""
    owners = [layer]
    while getattr(owners[-1], "layer", None) is not None:
        owners.append(owners[-1].layer)
    return owners


def _tree(model: Any) -> List[Tuple[Any, bool]]:
    """Every layer under `model` (itself included), with whether it and every model it
    sits in is trainable now."""
    out: List[Tuple[Any, bool]] = []

    def walk(layer: Any, active: bool) -> None:
        active = active and bool(getattr(layer, "trainable", True))
        out.append((layer, active))
        for inner in _inner(layer):
            walk(inner, active)

    walk(model, True)
    return out


class ReplicaUpdates:
    """The update ops of the replicas `multi_gpu_model` builds of `model`, regathered
    by the trainable flags of the moment the parallel model's train function is made.

    Made before the replicas are built (`ReplicaUpdates(keras, model)`), told when they
    are (`built()`); `as_now()` is the context the train function is made in."""

    def __init__(self, keras: Any, model: Any) -> None:
        self.keras, self.model = keras, model
        self._nodes = len(getattr(model, "_inbound_nodes", None) or [])
        self._before = self._keys()
        self._replica_keys: Dict[int, Set[Any]] = {}
        self._model_keys: List[Any] = []
        self._own = own_ops(keras, model)
        # The replicas' unconditional ops of a layer of `_own`, taken out of its list for
        # good (the template's own fit would run them too), and left out of what the
        # template collected of them.
        self._dropped: Set[int] = set()

    def _keys(self) -> Dict[int, Set[Any]]:
        return {id(owner): set(getattr(owner, UPDATES))
                for layer, _ in _tree(self.model) for owner in _owners(layer)
                if isinstance(getattr(owner, UPDATES, None), dict)}

    def built(self, parallel: Any) -> None:
        """`parallel`, the model of the replicas, is built: their keys are the ones made
        since, and its train function is made in `as_now()` from now on."""
        uid = self.keras.utils.generic_utils.object_list_uid
        now = self._keys()
        self._replica_keys = {k: keys - self._before.get(k, set()) for k, keys in now.items()}
        nodes = (getattr(self.model, "_inbound_nodes", None) or [])[self._nodes:]
        self._model_keys = [uid(node.input_tensors) for node in nodes]
        own = parallel._make_train_function

        def make_train_function() -> None:
            if getattr(parallel, "train_function", None) is not None:
                return own()
            with self.as_now():
                return own()

        parallel.__dict__["_make_train_function"] = make_train_function
        train_after_own_inputs(parallel, self.model, self._own)
        for layer in getattr(self.model, "layers", None) or []:
            lists = getattr(layer, UPDATES, None) or {}
            if self._own.get(id(layer)) and None in lists:
                kept = layer.__dict__[_UNCONDITIONAL]
                self._dropped.update(id(op) for op in lists[None][kept:])
                lists[None] = lists[None][:kept]

    @contextlib.contextmanager
    def as_now(self) -> Iterator[None]:
        """While Keras makes the train function: the model's lists for the replicas'
        inputs hold the update ops of the layers trainable now (each owner's own, for
        every replica) and the ops nobody owns; the lists of the models inside it are
        empty then (their ops are in the outer list already)."""
        if not self._model_keys:
            yield
            return
        tree = _tree(self.model)
        own: Dict[int, List[Any]] = {}
        left_out: Set[int] = set()  # a whole-batch layer's replicas' ops
        for layer, active in tree:
            if _inner(layer):
                continue
            for owner in _owners(layer):
                keys = self._replica_keys.get(id(owner), set())
                lists = getattr(owner, UPDATES)
                ops = [op for key in keys for op in lists.get(key, [])]
                whole = self._own.get(id(owner))
                if whole:
                    left_out.update(id(op) for op in ops)
                    ops = whole
                own.setdefault(id(owner), []).extend((active, op) for op in ops)
        left_out |= self._dropped
        owned = {id(op) for ops in own.values() for _, op in ops} | left_out
        lists = getattr(self.model, UPDATES)
        found = [op for key in self._model_keys for op in lists.get(key, [])]
        gathered = list({id(op): op for ops in own.values() for active, op in ops
                         if active}.values())
        gathered += [op for op in found if id(op) not in owned]
        saved = self._replace(tree, gathered, left_out)
        try:
            yield
        finally:
            for lists, key, value in reversed(saved):
                if value is None:
                    lists.pop(key, None)
                else:
                    lists[key] = value

    def _replace(self, tree: List[Tuple[Any, bool]], gathered: List[Any], left_out: Set[int]
                 ) -> List[Tuple[Dict[Any, Any], Any, Optional[List[Any]]]]:
        saved: List[Tuple[Dict[Any, Any], Any, Optional[List[Any]]]] = []

        def put(lists: Dict[Any, Any], key: Any, value: List[Any]) -> None:
            saved.append((lists, key, lists.get(key)))
            lists[key] = value

        lists = getattr(self.model, UPDATES)
        for index, key in enumerate(self._model_keys):
            put(lists, key, gathered if index == 0 else [])
        # A whole-batch layer's replicas' unconditional ops, collected by the template.
        if left_out and None in lists:
            put(lists, None, [op for op in lists[None] if id(op) not in left_out])
        for layer, _ in tree[1:]:
            if _inner(layer):
                for key in self._replica_keys.get(id(layer), set()):
                    put(getattr(layer, UPDATES), key, [])
        return saved



def _whole(keras: Any, layer: Any) -> bool:
    """A layer of the user's own (not Keras's, not a model; a BatchNormalization
    subclass's moving statistics follow `sync_batchnorm`)."""
    return (type(layer).__module__.split(".")[0] != "keras" and not _inner(layer)
            and not isinstance(layer, keras.layers.BatchNormalization))


def _own_nodes(model: Any, layer: Any) -> List[Any]:
    """`layer`'s nodes in the template's own graph (not its replicas')."""
    nodes = getattr(model, "_network_nodes", None) or set()
    return [node for index, node in enumerate(layer._inbound_nodes)
            if model._node_key(layer, index) in nodes]


def own_ops(keras: Any, model: Any) -> Dict[int, List[Any]]:
    """For each layer of the user's own in `model` that makes update ops, those its
    calls in the template's own graph made (its nodes the template owns, and the
    unconditional ones it had when kerasmgpu first met it): computed from the
    template's inputs, which are the parallel model's, the whole batch. Inside a model
    of the template's, `_nested_own_ops`."""
    uid = keras.utils.generic_utils.object_list_uid
    found: Dict[int, List[Any]] = {}
    for layer in getattr(model, "layers", None) or []:
        lists = getattr(layer, UPDATES, None)
        if _inner(layer) and isinstance(lists, dict):
            found.update(_nested_own_ops(keras, model, layer))
            continue
        if not _whole(keras, layer) or not isinstance(lists, dict) or not lists:
            continue
        layer.__dict__.setdefault(_UNCONDITIONAL, len(lists.get(None, [])))
        ops = [op for node in _own_nodes(model, layer)
               for op in lists.get(uid(node.input_tensors), [])]
        ops += lists.get(None, [])[:layer.__dict__[_UNCONDITIONAL]]
        if ops:
            found[id(layer)] = ops
    return found


def _nested_own_ops(keras: Any, model: Any, inner: Any) -> Dict[int, List[Any]]:
    """For each layer of the user's own inside `inner`, a model of the template's (at
    any depth): the update ops the template's own calls of `inner` made for it. Keras
    2.3 files a nested layer's conditional ops under its own call's tensors inside the
    model, and under the model's call inputs in the model's lists (`run_internal_graph`),
    which the template's own nodes of `inner` name. Its unconditional ones are not
    taken: the nested model's own graph made them too, reading its own inputs, which no
    step feeds (plain Keras 2.3 cannot train such a layer on one device either:
    "You must feed a value for placeholder tensor"); `nested_updaters` names them."""
    uid = keras.utils.generic_utils.object_list_uid
    lists = getattr(inner, UPDATES)
    calls = [op for node in _own_nodes(model, inner)
             for op in lists.get(uid(node.input_tensors), [])]
    found: Dict[int, List[Any]] = {}
    for layer, _ in _tree(inner)[1:]:
        mine = getattr(layer, UPDATES, None)
        if not _whole(keras, layer) or not isinstance(mine, dict):
            continue
        ids = {id(op) for ops in mine.values() for op in ops}
        ops = [op for op in calls if id(op) in ids]
        if ops:
            found[id(layer)] = ops
    return found


def nested_updaters(keras: Any, model: Any) -> List[str]:
    """The layers of the user's own inside a model of the template's that make update
    ops `own_ops` cannot take from the template's own calls (unconditional ones), in
    words: they keep their replicas' ops."""
    own = own_ops(keras, model)
    return [f"{type(layer).__name__} {layer.name!r} in the nested model {inner.name!r}"
            for inner in getattr(model, "layers", None) or [] if _inner(inner)
            for layer, _ in _tree(inner)[1:]
            if _whole(keras, layer) and (getattr(layer, UPDATES, None) or {}).get(None)
            and not own.get(id(layer))]


def train_after_own_inputs(parallel: Any, model: Any, own: Dict[int, List[Any]]) -> None:
    """The template's own update ops (`own_ops`) read a forward pass of the template on
    the whole batch that no gradient needs, so nothing ordered it before the optimizer's
    assignments in the train function's one run: it could read the weights the step had
    just changed (a moving average 3e-4 for one device's 4e-4). The optimizer's
    assignments of the weights in the parallel model's train function wait for the
    inputs those ops read, as one device's wait for the forward pass their gradients
    need; nothing else is reordered (with every update made to wait, Adam's read of
    `iterations` and its increment swapped on some runs: weights 6e-3 off). Wraps the
    instance's `_make_train_function` and, while it runs, the optimizer's `get_updates`
    (2.3.1)."""
    tensors = []
    for layer in getattr(model, "layers", None) or []:
        if own.get(id(layer)):
            tensors += [tensor for node in _own_nodes(model, layer)
                        for tensor in node.input_tensors]
        elif _inner(layer) and any(own.get(id(inner)) for inner, _ in _tree(layer)[1:]):
            # A nested layer's ops read tensors inside its model's own call (after a
            # layer of that model, whose weights the step assigns): its outputs follow.
            tensors += [tensor for node in _own_nodes(model, layer)
                        for tensor in node.output_tensors]
    if not tensors:
        return
    make = parallel._make_train_function

    def make_train_function() -> Any:
        optimizer = parallel.optimizer
        # What stands there now (the shared slots' `get_updates`, accumulate_steps'
        # stand-in) is called, and put back.
        before = optimizer.__dict__.get("get_updates")
        original = optimizer.get_updates

        def get_updates(*args: Any, **kwargs: Any) -> Any:
            updates = original(*args, **kwargs)
            # The assignments of the weights wait - not `iterations`' increment, nor any
            # read (Adam's of `iterations`): their order stays one device's. An update
            # that is a tensor is the read after its assignment (`assign` of a
            # resource variable): the assignment is among its control inputs.
            params = kwargs.get("params", args[0] if args else [])
            handles = {getattr(getattr(p, "handle", None), "op", None) for p in params}
            handles.discard(None)
            waited = [tensor.op for tensor in tensors]
            for update in updates:
                op = update if hasattr(update, "_add_control_inputs") else update.op
                for gated in [op] + list(op.control_inputs):
                    if "Assign" in gated.type and gated.inputs and \
                            gated.inputs[0].op in handles:
                        gated._add_control_inputs(waited)
            return updates

        optimizer.__dict__["get_updates"] = get_updates
        try:
            return make()
        finally:
            if before is None:
                optimizer.__dict__.pop("get_updates", None)
            else:
                optimizer.__dict__["get_updates"] = before

    parallel.__dict__["_make_train_function"] = make_train_function


def update_keys(model: Any) -> Dict[int, Set[Any]]:
    """Each layer's update list keys now (before replicas are built), nested ones too."""
    return {id(layer): set(getattr(layer, UPDATES, None) or {})
            for layer, _ in _tree(model)[1:]}


def keep_own_updates(model: Any, own: Dict[int, List[Any]], before: Dict[int, Set[Any]],
                     replicas: Any) -> None:
    """After the replicas were built layer by layer and called (`keras23_batchnorm`:
    their model `replicas` gathers its layers' ops by their flags itself): each layer of
    `own` (`own_ops`) holds the template's own ops only - its replicas' left out of its
    lists and of what `replicas` collected of them, its own conditional ones kept with
    its unconditional ones, which any model it is a layer of collects."""
    dropped: Set[int] = set()
    for layer in getattr(model, "layers", None) or []:
        if _inner(layer):
            _keep_nested_own_updates(layer, own, before, dropped)
        ops = own.get(id(layer))
        if not ops:
            continue
        lists = getattr(layer, UPDATES)
        for key in set(lists) - before.get(id(layer), set()):
            dropped.update(id(op) for op in lists[key])
            lists[key] = []
        kept = lists.get(None, [])[:layer.__dict__[_UNCONDITIONAL]]
        dropped.update(id(op) for op in lists.get(None, [])[len(kept):])
        lists[None] = kept + [op for op in ops if not any(op is k for k in kept)]
    collected = getattr(replicas, UPDATES)
    for key, ops in list(collected.items()):
        collected[key] = [op for op in ops if id(op) not in dropped]


def _keep_nested_own_updates(inner: Any, own: Dict[int, List[Any]],
                             before: Dict[int, Set[Any]], dropped: Set[int]) -> None:
    """`keep_own_updates` for the layers of `own` inside `inner`, a model of the
    template's: their replicas' ops leave their lists and the lists the replicas' calls
    of `inner` filed them in, and `inner` holds their own ones unconditionally (as a
    layer of the replicas' model, which collects them)."""
    mine = [op for layer, _ in _tree(inner)[1:] for op in own.get(id(layer), [])]
    if not mine:
        return
    for layer, _ in _tree(inner)[1:]:
        if own.get(id(layer)):
            lists = getattr(layer, UPDATES)
            for key in set(lists) - before.get(id(layer), set()):
                dropped.update(id(op) for op in lists[key])
                lists[key] = []
    for layer, _ in _tree(inner):
        lists = getattr(layer, UPDATES)
        for key in set(lists) - before.get(id(layer), set()):
            lists[key] = [op for op in lists[key] if id(op) not in dropped]
    unconditional = getattr(inner, UPDATES).setdefault(None, [])
    unconditional += [op for op in mine if not any(op is k for k in unconditional)]


def missing_lists(model: Any) -> List[str]:
    """The layers under `model` without Keras 2.3's per-input update lists."""
    return [layer.name for layer, _ in _tree(model)
            if not isinstance(getattr(layer, UPDATES, None), dict)]
