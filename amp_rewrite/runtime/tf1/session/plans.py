"""How a ``Session.run`` call maps onto the shadow graph: its :class:`RunPlan`.

A call is known by its :class:`PlanKey` (the script graph's version and the
names of what it fetches and feeds). Its plan names the shadow elements to
fetch and feed and the dtype changes between the two graphs; the helpers
below flatten a call's fetches and feeds to names and convert values across
those changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import numpy as np

from amp_rewrite import tf_internals
from amp_rewrite.runtime import overflow_probe
from amp_rewrite.runtime.loss_scale.step_writes import ancestors
from amp_rewrite.runtime.loss_scale.tf1_optimizer import Report

# A step whatever the graph's version: the names it fetches, and those it feeds.
StepId: TypeAlias = tuple[tuple, tuple]


class PlanKey(NamedTuple):
    """What makes two ``run`` calls the same kind of call.

    Attributes:
        version: the script graph's version when the call was made.
        fetches: names of the tensors and ops fetched.
        feeds: names of the tensors fed, in feed order.
    """

    version: int
    fetches: tuple
    feeds: tuple

    @property
    def step(self) -> StepId:
        """The step this call runs, at any graph version (ops added later never change it)."""
        return self.fetches, self.feeds


class DtypeChange(NamedTuple):
    """A tensor the rewrite gave another dtype: the script's and the shadow's."""

    script: Any
    shadow: Any


class FeedPlan(NamedTuple):
    """How a fed tensor is fed in the shadow: its shadow tensor, and the dtype change or None."""

    tensor: Any
    change: DtypeChange | None


@dataclass
class RunPlan:
    """How one kind of ``run`` call maps onto the shadow graph.

    Attributes:
        fetches: shadow elements to fetch: the script's, then loss-scale reports.
        fetch_dtypes: per script fetch, the :class:`DtypeChange` to undo, or None.
        feeds: per fed tensor name, its :class:`FeedPlan`.
        reports: how many loss-scale report tensors follow the script's fetches.
        runs: how many times it ran outside a trial (a call is resolved from the second).
        has_probe: the last fetch is the overflow probe (``AMP_REWRITE_FIND_OVERFLOW=1``).
        recheck_at: for the plan of a step decided from the cache, the run count at which the verdict is
            checked again (:meth:`~amp_rewrite.runtime.tf1.session.keeper.ShadowKeeper.start_recheck`); None: never.
    """

    fetches: list
    fetch_dtypes: list
    feeds: dict
    reports: int = 0
    runs: int = 0
    has_probe: bool = False
    recheck_at: int | None = None


def make_plan(graph, shadow, key: PlanKey, *, reports: Sequence[Report] = (), is_probing: bool = False) -> RunPlan:
    """The :class:`RunPlan` of a ``key`` call to ``graph``, on its ``shadow``.

    ``reports`` are the loss-scale reports of the guarded steps built in
    ``graph``; the plan fetches those whose step the call runs. With
    ``is_probing``, a training step (one with loss-scale reports) also
    fetches the overflow probe of the half ops it runs.
    """
    fetches, fetch_dtypes = [], []
    for name in key.fetches:
        original = graph.as_graph_element(name)
        element = shadow.as_graph_element(name)
        fetches.append(element)
        fetch_dtypes.append(dtype_change(original, element))
    feeds = {}
    for name in key.feeds:
        element = shadow.get_tensor_by_name(name)
        feeds[name] = FeedPlan(element, dtype_change(graph.get_tensor_by_name(name), element))
    reports = _reports_for(graph, key.fetches, reports)
    fetches += [shadow.get_tensor_by_name(report.tensor.name) for report in reports]
    probe = overflow_probe.session_probe(shadow, ancestors(fetches)) if is_probing and reports else None
    if probe is not None:
        fetches.append(probe)
    return RunPlan(fetches, fetch_dtypes, feeds, len(reports), has_probe=probe is not None)


def _reports_for(graph, fetch_names, reports: Sequence[Report]) -> list[Report]:
    """The loss-scale reports whose guarded update this run executes anyway."""
    if not reports:
        return []
    wanted = {report.op.name: report for report in reports}
    found = []
    for op in ancestors(graph.as_graph_element(n) for n in fetch_names):
        if op.name in wanted:
            found.append(wanted[op.name])
    return found


# --- values across the two graphs --------------------------------------------

def dtype_change(original, shadow) -> DtypeChange | None:
    """The :class:`DtypeChange` when a tensor became another type, else None."""
    if not hasattr(original, "dtype"):
        return None
    want, have = original.dtype.base_dtype, shadow.dtype.base_dtype
    if want == have:
        return None
    return DtypeChange(want, have)


def to_script(value, change: DtypeChange | None):
    """A fetched shadow value in the dtype the script built."""
    return value if change is None else np.asarray(value).astype(change.script.as_numpy_dtype)


def to_shadow(value, change: DtypeChange | None):
    """A fed value in the dtype of the shadow tensor it feeds."""
    return value if change is None else np.asarray(value, dtype=change.shadow.as_numpy_dtype)


# --- fetches and feeds as names ----------------------------------------------

def fetch_mapper(graph, fetches):
    with graph.as_default():
        return tf_internals.fetch_mapper(fetches)


def element_names(graph, elements) -> tuple:
    """Names of every tensor or op a fetch or feed structure names."""
    return tuple(e.name for e in fetch_mapper(graph, elements).unique_fetches())


def flat_fetch_names(graph, fetches):
    """Names of a Tensor/Operation or a plain list/tuple of them from ``graph``, else None.

    The common case skips TensorFlow's general fetch mapper, which costs as much
    as the rest of the per-step work.
    """
    import tensorflow as tf

    kinds = (tf.Tensor, tf.Operation)
    if isinstance(fetches, kinds):
        items = (fetches,)
    elif type(fetches) in (list, tuple) and all(isinstance(f, kinds) for f in fetches):
        items = fetches
    else:
        return None
    if any(item.graph is not graph for item in items):
        return None  # let TensorFlow's mapper raise its error
    return tuple(item.name for item in items)


def flat_results(fetches, values):
    """Fetched values in the shape of a call's flat fetches (one, a list or a tuple)."""
    if type(fetches) is list:
        return values
    if type(fetches) is tuple:
        return tuple(values)
    return values[0]


def flatten_feeds(graph, feed_dict) -> list:
    """(tensor name, value) per fed tensor, expanding sparse and other composite keys."""
    if not feed_dict:
        return []
    out = []
    if all(is_plain_tensor(feed, graph) for feed in feed_dict):
        return [(feed.name, value) for feed, value in feed_dict.items()]
    for feed, value in tf_internals.flatten_feed_dict(feed_dict).items():
        for subfeed, subvalue in _expand_feed(feed, value):
            tensor = graph.as_graph_element(subfeed, allow_tensor=True, allow_operation=False)
            out.append((tensor.name, subvalue))
    return out


def is_plain_tensor(feed, graph) -> bool:
    import tensorflow as tf

    return isinstance(feed, tf.Tensor) and feed.graph is graph


def _expand_feed(feed, value):
    for feed_type, _, expand, _ in tf_internals.feed_expansions():
        if isinstance(feed, feed_type):
            return expand(feed, value)
    raise TypeError(f"{feed} in argument `feed_dict` has invalid type {type(feed).__name__!r}")
