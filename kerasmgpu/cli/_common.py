"""Helpers shared by `kerasmgpu demo`, `doctor` and `bench`; nothing here imports a framework.

The subcommands follow three rules kept here in one place:

* Virtual devices are requested before any framework starts (`request_devices`), and
  never after: a late request would leave `kerasmgpu.devices` expecting a device count
  the running framework cannot show.
* With `--json`, standard output carries exactly one JSON object and the readable report
  goes to standard error (`Report`), so `kerasmgpu demo --json > demo.json` just works.
* Argument errors read like the library's own: what was received, what is allowed, the fix.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import logging
import math
import os
import re
import sys
import threading
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, TextIO, Tuple

from kerasmgpu._errors import explain
from kerasmgpu.env import devices as devices_module
from kerasmgpu.env.cluster import process_count
from kerasmgpu.env.devices import Device
from kerasmgpu.env.versions import VIRTUAL_DEVICES_ENV, KerasLine
from kerasmgpu.inventory import Environment

LAUNCHED_ENV = "KERASMGPU_LAUNCHED"
# Frameworks whose runtime fixes the device count once it has started.
_RUNTIMES = ("tensorflow", "jax", "torch")

# Virtual CPU devices `demo` and `bench` ask for when nothing else says how many.
DEFAULT_VIRTUAL = 2

# Route-neutral: Keras 2.3's multi_gpu_model combines outputs, the others all-reduce.
SHARED_CORES_NOTE = (
    "these replicas are virtual CPU devices: they share this machine's {cores} CPU "
    "core(s), so {measure} measures the cost of splitting batches and combining the "
    "replicas' work, not a speed-up. On GPUs each replica has a device of its own."
)


class UsageError(Exception):
    """A bad command line or a request this machine cannot meet; exit code 2."""


# What frameworks print while they start, none of it about the user's run: C++ log
# lines in absl's form ("I0000 00:00:1796101345.149745   27164 port.cc:153] ...", the
# E0000 "failed call to cuInit" on a machine without GPUs) and in TensorFlow's own
# ("2026-12-01 04:37:15.033981: E external/.../cuda_dnn.cc:9261] Unable to register
# cuDNN factory"), the line absl writes before them, the continuation of TF's
# CPU-instructions line, and Keras 2.3's banner. Fatal (F) lines are kept.
_FRAMEWORK_NOISE = re.compile(
    r"^(?:[IWE]\d{4} \d\d:\d\d:[\d.]+\s+\d+ \S+:\d+\] "
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] \S+:\d+\] "
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|To enable the following instructions: .* rebuild TensorFlow"
    r"|Using TensorFlow backend\.\s*$)"
)
# Python loggers of the frameworks (TensorFlow, absl, JAX's "no CUDA jaxlib" notice...).
_FRAMEWORK_LOGGERS = ("tensorflow", "absl", "jax", "jaxlib", "keras", "tf_keras", "h5py",
                      "torch")
VERBOSE_HELP = ("show the frameworks' own start-up output (TensorFlow's C++ log lines, "
                "warnings); hidden by default")


def is_framework_noise(line: str) -> bool:
    """Whether `line` is framework start-up output that a quiet command hides."""
    return bool(_FRAMEWORK_NOISE.match(line))


def quiet_frameworks(verbose: bool) -> None:
    """Hide framework start-up output in demo, doctor and bench (unless `--verbose`).

    Must run before any framework is imported: TensorFlow reads TF_CPP_MIN_LOG_LEVEL
    once, when its C++ runtime loads. Level 3 also hides its ERROR lines, which on a
    machine without GPUs are the expected "failed call to cuInit"; what goes wrong in
    the command itself still reaches the user as a Python exception. The lines printed
    before TensorFlow reads the level are filtered by `framework_output_filtered`.
    """
    if verbose:
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    for name in _FRAMEWORK_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # The frameworks' Python warnings (deprecations of their own APIs) are not about
    # the user's run; kerasmgpu's own start with "kerasmgpu" and still show.
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", message="kerasmgpu")


@contextlib.contextmanager
def framework_output_filtered(verbose: bool) -> Iterator[None]:
    """While a framework starts, drop its log lines from standard error (file descriptor
    2, where C++ writes) and pass everything else on as it comes.

    A thread forwards the lines, so output before a crash is not held back.
    """
    if verbose:
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (an embedding host): nothing to filter
        yield
        return
    read_end, write_end = os.pipe()

    def forward() -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for raw in pipe:
                if not is_framework_noise(raw.decode("utf-8", "replace")):
                    os.write(saved, raw)

    thread = threading.Thread(target=forward, name="kerasmgpu-stderr-filter", daemon=True)
    thread.start()
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the thread drains and ends
        thread.join(timeout=10)
        os.close(saved)


def positive_int(flag: str, example: str) -> Any:
    """An argparse `type=` that accepts integers >= 1 and explains anything else."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(
                explain(flag, text, "an integer >= 1", f"pass e.g. {flag} {example}")
            )
        return value

    parse.__name__ = flag  # argparse names the type in its own messages
    return parse


def parse_counts(text: str, flag: str = "--replicas") -> List[int]:
    """"1,2,4" -> [1, 2, 4]: positive, no repeats, ascending; UsageError otherwise."""
    parts = [p.strip() for p in str(text).split(",")]
    values: List[int] = []
    for part in parts:
        if not part.isdigit() or int(part) < 1:
            raise UsageError(explain(
                flag, text, "a comma-separated list of replica counts >= 1",
                f"pass e.g. {flag} 1,2,4",
            ))
        values.append(int(part))
    if len(set(values)) != len(values):
        raise UsageError(explain(
            flag, text, "each replica count once", f"pass e.g. {flag} {','.join(map(str, sorted(set(values))))}",
        ))
    return sorted(values)


def started_by_launcher() -> bool:
    """True in a worker of `kerasmgpu launch` (even `--nproc 1`) or of any job of
    several processes; `kerasmgpu.env.cluster.launched()` counts the latter only."""
    return os.environ.get(LAUNCHED_ENV) == "1" or process_count() > 1


def needs_launcher(route: Optional[str]) -> bool:
    """Whether `route` (a route's name, None for none) trains on several devices only
    as several processes: its engine's own flag (imports the engine, not its framework)."""
    if not route:
        return False
    from kerasmgpu import engines
    from kerasmgpu.registry import Route

    return engines.load_route(Route(route)).needs_launcher


def framework_started() -> bool:
    """Whether a framework that fixes its device count at start-up is imported."""
    return any(name in sys.modules for name in _RUNTIMES)


def requested_virtual() -> Optional[int]:
    """The virtual device count already asked for (call or environment), or None."""
    from kerasmgpu.env import devices

    try:
        return devices.requested()
    except (TypeError, ValueError):  # a malformed variable: `doctor` reports it
        return None


def request_devices(n: int) -> None:
    """Ask for `n` virtual CPU devices in case there is no GPU.

    Does nothing when at least `n` are already requested, in a `kerasmgpu launch`
    worker (the launcher owns the devices), or once a framework is imported (it is too
    late then; the caller compares the devices it gets with what it needs and says so).
    With GPUs visible the request is ignored by `kerasmgpu.devices` and GPUs are used.
    """
    current = requested_virtual()
    if started_by_launcher() or (current is not None and current >= n) or framework_started():
        return
    from kerasmgpu import api

    api.virtual_devices(n)


@contextlib.contextmanager
def _virtual_request_quiet() -> Iterator[None]:
    # "N virtual devices requested but GPUs are visible" fires when the framework starts
    # (importing Keras or listing devices); the commands print the device list, which
    # says the same thing more plainly.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"kerasmgpu: \d+ virtual devices requested")
        yield


def _started_environment() -> Environment:
    from kerasmgpu import api

    with _virtual_request_quiet():
        return api.environment(devices=True)


def list_devices() -> Tuple[Device, ...]:
    """The devices replicas can use, as the framework lists them (starts it)."""
    return tuple(_started_environment().devices or ())


def untested_torch(version: Optional[str]) -> Optional[str]:
    """A sentence when the installed torch is no release kerasmgpu is tested on (by
    major.minor; the CPU and CUDA builds of one release count as one), else None."""
    from kerasmgpu import pins

    if not version:
        return None
    tested = pins.tested_releases("torch")
    release = version.split("+")[0]
    if not tested or any(release.split(".")[:2] == t.split(".")[:2] for t in tested):
        return None
    return (f"torch {version} is not a release kerasmgpu is tested on ({', '.join(tested)}); "
            f"it may work. Fix: pip install torch=={tested[-1]} (on a machine without a GPU: "
            "--index-url https://download.pytorch.org/whl/cpu)")


def backend_hint(line: KerasLine, backend: Optional[str],
                 environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The fix when Keras 3 falls back to TensorFlow, which is not installed, while
    another backend is: Keras 3 takes TensorFlow when KERAS_BACKEND is unset, so the
    import error names tensorflow although the user installed jax or torch."""
    environ = os.environ if environ is None else environ
    if line is not KerasLine.KERAS_3 or backend != "tensorflow" or environ.get("KERAS_BACKEND"):
        return None
    if importlib.util.find_spec("tensorflow") is not None:
        return None
    found = [name for name in ("jax", "torch") if importlib.util.find_spec(name) is not None]
    if not found:
        return None
    return (f"KERAS_BACKEND is not set, so Keras 3 takes TensorFlow, which is not "
            f"installed; {' and '.join(found)} is: export KERAS_BACKEND={found[0]}")


def start(env: Environment, wanted: Optional[int], verbose: bool = False,
          ) -> Tuple[Environment, Any, Tuple[Device, ...]]:
    """Request `wanted` virtual devices (None: leave the request as it is), import Keras
    and start its framework: the environment as it now stands, Keras, the devices.

    A broken install is one line naming the fix, not a traceback. Unless `verbose`,
    the framework's start-up log lines are dropped (`framework_output_filtered`).
    """
    if wanted is not None:
        request_devices(wanted)  # before the framework starts: it fixes its device count
    try:
        with framework_output_filtered(verbose):
            keras = keras_module(env)
            started = _started_environment()
    except Exception as exc:
        hint = backend_hint(env.keras_line, env.backend)
        fix = hint or "run `kerasmgpu doctor` to see what is missing"
        raise UsageError(
            f"{line_label(env)} could not start: {type(exc).__name__}: {exc}. Fix: {fix}."
        ) from None
    return started, keras, tuple(started.devices or ())


def keras_module(env: Environment) -> Any:
    """The active Keras namespace (`keras`, `tf.keras`, `tf_keras`); imports it."""
    from kerasmgpu import adapters, registry

    with _virtual_request_quiet():
        return adapters.load(registry.active()).keras


def has_gpu(devices: Sequence[Device]) -> bool:
    return any(d.kind == "gpu" for d in devices)


def all_virtual(devices: Sequence[Device]) -> bool:
    return bool(devices) and all(d.virtual for d in devices)


def device_kind(devices: Sequence[Device]) -> str:
    """"gpu", "virtual cpu" or "cpu": what a throughput figure was measured on."""
    if has_gpu(devices):
        return "gpu"
    return "virtual cpu" if all_virtual(devices) else "cpu"


def gpu_names() -> List[str]:
    """Names of the visible NVIDIA GPUs (NVML), [] where NVML has none."""
    from kerasmgpu import nvml

    return [str(d.get("name")) for d in nvml.summary().get("devices", [])]


cpu_cores = devices_module.cpu_cores  # (demo and bench read it from here)


def shared_cores_note(measure: str = "samples/s") -> str:
    return SHARED_CORES_NOTE.format(cores=cpu_cores(), measure=measure)


def environment_summary(env: Environment, devices: Sequence[Device]) -> Dict[str, Any]:
    """The facts a result depends on: Keras line, versions, device kind and names."""
    names = gpu_names() if has_gpu(devices) else []
    return {
        "keras_line": env.keras_line.value,
        "keras_version": env.keras_version,
        "backend": env.backend,
        "tensorflow_version": env.tensorflow_version,
        "jax_version": env.jax_version,
        "torch_version": env.torch_version,
        "python_version": env.python_version,
        "route": env.route,
        "device_kind": device_kind(devices),
        "devices": [str(d) for d in devices],
        "gpu_name": names[0] if names else None,
        "cpu_cores": cpu_cores(),
        "virtual_devices": env.virtual_devices,
    }


def made_virtual_note(command: str, count: int, asked: Optional[int]) -> Optional[str]:
    """What to say when `command` split the CPU into virtual devices itself (no GPU, and
    no KERASMGPU_VIRTUAL_DEVICES / virtual_devices() asking for that many), so that a
    later `kerasmgpu doctor` - which by itself sees one CPU device - is no surprise."""
    if asked is not None and asked >= count:
        return None
    return (f"no GPU visible: {command} made these {count} virtual CPU devices itself. "
            f"Plain `kerasmgpu doctor` and your scripts see one CPU device; "
            f"`kerasmgpu doctor --virtual {count}` and {VIRTUAL_DEVICES_ENV}={count} see "
            f"{count}.")


def _split_names(text: str) -> List[str]:
    """"a, b (x, y), c" -> ["a", "b (x, y)", "c"]: device names may hold commas inside
    parentheses (JAX's TPU names do)."""
    names, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            names.append(current.strip())
            current = ""
        else:
            current += char
    names.append(current.strip())
    return [n for n in names if n]


def route_json(description: Optional[Mapping[str, str]]) -> Optional[Dict[str, Any]]:
    """`kerasmgpu.describe()`'s words with JSON types: `replicas` an int, `devices` a
    list of names (as in the doctor's JSON)."""
    if description is None:
        return None
    out: Dict[str, Any] = dict(description)
    if "replicas" in out:
        try:
            out["replicas"] = int(out["replicas"])
        except (TypeError, ValueError):
            out["replicas"] = None
    if "devices" in out:
        out["devices"] = _split_names(str(out["devices"]))
    return out


def line_label(env: Environment) -> str:
    """"keras 3 3.15.1 (backend jax)" - one phrase for titles and headers."""
    version = f" {env.keras_version}" if env.keras_version else ""
    backend = f" (backend {env.backend})" if env.backend else ""
    return f"{env.keras_line.value}{version}{backend}"


def no_keras_message() -> str:
    return explain(
        "keras", "no Keras installed", "tf.keras 2.x, tf_keras, Keras 3 or Keras <= 2.3",
        'install one, e.g. `pip install tensorflow` or `pip install keras "jax[cpu]"`',
        raw=True,
    )


def keras_missing(env: Environment) -> bool:
    return env.keras_line is KerasLine.NONE


def virtual_hint() -> str:
    return f"set {VIRTUAL_DEVICES_ENV}=N (or call kerasmgpu.virtual_devices(N)) to test"


def seeded_weights(model: Any, seed: int) -> None:
    """Give `model` the same initial weights on every Keras line (Glorot-uniform-like).

    Keras 2.3 has no global seed and each line draws initial weights differently; a
    numpy draw makes the demo's numbers the same everywhere.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = []
    for w in model.get_weights():
        if w.ndim >= 2:
            fan_in = int(np.prod(w.shape[:-1]))
            limit = math.sqrt(6.0 / (fan_in + w.shape[-1]))
            weights.append(rng.uniform(-limit, limit, size=w.shape).astype(w.dtype))
        else:
            weights.append(np.zeros(w.shape, dtype=w.dtype))
    model.set_weights(weights)


def max_weight_difference(a: Any, b: Any) -> float:
    """The largest absolute difference between two models' weights."""
    import numpy as np

    wa, wb = a.get_weights(), b.get_weights()
    if len(wa) != len(wb):
        return math.inf
    return max((float(np.max(np.abs(u - v))) if u.size else 0.0 for u, v in zip(wa, wb)),
               default=0.0)


def evaluate(model: Any, x: Any, y: Any, batch_size: int) -> Tuple[float, float]:
    """(loss, accuracy) of a model compiled with one accuracy metric."""
    result = model.evaluate(x, y, batch_size=batch_size, verbose=0)
    if isinstance(result, dict):  # return_dict or a subclass that returns one
        return float(result["loss"]), float(result.get("accuracy", math.nan))
    values = list(result) if isinstance(result, (list, tuple)) else [result]
    return float(values[0]), float(values[1]) if len(values) > 1 else math.nan


def to_json(value: Any) -> str:
    """JSON text with NaN and infinity written as null (strict parsers reject them)."""
    return json.dumps(_finite(value), indent=2, sort_keys=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class Report:
    """Where the readable report goes: stdout, or stderr when stdout carries JSON.

    `silent=True` (workers other than rank 0 under `kerasmgpu launch`) drops it.
    """

    def __init__(self, json_mode: bool, silent: bool = False) -> None:
        self.stream: TextIO = io.StringIO() if silent else (sys.stderr if json_mode else sys.stdout)
        self.silent = silent
        # Asked once: progress() runs every training step, inside bench's timed window.
        self._terminal = not silent and sys.stderr.isatty()
        self._shown = 0  # length of the progress line on screen, to blank it out

    def line(self, text: str = "") -> None:
        self.end_progress()
        print(text, file=self.stream, flush=True)

    def progress(self, text: str) -> None:
        """A line on stderr that the next one overwrites (plain `\\r`, no terminal codes).

        Only on a terminal: in a CI log every overwrite would pile up on one line.
        """
        if not self._terminal:
            return
        print("\r" + text.ljust(self._shown), end="", file=sys.stderr, flush=True)
        self._shown = len(text)

    def end_progress(self) -> None:
        if self._shown:
            print("\r" + " " * self._shown + "\r", end="", file=sys.stderr, flush=True)
            self._shown = 0


def table(rows: Sequence[Sequence[str]], right: Sequence[bool]) -> Iterator[str]:
    """Rows of cells as aligned text lines; `right[i]` right-aligns column i."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)]
        yield "  ".join(cells).rstrip()
