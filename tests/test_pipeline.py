"""rewrite(): purity, determinism, idempotence, fetch handling, levels end to end."""

import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import CPU, amp, assert_same_outputs_within_half, half_nodes, rng, tf1

from amp_rewrite import Config, GraphError, pipeline, rewrite
from amp_rewrite.errors import PaintingRuleError
from amp_rewrite.paint import context as paint_context
from amp_rewrite.paint import rules as painting


def mixed_graph():
    g = tf.Graph()
    r = rng(3)
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        h = x
        for i in range(3):
            w = tf.constant(r.standard_normal((16, 16)).astype(np.float32) * 0.3, name=f"w{i}")
            h = tf.nn.relu(tf.nn.bias_add(tf.matmul(h, w, name=f"mm{i}"), tf.zeros([16]), name=f"bias{i}"))
            h = tf.tanh(h, name=f"tanh{i}")
        logits = tf.identity(h, name="logits")
        tf.reduce_mean(tf.exp(logits), name="loss")
    return g.as_graph_def()


def feeds():
    return {"x": rng(4).standard_normal((4, 16)).astype(np.float32)}


def test_caller_graph_is_not_mutated():
    gd = mixed_graph()
    before = gd.SerializeToString(deterministic=True)
    amp(gd, ["logits", "loss"])
    assert gd.SerializeToString(deterministic=True) == before


def test_in_place_rewrites_the_given_graph_to_the_same_bytes_as_a_copy():
    copied = amp(mixed_graph(), ["logits", "loss"])
    gd = mixed_graph()
    result = rewrite(gd, fetches=["logits", "loss"], config=CPU, in_place=True)
    assert result.graph_def is gd
    assert gd.SerializeToString(deterministic=True) == copied.graph_def.SerializeToString(deterministic=True)
    assert result.report()["nodes"] == copied.report()["nodes"]
    assert result.nodes_total == copied.nodes_total == len(mixed_graph().node)


def test_in_place_still_dumps_the_float32_graph_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv("AMP_REWRITE_DUMP_DIR", str(tmp_path))
    original = mixed_graph()
    gd = mixed_graph()
    result = rewrite(gd, fetches=["logits", "loss"], config=None, in_place=True)
    before = tf1.GraphDef.FromString(next(tmp_path.glob("*_before.pb")).read_bytes())
    after = tf1.GraphDef.FromString(next(tmp_path.glob("*_after.pb")).read_bytes())
    assert before == original and after == result.graph_def and after != original


def test_output_is_byte_identical_across_runs():
    a = amp(mixed_graph(), ["logits", "loss"]).graph_def.SerializeToString(deterministic=True)
    b = amp(mixed_graph(), ["logits", "loss"]).graph_def.SerializeToString(deterministic=True)
    assert a == b


def test_rewriting_the_output_again_changes_nothing():
    once = amp(mixed_graph(), ["logits", "loss"])
    twice = amp(once.graph_def, ["logits", "loss"])
    assert twice.graph_def == once.graph_def
    assert twice.converted == [] and twice.casts == []


def test_fetch_outputs_keep_dtype_and_numbers():
    gd = mixed_graph()
    out = amp(gd, ["logits", "loss"]).graph_def
    assert {"mm0", "mm1", "mm2", "tanh0"} <= half_nodes(out)
    assert_same_outputs_within_half(gd, out, ["logits", "loss"], feeds())


def test_default_fetches_are_nodes_without_consumers():
    result = amp(mixed_graph())
    assert result.report()["nodes"]["loss"]["colour"] == "preserved"


def test_unknown_fetch_is_an_error_naming_it():
    with pytest.raises(GraphError, match="'nope'"):
        amp(mixed_graph(), ["nope"])


def test_fetch_of_a_port_the_node_lacks_is_an_error_naming_the_node_and_its_outputs():
    with pytest.raises(GraphError, match=r"^fetch 'mm0:7': node mm0 \(op MatMul\) has 1 output$"):
        rewrite(mixed_graph(), fetches=["mm0:7"], config=CPU)


def test_fetch_of_a_port_the_node_has_keeps_that_node():
    result = rewrite(mixed_graph(), fetches=["logits:0", "loss:0"], config=CPU)
    assert result.report()["nodes"]["logits"]["colour"] == "preserved"
    assert {"mm0", "mm1", "mm2"} <= half_nodes(result.graph_def)


def test_tensor_cores_only_converts_allow_ops_alone():
    out = amp(mixed_graph(), ["logits", "loss"], level="TENSOR_CORES_ONLY").graph_def
    assert half_nodes(out) == {"mm0", "mm1", "mm2", "w0", "w1", "w2"}


def test_treat_infer_as_deny_keeps_infer_ops_float32():
    out = amp(mixed_graph(), ["logits", "loss"], level="TREAT_INFER_AS_DENY").graph_def
    assert not {"tanh0", "bias0"} & half_nodes(out)
    assert "mm0" in half_nodes(out)


def test_unsafe_force_all_converts_even_deny_ops():
    gd = mixed_graph()
    out = amp(gd, ["logits"], level="UNSAFE_FORCE_ALL").graph_def
    assert {"Exp", "loss"} <= half_nodes(out)
    assert_same_outputs_within_half(gd, out, ["logits"], feeds())


def test_environment_configures_the_default_config(monkeypatch):
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL", "TENSOR_CORES_ONLY")
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_REMOVE", "MatMul")
    result = rewrite(mixed_graph(), fetches=["logits", "loss"])
    assert result.config.level == "TENSOR_CORES_ONLY"
    assert result.converted == []


def test_report_has_the_promised_fields():
    report = amp(mixed_graph(), ["logits", "loss"]).report()
    assert {"target", "nodes_total", "converted", "casts", "fp16_flop_share", "nodes"} <= set(report)
    assert report["fp16_flop_share"] == pytest.approx(1.0)
    tanh = report["nodes"]["tanh0"]
    assert tanh["colour"] == "allow" and tanh["cause"] and tanh["rule"]


def test_flop_share_counts_the_float32_matmul():
    result = amp(mixed_graph(), ["mm1", "logits", "loss"])  # mm1 fetched: stays float32
    assert result.half_flop_share == pytest.approx(2 / 3)
    assert "66.7% of MatMul/Conv FLOPs in float16" in result.summary()


def test_bfloat16_on_cpu_runs():
    gd = mixed_graph()
    out = rewrite(gd, fetches=["logits", "loss"], target="bfloat16", config=CPU).graph_def
    assert "mm0" in half_nodes(out)
    assert_same_outputs_within_half(gd, out, ["logits", "loss"], feeds(), rtol=5e-2, atol=5e-2)


def test_gpu_device_type_on_a_cpu_build_checks_opdefs_only():
    result = rewrite(mixed_graph(), fetches=["logits", "loss"], config=Config(device_type="GPU"))
    assert "mm0" in result.converted


RULE_LINE = re.compile(r"^(\w+): \+allow (\d+), \+deny (\d+), unmarked (\d+)$")


def test_each_rule_logs_what_it_changed_and_every_node_its_reason(caplog):
    caplog.set_level(logging.DEBUG, logger="amp_rewrite.pipeline")
    result = amp(mixed_graph(), ["logits", "loss"])
    messages = [r.getMessage() for r in caplog.records if r.name == "amp_rewrite.pipeline"]
    changed = [RULE_LINE.match(m).groups() for m in messages if RULE_LINE.match(m)]
    assert [name for name, *_ in changed] == [rule.__name__ for rule in painting.RULES]
    allowed = {name: int(a) for name, a, _, _ in changed}
    assert allowed["paint_allow_ops"] == 3  # mm0, mm1, mm2: one type attr each
    # no rule here denies a painted vertex, so the changes add up to the half nodes
    # the rules painted (each has one float type attr; folded Consts are not painted)
    painted = [name for name, entry in result.node_outcomes.items()
               if entry["colour"] == "allow" and name not in result.applied.folded_consts]
    assert sum(int(a) - int(u) for _, a, _, u in changed) == len(painted) > 3
    reasons = [entry["reason"] for entry in result.node_outcomes.values()]
    assert [m for m in messages if m in set(reasons)] == reasons


def test_decision_sentences_are_built_only_when_debug_is_on(monkeypatch, caplog):
    built = []
    outcomes = pipeline.node_outcomes
    monkeypatch.setattr(pipeline, "node_outcomes", lambda *args: built.append(1) or outcomes(*args))
    caplog.set_level(logging.INFO, logger="amp_rewrite.pipeline")
    amp(mixed_graph(), ["logits", "loss"])
    assert built == []
    caplog.set_level(logging.DEBUG, logger="amp_rewrite.pipeline")
    amp(mixed_graph(), ["logits", "loss"])
    assert built == [1]


def test_an_unexpected_failure_inside_a_rule_names_the_rule(monkeypatch):
    def broken(self, vid):
        raise ValueError("boom")

    monkeypatch.setattr(paint_context.PaintContext, "can_convert", broken)
    expected = (r"^painting rule paint_allow_ops failed \(after find_tensor_list_clusters, "
                r"deny_escaping_tensor_lists\): ValueError: boom$")
    with pytest.raises(PaintingRuleError, match=expected) as info:
        amp(mixed_graph(), ["logits", "loss"])
    assert info.value.rule == "paint_allow_ops" and isinstance(info.value.__cause__, ValueError)
    assert info.value.ran_before == ("find_tensor_list_clusters", "deny_escaping_tensor_lists")


def test_a_failing_spread_rule_names_every_rule_that_ran_before_it(monkeypatch):
    def broken(ctx, painting):
        raise KeyError("lost")

    monkeypatch.setattr(painting, "paint_between_allow", broken)
    monkeypatch.setattr(painting, "SPREAD_RULES", tuple(broken if r.__name__ == "paint_between_allow" else r
                                                        for r in painting.SPREAD_RULES))
    with pytest.raises(PaintingRuleError) as info:
        amp(mixed_graph(), ["logits", "loss"])
    assert info.value.rule == "broken"
    assert info.value.ran_before == ("find_tensor_list_clusters", *(r.__name__ for r in painting.ROOT_RULES),
                                     "paint_deny_forward", "match_tensor_list_clusters")
    assert "(after find_tensor_list_clusters, deny_escaping_tensor_lists, paint_allow_ops, " in str(info.value)


def test_our_own_errors_inside_a_rule_keep_their_text(monkeypatch):
    message = "node mm0 (op MatMul): attr T holds no DataType"

    def refuses(self, vid):
        raise GraphError(message)

    monkeypatch.setattr(paint_context.PaintContext, "can_convert", refuses)
    with pytest.raises(GraphError) as info:
        amp(mixed_graph(), ["logits", "loss"])
    assert str(info.value) == message
