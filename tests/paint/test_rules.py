"""Grappler's test catalogue: small graphs whose node names say the colour expected.

Each test checks every node's dtype after the rewrite, then runs the original
and rewritten graphs on the same inputs and compares within half tolerance.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    F16,
    F32,
    amp,
    assert_same_outputs_within_half,
    casts,
    half_nodes,
    node_types,
    rng,
    run,
    tf1,
    v1_control_flow,
)


def expect_half(graph_def, half, f32=()):
    """Every name in ``half`` is half, every name in ``f32`` is not."""
    got = half_nodes(graph_def)
    assert set(half) <= got, f"should be half: {sorted(set(half) - got)}"
    assert not set(f32) & got, f"should stay float32: {sorted(set(f32) & got)}"


def placeholder(shape=(8, 8), name="input"):
    return tf1.placeholder(tf.float32, shape, name=name)


def feed(shape=(8, 8), name="input", seed=0, scale=0.5):
    return {name: (rng(seed).standard_normal(shape) * scale).astype(np.float32)}


def test_graph_without_allow_ops_is_unchanged():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        y = tf.nn.relu(tf.math.log(tf.exp(x, name="deny1"), name="infer1"), name="clr1")
        tf.identity(y, name="fetch")
    result = amp(g.as_graph_def(), ["fetch"])
    assert result.graph_def == g.as_graph_def()
    assert result.converted == [] and result.casts == []


def test_simple_chain_converts_only_around_the_allow_op():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        deny1 = tf.exp(x, name="deny1")
        clr1 = tf.nn.relu(deny1, name="clr1")
        infer1 = tf.sqrt(clr1, name="infer1")
        clr2 = tf.nn.relu(infer1, name="clr2")
        allow1 = tf.matmul(clr2, clr2, name="allow1")
        clr3 = tf.nn.relu(allow1, name="clr3")
        infer2 = tf.math.log(clr3 + 1.0, name="infer2")
        clr4 = tf.nn.relu(infer2, name="clr4")
        deny2 = tf.exp(clr4, name="deny2")
        tf.nn.relu(deny2, name="clr5")
    gd = g.as_graph_def()
    out = amp(gd, ["clr5"]).graph_def
    expect_half(out, {"clr2", "allow1", "clr3"},
                {"deny1", "clr1", "infer1", "clr4", "deny2", "clr5"})
    assert_same_outputs_within_half(gd, out, ["clr5"], feed(scale=0.1))


def test_clear_ops_join_upstream_and_sideways_including_list_attrs():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        clr1 = tf.nn.relu(x, name="clr1")
        clr2 = tf.nn.relu(clr1, name="clr2")
        allow1 = tf.matmul(clr2, clr2, name="allow1")
        clr3 = tf.nn.relu(clr2, name="clr3")  # a sibling branch of the allow op
        tf.raw_ops.ShapeN(input=[clr3, allow1], name="clr4")
        shape = tf.raw_ops.ShapeN(input=[clr3, allow1], name="clr5")
        tf.identity(tf.cast(shape[0], tf.float32) + tf.reduce_sum(allow1), name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    expect_half(out, {"clr1", "clr2", "allow1", "clr3", "clr4", "clr5"})
    assert next(n for n in out.node if n.name == "clr5").attr["T"].type == F16
    assert_same_outputs_within_half(gd, out, ["fetch"], feed(scale=0.3))


def test_fetched_nodes_keep_float32():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        allow1 = tf.matmul(x, x, name="allow1")
        clr1 = tf.nn.relu(allow1, name="clr1")
        infer1 = tf.sqrt(clr1, name="infer1")
        deny1 = tf.exp(infer1 * 0.1, name="deny1")
        clr2 = tf.nn.relu(deny1, name="clr2")
        allow2 = tf.matmul(clr2, clr2, name="allow2")
        clr3 = tf.nn.relu(allow2, name="clr3")
        deny2 = tf.exp(clr3 * 0.01, name="deny2")
        tf.nn.relu(deny2, name="clr4")
    gd = g.as_graph_def()
    fetches = ["allow1", "clr2", "clr3", "clr4"]
    out = amp(gd, fetches).graph_def
    expect_half(out, {"allow2"}, {"allow1", "clr1", "infer1", "deny1", "clr2", "clr3", "deny2", "clr4"})
    assert_same_outputs_within_half(gd, out, fetches, feed(scale=0.5))


def test_nodes_placed_on_another_device_type_are_left_alone():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        with tf.device("/device:GPU:0"):
            allow1 = tf.matmul(x, x, name="allow1")
        clr1 = tf.nn.relu(allow1, name="clr1")
        allow2 = tf.matmul(clr1, clr1, name="allow2")
        tf.identity(allow2, name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    expect_half(out, {"clr1", "allow2"}, {"allow1"})
    # The GPU-pinned node cannot run here; drop the pin to compare numerics.
    for graph in (gd, out):
        for node in graph.node:
            node.device = ""
    assert_same_outputs_within_half(gd, out, ["fetch"], feed())


def test_identity_reading_a_ref_variable_stays_float32():
    g = tf.Graph()
    with g.as_default():
        var = tf1.Variable(tf.ones([8, 8]), use_resource=False, name="var")
        ident_var = tf.identity(var, name="ident_var")  # Identity(VariableV2)
        const = tf.constant(np.eye(8, dtype=np.float32), name="const")
        ident_const = tf.identity(const, name="ident_const")
        allow1 = tf.matmul(ident_var, ident_const, name="allow1")
        tf.identity(allow1, name="fetch")
        tf1.variables_initializer([var], name="init")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch", "init"]).graph_def
    # Python reads a ref variable through the Identity "var/read": it stays float32,
    # and the half conversion happens after it.
    expect_half(out, {"allow1", "ident_const", "ident_var"}, {"var/read", "var"})
    assert next(n for n in out.node if n.name == "var").attr["dtype"].type == F32
    want, = run(gd, ["fetch"], init="init")
    got, = run(out, ["fetch"], init="init")
    np.testing.assert_allclose(got, want, rtol=1e-2)


def test_fused_batch_norm_v1_becomes_v2_with_float_statistics():
    g = tf.Graph()
    with g.as_default():
        x = placeholder((2, 8, 8, 4))
        w = tf.constant(rng(1).standard_normal((3, 3, 4, 4)).astype(np.float32) * 0.3)
        allow1 = tf.nn.conv2d(x, w, strides=1, padding="SAME", name="allow1")
        scale = tf.constant(np.linspace(0.5, 1.5, 4, dtype=np.float32))
        offset = tf.constant(np.linspace(-0.1, 0.1, 4, dtype=np.float32))
        bn = tf.raw_ops.FusedBatchNorm(x=allow1, scale=scale, offset=offset,
                                       mean=tf.zeros([0]), variance=tf.zeros([0]),
                                       is_training=True, name="bng")
        allow2 = tf.nn.conv2d(bn[0], w, strides=1, padding="SAME", name="allow2")
        tf.identity(allow2, name="fetch")
        tf.identity(bn[1], name="fetch_mean")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch", "fetch_mean"]).graph_def
    node = next(n for n in out.node if n.name == "bng")
    assert node.op == "FusedBatchNormV2"
    assert node.attr["T"].type == F16 and node.attr["U"].type == F32
    assert_same_outputs_within_half(gd, out, ["fetch", "fetch_mean"], feed((2, 8, 8, 4)), rtol=3e-2, atol=3e-2)


def test_batch_norm_v1_not_converted_is_left_as_v1():
    g = tf.Graph()
    with g.as_default():
        x = placeholder((2, 4, 4, 2))
        bn = tf.raw_ops.FusedBatchNorm(x=tf.exp(x, name="deny1"), scale=tf.ones([2]), offset=tf.zeros([2]),
                                       mean=tf.zeros([0]), variance=tf.zeros([0]), name="bn")
        allow1 = tf.matmul(tf.reshape(bn[0], [8, 8]), tf.ones([8, 8]), name="allow1")
        tf.identity(allow1, name="fetch")
    out = amp(g.as_graph_def(), ["fetch"]).graph_def
    node = next(n for n in out.node if n.name == "bn")
    assert node.op == "FusedBatchNorm" and "U" not in node.attr


def test_list_and_repeated_type_attrs():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        allow1 = tf.matmul(x, x, name="allow1")
        ids = tf.raw_ops.IdentityN(input=[allow1, tf.constant([1, 2], name="ints")], name="clr1")
        infer1 = tf.math.add_n([ids[0], ids[0], allow1], name="infer1")
        allow2 = tf.matmul(infer1, infer1, name="allow2")
        tf.identity(allow2, name="fetch")
        tf.identity(ids[1], name="fetch_ints")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch", "fetch_ints"]).graph_def
    ident = next(n for n in out.node if n.name == "clr1")
    assert list(ident.attr["T"].list.type) == [F16, tf.int32.as_datatype_enum]
    expect_half(out, {"allow1", "infer1", "allow2"})
    assert_same_outputs_within_half(gd, out, ["fetch", "fetch_ints"], feed(scale=0.3))


def test_existing_cast_to_float_is_retargeted_to_half():
    g = tf.Graph()
    with g.as_default():
        b = tf1.placeholder(tf.bool, [8, 8], name="input")
        cst = tf.cast(b, tf.float32, name="cst")
        allow1 = tf.matmul(cst, cst, name="allow1")
        tf.identity(allow1, name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    cast = next(n for n in out.node if n.name == "cst")
    assert cast.attr["DstT"].type == F16
    assert len(casts(out)) == 2  # the user's cast, and one back to float32 for the fetch
    bools = {"input": rng().random((8, 8)) > 0.5}
    assert_same_outputs_within_half(gd, out, ["fetch"], bools)


def test_graph_already_in_half_gains_nothing():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        h = tf.cast(x, tf.float16, name="to_half")
        allow1 = tf.matmul(h, h, name="allow1")
        tf.cast(allow1, tf.float32, name="fetch")
    gd = g.as_graph_def()
    result = amp(gd, ["fetch"])
    assert result.graph_def == gd and result.casts == []


@pytest.mark.parametrize("op", ["Elu", "Erf", "Erfc", "Inv", "Log", "Log1p", "LogSoftmax", "Reciprocal",
                                "Sigmoid", "Softmax", "Softplus", "Sqrt", "Tanh"])
def test_unary_infer_op_between_two_matmuls_turns_half(op):
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        allow1 = tf.matmul(x, x, name="allow1")
        positive = tf.raw_ops.Abs(x=allow1, name="clr1") + 0.5 if op in ("Log", "Sqrt", "Inv", "Reciprocal",
                                                                           "Log1p") else allow1
        infer1 = getattr(tf.raw_ops, op)(**{"features" if op in ("Elu", "Softplus") else
                                            "logits" if op in ("Softmax", "LogSoftmax") else "x": positive},
                                         name="infer1")
        allow2 = tf.matmul(infer1, infer1, name="allow2")
        tf.identity(allow2, name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    expect_half(out, {"allow1", "infer1", "allow2"})
    assert_same_outputs_within_half(gd, out, ["fetch"], feed(scale=0.3), rtol=5e-2, atol=5e-2)


def test_fan_out_shares_one_cast_per_source_port():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        allow1 = tf.matmul(x, x, name="allow1")
        allow2 = tf.matmul(x, tf.transpose(x), name="allow2")
        tf.identity(allow1 + allow2, name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    to_half = [c for c in casts(out) if c.input[0] == "input"]
    assert len(to_half) == 1
    assert_same_outputs_within_half(gd, out, ["fetch"], feed())


def test_infer_after_allow_does_not_depend_on_node_order():
    def build(reverse: bool):
        g = tf.Graph()
        with g.as_default():
            x = placeholder()
            allow1 = tf.matmul(x, x, name="allow1")
            infer1 = tf.tanh(allow1, name="infer1")
            infer2 = tf.sigmoid(infer1, name="infer2")
            tf.identity(infer2, name="fetch")
        gd = g.as_graph_def()
        if reverse:
            nodes = list(gd.node)[::-1]
            del gd.node[:]
            gd.node.extend(nodes)
        return gd

    forward = half_nodes(amp(build(False), ["fetch"]).graph_def)
    backward = half_nodes(amp(build(True), ["fetch"]).graph_def)
    assert forward == backward == {"allow1", "infer1", "infer2"}


def test_deny_upstream_keeps_infer_float32():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        allow1 = tf.matmul(x, x, name="allow1")
        deny1 = tf.exp(x, name="deny1")
        infer1 = tf.add(allow1, deny1, name="infer1")  # fed by allow and deny
        tf.identity(infer1, name="fetch")
    out = amp(g.as_graph_def(), ["fetch"]).graph_def
    expect_half(out, {"allow1"}, {"infer1", "deny1"})


def test_conv_bias_relu_pool_network_runs_close_to_float32():
    g = tf.Graph()
    r = rng(2)
    with g.as_default():
        x = placeholder((2, 16, 16, 3))
        h = x
        for i, channels in enumerate((8, 16)):
            w = tf.constant(r.standard_normal((3, 3, h.shape[-1], channels)).astype(np.float32) * 0.2)
            h = tf.nn.conv2d(h, w, strides=1, padding="SAME", name=f"allow_conv{i}")
            h = tf.nn.bias_add(h, tf.constant(r.standard_normal(channels).astype(np.float32) * 0.1),
                               name=f"infer_bias{i}")
            h = tf.nn.relu(h, name=f"clr_relu{i}")
            h = tf.nn.max_pool2d(h, 2, 2, "VALID", name=f"clr_pool{i}")
        dw = tf.constant(r.standard_normal((3, 3, 16, 1)).astype(np.float32) * 0.2)
        h = tf.nn.depthwise_conv2d(h, dw, [1, 1, 1, 1], "SAME", name="allow_depthwise")
        parts = tf.split(h, 2, axis=-1, name="clr_split")
        h = tf.concat([tf.nn.relu(parts[0]), parts[1]], axis=-1, name="clr_concat")
        flat = tf.reshape(h, [2, -1], name="clr_reshape")
        w_fc = tf.constant(r.standard_normal((flat.shape[-1], 10)).astype(np.float32) * 0.1)
        logits = tf.matmul(flat, w_fc, name="allow_fc")
        tf.nn.softmax(logits, name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    expect_half(out, {"allow_conv0", "infer_bias0", "clr_relu0", "clr_pool0", "allow_conv1",
                      "allow_depthwise", "clr_split", "clr_concat", "clr_reshape", "allow_fc"})
    assert_same_outputs_within_half(gd, out, ["fetch"], feed((2, 16, 16, 3), scale=1.0))


def test_v1_loop_converts_whole_and_next_iteration_agrees_with_merge():
    g = tf.Graph()
    with g.as_default(), v1_control_flow():
        x = placeholder()
        w = tf.constant(np.eye(8, dtype=np.float32) * 0.9, name="w")

        def body(i, h):
            return i + 1, tf.nn.relu(tf.matmul(h, w, name="allow_loop"))

        _, h = tf1.while_loop(lambda i, h: i < 3, body, [tf.constant(0), x], name="loop")
        tf.identity(h, name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    ops = {n.name: n for n in out.node}
    for name, node in ops.items():
        if node.op in ("Merge", "NextIteration", "Switch", "Exit", "Enter") and "T" in node.attr \
                and node.attr["T"].type in (F32, F16) and "loop/" in name and "Const" not in name:
            if name.endswith(("Merge_1", "NextIteration_1", "Switch_1", "Exit_1")):
                assert node.attr["T"].type == F16, name
    merges = {n.name: n.attr["T"].type for n in out.node if n.op == "Merge"}
    for n in out.node:
        if n.op == "NextIteration":
            consumer_merges = [m for m in out.node if m.op == "Merge" and any(i == n.name for i in m.input)]
            assert all(merges[m.name] == n.attr["T"].type for m in consumer_merges)
    assert_same_outputs_within_half(gd, out, ["fetch"], feed(scale=0.5))


def test_deny_feeding_a_merge_forces_the_loop_variable_float32():
    g = tf.Graph()
    with g.as_default(), v1_control_flow():
        x = placeholder()
        deny1 = tf.exp(x * 0.1, name="deny1")

        def body(i, h):
            infer1 = tf.sqrt(tf.abs(h) + 0.1, name="infer1")
            return i + 1, tf.matmul(infer1, infer1, name="allow1") * 0.05

        _, h = tf1.while_loop(lambda i, h: i < 2, body, [tf.constant(0), deny1], name="loop")
        tf.identity(h, name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    # deny reaches Enter -> Merge -> Switch -> infer: the loop variable stays
    # float32, so its NextIteration must too, though it follows a half op.
    for n in out.node:
        if n.op in ("NextIteration", "Merge", "Enter", "Switch") and n.attr["T"].type != tf.int32.as_datatype_enum:
            assert n.attr["T"].type == F32, n.name
    assert "loop/allow1" in half_nodes(out)
    assert_same_outputs_within_half(gd, out, ["fetch"], feed(scale=0.5))


def tensor_list_between_matmuls() -> tf.Graph:
    """allow1 -> TensorListFromTensor -> TensorListGetItem -> allow2 -> fetch."""
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        allow1 = tf.matmul(x, x, name="allow1")
        handle = tf.raw_ops.TensorListFromTensor(tensor=allow1, element_shape=tf.constant([8]), name="tl_from")
        item = tf.raw_ops.TensorListGetItem(input_handle=handle, index=2, element_shape=tf.constant([8]),
                                            element_dtype=tf.float32, name="tl_get")
        tf.identity(tf.matmul(tf.reshape(item, [1, 8]), x, name="allow2"), name="fetch")
    return g


def test_tensor_list_writer_and_reader_share_the_element_type():
    gd = tensor_list_between_matmuls().as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    ops = {n.name: n for n in out.node}
    assert ops["tl_from"].attr["element_dtype"].type == F16
    assert ops["tl_get"].attr["element_dtype"].type == F16
    assert_same_outputs_within_half(gd, out, ["fetch"], feed(scale=0.5))


def test_tensor_list_whose_handle_is_fetched_stays_float32():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        allow1 = tf.matmul(x, x, name="allow1")
        handle = tf.raw_ops.TensorListFromTensor(tensor=allow1, element_shape=tf.constant([8]), name="tl_from")
        tf.identity(handle, name="fetch_handle")
        item = tf.raw_ops.TensorListGetItem(input_handle=handle, index=0, element_shape=tf.constant([8]),
                                            element_dtype=tf.float32, name="tl_get")
        tf.identity(item, name="fetch")
    out = amp(g.as_graph_def(), ["fetch", "fetch_handle"]).graph_def
    ops = {n.name: n for n in out.node}
    # the handle leaves through a fetch: whoever reads it expects float32 elements
    assert ops["tl_from"].attr["element_dtype"].type == F32
    assert ops["tl_get"].attr["element_dtype"].type == F32
    assert "allow1" in half_nodes(out)


def test_bfloat16_target_uses_its_own_lists():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        allow1 = tf.matmul(x, x, name="allow1")
        infer1 = tf.reduce_mean(allow1, axis=1, keepdims=True, name="infer1")  # deny in fp16, infer in bf16
        allow2 = tf.matmul(allow1 - infer1, x, name="allow2")
        tf.identity(allow2, name="fetch")
    gd = g.as_graph_def()
    fp16 = amp(gd, ["fetch"]).graph_def
    bf16 = amp(gd, ["fetch"], target="bfloat16").graph_def
    assert "infer1" not in half_nodes(fp16)
    assert "infer1" in half_nodes(bf16)
    assert node_types(bf16)["allow1"] == tf.bfloat16.as_datatype_enum
    assert_same_outputs_within_half(gd, bf16, ["fetch"], feed(scale=0.5), rtol=6e-2, atol=6e-2)


def gelu_tanh_ffn():
    """A feed-forward block with GELU in its tanh form, whose cube is ``Pow(h, 3)``: ``allow1 -> gelu -> allow2``."""
    g = tf.Graph()
    with g.as_default():
        x = placeholder((8, 16))
        w1 = tf.constant(rng(1).standard_normal((16, 32)).astype(np.float32) * 0.3, name="w1")
        w2 = tf.constant(rng(2).standard_normal((32, 16)).astype(np.float32) * 0.3, name="w2")
        h = tf.matmul(x, w1, name="allow1")
        cube = tf.pow(h, 3.0, name="cube")
        inner = tf.multiply(tf.add(h, 0.044715 * cube), np.sqrt(2 / np.pi).astype(np.float32), name="inner")
        gelu = tf.multiply(0.5 * h, 1.0 + tf.tanh(inner, name="tanh"), name="gelu")
        tf.identity(tf.matmul(gelu, w2, name="allow2"), name="fetch")
    return g.as_graph_def()


def test_gelu_in_tanh_form_leaves_no_float32_island_in_bfloat16():
    """bfloat16 has float32's exponent range, so GELU's cube cannot overflow: Pow joins the half ops around it."""
    gd = gelu_tanh_ffn()
    bf16 = amp(gd, ["fetch"], target="bfloat16").graph_def
    expect_half(bf16, ["allow1", "cube", "inner", "tanh", "gelu", "allow2"])
    assert len(casts(bf16)) == 2  # into allow1 and out of allow2 (the weights fold): none around the GELU
    assert_same_outputs_within_half(gd, bf16, ["fetch"], feed((8, 16)), rtol=6e-2, atol=6e-2)
    fp16 = amp(gd, ["fetch"]).graph_def
    expect_half(fp16, ["allow1", "allow2"], f32=["cube", "inner", "tanh", "gelu"])  # float16 can overflow


def test_tensor_list_push_and_pop_share_the_element_type():
    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        allow1 = tf.matmul(x, x, name="allow1")
        empty = tf.raw_ops.EmptyTensorList(element_shape=tf.constant([8, 8]), max_num_elements=-1,
                                           element_dtype=tf.float32, name="tl_empty")
        pushed = tf.raw_ops.TensorListPushBack(input_handle=empty, tensor=allow1, name="tl_push")
        _, popped = tf.raw_ops.TensorListPopBack(input_handle=pushed, element_shape=tf.constant([8, 8]),
                                                 element_dtype=tf.float32, name="tl_pop")
        allow2 = tf.matmul(popped, x, name="allow2")
        tf.identity(allow2, name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    ops = {n.name: n for n in out.node}
    assert ops["tl_push"].attr["element_dtype"].type == F16
    assert ops["tl_pop"].attr["element_dtype"].type == F16
    assert ops["tl_empty"].attr["element_dtype"].type == F16
    assert_same_outputs_within_half(gd, out, ["fetch"], feed(scale=0.5))


def test_tensor_lists_joined_by_concat_lists_form_one_cluster():
    g = tf.Graph()
    with g.as_default():
        x = placeholder((2, 8))
        allow1 = tf.matmul(x, tf.ones([8, 8]), name="allow1")
        lists = []
        for k in range(2):
            empty = tf.raw_ops.EmptyTensorList(element_shape=tf.constant([8]), max_num_elements=-1,
                                               element_dtype=tf.float32)
            batch = tf.stack([empty, empty])
            lists.append(tf.raw_ops.TensorListPushBackBatch(input_handles=batch, tensor=allow1,
                                                            name=f"tl_pushbatch{k}"))
        joined = tf.raw_ops.TensorListConcatLists(input_a=lists[0], input_b=lists[1], element_dtype=tf.float32,
                                                  name="tl_concat")
        stacked = tf.raw_ops.TensorListStack(input_handle=joined[0], element_shape=tf.constant([8]),
                                             element_dtype=tf.float32, name="tl_stack")
        allow2 = tf.matmul(stacked, tf.ones([8, 8]), name="allow2")
        tf.identity(allow2, name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    types = {n.name: n.attr["element_dtype"].type for n in out.node if "element_dtype" in n.attr}
    assert types["tl_pushbatch0"] == types["tl_pushbatch1"] == types["tl_concat"] == types["tl_stack"] == F16
    assert_same_outputs_within_half(gd, out, ["fetch"], feed((2, 8), scale=0.5))


def test_tensor_list_read_inside_a_function_shares_its_element_type_across_the_call():
    @tf.function
    def read(handle):
        return tf.raw_ops.TensorListGetItem(input_handle=handle, index=0, element_shape=tf.constant([8]),
                                            element_dtype=tf.float32, name="tl_get")

    g = tf.Graph()
    with g.as_default():
        x = placeholder()
        allow1 = tf.matmul(x, x, name="allow1")
        handle = tf.raw_ops.TensorListFromTensor(tensor=allow1, element_shape=tf.constant([8]), name="tl_from")
        item = read(handle)
        tf.identity(tf.matmul(tf.reshape(item, [1, 8]), x, name="allow2"), name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    assert next(n for n in out.node if n.name == "tl_from").attr["element_dtype"].type == F16
    getters = [n for f in out.library.function for n in f.node_def if n.op == "TensorListGetItem"]
    assert getters and all(n.attr["element_dtype"].type == F16 for n in getters)
    assert_same_outputs_within_half(gd, out, ["fetch"], feed(scale=0.5))


def test_conv3d_converts():
    g = tf.Graph()
    with g.as_default():
        x = placeholder((1, 4, 6, 6, 2))
        w = tf.constant(rng(5).standard_normal((2, 3, 3, 2, 3)).astype(np.float32) * 0.3)
        y = tf.nn.relu(tf.nn.conv3d(x, w, [1] * 5, "SAME", name="allow1"), name="clr1")
        tf.identity(tf.nn.avg_pool3d(y, 2, 2, "VALID", name="infer1"), name="fetch")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch"]).graph_def
    expect_half(out, {"allow1", "clr1"})
    assert_same_outputs_within_half(gd, out, ["fetch"], feed((1, 4, 6, 6, 2)))


def test_rules_are_defined_in_the_order_they_run_and_every_rule_is_scheduled():
    import inspect

    from amp_rewrite.paint import rules as painting

    first_runs = list(dict.fromkeys(painting.RULES))
    lines = [inspect.getsourcelines(rule)[1] for rule in first_runs]
    assert lines == sorted(lines), [rule.__name__ for rule in first_runs]
    shaped_like_a_rule = {f for f in vars(painting).values()
                          if inspect.isfunction(f) and f.__module__ == painting.__name__
                          and list(inspect.signature(f).parameters) == ["ctx", "painting"]}
    assert shaped_like_a_rule == set(painting.RULES)
    assert painting.RULES == painting.ROOT_RULES + painting.SPREAD_RULES


def test_finding_data_structures_changes_nothing_and_the_pipeline_adds_their_edges(monkeypatch):
    from amp_rewrite.paint import tensor_lists

    g = tensor_list_between_matmuls()
    seen = {}
    find = tensor_lists.find_tensor_list_clusters

    def edges_of(graph):
        return [list(out) for out in graph.fanout], [list(into) for into in graph.fanin]

    def watched(ctx):
        before = edges_of(ctx.graph)
        found = find(ctx)
        seen.update(graph=ctx.graph, found=found, before=before, after=edges_of(ctx.graph))
        return found

    monkeypatch.setattr(tensor_lists, "find_tensor_list_clusters", watched)
    amp(g.as_graph_def(), ["fetch"])
    graph = seen["graph"]
    assert seen["after"] == seen["before"]  # finding is read-only
    clusters, edges = seen["found"]
    writer, reader = graph.vertex("tl_from", "element_dtype"), graph.vertex("tl_get", "element_dtype")
    assert [(set(c.vertices), c.escapes) for c in clusters] == [({writer, reader}, False)]
    assert edges == [(writer, reader)]
    assert reader not in seen["before"][0][writer]
    assert reader in graph.fanout[writer] and writer in graph.fanin[reader]  # added by the pipeline
