"""The runtime's records: what it knows of TensorFlow's objects is kept on its value, not on the objects."""

import gc

import numpy as np
from helpers import mlp_session_graph, runner_of, tf1

from amp_rewrite import runtime
from amp_rewrite.runtime.records import ObjectRecords, ObjectTable
from amp_rewrite.runtime.settings import RuntimeSettings


class Thing:
    """An object that can be referenced weakly, as TensorFlow's sessions and graphs can."""


def test_an_entry_goes_when_its_object_is_collected():
    table, kept, dropped = ObjectTable(), Thing(), Thing()
    table[kept] = "kept"
    table[dropped] = "dropped"
    del dropped
    gc.collect()
    assert len(table) == 1
    assert table.get(kept) == "kept"


class AlwaysEqual(Thing):
    """Equal to everything and unhashable, as a Keras variable or a numpy array is."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other):
        return True


def test_entries_are_by_identity_not_equality():
    table, a, b = ObjectTable(), AlwaysEqual(), AlwaysEqual()
    table.add(a)
    assert a in table and b not in table


def test_an_object_that_cannot_be_referenced_weakly_is_held_until_cleared():
    table = ObjectTable()
    key, equal = tuple(range(2)), tuple(range(2))  # tuples take no weak references
    table[key] = "value"
    assert table.get(equal) is None  # an equal tuple is another object
    assert table.get(key) == "value"
    table.clear()
    assert len(table) == 0 and table.get(key) is None


def test_clear_stops_watching_the_objects():
    table, thing = ObjectTable(), Thing()
    table[thing] = 1
    table.clear()
    table[thing] = 2  # watched afresh
    del thing
    gc.collect()
    assert len(table) == 0


def test_setdefault_makes_a_value_once():
    table, thing, made = ObjectTable(), Thing(), []

    def make():
        made.append(1)
        return "made"

    assert table.setdefault(thing, make) == "made"
    assert table.setdefault(thing, make) == "made"
    assert made == [1]


def test_records_clear_every_table():
    records, thing = ObjectRecords(), Thing()
    records.runners[thing] = "runner"
    records.scaled_elsewhere.add(thing)
    records.clear()
    assert thing not in records.runners and thing not in records.scaled_elsewhere


def _attributes_of_ours(obj) -> list[str]:
    return [name for name in dir(obj) if "amp_rewrite" in name]


def test_a_session_run_by_the_runtime_carries_no_trace_of_it(amp_runtime):
    graph = mlp_session_graph()
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        want = sess.run("y:0", {"x:0": np.ones((4, 8), np.float32)})
    amp_runtime(RuntimeSettings(target="float16"))
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        got = sess.run("y:0", {"x:0": np.ones((4, 8), np.float32)})
        runner = runner_of(sess)
        assert runner is not None
        shadow_session = runner.shadow_session
        records = runtime.current_runtime().objects
        assert shadow_session in records.shadow_sessions and sess not in records.shadow_sessions
        assert _attributes_of_ours(sess) == [] and _attributes_of_ours(graph) == []
        assert _attributes_of_ours(shadow_session) == []
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
    runtime.disable()
    assert len(records.runners) == 0 and len(records.session_args) == 0
