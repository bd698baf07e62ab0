"""FLOP accounting for MatMul- and convolution-type ops, to say how much math runs in half.

Shapes come from TensorFlow's shape inference (the graph is imported into a
scratch ``tf.Graph``; each library function is built from its FunctionDef).
A graph TensorFlow cannot import (:func:`amp_rewrite.graph.importable.import_blocker`
says why, before anything is imported) has no FLOP share.
The import goes through TensorFlow's C API and wraps only the MatMul/Conv ops
and their producers as Python ``Operation`` objects: building the Python view
of every node would cost ten times the rewrite itself on a large graph.
Unknown dimensions, typically the batch, count as 1: the share is a ratio,
and a batch dimension scales every op alike. An op inside a function counts
once, whatever the number of calls or loop iterations, which no static view
can know.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.graph.facts import DT_BFLOAT16, DT_HALF
from amp_rewrite.graph.importable import import_blocker

logger = logging.getLogger(__name__)

_MATMULS = {"MatMul", "_FusedMatMul"}
_BATCH_MATMULS = {"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"}
_CONVS = {"Conv2D", "Conv3D", "_FusedConv2D", "FusedPadConv2D"}
_CONV_INPUT_GRADS = {"Conv2DBackpropInput", "Conv3DBackpropInput", "Conv3DBackpropInputV2"}
_CONV_FILTER_GRADS = {"Conv2DBackpropFilter", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2"}
_DEPTHWISE = {"DepthwiseConv2dNative": "forward",
              "DepthwiseConv2dNativeBackpropInput": "input_grad",
              "DepthwiseConv2dNativeBackpropFilter": "filter_grad"}
FLOP_OPS = (_MATMULS | _BATCH_MATMULS | _CONVS | _CONV_INPUT_GRADS | _CONV_FILTER_GRADS
            | set(_DEPTHWISE) | {"Einsum"})


def _dims(shape) -> list[int] | None:
    if shape.dims is None:
        return None
    return [d if d is not None and d >= 0 else 1 for d in shape.as_list()]


def _numel(dims: list[int]) -> int:
    return math.prod(dims) if dims else 1


def op_flops(op) -> int | None:
    """FLOPs (2 per multiply-add) of one ``tf.Operation``, or None when shapes are unknown."""
    kind = op.type
    ins: list[Any] = [_dims(t.shape) for t in op.inputs]  # None where unknown: indexing it raises TypeError
    out: Any = _dims(op.outputs[0].shape) if op.outputs else None
    try:
        if kind in _MATMULS:
            a = ins[0]
            k = a[0] if op.get_attr("transpose_a") else a[1]
            return 2 * _numel(out) * k
        if kind in _BATCH_MATMULS:
            a = ins[0]
            k = a[-2] if op.get_attr("adj_x") else a[-1]
            return 2 * _numel(out) * k
        if kind in _CONVS:
            return 2 * _numel(out) * _numel(ins[1][:-1])
        if kind in _CONV_INPUT_GRADS:
            return 2 * _numel(ins[2]) * _numel(ins[1][:-1])
        if kind in _CONV_FILTER_GRADS:
            return 2 * _numel(ins[2]) * _numel(out[:-1])
        if kind in _DEPTHWISE:
            filt = out if _DEPTHWISE[kind] == "filter_grad" else ins[1]
            grad = out if _DEPTHWISE[kind] == "forward" else ins[2]
            return 2 * _numel(grad) * filt[0] * filt[1]
        if kind == "Einsum":
            return _einsum_flops(op.get_attr("equation"), ins)
    except (TypeError, IndexError, ValueError):
        return None
    return None


def _einsum_flops(equation, ins) -> int | None:
    if isinstance(equation, bytes):
        equation = equation.decode()
    lhs = equation.split("->")[0]
    sizes: dict[str, int] = {}
    for spec, dims in zip(lhs.split(","), ins):
        if dims is None or "." in spec or len(spec) != len(dims):
            return None
        for letter, size in zip(spec, dims):
            sizes[letter] = max(sizes.get(letter, 1), size)
    return 2 * _numel(list(sizes.values()))


def half_flop_share(graph_def) -> float | None:
    """The share of MatMul/Conv FLOPs whose op computes in float16 or bfloat16.

    Returns None when the graph holds no such op with a known shape, or when
    TensorFlow cannot import it (an unregistered op, for instance).
    """
    ops = imported_ops(graph_def, FLOP_OPS)
    if ops is None:
        return None
    total = half = 0
    for op in ops.values():
        flops = op_flops(op)
        if flops is None:
            continue
        total += flops
        if op.outputs and op.outputs[0].dtype.as_datatype_enum in (DT_HALF, DT_BFLOAT16):
            half += flops
    return half / total if total else None


def imported_ops(graph_def, kinds) -> dict | None:
    """The nodes whose op is in ``kinds`` as ``tf.Operation`` objects with inferred shapes.

    Keys are the node's name, or ``function::node`` for a node of a library
    function (each function is built once, on its own, from its FunctionDef).
    Returns None when TensorFlow cannot import the graph; a function it
    cannot build is left out.
    """
    blocker = import_blocker(graph_def)
    if blocker:
        logger.debug("shapes unknown: %s", blocker)
        return None
    try:
        main_ops = _imported_main_ops(graph_def, kinds)
    except Exception as exc:  # noqa: BLE001 - any import failure means "unknown"
        logger.debug("shapes unknown: graph does not import: %s", exc)
        return None
    found = {op.name: op for op in main_ops if op.type in kinds}
    found.update((name, op) for name, op in _function_ops(graph_def, kinds) if op.type in kinds)
    return found


def _imported_main_ops(graph_def, kinds) -> list:
    """The main graph's ops of ``kinds``, imported with shapes; only they and their producers become Python ops."""
    wanted = [node.name for node in graph_def.node if node.op in kinds]
    return tf_internals.import_selected_ops(graph_def, wanted) if wanted else []


def _function_ops(graph_def, kinds) -> list[tuple[str, Any]]:
    """(``function::node``, op) for every op of each library function that holds an op of ``kinds``."""
    ops: list[tuple[str, Any]] = []
    for fdef in graph_def.library.function:
        if not any(node.op in kinds for node in fdef.node_def):
            continue
        prefix = fdef.signature.name + "::"
        try:
            ops.extend((prefix + op.name, op) for op in tf_internals.function_def_to_graph(fdef).get_operations())
        except Exception as exc:  # noqa: BLE001 - a function we cannot build counts as unknown
            logger.debug("shapes in function %s unknown: %s", fdef.signature.name, exc)
    return ops
