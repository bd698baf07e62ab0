"""A patched session's fallback state: its named transitions, whose a failure is, its one warning."""

import importlib
import logging

import pytest
import tensorflow as tf

from amp_rewrite.runtime.tf1.session.fallback import FallbackState, Mode

SESSION_LOGGER = "amp_rewrite.runtime.tf1.session"


def test_a_session_starts_on_the_rewritten_graph_and_blames_the_rewrite():
    state = FallbackState()
    assert state.mode is Mode.REWRITTEN and state.reason is None
    assert state.is_rewritten and not state.runs_script_graph
    assert state.blames_rewrite(ValueError("bad kernel"))
    # How scripts stop, in float32 too: never the rewrite's.
    assert not state.blames_rewrite(tf.errors.OutOfRangeError(None, None, "end of input"))
    assert not state.blames_rewrite(tf.errors.CancelledError(None, None, "cancelled"))


def test_a_retry_that_fails_too_keeps_the_rewrite():
    state = FallbackState()
    state.try_float32("the rewritten graph failed to run: ValueError: x")
    assert state.mode is Mode.TRYING_FLOAT32
    assert state.reason == "the rewritten graph failed to run: ValueError: x"
    assert not state.is_rewritten and not state.runs_script_graph
    assert not state.blames_rewrite(ValueError("bad feed"))  # the script's, while trying float32
    state.keep_rewrite()
    assert state.mode is Mode.REWRITTEN and state.reason is None and state.is_rewritten


def test_a_retry_that_succeeds_falls_back_to_the_float32_copy_with_one_warning(caplog):
    state = FallbackState()
    with caplog.at_level(logging.WARNING, SESSION_LOGGER):
        state.try_float32("why")
        assert not caplog.records  # only falling back is said
        state.fall_back("why", keeps_values=True)
    assert state.mode is Mode.FLOAT32_COPY and state.reason == "why"
    assert not state.is_rewritten and not state.runs_script_graph
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (SESSION_LOGGER, logging.WARNING, "amp-rewrite: running the float32 graph: why")]


def test_without_a_float32_copy_the_script_graph_runs():
    state = FallbackState()
    state.fall_back("rewrite failed: ValueError: x", keeps_values=False)
    assert state.mode is Mode.SCRIPT_GRAPH and state.runs_script_graph and not state.is_rewritten
    assert state.reason == "rewrite failed: ValueError: x"


@pytest.mark.parametrize("setup, move", [
    ([], lambda s: s.keep_rewrite()),  # nothing was being tried
    (["try"], lambda s: s.try_float32("again")),  # one retry at a time
    (["try"], lambda s: s.fall_back("x", keeps_values=False)),  # a retry always has its copy
    (["copy"], lambda s: s.try_float32("x")),  # float32 for good
    (["copy"], lambda s: s.fall_back("x", keeps_values=True)),
    (["script"], lambda s: s.fall_back("x", keeps_values=True)),
    (["script"], lambda s: s.keep_rewrite()),
])
def test_a_transition_from_the_wrong_mode_is_refused(setup, move):
    state = FallbackState()
    steps = {"try": lambda: state.try_float32("first"),
             "copy": lambda: state.fall_back("first", keeps_values=True),
             "script": lambda: state.fall_back("first", keeps_values=False)}
    for name in setup:
        steps[name]()
    mode, reason = state.mode, state.reason
    with pytest.raises(RuntimeError, match="session fallback: no transition from"):
        move(state)
    assert (state.mode, state.reason) == (mode, reason)  # a refused move changes nothing


@pytest.mark.parametrize("module", [*(f"amp_rewrite.runtime.tf1.session.{name}" for name in
                                      ("fallback", "fast_calls", "keeper", "patches", "runner")),
                                    "amp_rewrite.runtime.loss_scale.tf1_session_log"])
def test_every_module_of_the_package_logs_under_the_session_name(module):
    """The session's loss-scale lines too, which the loss-scaling package logs."""
    loaded = importlib.import_module(module)
    assert loaded.logger.name == SESSION_LOGGER



def test_an_evaluation_fetch_runs_float32_after_training_fell_back(amp_runtime, caplog):
    """The session's fallback covers every fetch of its graph: evaluating the model it trained, too."""
    import numpy as np

    from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

    tf1 = tf.compat.v1
    amp_runtime(RuntimeSettings(target="float16", loss_scale=LossScaleSettings(initial_scale=4.0)))
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", initializer=np.full((4, 3), 300.0, np.float32))
        y = tf.matmul(x, w)  # 360000 per element: beyond float16 at any loss scale
        loss = tf.reduce_mean(tf.square(y))
        train = tf1.train.GradientDescentOptimizer(1e-10).minimize(loss)
        init = tf1.global_variables_initializer()
    feed = {x: np.full((8, 4), 300.0, np.float32)}
    with caplog.at_level(logging.WARNING, "amp_rewrite"), tf1.Session(graph=graph) as sess:
        sess.run(init)
        assert not np.isfinite(sess.run(y, feed)).any()  # evaluation in half, before the fallback
        for _ in range(4):
            sess.run(train, feed)
        evaluated, weights = sess.run(y, feed), sess.run(w)
    np.testing.assert_allclose(evaluated, feed[x] @ weights, rtol=1e-5)
    assert any("running the float32 graph" in r.getMessage() for r in caplog.records)
