"""The runtime patches that let standalone Keras 2.3.1 run on a modern TensorFlow and Python.

Public entry: `import kerasmgpu.keras23` (before `import keras`). Keras 2.3.1 (Oct 2019)
was written for TensorFlow 1.14-2.0 and Python <= 3.8; kerasmgpu needs Python >= 3.9,
and the TensorFlow releases built for it have dropped or changed what Keras 2.3 uses.
Each patch below says why it exists and what it touches; all of them are private
TensorFlow/Keras names, which is why they live with the Keras 2.3 adapter.

Verified on: keras 2.3.1, tensorflow 2.15.1, numpy 1.26.4, h5py 3.16.0, Python 3.11
(`env.versions.KERAS23_VERIFIED`; the `keras23` tox env). Another TensorFlow release
gets a warning, a missing internal a `Keras23RuntimeError` naming it - never a silently
different model.

Until when: every patch goes when kerasmgpu drops Keras 2.3 (the `keras23` tox env
leaves the matrix and the Routes table loses its Keras 2.3 row). None of them is
needed, or applied, on any other Keras line.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
import threading
import warnings
from typing import Any, Optional, Sequence

from packaging.version import Version

from kerasmgpu._errors import TooLateError, explain
from kerasmgpu.env import versions

_lock = threading.Lock()
_tf_patched = False
_keras_patched = False

INSTALL = (
    "pip install tensorflow==2.15.1 numpy==1.26.4 keras-applications==1.0.8 "
    "keras-preprocessing==1.1.2 pyyaml scipy h5py && pip install --no-deps keras==2.3.1"
)


class Keras23RuntimeError(ImportError):
    """Keras 2.3.1 cannot be made to run here (a missing TensorFlow internal, or the
    wrong Keras installed)."""


def patched() -> bool:
    """Whether Keras 2.3 was imported with the patches (TensorFlow's and Keras's)."""
    return _tf_patched and _keras_patched


# --- TensorFlow and Python, before `import keras` ----------------------------------------


def _collections_aliases() -> None:
    # Why: Python 3.10 removed the ABC aliases from `collections`; Keras 2.3 uses
    # `collections.Mapping`, `.Sequence`, `.Container` (engine/training_utils.py).
    # Guard: only names Python no longer has are added.
    import collections
    import collections.abc

    for name in ("Mapping", "MutableMapping", "Sequence", "MutableSequence", "Iterable",
                 "Iterator", "Container", "Callable", "Set", "MutableSet", "Hashable",
                 "Sized", "Generator"):
        if not hasattr(collections, name):
            setattr(collections, name, getattr(collections.abc, name))


def _missing(what: str, tf_version: Any) -> Keras23RuntimeError:
    return Keras23RuntimeError(explain(
        "tensorflow", f"{tf_version} (it has no {what})",
        f"a TensorFlow that still has what Keras 2.3 uses; verified: tensorflow "
        f"{versions.KERAS23_VERIFIED['tensorflow']}",
        f"pip install tensorflow=={versions.KERAS23_VERIFIED['tensorflow']}", raw=True,
    ))


def _tensorflow() -> None:
    import tensorflow as tf
    from tensorflow.python.framework import ops, tensor_util

    # Why: Keras 2.3 builds graphs with placeholders and sessions; on TF 2.x it must
    # run in graph mode (eager execution off) before any op is created.
    if not hasattr(tf.compat.v1, "disable_eager_execution"):
        raise _missing("tf.compat.v1.disable_eager_execution", tf.__version__)
    tf.compat.v1.disable_eager_execution()
    # Why: in graph mode a recurrent layer's loop is a v2 `while` whose gradient,
    # built later by the optimizer, needs the loop's intermediate values as outputs;
    # TF keeps them only when asked before the loop is built (otherwise training any
    # RNN fails: "Connecting to invalid output 11 of source node lstm_1/while ... Try
    # using tf.compat.v1.experimental.output_all_intermediates(True)"). TF's own
    # graph-mode Keras does the same for its layers.
    if not hasattr(tf.compat.v1.experimental, "output_all_intermediates"):
        raise _missing("tf.compat.v1.experimental.output_all_intermediates", tf.__version__)
    tf.compat.v1.experimental.output_all_intermediates(True)

    # Why: in TF >= 2.6 `tf.keras` is the separate `keras` package - here that is
    # Keras 2.3.1 itself, so `tf.keras` would import Keras 2.3 from inside Keras 2.3
    # (circular import). Keras 2.3 only wants TF's own Keras classes (e.g.
    # `tf.keras.metrics.MeanIoU`), which TF still ships as `tensorflow.python.keras`.
    try:
        import tensorflow.python.keras as tf_internal_keras

        # Keras 2.3's metrics subclass `tf.keras.metrics.MeanIoU` at import: load it.
        import tensorflow.python.keras.metrics
    except ImportError:
        raise _missing("tensorflow.python.keras", tf.__version__) from None
    tf.keras = tf_internal_keras

    # Why: TF 2.4 removed `ops._TensorLike` and `ops.is_dense_tensor_like`, which
    # Keras 2.3's `K.is_tensor` calls. Guard: only when missing.
    if not hasattr(ops, "_TensorLike"):
        ops._TensorLike = (tf.Tensor,)
    if not hasattr(ops, "is_dense_tensor_like"):
        ops.is_dense_tensor_like = tensor_util.is_tf_type

    # Why: TF 2.1 removed `tf.config.experimental_list_devices`, which Keras 2.3 uses
    # to find GPUs for `multi_gpu_model`. With kerasmgpu's virtual devices on a machine
    # without GPUs (KERASMGPU_VIRTUAL_DEVICES=n) it also lists n GPUs, as virtual
    # devices stand in for GPUs everywhere in kerasmgpu: Keras's own multi_gpu_model
    # then passes its device check, and the session's soft placement (on in Keras 2.3's
    # default session config) runs those ops on the CPU devices.
    if not hasattr(tf.config, "experimental_list_devices"):
        def experimental_list_devices() -> Sequence[str]:
            names = [d.name for d in tf.config.list_logical_devices()]
            if not any("GPU" in n.upper() for n in names):
                names += [f"/job:localhost/replica:0/task:0/device:GPU:{i}"
                          for i in range(_virtual_count())]
            return names

        tf.config.experimental_list_devices = experimental_list_devices


def _virtual_count() -> int:
    from kerasmgpu.env import devices

    try:
        return devices.requested() or 0
    except (TypeError, ValueError):  # a malformed variable: `kerasmgpu doctor` says so
        return 0


# --- Keras 2.3, right after it is imported ------------------------------------------------


def _keras_graph_mode() -> None:
    # Why: Keras 2.3's `K.get_value` calls `.numpy()` whenever TF is not 1.x - it
    # assumed eager TF 2.0 - so in graph mode (see above) `optimizer.get_config()` and
    # therefore `model.save()` fail. TF's own Keras backend reads a variable through
    # the session in graph mode, and Keras 2.3 already shares that session.
    import keras.backend as K
    import keras.backend.tensorflow_backend as tfb
    from tensorflow.python.keras import backend as tf_keras_backend

    K.get_value = tfb.get_value = tf_keras_backend.get_value


def _keras_eager_scopes() -> None:
    # Why: Keras 2.3 runs a few functions under `@K.eager`, which on TF 2 enters
    # `context.eager_mode()` (it assumed eager TF 2.0, whose variables were eager too).
    # In graph mode (see above) that breaks them: an initial value computed eagerly
    # cannot initialize a graph variable ("Attempting to capture an EagerTensor without
    # building a function") - every LSTM and ConvLSTM2D (`unit_forget_bias`, the
    # default) and the `Identity` initializer failed to build - and a graph variable
    # cannot be read or assigned eagerly ("... is out of scope"): `layer.get_weights()`
    # and `layer.set_weights()` failed. They run in the graph instead: `K.eager` is
    # looked up when LSTMCell/ConvLSTM2DCell.build runs, and the methods wrapped at
    # import get their original back (`functools.wraps` keeps it as `__wrapped__`).
    import keras.backend as K
    import keras.backend.tensorflow_backend as tfb
    from keras import initializers
    from keras.engine import base_layer

    def eager(func: Any) -> Any:
        return func

    K.eager = tfb.eager = eager
    for owner, name in ((initializers.Identity, "__call__"), (base_layer.Layer, "get_weights"),
                        (base_layer.Layer, "set_weights")):
        method = getattr(owner, name)
        setattr(owner, name, getattr(method, "__wrapped__", method))


def _as_h5py2(value: Any) -> Any:
    """A string attribute as h5py 2 read it: bytes, or an array of bytes."""
    if isinstance(value, str):
        return value.encode("utf-8")
    dtype = getattr(value, "dtype", None)
    if dtype is not None and dtype.kind in "OU" and getattr(value, "ndim", 0) == 1:
        import numpy as np

        items = value.tolist()
        if items and all(isinstance(v, str) for v in items):
            return np.array([v.encode("utf-8") for v in items])
    return value


class _H5py2Attrs:
    """An h5py group's `.attrs`, read the h5py 2 way (see _h5py3_strings)."""

    def __init__(self, attrs: Any) -> None:
        self._attrs = attrs

    def __getitem__(self, name: str) -> Any:
        return _as_h5py2(self._attrs[name])

    def __contains__(self, name: object) -> bool:
        return name in self._attrs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._attrs, name)


class _H5py2Group:
    """An h5py group (or file) whose attributes and subgroups read the h5py 2 way."""

    def __init__(self, group: Any) -> None:
        self._group = group

    @property
    def attrs(self) -> _H5py2Attrs:
        return _H5py2Attrs(self._group.attrs)

    def __getitem__(self, key: str) -> Any:
        import h5py

        item = self._group[key]
        return _H5py2Group(item) if isinstance(item, h5py.Group) else item

    def __contains__(self, key: object) -> bool:
        return key in self._group

    def __iter__(self) -> Any:
        return iter(self._group)

    def __len__(self) -> int:
        return len(self._group)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)


def _h5py3_strings() -> None:
    # Why: h5py >= 3 returns string attributes as `str` (or arrays of `str`) where
    # h5py 2 returned bytes, and Keras 2.3.1 calls `.decode('utf8')` on them: in
    # `load_model` (model_config, training_config, keras_version, backend, the
    # optimizer's weight names) and in `load_weights` (keras_version, backend, layer
    # and weight names). h5py 2 has no wheels for Python >= 3.10, so give Keras the
    # bytes it expects: `H5Dict` (load_model's reader) converts what it returns, and
    # the readers `load_weights` uses get the file through `_H5py2Group`. Guard:
    # h5py >= 3 only. Writing is unchanged (Keras 2.3 writes bytes; files stay
    # readable by Keras 2.3 anywhere).
    h5py = versions.dist_version("h5py")
    if h5py is None or h5py.major < 3:
        return
    from keras.engine import saving
    from keras.utils import io_utils

    original = io_utils.H5Dict.__getitem__

    def __getitem__(self: Any, attr: Any) -> Any:
        val = original(self, attr)
        if not isinstance(self.data, dict):
            return _as_h5py2(val)
        return val

    io_utils.H5Dict.__getitem__ = __getitem__

    for name in ("load_attributes_from_hdf5_group", "load_weights_from_hdf5_group",
                 "load_weights_from_hdf5_group_by_name"):
        reader = getattr(saving, name)

        def read(group: Any, *args: Any, __reader: Any = reader, **kwargs: Any) -> Any:
            if not isinstance(group, _H5py2Group):
                group = _H5py2Group(group)
            return __reader(group, *args, **kwargs)

        setattr(saving, name, read)


# --- Installing ------------------------------------------------------------------------


def _patch_tensorflow() -> None:
    global _tf_patched
    with _lock:
        if _tf_patched:
            return
        _collections_aliases()
        _tensorflow()
        _tf_patched = True


def _patch_keras() -> None:
    global _keras_patched
    with _lock:
        if _keras_patched:
            return
        _keras_graph_mode()
        _keras_eager_scopes()
        _h5py3_strings()
        _keras_patched = True


class _AroundKeras(importlib.abc.MetaPathFinder):
    """Patches TF before `keras` first imports, and Keras 2.3 right after it has.

    It stays on `sys.meta_path` until Keras 2.3 has been imported and patched: a
    `find_spec("keras")` that imports nothing (kerasmgpu asks it to tell Keras 2.3
    from tf.keras) must not use it up.
    """

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[Any]:
        if fullname != "keras":
            return None
        tf = sys.modules.get("tensorflow")
        if tf is not None and getattr(getattr(tf, "__spec__", None), "_initializing", False):
            # TensorFlow probing for `keras` while it imports (`import tensorflow` before
            # `import keras`): patch on Keras's own import, once TF is complete.
            return None
        _patch_tensorflow()
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            _patch_keras()
            with contextlib.suppress(ValueError):  # another thread got there first
                sys.meta_path.remove(self)

        spec.loader.exec_module = exec_module
        return spec


def _check_releases() -> None:
    keras = versions.standalone_keras23()
    if keras is None:
        found = versions.dist_version("keras")
        raise Keras23RuntimeError(explain(
            "keras", f"{found} installed" if found else "no `keras` installed",
            "standalone keras 2.3.x (kerasmgpu.keras23 is for Keras 2.3 projects only)",
            f"for a Keras 2.3 project: {INSTALL}; on any other Keras, remove "
            "`import kerasmgpu.keras23`", raw=True,
        ))
    tf = versions.tensorflow_version()
    if tf is None:
        raise Keras23RuntimeError(explain(
            "tensorflow", "not installed", "the TensorFlow Keras 2.3 runs on",
            INSTALL, raw=True,
        ))
    verified = Version(versions.KERAS23_VERIFIED["tensorflow"])
    if (tf.major, tf.minor) != (verified.major, verified.minor):
        warnings.warn(
            f"kerasmgpu.keras23: Keras {keras} on TensorFlow {tf} is not verified (the "
            f"runtime patches are verified on TensorFlow {verified}); if Keras fails to "
            f"import or train, pip install tensorflow=={verified}",
            stacklevel=4,
        )


def install() -> None:
    """Make the next `import keras` import a working Keras 2.3.1; see the module doc.

    Raises `Keras23RuntimeError` when the installed Keras is not 2.3.x (or TensorFlow
    is missing) and `TooLateError` when Keras 2.3 was already imported without it.
    """
    if _keras_patched:
        return
    _check_releases()
    if "keras" in sys.modules:
        raise TooLateError(
            "Invalid import order: `import kerasmgpu.keras23` came after `import keras`. "
            "Allowed: kerasmgpu.keras23 first - it prepares TensorFlow before Keras 2.3 "
            "imports. Fix: make `import kerasmgpu.keras23` the first import of your "
            "script (before keras, and before any module that imports keras)."
        )
    if not any(isinstance(f, _AroundKeras) for f in sys.meta_path):
        sys.meta_path.insert(0, _AroundKeras())
