"""The swap steps on their own, without a hook: their order, a swap, and a rewrite that changes nothing.

Each test traces a small function with no hook installed, runs
:func:`~amp_rewrite.runtime.tf2.swap_steps.swap_in` on it with tools made here,
and checks what the traced ConcreteFunction runs afterwards.
"""

import re

import numpy as np
import tensorflow as tf
from helpers import rng

from amp_rewrite import runtime, tf_internals
from amp_rewrite.runtime.tf2 import swap_steps, tracing
from amp_rewrite.runtime.tf2.fallback import FloorFallback
from amp_rewrite.runtime.tf2.first_call_guard import FirstCallGuard, FirstCallGuards
from amp_rewrite.runtime.tf2.swap_records import SwapTable

A = rng(4).normal(size=(4, 6)).astype(np.float32)
W = rng(5).normal(scale=0.3, size=(6, 3)).astype(np.float32)


def make_tools():
    """Tools with no loss scaling, and a table of swaps of their own."""
    swapped = SwapTable()
    return swap_steps.SwapTools(loss_scaling=None, fallback=FloorFallback(None, swapped, is_strict=False),
                                profiles=None,
                                first_calls=FirstCallGuards(swapped, is_strict=False))


def traced(python_function):
    runtime.disable()
    assert tracing.installed_hooks() == []
    return tf.function(python_function).get_concrete_function(tf.TensorSpec([4, 6]))


def body_dtypes(cf) -> dict[str, str]:
    """Node name → ``T`` of the function body the ConcreteFunction runs now (nodes with a ``T`` attr)."""
    return {node.name: tf.dtypes.as_dtype(node.attr["T"].type).name for node in cf.function_def.node_def
            if "T" in node.attr}


def test_the_account_lists_the_steps_in_the_order_they_run():
    account = re.findall(r"^\d+\. ``(\w+)``", swap_steps.__doc__, flags=re.MULTILINE)
    assert account == [step.__name__ for step in swap_steps.STEPS]
    assert swap_steps.STEPS[-len(swap_steps.SWAP_STEPS):] == swap_steps.SWAP_STEPS


def test_a_swap_makes_the_traced_function_run_the_rewritten_body_and_returns_its_record():
    cf = traced(lambda a: tf.nn.relu(tf.matmul(a, tf.constant(W))))
    want = cf(tf.constant(A)).numpy()
    assert set(body_dtypes(cf).values()) == {"float32"}
    swap = swap_steps.Swap(cf, "relu_matmul", tracing.default_config(), is_explicit=True, calls_guarded=False)
    record = swap_steps.swap_in(make_tools(), swap)
    assert record is swap.record and record.report.name == "relu_matmul" and record.report.is_explicit
    assert record.report.summary.startswith("converted ")
    guard = tf_internals.call_override(cf)
    assert not swap.is_guarded and isinstance(guard, FirstCallGuard) and guard.then is None
    dtypes = body_dtypes(cf)
    assert [dtypes[name] for name in ("MatMul", "Relu")] == ["float16", "float16"]
    got = cf(tf.constant(A)).numpy()
    assert tf_internals.call_override(cf) is None  # the first call ran: the guard stepped aside
    assert got.dtype == np.float32 and not np.array_equal(got, want)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
    tf_internals.set_concrete_function_state(cf, record.traced_state)  # the record puts the traced body back
    assert set(body_dtypes(cf).values()) == {"float32"} and np.array_equal(cf(tf.constant(A)).numpy(), want)


def test_a_rewrite_that_changes_nothing_swaps_nothing():
    cf = traced(lambda a: tf.reduce_sum(a, axis=1))
    state = tf_internals.concrete_function_state(cf)
    swap = swap_steps.Swap(cf, "sum", tracing.default_config(), is_explicit=True, calls_guarded=False)
    assert swap_steps.swap_in(make_tools(), swap) is None
    assert swap.rewritten.concrete_function is None
    assert tf_internals.concrete_function_state(cf) == state and tf_internals.call_override(cf) is None

