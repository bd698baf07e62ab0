"""Half regions: the connected groups of ops a painting makes half, timed as a whole.

The tuner's per-op timing (:mod:`amp_rewrite.tune.timing`) asks whether one
heavy op is faster in half. A painting then spreads half from that op to
the elementwise ops around it (bias adds, activations, the gates of a
recurrent cell), and on a CPU those ops do not get faster: outside oneDNN's
fused kernels a half elementwise kernel converts each element to float32
and back, so a ``Sigmoid`` or ``Mul`` in bfloat16 costs as much as in
float32 or more. A MatMul that wins alone can lose once the ops it drags
into half are counted, and inside a loop body that loss is paid every
iteration.

So, once the painting is complete, a *region* is a connected set of half
vertices (joined by the view's edges, calls and loop variables included).
Its ops in each body (the main graph, a function, a loop body) form a
*part*, timed like one op is: one small graph holds the part as it is and
the part in half, the inputs from outside as constants of their static
shapes, a Cast wherever the rewrite would put one (a float32 value entering
a half op, a half value leaving to a float32 op). A value that is already
half outside the part (a loop variable, a function argument painted half)
enters without a Cast, so a loop body's part costs what one iteration
would.

What a part cannot time on its own is left out of it: ops with state,
control flow, calls, data-structure handles, and ops whose inputs have no
static shape. A part whose heavy ops are all left out is not timed, and a
region with such a part keeps the painting's verdict; ops the lists call
cheap (a TensorList write) are what is usually left out.

The verdict (in :class:`amp_rewrite.tune.tuner.Tuner`): the region stays
half when its parts together are at least the tuner's margin faster in
half, and no part inside a loop body is slower in half (a loop multiplies
that part's cost by its trip count, which no graph knows).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from amp_rewrite.graph.facts import DT_FLOAT
from amp_rewrite.graph.instances import WHILE_OPS
from amp_rewrite.tune.shapes import InputSpec

#: A region of more ops than this is not timed as one; its heavy ops were timed one by one.
MAX_REGION_OPS = 400
#: Ops that do not run on their own in a small graph fed by constants.
_NOT_STANDALONE = frozenset({
    "Const", "Enter", "Exit", "Identity", "IdentityN", "LoopCond", "Merge", "NextIteration", "Placeholder",
    "Switch", "_Arg", "_Retval", "ReadVariableOp", "VarHandleOp", "NoOp",
})
_DTYPES = {"float16": 19, "bfloat16": 14}


@dataclass(frozen=True)
class RegionCase:
    """One part of a half region, ready to time: a GraphDef with both variants and their targets.

    Attributes:
        graph_def: serialized GraphDef; inputs are Consts, the float32 copy's nodes are under ``float32/``,
            the half copy's under ``half/``.
        float_targets, half_targets: the node names that run each variant (Casts included).
        ops: the op types timed, with counts, for the reasons.
        in_loop: whether the part lies in a loop body (paid each iteration).
        target: ``"float16"`` or ``"bfloat16"``.
    """

    graph_def: bytes
    float_targets: tuple[str, ...]
    half_targets: tuple[str, ...]
    ops: tuple[tuple[str, int], ...]
    in_loop: bool
    target: str

    @property
    def op(self) -> str:
        return "region"

    @property
    def key(self) -> str:
        """A stable name for the cache: what it holds, and a digest of the graph."""
        digest = hashlib.sha256(self.graph_def + self.target.encode()).hexdigest()[:16]
        return f"region [{describe_ops(self.ops)}]->{self.target} {digest}"

    def benchmark_graph(self, device: str):
        """The GraphDef with every node placed on ``device`` and an empty target, and both variants' targets."""
        from tensorflow.core.framework import graph_pb2

        from amp_rewrite.tune.timing import EMPTY_TARGET

        graph_def = graph_pb2.GraphDef.FromString(self.graph_def)
        graph_def.node.add(name=EMPTY_TARGET, op="NoOp")
        for node in graph_def.node:
            node.device = device
        return graph_def, list(self.float_targets), list(self.half_targets)


def describe_ops(ops: tuple[tuple[str, int], ...], limit: int = 4) -> str:
    """``MatMul, Sigmoid x3, Mul x3, +2 more op types``."""
    words = [op if count == 1 else f"{op} x{count}" for op, count in ops[:limit]]
    if len(ops) > limit:
        words.append(f"+{len(ops) - limit} more op types")
    return ", ".join(words)


def half_regions(graph, allow: set[int], joined: Iterable[Iterable[int]] = ()) -> list[list[int]]:
    """The connected components of ``allow`` in the view, each as sorted vertex ids, in order of their least.

    ``joined``: groups of vertices that count as connected whatever the
    view's edges say (the element types of one data structure, which must
    stay one dtype: a region dropped to float32 takes all of them along).
    """
    partners: dict[int, list[int]] = {}
    for group in joined:
        members = list(group)
        for v in members:
            partners.setdefault(v, []).extend(members)
    seen: set[int] = set()
    regions = []
    for start in sorted(allow):
        if start in seen:
            continue
        seen.add(start)
        stack, members = [start], [start]
        while stack:
            v = stack.pop()
            for w in (*graph.fanin[v], *graph.fanout[v], *partners.get(v, ())):
                if w in allow and w not in seen:
                    seen.add(w)
                    stack.append(w)
                    members.append(w)
        regions.append(sorted(members))
    return regions


def region_parts(graph, region: list[int]) -> dict[int, list[int]]:
    """Body index → the region's real nodes in that body (virtual args and results left out), in order."""
    parts: dict[int, set[int]] = {}
    virtual = graph.virtual
    for v in region:
        node = graph.vertex_node[v]
        if node not in virtual:
            parts.setdefault(graph.body_of[node], set()).add(node)
    return {body: sorted(nodes) for body, nodes in sorted(parts.items())}


def in_loop_body(graph, body: int) -> bool:
    """Whether body ``body`` runs once per iteration of some While loop (its body or cond, or nested in one)."""
    while body:
        call = graph.bodies[body].call
        if call is None:
            return False
        if graph.ops[call] in WHILE_OPS:
            return True
        body = graph.body_of[call]
    return False


def is_standalone(graph, node: int) -> bool:
    """Whether ``node`` can run in a small graph fed by constants (no state, control flow, calls or handles)."""
    op = graph.ops[node]
    op_def = graph.op_defs[node]
    if op in _NOT_STANDALONE or op_def is None or op_def.is_stateful:
        return False
    if any(arg.type in (20, 21) for arg in (*op_def.input_arg, *op_def.output_arg)):  # resource, variant
        return False
    return not any(value.HasField("func") or value.list.func for value in graph.nodes[node].attr.values())


def build_case(graph, nodes: list[int], specs: dict[int, tuple[InputSpec, ...]], allow: set[int], *,
               target: str, in_loop: bool) -> RegionCase:
    """The :class:`RegionCase` of one part: ``nodes`` (standalone, their input ``specs`` known) in both variants."""
    builder = _CaseBuilder(graph, set(nodes), allow, _DTYPES[target])
    for node in nodes:
        builder.add(node, specs[node])
    builder.add_exits()
    counts = Counter(graph.ops[n] for n in nodes)
    ops = tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    return RegionCase(builder.graph_def.SerializeToString(deterministic=True), tuple(builder.float_targets),
                      tuple(builder.half_targets), ops, in_loop, target)


def _ref(variant: str, node: int, port: int) -> str:
    return f"{variant}/{node}" + (f":{port}" if port else "")


class _CaseBuilder:
    """Builds the two-variant GraphDef of one part, node by node."""

    def __init__(self, graph, members: set[int], allow: set[int], half: int):
        from tensorflow.core.framework import graph_pb2

        self.graph, self.members, self.allow, self.half = graph, members, allow, half
        self.graph_def = graph_pb2.GraphDef()
        self.float_targets: list[str] = []
        self.half_targets: list[str] = []
        self.inputs = 0

    def add(self, node: int, specs: tuple[InputSpec, ...]) -> None:
        graph = self.graph
        copies = {variant: self._copy(node, variant) for variant in ("float32", "half")}
        for k, ((src, port), spec) in enumerate(zip(graph.inputs(node), specs)):
            consumer, producer = graph.input_vertex(node, k), graph.input_source_vertex(node, k)
            arrives_half = producer in self.allow and spec.dtype == DT_FLOAT
            wants_half = consumer in self.allow and spec.dtype == DT_FLOAT
            if src in self.members:
                copies["float32"].input.append(_ref("float32", src, port))
                name = _ref("half", src, port)
            else:
                float_name, name = self._constants(spec, self.half if arrives_half else spec.dtype)
                copies["float32"].input.append(float_name)
            if wants_half and not arrives_half:
                name = self._cast(name, DT_FLOAT, self.half)
            elif arrives_half and not wants_half:
                name = self._cast(name, self.half, DT_FLOAT)
            copies["half"].input.append(name)
        half_copy = copies["half"]
        for vid in graph.node_vertices[node]:
            name = str(graph.vertex_attr[vid])
            if vid in self.allow and name in half_copy.attr and half_copy.attr[name].HasField("type"):
                half_copy.attr[name].type = self.half
        self.float_targets.append(copies["float32"].name)
        self.half_targets.append(copies["half"].name)

    def add_exits(self) -> None:
        """A Cast to float32 after each half output that a float32 op outside the part reads."""
        graph = self.graph
        for node in sorted(self.members):
            for port, vid in enumerate(graph.out_vids[node] or ()):
                if vid not in self.allow:
                    continue
                readers = [graph.input_vertex(dst, k) for dst, k in graph.consumers(node, port)
                           if dst not in self.members]
                if any(reader not in self.allow for reader in readers):
                    self.half_targets.append(self._cast(_ref("half", node, port), self.half, DT_FLOAT))

    def _copy(self, node: int, variant: str):
        original = self.graph.nodes[node]
        copy = self.graph_def.node.add(name=f"{variant}/{node}", op=original.op)
        for name in sorted(original.attr):
            if not name.startswith("_"):
                copy.attr[name].CopyFrom(original.attr[name])
        return copy

    def _constants(self, spec: InputSpec, half_dtype: int) -> tuple[str, str]:
        """Two Consts of one value: as the input is (for the float32 copy), and in ``half_dtype`` (the half copy)."""
        import numpy as np
        import tensorflow as tf
        from tensorflow.core.framework import tensor_pb2

        if spec.value is not None:
            tensor = tensor_pb2.TensorProto.FromString(spec.value)
            return self._constant(spec.dtype, tensor), self._constant(spec.dtype, tensor)
        values = np.random.default_rng(self.inputs).uniform(0.5, 1.5, size=spec.shape).astype(np.float32)
        return (self._constant(spec.dtype, tf.make_tensor_proto(values)),
                self._constant(half_dtype, tf.make_tensor_proto(values, dtype=tf.dtypes.as_dtype(half_dtype))))

    def _constant(self, dtype: int, tensor) -> str:
        name = f"input{self.inputs}"
        self.inputs += 1
        const = self.graph_def.node.add(name=name, op="Const")
        const.attr["dtype"].type = dtype
        const.attr["value"].tensor.CopyFrom(tensor)
        return name

    def _cast(self, source: str, src: int, dst: int) -> str:
        name = f"cast{len(self.graph_def.node)}"
        node = self.graph_def.node.add(name=name, op="Cast", input=[source])
        node.attr["SrcT"].type = src
        node.attr["DstT"].type = dst
        node.attr["Truncate"].b = False
        return name
