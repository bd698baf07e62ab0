"""The step trial's schedule, verdict and cache key, with no TensorFlow run: times are given."""

import pytest
from tensorflow.core.framework import attr_value_pb2, function_pb2

from amp_rewrite.tune import steps
from amp_rewrite.tune.cache import Timing
from amp_rewrite.tune.steps import FLOAT32, HALF, MARGIN, StepTrial, verdict_of


def test_the_schedule_warms_each_body_once_then_mirrors_each_pair():
    order = steps.schedule()
    assert order[:2] == [HALF, FLOAT32]  # untimed: graph optimisation, kernel set-up
    assert order[2:] == [HALF, FLOAT32, FLOAT32, HALF, HALF, FLOAT32, FLOAT32, HALF]
    assert len(order) == steps.CALLS == 10
    assert order.count(HALF) == order.count(FLOAT32)


def run(trial: StepTrial, times: dict[str, list[float]]) -> None:
    """Feeds the trial each body's times in the order its schedule runs them."""
    left = {body: list(values) for body, values in times.items()}
    while not trial.is_done:
        body = trial.next_body()
        trial.record(body, left[body].pop(0))


def test_half_is_kept_when_its_best_call_saves_the_margin():
    trial = StepTrial()
    # the warm-ups (first of each: 9.0) never count; the best timed call of each does
    run(trial, {HALF: [9.0, 0.55, 0.9, 0.6, 0.7], FLOAT32: [9.0, 1.0, 0.8, 1.2, 1.0]})
    verdict = trial.verdict()
    assert verdict.is_half and (verdict.half_seconds, verdict.float32_seconds) == (0.55, 0.8)


def test_a_near_tie_stays_float32():
    float32 = 1.0
    just_short = float32 * (1 - MARGIN) + 1e-6
    trial = StepTrial()
    run(trial, {HALF: [0.1, just_short] * 3, FLOAT32: [0.1, float32] * 3})
    assert not trial.verdict().is_half
    assert verdict_of(Timing(float32=float32, half=float32 * (1 - MARGIN))).is_half


def test_no_verdict_before_the_last_call_nor_without_a_timed_call_of_each():
    trial = StepTrial()
    for _ in range(steps.CALLS - 1):
        trial.record(trial.next_body(), 1.0)
        assert trial.verdict() is None
    untimed = StepTrial()
    while not untimed.is_done:
        untimed.record(untimed.next_body(), None)
    assert untimed.verdict() is None


@pytest.mark.parametrize("half, float32, is_cached, expected", [
    (0.449, 0.373, False, "stays float32",),
    (0.0134, 0.0257, False, "half"),
    (0.0134, 0.0257, True, "half"),
])
def test_the_reason_gives_both_times_on_this_device(half, float32, is_cached, expected):
    verdict = verdict_of(Timing(float32=float32, half=half), is_cached=is_cached)
    reason = verdict.reason("bfloat16", "CPU")
    if expected == "half":
        assert verdict.is_half
        assert reason.startswith("the step ran 13.4 ms in bfloat16 and 25.7 ms in float32 on this CPU (1.92x)")
    else:
        assert not verdict.is_half
        assert reason == "the step ran 449 ms in bfloat16 and 373 ms in float32 on this CPU"
    assert reason.endswith("; measured before, read from the cache") == is_cached


def function(name: str, callee: str, nodes: list[tuple[str, str, dict]]):
    """A FunctionDef of ``nodes`` (name, op, float attrs); a PartitionedCall node calls ``callee``."""
    fdef = function_pb2.FunctionDef()
    fdef.signature.name = name
    for node_name, op, attrs in nodes:
        node = fdef.node_def.add(name=node_name, op=op)
        for key, value in attrs.items():
            node.attr[key].CopyFrom(attr_value_pb2.AttrValue(f=value))
        if op == "PartitionedCall":
            node.attr["f"].func.name = callee
            node.attr["shared_name"].s = name.encode()
    return fdef


NODES = [("a", "MatMul", {"alpha": 1.0}), ("call", "PartitionedCall", {}), ("b", "Relu", {})]
INPUTS = [("float32", (None, 8)), ("resource", ())]


def test_the_key_is_the_same_for_the_same_graph_traced_again_under_other_names():
    first = steps.step_key([function("__inference_step_12", "__inference_inner_7", NODES)], INPUTS)
    renamed = [(f"x{name}", op, attrs) for name, op, attrs in reversed(NODES)]
    again = steps.step_key([function("__inference_step_48", "__inference_inner_31", renamed)], INPUTS)
    assert first == again and first.startswith(steps.KEY_PREFIX)


def test_the_key_changes_with_an_op_an_attribute_or_the_inputs():
    key = steps.step_key([function("f", "g", NODES)], INPUTS)
    other_op = [("a", "BatchMatMulV2", {"alpha": 1.0}), *NODES[1:]]
    other_attr = [("a", "MatMul", {"alpha": 2.0}), *NODES[1:]]
    assert steps.step_key([function("f", "g", other_op)], INPUTS) != key
    assert steps.step_key([function("f", "g", other_attr)], INPUTS) != key
    assert steps.step_key([function("f", "g", NODES)], [("float32", (16, 8)), ("resource", ())]) != key


def session_nodes(prefix: str):
    """The NodeDefs of a small session step, its names beginning with ``prefix``."""
    from tensorflow.core.framework import node_def_pb2

    out = []
    for name, op, attrs in [("x", "Placeholder", {"dtype": 1}), ("mm", "MatMul", {"T": 1}),
                            ("w", "VariableV2", {"shared_name": b""})]:
        node = node_def_pb2.NodeDef(name=prefix + name, op=op)
        node.input.extend([prefix + "x"] if op == "MatMul" else [])
        for key, value in attrs.items():
            if isinstance(value, bytes):
                node.attr[key].s = prefix + value if value else value
            else:
                node.attr[key].type = value
        out.append(node)
    return out


def test_a_session_step_key_ignores_names_and_follows_fetches_feeds_and_target():
    fetches, inputs = ["op NoOp", "float32()"], [("float32", (None, 16))]
    key = steps.session_step_key(session_nodes("a/"), fetches, inputs, target="bfloat16")
    assert steps.session_step_key(list(reversed(session_nodes("b/"))), fetches, inputs, target="bfloat16") == key
    assert key.startswith(steps.KEY_PREFIX)
    assert steps.session_step_key(session_nodes("a/"), fetches, inputs, target="float16") != key
    assert steps.session_step_key(session_nodes("a/"), fetches[:1], inputs, target="bfloat16") != key
    assert steps.session_step_key(session_nodes("a/"), fetches, [("float32", (8, 16))], target="bfloat16") != key
    assert steps.session_step_key(session_nodes("a/")[1:], fetches, inputs, target="bfloat16") != key


def test_a_step_far_slower_in_half_is_not_worth_a_profile():
    """On a CPU without fast half kernels every region loses: no profiled half call is spent finding that out."""
    assert steps.is_worth_mixing(verdict_of(Timing(float32=1.0, half=1.2)))
    assert steps.is_worth_mixing(verdict_of(Timing(float32=1.0, half=0.5)))
    assert not steps.is_worth_mixing(verdict_of(Timing(float32=1.0, half=steps.MIXING_LIMIT + 0.01)))
