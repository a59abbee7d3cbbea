"""Weight and model files, and callback arguments that were removed.

`--to keras3` (Keras 3.15 refuses these; checked on it):

* `model.save_weights(path)`: the path must end in `.weights.h5`. A `.h5` / `.hdf5` ending
  written in the call (a string, an f-string, `"%s.h5" % x`, `"{}.h5".format(x)`,
  `os.path.join(..., "w.h5")`) becomes `.weights.h5` (an INFO that the file name changes);
  a path the source does not spell is a WARNING. `load_weights` is left alone: Keras 3
  still reads Keras 2.3's `.h5` weight files.
* `model.save(path)`: `.h5`, `.hdf5` and `.keras` are fine; a path without an extension
  (TensorFlow's SavedModel folder) is refused: a WARNING that names `model.export(path)`
  and `.keras`.
* `ModelCheckpoint(filepath)`: `.weights.h5` with `save_weights_only=True`, else `.keras`;
  the ending is rewritten like save_weights' (INFO: the checkpoints change name, and without
  save_weights_only change format to Keras 3's `.keras`). `period=1` is dropped; `period=N`
  is dropped with a WARNING: it saves every epoch now (`save_freq` counts batches).
* `TensorBoard(batch_size=, write_grads=, embeddings_layer_names=, embeddings_data=)`:
  dropped (Keras 3 raises). `batch_size` did nothing without Keras 2.3's TF1 histograms
  (INFO); the others change what is written (WARNING).

`--to tf_keras` keeps `.h5` weights and `period` (tf_keras takes both); its TensorBoard
ignores the same four arguments with a log line, so they are dropped the same way.
`--to keras23` changes nothing here.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Dict, List, Optional, Set, Tuple

import libcst as cst

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Rule, canonical_keras_name
from kerasmgpu.migrate.report import Target

H5 = re.compile(r"(?<!\.weights)\.(h5|hdf5)$")
MSG_WEIGHTS = (
    "{what}: {old!r} -> {new!r}: Keras 3 saves weights only to a name ending in "
    ".weights.h5 (the file name changes; load_weights still reads the old .h5 files)"
)
MSG_WEIGHTS_UNKNOWN = (
    "{what}: Keras 3 saves weights only to a path ending in .weights.h5, and this path is "
    "not spelled in the source: make sure it ends so"
)
MSG_CHECKPOINT = (
    "ModelCheckpoint: {old!r} -> {new!r}: Keras 3 writes {kind} (the checkpoints change name"
    "{format})"
)
MSG_FOLLOWED = (
    "{old!r} -> {new!r}: the weight file written at {writer}, which Keras 3 writes under "
    "the new name (a file saved before the migration keeps its old name: rename it, or "
    "change this back if this reads such a file)"
)
MSG_SAVE_DIR = (
    "model.save({path}): Keras 3 saves to a .keras file (or legacy .h5); a path without "
    "extension was TensorFlow's SavedModel folder: use model.export({path}) for serving, or "
    "add .keras"
)
MSG_PERIOD = (
    "ModelCheckpoint(period={value}) dropped: Keras 3 has no period and saves every epoch "
    "now (save_freq counts batches: save_freq={value} * steps_per_epoch saves every {value} "
    "epochs)"
)
TENSORBOARD_GONE = {
    "batch_size": ("INFO", "it sized Keras 2.3's TF1 histogram batches only"),
    "write_grads": ("WARNING", "gradient histograms are no longer written"),
    "embeddings_layer_names": ("WARNING", "every Embedding layer is visualized now"),
    "embeddings_data": ("WARNING", "every Embedding variable is visualized now"),
}


class SavingRule(Rule):
    NAME = "saving"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        # the string literal that ends a saved path -> (its new text, the line writing it)
        self.renamed: Dict[str, Tuple[str, int]] = {}
        self.writers: Set[int] = set()  # id() of the literals renamed where they are written
        self.strings: List[cst.SimpleString] = []  # every literal ending like a weight file

    def callback(self, func: cst.BaseExpression) -> Optional[str]:
        for name in self.ctx.keras_names(func):
            if name.startswith("keras.callbacks."):
                return name.rsplit(".", 1)[1]
        # `from model import *` where the project's model.py imported ModelCheckpoint from
        # keras.callbacks (zhixuhao/unet's main.py): an unbound name of a star import.
        if (isinstance(func, cst.Name) and func.value in ("ModelCheckpoint", "TensorBoard")
                and self.ctx.is_unbound(func) and _has_project_star(self.ctx.module)):
            return func.value
        return None

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = self.callback(func)
        if name == "ModelCheckpoint":
            self.checkpoint(node)
        elif name == "TensorBoard":
            self.tensorboard(node)
        elif isinstance(func, cst.Attribute) and self.ctx.target is Target.KERAS3:
            if func.attr.value == "save_weights" and node.args:
                self.suffix(self.bound_path(node.args[0].value), ".weights.h5",
                            f"{self.ctx.code(func)}")
            elif func.attr.value == "save" and node.args and not self.is_not_model(func):
                path = node.args[0].value
                literal = _literal_tail(path)
                if literal is not None and "." not in literal.rsplit("/", 1)[-1]:
                    self.warning(node, MSG_SAVE_DIR.format(path=self.ctx.code(path)))

    def is_not_model(self, func: cst.Attribute) -> bool:
        """`np.save`, `img.save`, `json.save`...: a module or an obvious non-model."""
        owner = nodes.dotted(func.value) or ""
        return owner.split(".")[0] in self.ctx.bindings or owner in ("np", "numpy", "img",
                                                                     "image", "fig", "plt")

    def suffix(self, path: cst.BaseExpression, new: str, what: str) -> bool:
        """Rewrite a `.h5`/`.hdf5` ending spelled in `path` to `new`; False if unknown."""
        literal = _literal_tail(path)
        if literal is None:
            self.warning(path, MSG_WEIGHTS_UNKNOWN.format(what=what))
            return False
        if literal.endswith(new):
            return True
        if H5.search(literal) is None:
            return False
        changed = H5.sub(new, literal)
        self.ctx.edit(path, functools.partial(_replace_tail, old=literal, new=changed))
        self.info(path, MSG_WEIGHTS.format(what=what, old=literal, new=changed))
        self.record(path, literal, changed)
        return True

    def bound_path(self, path: cst.BaseExpression, depth: int = 0) -> cst.BaseExpression:
        """The expression a path name is bound to, where one assignment binds it.

        `weights_file = "w.h5"` ... `ModelCheckpoint(weights_file)`: the assignment's literal
        is the one to rename (every use of the name then follows it); also through a dict
        literal (Keras-GAN's `options = {"file_weight": weights_path}` ...
        `save_weights(options['file_weight'])`).
        """
        if depth > 3:
            return path
        if isinstance(path, cst.Subscript) and len(path.slice) == 1 and isinstance(
                path.slice[0].slice, cst.Index):
            key = nodes.string_value(path.slice[0].slice.value)
            table = self.bound_path(path.value, depth + 1)
            if key is not None and isinstance(table, cst.Dict):
                for element in table.elements:
                    if isinstance(element, cst.DictElement) and nodes.string_value(
                            element.key) == key:
                        return self.bound_path(element.value, depth + 1)
            return path
        if not isinstance(path, cst.Name):
            return path
        scope = self.ctx.scopes.get(path)
        assignments = list(scope[path.value]) if scope is not None else []
        if len(assignments) != 1:
            return path
        target = self.ctx.parent(getattr(assignments[0], "node", path))
        assign = self.ctx.parent(target) if isinstance(target, cst.AssignTarget) else None
        if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
            return self.bound_path(assign.value, depth + 1)
        return path

    def record(self, path: cst.BaseExpression, old: str, new: str) -> None:
        """Remember the literal a renamed path ends with: other places that spell it read
        the file this one writes."""
        literal = _tail_string(path)
        if literal is not None and nodes.string_value(literal) == old:
            self.renamed.setdefault(old, (new, self.ctx.position(path)[0]))
            self.ctx.renamed.setdefault(old, (new, self.ctx.position(path)[0]))
            self.writers.add(id(literal))

    def checkpoint(self, node: cst.Call) -> None:
        bound = nodes.bind(node, ("filepath", "monitor", "verbose", "save_best_only",
                                  "save_weights_only", "mode", "period"))
        if bound is None:
            return
        period = bound.get("period")
        if period is not None and period.keyword is None:
            self.warning(period, "ModelCheckpoint: period passed by position; Keras 3 has no "
                      "period (it saves every epoch): remove it by hand")
        elif period is not None and self.ctx.target is Target.KERAS3:
            value = self.ctx.code(period.value)
            if value != "1":
                self.warning(period, MSG_PERIOD.format(value=value))
            else:
                self.info(period, "ModelCheckpoint(period=1) dropped: Keras 3 saves every "
                          "epoch by default")
            self.ctx.edit(node, functools.partial(_drop_names, names=["period"]))
        if self.ctx.target is not Target.KERAS3 or "filepath" not in bound:
            return
        weights_only = bound.get("save_weights_only")
        only = weights_only is not None and self.ctx.code(weights_only.value) != "False"
        path = self.bound_path(bound["filepath"].value)
        literal = _literal_tail(path)
        new = ".weights.h5" if only else ".keras"
        if literal is None or literal.endswith(new) or H5.search(literal) is None:
            if literal is None:
                self.warning(path, f"ModelCheckpoint: Keras 3 needs the path to end in {new}, "
                          "and this path is not spelled in the source")
            return
        changed = H5.sub(new, literal)
        self.ctx.edit(path, functools.partial(_replace_tail, old=literal, new=changed))
        self.record(path, literal, changed)
        fmt = "" if only else ", and their format: Keras 3's .keras files, read by " \
            "keras.models.load_model"
        self.info(path, MSG_CHECKPOINT.format(old=literal, new=changed, format=fmt,
                                              kind="weights to .weights.h5" if only else
                                              "whole models to .keras"))

    def tensorboard(self, node: cst.Call) -> None:
        gone = [arg for arg in node.args if nodes.keyword(arg) in TENSORBOARD_GONE]
        for arg in gone:
            key = nodes.keyword(arg) or ""
            level, why = TENSORBOARD_GONE[key]
            report: Callable[[cst.CSTNode, str], None] = (
                self.warning if level == "WARNING" else self.info)
            report(arg, f"TensorBoard({key}=...) dropped: modern Keras has no such argument; "
                   f"{why}")
        if gone:
            names = [nodes.keyword(a) for a in gone]
            self.ctx.edit(node, functools.partial(_drop_names, names=names))


    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if H5.search(nodes.string_value(node) or "") is not None:
            self.strings.append(node)

    def finish(self) -> None:
        """Every other literal that spells a renamed path reads the file written there:
        it follows the new name (in this file, and in the project's other files through
        `ctx.renamed_elsewhere`, which the command fills on its second pass)."""
        here = {old: (new, f"line {line}") for old, (new, line) in self.renamed.items()}
        elsewhere = {old: found for old, found in self.ctx.renamed_elsewhere.items()
                     if old not in here}
        for literal in self.strings:
            old = nodes.string_value(literal) or ""
            if id(literal) in self.writers or (old not in here and old not in elsewhere):
                continue
            new, writer = here.get(old) or elsewhere[old]
            self.ctx.edit(literal, functools.partial(_replace_tail, old=old, new=new))
            self.info(literal, MSG_FOLLOWED.format(old=old, new=new, writer=writer))


RULE = SavingRule


def _literal_tail(node: cst.BaseExpression) -> Optional[str]:
    """The literal text a path expression ends with, when the source spells it."""
    if isinstance(node, cst.SimpleString):
        return nodes.string_value(node)
    if isinstance(node, cst.FormattedString):
        last = node.parts[-1] if node.parts else None
        return last.value if isinstance(last, cst.FormattedStringText) else None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Modulo,
                                                                            cst.Add)):
        side = node.left if isinstance(node.operator, cst.Modulo) else node.right
        return _literal_tail(side)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if node.func.attr.value == "format":
            return _literal_tail(node.func.value)
        if nodes.dotted(node.func) in ("os.path.join", "path.join") and node.args:
            return _literal_tail(node.args[-1].value)
    return None


def _tail_string(node: cst.BaseExpression) -> Optional[cst.SimpleString]:
    """The string literal that holds the end of a path expression (as `_literal_tail`)."""
    if isinstance(node, cst.SimpleString):
        return node
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Modulo,
                                                                            cst.Add)):
        return _tail_string(node.left if isinstance(node.operator, cst.Modulo) else node.right)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if node.func.attr.value == "format":
            return _tail_string(node.func.value)
        if nodes.dotted(node.func) in ("os.path.join", "path.join") and node.args:
            return _tail_string(node.args[-1].value)
    return None


def _replace_tail(updated: cst.CSTNode, old: str, new: str) -> cst.CSTNode:
    """`updated` with the literal that ends the path rewritten (the same place as found)."""
    if isinstance(updated, cst.SimpleString):
        body = updated.raw_value
        if body.endswith(_tail_of(old)):
            body = body[: len(body) - len(_tail_of(old))] + _tail_of(new)
        return updated.with_changes(value=f"{updated.prefix}{updated.quote}{body}"
                                    f"{updated.quote}")
    if isinstance(updated, cst.FormattedString):
        last = updated.parts[-1]
        assert isinstance(last, cst.FormattedStringText)
        value = last.value[: len(last.value) - len(_tail_of(old))] + _tail_of(new)
        return updated.with_changes(parts=[*updated.parts[:-1], last.with_changes(value=value)])
    if isinstance(updated, cst.BinaryOperation):
        if isinstance(updated.operator, cst.Modulo):
            return updated.with_changes(left=_replace_tail(updated.left, old, new))
        return updated.with_changes(right=_replace_tail(updated.right, old, new))
    if isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute):
        if updated.func.attr.value == "format":
            func = updated.func.with_changes(value=_replace_tail(updated.func.value, old, new))
            return updated.with_changes(func=func)
        last = updated.args[-1]
        args = [*updated.args[:-1], last.with_changes(value=_replace_tail(last.value, old,
                                                                           new))]
        return updated.with_changes(args=args)
    return updated


def _tail_of(path: str) -> str:
    """The extension part that changes: `.h5`, `.hdf5`, `.weights.h5`, `.keras`."""
    match = re.search(r"(\.weights\.h5|\.h5|\.hdf5|\.keras)$", path)
    return match.group(1) if match else ""


def _drop_names(updated: cst.CSTNode, names: List[Optional[str]]) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    return nodes.drop_args(updated, [n for n in names if n is not None])


def _has_project_star(module: cst.Module) -> bool:
    """Whether the file has `from M import *` of a module that is not Keras's."""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if (isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar)
                        and canonical_keras_name(nodes.module_of(small) or "") is None):
                    return True
    return False
