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

The layout is computed in Python, not in the browser
(:func:`amp_rewrite.report.layout.layered_layout`): nodes are layered by
longest path from the inputs (loop back edges are ignored), each node moves
next to its first consumer, barycentre sweeps order each layer, and tall
layers are split over several columns. The browser only wraps the columns
into bands that fit the window, and draws what is in view, so a 12,000-node
graph opens in about a tenth of a second.
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF, DTYPE_NAMES, FlatNode, flat_nodes, functions_of
from amp_rewrite.report.layout import layered_layout

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
    flat = flat_nodes(result.graph_def, functions_of([*report["nodes"], *report["casts"]]))
    nodes = _describe_nodes(flat, report)
    edges, control = _edges(flat)
    column, row = layered_layout(len(nodes), edges + _control_edges_into_sinks(edges, control, len(nodes)))
    data = _page_data(nodes, edges, control, column, row, report)
    if doctor is not None:
        data["doctor"] = doctor
    logger.debug("rendered %d nodes and %d edges", len(nodes), len(edges) + len(control))
    return _page_template().replace("{{TITLE}}", html.escape(title)).replace("{{DATA}}", _script_json(data))


# -- what each node is -----------------------------------------------------------


def _describe_nodes(flat: list[FlatNode], report: dict) -> list[_Node]:
    """One :class:`_Node` per node drawn, in the order of :func:`~amp_rewrite.graph.facts.flat_nodes`."""
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
