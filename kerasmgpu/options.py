"""What a `parallelize()` call asks for beyond the devices, as one value.

Checked by `kerasmgpu.api`, then handed down to the engine and from the engine to
training (`training.model.attach` / `adopt` / `hold`): nothing reads it from a global.
Pure: no framework, no other kerasmgpu module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    """`parallelize(accumulate_steps=, sync_batchnorm=, verify=)`, checked."""

    accumulate_steps: int = 1
    sync_batchnorm: bool = False
    verify: bool = False


# What a model gets where no call asked for anything (`scope()`, the legacy API).
DEFAULT_OPTIONS = Options()

__all__ = ["DEFAULT_OPTIONS", "Options"]
