"""TF1: a session step's first runs alternate its rewritten and its float32 variant, and the faster one stays.

The timer is the test's: each timed run takes what the test says its variant
takes, so each verdict is decided here, on any machine.
"""

import logging
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf
from helpers import HALF_TYPES, our_lines, rng, runner_of, tf1
from runners import clean_env

from amp_rewrite import runtime, tf_internals
from amp_rewrite.graph.facts import called_functions
from amp_rewrite.runtime.loss_scale.step_writes import ancestors
from amp_rewrite.runtime.loss_scale.tf1_optimizer import STATE_COLLECTION
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf1.session import RuntimeRewriteError
from amp_rewrite.runtime.tf1.session import session_trial as session_trials
from amp_rewrite.runtime.tf1.session.float32_copy import FLOAT32_SCOPE
from amp_rewrite.runtime.tf1.session.plans import PlanKey, RunPlan
from amp_rewrite.tune.cache import read_file
from amp_rewrite.tune.trial import CALLS, FLOAT32, HALF, schedule

SESSION_LOGGER = "amp_rewrite.runtime.tf1.session"
X = rng().normal(size=(8, 16)).astype(np.float32)
T = (X[:, :1] * 2.0 - X[:, 1:2]).astype(np.float32)
FEEDS = {"x:0": X, "t:0": T}
STEP = ["train_op", "loss:0"]
HALF_WINS = {HALF: 0.005, FLOAT32: 0.008}
HALF_LOSES = {HALF: 0.020, FLOAT32: 0.010}


def training_graph(optimizer: str = "sgd", inputs: str = "placeholders"):
    """x → MatMul → Relu → MatMul → squared error ``loss``; ``train_op`` by SGD or Adam; ``init``.

    ``inputs``: ``placeholders`` (x and t fed), ``iterator`` (x from a tf.data
    iterator, ``iterator_init``), or ``queue`` (x dequeued; ``enqueue`` puts in 32
    batches); from either, ``batch`` is the batch's number, counting from 0.
    """
    graph = tf.Graph()
    with graph.as_default():
        if inputs == "iterator":
            dataset = tf.data.Dataset.range(1000).map(lambda i: (tf.constant(X), i))
            iterator = tf1.data.make_initializable_iterator(dataset)
            graph.add_to_collection("iterator_init", iterator.initializer)
            x, batch = iterator.get_next()
            tf.identity(batch, name="batch")
        elif inputs == "queue":
            queue = tf1.FIFOQueue(64, [tf.float32, tf.int64], shapes=[[8, 16], []])
            queue.enqueue_many([tf.constant(np.stack([X] * 32)), tf.range(32, dtype=tf.int64)], name="enqueue")
            x, batch = queue.dequeue()
            tf.identity(batch, name="batch")
        else:
            x = tf1.placeholder(tf.float32, [None, 16], name="x")
        t = tf1.placeholder(tf.float32, [None, 1], name="t")
        w1 = tf1.get_variable("w1", [16, 32], initializer=tf1.initializers.random_normal(seed=1, stddev=0.3))
        w2 = tf1.get_variable("w2", [32, 1], initializer=tf1.initializers.random_normal(seed=2, stddev=0.3))
        y = tf.matmul(tf.nn.relu(tf.matmul(x, w1, name="mm1")), w2, name="mm2")
        loss = tf.reduce_mean(tf.square(y - t), name="loss")
        if optimizer == "adam":
            tf1.train.AdamOptimizer(0.01).minimize(loss, name="train_op")
        else:
            tf1.train.GradientDescentOptimizer(0.05).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
    return graph


def step_call(graph):
    """The training step's fetches and feeds as a script writes them (objects, which the fast path takes)."""
    fetches = [graph.get_operation_by_name("train_op"), graph.get_tensor_by_name("loss:0")]
    return fetches, {graph.get_tensor_by_name("x:0"): X, graph.get_tensor_by_name("t:0"): T}


def float32_losses(steps_run: int, weights=None, optimizer: str = "sgd") -> list[float]:
    """The losses of a plain float32 session (no runtime), from ``weights`` (w1, w2) or the initialisers'."""
    graph = training_graph(optimizer)
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        if weights is not None:
            for name, value in zip(("w1", "w2"), weights):
                variable = next(v for v in graph.get_collection("variables") if v.op.name == name)
                variable.load(value, sess)
        return [float(sess.run(STEP, FEEDS)[1]) for _ in range(steps_run)]


def start(amp_runtime, tmp_path, seconds=None, target="bfloat16", **fields):
    """The runtime in forced ``target`` with step trials and a cache in ``tmp_path``; the test's timer, or one
    that fails the test when it is called."""
    amp_runtime(RuntimeSettings(target=target, is_timing_steps=True, tune_cache_dir=str(tmp_path), **fields))
    trials = session_trials.trials_of(runtime.current_runtime())
    calls = []

    def timer(body, run):
        calls.append(body)
        if seconds is None:
            pytest.fail("a step was timed")
        return run(), seconds[body]

    trials.timer = timer
    return calls


def step_plan(sess, fetches=STEP, feeds=("x:0", "t:0")):
    """The plan the session keeps for the step ``fetches`` with ``feeds`` fed, at the latest graph version."""
    runner = runner_of(sess)
    keys = [key for key in runner.plans if [n.split(":")[0] for n in key.fetches] == [n.split(":")[0] for n in fetches]
            and key.feeds == feeds]
    return runner.plans[max(keys, key=lambda key: key.version)]


def matmul_types(plan) -> dict[str, object]:
    """The MatMuls the plan runs: name → T."""
    return {op.name: op.get_attr("T") for op in ancestors(plan.fetches) if op.type == "MatMul"}


def weights(sess, graph):
    return sess.run([v for v in graph.get_collection("variables") if v.op.name in ("w1", "w2")])


def lines(caplog, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SESSION_LOGGER and r.levelno == level]


def test_half_that_runs_faster_keeps_the_rewritten_step(amp_runtime, tmp_path, caplog):
    calls = start(amp_runtime, tmp_path, HALF_WINS)
    graph = training_graph("adam")
    with caplog.at_level(logging.INFO, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        losses = [float(sess.run(STEP, FEEDS)[1]) for _ in range(CALLS + 3)]
        plan = step_plan(sess)
        metadata = tf1.RunMetadata()
        sess.run(STEP, FEEDS, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=metadata)
    assert calls == schedule()  # the init step runs no half op: no trial
    assert {"mm1", "mm2"} <= set(matmul_types(plan)) and set(matmul_types(plan).values()) == {tf.bfloat16}
    ran = {node.node_name for device in metadata.step_stats.dev_stats for node in device.node_stats}
    assert "mm1" in ran and not any(name.startswith(FLOAT32_SCOPE) for name in ran)
    reason = "the step ran 5.0 ms in bfloat16 and 8.0 ms in float32 on this CPU (1.60x)"
    assert lines(caplog) [-1:] == [f"amp-rewrite: session step (fetches train_op, loss) runs in bfloat16: {reason}"]
    assert runtime.session_step_decisions() == [("(fetches train_op, loss)", True, reason)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_half_that_runs_slower_runs_the_float32_step_on_the_same_variables(amp_runtime, tmp_path, caplog):
    calls = start(amp_runtime, tmp_path, HALF_LOSES)
    graph = training_graph()
    with caplog.at_level(logging.INFO, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        trial_losses = [float(sess.run(*step_call(graph))[1]) for _ in range(CALLS)]
        after_trial = weights(sess, graph)
        losses = [float(sess.run(*step_call(graph))[1]) for _ in range(5)]
        plan = step_plan(sess)
        assert [call.plan for call in runner_of(sess).keeper.calls.values()] == [plan]  # the fast path runs it
        assert runner_of(sess).fallback_reason is None
    runtime.disable()
    assert len(calls) == CALLS
    assert len(matmul_types(plan)) == 6 and set(matmul_types(plan).values()) == {tf.float32}
    assert all(name.startswith(FLOAT32_SCOPE + "/") for name in matmul_types(plan))
    assert "stays float32: the step ran 20.0 ms in bfloat16 and 10.0 ms in float32 on this CPU" in lines(caplog)[-1]
    # every step of the trial trained the one set of variables, in either variant
    assert all(later < earlier for earlier, later in zip(trial_losses, trial_losses[1:]))
    np.testing.assert_allclose(losses, float32_losses(5, after_trial), rtol=1e-6, atol=1e-6)


def test_a_second_run_decides_from_the_cache_before_its_first_step(amp_runtime, tmp_path, caplog):
    want = float32_losses(6, optimizer="adam")
    start(amp_runtime, tmp_path, HALF_LOSES)
    graph = training_graph("adam")
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        for _ in range(CALLS):
            sess.run(STEP, FEEDS)
    runtime.disable()
    start(amp_runtime, tmp_path)  # as a new process: its timer fails the test
    graph = training_graph("adam")
    with caplog.at_level(logging.INFO, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        fetches, feeds = step_call(graph)
        got = [float(sess.run(fetches, feeds)[1]) for _ in range(6)]
        plan = step_plan(sess)
        assert [call.plan for call in runner_of(sess).keeper.calls.values()] == [plan]
        assert runner_of(sess).fallback_reason is None
    assert set(matmul_types(plan).values()) == {tf.float32}
    [cache_file] = tmp_path.glob("tune-*.json")
    assert lines(caplog)[-1].endswith(f"; measured before, read from the cache {cache_file}")
    assert "stays float32" in lines(caplog)[-1]
    [(name, is_half, reason)] = runtime.session_step_decisions()
    assert (name, is_half) == ("(fetches train_op, loss)", False)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("inputs", ["iterator", "queue"])
def test_a_step_reading_an_iterator_or_a_queue_is_tried_on_the_script_s_next_batches(amp_runtime, tmp_path, caplog,
                                                                                      inputs):
    calls = start(amp_runtime, tmp_path, HALF_LOSES)
    graph = training_graph(inputs=inputs)
    with caplog.at_level(logging.INFO, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        sess.run(graph.get_collection("iterator_init") if inputs == "iterator" else "enqueue")
        batches = [int(sess.run([*STEP, "batch:0"], {"t:0": T})[2]) for _ in range(CALLS + 3)]
        plan = step_plan(sess, fetches=[*STEP, "batch:0"], feeds=("t:0",))
        shadow = runner_of(sess).shadow_graph
    assert calls == schedule()
    assert batches == list(range(CALLS + 3))  # either variant took the next batch: no copy started over
    assert set(matmul_types(plan).values()) == {tf.float32}
    state = [op for op in shadow.get_operations() if op.name.startswith(FLOAT32_SCOPE)
             and op.type in ("IteratorV2", "FIFOQueueV2")]
    assert not state  # the copy reads the shadow's own iterator or queue
    assert "stays float32" in lines(caplog)[-1]


def test_steps_are_not_timed_unless_asked(amp_runtime):
    amp_runtime(RuntimeSettings(target="bfloat16"))
    graph = training_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        sess.run(STEP, FEEDS)
        assert runner_of(sess).keeper.step_trials is None
        assert set(matmul_types(step_plan(sess)).values()) == {tf.bfloat16}


def failing_float32_timer(body, run):
    if body == FLOAT32:
        raise tf.errors.InternalError(None, None, "the float32 variant broke")
    return run(), 0.01


def test_a_failed_trial_run_falls_back_to_float32(amp_runtime, tmp_path, caplog):
    start(amp_runtime, tmp_path)
    session_trials.trials_of(runtime.current_runtime()).timer = failing_float32_timer
    graph = training_graph()
    with caplog.at_level(logging.WARNING, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        losses = [float(sess.run(STEP, FEEDS)[1]) for _ in range(4)]
        assert runner_of(sess).fallback_reason is not None
    assert any("running the float32 graph" in line and "the float32 variant broke" in line
               for line in lines(caplog, logging.WARNING))
    assert np.all(np.isfinite(losses))


def test_a_failed_trial_run_raises_in_strict_mode(amp_runtime, tmp_path):
    start(amp_runtime, tmp_path, is_strict=True)
    session_trials.trials_of(runtime.current_runtime()).timer = failing_float32_timer
    graph = training_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        sess.run(STEP, FEEDS)
        with pytest.raises(RuntimeRewriteError, match="the float32 variant broke"):
            sess.run(STEP, FEEDS)


def half_ops_run_by(plan, shadow_graph) -> list[str]:
    """The ops a plan runs that compute in half, in the main graph and in every function they call."""
    functions = tf_internals.graph_functions(shadow_graph)
    found, pending, seen = [], [], set()
    for op in ancestors(plan.fetches):
        found += [op.name] if is_half(op.node_def) else []
        pending += called_functions(op.node_def, functions)
    while pending:
        name = pending.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        for node in functions[name].definition.node_def:
            found += [f"{name}::{node.name}"] if is_half(node) else []
            pending += called_functions(node, functions)
    return found


def is_half(node) -> bool:
    return any(value.type in HALF_TYPES or set(value.list.type) & set(HALF_TYPES) for value in node.attr.values())


def trained(graph, sess, steps: int, feeds: dict) -> list[float]:
    return [float(sess.run(STEP, feeds)[1]) for _ in range(steps)]


def trial_then_float32(graph_of, feeds: dict, amp_runtime, tmp_path, target="bfloat16"):
    """A step tried with half losing: its losses over the trial and 5 steps after, the variables' values after the
    trial, the plans of both variants, the half ops each runs (:func:`half_ops_run_by`), and the op types one more
    step of the float32 variant ran."""
    amp_runtime(RuntimeSettings(target=target, is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    calls = []
    session_trials.trials_of(runtime.current_runtime()).timer = (
        lambda body, run: (calls.append(body), (run(), HALF_LOSES[body]))[1])
    graph = graph_of()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        trial_losses = trained(graph, sess, 1, feeds)
        [trial] = runner_of(sess).keeper.trials.values()
        half = trial.plans[HALF]
        trial_losses += trained(graph, sess, CALLS - 1, feeds)
        after_trial = sess.run(graph.get_collection("trainable_variables"))
        losses = trained(graph, sess, 5, feeds)
        plan = step_plan(sess, feeds=tuple(feeds))
        shadow = runner_of(sess).shadow_graph
        half_ops = {HALF: half_ops_run_by(half, shadow), FLOAT32: half_ops_run_by(plan, shadow)}
        ran = executed_ops(sess, feeds)
        assert runner_of(sess).fallback_reason is None
    assert calls == schedule()
    return trial_losses, after_trial, losses, half, plan, half_ops, ran


def executed_ops(sess, feeds: dict) -> Counter:
    """The op types one more step ran, counted, from its step stats (what the session kept after pruning)."""
    metadata = tf1.RunMetadata()
    sess.run(STEP, feeds, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=metadata)
    # a node's label is ``name = Op(inputs)``, whether it ran in the graph or inlined from a function
    return Counter(node.timeline_label.split(" = ")[1].split("(")[0] for device in metadata.step_stats.dev_stats
                   for node in device.node_stats if " = " in node.timeline_label)


def float32_from(graph_of, weights, feeds: dict, steps: int, ops: Counter | None = None) -> list[float]:
    """The losses of a float32 session of ``graph_of()`` (no runtime) from the trainable variables' ``weights``;
    the op types one more step of it ran go into ``ops``."""
    runtime.disable()
    graph = graph_of()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        for variable, value in zip(graph.get_collection("trainable_variables"), weights):
            variable.load(value, sess)
        losses = trained(graph, sess, steps, feeds)
        if ops is not None:
            ops.update(executed_ops(sess, feeds))
        return losses


def control_flow_graph():
    """A ``tf.while_loop`` (three steps of tanh(h W), the first through a ``tf.cond`` in the loop's body) and a
    ``tf.cond`` in a TF1 graph: control flow v2, as under ``disable_eager_execution()``; squared error ``loss``,
    ``train_op`` by SGD; ``init``."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        t = tf1.placeholder(tf.float32, [None, 1], name="t")
        w = tf1.get_variable("w", [16, 16], initializer=tf1.initializers.random_normal(seed=1, stddev=0.3))
        v = tf1.get_variable("v", [16, 1], initializer=tf1.initializers.random_normal(seed=2, stddev=0.3))

        def body(i, h):  # a function calling functions: the loop's body calls the cond's branches
            return i + 1, tf.cond(i > 0, lambda: tf.tanh(tf.matmul(h, w)), lambda: tf.nn.relu(tf.matmul(h, w)))

        _, h = tf.while_loop(lambda i, h: i < 3, body, [0, x])
        y = tf.cond(tf.reduce_sum(h) > 0.0, lambda: tf.matmul(h, v), lambda: tf.matmul(h, v) * 0.5)
        loss = tf.reduce_mean(tf.square(y - t), name="loss")
        tf1.train.GradientDescentOptimizer(0.05).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
    assert {"While", "If"} <= {op.type for op in graph.get_operations()}
    return graph


class TanhCell:
    """``h' = tanh([x, h] W)``: what ``dynamic_rnn`` and ``static_rnn`` need of a cell (Keras 3 has no TF1 cells)."""

    output_size = state_size = 16

    def __init__(self, name: str):
        self.name = name

    def zero_state(self, batch_size, dtype):
        return tf.zeros([batch_size, 16], dtype)

    def __call__(self, inputs, state, scope=None):
        with tf1.variable_scope(self.name, reuse=tf1.AUTO_REUSE):
            w = tf1.get_variable("w", [16 + 16, 16], initializer=tf1.initializers.random_normal(seed=3, stddev=0.3))
        h = tf.tanh(tf.matmul(tf.concat([inputs, state], 1), w))
        return h, h


SEQUENCES = np.stack([X[:4]] * 5, axis=1)  # 4 sequences of 5 steps of 16


def rnn_graph():
    """A ``dynamic_rnn`` (a while loop) and a ``static_rnn`` (a cond per step), each with ``sequence_length``."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 5, 16], name="x")
        lengths = tf.constant([5, 3, 4, 1], name="lengths")
        _, last = tf1.nn.dynamic_rnn(TanhCell("dynamic"), x, sequence_length=lengths, dtype=tf.float32)
        _, unrolled = tf1.nn.static_rnn(TanhCell("static"), tf.unstack(x, axis=1), sequence_length=lengths,
                                        dtype=tf.float32)
        loss = tf.reduce_mean(tf.square(last - 0.5) + tf.square(unrolled + 0.5), name="loss")
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
    assert {"StatelessWhile", "StatelessIf"} <= {op.type for op in graph.get_operations()}
    return graph


def function_graph():
    """A ``tf.function`` called in a TF1 graph: the session rewrites it with the graph (the tracing hook leaves it)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        t = tf1.placeholder(tf.float32, [None, 1], name="t")
        w = tf1.get_variable("w", [16, 1], initializer=tf1.initializers.random_normal(seed=1, stddev=0.3))

        @tf.function
        def forward(inputs):
            return tf.matmul(tf.nn.relu(inputs), w)

        loss = tf.reduce_mean(tf.square(forward(x) - t), name="loss")
        tf1.train.GradientDescentOptimizer(0.05).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
    active = runtime.current_runtime()
    assert active is None or not active.tracing.swapped
    return graph


def defun_graph():
    """A ``Defun`` called by its op name: its results are float32, all its half ops inside it."""
    from tensorflow.python.framework import function  # TF1's Defun has no public name under TF2

    graph = tf.Graph()
    with graph.as_default():

        @function.Defun(tf.float32, tf.float32)
        def layer(inputs, weights):
            return tf.nn.relu(tf.matmul(inputs, weights))

        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        t = tf1.placeholder(tf.float32, [None, 1], name="t")
        w = tf1.get_variable("w", [16, 1], initializer=tf1.initializers.random_normal(seed=1, stddev=0.3))
        y = layer(x, w.read_value())
        y.set_shape([None, 1])
        loss = tf.reduce_mean(tf.square(y - t), name="loss")
        tf1.train.GradientDescentOptimizer(0.05).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
    return graph


@pytest.mark.parametrize("graph_of, feeds", [(control_flow_graph, FEEDS), (rnn_graph, {"x:0": SEQUENCES}),
                                             (function_graph, FEEDS), (defun_graph, FEEDS)],
                         ids=["cond-and-while-loop", "rnns-with-sequence-length", "tf-function", "defun"])
def test_a_step_calling_control_flow_functions_is_tried_against_their_float32_bodies(amp_runtime, tmp_path,
                                                                                    graph_of, feeds):
    trial_losses, after_trial, losses, half, plan, half_ops, ran = trial_then_float32(graph_of, feeds, amp_runtime,
                                                                                      tmp_path)
    assert [name for name in half_ops[HALF] if "::" in name]  # the rewrite changed the functions
    assert half_ops[FLOAT32] == []  # the float32 verdict runs float32 ops only
    called = {name for op in ancestors(plan.fetches) for name in called_functions(op.node_def, {op.type: 1})}
    assert called, "the float32 step calls the script's functions"  # its own copies, or those the rewrite left
    assert np.all(np.isfinite(trial_losses)) and trial_losses[-1] < trial_losses[0]
    # every step of the trial trained the one set of variables; the float32 steps go on from there
    plain = Counter()
    np.testing.assert_allclose(losses, float32_from(graph_of, after_trial, feeds, 5, plain), rtol=1e-5, atol=1e-6)
    assert ran == plain  # the script's float32 step, op for op


def test_a_loss_scaled_float16_step_is_tried_against_its_float32_step_without_the_scaling(amp_runtime, tmp_path):
    trial_losses, after_trial, losses, half, plan, half_ops, ran = trial_then_float32(
        training_graph, FEEDS, amp_runtime, tmp_path, target="float16")
    assert half.reports and half_ops[HALF] and not half_ops[FLOAT32]
    assert not plan.reports and set(matmul_types(plan).values()) == {tf.float32}
    assert {"MulNoNan", "IsFinite", "AssignVariableOp"} <= {op.type for op in ancestors(half.fetches)}
    assert "ResourceApplyGradientDescent" in ran and not set(ran) & {"MulNoNan", "IsFinite", "AssignVariableOp"}, ran
    plain = Counter()
    np.testing.assert_allclose(losses, float32_from(training_graph, after_trial, FEEDS, 5, plain), rtol=1e-6,
                               atol=1e-6)
    del ran["NoOp"], plain["NoOp"]  # the loss-scale update's group, now of nothing
    assert ran == plain  # the script's float32 step, op for op
    assert np.all(np.isfinite(trial_losses)) and trial_losses[-1] < trial_losses[0]


def test_float32_steps_leave_the_loss_scale_state_as_the_half_steps_left_it(amp_runtime, tmp_path):
    start(amp_runtime, tmp_path, HALF_LOSES, target="float16")
    graph = training_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        states = []
        for _ in range(CALLS + 4):
            sess.run(*step_call(graph))
            states.append(sess.run(graph.get_collection(STATE_COLLECTION)))  # scale, good steps, skipped steps
    good_steps = [int(good) for _, good, _ in states]
    half_so_far = [schedule()[:index + 1].count(HALF) for index in range(CALLS)]
    assert good_steps == half_so_far + [half_so_far[-1]] * 4  # only a half step moves it
    assert {float(scale) for scale, _, _ in states} == {32768.0} and {int(s) for _, _, s in states} == {0}


def test_a_run_the_loss_scale_skipped_is_not_timed_for_the_trial(amp_runtime, tmp_path, caplog):
    """A skipped run applies no update and costs less than a step: timed, it would make half look faster.

    The first scale (2^24) overflows float16, so the first half runs skip
    while it halves. The test's timer gives a run 1 ms when its report's
    skipped-step count went up, else the variant's time (half 20 ms, float32
    10 ms): counted, the skipped runs would make half win.
    """
    from amp_rewrite.runtime.settings import LossScaleSettings

    start(amp_runtime, tmp_path, target="float16", loss_scale=LossScaleSettings(initial_scale=2.0**24))
    trials = session_trials.trials_of(runtime.current_runtime())
    runs, skips_so_far = [], [0.0]

    def timer(body, run):
        values = run()
        skipped = len(values) > 2 and float(values[2][1]) > skips_so_far[0]  # (scale, skipped, good, finite)
        if skipped:
            skips_so_far[0] = float(values[2][1])
        runs.append((body, skipped))
        return values, 0.001 if skipped else HALF_LOSES[body]

    trials.timer = timer
    graph = training_graph()
    with tf1.Session(graph=graph) as sess, caplog.at_level(logging.INFO, SESSION_LOGGER):
        sess.run("init")
        for _ in range(6 * CALLS):
            sess.run(*step_call(graph))
    skipped = [body for body, is_skip in runs if is_skip]
    assert len(skipped) >= 2 and set(skipped) == {HALF}, runs
    assert [line for line in lines(caplog) if "session step" in line] == [
        "amp-rewrite: session step (fetches train_op, loss) stays float32: the step ran 20.0 ms in float16 and "
        "10.0 ms in float32 on this CPU"]
    counted = [body for body, is_skip in runs if not is_skip]  # each skip added a pair (half, float32)
    assert (counted.count(HALF), counted.count(FLOAT32)) == (CALLS // 2, CALLS // 2 + len(skipped)), runs
    assert [body for body, _ in runs[:4]] == schedule()[:4], runs  # alternating: float32 runs trained meanwhile


def test_a_step_fetching_the_overflow_probe_runs_half_untried_and_says_so(amp_runtime, tmp_path, caplog):
    calls = start(amp_runtime, tmp_path, HALF_LOSES, target="float16", is_finding_overflow=True)
    graph = training_graph()
    with caplog.at_level(logging.INFO, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        for _ in range(3):
            sess.run(*step_call(graph))
        plan = step_plan(sess)
    assert not calls and plan.has_probe and set(matmul_types(plan).values()) == {tf.float16}
    assert lines(caplog) [-1:] == ["amp-rewrite: session step (fetches train_op, loss) runs in float16, not tried: "
                                   "it fetches the overflow probe (AMP_REWRITE_FIND_OVERFLOW), which watches its "
                                   "half ops"]


SCRIPT = """
import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
x = tf.compat.v1.placeholder(tf.float32, [None, 64], name="x")
w = tf.compat.v1.get_variable("w", [64, 64])
_, h = tf.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))), [0, x])
y = tf.cond(tf.reduce_sum(h) > 0.0, lambda: h * 2.0, lambda: h)
loss = tf.reduce_mean(tf.square(y))
train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(12):
        sess.run([train, loss], {x: np.ones((32, 64), np.float32)})
"""


def test_a_script_upgraded_to_tf2_with_eager_execution_off_has_its_control_flow_steps_tried(tmp_path):
    """The real clock: whichever variant wins, the step is tried and one line says which."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = clean_env(ENABLE_AUTO_MP="1", AMP_REWRITE_TARGET="bfloat16", AMP_REWRITE_TUNE="1",
                    AMP_REWRITE_TUNE_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [line for line in our_lines(done.stderr) if "session step" in line]
    assert len(steps) == 1, our_lines(done.stderr)
    assert "(fetches GradientDescent, Mean) runs in bfloat16: the step ran" in steps[0] or \
        "(fetches GradientDescent, Mean) stays float32: the step ran" in steps[0], steps


def test_ops_added_between_steps_neither_restart_the_trial_nor_copy_the_step_again(amp_runtime, tmp_path, caplog):
    calls = start(amp_runtime, tmp_path, HALF_LOSES)
    graph = training_graph()
    with caplog.at_level(logging.INFO, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        for index in range(CALLS + 3):
            with graph.as_default():
                tf.identity(graph.get_tensor_by_name("loss:0"), name=f"added_{index}")  # a new graph version
            sess.run(*step_call(graph))
        shadow = runner_of(sess).shadow_graph
        plan = step_plan(sess)
    assert len(calls) == CALLS
    assert sum("stays float32" in line for line in lines(caplog)) == 1
    scopes = {op.name.split("/")[0] for op in shadow.get_operations()
              if op.name.startswith(FLOAT32_SCOPE)}
    assert scopes == {FLOAT32_SCOPE}
    assert set(matmul_types(plan).values()) == {tf.float32}


def test_a_fed_tensor_the_step_does_not_read_is_fed_to_either_variant(amp_runtime, tmp_path):
    calls = start(amp_runtime, tmp_path, HALF_LOSES)
    graph = training_graph()
    with graph.as_default():
        phase = tf1.placeholder_with_default(False, [], name="phase")  # as Keras feeds its learning phase
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        fetches, feeds = step_call(graph)
        for _ in range(CALLS + 2):
            sess.run(fetches, {**feeds, phase: True})
        plan = step_plan(sess, feeds=("x:0", "t:0", "phase:0"))
        assert runner_of(sess).fallback_reason is None
    assert calls == schedule()
    assert set(matmul_types(plan).values()) == {tf.float32}


def test_a_step_fetching_a_variable_is_tried(amp_runtime, tmp_path):
    calls = start(amp_runtime, tmp_path, HALF_LOSES)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        w = tf1.Variable(np.full((16, 4), 0.1, np.float32), name="w", use_resource=False)  # a ref variable
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w, name="mm")), name="loss")
        train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        values = [sess.run([train, loss, w], {x: X}) for _ in range(CALLS + 2)]
        plan = step_plan(sess, fetches=["train_op", "loss:0", "w:0"], feeds=("x:0",))
        assert runner_of(sess).fallback_reason is None
    assert calls == schedule()
    assert set(matmul_types(plan).values()) == {tf.float32}
    assert values[-1][2].shape == (16, 4) and not np.array_equal(values[-1][2], values[0][2])


def test_a_step_running_collective_ops_runs_half_untried_and_says_so(amp_runtime, tmp_path, caplog):
    start(amp_runtime, tmp_path)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8], name="x")
        half = tf.cast(tf.cast(x, tf.bfloat16) * 2, tf.float32)  # as a rewritten step computes
        tf.raw_ops.CollectiveReduceV2(input=half, group_size=2, group_key=1, instance_key=1, ordering_token=[],
                                      merge_op="Add", final_op="Id", name="sum")
    key = PlanKey(graph.version, ("sum:0",), ("x:0",))
    why = session_trials.why_no_trial(graph, graph, key, RunPlan([], [], {}))
    assert why == "it runs CollectiveReduceV2 'sum': every worker or replica must run the same variant"


def test_a_half_step_running_collective_ops_says_once_that_it_is_not_timed(tmp_path, caplog):
    """A graph-mode job has no store for its workers to decide through: each runs the op lists' rewrite."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 8], name="x")
        product = tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), tf.cast(x, tf.bfloat16)), tf.float32)
        total = tf.raw_ops.CollectiveReduceV2(input=product, group_size=2, group_key=1, instance_key=1,
                                              ordering_token=[], merge_op="Add", final_op="Id", name="sum")
    trials = session_trials.SessionTrials(target="bfloat16", device_type="CPU", cache_dir=str(tmp_path),
                                          timer=lambda body, run: pytest.fail("a step was timed"))
    key = PlanKey(graph.version, ("sum:0",), ("x:0",))
    half = RunPlan([total], [None], {})
    with caplog.at_level(logging.INFO, SESSION_LOGGER):
        for _ in range(2):
            assert trials.plan(graph, graph, key, half) == (half, None)
    assert lines(caplog) == [
        "amp-rewrite: session step (fetches sum) is not timed and runs in bfloat16 as the op lists say: it runs "
        "CollectiveReduceV2 'sum', and the workers of a graph-mode job have no coordination service to decide "
        "through together"]
    assert not list(tmp_path.iterdir())


def test_runs_from_several_threads_follow_the_schedule_one_at_a_time(amp_runtime, tmp_path, caplog):
    """Six threads run the step from its first run on: its trial's runs keep their order and are timed alone."""
    import threading
    import time

    amp_runtime(RuntimeSettings(target="bfloat16", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    spans = []

    def timer(body, run):
        began = time.perf_counter()
        time.sleep(0.02)  # another thread gets the interpreter here
        values = run()
        spans.append((body, began, time.perf_counter()))
        return values, HALF_WINS[body]

    session_trials.trials_of(runtime.current_runtime()).timer = timer
    graph = training_graph()
    barrier = threading.Barrier(6)
    losses = []
    with caplog.at_level(logging.INFO, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")

        def train():
            barrier.wait()
            for _ in range(4):
                losses.append(float(sess.run(STEP, FEEDS)[1]))

        threads = [threading.Thread(target=train) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        plan = step_plan(sess)
    assert [body for body, _, _ in spans] == schedule()
    times = sorted((began, ended) for _, began, ended in spans)
    assert all(ended <= next_began for (_, ended), (next_began, _) in zip(times, times[1:]))
    assert len(losses) == 24 and np.all(np.isfinite(losses))
    assert set(matmul_types(plan).values()) == {tf.bfloat16}
    assert len([line for line in lines(caplog) if "runs in bfloat16" in line]) == 1
# --- what a cached verdict applies to, and how sure it must be ----------------------


def run_steps(graph, steps: int, *, call_objects: bool = False) -> list[float]:
    """Runs ``init`` then ``steps`` training steps (by name, or as a script's objects); the losses."""
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        fetches, feeds = step_call(graph) if call_objects else (STEP, FEEDS)
        return [float(sess.run(fetches, feeds)[1]) for _ in range(steps)]


def cached_steps(tmp_path) -> dict:
    """The verdicts in the tuning cache in ``tmp_path``, by key."""
    [path] = tmp_path.glob("tune-*.json")
    return {key: timing for key, timing in read_file(path).entries.items() if key.startswith("step ")}


def test_an_edited_op_list_is_tried_again(amp_runtime, tmp_path, caplog, monkeypatch):
    start(amp_runtime, tmp_path, HALF_LOSES)
    run_steps(training_graph("adam"), CALLS)
    runtime.disable()
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD", "Cumprod")
    calls = start(amp_runtime, tmp_path, HALF_WINS)
    with caplog.at_level(logging.INFO, SESSION_LOGGER):
        run_steps(training_graph("adam"), CALLS)
    assert calls == schedule()
    assert "measured before" not in lines(caplog)[-1] and "runs in bfloat16" in lines(caplog)[-1]


def resource_graph(width: int):
    """x → MatMul → MatMul → loss, trained by SGD, its variables resource variables (VarHandleOp) of ``width``."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        t = tf1.placeholder(tf.float32, [None, 1], name="t")
        init = tf1.initializers.random_normal(seed=1, stddev=0.3)
        w1 = tf1.get_variable("w1", [16, width], initializer=init, use_resource=True)
        w2 = tf1.get_variable("w2", [width, 1], initializer=init, use_resource=True)
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.matmul(x, w1), w2) - t), name="loss")
        tf1.train.GradientDescentOptimizer(0.05).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
    return graph


def test_a_step_whose_resource_variables_have_another_shape_is_tried_again(amp_runtime, tmp_path, caplog):
    start(amp_runtime, tmp_path, HALF_LOSES)
    run_steps(resource_graph(16), CALLS)
    runtime.disable()
    calls = start(amp_runtime, tmp_path, HALF_WINS)
    with caplog.at_level(logging.INFO, SESSION_LOGGER):
        run_steps(resource_graph(512), CALLS)
    assert calls == schedule()
    assert "measured before" not in lines(caplog)[-1] and "runs in bfloat16" in lines(caplog)[-1]


def start_timed(amp_runtime, tmp_path, seconds: dict[str, list[float]], **fields) -> list[str]:
    """The runtime with step trials, its timer giving each variant's runs the test's seconds in turn."""
    calls = start(amp_runtime, tmp_path, None, **fields)
    left = {body: list(values) for body, values in seconds.items()}

    def timer(body, run):
        calls.append(body)
        values = left[body]
        return run(), values.pop(0) if len(values) > 1 else values[0]

    session_trials.trials_of(runtime.current_runtime()).timer = timer
    return calls


def test_a_verdict_whose_halves_disagree_is_used_but_not_cached(amp_runtime, tmp_path, caplog):
    # first half: half 5 ms, float32 8 ms; second half: half 13 ms (a neighbour's job), float32 8 ms
    start_timed(amp_runtime, tmp_path, {HALF: [9.0, 0.005, 0.005, 0.013, 0.013], FLOAT32: [9.0, 0.008]})
    with caplog.at_level(logging.INFO, SESSION_LOGGER):
        run_steps(training_graph("adam"), CALLS)
    assert lines(caplog)[-1] == (
        "amp-rewrite: session step (fetches train_op, loss) runs in bfloat16: the step ran 5.0 ms in bfloat16 and "
        "8.0 ms in float32 on this CPU (1.60x); not clear enough to keep (1.60x in the trial's first half, 0.62x in "
        "its second): a later run measures again")
    assert not list(tmp_path.glob("tune-*.json"))
    runtime.disable()
    calls = start(amp_runtime, tmp_path, HALF_WINS)
    run_steps(training_graph("adam"), CALLS)
    assert calls == schedule()  # measured again
    assert [(t.half, t.float32) for t in cached_steps(tmp_path).values()] == [(0.005, 0.008)]


# --- a cached verdict checked again ------------------------------------------------

EVERY = 5


def test_a_cached_verdict_that_a_recheck_clearly_contradicts_switches_the_step(amp_runtime, tmp_path, caplog,
                                                                             monkeypatch):
    from amp_rewrite.runtime.tf1.session import keeper

    monkeypatch.setattr(keeper, "RECHECK_EVERY", EVERY)
    monkeypatch.setattr(session_trials, "RECHECK_EVERY", EVERY)
    start(amp_runtime, tmp_path, HALF_LOSES)
    run_steps(training_graph(), CALLS)
    runtime.disable()
    calls = start(amp_runtime, tmp_path, HALF_WINS)
    graph = training_graph()
    with caplog.at_level(logging.INFO, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        fetches, feeds = step_call(graph)  # the fast path, after two runs: it counts its runs too
        losses = [float(sess.run(fetches, feeds)[1]) for _ in range(EVERY + 5 + 2)]
        plan = step_plan(sess)
    assert calls == [HALF, HALF, FLOAT32, FLOAT32, HALF]  # the float32 step's cold half, then two mirrored pairs
    [cache_file] = tmp_path.glob("tune-*.json")
    assert lines(caplog)[-1] == (
        f"amp-rewrite: session step (fetches train_op, loss) now runs in bfloat16: checked again after {EVERY} calls, "
        "the step ran 5.0 ms in bfloat16 and 8.0 ms in float32 on this CPU (1.60x); the cache "
        f"{cache_file} had it stay float32 (20.0 ms in bfloat16, 10.0 ms in float32) and holds the new times")
    assert set(matmul_types(plan).values()) == {tf.bfloat16}
    assert [(t.half, t.float32) for t in cached_steps(tmp_path).values()] == [(0.005, 0.008)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


@pytest.fixture
def op_determinism():
    """``tf.config.experimental.enable_op_determinism()`` for one test."""
    from tensorflow.python.framework import config

    tf.config.experimental.enable_op_determinism()
    yield
    config.disable_op_determinism()


def test_under_op_determinism_the_lists_or_the_cache_decide_and_nothing_is_timed(
        amp_runtime, tmp_path, caplog, monkeypatch, op_determinism):
    from amp_rewrite.runtime.tf1.session import keeper

    monkeypatch.setattr(keeper, "RECHECK_EVERY", EVERY)
    start(amp_runtime, tmp_path)  # its timer fails the test
    with caplog.at_level(logging.INFO, SESSION_LOGGER):
        run_steps(training_graph(), CALLS)
    assert lines(caplog)[-1] == (
        "amp-rewrite: session step (fetches train_op, loss) runs in bfloat16 as the op lists say: op determinism is "
        "on, so no timing decides, and the tuning cache holds no verdict of this step")
    assert not list(tmp_path.iterdir())
    runtime.disable()
    from tensorflow.python.framework import config

    config.disable_op_determinism()
    start(amp_runtime, tmp_path, HALF_LOSES)
    run_steps(training_graph(), CALLS)
    runtime.disable()
    tf.config.experimental.enable_op_determinism()
    start(amp_runtime, tmp_path)  # its timer fails the test
    caplog.clear()
    graph = training_graph()
    with caplog.at_level(logging.INFO, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        for _ in range(3 * EVERY):
            sess.run(STEP, FEEDS)
        plan = step_plan(sess)
    assert set(matmul_types(plan).values()) == {tf.float32}
    assert lines(caplog)[-1].endswith("measured before, read from the cache "
                                      f"{next(tmp_path.glob('tune-*.json'))}; op determinism is on, so it is not "
                                      "checked again")
