"""A typed view of a GraphDef and the functions it calls: one vertex per (node, type attribute).

Painting works on type attributes, not nodes: MatMul has one (``T``),
FusedBatchNormV3 two (``T`` and ``U``), IdentityN one per entry of its
``list(type)`` attr, and AddN's N inputs share one. The OpDef says which
attribute types each input and output port; an input whose type is fixed by
the OpDef (``DT_INT32``, ``DT_VARIANT``) gets a fixed-type vertex, which is
never retyped but still carries paint across the graph.

An edge joins the vertex of a producer's output port to the vertex of the
consumer's input port. Control edges carry no data and are left out.

The view spans the main graph and one instance of a function per call
(:mod:`amp_rewrite.instances` makes them, and joins each call's ports to
its instance's virtual args and results), so paint crosses calls and loops
like any other edge.

Ops that neither TensorFlow nor the graph's function library knows (custom
ops) get no vertices: they stay as they are, and a Cast is put on any edge
between them and a retyped neighbour (the dtype of such an edge is read off
the known side).

This module holds :class:`TypedGraph` (ports, inputs, vertices, edges, their
dtypes and one traversal, :meth:`TypedGraph.reach`), :class:`DataEdges`
(the data edges both ways, in flat int arrays). How each node's ports are
typed comes from :mod:`amp_rewrite.op_ports`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from amp_rewrite.errors import GraphError
from amp_rewrite.instances import Body, Instances, function_source, link_calls
from amp_rewrite.op_ports import TypeAttr, expand_ports
from amp_rewrite.op_registry import OpRegistry

logger = logging.getLogger(__name__)


class TypedGraph:
    """The typed view of ``graph_def`` and of every function instance it reaches.

    Node indices are global, as :class:`~amp_rewrite.instances.Instances`
    numbers them: the main graph's nodes first, in GraphDef order, then each
    instance's virtual args, body nodes and virtual results. The view holds
    references to the NodeDefs (the main graph's working copy and each
    instance's private FunctionDef copy), which later steps retype.

    Attributes:
        graph_def: the GraphDef viewed (the pipeline's working GraphDef, which later steps rewrite).
        library, nodes, names, ops, body_of, bodies, virtual, opaque_calls: the
            function instances' (see :class:`~amp_rewrite.instances.Instances`).
        index: main-graph node name → global index.
        op_defs: the OpDef of each node, or None for unknown ops.
        unknown_ops: the ops of the nodes with no OpDef, sorted.
        in_attrs, out_attrs: per node, the TypeAttr of each input / output port (None for unknown ops).
        out_args: per node, the first output port of each named output arg (how function bodies name outputs).
        edges: every data edge (:class:`DataEdges`).
        control_consumers: per node, whether some node has a control edge from it.
        vertex_node, vertex_attr: per vertex id, its node and its TypeAttr (two lists, no object per vertex).
        node_vertices: per node, the vertex ids of its type attrs (consecutive).
        fanin, fanout: per vertex, the vertex ids it is joined to (tuples once the view is built).
        groups: boundary groups: vertex ids that must hold one dtype.
        loop_groups: the subset of ``groups`` that are While loop variables.

    Per-node and per-vertex containers are tuples, not lists, sharing one int
    object per vertex id: at 200k nodes each extra object costs megabytes.

    ``opaque_functions`` (function name → reason) are never instantiated:
    every call of one is opaque, with that reason.
    """

    def __init__(self, graph_def, registry: OpRegistry | None = None, *,
                 opaque_functions: Mapping[str, str] | None = None):
        self.graph_def = graph_def
        self.registry = registry if registry is not None else OpRegistry(graph_def.library)
        self._facts: dict[str, _OpFacts] = {}
        instances = Instances(graph_def, self.registry, opaque_functions=opaque_functions)
        self.library, self.nodes, self.names = instances.library, instances.nodes, instances.names
        self.ops, self.body_of = instances.ops, instances.body_of
        self.bodies, self.virtual, self.opaque_calls = instances.bodies, instances.virtual, instances.opaque_calls
        self.index = self.bodies[0].index
        self.op_defs = [self.registry.op_def(op) for op in self.ops]
        self.unknown_ops = sorted({op for op, d in zip(self.ops, self.op_defs) if d is None})
        for op in self.unknown_ops:
            logger.warning("op %s is not registered in TensorFlow nor in the graph's function library; "
                           "its nodes stay as they are", op)
        self.in_attrs, self.out_attrs, self.out_args = expand_ports(self.nodes, self.ops, self.op_defs, self.registry)
        self.edges, self.control_consumers = _read_inputs(
            self.bodies, self.nodes, self.in_attrs, self.out_attrs, self.out_args)
        _check_acyclic(self.nodes, self.ops, self.edges, self.bodies, self.body_of)
        self._build_vertices()
        self.fanin, self.fanout = _build_fans(len(self.vertex_node), self.in_vids, self.out_vids, self.node_vertices,
                                              self.edges)
        self._grown: set[int] | None = set()  # vertices whose neighbours are a list again (add_edge)
        self.groups, self.loop_groups = link_calls(self)
        for v in self._grown:  # the vertices the calls joined to their instances: tuples again
            self.fanin[v], self.fanout[v] = tuple(self.fanin[v]), tuple(self.fanout[v])
        self._grown = None  # edges added later (the pipeline's) stay in lists

    # -- construction: vertices (ports, data edges and fans come from the functions below) --

    def _build_vertices(self) -> None:
        """Numbers the vertices node by node, and records the vertex of each input and output port.

        Nodes of one op whose ports expand the same way share a layout
        (their attrs, and each port's position among them), computed once.
        """
        self.vertex_node: list[int] = []
        self.vertex_attr: list[TypeAttr] = []
        self.node_vertices: list[tuple[int, ...]] = []
        self.in_vids: list[Sequence[int] | None] = []
        self.out_vids: list[Sequence[int] | None] = []
        layouts: dict[str, tuple] = {}
        vertex_node, vertex_attr = self.vertex_node, self.vertex_attr
        node_vertices, in_vids, out_vids = self.node_vertices, self.in_vids, self.out_vids
        in_attrs, out_attrs = self.in_attrs, self.out_attrs
        # A node's vertex ids are one tuple, which its port lists are too when
        # their ports are its attrs in order (most ops: one attr, one output).
        # Node indices as the int objects the bodies' indexes hold, not one more per vertex.
        indices = itertools.chain.from_iterable(body.index.values() for body in self.bodies)
        for i, op, op_def in zip(indices, self.ops, self.op_defs):
            if op_def is None:
                node_vertices.append(())
                in_vids.append(None)
                out_vids.append(None)
                continue
            ins, outs = in_attrs[i], out_attrs[i]
            layout = layouts.get(op)
            if (layout is None or not (layout[0] is ins or layout[0] == ins)
                    or not (layout[1] is outs or layout[1] == outs)):
                layout = self._layout(i, ins, outs)
                whole = list(range(len(layout[2])))
                layout += (layout[3] == whole, layout[4] == whole)
                if not self.op_facts(i).lists:
                    layouts[op] = layout
            attrs, in_pos, out_pos, same_in, same_out = layout[2:]
            base = len(vertex_node)
            vertex_node.extend([i] * len(attrs))
            vertex_attr.extend(attrs)
            vids = tuple(range(base, base + len(attrs)))  # the one int object of each vertex id
            node_vertices.append(vids)
            in_vids.append(vids if same_in else tuple([vids[k] for k in in_pos]))
            out_vids.append(vids if same_out else tuple([vids[k] for k in out_pos]))

    def _layout(self, i: int, ins: list[TypeAttr], outs: list[TypeAttr]) -> tuple:
        """(ins, outs, the node's type attrs in vertex order, each input's and output's position)."""
        attrs = dict.fromkeys(ins + outs)
        # Type attrs tied to no port (TensorList element_dtype, StackV2
        # elem_type) are vertices too: data-structure rules paint them.
        facts = self.op_facts(i)
        node = self.nodes[i]
        for name in facts.singles:
            attrs.setdefault(TypeAttr(name))
        for name in facts.lists:
            if name in node.attr:
                for k in range(len(node.attr[name].list.type)):
                    attrs.setdefault(TypeAttr(name, k))
        position = {attr: k for k, attr in enumerate(attrs)}
        return ins, outs, list(attrs), [position[a] for a in ins], [position[a] for a in outs]

    def add_edge(self, u: int, v: int) -> None:
        """Joins vertex ``u`` to ``v`` (paint may flow both ways; ``u`` is the producer)."""
        for adjacency, vertex, other in ((self.fanout, u, v), (self.fanin, v, u)):
            neighbours = adjacency[vertex]
            if type(neighbours) is not list:  # a built view's tuple: a list again, so that more edges append
                neighbours = adjacency[vertex] = list(neighbours)
                if self._grown is not None:
                    self._grown.add(vertex)
            neighbours.append(other)

    # -- queries --------------------------------------------------------------

    def inputs(self, node: int) -> list[tuple[int, int]]:
        """(source node, source port) of each data input of ``node``, in input order."""
        return self.edges.inputs(node)

    def consumers(self, node: int, port: int = 0) -> list[tuple[int, int]]:
        """(consumer node, data-input ordinal) of each data edge out of ``port`` of ``node``, in node order."""
        return self.edges.consumers(node, port)

    def output_vertex(self, node: int, port: int) -> int | None:
        """The vertex typing output ``port`` of ``node`` (None for unknown ops)."""
        vids = self.out_vids[node]
        return None if vids is None else vids[port]

    def input_vertex(self, node: int, ordinal: int) -> int | None:
        """The vertex typing data input ``ordinal`` of ``node`` (None for unknown ops)."""
        vids = self.in_vids[node]
        return None if vids is None else vids[ordinal]

    def input_source_vertex(self, node: int, ordinal: int) -> int | None:
        """The producer-side vertex of data input ``ordinal`` of ``node``."""
        k = self.edges.in_start[node] + ordinal
        return self.output_vertex(self.edges.in_src[k], self.edges.in_port[k])

    def vertex(self, node_name: str, attr: TypeAttr | str, body: int = 0) -> int | None:
        """The vertex id of ``node_name``'s type ``attr`` in ``body`` (the main graph by default)."""
        if isinstance(attr, str):
            attr = TypeAttr(attr)
        i = self.bodies[body].index.get(node_name)
        return None if i is None else self.vertex_of(i, attr)

    def vertex_of(self, node: int, attr: TypeAttr | str) -> int | None:
        if isinstance(attr, str):
            attr = TypeAttr(attr)
        return next((v for v in self.node_vertices[node] if self.vertex_attr[v] == attr), None)

    def op(self, vid: int) -> str:
        return self.ops[self.vertex_node[vid]]

    def node_of(self, vid: int):
        return self.nodes[self.vertex_node[vid]]

    def tensor_ref(self, node: int, port: int) -> str:
        """How the node's body names output ``port`` of ``node`` as an input string."""
        name = self.nodes[node].name
        body = self.bodies[self.body_of[node]]
        if body.is_main:
            return name if port == 0 else f"{name}:{port}"
        if node in self.virtual:
            return name
        starts = self.out_args[node]
        arg, base = max(((a, s) for a, s in starts.items() if s <= port), key=lambda item: item[1])
        return f"{name}:{arg}:{port - base}"

    def dtype(self, vid: int) -> int:
        """The DataType the vertex currently holds (the OpDef default if the attr is unset)."""
        node_idx, attr = self.vertex_node[vid], self.vertex_attr[vid]
        name = attr.name
        if not name:
            return attr.fixed
        node_attrs = self.nodes[node_idx].attr
        if name in node_attrs:
            value = node_attrs[name]
            return value.type if attr.index < 0 else value.list.type[attr.index]
        return _default_type(self.op_defs[node_idx], name)

    def dtypes(self) -> list[int]:
        """The DataType every vertex holds now, by vertex id (what :meth:`dtype` gives, in one pass)."""
        result: list[int] = []
        append = result.append
        nodes = self.nodes
        for node_idx, attr in zip(self.vertex_node, self.vertex_attr):
            name = attr.name
            if not name:
                append(attr.fixed)
                continue
            node_attrs = nodes[node_idx].attr
            if name in node_attrs:
                value = node_attrs[name]
                append(value.type if attr.index < 0 else value.list.type[attr.index])
            else:
                append(_default_type(self.op_defs[node_idx], name))
        return result

    def set_dtype(self, vid: int, dtype: int) -> None:
        """Retypes the vertex's attr on its NodeDef."""
        node_idx, attr = self.vertex_node[vid], self.vertex_attr[vid]
        if not attr.name:
            raise GraphError(f"cannot retype fixed type {attr} of node {self.nodes[node_idx].name}")
        value = self.nodes[node_idx].attr[attr.name]
        if attr.index < 0:
            value.type = dtype
        else:
            value.list.type[attr.index] = dtype

    def allowed_types(self, vid: int) -> frozenset[int] | None:
        """The dtypes the OpDef admits for the vertex; None means any."""
        node_idx, attr = self.vertex_node[vid], self.vertex_attr[vid]
        if not attr.name:
            return frozenset((attr.fixed,))
        return self.op_facts(node_idx).allowed.get(attr.name)

    def op_facts(self, node: int) -> _OpFacts:
        """Type attrs and admitted dtypes of the node's op (cached per op)."""
        op = self.ops[node]
        facts = self._facts.get(op)
        if facts is None:
            is_function = self.registry.is_library_function(op)
            facts = _facts_of(self.op_defs[node]) if is_function else _registry_facts(op)
            self._facts[op] = facts
        return facts

    def describe(self, vid: int) -> str:
        node_idx, attr = self.vertex_node[vid], self.vertex_attr[vid]
        node = self.nodes[node_idx]
        return f"{node.op} node {node.name} type {attr}"

    def main_nodes_after(self, start_ops: tuple[str, ...], stop_ops: tuple[str, ...]) -> set[int]:
        """Main-graph nodes reached along data edges from a node of ``start_ops``, not passing ``stop_ops``.

        With Enter/Exit this is every node inside a v1 while frame; with
        Switch/Merge, every node on a cond branch.
        """
        found = {i for i in self.bodies[0].index.values() if self.ops[i] in start_ops}
        stack = list(found)
        while stack:
            i = stack.pop()
            known = self.out_attrs[i] is not None  # an unknown op: its first output only
            for port, dst, _ in self.edges.out_edges(i):
                if (known or not port) and dst not in found and self.ops[dst] not in stop_ops:
                    found.add(dst)
                    stack.append(dst)
        return found

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



# -- construction: ports and data inputs, the node-level graph under the vertices --


class DataEdges:
    """Every data edge of the view, by consumer and by producer, in flat int arrays.

    A node's data inputs are entries ``in_start[d]`` to ``in_start[d + 1]`` of
    ``in_src`` / ``in_port`` / ``in_dst`` (the node itself); the edges out of it are entries ``out_start[s]``
    to ``out_start[s + 1]`` of ``out_port`` / ``out_dst`` / ``out_ordinal``,
    sorted by port, then by consumer and input. Arrays hold no Python object
    per edge: a large graph has hundreds of thousands of edges.
    """

    def __init__(self, in_start: array, in_src: array, in_port: array, in_dst: array):
        self.in_start, self.in_src, self.in_port, self.in_dst = in_start, in_src, in_port, in_dst
        nodes, count = len(in_start) - 1, len(in_src)
        # A counting sort of the edges by source node: stable, so each node's edges stay in consumer order.
        starts = array("q", bytes(8 * (nodes + 1)))
        for src in in_src:
            starts[src + 1] += 1
        for i in range(nodes):
            starts[i + 1] += starts[i]
        self.out_start = array("q", starts)
        out_port, out_dst, out_ordinal = (array("i", bytes(4 * count)) for _ in range(3))
        read_on_later_ports = set()
        for edge, (src, port, dst) in enumerate(zip(in_src, in_port, in_dst)):
            at = starts[src]
            starts[src] = at + 1
            out_port[at], out_dst[at], out_ordinal[at] = port, dst, edge - in_start[dst]
            if port:
                read_on_later_ports.add(src)
        for src in read_on_later_ports:  # a node read on several ports: its edges by port, stably
            a, b = self.out_start[src], self.out_start[src + 1]
            by_port = sorted(zip(out_port[a:b], out_dst[a:b], out_ordinal[a:b]), key=operator.itemgetter(0))
            out_port[a:b], out_dst[a:b], out_ordinal[a:b] = (array("i", column) for column in zip(*by_port))
        self.out_port, self.out_dst, self.out_ordinal = out_port, out_dst, out_ordinal

    def inputs(self, node: int) -> list[tuple[int, int]]:
        a, b = self.in_start[node], self.in_start[node + 1]
        return list(zip(self.in_src[a:b], self.in_port[a:b]))

    def out_edges(self, node: int) -> list[tuple[int, int, int]]:
        """(port, consumer node, data-input ordinal) of each data edge out of ``node``."""
        a, b = self.out_start[node], self.out_start[node + 1]
        return list(zip(self.out_port[a:b], self.out_dst[a:b], self.out_ordinal[a:b]))

    def consumers(self, node: int, port: int) -> list[tuple[int, int]]:
        a, b = self.out_start[node], self.out_start[node + 1]
        out_port = self.out_port
        return [(self.out_dst[k], self.out_ordinal[k]) for k in range(a, b) if out_port[k] == port]

    def by_source_port(self) -> Iterator[tuple[int, int, list[tuple[int, int]]]]:
        """(node, port, its consumers) for every output port with a data edge out of it, sorted."""
        out_start, out_port, out_dst, out_ordinal = self.out_start, self.out_port, self.out_dst, self.out_ordinal
        for src in range(len(out_start) - 1):
            a, b = out_start[src], out_start[src + 1]
            if a < b and out_port[a] == out_port[b - 1]:  # most nodes: one output read
                yield src, out_port[a], list(zip(out_dst[a:b], out_ordinal[a:b]))
                continue
            while a < b:
                port, end = out_port[a], a + 1
                while end < b and out_port[end] == port:
                    end += 1
                yield src, port, list(zip(out_dst[a:end], out_ordinal[a:end]))
                a = end


def _read_inputs(bodies: list[Body], nodes: list, in_attrs: list, out_attrs: list,
                 out_args: list) -> tuple[DataEdges, list]:
    """Every node's data inputs as (source node, port), and whether each node is a control source.

    Raises:
        GraphError: naming the node, for an input that names no node or no
            output of its source, a data input after a control input, or a
            wrong number of data inputs.
    """
    in_start, in_src, in_port, in_dst = array("q", [0]), array("i"), array("i"), array("i")
    control_consumers = [False] * len(nodes)
    for body in bodies:  # each body's nodes are contiguous, in body order, as its index lists them
        _read_body_inputs(body, body.index.values(), nodes, in_attrs, out_attrs, out_args,
                          in_start, in_src, in_port, in_dst, control_consumers)
    return DataEdges(in_start, in_src, in_port, in_dst), control_consumers


def _read_body_inputs(body: Body, indices: Iterable[int], nodes: list, in_attrs: list, out_attrs: list, out_args: list,
                      in_start: array, in_src: array, in_port: array, in_dst: array,
                      control_consumers: list) -> None:
    """:func:`_read_inputs` for one body's nodes; appends to the arrays and ``control_consumers``."""
    find = body.index.get
    is_main = body.is_main
    add_src, add_port, add_dst = in_src.append, in_port.append, in_dst.append
    for dst in indices:  # the int objects the body's index holds, in node order
        node = nodes[dst]
        count = 0
        seen_control = False
        for ref in node.input[:]:  # one list: iterating the field itself costs more per string
            if ref[:1] == "^":
                src = find(ref[1:])
                if src is None:
                    _missing_input(body, node, ref)
                seen_control = True
                control_consumers[src] = True
                continue
            if is_main:
                if ":" not in ref:
                    src = find(ref)
                    port = 0
                else:
                    colon = ref.rfind(":")
                    if colon > 0 and ref[colon + 1:].isdigit():
                        src, port = find(ref[:colon]), int(ref[colon + 1:])
                    else:
                        src, port = find(ref), 0
                if src is None:
                    _missing_input(body, node, ref)
            else:
                src, port = function_source(body, ref, node, out_args)
            if seen_control:
                raise GraphError(f"{body.where(node)}: data input {ref!r} follows a control input")
            outs = out_attrs[src]
            if outs is not None and port >= len(outs):
                raise GraphError(
                    f"{body.where(node)}: input {ref!r} asks for output {port} "
                    f"of {nodes[src].op} node {nodes[src].name}, which has {len(outs)}"
                )
            add_src(src)
            add_port(port)
            add_dst(dst)
            count += 1
        expected = in_attrs[dst]
        if expected is not None and len(expected) != count:
            raise GraphError(f"{body.where(node)}: expected {len(expected)} data inputs, got {count}")
        in_start.append(len(in_src))


def _build_fans(vertex_count: int, in_vids: list, out_vids: list, node_vertices: list,
                edges: DataEdges) -> tuple[list[Sequence[int]], list[Sequence[int]]]:
    """Fan-in and fan-out: each producer port's vertex joined to the vertex of each input it feeds.

    Each vertex's neighbours are gathered in one go, from its node's
    inputs (fan-in) or its node's outgoing edges (fan-out), and stored as
    one tuple, in the order of the edges: by consumer node, then input.
    """
    fanin: list[Sequence[int]] = [()] * vertex_count
    fanout: list[Sequence[int]] = [()] * vertex_count
    in_start, in_src, in_port = edges.in_start, edges.in_src, edges.in_port
    for dst, vids in enumerate(in_vids):
        if not vids:
            continue
        start = in_start[dst]
        if len(vids) == 1:  # most nodes: one input
            if (src_vids := out_vids[in_src[start]]) is not None:
                fanin[vids[0]] = (src_vids[in_port[start]],)
            continue
        if len(node_vertices[dst]) == 1:  # all inputs on the node's one vertex
            fanin[vids[0]] = tuple([src_vids[in_port[e]] for e in range(start, start + len(vids))
                                    if (src_vids := out_vids[in_src[e]]) is not None])
            continue
        if len(vids) == len(set(vids)):  # each input on its own vertex
            for k, v in enumerate(vids):
                if (src_vids := out_vids[in_src[start + k]]) is not None:
                    fanin[v] = (src_vids[in_port[start + k]],)
            continue
        producers = [(v, src_vids[in_port[start + k]]) for k, v in enumerate(vids)
                     if (src_vids := out_vids[in_src[start + k]]) is not None]
        _store_grouped(fanin, producers)
    out_start, out_port, out_dst, out_ordinal = edges.out_start, edges.out_port, edges.out_dst, edges.out_ordinal
    for src, vids in enumerate(out_vids):
        a, b = out_start[src], out_start[src + 1]
        if vids is None or a == b:
            continue
        if b - a == 1:  # most nodes: one consumer
            if (dst_vids := in_vids[out_dst[a]]) is not None:
                fanout[vids[out_port[a]]] = (dst_vids[out_ordinal[a]],)
            continue
        if out_port[a] == out_port[b - 1]:  # one output is read (edges are sorted by port)
            fanout[vids[out_port[a]]] = tuple([dst_vids[k] for dst, k in zip(out_dst[a:b], out_ordinal[a:b])
                                               if (dst_vids := in_vids[dst]) is not None])
            continue
        out_edges = sorted(zip(out_dst[a:b], out_ordinal[a:b], out_port[a:b]))  # in consumer and input order
        readers = [(vids[port], dst_vids[k]) for dst, k, port in out_edges
                   if (dst_vids := in_vids[dst]) is not None]
        _store_grouped(fanout, readers)
    return fanin, fanout


def _store_grouped(adjacency: list, pairs: list[tuple[int, int]]) -> None:
    """Stores each vertex's neighbours from (vertex, neighbour) pairs of one node, as tuples in pair order."""
    grouped: dict[int, list[int]] = {}
    for v, w in pairs:
        grouped.setdefault(v, []).append(w)
    for v, found in grouped.items():
        adjacency[v] = tuple(found)


def _check_acyclic(nodes: list, ops: list[str], edges: DataEdges, bodies: list[Body], body_of: list[int]) -> None:
    """Refuses a data cycle that is not a v1 loop (whose only back edges end in a Merge).

    When some edge points backwards in node order, Kahn's algorithm finds
    whether a cycle exists in linear time; only then does networkx name one.
    """
    back_edge_sources = ("NextIteration", "RefNextIteration")
    back = {i for i, op in enumerate(ops) if op in back_edge_sources}
    in_src, in_dst, out_start, out_dst = edges.in_src, edges.in_dst, edges.out_start, edges.out_dst
    # Most GraphDefs list every node after its inputs: then no edge can close a cycle.
    if all(map(operator.lt, in_src, in_dst)) or all(src < dst or src in back for src, dst in zip(in_src, in_dst)):
        return
    indegree = [0] * len(nodes)
    for src, dst in zip(in_src, in_dst):
        if src not in back:
            indegree[dst] += 1
    ready = [i for i, d in enumerate(indegree) if d == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        if i in back:
            continue  # its edges were not counted
        for j in out_dst[out_start[i]:out_start[i + 1]]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if done == len(nodes):
        return
    import networkx as nx

    cyclic = nx.DiGraph((i, j) for i in range(len(nodes)) if indegree[i] > 0 and i not in back
                        for j in out_dst[out_start[i]:out_start[i + 1]] if indegree[j] > 0)
    cycle = [u for u, _ in nx.find_cycle(cyclic)]
    body = bodies[body_of[cycle[0]]]
    path = " -> ".join(f"{nodes[u].name} ({nodes[u].op})" for u in cycle + cycle[:1])
    raise GraphError(f"data cycle that is not a while loop{body.suffix}: {path}")


def _missing_input(body: Body, node, ref: str):
    raise GraphError(f"{body.where(node)}: input {ref!r} names a node that does not exist")


def _default_type(op_def, attr_name: str) -> int:
    for attr_def in op_def.attr:
        if attr_def.name == attr_name and attr_def.HasField("default_value"):
            return attr_def.default_value.type
    return 0



class _OpFacts(NamedTuple):
    """What the view asks of an OpDef again and again, computed once per op."""

    singles: tuple[str, ...]  # names of ``type`` attrs
    lists: tuple[str, ...]  # names of ``list(type)`` attrs
    allowed: dict  # attr name -> frozenset of admitted dtypes, or None for any


def _facts_of(op_def) -> _OpFacts:
    return _OpFacts(
        singles=tuple(a.name for a in op_def.attr if a.type == "type"),
        lists=tuple(a.name for a in op_def.attr if a.type == "list(type)"),
        allowed={a.name: (frozenset(a.allowed_values.list.type) or None) for a in op_def.attr},
    )


@functools.cache
def _registry_facts(op: str) -> _OpFacts:
    """Facts of a registered op; TensorFlow's registry does not change within a process."""
    return _facts_of(OpRegistry.registry_op_def(op))


