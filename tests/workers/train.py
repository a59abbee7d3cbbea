"""A training script as a user writes it for `kerasmgpu launch` (and for one process).

    kerasmgpu launch --nproc 2 tests/workers/train.py OUT_DIR [options]
    python tests/workers/train.py OUT_DIR            # the single-process reference

Writes OUT_DIR/rank<R>.npz (final weights, history, evaluation) so the tests can check
that every worker ends with the same weights as one process on the same global batches.
Options: --epochs E, --batch B, --rows N, --crash-rank R --crash-epoch E (exit 3 at the
end of that epoch, once: a marker file makes the next run train normally),
--backup DIR (BackupAndRestore), --shuffle, --tf-data (feed a batched tf.data.Dataset).
"""

import argparse
import os
import sys
import time

import numpy as np

import kerasmgpu  # before TensorFlow/JAX/Keras: it sets up the multi-process engine

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch", type=int, default=10)
parser.add_argument("--rows", type=int, default=101)
parser.add_argument("--crash-rank", type=int, default=-1)
parser.add_argument("--crash-epoch", type=int, default=-1)
parser.add_argument("--backup", default=None)
parser.add_argument("--shuffle", action="store_true")
parser.add_argument("--tf-data", action="store_true")
args = parser.parse_args()

line = str(kerasmgpu.environment().keras_line)
if line == "tf_keras":
    import tf_keras as keras
elif line.startswith("tf.keras"):
    import tensorflow as tf

    keras = tf.keras
else:
    import keras

rng = np.random.default_rng(0)
x = rng.normal(size=(args.rows, 6)).astype("float32")
y = (x @ rng.normal(size=(6, 1)) + 0.1 * rng.normal(size=(args.rows, 1))).astype("float32")

inputs = keras.Input((6,))
hidden = keras.layers.Dense(8, activation="tanh")(inputs)
outputs = keras.layers.Dense(1)(hidden)
model = keras.Model(inputs, outputs)
init = np.random.default_rng(1)
model.set_weights([init.normal(scale=0.3, size=w.shape).astype("float32") for w in model.get_weights()])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])

pmodel = kerasmgpu.parallelize(model)
rank = kerasmgpu.process_index()


class Crash(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        marker = os.path.join(args.out, "crashed")
        if rank == args.crash_rank and epoch == args.crash_epoch and not os.path.exists(marker):
            with open(marker, "w") as f:  # when it died, for the launcher's fail-fast bound
                f.write(repr(time.time()))
            print(f"rank {rank}: crashing at the end of epoch {epoch}", flush=True)
            os._exit(3)


callbacks = [Crash()]
if args.backup:
    callbacks.append(keras.callbacks.BackupAndRestore(args.backup))
if args.tf_data:
    import tensorflow as tf

    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
    history = pmodel.fit(train, epochs=args.epochs, verbose=0, callbacks=callbacks,
                         validation_data=tf.data.Dataset.from_tensor_slices(
                             (x[:33], y[:33])).batch(args.batch))
    evaluation = pmodel.evaluate(train, verbose=0)
else:
    history = pmodel.fit(x, y, batch_size=args.batch, epochs=args.epochs,
                         shuffle=args.shuffle, verbose=0, callbacks=callbacks,
                         validation_data=(x[:33], y[:33]))
    evaluation = pmodel.evaluate(x, y, batch_size=args.batch, verbose=0)
prediction = pmodel.predict(x[:7], verbose=0)
np.savez(
    os.path.join(args.out, f"rank{rank}.npz"),
    *model.get_weights(),
    loss=np.asarray(history.history["loss"]),
    val_loss=np.asarray(history.history["val_loss"]),
    evaluation=np.asarray(evaluation),
    prediction=np.asarray(prediction),
    replicas=np.asarray(kerasmgpu.describe(model=pmodel).get("replicas", "1"), dtype=object),
)
print(f"rank {rank} of {kerasmgpu.process_count()}: done, loss {history.history['loss']}",
      flush=True)
sys.exit(0)
