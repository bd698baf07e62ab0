"""doctor --benchmark: both graphs run, interleaved, on the same inputs; the line says which is faster."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import ScheduledClock, amp, rng, tf1
from runners import run_cli

from amp_rewrite.report.measure import BenchmarkError, Measurement, cpu_features, measure_speedup, measurement_line
from amp_rewrite.tune.trial import MARGIN


def mlp():
    r = rng(2)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 32], name="x")
        w = tf1.get_variable("w", initializer=(r.standard_normal((32, 32)) * 0.1).astype(np.float32))
        h = tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu")
        tf.identity(tf.matmul(h, w, name="mm2"), name="out")
        tf.group(tf1.global_variables_initializer(), name="init")
    return g.as_graph_def()


def test_steps_follow_the_schedule_and_the_best_of_each_counts():
    gd = mlp()
    result = amp(gd, ["out"])
    clock = ScheduledClock(half=[9.0] + [1.0] * 5, float32=[9.0] + [3.0] * 5, rounds=5)
    m = measure_speedup(gd, result.graph_def, feeds={"x": np.ones((4, 32), np.float32)}, fetches=["out"],
                        runs=5, init_op="init", timer=clock)
    assert clock.reads == 2 * 2 * (1 + 5)  # two reads per step, one warm-up and five timed steps of each graph
    assert (m.float32_seconds, m.half_seconds, m.runs, m.speedup, m.device) == (3.0, 1.0, 5, 3.0, "CPU")
    assert m.verdict().is_half


def test_the_best_step_of_each_graph_counts_and_the_margin_decides():
    gd = mlp()
    half = amp(gd, ["out"]).graph_def
    feeds = {"x": np.ones((4, 32), np.float32)}
    # warm-ups of 64 s are not counted; a neighbour's load only ever adds time, so the minimum is kept
    clock = ScheduledClock(half=[64.0, 0.96875, 3.0, 0.984375, 2.0], float32=[64.0, 1.0, 1.5, 1.25, 1.125])
    m = measure_speedup(gd, half, feeds=feeds, fetches=["out"], init_op="init", timer=clock)
    assert (m.half_seconds, m.float32_seconds, m.runs) == (0.96875, 1.0, 4)
    assert not m.verdict().is_half  # 3% faster is inside MARGIN: float32 stays
    line = measurement_line(m, target="bfloat16", bound=2.0)
    assert "best of 4, interleaved" in line
    assert line.endswith("Stays float32 on this machine: the graph ran 969 ms in bfloat16 and 1000 ms in float32 "
                         f"on this CPU, less than the {MARGIN:.0%} that half must save")


def test_a_graph_that_fails_to_run_is_one_error_naming_it():
    gd = mlp()
    with pytest.raises(BenchmarkError, match="rewritten graph fails at node"):  # never initialized; half runs first
        measure_speedup(gd, amp(gd, ["out"]).graph_def, feeds={"x": np.ones((4, 32), np.float32)},
                        fetches=["out"], runs=1, warmup=0)


def test_the_line_gives_the_verdict_in_the_words_of_tune():
    slower = Measurement(float32_seconds=0.010, half_seconds=0.040, runs=4, device="CPU",
                         cpu_features=("avx2", "fma", "f16c"))
    line = measurement_line(slower, target="float16", bound=1.8)
    assert "0.25x" in line and "bound 1.80x" in line
    assert line.endswith("Stays float32 on this machine: the graph ran 40.0 ms in float16 and 10.0 ms in float32 "
                         "on this CPU")
    assert "no avx512f avx512_fp16 avx512_bf16" in line
    same = Measurement(float32_seconds=0.0100, half_seconds=0.0099, runs=4, device="CPU")
    line = measurement_line(same, target="float16", bound=2.0)
    assert "1.01x" in line and "Stays float32" in line and "less than the 5% that half must save" in line
    faster = Measurement(float32_seconds=0.030, half_seconds=0.020, runs=4, device="GPU")
    line = measurement_line(faster, target="float16", bound=None)
    assert "1.50x" in line and "bound unknown" in line and line.endswith("float16 is faster here")
    assert "Stays float32" not in line and "CPU:" not in line


def test_cpu_features_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 fma f16c avx512_bf16\n")
    assert cpu_features(str(info)) == ("avx2", "fma", "f16c", "avx512_bf16")
    assert cpu_features(str(tmp_path / "none")) == ()


def test_cli_benchmark_runs_the_initializer_and_prints_the_measured_line(tmp_path):
    path = tmp_path / "mlp.pb"
    path.write_bytes(mlp().SerializeToString())
    done = run_cli("doctor", path, "--fetch", "out", "--benchmark", "--runs", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = done.stdout.splitlines()[-1]
    assert line.startswith("measured on this machine's CPU") and "best of 2, interleaved" in line


def test_cli_benchmark_refuses_a_saved_model(tmp_path):
    module = tf.Module()
    module.f = tf.function(lambda x: tf.matmul(x, x), input_signature=[tf.TensorSpec([4, 4], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    done = run_cli("doctor", tmp_path / "sm", "--benchmark", cwd=tmp_path)
    assert done.returncode == 2
    assert "--benchmark takes a GraphDef input" in done.stderr
