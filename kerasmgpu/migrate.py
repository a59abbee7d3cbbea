"""`kerasmgpu migrate PATH...`: move Keras 2.x multi-GPU code onto kerasmgpu.

The codemod edits source with libcst, so comments, blank lines and formatting outside the
rewritten nodes survive byte for byte. Running it on migrated code changes nothing.

Rewritten (the result runs the same program on kerasmgpu's drop-ins):

* ``from M import multi_gpu_model [as alias]`` for every module M that ever exported it
  (``keras.utils`` and its submodules of Keras 2.0 - 2.3, ``tensorflow.keras.utils`` also
  through its ``compat`` and generated API aliases, and TensorFlow's own modules behind
  them, each also under ``tensorflow_core``: the list, with the releases, is
  ``MULTI_GPU_MODEL_MODULES`` in ``kerasmgpu/adapters/keras23.py``)
  becomes ``from kerasmgpu.legacy import multi_gpu_model [as alias]``. When the line imports
  other names too, they stay where they are and the kerasmgpu import goes on its own line
  right after it (inside a one-line suite such as ``if x: from ...``, after a semicolon).
* References to ``multi_gpu_model`` through a module, such as ``keras.utils.multi_gpu_model``,
  ``tf.keras.utils.multi_gpu_model``, ``tf.compat.v2.keras.utils.multi_gpu_model`` or
  ``utils.multi_gpu_model``, become ``kerasmgpu.legacy.multi_gpu_model``. Module names are
  resolved through the file's own imports (``import tensorflow as tf``,
  ``from tensorflow import keras``, ``import keras``, ``from keras import utils``...), so an
  unrelated ``utils`` object is never touched.
  References that cannot be traced to an import are only advised.
* Calls to a local ``make_parallel`` function (the keras-extras recipe) go to
  ``kerasmgpu.legacy.make_parallel``. The local definition is left in place, because other
  modules may import it and deleting user code is the user's call; it gets advice instead.
  The attribute form (not ``from kerasmgpu.legacy import make_parallel``) is used because the
  local name ``make_parallel`` is still bound to the old function. Calls are rewritten only
  when the definition has the keras-extras signature ``(model, gpu_count)``, is not a method,
  and every call passes exactly those two arguments; otherwise nothing is rewritten and the
  advice says so.

When a rewrite needs the name ``kerasmgpu``, ``import kerasmgpu.legacy`` is added (once) after
the last module-level import that precedes the first rewritten statement: in the usual file
that is the last top-of-module import, and it never lands after an ``os.environ[...] = ...``
line that the user's framework imports depend on, nor after the first use.

Only advised (``path:line: advice: ...``), because the right change depends on intent:

* a ``with tf.device('/cpu:0')`` scope (any spelling of CPU 0, also as either branch of
  ``a if cond else b``): the template model no longer needs to live on the CPU. Advised
  wherever it appears, since the template is often built in another file than the one that
  parallelizes it.
* ``batch_size`` (any name containing "batch") assigned, or passed as ``batch_size=``, as a
  product with a GPU count: a name containing "gpu", ``G``, a name assigned from a GPU count,
  ``args.gpus``, ``args["gpus"]`` or ``len(...)`` of something named with gpu.
* ``fit_generator``, ``evaluate_generator`` and ``predict_generator`` calls.
* ``.load_weights(`` on what a ``make_parallel`` call returned (directly, or through a name
  or attribute assigned from one anywhere in the file): a file saved from keras-extras'
  wrapper holds the wrapper's layout, which kerasmgpu's make_parallel does not rebuild.
* a local ``make_parallel`` definition, and a local ``get_slice`` (keras-extras' splitter) in
  a file that mentions make_parallel or multi_gpu_model; a local (vendored) ``multi_gpu_model``
  definition, which is advised as a copy of Keras's: a ``get_slice`` inside it, or beside it
  in a file that never mentions make_parallel, is Keras's splitter and gets no keras-extras
  advice. CPU scopes inside those defs are their own merge step, not a template: no advice.
* ``make_parallel`` imported from some other module (it may be a copy of keras-extras), and
  ``from keras.utils import *`` in a file that uses a bare ``multi_gpu_model``.
* ``multi_gpu_model`` imported from a module outside keras, tensorflow and kerasmgpu
  (``from utils.multi_gpu_utils import multi_gpu_model``, ``from .utils import ...``): a
  vendored copy, perhaps modified, so it is not rewritten.
* imports of ``keras.utils.multi_gpu_utils`` / ``training_utils`` (or names from them other
  than multi_gpu_model): those modules are gone in TF >= 2.4 and Keras 3, so the import fails.
* ``X.multi_gpu_model`` where X cannot be traced to a keras/tensorflow import.

The command (``kerasmgpu migrate [--write | --check] PATH...``) walks directories for ``*.py``
(skipping hidden dirs, caches, virtualenvs, build output and symlinked files), prints a
unified diff by default, rewrites atomically with ``--write`` and exits 1 with ``--check`` when
a file would change. Advice is printed in every mode and never changes the exit status: it
needs a human, so ``--check`` fails only on what the codemod would rewrite. Its line numbers
are those of the file as it is on disk when the command ends: the unchanged file (the diff's
``-`` side) for the diff and ``--check``, the rewritten file after ``--write`` (an inserted
import moves what follows down). ``migrate_source`` cites the lines of the source it was
given. A missing PATH stops it before anything is touched.

libcst is an optional dependency (``pip install "kerasmgpu[tools]"``); it is imported only
when the codemod runs, so ``import kerasmgpu`` stays framework- and libcst-free.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import io
import os
import re
import sys
import tempfile
import tokenize
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, List, Optional, Sequence, Set, Tuple

# Where multi_gpu_model lived, release by release: facts of the Keras 2.3 line, kept in
# its adapter (only the names; nothing is imported from those modules).
from kerasmgpu.adapters.keras23 import GONE_MODULES as _GONE_MODULES
from kerasmgpu.adapters.keras23 import MULTI_GPU_MODEL_MODULES as _MGM_MODULES
from kerasmgpu.adapters.keras23 import TF_ROOTS as _TF_ROOTS

if TYPE_CHECKING:  # pragma: no cover - annotations only; libcst is imported lazily
    import libcst as cst

__all__ = ["Advice", "MigrationError", "MigrationResult", "main", "migrate_source"]

INSTALL_HINT = 'pip install "kerasmgpu[tools]"'

_MGM = "multi_gpu_model"
_LEGACY = "kerasmgpu.legacy"
# multi_gpu_model from another module of these packages is theirs (kerasmgpu's, or a
# framework path not listed above), not a vendored copy: no vendored-copy advice.
_FRAMEWORK_PACKAGES = frozenset({"kerasmgpu", "keras", "tf_keras", *_TF_ROOTS})
_MGM_QUALIFIED = frozenset(f"{module}.{_MGM}" for module in _MGM_MODULES)
_TF_DEVICE = frozenset(
    {"tensorflow.device", "tensorflow.compat.v1.device", "tensorflow.compat.v2.device"}
)
# "/cpu:0", "cpu:0", "/CPU:0", "/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0".
_CPU0 = re.compile(r"(?:^|/)(?:device:)?cpu:0$", re.IGNORECASE)
_GENERATOR_METHODS = {
    "fit_generator": "fit",
    "evaluate_generator": "evaluate",
    "predict_generator": "predict",
}
# Besides hidden dirs (.git, .tox, .venv...), which the walk skips by their dot.
_SKIP_DIRS = frozenset({"__pycache__", "venv", "node_modules", "build", "dist"})

_MSG_CPU = (
    "{scope}: kerasmgpu places the replicas itself; the template no longer needs to live on "
    "the CPU (build the model outside this device scope)"
)
_MSG_BATCH = (
    "{name} is multiplied by the GPU count; batch_size is the global batch in kerasmgpu "
    "(split across the replicas, as multi_gpu_model did): keep multiplying only if you want "
    "each GPU to see the old per-GPU batch"
)
_MSG_GENERATOR = (
    "{method} is deprecated (removed in Keras 3); {base}() accepts generators and "
    "keras.utils.Sequence directly: call {base}(...) with the same data"
)
_MSG_MP_REPLACED = (
    "this local make_parallel is no longer used by this file; kerasmgpu.legacy.make_parallel "
    "replaces it (it dropped the batch remainder and reduced gradients on one device): delete "
    "it once nothing imports it"
)
_MSG_MP_KEPT = (
    "this local make_parallel is still called here: {why}, so its calls were left alone; "
    "switch them to kerasmgpu.legacy.make_parallel(model, gpu_count) by hand (this one "
    "dropped the batch remainder and reduced gradients on one device)"
)
_MSG_MGM_VENDORED = (
    "this local multi_gpu_model looks like a copy of Keras's multi_gpu_model (removed in "
    "TF 2.4): kerasmgpu.legacy.multi_gpu_model replaces it with the same signature, so "
    "callers can `from kerasmgpu.legacy import multi_gpu_model` instead; delete this copy "
    "once nothing imports it"
)
_MSG_MGM_VENDORED_IMPORT = (
    "multi_gpu_model imported from {module}, which is not Keras: this looks like a vendored "
    "copy of Keras's multi_gpu_model (removed in TF 2.4), left alone because it may have been "
    "modified; if it is a plain copy, switch to `from kerasmgpu.legacy import multi_gpu_model` "
    "(same signature)"
)
_MSG_GET_SLICE = (
    "get_slice is keras-extras' batch splitter for make_parallel; kerasmgpu splits batches "
    "itself and keeps the remainder, so it can go once make_parallel does"
)
_MSG_MP_IMPORT = (
    "make_parallel imported from {module}: if that is keras-extras' make_parallel (it dropped "
    "the batch remainder and reduced gradients on one device), import it from "
    "kerasmgpu.legacy instead"
)
_MSG_MGM_STAR = (
    "multi_gpu_model is used but only a star import of {module} can provide it, and TF 2.4 "
    "removed it there: add `from kerasmgpu.legacy import multi_gpu_model` after this line"
)
_MSG_MP_LOAD = (
    "{receiver}.load_weights loads into what make_parallel returned: a weight file saved from "
    "keras-extras' make_parallel holds its wrapper's layout (the template nested as one "
    "layer), which kerasmgpu.legacy.make_parallel does not build (for gpu_count=1 it returns "
    "the template itself), so the file may not load, and by_name=True silently loads none of "
    "it into the template; convert it once where the old code runs (load it into the old "
    "wrapper, save the template's weights) and load that file into the template before "
    "make_parallel"
)
_MSG_GONE = (
    "{module} does not exist in TF >= 2.4 or Keras 3, so this import fails there; "
    "kerasmgpu.legacy provides multi_gpu_model: drop this import once nothing uses it"
)
_MSG_MGM_UNRESOLVED = (
    "`{expr}` could not be traced to an import of keras or tensorflow, so it was left alone; "
    "if it is Keras' multi_gpu_model (removed in TF 2.4), call "
    "kerasmgpu.legacy.multi_gpu_model instead"
)


@dataclass(frozen=True)
class Advice:
    """A pattern the codemod found but did not rewrite: where it is, and what to do.

    `line` is 1-based, in the source that was analysed (not in the rewritten text).
    """

    filename: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}: advice: {self.message}"


@dataclass(frozen=True)
class MigrationResult:
    """What `migrate_source` produced: the new text, whether it differs, and the advice."""

    new_source: str
    changed: bool
    advice: List[Advice]


class MigrationError(ValueError):
    """The source could not be parsed, so it cannot be migrated (it is left as it was)."""

    def __init__(self, filename: str, reason: str) -> None:
        self.filename = filename
        self.reason = reason
        super().__init__(
            f"Cannot migrate {filename}: cannot parse: {reason}. Allowed: Python 3 source "
            "that parses. Fix: correct the syntax (convert Python 2 files with 2to3 first), "
            "then run kerasmgpu migrate again."
        )


def _import_libcst() -> None:
    """Fail with the install command when the optional libcst is missing."""
    try:
        import libcst  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "kerasmgpu migrate needs libcst, which is not installed. Received: no module "
            f"named 'libcst'. Allowed: libcst>=1.1 (the 'tools' extra). Fix: {INSTALL_HINT}"
        ) from exc


# --------------------------------------------------------------------------------------
# Small, pure helpers over libcst nodes.


def _dotted(node: cst.CSTNode) -> Optional[str]:
    """`a.b.c` for a Name/Attribute chain, else None."""
    import libcst as cst

    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def _legacy_module() -> cst.Attribute:
    """The expression `kerasmgpu.legacy`."""
    import libcst as cst

    return cst.Attribute(value=cst.Name("kerasmgpu"), attr=cst.Name("legacy"))


def _legacy_expr(attr: str) -> cst.Attribute:
    """The expression `kerasmgpu.legacy.<attr>`."""
    import libcst as cst

    return cst.Attribute(value=_legacy_module(), attr=cst.Name(attr))


def _legacy_import_line() -> cst.SimpleStatementLine:
    """`import kerasmgpu.legacy` as a statement line (newline style follows the module)."""
    import libcst as cst

    return cst.SimpleStatementLine(
        body=[cst.Import(names=[cst.ImportAlias(name=_legacy_module())])]
    )


def _is_legacy_import(stmt: cst.CSTNode) -> bool:
    """Whether `stmt` is a line holding `import kerasmgpu.legacy` (without `as`)."""
    import libcst as cst

    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Import):
            for alias in small.names:
                if alias.asname is None and _dotted(alias.name) == _LEGACY:
                    return True
    return False


def _holds_import(stmt: cst.CSTNode) -> bool:
    """Whether a statement is an import line, or an if/try whose branches hold one.

    `try: import keras / except ImportError: ...` counts: the inserted import must come after
    such a block, not before the name it sits beside.
    """
    import libcst as cst

    if isinstance(stmt, cst.SimpleStatementLine):
        return any(isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body)
    blocks: List[cst.BaseSuite] = []
    if isinstance(stmt, cst.If):
        blocks.append(stmt.body)
        if isinstance(stmt.orelse, cst.If):  # elif
            if _holds_import(stmt.orelse):
                return True
        elif stmt.orelse is not None:
            blocks.append(stmt.orelse.body)
    elif isinstance(stmt, cst.Try):
        blocks.append(stmt.body)
        blocks.extend(handler.body for handler in stmt.handlers)
        if stmt.orelse is not None:
            blocks.append(stmt.orelse.body)
    for block in blocks:
        if isinstance(block, cst.IndentedBlock):
            if any(_holds_import(inner) for inner in block.body):
                return True
        elif isinstance(block, cst.SimpleStatementSuite):
            if any(isinstance(small, (cst.Import, cst.ImportFrom)) for small in block.body):
                return True
    return False


def _top_package(module_name: str) -> str:
    """`keras` for `keras.utils`; a relative module (`.utils`) has none and gives ``""``."""
    return "" if module_name.startswith(".") else module_name.split(".")[0]


def _is_docstring(stmt: cst.CSTNode) -> bool:
    import libcst as cst

    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _target_name(node: cst.CSTNode) -> Optional[str]:
    """The name an assignment target ends in: `batch_size`, `args.batch_size`, `cfg["bs"]`."""
    import libcst as cst

    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        if isinstance(index, cst.Index):
            return _string_value(index.value)
    return None


def _string_value(node: cst.CSTNode) -> Optional[str]:
    import libcst as cst

    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _string_choices(node: cst.BaseExpression) -> List[str]:
    """The string literals an expression can be: itself, or each branch of `a if c else b`.

    `tf.device("/cpu:0" if n > 1 else "/gpu:0")` builds the template on the CPU in the
    multi-GPU case, the one that matters here.
    """
    import libcst as cst

    if isinstance(node, cst.IfExp):
        return _string_choices(node.body) + _string_choices(node.orelse)
    value = _string_value(node)
    return [] if value is None else [value]


def _mul_operands(node: cst.BaseExpression) -> List[cst.BaseExpression]:
    """The factors of `a * b * c` (one factor when `node` is not a product)."""
    import libcst as cst

    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return _mul_operands(node.left) + _mul_operands(node.right)
    return [node]


# --------------------------------------------------------------------------------------
# The engine: an analysis pass decides every rewrite by node identity, then one
# transformer applies them. Classes subclass libcst's, so they are built on first use.


@dataclass
class _Plan:
    import_targets: Set[cst.ImportFrom]
    attr_targets: Set[cst.Attribute]
    name_targets: Set[cst.Name]
    # Where `import kerasmgpu.legacy` goes: after this top-level statement, or at the top.
    anchor: Optional[cst.CSTNode]
    insert_at_top: bool
    advice: List[Tuple[int, str]]


def _analyze(wrapper: cst.metadata.MetadataWrapper, source: str) -> _Plan:
    import libcst as cst
    from libcst.metadata import (
        ClassScope,
        ExpressionContext,
        ExpressionContextProvider,
        ParentNodeProvider,
        PositionProvider,
        QualifiedNameProvider,
        ScopeProvider,
    )

    module = wrapper.module
    mentions_parallel = "make_parallel" in source or _MGM in source

    class Analyzer(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (
            ExpressionContextProvider,
            ParentNodeProvider,
            PositionProvider,
            QualifiedNameProvider,
            ScopeProvider,
        )

        def __init__(self) -> None:
            super().__init__()
            self.import_targets: Set[cst.ImportFrom] = set()
            self.attr_targets: Set[cst.Attribute] = set()
            self.name_targets: Set[cst.Name] = set()
            self.advice: List[Tuple[int, str]] = []
            self.gpu_names: Set[str] = {"G"}  # G = args["gpus"] is the pyimagesearch idiom
            self.star_lines: List[Tuple[int, str]] = []
            self.binds_mgm = False
            self.defines_mgm = False
            self.get_slice_lines: List[int] = []
            # Code of the targets assigned a make_parallel result (`parallel`, `self.pmodel`),
            # and (line, receiver code) of every `.load_weights(` call, matched after the visit
            # since a method may load before the line that assigns comes in the file.
            self.parallel_results: Set[str] = set()
            self.weight_loads: List[Tuple[int, str]] = []
            self.uses_bare_mgm = False
            self.in_import = 0
            self.first_use: Optional[int] = None
            self.functions: List[str] = []  # names of the enclosing defs, innermost last

        # -- helpers ----------------------------------------------------------------
        def line(self, node: cst.CSTNode) -> int:
            return int(self.get_metadata(PositionProvider, node).start.line)

        def advise(self, node: cst.CSTNode, message: str) -> None:
            self.advice.append((self.line(node), message))

        def qualified(self, node: cst.CSTNode) -> Set[str]:
            names = self.get_metadata(QualifiedNameProvider, node, set())
            return {qn.name for qn in names}

        def gpuish(self, node: cst.BaseExpression) -> bool:
            """Whether an expression reads as a GPU count."""
            if isinstance(node, cst.Name):
                return "gpu" in node.value.lower() or node.value in self.gpu_names
            if isinstance(node, cst.Attribute):
                return "gpu" in node.attr.value.lower()
            if isinstance(node, cst.Subscript):
                key = _target_name(node)
                return key is not None and "gpu" in key.lower()
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.args:
                if node.func.value == "len":
                    return "gpu" in module.code_for_node(node.args[0].value).lower()
                if node.func.value == "int":
                    return self.gpuish(node.args[0].value)
            return False

        def gpu_product(self, node: cst.BaseExpression) -> bool:
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.args:
                if node.func.value in ("int", "round"):
                    return self.gpu_product(node.args[0].value)
            factors = _mul_operands(node)
            return len(factors) > 1 and any(self.gpuish(factor) for factor in factors)

        # -- imports ----------------------------------------------------------------
        def visit_Import(self, node: cst.Import) -> None:
            self.in_import += 1
            for alias in node.names:
                imported = _dotted(alias.name)
                if imported in _GONE_MODULES:
                    self.advise(node, _MSG_GONE.format(module=imported))

        def leave_Import(self, original_node: cst.Import) -> None:
            self.in_import -= 1

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            self.in_import += 1
            dots = "." * len(node.relative)
            module_name = dots + (_dotted(node.module) or "") if node.module else dots
            if isinstance(node.names, cst.ImportStar):
                if module_name in _MGM_MODULES:
                    self.star_lines.append((self.line(node), module_name))
                return
            for alias in node.names:
                imported = _dotted(alias.name)
                if module_name in _GONE_MODULES and imported != _MGM:
                    # `from keras.utils.multi_gpu_utils import get_slice` outlives the split.
                    self.advise(node, _MSG_GONE.format(module=module_name))
                elif f"{module_name}.{imported}" in _GONE_MODULES:
                    self.advise(node, _MSG_GONE.format(module=f"{module_name}.{imported}"))
                if imported == _MGM:
                    self.binds_mgm = True
                    if module_name in _MGM_MODULES:
                        self.import_targets.add(node)
                    elif _top_package(module_name) not in _FRAMEWORK_PACKAGES:
                        self.advise(node, _MSG_MGM_VENDORED_IMPORT.format(module=module_name))
                elif imported == "make_parallel" and module_name != _LEGACY:
                    self.advise(node, _MSG_MP_IMPORT.format(module=module_name))

        def leave_ImportFrom(self, original_node: cst.ImportFrom) -> None:
            self.in_import -= 1

        # -- multi_gpu_model through a module ----------------------------------------
        def visit_Attribute(self, node: cst.Attribute) -> None:
            if self.in_import or node.attr.value != _MGM:
                return
            context = self.get_metadata(ExpressionContextProvider, node, None)
            if context is not ExpressionContext.LOAD:
                return  # `keras.utils.multi_gpu_model = ...` patches Keras; not ours to move
            names = self.qualified(node)
            if names & _MGM_QUALIFIED:
                self.attr_targets.add(node)
            elif not any(name.startswith(_LEGACY + ".") for name in names):
                expr = module.code_for_node(node)
                self.advise(node, _MSG_MGM_UNRESOLVED.format(expr=expr))

        def visit_Name(self, node: cst.Name) -> None:
            if node.value != _MGM or self.in_import:
                return
            parent = self.get_metadata(ParentNodeProvider, node, None)
            if isinstance(parent, cst.Attribute) and parent.attr is node:
                return  # the `.multi_gpu_model` of an attribute: visit_Attribute's business
            if self.get_metadata(ExpressionContextProvider, node, None) is ExpressionContext.LOAD:
                self.uses_bare_mgm = True

        # -- local make_parallel / get_slice ----------------------------------------
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            name = node.name.value
            self.functions.append(name)
            if name == "get_slice" and mentions_parallel and _MGM not in self.functions[:-1]:
                # Decided after the visit: beside a copy of Keras's multi_gpu_model it is
                # Keras's splitter, whichever comes first in the file.
                self.get_slice_lines.append(self.line(node.name))
            if name == _MGM:
                self.defines_mgm = True
                self.advise(node.name, _MSG_MGM_VENDORED)
            if name != "make_parallel":
                return
            why, accesses = self.make_parallel_accesses(node)
            if why is None:
                self.name_targets.update(accesses)
                self.advise(node.name, _MSG_MP_REPLACED)
            else:
                self.advise(node.name, _MSG_MP_KEPT.format(why=why))

        def make_parallel_accesses(
            self, node: cst.FunctionDef
        ) -> Tuple[Optional[str], List[cst.Name]]:
            """The names that refer to this def, or why its calls cannot be moved safely."""
            scope = self.get_metadata(ScopeProvider, node, None)
            if scope is None or isinstance(scope, ClassScope):
                return "it is a method", []
            params = node.params
            if (
                len(params.posonly_params) + len(params.params) != 2
                or isinstance(params.star_arg, cst.Param)
                or params.kwonly_params
                or params.star_kwarg is not None
            ):
                return "its signature is not (model, gpu_count)", []
            names: List[cst.Name] = []
            for assignment in scope.assignments[node.name.value]:
                if getattr(assignment, "node", None) is not node:
                    continue
                for access in assignment.references:
                    if not isinstance(access.node, cst.Name):
                        continue
                    parent = self.get_metadata(ParentNodeProvider, access.node, None)
                    if isinstance(parent, cst.Call) and parent.func is access.node:
                        if not _two_plain_arguments(parent):
                            return "a call does not pass exactly (model, gpu_count)", []
                    names.append(access.node)
            return None, names

        def leave_Module(self, original_node: cst.Module) -> None:
            # The first top-level statement holding a rewrite that needs the name
            # `kerasmgpu`; metadata is only readable while the visit runs, hence here.
            moved: List[cst.CSTNode] = [*self.attr_targets, *self.name_targets]
            index_of = {id(stmt): index for index, stmt in enumerate(original_node.body)}
            for node in moved:
                top = node
                while id(top) not in index_of:
                    top = self.get_metadata(ParentNodeProvider, top)
                index = index_of[id(top)]
                self.first_use = index if self.first_use is None else min(self.first_use, index)

        # -- advice-only patterns ---------------------------------------------------
        def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
            self.functions.pop()

        def visit_With(self, node: cst.With) -> None:
            if "make_parallel" in self.functions or _MGM in self.functions:
                return  # their own CPU merge scope: the def itself is advised already
            for item in node.items:
                call = item.item
                if not isinstance(call, cst.Call) or not call.args:
                    continue
                func_name = _dotted(call.func) or ""
                is_tf_device = bool(self.qualified(call.func) & _TF_DEVICE) or (
                    func_name == "tf.device" or func_name.endswith(".tf.device")
                )
                devices = _string_choices(call.args[0].value)
                if is_tf_device and any(_CPU0.search(device.strip()) for device in devices):
                    scope = f"with {module.code_for_node(call)}"
                    self.advise(node, _MSG_CPU.format(scope=scope))

        def visit_Assign(self, node: cst.Assign) -> None:
            if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
                if self.gpuish(node.value):  # G = args["gpus"]; n = len(gpu_ids)
                    self.gpu_names.add(node.targets[0].target.value)
            for target in node.targets:
                self.check_batch(node, target.target, node.value)
                if _is_make_parallel_call(node.value):
                    self.parallel_results.add(module.code_for_node(target.target))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            if node.value is not None:
                self.check_batch(node, node.target, node.value)
                if _is_make_parallel_call(node.value):
                    self.parallel_results.add(module.code_for_node(node.target))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            name = _target_name(node.target)
            if (
                isinstance(node.operator, cst.MultiplyAssign)
                and name is not None
                and "batch" in name.lower()
                and self.gpuish(node.value)
            ):
                self.advise(node, _MSG_BATCH.format(name=name))

        def check_batch(
            self, node: cst.CSTNode, target: cst.BaseExpression, value: cst.BaseExpression
        ) -> None:
            name = _target_name(target)
            if name is not None and "batch" in name.lower() and self.gpu_product(value):
                self.advise(node, _MSG_BATCH.format(name=name))

        def visit_Arg(self, node: cst.Arg) -> None:
            if node.keyword is not None and node.keyword.value == "batch_size":
                if self.gpu_product(node.value):
                    self.advise(node.keyword, _MSG_BATCH.format(name="batch_size"))

        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            method = func.attr if isinstance(func, cst.Attribute) else func
            if isinstance(method, cst.Name) and method.value in _GENERATOR_METHODS:
                base = _GENERATOR_METHODS[method.value]
                self.advise(method, _MSG_GENERATOR.format(method=method.value, base=base))
            if isinstance(func, cst.Attribute) and func.attr.value == "load_weights":
                receiver = module.code_for_node(func.value)
                if _is_make_parallel_call(func.value):
                    self.advise(func.attr, _MSG_MP_LOAD.format(receiver=receiver))
                else:
                    self.weight_loads.append((self.line(func.attr), receiver))

    analyzer = Analyzer()
    wrapper.visit(analyzer)
    advice = list(analyzer.advice)
    advice.extend(
        (line, _MSG_MP_LOAD.format(receiver=receiver))
        for line, receiver in analyzer.weight_loads
        if receiver in analyzer.parallel_results
    )
    if not analyzer.defines_mgm or "make_parallel" in source:
        advice.extend((line, _MSG_GET_SLICE) for line in analyzer.get_slice_lines)
    if analyzer.uses_bare_mgm and not analyzer.binds_mgm:
        advice.extend((line, _MSG_MGM_STAR.format(module=mod)) for line, mod in analyzer.star_lines)

    anchor: Optional[cst.CSTNode] = None
    insert_at_top = False
    first_use = analyzer.first_use
    if first_use is not None and not any(_is_legacy_import(stmt) for stmt in module.body):
        imports = [stmt for stmt in module.body[:first_use] if _holds_import(stmt)]
        if imports:
            anchor = imports[-1]
        elif first_use > 0 and _is_docstring(module.body[0]):
            anchor = module.body[0]
        else:
            insert_at_top = True

    return _Plan(
        import_targets=analyzer.import_targets,
        attr_targets=analyzer.attr_targets,
        name_targets=analyzer.name_targets,
        anchor=anchor,
        insert_at_top=insert_at_top,
        advice=sorted(set(advice)),
    )


def _is_make_parallel_call(node: cst.CSTNode) -> bool:
    """`make_parallel(...)` or `X.make_parallel(...)`: the old one, a copy, or kerasmgpu's."""
    import libcst as cst

    if not isinstance(node, cst.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, cst.Attribute) else func
    return isinstance(name, cst.Name) and name.value == "make_parallel"


def _two_plain_arguments(call: cst.Call) -> bool:
    """Whether a call passes exactly (model, gpu_count), positionally or by those keywords."""
    if len(call.args) != 2:
        return False
    for arg in call.args:
        if arg.star:
            return False
        if arg.keyword is not None and arg.keyword.value not in ("model", "gpu_count"):
            return False
    return True


def _split_import(
    node: cst.ImportFrom,
) -> Tuple[cst.ImportFrom, Optional[cst.ImportFrom]]:
    """Move multi_gpu_model out of `node`: (the rewritten import, a new kerasmgpu import).

    When multi_gpu_model is the only name, the module itself is swapped and no new import is
    needed; otherwise the other names stay and a second import is returned.
    """
    import libcst as cst

    legacy = _legacy_module()
    assert not isinstance(node.names, cst.ImportStar)  # the analysis never picks those
    names = list(node.names)
    moved = [alias for alias in names if _dotted(alias.name) == _MGM]
    kept = [alias for alias in names if _dotted(alias.name) != _MGM]
    if not kept:
        return node.with_changes(module=legacy), None
    if _dotted(names[-1].name) == _MGM:
        # The last name went away: its comma (absent, or a trailing one before `)`) moves
        # to the new last name so the layout of a parenthesized import survives.
        kept[-1] = kept[-1].with_changes(comma=names[-1].comma)
    added = cst.ImportFrom(
        module=legacy,
        names=[alias.with_changes(comma=cst.MaybeSentinel.DEFAULT) for alias in moved],
    )
    return node.with_changes(names=kept), added


def _rewrite(wrapper: cst.metadata.MetadataWrapper, plan: _Plan) -> cst.Module:
    import libcst as cst

    class Rewriter(cst.CSTTransformer):
        def leave_Attribute(
            self, original_node: cst.Attribute, updated_node: cst.Attribute
        ) -> cst.BaseExpression:
            if original_node in plan.attr_targets:
                return _legacy_expr(_MGM).with_changes(
                    lpar=updated_node.lpar, rpar=updated_node.rpar
                )
            return updated_node

        def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
            if original_node in plan.name_targets:
                return _legacy_expr("make_parallel").with_changes(
                    lpar=updated_node.lpar, rpar=updated_node.rpar
                )
            return updated_node

        def split_imports(
            self,
            original: Sequence[cst.BaseSmallStatement],
            updated: Sequence[cst.BaseSmallStatement],
        ) -> Tuple[List[cst.BaseSmallStatement], List[cst.BaseSmallStatement]]:
            body: List[cst.BaseSmallStatement] = []
            added: List[cst.BaseSmallStatement] = []
            for before, after in zip(original, updated):
                if isinstance(after, cst.ImportFrom) and before in plan.import_targets:
                    rewritten, extra = _split_import(after)
                    body.append(rewritten)
                    if extra is not None:
                        added.append(extra)
                else:
                    body.append(after)
            return body, added

        def leave_SimpleStatementLine(
            self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
        ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
            body, added = self.split_imports(original_node.body, updated_node.body)
            lines: List[cst.BaseStatement] = [updated_node.with_changes(body=body)]
            lines.extend(cst.SimpleStatementLine(body=[extra]) for extra in added)
            return self.after_anchor(original_node, lines)

        def leave_SimpleStatementSuite(
            self,
            original_node: cst.SimpleStatementSuite,
            updated_node: cst.SimpleStatementSuite,
        ) -> cst.BaseSuite:
            # `if x: from keras.utils import a, multi_gpu_model` has no line to add after,
            # so the new import joins the suite after a semicolon.
            body, added = self.split_imports(original_node.body, updated_node.body)
            return updated_node.with_changes(body=[*body, *added])

        def leave_If(
            self, original_node: cst.If, updated_node: cst.If
        ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
            return self.after_anchor(original_node, [updated_node])

        def leave_Try(
            self, original_node: cst.Try, updated_node: cst.Try
        ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
            return self.after_anchor(original_node, [updated_node])

        def after_anchor(
            self, original_node: cst.CSTNode, lines: List[cst.BaseStatement]
        ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
            if original_node is plan.anchor:
                lines.append(_legacy_import_line())
            return lines[0] if len(lines) == 1 else cst.FlattenSentinel(lines)

        def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
            if plan.insert_at_top:
                return updated_node.with_changes(body=[_legacy_import_line(), *updated_node.body])
            return updated_node

    return wrapper.visit(Rewriter())


def _parse_error_reason(source: str, exc: cst.ParserSyntaxError) -> str:
    """What is wrong with `source` and where, for a file libcst refused.

    libcst's native parser can place the error lines too late (an error on line 3 followed
    by more lines is reported on line 4), so Python's own parser, whose positions are exact,
    names it; libcst's report stays for what only libcst rejects.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes etc. are not the error here
            ast.parse(source)
    except SyntaxError as err:
        if err.lineno:
            column = f", column {err.offset}" if err.offset else ""
            return f"{err.msg} (line {err.lineno}{column})"
    except (ValueError, RecursionError):  # null bytes before Python 3.12; deep nesting
        pass
    return f"{exc.message} (line {exc.editor_line}, column {exc.editor_column})"


def migrate_source(source: str, filename: str = "<string>") -> MigrationResult:
    """Migrate one file's text: rewrite multi_gpu_model/make_parallel, collect advice.

    The advice cites lines of `source`. Raises `MigrationError` (a ValueError) when `source`
    does not parse, and ImportError naming `pip install "kerasmgpu[tools]"` when libcst is
    missing.
    """
    _import_libcst()
    import libcst as cst
    from libcst.metadata import MetadataWrapper

    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise MigrationError(filename, _parse_error_reason(source, exc)) from exc
    wrapper = MetadataWrapper(module)
    plan = _analyze(wrapper, source)
    new_source = _rewrite(wrapper, plan).code
    advice = [Advice(filename, line, message) for line, message in plan.advice]
    return MigrationResult(new_source=new_source, changed=new_source != source, advice=advice)


# --------------------------------------------------------------------------------------
# The command.


def _iter_files(paths: Sequence[str]) -> Iterator[str]:
    """Files named on the command line, and `*.py` under directories (sorted, pruned)."""
    seen: Set[str] = set()
    for path in paths:
        if os.path.isdir(path):
            candidates: List[str] = []
            for root, dirs, files in os.walk(path):
                # Hidden dirs (.git, .tox, .venv...), caches, envs and build output hold
                # someone else's code or copies of this one; migrating them is never wanted.
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
                for name in sorted(files):
                    full = os.path.join(root, name)
                    # A linked file may live outside the tree (site-packages, a shared
                    # checkout): only what is named explicitly is followed.
                    if name.endswith(".py") and not os.path.islink(full):
                        candidates.append(full)
        else:
            candidates = [path]  # named explicitly: migrate it whatever its suffix
        for candidate in candidates:
            key = os.path.realpath(candidate)
            if key not in seen:
                seen.add(key)
                yield candidate


def _read(path: str) -> Tuple[str, str]:
    """(text, encoding) of a Python file, honouring a PEP 263 cookie or BOM, newlines kept."""
    with open(path, "rb") as handle:
        raw = handle.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return raw.decode(encoding), encoding


def _write_atomic(path: str, data: bytes) -> None:
    """Replace `path` by `data` in one step: a reader sees the old file or the new one."""
    target = os.path.realpath(path)  # through a symlink, so the link stays a link
    info = os.stat(target)
    directory, name = os.path.split(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".kerasmgpu-tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if hasattr(os, "chown"):
            with contextlib.suppress(OSError):  # only root may give a file away; best effort
                os.chown(tmp, info.st_uid, info.st_gid)
        # After the chown, which clears setuid/setgid; mkstemp makes 0600: keep the user's mode.
        os.chmod(tmp, info.st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _diff(path: str, old: str, new: str) -> str:
    shown = path.replace(os.sep, "/").lstrip("/")
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{shown}",
        tofile=f"b/{shown}",
    )
    out: List[str] = []
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:  # a last line without newline: say so, as diff and git do
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerasmgpu migrate",
        description=(
            "Rewrite keras.utils.multi_gpu_model and keras-extras' make_parallel to "
            "kerasmgpu.legacy, and advise on what needs a human (path:line: advice: ...). "
            "Without --write or --check, prints the diff and changes nothing. Advice cites "
            "the lines of each file as it is on disk when the command ends: the file as it "
            "was (the diff's '-' side) without --write, the rewritten file with --write."
        ),
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the files in place")
    mode.add_argument(
        "--check",
        action="store_true",
        help=(
            "change nothing; exit 1 if any file would be rewritten (for CI); advice alone "
            "does not fail the check"
        ),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """`kerasmgpu migrate [--write | --check] PATH...` (argv excludes the word `migrate`).

    Exit status: 0 done (or nothing to do), 1 with --check when a file would change,
    2 when a path is missing, a file cannot be read or parsed, or libcst is missing.
    """
    args = _parser().parse_args(argv)
    try:
        _import_libcst()
    except ImportError as exc:
        print(f"kerasmgpu migrate: {exc}", file=sys.stderr)
        return 2

    missing = [path for path in args.paths if not os.path.exists(path)]
    if missing:
        # Checked before touching anything, so a typo never leaves a half-migrated tree.
        for path in missing:
            print(
                f"kerasmgpu migrate: no such file or directory. Received: {path!r}. "
                "Allowed: existing .py files or directories. Fix: check the path.",
                file=sys.stderr,
            )
        return 2

    changed: List[str] = []
    unchanged = 0
    failed = 0
    for path in _iter_files(args.paths):
        try:
            text, encoding = _read(path)
        except (OSError, SyntaxError, UnicodeDecodeError, LookupError) as exc:
            print(f"{path}: cannot parse: cannot read it as Python source: {exc}", file=sys.stderr)
            failed += 1
            continue
        try:
            result = migrate_source(text, path)
        except MigrationError as exc:
            print(
                f"{path}: cannot parse: {exc.reason}; left unchanged (Python 2 files need "
                "2to3 first)",
                file=sys.stderr,
            )
            failed += 1
            continue
        advice = result.advice
        if result.changed:
            if args.write:
                try:
                    _write_atomic(path, result.new_source.encode(encoding))
                except OSError as exc:
                    print(f"{path}: cannot write: {exc}; left unchanged", file=sys.stderr)
                    failed += 1
                else:
                    print(f"rewrote {path}")
                    changed.append(path)
                    # Inserted and split imports move lines; the advice must point into the
                    # file the user opens now. The rewrite is idempotent, so analysing the
                    # new text gives the same advice on the new lines.
                    advice = migrate_source(result.new_source, path).advice
            else:
                sys.stdout.write(_diff(path, text, result.new_source))
                changed.append(path)
        else:
            unchanged += 1
        for item in advice:
            print(item)

    if args.check:
        for path in changed:
            print(f"would migrate: {path}")
    verb = "rewritten" if args.write else "would be migrated"
    summary = f"kerasmgpu migrate: {len(changed)} file(s) {verb}, {unchanged} unchanged"
    if failed:
        summary += f", {failed} could not be migrated (see above)"
    if not args.write and not args.check and changed:
        summary += "; run with --write to apply"
    print(summary)
    if failed:
        return 2
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
