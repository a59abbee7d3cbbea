"""A file written whole or not at all: what a user's files - a migrated source, pinned
constraints, benchmark results - must be when a write is cut (a kill, Ctrl-C, a full
disk), since the old file is gone the moment a plain `open(path, "w")` truncates it.

The data goes to a temporary file beside the target (same directory: same filesystem),
synced, given the target's mode, owner and group (a new file: the mode a plain write
would make), and renamed over the target: a reader, or a kill at any instant, sees the
old file (or none) or the new one. A kill between the two leaves the temporary file
(`.<name>.*.kerasmgpu-tmp`) beside the target, never a part of the target.
"""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomic(path: str, data: bytes) -> None:
    """Replace (or create) `path` by `data` in one step."""
    target = os.path.realpath(path)  # through a symlink, so the link stays a link
    try:
        info = os.stat(target)
        mode, owner = info.st_mode & 0o7777, (info.st_uid, info.st_gid)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode, owner = 0o666 & ~umask, None
    directory, name = os.path.split(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".kerasmgpu-tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if owner is not None and hasattr(os, "chown"):
            with contextlib.suppress(OSError):  # only root may give a file away; best effort
                os.chown(tmp, *owner)
        # After the chown, which clears setuid/setgid; mkstemp makes 0600.
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
