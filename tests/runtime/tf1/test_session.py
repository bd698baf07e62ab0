"""Patched sessions: the shadow graph, dtypes, feeds, late ops, caching, fallback."""

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
from helpers import mlp_session_graph as mlp_graph
from helpers import rng, runner_of, tf1

import amp_rewrite
from amp_rewrite.paint.op_lists import load_lists
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf1.session import CAST_BACK_SUFFIX, RuntimeRewriteError
from amp_rewrite.runtime.tf1.session import keeper as session_module

X = rng().normal(size=(4, 8)).astype(np.float32)



def float32_values(fetches, feeds=None):
    graph = mlp_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run(graph.get_operation_by_name("init"))
        return sess.run(fetches, feeds or {"x:0": X})


def runner(sess):
    return runner_of(sess)


def test_session_runs_the_rewritten_graph_and_returns_script_dtypes(amp_runtime):
    want = float32_values("y:0")
    amp_runtime()
    graph = mlp_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        got = sess.run("y:0", {"x:0": X})
        shadow = runner(sess).shadow_graph
        assert sess.graph is graph
    assert shadow.get_operation_by_name("mm1").get_attr("T") == tf.float16
    assert shadow.get_operation_by_name("y").get_attr("T") == tf.float32  # fetched: kept
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    assert not np.array_equal(got, want)


def test_converted_tensors_are_fetched_and_fed_in_the_script_dtype(amp_runtime):
    relu_want, y_want = float32_values(["relu1:0", "y:0"])
    amp_runtime()
    graph = mlp_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        sess.run("y:0", {"x:0": X})
        assert runner(sess).shadow_graph.get_tensor_by_name("relu1:0").dtype == tf.float16
        relu = sess.run(graph.get_tensor_by_name("relu1:0"), {"x:0": X})
        y_from_relu = sess.run("y:0", {"relu1:0": relu_want})
    assert relu.dtype == np.float32
    np.testing.assert_allclose(relu, relu_want, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(y_from_relu, y_want, rtol=2e-2, atol=2e-2)


def test_graph_is_rewritten_once_and_plans_are_cached(amp_runtime, monkeypatch):
    calls = []
    real_rewrite = amp_rewrite.rewrite
    monkeypatch.setattr(session_module, "rewrite", lambda *a, **k: calls.append(1) or real_rewrite(*a, **k))
    amp_runtime()
    graph = mlp_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        for _ in range(3):
            sess.run("y:0", {"x:0": X})
        plans = dict(runner(sess).plans)
        with graph.as_default():
            tf.identity(graph.get_tensor_by_name("y:0"), name="late")
        sess.run("late:0", {"x:0": X})
    assert len(calls) == 1
    assert len(plans) == 2  # init, then y with x fed
    assert len(runner(sess).plans) == 3


def test_ops_added_after_the_first_run_read_converted_tensors_as_built(amp_runtime):
    relu_want = float32_values("relu1:0")
    amp_runtime()
    graph = mlp_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        sess.run("y:0", {"x:0": X})
        with graph.as_default():
            marker = graph.get_operation_by_name("marker")
            with tf.control_dependencies([marker]):
                doubled = tf.multiply(graph.get_tensor_by_name("relu1:0"), 2.0, name="doubled")
            extra = tf1.get_variable("extra", [2], initializer=tf1.ones_initializer())
        sess.run(extra.initializer)
        value, extra_value = sess.run([doubled, extra], {"x:0": X})
        shadow = runner(sess).shadow_graph
    assert shadow.get_operation_by_name("doubled").get_attr("T") == tf.float32
    assert shadow.get_tensor_by_name(f"relu1-0-{CAST_BACK_SUFFIX}:0").dtype == tf.float32
    assert [op.name for op in shadow.get_operation_by_name("doubled/y").control_inputs] == \
        ["marker-Done-AmpRewrite"]
    np.testing.assert_allclose(value, 2 * relu_want, rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(extra_value, [1.0, 1.0])


def test_failed_rewrite_warns_and_runs_float32(amp_runtime, monkeypatch, caplog):
    want = float32_values("y:0")
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD", "Exp")
    amp_runtime()
    graph = mlp_graph()
    with caplog.at_level(logging.WARNING, "amp_rewrite"), tf1.Session(graph=graph) as sess:
        sess.run("init")
        got = sess.run("y:0", {"x:0": X})
        reason = runner(sess).fallback_reason
    np.testing.assert_array_equal(got, want)
    assert reason.startswith("rewrite failed: ListError: op Exp is in both")
    assert [r.getMessage() for r in caplog.records] == [
        f"amp-rewrite: running the float32 graph: {reason}"]


def test_strict_mode_raises_instead(amp_runtime, monkeypatch):
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD", "Exp")
    amp_runtime(RuntimeSettings(is_strict=True, target="float16"))
    graph = mlp_graph()
    with tf1.Session(graph=graph) as sess, pytest.raises(RuntimeRewriteError, match="ListError"):
        sess.run("init")


def test_rewritten_graph_that_fails_to_run_falls_back(amp_runtime, monkeypatch, caplog):
    def unplaceable(graph_def, **kwargs):
        out = tf1.GraphDef()
        out.CopyFrom(graph_def)
        for node in out.node:
            node.device = "/device:GPU:7"
        return SimpleNamespace(graph_def=out, lists=load_lists("float16"), summary=lambda: "pinned to a missing GPU")

    want = float32_values("y:0")
    monkeypatch.setattr(session_module, "rewrite", unplaceable)
    amp_runtime()
    graph = mlp_graph()
    with caplog.at_level(logging.WARNING, "amp_rewrite"), tf1.Session(graph=graph) as sess:
        sess.run("init")
        got = sess.run("y:0", {"x:0": X})
    np.testing.assert_array_equal(got, want)
    assert "the rewritten graph failed to run: InvalidArgumentError" in caplog.text


def test_script_errors_are_tensorflows_and_keep_the_rewrite(amp_runtime):
    amp_runtime()
    graph = mlp_graph()
    with tf1.Session(graph=graph) as sess:
        with pytest.raises(ValueError, match="Cannot feed value of shape"):
            sess.run("y:0", {"x:0": np.zeros((2, 3))})  # the float32 graph fails alike
        assert runner(sess).fallback_reason is None
        sess.run("init")
        assert sess.run("y:0", {"x:0": X}).dtype == np.float32


def test_callables_run_the_shadow_graph(amp_runtime):
    from tensorflow.core.protobuf import config_pb2

    want = float32_values("y:0")
    amp_runtime()
    graph = mlp_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        by_list = sess.make_callable("y:0", ["x:0"])(X)
        options = config_pb2.CallableOptions(feed=["x:0"], fetch=["y:0", "relu1:0"])
        by_options = sess._make_callable_from_options(options)(X)
        shadow = runner(sess).shadow_graph
    assert shadow.get_operation_by_name("mm1").get_attr("T") == tf.float16
    for value in (by_list, by_options[0]):
        assert value.dtype == np.float32
        np.testing.assert_allclose(value, want, rtol=2e-2, atol=2e-2)
    assert by_options[1].dtype == np.float32


def test_fetch_structures_come_back_as_built(amp_runtime):
    amp_runtime()
    graph = mlp_graph()
    y, relu = graph.get_tensor_by_name("y:0"), graph.get_tensor_by_name("relu1:0")
    with tf1.Session(graph=graph) as sess:
        assert sess.run(graph.get_operation_by_name("init")) is None
        as_tuple = sess.run((y, relu), {"x:0": X})
        as_list = sess.run([y, y], {graph.get_tensor_by_name("x:0"): X})
        as_dict = sess.run({"y": y, "nested": [relu]}, {"x:0": X})
    assert type(as_tuple) is tuple and type(as_list) is list
    np.testing.assert_array_equal(as_list[0], as_list[1])
    np.testing.assert_array_equal(as_dict["y"], as_tuple[0])
    assert as_dict["nested"][0].dtype == np.float32


def test_partial_runs_use_the_shadow_graph(amp_runtime):
    want = float32_values("y:0")
    amp_runtime()
    graph = mlp_graph()
    y, relu, x = (graph.get_tensor_by_name(n) for n in ("y:0", "relu1:0", "x:0"))
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        handle = sess.partial_run_setup([relu, y], [x])
        relu_value = sess.partial_run(handle, relu, {x: X})
        y_value = sess.partial_run(handle, y)
    assert relu_value.dtype == y_value.dtype == np.float32
    np.testing.assert_allclose(y_value, want, rtol=2e-2, atol=2e-2)
