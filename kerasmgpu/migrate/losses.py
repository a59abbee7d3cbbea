"""Custom loss functions: the labels' dtype.

`--to tf_keras`: Keras 2.3 fed `y_true` through a placeholder of the model output's dtype
(float32), whatever the labels' dtype was, so a loss such as

    def contrastive_loss(y_true, y_pred):
        return K.mean(y_true * K.square(y_pred) + (1 - y_true) * ...)

trained on integer labels. tf_keras passes the labels as they come (int64 from
`np.array(labels)`) and its loss wrapper does not cast for a function of the user's: the
`y_true * ...` raises "Input 'y' of 'Mul' Op has type float32 that does not match type
int64" (measured: Keras 2.3.1's mnist_siamese example on tf_keras 2.21). Keras 2.3's cast
is written as the function's first statement,

    y_true = tf.cast(y_true, y_pred.dtype)

for every function of the file passed to `compile(loss=...)` (alone, in a list or a dict)
that does arithmetic on its first parameter, unless it assigns that parameter itself. An
INFO says so. For float labels the cast changes nothing.

`--to keras3`: nothing - Keras 3 converts `y_true` to the loss's dtype before calling the
function. `--to keras23`: nothing.
"""

from __future__ import annotations

import functools
from typing import Dict, List, Set

import libcst as cst
import libcst.matchers as m

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Rule
from kerasmgpu.migrate.report import Target

MSG_CAST = (
    "{name}({true}, {pred}): {true} = tf.cast({true}, {pred}.dtype) written first - Keras "
    "2.3 fed the labels as the output's dtype, tf_keras passes integer labels as they are "
    "and the arithmetic on them would fail"
)
ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.Power)


class LossesRule(Rule):
    NAME = "losses"
    TARGETS = frozenset({Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.functions: Dict[str, List[cst.FunctionDef]] = {}
        self.losses: Set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.setdefault(node.name.value, []).append(node)

    def visit_Call(self, node: cst.Call) -> None:
        if not m.matches(node.func, m.Attribute(attr=m.Name("compile"))):
            return
        loss = nodes.kwarg_value(node, "loss")
        positional = [arg for arg in node.args if arg.keyword is None]
        if loss is None and len(positional) > 1:
            loss = positional[1].value  # compile(optimizer, loss, ...)
        if isinstance(loss, (cst.List, cst.Tuple)):
            self.losses.update(e.value.value for e in loss.elements
                               if isinstance(e.value, cst.Name))
        elif isinstance(loss, cst.Dict):
            self.losses.update(e.value.value for e in loss.elements
                               if isinstance(e, cst.DictElement)
                               and isinstance(e.value, cst.Name))
        elif isinstance(loss, cst.Name):
            self.losses.add(loss.value)

    def finish(self) -> None:
        for name in sorted(self.losses):
            for function in self.functions.get(name, []):
                params = function.params.params
                if len(params) < 2 or not isinstance(function.body, cst.IndentedBlock):
                    continue
                true, pred = params[0].name.value, params[1].name.value
                uses = _LabelUse(true)
                function.body.visit(uses)
                if not uses.arithmetic or uses.assigned:
                    continue
                tf = self.ctx.module_name("tensorflow", function, alias="tf")
                line = cst.parse_statement(f"{true} = {tf}.cast({true}, {pred}.dtype)\n")
                self.ctx.edit(function, functools.partial(_prepend, line=line))
                self.info(function, MSG_CAST.format(name=name, true=true, pred=pred))


class _LabelUse(cst.CSTVisitor):
    """Whether a function body does arithmetic on `name`, or assigns it."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.arithmetic = False
        self.assigned = False

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if isinstance(node.operator, ARITHMETIC) and any(
                m.matches(side, m.Name(self.name)) for side in (node.left, node.right)):
            self.arithmetic = True

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        if m.matches(node.target, m.Name(self.name)):
            self.assigned = True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # a nested function's own parameters are its own


def _prepend(updated: cst.CSTNode, line: cst.BaseStatement) -> cst.CSTNode:
    """`line` as the first statement of the function, after its docstring."""
    assert isinstance(updated, cst.FunctionDef)
    body = updated.body
    assert isinstance(body, cst.IndentedBlock)  # finish() left out `def f(a, b): return a`
    statements = list(body.body)
    at = 1 if statements and nodes.is_docstring(statements[0]) else 0
    statements.insert(at, line)
    return updated.with_changes(body=body.with_changes(body=statements))


RULE = LossesRule
