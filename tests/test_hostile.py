"""Hostile inputs and faults: one ``amp-rewrite:`` line, the right exit code, nothing written or damaged.

Most cases run the CLI in-process; the ones about the process itself (a
graph TensorFlow's importer crashes on, settings read at start-up) run a
subprocess. Every case snapshots the directory it works in and checks that a
failure changed nothing in it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from helpers import F16, F32, our_lines, tf1
from runners import clean_env, run_cli, run_cli_subprocess
from tensorflow.core.framework import function_pb2, graph_pb2

from amp_rewrite.errors import GraphError, UsageError
from amp_rewrite.graph import io as graph_io
from amp_rewrite.runtime.settings import RuntimeSettings

# --- building inputs ---------------------------------------------------------------------------------

def small_graph(size=4):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [size, size], name="x")
        w = tf.constant(np.linspace(-1, 1, size * size, dtype=np.float32).reshape(size, size), name="w")
        tf.identity(tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu"), name="out")
    return g.as_graph_def()


def save(path: Path, graph_def) -> Path:
    path.write_bytes(graph_def.SerializeToString())
    return path


def node(graph_def, name):
    return next(n for n in graph_def.node if n.name == name)


def read_graph(path) -> graph_pb2.GraphDef:
    return graph_pb2.GraphDef.FromString(Path(path).read_bytes())


def snapshot(root: Path) -> dict:
    """Every entry under ``root``: kind, mode and a digest of its contents (files), target (links)."""
    entries = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                entries[str(path)] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode) and info.st_size > 2 ** 26:  # the sparse 2.2 GB file: not read
                entries[str(path)] = ("file", stat.S_IMODE(info.st_mode), info.st_size, info.st_mtime_ns)
            elif stat.S_ISREG(info.st_mode):
                entries[str(path)] = ("file", stat.S_IMODE(info.st_mode), hashlib.sha256(path.read_bytes()).hexdigest())
            else:
                entries[str(path)] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode))
    return entries


def outcome(cwd: Path, *args) -> tuple[int, list[str], str]:
    """Runs ``amp-rewrite ARGS`` in-process in ``cwd``: (exit code, our stderr lines, stdout)."""
    done = run_cli(*args, cwd=cwd)
    return done.returncode, our_lines(done.stderr), done.stdout


def refused(root: Path, code: int, message: str, *args) -> str:
    """Runs the CLI in ``root`` expecting exit ``code`` and one line holding ``message``; nothing under it changes."""
    before = snapshot(root)
    got, ours, out = outcome(root, *args)
    assert got == code, ours
    assert len(ours) == 1 and message in ours[0], ours
    assert "Traceback" not in ours[0]
    assert snapshot(root) == before
    assert out == ""
    return ours[0]


@pytest.fixture
def good(tmp_path) -> Path:
    return save(tmp_path / "in.pb", small_graph())


# --- graphs TensorFlow cannot import -----------------------------------------------------------------

def recursive_graph():
    """x -> MatMul -> PartitionedCall(f) -> out, where f calls itself."""
    graph_def = small_graph()
    fdef = function_pb2.FunctionDef()
    fdef.signature.name = "recurse"
    fdef.signature.input_arg.add(name="a", type=F32)
    fdef.signature.output_arg.add(name="b", type=F32)
    call = fdef.node_def.add(name="again", op="PartitionedCall")
    call.input.append("a")
    call.attr["Tin"].list.type.append(F32)
    call.attr["Tout"].list.type.append(F32)
    call.attr["f"].func.name = "recurse"
    fdef.ret["b"] = "again:output:0"
    graph_def.library.function.append(fdef)
    top = graph_def.node.add(name="call", op="PartitionedCall")
    top.input.append("relu")
    top.attr["Tin"].list.type.append(F32)
    top.attr["Tout"].list.type.append(F32)
    top.attr["f"].func.name = "recurse"
    return graph_def


def test_recursive_function_is_rewritten_without_crashing_and_has_no_flop_share(tmp_path):
    src = save(tmp_path / "rec.pb", recursive_graph())
    done = run_cli_subprocess(src, "out.pb", "--report", "r.json", "--fetch", "out,call", "--device-type", "CPU",
                              cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "MatMul/Conv FLOPs unknown" in done.stdout, done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["fp16_flop_share"] is None
    out = read_graph(tmp_path / "out.pb")
    assert node(out, "mm").attr["T"].type == F16
    assert [f.signature.name for f in out.library.function] == ["recurse"]


def test_recursive_function_refused_by_validation_without_crashing(tmp_path):
    src = save(tmp_path / "rec.pb", recursive_graph())
    before = snapshot(tmp_path)
    done = run_cli_subprocess(src, "out.pb", "--fetch", "out,call", "--validate", "--random-inputs", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    lines = our_lines(done.stderr)
    assert len(lines) == 1 and "function recurse -> recurse calls itself" in lines[0], done.stderr
    assert snapshot(tmp_path) == before


def test_call_to_a_function_the_library_lacks(tmp_path):
    graph_def = small_graph()
    call = graph_def.node.add(name="call", op="PartitionedCall")
    call.input.append("relu")
    call.attr["Tin"].list.type.append(F32)
    call.attr["Tout"].list.type.append(F32)
    call.attr["f"].func.name = "ghost"
    src = save(tmp_path / "in.pb", graph_def)
    refused(tmp_path, 1, "node call (op PartitionedCall) calls function 'ghost', which the library does "
                                 "not define", src, tmp_path / "out.pb")


# --- Const values ------------------------------------------------------------------------------------

def const_matmul_graph(tensor_proto, x_shape):
    """Placeholder x, Const c holding ``tensor_proto``, MatMul(x, c), Identity out."""
    graph_def = graph_pb2.GraphDef()
    x = graph_def.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = F32
    for d in x_shape:
        x.attr["shape"].shape.dim.add(size=d)
    c = graph_def.node.add(name="c", op="Const")
    c.attr["dtype"].type = F32
    c.attr["value"].tensor.CopyFrom(tensor_proto)
    mm = graph_def.node.add(name="mm", op="MatMul", input=["x", "c"])
    mm.attr["T"].type = F32
    mm.attr["transpose_a"].b = False
    mm.attr["transpose_b"].b = False
    out = graph_def.node.add(name="out", op="Identity", input=["mm"])
    out.attr["T"].type = F32
    return graph_def


def test_const_whose_bytes_do_not_fit_its_shape(tmp_path):
    proto = tf.make_tensor_proto(np.ones([2, 2], np.float32))
    proto.tensor_content = b"\x00\x00\x80"
    src = save(tmp_path / "in.pb", const_matmul_graph(proto, [2, 2]))
    refused(tmp_path, 1, "node c (op Const): value does not decode: tensor_content holds 3 bytes",
            src, tmp_path / "out.pb", "--device-type", "CPU")


def test_const_with_more_values_than_its_shape(tmp_path):
    proto = tf.make_tensor_proto(np.ones([2, 2], np.float32))
    proto.ClearField("tensor_content")
    proto.float_val.extend([1.0] * 5)
    src = save(tmp_path / "in.pb", const_matmul_graph(proto, [2, 2]))
    refused(tmp_path, 1, "node c (op Const): value does not decode: holds 5 values",
            src, tmp_path / "out.pb", "--device-type", "CPU")


def test_const_whose_tensor_is_not_float32(tmp_path):
    proto = tf.make_tensor_proto(np.ones([2, 2], np.int32))
    src = save(tmp_path / "in.pb", const_matmul_graph(proto, [2, 2]))
    refused(tmp_path, 1, "node c (op Const): value does not decode", src, tmp_path / "out.pb",
            "--device-type", "CPU")


def test_nan_does_not_hide_an_out_of_range_const(tmp_path):
    value = np.ones([2, 2], np.float32)
    value[0, 0], value[1, 1] = np.nan, 1e6
    src = save(tmp_path / "in.pb", const_matmul_graph(tf.make_tensor_proto(value), [2, 2]))
    code, ours, _ = outcome(tmp_path, src, tmp_path / "out.pb", "--device-type", "CPU", "--report", tmp_path / "r.json")
    assert code == 0, ours
    out = read_graph(tmp_path / "out.pb")
    assert node(out, "mm").attr["T"].type == F32  # it reads 1e6, beyond float16's range
    assert node(out, "c").attr["dtype"].type == F32
    report = json.loads((tmp_path / "r.json").read_text())
    assert "|value| up to 1e+06" in report["nodes"]["mm"]["reason"]


def test_nan_and_inf_consts_in_range_fold_exactly(tmp_path):
    value = np.full([4, 4], 0.5, np.float32)
    value[0, 1], value[2, 3] = -np.inf, np.nan
    graph_def = const_matmul_graph(tf.make_tensor_proto(value), [4, 4])
    node(graph_def, "mm").input[:] = ["c", "x"]
    src = save(tmp_path / "in.pb", graph_def)
    code, ours, _ = outcome(tmp_path, src, tmp_path / "out.pb", "--device-type", "CPU")
    assert code == 0, ours
    out = read_graph(tmp_path / "out.pb")
    folded = node(out, "c")
    assert folded.attr["dtype"].type == F16
    np.testing.assert_array_equal(tf.make_ndarray(folded.attr["value"].tensor).astype(np.float32), value)


def splat(value, shape):
    proto = tf.make_tensor_proto(value, dtype=tf.float32, shape=shape)
    assert not proto.tensor_content and len(proto.float_val) == 1
    return proto


def test_huge_splat_const_stays_a_splat(tmp_path):
    src = save(tmp_path / "in.pb", const_matmul_graph(splat(0.5, [36000, 36000]), [1, 36000]))
    code, ours, _ = outcome(tmp_path, src, tmp_path / "out.pb", "--device-type", "CPU")
    assert code == 0, ours
    assert (tmp_path / "out.pb").stat().st_size < 1000
    folded = node(read_graph(tmp_path / "out.pb"), "c")
    tensor = folded.attr["value"].tensor
    assert folded.attr["dtype"].type == F16 and tensor.dtype == F16
    assert [d.size for d in tensor.tensor_shape.dim] == [36000, 36000]
    assert list(tensor.half_val) == [int(np.float16(0.5).view(np.uint16))] and not tensor.tensor_content


def test_small_splat_const_folds_and_computes_the_same(tmp_path):
    graph_def = const_matmul_graph(splat(0.25, [16, 16]), [4, 16])
    src = save(tmp_path / "in.pb", graph_def)
    code, ours, _ = outcome(tmp_path, src, tmp_path / "out.pb", "--device-type", "CPU")
    assert code == 0, ours
    out = read_graph(tmp_path / "out.pb")
    assert len(node(out, "c").attr["value"].tensor.half_val) == 1
    feed = np.random.default_rng(0).standard_normal([4, 16]).astype(np.float32)
    want, got = (run_graph(g, "out:0", {"x:0": feed}) for g in (graph_def, out))
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def run_graph(graph_def, fetch, feeds):
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as sess:
        return sess.run(fetch, feeds)


# --- SavedModels -------------------------------------------------------------------------------------

def tf1_saved_model(path: Path, *, two_meta_graphs: bool, with_variables: bool = True):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        w = tf1.get_variable("w", [8, 8], initializer=tf1.random_normal_initializer(seed=1))
        y = tf.nn.relu(tf.matmul(x, w, name="mm1"), name="y")
        z = tf.identity(tf.matmul(y, w, name="mm2"), name="z")
        with tf1.Session(graph=g) as sess:
            sess.run(tf1.global_variables_initializer())
            builder = tf1.saved_model.Builder(str(path))
            signature = tf1.saved_model.predict_signature_def({"x": x}, {"z": z})
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
            if two_meta_graphs:
                builder.add_meta_graph(["train"], signature_def_map={"serving_default": signature})
            builder.save()
    if not with_variables:
        import shutil

        shutil.rmtree(path / "variables")
    return path


def run_tf1_saved_model(path, feed):
    g = tf.Graph()
    with g.as_default(), tf1.Session(graph=g) as sess:
        tf1.saved_model.loader.load(sess, ["serve"], str(path))
        return sess.run("z:0", {"x:0": feed})


def test_tf1_saved_model_with_two_meta_graphs_converts_and_runs(tmp_path):
    src = tf1_saved_model(tmp_path / "sm", two_meta_graphs=True)
    code, ours, out = outcome(tmp_path, src, tmp_path / "out", "--device-type", "CPU")
    assert code == 0, ours
    assert not out.startswith("converted 0/")
    saved = graph_io.load_saved_model(tmp_path / "out")
    assert len(saved.meta_graphs) == 2
    for meta in saved.meta_graphs:
        types = {n.name: n.attr["T"].type for n in meta.graph_def.node if n.name in ("mm1", "mm2", "y", "z")}
        assert types == {"mm1": F16, "mm2": F16, "y": F16, "z": F32}
    feed = np.random.default_rng(1).standard_normal([3, 8]).astype(np.float32)
    np.testing.assert_allclose(run_tf1_saved_model(tmp_path / "out", feed), run_tf1_saved_model(src, feed),
                               rtol=1e-2, atol=1e-2)


def test_saved_model_without_variables_warns(caplog, tmp_path):
    src = tf1_saved_model(tmp_path / "sm", two_meta_graphs=False, with_variables=False)
    with caplog.at_level(logging.WARNING):
        code, ours, _ = outcome(tmp_path, src, tmp_path / "out", "--device-type", "CPU")
    assert code == 0, ours
    assert any("holds no variables/ directory" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "out" / "variables").exists()


def test_saved_model_pb_given_as_a_graph_def(tmp_path):
    src = tf1_saved_model(tmp_path / "sm", two_meta_graphs=False)
    refused(tmp_path, 1, "is the saved_model.pb of a SavedModel; give its directory",
            src / "saved_model.pb", tmp_path / "out.pb")


@pytest.mark.parametrize("flags", [("--validate", "--random-inputs"), ("--random-inputs",)])
def test_validation_of_a_saved_model_is_refused_not_ignored(tmp_path, flags):
    src = tf1_saved_model(tmp_path / "sm", two_meta_graphs=False)
    refused(tmp_path, 2, f"{flags[0]} takes a GraphDef input", src, tmp_path / "out", *flags)


def test_saved_model_never_replaces_a_directory_that_is_no_saved_model(tmp_path):
    src = tf1_saved_model(tmp_path / "sm", two_meta_graphs=False)
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    refused(tmp_path, 2, "directory that holds no SavedModel", src, precious, "--in-place")


def test_saved_model_output_that_is_a_file(tmp_path):
    src = tf1_saved_model(tmp_path / "sm", two_meta_graphs=False)
    (tmp_path / "out").write_text("a file")
    refused(tmp_path, 1, "already exists", src, tmp_path / "out")


def test_in_place_saved_model_restores_the_original_when_the_second_rename_fails(tmp_path, monkeypatch):
    src = tf1_saved_model(tmp_path / "sm", two_meta_graphs=False)
    real_replace = os.replace
    calls = []

    def failing_replace(a, b):
        calls.append((a, b))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_replace(a, b)

    monkeypatch.setattr(graph_io.os, "replace", failing_replace)
    before = snapshot(tmp_path)
    code, ours, _ = outcome(tmp_path, src, src, "--in-place", "--device-type", "CPU")
    assert code == 1 and len(ours) == 1 and "sm: cannot write: No space left on device" in ours[0], ours
    assert snapshot(tmp_path) == before


def test_report_inside_the_input_saved_model(tmp_path):
    src = tf1_saved_model(tmp_path / "sm", two_meta_graphs=False)
    refused(tmp_path, 2, "--report would overwrite the input", src, tmp_path / "out", "--report",
            src / "r.json")


# --- where the output goes ---------------------------------------------------------------------------

def test_output_that_is_a_character_device(tmp_path, good, monkeypatch):
    real_replace, real_rename = os.replace, os.rename

    def never_over_dev_null(real):
        def guarded(source, target, **kwargs):
            assert os.path.realpath(target) != "/dev/null", "about to replace /dev/null"
            return real(source, target, **kwargs)
        return guarded

    # a regression must fail here, not replace the machine's /dev/null
    monkeypatch.setattr(os, "replace", never_over_dev_null(real_replace))
    monkeypatch.setattr(os, "rename", never_over_dev_null(real_rename))
    refused(tmp_path, 2, "/dev/null: is a character device", good, "/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_output_that_is_a_fifo(tmp_path, good):
    os.mkfifo(tmp_path / "pipe")
    refused(tmp_path, 2, "pipe: is a FIFO", good, tmp_path / "pipe")


def test_output_that_is_a_directory(tmp_path, good):
    (tmp_path / "dir").mkdir()
    line = refused(tmp_path, 2, "dir: is a directory", good, tmp_path / "dir")
    assert ".tmp" not in line


def test_output_whose_parent_is_a_file(tmp_path, good):
    (tmp_path / "file").write_text("x")
    refused(tmp_path, 1, "file/out.pb: cannot write: Not a directory", good, tmp_path / "file" / "out.pb")


def test_report_in_a_missing_directory_writes_no_output(tmp_path, good):
    refused(tmp_path, 1, "no/such/dir/r.json: cannot write: No such file or directory", good,
            tmp_path / "out.pb", "--report", tmp_path / "no" / "such" / "dir" / "r.json")


@pytest.mark.parametrize("which", ["input", "output"])
def test_report_naming_the_input_or_the_output(tmp_path, which):
    src = save(tmp_path / "in.json", small_graph())
    (tmp_path / "out.json").write_bytes(b"older result")
    target = src if which == "input" else tmp_path / "out.json"
    refused(tmp_path, 2, f"--report would overwrite the {which}", src, tmp_path / "out.json",
            "--input-format", "pb", "--output-format", "pb", "--report", target)


def test_report_through_a_symlink_to_the_input(tmp_path):
    src = save(tmp_path / "in.json", small_graph())
    (tmp_path / "r.json").symlink_to(src)
    refused(tmp_path, 2, "--report would overwrite the input", src, tmp_path / "out.pb",
            "--input-format", "pb", "--report", tmp_path / "r.json")


def test_output_that_is_the_input_through_a_symlink_or_a_hard_link(tmp_path, good):
    (tmp_path / "soft.pb").symlink_to(good)
    os.link(good, tmp_path / "hard.pb")
    for alias in ("soft.pb", "hard.pb"):
        refused(tmp_path, 2, "output is the input file", good, tmp_path / alias)


def test_symlinked_output_is_followed(tmp_path, good):
    (tmp_path / "real").mkdir()
    (tmp_path / "link.pb").symlink_to(tmp_path / "real" / "out.pb")
    code, ours, _ = outcome(tmp_path, good, tmp_path / "link.pb", "--device-type", "CPU")
    assert code == 0, ours
    assert (tmp_path / "link.pb").is_symlink()
    assert node(read_graph(tmp_path / "real" / "out.pb"), "mm").attr["T"].type == F16


def test_in_place_on_a_symlink_keeps_the_link(tmp_path, good):
    (tmp_path / "link.pb").symlink_to(good)
    code, ours, _ = outcome(tmp_path, tmp_path / "link.pb", tmp_path / "link.pb", "--in-place", "--device-type", "CPU")
    assert code == 0, ours
    assert (tmp_path / "link.pb").is_symlink()
    assert node(read_graph(good), "mm").attr["T"].type == F16


def test_replaced_output_keeps_its_mode(tmp_path, good):
    out = tmp_path / "out.pb"
    out.write_bytes(b"old")
    out.chmod(0o600)
    code, ours, _ = outcome(tmp_path, good, out, "--device-type", "CPU")
    assert code == 0, ours
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_bytes() != b"old"


def test_full_disk_names_the_output_and_leaves_nothing(tmp_path, good, monkeypatch):
    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(graph_io.os, "fsync", no_space)
    refused(tmp_path, 1, "out.pb: cannot write: No space left on device", good, tmp_path / "out.pb",
            "--device-type", "CPU")


def test_full_disk_while_copying_saved_model_variables(tmp_path, monkeypatch):
    import shutil

    src = tf1_saved_model(tmp_path / "sm", two_meta_graphs=False)

    def no_space(source, target, *args, **kwargs):
        raise shutil.Error([(str(source), str(target), "[Errno 28] No space left on device")])

    monkeypatch.setattr(shutil, "copytree", no_space)
    line = refused(tmp_path, 1, "out: cannot write:", src, tmp_path / "out", "--device-type", "CPU")
    assert "No space left on device" in line and "[(" not in line


@pytest.mark.parametrize("signum, code, word", [(signal.SIGINT, 130, "interrupted"),
                                                (signal.SIGTERM, 143, "terminated")])
def test_signal_while_writing_leaves_no_partial_file(tmp_path, good, monkeypatch, signum, code, word):
    out = tmp_path / "out.pb"
    out.write_bytes(b"previous")
    real_add = graph_io.Outputs.add_file

    def add_then_signal(self, path, data):
        real_add(self, path, data)
        assert any(p.name.startswith(".out.pb.") for p in tmp_path.iterdir())  # staged
        os.kill(os.getpid(), signum)

    monkeypatch.setattr(graph_io.Outputs, "add_file", add_then_signal)
    # A suite started in the background (`cmd &` in a script) inherits SIGINT ignored, and Python then
    # leaves it ignored; what a user's Ctrl-C does is what Python does by default.
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        refused(tmp_path, code, word, good, out, "--device-type", "CPU")
    finally:
        signal.signal(signal.SIGINT, previous_sigint)
    assert out.read_bytes() == b"previous"


def test_dump_dir_that_is_a_file(tmp_path, good):
    (tmp_path / "dump").write_text("x")
    refused(tmp_path, 2, "dump: --dump-dir is not a directory", good, tmp_path / "out.pb",
            "--dump-dir", tmp_path / "dump")


# --- reading the input -------------------------------------------------------------------------------

def test_text_graph_nested_too_deeply(tmp_path):
    depth = 3000
    value = 'func { name: "f" ' + 'attr { key: "a" value { func { name: "f" ' * depth + "}}}" * depth + "}"
    text = 'node { name: "n" op: "NoOp" attr { key: "a" value { ' + value + " } } }\n"
    src = tmp_path / "deep.pbtxt"
    src.write_text(text)
    refused(tmp_path, 1, "deep.pbtxt: not a text GraphDef: nested too deeply", src, tmp_path / "out.pb")


def test_text_graph_with_a_byte_order_mark(tmp_path):
    src = tmp_path / "bom.pbtxt"
    src.write_bytes(b"\xef\xbb\xbf" + text_format.MessageToString(small_graph()).encode())
    code, ours, _ = outcome(tmp_path, src, tmp_path / "out.pb", "--device-type", "CPU")
    assert code == 0, ours
    assert node(read_graph(tmp_path / "out.pb"), "mm").attr["T"].type == F16


def test_input_that_is_a_fifo_is_refused_unread(tmp_path):
    os.mkfifo(tmp_path / "pipe.pb")
    refused(tmp_path, 1, "pipe.pb: not a regular file", tmp_path / "pipe.pb", tmp_path / "out.pb")


def test_input_that_is_a_device(tmp_path):
    refused(tmp_path, 1, "/dev/zero: not a regular file", "/dev/zero", tmp_path / "out.pb")


def test_graph_def_beyond_protobufs_limit(tmp_path):
    big = tmp_path / "big.pb"
    with open(big, "wb") as handle:
        handle.truncate(2_200_000_000)  # sparse: costs no disk and is never read
    refused(tmp_path, 1, "big.pb: 2200000000 bytes, more than protobuf's 2 GiB limit", big,
            tmp_path / "out.pb")


@pytest.mark.parametrize("value, shown", [("list { type: DT_FLOAT }", "'list'"), ("type: 9999", "9999"),
                                          ("i: 1", "'i'")])
def test_type_attr_that_holds_no_data_type(tmp_path, value, shown):
    graph_def = small_graph()
    mm = node(graph_def, "mm")
    mm.attr["T"].CopyFrom(text_format.Parse(value, type(mm.attr["T"])()))
    src = save(tmp_path / "in.pb", graph_def)
    refused(tmp_path, 1, f"node mm (op MatMul): type attr T holds {shown}", src, tmp_path / "out.pb")


# --- op lists ----------------------------------------------------------------------------------------

def test_list_file_that_is_not_utf8(tmp_path, good):
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "allow.txt").write_bytes(b"MatMul\n\xff\xfeConv2D\n")
    refused(tmp_path, 1, "allow.txt: not UTF-8 text (byte 7 is 0xff)", good, tmp_path / "out.pb",
            "--lists", lists)


def test_list_file_with_a_byte_order_mark(tmp_path, good):
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "allow.txt").write_bytes(b"\xef\xbb\xbfMatMul\n")
    code, ours, _ = outcome(tmp_path, good, tmp_path / "out.pb", "--lists", lists, "--device-type", "CPU")
    assert code == 0, ours
    assert node(read_graph(tmp_path / "out.pb"), "mm").attr["T"].type == F16


def test_misspelt_op_in_a_flag_warns_with_a_suggestion(caplog, tmp_path, good):
    with caplog.at_level(logging.WARNING):
        code, ours, _ = outcome(tmp_path, good, tmp_path / "out.pb", "--deny-add", "MatMull", "--device-type", "CPU")
    assert code == 0, ours
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["--deny-add: MatMull is not an op this TensorFlow registers (did you mean MatMul?)"]


def test_misspelt_op_in_a_list_file_warns(caplog, tmp_path, good):
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "allow.txt").write_text("MatMul\nRelux\n")
    with caplog.at_level(logging.WARNING):
        code, ours, _ = outcome(tmp_path, good, tmp_path / "out.pb", "--lists", lists, "--device-type", "CPU")
    assert code == 0, ours
    assert any("allow.txt: Relux is not an op this TensorFlow registers (did you mean Relu" in r.getMessage()
               for r in caplog.records)


def test_op_name_with_a_space_in_the_environment(tmp_path, good, monkeypatch):
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD", "Mat Mul")
    refused(tmp_path, 1, "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_ADD: not an op name: 'Mat Mul'",
            good, tmp_path / "out.pb")


def test_bad_level_in_the_environment_is_ignored_when_the_flag_gives_one(tmp_path, good, monkeypatch):
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL", "garbage")
    refused(tmp_path, 2, "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL='garbage'", good, tmp_path / "out.pb")
    code, ours, _ = outcome(tmp_path, good, tmp_path / "out.pb", "--level", "DEFAULT", "--device-type", "CPU")
    assert code == 0, ours


# --- fetches and validation --------------------------------------------------------------------------

@pytest.mark.parametrize("fetch, extra", [("out:3", ("--validate", "--random-inputs")), ("mm:7", ())])
def test_fetch_port_the_node_lacks(tmp_path, good, fetch, extra):
    name = fetch.split(":")[0]
    op = {"out": "Identity", "mm": "MatMul"}[name]
    refused(tmp_path, 1, f"fetch '{fetch}': node {name} (op {op}) has 1 output", good, tmp_path / "out.pb",
            "--fetch", fetch, *extra)


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_truncated_npz(tmp_path, good):
    npz = write_npz(tmp_path / "feeds.npz", x=np.ones([4, 4], np.float32))
    npz.write_bytes(npz.read_bytes()[:40])
    refused(tmp_path, 1, "feeds.npz: cannot read sample inputs", good, tmp_path / "out.pb",
            "--validate", "--inputs", npz)


def test_npy_given_as_sample_inputs(tmp_path, good):
    np.save(tmp_path / "feeds.npy", np.ones([4, 4], np.float32))
    refused(tmp_path, 1, "feeds.npy: cannot read sample inputs: a single .npy array", good,
            tmp_path / "out.pb", "--validate", "--inputs", tmp_path / "feeds.npy")


def test_npz_with_a_pickled_object(tmp_path, good):
    npz = write_npz(tmp_path / "feeds.npz", x=np.array([{"a": 1}], dtype=object))
    refused(tmp_path, 1, "feeds.npz: cannot read sample inputs: a damaged .npz archive", good,
            tmp_path / "out.pb", "--validate", "--inputs", npz)


def test_empty_npz_and_directory_as_sample_inputs(tmp_path, good):
    write_npz(tmp_path / "empty.npz")
    refused(tmp_path, 1, "empty.npz: cannot read sample inputs: the archive holds no arrays", good,
            tmp_path / "out.pb", "--validate", "--inputs", tmp_path / "empty.npz")
    (tmp_path / "dir.npz").mkdir()
    refused(tmp_path, 1, "dir.npz: cannot read sample inputs: not a regular file", good,
            tmp_path / "out.pb", "--validate", "--inputs", tmp_path / "dir.npz")


@pytest.mark.parametrize("fill", [np.nan, np.inf])
def test_non_finite_sample_inputs(tmp_path, good, fill):
    npz = write_npz(tmp_path / "feeds.npz", x=np.full([4, 4], fill, np.float32))
    refused(tmp_path, 1, "sample input 'x:0' holds NaN or infinite values", good, tmp_path / "out.pb",
            "--validate", "--inputs", npz)


def test_custom_op_with_validation(tmp_path):
    graph_def = small_graph()
    custom = graph_def.node.add(name="custom", op="MyVendorOp")
    custom.input.append("relu")
    src = save(tmp_path / "in.pb", graph_def)
    refused(tmp_path, 1, "TensorFlow does not import it", src, tmp_path / "out.pb", "--fetch",
            "out,custom", "--validate", "--random-inputs", "--device-type", "CPU")


def test_random_inputs_for_a_resource_placeholder(tmp_path, good):
    graph_def = small_graph()
    handle = graph_def.node.add(name="handle", op="Placeholder")
    handle.attr["dtype"].type = tf.resource.as_datatype_enum
    src = save(tmp_path / "in.pb", graph_def)
    refused(tmp_path, 1, "placeholder handle is resource, which random inputs cannot fill", src,
            tmp_path / "out.pb", "--validate", "--random-inputs", "--fetch", "out")


def test_legitimate_minus_infinity_output_validates_in_half(tmp_path):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [8, 8], name="x")
        w = tf.constant(np.random.default_rng(2).standard_normal([8, 8]).astype(np.float32), name="w")
        tf.identity(tf.math.log(tf.nn.relu(tf.matmul(x, w, name="mm"))), name="out")
    src = save(tmp_path / "in.pb", g.as_graph_def())
    code, ours, _ = outcome(tmp_path, src, tmp_path / "out.pb", "--validate", "--random-inputs", "--device-type",
                            "CPU", "--report", tmp_path / "r.json")
    assert code == 0, ours
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["validation"]["passed"] and report["validation"]["regions_returned"] == []
    assert node(read_graph(tmp_path / "out.pb"), "mm").attr["T"].type == F16


def test_tolerance_error_for_non_finite_values():
    from amp_rewrite.validate import Tolerance

    tol = Tolerance()
    want = np.array([-np.inf, 1.0, 2.0])
    assert tol.error(np.array([-np.inf, 1.0, 2.0]), want) == 0.0
    assert tol.error(np.array([np.inf, 1.0, 2.0]), want) == np.inf
    assert tol.error(np.array([-np.inf, np.nan, 2.0]), want) == np.inf
    assert tol.error(np.array([5.0, 1.0, 2.0]), want) == np.inf


def test_nan_reference_output_is_refused(tmp_path):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        tf.identity(tf.sqrt(tf.matmul(x, x, name="mm") - 1e3), name="out")
    src = save(tmp_path / "in.pb", g.as_graph_def())
    refused(tmp_path, 1, "output out is NaN in float32 on these sample inputs", src, tmp_path / "out.pb",
            "--validate", "--random-inputs", "--device-type", "CPU")


@pytest.mark.parametrize("flag, value", [("--rtol", "-1"), ("--rtol", "nan"), ("--atol", "inf"),
                                         ("--max-runs", "0"), ("--max-runs", "1"), ("--seed", "-1"),
                                         ("--rtol", "abc")])
def test_nonsense_numbers_in_flags(tmp_path, good, flag, value):
    refused(tmp_path, 2, f"argument {flag}", good, tmp_path / "out.pb", "--validate", "--random-inputs",
            flag, value)


# --- runtime settings --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [
    ("AMP_LOSS_SCALE_INIT", "nan"), ("AMP_LOSS_SCALE_INIT", "inf"), ("AMP_LOSS_SCALE_INIT", "1e39"),
    ("AMP_LOSS_SCALE_INIT", "0.5"), ("AMP_LOSS_SCALE", "1e39"), ("AMP_LOSS_SCALE", "nan"),
    ("AMP_LOSS_SCALE", "1e-50"), ("AMP_LOSS_SCALE", "-3"), ("AMP_LOSS_SCALE_GROWTH_INTERVAL", "99999999999"),
    ("AMP_LOSS_SCALE_GROWTH_INTERVAL", "1e3"), ("AMP_LOSS_SCALE_LOG_STEPS", "-1"),
])
def test_runtime_settings_out_of_range_are_refused(name, value):
    with pytest.raises(UsageError, match=f"^{name}={value!r}: "):
        RuntimeSettings.from_env({name: value})


def test_runtime_settings_at_the_edge_of_float32_are_accepted():
    settings = RuntimeSettings.from_env({"AMP_LOSS_SCALE": "3e38"})
    assert settings.loss_scale.initial_scale == 3e38 and not settings.loss_scale.is_dynamic


SCRIPT = "import tensorflow as tf\nprint('trained', tf.constant(1.0).numpy())\n"


@pytest.mark.parametrize("name, value", [("AMP_LOSS_SCALE_INIT", "nan"), ("AMP_LOSS_SCALE", "1e39")])
def test_bad_runtime_setting_falls_back_with_one_line(tmp_path, name, value):
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=clean_env(ENABLE_AUTO_MP="1", **{name: value}),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "trained 1.0" in done.stdout
    lines = our_lines(done.stderr)
    assert len(lines) == 1 and f"{name}={value!r}" in lines[0] and "not enabled" in lines[0], done.stderr


def test_bad_runtime_setting_in_strict_mode_raises(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT],
                          env=clean_env(ENABLE_AUTO_MP="1", AMP_REWRITE_STRICT="1", AMP_LOSS_SCALE_INIT="nan"),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert "trained" not in done.stdout
    assert "UsageError: AMP_LOSS_SCALE_INIT='nan'" in done.stderr


def test_graph_error_api_names_node_for_bad_const(tmp_path):
    from helpers import amp

    proto = tf.make_tensor_proto(np.ones([2, 2], np.float32))
    proto.tensor_content = b"\x00" * 5
    with pytest.raises(GraphError, match=r"node c \(op Const\): value does not decode"):
        amp(const_matmul_graph(proto, [2, 2]))


@pytest.mark.parametrize("fields", [{"initial_scale": float("nan")}, {"initial_scale": 1e39},
                                    {"initial_scale": 0.0}, {"growth_interval": 0}, {"log_every": 2 ** 40}])
def test_loss_scale_settings_built_in_code_are_checked_too(fields):
    from amp_rewrite.runtime.settings import LossScaleSettings

    with pytest.raises(UsageError):
        LossScaleSettings(**fields)


def test_dump_dir_inside_the_input_saved_model(tmp_path):
    src = tf1_saved_model(tmp_path / "sm", two_meta_graphs=False)
    refused(tmp_path, 2, "--dump-dir would write into the input", src, tmp_path / "out", "--dump-dir",
            src / "dumps")


def test_optional_func_attr_left_unset_is_no_call():
    from amp_rewrite.graph.importable import import_blocker, missing_function

    graph_def = small_graph()
    node(graph_def, "relu").attr["unused_f"].func.name = ""
    assert missing_function(graph_def) is None and import_blocker(graph_def) is None


def test_mutual_recursion_is_found_without_tensorflow():
    from amp_rewrite.graph.importable import import_blocker

    graph_def = recursive_graph()
    first = graph_def.library.function[0]
    second = graph_def.library.function.add()
    second.CopyFrom(first)
    second.signature.name = "other"
    first.node_def[0].attr["f"].func.name = "other"
    assert import_blocker(graph_def) == ("function other -> recurse -> other calls itself, "
                                         "which TensorFlow cannot import")


def test_unexpected_failure_is_one_line_not_a_traceback(tmp_path, good, monkeypatch):
    import amp_rewrite.pipeline

    def broken(*args, **kwargs):
        raise RuntimeError("something nobody foresaw\nsecond line")

    monkeypatch.setattr(amp_rewrite.pipeline, "rewrite", broken)
    line = refused(tmp_path, 1, "in.pb: cannot rewrite: RuntimeError: something nobody foresaw", good,
                   tmp_path / "out.pb")
    assert "second line" not in line


def test_explain_on_a_device_and_on_a_deep_text_graph(tmp_path):
    refused(tmp_path, 1, "/dev/zero: not a regular file", "explain", "/dev/zero", "relu")
    src = tmp_path / "deep.pbtxt"
    src.write_text('node { name: "n" op: "NoOp" attr { key: "a" value { '
                   + 'func { name: "f" attr { key: "a" value { ' * 3000 + "}}}" * 3000 + " } } }\n")
    refused(tmp_path, 1, "nested too deeply", "explain", src, "n")
