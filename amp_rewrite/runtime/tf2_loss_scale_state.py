"""What the TF2 loss-scaling patches share while they are installed.

- **The switch**: the runtime settings they run with (:func:`settings`; None
  when they are not installed), set by :func:`activate` and dropped by
  :func:`forget`.
- **The state**: one :class:`ProcessState` per process, the core's three
  variables (:mod:`amp_rewrite.runtime.loss_scale_core`) on a ``tf.Module``
  that every guarded optimizer tracks as its checkpoint dependency
  :data:`CHECKPOINT_NAME`, and beside it the last skip's cause, out of
  checkpoints. Created on first use (:func:`state`).
- **The step contexts**: per traced function, how many scaled gradients were
  taken and how many guarded applies built (eager calls are counted
  together), so that gradients no guarded apply consumes get one warning
  (:func:`check_traced`), and the tf.function hook knows which functions
  apply through the guard (:func:`has_guarded_apply`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.runtime.ledger import LEDGER
from amp_rewrite.runtime.loss_scale_core import SCOPE, LossScaleState, create_state, in_cross_replica_context
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

# Every TF2 loss-scaling module logs under the name of the public module, the
# name the lines of scripts run with ENABLE_AUTO_MP have always carried.
LOGGER_NAME = "amp_rewrite.runtime.tf2_loss_scale"
logger = logging.getLogger(LOGGER_NAME)

LEDGER_NAME = "tf2 loss scaling"
CHECKPOINT_NAME = SCOPE
TRACKS_STATE_ATTR = "_amp_rewrite_tracks_state"


@dataclass(frozen=True)
class LastSkip:
    """Variables: the cause of the last skipped step (scale, hash of the names at fault), its repeats."""

    scale: Any
    cause: Any
    repeats: Any


@dataclass(frozen=True)
class ProcessState(LossScaleState):
    """The process's loss-scale variables, the ``tf.Module`` that holds them, and the last skip.

    ``module`` (built lazily: TensorFlow is imported late) makes the three
    variables checkpoint dependencies of whoever tracks it; ``last_skip``
    is kept out of checkpoints.
    """

    module: Any
    last_skip: LastSkip


class _Patches:
    """The settings these patches run with, and what they learnt while running."""

    def __init__(self):
        self.settings: RuntimeSettings | None = None
        self.state: ProcessState | None = None
        self.scaled_losses: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.pending = _Pending()
        self.warned: set[str] = set()
        self.local = threading.local()


class _Pending:
    """Scaled gradients taken, per step context, and whether a guarded apply consumed them."""

    def __init__(self):
        self.graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # Every function graph a guarded apply was traced in, nested ones included.
        self.guarded: weakref.WeakSet = weakref.WeakSet()
        self.eager_gradients = 0
        self.eager_applies = 0


_PATCHES = _Patches()


# --- the switch --------------------------------------------------------------


def activate(runtime_settings: RuntimeSettings) -> bool:
    """Switches the patches on with these settings; False if they already were (under the ledger's lock)."""
    if _PATCHES.settings is not None:
        return False
    _PATCHES.settings = runtime_settings
    return True


def forget() -> None:
    """Switches the patches off: settings, state, step contexts and warnings start afresh."""
    _PATCHES.settings = None
    _PATCHES.state = None
    _PATCHES.pending = _Pending()
    _PATCHES.warned.clear()


def loss_scaling_wanted() -> bool:
    """The one switch of TF2 loss scaling: its patches are installed.

    The runtime installs them only when its target wants loss scaling
    (:func:`amp_rewrite.runtime.settings.scales_loss`): always for float16; for
    bfloat16, whose range is float32's, only when loss-scale settings ask.
    """
    return _PATCHES.settings is not None


def settings() -> RuntimeSettings | None:
    return _PATCHES.settings


def loss_scale_settings() -> LossScaleSettings:
    return _PATCHES.settings.loss_scale if _PATCHES.settings is not None else LossScaleSettings()


def is_strict() -> bool:
    return _PATCHES.settings is not None and _PATCHES.settings.is_strict


def is_finding_overflow() -> bool:
    """Whether rewritten functions get finiteness probes (``AMP_REWRITE_FIND_OVERFLOW=1``)."""
    runtime_settings = _PATCHES.settings
    return runtime_settings is not None and runtime_settings.is_finding_overflow


def note_scaled_loss(scaled) -> None:
    """Remembers a loss Keras scaled itself: the tape differentiates it as given."""
    _PATCHES.scaled_losses[id(scaled)] = scaled


def is_scaled_loss(target) -> bool:
    return _PATCHES.scaled_losses.get(id(target)) is target


@contextlib.contextmanager
def unscaled():
    """Within it, this thread's gradients are not scaled (a Jacobian's rows are no loss)."""
    local = _PATCHES.local
    local.unscaled = getattr(local, "unscaled", 0) + 1
    try:
        yield
    finally:
        local.unscaled -= 1


def is_unscaled() -> bool:
    return bool(getattr(_PATCHES.local, "unscaled", False))


# --- the state ---------------------------------------------------------------


def has_state() -> bool:
    """Whether a tape or an optimizer has scaled anything since the runtime started."""
    return _PATCHES.state is not None


def state() -> ProcessState:
    """The loss-scale state, created on first use (in a replica context, through merge_call)."""
    with LEDGER.lock:
        if _PATCHES.state is not None:
            return _PATCHES.state
    return in_cross_replica_context(_create_process_state)


def _create_process_state() -> ProcessState:
    import tensorflow as tf

    with LEDGER.lock:
        if _PATCHES.state is not None:
            return _PATCHES.state
        scaling = loss_scale_settings()
        with tf.init_scope(), tf.name_scope(SCOPE):
            module = tf.Module(name=SCOPE)

            def variable(value, name, dtype):
                return tf.Variable(value, name=name, dtype=dtype, trainable=False,
                                   synchronization=tf.VariableSynchronization.ON_WRITE,
                                   aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

            variables = create_state(scaling, variable)
            module.scale = variables.scale
            module.good_steps = variables.good_steps
            module.skipped_steps = variables.skipped_steps
            last_skip = LastSkip(variable(-1.0, "last_skip_scale", tf.float32),
                                 variable(-1, "last_skip_cause", tf.int64),
                                 variable(0, "last_skip_repeats", tf.int64))
        _PATCHES.state = ProcessState(scale=variables.scale, good_steps=variables.good_steps,
                                      skipped_steps=variables.skipped_steps, module=module, last_skip=last_skip)
        logger.debug("created the TF2 loss-scale state, initial scale %s", scaling.initial_scale)
        return _PATCHES.state


def track(optimizer, loss_scale: ProcessState) -> None:
    """Makes the state a checkpoint dependency of ``optimizer`` (deferred restores apply now)."""
    if getattr(optimizer, TRACKS_STATE_ATTR, None) is loss_scale.module:
        return
    tf_internals.track_trackable(optimizer, loss_scale.module, CHECKPOINT_NAME)
    object.__setattr__(optimizer, TRACKS_STATE_ATTR, loss_scale.module)


# --- step contexts: did scaled gradients reach a guarded apply? ---------------


def _graph_being_built():
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    return graph if getattr(graph, "building_function", False) else None


def _outer_function_graph(graph):
    """The graph of the tf.function being traced (replica functions and branches are inner)."""
    while getattr(graph, "outer_graph", None) is not None and getattr(
            graph.outer_graph, "building_function", False):
        graph = graph.outer_graph
    return graph


def note_scaled_gradient() -> None:
    graph = _graph_being_built()
    pending = _PATCHES.pending
    with LEDGER.lock:
        if graph is not None:
            key = _outer_function_graph(graph)
            gradients, applies = pending.graphs.get(key, (0, 0))
            pending.graphs[key] = (gradients + 1, applies)
            return
        pending.eager_gradients += 1
        is_unguarded = pending.eager_gradients >= 3 and pending.eager_applies == 0
    if is_unguarded:
        _warn_unguarded("eager GradientTape gradients")


def note_guarded_apply() -> None:
    graph = _graph_being_built()
    pending = _PATCHES.pending
    with LEDGER.lock:
        if graph is None:
            pending.eager_applies += 1
            return
        key = _outer_function_graph(graph)
        gradients, applies = pending.graphs.get(key, (0, 0))
        pending.graphs[key] = (gradients, applies + 1)
        while graph is not None and getattr(graph, "building_function", False):
            pending.guarded.add(graph)
            graph = getattr(graph, "outer_graph", None)


def check_traced(graph, name: str) -> None:
    """Called once a tf.function is traced: warns if its scaled gradients reach no guarded apply."""
    with LEDGER.lock:
        gradients, applies = _PATCHES.pending.graphs.get(graph, (0, 0))
    if gradients and not applies:
        _warn_unguarded(f"gradients taken in tf.function {name}")


def has_guarded_apply(graph) -> bool:
    """Whether the traced tf.function ``graph`` applies an optimizer through the guard (maybe in a callee)."""
    with LEDGER.lock:
        return graph in _PATCHES.pending.guarded


def _warn_unguarded(what: str) -> None:
    with LEDGER.lock:
        if "unguarded" in _PATCHES.warned:
            return
        _PATCHES.warned.add("unguarded")
    logger.warning("amp-rewrite: %s are loss-scaled, but no Keras optimizer applies them there: "
                   "unless one does later, a step whose gradients overflow in float16 is not "
                   "skipped (the gradients returned are true ones either way)", what)
