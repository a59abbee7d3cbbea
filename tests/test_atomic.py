"""A user's file written whole or not at all (`kerasmgpu._atomic`): the source `kerasmgpu
migrate --write` rewrites, the pins `kerasmgpu pins --write` writes into a project, the
results `kerasmgpu bench` writes. A plain `open(path, "w")` truncates the old file at
once, so a kill during the write left a part of the new one (pins and bench wrote so).

The writer is killed with SIGKILL at instants spread over a write, in a process of its
own, as a user's Ctrl-C or an OOM kill cuts it: the target is always the old file or
the new one, whole. No framework: every env gives the same answer (tox.ini, `pure`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from kerasmgpu import pins
from kerasmgpu._atomic import write_atomic

pytestmark = [pytest.mark.core, pytest.mark.pure]

SIZE = 64 * 1024 * 1024  # long enough a write (with its fsync) to be cut in its middle
WRITER = ("import sys\nfrom kerasmgpu._atomic import write_atomic\n"
          "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
          f"write_atomic(sys.argv[1], b'n' * {SIZE})\n")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="SIGKILL: POSIX")
def test_a_write_killed_at_any_instant_leaves_the_old_file_or_the_new(tmp_path: Path) -> None:
    target = tmp_path / "constraints.txt"
    old, new = b"o" * 1000, b"n" * SIZE
    outcomes = set()
    cut = 0
    for delay in (0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6):
        target.write_bytes(old)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target)],
                                  stdout=subprocess.PIPE)
        try:
            assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
            time.sleep(delay)
            writer.send_signal(signal.SIGKILL)
        finally:
            writer.wait(timeout=60)
        data = target.read_bytes()
        assert data in (old, new), f"a part: {len(data)} bytes after {delay} s"
        outcomes.add(data == new)
        left = _left(tmp_path)
        cut += bool(left)  # killed mid-write: the partial file is beside, not the target
        if left:  # ... and the next write of the target removes it (its writer is gone)
            write_atomic(str(target), old)
            assert not _left(tmp_path) and target.read_bytes() == old
    assert cut, "no kill landed during a write: the test proves nothing"
    assert False in outcomes


def _left(directory: Path) -> List[Path]:
    return [p for p in directory.iterdir() if p.name.endswith(".kerasmgpu-tmp")]


@pytest.mark.skipif(os.name != "posix", reason="a writer's pid is read on POSIX")
def test_a_live_writers_or_another_hosts_temporary_file_is_left_alone(tmp_path: Path
                                                                       ) -> None:
    """Only a file whose writer - a process of this host - is gone is removed: a live
    writer's rename, or another host's on a shared filesystem, still needs its own."""
    from kerasmgpu import _atomic

    target = tmp_path / "bench.json"
    host = _atomic._writer().rsplit("-", 1)[0]
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {"gone": f".bench.json.{host}-{gone}.x1.kerasmgpu-tmp",
                 "alive": f".bench.json.{host}-{alive.pid}.x2.kerasmgpu-tmp",
                 "other host": f".bench.json.{host}x-{gone}.x3.kerasmgpu-tmp",
                 "other file": f".other.json.{host}-{gone}.x4.kerasmgpu-tmp"}
        for name in names.values():
            (tmp_path / name).write_bytes(b"part")
        write_atomic(str(target), b"{}")
    finally:
        alive.kill()
        alive.wait(timeout=60)
    assert target.read_bytes() == b"{}"
    assert sorted(p.name for p in _left(tmp_path)) == sorted(
        names[k] for k in ("alive", "other host", "other file"))


def test_a_new_file_gets_the_mode_a_plain_write_gives_and_an_old_one_keeps_its_own(
        tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    fresh = tmp_path / "fresh"
    write_atomic(str(fresh), b"y")
    assert fresh.read_bytes() == b"y"
    assert fresh.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    os.chmod(plain, 0o640)
    write_atomic(str(plain), b"z")
    assert plain.read_bytes() == b"z" and plain.stat().st_mode & 0o777 == 0o640
    link = tmp_path / "link"
    link.symlink_to(plain)
    write_atomic(str(link), b"w")
    assert link.is_symlink() and plain.read_bytes() == b"w"
    assert not _left(tmp_path)


def test_the_pins_are_written_through_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    """`kerasmgpu pins --write` overwrites a project's constraint files: each goes
    through the atomic writer (a plain write truncated the old file first)."""
    written = []

    def recording(path: str, data: bytes) -> None:
        written.append(Path(path).name)
        write_atomic(path, data)

    monkeypatch.setattr(pins, "write_atomic", recording)
    env = pins.available()[0]
    paths = pins.write(tmp_path, [env], "0")
    paths.append(pins.write_requirement(tmp_path, "kerasmgpu"))
    assert sorted(written) == sorted(p.name for p in paths)
    assert all(p.read_text().startswith("# kerasmgpu") for p in paths)
