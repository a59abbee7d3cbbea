"""tf.data internals kerasmgpu reads: the seeds of a pipeline's shuffle stages.

A `tf.data.Dataset` does not say whether its shuffles are seeded; its serialized graph
does (`Dataset._as_serialized_graph`, private; verified on TensorFlow 2.15.1 and
2.21.0). `shuffle(n)` with no seed and no global seed stores seed = seed2 = 0, which
the kernel replaces with a random seed of its own - different in every process.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable

# Shuffle ops whose 3rd and 4th inputs are `seed` and `seed2` (ShuffleDatasetV2 keeps
# them in a resource and cannot be read; it is not what Dataset.shuffle builds).
_SEEDED_INPUTS = {"ShuffleDataset", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
                  "ShuffleAndRepeatDatasetV2"}


def unseeded_shuffles(dataset: Any) -> int:
    """How many shuffle stages of `dataset` (nested functions included) draw a random
    seed of their own; 0 when the graph cannot be read."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    serialize = getattr(dataset, "_as_serialized_graph", None)
    if serialize is None:
        return 0
    graph = graph_pb2.GraphDef()
    try:
        graph.ParseFromString(serialize().numpy())
    except Exception:  # a dataset TF cannot serialize (e.g. from_generator): unknown
        return 0
    count = _count(tf, graph.node)
    for function in graph.library.function:
        count += _count(tf, function.node_def)
    return count


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
