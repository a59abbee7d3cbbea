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


# A model with what a Keras 2.3 project's files carry: a custom layer and a custom loss
# (custom_objects), an optimizer with state (Adam's moments), named layers (by_name).
MODEL_SOURCE = """
    import kerasmgpu.keras23
    import json, pickle, warnings
    import h5py
    import numpy as np
    import keras

    class Scale(keras.layers.Layer):
        def __init__(self, factor=2.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def build(self, shape):
            self.w = self.add_weight("w", (int(shape[-1]),), initializer="ones")
            super().build(shape)

        def call(self, x):
            return x * self.w * self.factor

        def get_config(self):
            return dict(super().get_config(), factor=self.factor)

    def my_loss(y_true, y_pred):
        return keras.losses.sparse_categorical_crossentropy(y_true, y_pred)

    CUSTOM = {"Scale": Scale, "my_loss": my_loss}

    def build(out="out", units=3, seed=0):
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
        hidden = Scale(name="scale")(hidden)
        outputs = keras.layers.Dense(units, activation="softmax", name=out)(hidden)
        model = keras.Model(inputs, outputs)
        rng = np.random.RandomState(seed)
        model.set_weights([rng.normal(scale=0.5, size=w.shape).astype("float32")
                           for w in model.get_weights()])
        model.compile(keras.optimizers.Adam(0.01), my_loss, metrics=["accuracy"])
        return model

    def same(a, b):
        a, b = list(a), list(b)
        return len(a) == len(b) > 0 and all(np.array_equal(u, v) for u, v in zip(a, b))

    def layer(model, name):
        return model.get_layer(name).get_weights()

    rng = np.random.RandomState(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    results = {}
"""


@requires(legacy=True)
def test_every_keras23_saving_entry_point_round_trips(tmp_path: Path) -> None:
    # Written by Keras 2.3.1 with h5py 3, read back by Keras 2.3.1, values compared.
    # Keras 2.3 has no SavedModel and no TensorFlow checkpoint format: `save` and
    # `save_weights` write HDF5 whatever the name (checked: "model_dir", "weights_noext").
    done = _python(MODEL_SOURCE + """
    from keras.callbacks import ModelCheckpoint

    model = build()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[
        ModelCheckpoint("checkpoint_weights.h5", save_weights_only=True),
        ModelCheckpoint("checkpoint_full.h5")])
    model.save("model.h5")
    model.save("model_dir")
    model.save_weights("weights.h5")
    model.save_weights("weights_noext")
    expected = model.predict(x)

    loaded = keras.models.load_model("model.h5", custom_objects=CUSTOM)
    results["load_model"] = (same(loaded.get_weights(), model.get_weights())
                             and same(loaded.optimizer.get_weights(),
                                      model.optimizer.get_weights())
                             and isinstance(loaded.get_layer("scale"), Scale)
                             and loaded.loss is my_loss
                             and np.array_equal(loaded.predict(x), expected))
    # The optimizer state came back: one more step from the file is one more step here.
    loaded.train_on_batch(x, y)
    model_copy = keras.models.load_model("model.h5", custom_objects=CUSTOM)
    model.train_on_batch(x, y)
    results["resume"] = same(loaded.get_weights(), model.get_weights())
    model.set_weights(model_copy.get_weights())
    model.optimizer.set_weights(model_copy.optimizer.get_weights())

    for name, path in (("load_weights", "weights.h5"), ("no_suffix", "weights_noext"),
                       ("model_file", "model.h5"),
                       ("checkpoint_weights", "checkpoint_weights.h5")):
        fresh = build(seed=1)
        fresh.load_weights(path)
        results[name] = same(fresh.get_weights(), model.get_weights())
    results["no_suffix_is_hdf5"] = h5py.is_hdf5("weights_noext") and h5py.is_hdf5("model_dir")
    from_dir = keras.models.load_model("model_dir", custom_objects=CUSTOM)
    results["model_dir"] = (same(from_dir.get_weights(), model.get_weights())
                            and same(from_dir.optimizer.get_weights(),
                                     model.optimizer.get_weights()))
    full = keras.models.load_model("checkpoint_full.h5", custom_objects=CUSTOM)
    results["checkpoint_full"] = (same(full.get_weights(), model.get_weights())
                                  and same(full.optimizer.get_weights(),
                                           model.optimizer.get_weights()))

    renamed = build(out="other", seed=1)
    untouched = layer(renamed, "other")
    renamed.load_weights("weights.h5", by_name=True)
    results["by_name"] = (same(layer(renamed, "hidden"), layer(model, "hidden"))
                          and same(layer(renamed, "scale"), layer(model, "scale"))
                          and same(layer(renamed, "other"), untouched))
    wider = build(units=5, seed=1)
    untouched = layer(wider, "out")
    try:
        wider.load_weights("weights.h5", by_name=True)
        results["mismatch_raises"] = False
    except ValueError:
        results["mismatch_raises"] = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wider.load_weights("weights.h5", by_name=True, skip_mismatch=True)
    results["skip_mismatch"] = (same(layer(wider, "hidden"), layer(model, "hidden"))
                                and same(layer(wider, "out"), untouched)
                                and any("Skipping loading of weights for layer out"
                                        in str(w.message) for w in caught))

    for kind in ("json", "yaml"):
        text = getattr(model, "to_" + kind)()
        again = getattr(keras.models, "model_from_" + kind)(text, custom_objects=CUSTOM)
        again.set_weights(model.get_weights())
        results[kind] = (getattr(again, "to_" + kind)() == text
                         and np.array_equal(again.predict(x), model.predict(x)))
    with keras.utils.CustomObjectScope(CUSTOM):
        unpickled = pickle.loads(pickle.dumps(model))
    results["pickle"] = same(unpickled.get_weights(), model.get_weights())
    print("RESULTS", json.dumps(results))
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(done.stdout)
    assert results == {key: True for key in results}, results
    assert sorted(results) == sorted([
        "load_model", "resume", "load_weights", "no_suffix", "no_suffix_is_hdf5", "model_dir",
        "model_file",
        "checkpoint_weights", "checkpoint_full", "by_name", "mismatch_raises", "skip_mismatch",
        "json", "yaml", "pickle"])


def _results(stdout: str) -> Dict[str, bool]:
    line = next(line for line in stdout.splitlines() if line.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


@requires(legacy=True)
def test_files_in_the_h5py_2_format_load(tmp_path: Path) -> None:
    # What Keras 2.x wrote under h5py 2 (a Keras 2.0.6 file of 2017 read by hand has
    # exactly this): scalar attributes (keras_version, backend, model_config,
    # training_config) as variable-length ASCII strings - h5py 3 reads them as `str` -
    # and lists of names (layer_names, weight_names) as fixed-length byte strings -
    # h5py 3 reads them as bytes. Keras 2.3 with h5py 3 writes the scalars alike and the
    # lists as variable-length strings; rewriting the lists gives the old format.
    done = _python(MODEL_SOURCE + """
    def as_h5py2(path):
        kinds = set()
        with h5py.File(path, "r+") as f:
            groups = [f]
            f.visititems(lambda name, item: groups.append(item)
                         if isinstance(item, h5py.Group) else None)
            for group in groups:
                for name in list(group.attrs):
                    value = group.attrs[name]
                    if isinstance(value, np.ndarray) and value.dtype == object:
                        del group.attrs[name]
                        group.attrs[name] = np.array([v.encode() for v in value], "S")
                    kind = group.attrs.get_id(name).get_type()
                    if isinstance(kind, h5py.h5t.TypeStringID):
                        shape = group.attrs.get_id(name).shape
                        kinds.add(("list" if shape else "scalar",
                                   "vlen" if kind.is_variable_str() else "fixed",
                                   kind.get_cset()))
        return sorted(kinds)

    model = build()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    model.save("model.h5")
    model.save_weights("weights.h5")
    results["format"] = (as_h5py2("model.h5") == as_h5py2("weights.h5")
                         == [("list", "fixed", 0), ("scalar", "vlen", 0)])
    with h5py.File("weights.h5", "r") as f:
        results["reads_as_h5py2"] = (isinstance(f.attrs["keras_version"], str)
                                     and f.attrs["layer_names"].dtype.kind == "S")
    loaded = keras.models.load_model("model.h5", custom_objects=CUSTOM)
    results["load_model"] = (same(loaded.get_weights(), model.get_weights())
                             and same(loaded.optimizer.get_weights(),
                                      model.optimizer.get_weights()))
    for path in ("weights.h5", "model.h5"):
        fresh = build(seed=1)
        fresh.load_weights(path)
        results["load_weights " + path] = same(fresh.get_weights(), model.get_weights())
    renamed = build(out="other", seed=1)
    renamed.load_weights("weights.h5", by_name=True)
    results["by_name"] = same(layer(renamed, "hidden"), layer(model, "hidden"))
    print("RESULTS", json.dumps(results))
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(done.stdout)
    assert results == {key: True for key in results} and len(results) == 6, results


@requires(legacy=True)
def test_multi_gpu_model_and_its_template_load_weights(tmp_path: Path) -> None:
    # Keras 2.3's multi_gpu_model shares the template's weights: weights loaded into
    # the template are what the parallel model predicts with (kerasmgpu.legacy's
    # drop-in and parallelize(), which run Keras's own multi_gpu_model here), and the
    # parallel model's own weight files (a ModelCheckpoint of it) load into another.
    done = _python(MODEL_SOURCE + """
    import kerasmgpu
    from keras.callbacks import ModelCheckpoint
    from kerasmgpu.legacy import multi_gpu_model

    reference = build()
    reference.fit(x, y, batch_size=16, epochs=1, verbose=0)
    reference.save_weights("weights.h5")
    expected = reference.predict(x)
    for name, make in (("legacy", lambda t: multi_gpu_model(t, gpus=2)),
                       ("parallelize", lambda t: kerasmgpu.parallelize(t, gpus=2))):
        template = build(seed=1)
        parallel = make(template)
        template.load_weights("weights.h5")
        results[name] = bool(np.allclose(parallel.predict(x, batch_size=16), expected,
                                         atol=1e-6))
    template = build(seed=2)
    parallel = multi_gpu_model(template, gpus=2)
    parallel.compile(keras.optimizers.Adam(0.01), my_loss)
    parallel.fit(x, y, batch_size=16, epochs=1, verbose=0,
                 callbacks=[ModelCheckpoint("parallel_weights.h5", save_weights_only=True)])
    other = build(seed=3)
    multi_gpu_model(other, gpus=2).load_weights("parallel_weights.h5")
    results["parallel_checkpoint"] = same(other.get_weights(), template.get_weights())

    # parallelize()'s parallel model writes its file whole or not at all: interrupted
    # before the rename, the new file half written, the old one is still there, whole.
    import os
    from kerasmgpu.process import backups

    template = build(seed=4)
    parallel = kerasmgpu.parallelize(template, gpus=2)
    parallel.save_weights("atomic.h5")
    first = template.get_weights()
    template.set_weights([w + 1 for w in first])

    def cut(point, temporary):
        if point == "replace":
            with open(temporary, "r+b") as f:
                f.truncate(os.path.getsize(temporary) // 2)
            raise KeyboardInterrupt

    backups.reached = cut
    try:
        parallel.save_weights("atomic.h5")
    except KeyboardInterrupt:
        pass
    other = build(seed=5)
    multi_gpu_model(other, gpus=2).load_weights("atomic.h5")
    results["killed_save"] = (same(other.get_weights(), first)
                              and not [n for n in os.listdir(".") if n.startswith(".kerasmgpu")])
    print("RESULTS", json.dumps(results))
    """, tmp_path, KERASMGPU_VIRTUAL_DEVICES="2")
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(done.stdout)
    assert results == {"legacy": True, "parallelize": True, "parallel_checkpoint": True,
                       "killed_save": True}, results


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
    # Keras 2.3's multi_gpu_model concatenates outputs: the route line and the verdict
    # say so, and neither claims an all-reduce.
    assert result["route"]["all_reduce"].startswith("none: outputs concatenated on the CPU")
    assert "outputs are concatenated on the CPU" in result["verdict"]
    assert "all-reduced" not in result["verdict"]
    assert result["throughput_compared"] is False  # 2 virtual devices made by the demo


@pytest.mark.skipif(ON_LEGACY or KERAS23_INSTALLED, reason="Keras 2.3 is installed here")
def test_the_opt_in_on_another_keras_says_what_it_is_for(tmp_path: Path) -> None:
    done = _python("import kerasmgpu.keras23\n", tmp_path)
    assert done.returncode != 0
    assert "Keras23RuntimeError" in done.stderr
    assert "Allowed: standalone keras 2.3.x" in done.stderr
    assert "remove `import kerasmgpu.keras23`" in done.stderr


@requires(legacy=True)
def test_per_output_metrics_as_a_dict_train_as_on_one_device(tmp_path: Path) -> None:
    # parallelize() recompiled with list(dict), the dict's keys as metric names:
    # `Unknown metric function: price`.
    done = _python("""
        import kerasmgpu.keras23
        import numpy as np
        import keras
        import kerasmgpu

        def build():
            np.random.seed(0)
            inp = keras.layers.Input((4,))
            h = keras.layers.Dense(6, activation="relu", kernel_initializer="glorot_uniform")(inp)
            model = keras.models.Model(inp, [keras.layers.Dense(1, name="price")(h),
                                             keras.layers.Dense(1, name="size")(h)])
            model.compile("sgd", "mse", metrics={"price": ["mae"], "size": ["mse"]})
            return model

        rng = np.random.RandomState(1)
        x = rng.normal(size=(23, 4)).astype("float32")
        ys = [rng.normal(size=(23, 1)).astype("float32") for _ in range(2)]
        one = build()
        many = build()
        many.set_weights(one.get_weights())
        h1 = one.fit(x, ys, batch_size=8, epochs=2, shuffle=False, verbose=0).history
        h2 = kerasmgpu.parallelize(many).fit(x, ys, batch_size=8, epochs=2, shuffle=False,
                                            verbose=0).history
        w = max(float(np.max(np.abs(a - b))) for a, b in zip(one.get_weights(),
                                                             many.get_weights()))
        h = max(abs(a - b) for k in h1 for a, b in zip(h1[k], h2[k]))
        print("KEYS", sorted(h1) == sorted(h2), "CLOSE", w < 1e-5 and h < 1e-4, w, h)
    """, tmp_path, KERASMGPU_VIRTUAL_DEVICES="2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "KEYS True CLOSE True" in done.stdout, done.stdout


@requires(legacy=True)
def test_weighted_metric_objects_with_sample_weight_train_as_on_one_device(tmp_path: Path) -> None:
    # The template's Metric objects, reused by the recompile, asked for the template's
    # sample-weight placeholder: `You must feed a value for placeholder tensor`.
    done = _python("""
        import kerasmgpu.keras23
        import numpy as np, keras, kerasmgpu
        def build():
            np.random.seed(0)
            m = keras.Sequential([keras.layers.Dense(4, activation="relu", input_shape=(4,)), keras.layers.Dense(1)])
            m.compile("sgd", "mse", weighted_metrics=[keras.metrics.MeanSquaredError()])
            return m
        rng = np.random.RandomState(1)
        x = rng.normal(size=(23, 4)).astype("float32"); y = rng.normal(size=(23, 1)).astype("float32")
        sw = rng.uniform(0.5, 2, size=(23,)).astype("float32")
        one = build(); many = build(); many.set_weights(one.get_weights())
        h1 = one.fit(x, y, sample_weight=sw, batch_size=8, epochs=2, shuffle=False, verbose=0).history
        h2 = kerasmgpu.parallelize(many).fit(x, y, sample_weight=sw, batch_size=8, epochs=2, shuffle=False, verbose=0).history
        w = max(float(np.max(np.abs(a - b))) for a, b in zip(one.get_weights(), many.get_weights()))
        h = max(abs(a - b) for k in h1 for a, b in zip(h1[k], h2[k]))
        print("KEYS", sorted(h1) == sorted(h2), "CLOSE", w < 1e-5 and h < 1e-4, w, h)
    """, tmp_path, KERASMGPU_VIRTUAL_DEVICES="2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "KEYS True CLOSE True" in done.stdout, done.stdout
