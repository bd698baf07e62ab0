"""Why each node ended up in its precision: per-node outcomes and the chain back to an op list.

Every painting rule records, per vertex, the rule that decided its colour
and the neighbour that caused it. This module turns that into one outcome
per node: ``colour``, ``rule``, ``cause`` (a neighbouring node),
``precision`` (its dtype after the rewrite) and ``reason``, a sentence such as
``Tanh → float16: infer op after an allow op; its input MatMul_3 is float16``.
:func:`explain_chain` follows causes back to the op-list entry that started it.
"""

from __future__ import annotations

from amp_rewrite.typed_graph import DTYPE_NAMES


def node_outcomes(ctx, painting, applied, was_float32: list[bool]) -> dict[str, dict]:
    """Per main-graph node: colour, rule, cause, precision and a one-line reason."""
    graph = ctx.graph
    outcomes = {}
    for i in graph.bodies[0].index.values():
        node = graph.nodes[i]
        colour, rule, cause = _node_colour(ctx, painting, i, was_float32)
        entry = {"op": node.op, "colour": colour, "rule": rule, "precision": _precision(graph, i)}
        if cause is not None:
            cause_node = graph.vertices[cause][0]
            if graph.body_of[cause_node] == 0:
                entry["cause"] = graph.nodes[cause_node].name
        outcomes[node.name] = entry
    for name in applied.folded_by_body.get(0, []):
        outcomes[name].update(colour="allow", rule="constant read only by half ops: stored in half",
                              precision=DTYPE_NAMES[ctx.target_dtype])
    for name, peak in applied.out_of_range_by_body.get(0, {}).items():
        outcomes[name].update(rule=f"constant read by half ops but |value| reaches {peak:g}: "
                                   "kept float32 with a Cast")
    inputs = {name: {graph.nodes[src].name for src, _ in graph.inputs[graph.index[name]]} for name in outcomes}
    for name, entry in outcomes.items():
        entry["reason"] = _sentence(ctx, name, entry, inputs, outcomes)
    return outcomes


def explain_chain(outcomes: dict[str, dict], node: str, origins: dict | None = None) -> list[str]:
    """The reasons from ``node`` back along its causes to the rule that started the paint.

    Args:
        outcomes: the per-node outcomes of a rewrite.
        node: the node to explain.
        origins: (colour, op) → where the list entry came from, to name the list file.
    """
    lines, seen = [], set()
    while node is not None and node not in seen and node in outcomes:
        seen.add(node)
        entry = outcomes[node]
        line = entry["reason"]
        if "cause" not in entry and origins and (entry["colour"], entry["op"]) in origins:
            line += f" [{entry['op']} is on the {entry['colour']} list: {origins[(entry['colour'], entry['op'])]}]"
        lines.append(line)
        node = entry.get("cause")
    return lines


def _precision(graph, i: int) -> str:
    dtypes = [graph.dtype(v) for v in graph.node_vertices[i] if graph.vertices[v][1].name]
    floats = [DTYPE_NAMES[d] for d in dtypes if d in DTYPE_NAMES and d != 21]
    return floats[0] if floats else "n/a"


def _sentence(ctx, name: str, entry: dict, inputs: dict, outcomes: dict) -> str:
    op, colour = entry["op"], entry["colour"]
    head = f"{name} ({op})"
    if colour == "allow":
        verdict = f"{head} → {DTYPE_NAMES[ctx.target_dtype]}: {entry['rule']}"
    else:
        verdict = f"{head} stays {entry['precision'] if entry['precision'] != 'n/a' else 'as it is'}: {entry['rule']}"
    cause = entry.get("cause")
    if cause is None:
        return verdict
    relation = "input" if cause in inputs[name] else "consumer" if name in inputs.get(cause, ()) else "neighbour"
    return f"{verdict}; its {relation} {cause} is {outcomes[cause]['precision']}"


def _node_colour(ctx, painting, i: int, was_float32: list[bool]):
    graph = ctx.graph
    vids = graph.node_vertices[i]
    if ctx.skip_reason[i] is not None:
        return "preserved", ctx.skip_reason[i], None
    for group, colour in ((painting.allow, "allow"), (painting.deny, "deny")):
        hits = [v for v in vids if v in group]
        if hits:
            rule, cause = painting.reasons.get(hits[0], ("", None))
            return colour, rule, cause
    for v in vids:
        if v in painting.reasons:  # painted, then unpainted by a later rule
            rule, cause = painting.reasons[v]
            return "float32", rule, cause
    node = graph.nodes[i]
    if graph.op_defs[i] is None:
        return "unknown", "op not registered: kept as it is", None
    listed = ctx.lists.colour_of(node.op)
    floats = [v for v in vids if was_float32[v]]
    if not floats:
        return listed or "none", "no float32 type to change", None
    if listed is None:
        return "none", "op on no list", None
    if not any(ctx.supports_target(v) for v in floats):
        return listed, f"no {ctx.lists.target} kernel or OpDef type on {ctx.device_type}", None
    if listed == "allow":
        return listed, "allow-list op", None
    return listed, "not connected to a half op", None
