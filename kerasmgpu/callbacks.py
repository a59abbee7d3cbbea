"""Keras callbacks: ``DeviceMonitor`` shows, per epoch, how busy each GPU was.

    from kerasmgpu.callbacks import DeviceMonitor
    pmodel.fit(x, y, epochs=10, callbacks=[DeviceMonitor()])
    # history.history["gpu0_util"], ["gpu1_util"], ..., ["gpu_util_spread"]

"One GPU at 100%, the others at 40-60%" is the usual symptom of a template model or an
input pipeline pinned to GPU 0; "every GPU at 10%" is an input-bound run. Neither shows
in the loss, so the monitor samples NVML in a background thread while training, adds
the per-epoch figures to ``logs`` (History, TensorBoard and CSVLogger record them), and
warns once per run, naming the cause and the fix.

``import kerasmgpu.callbacks`` imports no framework: ``DeviceMonitor`` is built on first
access, as a subclass of the active Keras line's ``Callback`` (Keras 3, tf.keras 2.x,
tf_keras, standalone Keras 2.3). The monitoring itself lives in ``MonitorCore``, which
needs no Keras at all.
"""

from __future__ import annotations

import atexit
import copy
import math
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Type

from kerasmgpu._errors import bad_value
from kerasmgpu.nvml import NO_GPU, GpuReading, NvmlUnavailable, read_gpus

__all__ = [
    "DeviceMonitor",
    "KerasMGPUWarning",
    "MonitorCore",
    "device_monitor_class",
    "keras_callback_base",
]

Reader = Callable[[], Sequence[GpuReading]]

PREFIX = "kerasmgpu DeviceMonitor: "
IMBALANCE_CAUSE = (
    "Likely cause: the template model or the data pipeline sits on one GPU. "
    "Fix: build the model outside `tf.device('/gpu:0')`, let kerasmgpu.parallelize() "
    "place replicas, and check that every GPU is in the strategy (`kerasmgpu doctor`)."
)
INPUT_BOUND_CAUSE = (
    "Likely cause: the GPUs wait for data. "
    "Fix: prefetch (`tf.data.Dataset.prefetch`, PyDataset workers), raise the global "
    "batch size, or move preprocessing off the training step."
)
# Three failed reads in a row is a broken driver or reader, not a hiccup: stop asking.
MAX_FAILURES = 3
# NVML's utilization is a busy fraction over its last sample period; the first second
# of a run is graph tracing and compilation, so one or two samples of it say nothing.
WARMUP_SAMPLES = 3
# on_train_end waits this long for a read in progress; NVML calls can hang when a GPU
# falls off the bus, and training must still end.
JOIN_TIMEOUT_S = 5.0


class KerasMGPUWarning(UserWarning):
    """A kerasmgpu finding about how training uses the hardware; filter on this class."""


class _GpuStats:
    """Running figures for one GPU over one epoch: O(1) memory whatever its length."""

    __slots__ = ("count", "mem_max", "name", "physical_index", "util_sum")

    def __init__(self, reading: GpuReading) -> None:
        self.name = reading.name
        self.physical_index = reading.physical_index
        self.util_sum = 0.0
        self.count = 0
        self.mem_max = 0.0

    def add(self, reading: GpuReading) -> None:
        self.util_sum += float(reading.utilization_percent)
        self.count += 1
        self.mem_max = max(self.mem_max, float(reading.memory_used_mb))

    @property
    def util_mean(self) -> float:
        return self.util_sum / self.count if self.count else 0.0


class MonitorCore:
    """The framework-free monitor: a sampling thread, per-epoch figures, the warnings.

    Drive it with ``train_begin()``, ``epoch_begin(epoch)``, ``epoch_end(epoch)`` (which
    returns the figures to add to ``logs``) and ``train_end()``; the Keras callback is a
    thin shell around it. The reader is any zero-argument callable returning one
    ``GpuReading`` per GPU; it defaults to ``kerasmgpu.nvml.read_gpus``.
    """

    def __init__(
        self,
        interval: float = 1.0,
        imbalance: float = 0.2,
        low_utilization: float = 0.3,
        reader: Optional[Reader] = None,
        verbose: bool = True,
    ) -> None:
        seconds = _number(interval)
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            raise bad_value("interval", interval, "seconds > 0", "e.g. interval=1.0")
        spread = _number(imbalance)
        if spread is None or not 0 < spread <= 1:
            raise bad_value(
                "imbalance", imbalance, "a fraction in (0, 1]", "e.g. imbalance=0.2 for 20 points"
            )
        low = _number(low_utilization)
        if low is None or not 0 <= low <= 1:
            raise bad_value(
                "low_utilization",
                low_utilization,
                "a fraction in [0, 1]",
                "e.g. low_utilization=0.3 for 30%; 0 turns the input-bound check off",
            )
        if reader is not None and not callable(reader):
            raise bad_value(
                "reader", reader, "a callable returning GpuReadings, or None", "pass a function"
            )
        self.interval = seconds
        self.imbalance = spread
        self.low_utilization = low
        self.reader: Reader = reader if reader is not None else read_gpus
        self.verbose = bool(verbose)

        # One lock for everything the thread and the training loop share.
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._stats: Dict[int, _GpuStats] = {}
        self._samples = 0
        self._failures = 0
        # Disabled after MAX_FAILURES: for the rest of this monitor's life, so that a
        # broken reader costs one message, not one per fit().
        self._disabled = False
        self._said_unavailable = False
        self._monitoring = False  # True from a successful train_begin to train_end
        self._run = -1
        self._epochs_in_run = 0
        self._warned_imbalance = False
        self._warned_input_bound = False
        self._history: List[Dict[str, Any]] = []

    # --- public state --------------------------------------------------------------
    def config(self) -> Dict[str, Any]:
        """The constructor arguments, to rebuild an equal monitor (copies, pickling)."""
        return {
            "interval": self.interval,
            "imbalance": self.imbalance,
            "low_utilization": self.low_utilization,
            "reader": None if self.reader is read_gpus else self.reader,
            "verbose": self.verbose,
        }

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The sampling thread while a run is sampled, else None."""
        return self._thread

    @property
    def monitoring(self) -> bool:
        """True while a run is being sampled (readings flow and the monitor is enabled)."""
        return self._monitoring and not self._disabled

    @property
    def disabled(self) -> bool:
        """True once the reader failed MAX_FAILURES times in a row."""
        return self._disabled

    def summary(self) -> List[Dict[str, Any]]:
        """Per-epoch figures so far, oldest first: ``run``, ``epoch``, ``samples`` and the
        keys added to ``logs`` (``gpu{i}_util``, ``gpu{i}_mem_mb``, ``gpu_util_mean``,
        ``gpu_util_spread``)."""
        with self._lock:
            return [dict(row) for row in self._history]

    # --- training hooks ------------------------------------------------------------
    def train_begin(self) -> None:
        """Start a run: probe the reader once, then sample in a daemon thread."""
        # A run that raised never reached train_end; its thread must not leak into this one.
        self.stop()
        with self._lock:
            self._run += 1
            self._epochs_in_run = 0
            self._warned_imbalance = False
            self._warned_input_bound = False
            self._failures = 0
            self._monitoring = False
            self._reset_epoch()
            if self._disabled:
                return
        try:
            first = list(self.reader())
        except NvmlUnavailable as exc:
            self._say_unavailable(exc.reason)
            return
        except Exception as exc:  # a flaky first read: count it, let the thread retry
            self._failed(exc)
            if self._disabled:
                return
        else:
            if not first:
                self._say_unavailable(NO_GPU)
                return
        stop = threading.Event()
        thread = threading.Thread(
            target=self._loop, args=(stop,), name="kerasmgpu-DeviceMonitor", daemon=True
        )
        with self._lock:
            self._stop = stop
            self._thread = thread
            self._monitoring = True
        _register(self)
        thread.start()

    def epoch_begin(self, epoch: int) -> None:
        """Forget samples taken between epochs (checkpointing, evaluation callbacks)."""
        with self._lock:
            self._reset_epoch()

    def epoch_end(self, epoch: int) -> Dict[str, float]:
        """The epoch's figures, to add to ``logs``; warns at most once per kind and run."""
        if not self._monitoring:
            return {}
        with self._lock:
            empty = self._samples == 0
        if empty and not self._disabled:
            # An epoch shorter than `interval` still gets one figure per GPU.
            self.sample()
        with self._lock:
            stats = sorted(self._stats.items())
            samples = self._samples
            self._reset_epoch()
            if not stats:
                return {}
            self._epochs_in_run += 1
            first_epoch = self._epochs_in_run == 1
            run = self._run
        means = {index: s.util_mean for index, s in stats}
        logs: Dict[str, float] = {}
        for index, s in stats:
            logs[f"gpu{index}_util"] = s.util_mean
            logs[f"gpu{index}_mem_mb"] = s.mem_max
        logs["gpu_util_mean"] = sum(means.values()) / len(means)
        logs["gpu_util_spread"] = (max(means.values()) - min(means.values())) / 100.0
        with self._lock:
            self._history.append({"run": run, "epoch": epoch, "samples": samples, **logs})
        if not (first_epoch and samples < WARMUP_SAMPLES):
            self._check(epoch, dict(stats), logs)
        return logs

    def train_end(self) -> None:
        """Stop and join the sampling thread; safe to call any number of times."""
        self.stop()
        with self._lock:
            self._monitoring = False
            self._reset_epoch()

    def stop(self, wait: bool = True) -> None:
        """Stop the sampling thread (joined when ``wait``); never raises."""
        with self._lock:
            thread, self._thread = self._thread, None
            stop = self._stop
        stop.set()
        # The thread itself may drop the last reference and run a finalizer: never join
        # oneself.
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT_S)

    # --- sampling ------------------------------------------------------------------
    def _loop(self, stop: threading.Event) -> None:
        # `stop` is this run's own event: a restarted run cannot revive an old thread.
        while not stop.wait(self.interval):
            if self._disabled:
                return
            try:
                self.sample()
            except Exception:  # only the warning itself can get here (-W error)
                return

    def sample(self) -> bool:
        """Read every GPU now into the current epoch (what the thread does each interval).

        Returns False when the read failed; failures are counted, never raised.
        """
        try:
            readings = list(self.reader())
            if not readings:
                raise NvmlUnavailable(NO_GPU)
            with self._lock:
                if self._disabled:
                    return False
                for reading in readings:
                    stats = self._stats.get(reading.index)
                    if stats is None:
                        stats = self._stats[reading.index] = _GpuStats(reading)
                    stats.add(reading)
                self._samples += 1
                self._failures = 0
            return True
        except Exception as exc:  # the thread must never raise into training
            self._failed(exc)
            return False

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            if self._disabled:
                return
            self._failures += 1
            if self._failures < MAX_FAILURES:
                return
            self._disabled = True
            self._stop.set()
        self._say(
            f"GPU monitoring disabled after {MAX_FAILURES} failed reads in a row "
            f"(last: {type(exc).__name__}: {exc}). Training continues without GPU figures.",
            warn=True,
        )

    def _reset_epoch(self) -> None:
        # Callers hold self._lock.
        self._stats = {}
        self._samples = 0

    # --- findings ------------------------------------------------------------------
    def _check(self, epoch: int, stats: Dict[int, _GpuStats], logs: Dict[str, float]) -> None:
        means = {index: s.util_mean for index, s in stats.items()}
        low = self.low_utilization * 100.0
        if all(value < low for value in means.values()):
            # Every GPU starved: the input pipeline is the first thing to fix, and a spread
            # between near-idle GPUs says little about placement, so no imbalance warning.
            if not self._claim("_warned_input_bound"):
                return
            figures = ", ".join(f"{_label(i, s)} {means[i]:.0f}%" for i, s in stats.items())
            self._say(
                f"input-bound in epoch {epoch + 1}: every GPU's mean utilization is below "
                f"{low:.0f}% (low_utilization={self.low_utilization:g}): {figures}. "
                + INPUT_BOUND_CAUSE,
                warn=True,
            )
            return
        spread = logs["gpu_util_spread"]
        if len(means) < 2 or spread <= self.imbalance:
            return
        if not self._claim("_warned_imbalance"):
            return
        busiest = max(means, key=lambda i: means[i])
        idlest = min(means, key=lambda i: means[i])
        self._say(
            f"unbalanced GPUs in epoch {epoch + 1}: busiest {_label(busiest, stats[busiest])} "
            f"at {means[busiest]:.0f}%, idlest {_label(idlest, stats[idlest])} at "
            f"{means[idlest]:.0f}% (spread {spread:.0%} > imbalance={self.imbalance:g}). "
            + IMBALANCE_CAUSE,
            warn=True,
        )

    def _claim(self, flag: str) -> bool:
        """Set a once-per-run flag; True for the caller that set it."""
        with self._lock:
            if getattr(self, flag):
                return False
            setattr(self, flag, True)
            return True

    def _say_unavailable(self, reason: str) -> None:
        with self._lock:
            if self._said_unavailable:
                return
            self._said_unavailable = True
        if self.verbose:
            print(f"{PREFIX}no GPU readings ({reason}); monitoring is off.", flush=True)

    def _say(self, message: str, *, warn: bool) -> None:
        text = PREFIX + message
        if warn:
            warnings.warn(text, KerasMGPUWarning, stacklevel=3)
        if self.verbose:
            print(text, flush=True)


def _number(value: Any) -> Optional[float]:
    """A numeric argument as a float (numpy scalars included); None for anything else."""
    # bool is an int and "0.5" converts, but neither is a threshold anyone meant.
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _label(index: int, stats: _GpuStats) -> str:
    """``gpu1 (NVIDIA A100, physical 3)``: the log key's index, then what nvidia-smi shows."""
    parts = [stats.name] if stats.name else []
    if stats.physical_index != index:
        parts.append(f"physical {stats.physical_index}")
    return f"gpu{index} ({', '.join(parts)})" if parts else f"gpu{index}"


# --- Threads never outlive the interpreter's orderly shutdown -----------------------
# Daemon threads are killed mid-call at exit; one inside an NVML call while modules are
# torn down can crash the process. A run that raised skips on_train_end, so stop what is
# left at exit. Weak references: a finished monitor must stay collectable.
_live: weakref.WeakSet[MonitorCore] = weakref.WeakSet()
_live_lock = threading.Lock()
_atexit_registered = False


def _register(core: MonitorCore) -> None:
    global _atexit_registered
    with _live_lock:
        _live.add(core)
        if not _atexit_registered:
            atexit.register(_stop_all)
            _atexit_registered = True


def _stop_all() -> None:
    with _live_lock:
        cores = list(_live)
    for core in cores:
        core.stop(wait=False)


# --- The Keras callback --------------------------------------------------------------
class _DeviceMonitorMixin:
    """Per-GPU utilization and memory in ``logs`` every epoch, with warnings on imbalance.

    Args:
        interval: seconds between samples of every GPU (a background daemon thread).
        imbalance: warn when the busiest and idlest GPU's mean utilization differ by
            more than this fraction (0.2 = 20 points).
        low_utilization: warn that the run is input-bound when every GPU's mean
            utilization is below this fraction.
        reader: returns one ``kerasmgpu.nvml.GpuReading`` per GPU; defaults to NVML
            (``pip install nvidia-ml-py``). Tests and other vendors pass their own.
        verbose: also print findings (they are always ``KerasMGPUWarning`` warnings).

    Adds to ``logs`` at each epoch end: ``gpu{i}_util`` (mean %), ``gpu{i}_mem_mb``
    (max MiB), ``gpu_util_mean`` (%) and ``gpu_util_spread`` (busiest minus idlest
    mean, as a fraction). Put it before TensorBoard or CSVLogger in ``callbacks`` so
    that they see these keys. Without NVIDIA GPUs it says so once and does nothing.
    """

    def __init__(
        self,
        interval: float = 1.0,
        imbalance: float = 0.2,
        low_utilization: float = 0.3,
        reader: Optional[Reader] = None,
        verbose: bool = True,
    ) -> None:
        super().__init__()
        self._core = MonitorCore(
            interval=interval,
            imbalance=imbalance,
            low_utilization=low_utilization,
            reader=reader,
            verbose=verbose,
        )

    @property
    def core(self) -> MonitorCore:
        """The framework-free monitor behind this callback."""
        return self._core

    def summary(self) -> List[Dict[str, Any]]:
        """Per-epoch figures collected so far (see ``MonitorCore.summary``)."""
        return self._core.summary()

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._core.train_begin()

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._core.epoch_begin(epoch)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        figures = self._core.epoch_end(epoch)
        # Keras passes one dict to every callback and History comes last, so updating it
        # in place is what puts the figures into history.history.
        if logs is not None and figures:
            logs.update(figures)

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._core.train_end()

    def __del__(self) -> None:
        core = self.__dict__.get("_core")
        if core is not None:
            core.stop(wait=False)

    # Locks and threads do not copy, and KerasTuner deep-copies callbacks for every
    # trial: a copy is a fresh, idle monitor with the same settings and the same reader
    # (a reader is a handle on the hardware, not state to duplicate).
    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        cls = type(self)
        twin = cls.__new__(cls)
        memo[id(self)] = twin
        for key, value in self.__dict__.items():
            if key != "_core":
                twin.__dict__[key] = copy.deepcopy(value, memo)
        twin._core = MonitorCore(**self._core.config())
        return twin

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        core = state.pop("_core")
        state["_core_config"] = core.config()
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state = dict(state)
        config = state.pop("_core_config")
        self.__dict__.update(state)
        self._core = MonitorCore(**config)

    def __repr__(self) -> str:
        c = self._core
        return (
            f"DeviceMonitor(interval={c.interval:g}, imbalance={c.imbalance:g}, "
            f"low_utilization={c.low_utilization:g}, verbose={c.verbose})"
        )


if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ builds it
    DeviceMonitor = _DeviceMonitorMixin


def keras_callback_base() -> type:
    """``Callback`` of the active Keras line; imports that framework."""
    from kerasmgpu import registry

    entry = registry.active().entry
    if entry is not None:
        return registry.keras_module(entry).callbacks.Callback
    raise ImportError(
        "kerasmgpu.callbacks.DeviceMonitor is a Keras callback, but no Keras is installed. "
        "Fix: pip install 'kerasmgpu[jax]' (or [tensorflow], [torch]); without Keras, "
        "use kerasmgpu.callbacks.MonitorCore directly."
    )


_classes: Dict[type, type] = {}
_classes_lock = threading.Lock()


def device_monitor_class(base: Optional[type] = None) -> Type[_DeviceMonitorMixin]:
    """``DeviceMonitor`` as a subclass of ``base`` (default: the active Keras's Callback).

    One class per base, so ``isinstance`` checks hold. Pass a base to pick a Keras
    other than the detected one, e.g. ``device_monitor_class(tf_keras.callbacks.Callback)``.
    """
    if base is None:
        base = keras_callback_base()
    with _classes_lock:
        cls = _classes.get(base)
        if cls is None:
            cls = type(
                "DeviceMonitor",
                (_DeviceMonitorMixin, base),
                {
                    "__module__": __name__,
                    "__qualname__": "DeviceMonitor",
                    "__doc__": _DeviceMonitorMixin.__doc__,
                },
            )
            _classes[base] = cls
    return cls


def __getattr__(name: str) -> Any:
    # PEP 562: building DeviceMonitor on first access is what keeps
    # `import kerasmgpu.callbacks` free of any framework import.
    if name == "DeviceMonitor":
        cls = device_monitor_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
