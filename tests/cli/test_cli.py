"""The command line, end to end in a subprocess (exit codes, stdout and stderr as a shell sees them)."""

import importlib.metadata
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from helpers import F16, REPO, assert_one_line_error, assert_same_outputs_within_half, half_nodes, our_lines, tf1
from runners import run_cli, run_cli_subprocess

EXAMPLE = REPO / "tools" / "example" / "mlp.pb"


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32) * 0.3, name="w")
        h = tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu")
        tf.identity(tf.matmul(h, w, name="mm2"), name="logits")
    path = tmp_path_factory.mktemp("graphs") / "model.pb"
    path.write_bytes(g.as_graph_def().SerializeToString())
    return path


def test_rewrites_binary_graph_and_prints_one_summary_line(graph_file, tmp_path):
    out = tmp_path / "out.pb"
    report = tmp_path / "report.json"
    proc = run_cli_subprocess(graph_file, out, "--fetch", "logits", "--device-type", "CPU", "--report", report,
                              cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "converted 4/6 nodes to float16, 2 casts, 100.0% of MatMul/Conv FLOPs in float16"]
    gd = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert {"mm", "relu", "mm2"} <= half_nodes(gd)
    data = json.loads(report.read_text())
    assert data["target"] == "float16" and data["nodes_total"] == 6
    assert data["converted"] == ["w", "mm", "relu", "mm2"]
    assert len(data["casts"]) == 2 and data["fp16_flop_share"] == 1.0
    assert data["nodes"]["relu"]["colour"] == "allow"
    feeds = {"x": np.ones((4, 8), np.float32)}
    original = tf.compat.v1.GraphDef.FromString(graph_file.read_bytes())
    assert_same_outputs_within_half(original, gd, ["logits"], feeds, rtol=5e-2, atol=5e-2)


def test_text_in_text_out_with_bfloat16(graph_file, tmp_path):
    src = tmp_path / "model.pbtxt"
    src.write_text(text_format.MessageToString(tf.compat.v1.GraphDef.FromString(graph_file.read_bytes())))
    out = tmp_path / "out.pbtxt"
    proc = run_cli_subprocess(src, out, "--target", "bfloat16", "--device-type", "CPU", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    gd = text_format.Parse(out.read_text(), tf.compat.v1.GraphDef())
    assert next(n for n in gd.node if n.name == "mm").attr["T"].type == tf.bfloat16.as_datatype_enum


def test_same_input_gives_byte_identical_output(graph_file, tmp_path):
    a, b = tmp_path / "a.pb", tmp_path / "b.pb"
    assert run_cli_subprocess(graph_file, a, "-q", cwd=tmp_path).returncode == 0
    assert run_cli_subprocess(graph_file, b, "-q", cwd=tmp_path).returncode == 0
    assert a.read_bytes() == b.read_bytes()
    c = tmp_path / "c.pb"
    assert run_cli_subprocess(a, c, "-q", cwd=tmp_path).returncode == 0
    assert c.read_bytes() == a.read_bytes()  # idempotent


def test_list_flags_apply_after_environment(graph_file, tmp_path):
    env = {"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_REMOVE": "MatMul"}
    proc = run_cli_subprocess(graph_file, tmp_path / "o.pb", "--device-type", "CPU", cwd=tmp_path, env=env)
    assert proc.stdout.startswith("converted 0/6")
    proc = run_cli_subprocess(graph_file, tmp_path / "o.pb", "--device-type", "CPU", "--allow-add", "MatMul",
                              cwd=tmp_path, env=env)
    assert proc.stdout.startswith("converted 4/6"), proc.stdout + proc.stderr


@pytest.mark.parametrize("args,code,message", [
    (["missing.pb", "out.pb"], 1, "missing.pb: no such file"),
    (["GRAPH", "out.pb", "--fetch", "nope"], 1, "fetch 'nope' names no node"),
    (["GRAPH", "out.pb", "--allow-add", "Tanh"], 1,
     "op Tanh is in both the allow list (--allow-add) and the infer list"),
    (["GRAPH", "GRAPH"], 2, "pass --in-place"),
    (["GRAPH", "out.pb", "--level", "FAST"], 2, "invalid choice"),
    (["GRAPH"], 2, "required"),
])
def test_errors_are_one_line_with_exit_code_and_no_output(graph_file, tmp_path, args, code, message):
    args = [str(graph_file) if a == "GRAPH" else a for a in args]
    proc = run_cli_subprocess(*args, cwd=tmp_path)
    assert proc.returncode == code
    assert message in proc.stderr
    assert not (tmp_path / "out.pb").exists()
    if code == 1:
        assert_one_line_error(proc.stderr, message)


def test_bundled_example_rewrites(tmp_path):
    proc = run_cli_subprocess(EXAMPLE, tmp_path / "mlp_amp.pb", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("converted ")
    gd = tf.compat.v1.GraphDef.FromString((tmp_path / "mlp_amp.pb").read_bytes())
    assert any(n.op == "MatMul" and n.attr["T"].type == F16 for n in gd.node)


@pytest.mark.parametrize("args", [
    ["--version"],
    ["explain", "--version"],
    ["GRAPH", "--version"],  # beside a positional, before the missing OUT is an error
    ["--version", "GRAPH", "out.pb", "--target", "nope"],
])
def test_version_flag_prints_the_installed_version_and_exits_0(graph_file, tmp_path, args):
    args = [str(graph_file) if a == "GRAPH" else a for a in args]
    proc = run_cli_subprocess(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"amp-rewrite {importlib.metadata.version('amp-rewrite')}\n"
    assert re.fullmatch(r"amp-rewrite \d+\.\d+\.\d+\n", proc.stdout)
    assert not (tmp_path / "out.pb").exists()


def test_console_script_prints_the_version(tmp_path):
    proc = run_cli_subprocess("--version", cwd=tmp_path, is_console_script=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"amp-rewrite {importlib.metadata.version('amp-rewrite')}\n"


def test_package_version_is_the_installed_distributions():
    import amp_rewrite

    assert amp_rewrite.__version__ == importlib.metadata.version("amp-rewrite")
    assert re.fullmatch(r"\d+\.\d+\.\d+", amp_rewrite.__version__)


def test_a_checkout_imported_without_installing_reports_an_unknown_version(monkeypatch):
    import amp_rewrite
    from amp_rewrite.tune.cache import package_version

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    package_version.cache_clear()
    try:
        assert amp_rewrite.__version__ == "0+unknown"
    finally:
        package_version.cache_clear()


def test_outputs_get_the_usual_file_mode(graph_file, tmp_path):
    out, report = tmp_path / "out.pb", tmp_path / "r.json"
    old = os.umask(0o022)
    try:
        assert run_cli_subprocess(graph_file, out, "--report", report, "-q", cwd=tmp_path).returncode == 0
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o644
    assert report.stat().st_mode & 0o777 == 0o644


# What TensorFlow 2.21 writes to file descriptor 2 while it loads on some CPUs,
# whatever TF_CPP_MIN_LOG_LEVEL says.
BANNER = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1700000000.000000    1234 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders.\n"
    "I0000 00:00:1700000000.000001    1234 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.\n"
)

# Run at interpreter start-up: while the tensorflow package executes, BANNER
# goes to descriptor 2 from below Python, as TensorFlow's C++ logging does.
SITECUSTOMIZE = '''
import os, sys


class _BannerLoader:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        os.write(2, os.environ["FAKE_TF_BANNER"].encode())
        self.loader.exec_module(module)


class _Banner:
    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                spec.loader = _BannerLoader(spec.loader)
                return spec
        return None


sys.meta_path.insert(0, _Banner())
'''


@pytest.fixture
def banner_env(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "FAKE_TF_BANNER": BANNER}


def load_tensorflow_with(tmp_path, code: str) -> None:
    """Makes the fake ``banner_env`` run ``code`` where it wrote the banner, while TensorFlow loads."""
    hook = tmp_path / "site" / "sitecustomize.py"
    hook.write_text(hook.read_text().replace('os.write(2, os.environ["FAKE_TF_BANNER"].encode())', code))


def test_tensorflow_banner_is_hidden_from_a_rewrite(graph_file, tmp_path, banner_env):
    proc = run_cli_subprocess(graph_file, tmp_path / "out.pb", "--device-type", "CPU", cwd=tmp_path, env=banner_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "converted 4/6 nodes to float16, 2 casts, 100.0% of MatMul/Conv FLOPs in float16"]
    assert "absl::InitializeLog" not in proc.stderr and "cpu_feature_guard" not in proc.stderr, proc.stderr
    assert our_lines(proc.stderr) == []


@pytest.mark.parametrize("args,message", [
    (["missing.pb", "out.pb"], "missing.pb: no such file"),
    (["GRAPH", "out.pb", "--fetch", "nope"], "fetch 'nope' names no node"),
    (["explain", "GRAPH", "ghost"], "no node named 'ghost'"),
])
def test_errors_stay_one_line_under_a_tensorflow_banner(graph_file, tmp_path, banner_env, args, message):
    args = [str(graph_file) if a == "GRAPH" else a for a in args]
    proc = run_cli_subprocess(*args, cwd=tmp_path, env=banner_env)
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr, message)
    assert "absl::InitializeLog" not in proc.stderr, proc.stderr


def test_verbose_lets_tensorflow_banner_through(graph_file, tmp_path, banner_env):
    proc = run_cli_subprocess(graph_file, tmp_path / "out.pb", "-v", cwd=tmp_path, env=banner_env)
    assert proc.returncode == 0, proc.stderr
    assert BANNER in proc.stderr  # the fake banner really ran: the tests above would see it unhidden
    assert any(line.startswith("amp-rewrite: INFO: converted 4/6") for line in our_lines(proc.stderr))


def test_python_warnings_still_reach_the_user_while_tensorflow_loads(graph_file, tmp_path, banner_env):
    load_tensorflow_with(tmp_path, 'os.write(2, os.environ["FAKE_TF_BANNER"].encode()); '
                                   'import warnings; warnings.warn("a user-visible warning", UserWarning)')
    proc = run_cli_subprocess(graph_file, tmp_path / "out.pb", "-q", cwd=tmp_path, env=banner_env)
    assert proc.returncode == 0, proc.stderr
    assert "UserWarning: a user-visible warning" in proc.stderr
    assert "absl::InitializeLog" not in proc.stderr


def test_a_failing_tensorflow_import_shows_what_tensorflow_wrote(graph_file, tmp_path, banner_env):
    load_tensorflow_with(tmp_path, 'os.write(2, b"F0000 loader.cc:1] Check failed: a broken TensorFlow install\\n"); '
                                   'raise RuntimeError("TensorFlow failed to load")')
    proc = run_cli_subprocess(graph_file, tmp_path / "out.pb", cwd=tmp_path, env=banner_env)
    assert proc.returncode != 0
    assert "Check failed: a broken TensorFlow install" in proc.stderr  # passed on, not dropped
    assert "RuntimeError: TensorFlow failed to load" in proc.stderr
    assert not (tmp_path / "out.pb").exists()


RULE_LINE = re.compile(r"^amp-rewrite: DEBUG: (\w+): \+allow (\d+), \+deny (\d+), unmarked (\d+)$")


def test_verbose_levels_log_each_rule_then_each_decision_as_explain_words_it(graph_file, tmp_path):
    from amp_rewrite.paint.rules import RULES

    common = [graph_file, tmp_path / "out.pb", "--fetch", "logits", "--device-type", "CPU"]
    info = run_cli_subprocess(*common, "-v", cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert any(line.startswith("amp-rewrite: INFO: converted 4/6") for line in our_lines(info.stderr))
    assert not [line for line in info.stderr.splitlines() if line.startswith("amp-rewrite: DEBUG: ")]
    debug = run_cli_subprocess(*common, "-vv", cwd=tmp_path)
    assert debug.returncode == 0, debug.stderr
    lines = debug.stderr.splitlines()
    changed = [RULE_LINE.match(line).groups() for line in lines if RULE_LINE.match(line)]
    assert [name for name, *_ in changed] == [rule.__name__ for rule in RULES]
    counts = {name: tuple(map(int, numbers)) for name, *numbers in changed}
    assert counts["paint_allow_ops"] == (2, 0, 0)  # mm and mm2
    assert counts["paint_between_allow"] == (1, 0, 0)  # relu, between them
    explained = run_cli_subprocess("explain", graph_file, "relu", "--fetch", "logits", "--device-type", "CPU",
                                   cwd=tmp_path)
    assert explained.returncode == 0, explained.stderr
    sentence = explained.stdout.splitlines()[0]
    assert sentence.startswith("relu (Relu) → float16: between allow ops")
    assert f"amp-rewrite: DEBUG: {sentence}" in lines


def test_an_unexpected_failure_in_a_painting_rule_is_one_line_naming_the_rule(graph_file, tmp_path, monkeypatch):
    from amp_rewrite.paint.context import PaintContext

    def broken(self, vid):
        raise ValueError("boom")

    monkeypatch.setattr(PaintContext, "can_convert", broken)
    proc = run_cli(graph_file, tmp_path / "out.pb", "--device-type", "CPU", cwd=tmp_path)  # in-process, patched
    assert proc.returncode == 1
    line = assert_one_line_error(proc.stderr, "painting rule paint_allow_ops failed (after "
                                 "find_tensor_list_clusters, deny_escaping_tensor_lists): ValueError: boom")
    assert line.endswith("(unexpected; run with -v for details)")
    assert not (tmp_path / "out.pb").exists()
