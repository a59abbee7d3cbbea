"""In a job of several processes, every process must pass a call the same data and
arguments: each trains its share of every global batch, read from what it was given.

A process given a shard of its own (`x[rank::n]`, `dataset.shard(n, rank)`, a file per
rank), rows augmented by its own unseeded random draws, or another `epochs` would train
other batches than one device, silently - or, with another number of steps, wait for the
others (on JAX, forever). So `fit`, `evaluate` and the first `train_on_batch` / `test_on_batch` of a
parallel model describe what they were given (`data.fingerprint`: the arguments that
shape the steps, and each input's rows or batches and a digest of a sample of its
values) and the job compares the descriptions in the collective that starts every call
(`calls._agreed_callbacks`: 64 more flags in it, no collective more). Where two processes
differ, a second exchange (rank 0's description to every process, and which parts differ
where) names what differs, and every process raises the same ValueError, before any
weight moves. `predict`, each process's own, is not compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from kerasmgpu.data import fingerprint, peek, structure
from kerasmgpu.data.base import is_dataset


@dataclass
class Described:
    """A call as this process was given it, and what the call reads after the peeks."""

    call: str
    parts: List[fingerprint.Part] = field(default_factory=list)
    x: Any = None  # what the call reads in place of x (a generator's first batch handed back)
    validation: Any = None  # likewise for validation_data

    def flags(self) -> List[bool]:
        return fingerprint.agreement_flags(self.parts)


def _input(prefix: str, x: Any, y: Any, sample_weight: Any) -> Tuple[List[Any], Any]:
    """The parts of one input (`prefix`: "" or "validation ") and what the call reads in
    place of `x`."""
    given = (fingerprint.arrays(f"{prefix}y", y)
             + fingerprint.arrays(f"{prefix}sample_weight", sample_weight))
    if x is None or structure.is_array_like(x):
        return fingerprint.arrays(f"{prefix}x", x) + given, x
    peeked = peek.first(x)
    batches: Any = None  # a generator's are not known
    if is_dataset(x):
        batches = int(x.cardinality())
        batches = {-1: "infinite", -2: "unknown"}.get(batches, batches)
    elif hasattr(x, "__len__"):
        batches = len(x)
    # (y and sample_weight beside a source: the feed refuses them next.)
    return fingerprint.source(f"{prefix}x", batches, peeked.element) + given, peeked.source


def describe(job_of_several: bool, call: str, x: Any, y: Any = None,
             sample_weight: Any = None, arguments: Optional[Dict[str, Any]] = None,
             validation: Any = None, with_validation: bool = False) -> Optional[Described]:
    """What this process was given (None outside a job of several processes: nothing to
    compare). `with_validation`: the call takes validation_data (fit), described even
    where it is None, so every process describes as many parts."""
    if not job_of_several:
        return None
    described = Described(call, validation=validation)
    parts, described.x = _input("", x, y, sample_weight)
    described.parts += parts
    if with_validation:
        vx, vy, vsw = structure.unpack(validation) if validation is not None \
            else (None, None, None)
        parts, vx = _input("validation ", vx, vy, vsw)
        described.parts += parts
        if isinstance(validation, (tuple, list)):
            described.validation = type(validation)((vx, *validation[1:]))
        elif validation is not None:
            described.validation = vx
    described.parts += [fingerprint.argument(name, value)
                        for name, value in (arguments or {}).items()]
    return described


def check(engine: Any, described: Optional[Described], agreed: List[bool]) -> None:
    """Raise, on every process alike, where `agreed` (the OR over the job of each
    process's `Described.flags`) shows that two processes were given the call otherwise."""
    if described is None or not fingerprint.disagree(agreed):
        return
    parts = described.parts
    rank0 = fingerprint.decode(engine.broadcast_arrays([fingerprint.encode(parts)])[0])
    here = [part.value != value for part, value in zip(parts, rank0)]
    anywhere = engine.any_processes(here)
    mine = [f"{part.name}: {part.shown} (rank 0: {part.show(value)})"
            for part, value, differs in zip(parts, rank0, here) if differs]
    elsewhere = [part.name for part, differs in zip(parts, anywhere) if differs]
    rank, world = engine.job.global_rank(), engine.job.world_size()
    received = (f"rank {rank} was given {'; '.join(mine)}" if mine else
                f"another process was given {', '.join(elsewhere) or 'the call'} otherwise "
                f"than rank 0 (its own message shows its values)")
    raise ValueError(
        f"Invalid `{described.call}()` call in a job of {world} processes. Received: "
        f"{received}. Allowed: every process passes {described.call}() the same data and "
        "arguments (each trains its share of every global batch, read from what it was "
        "given). Fix: give every process the whole data, not a shard of its own (no "
        "`x[rank::n]`, `dataset.shard(...)` or file per rank: kerasmgpu splits each batch "
        "itself); seed random augmentation and shuffles alike in every process "
        "(`keras.utils.set_random_seed(S)` before building the data); pass the same "
        "arguments everywhere. Nothing was trained.")
