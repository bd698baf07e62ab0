"""Sessions after their first run: grown graphs, loss-scale state, failures in later runs."""

import logging

import numpy as np
import pytest
import tensorflow as tf
from helpers import rng, runner_of, tf1

from amp_rewrite.runtime.loss_scale import tf1_optimizer
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf1.session import RuntimeRewriteError

X = rng().normal(size=(16, 8)).astype(np.float32)
LABELS = np.arange(16) % 4
# Large enough that x @ w1 overflows float16 (max 65504) but not float32.
HUGE = 3e4


def runner(sess):
    return runner_of(sess)


def model(*, with_optimizer=True, check=True):
    """x → mm1 → CheckNumerics → relu → logits → loss, trained by SGD; returns the graph's parts."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        w1 = tf1.get_variable("w1", [8, 16], initializer=tf1.initializers.random_normal(seed=1))
        w2 = tf1.get_variable("w2", [16, 4], initializer=tf1.initializers.random_normal(seed=2))
        hidden = tf.matmul(x, w1, name="mm1")
        if check:
            hidden = tf.debugging.check_numerics(hidden, "hidden overflowed", name="checked")
        logits = tf.matmul(tf.nn.relu(hidden), w2, name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits), name="loss")
        train = None
        if with_optimizer:
            train = tf1.train.GradientDescentOptimizer(1e-3).minimize(loss, name="train")
    return graph, dict(x=x, labels=labels, w1=w1, w2=w2, loss=loss, train=train)


def feed(parts, scale=1.0):
    return {parts["x"]: X * scale, parts["labels"]: LABELS}


def float32_run(steps):
    """Loss and w1 after each (scale) step of ``steps``, without the runtime."""
    graph, parts = model()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        return [(sess.run([parts["loss"], parts["train"]], feed(parts, s))[0], sess.run(parts["w1"]))
                for s in steps]


def test_loss_scale_state_is_initialised_when_the_initialiser_ran_before_the_optimizer(amp_runtime):
    amp_runtime(RuntimeSettings(target="float16"))
    graph, parts = model(with_optimizer=False)
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(parts["loss"])
        losses = [sess.run([parts["loss"], train], feed(parts))[0] for _ in range(3)]
        scale, good, skipped = sess.run(graph.get_collection(tf1_optimizer.STATE_COLLECTION))
    assert losses[-1] < losses[0]
    assert (scale, good, skipped) == (2.0 ** 15, 3, 0)


def test_loss_scale_state_is_initialised_when_the_script_lists_its_variables(amp_runtime):
    amp_runtime(RuntimeSettings(target="float16"))
    graph, parts = model()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.variables_initializer([parts["w1"], parts["w2"]]))
        sess.run(parts["train"], feed(parts))
        assert sess.run(graph.get_collection(tf1_optimizer.STATE_COLLECTION)[1]) == 1


def test_loss_scale_state_is_initialised_in_the_float32_fallback(amp_runtime, monkeypatch):
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD", "Exp")  # rewrite fails
    amp_runtime(RuntimeSettings(target="float16"))
    graph, parts = model(with_optimizer=False)
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(parts["loss"])
        sess.run(train, feed(parts))
        assert runner(sess).fallback_reason.startswith("rewrite failed")


def test_a_failure_in_a_later_run_falls_back_with_the_trained_values(amp_runtime, caplog):
    steps = [1.0, 1.0, 1.0, HUGE, 1.0]
    want = float32_run(steps)
    amp_runtime(RuntimeSettings(target="float16"))
    graph, parts = model()
    got = []
    with graph.as_default(), tf1.Session(graph=graph) as sess, \
            caplog.at_level(logging.WARNING, "amp_rewrite"):
        sess.run(tf1.global_variables_initializer())
        for s in steps:
            got.append((sess.run([parts["loss"], parts["train"]], feed(parts, s))[0],
                        sess.run(parts["w1"])))
        reason = runner(sess).fallback_reason
        shadow = runner(sess).shadow_graph
    assert reason.startswith("the rewritten graph failed to run: InvalidArgumentError")
    assert "hidden overflowed" in reason and "(node checked)" in reason
    assert [r.getMessage() for r in caplog.records] == [
        f"amp-rewrite: running the float32 graph: {reason}"]
    assert shadow.get_operation_by_name("mm1").get_attr("T") == tf.float32
    for (loss, w1), (want_loss, want_w1) in zip(got, want):
        np.testing.assert_allclose(loss, want_loss, rtol=5e-3)
        np.testing.assert_allclose(w1, want_w1, rtol=5e-3, atol=1e-3)


def test_strict_mode_raises_on_a_later_failure_and_keeps_the_rewrite(amp_runtime):
    amp_runtime(RuntimeSettings(target="float16", is_strict=True))
    graph, parts = model()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(parts["train"], feed(parts))
        w1 = sess.run(parts["w1"])
        with pytest.raises(RuntimeRewriteError, match="InvalidArgumentError"):
            sess.run(parts["train"], feed(parts, HUGE))
        assert runner(sess).fallback_reason is None
        assert runner(sess).shadow_graph.get_operation_by_name("mm1").get_attr("T") == tf.float16
        np.testing.assert_array_equal(sess.run(parts["w1"]), w1)  # the float32 try left no trace


def test_a_script_error_in_a_later_run_reaches_the_script_and_keeps_the_rewrite(amp_runtime):
    amp_runtime(RuntimeSettings(target="float16"))
    graph, parts = model()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(parts["train"], feed(parts))
        with pytest.raises(tf.errors.InvalidArgumentError, match="label value of 13"):
            sess.run(parts["train"], {parts["x"]: X, parts["labels"]: LABELS + 10})
        assert runner(sess).fallback_reason is None


def test_the_end_of_the_input_is_not_blamed_on_the_rewrite(amp_runtime, monkeypatch):
    amp_runtime(RuntimeSettings(target="float16"))
    graph = tf.Graph()
    with graph.as_default():
        data = tf1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices(X[:2]).batch(1)).get_next()
        w = tf1.get_variable("w", [8, 2], initializer=tf1.ones_initializer())
        out = tf.matmul(data, w, name="mm")
    with tf1.Session(graph=graph) as sess:
        sess.run(w.initializer)
        sess.run(out), sess.run(out)
        copies = []
        monkeypatch.setattr(type(runner(sess).keeper), "_float32_copy", lambda self: copies.append(1))
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(out)
        assert runner(sess).fallback_reason is None and not copies


def test_ops_that_convert_rewrite_again_and_others_are_imported(amp_runtime):
    amp_runtime(RuntimeSettings(target="float16"))
    graph, parts = model()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(parts["train"], feed(parts))
        w1 = sess.run(parts["w1"])
        tf1.summary.scalar("loss", parts["loss"])
        summaries = tf1.summary.merge_all()
        sess.run(summaries, feed(parts))
        assert runner(sess).rewrites == 1 and runner(sess).fallback_reason is None
        head = tf.matmul(parts["loss"] * tf.ones([1, 3]), tf.ones([3, 2]), name="late_mm")
        sess.run(tf.nn.relu(head), feed(parts))
        assert runner(sess).rewrites == 2 and runner(sess).fallback_reason is None
        shadow = runner(sess).shadow_graph
        np.testing.assert_array_equal(sess.run(parts["w1"]), w1)
    assert shadow.get_operation_by_name("late_mm").get_attr("T") == tf.float16


def test_a_scaffold_that_initialises_only_the_model_is_ready(amp_runtime, tmp_path):
    amp_runtime(RuntimeSettings(target="float16"))
    graph, parts = model()
    with graph.as_default():
        step = tf1.train.get_or_create_global_step()
        increment = tf1.assign_add(step, 1)
        model_variables = [parts["w1"], parts["w2"], step]
        scaffold = tf1.train.Scaffold(init_op=tf1.variables_initializer(model_variables))
        with tf1.train.MonitoredTrainingSession(scaffold=scaffold, checkpoint_dir=None) as sess:
            losses = [sess.run([parts["loss"], parts["train"], increment], feed(parts))[0]
                      for _ in range(3)]
    assert losses[-1] < losses[0]


def test_a_checkpoint_of_the_model_alone_restores_and_trains(amp_runtime, tmp_path):
    graph, parts = model()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        path = tf1.train.Saver().save(sess, str(tmp_path / "fp32"))
    amp_runtime(RuntimeSettings(target="float16"))
    graph, parts = model()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        tf1.train.Saver(var_list=[parts["w1"], parts["w2"]]).restore(sess, path)
        losses = [sess.run([parts["loss"], parts["train"]], feed(parts))[0] for _ in range(3)]
        scale = sess.run(graph.get_collection(tf1_optimizer.STATE_COLLECTION)[0])
    assert losses[-1] < losses[0] and scale == 2.0 ** 15


def test_a_graph_that_keeps_growing_stops_being_rewritten(amp_runtime, monkeypatch, caplog):
    from amp_rewrite.runtime.tf1.session import keeper as session

    monkeypatch.setattr(session, "MAX_REWRITES", 2)
    amp_runtime(RuntimeSettings(target="float16"))
    graph, parts = model(with_optimizer=False)
    with graph.as_default(), tf1.Session(graph=graph) as sess, \
            caplog.at_level(logging.INFO, "amp_rewrite"):
        sess.run(tf1.global_variables_initializer())
        results = [sess.run(tf.nn.relu(tf.matmul(parts["x"], parts["w1"], name=f"loop_mm{i}")),
                            feed(parts)) for i in range(4)]
        shadow = runner(sess).shadow_graph
    assert shadow.get_operation_by_name("loop_mm0").get_attr("T") == tf.float16
    assert shadow.get_operation_by_name("loop_mm3").get_attr("T") == tf.float32
    assert sum("keeps growing" in r.getMessage() for r in caplog.records) == 1
    np.testing.assert_allclose(results[3], results[0], rtol=1e-2, atol=1e-2)
