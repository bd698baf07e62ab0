"""A multi-worker job answers each question once: the chief joins its workers' answers, every worker reads it.

Threads play the workers, on a store that behaves as the coordination
service's (inserts never overwrite, reads wait).
"""

import threading
import time

from helpers import KeyValueStore

from amp_rewrite.runtime.job import Job, first_collective

CHIEF, WORKER1, WORKER2 = ("worker", 0), ("worker", 1), ("worker", 2)
THREE = (CHIEF, WORKER1, WORKER2)


def decide_in_threads(store, answers: dict, *, wait=2.0, delays=None):
    """Each task with an answer asks the job in a thread (after its delay); the chief's join sums the ``n``."""
    results, joined = {}, []

    def join(heard):
        joined.append(sorted(heard))
        return {"n": sum(answer["n"] for answer in heard.values())}

    def worker(task):
        time.sleep((delays or {}).get(task, 0.0))
        job = Job(THREE, task, store, wait)
        results[task] = job.decide("step/0/pure", answers[task], join, {"n": -answers[task]["n"]})

    threads = [threading.Thread(target=worker, args=(task,)) for task in answers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10 * wait + 5)
    return results, joined


def test_every_worker_reads_the_answer_the_chief_joined_from_all_of_them():
    store = KeyValueStore()
    results, joined = decide_in_threads(store, {CHIEF: {"n": 1}, WORKER1: {"n": 2}, WORKER2: {"n": 4}},
                                        delays={CHIEF: 0.2})
    assert results == dict.fromkeys(THREE, {"n": 7})
    assert joined == [sorted(THREE)]
    assert store.values["amp_rewrite/step/0/pure/worker/2"] == '{"n": 4}'


def test_the_chief_joins_the_answers_that_came_within_the_wait():
    results, joined = decide_in_threads(KeyValueStore(), {CHIEF: {"n": 1}, WORKER1: {"n": 2}}, wait=0.2)
    assert joined == [[CHIEF, WORKER1]]  # worker 2 never answered
    assert results == {CHIEF: {"n": 3}, WORKER1: {"n": 3}}


def test_a_worker_the_chief_never_answers_writes_its_fallback_and_a_later_chief_follows_it():
    store = KeyValueStore()
    early, _ = decide_in_threads(store, {WORKER1: {"n": 2}}, wait=0.1)
    assert early == {WORKER1: {"n": -2}}
    late, joined = decide_in_threads(store, {CHIEF: {"n": 1}, WORKER2: {"n": 4}}, wait=0.1)
    assert late == {CHIEF: {"n": -2}, WORKER2: {"n": -2}}  # the first answer written is the job's
    assert joined == [sorted(THREE)]  # the chief joined, but its answer came second


def test_collective_ops_are_those_that_exchange_values_with_peers():
    assert first_collective(["MatMul", "CollectiveReduceV2", "NcclAllReduce"]) == "CollectiveReduceV2"
    assert first_collective(["MatMul", "Identity"]) is None
