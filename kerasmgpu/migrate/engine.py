"""The codemod's machinery, on libcst's codemod framework.

`Migration` is a libcst `Codemod` (a `ContextAwareTransformer`). Within its
`transform_module` every rule family (one module each, a `ContextAwareVisitor`) reads the
*original* tree and records what to do through the shared `Context`, which holds the
`CodemodContext` the rules are built with: findings (`info`/`warning`/`error`), edits (a
function from the node as rewritten so far to its replacement, keyed by the original node)
and the imports its new code needs (`AddImportsVisitor.add_needed_import`). The codemod
then applies every edit bottom-up in one pass, so two families may edit nested nodes (an
optimizer inside a `compile` call inside a rewritten `fit_generator`) or even the same node
(their functions compose in family order); libcst's `AddImportsVisitor` adds the imports.
Recorded edits stay hand-built: libcst's transformers rewrite while they read, and a family
here must see the tree no other family has touched yet.

Imported only when the codemod runs (libcst is an optional dependency).
"""

from __future__ import annotations

import ast
import importlib
import warnings
from typing import (
    Callable,
    ClassVar,
    Dict,
    FrozenSet,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext, ContextAwareTransformer, ContextAwareVisitor
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import (
    ExpressionContext,
    ExpressionContextProvider,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from kerasmgpu.adapters.keras23_names import KERAS_PACKAGE_ALIASES
from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.report import (
    Finding,
    MigrationError,
    MigrationResult,
    Severity,
    Target,
    moved_lines,
)

# The rule families, in the order their edits compose on a shared node. tf_keras_imports
# comes last: it renames what the others left (`from keras.layers import ...`).
FAMILIES = (
    "multi_gpu",
    "wrappers",
    "generators",
    "optimizers",
    "keras1",
    "layers",
    "backend",
    "tf1",
    "saving",
    "losses",
    "image_data",
    "internals",
    "training",
    "trainable",
    "imports",
)

Replacement = Union[cst.CSTNode, cst.RemovalSentinel, cst.FlattenSentinel]
Edit = Callable[[cst.CSTNode], Replacement]


# What every rule reads; the codemod resolves it once for all of them.
METADATA = (PositionProvider, ParentNodeProvider, ScopeProvider, ExpressionContextProvider,
            QualifiedNameProvider)


class Context:
    """One file being migrated: its tree, metadata, and what the rules decided.

    `codemod` is the libcst `CodemodContext` of the run (its wrapper holds the tree the
    rules read, its scratch the imports `AddImportsVisitor` adds); this object adds what
    libcst has no place for: the findings, the recorded edits and the project's renames.
    """

    def __init__(self, codemod: CodemodContext, source: str, target: Target,
                 renamed_elsewhere: Optional[Mapping[str, Tuple[str, str]]] = None) -> None:
        wrapper = codemod.wrapper
        assert wrapper is not None, "built inside Migration.transform_module"
        self.codemod = codemod
        self.wrapper = wrapper
        self.module: cst.Module = wrapper.module
        self.source = source
        self.filename = codemod.filename or ""
        self.target = target
        self.positions = wrapper.resolve(PositionProvider)
        self.parents = wrapper.resolve(ParentNodeProvider)
        self.scopes = wrapper.resolve(ScopeProvider)
        self.contexts = wrapper.resolve(ExpressionContextProvider)
        self._qualified = wrapper.resolve(QualifiedNameProvider)
        self.findings: List[Finding] = []
        self.edits: Dict[cst.CSTNode, List[Edit]] = {}
        # index of the first top-level statement that needs an added import or definition:
        # the imports go after the import lines before it (`Migration.add_imports`)
        self.first_use: Optional[int] = None
        # module-level definitions a rewrite needs: they go after the imports, with them
        self.definitions: List[str] = []
        # statements for the top of the module: after its docstring and `from __future__`
        # imports, before anything else (`import kerasmgpu.keras23`)
        self.preamble: List[str] = []
        # A weight-file literal this file renames where it writes it -> (new, line), and
        # those other files of the project rename -> (new, "path:line"): other places
        # that spell it read that file (the saving family follows them).
        self.renamed: Dict[str, Tuple[str, int]] = {}
        self.renamed_elsewhere: Mapping[str, Tuple[str, str]] = renamed_elsewhere or {}
        # Imported names whose every use a family rewrites away (`set_session`): the import
        # family drops them instead of reporting them as gone.
        self.claimed: Set[str] = set()
        # id() of every node inside a statement a family removes: other families leave them.
        self.removed: Set[int] = set()
        # id() of import statements a family reported as gone with its fix: the import
        # family leaves them (a rename would hide the ERROR behind "moved").
        self.owned: Set[int] = set()
        self.star_modules = _star_imports(self.module)
        self.bindings = nodes.module_bindings(self.module)
        self._present_imports = {self.code(s).strip() for s in self.module.body
                                 if isinstance(s, cst.SimpleStatementLine)}

    # -- reading ------------------------------------------------------------------
    def position(self, node: cst.CSTNode) -> Tuple[int, int]:
        """(line, column), both 1-based."""
        start = self.positions[node].start
        return int(start.line), int(start.column) + 1

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.parents.get(node)

    def is_load(self, node: cst.CSTNode) -> bool:
        return self.contexts.get(node) is ExpressionContext.LOAD

    def qualified(self, node: cst.CSTNode) -> Set[str]:
        """Every dotted name `node` can refer to, through this file's imports.

        Only names and attributes: libcst also gives a call the callee's names, which would
        make `GRU(4)(x)` look like a second `GRU(...)`.
        """
        if not isinstance(node, (cst.Name, cst.Attribute)):
            return set()
        value = self._qualified.get(node, ())
        if callable(value):  # libcst computes qualified names lazily (LazyValue)
            value = value()
        names = {qn.name for qn in value}
        if not names and self.star_modules:
            names = self._through_star(node)
        return names

    def _through_star(self, node: cst.CSTNode) -> Set[str]:
        """`Dense` after `from keras.layers import *` (libcst does not follow star imports)."""
        head = node
        while isinstance(head, cst.Attribute):
            head = head.value
        if not isinstance(head, cst.Name) or not self.is_unbound(head):
            return set()
        dotted = nodes.dotted(node)
        return set() if dotted is None else {f"{m}.{dotted}" for m in self.star_modules}

    def is_unbound(self, name: cst.Name) -> bool:
        """Whether no assignment or import in reach binds this name (a builtin or a star)."""
        scope = self.scopes.get(name)
        if scope is None:
            return False
        return not scope.assignments[name.value] and name.value not in _BUILTINS

    def keras_names(self, node: cst.CSTNode) -> Set[str]:
        """The Keras 2 API names `node` refers to, spelled from `keras.`.

        `tf.keras.layers.Dense`, TensorFlow's internal tf.keras path, `tf_keras...` and
        `keras.layers.Dense` are all `keras.layers.Dense`: one table serves every spelling.
        """
        found: Set[str] = set()
        for name in self.qualified(node):
            canonical = canonical_keras_name(name)
            if canonical is not None:
                found.add(canonical)
        return found

    def keras_name(self, node: cst.CSTNode) -> Optional[str]:
        names = self.keras_names(node)
        return min(names) if names else None

    def top_level_index(self, node: cst.CSTNode) -> int:
        """The index in the module body of the statement that holds `node`."""
        index_of = {id(stmt): index for index, stmt in enumerate(self.module.body)}
        top: Optional[cst.CSTNode] = node
        while top is not None and id(top) not in index_of:
            top = self.parents.get(top)
        return index_of[id(top)] if top is not None else 0

    def enclosing(self, node: cst.CSTNode, kind: type) -> Optional[cst.CSTNode]:
        """The nearest ancestor of the given node type (a Call, a FunctionDef...)."""
        current = self.parents.get(node)
        while current is not None and not isinstance(current, kind):
            current = self.parents.get(current)
        return current

    # -- deciding -----------------------------------------------------------------
    def report(self, node: cst.CSTNode, severity: Severity, rule: str, message: str) -> None:
        line, col = self.position(node)
        self.findings.append(Finding(self.filename, line, col, severity, rule, message))

    def edit(self, node: cst.CSTNode, change: Edit) -> None:
        """Replace `node` by `change(node as rewritten by inner edits)`."""
        self.edits.setdefault(node, []).append(change)

    def replace(self, node: cst.CSTNode, new: cst.CSTNode) -> None:
        """Replace `node` by a fixed expression, keeping its parentheses."""
        def swap(updated: cst.CSTNode) -> Replacement:
            lpar = getattr(updated, "lpar", None)
            if lpar and hasattr(new, "lpar"):
                return new.with_changes(lpar=lpar, rpar=updated.rpar)
            return new
        self.edit(node, swap)

    def is_removed(self, node: cst.CSTNode) -> bool:
        return id(node) in self.removed

    def need_import(self, module: str, at: cst.CSTNode, asname: Optional[str] = None) -> None:
        """Have `import module [as asname]` added before the first statement that uses it."""
        if self.is_removed(at):
            return
        line = f"import {module}" + (f" as {asname}" if asname else "")
        # AddImportsVisitor sees only the imports at the top: one anywhere in the file
        # counts, and `import kerasmgpu.legacy` binds `kerasmgpu` too.
        if line in self._present_imports or (asname is None and self.bindings.get(module)
                                             == module):
            return
        AddImportsVisitor.add_needed_import(self.codemod, module, asname=asname)
        self._used_at(at)

    def _used_at(self, at: cst.CSTNode) -> None:
        index = self.top_level_index(at)
        self.first_use = index if self.first_use is None else min(self.first_use, index)

    def need_definition(self, code: str, at: cst.CSTNode) -> None:
        """Add a module-level definition after the imports, before the statement `at`."""
        if all(existing != code for existing in self.definitions):
            self.definitions.append(code)
            self._used_at(at)

    def module_name(self, module: str, at: cst.CSTNode, alias: Optional[str] = None) -> str:
        """A name bound at module level to `module`, importing it when none is."""
        for name, bound in self.bindings.items():
            if bound == module:
                return name
        name = alias or module.split(".")[-1]
        plain = alias is None and "." not in module
        self.need_import(module, at, asname=None if plain else name)
        return name

    def keras_module(self, at: cst.CSTNode) -> str:
        """The name of the target's Keras package in this file (`keras`), imported if needed.

        On tf_keras the file's `import keras` becomes `import tf_keras as keras`, so a
        `keras` binding of any spelling names the target's Keras once the file is migrated.
        """
        names = [name for name, bound in self.bindings.items()
                 if canonical_keras_name(bound) == "keras"]
        if names:
            return "keras" if "keras" in names else names[0]
        package = "tf_keras" if self.target is Target.TF_KERAS else "keras"
        return self.module_name(package, at)


class Rule(ContextAwareVisitor):
    """A rule family: visits the original tree once and records what to do in `ctx`."""

    NAME: ClassVar[str] = ""
    TARGETS: ClassVar[FrozenSet[Target]] = frozenset(Target)
    METADATA_DEPENDENCIES = METADATA

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx.codemod)
        self.ctx = ctx

    def info(self, node: cst.CSTNode, message: str) -> None:
        self.ctx.report(node, Severity.INFO, self.NAME, message)

    # not `warn`: ContextAwareVisitor.warn(text) feeds libcst's own warning list
    def warning(self, node: cst.CSTNode, message: str) -> None:
        self.ctx.report(node, Severity.WARNING, self.NAME, message)

    def error(self, node: cst.CSTNode, message: str) -> None:
        self.ctx.report(node, Severity.ERROR, self.NAME, message)

    def finish(self) -> None:
        """Called once the whole tree was visited (for decisions that need all of it)."""


def canonical_keras_name(name: str) -> Optional[str]:
    """`keras.x.y` for any spelling of the Keras 2 package, else None."""
    for alias in KERAS_PACKAGE_ALIASES:
        if name == alias:
            return "keras"
        if name.startswith(alias + "."):
            return "keras" + name[len(alias):]
    return None


_BUILTINS = frozenset(dir(__import__("builtins")))


def _star_imports(module: cst.Module) -> List[str]:
    """Modules of Keras that `from M import *` lines of the file import from."""
    found: List[str] = []
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar):
                    name = nodes.module_of(small)
                    if name and canonical_keras_name(name) is not None:
                        found.append(name)
    return found


# --------------------------------------------------------------------------------------
# Running the rules and applying their edits


def parse(source: str, filename: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        reason, line, col = _parse_error(source, exc)
        raise MigrationError(filename, reason, line, col) from exc


def _parse_error(source: str, exc: cst.ParserSyntaxError) -> Tuple[str, int, int]:
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
            return f"{err.msg} (line {err.lineno}{column})", err.lineno, err.offset or 1
    except (ValueError, RecursionError):  # null bytes before Python 3.12; deep nesting
        pass
    line, col = exc.editor_line, exc.editor_column
    return f"{exc.message} (line {line}, column {col})", line, col


def run(source: str, filename: str, target: Target,
        renamed_elsewhere: Optional[Mapping[str, Tuple[str, str]]] = None) -> MigrationResult:
    """Parse `source`, run every family that applies to `target`, apply their edits."""
    migration = Migration(CodemodContext(filename=filename), source, target, renamed_elsewhere)
    module = migration.transform_module(parse(source, filename))
    ctx = migration.ctx
    assert ctx is not None
    new_source = module.code
    findings = sorted(set(ctx.findings), key=lambda f: (f.line, f.col, f.rule, f.message))
    return MigrationResult(new_source=new_source, changed=new_source != source,
                           findings=findings, renamed=dict(ctx.renamed),
                           lines=migration.lines if new_source != source else {})


class Migration(ContextAwareTransformer):
    """The codemod: runs the families, applies their edits bottom-up, adds the imports."""

    METADATA_DEPENDENCIES = METADATA

    def __init__(self, context: CodemodContext, source: str, target: Target,
                 renamed_elsewhere: Optional[Mapping[str, Tuple[str, str]]] = None) -> None:
        super().__init__(context)
        self.source = source
        self.target = target
        self.renamed_elsewhere = renamed_elsewhere
        self.ctx: Optional[Context] = None
        self.edits: Mapping[cst.CSTNode, List[Edit]] = {}
        self.anchor: Optional[cst.CSTNode] = None
        self.definitions: List[cst.BaseStatement] = []
        # each original statement -> what it became (for the findings' new line numbers)
        self.results: Dict[cst.CSTNode, Replacement] = {}
        # the anchor statement as rewritten, before the definitions that follow it
        self.anchor_result: Optional[cst.CSTNode] = None
        self.lines: Dict[int, int] = {}

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Let every family read `tree` (the wrapper's, metadata resolved), then edit it."""
        ctx = self.ctx = Context(self.context, self.source, self.target,
                                 self.renamed_elsewhere)
        rules: List[Rule] = []
        for family in FAMILIES:
            rule_class = importlib.import_module(f"kerasmgpu.migrate.{family}").RULE
            if self.target in rule_class.TARGETS:
                rules.append(rule_class(ctx))
                tree.visit(rules[-1])
        for rule in rules:  # after every visit: a family may rely on what another claimed
            rule.finish()
        self.edits = ctx.edits
        self.anchor, self.definitions = _planned_definitions(ctx)
        edited = tree.visit(self)
        if self.anchor is None and self.definitions:  # nothing to follow: first
            edited = edited.with_changes(body=[*self.definitions, *edited.body])
        return edited

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Replacement:
        result: Replacement = super().on_leave(original_node, updated_node)
        for change in self.edits.get(original_node, ()):
            if not isinstance(result, cst.CSTNode):
                break  # removed or split by an earlier edit: nothing left to edit
            result = change(result)
        if isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self.results[original_node] = result
        if original_node is self.anchor:
            before = list(result.nodes) if isinstance(result, cst.FlattenSentinel) else (
                [] if isinstance(result, cst.RemovalSentinel) else [result])
            self.anchor_result = before[-1] if before else None
            if self.definitions:
                return cst.FlattenSentinel([*before, *self.definitions])
        return result

    def transform_module(self, tree: cst.Module) -> cst.Module:
        edited = super().transform_module(tree)
        ctx = self.ctx
        assert ctx is not None
        module = self.add_imports(_with_preamble(edited, ctx.preamble))
        if RemoveImportsVisitor.CONTEXT_KEY in self.context.scratch:
            module = RemoveImportsVisitor(self.context).transform_module(module)
        self.lines = _line_map(ctx, edited, self.results)
        if module.code != edited.code:  # lines the imports pushed down
            moved = moved_lines(edited.code, module.code)
            self.lines = {old: moved.get(new, new) for old, new in self.lines.items()}
        return module

    def add_imports(self, module: cst.Module) -> cst.Module:
        """libcst's AddImportsVisitor adds what the families asked for.

        It puts them after the first block of import lines of the module it is given; that
        is given the module from the import block before the first use on, so they go
        with the framework imports an `os.environ[...] = ...` line above must precede.
        """
        if AddImportsVisitor.CONTEXT_KEY not in self.context.scratch:
            return module
        body = list(module.body)
        start = 0
        if self.anchor_result is not None and any(s is self.anchor_result for s in body):
            start = next(i for i, s in enumerate(body) if s is self.anchor_result)
            if _is_import_line(body[start]):
                while start > 0 and _is_import_line(body[start - 1]):
                    start -= 1
            else:  # a docstring, or a try/if block holding an import: after it
                start += 1
        if all(_is_import_line(s) or (i == 0 and nodes.is_docstring(s))
               for i, s in enumerate(body[:start])):  # where libcst puts them anyway
            return AddImportsVisitor(self.context).transform_module(module)
        tail = AddImportsVisitor(self.context).transform_module(
            module.with_changes(header=(), body=body[start:]))
        return module.with_changes(body=[*body[:start], *tail.body])


def _is_import_line(stmt: cst.CSTNode) -> bool:
    """An import line as AddImportsVisitor counts them: one import statement alone."""
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))


def _planned_definitions(ctx: Context) -> Tuple[Optional[cst.CSTNode], List[cst.BaseStatement]]:
    """The statement the added imports follow (None: the top) and the definitions after it.

    The last module-level import that precedes the first statement needing one: in the
    usual file the last top-of-module import, never before an `os.environ[...] = ...` line
    that the user's framework imports depend on, nor after the first use.
    """
    if ctx.first_use is None:
        return None, []
    definitions: List[cst.BaseStatement] = []
    for code in ctx.definitions:
        statements = list(cst.parse_module(code).body)
        statements[0] = statements[0].with_changes(
            leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        definitions.extend(statements)
    body = ctx.module.body
    imports = [stmt for stmt in body[:ctx.first_use] if nodes.holds_import(stmt)]
    if imports:
        return imports[-1], definitions
    if ctx.first_use > 0 and nodes.is_docstring(body[0]):
        return body[0], definitions
    return None, definitions


def _with_preamble(module: cst.Module, preamble: Sequence[str]) -> cst.Module:
    """`preamble` lines first, after the docstring and `from __future__` imports only:
    AddImportsVisitor would put them after the file's other imports."""
    if not preamble:
        return module
    body = list(module.body)
    index = 0
    while index < len(body) and (_is_future(body[index]) or (
            index == 0 and nodes.is_docstring(body[0]))):
        index += 1
    added = [cst.parse_statement(line + "\n") for line in preamble]
    if index == 0 and body:  # the file's first comments stay above it
        added[0] = added[0].with_changes(leading_lines=body[0].leading_lines)
        body[0] = body[0].with_changes(leading_lines=())
    return module.with_changes(body=[*body[:index], *added, *body[index:]])


def _is_future(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(small, cst.ImportFrom) and nodes.module_of(small) == "__future__"
        for small in stmt.body)


def _line_map(ctx: Context, module: cst.Module,
              results: Mapping[cst.CSTNode, Replacement]) -> Dict[int, int]:
    """For each line of the source, the line of the new code where it is now.

    Exact for the first line of every statement (its first replacement's line, or, when
    removed, the next statement's); a later line of a multi-line statement keeps its
    offset when the statement kept its line count. Lines not covered fall back to the
    text diff (`report.moved_lines`).
    """
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    mapping: Dict[int, int] = {}
    pending: List[int] = []  # removed statements' lines, waiting for the next one
    for original in sorted(results, key=lambda n: ctx.positions[n].start.line):
        old = ctx.positions[original]
        result = results[original]
        first = (result.nodes[0] if isinstance(result, cst.FlattenSentinel) and result.nodes
                 else result)
        if not isinstance(first, cst.CSTNode) or first not in positions:
            pending.append(old.start.line)
            continue
        new = positions[first]
        for line in pending:
            mapping.setdefault(line, new.start.line)
        pending = []
        same = old.end.line - old.start.line == new.end.line - new.start.line
        for line in range(old.start.line, old.end.line + 1):
            offset = line - old.start.line if same or line == old.start.line else None
            if offset is not None and (line not in mapping or line == old.start.line):
                mapping[line] = new.start.line + offset
    return mapping
