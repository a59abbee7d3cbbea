"""Backups as atomic sets: every file of one backup becomes visible together, or none does.

A process can be killed at any instant - by a scheduler, the OOM killer, a node that
goes away - and a job that runs for days meets every instant of a save. So a backup is
never written where the last complete one lies. Under a `BackupAndRestore(backup_dir)`
that kerasmgpu follows, the directory holds:

    backup_dir/
      kerasmgpu-backup-000007/             one complete backup ("generation" 7):
        latest.weights.h5                    Keras 3's weights and optimizer state, and
        training_metadata.json               its epoch record (tf.keras: chief/ckpt-N.*)
        kerasmgpu_position.npz               the step, and the epoch's metric states
        kerasmgpu_manifest.json              written last: each file's size and SHA-256,
                                             the position, the job that wrote it
      kerasmgpu-backup-000007.process1.npz  process 1's share of the metrics (torch)
      .kerasmgpu-staging-000008/            the next backup while it is written

The chief writes a generation into its staging directory, fsyncs every file, writes the
manifest, and renames the directory to the generation's name - one rename, atomic on a
POSIX file system (and on NFS, where it is one server operation). A process that keeps
its own share writes one file under a temporary name and renames it. A generation is
complete when its directory exists, every file matches the manifest, and every share the
manifest names is there and readable; the newest complete one is the backup. Older
generations are removed only after a newer one is complete, so a kill at any instant
leaves the last complete backup readable. Numbers only grow: every process of a job
starts from the same listing (the largest number present, plus one), so a restarted job
never writes a generation, or a share, under the name of one a killed run left.

`replace_atomically` is the same rule for one file (a model saved by the chief): written
under a temporary name in the same directory, fsynced, renamed over the old one.

`reached` is called at each point of a write (`POINTS`): the fault-injection tests
replace it to kill a process there. Nothing here imports a framework or NumPy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

GENERATION = "kerasmgpu-backup-{:06d}"
STAGING = ".kerasmgpu-staging-{:06d}"
SHARE = "kerasmgpu-backup-{:06d}.process{}.npz"
MANIFEST = "kerasmgpu_manifest.json"
FORMAT = 1
_NAMES = re.compile(r"^(?:\.kerasmgpu-staging-|kerasmgpu-backup-)(\d{6})(?:\.process\d+\.npz)?$")

# Where a backup's write can be interrupted, in order: the save begins; Keras's files
# are written ("weights": a kill during that write leaves them truncated); kerasmgpu's
# position is about to be written; the manifest and the rename (the commit) are next;
# a process is about to write its own share; the backup is complete; and, for
# `replace_atomically`, a model file is about to replace the old one.
POINTS = ("before", "weights", "position", "commit", "share", "after", "replace")


def reached(point: str, path: str) -> None:
    """Called at each point of a backup's write (`POINTS`) with the file or directory
    being written; does nothing. The fault-injection tests replace it."""


@dataclass
class Generation:
    number: int
    path: str
    manifest: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Choice:
    """What a backup directory holds: the newest complete generation (None without
    one), and why each newer one cannot be restored."""

    chosen: Optional[Generation]
    problems: List[Tuple[int, str]]
    next_number: int


def _fsync(path: str) -> None:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if os.path.isdir(path) else os.O_RDONLY
    try:
        descriptor = os.open(path, flags)
    except OSError:
        return  # a platform that cannot open a directory (Windows): rename is what we have
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # a file system without fsync on directories
    finally:
        os.close(descriptor)


def _digest(path: str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _files_under(directory: str) -> List[str]:
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            found.append(os.path.relpath(os.path.join(root, name), directory))
    return sorted(found)


def stage(directory: str, number: int) -> str:
    """A fresh staging directory for generation `number` (a leftover one of that number,
    from a killed run, is removed first)."""
    path = os.path.join(directory, STAGING.format(number))
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def commit(directory: str, number: int, staging: str, record: Dict[str, Any]) -> str:
    """Make `staging` generation `number`: every file fsynced, the manifest (its files'
    sizes and checksums, and `record`) written last, then one rename."""
    files = {}
    for name in _files_under(staging):
        path = os.path.join(staging, name)
        _fsync(path)
        files[name] = {"bytes": os.path.getsize(path), "sha256": _digest(path)}
    for root, _, _ in os.walk(staging):
        _fsync(root)
    manifest = {"format": FORMAT, "number": number, "files": files, **record}
    write_text(os.path.join(staging, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
    reached("commit", staging)
    final = os.path.join(directory, GENERATION.format(number))
    os.rename(staging, final)
    _fsync(directory)
    return final


def write_text(path: str, text: str) -> None:
    """`text` into `path`, complete or not at all."""
    def write(temporary: str) -> None:
        with open(temporary, "w") as f:
            f.write(text)
    _replace(path, write, point=None)


def write_share(directory: str, number: int, rank: int, write: Callable[[str], None]) -> str:
    """Process `rank`'s share of generation `number`: `write(path)` writes it (an .npz
    file) under a temporary name, which is renamed into place when complete."""
    path = os.path.join(directory, SHARE.format(number, rank))
    reached("share", path)
    _replace(path, write, point=None)
    return path


def replace_atomically(path: str, write: Callable[[str], Any]) -> Any:
    """Call `write(temporary)` to write a file, then make it `path`: the temporary name is
    in the same directory and ends as `path` does (Keras reads the format from the
    ending), the file is fsynced and renamed over `path`, and the directory fsynced. A
    kill before the rename leaves the old file; an exception removes the temporary one."""
    return _replace(path, write, point="replace")


# The model files Keras writes as one file (read by their ending); a TensorFlow
# checkpoint prefix or a SavedModel directory is several files, written as TF writes them.
ONE_FILE = (".keras", ".h5", ".hdf5")


def saving_atomically(save: Callable[..., Any]) -> Callable[..., Any]:
    """`save` (a model's bound `save` or `save_weights`) writing a .keras, .h5 or .hdf5
    file through `replace_atomically`: a kill leaves the old file or the new one, never a
    truncated one. Other targets, and a file that exists with `overwrite=False` (Keras
    asks), go to `save` as they are."""

    def atomic(*args: Any, **kwargs: Any) -> Any:
        by_name = not args
        target = kwargs.get("filepath") if by_name else args[0]
        path = os.fspath(target) if isinstance(target, (str, os.PathLike)) else ""
        overwrite = args[1] if len(args) > 1 else kwargs.get("overwrite", True)
        if (not str(path).endswith(ONE_FILE) or "://" in str(path)
                or (not overwrite and os.path.exists(path))):
            return save(*args, **kwargs)

        def write(temporary: str) -> Any:
            if by_name:
                return save(*args, **{**kwargs, "filepath": temporary})
            return save(temporary, *args[1:], **kwargs)

        return replace_atomically(str(path), write)

    atomic.__wrapped__ = save  # type: ignore[attr-defined]
    atomic._kerasmgpu_atomic = True  # type: ignore[attr-defined]
    return atomic


def _replace(path: str, write: Callable[[str], Any], point: Optional[str]) -> Any:
    directory, base = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, f".kerasmgpu-{os.getpid()}-{base}")
    try:
        result = write(temporary)
        _fsync(temporary)
        if point is not None:
            reached(point, temporary)
        os.replace(temporary, path)
    except BaseException:
        _remove(temporary)
        raise
    _fsync(directory)
    return result


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _numbered(directory: str) -> Dict[int, List[str]]:
    found: Dict[int, List[str]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        match = _NAMES.match(name)
        if match:
            found.setdefault(int(match.group(1)), []).append(name)
    return found


def verify(generation: Generation) -> Optional[str]:
    """What is wrong with a committed generation (None: it is complete): the file and
    the fault, in words."""
    path = os.path.join(generation.path, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
        files = manifest["files"]
        shares = [int(r) for r in manifest.get("shares", [])]
    except FileNotFoundError:
        return f"{path} is missing (the backup was not completed)"
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"{path} cannot be read ({error})"
    for name, expected in sorted(files.items()):
        file = os.path.join(generation.path, name)
        if not os.path.exists(file):
            return f"{file} is missing"
        size = os.path.getsize(file)
        if size != expected["bytes"]:
            return f"{file} holds {size} bytes where {expected['bytes']} were written (truncated)"
        if _digest(file) != expected["sha256"]:
            return f"{file} does not match its checksum (changed after it was written)"
    for rank in shares:
        problem = _share_problem(os.path.dirname(generation.path), generation.number, rank)
        if problem:
            return problem
    generation.manifest = manifest
    return None


def _share_problem(directory: str, number: int, rank: int) -> Optional[str]:
    path = os.path.join(directory, SHARE.format(number, rank))
    if not os.path.exists(path):
        return (f"{path} is missing: process {rank} did not write its share of this backup "
                "(it stopped between the processes' writes)")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile) as error:
        return f"{path} cannot be read ({error})"
    if bad is not None:
        return f"{path} does not match its checksum ({bad})"
    return None


def choose(directory: str) -> Choice:
    """The newest complete generation in `directory`, why each newer one is not, and the
    number the next backup takes (every process reads the same listing)."""
    numbered = _numbered(directory)
    committed = sorted((n for n, names in numbered.items()
                        if GENERATION.format(n) in names), reverse=True)
    problems: List[Tuple[int, str]] = []
    chosen = None
    for number in committed:
        generation = Generation(number, os.path.join(directory, GENERATION.format(number)))
        problem = verify(generation)
        if problem is None:
            chosen = generation
            break
        problems.append((number, problem))
    return Choice(chosen, problems, max(numbered, default=0) + 1)


def complete(directory: str, number: int) -> bool:
    """Whether generation `number` is committed with every share it names (by
    presence: a cheap check for pruning, not a verification)."""
    path = os.path.join(directory, GENERATION.format(number), MANIFEST)
    try:
        with open(path) as f:
            shares = [int(r) for r in json.load(f).get("shares", [])]
    except (OSError, ValueError, TypeError):
        return False
    return all(os.path.exists(os.path.join(directory, SHARE.format(number, r))) for r in shares)


def prune(directory: str, below: int, keep: int = 1) -> None:
    """Remove what belongs to generations older than the `keep` newest complete ones
    numbered below `below` (the one being written and newer stay)."""
    numbered = _numbered(directory)
    kept = [n for n in sorted(numbered, reverse=True) if n < below and complete(directory, n)]
    if len(kept) < keep:
        return
    oldest_kept = kept[keep - 1]
    for number, names in numbered.items():
        if number >= oldest_kept:
            continue
        for name in names:
            _remove(os.path.join(directory, name))


def remove_all(directory: str) -> None:
    """Every generation, share and staging directory (a fit that ended deletes its
    backup); other files in `directory` stay."""
    for names in _numbered(directory).values():
        for name in names:
            _remove(os.path.join(directory, name))
