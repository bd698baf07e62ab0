"""``AMP_REWRITE_PROFILE`` on a benchmark model of ``models.py``: the table one profiled session step prints.

Enables the runtime (float16 unless ``--target``; on a CPU without fast half
``auto`` would leave the script float32) with ``profile_after=N``, imports
the model's GraphDef into a session, initializes a training model, and runs
N + 2 steps of its fetches; the table goes to stderr after step N.

Usage: python tools/benchmarks/bench_profile_step.py [--model tf1_cnn_training] [--after 3] [--target float16]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402
import tensorflow as tf  # noqa: E402

from amp_rewrite import runtime  # noqa: E402
from amp_rewrite.runtime.settings import RuntimeSettings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tf1_cnn_training")
    parser.add_argument("--after", type=int, default=3)
    parser.add_argument("--target", choices=("float16", "bfloat16"), default="float16")
    args = parser.parse_args()
    model = getattr(models, args.model)()
    runtime.enable(settings=RuntimeSettings(target=args.target, profile_after=args.after))
    try:
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(model.graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as sess:
            steps = args.after + 2
            if model.kind == "training":
                sess.run(graph.get_operation_by_name(models.INIT_OP_NAME))
                steps -= 1  # the initializer's run is the session's first step
            feeds = {graph.get_tensor_by_name(f"{name}:0"): value for name, value in model.feeds.items()}
            fetches = [graph.get_operation_by_name(name) for name in model.fetches]
            for _ in range(steps):
                sess.run(fetches, feeds)
    finally:
        runtime.disable()


if __name__ == "__main__":
    main()
