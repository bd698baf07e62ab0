"""Undoing a mixed-precision graph: half compute back to float32, or to the other half type.

A graph trained with Keras ``mixed_float16``, or rewritten by this package,
cannot go where half kernels are missing or slow (TFLite's converter, a CPU
without bfloat16). :func:`strip` turns every half type attr, function
signature and Const back into float32 (or, for ``target="bfloat16"`` on a
float16 graph and the reverse, into the other half type):

1. every type attr holding a source type takes the target type, in the main
   graph and in every library function; half Consts are converted value by
   value (exact from half to float32);
2. a Cast that now casts a type to itself is removed and its consumers read
   its input;
3. the interface keeps its dtypes: a half Placeholder stays half, followed by
   a Cast, and a fetched node whose output was half is renamed and its old
   name given to a Cast back to that half type;
4. the result is imported into a ``tf.Graph``, so an op whose OpDef fixes a
   half type is an error here rather than at run time.

The caller's GraphDef is never mutated; stripping a float32 graph changes
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from amp_rewrite.errors import GraphError, UsageError, first_line
from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF, DTYPE_NAMES, HALF_MAX, parse_input, sinks
from amp_rewrite.graph.op_registry import OpRegistry, graph_pb2

STRIP_TARGETS = {"float32": DT_FLOAT, "float16": DT_HALF, "bfloat16": DT_BFLOAT16}
_SOURCES = {DT_FLOAT: frozenset({DT_HALF, DT_BFLOAT16}), DT_HALF: frozenset({DT_BFLOAT16}),
            DT_BFLOAT16: frozenset({DT_HALF})}
_CONST_OPS = ("Const", "HostConst")
STRIP_SUFFIX = "AmpStrip"


@dataclass
class StripResult:
    """The stripped graph and what changed.

    Attributes:
        graph_def: the new GraphDef.
        target: ``float32``, ``float16`` or ``bfloat16``.
        retyped: nodes whose type attrs changed (``function::node`` inside functions).
        casts_removed: Casts that cast a type to itself once retyped.
        consts: Consts whose values were converted.
        casts_added: Casts that keep a half feed or fetch in its dtype.
    """

    graph_def: object
    target: str
    retyped: list[str] = field(default_factory=list)
    casts_removed: list[str] = field(default_factory=list)
    consts: list[str] = field(default_factory=list)
    casts_added: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"stripped {len(self.retyped)} nodes to {self.target}, {len(self.consts)} constants converted, "
                f"{len(self.casts_removed)} casts removed, {len(self.casts_added)} added for feeds and fetches")


def strip(graph_def, *, target: str = "float32", fetches=None) -> StripResult:
    """Turns the half types of ``graph_def`` into ``target``.

    Args:
        graph_def: a GraphDef; never modified.
        target: ``float32`` undoes mixed precision; ``float16`` or
            ``bfloat16`` retypes the other half type to it.
        fetches: the node names the caller fetches; they keep their dtype.
            Default: every node without consumers.

    Raises:
        UsageError: an unknown target.
        GraphError: an unknown op, a Const out of the target's range, or a
            graph TensorFlow refuses once retyped; the message names the node.
    """
    dst = _target_dtype(target)
    work = graph_pb2().GraphDef()
    work.CopyFrom(graph_def)
    result = StripResult(work, target)
    _check_ops(work)
    fetched = _fetched_names(work, fetches)
    feeds = [n for n in work.node if n.op == "Placeholder" and n.attr["dtype"].type in _SOURCES[dst]]
    kept = {n.name for n in feeds}
    half_fetches = _half_outputs(work, fetched - kept, _SOURCES[dst])
    retype_graph(work, dst, result, skip=kept)
    remove_noop_casts(work, result, keep=fetched | kept)
    for node in feeds:
        _cast_after_feed(work, node, dst, result)
    for name, dtype in half_fetches:
        _cast_before_fetch(work, name, dtype, dst, result)
    check_imports(work)
    return result


def _target_dtype(target: str) -> int:
    if target not in STRIP_TARGETS:
        raise UsageError(f"unknown target {target!r}; choose one of {', '.join(STRIP_TARGETS)}")
    return STRIP_TARGETS[target]


def _check_ops(graph_def) -> None:
    """Every op is one TensorFlow or the library knows (else its types cannot be read)."""
    registry = OpRegistry(graph_def.library)
    bodies = [("", graph_def.node)] + [(f.signature.name + "::", f.node_def) for f in graph_def.library.function]
    for prefix, nodes in bodies:
        for node in nodes:
            if registry.op_def(node.op) is None:
                raise GraphError(f"node {prefix}{node.name}: unknown op {node.op!r}")


def _fetched_names(graph_def, fetches) -> set[str]:
    if not fetches:
        return sinks(graph_def)
    names = {n.name for n in graph_def.node}
    fetched = set()
    for fetch in fetches:
        name = parse_input(fetch)[0]
        if name not in names:
            raise GraphError(f"fetch {fetch!r} names no node of the graph")
        fetched.add(name)
    return fetched


def _half_outputs(graph_def, fetched: set[str], sources: frozenset[int]) -> list[tuple[str, int]]:
    """(name, half dtype) of each fetched node whose single output is half; more outputs is an error."""
    registry = OpRegistry(graph_def.library)
    found = []
    for node in graph_def.node:
        if node.name not in fetched:
            continue
        types = _output_types(node, registry.op_def(node.op))
        half = [t for t in types if t in sources]
        if not half:
            continue
        if len(types) != 1:
            raise GraphError(f"fetch {node.name} (op {node.op}) has {len(types)} outputs, some in "
                             f"{DTYPE_NAMES[half[0]]}: fetch a single-output node such as an Identity of it")
        found.append((node.name, half[0]))
    return found


def _output_types(node, op_def) -> list[int]:
    types: list[int] = []
    for arg in op_def.output_arg:
        if arg.type_list_attr:
            types.extend(node.attr[arg.type_list_attr].list.type)
            continue
        dtype = arg.type or node.attr[arg.type_attr].type
        count = node.attr[arg.number_attr].i if arg.number_attr else 1
        types.extend([dtype] * count)
    return types


def retype_graph(graph_def, dst: int, result: StripResult, *, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Step 1: source types become ``dst`` in every node, signature and Const (``skip``: main-graph names)."""
    sources = _SOURCES[dst]
    for node in graph_def.node:
        if node.name not in skip and _retype_node(node, sources, dst, ""):
            result.retyped.append(node.name)
            if node.op in _CONST_OPS:
                result.consts.append(node.name)
    for function in graph_def.library.function:
        prefix = function.signature.name + "::"
        for arg in list(function.signature.input_arg) + list(function.signature.output_arg):
            if arg.type in sources:
                arg.type = dst
        for node in function.node_def:
            if _retype_node(node, sources, dst, prefix):
                result.retyped.append(prefix + node.name)
                if node.op in _CONST_OPS:
                    result.consts.append(prefix + node.name)


def _retype_node(node, sources: frozenset[int], dst: int, prefix: str) -> bool:
    changed = False
    for value in node.attr.values():
        if value.type in sources:
            value.type = dst
            changed = True
        if any(t in sources for t in value.list.type):
            value.list.type[:] = [dst if t in sources else t for t in value.list.type]
            changed = True
        if value.HasField("tensor") and value.tensor.dtype in sources:
            _convert_tensor(value, dst, f"{prefix}{node.name}")
            changed = True
    return changed


def _convert_tensor(value, dst: int, where: str) -> None:
    import tensorflow as tf

    array = tf.make_ndarray(value.tensor).astype(np.float32)
    peak = float(np.max(np.abs(array))) if array.size else 0.0
    if dst in HALF_MAX and np.isfinite(peak) and peak > HALF_MAX[dst]:
        raise GraphError(f"Const {where}: |value| reaches {peak:g}, beyond {DTYPE_NAMES[dst]}'s range; "
                         "strip to float32 instead")
    converted = array.astype(tf.dtypes.as_dtype(dst).as_numpy_dtype)
    value.tensor.CopyFrom(tf.make_tensor_proto(converted, shape=array.shape))


def remove_noop_casts(graph_def, result: StripResult, *, keep: set[str]) -> None:
    """Step 2: retyped Casts from a type to itself go; their consumers read the Cast's input.

    Casts in ``keep`` (main-graph names: fetched or fed) and Casts with control
    inputs stay.
    """
    retyped = set(result.retyped)
    main = _noop_casts(graph_def.node, lambda name: name in retyped and name not in keep)
    by_ref = {**main, **{f"{name}:0": source for name, source in main.items()}}
    _bypass(graph_def.node, main, by_ref)
    result.casts_removed.extend(main)
    for function in graph_def.library.function:
        prefix = function.signature.name + "::"
        removed = _noop_casts(function.node_def, lambda name, p=prefix: p + name in retyped)
        if not removed:
            continue
        by_ref = {f"{name}:y:0": source for name, source in removed.items()}
        _bypass(function.node_def, removed, by_ref)
        for key, ref in function.ret.items():
            function.ret[key] = _resolve(by_ref, ref)
        result.casts_removed.extend(prefix + name for name in removed)


def _noop_casts(nodes, may_remove) -> dict[str, str]:
    """Name → data input of each Cast whose SrcT equals its DstT, that ``may_remove`` and has no control input."""
    found = {}
    for node in nodes:
        if (node.op == "Cast" and len(node.input) == 1 and may_remove(node.name)
                and node.attr["SrcT"].type == node.attr["DstT"].type):
            found[node.name] = node.input[0]
    return found


def _resolve(by_ref: dict[str, str], ref: str) -> str:
    """The source a reference names once every removed Cast on its way is skipped."""
    while ref in by_ref:
        ref = by_ref[ref]
    return ref


def _bypass(nodes, removed: dict[str, str], by_ref: dict[str, str]) -> None:
    """Drops the ``removed`` Casts; data inputs read their sources, control inputs wait for the source's node."""
    if not removed:
        return
    names = {n.name for n in nodes}
    kept = [n for n in nodes if n.name not in removed]
    for node in kept:
        inputs = []
        for ref in node.input:
            if ref.startswith("^") and ref[1:] in removed:
                source = _ref_node(_resolve(by_ref, removed[ref[1:]]))
                if source in names:  # a function argument takes no control edge
                    inputs.append("^" + source)
            else:
                inputs.append(_resolve(by_ref, ref))
        node.input[:] = inputs
    del nodes[:]
    nodes.extend(kept)


def _ref_node(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _cast_after_feed(graph_def, feed, dst: int, result: StripResult) -> None:
    """Step 3: a half Placeholder keeps its dtype; its readers read a Cast of it."""
    name = _unique(graph_def, f"{feed.name}-0-{DTYPE_NAMES[dst]}-{STRIP_SUFFIX}")
    for node in graph_def.node:
        for k, ref in enumerate(node.input):
            if ref in (feed.name, feed.name + ":0"):
                node.input[k] = name
    cast = graph_def.node.add()
    _fill_cast(cast, name, feed.name, feed.attr["dtype"].type, dst, feed.device)
    result.casts_added.append(name)


def _cast_before_fetch(graph_def, name: str, half: int, dst: int, result: StripResult) -> None:
    """Step 3: a fetched half node is renamed; a Cast to its half type takes its name."""
    renamed = _unique(graph_def, f"{name}-{STRIP_SUFFIX}")
    node = next(n for n in graph_def.node if n.name == name)
    node.name = renamed
    for other in graph_def.node:
        for k, ref in enumerate(other.input):
            src, port, control = parse_input(ref)
            if src == name:
                other.input[k] = f"^{renamed}" if control else renamed if port == 0 else f"{renamed}:{port}"
    cast = graph_def.node.add()
    _fill_cast(cast, name, renamed, dst, half, node.device)
    result.casts_added.append(name)


def _fill_cast(node, name: str, source: str, src_type: int, dst_type: int, device: str) -> None:
    node.name = name
    node.op = "Cast"
    node.input.append(source)
    node.device = device
    node.attr["SrcT"].type = src_type
    node.attr["DstT"].type = dst_type
    node.attr["Truncate"].b = False


def _unique(graph_def, name: str) -> str:
    taken = {n.name for n in graph_def.node}
    candidate, k = name, 1
    while candidate in taken:
        candidate, k = f"{name}_{k}", k + 1
    return candidate


def check_imports(graph_def) -> None:
    """Step 4: TensorFlow accepts the graph (edge types agree); else a GraphError naming its complaint."""
    import tensorflow as tf

    try:
        with tf.Graph().as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
    except (ValueError, TypeError, tf.errors.OpError) as exc:
        raise GraphError(f"the stripped graph does not import: {first_line(exc)}") from None


def strip_saved_model(saved, *, target: str = "float32") -> tuple[object, StripResult]:
    """Strips every MetaGraph of a SavedModel proto; returns (new proto, result of the serving graph).

    The functions a SavedModel restores keep their signatures, and variables
    their stored dtypes: either in a half type is an error naming it.
    """
    dst = _target_dtype(target)
    out = type(saved)()
    out.CopyFrom(saved)
    results = []
    for meta in out.meta_graphs:
        _check_saved_interface(meta, _SOURCES[dst])
        fetches = sorted({parse_input(t.name)[0] for s in meta.signature_def.values() for t in s.outputs.values()})
        result = strip(meta.graph_def, target=target, fetches=fetches or None)
        meta.graph_def.CopyFrom(result.graph_def)
        result.graph_def = meta.graph_def
        results.append(result)
    serving = next((r for m, r in zip(out.meta_graphs, results) if "serve" in m.meta_info_def.tags), results[0])
    return out, serving


def _check_saved_interface(meta, sources: frozenset[int]) -> None:
    functions = {f.signature.name: f for f in meta.graph_def.library.function}
    for name in sorted(meta.object_graph_def.concrete_functions):
        signature = functions[name].signature if name in functions else None
        if signature is None:
            continue
        for arg in list(signature.input_arg) + list(signature.output_arg):
            if arg.type in sources:
                raise GraphError(f"function {name}: argument {arg.name} is {DTYPE_NAMES[arg.type]}; a restored "
                                 "function keeps its signature, so strip a frozen graph of the model instead")
    for node in meta.graph_def.node:
        if node.op in ("VarHandleOp", "VariableV2") and node.attr["dtype"].type in sources:
            raise GraphError(f"variable {node.name} is stored in {DTYPE_NAMES[node.attr['dtype'].type]}; "
                             "strip does not change stored variables")
