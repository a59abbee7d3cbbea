"""Shared helpers of the `kerasmgpu migrate` tests (pure source-to-source, libcst only)."""

from __future__ import annotations

import textwrap
from typing import Any, Dict, List, Tuple

from kerasmgpu.migrate import Finding, Severity, migrate_source


def src(text: str) -> str:
    """A test's source text, dedented, without its first newline."""
    return textwrap.dedent(text).lstrip("\n")


def migrate(text: str, target: str = "keras3") -> str:
    """The migrated text of `text` (dedented)."""
    return migrate_source(src(text), "f.py", target).new_source


def findings(text: str, target: str = "keras3") -> List[Finding]:
    return migrate_source(src(text), "f.py", target).findings


def found(text: str, target: str = "keras3") -> List[Tuple[int, Severity, str]]:
    """(line, severity, message) of every finding."""
    return [(f.line, f.severity, f.message) for f in findings(text, target)]


def lines_found(text: str, needle: str, target: str = "keras3") -> List[int]:
    """Lines of the findings whose message contains `needle`."""
    return [f.line for f in findings(text, target) if needle in f.message]


def severities(text: str, needle: str, target: str = "keras3") -> List[Severity]:
    return [f.severity for f in findings(text, target) if needle in f.message]


def assert_idempotent(text: str, target: str = "keras3") -> str:
    """Migrate twice: the second run changes nothing. Returns the migrated text."""
    once = migrate_source(src(text), "f.py", target)
    twice = migrate_source(once.new_source, "f.py", target)
    assert twice.new_source == once.new_source, (once.new_source, twice.new_source)
    assert not twice.changed
    return once.new_source


# --- running Keras 2.3 code on this env's Keras ------------------------------------------

def env_target() -> str:
    """The `--to` this env's Keras needs; "none" on Keras 2.3 (the code runs as written)."""
    from helpers import LINE

    from kerasmgpu.env.versions import KerasLine

    return {KerasLine.LEGACY: "none", KerasLine.KERAS_3: "keras3",
            KerasLine.TF_KERAS_LEGACY: "tf_keras"}.get(LINE, "")


# `migrate --to keras3` writes code for the Keras 3 that `pip install keras` gives today;
# its output is verified from Keras 3.8 (README). Keras 3.3 runs it differently in three
# measured places, none of them kerasmgpu's: `ModelCheckpoint` uses `np.Inf` (gone in numpy
# 2), `ops.normalize(x, axis=None)` of a 3-D tensor raises on JAX, and a `PyDataset` with one
# worker trains the generators case to other weights than Keras 2.3.
KERAS3_MIGRATE_FLOOR = (3, 8)


def _skip_below_keras3_floor() -> None:
    import pytest
    from helpers import _VERSION

    release = tuple(int(part) for part in str(_VERSION).split(".")[:2])
    if release < KERAS3_MIGRATE_FLOOR:
        pytest.skip(f"needs Keras >= 3.8 (what `migrate --to keras3` output is verified on); "
                    f"this env: Keras {_VERSION}")


def run_keras23(source: str, name: str = "case.py") -> Dict[str, Any]:
    """Run Keras 2.3 `source` here: as written on Keras 2.3, migrated on Keras 3 / tf_keras.

    Returns the globals it left (tests read a `result` it computes).
    """
    target = env_target()
    if target == "keras3":
        _skip_below_keras3_floor()
    if target not in ("none", ""):
        source = migrate_source(source, name, target).new_source
    namespace: Dict[str, Any] = {"__name__": "migrated_case"}
    exec(compile(source, name, "exec"), namespace)
    return namespace
