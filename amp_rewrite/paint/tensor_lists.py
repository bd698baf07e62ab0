"""Data structures behind a handle (TensorLists, TensorArrays, stacks): their ops share one element type.

The data-structure ops reached from one handle form a
:class:`TensorListCluster`. :func:`find_tensor_list_clusters` finds the
clusters before the painting rules run, and returns with them an
element-type edge from each writer to each of its readers, which
:func:`amp_rewrite.pipeline.paint` adds to the view so paint flows through
the structure. Nothing here paints: the rules ``deny_escaping_tensor_lists``
and ``match_tensor_list_clusters`` (:mod:`amp_rewrite.paint.rules`) give each
cluster one colour.
"""

from __future__ import annotations

from dataclasses import dataclass

from amp_rewrite.graph.facts import DT_FLOAT, DT_RESOURCE, DT_VARIANT
from amp_rewrite.graph.typed_graph import TypedGraph
from amp_rewrite.paint.context import PaintContext

# Ops the tensor-list rule cannot see past: a list handle that reaches one of
# these may be read or written somewhere this graph does not show.
_OPAQUE_HANDLE_OPS = frozenset({"OptionalFromValue", "OptionalGetValue", "Placeholder"})
_TENSOR_LIST_READERS = frozenset({
    "TensorListConcat", "TensorListConcatV2", "TensorListGather",
    "TensorListGetItem", "TensorListPopBack", "TensorListStack",
})
_TENSOR_LIST_WRITERS = frozenset({
    "TensorListFromTensor", "TensorListPushBack", "TensorListPushBackBatch",
    "TensorListScatter", "TensorListScatterV2", "TensorListScatterIntoExistingList",
    "TensorListSetItem", "TensorListSplit",
})


@dataclass(frozen=True)
class TensorListCluster:
    """The element-type vertices of the data-structure ops that share one handle.

    ``escapes``: the handle reaches something the rewrite cannot see through,
    or one of the ops may not be changed, so the element type stays float32.
    """

    vertices: tuple[int, ...]
    escapes: bool


def find_tensor_list_clusters(ctx: PaintContext) -> tuple[list[TensorListCluster], list[tuple[int, int]]]:
    """Groups the data-structure ops that share a handle, so they can share one element type.

    Three families hold tensors behind a handle: TensorLists (a variant
    handle), and the TensorArrayV3 and StackV2 ops TF1 loops and their
    gradients use (a resource handle; ``TensorArrayGradV3`` makes a gradient
    array of the same element type, so it joins its source's cluster). A
    cluster escapes when its handle reaches something the rule cannot see
    through (a placeholder, a fetch, an opaque call, ``_Arg``/``_Retval`` of
    the graph itself, or any other op that takes a resource handle), or when
    one of its ops may not be changed.

    Returns:
        The clusters, and an element-type edge (writer, reader) for every
        writer → reader pair of a cluster that the view does not join yet.
        Nothing is changed here: :func:`amp_rewrite.pipeline.paint` adds the
        edges to the view before the rules run, so paint flows through the
        structure.
    """
    graph = ctx.graph
    candidates = {i: _element_vertex(ctx, i) for i, op in enumerate(graph.ops)
                  if op in _ELEMENT_ATTR or "TensorList" in op}
    element = {i: v for i, v in candidates.items() if v is not None}
    clustered: set[int] = set()
    clusters: list[TensorListCluster] = []
    edges: dict[tuple[int, int], None] = {}  # a dict keeps the order found and drops repeats
    for node_idx in sorted(element):
        if node_idx in clustered or ctx.skip_reason[node_idx] is not None:
            continue
        handles = _handle_vertices(graph, node_idx)
        escapes: list[int] = []

        def follows(v: int) -> bool:
            i = graph.vertex_node[v]
            if graph.dtype(v) == DT_VARIANT or _carries_handles(ctx, i):
                return True
            escapes.append(v)  # noqa: B023 -- called by graph.reach within this iteration only
            return False

        reached = graph.reach(handles, forward=True, backward=True, enter=follows)
        members = sorted({graph.vertex_node[v] for v in reached} & element.keys())
        opaque = escapes or any(_opaque_handle(ctx, graph.vertex_node[v]) for v in reached)
        unprocessable = any(ctx.skip_reason[m] is not None for m in members)
        clustered.update(members)
        clusters.append(TensorListCluster(tuple(element[m] for m in members), escapes=bool(opaque or unprocessable)))
        edges.update(dict.fromkeys(_writer_reader_edges(ctx, members, element)))
    return clusters, list(edges)


# Element-type attr of the resource-handle data structures.
_ELEMENT_ATTR = {
    "StackV2": "elem_type", "StackPushV2": "T", "StackPopV2": "elem_type",
    "TensorArrayV3": "dtype", "TensorArrayWriteV3": "T", "TensorArrayReadV3": "dtype",
    "TensorArrayGatherV3": "dtype", "TensorArrayScatterV3": "T", "TensorArrayConcatV3": "dtype",
    "TensorArraySplitV3": "T",
}
_STRUCTURE_WRITERS = _TENSOR_LIST_WRITERS | {
    "StackPushV2", "TensorArrayWriteV3", "TensorArrayScatterV3", "TensorArraySplitV3"}
_STRUCTURE_READERS = _TENSOR_LIST_READERS | {
    "StackPopV2", "TensorArrayReadV3", "TensorArrayGatherV3", "TensorArrayConcatV3"}
# Ops a resource handle of a data structure may pass through without escaping.
_HANDLE_CARRIERS = frozenset({
    "Enter", "RefEnter", "Exit", "RefExit", "Merge", "RefMerge", "Switch", "RefSwitch",
    "NextIteration", "RefNextIteration", "Identity", "IdentityN", "TensorArrayGradV3",
    "TensorArraySizeV3", "TensorArrayCloseV3", "StackCloseV2",
})


def _element_vertex(ctx: PaintContext, node_idx: int) -> int | None:
    """The float32 element-type vertex of a data-structure op, or None."""
    graph = ctx.graph
    op = graph.ops[node_idx]
    if op in _ELEMENT_ATTR:
        v = graph.vertex_of(node_idx, _ELEMENT_ATTR[op])
        return v if v is not None and graph.dtype(v) == DT_FLOAT else None
    if "TensorList" not in op:
        return None
    for v in graph.node_vertices[node_idx]:
        attr = graph.vertex_attr[v]
        if attr.name and attr.index < 0 and graph.dtype(v) == DT_FLOAT:
            return v
    return None


def _handle_vertices(graph: TypedGraph, node_idx: int) -> list[int]:
    return [v for v in graph.node_vertices[node_idx] if graph.vertex_attr[v].fixed in (DT_VARIANT, DT_RESOURCE)]


def _carries_handles(ctx: PaintContext, node_idx: int) -> bool:
    op = ctx.graph.ops[node_idx]
    return op in _ELEMENT_ATTR or op in _HANDLE_CARRIERS or node_idx in ctx.boundary


def _writer_reader_edges(ctx: PaintContext, members: list[int], element: dict[int, int]):
    """The (writer, reader) element-vertex pairs of a cluster that the view does not join yet."""
    graph = ctx.graph
    for reader in members:
        if graph.ops[reader] not in _STRUCTURE_READERS:
            continue
        handles = _handle_vertices(graph, reader)
        for v in graph.reach(handles, forward=False, backward=True, enter=ctx.processable):
            writer = graph.vertex_node[v]
            if graph.ops[writer] in _STRUCTURE_WRITERS and writer in element:
                src, dst = element[writer], element[reader]
                if dst not in graph.fanout[src]:
                    yield src, dst


def _opaque_handle(ctx: PaintContext, i: int) -> bool:
    """Whether a value reaching node ``i`` may be used somewhere the view does not show."""
    graph = ctx.graph
    op = graph.ops[i]
    if ctx.is_preserved(i):
        return True  # fetched: the caller may read the list
    if op in ("_Arg", "_Retval"):
        return i not in graph.virtual
    if op in _OPAQUE_HANDLE_OPS or i in graph.opaque_calls:
        return True
    return graph.registry.is_library_function(op) and i not in ctx.boundary
