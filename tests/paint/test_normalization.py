"""Normalization statistics: a batch or layer norm written with elementwise ops stays float32, with its gradient."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import BF16, F32, amp, casts, half_nodes, node_types, rng, run, tf1

from amp_rewrite.graph.typed_graph import TypedGraph
from amp_rewrite.paint.normalization import statistics_nodes

FEEDS = {"x": rng(11).standard_normal((4, 8, 8, 3)).astype(np.float32)}
# The norm's own ops: what tf.nn.moments and tf.nn.batch_normalization build between the two convolutions.
NORM_OPS = {"Mean", "StopGradient", "SquaredDifference", "Squeeze", "Rsqrt", "Mul", "Sub", "AddV2"}


def conv_norm_conv(*, training=False, keras_style=True):
    """conv1 → a batch norm of elementwise ops (moments over N, H, W) → relu → conv2, as Keras 3 builds it."""
    r = rng(12)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 8, 8, 3], name="x")
        k1 = tf.Variable(r.standard_normal((3, 3, 3, 8)).astype(np.float32) * 0.3, name="k1")
        k2 = tf.Variable(r.standard_normal((3, 3, 8, 8)).astype(np.float32) * 0.3, name="k2")
        gamma = tf.Variable(np.ones(8, np.float32), name="gamma")
        beta = tf.Variable(np.zeros(8, np.float32), name="beta")
        h = tf.nn.conv2d(x, k1, 1, "SAME", name="conv1")
        if keras_style:
            mean, variance = tf.nn.moments(h, axes=[0, 1, 2], name="moments")
        else:  # Sub and Square instead of SquaredDifference, no StopGradient
            mean = tf.reduce_mean(h, axis=[0, 1, 2], name="mean")
            variance = tf.reduce_mean(tf.square(h - mean), axis=[0, 1, 2], name="variance")
        h = tf.nn.batch_normalization(h, mean, variance, beta, gamma, 1e-3, name="bn")
        y = tf.nn.conv2d(tf.nn.relu(h), k2, 1, "SAME", name="conv2")
        loss = tf.reduce_mean(tf.square(y), name="loss")
        fetches = ["loss"]
        if training:
            train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss, name="train")
            fetches.append(train.name)
        tf1.variables_initializer(tf1.global_variables(), name="init")
    return g.as_graph_def(), fetches


def run_twice(graph_def, fetches):
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as session:
        session.run(graph.get_operation_by_name("init"))
        feed = {graph.get_tensor_by_name("x:0"): FEEDS["x"]}
        return [session.run([graph.get_tensor_by_name("loss:0")] + [graph.get_operation_by_name(f) for f in
                                                                       fetches[1:]], feed)[0] for _ in range(3)]


@pytest.mark.parametrize("keras_style", [True, False])
def test_the_norm_between_two_half_convolutions_stays_float32(keras_style):
    gd, fetches = conv_norm_conv(keras_style=keras_style)
    result = amp(gd, fetches, target="bfloat16")
    out = result.graph_def
    types = node_types(out)
    assert types["conv1"] == BF16 and types["conv2"] == BF16
    norm = {n.name for n in out.node if n.name.startswith(("moments/", "mean", "variance", "bn/"))
            and n.op in NORM_OPS | {"Square"}}
    assert len(norm) >= 8 and not norm & half_nodes(out)
    # one Cast into the norm (conv1's output) and one out of it (to Relu and conv2); the input, the two
    # kernels, and the loss's squares before their float32 Mean
    assert sorted(c.input[0] for c in casts(out)) == sorted([
        "conv1", "bn/add_1", "x", "conv1/ReadVariableOp", "conv2/ReadVariableOp",
        "Square" if keras_style else "Square_1"])
    reason = result.node_outcomes["moments/mean" if keras_style else "mean"]["reason"]
    assert "normalization statistics" in reason
    want, got = run(gd, ["conv2", "loss"], FEEDS, init="init"), run(out, ["conv2", "loss"], FEEDS, init="init")
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=3e-2, atol=3e-2 * np.abs(w).max())


def test_a_training_step_keeps_the_norms_gradient_float32_and_trains_like_float32():
    gd, fetches = conv_norm_conv(training=True)
    result = amp(gd, fetches, target="bfloat16")
    out = result.graph_def
    half = half_nodes(out)
    norm_grads = {n.name for n in out.node if n.name.startswith("gradients/") and "/bn/" in f"/{n.name}"
                  and n.op in NORM_OPS | {"Neg", "Sum", "Reshape", "Tile", "RealDiv", "RsqrtGrad"}}
    assert norm_grads and not norm_grads & half
    assert {"gradients/conv1_grad/Conv2DBackpropFilter", "gradients/conv2_grad/Conv2DBackpropInput"} <= half
    want, got = run_twice(gd, fetches), run_twice(out, fetches)
    np.testing.assert_allclose(got, want, rtol=2e-2)
    assert got[2] < got[0]  # it trains


def test_a_mean_that_only_centres_and_float16_norms_are_left_to_the_lists():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        centred = x - tf.reduce_mean(x, axis=1, keepdims=True)  # a mean alone centres; no variance follows
        tf.identity(centred, name="y")
    assert statistics_nodes(TypedGraph(g.as_graph_def())) == set()
    gd, fetches = conv_norm_conv()
    result = amp(gd, fetches)  # float16 denies Mean already: the norm was float32 before this rule
    assert node_types(result.graph_def)["moments/SquaredDifference"] == F32
    assert "deny-list op" in result.node_outcomes["moments/mean"]["reason"]


def test_statistics_are_found_by_structure_not_by_name():
    gd, _ = conv_norm_conv()
    graph = TypedGraph(gd)
    found = {graph.nodes[i].name for i in statistics_nodes(graph)}
    assert found == {"moments/mean", "moments/StopGradient", "moments/SquaredDifference", "moments/variance"}
