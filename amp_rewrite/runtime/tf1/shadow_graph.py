"""The shadow graph a patched session runs in place of its script's graph.

A :class:`ShadowGraph` builds the shadow (the script's graph rewritten, or a
float32 copy of it) and keeps it in step with the script's graph as ops are
added. Deciding when to rebuild it or fall back is
:class:`~amp_rewrite.runtime.tf1.session.keeper.ShadowKeeper`'s work, running
steps on it :class:`~amp_rewrite.runtime.tf1.session.runner.ShadowRunner`'s.
"""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple

import numpy as np

from amp_rewrite import tf_internals
from amp_rewrite.graph.facts import parse_input, sinks
from amp_rewrite.runtime.core import Runtime
from amp_rewrite.runtime.loss_scale import tf1_optimizer

logger = logging.getLogger(__name__)

CAST_BACK_SUFFIX = "CastBack-AmpRewrite"
COPY_SCOPE = "Copy-AmpRewrite"
VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")


class ShadowState(NamedTuple):
    """One shadow as :meth:`ShadowGraph.use` makes it current.

    Attributes:
        graph, session: the shadow ``tf.Graph`` and the ``Session`` that runs it.
        imported: names of the script's ops the shadow holds.
        version: the script graph's version the shadow is current with.
        cast_back: per script tensor name, the shadow's cast back to the script's dtype.
        control_proxies: per script op name without outputs, a tensor that runs after it.
    """

    graph: Any
    session: Any
    imported: set
    version: int
    cast_back: dict
    control_proxies: dict


class ShadowGraph:
    """One script graph's shadow: a ``tf.Graph`` and the ``Session`` that runs it.

    It owns the shadow graph and session, the names of the script's ops the
    shadow holds and the script graph version it is current with, the casts
    back and control proxies made for ops imported unchanged, the loss-scale
    variables known to be initialised, and what the last rewrite made
    (``result``, the ``allow`` list it used, the count of ``rewrites``).
    ``graph`` and ``session`` are None until :meth:`build` or :meth:`use`.
    """

    def __init__(self, script_graph, runtime: Runtime, session_target: str = "",
                 session_config: Any = None):
        self.script_graph = script_graph
        self.runtime = runtime
        self.settings = runtime.settings
        self.session_target = session_target
        self.session_config = session_config
        self.graph: Any = None
        self.session: Any = None
        self.imported: set[str] = set()
        self.version = -1
        self.cast_back: dict = {}
        self.control_proxies: dict = {}
        self.initialised_state: set[str] = set()
        self.allow: frozenset = frozenset()
        self.rewrites = 0
        self.result: Any = None

    def state(self) -> ShadowState:
        """This shadow, as :meth:`use` takes it to make it current again."""
        return ShadowState(self.graph, self.session, self.imported, self.version, self.cast_back,
                           self.control_proxies)

    def use(self, state: ShadowState) -> None:
        """Makes ``state``'s graph and session the shadow."""
        self.graph, self.session = state.graph, state.session
        self.imported, self.version = state.imported, state.version
        self.cast_back, self.control_proxies = state.cast_back, state.control_proxies

    def discard(self) -> None:
        """Closes the session and forgets the shadow (the script's own session runs from now on)."""
        if self.session is not None:
            self.session.close()
        self.graph = self.session = None

    def close(self) -> None:
        if self.session is not None:
            self.session.close()

    def build(self, fetched, fed, rewrite) -> tuple:
        """Rewrites the whole script graph into a new shadow holding the old shadow's variables.

        Args:
            fetched: names of the nodes fetched so far; they keep their dtype, as
                do the nodes without consumers.
            fed: names of the nodes fed so far; they are preserved.
            rewrite: the offline pass, called as ``rewrite(graph_def, fetches=, config=)``.

        Returns:
            The rewrite's result, and a phrase saying why its target was chosen.
            The old session is closed.
        """
        version = self.script_graph.version  # before the snapshot: later ops trigger an extension
        graph_def = self.script_graph.as_graph_def(add_shapes=True)
        config = self.runtime.rewrite_config(preserve=tuple(sorted(fed)))
        result = rewrite(graph_def, fetches=sorted(set(fetched) | sinks(graph_def)), config=config)
        self._dump(config, graph_def, result.graph_def)
        shadow, shadow_session = self._import(result.graph_def)
        old_session = self.session
        if old_session is not None:
            copied = copy_variables(old_session, self.graph, shadow_session, shadow)
            logger.debug("copied %d variables into the new rewritten graph", copied)
        self.use(_fresh_state(shadow, shadow_session, graph_def, version))
        if old_session is not None:
            old_session.close()
        self.result = result
        self.allow = result.lists.allow  # the lists the rewrite used
        self.rewrites += 1
        return result, self.runtime.target_reason

    def float32_copy(self, *, has_run: bool) -> ShadowState:
        """The script's graph as it is, in a new graph and session holding this shadow's variables.

        Returns the copy as :meth:`use` takes it; it is not made current.
        When the variables cannot be copied, the copy is closed and the error
        raised if the shadow ``has_run`` (it holds trained values), else ignored.
        """
        version = self.script_graph.version
        graph_def = self.script_graph.as_graph_def()
        shadow, shadow_session = self._import(graph_def)
        try:
            if self.session is not None:
                copy_variables(self.session, self.graph, shadow_session, shadow)
        except Exception:
            if has_run:
                shadow_session.close()
                raise
            logger.debug("the rewritten graph never ran; its variables are not copied")
        return _fresh_state(shadow, shadow_session, graph_def, version)

    def new_ops_convert(self) -> bool:
        """Whether an op added to the script's graph since the last import is on the allow list."""
        return any(op.type in self.allow for op in self.script_graph.get_operations()
                   if op.name not in self.imported)

    def extend(self) -> None:
        """Imports the ops added to the script's graph since the last import, as they are."""
        import tensorflow as tf
        from tensorflow.core.framework import graph_pb2

        version = self.script_graph.version
        full = self.script_graph.as_graph_def()
        new_nodes = [node for node in full.node if node.name not in self.imported]
        if new_nodes:
            delta = graph_pb2.GraphDef()
            delta.versions.CopyFrom(full.versions)
            delta.library.CopyFrom(_new_functions(full.library, self.graph))
            delta.node.extend(new_nodes)
            new_names = {node.name for node in new_nodes}
            input_map = self._input_map(new_nodes, new_names)
            with self.graph.as_default():
                tf.compat.v1.import_graph_def(delta, input_map=input_map, name="")
            self.imported |= new_names
            logger.debug("imported %d ops added after the rewrite, unchanged", len(new_nodes))
        self.version = version

    def initialise_loss_scale_state(self) -> None:
        """Initialises loss-scale variables that no initialiser the script ran covered."""
        state = _state_components(self.script_graph.get_collection(tf1_optimizer.STATE_COLLECTION))
        if all(name in self.initialised_state for name, _ in state):
            return
        import tensorflow as tf

        shadow = self.graph
        with shadow.as_default(), tf.compat.v1.name_scope(COPY_SCOPE + "/"):
            checks = [_is_initialized(shadow.get_operation_by_name(name).outputs[0])
                      for name, _ in state]
            flags = self.session.run(checks)
            missing = [init for (_, init), is_set in zip(state, flags) if not is_set]
            if missing:
                self.session.run([shadow.get_operation_by_name(init) for init in missing])
                logger.debug("initialised %d loss-scale variables", len(missing))
        self.initialised_state.update(name for name, _ in state)

    def _import(self, graph_def):
        """A new graph holding ``graph_def``, and a session on it."""
        import tensorflow as tf

        shadow = tf.Graph()
        with shadow.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        shadow_session = tf.compat.v1.Session(self.session_target, graph=shadow, config=self.session_config)
        self.runtime.objects.shadow_sessions.add(shadow_session)
        return shadow, shadow_session

    def _input_map(self, new_nodes, new_names) -> dict:
        """Existing shadow tensors for the delta's references to already imported nodes."""
        input_map = {}
        for node in new_nodes:
            for ref in node.input:
                name, port, is_control = parse_input(ref)
                if ref in input_map or name in new_names:
                    continue
                if is_control:
                    input_map[ref] = self._control_proxy(name)
                else:
                    input_map[ref] = self._tensor_as_built(name, port)
        return input_map

    def _tensor_as_built(self, op_name: str, port: int):
        """The shadow tensor ``op_name:port``, cast back to the script's dtype if it became half."""
        import tensorflow as tf

        name = f"{op_name}:{port}"
        shadow_tensor = self.graph.get_tensor_by_name(name)
        want = self.script_graph.get_tensor_by_name(name).dtype.base_dtype
        if shadow_tensor.dtype.base_dtype == want:
            return shadow_tensor
        if name not in self.cast_back:
            with self.graph.as_default(), tf.compat.v1.name_scope(None):
                self.cast_back[name] = tf.cast(shadow_tensor, want,
                                               name=f"{op_name}-{port}-{CAST_BACK_SUFFIX}")
        return self.cast_back[name]

    def _control_proxy(self, op_name: str):
        """A tensor whose op runs after ``op_name``: import maps control inputs to ops with outputs."""
        import tensorflow as tf

        op = self.graph.get_operation_by_name(op_name)
        if op.outputs:
            return op.outputs[0]
        if op_name not in self.control_proxies:
            with self.graph.as_default(), tf.compat.v1.name_scope(None), \
                    tf.control_dependencies([op]):
                self.control_proxies[op_name] = tf.constant(0, name=f"{op_name}-Done-AmpRewrite")
        return self.control_proxies[op_name]

    def _dump(self, config, before, after) -> None:
        directory = self.settings.dump_dir
        if not directory or getattr(config, "dump_dir", None):
            return  # nothing asked, or the rewrite itself dumps
        os.makedirs(directory, exist_ok=True)
        stem = os.path.join(directory, f"amp_rewrite_{os.getpid()}_{id(self.script_graph):x}")
        for label, graph_def in (("before", before), ("after", after)):
            with open(f"{stem}_{label}.pb", "wb") as f:
                f.write(graph_def.SerializeToString(deterministic=True))
        logger.debug("wrote %s_{before,after}.pb", stem)


def _fresh_state(graph, session, graph_def, version: int) -> ShadowState:
    """A shadow just imported from ``graph_def``: no casts back or control proxies yet."""
    return ShadowState(graph, session, {node.name for node in graph_def.node}, version, {}, {})


def copy_variables(source_session, source_graph, target_session, target_graph) -> int:
    """Copies every initialised variable of ``source_graph`` to its namesake in ``target_graph``.

    Returns how many were copied. Variables the source never initialised stay
    as they are in the target; values are cast when the two dtypes differ.
    """
    import tensorflow as tf

    pairs = []
    for op in source_graph.get_operations():
        if op.type not in VARIABLE_OPS:
            continue
        try:
            other = target_graph.get_operation_by_name(op.name)
        except KeyError:
            continue
        if other.type == op.type:
            pairs.append((op, other))
    if not pairs:
        return 0
    with source_graph.as_default(), tf.compat.v1.name_scope(COPY_SCOPE + "/"):
        flags = source_session.run([_is_initialized(op.outputs[0]) for op, _ in pairs])
        pairs = [pair for pair, is_set in zip(pairs, flags) if is_set]
        values = source_session.run([_read(op) for op, _ in pairs])
    if not pairs:
        return 0
    feeds, assigns = {}, []
    with target_graph.as_default(), tf.compat.v1.name_scope(COPY_SCOPE + "/"):
        for (_, other), value in zip(pairs, values):
            dtype = other.get_attr("dtype")
            holder = tf.compat.v1.placeholder(dtype.base_dtype)
            feeds[holder] = np.asarray(value).astype(dtype.base_dtype.as_numpy_dtype, copy=False)
            assigns.append(_assign(other, holder))
    target_session.run(assigns, feeds)
    return len(pairs)


def _state_components(variables) -> list:
    """(variable op name, initializer op name) of each variable, per replica when mirrored."""
    out = []
    for variable in variables:
        for component in tf_internals.replica_components(variable):
            out.append((component.op.name, component.initializer.name))
    return out


def _is_initialized(handle):
    import tensorflow as tf

    if handle.op.type == "VarHandleOp":
        return tf.raw_ops.VarIsInitializedOp(resource=handle)
    return tf.compat.v1.is_variable_initialized(handle)


def _read(op):
    import tensorflow as tf

    if op.type == "VarHandleOp":
        return tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=op.get_attr("dtype"))
    return op.outputs[0]


def _assign(op, value):
    import tensorflow as tf

    if op.type == "VarHandleOp":
        return tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=value)
    return tf.compat.v1.assign(op.outputs[0], value, validate_shape=False).op


def _new_functions(library, shadow_graph):
    from tensorflow.core.framework import function_pb2

    out = function_pb2.FunctionDefLibrary()
    for function in library.function:
        if not tf_internals.graph_defines_function(shadow_graph, function.signature.name):
            out.function.add().CopyFrom(function)
    known = {g.function_name for g in out.gradient}
    for gradient in library.gradient:
        if gradient.function_name not in known and any(
                f.signature.name == gradient.function_name for f in out.function):
            out.gradient.add().CopyFrom(gradient)
    return out
