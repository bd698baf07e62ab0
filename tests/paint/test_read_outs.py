"""Losses and metrics a user reads carry float32's precision (``keep_read_outs_float32``).

The forward values in these graphs are exact in bfloat16 (inputs and weights
in {-1, 0, 1}, at most four terms per dot product, so every product, error
and squared error is a small integer), so a float32 reduction of them gives
float32's loss to the last bit, while a bfloat16 reduction rounds it to 8
significant bits: the difference the rule makes is the whole difference.
"""

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from helpers import BF16, F16, F32, amp, half_nodes, node_types, run, tf1

from amp_rewrite import runtime
from amp_rewrite.paint import rules
from amp_rewrite.runtime.settings import RuntimeSettings


def exact_data(seed, shape):
    """Values in {-1, 0, 1}: with four terms per dot product, half ops compute what float32 does."""
    return np.random.default_rng(seed).integers(-1, 2, size=shape).astype(np.float32)


def is_bfloat16(value) -> bool:
    return float(np.float32(value).astype(ml_dtypes.bfloat16)) == float(value)


def tf1_mse_graph():
    """``tf.compat.v1.losses.mean_squared_error(t, x @ w)``, fetched through ``loss``."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [32, 4], name="x")
        t = tf1.placeholder(tf.float32, [32, 4], name="t")
        w = tf.constant(exact_data(0, (4, 4)), name="w")
        y = tf.matmul(x, w, name="allow1")
        loss = tf1.losses.mean_squared_error(t, y)
        tf.identity(loss, name="loss")
    return graph.as_graph_def()


def losses_of(graph_def, batches=6):
    return [run(graph_def, ["loss"], {"x": exact_data(10 + i, (32, 4)), "t": exact_data(20 + i, (32, 4))})[0]
            for i in range(batches)]


@pytest.mark.parametrize("target, half", [("bfloat16", BF16), ("float16", F16)])
def test_a_tf1_loss_is_reduced_in_float32(target, half):
    graph_def = tf1_mse_graph()
    out = amp(graph_def, ["loss"], target=target).graph_def
    types = node_types(out)
    assert types["allow1"] == half
    for name in ("mean_squared_error/Sum", "mean_squared_error/Sum_1", "mean_squared_error/value"):
        assert types[name] == F32, name


def test_a_fetched_loss_carries_float32_precision():
    graph_def = tf1_mse_graph()
    want = losses_of(graph_def)
    got = losses_of(amp(graph_def, ["loss"], target="bfloat16").graph_def)
    assert not all(is_bfloat16(v) for v in got)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # What the rule prevents: the same loss reduced in bfloat16.
    assert max(abs(float(np.float32(v).astype(ml_dtypes.bfloat16)) - v) / v for v in want) > 1e-3


def layer_norm_graph():
    """``(x - mean(x)) * rsqrt(var(x))`` fed to a MatMul whose output is fetched: the Means feed the model on."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 16], name="x")
        w = tf.constant(exact_data(1, (16, 16)), name="w")
        h = tf.matmul(x, w, name="allow1")
        mean = tf.reduce_mean(h, axis=-1, keepdims=True, name="mean")
        centred = tf.subtract(h, mean, name="centred")
        var = tf.reduce_mean(tf.square(centred, name="square"), axis=-1, keepdims=True, name="var")
        normed = tf.multiply(centred, tf.math.rsqrt(var + 1e-3, name="rsqrt"), name="normed")
        out = tf.matmul(normed, w, name="allow2")
        tf.identity(out, name="out")
    return graph.as_graph_def()


def test_a_reduction_that_feeds_the_model_is_no_read_out():
    """A layer norm's Means feed the model on: float32 as normalization statistics, not as read-outs."""
    result = amp(layer_norm_graph(), ["out"], target="bfloat16")
    assert {"allow1", "allow2"} <= half_nodes(result.graph_def)
    for name in ("mean", "var"):
        reason = result.node_outcomes[name]["reason"]
        assert "normalization statistics" in reason and "read out" not in reason


def test_a_reduction_read_out_and_fed_to_the_model_keeps_feeding_it_half():
    """A fetched layer-norm mean is read out, but it also normalises ``h``: the norm's reason is the norm's."""
    graph_def = layer_norm_graph()
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
        tf.identity(graph.get_tensor_by_name("mean:0"), name="mean_out")
    result = amp(graph.as_graph_def(), ["out", "mean_out"], target="bfloat16")
    assert {"allow1", "allow2"} <= half_nodes(result.graph_def)
    assert "normalization statistics" in result.node_outcomes["mean"]["reason"]


def metric_graph():
    """A running metric: ``total += sum((x @ w)^2) / count``, and a ScalarSummary of the batch value."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [32, 4], name="x")
        w = tf.constant(exact_data(2, (4, 4)), name="w")
        total = tf1.get_variable("total", [], initializer=tf1.zeros_initializer(), use_resource=True,
                                 trainable=False)
        y = tf.matmul(x, w, name="allow1")
        batch_sum = tf.reduce_sum(tf.square(y, name="square"), name="batch_sum")
        batch_value = tf.divide(batch_sum, 128.0, name="batch_value")
        with tf1.name_scope("step"):
            total.assign_add(batch_value, read_value=False)
        tf1.summary.scalar("batch", batch_value)
        tf.identity(total.read_value(), name="total_now")
        tf1.global_variables_initializer()
    return graph.as_graph_def()


def test_a_metric_total_and_a_summary_read_float32_values():
    graph_def = metric_graph()
    step = next(n.name for n in graph_def.node if n.op == "AssignAddVariableOp")
    summary = next(n.name for n in graph_def.node if n.op == "ScalarSummary")
    out = amp(graph_def, [step, summary, "total_now"], target="bfloat16").graph_def
    types = node_types(out)
    assert types["allow1"] == BF16 and types["square"] == BF16
    assert types["batch_sum"] == F32 and types["batch_value"] == F32


def test_a_function_result_is_reduced_in_float32():
    """A ``tf.function``'s returned loss: the rule reads the results of called functions."""

    @tf.function
    def loss_fn(x, t, w):
        return tf.reduce_mean(tf.square(tf.matmul(x, w) - t))

    spec = [tf.TensorSpec([32, 16]), tf.TensorSpec([32, 4]), tf.TensorSpec([16, 4])]
    graph = tf.Graph()
    with graph.as_default():
        args = [tf1.placeholder(s.dtype, s.shape, name=n) for s, n in zip(spec, ("x", "t", "w"))]
        tf.identity(loss_fn(*args), name="loss")
    result = amp(graph.as_graph_def(), ["loss"], target="bfloat16")
    outcomes = result.node_outcomes
    body = {name.split("::")[1]: o for name, o in outcomes.items() if "::" in name}
    matmul = next(o for n, o in body.items() if n.startswith("MatMul"))
    mean = next(o for n, o in body.items() if n.startswith("Mean"))
    assert matmul["precision"] == "bfloat16"
    assert mean["precision"] == "float32"
    assert rules.READ_OUT in mean["reason"]


def test_explain_names_the_read_out():
    result = amp(tf1_mse_graph(), ["loss"], target="bfloat16")
    outcome = result.node_outcomes["mean_squared_error/value"]
    assert outcome["precision"] == "float32"
    assert rules.READ_OUT in outcome["reason"]


def test_unsafe_force_all_forces_the_loss_too():
    out = amp(tf1_mse_graph(), ["loss"], target="float16", level="UNSAFE_FORCE_ALL").graph_def
    assert node_types(out)["mean_squared_error/Sum_1"] == F16


def keras_model():
    """One Dense layer with weights in {-1, 0, 1} and MSE: every value up to the loss's reduction is exact."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
    model.layers[0].set_weights([exact_data(3, (4, 4)), np.zeros(4, np.float32)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def keras_batches():
    return [(exact_data(30 + i, (32, 4)), exact_data(40 + i, (32, 4))) for i in range(5)]


def batch_losses(model):
    """Each batch's loss from ``test_on_batch`` (Keras's evaluate step), the loss tracker reset before each.

    Keras before 3.13 keeps the tracker's running mean across ``test_on_batch`` calls; resetting it
    gives each batch's own loss on every release.
    """
    losses = []
    for x, t in keras_batches():
        model.reset_metrics()
        losses.append(float(model.test_on_batch(x, t)))
    return losses


def test_keras_losses_under_the_runtime_carry_float32_precision(amp_runtime):
    """Keras's evaluate step reports the loss float32 computes from the same half values."""
    want = batch_losses(keras_model())
    amp_runtime(RuntimeSettings(target="bfloat16"))
    got = batch_losses(keras_model())
    assert runtime.current_runtime().tracing.history, "the test step was not rewritten"
    assert not all(is_bfloat16(v) for v in got)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def trained_dense_with_a_metric():
    """``y = x @ w + b`` trained by SGD written as Keras 3 writes it (``v.assign_sub(lr * g)``), and a loss total."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [32, 4], name="x")
        w = tf1.get_variable("w", initializer=exact_data(3, (4, 4)), use_resource=True)
        b = tf1.get_variable("b", initializer=np.zeros(4, np.float32), use_resource=True)
        total = tf1.get_variable("total", [], initializer=tf1.zeros_initializer(), use_resource=True,
                                 trainable=False)
        y = tf.add(tf.matmul(x, w, name="allow1"), b, name="biased")
        loss = tf.reduce_mean(tf.square(y, name="square"), name="loss")
        updates = [v.assign_sub(0.01 * g, read_value=False) for v, g in zip((w, b), tf.gradients(loss, [w, b]))]
        with tf.control_dependencies(updates):
            total.assign_add(loss, read_value=False, name="train")
        tf1.variables_initializer(tf1.global_variables(), name="init")
    return graph.as_graph_def()


def test_a_gradient_written_into_the_model_is_no_read_out():
    """The bias's gradient (a Sum over the batch) updates a weight: no read-out; the loss and its total are."""
    graph_def = trained_dense_with_a_metric()
    result = amp(graph_def, ["loss", "train"], target="bfloat16")
    reasons = {name: outcome["reason"] for name, outcome in result.node_outcomes.items()}
    bias_gradient = "gradients/biased_grad/Sum"
    assert bias_gradient in half_nodes(result.graph_def), reasons[bias_gradient]
    assert "loss" not in half_nodes(result.graph_def)
    want, got = (losses_over_steps(g, exact_data(4, (32, 4))) for g in (graph_def, result.graph_def))
    np.testing.assert_allclose(got, want, rtol=1e-2)
    assert got[-1] < got[0]


def losses_over_steps(graph_def, x, steps=3):
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as session:
        session.run(graph.get_operation_by_name("init"))
        feed = {graph.get_tensor_by_name("x:0"): x}
        loss, train = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train")
        return [session.run([loss, train], feed)[0] for _ in range(steps)]
