"""Several processes on 127.0.0.1, through `kerasmgpu launch`, for real.

Two workers train `tests/workers/train.py` (101 samples, global batch 10: the last
batch has 1 row for 2 workers) and must end with identical weights equal to one process
on the same global batches; the listeners the job starts are on loopback, and only the
chief writes the template. A worker that
fails - an exception before fit or in a callback, sys.exit(3), os._exit(3), SIGKILL -
makes the run fail fast naming it, with no process left; a run killed mid-way resumes
from BackupAndRestore. `tests/workers/ids.py` records the samples each process trained
on: every sample once per epoch, each step's rows from one global batch. Every test is
bounded in time, and the launcher stops every worker it started (SIGTERM, then SIGKILL
by process group).

CI time goes to starting processes (importing the framework), so the checks that train
to completion share one job: its two processes run every such check's model one after
another (tests/workers/runs.py, one folder each), and the one-process references of this
module and test_launchers.py are trained in one process, once a session. A job that fails
or is stopped on purpose is still a job of its own.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import jobs
import numpy as np
import pytest
from helpers import LINE, ON_JAX, ON_LEGACY, ON_TORCH, requires, wait_until
from jobs import group_members, runs_args, weights, worker_env
from packaging.version import Version

import kerasmgpu
from kerasmgpu import registry
from kerasmgpu.env.versions import (
    KERAS3_ACTIVITY_LOSS_IS_A_MEAN,
    KERAS3_JAX_MULTI_PROCESS_MIN,
    KerasLine,
)
from kerasmgpu.registry import below_multi_process_floor

WORKERS = jobs.WORKERS
WORKER = str(WORKERS / "train.py")
# Lines whose multi-process route trains (Keras 3 on TF fails upstream: keras#20585).
MULTI_WORKER_LINES = [KerasLine.TF_KERAS, KerasLine.TF_KERAS_LEGACY]
_VERSION = registry.active().version
# Keras 3 on JAX trains in several processes from 3.11; kerasmgpu refuses older releases.
JAX_TOO_OLD = ON_JAX and below_multi_process_floor(LINE, _VERSION) is not None
trains_in_processes = pytest.mark.skipif(
    not (ON_JAX or ON_TORCH or LINE in MULTI_WORKER_LINES) or JAX_TOO_OLD,
    reason=f"needs a line with a multi-process route (tf.keras 2.x, tf_keras, Keras 3 on "
    f"JAX >= {KERAS3_JAX_MULTI_PROCESS_MIN} or torch); this env: {LINE.value} {_VERSION}",
)
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]


# On JAX each worker also splits its CPU in two: 2 processes x 2 devices = 4 replicas,
# so the multi-process layout is exercised with several devices per process too.
LOCAL_DEVICES = 2 if ON_JAX else 1


def _env() -> dict:
    return worker_env(**({"KERASMGPU_VIRTUAL_DEVICES": str(LOCAL_DEVICES)}
                         if LOCAL_DEVICES > 1 else {}))


def _single(out: Path, *args: str, env: Optional[Dict[str, str]] = None
            ) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    return jobs.run([sys.executable, WORKER, str(out), *args], env={**_env(), **(env or {})},
                    timeout=300)


def _launch(out: Path, *args: str, nproc: int = 2, timeout: int = 240, worker: str = WORKER,
            env: Optional[Dict[str, str]] = None, restarts: int = 0
            ) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    return jobs.launch([worker, str(out), *args], nproc=nproc, timeout=timeout,
                       restarts=restarts, env={**_env(), **(env or {})})


def _paired_weights(a: Path, b: Path) -> List[Tuple[np.ndarray, np.ndarray]]:
    wa, wb = weights(a), weights(b)
    assert len(wa) == len(wb) > 0, (len(wa), len(wb))  # zip() alone would hide a missing one
    return list(zip(wa, wb))


def _assert_same(a: Path, b: Path, keys=("loss", "val_loss", "evaluation", "prediction")
                 ) -> None:
    for u, v in _paired_weights(a, b):
        np.testing.assert_allclose(u, v, atol=1e-5, rtol=1e-5)
    da, db = np.load(a, allow_pickle=True), np.load(b, allow_pickle=True)
    for key in keys:
        assert np.isfinite(da[key]).all(), (key, da[key])  # NaN against NaN would pass
        np.testing.assert_allclose(da[key], db[key], rtol=1e-5, atol=1e-6, err_msg=key)


# Loss terms computed from the batch (an activity regularizer, an add_loss mean): a short
# last batch goes whole to every replica - where each process runs its own step, and on
# JAX, whose one program spans the processes, fed whole by each and laid out replicated;
# Keras 3 before 3.15 sums the activity loss over rows and is refused on torch.
BATCH_TERMS = ON_TORCH and Version(str(_VERSION)) >= KERAS3_ACTIVITY_LOSS_IS_A_MEAN or \
    ON_JAX and not JAX_TOO_OLD or LINE in MULTI_WORKER_LINES
# TensorFlow installed, for a tf.data pipeline; on Keras 3 + JAX or PyTorch it is so in
# keras3.15-jax-tfdata and keras3.15-torch-tfdata, which run the tests marked tf_data.
TF_DATA = importlib.util.find_spec("tensorflow") is not None
KERAS3_TF_DATA = TF_DATA and (ON_TORCH or ON_JAX and not JAX_TOO_OLD)
# In order: one process with one device trains the model as it is, and Keras shuffles
# its own way (shuffled fits are checked by test_every_sample_once_per_epoch).
INPUTS: Dict[str, List[str]] = {"arrays": []}
if LINE in MULTI_WORKER_LINES or KERAS3_TF_DATA:
    INPUTS["tf.data"] = ["--tf-data"]
# accumulate_steps > 1 in several processes: Keras >= 3.8 on JAX or torch.
ACCUMULATES = (ON_JAX or ON_TORCH) and _VERSION is not None and Version(str(_VERSION)) >= \
    Version("3.8")
# Several TensorFlow workers take tf.data, arrays or generators, not a PyDataset.
SHUFFLED = ["arrays"] + (["tfdata-seeded"] if LINE in MULTI_WORKER_LINES else ["pydataset"])
if KERAS3_TF_DATA:  # each process reads the pipeline, seeded alike, and feeds its share
    SHUFFLED.append("tfdata-seeded")

# Each process given a call otherwise (tests/workers/train.py --disagree) -> what each
# rank's refusal must name: rank 1's values where they differ from rank 0's, and on rank 0
# (whose own are rank 0's) the names of what differs on the other.
DISAGREEMENTS: Dict[str, Tuple[List[str], List[str]]] = {
    # 101 rows split by rank: 51 and 50.
    "shard": (["rows of x, x, rows of y, y otherwise"],
              ["rows of x: 50 (rank 0: 51)", "x: float32 (50, 6) (rank 0: other values)",
               "rows of y: 50 (rank 0: 51)"]),
    "arguments": (["validation x, validation y, epochs otherwise"],
                  ["epochs: 4 (rank 0: 3)",
                   "validation x: float32 (33, 6) (rank 0: other values)"]),
    "generator": (["given x otherwise"], ["x: a first batch of [0] float32 (10, 6), "
                                          "[1] float32 (10, 1) (rank 0: other values)"]),
    "on-batch": (["given x otherwise"], ["x: float32 (10, 6) (rank 0: other values)"]),
}

# The job of two processes that trains to completion: its runs (one model each, one after
# another in the same two processes: tests/workers/runs.py) -> script and options; each
# test checks its own run. One job start-up instead of one per test.
RUNS: Dict[str, List[str]] = {
    **{inputs: ["train.py", *extra, "--listeners"] for inputs, extra in INPUTS.items()},
    # With the self-check on in every process: it must pass, and change nothing.
    "chief": ["train.py", "--chief-sets", "--verify"],
    # Built in scope on JAX: one global array per variable, which rank 0 changes alone.
    **({"chief-scope": ["train.py", "--chief-sets", "--in-scope"]} if ON_JAX else {}),
    # Rank 0 alone sets the parallel model (set_weights, its optimizer's learning rate,
    # a variable assigned directly).
    "chief-parallel": ["train.py", "--chief-sets", "--on-parallel"],
    "clip": ["train.py", "--clipnorm", "0.05"],
    **({"custom": ["train.py", "--custom-step"]} if ON_TORCH else {}),
    # 103 rows: a last batch of 3, which 2 replicas split only by padding.
    # With the self-check: its first padded batch is the whole one too.
    **({"batch-terms": ["train.py", "--epochs", "2", "--rows", "103", "--batch-terms",
                        "--verify"]} if BATCH_TERMS else {}),
    # The same read from a PyDataset: on JAX each process reads the global batch and
    # feeds its share, or all of it, marked, where the batch goes whole.
    **({"batch-terms-pydataset": ["train.py", "--epochs", "2", "--rows", "103",
                                   "--batch-terms", "--pydataset"]}
       if ON_JAX and BATCH_TERMS else {}),
    # And from a generator, which reaches Keras as a generator: the whole batch marked by
    # its structure alone.
    **({"batch-terms-generator": ["train.py", "--epochs", "2", "--rows", "103",
                                   "--batch-terms", "--generator"]}
       if ON_JAX and BATCH_TERMS else {}),
    # And from a tf.data pipeline (TensorFlow beside JAX or torch), whose every batch
    # carries the mark on JAX, ones where the batch is whole.
    **({"batch-terms-tfdata": ["train.py", "--epochs", "2", "--rows", "103",
                                "--batch-terms", "--tf-data"]}
       if BATCH_TERMS and KERAS3_TF_DATA else {}),
    # The self-check reading a tf.data pipeline's first batch (torch; the rest of its
    # cases run in the misuse job below).
    **({"verify-tfdata": ["verify.py", "--tf-data"]} if ON_TORCH and TF_DATA else {}),
    **({"collectives": ["train.py", "--epochs", "1", "--count-collectives"]}
       if ON_TORCH else {}),
    # One replica a process: each divides by its own valid count unless told the global.
    **({"counted": ["train.py", "--epochs", "2", "--counted"]} if ON_TORCH else {}),
    # A loss of one value per row of a sequence output: its padding weight is per row
    # (103 rows: the last batch's 3 real rows padded to 4, one of them copied).
    **({"per-row": ["train.py", "--epochs", "2", "--rows", "103", "--per-row"]}
       if ON_TORCH else {}),
    **({"accumulate": ["train.py", "--batch", "10", "--accumulate", "4"]}
       if ACCUMULATES else {}),
    **({"own": ["train.py", "--optimizer-accumulates", "3"]} if ON_JAX or ON_TORCH else {}),
    # A train_step counting its rows in a model variable: named in a warning (torch).
    **({"step-state": ["train.py", "--epochs", "1", "--step-state"]} if ON_TORCH else {}),
    # A loss and a metric of one value per batch: one program over the global batch on
    # JAX (exact); refused where each process runs its own step (last, below).
    **({"batch-metric": ["train.py", "--epochs", "2", "--batch-metric"]} if ON_JAX else {}),
    **{f"ids-{inputs}": ["ids.py", "--input", inputs] for inputs in SHUFFLED},
    # Last: refused in every process (runs.py records what each raised).
    **({"accumulate-refused!": ["train.py", "--batch", "10", "--accumulate", "4"]}
       if LINE in MULTI_WORKER_LINES else {}),
    **({"batch-metric!": ["train.py", "--epochs", "2", "--batch-metric"]} if not ON_JAX
       else {}),
    **({"compared!": ["train.py", "--compared"]} if ON_TORCH else {}),
    **({"centred!": ["train.py", "--centred"]} if ON_TORCH else {}),
    **({"metric-state!": ["train.py", "--metric-state"]} if ON_TORCH else {}),
    **({"layer-state!": ["train.py", "--layer-state"]} if ON_TORCH else {}),
    **{f"disagree-{what}!": ["train.py", "--disagree", what] for what in DISAGREEMENTS},
}
# Their one-process references, all in one process (each run its own model, trained as
# `python train.py` trains it): "arrays" is also the uninterrupted run of the resume tests
# (3 epochs) and the unclipped run of the clipping test.
REFERENCES: Dict[str, List[str]] = {
    **{inputs: ["train.py", *extra] for inputs, extra in INPUTS.items()},
    "chief": RUNS["chief"], "clip": RUNS["clip"],
    **({"chief-scope": RUNS["chief-scope"]} if ON_JAX else {}),
    "chief-parallel": RUNS["chief-parallel"],
    **({"custom": RUNS["custom"]} if ON_TORCH else {}),
    **({"batch-terms": RUNS["batch-terms"]} if BATCH_TERMS else {}),
    **{name: RUNS[name] for name in ("batch-terms-pydataset", "batch-terms-generator",
                                     "batch-terms-tfdata") if name in RUNS},
    **({name: RUNS[name] for name in ("counted", "per-row")} if ON_TORCH else {}),
    **({"accumulate": ["train.py", "--batch", "40"]} if ACCUMULATES else {}),
    **({"own": RUNS["own"]} if ON_JAX or ON_TORCH else {}),
    **({"batch-metric": RUNS["batch-metric"]} if ON_JAX else {}),
    # The uninterrupted run of the jobs killed at every point of a save (FAULT_RUN).
    "faults": ["train.py", "--momentum", "0.9"],
}


_REFERENCE_ROOT: List[Path] = []  # computed once a session (test_launchers.py shares it)


def one_process_references(factory: pytest.TempPathFactory) -> Path:
    """The folder of REFERENCES' results (NAME/rank0.npz), trained in one process."""
    if not _REFERENCE_ROOT:
        root = factory.mktemp("one-process")
        single = jobs.run([sys.executable, str(WORKERS / "runs.py"), str(root),
                           *runs_args(REFERENCES)], env=_env(), timeout=420)
        assert single.returncode == 0, single.stderr[-3000:]
        _REFERENCE_ROOT.append(root)
    return _REFERENCE_ROOT[0]


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """REFERENCES, trained in one process (once a session)."""
    return one_process_references(tmp_path_factory)


Job = Tuple[Path, subprocess.CompletedProcess]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """The two-process job of RUNS, launched once for the module's tests."""
    root = tmp_path_factory.mktemp("two-processes")
    run = _launch(root, *runs_args(RUNS), worker=str(WORKERS / "runs.py"), timeout=480)
    return root, run


def _finished(job: Job, name: str) -> Path:
    """The folder of run `name` of the job, which must have ended well."""
    root, run = job
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return root / name


def _loopback(host: str) -> bool:
    address = ipaddress.ip_address(host)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


@pytest.mark.core
@trains_in_processes
@pytest.mark.parametrize("inputs", list(INPUTS))
def test_two_workers_equal_one_process(job: Job, one: Path, inputs: str) -> None:
    two = _finished(job, inputs)
    output = job[1].stdout + job[1].stderr
    assert "[rank 0]" in output and "[rank 1]" in output  # rank-prefixed output
    rank0, rank1 = two / "rank0.npz", two / "rank1.npz"
    # Identical on both workers (to the bit, up to all-reduce order) ...
    for u, v in _paired_weights(rank0, rank1):
        np.testing.assert_allclose(u, v, atol=1e-6)
    # ... and equal to one process on the same global batches.
    _assert_same(one / inputs / "rank0.npz", rank0)
    assert str(np.load(rank0, allow_pickle=True)["replicas"]) == str(2 * LOCAL_DEVICES)
    assert str(np.load(rank1, allow_pickle=True)["cluster"]).startswith(
        "kerasmgpu launch: process 1 of 2")
    # Only the chief wrote the template, though both processes asked to (in every run).
    for name, (script, *_) in RUNS.items():
        if script == "train.py" and not name.endswith("!"):
            written = sorted(p.name for p in (job[0] / name).glob("template-from-rank*"))
            assert written == ["template-from-rank0.weights.h5"], (name, written)
    # ... and the other process said so, once a process (not once a call: every run
    # asked), naming the call (not a silent no-op).
    assert output.count("did not write save_weights(") == 1, output[-4000:]
    assert "process 1 of 2 did not write save_weights(" in output
    _assert_listeners(two)


# core: the counted runs are trained by the job the core tests start anyway (its cost in
# CI is reading their results), and Keras 3.3 - 3.11 mask metrics otherwise than 3.15.
@pytest.mark.core
@trains_in_processes
@requires(torch=True)
@pytest.mark.parametrize("run", ["counted", "per-row"])
def test_counted_loss_divides_by_the_global_count(job: Job, one: Path, run: str) -> None:
    """ignore_class and mask_zero on two processes: the loss divides by the valid entries
    of the whole global batch (padded last batch and batches that divide), as one
    process does, and the masked accuracy counts them the same. per-row (issue 28, item
    16): a loss that reduces a (rows, 6, 3) output to one value per row gets a padding
    weight of its own shape, per row."""
    _assert_same(one / run / "rank0.npz", _finished(job, run) / "rank0.npz")


@pytest.mark.core
@trains_in_processes
def test_the_chiefs_template_is_the_truth(job: Job, one: Path) -> None:
    """Between two fits rank 0 alone changes its template (weights halved, a new
    learning rate): both workers continue from rank 0's, as one process does - with
    parallelize(verify=True) in every process, whose checks pass and change nothing."""
    two = _finished(job, "chief")
    rank0, rank1 = two / "rank0.npz", two / "rank1.npz"
    for u, v in _paired_weights(rank0, rank1):
        np.testing.assert_allclose(u, v, atol=1e-6)
    _assert_same(one / "chief" / "rank0.npz", rank0)


@trains_in_processes
@pytest.mark.parametrize("run", ["chief-parallel", pytest.param(
    "chief-scope", marks=requires(jax=True))])
def test_the_chiefs_change_reaches_every_process(job: Job, one: Path, run: str) -> None:
    """As above, rank 0 alone changing between fits: "chief-parallel", the parallel model
    (set_weights, its optimizer's learning rate and a variable assigned directly, which
    no template token shows: the processes diverged silently, 0.38 off one process on
    JAX; on TensorFlow the direct assign was lost until hashed); "chief-scope", a model
    built in `kerasmgpu.scope()` on JAX, each variable one array laid out over both
    processes' devices (the job crashed in JAX's cross-process check)."""
    two = _finished(job, run)
    rank0, rank1 = two / "rank0.npz", two / "rank1.npz"
    for u, v in _paired_weights(rank0, rank1):
        np.testing.assert_allclose(u, v, atol=1e-6)
    _assert_same(one / run / "rank0.npz", rank0)


@pytest.mark.core
@pytest.mark.skipif(not JAX_TOO_OLD, reason=f"needs Keras 3 on JAX below "
                    f"{KERAS3_JAX_MULTI_PROCESS_MIN}; this env: {LINE.value} {_VERSION}")
def test_an_old_keras_on_jax_refuses_several_processes(tmp_path: Path) -> None:
    """Keras before 3.11 takes only tf.data in a multi-process fit: parallelize()
    refuses on every process, naming the release and the fix, and the job ends."""
    run = _launch(tmp_path / "two", nproc=2, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert f"Received: keras=keras 3 {_VERSION} on jax in a job of several processes" in out, \
        out[-3000:]
    assert f"{KERAS3_JAX_MULTI_PROCESS_MIN} or later for several processes" in out
    assert "pip install" in out and not list((tmp_path / "two").glob("rank*.npz"))


@pytest.mark.core
@requires(torch=True)
def test_custom_train_step_on_two_torch_processes(job: Job, one: Path) -> None:
    """The PyTorch guide's own train_step (zero_grad, backward, optimizer.apply) on two
    processes - 101 rows, batch 10: a padded last batch of 1 - equals one process."""
    two = _finished(job, "custom")
    assert "cannot keep padding rows out" not in job[1].stdout + job[1].stderr
    _assert_same(one / "custom" / "rank0.npz", two / "rank0.npz")


@pytest.mark.core
@pytest.mark.skipif(not BATCH_TERMS, reason=f"torch from Keras "
                    f"{KERAS3_ACTIVITY_LOSS_IS_A_MEAN}, JAX from {KERAS3_JAX_MULTI_PROCESS_MIN} or "
                    f"the tf.keras lines; this env: "
                    f"{LINE.value} {_VERSION}")
@pytest.mark.parametrize("run", ["batch-terms", *(pytest.param(
    name, marks=requires(jax=True)) for name in ("batch-terms-pydataset",
                                                  "batch-terms-generator")),
    pytest.param("batch-terms-tfdata", marks=[pytest.mark.skipif(
        not KERAS3_TF_DATA, reason="needs Keras 3 on JAX or PyTorch, TensorFlow installed "
        f"(tf.data); this env: {LINE.value} {_VERSION}"), pytest.mark.tf_data])])
def test_terms_computed_from_the_batch_on_two_processes(job: Job, one: Path, run: str
                                                        ) -> None:
    """An activity regularizer and a layer's add_loss, 103 rows in batches of 10: the
    last batch of 3 goes whole to both processes, each computing one device's terms
    (JAX: one program over both processes' devices, the batch laid out replicated);
    the job equals one process, with nothing to warn about. JAX padded it and warned
    before. "batch-terms-pydataset" reads the rows from a PyDataset (JAX), and
    "batch-terms-generator" from a generator and "batch-terms-tfdata" from a tf.data
    pipeline (JAX: padded, with a warning, before)."""
    two = _finished(job, run)
    _assert_same(one / run / "rank0.npz", two / "rank0.npz")
    assert "cannot keep padding rows out" not in job[1].stdout + job[1].stderr


@pytest.mark.core
@pytest.mark.skipif(not ON_TORCH or BATCH_TERMS, reason=f"torch below Keras "
                    f"{KERAS3_ACTIVITY_LOSS_IS_A_MEAN}; this env: {LINE.value} {_VERSION}")
def test_a_summed_activity_loss_is_refused_on_torch_processes(tmp_path: Path) -> None:
    """Keras 3 before 3.15 sums an activity regularizer's loss over the rows; each
    process sums over its own and the processes average: 1/2 of one process's term,
    silently (Keras 3.8: loss 6.99 against 8.37). Refused on every process."""
    run = _launch(tmp_path / "two", "--batch-terms", nproc=2, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert "with an activity_regularizer on Keras" in out and "Fix: upgrade Keras" in out, \
        out[-3000:]
    assert not list((tmp_path / "two").glob("rank*.npz"))


@pytest.mark.core
@requires(torch=True)
def test_torch_sums_the_metrics_every_step_only_for_a_callback_that_reads_them(
        job: Job, one: Path) -> None:
    """On torch, the per-batch logs a callback reads (`Crash` in train.py reads the loss
    at every batch end) are one process's - the global running loss - in both
    processes; and a fit without such a callback makes no collective per step beyond
    the gradients' (it once made one more per training and validation step), and per
    fit only the agreement that starts it and the metric sums; and a callback given to
    the chief alone makes every process sum."""
    two = _finished(job, "arrays")
    reference = np.load(one / "arrays" / "rank0.npz")["batch_loss"]
    assert reference.size == 3 * 11  # 3 epochs of 101 rows in batches of 10
    for rank in (0, 1):
        np.testing.assert_allclose(np.load(two / f"rank{rank}.npz")["batch_loss"],
                                   reference, rtol=1e-5, atol=1e-6)
    counts = [json.loads((_finished(job, "collectives") / f"collectives{rank}.json")
                         .read_text()) for rank in (0, 1)]
    assert counts[0] == counts[1]
    # 101 rows in batches of 10: 11 gradient all-reduces; beside them one agreement
    # at the start (before: three collectives there) and the metric sums of the
    # epoch and of its validation pass (before: one more, the epoch end's template
    # check, made without any callback).
    assert counts[0]["without"] == 11 + 1 + 2, counts
    # With the callback, 11 + 4 (33 validation rows) steps each sum the metric states
    # once more, and the epoch end checks the template (a callback may change it).
    assert counts[0]["with"] - counts[0]["without"] == 11 + 4 + 1, counts
    # Given to the chief alone, such a callback makes both processes sum (their
    # collectives must pair up: a process summing alone would wait on the other).
    assert counts[0]["chief-only"] == counts[1]["chief-only"] == counts[0]["with"], counts


@pytest.mark.core
@trains_in_processes
def test_clipping_acts_on_the_global_gradient_of_two_processes(job: Job, one: Path) -> None:
    """SGD(clipnorm) on two processes clips the all-reduced gradient, as one process
    clips its batch's (the clip is active: it changes the weights)."""
    assert max(np.abs(u - v).max() for u, v in _paired_weights(
        one / "clip" / "rank0.npz", one / "arrays" / "rank0.npz")) > 1e-3
    _assert_same(one / "clip" / "rank0.npz", _finished(job, "clip") / "rank0.npz")


@pytest.mark.core
@trains_in_processes
@pytest.mark.skipif(not ACCUMULATES,
                    reason="accumulate_steps > 1 needs Keras >= 3.8 on JAX or torch (the "
                    "mirrored routes and older releases refuse it)")
def test_accumulation_on_two_processes_equals_one_process_with_the_whole_batch(
        job: Job, one: Path) -> None:
    """accumulate_steps=4 at batch 10 on two processes = one process at batch 40: 101
    rows make groups of 40, 40 and 21 rows (the last with a padded batch of 1 row)."""
    _assert_same(one / "accumulate" / "rank0.npz", _finished(job, "accumulate") / "rank0.npz",
                 keys=("loss",))


@pytest.mark.core
@trains_in_processes
@pytest.mark.skipif(LINE not in MULTI_WORKER_LINES, reason="needs tf.keras or tf_keras "
                    "(several processes on the mirrored route)")
def test_accumulation_on_several_tf_processes_is_an_error(job: Job) -> None:
    # One process accumulates exactly on TF; several are refused before training, in
    # every process (a ValueError saying why and what to do).
    out = _finished(job, "accumulate-refused")
    for rank in (0, 1):
        raised = (out / f"raised{rank}.txt").read_text()
        assert raised.startswith("ValueError: ") and "several processes" in raised, raised
        assert "Fix: " in raised, raised
    assert not (out / "rank0.npz").exists()
    assert not (out / "rank1.npz").exists()


@trains_in_processes
@pytest.mark.skipif(not (ON_JAX or ON_TORCH), reason="an optimizer's own "
                    "gradient_accumulation_steps is Keras 3's (refused on the mirrored route)")
def test_keras_own_accumulation_on_two_processes_equals_one_process(job: Job, one: Path
                                                                     ) -> None:
    """SGD(gradient_accumulation_steps=3) trains on two processes as on one (the
    gradients are all-reduced before the optimizer accumulates them)."""
    _assert_same(one / "own" / "rank0.npz", _finished(job, "own") / "rank0.npz")


@pytest.mark.core
@trains_in_processes
def test_a_loss_and_metric_of_one_value_per_batch_on_two_processes(job: Job, one: Path
                                                                     ) -> None:
    """A loss `mean(square(...))` without an axis and a metric `def rmse(...)` of the
    whole batch: exact on JAX (one program over the global batch, short batches whole);
    refused in every process where each runs its own step (each would compute them over
    its share), before anything trains."""
    if ON_JAX:
        _assert_same(one / "batch-metric" / "rank0.npz",
                     _finished(job, "batch-metric") / "rank0.npz")
        return
    _refused_in_every_process(job, "batch-metric", "ValueError: Invalid `loss`. Received: "
                              "loss=loss 'batch_mse' (one value per batch)",
                              "Fix: reduce over the last axis only")


def _refused_in_every_process(job: Job, run: str, head: str, fix: str) -> None:
    """Run `run` raised, in both processes, an error starting with `head` and naming
    `fix`, and trained nothing."""
    out = _finished(job, run)
    for rank in (0, 1):
        raised = (out / f"raised{rank}.txt").read_text()
        assert raised.startswith(head), raised
        assert fix in raised, raised
    assert not (out / "rank0.npz").exists()


@pytest.mark.core
@trains_in_processes
@pytest.mark.skipif(not ON_TORCH, reason="torch, whose processes each compute the loss over "
                    "their share; the TF lines and JAX: tests/test_batch_metrics.py")
def test_a_loss_or_layer_reading_the_batchs_other_rows_is_refused_in_every_process(
        job: Job) -> None:
    """In-batch negatives, a layer centring its rows on the batch's mean: each process
    would compare its rows with its share's only."""
    _refused_in_every_process(job, "compared", "ValueError: Invalid `loss`. Received: "
                              "loss=loss 'in_batch_negatives' (each row's value computed "
                              "from the batch's other rows too)",
                              "train it with Keras 3 on JAX")
    _refused_in_every_process(job, "centred", "ValueError: Invalid `model`. Received: "
                              "model=Centred.call reading the batch's other rows (layer "
                              "'centred')", "train with Keras 3 on JAX")


@pytest.mark.core
@trains_in_processes
@pytest.mark.skipif(not ON_TORCH, reason="torch, whose engine sums the processes' metric "
                    "states; the TF lines' replicas in one process: "
                    "tests/test_metric_objects.py")
def test_a_metric_whose_state_is_not_a_sum_is_refused_in_every_process(job: Job) -> None:
    """A running maximum summed over the processes is not one device's maximum: refused
    in every process before anything trains."""
    _refused_in_every_process(job, "metric-state", "ValueError: Invalid `metrics`. Received: "
                              "metrics=metric 'worst' (its state is not a sum over rows)",
                              "Fix: keep sums over rows in the metric's variables")


@pytest.mark.core
@trains_in_processes
@pytest.mark.skipif(not ON_TORCH, reason="torch, where each process would keep its own "
                    "assigned variables; the TF lines and JAX in one process: "
                    "tests/test_tried_layers.py")
def test_a_layer_assigning_variables_in_its_step_is_refused_in_every_process(job: Job
                                                                            ) -> None:
    """A layer counting its rows in a variable: each process would count its own share
    (rank 0's kept at each epoch end) - refused in every process before anything trains."""
    _refused_in_every_process(job, "layer-state", "ValueError: Invalid `model`. Received: "
                              "model=Counting.call assigning variables (layer 'counting')",
                              "Fix: train with Keras 3 on JAX")


@pytest.mark.core
@trains_in_processes
@pytest.mark.skipif(not ON_TORCH, reason="torch, where each process runs its own step; "
                    "the TF lines: tests/test_models.py")
def test_a_step_of_yours_assigning_variables_is_named_in_every_process(job: Job) -> None:
    """A train_step counting its rows in a model variable: each process counts its own
    share (rank 0's kept at each epoch end) - which no made-up rows tell from an average
    of the weights every process computes alike: named in a warning in every process
    (tests/test_models.py: both kinds on TensorFlow)."""
    _finished(job, "step-state")
    output = job[1].stdout + job[1].stderr
    said = "kerasmgpu: RowCounting: its own train_step assigns variables"
    for rank in (0, 1):
        assert any(line.startswith(f"[rank {rank}]") and said in line
                   for line in output.splitlines()), output[-3000:]


@pytest.mark.core
@trains_in_processes
@pytest.mark.parametrize("what", list(DISAGREEMENTS))
def test_processes_given_a_call_otherwise_all_refuse_it_naming_what_differs(
        job: Job, what: str) -> None:
    """A process given its own shard, other arguments, its own augmentation or its own
    batch would train other batches than one device (or wait forever, with other step
    counts): every process raises a ValueError naming what differs and the fix, before
    any weight moves."""
    out = _finished(job, f"disagree-{what}")
    on_rank0, on_rank1 = DISAGREEMENTS[what]
    for rank, expected in ((0, on_rank0), (1, on_rank1)):
        raised = (out / f"raised{rank}.txt").read_text()
        assert raised.startswith("ValueError: "), raised
        assert "call in a job of 2 processes. Received: " in raised, raised
        assert "Allowed: every process passes" in raised and "Fix: " in raised, raised
        for words in expected:
            assert words in raised, (words, raised)
        weights = np.load(out / f"after{rank}.npz")
        count = len([k for k in weights.files if k.startswith("before_")])
        assert count > 0
        for kind in ("template", "parallel"):
            for i in range(count):
                np.testing.assert_array_equal(weights[f"{kind}_{i}"], weights[f"before_{i}"],
                                              err_msg=f"rank {rank} {kind} {i}")
    assert "another process was given" in (out / "raised0.txt").read_text()


def _assert_listeners(out: Path) -> None:
    """What the job listens on, read from the socket table while it ran: the JAX
    coordinator and torch's store on loopback only; TensorFlow's servers on every
    interface, which TensorFlow does not let us change (the README says so)."""
    seen = [json.loads((out / f"listeners{rank}.json").read_text()) for rank in (0, 1)]
    by_port = {port: host for job in seen for host, port in job["sockets"]}
    ours = {"jax": seen[0]["jax"], "torch": seen[0]["torch"]}
    if ON_JAX:
        assert ours["jax"] in by_port, seen
    if ON_TORCH and ours["torch"] is not None:
        assert ours["torch"] in by_port, seen
    for what, port in ours.items():
        if port in by_port:
            assert _loopback(by_port[port]), (what, seen)
    if LINE in MULTI_WORKER_LINES:
        tf_ports = set(seen[0]["tf"])
        assert len(tf_ports) == 2 and tf_ports <= set(by_port), seen
        assert all(by_port[p] in ("0.0.0.0", "::") for p in tf_ports), seen


@trains_in_processes
def test_a_dying_worker_stops_the_run_and_the_run_resumes(tmp_path: Path, one: Path) -> None:
    out, backup = tmp_path / "run", tmp_path / "backup"
    crashed = _launch(out, "--epochs", "3", "--crash-rank", "1", "--crash-epoch", "1",
                      "--crash-how", "sys_exit", "--backup", str(backup))
    returned = time.time()
    assert crashed.returncode == 3, (crashed.stdout + crashed.stderr)[-4000:]
    assert "rank 1 exited with code 3" in crashed.stderr
    # Fails fast: the surviving worker (blocked in a collective with the dead one) is
    # stopped, not waited for. Measured from the crash itself, so that start-up on a
    # loaded CI machine (imports, the first epoch) does not count against the bound.
    died = float((out / "crashed").read_text())
    assert returned - died < 60, f"launch returned {returned - died:.0f} s after rank 1 died"
    assert not (out / "rank0.npz").exists()
    pids = [int((out / f"pid{rank}").read_text()) for rank in (0, 1)]
    assert wait_until(lambda: not group_members(pids)), f"left behind: {group_members(pids)}"
    # Relaunch: training resumes from the last backup and ends where an uninterrupted
    # run (one process, 3 epochs) ends (at most one epoch is redone).
    resumed = _launch(out, "--epochs", "3", "--backup", str(backup))
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    history = np.load(out / "rank0.npz", allow_pickle=True)["loss"]
    assert 1 <= len(history) < 3  # resumed, not restarted
    _assert_same(one / "arrays" / "rank0.npz", out / "rank0.npz", keys=("evaluation",))


# 101 rows, global batch 10: 11 steps an epoch. Backups every 4 steps; the last one
# before step 17 (epoch 1, its 6th step) holds step 16: a resume must skip or replay the
# epoch's first 5 steps and end where the uninterrupted run ends.
MID_EPOCH = ["--epochs", "3", "--save-freq", "4"]


@pytest.fixture(scope="module")
def uninterrupted(one: Path) -> Path:
    """One process, one device, 3 epochs without a stop: the reference of a resume."""
    return one / "arrays" / "rank0.npz"


def _assert_resumed_exactly(expected: Path, out: Path) -> None:
    got = out / "rank0.npz"
    _assert_same(expected, got, keys=("evaluation",))
    loss = np.load(got, allow_pickle=True)["loss"]
    assert len(loss) == 2, loss  # epochs 1 and 2: resumed, not restarted
    np.testing.assert_allclose(loss, np.load(expected, allow_pickle=True)["loss"][1:],
                               rtol=1e-5, atol=1e-6)


# The jobs killed at every point of a save: 11 steps an epoch, a backup every 2 steps,
# SGD with momentum (optimizer state to restore), a ModelCheckpoint of the weights at
# every epoch end. Run r of one job (`--max-restarts`) dies at the r-th fault
# (tests/workers/faults.py: HOW:POINT@RANK, at the run's second backup, so that each run
# moves the job on); the next run resumes the last complete backup.
FAULT_RUN = ["--epochs", "3", "--save-freq", "2", "--momentum", "0.9", "--checkpoint"]
# The points of one save, then between two saves ("step") and while the ModelCheckpoint
# file is replaced; the kill alternates between SIGKILL and an exception. The other
# process's part: on torch each process writes its own share of the metrics (`share`);
# on tf.keras every worker takes part in writing the checkpoint (`before` on rank 1: it
# dies before its part, the chief is left in the collective); on JAX the chief writes
# everything.
_OTHERS = (["share@1"] if ON_TORCH else ["before@1"] if LINE in MULTI_WORKER_LINES else [])
FAULT_POINTS = ["before@0", "weights-truncated@0", "weights@0", "position@0", "commit@0",
                *_OTHERS, "after@0", "step@1", "replace@0"]
# CI's job (a restart costs 30-60 s on a loaded 2-core machine): a SIGKILL during Keras's
# write, an exception at the other process's part (JAX: before the rename), a SIGKILL
# between two saves. Every point is also reached in one process by an exception
# (test_resume.py); the whole sweep, each point with each kill, is marked `sweep`.
CI_FAULTS = ["sigkill:weights-truncated@0",
             f"raise:{_OTHERS[0] if _OTHERS else 'commit@0'}", "sigkill:step@1"]
SWEEP = [pytest.mark.sweep, pytest.mark.skipif(
    os.environ.get("KERASMGPU_SWEEP") != "1",
    reason="the whole kill-point sweep (9-10 restarts a job, 8-10 min): KERASMGPU_SWEEP=1")]


def _faults(points: List[str], first: str = "sigkill") -> List[str]:
    hows = ["sigkill", "raise"] if first == "sigkill" else ["raise", "sigkill"]
    return [f"{hows[i % 2]}:{point}" for i, point in enumerate(points)]


def _assert_faulted_job(out: Path, run: subprocess.CompletedProcess, faults: List[str],
                        expected: Path, nproc: int) -> None:
    """Every fault happened in its run, every restart resumed (saying from which backup),
    the ModelCheckpoint file a kill interrupted was still whole, nothing was left
    running, and the job ended with the uninterrupted run's weights, optimizer state and
    History (of the epochs its last run trained)."""
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    for r, fault in enumerate(faults):
        how, where = fault.split(":")
        said = (out / f"fault{r}.txt").read_text()
        assert said.startswith(how) and f"on rank {where.split('@')[1]}" in said, (r, said)
    assert output.count("restarting the whole job") == len(faults), output[-6000:]
    assert output.count("kerasmgpu: resuming from backup") == len(faults), output[-6000:]
    if any(":share@" in f for f in faults):
        assert "did not write its share of this backup" in output, output[-6000:]
    checks = sorted(out.glob("checkpoint-check.run*.txt"))
    assert all(c.read_text() == "loads" for c in checks), [(c.name, c.read_text())
                                                           for c in checks]
    replaced = [r for r, f in enumerate(faults) if ":replace@" in f]
    assert all((out / f"checkpoint-check.run{r + 1}.txt").exists() for r in replaced), checks
    pids = jobs.pids(out, "pid*.run*")
    assert len(pids) == nproc * (len(faults) + 1), sorted(p.name for p in out.glob("pid*"))
    assert wait_until(lambda: not group_members(pids)), f"left behind: {group_members(pids)}"
    got = out / "rank0.npz"
    _assert_same(expected, got, keys=("evaluation",))
    ours, theirs = np.load(got, allow_pickle=True), np.load(expected, allow_pickle=True)
    optimizer = sorted(k for k in theirs.files if k.startswith("optimizer_"))
    assert optimizer and sorted(k for k in ours.files if k.startswith("optimizer_")) == optimizer
    for key in optimizer:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for key in ("loss", "val_loss"):
        trained = len(ours[key])
        assert 1 <= trained <= 3
        np.testing.assert_allclose(ours[key], theirs[key][-trained:], rtol=1e-5, atol=1e-6,
                                   err_msg=key)


@trains_in_processes
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("faults", [
    pytest.param(CI_FAULTS, id="ci"),
    pytest.param(_faults(FAULT_POINTS, first="sigkill"), id="sweep-sigkill-first", marks=SWEEP),
    pytest.param(_faults(FAULT_POINTS, first="raise"), id="sweep-raise-first", marks=SWEEP),
])
def test_a_kill_at_every_point_of_a_save_resumes_exactly(tmp_path: Path, one: Path,
                                                         faults: List[str]) -> None:
    """The job restarted after each kill ends within 1e-5 of the uninterrupted one: a
    kill before a save, during Keras's write (its files truncated), between Keras's files
    and kerasmgpu's position, before the manifest and before the rename, between two
    processes' parts, after the save, between two saves, and while a ModelCheckpoint file
    is replaced."""
    out, backup = tmp_path / "run", tmp_path / "backup"
    run = _launch(out, *FAULT_RUN, "--backup", str(backup), "--faults", ",".join(faults),
                  restarts=len(faults), timeout=1200)
    _assert_faulted_job(out, run, faults, one / "faults" / "rank0.npz", nproc=2)


@pytest.mark.skipif(not ON_JAX or JAX_TOO_OLD,
                    reason="one process's SIGKILLs run once, on Keras 3 JAX (its references "
                    "are trained for this module anyway); every line in one process, by "
                    f"exceptions: test_resume.py; this env: {LINE.value} {_VERSION}")
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("faults", [
    pytest.param(["sigkill:weights-truncated@0"], id="ci"),
    pytest.param(_faults([p for p in FAULT_POINTS if not p.endswith("@1")] + ["step@0"]),
                 id="sweep", marks=SWEEP),
])
def test_one_process_killed_at_points_of_a_save_resumes_exactly(tmp_path: Path, one: Path,
                                                                faults: List[str]) -> None:
    """One process on 2 devices, SIGKILLed during Keras's write (in the sweep: at every
    point; `kerasmgpu launch --nproc 1 --max-restarts`)."""
    out, backup = tmp_path / "run", tmp_path / "backup"
    run = _launch(out, *FAULT_RUN, "--backup", str(backup), "--faults", ",".join(faults),
                  nproc=1, restarts=len(faults), timeout=1200,
                  env={"KERASMGPU_VIRTUAL_DEVICES": "2"})
    _assert_faulted_job(out, run, faults, one / "faults" / "rank0.npz", nproc=1)


@trains_in_processes
def test_a_preempted_job_run_again_resumes_exactly(tmp_path: Path,
                                                   uninterrupted: Path) -> None:
    out, backup = tmp_path / "run", tmp_path / "backup"
    command = [*MID_EPOCH, "--backup", str(backup), "--preempt-step", "17"]
    preempted = _launch(out, *command)
    assert preempted.returncode == 143, (preempted.stdout + preempted.stderr)[-4000:]
    assert not (out / "rank0.npz").exists()
    pids = [int((out / f"pid{rank}").read_text()) for rank in (0, 1)]
    assert wait_until(lambda: not group_members(pids)), f"left behind: {group_members(pids)}"
    # The chief wrote a backup of the step SIGTERM came in (epoch 1, 6 steps done), not
    # only the last periodic one (5 steps done) - except where every worker takes part
    # in a backup (tf.keras's MultiWorkerMirroredStrategy) or keeps its own share of
    # the metrics (torch): there the chief cannot write one alone.
    steps = 5 if LINE in MULTI_WORKER_LINES or ON_TORCH else 6
    newest = sorted(backup.glob("kerasmgpu-backup-*[0-9]"))[-1]
    position = json.loads((newest / "kerasmgpu_manifest.json").read_text())["position"]
    assert (position["epoch"], position["steps"]) == (1, steps), position
    again = _launch(out, *command)  # the same command, as a requeued job runs it
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    _assert_resumed_exactly(uninterrupted, out)


@trains_in_processes
@pytest.mark.skipif(ON_TORCH, reason="one torch process trains its one device as plain "
                    "Keras does: no kerasmgpu backup to resume from")
def test_a_backup_of_one_process_is_refused_by_two(tmp_path: Path) -> None:
    """A backup records the job that wrote it; a job of another number of processes
    stops before training, naming the fix, in every process (on torch the metrics each
    process keeps would be lost or doubled; kerasmgpu refuses it on every line)."""
    backup = tmp_path / "backup"
    crashed = _single(tmp_path / "one", *MID_EPOCH, "--backup", str(backup),
                      "--crash-rank", "0", "--crash-step", "17", "--crash-epoch", "1",
                      "--crash-how", "raise", env={"KERASMGPU_VIRTUAL_DEVICES": "2"})
    assert crashed.returncode != 0 and "fails on purpose" in crashed.stderr, \
        crashed.stderr[-3000:]
    assert list(backup.glob("kerasmgpu-backup-*[0-9]/kerasmgpu_position.npz"))
    refused = _launch(tmp_path / "two", *MID_EPOCH, "--backup", str(backup))
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert "written by 1 process(es) and 2 replica(s): resume it with 1 process" in output, \
        output[-4000:]
    assert not (tmp_path / "two" / "rank0.npz").exists()
    pids = [int((tmp_path / "two" / f"pid{rank}").read_text()) for rank in (0, 1)]
    assert wait_until(lambda: not group_members(pids)), f"left behind: {group_members(pids)}"


# How a worker fails -> (train.py options, launch's exit status, how launch says it).
# sys.exit(3) in a callback is test_a_dying_worker_stops_the_run_and_the_run_resumes's
# failure, checked the same way there (status 3, the message, the bound, no process left).
FAILURES = {
    "exception before fit": (["--crash-epoch", "-1", "--crash-how", "raise"], 1,
                             "rank 1 exited with code 1"),
    "exception in a callback": (["--crash-epoch", "0", "--crash-how", "raise"], 1,
                                "rank 1 exited with code 1"),
    "SIGKILL": (["--crash-epoch", "0", "--crash-how", "sigkill"], 1,
                "rank 1 was killed by signal SIGKILL"),
}


@trains_in_processes
@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_failing_worker_ends_the_job(tmp_path: Path, failure: str) -> None:
    options, status, said = FAILURES[failure]
    out = tmp_path / "run"
    run = _launch(out, "--epochs", "2", "--crash-rank", "1", *options)
    returned = time.time()
    assert run.returncode == status, (run.stdout + run.stderr)[-4000:]
    assert f"kerasmgpu launch: {said}" in run.stderr, run.stderr[-3000:]
    died = float((out / "crashed").read_text())
    assert returned - died < 60, f"launch returned {returned - died:.0f} s after rank 1 failed"
    assert not (out / "rank0.npz").exists()
    pids = [int((out / f"pid{rank}").read_text()) for rank in (0, 1)]
    assert wait_until(lambda: not group_members(pids)), f"left behind: {group_members(pids)}"


@trains_in_processes
@pytest.mark.parametrize("inputs", SHUFFLED)
def test_every_sample_once_per_epoch(job: Job, inputs: str) -> None:
    out = _finished(job, f"ids-{inputs}")
    seen = [json.loads((out / f"ids{rank}.json").read_text()) for rank in (0, 1)]
    rows, batch, share = 64, 8, 4  # share: rows of each global batch per process
    for epoch in range(2):
        ids = [seen[rank]["epochs"][epoch] for rank in (0, 1)]
        assert sorted(ids[0] + ids[1]) == list(range(rows)), (epoch, ids)
        steps = [[ids[rank][i:i + share] for i in range(0, len(ids[rank]), share)]
                 for rank in (0, 1)]
        assert len(steps[0]) == len(steps[1]) == rows // batch
        if inputs == "pydataset":  # batch b holds ids 8b..8b+7: each step one batch
            for first, second in zip(*steps):
                assert len({i // batch for i in first + second}) == 1, steps
    assert seen[0]["epochs"][0] != seen[0]["epochs"][1]  # reshuffled every epoch
    # The model was built without a seed: both processes started, and ended, alike.
    assert seen[0]["weights"] == seen[1]["weights"]


# The torch line's misuses (tests/workers/misuse.py) and its self-check's faults
# (tests/workers/verify.py) share one job too: the refused unbuilt model is recorded and
# the job goes on; the lonely evaluate comes last (it leaves rank 0's collectives timed
# out).
MISUSES: Dict[str, List[str]] = {"uncompiled": ["misuse.py", "uncompiled"],
                                 "dataloader": ["misuse.py", "dataloader"],
                                 "unbuilt!": ["misuse.py", "unbuilt"],
                                 "verify": ["verify.py"],
                                 "evaluate-alone": ["misuse.py", "evaluate-alone"]}


@pytest.fixture(scope="module")
def misuse(tmp_path_factory: pytest.TempPathFactory) -> Job:
    root = tmp_path_factory.mktemp("misuse")
    run = _launch(root, *runs_args(MISUSES), worker=str(WORKERS / "runs.py"),
                  env={"KERASMGPU_COLLECTIVE_TIMEOUT": "10"})
    return root, run


@requires(torch=True)
@pytest.mark.parametrize("mode", ["unbuilt", "evaluate-alone"])
def test_torch_refuses_an_unbuilt_model_and_bounds_a_lonely_evaluate(
        misuse: Job, mode: str) -> None:
    out = _finished(misuse, mode)
    if mode == "unbuilt":  # refused in every process
        for rank in (0, 1):
            raised = (out / f"raised{rank}.txt").read_text()
            assert "Invalid `model`. Received: model=an unbuilt Sequential" in raised, raised
            assert "model.build(input_shape)" in raised
        return
    outcome = (out / "evaluate-alone.txt").read_text()
    assert outcome.startswith("raised after"), outcome
    assert "KERASMGPU_COLLECTIVE_TIMEOUT (10 s)" in outcome
    assert float(outcome.split()[2]) < 60


@requires(torch=True)
def test_torch_says_to_compile_an_uncompiled_parallel_model(misuse: Job) -> None:
    outcome = json.loads((_finished(misuse, "uncompiled") / "uncompiled.json").read_text())
    assert outcome.pop("predict_same") is True  # predict works uncompiled, as in Keras
    assert sorted(outcome) == ["evaluate", "fit", "test_on_batch", "train_on_batch"]
    for name, result in outcome.items():
        # Plain Keras refuses each call too: a ValueError ("You must call `compile()`"),
        # but in evaluate on torch an AttributeError of its own ('Sequential' object has
        # no attribute 'optimizer', Keras 3.15.1).
        assert result["keras"] == ("AttributeError" if name == "evaluate" else "ValueError")
        assert result["is_value_error"] is True
        assert f"not compiled, in {name}()" in result["ours"]
        assert "Fix: call `compile(optimizer=..., loss=...)` on your model" in result["ours"]


@requires(torch=True)
def test_torch_refuses_a_dataloader_naming_a_generator_over_it_which_trains_exactly(
        misuse: Job) -> None:
    """Keras 3 reads a torch DataLoader itself; kerasmgpu cannot tell which order each
    process's iterator of it reads, so fit and evaluate refuse it on every process
    before a weight moves, and the fix they name trains as one device reading the
    loader. predict, each process's own in a job, reads it as Keras does."""
    out = _finished(misuse, "dataloader")
    for rank in (0, 1):
        outcome = json.loads((out / f"dataloader{rank}.json").read_text())
        assert outcome["predict_difference"] < 1e-6, outcome
        for name in ("fit", "evaluate"):
            assert outcome[name].startswith(
                "Invalid `x`. Received: x=a DataLoader: an iterable that is neither an "
                "iterator nor indexed"), outcome[name]
            assert "generator=torch.Generator().manual_seed(S)" in outcome[name]
        assert outcome["untouched"] is True
        assert outcome["fix_difference"] < 1e-5, outcome


@requires(torch=True)
@pytest.mark.parametrize("feed", ["arrays", pytest.param("tf.data", marks=requires(
    tf_data=True))])
def test_torch_verify_changes_nothing_and_raises_on_every_fault_in_every_process(
        request: pytest.FixtureRequest, feed: str) -> None:
    """parallelize(verify=True) on two processes (tests/workers/verify.py): a correct
    model trains as without the check; a replica whose weights differ in one process,
    a wrong padding weight (arrays, and a PyDataset or a generator whose 8-row first
    batch divides: its first 7 rows are checked too), a Python attribute changed on one
    process, a loss term that sums over a process's rows (which no per-process step
    computes as one device),
    and evaluate's first batch raise VerificationError in both processes, before any
    weight moves. "tf.data": the correct model, the weights and the padding faults read
    from a tf.data pipeline (its first batch read by an iterator of the check's own)."""
    if feed == "tf.data":
        out = _finished(request.getfixturevalue("job"), "verify-tfdata")
    else:
        out = _finished(request.getfixturevalue("misuse"), "verify")
    named = {"weights": "'hidden'", "padding": "No layer's output differs",
             "padding-fed": "No layer's output differs",
             "padding-gen": "No layer's output differs",
             "state": "'scale'", "term": "in a loss term computed from the batch (add_loss "
             "in SummedModel.call (layer 'summed'))", "evaluate": "'hidden'"}
    if feed == "tf.data":
        named = {fault: named[fault] for fault in ("weights", "padding")}
    for rank in (0, 1):
        outcome = json.loads((out / f"verify{rank}.json").read_text())
        assert outcome.pop("correct") == 0.0, outcome
        assert sorted(outcome) == sorted(named), (rank, sorted(outcome))
        for fault, result in outcome.items():
            assert result["said"].startswith("kerasmgpu verify:"), (rank, fault, result)
            assert named[fault] in result["said"], (rank, fault, result["said"])
            assert result["moved"] == 0.0, (rank, fault, result)
            if fault != "evaluate":
                assert "Nothing was applied" in result["said"], result["said"]


@requires(lines=[KerasLine.KERAS_3])
@pytest.mark.skipif(ON_JAX or ON_TORCH, reason="the TF backend's multi-worker message")
def test_keras3_on_tensorflow_explains_before_training(tmp_path: Path) -> None:
    run = _launch(tmp_path / "out", "--epochs", "1")
    assert run.returncode != 0
    text = run.stdout + run.stderr
    assert "keras-team/keras#20585" in text and "KERAS_BACKEND=jax" in text
    assert "rank 0 of 2: done" not in text


@requires(torch=True)
def test_torch_outside_launch_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError) as info:
        kerasmgpu.parallelize(model, gpus=2)
    assert "kerasmgpu launch --nproc 2" in str(info.value)
    with pytest.raises(ValueError, match="kerasmgpu launch --nproc 3"):
        kerasmgpu.parallelize(model)  # all 3 virtual devices
    assert kerasmgpu.parallelize(model, gpus=1) is model
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(ON_LEGACY, reason="Keras 2.3 trains in one process only")
def test_process_helpers_outside_launch() -> None:
    assert kerasmgpu.process_index() == 0
    assert kerasmgpu.process_count() == 1
    assert kerasmgpu.is_chief()
