"""Reading, walking and writing the user's files, byte for byte where nothing changes.

Pure Python (no libcst). A file is read in its own encoding (PEP 263 cookie or BOM) with
its newlines as they are (CRLF stays CRLF), and written back in that encoding, with its
mode, owner and group, atomically (`kerasmgpu._atomic`, by the migrate command).
"""

from __future__ import annotations

import difflib
import io
import os
import tokenize
from typing import Iterator, List, Sequence, Set, Tuple

# Besides hidden dirs (.git, .tox, .venv...), which the walk skips by their dot.
SKIP_DIRS = frozenset({"__pycache__", "venv", "node_modules", "build", "dist"})


def iter_files(paths: Sequence[str]) -> Iterator[str]:
    """Files named on the command line, and `*.py` under directories (sorted, pruned)."""
    seen: Set[str] = set()
    for path in paths:
        candidates = _walk(path) if os.path.isdir(path) else [path]  # named: whatever suffix
        for candidate in candidates:
            key = os.path.realpath(candidate)
            if key not in seen:
                seen.add(key)
                yield candidate


def _walk(path: str) -> List[str]:
    found: List[str] = []
    for root, dirs, files in os.walk(path):
        # Hidden dirs (.git, .tox, .venv...), caches, envs and build output hold someone
        # else's code or copies of this one; migrating them is never wanted.
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        for name in sorted(files):
            full = os.path.join(root, name)
            # A linked file may live outside the tree (site-packages, a shared checkout):
            # only what is named explicitly is followed.
            if name.endswith(".py") and not os.path.islink(full):
                found.append(full)
    return found


def read(path: str) -> Tuple[str, str]:
    """(text, encoding) of a Python file, honouring a PEP 263 cookie or BOM, newlines kept."""
    with open(path, "rb") as handle:
        raw = handle.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    # newline="" semantics: decode the bytes as they are, so "\r\n" survives the round trip.
    return raw.decode(encoding), encoding


def diff(path: str, old: str, new: str) -> str:
    """A unified diff `a/path` -> `b/path`, marking a last line without newline as git does."""
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
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)
