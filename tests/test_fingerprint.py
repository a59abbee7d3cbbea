"""What the processes of a job compare at the start of a call (`kerasmgpu.data.fingerprint`,
`kerasmgpu.training.agree.describe`): the same call described alike however it was built,
any difference the comparison is meant to catch told apart. The comparison across real
processes, and the refusal, are tests/test_distributed.py's
`test_processes_given_a_call_otherwise_all_refuse_it_naming_what_differs`."""

from __future__ import annotations

import inspect
from typing import Any, List

import numpy as np
import pytest

from kerasmgpu.data import fingerprint
from kerasmgpu.training import agree

pytestmark = [pytest.mark.core, pytest.mark.pure]


def _job_or(*flag_lists: List[bool]) -> List[bool]:
    """What the collective that starts a call gives every process: the OR of each flag."""
    return [any(flags) for flags in zip(*flag_lists)]


def _digest(value: Any) -> int:
    return fingerprint.digest(value)[0]


def _data(rows: int = 1000) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(rows, 5)).astype("float32")


def test_the_same_parts_agree_and_any_other_value_disagrees() -> None:
    parts = fingerprint.arrays("x", _data()) + [fingerprint.argument("epochs", 3)]
    assert not fingerprint.disagree(_job_or(fingerprint.agreement_flags(parts),
                                            fingerprint.agreement_flags(list(parts))))
    for changed in range(len(parts)):
        other = list(parts)
        other[changed] = fingerprint.Part("p", parts[changed].value ^ 1, "")
        assert fingerprint.disagree(_job_or(fingerprint.agreement_flags(parts),
                                            fingerprint.agreement_flags(other))), changed
    # Alone, a process never disagrees with itself.
    assert not fingerprint.disagree(fingerprint.agreement_flags(parts))


@pytest.mark.parametrize("change", ["first row", "last row", "rows reordered", "dtype",
                                    "one more row", "feature shape"])
def test_a_digest_tells_what_a_process_given_other_data_has(change: str) -> None:
    x = _data()
    other = {
        "first row": np.concatenate([x[:1] + 1e-3, x[1:]]),
        "last row": np.concatenate([x[:-1], x[-1:] * 2]),
        "rows reordered": x[::-1],
        "dtype": x.astype("float64"),
        "one more row": np.concatenate([x, x[:1]]),
        "feature shape": x.reshape(1000, 5, 1),
    }[change]
    assert _digest(other) != _digest(x)


def test_a_digest_reads_values_not_how_they_were_built() -> None:
    words = np.array(["a cat", "a dog"] * 50, dtype=object)
    built_again = np.array(["".join(["a ", w]) for w in ["cat", "dog"] * 50], dtype=object)
    assert built_again[0] is not words[0]  # other string objects, at other addresses
    assert _digest(words) == _digest(built_again)
    assert _digest({"b": _data(), "a": _data()[:, :2]}) == _digest(
        {"a": _data()[:, :2], "b": _data()})
    assert fingerprint.argument("class_weight", {0: 1.0, 1: 2.0}).value == \
        fingerprint.argument("class_weight", {1: 2.0, 0: 1.0}).value


def test_counts_travel_exactly_and_are_shown_as_numbers() -> None:
    for value in (0, 1, 101, 2**24 - 1, 2**24, 2**31 + 7, fingerprint.NONE - 1):
        part = fingerprint.argument("steps", value)
        assert part.count and part.value == value
        assert fingerprint.decode(fingerprint.encode([part])) == [value]
        assert part.show(value) == str(value)
    assert fingerprint.argument("steps", None).shown == "None"
    assert not fingerprint.argument("shuffle", True).count  # a bool is no count
    assert fingerprint.argument("shuffle", True).value != fingerprint.argument(
        "shuffle", False).value
    digests = [_digest(_data()), fingerprint.NONE]
    assert fingerprint.decode(fingerprint.encode(
        [fingerprint.Part("x", v, "") for v in digests])) == digests


def test_a_generator_is_described_by_its_first_batch_and_handed_back_whole() -> None:
    batches = [(_data(10) + i, np.full((10, 1), i, "float32")) for i in range(3)]

    def source():
        yield from batches

    described = agree.describe(True, "fit", source(), arguments={"epochs": 2},
                               with_validation=True)
    assert described is not None
    assert inspect.isgenerator(described.x)  # Keras tells a generator by its type
    read = list(described.x)
    assert len(read) == 3 and all(np.array_equal(a[0], b[0]) for a, b in zip(read, batches))
    names = [part.name for part in described.parts]
    assert names[:2] == ["batches of x", "x"] and names[-1] == "epochs"
    again = agree.describe(True, "fit", source(), arguments={"epochs": 2},
                           with_validation=True)
    assert again is not None and [p.value for p in again.parts] == [
        p.value for p in described.parts]
    shifted = agree.describe(True, "fit", (b for b in batches[1:]), arguments={"epochs": 2},
                             with_validation=True)
    assert shifted is not None and shifted.parts[1].value != described.parts[1].value


def test_every_fit_describes_as_many_parts_whatever_it_was_given() -> None:
    """The job exchanges the parts as one array: with or without validation_data or
    sample_weight, arrays or a generator, a fit has as many."""
    x, y = _data(), _data()[:, :1]
    counts = {len(d.parts) for d in (
        agree.describe(True, "fit", x, y, arguments={"epochs": 1}, with_validation=True),
        agree.describe(True, "fit", x, y, np.ones(1000), {"epochs": 1}, (x, y),
                       with_validation=True),
        agree.describe(True, "fit", iter([(x, y)]), arguments={"epochs": 1},
                       validation=iter([(x, y)]), with_validation=True),
    ) if d is not None}
    assert len(counts) == 1
    assert agree.describe(False, "fit", x, y) is None  # one process: nothing to compare
