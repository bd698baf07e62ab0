"""``amp-rewrite cache``: this machine's tuning cache listed in words, and removed with ``--clear``."""

import pytest
import tensorflow as tf
from runners import run_cli

import amp_rewrite
from amp_rewrite.tune.cache import Timing, TuneCache, cache_here

STEP = "step " + "a" * 32
SESSION = "step " + "b" * 32


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("AMP_REWRITE_TUNE_CACHE", str(directory))
    return directory


def fill(directory):
    """This machine's cache (two verdicts, the first with a profile, two regions and a mixed body's trial), a GPU's
    cache, and a file no run reads."""
    here = cache_here(directory, "CPU")
    here.put(STEP, Timing(float32=0.010, half=0.005, what="tf.function train_step, bfloat16"))
    here.put(STEP + " profile", Timing(float32=0.009, half=0.004))
    here.put(STEP + " region 1f.0", Timing(float32=0.002, half=0.001))
    here.put(STEP + " region 2e.0", Timing(float32=0.001, half=0.003))
    here.put(STEP + " mixed", Timing(float32=0.005, half=0.004))
    here.put(SESSION, Timing(float32=0.373, half=0.449, what="session step (fetches train_op, loss), bfloat16"))
    here.save()
    gpu = TuneCache(directory, device="GPU Imaginary 80GB", tensorflow="2.21.0")
    gpu.put(STEP, Timing(float32=0.002, half=0.001, what="tf.function train_step, float16"))
    gpu.save()
    (directory / "tune-0000000000000000.json").write_text("{ not json")
    return here.path, gpu.path


def test_the_listing_names_each_file_its_device_versions_and_verdicts(cache_dir, tmp_path):
    here, gpu = fill(cache_dir)
    done = run_cli("cache", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    cached = cache_here(cache_dir, "CPU")
    assert done.stdout.splitlines() == [
        f"{cache_dir / 'tune-0000000000000000.json'}: not JSON (no run reads it)",
        "",
        f"{here} (read and written here)",
        f"  device: {cached.device}",
        f"  TensorFlow {tf.__version__}, amp-rewrite {amp_rewrite.__version__}",
        "  2 verdicts:",
        "    session step (fetches train_op, loss), bfloat16: stays float32: 449 ms in half, 373 ms in float32 "
        "[step bbbbbbbbbb]",
        "    tf.function train_step, bfloat16: runs in half: 5.0 ms in half, 10.0 ms in float32 (2.00x) "
        "[step aaaaaaaaaa]",
        "      a mixed body: 4.0 ms against 5.0 ms for the better pure one, kept",
        "      profiled: 2 half regions timed",
        "",
        f"1 more file of other devices in {cache_dir} (--all lists them)",
    ]
    every = run_cli("cache", "--all", cwd=tmp_path)
    assert every.returncode == 0 and f"{gpu} (another device's)" in every.stdout.splitlines()
    assert "  device: GPU Imaginary 80GB" in every.stdout.splitlines()


def test_clear_removes_this_machines_files_and_all_every_file(cache_dir, tmp_path):
    here, gpu = fill(cache_dir)
    done = run_cli("cache", "--clear", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"removed 2 tuning cache files from {cache_dir}\n"
    assert not here.exists() and gpu.exists() and list(cache_dir.iterdir()) == [gpu]
    cleared = run_cli("cache", "--clear", "--all", cwd=tmp_path)
    assert cleared.stdout == f"removed 1 tuning cache file from {cache_dir}\n"
    assert not list(cache_dir.iterdir())
    assert run_cli("cache", cwd=tmp_path).stdout == f"no tuning cache of this machine in {cache_dir}\n"


def test_a_cache_directory_that_does_not_exist_lists_nothing(cache_dir, tmp_path):
    done = run_cli("cache", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, f"no tuning cache of this machine in {cache_dir}\n")
    assert run_cli("cache", "--clear", cwd=tmp_path).stdout == f"removed 0 tuning cache files from {cache_dir}\n"
