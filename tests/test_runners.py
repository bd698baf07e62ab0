"""The suite's runners: the command in-process and in a subprocess, and the subprocesses' environment."""

import importlib.metadata
import logging
import os
import sys

import tensorflow as tf
from helpers import our_lines, tf1
from runners import FIXED_SETTINGS, amp_variables, clean_env, run_cli, run_cli_subprocess

from amp_rewrite import environment

VERSION_LINE = f"amp-rewrite {importlib.metadata.version('amp-rewrite')}\n"


def graph_file(tmp_path):
    """x → mm (MatMul) → out, written to ``tmp_path / "in.pb"``."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        tf.identity(tf.matmul(x, x, name="mm"), name="out")
    path = tmp_path / "in.pb"
    path.write_bytes(g.as_graph_def().SerializeToString())
    return path


def test_clean_env_drops_every_variable_amp_rewrite_or_tensorflows_amp_reads(monkeypatch):
    dropped = {*environment.NAMES, environment.LEVEL_ENV, environment.DENYLIST_ADD_ENV,
               "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING",  # NVIDIA's builds read it
               "TF_USE_LEGACY_KERAS"}
    for name in dropped:
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("AMP_RUNNERS_UNRELATED", "kept")
    env = clean_env()
    assert not (dropped - FIXED_SETTINGS.keys()) & env.keys()  # the fixed ones come back with their values
    assert amp_variables(os.environ) == sorted(dropped - {"TF_USE_LEGACY_KERAS"})
    assert env["AMP_RUNNERS_UNRELATED"] == "kept" and env["PATH"] == os.environ["PATH"]
    assert FIXED_SETTINGS.items() <= env.items()


def test_clean_env_takes_extra_variables_last():
    env = clean_env(ENABLE_AUTO_MP="1", TF_CPP_MIN_LOG_LEVEL="0", TF_USE_LEGACY_KERAS="1")
    assert (env["ENABLE_AUTO_MP"], env["TF_CPP_MIN_LOG_LEVEL"], env["TF_USE_LEGACY_KERAS"]) == ("1", "0", "1")


def test_in_process_run_gives_exit_code_and_output_and_leaves_the_process_as_it_was(tmp_path, caplog):
    root = logging.getLogger()
    before = (os.getcwd(), sys.stdout, sys.stderr, root.handlers[:], root.level)
    with caplog.at_level(logging.WARNING):
        done = run_cli("explain", tmp_path / "missing.pb", "relu", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert our_lines(done.stderr) == [f"amp-rewrite: error: {tmp_path / 'missing.pb'}: no such file"]
    assert (os.getcwd(), sys.stdout, sys.stderr, root.handlers, root.level) == before


def test_in_process_run_shows_log_records_as_the_command_prints_them_and_caplog_sees_them(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):  # a misspelling of its own: the package warns once per process
        done = run_cli(graph_file(tmp_path), tmp_path / "out.pb", "-q", "--deny-add", "MattMul", "--device-type",
                       "CPU", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    message = "--deny-add: MattMul is not an op this TensorFlow registers (did you mean MatMul?)"
    assert our_lines(done.stderr) == [f"amp-rewrite: WARNING: {message}"]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("amp_rewrite")] == [message]


def test_in_process_run_with_verbose_shows_info_lines(tmp_path):
    done = run_cli(graph_file(tmp_path), tmp_path / "out.pb", "-v", "--device-type", "CPU", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("amp-rewrite: INFO: converted ") for line in our_lines(done.stderr)), done.stderr


def test_in_process_run_turns_argparse_exits_into_exit_codes(tmp_path):
    version = run_cli("--version", cwd=tmp_path)
    assert (version.returncode, version.stdout) == (0, VERSION_LINE)
    usage = run_cli("in.pb", "out.pb", "--level", "FAST", cwd=tmp_path)
    assert usage.returncode == 2 and "invalid choice: 'FAST'" in usage.stderr


def test_in_process_run_resolves_relative_paths_in_cwd(tmp_path):
    done = run_cli("missing.pb", "out.pb", cwd=tmp_path)
    assert done.returncode == 1
    assert our_lines(done.stderr) == ["amp-rewrite: error: missing.pb: no such file"]


def test_subprocess_run_gets_a_clean_environment_and_the_given_variables(tmp_path, monkeypatch):
    monkeypatch.setenv(environment.LEVEL_ENV, "garbage")  # refuses any rewrite that inherits it (exit 2)
    done = run_cli_subprocess("missing.pb", "out.pb", cwd=tmp_path)
    assert done.returncode == 1
    assert our_lines(done.stderr) == ["amp-rewrite: error: missing.pb: no such file"], done.stderr
    done = run_cli_subprocess("missing.pb", "out.pb", cwd=tmp_path, env={environment.LEVEL_ENV: "garbage"})
    assert done.returncode == 2
    [line] = our_lines(done.stderr)
    assert line.startswith(f"amp-rewrite: error: {environment.LEVEL_ENV}='garbage': choose one of "), done.stderr
