"""The package's shape, enforced: Keras internals only in adapters, imports only downward.

* A private name of Keras, TensorFlow or JAX - an `_attribute` that is not kerasmgpu's
  own, a `keras.src` / `tensorflow.python` / `jax._src` module - appears only in
  `kerasmgpu/adapters/`.
* Every import between kerasmgpu modules (function-level ones included, type-checking
  ones excluded) goes from a higher layer to a lower one, so there is no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

pytestmark = pytest.mark.core

PACKAGE = Path(__file__).resolve().parent.parent / "kerasmgpu"
PRIVATE_MODULES = ("keras.src", "tensorflow.python", "jax._src", "tf_keras.src")

# Lower number = lower layer. A module may import modules of its own layer or below.
LAYERS: List[Tuple[str, int]] = [
    ("kerasmgpu._version", 0),
    ("kerasmgpu._errors", 0),
    ("kerasmgpu._hooks", 0),
    ("kerasmgpu.batching", 0),
    ("kerasmgpu.env", 1),
    ("kerasmgpu.pins", 1),
    ("kerasmgpu.routes", 2),
    ("kerasmgpu.launch", 2),
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


def _imports(module: str, path: Path, tree: ast.Module) -> Iterator[Tuple[str, int]]:
    skipped = _type_checking_nodes(tree)
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


def test_imports_go_downward_only() -> None:
    wrong = []
    for module, path, tree in _files():
        here = _layer(module)
        for target, line in _imports(module, path, tree):
            if not target.startswith("kerasmgpu"):
                continue
            if target.split(".")[0] != "kerasmgpu":
                continue
            resolved = target
            while resolved and not (PACKAGE.parent / (resolved.replace(".", "/") + ".py")).exists() \
                    and not (PACKAGE.parent / resolved.replace(".", "/") / "__init__.py").exists():
                resolved = resolved.rsplit(".", 1)[0] if "." in resolved else ""
            if not resolved or resolved in (module, "kerasmgpu"):
                continue  # Python imports the package root first anyway
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
