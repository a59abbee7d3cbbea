"""Keras 2.3 internals that projects imported, rewritten where their meaning is plain.

`--to keras3` / `--to tf_keras` (neither has these names):

* `from keras.applications.imagenet_utils import _obtain_input_shape` (also through
  `keras_applications`): the private helper most Keras 2 model zoos (DenseNet, ResNeXt,
  MobileNet copies) call to check and default their input shape. The import becomes a
  local definition with Keras 2.3.1's rules (keras-applications 1.0.8: the default shape
  for the data format, the checks on channels and minimum size, a static shape when the
  top is flattened); it needs nothing from Keras.
* `class X(_Merge)` (`from keras.layers.merge import _Merge`, WGAN-GP's
  `RandomWeightedAverage`) defining `_merge_function(self, inputs)`: Keras 2.3's merge
  base called `_merge_function(inputs)` from `call` on a list of inputs of one rank. It
  becomes `class X(keras.layers.Layer)` with that method renamed `call`, and the base's
  `compute_output_shape` (the inputs' shapes broadcast) written out where the class has
  none: Keras 3 would trace `call` on symbolic inputs instead, where WGAN-GP's fixed-size
  `K.random_uniform((32, 1, 1, 1))` meets the unknown batch and fails. A WARNING: the
  base also expanded inputs of lower rank and combined their masks; a layer that relied
  on that needs it written out. A subclass without `_merge_function` stays, with an ERROR.
* `convert_all_kernels_in_model` (Theano kernels for TensorFlow) where every call is under
  an `if` that tests for Theano: that branch is dead on modern Keras; the import goes.
* `from keras.legacy import interfaces` and its `@interfaces.legacy_*` decorators: Keras
  2.3's converters of Keras 1 arguments (in custom layers and optimizers); removed.

`--to keras23` changes nothing here.
"""

from __future__ import annotations

import functools
from typing import List, Set

import libcst as cst
import libcst.matchers as m

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Replacement, Rule, canonical_keras_name
from kerasmgpu.migrate.report import Target

INPUT_SHAPE_MODULES = frozenset({"keras.applications.imagenet_utils",
                                 "keras_applications.imagenet_utils"})
# Keras 2.3.1's `_obtain_input_shape` (keras-applications 1.0.8), written out.
OBTAIN_INPUT_SHAPE = '''
def _obtain_input_shape(input_shape, default_size, min_size, data_format, require_flatten,
                        weights=None):
    # Keras 2.3's keras.applications.imagenet_utils._obtain_input_shape (gone from modern
    # Keras), with its rules; written here by kerasmgpu migrate.
    first = data_format == "channels_first"
    channels = (input_shape[0] if first else input_shape[-1]) if (
        weights != "imagenet" and input_shape and len(input_shape) == 3) else 3
    if channels not in (1, 3):
        import warnings
        warnings.warn("This model usually expects 1 or 3 input channels. However, it was "
                      "passed an input_shape with " + str(channels) + " input channels.")
    default_shape = (channels, default_size, default_size) if first else (
        default_size, default_size, channels)
    if weights == "imagenet" and require_flatten:
        if input_shape is not None and input_shape != default_shape:
            raise ValueError("When setting `include_top=True` and loading `imagenet` "
                             "weights, `input_shape` should be " + str(default_shape) + ".")
        return default_shape
    if input_shape:
        if len(input_shape) != 3:
            raise ValueError("`input_shape` must be a tuple of three integers.")
        if (input_shape[0] if first else input_shape[-1]) != 3 and weights == "imagenet":
            raise ValueError("The input must have 3 channels; got `input_shape="
                             + str(input_shape) + "`")
        sizes = input_shape[1:] if first else input_shape[:2]
        if any(size is not None and size < min_size for size in sizes):
            raise ValueError("Input size must be at least " + str(min_size) + "x"
                             + str(min_size) + "; got `input_shape=" + str(input_shape) + "`")
    elif require_flatten:
        input_shape = default_shape
    else:
        input_shape = (3, None, None) if first else (None, None, 3)
    if require_flatten and None in input_shape:
        raise ValueError("If `include_top` is True, you should specify a static "
                         "`input_shape`. Got `input_shape=" + str(input_shape) + "`")
    return input_shape
'''
MSG_INPUT_SHAPE = (
    "{module}._obtain_input_shape: a private helper modern Keras does not have -> a local "
    "definition with Keras 2.3.1's rules (same defaults, checks and errors)"
)
MSG_MERGE = (
    "class {name}(_Merge) -> {name}({keras}.layers.Layer), _merge_function -> call: Keras "
    "2.3's private merge base is gone; it called _merge_function on the list of inputs, as "
    "call is now. It also expanded inputs of lower rank and combined their masks: write "
    "that out in call if this layer's inputs need it"
)
MSG_MERGE_KEPT = (
    "class {name}(_Merge) defines no _merge_function: Keras 2.3's private merge base is "
    "gone; subclass keras.layers.Layer and combine the list of inputs in call()"
)
MSG_THEANO = (
    "{name}: left under its Theano test and its import removed - modern Keras has no "
    "Theano backend, so that branch never runs (the function flipped Theano kernels for "
    "TensorFlow)"
)
MSG_INTERFACES = (
    "keras.legacy.interfaces removed with its @interfaces.legacy_... decorators: Keras "
    "2.3's converters of Keras 1 arguments, which modern Keras does not have (the "
    "decorated functions take their Keras 2 arguments as before)"
)


class InternalsRule(Rule):
    NAME = "internals"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.merge_bases: Set[str] = set()  # local names of _Merge
        self.interfaces: Set[str] = set()  # local names of keras.legacy.interfaces

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        module = nodes.module_of(node)
        canonical = canonical_keras_name(module) or module
        for alias in node.names:
            name = nodes.dotted(alias.name) or ""
            local = nodes.dotted(alias.asname.name) if alias.asname else name
            if canonical in INPUT_SHAPE_MODULES and name == "_obtain_input_shape":
                self.input_shape(node, module, local or name)
            elif canonical == "keras.layers.merge" and name == "_Merge":
                self.merge_bases.add(local or name)
                classes = _classes_on(self.ctx.module, local or name)
                if classes and all(_rewritable_merge(c) for c in classes):
                    self.ctx.claimed.add(local or name)  # every use goes: so does the import
            elif name == "convert_all_kernels_in_model" and canonical.startswith("keras.utils"):
                self.theano_only(node, local or name)
            elif canonical == "keras.legacy" and name == "interfaces":
                self.interfaces.add(local or name)
                self.ctx.claimed.add(local or name)
                self.info(alias, MSG_INTERFACES)

    def input_shape(self, node: cst.ImportFrom, module: str, local: str) -> None:
        line = self.ctx.parent(node)
        if not isinstance(line, cst.SimpleStatementLine) or local != "_obtain_input_shape":
            return  # `as` another name, or `; `-joined: the training family's ERROR stays
        self.ctx.claimed.add(local)
        if canonical_keras_name(module) is None:  # keras_applications: not Keras's module
            self.ctx.edit(node, functools.partial(_without_name, name=local))
        if self.ctx.parent(line) is self.ctx.module:
            # After the module's imports, before the first function that calls it.
            scope = self.ctx.scopes.get(node)
            uses = [ref.node for a in (scope.assignments[local] if scope else ())
                    for ref in a.references]
            first = min(uses, key=self.ctx.top_level_index, default=node)
            self.ctx.need_definition(OBTAIN_INPUT_SHAPE.strip() + "\n", first)
        else:  # inside a function or a try: right after the import, in its block
            self.ctx.edit(line, _then_definition)
        self.info(node, MSG_INPUT_SHAPE.format(module=module))

    def theano_only(self, node: cst.ImportFrom, local: str) -> None:
        """Every use under `if ...theano...:` (DenseNet's `if K.backend() == 'theano'`):
        dead on modern Keras, which has no Theano backend; the import goes."""
        scope = self.ctx.scopes.get(node)
        if scope is None:
            return
        uses = [ref.node for assignment in scope.assignments[local]
                for ref in assignment.references]
        if uses and all(self.under_theano_test(use) for use in uses):
            self.ctx.claimed.add(local)
            for use in uses:
                self.info(use, MSG_THEANO.format(name=local))

    def under_theano_test(self, node: cst.CSTNode) -> bool:
        current = self.ctx.parent(node)
        while current is not None:
            if isinstance(current, cst.If) and "theano" in self.ctx.code(current.test).lower():
                return True
            current = self.ctx.parent(current)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        bases = [b for b in node.bases if isinstance(b.value, cst.Name)
                 and b.value.value in self.merge_bases]
        if not bases:
            return
        if not _rewritable_merge(node):
            self.error(node, MSG_MERGE_KEPT.format(name=node.name.value))
            return
        merge = [f for f in node.body.body if isinstance(f, cst.FunctionDef)
                 and f.name.value == "_merge_function"]
        keras = self.ctx.keras_module(node)
        self.ctx.replace(bases[0].value, nodes.attr_chain(f"{keras}.layers.Layer"))
        shaped = any(isinstance(f, cst.FunctionDef) and f.name.value == "compute_output_shape"
                     for f in node.body.body)
        self.ctx.edit(merge[0], _renamed_call if shaped else _renamed_call_with_shape)
        self.warning(node, MSG_MERGE.format(name=node.name.value, keras=keras))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        gone = [d for d in node.decorators if _decorator_root(d) in self.interfaces]
        if gone:
            self.ctx.edit(node, functools.partial(_without_decorators, roots=self.interfaces))



RULE = InternalsRule


def _classes_on(module: cst.Module, base: str) -> List[cst.ClassDef]:
    """Every class of the module (at any depth) with `base` among its bases."""
    found: List[cst.ClassDef] = []

    class Finder(cst.CSTVisitor):
        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            if any(m.matches(b, m.Arg(value=m.Name(base))) for b in node.bases):
                found.append(node)

    module.visit(Finder())
    return found


def _rewritable_merge(node: cst.ClassDef) -> bool:
    """A `_Merge` subclass that defines `_merge_function` and not `call`."""
    names = {stmt.name.value for stmt in node.body.body if isinstance(stmt, cst.FunctionDef)}
    return "_merge_function" in names and "call" not in names


def _decorator_root(decorator: cst.Decorator) -> str:
    expr = decorator.decorator
    if isinstance(expr, cst.Call):
        expr = expr.func
    return (nodes.dotted(expr) or "").split(".")[0]


def _without_decorators(updated: cst.CSTNode, roots: Set[str]) -> cst.CSTNode:
    assert isinstance(updated, cst.FunctionDef)
    kept = [d for d in updated.decorators if _decorator_root(d) not in roots]
    if kept or not updated.decorators:
        return updated.with_changes(decorators=kept)
    # The first decorator's comments and blank lines stay above the function.
    lines = [*updated.decorators[0].leading_lines, *updated.leading_lines]
    return updated.with_changes(decorators=[], leading_lines=lines)


def _renamed_call(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.FunctionDef)
    return updated.with_changes(name=cst.Name("call"))


# Keras 2.3.1's _Merge.compute_output_shape: the inputs' shapes broadcast from the right,
# the batch size the one known. Keras 3 otherwise traces call on symbolic inputs, where a
# fixed-size draw (WGAN-GP's K.random_uniform((32, 1, 1, 1))) meets the unknown batch.
MERGE_SHAPE = """
def compute_output_shape(self, input_shape):
    # Keras 2.3's merge base: the inputs' shapes broadcast, the batch the one size known
    shapes = [tuple(shape[1:]) for shape in input_shape]
    rank = max(len(shape) for shape in shapes)
    output = []
    for sizes in zip(*[(1,) * (rank - len(shape)) + shape for shape in shapes]):
        size = 1
        for dim in sizes:
            if dim is None or size is None:
                size = None
            elif size == 1:
                size = dim
            elif dim not in (1, size):
                raise ValueError("Operands could not be broadcast together with shapes "
                                 + " ".join(str(shape) for shape in input_shape))
        output.append(size)
    batch = {shape[0] for shape in input_shape} - {None}
    return (batch.pop() if len(batch) == 1 else None,) + tuple(output)
"""


def _renamed_call_with_shape(updated: cst.CSTNode) -> Replacement:
    shape = cst.parse_statement(MERGE_SHAPE.lstrip())
    return cst.FlattenSentinel([_renamed_call(updated), shape.with_changes(
        leading_lines=[cst.EmptyLine(indent=False)])])


def _without_name(updated: cst.CSTNode, name: str) -> Replacement:
    assert isinstance(updated, cst.ImportFrom) and not isinstance(updated.names, cst.ImportStar)
    kept = [a for a in updated.names if (nodes.dotted(a.asname.name) if a.asname else
                                        nodes.dotted(a.name)) != name]
    if not kept:
        return cst.RemovalSentinel.REMOVE
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(names=kept)


def _then_definition(updated: cst.CSTNode) -> Replacement:
    """The import line (if anything is left of it), then the definition."""
    assert isinstance(updated, cst.SimpleStatementLine)
    module = cst.parse_module(OBTAIN_INPUT_SHAPE)
    definition: List[cst.BaseStatement] = list(module.body)
    blank = [cst.EmptyLine(), cst.EmptyLine()]
    if not updated.body:  # the import held nothing else: the definition takes its place
        first = definition[0].with_changes(leading_lines=[*updated.leading_lines, *blank])
        return cst.FlattenSentinel([first, *definition[1:]])
    definition[0] = definition[0].with_changes(leading_lines=blank)
    return cst.FlattenSentinel([updated, *definition])
