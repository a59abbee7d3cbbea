"""Keras 2.3.1's own examples train on Keras 2.3 as they are, and on every modern line
after `kerasmgpu migrate`, to the quality of the Keras 2.3 run.

tests/keras_examples/ (README.md there): the scripts of `examples/` at Keras's 2.3.1 tag,
byte for byte; synthetic data sets of the same shapes with learnable labels; fewer epochs.
In this env all of them are copied into one project folder, which is
* on `keras23`: run as it is;
* on a Keras 3 env: migrated with `kerasmgpu migrate --to keras3 --write`, then run;
* on a tf_keras env: migrated with `--to tf_keras --write`, then run;
and each example's test checks that it ran and reached the Keras 2.3 run's quality
(reference.json, recorded on `keras23` over 3 seeds) within the tolerance of
`examples.tolerance`. The scripts run one after another in one interpreter (runner.py).
They run in the envs that run the whole suite: keras23, tfkeras2.21 and
keras3.15-{tensorflow,jax,torch} (tf.keras 2.12 - 2.15 is no migration target).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from helpers import BACKEND, LINE, ON_LEGACY

from kerasmgpu.env.versions import KerasLine

HERE = Path(__file__).resolve().parent / "keras_examples"
sys.path.insert(0, str(HERE))
import examples  # noqa: E402

pytestmark = [pytest.mark.examples, pytest.mark.slow, pytest.mark.timeout(3600)]

TARGETS = {KerasLine.KERAS_3: ("keras3", "keras"), KerasLine.TF_KERAS_LEGACY: ("tf_keras",
                                                                                "tf_keras")}
RUN_TIMEOUT = 2400  # every example on this env's Keras; each is seconds to a minute

needs_a_target = pytest.mark.skipif(
    not ON_LEGACY and LINE not in TARGETS,
    reason=f"no migrate target for {LINE.value}: the examples run on Keras 2.3 (keras23) and "
    "after `kerasmgpu migrate --to keras3` (Keras 3) or `--to tf_keras` (tf_keras 2.16+)")


def _git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_the_examples_are_keras_2_3_1s_own_and_each_runs_or_says_why_not() -> None:
    upstream = {}
    for line in (HERE / "keras_2_3_1" / "UPSTREAM").read_text().splitlines():
        if line and not line.startswith("#"):
            blob, name = line.split()
            upstream[name] = blob
    here = {p.name: _git_blob_id(p) for p in (HERE / "keras_2_3_1").iterdir()
            if p.name != "UPSTREAM"}
    assert here == upstream  # every file of examples/ at 2.3.1, unchanged, and the LICENSE
    names = [e.name for e in examples.EXAMPLES]
    assert sorted(names) == sorted(n for n in upstream if n.endswith(".py"))
    for example in examples.EXAMPLES:
        assert bool(example.excluded) != bool(example.quality), example.name
    assert sorted(examples.load_reference()) == sorted(e.name for e in examples.runnable())


def test_the_tolerance_tells_a_broken_run_from_a_fair_one() -> None:
    reference = {"test_accuracy": {"keras23": 0.85, "spread": 0.01},
                 "test_loss": {"keras23": 0.5, "spread": 0.02}}
    assert examples.shortfalls({"test_accuracy": 0.81, "test_loss": 0.57}, reference) == []
    assert examples.shortfalls({"test_accuracy": 0.95, "test_loss": 0.1}, reference) == []
    missed = examples.shortfalls({"test_accuracy": 0.12, "test_loss": 2.3}, reference)
    assert missed == ["test_accuracy 0.12 < Keras 2.3's 0.85 - 0.05",
                      "test_loss 2.3 > Keras 2.3's 0.5 + 0.075"]
    assert examples.shortfalls({"test_loss": float("nan")}, {"test_loss": reference[
        "test_loss"]}) == ["test_loss: nan (Keras 2.3: 0.5)"]


def _run_env() -> Tuple[Optional[str], str, bool]:
    if ON_LEGACY:
        return None, "keras", True
    target, package = TARGETS[LINE]
    return target, package, False


def _target() -> Optional[str]:
    return _run_env()[0] if (ON_LEGACY or LINE in TARGETS) else None


def _chosen() -> List[examples.Example]:
    return [e for e in examples.runnable() if examples.in_ci(e, _target(), BACKEND)]


def _cases() -> List[Any]:
    cases = []
    target = _target()
    for example in examples.runnable():
        marks = []
        if not examples.in_ci(example, target, BACKEND):
            marks.append(pytest.mark.skip(
                reason=f"not run by default on {target or 'keras23'} with {BACKEND} "
                "(examples.CI_RUNS, examples.SLOW_IN_CI); KERASMGPU_EXAMPLES=all runs it"))
        why = examples.still_failing(target or "keras23", BACKEND, example.name)
        if why:
            # Strict: an example that runs again fails the test, and its entry must go.
            marks.append(pytest.mark.xfail(reason=why, strict=True))
        cases.append(pytest.param(example.name, marks=marks, id=example.name))
    return cases


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    root = tmp_path_factory.mktemp("keras_examples")
    scripts = examples.prepare(str(root), _chosen())
    target, package, keras23 = _run_env()
    report = ""
    if target is not None:
        migrated = subprocess.run(
            [sys.executable, "-m", "kerasmgpu", "migrate", "--to", target, "--write",
             str(root / "project")], capture_output=True, text=True, timeout=600)
        report = migrated.stdout + migrated.stderr
        assert migrated.returncode == 0, report[-5000:]
    results = examples.run(sys.executable, str(root), scripts, package, keras23,
                           examples.runner_env(str(root), dict(os.environ)), RUN_TIMEOUT,
                           str(root / "run.log"))
    (root / "migrate.txt").write_text(report)
    print(f"\nkeras examples: {root} ({sum(r.get('seconds', 0) for r in results.values()):.0f}"
          " s of runs)")
    return {"results": results, "report": report, "root": root}


def _findings_for(report: str, name: str) -> str:
    stem = os.path.splitext(name)[0]
    lines = [line for line in report.splitlines() if f"/{stem}/{name}:" in line]
    return "\n".join(lines[-30:])


@needs_a_target
@pytest.mark.parametrize("name", _cases())
def test_the_example_trains_to_the_quality_of_keras_2_3(runs: Dict[str, Any], name: str) -> None:
    record = runs["results"][name]
    migrated = _findings_for(runs["report"], name)
    assert record["ok"], (f"{name} failed ({runs['root']}):\n{record['error']}\n"
                          f"migrate said:\n{migrated}")
    missed = examples.shortfalls(record["quality"], examples.load_reference()[name])
    assert not missed, (f"{name} trained, below the Keras 2.3 run: {'; '.join(missed)}\n"
                        f"migrate said:\n{migrated}")
