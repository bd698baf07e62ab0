"""Reading and converting the values of Const nodes."""

from __future__ import annotations

import numpy as np

from amp_rewrite.typed_graph import DT_BFLOAT16, DT_HALF


def _tensor_util():
    from tensorflow.python.framework import tensor_util

    return tensor_util


def const_value(tensor_proto) -> np.ndarray:
    """The numpy value of a TensorProto."""
    return _tensor_util().MakeNdarray(tensor_proto)


def max_abs(tensor_proto) -> float:
    """The largest finite |value| in a float TensorProto (inf and NaN count as infinite)."""
    return max_abs_of(const_value(tensor_proto))


def max_abs_of(value: np.ndarray) -> float:
    """:func:`max_abs` of an array already read (NaN if it holds a NaN)."""
    if value.size == 0:
        return 0.0
    if value.dtype != np.float32:
        value = value.astype(np.float64)
    # max and -min are exact in float32 and need no |value| temporary.
    return float(max(value.max(), -value.min()))


def _numpy_type(dtype: int):
    if dtype == DT_HALF:
        return np.float16
    if dtype == DT_BFLOAT16:
        import ml_dtypes

        return ml_dtypes.bfloat16
    raise ValueError(f"not a half type: {dtype}")


def convert_const(node, dtype: int, value: np.ndarray | None = None) -> None:
    """Retypes a float32 Const node to ``dtype`` (float16 or bfloat16), converting its value.

    ``value`` is the Const's value when the caller has already read it.
    """
    if value is None:
        value = const_value(node.attr["value"].tensor)
    value = value.astype(_numpy_type(dtype))
    proto = _tensor_util().make_tensor_proto(value, shape=value.shape)
    node.attr["value"].tensor.CopyFrom(proto)
    node.attr["dtype"].type = dtype
