"""Adapters: the one place that knows each Keras line's internals.

`load(active)` returns the adapter of the active Keras (`registry.active()`, handed
in) - one `keras3.Keras3` subclass per backend (`keras3_tensorflow.Keras3TensorFlow`,
`keras3_jax.Keras3Jax`, `keras3_torch.Keras3Torch`), `tfkeras2.TfKeras2` (tf.keras 2.x
and tf_keras) or `keras23.Keras23`, as its registry entry names it; `check_release` checks the release
against the range that entry is verified on. Everything above this package (feeds,
training hooks, engines) goes through an adapter; a test (tests/test_layers.py) fails if
a private name of Keras, TF or JAX appears elsewhere.
`tensorflow.py` holds tf.distribute's internals, shared by the TF-backed lines.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Type

from kerasmgpu import registry
from kerasmgpu._errors import bad_type, bad_value
from kerasmgpu.adapters.base import Adapter, InternalsChanged
from kerasmgpu.registry import Active

__all__ = ["Adapter", "InternalsChanged", "load", "check_model", "model_origin"]


def load(active: Active) -> Adapter:
    """The adapter of the active Keras (imports it): the class its registry entry names."""
    entry = active.entry_or_raise()
    adapter: Type[Adapter] = registry.resolve(entry.adapter)
    return adapter(active.line, registry.keras_module(entry), active.backend, active.version)


def check_release(active: Active) -> None:
    """Refuse a release outside the verified range, saying what to install."""
    line, version, backend = active.line, active.version, active.backend
    why = registry.unsupported_version(line, version, backend)
    if why is None:
        return
    span = registry.verified_range(line, backend)
    allowed = (f"{line.value} {span[0]} to below {span[1]}" if span else "a verified release")
    raise bad_value(
        "keras", why, allowed + " (the releases kerasmgpu's test matrix runs)",
        "install a verified release (see the README's tested versions), e.g. "
        + _pin_hint(active.entry, span),
        raw=True,
    )


def check_multi_process(active: Active) -> None:
    """Refuse a release that trains on one process but not on several."""
    line, version, backend = active.line, active.version, active.backend
    floor = registry.below_multi_process_floor(line, version, backend)
    if floor is None:
        return
    below = registry.verified_range(line, backend)
    raise bad_value(
        "keras", f"{line.value} {version} on {backend} in a job of several processes",
        f"{line.value} {floor} or later for several processes (one process: any verified "
        "release)",
        "install a newer Keras, e.g. "
        + _pin_hint(active.entry, (floor, below[1] if below else floor))
        + ", or run one process per machine",
        raw=True,
    )


def _pin_hint(entry: Optional[registry.Entry], span: Optional[Tuple[Any, Any]]) -> str:
    if span is None or entry is None:
        return "`pip install -U keras`"
    return f'`pip install "{entry.dist}>={span[0]},<{span[1]}"`'


# --- Which Keras a model belongs to ------------------------------------------------------

# Module prefixes of each line's model classes, most specific first.
_MODEL_ORIGINS: Tuple[Tuple[str, str], ...] = (
    ("tf_keras.", "tf_keras (Keras 2, TF_USE_LEGACY_KERAS=1)"),
    ("tensorflow.python.keras.", "TensorFlow's internal tf.keras (TF <= 2.5)"),
    ("keras.src.models.", "Keras 3"),
    ("keras.src.engine.", "tf.keras 2.13-2.15 (the `keras` 2.x package)"),
    ("keras.engine.", "tf.keras 2.4-2.12 or standalone Keras <= 2.3"),
    ("keras.models.", "Keras (unknown line)"),
)


def model_origin(model: Any) -> Optional[str]:
    for klass in type(model).__mro__:
        module = getattr(klass, "__module__", "") or ""
        for prefix, name in _MODEL_ORIGINS:
            if module.startswith(prefix):
                return name
    return None


def check_model(model: Any, adapter: Adapter) -> None:
    """Raise before anything is touched if `model` is not a model of the active Keras."""
    if adapter.is_model(model):
        return
    origin = model_origin(model)
    active = f"{adapter.line.value} ({getattr(adapter.keras, '__version__', '?')})"
    if origin is None:
        raise bad_type(
            "model",
            f"an object of type {type(model).__module__}.{type(model).__qualname__}",
            f"a Keras model of the active Keras, {active}",
            "pass the keras.Model (Sequential, functional or subclassed) you want to train",
            raw=True,
        )
    raise bad_value(
        "model",
        f"a model built with {origin} ({type(model).__module__}.{type(model).__qualname__})",
        f"a model of the active Keras, {active}",
        "build the model with the same Keras that kerasmgpu detects (check "
        "TF_USE_LEGACY_KERAS and KERAS_BACKEND, or run `kerasmgpu doctor`)",
        raw=True,
    )
