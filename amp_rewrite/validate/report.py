"""What validation found and did (:class:`ValidationReport`), and the error it raises."""

from __future__ import annotations

from dataclasses import dataclass, field

from amp_rewrite.errors import AmpRewriteError


class ValidationError(AmpRewriteError):
    """The sample inputs do not fit the graph, or validation could not reach the tolerance."""


@dataclass
class ValidationReport:
    """What validation found and did."""

    runs: int = 0
    passed: bool = False
    errors: dict[str, float] = field(default_factory=dict)
    range_kept: dict[str, float] = field(default_factory=dict)
    pattern_kept: dict[str, str] = field(default_factory=dict)
    regions_total: int = 0
    regions_returned: list[dict] = field(default_factory=list)
    message: str = ""

    def as_dict(self) -> dict:
        return {
            "runs": self.runs, "passed": self.passed, "errors": self.errors, "range_kept": self.range_kept,
            "pattern_kept": self.pattern_kept, "regions_total": self.regions_total,
            "regions_returned": self.regions_returned, "message": self.message,
        }
