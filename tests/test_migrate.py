"""`kerasmgpu migrate`: the command, its report, and what it does to files.

The rule families have their own files (tests/test_migrate_<family>.py). Pure
source-to-source tests: they need libcst (the `test` extra) and no ML framework.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest
from migrate_cases import assert_idempotent

from kerasmgpu.migrate import (
    DEFAULT_TARGET,
    Finding,
    MigrationError,
    MigrationResult,
    Severity,
    Target,
    main,
    migrate_source,
)
from kerasmgpu.migrate.report import moved_lines, relocate

REPO_ROOT = Path(__file__).resolve().parents[1]

OLD = "import keras\n\n# keep\np = keras.utils.multi_gpu_model(m, 2)\n"
NEW = "import keras\nimport kerasmgpu\n\n# keep\np = kerasmgpu.parallelize(m, gpus=2)\n"
NEW_KERAS23 = (
    "import keras\nimport kerasmgpu.legacy\n\n# keep\np = kerasmgpu.legacy.multi_gpu_model(m, 2)\n"
)
# Nothing to rewrite, but an ERROR: a Keras 1 argument that cannot be converted.
ONLY_ERROR = "import keras\nm.fit_generator(g, samples_per_epoch=100)\n"


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())
    path.chmod(mode)
    os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    return path


def snapshot(path: Path) -> Tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def report_lines(out: str, path: Path) -> List[str]:
    return [line for line in out.splitlines() if line.startswith(f"{path}:")]


# --------------------------------------------------------------------------------------
# migrate_source


@pytest.mark.text
def test_default_target_is_keras3() -> None:
    assert DEFAULT_TARGET is Target.KERAS3
    assert migrate_source(OLD).new_source == NEW
    assert migrate_source(OLD, target="keras23").new_source == NEW_KERAS23
    assert migrate_source(OLD, target=Target.TF_KERAS).new_source != OLD


@pytest.mark.text
def test_unknown_target_is_a_value_error_that_names_the_choices() -> None:
    with pytest.raises(ValueError) as info:
        migrate_source(OLD, target="keras2")
    message = str(info.value)
    assert "Received: target='keras2'" in message
    assert "'keras3', 'tf_keras', 'keras23'" in message


@pytest.mark.text
def test_finding_prints_as_path_line_col_severity_message() -> None:
    finding = Finding("src/train.py", 12, 5, Severity.WARNING, "generators", "what changes")
    assert str(finding) == "src/train.py:12:5: WARNING: what changes"


@pytest.mark.text
def test_findings_are_sorted_by_position_and_carry_their_family() -> None:
    text = "import keras\nm.fit_generator(g, 10)\np = keras.utils.multi_gpu_model(m, 2)\n"
    result = migrate_source(text, "t.py")
    assert [(f.line, f.rule) for f in result.findings] == [(2, "generators"), (3, "multi_gpu")]
    assert [f.col for f in result.findings] == [3, 5]  # the method name; the reference


@pytest.mark.text
def test_unchanged_source_reports_unchanged() -> None:
    text = "import keras\n\nmodel = keras.Sequential()  # nothing to do\n"
    assert migrate_source(text) == MigrationResult(new_source=text, changed=False, findings=[])


@pytest.mark.text
def test_unparsable_source_raises_migration_error() -> None:
    with pytest.raises(MigrationError) as info:
        migrate_source('print "python 2"\n', "old.py")
    assert isinstance(info.value, ValueError)
    assert info.value.filename == "old.py"
    assert (info.value.line, info.value.col) == (1, 1)
    assert "line 1" in info.value.reason
    message = str(info.value)
    assert "old.py" in message and "cannot parse" in message and "2to3" in message


@pytest.mark.text
def test_parse_error_cites_the_line_and_column_of_the_error() -> None:
    # libcst's own position is off when lines follow the error; the report must not be.
    text = 'import os\nimport keras\nprint "hello"\nx = 1\n'
    with pytest.raises(MigrationError) as info:
        migrate_source(text, "old.py")
    assert "(line 3, column 1)" in info.value.reason
    assert "line 4" not in info.value.reason
    assert info.value.line == 3


@pytest.mark.text
@pytest.mark.parametrize("target", list(Target))
def test_crlf_newlines_are_kept(target: Target) -> None:
    before = "import keras\r\n\r\np = keras.utils.multi_gpu_model(m, 2)\r\nm.fit_generator(g, 5)\r\n"
    after = migrate_source(before, target=target).new_source
    assert after != before
    assert "\n" not in after.replace("\r\n", "")


@pytest.mark.text
def test_moved_lines_follow_inserted_and_rewritten_lines() -> None:
    old = "a\nb\nc\nd\n"
    new = "a\nimport x\nB\nc\nd\n"
    assert moved_lines(old, new) == {1: 1, 2: 3, 3: 4, 4: 5}
    finding = Finding("f.py", 3, 1, Severity.INFO, "r", "m")
    assert relocate([finding], old, new)[0].line == 4


# --------------------------------------------------------------------------------------
# The command: modes and exit status


@pytest.mark.text
def test_report_mode_prints_the_report_and_touches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = write(tmp_path / "train.py", OLD)
    before = snapshot(target)
    assert main([str(target)]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first == ("kerasmgpu migrate --to keras3: 1 file(s) to rewrite, 0 unchanged; "
                     "0 ERROR, 0 WARNING, 1 INFO")
    [line] = report_lines(out, target)
    assert line.startswith(f"{target}:4:5: INFO: keras.utils.multi_gpu_model -> "
                           "kerasmgpu.parallelize")
    assert "--- a/" not in out  # no diff without --diff
    assert "run with --write to apply" in out
    assert snapshot(target) == before


@pytest.mark.text
def test_diff_prints_the_unified_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = write(tmp_path / "train.py", OLD)
    before = snapshot(target)
    assert main(["--diff", str(target)]) == 0
    out = capsys.readouterr().out
    shown = str(target).lstrip("/")
    assert f"--- a/{shown}\n+++ b/{shown}\n" in out
    assert "-p = keras.utils.multi_gpu_model(m, 2)\n" in out
    assert "+p = kerasmgpu.parallelize(m, gpus=2)\n" in out
    assert "+import kerasmgpu\n" in out
    assert snapshot(target) == before


@pytest.mark.text
def test_check_exits_1_when_a_file_would_change_then_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = write(tmp_path / "train.py", OLD)
    before = snapshot(target)
    assert main(["--check", "--diff", str(target)]) == 1
    out = capsys.readouterr().out
    assert f"would rewrite: {target}\n" in out
    assert "+p = kerasmgpu.parallelize(m, gpus=2)\n" in out
    assert snapshot(target) == before

    target.write_text(NEW)
    assert main(["--check", str(target)]) == 0
    assert "would rewrite" not in capsys.readouterr().out


@pytest.mark.text
def test_check_fails_on_an_error_alone_and_passes_on_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    erring = write(tmp_path / "a" / "err.py", ONLY_ERROR)
    assert main(["--check", str(erring)]) == 1
    out = capsys.readouterr().out
    assert "would rewrite" not in out
    assert f"{erring}:2:3: ERROR: samples_per_epoch is Keras 1's" in out
    # A vendored multi_gpu_model import is a WARNING: it does not fail the check.
    warned = write(tmp_path / "b" / "warn.py", "from utils.multi_gpu import multi_gpu_model\n")
    assert main(["--check", str(warned)]) == 0
    assert f"{warned}:1:1: WARNING: multi_gpu_model imported from" in capsys.readouterr().out


@pytest.mark.text
def test_help_documents_the_targets_the_default_and_the_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "{keras3,tf_keras,keras23}" in out
    assert "default: keras3, the Keras that `pip install keras` and TensorFlow >= 2.16" in out
    assert "import tf_keras as keras" in out
    assert "exit 1 when a file would be rewritten or an ERROR remains" in out
    assert "Lines cite each file as it is on disk when the command ends" in out


@pytest.mark.text
def test_write_rewrites_and_a_second_write_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = write(tmp_path / "train.py", OLD)
    assert main(["--write", str(target)]) == 0
    assert "1 file(s) rewritten, 0 unchanged" in capsys.readouterr().out
    assert target.read_text() == NEW
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # no temp file left behind

    os.utime(target, ns=(10**18, 10**18))
    before = snapshot(target)
    assert main(["--write", str(target)]) == 0
    assert "0 file(s) rewritten, 1 unchanged" in capsys.readouterr().out
    assert snapshot(target) == before


@pytest.mark.text
@pytest.mark.parametrize("target", ["keras3", "tf_keras", "keras23"])
def test_to_chooses_the_target(target: str, tmp_path: Path) -> None:
    path = write(tmp_path / "train.py", OLD)
    assert main(["--write", "--to", target, str(path)]) == 0
    expected = migrate_source(OLD, target=target).new_source
    assert path.read_text() == expected
    if target == "keras23":
        assert expected == NEW_KERAS23


@pytest.mark.text
def test_write_preserves_file_mode(tmp_path: Path) -> None:
    target = write(tmp_path / "run.py", OLD, mode=0o751)
    assert main(["--write", str(target)]) == 0
    assert target.read_text() == NEW
    assert target.stat().st_mode & 0o7777 == 0o751


@pytest.mark.text
@pytest.mark.parametrize("mode", [0o2755, 0o4755, 0o1644, 0o6750], ids=oct)
def test_write_preserves_setgid_setuid_and_sticky_bits(tmp_path: Path, mode: int) -> None:
    target = write(tmp_path / "run.py", OLD, mode=mode)
    if target.stat().st_mode & 0o7777 != mode:
        pytest.skip(f"this filesystem or user does not keep mode {oct(mode)}")
    assert main(["--write", str(target)]) == 0
    assert target.read_text() == NEW
    assert oct(target.stat().st_mode & 0o7777) == oct(mode)


@pytest.mark.text
def test_write_keeps_the_encoding(tmp_path: Path) -> None:
    text = (
        "# -*- coding: latin-1 -*-\nimport keras\n# café\np = keras.utils.multi_gpu_model(m, 2)\n"
    )
    target = tmp_path / "latin.py"
    target.write_bytes(text.encode("latin-1"))
    assert main(["--write", str(target)]) == 0
    assert target.read_bytes().decode("latin-1") == (
        "# -*- coding: latin-1 -*-\nimport keras\nimport kerasmgpu\n\n# café\n"
        "p = kerasmgpu.parallelize(m, gpus=2)\n"
    )


@pytest.mark.text
def test_write_keeps_a_utf8_bom_and_crlf(tmp_path: Path) -> None:
    text = "\ufeffimport keras\r\n# é\r\np = keras.utils.multi_gpu_model(m, 2)\r\n"
    target = tmp_path / "bom.py"
    target.write_bytes(text.encode("utf-8"))
    assert main(["--write", str(target)]) == 0
    assert target.read_bytes() == (
        "\ufeffimport keras\r\nimport kerasmgpu\r\n\r\n# é\r\np = kerasmgpu.parallelize(m, gpus=2)\r\n"
    ).encode("utf-8")


@pytest.mark.text
def test_directory_walk_skips_tool_and_cache_dirs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    walked = [write(tmp_path / "a.py", OLD), write(tmp_path / "pkg" / "sub" / "b.py", OLD)]
    skipped = [
        write(tmp_path / d / "c.py", OLD)
        for d in (".tox", "__pycache__", ".venv", "venv", "build", "dist", "node_modules", ".git")
    ]
    not_python = write(tmp_path / "notes.txt", OLD)
    before = {p: snapshot(p) for p in [*skipped, not_python]}

    assert main(["--write", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for path in walked:
        assert path.read_text() == NEW
        assert report_lines(out, path)
    assert {p: snapshot(p) for p in before} == before
    assert "2 file(s) rewritten, 0 unchanged" in out


@pytest.mark.text
def test_unparsable_file_is_reported_with_its_line_and_never_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path / "bad.py", 'import keras\nprint "python 2"\nm.fit_generator(g, 2)\n')
    good = write(tmp_path / "good.py", OLD)
    before = snapshot(bad)
    assert main(["--write", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert f"{bad}:2:1: ERROR: cannot parse: " in out
    assert "1 could not be migrated" in out.splitlines()[0]
    assert snapshot(bad) == before
    assert good.read_text() == NEW


@pytest.mark.text
def test_missing_path_exits_2_before_touching_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path / "good.py", OLD)
    before = snapshot(good)
    missing = tmp_path / "nope.py"
    assert main(["--write", str(good), str(missing)]) == 2
    err = capsys.readouterr().err
    assert "no such file or directory" in err and str(missing) in err
    assert snapshot(good) == before


@pytest.mark.text
def test_write_and_check_together_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = write(tmp_path / "t.py", OLD)
    with pytest.raises(SystemExit) as info:
        main(["--write", "--check", str(target)])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.text
@pytest.mark.parametrize(
    ("flags", "status", "line"), [([], 0, 2), (["--check"], 1, 2), (["--write"], 0, 4)]
)
def test_findings_cite_the_lines_of_the_file_on_disk_after_the_run(
    flags: List[str], status: int, line: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --write inserts `import kerasmgpu` and a blank line above the call: its finding
    # moves down two lines.
    target = write(
        tmp_path / "t.py",
        "import keras\nm.fit_generator(g, 4)\nx = keras.utils.multi_gpu_model(m, gpus=2)\n",
    )
    assert main([*flags, str(target)]) == status
    out = capsys.readouterr().out
    assert f"{target}:{line}:3: INFO: fit_generator(...) -> fit(...)" in out
    assert target.read_text().splitlines()[line - 1].startswith("m.fit")


@pytest.mark.text
def test_missing_libcst_names_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = write(tmp_path / "t.py", OLD)
    monkeypatch.setitem(sys.modules, "libcst", None)  # makes `import libcst` fail
    assert main([str(target)]) == 2
    assert 'pip install "kerasmgpu[tools]"' in capsys.readouterr().err
    with pytest.raises(ImportError, match=r"kerasmgpu\[tools\]"):
        migrate_source(OLD)


@pytest.mark.parametrize("module", ["kerasmgpu.migrate", "kerasmgpu"])
def test_python_dash_m_check_in_a_subprocess(module: str, tmp_path: Path) -> None:
    target = write(tmp_path / "t.py", OLD)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", module] + (["migrate"] if module == "kerasmgpu" else [])
    proc = subprocess.run(
        [*command, "--check", str(target)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    assert f"would rewrite: {target}" in proc.stdout
    assert target.read_text() == OLD


@pytest.mark.text
def test_symlinked_files_are_not_followed_by_the_walk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = write(tmp_path / "outside" / "lib.py", OLD)
    tree = tmp_path / "tree"
    write(tree / "own.py", OLD)
    (tree / "link.py").symlink_to(outside)
    before = snapshot(outside)
    assert main(["--write", str(tree)]) == 0
    assert snapshot(outside) == before
    assert "1 file(s) rewritten" in capsys.readouterr().out


@pytest.mark.text
def test_each_import_finding_cites_its_own_line_after_write(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rewritten import lines, one removed among them: the text diff alone matched each
    to its neighbour (keras-one-cycle's model.py: three findings one line off)."""
    from kerasmgpu.migrate import cli

    path = tmp_path / "model.py"
    path.write_text(
        "from keras import regularizers\n"
        "from keras.utils import conv_utils\n"
        "from keras.utils.data_utils import get_file\n"
        "from keras.engine.topology import get_source_inputs\n"
        "from keras.engine import InputSpec\n"
        "from keras.applications.imagenet_utils import _obtain_input_shape\n"
        "from keras import backend as K\n\n\n"
        "def build(shape):\n"
        "    return _obtain_input_shape(shape, 32, 8, K.image_data_format(), True)\n")
    assert cli.main([str(path), "--write"]) == 0
    written = path.read_text().splitlines()
    cited = [line.split(":") for line in capsys.readouterr().out.splitlines()
             if ": INFO: keras." in line and "(where" in line]
    assert len(cited) == 3
    for _, number, _, _, message in (c[:4] + [":".join(c[4:])] for c in cited):
        old_module = message.split(" -> ")[0].strip().split(" ")[-1]
        name = {"keras.utils.data_utils": "get_file",
                "keras.engine.topology": "get_source_inputs",
                "keras.engine": "InputSpec"}[old_module]
        assert name in written[int(number) - 1], (number, message)


@pytest.mark.text
def test_comments_survive_dropped_arguments() -> None:
    text = """
        from keras.callbacks import TensorBoard
        model.fit_generator(gen,
                            steps_per_epoch=10,  # the steps
                            workers=4,  # four processes
                            # and the epochs
                            epochs=2,
                            use_multiprocessing=True)  # done
        tb = TensorBoard(
            log_dir="logs",
            # about the batch
            batch_size=32,
        )
        tc = TensorBoard(log_dir="logs",
                         batch_size=32  # gone
                         )
        """
    out = assert_idempotent(text)
    for comment in ("# the steps", "# four processes", "# and the epochs", "# done",
                    "# about the batch", "# gone"):
        assert out.count(comment) == 1, comment
    assert "workers" not in out and "batch_size" not in out
    compile(out, "f.py", "exec")
