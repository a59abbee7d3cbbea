"""Keras 3's `BackupAndRestore`, as kerasmgpu follows it (every backend alike).

The same in the sources of 3.3, 3.8, 3.10, 3.12 and 3.15; run on 3.15. What is read or
wrapped: `_save_model` (wrapped on the instance: a backup kerasmgpu follows, a save at
SIGTERM), the paths it writes and `_load_model` reads, `_weights_path` and
`_training_metadata_path` (pointed into a generation directory while it saves, and at
the generation a resume restores), and its position counters `_current_epoch`,
`_last_batch_seen`, `_batches_seen_since_last_saving` (set after a mid-epoch resume:
Keras restores only the epoch and would record epoch 0 in its next backup).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional

from kerasmgpu.adapters.base import Adapter, following_save


class Keras3Backups(Adapter):
    """The BackupAndRestore part of the Keras 3 adapter (`keras3.Keras3`)."""

    _BACKUP_COUNTERS = ("_current_epoch", "_last_batch_seen", "_batches_seen_since_last_saving")

    def _backup_internals(self, backup: Any) -> Any:
        save = getattr(backup, "_save_model", None)
        missing = [n for n in self._BACKUP_COUNTERS if not hasattr(backup, n)]
        if not callable(save) or missing:
            raise self.fail("BackupAndRestore has no `_save_model` or position counters "
                            f"{missing}", "an exact mid-epoch resume")
        # A wrapper from an earlier fit of the same callback is replaced, not stacked.
        return getattr(save, "__wrapped__", save)

    # Where Keras reads and writes its backup's files (set in __init__ from backup_dir).
    _BACKUP_PATHS = ("_weights_path", "_training_metadata_path")

    def _own_paths(self, backup: Any) -> Dict[str, str]:
        """Keras's own paths of `backup`, kept the first time kerasmgpu moves them."""
        kept: Optional[Dict[str, str]] = backup.__dict__.get("_kerasmgpu_paths")
        if kept is None:
            missing = [n for n in self._BACKUP_PATHS if not isinstance(getattr(backup, n, None), str)]
            if missing:
                raise self.fail(f"BackupAndRestore has no {missing}", "a backup written as one set")
            kept = {n: getattr(backup, n) for n in ("backup_dir", *self._BACKUP_PATHS)}
            backup.__dict__["_kerasmgpu_paths"] = kept
        return kept

    def _point_at(self, backup: Any, directory: Optional[str]) -> None:
        kept = self._own_paths(backup)
        for name in self._BACKUP_PATHS:
            setattr(backup, name, kept[name] if directory is None
                    else os.path.join(directory, os.path.basename(kept[name])))

    def follow_backup(self, backup: Any, on_save: Callable[[Callable[[str], None]], None],
                      allow: Callable[[], bool]) -> bool:
        save = self._backup_internals(backup)
        self._own_paths(backup)

        def redirect(directory: str, run: Callable[[], None]) -> None:
            # Keras's own _save_model, its files put in `directory` (it makes
            # `backup_dir` if missing, then writes the weights and the epoch record).
            before = {n: getattr(backup, n) for n in ("backup_dir", *self._BACKUP_PATHS)}
            self._point_at(backup, directory)
            backup.backup_dir = directory
            try:
                run()
            finally:
                for name, value in before.items():
                    setattr(backup, name, value)

        backup._save_model = following_save(save, on_save, allow, redirect)
        return True

    def restore_from(self, backup: Any, directory: Optional[str]) -> None:
        # `_load_model` (on_train_begin) reads the two paths.
        self._point_at(backup, directory)

    def set_backup_position(self, backup: Any, epoch: int, batch: int) -> None:
        self._backup_internals(backup)
        backup._current_epoch = epoch
        backup._last_batch_seen = batch
        backup._batches_seen_since_last_saving = 0

    def unfollow_backup(self, backup: Any) -> None:
        original = getattr(getattr(backup, "_save_model", None), "__wrapped__", None)
        if original is not None:
            backup._save_model = original
        if "_kerasmgpu_paths" in backup.__dict__:
            self._point_at(backup, None)

    def save_backup(self, backup: Any, epoch: int, batch: int) -> bool:
        self.set_backup_position(backup, epoch, batch)
        # As the chief saves under a multi-process layout (engines.keras_distribution):
        # on local arrays, not creating variables every process would have to create.
        distribution: Any = getattr(self.keras, "distribution", None)
        active = distribution.distribution() if distribution is not None else None
        if active is not None:
            distribution.set_distribution(None)
        try:
            backup._save_model()
        finally:
            if active is not None:
                distribution.set_distribution(active)
        return True
