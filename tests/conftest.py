"""Test set-up: 3 virtual devices, markers, and skips that say what is missing.

KERASMGPU_VIRTUAL_DEVICES must be set before any framework starts, so it is set here,
at collection time, before a test module imports TensorFlow or JAX. Routes are then
exercised on 2 and 3 of those devices.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import weakref
from collections import Counter
from typing import Any, List

os.environ.setdefault("KERASMGPU_VIRTUAL_DEVICES", "3")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
from helpers import ENV, ON_LEGACY
from hypothesis import HealthCheck, settings

from kerasmgpu.env.devices import apply_environment_request

# A user's project with its own tests (run by test_sample_project.py under its own tox),
# and Keras 2.3.1's examples (run by test_keras_examples.py): not this suite's tests.
collect_ignore = ["sample_project", "keras_examples"]

# `import kerasmgpu` applies the request - unless kerasmgpu was imported before it was
# set here (the keras23 env's sitecustomize imports kerasmgpu.keras23 at start-up).
apply_environment_request()

# The batching properties are pure and cheap, but CI runs every env at once on 2 cores:
# a 200 ms deadline or a slow-generation check would then fail on load, not on a bug.
settings.register_profile("kerasmgpu", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kerasmgpu")


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"kerasmgpu: Keras line {ENV.keras_line.value} {ENV.keras_version}, "
        f"backend {ENV.backend or '-'}, route {ENV.route}, "
        f"virtual devices {os.environ.get('KERASMGPU_VIRTUAL_DEVICES')}"
    )


def pytest_collection_modifyitems(items: List[Any]) -> None:
    """A test that feeds a tf.data pipeline by a parameter (its value named "tf.data..."
    or "tfdata..." as every input grid of the suite names it) is marked `tf_data`, as
    those written for one are: the JAX and PyTorch envs have no TensorFlow, and
    keras3.15-jax-tfdata and keras3.15-torch-tfdata run them."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(isinstance(value, str) and value.startswith(("tf.data", "tfdata"))
               for value in params.values()):
            item.add_marker(pytest.mark.tf_data)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """With KERASMGPU_WARNINGS_REPORT set (tox passes KERASMGPU_*), one JSON line per run
    appended to that file: the env, its warning count and the most frequent kinds. `tox -p`
    shows no passing env's output, and every env is to stay at 50 warnings or fewer."""
    path = os.environ.get("KERASMGPU_WARNINGS_REPORT")
    if not path:
        return
    reports = terminalreporter.stats.get("warnings", [])
    kinds = Counter((str(getattr(r, "message", "")).strip().splitlines() or [""])[0][:160]
                    for r in reports)
    line = {"env": os.environ.get("KERASMGPU_TEST_ENV", "-"), "warnings": len(reports),
            "kinds": kinds.most_common(10)}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


@pytest.fixture(autouse=True)
def _choices_detected_afresh() -> Any:
    """The two choices a process makes once - the active Keras and the job - detected
    again after a test that changed what they are read from (launcher variables, a
    pretended release): each test sees this process as it started."""
    from kerasmgpu import registry
    from kerasmgpu.env import cluster

    yield
    registry.reset()
    cluster.reset()


@pytest.fixture(autouse=True)
def _keras23_graph_cleared() -> Any:
    """Keras 2.3 builds every model into TensorFlow's one default graph, and its
    `get_session` walks every variable of that graph at each call: kept across a
    process's tests, the graph made each model slower to build, train and check (measured
    on keras23: test_verify.py's first test 1.9 s alone, 35 s after test_legacy.py). A
    test's models are its own, so the graph is cleared after each, as a Keras 2.3 script
    clears it between models (`keras.backend.clear_session()`)."""
    yield
    keras = sys.modules.get("keras") if ON_LEGACY else None
    if keras is not None:
        keras.backend.clear_session()


# Weak references to the tf.data iterators made since the last test ended (TensorFlow
# imported by then); `_iterators_freed_young` reads them.
_ITERATORS: List[Any] = []


def _track_iterators() -> None:
    """Record every iterator `tf.data.Dataset.__iter__` makes, once TensorFlow is
    imported (per-device iterators of a MirroredStrategy input come through it too)."""
    tf = sys.modules.get("tensorflow")
    dataset = getattr(getattr(tf, "data", None), "Dataset", None)
    if dataset is None or getattr(dataset.__iter__, "_kerasmgpu_tracked", False):
        return
    made = dataset.__iter__

    def __iter__(self: Any) -> Any:
        iterator = made(self)
        _ITERATORS.append(weakref.ref(iterator))
        return iterator

    __iter__._kerasmgpu_tracked = True  # type: ignore[attr-defined]
    dataset.__iter__ = __iter__


@pytest.fixture(autouse=True)
def _iterators_freed_young() -> Any:
    """A tf.data iterator still alive when its test ends is one an exception's traceback
    keeps in a cycle (a fit that raised): collected now, while it is young. TensorFlow's
    destructor of an iterator waits for its autotuning thread, which a race sends back to
    sleep for the rest of its period, and the period grows with the iterator's age to
    60 s: left to Python's collector, which reaches such cycles minutes later, one took
    90 s and 164 s of idle time in two tests of keras3.15-tensorflow's CI run (stop 49).
    Young, it waits a test's length at most; a full collection costs 0.24 s, paid only
    after the tests that left one (docs/troubleshooting.md has the race)."""
    _track_iterators()
    yield
    alive = any(ref() is not None for ref in _ITERATORS)
    _ITERATORS.clear()  # what outlives this collection is held on purpose
    if alive:
        gc.collect()
