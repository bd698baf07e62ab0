"""The dtype each vertex of the typed view holds, and the dtypes its OpDef admits.

A vertex is one type attribute of one node (see :mod:`amp_rewrite.graph.typed_graph`).
Its dtype lives on the NodeDef: the attr's value, an entry of a ``list(type)``
attr, the OpDef's default when the attr is unset, or the fixed type of a port
the OpDef types itself. :class:`VertexDtypes` reads and writes it there, and
answers from the OpDef which attrs are types and which dtypes each admits
(facts gathered once per op, and once per process for TensorFlow's registered
ops).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from amp_rewrite.errors import GraphError
from amp_rewrite.graph.op_ports import TypeAttr
from amp_rewrite.graph.op_registry import OpRegistry


class VertexDtypes:
    """The vertices' dtypes, on the NodeDefs, for :class:`~amp_rewrite.graph.typed_graph.TypedGraph`.

    A base of the view: it reads the view's per-node and per-vertex tables
    (declared below), and the view sets ``_facts`` to an empty dict before
    it first asks for :meth:`op_facts`.
    """

    nodes: list
    ops: list[str]
    op_defs: list
    registry: OpRegistry
    vertex_node: list[int]
    vertex_attr: list[TypeAttr]
    _facts: dict[str, _OpFacts]

    def dtype(self, vid: int) -> int:
        """The DataType the vertex currently holds (the OpDef default if the attr is unset)."""
        node_idx, attr = self.vertex_node[vid], self.vertex_attr[vid]
        name = attr.name
        if not name:
            return attr.fixed
        node_attrs = self.nodes[node_idx].attr
        if name in node_attrs:
            value = node_attrs[name]
            return value.type if attr.index < 0 else value.list.type[attr.index]
        return _default_type(self.op_defs[node_idx], name)

    def dtypes(self) -> list[int]:
        """The DataType every vertex holds now, by vertex id (what :meth:`dtype` gives, in one pass)."""
        result: list[int] = []
        append = result.append
        nodes = self.nodes
        for node_idx, attr in zip(self.vertex_node, self.vertex_attr):
            name = attr.name
            if not name:
                append(attr.fixed)
                continue
            node_attrs = nodes[node_idx].attr
            if name in node_attrs:
                value = node_attrs[name]
                append(value.type if attr.index < 0 else value.list.type[attr.index])
            else:
                append(_default_type(self.op_defs[node_idx], name))
        return result

    def set_dtype(self, vid: int, dtype: int) -> None:
        """Retypes the vertex's attr on its NodeDef."""
        node_idx, attr = self.vertex_node[vid], self.vertex_attr[vid]
        if not attr.name:
            raise GraphError(f"cannot retype fixed type {attr} of node {self.nodes[node_idx].name}")
        value = self.nodes[node_idx].attr[attr.name]
        if attr.index < 0:
            value.type = dtype
        else:
            value.list.type[attr.index] = dtype

    def allowed_types(self, vid: int) -> frozenset[int] | None:
        """The dtypes the OpDef admits for the vertex; None means any."""
        node_idx, attr = self.vertex_node[vid], self.vertex_attr[vid]
        if not attr.name:
            return frozenset((attr.fixed,))
        return self.op_facts(node_idx).allowed.get(attr.name)

    def op_facts(self, node: int) -> _OpFacts:
        """Type attrs and admitted dtypes of the node's op (cached per op)."""
        op = self.ops[node]
        facts = self._facts.get(op)
        if facts is None:
            is_function = self.registry.is_library_function(op)
            facts = _facts_of(self.op_defs[node]) if is_function else _registry_facts(op)
            self._facts[op] = facts
        return facts


def _default_type(op_def, attr_name: str) -> int:
    for attr_def in op_def.attr:
        if attr_def.name == attr_name and attr_def.HasField("default_value"):
            return attr_def.default_value.type
    return 0


class _OpFacts(NamedTuple):
    """What the view asks of an OpDef again and again, computed once per op."""

    singles: tuple[str, ...]  # names of ``type`` attrs
    lists: tuple[str, ...]  # names of ``list(type)`` attrs
    allowed: dict  # attr name -> frozenset of admitted dtypes, or None for any


def _facts_of(op_def) -> _OpFacts:
    return _OpFacts(
        singles=tuple(a.name for a in op_def.attr if a.type == "type"),
        lists=tuple(a.name for a in op_def.attr if a.type == "list(type)"),
        allowed={a.name: (frozenset(a.allowed_values.list.type) or None) for a in op_def.attr},
    )


@functools.cache
def _registry_facts(op: str) -> _OpFacts:
    """Facts of a registered op; TensorFlow's registry does not change within a process."""
    return _facts_of(OpRegistry.registry_op_def(op))


