"""`kerasmgpu launch`: environment contract, output prefixes, and stopping every process.

Workers are small stdlib scripts written into tmp_path, so no ML framework is needed.
Every test that starts processes hands them a unique marker variable; the `tracked`
fixture then scans /proc for any process still carrying it, so a survivor - worker or
grandchild - fails the test that leaked it. Each test is bounded by a 60 s timeout.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest
from helpers import wait_until

from kerasmgpu.launch import (
    LaunchError,
    binding_note,
    free_port_block,
    launch,
    main,
    parse_coordinator,
    worker_environments,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.pure]

MARK = "KMG_LAUNCH_TEST_MARK"
CONTRACT = [
    "KERASMGPU_PROCESS_INDEX", "KERASMGPU_PROCESS_COUNT", "KERASMGPU_LOCAL_PROCESS_INDEX",
    "KERASMGPU_LOCAL_PROCESS_COUNT", "KERASMGPU_COORDINATOR", "KERASMGPU_LAUNCHED",
    "KERASMGPU_TORCH_BACKEND", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID", "TF_CONFIG", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES", "KERAS_BACKEND",
]

# Shared worker preamble: the rank, a ready-file helper so one worker can wait for another
# without sleeping a guessed time, and the pid printed first so the test can check it.
PREAMBLE = """\
import json, os, signal, subprocess, sys, time
RANK = int(os.environ["KERASMGPU_PROCESS_INDEX"])
HERE = os.path.dirname(os.path.abspath(__file__))
def ready(name):
    open(os.path.join(HERE, name), "w").close()
def wait_for(name):
    end = time.time() + 30
    while not os.path.exists(os.path.join(HERE, name)) and time.time() < end:
        time.sleep(0.02)
print("pid", os.getpid(), flush=True)
"""


# --- helpers ---------------------------------------------------------------------------


def _state(pid: int) -> str:
    """Process state letter, '' when gone; Z (zombie) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        return data[data.rindex(b")") + 2:].split()[0].decode()
    except (OSError, ValueError, IndexError):
        if not os.path.isdir("/proc"):
            try:
                os.kill(pid, 0)
                return "R"
            except ProcessLookupError:
                return ""
            except PermissionError:
                return "R"
        return ""


def _alive(pid: int) -> bool:
    return _state(pid) not in ("", "Z", "X")


def _marked(token: str) -> List[int]:
    """Live processes whose environment carries this test's marker."""
    needle = f"{MARK}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0") and _alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def assert_gone(*pids: int) -> None:
    assert pids, "no pid was collected"
    assert wait_until(lambda: not any(_alive(p) for p in pids)), (
        f"still alive: {[p for p in pids if _alive(p)]}"
    )


class Tracked:
    """A base environment for workers, marked so that leftovers can be found."""

    def __init__(self, tmp_path: Path, token: str) -> None:
        self.tmp_path = tmp_path
        self.token = token
        self.env: Dict[str, str] = {**os.environ, MARK: token}

    def script(self, body: str, name: str = "worker.py") -> str:
        path = self.tmp_path / name
        path.write_text(PREAMBLE + textwrap.dedent(body))
        return str(path)


@pytest.fixture
def tracked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tracked]:
    token = uuid.uuid4().hex
    # main() passes os.environ on, so the marker is set there too (for this test only).
    monkeypatch.setenv(MARK, token)
    yield Tracked(tmp_path, token)
    if os.path.isdir("/proc"):
        assert wait_until(lambda: not _marked(token)), f"survivors: {_marked(token)}"


def by_rank(text: str) -> Dict[int, List[str]]:
    lines: Dict[int, List[str]] = {}
    for line in text.splitlines():
        if line.startswith("[rank "):
            head, _, rest = line.partition("] ")
            lines.setdefault(int(head[len("[rank "):]), []).append(rest)
    return lines


def pids_in(text: str) -> List[int]:
    return [int(rest[4:]) for lines in by_rank(text).values() for rest in lines
            if rest.startswith("pid ")]


def json_lines(text: str) -> Dict[int, dict]:
    return {rank: json.loads(next(x for x in lines if x.startswith(("{", "["))))
            for rank, lines in by_rank(text).items()}


PRINT_ENV = f"""\
print(json.dumps({{k: os.environ.get(k) for k in {CONTRACT!r}}}), flush=True)
"""


# --- the environment, without processes -----------------------------------------------


def test_parse_coordinator() -> None:
    assert parse_coordinator("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert parse_coordinator("node-0.cluster:1234") == ("node-0.cluster", 1234)
    assert parse_coordinator("[::1]:29500") == ("::1", 29500)
    for bad in ("nohost", "host:", ":80", "h:0", "h:70000", "::1:80", "h:80:90", "a b:1"):
        with pytest.raises(LaunchError, match="Received.*Allowed.*Fix"):
            parse_coordinator(bad)


def test_gpus_per_proc_slices_visible_devices() -> None:
    envs, notes = worker_environments(
        2, "127.0.0.1:29500", gpus_per_proc=2, base_env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    )
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4,5", "6,7"]
    assert [e["KERASMGPU_TORCH_BACKEND"] for e in envs] == ["nccl", "nccl"]
    assert notes == []
    # Without --gpus-per-proc every worker sees them all.
    envs, _ = worker_environments(2, "127.0.0.1:29500", base_env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "0,1"]
    with pytest.raises(LaunchError, match="--gpus-per-proc.*Allowed: at most 1"):
        worker_environments(3, "127.0.0.1:29500", gpus_per_proc=2,
                            base_env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})


def test_cpu_threads_are_shared_out_unless_set() -> None:
    cores = len(os.sched_getaffinity(0))
    envs, _ = worker_environments(2, "127.0.0.1:29500", base_env={})
    assert [e["OMP_NUM_THREADS"] for e in envs] == [str(max(1, cores // 2))] * 2
    envs, _ = worker_environments(cores + 1, "127.0.0.1:29500", base_env={})
    assert {e["OMP_NUM_THREADS"] for e in envs} == {"1"}
    # The user's own choice stands; one worker keeps the whole machine.
    envs, _ = worker_environments(2, "127.0.0.1:29500", base_env={"OMP_NUM_THREADS": "3"})
    assert [e["OMP_NUM_THREADS"] for e in envs] == ["3", "3"]
    (env,), _ = worker_environments(1, "127.0.0.1:29500", base_env={})
    assert "OMP_NUM_THREADS" not in env


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_no_gpu_means_gloo_and_gpus_per_proc_ignored(hidden: str) -> None:
    envs, notes = worker_environments(
        2, "127.0.0.1:29500", gpus_per_proc=1, base_env={"CUDA_VISIBLE_DEVICES": hidden}
    )
    assert [e["KERASMGPU_TORCH_BACKEND"] for e in envs] == ["gloo", "gloo"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == [hidden, hidden]
    assert any("--gpus-per-proc 1 is ignored" in n for n in notes)


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_ipv6_backend_and_inherited_tf_config(backend: str) -> None:
    envs, notes = worker_environments(
        1, "[::1]:29500", nnodes=2, node_rank=1, backend=backend,
        base_env={"TF_CONFIG": "stale", "CUDA_VISIBLE_DEVICES": ""},
    )
    (env,) = envs
    assert env["MASTER_ADDR"] == "::1" and env["MASTER_PORT"] == "29501"
    assert env["JAX_COORDINATOR_ADDRESS"] == env["KERASMGPU_COORDINATOR"] == "[::1]:29500"
    assert env["KERAS_BACKEND"] == backend
    assert "TF_CONFIG" not in env  # a stale one cannot describe this run
    # The note about --worker-hosts matters only when TensorFlow may run.
    noted = any("--worker-hosts" in n and "removed" in n for n in notes)
    assert noted == (backend == "tensorflow")


def test_binding_note_says_whether_the_rendezvous_is_reachable() -> None:
    assert "loopback: this machine only" in binding_note("127.0.0.1:29500")
    assert "loopback" in binding_note("[::1]:29500")
    across = binding_note("10.0.0.1:29500")
    assert "10.0.0.1:29500" in across and "without authentication" in across
    assert "private network" in across and "loopback" not in across


def test_free_port_block_is_bindable() -> None:
    import socket

    base = free_port_block(4)
    for port in range(base, base + 4):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


# --- processes ---------------------------------------------------------------------------


@pytest.mark.multiprocess
def test_two_workers_succeed_with_the_contract(tracked: Tracked) -> None:
    script = tracked.script(PRINT_ENV)
    env = {**tracked.env, "CUDA_VISIBLE_DEVICES": ""}
    out, err = io.StringIO(), io.StringIO()
    result = launch([sys.executable, script], 2, env=env, stdout=out, stderr=err)
    assert result.returncode == 0, err.getvalue()
    assert (result.failed_rank, result.timed_out, result.message) == (None, False, None)
    assert set(result.durations) == {0, 1} and all(d > 0 for d in result.durations.values())
    seen = json_lines(out.getvalue())
    assert set(seen) == {0, 1}
    port = int(seen[0]["KERASMGPU_COORDINATOR"].rsplit(":", 1)[1])
    for rank, env_seen in seen.items():
        assert env_seen == {
            "KERASMGPU_PROCESS_INDEX": str(rank), "KERASMGPU_PROCESS_COUNT": "2",
            "KERASMGPU_LOCAL_PROCESS_INDEX": str(rank), "KERASMGPU_LOCAL_PROCESS_COUNT": "2",
            "KERASMGPU_COORDINATOR": f"127.0.0.1:{port}", "KERASMGPU_LAUNCHED": "1",
            "KERASMGPU_TORCH_BACKEND": "gloo",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port + 1), "RANK": str(rank),
            "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
            "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2",
            "JAX_PROCESS_ID": str(rank),
            "TF_CONFIG": json.dumps({
                "cluster": {"worker": [f"127.0.0.1:{port + 2}", f"127.0.0.1:{port + 3}"]},
                "task": {"type": "worker", "index": rank},
            }),
            "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "",
            "KERAS_BACKEND": os.environ.get("KERAS_BACKEND"),
        }
    assert_gone(*result.pids.values())


@pytest.mark.multiprocess
def test_rank_prefixes_on_stdout_and_stderr(tracked: Tracked) -> None:
    script = tracked.script("""\
        print(f"out {RANK}")
        print(f"err {RANK}", file=sys.stderr)
        sys.stdout.flush()
        os.write(1, b"bytes \\xff\\n")    # not UTF-8: replaced, not fatal
        os.write(2, b"no newline")        # a last line without "\\n" still comes out
    """)
    out, err = io.StringIO(), io.StringIO()
    result = launch([sys.executable, script], 2, env=tracked.env, stdout=out, stderr=err)
    assert result.returncode == 0
    outs, errs = by_rank(out.getvalue()), by_rank(err.getvalue())
    for rank in (0, 1):
        assert outs[rank] == [f"pid {result.pids[rank]}", f"out {rank}", "bytes \ufffd"]
        assert errs[rank] == [f"err {rank}", "no newline"]
    assert all(line.startswith("[rank ") for line in out.getvalue().splitlines())
    assert all(line.startswith(("[rank ", "kerasmgpu launch: rendezvous on "))
               for line in err.getvalue().splitlines())


@pytest.mark.multiprocess
def test_failing_worker_stops_the_sleeper(tracked: Tracked,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    script = tracked.script("""\
        if RANK == 0:
            ready("sleeping")
            time.sleep(600)
        wait_for("sleeping")
        sys.exit(3)
    """)
    start = time.monotonic()
    code = main(["--nproc", "2", script])
    elapsed = time.monotonic() - start
    out, err = capsys.readouterr()
    assert code == 3, err
    assert elapsed < 60  # stopped, not waited for (the sleeper sleeps 600 s)
    assert "kerasmgpu launch: rank 1 exited with code 3; stopped the other 1 worker(s)" in err
    assert len(pids_in(out)) == 2
    assert_gone(*pids_in(out))


def test_the_first_failure_is_named_though_its_consequence_exits_first(
        tracked: Tracked, capsys: pytest.CaptureFixture[str]) -> None:
    # Rank 1 fails and then takes 2 s to exit (a framework's teardown); rank 0 fails
    # because of it and exits at once. The launcher sees rank 0 exit first, but rank 1
    # noted the instant it failed (kerasmgpu.process.ending), and is named.
    script = tracked.script("""\
        from kerasmgpu.env import cluster
        from kerasmgpu.process import ending
        ending.watch(cluster.detect())
        if RANK == 1:
            noting = sys.excepthook
            def hook(*exc):
                noting(*exc)  # kerasmgpu's: notes the instant, prints the traceback
                ready("failed")  # only now may rank 0 fail
                time.sleep(2)
            sys.excepthook = hook
            raise RuntimeError("the first failure")
        wait_for("failed")
        sys.exit(5)
    """)
    code = main(["--nproc", "2", script])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "RuntimeError: the first failure" in err
    assert "kerasmgpu launch: rank 1 exited with code 1; stopped the other 0 worker(s)" in err
    assert_gone(*pids_in(out))


def test_a_worker_killed_by_a_signal_is_named_though_its_peer_noted_first(
        tracked: Tracked, capsys: pytest.CaptureFixture[str]) -> None:
    # Rank 1 is killed by SIGKILL (it notes nothing), and its exit is seen late - as a
    # large process's is, its memory freed before the launcher learns it died; rank 0
    # fails at once because its peer is gone, notes that, and exits first. Named: rank 1
    # (it was rank 0, "exited with code 1", 1 job in 10 of the JAX SIGKILL test).
    script = tracked.script("""\
        from kerasmgpu.env import cluster
        from kerasmgpu.process import ending
        ending.watch(cluster.detect())
        if RANK == 1:
            ready("gone")
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGKILL)
        wait_for("gone")
        raise ConnectionResetError("Gloo AllGather failed: Connection reset by peer")
    """)
    code = main(["--nproc", "2", script])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "kerasmgpu launch: rank 1 was killed by signal SIGKILL" in err, err[-2000:]
    assert_gone(*pids_in(out))


def test_a_failure_from_a_peer_is_named_when_no_other_worker_failed(
        tracked: Tracked, capsys: pytest.CaptureFixture[str]) -> None:
    # The peer rank 0 names ended well: rank 0's own failure is the job's, at once.
    script = tracked.script("""\
        from kerasmgpu.env import cluster
        from kerasmgpu.process import ending
        ending.watch(cluster.detect())
        if RANK == 1:
            sys.exit(0)
        raise ConnectionResetError("Connection reset by peer")
    """)
    start = time.monotonic()
    code = main(["--nproc", "2", script])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "kerasmgpu launch: rank 0 exited with code 1" in err, err[-2000:]
    assert time.monotonic() - start < 8  # not the 10 s bound of the wait for another
    assert_gone(*pids_in(out))


@pytest.mark.multiprocess
def test_worker_ignoring_sigterm_is_killed_after_grace(tracked: Tracked) -> None:
    script = tracked.script("""\
        if RANK == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            ready("ignoring")
            time.sleep(600)
        wait_for("ignoring")
        sys.exit(1)
    """)
    err = io.StringIO()
    start = time.monotonic()
    result = launch([sys.executable, script], 2, grace=1.0, env=tracked.env,
                    stdout=io.StringIO(), stderr=err)
    elapsed = time.monotonic() - start
    assert (result.returncode, result.failed_rank) == (1, 1)
    assert result.returncodes[0] == -signal.SIGKILL  # SIGTERM was ignored
    assert 1.0 <= elapsed < 60  # waited the grace, then killed (not 600 s)
    assert "rank 1 exited with code 1; stopped the other 1 worker(s)" in err.getvalue()
    assert_gone(*result.pids.values())


@pytest.mark.multiprocess
def test_worker_killed_by_a_signal_is_a_failure(tracked: Tracked) -> None:
    script = tracked.script("""\
        if RANK == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)
    """)
    err = io.StringIO()
    result = launch([sys.executable, script], 2, env=tracked.env,
                    stdout=io.StringIO(), stderr=err)
    assert (result.returncode, result.failed_rank) == (1, 1)
    assert "rank 1 was killed by signal SIGKILL; stopped the other 1 worker(s)" in err.getvalue()
    assert_gone(*result.pids.values())


@pytest.mark.multiprocess
def test_timeout_exits_124_and_stops_all(tracked: Tracked,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    script = tracked.script("time.sleep(600)\n")
    start = time.monotonic()
    code = main(["--nproc", "2", "--timeout", "2", script])
    elapsed = time.monotonic() - start
    out, err = capsys.readouterr()
    assert code == 124
    assert 2.0 <= elapsed < 60  # the timeout, not the 600 s sleep
    assert "kerasmgpu launch: timed out after 2 s; stopped 2 worker(s)" in err
    if pids_in(out):  # printed unless the machine was too slow to start Python in 2 s
        assert_gone(*pids_in(out))


@pytest.mark.multiprocess
def test_grandchild_is_killed_with_its_worker(tracked: Tracked) -> None:
    script = tracked.script("""\
        if RANK == 0:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            print("grandchild", child.pid, flush=True)
            ready("spawned")
            time.sleep(600)
        wait_for("spawned")
        sys.exit(2)
    """)
    out = io.StringIO()
    result = launch([sys.executable, script], 2, env=tracked.env, stdout=out,
                    stderr=io.StringIO())
    assert (result.returncode, result.failed_rank) == (2, 1)
    (grandchild,) = [int(x.split()[1]) for x in by_rank(out.getvalue())[0]
                     if x.startswith("grandchild")]
    assert_gone(grandchild, *result.pids.values())


@pytest.mark.multiprocess
def test_process_left_behind_by_a_successful_worker_is_stopped(tracked: Tracked) -> None:
    # The grandchild inherits the worker's stdout, so it would also hold the pipe open.
    script = tracked.script("""\
        if RANK == 0:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            print("grandchild", child.pid, flush=True)
    """)
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    result = launch([sys.executable, script], 2, env=tracked.env, stdout=out, stderr=err)
    assert result.returncode == 0
    assert time.monotonic() - start < 15
    assert "left running by rank(s) 0" in err.getvalue()
    (grandchild,) = [int(x.split()[1]) for x in by_rank(out.getvalue())[0]
                     if x.startswith("grandchild")]
    assert_gone(grandchild, *result.pids.values())


def _argument_cases(script: str) -> List[List[str]]:
    coord = ["--coordinator", "127.0.0.1:29500"]
    return [
        ["--nproc", "0", script],
        ["--nproc", "x", script],
        [script],                                              # no --nproc
        ["--nproc", "2"],                                      # no script
        ["--nproc", "2", "missing.py"],
        ["--nproc", "2", "-m"],
        ["--nproc", "2", "--nnodes", "2", script],             # no coordinator
        ["--nproc", "2", "--nnodes", "2", "--node-rank", "2", *coord, script],
        ["--nproc", "2", "--node-rank", "-1", script],
        ["--nproc", "2", "--coordinator", "nohost", script],
        ["--nproc", "2", "--coordinator", "h:70000", script],
        ["--nproc", "2", "--nnodes", "2", *coord, "--worker-hosts", "a", script],
        ["--nproc", "2", "--worker-hosts", "a:1", script],
        ["--nproc", "2", "--backend", "mxnet", script],
        ["--nproc", "2", "--timeout", "0", script],
        ["--nproc", "2", "--grace", "-1", script],
        ["--nproc", "2", "--grace", "0", script],              # no time to save a backup
        ["--nproc", "2", "--max-restarts", "-1", script],
        ["--nproc", "2", "--max-restarts", "x", script],
        ["--nproc", "2", "--max-restarts", "1.5", script],
        ["--nproc", "2", "--nnodes", "2", *coord, "--max-restarts", "1", script],
        ["--nproc", "2", "--preempt-signal", "KILL", script],
        ["--nproc", "2", "--preempt-signal", "SIGFOO", script],
        ["--nproc", "2", "--gpus-per-proc", "0", script],
        ["--nproc", "2", "--unknown", script],
    ]


@pytest.mark.multiprocess
def test_argument_errors_exit_2(tracked: Tracked, capsys: pytest.CaptureFixture[str]) -> None:
    script = tracked.script("print('must not run')\n")
    for argv in _argument_cases(script):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "", argv
        assert err.startswith("kerasmgpu launch: Invalid"), (argv, err)
        assert "Received:" in err and "Allowed:" in err and "Fix:" in err, (argv, err)
    with pytest.raises(LaunchError):
        launch([], 1)
    with pytest.raises(LaunchError, match="--nproc"):
        launch([sys.executable, script], 0)
    for bad in ({"max_restarts": -1}, {"max_restarts": True}, {"grace": 0},
                {"preempt_signal": "STOP"}):
        with pytest.raises(LaunchError, match="Received.*Allowed.*Fix"):
            launch([sys.executable, script], 1, **bad)  # type: ignore[arg-type]


@pytest.mark.multiprocess
def test_module_form(tracked: Tracked, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    tracked.script("print(json.dumps(sys.argv), flush=True)\n", name="kmg_launch_mod.py")
    monkeypatch.setenv("PYTHONPATH", str(tracked.tmp_path))
    # Everything after the module is the module's, even options that look like ours.
    code = main(["--nproc", "2", "-m", "kmg_launch_mod", "a", "--nproc", "x"])
    out, err = capsys.readouterr()
    assert code == 0, err
    seen = json_lines(out)
    assert set(seen) == {0, 1}
    for argv in seen.values():
        assert argv[0].endswith("kmg_launch_mod.py") and argv[1:] == ["a", "--nproc", "x"]
    assert_gone(*pids_in(out))


@pytest.mark.multiprocess
@pytest.mark.parametrize("hosts", [None, "127.0.0.1,127.0.0.1"])
def test_second_node_gets_ranks_2_and_3(tracked: Tracked, hosts: Optional[str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    script = tracked.script(PRINT_ENV)
    argv = ["--nproc", "2", "--nnodes", "2", "--node-rank", "1",
            "--coordinator", "127.0.0.1:29500"]
    argv += ["--worker-hosts", hosts] if hosts else []
    code = main([*argv, script])
    out, err = capsys.readouterr()
    assert code == 0, err
    seen = json_lines(out)
    assert set(seen) == {2, 3}
    for rank, env in seen.items():
        local = rank - 2
        assert env["KERASMGPU_PROCESS_INDEX"] == env["RANK"] == env["JAX_PROCESS_ID"] == str(rank)
        assert env["KERASMGPU_PROCESS_COUNT"] == env["WORLD_SIZE"] == "4"
        assert env["JAX_NUM_PROCESSES"] == "4"
        assert env["KERASMGPU_LOCAL_PROCESS_INDEX"] == env["LOCAL_RANK"] == str(local)
        assert env["KERASMGPU_LOCAL_PROCESS_COUNT"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29501"
        assert env["JAX_COORDINATOR_ADDRESS"] == env["KERASMGPU_COORDINATOR"] == "127.0.0.1:29500"
        if hosts is None:
            assert env["TF_CONFIG"] is None
        else:
            assert json.loads(env["TF_CONFIG"]) == {
                "cluster": {"worker": [f"127.0.0.1:{p}" for p in range(29502, 29506)]},
                "task": {"type": "worker", "index": rank},
            }
    assert ("TF_CONFIG not set" in err) == (hosts is None)
    assert_gone(*pids_in(out))


# --- the command, as its own process ----------------------------------------------------


@pytest.mark.multiprocess
def test_cli_runs_as_a_module(tracked: Tracked) -> None:
    script = tracked.script("print('hi', RANK)\nprint('oops', RANK, file=sys.stderr)\n")
    proc = subprocess.run(
        [sys.executable, "-m", "kerasmgpu.launch", "--nproc", "2", script],
        env=tracked.env, capture_output=True, text=True, timeout=50,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(x for x in proc.stdout.splitlines() if "hi" in x) == [
        "[rank 0] hi 0", "[rank 1] hi 1"]
    (bound, *lines) = proc.stderr.splitlines()
    assert sorted(lines) == ["[rank 0] oops 0", "[rank 1] oops 1"]
    # One machine, no --coordinator: the rendezvous is on loopback, and the launcher says so.
    assert bound.startswith("kerasmgpu launch: rendezvous on 127.0.0.1:") and "loopback" in bound
    assert_gone(*pids_in(proc.stdout))


@pytest.mark.multiprocess
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_stops_workers(tracked: Tracked, sig: int, code: int) -> None:
    script = tracked.script("""\
        if RANK == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # needs the SIGKILL step too
        print("ready", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerasmgpu.launch", "--nproc", "2", "--grace", "1", script],
        env=tracked.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines: List[str] = []
        assert proc.stdout is not None and proc.stderr is not None
        while sum(line.endswith("] ready") for line in lines) < 2:
            line = proc.stdout.readline()
            assert line, f"launcher ended early: {proc.wait()} {proc.stderr.read()}"
            lines.append(line.rstrip("\n"))
        proc.send_signal(sig)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    name = signal.Signals(sig).name
    assert f"kerasmgpu launch: received {name}; stopped 2 worker(s)" in err
    assert_gone(*pids_in("\n".join(lines)))


@pytest.mark.multiprocess
def test_help_and_unstartable_command(tracked: Tracked,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "KERASMGPU_PROCESS_INDEX" in capsys.readouterr().out  # the contract is in --help
    missing = str(tracked.tmp_path / "no-such-program")
    with pytest.raises(OSError):
        launch([missing], 2, env=tracked.env, stdout=io.StringIO(), stderr=io.StringIO())


# --- restarts and preemption -------------------------------------------------------------

# Rank 1 of the first run fails in the way given by argv[1] while rank 0 sleeps until it is
# stopped; every later run prints what it sees and ends 0. argv[2] == "always": every run
# fails (rank 1 exits 3).
RESTARTING = """\
RESTART = int(os.environ["KERASMGPU_RESTART_COUNT"])
print(json.dumps({k: os.environ.get(k) for k in (
    "KERASMGPU_RESTART_COUNT", "KERASMGPU_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "KERASMGPU_COORDINATOR")}), flush=True)
if RESTART == 0 or sys.argv[2:] == ["always"]:
    if RANK == 0:
        ready(f"sleeping{RESTART}")
        time.sleep(600)
    wait_for(f"sleeping{RESTART}")
    how = sys.argv[1]
    if how == "exception":
        raise RuntimeError("worker failed")
    if how == "exit":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _runs(out: str) -> Dict[int, List[dict]]:
    """What each rank printed at the start of each run, in order."""
    return {rank: [json.loads(x) for x in lines if x.startswith("{")]
            for rank, lines in by_rank(out).items()}


@pytest.mark.multiprocess
@pytest.mark.parametrize("how, code", [("exception", 1), ("exit", 3), ("sigkill", 1)])
def test_failed_run_restarts_with_the_restart_count(tracked: Tracked, how: str,
                                                    code: int) -> None:
    script = tracked.script(RESTARTING)
    out, err = io.StringIO(), io.StringIO()
    result = launch([sys.executable, script, how], 2, max_restarts=1, env=tracked.env,
                    stdout=out, stderr=err)
    assert (result.returncode, result.restarts) == (0, 1), err.getvalue()
    runs = _runs(out.getvalue())
    assert set(runs) == {0, 1}
    for seen in runs.values():
        assert [(r["KERASMGPU_RESTART_COUNT"], r["TORCHELASTIC_RESTART_COUNT"]) for r in seen] \
            == [("0", "0"), ("1", "1")]
        assert {r["KERASMGPU_MAX_RESTARTS"] for r in seen} == {"1"}
        assert {r["TORCHELASTIC_MAX_RESTARTS"] for r in seen} == {"1"}
    # Each run on its own ports: the first run's sockets must not meet the second's.
    assert runs[0][0]["KERASMGPU_COORDINATOR"] != runs[0][1]["KERASMGPU_COORDINATOR"]
    why = "was killed by signal SIGKILL" if how == "sigkill" else f"exited with code {code}"
    text = err.getvalue()
    assert f"kerasmgpu launch: run 1 of at most 2: rank 1 {why}; stopped the other 1" in text
    assert "restarting the whole job, restart 1 of 1 (KERASMGPU_RESTART_COUNT=1)" in text
    assert_gone(*pids_in(out.getvalue()))
    # Without restarts the same failure ends the job, as before.
    out, err = io.StringIO(), io.StringIO()
    result = launch([sys.executable, script, how], 2, env=tracked.env, stdout=out, stderr=err)
    assert (result.returncode, result.failed_rank, result.restarts) == (code, 1, 0)
    assert not [x for x in err.getvalue().splitlines() if "restart" in x and "[rank" not in x]
    assert f"kerasmgpu launch: rank 1 {why}; stopped the other 1 worker(s)" in err.getvalue()
    assert_gone(*pids_in(out.getvalue()))


@pytest.mark.multiprocess
def test_restarts_exhausted_end_with_the_last_failure(
    tracked: Tracked, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tracked.script(RESTARTING)
    code = main(["--nproc", "2", "--max-restarts", "2", script, "exit", "always"])
    out, err = capsys.readouterr()
    assert code == 3, err
    assert [r["KERASMGPU_RESTART_COUNT"] for r in _runs(out)[1]] == ["0", "1", "2"]
    for run in (1, 2, 3):
        assert f"run {run} of at most 3: rank 1 exited with code 3" in err
    assert "restart 2 of 2" in err and "restart 3" not in err
    assert "no restart left (--max-restarts 2); exit 3" in err
    assert_gone(*pids_in(out))


@pytest.mark.multiprocess
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_preemption_signal_stops_workers_and_asks_for_requeue(tracked: Tracked,
                                                              sig: int) -> None:
    # Each worker writes a "backup" when it gets SIGTERM, as a training script would.
    script = tracked.script("""\
        def backup(signum, frame):
            ready(f"backup{RANK}-{os.environ['KERASMGPU_RESTART_COUNT']}")
            sys.exit(0)
        signal.signal(signal.SIGTERM, backup)
        print("ready", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerasmgpu.launch", "--nproc", "2", "--max-restarts", "2",
         "--preempt-signal", "usr1", script],
        env=tracked.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines: List[str] = []
        assert proc.stdout is not None and proc.stderr is not None
        while sum(line.endswith("] ready") for line in lines) < 2:
            line = proc.stdout.readline()
            assert line, f"launcher ended early: {proc.wait()} {proc.stderr.read()}"
            lines.append(line.rstrip("\n"))
        proc.send_signal(sig)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    # Both workers got SIGTERM (whichever signal the launcher got) and nothing restarted.
    assert sorted(p.name for p in tracked.tmp_path.glob("backup*")) == ["backup0-0", "backup1-0"]
    assert "ready" not in rest and "restarting" not in err
    name = signal.Signals(sig).name
    assert f"received {name}; stopped 2 worker(s)" in err
    assert "exit 143: preempted, not restarted" in err
    assert_gone(*pids_in("\n".join(lines)))


def _readme_sbatch() -> str:
    """The docs' SLURM batch script for preemption (docs/processes.md), as users copy it."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "processes.md").read_text()
    blocks = [b.split("```", 1)[0] for b in page.split("```bash\n")[1:]]
    (script,) = [b for b in blocks if "--preempt-signal USR1" in b]
    return script


@pytest.mark.multiprocess
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_readme_sbatch_script_requeues_on_preemption(tracked: Tracked, sig: int) -> None:
    # The script runs as SLURM runs a batch script (bash, in the submit directory), with
    # a stand-in scontrol that records its arguments; the signal goes to bash, as with
    # --signal=B:USR1@120 or a preemption.
    script = _readme_sbatch().replace("--nproc 4", "--nproc 2")
    (tracked.tmp_path / "job.sbatch").write_text(script)
    tracked.script("""\
        def backup(signum, frame):
            ready(f"backup{RANK}")
            sys.exit(0)
        signal.signal(signal.SIGTERM, backup)
        print("ready", flush=True)
        time.sleep(600)
    """, name="train.py")
    bin_dir = tracked.tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {tracked.tmp_path}/requeued\n')
    (bin_dir / "scontrol").chmod(0o755)
    path = os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable),
                            os.environ.get("PATH", "")])
    proc = subprocess.Popen(
        ["bash", "job.sbatch"], cwd=tracked.tmp_path, text=True,
        env={**tracked.env, "PATH": path, "SLURM_JOB_ID": "42"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        lines: List[str] = []
        assert proc.stdout is not None and proc.stderr is not None
        while sum(line.endswith("] ready") for line in lines) < 2:
            line = proc.stdout.readline()
            assert line, f"job ended early: {proc.wait()} {proc.stderr.read()}"
            lines.append(line.rstrip("\n"))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert (tracked.tmp_path / "requeued").read_text() == "requeue 42\n"
    assert sorted(p.name for p in tracked.tmp_path.glob("backup*")) == ["backup0", "backup1"]
    assert "exit 143: preempted, not restarted" in err
    assert_gone(*pids_in("\n".join(lines)))


@pytest.mark.multiprocess
def test_sigterm_while_a_failure_is_stopped_does_not_restart(tracked: Tracked) -> None:
    # Rank 0 ignores SIGTERM, so after rank 1 fails the launcher waits out --grace; a
    # SIGTERM to the launcher then means the machine is going away: no restart, 143.
    script = tracked.script("""\
        if RANK == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            ready("ignoring")
            time.sleep(600)
        wait_for("ignoring")
        ready("failing")
        sys.exit(3)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerasmgpu.launch", "--nproc", "2", "--max-restarts", "1",
         "--grace", "20", script],
        env=tracked.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert wait_until(lambda: (tracked.tmp_path / "failing").exists())
        time.sleep(1.0)  # the launcher sees the failure within 0.05 s, then waits the grace
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert "rank 1 exited with code 3" in err and "received SIGTERM, not restarting" in err
    assert "restarting the whole job" not in err
    assert len(pids_in(out)) == 2  # one run only
    assert_gone(*pids_in(out))
