"""`kerasmgpu migrate`, the wrappers family: hand-written multi-GPU wrappers by shape.

The run test migrates Keras issue 2436's `ModelMGPU`, trains what it returns on 2 of the
suite's virtual devices, and compares the template's weights with one device's fit of
the same model on the same batches: Keras 2.3's multi_gpu_model promised one device's
result, and so does what migrate writes (before the rewrite, ModelMGPU failed inside
kerasmgpu). A migrated slicing function's body is that same `parallelize` call.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import pytest
from helpers import IN_PROCESS, LINE, requires
from migrate_cases import assert_idempotent, findings, migrate, src

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity, migrate_source

MGPU = '''
import numpy as np
from keras import Model
from keras.utils import multi_gpu_model


class ModelMGPU(Model):
    def __init__(self, ser_model, gpus):
        pmodel = multi_gpu_model(ser_model, gpus)
        self.__dict__.update(pmodel.__dict__)
        self._smodel = ser_model

    def __getattribute__(self, attrname):
        # return Model.__getattribute__(self, attrname)
        if 'load' in attrname or 'save' in attrname:
            return getattr(self._smodel, attrname)
        return super(ModelMGPU, self).__getattribute__(attrname)
'''

SLICING = '''
import tensorflow as tf
from keras import backend as K
from keras.layers import Input, Lambda
from keras.layers.merge import Concatenate
from keras.models import Model


def slice_batch(x, n_gpus, part):
    sh = K.shape(x)
    L = sh[0] // n_gpus
    if part == n_gpus - 1:
        return x[part*L:]
    return x[part*L:(part+1)*L]


def to_multi_gpu(model, n_gpus=2):
    """Given a keras [model], return an equivalent model over [n_gpus] GPUs."""
    with tf.device('/cpu:0'):
        x = Input(model.input_shape[1:], name=model.input_names[0])
        towers = []
        for g in range(n_gpus):
            with tf.device('/gpu:' + str(g)):
                slice_g = Lambda(slice_batch, lambda shape: shape,
                                 arguments={'n_gpus': n_gpus, 'part': g})(x)
                towers.append(model(slice_g))
    with tf.device('/cpu:0'):
        merged = Concatenate(axis=0)(towers)
        return Model(inputs=[x], outputs=[merged])
'''


@pytest.mark.text
@pytest.mark.parametrize("target", ["keras3", "tf_keras"])
def test_model_mgpu_becomes_a_function_returning_parallelize(target: str) -> None:
    out = assert_idempotent(MGPU, target)
    assert "def ModelMGPU(ser_model, gpus):\n" in out
    assert "    return kerasmgpu.parallelize(ser_model, gpus=gpus)\n" in out
    assert "import multi_gpu_model" not in out and "__getattribute__" not in out
    [info] = [f for f in findings(MGPU, target) if f.rule == "multi_gpu"]
    assert (info.line, info.severity) == (6, Severity.INFO)
    assert "saves and loads as the serial model itself" in info.message
    assert "ModelMGPU(Model)" in migrate(MGPU, "keras23")  # Keras 2.3: the drop-in runs it


@pytest.mark.text
@pytest.mark.parametrize("target", ["keras3", "tf_keras"])
def test_a_hand_written_slicing_model_is_recognized_by_its_shape(target: str) -> None:
    out = assert_idempotent(SLICING, target)
    assert ('def to_multi_gpu(model, n_gpus=2):\n'
            '    """Given a keras [model], return an equivalent model over [n_gpus] GPUs."""\n'
            ) in out
    assert "    return kerasmgpu.parallelize(model, gpus=n_gpus)\n" in out
    found = [(f.line, f.severity) for f in findings(SLICING, target)
             if "batch-slicing parallel model" in f.message]
    assert found == [(16, Severity.INFO)]
    assert not [f for f in findings(SLICING, target) if "tf.device('/cpu:0')" in f.message]
    unrelated = SLICING.replace("axis=0", "axis=-1")  # concatenates features: not a split
    assert "to_multi_gpu(model, n_gpus=2):\n    \"\"\"" in migrate(unrelated, target)
    assert "kerasmgpu.parallelize" not in migrate(unrelated, target)


RUN = '''
import numpy as np
import keras

rng = np.random.RandomState(0)
x = rng.rand(10, 4).astype("float32")
y = np.eye(3)[np.arange(10) % 3].astype("float32")


def build():
    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.set_weights([np.full((4, 3), 0.1, "float32"), np.zeros(3, "float32")])
    return model


one = build()
one.compile("sgd", "categorical_crossentropy")
one.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
'''


@pytest.mark.skipif(not IN_PROCESS or LINE is not KerasLine.KERAS_3,
                    reason="trains on 2 devices in this process (Keras 3 on TF or JAX)")
@requires(lines=[KerasLine.KERAS_3])
def test_the_migrated_model_mgpu_trains_as_one_device() -> None:
    namespace: Dict[str, Any] = {"__name__": "wrappers_case"}
    code = migrate_source(src(MGPU), "w.py", "keras3").new_source
    exec(compile(code, "w.py", "exec"), namespace)
    exec(compile(RUN, "run.py", "exec"), namespace)
    template = namespace["build"]()
    parallel = namespace["ModelMGPU"](template, 2)
    parallel.compile("sgd", "categorical_crossentropy")
    # 10 samples in batches of 4: the last batch (2) splits 1 + 1 over the 2 replicas.
    parallel.fit(namespace["x"], namespace["y"], batch_size=4, epochs=1, shuffle=False,
                 verbose=0)
    for mine, theirs in zip(template.get_weights(), namespace["one"].get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-6)
