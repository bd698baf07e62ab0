"""Builders for real TensorFlow model graphs used as benchmark and test inputs.

Each builder constructs one model in its own ``tf.Graph`` (graph mode, no
global ``disable_eager_execution``) and returns a :class:`ModelGraph` holding
the serialized ``GraphDef`` together with the node names a user would fetch
and a small, seeded input for every placeholder, so the graph can be run
as-is with ``tf.compat.v1.Session``.

Training graphs keep their variables (resource variables) and contain a
``NoOp`` named :data:`INIT_OP_NAME` that runs every variable initializer,
so they can be initialized after being imported from the bare ``GraphDef``.
Inference graphs are frozen: all weights are ``Const`` nodes.

All builders are deterministic: graph-level and NumPy seeds are fixed, so
building a model twice yields the same ``GraphDef`` bytes (see
:func:`graph_def_bytes`).

Notes on the installed stack (TensorFlow 2.21 with Keras 3):

* ``tf.compat.v1.layers`` is unavailable when Keras 3 is the active Keras,
  so batch normalization uses the same legacy layer from ``tf_keras`` that
  ``tf.compat.v1.layers.batch_normalization`` resolves to under legacy Keras.
* tf-slim 1.1.0's ``slim.batch_norm`` cannot run on TF 2.21 (its non-fused
  path imports a module that ``tf_keras`` no longer has at that path, and its
  fused path uses the removed ``ops.Tensor``). The ResNet-50 builder therefore
  uses tf-slim's ``resnet_v1_50`` network with a fused batch-norm normalizer
  supplied through an ``arg_scope``.

Running this file verifies every builder: it builds each model twice,
checks that the bytes match, imports the ``GraphDef`` into a fresh graph,
runs the fetches on the feeds and prints node counts and build times.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable

import numpy as np
import tensorflow as tf

__all__ = [
    "ALL_BENCHMARK_MODELS",
    "INIT_OP_NAME",
    "ModelGraph",
    "graph_def_bytes",
    "keras_mobilenetv2_frozen",
    "keras_resnet50_frozen",
    "run_model",
    "small_mlp_inference",
    "tf1_cnn_training",
    "tf1_inception_v3_training",
    "tf1_resnet50_training",
    "tf1_transformer_block_training",
]

#: Name of the ``NoOp`` in training graphs that initializes all variables.
INIT_OP_NAME = "init"

_SEED = 1234

_v1 = tf.compat.v1


@dataclasses.dataclass(frozen=True, eq=False)
class ModelGraph:
    """A model graph ready to be rewritten and run.

    Attributes:
        name: Short model name.
        graph_def: The model's ``tf.compat.v1.GraphDef``.
        fetches: Node names a user would fetch (train op and loss for
            training graphs, the outputs for inference graphs).
        feeds: Placeholder node name mapped to a seeded input array of the
            right shape and dtype.
        kind: ``"training"`` or ``"inference"``.
    """

    name: str
    graph_def: tf.compat.v1.GraphDef
    fetches: tuple[str, ...]
    feeds: dict[str, np.ndarray]
    kind: str


def graph_def_bytes(graph_def: tf.compat.v1.GraphDef) -> bytes:
    """Serializes a GraphDef with deterministic map ordering.

    Args:
        graph_def: The graph to serialize.

    Returns:
        The serialized bytes.
    """
    return graph_def.SerializeToString(deterministic=True)


# --------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------


def _rng(offset: int = 0) -> np.random.Generator:
    return np.random.default_rng(_SEED + offset)


def _v1_batch_normalization(inputs, **kwargs):
    """Calls ``tf.compat.v1.layers.batch_normalization`` or its tf_keras twin."""
    try:
        fn = tf.compat.v1.layers.batch_normalization
    except AttributeError:  # Keras 3 is active: the v1 layers live in tf_keras.
        from tf_keras.api._v1.keras.__internal__.legacy.layers import (
            batch_normalization as fn,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn(inputs, **kwargs)


def _dense(x, units: int, name: str, activation=None):
    """A fully connected layer built from ``tf.compat.v1`` variables."""
    with _v1.variable_scope(name):
        kernel = _v1.get_variable(
            "kernel",
            [x.shape[-1], units],
            initializer=_v1.glorot_uniform_initializer(),
        )
        bias = _v1.get_variable("bias", [units], initializer=_v1.zeros_initializer())
        y = tf.nn.bias_add(tf.matmul(x, kernel), bias)
        return activation(y) if activation is not None else y


def _conv(x, filters: int, size: int, name: str):
    """A SAME-padded stride-1 convolution with bias (NHWC)."""
    with _v1.variable_scope(name):
        kernel = _v1.get_variable(
            "kernel",
            [size, size, x.shape[-1], filters],
            initializer=_v1.glorot_uniform_initializer(),
        )
        bias = _v1.get_variable("bias", [filters], initializer=_v1.zeros_initializer())
        y = tf.nn.conv2d(x, kernel, strides=1, padding="SAME")
        return tf.nn.bias_add(y, bias)


def _finish_training_graph(graph: tf.Graph) -> tf.compat.v1.GraphDef:
    """Adds the variable-initializer op and returns the GraphDef."""
    with graph.as_default():
        _v1.global_variables_initializer()  # a NoOp named "init"
    graph_def = graph.as_graph_def()
    if not any(node.name == INIT_OP_NAME for node in graph_def.node):
        raise RuntimeError(f"expected an initializer op named {INIT_OP_NAME!r}")
    return graph_def


# --------------------------------------------------------------------------
# Training graphs (tf.compat.v1)
# --------------------------------------------------------------------------


def tf1_cnn_training(batch: int = 4) -> ModelGraph:
    """Builds a small CNN training graph with ``tf.compat.v1`` ops.

    Two conv + bias + relu + max-pool blocks (the second with training-mode
    batch normalization), two dense layers, a sparse softmax cross-entropy
    loss and a momentum optimizer step that depends on the batch-norm
    ``UPDATE_OPS``.

    Args:
        batch: Batch size of the image and label placeholders.

    Returns:
        The training ``ModelGraph``; fetches are the train op and the loss.
    """
    graph = tf.Graph()
    with graph.as_default():
        _v1.set_random_seed(_SEED)
        images = _v1.placeholder(tf.float32, [batch, 32, 32, 3], name="images")
        labels = _v1.placeholder(tf.int32, [batch], name="labels")

        x = tf.nn.relu(_conv(images, 32, 3, "conv1"))
        x = tf.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID", name="pool1")
        x = _conv(x, 64, 3, "conv2")
        x = _v1_batch_normalization(x, training=True, fused=True, name="bn2")
        x = tf.nn.relu(x)
        x = tf.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID", name="pool2")
        x = tf.reshape(x, [batch, 8 * 8 * 64])
        x = _dense(x, 128, "fc1", activation=tf.nn.relu)
        logits = _dense(x, 10, "logits")

        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits
        )
        loss = tf.identity(tf.reduce_mean(xent), name="loss")

        global_step = _v1.train.get_or_create_global_step()
        optimizer = _v1.train.MomentumOptimizer(learning_rate=0.01, momentum=0.9)
        with tf.control_dependencies(_v1.get_collection(_v1.GraphKeys.UPDATE_OPS)):
            train_op = optimizer.minimize(loss, global_step=global_step, name="train_op")
        fetches = (train_op.name, loss.op.name)

    rng = _rng(1)
    feeds = {
        "images": rng.standard_normal((batch, 32, 32, 3), dtype=np.float32),
        "labels": rng.integers(0, 10, size=(batch,), dtype=np.int32),
    }
    return ModelGraph("tf1_cnn_training", _finish_training_graph(graph), fetches, feeds, "training")


def _slim_fused_batch_norm(
    inputs, is_training=True, decay=0.997, epsilon=1e-5, scale=True, scope="BatchNorm"
):
    """Fused batch norm with the keyword interface of ``slim.batch_norm``."""
    return _v1_batch_normalization(
        inputs,
        momentum=decay,
        epsilon=epsilon,
        center=True,
        scale=scale,
        training=is_training,
        fused=True,
        name=scope,
    )


def tf1_resnet50_training(batch: int = 2) -> ModelGraph:
    """Builds a tf-slim ResNet-50 v1 training graph at 224x224.

    Uses ``tf_slim.nets.resnet_v1.resnet_v1_50`` (1000 classes) under an arg
    scope equivalent to ``resnet_arg_scope`` (L2 weight decay, variance
    scaling init, relu) whose normalizer is a fused batch norm registering
    its moving-average updates in ``UPDATE_OPS``. The loss is sparse softmax
    cross-entropy plus the regularization loss, minimized by momentum SGD.

    Args:
        batch: Batch size of the image and label placeholders.

    Returns:
        The training ``ModelGraph``; fetches are the train op and the loss.
    """
    import tf_slim as slim
    from tf_slim.nets import resnet_v1

    graph = tf.Graph()
    with graph.as_default():
        _v1.set_random_seed(_SEED)
        images = _v1.placeholder(tf.float32, [batch, 224, 224, 3], name="images")
        labels = _v1.placeholder(tf.int32, [batch], name="labels")

        bn_params = {"is_training": True, "decay": 0.997, "epsilon": 1e-5, "scale": True}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            with slim.arg_scope(
                [slim.conv2d],
                weights_regularizer=slim.l2_regularizer(1e-4),
                weights_initializer=slim.variance_scaling_initializer(seed=_SEED),
                activation_fn=tf.nn.relu,
                normalizer_fn=_slim_fused_batch_norm,
                normalizer_params=bn_params,
            ), slim.arg_scope([slim.max_pool2d], padding="SAME"):
                logits, _ = resnet_v1.resnet_v1_50(
                    images, num_classes=1000, is_training=True, scope="resnet_v1_50"
                )

        logits = tf.squeeze(logits, axis=[1, 2], name="logits")
        fetches = _momentum_classifier_training(logits, labels)
    return ModelGraph(
        "tf1_resnet50_training", _finish_training_graph(graph), fetches, _image_feeds(batch, 224, 2), "training"
    )


def tf1_inception_v3_training(batch: int = 2) -> ModelGraph:
    """Builds a tf-slim Inception v3 training graph at 299x299 (about 15.8k nodes).

    ``tf_slim.nets.inception_v3.inception_v3`` (1000 classes, with its
    auxiliary logits) under the same conv/batch-norm arg scope as
    :func:`tf1_resnet50_training`, trained with momentum SGD. Replicated, it
    is the scale benchmark's real graph.
    """
    import tf_slim as slim
    from tf_slim.nets import inception_v3

    graph = tf.Graph()
    with graph.as_default():
        _v1.set_random_seed(_SEED)
        images = _v1.placeholder(tf.float32, [batch, 299, 299, 3], name="images")
        labels = _v1.placeholder(tf.int32, [batch], name="labels")
        bn_params = {"is_training": True, "decay": 0.997, "epsilon": 1e-5, "scale": True}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            with slim.arg_scope(
                [slim.conv2d, slim.fully_connected],
                weights_regularizer=slim.l2_regularizer(4e-5),
            ), slim.arg_scope(
                [slim.conv2d],
                weights_initializer=slim.variance_scaling_initializer(seed=_SEED),
                activation_fn=tf.nn.relu,
                normalizer_fn=_slim_fused_batch_norm,
                normalizer_params=bn_params,
            ):
                logits, _ = inception_v3.inception_v3(images, num_classes=1000, is_training=True)
        fetches = _momentum_classifier_training(logits, labels)
    return ModelGraph(
        "tf1_inception_v3_training", _finish_training_graph(graph), fetches, _image_feeds(batch, 299, 5), "training"
    )


def _momentum_classifier_training(logits, labels) -> tuple[str, str]:
    """Sparse softmax cross-entropy plus the regularization loss, minimized by momentum SGD.

    The step runs after ``UPDATE_OPS`` (batch-norm moving averages).
    Returns the names of the train op and the loss.
    """
    xent = _v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    loss = tf.identity(xent + _v1.losses.get_regularization_loss(), name="loss")
    global_step = _v1.train.get_or_create_global_step()
    optimizer = _v1.train.MomentumOptimizer(learning_rate=0.1, momentum=0.9)
    with tf.control_dependencies(_v1.get_collection(_v1.GraphKeys.UPDATE_OPS)):
        train_op = optimizer.minimize(loss, global_step=global_step, name="train_op")
    return train_op.name, loss.op.name


def _image_feeds(batch: int, size: int, seed_offset: int) -> dict[str, np.ndarray]:
    """Random ``images`` (batch, size, size, 3) and ImageNet ``labels`` for a classifier's placeholders."""
    rng = _rng(seed_offset)
    return {
        "images": rng.standard_normal((batch, size, size, 3), dtype=np.float32),
        "labels": rng.integers(0, 1000, size=(batch,), dtype=np.int32),
    }


def _layer_norm(x, name: str, epsilon: float = 1e-6):
    """Layer normalization over the last axis written with ``tf.nn.moments``."""
    with _v1.variable_scope(name):
        dim = x.shape[-1]
        gamma = _v1.get_variable("gamma", [dim], initializer=_v1.ones_initializer())
        beta = _v1.get_variable("beta", [dim], initializer=_v1.zeros_initializer())
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + epsilon) * gamma + beta


def tf1_transformer_block_training(
    batch: int = 2, seq: int = 16, d_model: int = 64, heads: int = 4
) -> ModelGraph:
    """Builds one post-norm transformer encoder block training graph.

    Multi-head self-attention (q/k/v projections, scaled dot-product with
    softmax, output projection), residual + layer norm, a GELU feed-forward
    network (4 * d_model hidden units), residual + layer norm, a
    mean-squared-error loss against a target placeholder and an Adam step.

    Args:
        batch: Batch size.
        seq: Sequence length.
        d_model: Model width; must be divisible by ``heads``.
        heads: Number of attention heads.

    Returns:
        The training ``ModelGraph``; fetches are the train op and the loss.
    """
    if d_model % heads:
        raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
    head_dim = d_model // heads

    graph = tf.Graph()
    with graph.as_default():
        _v1.set_random_seed(_SEED)
        inputs = _v1.placeholder(tf.float32, [batch, seq, d_model], name="inputs")
        targets = _v1.placeholder(tf.float32, [batch, seq, d_model], name="targets")

        with _v1.variable_scope("encoder_block"):
            flat = tf.reshape(inputs, [batch * seq, d_model])

            def split_heads(t):
                t = tf.reshape(t, [batch, seq, heads, head_dim])
                return tf.transpose(t, [0, 2, 1, 3])  # [batch, heads, seq, head_dim]

            with _v1.variable_scope("attention"):
                q = split_heads(_dense(flat, d_model, "query"))
                k = split_heads(_dense(flat, d_model, "key"))
                v = split_heads(_dense(flat, d_model, "value"))
                scores = tf.matmul(q, k, transpose_b=True) * (1.0 / float(np.sqrt(head_dim)))
                weights = tf.nn.softmax(scores, axis=-1)
                context = tf.matmul(weights, v)  # [batch, heads, seq, head_dim]
                context = tf.reshape(
                    tf.transpose(context, [0, 2, 1, 3]), [batch * seq, d_model]
                )
                attn_out = _dense(context, d_model, "output")

            h = _layer_norm(flat + attn_out, "attention_norm")

            with _v1.variable_scope("ffn"):
                ff = _dense(h, 4 * d_model, "intermediate", activation=tf.nn.gelu)
                ff = _dense(ff, d_model, "output")

            out = _layer_norm(h + ff, "ffn_norm")
            out = tf.reshape(out, [batch, seq, d_model], name="output")

        loss = tf.identity(tf.reduce_mean(tf.math.squared_difference(out, targets)), name="loss")

        global_step = _v1.train.get_or_create_global_step()
        optimizer = _v1.train.AdamOptimizer(learning_rate=1e-3)
        train_op = optimizer.minimize(loss, global_step=global_step, name="train_op")
        fetches = (train_op.name, loss.op.name)

    rng = _rng(3)
    feeds = {
        "inputs": rng.standard_normal((batch, seq, d_model), dtype=np.float32),
        "targets": rng.standard_normal((batch, seq, d_model), dtype=np.float32),
    }
    return ModelGraph(
        "tf1_transformer_block_training",
        _finish_training_graph(graph),
        fetches,
        feeds,
        "training",
    )


# --------------------------------------------------------------------------
# Frozen inference graphs
# --------------------------------------------------------------------------


def _freeze_keras_model(name: str, make_model: Callable[[], object]) -> ModelGraph:
    """Freezes a Keras 3 model called in a batch-1 ``tf.function``."""
    import keras
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    # Reset layer-name counters and seed the weight initializers so that
    # repeated builds produce identical graphs and constants.
    keras.backend.clear_session()
    keras.utils.set_random_seed(_SEED)
    model = make_model()

    @tf.function(input_signature=[tf.TensorSpec([1, 224, 224, 3], tf.float32, name="input")])
    def serve(x):
        return model(x, training=False)

    frozen = convert_variables_to_constants_v2(serve.get_concrete_function())
    graph_def = frozen.graph.as_graph_def()
    feed_names = [t.name.split(":")[0] for t in frozen.inputs]
    fetches = tuple(t.name.split(":")[0] for t in frozen.outputs)
    rng = _rng(4)
    feeds = {
        n: rng.uniform(-1.0, 1.0, size=(1, 224, 224, 3)).astype(np.float32)
        for n in feed_names
    }
    keras.backend.clear_session()
    return ModelGraph(name, graph_def, fetches, feeds, "inference")


def keras_resnet50_frozen() -> ModelGraph:
    """Builds a frozen Keras ResNet50 (random weights) inference graph.

    Returns:
        The inference ``ModelGraph`` with input ``[1, 224, 224, 3]``; fetches
        are the frozen function's output nodes.
    """
    import keras

    return _freeze_keras_model(
        "keras_resnet50_frozen",
        lambda: keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3)),
    )


def keras_mobilenetv2_frozen() -> ModelGraph:
    """Builds a frozen Keras MobileNetV2 (random weights) inference graph.

    Returns:
        The inference ``ModelGraph`` with input ``[1, 224, 224, 3]``; fetches
        are the frozen function's output nodes.
    """
    import keras

    return _freeze_keras_model(
        "keras_mobilenetv2_frozen",
        lambda: keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3)),
    )


def small_mlp_inference() -> ModelGraph:
    """Builds a tiny frozen MLP inference graph.

    ``[None, 32]`` placeholder -> dense 64 relu -> dense 64 tanh -> dense 10
    -> softmax, with all weights as ``Const`` nodes.

    Returns:
        The inference ``ModelGraph``; the fetch is the softmax node.
    """
    rng = _rng(5)
    sizes = [(32, 64), (64, 64), (64, 10)]
    params = [
        (
            (rng.standard_normal(shape) * np.sqrt(1.0 / shape[0])).astype(np.float32),
            (rng.standard_normal(shape[1]) * 0.1).astype(np.float32),
        )
        for shape in sizes
    ]
    activations = [(tf.nn.relu, "Relu"), (tf.nn.tanh, "Tanh"), (None, None)]

    graph = tf.Graph()
    with graph.as_default():
        x = _v1.placeholder(tf.float32, [None, 32], name="input")
        for i, ((w, b), (act, act_name)) in enumerate(zip(params, activations), start=1):
            with tf.name_scope(f"dense{i}"):
                x = tf.matmul(x, tf.constant(w, name="kernel"), name="MatMul")
                x = tf.nn.bias_add(x, tf.constant(b, name="bias"), name="BiasAdd")
                if act is not None:
                    x = act(x, name=act_name)
        probs = tf.nn.softmax(x, name="probs")

    feeds = {"input": _rng(6).standard_normal((4, 32), dtype=np.float32)}
    return ModelGraph(
        "small_mlp_inference", graph.as_graph_def(), (probs.op.name,), feeds, "inference"
    )


#: The large models used for benchmarking, by name.
# --------------------------------------------------------------------------
# Loop graphs
# --------------------------------------------------------------------------


def tf_function_while_rnn(steps: int = 20, batch: int = 8, units: int = 64) -> ModelGraph:
    """A tf.function running an Elman RNN in ``tf.while_loop`` (a StatelessWhile in the library).

    The input and recurrent weights are captured constants, so they enter the
    loop as loop-invariant loop variables.
    """
    rng = _rng(7)
    graph = tf.Graph()
    with graph.as_default():
        xs = _v1.placeholder(tf.float32, [steps, batch, units], name="inputs")
        w = tf.constant(rng.standard_normal((units, units)).astype(np.float32) * 0.1, name="w")
        u = tf.constant(rng.standard_normal((units, units)).astype(np.float32) * 0.1, name="u")

        @tf.function
        def rnn(inputs):
            def body(i, h):
                return i + 1, tf.tanh(tf.matmul(inputs[i], w) + tf.matmul(h, u))

            return tf.while_loop(lambda i, h: i < steps, body, [0, tf.zeros([batch, units])])[1]

        tf.identity(rnn(xs), name="state")
    feeds = {"inputs": rng.standard_normal((steps, batch, units)).astype(np.float32)}
    return ModelGraph("tf_function_while_rnn", graph.as_graph_def(), ("state",), feeds, "inference")


def tf1_lstm_training(steps: int = 12, batch: int = 8, units: int = 64) -> ModelGraph:
    """A TF1 ``dynamic_rnn`` LSTM (v1 while loop, TensorArrays) trained with Adam."""
    from tensorflow.python.ops import control_flow_util
    from tf_keras.src.layers.rnn import legacy_cells

    rng = _rng(8)
    graph = tf.Graph()
    old = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        with graph.as_default(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _v1.set_random_seed(_SEED)
            x = _v1.placeholder(tf.float32, [batch, steps, units], name="x")
            target = _v1.placeholder(tf.float32, [batch, units], name="target")
            outputs, _ = _v1.nn.dynamic_rnn(legacy_cells.LSTMCell(units), x, dtype=tf.float32)
            loss = tf.reduce_mean(tf.square(outputs[:, -1] - target), name="loss")
            _v1.train.AdamOptimizer(0.01).minimize(loss, name="train_op")
        graph_def = _finish_training_graph(graph)
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = old
    feeds = {"x": rng.standard_normal((batch, steps, units)).astype(np.float32),
             "target": rng.standard_normal((batch, units)).astype(np.float32)}
    return ModelGraph("tf1_lstm_training", graph_def, ("train_op", "loss"), feeds, "training")


def bert_like_inference(layers: int = 2, batch: int = 2, seq: int = 32, d_model: int = 128,
                        heads: int = 4) -> ModelGraph:
    """A frozen BERT-like encoder: token embedding, attention and GELU FFN layers with layer norms."""
    rng = _rng(9)
    graph = tf.Graph()
    depth = d_model // heads

    def const(shape, scale=0.05):
        return tf.constant(rng.standard_normal(shape).astype(np.float32) * scale)

    def layer_norm(x):
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + 1e-12) * const([d_model], 0.1) + 1.0

    with graph.as_default():
        tokens = _v1.placeholder(tf.int32, [batch, seq], name="tokens")
        h = tf.gather(const([1000, d_model], 1.0), tokens)
        for i in range(layers):
            with tf.name_scope(f"layer_{i}"):
                def split(t):
                    return tf.transpose(tf.reshape(t, [batch, seq, heads, depth]), [0, 2, 1, 3])

                q, k, v = (split(tf.einsum("bsd,de->bse", h, const([d_model, d_model]))) for _ in range(3))
                scores = tf.matmul(q, k, transpose_b=True) / float(np.sqrt(depth))
                context = tf.matmul(tf.nn.softmax(scores), v)
                context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch, seq, d_model])
                h = layer_norm(h + tf.einsum("bsd,de->bse", context, const([d_model, d_model])))
                ffn = tf.nn.gelu(tf.einsum("bsd,df->bsf", h, const([d_model, 4 * d_model])))
                h = layer_norm(h + tf.einsum("bsf,fd->bsd", ffn, const([4 * d_model, d_model])))
        tf.identity(h, name="encoded")
    feeds = {"tokens": rng.integers(0, 1000, (batch, seq)).astype(np.int32)}
    return ModelGraph("bert_like_inference", graph.as_graph_def(), ("encoded",), feeds, "inference")


ALL_BENCHMARK_MODELS: dict[str, Callable[[], ModelGraph]] = {
    "tf1_resnet50_training": tf1_resnet50_training,
    "keras_resnet50_frozen": keras_resnet50_frozen,
    "keras_mobilenetv2_frozen": keras_mobilenetv2_frozen,
    "tf1_transformer_block_training": tf1_transformer_block_training,
}


# --------------------------------------------------------------------------
# Running and verification
# --------------------------------------------------------------------------


def run_model(model: ModelGraph, graph_def: tf.compat.v1.GraphDef | None = None, steps: int = 1):
    """Imports a model's GraphDef into a fresh graph and runs its fetches.

    Training graphs are initialized by running :data:`INIT_OP_NAME` first.

    Args:
        model: The model whose feeds and fetches are used.
        graph_def: Graph to run instead of ``model.graph_def`` (e.g. a
            rewritten version with the same node names).
        steps: How many times to run the fetches.

    Returns:
        The fetched values of the last run, one per fetch (``None`` for
        operations without outputs).
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def or model.graph_def, name="")
    targets = []
    for name in model.fetches:
        op = graph.get_operation_by_name(name)
        targets.append(op.outputs[0] if op.outputs else op)
    feed_dict = {graph.get_tensor_by_name(f"{k}:0"): v for k, v in model.feeds.items()}
    results = None
    with _v1.Session(graph=graph) as sess:
        if model.kind == "training":
            sess.run(graph.get_operation_by_name(INIT_OP_NAME))
        for _ in range(steps):
            results = sess.run(targets, feed_dict=feed_dict)
    return results


def _verify(name: str, builder: Callable[[], ModelGraph]) -> None:
    start = time.perf_counter()
    model = builder()
    build_s = time.perf_counter() - start
    again = builder()
    same = graph_def_bytes(model.graph_def) == graph_def_bytes(again.graph_def)
    start = time.perf_counter()
    values = run_model(model, steps=2)
    run_s = time.perf_counter() - start
    summary = ", ".join(
        f"{f}={np.asarray(v).ravel()[:1]}" if v is not None else f"{f}=<op>"
        for f, v in zip(model.fetches, values)
    )
    print(
        f"{name}: {len(model.graph_def.node)} nodes, build {build_s:.2f}s, "
        f"run x2 {run_s:.2f}s, deterministic={same}, feeds={list(model.feeds)}, {summary}"
    )


def main() -> None:
    """Builds, checks and runs every model, printing a summary line each."""
    builders = {
        "tf1_cnn_training": tf1_cnn_training,
        "small_mlp_inference": small_mlp_inference,
        **ALL_BENCHMARK_MODELS,
    }
    for name, builder in builders.items():
        _verify(name, builder)


if __name__ == "__main__":
    main()
