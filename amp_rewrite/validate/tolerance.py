"""When a half output agrees with the float32 one: :class:`Tolerance` and its metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from amp_rewrite.errors import UsageError

METRICS = ("allclose", "cosine", "top1")


@dataclass
class Tolerance:
    """When two outputs agree: ``allclose`` (``|got - want| <= atol*scale + rtol*|want|``), ``cosine``, ``top1``.

    ``atol`` is relative to the largest ``|value|`` of the float32 output, so one
    setting fits outputs of any scale.
    """

    rtol: float = 2e-2
    atol: float = 2e-2
    metric: str = "allclose"

    def __post_init__(self):
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise UsageError(f"{name} {value!r}: must be a finite number >= 0")
        if self.rtol == 0 and self.atol == 0:
            raise UsageError("rtol and atol are both 0: no half graph can pass")
        if self.metric not in METRICS:
            raise UsageError(f"unknown metric {self.metric!r}; choose one of {', '.join(METRICS)}")

    def error(self, got: np.ndarray, want: np.ndarray) -> float:
        """How far ``got`` is from ``want``: at most 1.0 passes.

        Where ``want`` is not finite (a legitimate -inf, say), ``got`` must be
        the same value; where it is finite, ``got`` must be finite too, and the
        metric judges those values. A mismatch is inf, never NaN.
        """
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            return math.inf
        finite = np.isfinite(want)
        if not np.all(np.isfinite(got[finite])):
            return math.inf
        odd_got, odd_want = got[~finite], want[~finite]
        if not np.all((odd_got == odd_want) | (np.isnan(odd_got) & np.isnan(odd_want))):
            return math.inf
        if not np.all(finite):
            got, want = got[finite], want[finite]
        if got.size == 0:
            return 0.0
        if self.metric == "cosine":
            denominator = np.linalg.norm(got) * np.linalg.norm(want)
            similarity = 1.0 if denominator == 0 else float(np.sum(got * want) / denominator)
            return (1.0 - similarity) / 1e-3
        if self.metric == "top1":
            agree = np.argmax(got, axis=-1) == np.argmax(want, axis=-1)
            return 0.0 if np.all(agree) else 1.0 + float(np.mean(~agree))
        scale = max(float(np.max(np.abs(want))), 1e-30)
        limit = self.atol * scale + self.rtol * np.abs(want)
        return float(np.max(np.abs(got - want) / limit))
