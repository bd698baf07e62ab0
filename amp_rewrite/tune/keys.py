"""What a measured verdict applies to: the keys of the tuning cache.

A step's times are worth reusing only for the same computation on the same
device: the cache file is the device's, TensorFlow's and amp-rewrite's
version's (:mod:`amp_rewrite.tune.cache`), and within it each entry's key is
a digest of what was timed. A key digests what the graph computes (every
node's op and attributes, as a multiset), what it is given (the inputs'
dtypes and shapes, and for a captured variable, whose handle is a scalar
``resource``, the variable's dtype and shape) and how it was rewritten
(:func:`rewrite_settings`: the target, the level, the op lists' content,
the keep-float32 patterns), never what its parts are named: the same model
traced again in another run gets new function and resource names and the
same key, while another model, width, batch shape, target or list gets
another key.

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
# Attributes TensorFlow keeps private (``_``) that change what runs: an XLA-compiled body runs XLA's kernels,
# and the runtime leaves it float32 on a CPU.
_COMPUTING_PRIVATE_ATTRS = frozenset({"_XlaMustCompile"})


def step_key(functions: Iterable, inputs: Iterable[tuple[str, tuple]], *, settings: str = "") -> str:
    """The cache key of a step: a digest of what its graph computes, not of what its parts are named.

    Args:
        functions: the FunctionDefs of the step (its own and those it calls).
        inputs: each input's dtype name and shape (None for an unknown dimension); a captured variable's
            handle as :func:`resource_input` writes it.
        settings: how the step is rewritten (:func:`rewrite_settings`).

    Every node's op and attributes count (but those that only name a function
    or a resource, which change from run to run), as a multiset, with the
    input signature and the settings: the same model traced in another run
    has the same key; another shape, a changed model or a changed rewrite
    another.
    """
    nodes = [node for fdef in functions for node in fdef.node_def]
    compiled = [f"compiled {_function_flags(fdef)}" for fdef in functions if _function_flags(fdef)]
    return _digest(nodes, [*inputs, *((text, ()) for text in sorted(compiled))], settings)


def resource_input(handle_types: Sequence[tuple[str, tuple | None]]) -> str:
    """How a ``resource`` input enters a key: with the dtype and shape of what its handle holds.

    ``resource float32[16, 32]`` for a captured variable of that shape; a
    handle holding nothing known is ``resource``. (A variable's handle is a
    scalar: without this, a model 16 units wide and the same model 2048
    wide have one key.)
    """
    held = ", ".join(f"{dtype}{'?' if shape is None else list(shape)}" for dtype, shape in handle_types)
    return f"resource {held}" if held else "resource"


def session_step_key(nodes: Iterable, fetches: Iterable[str], inputs: Iterable[tuple[str, tuple]], *,
                     target: str, settings: str = "") -> str:
    """The cache key of a TF1 session step: :func:`step_key`'s digest of the NodeDefs it runs, and what it fetches.

    Args:
        nodes: the NodeDefs of the script graph's ops the step's fetches depend on (a variable's op,
            ``VariableV2`` or ``VarHandleOp``, carries its dtype and shape).
        fetches: what each fetch is, not what it is called (``op NoOp``, ``float32[]``), in fetch order.
        inputs: each fed tensor's dtype name and shape (None for an unknown dimension), in feed order.
        target: the half type the step's rewrite computes in (its graph is rewritten for it).
        settings: how the step is rewritten (:func:`rewrite_settings`).

    The same script run again builds the same graph under the same or other
    names and gets the same key; another model, batch shape, target or rewrite another.
    """
    signature = [("session", (target,)), *(("fetch " + text, ()) for text in fetches), *inputs]
    return _digest(nodes, signature, settings)


def rewrite_settings(config) -> str:
    """What of a rewrite's :class:`~amp_rewrite.Config` changes what the rewritten step runs, as text.

    The target, the level, the device type, the effective op lists' content
    (the bundled files, or ``--lists``'s, with every edit, from flags or the
    ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables, applied), the
    keep-float32 patterns, and why functions are left opaque (not which:
    their names change from run to run).

    Not the fields that name nodes (``fetches``, ``preserve``,
    ``keep_float32``, ``release``, ``fixed_signatures``): names change when
    a model is traced again, and what they change shows elsewhere in the
    key (a TF1 step's fetches; ``--tune``'s rewritten graph, which its key
    digests whole); the runtime's ``tf.function`` rewrites set none of them,
    and a mixed body's kept regions have keys of their own. Not those that
    change no graph (the dump directory, the checks, the cache's place, the
    tuning batch, which shows in the feeds).
    """
    from amp_rewrite.paint.op_lists import load_lists

    lists = load_lists(config.target, lists_dir=config.lists_dir, edits=config.list_edits, level=config.level)
    listed = hashlib.sha256(repr(sorted(lists.as_dict().items())).encode()).hexdigest()[:16]
    opaque = sorted(reason for _, reason in config.opaque_functions)
    return (f"target {config.target}; level {config.level}; device {config.device_type}; lists {listed}; "
            f"keep {list(config.keep_float32_patterns)!r}; opaque {opaque!r}")


def _function_flags(fdef) -> str:
    attrs = getattr(fdef, "attr", {})
    return ",".join(f"{name}={attrs[name].SerializeToString(deterministic=True).hex()}"
                    for name in sorted(_COMPUTING_PRIVATE_ATTRS) if name in attrs)


def _digest(nodes: Iterable, inputs: Iterable[tuple[str, tuple]], settings: str = "") -> str:
    digest = hashlib.sha256()
    if settings:
        digest.update(f"settings {settings};".encode())
    for dtype, shape in inputs:
        digest.update(f"{dtype}{list(shape)};".encode())
    for text in sorted(node_text(node) for node in nodes):
        digest.update(text)
    return KEY_PREFIX + digest.hexdigest()[:32]


def node_text(node) -> bytes:
    """What a node computes, as bytes: its op, its input count, its attributes but those that name things."""
    parts = [node.op.encode(), str(len(node.input)).encode()]
    for name in sorted(node.attr):
        if (name.startswith("_") and name not in _COMPUTING_PRIVATE_ATTRS) or name in _NAMING_ATTRS:
            continue
        parts.append(name.encode() + b"=" + node.attr[name].SerializeToString(deterministic=True))
    return b"|".join(parts)


def graph_key(float32_graph, half_graph, *, feeds: Mapping[str, object], fetches: Sequence[str],
              settings: str = "") -> str:
    """The cache key of a trial of two graphs: a digest of what both compute, the feeds' shapes and the fetches.

    Each graph's digest is :func:`step_key`'s (ops and
    attributes, not names), over its nodes and its library, with the
    rewrite's ``settings`` (:func:`rewrite_settings`).
    """
    arrays = {name: np.asarray(value) for name, value in feeds.items()}
    inputs = sorted((f"{name}:{array.dtype}", array.shape) for name, array in arrays.items())
    digest = hashlib.sha256()
    for graph_def in (float32_graph, half_graph):
        bodies = [SimpleNamespace(node_def=graph_def.node), *graph_def.library.function]
        digest.update(step_key(bodies, inputs, settings=settings).encode())
    digest.update(repr(sorted(fetches)).encode())
    return GRAPH_KEY_PREFIX + digest.hexdigest()[:32]
