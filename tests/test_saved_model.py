"""SavedModel in, SavedModel out: every function rewritten, signatures and variables float32."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from helpers import F16, rng


def cli(*args, cwd):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TF_AUTO_MIXED", "AMP_REWRITE"))}
    return subprocess.run([sys.executable, "-m", "amp_rewrite", *map(str, args), "--device-type", "CPU"],
                          cwd=cwd, env=environ, capture_output=True, text=True, timeout=600)


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
    return path


def library(path):
    saved = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    return saved.meta_graphs[0].graph_def.library.function


@pytest.mark.slow
def test_saved_model_round_trip_serves_float32_within_half_tolerance(mobilenet_saved_model, tmp_path):
    out = tmp_path / "mobilenet_amp"
    proc = cli(mobilenet_saved_model, out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("converted ")
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


def test_existing_output_directory_is_refused_without_in_place(mobilenet_saved_model, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = cli(mobilenet_saved_model, out, cwd=tmp_path)
    assert proc.returncode == 1 and "already exists" in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".taken")]


@pytest.mark.slow
def test_rewriting_a_saved_model_in_place_then_again_changes_nothing(mobilenet_saved_model, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(mobilenet_saved_model, copy)
    assert cli(copy, copy, "--in-place", cwd=tmp_path).returncode == 0
    first = (copy / "saved_model.pb").read_bytes()
    proc = cli(copy, copy, "--in-place", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("converted 0/")
    assert (copy / "saved_model.pb").read_bytes() == first
