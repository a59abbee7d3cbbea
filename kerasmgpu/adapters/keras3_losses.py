"""Keras 3, every backend: the loss terms `add_loss` and activity regularizers add in a
stateless scope (`keras.src.backend.StatelessScope(collect_losses=True)`).

Every JAX step is such a scope, and so is verify=True's loss on every backend
(`stateless_loss`). What is read or wrapped here:

* `Layer.add_loss`, `Layer._get_own_losses`, `Layer._clear_losses` (the class's, once a
  process; `owned_in_scope`): in a stateless scope that collects losses Keras tells a
  layer's losses by the `id()`s in its `_loss_ids`, which keep the ids of the previous
  trace's losses, long freed, until the layer's next call clears them. A new loss at a
  freed one's address is then taken for that layer's: the call of the next layer
  removes it from the step (one term of the loss silently gone from that compiled step:
  seen in about 1 trace in 100 of an activity regularizer followed by an `add_loss`
  layer, on one device with plain Keras too), or a layer not called since counts it
  twice. Wrapped so that the scope keeps each layer's losses of this scope and a
  layer's `_loss_ids` are set from those, live objects whose ids no other object has,
  before Keras reads them. Read in 3.3.3, 3.8.0, 3.10.0 and 3.15.1 (the same three
  methods); where they are not there, Keras is left as it is.
* `model._losses_override` (3.3 - 3.15, `Layer.losses` returns it when set): the terms a
  `stateless_call(..., return_losses=True)` collected, handed to the compiled loss as the
  JAX trainer's `compute_loss_and_updates` hands them (`stateless_loss`). Without them a
  stateless loss on TensorFlow or torch has no `add_loss` term at all (the scope
  `stateless_compute_loss` opens collects none), so verify=True could not see a term the
  replicas compute other than one device does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import threading
from typing import Any, Callable, Iterator, List

# On a StatelessScope: [(layer, loss)] for every loss a layer added in that scope.
_OWNERS_ATTR = "_kerasmgpu_loss_owners"
_OWNED_ATTR = "_kerasmgpu_owned_in_scope"
_OVERRIDE = "_losses_override"


def owned_in_scope() -> bool:
    """Whether Keras's `Layer` tells the losses added in a stateless scope by the scope's
    own record (see the module doc); arranges it, once a process."""
    try:
        layer_module = importlib.import_module("keras.src.layers.layer")
        backend = importlib.import_module("keras.src.backend")
    except ImportError:
        return False
    layer_class = getattr(layer_module, "Layer", None)
    current = getattr(backend, "get_stateless_scope", None)
    methods = ("add_loss", "_get_own_losses", "_clear_losses")
    if layer_class is None or current is None or not all(
            callable(getattr(layer_class, name, None)) for name in methods):
        return False
    if getattr(layer_class.add_loss, _OWNED_ATTR, False):
        return True
    add_loss, get_own, clear = (getattr(layer_class, name) for name in methods)

    def collecting() -> Any:
        scope = current()
        return scope if scope is not None and getattr(scope, "collect_losses", False) else None

    def from_the_scope(layer: Any) -> None:
        # Only in a scope does Keras read `_loss_ids` (elsewhere its `_losses`).
        scope = current()
        ids = getattr(layer, "_loss_ids", None)
        if scope is None or not isinstance(ids, set):
            return
        ids.clear()
        ids.update(id(loss) for owner, loss in scope.__dict__.get(_OWNERS_ATTR, ())
                   if owner is layer)

    @functools.wraps(add_loss)
    def owned_add_loss(self: Any, loss: Any) -> Any:
        scope = collecting()
        before = len(scope.losses) if scope is not None else 0
        result = add_loss(self, loss)
        if scope is not None:  # what Keras appended to the scope is this layer's
            scope.__dict__.setdefault(_OWNERS_ATTR, []).extend(
                (self, added) for added in scope.losses[before:])
        return result

    @functools.wraps(get_own)
    def owned_get_own_losses(self: Any) -> Any:
        from_the_scope(self)
        return get_own(self)

    @functools.wraps(clear)
    def owned_clear_losses(self: Any) -> Any:
        from_the_scope(self)
        result = clear(self)  # removes them from the scope, and clears the sub-layers
        scope = collecting()
        if scope is not None and _OWNERS_ATTR in scope.__dict__:
            scope.__dict__[_OWNERS_ATTR] = [
                entry for entry in scope.__dict__[_OWNERS_ATTR] if entry[0] is not self]
        return result

    setattr(owned_add_loss, _OWNED_ATTR, True)
    layer_class.add_loss = owned_add_loss
    layer_class._get_own_losses = owned_get_own_losses
    layer_class._clear_losses = owned_clear_losses
    return True


def stateless_loss(model: Any, x: Any, y: Any, sample_weight: Any, training: bool,
                   fail: Callable[[str, str], Exception]
                   ) -> Callable[[List[Any], List[Any], List[Any]], Any]:
    """`loss_of(trainable, non_trainable, metrics_variables)`: the compiled loss of the
    batch on those values, its `add_loss` terms included, as a step computes it, through
    `stateless_call` and `stateless_compute_loss` (public on Keras 3.0 - 3.15; the
    `training` argument of the latter from 3.8): the new states they return are dropped,
    nothing is assigned."""
    if not isinstance(getattr(model, _OVERRIDE, None), list):
        raise fail(f"`Model.{_OVERRIDE}` is missing",
                   "the loss terms of a stateless call (verify=True)")
    owned_in_scope()
    kwargs = {}
    if "training" in inspect.signature(model.stateless_compute_loss).parameters:
        kwargs["training"] = training

    def loss_of(trainable: List[Any], others: List[Any], metrics: List[Any]) -> Any:
        y_pred, _, terms = model.stateless_call(trainable, others, x, training=training,
                                                return_losses=True)
        with _terms(model, terms):
            loss, _ = model.stateless_compute_loss(trainable, others, metrics, x=x, y=y,
                                                   y_pred=y_pred,
                                                   sample_weight=sample_weight, **kwargs)
        return loss

    return loss_of


class _ThreadTerms(list):
    """`model._losses_override` while verify's losses are computed: each thread reads its
    own terms (TensorFlow's replicas run one model object, each in its own thread, and
    switch threads inside a loss where an all-reduce waits for the others)."""

    def __init__(self, saved: Any) -> None:
        super().__init__()
        self.saved, self.users, self._local = saved, 0, threading.local()

    def mine(self) -> List[Any]:
        terms: List[Any] = getattr(self._local, "terms", [])
        return terms

    def hold(self, terms: List[Any]) -> None:
        self._local.terms = terms

    def __bool__(self) -> bool:
        return bool(self.mine())

    def __len__(self) -> int:
        return len(self.mine())

    def __iter__(self) -> Iterator[Any]:
        return iter(self.mine())

    def __getitem__(self, index: Any) -> Any:
        return self.mine()[index]


_LOCK = threading.Lock()


@contextlib.contextmanager
def _terms(model: Any, terms: List[Any]) -> Iterator[None]:
    """`model.losses` reads this thread's `terms` inside: the JAX trainer's own
    hand-over, per thread."""
    if not terms:
        yield
        return
    with _LOCK:
        holder = model.__dict__.get(_OVERRIDE)
        if not isinstance(holder, _ThreadTerms):
            # Set past Keras's attribute tracking, as the attribute is replaced again.
            holder = _ThreadTerms(saved=holder)
            object.__setattr__(model, _OVERRIDE, holder)
        holder.users += 1
    holder.hold(list(terms))
    try:
        yield
    finally:
        holder.hold([])
        with _LOCK:
            holder.users -= 1
            if not holder.users:
                object.__setattr__(model, _OVERRIDE, holder.saved)
