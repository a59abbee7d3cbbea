"""What the processes of a job pass to a call, as numbers they can compare.

In a job every process passes the whole global data and kerasmgpu gives each its share of
every global batch; a process that passes a shard of its own, differently augmented rows
or another `epochs` trains the wrong batches - or, where the numbers of steps differ,
waits for the others (on JAX, forever). `training.agree` compares these fingerprints across the
processes at the start of each call.

A call is described as `Part`s, the same number of them on every process for the same
call: each argument that shapes the steps, and for each input (x, y, sample_weight,
validation x/y/sample_weight) its rows - or, for a dataset, PyDataset or generator, its
number of batches - and a digest of its layout (structure, shapes past the rows, dtypes)
and values. Arrays are sampled: up to `SAMPLE_ROWS` rows spread evenly over them, the
first and the last included (a digest of every row of a 10 GB array would cost seconds
a call); a source's first batch (`data.peek`) is digested whole.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from kerasmgpu.data.structure import to_numpy

SAMPLE_ROWS = 64
_BITS = 48  # each value fits float32 pairs of 24 bits (`encode`), exactly
NONE = (1 << _BITS) - 1  # a value that is None (an argument left out, no sample_weight)
_AGREEMENT_BITS = 32


@dataclass(frozen=True)
class Part:
    """One thing the processes must agree on."""

    name: str  # as the message names it: "epochs", "rows of x", "x"
    value: int  # below 2**48
    shown: str  # this process's value, in words
    count: bool = False  # `value` is the number itself, so rank 0's can be shown too

    def show(self, value: int) -> str:
        """Another process's `value` of this part, in words (where it can be told)."""
        if value == NONE:
            return "None"
        return str(value) if self.count else "other values"


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=_BITS // 8).digest(), "big")


def argument(name: str, value: Any) -> Part:
    """A call's argument: a count where it is a small integer, else a digest of it."""
    if value is None:
        return Part(name, NONE, "None", count=True)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) \
            and 0 <= value < NONE:
        return Part(name, int(value), str(int(value)), count=True)
    if isinstance(value, dict):
        value = sorted(value.items(), key=repr)  # the same dict, built in another order
    shown = repr(value)
    return Part(name, _digest(shown.encode()), shown if len(shown) <= 60 else shown[:57] + "...")


def _leaves(structure: Any, path: str = "") -> Iterator[Tuple[str, Any]]:
    """(path, leaf) in an order that does not depend on how a dict was built."""
    if isinstance(structure, dict):
        for key in sorted(structure, key=repr):
            yield from _leaves(structure[key], f"{path}[{key!r}]")
    elif isinstance(structure, (list, tuple)):
        for index, item in enumerate(structure):
            yield from _leaves(item, f"{path}[{index}]")
    elif structure is not None:  # None, anywhere, is an absent part (as to the feeds)
        yield path, structure


def _sample(array: np.ndarray, rows: Optional[int]) -> np.ndarray:
    if array.ndim == 0 or rows is None or len(array) <= rows:
        return array
    return array[np.unique(np.linspace(0, len(array) - 1, rows).round().astype(np.int64))]


def _values(array: np.ndarray) -> bytes:
    if array.dtype.kind == "O":  # strings, bytes: the objects, not their addresses
        return repr(array.tolist()).encode()
    return np.ascontiguousarray(array).tobytes()


def digest(structure: Any, rows: Optional[int] = SAMPLE_ROWS) -> Tuple[int, str]:
    """A digest of a structure of arrays - layout and values, `rows` of each leaf
    (None: all) - and its layout in words."""
    h = hashlib.blake2b(digest_size=_BITS // 8)
    layout = []
    for path, leaf in _leaves(to_numpy(structure)):
        array = np.asarray(leaf)
        layout.append(f"{path} {array.dtype.name} {array.shape}".strip())
        h.update(f"{layout[-1]} {array.dtype.str}".encode())
        h.update(_values(_sample(array, rows)))
    return int.from_bytes(h.digest(), "big"), ", ".join(layout) or "None"


def rows_of(structure: Any) -> Optional[int]:
    """The rows of a structure of arrays (its first leaf's), None for None."""
    for _, leaf in _leaves(structure):
        return len(leaf) if hasattr(leaf, "__len__") else 1
    return None


def arrays(name: str, structure: Any) -> List[Part]:
    """An input given as arrays: its rows and a digest of a sample of them."""
    rows = rows_of(structure)
    value, layout = digest(structure)
    return [argument(f"rows of {name}", rows), Part(name, value, layout)]


def source(name: str, batches: Any, first: Any) -> List[Part]:
    """A dataset, PyDataset or generator: its number of batches (None where it has no
    length) and a digest of its first batch (None where it was not read)."""
    if first is None:
        return [argument(f"batches of {name}", batches),
                Part(name, NONE, "its first batch not read")]
    value, layout = digest(first, rows=None)
    return [argument(f"batches of {name}", batches),
            Part(name, value, f"a first batch of {layout}")]


def agreement_flags(parts: Sequence[Part]) -> List[bool]:
    """Flags whose OR over the processes tells whether they described the call alike:
    for each bit of a digest of every part, "set here" and "clear here" - both set
    somewhere only if two processes' digests differ (`disagree`)."""
    whole = _digest(repr([part.value for part in parts]).encode()) >> (_BITS - _AGREEMENT_BITS)
    bits = [bool(whole >> bit & 1) for bit in range(_AGREEMENT_BITS)]
    return [flag for bit in bits for flag in (bit, not bit)]


def disagree(agreed: Sequence[bool]) -> bool:
    """Whether `agreement_flags`, ORed over the job, show two processes differing."""
    return any(agreed[i] and agreed[i + 1] for i in range(0, len(agreed), 2))


def encode(parts: Sequence[Part]) -> np.ndarray:
    """The parts' values as float32 pairs of 24 bits (exact in float32, which every
    engine's broadcast carries)."""
    values = np.asarray([part.value for part in parts], np.int64)
    return np.stack([values >> 24, values & 0xFFFFFF], axis=-1).astype(np.float32)


def decode(pairs: Any) -> List[int]:
    pairs = np.asarray(pairs, np.float64).astype(np.int64)
    return [int(hi) << 24 | int(lo) for hi, lo in pairs.reshape(-1, 2)]
