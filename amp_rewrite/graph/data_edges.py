"""The data edges under the typed view: which output of which node feeds each data input.

Every node's data input strings are read once, in body order, into flat int
arrays (:class:`DataEdges`, which also sorts them by producer), checked
against the node's ports (a name that is no node, a port the source lacks, a
data input after a control input, a wrong count), and checked for a data
cycle that is not a v1 while loop. :func:`build_fans` then joins the vertices
over those edges: each producer port's vertex to the vertex of every input
it feeds. Control edges carry no data: only whether a node is a control
source is kept.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterator, Sequence
from typing import NoReturn

from amp_rewrite.errors import GraphError
from amp_rewrite.graph.instances import Body, function_source


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


def read_inputs(bodies: list[Body], nodes: list, in_attrs: list, out_attrs: list,
                 out_args: list) -> tuple[DataEdges, list]:
    """Every node's data inputs as (source node, port), and whether each node is a control source.

    Raises:
        GraphError: naming the node, for an input that names no node or no
            output of its source, a data input after a control input, or a
            wrong number of data inputs.
    """
    reader = _InputReader(nodes, in_attrs, out_attrs, out_args)
    for body in bodies:  # each body's nodes are contiguous, in body order, as its index lists them
        reader.read_body(body)
    return DataEdges(reader.in_start, reader.in_src, reader.in_port, reader.in_dst), reader.control_consumers


class _InputReader:
    """Reads the data input strings of one body after another into the flat arrays of :class:`DataEdges`.

    Args:
        nodes: every node of the view, in view order.
        in_attrs: per node, the type attr of each data input port (None for an unknown op).
        out_attrs: per node, the type attr of each output port (None for an unknown op).
        out_args: per node, each named output arg's first port, for a function body's
            ``node:output_arg:k`` inputs (None for an unknown op).
    """

    def __init__(self, nodes: list, in_attrs: list, out_attrs: list, out_args: list):
        self.nodes, self.in_attrs, self.out_attrs, self.out_args = nodes, in_attrs, out_attrs, out_args
        self.in_start, self.in_src, self.in_port, self.in_dst = array("q", [0]), array("i"), array("i"), array("i")
        self.control_consumers = [False] * len(nodes)

    def read_body(self, body: Body) -> None:
        """Appends the data inputs of ``body``'s nodes, and marks the control sources they name."""
        nodes, in_attrs, out_attrs, out_args = self.nodes, self.in_attrs, self.out_attrs, self.out_args
        in_start, in_src, control_consumers = self.in_start, self.in_src, self.control_consumers
        find = body.index.get
        is_main = body.is_main
        add_src, add_port, add_dst = in_src.append, self.in_port.append, self.in_dst.append
        for dst in body.index.values():  # the int objects the body's index holds, in node order
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


def build_fans(vertex_count: int, in_vids: list, out_vids: list, node_vertices: list,
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


def check_acyclic(nodes: list, ops: list[str], edges: DataEdges, bodies: list[Body], body_of: list[int]) -> None:
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


def _missing_input(body: Body, node, ref: str) -> NoReturn:
    raise GraphError(f"{body.where(node)}: input {ref!r} names a node that does not exist")

