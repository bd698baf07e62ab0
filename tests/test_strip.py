"""Stripping mixed graphs back to float32, and retargeting their half type."""


import numpy as np
import pytest
import tensorflow as tf
from helpers import BF16, F16, F32, amp, assert_one_line_error, function_call_graph, our_lines, rng, run, tf1
from runners import run_cli
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from amp_rewrite.errors import GraphError
from amp_rewrite.strip import strip

X = rng(4).normal(size=(4, 16)).astype(np.float32)
HALF = (F16, BF16)


def type_attrs(graph_def) -> dict[str, list]:
    """Per node (main graph and functions): its type attrs and list-type attrs, by name."""
    nodes = [("", n) for n in graph_def.node]
    nodes += [(f.signature.name + "::", n) for f in graph_def.library.function for n in f.node_def]
    out = {}
    for prefix, node in nodes:
        out[prefix + node.name] = sorted((k, v.type, tuple(v.list.type)) for k, v in node.attr.items()
                                         if v.type or v.list.type)
    return out


def half_ops(graph_def) -> list[str]:
    """Nodes with a half type anywhere in their attrs or Const value, and function args in half."""
    found = [name for name, attrs in type_attrs(graph_def).items()
             if any(t in HALF or set(ts) & set(HALF) for _, t, ts in attrs)]
    found += [f.signature.name for f in graph_def.library.function
              for a in list(f.signature.input_arg) + list(f.signature.output_arg) if a.type in HALF]
    return found


def mlp_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        w1 = tf.constant(rng(0).normal(scale=0.25, size=(16, 32)).astype(np.float32), name="w1")
        w2 = tf.constant(rng(1).normal(scale=0.25, size=(32, 8)).astype(np.float32), name="w2")
        h = tf.nn.relu(tf.matmul(x, w1, name="mm1"), name="relu")
        tf.nn.softmax(tf.matmul(h, w2, name="mm2"), name="probs")
    return g.as_graph_def()


def test_strip_after_rewrite_gives_the_original_node_dtypes():
    original = mlp_graph()
    rewritten = amp(original, fetches=["probs"]).graph_def
    assert half_ops(rewritten)
    result = strip(rewritten, fetches=["probs"])
    assert type_attrs(result.graph_def) == type_attrs(original)
    assert not half_ops(result.graph_def) and not any(n.op == "Cast" for n in result.graph_def.node)
    want = run(original, ["probs"], {"x": X})[0]
    got = run(result.graph_def, ["probs"], {"x": X})[0]
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-3)  # only the weights' float16 round-off left
    assert len(result.casts_removed) == len([n for n in rewritten.node if n.op == "Cast"])


def test_strip_of_a_float32_graph_changes_nothing_and_never_mutates_the_input():
    original = mlp_graph()
    before = original.SerializeToString(deterministic=True)
    result = strip(original)
    assert result.graph_def.SerializeToString(deterministic=True) == before
    assert original.SerializeToString(deterministic=True) == before
    assert result.retyped == [] and result.casts_removed == []


def test_strip_reaches_function_bodies():
    original = function_call_graph()
    rewritten = amp(original, fetches=["out"]).graph_def
    assert any("T" in n.attr and n.attr["T"].type == F16 for f in rewritten.library.function for n in f.node_def)
    stripped = strip(rewritten, fetches=["out"]).graph_def
    assert not half_ops(stripped)
    assert not any(n.op == "Cast" for f in stripped.library.function for n in f.node_def)
    x = X[:, :8]
    np.testing.assert_allclose(run(stripped, ["out"], {"x": x})[0], run(original, ["out"], {"x": x})[0],
                               rtol=2e-3, atol=1e-3)


def half_interface_graph():
    """A float16 placeholder, float16 compute, and a float16 fetch."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float16, [4, 16], name="x16")
        w = tf.constant(rng(2).normal(scale=0.25, size=(16, 8)).astype(np.float16), name="w16")
        tf.identity(tf.nn.relu(tf.matmul(x, w, name="mm")), name="out16")
    return g.as_graph_def()


def test_feeds_and_fetches_keep_their_half_dtype():
    original = half_interface_graph()
    stripped = strip(original).graph_def
    nodes = {n.name: n for n in stripped.node}
    assert nodes["x16"].attr["dtype"].type == F16
    assert nodes["mm"].attr["T"].type == F32 and nodes["w16"].attr["dtype"].type == F32
    assert nodes["out16"].op == "Cast" and nodes["out16"].attr["DstT"].type == F16
    feeds = {"x16": X[:4].astype(np.float16)}
    want = run(original, ["out16"], feeds)[0]
    got = run(stripped, ["out16"], feeds)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_retarget_float16_to_bfloat16_and_back():
    original = mlp_graph()
    rewritten = amp(original, fetches=["probs"]).graph_def
    retargeted = strip(rewritten, target="bfloat16", fetches=["probs"]).graph_def
    dtypes = {n.name: n.attr["T"].type for n in retargeted.node if n.op in ("MatMul", "Relu")}
    assert dtypes == {"mm1": BF16, "relu": BF16, "mm2": BF16}
    assert not any(t == F16 for attrs in type_attrs(retargeted).values() for _, t, _ in attrs)
    want = run(original, ["probs"], {"x": X})[0]
    got = run(retargeted, ["probs"], {"x": X})[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=2e-2)  # bfloat16 has 8 significant bits
    back = strip(retargeted, target="float16", fetches=["probs"]).graph_def
    assert {n.name: n.attr["T"].type for n in back.node if n.op in ("MatMul", "Relu")} == \
        {"mm1": F16, "relu": F16, "mm2": F16}


def test_retarget_to_float16_refuses_a_constant_beyond_its_range():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2], name="x")
        big = tf.constant([1e6, 1.0], dtype=tf.bfloat16, name="big")
        tf.identity(tf.cast(tf.cast(x, tf.bfloat16) * big, tf.float32), name="out")
    with pytest.raises(GraphError, match="Const big: .*999424, beyond float16's range"):
        strip(g.as_graph_def(), target="float16")


def test_unknown_op_is_named():
    gd = mlp_graph()
    gd.node[3].op = "NoSuchOp"
    with pytest.raises(GraphError, match=f"node {gd.node[3].name}: unknown op 'NoSuchOp'"):
        strip(gd)


@pytest.fixture(scope="module")
def keras_models():
    """The same small Keras model built under mixed_float16 and under float32, with equal weights."""
    import keras

    keras.utils.set_random_seed(0)

    def build():
        return keras.Sequential([
            keras.Input((16,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.LayerNormalization(),
            keras.layers.Dense(8),
            keras.layers.Activation("softmax", dtype="float32"),
        ])

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        mixed = build()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    plain = build()
    plain.set_weights(mixed.get_weights())
    return mixed, plain


def frozen(model):
    function = tf.function(lambda x: model(x, training=False))
    concrete = function.get_concrete_function(tf.TensorSpec([None, 16], tf.float32))
    graph_def = convert_variables_to_constants_v2(concrete).graph.as_graph_def()
    inputs = [n.name for n in graph_def.node if n.op == "Placeholder"]
    outputs = [n.name for n in graph_def.node if n.name.startswith("Identity")]
    return graph_def, inputs[0], outputs[0]


def test_keras_mixed_float16_model_strips_to_float32(keras_models):
    mixed, plain = keras_models
    graph_def, x, y = frozen(mixed)
    assert half_ops(graph_def)
    stripped = strip(graph_def, fetches=[y]).graph_def
    assert not half_ops(stripped)
    want = plain(X).numpy()
    got = run(stripped, [y], {x: X})[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)  # float16-stored weights, float32 compute
    half_run = run(graph_def, [y], {x: X})[0]
    assert np.abs(got - want).max() < np.abs(half_run - want).max()


def test_stripped_keras_model_converts_to_tflite_and_runs(keras_models):
    mixed, plain = keras_models
    graph_def, x, y = frozen(mixed)
    stripped = strip(graph_def, fetches=[y]).graph_def
    wrapped = tf1.wrap_function(lambda: tf1.import_graph_def(stripped, name=""), [])
    concrete = wrapped.prune(wrapped.graph.get_tensor_by_name(f"{x}:0"), wrapped.graph.get_tensor_by_name(f"{y}:0"))
    flatbuffer = tf.lite.TFLiteConverter.from_concrete_functions([concrete], wrapped).convert()
    interpreter = tf.lite.Interpreter(model_content=flatbuffer)
    interpreter.resize_tensor_input(interpreter.get_input_details()[0]["index"], X.shape)
    interpreter.allocate_tensors()
    assert {d["dtype"] for d in interpreter.get_tensor_details()} <= {np.float32, np.int32}
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], X)
    interpreter.invoke()
    got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    np.testing.assert_allclose(got, plain(X).numpy(), rtol=2e-3, atol=2e-3)




def test_cli_strips_a_rewritten_graph(tmp_path):
    original = mlp_graph()
    src = tmp_path / "amp.pb"
    src.write_bytes(amp(original, fetches=["probs"]).graph_def.SerializeToString())
    out = tmp_path / "fp32.pbtxt"
    proc = run_cli("strip", src, out, "--fetch", "probs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("stripped ") and "casts removed" in proc.stdout
    from google.protobuf import text_format

    stripped = text_format.Parse(out.read_text(), tf1.GraphDef())
    assert type_attrs(stripped) == type_attrs(original)


def test_cli_bad_inputs_are_one_line(tmp_path):
    junk = tmp_path / "junk.pb"
    junk.write_bytes(b"\x00 not a graph \xff" * 10)
    proc = run_cli("strip", junk, tmp_path / "o.pb", cwd=tmp_path)
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr, str(junk))
    gd = mlp_graph()
    gd.node[3].op = "NoSuchOp"
    bad = tmp_path / "bad.pb"
    bad.write_bytes(gd.SerializeToString())
    proc = run_cli("strip", bad, tmp_path / "o.pb", cwd=tmp_path)
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr, f"{bad}: node {gd.node[3].name}: unknown op 'NoSuchOp'")
    assert not (tmp_path / "o.pb").exists()
    proc = run_cli("strip", bad, tmp_path / "o.pb", "--target", "float64", cwd=tmp_path)
    assert proc.returncode == 2 and len(our_lines(proc.stderr)) <= 1


def test_cli_strips_a_rewritten_saved_model(tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    class Net(tf.Module):
        def __init__(self):
            super().__init__()
            self.w1 = tf.Variable(rng(5).normal(scale=0.25, size=(16, 32)).astype(np.float32))
            self.w2 = tf.Variable(rng(6).normal(scale=0.25, size=(32, 8)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2)}

    net = Net()
    src, amp_dir, fp32_dir = tmp_path / "net", tmp_path / "amp", tmp_path / "fp32"
    tf.saved_model.save(net, str(src), signatures={"serving_default": net.serve})
    assert run_cli(src, amp_dir, "--device-type", "CPU", "-q", cwd=tmp_path).returncode == 0
    proc = run_cli("strip", amp_dir, fp32_dir, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr

    def graph(path):
        return saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes()).meta_graphs[0].graph_def

    assert half_ops(graph(amp_dir)) and not half_ops(graph(fp32_dir))
    assert type_attrs(graph(fp32_dir)) == type_attrs(graph(src))
    got = tf.saved_model.load(str(fp32_dir)).signatures["serving_default"](x=tf.constant(X))["y"]
    np.testing.assert_allclose(got.numpy(), net.serve(tf.constant(X))["y"].numpy(), rtol=1e-5, atol=1e-5)
