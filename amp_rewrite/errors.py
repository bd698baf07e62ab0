"""The exceptions amp-rewrite raises.

Every message names what the user must look at: the file, node, op or type
attribute. The CLI prints ``str(error)`` as its one-line message.
"""

from __future__ import annotations


class AmpRewriteError(Exception):
    """Base class of every error this package raises on purpose."""


class UsageError(AmpRewriteError):
    """The caller asked for something that does not make sense (bad flag, bad level)."""


class ListError(AmpRewriteError):
    """An op list file or override is malformed, or an op sits in two lists."""


class GraphError(AmpRewriteError):
    """The input graph is malformed: a bad input reference, a missing attr, a bad fetch."""


class InputFileError(AmpRewriteError):
    """An input file is missing, unreadable or not in the expected format."""


class TensorFlowMissingError(AmpRewriteError):
    """TensorFlow is not importable; amp-rewrite needs it for the op registry."""


class OutputError(AmpRewriteError):
    """An output cannot be written (missing directory, no space, permission); names the path."""


def first_line(exc: BaseException, *, with_type: bool = False) -> str:
    """The first line of an exception's message (its type name when it has none).

    With ``with_type``, the line is prefixed by the type name: ``ValueError: ...``.
    """
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__
    return f"{type(exc).__name__}: {lines[0]}" if with_type else lines[0]


class PaintingRuleError(RuntimeError):
    """A painting rule failed unexpectedly: a fault of the rewrite, not of the input.

    The message names the rule and the original error, which is also the
    ``__cause__``. Errors the rules raise on purpose (:class:`AmpRewriteError`)
    pass through unchanged instead.
    """

    def __init__(self, rule: str, error: BaseException):
        super().__init__(f"painting rule {rule} failed: {first_line(error, with_type=True)}")
        self.rule = rule
