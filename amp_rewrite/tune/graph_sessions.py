"""Two whole GraphDefs, each in a TF1 session of its own, stepped on the same feeds.

What ``--tune`` and ``doctor --benchmark`` run. The schedule and verdict are
the runtime's (:mod:`amp_rewrite.tune.trial`): the float32 graph and the
rewritten graph alternate in the order :func:`~amp_rewrite.tune.trial.schedule`
gives (an untimed warm-up of each, then half, float32, float32, half, ...);
the best step of each counts, and half wins only by
:data:`~amp_rewrite.tune.trial.MARGIN`.

The graphs are reached through a small interface, :class:`StepRunner`: one
step of a body (``"half"`` or ``"float32"``) and its seconds, and one
optional profiled step giving each node's op seconds (from ``RunMetadata``
step stats, :func:`amp_rewrite.tune.step_stats.step_stats_ops`; on a GPU its
kernels' seconds, :func:`amp_rewrite.tune.step_stats.traced_op_seconds`), for a
choice finer than the whole graph. :class:`GraphSessions` is the real one;
tests pass their own, or a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from amp_rewrite import tf_internals
from amp_rewrite.errors import AmpRewriteError, first_line
from amp_rewrite.graph.facts import tensor_name
from amp_rewrite.tune.step_stats import step_stats_ops, traced_op_seconds
from amp_rewrite.tune.trial import FLOAT32, HALF

_LABELS = {FLOAT32: "float32", HALF: "rewritten"}


class GraphRunError(AmpRewriteError):
    """A graph could not be run to time it; the message names the graph and the node."""


class StepRunner(Protocol):
    """Runs single steps of the two bodies of a trial."""

    def step(self, body: str) -> float:
        """Runs one step of ``body`` (``"half"`` or ``"float32"``); its seconds."""

    def profile(self, body: str) -> dict[str, float] | str:
        """Runs one traced step of ``body``; each node's op seconds, or why there are none."""

    def close(self) -> None:
        """Frees what the runner holds."""


class GraphSessions:
    """The two graphs (``{"half": ..., "float32": ...}`` GraphDefs), each in its own session, ready to step.

    Args:
        graphs: each body's GraphDef.
        feeds: placeholder or tensor name → array, fed to both.
        fetches: node or tensor names each step runs.
        init_op: a node run once in each session first (a training graph's initializer).
        timer: the clock (``time.perf_counter``).

    Raises:
        GraphRunError: a graph does not import, a feed or fetch names nothing, or the initializer fails.
    """

    def __init__(self, graphs: Mapping[str, object], *, feeds: Mapping[str, object], fetches: Sequence[str],
                 init_op: str | None = None, timer: Callable[[], float] = time.perf_counter):
        self.timer = timer
        self._sessions: dict[str, _Session] = {}
        try:
            for body in (FLOAT32, HALF):
                self._sessions[body] = _Session(graphs[body], _LABELS[body], feeds, fetches, init_op)
        except BaseException:
            self.close()
            raise

    @property
    def device(self) -> str:
        """``GPU`` when the sessions have one, else ``CPU``."""
        return self._sessions[FLOAT32].device

    def step(self, body: str) -> float:
        session = self._sessions[body]
        start = self.timer()
        session.run(session.fetches)
        return self.timer() - start

    def profile(self, body: str) -> dict[str, float] | str:
        import tensorflow as tf

        session = self._sessions[body]
        if session.device == "GPU":  # the step stats' time of a GPU op is its launch: read its kernels
            _, seconds = traced_op_seconds(lambda: session.run(session.fetches), device_type="GPU")
            return seconds
        metadata = tf.compat.v1.RunMetadata()
        session.run(session.fetches, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                    run_metadata=metadata)
        return {op.node: op.micros * 1e-6 for op in step_stats_ops(metadata.step_stats)}

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions = {}


class _Session:
    """One graph in its own session."""

    def __init__(self, graph_def, label: str, feeds: Mapping[str, object], fetches: Sequence[str],
                 init_op: str | None):
        import tensorflow as tf

        self.label = label
        self.graph = tf.Graph()
        try:
            with self.graph.as_default():
                tf.compat.v1.import_graph_def(graph_def, name="")
            self.fetches = [self._fetch(name) for name in fetches]
            self.feed_dict = {self.graph.get_tensor_by_name(tensor_name(k)): np.asarray(v) for k, v in feeds.items()}
        except (KeyError, ValueError, TypeError, tf.errors.OpError) as exc:
            raise GraphRunError(f"cannot run the {label} graph: {first_line(exc)}") from None
        self.session = tf.compat.v1.Session(graph=self.graph,
                                            config=tf.compat.v1.ConfigProto(allow_soft_placement=True))
        self.device = "GPU" if any(d.device_type == "GPU" for d in self.session.list_devices()) else "CPU"
        if init_op:
            self.run([self.graph.get_operation_by_name(init_op)])

    def _fetch(self, name: str):
        if ":" in name:
            return self.graph.get_tensor_by_name(name)
        op = self.graph.get_operation_by_name(name)
        return op.outputs[0] if op.outputs else op

    def run(self, fetches, **kwargs) -> None:
        import tensorflow as tf

        try:
            tf_internals.run_unpatched(self.session, fetches, self.feed_dict, **kwargs)
        except tf.errors.OpError as exc:
            raise GraphRunError(f"the {self.label} graph fails at node {getattr(exc.op, 'name', '?')}: "
                                f"{first_line(exc)}") from None

    def close(self) -> None:
        self.session.close()
