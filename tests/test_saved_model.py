"""SavedModel in, SavedModel out: every function rewritten, signatures and variables float32."""

import json
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import F16, assert_one_line_error, float32_as_float32, rng
from runners import run_cli
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from amp_rewrite import Config, rewrite
from amp_rewrite.paint.explain import disagreements


@pytest.fixture(scope="module")
def mobilenet_saved_model(tmp_path_factory):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), classifier_activation=None,
                                           alpha=0.35)
    # Untrained batch norms let activations vanish (logits near 1e-11, below half's
    # range). Calibrate their statistics once on sample data, as training would.
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(rng(9).uniform(0, 1, (8, 96, 96, 3)).astype(np.float32), training=True)

    class Serving(tf.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec([None, 96, 96, 3], tf.float32, name="images")])
        def serve(self, images):
            return {"logits": self.model(images, training=False)}

    module = Serving(model)
    path = tmp_path_factory.mktemp("models") / "mobilenet"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    frozen = convert_variables_to_constants_v2(module.serve.get_concrete_function())
    (path.parent / "mobilenet_frozen.pb").write_bytes(frozen.graph.as_graph_def().SerializeToString())
    return path


@pytest.fixture(scope="module")
def rewritten(mobilenet_saved_model, tmp_path_factory):
    """The SavedModel rewritten by the command line, with its JSON report and summary line."""
    tmp = tmp_path_factory.mktemp("rewritten")
    out, report = tmp / "mobilenet_amp", tmp / "report.json"
    proc = run_cli(mobilenet_saved_model, out, "--report", report, "--device-type", "CPU", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(report.read_text()), proc.stdout.strip()


def library(path):
    saved = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    return saved.meta_graphs[0].graph_def.library.function


def serve_function(path) -> str:
    """The name of the library function behind the serving signature."""
    return next(f.signature.name for f in library(path) if f.signature.name.startswith("__inference_serve_"))


@pytest.mark.slow
def test_saved_model_round_trip_serves_float32_within_half_tolerance(mobilenet_saved_model, rewritten):
    out, _, summary = rewritten
    assert summary.startswith("converted ")
    assert any(n.op == "Conv2D" and n.attr["T"].type == F16 for f in library(out) for n in f.node_def)
    images = tf.constant(rng(5).uniform(0, 1, (2, 96, 96, 3)).astype(np.float32))
    want = tf.saved_model.load(str(mobilenet_saved_model)).signatures["serving_default"](images=images)["logits"]
    loaded = tf.saved_model.load(str(out))
    signature = loaded.signatures["serving_default"]
    assert signature.structured_input_signature[1]["images"].dtype == tf.float32
    got = signature(images=images)["logits"]
    assert got.dtype == tf.float32
    assert not np.array_equal(got.numpy(), want.numpy())  # really computed in half
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=5e-2, atol=5e-2 * float(np.abs(want).max()))
    restored = loaded.serve(images)["logits"]  # the restored tf.function keeps its float32 signature
    np.testing.assert_allclose(restored.numpy(), got.numpy(), rtol=1e-5, atol=1e-5)
    dtypes = tf.train.load_checkpoint(str(out / "variables" / "variables")).get_variable_to_dtype_map()
    assert {d for d in dtypes.values() if d.is_floating} == {tf.float32}


@pytest.mark.gpu
def test_gpu_serves_the_saved_model_the_command_line_rewrote_for_it(mobilenet_saved_model, tmp_path):
    """Rewritten offline for the default device type (a GPU, with TensorFlow's CUDA build), loaded and served."""
    out, report = tmp_path / "mobilenet_gpu_amp", tmp_path / "report.json"
    proc = run_cli(mobilenet_saved_model, out, "--report", report, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text())["device_type"] == "GPU"
    assert any(n.op == "Conv2D" and n.attr["T"].type == F16 for f in library(out) for n in f.node_def)
    images = tf.constant(rng(5).uniform(0, 1, (8, 96, 96, 3)).astype(np.float32))
    with float32_as_float32():
        want = tf.saved_model.load(str(mobilenet_saved_model)).signatures["serving_default"](images=images)["logits"]
    got = tf.saved_model.load(str(out)).signatures["serving_default"](images=images)["logits"]
    assert got.dtype == tf.float32 and "GPU" in got.device, got.device
    assert not np.array_equal(got.numpy(), want.numpy())  # really computed in half
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=5e-2, atol=5e-2 * float(np.abs(want).max()))


def test_existing_output_directory_is_refused_without_in_place(mobilenet_saved_model, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run_cli(mobilenet_saved_model, out, "--device-type", "CPU", cwd=tmp_path)
    assert proc.returncode == 1 and "already exists" in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".taken")]


@pytest.mark.slow
def test_rewriting_a_saved_model_in_place_then_again_changes_nothing(mobilenet_saved_model, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(mobilenet_saved_model, copy)
    assert run_cli(copy, copy, "--in-place", "--device-type", "CPU", cwd=tmp_path).returncode == 0
    first = (copy / "saved_model.pb").read_bytes()
    proc = run_cli(copy, copy, "--in-place", "--device-type", "CPU", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("converted 0/")
    assert (copy / "saved_model.pb").read_bytes() == first


def casts_by_function(path):
    """Per library function: (Casts, Casts of a variable read) in its body."""
    counts = {}
    for fdef in library(path):
        ops = {node.name: node.op for node in fdef.node_def}
        casts = [node for node in fdef.node_def if node.op == "Cast"]
        of_reads = [c for c in casts if ops.get(c.input[0].split(":")[0]) == "ReadVariableOp"]
        counts[fdef.signature.name] = (len(casts), len(of_reads))
    return counts


@pytest.mark.slow
def test_each_function_is_rewritten_once_with_the_frozen_graphs_casts(mobilenet_saved_model, rewritten):
    out, report, summary = rewritten
    before = {f.signature.name for f in library(mobilenet_saved_model)}
    after = casts_by_function(out)
    assert set(after) == before  # rewritten in place: no renamed copy of any function
    frozen = tf.compat.v1.GraphDef.FromString((mobilenet_saved_model.parent / "mobilenet_frozen.pb").read_bytes())
    frozen_casts = len(rewrite(frozen, config=Config(device_type="CPU")).casts)
    serve = next(name for name in after if name.startswith("__inference_serve_"))
    casts, of_reads = after[serve]
    # A variable is read in float32 and cast after the read; a frozen graph folds that
    # weight into a half Const instead. Every other Cast is the frozen graph's.
    assert of_reads > 0 and abs((casts - of_reads) - frozen_casts) <= 3, (casts, of_reads, frozen_casts)
    assert sum(c for c, _ in after.values()) == len(report["casts"])
    assert summary.startswith(f"converted {len(report['converted'])}/{report['nodes_total']} nodes to float16, "
                              f"{len(report['casts'])} casts")


@pytest.mark.slow
def test_report_describes_the_nodes_inside_functions(mobilenet_saved_model, rewritten):
    _, report, _ = rewritten
    nodes = report["nodes"]
    assert report["nodes_total"] == len(nodes)  # every node once: main graph and function bodies
    assert not [name for name in nodes if name.startswith("_amp_rewrite")]
    half = {name for name, entry in nodes.items() if entry["precision"] == "float16"}
    assert half == set(report["converted"])
    serve = serve_function(mobilenet_saved_model)
    convs = [entry for name, entry in nodes.items() if name.startswith(serve + "::") and entry["op"] == "Conv2D"]
    assert convs and all(e["colour"] == "allow" and e["precision"] == "float16" for e in convs)
    assert all(name.split("::")[0] in {f.signature.name for f in library(mobilenet_saved_model)}
               for name in nodes if "::" in name)


@pytest.mark.slow
def test_html_report_of_a_saved_model_counts_what_the_summary_says(mobilenet_saved_model, tmp_path):
    from amp_rewrite.report.html import CATEGORIES

    out, page = tmp_path / "out", tmp_path / "report.html"
    proc = run_cli(mobilenet_saved_model, out, "--report", page, "--device-type", "CPU", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    converted, casts = map(int, re.match(r"converted (\d+)/\d+ nodes to float16, (\d+) casts", proc.stdout).groups())
    data = json.loads(re.search(r'id="graph-data">(.*?)</script>', page.read_text(), re.S).group(1))
    drawn = [CATEGORIES[c] for c in data["cat"]]
    assert drawn.count("half") == data["summary"]["converted"] == converted > 0
    assert drawn.count("cast") == data["summary"]["casts"] == casts > 0


@pytest.mark.slow
def test_every_reason_agrees_with_the_rewritten_saved_model(mobilenet_saved_model):
    from amp_rewrite.graph import io as graph_io
    from amp_rewrite.saved_model import rewrite_saved_model

    _, result = rewrite_saved_model(graph_io.load_saved_model(mobilenet_saved_model), config=Config(device_type="CPU"))
    assert disagreements(result) == []
    frozen = tf.compat.v1.GraphDef.FromString((mobilenet_saved_model.parent / "mobilenet_frozen.pb").read_bytes())
    assert disagreements(rewrite(frozen, config=Config(device_type="CPU"))) == []


@pytest.mark.slow
def test_explain_takes_a_saved_model_and_a_function_node(mobilenet_saved_model, tmp_path):
    serve = serve_function(mobilenet_saved_model)
    conv = next(n.name for f in library(mobilenet_saved_model) if f.signature.name == serve
                for n in f.node_def if n.op == "Conv2D")
    proc = run_cli("explain", mobilenet_saved_model, f"{serve}::{conv}", "--device-type", "CPU", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].endswith("float16/allow.txt]")
    assert lines[0].startswith(f"{serve}::{conv} (Conv2D) → float16: allow-list op [Conv2D is on the allow list: ")
    bn_mul = next(n.name for f in library(mobilenet_saved_model) if f.signature.name == serve
                  for n in f.node_def if re.search(r"block_3_expand_BN(_\d+)?/batchnorm/mul$", n.name))
    proc = run_cli("explain", mobilenet_saved_model, f"{serve}::{bn_mul}", "--device-type", "CPU", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"{serve}::{bn_mul} (Mul) stays float32: infer op fed by no half op; its consumer ")
    assert first.endswith(" is float16")
    proc = run_cli("explain", mobilenet_saved_model, conv, "--device-type", "CPU", cwd=tmp_path)
    assert proc.returncode == 1
    line = assert_one_line_error(proc.stderr, f"no node named {conv!r}; inside functions: ")
    assert f"{serve}::{conv}" in line and "rewrite_saved_model" not in proc.stderr
