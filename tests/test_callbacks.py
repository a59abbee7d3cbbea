"""DeviceMonitor and the NVML reader, on the real code path around injected readings.

This machine has no GPU, so readings come from scripted readers (for the monitor) and
from a fake ``pynvml`` module put in ``sys.modules`` (for ``kerasmgpu.nvml``); the
thread, the epoch figures, the warnings and the Keras hooks are the shipped code.
"""

from __future__ import annotations

import copy
import gc
import importlib
import os
import sys
import threading
import time
import types
import warnings
from typing import Any, Callable, Iterator, List, Optional, Sequence

import jobs
import numpy as np
import pytest
from helpers import wait_until

from kerasmgpu import nvml
from kerasmgpu.callbacks import (
    MAX_FAILURES,
    KerasMGPUWarning,
    MonitorCore,
    device_monitor_class,
)
from kerasmgpu.nvml import GpuReading, NvmlUnavailable

THREAD_NAME = "kerasmgpu-DeviceMonitor"
# Long enough that the background thread never samples during a scripted test: the
# test itself decides how many samples each epoch gets.
QUIET = 60.0


def gpus(*utils: float, mem: float = 1000.0) -> List[GpuReading]:
    return [
        GpuReading(
            index=i,
            name="Fake GPU",
            utilization_percent=u,
            memory_used_mb=mem + i,
            memory_total_mb=16000.0,
        )
        for i, u in enumerate(utils)
    ]


class Scripted:
    """A reader that returns ``readings`` every call (or raises), counting calls."""

    def __init__(self, readings: Any = None, fail: Optional[BaseException] = None) -> None:
        self.readings = readings if readings is not None else gpus(90, 90)
        self.fail = fail
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self) -> Sequence[GpuReading]:
        with self.lock:
            self.calls += 1
        if self.fail is not None:
            raise self.fail
        return self.readings() if callable(self.readings) else self.readings


def run_epochs(core: MonitorCore, reader: Scripted, epochs: Sequence[Sequence[Any]]) -> list:
    """Drive one training run; each epoch is a list of readings, one sample each."""
    logs = []
    core.train_begin()
    for epoch, samples in enumerate(epochs):
        core.epoch_begin(epoch)
        for readings in samples:
            reader.readings = readings
            assert core.sample()
        logs.append(core.epoch_end(epoch))
    core.train_end()
    return logs


def monitor_warnings(record: List[warnings.WarningMessage]) -> List[str]:
    return [str(w.message) for w in record if issubclass(w.category, KerasMGPUWarning)]


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    return wait_until(condition, timeout, poll=0.005)  # the sampler's intervals are ms


def monitor_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    yield
    # Every test, passing or not, must leave no sampling thread behind.
    assert wait_for(lambda: not monitor_threads()), monitor_threads()


# --- figures -------------------------------------------------------------------------
def test_epoch_figures_are_means_maxima_and_spread() -> None:
    reader = Scripted()
    core = MonitorCore(interval=QUIET, reader=reader, verbose=False)
    first = [gpus(100, 40, mem=500), gpus(80, 60, mem=700), gpus(90, 50, mem=600)]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        (logs,) = run_epochs(core, reader, [first])
    assert logs == pytest.approx(
        {
            "gpu0_util": 90.0,
            "gpu1_util": 50.0,
            "gpu0_mem_mb": 700.0,
            "gpu1_mem_mb": 701.0,
            "gpu_util_mean": 70.0,
            "gpu_util_spread": 0.4,
        }
    )
    (row,) = core.summary()
    assert row["run"] == 0 and row["epoch"] == 0 and row["samples"] == 3
    assert row["gpu_util_spread"] == pytest.approx(0.4)


def test_balanced_run_adds_figures_and_never_warns(capsys: pytest.CaptureFixture) -> None:
    reader = Scripted()
    core = MonitorCore(interval=QUIET, reader=reader)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        logs = run_epochs(core, reader, [[gpus(95, 90, 92)] * 4, [gpus(97, 93, 99)] * 3])
    assert monitor_warnings(record) == []
    assert capsys.readouterr().out == ""
    assert [sorted(epoch) for epoch in logs] == [
        sorted(
            ["gpu0_util", "gpu1_util", "gpu2_util", "gpu0_mem_mb", "gpu1_mem_mb", "gpu2_mem_mb"]
            + ["gpu_util_mean", "gpu_util_spread"]
        )
    ] * 2
    assert logs[1]["gpu_util_spread"] == pytest.approx(0.06)
    assert [row["epoch"] for row in core.summary()] == [0, 1]


# --- findings ------------------------------------------------------------------------
def test_imbalance_warns_once_naming_busiest_and_idlest(capsys: pytest.CaptureFixture) -> None:
    reader = Scripted()
    core = MonitorCore(interval=QUIET, reader=reader, imbalance=0.2)
    lopsided = [gpus(100, 55, 45)] * 4
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        run_epochs(core, reader, [lopsided, lopsided, lopsided])
    (message,) = monitor_warnings(record)
    assert "busiest gpu0 (Fake GPU) at 100%" in message
    assert "idlest gpu2 (Fake GPU) at 45%" in message
    assert "spread 55%" in message
    assert "tf.device('/gpu:0')" in message and "kerasmgpu doctor" in message
    assert "kerasmgpu.parallelize()" in message
    # verbose=True prints the same finding once.
    assert capsys.readouterr().out.count("unbalanced GPUs") == 1


def test_imbalance_names_physical_ids_when_they_differ() -> None:
    reader = Scripted()
    core = MonitorCore(interval=QUIET, reader=reader, verbose=False)
    remapped = [
        GpuReading(0, "A", 99.0, 1.0, 2.0, physical_index=3),
        GpuReading(1, "B", 10.0, 1.0, 2.0, physical_index=1),
        GpuReading(2, "C", 95.0, 1.0, 2.0, physical_index=0),
    ]
    with pytest.warns(KerasMGPUWarning) as record:
        run_epochs(core, reader, [[remapped] * 3])
    (message,) = [str(w.message) for w in record]
    assert "busiest gpu0 (A, physical 3) at 99%" in message
    assert "idlest gpu1 (B) at 10%" in message


def test_spread_at_or_below_threshold_does_not_warn() -> None:
    reader = Scripted()
    core = MonitorCore(interval=QUIET, reader=reader, imbalance=0.25, verbose=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        run_epochs(core, reader, [[gpus(100, 80)] * 3, [gpus(90, 70)] * 3])
    assert monitor_warnings(record) == []


def test_input_bound_warns_once_and_not_as_imbalance(capsys: pytest.CaptureFixture) -> None:
    reader = Scripted()
    core = MonitorCore(interval=QUIET, reader=reader, low_utilization=0.3)
    # 25% against 2% is a 23-point spread, but every GPU starving is the finding.
    starved = [gpus(25, 2)] * 3
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        run_epochs(core, reader, [starved, starved, starved])
    (message,) = monitor_warnings(record)
    assert message.startswith("kerasmgpu DeviceMonitor: input-bound in epoch 1")
    assert "gpu0 (Fake GPU) 25%" in message and "gpu1 (Fake GPU) 2%" in message
    assert "the GPUs wait for data" in message
    assert "tf.data.Dataset.prefetch" in message and "PyDataset workers" in message
    assert "global batch size" in message
    out = capsys.readouterr().out
    assert out.count("input-bound") == 1 and "unbalanced" not in out


def test_single_gpu_input_bound_but_never_unbalanced() -> None:
    reader = Scripted()
    core = MonitorCore(interval=QUIET, reader=reader, verbose=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        logs = run_epochs(core, reader, [[gpus(100)] * 3, [gpus(5)] * 3])
    assert logs[0]["gpu_util_spread"] == 0.0
    (message,) = monitor_warnings(record)
    assert "input-bound in epoch 2" in message


def test_warm_up_first_epoch_with_few_samples_is_not_judged() -> None:
    reader = Scripted()
    core = MonitorCore(interval=QUIET, reader=reader, verbose=False)
    lopsided = gpus(100, 10)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        run_epochs(core, reader, [[lopsided] * 2])
    assert monitor_warnings(record) == []
    # The second epoch is judged even on one sample; so is a first epoch of three.
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        run_epochs(core, reader, [[lopsided] * 2, [lopsided]])
    assert ["epoch 2" in m for m in monitor_warnings(record)] == [True]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        run_epochs(core, reader, [[lopsided] * 3])
    assert ["epoch 1" in m for m in monitor_warnings(record)] == [True]


def test_each_finding_once_per_run_and_again_on_a_new_run() -> None:
    reader = Scripted()
    core = MonitorCore(interval=QUIET, reader=reader, verbose=False)
    lopsided, starved = [gpus(100, 10)] * 3, [gpus(5, 6)] * 3
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        run_epochs(core, reader, [lopsided, starved, lopsided, starved])
        first_run = monitor_warnings(record)
        run_epochs(core, reader, [lopsided, lopsided])
        both_runs = monitor_warnings(record)
    assert ["unbalanced" in m for m in first_run] == [True, False]
    assert "input-bound" in first_run[1]
    assert len(both_runs) == 3 and "unbalanced" in both_runs[2]
    assert [(row["run"], row["epoch"]) for row in core.summary()] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 0),
        (1, 1),
    ]


def test_short_epoch_gets_one_synchronous_sample() -> None:
    reader = Scripted(gpus(70, 60))
    core = MonitorCore(interval=QUIET, reader=reader, verbose=False)
    core.train_begin()
    calls_after_probe = reader.calls
    core.epoch_begin(0)
    logs = core.epoch_end(0)
    core.train_end()
    assert reader.calls == calls_after_probe + 1
    assert logs["gpu0_util"] == 70.0 and logs["gpu1_util"] == 60.0
    assert core.summary()[0]["samples"] == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"interval": 0},
        {"interval": float("nan")},
        {"imbalance": 0},
        {"imbalance": 1.5},
        {"low_utilization": -0.1},
        {"reader": 3},
        {"interval": True},
        {"imbalance": "0.2"},
    ],
)
def test_invalid_arguments_say_what_is_allowed(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="Allowed:"):
        MonitorCore(**kwargs)


def test_numpy_scalars_are_accepted() -> None:
    core = MonitorCore(interval=np.float32(0.5), imbalance=np.float64(0.25), low_utilization=0)
    assert (core.interval, core.imbalance, core.low_utilization) == (0.5, 0.25, 0.0)


# --- thread lifecycle ----------------------------------------------------------------
def test_thread_samples_during_training_and_is_joined_at_the_end() -> None:
    reader = Scripted(gpus(80, 80))
    core = MonitorCore(interval=0.01, reader=reader, verbose=False)
    core.train_begin()
    thread = core.thread
    assert thread is not None and thread.is_alive() and thread.daemon
    assert thread.name == THREAD_NAME
    core.epoch_begin(0)
    # Every read started after epoch_begin lands in epoch 0; the 4th may still be running.
    started = reader.calls
    assert wait_for(lambda: reader.calls >= started + 4)
    logs = core.epoch_end(0)
    assert core.summary()[0]["samples"] >= 3
    assert logs["gpu0_util"] == 80.0
    core.train_end()
    assert core.thread is None and not thread.is_alive()
    calls = reader.calls
    time.sleep(0.05)
    assert reader.calls == calls  # nothing samples after training
    core.train_end()  # idempotent


def test_train_begin_again_stops_the_previous_thread() -> None:
    reader = Scripted()
    core = MonitorCore(interval=0.01, reader=reader, verbose=False)
    core.train_begin()
    old = core.thread
    core.train_begin()  # the previous fit raised and never reached on_train_end
    new = core.thread
    assert old is not None and new is not None and old is not new
    assert not old.is_alive() and new.is_alive()
    assert len(monitor_threads()) == 1
    core.train_end()
    assert not new.is_alive()


def test_thread_is_gone_after_training_even_when_the_reader_raises() -> None:
    state = {"n": 0}

    def flaky() -> List[GpuReading]:
        state["n"] += 1
        if state["n"] % 2 == 0:  # never 3 in a row: stays enabled
            raise OSError("transient")
        return gpus(50, 50)

    core = MonitorCore(interval=0.005, reader=flaky, verbose=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        core.train_begin()
        thread = core.thread
        assert wait_for(lambda: state["n"] >= 8)
        assert not core.disabled and thread is not None and thread.is_alive()
        core.train_end()
    assert not thread.is_alive()
    assert monitor_warnings(record) == []


def test_three_failures_in_a_row_disable_with_one_message(capsys: pytest.CaptureFixture) -> None:
    reader = Scripted(fail=RuntimeError("NVML_ERROR_GPU_IS_LOST"))
    core = MonitorCore(interval=0.005, reader=reader)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        core.train_begin()  # the probe is the first failure; the thread makes the rest
        thread = core.thread
        assert thread is not None
        assert wait_for(lambda: core.disabled)
        thread.join(30.0)
        assert not thread.is_alive()  # it stopped itself
        core.epoch_begin(0)
        assert core.epoch_end(0) == {}  # no synchronous read once disabled
        core.train_end()
        core.train_begin()  # a later run stays off: no thread, no new message
        assert core.thread is None
        core.train_end()
    assert reader.calls == MAX_FAILURES
    (message,) = monitor_warnings(record)
    assert "disabled after 3 failed reads" in message and "NVML_ERROR_GPU_IS_LOST" in message
    assert capsys.readouterr().out.count("disabled") == 1


def test_failures_must_be_consecutive_to_disable() -> None:
    script = iter([gpus(1), None, None, gpus(1), None, None, gpus(1)])

    def reader() -> List[GpuReading]:
        value = next(script)
        if value is None:
            raise RuntimeError("blip")
        return value

    core = MonitorCore(interval=QUIET, reader=reader, verbose=False)
    core.train_begin()
    results = [core.sample() for _ in range(6)]
    core.train_end()
    assert results == [False, False, True, False, False, True]
    assert not core.disabled


@pytest.mark.parametrize(
    "reader, reason",
    [
        (
            Scripted(fail=NvmlUnavailable("no NVIDIA driver (NVML init failed: x)")),
            "no NVIDIA driver (NVML init failed: x)",
        ),
        (Scripted(readings=[]), "no NVIDIA GPU"),
    ],
    ids=["unavailable", "empty"],
)
def test_without_gpus_says_so_once_and_costs_nothing(
    reader: Scripted, reason: str, capsys: pytest.CaptureFixture
) -> None:
    reader.calls = 0
    core = MonitorCore(interval=0.001, reader=reader)
    for _ in range(2):
        core.train_begin()
        assert core.thread is None and not core.monitoring
        core.epoch_begin(0)
        assert core.epoch_end(0) == {}
        core.train_end()
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and reason in out and "monitoring is off" in out
    assert reader.calls == 2  # one probe per run, nothing else
    assert core.summary() == []


# --- the Keras shell, on a stand-in base ---------------------------------------------
class StandInCallback:
    """The shape of keras.callbacks.Callback that the shell relies on."""

    def __init__(self) -> None:
        self.model: Any = None


def test_callback_shell_updates_logs_and_summarises() -> None:
    cls = device_monitor_class(StandInCallback)
    assert cls is device_monitor_class(StandInCallback)  # one class per base
    assert issubclass(cls, StandInCallback) and cls.__name__ == "DeviceMonitor"
    monitor = cls(interval=QUIET, reader=Scripted(gpus(60, 50)), verbose=False)
    assert monitor.model is None  # the base's __init__ ran
    monitor.on_train_begin({})
    for epoch in range(2):
        monitor.on_epoch_begin(epoch, {})
        logs = {"loss": 1.0}
        monitor.on_epoch_end(epoch, logs)
        assert logs["loss"] == 1.0 and logs["gpu0_util"] == 60.0
        assert logs["gpu1_mem_mb"] == 1001.0 and logs["gpu_util_mean"] == 55.0
    monitor.on_train_end({})
    assert [row["epoch"] for row in monitor.summary()] == [0, 1]
    assert "interval=60" in repr(monitor)


def test_callback_shell_copies_and_stops_on_collection() -> None:
    cls = device_monitor_class(StandInCallback)
    reader = Scripted()
    monitor = cls(interval=0.01, reader=reader, imbalance=0.3, verbose=False)
    monitor.on_train_begin()
    twin = copy.deepcopy(monitor)  # KerasTuner copies callbacks per trial
    assert twin.core is not monitor.core and twin.core.thread is None
    assert twin.core.config() == monitor.core.config()
    thread = monitor.core.thread
    assert thread is not None and thread.is_alive()
    del monitor, twin
    gc.collect()
    assert wait_for(lambda: not thread.is_alive())  # __del__ stopped it


def _fake_keras_module(name: str, base: type) -> types.ModuleType:
    module = types.ModuleType(name)
    keras_ns = types.SimpleNamespace(callbacks=types.SimpleNamespace(Callback=base))
    module.callbacks = keras_ns.callbacks  # type: ignore[attr-defined]
    module.keras = keras_ns  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize(
    "line, module, hidden",
    [
        ("KERAS_3", "keras", None),
        ("LEGACY", "keras", None),
        ("LEGACY", "tensorflow", "keras"),  # TF < 2.4 without the keras package
        ("TF_KERAS", "tensorflow", None),
        ("TF_KERAS_LEGACY", "tf_keras", None),
    ],
)
def test_callback_base_follows_the_active_line(
    monkeypatch: pytest.MonkeyPatch, line: str, module: str, hidden: Optional[str]
) -> None:
    from kerasmgpu import callbacks, registry
    from kerasmgpu.env import versions as detection

    class LineCallback:
        pass

    monkeypatch.setattr(detection, "detect_keras_line", lambda: (detection.KerasLine[line], None))
    registry.reset()  # the active Keras is detected once per process: pretend anew
    for name in ("keras", "tensorflow", "tf_keras"):
        monkeypatch.setitem(sys.modules, name, _fake_keras_module(name, object))
    monkeypatch.setitem(sys.modules, module, _fake_keras_module(module, LineCallback))
    if hidden is not None:
        monkeypatch.setitem(sys.modules, hidden, None)  # import -> ImportError
    assert callbacks.keras_callback_base() is LineCallback
    assert issubclass(device_monitor_class(), LineCallback)


def test_without_keras_the_import_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from kerasmgpu import callbacks, registry
    from kerasmgpu.env import versions as detection

    monkeypatch.setattr(detection, "detect_keras_line", lambda: (detection.KerasLine.NONE, None))
    registry.reset()
    monkeypatch.delitem(callbacks.__dict__, "DeviceMonitor", raising=False)
    with pytest.raises(ImportError, match="no Keras is installed.*MonitorCore"):
        from kerasmgpu.callbacks import DeviceMonitor  # noqa: F401


def test_import_builds_no_framework() -> None:
    code = (
        "import sys, kerasmgpu.callbacks, kerasmgpu.nvml\n"
        "from kerasmgpu.callbacks import MonitorCore\n"
        "heavy = {'keras', 'tensorflow', 'jax', 'torch', 'tf_keras', 'pynvml'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERASMGPU_")}
    done = jobs.run([sys.executable, "-c", code], env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- kerasmgpu.nvml on a fake pynvml -----------------------------------------------
class FakeNvml(types.ModuleType):
    """Enough of pynvml for kerasmgpu.nvml; 4 GPUs, GPU i at 10*i % busy."""

    class NVMLError(Exception):
        pass

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, count: int = 4, init_error: Optional[Exception] = None) -> None:
        super().__init__("pynvml")
        self.count = count
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        time.sleep(0.01)  # widen the window for a racing second initialisation
        self.inits += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"  # old bindings return bytes

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        assert 0 <= index < self.count
        return index

    def nvmlDeviceGetName(self, handle: int) -> Any:
        return f"Fake H{handle}" if handle % 2 else f"Fake H{handle}".encode()

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return types.SimpleNamespace(gpu=10 * handle, memory=5)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        mib = 1024 * 1024
        return types.SimpleNamespace(used=(100 + handle) * mib, total=16384 * mib)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 40 + handle

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 3:
            raise self.NVMLError("Not Supported")
        return 250_500  # milliwatts


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield fake  # nvml's state is reset around every test (_fresh_nvml_state)


@pytest.fixture(autouse=True)
def _fresh_nvml_state() -> Iterator[None]:
    nvml.reset()
    yield
    nvml.reset()


def test_read_gpus_reports_every_gpu(fake_nvml: FakeNvml) -> None:
    readings = nvml.read_gpus()
    assert [r.index for r in readings] == [0, 1, 2, 3]
    assert [r.physical_index for r in readings] == [0, 1, 2, 3]
    first, last = readings[0], readings[3]
    assert first == GpuReading(
        index=0,
        name="Fake H0",
        utilization_percent=0.0,
        memory_used_mb=100.0,
        memory_total_mb=16384.0,
        temperature_c=40.0,
        power_w=250.5,
        physical_index=0,
    )
    assert last.name == "Fake H3" and last.utilization_percent == 30.0
    assert last.power_w is None  # NOT_SUPPORTED on that board: optional, not fatal
    assert nvml.available() and nvml.driver_version() == "550.54.15"
    with pytest.raises(AttributeError):
        first.index = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "visible, physical",
    [
        ("2,0", [2, 0]),
        ("3", [3]),
        (" 1, 2 ", [1, 2]),
        ("0,-1,1", [0]),
        ("1,9,2", [1]),
        ("1,1", [1]),
        ("GPU-8f6f4bd0-aaaa", [0, 1, 2, 3]),
        ("MIG-1234", [0, 1, 2, 3]),
    ],
)
def test_cuda_visible_devices_picks_and_reindexes(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, visible: str, physical: List[int]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    readings = nvml.read_gpus()
    assert [r.index for r in readings] == list(range(len(physical)))
    assert [r.physical_index for r in readings] == physical
    assert [r.utilization_percent for r in readings] == [10.0 * p for p in physical]


@pytest.mark.parametrize("visible", ["", "-1", "NoDevFiles"])
def test_cuda_visible_devices_hiding_everything(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, visible: str
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    if visible == "NoDevFiles":  # not an integer list: kerasmgpu does not filter
        assert len(nvml.read_gpus()) == 4
        return
    with pytest.raises(NvmlUnavailable, match="no NVIDIA GPU visible: CUDA_VISIBLE_DEVICES"):
        nvml.read_gpus()
    assert not nvml.available()


def test_nvml_initialises_once_across_threads(fake_nvml: FakeNvml) -> None:
    barrier = threading.Barrier(6)
    errors: List[BaseException] = []

    def read() -> None:
        try:
            barrier.wait()
            nvml.read_gpus()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and fake_nvml.inits == 1
    nvml.reset()
    assert fake_nvml.shutdowns == 1


def test_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(NvmlUnavailable) as info:
        nvml.read_gpus()
    assert info.value.reason == "nvidia-ml-py is not installed: pip install nvidia-ml-py"
    assert not nvml.available()
    report = nvml.summary()
    assert report["available"] is False and report["reason"] == info.value.reason
    assert report["devices"] == [] and report["driver"] is None


def test_no_driver_is_reported_and_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(init_error=RuntimeError("NVML Shared Library Not Found"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    for _ in range(2):
        with pytest.raises(NvmlUnavailable, match=r"^no NVIDIA driver \(NVML init failed: NVML"):
            nvml.read_gpus()
    assert fake.inits == 1  # a driver does not appear mid-process: no retry per sample
    assert not nvml.available()


def test_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(count=0))
    with pytest.raises(NvmlUnavailable, match="^no NVIDIA GPU$"):
        nvml.read_gpus()
    assert not nvml.available()
    assert nvml.summary()["driver"] == "550.54.15"  # the driver is there, the GPUs not


def test_summary_for_doctor(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    report = nvml.summary()
    assert report["available"] is True and report["reason"] is None
    assert report["driver"] == "550.54.15" and report["cuda_visible_devices"] == "3,1"
    assert report["devices"] == [
        {
            "index": 0,
            "physical_index": 3,
            "name": "Fake H3",
            "memory_total_mb": 16384.0,
            "memory_used_mb": 103.0,
        },
        {
            "index": 1,
            "physical_index": 1,
            "name": "Fake H1",
            "memory_total_mb": 16384.0,
            "memory_used_mb": 101.0,
        },
    ]


def test_monitor_on_the_nvml_reader(fake_nvml: FakeNvml) -> None:
    core = MonitorCore(interval=QUIET, verbose=False)  # default reader: kerasmgpu.nvml
    core.train_begin()
    core.epoch_begin(0)
    for _ in range(3):
        assert core.sample()
    with pytest.warns(KerasMGPUWarning, match="busiest gpu3 \\(Fake H3\\) at 30%"):
        logs = core.epoch_end(0)
    core.train_end()
    assert logs["gpu2_util"] == 20.0 and logs["gpu3_mem_mb"] == 103.0


# --- end to end: a real model.fit on the active Keras ---------------------------------
def _active_keras() -> Any:
    from helpers import LINE, keras_module

    from kerasmgpu.env.versions import KerasLine

    if LINE is KerasLine.NONE:
        pytest.skip("needs an installed Keras (keras 3, tf.keras, tf_keras or keras 2.3)")
    try:
        return keras_module()
    except ImportError as exc:
        pytest.skip(f"needs an importable Keras for {LINE.value}: {exc}")


def test_fit_records_gpu_figures_in_history(capsys: pytest.CaptureFixture) -> None:
    keras = _active_keras()
    callbacks = importlib.import_module("kerasmgpu.callbacks")
    DeviceMonitor = callbacks.DeviceMonitor
    reader = Scripted(gpus(88, 84))
    monitor = DeviceMonitor(interval=0.05, reader=reader)
    assert isinstance(monitor, keras.callbacks.Callback)

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((16, 4), dtype="float32")
    y = np.zeros((16, 1), dtype="float32")
    history = model.fit(x, y, epochs=2, batch_size=8, verbose=0, callbacks=[monitor])

    for key in (
        "gpu0_util",
        "gpu1_util",
        "gpu0_mem_mb",
        "gpu1_mem_mb",
        "gpu_util_mean",
        "gpu_util_spread",
    ):
        assert len(history.history[key]) == 2, (key, history.history.keys())
    assert history.history["gpu0_util"] == pytest.approx([88.0, 88.0])
    assert history.history["gpu_util_spread"] == pytest.approx([0.04, 0.04])
    assert monitor.core.thread is None
    assert [row["epoch"] for row in monitor.summary()] == [0, 1]
    assert "DeviceMonitor" not in capsys.readouterr().out  # balanced: nothing to say
