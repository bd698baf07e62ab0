"""A bias gradient stays beside its filter gradient in bfloat16 on a CPU, so oneDNN fuses the two as in float32."""

import numpy as np
import tensorflow as tf

from amp_rewrite import tf_internals
from amp_rewrite.config import Config
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf2 import tracing
from amp_rewrite.tune.step_stats import op_events


def conv_step():
    """A convolution with a bias whose gradient comes through a float32 Exp (a deny op), and its variables."""
    rng = np.random.default_rng(0)
    kernel = tf.Variable(rng.normal(0, 0.1, (3, 3, 8, 16)).astype(np.float32))
    bias = tf.Variable(np.zeros(16, np.float32))
    x = tf.constant(rng.normal(0, 1, (8, 16, 16, 8)).astype(np.float32))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            y = tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"), bias)
            loss = tf.reduce_mean(tf.exp(y * 0.01))
        for v, g in zip((kernel, bias), tape.gradient(loss, [kernel, bias])):
            v.assign_sub(0.1 * g)
        return loss

    return step


def nodes_by_op(concrete_function, op: str):
    fdef = tf_internals.concrete_function_state(concrete_function)["_inference_function"].definition
    return [node for node in fdef.node_def if node.op == op]


def executed_ops(step) -> set[str]:
    import tempfile
    from pathlib import Path

    step()
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        step()
        tf.profiler.experimental.stop()
        return {op for _, op, _ in op_events(Path(logdir).rglob("*.xplane.pb"))}


def test_the_bias_gradient_reads_the_filter_gradients_cast_and_both_are_bfloat16(amp_runtime):
    amp_runtime(RuntimeSettings(target="bfloat16"))
    step = conv_step()
    step()
    cf = step.get_concrete_function()
    [bias_grad] = nodes_by_op(cf, "BiasAddGrad")
    [filter_grad] = nodes_by_op(cf, "Conv2DBackpropFilter")
    assert bias_grad.attr["T"].type == filter_grad.attr["T"].type == tf.bfloat16.as_datatype_enum
    assert bias_grad.input[0] == filter_grad.input[2]  # one Cast feeds both
    outcome = tracing.record_of(cf).rewritten.result.node_outcomes
    [reason] = [o["reason"] for name, o in outcome.items() if name.endswith("BiasAddGrad")]
    assert "bias gradient beside the filter gradient" in reason


def test_where_float32_fuses_them_the_bfloat16_step_fuses_them_too(amp_runtime):
    float32_ops = executed_ops(conv_step())
    amp_runtime(RuntimeSettings(target="bfloat16"))
    half_ops = executed_ops(conv_step())
    fused = {op for op in float32_ops if "BackpropFilterWithBias" in op}
    assert fused <= half_ops, (sorted(float32_ops), sorted(half_ops))
    if fused:
        assert not {"BiasAddGrad"} & half_ops


def test_float16_and_gpu_rewrites_leave_the_bias_gradient_to_the_lists():
    from amp_rewrite.pipeline import rewrite

    step = conv_step()
    cf = step.get_concrete_function()
    graph_def = cf.graph.as_graph_def()
    fdef_name = cf.function_def.signature.name
    del fdef_name
    for config in (Config(target="float16", device_type="CPU"), Config(target="bfloat16", device_type="GPU")):
        result = rewrite(graph_def, config=config)
        [(name, outcome)] = [(n, o) for n, o in result.node_outcomes.items() if n.endswith("BiasAddGrad")]
        assert "beside the filter gradient" not in outcome["reason"], name
