"""The `kerasmgpu` command."""

from __future__ import annotations

from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    raise SystemExit("not yet")
