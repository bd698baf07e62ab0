"""Fusions the kernel library makes only when both ops hold one dtype: the rewrite keeps them together.

On a CPU, Grappler's remapper hands oneDNN a convolution's filter gradient
and its bias gradient as one kernel (``_MklNativeConv2DBackpropFilterWithBias``)
when both read the same gradient tensor. The op lists make the filter
gradient (``Conv2DBackpropFilter``) half, an allow op, and leave the bias
gradient (``BiasAddGrad``, an infer op) float32 wherever the gradient
reaching it comes through a float32 op (a normalization's statistics, the
loss): the filter gradient then reads a Cast of the gradient, the bias
gradient the gradient itself, and the two run apart. In ResNet-50 on a
Xeon with AMX that costs the bfloat16 step about 30 ms: the unfused filter
gradient is slower than the fused one, and the bias gradient runs alone.

So, for bfloat16 on a CPU, the rule
:func:`~amp_rewrite.paint.rules.keep_bias_gradients_beside_their_filter_gradients`
paints a bias gradient that reads the very tensor an
ALLOW filter gradient reads as its gradient (input 2) ALLOW too (this module finds them):
both then read the one Cast, and the remapper fuses them as it does under
Keras's ``mixed_bfloat16`` policy. The bias gradient's values are no less
precise than the filter gradient's beside it, which reads the same
bfloat16 values.
"""

from __future__ import annotations

from collections.abc import Iterator, Set

from amp_rewrite.graph.facts import DT_BFLOAT16
from amp_rewrite.paint.context import PaintContext

#: The filter gradients oneDNN fuses with a bias gradient, and the input ordinal of their gradient.
FILTER_GRADIENTS = {"Conv2DBackpropFilter": 2}


def bias_gradients_beside_filter_gradients(ctx: PaintContext, allow: Set[int]) -> Iterator[tuple[int, int, str]]:
    """Each bias gradient vertex not in ``allow`` that reads the gradient a filter gradient in ``allow`` reads.

    Yields ``(bias gradient vertex, filter gradient vertex, filter gradient's name)``;
    nothing unless the target is bfloat16 on a CPU.
    """
    if ctx.target_dtype != DT_BFLOAT16 or ctx.device_type != "CPU":
        return
    graph = ctx.graph
    for node, op in enumerate(graph.ops):
        if op != "BiasAddGrad":
            continue
        vid = graph.vertex_of(node, "T")
        inputs = graph.inputs(node)
        if vid is None or vid in allow or not inputs or not ctx.can_convert(vid):
            continue
        source, port = inputs[0]
        for consumer, ordinal in graph.consumers(source, port):
            partner = graph.vertex_of(consumer, "T")
            if partner is not None and FILTER_GRADIENTS.get(graph.ops[consumer]) == ordinal and partner in allow:
                yield vid, partner, graph.nodes[consumer].name
                break
