"""`parallelize(sync_batchnorm=True)`: BatchNormalization as on one device.

tf.keras 2.12-2.15, tf_keras and Keras 3 on JAX, TensorFlow and PyTorch (and a layer's
own `synchronized=True` on TensorFlow). On the multi-process routes (PyTorch, tf.keras
and tf_keras multi-worker, JAX) three processes of `kerasmgpu launch` train
`tests/workers/train.py --batchnorm` against one process. In process, a
Dense -> BatchNormalization -> Dense model, 47 rows at batch 10 on 3 replicas (every
batch padded to 12, the last one of 7 rows to 9), against plain Keras on one device
from the same weights: weights, moving mean and variance, History, evaluate. Without
the option the padding rows enter the statistics (the check can fail). Keras 2.3
(multi_gpu_model) slices each batch unpadded, the last replica taking the remainder
(batches of 10 as 3+3+4, the last of 7 as 2+2+3): against plain Keras 2.3.1 on one
device, without the option each replica's slice has its own moments (the check can fail).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, List

import jobs
import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    LINE,
    ON_JAX,
    ON_LEGACY,
    ON_TF,
    ON_TORCH,
    assert_history_close,
    deterministic_weights,
    keras_module,
    requires,
    seed_all,
)

import kerasmgpu
from kerasmgpu import registry
from kerasmgpu.env.versions import KerasLine
from kerasmgpu.registry import below_multi_process_floor

TF_KERAS_2 = LINE in (KerasLine.TF_KERAS, KerasLine.TF_KERAS_LEGACY)
needs_sync = pytest.mark.skipif(not (IN_PROCESS or ON_LEGACY), reason="synchronized "
                                "BatchNorm in one process: TensorFlow, JAX or Keras 2.3")

if IN_PROCESS or ON_LEGACY:
    keras = keras_module()

ROWS, BATCH = 47, 10


def _model(**norm: Any) -> Any:
    seed_all(keras, 3)
    inputs = keras.Input((6,))
    hidden = keras.layers.BatchNormalization(**norm)(keras.layers.Dense(8)(inputs))
    outputs = keras.layers.Dense(1)(keras.layers.Activation("relu")(hidden))
    model = keras.Model(inputs, outputs)
    if ON_LEGACY:  # no global seed: the same weights by hand (gamma 1, not 0)
        deterministic_weights(model, 3)
        norm_layer = [layer for layer in model.layers
                      if isinstance(layer, keras.layers.BatchNormalization)][0]
        norm_layer.set_weights([np.ones(w.shape) if i in (0, 3) else w
                                for i, w in enumerate(norm_layer.get_weights())])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse", metrics=["mae"])
    return model


def _value(variable: Any) -> np.ndarray:
    if ON_LEGACY:  # graph mode: a variable of Keras's session
        return np.asarray(keras.backend.get_value(variable))
    return np.asarray(variable)


def _data() -> Any:
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(ROWS, 6)) * 3 + 1).astype("float32")
    return x, rng.normal(size=(ROWS, 1)).astype("float32")


def _max_difference(a: Any, b: Any) -> float:
    return max(float(np.abs(u - v).max()) for u, v in zip(a.get_weights(), b.get_weights()))


def _synchronized(layer_own: bool) -> None:
    x, y = _data()
    norm = {"synchronized": True} if layer_own else {}
    one = _model(**norm)
    h_one = one.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    template = _model(**norm)
    parallel = kerasmgpu.parallelize(template, **({} if layer_own else {"sync_batchnorm": True}))
    h_par = parallel.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    norm = [layer for layer in template.layers
            if isinstance(layer, keras.layers.BatchNormalization)][0]
    reference = [layer for layer in one.layers
                 if isinstance(layer, keras.layers.BatchNormalization)][0]
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_allclose(_value(getattr(norm, name)),
                                   _value(getattr(reference, name)),
                                   atol=1e-4, rtol=1e-4, err_msg=name)
    assert _max_difference(one, template) < 1e-4
    assert_history_close(h_one, h_par, rtol=1e-4)
    np.testing.assert_allclose(one.evaluate(x, y, verbose=0),
                               parallel.evaluate(x, y, batch_size=BATCH, verbose=0),
                               rtol=1e-4, atol=1e-5)
    # Without the option the padding rows count in the moments (Keras 2.3: each replica's
    # slice has its own): the check above can fail - and, the option left out, a warning
    # says so.
    other = _model()
    with pytest.warns(UserWarning, match=r"its BatchNormalization layers 'batch_norm.*' "
                      r"(take their batch statistics over the global batch with the padding "
                      r"rows|normalize each replica's share).* differ from one device's\. "
                      r"Fix: pass sync_batchnorm=True"):
        parallel_other = kerasmgpu.parallelize(other)
    parallel_other.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert _max_difference(one, other) > 1e-2


@pytest.mark.core
@needs_sync
def test_sync_batchnorm_equals_one_device_on_padded_batches() -> None:
    _synchronized(layer_own=False)


@pytest.mark.core
@pytest.mark.skipif(not ON_TF, reason="BatchNormalization(synchronized=True) is "
                    "TensorFlow's only")
def test_a_layers_own_synchronized_is_honoured_with_padding_left_out() -> None:
    # Keras's own synchronized moments would count the padding rows.
    _synchronized(layer_own=True)


@pytest.mark.core
@needs_sync
@pytest.mark.parametrize("chosen", [False, True])
def test_a_chosen_sync_batchnorm_is_not_warned_about(chosen: bool) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kerasmgpu.parallelize(_model(), sync_batchnorm=chosen)
    assert not [w for w in caught if "BatchNormalization" in str(w.message)], [
        str(w.message) for w in caught]


@pytest.mark.core
@needs_sync
def test_sync_batchnorm_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"sync_batchnorm=.*Allowed: True, False or None"):
        kerasmgpu.parallelize(_model(), sync_batchnorm="yes")


@pytest.mark.core
@pytest.mark.skipif(not TF_KERAS_2, reason="virtual_batch_size is tf.keras / tf_keras's")
def test_sync_batchnorm_refuses_ghost_batches_before_training() -> None:
    seed_all(keras, 3)
    # Built in the scope: tf_keras cannot copy a built virtual_batch_size layer (its config
    # keeps the shifted axis), so kerasmgpu trains the model itself.
    with kerasmgpu.scope():
        inputs = keras.Input((6,))
        norm = keras.layers.BatchNormalization(virtual_batch_size=2)(
            keras.layers.Dense(8)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(1)(norm))
        model.compile("sgd", "mse")
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"sync_batchnorm=True.*virtual_batch_size=2.*Fix:"):
        kerasmgpu.parallelize(model, sync_batchnorm=True)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.core
@requires(legacy=True)
def test_keras23_sync_batchnorm_with_a_sequential_model_equals_one_device() -> None:
    """Keras 2.3: a Sequential template, a convnet's 4-D BatchNormalization (moments
    over rows and pixels), validation data; 3 replicas against plain Keras 2.3.1. The
    last batch has 1 row: its rows are repeated up to one per replica (an empty slice
    fails in oneDNN's Conv2D) and the repeats are left out of the moments."""
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(25, 5, 5, 2)) * 2 + 1).astype("float32")
    y = rng.normal(size=(25, 1)).astype("float32")

    def model() -> Any:
        m = keras.Sequential([
            # No bias before the BatchNormalization: its gradient is zero but for
            # rounding, which Adam would turn into whole steps.
            keras.layers.Conv2D(4, 3, use_bias=False, input_shape=(5, 5, 2)),
            keras.layers.BatchNormalization(momentum=0.5),
            keras.layers.Activation("relu"), keras.layers.Flatten(), keras.layers.Dense(1)])
        deterministic_weights(m, 5)
        norm_layer = m.layers[1]
        norm_layer.set_weights([np.ones(w.shape) if i in (0, 3) else w
                                for i, w in enumerate(norm_layer.get_weights())])
        m.compile(keras.optimizers.Adam(0.01), "mse")
        return m

    one = model()
    h_one = one.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                    validation_data=(x[:11], y[:11]))
    template = model()
    h_par = kerasmgpu.parallelize(template, sync_batchnorm=True).fit(
        x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
        validation_data=(x[:11], y[:11]))
    assert _max_difference(one, template) < 1e-4
    assert_history_close(h_one, h_par, rtol=1e-4)
    other = model()  # Keras's own multi_gpu_model: each slice's moments
    kerasmgpu.parallelize(other).fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert _max_difference(one, other) > 1e-2


@pytest.mark.core
@requires(legacy=True)
def test_keras23_sync_batchnorm_refuses_a_nested_batchnorm_before_anything() -> None:
    # Its replicas are rebuilt layer by layer: a nested model's BatchNormalization would
    # still see one slice, so it is refused rather than half synchronized.
    inner = keras.Sequential([keras.layers.Dense(8, input_shape=(6,)),
                              keras.layers.BatchNormalization()])
    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inner(inputs)))
    model.compile("sgd", "mse")
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"sync_batchnorm=True.*nested model.*Fix:"):
        kerasmgpu.parallelize(model, sync_batchnorm=True)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


RUNS = str(jobs.WORKERS / "runs.py")


def _run(root: Path, nproc: int = 0, **runs: List[str]) -> None:
    """tests/workers/train.py --batchnorm, 47 rows, 2 epochs, in one process (`nproc` 0)
    or `kerasmgpu launch`ed: each of `runs` (NAME=[options], one model each, one after
    another in the same processes: tests/workers/runs.py) writes root/NAME."""
    root.mkdir(parents=True, exist_ok=True)
    # One device per process (conftest's virtual devices would make the reference 3).
    env = jobs.worker_env()
    program = [RUNS, str(root), *jobs.runs_args({
        name: ["train.py", "--batchnorm", "--rows", str(ROWS), "--epochs", "2", *options]
        for name, options in runs.items()})]
    command = ([sys.executable, *program] if not nproc else
               jobs.launch_command(program, nproc=nproc, timeout=300))
    run = jobs.run(command, env=env, timeout=420)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]


def _saved(out: Path) -> Any:
    data = np.load(out / "rank0.npz", allow_pickle=True)
    return jobs.weights(out / "rank0.npz"), data


# Multi-process routes: torch_ddp, tf.keras / tf_keras multi-worker mirrored, Keras 3 on
# JAX from 3.11 (Keras 3 on TensorFlow fails upstream in several processes: keras#20585).
MULTI_PROCESS = ON_TORCH or TF_KERAS_2 or (
    ON_JAX and below_multi_process_floor(LINE, registry.active().version) is None)


@pytest.mark.core
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.skipif(not MULTI_PROCESS, reason="needs a multi-process route (torch, tf.keras, "
                    "tf_keras, Keras 3 on JAX >= 3.11)")
def test_sync_batchnorm_on_three_processes_equals_one_process(tmp_path: Path) -> None:
    """47 rows at batch 10 on 3 processes (4 rows each, the last batch of 7 padded to 9):
    weights with the moving statistics, History, evaluate and predict equal one process."""
    _run(tmp_path, one=[])
    # One job of three processes, two runs: with the option, and without it.
    _run(tmp_path, nproc=3, three=["--sync-batchnorm"], apart=[])
    one, one_data = _saved(tmp_path / "one")
    three, three_data = _saved(tmp_path / "three")
    assert len(one) == len(three) == 8  # 2 Dense x 2, gamma, beta, moving mean, variance
    for u, v in zip(one, three):
        np.testing.assert_allclose(u, v, atol=1e-4, rtol=1e-4)
    for key in ("loss", "val_loss", "evaluation", "prediction"):
        np.testing.assert_allclose(one_data[key], three_data[key], rtol=1e-4, atol=1e-5,
                                   err_msg=key)
    # Without the option each process normalizes its own rows: the check above can fail.
    apart, _ = _saved(tmp_path / "apart")
    assert max(float(np.abs(u - v).max()) for u, v in zip(one, apart)) > 1e-2
