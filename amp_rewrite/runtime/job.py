"""The workers of a multi-worker job answering one question together, through the job's key-value store.

Under ``MultiWorkerMirroredStrategy`` every worker must run the same
collectives in the same order, so whatever picks the body a worker runs
must pick its peers' too. The strategy's coordination service gives the job
a key-value store whose inserts never overwrite a key and whose reads wait;
a :class:`Job` answers each question in one round through it
(:meth:`Job.decide`):

- every worker publishes its own answer under the round's key;
- the chief (the first task: ``chief 0``, else ``worker 0``) waits up to
  ``wait`` seconds for its peers' answers, joins those that came into the
  job's answer, and writes it;
- every other worker waits up to twice ``wait`` for that answer; one that
  reads none writes its own fallback instead. The store keeps the first
  answer written, so every worker reads the same one, however late it is.

The multi-worker agreement (:mod:`amp_rewrite.runtime.multi_worker`) makes
the job once the workers agreed on a half precision; the trials of
``tf.function`` steps that run collective ops answer through it
(:mod:`amp_rewrite.runtime.tf2.job_rounds`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from amp_rewrite import tf_internals

#: Every key the runtime writes in the job's store begins with this.
KEY_PREFIX = "amp_rewrite"
#: Op types that exchange values with other workers or devices: every peer must run the same body.
COLLECTIVE_PREFIXES = ("Collective", "Nccl")

Task = tuple[str, int]
Answer = dict[str, Any]


class Store(Protocol):
    """The job's key-value store: inserts never overwrite; reads wait up to a timeout."""

    def insert(self, key: str, value: str) -> bool: ...

    def read(self, key: str, timeout_seconds: float) -> str | None: ...


class JobStore:
    """The key-value store of TensorFlow's coordination service."""

    def insert(self, key: str, value: str) -> bool:
        return tf_internals.insert_job_value(key, value)

    def read(self, key: str, timeout_seconds: float) -> str | None:
        return tf_internals.read_job_value(key, timeout_seconds)


def name(task: Task) -> str:
    return f"{task[0]} {task[1]}"


def first_collective(op_types: Iterable[str]) -> str | None:
    """The first of ``op_types`` that exchanges values with peers (a collective, NCCL), or None."""
    return next((op_type for op_type in op_types if op_type.startswith(COLLECTIVE_PREFIXES)), None)


@dataclass(frozen=True)
class Job:
    """The workers that run a job's collectives, this one among them, and the store they answer through.

    Attributes:
        tasks: the workers, the chief first.
        me: this worker.
        store: the job's key-value store.
        wait: how long the chief waits for its peers' answers, in seconds (the others wait twice that).
        clock: seconds, for the chief's deadline.
    """

    tasks: tuple[Task, ...]
    me: Task
    store: Store
    wait: float
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    @property
    def chief(self) -> Task:
        return self.tasks[0]

    def decide(self, key: str, own: Mapping[str, Any], join: Callable[[dict[Task, Answer]], Answer],
               fallback: Answer) -> Answer:
        """The job's answer to the question ``key``, the same on every worker.

        Args:
            key: the question, unique in the job (``step/0/pure``).
            own: this worker's answer, published for the chief (JSON: numbers, strings, lists).
            join: on the chief, the job's answer from the answers heard within the wait (its own
                among them), by task.
            fallback: on another worker, the answer it writes when the chief wrote none in time.

        Raises whatever the store raises.
        """
        base = f"{KEY_PREFIX}/{key}"
        self.store.insert(f"{base}/{self.me[0]}/{self.me[1]}", json.dumps(own, sort_keys=True))
        if self.me == self.chief:
            deadline = self.clock() + self.wait
            heard: dict[Task, Answer] = {self.me: dict(own)}
            for task in self.tasks[1:]:
                text = self.store.read(f"{base}/{task[0]}/{task[1]}", max(0.0, deadline - self.clock()))
                if text is not None:
                    heard[task] = json.loads(text)
            candidate = join(heard)
        else:
            text = self.store.read(f"{base}/answer", 2 * self.wait)
            if text is not None:
                return json.loads(text)
            candidate = fallback
        if self.store.insert(f"{base}/answer", json.dumps(candidate, sort_keys=True)):
            return candidate
        text = self.store.read(f"{base}/answer", self.wait)
        if text is None:
            raise RuntimeError(f"the job's key {base}/answer exists but cannot be read")
        return json.loads(text)
