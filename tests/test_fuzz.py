"""Property tests on random valid graphs (generator and tolerance model: graph_strategies.py).

The hypothesis profile ``amp-fuzz-ci`` (the default) draws 200 graphs; set
``AMP_FUZZ_PROFILE=amp-fuzz-long`` for 2,000. ``tools/dev/fuzz.py`` runs the same
properties for as many graphs as you like, outside pytest.
"""

import os
import re
from dataclasses import replace

import graph_strategies as gs
import numpy as np
import pytest
from graph_strategies import Recipe, Step, build, check_rewrite, recipe_from_seed, recipes
from hypothesis import HealthCheck, given, settings

settings.register_profile(
    "amp-fuzz-ci", max_examples=200, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("amp-fuzz-long", parent=settings.get_profile("amp-fuzz-ci"), max_examples=2000)
PROFILE = settings.get_profile(os.environ.get("AMP_FUZZ_PROFILE", "amp-fuzz-ci"))

# Failures the core is known to cause: property → a pattern its detail matches only
# for that bug. Each is reproduced by an xfail(strict) test in test_fuzz_regressions.py;
# drop the entry when that test starts passing.
KNOWN_CORE_BUGS: dict[str, str] = {}


def unexpected_failures(verdict) -> dict[str, str]:
    return {name: detail for name, detail in verdict.failures.items()
            if not (name in KNOWN_CORE_BUGS and re.fullmatch(KNOWN_CORE_BUGS[name], detail))}


@settings(PROFILE)
@given(recipes(max_steps=24))
def test_random_graphs_keep_every_property(recipe):
    verdict = check_rewrite(build(recipe))
    failures = unexpected_failures(verdict)
    assert not failures, "\n".join(f"{k}: {v}" for k, v in failures.items())


# -- the generator itself --------------------------------------------------------------


def test_a_seed_stands_for_one_graph():
    first, second = build(recipe_from_seed(11)), build(recipe_from_seed(11))
    assert first.graph_def.SerializeToString(deterministic=True) == \
        second.graph_def.SerializeToString(deterministic=True)
    assert first.fetches == second.fetches


def test_seeded_recipes_use_every_step_kind():
    drawn = set()

    def walk(steps):
        for step in steps:
            drawn.add(step.kind)
            walk(step.body)
            walk(step.orelse)

    for seed in range(300):
        walk(recipe_from_seed(seed).steps)
    assert drawn == set(gs.STEP_KINDS)


def test_built_graphs_use_the_ops_the_lists_care_about():
    ops = set()
    for seed in range(120):
        ops |= {node.op for node in build(recipe_from_seed(seed)).graph_def.node}
    wanted = {"MatMul", "Conv2D", "BatchMatMulV2", "Einsum", "DepthwiseConv2dNative", "FusedBatchNorm",
              "FusedBatchNormV3", "AddN", "AvgPool", "GatherV2", "IdentityN", "AddV2", "Mul", "Sub", "BiasAdd",
              "Tanh", "Sigmoid",
              "Softmax", "Log", "Relu", "Identity", "Reshape", "Transpose", "ConcatV2", "Split", "MaxPool",
              "Pack", "Unpack", "Select", "Exp", "Sum", "Mean", "Shape", "Size", "Cast", "VarHandleOp",
              "ReadVariableOp", "VariableV2", "Enter", "Merge", "Switch", "NextIteration", "Exit"}
    assert wanted <= ops, sorted(wanted - ops)


def test_the_error_model_bounds_float32_on_every_fetch():
    """The exact NumPy values lie within the bound of TensorFlow's float32 results (no rewrite involved)."""
    for seed in range(40):
        built = build(recipe_from_seed(seed))
        want, _ = gs.run_reference(built)
        for name, value, expected in zip(built.fetches, want, built.expected):
            assert np.all(np.abs(value - expected.ref) <= expected.err), (seed, name)


# -- the properties can fail -----------------------------------------------------------

SMALL = Recipe(steps=(Step("matmul", (0, 0)), Step("tanh", (0,)), Step("matmul_const", (0,), seed=3)),
               fetches=((0, "identity"),))


def rewrite_then(edit):
    """A stand-in for rewrite() that edits each output with ``edit``."""
    real = gs.rewrite

    def fake(graph_def, **kwargs):
        result = real(graph_def, **kwargs)
        edit(result.graph_def)
        return result

    return fake


def test_a_wrong_number_fails_the_tolerance_check(monkeypatch):
    def flip_first_matmul(graph_def):
        for node in graph_def.node:
            if node.op == "MatMul" and not node.attr["transpose_a"].b:
                node.attr["transpose_a"].b = True
                return

    monkeypatch.setattr(gs, "rewrite", rewrite_then(flip_first_matmul))
    assert "close to float32" in check_rewrite(build(SMALL)).failures


def test_a_lost_dtype_fails_the_dtype_check(monkeypatch):
    def fetch_in_half(graph_def):
        fetch = next(n for n in graph_def.node if n.name == "fetch0")
        fetch.attr["T"].type = gs.F16
        cast = graph_def.node.add(name="to_half_for_fetch", op="Cast", input=list(fetch.input))
        cast.attr["SrcT"].type, cast.attr["DstT"].type = gs.F32, gs.F16
        fetch.input[0] = cast.name

    monkeypatch.setattr(gs, "rewrite", rewrite_then(fetch_in_half))
    assert "dtype" in check_rewrite(build(SMALL)).failures


def test_a_rewrite_that_keeps_changing_fails_idempotence_and_determinism(monkeypatch):
    calls = iter(range(1000))

    def add_node(graph_def):
        graph_def.node.add(name=f"extra{next(calls)}", op="NoOp")

    monkeypatch.setattr(gs, "rewrite", rewrite_then(add_node))
    failures = check_rewrite(build(SMALL)).failures
    assert {"idempotent", "deterministic"} <= set(failures)


def test_a_rewrite_that_converts_nothing_fails_the_allow_check(monkeypatch):
    real = gs.rewrite

    def keep_everything(graph_def, **kwargs):
        return real(graph_def, **{**kwargs, "fetches": [node.name for node in graph_def.node]})

    monkeypatch.setattr(gs, "rewrite", keep_everything)
    assert "allow ops convert" in check_rewrite(build(SMALL)).failures


def test_known_core_bugs_excuse_only_their_own_failures(monkeypatch):
    monkeypatch.setitem(KNOWN_CORE_BUGS, "left alone",
                        r"fetched, preserved or GPU nodes changed: \[('[^']*/NextIteration(_\d+)?'(, )?)+\]")

    class Verdict:
        failures = {"left alone": "fetched, preserved or GPU nodes changed: ['loop/NextIteration_1']"}

    assert unexpected_failures(Verdict) == {}
    Verdict.failures = {"left alone": "fetched, preserved or GPU nodes changed: ['loop/MatMul']"}
    assert unexpected_failures(Verdict) == Verdict.failures


def test_half_round_trips_are_found():
    built = build(Recipe(steps=(Step("matmul", (0, 0)),), fetches=((0, "direct"),)))
    graph_def = built.graph_def
    widen = graph_def.node.add(name="widen", op="Cast", input=["x0"])
    widen.attr["SrcT"].type, widen.attr["DstT"].type = gs.F16, gs.F32
    narrow = graph_def.node.add(name="narrow", op="Cast", input=["widen"])
    narrow.attr["SrcT"].type, narrow.attr["DstT"].type = gs.F32, gs.F16
    assert gs.half_round_trips(graph_def) == {("widen", "narrow")}
    narrow.attr["DstT"].type = gs.BF16
    assert gs.half_round_trips(graph_def) == set()


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_a_small_fixed_graph_passes_on_both_targets(target):
    verdict = check_rewrite(build(replace(SMALL, target=target)))
    assert verdict.ok, verdict.explain()
    assert verdict.converted >= 3 and 0 < verdict.worst_ratio <= 1


def test_values_whose_bound_leaves_the_half_range_are_not_judged():
    """x @ x squared 24 times: rounding errors double each time, so only the float32 value means anything."""
    squares = Recipe(steps=tuple(Step("matmul", (0, 0)) for _ in range(24)), fetches=((0, "identity"),))
    verdict = check_rewrite(build(squares))
    assert verdict.ok, verdict.explain()
    assert verdict.loose == verdict.elements == 64
