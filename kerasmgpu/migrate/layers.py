"""Layers whose class or defaults changed after Keras 2.3.1.

`--to keras3` / `--to tf_keras` (facts read from the signatures of Keras 2.3.1, Keras 3.15
and tf_keras 2.21, and their activations evaluated):

* `GRU` defaulted to `reset_after=False` in Keras 2.3.1 (the original GRU; different math
  and bias shape), modern Keras to `True`: `reset_after=False` is written when the call
  does not set it. (`LSTM`'s and `GRU`'s `recurrent_activation` default became 'sigmoid'
  already in Keras 2.3.0: nothing to do.)
* `CuDNNLSTM` -> `LSTM`, `CuDNNGRU` -> `GRU(reset_after=True)`: the same math (the cuDNN
  kernels), which modern Keras picks by itself on a GPU. A weight file saved from a CuDNN
  layer holds its two bias vectors and does not load into the new layer (an INFO says so).
* Keras 3 only: layers take no `weights=` (Embedding does): `model.add(Conv2D(...,
  weights=w))` -> `model.add(Conv2D(...))` + `model.layers[-1].set_weights(w)` (a
  Sequential with an input shape builds each layer as it is added); elsewhere an ERROR.
* Keras 3 only: `hard_sigmoid` is relu6(x + 3) / 6 there, 0.2x + 0.5 clipped in Keras 2.3
  and tf_keras, and `ConvLSTM2D`'s default recurrent activation is 'sigmoid' (Keras 2.3 and
  tf_keras: their hard_sigmoid). No built-in Keras 3 activation is Keras 2.3's, so both
  are WARNINGs, not rewrites.

* Keras 3 only: `Dense(np.prod(shape))` -> `Dense(int(np.prod(shape)))` (any layer, any
  argument computed by `np.prod`/`np.sum`/`np.size`): Keras 3 refuses NumPy integers as
  sizes (Keras-GAN's generators build their last layer and embeddings so).
* `self.add_weight(...)` with positional arguments: Keras 2.3.1 took `(name, shape, dtype,
  initializer, regularizer, trainable, constraint)`, Keras 3 takes `shape` first, tf_keras
  `(name, shape, dtype, initializer, ...)`: positionals become those keywords. A first
  positional that is a tuple or list is Keras 2.2's `(shape, name)` form (its legacy
  interface took it; Keras 2.3.1 raised): it becomes `shape=` (and `name=`).

* Keras 3 only: a read-only `activity_regularizer` property on a layer class (Keras 2.0's
  recurrent layers returned their cell's; LSTM-FCN's `AttentionLSTM` copies them): Keras
  3's `Layer.__init__` assigns `self.activity_regularizer`, which fails on a property
  without setter ("property ... has no setter"); Keras 2.3's did not assign it. A setter
  that ignores the assignment is added, so the property stays what the layer applies, as
  in Keras 2.3. tf_keras never reads the property (it applies its private
  `_activity_regularizer`): a WARNING there, the penalty leaves the loss.

* Both: `self.input_spec = ...` in an RNN cell (a class with `call(self, inputs, states)`
  that sets `self.state_size`; LSTM-FCN's `AttentionLSTMCell` declares `ndim=3`): Keras
  2.3's RNN ran `cell.call`, so the cell's input_spec was never checked; Keras 3 and
  tf_keras call the cell as a layer and check it against each step's 2-D input ("expected
  ndim=3, found ndim=2"). It becomes `self.input_spec = None`, the old spec in a comment.
* Keras 3 only: `class X(RNN)` overriding `call(self, inputs, ...)` without its own
  `compute_output_shape` (LSTM-FCN's AttentionLSTM): Keras 3's RNN computes shapes with
  `compute_output_shape(sequences_shape, initial_state_shape)`, matched to call's argument
  names, and refuses `inputs`; the argument is renamed `sequences` in that method.
* Both: a layer's `activity_regularizer=` (and `ActivityRegularization`): Keras 3 and
  tf_keras divide the penalty by the batch size, Keras 2.3.1 added the whole batch's sum
  (same regularizer, another loss and gradient): a WARNING with the factor to scale.

`--to keras23` changes nothing here.
"""

from __future__ import annotations

import functools
from typing import List, Optional

import libcst as cst
import libcst.matchers as m

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Rule
from kerasmgpu.migrate.report import Target
from kerasmgpu.migrate.tables import CUDNN

MSG_GRU = (
    "GRU(...) -> GRU(..., reset_after=False): Keras 2.3.1's default (the original GRU); "
    "modern Keras defaults to reset_after=True, another layer with other weights"
)
MSG_CUDNN = (
    "{old} -> {new}: the same cuDNN math, chosen by modern Keras itself on a GPU; a weight "
    "file saved from {old} holds its two bias vectors and does not load into {new}"
)
MSG_HARD_SIGMOID = (
    "'hard_sigmoid' is relu6(x + 3) / 6 in Keras 3 but clip(0.2x + 0.5, 0, 1) in Keras 2.3: "
    "the layer computes something else (and weights trained on Keras 2.3 give other outputs)"
)
MSG_CONVLSTM = (
    "ConvLSTM2D's default recurrent_activation is 'sigmoid' in Keras 3, Keras 2.3's "
    "hard_sigmoid (clip(0.2x + 0.5)) before: the layer computes something else; Keras 3 has "
    "no built-in activation that is Keras 2.3's hard_sigmoid"
)
MSG_UNITS = (
    "{layer}(..., {old}, ...) -> int({old}): Keras 3 takes layer sizes as Python ints only "
    "and refuses NumPy's integers (Keras 2.3 took both)"
)
NUMPY_SIZES = frozenset({"numpy.prod", "numpy.product", "numpy.sum", "numpy.size"})
ADD_WEIGHT_PARAMS = ("name", "shape", "dtype", "initializer", "regularizer", "trainable",
                     "constraint")
MSG_ADD_WEIGHT = (
    "add_weight positionals -> {given}: what Keras 2.3.1 bound them to (a tuple first: "
    "Keras 2.2's shape-first form); Keras 3 takes shape first, tf_keras name first"
)
MSG_WEIGHTS_ADD = (
    "{layer}(..., weights=...) -> {owner}.add({layer}(...)) then "
    "{owner}.layers[-1].set_weights(...): Keras 3 layers take no weights= (but Embedding)"
)
MSG_WEIGHTS = (
    "{layer}(..., weights=...): Keras 3 layers take no weights= argument (Embedding does): "
    "build the layer, then call layer.set_weights(...) once it is built"
)


MSG_READ_ONLY = (
    "@property {name} -> a setter that ignores the value added: Keras 3's Layer.__init__ "
    "assigns self.{name} (it fails on a property without setter), Keras 2.3's did not; the "
    "property stays what the layer reads"
)
MSG_READ_ONLY_TF = (
    "@property activity_regularizer: tf_keras applies self._activity_regularizer (what the "
    "constructor's activity_regularizer= set), never this property, so its penalty leaves "
    "the loss (Keras 2.3 added it): set self._activity_regularizer to the property's value "
    "once the layer has it"
)
# What Keras 3.15's Layer.__init__ assigns that Keras 2.3.1's did not and a Keras 2 layer
# defined as a property (its cell's regularizer).
ASSIGNED_BY_INIT = frozenset({"activity_regularizer"})
SETTER = (
    "@{name}.setter\n"
    "def {name}(self, value):\n"
    "    pass  # Keras 3's Layer.__init__ assigns it; Keras 2.3 read the property only\n"
)


MSG_ACTIVITY = (
    "{what}: Keras 3 and tf_keras divide the activity penalty by the batch size, Keras 2.3 "
    "added the sum over the batch (the loss and its gradient change): to train as on Keras "
    "2.3, multiply the regularizer's factor by the batch size"
)


MSG_RNN_CALL = (
    "{name}.call(self, inputs, ...) -> call(self, sequences, ...): Keras 3's "
    "RNN.compute_output_shape(sequences_shape, initial_state_shape) must match call's "
    "argument names (Keras 2.3's took input_shape)"
)
MSG_CELL_SPEC = (
    "{cell}: self.input_spec = ... -> None: Keras 2.3's RNN ran the cell's call and never "
    "checked its input_spec; Keras 3 and tf_keras call the cell as a layer and check it on "
    "each step's input"
)


class LayersRule(Rule):
    NAME = "layers"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def layer_name(self, func: cst.BaseExpression) -> Optional[str]:
        for name in self.ctx.keras_names(func):
            module, _, attr = name.rpartition(".")
            if module.startswith("keras.layers"):
                return attr
        return None

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Attribute(attr=m.Name("add_weight"))):
            self.add_weight(node)
        name = self.layer_name(node.func)
        if name is None or nodes.has_star(node):
            return
        if self.ctx.target is Target.KERAS3:
            self.numpy_sizes(node, name)
        penalty = nodes.kwarg_value(node, "activity_regularizer")
        if name == "ActivityRegularization" or (
                penalty is not None and not m.matches(penalty, m.Name("None"))):
            what = name if name == "ActivityRegularization" else (
                f"{name}(activity_regularizer=...)")
            self.warning(node, MSG_ACTIVITY.format(what=what))
        if name == "GRU" and nodes.kwarg_value(node, "reset_after") is None:
            self.ctx.edit(node, functools.partial(_add_kwarg, key="reset_after", value="False"))
            self.info(node, MSG_GRU)
        elif name in CUDNN:
            self.cudnn(node, name)
        elif name == "ConvLSTM2D" and self.ctx.target is Target.KERAS3 and (
                nodes.kwarg_value(node, "recurrent_activation") is None):
            self.warning(node, MSG_CONVLSTM)
        if (self.ctx.target is Target.KERAS3 and name != "Embedding"
                and nodes.kwarg_value(node, "weights") is not None):
            self.weights_argument(node, name)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if not isinstance(node.body, cst.IndentedBlock):
            return
        if _is_rnn_cell(node):
            for spec in _self_assignments(node, "input_spec"):
                line = self.ctx.parent(spec)
                if not m.matches(spec.value, m.Name("None")) and isinstance(
                        line, cst.SimpleStatementLine) and len(line.body) == 1:
                    self.ctx.edit(line, functools.partial(
                        _spec_none, old=self.ctx.code(spec.value)))
                    self.info(spec, MSG_CELL_SPEC.format(cell=node.name.value))
        defs = [s for s in node.body.body if isinstance(s, cst.FunctionDef)]
        if self.ctx.target is Target.KERAS3:
            self.rnn_call_arguments(node, defs)
        for func in defs:
            name = func.name.value
            if name not in ASSIGNED_BY_INIT or not any(
                    m.matches(d.decorator, m.Name("property")) for d in func.decorators):
                continue
            if any(other.name.value == name and other is not func for other in defs):
                continue  # it has its setter (or another definition): leave it
            if self.ctx.target is Target.TF_KERAS:
                self.warning(func, MSG_READ_ONLY_TF)
                continue
            self.ctx.edit(func, functools.partial(_then_setter, name=name))
            self.info(func, MSG_READ_ONLY.format(name=name))

    def rnn_call_arguments(self, node: cst.ClassDef, defs: List[cst.FunctionDef]) -> None:
        """`class X(RNN)` with `call(self, inputs, ...)` and no compute_output_shape: Keras
        3's RNN.compute_output_shape(sequences_shape, initial_state_shape) must match call's
        argument names; `inputs` becomes `sequences` in the method."""
        if not any(name.rsplit(".", 1)[-1] == "RNN" and name.startswith("keras.layers")
                   for base in node.bases for name in self.ctx.keras_names(base.value)):
            return
        if any(f.name.value == "compute_output_shape" for f in defs):
            return
        for func in defs:
            params = func.params.params
            if func.name.value != "call" or len(params) < 2 or params[1].name.value != "inputs":
                continue
            scope = self.ctx.scopes.get(func.body.body[0]) if func.body.body else None
            if scope is None or scope.assignments["sequences"]:
                return
            self.ctx.edit(params[1].name, _sequences)
            for assignment in scope.assignments["inputs"]:
                for access in assignment.references:
                    if isinstance(access.node, cst.Name):
                        self.ctx.edit(access.node, _sequences)
            self.info(func, MSG_RNN_CALL.format(name=node.name.value))

    def numpy_sizes(self, node: cst.Call, name: str) -> None:
        """`Dense(np.prod(shape))`, `Embedding(n, np.prod(shape))`: Keras 3 takes sizes as
        Python ints only (Keras 2.3 and tf_keras took NumPy's too)."""
        for arg in node.args:
            value = arg.value
            if isinstance(value, cst.Call) and self.ctx.qualified(value.func) & NUMPY_SIZES:
                self.ctx.edit(arg, _as_int)
                self.info(arg, MSG_UNITS.format(layer=name, old=self.ctx.code(value)))

    def add_weight(self, node: cst.Call) -> None:
        positional = [a for a in node.args if a.keyword is None and not a.star]
        if not positional or len(positional) != sum(1 for a in node.args if a.keyword is None):
            return
        first = positional[0].value
        if isinstance(first, (cst.Tuple, cst.List)):
            names = ["shape", "name"] if len(positional) < 2 or isinstance(
                positional[1].value, (cst.SimpleString, cst.FormattedString)) else ["shape"]
        else:
            names = list(ADD_WEIGHT_PARAMS)
        if len(positional) > len(names):
            return  # Keras 2.3 raised as well
        self.ctx.edit(node, functools.partial(_named_positionals, names=names))
        given = ", ".join(f"{n}={self.ctx.code(a.value)}" for n, a in zip(names, positional))
        self.info(node, MSG_ADD_WEIGHT.format(given=given))

    def cudnn(self, node: cst.Call, name: str) -> None:
        """The class is renamed with its import (imports family); GRU needs its variant."""
        new = CUDNN[name]
        if new == "GRU":
            self.ctx.edit(node, functools.partial(_add_kwarg, key="reset_after", value="True"))
        self.info(node, MSG_CUDNN.format(old=name, new=new + (
            "(reset_after=True)" if new == "GRU" else "")))

    def weights_argument(self, node: cst.Call, name: str) -> None:
        """`model.add(Conv2D(..., weights=w))` -> add it, then set its weights."""
        add = self.ctx.parent(self.ctx.parent(node) or node)
        line = self.ctx.parent(self.ctx.parent(add) or node) if add is not None else None
        if (isinstance(add, cst.Call) and isinstance(add.func, cst.Attribute)
                and add.func.attr.value == "add" and len(add.args) == 1
                and add.args[0].value is node and isinstance(line, cst.SimpleStatementLine)
                and len(line.body) == 1):
            owner = self.ctx.code(add.func.value)
            self.ctx.edit(node, functools.partial(_without, key="weights"))
            weights = self.ctx.code(nodes.kwarg_value(node, "weights") or node)
            self.ctx.edit(line, functools.partial(_then, code=f"{owner}.layers[-1]"
                                                  f".set_weights({weights})"))
            self.info(node, MSG_WEIGHTS_ADD.format(layer=name, owner=owner))
        else:
            self.error(node, MSG_WEIGHTS.format(layer=name))

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if self.ctx.target is Target.KERAS3 and nodes.string_value(node) == "hard_sigmoid":
            parent = self.ctx.parent(node)
            if isinstance(parent, cst.Arg):
                self.warning(node, MSG_HARD_SIGMOID)


RULE = LayersRule


def _as_int(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.Arg)
    return updated.with_changes(value=cst.Call(func=cst.Name("int"),
                                               args=[cst.Arg(updated.value)]))


def _named_positionals(updated: cst.CSTNode, names: list) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    args = list(updated.args)
    for index, name in enumerate(names[: len(args)]):
        if args[index].keyword is None:
            args[index] = nodes.as_keyword(args[index], name)
    return updated.with_changes(args=args)


def _without(updated: cst.CSTNode, key: str) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    return nodes.drop_args(updated, [key])


def _then(updated: cst.CSTNode, code: str) -> cst.FlattenSentinel:
    assert isinstance(updated, cst.SimpleStatementLine)
    return cst.FlattenSentinel([updated, cst.parse_statement(code + "\n")])


def _sequences(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.Name)
    return updated.with_changes(value="sequences")


def _is_rnn_cell(node: cst.ClassDef) -> bool:
    """A Keras RNN cell: `call(self, inputs, states, ...)` and `self.state_size` set."""
    calls = [f for f in node.body.body if isinstance(f, cst.FunctionDef)
             and f.name.value == "call" and len(f.params.params) >= 3
             and f.params.params[2].name.value == "states"]
    return bool(calls) and bool(_self_assignments(node, "state_size"))


def _self_assignments(node: cst.ClassDef, name: str) -> List[cst.Assign]:
    """Every `self.<name> = ...` in the class's methods."""
    found: List[cst.Assign] = []

    class Finder(cst.CSTVisitor):
        def visit_Assign(self, assign: cst.Assign) -> None:
            if len(assign.targets) == 1 and m.matches(assign.targets[0].target, m.Attribute(
                    value=m.Name("self"), attr=m.Name(name))):
                found.append(assign)

    node.visit(Finder())
    return found


def _spec_none(updated: cst.CSTNode, old: str) -> cst.CSTNode:
    assert isinstance(updated, cst.SimpleStatementLine)
    assign = updated.body[0]
    assert isinstance(assign, cst.Assign)
    comment = updated.trailing_whitespace.comment
    note = f"# Keras 2.3: {old}, never checked on a cell"
    return updated.with_changes(
        body=[assign.with_changes(value=cst.Name("None"))],
        trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  "),
            comment=cst.Comment(note + (" " + comment.value if comment else ""))))


def _then_setter(updated: cst.CSTNode, name: str) -> cst.FlattenSentinel:
    assert isinstance(updated, cst.FunctionDef)
    setter = cst.parse_statement(SETTER.format(name=name))
    return cst.FlattenSentinel([updated, setter.with_changes(leading_lines=[cst.EmptyLine(indent=False)])])


def _add_kwarg(updated: cst.CSTNode, key: str, value: str) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    if nodes.kwarg_value(updated, key) is not None:
        return updated
    return nodes.with_args(updated, [*updated.args, nodes.kwarg(key, nodes.expr(value))])
