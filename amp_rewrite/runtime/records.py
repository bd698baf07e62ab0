"""What the runtime knows about TensorFlow's and Keras' objects, kept on the runtime, not on the objects.

The runtime needs a few facts per object it meets: a session's runner and
the arguments it was made with, which sessions are its own shadows, the
loss-scale reports built in a graph, which optimizers a wrapper scales, a
Saver's fallback without the loss-scale state. Each is an :class:`ObjectTable` in the
:class:`ObjectRecords` of the one :class:`~amp_rewrite.runtime.core.Runtime`,
keyed by the object's identity:

- nothing is set on TensorFlow's objects, so none carries a trace of the
  runtime after :func:`amp_rewrite.runtime.disable`, and Keras objects
  (whose ``__setattr__`` tracks what is set on them) need no special case;
- an entry goes when its object is collected, and every entry goes when the
  runtime is disabled (:meth:`ObjectRecords.clear`), so the tables hold no
  object alive;
- a lookup is one dict access by ``id``, cheap enough for every
  ``Session.run``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class ObjectTable(Generic[V]):
    """A value per object, by identity; the entry goes when the object is collected or the table cleared."""

    def __init__(self) -> None:
        self._values: dict[int, V] = {}
        # Per key, the finalizer that drops the entry when its object goes; an
        # object that cannot be referenced weakly is held here instead, so that
        # its id is not reused while the entry stands.
        self._watches: dict[int, Any] = {}

    def get(self, obj: object, default: Any = None) -> Any:
        """The value kept for ``obj``, else ``default``."""
        return self._values.get(id(obj), default)

    def __contains__(self, obj: object) -> bool:
        return id(obj) in self._values

    def __len__(self) -> int:
        return len(self._values)

    def __setitem__(self, obj: object, value: V) -> None:
        key = id(obj)
        if key not in self._watches:
            self._watches[key] = self._watch(obj, key)
        self._values[key] = value

    def add(self, obj: object) -> None:
        """Records ``obj`` as a member (its value is True)."""
        self[obj] = True  # type: ignore[assignment]

    def setdefault(self, obj: object, make: Callable[[], V]) -> V:
        """The value kept for ``obj``; ``make()``'s, kept, when there is none."""
        value = self._values.get(id(obj))
        if value is None:
            value = self[obj] = make()
        return value

    def clear(self) -> None:
        """Forgets every entry and stops watching their objects."""
        for watch in self._watches.values():
            if isinstance(watch, weakref.finalize):
                watch.detach()
        self._watches.clear()
        self._values.clear()

    def _watch(self, obj: object, key: int) -> Any:
        try:
            finalizer = weakref.finalize(obj, self._forget, key)
        except TypeError:
            return obj
        finalizer.atexit = False
        return finalizer

    def _forget(self, key: int) -> None:
        self._values.pop(key, None)
        self._watches.pop(key, None)


@dataclass(eq=False)
class ObjectRecords:
    """The runtime's tables, one per fact (key → value).

    Attributes:
        session_args: a script's ``Session`` → the target and config it was
            made with (its shadow sessions are made with them too).
        runners: a script's ``Session`` → its
            :class:`~amp_rewrite.runtime.tf1.session.ShadowRunner`.
        shadow_sessions: the sessions the runtime made for its shadow graphs
            (members); they run unpatched.
        loss_scale_reports: a ``tf.Graph`` → the
            :class:`~amp_rewrite.runtime.loss_scale.tf1_optimizer.Report` of each guarded step built in it.
        scaled_losses: a ``tf.Graph`` → whether the last loss whose gradients
            were scaled in it is finite (a float32 scalar tensor of that graph).
        scaled_elsewhere: the optimizers a loss-scale wrapper (TensorFlow's or
            Keras') already scales (members).
        restore_savers: a ``Saver`` → a Saver over the same variables minus
            the loss-scale state, for float32 checkpoints.
    """

    session_args: ObjectTable[Any] = field(default_factory=ObjectTable)
    runners: ObjectTable[Any] = field(default_factory=ObjectTable)
    shadow_sessions: ObjectTable[bool] = field(default_factory=ObjectTable)
    loss_scale_reports: ObjectTable[tuple] = field(default_factory=ObjectTable)
    scaled_losses: ObjectTable[Any] = field(default_factory=ObjectTable)
    scaled_elsewhere: ObjectTable[bool] = field(default_factory=ObjectTable)
    restore_savers: ObjectTable[Any] = field(default_factory=ObjectTable)

    def clear(self) -> None:
        """Forgets every object (the runtime is disabled)."""
        for table in fields(self):
            getattr(self, table.name).clear()
