"""The pass does a bounded amount of work and memory per node: 4x the graph executes at most ~4x the lines.

Counting the lines of ``amp_rewrite`` that run (``sys.settrace``) is a
machine-independent measure of the Python work of a rewrite: a step that
loops over all nodes (or all functions) once per node (or per function)
shows up as a ratio near 16 between graphs of n and 4n nodes, where a linear
pass gives at most 4 (less, as fixed costs like loading the op lists do not
grow).
"""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import amp_rewrite
from amp_rewrite import Config, rewrite

tf = pytest.importorskip("tensorflow")

from tensorflow.core.framework import graph_pb2  # noqa: E402
from tensorflow.python.framework import tensor_util  # noqa: E402

DT_FLOAT = 1
DT_HALF = 19
PACKAGE = str(Path(amp_rewrite.__file__).resolve().parent)


def _const(node, value: np.ndarray) -> None:
    node.op = "Const"
    node.attr["dtype"].type = DT_FLOAT
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value))


def _typed(graph_def, name: str, op: str, inputs: list[str]) -> str:
    node = graph_def.node.add(name=name, op=op, input=inputs)
    node.attr["T"].type = DT_FLOAT
    return name


def dense_towers(towers: int, depth: int = 8):
    """Towers of MatMul → BiasAdd → Relu blocks, with an Exp (deny) added back every other block."""
    graph_def = graph_pb2.GraphDef()
    x = graph_def.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = DT_FLOAT
    rng = np.random.default_rng(0)
    _const(graph_def.node.add(name="w"), (rng.standard_normal((4, 4)) * 0.3).astype(np.float32))
    _const(graph_def.node.add(name="b"), np.full(4, 0.1, np.float32))
    fetches = []
    for t in range(towers):
        prev = _typed(graph_def, f"t{t}/in", "Identity", ["x"])
        for k in range(depth):
            p = f"t{t}/b{k}/"
            mm = _typed(graph_def, p + "allow_matmul", "MatMul", [prev, "w"])
            relu = _typed(graph_def, p + "infer_relu", "Relu", [_typed(graph_def, p + "bias", "BiasAdd", [mm, "b"])])
            prev = _typed(graph_def, p + "clr_identity", "Identity", [relu])
            if k % 2:
                exp = _typed(graph_def, p + "deny_exp", "Exp", [prev])
                prev = _typed(graph_def, p + "infer_add", "AddV2", [prev, exp])
        fetches.append(_typed(graph_def, f"t{t}/out", "Identity", [prev]))
    return graph_def, fetches


def called_towers(towers: int):
    """Each tower calls its own library function (MatMul → Relu): as many functions as towers."""
    graph_def = graph_pb2.GraphDef()
    x = graph_def.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = DT_FLOAT
    weight = (np.random.default_rng(1).standard_normal((4, 4)) * 0.3).astype(np.float32)
    fetches = []
    for t in range(towers):
        fdef = graph_def.library.function.add()
        fdef.signature.name = f"f{t}"
        fdef.signature.input_arg.add(name="x", type=DT_FLOAT)
        fdef.signature.output_arg.add(name="y", type=DT_FLOAT)
        _const(fdef.node_def.add(name="w"), weight)
        mm = fdef.node_def.add(name="allow_matmul", op="MatMul", input=["x", "w:output:0"])
        mm.attr["T"].type = DT_FLOAT
        relu = fdef.node_def.add(name="infer_relu", op="Relu", input=["allow_matmul:product:0"])
        relu.attr["T"].type = DT_FLOAT
        fdef.ret["y"] = "infer_relu:activations:0"
        call = graph_def.node.add(name=f"t{t}/call", op="PartitionedCall", input=["x"])
        call.attr["Tin"].list.type.append(DT_FLOAT)
        call.attr["Tout"].list.type.append(DT_FLOAT)
        call.attr["f"].func.name = f"f{t}"
        fetches.append(_typed(graph_def, f"t{t}/out", "Identity", [f"t{t}/call"]))
    return graph_def, fetches


def lines_executed(graph_def, fetches) -> int:
    """Lines of the package run by one rewrite and its report."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(PACKAGE) else None

    config = Config(device_type="CPU")
    rewrite(graph_def, fetches=fetches, config=config)  # caches (op lists, kernels) filled outside the count
    sys.settrace(tracer)
    try:
        result = rewrite(graph_def, fetches=fetches, config=config)
        _ = result.node_outcomes  # built lazily: counted with the rewrite
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize("make, n", [(dense_towers, 12), (called_towers, 60)], ids=["dense", "functions"])
def test_four_times_the_graph_runs_at_most_four_times_the_lines(make, n):
    small = lines_executed(*make(n))
    large = lines_executed(*make(4 * n))
    assert large / small <= 4.2, (small, large)


def python_bytes_per_node(graph_def, fetches) -> float:
    """Peak Python heap of one in-place rewrite (what tracemalloc sees: not protobuf's own memory), per node."""
    config = Config(device_type="CPU")
    rewrite(graph_def, fetches=fetches, config=config)  # caches filled outside the count
    work = type(graph_def)()
    work.CopyFrom(graph_def)
    tracemalloc.start()
    try:
        rewrite(work, fetches=fetches, config=config, in_place=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak / (len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function))


# The view holds several containers per node and vertex; a list where a tuple
# does, a second int object per vertex id, or a pair per decision shows here.
# At the time of writing: dense 0.95 kB, functions 1.6 kB per node (a quadratic
# structure would make the larger graph's figure about 4 times the smaller's).
@pytest.mark.parametrize("make, n, bound", [(dense_towers, 50, 1150), (called_towers, 200, 1850)],
                         ids=["dense", "functions"])
def test_python_memory_per_node_is_bounded_and_grows_linearly(make, n, bound):
    small = python_bytes_per_node(*make(n))
    large = python_bytes_per_node(*make(4 * n))
    assert large <= bound, (small, large)
    assert large / small <= 1.25, (small, large)


def run(graph_def, fetches, feed):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run([f + ":0" for f in fetches], {"x:0": feed})


@pytest.mark.parametrize("make", [dense_towers, called_towers], ids=["dense", "functions"])
def test_the_scaling_graphs_are_rewritten_and_compute_the_float32_values(make):
    graph_def, fetches = make(3)
    result = rewrite(graph_def, fetches=fetches, config=Config(device_type="CPU"))
    rewritten = result.graph_def
    nodes = {n.name: n for n in rewritten.node}
    functions = {f.signature.name: f for f in rewritten.library.function}
    for name, node in nodes.items():
        if "allow_matmul" in name:
            assert node.attr["T"].type == DT_HALF, name
        if "deny_exp" in name or name.endswith("/out"):
            assert node.attr["T"].type == DT_FLOAT, name
    for fdef in functions.values():
        for node in fdef.node_def:
            if node.op in ("MatMul", "Relu"):
                assert node.attr["T"].type == DT_HALF, (fdef.signature.name, node.name)
    feed = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    expected = run(graph_def, fetches, feed)
    got = run(rewritten, fetches, feed)
    for want, have in zip(expected, got):
        assert have.dtype == np.float32
        np.testing.assert_allclose(have, want, rtol=5e-3, atol=5e-3)
