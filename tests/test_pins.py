"""`kerasmgpu pins`: the tested releases ship in the package and reach a project's tox.ini.

The pin files in kerasmgpu/pins/ must be the ones the matrix ran with
(compat/constraints/), byte for byte - in tox envs the package is the installed wheel,
so this also checks that the wheel carries them. What `kerasmgpu pins --write` gives a
project is checked here as files and as tox configuration; tests/test_sample_project.py
runs it with tox on a Keras 2.3 project.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

from kerasmgpu import pins

ROOT = Path(__file__).resolve().parents[1]
COMPAT = ROOT / "compat" / "constraints"

pytestmark = pytest.mark.pure


def test_the_package_ships_the_tested_pins_unchanged() -> None:
    tested = {p.name: p.read_bytes() for p in COMPAT.iterdir() if p.suffix in (".in", ".txt")}
    shipped = {p.name: p.read_bytes() for p in pins.HERE.iterdir()
               if p.suffix in (".in", ".txt")}
    assert sorted(shipped) == sorted(tested), (
        "kerasmgpu/pins/ and compat/constraints/ list other files; after regenerating "
        "compat/constraints, run: cp compat/constraints/*.in compat/constraints/*.txt "
        "kerasmgpu/pins/")
    changed = [name for name in tested if shipped[name] != tested[name]]
    assert not changed, f"{changed} differ from compat/constraints/: copy them over"


def test_every_env_of_the_matrix_has_pins_and_a_line() -> None:
    tox_envs = {p.stem for p in COMPAT.glob("*.txt")}
    assert set(pins.available()) == tox_envs
    assert set(pins.NEWEST) <= tox_envs
    jax_pin = pins.get("keras3.15-jax")
    assert jax_pin.line == "Keras 3.15.1 on JAX 0.10.2"
    assert jax_pin.requirements == ("jax[cpu]==0.10.2", "keras==3.15.1")  # no `-r _common.in`
    assert jax_pin.backend == "jax" and not jax_pin.legacy_tf_keras
    assert pins.get("keras23").line == "Keras 2.3.1 on TensorFlow 2.15.1"
    assert pins.get("tfkeras2.21").line == "tf_keras 2.21.0 on TensorFlow 2.21.0"
    assert pins.get("tfkeras2.21").legacy_tf_keras
    assert pins.get("tf2.12").line == "tf.keras 2.12.0 on TensorFlow 2.12.1"


def test_an_unknown_env_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"Received: env='keras3.99-jax'.*keras3.15-jax.*"
                                         r"Fix: run `kerasmgpu pins`"):
        pins.get("keras3.99-jax")


def test_local_version_labels_leave_the_written_pins() -> None:
    assert pins.portable("torch==2.13.0+cpu\nkeras==3.15.1\n# torch==1+x\n") == (
        "torch==2.13.0\nkeras==3.15.1\n# torch==1+x\n")


def test_written_pins_and_tox_lines_fit_together(tmp_path: Path) -> None:
    envs = ["keras23", "keras3.15-torch", "tfkeras2.21"]
    written = pins.write(tmp_path / "constraints", envs, "9.9")
    assert sorted(p.name for p in written) == sorted(
        f"{e}.{kind}" for e in envs for kind in ("in", "txt"))
    torch_txt = (tmp_path / "constraints" / "keras3.15-torch.txt").read_text()
    assert "torch==2.13.0\n" in torch_txt and "+cpu" not in torch_txt
    assert torch_txt.startswith("# kerasmgpu 9.9: Keras 3.15.1 on PyTorch 2.13.0")
    assert "keras==3.15.1" in (tmp_path / "constraints" / "keras3.15-torch.in").read_text()

    ini = configparser.ConfigParser(interpolation=None)
    ini.read_string(pins.tox_snippet("constraints", envs))
    assert ini["tox"]["env_list"].split() == envs
    env = ini["testenv"]
    assert "-r {toxinidir}/constraints/{envname}.in" in env["deps"]
    assert "PIP_CONSTRAINT = {toxinidir}/constraints/{envname}.txt" in env["set_env"]
    assert "tfkeras2.21: TF_USE_LEGACY_KERAS = 1" in env["set_env"]
    assert "torch: KERAS_BACKEND = torch" in env["set_env"]
    assert "jax: KERAS_BACKEND" not in env["set_env"]  # no JAX env chosen
    assert "keras23: python -m pip install --quiet --no-deps keras==2.3.1" in env["commands_pre"]
    for name in envs:  # the files the lines name exist for every env
        for kind in ("in", "txt"):
            assert (tmp_path / "constraints" / f"{name}.{kind}").is_file()


def _pins_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kerasmgpu", "pins", *args], cwd=str(cwd),
                          capture_output=True, text=True, timeout=120)


def test_the_kerasmgpu_requirement_comes_from_the_source_or_the_install_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert pins.requirement(str(tmp_path)) == f"kerasmgpu @ {tmp_path.as_uri()}"
    url = "git+https://github.com/kerasmgpu/kerasmgpu@v0.1.0"
    assert pins.requirement(url) == f"kerasmgpu @ {url}"
    assert pins.requirement("kerasmgpu==0.1.0") == "kerasmgpu==0.1.0"
    # PEP 610 records: a checkout folder, a wheel, a VCS URL; none: the PyPI name.
    folder = {"url": "file:///src/kerasmgpu", "dir_info": {"editable": True}}
    assert pins.requirement_from_direct_url(folder) == "kerasmgpu @ file:///src/kerasmgpu"
    wheel = {"url": "file:///w/kerasmgpu-0.1.0-py3-none-any.whl", "archive_info": {}}
    assert pins.requirement_from_direct_url(wheel) == \
        "kerasmgpu @ file:///w/kerasmgpu-0.1.0-py3-none-any.whl"
    vcs = {"url": "https://github.com/kerasmgpu/kerasmgpu",
           "vcs_info": {"vcs": "git", "commit_id": "ab12"}, "subdirectory": "py"}
    assert pins.requirement_from_direct_url(vcs) == \
        "kerasmgpu @ git+https://github.com/kerasmgpu/kerasmgpu@ab12#subdirectory=py"
    monkeypatch.setattr(pins, "installed_requirement", lambda: None)
    assert pins.requirement() == "kerasmgpu"


def test_the_command_lists_prints_a_path_and_writes(tmp_path: Path) -> None:
    listed = _pins_command(cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "keras3.15-jax          Keras 3.15.1 on JAX 0.10.2: jax[cpu]==0.10.2 keras==3.15.1" \
        in listed.stdout
    path = _pins_command("keras23", cwd=tmp_path)
    assert path.returncode == 0 and Path(path.stdout.strip()).read_bytes() == \
        (COMPAT / "keras23.txt").read_bytes()
    wrote = _pins_command("--write", "ci/pins", cwd=tmp_path)
    assert wrote.returncode == 0, wrote.stderr
    assert sorted(p.stem for p in (tmp_path / "ci" / "pins").glob("*.txt")) == sorted(pins.NEWEST)
    assert wrote.stdout == pins.tox_snippet("ci/pins", pins.NEWEST, with_kerasmgpu=True)
    assert "    -r {toxinidir}/ci/pins/kerasmgpu.in\n" in wrote.stdout  # stdout: only the lines
    # kerasmgpu itself, from where this one was installed (a wheel or a folder here).
    assert (tmp_path / "ci" / "pins" / "kerasmgpu.in").read_text().splitlines()[-1] == \
        pins.requirement()
    wheel = _pins_command("--write", "w", "keras23", "--source", "dist/x.whl", cwd=tmp_path)
    assert wheel.returncode == 0, wheel.stderr
    assert (tmp_path / "w" / "kerasmgpu.in").read_text().splitlines()[-1] == \
        f"kerasmgpu @ {(tmp_path / 'dist' / 'x.whl').as_uri()}"
    bad = _pins_command("keras2.2", cwd=tmp_path)
    assert bad.returncode == 2 and "Invalid `env`" in bad.stderr
