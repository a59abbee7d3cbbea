"""Two ways a multi-process script goes wrong on the torch line, and what it must see.

    kerasmgpu launch --nproc 2 tests/workers/misuse.py OUT_DIR unbuilt
    KERASMGPU_COLLECTIVE_TIMEOUT=10 kerasmgpu launch --nproc 2 ... OUT_DIR evaluate-alone

unbuilt: a Sequential without an input shape has no weights to broadcast; parallelize()
must refuse it (each process would otherwise draw its own initial weights).
evaluate-alone: after training together, only rank 0 calls evaluate(); it must raise
once the collective timeout passes, not wait forever. Rank 0 writes the error to
OUT_DIR/evaluate-alone.txt; rank 1 waits (at most 120 s) for that file, then exits.
"""

import argparse
import os
import sys
import time

import numpy as np

import kerasmgpu  # before Keras: it sets up the multi-process engine

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("mode", choices=["unbuilt", "evaluate-alone"])
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
