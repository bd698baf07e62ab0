"""Unmodified TF1 training scripts, run with and without ENABLE_AUTO_MP=1.

The scripts in fixtures/ know nothing about amp-rewrite. Each module-scoped
fixture runs a batch of them in subprocesses (two at a time); the tests read
what the scripts wrote (losses, global_step, dtypes, checkpoints) and the
graphs the runtime dumped.
"""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from fixtures.harness import Script, run_scripts
from helpers import F16, our_lines, tf1

STEPS = 20
BAD_LISTS = {"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD": "Exp"}


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """Every MLP run that needs no checkpoint from another, started together (two at a time).

    fp32/amp/unset: Adam with clipping, probes and late ops; wrapped: the same
    under TensorFlow's own loss-scale optimizer; inject_*: an inf loss at step
    5 with Momentum and TF1 behaviour (ref variables, v1 cond).
    """
    root = tmp_path_factory.mktemp("mlp")
    common = ["--steps", STEPS, "--optimizer", "adam", "--clip", "1.0"]
    inject = ["--steps", 10, "--optimizer", "momentum", "--inject-inf", 5, "--v1-behavior"]
    runs = {
        "fp32": Script("train_mlp.py", common + ["--probe", "--late-ops", root,
                                                 "--save", root / "fp32/ckpt"], root / "fp32.json"),
        "amp": Script("train_mlp.py", common + ["--probe", "--late-ops", root,
                                                "--save", root / "amp/ckpt"],
                      root / "amp.json", amp=True, env={"AMP_REWRITE_DUMP_DIR": str(root / "dump")}),
        "inject_amp": Script("train_mlp.py", inject, root / "inject_amp.json", amp=True,
                             env={"AMP_LOSS_SCALE_LOG_STEPS": "4"}),
        "inject_fp32": Script("train_mlp.py", inject, root / "inject_fp32.json"),
        "unset": Script("train_mlp.py", common, root / "unset.json"),
        "wrapped": Script("train_mlp.py", common + ["--wrapped"], root / "wrapped.json", amp=True),
        # Exp in both the allow and the deny list: the rewrite fails.
        "fallback": Script("train_mlp.py", common, root / "fallback.json", amp=True, env=BAD_LISTS),
        "strict": Script("train_mlp.py", common, root / "strict.json", amp=True,
                         env={**BAD_LISTS, "AMP_REWRITE_STRICT": "1"}),
    }
    run_scripts(*runs.values())
    for name, script in runs.items():
        if name != "strict":
            script.check()
    return runs, root


@pytest.fixture(scope="module")
def restored(mlp):
    """Checkpoints crossing over: float32 → AMP and AMP → float32, then 5 more steps."""
    runs, root = mlp
    more = ["--steps", 5, "--optimizer", "adam", "--clip", "1.0"]
    crossed = {
        "fp32_to_amp": Script("train_mlp.py", more + ["--restore", runs["fp32"].result["saved"]],
                              root / "fp32_to_amp.json", amp=True),
        "amp_to_fp32": Script("train_mlp.py", more + ["--restore", runs["amp"].result["saved"]],
                              root / "amp_to_fp32.json"),
    }
    run_scripts(*crossed.values())
    return {name: script.check() for name, script in crossed.items()}


def dumped_graphs(directory: Path):
    """The (before, after) GraphDefs the runtime wrote."""
    after = sorted(directory.glob("*_after.pb"))
    assert after, f"nothing dumped in {directory}"
    graphs = []
    for path in (Path(str(after[0]).replace("_after", "_before")), after[0]):
        graph_def = tf1.GraphDef()
        graph_def.ParseFromString(path.read_bytes())
        graphs.append(graph_def)
    return graphs


def test_amp_run_computes_in_half_and_tracks_the_float32_loss(mlp):
    runs, root = mlp
    fp32, amp = np.array(runs["fp32"].result["losses"]), np.array(runs["amp"].result["losses"])
    assert np.all(np.isfinite(amp))
    np.testing.assert_allclose(amp, fp32, rtol=2e-2, atol=2e-3)
    assert not np.array_equal(amp, fp32)  # computed in half, so not bit-identical
    assert amp[-1] < 0.5 * amp[0]  # it trains
    before, after = dumped_graphs(root / "dump")
    half_matmuls = [n.name for n in after.node if n.op == "MatMul" and n.attr["T"].type == F16]
    assert "MatMul" in half_matmuls and "logits/MatMul" in half_matmuls
    assert not [n for n in before.node if n.attr["T"].type == F16]
    assert "INFO amp_rewrite.runtime.tf1.session: amp-rewrite: converted" in runs["amp"].stderr
    assert runs["amp"].stderr.count("amp-rewrite: converted") == 1  # one rewrite, one line


def test_compute_gradients_returns_unscaled_gradients(mlp):
    runs, _ = mlp
    fp32 = np.array(runs["fp32"].result["grad_norms"])
    amp = np.array(runs["amp"].result["grad_norms"])
    np.testing.assert_allclose(amp, fp32, rtol=5e-2, atol=1e-3)


def test_script_sees_its_own_graph_and_dtypes(mlp):
    amp = mlp[0]["amp"].result
    assert amp["graph_is_scripts"] is True
    assert amp["session_run_patched"] is True
    assert amp["loss_dtype"] == amp["hidden_dtype"] == amp["logits_dtype"] == "float32"


def test_intermediate_tensors_can_be_fetched_and_fed(mlp):
    runs, _ = mlp
    amp, fp32 = runs["amp"].result, runs["fp32"].result
    assert amp["via_feed_dtype"] == "float32"
    assert amp["feed_gap"] < 1e-2
    # Feeding zeros to the hidden layer leaves only the bias: the same in both runs.
    np.testing.assert_allclose(amp["zero_hidden_logits"], fp32["zero_hidden_logits"], atol=2e-3)


def test_ops_added_after_the_first_run_work(mlp):
    runs, _ = mlp
    for name in ("fp32", "amp"):
        result = runs[name].result
        assert result["late_summary_bytes"] > 0
        assert result["late_probs_dtype"] == "float32"
        assert result["late_probs_sum"] == pytest.approx(1.0, abs=1e-3)
        assert result["late_step"] == 1
        assert Path(result["late_saved"] + ".index").exists()


def test_unset_variable_changes_nothing(mlp):
    runs, _ = mlp
    unset = runs["unset"].result
    assert unset["amp_modules"] == []
    assert unset["session_run_patched"] is False
    # The float32 run's numbers. That run also adds ops after its first step,
    # and TensorFlow may re-optimise (fuse) the grown graph with another
    # rounding, so equal to float32 round-off, far inside half's 1e-3.
    np.testing.assert_allclose(unset["losses"], runs["fp32"].result["losses"], rtol=1e-4)
    assert our_lines(runs["unset"].stderr) == []


def test_checkpoints_hold_the_loss_scale_state_only_when_amp_ran(mlp):
    runs, _ = mlp
    fp32_keys = dict(tf.train.list_variables(runs["fp32"].result["saved"]))
    amp_keys = dict(tf.train.list_variables(runs["amp"].result["saved"]))
    state = {"amp_loss_scale/scale", "amp_loss_scale/good_steps", "amp_loss_scale/skipped_steps"}
    assert state <= set(amp_keys)
    assert not state & set(fp32_keys)
    assert set(amp_keys) - state == set(fp32_keys)  # slots and global_step keep their names
    assert tf.train.load_variable(runs["amp"].result["saved"], "amp_loss_scale/scale") == 2.0 ** 15
    assert tf.train.load_variable(runs["amp"].result["saved"], "global_step") == STEPS
    assert "Issue encountered when serializing" not in runs["amp"].stderr  # meta graph is clean


def test_float32_checkpoint_restores_into_amp_run(mlp, restored):
    runs, _ = mlp
    run = restored["fp32_to_amp"]
    assert run.result["start_step"] == STEPS
    assert run.result["steps"] == list(range(STEPS + 1, STEPS + 6))
    assert "has no loss-scale state" in run.stderr
    # It carries on from the weights the float32 run saved.
    np.testing.assert_allclose(run.result["losses"][0], runs["fp32"].result["final_loss"], rtol=1e-2)


def test_amp_checkpoint_restores_without_the_hook(mlp, restored):
    runs, _ = mlp
    run = restored["amp_to_fp32"]
    assert run.result["amp_modules"] == []
    assert run.result["start_step"] == STEPS
    # Its first loss is the loss of the weights the AMP run saved.
    np.testing.assert_allclose(run.result["losses"][0], runs["amp"].result["final_loss"], rtol=1e-2)


def test_injected_inf_skips_exactly_that_step(mlp):
    runs, _ = mlp
    fp32, amp = runs["inject_fp32"].result, runs["inject_amp"].result
    assert amp["steps"] == [1, 2, 3, 4, 5, 5, 6, 7, 8, 9]  # global_step held once
    assert fp32["steps"] == list(range(1, 11))
    assert np.isnan(fp32["losses"][6])  # float32 without the guard is ruined
    assert np.all(np.isfinite(amp["losses"][6:]))
    np.testing.assert_allclose(amp["losses"][:5], fp32["losses"][:5], rtol=2e-2)
    stderr = runs["inject_amp"].stderr
    assert stderr.count("step skipped, gradients not finite; loss scale now 16384, "
                        "1 steps skipped so far") == 1
    assert "loss scale 32768, 0 steps skipped so far" in stderr  # the periodic line


def test_wrapped_optimizer_is_not_scaled_twice(mlp):
    runs, _ = mlp
    wrapped = runs["wrapped"]
    np.testing.assert_allclose(wrapped.result["grad_norms"], runs["fp32"].result["grad_norms"],
                               rtol=5e-2, atol=1e-3)
    assert not [v for v in wrapped.result["variables"] if v.startswith("amp_loss_scale")]
    assert "amp-rewrite: converted" in wrapped.stderr  # the graph is still rewritten


def text_graph_write_error(directory) -> str | None:
    """Why this TensorFlow cannot write a text GraphDef (as MonitoredTrainingSession's checkpoint hook does), or None.

    TensorFlow 2.20 passes ``float_format`` to protobuf's text writer, which
    protobuf 7 no longer takes; 2.20 does not bound protobuf, so pip may pair them.
    """
    try:
        tf.io.write_graph(tf.Graph(), str(directory), "probe.pbtxt", as_text=True)
    except TypeError as exc:
        import google.protobuf

        return f"TensorFlow {tf.__version__} with protobuf {google.protobuf.__version__}: tf.io.write_graph: {exc}"
    return None


@pytest.mark.slow
def test_monitored_training_session_and_its_checkpoints_cross_over(tmp_path):
    broken = text_graph_write_error(tmp_path)
    if broken is not None:
        pytest.skip(f"MonitoredTrainingSession fails in float32 too here: {broken}")
    """MonitoredTrainingSession: AMP trains like float32 and resumes from either's checkpoints."""
    first = ["--optimizer", "momentum", "--last-step", 10]
    fp32 = Script("train_cnn_monitored.py", first + ["--model-dir", tmp_path / "a"],
                  tmp_path / "fp32.json")
    amp = Script("train_cnn_monitored.py", first + ["--model-dir", tmp_path / "b"],
                 tmp_path / "amp.json", amp=True, env={"AMP_REWRITE_DUMP_DIR": str(tmp_path / "d")})
    run_scripts(fp32, amp)
    fp32.check(), amp.check()
    np.testing.assert_allclose(amp.result["losses"], fp32.result["losses"], rtol=3e-2, atol=3e-3)
    assert amp.result["steps"] == fp32.result["steps"] == list(range(1, 11))
    _, after = dumped_graphs(tmp_path / "d")
    assert {"conv1/Conv2D", "conv2/Conv2D"} <= {
        n.name for n in after.node if n.op == "Conv2D" and n.attr["T"].type == F16}

    second = ["--optimizer", "momentum", "--last-step", 15]
    amp_from_fp32 = Script("train_cnn_monitored.py", second + ["--model-dir", tmp_path / "a"],
                           tmp_path / "amp2.json", amp=True)
    fp32_from_amp = Script("train_cnn_monitored.py", second + ["--model-dir", tmp_path / "b"],
                           tmp_path / "fp32_2.json")
    run_scripts(amp_from_fp32, fp32_from_amp)
    amp_from_fp32.check(), fp32_from_amp.check()
    for run in (amp_from_fp32, fp32_from_amp):
        assert run.result["start_step"] == 10
        assert run.result["steps"] == list(range(11, 16))
    assert "has no loss-scale state" in amp_from_fp32.stderr


def test_failed_rewrite_falls_back_to_float32_with_a_warning(mlp):
    runs, _ = mlp
    fallback = runs["fallback"]
    assert ("WARNING amp_rewrite.runtime.tf1.session: amp-rewrite: running the float32 graph: "
            "rewrite failed: ListError: op Exp is in both") in fallback.stderr
    # Loss scaling by a power of two is exact in float32: the very same numbers
    # as the same script (same ops) without the runtime.
    assert fallback.result["losses"] == runs["unset"].result["losses"]
    assert fallback.result["steps"] == list(range(1, STEPS + 1))


def test_strict_mode_stops_the_script_instead(mlp):
    runs, _ = mlp
    strict = runs["strict"]
    assert strict.returncode != 0
    assert "RuntimeRewriteError: rewrite failed: ListError: op Exp is in both" in strict.stderr
