"""``AMP_REWRITE_PROFILE=N``: profile one step after N, print one short table, never again.

For a TF1 session, :func:`watch_session` puts a counting ``run`` on the
session's runner; step N + 1 runs with ``RunOptions(trace_level=FULL_TRACE)``
and its ``RunMetadata`` step stats (op time, output dtype per node) make the
table. For a rewritten ``tf.function``, :meth:`FunctionProfiles.watch` puts a
counting ``_call_flat`` on the ConcreteFunction; eager call N + 1 runs under
``tf.profiler.experimental`` and the op events of the trace it writes make the
table, each op's precision read from the function's graph. A rewritten
function that another function calls inside its graph is never called
eagerly (Keras 3's ``fit`` calls its one-step function from its train
function): the caller, traced after it, is watched the same way, so the
profiled call is the first eager call after N that runs a rewritten body. If
no step was profiled by the time the runtime is disabled or the process
exits, one line says why. Either way the
watcher removes itself after that step, so later steps run exactly as
without it, and with the variable unset nothing is installed at all.

The table: the ops taking the most time with their precision, the Casts'
share of the step's op time, and the float32 ops costing the most. A
profile that fails logs one warning and training goes on.
"""

from __future__ import annotations

import atexit
import functools
import logging
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.tune.step_stats import PRECISIONS, OpTime, gpu_kernel_events, op_events, step_stats_ops

logger = logging.getLogger(__name__)

TOP_OPS = 8
TOP_FLOAT32 = 3
_DTYPES = PRECISIONS


def render_table(label: str, ops: list[OpTime]) -> list[str]:
    """The short table: top ops with precision, the Casts' share, the costliest float32 ops."""
    ops = sorted(ops, key=lambda o: (-o.micros, o.node))
    total = sum(o.micros for o in ops) or 1.0
    casts = [o for o in ops if o.op == "Cast"]
    cast_time = sum(o.micros for o in casts)
    lines = [f"amp-rewrite: profile of {label}: {len(ops)} ops, {total / 1e3:.2f} ms of op time; "
             f"Casts: {len(casts)} ops, {cast_time / total:.1%} of it",
             f"  {'ms':>8} {'share':>6}  {'precision':9} {'op':18} node"]
    lines += [f"  {o.micros / 1e3:8.3f} {o.micros / total:6.1%}  {o.precision:9} {o.op[:18]:18} {o.node}"
              for o in ops[:TOP_OPS]]
    float32 = [o for o in ops if o.precision == "float32" and o.op != "Cast"][:TOP_FLOAT32]
    lines.append("  costliest float32 ops: " + (", ".join(
        f"{o.node} ({o.op}, {o.micros / 1e3:.3f} ms, {o.micros / total:.1%})" for o in float32) or "none"))
    return lines


def _report(label: str, ops: list[OpTime]) -> None:
    if not ops:
        logger.warning("amp-rewrite: profile of %s: the trace holds no op times", label)
        return
    print("\n".join(render_table(label, ops)), file=sys.stderr, flush=True)


# -- TF1 sessions ---------------------------------------------------------------------------


def watch_session(runner, after: int) -> None:
    """Profiles step ``after + 1`` of the session ``runner`` (a ``ShadowRunner``) runs."""
    vars(runner)["run"] = _SessionWatch(runner, after)


class _SessionWatch:
    """The runner's ``run`` until the profiled step; then it removes itself."""

    def __init__(self, runner, after: int):
        self.runner = weakref.ref(runner)
        self.after = after
        self.steps = 0

    def __call__(self, original_run, session, fetches, feed_dict=None, options=None, run_metadata=None):
        runner: Any = self.runner()
        run = type(runner).run.__get__(runner)
        self.steps += 1
        if self.steps <= self.after or options is not None or run_metadata is not None:
            return run(original_run, session, fetches, feed_dict, options, run_metadata)
        vars(runner).pop("run", None)  # never again
        from tensorflow.core.protobuf import config_pb2

        options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE)
        metadata = config_pb2.RunMetadata()
        values = run(original_run, session, fetches, feed_dict, options, metadata)
        try:
            _report(f"session step {self.steps}", step_stats_ops(metadata.step_stats))
        except Exception as exc:  # noqa: BLE001 - a profile never stops training
            logger.warning("amp-rewrite: profile of session step %d failed: %s", self.steps, exc)
        return values


# -- TF2 functions ----------------------------------------------------------------------------


class FunctionProfiles:
    """The one profile a process takes of its rewritten tf.functions: the first to reach ``after`` calls.

    Attributes:
        after: the calls not profiled, per watched function.
        is_done: the profile was taken.
        callers: the graphs (of functions being traced) in which a watched function was called.
        most_calls: the most eager calls any watched function has had, to say why no profile was taken.
    """

    def __init__(self, after: int):
        self.after = after
        self.is_done = False
        self.callers: weakref.WeakSet = weakref.WeakSet()
        self.most_calls: int | None = None
        atexit.register(self.say_if_missed)

    def watch(self, concrete_function) -> None:
        """Counts the function's eager calls; profiles one call after ``after`` of them."""
        if not self.is_done:
            self.most_calls = self.most_calls or 0
            _FunctionWatch(self, concrete_function).install()

    def watch_if_caller(self, concrete_function) -> None:
        """Watches a function traced with a call of a watched one in its graph (it runs the rewritten body)."""
        if not self.is_done and concrete_function.graph in self.callers:
            self.watch(concrete_function)

    def note_call_in_graph(self) -> None:
        """A watched function was called while a graph is built: a function calling it is being traced."""
        import tensorflow as tf

        graph = tf.compat.v1.get_default_graph()
        if getattr(graph, "building_function", False):
            self.callers.add(graph)

    def note_eager_calls(self, calls: int) -> None:
        self.most_calls = max(self.most_calls or 0, calls)

    def say_if_missed(self) -> None:
        """One line when functions were watched but no step was profiled; then never again."""
        atexit.unregister(self.say_if_missed)
        if self.is_done or self.most_calls is None:
            return
        self.is_done = True
        why = (f"the rewritten tf.functions ran {self.most_calls} eager calls at most, not more than "
               f"{self.after}" if self.most_calls else "no rewritten tf.function was called eagerly, nor one "
               "calling it")
        logger.warning("amp-rewrite: AMP_REWRITE_PROFILE=%d: no step was profiled: %s", self.after, why)


class _FunctionWatch:
    """The function's ``_call_flat`` until the profiled call; then it removes itself.

    Whatever ``_call_flat`` the function had on itself (the first-call check)
    runs inside; when that one removes itself, this watcher stays.
    """

    def __init__(self, profiles: FunctionProfiles, concrete_function):
        self.profiles = profiles
        self.function = weakref.ref(concrete_function)
        self.inner: Callable | None = tf_internals.call_override(concrete_function)
        self.calls = 0

    def install(self) -> None:
        tf_internals.override_call(self.function(), self)

    def __call__(self, tensor_inputs, captured_inputs):
        import tensorflow as tf

        cf: Any = self.function()
        run = self.inner or functools.partial(tf_internals.call_concrete_function, cf)
        if not self.profiles.is_done and not tf.executing_eagerly():
            self.profiles.note_call_in_graph()
        if self.profiles.is_done or not tf.executing_eagerly():
            return self._finish(cf, run(tensor_inputs, captured_inputs))
        self.calls += 1
        self.profiles.note_eager_calls(self.calls)
        if self.calls <= self.profiles.after:
            return self._finish(cf, run(tensor_inputs, captured_inputs))
        self.profiles.is_done = True
        self._leave(cf)
        return profile_call(lambda: run(tensor_inputs, captured_inputs), cf, self.calls)

    def _finish(self, cf, outputs):
        """Stays installed when the inner call removed itself or handed over to another (and so this watcher)."""
        current = tf_internals.call_override(cf)
        if current is not self:
            self.inner = current
            if not self.profiles.is_done:
                self.install()
        elif self.profiles.is_done:
            self._leave(cf)
        return outputs

    def _leave(self, cf) -> None:
        """Gives the function back the call it had inside this watcher (the floor watch, say), or none."""
        if self.inner is None:
            tf_internals.drop_call_override(cf)
        else:
            tf_internals.override_call(cf, self.inner)


def profile_call(call: Callable, concrete_function, number: int):
    """Runs ``call`` under TensorFlow's profiler and reports the table; returns what it returned."""
    import tensorflow as tf

    name = getattr(concrete_function, "name", "?")
    label = f"tf.function {name.decode() if isinstance(name, bytes) else name}, call {number}"
    with tempfile.TemporaryDirectory(prefix="amp_rewrite_profile_") as logdir:
        try:
            tf.profiler.experimental.start(logdir)
        except Exception as exc:  # noqa: BLE001 - another profiler may be running
            logger.warning("amp-rewrite: profile of %s not taken: %s", label, exc)
            return call()
        try:
            outputs = call()
            if tf.executing_eagerly() and tf.config.list_logical_devices("GPU"):
                tf.test.experimental.sync_devices()  # a GPU's kernels still queued belong to this call
        finally:
            tf.profiler.experimental.stop()
        try:
            _report(label, xplane_ops(Path(logdir).rglob("*.xplane.pb"), _precisions(concrete_function)))
        except Exception as exc:  # noqa: BLE001 - a profile never stops training
            logger.warning("amp-rewrite: profile of %s failed: %s", label, exc)
    return outputs


def xplane_ops(paths: Iterable[Path], precisions: dict[str, str]) -> list[OpTime]:
    """Per node: summed op time from the trace's ``name:Op`` events; precision from ``precisions``.

    A node whose kernels ran on a GPU gets their time instead: its host event only launched them.
    """
    paths = list(paths)
    found: dict[tuple[str, str], float] = {}
    for node, op, picos in op_events(paths):
        found[(node, op)] = found.get((node, op), 0.0) + picos / 1e6
    kernels: dict[str, float] = {}
    for launcher, _, picos in gpu_kernel_events(paths):
        if launcher:
            kernels[launcher] = kernels.get(launcher, 0.0) + picos / 1e6
    return [OpTime(node, op, kernels.get(node, micros), _precision_of(node, precisions))
            for (node, op), micros in found.items()]


def _precision_of(node: str, precisions: dict[str, str]) -> str:
    """The node's precision; a node of a called function is traced under its call's name (``call/node``)."""
    while node not in precisions and "/" in node:
        node = node.split("/", 1)[1]
    return precisions.get(node, "?")


def _precisions(concrete_function) -> dict[str, str]:
    """Node name → the dtype of its first output, over the function's graph and its library."""
    found: dict[str, str] = {}
    graph = concrete_function.graph
    for fdef in graph.as_graph_def().library.function:
        for node in fdef.node_def:
            found.setdefault(node.name, _node_precision(node))
    for op in graph.get_operations():
        found[op.name] = _DTYPES.get(op.outputs[0].dtype.as_datatype_enum, "other") if op.outputs else "-"
    return found


def _node_precision(node) -> str:
    for attr in ("T", "dtype", "DstT"):
        if attr in node.attr and node.attr[attr].type:
            return _DTYPES.get(node.attr[attr].type, "other")
    return "?"
