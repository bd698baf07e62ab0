"""Op lists: bundled data, overrides in order, overlap errors, levels."""

import json

import pytest
from helpers import TESTS

from amp_rewrite import Config, ListError
from amp_rewrite.paint.op_lists import COLOURS, Colour, ListEdit, default_lists_root, env_edits, load_lists

# TensorFlow 2.21's float16 lists as Grappler reports them, kept beside the tests.
REFERENCE = TESTS / "fixtures" / "grappler_lists_tf221_fp16.json"


def test_bundled_lists_are_sorted_unique_and_disjoint():
    for target in ("float16", "bfloat16"):
        seen = {}
        for colour in COLOURS:
            path = default_lists_root() / target / f"{colour}.txt"
            ops = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
            ops = [op for op in ops if op]
            assert ops == sorted(set(ops)), path
            for op in ops:
                assert op not in seen, f"{op} in {seen.get(op)} and {colour} ({target})"
                seen[op] = colour


# Ops we list beyond TensorFlow 2.21: TF1 loop data structures, made safe by the cluster rule.
ADDED_CLEAR = {"StackV2", "StackPushV2", "StackPopV2", "TensorArrayV3", "TensorArrayWriteV3",
               "TensorArrayReadV3", "TensorArrayGatherV3", "TensorArrayScatterV3", "TensorArrayConcatV3",
               "TensorArraySplitV3"}


def test_float16_lists_are_tensorflow_2_21_plus_named_additions():
    reference = json.loads(REFERENCE.read_text())
    lists = load_lists("float16")
    for colour, key in zip(COLOURS, ("AllowList", "InferList", "DenyList", "ClearList")):
        expected = frozenset(reference[key]) | (ADDED_CLEAR if colour == "clear" else frozenset())
        assert getattr(lists, colour) == expected, colour


def test_bfloat16_lists_differ_where_onednn_differs():
    bf16 = load_lists("bfloat16")
    assert {"Mean", "Sum", "Rsqrt", "Square", "SquaredDifference"} <= bf16.infer
    assert "FusedPadConv2D" in bf16.allow
    assert "Mean" not in bf16.deny


def test_adding_an_op_to_a_second_list_names_the_op_and_both_lists():
    with pytest.raises(ListError) as err:
        load_lists("float16", edits=[ListEdit("allow", "Tanh", True, "--allow-add")])
    message = str(err.value)
    assert "Tanh" in message and "infer list" in message and "allow list (--allow-add)" in message


def test_moving_an_op_is_an_add_plus_a_remove():
    lists = load_lists("float16", edits=[ListEdit("allow", "Tanh", True, "x"),
                                         ListEdit("infer", "Tanh", False, "y")])
    assert "Tanh" in lists.allow and "Tanh" not in lists.infer


@pytest.mark.parametrize("name,colour", [
    ("ALLOWLIST", "allow"), ("WHITELIST", "allow"), ("INFERLIST", "infer"), ("GRAYLIST", "infer"),
    ("DENYLIST", "deny"), ("BLACKLIST", "deny"), ("CLEARLIST", "clear"),
])
def test_every_environment_variable_adds_and_removes(name, colour):
    environ = {f"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_{name}_ADD": "MyOpA, MyOpB",
               f"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_{name}_REMOVE": "MyOpB"}
    lists = load_lists("float16", edits=env_edits(environ))
    assert "MyOpA" in getattr(lists, colour)
    assert "MyOpB" not in getattr(lists, colour)


def test_lists_dir_then_environment_then_flags(tmp_path):
    (tmp_path / "allow.txt").write_text("# only these\nMatMul\nMyConv\n")
    environ = {"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_REMOVE": "MyConv",
               "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD": "EnvOp"}
    config = Config.from_env(environ, lists_dir=str(tmp_path),
                             list_edits=(ListEdit("allow", "MyConv", True, "--allow-add"),))
    lists = load_lists("float16", lists_dir=config.lists_dir, edits=config.list_edits)
    assert lists.allow == {"MatMul", "MyConv", "EnvOp"}  # the flag re-adds what the env removed
    assert "Tanh" in lists.infer  # files not in the directory keep the bundled ones


def test_malformed_list_file_names_file_and_line(tmp_path):
    (tmp_path / "deny.txt").write_text("Exp\nnot an op\n")
    with pytest.raises(ListError, match=r"deny.txt:2"):
        load_lists("float16", lists_dir=tmp_path)


def test_levels_reshape_the_lists():
    cores = load_lists("float16", level="TENSOR_CORES_ONLY")
    assert cores.infer == cores.deny == cores.clear == frozenset() and "MatMul" in cores.allow
    strict = load_lists("float16", level="TREAT_INFER_AS_DENY")
    assert "Tanh" in strict.deny and not strict.infer


def test_level_from_environment_and_bad_level():
    assert Config.from_env({"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL": "tensor_cores_only"}).level \
        == "TENSOR_CORES_ONLY"
    from amp_rewrite import UsageError
    with pytest.raises(UsageError, match="LEVEL"):
        Config.from_env({"TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL": "FAST"})


def test_colours_equal_print_and_format_as_their_list_names():
    assert [str(colour) for colour in COLOURS] == ["allow", "infer", "deny", "clear"]
    for colour in Colour:
        name = colour.name.lower()
        assert colour == name and hash(colour) == hash(name) and Colour(name) is colour
        assert f"{colour}" == "%s" % colour == name and f"{colour:>6}" == name.rjust(6)  # noqa: UP031 (what % gives)
        assert json.dumps({colour: [colour]}) == json.dumps({name: [name]})


def test_bundled_lists_are_parsed_once_and_list_files_every_time(tmp_path, monkeypatch):
    from amp_rewrite.paint import op_lists

    parsed = []
    real = op_lists._parse_list_file
    monkeypatch.setattr(op_lists, "_parse_list_file", lambda path: parsed.append(path) or real(path))
    first = load_lists("float16")
    parsed.clear()
    assert load_lists("float16") == first
    assert parsed == []  # the bundled files are unchanged
    (tmp_path / "allow.txt").write_text("MatMul\n")
    assert "Conv2D" not in load_lists("float16", lists_dir=tmp_path).allow
    (tmp_path / "allow.txt").write_text("Conv2D\n")  # same size, maybe the same mtime
    assert load_lists("float16", lists_dir=tmp_path).allow == {"Conv2D"}
    assert parsed == [tmp_path / "allow.txt"] * 2
