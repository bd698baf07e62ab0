"""Casts inside loop bodies, ours against Grappler's, on two loop graphs.

The graphs (built by ``models.py``): a ``tf.function`` while-loop RNN of 20
steps, and a TF1 ``dynamic_rnn`` LSTM trained with Adam.

A Cast inside a loop body runs on every iteration; one outside runs once.
For each graph this prints the Casts each pass adds inside loop bodies (v1
while frames, and functions run as While bodies or conds) and in total, and
the rewrite's wall time (median of N runs).

Usage: python tools/benchmarks/bench_loop_casts.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402

from amp_rewrite import Config, rewrite  # noqa: E402
from amp_rewrite.graph.instances import WHILE_OPS  # noqa: E402
from amp_rewrite.graph.typed_graph import TypedGraph  # noqa: E402
from amp_rewrite.pipeline import v1_loop_nodes  # noqa: E402
from amp_rewrite.report.grappler import grappler_rewrite  # noqa: E402

LOOP_MODELS = {"tf_function_while_rnn": models.tf_function_while_rnn, "tf1_lstm_training": models.tf1_lstm_training}


def added_casts(original, rewritten) -> tuple[int, int]:
    """(Casts added inside loop bodies, Casts added in all) of ``rewritten`` against ``original``."""
    old_main = {n.name for n in original.node}
    old_functions = {f.signature.name: {n.name for n in f.node_def} for f in original.library.function}
    view = TypedGraph(rewritten)
    frame = v1_loop_nodes(view)
    loop_functions = _loop_functions(rewritten)
    inside = total = 0
    for i, node in enumerate(rewritten.node):
        if node.op == "Cast" and node.name not in old_main:
            total += 1
            inside += i in frame
    for fdef in rewritten.library.function:
        base = old_functions.get(fdef.signature.name, set())
        new = [n for n in fdef.node_def if n.op == "Cast" and n.name not in base]
        total += len(new)
        inside += len(new) if fdef.signature.name in loop_functions else 0
    return inside, total


def _loop_functions(graph_def) -> set[str]:
    """Functions run as a While body or cond, and every function they call."""
    library = {f.signature.name: f for f in graph_def.library.function}
    nodes = list(graph_def.node) + [n for f in library.values() for n in f.node_def]
    todo = [n.attr[a].func.name for n in nodes if n.op in WHILE_OPS for a in ("body", "cond")]
    found: set[str] = set()
    while todo:
        name = todo.pop()
        if name in found or name not in library:
            continue
        found.add(name)
        for node in library[name].node_def:
            todo.extend(v.func.name for v in node.attr.values() if v.func.name)
            todo.extend(f.name for v in node.attr.values() for f in v.list.func)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    print("| graph | nodes | casts in loop bodies ours / Grappler | casts in all ours / Grappler "
          "| time ours / Grappler (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name, build in LOOP_MODELS.items():
        model = build()
        fetches = list(model.fetches) + ([models.INIT_OP_NAME] if model.kind == "training" else [])
        config = Config(device_type="CPU")
        ours_times, theirs_times = [], []
        for _ in range(args.runs):
            start = time.perf_counter()
            ours = rewrite(model.graph_def, fetches=fetches, config=config).graph_def
            ours_times.append(time.perf_counter() - start)
            theirs, seconds = grappler_rewrite(model.graph_def, fetches)
            theirs_times.append(seconds)
        ours_in, ours_all = added_casts(model.graph_def, ours)
        theirs_in, theirs_all = added_casts(model.graph_def, theirs)
        print(f"| {name} | {len(model.graph_def.node)} | {ours_in} / {theirs_in} | {ours_all} / {theirs_all} "
              f"| {statistics.median(ours_times) * 1e3:.0f} / {statistics.median(theirs_times) * 1e3:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
