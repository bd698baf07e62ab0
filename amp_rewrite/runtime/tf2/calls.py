"""What the ``_call_flat`` wrappers of a traced function share: their protocol, and its names.

A rewritten ``tf.function``'s eager calls pass through wrappers set as its
``_call_flat`` (:func:`amp_rewrite.tf_internals.override_call`): the
first-call guard (:mod:`~amp_rewrite.runtime.tf2.first_call_guard`), the
step trial (:mod:`~amp_rewrite.runtime.tf2.function_trial`) and the
loss-scale floor watch (:mod:`~amp_rewrite.runtime.tf2.fallback`). Each
hands the next its bookkeeping through :class:`CallStep`; all of them name a
function the same two ways (:func:`function_name`, :func:`called_name`).
"""

from __future__ import annotations

from typing import Any, Protocol


class CallStep(Protocol):
    """A ``_call_flat`` that takes a first-call guard's place, and whose bookkeeping the guard does for the first call.

    The loss-scale floor watch (:class:`~amp_rewrite.runtime.tf2.fallback.FloorWatch`), and a step trial
    (:class:`~amp_rewrite.runtime.tf2.function_trial.FunctionTrial`), which hands
    its own to the watch after it.
    """

    def __call__(self, tensor_inputs, captured_inputs) -> Any: ...

    def before_call(self, concrete_function) -> Any: ...

    def after_call(self, concrete_function, start: Any) -> None: ...

    def skipped_since(self, start: Any) -> bool:
        """Whether the loss scale skipped a step since :meth:`before_call` returned ``start`` (a call on trial
        whose step skipped ran no optimizer update: its time is no step's)."""
        ...


def function_name(concrete_function) -> str:
    """The name of the traced function (its graph's): what reports and log lines call it."""
    return str(concrete_function.graph.name)


def called_name(concrete_function) -> str:
    """The name a call op built from ``concrete_function`` in another graph gives now (its body's)."""
    name = concrete_function.name
    return name.decode() if isinstance(name, bytes) else str(name)
