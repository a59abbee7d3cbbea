"""The registry: one entry per (Keras line, backend), each naming modules that exist.

The README's Routes table is the claim; every row of it must have its entry, with the
same route and verified releases, and every entry must be a row. Each entry's
"module:name" references are checked without importing a framework (the module exists
and defines the name), and the active env's entry is imported for real.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from helpers import BACKEND, LINE
from packaging.version import Version

from kerasmgpu import engines, registry
from kerasmgpu.env.versions import KerasLine
from kerasmgpu.registry import ENTRIES, Entry, FeedKind, Route

pytestmark = pytest.mark.core

README = Path(__file__).resolve().parent.parent / "README.md"

# How the README's Routes table names each line and backend.
_ROWS: List[Tuple[str, KerasLine, str]] = [
    (r"^standalone Keras ", KerasLine.LEGACY, "tensorflow"),
    (r"^tf\.keras ", KerasLine.TF_KERAS, "tensorflow"),
    (r"^tf_keras ", KerasLine.TF_KERAS_LEGACY, "tensorflow"),
    (r"^Keras 3\..*TensorFlow backend", KerasLine.KERAS_3, "tensorflow"),
    (r"^Keras 3\..*JAX backend", KerasLine.KERAS_3, "jax"),
    (r"^Keras 3\..*PyTorch backend", KerasLine.KERAS_3, "torch"),
]


def _claims() -> Dict[Tuple[KerasLine, str], Tuple[str, Route]]:
    """(line, backend) -> (releases as written, route) from the README's Routes table."""
    text = README.read_text()
    table = text[text.index("## Routes"):].split("\n## ", 1)[0]
    claims: Dict[Tuple[KerasLine, str], Tuple[str, Route]] = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[1].startswith("`"):
            continue
        for pattern, line, backend in _ROWS:
            if re.search(pattern, cells[0]):
                claims[(line, backend)] = (cells[0], Route(cells[1].strip("`")))
    return claims


def _releases(cell: str) -> Tuple[Version, Optional[Version]]:
    """The first release and the last (None for one release) a README cell names."""
    found = re.findall(r"\d+\.\d+(?:\.\d+)?", cell)
    first = Version(found[0])
    last = Version(found[1]) if len(found) > 1 and " - " in cell else None
    return first, last


def test_every_claimed_line_and_backend_has_its_entry() -> None:
    claims = _claims()
    assert len(claims) == len(_ROWS), f"README Routes rows not recognised: {claims}"
    keys = [(e.line, e.backend) for e in ENTRIES]
    assert len(keys) == len(set(keys)), "two entries for one (line, backend)"
    assert set(keys) == set(claims)
    for (line, backend), (cell, route) in claims.items():
        entry = registry.lookup(line, backend)
        assert entry.route is route, cell
        first, last = _releases(cell)
        low, below = entry.verified
        assert low == first, cell
        if last is None:  # one release: [it, the next patch)
            assert below.release[:2] == first.release[:2] and below > first, cell
        else:  # "a - b": every release of minor b, none of the next
            assert below.release[:2] == (last.major, last.minor + 1), cell


def test_the_multi_process_floor_is_the_readme_s() -> None:
    row = next(r for r in README.read_text().splitlines() if r.startswith("| several processes"))
    floor = re.search(r"Keras 3 on JAX: (\d+\.\d+)\+", row)
    assert floor is not None
    assert registry.multi_process_floor(KerasLine.KERAS_3, "jax") == Version(floor.group(1))
    others = [e for e in ENTRIES if e.backend != "jax" and e.multi_process_floor is not None]
    assert not others


def test_every_route_has_one_engine_and_the_feed_its_engine_consumes() -> None:
    for route in Route:
        named = {e.engine for e in registry.entries_of(route)}
        assert len(named) == 1, f"{route}: {named}"
    # TensorFlow's strategies consume datasets; every other engine Python batches. The
    # engine modules import no framework at import.
    for route in Route:
        engine = engines.load_route(route)
        assert engine.route is route
        assert (engine.feed_kind is FeedKind.TF) is (route is Route.MIRRORED), route
        assert callable(engine.device_lister), route


def test_what_an_engine_can_do_is_its_own_flag() -> None:
    """The capabilities api, training, doctor, demo and bench read (they compare no
    route): torch trains as processes and keeps each process's metrics; JAX runs one
    program; Keras 2.3's graph slices; TF cannot accumulate across workers."""
    flags = {route: engines.load_route(route) for route in Route}
    assert [r for r, e in flags.items() if e.needs_launcher] == [Route.TORCH_DDP]
    assert [r for r, e in flags.items() if e.metrics_per_process] == [Route.TORCH_DDP]
    assert [r for r, e in flags.items() if e.one_program] == [Route.KERAS_DISTRIBUTION]
    assert [r for r, e in flags.items() if e.slices_in_graph] == [Route.MULTI_GPU_MODEL]
    assert [r for r, e in flags.items() if not e.accumulates_in_processes] == [
        Route.MIRRORED]
    assert all(e.syncs_batchnorm and e.accumulates for e in flags.values())


def test_the_active_keras_is_chosen_once_per_process(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    from kerasmgpu.env import versions

    first = registry.active()
    assert registry.active() is first
    calls = []
    monkeypatch.setattr(versions, "detect_keras_line",
                        lambda: calls.append(1) or (KerasLine.NONE, None))
    assert registry.active() is first and not calls  # kept: not detected again
    registry.reset()
    assert registry.active().line is KerasLine.NONE and calls == [1]
    assert registry.active().entry is None
    with pytest.raises(ValueError, match="no Keras installed"):
        registry.active().entry_or_raise()


def _defines(reference: str) -> bool:
    """Whether the module of "module:name" exists and defines `name` at its top level,
    read from its source (nothing imported)."""
    module_name, _, name = reference.partition(":")
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        return False
    if not name:
        return True
    tree = ast.parse(Path(spec.origin).read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.line.name}-{e.backend}")
def test_each_entry_names_what_its_modules_define(entry: Entry) -> None:
    references = [entry.adapter, entry.engine]
    missing = [r for r in references if not _defines(r)]
    assert not missing
    assert entry.keras and entry.dist


def test_the_active_entry_imports_its_names() -> None:
    from kerasmgpu.adapters import Adapter
    from kerasmgpu.engines.base import Engine

    entry = registry.find(LINE, BACKEND)
    if entry is None:
        pytest.skip(f"no Keras line to run here: {LINE.value}")
    assert issubclass(registry.resolve(entry.adapter), Adapter)
    engine = engines.load(entry)
    assert issubclass(engine, Engine) and engine.route is entry.route
    assert engines.load_route(entry.route) is engine
    # What starts at import is the engine's own start-up (Keras 3 on TensorFlow: none,
    # it cannot train under MultiWorkerMirroredStrategy).
    if entry.starts_at_import:
        assert engine.start.__func__ is not Engine.start.__func__  # type: ignore[attr-defined]
    assert registry.keras_module(entry).__name__.split(".")[-1] in ("keras", "tf_keras")


def test_a_bad_line_or_backend_is_explained() -> None:
    with pytest.raises(ValueError, match=r"no Keras installed.*Fix:.*pip install"):
        registry.lookup(KerasLine.NONE, "")
    with pytest.raises(ValueError, match=r"KERAS_BACKEND='numpy'.*tensorflow, jax or torch"):
        registry.lookup(KerasLine.KERAS_3, "numpy")
    assert registry.find(KerasLine.KERAS_3, "numpy") is None
    # The Keras 2 lines run on TensorFlow whatever KERAS_BACKEND says.
    assert registry.lookup(KerasLine.TF_KERAS, "jax").backend == "tensorflow"


def test_the_registry_imports_no_framework() -> None:
    code = ("import sys, kerasmgpu.registry; "
            "print(sorted(m for m in ('tensorflow', 'jax', 'torch', 'keras', 'tf_keras') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == "[]"
