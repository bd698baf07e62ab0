"""Fresh node and function names: a name not yet taken in a body or a library.

:class:`NamesInUse` is a body's node names without copying them (its index's
keys, plus the names added since); :func:`unique_name` picks ``name``,
``name_1``, ``name_2``, ... and records the one it picked.
"""

from __future__ import annotations

from collections.abc import Container


class NamesInUse:
    """A body's node names (its index's keys, not copied) and the names added to it since."""

    def __init__(self, existing: Container[str]):
        self._existing = existing
        self._added: set[str] = set()

    def __contains__(self, name: object) -> bool:
        return name in self._existing or name in self._added

    def add(self, name: str) -> None:
        self._added.add(name)


def unique_name(name: str, taken: set[str] | NamesInUse) -> str:
    """``name``, or ``name_1``, ``name_2``, ... if taken; the result is added to ``taken``."""
    candidate, k = name, 1
    while candidate in taken:
        candidate = f"{name}_{k}"
        k += 1
    taken.add(candidate)
    return candidate
