"""Cast insertion: shared, named from the source, no round trips; Const folding."""

import numpy as np
import tensorflow as tf
from helpers import F16, F32, amp, assert_same_outputs_within_half, casts, half_nodes, rng, tf1


def test_cast_names_derive_from_the_source_tensor_and_copy_its_device():
    g = tf.Graph()
    with g.as_default():
        with tf.device("/device:CPU:0"):
            x = tf1.placeholder(tf.float32, [4, 4], name="x")
        y = tf.matmul(x, x, name="mm")
        tf.reduce_sum(y, name="total")
    out = amp(g.as_graph_def(), ["total"]).graph_def
    by_name = {c.name: c for c in casts(out)}
    assert set(by_name) == {"x-0-CastToFp16-AmpRewrite", "mm-0-CastToFp32-AmpRewrite"}
    assert by_name["x-0-CastToFp16-AmpRewrite"].device == "/device:CPU:0"
    assert by_name["x-0-CastToFp16-AmpRewrite"].attr["DstT"].type == F16


def test_const_read_only_by_half_ops_becomes_a_half_const():
    g = tf.Graph()
    weights = rng().standard_normal((4, 4)).astype(np.float32)
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.constant(weights, name="w")
        tf.reduce_sum(tf.matmul(x, w, name="mm"), name="total")
    gd = g.as_graph_def()
    result = amp(gd, ["total"])
    w_node = next(n for n in result.graph_def.node if n.name == "w")
    assert w_node.attr["dtype"].type == F16
    assert result.applied.folded_consts == ["w"]
    assert not any(c.input[0] == "w" for c in casts(result.graph_def))
    np.testing.assert_array_equal(tf.make_ndarray(w_node.attr["value"].tensor), weights.astype(np.float16))
    assert_same_outputs_within_half(gd, result.graph_def, ["total"], {"x": weights}, rtol=3e-2, atol=5e-2)


def _graph_with_big_const():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2, 2], name="x")
        big = tf.constant([[1e5, 0.0], [0.0, 1.0]], name="big")
        tf.reduce_sum(tf.matmul(x, big, name="mm"), name="total")
    return g.as_graph_def()


def test_const_out_of_half_range_keeps_its_reader_float32():
    result = amp(_graph_with_big_const(), ["total"])
    out = result.graph_def
    assert next(n for n in out.node if n.name == "mm").attr["T"].type == F32
    assert next(n for n in out.node if n.name == "big").attr["dtype"].type == F32
    assert not casts(out) and result.applied.consts_out_of_range == {}


def test_const_out_of_half_range_forced_to_half_keeps_float32_with_a_cast_and_is_reported():
    # Only UNSAFE_FORCE_ALL paints a reader of such a value half (paint/half_range.py keeps it float32).
    result = amp(_graph_with_big_const(), ["total"], level="UNSAFE_FORCE_ALL")
    assert next(n for n in result.graph_def.node if n.name == "mm").attr["T"].type == F16
    assert next(n for n in result.graph_def.node if n.name == "big").attr["dtype"].type == F32
    assert result.applied.consts_out_of_range == {"big": 1e5}
    assert any(c.input[0] == "big" for c in casts(result.graph_def))
    assert "100000" in result.report()["nodes"]["big"]["rule"]


def test_const_shared_with_a_float32_consumer_is_cast_not_converted():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.constant(np.ones((4, 4), np.float32), name="w")
        y = tf.matmul(x, w, name="mm")
        tf.identity(tf.reduce_sum(y) + tf.reduce_sum(tf.exp(w)), name="total")
    out = amp(g.as_graph_def(), ["total"]).graph_def
    assert next(n for n in out.node if n.name == "w").attr["dtype"].type == F32
    assert len([c for c in casts(out) if c.input[0] == "w"]) == 1


def test_user_cast_after_a_half_op_reads_the_half_value_directly():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        mm = tf.matmul(x, x, name="mm")
        as_int = tf.cast(mm, tf.int32, name="to_int")
        tf.identity(as_int, name="fetch_int")
        tf.identity(tf.reduce_sum(mm), name="fetch_sum")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch_int", "fetch_sum"]).graph_def
    to_int = next(n for n in out.node if n.name == "to_int")
    assert to_int.input[0] == "mm" and to_int.attr["SrcT"].type == F16
    # no half -> float32 Cast feeds another Cast
    names = {c.name: c for c in casts(out)}
    for c in casts(out):
        src = names.get(c.input[0])
        assert not (src is not None and src.attr["DstT"].type == F32 and src.attr["SrcT"].type == F16), c.name
    feeds = {"x": rng().standard_normal((4, 4)).astype(np.float32)}
    assert_same_outputs_within_half(gd, out, ["fetch_sum"], feeds)


def test_custom_op_neighbour_gets_a_cast_typed_from_the_known_side():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        mm = tf.matmul(x, x, name="mm")
        tf.identity(mm, name="out")
    gd = g.as_graph_def()
    custom = gd.node.add(name="custom", op="MyCustomOp")
    custom.input.append("mm")
    gd.node[[n.name for n in gd.node].index("out")].input[0] = "mm"
    out = amp(gd, ["out", "custom"]).graph_def
    custom = next(n for n in out.node if n.name == "custom")
    assert custom.input[0] == "mm-0-CastToFp32-AmpRewrite"
    assert "mm" in half_nodes(out)


def _matmul_with_const(weights):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2, weights.shape[0]], name="x")
        w = tf.constant(weights, name="w")
        tf.reduce_sum(tf.matmul(x, w, name="mm"), name="total")
    return g.as_graph_def()


def _edge_values() -> np.ndarray:
    """float32 values around every place float16 rounding changes behaviour, both signs."""
    points = [0.0, 1.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 65504.0, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11,
              2.0 ** -14 - 2.0 ** -25, 1e-8, 0.1, 3.14159, 1000.5]
    bits = np.array(points, np.float32).view(np.uint32)
    near = (bits[:, None].astype(np.int64) + np.arange(-3, 4)).clip(0, 0x477FE000).astype(np.uint32)
    values = near.ravel().view(np.float32)
    return np.concatenate([values, -values])


def test_large_const_folds_to_the_same_half_bits_as_numpy():
    values = np.concatenate([_edge_values(), rng().standard_normal(4096).astype(np.float32) * 0.05])
    weights = values.reshape(-1, 2)
    result = amp(_matmul_with_const(weights), ["total"])
    w = next(n for n in result.graph_def.node if n.name == "w")
    assert w.attr["dtype"].type == F16
    stored = np.frombuffer(w.attr["value"].tensor.tensor_content, "<u2")
    np.testing.assert_array_equal(stored, weights.astype(np.float16).view(np.uint16).ravel())


def test_float16_conversion_matches_numpy_on_random_bit_patterns():
    from amp_rewrite.graph.facts import DT_HALF
    from amp_rewrite.graph.tensors import HalfConverter

    bits = rng(3).integers(0, 2 ** 32, size=200_000, dtype=np.uint64).astype(np.uint32)
    in_range = bits[(bits & 0x7FFFFFFF) <= 0x477FE000]  # finite, |value| <= 65504
    values = in_range.view(np.float32)
    converter = HalfConverter(DT_HALF)
    np.testing.assert_array_equal(converter.convert(values), values.astype(np.float16).view(np.uint16))
    # NaN, infinities and values just past 65504 that round to it: numpy's result or "out of range".
    special = np.array([np.nan, np.inf, -np.inf, 65505.0, 65519.0, -65510.0, 70000.0], np.float32)
    for value in special:
        block = np.full(100, 0.5, np.float32)
        block[7] = value
        got = converter.convert(block)
        if np.isfinite(value):
            assert got is None and converter.peak == abs(float(value))
        else:
            np.testing.assert_array_equal(got, block.astype(np.float16).view(np.uint16))


def test_large_const_just_beyond_the_half_range_stays_float32():
    weights = np.full((64, 4), 0.25, np.float32)
    weights[10, 1] = -65510.0  # rounds to -65504 in half, yet lies beyond it
    result = amp(_matmul_with_const(weights), ["total"], level="UNSAFE_FORCE_ALL")
    assert next(n for n in result.graph_def.node if n.name == "w").attr["dtype"].type == F32
    assert result.applied.consts_out_of_range == {"w": 65510.0}
