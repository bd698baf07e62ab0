"""Dynamic loss scaling for TF2 training loops: GradientTape in, optimizer apply out.

With the runtime enabled for a float16 target (:func:`loss_scaling_wanted`),
two places change, so every loop built from them is scaled without code changes:

- ``tf.GradientTape.gradient(loss, variables)`` (one float loss, trainable
  variables only) back-propagates from
  ``loss * scale`` (by seeding the gradient of ``loss`` with the scale, so the
  forward computation is unchanged) and returns gradients divided by the scale
  again, in float32. The caller sees true gradients: clipping, logging and
  ``tf.debugging`` checks between ``gradient`` and ``apply`` work as in float32.
- The ``apply`` of Keras 3 optimizers (``apply_gradients``, ``fit`` and custom
  ``train_step`` all end there, so ``Model.compile`` is not changed and the
  model keeps the optimizer it was given) and ``apply_gradients`` of tf_keras
  optimizers apply the update only when every gradient is finite. A skipped step changes
  no variable, slot or iteration count; it halves the scale (never below 1)
  and prints a line naming the first variables whose gradients were not
  finite. A skip for the same cause as the one before (the same scale and
  the same variables: a loss that stays NaN at the floor of 1, or the scale
  growing back to where it overflowed) is counted instead, with a line
  every ``log_every`` such repeats. After ``growth_interval`` finite steps
  the scale doubles. Under a ``tf.distribute`` strategy the count of
  non-finite gradients is all-reduced first, so all replicas take one
  decision.

The scale is one set of float32/int64 variables per process (one
:class:`LossScaleState`), read by every tape and updated by every guarded
apply. Each guarded optimizer tracks it as the checkpoint dependency
``amp_loss_scale``, so ``tf.train.Checkpoint`` saves it with the optimizer and
restores it (also when the restore came first: TensorFlow defers it). A
checkpoint without it leaves the initial scale; a checkpoint with it restores
into a run without the runtime, which ignores it.

Nobody is scaled twice: a loss returned by ``scale_loss`` (Keras 3, also with a
fixed ``loss_scale_factor``) or ``get_scaled_loss`` (tf_keras) is
differentiated as given, and ``LossScaleOptimizer``s (Keras 3 and tf_keras),
the optimizers they wrap and optimizers with a ``loss_scale_factor`` are left
to Keras.

Not covered, with one warning: gradients from a scaled tape that reach no
guarded apply (legacy tf_keras ``OptimizerV2``, hand-written
``var.assign_sub``): their values are right, but a step whose gradients
overflow is not skipped.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref

from amp_rewrite import tf_internals
from amp_rewrite.errors import first_line
from amp_rewrite.runtime.ledger import LEDGER
from amp_rewrite.runtime.loss_scale_core import SCALED_ELSEWHERE_ATTR, SCOPE, next_scale_state, unscale
from amp_rewrite.runtime.loss_scale_core import nonfinite_flags as _nonfinite_flags
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

logger = logging.getLogger(__name__)

LEDGER_NAME = "tf2 loss scaling"
CHECKPOINT_NAME = SCOPE
NAMES_IN_SKIP_LINE = 3
OVERFLOW_HINT = "AMP_REWRITE_FIND_OVERFLOW=1 names the first op whose output was not finite."
# Causes of skips are compared by a hash of the names of the variables at fault.
CAUSE_BUCKETS = 2 ** 62


class LossScaleState:
    """The process's loss-scale variables: scale, finite steps in a row, skipped steps.

    A ``tf.Module`` (built lazily, TensorFlow is imported late) so that the
    three variables are checkpoint dependencies of whoever tracks it. The
    last skip's cause (:class:`_LastSkip`) is kept beside it, out of checkpoints.
    """

    def __init__(self, module, last_skip: _LastSkip):
        self.module = module
        self.last_skip = last_skip

    @property
    def scale(self):
        return self.module.scale

    @property
    def good_steps(self):
        return self.module.good_steps

    @property
    def skipped_steps(self):
        return self.module.skipped_steps


class _LastSkip:
    """Variables: the cause of the last skipped step (scale, hash of the names at fault), its repeats."""

    def __init__(self, scale, cause, repeats):
        self.scale = scale
        self.cause = cause
        self.repeats = repeats


class _Patches:
    """The settings these patches run with, and what they learnt while running."""

    def __init__(self):
        self.settings: RuntimeSettings | None = None
        self.state: LossScaleState | None = None
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

KERAS3_MODULE = tf_internals.KERAS3_LOSS_SCALE_MODULE
TF_KERAS_MODULE = tf_internals.TF_KERAS_LOSS_SCALE_MODULE


def loss_scaling_wanted() -> bool:
    """The one switch of everything here: these patches are installed.

    The runtime installs them only when its target wants loss scaling
    (:func:`amp_rewrite.runtime.scales_loss`): always for float16; for
    bfloat16, whose range is float32's, only when loss-scale settings ask.
    """
    return _PATCHES.settings is not None


def settings() -> RuntimeSettings | None:
    return _PATCHES.settings


def is_finding_overflow() -> bool:
    """Whether rewritten functions get finiteness probes (``AMP_REWRITE_FIND_OVERFLOW=1``)."""
    settings = _PATCHES.settings
    return settings is not None and settings.is_finding_overflow


def install(runtime_settings: RuntimeSettings) -> None:
    """Patches the tape now and Keras' optimizers once their modules are imported.

    Every change goes into the runtime's ledger, which undoes it on
    :func:`amp_rewrite.disable`: the methods are restored, and the state
    starts afresh (its variables stay with the optimizers that track them).
    """
    import tensorflow as tf

    import _amp_rewrite_autoload as autoload

    with LEDGER.lock:
        if _PATCHES.settings is not None:
            return
        _PATCHES.settings = runtime_settings
        LEDGER.record(LEDGER_NAME, "the loss-scale settings and state", _forget)
        tape = tf.GradientTape
        LEDGER.install(LEDGER_NAME, tape, "gradient", _scaled_gradient)
        LEDGER.install(LEDGER_NAME, tape, "jacobian", _unscaled_inside)
        LEDGER.install(LEDGER_NAME, tape, "batch_jacobian", _unscaled_inside)
        LEDGER.record(LEDGER_NAME, f"import hooks on {KERAS3_MODULE} and {TF_KERAS_MODULE}",
                      _remove_keras_hooks)
        autoload.install_post_import_hook(_patch_keras3, KERAS3_MODULE)
        autoload.install_post_import_hook(_patch_tf_keras, TF_KERAS_MODULE)


def _forget() -> None:
    _PATCHES.settings = None
    _PATCHES.state = None
    _PATCHES.pending = _Pending()
    _PATCHES.warned.clear()


def _remove_keras_hooks() -> None:
    import _amp_rewrite_autoload as autoload

    autoload.remove_post_import_hooks(KERAS3_MODULE)
    autoload.remove_post_import_hooks(TF_KERAS_MODULE)


def _patch_keras3(module) -> None:
    with LEDGER.lock:
        if _PATCHES.settings is None or not _has_keras_internals(tf_internals.KERAS3_OPTIMIZERS):
            return
        backend, base = tf_internals.keras3_optimizer_parts()
        if backend.backend() != "tensorflow":
            return
        wrapper = module.LossScaleOptimizer
        LEDGER.install(LEDGER_NAME, base, "apply", _guarded_keras3_apply)
        LEDGER.install(LEDGER_NAME, base, "scale_loss", _marking_scale_loss)
        LEDGER.install(LEDGER_NAME, wrapper, "scale_loss", _marking_scale_loss)
        LEDGER.install(LEDGER_NAME, wrapper, "__init__", _marking_wrapper_init)
    logger.debug("patched Keras 3 optimizers")


def _has_keras_internals(capability: tf_internals.Capability) -> bool:
    """Whether Keras has what the guarded apply needs; if not, new traces run float32 (strict: raise).

    Without the guard a step whose scaled gradients overflow would be
    applied, so the tf.function hook stops rewriting rather than train on infs.
    """
    from amp_rewrite.runtime import tf_function

    is_strict = _PATCHES.settings is not None and _PATCHES.settings.is_strict
    if tf_internals.usable([capability], "tf.function traces", is_strict=is_strict):
        return True
    tf_function.uninstall()
    return False


def _patch_tf_keras(module) -> None:
    with LEDGER.lock:
        if _PATCHES.settings is None or not _has_keras_internals(tf_internals.TF_KERAS_OPTIMIZERS):
            return
        LEDGER.install(LEDGER_NAME, tf_internals.tf_keras_optimizer_class(), "apply_gradients",
                       _guarded_tf_keras_apply_gradients)
        for wrapper in (module.LossScaleOptimizer, module.LossScaleOptimizerV3):
            LEDGER.install(LEDGER_NAME, wrapper, "get_scaled_loss", _marking_scale_loss)
            LEDGER.install(LEDGER_NAME, wrapper, "__init__", _marking_wrapper_init)
    logger.debug("patched tf_keras optimizers")


# --- the state ---------------------------------------------------------------


def has_state() -> bool:
    """Whether a tape or an optimizer has scaled anything since the runtime started."""
    return _PATCHES.state is not None


def state() -> LossScaleState:
    """The loss-scale state, created on first use (in a replica context, through merge_call)."""
    import tensorflow as tf

    with LEDGER.lock:
        if _PATCHES.state is not None:
            return _PATCHES.state
    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
        return tf.distribute.get_replica_context().merge_call(lambda _strategy: _create_state())
    return _create_state()


def _create_state() -> LossScaleState:
    import tensorflow as tf

    with LEDGER.lock:
        if _PATCHES.state is not None:
            return _PATCHES.state
        scaling = _loss_scale_settings()
        with tf.init_scope(), tf.name_scope(SCOPE):
            module = tf.Module(name=SCOPE)

            def variable(value, name, dtype):
                return tf.Variable(value, name=name, dtype=dtype, trainable=False,
                                   synchronization=tf.VariableSynchronization.ON_WRITE,
                                   aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

            module.scale = variable(float(scaling.initial_scale), "scale", tf.float32)
            module.good_steps = variable(0, "good_steps", tf.int64)
            module.skipped_steps = variable(0, "skipped_steps", tf.int64)
            last_skip = _LastSkip(variable(-1.0, "last_skip_scale", tf.float32),
                                  variable(-1, "last_skip_cause", tf.int64),
                                  variable(0, "last_skip_repeats", tf.int64))
        _PATCHES.state = LossScaleState(module, last_skip)
        logger.debug("created the TF2 loss-scale state, initial scale %s", scaling.initial_scale)
        return _PATCHES.state


def _loss_scale_settings() -> LossScaleSettings:
    return _PATCHES.settings.loss_scale if _PATCHES.settings is not None else LossScaleSettings()


def _track(optimizer, loss_scale: LossScaleState) -> None:
    """Makes the state a checkpoint dependency of ``optimizer`` (deferred restores apply now)."""
    if getattr(optimizer, "_amp_rewrite_tracks_state", None) is loss_scale.module:
        return
    tf_internals.track_trackable(optimizer, loss_scale.module, CHECKPOINT_NAME)
    object.__setattr__(optimizer, "_amp_rewrite_tracks_state", loss_scale.module)


# --- the tape ----------------------------------------------------------------


def _unscaled_inside(original, tape, *args, **kwargs):
    """Jacobians call ``gradient`` per row; they are not a loss and are never scaled."""
    local = _PATCHES.local
    local.unscaled = getattr(local, "unscaled", 0) + 1
    try:
        return original(tape, *args, **kwargs)
    finally:
        local.unscaled -= 1


def _scaled_gradient(original, tape, target, sources, output_gradients=None, *args, **kwargs):
    """``GradientTape.gradient`` of ``target * scale``, returned divided by the scale."""
    if not _is_scalable(target, sources):
        return original(tape, target, sources, output_gradients, *args, **kwargs)
    import tensorflow as tf

    loss_scale = state()
    with _not_recorded(tape):
        scale = tf.identity(loss_scale.scale)
        seed = tf.cast(scale, target.dtype)
        if output_gradients is None:
            output_gradients = tf.fill(tf.shape(target), seed)
        else:
            output_gradients = tf.math.multiply_no_nan(tf.convert_to_tensor(output_gradients), seed)
    grads = original(tape, target, sources, output_gradients, *args, **kwargs)
    with _not_recorded(tape):
        inverse = tf.math.divide_no_nan(tf.ones_like(scale), scale)
        grads = tf.nest.map_structure(lambda g: unscale(g, inverse), grads)
    _note_scaled_gradient()
    return grads


def _not_recorded(tape):
    """The tape must not record the scaling: it is not part of the user's function."""
    return tape.stop_recording() if tf_internals.tape_is_recording(tape) else contextlib.nullcontext()


def _is_scalable(target, sources) -> bool:
    """A training step's gradient: of one float loss, with respect to trainable variables only.

    Gradients with respect to tensors (saliency, gradient penalties, an outer
    tape's analysis) are left unscaled: nothing would skip a step whose
    scaled gradient overflowed.
    """
    import tensorflow as tf

    if not loss_scaling_wanted() or getattr(_PATCHES.local, "unscaled", False):
        return False
    if not isinstance(target, (tf.Tensor, tf.Variable)) or not target.dtype.is_floating:
        return False
    flat = tf.nest.flatten(sources)
    if not flat or not all(getattr(s, "trainable", False) and hasattr(s, "assign") for s in flat):
        return False
    return _PATCHES.scaled_losses.get(id(target)) is not target


def _marking_scale_loss(original, optimizer, loss, *args, **kwargs):
    """``scale_loss``/``get_scaled_loss``: a loss Keras scaled is differentiated as it is."""
    scaled = original(optimizer, loss, *args, **kwargs)
    if scaled is not loss and scaled is not None:
        _PATCHES.scaled_losses[id(scaled)] = scaled
    return scaled


def _marking_wrapper_init(original, wrapper, *args, **kwargs):
    """A LossScaleOptimizer's inner optimizer is left to the wrapper."""
    inner = args[0] if args else kwargs.get("inner_optimizer", kwargs.get("optimizer"))
    if inner is not None:
        object.__setattr__(inner, SCALED_ELSEWHERE_ATTR, True)
    return original(wrapper, *args, **kwargs)


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


def _note_scaled_gradient() -> None:
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


def _note_guarded_apply() -> None:
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


# --- the guarded apply ---------------------------------------------------------


def _is_exempt(optimizer) -> bool:
    """Optimizers Keras' own loss scaling looks after, or that scale with a fixed factor."""
    if getattr(optimizer, SCALED_ELSEWHERE_ATTR, False):
        return True
    if getattr(optimizer, "loss_scale_factor", None) is not None:
        return True
    kind = type(optimizer)
    return any(cls.__name__.startswith(("LossScaleOptimizer", "BaseLossScaleOptimizer"))
               for cls in kind.__mro__)


def _guarded_keras3_apply(original, optimizer, grads, trainable_variables=None):
    """Keras 3 ``BaseOptimizer.apply`` that skips a step whose gradients are not finite."""
    if not loss_scaling_wanted() or _is_exempt(optimizer):
        return original(optimizer, grads, trainable_variables)
    grads = list(grads)
    if not grads:
        return original(optimizer, grads, trainable_variables)
    if trainable_variables is None:
        variables = tf_internals.keras3_trainable_variables(optimizer)
    else:
        variables = list(trainable_variables)
        if not optimizer.built:
            # Outside the guard's branch: the slots exist whatever the first step does.
            tf_internals.build_keras3_optimizer(optimizer, variables)

    def apply(grads_, variables_):
        original(optimizer, list(grads_), list(variables_))

    if not _guard_or_warn(optimizer, apply, grads, variables):
        return original(optimizer, grads, trainable_variables)


def _guarded_tf_keras_apply_gradients(original, optimizer, grads_and_vars, *args, **kwargs):
    """tf_keras ``Optimizer.apply_gradients`` that skips a step whose gradients are not finite."""
    import tensorflow as tf

    if not loss_scaling_wanted() or _is_exempt(optimizer):
        return original(optimizer, grads_and_vars, *args, **kwargs)
    grads_and_vars = list(grads_and_vars)
    if not grads_and_vars:
        return original(optimizer, grads_and_vars, *args, **kwargs)
    grads = [g for g, _ in grads_and_vars]
    variables = [v for _, v in grads_and_vars]
    with tf.init_scope():
        optimizer.build(variables)  # slots outside the guard's branch

    def apply(grads_, variables_):
        original(optimizer, list(zip(grads_, variables_)), *args, **kwargs)

    if not _guard_or_warn(optimizer, apply, grads, variables):
        return original(optimizer, grads_and_vars, *args, **kwargs)
    return optimizer.iterations


def _guard_or_warn(optimizer, apply, grads, variables) -> bool:
    """:func:`_guard`; if building it fails, a warning and False (the caller applies unguarded).

    Once the optimizer's own apply has been called, its errors (and any
    later one) propagate: applying again could update twice.
    ``AMP_REWRITE_STRICT=1`` raises instead.
    """
    called = []

    def tracked_apply(grads_, variables_):
        called.append(True)
        apply(grads_, variables_)

    try:
        _guard(optimizer, tracked_apply, grads, variables)
        return True
    except Exception as exc:  # the guard must never be what stops training
        if called or (_PATCHES.settings is not None and _PATCHES.settings.is_strict):
            raise
        logger.warning("amp-rewrite: %s applies without skipping non-finite steps: the loss-scale "
                       "guard failed: %s", type(optimizer).__name__, first_line(exc, with_type=True))
        return False


def _guard(optimizer, apply, grads, variables) -> None:
    """Runs ``apply(grads, variables)`` if every gradient is finite; updates the scale either way."""
    import tensorflow as tf

    loss_scale = state()
    _track(optimizer, loss_scale)
    _note_guarded_apply()
    flags = _nonfinite_flags(grads)
    names = [_variable_name(v) for v in variables]
    guarded = _GuardedStep(apply, loss_scale, names, _loss_scale_settings())
    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
        context = tf.distribute.get_replica_context()
        flags = context.all_reduce(tf.distribute.ReduceOp.SUM, flags)
        # Through merge_call, so that the apply runs for every replica inside one cond.
        context.merge_call(guarded.build, args=(grads, variables, flags))
        return
    guarded.build(None, grads, variables, flags)


def _variable_name(variable) -> str:
    name = getattr(variable, "path", None) or getattr(variable, "name", None) or "?"
    return name[:-2] if name.endswith(":0") else name


class _GuardedStep:
    """``cond(finite, apply, skip)`` and the scale update, built in cross-replica context."""

    def __init__(self, apply, loss_scale, names, scaling: LossScaleSettings):
        self.apply = apply
        self.state = loss_scale
        self.names = names
        self.settings = scaling

    def build(self, distribution, grads, variables, flags):
        import tensorflow as tf

        if distribution is not None:
            flags = distribution.experimental_local_results(flags)[0]
        is_finite = tf.equal(tf.reduce_sum(flags), 0.0)
        if tf.executing_eagerly() and distribution is None:
            if bool(is_finite):
                self.apply(grads, variables)
            else:
                self._skip(flags)
            self._update(is_finite)
            return

        def apply_branch():
            if distribution is None:
                self.apply(grads, variables)
            else:
                distribution.extended.call_for_each_replica(self.apply, args=(grads, variables))
            return tf.constant(True)

        is_compiled = self._is_compiled()

        def skip_branch():
            if not is_compiled:
                self._skip(flags)
            return tf.constant(False)

        with tf.name_scope(SCOPE + "_apply"):
            applied = tf.cond(is_finite, apply_branch, skip_branch)
            with tf.control_dependencies([applied]):
                self._update(is_finite)

    def _update(self, is_finite):
        update_state(self.state, is_finite, self.settings)

    def _skip(self, flags):
        """Says why a step was skipped, once per cause; repeats of the last cause are counted.

        The line names the scale the step used and the first variables whose
        gradients were not finite. A skip at the same scale for the same
        variables as the skip before it prints nothing, except a count on
        every ``log_every``-th such repeat.
        """
        import tensorflow as tf

        names = tf.constant(self.names)
        bad = tf.boolean_mask(names, flags > 0)
        scale = tf.identity(self.state.scale)
        is_repeat, repeats = self._note_cause(scale, bad)
        every = self.settings.log_every
        is_count_due = tf.logical_and(is_repeat, tf.equal(repeats % every, 0)) if every else tf.constant(False)
        if tf.executing_eagerly():
            if not bool(is_repeat):
                logger.warning("%s", self._cause_line(scale, bad).numpy().decode())
            elif bool(is_count_due):
                logger.warning("%s", self._count_line(scale, repeats).numpy().decode())
            return

        def say():
            # One cond, not one per case: each cond costs tracing time in every guarded step.
            line = tf.where(is_repeat, self._count_line(scale, repeats), self._cause_line(scale, bad))
            tf.print(line, output_stream=_stderr())
            return tf.constant(True)

        tf.cond(tf.logical_or(tf.logical_not(is_repeat), is_count_due), say, lambda: tf.constant(False))

    def _note_cause(self, scale, bad):
        """Records this skip's cause; returns (whether it is the last skip's, repeats of it so far)."""
        import tensorflow as tf

        last = self.state.last_skip
        cause = tf.strings.to_hash_bucket_fast(tf.strings.reduce_join(bad, separator="\n"), CAUSE_BUCKETS)
        is_repeat = tf.logical_and(tf.equal(last.cause.read_value(), cause),
                                   tf.equal(last.scale.read_value(), scale))
        repeats = tf.where(is_repeat, last.repeats.read_value() + 1, tf.constant(0, tf.int64))
        with tf.control_dependencies([is_repeat, repeats]):
            last.scale.assign(scale)
            last.cause.assign(cause)
            last.repeats.assign(repeats)
        return is_repeat, repeats

    def _cause_line(self, scale, bad):
        import tensorflow as tf

        shown = tf.strings.reduce_join(bad[:NAMES_IN_SKIP_LINE], separator=", ")
        more = tf.size(bad) - tf.minimum(tf.size(bad), NAMES_IN_SKIP_LINE)
        hint = "" if is_finding_overflow() else " " + OVERFLOW_HINT
        return tf.strings.join([
            tf.strings.format("amp-rewrite: loss scale {}: step skipped, gradients not finite for "
                              "{} of {} variables: ", (scale, tf.size(bad), len(self.names))),
            shown, tf.where(more > 0, tf.strings.format(" and {} more", more), ""), "." + hint])

    def _count_line(self, scale, repeats):
        import tensorflow as tf

        return tf.strings.format("amp-rewrite: loss scale {}: {} more steps skipped for the same "
                                 "variables as the last skip line; {} skipped in all.",
                                 (scale, repeats, self.state.skipped_steps.read_value() + 1))

    def _is_compiled(self) -> bool:
        """Inside an XLA-compiled function, which cannot print or handle strings."""
        import tensorflow as tf

        return tf_internals.is_in_xla_context(tf.compat.v1.get_default_graph())


def _stderr():
    import sys

    return sys.stderr


def update_state(loss_scale: LossScaleState, is_finite, scaling: LossScaleSettings) -> None:
    """Moves the process-wide state one step along the TF1 schedule."""
    scale, good, skipped = next_scale_state(loss_scale, is_finite, scaling)
    loss_scale.scale.assign(scale)
    loss_scale.good_steps.assign(good)
    loss_scale.skipped_steps.assign(skipped)
