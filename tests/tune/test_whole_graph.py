"""--tune: the rewritten graph is written only where its steps ran faster than float32's; timed once, then cached.

No test times anything: the clock (or the whole step runner) is injected.
"""

import json

import numpy as np
import pytest
import tensorflow as tf
from helpers import ScheduledClock, amp, assert_same_outputs_within_half, node_types, our_lines, rng, tf1
from runners import run_cli

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT
from amp_rewrite.tune import whole_graph
from amp_rewrite.tune.cache import TuneCache
from amp_rewrite.tune.trial import FLOAT32, HALF, confirmation, schedule
from amp_rewrite.tune.whole_graph import NOT_TIMED, RUNS_IN_HALF, STAYS_FLOAT32, tuned_rewrite


def mlp(batch=None):
    r = rng(3)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [batch, 16], name="x")
        w = tf.constant((r.standard_normal((16, 16)) * 0.3).astype(np.float32), name="w")
        h = tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu")
        tf.identity(tf.matmul(h, w, name="mm2"), name="out")
    return g.as_graph_def()


@pytest.fixture
def graph_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AMP_REWRITE_TUNE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "mlp.pb"
    path.write_bytes(mlp().SerializeToString(deterministic=True))
    return path


def clock_failing_if_read():
    raise AssertionError("a step was timed: the cached times should have decided")


def tune(path, out, *extra, cwd):
    return run_cli(path, out, "--target", "bfloat16", "--device-type", "CPU", "--fetch", "out", "--tune", *extra,
                   cwd=cwd)


def test_where_half_wins_the_rewritten_graph_is_written_and_a_second_run_reads_the_cache(
        graph_file, tmp_path, monkeypatch):
    monkeypatch.setattr(whole_graph, "CLOCK", ScheduledClock(half=0.5, float32=1.0))
    done = tune(graph_file, tmp_path / "out.pb", "--report", tmp_path / "report.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert our_lines(done.stderr) == [
        f"amp-rewrite: {graph_file}: the graph runs in bfloat16: the graph ran 500 ms in bfloat16 and 1000 ms in "
        "float32 on this CPU (2.00x)"]
    written = tf.compat.v1.GraphDef.FromString((tmp_path / "out.pb").read_bytes())
    lists = amp(mlp(), ["out"], target="bfloat16", device_type="CPU").graph_def
    assert node_types(written) == node_types(lists)  # the lists' rewrite, node by node
    assert node_types(written)["mm"] == DT_BFLOAT16 and node_types(written)["out"] == DT_FLOAT
    feeds = {"x": rng(1).standard_normal((8, 16)).astype(np.float32)}
    assert_same_outputs_within_half(mlp(), written, ["out"], feeds, rtol=5e-2, atol=5e-2)
    report = json.loads((tmp_path / "report.json").read_text())["tuning"]
    assert (report["decision"], report["half_seconds"], report["float32_seconds"], report["is_cached"]) == (
        "half", 0.5, 1.0, False)

    monkeypatch.setattr(whole_graph, "CLOCK", clock_failing_if_read)
    again = tune(graph_file, tmp_path / "again.pb", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again.pb").read_bytes() == (tmp_path / "out.pb").read_bytes()
    assert "measured before, read from the cache" in our_lines(again.stderr)[0]


def test_where_half_loses_the_input_graph_is_written_unchanged_with_the_reason(graph_file, tmp_path, monkeypatch):
    monkeypatch.setattr(whole_graph, "CLOCK", ScheduledClock(half=[9.0, 0.449, 0.5, 0.46, 0.5],
                                                             float32=[9.0, 0.4, 0.373, 0.38, 0.4]))
    done = tune(graph_file, tmp_path / "out.pb", "--report", tmp_path / "report.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = (f"amp-rewrite: {graph_file}: the graph stays float32: the graph ran 449 ms in bfloat16 and 373 ms in "
            "float32 on this CPU")
    assert our_lines(done.stderr) == [line]
    assert done.stdout.startswith("stays float32: the graph ran 449 ms in bfloat16 and 373 ms in float32 on this "
                                  "CPU; the bfloat16 rewrite timed converted ")
    written = tf.compat.v1.GraphDef.FromString((tmp_path / "out.pb").read_bytes())
    assert written == mlp()
    assert (tmp_path / "out.pb").read_bytes() == graph_file.read_bytes()
    report = json.loads((tmp_path / "report.json").read_text())["tuning"]
    assert report["decision"] == "float32" and report["line"] == line.split(": the graph ", 1)[1]

    monkeypatch.setattr(whole_graph, "CLOCK", clock_failing_if_read)
    again = tune(graph_file, tmp_path / "again.pb", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again.pb").read_bytes() == graph_file.read_bytes()
    [cache_file] = (tmp_path / "cache").glob("tune-*.json")
    assert our_lines(again.stderr) == [f"{line}; measured before, read from the cache {cache_file}"]


def test_a_near_tie_stays_float32(graph_file, tmp_path, monkeypatch):
    monkeypatch.setattr(whole_graph, "CLOCK", ScheduledClock(half=0.97, float32=1.0))
    done = tune(graph_file, tmp_path / "out.pb", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "less than the 5% that half must save" in our_lines(done.stderr)[0]
    assert (tmp_path / "out.pb").read_bytes() == graph_file.read_bytes()


def test_a_graph_that_cannot_be_fed_keeps_the_lists_rewrite_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("AMP_REWRITE_TUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(whole_graph, "CLOCK", clock_failing_if_read)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, None, name="x")  # unknown rank: no random inputs
        w = tf.constant(np.ones((16, 16), np.float32), name="w")
        tf.identity(tf.matmul(tf.reshape(x, [-1, 16]), w, name="mm"), name="out")
    path = tmp_path / "unknown_rank.pb"
    path.write_bytes(g.as_graph_def().SerializeToString())
    done = tune(path, tmp_path / "out.pb", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert our_lines(done.stderr) == [
        f"amp-rewrite: {path}: the graph keeps the op lists' rewrite, not timed: no inputs can be drawn for it: "
        "placeholder x has unknown rank: give sample inputs with --inputs"]
    written = tf.compat.v1.GraphDef.FromString((tmp_path / "out.pb").read_bytes())
    assert node_types(written)["mm"] == DT_BFLOAT16
    assert "Traceback" not in done.stderr


def test_a_graph_that_fails_to_run_keeps_the_lists_rewrite_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("AMP_REWRITE_TUNE_CACHE", str(tmp_path / "cache"))
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        w = tf1.get_variable("w", initializer=np.ones((16, 16), np.float32), use_resource=True)
        tf.identity(tf.matmul(x, w, name="mm"), name="out")  # the variable is never initialized: no "init" node
    path = tmp_path / "uninitialized.pb"
    path.write_bytes(g.as_graph_def().SerializeToString())
    done = tune(path, tmp_path / "out.pb", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = our_lines(done.stderr)
    assert line.startswith(f"amp-rewrite: {path}: the graph keeps the op lists' rewrite, not timed: it could not be "
                           "run: the rewritten graph fails at node ")
    assert node_types(tf.compat.v1.GraphDef.FromString((tmp_path / "out.pb").read_bytes()))["mm"] == DT_BFLOAT16
    assert not list((tmp_path / "cache").glob("*.json"))  # nothing measured, nothing cached


def test_the_inputs_file_feeds_the_trial_and_a_saved_model_is_refused(graph_file, tmp_path, monkeypatch):
    np.savez(tmp_path / "feeds.npz", x=np.ones((3, 16), np.float32))
    seen = []

    class Runner:
        def __init__(self, graphs, *, feeds, fetches, init_op, timer):
            seen.append((sorted(graphs), {k: v.shape for k, v in feeds.items()}, fetches, init_op))

        def step(self, body):
            return {HALF: 1.0, FLOAT32: 2.0}[body]

        def close(self):
            pass

    monkeypatch.setattr(whole_graph, "GraphSessions", Runner)
    done = tune(graph_file, tmp_path / "out.pb", "--inputs", tmp_path / "feeds.npz", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert seen == [(["float32", "half"], {"x": (3, 16)}, ("out",), None)]
    module = tf.Module()
    module.f = tf.function(lambda x: tf.matmul(x, x), input_signature=[tf.TensorSpec([4, 4], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    refused = run_cli(tmp_path / "sm", tmp_path / "sm_out", "--tune", cwd=tmp_path)
    assert refused.returncode == 2 and "--tune takes a GraphDef input" in refused.stderr


class FakeRunner:
    """Steps whose seconds are given per body; records the bodies run in order."""

    def __init__(self, seconds):
        self.seconds, self.bodies, self.made = seconds, [], 0

    def __call__(self, graphs, *, feeds, fetches, init_op, timer):
        self.made += 1
        self.graphs, self.feeds = graphs, feeds
        return self

    def step(self, body):
        self.bodies.append(body)
        return self.seconds[body]

    def close(self):
        pass


def test_the_api_alternates_per_the_schedule_fills_unknown_batches_and_caches(tmp_path):
    cache = TuneCache(tmp_path, device="CPU test", tensorflow="test")
    runner = FakeRunner({HALF: 0.002, FLOAT32: 0.003})
    gd = mlp(batch=None)
    result = tuned_rewrite(gd, fetches=["out"], target="bfloat16", config=amp_config(tune_batch=8), cache=cache,
                           runner=runner)
    assert runner.bodies == schedule()
    assert runner.feeds["x"].shape == (8, 16)  # the unknown batch is the tuning batch
    assert result.tuning.outcome == RUNS_IN_HALF and result.graph_def is not gd
    assert "(1.50x)" in result.summary(with_flops=False)
    again = tuned_rewrite(gd, fetches=["out"], target="bfloat16", config=amp_config(tune_batch=8),
                          cache=TuneCache(tmp_path, device="CPU test", tensorflow="test"), runner=runner)
    assert runner.made == 1 and again.tuning.verdict.is_cached
    assert again.graph_def == result.graph_def
    other_batch = tuned_rewrite(gd, fetches=["out"], target="bfloat16", config=amp_config(tune_batch=4),
                                cache=TuneCache(tmp_path, device="CPU test", tensorflow="test"), runner=runner)
    assert runner.made == 2 and not other_batch.tuning.verdict.is_cached  # other shapes: another key

    slower = tuned_rewrite(gd, fetches=["out"], target="bfloat16", config=amp_config(), runner=FakeRunner(
        {HALF: 0.004, FLOAT32: 0.003}), cache=TuneCache(tmp_path / "b", device="CPU test", tensorflow="test"))
    assert slower.tuning.outcome == STAYS_FLOAT32 and slower.graph_def is gd


def test_a_batch_of_zero_leaves_an_unknown_batch_to_the_lists(tmp_path):
    result = tuned_rewrite(mlp(batch=None), fetches=["out"], target="bfloat16", config=amp_config(tune_batch=0),
                           cache=TuneCache(tmp_path, device="CPU test", tensorflow="test"),
                           runner=FakeRunner({HALF: 1.0, FLOAT32: 1.0}))
    assert result.tuning.outcome == NOT_TIMED and "tuning batch is 0" in result.tuning.reason
    assert node_types(result.graph_def)["mm"] == DT_BFLOAT16


def amp_config(**fields):
    from amp_rewrite import Config

    return Config(device_type="CPU", **fields)


def test_the_tuning_flags_are_the_rewrites_alone_and_a_bad_batch_is_a_usage_error(tmp_path, monkeypatch):
    from amp_rewrite.cli.args import build_explain_parser, build_parser, config_from_args

    monkeypatch.setenv("AMP_REWRITE_TUNE", "1")  # the runtime's switch: not the CLI's
    assert build_parser().parse_args(["in.pb", "out.pb"]).tune is False
    args = build_parser().parse_args(["in.pb", "out.pb", "--tune", "--tune-batch", "64"])
    assert args.tune and config_from_args(args).tune_batch == 64
    assert config_from_args(build_explain_parser().parse_args(["in.pb", "mm"])).tune_batch == 32
    done = run_cli("in.pb", "out.pb", "--tune", "--tune-batch", "-1", cwd=tmp_path)
    assert done.returncode == 2 and "--tune-batch: '-1': must be from 0 to" in done.stderr
    gone = run_cli("in.pb", "out.pb", "--tune", "--tune-budget", "5", cwd=tmp_path)
    assert gone.returncode == 2 and "unrecognized arguments: --tune-budget" in gone.stderr


def two_branches():
    """Two half regions that share only the Cast of their input: ``x → mm_a → relu_a`` and ``x → mm_b → relu_b``."""
    r = rng(4)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        wa = tf.constant((r.standard_normal((16, 16)) * 0.3).astype(np.float32), name="wa")
        wb = tf.constant((r.standard_normal((16, 16)) * 0.3).astype(np.float32), name="wb")
        tf.identity(tf.nn.relu(tf.matmul(x, wa, name="mm_a"), name="relu_a"), name="out_a")
        tf.identity(tf.nn.relu(tf.matmul(x, wb, name="mm_b"), name="relu_b"), name="out_b")
    return g.as_graph_def()


class ProfilingRunner:
    """The pure graphs step in 4 s (half) and 3 s (float32); their profiles say region a wins in half, b loses.

    The second runner made is the mixed trial's: the mixed graph steps in ``mixed`` s, the better pure one in 3.
    """

    def __init__(self, mixed: float):
        self.mixed, self.made, self.profiled, self.bodies = mixed, [], [], []

    def __call__(self, graphs, *, feeds, fetches, init_op, timer):
        self.made.append(graphs)
        return self

    def step(self, body):
        self.bodies.append(body)
        if len(self.made) == 1:
            return {HALF: 4.0, FLOAT32: 3.0}[body]
        return {HALF: self.mixed, FLOAT32: 3.0}[body]

    def profile(self, body):
        self.profiled.append(body)
        return {HALF: {"mm_a": 1.0, "mm_b": 3.0}, FLOAT32: {"mm_a": 2.0, "mm_b": 1.0}}[body]

    def close(self):
        pass


def test_a_mixed_step_that_beats_both_keeps_the_slower_region_float32_and_is_cached(tmp_path):
    gd = two_branches()
    runner = ProfilingRunner(mixed=2.0)
    result = tuned_rewrite(gd, fetches=["out_a", "out_b"], target="bfloat16", config=amp_config(), runner=runner,
                           cache=TuneCache(tmp_path, device="CPU test", tensorflow="test"))
    assert runner.profiled == [HALF, FLOAT32] and len(runner.made) == 2
    assert runner.bodies[len(schedule()):] == confirmation().order  # the runtime's confirming trial
    mixed_graph, best = runner.made[1][HALF], runner.made[1][FLOAT32]
    assert best == gd  # float32 was the better pure graph
    assert result.tuning.outcome == "mixed" and result.graph_def == mixed_graph
    assert result.tuning.line("bfloat16") == (
        "runs mixed: the graph ran 2000 ms with 1 of 2 half regions in bfloat16 and 3000 ms in float32 on this CPU "
        "(1.50x); in bfloat16 alone it ran 4000 ms")
    types = node_types(result.graph_def)
    assert (types["mm_a"], types["relu_a"], types["mm_b"], types["relu_b"]) == (
        DT_BFLOAT16, DT_BFLOAT16, DT_FLOAT, DT_FLOAT)
    assert result.node_outcomes["mm_b"]["reason"] == ("mm_b (MatMul) stays float32: kept float32: in the step, its "
                                                      "region (1 MatMul, 1 Relu) ran 3000.0 ms in bfloat16 and "
                                                      "1000.0 ms in float32")
    feeds = {"x": rng(2).standard_normal((8, 16)).astype(np.float32)}
    assert_same_outputs_within_half(gd, result.graph_def, ["out_a", "out_b"], feeds, rtol=5e-2, atol=5e-2)
    tuning = result.report()["tuning"]
    assert (tuning["mixed_seconds"], tuning["better_pure_seconds"], tuning["half_regions"], tuning["regions"]) == (
        2.0, 3.0, 1, 2)

    never = FakeRunner({})
    cache = TuneCache(tmp_path, device="CPU test", tensorflow="test")
    again = tuned_rewrite(gd, fetches=["out_a", "out_b"], target="bfloat16", config=amp_config(), runner=never,
                          cache=cache)
    assert never.made == 0 and again.graph_def == result.graph_def
    assert again.tuning.line("bfloat16").endswith("in bfloat16 alone it ran 4000 ms; measured before, read from the "
                                                  f"cache {cache.path}")


def test_a_mixed_step_no_faster_than_the_better_pure_graph_is_dropped(tmp_path):
    gd = two_branches()
    runner = ProfilingRunner(mixed=2.9)  # predicted faster, but within MARGIN of float32's 3 s in its trial
    result = tuned_rewrite(gd, fetches=["out_a", "out_b"], target="bfloat16", config=amp_config(), runner=runner,
                           cache=TuneCache(tmp_path, device="CPU test", tensorflow="test"))
    assert len(runner.made) == 2
    assert result.tuning.outcome == STAYS_FLOAT32 and result.graph_def is gd
    assert result.tuning.line("bfloat16") == (
        "stays float32: the graph ran 4000 ms in bfloat16 and 3000 ms in float32 on this CPU; with 1 of 2 half "
        "regions in bfloat16 it ran 2900 ms")


class NoisyRunner(FakeRunner):
    """Steps whose seconds per body are given in the order each body runs (the last repeated)."""

    def step(self, body):
        self.bodies.append(body)
        runs = self.seconds[body]
        return runs[min(self.bodies.count(body), len(runs)) - 1]


def test_a_verdict_whose_halves_disagree_is_written_but_not_cached(tmp_path):
    """The rewrite won the trial's first half by 2x and lost its second: this run keeps it, the next measures again."""
    gd = mlp()
    noisy = NoisyRunner({HALF: [9.0, 0.5, 0.5, 1.3, 1.3], FLOAT32: [9.0, 1.0]})
    result = tuned_rewrite(gd, fetches=["out"], target="bfloat16", config=amp_config(), runner=noisy,
                           cache=TuneCache(tmp_path, device="CPU test", tensorflow="test"))
    assert result.tuning.outcome == RUNS_IN_HALF and not result.tuning.verdict.is_clear
    assert result.tuning.line("bfloat16") == (
        "runs in bfloat16: the graph ran 500 ms in bfloat16 and 1000 ms in float32 on this CPU (2.00x); not clear "
        "enough to keep (2.00x in the trial's first half, 0.77x in its second): a later run measures again")
    clear = FakeRunner({HALF: 1.2, FLOAT32: 1.0})
    again = tuned_rewrite(gd, fetches=["out"], target="bfloat16", config=amp_config(), runner=clear,
                          cache=TuneCache(tmp_path, device="CPU test", tensorflow="test"))
    assert clear.made == 1 and again.tuning.outcome == STAYS_FLOAT32 and not again.tuning.verdict.is_cached


def test_the_key_follows_the_op_lists(tmp_path):
    from dataclasses import replace

    from amp_rewrite.paint.op_lists import ListEdit

    gd, runner = mlp(), FakeRunner({HALF: 0.5, FLOAT32: 1.0})
    tuned_rewrite(gd, fetches=["out"], target="bfloat16", config=amp_config(), runner=runner,
                  cache=TuneCache(tmp_path, device="CPU test", tensorflow="test"))
    edited = replace(amp_config(), list_edits=(ListEdit("deny", "Cumprod", True, "--deny-add"),))
    again = tuned_rewrite(gd, fetches=["out"], target="bfloat16", config=edited, runner=runner,
                          cache=TuneCache(tmp_path, device="CPU test", tensorflow="test"))
    assert runner.made == 2 and not again.tuning.verdict.is_cached
