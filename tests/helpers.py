"""Shared test helpers: build, run and inspect graphs."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import numpy as np
import tensorflow as tf

from amp_rewrite import Config, rewrite

tf1 = tf.compat.v1
# The suite's folder and the checkout it sits in (tools/, the example graph), wherever that is.
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
F32, F16, BF16 = tf.float32.as_datatype_enum, tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum
HALF_TYPES = (F16, BF16)

# Tests run the rewritten graphs on this CPU, so they paint for CPU kernels.
CPU = Config(device_type="CPU")


def amp(graph_def, fetches=None, **fields):
    """Rewrites with a CPU config (plus ``fields``) and returns the RewriteResult."""
    from dataclasses import replace

    return rewrite(graph_def, fetches=fetches, config=replace(CPU, **fields))


def node_types(graph_def) -> dict[str, int]:
    """Node name → its main dtype attr (T, else dtype, else DstT), or 0."""
    out = {}
    for node in graph_def.node:
        for attr in ("T", "dtype", "DstT"):
            if attr in node.attr and node.attr[attr].type:
                out[node.name] = node.attr[attr].type
                break
        else:
            out[node.name] = 0
    return out


def half_nodes(graph_def) -> set[str]:
    """Names of nodes with any type attr (or list entry) in a half type, Casts excluded."""
    names = set()
    for node in graph_def.node:
        if node.op == "Cast":
            continue
        for value in node.attr.values():
            if value.type in HALF_TYPES or any(t in HALF_TYPES for t in value.list.type):
                names.add(node.name)
    return names


def casts(graph_def) -> list:
    return [n for n in graph_def.node if n.op == "Cast"]


def run(graph_def, fetches, feeds=None, init: str | None = None):
    """Runs ``fetches`` (tensor or node names) of ``graph_def`` in a fresh session on CPU."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    feeds = feeds or {}
    feed_dict = {graph.get_tensor_by_name(_tensor(k)): v for k, v in feeds.items()}
    with tf1.Session(graph=graph) as sess:
        if init:
            sess.run(graph.get_operation_by_name(init))
        return sess.run([_fetch(graph, f) for f in fetches], feed_dict)


def _tensor(name: str) -> str:
    return name if ":" in name else name + ":0"


def _fetch(graph, name):
    if ":" in name:
        return graph.get_tensor_by_name(name)
    op = graph.get_operation_by_name(name)
    return op.outputs[0] if op.outputs else op


def assert_same_outputs_within_half(original, rewritten, fetches, feeds=None, *, rtol=2e-2, atol=2e-2):
    """Runs both graphs on the same feeds; outputs keep their dtype and agree within half tolerance."""
    want = run(original, fetches, feeds)
    got = run(rewritten, fetches, feeds)
    for name, w, g in zip(fetches, want, got):
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype} != {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)
    return want, got


@contextlib.contextmanager
def v1_control_flow():
    """Builds tf.compat.v1.while_loop/cond as Enter/Merge/Switch/NextIteration while active."""
    from tensorflow.python.ops import control_flow_util

    old = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = old


def mlp_session_graph():
    """A TF1 graph for session tests.

    x → mm1 (allow) → relu1 → mm2 → y, a NoOp ``marker``, two variables and
    an initialiser.
    """
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        w1 = tf1.get_variable("w1", [8, 16], initializer=tf1.initializers.random_normal(seed=1))
        w2 = tf1.get_variable("w2", [16, 4], initializer=tf1.initializers.random_normal(seed=2))
        relu1 = tf.nn.relu(tf.matmul(x, w1, name="mm1"), name="relu1")
        tf.matmul(relu1, w2, name="y")
        tf.no_op(name="marker")
        tf1.global_variables_initializer()
    return graph


def function_call_graph():
    """x → allow_main → a ``tf.function`` (allow_in_fn → clr_in_fn) → out; returns the GraphDef."""
    @tf.function
    def block(x):
        return tf.nn.relu(tf.matmul(x, tf.ones([8, 8]) * 0.1, name="allow_in_fn"), name="clr_in_fn")

    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        h = tf.matmul(x, tf.ones([8, 8]) * 0.2, name="allow_main")
        tf.identity(block(h), name="out")
    return g.as_graph_def()


# Grappler's pass paints an infer op after an allow op since TensorFlow 2.20; the
# Grappler of TensorFlow 2.16 to 2.19 leaves it float32 (the bundled lists follow 2.21).
GRAPPLER_INFERS_AFTER_ALLOW = tuple(int(part) for part in tf.__version__.split(".")[:2]) >= (2, 20)


@contextlib.contextmanager
def like_this_grappler():
    """Our painting as this TensorFlow's Grappler paints: before 2.20, without the infer-after-allow step."""
    from amp_rewrite.paint import rules as painting

    saved = painting.SPREAD_RULES
    if not GRAPPLER_INFERS_AFTER_ALLOW:
        painting.SPREAD_RULES = tuple(rule for rule in saved if rule is not painting.paint_infer_after_allow)
    try:
        yield
    finally:
        painting.SPREAD_RULES = saved


def two_region_step(*, all_reduce: bool = False):
    """A tf.function training step of two MatMuls, ``fast`` and ``slow``, that an Exp (float32) parts into two half
    regions; it returns its loss, or with ``all_reduce`` an all-reduce of it (a collective of a group of one,
    which runs in this process alone)."""
    rng = np.random.default_rng(0)
    w1 = tf.Variable(rng.normal(0, 0.1, (64, 64)).astype(np.float32))
    w2 = tf.Variable(rng.normal(0, 0.1, (64, 64)).astype(np.float32))
    x = tf.constant(rng.normal(0, 1, (16, 64)).astype(np.float32))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            hidden = tf.exp(tf.nn.relu(tf.matmul(x, w1, name="fast")) * 0.1)
            loss = tf.reduce_mean(tf.square(tf.matmul(hidden, w2, name="slow")))
        for w, g in zip((w1, w2), tape.gradient(loss, [w1, w2])):
            w.assign_sub(0.01 * g)
        if not all_reduce:
            return loss
        return tf.raw_ops.CollectiveReduceV2(input=loss, group_size=1, group_key=1, instance_key=1,
                                             ordering_token=[], merge_op="Add", final_op="Id")

    return step


def unscaled_graph_def(graph_def):
    """A TF1 step's GraphDef without its loss scaling: the float32 variant a session trial runs (it must hold some)."""
    from amp_rewrite.runtime.loss_scale.unscaled import unscaled_nodes

    nodes = unscaled_nodes(graph_def.node)
    assert nodes is not None
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    del out.node[:]
    out.node.extend(nodes)
    return out


def rng(seed=0):
    return np.random.default_rng(seed)


@contextlib.contextmanager
def float32_as_float32():
    """float32 products in float32 while active: on a GPU TensorFlow runs them as TF32 (10 mantissa bits, as
    float16's) unless told not to, and a reference for half must not carry half's rounding itself."""
    was = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(was)


# A line amp-rewrite wrote: the CLI's "amp-rewrite: ..." or a log record of an
# amp_rewrite logger. A file path containing the checkout's folder name never
# matches, whatever that folder is called.
_OUR_LINE = re.compile(r"(^|\s)amp-rewrite: |(^|\s)amp_rewrite(\.\w+)+: ")


class ScheduledClock:
    """A fake clock for a trial: each step of a body takes that body's next cost, in the trial's schedule order.

    A timed step reads the clock twice (before and after), so every second
    read moves time on. Given one cost per body it is repeated for every step.
    """

    def __init__(self, half, float32, rounds: int = 4):
        from amp_rewrite.tune.trial import schedule

        order = schedule(rounds=rounds)
        costs = {"half": _costs(half, order.count("half")), "float32": _costs(float32, order.count("float32"))}
        self.durations = iter([next(costs[body]) for body in order])
        self.now, self.reads = 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:
            self.now += next(self.durations)
        return self.now


class KeyValueStore:
    """The coordination service's key-value store as a multi-worker job sees it, shared by threads.

    Inserts never overwrite a key; reads wait up to their timeout for it.
    """

    def __init__(self):
        import threading

        self.values = {}
        self.changed = threading.Condition()

    def insert(self, key, value):
        with self.changed:
            if key in self.values:
                return False
            self.values[key] = value
            self.changed.notify_all()
            return True

    def read(self, key, timeout_seconds):
        with self.changed:
            self.changed.wait_for(lambda: key in self.values, timeout=timeout_seconds)
            return self.values.get(key)


def _costs(costs, count: int):
    return iter([float(costs)] * count if isinstance(costs, (int, float)) else costs)


def our_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` amp-rewrite wrote; TensorFlow's banner and warnings are not among them."""
    return [line for line in stderr.splitlines() if _OUR_LINE.search(line)]


def assert_one_line_error(stderr: str, message: str) -> str:
    """Our output is exactly one line, holding ``message``, and no traceback; returns that line."""
    lines = our_lines(stderr)
    assert len(lines) == 1 and message in lines[0], stderr
    assert lines[0].startswith("amp-rewrite: error: "), stderr
    assert "Traceback (most recent call last)" not in stderr, stderr
    return lines[0]


def runner_of(sess):
    """The enabled runtime's runner of ``sess`` (its shadow graph and session); None when it has none."""
    from amp_rewrite import runtime

    active = runtime.current_runtime()
    return active.objects.runners.get(sess) if active is not None else None


def loss_scale_reports(graph) -> tuple:
    """The loss-scale reports the enabled runtime keeps for ``graph`` (one per guarded step built in it)."""
    from amp_rewrite import runtime

    active = runtime.current_runtime()
    return active.objects.loss_scale_reports.get(graph, ()) if active is not None else ()
