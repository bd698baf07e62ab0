"""The ``ENABLE_AUTO_MP`` runtime: unmodified TF1 scripts train in mixed precision.

:func:`enable` patches, once TensorFlow is imported (at once if it already is):

- ``MultiWorkerMirroredStrategy``'s constructor, so that the workers of a
  job run one decision (:mod:`amp_rewrite.runtime.multi_worker`), whatever
  this machine chose;
- nothing else when the target chosen for the machine is float32
  (:mod:`amp_rewrite.runtime.target`): one INFO line says why;
- ``Session`` (every ``BaseSession``: plain, interactive, and those that
  ``MonitoredTrainingSession`` creates) to run the rewritten graph
  (:mod:`amp_rewrite.runtime.tf1.session` runs the steps and falls back;
  :mod:`amp_rewrite.runtime.tf1.shadow_graph` builds and grows that graph);
- ``tf.compat.v1.train.Optimizer.compute_gradients``/``apply_gradients`` for
  dynamic loss scaling (:mod:`amp_rewrite.runtime.loss_scale.tf1_optimizer`), for float16
  only unless ``AMP_LOSS_SCALE`` (or non-default loss-scale settings) asks;
- ``Saver.restore`` so float32 checkpoints restore (:mod:`amp_rewrite.runtime.tf1.checkpoint`);
- ``MixedPrecisionLossScaleOptimizer`` so an optimizer it wraps is not scaled twice;
- ``tf.function`` tracing, so each new ConcreteFunction runs its rewritten body
  (:mod:`amp_rewrite.runtime.tf2.tracing`);
- ``GradientTape.gradient`` and Keras optimizers' apply, for dynamic loss
  scaling of TF2 loops and ``fit`` (:mod:`amp_rewrite.runtime.loss_scale.tf2_install`).

Each change is entered in the ledger of the one :class:`~amp_rewrite.runtime.core.Runtime`
value :func:`enable` makes (:mod:`amp_rewrite.runtime.ledger`) as it is made;
:func:`disable` undoes the ledger's entries, newest first, so every patched
attribute is the original object again, and drops the value. Both are
idempotent.
Importing this module patches nothing and does not import TensorFlow.

The package, top layer first (a module imports only from its own layer and
those below):

- this module, the runtime's face;
- :mod:`~amp_rewrite.runtime.tf1`, the TF1 sessions (given the runtime's
  value itself), and :mod:`~amp_rewrite.runtime.multi_worker`, with the
  rounds its job answers together (:mod:`~amp_rewrite.runtime.job`);
- :mod:`~amp_rewrite.runtime.core`, the :class:`Runtime` value, which holds
  the TF2 tracing hook and loss scaling;
- :mod:`~amp_rewrite.runtime.tf2`, traced ``tf.function`` bodies rewritten;
- :mod:`~amp_rewrite.runtime.loss_scale`, dynamic loss scaling for TF1 and TF2;
- what they share: :mod:`~amp_rewrite.runtime.settings` (read once, frozen),
  :mod:`~amp_rewrite.runtime.target`, :mod:`~amp_rewrite.runtime.ledger`,
  :mod:`~amp_rewrite.runtime.records`, :mod:`~amp_rewrite.runtime.profile`
  (``AMP_REWRITE_PROFILE``) and :mod:`~amp_rewrite.runtime.overflow_probe`
  (``AMP_REWRITE_FIND_OVERFLOW``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import _amp_rewrite_import_hook as import_hook
from amp_rewrite import tf_internals
from amp_rewrite.runtime import multi_worker
from amp_rewrite.runtime.core import Runtime
from amp_rewrite.runtime.ledger import LOCK, Entry, bound
from amp_rewrite.runtime.records import ObjectRecords
from amp_rewrite.runtime.settings import RuntimeSettings, scales_loss
from amp_rewrite.runtime.target import TargetChoice, choose_target

if TYPE_CHECKING:
    from amp_rewrite.runtime.job import Job
    from amp_rewrite.runtime.loss_scale.tf2_state import TF2LossScaling

logger = logging.getLogger(__name__)

__all__ = ["Runtime", "RuntimeSettings", "TargetChoice", "current_runtime", "current_settings", "current_target",
           "disable", "enable", "installed_changes", "is_enabled", "loss_scaling", "scales_loss",
           "session_step_decisions", "target_choice"]


# Names of the runtime's entries in the ledger.
SESSION = "session"
TF1_LOSS_SCALING = "tf1 loss scaling"


# The runtime while it is enabled, else None: the one place its state lives.
_ACTIVE: Runtime | None = None


def enable(*, settings: RuntimeSettings | None = None, from_env: bool = False,
           target: str | None = None) -> None:
    """Turns the runtime on; patches apply when TensorFlow is imported.

    Args:
        settings: the runtime settings; by default read from the ``AMP_*`` variables.
        from_env: called by the start-up hook; also makes the runtime's log
            lines visible on stderr when the script configured no logging.
        target: ``auto``, ``float16`` or ``bfloat16``; overrides the settings' target.

    Calling it again changes nothing (new settings apply to the next enable
    after :func:`disable`).
    """
    global _ACTIVE
    with LOCK:
        if _ACTIVE is not None:
            return
        settings = settings if settings is not None else RuntimeSettings.from_env()
        settings = settings if target is None else replace(settings, target=target)
        active = _ACTIVE = Runtime(settings)
        if from_env:
            _show_runtime_logs()
    import_hook.after_import(lambda module: _apply_patches(active), owner=import_hook.RUNTIME,
                             is_strict=lambda: settings.is_strict)


def disable() -> None:
    """Turns the runtime off: removes a pending import hook and restores TensorFlow's methods.

    Sessions that already ran a rewritten graph must be closed first.
    """
    global _ACTIVE
    with LOCK:
        for owner in (import_hook.STARTUP, import_hook.RUNTIME):
            import_hook.remove(owner=owner)
        active, _ACTIVE = _ACTIVE, None
        if active is not None:
            active.ledger.uninstall_all()
            active.objects.clear()


def is_enabled() -> bool:
    """Whether TensorFlow is currently patched to rewrite (the multi-worker agreement alone does not count)."""
    return any(entry.name != multi_worker.LEDGER_NAME for entry in installed_changes())


def installed_changes(name: str | None = None) -> list[Entry]:
    """The changes the runtime made and has not undone, oldest first; only those of ``name`` when given."""
    active = _ACTIVE
    return active.ledger.installed(name) if active is not None else []


def current_runtime() -> Runtime | None:
    """The :class:`Runtime` value while the runtime is enabled (its settings, choice, ledger, records); else None."""
    return _ACTIVE


def session_step_decisions() -> list[tuple[str, bool, str]]:
    """What the TF1 session step trials decided, oldest first: ``(step, runs in half, why)``.

    ``step`` names what the step fetches (``(fetches train_op, loss)``),
    ``why`` is the INFO line's reason. The parallel of
    :func:`amp_rewrite.runtime.tf2.tracing.step_decisions` for
    ``tf.function``; empty while the runtime is off or no step was decided.
    """
    from amp_rewrite.runtime.tf1.session.session_trial import step_decisions

    return step_decisions(_ACTIVE)


def target_choice() -> TargetChoice | None:
    """The target chosen for this process and why; None until TensorFlow is patched."""
    return _ACTIVE.choice if _ACTIVE is not None else None


def current_settings() -> RuntimeSettings | None:
    """The settings the runtime was enabled with; None while it is off."""
    return _ACTIVE.requested if _ACTIVE is not None else None


def loss_scaling() -> TF2LossScaling | None:
    """What the TF2 loss-scaling patches share (settings, state) while they are installed; else None."""
    active = _ACTIVE
    return active.loss_scaling if active is not None else None


def current_target() -> str | None:
    """``"float16"`` or ``"bfloat16"`` while the runtime rewrites; None when scripts run float32."""
    return _ACTIVE.target if _ACTIVE is not None and is_enabled() else None


def _apply_patches(active: Runtime) -> None:
    """Chooses the target and gives ``active`` to every installer (once TensorFlow is imported)."""
    with LOCK:
        if active is not _ACTIVE or active.choice is not None:
            return  # disabled meanwhile, or patched already
        choice = choose_target(active.requested.target)
        active.choose(choice)
        # Installed whatever this machine chose: under a multi-worker strategy the job's decision may differ.
        multi_worker.install(active.ledger, active.requested, choice,
                             lambda choice, settings: _follow_job(active, choice, settings),
                             joined=lambda job: _join_job(active, job))
        if active.target is None:
            logger.info("amp-rewrite: scripts run in float32: %s", active.target_reason)
            return
        _install(active)
    logger.debug("amp-rewrite: rewriting to %s: %s", active.target, active.target_reason)
    logger.debug("patched TensorFlow %s", getattr(sys.modules.get("tensorflow"), "__version__", "?"))


def _install(active: Runtime) -> None:
    """Patches TensorFlow for ``active``'s target (a half type); everything is undone if one patch fails."""
    settings = active.settings
    _note_untested_tensorflow()
    try:
        if tf_internals.usable(_tf1_capabilities(settings), "TF1 sessions", is_strict=settings.is_strict):
            for name, owner, attr, replacement in _patch_table(active):
                active.ledger.install(name, owner, attr, replacement)
        if tf_internals.usable(_tf2_capabilities(settings), "tf.function traces", is_strict=settings.is_strict):
            _install_tf2_patches(active)
    except Exception:
        disable()
        raise


def _follow_job(active: Runtime, choice: TargetChoice, settings: RuntimeSettings) -> None:
    """Runs a multi-worker job's decision instead of this machine's: ``choice`` (None: float32), ``settings``."""
    with LOCK:
        active.ledger.uninstall_all(keep=multi_worker.LEDGER_NAME)
        active.requested = settings
        active.choose(choice)
        if choice.target is not None:
            _install(active)


def _join_job(active: Runtime, job: Job) -> None:
    """This process is a worker of a multi-worker job running half: its collective steps decide with the others."""
    with LOCK:
        active.job = job


def _tf1_capabilities(settings: RuntimeSettings) -> list[tf_internals.Capability]:
    """What the TF1 patches need of TensorFlow's internals."""
    return [tf_internals.SESSIONS] + ([tf_internals.TF1_LOSS_SCALING] if scales_loss(settings) else [])


def _tf2_capabilities(settings: RuntimeSettings) -> list[tf_internals.Capability]:
    """What TF2 needs beyond the tracing hook's own (which :func:`~amp_rewrite.runtime.tf2.tracing.install` checks)."""
    return [tf_internals.TF2_LOSS_SCALING] if scales_loss(settings) else []


def _note_untested_tensorflow() -> None:
    import tensorflow as tf

    sentence = tf_internals.untested_version(tf.__version__)
    if sentence is not None:
        logger.info("amp-rewrite: %s", sentence)


def _patch_table(active: Runtime):
    import tensorflow as tf

    from amp_rewrite.runtime.loss_scale import tf1_optimizer
    from amp_rewrite.runtime.tf1 import checkpoint, session

    base = tf_internals.base_session_class()
    settings = active.settings
    scaling = tf1_optimizer.TF1LossScaling(settings.loss_scale, active.objects)
    table: list[tuple[str, Any, str, Callable[..., Any]]] = [
        (SESSION, base, "__init__", bound(session.patched_init, active)),
        (SESSION, base, "run", bound(session.patched_run, active)),
        (SESSION, base, "make_callable", bound(session.patched_make_callable, active)),
        (SESSION, base, "_make_callable_from_options",
         bound(session.patched_make_callable_from_options, active)),
        (SESSION, base, "partial_run_setup", bound(session.patched_partial_run_setup, active)),
        (SESSION, base, "partial_run", bound(session.patched_partial_run, active)),
        (SESSION, base, "close", bound(session.patched_close, active)),
    ]
    if scales_loss(settings):
        table += [
            (TF1_LOSS_SCALING, tf.compat.v1.train.Optimizer, "compute_gradients",
             bound(tf1_optimizer.scaled_compute_gradients, scaling)),
            (TF1_LOSS_SCALING, tf.compat.v1.train.Optimizer, "apply_gradients",
             bound(tf1_optimizer.guarded_apply_gradients, scaling)),
            (TF1_LOSS_SCALING, tf.compat.v1.train.Saver, "restore",
             bound(checkpoint.tolerant_restore, active.objects)),
            (TF1_LOSS_SCALING, tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer, "__init__",
             bound(_init_wrapper, active.objects)),
        ]
    return table


def _install_tf2_patches(active: Runtime) -> None:
    """``tf.function`` traces run rewritten; the tape and Keras optimizers scale the loss.

    The loss scaling is made first, for the tracing hook is given it; its
    patches go in after the hook, which they turn off if Keras lacks a part
    the guarded apply needs.
    """
    from amp_rewrite.runtime.loss_scale import tf2_install
    from amp_rewrite.runtime.tf2 import tracing

    scaling = tf2_install.TF2LossScaling(active.settings, active.objects) if scales_loss(active.settings) else None
    active.tracing = tracing.install(tracing.RuntimeInputs(active.requested, active.rewrite_config, scaling,
                                                           job=lambda: active.job),
                                         active.ledger)
    if active.tracing is not None:
        active.ledger.record(tracing.LEDGER_NAME, "the runtime's tracing hook", lambda: _forget_tracing(active))
    if scaling is not None:
        stop_tracing = active.tracing.uninstall if active.tracing is not None else lambda: None
        tf2_install.install(scaling, active.ledger, stop_tracing=stop_tracing)
        active.loss_scaling = scaling
        active.ledger.record(tf2_install.LEDGER_NAME, "the runtime's loss scaling",
                             lambda: _forget_loss_scaling(active))


def _forget_tracing(active: Runtime) -> None:
    active.tracing = None


def _forget_loss_scaling(active: Runtime) -> None:
    active.loss_scaling = None


def _init_wrapper(original, records: ObjectRecords, wrapper, opt, *args, **kwargs):
    """``MixedPrecisionLossScaleOptimizer(opt)``: ``opt``'s loss scaling is the wrapper's."""
    records.scaled_elsewhere.add(opt)
    return original(wrapper, opt, *args, **kwargs)


class _RuntimeRecords(logging.Filter):
    """Lets through the runtime's own lines and every warning of the package."""

    def filter(self, record):
        return record.levelno >= logging.WARNING or record.name.startswith(__name__)


def _show_runtime_logs() -> None:
    package = logging.getLogger("amp_rewrite")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_RuntimeRecords())
    package.addHandler(handler)
    # A root handler installed later (absl's, which app.run adds) would print
    # every line a second time.
    package.propagate = False
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)
