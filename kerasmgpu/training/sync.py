"""The template is the truth both ways: the model you built and the parallel model agree.

`parallelize()` trains a copy of the model you built - the replica - or, when it was
built in `kerasmgpu.scope()` (and always on torch, and on JAX in one process), the model
itself. Between two calls
of the parallel model either side may change: you set, load, train, recompile or freeze
the template, or assign one of its variables; a call trains the replica. So:

* before every call (`before_call`), what changed in the template since the two last
  agreed goes to the replica - variable by variable, so a new learning rate copies one
  number, not the model - and a template compiled anew is compiled anew in the replica,
  with the template's trainable flags;
* after a call that trains, and at every epoch end (`after_training`), the replica's
  state goes to the template: weights, optimizer state (learning rate included) and
  BatchNorm statistics.

Finding what changed copies nothing: `Adapter.state_reader` gives one token per
variable (the identity of a JAX array, a torch tensor's version, a hash of the bits
computed where a TensorFlow variable lives), and trainable flags and the compile
configuration are compared as they are. In a job of several processes, the processes'
verdicts are combined and, when any template changed, rank 0's template goes to every
process: the chief's template is the truth.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import Adapter, layer_state
from kerasmgpu.adapters.base import StateReader
from kerasmgpu.training.ops import EngineOps


@dataclass
class Part:
    """A part of the training state (the weights, or the optimizer's): the template's
    variables and the replica's in the same order, and the template's tokens when the
    two last agreed."""

    template: List[Any]
    replica: List[Any]
    reader: StateReader
    seen: List[Any] = field(default_factory=list)
    # The replica's tokens when it last gave its state to the template (only where
    # tokens cost nothing to read: `Adapter.identity_tokens`), else None.
    replica_seen: Optional[List[Any]] = None
    # A job: the replica's state kerasmgpu last wrote or read (`_direct_tokens`), to
    # find what one process set on the parallel model directly; None: not known.
    direct_seen: Optional[List[Any]] = None
    # The replica's reader for `direct_seen`, made once (a traced function on TF).
    direct_reader: Optional[StateReader] = None


@dataclass
class Mirror:
    """What kerasmgpu keeps to make a template and its replica agree."""

    template: Any
    replica: Any
    adapter: Adapter
    # The engine: scope(), equalize(replica), any_processes(flags), broadcast_arrays(arrays).
    engine: EngineOps
    # Compiles the replica with the template's compile arguments (None: never needed).
    recompile: Optional[Callable[[Dict[str, Any]], None]] = None
    # Whether the optimizer state is mirrored (Keras 2.3's own multi_gpu_model keeps the
    # template's optimizer apart, and so does kerasmgpu there).
    with_optimizer: bool = True
    # A job of several processes: calls that all processes make agree on what changed.
    job: bool = False
    # The scope the template's own variables are made in: a template that is itself a
    # parallel model trained in place (JAX), its engine's; None: outside any.
    template_scope: Optional[Callable[[], Any]] = None
    weights: Optional[Part] = None
    optimizer: Optional[Part] = None
    compiled: Tuple[Any, ...] = ()
    flags: Tuple[Tuple[bool, ...], Tuple[bool, ...]] = ((), ())
    layers: Tuple[List[Any], List[Any]] = ([], [])
    # Each layer with its copy, and both sides' plain Python attributes when they last
    # agreed (`_carry_attributes`).
    pairs: List[Tuple[Any, Any]] = field(default_factory=list)
    attributes: List[Tuple[Dict[str, Any], Dict[str, Any]]] = field(default_factory=list)
    # Each adapted preprocessing layer with its copy, and the template's adapted state
    # as the copy last took it (`_carry_adapted`); None: new layers, each carried at the next call.
    adapted: Optional[List[Tuple[Any, Any, Optional[List[Any]]]]] = None
    warned: bool = False
    # The template's optimizer has its slots (`build_template_optimizer`).
    template_slots: bool = False
    # A job: this process changed the parallel model itself since the processes last
    # agreed (set_weights / load_weights on it), which no token of the template shows.
    changed_here: bool = False

    @property
    def shared(self) -> bool:
        """The template is the parallel model itself (built in scope, or torch)."""
        return self.template is self.replica

    @property
    def idle(self) -> bool:
        """Nothing to keep equal: one model, one process."""
        return self.shared and not self.job

    def parts(self, training: bool = True) -> List[Part]:
        parts = [self.weights] + ([self.optimizer] if training else [])
        return [p for p in parts if p is not None]


def link(template: Any, replica: Any, adapter: Adapter, engine: EngineOps, **options: Any
         ) -> Mirror:
    """A mirror of a template and its replica whose weights already agree: the
    template's optimizer state goes to the replica, and both sides are recorded."""
    mirror = Mirror(template, replica, adapter, engine, **options)
    relink(mirror)
    if not mirror.shared:  # the copy took the adapted layers' state as it was made
        mirror.adapted = _adapted_pairs(mirror)
    return mirror


def relink(mirror: Mirror) -> None:
    """After a compile: take the optimizers as they are now, the template's state into
    the replica, and record both sides as agreeing."""
    if mirror.idle:
        return
    if not mirror.shared:
        mirror.template_slots = False  # a compile may have given it a new optimizer
        build_template_optimizer(mirror)
    _refresh(mirror)
    if not mirror.shared and len(mirror.attributes) != len(mirror.pairs):
        # The copy took the plain attributes as it was made: both sides agree now, so a
        # change made before the first call (right after parallelize()) is carried by it.
        mirror.attributes = [_snapshot(t, r) for t, r in mirror.pairs]
    if mirror.optimizer is not None and not mirror.shared:
        _copy(mirror, mirror.optimizer, to_replica=True)
    _record(mirror)
    if mirror.job and not mirror.shared:
        # A job: what is set on the parallel model by one process is found from here on.
        for part in mirror.parts():
            part.direct_seen = _direct_tokens(mirror, part)


# --- before a call: the template's changes into the replica --------------------------------


def before_call(mirror: Mirror, *, training: bool, collective: bool,
                also: Sequence[bool] = ()) -> List[bool]:
    """Bring the template's changes into the replica before a call.

    `training`: the call trains (optimizer state and trainable flags matter then);
    `collective`: every process of a job makes this call together, so that they can
    agree on what changed (predict runs on each process alone). `also`: flags of this
    process the job agrees on in the same collective; returned as agreed (whether any
    process set each; alone: as they are).
    """
    exchange = collective and mirror.job
    if mirror.shared:
        if not exchange:
            return list(also)
        changed, *agreed = mirror.engine.any_processes(
            [bool(_changes(mirror, training) or mirror.changed_here)] + list(also))
        if changed:  # the parallel model is the template (torch, or built in scope)
            _take_the_chiefs(mirror, training)
        mirror.changed_here = False
        return agreed
    _carry_attributes(mirror)
    _carry_adapted(mirror)
    if _compiled_anew(mirror):
        _copy_flags(mirror)
        _recompile(mirror)
    elif training:
        _copy_flags(mirror)
    if training and not mirror.template_slots:
        # Nothing was trainable when the template's optimizer was last built (a GAN's
        # discriminator frozen to build the combined model, then parallelized): its
        # slots are made now, outside the engine's scope, for the variables this call
        # trains - the layout the replica's take in the call.
        build_template_optimizer(mirror)
    changes = _changes(mirror, training)
    if exchange:
        direct = _replica_changes(mirror, training)
        # What was set on the parallel model directly goes into this process's template
        # first (where the template did not change it too: as one process's call would
        # train with), and then every process takes the chief's template.
        for part, indexes in direct:
            ours = {i for p, changed, _ in changes if p is part for i in changed}
            _copy(mirror, part, to_replica=False,
                  indexes=[i for i in indexes if i not in ours])
        changed, *agreed = mirror.engine.any_processes(
            [bool(changes or direct or mirror.changed_here)] + list(also))
        if changed:
            _take_the_chiefs(mirror, training)
        mirror.changed_here = False
        return agreed
    for part, indexes, tokens in changes:
        _copy(mirror, part, to_replica=True, indexes=indexes)
        part.seen = tokens
    return list(also)


def _replica_changes(mirror: Mirror, training: bool) -> List[Tuple[Part, List[int]]]:
    """(part, indexes) of the replica's variables set directly since kerasmgpu last
    wrote or read them (a learning rate set on the parallel model's optimizer)."""
    found = []
    for part in mirror.parts(training):
        seen = part.direct_seen
        if seen is None or len(seen) != len(part.replica):
            continue
        now = _direct_tokens(mirror, part)
        indexes = [i for i, (a, b) in enumerate(zip(now, seen)) if a != b]
        if indexes:
            found.append((part, indexes))
    return found


def _direct_tokens(mirror: Mirror, part: Part) -> List[Any]:
    """What tells a direct change of the replica's side of `part`: every variable's
    token - free where tokens are identities (`Adapter.identity_tokens`: JAX, torch), a
    hash of each value on TensorFlow, read on the devices and crossing as one number a
    variable, as the template's own tokens are (a weight one worker assigned on the
    parallel model alone changed nothing the template's tokens show)."""
    if part.direct_reader is None:
        part.direct_reader = mirror.adapter.state_reader(part.replica)
    tokens: List[Any] = part.direct_reader()
    return tokens


def _changes(mirror: Mirror, training: bool) -> List[Tuple[Part, List[int], List[Any]]]:
    """(part, indexes of the template's variables that changed, the tokens now)."""
    found = []
    for part in mirror.parts(training):
        tokens = part.reader()
        indexes = [i for i, (now, seen) in enumerate(zip(tokens, part.seen)) if now != seen]
        if indexes or len(tokens) != len(part.seen):
            found.append((part, indexes or list(range(len(tokens))), tokens))
    return found


def _take_the_chiefs(mirror: Mirror, training: bool) -> None:
    adapter = mirror.adapter
    for part in mirror.parts(training):
        values = mirror.engine.broadcast_arrays(adapter.read_values(part.template))
        if mirror.shared:
            with mirror.engine.scope():
                adapter.write_values(part.template, values)
        else:
            adapter.write_values(part.template, values)
            _copy(mirror, part, to_replica=True)
        part.seen = part.reader()


def _compiled_anew(mirror: Mirror) -> bool:
    token = mirror.adapter.compile_token(mirror.template)
    return mirror.recompile is not None and not _same(token, mirror.compiled)


def _recompile(mirror: Mirror) -> None:
    """The template was compiled anew: the replica is compiled with its arguments (a
    fresh copy of its optimizer), then takes its optimizer state."""
    assert mirror.recompile is not None
    if mirror.adapter.is_compiled(mirror.template):
        mirror.recompile(mirror.adapter.compile_args(mirror.template))
    relink(mirror)


def _same(a: Tuple[Any, ...], b: Tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


# --- trainable flags ------------------------------------------------------------------------


def _trainable(layers: List[Any]) -> Tuple[bool, ...]:
    return tuple(bool(layer.trainable) for layer in layers)


def _copy_flags(mirror: Mirror) -> None:
    """Freezing or unfreezing on either side: the side that changed gives its flags
    (the template when both did). Keras applies them as on one device - at the next
    compile, or at once where that Keras does."""
    template, replica = mirror.layers
    if len(template) != len(replica):
        return
    now = (_trainable(template), _trainable(replica))
    if now[0] != mirror.flags[0]:
        source, target = template, replica
    elif now[1] != mirror.flags[1]:
        source, target = replica, template
    else:
        return
    for giver, taker in zip(source, target):  # outer layers first: setting one sets its inner
        if bool(taker.trainable) != bool(giver.trainable):
            taker.trainable = giver.trainable
    mirror.flags = (_trainable(template), _trainable(replica))


# --- plain Python attributes a layer reads in call() ----------------------------------------


def _carry_attributes(mirror: Mirror) -> None:
    """A plain attribute (a temperature, a flag a callback flips) or a portable function
    (an activation) set on either side since the two last agreed goes to the other side
    (the template's when both changed it): at every call and at every epoch end, as the
    variables. A traced step reads such an attribute when it is traced, as on one device.
    A function or object set on either side that the other cannot take (it reaches a
    Keras object with state: `layer_state.portable`) is refused before anything is
    carried."""
    if len(mirror.attributes) != len(mirror.pairs):
        mirror.attributes = [_snapshot(t, r) for t, r in mirror.pairs]
        return
    changes = []
    for index, (template, replica) in enumerate(mirror.pairs):
        seen_t, seen_r = mirror.attributes[index]
        ours = _changed(layer_state.attributes(template), seen_t)
        theirs = [k for k in _changed(layer_state.attributes(replica), seen_r) if k not in ours]
        if ours or theirs:
            changes.append((index, template, replica, ours, theirs))
    for _, template, replica, ours, theirs in changes:
        # Either way round: the side that did not set it would read the other's state.
        for layer, other, keys, side, reads in (
                (template, replica, ours, "of the model given to parallelize()",
                 "the copy this route trains would read the model's own state through "
                 "it, not the copy's"),
                (replica, template, theirs, "of the parallel model parallelize() returned",
                 "the model given to parallelize() would read the copy's state through "
                 "it, not its own")):
            refused = layer_state.unportable_changes(layer, other, keys)
            if refused:
                raise _unportable(layer, side, refused, reads)
    for index, template, replica, ours, theirs in changes:
        layer_state.carry_attributes(template, replica, ours)
        layer_state.carry_attributes(replica, template, theirs)
        mirror.attributes[index] = _snapshot(template, replica)


def _unportable(layer: Any, side: str, refused: List[str], reads: str) -> ValueError:
    return bad_value(
        "model", f"layer {layer.name!r} ({type(layer).__name__}) {side}, its attribute "
        f"{', '.join(refused)} set after parallelize(): {reads}",
        "functions and objects set after parallelize() that reach no Keras object with "
        "state - a layer, a model, a variable, an optimizer or a metric - (they are "
        "carried to the other side), or that the other side holds alike",
        "pass what the function reads as its arguments, or capture it as data (a method "
        "of the layer's class is the copy's own), or build and compile the model inside "
        "`with kerasmgpu.scope():` (no copy is made then)", raw=True)


def _changed(now: Dict[str, Any], seen: Dict[str, Any]) -> List[str]:
    return [k for k, v in now.items() if k not in seen or not layer_state.same(v, seen[k])]


def _snapshot(template: Any, replica: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    return (layer_state.snapshot(template), layer_state.snapshot(replica))


# --- adapted preprocessing layers ----------------------------------------------------------


def _carry_adapted(mirror: Mirror) -> None:
    """A layer adapted again on the template since the copy took its state (new
    statistics, a new vocabulary) gives it to the copy again, as at parallelize():
    copying its variables alone leaves what Keras derives from them (Normalization's
    mean and variance tensors) or keeps beside them (a lookup's table) as it was, and a
    step traced after that - a recompile, a new fit on tf_keras - read the old state."""
    if mirror.adapted is None:  # new layers: each pair's state is carried once
        mirror.adapted = [(t, r, None) for t, r, _ in _adapted_pairs(mirror)]
    for index, (template, replica, seen) in enumerate(mirror.adapted):
        now = layer_state.adapted_state(template)
        if seen is not None and layer_state.same_state(now, seen):
            continue
        with mirror.engine.scope():
            layer_state.carry_adapted_again(template, replica)
        mirror.adapted[index] = (template, replica, now)


def _adapted_pairs(mirror: Mirror) -> List[Tuple[Any, Any, Any]]:
    return [(t, r, layer_state.adapted_state(t)) for t, r in mirror.pairs
            if layer_state.adapts(t)]


# --- after a call that trains: the replica's state into the template ---------------------


def after_training(mirror: Mirror, *, unless_unchanged: bool = False) -> None:
    """The replica's whole training state into the template (epoch ends, after calls).

    `unless_unchanged` (fit()'s end, right after its last epoch end copied everything):
    nothing when the replica did not change since it last gave its state - copying it
    again copied equal values, and on a small model that second copy was most of
    kerasmgpu's fixed cost per fit. A change a callback made to the template since
    (on_train_end) is then kept and reaches the replica at the next call, as on one
    device. Known only where tokens are free (`Adapter.identity_tokens`).
    """
    # Every replica's copy of the BatchNorm statistics becomes their mean, also when
    # the parallel model is the template.
    mirror.engine.equalize(mirror.replica)
    if mirror.idle:
        return
    if mirror.shared:
        for part in mirror.parts():
            part.seen = part.reader()
        return
    _refresh(mirror)  # the call may have built the replica or its optimizer
    _carry_attributes(mirror)
    parts = mirror.parts()
    if unless_unchanged and parts and all(_replica_unchanged(mirror, p) for p in parts):
        return
    identity = mirror.adapter.identity_tokens
    for part in parts:
        _copy(mirror, part, to_replica=False)
        part.seen = part.reader()
        part.replica_seen = mirror.adapter.state_reader(part.replica)() if identity else None
        if mirror.job:
            part.direct_seen = _direct_tokens(mirror, part)


def _replica_unchanged(mirror: Mirror, part: Part) -> bool:
    """Whether the replica's side of `part` holds what it held when it last gave it."""
    seen = part.replica_seen
    return (seen is not None and len(seen) == len(part.replica)
            and mirror.adapter.state_reader(part.replica)() == seen)


# --- the variables of each side, and copying them ------------------------------------------


def _copy(mirror: Mirror, part: Part, *, to_replica: bool,
          indexes: Optional[List[int]] = None) -> None:
    adapter = mirror.adapter
    chosen = range(len(part.template)) if indexes is None else indexes
    source = part.template if to_replica else part.replica
    target = part.replica if to_replica else part.template
    values = adapter.read_values([source[i] for i in chosen])
    if to_replica:
        with mirror.engine.scope():
            adapter.write_values([target[i] for i in chosen], values)
        if mirror.job:
            # What kerasmgpu wrote is not a change made on the parallel model.
            part.direct_seen = _direct_tokens(mirror, part)
    else:
        adapter.write_values([target[i] for i in chosen], values)


def _refresh(mirror: Mirror) -> None:
    """Re-read both sides' variables (kept between calls: listing them walks the model)."""
    template, replica = mirror.template, mirror.replica
    ours, theirs = _variables(template), _variables(replica)
    if len(ours) != len(theirs) and theirs and hasattr(replica, "input_shape"):
        # A Sequential model given without an input shape: the replica was built by
        # the first batch; build the template the same way so it can hold the weights.
        template.build(replica.input_shape)
        ours = _variables(template)
    if len(ours) != len(theirs):
        raise RuntimeError(
            f"kerasmgpu: the model you built has {len(ours)} weights and its parallel "
            f"copy {len(theirs)}: they cannot be kept equal. Fix: build the model (call "
            "it on a batch, or give it an input shape) before parallelize()."
        )
    weights = _part(mirror.weights, ours, theirs, mirror.adapter)
    if weights is not mirror.weights or not mirror.layers[0]:  # new variables: new layers?
        mirror.layers = (mirror.adapter.layers_of(template), mirror.adapter.layers_of(replica))
        mirror.pairs = mirror.adapter.layer_pairs(template, replica)
        mirror.adapted = None
    mirror.weights = weights
    mirror.optimizer = _optimizer_part(mirror)


def _variables(model: Any) -> List[Any]:
    # tf_keras lists a lookup layer's vocabulary among the weights (a handler object that
    # set_weights understands, no variable): the copy took it at parallelize() with the
    # weights, and it is no training state.
    return [v for v in model.weights if hasattr(v, "assign")]


def _part(old: Optional[Part], template: List[Any], replica: List[Any],
          adapter: Adapter) -> Part:
    if old is not None and _same(tuple(old.template), tuple(template)):
        if not _same(tuple(old.replica), tuple(replica)):
            old.replica_seen = None
            old.direct_reader = None
        old.replica = replica
        return old  # the same variables: keep the reader (a traced function on TF)
    return Part(template, replica, adapter.state_reader(template))


def _optimizer_part(mirror: Mirror) -> Optional[Part]:
    adapter = mirror.adapter
    ours = getattr(mirror.template, "optimizer", None)
    theirs = getattr(mirror.replica, "optimizer", None)
    if not mirror.with_optimizer or ours is None or theirs is None:
        return None
    template = adapter.optimizer_state(ours)
    if mirror.shared:
        return _part(mirror.optimizer, template, template, adapter)
    replica = adapter.optimizer_state(theirs)
    if len(replica) < len(template):
        with mirror.engine.scope():  # the replica's slots, created where it trains
            adapter.build_optimizer(theirs, mirror.replica.trainable_variables)
        replica = adapter.optimizer_state(theirs)
    if len(replica) != len(template) or any(
            tuple(a.shape) != tuple(b.shape) for a, b in zip(template, replica)):
        _warn_optimizer_layout(mirror)
        return None
    return _part(mirror.optimizer, template, replica, adapter)


def _warn_optimizer_layout(mirror: Mirror) -> None:
    if mirror.warned:
        return
    mirror.warned = True
    warnings.warn(
        "kerasmgpu: the template's optimizer does not have the layout of the parallel "
        "model's, so the template receives the weights but not the optimizer state "
        "(saving the template then restarts the optimizer). Fix: save the parallel "
        "model itself to keep the optimizer state.",
        stacklevel=4,
    )


def build_template_optimizer(mirror: Mirror) -> None:
    """Create the template optimizer's slots now, outside any engine scope.

    The template receives the optimizer state at every epoch end - from inside fit(),
    where the engine's scope is active and a variable created for the template would
    be placed (and refused) there.
    """
    template = mirror.template
    optimizer = getattr(template, "optimizer", None)
    if mirror.with_optimizer and optimizer is not None and template.trainable_variables:
        # A template that is itself a parallel model trained in place (JAX: a second
        # parallelize() on other devices) keeps its slots where it trains.
        scope = mirror.template_scope or contextlib.nullcontext
        with scope():
            mirror.adapter.build_optimizer(optimizer, template.trainable_variables)
        mirror.template_slots = True


def _record(mirror: Mirror) -> None:
    """Both sides agree now: remember the template's tokens, compile and flags."""
    for part in mirror.parts():
        part.seen = part.reader()
    mirror.compiled = mirror.adapter.compile_token(mirror.template)
    mirror.flags = (_trainable(mirror.layers[0]), _trainable(mirror.layers[1]))
