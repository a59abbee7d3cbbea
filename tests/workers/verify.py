"""parallelize(verify=True) on the torch line, in every process of a job.

    kerasmgpu launch --nproc 2 tests/workers/verify.py OUT_DIR

21 rows in global batches of 8 (the last, 5 rows, is padded for 2 processes). A correct
model must train with the check exactly as without it; then each fault must raise
kerasmgpu.VerificationError in every process (none is left waiting in a collective),
before any weight moves:
* weights: rank 1's kernel moved in place through `.data`, which the template link's
  change tokens do not see - a replica whose weights differ in one process;
* padding: every padding row weighted as a real one (both processes); padding-fed the
  same fault met by a fit on a PyDataset (its first batch read without being taken),
  padding-gen on a generator (its first batch taken and handed back);
* state: a Python attribute read in `call`, changed on rank 1 alone;
* evaluate: the weights fault met by evaluate's first batch;
* term: not a fault of kerasmgpu's but a model each process cannot train as one device
  does: a loss term that sums over the rows a process holds (the processes' terms are
  averaged, half of one device's).
With --tf-data (TensorFlow installed beside torch), the same on a tf.data pipeline of
those batches instead: the correct model, and the weights and padding faults.
Each process writes OUT_DIR/verify<R>.json: what each case did.
"""

import argparse
import json
import os
import sys

import numpy as np

import kerasmgpu  # before Keras: it sets up the multi-process engine

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--tf-data", action="store_true")
args = parser.parse_args()

import keras  # noqa: E402

from kerasmgpu import batching  # noqa: E402

rank = kerasmgpu.process_index()
rng = np.random.default_rng(0)
x = rng.normal(size=(21, 5)).astype("float32")
y = rng.integers(0, 3, size=21).astype("int64")
FIT = dict(batch_size=8, epochs=1, shuffle=False, verbose=0)


class Scale(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.factor = 1.0

    def call(self, inputs):
        return inputs * self.factor


class SummedModel(keras.Model):
    """The term added by the model's own call: a subclassed model, which parallelize()
    cannot try on made-up rows (a layer's term it can try, it refuses before anything:
    tests/test_tried_layers.py), so the check must catch it."""

    def __init__(self):
        super().__init__(name="summed")
        self.hidden = keras.layers.Dense(6, activation="relu", name="hidden")
        self.scale = Scale(name="scale")
        self.out = keras.layers.Dense(3, activation="softmax", name="out")

    def call(self, inputs, training=None):
        hidden = self.hidden(inputs)
        self.add_loss(0.01 * keras.ops.sum(keras.ops.square(hidden)))
        return self.out(self.scale(hidden))


def build(term=False):
    if term:
        model = SummedModel()
        model(x[:2])
    else:
        inputs = keras.Input((5,))
        hidden = keras.layers.Dense(6, activation="relu", name="hidden")(inputs)
        outputs = keras.layers.Dense(3, activation="softmax", name="out")(
            Scale(name="scale")(hidden))
        model = keras.Model(inputs, outputs)
    init = np.random.default_rng(1)
    model.set_weights([init.normal(scale=0.3, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def pipeline():
    """The same batches as a tf.data pipeline: its first batch read through an iterator
    of its own, as nothing in it changes what the fit then reads."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)


def difference(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a.get_weights(), b.get_weights()))


outcome = {}
plain, checked = build(), build()
if args.tf_data:
    kerasmgpu.parallelize(plain).fit(pipeline(), epochs=1, verbose=0)
    kerasmgpu.parallelize(checked, verify=True).fit(pipeline(), epochs=1, verbose=0)
else:
    kerasmgpu.parallelize(plain).fit(x, y, **FIT)
    kerasmgpu.parallelize(checked, verify=True).fit(x, y, **FIT)
outcome["correct"] = difference(plain, checked)


def fault(name, model):
    if name in ("weights", "evaluate") and rank == 1:
        with __import__("torch").no_grad():
            model.get_layer("hidden").kernel.value.data.add_(0.5)
    if name == "state" and rank == 1:
        model.get_layer("scale").factor = 3.0


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 3

    def __getitem__(self, index):
        return x[8 * index:8 * (index + 1)], y[8 * index:8 * (index + 1)]


# A generator's first batch is taken for the check and handed back: trained the same.
if not args.tf_data:
    plain, checked = build(), build()
    kerasmgpu.parallelize(plain).fit((Batches()[i] for i in range(3)), epochs=1, verbose=0)
    kerasmgpu.parallelize(checked, verify=True).fit((Batches()[i] for i in range(3)),
                                                    epochs=1, verbose=0)
    outcome["correct"] = max(outcome["correct"], difference(plain, checked))


own_mask = batching.BatchPlan.mask
faults = ("weights", "padding") if args.tf_data else (
    "weights", "padding", "padding-fed", "padding-gen", "state", "term", "evaluate")
for name in faults:
    model = build(term=name == "term")
    pmodel = kerasmgpu.parallelize(model, verify=True)
    fault(name, model)
    if name.startswith("padding"):
        batching.BatchPlan.mask = lambda self: np.ones(self.padded, "float32")
    before = [w.copy() for w in model.get_weights()]
    try:
        if args.tf_data:
            pmodel.fit(pipeline(), epochs=1, verbose=0)
        elif name == "evaluate":
            pmodel.evaluate(x, y, batch_size=8, verbose=0)
        elif name == "padding-fed":
            pmodel.fit(Batches(), epochs=1, shuffle=False, verbose=0)
        elif name == "padding-gen":
            pmodel.fit((Batches()[i] for i in range(3)), epochs=1, verbose=0)
        else:
            pmodel.fit(x, y, **FIT)
        said = "returned"
    except kerasmgpu.VerificationError as error:
        said = str(error)
    finally:
        batching.BatchPlan.mask = own_mask
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), before))
    outcome[name] = {"said": said, "moved": moved}

with open(os.path.join(args.out, f"verify{rank}.json"), "w") as f:
    json.dump(outcome, f)
print(f"rank {rank}: done", flush=True)
sys.exit(0)
