"""Gradients unscaled and checked joined (a GPU step's few kernels): the same step, the same skips.

The runtime joins them where TensorFlow sees a GPU; here ``grouped=True``
forces it on a CPU, and each test compares it with the one-by-one step.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import amp, rng, tf1, unscaled_graph_def

from amp_rewrite.paint.context import KEEP_FLOAT32_ATTR
from amp_rewrite.runtime.loss_scale import core
from amp_rewrite.runtime.loss_scale.core import (
    JOINED_REASON,
    count_nonfinite,
    inverse_of,
    nonfinite_joined,
    unscale,
    unscale_all,
)
from amp_rewrite.runtime.loss_scale.unscaled import unscaled_function
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

HALF = tf.float16.as_datatype_enum
FLOAT = tf.float32.as_datatype_enum


def gradients():
    """Dense float32 gradients of several shapes, a float16 pair, an IndexedSlices and a None."""
    r = rng(3)
    dense = [tf.constant((r.normal(size=shape) * 1e4).astype(np.float32)) for shape in ((3, 4), (5,), (2, 2, 2), ())]
    halves = [tf.constant(r.normal(size=shape).astype(np.float16)) for shape in ((3,), (2, 3))]
    sliced = tf.IndexedSlices(tf.constant(r.normal(size=(2, 4)).astype(np.float32)), tf.constant([0, 3]),
                              tf.constant([5, 4]))
    return [dense[0], halves[0], dense[1], sliced, None, dense[2], halves[1], dense[3]]


def values_of(grads):
    return [None if g is None else (g.values if isinstance(g, tf.IndexedSlices) else g).numpy() for g in grads]


@pytest.mark.parametrize("bound", [2 ** 24, 13], ids=["one group per dtype", "groups of at most 13"])
def test_joined_unscaling_gives_each_gradient_bit_for_bit(monkeypatch, bound):
    monkeypatch.setattr(core, "GROUP_ELEMENTS", bound)
    grads, inverse = gradients(), inverse_of(tf.constant(3.0 * 1024))
    want = values_of([unscale(g, inverse) for g in grads])

    @tf.function
    def joined():
        return unscale_all(gradients(), inverse, grouped=True)

    got = values_of(joined())
    for g, w in zip(got, want):
        if w is None:
            assert g is None
        else:
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    graph = joined.get_concrete_function().graph
    multiplies = [op for op in graph.get_operations() if op.type == "MulNoNan"]
    groups = core._groups(gradients())
    # one multiply per group, one per gradient no group takes (the IndexedSlices, a group of one)
    alone = sum(1 for i, g in enumerate(gradients()) if g is not None and all(i not in grp for grp in groups))
    assert len(multiplies) == len(groups) + alone
    # float32's 12, 5, 8 and 1 elements and float16's 3 and 6; at 13, 12 and 1 are left alone
    assert groups == ([[0, 2, 5, 7], [1, 6]] if bound > 100 else [[1, 6], [2, 5]])
    for group in groups:
        assert sum(gradients()[i].shape.num_elements() for i in group) <= bound
        assert len({gradients()[i].dtype for i in group}) == 1
    joins = [op for op in graph.get_operations() if op.type == "ConcatV2"]
    assert len(joins) == len(groups)
    assert all(op.get_attr(KEEP_FLOAT32_ATTR).decode() == JOINED_REASON for op in joins)


def test_the_joined_check_finds_an_inf_or_nan_in_any_gradient():
    @tf.function
    def check(position, bad):
        grads = gradients()
        poisoned = []
        for i, g in enumerate(grads):
            if g is None:
                poisoned.append(None)
                continue
            values = g.values if isinstance(g, tf.IndexedSlices) else g
            hit = tf.where(tf.equal(position, i), tf.cast(bad, values.dtype), tf.zeros([], values.dtype))
            flat = tf.tensor_scatter_nd_add(tf.reshape(values, [-1]), [[0]], [hit])
            new = tf.reshape(flat, tf.shape(values))
            poisoned.append(tf.IndexedSlices(new, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices)
                            else new)
        return nonfinite_joined(poisoned), count_nonfinite(poisoned)

    assert [float(v) for v in check(0, 0.0)] == [0.0, 0.0]
    for position, g in enumerate(gradients()):
        if g is None:
            continue
        for bad in (np.inf, -np.inf, np.nan):
            joined, counted = check(position, bad)
            assert float(joined) == 1.0 and float(counted) == 1.0, (position, bad)
    assert float(nonfinite_joined([None, None])) == 0.0


def concat_graph(*, kept: bool):
    """A MatMul's product (allow: half) and a float32 tensor ``g`` joined by a ConcatV2, as gradients are."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        g = tf1.placeholder(tf.float32, [16], name="g")
        w = tf.constant(rng(1).normal(size=(4, 4)).astype(np.float32))
        joined = tf.concat([tf.reshape(tf.matmul(x, w), [-1]), g], 0, name="joined")
        if kept:
            core._kept(joined)
        tf.identity(tf.reduce_sum(joined), name="out")
    return graph.as_graph_def()


def test_the_painting_leaves_a_node_carrying_the_keep_attr_float32():
    painted = {node.name: node for node in amp(concat_graph(kept=False), ["out"]).graph_def.node}
    assert painted["joined"].attr["T"].type == HALF  # what a gradient of float32 would be cast down to
    result = amp(concat_graph(kept=True), ["out"])
    nodes = {node.name: node for node in result.graph_def.node}
    assert nodes["MatMul"].attr["T"].type == HALF
    assert nodes["joined"].attr["T"].type == FLOAT
    casts = [node for node in result.graph_def.node if node.op == "Cast"]
    # the half product is cast up before it joins; the float32 tensor is never cast down
    assert any(node.attr["SrcT"].type == HALF and node.attr["DstT"].type == FLOAT for node in casts)
    assert not any(node.input[0] == "g" for node in casts)
    assert any(node.input[0] == "g" for node in amp(concat_graph(kept=False), ["out"]).graph_def.node
               if node.op == "Cast")
    assert JOINED_REASON in str(result.node_outcomes["joined"])


# --- a training step, joined and one by one --------------------------------------------------------


def keras_step(grouped: bool | None, initial_scale: float, steps: int = 6):
    """A small Keras 3 conv net trained by a tf.function step under the float16 runtime.

    ``grouped``: the gradients joined, one by one, or (None) as the machine's default. Returns the
    losses, the weights after, and the rewritten step's graph and FunctionDef.
    """
    import keras

    from amp_rewrite import runtime

    runtime.disable()
    runtime.enable(settings=RuntimeSettings(
        target="float16", loss_scale=LossScaleSettings(initial_scale=initial_scale, grouped=grouped)))
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                                  keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(4)])
        optimizer = keras.optimizers.Adam(1e-2)
        x = rng(5).normal(size=(16, 8, 8, 3)).astype(np.float32)
        y = rng(6).normal(size=(16, 4)).astype(np.float32)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        losses = [float(step(x, y)) for _ in range(steps)]
        traced = step.get_concrete_function(tf.TensorSpec(x.shape), tf.TensorSpec(y.shape))
        # read while the runtime is on: disabling it puts the traced function back
        return losses, [v.numpy() for v in model.trainable_variables], (traced.graph, traced.function_def)
    finally:
        runtime.disable()


# Ops that launch no GPU kernel: constants, aliases, shapes and reads.
HOST = {"Const", "Identity", "Reshape", "Placeholder", "NoOp", "ReadVariableOp", "Shape", "ShapeN"}


def top_level_types(graph) -> list[str]:
    return [op.type for op in graph.get_operations()]


def kernels(types: list[str]) -> int:
    return sum(1 for op in types if op not in HOST)


def test_a_joined_step_trains_bit_for_bit_as_the_one_by_one_step_with_fewer_ops(amp_runtime):
    one_losses, one_weights, (one_graph, _) = keras_step(False, 1024.0)
    joined_losses, joined_weights, (joined_graph, joined_fdef) = keras_step(True, 1024.0)
    assert joined_losses == one_losses and joined_losses[-1] < joined_losses[0]
    for got, want in zip(joined_weights, one_weights):
        np.testing.assert_array_equal(got, want)
    one, joined = top_level_types(one_graph), top_level_types(joined_graph)
    variables = 6  # a kernel and a bias each for three layers; one more IsFinite checks the loss
    assert one.count("MulNoNan") == variables and one.count("IsFinite") == variables + 1
    assert joined.count("MulNoNan") == 1 and joined.count("IsFinite") == 2
    # one by one, three kernels per gradient (MulNoNan, IsFinite, All); joined, six in all (two ConcatV2,
    # SplitV, MulNoNan, IsFinite, All): a ResNet-50 step's 214 gradients would save 636
    assert kernels(one) - kernels(joined) == 3 * variables - 6
    ops = {op.name: op for op in joined_graph.get_operations()}
    joins = [op for op in ops.values() if op.type == "ConcatV2" and op.get_attr("T") != tf.int32]
    assert len(joins) == 2 and all(op.get_attr("T") == tf.float32 for op in joins)  # unscale and check
    # the conv and dense kernels' half gradients are cast up before they join
    inputs = [tensor.op for join in joins for tensor in join.inputs[:-1]]
    casts = [op for op in inputs if op.type == "Cast"]
    assert len(casts) == variables and all(op.get_attr("SrcT") == tf.float16 for op in casts)
    # a trial's float32 variant of the joined step: no unscaling, no guard (nothing reads the checks)
    variant = unscaled_function(joined_fdef)
    assert variant is not None and not {"MulNoNan", "If", "StatelessIf"} & {node.op for node in variant.node_def}


def skip_lines(stderr: str) -> list[str]:
    """The skip lines, the numbers Keras appends to its layers' names (``dense_4``) taken out."""
    import re

    return [re.sub(r"_\d+/", "/", line) for line in stderr.splitlines() if "step skipped" in line]


def test_a_joined_step_skips_and_names_the_same_variables_as_the_one_by_one_step(amp_runtime, capfd):
    """A first scale of 2**24 overflows float16's seed: the steps skip, halving it, until it is finite."""
    one_losses, one_weights, _ = keras_step(False, 2.0 ** 24)
    one_lines = skip_lines(capfd.readouterr().err)
    joined_losses, joined_weights, _ = keras_step(True, 2.0 ** 24)
    joined_lines = skip_lines(capfd.readouterr().err)
    assert one_lines and joined_lines == one_lines, (one_lines, joined_lines)
    assert "conv2d" in joined_lines[0] or "dense" in joined_lines[0]
    assert joined_losses == one_losses
    for got, want in zip(joined_weights, one_weights):
        np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
def test_gpu_joins_the_gradients_unasked_and_trains_and_skips_as_one_by_one(amp_runtime, capfd):
    """On a GPU the default joins them; cuDNN's kernels need not repeat bit for bit, so the losses are close."""
    one_losses, _, (one_graph, _) = keras_step(False, 2.0 ** 24, steps=12)
    one_lines = skip_lines(capfd.readouterr().err)
    joined_losses, _, (joined_graph, _) = keras_step(None, 2.0 ** 24, steps=12)
    joined_lines = skip_lines(capfd.readouterr().err)
    assert top_level_types(one_graph).count("MulNoNan") == 6 and top_level_types(joined_graph).count("MulNoNan") == 1
    assert one_lines and joined_lines == one_lines
    np.testing.assert_allclose(joined_losses, one_losses, rtol=1e-2)
    assert joined_losses[-1] < joined_losses[0]


# --- a TF1 session -----------------------------------------------------------------------------------

X = rng().normal(size=(8, 4)).astype(np.float32)


def tf1_graph(amp_runtime, grouped: bool | None):
    """x → two dense layers → squared error; Adam; built with the float16 loss scaling (None: without)."""
    from amp_rewrite import runtime

    if grouped is not None:
        amp_runtime(RuntimeSettings(target="float16", loss_scale=LossScaleSettings(grouped=grouped)))
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        init = tf1.initializers.random_normal(seed=1, stddev=0.5)
        w1, b1 = tf1.get_variable("w1", [4, 8], initializer=init), tf1.get_variable("b1", [8], initializer=init)
        w2 = tf1.get_variable("w2", [8, 2], initializer=init)
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) - 1.0), name="loss")
        tf1.train.AdamOptimizer(0.05).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
    runtime.disable()
    return graph.as_graph_def()


def session_losses(graph_def, feeds, steps: int = 5):
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        return [float(sess.run(["train_op", "loss:0"], feeds)[1]) for _ in range(steps)]


def test_a_joined_tf1_step_trains_as_the_one_by_one_step_and_its_float32_variant_as_float32(amp_runtime):
    joined, one = tf1_graph(amp_runtime, True), tf1_graph(amp_runtime, False)
    feeds = {"x:0": X}
    assert session_losses(joined, feeds) == session_losses(one, feeds)
    # one IsFinite checks the loss, one the joined gradients; one by one, one each
    assert [n.op for n in joined.node].count("IsFinite") == 2 and [n.op for n in one.node].count("IsFinite") == 4
    # the trial's float32 variant of the joined step: the plain step's losses, bit for bit
    assert session_losses(unscaled_graph_def(joined), feeds) == session_losses(tf1_graph(amp_runtime, None), feeds)
    # inputs of 1e18 overflow the scaled gradients: the joined step skips every step, as the one by one does
    large = {"x:0": X * 1e18}
    assert session_losses(joined, large) == session_losses(one, large) == [session_losses(one, large)[0]] * 5


def test_joined_gradients_follow_the_environment_and_change_no_shared_setting():
    from amp_rewrite.errors import UsageError
    from amp_rewrite.runtime.settings import scales_loss

    def grouped(value):
        return RuntimeSettings.from_env({"AMP_LOSS_SCALE_GROUPED": value}).loss_scale.grouped

    assert [grouped(v) for v in ("1", "on", "0", "off", "")] == [True, True, False, False, None]
    with pytest.raises(UsageError, match="AMP_LOSS_SCALE_GROUPED='sometimes'"):
        grouped("sometimes")
    assert LossScaleSettings(grouped=True) == LossScaleSettings()  # how, not what: workers need not agree
    assert not scales_loss(RuntimeSettings(target="bfloat16", loss_scale=LossScaleSettings(grouped=True)))
    assert core.is_grouped(LossScaleSettings(grouped=True))
    assert not core.is_grouped(LossScaleSettings(grouped=False))
    assert core.is_grouped(LossScaleSettings()) == bool(tf.config.list_logical_devices("GPU"))
