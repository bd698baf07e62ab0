"""A typed view of a GraphDef: one vertex per (node, type attribute).

Painting works on type attributes, not nodes: MatMul has one (``T``),
FusedBatchNormV3 two (``T`` and ``U``), IdentityN one per entry of its
``list(type)`` attr, and AddN's N inputs share one. The OpDef says which
attribute types each input and output port; an input whose type is fixed by
the OpDef (``DT_INT32``, ``DT_VARIANT``) gets a fixed-type vertex, which is
never retyped but still carries paint across the graph.

An edge joins the vertex of a producer's output port to the vertex of the
consumer's input port. Control edges carry no data and are left out.

Ops that neither TensorFlow nor the graph's function library knows (custom
ops) get no vertices: they stay as they are, and a Cast is put on any edge
between them and a retyped neighbour (the dtype of such an edge is read off
the known side).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, NamedTuple

from amp_rewrite.errors import GraphError
from amp_rewrite.op_registry import OpRegistry

logger = logging.getLogger(__name__)

DT_FLOAT = 1
DT_HALF = 19
DT_BFLOAT16 = 14
DT_VARIANT = 21
DTYPE_NAMES = {DT_FLOAT: "float32", DT_HALF: "float16", DT_BFLOAT16: "bfloat16", DT_VARIANT: "variant"}


class TypeAttr(NamedTuple):
    """Identifies one type within a node: an attr, an entry of a list attr, or a fixed type."""

    name: str
    index: int = -1
    fixed: int = 0

    def __str__(self) -> str:
        if not self.name:
            return DTYPE_NAMES.get(self.fixed, f"dtype{self.fixed}")
        return self.name if self.index < 0 else f"{self.name}[{self.index}]"


class Port(NamedTuple):
    """A node's input (by data-input ordinal) or output port."""

    node: int
    index: int


def parse_input(ref: str) -> tuple[str, int, bool]:
    """Splits a NodeDef input string into (node name, output port, is_control)."""
    if ref.startswith("^"):
        return ref[1:], -1, True
    name, sep, port = ref.rpartition(":")
    if sep and port.isdigit():
        return name, int(port), False
    return ref, 0, False


class TypedGraph:
    """The typed view of ``graph_def``; holds references to its NodeDefs, which it may retype.

    Attributes:
        graph_def: the GraphDef viewed (the pipeline passes its own working copy).
        nodes: ``graph_def.node`` as a list, in GraphDef order.
        index: node name → position in ``nodes``.
        op_defs: the OpDef of each node, or None for unknown ops.
        inputs: per node, the (source node, source port) of each data input.
        consumers: (node, output port) → [(consumer node, data-input ordinal)], in GraphDef order.
        control_consumers: per node, whether some node has a control edge from it.
        vertices: (node, TypeAttr) per vertex id.
        node_vertices: per node, the vertex ids of its type attrs.
        fanin, fanout: per vertex, the vertex ids it is joined to.
    """

    def __init__(self, graph_def, registry: OpRegistry | None = None):
        self.graph_def = graph_def
        self.registry = registry if registry is not None else OpRegistry(graph_def.library)
        self.nodes = list(graph_def.node)
        self.index: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node.name in self.index:
                raise GraphError(f"duplicate node name {node.name!r} (op {node.op})")
            self.index[node.name] = i
        self.op_defs = [self.registry.op_def(node.op) for node in self.nodes]
        self.unknown_ops = sorted({n.op for n, d in zip(self.nodes, self.op_defs) if d is None})
        for op in self.unknown_ops:
            logger.warning("op %s is not registered in TensorFlow nor in the graph's function library; "
                           "its nodes stay as they are", op)
        self.in_attrs: list[list[TypeAttr] | None] = []
        self.out_attrs: list[list[TypeAttr] | None] = []
        plans: dict[str, tuple[_ArgPlan, _ArgPlan]] = {}
        for node, op_def in zip(self.nodes, self.op_defs):
            if op_def is None:
                self.in_attrs.append(None)
                self.out_attrs.append(None)
                continue
            plan = plans.get(node.op)
            if plan is None:
                plan = plans[node.op] = (_ArgPlan(op_def, op_def.input_arg), _ArgPlan(op_def, op_def.output_arg))
            self.in_attrs.append(plan[0].expand(node))
            self.out_attrs.append(plan[1].expand(node))
        self._read_inputs()
        self._build_vertices()
        self._build_edges()

    # -- construction -------------------------------------------------------

    def _read_inputs(self) -> None:
        self.inputs: list[list[tuple[int, int]]] = []
        self.consumers: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self.control_consumers = [False] * len(self.nodes)
        index = self.index
        consumers = self.consumers
        for dst, node in enumerate(self.nodes):
            data = []
            seen_control = False
            for ref in node.input:
                if ref[:1] == "^":
                    src = index.get(ref[1:])
                    if src is None:
                        self._missing_input(node, ref)
                    seen_control = True
                    self.control_consumers[src] = True
                    continue
                name, port = ref, 0
                colon = ref.rfind(":")
                if colon > 0 and ref[colon + 1:].isdigit():
                    name, port = ref[:colon], int(ref[colon + 1:])
                src = index.get(name)
                if src is None:
                    self._missing_input(node, ref)
                if seen_control:
                    raise GraphError(
                        f"node {node.name} (op {node.op}): data input {ref!r} follows a control input"
                    )
                outs = self.out_attrs[src]
                if outs is not None and port >= len(outs):
                    raise GraphError(
                        f"node {node.name} (op {node.op}): input {ref!r} asks for output {port} "
                        f"of {self.nodes[src].op} node {name}, which has {len(outs)}"
                    )
                key = (src, port)
                entry = consumers.get(key)
                if entry is None:
                    consumers[key] = [(dst, len(data))]
                else:
                    entry.append((dst, len(data)))
                data.append(key)
            expected = self.in_attrs[dst]
            if expected is not None and len(expected) != len(data):
                raise GraphError(
                    f"node {node.name} (op {node.op}): expected {len(expected)} data inputs, got {len(data)}"
                )
            self.inputs.append(data)

    @staticmethod
    def _missing_input(node, ref: str):
        raise GraphError(f"node {node.name} (op {node.op}): input {ref!r} names a node that does not exist")

    def _build_vertices(self) -> None:
        self.vertices: list[tuple[int, TypeAttr]] = []
        self.vertex_index: dict[tuple[int, TypeAttr], int] = {}
        self.node_vertices: list[list[int]] = []
        for i, (node, op_def) in enumerate(zip(self.nodes, self.op_defs)):
            ids = []
            if op_def is not None:
                attrs = dict.fromkeys(self.in_attrs[i] + self.out_attrs[i])
                # Type attrs tied to no port (TensorList element_dtype, StackV2
                # elem_type) are vertices too: data-structure rules paint them.
                for attr_def in op_def.attr:
                    if attr_def.type == "type":
                        attrs.setdefault(TypeAttr(attr_def.name))
                    elif attr_def.type == "list(type)" and attr_def.name in node.attr:
                        for k in range(len(node.attr[attr_def.name].list.type)):
                            attrs.setdefault(TypeAttr(attr_def.name, k))
                for attr in attrs:
                    vid = len(self.vertices)
                    self.vertices.append((i, attr))
                    self.vertex_index[(i, attr)] = vid
                    ids.append(vid)
            self.node_vertices.append(ids)

    def _build_edges(self) -> None:
        n = len(self.vertices)
        self.fanin: list[list[int]] = [[] for _ in range(n)]
        self.fanout: list[list[int]] = [[] for _ in range(n)]
        for dst in range(len(self.nodes)):
            for ordinal in range(len(self.inputs[dst])):
                u = self.input_source_vertex(dst, ordinal)
                v = self.input_vertex(dst, ordinal)
                if u is not None and v is not None:
                    self.fanout[u].append(v)
                    self.fanin[v].append(u)

    # -- queries --------------------------------------------------------------

    def output_vertex(self, node: int, port: int) -> int | None:
        """The vertex typing output ``port`` of ``node`` (None for unknown ops)."""
        attrs = self.out_attrs[node]
        return None if attrs is None else self.vertex_index[(node, attrs[port])]

    def input_vertex(self, node: int, ordinal: int) -> int | None:
        """The vertex typing data input ``ordinal`` of ``node`` (None for unknown ops)."""
        attrs = self.in_attrs[node]
        return None if attrs is None else self.vertex_index[(node, attrs[ordinal])]

    def input_source_vertex(self, node: int, ordinal: int) -> int | None:
        """The producer-side vertex of data input ``ordinal`` of ``node``."""
        src, port = self.inputs[node][ordinal]
        return self.output_vertex(src, port)

    def output_ports(self, vid: int) -> list[int]:
        """The output ports of the vertex's node that this vertex types."""
        node, attr = self.vertices[vid]
        attrs = self.out_attrs[node] or []
        return [p for p, a in enumerate(attrs) if a == attr]

    def vertex(self, node_name: str, attr: TypeAttr | str) -> int | None:
        """The vertex id of ``node_name``'s type ``attr``, or None."""
        if isinstance(attr, str):
            attr = TypeAttr(attr)
        i = self.index.get(node_name)
        return None if i is None else self.vertex_index.get((i, attr))

    def op(self, vid: int) -> str:
        return self.nodes[self.vertices[vid][0]].op

    def node_of(self, vid: int):
        return self.nodes[self.vertices[vid][0]]

    def dtype(self, vid: int) -> int:
        """The DataType the vertex currently holds (the OpDef default if the attr is unset)."""
        node_idx, attr = self.vertices[vid]
        if not attr.name:
            return attr.fixed
        node = self.nodes[node_idx]
        if attr.name in node.attr:
            value = node.attr[attr.name]
            if attr.index < 0:
                return value.type
            return value.list.type[attr.index]
        return _default_type(self.op_defs[node_idx], attr.name)

    def set_dtype(self, vid: int, dtype: int) -> None:
        """Retypes the vertex's attr on its NodeDef."""
        node_idx, attr = self.vertices[vid]
        if not attr.name:
            raise GraphError(f"cannot retype fixed type {attr} of node {self.nodes[node_idx].name}")
        value = self.nodes[node_idx].attr[attr.name]
        if attr.index < 0:
            value.type = dtype
        else:
            value.list.type[attr.index] = dtype

    def allowed_types(self, vid: int) -> frozenset[int] | None:
        """The dtypes the OpDef admits for the vertex; None means any."""
        node_idx, attr = self.vertices[vid]
        if not attr.name:
            return frozenset((attr.fixed,))
        for attr_def in self.op_defs[node_idx].attr:
            if attr_def.name == attr.name:
                allowed = attr_def.allowed_values.list.type
                return frozenset(allowed) if allowed else None
        return None

    def describe(self, vid: int) -> str:
        node_idx, attr = self.vertices[vid]
        node = self.nodes[node_idx]
        return f"{node.op} node {node.name} type {attr}"

    def reach(
        self,
        roots: Iterable[int],
        *,
        forward: bool,
        backward: bool,
        enter: Callable[[int], bool],
        parents: dict[int, int] | None = None,
    ) -> list[int]:
        """Every vertex reachable from ``roots`` through vertices ``enter`` accepts.

        Roots are always in the result. The traversal is a union over roots,
        so the result does not depend on the order of the roots. When
        ``parents`` is given, it records for each reached non-root vertex the
        neighbour it was first reached from (the "because" of a paint rule).
        """
        seen: dict[int, None] = dict.fromkeys(roots)
        stack = list(seen)
        while stack:
            v = stack.pop()
            if forward:
                for w in self.fanout[v]:
                    if w not in seen and enter(w):
                        seen[w] = None
                        stack.append(w)
                        if parents is not None:
                            parents.setdefault(w, v)
            if backward:
                for w in self.fanin[v]:
                    if w not in seen and enter(w):
                        seen[w] = None
                        stack.append(w)
                        if parents is not None:
                            parents.setdefault(w, v)
        return list(seen)


def _default_type(op_def, attr_name: str) -> int:
    for attr_def in op_def.attr:
        if attr_def.name == attr_name and attr_def.HasField("default_value"):
            return attr_def.default_value.type
    return 0


class _ArgPlan:
    """How one op's input or output args expand to typed ports, prepared once per op."""

    def __init__(self, op_def, args):
        self.op_def = op_def
        self.entries = []
        for arg in args:
            if arg.type_list_attr:
                self.entries.append((arg.type_list_attr, None, True))
                continue
            attr = TypeAttr(arg.type_attr) if arg.type_attr else TypeAttr("", -1, arg.type)
            self.entries.append((arg.number_attr, attr, False))
        defaults = {a.name for a in op_def.attr if a.HasField("default_value")}
        self.required = sorted({attr.name for _, attr, _ in self.entries
                                if attr is not None and attr.name and attr.name not in defaults})
        self.fixed = None
        if all(count == "" and not is_list for count, _, is_list in self.entries):
            self.fixed = [attr for _, attr, _ in self.entries]

    def expand(self, node) -> list[TypeAttr]:
        """The TypeAttr of each port of ``node`` (shared lists: do not mutate)."""
        for name in self.required:
            if name not in node.attr:
                raise GraphError(f"node {node.name} (op {node.op}): type attr {name} is missing")
        if self.fixed is not None:
            return self.fixed
        result = []
        for count_attr, attr, is_list in self.entries:
            if is_list:
                n = _attr_value(node, self.op_def, count_attr).list.type
                result.extend(TypeAttr(count_attr, k) for k in range(len(n)))
            elif count_attr:
                result.extend([attr] * _attr_value(node, self.op_def, count_attr).i)
            else:
                result.append(attr)
        return result


def _attr_value(node, op_def, name: str):
    if name in node.attr:
        return node.attr[name]
    for attr_def in op_def.attr:
        if attr_def.name == name and attr_def.HasField("default_value"):
            return attr_def.default_value
    raise GraphError(f"node {node.name} (op {node.op}): attr {name} is missing")
