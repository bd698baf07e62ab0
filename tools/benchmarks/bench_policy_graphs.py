"""Our rewritten Keras training step beside Keras's ``mixed_bfloat16`` policy's, op type by op type.

For each model of ``tools/benchmarks/bench_keras_policy.py`` (a CNN, ResNet-50, a
mini-GPT) three child processes each train one step with ``fit`` and write
the training step's graph:

- ``float32``: the step as Keras traces it, no amp-rewrite;
- ``policy``: the same under ``keras.mixed_precision.set_global_policy("mixed_bfloat16")``;
- ``ours``: float32 under ``ENABLE_AUTO_MP=1 AMP_REWRITE_TARGET=bfloat16``, the
  graph our runtime rewrote that traced step into (from ``AMP_REWRITE_DUMP_DIR``).

The graphs do not depend on the CPU (the target is forced), so this runs on
any machine. Per model it prints, for every op type whose precision differs
between the three, how many of its nodes compute in float32 and in
bfloat16 (``12f/3b``), then the Casts: how many, and how many megabytes
they read and write per step (from the shapes TensorFlow traced; a Cast of
ours is named after the tensor it casts, whose shape the float32 trace
knows), and which ops their inputs come from, the heaviest first. Usage:
``python tools/benchmarks/bench_policy_graphs.py [--models cnn resnet50 gpt] [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_keras_policy as bench  # noqa: E402
from bench_auto_mp import clean_environment  # noqa: E402

FLOAT, BFLOAT = 1, 14
_SIZES = {FLOAT: 4, BFLOAT: 2}
_SKIPPED = frozenset({"Const", "NoOp", "Identity", "IdentityN", "Placeholder", "_Arg", "_Retval"})


def worker(model_name: str, mode: str, out: str) -> None:
    """Trains one step of ``model_name`` and writes its training step's GraphDef and tensor sizes."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    if mode == "policy":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    model, batch, (x, y) = getattr(bench, model_name)(1)
    model.fit(x[:batch], y[:batch], batch_size=batch, epochs=1, verbose=0)
    specs = (tf.TensorSpec((batch, *x.shape[1:]), tf.as_dtype(x.dtype)),
             tf.TensorSpec((batch, *y.shape[1:]), tf.as_dtype(y.dtype)))
    graph = tf.function(model.train_step).get_concrete_function(specs).graph
    sizes = {op.name: [_elements(t) for t in op.outputs] for op in graph.get_operations()}
    Path(out).write_bytes(graph.as_graph_def().SerializeToString())
    Path(out + ".sizes.json").write_text(json.dumps(sizes))


def _elements(tensor) -> int | None:
    shape = tensor.shape
    if shape.rank is None or not shape.is_fully_defined():
        return None
    count = 1
    for dim in shape.as_list():
        count *= dim
    return count


def run_mode(model_name: str, mode: str, work: Path) -> tuple[bytes, dict]:
    """The GraphDef bytes of the step in ``mode`` and the traced sizes (for ``ours``: the float32 trace's)."""
    out = str(work / f"{model_name}-{mode}.pb")
    env = clean_environment()
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
    dump = work / f"{model_name}-dump"
    if mode == "ours":
        env.update(ENABLE_AUTO_MP="1", AMP_REWRITE_TARGET="bfloat16", AMP_REWRITE_DUMP_DIR=str(dump))
    subprocess.run([sys.executable, __file__, "--worker", model_name, mode, out], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sizes = json.loads(Path(out + ".sizes.json").read_text())
    if mode != "ours":
        return Path(out).read_bytes(), sizes
    for path in sorted(dump.glob("*_after.pb")):  # the step traced above, as the runtime rewrote it
        if any(f.signature.name.startswith("__inference_train_step_")
               for f in _graph_def(path.read_bytes()).library.function):
            return path.read_bytes(), sizes
    raise RuntimeError(f"{model_name}: the runtime dumped no rewrite of train_step")


def _graph_def(graph_bytes: bytes):
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef.FromString(graph_bytes)


def nodes_of(graph_bytes: bytes) -> list:
    graph_def = _graph_def(graph_bytes)
    return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]


def precision(node) -> str | None:
    for attr in ("T", "dtype", "DstT"):
        if attr in node.attr and node.attr[attr].type in (FLOAT, BFLOAT):
            return "f" if node.attr[attr].type == FLOAT else "b"
    return None


def census(nodes: list) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for node in nodes:
        kind = precision(node)
        if node.op not in _SKIPPED and kind is not None:
            counts[(node.op, kind)] += 1
    return counts


def casts(nodes: list, sizes: dict) -> dict:
    """Count, megabytes read and written, and the producers' op types of the float32 ↔ bfloat16 Casts."""
    by_name = {node.name: node for node in nodes}
    count, total, unknown = 0, 0.0, 0
    producers: collections.Counter = collections.Counter()
    megabytes: collections.Counter = collections.Counter()
    for node in nodes:
        if node.op != "Cast":
            continue
        src, dst = node.attr["SrcT"].type, node.attr["DstT"].type
        if {src, dst} != {FLOAT, BFLOAT}:
            continue
        count += 1
        source, _, port = node.input[0].partition(":")
        producer = by_name.get(source)
        key = f"{producer.op if producer else 'arg'} to {'bf16' if dst == BFLOAT else 'f32'}"
        producers[key] += 1
        elements = _cast_elements(node, source, port, sizes)
        if elements is None:
            unknown += 1
        else:
            total += elements * (_SIZES[src] + _SIZES[dst]) / 1e6
            megabytes[key] += elements * (_SIZES[src] + _SIZES[dst]) / 1e6
    return {"count": count, "mb": round(total, 2), "unknown_sizes": unknown, "producers": dict(producers),
            "producer_mb": {key: round(mb, 2) for key, mb in megabytes.items()}}


def _cast_elements(node, source: str, port: str, sizes: dict) -> int | None:
    """The elements a Cast moves: its own traced size, else its input's (an inserted Cast reads a traced tensor)."""
    own = sizes.get(node.name)
    if own:
        return own[0]
    outputs = sizes.get(source)
    index = int(port) if port.isdigit() else 0
    return outputs[index] if outputs and index < len(outputs) else None


def compare(model_name: str, work: Path) -> dict:
    graphs = {mode: run_mode(model_name, mode, work) for mode in ("float32", "policy", "ours")}
    float_sizes = graphs["float32"][1]
    result = {"census": {}, "casts": {}}
    for mode, (graph_bytes, sizes) in graphs.items():
        nodes = nodes_of(graph_bytes)
        result["census"][mode] = {f"{op}:{kind}": n for (op, kind), n in sorted(census(nodes).items())}
        result["casts"][mode] = casts(nodes, float_sizes if mode == "ours" else sizes)
    return result


def table(model_name: str, result: dict) -> list[str]:
    modes = list(result["census"])
    ops = sorted({key.split(":")[0] for counts in result["census"].values() for key in counts})
    lines = [f"### {model_name}", "", "| op type | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for op in ops:
        cells = [f"{result['census'][m].get(op + ':f', 0)}f/{result['census'][m].get(op + ':b', 0)}b" for m in modes]
        if len(set(cells[1:])) > 1 or op == "Cast":
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
    lines.append("")
    for mode in modes:
        c = result["casts"][mode]
        top = ", ".join(f"{k} {c['producers'][k]} ({mb:g} MB)"
                        for k, mb in sorted(c["producer_mb"].items(), key=lambda kv: -kv[1])[:6])
        lines.append(f"- {mode}: {c['count']} Casts, {c['mb']} MB read and written per step"
                     + (f" ({c['unknown_sizes']} of unknown size)" if c["unknown_sizes"] else "") + f"; {top}")
    return lines + [""]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(bench.MODELS), choices=bench.MODELS)
    parser.add_argument("--out", help="write the census and Casts as JSON here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_policy_graphs_") as work:
        for model_name in args.models:
            results[model_name] = compare(model_name, Path(work))
            print("\n".join(table(model_name, results[model_name])), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
