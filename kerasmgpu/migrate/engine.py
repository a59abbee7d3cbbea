"""The codemod's machinery: parse, let each rule family visit, apply the edits, add imports.

Every rule family (one module each) is a libcst visitor that reads the *original* tree and
records what to do through the shared `Context`: findings (`info`/`warn`/`error`), edits
(a function from the node as rewritten so far to its replacement, keyed by the original
node) and the imports its new code needs. One transformer then applies every edit
bottom-up, so two families may edit nested nodes (an optimizer inside a `compile` call
inside a rewritten `fit_generator`) or even the same node (their functions compose in
family order). Nothing is rewritten while a rule still reads the tree.

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
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import libcst as cst
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


class Context:
    """One file being migrated: its tree, metadata, and what the rules decided."""

    def __init__(self, wrapper: MetadataWrapper, source: str, filename: str,
                 target: Target,
                 renamed_elsewhere: Optional[Mapping[str, Tuple[str, str]]] = None) -> None:
        self.wrapper = wrapper
        self.module: cst.Module = wrapper.module
        self.source = source
        self.filename = filename
        self.target = target
        self.positions = wrapper.resolve(PositionProvider)
        self.parents = wrapper.resolve(ParentNodeProvider)
        self.scopes = wrapper.resolve(ScopeProvider)
        self.contexts = wrapper.resolve(ExpressionContextProvider)
        self._qualified = wrapper.resolve(QualifiedNameProvider)
        self.findings: List[Finding] = []
        self.edits: Dict[cst.CSTNode, List[Edit]] = {}
        # import line -> index of the first top-level statement that needs it
        self.imports: Dict[str, int] = {}
        # module-level definitions a rewrite needs (code, index of the first statement using
        # it): they go after the imports, with them
        self.definitions: List[Tuple[str, int]] = []
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
        self.bindings = _module_bindings(self.module)

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

    def need_import(self, line: str, at: cst.CSTNode) -> None:
        """Add `line` (`import kerasmgpu`) before the first statement that uses it."""
        if self.is_removed(at):
            return
        index = self.top_level_index(at)
        self.imports[line] = min(index, self.imports.get(line, index))

    def need_definition(self, code: str, at: cst.CSTNode) -> None:
        """Add a module-level definition after the imports, before the statement `at`."""
        index = self.top_level_index(at)
        if all(existing != code for existing, _ in self.definitions):
            self.definitions.append((code, index))

    def module_name(self, module: str, at: cst.CSTNode, alias: Optional[str] = None) -> str:
        """A name bound at module level to `module`, importing it when none is."""
        for name, bound in self.bindings.items():
            if bound == module:
                return name
        name = alias or module.split(".")[-1]
        statement = f"import {module}" if alias is None and "." not in module else (
            f"import {module} as {name}")
        self.need_import(statement, at)
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


class Rule(cst.CSTVisitor):
    """A rule family: visits the original tree once and records what to do in `ctx`."""

    NAME: ClassVar[str] = ""
    TARGETS: ClassVar[FrozenSet[Target]] = frozenset(Target)

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        self.ctx = ctx

    def info(self, node: cst.CSTNode, message: str) -> None:
        self.ctx.report(node, Severity.INFO, self.NAME, message)

    def warn(self, node: cst.CSTNode, message: str) -> None:
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


def _module_bindings(module: cst.Module) -> Dict[str, str]:
    """Names bound at module level to modules: {"tf": "tensorflow", "K": "keras.backend"}."""
    bound: Dict[str, str] = {}
    for small in _top_level_imports(module):
        if isinstance(small, cst.Import):
            for alias in small.names:
                full = nodes.dotted(alias.name) or ""
                if alias.asname is not None:
                    bound[nodes.dotted(alias.asname.name) or ""] = full
                else:
                    bound[full.split(".")[0]] = full.split(".")[0]
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            base = nodes.module_of(small)
            if not base or base.startswith("."):
                continue
            for alias in small.names:
                name = nodes.dotted(alias.name) or ""
                local = nodes.dotted(alias.asname.name) if alias.asname else name
                bound[local or name] = f"{base}.{name}"
    return bound


def _top_level_imports(module: cst.Module) -> Iterator[cst.BaseSmallStatement]:
    """Import statements at module level, also inside top-level if/try blocks."""
    for stmt in module.body:
        yield from _imports_in(stmt)


def _imports_in(stmt: cst.CSTNode) -> Iterator[cst.BaseSmallStatement]:
    if isinstance(stmt, cst.SimpleStatementLine):
        yield from (s for s in stmt.body if isinstance(s, (cst.Import, cst.ImportFrom)))
    elif isinstance(stmt, (cst.If, cst.Try)):
        blocks: List[cst.BaseSuite] = [stmt.body]
        if isinstance(stmt, cst.Try):
            blocks.extend(handler.body for handler in stmt.handlers)
        for block in blocks:
            if isinstance(block, cst.IndentedBlock):
                for inner in block.body:
                    yield from _imports_in(inner)


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
    wrapper = MetadataWrapper(parse(source, filename))
    ctx = Context(wrapper, source, filename, target, renamed_elsewhere)
    rules: List[Rule] = []
    for family in FAMILIES:
        rule_class = importlib.import_module(f"kerasmgpu.migrate.{family}").RULE
        if target in rule_class.TARGETS:
            rules.append(rule_class(ctx))
            wrapper.visit(rules[-1])
    for rule in rules:  # after every visit: a family may rely on what another claimed
        rule.finish()
    module, results = _apply(ctx)
    new_source = module.code
    findings = sorted(set(ctx.findings), key=lambda f: (f.line, f.col, f.rule, f.message))
    return MigrationResult(new_source=new_source, changed=new_source != source,
                           findings=findings, renamed=dict(ctx.renamed),
                           lines=_line_map(ctx, module, results) if new_source != source
                           else {})


class _Apply(cst.CSTTransformer):
    """Applies the recorded edits bottom-up, then the imports after their anchor."""

    def __init__(self, edits: Mapping[cst.CSTNode, List[Edit]], anchor: Optional[cst.CSTNode],
                 lines: Sequence[cst.BaseStatement]) -> None:
        super().__init__()
        self.edits = edits
        self.anchor = anchor
        self.lines = lines
        # each original statement -> what it became (for the findings' new line numbers)
        self.results: Dict[cst.CSTNode, Replacement] = {}

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Replacement:
        result: Replacement = super().on_leave(original_node, updated_node)
        for change in self.edits.get(original_node, ()):
            if not isinstance(result, cst.CSTNode):
                break  # removed or split by an earlier edit: nothing left to edit
            result = change(result)
        if isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self.results[original_node] = result
        if original_node is self.anchor and self.lines:
            before = list(result.nodes) if isinstance(result, cst.FlattenSentinel) else (
                [] if isinstance(result, cst.RemovalSentinel) else [result])
            return cst.FlattenSentinel([*before, *self.lines])
        return result


def _apply(ctx: Context) -> Tuple[cst.Module, Dict[cst.CSTNode, Replacement]]:
    lines, anchor, at_top = _planned_imports(ctx)
    transformer = _Apply(ctx.edits, anchor, [] if at_top else lines)
    module = ctx.wrapper.visit(transformer)
    if at_top and lines:
        module = module.with_changes(body=[*lines, *module.body])
    if ctx.preamble:
        body = list(module.body)
        index = 0
        while index < len(body) and (_is_future(body[index]) or (
                index == 0 and nodes.is_docstring(body[0]))):
            index += 1
        added = [cst.parse_statement(line + "\n") for line in ctx.preamble]
        if index == 0 and body:  # the file's first comments stay above it
            added[0] = added[0].with_changes(leading_lines=body[0].leading_lines)
            body[0] = body[0].with_changes(leading_lines=())
        module = module.with_changes(body=[*body[:index], *added, *body[index:]])
    return module, transformer.results


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


def _planned_imports(
    ctx: Context,
) -> Tuple[List[cst.SimpleStatementLine], Optional[cst.CSTNode], bool]:
    """The import lines to add, and where: after `anchor`, or at the top.

    After the last module-level import that precedes the first statement needing one: in
    the usual file the last top-of-module import, never after an `os.environ[...] = ...`
    line that the user's framework imports depend on, nor after the first use.
    """
    present = {ctx.code(s).strip() for s in ctx.module.body
               if isinstance(s, cst.SimpleStatementLine)}
    # `import kerasmgpu.legacy` binds `kerasmgpu` too: `import kerasmgpu` adds nothing.
    present |= {f"import {name}" for name, bound in ctx.bindings.items() if name == bound}
    wanted = [(line, index) for line, index in ctx.imports.items() if line not in present]
    if not wanted and not ctx.definitions:
        return [], None, False
    first_use = min(index for _, index in [*wanted, *ctx.definitions])
    lines = [cst.parse_statement(line + "\n") for line, _ in sorted(wanted, key=_import_order)]
    for code, _ in ctx.definitions:
        statements = list(cst.parse_module(code).body)
        statements[0] = statements[0].with_changes(
            leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        lines.extend(statements)
    body = ctx.module.body
    imports = [stmt for stmt in body[:first_use] if nodes.holds_import(stmt)]
    if imports:
        return lines, imports[-1], False
    if first_use > 0 and nodes.is_docstring(body[0]):
        return lines, body[0], False
    return lines, None, True


def _import_order(item: Tuple[str, int]) -> Tuple[int, str]:
    line = item[0]
    return (0 if line.startswith("import ") else 1, line)
