"""A handle on the active Keras: its module, whether it is Keras 3, and small ops.

The data-parallel machinery is the same on every line; what differs is the Keras
namespace (`keras` 3, `tf.keras` 2.x, `tf_keras`) and the tensor ops (keras.ops on
Keras 3, TensorFlow on Keras 2). Reading Keras internals that moved between releases
happens in this module, each with the release it was checked against.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple

from kerasmgpu._errors import bad_type, bad_value
from kerasmgpu.env.versions import KerasLine


@dataclass(frozen=True)
class Family:
    line: KerasLine
    keras: ModuleType
    backend: str

    @property
    def keras3(self) -> bool:
        return self.line is KerasLine.KERAS_3

    @property
    def peeks_before_each_run(self) -> bool:
        """Keras 3 on TF pulls a batch from a throw-away iterator before fit/evaluate
        when a strategy is active (`TensorFlowTrainer._maybe_symbolic_build`)."""
        return self.keras3 and self.backend == "tensorflow"

    # --- tensor ops, the few the step overrides need ---------------------------------
    @functools.cached_property
    def _tf(self) -> Any:
        return importlib.import_module("tensorflow")

    def stop_gradient(self, x: Any) -> Any:
        if self.keras3:
            return self.keras.ops.stop_gradient(x)
        return self._tf.stop_gradient(x)

    def cast(self, x: Any, dtype: Any) -> Any:
        if self.keras3:
            return self.keras.ops.cast(x, dtype)
        return self._tf.cast(x, dtype)

    def rows(self, x: Any) -> Any:
        """Batch dimension of `x` (a static int when known, else a tensor)."""
        if self.keras3:
            return self.keras.ops.shape(x)[0]
        return self._tf.shape(x)[0]

    # --- Keras objects --------------------------------------------------------------------
    @property
    def Model(self) -> type:
        model_class: type = self.keras.Model
        return model_class

    def is_model(self, obj: Any) -> bool:
        return isinstance(obj, self.keras.Model)


def load(line: KerasLine, backend: str) -> Family:
    if line is KerasLine.KERAS_3:
        module = importlib.import_module("keras")
    elif line is KerasLine.TF_KERAS_LEGACY:
        module = importlib.import_module("tf_keras")
    elif line is KerasLine.TF_KERAS:
        module = importlib.import_module("tensorflow").keras
    elif line is KerasLine.LEGACY:
        # Standalone Keras 2.3, or tf.keras itself on TF < 2.4 (no `keras` package).
        if importlib.util.find_spec("keras") is not None:
            module = importlib.import_module("keras")
        else:
            module = importlib.import_module("tensorflow").keras
    else:
        raise bad_value(
            "keras",
            "no Keras installed",
            "standalone Keras <= 2.3, tf.keras 2.x, tf_keras, or Keras 3",
            'install one, e.g. `pip install "kerasmgpu[tensorflow]"`',
        )
    return Family(line, module, backend)


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


def check_model(model: Any, family: Family) -> None:
    """Raise before anything is touched if `model` is not a model of the active Keras."""
    if family.is_model(model):
        return
    origin = model_origin(model)
    active = f"{family.line.value} ({getattr(family.keras, '__version__', '?')})"
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


# --- Compile arguments ----------------------------------------------------------------------

COMPILE_KEYS = (
    "optimizer",
    "loss",
    "loss_weights",
    "metrics",
    "weighted_metrics",
    "run_eagerly",
    "steps_per_execution",
    "jit_compile",
)


def is_compiled(model: Any) -> bool:
    # Keras 3: `compiled`; tf.keras 2.x / tf_keras: `_is_compiled`.
    return bool(getattr(model, "compiled", False) or getattr(model, "_is_compiled", False))


def compile_args(model: Any) -> Dict[str, Any]:
    """The arguments `model.compile()` was called with, as live objects.

    Keras 3 and tf.keras >= 2.13 keep them in `model._compile_config.config`; older
    tf.keras releases only keep them on the loss and metrics containers.
    """
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if isinstance(config, dict):
        args = {k: v for k, v in config.items() if k in COMPILE_KEYS}
    else:  # tf.keras 2.9-2.12
        args = {
            "optimizer": model.optimizer,
            "loss": getattr(getattr(model, "compiled_loss", None), "_user_losses", None),
            "loss_weights": getattr(
                getattr(model, "compiled_loss", None), "_user_loss_weights", None
            ),
            "metrics": getattr(getattr(model, "compiled_metrics", None), "_user_metrics", None),
            "weighted_metrics": getattr(
                getattr(model, "compiled_metrics", None), "_user_weighted_metrics", None
            ),
        }
    args["optimizer"] = getattr(model, "optimizer", None) or args.get("optimizer")
    for key in ("run_eagerly", "jit_compile"):
        private = getattr(model, "_" + key, None)
        if private is not None:
            args.setdefault(key, private)
    return args


def fresh_optimizer(family: Family, optimizer: Any) -> Any:
    """A new optimizer with the same configuration, to be built inside the scope.

    An optimizer's variables belong to the device layout it was built under; Keras 3
    on JAX fails with "Received incompatible devices ... sgd/iteration" when one created
    outside a `DataParallel` scope is reused, so we always re-create it from config.
    """
    if optimizer is None:
        return None
    if isinstance(optimizer, str):
        return family.keras.optimizers.get(optimizer)
    try:
        return type(optimizer).from_config(optimizer.get_config())
    except Exception as exc:
        raise bad_type(
            "optimizer",
            optimizer,
            "an optimizer that round-trips through get_config()/from_config()",
            "give your optimizer a get_config() that from_config() accepts, or build and "
            "compile the model inside `with kerasmgpu.scope():`",
        ) from exc


def optimizer_variables(optimizer: Any) -> List[Any]:
    variables = getattr(optimizer, "variables", None)
    if callable(variables):  # tf.keras 2.x optimizers expose it as a method
        variables = variables()
    return list(variables or [])


def fresh_metric(family: Family, metric: Any) -> Any:
    """Metric objects hold state; the replica gets its own copy, strings stay strings."""
    if isinstance(metric, family.keras.metrics.Metric):
        return type(metric).from_config(metric.get_config())
    return metric


def map_leaves(fn: Any, structure: Any) -> Any:
    """Apply `fn` to the leaves of a loss/metrics structure (lists, tuples, dicts)."""
    if isinstance(structure, dict):
        return {k: map_leaves(fn, v) for k, v in structure.items()}
    if isinstance(structure, (list, tuple)):
        return type(structure)(map_leaves(fn, v) for v in structure)
    return fn(structure)


def clone_model(family: Family, model: Any) -> Any:
    """A structural copy of `model`, built like it (weights are copied by the caller)."""
    try:
        clone = family.keras.models.clone_model(model)
        if len(clone.weights) != len(model.weights) and model.weights:
            # A subclassed model rebuilt from its config has no weights until it is
            # built; build it for the shapes the original was built for.
            clone.build_from_config(model.get_build_config())
        if len(clone.weights) != len(model.weights):
            raise ValueError(
                f"the copy has {len(clone.weights)} weights, the model {len(model.weights)}"
            )
        return clone
    except (NotImplementedError, TypeError, ValueError, AttributeError) as exc:
        raise bad_type(
            "model",
            f"a subclassed model that cannot be cloned ({type(model).__qualname__}: {exc})",
            "a Sequential or functional model, or a subclassed model whose get_config() "
            "and from_config() rebuild it",
            "build and compile it inside `with kerasmgpu.scope():` and pass it to "
            "parallelize() (no copy is made then), or implement get_config()",
            raw=True,
        ) from exc
