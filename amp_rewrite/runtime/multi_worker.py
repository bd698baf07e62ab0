"""One precision decision for every worker of a ``MultiWorkerMirroredStrategy`` job.

Under ``tf.distribute.MultiWorkerMirroredStrategy`` every worker must create
the same variables and run the same collectives in the same order. A worker
that scales the loss creates loss-scale variables its peers lack, and the
job's collectives no longer line up: every worker dies with a
``CollectiveBcastSend ... Shape mismatch`` naming nothing of ours. That
happens whenever the workers' settings differ: ``ENABLE_AUTO_MP=1`` on one
host only, another ``AMP_REWRITE_TARGET`` or ``AMP_LOSS_SCALE``, or ``auto``
choosing float16 on a GPU host and float32 on a CPU one. Step trials
(``AMP_REWRITE_TUNE``) on one worker only would do the same: it would run
float32 bodies in calls where its peers run half ones.

So the runtime patches the strategy's constructor, and before the script can
create a variable under it, the workers agree (:func:`exchange`):

- each worker publishes its setting (:class:`Setting`: the target and loss
  scaling it would run, whether it times its steps, and whether it is
  strict) in the job's key-value
  store, which the strategy's coordination service provides beside the
  collectives. A worker without the runtime publishes nothing and runs
  nothing of ours, so no collective of ours can be used: that worker would
  not run it;
- the chief (worker 0 when the job has no chief) waits up to
  ``AMP_REWRITE_PEER_WAIT`` seconds for every peer's setting and writes the
  job's :class:`Verdict` (:func:`decide`): its own setting when every worker
  published one; float32 when some worker published nothing (it runs without
  the runtime, so in float32), naming it; a failure when workers differ and
  one of them is strict (``AMP_REWRITE_STRICT=1``);
- the other workers wait for the chief's setting, then for the verdict. A
  chief that published nothing runs without the runtime: the worker writes
  the float32 verdict itself. The store never overwrites a key, so the
  first verdict written is the one every worker reads, however late a
  worker is;
- a worker whose setting differs from the verdict's says so in one line and
  follows it: the runtime installs the patches of the job's decision instead
  of its own (none for float32). In strict mode it raises instead, and a
  failed verdict raises on every worker that has the runtime, after putting
  the job in error so that a worker without it stops too.

Once they agreed on a half precision, the workers form a
:class:`~amp_rewrite.runtime.job.Job`, through which the trials of the steps
that run collectives decide together which body every worker keeps
(:mod:`amp_rewrite.runtime.tf2.job_rounds`).

The agreement happens once per process; a second strategy keeps the decision.
A strategy of one worker, ``MirroredStrategy`` and TF1's strategies (which
have no coordination service) are left alone.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from amp_rewrite import tf_internals
from amp_rewrite.errors import RuntimeRewriteError, first_line
from amp_rewrite.runtime.job import KEY_PREFIX, Job, JobStore, Store, Task, name
from amp_rewrite.runtime.ledger import Ledger
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings, scales_loss
from amp_rewrite.runtime.target import TargetChoice

logger = logging.getLogger(__name__)

LEDGER_NAME = "multi-worker agreement"
VERDICT_KEY = f"{KEY_PREFIX}/decision"
COORDINATED_JOBS = ("chief", "worker")  # the jobs that run the collectives
FIX = "set ENABLE_AUTO_MP, AMP_REWRITE_TARGET, AMP_REWRITE_TUNE and any AMP_LOSS_SCALE* alike on every worker"


@dataclass(frozen=True)
class Decision:
    """What a worker runs.

    Attributes:
        target: ``"float16"`` or ``"bfloat16"``; None for float32 (nothing rewritten).
        loss_scale: the loss scaling of the optimizers; None for none.
        is_timed: the steps are timed, each keeping the faster body (``AMP_REWRITE_TUNE``): a
            worker that times its steps runs float32 bodies in the calls where one that does not runs half.
    """

    target: str | None = None
    loss_scale: LossScaleSettings | None = None
    is_timed: bool = False

    @classmethod
    def of(cls, settings: RuntimeSettings, choice: TargetChoice) -> Decision:
        """The decision of the runtime's ``settings`` for the ``choice`` made on this machine."""
        if choice.target is None:
            return cls()
        if not scales_loss(replace(settings, target=choice.target)):
            return cls(choice.target, is_timed=settings.is_timing_steps)
        return cls(choice.target, _policy(settings.loss_scale), settings.is_timing_steps)

    def describe(self) -> str:
        if self.target is None:
            return "float32"
        timed = " and timed steps" if self.is_timed else ""
        scaling = self.loss_scale
        if scaling is None:
            return f"{self.target} without loss scaling{timed}"
        if not scaling.is_dynamic:
            return f"{self.target} with a fixed loss scale of {scaling.initial_scale:g}{timed}"
        return (f"{self.target} with dynamic loss scaling (from {scaling.initial_scale:g}, "
                f"doubling after {scaling.growth_interval} finite steps){timed}")

    def settings_for(self, settings: RuntimeSettings) -> RuntimeSettings:
        """``settings`` changed so that the runtime runs this decision."""
        if self.target is None:
            return settings
        scaling = self.loss_scale or settings.loss_scale
        return replace(settings, target=self.target, is_loss_scaled=self.loss_scale is not None,
                       loss_scale=replace(scaling, log_every=settings.loss_scale.log_every,
                                          grouped=settings.loss_scale.grouped),
                       is_timing_steps=self.is_timed)

    def to_dict(self) -> dict:
        return {"target": self.target, "loss_scale": _shared_fields(self.loss_scale) if self.loss_scale else None,
                "is_timed": self.is_timed}

    @classmethod
    def from_dict(cls, data: dict) -> Decision:
        scaling = data.get("loss_scale")
        return cls(data.get("target"), LossScaleSettings(**scaling) if scaling else None, bool(data.get("is_timed")))


FLOAT32 = Decision()


def _shared_fields(scaling: LossScaleSettings) -> dict:
    """The settings as published: whether a worker joins its gradients is its own (its device's) business."""
    fields = asdict(scaling)
    del fields["grouped"]
    return fields


def _policy(scaling: LossScaleSettings) -> LossScaleSettings:
    """What of ``scaling`` the workers must share.

    How often the scale is logged is each worker's own business, a fixed
    scale never grows, and whether scaling was asked for by name is settled
    once the decision says whether it scales.
    """
    default = LossScaleSettings()
    interval = scaling.growth_interval if scaling.is_dynamic else default.growth_interval
    return replace(scaling, growth_interval=interval, log_every=default.log_every, is_asked=False)


@dataclass(frozen=True)
class Setting:
    """What one worker published: the decision it would take alone, and whether it is strict."""

    decision: Decision
    is_strict: bool = False

    def to_json(self) -> str:
        return json.dumps({"decision": self.decision.to_dict(), "is_strict": self.is_strict}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Setting:
        data = json.loads(text)
        return cls(Decision.from_dict(data["decision"]), bool(data.get("is_strict")))


@dataclass(frozen=True)
class Verdict:
    """The job's decision, the one every worker runs.

    Attributes:
        decision: what every worker runs.
        reason: why, in a few words (``the chief (worker 0) chose it``).
        failure: when set, every worker that has the runtime raises with this line.
    """

    decision: Decision
    reason: str
    failure: str | None = None

    def to_json(self) -> str:
        return json.dumps({"decision": self.decision.to_dict(), "reason": self.reason, "failure": self.failure},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        data = json.loads(text)
        return cls(Decision.from_dict(data["decision"]), data["reason"], data.get("failure"))


@dataclass(frozen=True)
class Cluster:
    """The workers that run the job's collectives, this one, and the one that decides."""

    tasks: tuple[Task, ...]
    me: Task

    @property
    def chief(self) -> Task:
        return self.tasks[0]

    @classmethod
    def of(cls, resolver) -> Cluster | None:
        """The cluster of a strategy's cluster resolver; None when this task runs no collective."""
        spec = resolver.cluster_spec()
        jobs = set(spec.jobs)
        tasks = tuple((job, index) for job in COORDINATED_JOBS if job in jobs for index in spec.task_indices(job))
        me = (resolver.task_type, resolver.task_id)
        return cls(tasks, me) if me in tasks else None


def names(tasks) -> str:
    return ", ".join(name(task) for task in tasks)


def setting_key(task: Task) -> str:
    return f"{KEY_PREFIX}/setting/{task[0]}/{task[1]}"


def exchange(cluster: Cluster, own: Setting, store: Store, *, wait: float,
             clock: Callable[[], float] = time.monotonic) -> Verdict:
    """Publishes this worker's setting and returns the job's verdict, the same on every worker.

    Waits at most ``wait`` seconds for the peers' settings (the chief), or
    ``wait`` for the chief's setting and twice that for the verdict (the others).
    """
    store.insert(setting_key(cluster.me), own.to_json())
    if cluster.me == cluster.chief:
        deadline = clock() + wait
        published: dict[Task, Setting | None] = {cluster.me: own}
        for task in cluster.tasks[1:]:
            text = store.read(setting_key(task), max(0.0, deadline - clock()))
            published[task] = Setting.from_json(text) if text is not None else None
        candidate = decide(cluster, published, wait=wait)
    elif store.read(setting_key(cluster.chief), wait) is None:
        candidate = decide(cluster, {cluster.me: own, cluster.chief: None}, wait=wait)
    else:
        text = store.read(VERDICT_KEY, 2 * wait)
        if text is not None:
            return Verdict.from_json(text)
        candidate = Verdict(FLOAT32, f"the chief ({name(cluster.chief)}) published its setting but no "
                                     f"decision within {2 * wait:g} s")
    if store.insert(VERDICT_KEY, candidate.to_json()):
        return candidate
    text = store.read(VERDICT_KEY, wait)
    if text is None:
        raise RuntimeRewriteError(f"the job's key {VERDICT_KEY} exists but cannot be read")
    return Verdict.from_json(text)


def decide(cluster: Cluster, published: dict[Task, Setting | None], *, wait: float) -> Verdict:
    """The job's verdict from the settings the workers published (None: nothing within ``wait``).

    The chief's decision when every worker published one; float32 when some
    worker did not (it runs without the runtime); a failure when some worker
    that published is strict and the workers differ. Workers missing from
    ``published`` are not counted.
    """
    silent = [task for task in cluster.tasks if task in published and published[task] is None]
    heard = {task: setting for task, setting in published.items() if setting is not None}
    chief = heard.get(cluster.chief)
    if silent or chief is None:
        decision = FLOAT32
        reason = (f"{names(silent)} published no amp-rewrite setting within {wait:g} s "
                  "(without ENABLE_AUTO_MP=1 a worker runs float32)")
    else:
        decision = chief.decision
        reason = f"the chief ({name(cluster.chief)}) chose it"
    strict = [task for task in cluster.tasks if task in heard and heard[task].is_strict]
    differ = silent or any(setting.decision != decision for setting in heard.values())
    failure = None
    if strict and differ:
        sides = "; ".join(f"{name(task)}: {_describe(published[task])}"
                          for task in cluster.tasks if task in published)
        failure = (f"the workers of this multi-worker job differ ({sides}) and "
                   f"AMP_REWRITE_STRICT=1 is set on {names(strict)}: {FIX}")
    return Verdict(decision, reason, failure)


def _describe(setting: Setting | None) -> str:
    return setting.decision.describe() if setting is not None else "without amp-rewrite"


def follow_line(cluster: Cluster, own: Decision, verdict: Verdict) -> str:
    """The one line of a worker whose own decision is not the job's."""
    return (f"this worker ({name(cluster.me)}) of a multi-worker job asked for {own.describe()} "
            f"but runs {verdict.decision.describe()}, as every worker does: {verdict.reason}; {FIX}")


class Agreement:
    """Agrees with the other workers when a multi-worker strategy is constructed, then follows.

    Args:
        settings: the runtime's settings in this process.
        choice: the target chosen on this machine.
        follow: installs the runtime for another decision:
            ``follow(choice, settings)``, where ``choice.target`` None means float32.
        store: the job's key-value store (tests pass another).
        joined: given the :class:`~amp_rewrite.runtime.job.Job` once the workers agreed on a half
            precision, for the steps they must then decide together (their trials).
    """

    def __init__(self, settings: RuntimeSettings, choice: TargetChoice,
                 follow: Callable[[TargetChoice, RuntimeSettings], None], store: Store | None = None,
                 joined: Callable[[Job], None] = lambda job: None):
        self.settings = settings
        self.own = Setting(Decision.of(settings, choice), settings.is_strict)
        self.follow = follow
        self.store = store or JobStore()
        self.joined = joined
        self.verdict: Verdict | None = None

    def construct(self, original, strategy, *args, **kwargs):
        """The strategy's constructor, then the agreement."""
        original(strategy, *args, **kwargs)
        self.agree(strategy)

    def agree(self, strategy) -> None:
        if self.verdict is not None:
            return
        cluster = Cluster.of(strategy.cluster_resolver)
        if cluster is None or len(cluster.tasks) < 2:
            return
        verdict = self._verdict(cluster)
        if verdict is None:
            return
        self.verdict = verdict
        self._apply(cluster, verdict)
        if verdict.decision.target is not None:
            self.joined(Job(cluster.tasks, cluster.me, self.store, self.settings.peer_wait_seconds))

    def _verdict(self, cluster: Cluster) -> Verdict | None:
        """The job's verdict; float32 when the workers cannot agree; None when nothing can be checked.

        A TensorFlow without the internals the exchange needs fails alike on
        every worker, so every worker runs float32. A graph-mode program has
        no coordination service: its workers run as each is configured, as
        TF1's strategies do.
        """
        absent = tf_internals.missing(tf_internals.MULTI_WORKER)
        if absent:
            return Verdict(FLOAT32, tf_internals.lacking(tf_internals.MULTI_WORKER, absent))
        if not tf_internals.has_coordination_service():
            logger.info("amp-rewrite: the workers' settings are not compared in a graph-mode multi-worker "
                        "program (it has no coordination service): %s", FIX)
            return None
        try:
            return exchange(cluster, self.own, self.store, wait=self.settings.peer_wait_seconds)
        except Exception as exc:  # a failed agreement must not stop the training
            return Verdict(FLOAT32, f"the workers could not agree: {first_line(exc, with_type=True)}")

    def _apply(self, cluster: Cluster, verdict: Verdict) -> None:
        if verdict.failure is not None:
            _fail(verdict.failure)
        own = self.own.decision
        if verdict.decision == own:
            logger.debug("amp-rewrite: the workers agree on %s: %s", own.describe(), verdict.reason)
            return
        line = follow_line(cluster, own, verdict)
        if self.settings.is_strict:
            _fail(line)
        logger.warning("amp-rewrite: %s", line)
        choice = TargetChoice(verdict.decision.target, f"the multi-worker job's decision: {verdict.reason}")
        self.follow(choice, verdict.decision.settings_for(self.settings))


def _fail(line: str) -> None:
    """Raises with ``line``, after putting the job in error so that workers without the runtime stop too."""
    try:
        tf_internals.report_error_to_job(f"amp-rewrite: {line}")
    except Exception as exc:  # the raise below must happen whatever the job can be told
        logger.debug("amp-rewrite: could not put the job in error: %s", first_line(exc))
    raise RuntimeRewriteError(line)


def install(ledger: Ledger, settings: RuntimeSettings, choice: TargetChoice,
            follow: Callable[[TargetChoice, RuntimeSettings], None],
            joined: Callable[[Job], None] = lambda job: None) -> None:
    """Patches ``MultiWorkerMirroredStrategy``'s constructor to agree with the other workers (entered in ``ledger``).

    ``follow`` and ``joined`` are the :class:`Agreement`'s.
    """
    import tensorflow as tf

    with ledger.lock:
        if ledger.installed(LEDGER_NAME):
            return
        agreement = Agreement(settings, choice, follow, joined=joined)
        ledger.install(LEDGER_NAME, tf.distribute.MultiWorkerMirroredStrategy, "__init__", agreement.construct)


__all__ = ["Agreement", "Cluster", "Decision", "Setting", "Verdict", "decide", "exchange", "install"]
