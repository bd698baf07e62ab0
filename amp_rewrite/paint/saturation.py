"""Activations differentiated from their own output, whose gradient half rounds to zero where they saturate.

TensorFlow differentiates ``y = Sigmoid(x)`` from ``y`` itself:
``SigmoidGrad(y, dy) = dy * y * (1 - y)``. Where a unit saturates, ``y`` is
within half an ulp of 1, and half rounds it onto 1: from ``x`` about 6.2 in
bfloat16 (8 significant bits) and 8.3 in float16 (11), where float32 reaches
1 only from 17.3. ``1 - y`` is then exactly 0, and so is the gradient: the
unit's weights never move again. In float32 the gradient is small but not
zero, and an optimizer that divides by a gradient's running size (RMSProp,
Adam, Adagrad) turns it into full-sized updates that bring the unit back. A
network whose units saturate early (weights drawn with a standard deviation
of 1, as old tutorials do) then trains in float32 and stalls in half.
Keeping only the gradient float32 does not help, since ``y`` was rounded
before the gradient reads it.

So :func:`gradient_reads` finds each activation whose output its gradient
op reads (:data:`GRADIENT_READERS`), and the painting keeps three things
float32: the activation, the gradient op, and whatever carries the output
between them (an ``Identity``, a call's or a loop's boundary, the
TensorList or stack a loop's gradient pops it from). The activation's input
is cast up from the half op that computes it and its forward readers read a
half Cast of its output, so every matrix product around it stays half::

    allow(MatMul) -> infer(BiasAdd) -> infer(Sigmoid) -> allow(MatMul_1)
                                           `-> infer(SigmoidGrad)(y, dy <- allow(MatMul_1 grad))
                                                  -> infer(BiasAddGrad), allow(MatMul grads)

becomes::

    ALLOW -> ALLOW -> Cast -> DENY(Sigmoid) -> Cast -> ALLOW
                                `-> DENY(SigmoidGrad)(y, Cast(dy)) -> Cast -> ALLOW ...

A graph without the gradient (an inference graph, a model whose loss reads
the logits, as Keras's cross-entropies do from a sigmoid or softmax output)
has no such reader and is unchanged.

Which activations count was measured (``tools/benchmarks/bench_saturation.py
--activation``): autoencoders whose hidden layers are that activation,
weights with a standard deviation of 1, trained with RMSProp in float32, in
half as the lists paint them, and in half with the activation and its
gradient kept float32 (``docs/how-it-works.md`` gives the figures):

- ``Sigmoid``: stalls (TensorFlow-Examples' autoencoder 36% above
  float32's loss in bfloat16 and 20% in float16, its Keras port 7% in
  bfloat16); kept float32 it ends within 2% of float32.
- ``Tanh`` (``TanhGrad``, ``1 - y^2``; exactly 1 from ``x`` about 3.5 in
  bfloat16 and 4.5 in float16) gave mixed results: kept float32, the loss
  ended lower in four of six runs and higher in two, once 19 points higher
  (the Keras port in float16: 16% above float32 where the lists alone ended
  3% below). Such networks land up to 15% either side of float32 with any
  change of precision; no single run decides, and it is left to the lists.
- ``Elu`` (``EluGrad``, ``y + 1``), ``Selu`` (``SeluGrad``) and ``Softmax``
  (whose gradient TensorFlow builds from its output with ``Mul``, ``Sum``
  and ``Sub``) lose the same factor at their bounds, but their networks
  ended within about 5% of float32 in half, and keeping them float32 did
  not bring them consistently closer: they are left to the lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from amp_rewrite.graph.facts import DT_FLOAT
from amp_rewrite.graph.typed_graph import TypedGraph

#: Activation op → (the gradient op that reads its output, the input ordinal it reads it at).
GRADIENT_READERS = {"Sigmoid": ("SigmoidGrad", 0)}
#: The reason the painting gives the activation (the doctor recognises it).
REASON = ("activation differentiated from its output: kept float32 with its gradient, since half rounds a "
          "saturated output onto its bound, where the gradient's factor (y(1 - y) for Sigmoid) is exactly 0")
#: The reason given to the gradient op and to what carries the output to it.
GRADIENT_REASON = "computes an activation's gradient from its float32 output: kept float32 with it"
#: Ops that pass a value on unchanged, within a body or across a v1 loop's frames.
CARRY_OPS = frozenset({
    "Enter", "Exit", "Identity", "IdentityN", "Merge", "NextIteration", "Snapshot", "Switch",
})


@dataclass(frozen=True)
class GradientRead:
    """An activation whose output a gradient op reads, and the vertices that keep it exact.

    Attributes:
        activation: the activation's vertex.
        carriers: the vertices that pass its output on to the gradient ops (none when they read it directly).
        gradients: the gradient ops' vertices.
    """

    activation: int
    carriers: tuple[int, ...]
    gradients: tuple[int, ...]


def gradient_reads(graph: TypedGraph, dtypes: list[int], *, is_boundary: Callable[[int], bool],
                   structures: Iterable[Sequence[int]]) -> list[GradientRead]:
    """Each float32 activation of :data:`GRADIENT_READERS` whose output its gradient op reads, in node order.

    Args:
        graph: the typed view (every body: the gradient may be in another function or a loop's gradient body).
        dtypes: each vertex's dtype.
        is_boundary: whether a node is a call or a function's argument or result (it passes values on).
        structures: the element-type vertices of each data structure (a TensorList, a stack): a value
            written to one reaches every reader of it, as a loop's gradient pops the forward loop's values.
    """
    together = {v: members for members in structures for v in members}
    found = []
    for node, op in enumerate(graph.ops):
        reader = GRADIENT_READERS.get(op)
        if reader is None:
            continue
        vid = graph.output_vertex(node, 0)
        if vid is None or dtypes[vid] != DT_FLOAT:
            continue
        read = _gradient_read(graph, dtypes, vid, reader, is_boundary, together)
        if read is not None:
            found.append(read)
    return found


def _gradient_read(graph: TypedGraph, dtypes: list[int], activation: int, reader: tuple[str, int],
                   is_boundary: Callable[[int], bool], together: Mapping[int, Sequence[int]]) -> GradientRead | None:
    """The gradient ops reading ``activation``'s output at ``reader``'s ordinal, and the carriers between."""
    gradient_op, ordinal = reader
    ops, vertex_node = graph.ops, graph.vertex_node

    def carries(v: int) -> bool:
        node = vertex_node[v]
        return dtypes[v] == DT_FLOAT and (ops[node] in CARRY_OPS or is_boundary(node) or v in together)

    reached = _walk(activation, lambda v: (*graph.fanout[v], *together.get(v, ())), carries)
    gradients, read = [], set()  # the gradient ops reading it at the ordinal, and the vertices they read
    for w in sorted({w for v in reached for w in graph.fanout[v] if ops[vertex_node[w]] == gradient_op}):
        source = graph.input_source_vertex(vertex_node[w], ordinal)
        if source is not None and source in reached:
            gradients.append(w)
            read.add(source)
    if not gradients:
        return None
    # Every carrier on a path from the activation to a gradient's input: a Cast to half on any would round.
    on_paths: set[int] = set()
    for start in read:
        on_paths |= _walk(start, lambda v: (*graph.fanin[v], *together.get(v, ())), reached.__contains__)
    return GradientRead(activation, tuple(sorted(on_paths - {activation})), tuple(gradients))


def _walk(start: int, neighbours: Callable[[int], Iterable[int]], enter: Callable[[int], bool]) -> set[int]:
    """``start`` and every vertex reached from it through vertices ``enter`` accepts."""
    seen, stack = {start}, [start]
    while stack:
        for w in neighbours(stack.pop()):
            if w not in seen and enter(w):
                seen.add(w)
                stack.append(w)
    return seen
