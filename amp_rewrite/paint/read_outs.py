"""The read-out tail: the reductions whose values a user reads, and the arithmetic after them.

A loss or a metric is a reduction (``Sum``, ``Mean``) followed by a little
scalar arithmetic (``DivNoNan`` by the number of examples, ``AddN`` of the
regularisation terms), ending where the user reads it: a fetched tensor, a
function's result, a variable written with it (a metric's running total, a
loss tracker), a summary. Reduced in half, such a value is rounded to half's
8 (bfloat16) or 11 (float16) bits, so a reported loss moves in steps of 0.4%
and callbacks that compare losses (early stopping, keeping the best
checkpoint) see ties and jumps float32 would not show. A write of the
model's own state is no read-out: a weight (its value feeds the model) or an
optimizer's moment (its value updates a weight) receives a gradient, which
no user reads, so a bias's gradient summed over the batch in half is cast
once, after the sum.

A node's output is *reduced* when the node is a reduction, or when it is
elementwise arithmetic or a reshape (:data:`PASS_OPS`) whose float inputs are
all reduced or constant-like (a ``Const``, a ``Cast`` of an integer such as a
count of examples, a variable's value, one of those broadcast). So the loss
``DivNoNan(Sum(SquaredDifference(y, t)), Cast(Size(t)))`` is reduced from its
``Sum`` on, and so is a metric's ``total + Sum(values)``. A reduction whose
value goes back into the model is no read-out: a layer norm's or a batch
norm's ``Mean`` feeds ``Sub(x, mean)``, whose ``x`` is no reduced value, even
when a moving average reads the same ``Mean``. :func:`read_out_tail` returns
the reduced nodes, feeding no such consumer, from which a read-out is reached
through such nodes only; the painting keeps them float32. The elementwise
ops that feed the first reduction (the per-example errors) stay as the other
rules paint them: each is rounded once, and the float32 reduction averages
those roundings out instead of adding one of its own per partial sum.
"""

from __future__ import annotations

from collections.abc import Iterator

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF
from amp_rewrite.graph.instances import WHILE_OPS
from amp_rewrite.graph.typed_graph import TypedGraph

#: Reductions whose result a loss or a metric is made of.
REDUCTION_OPS = frozenset({"EuclideanNorm", "L2Loss", "Mean", "Prod", "Sum"})
#: Ops whose output is reduced when their float inputs are: elementwise
#: arithmetic, selection between such values, and ops that only reshape.
PASS_OPS = frozenset({
    "Abs", "Add", "AddN", "AddV2", "Cast", "CheckNumerics", "Div", "DivNoNan", "EnsureShape", "Exp",
    "ExpandDims", "Identity", "Inv", "Log", "Log1p", "Maximum", "Minimum", "Mul", "MulNoNan", "Neg", "Pow",
    "PreventGradient", "RealDiv", "Reciprocal", "Reshape", "Rsqrt", "Select", "SelectV2", "Snapshot", "Sqrt",
    "Square", "Squeeze", "StopGradient", "Sub",
})
#: Ops a user reads values through, with the inputs that carry them: variable
#: writes (the value, input 1) and summaries (every input; tags and steps are
#: no float values).
VARIABLE_WRITES = frozenset({"Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp",
                             "AssignSubVariableOp"})
SUMMARY_OPS = frozenset({"HistogramSummary", "ScalarSummary", "TensorSummary", "TensorSummaryV2",
                         "WriteHistogramSummary", "WriteScalarSummary", "WriteSummary"})
_FLOATS = frozenset({DT_FLOAT, DT_HALF, DT_BFLOAT16})
# Constant-like values (see :class:`_Reduced`), and the ops that pass one on
# (their first input is the value; the others are shapes or multiples).
_CONSTANT_OPS = frozenset({"Const", "OnesLike", "ReadVariableOp", "ZerosLike"})
_SHAPING_OPS = {"BroadcastTo": 0, "ExpandDims": 0, "Fill": 1, "Identity": 0, "Reshape": 0, "Squeeze": 0, "Tile": 0}
_SHAPING_DEPTH = 8
_CONTROL_FLOW_OPS = WHILE_OPS | {"If", "StatelessIf", "Case", "StatelessCase"}
# How a variable's value is read, and the ops through which a value is returned as it is.
_READ_OPS = frozenset({"ReadVariableOp", "Identity"})
_RESULT_OPS = frozenset({"_Retval", "IdentityN", "NoOp"})
#: How many ops after a variable's read :func:`_is_model_state` looks for a use by the model.
_STATE_DEPTH = 8


def read_out_tail(graph: TypedGraph, dtypes: list[int], preserved: frozenset[str]) -> set[int]:
    """The reduced nodes from which a read-out is reached through reduced nodes only.

    A reduced node whose value also goes back into the model (a consumer
    combines it with an unreduced tensor, as a batch norm's ``Sub(x, mean)``
    does) is no read-out, even when a moving average also reads it: it ends
    the walk.

    Args:
        graph: the typed view.
        dtypes: each vertex's dtype (the painting context's).
        preserved: names of the main graph's fetched and preserved nodes.

    Returns:
        Node indices, any body's. A walk back from each read-out enters each
        node once, so the cost is linear in the nodes and edges it meets.
    """
    reduced = _Reduced(graph, dtypes)
    tail: set[int] = set()
    seen: set[int] = set()
    stack = list(_read_out_sources(graph, preserved))
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if reduced(node) and not _feeds_the_model(graph, node, reduced):
            tail.add(node)
            stack.extend(src for src, _ in graph.inputs(node))
    return tail


def _feeds_the_model(graph: TypedGraph, node: int, reduced: _Reduced) -> bool:
    """Whether a consumer of ``node`` combines its value with an unreduced tensor (normalises by it)."""
    ops = graph.ops
    return any(ops[consumer] in PASS_OPS and not reduced(consumer)
               for _, consumer, _ in graph.edges.out_edges(node))


def _read_out_sources(graph: TypedGraph, preserved: frozenset[str]) -> Iterator[int]:
    """The nodes whose outputs are read out: the inputs of fetches, results, variable writes and summaries."""
    index, ops = graph.index, graph.ops
    readers = [index[name] for name in sorted(preserved) if name in index]
    for body in graph.bodies[1:]:
        if body.call is not None and ops[body.call] not in _CONTROL_FLOW_OPS:  # a loop's or branch's: no read-out
            readers.extend(body.rets)
    for node, op in enumerate(ops):
        if op in SUMMARY_OPS:
            readers.append(node)
        elif op in VARIABLE_WRITES:
            inputs = graph.inputs(node)
            if len(inputs) > 1 and not _is_model_state(graph, inputs[0]):
                yield inputs[1][0]
    for reader in readers:
        for src, _ in graph.inputs(reader):
            yield src


def _is_model_state(graph: TypedGraph, variable: tuple[int, int]) -> bool:
    """Whether the variable is the model's or its optimizer's: its value reaches an op that computes with it.

    A weight's value feeds a MatMul; an optimizer's moment feeds the update
    of a weight (another variable's write). A metric's total, a loss
    tracker's, a batch norm's moving average feed only their own update and
    what the user reads: those are read-outs. Writes of model state carry a
    gradient, which is no value a user reads: reduced in half (a bias's
    gradient summed over the batch) it is cast once, after the reduction.
    """
    reads = [consumer for port, consumer, k in graph.edges.out_edges(variable[0])
             if port == variable[1] and graph.ops[consumer] in _READ_OPS and k == 0]
    seen: set[int] = set()
    frontier = reads
    for _ in range(_STATE_DEPTH):
        following = []
        for node in frontier:
            for _, consumer, k in graph.edges.out_edges(node):
                op = graph.ops[consumer]
                if consumer in seen:
                    continue
                seen.add(consumer)
                if op in VARIABLE_WRITES:
                    if k == 1 and graph.inputs(consumer)[0] != variable:
                        return True  # the value updates another variable
                elif op not in PASS_OPS and op not in SUMMARY_OPS and op not in _RESULT_OPS:
                    return True  # the model computes with it
                else:
                    following.append(consumer)
        frontier = following
    return False


class _Reduced:
    """Whether a node's output is reduced, decided once per node (iteratively: chains may be long).

    Constant-like inputs do not stop a value being reduced: a ``Const``, a
    ``Cast`` of an integer (a count of examples), a variable's value (a
    running total ``total + batch_sum``, a moving average), and such a value
    broadcast or reshaped.
    """

    def __init__(self, graph: TypedGraph, dtypes: list[int]):
        self.graph, self.dtypes = graph, dtypes
        self.known: dict[int, bool] = {}
        self.constant: dict[int, bool] = {}

    def __call__(self, node: int) -> bool:
        known = self.known
        if node in known:
            return known[node]
        stack = [node]
        while stack:
            top = stack[-1]
            if top in known:
                stack.pop()
                continue
            undecided = [src for src in self._float_sources(top) if src not in known]
            if undecided:
                stack.extend(undecided)
                continue
            stack.pop()
            known[top] = self._decide(top)
        return known[node]

    def _decide(self, node: int) -> bool:
        op = self.graph.ops[node]
        if op in REDUCTION_OPS:
            return True
        return op in PASS_OPS and all(self.known[src] for src in self._float_sources(node))

    def _float_sources(self, node: int) -> list[int]:
        """The producers of ``node``'s float inputs that are not constant-like (none for a reduction)."""
        graph = self.graph
        op = graph.ops[node]
        if op in REDUCTION_OPS or op not in PASS_OPS:
            return []
        return [src for src, port in graph.inputs(node)
                if self._is_float(src, port) and not self.is_constant(src)]

    def _is_float(self, node: int, port: int) -> bool:
        vid = self.graph.output_vertex(node, port)
        return vid is not None and self.dtypes[vid] in _FLOATS

    def is_constant(self, node: int) -> bool:
        """A ``Const``, a ``Cast`` of an integer, a variable's value, or one of those broadcast or reshaped."""
        found = self.constant.get(node)
        if found is None:
            found = self.constant[node] = self._constant(node, depth=0)
        return found

    def _constant(self, node: int, depth: int) -> bool:
        graph = self.graph
        op = graph.ops[node]
        if op in _CONSTANT_OPS:
            return True
        inputs = graph.inputs(node)
        if op == "Cast":
            return bool(inputs) and not self._is_float(*inputs[0])
        value = _SHAPING_OPS.get(op)
        if value is None or len(inputs) <= value or depth > _SHAPING_DEPTH:
            return False
        return self._constant(inputs[value][0], depth + 1)
