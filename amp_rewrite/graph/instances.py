"""Function instancing: every call of a library function gets its own copy of the function.

Functions are seen through, not around. Every call of a library function
(``PartitionedCall``, ``While``, ``If``, ``Case``, or a direct call) gets its
own *instance*: a private copy of the FunctionDef, with a virtual ``_Arg``
node per input and a virtual ``_Retval`` node per output. Each instance can
then be rewritten on its own; :mod:`amp_rewrite.graph.functions` later folds
identical instances back into one function.

This module holds:

- :data:`CALL_FUNCTION_ATTRS` and :data:`WHILE_OPS`: the call-like ops and the
  attrs that name the functions they run;
- :class:`Body`: the main graph or one instance;
- :class:`Instances`: the nodes of the main graph and of every instance it
  reaches, numbered globally, with the calls that could not be instantiated;
- :func:`function_source`: the node and port a FunctionDef input string names.

The typed view (:mod:`amp_rewrite.graph.typed_graph`) is built over these nodes,
and joins each call's ports to its instances' virtual args and results.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from amp_rewrite.errors import GraphError

if TYPE_CHECKING:
    from amp_rewrite.graph.op_registry import OpRegistry

# Call-like ops, with the attrs naming the functions they run.
CALL_FUNCTION_ATTRS = {
    "PartitionedCall": ("f",),
    "StatefulPartitionedCall": ("f",),
    "While": ("cond", "body"),
    "StatelessWhile": ("cond", "body"),
    "If": ("then_branch", "else_branch"),
    "StatelessIf": ("then_branch", "else_branch"),
    "Case": ("branches",),
    "StatelessCase": ("branches",),
}
WHILE_OPS = frozenset({"While", "StatelessWhile"})
# Bounds on instantiation: deeper or more calls are treated as opaque.
MAX_CALL_DEPTH = 32
MAX_INSTANCES = 4096


@dataclass
class Body:
    """The main graph (``function`` empty) or one instance of a library function.

    Attributes:
        function: the library function's name; "" for the main graph.
        fdef: this instance's private copy of the FunctionDef (None for the main graph).
        call: the global index of the node whose call made this instance, or None.
        depth: how many calls deep the instance is.
        index: node name → global node index, for the nodes of this body.
        args, rets: global indices of the virtual ``_Arg`` / ``_Retval`` nodes.
        children: per call node of this body, the instances it calls, by attr.
    """

    function: str
    fdef: Any = None
    call: int | None = None
    depth: int = 0
    index: dict = field(default_factory=dict)
    args: list = field(default_factory=list)
    rets: list = field(default_factory=list)
    children: dict = field(default_factory=dict)

    @property
    def is_main(self) -> bool:
        return self.fdef is None

    @property
    def suffix(self) -> str:
        """`` in function NAME`` for an instance, "" for the main graph: the tail of an error's place."""
        return f" in function {self.function}" if self.function else ""

    def where(self, node) -> str:
        """How an error names ``node`` of this body: ``node NAME (op OP) in function F``."""
        return f"node {node.name} (op {node.op}){self.suffix}"


class Instances:
    """The main graph's nodes and those of one instance per call, under global indices.

    The main graph's nodes come first, in GraphDef order; then each instance's
    virtual args, body nodes and virtual results, breadth first in call order.
    The main graph's nodes are the caller's NodeDefs; an instance's are its
    private FunctionDef copy's.

    Attributes:
        library: function name → FunctionDef, as the GraphDef's library holds them.
        nodes: every node, by global index.
        names: every node's name, by global index (the str objects the bodies' indexes hold).
        ops: every node's op when the view is built, by global index (interned: one str object per op
            name); finalizing functions later renames calls in the NodeDefs, not here.
        body_of: per node, the index of its body in ``bodies``.
        bodies: the main graph (index 0) and the function instances.
        virtual: the global indices of the virtual ``_Arg`` / ``_Retval`` nodes.
        opaque_calls: call node → why its functions could not be instantiated.
        opaque_functions: function name → why its calls are never instantiated (given by the caller).
    """

    def __init__(self, graph_def, registry: OpRegistry, *, opaque_functions: Mapping[str, str] | None = None):
        self.registry = registry
        self.opaque_functions = dict(opaque_functions or {})
        self.library = {f.signature.name: f for f in graph_def.library.function}
        self.nodes: list = []
        self.names: list[str] = []
        self.ops: list[str] = []
        self.body_of: list[int] = []
        self.bodies: list[Body] = []
        self.virtual: set[int] = set()
        self.opaque_calls: dict[int, str] = {}
        self._add_body(Body(function=""), list(graph_def.node))
        self._instantiate_calls()

    def _add_body(self, body: Body, nodes: list) -> int:
        body_id = len(self.bodies)
        self.bodies.append(body)
        index, all_nodes, names, ops = body.index, self.nodes, self.names, self.ops
        for node in nodes:
            name = node.name
            if name in index:
                raise GraphError(f"duplicate node name {name!r} (op {node.op}){body.suffix}")
            index[name] = len(all_nodes)
            all_nodes.append(node)
            names.append(name)
            ops.append(sys.intern(node.op))  # read once: each read of a NodeDef field makes a new str
        self.body_of.extend([body_id] * len(nodes))
        return body_id

    def _instantiate_calls(self) -> None:
        """Gives every call of a library function its own instance, breadth first, in node order.

        A call is instantiated whole or not at all: if one of its functions
        cannot be (missing, recursive, polymorphic, too deep), the call is
        opaque and paint does not cross it.
        """
        body_id = 0
        library, nodes = self.library, self.nodes
        while body_id < len(self.bodies):
            body = self.bodies[body_id]
            for i in list(body.index.values()):
                op = nodes[i].op
                if op not in CALL_FUNCTION_ATTRS and op not in library:
                    continue  # calls nothing (what _callees would find)
                callees = self._callees(nodes[i])
                if not callees:
                    continue
                reason = next(filter(None, (self._cannot_instantiate(f, body)
                                            for names in callees.values() for f in names)), None)
                if reason is not None:
                    self.opaque_calls[i] = reason
                    continue
                body.children[i] = {attr: [self._instantiate(f, i, body) for f in names]
                                    for attr, names in callees.items()}
            body_id += 1

    def _callees(self, node) -> dict[str, list[str]]:
        attrs = CALL_FUNCTION_ATTRS.get(node.op)
        if attrs is None:
            if node.op in self.library and self.registry.is_library_function(node.op):
                return {"": [node.op]}
            return {}
        found = {}
        for attr in attrs:
            if attr not in node.attr:
                continue
            value = node.attr[attr]
            names = [f.name for f in value.list.func] if attr == "branches" else [value.func.name]
            found[attr] = names
        return found

    def _cannot_instantiate(self, fname: str, parent: Body) -> str | None:
        fdef = self.library.get(fname)
        if fdef is None:
            return f"function {fname} is not in the graph's library"
        if fname in self.opaque_functions:
            return self.opaque_functions[fname]
        if parent.depth + 1 > MAX_CALL_DEPTH or len(self.bodies) >= MAX_INSTANCES:
            return "too many nested or repeated function calls"
        if self._on_call_path(parent, fname):
            return f"function {fname} calls itself"
        if any(a.type_attr or a.number_attr or a.type_list_attr
               for a in list(fdef.signature.input_arg) + list(fdef.signature.output_arg)):
            return f"function {fname} has a polymorphic signature"
        return None

    def _instantiate(self, fname: str, call: int, parent: Body) -> int:
        from tensorflow.core.framework import node_def_pb2

        fdef = self.library[fname]
        copy = type(fdef)()
        copy.CopyFrom(fdef)
        body = Body(function=fname, fdef=copy, call=call, depth=parent.depth + 1)
        node_def = node_def_pb2.NodeDef
        virtual_args = []
        for k, arg in enumerate(copy.signature.input_arg):
            node = node_def(name=arg.name, op="_Arg")
            node.attr["T"].type = arg.type
            node.attr["index"].i = k
            virtual_args.append(node)
        virtual_rets = []
        for k, arg in enumerate(copy.signature.output_arg):
            node = node_def(name=f"_retval/{arg.name}", op="_Retval", input=[copy.ret[arg.name]])
            node.attr["T"].type = arg.type
            node.attr["index"].i = k
            virtual_rets.append(node)
        first = len(self.nodes)
        body_id = self._add_body(body, virtual_args + list(copy.node_def) + virtual_rets)
        body.args = list(range(first, first + len(virtual_args)))
        body.rets = list(range(len(self.nodes) - len(virtual_rets), len(self.nodes)))
        self.virtual.update(body.args + body.rets)
        return body_id

    def _on_call_path(self, body: Body, fname: str) -> bool:
        while body is not None:
            if body.function == fname:
                return True
            body = self.bodies[self.body_of[body.call]] if body.call is not None else None
        return False


def function_source(body: Body, ref: str, node, out_args: list) -> tuple[int, int]:
    """The (node, output port) a FunctionDef input names: ``arg`` or ``node:output_arg:k``.

    Args:
        body: the instance ``node`` belongs to.
        ref: one data input string of ``node``.
        node: the consuming NodeDef, for the error.
        out_args: per global node, the first output port of each named output arg
            (None for unknown ops).

    Raises:
        GraphError: naming ``node``, when ``ref`` names no node of ``body`` or is malformed.
    """
    parts = ref.split(":")
    src = body.index.get(parts[0])
    if src is None:
        raise GraphError(f"{body.where(node)}: input {ref!r} names a node that does not exist")
    if len(parts) == 1:
        return src, 0
    starts = out_args[src]
    if len(parts) != 3 or not parts[2].isdigit() or (starts is not None and parts[1] not in starts):
        raise GraphError(f"{body.where(node)}: malformed function input {ref!r}")
    return src, (starts[parts[1]] if starts is not None else 0) + int(parts[2])
