"""Standalone Keras <= 2.3 (and tf.keras on TF < 2.4): the internals kerasmgpu touches.

Verified on keras 2.3.1 over TensorFlow 2.15.1 with the runtime patches of
`keras23_runtime` (`import kerasmgpu.keras23`).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Dict, Iterator, List

from kerasmgpu.adapters import tensorflow as tf_internals
from kerasmgpu.adapters.base import Adapter, StateReader
from kerasmgpu.adapters.keras23_names import (  # noqa: F401 - re-exported
    GONE_MODULES,
    KERAS_PACKAGE_ALIASES,
    MULTI_GPU_MODEL_MODULES,
    TF_ROOTS,
)
from kerasmgpu.env.versions import LEGACY_KERAS_MIN, LEGACY_KERAS_VERIFIED_BELOW

# Where `kerasmgpu.legacy.install()` keeps Keras's own `multi_gpu_model` once the
# drop-in stands in its place, so that the multi_gpu_model engine still calls Keras's.
KERAS_OWN = "_kerasmgpu_keras_multi_gpu_model"
# The name scope of the graph ops that read the change tokens of a model's variables
# (placed where those variables live).
TOKENS_SCOPE = "kerasmgpu_change_tokens"


class Keras23(Adapter):
    """What the multi_gpu_model engine needs of Keras 2.3: its own multi_gpu_model.

    Read here: `keras.utils.multi_gpu_utils` and its `_get_available_devices` (its
    device check, shown GPU names while virtual CPU devices stand in), the compile
    arguments Keras 2.3 keeps on the model (`_is_compiled`, `_compile_metrics`,
    `_compile_weighted_metrics`), and the session of `tensorflow.python.keras.backend`
    (where Keras 2.3 runs on TensorFlow 2) to read the change tokens.
    """

    VERIFIED = (LEGACY_KERAS_MIN, LEGACY_KERAS_VERIFIED_BELOW)
    LABEL = "Keras"
    DIST = "keras"

    def is_compiled(self, model: Any) -> bool:
        return bool(getattr(model, "_is_compiled", False) or getattr(model, "optimizer", None))

    def multi_gpu_utils(self) -> Any:
        root = self.keras.__name__  # "keras", or "tensorflow.keras" on TF < 2.4
        return importlib.import_module(f"{root}.utils.multi_gpu_utils")

    def keras_multi_gpu_model(self) -> Any:
        """Keras's own function, also after `kerasmgpu.legacy.install()` replaced it."""
        utils = self.multi_gpu_utils()
        return getattr(utils, KERAS_OWN, utils.multi_gpu_model)

    @contextlib.contextmanager
    def shown_gpu_names(self, names: List[str]) -> Iterator[None]:
        """Keras 2.3's device check only accepts "/gpu:N": show it these names."""
        utils = self.multi_gpu_utils()
        original = getattr(utils, "_get_available_devices", None)
        if original is None:
            raise self.fail("`multi_gpu_utils._get_available_devices` is missing",
                            "the device check multi_gpu_model runs")
        utils._get_available_devices = lambda: names
        try:
            yield
        finally:
            utils._get_available_devices = original

    def compile_args(self, model: Any) -> Dict[str, Any]:
        """Keras 2.3 keeps its compile arguments on the model; a fresh optimizer each."""
        return {
            "optimizer": self.fresh_optimizer(model.optimizer),
            "loss": model.loss,
            "metrics": list(getattr(model, "_compile_metrics", None) or []),
            "loss_weights": model.loss_weights,
            "sample_weight_mode": model.sample_weight_mode,
            "weighted_metrics": getattr(model, "_compile_weighted_metrics", None),
        }

    # --- the training state: graph mode, read through Keras's session ---------------------

    def state_reader(self, variables: List[Any]) -> StateReader:
        """The variables' hashes, from ops added once to Keras's graph."""
        import tensorflow as tf

        if not variables:
            return lambda: []
        # The session Keras 2.3 runs in on TensorFlow 2: TensorFlow's internal Keras
        # backend's (Keras 2.3's own get_session refuses to run on TensorFlow 2).
        session = importlib.import_module("tensorflow.python.keras.backend").get_session
        with session().graph.as_default(), tf.name_scope(TOKENS_SCOPE):
            hashes = tf.stack([tf_internals.bits_hash(tf, tf.convert_to_tensor(v))
                               for v in variables])
        return lambda: [int(h) for h in session().run(hashes)]

    def read_values(self, variables: List[Any]) -> List[Any]:
        return list(self.keras.backend.batch_get_value(list(variables)))

    def write_values(self, variables: List[Any], values: List[Any]) -> None:
        self.keras.backend.batch_set_value(list(zip(variables, values)))
