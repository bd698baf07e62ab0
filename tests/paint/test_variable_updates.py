"""A variable's new value computed from its old one stays float32 (``keep_variable_updates_float32``).

A running total kept in half stops growing once each step adds less than a
half-precision ulp of it (bfloat16 keeps 8 bits): a Keras metric's mean, a
moving average, an optimizer's moments. The allow op feeding the update
stays half; the read-modify-write of the variable does not.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import BF16, F16, F32, amp, half_nodes, node_types, tf1

from amp_rewrite import runtime
from amp_rewrite.runtime.settings import RuntimeSettings

STEPS = 200


def accumulator_graph():
    """``allow1 = x @ w``; ``update = total + allow1`` (the read-modify-write); ``step`` assigns it."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 4], initializer=tf1.constant_initializer(0.01), use_resource=True)
        total = tf1.get_variable("total", [8, 4], initializer=tf1.zeros_initializer(), use_resource=True,
                                 trainable=False)
        allow1 = tf.matmul(x, w, name="allow1")
        update = tf.add(total, allow1, name="update")
        with tf1.name_scope("step"):
            total.assign(update, read_value=False)
        tf.identity(total.read_value(), name="total_now")
        tf1.global_variables_initializer()
    return graph.as_graph_def()


def assign_op(graph_def) -> str:
    return next(n.name for n in graph_def.node if n.op == "AssignVariableOp" and n.name.startswith("step/"))


def accumulate(graph_def, steps: int = STEPS):
    """The total after ``steps`` runs of the step, each adding ``x @ w`` (0.04 everywhere)."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as sess:
        sess.run(graph.get_operation_by_name("init"))
        step = graph.get_operation_by_name(assign_op(graph_def))
        for _ in range(steps):
            sess.run(step, {"x:0": np.ones((8, 4), np.float32)})
        return sess.run("total_now:0")


@pytest.mark.parametrize("target, half", [("bfloat16", BF16), ("float16", F16)])
def test_a_running_total_is_updated_in_float32(target, half):
    graph_def = accumulator_graph()
    out = amp(graph_def, fetches=[assign_op(graph_def), "total_now"], target=target).graph_def
    types = node_types(out)
    assert types["allow1"] == half
    assert types["update"] == F32
    assert "update" not in half_nodes(out)


def test_the_total_keeps_float32_precision():
    graph_def = accumulator_graph()
    out = amp(graph_def, fetches=[assign_op(graph_def), "total_now"], target="bfloat16").graph_def
    want = accumulate(graph_def)
    got = accumulate(out)
    # 200 steps of 0.04 (0.0400390625 in bfloat16): a float32 total is 8.008; one kept in
    # bfloat16 rounds each step's sum to 8 bits and ends far off.
    np.testing.assert_allclose(want, 8.0, rtol=1e-5)
    np.testing.assert_allclose(got, want, rtol=2e-3)


def bias_training_graph():
    """``relu(x @ w + b)`` and its gradient; ``b`` is updated by ``assign_sub(lr * grad)``.

    ``b``'s old value reaches its update through the model (BiasAdd, Relu, their
    gradients), not through the update's arithmetic: the model stays half.
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 16], name="x")
        w = tf1.get_variable("w", [16, 16], initializer=tf1.glorot_uniform_initializer(seed=1), use_resource=True)
        b = tf1.get_variable("b", [16], initializer=tf1.zeros_initializer(), use_resource=True)
        h = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w, name="allow1"), b, name="biased"), name="relu1")
        out = tf.matmul(h, w, name="allow2")
        loss = tf.reduce_mean(tf.square(out), name="loss")
        grad_w, grad_b = tf.gradients(loss, [w, b])
        with tf1.name_scope("train"):
            w.assign_sub(0.1 * grad_w, read_value=False)
            b.assign_sub(0.1 * grad_b, read_value=False)
    return graph.as_graph_def()


def test_a_variable_read_by_the_model_is_no_update_chain():
    graph_def = bias_training_graph()
    train = [n.name for n in graph_def.node if n.name.startswith("train/") and n.op == "AssignSubVariableOp"]
    out = amp(graph_def, fetches=[*train, "loss"], target="bfloat16").graph_def
    assert {"allow1", "allow2", "biased", "relu1"} <= half_nodes(out)


def test_a_keras_mean_metric_under_the_runtime_equals_the_loss(amp_runtime):
    """``fit``'s MeanSquaredError metric is a running total and count: it tracks the loss it equals."""
    amp_runtime(RuntimeSettings(target="bfloat16"))
    keras.utils.set_random_seed(0)
    data = np.random.default_rng(0)
    x = data.random((4000, 32)).astype(np.float32)
    y = data.random((4000, 4)).astype(np.float32)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="mse", metrics=[keras.metrics.MeanSquaredError(name="mse")])
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0).history
    assert any(r.name.startswith("one_step_on_data") for r in runtime.current_runtime().tracing.history)
    np.testing.assert_allclose(history["mse"], history["loss"], rtol=1e-2)
