"""A team's own test matrix, for real: a Keras 2.3 project's tests under tox, before and
after `kerasmgpu migrate`, on the pins `kerasmgpu pins --write` gives it.

tests/sample_project/ is such a project: a package that trains with `multi_gpu_model`
from a generator (`fit_generator`, `Adam(lr=...)`, `keras.layers.core`), its own pytest
test, and a tox.ini made of the lines `kerasmgpu pins --write constraints keras23
keras3.15-jax` prints plus the team's own. On a copy, this test:

1. runs the command, and checks that tox.ini holds every line it printed, in order;
2. `tox -e keras23`: the team's test passes on Keras 2.3.1 (before);
3. `tox -e keras3.15-jax`: it fails there before migrating - the matrix shows the work;
4. `kerasmgpu migrate --to keras3 --write`, then `tox -e keras3.15-jax`: it passes (after).

Each tox run is a real nested tox (with tox-uv, like kerasmgpu's own CI) installing the
pinned packages - from the local uv cache when the matrix already ran - and kerasmgpu
from this checkout. It runs in the `sample-project` tox env, which has tox; elsewhere it
is skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

pytest.importorskip("tox", reason="runs tox itself: the `sample-project` tox env has it")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = Path(__file__).resolve().parent / "sample_project"
ENVS = ["keras23", "keras3.15-jax"]
TOX_TIMEOUT = 1500  # creating an env (TensorFlow or JAX from the uv cache) and its tests


def _environment() -> Dict[str, str]:
    """What a developer's shell has: none of this test session's own settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TOX_", "KERASMGPU_", "PIP_", "UV_"))
           and k not in ("KERAS_BACKEND", "TF_USE_LEGACY_KERAS", "PYTHONPATH", "VIRTUAL_ENV",
                         "XLA_FLAGS")}
    for keep in ("UV_HTTP_TIMEOUT", "UV_CACHE_DIR", "PIP_FIND_LINKS", "PIP_INDEX_URL"):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    return env


def _run(args: List[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=str(cwd), env=_environment(), capture_output=True,
                          text=True, timeout=timeout)


def _tox(project: Path, env: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "tox", "-e", env, "--workdir",
                 str(project.parent / "tox-work")], project, TOX_TIMEOUT)


def _tail(done: subprocess.CompletedProcess) -> str:
    return (done.stdout + done.stderr)[-6000:]


def test_the_team_tests_keras23_then_migrates_and_tests_keras3(tmp_path: Path) -> None:
    project = tmp_path / "digits-classifier"
    shutil.copytree(SAMPLE, project)

    printed = _run([sys.executable, "-m", "kerasmgpu", "pins", "--write", "constraints", *ENVS,
                    "--source", str(ROOT)], project, 120)
    assert printed.returncode == 0, _tail(printed)
    assert sorted(p.name for p in (project / "constraints").iterdir()) == sorted(
        [f"{e}.{kind}" for e in ENVS for kind in ("in", "txt")] + ["kerasmgpu.in"])
    assert (project / "constraints" / "kerasmgpu.in").read_text().splitlines()[-1] == \
        f"kerasmgpu @ {ROOT.as_uri()}"
    tox_ini = (project / "tox.ini").read_text().splitlines()
    position = 0
    for line in printed.stdout.splitlines():  # every printed line, in order
        assert line in tox_ini[position:], f"tox.ini lacks {line!r} (after line {position})"
        position = tox_ini.index(line, position) + 1

    before = _tox(project, "keras23")
    assert before.returncode == 0, _tail(before)
    assert "1 passed" in before.stdout

    unmigrated = _tox(project, "keras3.15-jax")
    assert unmigrated.returncode != 0, _tail(unmigrated)
    # The Keras 2.3 opt-in says what it is for.
    assert "remove `import kerasmgpu.keras23`" in unmigrated.stdout + unmigrated.stderr

    migrated = _run([sys.executable, "-m", "kerasmgpu", "migrate", "--to", "keras3", "--write",
                     "digits", "tests"], project, 300)
    assert migrated.returncode == 0, _tail(migrated)
    after = _tox(project, "keras3.15-jax")
    assert after.returncode == 0, migrated.stdout + _tail(after)
    assert "1 passed" in after.stdout
