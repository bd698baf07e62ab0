"""doctor --benchmark: both graphs run, interleaved, on the same inputs; the line says which is faster."""

import itertools

import numpy as np
import pytest
import tensorflow as tf
from helpers import amp, rng, tf1
from runners import run_cli

from amp_rewrite.report.measure import BenchmarkError, Measurement, cpu_features, measure_speedup, measurement_line


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


class Clock:
    """A fake clock: each timed step of the float32 graph takes 3 units, of the rewritten one 1; it logs reads."""

    def __init__(self):
        self.now, self.reads = 0.0, 0
        self.costs = itertools.cycle([3.0, 1.0])

    def __call__(self):
        self.reads += 1
        if self.reads % 2 == 0:  # the second read of a step: the step took its cost
            self.now += next(self.costs)
        return self.now


def test_steps_are_timed_in_turn_and_medians_kept():
    gd = mlp()
    result = amp(gd, ["out"])
    clock = Clock()
    m = measure_speedup(gd, result.graph_def, feeds={"x": np.ones((4, 32), np.float32)}, fetches=["out"],
                        runs=5, init_op="init", timer=clock)
    assert clock.reads == 2 * 2 * 5  # two reads per timed step, five steps of each graph
    assert (m.float32_seconds, m.half_seconds, m.runs) == (3.0, 1.0, 5)
    assert m.speedup == 3.0 and m.device == "CPU"


def test_a_graph_that_fails_to_run_is_one_error_naming_it():
    gd = mlp()
    with pytest.raises(BenchmarkError, match="float32 graph fails at node"):  # variables never initialized
        measure_speedup(gd, amp(gd, ["out"]).graph_def, feeds={"x": np.ones((4, 32), np.float32)},
                        fetches=["out"], runs=1, warmup=0)


def test_the_line_says_plainly_when_half_is_slower_and_suggests_float32():
    slower = Measurement(float32_seconds=0.010, half_seconds=0.040, runs=10, device="CPU",
                         cpu_features=("avx2", "fma", "f16c"))
    line = measurement_line(slower, target="float16", bound=1.8)
    assert "0.25x" in line and "bound 1.80x" in line and "SLOWER" in line and "stay float32" in line
    assert "no avx512f avx512_fp16 avx512_bf16" in line
    same = Measurement(float32_seconds=0.0100, half_seconds=0.0099, runs=10, device="CPU")
    line = measurement_line(same, target="float16", bound=2.0)
    assert "1.01x" in line and "gains nothing measurable" in line and "stay float32" in line
    faster = Measurement(float32_seconds=0.030, half_seconds=0.020, runs=10, device="GPU")
    line = measurement_line(faster, target="float16", bound=None)
    assert "1.50x" in line and "bound unknown" in line and "SLOWER" not in line and "CPU:" not in line


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
    assert line.startswith("measured on this machine's CPU") and "median of 2, interleaved" in line


def test_cli_benchmark_refuses_a_saved_model(tmp_path):
    module = tf.Module()
    module.f = tf.function(lambda x: tf.matmul(x, x), input_signature=[tf.TensorSpec([4, 4], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    done = run_cli("doctor", tmp_path / "sm", "--benchmark", cwd=tmp_path)
    assert done.returncode == 2
    assert "--benchmark takes a GraphDef input" in done.stderr
