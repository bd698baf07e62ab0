"""The one record of what the runtime changed outside this package, and how to undo it.

Every change the runtime makes to TensorFlow, Keras or the import system is
entered in the :class:`Ledger` of the :class:`~amp_rewrite.runtime.core.Runtime`
that made it, when it is made:

- a patched attribute (:meth:`Ledger.install`): ``owner.attr`` becomes a
  wrapper that calls ``replacement(original, *args, **kwargs)``;
- any other change (:meth:`Ledger.record`): a callback added to a TensorFlow
  list, a pending import hook, state that must start afresh, each with the
  function that undoes it.

:meth:`Ledger.uninstall_all`, which :func:`amp_rewrite.disable` calls, undoes
them newest first, so every patched attribute is again the object it was.

:data:`LOCK` is the runtime's one lock, held by every ledger: the modules that
install patches take it for their own state too, so there is no lock order to
get wrong. (It is a module-level object because what it guards is: the
attributes of TensorFlow's classes, which every runtime in the process would
patch.)
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Entry:
    """One change: who made it, where, and how to undo it.

    Attributes:
        name: the part of the runtime that made it (``"session"``, ``"tf.function"``, ...).
        where: ``Owner.attr`` for a patched attribute, else what changed, in a few words.
        undo: puts back what was there before.
    """

    name: str
    where: str
    undo: Callable[[], None]


# The runtime's one lock (see the module docstring).
LOCK = threading.RLock()


class Ledger:
    """The installed changes, in the order they were made, under :data:`LOCK`."""

    def __init__(self):
        self.lock = LOCK
        self._entries: list[Entry] = []

    def install(self, name: str, owner, attr: str, replacement: Callable) -> None:
        """Replaces ``owner.attr`` by a wrapper of ``replacement(original, *args, **kwargs)``.

        The wrapper carries the original's name and docstring, and the
        original as ``__wrapped__``.
        """
        original = owner.__dict__[attr]
        unconverted = _left_alone_by_autograph(replacement)

        @functools.wraps(original)
        def patched(*args, **kwargs):
            return unconverted(original, *args, **kwargs)

        with self.lock:
            setattr(owner, attr, patched)
            self._entries.append(Entry(name, f"{_qualified(owner)}.{attr}",
                                       functools.partial(setattr, owner, attr, original)))

    def record(self, name: str, where: str, undo: Callable[[], None]) -> None:
        """Enters a change that is not an attribute patch, with the function that undoes it."""
        with self.lock:
            self._entries.append(Entry(name, where, undo))

    def uninstall_all(self, *, keep: str | None = None) -> None:
        """Undoes every change, newest first; the ledger is empty afterwards.

        With ``keep``, the changes entered under that name stay (and stay in
        the ledger). An undo that raises does not stop the others; the first
        error is raised once all have run.
        """
        with self.lock:
            entries = [entry for entry in self._entries if entry.name != keep]
            self._entries = [entry for entry in self._entries if entry.name == keep]
            failure = None
            for entry in reversed(entries):
                try:
                    entry.undo()
                except Exception as exc:  # the other changes must still be undone
                    failure = failure or exc
            if failure is not None:
                raise failure

    def installed(self, name: str | None = None) -> list[Entry]:
        """The changes in place, oldest first; only those of ``name`` when given."""
        with self.lock:
            return [entry for entry in self._entries if name is None or entry.name == name]


def _left_alone_by_autograph(function: Callable) -> Callable:
    """``function``, marked so that AutoGraph runs it (and what it calls) as written.

    A patched method called from a ``tf.function`` body would otherwise be
    converted with the user's code, as TensorFlow's own code is not: its
    Python conditions turned into graph ops, and its source read again from
    disk while tracing.
    """
    tf = sys.modules.get("tensorflow")
    if tf is None:  # without TensorFlow nothing traces it
        return function
    return tf.autograph.experimental.do_not_convert(function)


def _qualified(owner) -> str:
    return str(getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner)))


def bound(replacement: Callable[..., Any], given) -> Callable[..., Any]:
    """``replacement(original, given, ...)`` as the ``(original, ...)`` replacement :meth:`Ledger.install` takes."""

    def call(original, *args, **kwargs):
        return replacement(original, given, *args, **kwargs)

    return call
