"""Structural postconditions of a rewrite, checked on its output graph.

A rewrite's output must satisfy, whatever the painting:

- **edge types**: every data edge joins an output and an input of one dtype
  (in the main graph and in every function instance the typed view reaches);
- **casts change a type**: each Cast the rewrite inserted has ``SrcT != DstT``;
- **no half round trip**: no new ``half -> float32 -> half`` pair of Casts,
  except into a Cast the rewrite left alone (it must keep reading float32);
- **fetch dtypes**: every fetched output has the dtype it had before.

:func:`violations` lists what fails; :func:`ensure` raises on the first.
The tests run them on every rewrite they fuzz; the pipeline runs
:func:`ensure` on a user's graph when its config's ``is_checking`` is set
(``AMP_REWRITE_CHECK=1`` or ``AMP_REWRITE_STRICT=1``, read by
:meth:`amp_rewrite.Config.from_env`; the runtime sets it in strict mode), so a
broken output is named before TensorFlow runs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from amp_rewrite.errors import AmpRewriteError
from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF, node_name, parse_input, sinks


class PostconditionError(AmpRewriteError):
    """The rewritten graph breaks a structural postcondition (names the check and the nodes)."""


class Violation(NamedTuple):
    """One failed postcondition: which check, and the nodes it found."""

    check: str
    detail: str


def violations(before, after, *, casts: Iterable[str] = (), fetches: Iterable[str] | None = (),
               left_alone: Iterable[str] = ()) -> list[Violation]:
    """The postconditions ``after`` (the rewrite of ``before``) breaks, in the order listed above.

    Args:
        before, after: the input and output GraphDefs.
        casts: names of the Casts the rewrite inserted (``fn::name`` inside function ``fn``).
        fetches: the fetched ``name`` or ``name:port``; None or none means the graph's sinks.
        left_alone: nodes the rewrite must not change (fetched, preserved, pinned elsewhere).
    """
    from amp_rewrite.graph.typed_graph import TypedGraph

    view = TypedGraph(after)
    found = []
    for check, detail in (("edge types", _edge_type_mismatches(view)),
                          ("casts change a type", _idle_casts(after, casts)),
                          ("no half round trip", _new_round_trips(before, after, set(left_alone))),
                          ("fetch dtypes", _fetch_dtype_changes(TypedGraph(before), view, fetches))):
        if detail:
            found.append(Violation(check, detail))
    return found


def ensure(before, after, *, casts: Iterable[str] = (), fetches: Iterable[str] | None = (),
           left_alone: Iterable[str] = ()) -> None:
    """Raises :class:`PostconditionError` naming the first postcondition :func:`violations` finds."""
    found = violations(before, after, casts=casts, fetches=fetches, left_alone=left_alone)
    if found:
        check, detail = found[0]
        raise PostconditionError(f"rewritten graph breaks a postcondition ({check}): {detail}")


def half_round_trips(graph_def) -> set[tuple[str, str]]:
    """(Cast half -> float32, Cast float32 -> the same half type reading it) name pairs of the main graph."""
    casts = {n.name: n for n in graph_def.node if n.op == "Cast"}
    pairs = set()
    for node in casts.values():
        if node.attr["SrcT"].type != DT_FLOAT or node.attr["DstT"].type not in (DT_HALF, DT_BFLOAT16):
            continue
        if not node.input:
            continue
        name, _, is_control = parse_input(node.input[0])
        src = None if is_control else casts.get(name)
        if (src is not None and src.attr["SrcT"].type == node.attr["DstT"].type
                and src.attr["DstT"].type == DT_FLOAT):
            pairs.add((src.name, node.name))
    return pairs


def _edge_type_mismatches(view) -> str | None:
    dtypes = view.dtypes()
    bad = []
    for dst, in_vids in enumerate(view.in_vids):
        if in_vids is None:
            continue
        for k, (v, (src, port)) in enumerate(zip(in_vids, view.inputs(dst))):
            out_vids = view.out_vids[src]
            if out_vids is not None and dtypes[out_vids[port]] != dtypes[v]:
                bad.append(f"{view.nodes[src].name}:{port} -> {view.nodes[dst].name} input {k}")
    return f"{len(bad)} edges join two dtypes: {bad[:3]}" if bad else None


def _idle_casts(graph_def, casts: Iterable[str]) -> str | None:
    nodes = {n.name: n for n in graph_def.node}
    functions = {f.signature.name: f for f in graph_def.library.function}
    same = []
    for name in casts:
        function, sep, local = name.rpartition("::")
        if sep:
            fdef = functions.get(function)
            node = next((n for n in fdef.node_def if n.name == local), None) if fdef is not None else None
        else:
            node = nodes.get(name)
        if node is not None and node.attr["SrcT"].type == node.attr["DstT"].type:
            same.append(name)
    return f"inserted Casts with SrcT == DstT: {same[:3]}" if same else None


def _new_round_trips(before, after, left_alone: set[str]) -> str | None:
    new = {(a, b) for a, b in half_round_trips(after) - half_round_trips(before) if b not in left_alone}
    return f"Cast pairs half -> float32 -> half: {sorted(new)[:3]}" if new else None


def _fetch_dtype_changes(view_before, view_after, fetches: Iterable[str] | None) -> str | None:
    fetches = list(fetches or ()) or sorted(sinks(view_before.graph_def))
    changed = []
    for fetch in fetches:
        name = node_name(fetch)
        i, j = view_before.index.get(name), view_after.index.get(name)
        if i is None:
            continue  # not a node of the input: the rewrite refuses such a fetch
        if j is None:
            changed.append(f"{fetch} (node missing)")
            continue
        ports = [parse_input(fetch)[1]] if ":" in fetch else range(len(view_before.out_attrs[i] or ()))
        for port in ports:
            u, v = view_before.output_vertex(i, port), view_after.output_vertex(j, port)
            if u is not None and v is not None and view_before.dtype(u) != view_after.dtype(v):
                changed.append(f"{name}:{port}")
    return f"fetched outputs changed dtype: {changed[:3]}" if changed else None
