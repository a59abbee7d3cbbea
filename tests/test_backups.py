"""Backups as atomic sets (`kerasmgpu.process.backups`), on plain files: no framework.

A generation is restored only when complete - its directory renamed into place, every
file matching the manifest, every process's share there and readable; a damaged one is
named with its fault; older generations go only once a newer one is complete; numbers
only grow. One file (a model the chief saves) is replaced whole or not at all. The
trainings that use them: test_resume.py (one process), test_distributed.py (several).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import List

import pytest

from kerasmgpu.process import backups

pytestmark = [pytest.mark.core, pytest.mark.pure]


def _write(directory: Path, number: int, shares: List[int] = (), size: int = 1000) -> Path:
    """Generation `number` as the chief writes it (and the shares as processes do)."""
    staging = Path(backups.stage(str(directory), number))
    (staging / "latest.weights.h5").write_bytes(bytes(range(256)) * (size // 256 + 1))
    (staging / "sub").mkdir()
    (staging / "sub" / "record.json").write_text('{"epoch": 1}')
    final = backups.commit(str(directory), number, str(staging),
                           {"position": {"epoch": 1, "steps": 2, "batch": 1},
                            "job": None, "shares": list(shares)})
    for rank in shares:
        backups.write_share(str(directory), number, rank, _zip)
    return Path(final)


def _zip(path: str) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metric_0.npy", b"x" * 100)


def test_the_newest_complete_generation_is_chosen_and_numbers_only_grow(tmp_path: Path) -> None:
    assert backups.choose(str(tmp_path / "none")).chosen is None  # no directory yet
    _write(tmp_path, 1)
    _write(tmp_path, 2)
    backups.stage(str(tmp_path), 3)  # a write a kill interrupted: never read
    choice = backups.choose(str(tmp_path))
    assert choice.chosen is not None and choice.chosen.number == 2
    assert choice.problems == []  # a staging directory is no backup, and no fault
    assert choice.next_number == 4  # not 3: its leftover is there
    assert choice.chosen.manifest["position"] == {"epoch": 1, "steps": 2, "batch": 1}
    assert sorted(choice.chosen.manifest["files"]) == ["latest.weights.h5", "sub/record.json"]


def test_a_damaged_generation_is_named_with_its_fault(tmp_path: Path) -> None:
    _write(tmp_path, 1)
    newest = _write(tmp_path, 2)
    weights = newest / "latest.weights.h5"
    with open(weights, "r+b") as f:
        f.truncate(500)
    choice = backups.choose(str(tmp_path))
    assert choice.chosen is not None and choice.chosen.number == 1
    assert choice.problems == [
        (2, f"{weights} holds 500 bytes where 1024 were written (truncated)")]
    data = bytearray((tmp_path / backups.GENERATION.format(1) / "sub" / "record.json")
                     .read_bytes())
    data[2] ^= 1
    (tmp_path / backups.GENERATION.format(1) / "sub" / "record.json").write_bytes(data)
    (newest / backups.MANIFEST).unlink()
    choice = backups.choose(str(tmp_path))
    assert choice.chosen is None
    assert [n for n, _ in choice.problems] == [2, 1]
    assert "kerasmgpu_manifest.json is missing (the backup was not completed)" in \
        choice.problems[0][1]
    assert "record.json does not match its checksum" in choice.problems[1][1]


def test_a_generation_without_every_share_is_incomplete(tmp_path: Path) -> None:
    _write(tmp_path, 1, shares=[1, 2])
    newest = _write(tmp_path, 2, shares=[1, 2])
    os.remove(tmp_path / backups.SHARE.format(2, 2))  # process 2 died before its write
    choice = backups.choose(str(tmp_path))
    assert choice.chosen is not None and choice.chosen.number == 1
    assert "process 2 did not write its share" in choice.problems[0][1]
    assert backups.complete(str(tmp_path), 1) and not backups.complete(str(tmp_path), 2)
    # A share whose bytes changed fails its zip checksum.
    share = tmp_path / backups.SHARE.format(1, 1)
    data = bytearray(share.read_bytes())
    data[data.index(b"xxxx")] = ord("y")
    share.write_bytes(bytes(data))
    assert backups.choose(str(tmp_path)).chosen is None
    assert newest.exists()


def test_older_generations_go_only_once_a_newer_one_is_complete(tmp_path: Path) -> None:
    _write(tmp_path, 1, shares=[1])
    _write(tmp_path, 2, shares=[1])
    os.remove(tmp_path / backups.SHARE.format(2, 1))
    backups.stage(str(tmp_path), 3)  # a leftover of a killed write
    backups.prune(str(tmp_path), below=3)
    # 2 lacks a share: 1 stays, the newest complete one.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".kerasmgpu-staging-000003", "kerasmgpu-backup-000001",
        "kerasmgpu-backup-000001.process1.npz", "kerasmgpu-backup-000002"]
    _write(tmp_path, 4, shares=[1])
    backups.prune(str(tmp_path), below=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "kerasmgpu-backup-000004", "kerasmgpu-backup-000004.process1.npz"]
    _write(tmp_path, 5)
    backups.prune(str(tmp_path), below=6, keep=2)  # double checkpointing
    assert sorted(p.name for p in tmp_path.iterdir())[:2] == [
        "kerasmgpu-backup-000004", "kerasmgpu-backup-000004.process1.npz"]
    (tmp_path / "user-file").write_text("kept")
    backups.remove_all(str(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ["user-file"]


def test_a_file_is_replaced_whole_or_not_at_all(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "model.weights.h5"
    written: List[str] = []

    def save(filepath: str, overwrite: bool = True) -> str:
        written.append(filepath)
        Path(filepath).write_text(f"weights {len(written)}")
        return "saved"

    atomic = backups.saving_atomically(save)
    assert atomic(str(target)) == "saved"
    # Written under a temporary name in the same directory, ending as the target does.
    assert written[0] != str(target) and written[0].endswith("-model.weights.h5")
    assert os.path.dirname(written[0]) == str(tmp_path)
    assert target.read_text() == "weights 1"

    def killed(point: str, path: str) -> None:
        if point == "replace":
            raise KeyboardInterrupt  # anything, at the last instant before the rename

    monkeypatch.setattr(backups, "reached", killed)
    with pytest.raises(KeyboardInterrupt):
        atomic(filepath=str(target))
    assert target.read_text() == "weights 1"
    assert [p.name for p in tmp_path.iterdir()] == ["model.weights.h5"]
    monkeypatch.undo()
    # A TensorFlow checkpoint prefix, a file object, or no overwrite of an existing
    # file: Keras's own write.
    for args, kwargs in (((str(tmp_path / "ckpt"),), {}), ((str(target), False), {})):
        atomic(*args, **kwargs)
        assert written[-1] == args[0]
    atomic(str(target))
    assert target.read_text() == f"weights {len(written)}"
    assert json.dumps(backups.POINTS)  # the names the fault-injection tests use
