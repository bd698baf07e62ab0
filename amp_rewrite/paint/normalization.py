"""Normalization statistics: the mean and variance a batch norm or a layer norm takes of one tensor.

``tf.nn.moments``, Keras 3's ``BatchNormalization`` and ``LayerNormalization``
(on the TensorFlow backend) and most hand-written norms compute::

    mean = Mean(x)                                  # the first statistic
    variance = Mean(SquaredDifference(x, StopGradient(mean)))   # or Square(Sub(x, mean))
    y = x * Rsqrt(variance + eps) * gamma + (beta - mean * ...)

:func:`statistics_nodes` finds them by structure: a reduction (``Mean``,
``Sum``) of a tensor ``x`` whose result, through ops that only pass it on,
is subtracted from that same ``x``; the subtraction; and the reduction of
its square, the variance. A mean subtracted with no variance after it
(centering alone) is left to the lists. The painting treats these as deny-list ops, so
the normalization that follows them (and its gradient) stays float32 up to
the next allow op, the way the fp16 lists already keep ``Mean``.

Why: a variance is a small difference of large sums, which 8 bits of
bfloat16 cannot hold (Keras's mixed policies and PyTorch's autocast compute
both norms in float32 for that reason); and on a CPU the elementwise
arithmetic of a norm is no faster in bfloat16 (outside oneDNN's fused
kernels each element is converted to float32 and back), while a norm half
in bfloat16 and half in float32, which the infer list leaves after the
moving averages keep their reductions float32, pays a Cast at every seam.
"""

from __future__ import annotations

from amp_rewrite.graph.typed_graph import TypedGraph

#: The reason the painting gives each statistic it keeps float32 (the doctor recognises it).
REASON = ("normalization statistics (the mean and variance of one tensor, as a batch or layer norm takes "
          "them): kept float32 like a deny-list op, as Keras's mixed policies and PyTorch's autocast keep norms")
#: Reductions that can compute a mean (a Sum, divided after).
STATISTIC_OPS = frozenset({"Mean", "Sum"})
#: Ops through which the mean reaches the subtraction unchanged in value.
_PASS_OPS = frozenset({"Identity", "StopGradient", "Reshape", "Squeeze", "ExpandDims", "Snapshot", "BroadcastTo"})
_CENTERING_OPS = frozenset({"SquaredDifference", "Sub"})
_PASS_DEPTH = 3


def statistics_nodes(graph: TypedGraph) -> set[int]:
    """The nodes of every mean/variance pair of ``graph``: reductions, what passes the mean on, the centering."""
    found: set[int] = set()
    for node, op in enumerate(graph.ops):
        if op not in STATISTIC_OPS or not graph.inputs(node):
            continue
        x = graph.inputs(node)[0]
        for centering, path in _centerings(graph, node, x):
            variance = _variances(graph, centering)
            if variance:  # a mean subtracted alone centres; with the variance after it, it normalizes
                found.update((node, centering, *path, *variance))
    return found


def _centerings(graph: TypedGraph, reduction: int, x: tuple[int, int]):
    """(centering node, pass nodes on the way) for each ``Sub``/``SquaredDifference`` of ``x`` and the mean."""
    frontier: list[tuple[int, tuple[int, ...]]] = [(reduction, ())]
    for _ in range(_PASS_DEPTH + 1):
        following = []
        for node, path in frontier:
            for consumer, _ in graph.consumers(node, 0):
                op = graph.ops[consumer]
                if op in _CENTERING_OPS and x in graph.inputs(consumer):
                    yield consumer, path
                elif op in _PASS_OPS:
                    following.append((consumer, (*path, consumer)))
        frontier = following


def _variances(graph: TypedGraph, centering: int) -> list[int]:
    """The variance's nodes after a centering: its reduction, and a ``Square`` between for a ``Sub``."""
    found = []
    for consumer, _ in graph.consumers(centering, 0):
        op = graph.ops[consumer]
        if op in STATISTIC_OPS:
            found.append(consumer)
        elif op == "Square" and graph.ops[centering] == "Sub":
            squared = [c for c, _ in graph.consumers(consumer, 0) if graph.ops[c] in STATISTIC_OPS]
            if squared:
                found.extend((consumer, *squared))
    return found
