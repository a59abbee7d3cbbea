"""Three ways a multi-process script goes wrong on the torch line, and what it must see.

    kerasmgpu launch --nproc 2 tests/workers/misuse.py OUT_DIR unbuilt
    KERASMGPU_COLLECTIVE_TIMEOUT=10 kerasmgpu launch --nproc 2 ... OUT_DIR evaluate-alone
    kerasmgpu launch --nproc 2 tests/workers/misuse.py OUT_DIR uncompiled

unbuilt: a Sequential without an input shape has no weights to broadcast; parallelize()
must refuse it (each process would otherwise draw its own initial weights).
evaluate-alone: after training together, only rank 0 calls evaluate(); it must raise
once the collective timeout passes, not wait forever. Rank 0 writes the error to
OUT_DIR/evaluate-alone.txt; rank 1 waits (at most 120 s) for that file, then exits.
uncompiled: an uncompiled model's parallel model; fit, evaluate, train_on_batch and
test_on_batch must raise kerasmgpu's NotCompiledError on every process (before any
collective), as plain Keras raises there; predict must work. Rank 0 writes what each
call did to OUT_DIR/uncompiled.json.
dataloader: a torch DataLoader (which Keras 3 reads itself) is refused by fit and
evaluate on every process, naming the fix; predict (each process's own, on the
template) reads it as Keras does; the fix (a generator over the loader) trains as one
device reading the loader. Each rank writes OUT_DIR/dataloader<R>.json.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

import kerasmgpu  # before Keras: it sets up the multi-process engine

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("mode", choices=["unbuilt", "evaluate-alone", "uncompiled", "dataloader"])
args = parser.parse_args()

import keras  # noqa: E402

rank = kerasmgpu.process_index()
x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
y = x.sum(axis=1, keepdims=True)

if args.mode == "unbuilt":
    model = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    kerasmgpu.parallelize(model)  # must raise on every process
    sys.exit(0)

if args.mode == "uncompiled":
    from kerasmgpu._errors import NotCompiledError

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    plain.set_weights(model.get_weights())
    pmodel = kerasmgpu.parallelize(model)
    calls = {"fit": lambda m: m.fit(x, y, batch_size=4, verbose=0),
             "evaluate": lambda m: m.evaluate(x, y, batch_size=4, verbose=0),
             "train_on_batch": lambda m: m.train_on_batch(x, y),
             "test_on_batch": lambda m: m.test_on_batch(x, y)}
    outcome = {}
    for name, call in calls.items():
        try:
            call(plain)
            keras_own = "returned"
        except Exception as error:  # what plain Keras raises on this line
            keras_own = type(error).__name__
        try:
            call(pmodel)
            outcome[name] = {"keras": keras_own, "ours": "returned"}
        except NotCompiledError as error:
            outcome[name] = {"keras": keras_own, "ours": str(error),
                             "is_value_error": isinstance(error, ValueError)}
    outcome["predict_same"] = bool(np.allclose(pmodel.predict(x, verbose=0),
                                               plain.predict(x, verbose=0), atol=1e-6))
    if rank == 0:
        with open(os.path.join(args.out, "uncompiled.json"), "w") as f:
            json.dump(outcome, f)
    print(f"rank {rank}: done", flush=True)
    sys.exit(0)

if args.mode == "dataloader":
    import itertools

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    def loader():  # 16 rows in batches of 6: the last one uneven
        return DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
                          batch_size=6)

    def built():
        keras.utils.set_random_seed(3)
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="tanh"),
                              keras.layers.Dense(1)])
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return m

    one, model = built(), built()
    one.fit(loader(), epochs=2, verbose=0)  # Keras's own reading of the loader
    pmodel = kerasmgpu.parallelize(model)
    start = [w.copy() for w in model.get_weights()]
    outcome = {}
    for name in ("fit", "evaluate"):
        try:
            getattr(pmodel, name)(loader(), verbose=0)
            outcome[name] = "returned"
        except TypeError as error:
            outcome[name] = str(error)
    # predict in a job of several processes is each process's own, on the template:
    # Keras reads the loader there.
    outcome["predict_difference"] = float(np.abs(
        pmodel.predict(loader(), verbose=0) - built().predict(loader(), verbose=0)).max())
    outcome["untouched"] = all(np.array_equal(a, b)
                               for a, b in zip(start, model.get_weights()))
    fed = loader()
    pmodel.fit((batch for _ in itertools.count() for batch in fed),
               steps_per_epoch=len(fed), epochs=2, verbose=0)
    outcome["fix_difference"] = max(float(np.abs(a - b).max())
                                    for a, b in zip(one.get_weights(), model.get_weights()))
    with open(os.path.join(args.out, f"dataloader{rank}.json"), "w") as f:
        json.dump(outcome, f)
    print(f"rank {rank}: done", flush=True)
    sys.exit(0)

model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
pmodel = kerasmgpu.parallelize(model)
pmodel.fit(x, y, batch_size=4, epochs=1, verbose=0)
marker = os.path.join(args.out, "evaluate-alone.txt")
if rank == 0:
    start = time.monotonic()
    try:
        pmodel.evaluate(x, y, batch_size=4, verbose=0)
        outcome = "returned"
    except RuntimeError as error:
        outcome = f"raised after {time.monotonic() - start:.1f} s: {error}"
    with open(marker + ".tmp", "w") as f:
        f.write(outcome)
    os.replace(marker + ".tmp", marker)
else:
    end = time.monotonic() + 120
    while not os.path.exists(marker) and time.monotonic() < end:
        time.sleep(0.1)
print(f"rank {rank}: done", flush=True)
