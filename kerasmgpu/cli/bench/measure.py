"""What `kerasmgpu bench` measures and how: the models and their synthetic data, the
step timer, one `Contender` per replica count, the interleaved rounds, and the scaling
figures computed from them."""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kerasmgpu.cli import _common
from kerasmgpu.cli._common import Report

MODELS = ("mlp", "cnn", "lstm", "transformer")
SEQUENCE, VOCABULARY = 64, 2000  # the lstm and transformer models' token ids
SEED = 7
# Steps per epoch of a measurement's input: it repeats, epoch after epoch, so that a
# long measurement does not need its whole length of data in memory. Only the steps
# inside an epoch are timed: the gap across an epoch boundary holds per-epoch work
# (Keras 3 on TensorFlow re-creates its dataset iterator: 80 ms against 7 ms steps
# here; kerasmgpu syncs the template's weights) that a real epoch of thousands of
# steps spreads thin, and that would dominate epochs this short.
CHUNK_STEPS = 32
MAX_STEPS = 100_000


# --- pure helpers ------------------------------------------------------------------------


def global_batch(batch_size: int, policy: str, replicas: int) -> int:
    return batch_size * replicas if policy == "per-replica" else batch_size


def scaling(rounds: Dict[int, Sequence[float]]) -> List[Dict[str, float]]:
    """Per count: samples/s median and min-max over the rounds, and the speedup over 1
    replica - each round's ratio to the 1-replica figure of the same round, so that
    the ratios pair measurements taken moments apart - as median and min-max, with
    efficiency = median speedup / N."""
    base = list(rounds.get(1, ()))
    rows = []
    for replicas, values in rounds.items():
        ratios = ([v / b if b else float("nan") for v, b in zip(values, base)]
                  if base else [float("nan")])
        speedup = statistics.median(ratios)
        rows.append({
            "replicas": replicas,
            "samples_per_s": statistics.median(values),
            "samples_per_s_min": min(values),
            "samples_per_s_max": max(values),
            "speedup": speedup,
            "speedup_min": min(ratios),
            "speedup_max": max(ratios),
            "efficiency": speedup / replicas,
        })
    return rows


def plan_steps(step_seconds: float, seconds: float, fixed: Optional[int]) -> Tuple[int, int]:
    """(steps per epoch, epochs) of one measurement: at least `fixed` timed steps, or
    enough for `seconds` at `step_seconds` a step. An epoch's first step only starts
    its clock, so an epoch of c steps times c - 1 (see `timed_steps`)."""
    if fixed is not None:
        wanted = fixed
    elif step_seconds > 0 and math.isfinite(step_seconds):
        wanted = math.ceil(seconds / step_seconds)
    else:
        wanted = CHUNK_STEPS - 1
    wanted = max(2, min(wanted, MAX_STEPS))
    chunk = min(CHUNK_STEPS, wanted + 1)
    return chunk, math.ceil(wanted / (chunk - 1))


def timed_steps(chunk: int, epochs: int) -> int:
    return epochs * (chunk - 1)


def within_epochs(times: Sequence[float], chunk: int) -> float:
    """Seconds between step ends inside each epoch, the gaps across epochs left out."""
    return sum(times[i + 1] - times[i] for i in range(len(times) - 1)
               if (i + 1) % chunk != 0)


# --- models and data ----------------------------------------------------------------------


def build_model(keras: Any, kind: str) -> Any:
    """The benchmark model, seeded, compiled with SGD."""
    if kind in ("lstm", "transformer"):
        return _compiled(keras, _sequence_model(keras, kind))
    if kind == "cnn":
        inputs = keras.Input((28, 28, 1))
        x = keras.layers.Conv2D(32, 3, activation="relu")(inputs)
        x = keras.layers.Conv2D(64, 3, activation="relu")(x)
        x = keras.layers.MaxPooling2D(2)(x)
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dense(128, activation="relu")(x)
    else:
        inputs = keras.Input((784,))
        x = keras.layers.Dense(512, activation="relu")(inputs)
        x = keras.layers.Dense(512, activation="relu")(x)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    return _compiled(keras, keras.Model(inputs, outputs))


def _sequence_model(keras: Any, kind: str) -> Any:
    """A text classifier on SEQUENCE token ids: an LSTM, or one transformer encoder block."""
    layers = keras.layers
    inputs = keras.Input((SEQUENCE,), dtype="int32")
    tokens = layers.Embedding(VOCABULARY, 64)(inputs)
    if kind == "lstm":
        x = layers.LSTM(64)(tokens)
    else:
        attended = layers.MultiHeadAttention(num_heads=4, key_dim=16)(tokens, tokens)
        x = layers.LayerNormalization()(layers.Add()([tokens, attended]))
        forward = layers.Dense(64)(layers.Dense(128, activation="relu")(x))
        x = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(layers.Add()([x, forward])))
    return keras.Model(inputs, layers.Dense(10, activation="softmax")(x))


def _compiled(keras: Any, model: Any) -> Any:
    _common.seeded_weights(model, SEED)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01),
                  loss="sparse_categorical_crossentropy")
    return model


def make_data(kind: str, rows: int) -> Tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(SEED)
    if kind in ("lstm", "transformer"):
        return (rng.integers(0, VOCABULARY, size=(rows, SEQUENCE)).astype(np.int32),
                rng.integers(0, 10, size=rows))
    shape = (rows, 28, 28, 1) if kind == "cnn" else (rows, 784)
    return rng.random(shape, dtype=np.float32), rng.integers(0, 10, size=rows)


def _step_timer(keras: Any, on_step: Callable[[int], None]) -> Tuple[Any, List[float]]:
    """A callback that records when each training step's loss reached the host."""
    times: List[float] = []

    def on_train_batch_end(self: Any, batch: int, logs: Any = None) -> None:
        # Reading the loss waits for the step (JAX dispatches asynchronously).
        for value in (logs or {}).values():
            with contextlib.suppress(TypeError, ValueError):
                float(value)
            break
        times.append(time.perf_counter())
        on_step(len(times))

    cls = type("StepTimer", (keras.callbacks.Callback,),
               {"on_train_batch_end": on_train_batch_end})
    return cls(), times


class Contender:
    """One replica count: its model, built and warmed up once, then measured each round."""

    def __init__(self, keras: Any, args: argparse.Namespace, replicas: int,
                 data: Tuple[Any, Any], report: Report) -> None:
        from kerasmgpu import api, batching

        self.keras, self.args, self.replicas, self.report = keras, args, replicas, report
        self.batch = global_batch(args.batch_size, args.batch_policy, replicas)
        self.plan = batching.plan_batch(self.batch, replicas)
        self.data = data
        self.template = build_model(keras, args.model)
        # gpus=1 would be the template itself; measure the plain model for 1 replica.
        self.model = (self.template if replicas == 1
                      else api.parallelize(self.template, gpus=replicas))
        self.chunk, self.epochs = 1, 1
        self.seconds: List[float] = []
        self.samples_per_s: List[float] = []

    def _fit(self, steps_per_epoch: int, epochs: int, label: str) -> List[float]:
        total = steps_per_epoch * epochs
        rows = self.batch * steps_per_epoch
        x, y = self.data[0][:rows], self.data[1][:rows]
        shown = [0.0]

        def progress(done: int) -> None:
            # A terminal line costs little, but not on every step of a fast model.
            now = time.perf_counter()
            if done == total or now - shown[0] > 0.25:
                shown[0] = now
                self.report.progress(f"{label} replicas={self.replicas} step {done}/{total}")

        callback, times = _step_timer(self.keras, progress)
        self.model.fit(x, y, batch_size=self.batch, epochs=epochs, shuffle=False, verbose=0,
                       callbacks=[callback])
        self.report.end_progress()
        if len(times) != total:
            raise RuntimeError(f"expected {total} steps, the callback saw {len(times)}")
        return times

    def warm_up(self, label: str) -> None:
        """Compile, and time a step to size the measurements."""
        warmup = max(self.args.warmup, 2)
        times = self._fit(warmup, 1, label)
        # The first step compiles; the ones after it are what a measurement repeats.
        step = (times[-1] - times[1]) / (len(times) - 2) if len(times) > 2 else (
            times[-1] - times[0])
        self.chunk, self.epochs = plan_steps(step, self.args.seconds, self.args.steps)

    @property
    def timed_steps(self) -> int:
        return timed_steps(self.chunk, self.epochs)

    def measure(self, label: str) -> float:
        times = self._fit(self.chunk, self.epochs, label)
        seconds = within_epochs(times, self.chunk)
        self.seconds.append(seconds)
        self.samples_per_s.append(self.batch * self.timed_steps / seconds
                                  if seconds > 0 else float("nan"))
        return self.samples_per_s[-1]

    def result(self) -> Dict[str, Any]:
        return {
            "replicas": self.replicas,
            "global_batch": self.batch,
            "per_replica_batch": self.plan.per_replica,
            "padding_rows": self.plan.pad,
            "steps": self.timed_steps,
            "rounds": len(self.samples_per_s),
            "seconds": round(statistics.median(self.seconds), 4),
            "samples_per_s_rounds": [round(v, 2) for v in self.samples_per_s],
        }


def _measure(keras: Any, args: argparse.Namespace, counts: List[int],
             report: Report) -> List[Dict[str, Any]]:
    """Warm every count up, then time them in interleaved rounds; one row per count."""
    largest = global_batch(args.batch_size, args.batch_policy, counts[-1])
    data = make_data(args.model, largest * max(CHUNK_STEPS, args.warmup, 2))
    contenders = [Contender(keras, args, n, data, report) for n in counts]
    for i, contender in enumerate(contenders, start=1):
        contender.warm_up(f"warm-up [{i}/{len(counts)}]")
    for done in range(args.rounds):
        # Reversed every other round: no count always runs right after another.
        order = contenders if done % 2 == 0 else contenders[::-1]
        for contender in order:
            contender.measure(f"round {done + 1}/{args.rounds}")
        report.line(f"  round {done + 1}/{args.rounds}: " + ", ".join(
            f"replicas={c.replicas} {c.samples_per_s[-1]:.0f}/s" for c in contenders))
    figures = scaling({c.replicas: c.samples_per_s for c in contenders})
    measured = []
    for contender, extra in zip(contenders, figures):
        row = contender.result()
        row.update({k: v for k, v in extra.items() if k != "replicas"})
        measured.append(row)
    return measured
