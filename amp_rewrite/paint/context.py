"""What the painting rules read: the op lists, the target, and per-node and per-vertex facts.

:class:`PaintContext` is built once per rewrite, before the rules run, and
never changes while they run: each node's list colour and whether it may be
changed at all (preserved, kept float32, placed on another device, an opaque
call, a restored function's signature, a node that carries
:data:`KEEP_FLOAT32_ATTR`), each vertex's dtype, and whether the
target type is admitted by the OpDef and has a kernel (cached per op, device
and dtypes). What the caller decided about single nodes (preserved, kept
float32 by name or by pattern, released from deny, fixed signatures) comes
in as one :class:`NodeChoices`. The rules (:mod:`amp_rewrite.paint.rules`)
ask the context; they never change it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from amp_rewrite.graph.facts import DT_FLOAT
from amp_rewrite.graph.op_registry import OpRegistry, device_type_of
from amp_rewrite.graph.typed_graph import TypedGraph
from amp_rewrite.paint.op_lists import Colour, OpLists

# The clear colour as a plain name: the per-node loop compares against it, and
# an Enum member's lookup through its class costs several times a comparison.
_CLEAR = Colour.CLEAR
#: A node attr (a string: the reason) that keeps its node float32 whoever built the graph: the runtime sets
#: it on the ops its loss scaling joins gradients with, so that a half gradient is cast up before it joins
#: float32 ones, never they down to half.
KEEP_FLOAT32_ATTR = "_amp_rewrite_float32"
# Ops whose half conversion UNSAFE_FORCE_ALL must not force: the loss op
# has no usable half kernel, and constants are folded instead.
_NEVER_FORCED = frozenset({"Const", "SoftmaxCrossEntropyWithLogits"})


@dataclass(frozen=True)
class NodeChoices:
    """What the caller decided about single nodes, above the op lists.

    Attributes:
        preserved: main-graph names of nodes never to change (fetched, fed or asked to be preserved).
        keep_float32: node name → reason, for nodes to leave float32: ``node`` in the main
            graph, ``function::node`` in every instance of a function.
        kept_by_pattern: node index (any body) → reason, for the nodes a
            keep-float32 pattern matched; left alone like preserved nodes.
        fixed_signatures: functions whose arguments and results keep their dtypes.
        release: main-graph names of nodes a deny op upstream does not taint.
    """

    preserved: frozenset[str] = frozenset()
    keep_float32: Mapping[str, str] = field(default_factory=dict)
    kept_by_pattern: Mapping[int, str] = field(default_factory=dict)
    fixed_signatures: frozenset[str] = frozenset()
    release: frozenset[str] = frozenset()


class PaintContext:
    """Read-only facts the rules consult: lists, target, and per-vertex predicates.

    Args:
        graph: the typed graph.
        lists: the effective op lists.
        target_dtype: DataType enum of the half type.
        device_type: the device type the graph runs on.
        choices: the caller's decisions about single nodes.
        force_all: the UNSAFE_FORCE_ALL level.
    """

    def __init__(self, graph: TypedGraph, lists: OpLists, *, target_dtype: int, device_type: str,
                 choices: NodeChoices, force_all: bool = False):
        self.graph = graph
        self.lists = lists
        self.target_dtype = target_dtype
        self.device_type = device_type
        self.choices = choices
        self.force_all = force_all
        self.released = {graph.index[n] for n in choices.release if n in graph.index}
        self._supports: list[bool | None] = [None] * len(graph.vertex_node)
        self.boundary = set(graph.virtual).union(*(b.children for b in graph.bodies))
        self.node_list: list[Colour | None] = self._node_colours()
        self.skip_reason: list[str | None] = self._skip_reasons()
        # The rules never retype, so the dtypes read once hold while painting.
        self.dtypes = graph.dtypes()
        self.vertex_list = [self.node_list[node] for node in graph.vertex_node]
        self._kernel_checks: dict[tuple, bool] = {}

    def _node_colours(self) -> list[Colour | None]:
        """Each node's list colour; args, results and calls (the boundary) are clear."""
        colour_of = self.lists.colour_of
        colours: dict[str, Any] = {}  # by op: most of a graph's nodes share a few ops
        node_list: list[Colour | None] = []
        for i, op in enumerate(self.graph.ops):
            colour = colours.get(op, colours)
            if colour is colours:
                colour = colours[op] = colour_of(op)
            node_list.append(_CLEAR if i in self.boundary else colour)
        return node_list

    def _skip_reasons(self) -> list[str | None]:
        graph = self.graph
        reasons: list[str | None] = []
        append = reasons.append
        choices = self.choices
        special = set(choices.preserved).union(choices.keep_float32)
        opaque = graph.opaque_calls
        fixed_signatures = choices.fixed_signatures
        fixed = {i for i in graph.virtual
                 if graph.bodies[graph.body_of[i]].function in fixed_signatures} if fixed_signatures else ()
        index = graph.bodies[0].index
        special_nodes = {index[name] for name in special if name in index}  # main-graph nodes, by index
        special_nodes.update(self._function_nodes_kept())
        special_nodes.update(choices.kept_by_pattern)  # any body's nodes, by index
        for i, node in enumerate(graph.nodes):
            if i in special_nodes or i in opaque or i in fixed:
                append(self._skip_reason(i))
                continue
            device = node.device
            dev = device_type_of(device) if device else None
            if dev is not None and dev != self.device_type:
                append(f"placed on {dev}")
            elif KEEP_FLOAT32_ATTR in node.attr:
                append(node.attr[KEEP_FLOAT32_ATTR].s.decode(errors="replace") or "kept float32 by its node attr")
            else:
                append(None)
        return reasons

    def _function_nodes_kept(self) -> set[int]:
        """The function nodes ``keep_float32`` names (``function::node``), in every instance of the function."""
        wanted: dict[str, set[str]] = {}
        for qualified in self.choices.keep_float32:
            function, sep, name = qualified.partition("::")
            if sep:
                wanted.setdefault(function, set()).add(name)
        if not wanted:
            return set()
        graph = self.graph
        return {i for body in graph.bodies[1:] for name, i in body.index.items()
                if name in wanted.get(body.function, ()) and i not in graph.virtual}

    def _skip_reason(self, i: int) -> str | None:
        graph, choices = self.graph, self.choices
        node = graph.nodes[i]
        if graph.body_of[i] == 0 and node.name in choices.preserved:
            return "fetched or preserved: keeps its dtype"
        if graph.body_of[i] == 0 and node.name in choices.keep_float32:
            return choices.keep_float32[node.name]
        function = graph.bodies[graph.body_of[i]].function
        if function and f"{function}::{node.name}" in choices.keep_float32:
            return choices.keep_float32[f"{function}::{node.name}"]
        if i in choices.kept_by_pattern:
            return choices.kept_by_pattern[i]
        if i in graph.opaque_calls:
            return f"call not rewritten: {graph.opaque_calls[i]}"
        if i in graph.virtual and graph.bodies[graph.body_of[i]].function in choices.fixed_signatures:
            return "argument or result of a restored function: keeps its dtype"
        dev = device_type_of(node.device)
        if dev is not None and dev != self.device_type:
            return f"placed on {dev}"
        return None

    def is_preserved(self, i: int) -> bool:
        """Whether node ``i`` must keep every attr (fetched, fed or asked to be preserved)."""
        return self.graph.body_of[i] == 0 and self.graph.nodes[i].name in self.choices.preserved

    def processable(self, vid: int) -> bool:
        """Whether the vertex's node may be changed at all (not preserved, on our device type)."""
        return self.skip_reason[self.graph.vertex_node[vid]] is None

    def is_float32(self, vid: int) -> bool:
        return self.dtypes[vid] == DT_FLOAT

    def on_list(self, vid: int, colour: Colour) -> bool:
        """Whether the vertex's op is on the ``colour`` list."""
        return self.vertex_list[vid] == colour

    def supports_target(self, vid: int) -> bool:
        """Whether the OpDef admits the target type for this attr and a kernel exists for it."""
        cached = self._supports[vid]
        if cached is None:
            cached = self._supports[vid] = self._check_support(vid)
        return cached

    def _check_support(self, vid: int) -> bool:
        graph = self.graph
        node_idx, attr = graph.vertex_node[vid], graph.vertex_attr[vid]
        if not attr.name:
            return False
        allowed = graph.allowed_types(vid)
        if allowed is not None and self.target_dtype not in allowed:
            return False
        if node_idx in self.boundary:
            return True  # args, results and calls pass any type through
        node = graph.nodes[node_idx]
        siblings = graph.node_vertices[node_idx]
        # Nodes of one op, device and dtypes share the answer (most of a graph's nodes).
        key = (graph.ops[node_idx], node.device, vid - siblings[0], tuple([self.dtypes[o] for o in siblings]))
        found = self._kernel_checks.get(key)
        if found is None:
            found = self._kernel_checks[key] = self._kernel_exists(vid, node_idx)
        return found

    def _kernel_exists(self, vid: int, node_idx: int) -> bool:
        graph = self.graph
        node = graph.nodes[node_idx]
        device_type = device_type_of(node.device) or self.device_type
        attrs: dict[str, Any] = {}
        for other in graph.node_vertices[node_idx]:
            other_attr = graph.vertex_attr[other]
            dtype = self.target_dtype if other == vid else self.dtypes[other]
            if other_attr.index < 0:
                attrs[other_attr.name] = dtype
            else:
                current = attrs.get(other_attr.name, ())
                attrs[other_attr.name] = current + (dtype,)
        found = OpRegistry.has_kernel(node.op, device_type, attrs)
        return True if found is None else found

    def can_convert(self, vid: int) -> bool:
        """Processable, float32 now, and the target type is supported."""
        if self.dtypes[vid] != DT_FLOAT or self.skip_reason[self.graph.vertex_node[vid]] is not None:
            return False
        cached = self._supports[vid]
        return cached if cached is not None else self.supports_target(vid)

    def can_force(self, vid: int) -> bool:
        """Whether UNSAFE_FORCE_ALL may convert this vertex."""
        node_idx = self.graph.vertex_node[vid]
        op_def = self.graph.op_defs[node_idx]
        if self.graph.ops[node_idx] in _NEVER_FORCED or op_def.is_stateful:
            return False
        return not any(arg.is_ref for arg in list(op_def.input_arg) + list(op_def.output_arg))

    @cached_property
    def reads_ref_variable(self) -> set[int]:
        """Nodes that implicitly read a ref (non-resource) variable: Identity(VariableV2), Enter of such."""
        graph = self.graph
        result: set[int] = set()

        ops = graph.ops

        def reads(i: int, depth: int = 0) -> bool:
            if ops[i] not in ("Identity", "Enter") or not graph.inputs(i) or depth > 64:
                return False
            src = graph.inputs(i)[0][0]
            if ops[i] == "Identity":
                return ops[src] in ("Variable", "VariableV2")
            return reads(src, depth + 1)

        for i, op in enumerate(ops):
            if op in ("Identity", "Enter") and reads(i):
                result.add(i)
        return result
