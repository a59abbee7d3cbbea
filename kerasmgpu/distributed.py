"""Where this process runs in a `kerasmgpu launch` job (rank 0 of 1 outside one)."""

from __future__ import annotations

from kerasmgpu.detection import is_chief, process_count, process_index

__all__ = ["process_index", "process_count", "is_chief"]
