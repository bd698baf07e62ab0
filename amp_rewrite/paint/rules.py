"""The painting rules: which type attributes become half.

Colour is state kept in two sets of vertex ids (``allow`` and ``deny``) on a
:class:`Painting`, never attributes written on nodes. Each rule is one
function ``rule(ctx, painting)`` that reads a
:class:`~amp_rewrite.paint.context.PaintContext` and grows or shrinks those
sets, and nothing else. The rules are defined below in the order they run,
and :data:`RULES` (:data:`ROOT_RULES`, then :data:`SPREAD_RULES`) is that
order as data: :func:`amp_rewrite.pipeline.paint` loops over it. It is the one
account of the schedule: the numbered list of ``docs/how-it-works.md`` is
written from it and from the first line of each rule's docstring
(``tools/dev/rules_list.py``; a test holds the page to them), so that line
says what the rule does in words a user reads. Every rule is a reachability
question answered by :meth:`TypedGraph.reach`, so no result depends on the
order nodes appear in the GraphDef.

:func:`~amp_rewrite.paint.tensor_lists.find_tensor_list_clusters` runs before the
rules. It is no rule: it paints nothing and returns the clusters a
:class:`Painting` holds and the edges that the caller adds to the view.

Legend for the examples in the docstrings: ``allow``/``infer``/``clear``/``deny``
name the list an op is on; ``ALLOW``/``DENY`` the colour painted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from amp_rewrite.paint.context import PaintContext
from amp_rewrite.paint.fusions import bias_gradients_beside_filter_gradients
from amp_rewrite.paint.half_range import LIMITS as HALF_RANGE_LIMITS
from amp_rewrite.paint.half_range import beyond_range
from amp_rewrite.paint.normalization import REASON as NORMALIZATION_REASON
from amp_rewrite.paint.normalization import statistics_nodes
from amp_rewrite.paint.op_lists import Colour
from amp_rewrite.paint.read_outs import read_out_tail
from amp_rewrite.paint.saturation import GRADIENT_REASON as SATURATION_GRADIENT_REASON
from amp_rewrite.paint.saturation import REASON as SATURATION_REASON
from amp_rewrite.paint.saturation import gradient_reads
from amp_rewrite.paint.tensor_lists import TensorListCluster

logger = logging.getLogger(__name__)

# The list colours as plain names: per-vertex loops compare against them, and an
# Enum member's lookup through its class costs several times a comparison.
_ALLOW, _INFER, _DENY, _CLEAR = Colour.ALLOW, Colour.INFER, Colour.DENY, Colour.CLEAR

@dataclass
class Painting:
    """The colour of every vertex: in ``allow`` (becomes half), in ``deny``, or neither.

    :meth:`reason` gives a vertex's (rule, cause): the rule that last decided
    its colour and the neighbouring vertex that caused it, or None. They are
    held in two lists by vertex id (``vertex_count`` long), not as one pair
    per vertex: a large graph has hundreds of thousands of decisions.
    ``tensor_list_clusters`` are the groups whose element types must agree.
    ``deny_roots`` are vertices that :func:`paint_deny_forward` treats as
    deny-list ops though their ops are on another list (a norm's statistics).
    ``allowed``, ``denied`` and ``unmarked`` count the vertices that
    :meth:`mark_allow`, :meth:`mark_deny` and :meth:`unmark_allow` changed,
    so a caller can tell what each rule did.
    """

    vertex_count: int
    allow: set[int] = field(default_factory=set)
    deny: set[int] = field(default_factory=set)
    tensor_list_clusters: list[TensorListCluster] = field(default_factory=list)
    deny_roots: set[int] = field(default_factory=set)
    allowed: int = 0
    denied: int = 0
    unmarked: int = 0
    _rules: list[str | None] = field(init=False, repr=False)
    _causes: list[int | None] = field(init=False, repr=False)

    def __post_init__(self):
        self._rules = [None] * self.vertex_count
        self._causes = [None] * self.vertex_count

    def reason(self, vid: int) -> tuple[str, int | None] | None:
        """(rule, cause) of the last decision on the vertex's colour; None if no rule decided it."""
        rule = self._rules[vid]
        return None if rule is None else (rule, self._causes[vid])

    def mark_allow(self, vid: int, rule: str, cause: int | None = None) -> None:
        if vid not in self.allow:
            self.allow.add(vid)
            self._rules[vid], self._causes[vid] = rule, cause
            self.allowed += 1

    def mark_deny(self, vid: int, rule: str, cause: int | None = None) -> None:
        self.allow.discard(vid)
        if vid not in self.deny:
            self.deny.add(vid)
            self._rules[vid], self._causes[vid] = rule, cause
            self.denied += 1

    def note(self, vid: int, rule: str) -> None:
        """Replaces the rule that decided the vertex's colour, without changing the colour."""
        self._rules[vid] = rule

    def unmark_allow(self, vid: int, rule: str, cause: int | None = None) -> None:
        if vid in self.allow:
            self.allow.discard(vid)
            self._rules[vid], self._causes[vid] = rule, cause
            self.unmarked += 1


# -- the rules, in the order they run (ROOT_RULES, then SPREAD_RULES) ------


def deny_escaping_tensor_lists(ctx: PaintContext, painting: Painting) -> None:
    """Paints DENY every data-structure cluster whose handle escapes what the rewrite can see.

    A TensorList passed to a placeholder, a fetch or an opaque call may be
    read or written there in float32, so all its ops keep a float32 element
    type, and an allow op among them is never a root.
    """
    for cluster in painting.tensor_list_clusters:
        if cluster.escapes:
            for v in cluster.vertices:
                painting.mark_deny(v, "data structure handle escapes what the rewrite can see")


def paint_allow_ops(ctx: PaintContext, painting: Painting) -> None:
    """Paints ALLOW every float32 vertex of an allow-list op that can run in half.

    Under UNSAFE_FORCE_ALL every convertible vertex is painted, except those of
    stateful ops, ops with ref inputs or outputs, and Consts.
    """
    listed = ctx.vertex_list
    for vid in range(len(ctx.graph.vertex_node)):
        if vid in painting.deny:
            continue
        if listed[vid] == _ALLOW:
            if ctx.can_convert(vid):
                painting.mark_allow(vid, "allow-list op")
        elif ctx.force_all and ctx.can_convert(vid) and ctx.can_force(vid):
            painting.mark_allow(vid, "forced (UNSAFE_FORCE_ALL)")


# Ops through which a variable's old value reaches its new one in an update
# (``v.assign(v * decay + x)``, ``total.assign(total + batch_sum)``). Cast and
# Identity pass the value on; the others do the update's arithmetic.
_UPDATE_ARITHMETIC = frozenset({"Add", "AddN", "AddV2", "DivNoNan", "Maximum", "Minimum", "Mul",
                                "MulNoNan", "Neg", "RealDiv", "Select", "SelectV2", "Sqrt", "Square", "Sub"})
_UPDATE_PASS = frozenset({"Cast", "Identity"})
_VARIABLE_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
# How many ops an update's arithmetic may chain between the read and the write.
_UPDATE_DEPTH = 6


def keep_variable_updates_float32(ctx: PaintContext, painting: Painting) -> None:
    """Paints DENY the arithmetic that computes a variable's new value from its old one.

    ``total.assign(total + sum(allow(x)))`` is ``ReadVariableOp -> infer
    (AddV2) -> AssignVariableOp`` on one variable; the AddV2 is painted DENY,
    so the running total (a Keras metric's, a batch norm's moving average,
    an optimizer's moments) keeps float32's 24 bits instead of half's 8 or
    11, with which it would stop growing once each step adds less than a
    half-precision ulp of it. The value added may still be half: a Cast
    joins it. Only chains of elementwise ops (:data:`_UPDATE_ARITHMETIC`) up
    to :data:`_UPDATE_DEPTH` long, from a ``ReadVariableOp`` of the same
    resource tensor to the written value, count; a variable's old value that
    reaches its update through the model (a bias's gradient) does not.
    """
    if ctx.force_all:
        return
    graph = ctx.graph
    in_start, in_src, in_port = graph.edges.in_start, graph.edges.in_src, graph.edges.in_port
    writes, read_nodes = [], []
    for node, op in enumerate(graph.ops):
        if op == "ReadVariableOp":
            read_nodes.append(node)
        elif op in _VARIABLE_WRITES:
            writes.append(node)
    if not writes or not read_nodes:
        return
    # A variable is its resource tensor: the (node, port) both ops take as input 0.
    written = {(in_src[in_start[w]], in_port[in_start[w]]) for w in writes}
    reads: dict[tuple[int, int], list[int]] = {}
    for node in read_nodes:
        resource = (in_src[in_start[node]], in_port[in_start[node]])
        if resource in written:
            reads.setdefault(resource, []).append(node)
    for write in writes:
        first = in_start[write]
        old_values = reads.get((in_src[first], in_port[first]))
        if old_values:
            for node in _update_chain(graph, in_src[first + 1], old_values):
                for vid in (*(graph.in_vids[node] or ()), *(graph.out_vids[node] or ())):
                    if vid not in painting.deny and ctx.can_convert(vid):
                        painting.mark_deny(vid, "computes a variable's new value from its old one")


def _update_chain(graph, value: int, old_values: list[int]) -> set[int]:
    """The update-arithmetic nodes within :data:`_UPDATE_DEPTH` ops of ``value`` that lead back to a read.

    A breadth-first walk back from ``value`` through update arithmetic, each
    node entered once (so a wide ``AddN`` costs its fan-in, not a path per
    combination), then the nodes of that walk from which one of
    ``old_values`` is reached, found to a fixed point.
    """
    ops, olds = graph.ops, set(old_values)
    depth = {value: 0}
    sources: dict[int, list[int]] = {}  # each entered arithmetic node → its data inputs' nodes
    frontier = [value]
    while frontier:
        deeper = []
        for node in frontier:
            op = ops[node]
            if node in olds or depth[node] == _UPDATE_DEPTH or (
                    op not in _UPDATE_ARITHMETIC and op not in _UPDATE_PASS):
                continue
            sources[node] = [source for source, _ in graph.inputs(node)]
            for source in sources[node]:
                if source not in depth:
                    depth[source] = depth[node] + 1
                    deeper.append(source)
        frontier = deeper
    leads_back = set()
    grew = True
    while grew:
        grew = False
        for node, inputs in sources.items():
            if node not in leads_back and any(s in olds or s in leads_back for s in inputs):
                leads_back.add(node)
                grew = True
    return {node for node in leads_back if ops[node] not in _UPDATE_PASS}


READ_OUT = ("read out as a loss or metric (fetched, returned, written to a variable or a summary after a "
            "reduction): kept float32 so it carries float32's precision")


def keep_read_outs_float32(ctx: PaintContext, painting: Painting) -> None:
    """Paints DENY the reductions a user reads and the arithmetic after them.

    ``allow(MatMul) -> infer(SquaredDifference) -> infer(Sum) -> infer(DivNoNan)
    -> fetched`` becomes ``ALLOW -> infer -> DENY -> DENY -> fetched``: the
    loss is reduced and scaled in float32 from the half errors, as a Keras
    mixed-precision policy computes its losses, instead of being rounded to
    half's 8 or 11 bits. What counts as read out is
    :func:`~amp_rewrite.paint.read_outs.read_out_tail`'s; a layer norm's or a
    pooling's reduction, which feeds the model on, is not.
    """
    if ctx.force_all:
        return
    graph = ctx.graph
    for node in sorted(read_out_tail(graph, ctx.dtypes, ctx.choices.preserved)):
        if graph.ops[node] == "Cast":
            continue  # a Cast computes nothing; its neighbours decide its types
        for vid in (*(graph.in_vids[node] or ()), *(graph.out_vids[node] or ())):
            # A deny-list op (Sum, Mean for float16) stays float32 for that reason, which explain gives.
            if vid not in painting.deny and ctx.vertex_list[vid] != _DENY and ctx.can_convert(vid):
                painting.mark_deny(vid, READ_OUT)




def keep_normalization_float32(ctx: PaintContext, painting: Painting) -> None:
    """Paints a norm's mean and variance DENY and makes them deny roots, so the norm stays float32.

    ``infer(Mean(x)) -> clear(StopGradient) -> infer(SquaredDifference(x, .))
    -> infer(Mean)`` become ``DENY``, and :func:`paint_deny_forward` then
    keeps float32 what follows from them up to the next allow op: the
    normalization ``x * Rsqrt(variance + eps) * gamma + ...``, and in a
    training graph its gradient. What counts is
    :func:`~amp_rewrite.paint.normalization.statistics_nodes`'s. The float16
    lists deny ``Mean`` already; for bfloat16 this keeps a norm in one
    precision instead of a patchwork of Casts.
    """
    if ctx.force_all:
        return
    graph = ctx.graph
    for node in sorted(statistics_nodes(graph)):
        for vid in graph.node_vertices[node]:
            if ctx.vertex_list[vid] != _DENY and ctx.can_convert(vid):
                painting.deny_roots.add(vid)
                painting.mark_deny(vid, NORMALIZATION_REASON)


def keep_out_of_range_values_float32(ctx: PaintContext, painting: Painting) -> None:
    """Paints DENY the ops that read a value beyond the half range, and makes them deny roots.

    ``Const(-1e9) -> infer(Mul (1 - mask) * c) -> infer(AddV2 scores + .) ->
    infer(Softmax) -> allow(BatchMatMul)`` becomes ``DENY -> DENY -> DENY ->
    allow``: the Mul reads the constant, and :func:`paint_deny_forward` keeps
    the sum and the Softmax float32 after it, so -1e9 never meets a Cast to
    float16 (where it would be -inf, and a fully masked row's softmax NaN).
    An allow op reading such a value (a MatMul with a weight of 1e5) stays
    float32 too. What counts is
    :func:`~amp_rewrite.paint.half_range.beyond_range`'s, against the
    target's limit: 65504 for float16, and for bfloat16 the largest float32
    its Cast leaves finite (``tf.float32.min`` is beyond it, -1e9 is not).
    """
    limit = HALF_RANGE_LIMITS.get(ctx.target_dtype)
    if limit is None or ctx.force_all:
        return
    graph, listed = ctx.graph, ctx.vertex_list
    boundary = ctx.boundary
    found = beyond_range(graph, ctx.dtypes, limit=limit, is_boundary=boundary.__contains__,
                         is_readable=ctx.can_convert)
    for vid in sorted(found):
        if listed[vid] != _DENY and ctx.can_convert(vid):
            painting.deny_roots.add(vid)
            painting.mark_deny(vid, found[vid].reason(graph, ctx.target_dtype), found[vid].source)


def keep_saturating_activations_float32(ctx: PaintContext, painting: Painting) -> None:
    """Paints DENY an activation whose gradient reads its output, and that gradient, and makes them deny roots.

    ``allow(MatMul) -> infer(BiasAdd) -> infer(Sigmoid) -> allow(MatMul_1)``,
    with ``infer(SigmoidGrad)`` reading the Sigmoid's output, becomes
    ``ALLOW -> ALLOW -> DENY -> ALLOW`` and ``DENY``: the Sigmoid reads a Cast
    of the half sum, the next MatMul a Cast of its output, and its gradient's
    ``y(1 - y)`` is computed from a float32 ``y``. In half a saturated unit's
    output rounds to 1, where that factor is exactly 0 and the unit stops
    learning. Both count as deny-list ops, so :func:`paint_deny_forward`
    keeps float32 the elementwise ops after them up to the next allow op
    (fewer Casts than a float32 Sigmoid alone among half ops). What counts is
    :func:`~amp_rewrite.paint.saturation.gradient_reads`'s: through calls, and
    not inside a loop, whose Casts would run every iteration; a graph with no
    gradient is unchanged.
    """
    if ctx.force_all:
        return
    for read in gradient_reads(ctx.graph, ctx.dtypes, is_boundary=ctx.boundary.__contains__):
        cause = read.activation
        for vid, reason in ((cause, SATURATION_REASON), *((v, SATURATION_GRADIENT_REASON)
                                                           for v in read.carriers + read.gradients)):
            if vid not in painting.deny and ctx.can_convert(vid):
                painting.deny_roots.add(vid)
                painting.mark_deny(vid, reason, None if vid == cause else cause)


def paint_deny_forward(ctx: PaintContext, painting: Painting) -> None:
    """Paints DENY each deny op and the clear/infer ops on its paths to a deny or infer op.

    The painting's ``deny_roots`` (a norm's statistics, the readers of a value
    beyond the half range, a saturating activation and its gradient) count as
    deny ops.

    ``deny -> infer -> clear -> infer -> clear -> allow -> infer`` becomes
    ``DENY -> DENY -> DENY -> DENY -> clear -> allow -> infer``: the last clear
    op only leads to an allow op, so a deny op upstream does not taint it.
    """
    if ctx.force_all:
        return
    graph = ctx.graph
    listed = ctx.vertex_list
    extra = painting.deny_roots
    deny_or_infer = [v for v, colour in enumerate(listed) if colour == _DENY or colour == _INFER or v in extra]
    upstream = set(graph.reach(deny_or_infer, forward=False, backward=True,
                               enter=lambda v: listed[v] == _CLEAR))
    if ctx.released:
        upstream = {v for v in upstream if graph.vertex_node[v] not in ctx.released}
    deny_roots = [v for v in deny_or_infer if listed[v] == _DENY or v in extra]
    for v in deny_roots:
        painting.mark_deny(v, "deny-list op")
    parents: dict[int, int] = {}
    for v in graph.reach(deny_roots, forward=True, backward=False,
                         enter=upstream.__contains__, parents=parents):
        painting.mark_deny(v, "downstream of a deny-list op", parents.get(v))


def match_tensor_list_clusters(ctx: PaintContext, painting: Painting) -> None:
    """Gives every op of a data-structure cluster one element type.

    DENY if any member is DENY or cannot hold the half type; else ALLOW if any
    member is ALLOW.
    """
    for cluster in painting.tensor_list_clusters:
        members = cluster.vertices
        if any(v in painting.deny or not ctx.supports_target(v) for v in members):
            for v in members:
                painting.mark_deny(v, "shares a data structure with a float32 op")
        elif any(v in painting.allow for v in members):
            cause = next(v for v in members if v in painting.allow)
            for v in members:
                painting.mark_allow(v, "shares a data structure with a half op", cause)


def paint_between_allow(ctx: PaintContext, painting: Painting) -> None:
    """Paints ALLOW the clear and infer vertices lying on a path from one ALLOW vertex to another.

    ``allow -> infer -> clear -> allow`` becomes ``ALLOW -> ALLOW -> ALLOW -> ALLOW``:
    keeping them float32 would only add a Cast pair between two half ops.
    """
    graph = ctx.graph
    roots = sorted(painting.allow)

    listed = ctx.vertex_list

    def passable(v: int) -> bool:
        return (v not in painting.allow and v not in painting.deny
                and listed[v] in (_CLEAR, _INFER)
                and ctx.can_convert(v))

    downstream = set(graph.reach(roots, forward=True, backward=False, enter=passable))
    parents: dict[int, int] = {}
    between = graph.reach(roots, forward=False, backward=True,
                          enter=downstream.__contains__, parents=parents)
    for v in between:
        if v in downstream and v not in painting.allow:
            painting.mark_allow(v, "between allow ops", parents.get(v))


def paint_infer_after_allow(ctx: PaintContext, painting: Painting) -> None:
    """Paints ALLOW an infer vertex fed by an ALLOW vertex and by no DENY vertex, to a fixed point.

    ``allow -> infer -> infer`` becomes ``ALLOW -> ALLOW -> ALLOW``. The result
    is the same whatever order the nodes come in.
    """
    graph = ctx.graph

    def eligible(v: int) -> int | None:
        if (v in painting.allow or v in painting.deny or not ctx.on_list(v, _INFER)
                or not ctx.can_convert(v)):
            return None
        fed_by = None
        released = graph.vertex_node[v] in ctx.released
        for u in graph.fanin[v]:
            if u in painting.deny and not released:
                return None
            if u in painting.allow and fed_by is None:
                fed_by = u
        return fed_by

    work = sorted({w for v in painting.allow for w in graph.fanout[v]}, reverse=True)
    while work:
        v = work.pop()
        cause = eligible(v)
        if cause is None:
            continue
        painting.mark_allow(v, "infer op after an allow op", cause)
        work.extend(w for w in graph.fanout[v] if w not in painting.allow)


def paint_clear_around_allow(ctx: PaintContext, painting: Painting) -> None:
    """Spreads ALLOW from ALLOW vertices to connected clear vertices, up and downstream.

    ``clear -> allow -> clear -> clear`` becomes ``ALLOW -> ALLOW -> ALLOW -> ALLOW``.
    An Identity or Enter that reads a ref variable is not entered, so a
    variable's value is never read in half.
    """
    graph = ctx.graph
    refs = ctx.reads_ref_variable

    def passable(v: int) -> bool:
        return (v not in painting.allow and v not in painting.deny
                and ctx.on_list(v, _CLEAR) and ctx.can_convert(v)
                and graph.vertex_node[v] not in refs)

    roots = sorted(v for v in painting.allow if ctx.processable(v))
    parents: dict[int, int] = {}
    for v in graph.reach(roots, forward=True, backward=True, enter=passable, parents=parents):
        if v not in painting.allow:
            painting.mark_allow(v, "clear op next to an allow op", parents.get(v))


def keep_bias_gradients_beside_their_filter_gradients(ctx: PaintContext, painting: Painting) -> None:
    """For bfloat16 on a CPU, paints ALLOW a bias gradient that reads the gradient an ALLOW filter gradient reads.

    ``BiasAddGrad(g)`` beside ``ALLOW Conv2DBackpropFilter(x, shape, g)`` becomes
    ``ALLOW``, even downstream of a deny op, so that oneDNN fuses the two
    (:mod:`amp_rewrite.paint.fusions`).
    """
    for vid, partner, name in list(bias_gradients_beside_filter_gradients(ctx, painting.allow)):
        painting.deny.discard(vid)
        painting.mark_allow(vid, f"bias gradient beside the filter gradient {name}, which oneDNN fuses with it",
                            partner)


def choose_loop_variable_types(ctx: PaintContext, painting: Painting) -> None:
    """Gives each While loop variable the dtype that needs fewer Casts per iteration.

    A loop variable is one dtype in the While op, its body's argument and
    result, and its cond's argument. Casts outside the loop run once, casts
    inside run every iteration, so the choice looks only inside: a Cast is
    needed after the argument if some body or cond op reading it has the
    other colour, and before the result if the op producing it has. A weight
    read once and passed through the loop unchanged costs nothing in half and
    a Cast per iteration in float32, so it is cast once, before the loop.
    """
    graph = ctx.graph
    for group in graph.loop_groups:
        members = set(group)
        if not all(ctx.can_convert(v) for v in group):
            for v in group:
                painting.unmark_allow(v, "loop variable: cannot be half everywhere")
            continue
        _, arg, ret, test_arg = group
        readers = [w for v in (arg, test_arg) for w in graph.fanout[v] if w not in members]
        writers = [u for u in graph.fanin[ret] if u not in members]
        in_half = sum((any(w not in painting.allow for w in readers), any(u not in painting.allow for u in writers)))
        in_float = sum((any(w in painting.allow for w in readers), any(u in painting.allow for u in writers)))
        cause = next((w for w in readers + writers if w in painting.allow), None)
        if in_half < in_float or (in_half == in_float and all(v in painting.allow for v in group)):
            for v in group:
                painting.mark_allow(v, "loop variable: half needs fewer casts per iteration", cause)
        else:
            for v in group:
                painting.unmark_allow(v, "loop variable: float32 needs fewer casts per iteration")


def match_call_boundaries(ctx: PaintContext, painting: Painting) -> None:
    """Keeps a value one dtype across a call: a call's port and the callee's arg or result agree.

    A group is half only if every member is; otherwise all stay float32 and
    the Casts go on either side of the boundary.
    """
    loop = {id(g) for g in ctx.graph.loop_groups}
    for group in ctx.graph.groups:
        if id(group) in loop or all(v in painting.allow for v in group):
            continue
        blocker = next(v for v in group if v not in painting.allow)
        for v in group:
            painting.unmark_allow(v, "call boundary: the other side stays float32", blocker)


def match_loop_edges(ctx: PaintContext, painting: Painting) -> None:
    """Gives a NextIteration the colour of the Merge nodes it feeds; all must agree.

    If any of those Merges is not ALLOW, none of them nor the NextIteration is:
    a loop variable has one dtype on every iteration.
    """
    graph = ctx.graph
    for i, op in enumerate(graph.ops):
        if op != "NextIteration":
            continue
        nxt = graph.vertex_of(i, "T")
        found = [graph.vertex_of(dst, "T") for dst, _ in graph.consumers(i)]
        merges = [m for m in found if m is not None]
        if nxt is None or not merges:
            continue
        blocker = next((m for m in merges if m not in painting.allow), None)
        if blocker is None and not ctx.can_convert(nxt):
            blocker = nxt  # a NextIteration that must stay float32 keeps its Merges float32
        if blocker is not None:
            for m in merges:
                painting.unmark_allow(m, "loop variable: another Merge of its NextIteration stays float32", blocker)
            painting.unmark_allow(nxt, "loop variable: its Merge stays float32", blocker)
        else:
            painting.mark_allow(nxt, "loop variable: its Merge is half", merges[0])


def retarget_existing_casts(ctx: PaintContext, painting: Painting) -> None:
    """Makes an existing Cast to float32 cast to half when every consumer is ALLOW.

    ``Cast(bool -> float) -> allow`` becomes ``Cast(bool -> half) -> ALLOW``
    instead of gaining a second Cast.
    """
    graph = ctx.graph
    for i, op in enumerate(graph.ops):
        if op != "Cast":
            continue
        dst_t = graph.vertex_of(i, "DstT")
        if dst_t is None or not ctx.processable(dst_t) or not ctx.is_float32(dst_t):
            continue
        consumers = graph.consumers(i)
        if not consumers:
            continue
        targets = [graph.input_vertex(dst, k) for dst, k in consumers]
        if all(t is not None and t in painting.allow for t in targets):
            painting.mark_allow(dst_t, "existing Cast feeding only half ops", targets[0])


# -- the schedule -------------------------------------------------------------

Rule = Callable[[PaintContext, Painting], None]

#: The rules that find the roots. With no ALLOW vertex after them there is
#: nothing to convert, and :func:`amp_rewrite.pipeline.paint` stops there.
ROOT_RULES: tuple[Rule, ...] = (
    deny_escaping_tensor_lists,
    paint_allow_ops,
    keep_variable_updates_float32,
    keep_read_outs_float32,
    keep_normalization_float32,
    keep_out_of_range_values_float32,
    keep_saturating_activations_float32,
)
#: The rules that spread the roots' colours and then make them agree where
#: values must hold one dtype, in the order they run.
SPREAD_RULES: tuple[Rule, ...] = (
    paint_deny_forward,
    match_tensor_list_clusters,
    paint_between_allow,
    paint_infer_after_allow,
    paint_clear_around_allow,
    keep_bias_gradients_beside_their_filter_gradients,
    match_tensor_list_clusters,  # clear ops around allow ops may have painted a member
    choose_loop_variable_types,
    match_call_boundaries,
    match_loop_edges,
    retarget_existing_casts,
)
RULES: tuple[Rule, ...] = ROOT_RULES + SPREAD_RULES
