"""Which graph a patched session runs, and whose a failure is.

A session starts on the rewritten graph. A failure there makes it retry the
call in a float32 copy of the script's graph; then it falls back for good or,
if the copy fails too (the error is the script's), keeps the rewrite. The one
:class:`FallbackState` per session says where it is::

    REWRITTEN --try_float32--> TRYING_FLOAT32 --keep_rewrite--> REWRITTEN
    REWRITTEN or TRYING_FLOAT32 --fall_back(keeps_values=True)--> FLOAT32_COPY
    REWRITTEN --fall_back(keeps_values=False)--> SCRIPT_GRAPH

FLOAT32_COPY and SCRIPT_GRAPH are final.
"""

from __future__ import annotations

import enum
import logging

from amp_rewrite.errors import first_line

# One logger for the whole package: its lines keep the name they have always had.
logger = logging.getLogger(__package__)

# Errors a script meets in float32 as well: never blamed on the rewrite.
SCRIPT_ERRORS = ("OutOfRangeError", "CancelledError", "AbortedError", "UnavailableError",
                 "DeadlineExceededError")


class Mode(enum.Enum):
    """Where a session's steps run."""

    REWRITTEN = "the rewritten graph (or none yet): a failure is the rewrite's"
    TRYING_FLOAT32 = "a float32 copy, retrying a call that failed: a failure is the script's"
    FLOAT32_COPY = "a float32 copy of the script's graph, holding the values the rewritten graph had"
    SCRIPT_GRAPH = "the script's own graph and session"


class FallbackState:
    """A session's :class:`Mode`, changed only by the named transitions, and why it left the rewrite."""

    def __init__(self):
        self.mode = Mode.REWRITTEN
        self.reason: str | None = None
        # Read on every step, so kept as plain flags; only _move sets them.
        self.is_rewritten = True  # the rewritten graph runs: a failure is blamed on the rewrite
        self.runs_script_graph = False  # the script's own session runs every call (no shadow is left)

    def blames_rewrite(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by a run now, is the rewrite's failure rather than the script's."""
        return self.is_rewritten and type(exc).__name__ not in SCRIPT_ERRORS

    def try_float32(self, reason: str) -> None:
        """A call that failed on the rewritten graph is retried in float32."""
        self._move(Mode.TRYING_FLOAT32, allowed_from=(Mode.REWRITTEN,))
        self.reason = reason

    def keep_rewrite(self) -> None:
        """The retry failed too: the error is the script's, and the rewrite stays."""
        self._move(Mode.REWRITTEN, allowed_from=(Mode.TRYING_FLOAT32,))
        self.reason = None

    def fall_back(self, reason: str, *, keeps_values: bool) -> None:
        """Runs float32 from now on: a copy holding the shadow's values (``keeps_values``), else the script's graph."""
        if keeps_values:
            self._move(Mode.FLOAT32_COPY, allowed_from=(Mode.REWRITTEN, Mode.TRYING_FLOAT32))
        else:
            self._move(Mode.SCRIPT_GRAPH, allowed_from=(Mode.REWRITTEN,))
        self.reason = reason
        logger.warning("amp-rewrite: running the float32 graph: %s", reason)

    def _move(self, mode: Mode, *, allowed_from: tuple) -> None:
        if self.mode not in allowed_from:
            raise RuntimeError(f"session fallback: no transition from {self.mode.name} to {mode.name}")
        self.mode = mode
        self.is_rewritten = mode is Mode.REWRITTEN
        self.runs_script_graph = mode is Mode.SCRIPT_GRAPH


# Lines of TensorFlow's error messages that say nothing about the error itself.
_BOILERPLATE = ("Graph execution error", "Detected at node", "Node:", "defined at",
                "Original stack trace")


def error_line(exc: BaseException) -> str:
    """``Type: message``, with the line of the message that says what went wrong, and at which node."""
    message = first_line(exc, if_empty=repr(exc), skipping=_BOILERPLATE)
    node = next((line.strip()[len("Node:"):].strip().strip("'") for line in str(exc).splitlines()
                 if line.strip().startswith("Node:")), None)
    line = message if node is None or node in message else f"{message} (node {node})"
    return f"{type(exc).__name__}: {line}"
