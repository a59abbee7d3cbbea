"""Gradient accumulation, exactly: which micro-batches make one optimizer step. Pure.

`parallelize(model, accumulate_steps=k)`: k consecutive global batches of B rows make one
optimizer step equal to one step over k*B rows on one device - the mean over all real
rows of the group. Keras 3's optimizer accumulates (`gradient_accumulation_steps=k`) and
applies the plain average of k gradients at every k-th micro-batch. Two things make that
exact for any dataset size:

* each micro-batch's gradient is weighted by its real row count: its loss weight is
  ``k * padded / rows_of_its_group`` per real row (the packing's *scale* column,
  `kerasmgpu.batching`) instead of ``padded / real``, so the average of the k gradients
  is the mean over the group's real rows - a short or padded batch counts by its rows;
* an incomplete group at the end of an epoch is completed by *filler* micro-batches -
  rows of the epoch's last batch, all masked (weight 0) - so the optimizer applies the
  group over the rows it has, at the epoch's end, as a short last batch of k*B would be.

Loss trackers, which kerasmgpu weights by ``fed rows / scale`` (= rows of the group / k
here), then give the epoch mean over real rows, as one device reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np

from kerasmgpu._errors import bad_type, bad_value


def check_accumulate_steps(value: object) -> int:
    """`accumulate_steps` as an int >= 1, or the error (received / allowed / fix)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise bad_type("accumulate_steps", value, "an integer >= 1 (1: no accumulation)",
                       "pass the number of batches per optimizer step, e.g. 4")
    if value < 1:
        raise bad_value("accumulate_steps", value, "an integer >= 1 (1: no accumulation)",
                        "pass the number of batches per optimizer step, e.g. 4")
    return int(value)


@dataclass(frozen=True)
class MicroBatch:
    """One fed micro-batch: the epoch's batch it reads (`batch`), whether its rows are
    all masked (`filler`), and the real rows of the optimizer step it belongs to."""

    batch: int
    group_rows: int
    filler: bool = False


def micro_batches(sizes: List[int], steps: int) -> List[MicroBatch]:
    """The micro-batches of one epoch whose batches have `sizes` real rows, grouped by
    `steps`: the batches in order, then fillers up to a multiple of `steps`."""
    out: List[MicroBatch] = []
    for first in range(0, len(sizes), steps):
        group = list(range(first, min(first + steps, len(sizes))))
        rows = sum(sizes[i] for i in group)
        out.extend(MicroBatch(i, rows) for i in group)
        out.extend(MicroBatch(group[-1], rows, filler=True)
                   for _ in range(steps - len(group)))
    return out


def check_batch_terms(terms: List[str], sizes: List[int], steps: int) -> None:
    """A loss term of the whole batch (`training.terms.batch_terms`) is computed per
    micro-batch, and the k micro-batches' gradients are averaged: the group's term only
    when its micro-batches hold equal rows (a mean over rows). A group with a short or
    filler micro-batch would weigh its terms otherwise than one device: refused, before
    training, with the fix."""
    if steps < 2 or not terms:
        return
    for first in range(0, len(sizes), steps):
        group = sizes[first:first + steps]
        if len(group) < steps or len(set(group)) > 1:
            raise bad_value(
                "accumulate_steps", steps,
                f"1 for this fit: its loss has terms computed from the batch "
                f"({'; '.join(terms)}), which each micro-batch computes on its own rows and "
                f"the optimizer step averages, and the micro-batches of its group of "
                f"batches {first + 1}-{first + len(group)} hold {group} rows (of "
                f"{sum(sizes)}): not one device's step over those rows",
                f"make the number of samples a multiple of batch_size * {steps} "
                f"({sizes[0] * steps}), or parallelize with accumulate_steps=1 and "
                f"fit(batch_size={sizes[0] * steps})")


def stopped_group(micro: List[MicroBatch], sizes: List[int], fed: int,
                  steps: int) -> Optional[float]:
    """A fit stopped after `fed` micro-batches (counted over the fit; the plan `micro`
    repeats every epoch) inside a group: the factor that makes the group's accumulated
    gradient the mean over the rows it has (its planned rows / the rows fed), as a short
    last batch of k*B would be on one device. None when the group is whole."""
    done = fed % steps if steps > 1 else 0
    if not done or not micro:
        return None
    last = (fed - 1) % len(micro)
    group = [micro[i] for i in range(last - done + 1, last + 1)]
    rows = sum(0 if m.filler else sizes[m.batch] for m in group)
    return group[-1].group_rows / rows if rows else None


def group_scale(padded: int, group_rows: int, steps: int) -> float:
    """The scale column of a micro-batch of `padded` fed rows in a group of `group_rows`
    real rows: a mean-reduced loss weighted by it (and the mask) is
    ``steps * sum(real losses) / group_rows``, whose gradients, averaged over the
    `steps` micro-batches, are the group's mean gradient."""
    return steps * padded / group_rows


def check_steps_per_epoch(steps_per_epoch: Optional[int], steps: int) -> None:
    """`fit(steps_per_epoch=s)` counts micro-batches; s must end on a whole group."""
    if steps > 1 and steps_per_epoch is not None and steps_per_epoch % steps:
        raise bad_value(
            "steps_per_epoch", steps_per_epoch,
            f"None, or a multiple of accumulate_steps={steps} (it counts micro-batches, "
            "and an epoch must end on a whole optimizer step)",
            f"pass steps_per_epoch={steps * max(1, round(steps_per_epoch / steps))}",
        )


def _losses(loss: Any) -> List[Any]:
    """Every loss of a `compile(loss=...)` argument: one, a list or a dict of them."""
    if isinstance(loss, dict):
        return [v for value in loss.values() for v in _losses(value)]
    if isinstance(loss, (list, tuple)):
        return [v for value in loss for v in _losses(value)]
    return [loss]


def check_loss_reduction(loss: Any, steps: int) -> None:
    """A loss reduced by its sum cannot be weighed per micro-batch: the weighting makes
    each micro-batch's mean count by its real rows, and a sum has no mean to weigh
    (its gradient would be off by the factor `steps`)."""
    if steps == 1:
        return
    for each in _losses(loss):
        if getattr(each, "reduction", None) == "sum":
            raise bad_value(
                "loss", f"{type(each).__name__}(reduction='sum') with accumulate_steps={steps}",
                "a loss reduced by its mean over the batch (reduction='sum_over_batch_size', "
                "Keras's default) when accumulate_steps > 1",
                "compile with the default reduction and scale the learning rate instead, or "
                "parallelize() with accumulate_steps=1")


def check_callbacks(callbacks: Any, steps: int) -> None:
    """A mid-epoch resume (`BackupAndRestore`, kerasmgpu.training.resume) counts batches,
    not optimizer steps: with accumulate_steps > 1 it could resume inside a group, which is
    not tested - refused rather than possibly different numbers."""
    if steps == 1:
        return
    for callback in callbacks or []:
        if type(callback).__name__ == "BackupAndRestore":
            raise bad_value(
                "callbacks", f"BackupAndRestore with accumulate_steps={steps}",
                "BackupAndRestore with accumulate_steps=1 only (in this release)",
                "drop BackupAndRestore (ModelCheckpoint at epoch ends resumes exactly), or "
                "parallelize() with accumulate_steps=1")
