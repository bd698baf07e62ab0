"""Our rewritten Keras training step beside Keras's mixed-precision policy's, op type by op type.

For each model of ``tools/benchmarks/bench_keras_policy.py`` (a CNN, ResNet-50, a
mini-GPT) child processes each train one step with ``fit`` and write the
training step's graph:

- ``float32``: the step as Keras traces it, no amp-rewrite;
- ``policy``: the same under Keras's ``mixed_bfloat16`` (``--target
  bfloat16``, the default) or ``mixed_float16`` global policy;
- ``ours``: float32 under ``ENABLE_AUTO_MP=1 AMP_REWRITE_TARGET=<target>``, the
  graph our runtime rewrote that traced step into (from ``AMP_REWRITE_DUMP_DIR``),
  with float16's loss scaling unscaling and checking the gradients one by one
  (``AMP_LOSS_SCALE_GROUPED=0``, a CPU's default);
- ``ours joined`` (float16 only): the same with the gradients joined
  (``AMP_LOSS_SCALE_GROUPED=1``, a GPU's default).

The graphs do not depend on the machine (the target and the joining are
forced), so this runs on any CPU and shows what a GPU would launch. Per model
it prints, for every op type whose precision differs between the modes, how
many of its nodes compute in float32 and in half (``12f/3h``), then the
Casts: how many, and how many megabytes they read and write per step (from
the shapes TensorFlow traced; a Cast of ours is named after the tensor it
casts, whose shape the float32 trace knows), and which ops their inputs come
from, the heaviest first; then the ops each mode ran per step (2 steps under
TensorFlow's profiler, on this CPU, after 10 that trace the step and get
past the skips of float16's first loss scales) that
would launch a kernel on a GPU (all but constants, aliases, shape and
variable-handle work: the launches a step bound by them pays), and the op
types it ran more of than float32. Usage:
``python tools/benchmarks/bench_policy_graphs.py [--models cnn resnet50 gpt] [--target bfloat16|float16]
[--out FILE.json]``.
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
import profiling  # noqa: E402
from bench_auto_mp import clean_environment  # noqa: E402

#: Steps before the profiled ones: float16's first steps may overflow the loss scale, and a skipped step runs
#: no update (and the skip's own ops); ResNet-50's policy and ours skip their first 3 to 5.
WARMUP = 10
PROFILED = 2

FLOAT = 1
_HALVES = {"bfloat16": (14, "bf16", "mixed_bfloat16"), "float16": (19, "f16", "mixed_float16")}
_SIZES = {FLOAT: 4, 14: 2, 19: 2}
#: float16 only: ours with the loss scaling's gradients joined (``AMP_LOSS_SCALE_GROUPED=1``, a GPU's default).
JOINED = "ours joined"
_SKIPPED = frozenset({"Const", "NoOp", "Identity", "IdentityN", "Placeholder", "_Arg", "_Retval"})
#: Ops that, on a GPU, launch no kernel (shape and handle work on the host, aliases): left out of the op count.
_HOST = _SKIPPED | {"Shape", "ShapeN", "Size", "Rank", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
                    "ReadVariableOp", "VarHandleOp", "BroadcastGradientArgs", "PreventGradient"}


def worker(model_name: str, mode: str, out: str, target: str = "bfloat16") -> None:
    """Trains ``model_name`` for 12 steps, the last 2 under the profiler; writes the step's GraphDef and counts.

    Next to the GraphDef: the traced tensor sizes (``.sizes.json``) and the
    ops the profiled steps ran, per type and step (``.ran.json``).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    if mode == "policy":
        keras.mixed_precision.set_global_policy(_HALVES[target][2])
    keras.utils.set_random_seed(0)
    model, batch, (x, y) = getattr(bench, model_name)(WARMUP + PROFILED)
    timer = profiling.step_timer(warmup=WARMUP, profile_epoch=0, profile_batch=WARMUP, profiled=PROFILED)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[timer])
    Path(out + ".ran.json").write_text(json.dumps({op: row["count"] for op, row in timer.op_types.items()}))
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


def run_mode(model_name: str, mode: str, work: Path, target: str) -> tuple[bytes, dict, dict]:
    """The GraphDef bytes of the step in ``mode``, the traced sizes (for ``ours``: the float32 trace's), the ops run."""
    out = str(work / f"{model_name}-{mode}-{target}.pb")
    env = clean_environment()
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
    dump = work / f"{model_name}-{target}-{mode}-dump"
    if mode.startswith("ours"):
        # no step trial: the profiled steps run the rewritten step, whatever this machine would choose
        env.update(ENABLE_AUTO_MP="1", AMP_REWRITE_TARGET=target, AMP_REWRITE_DUMP_DIR=str(dump),
                   AMP_LOSS_SCALE_GROUPED="1" if mode == JOINED else "0", AMP_REWRITE_TUNE="0")
    subprocess.run([sys.executable, __file__, "--worker", model_name, mode, out, target], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sizes = json.loads(Path(out + ".sizes.json").read_text())
    ran = json.loads(Path(out + ".ran.json").read_text())
    if not mode.startswith("ours"):
        return Path(out).read_bytes(), sizes, ran
    for path in sorted(dump.glob("*_after.pb")):  # the step traced above, as the runtime rewrote it
        if any(f.signature.name.startswith("__inference_train_step_")
               for f in _graph_def(path.read_bytes()).library.function):
            return path.read_bytes(), sizes, ran
    raise RuntimeError(f"{model_name}: the runtime dumped no rewrite of train_step")


def _graph_def(graph_bytes: bytes):
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef.FromString(graph_bytes)


def nodes_of(graph_bytes: bytes) -> list:
    graph_def = _graph_def(graph_bytes)
    return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]


def precision(node, half: int) -> str | None:
    for attr in ("T", "dtype", "DstT"):
        if attr in node.attr and node.attr[attr].type in (FLOAT, half):
            return "f" if node.attr[attr].type == FLOAT else "h"
    return None


def census(nodes: list, half: int) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for node in nodes:
        kind = precision(node, half)
        if node.op not in _SKIPPED and kind is not None:
            counts[(node.op, kind)] += 1
    return counts


def casts(nodes: list, sizes: dict, target: str) -> dict:
    """Count, megabytes read and written, and the producers' op types of the float32 ↔ ``target`` Casts."""
    half, short, _ = _HALVES[target]
    by_name = {node.name: node for node in nodes}
    count, total, unknown = 0, 0.0, 0
    producers: collections.Counter = collections.Counter()
    megabytes: collections.Counter = collections.Counter()
    for node in nodes:
        if node.op != "Cast":
            continue
        src, dst = node.attr["SrcT"].type, node.attr["DstT"].type
        if {src, dst} != {FLOAT, half}:
            continue
        count += 1
        source, _, port = node.input[0].partition(":")
        producer = by_name.get(source)
        key = f"{producer.op if producer else 'arg'} to {short if dst == half else 'f32'}"
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


def compare(model_name: str, work: Path, target: str) -> dict:
    modes = ("float32", "policy", "ours") + ((JOINED,) if target == "float16" else ())
    graphs = {mode: run_mode(model_name, mode, work, target) for mode in modes}
    float_sizes = graphs["float32"][1]
    result = {"census": {}, "casts": {}, "ops": {}}
    for mode, (graph_bytes, sizes, ran) in graphs.items():
        nodes = nodes_of(graph_bytes)
        result["census"][mode] = {f"{op}:{kind}": n
                                  for (op, kind), n in sorted(census(nodes, _HALVES[target][0]).items())}
        result["casts"][mode] = casts(nodes, float_sizes if mode.startswith("ours") else sizes, target)
        result["ops"][mode] = {op: round(n, 2) for op, n in ran.items() if op not in _HOST}
    return result


def table(model_name: str, result: dict) -> list[str]:
    modes = list(result["census"])
    ops = sorted({key.split(":")[0] for counts in result["census"].values() for key in counts})
    lines = [f"### {model_name}", "", "| op type | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for op in ops:
        cells = [f"{result['census'][m].get(op + ':f', 0)}f/{result['census'][m].get(op + ':h', 0)}h" for m in modes]
        if len(set(cells[1:])) > 1 or op == "Cast":
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
    lines.append("")
    for mode in modes:
        c = result["casts"][mode]
        top = ", ".join(f"{k} {c['producers'][k]} ({mb:g} MB)"
                        for k, mb in sorted(c["producer_mb"].items(), key=lambda kv: -kv[1])[:6])
        lines.append(f"- {mode}: {c['count']} Casts, {c['mb']} MB read and written per step"
                     + (f" ({c['unknown_sizes']} of unknown size)" if c["unknown_sizes"] else "") + f"; {top}")
    lines += ["", ops_lines(result["ops"])]
    return lines + [""]


def ops_lines(ops: dict[str, dict[str, float]]) -> str:
    """Each mode's ops run per step that would launch a GPU kernel, and the op types it runs more of than float32."""
    base = ops["float32"]
    parts = []
    for mode, counts in ops.items():
        more = sorted(((n - base.get(op, 0), op) for op, n in counts.items() if n > base.get(op, 0)), reverse=True)
        extra = ", ".join(f"{op} +{n:g}" for n, op in more[:8])
        parts.append(f"- {mode}: {sum(counts.values()):g} kernel ops run per step" + (f" ({extra})" if extra else ""))
    return "\n".join(parts)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(bench.MODELS), choices=bench.MODELS)
    parser.add_argument("--target", choices=sorted(_HALVES), default="bfloat16",
                        help="the half type: Keras's policy for it, and the runtime's target")
    parser.add_argument("--out", help="write the census and Casts as JSON here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_policy_graphs_") as work:
        for model_name in args.models:
            results[model_name] = compare(model_name, Path(work), args.target)
            print("\n".join(table(model_name, results[model_name])), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
