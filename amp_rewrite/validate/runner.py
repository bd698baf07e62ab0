"""Runs graphs in TensorFlow on the sample inputs for validation, counting the runs.

One :class:`Runner` serves a whole validation: it checks the sample inputs
against the graph once, makes the float32 reference run (the outputs, and
the largest magnitude of every observable float tensor), then runs each
rewritten graph and measures its outputs against the reference. Every
failure is a one-line :class:`~amp_rewrite.validate.report.ValidationError`.
"""

from __future__ import annotations

import numpy as np

from amp_rewrite import tf_internals
from amp_rewrite.graph.facts import node_name, tensor_name
from amp_rewrite.validate.feeds import observable_tensors
from amp_rewrite.validate.report import ValidationError, ValidationReport
from amp_rewrite.validate.tolerance import Tolerance


class Runner:
    """Runs graphs on the sample inputs, counting runs; checks feeds once."""

    def __init__(self, graph_def, feeds, fetches, report: ValidationReport, max_runs: int, progress):
        self.graph_def = graph_def
        self.feeds = {(tensor_name(k)): np.asarray(v) for k, v in feeds.items()}
        self.fetches = fetches
        self.report = report
        self.max_runs = max_runs
        self.progress = progress

    def exhausted(self) -> bool:
        return self.report.runs >= self.max_runs

    def reference(self) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """The float32 outputs, and max |value| of every observable float tensor."""
        import tensorflow as tf

        graph = self._import(self.graph_def)
        self._check_feeds(graph)
        for fetch in self.fetches:
            self._fetch(graph, fetch)
        observable = observable_tensors(self.graph_def)
        peaks_ops = {}
        with graph.as_default(), tf.name_scope("amp_rewrite_validation"):
            for tensor_name in observable:
                tensor = graph.get_tensor_by_name(tensor_name)
                if tensor.dtype.is_floating and tensor_name not in self.feeds:
                    peaks_ops[tensor_name] = tf.reduce_max(tf.abs(tf.cast(tensor, tf.float32)))
        values = self._run(graph, [self._fetch(graph, f) for f in self.fetches] + list(peaks_ops.values()),
                           "float32 reference")
        outputs = dict(zip(self.fetches, values[:len(self.fetches)]))
        for name, value in outputs.items():
            value = np.asarray(value)
            if value.dtype.kind == "f" and value.size and np.any(np.isnan(value)):
                raise ValidationError(f"output {name} is NaN in float32 on these sample inputs; nothing to "
                                      f"compare the half graph with: give other sample inputs")
        peaks = {name: float(v) for name, v in zip(peaks_ops, values[len(self.fetches):])}
        for name, value in self.feeds.items():
            if value.dtype.kind == "f" and value.size:
                peaks[name] = float(np.max(np.abs(value)))
        return outputs, peaks

    def compare(self, graph_def, reference, tolerance: Tolerance) -> dict[str, float]:
        graph = self._import(graph_def)
        values = self._run(graph, [self._fetch(graph, f) for f in self.fetches], "check")
        return {f: tolerance.error(v, reference[f]) for f, v in zip(self.fetches, values)}

    def _import(self, graph_def):
        import tensorflow as tf

        from amp_rewrite.graph.importable import import_blocker

        blocker = import_blocker(graph_def)
        if blocker:
            raise ValidationError(f"cannot run the graph to validate it: {blocker}")
        graph = tf.Graph()
        try:
            with graph.as_default():
                tf.compat.v1.import_graph_def(graph_def, name="")
        except Exception as exc:  # noqa: BLE001 - whatever TensorFlow raises, the graph cannot run here
            text = getattr(exc, "message", None) or str(exc)
            raise ValidationError(f"cannot run the graph to validate it: TensorFlow does not import it: "
                                  f"{text.strip().splitlines()[0] if text.strip() else type(exc).__name__}") from None
        return graph

    def _check_feeds(self, graph) -> None:
        import tensorflow as tf

        for name, value in self.feeds.items():
            try:
                tensor = graph.get_tensor_by_name(name)
            except (KeyError, ValueError):
                raise ValidationError(f"sample input {name!r} names no tensor of the graph") from None
            if value.dtype.kind == "f" and value.size and not np.all(np.isfinite(value)):
                raise ValidationError(f"sample input {name!r} holds NaN or infinite values: give finite ones")
            try:
                dtype = tf.string if value.dtype.kind in "OSU" else tf.as_dtype(value.dtype)
            except TypeError:
                dtype = None
            if dtype != tensor.dtype:
                raise ValidationError(f"sample input {name!r} is {value.dtype}, the graph wants "
                                      f"{tensor.dtype.name}")
            if not tensor.shape.is_compatible_with(value.shape):
                raise ValidationError(f"sample input {name!r} has shape {list(value.shape)}, the graph "
                                      f"wants {tensor.shape}")
        fed = {node_name(n) for n in self.feeds}
        missing = [n.name for n in self.graph_def.node if n.op == "Placeholder" and n.name not in fed]
        if missing:
            raise ValidationError(f"no sample input for placeholder {missing[0]!r}"
                                  + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))

    def _fetch(self, graph, name):
        try:
            if ":" in name:
                return graph.get_tensor_by_name(name)
            op = graph.get_operation_by_name(name)
        except (KeyError, ValueError) as exc:
            raise ValidationError(f"fetch {name!r}: {str(exc).strip(chr(34)).splitlines()[0]}") from None
        return op.outputs[0] if op.outputs else op

    def _run(self, graph, fetches, label: str):
        import tensorflow as tf

        self.report.runs += 1
        if self.progress:
            self.progress(f"validation run {self.report.runs}/{self.max_runs}: {label}")
        config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
        feed_dict = {graph.get_tensor_by_name(k): v for k, v in self.feeds.items()}
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            try:
                return tf_internals.run_unpatched(sess, fetches, feed_dict)
            except tf.errors.OpError as exc:
                raise ValidationError(f"{label} run failed at node {getattr(exc.op, 'name', '?')}: "
                                      f"{exc.message.splitlines()[0]}") from None
