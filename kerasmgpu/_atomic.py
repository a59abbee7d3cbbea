"""A file written whole or not at all: what a user's files - a migrated source, pinned
constraints, benchmark results - must be when a write is cut (a kill, Ctrl-C, a full
disk), since the old file is gone the moment a plain `open(path, "w")` truncates it.

The data goes to a temporary file beside the target (same directory: same filesystem),
synced, given the target's mode, owner and group (a new file: the mode a plain write
would make), and renamed over the target: a reader, or a kill at any instant, sees the
old file (or none) or the new one. A kill between the two leaves the temporary file
(`.<name>.<host>-<pid>.*.kerasmgpu-tmp`) beside the target, never a part of the target;
the next write of that target removes it where its writer, a process of this host, is
gone (a live writer's, or another host's on a shared filesystem, is left alone: its
rename still needs it).
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile

_SUFFIX = ".kerasmgpu-tmp"


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
    _remove_left_behind(directory, name)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.{_writer()}.", suffix=_SUFFIX, dir=directory)
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


def _writer() -> str:
    """This process, as the temporary file's name gives it: `<host>-<pid>` (a host name
    without dots or dashes of its own, so the pid is the part after the last dash)."""
    host = "".join(c for c in socket.gethostname().split(".")[0] if c.isalnum()) or "host"
    return f"{host}-{os.getpid()}"


def _remove_left_behind(directory: str, name: str) -> None:
    """The temporary files of `name` that a killed writer of this host left (its pid no
    longer runs); best effort - a file another cleaner took first is no error."""
    host = _writer().rsplit("-", 1)[0]
    prefix = f".{name}.{host}-"
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        if not (entry.startswith(prefix) and entry.endswith(_SUFFIX)):
            continue
        pid = entry[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, entry))


def _running(pid: int) -> bool:
    if pid == os.getpid() or os.name != "posix":  # (Windows' os.kill would end it)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):  # another user's process: it runs
        return True
    return True
