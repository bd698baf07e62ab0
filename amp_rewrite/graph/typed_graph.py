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
(:mod:`amp_rewrite.graph.instances` makes them; :func:`link_calls` joins each
call's ports to its instances' virtual args and results), so paint crosses
calls and loops like any other edge. The vertices that must hold one dtype
across a boundary form *boundary groups*: a call's ``Tin[i]`` and the
callee's arg ``i``; a While's ``T[i]`` with its body's arg and result ``i``
and its cond's arg ``i``.

Ops that neither TensorFlow nor the graph's function library knows (custom
ops) get no vertices: they stay as they are, and a Cast is put on any edge
between them and a retyped neighbour (the dtype of such an edge is read off
the known side).

This module holds :class:`TypedGraph` (ports, inputs, vertices, edges and one
traversal, :meth:`TypedGraph.reach`) and :func:`link_calls`. It is built from
:mod:`amp_rewrite.graph.op_ports` (the TypeAttr of each node's ports) and
:mod:`amp_rewrite.graph.data_edges` (the data edges both ways, in flat int arrays,
and each vertex's neighbours over them); the dtype each vertex holds is read
and written by its base, :class:`~amp_rewrite.graph.vertex_dtypes.VertexDtypes`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from amp_rewrite.graph.data_edges import build_fans, check_acyclic, read_inputs
from amp_rewrite.graph.instances import WHILE_OPS, Instances
from amp_rewrite.graph.op_ports import TypeAttr, expand_ports
from amp_rewrite.graph.op_registry import OpRegistry
from amp_rewrite.graph.vertex_dtypes import VertexDtypes

logger = logging.getLogger(__name__)

# Calls whose first input selects the branch rather than feeding an argument.
_BRANCH_OPS = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})


class TypedGraph(VertexDtypes):
    """The typed view of ``graph_def`` and of every function instance it reaches.

    Node indices are global, as :class:`~amp_rewrite.graph.instances.Instances`
    numbers them: the main graph's nodes first, in GraphDef order, then each
    instance's virtual args, body nodes and virtual results. The view holds
    references to the NodeDefs (the main graph's working copy and each
    instance's private FunctionDef copy), which later steps retype.

    Attributes:
        graph_def: the GraphDef viewed (the pipeline's working GraphDef, which later steps rewrite).
        library, nodes, names, ops, body_of, bodies, virtual, opaque_calls: the
            function instances' (see :class:`~amp_rewrite.graph.instances.Instances`).
        index: main-graph node name → global index.
        op_defs: the OpDef of each node, or None for unknown ops.
        unknown_ops: the ops of the nodes with no OpDef, sorted.
        in_attrs, out_attrs: per node, the TypeAttr of each input / output port (None for unknown ops).
        out_args: per node, the first output port of each named output arg (how function bodies name outputs).
        edges: every data edge (:class:`~amp_rewrite.graph.data_edges.DataEdges`).
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
        self._facts = {}
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
        self.edges, self.control_consumers = read_inputs(
            self.bodies, self.nodes, self.in_attrs, self.out_attrs, self.out_args)
        check_acyclic(self.nodes, self.ops, self.edges, self.bodies, self.body_of)
        self._build_vertices()
        self.fanin, self.fanout = build_fans(len(self.vertex_node), self.in_vids, self.out_vids, self.node_vertices,
                                             self.edges)
        self._grown: set[int] | None = set()  # vertices whose neighbours are a list again (add_edge)
        self.groups, self.loop_groups = link_calls(self)
        for v in self._grown:  # the vertices the calls joined to their instances: tuples again
            self.fanin[v], self.fanout[v] = tuple(self.fanin[v]), tuple(self.fanout[v])
        self._grown = None  # edges added later (the pipeline's) stay in lists

    # -- construction: vertices (ports come from op_ports, data edges and fans from data_edges) --

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

    def v1_loop_nodes(self) -> set[int]:
        """Main-graph nodes inside a v1 while frame: reached from an Enter before its Exit."""
        return self.main_nodes_after(("Enter", "RefEnter"), ("Exit", "RefExit"))

    def loop_instances(self) -> set[int]:
        """Instances that run once per iteration: While bodies and conds, and what they call."""
        inside: set[int] = set()
        for body_id in range(1, len(self.bodies)):
            body = self.bodies[body_id]
            if self.nodes[body.call].op in WHILE_OPS or self.body_of[body.call] in inside:
                inside.add(body_id)
        return inside

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


# -- construction: calls joined to their instances --


def link_calls(view: TypedGraph) -> tuple[list[list[int]], list[list[int]]]:
    """Joins each call's ports to its instances' virtual args and results in ``view``.

    Paint then flows across a call like any other edge: into an argument, out
    of a result, and around a While loop from its body's results back to its
    arguments and its cond's.

    Returns:
        The boundary groups (vertex ids that must hold one dtype), and the
        subset of them that are While loop variables.
    """
    groups: list[list[int]] = []
    loop_groups: list[list[int]] = []
    for body in view.bodies:
        for call, by_attr in body.children.items():
            node = view.nodes[call]
            if node.op in WHILE_OPS:
                for group in _link_while(view, call, by_attr["cond"][0], by_attr["body"][0]):
                    groups.append(group)
                    loop_groups.append(group)
                continue
            offset = 1 if node.op in _BRANCH_OPS else 0
            instances = [b for attr in sorted(by_attr) for b in by_attr[attr]]
            n_in = len(view.in_attrs[call] or []) - offset
            n_out = len(view.out_attrs[call] or [])
            for k in range(n_in):
                port = view.input_vertex(call, k + offset)
                args = [view.output_vertex(view.bodies[b].args[k], 0) for b in instances]
                for arg in args:
                    view.add_edge(port, arg)
                groups.append([port, *args])
            for k in range(n_out):
                port = view.output_vertex(call, k)
                rets = [view.input_vertex(view.bodies[b].rets[k], 0) for b in instances]
                for ret in rets:
                    view.add_edge(ret, port)
                groups.append([port, *rets])
    return groups, loop_groups


def _link_while(view: TypedGraph, call: int, cond: int, body_id: int) -> list[list[int]]:
    """Links one While call to its body and cond; returns one group per loop variable."""
    loop, test = view.bodies[body_id], view.bodies[cond]
    groups = []
    for k in range(len(view.in_attrs[call])):
        port = view.input_vertex(call, k)
        arg = view.output_vertex(loop.args[k], 0)
        ret = view.input_vertex(loop.rets[k], 0)
        test_arg = view.output_vertex(test.args[k], 0)
        for u, v in ((port, arg), (port, test_arg), (ret, arg), (ret, test_arg), (ret, port)):
            view.add_edge(u, v)
        groups.append([port, arg, ret, test_arg])
    return groups
