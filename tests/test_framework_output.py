"""What a parallel model's calls make TensorFlow print: nothing that plain `fit` does not.

MirroredStrategy feeds each device through a stream that tf.data cannot rewrite, and
TensorFlow logs "Input of GeneratorDatasetOp::Dataset will not be optimized ..." when it
tries (kerasmgpu.adapters.tensorflow, plain_device_streams). A fresh process with
TensorFlow's own log level (TF_CPP_MIN_LOG_LEVEL=0, as in a user's shell) trains through
every input kind; its standard error - file descriptor 2, where TensorFlow's C++ logs go -
is read between markers. Plain MirroredStrategy runs last in the same process, as the
control: it prints the line, so the capture would see it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest
from helpers import requires

ROOT = Path(__file__).resolve().parents[1]
LINE = "will not be optimized because the dataset does not implement"

SCRIPT = textwrap.dedent('''
    import os, sys
    import kerasmgpu
    import numpy as np
    import tensorflow as tf
    from kerasmgpu import adapters, registry

    keras = adapters.load(registry.active()).keras

    def mark(text):
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(2, ("\\n@@ " + text + "\\n").encode())

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        return model

    x = np.random.RandomState(0).normal(size=(43, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")

    def batches():
        for start in range(0, 43, 10):
            yield x[start:start + 10], y[start:start + 10]

    pmodel = kerasmgpu.parallelize(build(), gpus=2)
    mark("kerasmgpu")
    pmodel.fit(x, y, batch_size=10, epochs=2, validation_data=(x, y), verbose=0)
    pmodel.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(10), epochs=1, verbose=0)
    pmodel.fit(batches(), epochs=1, verbose=0)
    pmodel.evaluate(x, y, batch_size=10, verbose=0)
    pmodel.predict(x, batch_size=10, verbose=0)
    pmodel.train_on_batch(x[:10], y[:10])
    pmodel.test_on_batch(x[:10], y[:10])
    mark("plain MirroredStrategy")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = build()
    model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    mark("end")
''')


def _sections(stderr: str) -> Dict[str, str]:
    parts = stderr.split("\n@@ ")
    return {part.split("\n", 1)[0]: part.split("\n", 1)[1] if "\n" in part else ""
            for part in parts[1:]}


@pytest.mark.slow
@requires(tf=True)
def test_parallel_calls_print_no_tf_data_rewrite_warning(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env.update(TF_CPP_MIN_LOG_LEVEL="0", KERASMGPU_VIRTUAL_DEVICES="2",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    sections = _sections(done.stderr)
    assert list(sections) == ["kerasmgpu", "plain MirroredStrategy", "end"], done.stderr[-3000:]
    assert LINE not in sections["kerasmgpu"], sections["kerasmgpu"][-3000:]
    # The control: TensorFlow prints it for plain MirroredStrategy (and kerasmgpu's
    # change of the streams stays inside its own calls).
    assert LINE in sections["plain MirroredStrategy"], done.stderr[-3000:]
