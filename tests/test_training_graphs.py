"""Rewritten tf.compat.v1 training graphs train, keep float32 weights, and save/restore."""

import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers import F16, F32, REPO, amp, half_nodes, tf1

from amp_rewrite.paint.explain import disagreements

sys.path.insert(0, str(REPO / "tools" / "benchmarks"))
import models  # noqa: E402

VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")


def losses(model, graph_def, steps):
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    train_op = graph.get_operation_by_name(model.fetches[0])
    loss = graph.get_operation_by_name(model.fetches[1]).outputs[0]
    feeds = {graph.get_tensor_by_name(k + ":0"): v for k, v in model.feeds.items()}
    out = []
    with tf1.Session(graph=graph) as sess:
        sess.run(graph.get_operation_by_name(models.INIT_OP_NAME))
        for _ in range(steps):
            _, value = sess.run([train_op, loss], feeds)
            out.append(value)
    return np.array(out)


@pytest.mark.slow
@pytest.mark.parametrize("build", [models.tf1_cnn_training, models.tf1_transformer_block_training],
                         ids=["cnn", "transformer"])
def test_rewritten_training_graph_tracks_float32_loss(build):
    model = build()
    fetches = list(model.fetches) + [models.INIT_OP_NAME]
    result = amp(model.graph_def, fetches)
    out = result.graph_def
    assert disagreements(result) == []  # every node's reason states the dtype it has in `out`
    ops = {n.name: n for n in out.node}
    assert any(n.op in ("Conv2D", "MatMul", "BatchMatMulV2") and n.attr["T"].type == F16 for n in out.node)
    for node in out.node:
        if node.op in VARIABLE_OPS:
            assert node.attr["dtype"].type in (F32, tf.int64.as_datatype_enum, tf.int32.as_datatype_enum), node.name
        if node.op in ("AssignVariableOp", "ResourceApplyMomentum", "ResourceApplyAdam", "ReadVariableOp"):
            assert node.name not in half_nodes(out), node.name
    want = losses(model, model.graph_def, 5)
    got = losses(model, out, 5)
    assert got.dtype == want.dtype == np.float32
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2)
    assert not np.array_equal(got, want)  # really computed in half
    assert ops[model.fetches[1]].name not in half_nodes(out)


def test_saver_save_and_restore_ops_stay_float32_and_work(tmp_path):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf1.get_variable("w", [8, 8], initializer=tf1.initializers.random_normal(seed=1))
        y = tf.nn.relu(tf.matmul(x, w, name="mm"), name="y")
        loss = tf.reduce_mean(tf.square(y), name="loss")
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        saver = tf1.train.Saver(name="save")
        init = tf1.global_variables_initializer()
    fetches = [train.name, loss.op.name, init.name, saver.saver_def.save_tensor_name,
               saver.saver_def.restore_op_name]
    result = amp(g.as_graph_def(), fetches)
    out = result.graph_def
    half = half_nodes(out)
    assert "mm" in half
    assert not [n for n in half if n.startswith("save/")]
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(out, name="")
    feeds = {graph.get_tensor_by_name("x:0"): np.ones((4, 8), np.float32)}
    path = str(tmp_path / "ckpt")
    filename = saver.saver_def.filename_tensor_name
    with tf1.Session(graph=graph) as sess:
        sess.run(graph.get_operation_by_name(init.name))
        sess.run(graph.get_operation_by_name("train"), feeds)
        saved_loss = sess.run("loss:0", feeds)
        sess.run(saver.saver_def.save_tensor_name, {filename: path})
    assert tf.train.load_checkpoint(path).get_variable_to_dtype_map()["w"] == tf.float32
    with tf1.Session(graph=graph) as sess:
        sess.run(graph.get_operation_by_name(init.name))  # fresh weights...
        sess.run(saver.saver_def.restore_op_name, {filename: path})  # ...replaced by the saved ones
        assert sess.run("loss:0", feeds) == saved_loss
