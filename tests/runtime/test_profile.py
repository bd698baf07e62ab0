"""AMP_REWRITE_PROFILE=N: one step profiled after N, one table, then never again; nothing when unset."""

import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import mlp_session_graph, runner_of, tf1
from tensorflow.core.framework import step_stats_pb2

from amp_rewrite.errors import UsageError
from amp_rewrite.runtime.profile import OpTime, render_table, step_stats_ops
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf2 import tracing

FEED = {"x:0": np.ones((4, 8), np.float32)}
# The table names the kernel a step ran: oneDNN's on CPUs where TensorFlow uses it (an AVX512 Xeon's
# float16 MatMul runs as _MklMatMul, fused with its neighbours as _MklNativeFusedMatMul, cut to the column).
MATMUL_KERNEL = re.compile(r"(_Mkl(Native)?(Fused)?)?Mat(Mul)?")


def is_half_matmul(row) -> bool:
    """Whether a table row (split into words) is a float16 MatMul, under whichever kernel's name."""
    return row[2] == "float16" and MATMUL_KERNEL.fullmatch(row[3]) is not None


def tables(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("amp-rewrite: profile of ")]


def test_the_variable_is_a_step_count_read_once():
    assert RuntimeSettings.from_env({}).profile_after is None
    assert RuntimeSettings.from_env({"AMP_REWRITE_PROFILE": " 5 "}).profile_after == 5
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(UsageError, match="AMP_REWRITE_PROFILE"):
            RuntimeSettings.from_env({"AMP_REWRITE_PROFILE": bad})


def run_session(steps: int):
    graph = mlp_session_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run(graph.get_operation_by_name("init"))
        values = [sess.run("y:0", FEED) for _ in range(steps)]
        return values, runner_of(sess)


def test_session_step_after_n_is_profiled_once_and_the_watcher_leaves(amp_runtime, capfd):
    amp_runtime(RuntimeSettings(target="float16", profile_after=3))
    values, runner = run_session(6)
    err = capfd.readouterr().err
    assert tables(err) == [next(line for line in err.splitlines() if line.startswith("amp-rewrite: profile of "))]
    assert tables(err)[0].startswith("amp-rewrite: profile of session step 4: ")  # init, then three steps of y
    rows = {line.split()[-1]: line.split() for line in err.splitlines() if line.startswith("  ") and "%" in line}
    assert is_half_matmul(rows["mm1"]), rows["mm1"]
    # The table lists the step's 8 costliest ops, an order timing noise decides; the header counts
    # every Cast the step ran: x and w1's read to float16, relu1 back to float32 for y.
    assert "; Casts: 3 ops, " in tables(err)[0]
    assert all(row[3] == "Cast" for name, row in rows.items() if name.endswith("-AmpRewrite"))
    assert "costliest float32 ops: " in err
    assert "run" not in vars(runner)  # later steps run the runner's own method
    assert all(np.array_equal(v, values[0]) for v in values)


def test_unset_installs_nothing_and_prints_nothing(amp_runtime, capfd):
    amp_runtime(RuntimeSettings(target="float16"))
    _, runner = run_session(4)
    assert "run" not in vars(runner)
    assert tables(capfd.readouterr().err) == []
    hooks = tracing.installed_hooks()
    assert any(hook.runtime is not None for hook in hooks)
    assert all(hook.profiles is None for hook in hooks)


def traced_step():
    w = tf.Variable(tf.ones([16, 16]) * 0.01)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)))
        w.assign_sub(0.01 * tape.gradient(y, w))
        return y

    return step


def test_traced_function_call_after_n_is_profiled_once(amp_runtime, capfd):
    amp_runtime(RuntimeSettings(target="float16", profile_after=2))
    step = traced_step()
    x = tf.ones([8, 16])
    losses = [float(step(x))]
    cf = step.get_concrete_function(x)
    assert type(vars(cf)["_call_flat"]).__name__ == "_FunctionWatch"  # counting, past the first-call check
    losses += [float(step(x)) for _ in range(4)]
    err = capfd.readouterr().err
    assert len(tables(err)) == 1 and ", call 3: " in tables(err)[0]
    rows = [line.split() for line in err.splitlines() if line.startswith("  ") and "%" in line]
    assert any(is_half_matmul(row) for row in rows), rows
    assert "_call_flat" not in vars(cf)  # the watcher removed itself
    assert all(np.isfinite(losses))


def keras_fit(epochs: int):
    """A Keras 3 ``fit`` of a small MLP, 4 steps an epoch: the one-step function runs inside the train function."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="mse")
    data = np.random.default_rng(0)
    x, y = data.normal(size=(64, 16)).astype(np.float32), data.normal(size=(64, 4)).astype(np.float32)
    return model.fit(x, y, batch_size=16, epochs=epochs, verbose=0).history["loss"]


def test_keras_fit_is_profiled_through_its_train_function(amp_runtime, capfd):
    """fit never calls the rewritten one-step function eagerly: the train function calling it is profiled."""
    amp_runtime(RuntimeSettings(target="float16", profile_after=2))
    losses = keras_fit(1)
    err = capfd.readouterr().err
    assert len(tables(err)) == 1, err[-3000:]
    assert "step_on_" in tables(err)[0] and ", call 3: " in tables(err)[0]  # one_ or multi_step_on_iterator
    rows = [line.split() for line in err.splitlines() if line.startswith("  ") and "%" in line]
    assert any(is_half_matmul(row) for row in rows), rows
    assert all(np.isfinite(losses))


def test_a_profile_not_reached_says_so_once(amp_runtime, caplog):
    amp_runtime(RuntimeSettings(target="float16", profile_after=50))
    keras_fit(1)
    from amp_rewrite import runtime

    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        runtime.disable()
        runtime.disable()
    lines = [r.getMessage() for r in caplog.records if "no step was profiled" in r.getMessage()]
    assert lines == ["amp-rewrite: AMP_REWRITE_PROFILE=50: no step was profiled: the rewritten tf.functions ran "
                     "4 eager calls at most, not more than 50"]


def test_table_ranks_ops_and_gives_the_casts_share():
    ops = [OpTime("mm", "MatMul", 600.0, "float16"), OpTime("c1", "Cast", 150.0, "float16"),
           OpTime("exp", "Exp", 200.0, "float32"), OpTime("c2", "Cast", 50.0, "float32")]
    lines = render_table("session step 3", ops)
    assert lines[0] == "amp-rewrite: profile of session step 3: 4 ops, 1.00 ms of op time; Casts: 2 ops, 20.0% of it"
    assert [line.split()[-1] for line in lines[2:6]] == ["mm", "exp", "c1", "c2"]
    assert lines[-1] == "  costliest float32 ops: exp (Exp, 0.200 ms, 20.0%)"


def test_step_stats_give_op_time_and_output_dtype():
    stats = step_stats_pb2.StepStats()
    device = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:0")
    for name, label, start, end, dtype in (("mm", "mm = MatMul(a, b)", 10, 40, 19),
                                           ("mm", "mm = MatMul(a, b)", 50, 60, 19),
                                           ("_SOURCE", "_SOURCE = NoOp()", 0, 1, 0),
                                           ("s", "s = Sum(mm, i)", 60, 65, 1)):
        node = device.node_stats.add(node_name=name, timeline_label=label, op_start_rel_micros=start,
                                     op_end_rel_micros=end)
        if dtype:
            node.output.add().tensor_description.dtype = dtype
    found = sorted(step_stats_ops(stats), key=lambda o: o.node)
    assert found == [OpTime("mm", "MatMul", 40.0, "float16"), OpTime("s", "Sum", 5.0, "float32")]
