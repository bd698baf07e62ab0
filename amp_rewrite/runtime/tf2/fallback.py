"""Falling back to float32 in TF2 when no loss scale helps.

A TF1 session switches to its float32 graph once a skipped step shows that no
loss scale helps (:mod:`amp_rewrite.runtime.tf1.session`). Here the same
happens to a rewritten ``tf.function`` that applies a guarded optimizer (a
custom training loop, or the train function Keras' ``fit`` traces): after each
eager call, the installed loss scaling's state
(:class:`~amp_rewrite.runtime.loss_scale.tf2_state.TF2LossScaling`) says whether the call skipped a
step, at which scale, and how many losses in a row were not finite. Skipped
steps whose loss itself was not finite twice in a row (the forward pass
overflows half: no scale changes the loss; once is a bad batch), or a step
skipped at the scale's floor of 1 (the gradients are not finite even
unscaled), end the rewrite
(:func:`~amp_rewrite.runtime.loss_scale.core.hopeless_reason`); other skips
only halve the scale. The function gets its traced float32 body back for the next call
(:meth:`~amp_rewrite.runtime.tf2.swap_records.SwapTable.restore`), with one warning naming
why. Variables and optimizer slots are captured by the function, not copied,
so training goes on from their values. ``AMP_REWRITE_STRICT=1`` raises
instead.

A function that calls such a function inside its own graph needs more: its
FunctionDef names the callee's rewritten body, so restoring the callee does
not reach it. Keras 3's ``fit`` is built that way: the ``tf.function`` it
calls (``one_step_on_iterator``, ``multi_step_on_iterator``) runs the
one-step ``tf.function`` ``one_step_on_data`` inside its graph, once, or
``steps_per_execution`` times (unrolled, or in a ``tf.while_loop``,
depending on the Keras release). :class:`Callers` keeps those callers; each
is watched like the callee, and when either finds no scale helps the callee gets
its traced body back and every caller a float32 body of its own, the same
FunctionDefs with the calls sent to the traced callee
(:func:`amp_rewrite.runtime.tf2.concrete.reload_calling`).

The watch costs one scalar variable read per call (three after a skip), and only functions that
hold a guarded apply, or call one that does, get it, under dynamic loss
scaling. XLA-compiled functions record no skip cause, so they are not
watched.

Each tracing hook (:class:`~amp_rewrite.runtime.tf2.tracing.TracingHook`) has
one :class:`FloorFallback`, which holds its :class:`Callers` and
:class:`FellBack` and does the falling back for the functions the hook swapped.
It is given what it works on when the hook makes it: the loss scaling whose
skips it watches and the hook's table of swapped functions
(:class:`~amp_rewrite.runtime.tf2.swap_records.SwapTable`), not the hook. So this
module knows the table and the loss scaling's state, both below it, and the
hook above it imports it; nothing here reaches back up.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amp_rewrite import tf_internals
from amp_rewrite.errors import NO_MESSAGE, RuntimeRewriteError, first_line
from amp_rewrite.runtime.ledger import LOCK
from amp_rewrite.runtime.loss_scale.core import LOSS_NOT_FINITE, hopeless_reason
from amp_rewrite.runtime.tf2.calls import called_name, function_name
from amp_rewrite.runtime.tf2.concrete import reload_calling

if TYPE_CHECKING:
    from amp_rewrite.runtime.loss_scale.tf2_state import TF2LossScaling
    from amp_rewrite.runtime.tf2.swap_records import SwapRecord, SwapTable

logger = logging.getLogger(__name__)

FELL_BACK = "an earlier trace of it fell back, since no loss scale helped"
SHARES_WEIGHTS = ("it computes with weights whose forward pass overflowed half in tf.function {name} "
                  "(its loss was not finite at any loss scale)")


def is_wanted(scaling: TF2LossScaling | None) -> bool:
    """Whether functions are watched: only under dynamic scaling, where a skip at 1 means no scale helps.

    ``scaling`` is the installed loss scaling (None: none is). A fixed scale
    (``AMP_LOSS_SCALE=1`` included) never moves, so its skips say nothing
    about other scales; they are counted as before.
    """
    return scaling is not None and scaling.loss_scale.is_dynamic


class FloorWatch:
    """The ``_call_flat`` of a watched function: calls it, then ``on_hopeless(cf, reason)`` when no scale helps.

    No scale helps (:func:`~amp_rewrite.runtime.loss_scale.core.hopeless_reason`)
    after skipped steps whose loss was not finite twice in a row, or a skip at the scale's floor of 1.

    What a skipped step wrote besides the weights (Keras's running metrics, a
    batch norm's moving statistics) the rewritten body puts back itself
    (:mod:`amp_rewrite.runtime.loss_scale.step_writes`).

    ``on_hopeless`` runs after the call returned its outputs (which are still
    returned), so the step that skipped is not run again. The first-call
    guard (:class:`~amp_rewrite.runtime.tf2.first_call_guard.FirstCallGuard`) uses :meth:`before_call` and
    :meth:`after_call` around the first call, which it runs itself.
    """

    def __init__(self, concrete_function, scaling: TF2LossScaling, on_hopeless: Callable[[object, str], None]):
        self.function_ref = weakref.ref(concrete_function)
        self.scaling = scaling
        self.on_hopeless = on_hopeless

    def __call__(self, tensor_inputs, captured_inputs):
        import tensorflow as tf

        cf: Any = self.function_ref()
        if not tf.executing_eagerly():
            return tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)
        start = self.before_call(cf)
        outputs = tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)
        self.after_call(cf, start)
        return outputs

    def before_call(self, concrete_function) -> int | None:
        """The skipped-step count now (None before any step was scaled)."""
        return self.count()

    def after_call(self, concrete_function, start: Any) -> None:
        """After a call that began with ``start`` skipped steps: calls ``on_hopeless`` if a skipped step shows
        that no scale helps."""
        if not self.skipped_since(start):
            return
        last = self.scaling.state().last_skip
        reason = hopeless_reason(skipped=True, scale=float(last.scale.numpy()),
                                 non_finite_losses=int(last.non_finite_losses.numpy()))
        if reason is not None:
            self.on_hopeless(concrete_function, reason)

    def skipped_since(self, start: Any) -> bool:
        """Whether a step was skipped since :meth:`before_call` returned ``start``."""
        after = self.count()
        return after is not None and after != (start or 0)

    def count(self) -> int | None:
        """The skipped-step count now (None before any step was scaled)."""
        if not self.scaling.has_state():
            return None
        return int(self.scaling.state().skipped_steps.numpy())


class Callers:
    """Functions whose graph calls the rewritten body of a function that applies a guarded optimizer.

    Each caller is kept with the names of the rewritten bodies it calls (a
    function's body is registered under the name its call ops give).
    :meth:`fall_back` gives a caller a float32 body once those bodies are
    replaced by the traced ones.
    """

    def __init__(self):
        self._calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # caller → the ConcreteFunction whose state it now runs, kept alive with it
        self._float32: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def note(self, concrete_function, rewritten_names: set[str]) -> frozenset[str]:
        """Keeps ``concrete_function`` if its graph calls one of ``rewritten_names``; the ones it calls."""
        names = frozenset(tf_internals.graph_functions(concrete_function.graph)) & rewritten_names
        if names:
            self._calls[concrete_function] = names
        return names

    def calls_of(self, concrete_function) -> frozenset[str]:
        """The rewritten bodies ``concrete_function`` calls (empty when it is no kept caller)."""
        return self._calls.get(concrete_function, frozenset())

    def fall_back(self, replacements: dict[str, Any], restore: Callable[[object], None]) -> list[str]:
        """Gives every caller of a replaced body a float32 body; returns the callers' names.

        Args:
            replacements: name of a rewritten body → the traced function to call instead.
            restore: puts a caller's traced state back first, when it was rewritten itself.

        Raises:
            Any error of TensorFlow while loading a caller's new body (the
            callers before it have theirs).
        """
        changed = []
        for caller, names in list(self._calls.items()):
            wanted = {name: replacements[name] for name in sorted(names) if name in replacements}
            if not wanted:
                continue
            del self._calls[caller]
            name = str(caller.graph.name)
            restore(caller)
            tf_internals.drop_call_override(caller)
            new = reload_calling(caller, wanted)
            if new is None:
                continue
            state = tf_internals.concrete_function_state(caller)
            tf_internals.take_over_graph_collection(state)
            tf_internals.set_concrete_function_state(caller, {**state, **tf_internals.runnable_state(
                tf_internals.concrete_function_state(new), inference_only=False)})
            self._float32[caller] = new
            changed.append(name)
        return changed

    def forget(self) -> None:
        """Stops watching the callers (their float32 bodies stay: float32 is what the hook's absence runs)."""
        for caller in list(self._calls):
            tf_internals.drop_call_override(caller)
        self._calls.clear()


class FellBack:
    """The functions that fell back, each by name and trainable variables: new traces of them stay float32.

    A ``tf.function`` traces again for new input shapes or structures (Keras
    3's ``train_on_batch`` calls the one-step function that ``fit`` calls in
    its graph), and the hook rewrites each trace on its own. A new trace of a
    function that fell back would skip a step at the floor again, so one with
    the same name that applies a guarded optimizer to the same variables is
    left as traced. Variables are held weakly: a new model is a new function.
    The registered names of the float32 bodies are kept too: a function
    traced later that calls one must not rewrite it.
    """

    def __init__(self):
        self._functions: list[tuple[str, list[weakref.ref]]] = []
        self._bodies: set[str] = set()
        # name of a function whose forward pass overflowed → its trainable variables
        self._overflowed: list[tuple[str, list[weakref.ref]]] = []

    def add(self, name: str, graph) -> None:
        """Remembers the function ``name`` traced as ``graph``."""
        self._functions.append((name, [weakref.ref(v) for v in graph.trainable_variables]))

    def add_overflowed(self, name: str, graph) -> None:
        """Remembers that the forward pass of ``name``, traced as ``graph``, overflows half at any loss scale."""
        self._overflowed.append((name, [weakref.ref(v) for v in graph.trainable_variables]))

    def overflowed_with(self, graph) -> str | None:
        """The name of a function that fell back whose forward pass computes with ``graph``'s weights, or None.

        Such a function (an evaluation or prediction function of the same
        model, a later trace of the training step) computes the forward pass
        that overflowed half, so it stays float32 too.
        """
        ids = {id(v) for v in graph.trainable_variables}
        for name, refs in self._overflowed:
            if any(id(v) in ids for v in (ref() for ref in refs) if v is not None):
                return name
        return None

    def holds(self, name: str, graph) -> bool:
        """Whether a function of ``name`` training the variables ``graph`` trains fell back."""
        ids = sorted(id(v) for v in graph.trainable_variables)
        for known, refs in self._functions:
            alive = [ref() for ref in refs]
            if known == name and ids and all(v is not None for v in alive) and sorted(map(id, alive)) == ids:
                return True
        return False

    def add_body(self, registered_name: str) -> None:
        """Remembers the registered name of a float32 body that runs for a function that fell back."""
        self._bodies.add(registered_name)

    def has_body(self, registered_name: str) -> bool:
        return registered_name in self._bodies

    def clear(self) -> None:
        self._functions.clear()
        self._bodies.clear()
        self._overflowed.clear()


class FloorFallback:
    """A tracing hook's fallback to float32 when no loss scale helps (this module's algorithm).

    The marked functions' hook has no loss scaling: its fallback never acts.

    Attributes:
        scaling: the installed TF2 loss scaling whose skips are watched; None: none is.
        swapped: the hook's swapped functions, the ones that fall back (the hook's own table).
        is_strict: raise instead of falling back.
        callers: functions calling a rewritten guarded function.
        fell_back: functions no loss scale helped.
    """

    def __init__(self, scaling: TF2LossScaling | None, swapped: SwapTable, *, is_strict: bool):
        self.scaling = scaling
        self.swapped = swapped
        self.is_strict = is_strict
        self.callers = Callers()
        self.fell_back = FellBack()

    def forget(self) -> None:
        self.callers.forget()
        self.fell_back.clear()

    def is_wanted(self) -> bool:
        return is_wanted(self.scaling)

    def has_guarded_apply(self, graph) -> bool:
        return self.scaling is not None and self.scaling.has_guarded_apply(graph)

    def floor_watch(self, concrete_function):
        """The ``_call_flat`` that watches a function holding a guarded apply for skips at the scale floor, or None."""
        scaling = self.scaling
        if scaling is None or not is_wanted(scaling):
            return None
        return FloorWatch(concrete_function, scaling, self.fall_back_hopeless)

    def note_guarded_calls(self, concrete_function) -> bool:
        """Whether a just-traced function calls the rewritten body of a watched one.

        A function calling any rewritten body is kept in ``callers``: when that
        body falls back (a watched one, or one computing with the weights of a
        function whose forward pass overflowed), the caller gets a float32 body too.
        """
        if not self.is_wanted():
            return False
        watched = {called_name(cf): self._is_watched(cf, record) for cf, record in self.swapped.items()}
        return any(watched[name] for name in self.callers.note(concrete_function, set(watched)))

    def _is_watched(self, concrete_function, record: SwapRecord) -> bool:
        return (not record.report.is_inference_only and self._holds_guarded_apply(record)
                and not tf_internals.is_xla_compiled(concrete_function.function_def))

    def fell_back_before(self, concrete_function, name: str) -> bool:
        """Whether this function stays as traced, with a line saying why.

        It does when an earlier trace of it fell back, or when it computes with
        the weights of a function whose forward pass overflowed half.
        """
        graph = concrete_function.graph
        overflowed = self.fell_back.overflowed_with(graph)
        if overflowed is not None:
            reason = SHARES_WEIGHTS.format(name=overflowed)
        elif self.has_guarded_apply(graph) and self.fell_back.holds(name, graph):
            reason = FELL_BACK
        else:
            return False
        logger.info("amp-rewrite: tf.function %s runs in float32: %s", name, reason)
        self.fell_back.add_body(called_name(concrete_function))
        return True

    def _holds_guarded_apply(self, record: SwapRecord) -> bool:
        return self.has_guarded_apply(tf_internals.graph_in_state(record.traced_state))

    def fall_back_hopeless(self, concrete_function, reason: str) -> None:
        """No loss scale helps this function: from the next call it runs float32.

        A rewritten function gets its traced body back, and so do the other
        watched traces of the same name (a ``tf.function`` that creates variables
        is traced twice, once creating them and once to run) and the rewritten
        functions it calls. Every function whose graph calls one of those bodies
        gets a float32 body (:class:`Callers`).
        """
        swapped = self.swapped
        record = swapped.record_of(concrete_function)
        callees = self.callers.calls_of(concrete_function)
        if record is None and not callees:
            return
        name = record.report.name if record is not None else function_name(concrete_function)
        if self.is_strict:
            raise RuntimeRewriteError(f"tf.function {name}: {reason}")
        with LOCK:
            names = {name} | {other.report.name for cf, other in swapped.items()
                              if called_name(cf) in callees}
            hopeless = [cf for cf, other in swapped.items()
                        if other.report.name in names and self._holds_guarded_apply(other)]
            replacements: dict[str, Any] = {}
            for cf in dict.fromkeys([concrete_function, *hopeless]):
                if swapped.record_of(cf) is not None:
                    self._restore(cf, replacements)
                    self.fell_back.add(function_name(cf), cf.graph)
            sharers = self._forward_overflowed(name, concrete_function.graph, replacements) if reason == \
                LOSS_NOT_FINITE else []
            self._fall_back_callers(name, replacements)
        logger.warning("amp-rewrite: tf.function %s runs in float32 from the next call: %s", name, reason)
        for sharer in sharers:
            logger.warning("amp-rewrite: tf.function %s runs in float32 from the next call: %s", sharer,
                           SHARES_WEIGHTS.format(name=name))

    def _forward_overflowed(self, name: str, graph, replacements: dict[str, Any]) -> list[str]:
        """The forward pass of ``name`` overflows half: the rewritten functions computing with its weights fall back.

        Each gets its traced body back (added to ``replacements``, so the
        functions calling it get float32 bodies too); functions traced later
        with those weights stay float32 (:meth:`fell_back_before`). Returns
        the names of the functions that fell back here.
        """
        self.fell_back.add_overflowed(name, graph)
        names = []
        for cf, record in list(self.swapped.items()):
            if self.fell_back.overflowed_with(cf.graph) is not None:
                self._restore(cf, replacements)
                names.append(record.report.name)
        return sorted(set(names))

    def _restore(self, concrete_function, replacements: dict[str, Any]) -> None:
        """Gives a swapped function its traced body back, for good.

        ``replacements`` gets its rewritten body's name → the traced body, for
        the functions calling it; later traces calling the traced body keep it.
        """
        rewritten_name = called_name(concrete_function)
        self.swapped.restore(concrete_function)
        replacements[rewritten_name] = tf_internals.inference_function(concrete_function)
        self.fell_back.add_body(called_name(concrete_function))

    def _fall_back_callers(self, name: str, replacements: dict) -> None:
        """Gives the functions calling the replaced bodies float32 bodies (a warning if one fails)."""
        try:
            changed = self.callers.fall_back(replacements, self.swapped.restore)
        except Exception as exc:
            reason = first_line(exc, with_type=True, if_empty=NO_MESSAGE)
            logger.warning("amp-rewrite: tf.function %s: a function calling it keeps its half body: "
                           "building a float32 one failed: %s", name, reason)
            return
        for caller in changed:
            logger.debug("tf.function %s: runs a float32 body from the next call", caller)
