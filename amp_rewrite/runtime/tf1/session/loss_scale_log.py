"""What a session's loss-scale reports said, logged as its steps run.

A step that fetches a guarded update also fetches its report (scale,
skipped steps, good steps); :class:`LossScaleLog` turns those into the
runtime's loss-scale lines and says when half arithmetic cannot train.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

# One logger for the whole package: its lines keep the name they have always had.
logger = logging.getLogger(__package__)


@dataclass
class LossScaleLog:
    """What the loss-scale reports said so far, and which warnings they have had.

    Attributes:
        every: an INFO line every this many steps with reports (0: only on skips).
        steps: steps whose reports were recorded.
        skipped, scales: per report, the last skipped-step count and loss scale.
        at_floor: reports already warned about at scale 1.
    """

    every: int = 0
    steps: int = 0
    skipped: dict = field(default_factory=dict)
    scales: dict = field(default_factory=dict)
    at_floor: set = field(default_factory=set)

    def record(self, reports) -> str | None:
        """Logs what one step's (scale, skipped, good steps) reports say.

        Returns why half arithmetic cannot train this graph, the first time
        a step is skipped with the loss scale already at its floor of 1:
        then no scale helps, and the caller falls back to float32.
        """
        if not len(reports):
            return None
        self.steps += 1
        hopeless = None
        for index, (scale, skipped, _good) in enumerate(reports):
            before = self.skipped.get(index, 0.0)
            self.skipped[index] = skipped
            was_at_floor = self.scales.get(index, 2.0) <= 1.0
            self.scales[index] = scale
            if skipped > before and was_at_floor and index in self.at_floor:
                # Said once below; a NaN loss would otherwise warn on every step.
                logger.debug("amp-rewrite: step skipped at loss scale 1, %d steps skipped so far", skipped)
            elif skipped > before and was_at_floor:
                self.at_floor.add(index)
                hopeless = (f"a step was skipped with the loss scale at its floor of 1 ({skipped:g} skipped in "
                            "all): the gradients are not finite even unscaled, so no scale helps; the loss "
                            "itself is not finite, or an op overflows in half whatever the scale (keep such "
                            "an op float32 with TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD)")
            elif skipped > before:
                self.at_floor.discard(index)
                logger.warning("amp-rewrite: step skipped, gradients not finite; "
                               "loss scale now %g, %d steps skipped so far", scale, skipped)
            elif self.every and self.steps % self.every == 0:
                logger.info("amp-rewrite: loss scale %g, %d steps skipped so far", scale, skipped)
        return hopeless
