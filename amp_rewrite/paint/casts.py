"""Applies a painting to the GraphDef: retype, fold constants, insert and share Casts.

Guarantees, for a painting from :mod:`amp_rewrite.paint.rules`:

- only vertices that were float32 change, and they become the target type;
- every edge whose two ends now differ gets exactly one Cast per (source
  port, direction), shared by all the consumers that need it, named after the
  source tensor and placed on the source's device;
- a float32 Const whose consumers are all half becomes a half Const, unless a
  value lies outside the half range (then it keeps a Cast and is reported);
- no Cast reads from a widening Cast we inserted: ``half -> float -> X``
  becomes ``half -> X``, so no float16 → float32 → float16 round trip remains.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import NamedTuple

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF
from amp_rewrite.graph.names import NamesInUse, unique_name
from amp_rewrite.graph.typed_graph import TypedGraph
from amp_rewrite.paint.context import PaintContext
from amp_rewrite.paint.rules import Painting

logger = logging.getLogger(__name__)

CAST_SUFFIX = "AmpRewrite"
_CAST_WORD = {DT_HALF: "CastToFp16", DT_BFLOAT16: "CastToBf16", DT_FLOAT: "CastToFp32"}
BATCH_NORM_V1 = {"FusedBatchNorm": "FusedBatchNormV2", "FusedBatchNormGrad": "FusedBatchNormGradV2"}


@dataclass
class Applied:
    """What applying a painting changed, by node name per body (0 is the main graph).

    :func:`amp_rewrite.pipeline.name_changes` turns these into the report's
    names once the function library is final.

    Attributes:
        converted_by_body: nodes whose type attrs changed, folded Consts included.
        folded_by_body: float32 Consts now stored in half.
        out_of_range_by_body: Consts kept float32, with their largest magnitude.
        casts_by_body: the Casts inserted.
        cast_sources: (body, Cast name) → index of the node the Cast reads.
    """

    converted_by_body: dict[int, list[str]] = field(default_factory=dict)
    folded_by_body: dict[int, list[str]] = field(default_factory=dict)
    out_of_range_by_body: dict[int, dict[str, float]] = field(default_factory=dict)
    casts_by_body: dict[int, list[str]] = field(default_factory=dict)
    cast_sources: dict[tuple[int, str], int] = field(default_factory=dict)


def apply_painting(ctx: PaintContext, painting: Painting, was_float32: list[bool]) -> Applied:
    """Rewrites ``ctx.graph.graph_def`` in place according to ``painting``.

    Args:
        ctx: the painting context (its graph's GraphDef is the working copy).
        painting: the colours.
        was_float32: per vertex, whether it held float32 before any change.
    """
    graph = ctx.graph
    retyped = retype_allow_vertices(graph, painting, was_float32, ctx.target_dtype)
    folded, out_of_range = fold_half_consts(ctx, painting)
    new_casts, widening = insert_casts(ctx, painting, was_float32, folded)
    dead = bypass_widening_casts(ctx, widening)
    applied = Applied(converted_by_body=_by_body(graph, sorted((retyped | folded) - graph.virtual)),
                      folded_by_body=_by_body(graph, sorted(folded)), out_of_range_by_body=out_of_range)
    for cast in new_casts:
        if (cast.body, cast.name) in dead:
            continue
        body = graph.bodies[cast.body]
        _write_cast((graph.graph_def.node if body.is_main else body.fdef.node_def).add(), cast)
        applied.cast_sources[(cast.body, cast.name)] = cast.source
        applied.casts_by_body.setdefault(cast.body, []).append(cast.name)
    return applied


def _by_body(graph: TypedGraph, nodes: list[int]) -> dict[int, list[str]]:
    """The names of ``nodes``, per body."""
    names: dict[int, list[str]] = {}
    for i in nodes:
        names.setdefault(graph.body_of[i], []).append(graph.names[i])
    return names


def retype_allow_vertices(graph: TypedGraph, painting: Painting, was_float32: list[bool],
                          target: int) -> set[int]:
    """Sets every ALLOW float32 vertex to the target type; returns the nodes changed."""
    changed: set[int] = set()
    for vid in sorted(painting.allow):
        if was_float32[vid]:
            graph.set_dtype(vid, target)
            changed.add(graph.vertex_node[vid])
    return changed


def promote_batch_norms(graph_def, skip: Collection[str]) -> list[str]:
    """Renames FusedBatchNorm(Grad) V1 nodes to V2 with ``U=float``, so their ``T`` can be half.

    V1 ties the scale, offset and statistics to ``T``; V2 types them with
    ``U``, which stays float32. :func:`restore_unconverted_batch_norms` undoes
    this for nodes whose ``T`` is not painted.
    """
    promoted = []
    for node in graph_def.node:
        if node.op in BATCH_NORM_V1 and node.name not in skip and node.attr["T"].type == DT_FLOAT:
            node.op = BATCH_NORM_V1[node.op]
            node.attr["U"].type = DT_FLOAT
            promoted.append(node.name)
    return promoted


def restore_unconverted_batch_norms(graph: TypedGraph, painting: Painting, promoted: list[str]) -> None:
    """Turns each node of ``promoted`` whose ``T`` is not painted ALLOW back into V1.

    Only the op name and the ``U`` attr change; the rest of the rewrite does
    not read them, so this may run any time after painting.
    """
    v1_of = {v2: v1 for v1, v2 in BATCH_NORM_V1.items()}
    for name in promoted:
        vid = graph.vertex(name, "T")
        if vid not in painting.allow:
            node = graph.nodes[graph.index[name]]
            node.op = v1_of[node.op]
            del node.attr["U"]


def fold_half_consts(ctx: PaintContext, painting: Painting) -> tuple[set[int], dict[int, dict[str, float]]]:
    """Turns float32 Consts read only by ALLOW vertices into half Consts.

    Returns the indices of the nodes folded, and per body the Consts left
    float32 because a value lies outside the half range (a Cast follows
    them), with their largest magnitude.
    """
    from amp_rewrite.graph import tensors

    graph = ctx.graph
    folded: set[int] = set()
    out_of_range: dict[int, dict[str, float]] = {}
    converter = tensors.HalfConverter(ctx.target_dtype)
    for i, op in enumerate(graph.ops):
        if op != "Const" or ctx.skip_reason[i] is not None:
            continue
        node = graph.nodes[i]
        if node.attr["dtype"].type != DT_FLOAT:
            continue
        consumers = graph.consumers(i)
        if not consumers or not all(graph.input_vertex(d, k) in painting.allow for d, k in consumers):
            continue
        peak = converter.convert_const(node)
        if peak is not None:
            out_of_range.setdefault(graph.body_of[i], {})[node.name] = peak
            continue
        folded.add(i)
    return folded, out_of_range


class NewCast(NamedTuple):
    """A Cast the rewrite adds: its body, name, input, types, device, and the node it reads."""

    body: int
    name: str
    tensor: str
    src_type: int
    dst_type: int
    device: str
    source: int


def insert_casts(ctx: PaintContext, painting: Painting, was_float32: list[bool],
                 folded: set[int]) -> tuple[list[NewCast], dict]:
    """Rewires each float32 source port whose consumers' colour differs from its own through one Cast.

    Returns the new Casts, not yet in their bodies (a NodeDef each is written
    only for those kept), and our half → float32 Casts by (body, name) with
    the (node, input) pairs they feed.
    """
    graph = ctx.graph
    names: dict[int, NamesInUse] = {}
    new_nodes: list[NewCast] = []
    widening = {}
    allow, in_vids = painting.allow, graph.in_vids
    for src, port, consumers in graph.edges.by_source_port():
        if src in folded:
            continue
        src_vid = graph.output_vertex(src, port)
        if src_vid is not None and not was_float32[src_vid]:
            continue
        src_allow = src_vid in allow
        needing = []
        for dst, k in consumers:
            dst_vids = in_vids[dst]
            dst_vid = None if dst_vids is None else dst_vids[k]
            if src_vid is None and (dst_vid is None or not was_float32[dst_vid]):
                continue  # unknown producer, and nothing says this edge is float32
            if (dst_vid in allow) != src_allow:
                needing.append((dst, k))
        if not needing:
            continue
        upstream = None if src_allow else _half_input_of_widening_cast(ctx, src)
        if upstream is not None:
            # The widening is exact, so its half input is the value a new Cast back
            # to half would give: half -> Cast(f32) -> Cast(half) -> op becomes half -> op.
            for dst, k in needing:
                graph.nodes[dst].input[k] = upstream
            continue
        dst_type = DT_FLOAT if src_allow else ctx.target_dtype
        src_type = ctx.target_dtype if src_allow else DT_FLOAT
        source = graph.nodes[src]
        body_id = graph.body_of[src]
        body = graph.bodies[body_id]
        taken = names.get(body_id)
        if taken is None:
            taken = names[body_id] = NamesInUse(body.index)
        name = unique_name(f"{source.name}-{port}-{_CAST_WORD[dst_type]}-{CAST_SUFFIX}", taken)
        cast = NewCast(body_id, name, graph.tensor_ref(src, port), src_type, dst_type, source.device, src)
        new_nodes.append(cast)
        ref = name if body.is_main else f"{name}:y:0"
        for dst, k in needing:
            graph.nodes[dst].input[k] = ref
        if dst_type == DT_FLOAT:
            widening[(body_id, name)] = (cast, needing)
    return new_nodes, widening


def _half_input_of_widening_cast(ctx: PaintContext, src: int) -> str | None:
    """The input of node ``src`` when it is an existing ``half -> float32`` Cast of the target type; else None."""
    graph = ctx.graph
    node = graph.nodes[src]
    if (graph.ops[src] != "Cast" or node.attr["SrcT"].type != ctx.target_dtype
            or node.attr["DstT"].type != DT_FLOAT or not graph.inputs(src)):
        return None
    return graph.tensor_ref(*graph.inputs(src)[0])


def bypass_widening_casts(ctx: PaintContext, widening: dict[tuple[int, str], tuple[NewCast, list]]) -> set:
    """Lets a Cast read past one of our half → float32 Casts: ``half -> f32 -> X`` becomes ``half -> X``.

    Widening is exact, so casting the half value straight to X gives the same
    result.

    Args:
        widening: our half → float32 Casts by (body, name), with the (node, input) pairs reading them.

    Returns:
        The (body, name) of our Casts left with no consumer.
    """
    graph = ctx.graph
    dead = set()
    for name, (cast, consumers) in widening.items():
        bypassed = 0
        for dst, k in consumers:
            node = graph.nodes[dst]
            if graph.ops[dst] == "Cast" and k == 0 and not ctx.is_preserved(dst):
                node.input[0] = cast.tensor
                node.attr["SrcT"].type = cast.src_type
                bypassed += 1
        if bypassed == len(consumers):
            dead.add(name)
    return dead


def _write_cast(node, cast: NewCast) -> None:
    """Fills ``node``, a NodeDef just added to its body, with ``cast``."""
    node.name = cast.name
    node.op = "Cast"
    node.input.append(cast.tensor)
    node.device = cast.device
    node.attr["SrcT"].type = cast.src_type
    node.attr["DstT"].type = cast.dst_type
    node.attr["Truncate"].b = False
