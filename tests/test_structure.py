"""The one copy of the nested-structure helpers, and the None rule that tells its callers apart.

To the feeds a None is an absent part (no targets, no weights): it stays None and is no
leaf. To the step hooks a None is a leaf like any other (a None loss in a compile `loss=`
dict is visited). Pure Python: no framework.
"""

from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest

from kerasmgpu.data import structure

pytestmark = pytest.mark.core


def test_none_is_a_leaf_by_default_and_an_absent_part_with_skip_none() -> None:
    seen: List[Any] = []

    def visit(leaf: Any) -> str:
        seen.append(leaf)
        return "v"

    assert structure.map_structure(visit, None) == "v"
    assert seen == [None]
    assert structure.map_structure(visit, {"a": None, "b": [1, None]}) == {
        "a": "v", "b": ["v", "v"]}
    seen.clear()
    assert structure.map_structure(visit, None, skip_none=True) is None
    assert structure.map_structure(visit, {"a": None, "b": (1, None)}, skip_none=True) == {
        "a": None, "b": ("v", None)}
    assert seen == [1]


def test_leaves_keep_dict_order_and_drop_none() -> None:
    # Insertion order, never sorted: the order Keras flattens a dict of inputs in.
    assert structure.leaves({"b": 1, "a": [2, None, (3,)]}) == [1, 2, 3]
    assert structure.leaves(None) == []


def test_containers_keep_their_type() -> None:
    out = structure.map_structure(lambda v: v * 2, ([1], (2,), {"k": 3}))
    assert out == ([2], (4,), {"k": 6})
    assert type(out) is tuple and type(out[0]) is list and type(out[1]) is tuple
    assert structure.as_tuples({"y": [1, [2, 3]]}) == {"y": (1, (2, 3))}


def test_zip_map_and_same_structure() -> None:
    assert structure.same_structure({"a": [1, 2]}, {"a": (3, 4)})
    assert not structure.same_structure({"a": [1, 2]}, {"a": [3]})
    assert not structure.same_structure([1], [[1]])
    assert structure.zip_map(lambda a, b: a + b, {"a": [1, 2]}, {"a": [10, 20]}) == {
        "a": [11, 22]}


def test_to_numpy_keeps_none_and_unpack_follows_keras() -> None:
    class Frame:  # pandas-like
        def to_numpy(self) -> np.ndarray:
            return np.ones(2)

    converted = structure.to_numpy({"x": [Frame(), 2.0], "w": None})
    assert isinstance(converted["x"][0], np.ndarray) and converted["w"] is None
    assert isinstance(converted["x"][1], np.ndarray)
    assert structure.unpack(([1], [2])) == ([1], [2], None)
    assert structure.unpack([[1], [2], [3]]) == ([1], [2], [3])
    assert structure.unpack({"x": 1}) == ({"x": 1}, None, None)
    with pytest.raises(ValueError, match="tuple of 4 elements"):
        structure.unpack((1, 2, 3, 4))
