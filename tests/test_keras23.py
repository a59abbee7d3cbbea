"""`import kerasmgpu.keras23`: a Keras 2.3 project's path onto today's TensorFlow and Python.

Each test starts a fresh interpreter the way a user's script starts - without the
`compat/keras23` sitecustomize the keras23 tox env puts on PYTHONPATH - so what runs is
the opt-in import alone: a Keras 2.3 script with `multi_gpu_model` on 2 virtual devices,
saving and loading its template; Keras 2.3 without the import (it does not import); the
`kerasmgpu` command on a Keras 2.3 install; and the import on any other Keras (an
ImportError saying what it is for).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest
from helpers import ON_LEGACY, requires

from kerasmgpu.env import versions

ROOT = Path(__file__).resolve().parents[1]
SHIM = str(ROOT / "compat" / "keras23")
TIMEOUT = 300  # a TensorFlow import alone takes 10-25 s on a loaded 2-core CI machine
KERAS23_INSTALLED = versions.standalone_keras23() is not None


def _user_env(**extra: str) -> Dict[str, str]:
    """This environment as a user's shell would have it: no sitecustomize shim, no
    virtual-device request of the test session."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERASMGPU_VIRTUAL_DEVICES", "XLA_FLAGS")}
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.abspath(p) != SHIM]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(extra)
    return env


def _python(code: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=TIMEOUT, env=_user_env(**extra), cwd=str(tmp_path))


@requires(legacy=True)
def test_a_keras23_script_trains_and_saves_after_the_opt_in_import(tmp_path: Path) -> None:
    done = _python("""
        import kerasmgpu.keras23          # the project's first line
        import numpy as np
        import keras
        from kerasmgpu.legacy import multi_gpu_model

        template = keras.Sequential([keras.layers.Dense(8, activation="relu", input_shape=(4,)),
                                     keras.layers.Dense(3, activation="softmax")])
        parallel = multi_gpu_model(template, gpus=2)
        parallel.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                         "sparse_categorical_crossentropy", metrics=["accuracy"])
        x = np.random.RandomState(0).normal(size=(101, 4)).astype("float32")
        y = (x[:, 0] > 0).astype("int64")
        parallel.fit(x, y, batch_size=10, epochs=2, verbose=0)
        template.save("template.h5")                 # h5py 3 strings, graph-mode get_value
        loaded = keras.models.load_model("template.h5")
        same = all(np.array_equal(a, b) for a, b in zip(template.get_weights(),
                                                        loaded.get_weights()))
        print("KERAS", keras.__version__, "SAME", same)
    """, tmp_path, KERASMGPU_VIRTUAL_DEVICES="2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "KERAS 2.3.1 SAME True" in done.stdout


@requires(legacy=True)
def test_recurrent_layers_identity_and_layer_weights_work_in_graph_mode(tmp_path: Path) -> None:
    # Keras 2.3 computed LSTM/ConvLSTM2D biases and the Identity initializer under
    # `K.eager`, and read/wrote one layer's weights there: in the graph mode the
    # patches set, each failed; and an RNN's gradient needs the loop's intermediates.
    # The values are Keras 2.3's own: forget-gate bias 1, identity times the gain.
    done = _python("""
        import kerasmgpu.keras23
        import numpy as np
        import keras
        from keras import initializers
        from keras.layers import LSTM, ConvLSTM2D, Dense, Flatten, SimpleRNN

        lstm = keras.Sequential([LSTM(2, input_shape=(5, 3)), Dense(1)])
        lstm.compile("adam", "mse")
        print("BIAS", lstm.layers[0].get_weights()[2].tolist())
        x = np.random.RandomState(0).rand(16, 5, 3)
        h = lstm.fit(x, x[:, -1, :1], epochs=3, verbose=0).history["loss"]
        print("LOSS FALLS", h[-1] < h[0])
        lstm.layers[1].set_weights([np.full((2, 1), 3.0), np.zeros(1)])
        print("SET", lstm.layers[1].get_weights()[0].ravel().tolist())
        rnn = SimpleRNN(2, recurrent_initializer=initializers.Identity(gain=2.0))
        keras.Sequential([rnn]).build((None, 4, 1))
        print("IDENTITY", rnn.get_weights()[1].tolist())
        conv = keras.Sequential([ConvLSTM2D(2, 3, input_shape=(2, 6, 6, 1)), Flatten(),
                                 Dense(1)])
        conv.compile("adam", "mse")
        conv.fit(np.zeros((4, 2, 6, 6, 1)), np.zeros((4, 1)), verbose=0)
        print("CONVLSTM OK")
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "BIAS [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]" in done.stdout
    assert "LOSS FALLS True" in done.stdout
    assert "SET [3.0, 3.0]" in done.stdout
    assert "IDENTITY [[2.0, 0.0], [0.0, 2.0]]" in done.stdout
    assert "CONVLSTM OK" in done.stdout


@requires(legacy=True)
def test_weight_files_load_back_with_h5py_3(tmp_path: Path) -> None:
    # h5py 3 reads the string attributes Keras 2.3 writes as str (and arrays of str):
    # `load_weights` (by order and by name) and `load_model` with an optimizer state
    # whose weight names differ in length decoded them and failed.
    done = _python("""
        import kerasmgpu.keras23
        import numpy as np
        import keras
        from keras.layers import LSTM, Dense, Input

        def build():
            x = Input((3, 2))
            return keras.Model(x, Dense(1, name="out")(LSTM(3, name="rnn")(x)))

        model = build()
        model.compile("rmsprop", "mse")
        model.fit(np.random.RandomState(0).rand(8, 3, 2), np.ones((8, 1)), verbose=0)
        model.save_weights("weights.h5")
        model.save("model.h5")
        same = lambda m: all(np.array_equal(a, b)
                             for a, b in zip(model.get_weights(), m.get_weights()))
        by_order, by_name = build(), build()
        by_order.load_weights("weights.h5")
        by_name.load_weights("weights.h5", by_name=True)
        loaded = keras.models.load_model("model.h5")
        slots = [np.array_equal(a, b) for a, b in zip(model.optimizer.get_weights(),
                                                       loaded.optimizer.get_weights())]
        print("SAME", same(by_order), same(by_name), same(loaded), len(slots), all(slots))
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SAME True True True 6 True" in done.stdout


@requires(legacy=True)
def test_without_the_import_keras23_does_not_import(tmp_path: Path) -> None:
    # What the opt-in is for: on TensorFlow 2.15, `tf.keras` is the `keras` package -
    # here Keras 2.3.1 itself - so its own import goes in a circle.
    done = _python("import keras\n", tmp_path)
    assert done.returncode != 0
    assert "keras" in done.stderr and "Error" in done.stderr


@requires(legacy=True)
def test_asking_where_keras_is_before_importing_it_keeps_the_patches(tmp_path: Path) -> None:
    # kerasmgpu looks Keras 2.3 up (find_spec) before importing it; the finder must
    # still patch the import that follows (K.get_value in graph mode: get_config).
    done = _python("""
        import importlib.util
        import kerasmgpu.keras23
        assert importlib.util.find_spec("keras") is not None
        import keras
        model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,))])
        model.compile(keras.optimizers.SGD(0.1), "mse")
        print("CONFIG", sorted(model.optimizer.get_config()))
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CONFIG ['decay', 'learning_rate', 'momentum', 'nesterov']" in done.stdout


@requires(legacy=True)
def test_importing_it_after_keras_is_a_too_late_error(tmp_path: Path) -> None:
    # A Keras 2.3 imported without the patches cannot be produced on this TensorFlow
    # (see above), so a stand-in module takes its place in sys.modules.
    done = _python("""
        import sys, types
        sys.modules["keras"] = types.ModuleType("keras")
        import kerasmgpu.keras23
    """, tmp_path)
    assert done.returncode != 0
    assert "TooLateError" in done.stderr
    assert "Fix: make `import kerasmgpu.keras23` the first import" in done.stderr


@pytest.mark.slow
@requires(legacy=True)
def test_the_command_applies_it_by_itself(tmp_path: Path) -> None:
    env = _user_env()
    doctor = subprocess.run([sys.executable, "-m", "kerasmgpu", "doctor", "--virtual", "2",
                             "--json"], capture_output=True, text=True, timeout=TIMEOUT,
                            env=env, cwd=str(tmp_path))
    assert doctor.returncode == 0, doctor.stderr[-3000:]
    report = json.loads(doctor.stdout)
    assert report["environment"]["keras_line"] == "keras<=2.3"
    assert report["route"]["route"] == "multi_gpu_model" and report["ok"] is True
    demo = subprocess.run([sys.executable, "-m", "kerasmgpu", "demo", "--epochs", "1",
                           "--json"], capture_output=True, text=True, timeout=TIMEOUT,
                          env=env, cwd=str(tmp_path))
    assert demo.returncode == 0, demo.stderr[-3000:]
    result = json.loads(demo.stdout)
    assert result["agree"] is True and result["replicas"] == 2


@pytest.mark.skipif(ON_LEGACY or KERAS23_INSTALLED, reason="Keras 2.3 is installed here")
def test_the_opt_in_on_another_keras_says_what_it_is_for(tmp_path: Path) -> None:
    done = _python("import kerasmgpu.keras23\n", tmp_path)
    assert done.returncode != 0
    assert "Keras23RuntimeError" in done.stderr
    assert "Allowed: standalone keras 2.3.x" in done.stderr
    assert "remove `import kerasmgpu.keras23`" in done.stderr
