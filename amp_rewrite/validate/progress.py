"""Progress lines for a terminal while validation runs graphs."""

from __future__ import annotations

import sys
from collections.abc import Callable


def terminal_progress() -> Callable[[str], None] | None:
    """A progress printer for an interactive stderr, else None."""
    if not sys.stderr.isatty():
        return None
    return lambda line: print(f"\r{line:<78}", end="", file=sys.stderr, flush=True)
