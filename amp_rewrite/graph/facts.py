"""Facts read off a GraphDef that several modules need: one definition each.

- dtype numbers (``types.proto``) and the largest finite value of each half type;
- how a node's input string names its source (``name``, ``name:port``, ``^name``)
  and the tensor it reads;
- a graph's sinks: the nodes whose outputs nothing reads;
- the library functions a node calls, through any function attr or as its op;
- the nodes of the main graph and of chosen function bodies as one list
  (:func:`flat_nodes`), named as reports name them (``function::node``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

DT_FLOAT = 1
DT_DOUBLE = 2
DT_STRING = 7
DT_BFLOAT16 = 14
DT_HALF = 19
DT_RESOURCE = 20
DT_VARIANT = 21
DTYPE_NAMES = {DT_FLOAT: "float32", DT_HALF: "float16", DT_BFLOAT16: "bfloat16", DT_VARIANT: "variant"}

FLOAT16_MAX = 65504.0
BFLOAT16_MAX = 3.3895313892515355e38
HALF_MAX = {DT_HALF: FLOAT16_MAX, DT_BFLOAT16: BFLOAT16_MAX}


def parse_input(ref: str) -> tuple[str, int, bool]:
    """Splits a GraphDef input string into (node name, output port, is_control)."""
    if ref.startswith("^"):
        return ref[1:], -1, True
    name, sep, port = ref.rpartition(":")
    if sep and port.isdigit():
        return name, int(port), False
    return ref, 0, False


def node_name(ref: str) -> str:
    """The node an input string (or a fetch, ``name`` or ``name:port``) names."""
    return parse_input(ref)[0]


def tensor_name(ref: str) -> str:
    """The tensor a data input string (or a feed, ``name`` or ``name:port``) names, as ``name:port``."""
    name, port, _ = parse_input(ref)
    return f"{name}:{port}"


def sinks(graph_def) -> set[str]:
    """Names of the nodes no other node reads, by data or control edge."""
    consumed = {node_name(ref) for node in graph_def.node for ref in node.input}
    return {node.name for node in graph_def.node} - consumed


def fetchable_sinks(graph_def) -> list[str]:
    """The :func:`sinks` that have an output to fetch (not NoOps, Asserts, saves or variable writes)."""
    no_output = {"NoOp", "Assert", "SaveV2", "AssignVariableOp"}
    unread = sinks(graph_def)
    return [n.name for n in graph_def.node if n.name in unread and n.op not in no_output]


def called_functions(node, library) -> list[str]:
    """Functions ``node`` names: its op when ``library`` holds it, then every function attr.

    Names come in attr order; an unset optional function attr gives none.
    """
    names = [node.op] if node.op in library else []
    for value in node.attr.values():
        names.append(value.func.name)
        names.extend(f.name for f in value.list.func)
    return [name for name in names if name]


def function_input_source(ref: str) -> str:
    """The node or argument a FunctionDef input names: ``arg``, ``node:output_arg:k`` or ``^node``."""
    return ref.lstrip("^").split(":")[0]


@dataclass(frozen=True)
class FlatNode:
    """A node of the main graph, or of a function body under ``function::node``."""

    name: str
    node_def: Any
    inputs: tuple[tuple[str, bool], ...]  # (source's name, is a control input)


def functions_of(names: Iterable[str]) -> list[str]:
    """The functions that ``function::node`` names belong to, once each, in first-seen order."""
    return list(dict.fromkeys(name.split("::")[0] for name in names if "::" in name))


def flat_nodes(graph_def, functions: Iterable[str] = ()) -> list[FlatNode]:
    """The main graph's nodes, then the nodes of each of ``functions`` the library holds, with their inputs.

    A function body refers to its own nodes as ``node:output:k`` and to its
    arguments by name; arguments are not nodes and give no input here.
    """
    flat = [FlatNode(node.name, node, tuple((node_name(ref), ref.startswith("^")) for ref in node.input))
            for node in graph_def.node]
    library = {f.signature.name: f for f in graph_def.library.function}
    for function in functions:
        fdef = library.get(function)
        if fdef is None:
            continue
        prefix = function + "::"
        names = {node.name for node in fdef.node_def}
        for node in fdef.node_def:
            refs = []
            for ref in node.input:
                source = function_input_source(ref)
                if source in names:
                    refs.append((prefix + source, ref.startswith("^")))
            flat.append(FlatNode(prefix + node.name, node, tuple(refs)))
    return flat
