"""``tools/benchmarks/bench_gpu.py --smoke``: the GPU benchmark runs end to end on this CPU, tiny and in float16."""

import json
import subprocess
import sys

import pytest
from helpers import REPO
from runners import clean_env

BENCH = REPO / "tools" / "benchmarks" / "bench_gpu.py"


@pytest.mark.slow
def test_smoke_run_writes_every_cell_and_the_decisions(tmp_path):
    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, str(BENCH), str(out), "--smoke", "--workloads", "transformer", "--modes",
                           "float32", "amp", "--rounds", "1", "--budget-s", "600"], env=clean_env(),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "bench_gpu.json").read_text())
    assert [(r["mode"], r["round"]) for r in result["runs"]] == [("amp", 0), ("float32", 1), ("amp", 1)]
    cells = result["cells"]["transformer"]
    assert set(cells) == {"float32", "amp"} and all("failed" not in c for c in cells.values()), cells
    assert all(c["wall_ms"] > 0 and c["kernel_ms"] > 0 for c in cells.values())
    # float16 was forced, and the step decided; the timed process read the warm-up process's decision
    assert "session step (fetches train_op, loss)" in " ".join(result["runs"][0]["amp_rewrite"])
    assert "read from the cache" in " ".join(result["runs"][2]["amp_rewrite"])
    assert cells["amp"]["decision"] != "—"
    table = (out / "bench_gpu.md").read_text()
    assert "| transformer | `ENABLE_AUTO_MP=1` |" in table and "float32 (TF32 off, or no GPU)" in table


@pytest.mark.slow
def test_a_keras_model_is_timed_only_once_no_step_is_on_trial(tmp_path):
    """Without a warm-up process the amp process decides itself: its timed steps begin after the verdict."""
    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, str(BENCH), str(out), "--smoke", "--workloads", "lstm", "--modes", "amp",
                           "--rounds", "1", "--no-warmup-process", "--budget-s", "600"], env=clean_env(),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = json.loads((out / "bench_gpu.json").read_text())["runs"]
    assert run["decision"] != "—" and "read from the cache" not in " ".join(run["amp_rewrite"]), run["amp_rewrite"]
    assert run["on_trial_when_timed"] == [] and run["untimed_steps"] >= run["warmup"], run
    assert len(run["losses"]) == 3 and run["wall_ms"] > 0
