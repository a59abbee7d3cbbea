"""`feeds.build` chooses the class of the input once, by what `x` is. Pure Python."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest

from kerasmgpu.data import arrays, feeds, python
from kerasmgpu.data.base import Request

pytestmark = pytest.mark.core


class Batches:  # a Sequence/PyDataset: a length and batches by index
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> Any:
        return np.ones((3, 1)), np.ones((3,))


def _gen() -> Iterator[Any]:
    yield np.ones((3, 1)), np.ones((3,))


def test_each_kind_of_input_gets_its_class() -> None:
    assert feeds.input_kind(Request(np.ones((4, 1)), np.ones(4))) is arrays.Arrays
    assert feeds.input_kind(Request({"a": np.ones((4, 1))})) is arrays.Arrays
    assert feeds.input_kind(Request(Batches())) is python.Indexed
    assert feeds.input_kind(Request(_gen())) is python.Generator
    assert feeds.input_kind(Request(iter([1, 2]))) is python.Generator


def test_targets_or_weights_beside_a_source_that_yields_them_are_refused() -> None:
    with pytest.raises(ValueError, match="targets next to a dataset/generator"):
        feeds.input_kind(Request(_gen(), y=np.ones(3)))
    with pytest.raises(ValueError, match="weights next to a dataset/generator"):
        feeds.input_kind(Request(Batches(), sample_weight=np.ones(3)))
    with pytest.raises(ValueError, match="pass the training inputs"):
        feeds.input_kind(Request(None))
