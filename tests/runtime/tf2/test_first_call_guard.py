"""The first-call guard on its own, without a hook: it steps aside, hands a failure on, or makes way for a watch.

Each test traces small functions with no hook installed and sets a guard
as the ConcreteFunction's ``_call_flat`` by hand, as the swap step and the
tracing hook do.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import rng

from amp_rewrite import runtime, tf_internals
from amp_rewrite.errors import RuntimeRewriteError
from amp_rewrite.runtime.tf2 import tracing
from amp_rewrite.runtime.tf2.first_call_guard import FirstCallGuard, FirstCallGuards
from amp_rewrite.runtime.tf2.swap_records import FunctionReport, SwapRecord, SwapTable

Y = rng(6).normal(size=(4, 5)).astype(np.float32)
SPEC = tf.TensorSpec([4, 5])


def traced(python_function):
    runtime.disable()
    assert tracing.installed_hooks() == []
    return tf.function(python_function).get_concrete_function(SPEC)


def failing():
    """A function whose every run fails (a division by zero caught by check_numerics)."""
    return traced(lambda x: tf.debugging.check_numerics(x / 0.0, "broken"))


def test_a_first_run_that_succeeds_makes_the_guard_step_aside():
    cf = traced(lambda x: x * 2.0)
    failures: list = []
    tf_internals.override_call(cf, FirstCallGuard(cf, lambda *args: failures.append(args)))
    assert np.array_equal(cf(tf.constant(Y)).numpy(), Y * 2.0)
    assert tf_internals.call_override(cf) is None and failures == []


def test_a_first_run_that_fails_hands_the_function_error_and_inputs_to_on_failure():
    cf = failing()
    failures: list = []

    def on_failure(function, exc, tensor_inputs, captured_inputs):
        failures.append((function, type(exc).__name__))
        return tensor_inputs[0] * 3.0  # what a float32 run would have returned

    guard = FirstCallGuard(cf, on_failure)
    tf_internals.override_call(cf, guard)
    assert np.array_equal(cf(tf.constant(Y)).numpy(), Y * 3.0)
    assert failures == [(cf, "InvalidArgumentError")]
    assert tf_internals.call_override(cf) is guard  # no run has succeeded yet


def test_then_takes_the_guards_place_and_checks_the_first_call():
    class Watch:
        def __init__(self):
            self.checks = []

        def before_call(self, function):
            return ("started", function)

        def after_call(self, function, start):
            self.checks.append((function, start))

    cf = traced(lambda x: x + 1.0)
    watch = Watch()
    tf_internals.override_call(cf, FirstCallGuard(cf, lambda *args: None, then=watch))
    assert np.array_equal(cf(tf.constant(Y)).numpy(), Y + 1.0)
    assert tf_internals.call_override(cf) is watch and watch.checks == [(cf, ("started", cf))]


def swapped_to_a_failing_body():
    """A function running a body that fails, with a record holding its own traced state, as a swap leaves it."""
    cf = traced(lambda x: x * 2.0)
    report = FunctionReport(name="double", summary="", nodes_total=1, seconds=0.0, rewrite_seconds=0.0,
                            is_explicit=False, is_inference_only=False)
    record = SwapRecord(report, tf_internals.concrete_function_state(cf), rewritten=None)
    tf_internals.set_concrete_function_state(cf, tf_internals.concrete_function_state(failing()))
    return cf, record


def test_a_swapped_function_that_fails_runs_its_traced_body_and_leaves_the_table(caplog):
    cf, record = swapped_to_a_failing_body()
    guards = FirstCallGuards(SwapTable(), is_strict=False)
    guards.swapped[cf] = record
    tf_internals.override_call(cf, guards.for_swapped(cf, record))
    with caplog.at_level("WARNING", "amp_rewrite"):
        assert np.array_equal(cf(tf.constant(Y)).numpy(), Y * 2.0)
    assert cf not in guards.swapped
    [warning] = caplog.records
    assert warning.name == "amp_rewrite.runtime.tf2.tracing"  # the tracing hook's lines
    message = warning.getMessage()
    assert message.startswith("amp-rewrite: tf.function double runs in float32: the rewritten function failed "
                              "to run: InvalidArgumentError: ")
    assert message.endswith("broken : Tensor had Inf values")


def test_strictness_is_read_when_the_first_run_fails():
    """The marked functions' hook turns strict mode on for guards it made before."""
    cf, record = swapped_to_a_failing_body()
    guards = FirstCallGuards(SwapTable(), is_strict=False)
    tf_internals.override_call(cf, guards.for_swapped(cf, record))
    guards.is_strict = True
    with pytest.raises(RuntimeRewriteError, match="^tf.function double: the rewritten function failed to run: "):
        cf(tf.constant(Y))


def test_a_function_calling_no_swapped_body_gets_no_caller_guard():
    guards = FirstCallGuards(SwapTable(), is_strict=False)
    assert guards.for_caller(traced(lambda x: x * 2.0)) is None
