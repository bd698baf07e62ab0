"""Loss scaling under tf.distribute: every replica and worker takes the same skip decision."""

import json

import numpy as np
import pytest
from fixtures.harness import Script, free_ports, run_scripts


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    """Two logical CPUs; at step 3 only replica 1's loss is infinite."""
    root = tmp_path_factory.mktemp("mirrored")
    args = ["--steps", 6, "--optimizer", "momentum", "--inject-inf", 3]
    runs = run_scripts(Script("train_mirrored.py", args, root / "fp32.json"),
                       Script("train_mirrored.py", args, root / "amp.json", amp=True))
    return [run.check().result for run in runs]


def test_mirrored_replicas_skip_together_and_stay_in_sync(mirrored):
    fp32, amp = mirrored
    assert amp["steps"] == [1, 2, 3, 3, 4, 5]
    assert all(amp["w1_replicas_equal"])
    assert amp["loss_scale"] == [2.0 ** 14]
    losses = np.array(amp["losses"])
    # Replica 0 saw a finite loss at step 3, yet its weights did not move either.
    assert losses[4, 0] == losses[3, 0]
    assert np.all(np.isfinite(losses[4:]))
    assert np.isnan(fp32["losses"][4][0])  # without the guard one bad replica ruins both


def test_mirrored_amp_tracks_float32_before_the_skip(mirrored):
    fp32, amp = mirrored
    np.testing.assert_allclose(np.array(amp["losses"])[:3], np.array(fp32["losses"])[:3],
                               rtol=2e-2)
    assert fp32["steps"][:3] == [1, 2, 3]


@pytest.mark.slow
def test_multi_worker_workers_skip_together(tmp_path):
    """Two worker processes on loopback; at step 3 only worker 1's loss is infinite."""
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    args = ["--steps", 6, "--optimizer", "momentum", "--inject-inf", 3]
    workers = [
        Script("train_multiworker.py", args, tmp_path / f"worker{i}.json", amp=True,
               env={"TF_CONFIG": json.dumps({"cluster": cluster,
                                             "task": {"type": "worker", "index": i}})})
        for i in range(2)
    ]
    run_scripts(*workers, parallel=2, timeout=180)  # a diverging decision would hang here
    first, second = (worker.check().result for worker in workers)
    for result in (first, second):
        assert result["steps"] == [1, 2, 3, 3, 4, 5]
        assert result["session_run_patched"] is True
    assert first["w1_sums"] == second["w1_sums"]  # still the same weights everywhere
    assert first["losses"][3] == first["losses"][4]  # worker 0's finite step was skipped too
    assert np.isinf(second["losses"][3])
    for worker in workers:
        assert "step skipped, gradients not finite; loss scale now 16384" in worker.stderr
