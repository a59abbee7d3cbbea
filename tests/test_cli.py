"""The `kerasmgpu` command: demo, doctor, bench, and benchmarks/gpu_check.py.

Real code paths throughout. The commands that must start a fresh framework (the demo's
own `virtual_devices(2)` request, the doctor without virtual devices) run as
subprocesses, once each; the rest run in this process on the test env's 3 virtual
devices, which the framework already shows. The doctor's findings are a pure function
of a `Facts` record, so every finding is tested with made-up facts, no framework needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

import jobs
import numpy as np
import pytest
from helpers import BACKEND, IN_PROCESS, ON_LEGACY, requires

from kerasmgpu import cli
from kerasmgpu._atomic import write_atomic
from kerasmgpu.cli import _common, bench, doctor
from kerasmgpu.cli.bench import output as bench_output
from kerasmgpu.cli.doctor import BLOCKING, INFO, WARNING, Facts

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT = 300  # a TensorFlow import alone takes 10-25 s on a 2-core CI machine
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

DOCTOR_KEYS = {"kerasmgpu", "environment", "devices", "nvml", "route", "findings", "ok"}
ENVIRONMENT_KEYS = {"keras_line", "keras_version", "backend", "python", "keras", "tensorflow",
                    "tf_keras", "jax", "torch", "platform", "variables", "launched",
                    "process_index", "process_count", "cluster"}
ROUTE_KEYS = {"route", "engine", "replicas", "devices", "all_reduce", "why", "error"}
FINDING_KEYS = {"severity", "code", "message", "advice"}
RESULT_KEYS = {"replicas", "global_batch", "per_replica_batch", "padding_rows", "steps",
               "rounds", "seconds", "samples_per_s", "samples_per_s_min", "samples_per_s_max",
               "samples_per_s_rounds", "speedup", "speedup_min", "speedup_max", "efficiency"}


def fresh_env(**extra: str) -> Dict[str, str]:
    """This process's environment without its virtual device request.

    `import kerasmgpu` in conftest also wrote XLA_FLAGS for JAX; both go, so a child
    starts as a user's first run would.
    """
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERASMGPU_VIRTUAL_DEVICES", "XLA_FLAGS")}
    env.update(extra)
    return env


def run_kerasmgpu(args: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kerasmgpu", *args], capture_output=True, text=True,
        timeout=SUBPROCESS_TIMEOUT, env=dict(env), cwd=str(ROOT),
    )


def codes(found: Sequence[doctor.Finding]) -> Dict[str, str]:
    return {f.code: f.severity for f in found}


def gpu(index: int, name: str = "NVIDIA H100") -> Dict[str, Any]:
    return {"name": f"/gpu:{index}", "kind": "gpu", "index": index, "virtual": False,
            "memory_mb": None, "gpu_name": name}


def cpu(index: int, virtual: bool = True) -> Dict[str, Any]:
    return {"name": f"/cpu:{index}", "kind": "cpu", "index": index, "virtual": virtual,
            "memory_mb": None}


def keras3_tf(**overrides: Any) -> Facts:
    base: Dict[str, Any] = dict(
        keras_line="keras 3", keras_version="3.15.1", backend="tensorflow", keras="3.15.1",
        tensorflow="2.21.0", route="mirrored", devices=(cpu(0), cpu(1), cpu(2)),
        variables={"KERASMGPU_VIRTUAL_DEVICES": "3"},
    )
    base.update(overrides)
    return Facts(**base)


# --- the dispatcher -----------------------------------------------------------------------


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("demo", "doctor", "bench", "migrate", "launch"):
        assert f"  {name}" in out


def test_unknown_command_exits_2_and_lists_the_allowed_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'bogus'" in err and "Allowed: demo, doctor, bench" in err


def test_the_console_entry_point_answers_help() -> None:
    done = subprocess.run([sys.executable, "-m", "kerasmgpu", "--help"], capture_output=True,
                          text=True, timeout=60, cwd=str(ROOT))
    assert done.returncode == 0 and "kerasmgpu doctor" not in done.stderr
    assert "demo" in done.stdout and "bench" in done.stdout


@pytest.mark.parametrize("command,option", [("demo", "--replicas"), ("doctor", "--json"),
                                            ("bench", "--batch-policy")])
def test_subcommand_help(command: str, option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    assert option in capsys.readouterr().out


@pytest.mark.parametrize("argv,flag", [
    (["demo", "--epochs", "0"], "--epochs"),
    (["demo", "--replicas", "two"], "--replicas"),
    (["bench", "--steps", "-3"], "--steps"),
])
def test_bad_numbers_say_received_allowed_fix(argv: List[str], flag: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"Received: {flag}=" in err and "Allowed: an integer >= 1" in err and "Fix:" in err


# --- doctor: findings from made-up facts ---------------------------------------------------


def test_virtual_devices_are_enough_to_train() -> None:
    facts = keras3_tf()
    found = doctor.findings(facts)
    assert codes(found) == {"no_gpu": INFO}
    assert doctor.can_train(facts, found)


def test_tf_keras_without_the_legacy_switch_is_an_info() -> None:
    facts = keras3_tf(tf_keras="2.21.0")
    found = codes(doctor.findings(facts))
    assert found["tf_keras_not_selected"] == INFO
    message = next(f for f in doctor.findings(facts) if f.code == "tf_keras_not_selected")
    assert "TF_USE_LEGACY_KERAS=1" in message.advice
    # With the switch on there is nothing to say.
    legacy = keras3_tf(keras_line="tf_keras", keras_version="2.21.0", tf_keras="2.21.0",
                       variables={"TF_USE_LEGACY_KERAS": "1", "KERASMGPU_VIRTUAL_DEVICES": "3"})
    assert "tf_keras_not_selected" not in codes(doctor.findings(legacy))


def test_keras3_with_tensorflow_215_is_blocking() -> None:
    facts = keras3_tf(tensorflow="2.15.1")
    found = doctor.findings(facts)
    assert codes(found)["keras3_with_old_tensorflow"] == BLOCKING
    assert found[0].code == "keras3_with_old_tensorflow"  # blocking findings come first
    assert "tensorflow>=2.16" in found[0].advice
    assert not doctor.can_train(facts, found)
    # On JAX it only breaks tf.keras: a warning.
    on_jax = keras3_tf(tensorflow="2.15.1", backend="jax", route="keras_distribution")
    assert codes(doctor.findings(on_jax))["keras3_with_old_tensorflow"] == WARNING


def test_tf_keras_must_match_tensorflow_major_minor() -> None:
    facts = keras3_tf(keras_line="tf_keras", keras_version="2.15.0", tf_keras="2.15.0",
                      tensorflow="2.16.1", variables={"TF_USE_LEGACY_KERAS": "1"})
    found = doctor.findings(facts)
    mismatch = next(f for f in found if f.code == "tf_keras_mismatch")
    assert mismatch.severity == BLOCKING and 'tf_keras==2.16.*' in mismatch.advice


def test_tf_keras_version_must_match_tensorflow() -> None:
    facts = keras3_tf(keras_line="tf.keras 2.x", keras_version="2.14.0", keras="2.14.0",
                      tensorflow="2.15.1")
    assert codes(doctor.findings(facts))["keras_tensorflow_mismatch"] == BLOCKING


def test_a_release_below_its_backends_floor_is_blocking() -> None:
    """doctor reads the floor of the active line on its backend from the registry: Keras 3
    on TensorFlow starts later than on JAX, and a release between the two is refused on
    TensorFlow only (doctor kept a floor of its own, the JAX one, and said nothing)."""
    from kerasmgpu import registry
    from kerasmgpu.env.versions import KerasLine

    tf_floor = registry.verified_range(KerasLine.KERAS_3, "tensorflow")[0]
    jax_floor = registry.verified_range(KerasLine.KERAS_3, "jax")[0]
    assert jax_floor < tf_floor
    between = f"{tf_floor.major}.{tf_floor.minor - 1}.0"
    on_tf = doctor.findings(keras3_tf(keras_version=between, keras=between))
    too_old = next(f for f in on_tf if f.code == "keras_too_old")
    assert too_old.severity == BLOCKING and f'"keras>={tf_floor}"' in too_old.advice
    on_jax = keras3_tf(backend="jax", route="keras_distribution", keras_version=between,
                       keras=between, jax="0.4.30", tensorflow=None)
    assert "keras_too_old" not in codes(doctor.findings(on_jax))


def test_torch_outside_launch_is_a_warning_and_inside_it_is_not() -> None:
    outside = keras3_tf(backend="torch", route="torch_ddp", torch="2.13.0", tensorflow=None)
    found = doctor.findings(outside)
    warning = next(f for f in found if f.code == "torch_outside_launch")
    assert warning.severity == WARNING
    assert "kerasmgpu launch --nproc N" in warning.advice
    inside = keras3_tf(backend="torch", route="torch_ddp", torch="2.13.0", tensorflow=None,
                       launched=True, process_count=2, devices=(cpu(0, virtual=False),))
    found_inside = codes(doctor.findings(inside))
    assert "torch_outside_launch" not in found_inside and found_inside["launched"] == INFO
    assert doctor.device_count(inside) == 2


def test_an_untested_torch_is_named_with_the_tested_release() -> None:
    untested = keras3_tf(backend="torch", route="torch_ddp", torch="2.14.1", tensorflow=None)
    (found,) = [f for f in doctor.findings(untested) if f.code == "torch_untested"]
    assert found.severity == WARNING and "2.14.1" in found.message
    assert "pip install torch==2.13.0" in found.advice
    tested = keras3_tf(backend="torch", route="torch_ddp", torch="2.13.0", tensorflow=None)
    assert "torch_untested" not in codes(doctor.findings(tested))


def test_the_nvml_install_hint_only_where_a_gpu_could_be() -> None:
    from kerasmgpu import nvml

    assert doctor.nvml_reason(nvml.NOT_INSTALLED, driver_present=True) == nvml.NOT_INSTALLED
    away = doctor.nvml_reason(nvml.NOT_INSTALLED, driver_present=False)
    assert away is not None and "pip install" not in away and "no NVIDIA driver" in away
    assert doctor.nvml_reason("NVML init failed: x", driver_present=False) == "NVML init failed: x"


def test_a_route_error_is_never_followed_by_ok() -> None:
    # `doctor --virtual 2` on torch outside launch: the route's error, then no "OK".
    facts = keras3_tf(backend="torch", route="torch_ddp", torch="2.13.0", tensorflow=None,
                      description={"error": "ValueError: Invalid `gpus`. Received: gpus=2."})
    report = doctor.build_report(facts)
    text = doctor.render(report)
    assert report["ok"] is False and "OK:" not in text.replace("NOT READY", "")
    assert "NOT READY" in text and "cannot build its route" in text
    assert "kerasmgpu launch --nproc 2 -m kerasmgpu demo" in text
    assert "virtual CPU devices themselves" not in text


def test_no_gpu_and_no_virtual_devices_cannot_train() -> None:
    facts = keras3_tf(devices=(cpu(0, virtual=False),), variables={})
    found = doctor.findings(facts)
    no_gpu = next(f for f in found if f.code == "no_gpu")
    assert no_gpu.severity == WARNING and "KERASMGPU_VIRTUAL_DEVICES=N" in no_gpu.advice
    assert not doctor.can_train(facts, found)


def test_not_ready_without_gpu_says_why_demo_runs_anyway() -> None:
    # `kerasmgpu demo` says OK on this machine right before the doctor says NOT READY:
    # both outputs must say why (demo makes virtual devices itself, doctor does not).
    text = doctor.render(doctor.build_report(keras3_tf(devices=(cpu(0, virtual=False),),
                                                       variables={})))
    assert "NOT READY" in text
    assert "`kerasmgpu demo` and `bench` still run" in text
    assert "`kerasmgpu doctor --virtual 2` checks that setup" in text
    blocked = doctor.render(doctor.build_report(keras3_tf(
        devices=(cpu(0, virtual=False),), internal_errors=("KeyError: 'x'",))))
    assert "NOT READY" in blocked and "still run" not in blocked  # not the reason then


def test_virtual_flag_is_named_as_the_source_of_the_devices() -> None:
    found = doctor.findings(keras3_tf(variables={}, virtual_flag=3))
    no_gpu = next(f for f in found if f.code == "no_gpu")
    assert no_gpu.severity == INFO and "(--virtual 3)" in no_gpu.message
    ignored = doctor.findings(keras3_tf(devices=(gpu(0), gpu(1)), variables={},
                                        virtual_flag=2))
    assert "--virtual 2 asks for virtual devices but GPUs are visible" in next(
        f.message for f in ignored if f.code == "virtual_devices_ignored")


def test_one_gpu_is_a_warning_naming_cuda_visible_devices() -> None:
    facts = keras3_tf(devices=(gpu(0),), variables={"CUDA_VISIBLE_DEVICES": "0"},
                      nvml={"available": True, "devices": [{"name": "H100"}, {"name": "H100"}]})
    found = doctor.findings(facts)
    one = next(f for f in found if f.code == "one_gpu")
    assert one.severity == WARNING
    assert "CUDA_VISIBLE_DEVICES='0'" in one.advice and "NVML sees 2" in one.advice
    assert not doctor.can_train(facts, found)


def test_gpus_seen_by_nvml_but_not_by_the_framework() -> None:
    facts = keras3_tf(backend="jax", route="keras_distribution",
                      nvml={"available": True, "devices": [{"name": "NVIDIA A100"}] * 2})
    found = next(f for f in doctor.findings(facts) if f.code == "gpus_invisible_to_framework")
    assert found.severity == WARNING and "jax[cuda12]" in found.advice


def test_blocking_failures() -> None:
    assert codes(doctor.findings(Facts()))["no_keras"] == BLOCKING
    broken = keras3_tf(devices=None, devices_error="ImportError: libcudart.so.12",
                       devices_error_is_import=True)
    found = codes(doctor.findings(broken))
    assert found["framework_import_failed"] == BLOCKING
    internal = codes(doctor.findings(keras3_tf(internal_errors=("KeyError: 'x'",))))
    assert internal["internal_error"] == BLOCKING
    unbuildable = keras3_tf(description={"error": "RuntimeError: boom"})
    assert codes(doctor.findings(unbuildable))["route_unavailable"] == BLOCKING


def test_keras3_without_tensorflow_is_told_to_set_the_backend(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `.[jax]` with KERAS_BACKEND unset: Keras 3 takes TensorFlow, which is missing.
    jax_only = keras3_tf(tensorflow=None, jax="0.10.2", devices=None, variables={},
                         devices_error="No module named 'tensorflow'",
                         devices_error_is_import=True)
    (found,) = [f for f in doctor.findings(jax_only) if f.code == "framework_import_failed"]
    assert "export KERAS_BACKEND=jax" in found.advice and "pip install" not in found.advice
    # Set to tensorflow on purpose, the fix stays installing TensorFlow.
    chosen = keras3_tf(tensorflow=None, jax="0.10.2", devices=None,
                       variables={"KERAS_BACKEND": "tensorflow"},
                       devices_error="No module named 'tensorflow'", devices_error_is_import=True)
    (found,) = [f for f in doctor.findings(chosen) if f.code == "framework_import_failed"]
    assert "pip install" in found.advice
    # demo and bench start through `_common.start`, whose error takes the same hint.
    installed = {"torch"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in installed else None)
    line = _common.KerasLine.KERAS_3
    hint = _common.backend_hint(line, "tensorflow", {})
    assert hint is not None and hint.endswith("export KERAS_BACKEND=torch")
    installed.add("tensorflow")
    assert _common.backend_hint(line, "tensorflow", {}) is None
    assert _common.backend_hint(line, "tensorflow", {"KERAS_BACKEND": "tensorflow"}) is None
    assert _common.backend_hint(line, "jax", {}) is None


@pytest.mark.parametrize("facts,expected", [
    (keras3_tf(devices=(gpu(0), gpu(1)), platform="linux"), "NCCL"),
    (keras3_tf(devices=(gpu(0), gpu(1)), platform="win32"), "HierarchicalCopy"),
    (keras3_tf(), "CPU"),
    (keras3_tf(backend="jax", route="keras_distribution"), "XLA collectives"),
    (keras3_tf(backend="torch", route="torch_ddp"), "gloo"),
    (keras3_tf(backend="torch", route="torch_ddp", devices=(gpu(0), gpu(1))), "nccl"),
    (keras3_tf(keras_line="keras<=2.3", keras_version="2.3.1", route="multi_gpu_model"),
     "merged on the CPU"),
])
def test_route_names_the_all_reduce_and_why(facts: Facts, expected: str) -> None:
    info = doctor.route_info(facts)
    assert set(info) == ROUTE_KEYS
    assert expected in info["all_reduce"] and info["why"]


def test_report_schema_and_rendering_from_made_up_facts() -> None:
    for facts in (Facts(), keras3_tf(), keras3_tf(devices=(gpu(0),), tf_keras="2.15.0"),
                  keras3_tf(backend="torch", route="torch_ddp", torch="2.13.0")):
        report = doctor.build_report(facts)
        assert set(report) == DOCTOR_KEYS
        assert set(report["environment"]) == ENVIRONMENT_KEYS
        assert set(report["route"]) == ROUTE_KEYS
        for finding in report["findings"]:
            assert set(finding) == FINDING_KEYS and finding["severity"] in doctor.SEVERITIES
        json.loads(json.dumps(report))
        text = doctor.render(report)
        assert ("OK:" in text) == report["ok"] and "Findings" in text


def test_doctor_turns_a_crash_into_a_blocking_finding(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    def explode(*args: Any) -> Facts:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(doctor, "collect", explode)
    assert doctor.main(["--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["findings"][0]["code"] == "internal_error"
    assert "RuntimeError: unexpected" in report["findings"][0]["message"]


# --- quiet by default ------------------------------------------------------------------------

NOISE = [  # as TensorFlow 2.15 and 2.21 print them on this machine
    "2026-12-01 04:37:15.033981: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:"
    "9261] Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN",
    "2026-12-01 04:37:15.250534: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] "
    "TF-TRT Warning: Could not find TensorRT",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796101345.149745   27164 port.cc:153] oneDNN custom operations are on.",
    "E0000 00:00:1796101373.287938   27164 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild "
    "TensorFlow with the appropriate compiler flags.",
    "Using TensorFlow backend.",
]
KEPT = [
    "kerasmgpu demo 0.1.0: one small model trained on 2 replicas",
    "Traceback (most recent call last):",
    "UserWarning: kerasmgpu: one device available",
    "F0000 00:00:1796101373.287938   27164 cuda_platform.cc:52] a fatal error",
    "Error: 2026-12-01 04:37:15.033981: E looks like a log line but is not one",
]


@pytest.mark.parametrize("line", NOISE)
def test_framework_start_up_lines_are_noise(line: str) -> None:
    assert _common.is_framework_noise(line)


@pytest.mark.parametrize("line", KEPT)
def test_everything_else_is_kept(line: str) -> None:
    assert not _common.is_framework_noise(line)


def test_the_filter_drops_noise_written_to_file_descriptor_2(
        capfd: pytest.CaptureFixture[str]) -> None:
    # C++ writes to the descriptor, not to sys.stderr: filter there.
    with _common.framework_output_filtered(verbose=False):
        os.write(2, (NOISE[4] + "\n").encode())
        os.write(2, b"a real error\n")
    with _common.framework_output_filtered(verbose=True):
        os.write(2, (NOISE[3] + "\n").encode())
    err = capfd.readouterr().err
    assert err.splitlines() == ["a real error", NOISE[3]]


def test_route_json_has_one_type_per_field() -> None:
    described = {"route": "keras_distribution", "replicas": "2",
                 "devices": "TpuDevice(id=0, process_index=0), TpuDevice(id=1, process_index=0)"}
    shown = _common.route_json(described)
    assert shown is not None and shown["replicas"] == 2
    assert shown["devices"] == ["TpuDevice(id=0, process_index=0)",
                                "TpuDevice(id=1, process_index=0)"]
    assert _common.route_json(None) is None


# --- doctor on this machine ----------------------------------------------------------------


@requires(in_process=True)
def test_doctor_json_here_sees_the_three_virtual_devices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = doctor.main(["--json"])
    report = json.loads(capsys.readouterr().out)
    assert set(report) == DOCTOR_KEYS and set(report["environment"]) == ENVIRONMENT_KEYS
    assert report["environment"]["backend"] == BACKEND
    assert ("XLA_FLAGS" in report["environment"]["variables"]) is (BACKEND == "jax")
    assert len(report["devices"]) == 3 and all(d["virtual"] for d in report["devices"])
    assert report["route"]["replicas"] == 3 and report["route"]["all_reduce"]
    assert status == 0 and report["ok"] is True
    assert "no_gpu" in {f["code"] for f in report["findings"]}


@requires(in_process=True)
def test_doctor_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    for heading in ("Environment", "Devices", "NVIDIA GPUs (NVML)",
                    "Route parallelize() would take", "Findings", "OK: multi-device"):
        assert heading in out
    assert "KERASMGPU_VIRTUAL_DEVICES = 3" in out


@pytest.mark.slow
def test_doctor_without_gpu_or_virtual_devices_exits_1() -> None:
    from kerasmgpu import nvml

    if nvml.available():
        pytest.skip("this machine has NVIDIA GPUs")
    done = run_kerasmgpu(["doctor", "--json"], fresh_env())
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)
    no_gpu = next(f for f in report["findings"] if f["code"] == "no_gpu")
    assert no_gpu["severity"] == WARNING and "KERASMGPU_VIRTUAL_DEVICES" in no_gpu["advice"]
    # Why `kerasmgpu demo` runs on this machine although the doctor says not ready:
    assert "kerasmgpu demo" in no_gpu["message"]
    assert "kerasmgpu doctor --virtual 2" in no_gpu["advice"]
    assert report["ok"] is False
    assert not [line for line in done.stderr.splitlines()
                if _common.is_framework_noise(line)], done.stderr[:3000]


@pytest.mark.parametrize("backend,listed", [("tensorflow", False), ("torch", False),
                                            ("jax", True)])
def test_doctor_lists_xla_flags_for_the_jax_backend_only(backend: str, listed: bool) -> None:
    # `--virtual 2` (virtual_devices(2)) writes XLA_FLAGS whatever the backend: only
    # JAX's devices read it.
    flags = "--xla_force_host_platform_device_count=2"
    report = doctor.build_report(keras3_tf(backend=backend, variables={
        "XLA_FLAGS": flags, "KERASMGPU_VIRTUAL_DEVICES": "2", "KERAS_BACKEND": backend}))
    variables = report["environment"]["variables"]
    assert ("XLA_FLAGS" in variables) is listed
    assert (f"XLA_FLAGS = {flags}" in doctor.render(report)) is listed
    assert variables["KERASMGPU_VIRTUAL_DEVICES"] == "2" and variables["KERAS_BACKEND"] == backend
    assert ("XLA_FLAGS" in set(doctor.build_report(keras3_tf(backend=backend, variables={}))[
        "environment"]["variables"])) is listed  # listed (as null) where it applies


@pytest.mark.slow
def test_doctor_virtual_sees_what_demo_and_bench_use() -> None:
    from kerasmgpu import nvml

    if nvml.available():
        pytest.skip("this machine has NVIDIA GPUs")
    done = run_kerasmgpu(["doctor", "--virtual", "2", "--json"], fresh_env())
    report = json.loads(done.stdout)
    if not (IN_PROCESS or ON_LEGACY):
        # torch: virtual devices are not its replicas (processes are), so the route
        # cannot be built here and the doctor says so, exit 1 - never OK after an error.
        assert done.returncode == 1, done.stderr[-2000:]
        assert report["ok"] is False and "error" in report["route"], report["route"]
        return
    assert done.returncode == 0, done.stderr[-2000:]
    assert report["ok"] is True and len(report["devices"]) == 2
    no_gpu = next(f for f in report["findings"] if f["code"] == "no_gpu")
    assert no_gpu["severity"] == INFO and "(--virtual 2)" in no_gpu["message"]
    # Environment shows what the user set: not the KERASMGPU_VIRTUAL_DEVICES and XLA_FLAGS
    # that --virtual 2 wrote itself (the no_gpu finding names the flag as their source).
    variables = report["environment"]["variables"]
    assert variables.get("KERASMGPU_VIRTUAL_DEVICES") is None
    if BACKEND == "jax":
        assert variables["XLA_FLAGS"] is None
    else:
        assert "XLA_FLAGS" not in variables


@pytest.mark.slow
@requires(tf_data=True)
def test_verbose_shows_what_the_quiet_default_hides() -> None:
    # TensorFlow prints C++ log lines as it starts on every release here (cuDNN/cuFFT
    # factories on 2.15; oneDNN and cuInit on 2.21), so --verbose must show some.
    env = fresh_env(KERAS_BACKEND="tensorflow")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as in a user's shell
    code = ("import sys, kerasmgpu.cli\n"
            "sys.exit(kerasmgpu.cli.main(['doctor', '--json'] + sys.argv[1:]))\n")
    runs = {flag: subprocess.run([sys.executable, "-c", code, *flag], capture_output=True,
                                 text=True, timeout=SUBPROCESS_TIMEOUT, env=env, cwd=str(ROOT))
            for flag in ((), ("--verbose",))}
    noise = {flag: [line for line in done.stderr.splitlines()
                    if _common.is_framework_noise(line)] for flag, done in runs.items()}
    assert noise[("--verbose",)], runs[("--verbose",)].stderr[:3000]
    assert not noise[()], noise[()]
    for done in runs.values():
        json.loads(done.stdout)  # stdout stays one JSON object either way


# --- demo -----------------------------------------------------------------------------------


@pytest.mark.slow
@requires(in_process=True)
def test_demo_trains_two_replicas_like_one_device() -> None:
    # A fresh process, as a first-time user runs it: the demo asks for 2 virtual
    # devices itself, before the framework starts.
    done = run_kerasmgpu(["demo", "--replicas", "2", "--epochs", "2", "--json"], fresh_env())
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)  # stdout is the JSON object alone
    assert result["replicas"] == 2 and result["virtual"] is True
    assert result["agree"] is True
    assert result["max_weight_difference"] <= result["tolerance"]
    assert result["parallel"]["val_accuracy"] == pytest.approx(
        result["single"]["val_accuracy"], abs=0.01)
    assert result["single"]["val_accuracy"] > 0.5  # 2 epochs already learn the digits
    assert result["route"]["replicas"] == 2 and len(result["route"]["devices"]) == 2
    assert result["batch_split"]["last"].startswith("global batch 37 -> 2 replicas x 19 rows")
    # No GPU and no KERASMGPU_VIRTUAL_DEVICES: the demo made its devices itself, and
    # says how `kerasmgpu doctor` (which alone sees one CPU device) sees them too.
    assert result["virtual_devices_made_by_demo"] is True
    # The readable report went to stderr.
    for text in ("validation accuracy", "max weight difference", "verdict: OK",
                 "sharing this machine's", "batch split", "`kerasmgpu doctor --virtual 2`"):
        assert text in done.stderr
    # The verdict says what this route's step did (TF and JAX: an all-reduce).
    assert "all-reduce" in result["route"]["step"]
    assert result["route"]["step"] in result["verdict"]
    # Virtual devices share the cores: no samples/s to read as a speed-up, in the
    # report or the JSON.
    assert result["throughput_compared"] is False
    assert result["single"]["samples_per_s"] is None
    assert result["parallel"]["samples_per_s"] is None
    assert "samples/s" not in done.stderr.replace("shows no samples/s", "")
    # Quiet by default: no framework start-up lines (TensorFlow's C++ log, cuInit).
    assert not [line for line in done.stderr.splitlines()
                if _common.is_framework_noise(line)], done.stderr[:3000]


@requires(in_process=True)
def test_demo_asks_for_more_devices_than_started_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _common.list_devices()  # the framework runs with 3 devices from here on
    assert cli.main(["demo", "--replicas", "5"]) == 2
    err = capsys.readouterr().err
    assert "Received: --replicas=5" in err and "at most 3" in err and "Fix:" in err


@requires(torch=True)
def test_demo_on_torch_outside_launch_trains_one_device(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["demo", "--epochs", "1", "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["parallel"] is None and result["agree"] is None
    assert "kerasmgpu launch --nproc 2 -m kerasmgpu demo" in captured.err


@pytest.mark.slow
@requires(torch=True)
def test_demo_under_launch_on_torch_says_what_ddp_did(tmp_path: Path) -> None:
    env = fresh_env(KERAS_BACKEND="torch")
    done = jobs.run(jobs.launch_command(["-m", "kerasmgpu", "demo", "--epochs", "1", "--json"],
                                        nproc=2, timeout=240, grace=None),
                    timeout=SUBPROCESS_TIMEOUT, env=env, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    # Rank 0 prints the JSON object; `launch` prefixes its lines with "[rank 0] ".
    text = "\n".join(line.split("] ", 1)[1] if line.startswith("[rank 0]") else ""
                     for line in done.stdout.splitlines())
    result = json.loads(text)
    assert result["agree"] is True and result["replicas"] == 2
    assert result["route"]["route"] == "torch_ddp"
    assert result["verdict"] == ("OK: 2 replicas trained the same model as 1 device. In every "
                                 "step, each process computes the gradients of its share of "
                                 "the batch; they are all-reduced before every update.")
    assert result["throughput_compared"] is False  # 2 processes on the same CPU cores
    report = done.stdout + done.stderr
    assert "in each of 2 processes - processes on the CPU, sharing" in report


def test_demo_verdict_follows_the_route() -> None:
    # A made-up setup per route: the verdict repeats the route's own account of a step,
    # so Keras 2.3's multi_gpu_model (outputs concatenated) is never said to all-reduce.
    from kerasmgpu.cli import demo

    class Quiet:
        def line(self, text: str = "") -> None:
            pass

    concatenated = ("each replica runs the model on its slice of the batch; the outputs are "
                    "concatenated on the CPU")
    for step in (concatenated, "each replica computes the gradients of its share of the "
                 "batch; they are all-reduced before every update"):
        setup = demo._Setup(env=None, keras=None, devices=(), replicas=2, torch_single=False,
                            asked=None, route={"route": "x", "step": step})
        verdict, status, agree = demo._verdict(setup, 1e-7, Quiet())  # type: ignore[arg-type]
        assert status == 0 and agree is True
        assert verdict == f"OK: 2 replicas trained the same model as 1 device. In every step, {step}."
    assert "all-reduced" not in demo._verdict(
        demo._Setup(None, None, (), 2, False, None, route={"step": concatenated}), 0.0,
        Quiet())[0]  # type: ignore[arg-type]


@pytest.mark.skipif(not (IN_PROCESS or ON_LEGACY), reason="torch: a route of processes "
                    "(test_demo_under_launch_on_torch_says_what_ddp_did)")
def test_describe_says_what_a_step_does_on_this_route() -> None:
    import kerasmgpu

    described = kerasmgpu.describe(gpus=2)
    step = described["step"]
    if ON_LEGACY:  # Keras's own multi_gpu_model: one set of weights, nothing to all-reduce
        assert "concatenated on the CPU" in step and "(no all-reduce)" in step
        assert "all-reduced" not in step
        # It slices unpadded: the demo must not print padding rows there.
        assert described["remainder"] == "sliced"
    else:
        assert "all-reduce" in step and "concatenated" not in step
        assert described["remainder"] == "padded"


def test_demo_without_scikit_learn_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sklearn" else real(name, *a))
    assert cli.main(["demo"]) == 2
    assert "pip install scikit-learn" in capsys.readouterr().err


# --- bench ----------------------------------------------------------------------------------


def test_bench_says_what_a_growing_batch_asks_of_the_learning_rate() -> None:
    (note,) = bench.learning_rate_notes(64, "per-replica", [1, 2, 4])
    assert "from 64 to 256 rows" in note and "warmup_target=lr * 4" in note
    assert bench.learning_rate_notes(64, "global", [1, 2, 4]) == []
    assert bench.learning_rate_notes(64, "per-replica", [1]) == []


def test_bench_pure_helpers() -> None:
    assert bench.default_counts(1) == [1]
    assert bench.default_counts(3) == [1, 2, 3]
    assert bench.default_counts(8) == [1, 2, 4, 8]
    assert bench.global_batch(64, "per-replica", 4) == 256
    assert bench.global_batch(64, "global", 4) == 64
    # Speedups pair each round with the same round's replicas=1 figure: the slow
    # second round (a busy machine) cancels out instead of widening the spread.
    rows = bench.scaling({1: [100.0, 50.0, 100.0], 2: [150.0, 75.0, 160.0],
                          4: [200.0, 100.0, 180.0]})
    assert [r["samples_per_s"] for r in rows] == [100.0, 150.0, 180.0]
    assert [(r["samples_per_s_min"], r["samples_per_s_max"]) for r in rows] == [
        (50.0, 100.0), (75.0, 160.0), (100.0, 200.0)]
    assert [r["speedup"] for r in rows] == [1.0, 1.5, 2.0]
    assert [(r["speedup_min"], r["speedup_max"]) for r in rows] == [
        (1.0, 1.0), (1.5, 1.6), (1.8, 2.0)]
    assert [r["efficiency"] for r in rows] == [1.0, 0.75, 0.5]
    assert _common.parse_counts("4, 1,2") == [1, 2, 4]


@pytest.mark.parametrize("step,seconds,fixed,timed", [
    (0.01, 2.0, None, 217),     # 200 steps wanted: 7 epochs of 32 steps, 31 timed in each
    (1.0, 2.0, None, 2),        # slow steps: still 2 timed steps
    (0.01, 2.0, 5, 5),          # --steps 5 wins over --seconds
    (float("nan"), 2.0, None, 31),
])
def test_bench_sizes_each_measurement_by_time(step: float, seconds: float, fixed: Any,
                                              timed: int) -> None:
    chunk, epochs = bench.plan_steps(step, seconds, fixed)
    assert chunk <= bench.CHUNK_STEPS
    assert bench.timed_steps(chunk, epochs) == timed
    if fixed is None and step == 0.01:
        assert timed * step >= seconds  # long enough: the timed steps last >= --seconds


def test_bench_times_steps_inside_epochs_only() -> None:
    # 2 epochs of 3 steps; the 10 s gap between them (iterator set-up, weight sync)
    # is not a training step.
    times = [0.0, 1.0, 2.0, 12.0, 13.0, 14.0]
    assert bench.within_epochs(times, 3) == 4.0
    assert bench.timed_steps(3, 2) == 4


@pytest.mark.parametrize("text", ["0,2", "1,1", "a,b", ""])
def test_bench_rejects_bad_replica_lists_before_training(
    text: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    assert cli.main(["bench", "--replicas", text, "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Received: --replicas=" in err and "Fix:" in err
    assert not list(tmp_path.iterdir())


@requires(in_process=True)
@pytest.mark.parametrize("kind", bench.MODELS)
def test_bench_models_train_on_their_data(kind: str) -> None:
    from helpers import keras_module

    keras = keras_module()
    model = bench.build_model(keras, kind)
    x, y = bench.make_data(kind, 16)
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    assert model.predict(x[:4], verbose=0).shape == (4, 10)


def test_the_plot_on_virtual_devices_says_it_measures_no_speed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert bench.plot_title("t", False) == "t"
    assert "not a speed measurement" in bench.plot_title("t", True)
    row = {"replicas": 1, "samples_per_s": 100.0, "efficiency": 1.0, "speedup": 1.0}
    two = {"replicas": 2, "samples_per_s": 120.0, "efficiency": 0.6, "speedup": 1.2}
    written = []

    def recording(path: str, data: bytes) -> None:  # the image is written whole, or not
        written.append((Path(path).name, data[:8]))
        write_atomic(path, data)

    monkeypatch.setattr(bench_output, "write_atomic", recording)
    path = bench.write_plot([row, two], str(tmp_path / "scaling.png"), "t", shared_cores=True)
    if importlib.util.find_spec("matplotlib") is not None:
        assert path is not None and (tmp_path / "scaling.png").stat().st_size > 0
        assert written == [("scaling.png", PNG_MAGIC)]


@requires(in_process=True)
def test_bench_writes_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The progress line is drawn on a terminal only; pretend to be one.
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    out_dir = tmp_path / "bench-out"
    status = cli.main(["bench", "--replicas", "1,2", "--steps", "5", "--rounds", "2",
                       "--warmup", "2", "--batch-size", "32", "--output", str(out_dir),
                       "--json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err[-2000:]
    printed = json.loads(captured.out)
    saved = json.loads((out_dir / "bench.json").read_text())
    assert printed == saved
    assert set(saved) == {"kerasmgpu", "config", "environment", "route", "results", "plot",
                          "notes"}
    assert saved["config"] == {"replicas": [1, 2], "model": "mlp", "batch_size": 32,
                               "batch_policy": "per-replica", "seconds": 2.0, "rounds": 2,
                               "steps": 5, "warmup": 2, "output": str(out_dir)}
    assert saved["environment"]["device_kind"] == "virtual cpu"
    # One JSON type per field: counts are ints, device lists are lists (as in doctor's).
    route = saved["route"]
    assert isinstance(route["replicas"], int) and route["replicas"] == 2
    assert isinstance(route["devices"], list) and len(route["devices"]) == 2
    assert isinstance(saved["environment"]["devices"], list)
    assert [r["replicas"] for r in saved["results"]] == [1, 2]
    assert [r["global_batch"] for r in saved["results"]] == [32, 64]
    for row in saved["results"]:
        assert set(row) == RESULT_KEYS
        assert isinstance(row["replicas"], int) and row["steps"] == 5 and row["rounds"] == 2
        assert len(row["samples_per_s_rounds"]) == 2 and row["seconds"] > 0
        assert row["samples_per_s_min"] <= row["samples_per_s"] <= row["samples_per_s_max"]
        assert row["speedup_min"] <= row["speedup"] <= row["speedup_max"]
    assert saved["results"][0]["speedup"] == 1.0
    assert any("share this machine's" in note for note in saved["notes"])
    png = out_dir / "scaling.png"
    assert saved["plot"] == str(png)
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000  # two drawn panels, not a stub
    assert "samples/s" in captured.err and "efficiency" in captured.err
    assert "replicas=2 step" in captured.err  # the progress line


@requires(in_process=True)
def test_bench_without_matplotlib_writes_json_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    status = cli.main(["bench", "--replicas", "2", "--steps", "2", "--rounds", "1",
                       "--warmup", "1", "--batch-size", "16", "--batch-policy", "global",
                       "--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["plot"] is None and not (tmp_path / "scaling.png").exists()
    assert [r["global_batch"] for r in saved["results"]] == [16, 16]  # 1 was added
    assert "pip install matplotlib" in out


@requires(in_process=True)
def test_bench_more_replicas_than_devices_exits_2_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    _common.list_devices()  # the framework runs with 3 devices from here on
    assert cli.main(["bench", "--replicas", "1,4", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Received: --replicas=1,4" in err
    assert "Allowed: counts up to 3" in err and "Fix: pass --replicas 1" in err
    assert not list(tmp_path.iterdir())


# --- benchmarks/gpu_check.py -----------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_check() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_help(gpu_check: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.parse_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--output", "--timeout", "--gpus", "--steps", "--allow-no-gpu"):
        assert option in out


def test_gpu_check_arguments(gpu_check: Any, capsys: pytest.CaptureFixture[str]) -> None:
    args = gpu_check.parse_args([])
    assert args.output == "gpu-check.json" and args.steps == list(gpu_check.STEPS)
    assert gpu_check.parse_args(["--steps", "bench, doctor"]).steps == ["bench", "doctor"]
    for bad in (["--steps", "bench,lunch"], ["--timeout", "0"], ["--gpus", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            gpu_check.parse_args(bad)
        assert exit_info.value.code == 2
        assert "Received:" in capsys.readouterr().err


def test_gpu_check_builds_the_commands(gpu_check: Any) -> None:
    commands = gpu_check.build_commands("/py", 4, "out-dir", "/x/gpu_check.py", 3, 50)
    assert commands["doctor"] == ["/py", "-m", "kerasmgpu", "doctor", "--json"]
    assert commands["demo"] == ["/py", "-m", "kerasmgpu", "demo", "--json"]
    assert commands["bench"] == ["/py", "-m", "kerasmgpu", "bench", "--replicas", "1,2,3,4",
                                 "--output", "out-dir", "--json"]
    assert commands["monitor"] == ["/py", "/x/gpu_check.py", "--monitor-run",
                                   "--monitor-epochs", "3", "--monitor-steps", "50"]
    assert gpu_check.replica_counts(1) == [1]


def test_gpu_check_reads_json_output(gpu_check: Any) -> None:
    assert gpu_check.parse_json_output('{"a": 1}\n') == {"a": 1}
    assert gpu_check.parse_json_output('Using TensorFlow backend.\n{\n  "a": [1, 2]\n}\n') == {
        "a": [1, 2]}
    assert gpu_check.parse_json_output("Traceback ...\nValueError: x") is None
    assert gpu_check.parse_json_output("") is None


def test_gpu_check_runs_every_step_into_one_file(
    gpu_check: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(gpu_check, "detect_gpus", lambda: {
        "count": 2, "names": ["NVIDIA H100", "NVIDIA H100"], "source": "nvml",
        "nvml": {"available": True}})
    seen: List[List[str]] = []
    canned = {
        "doctor": {"route": {"route": "mirrored", "all_reduce": "NCCL"}, "devices": [1, 2]},
        "demo": {"max_weight_difference": 1e-7, "single": {"samples_per_s": 10.0,
                 "val_accuracy": 0.9}, "parallel": {"samples_per_s": 19.0, "val_accuracy": 0.9}},
        "bench": {"results": [{"replicas": 1, "samples_per_s": 10.0, "efficiency": 1.0},
                              {"replicas": 2, "samples_per_s": 19.0, "efficiency": 0.95}]},
        "monitor": {"summary": [{"epoch": 0, "gpu0_util": 91.0, "gpu1_util": 89.0,
                                 "gpu_util_mean": 90.0}]},
        "allreduce": {"results": [{"bytes": 16 << 20, "busbw_gbs": 80.0}]},
        "suite": None,
        "counts": None,
    }
    for model in gpu_check.MODEL_STEPS:
        canned[model] = canned["bench"]

    def runner(name: str, command: Sequence[str], timeout: float,
               env: Mapping[str, str]) -> Dict[str, Any]:
        seen.append(list(command))
        return {"command": list(command), "returncode": 0, "timed_out": False,
                "seconds": 1.0, "json": canned[name], "stdout_tail": "", "stderr_tail": ""}

    output = tmp_path / "check.json"
    assert gpu_check.main(["--output", str(output), "--bench-dir", "b"], runner=runner) == 0
    report = json.loads(output.read_text())
    assert list(report["steps"]) == list(gpu_check.STEPS)
    assert report["ok"] is True and report["gpus"] == 2
    assert seen[2][-4:] == ["1,2", "--output", "b", "--json"]
    out = capsys.readouterr().out
    assert "2: 19/s (95%)" in out and "gpu0 91%" in out and "max weight difference" in out
    assert "16 MiB: 80.0 GB/s" in out
    assert ["--model", "transformer", "--replicas", "1,2"] == seen[6][4:8]


def test_gpu_check_summary_of_a_demo_on_virtual_devices(gpu_check: Any) -> None:
    # --allow-no-gpu: the demo's samples/s are null there (not a GPU's speed).
    step = {"returncode": 0, "timed_out": False, "seconds": 1.0, "json": {
        "max_weight_difference": 1e-7, "single": {"samples_per_s": None, "val_accuracy": 0.9},
        "parallel": {"samples_per_s": None, "val_accuracy": 0.9}}}
    lines = gpu_check.summarize({"gpus": 0, "gpu_names": [], "steps": {"demo": step},
                                 "output": "x.json"})
    assert "samples/s not compared (virtual devices), val accuracy 0.9000 vs 0.9000" in lines[1]


def test_gpu_check_without_gpu_stops_unless_allowed(
    gpu_check: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(gpu_check, "detect_gpus", lambda: {
        "count": 0, "names": [], "source": None, "nvml": {"reason": "no NVIDIA driver"}})
    output = tmp_path / "check.json"
    assert gpu_check.main(["--output", str(output)]) == 2
    assert "--allow-no-gpu" in capsys.readouterr().err and not output.exists()
    envs: List[Mapping[str, str]] = []

    def failing(name: str, command: Sequence[str], timeout: float,
                env: Mapping[str, str]) -> Dict[str, Any]:
        envs.append(env)
        return {"command": list(command), "returncode": None, "timed_out": True,
                "seconds": timeout, "json": None, "stdout_tail": "", "stderr_tail": "hung"}

    argv = ["--output", str(output), "--allow-no-gpu", "--steps", "doctor", "--timeout", "5"]
    assert gpu_check.main(argv, runner=failing) == 1
    assert envs[0]["KERASMGPU_VIRTUAL_DEVICES"]
    report = json.loads(output.read_text())
    assert report["ok"] is False and report["steps"]["doctor"]["timed_out"] is True
    assert "timed out" in capsys.readouterr().out
