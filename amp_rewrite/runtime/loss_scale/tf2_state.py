"""What the TF2 loss-scaling patches share while they are installed: one :class:`TF2LossScaling`.

- **The settings** they run with, and the runtime's records (which
  optimizers a wrapper scales), given when the runtime installs them.
- **The state**: one :class:`ProcessState` per installation, the core's three
  variables (:mod:`amp_rewrite.runtime.loss_scale.core`) on a ``tf.Module``
  that every guarded optimizer tracks as its checkpoint dependency
  :data:`CHECKPOINT_NAME`, and beside it the last skip's cause, out of
  checkpoints. Created on first use (:meth:`TF2LossScaling.state`).
- **The step contexts**: per traced function, how many scaled gradients were
  taken and how many guarded applies built (eager calls are counted
  together), so that gradients no guarded apply consumes get one warning
  (:meth:`TF2LossScaling.check_traced`), and the tf.function hook knows which
  functions apply through the guard (:meth:`TF2LossScaling.has_guarded_apply`).

The runtime holds the object (``Runtime.loss_scaling``) and binds it into each
patched method; nothing here is module-level state.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.runtime.ledger import LOCK
from amp_rewrite.runtime.loss_scale.core import SCOPE, LossScaleState, create_state, in_cross_replica_context
from amp_rewrite.runtime.records import ObjectRecords, ObjectTable
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

# Every TF2 loss-scaling module logs under one name, the one the lines of
# scripts run with ENABLE_AUTO_MP have always carried.
LOGGER_NAME = "amp_rewrite.runtime.tf2.loss_scale"
logger = logging.getLogger(LOGGER_NAME)

LEDGER_NAME = "tf2 loss scaling"
CHECKPOINT_NAME = SCOPE


@dataclass(frozen=True)
class LastSkip:
    """Variables: the cause of the last skipped step (scale, hash of the names at fault), its repeats.

    ``non_finite_losses`` counts the scaled gradients in a row whose loss
    was not finite: a loss that stays so needs no other scale to tell that
    none helps.
    """

    scale: Any
    cause: Any
    repeats: Any
    non_finite_losses: Any


@dataclass(frozen=True)
class ProcessState(LossScaleState):
    """The process's loss-scale variables, the ``tf.Module`` that holds them, and the last skip.

    ``module`` (built lazily: TensorFlow is imported late) makes the three
    variables checkpoint dependencies of whoever tracks it; ``last_skip``
    is kept out of checkpoints.
    """

    module: Any
    last_skip: LastSkip


class TF2LossScaling:
    """The TF2 loss-scaling patches while they are installed: their settings, and what they learnt.

    The runtime makes one when it installs the patches
    (:func:`amp_rewrite.runtime.loss_scale.tf2_install.install`) and hands it to each
    patched method; :func:`amp_rewrite.disable` drops it, so the settings,
    the state, the step contexts and the warnings start afresh (the state's
    variables stay with the optimizers that track them).
    """

    def __init__(self, runtime_settings: RuntimeSettings, records: ObjectRecords):
        self.settings = runtime_settings
        self.records = records
        self.is_installed = True
        self._state: ProcessState | None = None
        # Each optimizer that tracks the state → the state's module it tracks.
        self._trackers: ObjectTable[Any] = ObjectTable()
        self._scaled_losses: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._pending = _Pending()
        self._warned: set[str] = set()
        self._local = threading.local()

    def uninstall(self) -> None:
        """Marks the patches removed: an import hook that fires late patches nothing."""
        self.is_installed = False

    # --- the settings ------------------------------------------------------

    @property
    def loss_scale(self) -> LossScaleSettings:
        return self.settings.loss_scale

    @property
    def is_strict(self) -> bool:
        return self.settings.is_strict

    @property
    def is_finding_overflow(self) -> bool:
        """Whether rewritten functions get finiteness probes (``AMP_REWRITE_FIND_OVERFLOW=1``)."""
        return self.settings.is_finding_overflow

    def track(self, optimizer, loss_scale: ProcessState) -> None:
        """Makes the state a checkpoint dependency of ``optimizer`` (deferred restores apply now), once."""
        if self._trackers.get(optimizer) is loss_scale.module:
            return
        tf_internals.track_trackable(optimizer, loss_scale.module, CHECKPOINT_NAME)
        self._trackers[optimizer] = loss_scale.module

    # --- losses Keras scaled itself, and gradients that are no loss's ---------

    def note_scaled_loss(self, scaled) -> None:
        """Remembers a loss Keras scaled itself: the tape differentiates it as given."""
        self._scaled_losses[id(scaled)] = scaled

    def is_scaled_loss(self, target) -> bool:
        return self._scaled_losses.get(id(target)) is target

    @contextlib.contextmanager
    def unscaled(self):
        """Within it, this thread's gradients are not scaled (a Jacobian's rows are no loss)."""
        local = self._local
        local.unscaled = getattr(local, "unscaled", 0) + 1
        try:
            yield
        finally:
            local.unscaled -= 1

    def is_unscaled(self) -> bool:
        return bool(getattr(self._local, "unscaled", False))

    # --- the state -----------------------------------------------------------

    def has_state(self) -> bool:
        """Whether a tape or an optimizer has scaled anything since the patches were installed."""
        return self._state is not None

    def state(self) -> ProcessState:
        """The loss-scale state, created on first use (in a replica context, through merge_call)."""
        with LOCK:
            if self._state is not None:
                return self._state
        return in_cross_replica_context(self._create_state)

    def _create_state(self) -> ProcessState:
        import tensorflow as tf

        with LOCK:
            if self._state is not None:
                return self._state
            scaling = self.loss_scale
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
                                     variable(0, "last_skip_repeats", tf.int64),
                                     variable(0, "non_finite_losses", tf.int64))
            self._state = ProcessState(scale=variables.scale, good_steps=variables.good_steps,
                                       skipped_steps=variables.skipped_steps, module=module, last_skip=last_skip)
            logger.debug("created the TF2 loss-scale state, initial scale %s", scaling.initial_scale)
            return self._state

    # --- step contexts: did scaled gradients reach a guarded apply? ---------

    def note_scaled_gradient(self) -> None:
        graph = _graph_being_built()
        pending = self._pending
        with LOCK:
            if graph is not None:
                key = _outer_function_graph(graph)
                gradients, applies = pending.graphs.get(key, (0, 0))
                pending.graphs[key] = (gradients + 1, applies)
                return
            pending.eager_gradients += 1
            is_unguarded = pending.eager_gradients >= 3 and pending.eager_applies == 0
        if is_unguarded:
            self._warn_unguarded("eager GradientTape gradients")

    def note_guarded_apply(self) -> None:
        graph = _graph_being_built()
        pending = self._pending
        with LOCK:
            if graph is None:
                pending.eager_applies += 1
                return
            key = _outer_function_graph(graph)
            gradients, applies = pending.graphs.get(key, (0, 0))
            pending.graphs[key] = (gradients, applies + 1)
            while graph is not None and getattr(graph, "building_function", False):
                pending.guarded.add(graph)
                graph = getattr(graph, "outer_graph", None)

    def check_traced(self, graph, name: str) -> None:
        """Called once a tf.function is traced: warns if its scaled gradients reach no guarded apply."""
        with LOCK:
            gradients, applies = self._pending.graphs.get(graph, (0, 0))
        if gradients and not applies:
            self._warn_unguarded(f"gradients taken in tf.function {name}")

    def has_guarded_apply(self, graph) -> bool:
        """Whether the traced tf.function ``graph`` applies an optimizer through the guard (maybe in a callee)."""
        with LOCK:
            return graph in self._pending.guarded

    def _warn_unguarded(self, what: str) -> None:
        with LOCK:
            if "unguarded" in self._warned:
                return
            self._warned.add("unguarded")
        logger.warning("amp-rewrite: %s are loss-scaled, but no Keras optimizer applies them there: "
                       "unless one does later, a step whose gradients overflow in float16 is not "
                       "skipped (the gradients returned are true ones either way)", what)


class _Pending:
    """Scaled gradients taken, per step context, and whether a guarded apply consumed them."""

    def __init__(self):
        self.graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # Every function graph a guarded apply was traced in, nested ones included.
        self.guarded: weakref.WeakSet = weakref.WeakSet()
        self.eager_gradients = 0
        self.eager_applies = 0


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
