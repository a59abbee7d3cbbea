"""Optimizers: `lr`, `decay`, the Keras 2.3 defaults that changed, `optimizer.lr`.

`--to keras3` / `--to tf_keras` (a Keras optimizer is any spelling of
`keras.optimizers.<Name>`, also the lower-case aliases):

* `lr=` -> `learning_rate=`. Keras 3 raises on `lr`; tf_keras accepts it and silently
  trains at the default 0.001 (it warns that `lr` is deprecated, then ignores it).
* `decay=d` -> `learning_rate=keras.optimizers.schedules.InverseTimeDecay(lr, decay_steps=1,
  decay_rate=d)`: Keras 2.3 scaled every step's rate by 1 / (1 + d * iterations), which is
  that schedule (checked step by step against Keras 2.3.1 in tests/test_migrate_optimizers.py).
  `decay=0` is dropped. Keras 3 ignores `decay` (with a warning), tf_keras raises.
  A schedule cannot be set by `ReduceLROnPlateau` / `LearningRateScheduler` or assigned
  through `optimizer.learning_rate`: when the file does either, a WARNING says so.
* Defaults: Keras 2.3's learning rates were Adadelta 1.0, Adagrad 0.01, Adamax and Nadam
  0.002; modern Keras uses 0.001 for all four. The Keras 2.3 value is written when the call
  does not pass one, also for `compile(optimizer="adadelta")` and the other three names.
  Keras 2.3's Adagrad started its accumulators at 0, modern Keras at 0.1:
  `initial_accumulator_value=0.0` is written.
* Positional arguments after the first become keywords (Keras 3's Adam takes `epsilon`
  fourth where Keras 2.3 took `amsgrad`). Nadam's `schedule_decay` at its default (0.004,
  the schedule modern Nadam hard-codes) is dropped; another value is an ERROR.
* `optimizer.lr` (read or assigned, e.g. `model.optimizer.lr`, `self.model.optimizer.lr`)
  -> `optimizer.learning_rate`; `K.set_value/K.get_value` around it are the backend
  family's.

* RMSprop and Adagrad: Keras 2.3 divided by `sqrt(v) + epsilon`, modern Keras (Keras 3 and
  tf_keras) divides by `sqrt(v + epsilon)`. With the same epsilon (1e-7) the step of a
  weight whose squared-gradient average v is small shrinks: 10x at v = 1e-9, 3000x near 0
  (measured on Keras 2.3.1's lstm_text_generation example: loss 0.235 where Keras 2.3 ends at
  0.199 +- 0.007). Keras 2.3's epsilon squared, `epsilon=1e-7 ** 2` (or `<e> ** 2` for the
  file's own `epsilon=e`), is written: `sqrt(v + e**2)` equals `sqrt(v) + e` at v = 0, to 1%
  wherever sqrt(v) is below e / 100 or above 100 * e, and within a factor 1.41 between (at
  most at sqrt(v) = e). Also for `compile(optimizer="rmsprop" | "adagrad")`. The `** 2` form
  marks it as done: a second run leaves it.

Numerics that differ and cannot be written away: modern Nadam computes its momentum
schedule's correction differently (a WARNING: weights ~5% apart after 12 steps).

`--to keras23` changes nothing here.
"""

from __future__ import annotations

import functools
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Rule
from kerasmgpu.migrate.report import Target

# name -> (Keras 2.3 default learning rate, Keras 2.3 positional parameters)
OPTIMIZERS: Dict[str, Tuple[float, Tuple[str, ...]]] = {
    "SGD": (0.01, ("learning_rate", "momentum", "nesterov")),
    "RMSprop": (0.001, ("learning_rate", "rho")),
    "Adagrad": (0.01, ("learning_rate",)),
    "Adadelta": (1.0, ("learning_rate", "rho")),
    "Adam": (0.001, ("learning_rate", "beta_1", "beta_2", "amsgrad")),
    "Adamax": (0.002, ("learning_rate", "beta_1", "beta_2")),
    "Nadam": (0.002, ("learning_rate", "beta_1", "beta_2")),
}
MODERN_DEFAULT = 0.001  # every optimizer above but SGD (0.01, as in Keras 2.3)
ALIASES = {name.lower(): name for name in OPTIMIZERS}
EPSILON_INSIDE = frozenset({"RMSprop", "Adagrad"})
SCHEDULE_CALLBACKS = ("ReduceLROnPlateau", "LearningRateScheduler")

MSG_CALL = "{name}({old}) -> {name}({new}){note}"
MSG_EPSILON = (
    "; epsilon squared: modern Keras adds epsilon inside the square root, Keras 2.3 outside "
    "(sqrt(v) + eps); sqrt(v + eps**2) gives Keras 2.3's step to 1% unless sqrt(v) is within "
    "100x of eps, and within a factor 1.41 there (with eps itself inside, steps of weights "
    "with small gradients shrank up to 3000x)"
)
KERAS23_EPSILON = "1e-7"  # K.epsilon() of Keras 2.3, the default of both optimizers
MSG_DECAY_SET = (
    "decay became a learning-rate schedule, and this file also {what}: modern Keras cannot "
    "set the rate of an optimizer that has a schedule (Keras 2.3 applied decay on top of the "
    "rate it set). Drop the decay, or fold both into one schedule"
)
MSG_SCHEDULE_DECAY = (
    "Nadam(schedule_decay={value}): modern Nadam hard-codes Keras 2.3's default 0.004, so "
    "another value cannot be kept: write your own schedule or accept 0.004"
)
MSG_LR_ATTR = "{old} -> {new}"
MSG_NADAM = (
    "Nadam's update differs from Keras 2.3's (the momentum schedule's bias correction): the "
    "same problem gives weights ~5% apart after 12 steps, so training will not retrace a "
    "Keras 2.3 run; Adam is the same in both"
)
MSG_COMPILE = (
    "compile(optimizer={old!r}) -> {new}: Keras 2.3's default learning rate for {name} "
    "({rate}); the name alone gives {modern} in modern Keras"
)


class OptimizerRule(Rule):
    NAME = "optimizers"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.optimizer_names: Set[str] = set()  # names assigned an optimizer
        self.decays: List[cst.CSTNode] = []
        self.sets_rate: List[str] = _rate_setters(ctx.source)

    def optimizer_class(self, func: cst.BaseExpression) -> Optional[str]:
        for name in self.ctx.keras_names(func):
            module, _, attr = name.rpartition(".")
            if module == "keras.optimizers":
                found = ALIASES.get(attr, attr)
                if found in OPTIMIZERS:
                    return found
        return None

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call) and self.optimizer_class(node.value.func):
            for target in node.targets:
                self.optimizer_names.add(self.ctx.code(target.target))

    def visit_Call(self, node: cst.Call) -> None:
        name = self.optimizer_class(node.func)
        if name is not None:
            self.constructor(node, name)
        elif m.matches(node.func, m.Attribute(attr=m.Name("compile"))):
            self.compile_string(node)

    def constructor(self, node: cst.Call, name: str) -> None:
        if name == "Nadam":
            self.warning(node, MSG_NADAM)
        bound = _bind(node, name)
        if bound is None:
            self.error(node, f"{name}(...): arguments not matched to Keras 2.3's signature "
                       "(*args?): rename lr= and turn decay= into a schedule by hand")
            return
        schedule = bound.get("schedule_decay")
        if schedule is not None and nodes.number_value(schedule.value) != 0.004:
            self.error(node, MSG_SCHEDULE_DECAY.format(value=self.ctx.code(schedule.value)))
            return
        plan = _plan(bound, name)
        if not plan.changed(bound):
            return
        if plan.decay is not None:
            self.decays.append(node)
        note = MSG_EPSILON if plan.epsilon else ""
        old = ", ".join(self.ctx.code(arg).rstrip(", ") for arg in node.args)
        self.info(node, MSG_CALL.format(name=name, old=old, new=plan.describe(bound, self.ctx),
                                        note=note))
        # The package name only when the new code spells it (a schedule, the epsilon).
        needs = plan.decay is not None or _is_none(bound.get("epsilon"))
        keras = self.ctx.keras_module(node) if needs else "keras"
        self.ctx.edit(node, functools.partial(_rewrite, name=name, keras=keras))

    def compile_string(self, node: cst.Call) -> None:
        arg = next((a for a in node.args if nodes.keyword(a) == "optimizer"), None)
        if arg is None and node.args and node.args[0].keyword is None:
            arg = node.args[0]
        value = nodes.string_value(arg.value) if arg is not None else None
        name = ALIASES.get((value or "").lower())
        if arg is None or name is None:
            return
        rate = OPTIMIZERS[name][0]
        if (rate == MODERN_DEFAULT or name == "SGD") and name not in EPSILON_INSIDE:
            return
        keras = self.ctx.keras_module(node)
        args = [] if rate == MODERN_DEFAULT else [f"learning_rate={rate}"]
        if name == "Adagrad":
            args.append("initial_accumulator_value=0.0")
        if name in EPSILON_INSIDE:
            args.append(f"epsilon={KERAS23_EPSILON} ** 2")
        new = f"{keras}.optimizers.{name}({', '.join(args)})"
        self.ctx.replace(arg.value, nodes.expr(new))
        if name == "Nadam":
            self.warning(arg.value, MSG_NADAM)
        if rate == MODERN_DEFAULT:
            self.info(arg.value, f"compile(optimizer={value!r}) -> {new}" + MSG_EPSILON)
            return
        note = MSG_EPSILON if name in EPSILON_INSIDE else ""
        self.info(arg.value, MSG_COMPILE.format(old=value, new=new, name=name, rate=rate,
                                                modern=MODERN_DEFAULT) + note)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value != "lr":
            return
        owner = self.ctx.code(node.value)
        if owner.endswith("optimizer") or owner in self.optimizer_names:
            self.ctx.edit(node, _rename_lr)
            self.info(node.attr, MSG_LR_ATTR.format(old=f"{owner}.lr",
                                                    new=f"{owner}.learning_rate"))

    def finish(self) -> None:
        if self.sets_rate:
            for node in self.decays:
                self.warning(node, MSG_DECAY_SET.format(what=" and ".join(self.sets_rate)))


RULE = OptimizerRule


class _Plan:
    """What a constructor call becomes, decided from its Keras 2.3 arguments."""

    def __init__(self, rate: Optional[str], decay: Optional[str], default: Optional[float],
                 adagrad: bool, epsilon: bool) -> None:
        self.epsilon = epsilon  # Keras 2.3's epsilon to square (RMSprop, Adagrad)
        self.rate = rate
        self.decay = decay  # expression text of a non-zero decay
        self.default = default  # the Keras 2.3 default to write, when it changed
        self.adagrad = adagrad

    def changed(self, bound: Dict[str, cst.Arg]) -> bool:
        positional = any(arg.keyword is None for key, arg in bound.items()
                         if key != "learning_rate")
        return bool({"lr", "decay", "schedule_decay"} & set(bound)) or positional or (
            self.default is not None and self.rate is None) or self.adagrad or (
            _is_none(bound.get("epsilon"))) or self.epsilon

    def describe(self, bound: Dict[str, cst.Arg], ctx: Context) -> str:
        rate = self.rate if self.rate is not None else (
            str(self.default) if self.default is not None else None)
        parts = []
        if self.decay is not None:
            parts.append(f"learning_rate=InverseTimeDecay({rate or 'default'}, decay_steps=1, "
                         f"decay_rate={self.decay}): the rate Keras 2.3 used, "
                         "lr / (1 + decay * iterations)")
        elif rate is not None:
            suffix = " (Keras 2.3's default, modern Keras has 0.001)" if (
                self.rate is None) else ""
            parts.append(f"learning_rate={rate}{suffix}")
        # Positionals the rewrite names keep their value: the message says so, not only the
        # rate (`Adam(0.0002, 0.5)` keeps beta_1=0.5).
        described = {"lr", "learning_rate", "decay", "schedule_decay"} | (
            {"epsilon"} if self.epsilon else set())
        parts.extend(f"{key}={ctx.code(arg.value)}" for key, arg in bound.items()
                     if arg.keyword is None and key not in described)
        if self.adagrad:
            parts.append("initial_accumulator_value=0.0 (Keras 2.3 started at 0)")
        if self.epsilon:
            given = bound.get("epsilon")
            eps = KERAS23_EPSILON if given is None or _is_none(given) else ctx.code(given.value)
            parts.append(f"epsilon={eps} ** 2")
        return ", ".join(parts) or "keywords"


def _is_none(arg: Optional[cst.Arg]) -> bool:
    return arg is not None and m.matches(arg.value, m.Name("None"))


def _bind(call: cst.Call, name: str) -> Optional[Dict[str, cst.Arg]]:
    return nodes.bind(call, OPTIMIZERS[name][1])


def _plan(bound: Dict[str, cst.Arg], name: str) -> _Plan:
    rate_arg = bound.get("learning_rate") or bound.get("lr")
    decay_arg = bound.get("decay")
    decay = None
    if decay_arg is not None and nodes.number_value(decay_arg.value) != 0:
        decay = cst.Module(body=[]).code_for_node(decay_arg.value)
    rate = cst.Module(body=[]).code_for_node(rate_arg.value) if rate_arg is not None else None
    default = OPTIMIZERS[name][0]
    keep_default = default if default != MODERN_DEFAULT and name != "SGD" else None
    adagrad = name == "Adagrad" and "initial_accumulator_value" not in bound
    epsilon = name in EPSILON_INSIDE and not _is_squared(bound.get("epsilon"))
    return _Plan(rate, decay, keep_default, adagrad, epsilon)


def _is_squared(arg: Optional[cst.Arg]) -> bool:
    """`epsilon=1e-7 ** 2`: what this rule writes (so a second run leaves it)."""
    value = arg.value if arg is not None else None
    return (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Power)
            and isinstance(value.right, cst.Integer) and value.right.value == "2")


def _squared(value: cst.BaseExpression) -> cst.BaseExpression:
    """`value ** 2`, parenthesized unless an atom binds tighter than `**`."""
    if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Float, cst.Integer,
                              cst.Subscript)):
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BinaryOperation(left=value, operator=cst.Power(), right=cst.Integer("2"))


def _rewrite(updated: cst.CSTNode, name: str, keras: str) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    bound = _bind(updated, name)
    assert bound is not None
    plan = _plan(bound, name)
    args: List[cst.Arg] = []
    rate_expr: Optional[cst.BaseExpression] = None
    rate_arg = bound.get("learning_rate") or bound.get("lr")
    if rate_arg is not None:
        rate_expr = rate_arg.value
    elif plan.default is not None or plan.decay is not None:
        rate_expr = nodes.expr(repr(OPTIMIZERS[name][0]))
    if plan.decay is not None:
        assert rate_expr is not None
        decay_arg = bound["decay"]
        rate_expr = cst.Call(
            func=nodes.attr_chain(f"{keras}.optimizers.schedules.InverseTimeDecay"),
            args=[cst.Arg(rate_expr, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                  nodes.kwarg("decay_steps", cst.Integer("1")).with_changes(
                      comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                  nodes.kwarg("decay_rate", decay_arg.value)])
    for key, arg in bound.items():
        if key in ("lr", "learning_rate", "decay", "schedule_decay"):
            if key in ("lr", "learning_rate") and rate_expr is not None:
                args.append(nodes.kwarg("learning_rate", rate_expr).with_changes(
                    comma=arg.comma))
                rate_expr = None
            continue
        if key == "epsilon" and _is_none(arg):
            value = nodes.expr(f"{keras}.backend.epsilon()")
            args.append(nodes.as_keyword(arg, key).with_changes(
                value=_squared(value) if plan.epsilon else value))
            continue
        if key == "epsilon" and plan.epsilon:
            args.append(nodes.as_keyword(arg, key).with_changes(value=_squared(arg.value)))
            continue
        args.append(nodes.as_keyword(arg, key))
    if rate_expr is not None:
        args.insert(0, nodes.kwarg("learning_rate", rate_expr))
    if plan.adagrad:
        args.append(nodes.kwarg("initial_accumulator_value", cst.Float("0.0")))
    if plan.epsilon and "epsilon" not in bound:
        args.append(nodes.kwarg("epsilon", _squared(cst.Float(KERAS23_EPSILON))))
    return nodes.with_args(updated, args)


def _rename_lr(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.Attribute)
    return updated.with_changes(attr=cst.Name("learning_rate"))


def _rate_setters(source: str) -> List[str]:
    """What in the file sets the learning rate while training (callbacks, assignments)."""
    found = [f"uses {name}" for name in SCHEDULE_CALLBACKS if name in source]
    if ".lr =" in source or ".lr=" in source or "set_value(" in source and ".lr" in source:
        found.append("assigns the learning rate")
    return found
