"""Float32 islands: float32 nodes of a rewritten graph on a path from a half op back to a half op.

Such a node is reached from an inserted ``half → float32`` Cast through
float32 nodes, and reaches an inserted ``float32 → half`` Cast through
float32 nodes. Each island (the connected groups of such nodes) costs its
Casts in and out on every step. Function bodies are covered as
``function::node``, with the names the rewrite's report uses.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF, flat_nodes, functions_of

_HALF = (DT_HALF, DT_BFLOAT16)


@dataclass(frozen=True)
class Island:
    """A connected group of float32 nodes between half ops, in graph order, and its inserted Casts."""

    nodes: tuple[str, ...]
    casts_in: tuple[str, ...]
    casts_out: tuple[str, ...]


def float32_islands(graph_def, outcomes: dict[str, dict], casts: list[str]) -> list[Island]:
    """The float32 islands of a rewritten graph.

    Args:
        graph_def: the rewritten GraphDef.
        outcomes: the rewrite's per-node outcomes (``precision`` is read).
        casts: the names of the Casts the rewrite inserted.
    """
    flat = flat_nodes(graph_def, functions_of([*outcomes, *casts]))
    order = {item.name: k for k, item in enumerate(flat)}
    inputs = {item.name: [src for src, control in item.inputs if not control] for item in flat}
    consumers: dict[str, list[str]] = defaultdict(list)
    for name, sources in inputs.items():
        for src in sources:
            consumers[src].append(name)
    inserted = set(casts)
    float32 = {name for name, entry in outcomes.items() if entry["precision"] == "float32" and name not in inserted}
    types = {item.name: (item.node_def.attr["SrcT"].type, item.node_def.attr["DstT"].type)
             for item in flat if item.name in inserted}
    widening = [c for c in casts if c in types and types[c][0] in _HALF and types[c][1] == DT_FLOAT]
    narrowing = [c for c in casts if c in types and types[c][0] == DT_FLOAT and types[c][1] in _HALF]
    after = _reach([n for c in widening for n in consumers[c]], lambda n: consumers.get(n, ()), float32)
    before = _reach([n for c in narrowing for n in inputs.get(c, [])], lambda n: inputs.get(n, ()), float32)
    members = after & before
    islands = []
    for group in _components(members, inputs, consumers):
        nodes = tuple(sorted(group, key=order.__getitem__))
        casts_in = tuple(c for c in widening if any(n in group for n in consumers[c]))
        casts_out = tuple(c for c in narrowing if any(n in group for n in inputs.get(c, [])))
        islands.append(Island(nodes, casts_in, casts_out))
    return sorted(islands, key=lambda island: order[island.nodes[0]])


def _reach(starts: list[str], step: Callable[[str], Iterable[str]], allowed: set[str]) -> set[str]:
    """The nodes of ``allowed`` reached from ``starts`` (themselves included) along ``step``."""
    seen = set()
    stack = [n for n in starts if n in allowed]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(n for n in step(name) if n in allowed and n not in seen)
    return seen


def _components(members: set[str], inputs: dict, consumers: dict) -> list[set[str]]:
    """The connected groups of ``members`` (edges in either direction)."""
    groups, seen = [], set()
    for start in sorted(members):
        if start in seen:
            continue
        group = _reach([start], lambda n: [*inputs.get(n, ()), *consumers.get(n, ())], members)
        seen |= group
        groups.append(group)
    return groups
