"""Nodes kept float32 by name pattern: Config, the CLI flag and the runtime variable."""


import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    F16,
    F32,
    amp,
    assert_one_line_error,
    assert_same_outputs_within_half,
    function_call_graph,
    mlp_session_graph,
    our_lines,
    rng,
    runner_of,
    tf1,
)
from runners import run_cli

from amp_rewrite import Config
from amp_rewrite.errors import UsageError
from amp_rewrite.paint.keep_patterns import split_env
from amp_rewrite.runtime.settings import KEEP_FLOAT32_ENV, RuntimeSettings

X = rng(3).normal(size=(4, 8)).astype(np.float32)


def two_layer_graph():
    """x → body/mm → body/relu → head/mm → head/relu → out; every op half by default."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(rng(0).normal(scale=0.3, size=(8, 8)).astype(np.float32), name="w")
        with tf.name_scope("body"):
            h = tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu")
        with tf.name_scope("head"):
            h = tf.nn.relu(tf.matmul(h, w, name="mm"), name="relu")
        tf.identity(h, name="out")
    return g.as_graph_def()


def dtype_of(graph_def, name, attr="T"):
    return next(n for n in graph_def.node if n.name == name).attr[attr].type


def test_matching_nodes_stay_float32_and_the_rest_go_half():
    original = two_layer_graph()
    result = amp(original, fetches=["out"], keep_float32_patterns=("^head/",))
    gd = result.graph_def
    assert dtype_of(gd, "body/mm") == F16 and dtype_of(gd, "body/relu") == F16
    assert dtype_of(gd, "head/mm") == F32 and dtype_of(gd, "head/relu") == F32
    assert result.unmatched_patterns == ()
    assert_same_outputs_within_half(original, gd, ["out"], {"x": X})


def test_patterns_are_searched_anywhere_in_the_name():
    result = amp(two_layer_graph(), fetches=["out"], keep_float32_patterns=("relu",))
    gd = result.graph_def
    assert dtype_of(gd, "body/relu") == F32 and dtype_of(gd, "head/relu") == F32
    assert dtype_of(gd, "body/mm") == F16


def test_the_reason_names_the_pattern_and_the_first_matching_pattern_wins():
    result = amp(two_layer_graph(), fetches=["out"], keep_float32_patterns=("head/mm$", "^head/"))
    outcomes = result.node_outcomes
    assert outcomes["head/mm"]["colour"] == "preserved"
    assert "'head/mm$'" in outcomes["head/mm"]["rule"] and "'head/mm$'" in outcomes["head/mm"]["reason"]
    assert "'^head/'" in outcomes["head/relu"]["rule"]
    assert outcomes["body/mm"]["colour"] == "allow"


def test_nodes_inside_functions_match_as_function_colon_colon_node():
    original = function_call_graph()
    function = next(f.signature.name for f in original.library.function
                    if any(n.name == "allow_in_fn" for n in f.node_def))
    result = amp(original, fetches=["out"], keep_float32_patterns=("::allow_in_fn$",))
    gd = result.graph_def
    assert dtype_of(gd, "allow_main") == F16
    bodies = [f for f in gd.library.function if any(n.name == "allow_in_fn" for n in f.node_def)]
    assert bodies
    for body in bodies:
        assert next(n for n in body.node_def if n.name == "allow_in_fn").attr["T"].type == F32
    assert any(name.endswith("::allow_in_fn") and "'::allow_in_fn$'" in entry["reason"]
               for name, entry in result.node_outcomes.items())
    assert_same_outputs_within_half(original, gd, ["out"], {"x": X[:4]})
    # The function's name is part of what is matched.
    kept = amp(original, fetches=["out"], keep_float32_patterns=(f"^{function}::",)).graph_def
    assert all(next(n for n in f.node_def if n.name == "allow_in_fn").attr["T"].type == F32
               for f in kept.library.function if any(n.name == "allow_in_fn" for n in f.node_def))


def test_a_pattern_matching_nothing_is_reported():
    result = amp(two_layer_graph(), fetches=["out"], keep_float32_patterns=("^head/", "no_such_layer"))
    assert result.unmatched_patterns == ("no_such_layer",)
    assert dtype_of(result.graph_def, "head/mm") == F32


def test_an_invalid_pattern_is_a_usage_error():
    with pytest.raises(UsageError, match=r"--keep-float32 '\(unclosed': not a regular expression"):
        Config(keep_float32_patterns=("(unclosed",))


def test_runtime_reads_patterns_separated_by_semicolons():
    settings = RuntimeSettings.from_env({KEEP_FLOAT32_ENV: " ^loss/ ; softmax{1,2} ;; "})
    assert settings.keep_float32 == ("^loss/", "softmax{1,2}")
    assert RuntimeSettings.from_env({}).keep_float32 == ()
    assert split_env("a::b;c") == ("a::b", "c")
    with pytest.raises(UsageError, match=f"{KEEP_FLOAT32_ENV} '\\[': not a regular expression"):
        RuntimeSettings.from_env({KEEP_FLOAT32_ENV: "["})


def test_runtime_session_keeps_matching_nodes_float32(amp_runtime):
    amp_runtime(RuntimeSettings(target="float16", keep_float32=("^relu1$",)))
    graph = mlp_session_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        sess.run("y:0", {"x:0": X})
        shadow = runner_of(sess).shadow_graph
    assert shadow.get_operation_by_name("mm1").get_attr("T") == tf.float16
    assert shadow.get_operation_by_name("relu1").get_attr("T") == tf.float32


def test_runtime_tf_function_keeps_matching_nodes_float32(amp_runtime):
    w = tf.constant(rng(1).normal(scale=0.3, size=(8, 8)).astype(np.float32))

    def model(x):
        h = tf.nn.relu(tf.matmul(x, w, name="kept_mm"))
        return tf.matmul(h, w, name="half_mm")

    amp_runtime(RuntimeSettings(target="float16", keep_float32=("kept_mm",)))
    function = tf.function(model)
    function(X)
    traced = function.get_concrete_function(X)
    types = {op.name: op.get_attr("T") for op in traced.graph.get_operations() if op.type == "MatMul"}
    assert types == {"kept_mm": tf.float32, "half_mm": tf.float16}




@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("graphs") / "model.pb"
    path.write_bytes(two_layer_graph().SerializeToString())
    return path


def test_cli_flag_is_repeatable_and_explain_names_the_pattern(graph_file, tmp_path):
    out = tmp_path / "out.pb"
    proc = run_cli(graph_file, out, "--device-type", "CPU", "--keep-float32", "^head/mm$",
                   "--keep-float32", "body/relu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not our_lines(proc.stderr), proc.stderr
    gd = tf1.GraphDef.FromString(out.read_bytes())
    assert dtype_of(gd, "head/mm") == F32 and dtype_of(gd, "body/relu") == F32
    assert dtype_of(gd, "body/mm") == F16
    proc = run_cli("explain", graph_file, "head/mm", "--device-type", "CPU", "--keep-float32", "^head/", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "keep-float32 pattern '^head/'" in proc.stdout


def test_cli_warns_once_for_a_pattern_that_matches_nothing(graph_file, tmp_path):
    out = tmp_path / "out.pb"
    proc = run_cli(graph_file, out, "-q", "--device-type", "CPU", "--keep-float32", "decoder/", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = our_lines(proc.stderr)
    assert len(lines) == 1 and "WARNING" in lines[0] and "--keep-float32 'decoder/' matches no node" in lines[0]
    assert out.exists()


def test_cli_invalid_pattern_is_one_line_and_exit_2(graph_file, tmp_path):
    out = tmp_path / "out.pb"
    proc = run_cli(graph_file, out, "--keep-float32", "a(b", cwd=tmp_path)
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "--keep-float32 'a(b': not a regular expression")
    assert not out.exists()
