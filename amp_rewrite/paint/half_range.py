"""Values beyond the half range that the graph shows: large constants, and products with them.

A mask adder is the common case. tf_keras's ``Softmax`` (and so its
``MultiHeadAttention``), Keras 3's ``Softmax`` and many hand-written
attentions compute, in the float32 they were traced in::

    adder = (1.0 - mask) * -1e9             # or where(mask, scores, -1e9), or float32.min
    probs = Softmax(scores + adder)

float16 reaches 65504. Cast to float16, -1e9 is -inf; a fully masked row is
then all -inf, and its softmax is NaN (0 / 0), which the loss and every
gradient inherit. Saturating the constant to -65504 instead is exact for
the exponential (``exp(-65504)`` and ``exp(-1e9)`` are both 0 in any float),
but not for the sum before it: ``-65504 + s`` is -inf in float16 for any
score ``s`` below -16, so the row is NaN again. Keras's own float16 policies
pick a smaller adder (``-3e4``, or ``float16.min / 2``) for that reason,
which changes the value the user wrote. So the painting keeps these values
float32 instead: every op that reads one stays float32, as a deny-list op
does, and with it what follows up to the next allow op (the ``Add`` and the
``Softmax`` after the mask), so the value never meets a Cast to float16. The
Softmax's result lies in [0, 1] and goes back to half there.

:func:`beyond_range` finds them. A value is beyond the range when it is a
float32 ``Const`` whose largest finite magnitude exceeds the limit, or the
output of an op that keeps its input's magnitude (:data:`CARRY_OPS`: an
``Identity``, a reshape, a broadcast, a ``Neg``, a selection, a call's
argument or result) reading such a value, or of one product
(:data:`PRODUCT_OPS`) with one: ``(1 - mask) * -1e9`` is ``-1e9`` wherever a
position is masked. Products of products are not followed: ``x * -1e9 *
1e-9`` is in range, and a chain of products could taint a whole network.
Infinities and NaN convert to half exactly and do not count.

bfloat16 has float32's exponent but 8 bits of precision, so its largest
finite value (3.38953e38) lies below float32's (3.40282e38), and a Cast
rounds float32's largest magnitudes to infinity: ``tf.float32.min``, a
common mask value, becomes -inf, and the fully masked row NaN as in
float16. Its limit (:data:`LIMITS`) is the largest float32 that a Cast to
bfloat16 leaves finite, so only those magnitudes count; a mask of -1e9
goes bfloat16 with the scores.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF, DTYPE_NAMES, FLOAT16_MAX, HALF_MAX
from amp_rewrite.graph.typed_graph import TypedGraph

#: The reason the painting gives each op it keeps float32 here (the rest of the sentence names the constant).
REASON = "reads a value beyond the half range"
#: The largest float32 that a Cast to bfloat16 leaves finite (3.3961773e38). bfloat16's largest finite value
#: is 0x7F7F; float32 values from 0x7F7F8000 up lie at or past the midpoint between it and infinity, and
#: round-to-nearest-even takes them to infinity (the midpoint too: 0x7F7F is odd).
BFLOAT16_CAST_LIMIT = struct.unpack("<f", struct.pack("<I", 0x7F7F7FFF))[0]
#: Per target, the largest magnitude a value may have and still meet a Cast to it. float16's is its
#: largest finite value: a value just beyond rounds to it, but a mask adder there overflows in the sum
#: after it (see above).
LIMITS = {DT_HALF: FLOAT16_MAX, DT_BFLOAT16: BFLOAT16_CAST_LIMIT}
#: Ops whose output holds the magnitude of a float input (shapes, sign, selection, concatenation).
CARRY_OPS = frozenset({
    "BroadcastTo", "ConcatV2", "EnsureShape", "ExpandDims", "Fill", "Identity", "IdentityN", "Neg", "Pack",
    "PreventGradient", "Reshape", "Select", "SelectV2", "Snapshot", "Squeeze", "StopGradient", "Tile",
    "Transpose",
})
#: Products: a factor beyond the range makes the product so wherever the other factor is not small.
PRODUCT_OPS = frozenset({"Mul", "MulNoNan"})
#: Ops that read only a tensor's shape: the value never reaches them.
_SHAPE_READERS = frozenset({"OnesLike", "Rank", "Shape", "ShapeN", "Size", "ZerosLike"})


@dataclass(frozen=True)
class BeyondRange:
    """An op's vertex that reads a value beyond the range, and where that value comes from.

    Attributes:
        source: the vertex whose output it reads (the ``Const``, or an op carrying its value).
        const: the ``Const`` node the value comes from.
        peak: the Const's largest finite magnitude.
    """

    source: int
    const: int
    peak: float

    def reason(self, graph: TypedGraph, target: int) -> str:
        """The sentence the painting records for ``target`` (a half dtype): the rule, the constant, and why a
        Cast would not do."""
        name = DTYPE_NAMES[target]
        return (f"{REASON} (Const {graph.names[self.const]} holds |value| up to {self.peak:g}, "
                f"{name} reaches {HALF_MAX[target]:g}): kept float32, as a deny-list op, "
                f"since a Cast to {name} would make it infinite")


def beyond_range(graph: TypedGraph, dtypes: list[int], *, limit: float, is_boundary: Callable[[int], bool],
                 is_readable: Callable[[int], bool]) -> dict[int, BeyondRange]:
    """The vertices that read a value beyond ``limit``, each with where that value comes from.

    Args:
        graph: the typed view (every body's nodes: constants inside functions count).
        dtypes: each vertex's dtype.
        limit: the largest magnitude that a Cast to the half type leaves finite (:data:`LIMITS`).
        is_boundary: whether a node is a call or a function's argument or result (it passes values on).
        is_readable: whether a reader's vertex could turn half; a Const none of whose readers could
            is not decoded.

    Returns:
        Vertex id → :class:`BeyondRange`, for the first value found to reach it (Consts in node order).
    """
    from amp_rewrite.graph.tensors import max_abs  # numpy: loaded when a graph is painted, not on import

    found: dict[int, BeyondRange] = {}
    for node, op in enumerate(graph.ops):
        if op != "Const":
            continue
        vid = graph.output_vertex(node, 0)
        if vid is None or dtypes[vid] != DT_FLOAT or not any(is_readable(w) for w in graph.fanout[vid]):
            continue
        peak = max_abs(graph.nodes[node].attr["value"].tensor, f"node {graph.names[node]} (op Const)")
        if peak > limit:
            _follow(graph, dtypes, vid, node, peak, is_boundary, found)
    return found


def _follow(graph: TypedGraph, dtypes: list[int], start: int, const: int, peak: float,
            is_boundary: Callable[[int], bool], found: dict[int, BeyondRange]) -> None:
    """Records every reader of the Const's value and of what carries it on (at most one product deep)."""
    ops, vertex_node = graph.ops, graph.vertex_node
    seen = {(start, False)}
    stack = [(start, False)]
    while stack:
        v, multiplied = stack.pop()
        for w in graph.fanout[v]:
            node = vertex_node[w]
            op = ops[node]
            if dtypes[w] != DT_FLOAT or op in _SHAPE_READERS:
                continue
            found.setdefault(w, BeyondRange(v, const, peak))
            if op in CARRY_OPS or is_boundary(node):
                state = (w, multiplied)
            elif op in PRODUCT_OPS and not multiplied:
                state = (w, True)
            else:
                continue
            if state not in seen:
                seen.add(state)
                stack.append(state)
