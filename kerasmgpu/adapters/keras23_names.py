"""Module names of Keras <= 2.3 and tf.keras <= 2.3 that `kerasmgpu migrate` recognises in
a user's source: names only. This module imports nothing, so the codemod runs where only
libcst is installed (no numpy, no framework); `adapters/keras23.py` re-exports it.

Verified against keras 2.3.1 and TensorFlow 1.15-2.3's module layout.
"""

from __future__ import annotations

# --- Where multi_gpu_model lived: the module names `kerasmgpu migrate` recognises in a
# user's source (names only; nothing here imports those modules) ----------------------
# Every module that ever exported multi_gpu_model: Keras 2.0.x (training_utils), Keras 2.1+
# (utils, utils.multi_gpu_utils) and tf.keras up to 2.3: the public path, its compat.v1/v2
# aliases, the generated `_api.v1`/`_api.v2` packages they resolve to, and the private
# python.keras modules, each also under `tensorflow_core` (TF 1.15-2.1, where IDEs
# auto-imported from). Code that spells out any of them still imports on TF <= 2.3.
TF_ROOTS = ("tensorflow", "tensorflow_core")
MULTI_GPU_MODEL_MODULES = frozenset(
    {"keras.utils", "keras.utils.multi_gpu_utils", "keras.utils.training_utils"}
    | {
        f"{root}{api}{compat}.keras.utils"
        for root in TF_ROOTS
        for api in ("", "._api.v1", "._api.v2")
        for compat in ("", ".compat.v1", ".compat.v2")
    }
    | {f"{root}.python.keras.utils{sub}" for root in TF_ROOTS for sub in ("", ".multi_gpu_utils")}
)
# Modules that held multi_gpu_model and nothing a user still needs; importing them fails on
# TF >= 2.4 and Keras 3, so an import of them left behind by the rewrite is advised.
GONE_MODULES = frozenset(
    {
        "keras.utils.multi_gpu_utils",
        "keras.utils.training_utils",
        "tensorflow.python.keras.utils.multi_gpu_utils",
    }
)

# Every spelling of the Keras 2 package a user's source can import from: standalone
# Keras, tf_keras, and tf.keras through its public path, the compat aliases, the generated
# `_api` packages and the private python.keras modules (also under `tensorflow_core`,
# TF 1.15-2.1). `kerasmgpu migrate` reads `tf.keras.layers.Dense` as `keras.layers.Dense`.
KERAS_PACKAGE_ALIASES = (
    "keras",
    "tf_keras",
    *(
        f"{root}{api}{compat}.keras"
        for root in TF_ROOTS
        for api in ("", "._api.v1", "._api.v2")
        for compat in ("", ".compat.v1", ".compat.v2")
    ),
    *(f"{root}.python.keras" for root in TF_ROOTS),
)
