"""Dynamic loss scaling: the state, schedule and guard that TF1 and TF2 share.

One algorithm, two ways in. The TF1 adapter (:mod:`amp_rewrite.runtime.loss_scale.tf1_optimizer`)
patches ``tf.compat.v1.train.Optimizer`` and keeps one state per graph, in a
graph collection; the TF2 adapter (:mod:`amp_rewrite.runtime.loss_scale.tf2_install`)
patches ``tf.GradientTape`` and Keras optimizers and keeps one state per
process, tracked by every guarded optimizer. Both do what is here:

- **State** (:class:`LossScaleState`, :func:`create_state`): a float32
  ``scale``, and int64 ``good_steps`` (finite steps in a row) and
  ``skipped_steps``, non-trainable, named under :data:`SCOPE` and created
  once for all replicas (:func:`in_cross_replica_context`).
- **Gradients**: back-propagation starts from the scale
  (:func:`seed_gradient`) instead of from a multiplied loss, so the forward
  computation is unchanged; the gradients are multiplied by ``1 / scale``
  again (:func:`inverse_of`, :func:`unscale`) before the caller sees them.
- **Schedule** (:func:`next_scale_state`): after ``growth_interval`` finite
  steps in a row the scale doubles, up to :data:`MAX_SCALE`; a skipped step
  halves it, never below 1. A fixed scale never moves; skips are counted
  either way.
- **Guard** (:class:`GuardedStep`): the non-finite gradients are counted
  (:func:`nonfinite_flags`), summed over the replicas so that all of them
  take one decision; ``cond(finite, apply, skip)`` (named :data:`DECISION`);
  then the schedule moves. What a skip says is the adapter's: a TF1 session
  reads a report tensor after the step, a TF2 step prints a line from the
  graph. What the step wrote outside the optimizer is put back on a skip
  by :mod:`amp_rewrite.runtime.loss_scale.step_writes`.
- **Names**: the seed's scale, the unscaling, the guard's predicate and the
  state's update are built under scopes of their own (:data:`SEED_SCOPE`,
  :data:`UNSCALE_SCOPE`, :data:`APPLY_SCOPE`'s :data:`IS_FINITE`,
  :data:`UPDATE_SCOPE`), which is how a step trial finds them to build the
  step's float32 variant without them (:mod:`amp_rewrite.runtime.loss_scale.unscaled`).
- **When no scale helps** (:func:`hopeless_reason`): steps whose loss
  itself was not finite (:func:`is_finite_loss`; the loss is computed before
  any scale, so no scale changes it) :data:`LOSS_REPEATS` times in a row, or
  a skip with the scale already at its floor of 1. Either way the adapter
  falls back to float32: after the second step, not after halving the scale
  all the way down. One bad batch (a non-finite loss once) is skipped and
  training goes on in half.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amp_rewrite.runtime.settings import LossScaleSettings

# The variables' name scope. TF1 names its graph collection after it, TF2 the
# optimizers' checkpoint dependency: checkpoints carry it, so it never changes.
SCOPE = "amp_loss_scale"
# The guard's ops (its predicate, the cond and the state update).
APPLY_SCOPE = SCOPE + "_apply"
# The guard's cond, under APPLY_SCOPE: its predicate is the step's decision (True: applied).
DECISION = "maybe_apply"
# A skipped step's writes put back (:mod:`amp_rewrite.runtime.loss_scale.step_writes`).
RESTORE_SCOPE = SCOPE + "_restore"
#: The guard's predicate, in :data:`APPLY_SCOPE`: every gradient is finite.
IS_FINITE = "is_finite"
#: The scale that seeds back-propagation, as :data:`SEED_NAME`.
SEED_SCOPE = SCOPE + "_seed"
SEED_NAME = "scale"
#: Each gradient's division by the scale.
UNSCALE_SCOPE = SCOPE + "_unscale"
#: The state's move along the schedule, and the count of non-finite losses in a row.
UPDATE_SCOPE = SCOPE + "_update"
MAX_SCALE = 2.0 ** 24


@dataclass(frozen=True)
class LossScaleState:
    """The loss-scale variables: scale, finite steps in a row, skipped steps."""

    scale: Any
    good_steps: Any
    skipped_steps: Any


# --- the state -----------------------------------------------------------------


def create_state(settings: LossScaleSettings, variable) -> LossScaleState:
    """The three variables, each made by ``variable(initial value, name, dtype)``, in this order.

    The adapter chooses the kind of variable and the name scope, and enters
    ``tf.init_scope()``: TF1 makes resource variables in graph collections,
    TF2 mirrored ones that a ``tf.Module`` tracks.
    """
    import tensorflow as tf

    return LossScaleState(
        scale=variable(float(settings.initial_scale), "scale", tf.float32),
        good_steps=variable(0, "good_steps", tf.int64),
        skipped_steps=variable(0, "skipped_steps", tf.int64),
    )


def in_cross_replica_context(function):
    """``function()``, called once for all replicas: through ``merge_call`` from a replica context."""
    import tensorflow as tf

    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
        return tf.distribute.get_replica_context().merge_call(lambda _strategy: function())
    return function()


# --- the gradients ----------------------------------------------------------------


def seed_gradient(target, scale, given=None):
    """The gradient back-propagation starts from: ``scale`` (in ``target``'s dtype) times ``given``.

    ``given`` is the caller's own output gradient (ones when None). Seeding the
    loss's gradient, rather than multiplying the loss, leaves the forward
    computation unchanged.
    """
    import tensorflow as tf

    with tf.name_scope(SEED_SCOPE):
        # An op of its own, even where no cast is needed: the float32 variant of a step makes it 1.
        seed = tf.identity(tf.cast(scale, target.dtype), name=SEED_NAME)
        if given is None:
            return tf.fill(tf.shape(target), seed)
        return tf.math.multiply_no_nan(given, seed)


def inverse_of(scale):
    """``1 / scale`` (0 for a scale of 0), what :func:`unscale` multiplies by."""
    import tensorflow as tf

    return tf.math.divide_no_nan(tf.ones_like(scale), scale)


def unscale(grad, inverse):
    """``grad / scale`` with an op on no op list, so the division is not retyped.

    ``inverse`` is ``1 / scale`` (float32); it is cast to the gradient's dtype.
    Dense tensors and ``IndexedSlices`` both work; None stays None.
    """
    import tensorflow as tf

    if grad is None:
        return None
    with tf.name_scope(UNSCALE_SCOPE):
        if isinstance(grad, tf.IndexedSlices):
            values = tf.math.multiply_no_nan(grad.values, tf.cast(inverse, grad.values.dtype))
            return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
        return tf.math.multiply_no_nan(grad, tf.cast(inverse, grad.dtype))


# --- the gradients joined (a GPU step) ---------------------------------------------------

#: The most elements one joined tensor holds (64 MB of float32): a few kernels cover a large model's
#: gradients, and joining them costs at most this much more memory at a time per dtype.
GROUP_ELEMENTS = 2 ** 24
#: Why the painting leaves a joining op float32 (the node attr's value, shown by ``explain``).
JOINED_REASON = "loss scaling's joined gradients: kept float32"


def is_grouped(settings: LossScaleSettings) -> bool:
    """Whether the gradients are unscaled and checked joined: as ``settings.grouped`` says, else on a GPU.

    One op per gradient is one kernel launch per gradient: ResNet-50's 214
    gradients cost ~850 launches to unscale and check, which a GPU step bound
    by launches pays in full; joined, a handful. On a CPU an op is cheap and
    joining copies every gradient twice more, so it is left one by one.
    """
    from amp_rewrite import tf_internals

    if settings.grouped is False or tf_internals.missing(tf_internals.NODE_ATTRS):
        return False
    if settings.grouped:
        return True
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU"))


def unscale_all(grads: list, inverse, *, grouped: bool) -> list:
    """:func:`unscale` of each of ``grads`` (a flat list); ``grouped``: one multiply per group (:func:`_groups`).

    A gradient no group takes (an ``IndexedSlices``, a dynamic shape, the only
    one of its dtype) is unscaled alone. The values are those :func:`unscale`
    gives, bit for bit: the same multiply, on the same elements.
    """
    if not grouped:
        return [unscale(g, inverse) for g in grads]
    import tensorflow as tf

    groups = _groups(grads)
    in_groups = {i for group in groups for i in group}
    out = [None if i in in_groups else unscale(g, inverse) for i, g in enumerate(grads)]
    with tf.name_scope(UNSCALE_SCOPE):
        for group in groups:
            tensors = [grads[i] for i in group]
            scaled = _kept(tf.math.multiply_no_nan(_joined(tensors), tf.cast(inverse, tensors[0].dtype)))
            parts = tf.split(scaled, [t.shape.num_elements() for t in tensors], name="parts")
            _kept(parts[0])
            for i, tensor, part in zip(group, tensors, parts):
                out[i] = tf.reshape(part, tensor.shape)
    return out


def nonfinite_joined(grads) -> object:
    """A float32 scalar: 1 when any of ``grads`` holds an inf or NaN, else 0; the groups checked joined.

    What :func:`count_nonfinite` says but for how many: two ops per group, not
    three per gradient. Which gradients were at fault is
    :func:`nonfinite_flags`' to say, when a skip needs their names.
    """
    import tensorflow as tf

    grads = list(grads)
    groups = _groups(grads)
    grouped_indices = {i for group in groups for i in group}
    tensors = [_joined([grads[i] for i in group]) for group in groups]
    tensors += [g.values if isinstance(g, tf.IndexedSlices) else g
                for i, g in enumerate(grads) if g is not None and i not in grouped_indices]
    if not tensors:
        return tf.constant(0.0)
    finite = [_kept(tf.reduce_all(_kept(tf.math.is_finite(t)))) for t in tensors]
    every = finite[0] if len(finite) == 1 else tf.reduce_all(tf.stack(finite))
    return tf.cast(tf.logical_not(every), tf.float32)


def _groups(grads: list) -> list[list[int]]:
    """Indices of the dense gradients of static shape, in groups of one dtype and :data:`GROUP_ELEMENTS` at most.

    In order; a group of one (a gradient larger than the bound, the only one
    of its dtype) is no group: joining one tensor would only copy it.
    """
    import tensorflow as tf

    groups: list[list[int]] = []
    open_groups: dict = {}  # dtype -> (indices, elements) of the group being filled
    for i, grad in enumerate(grads):
        if grad is None or isinstance(grad, tf.IndexedSlices) or not grad.shape.is_fully_defined():
            continue
        size = grad.shape.num_elements()
        indices, elements = open_groups.get(grad.dtype, ([], 0))
        if indices and elements + size > GROUP_ELEMENTS:
            groups.append(indices)
            indices, elements = [], 0
        open_groups[grad.dtype] = (indices + [i], elements + size)
    groups.extend(indices for indices, _ in open_groups.values())
    return sorted(group for group in groups if len(group) > 1)


def _joined(tensors: list):
    """``tensors`` flattened and concatenated into one vector, kept float32 by the painting."""
    import tensorflow as tf

    return _kept(tf.concat([tf.reshape(t, [-1]) for t in tensors], 0, name="joined"))


def _kept(tensor):
    """``tensor``, whose op the painting leaves float32 (:data:`~amp_rewrite.paint.context.KEEP_FLOAT32_ATTR`).

    Joined gradients mix half and float32 producers: painted half, a joining
    op would cast float32 gradients down. Eager ops have no attrs, and no rewrite.
    """
    import tensorflow as tf

    from amp_rewrite import tf_internals
    from amp_rewrite.paint.context import KEEP_FLOAT32_ATTR

    if not tf.executing_eagerly():
        tf_internals.set_string_attr(tensor.op, KEEP_FLOAT32_ATTR, JOINED_REASON)
    return tensor


# --- when no scale helps ---------------------------------------------------------------

FIX_HINT = ("AMP_REWRITE_FIND_OVERFLOW=1 names the op; keep it float32 with "
            "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD or AMP_REWRITE_KEEP_FLOAT32")
#: How many steps in a row must have a non-finite loss before no scale is said to help (one is a bad batch).
LOSS_REPEATS = 2
LOSS_NOT_FINITE = (f"{LOSS_REPEATS} steps in a row were skipped and their loss itself was not finite: the loss is "
                   "computed before the loss scale, so no scale helps; an op overflows in half in the forward pass "
                   "(" + FIX_HINT + ")")
FLOOR_REASON = ("a step was skipped with the loss scale at its floor of 1: the gradients are not finite even "
                "unscaled, so no scale helps; an op overflows in half whatever the scale (" + FIX_HINT + ")")


def is_finite_loss(loss):
    """A float32 scalar: 1 when every value of ``loss`` is finite, else 0 (what a step's report carries)."""
    import tensorflow as tf

    return tf.cast(tf.reduce_all(tf.math.is_finite(loss)), tf.float32)


def hopeless_reason(*, skipped: bool, scale: float, non_finite_losses: int) -> str | None:
    """Why no loss scale can make a step finite, or None while one may.

    Args:
        skipped: a step was skipped.
        scale: the scale that step used.
        non_finite_losses: how many steps in a row, that one last, had a loss
            (before scaling) that was not finite.
    """
    if not skipped:
        return None
    if non_finite_losses >= LOSS_REPEATS:
        return LOSS_NOT_FINITE
    return FLOOR_REASON if scale <= 1.0 else None


def count_non_finite_losses(count, loss_is_finite):
    """The count of non-finite losses in a row after one more loss: 0 when it is finite, else ``count + 1``."""
    import tensorflow as tf

    return tf.where(loss_is_finite > 0.5, tf.zeros_like(count), count + 1)


# --- the schedule -------------------------------------------------------------------


def next_scale_state(state, is_finite, settings: LossScaleSettings):
    """One step of the schedule: ×2 after ``growth_interval`` finite steps, ÷2 (floor 1) on a skip.

    ``state`` is anything with ``scale``, ``good_steps`` and ``skipped_steps``
    variables (the TF1 graph's or the TF2 process-wide one). Returns the new
    (scale, good_steps, skipped_steps) tensors; the caller assigns them.
    """
    import tensorflow as tf

    # Selects rather than arithmetic on 0/1 factors: each op is a kernel launch on a GPU, every step.
    is_finite = tf.convert_to_tensor(is_finite)
    scale = tf.convert_to_tensor(state.scale)
    counted = tf.convert_to_tensor(state.good_steps) + 1
    zero = tf.zeros_like(counted)
    if settings.is_dynamic:
        grow = counted >= settings.growth_interval
        grown = tf.minimum(scale * 2.0, MAX_SCALE)
        shrunk = tf.maximum(scale * 0.5, 1.0)
        new_scale = tf.where(is_finite, tf.where(grow, grown, scale), shrunk)
        good = tf.where(tf.logical_and(is_finite, tf.logical_not(grow)), counted, zero)
    else:
        new_scale = scale
        good = tf.where(is_finite, counted, zero)
    skipped = tf.convert_to_tensor(state.skipped_steps) + tf.cast(tf.logical_not(is_finite), tf.int64)
    return new_scale, good, skipped


def assign_next_state(state, is_finite, settings: LossScaleSettings) -> tuple:
    """The three assignments that move ``state`` one step along :func:`next_scale_state`."""
    import tensorflow as tf

    with tf.name_scope(UPDATE_SCOPE):
        scale, good, skipped = next_scale_state(state, is_finite, settings)
        return (state.scale.assign(scale), state.good_steps.assign(good),
                state.skipped_steps.assign(skipped))


# --- the guard ----------------------------------------------------------------------


def nonfinite_flags(grads) -> object:
    """A float32 vector, one entry per gradient: 1 where it holds an inf or NaN (0 for None)."""
    import tensorflow as tf

    finite = []
    for grad in grads:
        if grad is None:
            finite.append(tf.constant(True))
            continue
        values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
        finite.append(tf.reduce_all(tf.math.is_finite(values)))
    return tf.cast(tf.logical_not(tf.stack(finite)), tf.float32)  # one negation for all, not one each


def count_nonfinite(grads) -> object:
    """A float32 scalar: how many of ``grads`` hold an inf or NaN."""
    import tensorflow as tf

    if all(grad is None for grad in grads):
        return tf.constant(0.0)
    return tf.reduce_sum(nonfinite_flags(grads))


class GuardedStep:
    """One guarded optimizer step: applied when every gradient is finite, skipped otherwise.

    The schedule moves either way. An adapter subclasses it with a
    ``build(distribution, *args, nonfinite)`` made of :meth:`first_replica`,
    :meth:`apply_or_skip` and :meth:`update`, plus what only it does (TF1:
    slots before the branch, the step's report; TF2: the skip's line), and
    calls :meth:`build_for_all_replicas`.
    """

    def __init__(self, state, settings: LossScaleSettings):
        self.state = state
        self.settings = settings

    def build(self, distribution, *args):
        """Builds the step in cross-replica context; ``distribution`` is the strategy, or None."""
        raise NotImplementedError

    def build_for_all_replicas(self, nonfinite, *args):
        """``self.build(distribution, *args, nonfinite)``, called once, in cross-replica context.

        Under a strategy, ``nonfinite`` (a count, or one flag per gradient) is
        all-reduced over the replicas first, so every replica (and worker)
        takes the same decision.
        """
        import tensorflow as tf

        if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
            context = tf.distribute.get_replica_context()
            total = context.all_reduce(tf.distribute.ReduceOp.SUM, nonfinite)
            # Through merge_call: the gradients arrive as per-replica values,
            # and the apply runs for every replica inside one cond.
            return context.merge_call(self.build, args=(*args, total))
        return self.build(None, *args, nonfinite)

    @staticmethod
    def first_replica(distribution, value):
        """``value`` as one tensor: every replica's copy holds the same all-reduced value."""
        if distribution is None:
            return value
        return distribution.experimental_local_results(value)[0]

    @staticmethod
    def apply_or_skip(distribution, is_finite, apply, args, *, skip=None):
        """``cond(is_finite, apply(*args) on every replica, skip())``: True where applied.

        The cond is named :data:`DECISION` (under the caller's
        :data:`APPLY_SCOPE`), so a rebuilt body finds the step's decision.
        Eager and without a strategy, a Python choice. A result ``apply`` or
        ``skip`` returns (a TF1 update op) is a control dependency of its branch.
        """
        import tensorflow as tf

        if tf.executing_eagerly() and distribution is None:
            if bool(is_finite):
                apply(*args)
            elif skip is not None:
                skip()
            return is_finite

        def apply_branch():
            if distribution is None:
                results = [apply(*args)]
            else:
                per_replica = distribution.extended.call_for_each_replica(apply, args=args)
                results = distribution.experimental_local_results(per_replica)
            with tf.control_dependencies([result for result in results if result is not None]):
                return tf.constant(True)

        def skip_branch():
            result = skip() if skip is not None else None
            with tf.control_dependencies([] if result is None else [result]):
                return tf.constant(False)

        return tf.cond(is_finite, apply_branch, skip_branch, name=DECISION)

    def update(self, is_finite) -> tuple:
        """Moves the state one step along the schedule (:func:`assign_next_state`)."""
        return assign_next_state(self.state, is_finite, self.settings)
