"""TF1: a session step's first runs alternate its rewritten and its float32 variant, and the faster one stays.

The timer is the test's: each timed run takes what the test says its variant
takes, so each verdict is decided here, on any machine.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
from helpers import rng, runner_of, tf1

from amp_rewrite import runtime
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf1.session import RuntimeRewriteError
from amp_rewrite.runtime.tf1.session import session_trial as session_trials
from amp_rewrite.runtime.tf1.session.plans import PlanKey, RunPlan, ancestors
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
    iterator, ``iterator_init``), or ``queue`` (x dequeued; ``enqueue`` fills it).
    """
    graph = tf.Graph()
    with graph.as_default():
        if inputs == "iterator":
            dataset = tf.data.Dataset.from_tensor_slices(X).repeat().batch(8)
            iterator = tf1.data.make_initializable_iterator(dataset)
            graph.add_to_collection("iterator_init", iterator.initializer)
            x = tf.ensure_shape(iterator.get_next(), [8, 16])
        elif inputs == "queue":
            queue = tf1.FIFOQueue(64, [tf.float32], shapes=[[8, 16]])
            queue.enqueue([tf.constant(X)], name="enqueue")
            x = queue.dequeue()
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


def start(amp_runtime, tmp_path, seconds=None, **fields):
    """The runtime in forced bfloat16 with step trials and a cache in ``tmp_path``; the test's timer, or one
    that fails the test when it is called."""
    amp_runtime(RuntimeSettings(target="bfloat16", is_timing_steps=True, tune_cache_dir=str(tmp_path), **fields))
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
    assert "mm1" in ran and not any(name.startswith(session_trials.FLOAT32_SCOPE) for name in ran)
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
    assert all(name.startswith(session_trials.FLOAT32_SCOPE + "/") for name in matmul_types(plan))
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
def test_a_step_reading_an_iterator_or_a_queue_gets_no_trial(amp_runtime, tmp_path, caplog, inputs):
    calls = start(amp_runtime, tmp_path, HALF_LOSES)
    graph = training_graph(inputs=inputs)
    with caplog.at_level(logging.DEBUG, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        if inputs == "iterator":
            sess.run(graph.get_collection("iterator_init"))
        else:
            for _ in range(CALLS + 2):
                sess.run("enqueue")
        for _ in range(CALLS + 2):
            sess.run(STEP, {"t:0": T})
        plan = step_plan(sess, feeds=("t:0",))
    assert not calls
    assert set(matmul_types(plan).values()) == {tf.bfloat16}
    assert any("no step trial for session step (fetches train_op, loss): it reads" in line
               for line in lines(caplog, logging.DEBUG))
    assert runtime.session_step_decisions() == []


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


def test_a_loss_scaled_float16_step_gets_no_trial(amp_runtime, tmp_path, caplog):
    amp_runtime(RuntimeSettings(target="float16", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    graph = training_graph()
    with caplog.at_level(logging.DEBUG, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        for _ in range(3):
            sess.run(STEP, FEEDS)
        plan = step_plan(sess)
        assert not runner_of(sess).keeper.trials
    assert plan.reports and set(matmul_types(plan).values()) == {tf.float16}
    assert any("no step trial for session step (fetches train_op, loss): it applies loss scaling" in line
               for line in lines(caplog, logging.DEBUG))


def test_a_step_calling_a_function_the_rewrite_changed_gets_no_trial(amp_runtime, tmp_path, caplog):
    calls = start(amp_runtime, tmp_path, HALF_LOSES)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        w = tf1.get_variable("w", [16, 4], initializer=tf1.initializers.random_normal(seed=1, stddev=0.1))
        y = tf.matmul(x, w, name="mm")  # half: the branches read it as it is
        flag = tf1.placeholder_with_default(False, [], name="flag")
        loss = tf.reduce_mean(tf.cond(flag, lambda: y * 2.0, lambda: y * 1.0), name="loss")
        train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss, name="train_op")
        tf1.global_variables_initializer()
    with caplog.at_level(logging.DEBUG, SESSION_LOGGER), tf1.Session(graph=graph) as sess:
        sess.run("init")
        for _ in range(CALLS + 1):
            sess.run([train, loss], {x: X})
        assert not runner_of(sess).keeper.trials
    assert not calls
    assert any("no step trial for session step (fetches train_op, loss): it calls functions the rewrite changed"
               in line for line in lines(caplog, logging.DEBUG))


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
              if op.name.startswith(session_trials.FLOAT32_SCOPE)}
    assert scopes == {session_trials.FLOAT32_SCOPE}
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


def test_a_step_running_collective_ops_gets_no_trial():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8], name="x")
        tf.raw_ops.CollectiveReduceV2(input=x, group_size=2, group_key=1, instance_key=1, ordering_token=[],
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
