"""A self-contained HTML page showing a rewritten graph coloured by precision.

:func:`render_html` turns a :class:`~amp_rewrite.pipeline.RewriteResult` into
one HTML document with inline CSS and JavaScript and no external resources,
so it opens from disk, offline. The page, its CSS and its script are package
data in ``template/``; this module fills in the title and the graph's
data. The page shows:

- a drawing of the graph on a ``<canvas>`` (pan by dragging, zoom with the
  wheel), each node coloured by what the rewrite did to it; the nodes of
  every function body the report covers are drawn as ``function::node``;
- a search box filtering a virtualized list of nodes by name or op, and
  highlighting the matches in the drawing; the list shows compute ops before
  Consts and Casts, and shortens a long name in the middle;
- for the selected node: op, category, list colour, rule, and the cause, its
  inputs and consumers as links to those nodes.

The layout is computed here, not in the browser (:func:`layered_layout`):
nodes are layered by longest path from the inputs (loop back edges are
ignored), each node moves next to its first consumer, barycentre sweeps
order each layer, and tall layers are split over several columns. The
browser only wraps the columns into bands that fit the window, and draws
what is in view, so a 12,000-node graph opens in about a tenth of a second.
The URL hash ``#search=TEXT`` fills the search box and ``#node=NAME``
selects a node.

The output is deterministic: the same result gives the same page, byte for
byte (the rewrite's wall time is left out).
"""

from __future__ import annotations

import functools
import html
import importlib.resources
import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF, DTYPE_NAMES, function_input_source, node_name

if TYPE_CHECKING:
    from amp_rewrite.pipeline import RewriteResult

logger = logging.getLogger(__name__)

# Display categories, in legend order. "half" is any node computing in a half type.
CATEGORIES = ("half", "cast", "float32", "deny", "preserved", "other")
CATEGORY_HELP = {
    "half": "computes in half precision",
    "cast": "Cast inserted by the rewrite",
    "float32": "stays float32",
    "deny": "kept float32 by the deny list",
    "preserved": "fetched, preserved or on another device: left as it was",
    "other": "no floating-point type to change",
}
_HALF_TYPES = (DT_HALF, DT_BFLOAT16)
_SWEEPS = 4


@dataclass(frozen=True)
class _Node:
    name: str
    op: str
    category: str
    colour: str
    rule: str
    cause: str | None
    dtype: str
    converted: bool


def render_html(result: RewriteResult, *, title: str, doctor: dict | None = None) -> str:
    """Renders ``result`` as one self-contained HTML page.

    Args:
        result: a :class:`~amp_rewrite.pipeline.RewriteResult`.
        title: the page title (escaped; any text is safe).
        doctor: the doctor's findings (:meth:`amp_rewrite.report.doctor.Diagnosis.as_dict`), shown in a
            "why not faster" panel whose node names link to the nodes.

    Returns:
        The HTML document. It references no external resource and is the same
        string every time for the same result.
    """
    report = result.report()
    flat = flat_nodes(result.graph_def, report)
    nodes = _describe_nodes(flat, report)
    edges, control = _edges(flat)
    column, row = layered_layout(len(nodes), edges + _control_edges_into_sinks(edges, control, len(nodes)))
    data = _page_data(nodes, edges, control, column, row, report)
    if doctor is not None:
        data["doctor"] = doctor
    logger.debug("rendered %d nodes and %d edges", len(nodes), len(edges) + len(control))
    return _page_template().replace("{{TITLE}}", html.escape(title)).replace("{{DATA}}", _script_json(data))


# -- what each node is -----------------------------------------------------------


@dataclass(frozen=True)
class FlatNode:
    """A node of the main graph, or of a function body under ``function::node``."""

    name: str
    node_def: Any
    inputs: tuple[tuple[str, bool], ...]  # (source's name, is a control input)


def flat_nodes(graph_def, report: dict) -> list[FlatNode]:
    """The main graph's nodes, then the nodes of every function the report covers, with their inputs.

    A function body refers to its own nodes as ``node:output:k`` and to its
    arguments by name; arguments are not nodes and draw no edge.
    """
    flat = [FlatNode(node.name, node, tuple((node_name(ref), ref.startswith("^")) for ref in node.input))
            for node in graph_def.node]
    covered = dict.fromkeys(name.split("::")[0] for name in (*report["nodes"], *report["casts"]) if "::" in name)
    library = {f.signature.name: f for f in graph_def.library.function}
    for function in covered:
        fdef = library.get(function)
        if fdef is None:
            continue
        prefix = function + "::"
        names = {node.name for node in fdef.node_def}
        for node in fdef.node_def:
            refs = []
            for ref in node.input:
                source = function_input_source(ref)
                if source in names:
                    refs.append((prefix + source, ref.startswith("^")))
            flat.append(FlatNode(prefix + node.name, node, tuple(refs)))
    return flat


def _describe_nodes(flat: list[FlatNode], report: dict) -> list[_Node]:
    """One :class:`_Node` per node drawn, in the order of :func:`flat_nodes`."""
    outcomes = report["nodes"]
    converted = set(report["converted"])
    casts = set(report["casts"])
    described = []
    for item in flat:
        node = item.node_def
        types = _float_types(node)
        if item.name in casts:
            data_inputs = [source for source, control in item.inputs if not control]
            entry: dict[str, Any] = {"colour": "cast", "rule": "inserted by the rewrite",
                     "cause": data_inputs[0] if data_inputs else None}
        else:
            entry = outcomes.get(item.name, {"colour": "none", "rule": ""})
        described.append(_Node(
            name=item.name, op=node.op,
            category=_category(item.name in casts, entry["colour"], item.name in converted, types),
            colour=entry["colour"], rule=entry.get("rule", ""), cause=entry.get("cause"),
            dtype=_main_dtype(node), converted=item.name in converted,
        ))
    return described


def _float_types(node) -> set[int]:
    """The floating-point types among the node's type attrs (lists included)."""
    found = set()
    for value in node.attr.values():
        for t in (value.type, *value.list.type):
            if t in (DT_FLOAT, *_HALF_TYPES):
                found.add(t)
    return found


def _category(is_cast: bool, colour: str, converted: bool, types: set[int]) -> str:
    if is_cast:
        return "cast"
    if colour == "preserved":
        return "preserved"
    if converted or types & set(_HALF_TYPES):
        return "half"
    if colour == "deny":
        return "deny"
    if DT_FLOAT in types:
        return "float32"
    return "other"


def _main_dtype(node) -> str:
    for attr in ("T", "dtype", "DstT"):
        if attr in node.attr and node.attr[attr].type:
            t = node.attr[attr].type
            return DTYPE_NAMES.get(t, _dtype_name(t))
    return ""


def _dtype_name(enum: int) -> str:
    try:
        import tensorflow as tf

        return tf.dtypes.as_dtype(enum).name
    except (ImportError, TypeError):
        return f"dtype{enum}"


def _edges(flat: list[FlatNode]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(data edges, control edges) as (source index, destination index), in input order."""
    index = {item.name: i for i, item in enumerate(flat)}
    data: list[tuple[int, int]] = []
    control: list[tuple[int, int]] = []
    for dst, item in enumerate(flat):
        for name, is_control in item.inputs:
            src = index.get(name)
            if src is not None:
                (control if is_control else data).append((src, dst))
    return data, control


def _control_edges_into_sinks(edges, control, count: int) -> list[tuple[int, int]]:
    """The control edges that go to nodes no data edge leaves (NoOps such as an init or train op).

    Those place a NoOp after what it waits for. Other control edges are left
    out of the layout: a Const waiting for a hundred update ops should still
    sit next to the op that reads it.
    """
    has_data_out = [False] * count
    for src, _ in edges:
        has_data_out[src] = True
    return [(src, dst) for src, dst in control if not has_data_out[dst]]


# -- layout ------------------------------------------------------------------------


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


# -- the page -------------------------------------------------------------------------


def _page_data(nodes: list[_Node], edges, control, column, row, report: dict) -> dict:
    ops = sorted({n.op for n in nodes})
    rules = sorted({n.rule for n in nodes})
    colours = sorted({n.colour for n in nodes})
    dtypes = sorted({n.dtype for n in nodes})
    index = {n.name: i for i, n in enumerate(nodes)}
    share = report.get("fp16_flop_share")
    return {
        "summary": {
            "target": report["target"], "level": report.get("level", ""),
            "device_type": report.get("device_type", ""), "nodes_total": report["nodes_total"],
            "converted": len(report["converted"]), "casts": len(report["casts"]),
            "half_flop_share": None if share is None else round(share, 4),
        },
        "categories": list(CATEGORIES),
        "category_help": [CATEGORY_HELP[c] for c in CATEGORIES],
        "ops": ops, "rules": rules, "colours": colours, "dtypes": dtypes,
        "name": [n.name for n in nodes],
        "op": _indices([n.op for n in nodes], ops),
        "cat": [CATEGORIES.index(n.category) for n in nodes],
        "colour": _indices([n.colour for n in nodes], colours),
        "rule": _indices([n.rule for n in nodes], rules),
        "dtype": _indices([n.dtype for n in nodes], dtypes),
        "cause": [index.get(n.cause, -1) if n.cause else -1 for n in nodes],
        "converted": [int(n.converted) for n in nodes],
        "list_order": list_order(nodes),
        "col": column, "row": row,
        "edges": [i for edge in edges for i in edge],
        **_control_sets(control, len(nodes)),
    }


def list_order(nodes: list[_Node]) -> list[int]:
    """The side list's order: compute ops first, then Consts, then Casts, each in graph order.

    A frozen model holds hundreds of weight Consts and a rewrite adds Casts;
    listed first, they would bury the ops a reader looks for.
    """
    def group(node: _Node) -> int:
        return 2 if node.op == "Cast" else 1 if node.op == "Const" else 0

    return sorted(range(len(nodes)), key=lambda i: (group(nodes[i]), i))


def _control_sets(control, count: int) -> dict:
    """Control inputs as shared sets: training graphs give hundreds of nodes the same hundred."""
    inputs: list[list[int]] = [[] for _ in range(count)]
    for src, dst in control:
        inputs[dst].append(src)
    sets: dict[tuple[int, ...], int] = {}
    of = []
    for sources in inputs:
        if not sources:
            of.append(-1)
            continue
        key = tuple(sources)
        of.append(sets.setdefault(key, len(sets)))
    return {"control_sets": [list(k) for k in sets], "control_of": of}


def _indices(values: list[str], table: list[str]) -> list[int]:
    position = {v: i for i, v in enumerate(table)}
    return [position[v] for v in values]


def _script_json(data: dict) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' characters."""
    text = json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@functools.cache
def _page_template() -> str:
    """The page with its style and script inlined, still holding ``{{TITLE}}`` and ``{{DATA}}``.

    The page, its CSS and its JavaScript are package data under
    ``template/``, kept as three files so that each reads as its own
    language; they are read once per process.
    """
    folder = importlib.resources.files("amp_rewrite.report") / "template"
    page, style, script = ((folder / name).read_text(encoding="utf-8")
                           for name in ("report.html", "report.css", "report.js"))
    return page.replace("{{STYLE}}", style).replace("{{SCRIPT}}", script)
