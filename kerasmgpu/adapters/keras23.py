"""Standalone Keras <= 2.3 (and tf.keras on TF < 2.4): the internals kerasmgpu touches.

Verified on keras 2.3.1 over TensorFlow 2.15.1 with the runtime patches of
`keras23_runtime` (`import kerasmgpu.keras23`).
"""

from __future__ import annotations

# Where `kerasmgpu.legacy.install()` keeps Keras's own `multi_gpu_model` once the
# drop-in stands in its place, so that the multi_gpu_model engine still calls Keras's.
KERAS_OWN = "_kerasmgpu_keras_multi_gpu_model"
