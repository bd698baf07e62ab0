"""A TF1 session step keeps half only where its real runs were faster in half here.

The schedule and the verdict are :mod:`amp_rewrite.tune.trial`' (the same as
for a ``tf.function``, :mod:`amp_rewrite.runtime.tf2.function_trial`); this
module runs them on ``Session.run`` steps. Each :class:`PlanKey` whose plan
runs half ops gets a :class:`SessionTrial`: its first runs alternate the
rewritten plan and a float32 plan of the same step, each timed around the
shadow session's ``run``; after :data:`~amp_rewrite.tune.trial.CALLS` runs
the winner becomes the key's plan for good, and one INFO line says which and
why (``amp-rewrite: session step (fetches Adam, loss) runs in bfloat16: the
step ran 8.0 ms in bfloat16 and 16.2 ms in float32 on this CPU (2.02x)``,
for an MLP of 512, 1024, 1024 and 10 units trained with Adam on batches of 256).

The float32 variant lives in the same shadow graph, beside the rewritten
one (:mod:`~amp_rewrite.runtime.tf1.session.float32_copy`): the script
graph's ops the step's fetches depend on, imported once more as the script
built them, over the shadow's own variables and resources, calling the
script's functions (control flow v2 included) and without loss scaling.
Both variants therefore train the same variables in the same session:
every run of the trial is a real training step, whichever variant ran it,
and a float32 verdict runs exactly the script's float32 computation on the
variables the rewritten steps trained. (Copying values between two
sessions instead would cost a copy of every variable at every switch, and a
second session's memory.)

Every step that runs half ops is tried, but two, which keep the rewritten
plan with an INFO line saying why:

- the step runs collective ops (a distributed step): its workers would
  have to decide together, and a graph-mode job has no coordination
  service to decide through (:mod:`amp_rewrite.runtime.job`); each worker
  timing its own trial could keep another variant than its peers, whose
  collectives would wait for each other forever;
- the step fetches the overflow probe (``AMP_REWRITE_FIND_OVERFLOW=1``):
  its half ops run, so that the probe can name the one that overflows.

A step whose float32 copy cannot share the shadow's state
(:class:`~amp_rewrite.runtime.tf1.session.float32_copy.NoTrial`) says so too.

The two best times go into the tuning cache under the step's key
(:func:`~amp_rewrite.tune.keys.session_step_key`: the script graph's ops
the fetches depend on, what is fetched and fed, the target and the
rewrite's settings), so the same script run again decides each step when
its plan is made, measuring nothing; a verdict whose trial's halves
disagreed is not cached. A step decided from the cache is checked again
every :data:`~amp_rewrite.tune.trial.RECHECK_EVERY` runs (a
:class:`SessionTrial` of five runs, made by :meth:`SessionTrials.plan` and
started by the keeper), and a clear disagreement switches its plan and
updates the cache. Under op determinism nothing is timed: the cache or the
lists decide. A failed run of either variant falls back as any failed run does
(:meth:`~amp_rewrite.runtime.tf1.session.keeper.ShadowKeeper.run_failed`);
a new shadow (the graph grew, or a fallback) starts without trials.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.config import Config
from amp_rewrite.graph.facts import called_functions, node_name
from amp_rewrite.runtime.job import first_collective
from amp_rewrite.runtime.loss_scale.step_writes import ancestors
from amp_rewrite.runtime.tf1.session.float32_copy import NoTrial, float32_plan
from amp_rewrite.runtime.tf1.session.plans import PlanKey, RunPlan
from amp_rewrite.tune import keys
from amp_rewrite.tune.cache import TuneCache
from amp_rewrite.tune.trial import (
    FLOAT32,
    HALF,
    RECHECK_EVERY,
    StepVerdict,
    Timer,
    TrialSchedule,
    recheck,
    rechecked,
    switch_line,
    time_call,
    verdict_of,
)

# One logger for the whole package: its lines keep the name they have always had.
logger = logging.getLogger(__package__)


@dataclass
class SessionTrial:
    """One step on trial: its two plans, the schedule and times, and its cache key.

    Attributes:
        plans: ``half`` (the rewritten plan) and ``float32`` (the plan of its float32 copy; a re-check of a
            half verdict makes it when it starts, :meth:`SessionTrials.recheck_plans`).
        key: the step's cache key (:func:`~amp_rewrite.tune.keys.session_step_key`).
        name: the step, in words, for the INFO line.
        trial: the schedule, times and verdict.
        lock: held by each run of the step while it is on trial, so that runs from several threads
            follow the schedule one at a time, each timed alone (runs after the verdict never take it).
        cached: the cached verdict this trial checks again (:func:`~amp_rewrite.tune.trial.recheck`'s
            schedule); None: a trial of its own.
        plan_key: the call the plans were made for (a re-check's float32 plan is made from it).
    """

    plans: dict[str, RunPlan]
    key: str
    name: str
    trial: TrialSchedule = field(default_factory=TrialSchedule)
    lock: Any = field(default_factory=threading.RLock, repr=False, compare=False)
    cached: StepVerdict | None = None
    plan_key: PlanKey | None = None

    @property
    def chosen(self) -> RunPlan:
        """The plan the cached verdict runs (a re-check's)."""
        assert self.cached is not None
        return self.plans[HALF if self.cached.is_half else FLOAT32]


class SessionTrials:
    """The runtime's session step trials: which steps get one, the cache, the lines, the decisions.

    Attributes:
        target: the half type the rewrites compute in.
        device_type: the device type the steps run on (``CPU``, ``GPU``).
        cache_dir: where the tuning cache lives (None: the user's cache directory).
        timer: runs one step of a variant and times it (:data:`~amp_rewrite.tune.trial.Timer`; tests give their own).
        decisions: each step decided in this process, oldest first: its name and verdict (a re-check that
            switched a step adds its new verdict).
        config: the runtime's rewrite configuration, whose settings the keys hold
            (:func:`~amp_rewrite.tune.keys.rewrite_settings`); None: none.
        is_measuring_again: the cache is not read: every step is tried, and its verdict replaces the cached one.
    """

    def __init__(self, *, target: str, device_type: str, cache_dir: str | None = None,
                 timer: Timer | None = None, config: Config | None = None, is_measuring_again: bool = False):
        self.target = target
        self.device_type = device_type or "CPU"
        self.cache_dir = cache_dir
        self.config = config
        self.is_measuring_again = is_measuring_again
        self._settings: str | None = None
        self.timer: Timer = timer or time_call
        self.decisions: list[tuple[str, StepVerdict]] = []
        self._cache: TuneCache | None = None
        self._said: set[str] = set()

    @property
    def settings(self) -> str:
        """How the runtime rewrites, as the keys hold it (made at first use)."""
        if self._settings is None:
            self._settings = keys.rewrite_settings(self.config) if self.config is not None else ""
        return self._settings

    @property
    def cache(self) -> TuneCache:
        """The tuning cache of this device and TensorFlow (made at first use; the file the TF2 trials use)."""
        if self._cache is None:
            from amp_rewrite.tune.cache import cache_here

            self._cache = cache_here(self.cache_dir, self.device_type)
        return self._cache

    def plan(self, script_graph, shadow_graph, key: PlanKey, half: RunPlan) -> tuple[RunPlan, SessionTrial | None]:
        """The plan a new step runs, and its trial when it gets one.

        A step without half ops runs ``half`` (its rewritten plan) untried; a
        step the cache has times for runs the plan they chose, with its
        re-check (a trial whose ``cached`` is that verdict, for the keeper to
        start later; none under op determinism); a step that cannot be tried
        (:class:`~amp_rewrite.runtime.tf1.session.float32_copy.NoTrial`)
        keeps ``half``, with an INFO line saying why; under op determinism, a
        step the cache does not know keeps ``half``, with an INFO line.
        Otherwise ``half`` runs first, on trial.
        """
        if not runs_half(half):
            return half, None
        name = step_name(key)
        collective = collective_op(script_graph, key)
        if collective is not None:
            if name not in self._said:
                self._said.add(name)
                logger.info("amp-rewrite: session step %s is not timed and runs in %s as the op lists say: it "
                            "runs %s %r, and the workers of a graph-mode job have no coordination service to "
                            "decide through together", name, self.target, collective.type, collective.name)
            return half, None
        try:
            why_not = why_no_trial(script_graph, shadow_graph, key, half)
            if why_not:
                raise NoTrial(why_not)
            step_key = self.key_of(script_graph, key)
            timing = None if self.is_measuring_again else self.cache.get(step_key)
            is_deterministic = tf_internals.is_op_determinism_enabled()
            if timing is not None:
                verdict = verdict_of(timing, is_cached=True, source=str(self.cache.path))
                plans = {HALF: half} if verdict.is_half else {
                    HALF: half, FLOAT32: float32_plan(script_graph, shadow_graph, key, half)}
                self.say(name, step_key, verdict, note="; op determinism is on, so it is not checked again"
                         if is_deterministic else "")
                check = None if is_deterministic else SessionTrial(plans, step_key, name, recheck(verdict),
                                                                   cached=verdict, plan_key=key)
                return plans[HALF if verdict.is_half else FLOAT32], check
            if is_deterministic:
                self.say_lists_decide(name, step_key)
                return half, None
            trial = SessionTrial({HALF: half, FLOAT32: float32_plan(script_graph, shadow_graph, key, half)},
                                 step_key, name)
        except NoTrial as exc:
            self.say_untried(name, str(exc))
            return half, None
        return half, trial

    def settle(self, trial: SessionTrial, verdict: StepVerdict) -> RunPlan:
        """The plan the verdict keeps; its times go into the cache where it is clear, and the line is said."""
        if verdict.is_clear:
            self.cache.put(trial.key, replace(verdict.timing(), what=f"session step {trial.name}, {self.target}"))
            self.cache.save()
        elif self.is_measuring_again:
            self.cache.discard(trial.key)  # measured again and not clear: the old verdict is not kept either
            self.cache.save()
        self.say(trial.name, trial.key, verdict)
        return trial.plans[HALF if verdict.is_half else FLOAT32]

    def recheck_plans(self, script_graph, shadow_graph, trial: SessionTrial) -> None:
        """Makes the plan a re-check needs that its cached verdict did not: the float32 copy of a step run half."""
        if FLOAT32 not in trial.plans:
            assert trial.plan_key is not None
            trial.plans[FLOAT32] = float32_plan(script_graph, shadow_graph, trial.plan_key, trial.plans[HALF])

    def settle_recheck(self, trial: SessionTrial) -> SessionTrial:
        """After a re-check: the next re-check, whose ``cached`` verdict (and ``chosen`` plan) the step runs by now.

        A clear disagreement switches the step: the new times go into the
        cache, and one INFO line says so.
        """
        assert trial.cached is not None
        verdict = trial.cached
        found = rechecked(verdict, trial.trial)
        if found is None:
            logger.debug("amp-rewrite: session step %s checked again after %d runs: the cached verdict stands",
                         trial.name, RECHECK_EVERY)
        else:
            self.cache.put(trial.key, replace(found.timing(), what=f"session step {trial.name}, {self.target}"))
            self.cache.save()
            self.decisions.append((trial.name, found))
            logger.info("amp-rewrite: session step %s %s", trial.name,
                        switch_line(verdict, found, self.target, self.device_type, calls=RECHECK_EVERY))
            verdict = replace(found, is_cached=True, source=str(self.cache.path))
        return SessionTrial(trial.plans, trial.key, trial.name, recheck(verdict), cached=verdict,
                            plan_key=trial.plan_key)

    def key_of(self, script_graph, key: PlanKey) -> str:
        """The step's cache key: the ops its fetches depend on, what it fetches and feeds, the target."""
        elements = [script_graph.as_graph_element(name) for name in key.fetches]
        nodes = [op.node_def for op in ancestors(elements)]
        nodes += _function_nodes(script_graph, [name for node in nodes for name in _called(node)])
        fetches = [f"op {e.type}" if not hasattr(e, "dtype") else f"{e.dtype.name}{_dims(e)}" for e in elements]
        inputs = [(tensor.dtype.name, _dims(tensor)) for tensor in map(script_graph.get_tensor_by_name, key.feeds)]
        return keys.session_step_key(nodes, fetches, inputs, target=self.target, settings=self.settings)

    def say_untried(self, name: str, reason: str) -> None:
        """The INFO line of a step that runs its rewritten plan untried, once per step and process."""
        if f"untried {name}" in self._said:
            return
        self._said.add(f"untried {name}")
        logger.info("amp-rewrite: session step %s runs in %s, not tried: %s", name, self.target, reason)

    def say_lists_decide(self, name: str, step_key: str) -> None:
        """The line of a step that would be tried, under op determinism (once per step and process)."""
        if step_key not in self._said:
            self._said.add(step_key)
            logger.info("amp-rewrite: session step %s runs in %s as the op lists say: op determinism is on, so no "
                        "timing decides, and the tuning cache holds no verdict of this step", name, self.target)

    def say(self, name: str, step_key: str, verdict: StepVerdict, *, note: str = "") -> None:
        """The INFO line of a decided step (``note`` after its reason), once per step and process; the decision
        is kept."""
        if step_key in self._said:
            return
        self._said.add(step_key)
        self.decisions.append((name, verdict))
        reason = verdict.reason(self.target, self.device_type) + note
        if verdict.is_half:
            logger.info("amp-rewrite: session step %s runs in %s: %s", name, self.target, reason)
        else:
            logger.info("amp-rewrite: session step %s stays float32: %s", name, reason)


def trials_of(runtime) -> SessionTrials | None:
    """The runtime's session step trials (made at first use); None when its steps are not timed."""
    if not runtime.settings.is_timing_steps or runtime.target is None:
        return None
    trials = runtime.session_trials
    if trials is None or trials.target != runtime.target:
        if not tf_internals.usable([tf_internals.STEP_TRIALS], "session steps", is_strict=runtime.settings.is_strict,
                                   outcome="are not timed (the op lists decide)"):
            return None
        config = runtime.rewrite_config()
        trials = runtime.session_trials = SessionTrials(
            target=runtime.target, device_type=config.device_type, cache_dir=runtime.requested.tune_cache_dir,
            config=config, is_measuring_again=runtime.requested.is_measuring_again)
    return trials


def step_decisions(runtime) -> list[tuple[str, bool, str]]:
    """What ``runtime``'s session step trials decided, oldest first: ``(step, runs in half, why)``.

    ``step`` names what the step fetches (``(fetches train_op, loss)``);
    ``why`` is the INFO line's reason (both times, on which device; whether
    an earlier run measured them). Empty when no step was decided, or
    ``runtime`` is None. Scripts call
    :func:`amp_rewrite.runtime.session_step_decisions`.
    """
    trials = runtime.session_trials if runtime is not None else None
    if trials is None:
        return []
    return [(name, verdict.is_half, verdict.reason(trials.target, trials.device_type))
            for name, verdict in trials.decisions]


def step_name(key: PlanKey) -> str:
    """``(fetches train_op, loss)``: the step, by what it fetches."""
    return f"(fetches {', '.join(node_name(name) for name in key.fetches)})"


# --- which steps, and their float32 variant ------------------------------------

HALF_DTYPES = ("bfloat16", "float16")


def runs_half(plan: RunPlan) -> bool:
    """Whether any op the plan runs computes in half: in the graph, or in a function it calls (a branch, a loop's
    body, a ``Defun``: one whose results are float32 may compute in half inside)."""
    ops = list(ancestors(plan.fetches))
    if any(tensor.dtype.base_dtype.name in HALF_DTYPES for op in ops for tensor in op.outputs):
        return True
    if not ops:
        return False
    import tensorflow as tf

    half = {tf.as_dtype(name).as_datatype_enum for name in HALF_DTYPES}
    functions = tf_internals.graph_functions(ops[0].graph)
    called = [name for op in ops for name in called_functions(op.node_def, functions)]
    return any(value.type in half or half.intersection(value.list.type)
               for name in _reached(functions, called) for node in functions[name].definition.node_def
               for value in node.attr.values())


def why_no_trial(script_graph, shadow_graph, key: PlanKey, plan: RunPlan) -> str | None:
    """Why the step cannot be tried against a float32 copy in the shadow; None when it can."""
    if plan.has_probe:
        return "it fetches the overflow probe (AMP_REWRITE_FIND_OVERFLOW), which watches its half ops"
    collective = collective_op(script_graph, key)
    if collective is not None:
        return f"it runs {collective.type} {collective.name!r}: every worker or replica must run the same variant"
    return None


def collective_op(script_graph, key: PlanKey):
    """The first op the step runs that exchanges values with other workers or devices, or None."""
    ops = list(ancestors(script_graph.as_graph_element(name) for name in key.fetches))
    found = first_collective(op.type for op in ops)
    return next(op for op in ops if op.type == found) if found is not None else None


def _called(node) -> list[str]:
    """The names of the functions a NodeDef calls through its attributes (a call, a branch, a loop body)."""
    names = []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names += [function.name for function in value.list.func]
    return names


def _reached(script: dict, called: list[str]) -> list[str]:
    """The functions of ``script`` (name → function) that ``called`` names, and those they call, each once."""
    reached, seen, pending = [], set(), list(called)
    while pending:
        name = pending.pop()
        if name in seen or name not in script:
            continue
        seen.add(name)
        reached.append(name)
        pending += [callee for node in script[name].definition.node_def for callee in _called(node)]
    return reached


def _function_nodes(script_graph, called: list[str]) -> list:
    """The NodeDefs of the functions ``called`` and of those they call, as the script defined them."""
    if not called:
        return []
    script = tf_internals.graph_functions(script_graph)
    return [node for name in _reached(script, called) for node in script[name].definition.node_def]


def _dims(tensor) -> tuple:
    shape = tensor.shape
    return tuple(shape.as_list()) if shape.rank is not None else ()
