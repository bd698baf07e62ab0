"""Regions of a rewritten graph, the names a profile gives them, and the mixed step the times propose."""

import numpy as np
import pytest
import tensorflow as tf

from amp_rewrite.config import Config
from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT
from amp_rewrite.pipeline import rewrite
from amp_rewrite.tune import step_regions
from amp_rewrite.tune.step_regions import ExecutedNames, Region, RegionTimes

BF16 = Config(target="bfloat16", device_type="CPU")


def two_branch_graph(names=("a", "b")):
    """Two MatMul chains, each ending in a float32 Exp (a deny op), then added: two half regions."""
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        outs = []
        for branch in names:
            with tf.name_scope(branch):
                w1 = tf.constant(rng.normal(size=(8, 8)).astype(np.float32), name="w1")
                w2 = tf.constant(rng.normal(size=(8, 8)).astype(np.float32), name="w2")
                h = tf.nn.relu(tf.matmul(x, w1, name="mm1"), name="relu")
                outs.append(tf.exp(tf.matmul(h, w2, name="mm2") * 0.01, name="exp"))
        tf.identity(outs[0] + outs[1], name="out")
    return graph.as_graph_def()


def rewritten(graph_def, config=BF16):
    return rewrite(graph_def, fetches=["out"], config=config)


def dtypes(graph_def) -> dict[str, int]:
    return {n.name: n.attr["T"].type for n in graph_def.node if "T" in n.attr}


def run(graph_def, feed):
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run("out:0", {"x:0": feed})


def test_each_connected_set_of_half_nodes_is_one_region_with_the_casts_at_its_edges():
    result = rewritten(two_branch_graph())
    regions = step_regions.half_regions(result.graph_def, result.casts)
    assert [r.nodes for r in regions] == [("a/mm1", "a/mm2", "a/mul", "a/mul/y", "a/relu", "a/w1", "a/w2"),
                                          ("b/mm1", "b/mm2", "b/mul", "b/mul/y", "b/relu", "b/w1", "b/w2")]
    shared = set(regions[0].casts) & set(regions[1].casts)
    assert len(shared) == 1  # the input's one Cast feeds both branches, which it does not join
    for region in regions:
        assert len(region.casts) == 2 and all(c in result.casts for c in region.casts)
        assert dict(region.ops) == {"MatMul": 2, "Mul": 1, "Relu": 1}
    assert regions[0].digest != regions[1].digest
    assert regions[0].digest == step_regions.half_regions(rewritten(two_branch_graph()).graph_def,
                                                          result.casts)[0].digest


def test_a_region_is_known_by_what_it_computes_not_by_its_names():
    """The same model traced again under other names (a second model in one process) has the same regions."""
    first = rewritten(two_branch_graph())
    again = rewritten(two_branch_graph(names=("model_1/a", "model_1/b")))
    digests = [r.digest for r in step_regions.half_regions(first.graph_def, first.casts)]
    assert digests == [r.digest for r in step_regions.half_regions(again.graph_def, again.casts)]
    assert len(set(digests)) == 2


def test_a_profiled_name_finds_its_region_only_behind_call_names():
    regions = [Region("", ("dense/MatMul",), ("dense/MatMul/Cast",), (("MatMul", 1),)),
               Region("f", ("conv/Conv2D",), (), (("Conv2D", 1),))]
    names = ExecutedNames(regions, call_names={"StatefulPartitionedCall", "model/PartitionedCall"})
    assert names.regions("dense/MatMul") == (0,)
    assert names.regions("dense/MatMul/Cast") == (0,)
    assert names.regions("StatefulPartitionedCall/conv/Conv2D") == (1,)
    assert names.regions("StatefulPartitionedCall/model/PartitionedCall/conv/Conv2D") == (1,)
    # a gradient node named like a forward one is not the forward one's
    assert names.regions("gradient_tape/dense/MatMul") == ()
    assert names.regions("StatefulPartitionedCall/gradient_tape/dense/MatMul") == ()


def times(half_a, float32_a, half_b, float32_b):
    result = rewritten(two_branch_graph())
    regions = step_regions.half_regions(result.graph_def, result.casts)
    return regions, [RegionTimes(regions[0], half_a, float32_a), RegionTimes(regions[1], half_b, float32_b)]


def test_a_region_that_wins_inside_a_step_that_loses_is_proposed_alone():
    _, region_times = times(half_a=1.0, float32_a=3.0, half_b=6.0, float32_b=4.0)
    choice = step_regions.choose(region_times, half_total=8.0, float32_total=7.5, is_half_step=False)
    assert choice is not None and choice.half == {0}
    assert choice.predicted == pytest.approx(6.0)  # the half step less what keeping b float32 saves
    kept = choice.keep_float32("bfloat16")
    assert set(kept) == {"b/mm1", "b/mm2", "b/mul", "b/mul/y", "b/relu", "b/w1", "b/w2"}
    assert kept["b/mm1"] == ("kept float32: in the step, its region (2 MatMul, 1 Mul, 1 Relu) ran 6000.0 ms in "
                             "bfloat16 and 4000.0 ms in float32")


def test_a_losing_region_inside_a_step_that_wins_is_proposed_float32():
    _, region_times = times(half_a=1.0, float32_a=4.0, half_b=3.0, float32_b=2.0)
    choice = step_regions.choose(region_times, half_total=5.0, float32_total=7.0, is_half_step=True)
    assert choice is not None and choice.half == {0}
    assert choice.predicted == pytest.approx(4.0)


@pytest.mark.parametrize("half_a, float32_a, half_b, float32_b, is_half_step", [
    (1.0, 3.0, 1.0, 3.0, True),     # every region wins: the half step is the choice already
    (3.0, 1.0, 3.0, 1.0, False),    # every region loses: float32 is
    (2.9, 3.0, 5.0, 4.0, False),    # a is no faster by the margin
    (1.0, 1.1, 10.0, 9.0, False),   # a wins, but the mixed step would save too little of the float32 step
])
def test_no_mixed_step_is_proposed_where_it_cannot_beat_the_better_pure_step(half_a, float32_a, half_b, float32_b,
                                                                             is_half_step):
    _, region_times = times(half_a, float32_a, half_b, float32_b)
    half_total = half_a + half_b
    float32_total = float32_a + float32_b
    assert step_regions.choose(region_times, half_total=half_total, float32_total=float32_total,
                               is_half_step=is_half_step) is None


def test_a_region_the_profiles_did_not_see_keeps_the_whole_steps_choice():
    _, region_times = times(half_a=1.0, float32_a=3.0, half_b=0.0, float32_b=0.0)
    assert step_regions.kept_half(region_times, is_half_step=False) == {0}
    assert step_regions.kept_half(region_times, is_half_step=True) == {0, 1}


def test_the_mixed_rewrite_keeps_the_chosen_regions_float32_and_computes_like_float32():
    graph_def = two_branch_graph()
    _, region_times = times(half_a=1.0, float32_a=3.0, half_b=6.0, float32_b=4.0)
    choice = step_regions.choose(region_times, half_total=8.0, float32_total=7.5, is_half_step=False)
    kept = choice.keep_float32("bfloat16")
    mixed = rewritten(graph_def, Config(target="bfloat16", device_type="CPU", keep_float32=tuple(kept.items())))
    types = dtypes(mixed.graph_def)
    assert types["a/mm1"] == types["a/mm2"] == types["a/relu"] == DT_BFLOAT16
    assert types["b/mm1"] == types["b/mm2"] == types["b/relu"] == DT_FLOAT
    assert mixed.node_outcomes["b/mm1"]["reason"].endswith("stays float32: kept float32: in the step, its region "
                                                          "(2 MatMul, 1 Mul, 1 Relu) ran 6000.0 ms in bfloat16 and "
                                                          "4000.0 ms in float32")
    feed = np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32)
    expected = run(graph_def, feed)
    np.testing.assert_allclose(run(mixed.graph_def, feed), expected, rtol=0.05, atol=0.02)


def test_keep_float32_names_a_function_node_as_function_node():
    @tf.function
    def step(x):
        w = tf.constant(np.eye(8, dtype=np.float32))
        return tf.matmul(tf.nn.relu(tf.matmul(x, w, name="mm1"), name="relu"), w, name="mm2")

    concrete = step.get_concrete_function(tf.TensorSpec([4, 8], tf.float32))
    graph_def = concrete.graph.as_graph_def()
    fdef = concrete.function_def
    graph_def.library.function.add().CopyFrom(fdef)
    call = graph_def.node.add(name="call", op="PartitionedCall")
    call.input.append("x")
    call.attr["f"].func.name = fdef.signature.name
    call.attr["Tin"].list.type.append(DT_FLOAT)
    call.attr["Tout"].list.type.append(DT_FLOAT)
    graph_def = tf.compat.v1.GraphDef.FromString(graph_def.SerializeToString())
    name = fdef.signature.name
    config = Config(target="bfloat16", device_type="CPU", keep_float32=((f"{name}::mm2", "kept float32: a test"),))
    result = rewrite(graph_def, fetches=["call"], config=config)
    body = {f.signature.name: f for f in result.graph_def.library.function}[name]
    types = {n.name: n.attr["T"].type for n in body.node_def if "T" in n.attr}
    assert types["mm1"] == DT_BFLOAT16 and types["mm2"] == DT_FLOAT
    assert result.node_outcomes[f"{name}::mm2"]["reason"].endswith("stays float32: kept float32: a test")
