"""Reading and converting the values of Const nodes.

A TensorProto holds its values either as raw bytes (``tensor_content``) or in
a typed repeated field; when the field holds fewer values than the shape,
the last one repeats (a *splat*: ``tf.constant(0.5, shape=[4096, 4096])`` is
one float). Values are read as stored, never expanded, so a splat stays a
splat when it is converted and a huge one costs nothing.
"""

from __future__ import annotations

import math

import numpy as np

from amp_rewrite.errors import GraphError
from amp_rewrite.graph_facts import DT_BFLOAT16, DT_FLOAT, DT_HALF


def _tensor_util():
    from tensorflow.python.framework import tensor_util

    return tensor_util


def const_value(tensor_proto) -> np.ndarray:
    """The numpy value of a TensorProto (a splat is expanded: use for small tensors only)."""
    return _tensor_util().MakeNdarray(tensor_proto)


def _numel(tensor_proto) -> int:
    dims = [d.size for d in tensor_proto.tensor_shape.dim]
    if any(d < 0 for d in dims):
        raise ValueError(f"shape {dims} has an unknown dimension")
    return math.prod(dims)


def stored_float_values(tensor_proto, where: str = "") -> np.ndarray:
    """The float32 values a float TensorProto stores, without expanding a splat.

    Raises:
        GraphError: the stored bytes or values do not fit the shape (``where``
            names the node).
    """
    try:
        if tensor_proto.dtype != DT_FLOAT:
            raise ValueError(f"the tensor is DataType {tensor_proto.dtype}, the node says float32")
        numel = _numel(tensor_proto)
        if tensor_proto.tensor_content:
            content = tensor_proto.tensor_content
            if len(content) != 4 * numel:
                raise ValueError(f"tensor_content holds {len(content)} bytes, shape "
                                 f"{[d.size for d in tensor_proto.tensor_shape.dim]} of float32 needs {4 * numel}")
            return np.frombuffer(content, dtype="<f4")
        values = np.asarray(tensor_proto.float_val, dtype=np.float32)
        if values.size > numel:
            raise ValueError(f"holds {values.size} values for a shape of {numel} elements")
        return values
    except ValueError as exc:
        raise GraphError(f"{where}: value does not decode: {exc}") from None


def max_abs(tensor_proto, where: str = "") -> float:
    """The largest finite |value| of a float32 TensorProto (0.0 when none is finite).

    NaN and infinities convert to half exactly, so only finite values can
    leave the half range.
    """
    values = stored_float_values(tensor_proto, where)
    finite = values[np.isfinite(values)]
    # max and -min are exact in float32 and need no |value| temporary.
    return float(max(finite.max(), -finite.min())) if finite.size else 0.0


def _numpy_type(dtype: int):
    if dtype == DT_HALF:
        return np.float16
    if dtype == DT_BFLOAT16:
        import ml_dtypes

        return ml_dtypes.bfloat16
    raise ValueError(f"not a half type: {dtype}")


def convert_const(node, dtype: int) -> None:
    """Retypes a float32 Const node to ``dtype`` (float16 or bfloat16), converting its value.

    Values stored as bytes stay bytes; values stored in the repeated field (a
    splat among them) go to ``half_val`` as they were, with the same shape.
    """
    tensor = node.attr["value"].tensor
    values = stored_float_values(tensor, f"node {node.name} (op Const)").astype(_numpy_type(dtype))
    shape = type(tensor.tensor_shape)()
    shape.CopyFrom(tensor.tensor_shape)
    was_bytes = bool(tensor.tensor_content)
    tensor.Clear()
    tensor.dtype = dtype
    tensor.tensor_shape.CopyFrom(shape)
    if was_bytes:
        tensor.tensor_content = values.view(np.uint16).astype("<u2").tobytes()
    else:
        tensor.half_val.extend(int(bits) for bits in values.view(np.uint16))
    node.attr["dtype"].type = dtype
