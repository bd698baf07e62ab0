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
between them (an ``Identity``, a call's boundary: a ``tf.function``
differentiated from outside has its gradient in another function). The
activation's input is cast up from the half op that computes it and its
forward readers read a half Cast of its output, so every matrix product
around it stays half::

    allow(MatMul) -> infer(BiasAdd) -> infer(Sigmoid) -> allow(MatMul_1)
                                           `-> infer(SigmoidGrad)(y, dy <- allow(MatMul_1 grad))
                                                  -> infer(BiasAddGrad), allow(MatMul grads)

becomes::

    ALLOW -> ALLOW -> Cast -> DENY(Sigmoid) -> Cast -> ALLOW
                                `-> DENY(SigmoidGrad)(y, Cast(dy)) -> Cast -> ALLOW ...

A graph without the gradient (an inference graph, a model whose loss reads
the logits, as Keras's cross-entropies do from a sigmoid or softmax output)
has no such reader and is unchanged.

An activation that runs once per loop iteration is left to the lists: an
LSTM's gates. Kept float32 there, with the cell's gating after them, they
cost Casts on every iteration of the loop and of its gradient (8 where the
lists put 2), and a TF1 LSTM training step of 256 units ran 12% slower in
bfloat16 on a CPU with AMX (58 against 52 ms), while LSTMs whose gate
weights were drawn with a standard deviation of 1 or 2 trained in bfloat16
as in float32. Calls are followed: a Sigmoid in a ``tf.function`` whose
gradient is in another one is kept, and so is the path between them.

Which activations count was measured (``tools/benchmarks/bench_saturation.py
--activation``): autoencoders whose hidden layers are that activation,
weights with a standard deviation of 1, trained with RMSProp in float32, in
half as the lists paint them, and in half with the activation and its
gradient kept float32 (``docs/benchmarks.md`` gives the figures):

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
  ended within about 5% of float32 in half (Softmax: a classifier), and
  keeping them float32 did not bring them consistently closer: they are
  left to the lists.
"""

from __future__ import annotations

from collections.abc import Callable
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
#: Ops that pass a value on unchanged (a v1 cond's Switch and Merge among them).
CARRY_OPS = frozenset({"Identity", "IdentityN", "Merge", "Snapshot", "Switch"})


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


def gradient_reads(graph: TypedGraph, dtypes: list[int], *, is_boundary: Callable[[int], bool]) -> list[GradientRead]:
    """Each float32 activation of :data:`GRADIENT_READERS` whose output its gradient op reads, in node order.

    An activation that runs once per loop iteration (a recurrent cell's gate,
    in a v1 while frame or a While's body) is left out: see the module's
    docstring for what that costs and what was measured.

    Args:
        graph: the typed view (every body: the gradient may be in another function than the activation).
        dtypes: each vertex's dtype.
        is_boundary: whether a node is a call or a function's argument or result (it passes values on).
    """
    candidates = [node for node, op in enumerate(graph.ops) if op in GRADIENT_READERS]
    if not candidates:
        return []
    per_iteration, in_v1_loops = graph.loop_instances(), graph.v1_loop_nodes()
    found = []
    for node in candidates:
        vid = graph.output_vertex(node, 0)
        if (vid is None or dtypes[vid] != DT_FLOAT or node in in_v1_loops
                or graph.body_of[node] in per_iteration):
            continue
        read = _gradient_read(graph, dtypes, vid, GRADIENT_READERS[graph.ops[node]], is_boundary)
        if read is not None:
            found.append(read)
    return found


def _gradient_read(graph: TypedGraph, dtypes: list[int], activation: int, reader: tuple[str, int],
                   is_boundary: Callable[[int], bool]) -> GradientRead | None:
    """The gradient ops reading ``activation``'s output at ``reader``'s ordinal, and the carriers between."""
    gradient_op, ordinal = reader
    ops, vertex_node = graph.ops, graph.vertex_node

    def carries(v: int) -> bool:
        node = vertex_node[v]
        return dtypes[v] == DT_FLOAT and (ops[node] in CARRY_OPS or is_boundary(node))

    reached = set(graph.reach([activation], forward=True, backward=False, enter=carries))
    gradients, read = [], set()  # the gradient ops reading it at the ordinal, and the vertices they read
    for w in sorted({w for v in reached for w in graph.fanout[v] if ops[vertex_node[w]] == gradient_op}):
        source = graph.input_source_vertex(vertex_node[w], ordinal)
        if source is not None and source in reached:
            gradients.append(w)
            read.add(source)
    if not gradients:
        return None
    # Every carrier on a path from the activation to a gradient's input: a Cast to half on any would round.
    on_paths = set(graph.reach(sorted(read), forward=False, backward=True, enter=reached.__contains__))
    return GradientRead(activation, tuple(sorted(on_paths - {activation})), tuple(gradients))
