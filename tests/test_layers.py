"""The package's shape, enforced: Keras internals only in adapters, imports only downward,
no cycle, no long function.

* A private name of Keras, TensorFlow or JAX - an `_attribute` that is not kerasmgpu's
  own, a `keras.src` / `tensorflow.python` / `jax._src` module - appears only in
  `kerasmgpu/adapters/`.
* Every import between kerasmgpu modules (function-level ones included, type-checking
  ones excluded) goes from a higher layer to a lower one.
* No two modules import each other, even through others, counting function-level and
  type-checking imports too (`KNOWN_CYCLES`, for an allowance, is empty).
* No function in `kerasmgpu/` is over `MAX_FUNCTION_LINES` lines (`KNOWN_LONG` aside), and
  none in the tools (`TOOLS`) over `MAX_TOOL_FUNCTION_LINES`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Set, Tuple

import pytest

pytestmark = [pytest.mark.core, pytest.mark.pure]

PACKAGE = Path(__file__).resolve().parent.parent / "kerasmgpu"
PRIVATE_MODULES = ("keras.src", "tensorflow.python", "jax._src", "tf_keras.src")

# Lower number = lower layer. A module may import modules of its own layer or below.
LAYERS: List[Tuple[str, int]] = [
    ("kerasmgpu._version", 0),
    ("kerasmgpu._atomic", 0),
    ("kerasmgpu._errors", 0),
    ("kerasmgpu._hooks", 0),
    ("kerasmgpu.batching", 0),
    ("kerasmgpu.accumulation", 0),  # pure, like batching
    ("kerasmgpu.options", 0),  # a parallelize() call's options, as one value
    ("kerasmgpu.env", 1),
    ("kerasmgpu.registry", 2),  # reads env.versions; nothing in env reads it
    ("kerasmgpu.pins", 1),
    ("kerasmgpu.routes", 2),
    ("kerasmgpu.launch", 2),  # a package: its own order below (LAUNCH_ORDER)
    ("kerasmgpu.process", 2),
    ("kerasmgpu.nvml", 2),
    ("kerasmgpu.adapters", 3),
    ("kerasmgpu.migrate", 3),  # the names of where multi_gpu_model lived: adapters.keras23
    ("kerasmgpu.inventory", 3),
    ("kerasmgpu.engines.startup", 3),
    ("kerasmgpu.data", 4),
    ("kerasmgpu.training", 5),
    ("kerasmgpu.engines", 6),
    ("kerasmgpu.api", 7),
    ("kerasmgpu.legacy", 8),
    ("kerasmgpu.callbacks", 8),
    ("kerasmgpu.cli", 9),
    ("kerasmgpu.__main__", 10),
    ("kerasmgpu", 10),  # the package's __init__: lazy names, above everything
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> int:
    best = None
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    assert best is not None, f"{module} has no layer in tests/test_layers.py"
    return best[1]


def _files() -> Iterator[Tuple[str, Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield _module_name(path), path, ast.parse(path.read_text(), str(path))


def _type_checking_nodes(tree: ast.Module) -> Set[int]:
    skipped: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(id(n) for n in ast.walk(child))
    return skipped


def _imports(module: str, path: Path, tree: ast.Module,
             type_checking: bool = False) -> Iterator[Tuple[str, int]]:
    """Every import in the file, function-level ones included; the ones under `if
    TYPE_CHECKING:` only with `type_checking`."""
    skipped = set() if type_checking else _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:  # `from kerasmgpu import api` imports a module
                dotted = f"{base}.{alias.name}"
                as_path = PACKAGE.parent / dotted.replace(".", "/")
                if as_path.with_suffix(".py").exists() or (as_path / "__init__.py").exists():
                    yield dotted, node.lineno
                else:
                    yield base, node.lineno


def _own_private_names() -> Set[str]:
    """Every `_name` kerasmgpu defines itself (functions, classes, attributes, keys)."""
    names: Set[str] = set()
    for _, _, tree in _files():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                for arg in node.args.args if not isinstance(node, ast.ClassDef) else []:
                    names.add(arg.arg)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _private_uses(tree: ast.Module, own: Set[str]) -> Iterator[Tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = node.attr
            if name.startswith("_") and not name.startswith(("__", "_kerasmgpu")) and (
                    name not in own):
                yield node.lineno, f".{name}"
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr",
                                                                      "setattr"):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                name = node.args[1].value
                if isinstance(name, str) and name.startswith("_") and not name.startswith(
                        "__") and name not in own and not name.startswith("_kerasmgpu"):
                    yield node.lineno, f"getattr(..., {name!r})"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                node.module or ""]
            for name in names:
                if name.startswith(PRIVATE_MODULES):
                    yield node.lineno, f"import {name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(PRIVATE_MODULES):
                yield node.lineno, repr(node.value)


def test_private_framework_names_only_in_adapters() -> None:
    own = _own_private_names()
    found: Dict[str, List[str]] = {}
    for module, path, tree in _files():
        if module.startswith("kerasmgpu.adapters") or module == "kerasmgpu.migrate":
            continue  # migrate names legacy import paths to rewrite, it touches nothing
        uses = [f"line {line}: {what}" for line, what in _private_uses(tree, own)]
        if uses:
            found[str(path.relative_to(PACKAGE.parent))] = uses
    assert not found, f"private Keras/TF/JAX names outside kerasmgpu/adapters/: {found}"


def test_the_private_name_check_can_fail() -> None:
    """The checker sees what it must: a Keras private attribute and module path."""
    sample = ast.parse("model._compile_loss.call(y)\n"
                       "import keras.src.losses\n"
                       "getattr(model, '_loss_tracker')\n"
                       "state._kerasmgpu_flag = 1\n")
    uses = [what for _, what in _private_uses(sample, own=set())]
    assert ".\x5fcompile_loss" in uses and "import keras.src.losses" in uses
    assert "getattr(..., '_loss_tracker')" in uses
    assert not any("_kerasmgpu" in what and "getattr" in what for what in uses)


def _own_module(target: str, importer: str) -> str:
    """The kerasmgpu module `target` names ("" for none, the importer itself or the
    package root, which Python imports first anyway and which only holds lazy names)."""
    if target.split(".")[0] != "kerasmgpu":
        return ""
    resolved = target
    while resolved and not (PACKAGE.parent / (resolved.replace(".", "/") + ".py")).exists() \
            and not (PACKAGE.parent / resolved.replace(".", "/") / "__init__.py").exists():
        resolved = resolved.rsplit(".", 1)[0] if "." in resolved else ""
    return "" if resolved in (importer, "kerasmgpu") else resolved


def test_imports_go_downward_only() -> None:
    wrong = []
    for module, path, tree in _files():
        here = _layer(module)
        for target, line in _imports(module, path, tree):
            resolved = _own_module(target, module)
            if not resolved:
                continue
            if _layer(resolved) > here:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} {module} "
                             f"(layer {here}) imports {resolved} (layer {_layer(resolved)})")
    assert not wrong, "imports that go up a layer:\n" + "\n".join(wrong)


@pytest.mark.parametrize("module", ["kerasmgpu.env.versions", "kerasmgpu.routes",
                                    "kerasmgpu.batching"])
def test_low_layers_import_no_engine(module: str) -> None:
    """Detection knows nothing of routes' engines; batching is pure."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    targets = {t for t, _ in _imports(module, path, tree)}
    assert not any(t.startswith(("kerasmgpu.engines", "kerasmgpu.training", "kerasmgpu.api"))
                   for t in targets), targets


# The launcher's modules, lowest first: each imports only those before it (the package's
# __init__, with main(), and __main__ last).
LAUNCH_ORDER = ["kerasmgpu.launch.arguments", "kerasmgpu.launch.contract",
                "kerasmgpu.launch.workers", "kerasmgpu.launch.supervise", "kerasmgpu.launch",
                "kerasmgpu.launch.__main__"]


def test_the_launcher_imports_downward_in_its_own_order() -> None:
    found = {module for module, _, _ in _files()
             if module == "kerasmgpu.launch" or module.startswith("kerasmgpu.launch.")}
    assert found == set(LAUNCH_ORDER), f"add the launcher's modules to LAUNCH_ORDER: {found}"
    wrong = []
    for module, path, tree in _files():
        if module not in LAUNCH_ORDER:
            continue
        for target, line in _imports(module, path, tree, type_checking=True):
            resolved = _own_module(target, module)
            if resolved.startswith("kerasmgpu.launch") and (
                    LAUNCH_ORDER.index(resolved) >= LAUNCH_ORDER.index(module)):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {resolved}")
    assert not wrong, "launcher modules importing one at or after them:\n" + "\n".join(wrong)


# Cycles still to remove, each with why it is allowed for now. An entry that no longer
# is a cycle fails the test too, so that the allowance goes with the cycle.
KNOWN_CYCLES: Dict[FrozenSet[str], str] = {}
MAX_FUNCTION_LINES = 100
# Where the stricter limit of STYLE.md already holds (issue 17, part A).
MAX_TOOL_FUNCTION_LINES = 80
TOOLS = ("kerasmgpu/cli/", "kerasmgpu/launch/", "kerasmgpu/process/", "kerasmgpu/env/")
# Functions still longer, as "path::name": each one leaves with its rewrite.
KNOWN_LONG: Dict[str, str] = {}


def _import_graph() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for module, path, tree in _files():
        targets = {_own_module(t, module) for t, _ in _imports(module, path, tree,
                                                             type_checking=True)}
        graph[module] = targets - {""}
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[FrozenSet[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[FrozenSet[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    cycles = _cycles(_import_graph())
    unknown = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not unknown, f"import cycles (type-checking and function-level imports count): {unknown}"
    assert not gone, f"no longer cycles: remove them from KNOWN_CYCLES: {gone}"


def test_the_cycle_check_can_fail() -> None:
    """It sees a cycle through a type-checking import and one through three modules."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(map(sorted, _cycles(graph))) == [["a", "b"], ["c", "d", "e"]]
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from kerasmgpu.api import parallelize\n"
                     "def f():\n    from kerasmgpu.env import cluster\n")
    path = PACKAGE / "batching.py"

    def named(type_checking: bool) -> Set[str]:
        return {_own_module(t, "kerasmgpu.batching")
                for t, _ in _imports("kerasmgpu.batching", path, tree, type_checking)} - {""}

    assert named(type_checking=False) == {"kerasmgpu.env.cluster"}
    assert named(type_checking=True) == {"kerasmgpu.api", "kerasmgpu.env.cluster"}


def _function_lengths() -> Iterator[Tuple[str, int]]:
    for _, path, tree in _files():
        where = path.relative_to(PACKAGE.parent).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                yield f"{where}::{node.name}", node.end_lineno - node.lineno + 1


def _longest() -> Dict[str, int]:
    """The length of each "path::name", the longest where a file has two of one name
    (methods of two classes)."""
    lengths: Dict[str, int] = {}
    for name, n in _function_lengths():
        lengths[name] = max(n, lengths.get(name, 0))
    return lengths


def test_no_long_function() -> None:
    lengths = _longest()
    long = {name: n for name, n in lengths.items()
            if n > MAX_FUNCTION_LINES and name not in KNOWN_LONG}
    gone = [name for name in KNOWN_LONG if lengths.get(name, 0) <= MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them by job): {long}"
    assert not gone, f"no longer over {MAX_FUNCTION_LINES} lines: remove from KNOWN_LONG: {gone}"


def test_no_long_function_in_the_tools() -> None:
    """The tools (commands, launcher, process ending, environment facts) are already
    within the style's ~80 lines; keep them there."""
    long = {name: n for name, n in _longest().items()
            if name.startswith(TOOLS) and n > MAX_TOOL_FUNCTION_LINES}
    assert not long, f"functions over {MAX_TOOL_FUNCTION_LINES} lines (split them by job): {long}"


# --- one choice per process, made in one place ---------------------------------------------

MAX_MODULE_LINES = 600


def test_no_long_module() -> None:
    long = {name: n for name, path, _ in _files()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _called(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return ""


def _choices_outside_their_place(files: Iterator[Tuple[str, Path, ast.Module]]
                                 ) -> List[str]:
    """Where a module decides what only the registry, the engines and the adapters
    decide: the Keras line detected (`registry.active()` only), a route compared
    (registry, routes, engines), the backend compared inside a Keras 3 adapter (one
    class per backend), the Keras line read by data/ (the adapter hands it what differs)."""
    found = []
    for name, _, tree in files:
        for node in ast.walk(tree):
            where = f"{name}:{getattr(node, 'lineno', '?')}"
            if _called(node) == "detect_keras_line" and name != "kerasmgpu.registry":
                found.append(f"{where} detects the Keras line")
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                routes = [o for o in operands if isinstance(o, ast.Attribute)
                          and isinstance(o.value, ast.Name) and o.value.id == "Route"]
                if routes and not (name in ("kerasmgpu.registry", "kerasmgpu.routes")
                                   or name.startswith("kerasmgpu.engines.")):
                    found.append(f"{where} compares a route")
                backends = [o for o in operands if isinstance(o, ast.Attribute)
                            and o.attr == "backend"]
                if backends and name.startswith("kerasmgpu.adapters.keras3"):
                    found.append(f"{where} compares the backend")
            if (isinstance(node, ast.Attribute) and node.attr == "keras3"
                    and name.startswith("kerasmgpu.data")):
                found.append(f"{where} reads the Keras line")
    return found


def test_choices_are_made_in_their_place() -> None:
    assert not _choices_outside_their_place(_files())


def test_the_choice_check_can_fail() -> None:
    code = ("line = versions.detect_keras_line()\n"
            "if engine.route == Route.MIRRORED:\n    pass\n"
            "flag = adapter.keras3\n"
            "same = self.backend == 'torch'\n")
    tree = ast.parse(code)
    found = _choices_outside_their_place(iter([
        ("kerasmgpu.data.arrays", Path("x.py"), tree),
        ("kerasmgpu.adapters.keras3_jax", Path("y.py"), tree)]))
    assert sum("detects" in f for f in found) == 2 and sum("route" in f for f in found) == 2
    assert any("keras3_jax" in f and "backend" in f for f in found)
    assert any("data.arrays" in f and "Keras line" in f for f in found)


# --- the suite's own markers ---------------------------------------------------------------

TESTS = Path(__file__).resolve().parent
# What a test of `kerasmgpu migrate`'s text alone never reaches (tox.ini runs those, marked
# `text`, in one env only): code run (exec, a subprocess, a migrated case), Keras, an engine,
# numbers, or a fact of this env.
RUNS_SOMETHING = frozenset({
    "run_keras23", "exec", "subprocess", "keras", "tf", "tensorflow", "jax", "torch", "np",
    "registry", "parallelize", "env_target", "LINE", "BACKEND", "ON_LEGACY", "ON_TF",
    "ON_JAX", "ON_TORCH", "KERAS3", "requires"})


def _test_modules() -> Iterator[Tuple[str, ast.Module]]:
    """(file name, parsed module) of each test module of the suite."""
    return ((path.name, ast.parse(path.read_text())) for path in sorted(TESTS.glob("test_*.py")))


def _marked_text(decorator: ast.expr) -> bool:
    return (isinstance(decorator, ast.Attribute) and decorator.attr == "text"
            and isinstance(decorator.value, ast.Attribute) and decorator.value.attr == "mark")


def _text_tests_that_run_something(files: Iterator[Tuple[str, ast.Module]]) -> List[str]:
    """`file::test (names)` for each test marked `text` whose code - or the code of its
    module's functions and classes it names, followed - names something that runs."""
    found = []
    for where, tree in files:
        defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef)
                    and any(_marked_text(d) for d in node.decorator_list)):
                continue
            names: Set[str] = set()
            pending, seen = [node], {node.name}
            while pending:
                for sub in ast.walk(pending.pop()):
                    if not isinstance(sub, ast.Name):  # `np.x` names np; `Target.KERAS3`, no env
                        continue
                    name = sub.id
                    names.add(name)
                    if name in defs and name not in seen:
                        seen.add(name)
                        pending.append(defs[name])
            if names & RUNS_SOMETHING:
                found.append(f"{where}::{node.name} ({', '.join(sorted(names & RUNS_SOMETHING))})")
    return found


def test_a_text_test_runs_nothing() -> None:
    found = _text_tests_that_run_something(_test_modules())
    assert not found, ("marked `text` (run by one env: tox.ini) but running code, Keras or "
                       f"an env's fact - remove the mark: {found}")


def test_the_text_check_can_fail() -> None:
    code = ("import pytest\n"
            "def _case(text):\n    return run_keras23(text)\n"
            "@pytest.mark.text\ndef test_a():\n    assert _case('x')\n"
            "@pytest.mark.text\ndef test_b():\n    assert migrate('x') == 'x'\n"
            "def test_c():\n    exec('x')\n")
    assert _text_tests_that_run_something(iter([("t.py", ast.parse(code))])) == [
        "t.py::test_a (run_keras23)"]


# What a module marked `pure` (tox.ini runs it in two envs only) must not name: a
# framework, a fact of this env (the active line, backend or route), or a skip by env.
READS_THE_ENV = frozenset({
    "keras", "tf", "tensorflow", "tf_keras", "jax", "torch", "registry", "parallelize",
    "env_target", "keras_module", "LINE", "BACKEND", "ENV", "ROUTE", "IN_PROCESS", "ON_LEGACY",
    "ON_TF", "ON_JAX", "ON_TORCH", "KERAS3", "requires"})


def _marks_pure(node: ast.AST) -> bool:
    return any(isinstance(sub, ast.Attribute) and sub.attr == "pure"
               and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark"
               for sub in ast.walk(node))


def _pure_tests_that_read_the_env(files: Iterator[Tuple[str, ast.Module]]) -> List[str]:
    """`file::scope (names)` for each module (a `pytestmark` naming `pure`) or test (a
    decorator) marked `pure` whose code names a framework or a fact of this env."""
    found = []
    for where, tree in files:
        scopes: List[Tuple[str, ast.AST]] = []
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets) \
                    and _marks_pure(node.value):
                scopes.append(("<module>", tree))
            elif isinstance(node, ast.FunctionDef) and any(map(_marks_pure, node.decorator_list)):
                scopes.append((node.name, node))
        for name, scope in scopes:
            names = {sub.id for sub in ast.walk(scope) if isinstance(sub, ast.Name)}
            for sub in ast.walk(scope):
                if isinstance(sub, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in sub.names}
                elif isinstance(sub, ast.ImportFrom):
                    names |= {alias.asname or alias.name for alias in sub.names}
                    names.add((sub.module or "").split(".")[0])
            if names & READS_THE_ENV:
                found.append(f"{where}::{name} ({', '.join(sorted(names & READS_THE_ENV))})")
    return found


def test_a_pure_test_reads_nothing_of_the_env() -> None:
    found = _pure_tests_that_read_the_env(_test_modules())
    assert not found, ("marked `pure` (run by two envs: tox.ini) but naming a framework or a "
                       f"fact of this env - remove the mark: {found}")


def test_the_pure_check_can_fail() -> None:
    code = ("import pytest\nfrom helpers import ON_JAX\n"
            "pytestmark = [pytest.mark.core, pytest.mark.pure]\n"
            "def test_a():\n    assert ON_JAX\n")
    assert _pure_tests_that_read_the_env(iter([("t.py", ast.parse(code))])) == [
        "t.py::<module> (ON_JAX)"]
    code = ("import pytest\nimport tensorflow as tf\n"
            "@pytest.mark.pure\ndef test_a():\n    assert tf\n"
            "def test_b():\n    assert keras\n")
    assert _pure_tests_that_read_the_env(iter([("t.py", ast.parse(code))])) == [
        "t.py::test_a (tf)"]
