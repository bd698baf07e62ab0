"""TensorFlow's and Keras's private parts, all reached from here.

The package uses TensorFlow's public API (``tf.*``) wherever one does the
job. Where none does (the ``tf.function`` tracing hook, the TF1 session's run
machinery, optimizer internals, Grappler, the C importer), the private
symbol is reached through a function of this module, one per capability, so
that what depends on TensorFlow's internals reads in one file and a new
TensorFlow release means changing one file. (The generated protobuf modules
under ``tensorflow.core`` are TensorFlow's file formats, not internals.)

Each runtime path lists the private symbols it needs as a :class:`Capability`.
When the runtime is enabled it checks them with :func:`missing` (an import
and an attribute lookup per symbol, nothing called): a path whose symbols
are not all there runs float32 with one line naming what is missing, or
raises in strict mode. The Keras capabilities are checked when Keras is
imported, since the runtime must not import it first.

Tested with TensorFlow 2.16 to 2.21 (:data:`TESTED`), with Keras 3 and, under
``TF_USE_LEGACY_KERAS=1``, tf_keras; a newer TensorFlow runs when its
capabilities are there (:func:`untested_version` names it).
"""

from __future__ import annotations

import importlib
import logging
import re
from dataclasses import dataclass
from typing import Any

from amp_rewrite.errors import RuntimeRewriteError

logger = logging.getLogger(__name__)

TESTED = ((2, 16), (2, 21))  # oldest and newest (major, minor) the suite runs on


@dataclass(frozen=True)
class Capability:
    """The private symbols one runtime path needs.

    Attributes:
        name: what the path is, as a user reads it (``tf.function tracing``).
        symbols: each ``module:attribute.attribute``.
    """

    name: str
    symbols: tuple[str, ...]


_SESSION = "tensorflow.python.client.session"
_OPS = "tensorflow.python.framework.ops"
_TRACING = "tensorflow.python.eager.polymorphic_function"
_KERAS3 = "keras.src"
_TF_KERAS = "tf_keras.src"

SESSIONS = Capability("TF1 sessions", (
    f"{_SESSION}:BaseSession.run",
    f"{_SESSION}:BaseSession.make_callable",
    f"{_SESSION}:BaseSession._make_callable_from_options",
    f"{_SESSION}:BaseSession._do_call",
    f"{_SESSION}:_FetchMapper.for_fetch",
    f"{_SESSION}:_REGISTERED_EXPANSIONS",
    "tensorflow.python.util.nest:flatten_dict_items",
    f"{_OPS}:Graph._is_function",
))
TF1_LOSS_SCALING = Capability("TF1 loss scaling", (
    "tensorflow.python.training.optimizer:Optimizer._create_slots",
    f"{_OPS}:Graph._unsafe_unfinalize",
    f"{_OPS}:Operation._add_control_input",
))
TRACING = Capability("tf.function tracing", (
    f"{_TRACING}.transform:CONCRETE_FUNCTION_CALLBACKS",
    f"{_TRACING}.concrete_function:ConcreteFunction.from_func_graph",
    f"{_TRACING}.concrete_function:ConcreteFunction._call_flat",
    f"{_TRACING}.concrete_function:ConcreteFunction._get_gradient_function",
    f"{_TRACING}.attributes:MONOMORPHIC_FUNCTION_ALLOWLIST",
    f"{_TRACING}.attributes:EAGER_RUNTIME_CONSTRUCTION_CONTEXT",
    f"{_TRACING}.attributes:INPUT_SHAPES",
    "tensorflow.python.framework.function_def_to_graph:function_def_to_graph",
    "tensorflow.python.ops.handle_data_util:copy_handle_data",
    f"{_OPS}:Graph._add_function_recursive",
    f"{_OPS}:Operation._add_control_input",
))
TF2_LOSS_SCALING = Capability("TF2 loss scaling", (
    "tensorflow.python.trackable.base:Trackable._track_trackable",
    "tensorflow.python.ops.control_flow_util:GraphOrParentsInXlaContext",
))
KERAS3_OPTIMIZERS = Capability("Keras 3 optimizers", (
    f"{_KERAS3}.backend:backend",
    f"{_KERAS3}.backend:name_scope",
    f"{_KERAS3}.optimizers.base_optimizer:BaseOptimizer.apply",
    f"{_KERAS3}.optimizers.base_optimizer:BaseOptimizer.scale_loss",
    f"{_KERAS3}.optimizers.loss_scale_optimizer:LossScaleOptimizer.scale_loss",
))
TF_KERAS_OPTIMIZERS = Capability("tf_keras optimizers", (
    f"{_TF_KERAS}.optimizers.optimizer:Optimizer.apply_gradients",
    f"{_TF_KERAS}.mixed_precision.loss_scale_optimizer:LossScaleOptimizer.get_scaled_loss",
    f"{_TF_KERAS}.mixed_precision.loss_scale_optimizer:LossScaleOptimizerV3.get_scaled_loss",
))
_CONTEXT = "tensorflow.python.eager.context"
MULTI_WORKER = Capability("the multi-worker agreement", (
    f"{_CONTEXT}:context",
    f"{_CONTEXT}:Context.coordination_service",
    f"{_CONTEXT}:Context.set_config_key_value",
    f"{_CONTEXT}:Context.get_config_key_value",
    f"{_CONTEXT}:Context.report_error_to_cluster",
))
STEP_TRIALS = Capability("the step trials", (
    "tensorflow.python.framework.config:is_op_determinism_enabled",
    "tensorflow.python.ops.handle_data_util:get_resource_handle_data",
))
# Marking the ops that join gradients (loss scaling on a GPU), without which they are not joined.
NODE_ATTRS = Capability("attrs on built ops", (f"{_OPS}:Operation._set_attr",))
# The modules whose import makes the runtime patch Keras optimizers.
KERAS3_LOSS_SCALE_MODULE = f"{_KERAS3}.optimizers.loss_scale_optimizer"
TF_KERAS_LOSS_SCALE_MODULE = f"{_TF_KERAS}.mixed_precision.loss_scale_optimizer"


def resolve(symbol: str) -> Any:
    """The object a ``module:attribute.attribute`` symbol names (ImportError/AttributeError if none)."""
    module_name, _, path = symbol.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in path.split("."):
        found = getattr(found, part)
    return found


def missing(capability: Capability) -> list[str]:
    """The symbols of ``capability`` this TensorFlow lacks, in the capability's order."""
    absent = []
    for symbol in capability.symbols:
        try:
            resolve(symbol)
        except (ImportError, AttributeError):
            absent.append(symbol)
    return absent


def lacking(capability: Capability, absent: list[str]) -> str:
    """Why a path runs float32: ``TensorFlow X lacks SYMBOL (and N more), which PATH needs``."""
    import tensorflow as tf

    more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
    return f"TensorFlow {tf.__version__} lacks {absent[0]}{more}, which {capability.name} under amp-rewrite needs"


def usable(capabilities: list[Capability], what: str, *, is_strict: bool, outcome: str = "run in float32") -> bool:
    """Whether this TensorFlow has every capability; if not, one warning says ``what`` runs float32 (``outcome``).

    Raises:
        RuntimeRewriteError: a capability is missing and ``is_strict``.
    """
    for capability in capabilities:
        absent = missing(capability)
        if absent:
            message = f"{what} {outcome}: {lacking(capability, absent)}"
            if is_strict:
                raise RuntimeRewriteError(message)
            logger.warning("amp-rewrite: %s", message)
            return False
    return True


def untested_version(version: str) -> str | None:
    """A sentence when ``version`` is outside :data:`TESTED`, else None."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return f"TensorFlow {version} is not a version the package was tested with"
    found = (int(match.group(1)), int(match.group(2)))
    (low_major, low_minor), (high_major, high_minor) = TESTED
    if TESTED[0] <= found <= TESTED[1]:
        return None
    side = "newer" if found > TESTED[1] else "older"
    return (f"TensorFlow {version} is {side} than the versions tested ({low_major}.{low_minor} to "
            f"{high_major}.{high_minor}); its internals were checked and are there")


# --- TF1 sessions ---------------------------------------------------------------------------


def base_session_class():
    """``BaseSession``, the class every TF1 session (plain, interactive, monitored) derives from."""
    from tensorflow.python.client import session

    return session.BaseSession


def run_unpatched(session, fetches, feed_dict=None, **kwargs):
    """``session.run`` as TensorFlow defines it, past any wrapper put on it (the runtime's patch).

    amp-rewrite's own sessions (validating or timing a rewrite) must run
    the graph they were given: under ``ENABLE_AUTO_MP=1`` the patched ``run``
    would rewrite a float32 reference graph into half. ``kwargs`` are
    ``run``'s (``options``, ``run_metadata``).
    """
    import inspect

    return inspect.unwrap(type(session).run)(session, fetches, feed_dict, **kwargs)


def session_is_closed(session) -> bool:
    return bool(session._closed)  # noqa: SLF001


def run_session_callable(session, run, *feeds):
    """Runs a callable made by ``_make_callable_from_options`` the way the session runs it."""
    return session._do_call(run, *feeds)  # noqa: SLF001


def make_callable_from_options(session, options):
    """A callable of ``session`` for ``CallableOptions``."""
    return session._make_callable_from_options(options)  # noqa: SLF001


def fetch_mapper(fetches):
    """The session's own mapper from a fetch structure to flat fetches and back."""
    from tensorflow.python.client import session

    return session._FetchMapper.for_fetch(fetches)  # noqa: SLF001


def feed_expansions() -> list:
    """``(feed_type, fetch_fn, feed_expansion_fn, feed_expansion_fn_for_partial_run)`` per registered type."""
    from tensorflow.python.client import session

    return list(session._REGISTERED_EXPANSIONS)  # noqa: SLF001


def flatten_feed_dict(feed_dict) -> dict:
    """A feed dict whose keys may be structures, flattened to one key per tensor."""
    from tensorflow.python.util import nest

    return nest.flatten_dict_items(feed_dict)


# --- graphs ---------------------------------------------------------------------------------


def graph_defines_function(graph, name: str) -> bool:
    return bool(graph._is_function(name))  # noqa: SLF001


def add_function_to_graph(graph, function) -> None:
    """Adds ``function`` (an AtomicFunction or a graph function) and the functions it calls."""
    graph._add_function_recursive(function)  # noqa: SLF001


def graph_functions(graph) -> dict:
    """Name → function object (an AtomicFunction) of each function defined in ``graph``."""
    return {_text(f.name): f for f in graph._functions.values()}  # noqa: SLF001


def set_gradient_function(op, gradient) -> None:
    """Makes ``gradient(op, *output_gradients)`` the gradient of one op (a function call)."""
    op._gradient_function = gradient  # noqa: SLF001


def set_string_attr(op, name: str, value: str) -> None:
    """Sets the string attr ``name`` of a built graph op (an internal attr: ``name`` starts with ``_``)."""
    from tensorflow.core.framework import attr_value_pb2

    op._set_attr(name, attr_value_pb2.AttrValue(s=value.encode()))  # noqa: SLF001


def unfinalize_graph(graph) -> None:
    """Lets ops be added to a finalized graph again (the caller finalizes it afterwards)."""
    graph._unsafe_unfinalize()  # noqa: SLF001


def add_control_input(op, before) -> None:
    """Makes the existing ``op`` run after the op ``before`` (a control edge added to a built op)."""
    op._add_control_input(before)  # noqa: SLF001


def control_flow_context(op):
    """The v1 while loop or cond an op of a TF1 graph was built in, or None."""
    return getattr(op, "_control_flow_context", None)


def is_in_xla_context(graph) -> bool:
    """Whether ops added to ``graph`` now are XLA-compiled (``jit_compile`` here or in an outer graph)."""
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def function_def_to_graph(fdef, **kwargs):
    """A FuncGraph built from a FunctionDef."""
    from tensorflow.python.framework import function_def_to_graph as convert

    return convert.function_def_to_graph(fdef, **kwargs)


def copy_handle_data(source, target) -> None:
    """Copies a resource tensor's handle data (variable dtype and shape) to another tensor."""
    from tensorflow.python.ops import handle_data_util

    handle_data_util.copy_handle_data(source, target)


def resource_handle_types(tensor) -> list[tuple[str, tuple | None]]:
    """What a ``resource`` tensor's handle holds, from its handle data: per value, its dtype name and shape (None
    for an unknown rank, None in a dimension for an unknown size); empty when nothing is known.

    A ``tf.function`` that captures a variable takes its handle as a scalar
    ``resource`` input, whose handle data carries the variable's dtype and shape.
    """
    import tensorflow as tf
    from tensorflow.python.ops import handle_data_util

    data = handle_data_util.get_resource_handle_data(tensor)
    if not data.is_set:
        return []
    found = []
    for held in data.shape_and_type:
        shape = tf.TensorShape(held.shape)
        found.append((tf.as_dtype(held.dtype).name, tuple(shape.as_list()) if shape.rank is not None else None))
    return found


# --- op determinism -------------------------------------------------------------------------


def is_op_determinism_enabled() -> bool:
    """Whether TensorFlow runs ops deterministically (``tf.config.experimental.enable_op_determinism()``, or
    ``TF_DETERMINISTIC_OPS=1``, which TensorFlow reads itself)."""
    from tensorflow.python.framework import config

    return bool(config.is_op_determinism_enabled())


# --- tf.function tracing --------------------------------------------------------------------


def concrete_function_callbacks() -> list:
    """TensorFlow's list of callbacks, each called with every ConcreteFunction tracing creates."""
    from tensorflow.python.eager.polymorphic_function import transform

    return transform.CONCRETE_FUNCTION_CALLBACKS


def concrete_function_from_graph(graph, function_type, attrs: dict, *, shared_func_graph: bool):
    """A ConcreteFunction for a FuncGraph, its FunctionDef registered in the eager context."""
    from tensorflow.python.eager.polymorphic_function import concrete_function

    return concrete_function.ConcreteFunction.from_func_graph(graph, function_type, attrs,
                                                              shared_func_graph=shared_func_graph)


def concrete_function_of(atomic_function):
    """A ConcreteFunction around a registered (atomic) function, for its gradient."""
    from tensorflow.python.eager.polymorphic_function import concrete_function

    return concrete_function.ConcreteFunction(atomic_function)


def allowed_function_attrs() -> frozenset:
    """The FunctionDef attributes a newly built function may carry (XLA, no-inline, ...)."""
    from tensorflow.python.eager.polymorphic_function import attributes

    return frozenset(attributes.MONOMORPHIC_FUNCTION_ALLOWLIST - {
        attributes.EAGER_RUNTIME_CONSTRUCTION_CONTEXT, attributes.INPUT_SHAPES})


def copy_call_signature(source, target) -> None:
    """Gives ``target`` the Python calling convention (keywords, positional count) of ``source``."""
    target._arg_keywords = source._arg_keywords  # noqa: SLF001
    target._num_positional_args = source._num_positional_args  # noqa: SLF001


def inference_function(concrete_function):
    """The forward function a ConcreteFunction runs when no tape watches."""
    return concrete_function._inference_function  # noqa: SLF001


def gradient_function(concrete_function):
    """The gradient function of a ConcreteFunction's call op."""
    return concrete_function._get_gradient_function()  # noqa: SLF001


def call_concrete_function(concrete_function, tensor_inputs, captured_inputs):
    """Runs (or, in a graph, calls) a ConcreteFunction through its class's flat call."""
    return type(concrete_function)._call_flat(concrete_function, tensor_inputs, captured_inputs)  # noqa: SLF001


def concrete_function_state(concrete_function) -> dict:
    """A ConcreteFunction's instance state: what is swapped to run another body."""
    return dict(vars(concrete_function))


def set_concrete_function_state(concrete_function, state: dict) -> None:
    """Makes ``concrete_function`` run the body of ``state``.

    Never empty meanwhile: another thread reading one of its attributes finds
    the old value or the new one. The new values go in before the old names
    go, so ``_call_flat`` (a call override) is the last to change.
    """
    current = vars(concrete_function)
    current.update(state)
    for name in [name for name in current if name not in state]:
        del current[name]


def function_with_state(concrete_function, state: dict):
    """A ConcreteFunction of ``concrete_function``'s class holding ``state``: it runs, or can be read
    and rewritten as, that body, while ``concrete_function`` itself stays as it is."""
    copy = object.__new__(type(concrete_function))
    vars(copy).update(state)
    return copy


def graph_in_state(state: dict):
    """The FuncGraph of a ConcreteFunction whose state :func:`concrete_function_state` returned."""
    return state.get("_func_graph")


def take_over_graph_collection(state: dict) -> None:
    """Tracing hands the graph of the function it returns to Python's collector; ``state`` keeps it."""
    collector = state.get("_garbage_collector")
    if collector is not None:
        collector.release()


def runnable_state(state: dict, *, inference_only: bool) -> dict:
    """The part of a rebuilt function's ``state`` swapped into a traced one.

    The calling convention stays the traced function's. With
    ``inference_only``, only the forward function is taken, so calls under a
    tape keep the traced forward and backward functions.
    """
    if inference_only:
        return {"_inference_function": state["_inference_function"]}
    return {key: value for key, value in state.items() if key not in ("_arg_keywords", "_num_positional_args")}


def override_call(concrete_function, call) -> None:
    """Makes ``call(tensor_inputs, captured_inputs)`` run for this ConcreteFunction only."""
    vars(concrete_function)["_call_flat"] = call


def call_override(concrete_function):
    """The call :func:`override_call` made this ConcreteFunction run, or None."""
    return vars(concrete_function).get("_call_flat")


def drop_call_override(concrete_function) -> None:
    vars(concrete_function).pop("_call_flat", None)


def profiler_trace_format():
    """The protobuf module of the profiler's trace files (``XSpace``)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return xplane_pb2


# --- training ------------------------------------------------------------------------------


def replica_components(variable) -> tuple:
    """The per-device variables of a (TF1) mirrored variable; ``(variable,)`` for a plain one."""
    return tuple(getattr(variable, "_values", None) or (variable,))


def create_slots(optimizer, var_list) -> None:
    """Creates a TF1 optimizer's slot variables for ``var_list`` now."""
    optimizer._create_slots(var_list)  # noqa: SLF001


def is_xla_compiled(function_def) -> bool:
    """Whether a traced function is XLA-compiled (``jit_compile=True``): TensorFlow's ``_XlaMustCompile`` attr."""
    attr = function_def.attr
    return "_XlaMustCompile" in attr and attr["_XlaMustCompile"].b


def saver_var_list(saver) -> Any:
    """A TF1 Saver's variables (a list, or a dict by checkpoint key); None when it has none recorded."""
    return getattr(saver, "_var_list", None)


def saver_settings(saver) -> tuple[Any, bool, bool]:
    """A TF1 Saver's ``(var_list, sharded, reshape)``, to build a Saver like it."""
    return saver._var_list, saver._sharded, saver._reshape  # noqa: SLF001


def tape_is_recording(tape) -> bool:
    return bool(tape._recording)  # noqa: SLF001


def track_trackable(owner, trackable, name: str) -> None:
    """Makes ``trackable`` a checkpoint dependency of ``owner`` under ``name`` (a deferred restore applies now)."""
    owner._track_trackable(trackable, name=name, overwrite=True)  # noqa: SLF001


def keras3_optimizer_parts():
    """Keras 3's ``(backend module, BaseOptimizer)``."""
    from keras.src import backend
    from keras.src.optimizers import base_optimizer

    return backend, base_optimizer.BaseOptimizer


def build_keras3_optimizer(optimizer, variables: list) -> None:
    """Creates a Keras 3 optimizer's slot variables for ``variables`` now, under its name scope."""
    from keras.src import backend

    with backend.name_scope(optimizer.name, caller=optimizer):
        optimizer.build(variables)
    optimizer.built = True


def keras3_trainable_variables(optimizer) -> list:
    """The variables a Keras 3 optimizer was built for, in its order."""
    return list(optimizer._trainable_variables)  # noqa: SLF001


def tf_keras_optimizer_class():
    """tf_keras's (new-style) ``Optimizer``."""
    from tf_keras.src.optimizers import optimizer

    return optimizer.Optimizer


# --- multi-worker jobs ----------------------------------------------------------------------
#
# MultiWorkerMirroredStrategy starts TensorFlow's coordination service in TF2
# programs (every version from 2.16 on): a key-value store every task of the
# job reaches, beside the collectives, whose inserts never overwrite.


def has_coordination_service() -> bool:
    """Whether this process belongs to a job whose coordination service is configured."""
    from tensorflow.python.eager import context

    return context.context().coordination_service is not None


def insert_job_value(key: str, value: str) -> bool:
    """Stores ``value`` under ``key`` in the job's key-value store; False when the key holds a value already."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    try:
        context.context().set_config_key_value(key, value)
    except tf.errors.AlreadyExistsError:
        return False
    return True


def read_job_value(key: str, timeout_seconds: float) -> str | None:
    """The value under ``key`` in the job's key-value store, waiting up to ``timeout_seconds``; None if none came."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    # A timeout of 0 would wait for ever.
    milliseconds = max(1, int(timeout_seconds * 1000))
    try:
        return context.context().get_config_key_value(key, milliseconds)
    except tf.errors.DeadlineExceededError:
        return None


def report_error_to_job(message: str) -> None:
    """Puts every task of the job in error with ``message``, so that peers stop instead of waiting."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    context.context().report_error_to_cluster(tf.errors.FAILED_PRECONDITION, message)


# --- the offline pass ------------------------------------------------------------------------


def op_registry_modules():
    """``(op_def_registry, kernels)``: OpDefs and registered kernels of this build."""
    from tensorflow.python.framework import kernels, op_def_registry

    return op_def_registry, kernels


def optimize_graph(config, meta_graph):
    """Grappler run on a MetaGraphDef with the rewriter config of ``config``; the optimized GraphDef."""
    from tensorflow.python.grappler import tf_optimizer

    return tf_optimizer.OptimizeGraph(config, meta_graph)


def import_selected_ops(graph_def, names: list[str]) -> list:
    """The ops ``names`` of ``graph_def``, imported with shapes inferred, in the order given.

    Only they and their direct producers get Python ``Operation`` objects;
    the C importer builds the rest, which is far cheaper on large graphs.
    """
    import tensorflow as tf
    from tensorflow.python.client import pywrap_tf_session as c_api
    from tensorflow.python.framework import c_api_util

    graph = tf.Graph()
    scoped = c_api_util.ScopedTFImportGraphDefOptions()
    c_api.TF_ImportGraphDefOptionsSetPrefix(scoped.options, "")
    for name in names:
        c_api.TF_ImportGraphDefOptionsAddReturnOperation(scoped.options, name)
    buffer = c_api.TF_NewBufferFromString(graph_def.SerializeToString())
    try:
        with graph._c_graph.get() as c_graph:  # noqa: SLF001
            results = c_api_util.ScopedTFImportGraphDefResults(
                c_api.TF_GraphImportGraphDefWithResults(c_graph, buffer, scoped.options))
    finally:
        c_api.TF_DeleteBuffer(buffer)
    wrapped: dict[str, object] = {}

    def python_op(c_op):
        name = c_api.TF_OperationName(c_op)
        op = wrapped.get(name)
        if op is None:
            op = wrapped[name] = graph._create_op_from_tf_operation(c_op)  # noqa: SLF001
        return op

    ops = []
    for c_op in c_api.TF_ImportGraphDefResultsReturnOperations(results.results):
        for source in c_api.GetOperationInputs(c_op):
            python_op(source.oper)
        ops.append(python_op(c_op))
    return ops


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else name
