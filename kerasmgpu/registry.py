"""Which Keras line on which backend runs how: one entry per (Keras line, backend).

This is the one place that branches on the Keras line or the backend, and the one place
that asks which Keras is active: `active()` detects the line, its release and the backend
once per process and hands out the entry (like Keras 3's `backend._BACKEND`, chosen once;
`reset()` forgets it, for tests). Every other module receives that choice, or the adapter
and engine made from it, and reads what it needs: the route, the adapter, the engine,
what starts at import in a job of several processes, how fit() input reaches the engine,
and the releases it is verified on. What an engine can do (sync BatchNorm, accumulation,
a launcher) is the engine class's own (`engines.base.Engine`), not a table here.

Pure: no framework is imported here. An entry names its modules as "module:name"
strings, imported by the layer that uses them (`resolve`), so that this module stays
below all of them (tests/test_layers.py).

A new Keras line or backend is one entry below plus the modules it names (an adapter in
`adapters/`, an engine in `engines/` with its device lister and, where several processes
need one, its start-up).
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import sys
import threading
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from packaging.version import Version

from kerasmgpu._errors import bad_value
from kerasmgpu.env import versions
from kerasmgpu.env.versions import KerasLine


class Route(str, enum.Enum):
    """How `parallelize()` spreads a model over devices."""

    MULTI_GPU_MODEL = "multi_gpu_model"
    MIRRORED = "mirrored"
    KERAS_DISTRIBUTION = "keras_distribution"
    TORCH_DDP = "torch_ddp"

    def __str__(self) -> str:
        return self.value


class FeedKind(str, enum.Enum):
    """How fit() input reaches an engine: a tf.data pipeline (TensorFlow's strategies
    consume datasets) or Python batches (Keras's PyDataset on JAX, torch, Keras 2.3)."""

    TF = "tf"
    PYTHON = "python"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Entry:
    """Everything kerasmgpu needs to know about one Keras line on one backend."""

    line: KerasLine
    backend: str  # the framework that runs it; also the module a start-up hook waits for
    route: Route
    adapter: str  # "module:Class", an `adapters.Adapter` subclass
    engine: str  # "module:Class", an `engines.base.Engine` subclass (lists its devices)
    verified: Tuple[Version, Version]  # [min, below) the tox matrix runs
    # Where the Keras module is, first importable wins ("module" or "module:attribute").
    keras: Tuple[str, ...]
    dist: str  # the distribution to pin in a fix ("pip install ...")
    # Whether, in a process of a job of several, the engine starts right after `backend`
    # is imported (`Engine.start`, registered by `engines/startup.py`).
    starts_at_import: bool = False
    # The first release that trains in several processes, where above `verified[0]`.
    multi_process_floor: Optional[Version] = None


_ADAPTERS = "kerasmgpu.adapters"
_ENGINES = "kerasmgpu.engines"

_MIRRORED = f"{_ENGINES}.mirrored:MirroredEngine"
_TF_KERAS_2 = f"{_ADAPTERS}.tfkeras2:TfKeras2"

ENTRIES: Tuple[Entry, ...] = (
    Entry(KerasLine.LEGACY, "tensorflow", Route.MULTI_GPU_MODEL,
          adapter=f"{_ADAPTERS}.keras23:Keras23",
          engine=f"{_ENGINES}.multi_gpu_model:MultiGpuModelEngine",
          verified=(versions.LEGACY_KERAS_MIN, versions.LEGACY_KERAS_VERIFIED_BELOW),
          # Standalone Keras 2.3, or tf.keras itself on TF < 2.4 (no `keras` package).
          keras=("keras", "tensorflow:keras"), dist="keras"),
    Entry(KerasLine.TF_KERAS, "tensorflow", Route.MIRRORED,
          adapter=_TF_KERAS_2, engine=_MIRRORED,
          verified=(versions.TF_KERAS_MIN, versions.TF_KERAS_VERIFIED_BELOW),
          keras=("tensorflow:keras",), dist="tensorflow",
          starts_at_import=True),
    Entry(KerasLine.TF_KERAS_LEGACY, "tensorflow", Route.MIRRORED,
          adapter=_TF_KERAS_2, engine=_MIRRORED,
          verified=(versions.TF_KERAS_LEGACY_MIN, versions.TF_KERAS_LEGACY_VERIFIED_BELOW),
          keras=("tf_keras",), dist="tf-keras",
          starts_at_import=True),
    # No start-up: Keras 3 cannot train under MultiWorkerMirroredStrategy
    # (keras-team/keras#20585).
    Entry(KerasLine.KERAS_3, "tensorflow", Route.MIRRORED,
          adapter=f"{_ADAPTERS}.keras3_tensorflow:Keras3TensorFlow", engine=_MIRRORED,
          verified=(versions.KERAS3_TF_MIN, versions.KERAS3_VERIFIED_BELOW),
          keras=("keras",), dist="keras"),
    Entry(KerasLine.KERAS_3, "jax", Route.KERAS_DISTRIBUTION,
          adapter=f"{_ADAPTERS}.keras3_jax:Keras3Jax",
          engine=f"{_ENGINES}.keras_distribution:KerasDistributionEngine",
          verified=(versions.KERAS3_MIN, versions.KERAS3_VERIFIED_BELOW),
          keras=("keras",), dist="keras",
          starts_at_import=True,
          multi_process_floor=versions.KERAS3_JAX_MULTI_PROCESS_MIN),
    Entry(KerasLine.KERAS_3, "torch", Route.TORCH_DDP,
          adapter=f"{_ADAPTERS}.keras3_torch:Keras3Torch",
          engine=f"{_ENGINES}.torch_ddp:TorchDDPEngine",
          verified=(versions.KERAS3_MIN, versions.KERAS3_VERIFIED_BELOW),
          keras=("keras",), dist="keras",
          starts_at_import=True),
)

_BY_KEY: Dict[Tuple[KerasLine, str], Entry] = {(e.line, e.backend): e for e in ENTRIES}


@dataclass(frozen=True)
class Active:
    """The Keras this process runs: its line, release and backend, and their entry
    (None: no Keras, or a backend that cannot train; `entry_or_raise()` explains)."""

    line: KerasLine
    version: Optional[Version]
    backend: str
    entry: Optional[Entry]

    def entry_or_raise(self) -> Entry:
        """The entry; without one, a ValueError saying what to install or set."""
        return self.entry if self.entry is not None else lookup(self.line, self.backend)


_active: Optional[Active] = None
_active_lock = threading.Lock()


def active() -> Active:
    """The Keras this process runs, detected once (from installed metadata,
    TF_USE_LEGACY_KERAS and KERAS_BACKEND, importing no framework) and kept for the life
    of the process, as Keras keeps its backend: a line or backend cannot change under a
    running process. `reset()` forgets it."""
    global _active
    with _active_lock:
        if _active is None:
            line, version = versions.detect_keras_line()
            backend = versions.backend_for(line)
            _active = Active(line, version, backend, find(line, backend))
        return _active


def reset() -> None:
    """Forget the active Keras, to detect it again (tests that change what is installed
    or the environment variables that choose it)."""
    global _active
    with _active_lock:
        _active = None


def _key(line: KerasLine, backend: Optional[str]) -> Tuple[KerasLine, str]:
    # Only Keras 3 has backends; the Keras 2 lines run on TensorFlow whatever is asked.
    if line is not KerasLine.KERAS_3:
        return line, "tensorflow"
    return line, (backend if backend is not None else versions.backend_for(line))


def find(line: KerasLine, backend: Optional[str] = None) -> Optional[Entry]:
    """The entry of `line` on `backend` (default: the detected one), or None."""
    return _BY_KEY.get(_key(line, backend))


def lookup(line: KerasLine, backend: Optional[str] = None) -> Entry:
    """The entry of `line` on `backend`; a bad line or backend is explained."""
    entry = find(line, backend)
    if entry is not None:
        return entry
    if line is KerasLine.NONE:
        raise bad_value(
            "keras", "no Keras installed", "tf.keras, tf_keras, Keras 3 or Keras <= 2.3",
            'install one, e.g. `pip install "kerasmgpu[tensorflow]"`',
        )
    raise bad_value(
        "KERAS_BACKEND", backend, "tensorflow, jax or torch",
        "set KERAS_BACKEND to one of them (numpy and openvino cannot train)",
    )


def entries_of(route: Route) -> Tuple[Entry, ...]:
    """The entries a route drives."""
    return tuple(e for e in ENTRIES if e.route is route)


def resolve(reference: str) -> Any:
    """What a "module" or "module:name" reference names (imports the module)."""
    module_name, _, name = reference.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, name) if name else module


def keras_module(entry: Entry) -> Any:
    """The entry's Keras module: its first reference whose module is installed."""
    for reference in entry.keras[:-1]:
        if _installed(reference.partition(":")[0]):
            return resolve(reference)
    return resolve(entry.keras[-1])  # the last one raises ImportError when missing


def _installed(module_name: str) -> bool:
    """Whether `module_name` can be imported. An imported module counts as it is in
    `sys.modules` (None there: blocked), since `find_spec` raises ValueError for a module
    whose `__spec__` is None (one made at run time, as tests and some tools do)."""
    if module_name in sys.modules:
        return sys.modules[module_name] is not None
    try:
        return importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        return False


# --- Verified releases ---------------------------------------------------------------------


def verified_range(line: KerasLine, backend: Optional[str] = None
                   ) -> Optional[Tuple[Version, Version]]:
    """[min, below) of the releases of `line` (on `backend`) kerasmgpu is verified on."""
    entry = find(line, backend)
    return entry.verified if entry is not None else None


def multi_process_floor(line: KerasLine, backend: Optional[str] = None
                        ) -> Optional[Version]:
    """The first release of `line` that trains in several processes, where it differs
    from the line's own floor."""
    entry = find(line, backend)
    return entry.multi_process_floor if entry is not None else None


def below_multi_process_floor(line: KerasLine, version: Optional[Version],
                              backend: Optional[str] = None) -> Optional[Version]:
    """The floor for several processes when `version` is below it, else None."""
    floor = multi_process_floor(line, backend)
    if floor is None or version is None or Version(version.base_version) >= floor:
        return None
    return floor


def unsupported_version(line: KerasLine, version: Optional[Version],
                        backend: Optional[str] = None) -> Optional[str]:
    """Why this Keras release is outside kerasmgpu's verified range, or None."""
    span = verified_range(line, backend)
    if version is None or span is None:
        return None
    low, below = span
    # Patch releases and pre-releases of a verified minor count as that minor.
    base = Version(version.base_version)
    if base < low:
        on = f" on {_key(line, backend)[1]}" if line is KerasLine.KERAS_3 else ""
        return f"{line.value} {version}{on} (kerasmgpu needs >= {low})"
    if base >= below and not versions.unverified_ok():
        return (f"{line.value} {version} (kerasmgpu is verified below {below}; "
                f"{versions.UNVERIFIED_OK_ENV}=1 runs it anyway, refusing at parallelize() if one "
                "of its hooks moved)")
    return None


__all__ = [
    "ENTRIES", "Active", "Entry", "active", "reset", "FeedKind", "Route", "below_multi_process_floor", "entries_of",
    "find", "keras_module", "lookup", "multi_process_floor", "resolve",
    "unsupported_version", "verified_range",
]
