"""Values beyond the half range: the ops reading a mask's -1e9 (or a weight of 1e5) stay float32.

The graphs are masked attentions as Keras and hand-written TF1 code build
them: ``softmax(q @ k^T + adder) @ v`` with ``adder = (1 - mask) * -1e9``,
or ``where(mask, scores, -1e9)``. One example's last query row is fully
masked: cast to float16, -1e9 is -inf, that row is all -inf and its softmax
NaN. bfloat16 holds -1e9, but not ``tf.float32.min``, which a Cast rounds to
-inf. Nodes are named by the colour they must end with where that does not
depend on the test: the adder, the logits and the softmax are float32 for
an adder beyond the target's range and half for one within it.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import BF16, F16, F32, amp, assert_same_outputs_within_half, casts, node_types, rng, run, tf1

from amp_rewrite.paint import rules as painting
from amp_rewrite.paint.explain import disagreements
from amp_rewrite.paint.half_range import BFLOAT16_CAST_LIMIT, REASON

BATCH, QUERIES, WIDTH = 2, 4, 8
MASK = np.tril(np.ones((QUERIES, QUERIES), np.float32))[None].repeat(BATCH, axis=0)
MASK[1, -1] = 0.0  # a fully masked row: a padded query position
FEEDS = {"q": rng(1).standard_normal((BATCH, QUERIES, WIDTH)).astype(np.float32), "mask": MASK}


def attention(adder="product", *, large=-1e9, training=False):
    """``out = softmax(scores + adder) @ v`` for a mask adder of the kind named, and a loss (a GraphDef, fetches).

    ``product``: ``(1 - mask) * large`` (tf_keras's ``Softmax``); ``select``:
    ``where(mask > 0.5, scores, large)`` (Keras 3's); ``minimum``: the
    product with ``float32.min``. With ``training`` the projections are
    variables and a ``train`` op takes one SGD step on the loss.
    """
    r = rng(2)
    weight = (tf.Variable if training else tf.constant)
    g = tf.Graph()
    with g.as_default():
        q = tf1.placeholder(tf.float32, [BATCH, QUERIES, WIDTH], name="q")
        mask = tf1.placeholder(tf.float32, [BATCH, QUERIES, QUERIES], name="mask")
        wk = weight(r.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.3, name="wk")
        wv = weight(r.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.3, name="wv")
        k = tf.matmul(q, wk, name="allow_k")
        v = tf.matmul(q, wv, name="allow_v")
        scores = tf.matmul(q, k, transpose_b=True, name="allow_scores")
        if adder == "select":
            logits = tf.where(mask > 0.5, scores, large, name="logits")
        else:
            large = tf.float32.min if adder == "minimum" else large
            logits = tf.add(scores, tf.multiply(1.0 - mask, large, name="adder"), name="logits")
        probs = tf.nn.softmax(logits, name="probs")
        out = tf.matmul(probs, v, name="allow_out")
        loss = tf.reduce_mean(tf.square(out), name="loss")
        fetches = ["loss"]
        if training:
            fetches.append(tf1.train.GradientDescentOptimizer(0.5).minimize(loss).name)
            tf1.variables_initializer(tf1.global_variables(), name="init")
    return g.as_graph_def(), fetches


def assert_attention_painted(graph_def, *, masking=F32, half=F16):
    types = node_types(graph_def)
    want = {"allow_k": half, "allow_v": half, "allow_scores": half, "logits": masking, "probs": masking,
            "allow_out": half}
    assert {name: types[name] for name in want} == want


@pytest.mark.parametrize("adder", ["product", "select", "minimum"])
def test_a_mask_adder_beyond_float16_stays_float32_up_to_the_softmax(adder):
    graph_def, fetches = attention(adder)
    result = amp(graph_def, fetches)
    assert_attention_painted(result.graph_def)
    want, got = assert_same_outputs_within_half(graph_def, result.graph_def, fetches, FEEDS)
    assert np.isfinite(got[0])
    assert disagreements(result) == []


def test_the_masked_attention_costs_one_cast_more_than_its_half_adder():
    # The Cast of the scores to float32 and of the softmax back to half replace the adder's Cast to half.
    graph_def, fetches = attention("product")
    out = amp(graph_def, fetches).graph_def
    assert sorted(c.input[0] for c in casts(out)) == ["allow_out", "allow_scores", "probs", "q"]


def test_a_tf1_attention_with_a_minus_1e9_adder_trains_finite_and_like_float32():
    graph_def, fetches = attention("product", training=True)
    result = amp(graph_def, fetches)
    assert_attention_painted(result.graph_def)

    def losses(gd):
        graph = tf.Graph()
        with graph.as_default():
            tf1.import_graph_def(gd, name="")
        feed = {graph.get_tensor_by_name(f"{name}:0"): value for name, value in FEEDS.items()}
        with tf1.Session(graph=graph) as session:
            session.run(graph.get_operation_by_name("init"))
            return [session.run([graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name(fetches[1])],
                                feed)[0] for _ in range(4)]

    want, got = losses(graph_def), losses(result.graph_def)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=2e-2)
    assert want[-1] < want[0]


@pytest.mark.parametrize("large", [-1e4, -65504.0])
def test_an_adder_within_float16_goes_half_with_the_scores(large):
    graph_def, fetches = attention("product", large=large)
    result = amp(graph_def, fetches)
    assert_attention_painted(result.graph_def, masking=F16)
    assert node_types(result.graph_def)["adder"] == F32  # an infer op fed by no half op, cast to half (exact)
    assert not any(REASON in entry["reason"] for entry in result.node_outcomes.values())


def test_the_reason_names_the_constant_and_explain_follows_it_back():
    result = amp(*attention("product"))
    outcomes = result.node_outcomes
    assert outcomes["adder"]["reason"].startswith(
        f"adder (Mul) stays float32: {REASON} (Const adder/y holds |value| up to 1e+09, float16 reaches 65504)")
    assert REASON in outcomes["logits"]["reason"] and outcomes["logits"]["cause"] == "adder"
    assert "downstream of a deny-list op" in outcomes["probs"]["reason"] and outcomes["probs"]["cause"] == "logits"


def big_weight_graph(*, through_product: bool):
    """``allow_mm2(relu(mm1(x, w1)), w2)`` where ``mm1`` reads a weight of 1e5 (through an Identity), or a
    product of products of x with 1e9 and 1e-9 (in range, and not followed)."""
    r = rng(3)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        if through_product:
            scaled = tf.multiply(tf.multiply(x, 1e9, name="deny_mul1"), 1e-9, name="deny_mul2")
            h = tf.matmul(scaled, r.standard_normal((8, 8)).astype(np.float32), name="allow_mm1")
        else:
            w1 = np.full((8, 8), 1e-5, np.float32)
            w1[0, 0] = 1e5
            h = tf.matmul(x * 1e-5, tf.identity(tf.constant(w1), name="deny_read"), name="deny_mm1")
        h = tf.nn.relu(h, name="relu")
        tf.reduce_sum(tf.matmul(h, r.standard_normal((8, 8)).astype(np.float32), name="allow_mm2"), name="total")
    return g.as_graph_def()


@pytest.mark.parametrize("through_product", [False, True])
def test_an_allow_op_reading_a_large_value_stays_float32_and_one_after_a_product_of_products_goes_half(
        through_product):
    graph_def = big_weight_graph(through_product=through_product)
    result = amp(graph_def, ["total"])
    types = node_types(result.graph_def)
    for name in ("deny_read", "deny_mm1", "deny_mul1", "deny_mul2", "allow_mm1", "allow_mm2"):
        if name in types:
            assert types[name] == (F16 if name.startswith("allow_") else F32), (name, types[name])
    feeds = {"x": rng(4).standard_normal((4, 8)).astype(np.float32)}
    want, got = assert_same_outputs_within_half(graph_def, result.graph_def, ["total"], feeds, rtol=5e-2, atol=1.0)
    assert np.isfinite(got[0])


def attention_in_a_function(*, adder_inside: bool):
    """The attention's softmax in a tf.function called from a TF1 graph; the -1e9 inside it, or an argument."""

    @tf.function
    def masked_softmax(scores, mask_or_adder):
        adder = (1.0 - mask_or_adder) * -1e9 if adder_inside else mask_or_adder
        return tf.nn.softmax(scores + adder)

    r = rng(5)
    g = tf.Graph()
    with g.as_default():
        q = tf1.placeholder(tf.float32, [BATCH, QUERIES, WIDTH], name="q")
        mask = tf1.placeholder(tf.float32, [BATCH, QUERIES, QUERIES], name="mask")
        scores = tf.matmul(q, q, transpose_b=True, name="allow_scores")
        argument = mask if adder_inside else tf.multiply(1.0 - mask, -1e9, name="adder")
        probs = masked_softmax(scores, argument)
        v = tf.matmul(q, r.standard_normal((WIDTH, WIDTH)).astype(np.float32), name="allow_v")
        tf.reduce_mean(tf.square(tf.matmul(probs, v, name="allow_out")), name="loss")
    return g.as_graph_def()


@pytest.mark.parametrize("adder_inside", [True, False])
def test_the_constant_is_followed_into_and_inside_functions(adder_inside):
    graph_def = attention_in_a_function(adder_inside=adder_inside)
    result = amp(graph_def, ["loss"])
    bodies = [f for f in result.graph_def.library.function if any(n.op == "Softmax" for n in f.node_def)]
    assert len(bodies) == 1
    inside = {n.op: n.attr["T"].type for n in bodies[0].node_def if n.op in ("Mul", "AddV2", "Softmax")}
    assert inside == ({"Mul": F32, "AddV2": F32, "Softmax": F32} if adder_inside else {"AddV2": F32, "Softmax": F32})
    types = node_types(result.graph_def)
    assert types["allow_scores"] == types["allow_out"] == F16
    want, got = assert_same_outputs_within_half(graph_def, result.graph_def, ["loss"], FEEDS)
    assert np.isfinite(got[0])


@pytest.mark.parametrize("adder", ["product", "select"])
def test_a_minus_1e9_adder_goes_bfloat16_unchanged_by_the_rule(monkeypatch, adder):
    graph_def, fetches = attention(adder)
    with_rule = amp(graph_def, fetches, target="bfloat16").graph_def
    monkeypatch.setattr(painting, "ROOT_RULES", tuple(r for r in painting.ROOT_RULES
                                                      if r is not painting.keep_out_of_range_values_float32))
    without = amp(graph_def, fetches, target="bfloat16").graph_def
    assert with_rule.SerializeToString(deterministic=True) == without.SerializeToString(deterministic=True)
    assert node_types(with_rule)["logits"] == BF16


def test_a_float32_min_adder_stays_float32_in_bfloat16_and_the_masked_row_stays_finite():
    # tf.float32.min rounds to -inf in bfloat16: (1 - mask) * -inf is NaN even where nothing is masked.
    graph_def, fetches = attention("minimum")
    result = amp(graph_def, [*fetches, "probs"], target="bfloat16")
    assert_attention_painted(result.graph_def, half=BF16)
    want, got = assert_same_outputs_within_half(graph_def, result.graph_def, [*fetches, "probs"], FEEDS)
    assert np.all(np.isfinite(got[1]))
    np.testing.assert_allclose(got[1][1, -1], np.full(QUERIES, 1.0 / QUERIES), rtol=1e-6)  # the masked row
    assert disagreements(result) == []
    assert result.node_outcomes["adder"]["reason"].startswith(
        f"adder (Mul) stays float32: {REASON} (Const adder/y holds |value| up to 3.40282e+38, bfloat16 reaches "
        "3.38953e+38): kept float32, as a deny-list op, since a Cast to bfloat16 would make it infinite")


def test_the_bfloat16_limit_is_the_largest_float32_whose_cast_is_finite():
    limit = np.float32(BFLOAT16_CAST_LIMIT)
    assert float(limit) == BFLOAT16_CAST_LIMIT  # a float32 value
    beyond = np.nextafter(limit, np.float32(np.inf))
    cast = tf.cast(tf.constant([limit, -limit, beyond, -beyond]), tf.bfloat16).numpy().astype(np.float32)
    assert np.all(np.isfinite(cast[:2])) and np.all(np.isinf(cast[2:]))


@pytest.mark.parametrize("large, kept", [(-BFLOAT16_CAST_LIMIT, False),
                                         (-float(np.nextafter(np.float32(BFLOAT16_CAST_LIMIT), np.float32(np.inf))),
                                          True)])
def test_bfloat16_keeps_float32_exactly_the_adders_its_cast_makes_infinite(large, kept):
    graph_def, fetches = attention("product", large=large)
    result = amp(graph_def, fetches, target="bfloat16")
    assert_attention_painted(result.graph_def, masking=F32 if kept else BF16, half=BF16)


def test_the_rule_fires_for_float16_only_where_it_changes_the_result():
    # Without the rule, the float16 rewrite of the same graph gives NaN for the fully masked row.
    graph_def, fetches = attention("product")
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as patch:
        patch.setattr(painting, "ROOT_RULES", tuple(r for r in painting.ROOT_RULES
                                                    if r is not painting.keep_out_of_range_values_float32))
        without = amp(graph_def, fetches).graph_def
    assert np.isnan(run(without, fetches, FEEDS)[0])
    assert np.isfinite(run(amp(graph_def, fetches).graph_def, fetches, FEEDS)[0])
