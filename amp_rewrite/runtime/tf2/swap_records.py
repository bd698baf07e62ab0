"""What a tracing hook swapped: a record per ConcreteFunction running its rewritten body.

The hook (:class:`~amp_rewrite.runtime.tf2.tracing.TracingHook`) fills its
:class:`SwapTable`; its fallback to float32
(:class:`~amp_rewrite.runtime.tf2.fallback.FloorFallback`) and its first-call
guards (:class:`~amp_rewrite.runtime.tf2.first_call_guard.FirstCallGuards`)
are given the same table, to read the records and put traced bodies back,
and know nothing else of the hook. They all import this module, which
imports none of them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from amp_rewrite import tf_internals
from amp_rewrite.runtime.ledger import LOCK

# The lines about swaps (the hook's, its swap steps', its first-call guards')
# carry the tracing hook's name, as they always have.
LOGGER_NAME = "amp_rewrite.runtime.tf2.tracing"


@dataclass(frozen=True)
class FunctionReport:
    """What the hook did to one traced ConcreteFunction.

    Attributes:
        name: the traced function's name.
        summary: the rewrite's numbers.
        nodes_total: nodes of the function and of the functions it calls.
        seconds: time spent rewriting and reloading it.
        rewrite_seconds: the part of ``seconds`` the rewrite itself took.
        is_explicit: traced by :func:`amp_rewrite.function`, not by the runtime.
        is_inference_only: calls under a tape run the traced float32 function.
    """

    name: str
    summary: str
    nodes_total: int
    seconds: float
    rewrite_seconds: float
    is_explicit: bool
    is_inference_only: bool


@dataclass
class SwapRecord:
    """A swapped ConcreteFunction: its report, its traced state, and the rewritten function."""

    report: FunctionReport
    traced_state: dict = field(repr=False)
    rewritten: object = field(repr=False)


class SwapTable(weakref.WeakKeyDictionary):
    """The ConcreteFunctions running rewritten now (held weakly), each with its :class:`SwapRecord`."""

    def record_of(self, concrete_function) -> SwapRecord | None:
        return self.get(concrete_function)

    def restore(self, concrete_function) -> None:
        """Puts the traced state back into ``concrete_function`` and forgets its record."""
        with LOCK:
            record = self.pop(concrete_function, None)
            if record is not None:
                tf_internals.set_concrete_function_state(concrete_function, record.traced_state)
