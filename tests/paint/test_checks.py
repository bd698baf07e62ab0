"""Structural postconditions: each check finds its own breakage, and the pipeline runs them on request."""

from dataclasses import replace

import pytest
import tensorflow as tf
from helpers import CPU, F16, F32, amp, tf1

from amp_rewrite import Config, pipeline
from amp_rewrite.paint.checks import PostconditionError, ensure, violations


def _graph():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        y = tf.matmul(x, x, name="mm")
        tf.nn.relu(y, name="relu")
        tf.reduce_sum(tf.exp(y), name="out")
    return g.as_graph_def()


def _node(graph_def, name):
    return next(n for n in graph_def.node if n.name == name)


def _rewritten():
    graph_def = _graph()
    result = amp(graph_def, fetches=["out"])
    assert result.casts and _node(result.graph_def, "mm").attr["T"].type == F16
    return graph_def, result


def _found(before, after, result):
    return {v.check: v.detail for v in violations(before, after, casts=result.casts, fetches=["out"])}


def test_a_correct_rewrite_breaks_nothing():
    before, result = _rewritten()
    assert _found(before, result.graph_def, result) == {}
    ensure(before, result.graph_def, casts=result.casts, fetches=["out"])


def test_an_edge_joining_two_dtypes_is_named():
    before, result = _rewritten()
    _node(result.graph_def, "relu").attr["T"].type = F32  # reads mm, which is half now
    found = _found(before, result.graph_def, result)
    assert "mm:0 -> relu input 0" in found["edge types"]


def test_an_inserted_cast_that_changes_nothing_is_named():
    before, result = _rewritten()
    cast = _node(result.graph_def, result.casts[0])
    cast.attr["DstT"].type = cast.attr["SrcT"].type
    found = _found(before, result.graph_def, result)
    assert result.casts[0] in found["casts change a type"]


def test_a_new_half_round_trip_is_named():
    before, result = _rewritten()
    after = result.graph_def
    widen = after.node.add(name="widen", op="Cast", input=["mm"])
    widen.attr["SrcT"].type, widen.attr["DstT"].type = F16, F32
    narrow = after.node.add(name="narrow", op="Cast", input=["widen"])
    narrow.attr["SrcT"].type, narrow.attr["DstT"].type = F32, F16
    found = _found(before, after, result)
    assert "('widen', 'narrow')" in found["no half round trip"]
    assert violations(before, after, casts=result.casts, fetches=["out"], left_alone=["narrow"]) == []


def test_a_fetch_that_changed_dtype_is_named():
    before, result = _rewritten()
    _node(result.graph_def, "out").attr["T"].type = F16
    found = _found(before, result.graph_def, result)
    assert "out:0" in found["fetch dtypes"]


def test_checks_are_requested_by_either_variable():
    assert not Config.from_env({}).is_checking
    assert Config.from_env({"AMP_REWRITE_CHECK": "1"}).is_checking
    assert Config.from_env({"AMP_REWRITE_STRICT": "true"}).is_checking
    assert not Config.from_env({"AMP_REWRITE_CHECK": "0"}).is_checking


def test_the_pipeline_reports_a_broken_output_by_name_when_asked(monkeypatch):
    _break_relu(monkeypatch)
    pipeline.rewrite(_graph(), fetches=["out"], config=CPU)  # not asked: no check
    with pytest.raises(PostconditionError, match=r"\(edge types\): .*mm:0 -> relu input 0"):
        pipeline.rewrite(_graph(), fetches=["out"], config=replace(CPU, is_checking=True))


def test_the_environment_asks_for_the_checks_of_a_rewrite_without_a_config(monkeypatch):
    """``rewrite()`` without a config reads the environment once, through ``Config.from_env``."""
    _break_relu(monkeypatch)
    monkeypatch.setenv("AMP_REWRITE_CHECK", "1")
    pipeline.rewrite(_graph(), fetches=["out"], config=CPU)  # an explicit config says no
    with pytest.raises(PostconditionError, match=r"\(edge types\)"):
        pipeline.rewrite(_graph(), fetches=["out"], config=None)


def _break_relu(monkeypatch):
    """Makes the pipeline undo one retype after painting, leaving a half -> float32 edge into ``relu``."""
    real = pipeline.apply_painting

    def broken(ctx, painting, was_float32):
        applied = real(ctx, painting, was_float32)
        for node in ctx.graph.graph_def.node:
            if node.name == "relu":
                node.attr["T"].type = F32
        return applied

    monkeypatch.setattr(pipeline, "apply_painting", broken)
