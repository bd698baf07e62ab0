"""Rewriting one ``ConcreteFunction``: its FunctionDefs in, a ConcreteFunction running the result out.

A traced ``tf.function`` is a FunctionDef (the *entry*) plus the library it
calls. The entry is rewritten the way :mod:`amp_rewrite.saved_model` rewrites a
SavedModel's entries, with the same synthetic call
(:func:`amp_rewrite.graph.functions.entry_call`): fetched, it keeps the entry's
inputs and outputs in their dtypes, while its body and everything it calls are
rewritten.

The result is then loaded back much as ``tf.saved_model.load`` loads a
function library, which keeps every TensorFlow mechanism working on it:

- every function the rewrite changed is rebuilt as a ``FuncGraph``
  (``function_def_to_graph``) and registered under a fresh name, callees
  first; unchanged functions keep their registered originals;
- call ops in a rebuilt body get their callee's gradient function, as
  TensorFlow's control-flow code does for bodies it rebuilds, so gradients
  taken from outside the function reach through nested calls;
- a rebuilt body that holds a loss-scale guard puts back, when its step is
  skipped, the variables the step wrote besides the optimizer's update
  (:func:`~amp_rewrite.runtime.loss_scale.step_writes.restore_in_body`);
- the entry's graph is bound like the traced one: the same captured tensors
  and variables (by position), structured outputs, input signature and
  attributes, so ``ConcreteFunction.from_func_graph`` with the traced function's
  ``function_type`` gives a function with the same signature.

:func:`reload_calling` loads a traced body again the same way, with the
calls of some functions sent to others (the float32 body of a function that
calls a rewritten one, when that one falls back to its traced body).

Guarantees: the caller's ConcreteFunction is not modified; node names are kept
(the rewrite preserves them); ``tf.custom_gradient`` ops that a gradient of the
outputs would reach in a rebuilt body are reported, because their closures
hold tensors of the traced graph and cannot differentiate the rebuilt one.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.config import Config
from amp_rewrite.graph.facts import called_functions, function_input_source
from amp_rewrite.graph.functions import ENTRY_PREFIX, entry_call
from amp_rewrite.pipeline import RewriteResult, rewrite
from amp_rewrite.runtime.loss_scale.step_writes import restore_in_body
from amp_rewrite.runtime.overflow_probe import add_probes

logger = logging.getLogger(__name__)

ENTRY_CALL = ENTRY_PREFIX
CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")
CUSTOM_GRADIENT_ATTR = "_gradient_op_type"
_GENERATED_NAME = re.compile(r"^(?:__inference_|__forward_|__backward_)?(.*?)(?:_\d+)?$")


@dataclass(frozen=True)
class RewrittenFunction:
    """What rewriting a ConcreteFunction gave.

    Attributes:
        concrete_function: the new ConcreteFunction, or None when the rewrite
            changed nothing.
        result: the rewrite of the entry and its library.
        custom_gradient_ops: ``tf.custom_gradient`` ops (``function::node``) of
            rebuilt bodies on a path to the outputs; their gradient closures
            know only the traced graph, so a gradient taken from outside the
            function cannot go through the rebuilt one.
    """

    concrete_function: object
    result: RewriteResult
    custom_gradient_ops: tuple[str, ...] = ()

    @property
    def has_custom_gradients(self) -> bool:
        return bool(self.custom_gradient_ops)


def rewrite_concrete(concrete_function, config: Config, *,
                     is_probing_overflow: bool = False) -> RewrittenFunction:
    """Rewrites ``concrete_function`` (never modified) and loads the result.

    Args:
        concrete_function: a ``ConcreteFunction`` from ``tf.function`` tracing.
        config: the rewrite configuration; ``fetches`` and ``preserve`` are set here.
        is_probing_overflow: give each rebuilt body finiteness probes on its half
            outputs (:func:`amp_rewrite.runtime.overflow_probe.add_probes`).

    Raises:
        Any error of the rewrite or of TensorFlow while loading the result.
    """
    entry = concrete_function.function_def
    if is_probing_overflow and entry.attr["_XlaMustCompile"].b:
        logger.warning("amp-rewrite: tf.function %s is XLA-compiled, which cannot print: no overflow "
                       "probes (trace it with jit_compile=False to find the op)",
                       _GENERATED_NAME.match(entry.signature.name).group(1))  # type: ignore[union-attr]
        is_probing_overflow = False
    originals = tf_internals.graph_functions(concrete_function.graph)
    graph_def = _entry_graph_def(entry, [f.definition for f in originals.values()])
    result = rewrite(graph_def, config=replace(config, fetches=(ENTRY_CALL,), preserve=()), in_place=True)
    changed = set(result.applied.functions_rewritten)
    if entry.signature.name not in changed:
        return RewrittenFunction(None, result)
    library = {f.signature.name: f for f in result.graph_def.library.function}
    loader = _Loader(library, originals, is_probing_overflow=is_probing_overflow)
    for name in _callees_first(library, changed - {entry.signature.name}):
        loader.load_nested(name)
    new = loader.load_entry(entry.signature.name, concrete_function)
    custom = _differentiated_custom_gradients(entry.signature.name, library, changed)
    return RewrittenFunction(new, result, custom_gradient_ops=tuple(custom))


def reload_calling(concrete_function, replacements: Mapping[str, Any], *,
                   transform: Callable[[Any], Any] | None = None):
    """``concrete_function``'s body loaded again, with its calls of some functions sent to others.

    Every function on a call path from the body to a replaced one is rebuilt
    with the call renamed; the rest keep their registered originals. This is
    how a function that calls a rewritten one gets a body calling the traced
    one back (its FunctionDef names the rewritten callee, so restoring the
    callee does not reach it).

    Args:
        concrete_function: a traced ConcreteFunction (never modified).
        replacements: registered name of a function its body calls → the
            function object (an AtomicFunction of the same signature) to call instead.
        transform: takes each FunctionDef of the body and its library, and
            returns it changed (a copy), or None; the changed ones are rebuilt
            too (as the float32 variant of a loss-scaled step is,
            :func:`amp_rewrite.runtime.loss_scale.unscaled.unscaled_function`).

    Returns:
        The new ConcreteFunction, or None when the body reaches none of the
        names and the transform changes nothing it calls.
    """
    originals = tf_internals.graph_functions(concrete_function.graph)
    entry = concrete_function.function_def
    library = {name: f.definition for name, f in originals.items()}
    library[entry.signature.name] = entry
    called = _called_from(library, entry.signature.name, stop=set(replacements))  # replaced ones are not called
    changed = {name: new for name in sorted(called)
               if transform is not None and (new := transform(library[name])) is not None}
    library.update(changed)
    reaching = _reaching(library, set(replacements) | set(changed)) | set(changed)
    if entry.signature.name not in reaching:
        return None
    loader = _Loader(library, {**originals, **{_text(f.name): f for f in replacements.values()}},
                     suffix="_float32")
    loader.renamed.update({name: _text(f.name) for name, f in replacements.items()})
    for name in _callees_first(library, reaching - {entry.signature.name}):
        loader.load_nested(name)
    return loader.load_entry(entry.signature.name, concrete_function)


def _called_from(library: dict, root: str, *, stop: set[str]) -> set[str]:
    """``root`` and the functions of ``library`` its calls reach, not going through those in ``stop``."""
    called: set[str] = set()
    pending = [root]
    while pending:
        name = pending.pop()
        if name in called or name in stop or name not in library:
            continue
        called.add(name)
        pending += _callees(library[name], library)
    return called


def _reaching(library: dict, targets: set[str]) -> set[str]:
    """The functions of ``library`` from which a chain of calls reaches one of ``targets``."""
    callees = {name: _callees(fdef, library) for name, fdef in library.items()}
    reaching: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, called in callees.items():
            if name not in reaching and called & (targets | reaching):
                reaching.add(name)
                grew = True
    return reaching


def _entry_graph_def(entry, library):
    """A GraphDef that only calls ``entry``, with a placeholder per argument."""
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    graph_def.library.function.add().CopyFrom(entry)
    graph_def.library.function.extend(library)
    graph_def.node.extend(entry_call(entry.signature, ENTRY_CALL))
    return graph_def


def _callees_first(library: dict, names: set[str]) -> list[str]:
    """``names`` ordered so that every function comes after the functions it calls."""
    ordered: list[str] = []
    visited: set[str] = set()

    def visit(name):
        if name in visited:
            return
        visited.add(name)
        for callee in sorted(_callees(library[name], library) & names):
            visit(callee)
        ordered.append(name)

    for name in sorted(names):
        visit(name)
    return ordered


def _callees(fdef, library) -> set[str]:
    """The functions of ``library`` (anything supporting ``in``) that ``fdef``'s nodes call."""
    return {name for node in fdef.node_def for name in called_functions(node, library)}


def _differentiated_custom_gradients(name: str, library: dict, rebuilt: set[str]) -> list[str]:
    """Custom-gradient ops of rebuilt bodies that a gradient of ``name``'s outputs would reach.

    Only ops on a data path to a function's results matter (an optimizer
    update in a train step is not differentiated), and only in rebuilt
    bodies: a function kept as traced keeps gradient closures that work.
    """
    found: list[str] = []
    seen: set[str] = set()
    pending = [name]
    while pending:
        fname = pending.pop()
        if fname in seen or fname not in rebuilt:
            continue
        seen.add(fname)
        fdef = library[fname]
        for node in _on_result_paths(fdef):
            if CUSTOM_GRADIENT_ATTR in node.attr:
                found.append(f"{fname}::{node.name}")
            pending.extend(called_functions(node, library))
    return found


def _on_result_paths(fdef) -> list:
    """The body nodes whose outputs feed, through data edges, one of the function's results."""
    nodes = {node.name: node for node in fdef.node_def}
    stack = [function_input_source(ref) for ref in fdef.ret.values()]
    live: dict[str, object] = {}
    while stack:
        name = stack.pop()
        node = nodes.get(name)
        if node is None or name in live:
            continue  # an argument, or already seen
        live[name] = node
        stack.extend(function_input_source(ref) for ref in node.input if not ref.startswith("^"))
    return list(live.values())


def _rename_callees(fdef, renamed: dict[str, str]) -> None:
    for node in fdef.node_def:
        if node.op in renamed:
            node.op = renamed[node.op]
        for value in node.attr.values():
            if value.func.name in renamed:
                value.func.name = renamed[value.func.name]
            for f in value.list.func:
                if f.name in renamed:
                    f.name = renamed[f.name]


class _Callees:
    """The functions rebuilt bodies may call, by registered name: rebuilt ones and originals."""

    def __init__(self, originals: dict):
        self.originals = originals
        self.rebuilt: dict[str, Any] = {}  # registered name → ConcreteFunction
        self._wrapped: dict[str, object] = {}

    def __contains__(self, registered: str) -> bool:
        return registered in self.rebuilt or registered in self.originals

    def function(self, registered: str):
        """The function object to add to a graph calling ``registered``, or None if no function."""
        if registered in self.rebuilt:
            return tf_internals.inference_function(self.rebuilt[registered])
        return self.originals.get(registered)

    def gradient_function(self, registered: str):
        """A gradient function for call ops of ``registered``, built when first asked for."""

        def gradient(op, *output_gradients):
            return tf_internals.gradient_function(self._concrete(registered))(op, *output_gradients)

        return gradient

    def _concrete(self, registered: str):
        if registered in self.rebuilt:
            return self.rebuilt[registered]
        if registered not in self._wrapped:
            self._wrapped[registered] = tf_internals.concrete_function_of(self.originals[registered])
        return self._wrapped[registered]


class _Loader:
    """Registers rewritten FunctionDefs as ConcreteFunctions, callees first."""

    def __init__(self, library: dict, originals: dict, *, is_probing_overflow: bool = False,
                 suffix: str = "_amp"):
        self.library = library
        self.is_probing_overflow = is_probing_overflow
        self.suffix = suffix  # of the rebuilt functions' names
        self.callees = _Callees(originals)
        self.renamed: dict[str, str] = {}  # rewritten name → registered name

    def load_nested(self, name: str) -> None:
        graph = self._func_graph(name)
        loaded = tf_internals.concrete_function_from_graph(
            graph, None, _function_attrs(self.library[name]), shared_func_graph=True)
        self.renamed[name] = _text(loaded.name)
        self.callees.rebuilt[self.renamed[name]] = loaded

    def load_entry(self, name: str, traced):
        graph = self._func_graph(name)
        _bind_like(graph, traced.graph)
        attrs = _function_attrs(self.library[name])
        new = tf_internals.concrete_function_from_graph(graph, traced.function_type, attrs,
                                                        shared_func_graph=False)
        tf_internals.copy_call_signature(traced, new)
        return new

    def _func_graph(self, name: str):
        """The FuncGraph of the rewritten ``name``, its callees registered and differentiable."""
        import tensorflow as tf

        fdef = type(self.library[name])()
        fdef.CopyFrom(self.library[name])
        _rename_callees(fdef, self.renamed)
        fdef.signature.name = _GENERATED_NAME.match(name).group(1) + self.suffix  # type: ignore[union-attr]
        functions = [self.callees.function(c) for c in sorted(_callees(fdef, self.callees))]
        functions = [f for f in functions if f is not None]
        with tf.Graph().as_default() as outer:
            for function in functions:  # ops named after a function need it defined
                tf_internals.add_function_to_graph(outer, function)
            graph = tf_internals.function_def_to_graph(fdef, propagate_device_spec=True)
        for function in functions:
            tf_internals.add_function_to_graph(graph, function)
        for op in graph.get_operations():
            if op.type in CALL_OPS:
                callee = _text(op.get_attr("f").name)
                tf_internals.set_gradient_function(op, self.callees.gradient_function(callee))
        if self.is_probing_overflow:
            add_probes(graph, _GENERATED_NAME.match(name).group(1))  # type: ignore[union-attr]
        restore_in_body(graph)
        return graph


def _bind_like(graph, traced) -> None:
    """Gives the rebuilt entry ``graph`` the traced graph's captures, variables and structure.

    Inputs correspond by position: the FunctionDef's arguments are the traced
    graph's inputs, captures included, in order.
    """
    import tensorflow as tf

    position = {id(t): k for k, t in enumerate(traced.inputs)}
    for old, new in zip(traced.inputs, graph.inputs):
        new.set_shape(old.shape)
        if old.dtype.name == "resource":
            tf_internals.copy_handle_data(old, new)
    captures, new_captures = traced.function_captures, graph.function_captures
    for key, internal in captures.by_val_internal.items():
        new_captures.add_or_replace(key=key, external=captures.by_val_external[key],
                                    internal=graph.inputs[position[id(internal)]],
                                    tracetype=captures.by_val_tracetype[key], is_by_ref=False)
    for key, internal in captures.by_ref_internal.items():
        new_internal = tf.nest.map_structure(lambda t: graph.inputs[position[id(t)]], internal)
        new_captures.add_or_replace(key=key, external=captures.by_ref_external[key],
                                    internal=new_internal,
                                    tracetype=captures.by_ref_tracetype[key], is_by_ref=True)
    new_captures.control.update(captures.control)
    for old, new in zip(traced.outputs, graph.outputs):
        new.set_shape(old.shape)
        if old.dtype.name == "resource":
            tf_internals.copy_handle_data(old, new)
    outputs = {id(t): new for t, new in zip(traced.outputs, graph.outputs)}
    graph.structured_outputs = tf.nest.map_structure(
        lambda value: outputs.get(id(value), value), traced.structured_outputs, expand_composites=True)
    graph.structured_input_signature = traced.structured_input_signature
    graph.variables = traced.variables
    graph.collective_manager_ids_used = list(getattr(traced, "collective_manager_ids_used", []))
    if not traced.saveable:
        graph.mark_as_unsaveable(traced.saving_errors)


def _function_attrs(fdef) -> dict:
    """The FunctionDef attributes a new function may carry (XLA, no-inline, ...)."""
    allowed = tf_internals.allowed_function_attrs()
    return {key: value for key, value in fdef.attr.items() if key in allowed}


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else name
