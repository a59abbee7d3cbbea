"""How a global batch is split over replicas, padded, and masked. Pure: no framework.

The rule (every route calls it; nobody else re-derives a split):

* A global batch of ``real`` samples goes to ``replicas`` replicas. When ``real`` is not
  a multiple of ``replicas`` it is padded up to the next multiple, so every replica
  gets the same number of rows - native Keras 3 fails on uneven shards (TF: ``AddN``
  shape mismatch; JAX: ``IndivisibleError``) and tf.keras 2 averages uneven shards
  with the wrong weights.
* Padding rows repeat real rows of the same batch (never zeros: a zero row can make a
  loss infinite, and ``inf * 0`` is NaN in the gradient).
* A *whole* plan (``whole=True``, for a model whose step computes something from the
  whole batch that no per-row weight reaches: an ``add_loss`` term, an activity
  regularizer, a step's own loss) gives such a batch whole to every replica. Where each
  replica runs its own step (``copies=True``) it is padded to ``real * replicas`` rows,
  one copy a replica, the first replica's unmasked, the others' masked: each replica
  computes exactly one device's terms, whatever function of the batch they are, and the
  mean over replicas is that value. Where one program runs over the global batch
  (``copies=False``, JAX) it is fed once, unpadded, and laid out *replicated* (every
  device holds every row; the program computes the batch logically once): copies would
  count in a sum there. The price either way is that step's per-replica rows (up to the
  global batch, once per epoch).
* Each fed row carries two numbers (``pack_weights``): the batch's *scale*
  ``padded / real`` and a *mask* (1 real, 0 padding); the user's own sample weights
  travel beside them, gathered like the rows. A mean-reduced loss over the padded batch
  weighted by ``scale * mask * weight`` is exactly the single-device mean over the real
  rows, so gradients match; metrics are weighted by the mask; loss trackers, which Keras
  weights by fed rows, are weighted by ``rows / scale`` so that epoch means are weighted
  by real counts, not padded ones.

Several processes (``shard``): every process pads the same global batch the same way
and takes its own contiguous slice, so all processes run the same number of steps (JAX
hangs silently when they do not) and no sample is dropped or seen twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

# Columns of a packed weight array, shape (padded_rows, 2).
SCALE, MASK = 0, 1
PACKED_COLUMNS = 2


def _check_positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f"Invalid `{name}`. Received: {name}={value!r}. Allowed: an integer >= 1. "
            f"Fix: pass a positive integer."
        )
    return int(value)


@dataclass(frozen=True)
class BatchPlan:
    """How one global batch of `real` samples lands on `replicas` replicas."""

    real: int
    replicas: int
    # A batch that does not divide goes whole to every replica (see the module doc):
    # as one copy a replica (`copies`), or fed once and laid out replicated.
    whole: bool = False
    copies: bool = True

    def __post_init__(self) -> None:
        _check_positive("real", self.real)
        _check_positive("replicas", self.replicas)

    @property
    def replicated(self) -> bool:
        """Fed once, unpadded, every row on every device (a whole plan without copies
        for a batch that does not divide)."""
        return self.whole and not self.copies and self.real % self.replicas != 0

    @property
    def padded(self) -> int:
        """Rows actually fed: `real` rounded up to a multiple of `replicas`, or with
        `whole`, `real` times `replicas` (copies) or `real` (replicated) when it does
        not divide."""
        if self.whole and self.real % self.replicas:
            return self.real * self.replicas if self.copies else self.real
        return -(-self.real // self.replicas) * self.replicas

    @property
    def pad(self) -> int:
        return self.padded - self.real

    @property
    def per_replica(self) -> int:
        return self.real if self.replicated else self.padded // self.replicas

    @property
    def scale(self) -> float:
        """`padded / real`: the factor that turns a padded mean into the real mean."""
        return self.padded / self.real

    def source_rows(self) -> np.ndarray:
        """For each fed row, the real row it copies: 0..real-1, then repeats."""
        rows = np.arange(self.padded, dtype=np.int64)
        return rows % self.real

    def mask(self) -> np.ndarray:
        mask = np.zeros(self.padded, dtype=np.float32)
        mask[: self.real] = 1.0
        return mask

    def replica_slices(self) -> List[slice]:
        """The contiguous fed rows each replica receives, in replica order."""
        if self.replicated:
            return [slice(0, self.real)] * self.replicas
        size = self.per_replica
        return [slice(r * size, (r + 1) * size) for r in range(self.replicas)]

    def real_rows_per_replica(self) -> List[int]:
        """How many real (unpadded) rows each replica trains on."""
        return [max(0, min(s.stop, self.real) - s.start) for s in self.replica_slices()]

    def describe(self) -> str:
        sizes = self.real_rows_per_replica()
        replicas = "1 replica" if self.replicas == 1 else f"{self.replicas} replicas"
        text = f"global batch {self.real} -> {replicas} x {self.per_replica} rows"
        if self.replicated:
            text += " (the whole batch on every device, laid out replicated: computed once)"
        elif self.pad and self.whole:
            text += (f" (the whole batch on every replica; the copies on replicas 2-"
                     f"{self.replicas}, {self.pad} rows, masked)")
        elif self.pad:
            text += f" (real rows per replica {sizes}; {self.pad} padding row(s), masked)"
        return text


def sliced_rows(real: int, replicas: int) -> List[int]:
    """The rows per replica of Keras 2.3's `multi_gpu_model`, which slices a batch
    unpadded: `real // replicas` each, the last replica the remainder besides (its
    `get_slice`; kerasmgpu's Keras 2.3 route keeps that split)."""
    real, replicas = _check_positive("real", real), _check_positive("replicas", replicas)
    step = real // replicas
    return [step] * (replicas - 1) + [real - step * (replicas - 1)]


def describe_split(real: int, replicas: int, *, padded: bool = True) -> str:
    """One global batch's split in words: padded and masked (kerasmgpu's steps), or
    sliced unpadded (`padded=False`: Keras 2.3's `multi_gpu_model`)."""
    if padded:
        return plan_batch(real, replicas).describe()
    sizes = sliced_rows(real, replicas)
    text = f"global batch {real} -> {replicas} replicas, rows per replica {sizes}"
    if len(set(sizes)) > 1:
        text += " (sliced unpadded: the last replica takes the remainder)"
    return text


def plan_batch(real: int, replicas: int, whole: bool = False, copies: bool = True
               ) -> BatchPlan:
    return BatchPlan(_check_positive("real", real), _check_positive("replicas", replicas),
                     bool(whole), bool(copies))


def batch_sizes(num_samples: int, batch_size: int) -> List[int]:
    """The global batch sizes of one epoch over `num_samples`; the last may be short."""
    num_samples = int(num_samples)
    if num_samples < 0:
        raise ValueError(f"Invalid `num_samples`. Received: {num_samples}. Allowed: >= 0.")
    batch_size = _check_positive("batch_size", batch_size)
    full, rest = divmod(num_samples, batch_size)
    return [batch_size] * full + ([rest] if rest else [])


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    return -(-int(num_samples) // _check_positive("batch_size", batch_size))


def pack_weights(plan: BatchPlan) -> np.ndarray:
    """(padded, 2) float32: the batch's scale and each fed row's mask, for `plan`."""
    packed = np.empty((plan.padded, PACKED_COLUMNS), dtype=np.float32)
    packed[:, SCALE] = plan.scale
    packed[:, MASK] = plan.mask()
    return packed


def loss_weights(plan: BatchPlan, sample_weight: Optional[np.ndarray] = None) -> np.ndarray:
    """What a mean-reduced loss weights each fed row by: scale * mask * user weight.

    The steps compute the same product in the framework; this is its reference (the
    property tests check that it turns the padded mean into the real one).
    """
    packed = pack_weights(plan)
    weights = np.ones(plan.real, np.float32) if sample_weight is None else np.asarray(
        sample_weight, np.float32).reshape(plan.real)
    return packed[:, SCALE] * packed[:, MASK] * weights[plan.source_rows()]


def validation_split_at(num_samples: int, validation_split: float) -> int:
    """Keras's rule: the first `floor(n * (1 - split))` samples train, the rest validate."""
    if not 0.0 <= validation_split < 1.0:
        raise ValueError(
            f"Invalid `validation_split`. Received: validation_split={validation_split!r}. "
            "Allowed: a float in [0, 1). Fix: pass e.g. 0.2."
        )
    return int(math.floor(num_samples * (1.0 - validation_split)))


# --- Several processes ----------------------------------------------------------------


@dataclass(frozen=True)
class ProcessShard:
    """The rows one process feeds for one global batch."""

    plan: BatchPlan  # the plan of the whole global batch over all replicas
    process_index: int
    process_count: int

    @property
    def rows(self) -> slice:
        """Fed-row slice of the padded global batch that this process feeds (all of it,
        replicated)."""
        if self.plan.replicated:
            return slice(0, self.plan.real)
        size = self.plan.padded // self.process_count
        return slice(self.process_index * size, (self.process_index + 1) * size)

    @property
    def whole_in_every_process(self) -> bool:
        """Every process of a job feeds this batch whole (replicated): its rows alone
        cannot tell it from a share, so the fed batch must say so."""
        return self.plan.replicated and self.process_count > 1

    def source_rows(self) -> np.ndarray:
        return self.plan.source_rows()[self.rows]

    def packed(self) -> np.ndarray:
        return pack_weights(self.plan)[self.rows]


def shard(
    real: int, replicas_per_process: int, process_index: int, process_count: int,
    whole: bool = False, copies: bool = True,
) -> ProcessShard:
    """Split one global batch over processes (each with `replicas_per_process` replicas)."""
    _check_positive("process_count", process_count)
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"Invalid `process_index`. Received: {process_index}. Allowed: 0 to "
            f"{process_count - 1}. Fix: start workers with `kerasmgpu launch`."
        )
    plan = plan_batch(real, replicas_per_process * process_count, whole, copies)
    return ProcessShard(plan, process_index, process_count)


@dataclass(frozen=True)
class Planner:
    """Plans every global batch of a run: over all replicas, then this process's share."""

    replicas: int  # replicas in the whole run
    process_index: int = 0
    process_count: int = 1
    whole: bool = False  # BatchPlan.whole and .copies for every batch
    copies: bool = True

    def __post_init__(self) -> None:
        if self.replicas % self.process_count:
            raise ValueError(
                f"{self.replicas} replicas cannot be split evenly over {self.process_count} "
                "processes; give every process the same number of devices."
            )

    @property
    def replicas_per_process(self) -> int:
        return self.replicas // self.process_count

    def plan(self, real: int) -> ProcessShard:
        """This process's share of a global batch of `real` rows (all of it when alone)."""
        return shard(real, self.replicas_per_process, self.process_index, self.process_count,
                     self.whole, self.copies)


def epoch_shards(
    num_samples: int,
    batch_size: int,
    replicas_per_process: int,
    process_index: int,
    process_count: int,
) -> List[Tuple[int, ProcessShard]]:
    """(first sample of the global batch, this process's shard) for every step."""
    out = []
    start = 0
    for size in batch_sizes(num_samples, batch_size):
        out.append((start, shard(size, replicas_per_process, process_index, process_count)))
        start += size
    return out
