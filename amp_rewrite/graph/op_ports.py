"""Typed ports: which type attribute types each input and output of a node, read off its OpDef.

An OpDef arg is typed by a ``type`` attr (``T``), by a fixed type
(``DT_INT32``), or by a ``list(type)`` attr whose entries type one port each;
a ``number_attr`` repeats the arg. :class:`TypeAttr` names one of these
types within a node. How an op's args expand is prepared once per op (a
plan, cached for TensorFlow's registered ops) and applied to each node's
attrs.

This module holds :class:`TypeAttr`, :func:`expand_ports` (every node's
ports, for the typed view) and :func:`output_count` (one node's outputs,
without building the view).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from amp_rewrite.errors import GraphError
from amp_rewrite.graph.facts import DTYPE_NAMES
from amp_rewrite.graph.op_registry import OpRegistry


class TypeAttr(NamedTuple):
    """Identifies one type within a node: an attr, an entry of a list attr, or a fixed type."""

    name: str
    index: int = -1  # type: ignore[assignment]  # shadows tuple.index, which nothing here calls
    fixed: int = 0

    def __str__(self) -> str:
        if not self.name:
            return DTYPE_NAMES.get(self.fixed, f"dtype{self.fixed}")
        return self.name if self.index < 0 else f"{self.name}[{self.index}]"


def expand_ports(nodes: list, ops: list[str], op_defs: list, registry: OpRegistry) -> tuple[list, list, list]:
    """Per node, the TypeAttr of each input and output port, and each output arg's first port.

    Each is None for a node of an unknown op. Nodes of one op share a plan.
    """
    in_attrs: list[list[TypeAttr] | None] = []
    out_attrs: list[list[TypeAttr] | None] = []
    out_args: list[dict[str, int] | None] = []
    plans: dict[str, tuple] = {}
    for node, op, op_def in zip(nodes, ops, op_defs):
        if op_def is None:
            in_attrs.append(None)
            out_attrs.append(None)
            out_args.append(None)
            continue
        plan = plans.get(op)
        if plan is None:
            if registry.is_library_function(op):
                plan = (_ArgPlan(op_def, op_def.input_arg), _ArgPlan(op_def, op_def.output_arg))
            else:
                plan = _registry_plan(op)
            # Ports that no attr value changes are the same list for every node of the op.
            fixed = plan[0].fixed is not None and plan[1].fixed is not None
            plan += ((plan[0].fixed, plan[1].fixed, plan[1].fixed_starts,
                      sorted(set(plan[0].required) | set(plan[1].required))) if fixed else None,)
            plans[op] = plan
        fixed = plan[2]
        if fixed is not None:
            if fixed[3]:
                attr = node.attr
                for name in fixed[3]:
                    if name not in attr:
                        plan[0].expand(node)
                        plan[1].expand(node)  # one of them names the missing attr
            in_attrs.append(fixed[0])
            out_attrs.append(fixed[1])
            out_args.append(fixed[2])
            continue
        in_attrs.append(plan[0].expand(node))
        outs, starts = plan[1].expand_with_starts(node)
        out_attrs.append(outs)
        out_args.append(starts)
    return in_attrs, out_attrs, out_args


def output_count(node, registry: OpRegistry) -> int | None:
    """How many outputs ``node`` has, read off its OpDef and attrs without building the view.

    The count is the one the view gives the node. None when neither TensorFlow
    nor ``registry``'s library knows the op, or when an attr the count needs
    is missing (building the view names that error).
    """
    op_def = registry.op_def(node.op)
    if op_def is None:
        return None
    if registry.is_library_function(node.op):
        plan = _ArgPlan(op_def, op_def.output_arg)
    else:
        plan = _registry_plan(node.op)[1]
    try:
        return len(plan.expand(node))
    except GraphError:
        return None


class _ArgPlan:
    """How one op's input or output args expand to typed ports, prepared once per op."""

    def __init__(self, op_def, args):
        self.op_def = op_def
        self.entries: list[tuple] = []
        for arg in args:
            if arg.type_list_attr:
                self.entries.append((arg.name, arg.type_list_attr, None, True))
                continue
            attr = TypeAttr(arg.type_attr) if arg.type_attr else TypeAttr("", -1, arg.type)
            self.entries.append((arg.name, arg.number_attr, attr, False))
        defaults = {a.name for a in op_def.attr if a.HasField("default_value")}
        self.required = sorted({attr.name for _, _, attr, _ in self.entries
                                if attr is not None and attr.name and attr.name not in defaults})
        self.fixed: list[TypeAttr] | None = None
        if all(count == "" and not is_list for _, count, _, is_list in self.entries):
            self.fixed = [attr for _, _, attr, _ in self.entries]
            self.fixed_starts = {name: k for k, (name, _, _, _) in enumerate(self.entries)}

    def expand(self, node) -> list[TypeAttr]:
        """The TypeAttr of each port of ``node`` (shared lists: do not mutate)."""
        return self.expand_with_starts(node)[0]

    def expand_with_starts(self, node) -> tuple[list[TypeAttr], dict[str, int]]:
        """The TypeAttr of each port, and the first port of each named arg."""
        for name in self.required:
            if name not in node.attr:
                raise GraphError(f"node {node.name} (op {node.op}): type attr {name} is missing")
        if self.fixed is not None:
            return self.fixed, self.fixed_starts
        result: list[TypeAttr] = []
        starts: dict[str, int] = {}
        for arg_name, count_attr, attr, is_list in self.entries:
            starts[arg_name] = len(result)
            if is_list:
                n = _attr_value(node, self.op_def, count_attr).list.type
                result.extend(TypeAttr(count_attr, k) for k in range(len(n)))
            elif count_attr:
                result.extend([attr] * _attr_value(node, self.op_def, count_attr).i)
            else:
                result.append(attr)
        return result, starts


@functools.cache
def _registry_plan(op: str) -> tuple[_ArgPlan, _ArgPlan]:
    """Port plans of a registered op; TensorFlow's registry does not change within a process."""
    op_def = OpRegistry.registry_op_def(op)
    return _ArgPlan(op_def, op_def.input_arg), _ArgPlan(op_def, op_def.output_arg)


def _attr_value(node, op_def, name: str):
    if name in node.attr:
        return node.attr[name]
    for attr_def in op_def.attr:
        if attr_def.name == name and attr_def.HasField("default_value"):
            return attr_def.default_value
    raise GraphError(f"node {node.name} (op {node.op}): attr {name} is missing")
