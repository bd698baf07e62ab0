"""The function library: rewritten instances folded back in, and calls that reach an entry function.

Each call got its own instance of the function it runs (see
:mod:`amp_rewrite.graph.instances`), and each instance was rewritten by the same
rules as the main graph. Here the instances are written back:

- an instance that did not change keeps calling the original function;
- instances that changed identically share one function;
- when every call of a function changed the same way, and nothing else names
  it, the function is rewritten in place; otherwise each variant is a renamed
  copy (``{name}_amp``, ``{name}_amp_1``, ...), so other callers of the original stay correct;
- the signature follows the instance's virtual ``_Arg``/``_Retval`` types, and
  the calls' function attrs name the variant chosen for them.

Functions no call reaches are left untouched, and so is every function some
node names in a way the view does not follow (a tf.data ``f`` attr, a
recursive or otherwise opaque call, a registered gradient).

A function nothing in the main graph calls (a SavedModel's restored
function, a traced ``tf.function``) is reached through :func:`entry_call`:
a synthetic call, named under :data:`ENTRY_PREFIX`, that the rewrite
preserves, so the function's signature keeps its dtypes while its body is
rewritten.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

from amp_rewrite.graph.facts import called_functions
from amp_rewrite.graph.names import unique_name
from amp_rewrite.graph.typed_graph import TypedGraph

logger = logging.getLogger(__name__)

#: The name (or name scope) of the synthetic calls :func:`entry_call` builds.
ENTRY_PREFIX = "_amp_rewrite_entry"


@dataclass
class LibraryResult:
    """What finalizing the library did."""

    rewritten: list[str] = field(default_factory=list)
    representatives: dict[str, int] = field(default_factory=dict)
    loop_functions: set[str] = field(default_factory=set)

    def qualify(self, by_body: dict[int, list[str]]) -> list[str]:
        """Main-graph names as they are, then ``function::node`` for each function written."""
        return list(self.qualify_map({b: dict.fromkeys(names) for b, names in by_body.items()}))

    def qualify_map(self, by_body: dict[int, dict]) -> dict:
        """Like :meth:`qualify`, for name → value maps."""
        qualified = dict(by_body.get(0, {}))
        for function, body_id in self.representatives.items():
            qualified.update((f"{function}::{name}", value) for name, value in by_body.get(body_id, {}).items())
        return qualified


def finalize_functions(graph: TypedGraph) -> LibraryResult:
    """Writes every instance's changes into ``graph.graph_def.library``.

    Args:
        graph: the typed view, after casts were applied.

    Returns:
        The functions written, the instance written for each, and which run in loops.
    """
    result = LibraryResult()
    if len(graph.bodies) == 1:
        return result
    for body_id in range(1, len(graph.bodies)):
        _write_signature(graph, body_id)
    keys = _instance_keys(graph)
    pinned = _pinned_functions(graph)
    names = _variant_names(graph, keys, pinned)
    for body in graph.bodies:
        for call, by_attr in body.children.items():
            _set_callees(graph.nodes[call], {attr: [names[b] for b in bodies] for attr, bodies in by_attr.items()})
    result.representatives = _representatives(keys, names)
    result.rewritten = _rebuild_library(graph, result.representatives)
    loop_bodies = graph.loop_instances()
    for name in result.representatives:
        if any(names[b] == name for b in loop_bodies):
            result.loop_functions.add(name)
    return result


def _write_signature(graph: TypedGraph, body_id: int) -> None:
    body = graph.bodies[body_id]
    signature = body.fdef.signature
    for k, node in enumerate(graph.nodes[i] for i in body.args):
        signature.input_arg[k].type = node.attr["T"].type
    for k, node in enumerate(graph.nodes[i] for i in body.rets):
        signature.output_arg[k].type = node.attr["T"].type
        body.fdef.ret[signature.output_arg[k].name] = node.input[0]


def _instance_keys(graph: TypedGraph) -> list[str | None]:
    """Per body, a digest of its rewritten content including its callees', or None if unchanged."""
    keys: list[str | None] = [None] * len(graph.bodies)
    for body_id in range(len(graph.bodies) - 1, 0, -1):
        body = graph.bodies[body_id]
        original = graph.library[body.function]
        changed = _canonical(body.fdef) != _canonical(original)
        child_keys = []
        for call in sorted(body.children):
            for attr in sorted(body.children[call]):
                for child in body.children[call][attr]:
                    child_keys.append(keys[child] or f"original:{graph.bodies[child].function}")
                    changed = changed or keys[child] is not None
        if changed:
            digest = hashlib.sha256(_canonical(body.fdef))
            for child_key in child_keys:
                digest.update(b"\0" + child_key.encode())
            keys[body_id] = digest.hexdigest()
    return keys


def _canonical(fdef) -> bytes:
    name = fdef.signature.name
    fdef.signature.name = ""
    try:
        return fdef.SerializeToString(deterministic=True)
    finally:
        fdef.signature.name = name


def _pinned_functions(graph: TypedGraph) -> set[str]:
    """Functions named by something other than an instantiated call: their content must stay."""
    pinned: set[str] = set()
    for gradient in graph.graph_def.library.gradient:
        pinned.update((gradient.function_name, gradient.gradient_func))
    linked = {call for body in graph.bodies for call in body.children}
    for i, node in enumerate(graph.nodes):
        if i in linked:
            continue
        pinned.update(called_functions(node, graph.library))
    instantiated = {b.function for b in graph.bodies[1:]}
    for fdef in graph.graph_def.library.function:
        if fdef.signature.name not in instantiated:
            for node in fdef.node_def:  # functions we do not instantiate keep their references
                pinned.update(called_functions(node, graph.library))
    return pinned


def _variant_names(graph: TypedGraph, keys: list[str | None], pinned: set[str]) -> list[str]:
    """The function each instance will call: the original, or one name per distinct change."""
    taken = set(graph.library)
    names = [""] * len(graph.bodies)
    by_function: dict[str, list[int]] = {}
    for body_id in range(1, len(graph.bodies)):
        by_function.setdefault(graph.bodies[body_id].function, []).append(body_id)
    for fname, instances in by_function.items():
        original_used = fname in pinned or any(keys[b] is None for b in instances)
        variant: dict[str, str] = {}
        for b in instances:
            key = keys[b]
            if key is None:
                names[b] = fname
                continue
            if key not in variant:
                in_place = not original_used and not variant
                variant[key] = fname if in_place else unique_name(f"{fname}_amp", taken)
            names[b] = variant[key]
    return names


def _set_callees(node, names: dict[str, list[str]]) -> None:
    for attr, functions in names.items():
        if attr == "":
            node.op = functions[0]
        elif attr == "branches":
            for k, fname in enumerate(functions):
                node.attr[attr].list.func[k].name = fname
        else:
            node.attr[attr].func.name = functions[0]


def _representatives(keys: list[str | None], names: list[str]) -> dict[str, int]:
    """For each function name a rewritten instance gets, the first instance written under it."""
    representative: dict[str, int] = {}
    for body_id in range(1, len(keys)):
        if keys[body_id] is not None:
            representative.setdefault(names[body_id], body_id)
    return representative


def _rebuild_library(graph: TypedGraph, representative: dict[str, int]) -> list[str]:
    """Writes the library: untouched functions, then each rewritten variant after its original.

    Args:
        representative: the instance to write under each rewritten function name.

    Returns:
        The names of the functions written from rewritten instances, in library order.
    """
    written_names: list[str] = []
    variants: dict[str, list[tuple[str, int]]] = {}
    for name, body_id in representative.items():
        variants.setdefault(graph.bodies[body_id].function, []).append((name, body_id))
    library = graph.graph_def.library
    rebuilt = type(library)()
    for fdef in library.function:
        fname = fdef.signature.name
        if fname not in representative:
            rebuilt.function.add().CopyFrom(fdef)
        for name, body_id in variants.get(fname, ()):
            written = rebuilt.function.add()
            written.CopyFrom(graph.bodies[body_id].fdef)
            written.signature.name = name
            written_names.append(name)
    rebuilt.gradient.extend(library.gradient)
    rebuilt.registered_gradients.extend(library.registered_gradients)
    library.CopyFrom(rebuilt)
    return written_names


def entry_call(signature, call_name: str) -> list:
    """NodeDefs that call the function of ``signature``: ``call_name/arg<k>`` Placeholders, then the call.

    The call, ``call_name``, is a ``StatefulPartitionedCall`` with the
    signature's own dtypes; fetching or preserving it keeps the function's
    inputs and outputs in those dtypes, while the rewrite reaches its body.
    The signature must be monomorphic (no type or number attrs).
    """
    from tensorflow.core.framework import node_def_pb2

    nodes = []
    call = node_def_pb2.NodeDef(name=call_name, op="StatefulPartitionedCall")
    for k, arg in enumerate(signature.input_arg):
        placeholder = node_def_pb2.NodeDef(name=f"{call_name}/arg{k}", op="Placeholder")
        placeholder.attr["dtype"].type = arg.type
        nodes.append(placeholder)
        call.input.append(placeholder.name)
    call.attr["f"].func.name = signature.name
    call.attr["Tin"].list.type.extend(a.type for a in signature.input_arg)
    call.attr["Tout"].list.type.extend(a.type for a in signature.output_arg)
    nodes.append(call)
    return nodes
