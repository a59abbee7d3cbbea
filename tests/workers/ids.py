"""Which samples each process trained on, epoch by epoch.

    kerasmgpu launch --nproc 2 tests/workers/ids.py OUT_DIR --input arrays

Every sample's id is its first input column; the model's first layer records the ids of
the rows it is trained on (in the training step itself: eagerly on torch, through
`jax.debug.callback` on JAX, `tf.py_function` on TensorFlow) and passes the other
columns on. Writes OUT_DIR/ids<R>.json: {"epochs": one list of ids per epoch, in the
order trained, "weights": the final weights}. Sizes are chosen so that no batch needs
padding (64 rows, global batch 8, at most 4 replicas): every id of an epoch must appear
exactly once over all processes, and the k-th 8 / nproc ids of every process must come
from one global batch. The model is built without a seed, so the processes also
check that they all start (and end) from the same weights.

--input: arrays (fit(shuffle=True)), pydataset (a PyDataset/Sequence, fit(shuffle=True)),
tfdata-seeded / tfdata-unseeded (a tf.data pipeline shuffled with / without a seed).
"""

import argparse
import json
import os

import numpy as np

import kerasmgpu  # before TensorFlow/JAX/Keras: it sets up the multi-process engine

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--input", default="arrays",
                    choices=["arrays", "pydataset", "tfdata-seeded", "tfdata-unseeded"])
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
rank = kerasmgpu.process_index()

env = kerasmgpu.environment()
line = str(env.keras_line)
if line == "tf_keras":
    import tf_keras as keras
elif line.startswith("tf.keras"):
    import tensorflow as tf

    keras = tf.keras
else:
    import keras

ROWS, BATCH = 64, 8
rng = np.random.default_rng(0)
ids = np.arange(ROWS, dtype="float32")
x = np.concatenate([ids[:, None], rng.normal(size=(ROWS, 4)).astype("float32")], axis=1)
y = rng.normal(size=(ROWS, 1)).astype("float32")

epochs = [[]]


def record(values):
    epochs[-1].extend(int(v) for v in np.asarray(values).reshape(-1))


backend = env.backend


class RecordIds(keras.layers.Layer):
    def call(self, inputs, training=None):
        if training:
            column = inputs[:, 0]
            if backend == "jax":
                import jax

                # Local shards only: each process records the rows it holds.
                jax.debug.callback(record, column, partitioned=True)
            elif backend == "torch":
                if column.device.type != "meta":  # Keras builds on shapes first
                    record(column.detach().cpu().numpy())
            else:
                import tensorflow as tf

                tf.py_function(lambda c: record(c.numpy()) or 0, [column], tf.int32)
        return inputs[:, 1:]


class EpochMark(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        epochs.append([])


inputs = keras.Input((5,))
hidden = RecordIds()(inputs)
outputs = keras.layers.Dense(1)(hidden)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
pmodel = kerasmgpu.parallelize(model)

if args.input == "arrays":
    data = {"x": x, "y": y, "batch_size": BATCH, "shuffle": True}
elif args.input == "pydataset":
    base = getattr(keras.utils, "PyDataset", None) or keras.utils.Sequence

    class Batches(base):
        def __len__(self):
            return ROWS // BATCH

        def __getitem__(self, index):
            rows = slice(index * BATCH, (index + 1) * BATCH)
            return x[rows], y[rows]

    data = {"x": Batches(), "shuffle": True}
else:
    import tensorflow as tf

    seed = 7 if args.input == "tfdata-seeded" else None
    data = {"x": tf.data.Dataset.from_tensor_slices((x, y)).shuffle(ROWS, seed=seed).batch(BATCH)}

pmodel.fit(epochs=args.epochs, verbose=0, callbacks=[EpochMark()], **data)
with open(os.path.join(args.out, f"ids{rank}.json"), "w") as f:
    json.dump({"epochs": epochs[:args.epochs],
               "weights": [np.asarray(w).tolist() for w in model.get_weights()]}, f)
print(f"rank {rank}: recorded {[len(e) for e in epochs[:args.epochs]]} ids", flush=True)
