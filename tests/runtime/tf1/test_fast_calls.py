"""Repeated session calls: the call resolved once must behave like Session.run on every later step."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import mlp_session_graph as mlp_graph
from helpers import rng, runner_of, tf1

X = rng().normal(size=(4, 8)).astype(np.float32)


def parts(graph):
    return (graph.get_tensor_by_name("x:0"), graph.get_tensor_by_name("relu1:0"),
            graph.get_tensor_by_name("y:0"), graph.get_operation_by_name("marker"))


def float32_session():
    graph = mlp_graph()
    sess = tf1.Session(graph=graph)
    sess.run("init")
    return sess, parts(graph)


def shadow_run_forbidden(sess, monkeypatch):
    """Later calls must not go through the shadow session's general ``run``."""
    shadow = runner_of(sess).shadow_session

    def fail(*args, **kwargs):
        raise AssertionError("the general path ran")

    monkeypatch.setattr(shadow, "run", fail)


def test_repeated_calls_keep_structure_dtypes_and_values(amp_runtime, monkeypatch):
    plain, (x0, relu0, y0, marker0) = float32_session()
    with plain:
        want = plain.run([y0, marker0, relu0, y0], {x0: X})
        want_tuple = plain.run((relu0,), {x0: X})
    amp_runtime()
    graph = mlp_graph()
    x, relu1, y, marker = parts(graph)
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        first = sess.run([y, marker, relu1, y], {x: X})
        first_tuple = sess.run((relu1,), {x: X})
        first_single = sess.run(relu1, {x: X})
        for _ in range(2):  # the second run of a call resolves it
            sess.run([y, marker, relu1, y], {x: X})
            sess.run((relu1,), {x: X})
            sess.run(relu1, {x: X})
        assert runner_of(sess).shadow_graph.get_tensor_by_name("relu1:0").dtype == tf.float16
        shadow_run_forbidden(sess, monkeypatch)
        later = [sess.run([y, marker, relu1, y], {x: X}) for _ in range(2)]
        later_tuple = sess.run((relu1,), {x: X})
        later_single = sess.run(relu1, {x: X})
    for got in [first, *later]:
        assert type(got) is list and len(got) == 4 and got[1] is None
        for value, expected in zip([got[0], got[2], got[3]], [want[0], want[2], want[3]]):
            assert value.dtype == np.float32
            np.testing.assert_allclose(value, expected, rtol=1e-2, atol=1e-2)
    for got in (first_tuple, later_tuple):
        assert type(got) is tuple and got[0].dtype == np.float32
        np.testing.assert_allclose(got[0], want_tuple[0], rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(later_single, first_single)
    np.testing.assert_array_equal(later[1][0], first[0])


def test_a_tensor_that_became_half_is_fed_in_its_new_dtype_on_every_call(amp_runtime, monkeypatch):
    value = np.abs(rng().normal(size=(4, 16))).astype(np.float32)
    plain, (_, relu0, y0, _) = float32_session()
    with plain:
        want = plain.run(y0, {relu0: value})
    amp_runtime()
    graph = mlp_graph()
    x, relu1, y, _ = parts(graph)
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        sess.run(y, {x: X})  # the rewrite: relu1 becomes half before anyone feeds it
        got = [sess.run(y, {relu1: value}) for _ in range(2)]
        shadow = runner_of(sess).shadow_graph
        shadow_run_forbidden(sess, monkeypatch)
        got += [sess.run(y, {relu1: value}), sess.run(y, {relu1: value.astype(np.float64)})]
    assert shadow.get_tensor_by_name("relu1:0").dtype == tf.float16
    for result in got:
        assert result.dtype == np.float32
        np.testing.assert_allclose(result, want, rtol=1e-2, atol=1e-2)


def test_later_calls_raise_the_errors_session_run_raises(amp_runtime):
    amp_runtime()
    graph = mlp_graph()
    x, _, y, _ = parts(graph)
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        good = sess.run(y, {x: X})
        sess.run(y, {x: X})
        with pytest.raises(ValueError, match="Cannot feed value of shape"):
            sess.run(y, {x: X[:, :4]})
        with pytest.raises(ValueError):
            sess.run(y, {x: np.array([["a"] * 8] * 4)})
        np.testing.assert_array_equal(sess.run(y, {x: X.tolist()}), good)  # a nested list still feeds
        assert runner_of(sess).fallback_reason is None
    with pytest.raises(RuntimeError, match="closed Session"):
        sess.run(y, {x: X})


def test_a_fetch_that_is_also_fed_returns_the_fed_value(amp_runtime):
    amp_runtime()
    graph = mlp_graph()
    x, relu1, y, _ = parts(graph)
    fed = np.full((4, 16), 0.5, np.float32)
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        sess.run(y, {x: X})
        for _ in range(2):
            got_relu, got_y = sess.run([relu1, y], {relu1: fed})
            assert got_relu.dtype == np.float32
            np.testing.assert_array_equal(got_relu, fed)
            assert got_y.shape == (4, 4)


def test_calls_resolved_before_the_graph_grew_see_the_new_shadow(amp_runtime):
    amp_runtime()
    graph = mlp_graph()
    x, _, y, _ = parts(graph)
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        before = [sess.run(y, {x: X}) for _ in range(2)]
        old_shadow = runner_of(sess).shadow_graph
        with graph.as_default():
            w3 = tf1.get_variable("w3", [4, 2], initializer=tf1.initializers.ones())
            z = tf.matmul(y, w3, name="z")
            init3 = w3.initializer
        sess.run(init3)
        after = [sess.run(y, {x: X}) for _ in range(2)]
        z_value = sess.run(z, {x: X})
        new_shadow = runner_of(sess).shadow_graph
    assert new_shadow is not old_shadow
    assert new_shadow.get_operation_by_name("mm1").get_attr("T") == tf.float16
    for value in after:
        np.testing.assert_allclose(value, before[0], rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(z_value, before[0].sum(axis=1, keepdims=True) * np.ones((1, 2)),
                               rtol=2e-2, atol=2e-2)


def test_values_that_need_the_general_path_do_not_resolve_the_call_again(amp_runtime, monkeypatch):
    from amp_rewrite.runtime.tf1.session import fast_calls as session_module

    resolved = []
    resolve = session_module._resolve_call
    monkeypatch.setattr(session_module, "_resolve_call",
                        lambda *args: resolved.append(1) or resolve(*args))
    amp_runtime()
    graph = mlp_graph()
    x, _, y, _ = parts(graph)
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        values = [sess.run(y, {x: X.tolist()}) for _ in range(5)]
    assert len(resolved) == 1
    for value in values[1:]:
        np.testing.assert_array_equal(value, values[0])
