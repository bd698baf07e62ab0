"""Times one :class:`~amp_rewrite.tune.tuner.OpCase` on this machine, in float32 and in half.

One small graph holds both variants, fed by the same constants: the op as
it is, and the op with its half attrs retyped, a Cast before each input and
after each output those attrs type. A session with every graph optimization
off (no constant folding, no Grappler) runs each variant as a target, so
nothing is copied out; the two alternate, run after run, so a neighbour's
load on a shared machine slows both alike. The answer is the fastest run of
each: another process's load only ever adds time, so the minimum is the
estimate least moved by it (medians on a busy two-core machine were seen to
swap which variant won). From each, the fastest run of an empty target (a
``NoOp``) is taken away: a session step costs tens of microseconds, which
would otherwise hide a small op's own time and make its two variants look
alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from amp_rewrite import tf_internals
from amp_rewrite.graph.facts import DT_FLOAT
from amp_rewrite.tune.cache import Timing

WARMUP_RUNS = 2
MIN_RUNS = 5
MAX_RUNS = 50
#: Stop adding runs once both variants together took this long.
TARGET_SECONDS = 0.5
#: After two runs each, stop when every half run is this many times slower
#: than every float32 run: more runs would not change the choice. (A half
#: variant that looks faster is always run to the end: a choice of half
#: must not rest on two runs.)
CLEAR_RATIO = 1.5
#: The least time a variant is said to take, once the empty step is taken away.
MIN_SECONDS = 1e-7
EMPTY_TARGET = "empty"
_DTYPES = {"float16": 19, "bfloat16": 14}


def measure(case, *, device_type: str = "CPU", clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Fastest seconds per run of ``case`` in float32, and in half with its Casts, on ``device_type``:0.

    ``case`` is an :class:`~amp_rewrite.tune.tuner.OpCase` or a
    :class:`~amp_rewrite.tune.regions.RegionCase`; each builds its graph.
    """
    import tensorflow as tf

    graph_def, float_targets, half_targets = case.benchmark_graph(f"/device:{device_type}:0")
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph, config=_unoptimized()) as session:
        float_op = [graph.get_operation_by_name(name) for name in float_targets]
        half_ops = [graph.get_operation_by_name(name) for name in half_targets]
        empty = graph.get_operation_by_name(EMPTY_TARGET)
        for _ in range(WARMUP_RUNS):
            tf_internals.run_unpatched(session, float_op)
            tf_internals.run_unpatched(session, half_ops)
        float_times: list[float] = []
        half_times: list[float] = []
        empty_times: list[float] = []
        while _wants_more(float_times, half_times):
            float_times.append(_timed(session, float_op, clock))
            half_times.append(_timed(session, half_ops, clock))
            empty_times.append(_timed(session, empty, clock))
    step = min(empty_times)
    return Timing(max(min(float_times) - step, MIN_SECONDS), max(min(half_times) - step, MIN_SECONDS))


def _wants_more(float_times: list[float], half_times: list[float]) -> bool:
    runs = len(float_times)
    if runs >= MAX_RUNS:
        return False
    if runs >= 2 and min(half_times) > CLEAR_RATIO * max(float_times):
        return False
    return runs < MIN_RUNS or sum(float_times) + sum(half_times) < TARGET_SECONDS


def _timed(session, fetch, clock) -> float:
    start = clock()
    tf_internals.run_unpatched(session, fetch)
    return clock() - start


def benchmark_graph(case, *, device: str):
    """The GraphDef of both variants, the float32 node's name, and the half variant's last nodes."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, tensor_pb2
    half = _DTYPES[case.target]
    op_def_registry, _ = tf_internals.op_registry_modules()
    op_def = op_def_registry.get(case.op)
    graph_def = graph_pb2.GraphDef()
    rng = np.random.default_rng(0)
    names = []
    for k, spec in enumerate(case.inputs):
        const = graph_def.node.add(name=f"input{k}", op="Const", device=device)
        const.attr["dtype"].type = spec.dtype
        if spec.value is not None:
            const.attr["value"].tensor.CopyFrom(tensor_pb2.TensorProto.FromString(spec.value))
        else:
            values = rng.uniform(0.5, 1.5, size=spec.shape).astype(np.float32)
            const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(values))
        names.append(const.name)
    float_node = node_def_pb2.NodeDef.FromString(case.node_def)
    float_node.name, float_node.device = "float32_op", device
    float_node.input.extend(names)
    half_node = node_def_pb2.NodeDef.FromString(case.node_def)
    half_node.name, half_node.device = "half_op", device
    for attr in case.half_attrs:
        half_node.attr[attr].CopyFrom(attr_value_pb2.AttrValue(type=half))
    for k, (arg, name) in enumerate(zip(_flat_args(op_def.input_arg, float_node), names)):
        if arg.type_attr in case.half_attrs and case.inputs[k].dtype == DT_FLOAT:
            graph_def.node.append(_cast(f"cast_in{k}", name, DT_FLOAT, half, device))
            name = f"cast_in{k}"
        half_node.input.append(name)
    graph_def.node.extend([float_node, half_node])
    graph_def.node.add(name=EMPTY_TARGET, op="NoOp", device=device)
    outs = []
    for port, arg in enumerate(_flat_args(op_def.output_arg, float_node)):
        if arg.type_attr in case.half_attrs:
            graph_def.node.append(_cast(f"cast_out{port}", f"half_op:{port}", half, DT_FLOAT, device))
            outs.append(f"cast_out{port}")
    return graph_def, "float32_op", outs or ["half_op"]


def _flat_args(args, node) -> list:
    """One entry per tensor: an arg repeated for its ``number_attr`` length (the tuned ops have none)."""
    flat = []
    for arg in args:
        count = node.attr[arg.number_attr].i if arg.number_attr else 1
        flat.extend([arg] * count)
    return flat


def _cast(name: str, source: str, src: int, dst: int, device: str):
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name=name, op="Cast", device=device, input=[source])
    node.attr["SrcT"].type = src
    node.attr["DstT"].type = dst
    node.attr["Truncate"].b = False
    return node


def _unoptimized():
    """Session options that run the graph as built: no constant folding, no Grappler."""
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2

    config = tf.compat.v1.ConfigProto()
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    config.graph_options.optimizer_options.do_constant_folding = False
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.rewrite_options.constant_folding = rewriter_config_pb2.RewriterConfig.OFF
    return config
