"""Moved modules and the target's package: every Keras import reaches the target's Keras.

`--to keras3` / `--to tf_keras`:

* Modules Keras 2.3 had and modern Keras folded into a public one: `keras.layers.core`,
  `.merge`, `.convolutional`, ... -> `keras.layers`; `keras.utils.np_utils`, `.data_utils`,
  `.generic_utils`, `.vis_utils`, ... -> `keras.utils`; `keras.engine.*` -> `keras.layers`
  (Layer, InputSpec, Input) / `keras.models` (Model, Sequential, load_model);
  `keras.callbacks.callbacks` -> `keras.callbacks`; `keras.objectives` -> `keras.losses`;
  `keras.applications.mobilenetv2` -> `.mobilenet_v2`; `keras.backend.tensorflow_backend`
  -> `keras.backend`. An import naming several of them is split, one line per module.
* Names renamed with the same behaviour: `Network` -> `Model`, the lower-case optimizer,
  initializer and constraint aliases (`adam` -> `Adam`, `normal` -> `RandomNormal`,
  `maxnorm` -> `MaxNorm`), loss aliases Keras 3 dropped (`mse` -> `mean_squared_error`).
  Their uses in the file are renamed with them.
* The package: `--to tf_keras` writes `import tf_keras as keras`, `from tf_keras.layers
  import ...`, `tf_keras.layers.Dense` for `tf.keras.layers.Dense`; `--to keras3` writes
  `keras` for every spelling (`tensorflow.keras`, TensorFlow's internal path...). Why
  explicit imports rather than TF_USE_LEGACY_KERAS=1: the variable must be set before
  TensorFlow is first imported, in every process (tests, notebooks, workers), and it does
  not touch `import keras`, which stays Keras 3; an import says what it means wherever the
  module runs. (Libraries the project uses that call `tf.keras` themselves still need the
  variable; that is their business, and `kerasmgpu doctor` says so.)
* Names modern Keras does not have (`LocallyConnected2D` on Keras 3, `HDF5Matrix`,
  `keras.wrappers.scikit_learn`, `Tokenizer`...) stay, with an ERROR that names the
  replacement. Names another family rewrites away (`set_session`, `multi_gpu_model`,
  `merge`, `ImageDataGenerator`) are theirs.

The tables (where each name of Keras 2.3 lives on each target, what is gone) are in
`import_tables.py`; this module reads them and rewrites the file's imports and uses.
"""

from __future__ import annotations

import functools
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

import libcst as cst

from kerasmgpu.adapters.keras23_names import KERAS_PACKAGE_ALIASES
from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Rule, canonical_keras_name
from kerasmgpu.migrate.import_tables import (
    GONE_ADVICE,
    KERAS3_NAME_MOVES,
    MODULE_MOVES,
    NAME_MOVES,
    OWNED_ELSEWHERE,
    SIX_MOVES,
    locate,
    package,
    spell,
)
from kerasmgpu.migrate.report import Target

MSG_MOVED = "{old} -> {new} (where {target} has {it})"
MSG_GONE = "{name} does not exist in {target}: {advice}"
MSG_PACKAGE = "{old} -> {new}: the file reaches {target} explicitly ({why})"
WHY_PACKAGE = {
    Target.KERAS3: "so it runs on the JAX and PyTorch backends too, and TF_USE_LEGACY_KERAS "
    "cannot switch it to tf_keras",
    Target.TF_KERAS: "no TF_USE_LEGACY_KERAS needed: `import keras` would be Keras 3",
}
MSG_UNUSED_GONE = (
    "{name} removed from the import: {target} does not have it, and this file never uses "
    "it (the import only made the file fail)"
)


def target_label(target: Target) -> str:
    return "Keras 3" if target is Target.KERAS3 else "tf_keras"


class ImportsRule(Rule):
    NAME = "imports"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.gone: List[Tuple[cst.CSTNode, str, str, Optional[str]]] = []
        self.renamed: Set[str] = set()
        self.keras_imports: List[cst.ImportFrom] = []
        self.foreign = frozenset(a for a in KERAS_PACKAGE_ALIASES if a != package(ctx.target))
        self.unused: Set[str] = set()

    # -- `from M import a, b` -------------------------------------------------------------
    def drop_unused_gone(self) -> None:
        """A name the target lacks that the file imports but never uses: the import goes
        (it only made the file fail to import)."""
        for node, _, _, local in self.gone:
            scope = self.ctx.scopes.get(node)
            if local is None or scope is None or local in self.ctx.claimed:
                continue
            # Spelled once in the whole file: not used, not in __all__ or a string either.
            if not any(a.references for a in scope.assignments[local]) and (
                    self.ctx.source.count(local) == 1):
                self.unused.add(local)
                self.ctx.claimed.add(local)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if id(node) in self.ctx.owned:
            return
        module = nodes.module_of(node)
        if module == "six.moves" and self.six_moves(node):
            return
        if self.package_from(node, module):
            return
        canonical = canonical_keras_name(module) if module else None
        if canonical is None or isinstance(node.names, cst.ImportStar):
            if canonical is not None and module != spell(MODULE_MOVES.get(canonical, canonical),
                                                          self.ctx.target):
                self.ctx.edit(node, functools.partial(_respell_star, target=self.ctx.target))
                self.info(node, MSG_MOVED.format(
                    old=module, new=spell(MODULE_MOVES.get(canonical, canonical),
                                          self.ctx.target),
                    target=target_label(self.ctx.target), it="them"))
            return
        self.keras_imports.append(node)
        places: Dict[str, Tuple[str, str]] = {}
        for alias in node.names:
            name = nodes.dotted(alias.name) or ""
            if name in OWNED_ELSEWHERE:  # the module still moves; the name is theirs
                places[name] = (MODULE_MOVES.get(canonical, canonical), name)
                continue
            if f"{canonical}.{name}" in MODULE_MOVES:  # `from keras.utils import np_utils`
                places[name] = _module_alias(f"{canonical}.{name}")
                continue
            where = locate(canonical, name, self.ctx.target)
            if where is None:
                local = nodes.dotted(alias.asname.name) if alias.asname else name
                self.gone.append((node, canonical, name, local))
                continue
            places[name] = where
            if where[1] != name and alias.asname is None:
                self.rename_uses(node, name, where[1])
        if not places:
            return  # every name is gone here (finish reports them)
        new_modules = {spell(m, self.ctx.target) for m, _ in places.values()}
        if new_modules == {module} and all(n == w[1] for n, w in places.items()):
            return
        self.ctx.edit(node, functools.partial(_rewrite_from, target=self.ctx.target,
                                              claimed=self.ctx.claimed))
        if len(new_modules) > 1:
            parent = self.ctx.parent(node)
            if isinstance(parent, cst.SimpleStatementLine):
                self.ctx.edit(parent, _split_line)
        if not all(name in OWNED_ELSEWHERE for name in places):
            self.report_moves(node, module, sorted(new_modules), places)

    def six_moves(self, node: cst.ImportFrom) -> bool:
        """`from six.moves import range`: Keras 2.3 brought `six`, modern Keras does not."""
        if isinstance(node.names, cst.ImportStar):
            return False
        names = [nodes.dotted(alias.name) or "" for alias in node.names]
        if not all(n in SIX_MOVES for n in names) or any(a.asname for a in node.names
                                                         if SIX_MOVES[nodes.dotted(a.name)
                                                                      or ""] is None):
            return False
        self.ctx.edit(node, _six_moves)
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.SimpleStatementLine):
            self.ctx.edit(parent, _split_line)
        self.info(node, "from six.moves import ... -> Python 3's own names: Keras 2.3 "
                  "installed six, modern Keras does not")
        return True

    def package_from(self, node: cst.ImportFrom, module: str) -> bool:
        """`from tensorflow import keras [as k]` -> `import keras [as k]` / `import tf_keras as k`."""
        if isinstance(node.names, cst.ImportStar) or not module or module.startswith("."):
            return False
        packages = [alias for alias in node.names
                    if f"{module}.{nodes.dotted(alias.name)}" in self.foreign]
        if not packages:
            return False
        parent = self.ctx.parent(node)
        if not isinstance(parent, cst.SimpleStatementLine):
            return False
        self.ctx.edit(node, functools.partial(_package_from, target=self.ctx.target,
                                              foreign=self.foreign))
        self.ctx.edit(parent, _split_line)
        for alias in packages:
            local = (nodes.dotted(alias.asname.name) if alias.asname else None) or "keras"
            new = _as(package(self.ctx.target), local)
            self.info(node, MSG_PACKAGE.format(
                old=f"from {module} import {self.ctx.code(alias).rstrip(', ')}",
                new=f"import {new}", target=target_label(self.ctx.target),
                why=WHY_PACKAGE[self.ctx.target]))
        return True

    def report_moves(self, node: cst.ImportFrom, module: str, new_modules: List[str],
                     places: Dict[str, Tuple[str, str]]) -> None:
        label = target_label(self.ctx.target)
        new = ", ".join(new_modules)
        if [module] != new_modules:
            if canonical_keras_name(module) in MODULE_MOVES or len(new_modules) > 1:
                self.info(node, MSG_MOVED.format(old=module, new=new, target=label,
                                                 it="them"))
            else:
                self.info(node, MSG_PACKAGE.format(old=module, new=new, target=label,
                                                   why=WHY_PACKAGE[self.ctx.target]))
        renames = [f"{old} -> {new}" for old, (_, new) in places.items() if old != new
                   and f"{canonical_keras_name(module)}.{old}" not in MODULE_MOVES]
        if renames:
            self.info(node, f"renamed, same behaviour: {', '.join(renames)}")

    def rename_uses(self, node: cst.ImportFrom, old: str, new: str) -> None:
        """`Network(...)` -> `Model(...)` wherever the file uses the imported name."""
        scope = self.ctx.scopes.get(node)
        if scope is None:
            return
        self.renamed.add(old)
        for assignment in scope.assignments[old]:
            if getattr(assignment, "node", None) is not node:
                continue
            for access in assignment.references:
                if isinstance(access.node, cst.Name):
                    self.ctx.replace(access.node, cst.Name(new))

    # -- `import M [as a]` ----------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        changed = False
        for alias in node.names:
            name = nodes.dotted(alias.name) or ""
            canonical = canonical_keras_name(name)
            if canonical is None:
                continue
            new = _import_spelling(name, canonical, alias.asname is not None, self.ctx.target)
            if new != name:
                changed = True
                label = target_label(self.ctx.target)
                if canonical in MODULE_MOVES:
                    self.info(node, MSG_MOVED.format(old=f"import {name}", new=f"import {new}",
                                                     target=label, it="it"))
                else:
                    self.info(node, MSG_PACKAGE.format(old=f"import {name}", new=f"import {new}",
                                                       target=label,
                                                       why=WHY_PACKAGE[self.ctx.target]))
        if changed:
            self.ctx.edit(node, functools.partial(_rewrite_import, target=self.ctx.target))

    # -- `tf.keras.layers.core.Dense`, `keras.utils.np_utils.to_categorical` --------------
    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self.ctx.is_removed(node):
            return
        names = self.ctx.qualified(node)
        if names & self.foreign and _is_module_chain(node):
            # `tf.keras` -> `keras` / `tf_keras`: the head of a longer chain.
            new = self.ctx.keras_module(node)
            self.ctx.replace(node, cst.Name(new))
            self.info(node, MSG_PACKAGE.format(old=self.ctx.code(node), new=new,
                                               target=target_label(self.ctx.target),
                                               why=WHY_PACKAGE[self.ctx.target]))
            return
        for name in names:
            canonical = canonical_keras_name(name)
            if canonical is None or "." not in canonical:
                continue
            module, _, attr = canonical.rpartition(".")
            if module not in MODULE_MOVES and not any(
                    k[0] == module for k in (*NAME_MOVES, *KERAS3_NAME_MOVES)):
                continue
            if self.bound_alias_covers(node, module, attr):
                return
            where = locate(module, attr, self.ctx.target)
            if where is None:
                if attr not in OWNED_ELSEWHERE:
                    self.gone.append((node, module, attr, None))
                return
            if where == (module, attr):
                continue  # nothing moved (`keras.layers.core` itself is a module name)
            new_module, new_attr = where
            base = self.ctx.keras_module(node)
            path = f"{base}{new_module[len('keras'):]}.{new_attr}"
            self.ctx.replace(node, nodes.attr_chain(path))
            self.info(node, MSG_MOVED.format(old=self.ctx.code(node), new=path, target=target_label(self.ctx.target), it="it"))
            return

    def bound_alias_covers(self, node: cst.Attribute, module: str, attr: str) -> bool:
        """`KE.Layer` after `import keras.engine as KE`: the import's rewrite covers it."""
        if not isinstance(node.value, cst.Name):
            return False
        if self.ctx.bindings.get(node.value.value) is None:
            return False
        bound = canonical_keras_name(self.ctx.bindings[node.value.value])
        if bound != module:
            return False
        where = locate(module, attr, self.ctx.target)
        return where is not None and where == (MODULE_MOVES.get(module, module), attr)

    def finish(self) -> None:
        self.drop_unused_gone()
        for node in self.keras_imports:
            if node not in self.ctx.edits and any(
                    _local(alias) in self.ctx.claimed for alias in node.names):
                self.ctx.edit(node, functools.partial(_rewrite_from, target=self.ctx.target,
                                                      claimed=self.ctx.claimed))
        label = target_label(self.ctx.target)
        for node, module, name, local in self.gone:
            if local is not None and local in self.unused:
                self.info(node, MSG_UNUSED_GONE.format(name=f"{module}.{name}", target=label))
                continue
            if local is not None and local in self.ctx.claimed:
                continue
            advice = GONE_ADVICE.get(name, "remove it or replace it by hand")
            self.error(node, MSG_GONE.format(name=f"{module}.{name}", target=label,
                                             advice=advice))


RULE = ImportsRule


# --------------------------------------------------------------------------------------
# Edits


def _module_alias(old: str) -> Tuple[str, str]:
    """(parent, leaf) of where the moved module `old` is now: keras.utils.np_utils ->
    (keras, utils), imported as `from keras import utils as np_utils`."""
    parent, _, leaf = MODULE_MOVES[old].rpartition(".")
    return parent, leaf


def _same(a: cst.ImportAlias, b: cst.ImportAlias) -> bool:
    return nodes.dotted(a.name) == nodes.dotted(b.name) and _local(a) == _local(b)


def _local(alias: cst.ImportAlias) -> str:
    return nodes.dotted(alias.asname.name if alias.asname else alias.name) or ""


def _six_moves(updated: cst.CSTNode) -> cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel:
    assert isinstance(updated, cst.ImportFrom) and not isinstance(updated.names, cst.ImportStar)
    lines = [SIX_MOVES[nodes.dotted(alias.name) or ""] for alias in updated.names]
    statements = [cst.parse_statement(line + "\n").body[0] for line in lines if line]
    if not statements:
        return cst.RemovalSentinel.REMOVE
    return statements[0] if len(statements) == 1 else cst.FlattenSentinel(statements)


def _as(module: str, local: str) -> str:
    return module if module == local else f"{module} as {local}"


def _package_from(updated: cst.CSTNode, target: Target, foreign: FrozenSet[str]
                  ) -> cst.BaseSmallStatement | cst.FlattenSentinel:
    assert isinstance(updated, cst.ImportFrom) and not isinstance(updated.names, cst.ImportStar)
    module = nodes.module_of(updated)
    kept: List[cst.ImportAlias] = []
    added: List[cst.BaseSmallStatement] = []
    for alias in updated.names:
        if f"{module}.{nodes.dotted(alias.name)}" not in foreign:
            kept.append(alias)
            continue
        local = (nodes.dotted(alias.asname.name) if alias.asname else None) or "keras"
        added.append(cst.parse_statement(f"import {_as(package(target), local)}\n").body[0])
    if not kept:
        return added[0] if len(added) == 1 else cst.FlattenSentinel(added)
    rest = _plain(updated.with_changes(names=kept))
    return cst.FlattenSentinel([rest, *added])


def _is_module_chain(node: cst.Attribute) -> bool:
    return isinstance(node.value, (cst.Name, cst.Attribute))


def _import_spelling(name: str, canonical: str, aliased: bool, target: Target) -> str:
    """What `import name` becomes; without `as`, the bound head name must stay."""
    module = MODULE_MOVES.get(canonical, canonical)
    new = spell(module, target)
    if aliased:
        return new
    head = name.split(".")[0]
    if target is Target.TF_KERAS:
        return f"tf_keras as {head}" if head == "keras" else name
    if head == "keras":
        return new if module == canonical else "keras"
    return name  # `import tensorflow.keras...` binds `tensorflow`: left as it is


def _rewrite_import(updated: cst.CSTNode, target: Target) -> cst.CSTNode:
    assert isinstance(updated, cst.Import)
    names: List[cst.ImportAlias] = []
    for alias in updated.names:
        name = nodes.dotted(alias.name) or ""
        canonical = canonical_keras_name(name)
        if canonical is None:
            names.append(alias)
            continue
        new = _import_spelling(name, canonical, alias.asname is not None, target)
        if " as " in new:
            module, _, local = new.partition(" as ")
            names.append(alias.with_changes(
                name=nodes.attr_chain(module),
                asname=cst.AsName(name=cst.Name(local))))
        else:
            names.append(alias.with_changes(name=nodes.attr_chain(new)))
    return updated.with_changes(names=names)


def _respell_star(updated: cst.CSTNode, target: Target) -> cst.CSTNode:
    assert isinstance(updated, cst.ImportFrom)
    canonical = canonical_keras_name(nodes.module_of(updated)) or "keras"
    new = spell(MODULE_MOVES.get(canonical, canonical), target)
    return updated.with_changes(module=nodes.attr_chain(new))


def _rewrite_from(updated: cst.CSTNode, target: Target, claimed: Set[str]
                  ) -> cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel:
    """The import with each name from where it lives on `target`, split per module."""
    assert isinstance(updated, cst.ImportFrom) and not isinstance(updated.names, cst.ImportStar)
    module = nodes.module_of(updated)
    canonical = canonical_keras_name(module)
    if canonical is None:  # another family moved it (kerasmgpu.legacy)
        return updated
    groups: Dict[str, List[cst.ImportAlias]] = {}
    for alias in updated.names:
        name = nodes.dotted(alias.name) or ""
        local = nodes.dotted(alias.asname.name) if alias.asname else name
        if local in claimed:
            continue  # another family rewrote every use away
        if f"{canonical}.{name}" in MODULE_MOVES and name not in OWNED_ELSEWHERE:
            parent, leaf = _module_alias(f"{canonical}.{name}")
            renamed = alias.with_changes(name=cst.Name(leaf), asname=cst.AsName(
                name=cst.Name(local))) if leaf != local else alias.with_changes(
                name=cst.Name(leaf))
            groups.setdefault(spell(parent, target), []).append(renamed)
            continue
        where = None if name in OWNED_ELSEWHERE else locate(canonical, name, target)
        if where is None:  # gone (reported) or another family's: only the module moves
            where = (MODULE_MOVES.get(canonical, canonical), name)
        new_module, new_name = spell(where[0], target), where[1]
        renamed = alias.with_changes(name=cst.Name(new_name)) if new_name != name else alias
        group = groups.setdefault(new_module, [])
        if not any(_same(renamed, other) for other in group):  # `CuDNNGRU, GRU` -> `GRU`
            group.append(renamed)
    if not groups:
        return cst.RemovalSentinel.REMOVE
    statements: List[cst.ImportFrom] = []
    for new_module, aliases in groups.items():
        aliases = [*aliases[:-1], aliases[-1].with_changes(comma=_last_comma(updated))]
        statements.append(updated.with_changes(
            module=nodes.attr_chain(new_module), names=aliases,
            lpar=updated.lpar if len(groups) == 1 else None,
            rpar=updated.rpar if len(groups) == 1 else None))
    if len(statements) == 1:
        return statements[0]
    return cst.FlattenSentinel([_plain(s) for s in statements])


def _last_comma(updated: cst.ImportFrom) -> cst.Comma | cst.MaybeSentinel:
    names = updated.names
    assert not isinstance(names, cst.ImportStar)
    return names[-1].comma if updated.lpar else cst.MaybeSentinel.DEFAULT


def _plain(statement: cst.ImportFrom) -> cst.ImportFrom:
    """One line, no parentheses: a split import's parts are short."""
    names = list(statement.names) if not isinstance(statement.names, cst.ImportStar) else []
    flat = [alias.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            for alias in names[:-1]]
    flat.append(names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT))
    return statement.with_changes(names=flat, lpar=None, rpar=None)


def _split_line(updated: cst.CSTNode) -> cst.CSTNode | cst.FlattenSentinel:
    """A line holding several imports made from one: one line each."""
    assert isinstance(updated, cst.SimpleStatementLine)
    if len(updated.body) == 1:
        return updated
    lines = [updated.with_changes(body=[small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])
             for small in updated.body]
    lines[1:] = [line.with_changes(leading_lines=()) for line in lines[1:]]
    return cst.FlattenSentinel(lines)
