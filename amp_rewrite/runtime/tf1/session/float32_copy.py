"""The float32 copy of a session step, imported into the shadow graph beside its rewritten step.

A step on trial (:mod:`~amp_rewrite.runtime.tf1.session.session_trial`)
alternates its rewritten plan with the plan :func:`float32_plan` makes: the
script graph's ops that the step's fetches depend on, imported into the
shadow once more, as the script built them (float32), under the scope
:data:`FLOAT32_SCOPE`. Both variants run in the same session, on the same
state:

- **State is shared, not copied.** The ops that make state (variables, and
  the resources a step reads: iterators, queues, readers, tables) are left
  out of the copy; every input that read one reads the shadow's own op of
  that name instead. So either variant trains the same variables, and takes
  the next batch from the same iterator or queue: every run of the trial is
  the script's next step, and a float32 verdict runs exactly the script's
  float32 step on what the earlier steps left. (A second copy of such an op
  would be another resource: an iterator starting over.)
- **Functions are the script's.** Control flow v2 (``tf.cond``,
  ``tf.while_loop``, an RNN with ``sequence_length``: TF2's default, even
  under ``disable_eager_execution()``), their gradients and ``Defun``
  functions are called through the graph's function library, which the
  rewrite changed in place: under the same names, the copy would reach the
  half bodies. Each function the copy reaches whose float32 body is not
  the shadow's (and each one calling such a function) is imported too,
  under its name with :data:`FUNCTION_SUFFIX`, as the script defined it,
  and the copy's calls (a node's attributes, or its op for a ``Defun``) and
  its functions' calls name those. Functions the rewrite left alone are
  shared.
- **No loss scaling.** A step whose optimizer the runtime scales (float16)
  is copied without it (:mod:`amp_rewrite.runtime.loss_scale.unscaled`): the
  copy applies true gradients unchecked, as the script's float32 step would,
  and leaves the loss-scale state as the half steps left it. Its plan
  fetches no loss-scale report.
- **Only what the step needs.** After the loss scaling is taken out, the
  copy keeps the ops the fetches still read.

:class:`NoTrial` is raised where the shadow's state is not the script's (a
variable of another dtype): the step then runs the rewrite untried.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.graph.facts import called_functions, node_name, parse_input
from amp_rewrite.runtime.loss_scale.step_writes import ancestors
from amp_rewrite.runtime.loss_scale.unscaled import unscaled_function, unscaled_nodes
from amp_rewrite.runtime.tf1.session.plans import FeedPlan, PlanKey, RunPlan, dtype_change

# The ops that hold a variable (as the shadow graph's copy of variables knows them).
VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")
#: The scope the float32 copies of the shadow's steps are imported under.
FLOAT32_SCOPE = "Float32-AmpRewrite"
#: What a function the copy imports again, as the script defined it, adds to its name.
FUNCTION_SUFFIX = "_float32_amp_rewrite"


class NoTrial(Exception):
    """A step that cannot be tried: the message says why."""


def float32_plan(script_graph, shadow_graph, key: PlanKey, half: RunPlan) -> RunPlan:
    """The plan of the step's float32 copy, imported into ``shadow_graph`` over the shadow's own state.

    A fed tensor the copy does not read (Keras feeds its learning phase to
    every step), and a fetched variable, are fed and fetched as ``half``,
    the rewritten plan, does.

    Raises :class:`NoTrial` when an op of state the step reads is not the
    shadow's op of the same kind.
    """
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    script_ops = list(ancestors(script_graph.as_graph_element(name) for name in key.fetches))
    state = {op.name for op in script_ops if is_state(op)}
    nodes = [_without_colocation(op.node_def) for op in script_ops if op.name not in state]
    nodes = unscaled_nodes(nodes) or nodes
    nodes = _needed(nodes, [node_name(name) for name in key.fetches])
    library = Float32Library(script_graph, shadow_graph)
    nodes = library.calling_copies(nodes)
    copy = graph_pb2.GraphDef()
    copy.versions.CopyFrom(script_graph.graph_def_versions)
    copy.node.extend(nodes)
    copy.library.function.extend(library.copies())
    input_map = _state_map(nodes, state, script_graph, shadow_graph)
    copied = {node.name for node in nodes}
    inside = [name for name in (*key.fetches, *key.feeds) if node_name(name) in copied]
    with shadow_graph.as_default():
        elements = dict(zip(inside, tf.compat.v1.import_graph_def(copy, input_map=input_map, return_elements=inside,
                                                                  name=FLOAT32_SCOPE)))
    fetches, fetch_dtypes = [], []
    for index, name in enumerate(key.fetches):
        if name in elements:
            fetches.append(elements[name])
            fetch_dtypes.append(dtype_change(script_graph.as_graph_element(name), elements[name]))
        else:
            fetches.append(half.fetches[index])
            fetch_dtypes.append(half.fetch_dtypes[index])
    feeds = {name: FeedPlan(elements[name], None) if name in elements else half.feeds[name] for name in key.feeds}
    return RunPlan(fetches, fetch_dtypes, feeds)


def is_state(op) -> bool:
    """Whether ``op`` makes state the copy shares: a variable, or a resource (a queue, an iterator, a table)."""
    if op.type in VARIABLE_OPS:
        return True
    if op.inputs or not op.outputs or not op.op_def.is_stateful:
        return False
    return any(tensor.dtype.base_dtype.name == "resource" or tensor.dtype.is_ref_dtype for tensor in op.outputs)


class Float32Library:
    """The functions a step's float32 copy calls: the shadow's where they are the script's, else imported again.

    Attributes:
        script, shadow: the two graphs' functions, by name.
        renamed: each function imported again → the name it is imported under.
        definitions: the float32 body of each function reached (the script's, without loss scaling).
    """

    def __init__(self, script_graph, shadow_graph):
        self.script = tf_internals.graph_functions(script_graph)
        self.shadow = tf_internals.graph_functions(shadow_graph)
        self.definitions: dict[str, Any] = {}
        self.renamed: dict[str, str] = {}

    def calling_copies(self, nodes: list) -> list:
        """``nodes``, with the calls of functions imported again renamed (copies where they change)."""
        self._reach(name for node in nodes for name in called_functions(node, self.script))
        self._choose()
        return [_renamed_calls(node, self.renamed) for node in nodes]

    def copies(self) -> list:
        """The FunctionDefs to import: each function renamed, under its new name, calling the renamed ones."""
        out = []
        for name in sorted(self.renamed):
            fdef = type(self.definitions[name])()
            fdef.CopyFrom(self.definitions[name])
            fdef.signature.name = self.renamed[name]
            nodes = [_renamed_calls(node, self.renamed) for node in fdef.node_def]
            del fdef.node_def[:]
            fdef.node_def.extend(nodes)
            out.append(fdef)
        return out

    def _reach(self, names: Iterable[str]) -> None:
        """The float32 body of every function ``names`` lead to, through the functions they call."""
        pending = list(names)
        while pending:
            name = pending.pop()
            if name in self.definitions or name not in self.script:
                continue
            script = self.script[name].definition
            self.definitions[name] = unscaled_function(script) or script
            pending += [callee for node in self.definitions[name].node_def
                        for callee in called_functions(node, self.script)]

    def _choose(self) -> None:
        """Renames each function whose float32 body the shadow lacks, then each one that calls a renamed one."""
        changed = {name for name, fdef in self.definitions.items()
                   if name not in self.shadow or self.shadow[name].definition != fdef}
        grew = True
        while grew:
            grew = False
            for name, fdef in self.definitions.items():
                if name not in changed and any(callee in changed for node in fdef.node_def
                                               for callee in called_functions(node, self.script)):
                    changed.add(name)
                    grew = True
        self.renamed = {name: name + FUNCTION_SUFFIX for name in sorted(changed)}


def _renamed_calls(node, renamed: Mapping[str, str]):
    """``node``, or a copy of it calling the ``renamed`` functions by their new names."""
    called = [name for name in called_functions(node, renamed) if name in renamed]
    if not called:
        return node
    new = type(node)()
    new.CopyFrom(node)
    if new.op in renamed:
        new.op = renamed[new.op]
    for value in new.attr.values():
        if value.func.name in renamed:
            value.func.name = renamed[value.func.name]
        for function in value.list.func:
            if function.name in renamed:
                function.name = renamed[function.name]
    return new


def _without_colocation(node):
    """``node`` (an op's NodeDef: a copy) without ``_class``: it names ops of state the copy leaves out, and the
    placer colocates what reads a ref variable anyway."""
    if "_class" in node.attr:
        del node.attr["_class"]
    return node


def _needed(nodes: list, roots: list[str]) -> list:
    """The ``nodes`` that ``roots`` read, through data and control inputs (in their order)."""
    by_name = {node.name: node for node in nodes}
    seen: set[str] = set()
    pending = [name for name in roots if name in by_name]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        pending += [source for source in (parse_input(ref)[0] for ref in by_name[name].input) if source in by_name]
    return [node for node in nodes if node.name in seen]


def _state_map(nodes: list, state: set[str], script_graph, shadow_graph) -> dict:
    """The copy's inputs that read an op of ``state``, each mapped to the shadow's op of that name."""
    input_map: dict[str, Any] = {}
    for node in nodes:
        for ref in node.input:
            name, port, is_control = parse_input(ref)
            if name in state:
                input_map[ref if is_control else f"{name}:{port}"] = _shared(script_graph, shadow_graph, name, port)
    return input_map


def _shared(script_graph, shadow_graph, name: str, port: int):
    """The shadow's output of the op of state ``name``, which the copy reads in place of its own."""
    mine = script_graph.get_operation_by_name(name)
    try:
        theirs = shadow_graph.get_operation_by_name(name)
    except KeyError:
        raise NoTrial(f"the shadow has no {mine.type} {name!r}") from None
    if theirs.type != mine.type or [t.dtype for t in theirs.outputs] != [t.dtype for t in mine.outputs] or (
            mine.type in VARIABLE_OPS and theirs.get_attr("dtype") != mine.get_attr("dtype")):
        raise NoTrial(f"the shadow's {mine.type} {name!r} is not the script's")
    return theirs.outputs[max(port, 0)]  # a control input maps to a tensor of the op, as import takes it
