"""Which launcher started this process, and what every process agrees on - without
starting a job.

Each environment of `kerasmgpu.env.cluster` is read from the variables its launcher
sets (copied from real runs: torchrun 2.13, Open MPI 4.1, SLURM 22.05, a TFJob's
TF_CONFIG); the multi-process runs themselves are in test_distributed.py and
test_launchers.py. Also here: how a process of a job ends (stdlib subprocesses, no
framework), the shuffle seed every process shares, and the refusal of an unseeded
tf.data shuffle in a job of several processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict

import numpy as np
import pytest
from helpers import ON_LEGACY, keras_module, requires

import kerasmgpu
from kerasmgpu import batching
from kerasmgpu.env import cluster
from kerasmgpu.env.cluster import (
    KerasmgpuLaunch,
    OpenMPI,
    SingleProcess,
    Slurm,
    TFConfigCluster,
    TorchElastic,
)

TORCHRUN = {  # torchrun --standalone --nproc_per_node 2, rank 1
    "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "vm", "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_USE_AGENT_STORE": "True",
}
OMPI = {  # mpirun -np 2, rank 1
    "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_MCA_ess_base_jobid": "1966735361",
    "OMPI_MCA_orte_hnp_uri": "1966735360.0;tcp://192.0.2.2:42113",
}
SRUN = {  # srun -n 2 on one node, task 1
    "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "vm", "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_JOB_NODELIST": "vm", "SLURM_GTIDS": "0,1",
}
SBATCH = {  # the batch script itself, before any srun (copied from a real job)
    "SLURM_JOB_ID": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
    "SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_JOB_NODELIST": "vm", "SLURM_NNODES": "1",
    "SLURM_TASKS_PER_NODE": "2",
}
TFJOB = {  # a TFJob with a chief and two workers, the second worker
    "TF_CONFIG": json.dumps({
        "cluster": {"chief": ["job-chief-0.ns.svc:2222"],
                    "worker": ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"]},
        "task": {"type": "worker", "index": 1},
    }),
}


def launch_env(rank: int = 1, world: int = 2, local: int = 2) -> Dict[str, str]:
    from kerasmgpu.launch import worker_environments

    envs, _ = worker_environments(local, "127.0.0.1:29500", nnodes=world // local,
                                  node_rank=rank // local, base_env={})
    return envs[rank % local]


# --- each environment -------------------------------------------------------------------


def test_kerasmgpu_launch_reads_its_own_contract() -> None:
    job = cluster.detect(launch_env())
    assert type(job) is KerasmgpuLaunch
    assert (job.global_rank(), job.world_size(), job.local_rank(), job.local_world_size()) == (
        1, 2, 1, 2)
    assert job.jax_coordinator() == "127.0.0.1:29500"
    assert job.torch_store() == ("127.0.0.1", 29501)
    assert job.tf_workers() == ["127.0.0.1:29502", "127.0.0.1:29503"]
    assert job.bind_host() == "127.0.0.1" and not job.multi_node()
    # Two nodes of two: the listeners must be reachable from the other machine.
    second = cluster.detect(launch_env(rank=3, world=4, local=2))
    assert second.multi_node() and second.bind_host() == "0.0.0.0"
    assert (second.global_rank(), second.local_rank()) == (3, 1)


def test_torchrun_on_one_machine_uses_loopback_and_torchruns_store() -> None:
    job = cluster.detect(TORCHRUN)
    assert type(job) is TorchElastic and job.describe().startswith("torchrun: process 1 of 2")
    assert (job.global_rank(), job.world_size(), job.local_rank()) == (1, 2, 1)
    assert job.torch_store() is None  # torchrun's agent serves MASTER_PORT already
    assert job.jax_coordinator() == "127.0.0.1:29401"  # MASTER_PORT + 1, loopback
    assert job.tf_workers() == ["127.0.0.1:29402", "127.0.0.1:29403"]
    assert job.bind_host() == "127.0.0.1"
    # Its restarts keep the agent's store: each run joins it under its own prefix.
    assert job.torch_agent_store() is None  # no restart count: not torchrun's worker
    restarted = cluster.detect({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "1"})
    assert restarted.torch_agent_store() == ("vm", 29400, 1)
    own_store = {**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "1",
                 "TORCHELASTIC_USE_AGENT_STORE": "False"}
    assert cluster.detect(own_store).torch_agent_store() is None


def test_torchrun_on_two_machines_and_a_pytorchjob_pod() -> None:
    two = cluster.detect({**TORCHRUN, "RANK": "3", "WORLD_SIZE": "4", "GROUP_RANK": "1",
                          "MASTER_ADDR": "10.0.0.1"})
    assert two.multi_node() and two.bind_host() == "0.0.0.0"
    assert two.jax_coordinator() == "10.0.0.1:29401"
    assert two.tf_workers() is None  # the other machine's address is not known here
    pod = cluster.detect({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
                          "RANK": "2", "WORLD_SIZE": "3"})
    assert pod.describe().startswith("torch.distributed env: process 2 of 3")
    assert pod.multi_node() and pod.jax_coordinator() == "job-master-0:23457"


def test_open_mpi_on_one_machine_and_across_machines() -> None:
    job = cluster.detect(OMPI)
    assert type(job) is OpenMPI
    assert (job.global_rank(), job.world_size(), job.local_rank(), job.local_world_size()) == (
        1, 2, 1, 2)
    port = job.main_port
    assert 15000 <= port < 30000
    assert port == cluster.detect({**OMPI, "OMPI_COMM_WORLD_RANK": "0"}).main_port
    assert job.jax_coordinator() == f"127.0.0.1:{port + 1}"
    assert cluster.detect({**OMPI, "MASTER_PORT": "40000"}).main_port == 40000
    spread = {**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    with pytest.raises(ValueError, match="MASTER_ADDR.*Fix: .*mpirun -x MASTER_ADDR"):
        _ = cluster.detect(spread).main_address
    assert cluster.detect({**spread, "MASTER_ADDR": "node0"}).jax_coordinator() == (
        f"node0:{port + 1}")


def test_slurm_srun_step_but_not_the_batch_script() -> None:
    job = cluster.detect(SRUN)
    assert type(job) is Slurm
    assert (job.global_rank(), job.world_size(), job.local_rank(), job.local_world_size()) == (
        1, 2, 1, 2)
    assert job.main_address == "127.0.0.1" and job.bind_host() == "127.0.0.1"
    assert 15000 <= job.main_port < 30000
    assert cluster.detect({**SRUN, "MASTER_PORT": "12345"}).main_port == 12345
    # The batch script is one process even though SLURM_NTASKS says 2.
    assert type(cluster.detect(SBATCH)) is SingleProcess


def test_slurm_across_nodes_names_the_first_node() -> None:
    env = {**SRUN, "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_STEP_NUM_TASKS": "6", "SLURM_STEP_NUM_NODES": "3", "SLURM_GTIDS": "4,5",
           "SLURM_STEP_NODELIST": "gpu[007-009]", "SLURM_STEP_TASKS_PER_NODE": "2(x3)"}
    job = cluster.detect(env)
    assert job.multi_node() and job.bind_host() == "0.0.0.0"
    assert job.main_address == "gpu007" and job.local_world_size() == 2
    without_gtids = {k: v for k, v in env.items() if k != "SLURM_GTIDS"}
    assert cluster.detect(without_gtids).local_world_size() == 2
    assert job.jax_coordinator() == f"gpu007:{job.main_port + 1}"
    assert cluster.first_host("node[003-005,9],gpu1") == "node003"
    assert cluster.first_host("a,b") == "a" and cluster.first_host("x[1,3]") == "x1"
    assert cluster.tasks_per_node("2(x3),1") == [2, 2, 2, 1]


@requires(tf_data=True)
def test_slurm_across_nodes_gives_tensorflow_its_own_resolver(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import tensorflow as tf

    from kerasmgpu.engines import mirrored

    env = {**SRUN, "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
           "SLURM_STEP_NODELIST": "gpu[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    job = cluster.detect(env)
    resolver = mirrored._tf_resolver(tf, job)
    assert type(resolver).__name__ == "SlurmClusterResolver"
    base = job.main_port + 2
    assert resolver.cluster_spec().as_dict() == {
        "worker": [f"gpu1:{base}", f"gpu1:{base + 1}", f"gpu2:{base}", f"gpu2:{base + 1}"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    # On one machine: loopback addresses, in rank order.
    local = mirrored._tf_resolver(tf, cluster.detect(SRUN))
    assert local.cluster_spec().as_dict()["worker"] == [
        f"127.0.0.1:{cluster.detect(SRUN).main_port + 2 + r}" for r in range(2)]


@requires(tf_data=True)
def test_a_cluster_tensorflow_cannot_run_on_is_told_by_its_type(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """mpirun across machines gives no worker addresses: TensorFlow cannot start, and
    parallelize() says so (not "import order"); any other start-up error is an import
    order one, whatever its text."""
    import tensorflow as tf

    from kerasmgpu._errors import InvalidClusterError
    from kerasmgpu.engines.mirrored import MirroredEngine, _tf_resolver

    spread = cluster.detect({**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                             "MASTER_ADDR": "10.0.0.1"})
    with pytest.raises(InvalidClusterError, match="Invalid cluster for TensorFlow") as caught:
        _tf_resolver(tf, spread)
    monkeypatch.setattr(MirroredEngine, "_worker_strategy", None)
    monkeypatch.setattr(MirroredEngine, "_worker_error", caught.value)
    with pytest.raises(InvalidClusterError) as again:
        MirroredEngine.worker_strategy()
    assert again.value is caught.value
    monkeypatch.setattr(MirroredEngine, "_worker_error",
                        RuntimeError("Invalid cluster spec (grpc)"))
    with pytest.raises(RuntimeError, match="Invalid import order") as other:
        MirroredEngine.worker_strategy()
    assert not isinstance(other.value, InvalidClusterError)


def test_addresses_split_and_join_alike() -> None:
    assert cluster.split_address("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert cluster.split_address(" node-0.cluster:1234 ") == ("node-0.cluster", 1234)
    assert cluster.split_address("[::1]:29500") == ("::1", 29500)
    assert cluster.join_address("::1", 29500) == "[::1]:29500"
    assert cluster.join_address("node-0", 1) == "node-0:1"
    for bad in ("10.0.0.1", "::1:29500", "host:port", "a b:1", ""):
        assert cluster.split_address(bad) is None, bad
    with pytest.raises(ValueError, match="KERASMGPU_COORDINATOR"):
        _ = cluster.detect({"KERASMGPU_PROCESS_INDEX": "0", "KERASMGPU_PROCESS_COUNT": "2",
                            "KERASMGPU_COORDINATOR": "nohost"}).main_address


def test_tf_config_of_a_cluster_numbers_chief_then_workers() -> None:
    job = cluster.detect(TFJOB)
    assert type(job) is TFConfigCluster
    assert (job.global_rank(), job.world_size()) == (2, 3)
    assert job.multi_node() and job.bind_host() == "0.0.0.0"
    assert job.main_address == "job-chief-0.ns.svc" and job.main_port == 2222
    assert job.tf_workers() == ["job-chief-0.ns.svc:2222", "job-worker-0.ns.svc:2222",
                                "job-worker-1.ns.svc:2222"]
    by_hand = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:4000", "localhost:4001"]},
                                        "task": {"type": "worker", "index": 0}})}
    local = cluster.detect(by_hand)
    assert local.global_rank() == 0 and not local.multi_node()
    assert local.jax_coordinator() == "127.0.0.1:4000"
    # An evaluator or a parameter server is not one of the training processes.
    evaluator = json.loads(TFJOB["TF_CONFIG"])
    evaluator["task"] = {"type": "evaluator", "index": 0}
    assert type(cluster.detect({"TF_CONFIG": json.dumps(evaluator)})) is SingleProcess


def test_innermost_launcher_wins() -> None:
    # kerasmgpu launch inside an srun step, torchrun inside mpirun, mpirun's daemons
    # started by srun: the launcher that started this very process is the one named.
    assert type(cluster.detect({**SRUN, **launch_env()})) is KerasmgpuLaunch
    assert type(cluster.detect({**OMPI, **TORCHRUN})) is TorchElastic
    assert type(cluster.detect({**SRUN, **OMPI})) is OpenMPI
    assert type(cluster.detect({**TFJOB, **SRUN})) is Slurm
    assert type(cluster.detect({})) is SingleProcess


def test_contradictory_variables_are_a_fixable_error() -> None:
    for env in ({**TORCHRUN, "RANK": "2"}, {**OMPI, "OMPI_COMM_WORLD_SIZE": "x"},
                {**SRUN, "SLURM_PROCID": ""}):
        with pytest.raises(ValueError, match="Invalid `.*Received.*Allowed.*Fix"):
            cluster.detect(env)
    with pytest.raises(ValueError, match="TF_CONFIG.*Allowed: JSON"):
        cluster.detect({"TF_CONFIG": "{not json"})


def test_import_checks_a_variable_of_every_launcher() -> None:
    """`import kerasmgpu` starts the engines only when one of these is set; each
    environment must need one of them, or its jobs would start without engines."""
    names = kerasmgpu._LAUNCHER_VARIABLES
    for env in (launch_env(), TORCHRUN, OMPI, SRUN, TFJOB):
        assert type(cluster.detect(env)) is not SingleProcess
        stripped = {k: v for k, v in env.items() if k not in names}
        assert type(cluster.detect(stripped)) is SingleProcess, sorted(env)


def test_public_helpers_name_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in OMPI.items():
        monkeypatch.setenv(name, value)
    for name in [k for k in os.environ if k.startswith("KERASMGPU_PROCESS")]:
        monkeypatch.delenv(name)
    cluster.reset()  # a process's job is detected once: as if it started now
    assert (kerasmgpu.process_index(), kerasmgpu.process_count(), kerasmgpu.is_chief()) == (
        1, 2, False)
    assert cluster.job().name == "Open MPI"
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert not kerasmgpu.is_chief()  # kept for the life of the process
    cluster.reset()
    assert kerasmgpu.is_chief()


def test_collective_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cluster.TIMEOUT_ENV, raising=False)
    cluster.reset()
    assert cluster.job().collective_timeout() == cluster.DEFAULT_TIMEOUT
    monkeypatch.setenv(cluster.TIMEOUT_ENV, "12.5")
    cluster.reset()
    assert cluster.job().collective_timeout() == 12.5
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv(cluster.TIMEOUT_ENV, bad)
        cluster.reset()
        with pytest.raises(ValueError, match="KERASMGPU_COLLECTIVE_TIMEOUT.*Fix"):
            cluster.job().collective_timeout()


@pytest.mark.skipif(ON_LEGACY, reason="Keras 2.3 trains in one process only")
def test_doctor_names_the_launcher(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from kerasmgpu.cli import doctor

    for name, value in {**OMPI, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    cluster.reset()  # as in a process started with them
    doctor.main(["--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["environment"]["cluster"] == "Open MPI: process 0 of 1"
    doctor.main([])
    assert "launcher     : Open MPI: process 0 of 1" in capsys.readouterr().out
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "x")
    cluster.reset()
    doctor.main(["--json"])
    found = {f["code"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert "OMPI_COMM_WORLD_SIZE" in found["launcher_variables"]["message"]


# --- how a process of a job ends ----------------------------------------------------------

# A stand-in for JAX's exit handler, which waits for every process to shut down
# together: registered before ours (JAX registers at import), it must not run when the
# process fails, and must run when it ends normally.
ENDING = """\
import atexit, os, sys, time
sys.path.insert(0, {root!r})
def framework_shutdown():
    open(os.path.join({out!r}, "shutdown"), "w").close()
    time.sleep(float(os.environ.get("HANG", "0")))
atexit.register(framework_shutdown)
from kerasmgpu.env import cluster
from kerasmgpu.process import ending
ending.watch(cluster.job())
ending.framework_started(teardown=lambda: open(os.path.join({out!r}, "teardown"), "w").close())
atexit.register(lambda: open(os.path.join({out!r}, "later-handler"), "w").close())
"""


def _end(tmp_path: Path, body: str, hang: float = 0.0) -> subprocess.CompletedProcess:
    script = tmp_path / "ending.py"
    root = str(Path(__file__).parent.parent)
    script.write_text(ENDING.format(root=root, out=str(tmp_path)) + textwrap.dedent(body))
    env = {**os.environ, "HANG": str(hang), "KERASMGPU_PROCESS_INDEX": "1",
           "KERASMGPU_PROCESS_COUNT": "2"}
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("body, status", [
    ("raise RuntimeError('boom')\n", 1),
    ("def f():\n    sys.exit(3)\nf()\n", 3),
    ("sys.exit('a message')\n", 1),
])
def test_a_failing_process_leaves_without_the_frameworks_shutdown(
        tmp_path: Path, body: str, status: int) -> None:
    start = time.monotonic()
    run = _end(tmp_path, body, hang=600)
    assert run.returncode == status, run.stderr
    assert time.monotonic() - start < 60  # the 600 s shutdown did not run
    assert not (tmp_path / "shutdown").exists()
    assert (tmp_path / "later-handler").exists()  # handlers registered after ours ran
    assert not (tmp_path / "teardown").exists()  # nor the engines' teardowns
    assert f"process 1 failed (exit status {status})" in run.stderr
    if "boom" in body:
        assert "RuntimeError: boom" in run.stderr  # the traceback comes first
    if "message" in body:
        assert "a message" in run.stderr


@pytest.mark.parametrize("body", [
    "print('done')\n",
    "sys.exit(0)\n",
    # A SystemExit the script catches does not end the process.
    "try:\n    sys.exit(2)\nexcept SystemExit:\n    pass\nprint('done')\n",
])
def test_a_process_that_ends_normally_shuts_the_framework_down(tmp_path: Path,
                                                               body: str) -> None:
    run = _end(tmp_path, body)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "teardown").exists() and (tmp_path / "shutdown").exists()
    assert "failed" not in run.stderr


# --- the shuffle seed ----------------------------------------------------------------------


@requires(in_process=True)
def test_set_random_seed_makes_shuffled_fit_reproducible() -> None:
    from helpers import classification_data, mlp

    keras = keras_module()
    x, y = classification_data(rows=96)

    def train(seed: int) -> list:
        model = mlp(keras)
        pmodel = kerasmgpu.parallelize(model, gpus=2)
        keras.utils.set_random_seed(seed)
        pmodel.fit(x, y, batch_size=16, epochs=1, shuffle=True, verbose=0)
        return model.get_weights()

    first, again, other = train(3), train(3), train(4)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert any(not np.allclose(a, b) for a, b in zip(first, other))


def test_a_pydataset_is_read_in_the_same_order_by_every_process() -> None:
    from kerasmgpu.data.python import SeededOrder

    class Source:
        epochs = 0

        def __len__(self) -> int:
            return 10

        def __getitem__(self, index: int) -> int:
            return index

        def on_epoch_end(self) -> None:
            self.epochs += 1

    one, two = Source(), Source()
    a, b = SeededOrder(one, 11), SeededOrder(two, 11)
    for _ in range(3):
        order = [a[i] for i in range(len(a))]
        assert order == [b[i] for i in range(len(b))] and sorted(order) == list(range(10))
        a.on_epoch_end()
        b.on_epoch_end()
    assert one.epochs == 3
    assert order != [SeededOrder(Source(), 12)[i] for i in range(10)]


@requires(tf_data=True)
@pytest.mark.tf_data  # the JAX and torch routes' feeds too (keras3.15-{jax,torch}-tfdata)
@pytest.mark.skipif(ON_LEGACY, reason="Keras 2.3 trains in one process only")
def test_unseeded_tf_data_shuffle_is_refused_in_a_job_of_several() -> None:
    import tensorflow as tf

    from kerasmgpu import adapters, engines, registry
    from kerasmgpu.adapters import tf_data
    from kerasmgpu.data import feeds
    active = registry.active()
    adapter = adapters.load(active)
    tf.random.set_seed(None)  # an earlier test's global seed would seed every shuffle
    x = np.arange(20, dtype="float32").reshape(10, 2)
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1]))
    unseeded = data.shuffle(10).batch(4)
    assert tf_data.unseeded_shuffles(unseeded) == 1
    assert tf_data.unseeded_shuffles(data.shuffle(10, seed=1).batch(4)) == 0
    assert tf_data.unseeded_shuffles(data.batch(4)) == 0
    nested = tf.data.Dataset.range(2).interleave(lambda _: unseeded)
    assert tf_data.unseeded_shuffles(nested) == 1
    kind = engines.load(active.entry_or_raise()).feed_kind
    two = batching.Planner(replicas=2, process_index=0, process_count=2)
    with pytest.raises(ValueError, match=r"1 unseeded shuffle.*2 processes.*seed=S"):
        feeds.build(adapter, kind, two, unseeded)
    feeds.build(adapter, kind, two, data.shuffle(10, seed=1).batch(4))
    # One process: nothing to agree on.
    feeds.build(adapter, kind, batching.Planner(replicas=2), unseeded)
    # A global seed seeds every shuffle built after it.
    tf.random.set_seed(5)
    try:
        feeds.build(adapter, kind, two, data.shuffle(10).batch(4))
    finally:
        tf.random.set_seed(None)


@requires(jax=True)
def test_jax_coordinator_arguments_bind_loopback() -> None:
    import jax

    from kerasmgpu.engines import keras_distribution

    arguments = keras_distribution._jax_arguments(jax, cluster.detect(OMPI))
    port = cluster.detect(OMPI).main_port + 1
    assert arguments["coordinator_address"] == f"127.0.0.1:{port}"
    assert arguments["coordinator_bind_address"] == f"127.0.0.1:{port}"
    assert (arguments["num_processes"], arguments["process_id"]) == (2, 1)
    assert arguments["local_device_ids"] == [1]  # two per machine: one device each
    assert arguments["cluster_detection_method"] == "deactivate"
    assert arguments["heartbeat_timeout_seconds"] <= arguments["shutdown_timeout_seconds"]
    spread = keras_distribution._jax_arguments(jax, cluster.detect(launch_env(rank=3, world=4)))
    assert spread["coordinator_bind_address"] == "[::]:29500"
    assert spread["local_device_ids"] is None  # kerasmgpu launch hands out GPUs itself


def test_the_environment_object_answers_not_the_process_variables(monkeypatch) -> None:
    """What an engine is given is what it reads: the seed, timeout, chief and torch
    backend come from the detected environment's own variables."""
    monkeypatch.delenv(cluster.TIMEOUT_ENV, raising=False)
    job = cluster.detect({**OMPI, cluster.TIMEOUT_ENV: "7",
                          cluster.TORCH_BACKEND_ENV: "gloo"})
    assert job.multi_process() and not job.is_chief()
    assert job.collective_timeout() == 7.0 and cluster.detect({}).collective_timeout() == 300.0
    assert job.torch_backend() == "gloo"
    assert cluster.detect({}).torch_backend() is None
    other = cluster.detect({**OMPI, "OMPI_MCA_ess_base_jobid": "1"})
    assert job.shared_seed() == cluster.detect(OMPI).shared_seed() != other.shared_seed()
    with pytest.raises(ValueError, match=cluster.TIMEOUT_ENV):
        cluster.detect({**OMPI, cluster.TIMEOUT_ENV: "0"}).collective_timeout()


@requires(jax=True)
def test_jax_start_up_takes_the_timeout_of_its_environment(monkeypatch) -> None:
    import jax

    from kerasmgpu.engines import keras_distribution

    monkeypatch.delenv(cluster.TIMEOUT_ENV, raising=False)
    arguments = keras_distribution._jax_arguments(jax, cluster.detect({**OMPI, cluster.TIMEOUT_ENV: "7"}))
    assert arguments["initialization_timeout"] == 7


def test_engines_training_and_data_read_no_process_variables() -> None:
    """The cluster reaches engines, training and feeds as the object `api` detected:
    none of them reads an environment variable or asks `env.cluster` itself."""
    import ast

    asks = {"current", "detect", "launched", "is_chief", "process_index", "process_count",
            "local_process_index", "shared_seed", "collective_timeout"}
    package = Path(kerasmgpu.__file__).parent
    found = []
    for folder in ("engines", "training", "data"):
        for path in sorted((package / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Subscript)) else ""
                read = text.startswith(("os.environ.get(", "os.getenv(", "os.environ["))
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    read |= ast.unparse(node.func.value) == "cluster" and node.func.attr in asks
                if read:
                    found.append(f"{folder}/{path.name}:{node.lineno}: {text}")
    assert not found
