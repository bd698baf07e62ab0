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
    value = const_value(tensor_proto)
    if value.size == 0:
        return 0.0
    return float(np.max(np.abs(value.astype(np.float64))))


def _numpy_type(dtype: int):
    if dtype == DT_HALF:
        return np.float16
    if dtype == DT_BFLOAT16:
        import ml_dtypes

        return ml_dtypes.bfloat16
    raise ValueError(f"not a half type: {dtype}")


def convert_const(node, dtype: int) -> None:
    """Retypes a float32 Const node to ``dtype`` (float16 or bfloat16), converting its value."""
    value = const_value(node.attr["value"].tensor).astype(_numpy_type(dtype))
    proto = _tensor_util().make_tensor_proto(value, shape=value.shape)
    node.attr["value"].tensor.CopyFrom(proto)
    node.attr["dtype"].type = dtype
