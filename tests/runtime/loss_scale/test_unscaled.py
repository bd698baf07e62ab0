"""A loss-scaled step without its loss scaling: the float32 variant computes the plain float32 step.

The graphs are built with the runtime on (its optimizer patches scale the
loss) and run here without it, in plain sessions.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import rng, tf1, unscaled_graph_def

from amp_rewrite.runtime.loss_scale.tf1_optimizer import STATE_COLLECTION
from amp_rewrite.runtime.loss_scale.unscaled import unscaled_function, unscaled_nodes
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

X = rng().normal(size=(8, 4)).astype(np.float32)
# Inputs of 1e18 give a loss of about 1e37 and gradients of about 1e37: finite in float32, but not once a
# loss scale of a few thousand multiplies them.
LARGE = {"x:0": X * 1e18}


def training_graph():
    """x → MatMul → squared error ``loss``; ``train_op`` by Adam; ``init``; the weights' value ``weights``."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        w = tf1.get_variable("w", [4, 2], initializer=tf1.initializers.random_normal(seed=1, stddev=0.5))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0), name="loss")
        tf1.train.AdamOptimizer(0.1).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
        tf.identity(w, name="weights")
    return graph


def steps_of(graph_def, feeds, steps: int = 3):
    """Runs ``graph_def`` in a plain session: its losses, the weights after, and the loss-scale state (if any)."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
        state = [tf.raw_ops.ReadVariableOp(resource=graph.get_tensor_by_name(f"{name}:0"), dtype=dtype)
                 for name, dtype in (("amp_loss_scale/scale", tf.float32), ("amp_loss_scale/good_steps", tf.int64),
                                     ("amp_loss_scale/skipped_steps", tf.int64))
                 if any(node.name == name for node in graph_def.node)]
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        losses = [float(sess.run(["train_op", "loss:0"], feeds)[1]) for _ in range(steps)]
        return losses, sess.run("weights:0"), [value.item() for value in sess.run(state)]


def scaled_graph_def(amp_runtime, *, use_v1_control_flow: bool = False):
    """The training graph built with the runtime's float16 loss scaling; the runtime is off after."""
    from amp_rewrite import runtime

    amp_runtime(RuntimeSettings(target="float16", loss_scale=LossScaleSettings(initial_scale=32768.0)))
    if use_v1_control_flow:
        tf1.disable_control_flow_v2()
    try:
        graph = training_graph()
    finally:
        tf1.enable_control_flow_v2()
    assert graph.get_collection(STATE_COLLECTION)
    runtime.disable()
    return graph.as_graph_def()


@pytest.mark.parametrize("use_v1_control_flow", [False, True], ids=["If", "Switch"])
def test_a_scaled_tf1_step_without_its_scaling_is_the_float32_step(amp_runtime, use_v1_control_flow):
    scaled = scaled_graph_def(amp_runtime, use_v1_control_flow=use_v1_control_flow)
    plain_losses, plain_w, _ = steps_of(training_graph().as_graph_def(), LARGE)
    losses, w, state = steps_of(unscaled_graph_def(scaled), LARGE)
    np.testing.assert_array_equal(losses, plain_losses)
    np.testing.assert_array_equal(w, plain_w)
    assert state == [32768.0, 0, 0]  # neither a good nor a skipped step: the half steps' schedule stands
    # the scaled step itself skips these steps: its scaled gradients are not finite
    scaled_losses, scaled_w, scaled_state = steps_of(scaled, LARGE)
    assert scaled_state[2] == 3 and scaled_losses == [scaled_losses[0]] * 3


def test_the_unscaled_step_checks_no_gradient(amp_runtime):
    unscaled = unscaled_graph_def(scaled_graph_def(amp_runtime))
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(unscaled, name="")
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        metadata = tf1.RunMetadata()
        sess.run("train_op", {"x:0": X}, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                 run_metadata=metadata)
    # a node's label is ``name = Op(inputs)``, whether it ran in the graph or inlined from a function
    ran = {node.timeline_label.split(" = ")[1].split("(")[0] for device in metadata.step_stats.dev_stats
           for node in device.node_stats if " = " in node.timeline_label}
    assert not ran & {"IsFinite", "MulNoNan", "If"}, ran
    assert "ResourceApplyAdam" in ran


def test_a_graph_without_loss_scaling_is_its_own_float32_step():
    graph_def = training_graph().as_graph_def()
    assert unscaled_nodes(graph_def.node) is None


def test_a_traced_step_without_its_scaling_names_the_outputs_of_the_ops_it_changed(amp_runtime):
    """In a FunctionDef a reference names its op's output (``mul:z:0``): an op that changes changes its name."""
    import keras

    amp_runtime(RuntimeSettings(target="float16"))
    w = tf.Variable(tf.ones([4, 2]))
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        optimizer.apply(tape.gradient(loss, [w]), [w])
        return loss

    fdef = step.get_concrete_function(tf.TensorSpec([None, 4], tf.float32)).function_def
    new = unscaled_function(fdef)
    assert new is not None and new.signature == fdef.signature
    nodes = {node.name: node for node in new.node_def}
    refs = [ref for node in new.node_def for ref in node.input] + list(new.ret.values())
    for ref in refs:
        parts = ref.split(":")
        if len(parts) == 3 and parts[0] in nodes and nodes[parts[0]].op in ("Identity", "Const"):
            assert parts[1] in _output_names(nodes[parts[0]].op), ref
    assert {node.op for node in new.node_def} & {"If", "StatelessIf", "MulNoNan"} == set()


def _output_names(op: str) -> set[str]:
    from amp_rewrite.graph.op_registry import OpRegistry

    return {arg.name for arg in OpRegistry.registry_op_def(op).output_arg}
