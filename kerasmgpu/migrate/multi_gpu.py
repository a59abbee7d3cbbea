"""Multi-GPU code: Keras's `multi_gpu_model` and keras-extras' `make_parallel`.

`--to keras3` / `--to tf_keras`: a call `multi_gpu_model(model, gpus=G)` (imported from any
module that ever exported it, or reached as `keras.utils.multi_gpu_model`,
`tf.keras.utils.multi_gpu_model`...; the list with releases is `MULTI_GPU_MODEL_MODULES` in
`kerasmgpu/adapters/keras23.py`) becomes `kerasmgpu.parallelize(model, gpus=G)`, with the
Keras 2.3 semantics: the template passed in is the model to save (it receives the trained
weights), the returned model is the one to compile and fit, and `batch_size` is the global
batch split over the replicas. `cpu_merge`/`cpu_relocation` are dropped (they only steer
Keras 2.3's own merge). `gpus <= 1` no longer raises ValueError: the model itself comes
back (code that caught the error to train on one device does the same). A reference that
is not a call (`f = multi_gpu_model`) goes to the drop-in `kerasmgpu.legacy.multi_gpu_model`.
The import of `multi_gpu_model` goes once nothing uses it.

Calls to a local keras-extras `make_parallel(model, gpu_count)` become
`kerasmgpu.parallelize(model, gpus=gpu_count)` (`gpu_count=1` returns the model itself in
both) - but not when a weight file is loaded into what it returns: a file saved from
keras-extras' wrapper holds the wrapper's layout, so those calls stay, with an ERROR that
says how to convert the file. The local definition stays (other modules may import it).

`--to keras23` keeps the project on Keras 2.3.1: imports and module references go to
`kerasmgpu.legacy.multi_gpu_model` / `.make_parallel` (same signatures, no dropped batch
remainder).

Found and reported, not rewritten: a template built in `with tf.device('/cpu:0')`, a
`batch_size` multiplied by a GPU count, vendored copies of either function, imports of
Keras's `multi_gpu_utils`/`training_utils` (gone in TF >= 2.4 and Keras 3) and calls into
their private helpers, `multi_gpu_model` through a module that cannot be traced.

The first two are `multi_gpu_advice.py`'s (the base of this rule); the edits the rewrites
make are `multi_gpu_edits.py`'s.
"""

from __future__ import annotations

import functools
from typing import List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import ClassScope

from kerasmgpu.adapters.keras23_names import GONE_MODULES, MULTI_GPU_MODEL_MODULES, TF_ROOTS
from kerasmgpu.migrate import nodes, wrappers
from kerasmgpu.migrate.engine import Context, canonical_keras_name
from kerasmgpu.migrate.import_tables import MODULE_MOVES, spell
from kerasmgpu.migrate.multi_gpu_advice import MultiGpuAdvice
from kerasmgpu.migrate.multi_gpu_edits import (
    _LEGACY,
    _MGM,
    _drop_gone_import,
    _dropped_flags,
    _mgm_call_fits,
    _remove_statement,
    _split_legacy_import,
    _split_legacy_suite,
    _swap_mgm_module,
    _to_parallelize,
)

# multi_gpu_model from another module of these packages is theirs (kerasmgpu's, or a
# framework path not listed), not a vendored copy: no vendored-copy advice.
_FRAMEWORK_PACKAGES = frozenset({"kerasmgpu", "keras", "tf_keras", *TF_ROOTS})
_MGM_QUALIFIED = frozenset(f"{module}.{_MGM}" for module in MULTI_GPU_MODEL_MODULES)
_TRAINS = frozenset({"compile", "fit", "fit_generator", "train_on_batch", "evaluate",
                     "predict"})

MSG_PARALLELIZE = (
    "{old} -> kerasmgpu.parallelize(model, gpus=...): the same Keras 2.3 semantics (compile "
    "and fit the returned model, save the template: it receives the trained weights; "
    "batch_size is the global batch){dropped}; gpus=1 returns the model itself instead of "
    "raising ValueError"
)
MSG_SHIM = (
    "{old} -> kerasmgpu.legacy.multi_gpu_model (the Keras 2.3 signature on any Keras){why}"
)
MSG_MP_REPLACED = (
    "this local make_parallel is no longer used by this file; {new} "
    "replaces it (it dropped the batch remainder and reduced gradients on one device): delete "
    "it once nothing imports it"
)
MSG_MP_KEPT = (
    "this local make_parallel is still called here: {why}, so its calls were left alone; "
    "switch them to {new} by hand (this one "
    "dropped the batch remainder and reduced gradients on one device)"
)
MSG_MGM_VENDORED = (
    "this local multi_gpu_model looks like a copy of Keras's multi_gpu_model (removed in "
    "TF 2.4): kerasmgpu.legacy.multi_gpu_model replaces it with the same signature, so "
    "callers can `from kerasmgpu.legacy import multi_gpu_model` instead; delete this copy "
    "once nothing imports it"
)
MSG_MGM_VENDORED_IMPORT = (
    "multi_gpu_model imported from {module}, which is not Keras: this looks like a vendored "
    "copy of Keras's multi_gpu_model (removed in TF 2.4), left alone because it may have been "
    "modified; if it is a plain copy, switch to `from kerasmgpu.legacy import multi_gpu_model` "
    "(same signature)"
)
MSG_GET_SLICE = (
    "get_slice is keras-extras' batch splitter for make_parallel; kerasmgpu splits batches "
    "itself and keeps the remainder, so it can go once make_parallel does"
)
MSG_MP_IMPORT = (
    "make_parallel imported from {module}: if that is keras-extras' make_parallel (it dropped "
    "the batch remainder and reduced gradients on one device), import it from "
    "kerasmgpu.legacy instead"
)
MSG_MGM_STAR = (
    "multi_gpu_model is used but only a star import of {module} can provide it, and TF 2.4 "
    "removed it there: add `from kerasmgpu.legacy import multi_gpu_model` after this line"
)
MSG_MP_LOAD = (
    "{receiver}.load_weights loads into what make_parallel returned: a weight file saved from "
    "keras-extras' make_parallel holds its wrapper's layout (the template nested as one "
    "layer), which kerasmgpu does not build (for gpu_count=1 it returns the template "
    "itself), so the file may not load, and by_name=True silently loads none of it into the "
    "template; {action}convert it once where the old code runs (load it into the old "
    "wrapper, save the template's weights) and load that file into the template before "
    "parallelizing"
)
MSG_GONE = (
    "{module} does not exist in TF >= 2.4 or Keras 3, so this import fails there; "
    "kerasmgpu.legacy provides multi_gpu_model: drop this import once nothing uses it"
)
MSG_GONE_REMOVED = (
    "import of {module} removed: it does not exist in TF >= 2.4 or Keras 3, and its "
    "multi_gpu_model calls now go to kerasmgpu"
)
MSG_PRIVATE = (
    "{name} is a private helper of Keras 2.3's {module}, which does not exist in TF >= 2.4 "
    "or Keras 3: {advice}"
)
PRIVATE_ADVICE = {
    "_get_available_devices": (
        "list devices with tf.config.list_logical_devices() (names like "
        "'/device:GPU:0'), or count GPUs with len(tf.config.list_physical_devices('GPU')); "
        "kerasmgpu.parallelize(model) with gpus=None uses every visible GPU by itself"
    ),
    "_normalize_device_name": (
        "it lower-cased TF 1 device names ('/job:.../device:GPU:0' -> '/gpu:0'); "
        "kerasmgpu takes GPU ids (gpus=[0, 3]), no names"
    ),
    "get_slice": "kerasmgpu splits each batch itself and keeps the remainder: drop it",
}
MSG_KERAS23_SHIM = (
    "{line} removed: kerasmgpu.keras23 patches Keras 2.3.1 to run on Python 3.9+ and raises on "
    "any other Keras"
)
MSG_KERAS23_ADDED = (
    "import kerasmgpu.keras23 added at the top (after the docstring and `from __future__` "
    "lines): Keras 2.3.1 imports on Python 3.9+ only with it, and it must come before "
    "`import keras`"
)
MSG_MGM_UNRESOLVED = (
    "`{expr}` could not be traced to an import of keras or tensorflow, so it was left alone; "
    "if it is Keras' multi_gpu_model (removed in TF 2.4), call "
    "kerasmgpu.parallelize(model, gpus=N) instead"
)


class MultiGpuRule(MultiGpuAdvice):
    NAME = "multi_gpu"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.mentions_parallel = "make_parallel" in ctx.source or _MGM in ctx.source
        self.import_targets: List[cst.ImportFrom] = []
        self.references: List[cst.BaseExpression] = []  # every use of Keras's multi_gpu_model
        self.gone_imports: List[Tuple[cst.CSTNode, str, Optional[str]]] = []
        self.star_lines: List[Tuple[cst.CSTNode, str]] = []
        self.binds_mgm = False
        self.defines_mgm = False
        self.uses_bare_mgm = False
        self.get_slices: List[cst.CSTNode] = []
        self.mp_defs: List[Tuple[cst.FunctionDef, Optional[str], List[cst.Name]]] = []
        # Code of the targets assigned a make_parallel result (`parallel`, `self.pmodel`),
        # and every `.load_weights(` call, matched after the visit since a method may load
        # before the line that assigns comes in the file.
        self.parallel_results: Set[str] = set()
        self.weight_loads: List[Tuple[cst.CSTNode, str, bool]] = []
        self.in_import = 0
        self.keras_import: Optional[cst.CSTNode] = None  # the file's first Keras import
        self.shim: Optional[cst.CSTNode] = None  # its `import kerasmgpu.keras23`
        self.trains_here = False  # compiles or trains at module level, or has __main__

    # -- imports ------------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        self.in_import += 1
        names = [nodes.dotted(a.name) or "" for a in node.names]
        self.keras23_shim(node, names)
        self.note_keras_import(node, names)
        for alias in node.names:
            imported = nodes.dotted(alias.name) or ""
            if imported in GONE_MODULES:
                local = nodes.dotted(alias.asname.name) if alias.asname else None
                self.gone_imports.append((node, imported, local))

    def leave_Import(self, original_node: cst.Import) -> None:
        self.in_import -= 1

    def keras23_shim(self, node: cst.CSTNode, names: List[str]) -> None:
        """`import kerasmgpu.keras23`: the Keras 2.3 runtime patches go with Keras 2.3."""
        if self.ctx.target.modern and "kerasmgpu.keras23" in names and len(names) == 1:
            self.ctx.edit(node, _remove_statement)
            self.info(node, MSG_KERAS23_SHIM.format(line=self.ctx.code(node)))

    def note_keras_import(self, node: cst.CSTNode, modules: List[str]) -> None:
        if "kerasmgpu.keras23" in modules and self.shim is None:
            self.shim = node
        if self.keras_import is None and any(m == "keras" or m.startswith("keras.")
                                             for m in modules):
            self.keras_import = node

    def visit_If(self, node: cst.If) -> None:
        if "__main__" in self.ctx.code(node.test) and "__name__" in self.ctx.code(node.test):
            self.trains_here = True

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.in_import += 1
        module_name = nodes.module_of(node)
        shim = [f"kerasmgpu.{nodes.dotted(a.name)}" for a in node.names] if (
            module_name == "kerasmgpu" and not isinstance(node.names, cst.ImportStar)) else []
        self.note_keras_import(node, [module_name, *shim])
        if module_name == "kerasmgpu" and not isinstance(node.names, cst.ImportStar):
            self.keras23_shim(node, [f"kerasmgpu.{nodes.dotted(a.name)}" for a in node.names])
        if isinstance(node.names, cst.ImportStar):
            if module_name in MULTI_GPU_MODEL_MODULES:
                self.star_lines.append((node, module_name))
            return
        for alias in node.names:
            self.imported_name(node, module_name, alias)

    def imported_name(self, node: cst.ImportFrom, module_name: str,
                      alias: cst.ImportAlias) -> None:
        imported = nodes.dotted(alias.name) or ""
        local = nodes.dotted(alias.asname.name) if alias.asname else imported
        if module_name in GONE_MODULES and imported != _MGM:
            self.gone_names(node, module_name, imported)
        elif f"{module_name}.{imported}" in GONE_MODULES:
            self.gone_imports.append((node, f"{module_name}.{imported}", local))
        if imported == _MGM:
            self.binds_mgm = True
            if module_name in MULTI_GPU_MODEL_MODULES:
                if node not in self.import_targets:
                    self.import_targets.append(node)
            elif nodes.dotted(node.module) is None or module_name.split(".")[0] not in (
                    _FRAMEWORK_PACKAGES):
                self.warning(node, MSG_MGM_VENDORED_IMPORT.format(module=module_name))
        elif imported == "make_parallel" and module_name != _LEGACY:
            self.warning(node, MSG_MP_IMPORT.format(module=module_name))

    def gone_names(self, node: cst.ImportFrom, module_name: str, imported: str) -> None:
        """`from keras.utils.multi_gpu_utils import get_slice`: it outlives the rewrite."""
        if self.ctx.target.modern:
            advice = PRIVATE_ADVICE.get(imported, "copy what you need of it into your code")
            self.error(node, MSG_PRIVATE.format(name=imported, module=module_name,
                                                advice=advice))
        else:
            self.info(node, MSG_GONE.format(module=module_name))

    def leave_ImportFrom(self, original_node: cst.ImportFrom) -> None:
        self.in_import -= 1

    # -- references to multi_gpu_model ----------------------------------------------
    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self.in_import or not self.ctx.is_load(node):
            return  # `keras.utils.multi_gpu_model = ...` patches Keras; not ours to move
        names = self.ctx.qualified(node)
        if node.attr.value == _MGM:
            if names & _MGM_QUALIFIED:
                self.references.append(node)
            elif not any(name.startswith(_LEGACY + ".") for name in names):
                expr = self.ctx.code(node)
                self.warning(node, MSG_MGM_UNRESOLVED.format(expr=expr))
            return
        for name in names:
            module, _, attr = name.rpartition(".")
            if module in GONE_MODULES and attr.startswith("_"):
                self.gone_names_used(node, module, attr)

    def gone_names_used(self, node: cst.CSTNode, module: str, attr: str) -> None:
        advice = PRIVATE_ADVICE.get(attr, "copy what you need of it into your code")
        message = MSG_PRIVATE.format(name=attr, module=module, advice=advice)
        if self.ctx.target.modern:
            self.error(node, message)
        else:
            self.info(node, message)

    def visit_Name(self, node: cst.Name) -> None:
        if node.value != _MGM and not self.ctx.qualified(node) & _MGM_QUALIFIED:
            return
        if self.in_import:
            return
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            return  # the `.multi_gpu_model` of an attribute: visit_Attribute's business
        if not self.ctx.is_load(node):
            return
        if node.value == _MGM:
            self.uses_bare_mgm = True
        if self.ctx.qualified(node) & _MGM_QUALIFIED:
            self.references.append(node)

    # -- local definitions -----------------------------------------------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        name = node.name.value
        self.functions.append(name)
        if name == "get_slice" and self.mentions_parallel and _MGM not in self.functions[:-1]:
            # Decided after the visit: beside a copy of Keras's multi_gpu_model it is
            # Keras's splitter, whichever comes first in the file.
            self.get_slices.append(node.name)
        if name == _MGM:
            self.defines_mgm = True
            if self.ctx.target.modern:
                self.warning(node.name, MSG_MGM_VENDORED)
            else:
                self.info(node.name, MSG_MGM_VENDORED)
        if name == "make_parallel":
            why, accesses = self.make_parallel_accesses(node)
            self.mp_defs.append((node, why, accesses))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.functions.pop()

    def make_parallel_accesses(
        self, node: cst.FunctionDef
    ) -> Tuple[Optional[str], List[cst.Name]]:
        """The names that refer to this def, or why its calls cannot be moved safely."""
        scope = self.ctx.scopes.get(node)
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
                parent = self.ctx.parent(access.node)
                if isinstance(parent, cst.Call) and parent.func is access.node:
                    if not _two_plain_arguments(parent):
                        return "a call does not pass exactly (model, gpu_count)", []
                names.append(access.node)
        return None, names

    # -- assignments and calls (the batch advice is MultiGpuAdvice's) -----------------
    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            if self.gpuish(node.value):  # G = args["gpus"]; n = len(gpu_ids)
                self.gpu_names.add(node.targets[0].target.value)
        for target in node.targets:
            self.check_batch(node, target.target, node.value)
            if _is_make_parallel_call(node.value):
                self.parallel_results.add(self.ctx.code(target.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self.check_batch(node, node.target, node.value)
            if _is_make_parallel_call(node.value):
                self.parallel_results.add(self.ctx.code(node.target))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (isinstance(func, cst.Attribute) and func.attr.value in _TRAINS
                and not self.functions):
            self.trains_here = True  # a script: it trains at module level
        if isinstance(func, cst.Attribute) and func.attr.value == "load_weights":
            receiver = self.ctx.code(func.value)
            self.weight_loads.append((func.attr, receiver, _is_make_parallel_call(func.value)))

    # -- decisions ---------------------------------------------------------------------
    def keras23_runtime(self) -> None:
        """`--to keras23`: a script that imports Keras 2.3 needs `import kerasmgpu.keras23`
        before it, after the docstring and `from __future__` lines (which must come first)."""
        if self.ctx.target.modern or self.keras_import is None or not self.trains_here:
            return
        if self.shim is not None and (self.ctx.position(self.shim) <
                                      self.ctx.position(self.keras_import)):
            return
        self.ctx.preamble.append("import kerasmgpu.keras23")
        self.info(self.keras_import, MSG_KERAS23_ADDED)
        if self.shim is not None:  # after `import keras` it raises TooLateError
            self.ctx.edit(self.shim, _remove_statement)

    def finish(self) -> None:
        self.keras23_runtime()
        loads = [(node, receiver) for node, receiver, direct in self.weight_loads
                 if direct or receiver in self.parallel_results]
        self.finish_make_parallel(loads)
        kept_locals = self.rewrite_references()
        self.rewrite_imports(kept_locals)
        self.finish_gone_imports()
        if not self.defines_mgm or "make_parallel" in self.ctx.source:
            for node in self.get_slices:
                self.info(node, MSG_GET_SLICE)
        if self.uses_bare_mgm and not self.binds_mgm:
            for node, module in self.star_lines:
                message = MSG_MGM_STAR.format(module=module)
                if self.ctx.target.modern:
                    self.error(node, message)
                else:
                    self.info(node, message)

    def finish_make_parallel(self, loads: List[Tuple[cst.CSTNode, str]]) -> None:
        modern = self.ctx.target.modern
        new = "kerasmgpu.parallelize(model, gpus=gpu_count)" if modern else (
            "kerasmgpu.legacy.make_parallel(model, gpu_count)")
        local_loads = [(n, r) for n, r in loads if self.mp_defs]
        for node, why, accesses in self.mp_defs:
            if why is None and local_loads:
                why = "a weight file is loaded into what it returns"
            if why is not None:
                report = self.error if modern else self.warning
                report(node.name, MSG_MP_KEPT.format(why=why, new=new))
                continue
            for name in accesses:
                self.rewrite_make_parallel(name)
            self.info(node.name, MSG_MP_REPLACED.format(new=new))
        action = "it was left unchanged: " if local_loads else ""
        for node, receiver in loads:
            self.error(node, MSG_MP_LOAD.format(receiver=receiver, action=action))

    def rewrite_make_parallel(self, name: cst.Name) -> None:
        parent = self.ctx.parent(name)
        if self.ctx.target.modern and isinstance(parent, cst.Call) and parent.func is name:
            self.ctx.edit(parent, _to_parallelize)
            self.ctx.need_import("kerasmgpu", name)
            return
        self.ctx.replace(name, nodes.attr_chain("kerasmgpu.legacy.make_parallel"))
        self.ctx.need_import("kerasmgpu.legacy", name)

    def rewrite_references(self) -> Set[str]:
        """Rewrite every use of multi_gpu_model; the bare names still needing an import."""
        kept: Set[str] = set()
        for node in self.references:
            if self.ctx.target.modern and wrappers.inside_wrapper(self.ctx, node):
                continue  # a ModelMGPU the wrappers family replaces whole
            parent = self.ctx.parent(node)
            is_call = isinstance(parent, cst.Call) and parent.func is node
            if self.ctx.target.modern and is_call and _mgm_call_fits(parent):
                dropped = _dropped_flags(parent)
                self.ctx.edit(parent, _to_parallelize)
                self.ctx.need_import("kerasmgpu", node)
                self.info(node, MSG_PARALLELIZE.format(old=self.ctx.code(node), dropped=dropped))
                continue
            if isinstance(node, cst.Name):
                kept.add(node.value)  # the import below provides it
                continue
            self.ctx.replace(node, nodes.attr_chain(f"{_LEGACY}.{_MGM}"))
            self.ctx.need_import(_LEGACY, node)
            why = "" if not self.ctx.target.modern else (
                ": not a plain call, so kept on the Keras 2.3 signature")
            self.info(node, MSG_SHIM.format(old=self.ctx.code(node), why=why))
        return kept

    def rewrite_imports(self, kept_locals: Set[str]) -> None:
        for node in self.import_targets:
            assert not isinstance(node.names, cst.ImportStar)  # never picked
            locals_ = {_local(alias) for alias in node.names
                       if nodes.dotted(alias.name) == _MGM}
            if self.ctx.target.modern and not locals_ & kept_locals:
                self.drop_mgm_import(node)
            else:
                parent = self.ctx.parent(node)
                self.ctx.edit(node, _swap_mgm_module)
                if isinstance(parent, cst.SimpleStatementLine):
                    self.ctx.edit(parent, _split_legacy_import)
                elif isinstance(parent, cst.SimpleStatementSuite):
                    self.ctx.edit(parent, _split_legacy_suite)
                if not self.ctx.target.modern:
                    self.info(node, f"multi_gpu_model now comes from {_LEGACY}")

    def drop_mgm_import(self, node: cst.ImportFrom) -> None:
        """libcst's RemoveImportsVisitor drops multi_gpu_model once no use is left, from
        the line as the imports family respells it (the module can move on the target)."""
        module = nodes.module_of(node) or ""
        canonical = canonical_keras_name(module)
        spellings = {module} if canonical is None else {
            module, spell(MODULE_MOVES.get(canonical, canonical), self.ctx.target)}
        for alias in node.names if not isinstance(node.names, cst.ImportStar) else ():
            if nodes.dotted(alias.name) == _MGM:
                asname = nodes.dotted(alias.asname.name) if alias.asname else None
                for spelled in sorted(spellings):
                    RemoveImportsVisitor.remove_unused_import(self.ctx.codemod, spelled,
                                                              _MGM, asname)

    def finish_gone_imports(self) -> None:
        """Imports of multi_gpu_utils / training_utils (gone in TF >= 2.4, Keras 3)."""
        for node, module, local in self.gone_imports:
            if not self.ctx.target.modern:
                self.info(node, MSG_GONE.format(module=module))
                continue
            if self.only_rewritten_uses(node, local):
                self.ctx.edit(node, functools.partial(_drop_gone_import, module=module))
                self.info(node, MSG_GONE_REMOVED.format(module=module))
            else:
                self.error(node, MSG_GONE.format(module=module))

    def only_rewritten_uses(self, node: cst.CSTNode, local: Optional[str]) -> bool:
        """Whether every use of what `node` binds goes through a rewritten multi_gpu_model."""
        if local is None:  # `import keras.utils.multi_gpu_utils`: binds `keras`, kept as such
            return True
        scope = self.ctx.scopes.get(node)
        if scope is None:
            return False
        rewritten = {id(ref) for ref in self.references if isinstance(ref, cst.Attribute)}
        for assignment in scope.assignments[local]:
            if getattr(assignment, "node", None) is not node:
                continue
            for access in assignment.references:
                parent = self.ctx.parent(access.node)
                if id(parent) not in rewritten:
                    return False
        return True


RULE = MultiGpuRule


# --------------------------------------------------------------------------------------
# Pure helpers


def _local(alias: cst.ImportAlias) -> str:
    return nodes.dotted(alias.asname.name if alias.asname else alias.name) or ""


def _is_make_parallel_call(node: cst.CSTNode) -> bool:
    """`make_parallel(...)` or `X.make_parallel(...)`: the old one, a copy, or kerasmgpu's."""
    name = m.Name("make_parallel")
    return m.matches(node, m.Call(func=name | m.Attribute(attr=name)))


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
