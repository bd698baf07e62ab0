"""A typed view of a GraphDef and the functions it calls: one vertex per (node, type attribute).

Painting works on type attributes, not nodes: MatMul has one (``T``),
FusedBatchNormV3 two (``T`` and ``U``), IdentityN one per entry of its
``list(type)`` attr, and AddN's N inputs share one. The OpDef says which
attribute types each input and output port; an input whose type is fixed by
the OpDef (``DT_INT32``, ``DT_VARIANT``) gets a fixed-type vertex, which is
never retyped but still carries paint across the graph.

An edge joins the vertex of a producer's output port to the vertex of the
consumer's input port. Control edges carry no data and are left out.

Functions are seen through, not around. Every call of a library function
(``PartitionedCall``, ``While``, ``If``, ``Case``, or a direct call) gets its
own *instance*: a private copy of the FunctionDef, with a virtual ``_Arg``
node per input and a virtual ``_Retval`` node per output, joined by edges to
the call's ports. Paint then flows across the boundary like any other edge,
and each instance can be rewritten on its own; :mod:`amp_rewrite.functions`
later folds identical instances back into one function. The vertices that
must hold one dtype across a boundary (a call's ``Tin[i]`` and the callee's
arg ``i``; a While's ``T[i]`` with its body's arg and result ``i`` and its
cond's arg ``i``) are recorded as *boundary groups*.

Ops that neither TensorFlow nor the graph's function library knows (custom
ops) get no vertices: they stay as they are, and a Cast is put on any edge
between them and a retyped neighbour (the dtype of such an edge is read off
the known side).
"""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

from amp_rewrite.errors import GraphError
from amp_rewrite.graph_facts import DTYPE_NAMES
from amp_rewrite.op_registry import OpRegistry

logger = logging.getLogger(__name__)


# Call-like ops, with the attrs naming the functions they run.
CALL_FUNCTION_ATTRS = {
    "PartitionedCall": ("f",),
    "StatefulPartitionedCall": ("f",),
    "While": ("cond", "body"),
    "StatelessWhile": ("cond", "body"),
    "If": ("then_branch", "else_branch"),
    "StatelessIf": ("then_branch", "else_branch"),
    "Case": ("branches",),
    "StatelessCase": ("branches",),
}
WHILE_OPS = frozenset({"While", "StatelessWhile"})
# Bounds on instantiation: deeper or more calls are treated as opaque.
MAX_CALL_DEPTH = 32
MAX_INSTANCES = 4096


class TypeAttr(NamedTuple):
    """Identifies one type within a node: an attr, an entry of a list attr, or a fixed type."""

    name: str
    index: int = -1
    fixed: int = 0

    def __str__(self) -> str:
        if not self.name:
            return DTYPE_NAMES.get(self.fixed, f"dtype{self.fixed}")
        return self.name if self.index < 0 else f"{self.name}[{self.index}]"


class Vertex(NamedTuple):
    """One vertex of the typed view: a type attribute of a node."""

    node: int
    attr: TypeAttr


@dataclass
class Body:
    """The main graph (``function`` empty) or one instance of a library function.

    Attributes:
        function: the library function's name; "" for the main graph.
        fdef: this instance's private copy of the FunctionDef (None for the main graph).
        call: the global index of the node whose call made this instance, or None.
        depth: how many calls deep the instance is.
        index: node name → global node index, for the nodes of this body.
        args, rets: global indices of the virtual ``_Arg`` / ``_Retval`` nodes.
        children: per call node of this body, the instances it calls, by attr.
    """

    function: str
    fdef: object = None
    call: int | None = None
    depth: int = 0
    index: dict = field(default_factory=dict)
    args: list = field(default_factory=list)
    rets: list = field(default_factory=list)
    children: dict = field(default_factory=dict)

    @property
    def is_main(self) -> bool:
        return self.fdef is None


class TypedGraph:
    """The typed view of ``graph_def`` and of every function instance it reaches.

    Node indices are global: the main graph's nodes come first, in GraphDef
    order, then each instance's virtual args, body nodes and virtual results.
    The view holds references to the NodeDefs (the main graph's working copy
    and each instance's private FunctionDef copy), which later steps retype.

    Attributes:
        graph_def: the GraphDef viewed (the pipeline passes its own working copy).
        nodes: every node, by global index.
        body_of: per node, the index of its body in ``bodies``.
        bodies: the main graph (index 0) and the function instances.
        index: main-graph node name → global index.
        op_defs: the OpDef of each node, or None for unknown ops.
        inputs: per node, the (source node, source port) of each data input.
        consumers: (node, output port) → [(consumer node, data-input ordinal)].
        control_consumers: per node, whether some node has a control edge from it.
        vertices: (node, TypeAttr) per vertex id.
        node_vertices: per node, the vertex ids of its type attrs.
        fanin, fanout: per vertex, the vertex ids it is joined to.
        groups: boundary groups: vertex ids that must hold one dtype.
        loop_groups: the subset of ``groups`` that are While loop variables.
        opaque_calls: call nodes whose functions could not be instantiated.
    """

    def __init__(self, graph_def, registry: OpRegistry | None = None):
        self.graph_def = graph_def
        self.registry = registry if registry is not None else OpRegistry(graph_def.library)
        self.library = {f.signature.name: f for f in graph_def.library.function}
        self.nodes: list = []
        self.body_of: list[int] = []
        self.bodies: list[Body] = []
        self.virtual: set[int] = set()
        self.opaque_calls: dict[int, str] = {}
        self._facts: dict[str, _OpFacts] = {}
        main = Body(function="")
        self._add_body(main, list(graph_def.node))
        self.index = main.index
        self._instantiate_calls()
        self.op_defs = [self.registry.op_def(node.op) for node in self.nodes]
        self.unknown_ops = sorted({n.op for n, d in zip(self.nodes, self.op_defs) if d is None})
        for op in self.unknown_ops:
            logger.warning("op %s is not registered in TensorFlow nor in the graph's function library; "
                           "its nodes stay as they are", op)
        self._expand_ports()
        self._read_inputs()
        self._check_acyclic()
        self._build_vertices()
        self._build_edges()
        self._link_calls()

    # -- construction: bodies and instances --------------------------------------

    def _add_body(self, body: Body, nodes: list) -> int:
        body_id = len(self.bodies)
        self.bodies.append(body)
        index, all_nodes = body.index, self.nodes
        for node in nodes:
            name = node.name
            if name in index:
                where = f" in function {body.function}" if body.function else ""
                raise GraphError(f"duplicate node name {name!r} (op {node.op}){where}")
            index[name] = len(all_nodes)
            all_nodes.append(node)
        self.body_of.extend([body_id] * len(nodes))
        return body_id

    def _instantiate_calls(self) -> None:
        """Gives every call of a library function its own instance, breadth first, in node order.

        A call is instantiated whole or not at all: if one of its functions
        cannot be (missing, recursive, polymorphic, too deep), the call is
        opaque and paint does not cross it.
        """
        body_id = 0
        library, nodes = self.library, self.nodes
        while body_id < len(self.bodies):
            body = self.bodies[body_id]
            for i in list(body.index.values()):
                op = nodes[i].op
                if op not in CALL_FUNCTION_ATTRS and op not in library:
                    continue  # calls nothing (what _callees would find)
                callees = self._callees(nodes[i])
                if not callees:
                    continue
                reason = next(filter(None, (self._cannot_instantiate(f, body)
                                            for names in callees.values() for f in names)), None)
                if reason is not None:
                    self.opaque_calls[i] = reason
                    continue
                body.children[i] = {attr: [self._instantiate(f, i, body) for f in names]
                                    for attr, names in callees.items()}
            body_id += 1

    def _callees(self, node) -> dict[str, list[str]]:
        attrs = CALL_FUNCTION_ATTRS.get(node.op)
        if attrs is None:
            if node.op in self.library and self.registry.is_library_function(node.op):
                return {"": [node.op]}
            return {}
        found = {}
        for attr in attrs:
            if attr not in node.attr:
                continue
            value = node.attr[attr]
            names = [f.name for f in value.list.func] if attr == "branches" else [value.func.name]
            found[attr] = names
        return found

    def _cannot_instantiate(self, fname: str, parent: Body) -> str | None:
        fdef = self.library.get(fname)
        if fdef is None:
            return f"function {fname} is not in the graph's library"
        if parent.depth + 1 > MAX_CALL_DEPTH or len(self.bodies) >= MAX_INSTANCES:
            return "too many nested or repeated function calls"
        if self._on_call_path(parent, fname):
            return f"function {fname} calls itself"
        if any(a.type_attr or a.number_attr or a.type_list_attr
               for a in list(fdef.signature.input_arg) + list(fdef.signature.output_arg)):
            return f"function {fname} has a polymorphic signature"
        return None

    def _instantiate(self, fname: str, call: int, parent: Body) -> int:
        from tensorflow.core.framework import node_def_pb2

        fdef = self.library[fname]
        copy = type(fdef)()
        copy.CopyFrom(fdef)
        body = Body(function=fname, fdef=copy, call=call, depth=parent.depth + 1)
        node_def = node_def_pb2.NodeDef
        virtual_args = []
        for k, arg in enumerate(copy.signature.input_arg):
            node = node_def(name=arg.name, op="_Arg")
            node.attr["T"].type = arg.type
            node.attr["index"].i = k
            virtual_args.append(node)
        virtual_rets = []
        for k, arg in enumerate(copy.signature.output_arg):
            node = node_def(name=f"_retval/{arg.name}", op="_Retval", input=[copy.ret[arg.name]])
            node.attr["T"].type = arg.type
            node.attr["index"].i = k
            virtual_rets.append(node)
        first = len(self.nodes)
        body_id = self._add_body(body, virtual_args + list(copy.node_def) + virtual_rets)
        body.args = list(range(first, first + len(virtual_args)))
        body.rets = list(range(len(self.nodes) - len(virtual_rets), len(self.nodes)))
        self.virtual.update(body.args + body.rets)
        return body_id

    def _on_call_path(self, body: Body, fname: str) -> bool:
        while body is not None:
            if body.function == fname:
                return True
            body = self.bodies[self.body_of[body.call]] if body.call is not None else None
        return False

    # -- construction: ports, inputs, vertices, edges ----------------------------

    def _expand_ports(self) -> None:
        self.in_attrs: list[list[TypeAttr] | None] = []
        self.out_attrs: list[list[TypeAttr] | None] = []
        self.out_args: list[dict[str, int] | None] = []
        plans: dict[str, tuple] = {}
        in_attrs, out_attrs, out_args = self.in_attrs, self.out_attrs, self.out_args
        for node, op_def in zip(self.nodes, self.op_defs):
            if op_def is None:
                in_attrs.append(None)
                out_attrs.append(None)
                out_args.append(None)
                continue
            op = node.op
            plan = plans.get(op)
            if plan is None:
                if self.registry.is_library_function(op):
                    plan = (_ArgPlan(op_def, op_def.input_arg), _ArgPlan(op_def, op_def.output_arg))
                else:
                    plan = _registry_plan(op)
                # Ports that no attr value changes are the same list for every node of the op.
                fixed = plan[0].fixed is not None and plan[1].fixed is not None
                plan += ((plan[0].fixed, plan[1].fixed, plan[1].fixed_starts,
                          sorted(set(plan[0].required) | set(plan[1].required))) if fixed else None,)
                plans[op] = plan
            fixed = plan[2]
            if fixed is not None:
                if fixed[3]:
                    attr = node.attr
                    for name in fixed[3]:
                        if name not in attr:
                            plan[0].expand(node)
                            plan[1].expand(node)  # one of them names the missing attr
                in_attrs.append(fixed[0])
                out_attrs.append(fixed[1])
                out_args.append(fixed[2])
                continue
            in_attrs.append(plan[0].expand(node))
            outs, starts = plan[1].expand_with_starts(node)
            out_attrs.append(outs)
            out_args.append(starts)

    def _read_inputs(self) -> None:
        self.inputs: list[list[tuple[int, int]]] = []
        self.consumers: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self.control_consumers = [False] * len(self.nodes)
        first = 0
        for body in self.bodies:  # each body's nodes are contiguous, in body order
            last = first + len(body.index)
            self._read_body_inputs(body, first, last)
            first = last

    def _read_body_inputs(self, body: Body, first: int, last: int) -> None:
        consumers, inputs, nodes, out_attrs, in_attrs = (
            self.consumers, self.inputs, self.nodes, self.out_attrs, self.in_attrs)
        control_consumers = self.control_consumers
        index = body.index
        find = index.get
        find_consumers = consumers.get
        is_main = body.is_main
        for dst in index.values():  # first .. last - 1, the int objects the index holds
            node = nodes[dst]
            data = []
            seen_control = False
            for ref in node.input[:]:  # one list: iterating the field itself costs more per string
                if ref[:1] == "^":
                    src = find(ref[1:])
                    if src is None:
                        self._missing_input(body, node, ref)
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
                        self._missing_input(body, node, ref)
                else:
                    src, port = self._function_source(body, ref, node)
                if seen_control:
                    raise GraphError(f"{self._where(body, node)}: data input {ref!r} follows a control input")
                outs = out_attrs[src]
                if outs is not None and port >= len(outs):
                    raise GraphError(
                        f"{self._where(body, node)}: input {ref!r} asks for output {port} "
                        f"of {nodes[src].op} node {nodes[src].name}, which has {len(outs)}"
                    )
                key = (src, port)
                entry = find_consumers(key)
                if entry is None:
                    consumers[key] = [(dst, len(data))]
                else:
                    entry.append((dst, len(data)))
                data.append(key)
            expected = in_attrs[dst]
            if expected is not None and len(expected) != len(data):
                raise GraphError(f"{self._where(body, node)}: expected {len(expected)} data inputs, got {len(data)}")
            inputs.append(data)

    def _check_acyclic(self) -> None:
        """Refuses a data cycle that is not a v1 loop (whose only back edges end in a Merge).

        When some edge points backwards in node order, Kahn's algorithm finds
        whether a cycle exists in linear time; only then does networkx name one.
        """
        back_edge_sources = ("NextIteration", "RefNextIteration")
        back = {i for i, node in enumerate(self.nodes) if node.op in back_edge_sources}
        # Most GraphDefs list every node after its inputs: then no edge can close a cycle.
        if all(src < dst or src in back for dst, data in enumerate(self.inputs) for src, _ in data):
            return
        indegree = [0] * len(self.nodes)
        succ: list[list[int]] = [[] for _ in self.nodes]
        for dst, data in enumerate(self.inputs):
            for src, _ in data:
                if src in back:
                    continue
                succ[src].append(dst)
                indegree[dst] += 1
        ready = [i for i, d in enumerate(indegree) if d == 0]
        done = 0
        while ready:
            i = ready.pop()
            done += 1
            for j in succ[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    ready.append(j)
        if done == len(self.nodes):
            return
        import networkx as nx

        cyclic = nx.DiGraph((i, j) for i in range(len(self.nodes)) if indegree[i] > 0
                            for j in succ[i] if indegree[j] > 0)
        cycle = [u for u, _ in nx.find_cycle(cyclic)]
        body = self.bodies[self.body_of[cycle[0]]]
        where = f" in function {body.function}" if body.function else ""
        path = " -> ".join(f"{self.nodes[u].name} ({self.nodes[u].op})" for u in cycle + cycle[:1])
        raise GraphError(f"data cycle that is not a while loop{where}: {path}")

    def _function_source(self, body: Body, ref: str, node) -> tuple[int, int]:
        """Resolves a FunctionDef input: ``arg`` or ``node:output_arg:k``."""
        parts = ref.split(":")
        src = body.index.get(parts[0])
        if src is None:
            self._missing_input(body, node, ref)
        if len(parts) == 1:
            return src, 0
        starts = self.out_args[src]
        if len(parts) != 3 or not parts[2].isdigit() or (starts is not None and parts[1] not in starts):
            raise GraphError(f"{self._where(body, node)}: malformed function input {ref!r}")
        return src, (starts[parts[1]] if starts is not None else 0) + int(parts[2])

    def _missing_input(self, body: Body, node, ref: str):
        raise GraphError(f"{self._where(body, node)}: input {ref!r} names a node that does not exist")

    @staticmethod
    def _where(body: Body, node) -> str:
        where = f" in function {body.function}" if body.function else ""
        return f"node {node.name} (op {node.op}){where}"

    def _build_vertices(self) -> None:
        """Numbers the vertices node by node, and records the vertex of each input and output port.

        Nodes of one op whose ports expand the same way share a layout
        (their attrs, and each port's position among them), computed once.
        """
        self.vertices: list[Vertex] = []
        self.node_vertices: list[list[int]] = []
        self.in_vids: list[list[int] | None] = []
        self.out_vids: list[list[int] | None] = []
        layouts: dict[str, tuple] = {}
        vertices = self.vertices
        node_vertices, in_vids, out_vids = self.node_vertices, self.in_vids, self.out_vids
        in_attrs, out_attrs = self.in_attrs, self.out_attrs
        new_vertex = tuple.__new__
        # The three lists of a node share its vertex ids, and share one list when
        # their ports are its attrs in order (most ops: one attr, one output).
        # Node indices as the int objects the bodies' indexes hold, not one more per vertex.
        indices = itertools.chain.from_iterable(body.index.values() for body in self.bodies)
        for i, node, op_def in zip(indices, self.nodes, self.op_defs):
            if op_def is None:
                node_vertices.append([])
                in_vids.append(None)
                out_vids.append(None)
                continue
            ins, outs = in_attrs[i], out_attrs[i]
            layout = layouts.get(node.op)
            if layout is None or not (layout[0] is ins or layout[0] == ins) or not (layout[1] is outs or layout[1] == outs):
                layout = self._layout(i, ins, outs)
                whole = list(range(len(layout[2])))
                layout += (layout[3] == whole, layout[4] == whole)
                if not self.op_facts(i).lists:
                    layouts[node.op] = layout
            attrs, in_pos, out_pos, same_in, same_out = layout[2:]
            base = len(vertices)
            for attr in attrs:
                vertices.append(new_vertex(Vertex, (i, attr)))  # Vertex(i, attr), without its Python __new__
            vids = list(range(base, base + len(attrs)))
            node_vertices.append(vids)
            in_vids.append(vids if same_in else [vids[k] for k in in_pos])
            out_vids.append(vids if same_out else [vids[k] for k in out_pos])

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

    def _build_edges(self) -> None:
        n = len(self.vertices)
        self.fanin: list[list[int]] = [[] for _ in range(n)]
        self.fanout: list[list[int]] = [[] for _ in range(n)]
        fanin, fanout, out_vids = self.fanin, self.fanout, self.out_vids
        for dst, data in enumerate(self.inputs):
            in_vids = self.in_vids[dst]
            if in_vids is None:
                continue
            for v, (src, port) in zip(in_vids, data):
                src_vids = out_vids[src]
                if src_vids is not None:
                    u = src_vids[port]
                    fanout[u].append(v)
                    fanin[v].append(u)

    def add_edge(self, u: int, v: int) -> None:
        """Joins vertex ``u`` to ``v`` (paint may flow both ways; ``u`` is the producer)."""
        self.fanout[u].append(v)
        self.fanin[v].append(u)

    def _link_calls(self) -> None:
        """Joins each call's ports to its instances' args and results, and records boundary groups."""
        self.groups: list[list[int]] = []
        self.loop_groups: list[list[int]] = []
        for body in self.bodies:
            for call, by_attr in body.children.items():
                node = self.nodes[call]
                if node.op in WHILE_OPS:
                    self._link_while(call, by_attr["cond"][0], by_attr["body"][0])
                    continue
                offset = 1 if node.op in ("If", "StatelessIf", "Case", "StatelessCase") else 0
                instances = [b for attr in sorted(by_attr) for b in by_attr[attr]]
                n_in = len(self.in_attrs[call] or []) - offset
                n_out = len(self.out_attrs[call] or [])
                for k in range(n_in):
                    port = self.input_vertex(call, k + offset)
                    args = [self.output_vertex(self.bodies[b].args[k], 0) for b in instances]
                    for arg in args:
                        self.add_edge(port, arg)
                    self.groups.append([port, *args])
                for k in range(n_out):
                    port = self.output_vertex(call, k)
                    rets = [self.input_vertex(self.bodies[b].rets[k], 0) for b in instances]
                    for ret in rets:
                        self.add_edge(ret, port)
                    self.groups.append([port, *rets])

    def _link_while(self, call: int, cond: int, body_id: int) -> None:
        loop, test = self.bodies[body_id], self.bodies[cond]
        for k in range(len(self.in_attrs[call])):
            port = self.input_vertex(call, k)
            arg = self.output_vertex(loop.args[k], 0)
            ret = self.input_vertex(loop.rets[k], 0)
            test_arg = self.output_vertex(test.args[k], 0)
            for u, v in ((port, arg), (port, test_arg), (ret, arg), (ret, test_arg), (ret, port)):
                self.add_edge(u, v)
            group = [port, arg, ret, test_arg]
            self.groups.append(group)
            self.loop_groups.append(group)

    # -- queries --------------------------------------------------------------

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
        src, port = self.inputs[node][ordinal]
        return self.output_vertex(src, port)

    def vertex(self, node_name: str, attr: TypeAttr | str, body: int = 0) -> int | None:
        """The vertex id of ``node_name``'s type ``attr`` in ``body`` (the main graph by default)."""
        if isinstance(attr, str):
            attr = TypeAttr(attr)
        i = self.bodies[body].index.get(node_name)
        return None if i is None else self.vertex_of(i, attr)

    def vertex_of(self, node: int, attr: TypeAttr | str) -> int | None:
        if isinstance(attr, str):
            attr = TypeAttr(attr)
        return next((v for v in self.node_vertices[node] if self.vertices[v].attr == attr), None)

    def op(self, vid: int) -> str:
        return self.nodes[self.vertices[vid].node].op

    def node_of(self, vid: int):
        return self.nodes[self.vertices[vid].node]

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
        node_idx, attr = self.vertices[vid]
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
        result = []
        append = result.append
        nodes = self.nodes
        for node_idx, attr in self.vertices:
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
        return self.op_facts(node_idx).allowed.get(attr.name)

    def op_facts(self, node: int) -> _OpFacts:
        """Type attrs and admitted dtypes of the node's op (cached per op)."""
        op = self.nodes[node].op
        facts = self._facts.get(op)
        if facts is None:
            is_function = self.registry.is_library_function(op)
            facts = _facts_of(self.op_defs[node]) if is_function else _registry_facts(op)
            self._facts[op] = facts
        return facts

    def describe(self, vid: int) -> str:
        node_idx, attr = self.vertices[vid]
        node = self.nodes[node_idx]
        return f"{node.op} node {node.name} type {attr}"

    def main_nodes_after(self, start_ops: tuple[str, ...], stop_ops: tuple[str, ...]) -> set[int]:
        """Main-graph nodes reached along data edges from a node of ``start_ops``, not passing ``stop_ops``.

        With Enter/Exit this is every node inside a v1 while frame; with
        Switch/Merge, every node on a cond branch.
        """
        found = {i for i in self.bodies[0].index.values() if self.nodes[i].op in start_ops}
        stack = list(found)
        while stack:
            i = stack.pop()
            for port in range(len(self.out_attrs[i] or [1])):
                for dst, _ in self.consumers.get((i, port), []):
                    if dst not in found and self.nodes[dst].op not in stop_ops:
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


def unique_name(name: str, taken: set[str]) -> str:
    """``name``, or ``name_1``, ``name_2``, ... if taken; the result is added to ``taken``."""
    candidate, k = name, 1
    while candidate in taken:
        candidate = f"{name}_{k}"
        k += 1
    taken.add(candidate)
    return candidate


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
                self.entries.append((arg.name, arg.type_list_attr, None, True))
                continue
            attr = TypeAttr(arg.type_attr) if arg.type_attr else TypeAttr("", -1, arg.type)
            self.entries.append((arg.name, arg.number_attr, attr, False))
        defaults = {a.name for a in op_def.attr if a.HasField("default_value")}
        self.required = sorted({attr.name for _, _, attr, _ in self.entries
                                if attr is not None and attr.name and attr.name not in defaults})
        self.fixed = None
        if all(count == "" and not is_list for _, count, _, is_list in self.entries):
            self.fixed = [attr for _, _, attr, _ in self.entries]
            self.fixed_starts = {name: k for k, (name, _, _, _) in enumerate(self.entries)}

    def expand(self, node) -> list[TypeAttr]:
        """The TypeAttr of each port of ``node`` (shared lists: do not mutate)."""
        return self.expand_with_starts(node)[0]

    def expand_with_starts(self, node) -> tuple[list[TypeAttr], dict[str, int]]:
        """The TypeAttr of each port, and the first port of each named arg."""
        for name in self.required:
            if name not in node.attr:
                raise GraphError(f"node {node.name} (op {node.op}): type attr {name} is missing")
        if self.fixed is not None:
            return self.fixed, self.fixed_starts
        result, starts = [], {}
        for arg_name, count_attr, attr, is_list in self.entries:
            starts[arg_name] = len(result)
            if is_list:
                n = _attr_value(node, self.op_def, count_attr).list.type
                result.extend(TypeAttr(count_attr, k) for k in range(len(n)))
            elif count_attr:
                result.extend([attr] * _attr_value(node, self.op_def, count_attr).i)
            else:
                result.append(attr)
        return result, starts


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


@functools.lru_cache(maxsize=None)
def _registry_facts(op: str) -> _OpFacts:
    """Facts of a registered op; TensorFlow's registry does not change within a process."""
    return _facts_of(OpRegistry.registry_op_def(op))


@functools.lru_cache(maxsize=None)
def _registry_plan(op: str) -> tuple[_ArgPlan, _ArgPlan]:
    """Port plans of a registered op; TensorFlow's registry does not change within a process."""
    op_def = OpRegistry.registry_op_def(op)
    return _ArgPlan(op_def, op_def.input_arg), _ArgPlan(op_def, op_def.output_arg)


def _attr_value(node, op_def, name: str):
    if name in node.attr:
        return node.attr[name]
    for attr_def in op_def.attr:
        if attr_def.name == name and attr_def.HasField("default_value"):
            return attr_def.default_value
    raise GraphError(f"node {node.name} (op {node.op}): attr {name} is missing")
