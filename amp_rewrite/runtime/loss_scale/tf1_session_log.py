"""What a session's loss-scale reports said, logged as its steps run.

A step that fetches a guarded update also fetches its report (scale,
skipped steps, good steps, whether the loss was finite); :class:`LossScaleLog`
turns those into the runtime's loss-scale lines and says when half arithmetic
cannot train (:func:`~amp_rewrite.runtime.loss_scale.core.hopeless_reason`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from amp_rewrite.runtime.loss_scale.core import hopeless_reason

# The session's lines: one logger for the whole TF1 session package, whose name they have always carried.
LOGGER_NAME = "amp_rewrite.runtime.tf1.session"
logger = logging.getLogger(LOGGER_NAME)


@dataclass
class LossScaleLog:
    """What the loss-scale reports said so far, and which warnings they have had.

    Attributes:
        every: an INFO line every this many steps with reports (0: only on skips).
        steps: steps whose reports were recorded.
        skipped, scales: per report, the last skipped-step count and loss scale.
        non_finite_losses: per report, how many steps in a row had a loss that was not finite.
        hopeless: reports already said to show that no scale helps.
    """

    every: int = 0
    steps: int = 0
    skipped: dict = field(default_factory=dict)
    scales: dict = field(default_factory=dict)
    non_finite_losses: dict = field(default_factory=dict)
    hopeless: set = field(default_factory=set)

    def skips(self, reports) -> bool:
        """Whether a step's reports, not recorded yet, say that it skipped (a skipped-step count went up)."""
        return any(report[1] > self.skipped.get(index, 0.0) for index, report in enumerate(reports))

    def record(self, reports) -> str | None:
        """Logs what one step's (scale, skipped, good steps, loss is finite) reports say.

        Returns why half arithmetic cannot train this graph, the first time a
        skipped step shows that no scale helps (its loss was not finite, as
        was the step's before, or the scale was already at its floor of 1):
        the caller falls back to float32.
        """
        if not len(reports):
            return None
        self.steps += 1
        hopeless = None
        for index, (scale, skipped, _good, loss_is_finite) in enumerate(reports):
            before, used = self.skipped.get(index, 0.0), self.scales.get(index, 2.0)
            self.skipped[index], self.scales[index] = skipped, scale
            is_skip = skipped > before
            losses = 0 if loss_is_finite > 0.5 else self.non_finite_losses.get(index, 0) + 1
            self.non_finite_losses[index] = losses
            reason = hopeless_reason(skipped=is_skip, scale=used, non_finite_losses=losses)
            if reason is not None and index in self.hopeless:
                # Said once below; a NaN loss would otherwise warn on every step.
                logger.debug("amp-rewrite: step skipped at loss scale %g, %d steps skipped so far", used, skipped)
            elif reason is not None:
                self.hopeless.add(index)
                hopeless = f"{reason}; {skipped:g} steps skipped in all"
            elif is_skip:
                self.hopeless.discard(index)
                logger.warning("amp-rewrite: step skipped, gradients not finite; "
                               "loss scale now %g, %d steps skipped so far", scale, skipped)
            elif self.every and self.steps % self.every == 0:
                logger.info("amp-rewrite: loss scale %g, %d steps skipped so far", scale, skipped)
        return hopeless
