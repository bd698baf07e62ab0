"""Why each node ended up in its precision: per-node outcomes and the chain back to an op list.

Every painting rule records, per vertex, the rule that decided its colour
and the neighbour that caused it. This module turns that into one outcome
per node: ``colour``, ``rule``, ``cause`` (a neighbouring node),
``precision`` (its dtype after the rewrite) and ``reason``, a sentence such as
``Tanh → float16: infer op after an allow op; its input MatMul_3 is float16``.
:func:`explain_chain` follows causes back to the op-list entry that started it.
Nodes inside functions are named ``function::node``. :func:`disagreements`
checks each reason's verdict (``→ float16``, or ``stays`` with the dtype the
node had) against the node's type attrs in the rewritten graph. With DEBUG
logging on, :mod:`amp_rewrite.pipeline` logs every node's reason after a rewrite.
"""

from __future__ import annotations

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF, DTYPE_NAMES
from amp_rewrite.paint.op_lists import Colour

# Plain names: per-node loops compare against them.
_ALLOW, _INFER, _DENY, _CLEAR = Colour.ALLOW, Colour.INFER, Colour.DENY, Colour.CLEAR

_NOT_CONNECTED = "not connected to a half op"


def node_outcomes(ctx, painting, applied, was_float32: list[bool]) -> dict[str, dict]:
    """Per node: colour, rule, cause, precision and a one-line reason.

    The main graph's nodes come first under their own names, then the nodes
    of each function the rewritten library holds, as ``function::node``, from
    the instance written under that name (every instance written under one
    name is identical). Inserted Casts are not listed.
    """
    graph = ctx.graph
    prefixes = reported_bodies(graph)
    qualified = {}
    for body_id, prefix in prefixes.items():
        for name, i in graph.bodies[body_id].index.items():
            if i not in graph.virtual:
                qualified[i] = prefix + name
    outcomes = {}
    for i, name in qualified.items():
        colour, rule, cause = _node_colour(ctx, painting, i, was_float32)
        entry = {"op": graph.nodes[i].op, "colour": colour, "rule": rule, "precision": _precision(graph, i)}
        cause_name = _cause_name(graph, qualified, cause, i)
        if cause_name is not None:
            entry["cause"] = cause_name
        outcomes[name] = entry
    for body_id, prefix in prefixes.items():
        for name in applied.folded_by_body.get(body_id, []):
            outcomes[prefix + name].update(colour=_ALLOW, rule="constant read only by half ops: stored in half",
                                           precision=DTYPE_NAMES[ctx.target_dtype])
        for name, peak in applied.out_of_range_by_body.get(body_id, {}).items():
            outcomes[prefix + name].update(rule=f"constant read by half ops but |value| reaches {peak:g}: "
                                                "kept float32 with a Cast")
    inputs = {name: {qualified[src] for src, _ in graph.inputs(i) if src in qualified}
              for i, name in qualified.items()}
    _name_half_neighbours(graph, painting, qualified, outcomes, ctx.target_dtype)
    before = {name: _precision_before(graph, i, was_float32) for i, name in qualified.items()}
    for name, entry in outcomes.items():
        entry["reason"] = _sentence(ctx, name, entry, inputs, outcomes, before[name])
    return outcomes


def _name_half_neighbours(graph, painting, qualified: dict[int, str], outcomes: dict[str, dict],
                          target: int) -> None:
    """Says why a float32 node joined to a half tensor was not painted with it, naming that neighbour.

    Only edges of the same type attr count: a FusedBatchNorm's float32 mean
    output does not make its reader a neighbour of the half ``y``. An infer op
    joins the half region only when a half op feeds it; one whose only half
    neighbours are its consumers (a batch norm's ``gamma * rsqrt``, read by the
    half ``x * scale``) stays float32, and its consumer reads it through a Cast;
    one fed by a deny-painted op as well stays float32 too.
    """
    for i, name in qualified.items():
        entry = outcomes[name]
        if entry["rule"] != _NOT_CONNECTED:
            continue
        float32 = [v for v in graph.node_vertices[i] if graph.dtype(v) == DT_FLOAT]
        half_inputs = _names(graph, qualified, (u for v in float32 for u in graph.fanin[v]), target, i)
        half_consumers = _names(graph, qualified, (w for v in float32 for w in graph.fanout[v]), target, i)
        deny_inputs = sorted({qualified[graph.vertex_node[u]] for v in float32 for u in graph.fanin[v]
                              if u in painting.deny and graph.vertex_node[u] in qualified})
        if entry["colour"] == _INFER and half_consumers and not half_inputs:
            entry.update(rule="infer op fed by no half op", cause=half_consumers[0])
        elif entry["colour"] == _INFER and half_inputs and deny_inputs:
            entry.update(rule=f"infer op fed by a half op ({half_inputs[0]}) and by a deny-painted op",
                         cause=deny_inputs[0])
        elif entry["colour"] == _INFER and half_inputs:
            painted = any(u in painting.allow for v in float32 for u in graph.fanin[v])
            entry.update(rule="infer op whose half input was painted after infer ops were decided "
                              "(clear ops next to half ops are painted last)" if painted else
                              "infer op whose half input was already half: only painted ops lead infer ops",
                         cause=half_inputs[0])
        elif half_inputs or half_consumers:
            entry.update(rule="no rule joins it to its half neighbour", cause=(half_inputs or half_consumers)[0])


def _names(graph, qualified: dict[int, str], vertices, target: int, node: int) -> list[str]:
    """The reported names of the nodes owning the half vertices among ``vertices``."""
    owners = {graph.vertex_node[v] for v in vertices if graph.dtype(v) == target}
    return sorted(qualified[j] for j in owners if j in qualified and j != node)


def disagreements(result) -> list[str]:
    """Nodes whose reason states a precision that their node in the rewritten graph does not have.

    Each reason says ``→ float16`` or ``stays float32``; this reads the type
    attrs of the node in the rewritten GraphDef and lists every node where
    they disagree: a half verdict needs that half type among them, a float32
    one needs float32 and no half type. An empty list is the expected answer.
    """
    defs = {node.name: node for node in result.graph_def.node}
    for fdef in result.graph_def.library.function:
        defs.update((f"{fdef.signature.name}::{node.name}", node) for node in fdef.node_def)
    found = []
    for name, entry in result.node_outcomes.items():
        node = defs.get(name)
        if node is None:
            found.append(f"{name}: described, but not in the rewritten graph")
            continue
        verdict = entry["reason"][len(f"{name} ({entry['op']}) "):]
        if verdict.startswith("→ "):
            stated = verdict[2:].split(":")[0]
        elif verdict.startswith("stays as it is"):
            continue
        else:
            stated = verdict[len("stays "):].split(":")[0]
        types = _node_def_float_types(node)
        holds = stated in types and (stated != "float32" or types == {"float32"})
        if not holds:
            found.append(f"{name}: the reason says {stated}, the rewritten node has "
                         f"{', '.join(sorted(types)) or 'no float type'}: {entry['reason']}")
    return found


def _node_def_float_types(node) -> set[str]:
    types = {t for value in node.attr.values() for t in (value.type, *value.list.type)}
    return {DTYPE_NAMES[t] for t in types if t in (DT_FLOAT, DT_HALF, DT_BFLOAT16)}


def reported_bodies(graph) -> dict[int, str]:
    """Body id → name prefix: the main graph (``""``), then one instance per function name written.

    Run after the library was finalized: each call node then names the
    function its instance was written as (the original, or a renamed variant).
    """
    prefixes = {0: ""}
    written = set()
    for body_id in range(1, len(graph.bodies)):
        name = _written_name(graph, body_id)
        if name and name not in written:
            written.add(name)
            prefixes[body_id] = f"{name}::"
    return prefixes


def _written_name(graph, body_id: int) -> str | None:
    body = graph.bodies[body_id]
    call = graph.nodes[body.call]
    for attr, bodies in graph.bodies[graph.body_of[body.call]].children[body.call].items():
        if body_id not in bodies:
            continue
        k = bodies.index(body_id)
        if attr == "":
            return call.op
        if attr == "branches":
            return call.attr[attr].list.func[k].name
        return call.attr[attr].func.name
    return None


def _cause_name(graph, qualified: dict[int, str], cause, node: int) -> str | None:
    """The node a rule named as the cause, by its reported name; a function's argument or result
    stands for the call that passes it."""
    if cause is None:
        return None
    source = graph.vertex_node[cause]
    if source in graph.virtual:
        source = graph.bodies[graph.body_of[source]].call
    if source == node:
        return None
    return qualified.get(source)


def explain_chain(outcomes: dict[str, dict], node: str | None, origins: dict | None = None) -> list[str]:
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


def _precision(graph, i: int, dtype_of=None) -> str:
    """The node's dtype after the rewrite: its half type if any type attr holds one, else float32."""
    dtype_of = dtype_of or graph.dtype
    dtypes = {dtype_of(v) for v in graph.node_vertices[i] if graph.vertex_attr[v].name}
    halves = sorted(DTYPE_NAMES[d] for d in dtypes if d in (DT_HALF, DT_BFLOAT16))
    if halves:
        return halves[0]
    return "float32" if DT_FLOAT in dtypes else "n/a"


def _precision_before(graph, i: int, was_float32: list[bool]) -> str:
    """The node's dtype before the rewrite (painting only ever changes float32 type attrs)."""
    return _precision(graph, i, lambda v: DT_FLOAT if was_float32[v] else graph.dtype(v))


def _sentence(ctx, name: str, entry: dict, inputs: dict, outcomes: dict, before: str) -> str:
    op, colour = entry["op"], entry["colour"]
    head = f"{name} ({op})"
    if colour == _ALLOW:
        verdict = f"{head} → {DTYPE_NAMES[ctx.target_dtype]}: {entry['rule']}"
    else:
        verdict = f"{head} stays {before if before != 'n/a' else 'as it is'}: {entry['rule']}"
    cause = entry.get("cause")
    if cause is None:
        return verdict
    relation = "input" if cause in inputs[name] else "consumer" if name in inputs.get(cause, ()) else "neighbour"
    return f"{verdict}; its {relation} {cause} is {outcomes[cause]['precision']}"


def node_is_cast_past_widening(ctx, i: int, was_float32: list[bool]) -> bool:
    """Whether node ``i`` is a Cast of the input graph whose float32 input became half.

    The Casts step lets an existing ``float32 -> X`` Cast read past the
    ``half -> float32`` Cast it would otherwise need: widening is exact.
    """
    graph = ctx.graph
    if graph.nodes[i].op != "Cast":
        return False
    source = graph.vertex_of(i, "SrcT")
    return source is not None and was_float32[source] and graph.dtype(source) == ctx.target_dtype


def _node_colour(ctx, painting, i: int, was_float32: list[bool]):
    graph = ctx.graph
    vids = graph.node_vertices[i]
    if ctx.skip_reason[i] is not None:
        return "preserved", ctx.skip_reason[i], None
    for group, colour in ((painting.allow, _ALLOW), (painting.deny, _DENY)):
        hits = [v for v in vids if v in group]
        if hits:
            rule, cause = painting.reason(hits[0]) or ("", None)
            return colour, rule, cause
    if node_is_cast_past_widening(ctx, i, was_float32):
        return _ALLOW, "existing Cast now reads the half value its float32 input was widened from", None
    for v in vids:
        found = painting.reason(v)
        if found is not None:  # painted, then unpainted by a later rule
            return "float32", *found
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
    if listed == _ALLOW:
        return listed, "allow-list op", None
    return listed, _NOT_CONNECTED, None
