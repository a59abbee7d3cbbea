"""A training script as a user writes it for `kerasmgpu launch` (and for one process).

    kerasmgpu launch --nproc 2 tests/workers/train.py OUT_DIR [options]
    python tests/workers/train.py OUT_DIR            # the single-process reference

Writes OUT_DIR/rank<R>.npz (final weights, history, evaluation) so the tests can check
that every worker ends with the same weights as one process on the same global batches.
Options: --epochs E, --batch B, --rows N, --crash-rank R --crash-epoch E (fail at the end
of that epoch, or before fit with E = -1; once: a marker file holding the time of the
failure makes the next run train normally), --crash-how (os_exit: os._exit(3), sys_exit:
sys.exit(3), raise: an uncaught exception, sigkill: SIGKILL to itself), --backup DIR
(BackupAndRestore), --shuffle, --seed S (keras.utils.set_random_seed(S)), --tf-data (feed
a batched tf.data.Dataset), --listeners (write the TCP sockets this process listens on),
--chief-sets (after fit, rank 0 alone halves the template's weights and sets its learning
rate, then every process fits one more epoch: the chief's template is the truth),
--in-scope (the model built and compiled in `kerasmgpu.scope()`: no copy), --on-parallel
(--chief-sets sets the parallel model instead of the template, and assigns its first
variable directly),
--clipnorm C (SGD(clipnorm=C)), --accumulate K (accumulate_steps=K),
--optimizer-accumulates K (SGD(gradient_accumulation_steps=K)), --custom-step (the
PyTorch guide's own train_step), --save-freq N (BackupAndRestore(save_freq=N)),
--crash-step K (fail after global step K instead, with --crash-epoch naming the epoch it
falls in), --preempt-step K (rank 0 sends SIGTERM to the launcher after step K, once;
with --preempt-slurm, USR1 to the SLURM batch script instead, as `--signal=B:USR1@T` does
at the time limit: `scancel --batch --signal=USR1 $SLURM_JOB_ID`), --batchnorm
(a BatchNormalization layer after the hidden Dense), --sync-batchnorm
(parallelize(sync_batchnorm=True)), --counted (a masked loss, ignore_class=-1), --per-row
(a loss of one value per row of a sequence output), --verify (parallelize(verify=True)),
--batch-terms (loss terms computed from the whole batch: an activity regularizer and a
layer's add_loss of a mean square), --momentum M (SGD(momentum=M): optimizer state to
restore), --faults SPEC (a process dies
at a point of a save: tests/workers/faults.py), --checkpoint (a ModelCheckpoint of the weights at every epoch end; a run checks first
that the one an earlier run left loads), --batch-metric (a compile loss and metric of one
value per batch: a mean without an axis, an RMSE function), --compared (a compile loss
comparing each row with the batch's others: in-batch negatives), --centred (a layer
centring its rows on the batch's mean), --metric-state (a Metric
subclass keeping a running maximum: not a sum over rows), --layer-state (a layer
that counts the rows it is given in a variable it assigns), --step-state (a train_step
of the model's counting them so), --disagree WHAT (each process given the call
otherwise - shard: its own rows; arguments: rank 1 another epochs and validation_data;
generator: a generator augmenting with each process's own draws; on-batch: a
train_on_batch of each process's own batch - which must raise in every process; the
weights before, and the template's and the parallel model's after, go to after<R>.npz).
The optimizer's variables are written too (optimizer_<i> in rank<R>.npz).
Every process writes its pid to OUT_DIR/pid<R> first, for the tests' leftover checks
(and to pid<R>.run<N> under a restarting launcher, N its restart count).
"""

import argparse
import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

import kerasmgpu  # before TensorFlow/JAX/Keras: it sets up the multi-process engine
from kerasmgpu.env import cluster

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch", type=int, default=10)
parser.add_argument("--rows", type=int, default=101)
parser.add_argument("--crash-rank", type=int, default=-1)
parser.add_argument("--crash-epoch", type=int, default=-2)
parser.add_argument("--crash-how", default="os_exit",
                    choices=["os_exit", "sys_exit", "raise", "sigkill"])
parser.add_argument("--backup", default=None)
parser.add_argument("--save-freq", type=int, default=None,
                    help="BackupAndRestore(save_freq=N): a backup every N steps")
parser.add_argument("--crash-step", type=int, default=0,
                    help="fail after this global step instead of at an epoch's end (once)")
parser.add_argument("--preempt-step", type=int, default=0,
                    help="rank 0 sends SIGTERM to the launcher after this step (once)")
parser.add_argument("--preempt-slurm", action="store_true")
parser.add_argument("--tf-data", action="store_true")
parser.add_argument("--pydataset", action="store_true",
                    help="fit and evaluate read a keras.utils.PyDataset of the arrays")
parser.add_argument("--generator", action="store_true",
                    help="fit and evaluate read a generator of the arrays' batches")
parser.add_argument("--listeners", action="store_true")
parser.add_argument("--chief-sets", action="store_true")
parser.add_argument("--on-parallel", action="store_true",
                    help="--chief-sets sets the parallel model, not the template")
parser.add_argument("--in-scope", action="store_true",
                    help="build and compile the model in kerasmgpu.scope()")
parser.add_argument("--batch-terms", action="store_true")
parser.add_argument("--custom-step", action="store_true",
                    help="the Keras guide's own train_step (PyTorch form)")
parser.add_argument("--accumulate", type=int, default=1,
                    help="parallelize(accumulate_steps=K)")
parser.add_argument("--optimizer-accumulates", type=int, default=0,
                    help="SGD(gradient_accumulation_steps=K): Keras 3's own accumulation")
parser.add_argument("--clipnorm", type=float, default=None,
                    help="SGD(clipnorm=...): clipping must act on the global gradient")
parser.add_argument("--batchnorm", action="store_true",
                    help="a BatchNormalization layer after the hidden Dense")
parser.add_argument("--sync-batchnorm", action="store_true",
                    help="parallelize(sync_batchnorm=True)")
parser.add_argument("--verify", action="store_true",
                    help="parallelize(verify=True): the self-check in every process")
parser.add_argument("--counted", action="store_true",
                    help="a loss that divides by a count of valid entries: per-timestep "
                    "tags under Embedding(mask_zero=True), some ignored (ignore_class=-1)")
parser.add_argument("--per-row", action="store_true",
                    help="a sequence output (rows, 6, 3) and a loss of one value per row "
                    "(the mean over its steps and classes, as CTC reduces a sequence)")
parser.add_argument("--count-collectives", action="store_true",
                    help="torch: count all_reduce calls in fit with, without, and on rank 0 "
                    "alone with a callback that reads the per-batch logs "
                    "(written to collectives<rank>.json)")
parser.add_argument("--momentum", type=float, default=0.0)
parser.add_argument("--faults", default=None)
parser.add_argument("--checkpoint", action="store_true")
parser.add_argument("--batch-metric", action="store_true",
                    help="a compile loss and metric of one value per batch (a mean without "
                    "an axis, an RMSE function)")
parser.add_argument("--compared", action="store_true",
                    help="a compile loss of one value per row comparing each row with the "
                    "batch's others (in-batch negatives)")
parser.add_argument("--centred", action="store_true",
                    help="a layer whose output for a row reads the batch's mean")
parser.add_argument("--metric-state", action="store_true",
                    help="a Metric subclass whose state is a running maximum")
parser.add_argument("--layer-state", action="store_true",
                    help="a layer counting the rows it is given in a variable")
parser.add_argument("--step-state", action="store_true",
                    help="a train_step counting the rows it is given in a model variable")
parser.add_argument("--disagree", default=None,
                    choices=["shard", "arguments", "generator", "on-batch"])
args = parser.parse_args()
rank = kerasmgpu.process_index()
with open(os.path.join(args.out, f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
# Under a restarting launcher each run's pids too, so no run's process goes unchecked.
restart = os.environ.get("KERASMGPU_RESTART_COUNT", os.environ.get("TORCHELASTIC_RESTART_COUNT"))
if restart is not None:
    with open(os.path.join(args.out, f"pid{rank}.run{restart}"), "w") as f:
        f.write(str(os.getpid()))

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

# --in-scope: the model built and compiled in kerasmgpu.scope() (no copy is made).
building = contextlib.ExitStack()
if args.in_scope:
    building.enter_context(kerasmgpu.scope())
inputs = keras.Input((6,))
hidden = keras.layers.Dense(8, activation="tanh", activity_regularizer=keras.regularizers.L2(
    0.2) if args.batch_terms else None)(inputs)
if args.batch_terms:
    class MeanSquare(keras.layers.Layer):
        def call(self, inputs):
            if hasattr(keras, "ops"):
                square = keras.ops.mean(keras.ops.square(inputs - 0.2))
            else:  # tf.keras / tf_keras
                import tensorflow as tf

                square = tf.reduce_mean(tf.square(inputs - 0.2))
            self.add_loss(0.3 * square)
            return inputs

    hidden = MeanSquare()(hidden)
# A metric object made before parallelize(), as users compile them (on Keras 3 with JAX
# its variables were left on one device).
loss, metrics = "mse", [keras.metrics.MeanAbsoluteError(name="mae")]
if args.counted:
    x = rng.integers(1, 9, size=(args.rows, 6)).astype("int32")
    for row, length in enumerate(rng.integers(1, 7, size=args.rows)):
        x[row, length:] = 0
    y = np.where(rng.uniform(size=(args.rows, 6)) < 0.3, -1,
                 rng.integers(0, 3, size=(args.rows, 6))).astype("int64")
    inputs = keras.Input((6,), dtype="int32")
    hidden = keras.layers.Embedding(9, 4, mask_zero=True)(inputs)
    # Logits: Keras 3.3 - 3.13 zero an ignored entry's probabilities before normalising
    # them, a 0/0 whose NaN gradient trains one device's model to NaN too.
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)
    metrics = ["accuracy"]
if args.per_row:
    x = rng.integers(0, 9, size=(args.rows, 6)).astype("int32")
    y = rng.integers(0, 3, size=(args.rows, 6)).astype("int64")
    inputs = keras.Input((6,), dtype="int32")
    hidden = keras.layers.Embedding(9, 4)(inputs)

    def loss(y_true, y_pred):  # (rows, 6, 3) -> one value per row
        onehot = keras.ops.one_hot(keras.ops.cast(y_true, "int32"), 3)
        return keras.ops.mean(keras.ops.square(onehot - y_pred), axis=(1, 2))

    metrics = ["accuracy"]
if args.batch_metric:
    ops = keras.ops if hasattr(keras, "ops") else keras.backend

    def rmse(y_true, y_pred):  # the Keras 2 habit: one value per batch
        return ops.sqrt(ops.mean(ops.square(y_pred - y_true)))

    def batch_mse(y_true, y_pred):  # a loss of one value per batch (no axis)
        return ops.mean(ops.square(y_pred - y_true))

    loss, metrics = batch_mse, metrics + [rmse]
if args.compared:
    def in_batch_negatives(y_true, y_pred):  # each row against the batch's others
        logits = keras.ops.matmul(y_pred, keras.ops.transpose(y_pred))
        labels = keras.ops.arange(keras.ops.shape(y_pred)[0])
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    loss = in_batch_negatives
if args.metric_state:
    ops = keras.ops

    class Worst(keras.metrics.Metric):  # a running maximum: not a sum over rows
        def __init__(self):
            super().__init__(name="worst")
            self.worst = self.add_weight(name="worst", shape=(), initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.worst.assign(ops.maximum(self.worst, ops.max(ops.abs(y_pred - y_true))))

        def result(self):
            return self.worst * 1.0

    metrics = metrics + [Worst()]
if args.layer_state:
    class Counting(keras.layers.Layer):  # state assigned from the rows in the step
        def build(self, shape):
            self.rows = self.add_weight(name="rows", shape=(), initializer="zeros",
                                        trainable=False)

        def call(self, x, training=None):
            if training:
                self.rows.assign_add(keras.ops.sum(keras.ops.ones_like(x[:, 0])))
            return x

    hidden = Counting()(hidden)
if args.centred:
    class Centred(keras.layers.Layer):  # each row less the batch's mean
        def call(self, x):
            return x - keras.ops.mean(x, axis=0, keepdims=True)

    hidden = Centred()(hidden)
if args.batchnorm:
    hidden = keras.layers.BatchNormalization()(hidden)
sequence = args.counted or args.per_row
outputs = keras.layers.Dense(3 if sequence else 1,
                             activation="softmax" if args.per_row else None)(hidden)
model_class = keras.Model
if args.custom_step:  # "Customizing what happens in fit() with PyTorch"
    import torch

    class GuideModel(keras.Model):
        def train_step(self, data):
            x, y = data
            self.zero_grad()
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
            loss.backward()
            trainable = list(self.trainable_weights)
            gradients = [v.value.grad for v in trainable]
            with torch.no_grad():
                self.optimizer.apply(gradients, trainable)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    model_class = GuideModel
if args.step_state:
    class RowCounting(keras.Model):  # state assigned from the rows in its own step
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.rows = self.add_weight(name="rows", shape=(), initializer="zeros",
                                        trainable=False)

        def train_step(self, data):
            self.rows.assign_add(keras.ops.sum(keras.ops.ones_like(data[0][:, 0])))
            return super().train_step(data)

    model_class = RowCounting
model = model_class(inputs, outputs)
init = np.random.default_rng(1)
model.set_weights([(np.abs(value) + 0.5 if "variance" in w.name else value).astype("float32")
                   for w, value in ((w, init.normal(scale=0.3, size=w.shape))
                                    for w in model.weights)])
clip = {} if args.clipnorm is None else {"clipnorm": args.clipnorm}
if args.optimizer_accumulates:
    clip["gradient_accumulation_steps"] = args.optimizer_accumulates
if args.momentum:
    clip["momentum"] = args.momentum
model.compile(optimizer=keras.optimizers.SGD(0.05, **clip), loss=loss, metrics=metrics)
building.close()

options = {"accumulate_steps": args.accumulate} if args.accumulate > 1 else {}
if args.sync_batchnorm:
    options["sync_batchnorm"] = True
if args.verify:
    options["verify"] = True
CHECKPOINT = os.path.join(args.out, "checkpoint.weights.h5")
if args.checkpoint and rank == 0:
    from faults import check_checkpoint

    check_checkpoint(model, CHECKPOINT, args.out, int(restart or 0))
pmodel = kerasmgpu.parallelize(model, **options)
faults = None
if args.faults:
    from faults import Faults

    faults = Faults(args.faults, args.out, rank, int(restart or 0))


def crash_if_asked(epoch):
    marker = os.path.join(args.out, "crashed")
    if rank != args.crash_rank or epoch != args.crash_epoch or os.path.exists(marker):
        return
    with open(marker, "w") as f:  # when it died, for the launcher's fail-fast bound
        f.write(repr(time.time()))
    print(f"rank {rank}: crashing ({args.crash_how}) at epoch {epoch}", flush=True)
    if args.crash_how == "os_exit":
        os._exit(3)
    if args.crash_how == "sys_exit":
        sys.exit(3)
    if args.crash_how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"rank {rank} fails on purpose")


class Crash(keras.callbacks.Callback):
    """Fails or preempts where asked; reads the per-batch logs (as TerminateOnNaN does)."""

    steps = 0
    batch_losses: list = []

    def on_epoch_end(self, epoch, logs=None):
        if not args.crash_step:
            crash_if_asked(epoch)

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        Crash.batch_losses.append(float(logs["loss"]))
        if args.crash_step and self.steps == args.crash_step:
            crash_if_asked(args.crash_epoch)
        if faults is not None:
            faults.at_step(self.steps)
        marker = os.path.join(args.out, "preempted")
        if (rank == 0 and self.steps == args.preempt_step
                and not os.path.exists(marker)):
            open(marker, "w").close()
            if args.preempt_slurm:  # slurmctld -> slurmd -> the batch script -> the launcher
                subprocess.run(["scancel", "--batch", "--signal=USR1",
                                os.environ["SLURM_JOB_ID"]], check=True, timeout=60)
                time.sleep(5)
            else:
                os.kill(os.getppid(), signal.SIGTERM)  # the launcher: a scheduler's eviction
                time.sleep(2)  # the launcher passes SIGTERM on to this worker meanwhile


def listening_sockets():
    """(address, port) of every TCP socket this process listens on, from /proc."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                fields = row.split()
                if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                    continue
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)  # little-endian 32-bit words
                host = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.append([str(ipaddress.ip_address(host)), int(port, 16)])
    return found


crash_if_asked(-1)  # before fit: the other process is already waiting in fit

if args.disagree:
    # Each process given the call otherwise: every process must refuse it, naming what
    # differs, before a weight moves (the weights it then holds go to after<R>.npz).
    epochs, validation = args.epochs, (x[:33], y[:33])
    if args.disagree == "shard":  # the Horovod habit: each process its own rows
        x, y = x[rank::2], y[rank::2]
    elif args.disagree == "arguments" and rank == 1:
        epochs, validation = epochs + 1, (x[33:66], y[33:66])
    noise = np.random.default_rng(rank).normal(size=x.shape).astype("float32")

    def augmented():  # unseeded augmentation: each process draws its own
        while True:
            for start in range(0, len(x), args.batch):
                rows = slice(start, start + args.batch)
                yield x[rows] + 0.1 * noise[rows], y[rows]

    start = model.get_weights()
    try:
        if args.disagree == "generator":
            pmodel.fit(augmented(), steps_per_epoch=-(-len(x) // args.batch),
                       epochs=epochs, verbose=0)
        elif args.disagree == "on-batch":
            pmodel.train_on_batch(x[:args.batch] + noise[:args.batch], y[:args.batch])
        else:
            pmodel.fit(x, y, batch_size=args.batch, epochs=epochs, shuffle=False,
                       verbose=0, validation_data=validation)
    finally:
        np.savez(os.path.join(args.out, f"after{rank}.npz"), **{
            f"{kind}_{i}": w for kind, weights in (
                ("before", start), ("template", model.get_weights()),
                ("parallel", pmodel.get_weights())) for i, w in enumerate(weights)})
    sys.exit(0)


callbacks = [Crash()]
if args.backup:
    callbacks.append(keras.callbacks.BackupAndRestore(args.backup,
                                                      save_freq=args.save_freq or "epoch"))
if args.checkpoint:
    callbacks.append(keras.callbacks.ModelCheckpoint(CHECKPOINT, save_weights_only=True))
if args.tf_data:
    import tensorflow as tf

    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
    history = pmodel.fit(train, epochs=args.epochs, verbose=0, callbacks=callbacks,
                         validation_data=tf.data.Dataset.from_tensor_slices(
                             (x[:33], y[:33])).batch(args.batch))
    evaluation = pmodel.evaluate(train, verbose=0)
elif args.pydataset:
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return -(-len(x) // args.batch)

        def __getitem__(self, index):
            rows = slice(index * args.batch, (index + 1) * args.batch)
            return x[rows], y[rows]

    history = pmodel.fit(Batches(), epochs=args.epochs, shuffle=False, verbose=0,
                         callbacks=callbacks, validation_data=(x[:33], y[:33]))
    evaluation = pmodel.evaluate(Batches(), verbose=0)
elif args.generator:
    def batches():
        while True:  # every epoch's batches, in order; the steps tell the epochs
            for start in range(0, len(x), args.batch):
                yield x[start:start + args.batch], y[start:start + args.batch]

    steps = -(-len(x) // args.batch)
    history = pmodel.fit(batches(), steps_per_epoch=steps, epochs=args.epochs, verbose=0,
                         callbacks=callbacks, validation_data=(x[:33], y[:33]))
    evaluation = pmodel.evaluate(batches(), steps=steps, verbose=0)
else:
    history = pmodel.fit(x, y, batch_size=args.batch, epochs=args.epochs,
                         shuffle=False, verbose=0, callbacks=callbacks,
                         validation_data=(x[:33], y[:33]))
    evaluation = pmodel.evaluate(x, y, batch_size=args.batch, verbose=0)
if args.count_collectives:
    import torch.distributed as dist

    own_all_reduce, counted = dist.all_reduce, []

    def counting(*a, **k):
        counted.append(1)
        return own_all_reduce(*a, **k)

    dist.all_reduce = counting
    counts = {}
    # chief-only: the reading callback on rank 0 alone (TensorBoard `if is_chief()`).
    for label, extra in (("with", [Crash()]), ("without", []),
                         ("chief-only", [Crash()] if rank == 0 else [])):
        counted.clear()
        pmodel.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
                   callbacks=extra, validation_data=(x[:33], y[:33]))
        counts[label] = len(counted)
    dist.all_reduce = own_all_reduce
    with open(os.path.join(args.out, f"collectives{rank}.json"), "w") as f:
        json.dump(counts, f)
if args.chief_sets:
    if rank == 0:  # e.g. a checkpoint loaded on the chief only
        target = pmodel if args.on_parallel else model
        target.set_weights([w * 0.5 for w in model.get_weights()])
        target.optimizer.learning_rate = 0.01
        if args.on_parallel:
            # And a variable of the parallel model assigned directly, as a callback or
            # a restore might: no set_weights to say so (on TensorFlow, found by hash).
            variable = pmodel.trainable_weights[0]
            variable.assign(np.full(tuple(variable.shape), 0.1, dtype="float32"))
    history = pmodel.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
                         validation_data=(x[:33], y[:33]))
    evaluation = pmodel.evaluate(x, y, batch_size=args.batch, verbose=0)
prediction = pmodel.predict(x[:7], verbose=0)
# Every process asks to save the template: only the chief may write it.
model.save_weights(os.path.join(args.out, f"template-from-rank{rank}.weights.h5"))
if args.listeners:
    job = cluster.job()
    store = job.torch_store()
    with open(os.path.join(args.out, f"listeners{rank}.json"), "w") as f:
        json.dump({"sockets": listening_sockets(),
                   "jax": int(job.jax_coordinator().rsplit(":", 1)[1]),
                   "torch": store[1] if store else None,
                   "tf": [int(w.rsplit(":", 1)[1]) for w in job.tf_workers() or []]}, f)
optimizer_values = model.optimizer.variables
optimizer_values = optimizer_values() if callable(optimizer_values) else optimizer_values
np.savez(
    os.path.join(args.out, f"rank{rank}.npz"),
    *model.get_weights(),
    **{f"optimizer_{i}": np.asarray(v) for i, v in enumerate(optimizer_values)},
    loss=np.asarray(history.history["loss"]),
    batch_loss=np.asarray(Crash.batch_losses),
    val_loss=np.asarray(history.history["val_loss"]),
    evaluation=np.asarray(evaluation),
    prediction=np.asarray(prediction),
    replicas=np.asarray(kerasmgpu.describe(model=pmodel).get("replicas", "1"), dtype=object),
    cluster=np.asarray(cluster.job().describe(), dtype=object),
)
print(f"rank {rank} of {kerasmgpu.process_count()}: done, loss {history.history['loss']}",
      flush=True)
sys.exit(0)
