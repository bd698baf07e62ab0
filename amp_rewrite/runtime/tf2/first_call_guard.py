"""The first eager run of a rewritten body is checked: where it fails and float32 runs, float32 it is.

A rewrite that loads can still fail when it runs (a kernel missing for the
half type on this device, say). Two kinds of function get a
:class:`FirstCallGuard` as their ``_call_flat``, made by their hook's
:class:`FirstCallGuards`:

- a function the hook swapped (:meth:`FirstCallGuards.for_swapped`, from the
  swap step ``guard_first_call``): if its first eager run fails, it gets its
  traced body back and runs again;
- a function left as traced whose graph calls swapped bodies
  (:meth:`FirstCallGuards.for_caller`). Keras 3's ``fit`` never calls its
  rewritten one-step function eagerly: its outer train function calls it in
  a graph, so a rewritten body that fails at run time fails the outer call,
  which the callee's own guard never sees. If that first run fails, the
  callees get their traced bodies back, the caller float32 bodies calling
  them, and it runs again.

One shape for both: the guard runs the call; on an error it hands the
function, the error and the inputs to what it was given to do on failure;
after a run that succeeds it steps aside, or gives its place to the
loss-scale floor watch (:class:`~amp_rewrite.runtime.tf2.fallback.FloorWatch`),
for which it has checked that first call. Calls made while tracing another
function pass through unchecked. If float32 fails too, the error is the
script's and is raised as it was; otherwise a warning gives the reason
(with ``AMP_REWRITE_STRICT=1`` a :class:`~amp_rewrite.errors.RuntimeRewriteError`
is raised instead).

The guards know their hook's table of swaps (:mod:`~amp_rewrite.runtime.tf2.swap_records`),
never the hook.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.errors import NO_MESSAGE, RuntimeRewriteError, first_line
from amp_rewrite.runtime.ledger import LOCK
from amp_rewrite.runtime.tf2.calls import CallStep, called_name, function_name
from amp_rewrite.runtime.tf2.fallback import Callers
from amp_rewrite.runtime.tf2.swap_records import LOGGER_NAME, SwapRecord, SwapTable

logger = logging.getLogger(LOGGER_NAME)

# ``(function, error, tensor_inputs, captured_inputs)`` → the outputs of a float32 run; raises if none.
OnFailure = Callable[[Any, Exception, Any, Any], Any]


class FirstCallGuard:
    """The ``_call_flat`` checking a function's first eager run, then stepping aside.

    Attributes:
        function_ref: the guarded ConcreteFunction, held weakly (the guard lives in its instance state).
        on_failure: what to do when the first eager run fails (:data:`OnFailure`).
        then: the ``_call_flat`` that takes the guard's place after a run that succeeds;
            None: the function's own.
    """

    def __init__(self, concrete_function, on_failure: OnFailure, then: CallStep | None = None):
        self.function_ref = weakref.ref(concrete_function)
        self.on_failure = on_failure
        self.then = then

    def __call__(self, tensor_inputs, captured_inputs):
        import tensorflow as tf

        cf: Any = self.function_ref()
        if not tf.executing_eagerly():
            return tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)  # builds a call
        then = self.then
        start = then.before_call(cf) if then is not None else None
        try:
            outputs = tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)
        except Exception as exc:
            return self.on_failure(cf, exc, tensor_inputs, captured_inputs)
        if then is None:
            tf_internals.drop_call_override(cf)
        else:
            tf_internals.override_call(cf, then)
            then.after_call(cf, start)
        return outputs


class FirstCallGuards:
    """A tracing hook's first-call guards: which function gets which, and what each does on failure.

    Attributes:
        swapped: the hook's swapped functions (its own table): the records of
            the bodies that failed, and where their traced state goes back.
        is_strict: raise instead of running float32 (the hook's setting, read when a run fails).
    """

    def __init__(self, swapped: SwapTable, *, is_strict: bool):
        self.swapped = swapped
        self.is_strict = is_strict

    def for_swapped(self, concrete_function, record: SwapRecord, then: CallStep | None = None) -> FirstCallGuard:
        """The guard of a function the hook just swapped (``record``): on failure, its traced body runs."""
        return FirstCallGuard(concrete_function, functools.partial(self._run_traced, record), then)

    def for_caller(self, concrete_function, then=None) -> FirstCallGuard | None:
        """The guard of a function whose graph calls swapped bodies; None when it calls none."""
        called = {called_name(cf) for cf in list(self.swapped)}
        names = set(tf_internals.graph_functions(concrete_function.graph)) & called
        if not names:
            return None
        return FirstCallGuard(concrete_function, functools.partial(self._run_callees_traced, names), then)

    def _run_traced(self, record: SwapRecord, cf, exc: Exception, tensor_inputs, captured_inputs):
        """The rewritten function failed on its first run: try the traced one."""
        rewritten_state = tf_internals.concrete_function_state(cf)
        tf_internals.set_concrete_function_state(cf, record.traced_state)
        try:
            outputs = tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)
        except Exception:
            # The traced function fails too: the caller's error, not the rewrite's.
            tf_internals.set_concrete_function_state(cf, rewritten_state)
            raise exc from None
        with LOCK:
            self.swapped.pop(cf, None)
        self._say_float32(f"tf.function {record.report.name}", exc)
        return outputs

    def _run_callees_traced(self, names: set[str], caller, exc: Exception, tensor_inputs, captured_inputs):
        """A caller of rewritten bodies failed on its first run: give it their float32 bodies and try again."""
        callees = {called_name(cf): cf for cf in list(self.swapped)}
        caller_name = function_name(caller)  # before it runs a float32 body, which has a name of its own
        replacements: dict[str, Any] = {}
        reports = []
        for name in sorted(names & set(callees)):
            callee = callees[name]
            record = self.swapped.record_of(callee)
            self.swapped.restore(callee)
            replacements[name] = tf_internals.inference_function(callee)
            if record is not None:
                reports.append(record.report.name)
        callers = Callers()
        callers.note(caller, set(replacements))
        try:
            callers.fall_back(replacements, lambda _: None)
            outputs = tf_internals.call_concrete_function(caller, tensor_inputs, captured_inputs)
        except Exception:
            raise exc from None  # float32 fails too: the caller's error, not the rewrite's
        where = f"tf.function {', '.join(reports) or ', '.join(sorted(names))} (called by {caller_name})"
        self._say_float32(where, exc)
        return outputs

    def _say_float32(self, where: str, exc: Exception) -> None:
        """Why ``where`` runs float32 now: a warning, or in strict mode the error."""
        reason = "the rewritten function failed to run: " + first_line(exc, with_type=True, if_empty=NO_MESSAGE)
        if self.is_strict:
            raise RuntimeRewriteError(f"{where}: {reason}") from exc
        logger.warning("amp-rewrite: %s runs in float32: %s", where, reason)
