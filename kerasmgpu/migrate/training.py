"""What a model trains, and Keras 2.3 internals a project reached into.

`--to keras3` and `--to tf_keras`:

* `History.history['acc']` where the file compiles with `metrics=['accuracy']` (and never
  `'acc'`): Keras 2.3 and modern Keras both name the key as written in `metrics`, so the
  read is rewritten to `'accuracy'` (`'val_acc'` to `'val_accuracy'`); code written for
  Keras 2.2, which called it `acc`, failed on Keras 2.3.1 as well.
* `from collections import Iterable` (and the other ABCs): gone in Python 3.10, where
  Keras 2.3's own shim no longer helps: -> `collections.abc`.
* `x._keras_shape` -> `tuple(x.shape)`: Keras 2.3's private copy of the static shape, batch
  dimension None; modern Keras tensors carry it in `shape`.
* Keras 2.3 internals with no public successor (ERROR with the fix): `keras.layers.merge`
  (the module, and its `_Merge`), `keras.legacy.interfaces`, `imagenet_utils.
  _obtain_input_shape`, TF1's `tf.metrics.mean_iou`.

`--to keras3` only: an Adam-family optimizer in a file that builds an `Embedding` is a
WARNING. On the TensorFlow backend the Embedding gradient is a `tf.IndexedSlices` and Keras
3's optimizer applies it with scatter updates, so rows the batch does not touch keep their
moments; Keras 2.3 (and tf_keras) decayed every row's moments each step (issue 29: 3e-1
apart after 10 steps on a text model). `--to keras23` changes nothing here.
"""

from __future__ import annotations

import functools
import re
from typing import Dict, List, Set, Tuple

import libcst as cst
import libcst.matchers as m

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Rule, canonical_keras_name
from kerasmgpu.migrate.report import Target

ABCS = frozenset({
    "Awaitable", "Coroutine", "AsyncIterable", "AsyncIterator", "AsyncGenerator", "Hashable",
    "Iterable", "Iterator", "Generator", "Reversible", "Sized", "Container", "Callable",
    "Collection", "Set", "MutableSet", "Mapping", "MutableMapping", "MappingView", "KeysView",
    "ItemsView", "ValuesView", "Sequence", "MutableSequence", "ByteString",
})
MOMENT_OPTIMIZERS = frozenset({"Adam", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta"})
MSG_SPARSE = (
    "{name} with an Embedding in this file: on the TensorFlow backend Keras 3 applies the "
    "Embedding gradient as sparse row updates, so rows a batch does not touch keep their "
    "moments, where Keras 2.3 decayed every row's each step (the embeddings train "
    "differently). To keep Keras 2.3's update, train on the JAX or PyTorch backend (dense "
    "gradients), or use SGD without momentum, which both apply alike"
)
MSG_HISTORY = (
    "history[{old!r}] -> history[{new!r}]: the file compiles with metrics=['accuracy'], and "
    "Keras names the key as written there (Keras 2.2 called it 'acc')"
)
MSG_ABC = "from collections import {names} -> from collections.abc: gone from collections " \
    "in Python 3.10"
MSG_ABC_MIXED = (
    "from collections import {names}: the abstract base classes moved to collections.abc "
    "(gone from collections in Python 3.10): import them from there"
)
MSG_SHAPE = "{old} -> tuple({value}.shape): Keras 2.3's private static shape; modern Keras " \
    "tensors carry it in .shape"
GONE: Dict[Tuple[str, str], str] = {
    ("keras.layers.merge", "_Merge"): "Keras 2.3's private merge base is gone: subclass "
    "keras.layers.Layer and combine the list of inputs in call()",
    ("keras.layers", "merge"): "the keras.layers.merge module is gone: import the layers "
    "from keras.layers (Add, Concatenate, Multiply, ...) and call them as layers",
    ("keras.legacy", "interfaces"): "Keras 2.3's Keras 1 argument converters are gone: "
    "delete the import and the @interfaces.legacy_... decorators",
    ("keras.applications.imagenet_utils", "_obtain_input_shape"): "a private helper, gone: "
    "write the input shape out (e.g. input_shape or (224, 224, 3))",
}
MSG_PER_OUTPUT = (
    "metrics={old} -> {new}: Keras 2.3 computed each metric on every output; Keras 3 "
    "refuses a flat list for a model of several outputs and takes one list per output. "
    "The values are Keras 2.3's, but train_on_batch and evaluate return the per-output "
    "metrics ordered by their names (Keras 2.3: by output): read them by name "
    "(return_dict=True) where the code indexes them"
)
MSG_PYTHON_IF = (
    "{name}: a Python branch on a tensor ({test}): Keras 3 traces loss and metric "
    "functions and refuses it (Keras 2.3's graph compared tensors with == by identity, so "
    "such a test was False and the other branch ran; a comparison like > raised there "
    "too). Fix: compute both branches and pick with keras.ops.where(condition, a, b)"
)
MSG_PYTHON_IF_TF = (
    "{name}: a Python branch on a tensor ({test}): tf_keras's autograph makes it a real "
    "condition on the values, where Keras 2.3's graph compared tensors with == by identity "
    "(such a test was False, and the other branch always ran; > or < raised). To keep "
    "what Keras 2.3 computed, keep only the branch it ran"
)
# Keras 2.3's `standardize_sample_or_class_weights` + `standardize_weights`, for a list.
PER_OUTPUT_CLASS_WEIGHTS = '''
def _class_weights_as_sample_weights(ys, class_weights):
    # Keras 2.3 took class_weight as one dict per output, and ignored a list given for a
    # model of one output; modern Keras takes one dict, for one output. These are the
    # sample weights Keras 2.3 made of it (written here by kerasmgpu migrate).
    import numpy as np
    if not isinstance(ys, (list, tuple)) or len(ys) != len(class_weights):
        return None
    weights = []
    for y, table in zip(ys, class_weights):
        y = np.asarray(y)
        classes = y.argmax(axis=1) if y.ndim > 1 and y.shape[1] > 1 else y.reshape(len(y))
        weights.append(None if not table else np.asarray([table[c] for c in classes],
                                                         dtype="float32"))
    return weights
'''
MSG_CLASS_WEIGHTS = (
    "class_weight={weights} -> sample_weight=_class_weights_as_sample_weights({y}, ...): "
    "Keras 2.3 took one class_weight dict per output (and ignored a list for a model of "
    "one output); modern Keras takes one dict for one output and fails on a list. The "
    "definition added to this file makes the sample weights Keras 2.3 made"
)
MSG_CLASS_WEIGHTS_KEPT = (
    "class_weight as a list (one dict per output): modern Keras takes one dict for one "
    "output and fails on it. Fix: pass sample_weight=[w1, w2, ...], per output the weight "
    "of each sample's class (Keras 2.3 multiplied them with any sample_weight given)"
)
MSG_MEAN_IOU = (
    "tf.metrics.mean_iou is TF1's streaming metric (graph mode, local variables): use "
    "keras.metrics.MeanIoU(num_classes) as a metric or call it on (y_true, y_pred)"
)


class TrainingRule(Rule):
    NAME = "training"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.metrics: Set[str] = set()
        self.history: List[Tuple[cst.SimpleString, str]] = []
        self.embedding = False
        self.optimizers: List[Tuple[cst.CSTNode, str]] = []
        self.multi_output = False  # the file builds a Model with a list of >= 2 outputs
        self.flat_metrics: List[Tuple[cst.Call, cst.Arg]] = []
        self.traced: Set[str] = set()  # names passed as loss= / metrics= to compile
        self.functions: List[cst.FunctionDef] = []

    # -- metrics, optimizers ------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if m.matches(func, m.Attribute(attr=m.Name("compile"))):
            self.compile_args(node)
        if m.matches(func, m.Attribute(attr=m.Name("fit") | m.Name("train_on_batch"))):
            self.class_weights(node)
        for name in self.ctx.keras_names(func):
            if name == "keras.layers.Embedding":
                self.embedding = True
            if name in ("keras.models.Model", "keras.Model", "keras.engine.training.Model"):
                self.multi_output |= _several_outputs(node)
            short = name.rsplit(".", 1)[-1]
            if name.startswith("keras.optimizers.") and short in MOMENT_OPTIMIZERS:
                self.optimizers.append((node, short))
        if "tensorflow.metrics.mean_iou" in self.ctx.qualified(func):
            self.error(node, MSG_MEAN_IOU)

    def compile_args(self, node: cst.Call) -> None:
        metrics = nodes.kwarg_value(node, "metrics")
        if isinstance(metrics, (cst.List, cst.Tuple)):
            self.metrics.update(nodes.string_value(e.value) or "" for e in metrics.elements)
            arg = next(a for a in node.args if nodes.keyword(a) == "metrics")
            if metrics.elements and all(_plain_metric(e.value) for e in metrics.elements):
                self.flat_metrics.append((node, arg))
        for key in ("loss", "metrics"):
            value = nodes.kwarg_value(node, key)
            parts = value.elements if isinstance(value, (cst.List, cst.Tuple)) else (
                [cst.Element(value)] if value is not None else [])
            for part in parts:
                if isinstance(part.value, (cst.Name, cst.Attribute)):
                    self.traced.add((nodes.dotted(part.value) or "").split(".")[-1])
        optimizer = nodes.kwarg_value(node, "optimizer")
        value = (nodes.string_value(optimizer) or "").lower()
        match = next((n for n in MOMENT_OPTIMIZERS if n.lower() == value), None)
        if match is not None and optimizer is not None:
            self.optimizers.append((optimizer, match))

    def visit_Subscript(self, node: cst.Subscript) -> None:
        value = node.value
        if not m.matches(value, m.Attribute(attr=m.Name("history"))):
            return
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return
        key = node.slice[0].slice.value
        text = nodes.string_value(key)
        if isinstance(key, cst.SimpleString) and text in ("acc", "val_acc"):
            self.history.append((key, text))

    # -- imports and internals ----------------------------------------------------
    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = nodes.module_of(node)
        if isinstance(node.names, cst.ImportStar):
            return
        names = [nodes.dotted(alias.name) or "" for alias in node.names]
        if module == "collections" and ABCS & set(names):
            if set(names) <= ABCS:
                self.ctx.edit(node, _to_abc)
                self.info(node, MSG_ABC.format(names=", ".join(names)))
            else:
                self.warning(node, MSG_ABC_MIXED.format(names=", ".join(sorted(ABCS & set(names)))))
            return
        canonical = canonical_keras_name(module) if module else None
        if _keras1_merge(self.ctx, canonical, names):
            return  # Keras 1's merge() function: the keras1 family reports its calls
        locals_ = [nodes.dotted(a.asname.name) if a.asname else n
                   for a, n in zip(node.names, names)]
        gone = [(canonical or "", n) in GONE and local not in self.ctx.claimed
                for n, local in zip(names, locals_)]
        if all(gone):
            self.ctx.owned.add(id(node))
        for alias, name, reported in zip(node.names, names, gone):
            fix = GONE.get((canonical or "", name))
            if fix is not None and reported:
                self.error(alias, f"{canonical}.{name} does not exist in "
                           f"{_label(self.ctx.target)}: {fix}")

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "_keras_shape" and self.ctx.is_load(node):
            value = self.ctx.code(node.value)
            self.ctx.replace(node, nodes.expr(f"tuple({value}.shape)"))
            self.info(node, MSG_SHAPE.format(old=self.ctx.code(node), value=value))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def class_weights(self, node: cst.Call) -> None:
        """`class_weight=[cw1, cw2]`: Keras 2.3 took one dict per output (and ignored a
        list for a model of one output); modern Keras takes one dict, for one output."""
        arg = next((a for a in node.args if nodes.keyword(a) == "class_weight"), None)
        if arg is None or not isinstance(arg.value, (cst.List, cst.Tuple)):
            return
        bound = nodes.bind(node, ("x", "y"))
        if bound is None or "y" not in bound or any(
                nodes.keyword(a) == "sample_weight" for a in node.args):
            self.error(arg, MSG_CLASS_WEIGHTS_KEPT)
            return
        self.ctx.need_definition(PER_OUTPUT_CLASS_WEIGHTS, node)
        y = self.ctx.code(bound["y"].value)
        self.ctx.edit(arg, functools.partial(_class_weights_to_samples, y=y))
        self.info(arg, MSG_CLASS_WEIGHTS.format(y=y, weights=self.ctx.code(arg.value)))

    def finish(self) -> None:
        if self.ctx.target is Target.KERAS3 and self.multi_output:
            for call, arg in self.flat_metrics:
                self.per_output(call, arg)
        for function in self.functions:
            self.python_branches(function)
        if "accuracy" in self.metrics and "acc" not in self.metrics:
            for key, text in self.history:
                new = text.replace("acc", "accuracy")
                self.ctx.edit(key, functools.partial(_requote, new=new))
                self.info(key, MSG_HISTORY.format(old=text, new=new))
        if self.embedding and self.ctx.target is Target.KERAS3:
            for node, name in self.optimizers:
                self.warning(node, MSG_SPARSE.format(name=name))


    def per_output(self, call: cst.Call, arg: cst.Arg) -> None:
        """`metrics=['accuracy']`: Keras 2.3 computed each on every output; Keras 3 wants
        one list per output of a multi-output model (and refuses a flat list there)."""
        func = call.func
        owner = nodes.dotted(func.value) if isinstance(func, cst.Attribute) else None
        if owner is None:
            return
        old = self.ctx.code(arg.value)
        new = f"[{old}] * len({owner}.outputs)"
        self.ctx.edit(arg, functools.partial(_per_output, owner=owner))
        self.warning(arg, MSG_PER_OUTPUT.format(old=old, new=new))

    def python_branches(self, function: cst.FunctionDef) -> None:
        """A loss or metric function's Python `if` on a tensor: Keras 3 traces it."""
        names = [p.name.value for p in function.params.params]
        if names[:1] == ["self"]:
            names = names[1:]
        if function.name.value not in self.traced and names[:2] != ["y_true", "y_pred"]:
            return
        params = set(names[:2])  # the tensors Keras passes; later ones are the user's
        for test in _branch_tests(function):
            if not self.on_tensor(test, params):
                continue
            values = {"name": function.name.value, "test": self.ctx.code(test)}
            if self.ctx.target is Target.KERAS3:
                self.error(test, MSG_PYTHON_IF.format(**values))
            else:
                self.warning(test, MSG_PYTHON_IF_TF.format(**values))

    def on_tensor(self, test: cst.BaseExpression, params: Set[str]) -> bool:
        for node in _walk(test):
            if isinstance(node, cst.Name) and node.value in params:
                return True
            if isinstance(node, cst.Call) and any(
                    n.startswith(("keras.backend.", "keras.ops."))
                    for n in self.ctx.keras_names(node.func)):
                return True
            if isinstance(node, cst.Call) and any(
                    q.startswith("tensorflow.") for q in self.ctx.qualified(node.func)):
                return True
        return False


def _class_weights_to_samples(updated: cst.CSTNode, y: str) -> cst.CSTNode:
    assert isinstance(updated, cst.Arg)
    weights = cst.Module([]).code_for_node(updated.value)
    value = nodes.expr(f"_class_weights_as_sample_weights({y}, {weights})")
    return updated.with_changes(keyword=cst.Name("sample_weight"), value=value)


def _several_outputs(call: cst.Call) -> bool:
    bound = nodes.bind(call, ("inputs", "outputs"))
    arg = None if bound is None else (bound.get("outputs") or bound.get("output"))
    return arg is not None and isinstance(arg.value, (cst.List, cst.Tuple)) and len(
        arg.value.elements) >= 2


def _plain_metric(value: cst.BaseExpression) -> bool:
    """A metric named by a string or a function (stateless): it can serve every output."""
    return isinstance(value, (cst.SimpleString, cst.Name, cst.Attribute))


def _per_output(updated: cst.CSTNode, owner: str) -> cst.CSTNode:
    assert isinstance(updated, cst.Arg)
    value = updated.value
    if isinstance(value, cst.BinaryOperation):  # already per output (a second run)
        return updated
    return updated.with_changes(value=cst.BinaryOperation(
        left=cst.List([cst.Element(value)]), operator=cst.Multiply(),
        right=nodes.expr(f"len({owner}.outputs)")))


def _branch_tests(function: cst.FunctionDef) -> List[cst.BaseExpression]:
    return [node.test for node in _walk(function)
            if isinstance(node, (cst.If, cst.While, cst.IfExp))]


def _walk(root: cst.CSTNode) -> List[cst.CSTNode]:
    found: List[cst.CSTNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.children)
    return found


def _keras1_merge(ctx: Context, module: object, names: List[str]) -> bool:
    return module == "keras.layers" and "merge" in names and (
        "Merge" in names or re.search(r"\bmerge\(", ctx.source) is not None)


def _label(target: Target) -> str:
    return "tf_keras" if target is Target.TF_KERAS else "Keras 3"


def _to_abc(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.ImportFrom)
    return updated.with_changes(module=nodes.attr_chain("collections.abc"))


def _requote(updated: cst.CSTNode, new: str) -> cst.CSTNode:
    assert isinstance(updated, cst.SimpleString)
    quote = updated.value[-1]
    return updated.with_changes(value=f"{updated.prefix}{quote}{new}{quote}")


RULE = TrainingRule
