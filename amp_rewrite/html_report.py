"""A self-contained HTML page showing a rewritten graph coloured by precision.

:func:`render_html` turns a :class:`~amp_rewrite.pipeline.RewriteResult` into
one HTML document with inline CSS and JavaScript and no external resources,
so it opens from disk, offline. The page shows:

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

import html
import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from amp_rewrite.graph_facts import (DT_BFLOAT16, DT_FLOAT, DT_HALF, DTYPE_NAMES, function_input_source,
                                     node_name)

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


def render_html(result: RewriteResult, *, title: str) -> str:
    """Renders ``result`` as one self-contained HTML page.

    Args:
        result: a :class:`~amp_rewrite.pipeline.RewriteResult`.
        title: the page title (escaped; any text is safe).

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
    logger.debug("rendered %d nodes and %d edges", len(nodes), len(edges) + len(control))
    return _PAGE.replace("{{TITLE}}", html.escape(title)).replace("{{DATA}}", _script_json(data))


# -- what each node is -----------------------------------------------------------


@dataclass(frozen=True)
class FlatNode:
    """A node of the main graph, or of a function body under ``function::node``."""

    name: str
    node_def: object
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
            entry = {"colour": "cast", "rule": "inserted by the rewrite",
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
        from tensorflow.python.framework import dtypes

        return dtypes.as_dtype(enum).name
    except (ImportError, TypeError):
        return f"dtype{enum}"


def _edges(flat: list[FlatNode]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(data edges, control edges) as (source index, destination index), in input order."""
    index = {item.name: i for i, item in enumerate(flat)}
    data, control = [], []
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


_PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{TITLE}}</title>
<style>
:root { --half: #2f9e44; --cast: #f08c00; --float32: #1c7ed6; --deny: #e03131;
        --preserved: #7048e8; --other: #adb5bd; --bg: #f8f9fa; --panel: #ffffff; --line: #dee2e6; }
* { box-sizing: border-box; }
html, body { margin: 0; height: 100%; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
             color: #212529; background: var(--bg); }
#app { display: grid; grid-template-columns: 340px 1fr; grid-template-rows: auto 1fr; height: 100vh; }
header { grid-column: 1 / 3; display: flex; align-items: center; gap: 18px; padding: 8px 14px;
         background: #212529; color: #f8f9fa; }
header h1 { font-size: 15px; margin: 0; font-weight: 600; white-space: nowrap; overflow: hidden;
            text-overflow: ellipsis; max-width: 420px; }
#stats { display: flex; gap: 16px; flex-wrap: wrap; }
header .stat { white-space: nowrap; color: #ced4da; }
header .stat b { color: #fff; }
#side { display: flex; flex-direction: column; min-height: 0; border-right: 1px solid var(--line);
        background: var(--panel); }
#search { margin: 10px; padding: 7px 9px; border: 1px solid #ced4da; border-radius: 6px; font: inherit; }
#legend { display: grid; grid-template-columns: 1fr 1fr; gap: 2px 8px; padding: 0 10px 8px; }
#legend label { display: flex; align-items: center; gap: 6px; cursor: pointer; white-space: nowrap; }
.sw { display: inline-block; width: 11px; height: 11px; border-radius: 3px; flex: none; }
#count { padding: 0 10px 6px; color: #495057; }
#list { flex: 1; overflow-y: auto; position: relative; border-top: 1px solid var(--line); min-height: 80px; }
#spacer { position: relative; }
#spacer::before { content: attr(data-empty); position: absolute; left: 10px; top: 4px; color: #868e96; }
.row { position: absolute; left: 0; right: 0; height: 22px; display: flex; align-items: center; gap: 6px;
       padding: 0 10px; cursor: pointer; white-space: nowrap; }
.row:hover { background: #f1f3f5; }
.row.sel { background: #e7f5ff; }
.row .nm { overflow: hidden; white-space: nowrap; flex: 1; min-width: 0; }
.row .op { color: #868e96; font-size: 12px; }
#details { border-top: 1px solid var(--line); padding: 10px; max-height: 42%; overflow-y: auto; }
#details h2 { font-size: 13px; margin: 0 0 6px; word-break: break-all; }
#details dl { display: grid; grid-template-columns: auto 1fr; gap: 2px 10px; margin: 0; }
#details dt { color: #868e96; }
#details dd { margin: 0; word-break: break-word; }
#details a { color: #1971c2; text-decoration: none; cursor: pointer; word-break: break-all; }
#details a:hover { text-decoration: underline; }
#main { position: relative; min-width: 0; min-height: 0; }
canvas { display: block; width: 100%; height: 100%; cursor: grab; background: #fff; }
#hud { position: absolute; left: 10px; bottom: 8px; color: #495057; background: rgba(255,255,255,.85);
       padding: 3px 8px; border-radius: 4px; pointer-events: none; }
#tools { position: absolute; right: 10px; top: 10px; display: flex; gap: 6px; }
#tools button { font: inherit; padding: 4px 10px; border: 1px solid #ced4da; background: #fff;
                border-radius: 5px; cursor: pointer; }
#tip { position: absolute; pointer-events: none; background: #212529; color: #fff; padding: 3px 7px;
       border-radius: 4px; font-size: 12px; display: none; white-space: nowrap; }
.muted { color: #868e96; }
</style>
</head>
<body>
<div id="app">
  <header><h1>{{TITLE}}</h1><span id="stats"></span></header>
  <aside id="side">
    <input id="search" type="search" placeholder="Search nodes by name or op  ( / )" autocomplete="off">
    <div id="legend"></div>
    <div id="count"></div>
    <div id="list"><div id="spacer"></div></div>
    <div id="details"><span class="muted">Click a node in the list or the drawing.</span></div>
  </aside>
  <main id="main">
    <canvas id="canvas"></canvas>
    <div id="tools"><button id="fit" title="Fit the whole graph (f)">Fit</button></div>
    <div id="tip"></div>
    <div id="hud"></div>
  </main>
</div>
<script type="application/json" id="graph-data">{{DATA}}</script>
<script>
"use strict";
(function () {
const t0 = performance.now();
const D = JSON.parse(document.getElementById("graph-data").textContent);
const n = D.name.length;
const CAT_COLOURS = D.categories.map(c => getComputedStyle(document.documentElement).getPropertyValue("--" + c).trim());
const DX = 66, DY = 20, NODE_W = 44, NODE_H = 13, ROW_H = 22, CROSSING_EDGES_UP_TO = 3000;

// ---- adjacency -------------------------------------------------------------
const inputs = Array.from({length: n}, () => []), outputs = Array.from({length: n}, () => []);
for (let k = 0; k < D.edges.length; k += 2) { outputs[D.edges[k]].push(D.edges[k + 1]); inputs[D.edges[k + 1]].push(D.edges[k]); }
const ctlIn = i => D.control_of[i] < 0 ? [] : D.control_sets[D.control_of[i]];
const byName = new Map(D.name.map((s, i) => [s, i]));

// ---- positions: wrap the column sequence into bands that fit the window -----
const X = new Float64Array(n), Y = new Float64Array(n), band = new Int32Array(n);
let worldW = 1, worldH = 1, bandTop = [0];
function wrapBands() {
  let cols = 0;
  for (let i = 0; i < n; i++) cols = Math.max(cols, D.col[i] + 1);
  const height = new Int32Array(cols);
  for (let i = 0; i < n; i++) height[D.col[i]] = Math.max(height[D.col[i]], D.row[i] + 1);
  const el = document.getElementById("main"), W = (el.clientWidth || 1000) - 24, H = (el.clientHeight || 700) - 78;
  const bandHeight = (b, per) => { let m = 0; for (let c = b * per; c < Math.min(cols, (b + 1) * per); c++) m = Math.max(m, height[c]); return (m + 2) * DY; };
  const fitScale = bands => {
    const per = Math.ceil(cols / bands);
    let h = 0; for (let b = 0; b < bands; b++) h += bandHeight(b, per);
    return Math.min(W / (per * DX), H / h);
  };
  // Wrap into bands when that draws the nodes at least a third larger than one long row.
  let best = 1, bestScale = fitScale(1);
  for (let bands = 2; bands <= cols; bands++) {
    const s = fitScale(bands);
    if (s > bestScale * (best === 1 ? 1.33 : 1)) { best = bands; bestScale = s; } else if (s < bestScale * 0.8) break;
  }
  const per = Math.ceil(cols / best);
  let top = 0;
  const bandMid = [];
  bandTop = [];
  for (let b = 0; b < best; b++) { const h = bandHeight(b, per); bandTop.push(top); bandMid.push(top + h / 2); top += h; }
  bandTop.push(top);
  for (let i = 0; i < n; i++) {
    const c = D.col[i], b = Math.floor(c / per);
    band[i] = b; X[i] = (c - b * per) * DX + DX / 2;
    Y[i] = bandMid[b] + (D.row[i] - (height[c] - 1) / 2) * DY;
  }
  worldW = per * DX; worldH = Math.max(top, DY);
}

// ---- view state ---------------------------------------------------------------
const canvas = document.getElementById("canvas"), ctx = canvas.getContext("2d");
let scale = 1, ox = 0, oy = 0, dpr = window.devicePixelRatio || 1;
let selected = -1, hover = -1, query = "";
const hiddenCat = new Set();
let matches = null;           // Uint8Array of search hits, or null when no search
let shown = [];               // indices listed in the side panel
let pending = false;

function resize() {
  const r = canvas.getBoundingClientRect();
  canvas.width = Math.max(1, Math.round(r.width * dpr)); canvas.height = Math.max(1, Math.round(r.height * dpr));
}
function fit() {             // leave room for the Fit button above and the status line below
  const r = canvas.getBoundingClientRect(), top = 48, bottom = 30, side = 12;
  scale = Math.min((r.width - 2 * side) / worldW, (r.height - top - bottom) / worldH);
  ox = (r.width - worldW * scale) / 2; oy = top + (r.height - top - bottom - worldH * scale) / 2;
  redraw();
}
function centreOn(i) {
  const r = canvas.getBoundingClientRect();
  if (scale < 1.2) scale = 1.6;
  ox = r.width / 2 - X[i] * scale; oy = r.height / 2 - Y[i] * scale;
}
function redraw() { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; draw(); }); } }

// ---- drawing -------------------------------------------------------------------
function visible(i) { return !hiddenCat.has(D.cat[i]); }
function draw() {
  const r = canvas.getBoundingClientRect(), W = r.width, H = r.height;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, W, H);
  const x0 = -ox / scale, y0 = -oy / scale, x1 = (W - ox) / scale, y1 = (H - oy) / scale;
  const inView = i => X[i] >= x0 - DX && X[i] <= x1 + DX && Y[i] >= y0 - DY && Y[i] <= y1 + DY;
  ctx.setTransform(dpr * scale, 0, 0, dpr * scale, dpr * ox, dpr * oy);
  const hw = NODE_W / 2, hh = NODE_H / 2;
  ctx.fillStyle = "#f1f3f5";           // every other band on a light stripe
  for (let b = 1; b < bandTop.length; b += 2) ctx.fillRect(0, bandTop[b], worldW, bandTop[b + 1] - bandTop[b]);
  // edges within a band; edges across bands only for the selected node
  if (NODE_W * scale >= 8) {   // below that, edges would only grey the colours out
    ctx.lineWidth = 1 / scale;
    const alpha = Math.min(0.4, 0.08 * NODE_W * scale / 8) * (matches ? 0.4 : 1);
    ctx.strokeStyle = `rgba(73,80,87,${alpha.toFixed(3)})`;
    ctx.beginPath();
    const crossing = [];
    for (let k = 0; k < D.edges.length; k += 2) {
      const s = D.edges[k], d = D.edges[k + 1];
      if (band[s] !== band[d]) { if (n <= CROSSING_EDGES_UP_TO) crossing.push(s, d); continue; }
      if (!(inView(s) || inView(d))) continue;
      ctx.moveTo(X[s] + hw, Y[s]); ctx.lineTo(X[d] - hw, Y[d]);
    }
    ctx.stroke();
    if (crossing.length) {     // from one band to another: a curve leaving right, arriving from the left
      ctx.strokeStyle = "rgba(73,80,87,0.22)"; ctx.beginPath();
      for (let k = 0; k < crossing.length; k += 2) {
        const s = crossing[k], d = crossing[k + 1], bend = 3 * DX;
        ctx.moveTo(X[s] + hw, Y[s]);
        ctx.bezierCurveTo(X[s] + hw + bend, Y[s], X[d] - hw - bend, Y[d], X[d] - hw, Y[d]);
      }
      ctx.stroke();
    }
  }
  if (selected >= 0) drawEdgesOf(selected, hw);
  // nodes, batched by colour
  const small = NODE_W * scale < 24;     // rounded corners only where they show (and cost)
  for (let c = 0; c < D.categories.length; c++) {
    if (hiddenCat.has(c)) continue;
    for (const dim of [true, false]) {
      if (dim && !matches) continue;
      ctx.globalAlpha = dim ? 0.15 : 1;
      ctx.fillStyle = CAT_COLOURS[c];
      ctx.beginPath();
      for (let i = 0; i < n; i++) {
        if (D.cat[i] !== c || !inView(i)) continue;
        if (matches && (matches[i] === 1) === dim) continue;
        if (small) ctx.rect(X[i] - hw, Y[i] - hh, NODE_W, NODE_H);
        else roundRect(X[i] - hw, Y[i] - hh, NODE_W, NODE_H, 3);
      }
      ctx.fill();
    }
  }
  ctx.globalAlpha = 1;
  if (matches) {            // outline the hits so they stand out at any zoom
    ctx.strokeStyle = "#212529"; ctx.lineWidth = Math.max(1, 1.5 / scale);
    ctx.beginPath();
    for (let i = 0; i < n; i++) if (matches[i] && visible(i) && inView(i)) ctx.rect(X[i] - hw - 2 / scale, Y[i] - hh - 2 / scale, NODE_W + 4 / scale, NODE_H + 4 / scale);
    ctx.stroke();
  }
  if (selected >= 0) {
    ctx.strokeStyle = "#000"; ctx.lineWidth = Math.max(2, 3 / scale);
    ctx.strokeRect(X[selected] - hw - 3 / scale, Y[selected] - hh - 3 / scale, NODE_W + 6 / scale, NODE_H + 6 / scale);
  }
  if (NODE_W * scale >= 30) drawLabels(inView);
  document.getElementById("hud").textContent =
    `zoom ${scale < 0.1 ? scale.toFixed(3) : scale.toFixed(2)} · drag to pan, wheel to zoom, click a node`;
}
function roundRect(x, y, w, h, r) {
  ctx.moveTo(x + r, y); ctx.arcTo(x + w, y, x + w, y + h, r); ctx.arcTo(x + w, y + h, x, y + h, r);
  ctx.arcTo(x, y + h, x, y, r); ctx.arcTo(x, y, x + w, y, r); ctx.closePath();
}
function drawEdgesOf(i, hw) {
  ctx.lineWidth = Math.max(1.5, 2 / scale);
  ctx.strokeStyle = "#1971c2"; ctx.beginPath();
  for (const s of inputs[i]) { ctx.moveTo(X[s] + hw, Y[s]); ctx.lineTo(X[i] - hw, Y[i]); }
  ctx.stroke();
  ctx.strokeStyle = "#e8590c"; ctx.beginPath();
  for (const d of outputs[i]) { ctx.moveTo(X[i] + hw, Y[i]); ctx.lineTo(X[d] - hw, Y[d]); }
  ctx.stroke();
}
function fitted(text, width) {
  if (ctx.measureText(text).width <= width) return text;
  let lo = 0, hi = text.length;
  while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (ctx.measureText(text.slice(0, mid) + "…").width <= width) lo = mid; else hi = mid - 1; }
  return text.slice(0, lo) + "…";
}
function drawLabels(inView) {
  ctx.textBaseline = "middle"; ctx.textAlign = "center";
  const size = Math.min(NODE_H * 0.8, 12 / scale);        // about 12 screen pixels, never taller than a node
  ctx.font = `${size}px system-ui, sans-serif`;
  const detailed = NODE_H * scale >= 22;
  for (let i = 0; i < n; i++) {
    if (!inView(i) || !visible(i)) continue;
    ctx.globalAlpha = matches && !matches[i] ? 0.3 : 1;
    ctx.fillStyle = D.cat[i] === 5 || (matches && !matches[i]) ? "#212529" : "#fff";
    ctx.fillText(fitted(D.ops[D.op[i]], NODE_W - 3), X[i], Y[i] + 0.3);
    if (detailed) {
      const nm = D.name[i], short = nm.slice(nm.lastIndexOf("/") + 1);
      ctx.fillStyle = "#495057";
      ctx.fillText(fitted(short, DX - 4), X[i], Y[i] + NODE_H * 0.5 + size * 0.6);
    }
  }
  ctx.globalAlpha = 1;
}

// ---- picking and interaction ------------------------------------------------------
function nodeAt(px, py) {
  const wx = (px - ox) / scale, wy = (py - oy) / scale;
  let best = -1, bestD = Infinity;
  const reach = Math.max(NODE_W, 6 / scale);
  for (let i = 0; i < n; i++) {
    if (!visible(i)) continue;
    const dx = Math.abs(X[i] - wx), dy = Math.abs(Y[i] - wy);
    if (dx > reach || dy > reach) continue;
    const d = dx * dx + dy * dy * 4;
    if (d < bestD) { bestD = d; best = i; }
  }
  return best;
}
let drag = null;
canvas.addEventListener("mousedown", e => { drag = {x: e.clientX, y: e.clientY, ox, oy, moved: false}; canvas.style.cursor = "grabbing"; });
window.addEventListener("mouseup", e => {
  if (drag && !drag.moved) {
    const r = canvas.getBoundingClientRect(), i = nodeAt(e.clientX - r.left, e.clientY - r.top);
    if (i >= 0) goTo(i, false);
  }
  drag = null; canvas.style.cursor = "grab";
});
window.addEventListener("mousemove", e => {
  const r = canvas.getBoundingClientRect();
  if (drag) {
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    ox = drag.ox + dx; oy = drag.oy + dy; redraw(); return;
  }
  if (e.target !== canvas) return;
  const i = nodeAt(e.clientX - r.left, e.clientY - r.top), tip = document.getElementById("tip");
  if (i !== hover) {
    hover = i;
    if (i < 0) tip.style.display = "none";
    else { tip.textContent = `${D.name[i]}  (${D.ops[D.op[i]]}, ${D.categories[D.cat[i]]})`; tip.style.display = "block"; }
  }
  if (i >= 0) { tip.style.left = Math.min(e.clientX - r.left + 12, r.width - tip.offsetWidth - 4) + "px"; tip.style.top = (e.clientY - r.top + 14) + "px"; }
});
canvas.addEventListener("wheel", e => {
  e.preventDefault();
  const r = canvas.getBoundingClientRect(), px = e.clientX - r.left, py = e.clientY - r.top;
  const f = Math.exp(-e.deltaY * 0.0015), ns = Math.min(40, Math.max(0.002, scale * f));
  ox = px - (px - ox) * ns / scale; oy = py - (py - oy) * ns / scale; scale = ns; redraw();
}, {passive: false});
document.getElementById("fit").addEventListener("click", fit);
window.addEventListener("resize", () => { resize(); redraw(); });
window.addEventListener("keydown", e => {
  if (e.target.tagName === "INPUT") { if (e.key === "Escape") e.target.blur(); return; }
  if (e.key === "/") { e.preventDefault(); search.focus(); }
  else if (e.key === "f") fit();
  else if (e.key === "Escape") { selected = -1; showDetails(); redraw(); }
});

// ---- search and the virtualized list ---------------------------------------------
const search = document.getElementById("search"), list = document.getElementById("list"), spacer = document.getElementById("spacer");
const lowerNames = D.name.map(s => s.toLowerCase()), lowerOps = D.ops.map(s => s.toLowerCase());
function applyQuery(text) {
  query = text.trim().toLowerCase();
  matches = query ? new Uint8Array(n) : null;
  shown = [];
  for (const i of D.list_order) {
    const hit = !query || lowerNames[i].includes(query) || lowerOps[D.op[i]] === query;
    if (matches && hit) matches[i] = 1;
    if (hit && visible(i)) shown.push(i);
  }
  document.getElementById("count").textContent = query
    ? `${shown.length.toLocaleString()} of ${n.toLocaleString()} nodes match “${text.trim()}”`
    : `${shown.length.toLocaleString()} nodes`;
  spacer.style.height = Math.max(shown.length, 1) * ROW_H + "px";
  spacer.dataset.empty = shown.length ? "" : "No node matches.";
  list.scrollTop = 0;
  renderRows(); redraw();
}
const rowPool = [];
function renderRows() {
  const first = Math.max(0, Math.floor(list.scrollTop / ROW_H) - 5);
  const last = Math.min(shown.length, first + Math.ceil(list.clientHeight / ROW_H) + 10);
  let used = 0;
  for (let k = first; k < last; k++, used++) {
    let row = rowPool[used];
    if (!row) {
      row = document.createElement("div"); row.className = "row";
      row.innerHTML = '<span class="sw"></span><span class="nm"></span><span class="op"></span>';
      row.addEventListener("click", () => goTo(+row.dataset.i, true));
      spacer.appendChild(row); rowPool.push(row);
    }
    const i = shown[k];
    row.dataset.i = i; row.style.top = k * ROW_H + "px"; row.style.display = "flex";
    row.children[0].style.background = CAT_COLOURS[D.cat[i]];
    row.children[2].textContent = D.ops[D.op[i]];
    row.children[1].title = D.name[i];
    row.children[1].textContent = middleFit(D.name[i], row.children[1].clientWidth);
    row.classList.toggle("sel", i === selected);
  }
  for (let k = used; k < rowPool.length; k++) rowPool[k].style.display = "none";
}
// Long names lose their middle, so the layer (head) and the op (tail) both stay visible.
const measure = document.createElement("canvas").getContext("2d");
function middleFit(text, width) {
  const style = getComputedStyle(list);
  measure.font = `${style.fontSize} ${style.fontFamily}`;
  const fits = s => measure.measureText(s).width <= width;
  return width > 0 ? shortenMiddle(text, fits) : text;
}
function shortenMiddle(text, fits) {
  if (fits(text)) return text;
  const cut = k => { const head = Math.ceil(k * 0.4); return text.slice(0, head) + "\u2026" + text.slice(text.length - (k - head)); };
  let lo = 0, hi = text.length - 1;
  while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (fits(cut(mid))) lo = mid; else hi = mid - 1; }
  return cut(lo);
}
list.addEventListener("scroll", renderRows);
search.addEventListener("input", () => applyQuery(search.value));
search.addEventListener("keydown", e => { if (e.key === "Enter" && shown.length) goTo(shown[0], true); });

// ---- legend and details -----------------------------------------------------------
function buildLegend() {
  const counts = new Array(D.categories.length).fill(0);
  for (let i = 0; i < n; i++) counts[D.cat[i]]++;
  const legend = document.getElementById("legend");
  D.categories.forEach((c, k) => {
    const label = document.createElement("label");
    label.title = D.category_help[k];
    const box = document.createElement("input"); box.type = "checkbox"; box.checked = true;
    box.addEventListener("change", () => { box.checked ? hiddenCat.delete(k) : hiddenCat.add(k); applyQuery(search.value); });
    const sw = document.createElement("span"); sw.className = "sw"; sw.style.background = CAT_COLOURS[k];
    label.append(box, sw, document.createTextNode(`${c} (${counts[k].toLocaleString()})`));
    legend.appendChild(label);
  });
  const s = D.summary, share = s.half_flop_share === null ? "unknown" : (100 * s.half_flop_share).toFixed(1) + "%";
  document.getElementById("stats").innerHTML = "";
  for (const [k, v] of [["target", s.target], ["level", s.level], ["device", s.device_type],
      ["converted", `${s.converted.toLocaleString()} / ${s.nodes_total.toLocaleString()}`],
      ["casts", s.casts.toLocaleString()], ["MatMul/Conv FLOPs in half", share]]) {
    const span = document.createElement("span"); span.className = "stat";
    span.append(document.createTextNode(k + " "));
    const b = document.createElement("b"); b.textContent = v; span.append(b);
    document.getElementById("stats").append(span);
  }
}
function link(i) {
  const a = document.createElement("a"); a.textContent = D.name[i]; a.href = "#node=" + encodeURIComponent(D.name[i]);
  return a;
}
function showDetails() {
  const box = document.getElementById("details");
  box.textContent = "";
  if (selected < 0) { box.innerHTML = '<span class="muted">Click a node in the list or the drawing.</span>'; return; }
  const i = selected, h = document.createElement("h2"); h.textContent = D.name[i]; box.append(h);
  const dl = document.createElement("dl");
  const add = (k, v) => { const dt = document.createElement("dt"); dt.textContent = k; const dd = document.createElement("dd");
    if (v instanceof Node) dd.append(v); else dd.textContent = v; dl.append(dt, dd); };
  const sw = document.createElement("span"); sw.className = "sw"; sw.style.background = CAT_COLOURS[D.cat[i]];
  const cat = document.createElement("span"); cat.append(sw, document.createTextNode(" " + D.categories[D.cat[i]] + " — " + D.category_help[D.cat[i]]));
  add("op", D.ops[D.op[i]]); add("precision", cat); add("dtype", D.dtypes[D.dtype[i]] || "—");
  add("list colour", D.colours[D.colour[i]]); add("rule", D.rules[D.rule[i]] || "—");
  add("converted", D.converted[i] ? "yes" : "no");
  add("cause", D.cause[i] >= 0 ? link(D.cause[i]) : "—");
  const many = (label, items) => { if (!items.length) return; const span = document.createElement("span");
    items.slice(0, 50).forEach((j, k) => { if (k) span.append(document.createElement("br")); span.append(link(j)); });
    if (items.length > 50) span.append(document.createTextNode(` … ${items.length - 50} more`)); add(label, span); };
  many("inputs", inputs[i]); many("control inputs", ctlIn(i)); many("consumers", outputs[i]);
  box.append(dl);
}
function goTo(i, centre) {
  selected = i;
  if (centre) centreOn(i);
  const k = shown.indexOf(i);
  if (k >= 0 && (k * ROW_H < list.scrollTop || (k + 1) * ROW_H > list.scrollTop + list.clientHeight))
    list.scrollTop = Math.max(0, k * ROW_H - list.clientHeight / 2);
  history.replaceState(null, "", "#node=" + encodeURIComponent(D.name[i]));
  showDetails(); renderRows(); redraw();
}

// ---- the URL hash: #search=TEXT or #node=NAME --------------------------------------
function readHash() {
  const h = location.hash.slice(1);
  for (const part of h.split("&")) {
    const eq = part.indexOf("="); if (eq < 0) continue;
    const key = part.slice(0, eq), value = decodeURIComponent(part.slice(eq + 1).replace(/\+/g, " "));
    if (key === "search") { search.value = value; applyQuery(value); if (shown.length === 1) goTo(shown[0], true); }
    else if (key === "node" && byName.has(value)) goTo(byName.get(value), true);
  }
}
window.addEventListener("hashchange", readHash);

// ---- start --------------------------------------------------------------------------
resize(); wrapBands(); buildLegend(); fit(); applyQuery(""); readHash(); draw();
const ms = performance.now() - t0;
document.getElementById("count").dataset.renderMs = ms.toFixed(0);
document.title = document.title;
console.log(`graph report: ${n} nodes drawn in ${ms.toFixed(0)} ms`);
})();
</script>
</body>
</html>
"""
