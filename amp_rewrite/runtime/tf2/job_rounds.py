"""A step trial in a multi-worker job: its workers decide the step's body together.

Under ``MultiWorkerMirroredStrategy`` a step that runs collective ops must
run the same body on every worker: bodies whose collectives differ wait for
each other for ever, or fail on a mismatch. The trial's schedule is the same
on every worker (:mod:`amp_rewrite.tune.trial`), so its calls run the same
body everywhere; what would differ is each decision a worker took on its own
times. So in a job every such decision is one round of the job
(:meth:`amp_rewrite.runtime.job.Job.decide`), answered before any worker
runs the body it picks:

- ``pure``, after the trial's ten calls: each worker publishes its best call
  of each body. The chief keeps each body's slowest best (a synchronous step
  waits for its slowest worker), and the verdict follows from those two
  times by :data:`~amp_rewrite.tune.trial.MARGIN`, as for a worker alone.
  The regions are profiled next only when every worker answered, every one
  can profile them, and the job's half body was within
  :data:`~amp_rewrite.tune.trial.MIXING_LIMIT` of its float32 one.
- ``regions``, after the two profiled calls: each worker publishes each
  region's op times; the chief sums them over the workers, or answers that
  no mixed body is tried when a worker has no profile or was not heard.
  Every worker then chooses its mixed body from the same sums, so every one
  builds the same.
- ``built``: each worker says whether it could build that body; the job
  confirms it only when every one did.
- ``mixed``, after the confirming calls: as ``pure``, for the mixed body
  against the better pure one.

A worker that hears no answer within the wait writes the safe one itself
(float32, no mixed body); the store keeps the first answer written, so the
chief follows it when it comes later. Each trial's questions are numbered
by the order in which the process made the trials of collective steps: the
workers trace those in the same order, which their collectives need anyway.
"""

from __future__ import annotations

import logging
from typing import Any

from amp_rewrite.errors import first_line
from amp_rewrite.runtime.job import Answer, Job, Task, name
from amp_rewrite.runtime.tf2.swap_records import LOGGER_NAME
from amp_rewrite.tune.cache import Timing
from amp_rewrite.tune.step_regions import RegionChoice, RegionTimes
from amp_rewrite.tune.trial import MixedVerdict, StepVerdict, is_worth_mixing, verdict_of

logger = logging.getLogger(LOGGER_NAME)


class JobRounds:
    """The rounds in which a job's workers decide one step's trial together.

    Attributes:
        job: the job.
        key: the trial's questions begin with it (``step/0``: the first trial of a collective step here).
        name: the function, for the lines.
    """

    def __init__(self, job: Job, index: int, name: str):
        self.job = job
        self.key = f"step/{index}"
        self.name = name

    def pure(self, own: StepVerdict, can_mix: bool) -> tuple[StepVerdict, bool]:
        """The job's verdict on the pure bodies, and whether every worker profiles the regions next."""
        mine = {"half": own.half_seconds, "float32": own.float32_seconds, "can_mix": can_mix}
        fallback = {**mine, "is_half": False, "can_mix": False, "where": self._alone()}
        answer = self._decide("pure", mine, self._join_pure, fallback)
        verdict = StepVerdict(bool(answer["is_half"]), answer["half"], answer["float32"], where=answer["where"])
        return verdict, bool(answer["can_mix"])

    def _join_pure(self, heard: dict[Task, Answer]) -> Answer:
        timing = Timing(float32=_slowest(heard, "float32"), half=_slowest(heard, "half"))
        verdict = verdict_of(timing)
        can_mix = (len(heard) == len(self.job.tasks) and all(a["can_mix"] for a in heard.values())
                   and is_worth_mixing(verdict))
        return {"half": timing.half, "float32": timing.float32, "is_half": verdict.is_half, "can_mix": can_mix,
                "where": _where(heard)}

    def regions(self, own: tuple[list[RegionTimes], Timing] | None) -> tuple[list[RegionTimes], Timing] | None:
        """Each region's op times summed over the workers, and the profiles' totals; None: no mixed body."""
        mine: dict[str, Any] = {"times": None}
        if own is not None:
            times, totals = own
            mine = {"times": [[t.half, t.float32] for t in times], "totals": [totals.half, totals.float32]}
        answer = self._decide("regions", mine, self._join_regions, {"times": None})
        if answer["times"] is None or own is None or len(answer["times"]) != len(own[0]):
            return None
        summed = [RegionTimes(t.region, half, float32) for t, (half, float32) in zip(own[0], answer["times"])]
        half_total, float32_total = answer["totals"]
        return summed, Timing(float32=float32_total, half=half_total)

    def _join_regions(self, heard: dict[Task, Answer]) -> Answer:
        answers = list(heard.values())
        counts = {len(a["times"]) if a["times"] is not None else -1 for a in answers}
        if len(heard) < len(self.job.tasks) or len(counts) != 1 or -1 in counts:
            return {"times": None}
        times = [[sum(a["times"][i][j] for a in answers) for j in (0, 1)] for i in range(counts.pop())]
        return {"times": times, "totals": [sum(a["totals"][j] for a in answers) for j in (0, 1)]}

    def built(self, is_built: bool) -> bool:
        """Whether every worker built the mixed body the job chose (else the pure verdict stands)."""
        answer = self._decide("built", {"built": is_built}, self._join_built, {"built": False})
        return bool(answer["built"]) and is_built

    def _join_built(self, heard: dict[Task, Answer]) -> Answer:
        return {"built": len(heard) == len(self.job.tasks) and all(a["built"] for a in heard.values())}

    def mixed(self, own: Timing, pure: StepVerdict, choice: RegionChoice) -> MixedVerdict:
        """The job's verdict on the mixed body ``choice`` made, from its and the better pure body's best calls.

        ``own``: this worker's best calls, the mixed body's as ``half``; ``pure``: the job's pure verdict.
        """
        mine = {"half": own.half, "float32": own.float32}
        answer = self._decide("mixed", mine, self._join_mixed, {**mine, "is_mixed": False})
        return MixedVerdict(bool(answer["is_mixed"]), answer["half"], answer["float32"], pure, len(choice.half),
                            len(choice.times))

    @staticmethod
    def _join_mixed(heard: dict[Task, Answer]) -> Answer:
        timing = Timing(float32=_slowest(heard, "float32"), half=_slowest(heard, "half"))
        return {"half": timing.half, "float32": timing.float32, "is_mixed": verdict_of(timing).is_half}

    def _decide(self, question: str, own: Answer, join, fallback: Answer) -> Answer:
        """The job's answer to one of the trial's questions; this worker's fallback when the store fails."""
        try:
            return self.job.decide(f"{self.key}/{question}", own, join, fallback)
        except Exception as exc:  # noqa: BLE001 - the training goes on, in the safe choice
            logger.warning("amp-rewrite: tf.function %s: the workers of the multi-worker job could not decide "
                           "together (%s); this worker takes the safe choice", self.name,
                           first_line(exc, with_type=True))
            return fallback

    def _alone(self) -> str:
        return (f"{name(self.job.me)}, which heard no decision from the chief ({name(self.job.chief)}) "
                f"within {2 * self.job.wait:g} s")


def _slowest(heard: dict[Task, Answer], body: str) -> float:
    """The slowest of the workers' best calls of ``body``: what a synchronous step waits for."""
    return max(float(answer[body]) for answer in heard.values())


def _where(heard: dict[Task, Answer]) -> str:
    """Where the job's times come from, for the verdict's line."""
    if len(heard) == 1:
        return f"{name(next(iter(heard)))}, the only worker heard in time"
    return f"the slowest of {len(heard)} workers"
