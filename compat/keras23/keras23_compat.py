"""Runtime patches that let standalone Keras 2.3.1 run on TensorFlow 2.15 / Python 3.11.

Keras 2.3.1 (Oct 2019) was written for TF 1.14-2.0 and Python <= 3.8. The `keras23`
test env runs it on TensorFlow 2.15.1 (the oldest TF with Python 3.11 wheels), which
needs the patches below, applied just before `keras` is first imported. They are test
infrastructure for the legacy route, not part of kerasmgpu: a user on a real Keras 2.3
stack (TF 1.x/2.0-2.3, Python <= 3.8) needs none of them.

Each patch says why it exists. All of them can go when the project stops testing
Keras 2.3 on a TF that has dropped what Keras 2.3 uses (i.e. when `keras23` leaves the
tox matrix).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any, Optional, Sequence

_applied = False


def _collections_aliases() -> None:
    # Why: Python 3.10 removed the ABC aliases from `collections`; Keras 2.3 uses
    # `collections.Mapping`, `.Sequence`, `.Container` (engine/training_utils.py).
    import collections
    import collections.abc

    for name in ("Mapping", "MutableMapping", "Sequence", "MutableSequence", "Iterable",
                 "Iterator", "Container", "Callable", "Set", "MutableSet", "Hashable",
                 "Sized", "Generator"):
        if not hasattr(collections, name):
            setattr(collections, name, getattr(collections.abc, name))


def _tensorflow() -> None:
    import tensorflow as tf
    from tensorflow.python.framework import ops, tensor_util

    # Why: Keras 2.3 builds graphs with placeholders and sessions; on TF 2.x it must
    # run in graph mode (eager execution off) before any op is created.
    tf.compat.v1.disable_eager_execution()

    # Why: in TF >= 2.6 `tf.keras` is the separate `keras` package - here that is
    # Keras 2.3.1 itself, so `tf.keras` would import Keras 2.3 from inside Keras 2.3
    # (circular import). Keras 2.3 only wants TF's own Keras classes (e.g.
    # `tf.keras.metrics.MeanIoU`), which TF still ships as `tensorflow.python.keras`.
    import tensorflow.python.keras as tf_internal_keras
    import tensorflow.python.keras.metrics

    tf.keras = tf_internal_keras

    # Why: TF 2.4 removed `ops._TensorLike` and `ops.is_dense_tensor_like`, which
    # Keras 2.3's `K.is_tensor` calls.
    if not hasattr(ops, "_TensorLike"):
        ops._TensorLike = (tf.Tensor,)
    if not hasattr(ops, "is_dense_tensor_like"):
        ops.is_dense_tensor_like = tensor_util.is_tf_type

    # Why: TF 2.1 removed `tf.config.experimental_list_devices`, which Keras 2.3 uses
    # to find GPUs for `multi_gpu_model`. On a CPU-only machine with
    # KERASMGPU_VIRTUAL_DEVICES=n we also list n GPUs, so that multi_gpu_model's device
    # check passes and its slicing and merging run for real; the session's soft
    # placement (on in Keras 2.3's default session config) puts those ops on the CPU.
    def experimental_list_devices() -> Sequence[str]:
        names = [d.name for d in tf.config.list_logical_devices()]
        if not any("GPU" in n.upper() for n in names):
            count = int(os.environ.get("KERASMGPU_VIRTUAL_DEVICES", "0") or 0)
            names += [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(count)]
        return names

    tf.config.experimental_list_devices = experimental_list_devices


def _keras_graph_mode() -> None:
    # Why: Keras 2.3's `K.get_value` calls `.numpy()` whenever TF is not 1.x - it
    # assumed eager TF 2.0 - so in graph mode (see above) `optimizer.get_config()` and
    # therefore `model.save()` fail. TF's own Keras backend reads a variable through
    # the session in graph mode, and Keras 2.3 already shares that session.
    import keras.backend as K
    import keras.backend.tensorflow_backend as tfb
    from tensorflow.python.keras import backend as tf_keras_backend

    K.get_value = tfb.get_value = tf_keras_backend.get_value


def _h5py3_strings() -> None:
    # Why: h5py >= 3 returns scalar string attributes as `str` where h5py 2 returned
    # bytes; Keras 2.3.1's `load_model` calls `.decode('utf-8')` on them
    # (model_config, training_config, keras_version, backend). h5py 2 has no Python
    # 3.11 wheels, so give Keras the bytes it expects.
    from keras.utils import io_utils

    original = io_utils.H5Dict.__getitem__

    def __getitem__(self: Any, attr: Any) -> Any:
        val = original(self, attr)
        if isinstance(val, str) and not isinstance(self.data, dict):
            return val.encode("utf-8")
        return val

    io_utils.H5Dict.__getitem__ = __getitem__


def apply() -> None:
    """The patches TF and Python need before Keras 2.3 is imported."""
    global _applied
    if _applied:
        return
    _applied = True
    _collections_aliases()
    _tensorflow()


class _AroundKeras(importlib.abc.MetaPathFinder):
    """Patches TF before `keras` first imports, and Keras 2.3 right after it has."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[Any]:
        if fullname != "keras":
            return None
        tf = sys.modules.get("tensorflow")
        if tf is not None and getattr(getattr(tf, "__spec__", None), "_initializing", False):
            # TensorFlow probing for `keras` while it imports (`import tensorflow` before
            # `import keras`): patch on Keras's own import, once TF is complete.
            return None
        sys.meta_path.remove(self)
        apply()
        spec = importlib.util.find_spec("keras")
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            _keras_graph_mode()
            _h5py3_strings()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    if not any(isinstance(f, _AroundKeras) for f in sys.meta_path):
        sys.meta_path.insert(0, _AroundKeras())
