"""Tutorial-style TF1 scripts under ENABLE_AUTO_MP: initialiser first, models that grow.

Each script runs in a subprocess in float32, and with ``ENABLE_AUTO_MP=1`` for
float16, bfloat16 and the machine's own choice (``auto``).
"""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from fixtures.harness import Script, run_scripts

tf1 = tf.compat.v1
HALF = {"float16": tf.float16.as_datatype_enum, "bfloat16": tf.bfloat16.as_datatype_enum}
TARGETS = ("float16", "bfloat16", "auto")


def tutorial(order, root, target=None):
    """The script run in float32 (``target`` None) or under the runtime with ``target``."""
    name = f"{order}_{target or 'fp32'}"
    env = {}
    if target is not None:
        env = {"AMP_REWRITE_TARGET": target, "AMP_REWRITE_DUMP_DIR": str(root / name)}
    return Script("train_tutorial.py", ["--order", order, "--steps", 20], root / f"{name}.json",
                  amp=target is not None, env=env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tutorials")
    scripts = {(order, target): tutorial(order, root, target)
               for order in ("init-first", "grow") for target in (None, *TARGETS)
               if not (order == "grow" and target == "auto")}
    run_scripts(*scripts.values())
    for script in scripts.values():
        script.check()
    return scripts, root


def last_rewrite(directory: Path):
    """The largest rewritten graph dumped: the one of the grown model."""
    graphs = []
    for path in directory.glob("*_after.pb"):
        graph_def = tf1.GraphDef()
        graph_def.ParseFromString(path.read_bytes())
        graphs.append(graph_def)
    assert graphs, f"nothing dumped in {directory}"
    return max(graphs, key=lambda g: len(g.node))


def matmul_types(graph_def):
    return {node.name: node.attr["T"].type for node in graph_def.node if node.op == "MatMul"}


@pytest.mark.parametrize("order", ["init-first", "grow"])
@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_model_built_after_the_first_run_computes_in_half(runs, order, target):
    scripts, root = runs
    types = matmul_types(last_rewrite(root / f"{order}_{target}"))
    # init-first: the two forward MatMuls and their four gradients, all built after the first run.
    # grow: the second layer and head (and their gradients) were added after training began.
    assert len(types) >= (6 if order == "init-first" else 12)
    assert set(types.values()) == {HALF[target]}, types
    stderr = scripts[(order, target)].stderr
    assert "rewrote again" in stderr and f"to {target}" in stderr
    assert "running the float32 graph" not in stderr


@pytest.mark.parametrize("order, target", [
    ("init-first", "float16"), ("init-first", "bfloat16"), ("init-first", "auto"),
    ("grow", "float16"), ("grow", "bfloat16"),
])
def test_tutorial_scripts_train_like_float32(runs, order, target):
    scripts, _ = runs
    fp32, amp = scripts[(order, None)].result, scripts[(order, target)].result
    assert amp["session_run_patched"] or target == "auto"
    assert amp["fetched_dtypes"] == fp32["fetched_dtypes"]
    assert set(amp["fetched_dtypes"].values()) == {"float32"}
    tolerance = 3e-2 if target == "bfloat16" else 1e-2
    for key in ("losses", "losses2"):
        if key in fp32:
            np.testing.assert_allclose(amp[key], fp32[key], rtol=tolerance, atol=1e-3)
            assert amp[key][-1] < 0.7 * amp[key][0]
    assert abs(amp["accuracy"] - fp32["accuracy"]) <= 0.02
    assert amp["accuracy"] > 0.8


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_growing_keeps_the_trained_values(runs, target):
    scripts, _ = runs
    result = scripts[("grow", target)].result
    assert result["kept"] and result["w1_dtype"] == "float32"
    # The second phase starts from the first phase's trained model, not from scratch.
    assert result["losses2"][0] < result["losses"][0]


def test_auto_logs_its_choice_once(runs):
    scripts, _ = runs
    lines = [line for line in scripts[("init-first", "auto")].stderr.splitlines()
             if "amp-rewrite:" in line]
    if "scripts run in float32" in "\n".join(lines):
        assert len(lines) == 1 and "AVX512_BF16" in lines[0]
    else:
        assert all("no GPU; the CPU has" in line or "GPU(s)" in line for line in lines)
    for key in [("init-first", "float16"), ("grow", "bfloat16")]:
        rewrites = [line for line in scripts[key].stderr.splitlines() if "converted" in line]
        assert len(rewrites) == len(set(rewrites)) == 2, rewrites
