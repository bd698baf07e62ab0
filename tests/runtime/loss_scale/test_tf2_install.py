"""Loss scaling in TF2 training loops under ``ENABLE_AUTO_MP=1`` (float16 target).

``fixtures/train_tf2_loops.py`` trains a tiny-loss model (loss x 1e-6,
learning rate x 1e6) in each loop style, in three subprocesses per Keras:
float32 (no variable), AMP, and AMP with scaling off (``AMP_LOSS_SCALE=1``).
Both AMP runs make one gradient inf in step 3; the AMP run also restores the
float32 run's checkpoint, and its own one with the runtime disabled.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import TESTS
from runners import clean_env

FIXTURES = TESTS / "fixtures"
LOOPS = FIXTURES / "train_tf2_loops.py"
OVERFLOW = FIXTURES / "overflow_step.py"
KERAS3 = ("keras_function", "keras_eager", "keras_train_step", "keras_mirrored")
TF_KERAS = ("tf_keras_fit", "tf_keras_loop")
STYLES = KERAS3 + TF_KERAS
FIT_STYLES = ("tf_keras_fit",)  # user code never sees the gradients
INJECT_STEP = 3
STEPS = 120
FLOAT16 = {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "float16"}
SKIP_LINE = ("step skipped, gradients not finite for 1 of 5 variables: probe/injected.")


def start(root, name, styles, env, *more):
    out = root / f"{name}.json"
    command = [sys.executable, str(LOOPS), "--styles", ",".join(styles), "--out", str(out),
               "--ckpt-dir", str(root / name), *more]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    return out, process


def finish(out, process):
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-4000:]
    return json.loads(out.read_text()), stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"f32"|"amp"|"unscaled": {style: result}} and {"amp"|"unscaled": stderr per Keras}."""
    root = tmp_path_factory.mktemp("loops")
    inject = ("--inject-step", str(INJECT_STEP))
    groups = {"k3": (KERAS3, {}), "tfk": (TF_KERAS, {"TF_USE_LEGACY_KERAS": "1"})}
    results = {"f32": {}, "amp": {}, "unscaled": {}}
    stderrs = {"amp": {}, "unscaled": {}}
    first = {}
    for group, (styles, extra) in groups.items():
        first[group, "f32"] = start(root, f"f32_{group}", styles, clean_env(**extra))
        first[group, "unscaled"] = start(root, f"unscaled_{group}", styles,
                                         clean_env(**extra, **FLOAT16, AMP_LOSS_SCALE="1"), *inject)
    for (group, kind), running in first.items():
        result, stderr = finish(*running)
        results[kind].update(result)
        if kind == "unscaled":
            stderrs[kind][group] = stderr
    second = {group: start(root, f"amp_{group}", styles, clean_env(**extra, **FLOAT16), *inject,
                           "--restore-from", str(root / f"f32_{group}"))
              for group, (styles, extra) in groups.items()}
    for group, running in second.items():
        result, stderr = finish(*running)
        results["amp"].update(result)
        stderrs["amp"][group] = stderr
    return results, stderrs


def final_loss(result, style):
    losses = result["losses"]
    # fit reports epoch means; a loop reports steps: average the last epoch's 8
    return losses[-1] if style in FIT_STYLES or style == "keras_train_step" else float(np.mean(losses[-8:]))


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_float16_trains_like_float32_and_unscaled_float16_does_not(runs, style):
    results, _ = runs
    f32, amp, unscaled = (final_loss(results[k][style], style) for k in ("f32", "amp", "unscaled"))
    assert f32 < 0.5, f"float32 did not train: {f32}"
    assert abs(amp - f32) <= 0.1 * f32, (amp, f32)
    assert unscaled > 2.0, f"float16 without scaling should stay near chance (2.30): {unscaled}"


@pytest.mark.slow
@pytest.mark.parametrize("style", [s for s in STYLES if s not in FIT_STYLES])
def test_user_code_sees_the_float32_gradients(runs, style):
    results, _ = runs
    f32 = [np.asarray(g) for g in results["f32"][style]["seen_grads"]]
    amp = [np.asarray(g) for g in results["amp"][style]["seen_grads"]]
    unscaled = [np.asarray(g) for g in results["unscaled"][style]["seen_grads"]]
    assert len(f32) == len(amp) == 5
    # Float16 forward math rounds activations (a ReLU near 0 may flip), so single
    # elements of the first layer's gradient can be a few % off: judge each
    # tensor by its relative L2 error.
    for want, got in zip(f32, amp):
        if np.abs(want).max() > 0:
            assert np.linalg.norm(got - want) <= 3e-2 * np.linalg.norm(want)
        else:
            np.testing.assert_array_equal(got, want)
    # without scaling the same gradients underflow in float16
    errors = [np.linalg.norm(got - want) / np.linalg.norm(want) for want, got in zip(f32, unscaled)
              if np.abs(want).max() > 0]
    assert max(errors) > 0.5


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_injected_inf_skips_exactly_that_step_and_names_the_variable(runs, style):
    results, stderrs = runs
    result = results["amp"][style]
    before, after = result["around_inject"]
    for old, new in zip(before, after):
        np.testing.assert_array_equal(np.asarray(new), np.asarray(old))
    assert result["state"] == {"scale": 16384.0, "skipped": 1, "good": STEPS - 1 - INJECT_STEP}
    group = "k3" if style in KERAS3 else "tfk"
    lines = [line for line in stderrs["amp"][group].splitlines() if "step skipped" in line]
    styles = KERAS3 if group == "k3" else TF_KERAS
    assert lines and all(line.endswith(SKIP_LINE + " AMP_REWRITE_FIND_OVERFLOW=1 names the first op "
                                       "whose output was not finite.") for line in lines), lines
    assert all("amp-rewrite: loss scale 32768:" in line for line in lines)
    # one skip per style (an eager skip also goes through Python logging, maybe to two handlers)
    assert len({line[line.index("amp-rewrite:"):] for line in lines}) == 1
    assert len(lines) >= len(styles)


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_checkpoints_restore_both_ways(runs, style):
    results, _ = runs
    state_key = "optimizer/amp_loss_scale/scale/.ATTRIBUTES/VARIABLE_VALUE"
    f32, amp = results["f32"][style]["checkpoint"], results["amp"][style]["checkpoint"]
    assert state_key not in f32["keys"] and state_key in amp["keys"]
    assert amp["saved_scale"] == 16384.0
    assert set(amp["keys"]) - set(f32["keys"]) == {
        f"optimizer/amp_loss_scale/{name}/.ATTRIBUTES/VARIABLE_VALUE"
        for name in ("scale", "good_steps", "skipped_steps")}
    into_amp = amp["restored_other"]  # the float32 checkpoint, under the runtime
    assert into_amp["weights_match"] and into_amp["loss_finite"]
    assert into_amp["iterations"] == STEPS + 1
    without = amp["restored_own_without_runtime"]
    assert without["weights_match"] and without["loss_finite"] and without["state"] is None
    assert without["iterations"] == STEPS  # one step was skipped, one taken after the restore


def run_overflow(**extra):
    process = subprocess.run([sys.executable, str(OVERFLOW)], env=clean_env(**extra),
                             capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-4000:]
    losses = [float(line.split()[1]) for line in process.stdout.splitlines() if line.startswith("loss")]
    return losses, [line for line in process.stderr.splitlines() if "amp-rewrite:" in line]


@pytest.mark.slow
def test_find_overflow_names_the_op_that_overflowed():
    losses, _ = run_overflow()
    assert all(np.isfinite(losses))  # float32 is fine: the overflow is float16's
    losses, lines = run_overflow(**FLOAT16, AMP_REWRITE_FIND_OVERFLOW="1")
    assert not any(np.isfinite(losses))
    found = [line for line in lines if "first non-finite half output" in line]
    assert len(found) == 2, lines  # one per step
    assert "output 0 of node 'sequential_1/big_1/MatMul' (op MatMul, float16)" in found[0]
    assert ("keep MatMul in float32 with --deny-add MatMul or "
            "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD=MatMul, "
            "or only this node with --preserve sequential_1/big_1/MatMul") in found[0]
    skipped = [line for line in lines if "step skipped" in line]
    assert len(skipped) == 2 and "sequential/big/kernel" in skipped[0]
    # following the advice
    losses, lines = run_overflow(**FLOAT16, TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD="MatMul")
    assert all(np.isfinite(losses)) and not [line for line in lines if "step skipped" in line]


# --- in this process: what is scaled, what is left alone, what warns ----------


def small_model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])


def batch():
    rng = np.random.default_rng(4)
    return rng.normal(size=(16, 8)).astype(np.float32), rng.normal(size=(16, 4)).astype(np.float32)


def test_hand_written_updates_get_true_gradients_and_one_warning(amp_runtime, caplog):
    import logging

    import tensorflow as tf

    model, (x, y) = small_model(), batch()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    want = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    amp_runtime()

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        for variable, grad in zip(model.trainable_variables, grads):
            variable.assign_sub(0.0 * grad)
        return grads

    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        got = [g.numpy() for g in step()]
        step()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-2 * np.abs(w).max())
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and messages[0].startswith(
        "amp-rewrite: gradients taken in tf.function step are loss-scaled, but no Keras optimizer "
        "applies them there"), messages


def test_only_a_loss_with_respect_to_trainable_variables_is_scaled(amp_runtime):
    import tensorflow as tf

    from amp_rewrite import runtime

    amp_runtime()
    x, weight = tf.constant([[1.0, 2.0]]), tf.Variable([[3.0], [4.0]])
    frozen = tf.Variable([[3.0], [4.0]], trainable=False)
    for sources in ([x], [weight, x], [frozen]):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.matmul(x, weight) + tf.matmul(x, frozen))
        tape.gradient(loss, sources)
        assert not runtime.loss_scaling().has_state()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x, weight))
    np.testing.assert_allclose(tape.gradient(loss, [weight])[0].numpy(), [[1.0], [2.0]])
    assert runtime.loss_scaling().has_state()


def test_tf_keras_loss_scale_optimizer_is_not_scaled_twice(tmp_path):
    script = tmp_path / "tf_keras_lso.py"
    script.write_text(
        "import numpy as np, tensorflow as tf\n"
        "k = tf.keras\n"
        "k.utils.set_random_seed(0)\n"
        "model = k.Sequential([k.Input((8,)), k.layers.Dense(4)])\n"
        "opt = k.mixed_precision.LossScaleOptimizer(k.optimizers.SGD(0.1), dynamic=False, initial_scale=64.0)\n"
        "x = np.random.default_rng(4).normal(size=(16, 8)).astype(np.float32)\n"
        "y = np.random.default_rng(5).normal(size=(16, 4)).astype(np.float32)\n"
        "want = x.T @ (2.0 * (model(x).numpy() - y) / y.size)\n"
        "with tf.GradientTape() as tape:\n"
        "    scaled = opt.get_scaled_loss(tf.reduce_mean(tf.square(model(x) - y)))\n"
        "grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))\n"
        "before = model.trainable_variables[0].numpy()\n"
        "opt.apply_gradients(zip(grads, model.trainable_variables))\n"
        "change = model.trainable_variables[0].numpy() - before\n"
        "np.testing.assert_allclose(grads[0].numpy(), want, rtol=1e-4, atol=1e-6)\n"
        "np.testing.assert_allclose(change, -0.1 * want, rtol=1e-4, atol=1e-7)\n"
        "from amp_rewrite import runtime\n"
        "assert runtime.loss_scaling() is not None and not runtime.loss_scaling().has_state()\n"
        "print('ok')\n")
    process = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                             env=clean_env(**FLOAT16, TF_USE_LEGACY_KERAS="1"))
    assert process.returncode == 0 and process.stdout.strip() == "ok", process.stderr[-3000:]


def test_an_xla_compiled_step_skips_too(amp_runtime):
    """XLA cannot print or handle strings: the skip happens and is counted, without its line."""
    import keras
    import tensorflow as tf

    from amp_rewrite import runtime

    amp_runtime()
    model, (x, y) = small_model(), batch()
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function(jit_compile=True)
    def step(factor):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y)) * factor
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    step(tf.constant(1.0))
    before = [v.numpy() for v in model.trainable_variables]
    step(tf.constant(np.inf))
    for old, variable in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(variable.numpy(), old)
    state = runtime.loss_scaling().state()
    assert int(state.skipped_steps.numpy()) == 1 and float(state.scale.numpy()) == 16384.0
    assert int(optimizer.iterations.numpy()) == 1


def test_a_failing_guard_warns_and_applies_unguarded(amp_runtime, monkeypatch, caplog):
    import logging

    import keras
    import tensorflow as tf

    from amp_rewrite import runtime
    from amp_rewrite.runtime.loss_scale import tf2_guarded_apply
    from amp_rewrite.runtime.settings import RuntimeSettings

    def broken(grads):
        raise ValueError("no flags today")

    monkeypatch.setattr(tf2_guarded_apply, "nonfinite_flags", broken)
    model, (x, y) = small_model(), batch()
    for is_strict in (False, True):
        runtime.disable()
        amp_runtime(RuntimeSettings(is_strict=is_strict, target="float16"))
        optimizer = keras.optimizers.SGD(0.1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        before = model.trainable_variables[0].numpy()
        if is_strict:
            with pytest.raises(ValueError, match="no flags today"):
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
            continue
        with caplog.at_level(logging.WARNING, "amp_rewrite"):
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        np.testing.assert_allclose(model.trainable_variables[0].numpy() - before,
                                   -0.1 * grads[0].numpy(), rtol=1e-5, atol=1e-7)
        assert [r.getMessage() for r in caplog.records] == [
            "amp-rewrite: SGD applies without skipping non-finite steps: the loss-scale guard "
            "failed: ValueError: no flags today"]


@pytest.mark.parametrize("is_eager", [False, True])
def test_a_repeated_skip_is_said_once_then_counted_every_log_steps(amp_runtime, capfd, caplog, is_eager):
    """A NaN loss skips every step: the line is said per scale, then counted at the floor."""
    import logging

    import keras
    import tensorflow as tf

    from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

    amp_runtime(RuntimeSettings(target="float16", loss_scale=LossScaleSettings(initial_scale=4.0, log_every=3)))
    model, (x, y) = small_model(), batch()
    optimizer = keras.optimizers.SGD(0.1)

    def step(kernel_factor, bias_factor):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        kernel, bias = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip([kernel * kernel_factor, bias * bias_factor], model.trainable_variables))

    run = step if is_eager else tf.function(step)
    inf, one = tf.constant(np.inf), tf.constant(1.0)
    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        for kernel_factor, bias_factor in [(inf, inf)] * 9 + [(inf, one), (one, one), (inf, one)]:
            run(kernel_factor, bias_factor)
    said = [r.getMessage() for r in caplog.records] if is_eager else capfd.readouterr().err.splitlines()
    said = [line[line.index("amp-rewrite:"):] for line in said if "amp-rewrite: loss scale" in line]
    kernel, bias = (v.path for v in model.trainable_variables)
    hint = " AMP_REWRITE_FIND_OVERFLOW=1 names the first op whose output was not finite."
    both = f"step skipped, gradients not finite for 2 of 2 variables: {kernel}, {bias}.{hint}"
    assert said == [
        f"amp-rewrite: loss scale 4: {both}",
        f"amp-rewrite: loss scale 2: {both}",
        f"amp-rewrite: loss scale 1: {both}",
        "amp-rewrite: loss scale 1: 3 more steps skipped for the same variables as the last skip line; "
        "6 skipped in all.",
        "amp-rewrite: loss scale 1: 6 more steps skipped for the same variables as the last skip line; "
        "9 skipped in all.",
        f"amp-rewrite: loss scale 1: step skipped, gradients not finite for 1 of 2 variables: {kernel}.{hint}",
    ]
    assert int(optimizer.iterations.numpy()) == 1  # the one finite step
