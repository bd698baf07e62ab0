"""Bad input: one line naming the file, node or op; exit code 1; no output file left behind."""

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from helpers import CPU, amp, assert_one_line_error, tf1
from runners import run_cli

from amp_rewrite import GraphError, rewrite


def small_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        tf.identity(tf.nn.relu(tf.matmul(x, x, name="mm"), name="relu"), name="out")
    return g.as_graph_def()


def write(path, graph_def):
    path.write_bytes(graph_def.SerializeToString())
    return path


def corrupt(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def cases(tmp_path):
    good = small_graph().SerializeToString()
    dup = small_graph()
    dup.node.add().CopyFrom(dup.node[1])
    dangling = small_graph()
    dangling.node[1].input[0] = "ghost"
    cycle = small_graph()
    names = [n.name for n in cycle.node]
    cycle.node[names.index("mm")].input[0] = "relu"
    saved_dir = tmp_path / "not_a_saved_model"
    saved_dir.mkdir()
    return {
        "missing": (tmp_path / "missing.pb", "missing.pb: no such file"),
        "empty": (corrupt(tmp_path, "empty.pb", b""), "empty.pb: file is empty"),
        "truncated": (corrupt(tmp_path, "truncated.pb", good[: len(good) // 2]), "truncated.pb: not a binary GraphDef"),
        "corrupt": (corrupt(tmp_path, "corrupt.pb", bytes(range(256)) * 4), "corrupt.pb: not a binary GraphDef"),
        "text_as_binary": (corrupt(tmp_path, "text.pb", text_format.MessageToString(small_graph()).encode()),
                           "text.pb: not a binary GraphDef"),
        "binary_as_text": (corrupt(tmp_path, "binary.pbtxt", good), "binary.pbtxt: not a text GraphDef"),
        "no_saved_model": (saved_dir, "holds no saved_model.pb"),
        "duplicate_names": (write(tmp_path / "dup.pb", dup), "duplicate node name 'mm' (op MatMul)"),
        "dangling_input": (write(tmp_path / "dangling.pb", dangling), "input 'ghost' names a node that does not exist"),
        "data_cycle": (write(tmp_path / "cycle.pb", cycle), "data cycle that is not a while loop"),
    }


CASES = ["missing", "empty", "truncated", "corrupt", "text_as_binary", "binary_as_text", "no_saved_model",
         "duplicate_names", "dangling_input", "data_cycle"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gives_one_line_exit_1_and_no_output(tmp_path, case):
    path, message = cases(tmp_path)[case]
    out = tmp_path / "out.pb"
    proc = run_cli(path, out, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    line = assert_one_line_error(proc.stderr, message)
    assert str(path.name) in line
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.pb")] == []


def test_failed_rewrite_leaves_an_existing_output_untouched(tmp_path):
    good = write(tmp_path / "good.pb", small_graph())
    out = tmp_path / "out.pb"
    out.write_bytes(b"previous result")
    proc = run_cli(good, out, "--fetch", "nope", cwd=tmp_path)
    assert proc.returncode == 1
    assert out.read_bytes() == b"previous result"


def test_unwritable_output_is_exit_1_with_the_path(tmp_path):
    good = write(tmp_path / "good.pb", small_graph())
    proc = run_cli(good, tmp_path / "no" / "such" / "dir" / "out.pb", cwd=tmp_path)
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr, "no/such/dir")


def test_custom_op_is_kept_with_a_warning_not_an_error(tmp_path):
    gd = small_graph()
    custom = gd.node.add(name="custom", op="MyVendorOp")
    custom.input.append("relu")
    proc = run_cli(write(tmp_path / "custom.pb", gd), tmp_path / "out.pb", "--fetch", "out,custom",
                   "--device-type", "CPU", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "MyVendorOp is not registered" in proc.stderr
    out = tf.compat.v1.GraphDef.FromString((tmp_path / "out.pb").read_bytes())
    assert next(n for n in out.node if n.name == "custom").op == "MyVendorOp"


def test_missing_type_attr_names_node_and_attr():
    gd = small_graph()
    del next(n for n in gd.node if n.name == "mm").attr["T"]
    with pytest.raises(GraphError, match=r"node mm \(op MatMul\): type attr T is missing"):
        rewrite(gd, config=CPU)


def test_v1_loops_are_not_mistaken_for_cycles():
    from helpers import v1_control_flow

    g = tf.Graph()
    with g.as_default(), v1_control_flow():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        _, y = tf1.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, tf.matmul(h, h)), [0, x])
        tf.identity(y, name="out")
    assert amp(g.as_graph_def(), ["out"]).converted


def test_explain_prints_the_chain_back_to_the_list(tmp_path):
    good = write(tmp_path / "good.pb", small_graph())
    proc = run_cli("explain", good, "relu", "--fetch", "out", "--device-type", "CPU", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "relu (Relu) → float16: clear op next to an allow op; its input mm is float16"
    assert lines[1].startswith("mm (MatMul) → float16: allow-list op [MatMul is on the allow list: ")
    assert lines[1].endswith("float16/allow.txt]")
    proc = run_cli("explain", good, "ghost", cwd=tmp_path)
    assert proc.returncode == 1 and "no node named 'ghost'" in proc.stderr


def test_dump_dir_writes_before_after_and_lists(tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    monkeypatch.setenv("AMP_REWRITE_DUMP_DIR", str(dump))
    result = rewrite(small_graph(), fetches=["out"], config=None)
    files = sorted(p.name for p in dump.iterdir())
    stems = {f.split("_")[1] for f in files}
    assert len(stems) == 1 and len(files) == 5
    after = tf.compat.v1.GraphDef.FromString(next(dump.glob("*_after.pb")).read_bytes())
    assert after == result.graph_def
    assert "MatMul" in next(dump.glob("*_lists.txt")).read_text()
    assert np.any([n.op == "Cast" for n in after.node])
