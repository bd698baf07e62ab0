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


class RuntimeRewriteError(AmpRewriteError):
    """A graph or ``tf.function`` could not be rewritten or run rewritten at run time.

    Raised only with ``AMP_REWRITE_STRICT=1``; otherwise the runtime warns and
    runs the script's float32 graph.
    """


# What the runtime's lines say of an exception whose message is empty.
NO_MESSAGE = "(no message)"


def first_line(exc: BaseException, *, with_type: bool = False, if_empty: str | None = None,
               skipping: tuple[str, ...] = ()) -> str:
    """The first line of an exception's message (its type name when it has none).

    Args:
        exc: the exception.
        with_type: prefix the type name: ``ValueError: ...``.
        if_empty: the text of a message that is empty or blank (default: the
            type name alone, never prefixed).
        skipping: starts of lines that say nothing about the error (a
            framework's boilerplate): the first line starting with none of
            them is taken, or the first line when all do.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines and if_empty is None:
        return type(exc).__name__
    text = next((line for line in lines if not line.startswith(skipping)), lines[0]) if lines else (if_empty or "")
    return f"{type(exc).__name__}: {text}" if with_type else text


class PaintingRuleError(RuntimeError):
    """A painting rule failed unexpectedly: a fault of the rewrite, not of the input.

    The message names the rule, the rules that ran before it (whose changes
    the failing rule read), and the original error, which is also the
    ``__cause__``. Errors the rules raise on purpose (:class:`AmpRewriteError`)
    pass through unchanged instead.
    """

    def __init__(self, rule: str, error: BaseException, ran_before: tuple[str, ...] = ()):
        after = f" (after {', '.join(ran_before)})" if ran_before else " (the first rule)"
        super().__init__(f"painting rule {rule} failed{after}: {first_line(error, with_type=True)}")
        self.rule = rule
        self.ran_before = ran_before
