"""What a measured verdict applies to: the keys of the tuning cache.

A step's times are worth reusing only for the same computation on the same
device: the cache file is the device's and TensorFlow's
(:mod:`amp_rewrite.tune.cache`), and within it each entry's key is a digest
of what was timed. A key digests what the graph computes (every node's op
and attributes, as a multiset), never what its parts are named: the same
model traced again in another run gets new function and resource names and
the same key, while another model, shape or target gets another key.

- :func:`step_key`: a traced ``tf.function``'s step;
- :func:`session_step_key`: a TF1 ``Session.run`` step;
- :func:`graph_key`: the pair of GraphDefs ``--tune`` times;
- :data:`PROFILE_KEY`, :data:`MIXED_KEY`: what follows a step's key for its
  profiled op times and its mixed body's confirming trial (the regions' own
  keys are :func:`amp_rewrite.tune.step_regions.region_key`'s).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from types import SimpleNamespace

import numpy as np

#: The key of a step's timings in the tuning cache begins with this, apart from the ops' keys.
KEY_PREFIX = "step "
#: The key of a whole graph's timings in the tuning cache begins with this.
GRAPH_KEY_PREFIX = "graph "
#: After the step key: the op time of the two profiled steps (float32's, half's).
PROFILE_KEY = " profile"
#: After the step key: the best times of the better pure body and of the mixed one, in the trial confirming it.
MIXED_KEY = " mixed"

# Attributes that name things rather than compute them: a graph traced again
# in another run gets new function names and resource names.
_NAMING_ATTRS = frozenset({"shared_name", "container", "f", "then_branch", "else_branch", "cond", "body",
                           "branches"})


def step_key(functions: Iterable, inputs: Iterable[tuple[str, tuple]]) -> str:
    """The cache key of a step: a digest of what its graph computes, not of what its parts are named.

    Args:
        functions: the FunctionDefs of the step (its own and those it calls).
        inputs: each input's dtype name and shape (None for an unknown dimension).

    Every node's op and attributes count (but those that only name a function
    or a resource, which change from run to run), as a multiset, with the
    input signature: the same model traced in another run has the same key,
    another shape or a changed model another.
    """
    return _digest((node for fdef in functions for node in fdef.node_def), inputs)


def session_step_key(nodes: Iterable, fetches: Iterable[str], inputs: Iterable[tuple[str, tuple]], *,
                     target: str) -> str:
    """The cache key of a TF1 session step: :func:`step_key`'s digest of the NodeDefs it runs, and what it fetches.

    Args:
        nodes: the NodeDefs of the script graph's ops the step's fetches depend on.
        fetches: what each fetch is, not what it is called (``op NoOp``, ``float32[]``), in fetch order.
        inputs: each fed tensor's dtype name and shape (None for an unknown dimension), in feed order.
        target: the half type the step's rewrite computes in (its graph is rewritten for it).

    The same script run again builds the same graph under the same or other
    names and gets the same key; another model, batch shape or target another.
    """
    signature = [("session", (target,)), *(("fetch " + text, ()) for text in fetches), *inputs]
    return _digest(nodes, signature)


def _digest(nodes: Iterable, inputs: Iterable[tuple[str, tuple]]) -> str:
    digest = hashlib.sha256()
    for dtype, shape in inputs:
        digest.update(f"{dtype}{list(shape)};".encode())
    for text in sorted(node_text(node) for node in nodes):
        digest.update(text)
    return KEY_PREFIX + digest.hexdigest()[:32]


def node_text(node) -> bytes:
    """What a node computes, as bytes: its op, its input count, its attributes but those that name things."""
    parts = [node.op.encode(), str(len(node.input)).encode()]
    for name in sorted(node.attr):
        if name.startswith("_") or name in _NAMING_ATTRS:
            continue
        parts.append(name.encode() + b"=" + node.attr[name].SerializeToString(deterministic=True))
    return b"|".join(parts)


def graph_key(float32_graph, half_graph, *, feeds: Mapping[str, object], fetches: Sequence[str]) -> str:
    """The cache key of a trial of two graphs: a digest of what both compute, the feeds' shapes and the fetches.

    Each graph's digest is :func:`step_key`'s (ops and
    attributes, not names), over its nodes and its library.
    """
    arrays = {name: np.asarray(value) for name, value in feeds.items()}
    inputs = sorted((f"{name}:{array.dtype}", array.shape) for name, array in arrays.items())
    digest = hashlib.sha256()
    for graph_def in (float32_graph, half_graph):
        bodies = [SimpleNamespace(node_def=graph_def.node), *graph_def.library.function]
        digest.update(step_key(bodies, inputs).encode())
    digest.update(repr(sorted(fetches)).encode())
    return GRAPH_KEY_PREFIX + digest.hexdigest()[:32]
