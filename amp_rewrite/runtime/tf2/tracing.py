"""``tf.function`` under the runtime: each traced ConcreteFunction runs its rewritten body.

TensorFlow calls every function in ``transform.CONCRETE_FUNCTION_CALLBACKS``
with each ConcreteFunction that tracing creates, before the function is cached
or called. The callback installed here rewrites the function
(:mod:`amp_rewrite.runtime.tf2.concrete`) and swaps the new function's state into
the traced object, so the ``tf.function`` cache holds, and every later call
runs, the rewritten body. Its inputs, outputs, captures and variables are the
traced ones.

A function is rewritten when the runtime is enabled (``ENABLE_AUTO_MP=1`` or
:func:`amp_rewrite.enable`), or when it was traced by
:func:`amp_rewrite.function`, which marks the graph it traces (in the
marked functions' hook's :attr:`TracingHook.marked`, not on the graph).

Guarantees:

- A GradientTape inside the function was traced into its graph, so forward
  and backward math are both rewritten. A tape *outside* it differentiates the
  rewritten graph; when that graph holds ``tf.custom_gradient`` ops, calls under
  a tape run the float32 function instead (logged), since custom gradient
  closures only know the traced graph.
- tf.data functions are left alone: they run on the host's CPU.
- Functions traced into a TF1 graph (eager execution off, or inside
  ``with tf.Graph().as_default()``) are left to the session that runs the
  graph, which rewrites them with it.
- XLA-compiled functions (``jit_compile=True``) stay float32 when the runtime
  chose its target (``auto``) for a CPU: XLA's CPU backend has no fast
  bfloat16 kernels (:func:`xla_keeps_float32`). A requested target, a GPU, or
  :func:`amp_rewrite.function` rewrites them as any other.
- If the rewrite or the reload fails, a warning gives the reason and the
  function stays as traced; the first eager call that fails in the rewritten
  function, but not in the traced one, does the same
  (:mod:`~amp_rewrite.runtime.tf2.first_call_guard`). With
  ``AMP_REWRITE_STRICT=1`` a :class:`RuntimeRewriteError` is raised instead.
- A function holding a loss-scaled optimizer step that is skipped with the
  scale at its floor of 1 runs its traced float32 body from the next call
  (:mod:`amp_rewrite.runtime.tf2.fallback`), with the same warning or error;
  so does a function that calls it in its graph (Keras 3's train function),
  through a float32 body of its own.
- :meth:`TracingHook.uninstall`, which the runtime's ledger calls on
  :func:`amp_rewrite.disable`, puts back every function it swapped (functions
  from :func:`amp_rewrite.function` keep theirs).

The hooks are :class:`TracingHook` values: the runtime's, held by its
:class:`~amp_rewrite.runtime.core.Runtime`, and one for marked functions.
TensorFlow's list of callbacks is the one record of which are installed
(:func:`installed_hooks`); this module keeps no state of its own.

The runtime's hook does not know the Runtime that holds it: it is made with
a :class:`RuntimeInputs` (the requested settings, a function returning the
rewrite configuration, and the TF2 loss scaling, made before it). The
Runtime names this module's types, so it sits above; this module sits above
the swap steps (:mod:`~amp_rewrite.runtime.tf2.swap_steps`), the first-call
guards (:mod:`~amp_rewrite.runtime.tf2.first_call_guard`), the fallback, and
the table of swaps they share (:mod:`~amp_rewrite.runtime.tf2.swap_records`),
none of which imports this module (the steps get what they use of the hook
in a :class:`~amp_rewrite.runtime.tf2.swap_steps.SwapTools`, the guards and
the fallback its table).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from amp_rewrite import tf_internals
from amp_rewrite.config import Config
from amp_rewrite.errors import NO_MESSAGE, RuntimeRewriteError, first_line
from amp_rewrite.runtime.ledger import LOCK, Ledger
from amp_rewrite.runtime.records import ObjectTable
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf2 import fallback as tf2_fallback
from amp_rewrite.runtime.tf2.calls import function_name
from amp_rewrite.runtime.tf2.first_call_guard import FirstCallGuards
from amp_rewrite.runtime.tf2.function_trials import FunctionTrials
from amp_rewrite.runtime.tf2.swap_records import FunctionReport, SwapRecord, SwapTable
from amp_rewrite.runtime.tf2.swap_steps import Swap, SwapTools, swap_in

if TYPE_CHECKING:
    from amp_rewrite.runtime.job import Job
    from amp_rewrite.runtime.loss_scale.tf2_state import TF2LossScaling

logger = logging.getLogger(__name__)

TF_DATA_ATTR = "_tf_data_function"
XLA_ON_CPU = ("XLA-compiled (jit_compile=True) on a CPU, and XLA's CPU backend has no fast bfloat16 kernels; "
              "without jit_compile, bfloat16 runs on oneDNN's kernels, faster than float32 on a CPU with "
              "AVX512_BF16 or AMX-BF16")
LEDGER_NAME = "tf.function"


@dataclass(frozen=True)
class RuntimeInputs:
    """What the runtime gives its tracing hook when it makes it; the hook knows no more of the runtime.

    Attributes:
        requested: the settings the runtime was enabled with (the target as asked: ``auto`` stays ``auto``).
        config: returns the runtime's rewrite configuration (read at its first call, for the target chosen).
        loss_scaling: the runtime's TF2 loss scaling, made before the hook; None when loss is not scaled.
        job: returns the multi-worker job this process is a worker of, once there is one; else None.
    """

    requested: RuntimeSettings
    config: Callable[[], Config]
    loss_scaling: TF2LossScaling | None = None
    job: Callable[[], Job | None] = lambda: None


class TracingHook:
    """TensorFlow's tracing callback, and what it swapped.

    Two kinds exist, each registered at most once in TensorFlow's list of
    callbacks (the one record of which hooks are installed):

    - the runtime's (``runtime`` given): rewrites every traced function,
      marked ones with their own configuration; made by :func:`install`,
      held as ``Runtime.tracing`` and removed by the runtime's ledger;
    - the marked functions' (no ``runtime``): made by
      :func:`install_for_marked` for :func:`amp_rewrite.function`, rewrites
      only graphs :func:`marked` traced, and only while no runtime hook is
      installed (that one does it then).

    Each swap runs as the named steps of :mod:`amp_rewrite.runtime.tf2.swap_steps`;
    the hook keeps their record here.

    Attributes:
        runtime: what the runtime gave its hook; None for marked functions only.
        is_strict: raise instead of running a function whose rewrite failed as traced
            (kept by its first-call guards, which read it when a first run fails).
        swapped: the ConcreteFunctions running rewritten now, with their records.
        history: a report of every swap this hook made, oldest first.
        profiles: a :class:`~amp_rewrite.runtime.profile.FunctionProfiles` with ``AMP_REWRITE_PROFILE``.
        fallback: what the loss-scale floor fallback keeps
            (:class:`~amp_rewrite.runtime.tf2.fallback.FloorFallback`, given the table ``swapped``).
        first_calls: its first-call guards
            (:class:`~amp_rewrite.runtime.tf2.first_call_guard.FirstCallGuards`, given the table ``swapped``).
        trials: with step timing on (the runtime's hook, unless ``AMP_REWRITE_TUNE=0``), its step trials
            (:class:`~amp_rewrite.runtime.tf2.function_trials.FunctionTrials`, given the table ``swapped``); else None.
        tools: what the swap steps use (:class:`~amp_rewrite.runtime.tf2.swap_steps.SwapTools`).
        marked: on the marked functions' hook, each graph :func:`marked` traced → its
            :class:`~amp_rewrite.Config` (the runtime's hook reads this table too).
    """

    def __init__(self, runtime: RuntimeInputs | None = None, *, is_strict: bool = False):
        self.runtime = runtime
        self.swapped = SwapTable()
        self.first_calls = FirstCallGuards(
            self.swapped, is_strict=runtime.requested.is_strict if runtime is not None else is_strict)
        self.history: list[FunctionReport] = []
        self.profiles: Any = None
        if runtime is not None and runtime.requested.profile_after is not None:
            from amp_rewrite.runtime.profile import FunctionProfiles

            self.profiles = FunctionProfiles(runtime.requested.profile_after)
        self.fallback = tf2_fallback.FloorFallback(self.loss_scaling, self.swapped, is_strict=self.is_strict)
        self.trials: FunctionTrials | None = None
        if runtime is not None and runtime.requested.is_timing_steps and tf_internals.usable(
                [tf_internals.STEP_TRIALS], "tf.function steps", is_strict=runtime.requested.is_strict,
                outcome="are not timed (the op lists decide)"):
            self.trials = FunctionTrials(self.swapped, config=self.default_config,
                                         cache_dir=runtime.requested.tune_cache_dir, job=runtime.job,
                                         is_measuring_again=runtime.requested.is_measuring_again)
        self.tools = SwapTools(self.loss_scaling, self.fallback, self.profiles, self.first_calls, self.trials)
        self.marked: ObjectTable[Config] = ObjectTable()

    # --- registration -----------------------------------------------------

    def register(self) -> None:
        callbacks = tf_internals.concrete_function_callbacks()
        if self.on_concrete_function not in callbacks:
            callbacks.append(self.on_concrete_function)

    def uninstall(self) -> None:
        """Stops rewriting new traces and puts back the functions the runtime swapped.

        Functions :func:`amp_rewrite.function` traced keep their rewritten
        bodies; their records go to the marked functions' hook.
        """
        with LOCK:
            callbacks = tf_internals.concrete_function_callbacks()
            while self.on_concrete_function in callbacks:
                callbacks.remove(self.on_concrete_function)
            marked_hook = _marked_hook()
            for cf, record in list(self.swapped.items()):
                if not record.report.is_explicit:
                    self.swapped.restore(cf)
                elif marked_hook is not None:
                    marked_hook.swapped[cf] = self.swapped.pop(cf)
            self.fallback.forget()
            if self.trials is not None:
                self.trials.forget()
            if self.profiles is not None:
                self.profiles.say_if_missed()

    # --- queries ----------------------------------------------------------

    @property
    def is_strict(self) -> bool:
        return self.first_calls.is_strict

    @is_strict.setter
    def is_strict(self, is_strict: bool) -> None:
        self.first_calls.is_strict = is_strict

    def default_config(self) -> Config:
        """The configuration for functions traced without one."""
        return self.runtime.config() if self.runtime is not None else _env_config()

    @property
    def loss_scaling(self) -> TF2LossScaling | None:
        """The runtime's TF2 loss scaling, or None (then nothing is guarded or watched)."""
        return self.runtime.loss_scaling if self.runtime is not None else None

    # --- the callback -----------------------------------------------------

    def on_concrete_function(self, concrete_function) -> None:
        """TensorFlow's callback: a ConcreteFunction was just traced."""
        config = _marked_config(concrete_function.graph)
        is_explicit = config is not None
        if self.runtime is None and (not is_explicit or _runtime_hook() is not None):
            return
        name = function_name(concrete_function)
        if TF_DATA_ATTR in concrete_function.function_def.attr:
            logger.debug("tf.function %s: a tf.data function, left in float32", name)
            return
        if not is_explicit and _traced_for_a_session():
            logger.debug("tf.function %s: traced into a TF1 graph, which the session running it rewrites whole", name)
            return
        config = config or self.default_config()
        if not is_explicit:
            reason = xla_keeps_float32(concrete_function.function_def, setting=self._setting(),
                                       device_type=config.device_type)
            if reason is not None:
                logger.info("amp-rewrite: tf.function %s runs in float32: %s", name, reason)
                return
            config = self._with_float32_callees_opaque(concrete_function, config)
        with LOCK:
            if concrete_function in self.swapped or self.fallback.fell_back_before(concrete_function, name):
                return
            calls_guarded = self.fallback.note_guarded_calls(concrete_function)
            trials = self.trials if not is_explicit else None
            verdict = trials.cached_verdict(concrete_function) if trials is not None else None
            was_mixed = trials is not None and verdict is not None and trials.was_mixed(concrete_function)
            if trials is not None and verdict is not None and not verdict.is_half and not was_mixed:
                prepare = self._prepare_recheck(concrete_function, config, calls_guarded=calls_guarded)
                trials.keep_float32(concrete_function, verdict, prepare)  # decided before: no rewrite, no trial
                return
            is_timed = trials is not None and verdict is None and not trials.is_deterministic()
            check = (trials.recheck_of(concrete_function, verdict)
                     if trials is not None and verdict is not None and not was_mixed and trials.is_rechecking()
                     else None)
            try:
                self._swap_in(concrete_function, config, is_explicit=is_explicit, calls_guarded=calls_guarded,
                              is_timed=is_timed, check=check)
            except Exception as exc:
                reason = first_line(exc, with_type=True, if_empty=NO_MESSAGE)
                if self.is_strict:
                    raise RuntimeRewriteError(f"tf.function {name}: rewrite failed: {reason}") from exc
                logger.warning("amp-rewrite: tf.function %s runs in float32: rewrite failed: %s", name, reason)
            if concrete_function not in self.swapped:
                self._watch_as_traced(concrete_function, calls_guarded=calls_guarded, is_timed=is_timed, check=check)
            elif trials is not None and verdict is None and not is_timed:
                trials.say_lists_decide(name)
            if was_mixed:
                assert trials is not None and verdict is not None
                trials.keep_mixed(concrete_function, verdict)  # decided before: the mixed body, no trial
            if self.profiles is not None and concrete_function not in self.swapped:
                self.profiles.watch_if_caller(concrete_function)

    def _watch_as_traced(self, concrete_function, *, calls_guarded: bool, is_timed: bool, check=None) -> None:
        """A function left as traced that calls rewritten bodies: the floor watch, or else a first-call guard.

        A timed one runs its step trial after its first call (before the watch);
        one decided from the cache its re-check's counter (``check``), around the watch.
        """
        then = self.fallback.floor_watch(concrete_function) if calls_guarded else None
        if check is not None and self.trials is not None and self.trials.is_caller(concrete_function):
            check.watch, then = then, check
        if is_timed and self.trials is not None:
            then = self.trials.for_caller(concrete_function, then, check=check)
        if calls_guarded:
            if then is not None:
                tf_internals.override_call(concrete_function, then)
            return
        guard = self.first_calls.for_caller(concrete_function, then)
        if guard is not None:
            tf_internals.override_call(concrete_function, guard)

    def _prepare_recheck(self, concrete_function, config: Config, *, calls_guarded: bool):
        """What a function the cache kept float32 (not rewritten) does at its first re-check: it is rewritten and
        watched as at its trace, from its traced state, its trial being the re-check's (``check``).

        Returns ``prepare(function, check)``: True when the re-check's trial is
        set going; False when there is no half body to try (it stays float32).
        """
        traced = tf_internals.concrete_function_state(concrete_function)

        def prepare(cf, check) -> bool:
            with LOCK:
                kept = tf_internals.concrete_function_state(cf)
                kept.pop("_call_flat", None)
                tf_internals.set_concrete_function_state(cf, traced)
                try:
                    self._swap_in(cf, config, is_explicit=False, calls_guarded=calls_guarded, is_timed=True,
                                  check=check)
                except Exception as exc:  # noqa: BLE001 - the cached verdict stands
                    logger.debug("amp-rewrite: tf.function %s is not checked again: rewrite failed: %s", check.name,
                                 first_line(exc, with_type=True, if_empty=NO_MESSAGE))
                if cf not in self.swapped:
                    self._watch_as_traced(cf, calls_guarded=calls_guarded, is_timed=True, check=check)
                if check.states is None:
                    tf_internals.set_concrete_function_state(cf, kept)
                    return False
                return True

        return prepare

    def _setting(self) -> str | None:
        """The target the runtime was asked for (``auto``, ``float16``, ``bfloat16``); None for marked functions."""
        return self.runtime.requested.target if self.runtime is not None else None

    def _with_float32_callees_opaque(self, concrete_function, config: Config) -> Config:
        """``config`` leaving alone the functions the function calls that must stay float32.

        Those are XLA-compiled functions on a CPU, and the traced bodies of
        functions that fell back because no loss scale helped (Keras 3's train
        function, traced again, calls such a one-step function).
        """
        setting = self._setting()
        opaque = []
        for name, function in sorted(tf_internals.graph_functions(concrete_function.graph).items()):
            reason = xla_keeps_float32(function.definition, setting=setting, device_type=config.device_type)
            if reason is None and self.fallback.fell_back.has_body(name):
                reason = tf2_fallback.FELL_BACK
            if reason is not None:
                opaque.append((name, reason))
        return replace(config, opaque_functions=tuple(opaque)) if opaque else config

    # --- swapping ---------------------------------------------------------

    def _swap_in(self, concrete_function, config: Config, *, is_explicit: bool, calls_guarded: bool = False,
                 is_timed: bool = False, check=None) -> None:
        """Runs the swap steps (:func:`~amp_rewrite.runtime.tf2.swap_steps.swap_in`) and keeps their record."""
        swap = Swap(concrete_function, function_name(concrete_function), config,
                    is_explicit=is_explicit, calls_guarded=calls_guarded, is_timed=is_timed, check=check)
        record = swap_in(self.tools, swap)
        if record is None:
            return
        self.swapped[concrete_function] = record
        self.history.append(record.report)


# --- installing, and the process's hooks ---------------------------------------


def install(runtime: RuntimeInputs, ledger: Ledger) -> TracingHook | None:
    """Rewrites every ConcreteFunction traced from now on with ``runtime``'s configuration (the runtime's switch).

    With the settings' ``profile_after``, one eager call after that many
    calls of a rewritten function is profiled (:mod:`amp_rewrite.runtime.profile`).

    When this TensorFlow lacks an internal the hook needs, nothing is
    installed and None returned: a warning names it (strict mode raises
    instead). Otherwise the runtime's ``ledger`` records the hook's
    :meth:`TracingHook.uninstall` as the way back.
    """
    with LOCK:
        if not _has_tracing_internals(is_strict=runtime.requested.is_strict):
            return None
        hook = TracingHook(runtime)
        hook.register()
        ledger.record(LEDGER_NAME, "transform.CONCRETE_FUNCTION_CALLBACKS and the functions it swaps",
                      hook.uninstall)
        return hook


def install_for_marked(*, is_strict: bool) -> TracingHook | None:
    """Makes a hook rewrite graphs :func:`marked` traced, whatever the runtime does; returns it.

    Args:
        is_strict: raise instead of running a function whose rewrite failed
            as traced (the runtime's own setting wins while it is on).

    Returns None (after a warning) when this TensorFlow lacks an internal the hook needs.
    """
    with LOCK:
        if not _has_tracing_internals(is_strict=is_strict):
            return None
        hook = _marked_hook()
        if hook is None:
            hook = TracingHook(is_strict=is_strict)
            hook.register()
        hook.is_strict = hook.is_strict or is_strict
        return hook


def installed_hooks() -> list[TracingHook]:
    """The hooks in TensorFlow's list of tracing callbacks, in the order TensorFlow calls them."""
    if "tensorflow" not in sys.modules:
        return []
    try:
        callbacks = tf_internals.concrete_function_callbacks()
    except (ImportError, AttributeError):  # a TensorFlow without the list has no hook
        return []
    return [callback.__self__ for callback in callbacks
            if isinstance(getattr(callback, "__self__", None), TracingHook)]


def _traced_for_a_session() -> bool:
    """Whether the function just traced is for a TF1 graph (eager execution off, or a ``Graph`` being built).

    A patched ``Session`` rewrites that graph with its whole function library
    and tries each step against a float32 copy calling the functions as
    traced (:mod:`~amp_rewrite.runtime.tf1.session.float32_copy`): a body
    swapped in here would be half in both.
    """
    import tensorflow as tf

    return not tf.compat.v1.executing_eagerly_outside_functions()


def _runtime_hook() -> TracingHook | None:
    return next((hook for hook in installed_hooks() if hook.runtime is not None), None)


def _marked_hook() -> TracingHook | None:
    return next((hook for hook in installed_hooks() if hook.runtime is None), None)


def _has_tracing_internals(*, is_strict: bool) -> bool:
    """Whether this TensorFlow has the tracing internals the hook needs (a warning, or strict's error, if not)."""
    return tf_internals.usable([tf_internals.TRACING], "tf.function traces", is_strict=is_strict)


def marked(python_function, config: Config | None, hook: TracingHook):
    """``python_function``, marking the graph that traces it, in ``hook``, for a rewrite with ``config``."""

    @functools.wraps(python_function)
    def traced(*args, **kwargs):
        import tensorflow as tf

        graph = tf.compat.v1.get_default_graph()
        if getattr(graph, "building_function", False):
            hook.marked[graph] = config if config is not None else default_config()
        return python_function(*args, **kwargs)

    return traced


def _marked_config(graph) -> Config | None:
    """The configuration :func:`marked` traced ``graph`` with; None for a graph it did not trace."""
    hook = _marked_hook()
    return hook.marked.get(graph) if hook is not None else None


def rewritten_functions() -> list[FunctionReport]:
    """A report of every swap the installed hooks made, oldest first within each hook."""
    with LOCK:
        return [report for hook in installed_hooks() for report in hook.history]


def step_decisions() -> list[tuple[str, bool, str]]:
    """What the runtime's step trials decided, oldest first: ``(function name, runs in half, why)``.

    ``why`` is the INFO line's reason (both times, on which device; whether
    an earlier run measured them). Empty when no step was tried.
    """
    hook = _runtime_hook()
    if hook is None or hook.trials is None:
        return []
    with LOCK:
        return [(name, verdict.is_half, verdict.reason(hook.trials.target, hook.trials.device_type))
                for name, verdict, _ in hook.trials.decisions]


def steps_on_trial() -> list[str]:
    """The steps whose trial has not ended yet, by name: the pure bodies', the profiles, a mixed body's or a re-check.

    A step's trial ends with its verdict kept (or its body changed by a
    fallback); until then some of its calls time, profile or confirm a body,
    so a tool that times steady-state calls waits for this to be empty. A
    trial no call has reached is left out: a function called only from
    another one's graph (Keras's ``one_step_on_data`` inside
    ``multi_step_on_iterator``) is decided with its caller, never alone.
    """
    hook = _runtime_hook()
    if hook is None or hook.trials is None:
        return []
    with LOCK:
        return sorted(trial.name for trial in list(hook.trials.trials) if not trial.is_over and trial.trial.calls)


def swapped() -> list[tuple[object, FunctionReport]]:
    """The ConcreteFunctions running rewritten now, each with its report."""
    with LOCK:
        return [(cf, record.report) for hook in installed_hooks() for cf, record in hook.swapped.items()]


def record_of(concrete_function) -> SwapRecord | None:
    """The swap record of ``concrete_function``, or None when it runs as traced."""
    return next((record for hook in installed_hooks()
                 if (record := hook.swapped.record_of(concrete_function)) is not None), None)


def restore(concrete_function) -> None:
    """Puts the traced state back into ``concrete_function``."""
    for hook in installed_hooks():
        hook.swapped.restore(concrete_function)


def default_config() -> Config:
    """The runtime's configuration while it rewrites; else the environment's, for float16.

    Either is for the device type functions will run on. The runtime's was
    read once, at its first rewrite, with its keep-float32 patterns and
    tuning switches.
    """
    hook = _runtime_hook()
    return hook.default_config() if hook is not None else _env_config()


def _env_config() -> Config:
    from amp_rewrite.graph.op_registry import default_device_type

    return Config.from_env(device_type=default_device_type(runs_here=True), target="float16")


def xla_keeps_float32(function_def, *, setting: str | None, device_type: str | None) -> str | None:
    """Why an XLA-compiled function stays float32 under the runtime, or None when it is rewritten.

    Only when the target was chosen for the machine (``setting`` is
    ``auto``) and the function runs on a CPU: a requested target is what
    the user asked for, and on a GPU XLA has fast half kernels.
    """
    if not tf_internals.is_xla_compiled(function_def):
        return None
    return XLA_ON_CPU if setting == "auto" and device_type == "CPU" else None
