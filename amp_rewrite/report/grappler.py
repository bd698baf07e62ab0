"""TensorFlow's own Grappler auto-mixed-precision pass, run for comparison.

Grappler's CPU mode (``auto_mixed_precision_cpu``) emulates half by default,
wrapping every half tensor in a pair of Casts; with
``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16=0`` it retypes ops as it
would on a GPU. :func:`grappler_rewrite` sets that variable for the call.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

from amp_rewrite import tf_internals
from amp_rewrite.environment import EMULATE_FP16_ENV
from amp_rewrite.graph.facts import node_name

EMULATE_ENV = EMULATE_FP16_ENV


@contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def grappler_rewrite(graph_def, fetches, *, optimizer: str = "auto_mixed_precision_cpu"):
    """Runs Grappler's pass alone on ``graph_def``; returns (rewritten GraphDef, seconds).

    Args:
        graph_def: the float32 graph.
        fetches: node names to preserve (as a ``train_op`` collection).
        optimizer: the Grappler optimizer name.
    """
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2

    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    meta.collection_def["train_op"].node_list.value.extend(
        sorted({node_name(f) for f in fetches}))
    config = config_pb2.ConfigProto()
    rewrite_options = config.graph_options.rewrite_options
    rewrite_options.optimizers.append(optimizer)
    rewrite_options.min_graph_nodes = -1
    with _env(EMULATE_ENV, "0"):
        start = time.perf_counter()
        result = tf_internals.optimize_graph(config, meta)
        seconds = time.perf_counter() - start
    return result, seconds
