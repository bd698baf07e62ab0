"""Plain ``run`` calls, resolved once into a callable of the shadow session.

A call whose fetches are tensors/ops (alone, or a list or tuple of them) and
whose feeds are tensors of numpy values gets a :class:`FastCall` on its
second run, keyed by the identity of those objects (its :data:`CallKey`):
later such calls skip TensorFlow's fetch mapping and feed parsing and run a
callable made once in the shadow session.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import numpy as np

from amp_rewrite import tf_internals
from amp_rewrite.runtime.tf1.session.plans import PlanKey, RunPlan, is_plain_tensor

# One logger for the whole package: its lines keep the name they have always had.
logger = logging.getLogger(__package__)

# Fast calls kept per shadow; the cache starts afresh beyond this (fetch or feed
# objects made anew on every call would otherwise grow it without end).
MAX_FAST_CALLS = 256

# Feed values the fast path converts as ``Session.run`` would; others (Python
# ints, whose range run() checks, tensor handles, nested lists) take the general path.
_FAST_FEED_TYPES = (np.ndarray, np.generic, float, bool)


# The identity of a call's fetch elements and feed keys (not of a container the
# script may change): the id of a single fetch, or the sequence's type followed by
# the id of each fetch; then the id of each feed key, in feed order. A plain
# tuple: it is made on every step and only ever hashed, and a NamedTuple would
# cost that step several times as much to make.
CallKey: TypeAlias = tuple[object, tuple]


def call_key(fetches, feed_dict) -> CallKey:
    """The :data:`CallKey` of a ``run(fetches, feed_dict)`` call."""
    kind = type(fetches)
    if kind is list or kind is tuple:
        fetch_key: object = (kind, *map(id, fetches))
    else:
        fetch_key = id(fetches)
    return fetch_key, tuple(map(id, feed_dict)) if feed_dict else ()


class FastFeed(NamedTuple):
    """What a fed value must be: its numpy dtype, and its dims (None when the rank is unknown)."""

    dtype: Any
    dims: tuple | None


class FastResult(NamedTuple):
    """Where a script fetch's value is: its position in the fetched values (-1 for an op), and its dtype or None."""

    position: int
    dtype: Any


@dataclass
class FastCall:
    """One kind of plain ``run`` call, resolved once: what is left per call is the values.

    Attributes:
        keep: the script's fetch and feed objects; held, so that the ids in
            this call's key stay theirs.
        version: the script graph's version the plan was made for.
        plan: the call's :class:`~amp_rewrite.runtime.tf1.session.plans.RunPlan`.
        session: the shadow session the call was resolved in.
        run: that session's callable for the step: feed values in, fetched values out.
        feeds: per fed tensor, in feed order, its :class:`FastFeed`.
        results: per script fetch, its :class:`FastResult`.
        reports: indices of the loss-scale report values.
        kind: ``list`` or ``tuple`` for a sequence of fetches, None for one.
    """

    keep: tuple
    version: int
    plan: RunPlan
    session: Any
    run: object
    feeds: list
    results: list
    reports: list
    kind: type | None

    def feed_values(self, feed_dict):
        """The shadow feed values of this call, or None when a value needs ``Session.run``'s checks."""
        if not feed_dict:
            return ()
        feeds = []
        for (dtype, dims), value in zip(self.feeds, feed_dict.values()):
            if not isinstance(value, _FAST_FEED_TYPES):
                return None
            try:
                value = np.asarray(value, dtype)
            except (TypeError, ValueError, OverflowError):
                return None  # run() raises its own error
            if dims is not None and not _shape_fits(dims, value.shape):
                return None  # run() raises its own error
            feeds.append(value)
        return feeds

    def script_results(self, values):
        """The fetched ``values`` as the script's call returns them."""
        results = [None if i < 0 else values[i] if dtype is None
                   else np.asarray(values[i]).astype(dtype)
                   for i, dtype in self.results]
        if self.kind is None:
            return results[0]
        return results if self.kind is list else tuple(results)


class FastCalls:
    """The fast calls resolved on one shadow, by :data:`CallKey`."""

    def __init__(self):
        self._calls: dict[CallKey, FastCall] = {}

    def values(self):
        return self._calls.values()

    def find(self, fetches, feed_dict, version: int) -> FastCall | None:
        """The call's :class:`FastCall`, when it was resolved at this graph ``version`` in an open session."""
        call = self._calls.get(call_key(fetches, feed_dict))
        if call is None or call.version != version or tf_internals.session_is_closed(call.session):
            return None
        return call

    def remember(self, graph, shadow_session, fetches, feed_dict, key: PlanKey, plan: RunPlan) -> None:
        """Resolves a plain call once into a :class:`FastCall`; leaves others to the general path."""
        known_key = call_key(fetches, feed_dict)
        known = self._calls.get(known_key)
        if known is not None and known.version == key.version:
            return  # resolved already: this call's values needed the general path
        if plan.has_probe:
            return  # the probe's line is logged by the general path
        feed_keys = tuple(feed_dict) if feed_dict else ()
        if set(key.fetches) & set(key.feeds) or not all(is_plain_tensor(f, graph) for f in feed_keys):
            return  # a fetch that is fed comes back from the feed, which only run() knows
        if not all(hasattr(shadow_session, name) for name in
                   ("_closed", "_do_call", "_make_callable_from_options")):
            return
        try:
            call = _resolve_call(shadow_session, fetches, feed_keys, key, plan)
        except Exception as exc:  # an unexpected TensorFlow: the general path still works
            logger.debug("no fast path for this run: %s", exc)
            return
        if len(self._calls) >= MAX_FAST_CALLS:
            self._calls.clear()
        self._calls[known_key] = call


def _resolve_call(shadow_session, fetches, feed_keys, key: PlanKey, plan: RunPlan) -> FastCall:
    from tensorflow.core.protobuf import config_pb2

    kind = type(fetches) if type(fetches) in (list, tuple) else None
    options = config_pb2.CallableOptions()
    index_of = _fetch_indexer(options)
    n_script = len(plan.fetch_dtypes)
    results = [FastResult(index_of(element), None if change is None else change.script.as_numpy_dtype)
               for element, change in zip(plan.fetches[:n_script], plan.fetch_dtypes)]
    reports = [index_of(element) for element in plan.fetches[n_script:]]
    feeds = []
    for name in key.feeds:
        shadow_tensor = plan.feeds[name].tensor
        if not shadow_tensor.graph.is_feedable(shadow_tensor):
            raise ValueError(f"{name} may not be fed")
        shape = shadow_tensor.shape
        dims = None if shape.rank is None else tuple(shape.as_list())
        feeds.append(FastFeed(shadow_tensor.dtype.as_numpy_dtype, dims))
        options.feed.append(shadow_tensor.name)  # a step's float32 copy feeds its own placeholders
    run = tf_internals.make_callable_from_options(shadow_session, options)
    keep = (tuple(fetches) if kind else (fetches,), feed_keys)
    return FastCall(keep, key.version, plan, shadow_session, run, feeds, results, reports, kind)


def _fetch_indexer(options):
    """``index_of(element)``: adds a fetch to ``options`` once; its index among the fetches, -1 for an op."""
    import tensorflow as tf

    tensor_index: dict[str, int] = {}
    op_names: set[str] = set()

    def index_of(element):
        if isinstance(element, tf.Operation):
            if element.name not in op_names:
                op_names.add(element.name)
                options.target.append(element.name)
            return -1
        if element.name not in tensor_index:
            tensor_index[element.name] = len(options.fetch)
            options.fetch.append(element.name)
        return tensor_index[element.name]

    return index_of


def _shape_fits(dims, shape) -> bool:
    if len(dims) != len(shape):
        return False
    for want, have in zip(dims, shape):
        if want is not None and want != have:
            return False
    return True
