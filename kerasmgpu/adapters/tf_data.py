"""tf.data internals kerasmgpu reads: the seeds of a pipeline's shuffle stages, and
whether reading it changes what a later read gets.

A `tf.data.Dataset` does not say whether its shuffles are seeded; its serialized graph
does (`Dataset._as_serialized_graph`, private; verified on TensorFlow 2.15.1 and
2.21.0). `shuffle(n)` with no seed and no global seed stores seed = seed2 = 0, which
the kernel replaces with a random seed of its own - different in every process.

`state_a_read_changes` reads the same graph with TensorFlow's op registry
(`tensorflow.python.framework.op_def_registry.get`, private; `OpDef.is_stateful`,
verified on 2.15.1 and 2.21.0): an op it marks stateful - a shuffle's seed generator, a
random op, a Python function, a generator - may give a later iterator other elements
once one more iterator read it (verify=True peeks a dataset's first batch).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

# Shuffle ops whose 3rd and 4th inputs are `seed` and `seed2` (ShuffleDatasetV2 keeps
# them in a resource and cannot be read; it is not what Dataset.shuffle builds).
_SEEDED_INPUTS = {"ShuffleDataset", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
                  "ShuffleAndRepeatDatasetV2"}


# Stateful in the op registry, yet sources a second iterator reads afresh, changing
# nothing another iterator reads.
_REREAD_ALIKE = frozenset({
    "TensorDataset", "TensorSliceDataset", "SparseTensorSliceDataset", "RangeDataset",
    "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
    "FixedLengthRecordDatasetV2"})


def _graph(dataset: Any) -> Optional[Any]:
    """`dataset`'s serialized graph (a GraphDef), None when it cannot be read."""
    from tensorflow.core.framework import graph_pb2

    serialize = getattr(dataset, "_as_serialized_graph", None)
    if serialize is None:
        return None
    graph = graph_pb2.GraphDef()
    try:
        graph.ParseFromString(serialize().numpy())
    except Exception:  # a dataset TF cannot serialize (e.g. from_generator): unknown
        return None
    return graph


def unseeded_shuffles(dataset: Any) -> int:
    """How many shuffle stages of `dataset` (nested functions included) draw a random
    seed of their own; 0 when the graph cannot be read."""
    import tensorflow as tf

    graph = _graph(dataset)
    if graph is None:
        return 0
    count = _count(tf, graph.node)
    for function in graph.library.function:
        count += _count(tf, function.node_def)
    return count


def state_a_read_changes(dataset: Any) -> Optional[List[str]]:
    """The ops of `dataset` (nested functions included) that an extra read may leave
    changed for the next (see the module doc), [] when none; None when the graph or the
    registry cannot be read."""
    try:
        from tensorflow.python.framework import op_def_registry
    except ImportError:
        return None
    graph = _graph(dataset)
    if graph is None or not callable(getattr(op_def_registry, "get", None)):
        return None
    nodes = list(graph.node) + [node for function in graph.library.function
                                for node in function.node_def]
    found = set()
    for name in {node.op for node in nodes}:
        if name.startswith("_") or name in _REREAD_ALIKE:
            continue  # `_Retval` and the like: no op of the registry
        op_def = op_def_registry.get(name)
        if op_def is None or op_def.is_stateful:
            found.add(name)
    return sorted(found)


def _count(tf: Any, nodes: Iterable[Any]) -> int:
    nodes = list(nodes)
    by_name: Dict[str, Any] = {node.name: node for node in nodes}
    count = 0
    for node in nodes:
        if node.op not in _SEEDED_INPUTS or len(node.input) < 4:
            continue
        seeds = []
        for name in node.input[2:4]:
            source = by_name.get(name.split(":")[0].lstrip("^"))
            if source is None or source.op != "Const":
                break  # computed at run time: cannot tell
            seeds.append(int(tf.make_ndarray(source.attr["value"].tensor)))
        if len(seeds) == 2 and seeds == [0, 0]:
            count += 1
    return count
