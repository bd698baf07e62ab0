"""tf.function under the runtime, amp_rewrite.function and rewrite_concrete_function.

A small conv + matmul model is traced with and without the tracing hook; the
tests compare numbers with a float32 trace of the same model and check the
dtypes of the ops each traced graph holds.
"""

import logging
from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf
from helpers import rng
from tensorflow.python.eager.polymorphic_function import transform

import amp_rewrite
from amp_rewrite import runtime, tf_internals
from amp_rewrite.errors import GraphError
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf1.session import RuntimeRewriteError
from amp_rewrite.runtime.tf2 import concrete, tracing

X = rng(1).normal(size=(4, 8, 8, 3)).astype(np.float32)
Y = rng(2).normal(size=(4, 5)).astype(np.float32)


class ConvNet(tf.Module):
    """conv 3x3 → relu → flatten → matmul; float32 variables from a fixed seed."""

    def __init__(self, seed=0):
        super().__init__()
        r = rng(seed)
        self.kernel = tf.Variable(r.normal(scale=0.3, size=(3, 3, 3, 8)).astype(np.float32))
        self.dense = tf.Variable(r.normal(scale=0.05, size=(8 * 8 * 8, 5)).astype(np.float32))

    def __call__(self, x):
        h = tf.nn.relu(tf.nn.conv2d(x, self.kernel, 1, "SAME"))
        return tf.matmul(tf.reshape(h, [-1, 8 * 8 * 8]), self.dense)



def half_op_types(graph) -> set[str]:
    """Types of the ops of ``graph`` with a half type attr (Casts excluded)."""
    found = set()
    for op in graph.get_operations():
        if op.type == "Cast":
            continue
        for value in op.node_def.attr.values():
            if value.type in (tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum):
                found.add(op.type)
    return found


def float32_reference(net=None):
    """Outputs and concrete function of a plain tf.function traced with no hook."""
    assert all(hook.runtime is None for hook in tracing.installed_hooks())
    function = tf.function((net or ConvNet()).__call__)
    return function(X).numpy(), function.get_concrete_function(X)


def assert_half_close(got, want):
    """Close at half precision, but not the float32 numbers themselves."""
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    assert not np.array_equal(got, want)


def test_traced_function_runs_half_math_with_the_traced_signature(amp_runtime):
    net = ConvNet()
    want, reference = float32_reference(net)
    amp_runtime()
    function = tf.function(net.__call__)
    got = function(X).numpy()
    traced = function.get_concrete_function(X)
    assert_half_close(got, want)
    assert half_op_types(traced.graph) >= {"Conv2D", "MatMul", "Relu"}
    assert not half_op_types(reference.graph)
    assert traced.pretty_printed_signature() == reference.pretty_printed_signature()
    assert traced.structured_outputs.dtype == tf.float32
    assert [v.dtype for v in traced.variables] == [tf.float32, tf.float32]
    assert tracing.record_of(traced).report.summary.startswith("converted ")


def test_without_the_hook_outputs_are_the_float32_ones_exactly(amp_runtime):
    want, _ = float32_reference()
    amp_runtime()
    function = tf.function(ConvNet().__call__)
    assert not np.array_equal(function(X).numpy(), want)
    runtime.disable()  # puts back the traced function
    assert np.array_equal(function(X).numpy(), want)
    assert not half_op_types(function.get_concrete_function(X).graph)
    fresh = tf.function(ConvNet().__call__)
    assert np.array_equal(fresh(X).numpy(), want)
    assert not half_op_types(fresh.get_concrete_function(X).graph)


def training_step(net):
    """One SGD step with the GradientTape inside the function."""
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(net(x) - y))
        for variable, grad in zip([net.kernel, net.dense], tape.gradient(loss, [net.kernel, net.dense])):
            variable.assign_sub(0.005 * grad)
        return loss

    return step


def test_training_step_gets_half_forward_and_backward_math(amp_runtime):
    fp32_net, amp_net = ConvNet(), ConvNet()
    fp32_step = training_step(fp32_net)
    fp32_losses = [float(fp32_step(X, Y)) for _ in range(10)]
    amp_runtime()
    amp_step = training_step(amp_net)
    amp_losses = [float(amp_step(X, Y)) for _ in range(10)]
    graph = amp_step.get_concrete_function(X, Y).graph
    assert half_op_types(graph) >= {"Conv2D", "Conv2DBackpropFilter", "MatMul", "ReluGrad"}
    assert sum(op.type == "MatMul" and op.get_attr("T") == tf.float16 for op in graph.get_operations()) == 3
    assert amp_losses[-1] < 0.1 * amp_losses[0]
    np.testing.assert_allclose(amp_losses, fp32_losses, rtol=2e-2)
    assert amp_losses != fp32_losses
    assert amp_net.kernel.dtype == amp_net.dense.dtype == tf.float32


def outer_gradients(function, net, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(tf.square(function(x)))
    return [g.numpy() for g in tape.gradient(loss, [x, net.kernel, net.dense])]


def test_gradients_from_an_outer_tape_go_through_the_rewritten_function(amp_runtime):
    net = ConvNet()
    want = outer_gradients(tf.function(net.__call__), net, tf.constant(X))
    amp_runtime()
    function = tf.function(net.__call__)
    got = outer_gradients(function, net, tf.constant(X))
    assert not tracing.record_of(function.get_concrete_function(X)).report.is_inference_only
    for g, w in zip(got, want):
        assert_half_close(g, w)


def test_outer_tape_reaches_through_nested_functions_and_loops(amp_runtime):
    net = ConvNet()

    def looped(x):
        inner = tf.function(net.__call__)
        h = inner(x)
        _, h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(h) * 2.0), (0, h))
        return h

    want = outer_gradients(tf.function(looped), net, tf.constant(X))
    amp_runtime()
    function = tf.function(looped)
    got = outer_gradients(function, net, tf.constant(X))
    graph = function.get_concrete_function(X).graph
    types = {op.type for op in graph.get_operations()}
    assert {"While", "StatelessWhile"} & types and "StatefulPartitionedCall" in types
    for g, w in zip(got, want):
        assert_half_close(g, w)


@tf.custom_gradient
def clipped_gradient(x):
    return tf.identity(x), lambda dy: tf.clip_by_value(dy, -0.1, 0.1)


def test_custom_gradients_make_calls_under_a_tape_run_float32(amp_runtime, caplog):
    net = ConvNet()

    def model(x):
        return clipped_gradient(net(x))

    want_outputs = tf.function(model)(X).numpy()
    want_gradients = outer_gradients(tf.function(model), net, tf.constant(X))
    amp_runtime()
    function = tf.function(model)
    with caplog.at_level(logging.INFO, "amp_rewrite"):
        assert_half_close(function(X).numpy(), want_outputs)
    assert tracing.record_of(function.get_concrete_function(X)).report.is_inference_only
    assert any("custom gradient" in r.getMessage() for r in caplog.records)
    for g, w in zip(outer_gradients(function, net, tf.constant(X)), want_gradients):
        assert np.array_equal(g, w)


def test_failed_rewrite_warns_and_runs_float32(amp_runtime, monkeypatch, caplog):
    def failing(concrete_function, config):
        raise GraphError("node 'x' is broken")

    net = ConvNet()
    want, _ = float32_reference(net)
    monkeypatch.setattr(concrete, "rewrite_concrete", failing)
    amp_runtime()
    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        assert np.array_equal(tf.function(net.__call__)(X).numpy(), want)
    assert [r.getMessage() for r in caplog.records] == [
        "amp-rewrite: tf.function __call__ runs in float32: rewrite failed: "
        "GraphError: node 'x' is broken"]
    runtime.disable()
    amp_runtime(RuntimeSettings(is_strict=True, target="float16"))
    with pytest.raises(RuntimeRewriteError, match="node 'x' is broken"):
        tf.function(net.__call__)(X)


def test_first_run_failure_falls_back_to_the_traced_function(amp_runtime, monkeypatch, caplog):
    broken = tf.function(lambda x: tf.debugging.check_numerics(x / 0.0, "rewritten"))
    broken = broken.get_concrete_function(tf.TensorSpec([4, 5]))  # traced before the hook

    rewrite_concrete = concrete.rewrite_concrete

    def failing_at_run_time(concrete_function, config):
        return replace(rewrite_concrete(concrete_function, config), concrete_function=broken)

    monkeypatch.setattr(concrete, "rewrite_concrete", failing_at_run_time)
    amp_runtime()
    function = tf.function(lambda x: x * 2.0)
    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        assert np.array_equal(function(Y).numpy(), Y * 2.0)
        assert np.array_equal(function(Y).numpy(), Y * 2.0)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "failed to run: InvalidArgumentError" in messages[0]
    assert tracing.record_of(function.get_concrete_function(Y)) is None


def test_a_rewritten_function_failing_inside_its_caller_falls_back_there(amp_runtime, monkeypatch, caplog):
    """Keras 3's ``fit`` calls its one-step function only inside its outer train function's graph."""
    broken = tf.function(lambda x: tf.debugging.check_numerics(x / 0.0, "rewritten"))
    broken = broken.get_concrete_function(tf.TensorSpec([4, 5]))  # traced before the hook
    rewrite_concrete = concrete.rewrite_concrete

    def inner_fails_at_run_time(concrete_function, config):
        result = rewrite_concrete(concrete_function, config)
        is_inner = "inner" in str(concrete_function.graph.name)
        return replace(result, concrete_function=broken) if is_inner else result

    monkeypatch.setattr(concrete, "rewrite_concrete", inner_fails_at_run_time)
    amp_runtime()

    @tf.function
    def inner(x):
        return x * 2.0

    @tf.function
    def outer(x):
        return inner(x) + 1.0

    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        assert np.array_equal(outer(Y).numpy(), Y * 2.0 + 1.0)
        assert np.array_equal(outer(Y).numpy(), Y * 2.0 + 1.0)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "(called by outer)" in messages[0]
    assert "failed to run: InvalidArgumentError" in messages[0]


def test_amp_rewrite_function_needs_no_switch_and_leaves_other_functions_alone():
    runtime.disable()
    net = ConvNet()
    want, _ = float32_reference(net)
    function = amp_rewrite.function(net.__call__)
    assert_half_close(function(X).numpy(), want)
    assert "Conv2D" in half_op_types(function.get_concrete_function(X).graph)
    assert np.array_equal(tf.function(net.__call__)(X).numpy(), want)
    assert not runtime.is_enabled()


def test_a_function_marked_while_the_runtime_is_on_keeps_its_rewrite_after_disable(amp_runtime):
    net = ConvNet()
    want, _ = float32_reference(net)
    amp_rewrite.function(ConvNet().__call__)(X)  # the marked functions' hook exists before the runtime's
    amp_runtime(RuntimeSettings(target="bfloat16"))
    marked = amp_rewrite.function(net.__call__, target="float16")
    plain = tf.function(net.__call__)
    assert_half_close(marked(X).numpy(), want)
    assert_half_close(plain(X).numpy(), want)
    traced = marked.get_concrete_function(X)
    record = tracing.record_of(traced)
    assert record.report.is_explicit  # the runtime's hook rewrote it, with the function's own target
    assert any(op.type == "MatMul" and op.get_attr("T") == tf.float16
               for op in record.rewritten.concrete_function.graph.get_operations())
    runtime.disable()
    assert tracing.record_of(traced) is record  # now the marked functions' hook's
    assert [hook.runtime for hook in tracing.installed_hooks()] == [None]
    assert_half_close(marked(X).numpy(), want)
    assert np.array_equal(plain(X).numpy(), want)  # the runtime's own swap was put back


def test_each_enable_starts_with_a_fresh_runtime_value(amp_runtime):
    model = ConvNet()
    amp_runtime()
    first = runtime._ACTIVE  # pylint: disable=protected-access
    training_step(model)(X, Y)
    scaling = runtime.loss_scaling()
    assert scaling.has_state() and first.tracing is not None and first.tracing.history
    runtime.disable()
    assert not scaling.is_installed and first.tracing is None and first.loss_scaling is None
    assert first.ledger.installed() == [] and runtime.loss_scaling() is None
    amp_runtime()
    second = runtime._ACTIVE  # pylint: disable=protected-access
    assert second is not first and second.tracing.history == []
    assert not runtime.loss_scaling().has_state()  # a new scale, not the last run's


def test_amp_rewrite_function_as_decorator_with_options_autograph_and_methods():
    runtime.disable()
    net = ConvNet()

    @amp_rewrite.function(input_signature=[tf.TensorSpec([None, 8, 8, 3])], target="bfloat16")
    def signed(x):
        y = net(x)
        if tf.reduce_sum(x) > 0:  # autograph turns this into a tf.cond
            y = -y
        return y

    class Model(tf.Module):
        @amp_rewrite.function
        def __call__(self, x):
            return net(x)

    assert signed(X).dtype == tf.float32
    graph = signed.get_concrete_function().graph
    assert any(op.type == "MatMul" and op.get_attr("T") == tf.bfloat16 for op in graph.get_operations())
    assert {"If", "StatelessIf"} & {op.type for op in graph.get_operations()}
    assert_half_close(Model()(X).numpy(), tf.function(net.__call__)(X).numpy())


def test_rewrite_concrete_function_returns_a_new_function_and_keeps_the_original():
    net = ConvNet()
    original = tf.function(net.__call__).get_concrete_function(tf.TensorSpec([None, 8, 8, 3]))
    want = original(X).numpy()
    new = amp_rewrite.rewrite_concrete_function(original)
    assert new is not original
    assert_half_close(new(x=tf.constant(X)).numpy(), want)
    assert np.array_equal(original(X).numpy(), want)
    assert not half_op_types(original.graph)
    assert new.structured_input_signature == original.structured_input_signature
    assert (new.output_dtypes, new.output_shapes) == (original.output_dtypes, original.output_shapes)
    net.dense.assign(net.dense * 2.0)  # reads the same variables
    assert_half_close(new(X).numpy(), original(X).numpy())
    assert amp_rewrite.rewrite_concrete_function(new) is new


def test_enable_is_idempotent_and_tf_data_functions_stay_float32(amp_runtime):
    amp_runtime()
    amp_runtime()
    assert [hook.runtime is not None for hook in tracing.installed_hooks()].count(True) == 1
    before = len(tracing.rewritten_functions())
    w = tf.constant(rng(3).normal(size=(8, 8)).astype(np.float32))
    dataset = tf.data.Dataset.from_tensor_slices(Y[:, :4].repeat(2, axis=1)).map(lambda v: tf.linalg.matvec(w, v))
    assert np.allclose(list(dataset.as_numpy_iterator())[0], w.numpy() @ Y[0, :4].repeat(2), rtol=1e-6)
    assert len(tracing.rewritten_functions()) == before


def test_missing_tracing_internal_keeps_functions_float32(amp_runtime, monkeypatch, caplog):
    runtime.disable()
    absent = "tensorflow.python.eager.polymorphic_function.transform:NO_SUCH_CALLBACKS"
    monkeypatch.setattr(tf_internals, "TRACING", replace(tf_internals.TRACING,
                                                         symbols=tf_internals.TRACING.symbols + (absent,)))
    monkeypatch.setattr(transform, "CONCRETE_FUNCTION_CALLBACKS",
                        [c for c in transform.CONCRETE_FUNCTION_CALLBACKS
                         if not isinstance(getattr(c, "__self__", None), tracing.TracingHook)])
    net = ConvNet()
    want, _ = float32_reference(net)
    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        amp_runtime()
        assert np.array_equal(tf.function(net.__call__)(X).numpy(), want)
        assert np.array_equal(amp_rewrite.function(net.__call__)(X).numpy(), want)
    assert tracing.installed_hooks() == []
    assert len(caplog.records) == 2
    assert caplog.records[0].getMessage() == (
        f"amp-rewrite: tf.function traces run in float32: TensorFlow {tf.__version__} lacks {absent}, "
        "which tf.function tracing under amp-rewrite needs")
    assert caplog.records[1].getMessage() == caplog.records[0].getMessage()
