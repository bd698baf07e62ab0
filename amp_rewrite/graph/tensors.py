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
from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF, HALF_MAX


def const_value(tensor_proto) -> np.ndarray:
    """The numpy value of a TensorProto (a splat is expanded: use for small tensors only)."""
    import tensorflow as tf

    return tf.make_ndarray(tensor_proto)


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
    return _stored(tensor_proto, where)[0]


def _stored(tensor_proto, where: str) -> tuple[np.ndarray, bool]:
    """The stored float32 values, and whether they are bytes (``tensor_content``)."""
    try:
        if tensor_proto.dtype != DT_FLOAT:
            raise ValueError(f"the tensor is DataType {tensor_proto.dtype}, the node says float32")
        numel = _numel(tensor_proto)
        content = tensor_proto.tensor_content  # each read copies the bytes: read once
        if content:
            if len(content) != 4 * numel:
                raise ValueError(f"tensor_content holds {len(content)} bytes, shape "
                                 f"{[d.size for d in tensor_proto.tensor_shape.dim]} of float32 needs {4 * numel}")
            return np.frombuffer(content, dtype="<f4"), True
        values = np.asarray(tensor_proto.float_val, dtype=np.float32)
        if values.size > numel:
            raise ValueError(f"holds {values.size} values for a shape of {numel} elements")
        return values, False
    except ValueError as exc:
        raise GraphError(f"{where}: value does not decode: {exc}") from None


def max_abs(tensor_proto, where: str = "") -> float:
    """The largest finite |value| of a float32 TensorProto (0.0 when none is finite).

    NaN and infinities convert to half exactly, so only finite values can
    leave the half range.
    """
    return _finite_peak(stored_float_values(tensor_proto, where))


def _finite_peak(values: np.ndarray) -> float:
    if not values.size:
        return 0.0
    # max and -min are exact in float32 and need no |value| temporary; only a
    # tensor holding NaN or an infinity pays for the copy of its finite values.
    top, bottom = values.max(), values.min()
    if not (np.isfinite(top) and np.isfinite(bottom)):
        finite = values[np.isfinite(values)]
        if not finite.size:
            return 0.0
        top, bottom = finite.max(), finite.min()
    return float(max(top, -bottom))


def _numpy_type(dtype: int):
    if dtype == DT_HALF:
        return np.float16
    if dtype == DT_BFLOAT16:
        import ml_dtypes

        return ml_dtypes.bfloat16
    raise ValueError(f"not a half type: {dtype}")


class HalfConverter:
    """Converts float32 Const values to float16 or bfloat16, keeping scratch buffers between Consts.

    :meth:`convert` gives a value's bits in the half type, or None when a
    finite value lies beyond the half range (``peak`` then says how far).
    float16 is converted by integer arithmetic on the float32 bits (round to
    nearest even, as numpy's cast): numpy's own cast handles one element at a
    time, and fresh temporaries cost more than the arithmetic. Elements the
    arithmetic does not cover (zeros, results below half's smallest normal),
    and values that are NaN, infinite or near the range's end, are converted
    by numpy, so every result is numpy's.
    """

    # float32 bit patterns (sign cleared): half's smallest normal 2**-14, and its largest finite 65504.
    _HALF_MIN_NORMAL_BITS = np.uint32(0x38800000)
    _HALF_MAX_BITS = np.uint32(0x477FE000)
    # Rebiases the exponent (127 -> 15) and adds the rounding bias 0xFFF, modulo 2**32.
    _REBIAS = np.uint32((0xFFF - ((127 - 15) << 23)) % 2**32)

    def __init__(self, dtype: int):
        self.dtype = dtype
        self.peak = 0.0
        self._bits = self._work = np.empty(0, np.uint32)
        self._half = np.empty(0, np.uint16)

    def convert_const(self, node) -> float | None:
        """Retypes a float32 Const node to the half type; None, or the peak |value| when out of range.

        A Const with a finite value beyond the half range is left as it is.
        """
        values, from_bytes = _stored(node.attr["value"].tensor, f"node {node.name} (op Const)")
        bits = self.convert(values)
        if bits is None:
            return self.peak
        _store(node, self.dtype, bits, from_bytes)
        return None

    def convert(self, values: np.ndarray) -> np.ndarray | None:
        """The half bits (``uint16``) of ``values`` (float32, as stored), or None if out of range.

        The bits may live in a buffer the next call reuses: store them first.
        """
        if self.dtype == DT_HALF and values.size >= 64:
            bits = self._float16_bits(values)
            if bits is not None:
                return bits
        self.peak = _finite_peak(values)
        if self.peak > HALF_MAX[self.dtype]:
            return None
        return values.astype(_numpy_type(self.dtype)).view(np.uint16)

    def _float16_bits(self, values: np.ndarray) -> np.ndarray | None:
        n = values.size
        if self._bits.size < n:
            self._bits, self._work = np.empty(n, np.uint32), np.empty(n, np.uint32)
            self._half = np.empty(n, np.uint16)
        x = values.view(np.uint32)
        magnitude, work, half = self._bits[:n], self._work[:n], self._half[:n]
        np.bitwise_and(x, np.uint32(0x7FFFFFFF), out=magnitude)
        if magnitude.max() > self._HALF_MAX_BITS:
            return None  # NaN, infinity, or near or beyond the range's end: numpy converts it
        below_normal = magnitude < self._HALF_MIN_NORMAL_BITS
        # Round to nearest even: add 0xFFF plus the lowest kept mantissa bit, then drop 13 bits.
        np.right_shift(magnitude, np.uint32(13), out=work)
        work &= np.uint32(1)
        work += magnitude
        work += self._REBIAS
        work >>= np.uint32(13)
        np.right_shift(x, np.uint32(16), out=magnitude)
        magnitude &= np.uint32(0x8000)
        work |= magnitude
        np.copyto(half, work, casting="unsafe")
        if below_normal.any():
            small = np.flatnonzero(below_normal)
            half[small] = values[small].astype(np.float16).view(np.uint16)
        return half


def _store(node, dtype: int, bits: np.ndarray, as_bytes: bool) -> None:
    """Retypes a Const node to ``dtype`` holding ``bits``, with the same shape.

    Values stored as bytes stay bytes; values stored in the repeated field (a
    splat among them) go to ``half_val`` as they were.
    """
    tensor = node.attr["value"].tensor
    shape = type(tensor.tensor_shape)()
    shape.CopyFrom(tensor.tensor_shape)
    tensor.Clear()
    tensor.dtype = dtype
    tensor.tensor_shape.CopyFrom(shape)
    if as_bytes:
        tensor.tensor_content = bits.astype("<u2", copy=False).tobytes()
    else:
        tensor.half_val.extend(bits.tolist())
    node.attr["dtype"].type = dtype
