"""What each model trains: `trainable` read at compile, and optimizers shared by models.

`--to keras3` / `--to tf_keras`:

* `trainable` set between compiles (the GAN pattern: `d.compile(...)`, `d.trainable =
  False`, `combined.compile(...)`). Keras 2.3 fixed the weights a model trains when it was
  compiled, so `d.train_on_batch` still trained the discriminator. tf_keras does the same
  (its `fit`/`train_on_batch` restore the trainable state of `compile`): nothing to do.
  Keras 3 reads `trainable` when a model trains (every step on JAX and PyTorch, when the
  train step is first built on TensorFlow), so `d` would train nothing (D accuracy 12-21 %
  against 90-100 % on Keras 2.3.1, issue 29). Where the compiles and the `trainable`
  assignments are in one function (or at module level), each model's state at its compile
  is known; each training call (`train_on_batch`, `fit`, `fit_generator`) of a model whose
  state differs from the one in force at the call gets the state set right before it and
  set back right after (`d.trainable = True` / `d.train_on_batch(...)` / `d.trainable =
  False`): every model then trains what Keras 2.3 trained, on every backend (tested
  against Keras 2.3.1's weights). Where no such call is in the file, a WARNING names the
  fix; likewise a model frozen before another's compile, but compiled elsewhere.
* A frozen model with `BatchNormalization` (the file builds one): in another model's
  training Keras 2.3 normalized its batches with their own statistics; modern Keras (both
  targets) runs a layer with trainable=False in inference mode, with its moving statistics
  (measured: the generator of a small GAN ends at other weights). A WARNING: no setting
  restores Keras 2.3's behaviour.
* One optimizer instance passed to several models' `compile` (Keras-GAN's `optimizer =
  Adam(0.0002, 0.5)`). Keras 2.3 gave each model its own moments and shared only the step
  counter; Keras 3 and tf_keras's optimizer is built for the first model's variables and
  fails on the second's (KeyError on tf_keras, a 1:1 ValueError on JAX). On tf_keras,
  Adam, SGD and RMSprop become `keras.optimizers.legacy.X`, Keras 2.3's own algorithm:
  one instance serves several models with a shared counter, exactly as before. Otherwise
  each compile after the first gets a copy (`type(opt).from_config(opt.get_config())`):
  exact for optimizers whose step does not depend on the counter (SGD, RMSprop, Adagrad,
  Adadelta without decay; INFO); for Adam, Adamax, Nadam or a decay schedule each copy
  counts its own model's steps (WARNING: the bias correction and schedule advance
  differently).

`--to keras23` changes nothing here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Replacement, Rule
from kerasmgpu.migrate.report import Target

TRAINING_CALLS = frozenset({"train_on_batch", "fit", "fit_generator"})
# On tf_keras these legacy optimizers are Keras 2.3's algorithm (epsilon placement and all:
# RMSprop's epsilon is inside the square root in both of tf_keras's, which the optimizers
# family's `epsilon ** 2` accounts for); Adagrad's legacy one differs from the new one.
LEGACY_EXACT = frozenset({"Adam", "SGD", "RMSprop"})
# Optimizers whose step reads the iteration counter (bias correction).
COUNTS_STEPS = frozenset({"Adam", "Adamax", "Nadam"})
OPTIMIZER_NAMES = frozenset({"SGD", "RMSprop", "Adagrad", "Adadelta", "Adam", "Adamax",
                             "Nadam"})

MSG_TOGGLED = (
    "{x}.trainable = {value}: Keras 2.3 fixed what a model trains at its compile, Keras 3 "
    "reads trainable when it trains; each model now trains what Keras 2.3 trained, with "
    "the state of its compile set around its training calls: {placed}"
)
MSG_NO_CALLS = (
    "{x}.trainable = {value} after {name}.compile(...) on line {line}, which compiled with "
    "{x}.trainable = {then}: Keras 2.3 fixed what a model trains at its compile, Keras 3 "
    "reads trainable when it trains, so {name} would not train what it trained on Keras "
    "2.3. Fix: set {x}.trainable = {then} right before each {name}.train_on_batch/fit and "
    "back to {value} right after (no such call in this file)"
)
MSG_ELSEWHERE = (
    "{x}.trainable = False before {model}.compile(...), and {x} trains by itself in this "
    "file ({x}.{method}): if {x} was compiled while trainable (a GAN's discriminator), "
    "Keras 2.3 still trained it there; Keras 3 reads trainable when {x} trains, and it "
    "would train nothing. Fix: set {x}.trainable = True right before each {x}.train_on_"
    "batch/fit and back to False right after"
)
MSG_UNPLACED = (
    "{name}.{method}(...) needs {lines} right before it and {after} right after on Keras 3 "
    "(the state of {name}'s compile), and migrate cannot place them around this statement "
    "(a return, or a one-line block): assign the call's result to a name on a line of its "
    "own, or write them by hand"
)
MSG_BATCHNORM = (
    "{x}.trainable = False while another model trains it frozen, and this file builds "
    "BatchNormalization: in that model's training, Keras 2.3 normalized the frozen "
    "layers' batches with the batch's own statistics; {target} runs a frozen "
    "BatchNormalization in inference mode (its moving statistics), so the other model "
    "trains against other outputs (no setting restores Keras 2.3's behaviour)"
)
MSG_LEGACY = (
    "{name} shared by {count} compiles ({models}): tf_keras's optimizer is built for one "
    "model's variables (KeyError on the second's) -> keras.optimizers.legacy.{cls}, Keras "
    "2.3's algorithm, which serves several models with one step counter as Keras 2.3 did"
)
MSG_COPY_EXACT = (
    "{name} shared by {count} compiles ({models}): the modern optimizer is built for one "
    "model's variables and fails on the next -> a copy for {model} ({cls}'s step does not "
    "depend on the step count, so it trains as Keras 2.3's shared one did)"
)
MSG_COPY_COUNTS = (
    "{name} shared by {count} compiles ({models}): the modern optimizer is built for one "
    "model's variables and fails on the next -> a copy for {model}. Keras 2.3 counted the "
    "steps of every model that shared it, and {why} reads that count: each copy counts "
    "its own model's steps, so the rate differs early in training (to keep Keras 2.3's "
    "numbers exactly, train on tf_keras, where migrate writes the legacy optimizer)"
)


@dataclass
class _Scope:
    """One function body (or the module): its trainable assignments and compiles."""

    assigns: List[Tuple[Tuple[int, int], str, bool, cst.Assign]] = field(default_factory=list)
    compiles: List[Tuple[Tuple[int, int], str, cst.Call]] = field(default_factory=list)
    optimizers: Dict[str, List[Tuple[str, cst.Call]]] = field(default_factory=dict)
    uses: List[Tuple[str, str, cst.Call, cst.Arg]] = field(default_factory=list)

    def state(self, x: str, before: Tuple[int, int]) -> Optional[bool]:
        """The last literal `x.trainable = ...` before a position, None when none."""
        found = [value for at, name, value, _ in self.assigns if name == x and at < before]
        return found[-1] if found else None

    def final(self, x: str) -> Optional[bool]:
        return self.state(x, (1 << 30, 0))


class TrainableRule(Rule):
    NAME = "trainable"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.scopes: Dict[Optional[cst.CSTNode], _Scope] = {}
        # owner -> its training calls (owner as written: `self.discriminator`)
        self.calls: Dict[str, List[Tuple[str, cst.Call]]] = {}
        self.batchnorm = False

    def scope_of(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.ctx.enclosing(node, cst.FunctionDef)

    def scope(self, node: cst.CSTNode) -> _Scope:
        return self.scopes.setdefault(self.scope_of(node), _Scope())

    # -- reading ------------------------------------------------------------------
    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if isinstance(value, cst.Name) and value.value in ("True", "False"):
            for target in node.targets:
                attr = target.target
                if isinstance(attr, cst.Attribute) and attr.attr.value == "trainable":
                    owner = nodes.dotted(attr.value)
                    if owner is not None:
                        self.scope(node).assigns.append(
                            (self.ctx.position(node), owner, value.value == "True", node))
        elif isinstance(value, cst.Call) and len(node.targets) == 1:
            cls = self.optimizer_class(value.func)
            name = nodes.dotted(node.targets[0].target)
            if cls is not None and name is not None:
                self.scope(node).optimizers.setdefault(name, []).append((cls, value))

    def optimizer_class(self, func: cst.BaseExpression) -> Optional[str]:
        for name in self.ctx.keras_names(func):
            module, _, attr = name.rpartition(".")
            if module == "keras.optimizers" and attr in OPTIMIZER_NAMES:
                return attr
        return None

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if any(n.rsplit(".", 1)[-1] == "BatchNormalization" for n in self.ctx.keras_names(func)):
            self.batchnorm = True
        if not isinstance(func, cst.Attribute):
            return
        owner = nodes.dotted(func.value)
        if owner is None:
            return
        method = func.attr.value
        if method == "compile":
            scope = self.scope(node)
            scope.compiles.append((self.ctx.position(node), owner, node))
            arg = _optimizer_arg(node)
            name = nodes.dotted(arg.value) if arg is not None else None
            if arg is not None and name is not None:
                scope.uses.append((name, owner, node, arg))
        elif method in TRAINING_CALLS:
            self.calls.setdefault(owner, []).append((method, node))

    # -- deciding -----------------------------------------------------------------
    def finish(self) -> None:
        for scope in list(self.scopes.values()):
            self.shared_optimizers(scope)
            if scope.assigns and scope.compiles:
                self.trainable_states(scope)

    def trainable_states(self, scope: _Scope) -> None:
        last: Dict[str, Tuple[int, int]] = {}  # each model's last compile in the scope
        for at, owner, _ in scope.compiles:
            last[owner] = at
        frozen = {x for _, x, _, _ in scope.assigns}
        # model -> {x: trainable at its compile}, for the x whose state differs between models
        states = {m: {x: _default(scope.state(x, at)) for x in frozen} for m, at in last.items()}
        differing = sorted(x for x in frozen if len({s[x] for s in states.values()}) > 1)
        self.frozen_elsewhere(scope, frozen, last)
        if not differing:
            return
        self.batchnorm_warning(scope, differing)
        if self.ctx.target is not Target.KERAS3:
            return  # tf_keras restores the compile's trainable state in fit/train_on_batch
        wraps: List[_Wrap] = []
        for model in sorted(states):
            for method, call in self.calls.get(model, ()):
                wrap = self.wrap(scope, model, method, call, states[model], differing)
                if wrap is not None:
                    wraps.append(wrap)
        placed = [w for w in wraps if w.before]
        _merge_neighbours(placed)
        for wrap in placed:
            self.ctx.edit(wrap.line, functools.partial(_around, before=wrap.before,
                                                       after=wrap.after))
        for x in differing:
            first = next(a for a in scope.assigns if a[1] == x)
            around = sorted({(w.model, w.state[x]) for w in placed if x in w.names})
            if around:
                text = "; ".join(f"{x}.trainable = {value} around each training call of "
                                 f"{model} (compiled on line {last[model][0]})"
                                 for model, value in around)
                self.info(first[3], MSG_TOGGLED.format(x=x, value=first[2], placed=text))
            elif not any(self.calls.get(model) for model in states):
                self.no_calls(scope, x, states, last)

    def wrap(self, scope: _Scope, model: str, method: str, call: cst.Call,
             state: Dict[str, bool], differing: Sequence[str]) -> Optional[_Wrap]:
        """What to set around one training call so `model` trains as compiled; None if the
        statement cannot take it (a WARNING says what to set)."""
        inside = self.scope_of(call) is self.scope_of(scope.compiles[0][2])
        local = self.scopes.get(self.scope_of(call), _Scope())
        names: List[str] = []
        before: List[str] = []
        after: List[str] = []
        for x in differing:
            here = local.state(x, self.ctx.position(call))
            if here is None and not inside:
                here = scope.final(x)
            now = _default(here)
            if now != state[x]:
                names.append(x)
                before.append(f"{x}.trainable = {state[x]}")
                after.append(f"{x}.trainable = {now}")
        line = self.ctx.enclosing(call, cst.SimpleStatementLine)
        holder = self.ctx.parent(line) if line is not None else None
        if not before:
            return _Wrap(model, state, [], [], [], call, holder)
        if (line is None or not isinstance(holder, (cst.IndentedBlock, cst.Module))
                or any(isinstance(s, cst.Return) for s in line.body)):
            self.warning(call, MSG_UNPLACED.format(name=model, method=method,
                                                lines="; ".join(before),
                                                after="; ".join(after)))
            return None
        return _Wrap(model, state, names, before, after, line, holder)

    def no_calls(self, scope: _Scope, x: str, states: Dict[str, Dict[str, bool]],
                 last: Dict[str, Tuple[int, int]]) -> None:
        """No training call in this file to place the states at: the fix, per model."""
        for model, state in sorted(states.items()):
            assign = next((a for a in scope.assigns
                           if a[1] == x and a[0] > last[model] and a[2] != state[x]), None)
            if assign is not None:
                self.warning(assign[3], MSG_NO_CALLS.format(
                    x=x, value=assign[2], name=model, line=last[model][0], then=state[x]))

    def frozen_elsewhere(self, scope: _Scope, frozen: Set[str],
                         last: Dict[str, Tuple[int, int]]) -> None:
        """`x.trainable = False` then another model's compile, x compiled elsewhere."""
        if self.ctx.target is not Target.KERAS3:
            return
        for x in sorted(frozen - set(last)):
            calls = self.calls.get(x)
            freeze = next((a for a in scope.assigns if a[1] == x and not a[2]), None)
            if not calls or freeze is None:
                continue
            later = next((m for m, at in last.items() if at > freeze[0]), None)
            inside = [c for c in calls if self.scope_of(c[1]) is self.scope_of(freeze[3])]
            if later is not None and not inside:
                self.warning(freeze[3], MSG_ELSEWHERE.format(x=x, model=later,
                                                          method=calls[0][0]))

    def batchnorm_warning(self, scope: _Scope, differing: Sequence[str]) -> None:
        if not self.batchnorm:
            return
        target = "tf_keras" if self.ctx.target is Target.TF_KERAS else "Keras 3"
        for x in differing:
            freeze = next((a for a in scope.assigns if a[1] == x and not a[2]), None)
            if freeze is not None:
                self.warning(freeze[3], MSG_BATCHNORM.format(x=x, target=target))

    # -- one optimizer, several models ----------------------------------------------
    def shared_optimizers(self, scope: _Scope) -> None:
        for name, made in scope.optimizers.items():
            uses = [u for u in scope.uses if u[0] == name]
            owners = sorted({owner for _, owner, _, _ in uses})
            if len(made) != 1 or len(owners) < 2:
                continue
            cls, ctor = made[0]
            models = ", ".join(owners)
            if self.ctx.target is Target.TF_KERAS and cls in LEGACY_EXACT:
                keras = self.ctx.keras_module(ctor)
                self.ctx.edit(ctor, functools.partial(_legacy, path=f"{keras}.optimizers."
                                                      f"legacy.{cls}"))
                self.info(ctor, MSG_LEGACY.format(name=name, count=len(uses), models=models,
                                                  cls=cls))
                continue
            decays = any(nodes.keyword(a) == "decay" and nodes.number_value(a.value) != 0
                         for a in ctor.args)
            first = uses[0][1]
            for _, owner, _, arg in uses:
                if owner == first:
                    continue
                self.ctx.edit(arg, functools.partial(_copy, name=name))
                if cls in COUNTS_STEPS or decays:
                    why = f"{cls}'s bias correction" if cls in COUNTS_STEPS else "its decay"
                    self.warning(arg, MSG_COPY_COUNTS.format(name=name, count=len(uses),
                                                          models=models, model=owner, why=why))
                else:
                    self.info(arg, MSG_COPY_EXACT.format(name=name, count=len(uses),
                                                         models=models, model=owner, cls=cls))


RULE = TrainableRule


@dataclass
class _Wrap:
    """The assignments around one training call (none where the state already holds)."""

    model: str
    state: Dict[str, bool]
    names: List[str]
    before: List[str]
    after: List[str]
    line: cst.CSTNode  # the statement holding the call
    holder: Optional[cst.CSTNode]  # its block

    def __post_init__(self) -> None:
        self.sets = list(self.before)  # what it sets, whatever a merge drops


def _merge_neighbours(wraps: List[_Wrap]) -> None:
    """Drop a set-back that the next statement's wrap undoes at once (two
    `d.train_on_batch` lines in a row: one `True` before both, one `False` after)."""
    by_line = {id(w.line): w for w in wraps}
    for wrap in wraps:
        body = list(getattr(wrap.holder, "body", ()))
        index = next((i for i, stmt in enumerate(body) if stmt is wrap.line), None)
        if index is None or index + 1 >= len(body):
            continue
        following = by_line.get(id(body[index + 1]))
        if following is not None and following.sets == wrap.sets:
            wrap.after = []
            following.before = []


def _default(value: Optional[bool]) -> bool:
    return True if value is None else value


def _optimizer_arg(call: cst.Call) -> Optional[cst.Arg]:
    for arg in call.args:
        if nodes.keyword(arg) == "optimizer":
            return arg
    first = call.args[0] if call.args else None
    return first if first is not None and first.keyword is None and not first.star else None


def _around(updated: cst.CSTNode, before: List[str], after: List[str]) -> Replacement:
    if not isinstance(updated, cst.SimpleStatementLine):
        return updated
    added = [cst.parse_statement(line + "\n") for line in before]
    if added:  # the statement's comments stay above what now comes first
        added[0] = added[0].with_changes(leading_lines=updated.leading_lines)
        updated = updated.with_changes(leading_lines=())
    tail = [cst.parse_statement(line + "\n") for line in after]
    return cst.FlattenSentinel([*added, updated, *tail])


def _legacy(updated: cst.CSTNode, path: str) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    return updated.with_changes(func=nodes.attr_chain(path))


def _copy(updated: cst.CSTNode, name: str) -> cst.CSTNode:
    assert isinstance(updated, cst.Arg)
    return updated.with_changes(value=nodes.expr(f"type({name}).from_config({name}"
                                                 ".get_config())"))
