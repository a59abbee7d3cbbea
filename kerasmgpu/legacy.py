"""Keras 2.3-era multi-GPU calls, on every Keras line: drop-in `multi_gpu_model` and
`make_parallel`, and `install()` to make unchanged legacy imports find them.

`multi_gpu_model` keeps Keras 2.3's contract (the Keras docs' examples run as they
are): `gpus` is an int >= 2 or a list of ids, None means every visible device, and a
`ValueError` comes for `gpus <= 1` (legacy code catches it to fall back to one device)
and for devices that do not exist ("Try reducing `gpus`"). It returns a model to
compile and fit, whose `batch_size` is the global batch split over the replicas, and
whose weights are the template's both ways, as in Keras 2.3: the template holds the
trained weights (at every epoch end), so "save the template model" still works, and
weights set or loaded into the template are what the parallel model uses next.

On real Keras <= 2.3 it is Keras's own function. Elsewhere it is `parallelize()`:
`tf.distribute` or `keras.distribution`, which all-reduce gradients across replicas
instead of computing them on the merge device. `cpu_merge` and `cpu_relocation` are
honoured on Keras <= 2.3; elsewhere there is nothing to merge (each replica keeps its
own variables in step) and nothing to relocate (the template is copied into the
engine's scope), so they are accepted and have no effect.

`make_parallel(model, gpu_count)` is the keras-extras call, fixed: its slices dropped
the batch remainder ("Incompatible shapes [483,1] vs [482,1]") and only the forward
pass ran in parallel; here it is `multi_gpu_model` (nothing dropped, gradients reduced
across replicas), and `gpu_count=1` returns the model unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
import warnings
from typing import Any, List, Optional, Sequence, Union

from kerasmgpu import registry
from kerasmgpu._errors import bad_type, bad_value
from kerasmgpu.adapters import keras23
from kerasmgpu.env import cluster, versions

__all__ = ["multi_gpu_model", "make_parallel", "install", "installed"]

_GpusArg = Union[None, int, Sequence[int]]
_warned = False


def _migration_hint() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "kerasmgpu.legacy.multi_gpu_model is the Keras 2.3 API kept for old code; new "
            "code can call kerasmgpu.parallelize(model) (see `kerasmgpu migrate`).",
            DeprecationWarning,
            stacklevel=3,
        )




def _available(engine: Any, adapter: Any, job: cluster.ClusterEnvironment
               ) -> List[Any]:
    """The devices the active engine can use in this job (a test replaces it)."""
    return list(engine.available_devices(adapter, job))


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise bad_type(name, value, "True or False", f"pass {name}=True or {name}=False")


def _legacy_gpu_ids(gpus: _GpusArg, available: Sequence[Any]) -> List[int]:
    """Keras 2.3's rules for `gpus`, with messages that say what to do."""
    names = [str(d) for d in available]
    if gpus is not None and not isinstance(gpus, bool) and (
        gpus == 0 or (isinstance(gpus, (list, tuple, range)) and len(gpus) == 0)
    ):
        gpus = None  # Keras 2.3 reads `if not gpus:` as "every visible GPU"
    if gpus is None:
        count = len(available)
        if count < 2:
            raise bad_value(
                "gpus", None,
                "For multi-gpu usage to be effective, call `multi_gpu_model` with "
                f"`gpus >= 2`; gpus=None means every visible device and this machine "
                f"shows {count}: {names}",
                "train on one device (catch this ValueError, as the Keras docs do), or set "
                "KERASMGPU_VIRTUAL_DEVICES=N to test on N CPU devices",
            )
        return list(range(count))
    if isinstance(gpus, bool) or not isinstance(gpus, (int, list, tuple, range)):
        raise bad_type("gpus", gpus, "an int >= 2 or a list of at least 2 device ids",
                       "pass e.g. gpus=2 or gpus=[0, 1]")
    ids = list(range(gpus)) if isinstance(gpus, int) else list(gpus)
    if len(ids) <= 1:  # an int <= 1 gives at most one id too
        raise bad_value(
            "gpus", gpus,
            "For multi-gpu usage to be effective, call `multi_gpu_model` with `gpus >= 2` "
            "(or a list of at least 2 ids)",
            "use the model itself for one device (the Keras docs catch this ValueError)",
        )
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise bad_type("gpus", gpus, "integer device ids", "pass e.g. gpus=[0, 1]")
    if len(set(ids)) != len(ids):
        raise bad_value("gpus", gpus, "each id once", "remove the duplicate ids")
    expected = [f"/gpu:{i}" for i in ids]
    if any(not 0 <= i < len(available) for i in ids):
        raise bad_value(
            "gpus", gpus,
            f"devices that exist: we expect {expected} to be available, but this machine "
            f"only has {names}",
            "Try reducing `gpus` (or check CUDA_VISIBLE_DEVICES / "
            "KERASMGPU_VIRTUAL_DEVICES)",
        )
    return ids


def multi_gpu_model(model: Any, gpus: _GpusArg = None, cpu_merge: bool = True,
                    cpu_relocation: bool = False) -> Any:
    """Keras 2.3's `multi_gpu_model(model, gpus, cpu_merge, cpu_relocation)`, any Keras.

    Returns a model that splits each batch over the devices; compile and fit it, and
    save the template `model` (it holds the trained weights).
    """
    from kerasmgpu import adapters, api, engines

    _check_flag("cpu_merge", cpu_merge)
    _check_flag("cpu_relocation", cpu_relocation)
    active = registry.active()
    job = cluster.job()
    adapter = adapters.load(active)
    engine = engines.load(active.entry_or_raise())
    try:
        adapters.check_model(model, adapter)
    except ValueError as exc:
        # Legacy code catches ValueError to mean "not enough GPUs, use one": a model of
        # another Keras must not be silently trained on one device that way.
        raise TypeError(str(exc)) from exc
    available = _available(engine, adapter, job)
    ids = _legacy_gpu_ids(gpus, available)
    _migration_hint()
    if engine.slices_in_graph:
        # Keras's own multi_gpu_model (Keras 2.3): built with the caller's cpu_merge and
        # cpu_relocation, which parallelize() does not take.
        from kerasmgpu.engines.multi_gpu_model import MultiGpuModelEngine
        from kerasmgpu.options import Options
        from kerasmgpu.training import verify

        assert isinstance(adapter, keras23.Keras23)
        legacy = MultiGpuModelEngine(adapter, [available[i] for i in ids], cpu_merge=cpu_merge,
                                    cpu_relocation=cpu_relocation, job=job)
        # KERASMGPU_VERIFY=1 turns the self-check on here too (a CI job of legacy code).
        checked = verify.resolve(None, os.environ.get(verify.VERIFY_ENV, ""))
        return legacy.parallelize(model, Options(verify=checked))
    return api.parallelize(model, gpus=ids)


def make_parallel(model: Any, gpu_count: int) -> Any:
    """The keras-extras `make_parallel(model, gpu_count)`, without its two bugs."""
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int):
        raise bad_type("gpu_count", gpu_count, "an int >= 1",
                       "pass the number of GPUs, e.g. make_parallel(model, 2)")
    if gpu_count < 1:
        raise bad_value("gpu_count", gpu_count, "an int >= 1",
                        "pass the number of GPUs, e.g. make_parallel(model, 2)")
    if gpu_count == 1:
        return model
    return multi_gpu_model(model, gpus=gpu_count)


# --- install(): unchanged legacy imports resolve to the drop-in --------------------------

_LEGACY_MODULES = ("multi_gpu_utils", "training_utils")
_installed: List[str] = []


def _shim(name: str) -> types.ModuleType:
    module = types.ModuleType(name, f"kerasmgpu stand-in for {name} (multi_gpu_model only)")
    module.multi_gpu_model = multi_gpu_model  # type: ignore[attr-defined]
    return module


# Where install() keeps Keras's own function, so the multi_gpu_model route (on real
# Keras <= 2.3) still calls Keras's, not the drop-in that now stands in its place.
KERAS_OWN = keras23.KERAS_OWN


def _point_at_drop_in(module: types.ModuleType) -> None:
    current = getattr(module, "multi_gpu_model", None)
    if current is not None and current is not multi_gpu_model and not hasattr(module, KERAS_OWN):
        setattr(module, KERAS_OWN, current)
    module.multi_gpu_model = multi_gpu_model  # type: ignore[attr-defined]


def _patch_utils(utils: types.ModuleType, dotted: str) -> None:
    _point_at_drop_in(utils)
    _installed.append(f"{dotted}.multi_gpu_model")
    for sub in _LEGACY_MODULES:
        full = f"{dotted}.{sub}"
        existing = sys.modules.get(full)
        if existing is None:
            try:
                existing = importlib.import_module(full)
            except ImportError:
                existing = _shim(full)
                sys.modules[full] = existing
        _point_at_drop_in(existing)
        setattr(utils, sub, existing)
        _installed.append(f"{full}.multi_gpu_model")


def install() -> List[str]:
    """Make legacy imports find the drop-in; returns the names now pointing at it.

    After `kerasmgpu.legacy.install()`, `from keras.utils import multi_gpu_model`,
    `keras.utils.multi_gpu_utils.multi_gpu_model`, `keras.utils.training_utils...` and
    `from tensorflow.keras.utils import multi_gpu_model` give
    `kerasmgpu.legacy.multi_gpu_model`. Call it once, before those imports.
    """
    del _installed[:]
    if importlib.util.find_spec("keras") is not None:
        _patch_utils(importlib.import_module("keras.utils"), "keras.utils")
    if versions.tensorflow_version() is not None:
        try:
            tf_utils = importlib.import_module("tensorflow.keras.utils")
        except ImportError:
            tf_utils = None
        if tf_utils is not None:
            _patch_utils(tf_utils, "tensorflow.keras.utils")
    if not _installed:
        raise bad_value("keras", "no Keras installed", "keras or tensorflow",
                        'install one, e.g. `pip install "kerasmgpu[tensorflow]"`')
    return list(_installed)


def installed() -> Optional[List[str]]:
    """What `install()` patched, or None if it was not called."""
    return list(_installed) or None
