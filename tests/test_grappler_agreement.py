"""Agreement with TensorFlow's own pass (Grappler ``auto_mixed_precision_cpu``, real fp16).

For each graph, the set of original nodes computing in half must be the same
as Grappler's, except for differences named here as deliberate. Consts are
compared apart: Grappler leaves ``Cast(Const)`` for constant folding, we fold.
"""

import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    REPO,
    amp,
    assert_same_outputs_within_half,
    casts,
    half_nodes,
    like_this_grappler,
    rng,
    tf1,
    v1_control_flow,
)

from amp_rewrite.paint.explain import disagreements
from amp_rewrite.report.grappler import grappler_rewrite

sys.path.insert(0, str(REPO / "tools" / "benchmarks"))
import models  # noqa: E402


@pytest.fixture(autouse=True)
def _like_this_grappler():
    """Grappler is this TensorFlow's: ours paints as it does (see helpers.like_this_grappler)."""
    with like_this_grappler():
        yield


def compare(graph_def, fetches):
    ours = amp(graph_def, fetches)
    theirs, _ = grappler_rewrite(graph_def, fetches)
    ops = {n.name: n.op for n in graph_def.node}
    ours_half = {n for n in half_nodes(ours.graph_def) if ops.get(n, "Const") != "Const"}
    theirs_half = {n for n in half_nodes(theirs) if ops.get(n, "Const") != "Const"}
    theirs_casts = [c for c in casts(theirs) if c.name not in ops]
    return ours, ours_half, theirs_half, theirs_casts


def small_graphs():
    r = rng(7)

    def mlp():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        h = x
        for i in range(3):
            w = tf.constant(r.standard_normal((16, 16)).astype(np.float32) * 0.3)
            h = tf.nn.relu(tf.nn.bias_add(tf.matmul(h, w), tf.zeros([16])))
            h = tf.tanh(h) if i == 1 else h
        return {"x": r.standard_normal((4, 16)).astype(np.float32)}, [tf.nn.softmax(h, name="out").op.name]

    def deny_chain():
        x = tf1.placeholder(tf.float32, [8, 8], name="x")
        a = tf.nn.relu(tf.math.log(tf.exp(x * 0.1) + 1.0))
        b = tf.matmul(a, a)
        c = tf.sigmoid(tf.nn.relu(b))
        d = tf.reduce_sum(tf.exp(c * 0.1), axis=1)
        return {"x": r.standard_normal((8, 8)).astype(np.float32)}, [tf.identity(d, name="out").op.name]

    def conv_bn_pool():
        x = tf1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
        w = tf.constant(r.standard_normal((3, 3, 3, 4)).astype(np.float32) * 0.3)
        y = tf.nn.conv2d(x, w, 1, "SAME")
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(y, tf.ones([4]), tf.zeros([4]), is_training=True)
        y = tf.nn.max_pool2d(tf.nn.relu(y), 2, 2, "VALID")
        w2 = tf.constant(r.standard_normal((3, 3, 4, 4)).astype(np.float32) * 0.3)
        y = tf.nn.avg_pool2d(tf.nn.conv2d(y, w2, 1, "SAME"), 2, 2, "VALID")
        return {"x": r.standard_normal((2, 8, 8, 3)).astype(np.float32)}, [tf.identity(y, name="out").op.name]

    def v1_loop():
        with v1_control_flow():
            x = tf1.placeholder(tf.float32, [8, 8], name="x")
            w = tf.constant(np.eye(8, dtype=np.float32) * 0.9)
            _, h = tf1.while_loop(lambda i, h: i < 3,
                                  lambda i, h: (i + 1, tf.nn.relu(tf.matmul(h, w))), [0, x])
        return {"x": r.standard_normal((8, 8)).astype(np.float32)}, [tf.identity(h, name="out").op.name]

    return {"mlp": mlp, "deny_chain": deny_chain, "conv_bn_pool": conv_bn_pool, "v1_loop": v1_loop}


@pytest.mark.parametrize("name", sorted(small_graphs()))
def test_small_graphs_agree_with_grappler(name):
    g = tf.Graph()
    with g.as_default():
        feeds, fetches = small_graphs()[name]()
    gd = g.as_graph_def()
    ours, ours_half, theirs_half, theirs_casts = compare(gd, fetches)
    assert ours_half == theirs_half
    assert len(ours.casts) <= len(theirs_casts)
    assert disagreements(ours) == []
    assert_same_outputs_within_half(gd, ours.graph_def, fetches, feeds)


REAL_MODELS = {
    "tf1_cnn_training": models.tf1_cnn_training,
    "tf1_transformer_block_training": models.tf1_transformer_block_training,
    "keras_mobilenetv2_frozen": models.keras_mobilenetv2_frozen,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_models_agree_with_grappler(name):
    model = REAL_MODELS[name]()
    ours, ours_half, theirs_half, theirs_casts = compare(model.graph_def, list(model.fetches))
    assert ours_half == theirs_half
    assert len(ours.casts) <= len(theirs_casts)
    assert len(ours_half) > 20
    assert disagreements(ours) == []


def test_deliberate_difference_allow_op_without_a_half_kernel_is_not_converted():
    """Grappler converts an allow op whose OpDef admits half even when the device has no half
    kernel for it (CudnnRNN has none on CPU). We require the kernel, so it stays as it is and
    no Casts are spent around it; the report says why."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [3, 2, 4], name="x")
        h = tf1.placeholder(tf.float32, [1, 2, 4], name="h")
        params = tf.zeros([160])
        rnn = tf.raw_ops.CudnnRNN(input=tf.nn.relu(x), input_h=h, input_c=h, params=params, name="allow1")
        tf.identity(rnn.output, name="out")
    gd = g.as_graph_def()
    ours, ours_half, theirs_half, _ = compare(gd, ["out"])
    assert "allow1" in theirs_half and "allow1" not in ours_half
    assert ours.casts == []
    assert ours.report()["nodes"]["allow1"]["rule"] == "no float16 kernel or OpDef type on CPU"


@pytest.mark.slow
def test_real_model_rewrite_is_deterministic_and_idempotent():
    model = models.tf1_resnet50_training()
    fetches = list(model.fetches)
    once = amp(model.graph_def, fetches).graph_def
    again = amp(model.graph_def, fetches).graph_def
    assert once.SerializeToString(deterministic=True) == again.SerializeToString(deterministic=True)
    twice = amp(once, fetches)
    assert twice.converted == [] and twice.casts == []
    assert twice.graph_def.SerializeToString(deterministic=True) == once.SerializeToString(deterministic=True)
