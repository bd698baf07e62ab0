"""The runtime as one value: what was asked for, what was chosen, and the rewrites' configuration.

:func:`amp_rewrite.runtime.enable` makes one :class:`Runtime` from the
settings (read from the environment once, or given); when TensorFlow is
imported the target is chosen for the machine; the rewrites' base
:class:`amp_rewrite.Config` is read once, at the first rewrite, from
TensorFlow's ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables. (Not
when TensorFlow is imported: asking TensorFlow for its devices then would
start its eager context before a TF1 script's
``tf.compat.v1.disable_eager_execution()``, which must come first.) The installers are
given this value and enter what they change in its ledger; the tracing hook
and the TF2 loss-scaling patches they install are kept on it, and so is what
the patches learn about TensorFlow's objects (its records). None of the
runtime's modules reaches back into the runtime package for its settings or
state. :func:`amp_rewrite.runtime.disable` undoes its ledger, forgets its records
and drops it.

This module sits above the parts it holds: it names the tracing hook's and
the loss scaling's types, and neither knows the Runtime. The hook is given
what it needs when made (:class:`~amp_rewrite.runtime.tf2.tracing.RuntimeInputs`:
the requested settings, :meth:`Runtime.rewrite_config`, the loss scaling).
The TF1 session patches, above this module, are given the value itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from amp_rewrite.config import Config
from amp_rewrite.runtime.job import Job
from amp_rewrite.runtime.ledger import Ledger
from amp_rewrite.runtime.records import ObjectRecords
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.target import TargetChoice

if TYPE_CHECKING:
    from amp_rewrite.runtime.loss_scale.tf2_state import TF2LossScaling
    from amp_rewrite.runtime.tf2.tracing import TracingHook


@dataclass
class Runtime:
    """The runtime while it is enabled.

    Attributes:
        requested: the settings it was enabled with (the target may be ``auto``).
        choice: the target chosen for this process and why; None until TensorFlow is imported.
        base_config: the rewrites' configuration, read at the first rewrite.
        ledger: every change it made to TensorFlow, Keras and the import system, with its undo.
        objects: what it knows about the sessions, graphs, functions, optimizers and
            Savers it met (:mod:`amp_rewrite.runtime.records`); nothing is set on them.
        tracing: its ``tf.function`` tracing hook, once installed.
        loss_scaling: what its TF2 loss-scaling patches share, once installed (float16, or when asked).
        session_trials: its TF1 session step trials (a
            :class:`~amp_rewrite.runtime.tf1.session.session_trial.SessionTrials`: their cache,
            timer and decisions), made by the first session that times its steps. Untyped here:
            the sessions sit above this module, which names none of their types.
        job: the multi-worker job this process is a worker of, once its workers agreed on a half
            precision (:mod:`amp_rewrite.runtime.multi_worker`); None outside one.
    """

    requested: RuntimeSettings
    choice: TargetChoice | None = None
    base_config: Config | None = None
    ledger: Ledger = field(default_factory=Ledger)
    objects: ObjectRecords = field(default_factory=ObjectRecords)
    tracing: TracingHook | None = None
    loss_scaling: TF2LossScaling | None = None
    session_trials: Any = None
    job: Job | None = None

    def choose(self, choice: TargetChoice) -> None:
        """Records the target chosen (again, when a multi-worker job decides otherwise)."""
        self.choice = choice
        self.base_config = None

    @property
    def target(self) -> str | None:
        """``float16`` or ``bfloat16`` once chosen; None before, and when scripts run float32."""
        return self.choice.target if self.choice is not None else None

    @property
    def settings(self) -> RuntimeSettings:
        """The settings, with the chosen target in place of ``auto`` once there is one."""
        target = self.target
        return self.requested if target is None else replace(self.requested, target=target)

    @property
    def target_reason(self) -> str:
        """Why the target is what it is, for the log."""
        return self.choice.reason if self.choice is not None else f"{self.requested.target} was requested"

    def rewrite_config(self, **fields) -> Config:
        """The base configuration, for the device type graphs run on here, with ``fields`` replaced."""
        if self.base_config is None:
            from amp_rewrite.graph.op_registry import default_device_type

            target = self.target
            if target is None:
                raise RuntimeError("the runtime has no half target: TensorFlow is not imported or scripts run float32")
            config = Config.from_env(device_type=default_device_type(runs_here=True), target=target,
                                     **self.requested.rewrite_fields())
            # strict mode promises the postconditions, however the settings were given
            self.base_config = replace(config, is_checking=config.is_checking or self.requested.is_strict)
        return replace(self.base_config, **fields)
