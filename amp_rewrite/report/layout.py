"""A layered drawing of a directed graph: a column and a row for every node.

:func:`layered_layout` places the nodes of the HTML report
(:mod:`amp_rewrite.report.html`) before the page is written, so the browser
only draws. The steps, one function each:

1. ``_forward_adjacency``: drop the back edges a depth-first search finds,
   so loops become a DAG;
2. ``_longest_path_layers``: layer by longest path from the sources, in
   ``_topological_order`` (an edge always goes right);
3. ``_move_next_to_consumers``: move each node with consumers to the layer
   just before its first consumer, so constants and side chains sit where
   they are used;
4. ``_order_layers``: order each layer by the mean position of its
   neighbours (barycentre sweeps, alternately forward and backward);
5. ``_split_tall_layers``: spread a layer taller than the column limit over
   consecutive columns.

Everything is plain lists of ints and the result depends only on the
arguments: the same graph gives the same page, byte for byte.
"""

from __future__ import annotations

from collections import defaultdict

_SWEEPS = 4


def layered_layout(count: int, edges: list[tuple[int, int]], *,
                   max_column: int | None = None) -> tuple[list[int], list[int]]:
    """Assigns each node a column and a row within it.

    Nodes are layered by longest path from the inputs, then every node with
    consumers moves right next to its first consumer (so constants and side
    chains sit where they are used). Barycentre sweeps order each layer, and a
    layer taller than ``max_column`` is split over consecutive columns.

    Guarantees: an edge that is not a back edge of a cycle goes to a later
    layer (a column further right); rows in a column are 0..k-1 with k at
    most ``max_column``; the result depends only on the arguments.

    Args:
        count: number of nodes.
        edges: (source, destination) pairs.
        max_column: most nodes per column; by default about sqrt(count) / 2, at least 16.

    Returns:
        (column, row) lists indexed by node.
    """
    if max_column is None:
        max_column = max(16, round(count ** 0.5 / 2))
    succ, pred = _forward_adjacency(count, edges)
    order = _topological_order(count, succ, pred)
    layer = _longest_path_layers(order, succ)
    _move_next_to_consumers(order, layer, succ)
    rank = _order_layers(layer, succ, pred)
    return _split_tall_layers(layer, rank, max_column)


def _forward_adjacency(count: int, edges) -> tuple[list[list[int]], list[list[int]]]:
    """Adjacency lists without the back edges a depth-first search finds (loops)."""
    out: list[list[int]] = [[] for _ in range(count)]
    for src, dst in edges:
        if src != dst:
            out[src].append(dst)
    state = [0] * count  # 0 new, 1 on the stack, 2 done
    back: set[tuple[int, int]] = set()
    for root in range(count):
        if state[root]:
            continue
        state[root] = 1
        stack = [(root, 0)]
        while stack:
            v, k = stack[-1]
            if k < len(out[v]):
                stack[-1] = (v, k + 1)
                w = out[v][k]
                if state[w] == 1:
                    back.add((v, w))
                elif state[w] == 0:
                    state[w] = 1
                    stack.append((w, 0))
            else:
                state[v] = 2
                stack.pop()
    succ: list[list[int]] = [[] for _ in range(count)]
    pred: list[list[int]] = [[] for _ in range(count)]
    for src in range(count):
        for dst in out[src]:
            if (src, dst) not in back:
                succ[src].append(dst)
                pred[dst].append(src)
    return succ, pred


def _topological_order(count: int, succ, pred) -> list[int]:
    indegree = [len(p) for p in pred]
    order = [v for v in range(count) if indegree[v] == 0]
    head = 0
    while head < len(order):
        v = order[head]
        head += 1
        for w in succ[v]:
            indegree[w] -= 1
            if indegree[w] == 0:
                order.append(w)
    return order


def _longest_path_layers(order: list[int], succ) -> list[int]:
    layer = [0] * len(order)
    for v in order:
        for w in succ[v]:
            layer[w] = max(layer[w], layer[v] + 1)
    return layer


def _move_next_to_consumers(order: list[int], layer: list[int], succ) -> None:
    """Moves each node with consumers right, to the layer just before its first consumer."""
    for v in reversed(order):
        if succ[v]:
            layer[v] = max(layer[v], min(layer[w] for w in succ[v]) - 1)


def _order_layers(layer: list[int], succ, pred) -> list[int]:
    """Orders each layer by the mean position of its neighbours (barycentre sweeps)."""
    by_layer: dict[int, list[int]] = defaultdict(list)
    for v, lay in enumerate(layer):
        by_layer[lay].append(v)
    layers = [by_layer[k] for k in sorted(by_layer)]
    pos = [0.0] * len(layer)
    for members in layers:
        _place(members, pos)
    for sweep in range(_SWEEPS):
        forward = sweep % 2 == 0
        sequence = layers if forward else layers[::-1]
        neighbours = pred if forward else succ
        for members in sequence:
            keys = {v: (sum(pos[u] for u in neighbours[v]) / len(neighbours[v])
                        if neighbours[v] else pos[v]) for v in members}
            members.sort(key=lambda v: (keys[v], v))
            _place(members, pos)
    rank = [0] * len(layer)
    for members in layers:
        for k, v in enumerate(members):
            rank[v] = k
    return rank


def _place(members: list[int], pos: list[float]) -> None:
    centre = (len(members) - 1) / 2.0
    for k, v in enumerate(members):
        pos[v] = k - centre


def _split_tall_layers(layer: list[int], rank: list[int], max_column: int) -> tuple[list[int], list[int]]:
    """Turns (layer, rank) into (column, row), spreading a tall layer over several columns."""
    height: dict[int, int] = defaultdict(int)
    for lay, r in zip(layer, rank):
        height[lay] = max(height[lay], r + 1)
    first_column, column = {}, 0
    for lay in sorted(height):
        first_column[lay] = column
        column += -(-height[lay] // max_column)
    columns = [first_column[lay] + r // max_column for lay, r in zip(layer, rank)]
    rows = [r % max_column for r in rank]
    return columns, rows
