"""Nested structures of lists, tuples and dicts: the one copy of the helpers that walk them.

Feeds and the step hooks both walk the user's structures (inputs, targets, sample
weights, outputs, compile arguments). They differ in one thing, kept as a parameter:
to the feeds, a None anywhere is an absent part (`map_structure(..., skip_none=True)`
keeps it None, `leaves` drops it); to the step hooks a None is a leaf like any other
(a loss of None in a compile `loss=` dict, a sample weight of None).
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Tuple

import numpy as np

from kerasmgpu._errors import bad_value


def nested(value: Any) -> bool:
    """Whether `value` is a container (dict, list or tuple) rather than a leaf."""
    return isinstance(value, (dict, list, tuple))


def leaves(structure: Any) -> List[Any]:
    """The leaves in order (dicts in their own key order); None, anywhere, is no leaf."""
    if structure is None:
        return []
    if isinstance(structure, Mapping):
        return [leaf for key in structure for leaf in leaves(structure[key])]
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in leaves(item)]
    return [structure]


def map_structure(fn: Callable[[Any], Any], structure: Any, *, skip_none: bool = False) -> Any:
    """`fn` applied to the leaves of nested lists, tuples and dicts, in the same shape.

    `skip_none`: a None (the whole structure or a part) stays None instead of being
    handed to `fn`.
    """
    if skip_none and structure is None:
        return None
    if isinstance(structure, Mapping):
        return {k: map_structure(fn, v, skip_none=skip_none) for k, v in structure.items()}
    if isinstance(structure, (list, tuple)):
        return type(structure)(map_structure(fn, v, skip_none=skip_none) for v in structure)
    return fn(structure)


def same_structure(a: Any, b: Any) -> bool:
    """Whether two structures nest alike (dict keys, sequence lengths), leaves aside."""
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(same_structure(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_structure(x, y) for x, y in zip(a, b))
    return not nested(a) and not nested(b)


def zip_map(fn: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    """`fn(leaf_of_a, leaf_of_b)` over two structures that nest alike, in `a`'s shape."""
    if isinstance(a, dict):
        return {k: zip_map(fn, a[k], b[k]) for k in a}
    if isinstance(a, (list, tuple)):
        return type(a)(zip_map(fn, x, y) for x, y in zip(a, b))
    return fn(a, b)


def as_tuples(structure: Any) -> Any:
    """tf.data holds tuples and dicts, not lists: multi-output targets become tuples."""
    if isinstance(structure, Mapping):
        return {k: as_tuples(v) for k, v in structure.items()}
    if isinstance(structure, (list, tuple)):
        return tuple(as_tuples(v) for v in structure)
    return structure


def is_array_like(obj: Any) -> bool:
    """Whether `obj` is numpy-like arrays (or lists/dicts of them)."""
    if obj is None:
        return False
    found = leaves(obj)
    return bool(found) and all(
        hasattr(leaf, "shape") and hasattr(leaf, "__len__") or isinstance(leaf, (list,))
        for leaf in found
    )


def to_numpy(obj: Any) -> Any:
    """Every leaf as a numpy array (tensors, pandas objects, lists); None stays None."""

    def convert(leaf: Any) -> Any:
        if hasattr(leaf, "numpy") and not isinstance(leaf, np.ndarray):
            try:
                return leaf.numpy()
            except Exception:
                pass
        if hasattr(leaf, "to_numpy"):  # pandas
            return leaf.to_numpy()
        return np.asarray(leaf)

    return map_structure(convert, obj, skip_none=True)


def unpack(data: Any) -> Tuple[Any, Any, Any]:
    """Keras's rule for one element: x, (x,), (x, y) or (x, y, sample_weight)."""
    if isinstance(data, list):
        data = tuple(data)
    if not isinstance(data, tuple):
        return data, None, None
    if len(data) == 1:
        return data[0], None, None
    if len(data) == 2:
        return data[0], data[1], None
    if len(data) == 3:
        return data
    raise bad_value(
        "data",
        f"a tuple of {len(data)} elements",
        "x, (x,), (x, y) or (x, y, sample_weight)",
        "yield batches in one of those forms",
    )
