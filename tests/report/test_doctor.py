"""doctor: findings built into small graphs are found, named, measured and ranked."""

import json

import numpy as np
import pytest
import tensorflow as tf
from helpers import F16, F32, amp, assert_one_line_error, assert_same_outputs_within_half, rng, tf1
from runners import run_cli

from amp_rewrite.report.doctor import diagnose, padded, render_lines, speedup_bound

R = rng(5)


def const(shape, name):
    return tf.constant((R.standard_normal(shape) * 0.1).astype(np.float32), name=name)


def odd_dims_graph():
    """x[32,26] @ w1[26,13] (K 26, N 13) → Exp (deny) → @ w2[13,64] (K 13) → relu → @ w3[64,32] (aligned)."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [32, 26], name="x")
        a1 = tf.matmul(x, const((26, 13), "w1"), name="allow1")
        d = tf.exp(a1, name="deny1")
        a2 = tf.matmul(d, const((13, 64), "w2"), name="allow2")
        a3 = tf.matmul(tf.nn.relu(a2, name="clr1"), const((64, 32), "w3"), name="allow3")
        tf.identity(a3, name="out")
    return g.as_graph_def()


def by_kind(diagnosis, kind):
    return [f for f in diagnosis.findings if f.kind == kind]


def test_dims_26_and_13_are_named_with_the_smallest_padding_and_ranked_by_flops():
    result = amp(odd_dims_graph(), ["out"], device_type="GPU")
    found = by_kind(diagnose(result), "tensor_core_shape")
    total = 2 * 32 * (26 * 13 + 13 * 64 + 64 * 32)
    assert [f.nodes for f in found] == [("allow2",), ("allow1",)]  # allow3 is aligned; 26,624 FLOPs before 21,632
    allow2, allow1 = found
    assert allow1.details["dims"] == {"K": 26, "N": 13} and allow1.details["padded"] == {"K": 32, "N": 16}
    assert allow2.details["dims"] == {"K": 13, "N": 64} and allow2.details["padded"] == {"K": 16}
    assert allow1.flops == 2 * 32 * 26 * 13 and allow1.share == pytest.approx(allow1.flops / total)
    assert allow2.share == pytest.approx(2 * 32 * 13 * 64 / total)
    assert "K 26 → 32 (+6), N 13 → 16 (+3)" in allow1.fix


def test_tensor_core_findings_only_for_float16_on_gpu():
    for fields in ({"device_type": "CPU"}, {"device_type": "CPU", "target": "bfloat16"},
                   {"device_type": "GPU", "target": "bfloat16"}):
        assert by_kind(diagnose(amp(odd_dims_graph(), ["out"], **fields)), "tensor_core_shape") == [], fields


def test_padding_is_the_next_multiple_of_eight():
    assert [padded(n) for n in (1, 8, 13, 26, 64, 65)] == [8, 8, 16, 32, 64, 72]


def test_float32_island_forced_by_a_deny_op_names_its_casts_bytes_and_list_entry():
    gd = odd_dims_graph()
    result = amp(gd, ["out"])
    islands = by_kind(diagnose(result), "float32_island")
    assert len(islands) == 1
    island = islands[0]
    assert island.nodes == ("deny1",)
    assert [k["op"] for k in island.details["kept_by"]] == ["Exp"]
    nodes = {n.name: n for n in result.graph_def.node}
    (cast_in,), (cast_out,) = island.details["casts_in"], island.details["casts_out"]
    assert (nodes[cast_in].attr["SrcT"].type, nodes[cast_in].attr["DstT"].type) == (F16, F32)
    assert nodes[cast_in].input[0].split(":")[0] == "allow1" and nodes[cast_out].input[0].split(":")[0] == "deny1"
    assert island.cast_bytes == 2 * 32 * 13 * (2 + 4)  # two [32, 13] Casts, each reading and writing
    assert "--deny-remove Exp --infer-add Exp" in island.fix
    feeds = {"x": R.standard_normal((32, 26)).astype(np.float32)}
    assert_same_outputs_within_half(gd, result.graph_def, ["out"], feeds)


def test_a_norm_kept_float32_is_an_island_with_no_list_edit_to_suggest():
    """A layer norm between two bfloat16 MatMuls: the doctor names it and does not offer to move Mean off a list."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [32, 16], name="x")
        w = tf.constant(R.standard_normal((16, 16)).astype(np.float32) * 0.3)
        h = tf.matmul(x, w, name="allow1")
        mean, variance = tf.nn.moments(h, axes=[-1], keepdims=True)
        normed = tf.multiply(h - mean, tf.math.rsqrt(variance + 1e-3), name="normed")
        tf.identity(tf.matmul(normed, w, name="allow2"), name="out")
    result = amp(g.as_graph_def(), ["out"], target="bfloat16")
    islands = by_kind(diagnose(result), "float32_island")
    assert len(islands) == 1 and "moments/mean" in islands[0].nodes and "normed" in islands[0].nodes
    assert "a batch or layer norm" in islands[0].why and "none needed" in islands[0].fix
    assert "--deny-remove" not in islands[0].fix and islands[0].details["kept_by"] == []


def test_a_sigmoid_kept_float32_for_its_gradient_is_an_island_with_no_list_edit_to_suggest():
    """A Sigmoid between two bfloat16 MatMuls whose gradient reads it: the doctor says why it stays float32."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [32, 16], name="x")
        w = tf.Variable(R.standard_normal((16, 16)).astype(np.float32))
        h = tf.sigmoid(tf.matmul(x, w, name="allow1"), name="sat1")
        loss = tf.reduce_mean(tf.square(tf.matmul(h, w, name="allow2")), name="loss")
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    result = amp(g.as_graph_def(), ["loss", "train"], target="bfloat16")
    islands = [f for f in by_kind(diagnose(result), "float32_island") if "sat1" in f.nodes]
    assert len(islands) == 1
    assert "gradient reads its output" in islands[0].why and "none needed" in islands[0].fix
    assert "--deny-remove" not in islands[0].fix and islands[0].details["kept_by"] == []


def test_the_islands_fix_removes_the_island():
    result = amp(odd_dims_graph(), ["out"], list_edits=_edits(("deny", "Exp", False), ("infer", "Exp", True)))
    assert result.node_outcomes["deny1"]["precision"] == "float16"
    assert by_kind(diagnose(result), "float32_island") == []


def _edits(*changes):
    from amp_rewrite.paint.op_lists import ListEdit

    return tuple(ListEdit(colour, op, add, "test") for colour, op, add in changes)


def heavy_float32_graph():
    """Three MatMuls of different sizes, each kept float32 for a different reason."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [16, 64], name="x")
        kept = tf.matmul(x, const((64, 64), "w0"), name="fetched_mm")  # fetched: preserved
        big = tf.matmul(x, const((64, 128), "w1"), name="big_mm")
        small = tf.matmul(tf.exp(big, name="deny1"), const((128, 8), "w2"), name="small_mm")
        tf.identity(small, name="out")
        tf.identity(kept, name="out2")
    return g.as_graph_def()


def test_heavy_ops_left_float32_say_why_and_rank_by_flop_share():
    # MatMul moved to the infer list: big_mm is fed by no half op; small_mm is fed by a deny op.
    result = amp(heavy_float32_graph(), ["out", "fetched_mm"],
                 list_edits=_edits(("allow", "MatMul", False), ("infer", "MatMul", True)))
    found = by_kind(diagnose(result), "float32_heavy_op")
    assert [f.nodes[0] for f in found] == ["big_mm", "fetched_mm", "small_mm"]  # 262,144 > 131,072 > 32,768 FLOPs
    categories = {f.nodes[0]: f.details["category"] for f in found}
    assert categories == {"big_mm": "list", "fetched_mm": "preserved", "small_mm": "list"}
    total = 2 * 16 * (64 * 64 + 64 * 128 + 128 * 8)
    assert found[0].share == pytest.approx(2 * 16 * 64 * 128 / total)
    assert found[0].details["chain"][0].startswith(found[0].why)
    assert "--allow-add MatMul" in found[0].fix


def test_heavy_op_next_to_a_deny_op_is_a_deny_neighbour():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [16, 16], name="x")
        half = tf.matmul(x, const((16, 16), "w"), name="allow1")
        mixed = tf.raw_ops.BatchMatMulV2(x=tf.exp(x, name="deny1"), y=half, name="infer_bmm")
        tf.identity(mixed, name="out")
    result = amp(g.as_graph_def(), ["out"], list_edits=_edits(("allow", "BatchMatMulV2", False),
                                                              ("infer", "BatchMatMulV2", True)))
    (found,) = by_kind(diagnose(result), "float32_heavy_op")
    assert found.nodes == ("infer_bmm",) and found.details["category"] == "deny_neighbour"


def test_heavy_op_of_unknown_shape_is_listed_without_a_share():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, None, name="x")
        tf.identity(tf.raw_ops.MatMul(a=x, b=const((8, 8), "w"), name="mm"), name="out")
    result = amp(g.as_graph_def(), ["out"], list_edits=_edits(("allow", "MatMul", False)))
    (found,) = by_kind(diagnose(result), "float32_heavy_op")
    assert found.share is None and found.details["shape_known"] is False and "shape is unknown" in found.fix


def test_a_kernel_reason_is_a_missing_half_kernel():
    from amp_rewrite.report.doctor import _why_float32

    entry = {"colour": "allow", "op": "Conv3D", "rule": "no float16 kernel or OpDef type on CPU"}
    assert _why_float32(entry, "float16", "CPU")[0] == "no_half_kernel"


def while_graph():
    """A While loop whose body reads the loop variable in half (MatMul) and in float32 (Exp, deny)."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        u = const((16, 16), "u")

        @tf.function
        def loop(h0):
            def body(i, h):
                return i + 1, tf.exp(tf.matmul(h, u) * 0.1) * 0.5

            return tf.while_loop(lambda i, h: i < 5, body, [0, h0])[1]

        tf.identity(loop(x), name="out")
    return g.as_graph_def()


def test_a_cast_inside_a_while_body_is_found_with_its_bytes_per_iteration():
    gd = while_graph()
    result = amp(gd, ["out"])
    found = by_kind(diagnose(result), "loop_casts")
    assert len(found) == 1
    finding = found[0]
    library = {f.signature.name: f for f in result.graph_def.library.function}
    body = library[finding.details["loop"]]
    assert body.signature.name.startswith("while_body")
    casts_in_body = {f"{body.signature.name}::{n.name}" for n in body.node_def if n.op == "Cast"}
    assert set(finding.nodes) == casts_in_body and casts_in_body
    assert finding.cast_bytes == len(casts_in_body) * 4 * 16 * (2 + 4)
    assert_same_outputs_within_half(gd, result.graph_def, ["out"], {"x": R.standard_normal((4, 16)).astype(np.float32)})


def test_bound_follows_the_stated_model():
    assert speedup_bound(0.75, 0, 1000) == (pytest.approx(4.0), 0.0, pytest.approx(4.0))
    limit, cast_share, bound = speedup_bound(0.75, 25, 1600, balance=16.0)  # casts: 16 * 25 / 1600 = 0.25
    assert (limit, cast_share, bound) == (pytest.approx(4.0), pytest.approx(0.25), pytest.approx(2.0))
    assert speedup_bound(1.0, 0, 1000)[0] is None and speedup_bound(None, 0, 0) == (None, None, None)


def test_bound_uses_the_graphs_half_share_and_all_cast_bytes():
    result = amp(odd_dims_graph(), ["out"])
    bound = diagnose(result).bound
    assert bound.half_flop_share == pytest.approx(result.half_flop_share)
    assert bound.heavy_flops == 2 * 32 * (26 * 13 + 13 * 64 + 64 * 32)
    # x in (32x26), the island's two (32x13), out (32x32); weights are folded Consts, no Cast
    assert bound.cast_bytes == (32 * 26 + 2 * 32 * 13 + 32 * 32) * 6
    assert len(result.casts) == 4
    island = 2 * 32 * 13 * 6
    text = "\n".join(render_lines(diagnose(result)))
    assert f"Cast bytes: {island / bound.cast_bytes:.1%} in float32 islands" in text


def test_findings_of_every_kind_are_ranked_by_share_and_printed_in_that_order():
    diagnosis = diagnose(amp(odd_dims_graph(), ["out"], device_type="GPU"))
    shares = [f.share for f in diagnosis.findings]
    assert shares == sorted(shares, reverse=True) and len({f.kind for f in diagnosis.findings}) == 2
    lines = render_lines(diagnosis)
    numbered = [line for line in lines if line[:3].strip().rstrip(".").isdigit()]
    assert [line.split("] ")[1].split(":")[0] for line in numbered] == [f.kind for f in diagnosis.findings]
    assert json.loads(json.dumps(diagnosis.as_dict()))["findings"][0]["nodes"] == list(diagnosis.findings[0].nodes)




def test_cli_doctor_prints_findings_and_the_report_carries_the_same(tmp_path):
    path = tmp_path / "model.pb"
    path.write_bytes(odd_dims_graph().SerializeToString())
    done = run_cli("doctor", path, "--fetch", "out", "--device-type", "GPU", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "tensor_core_shape: allow2" in done.stdout and "float32_island: deny1" in done.stdout
    assert "bound: " in done.stdout
    report = tmp_path / "r.json"
    done = run_cli(path, tmp_path / "out.pb", "--fetch", "out", "--device-type", "GPU", "--report", report,
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doctor = json.loads(report.read_text())["doctor"]
    expected = diagnose(amp(odd_dims_graph(), ["out"], device_type="GPU")).as_dict()
    assert json.loads(json.dumps(expected)) == doctor
    page = tmp_path / "r.html"
    assert run_cli(path, tmp_path / "out.pb", "--fetch", "out", "--report", page, cwd=tmp_path).returncode == 0
    assert '"doctor": {' in page.read_text() or '"doctor":{' in page.read_text()


def test_cli_doctor_on_a_missing_file_is_one_line(tmp_path):
    done = run_cli("doctor", tmp_path / "nothing.pb", cwd=tmp_path)
    assert done.returncode == 1
    assert_one_line_error(done.stderr, "nothing.pb")


def test_doctor_reads_a_saved_model_and_names_nodes_inside_its_functions(tmp_path):
    module = tf.Module()
    module.w = tf.Variable(tf.ones([26, 13]))
    module.f = tf.function(lambda x: tf.matmul(tf.exp(tf.matmul(x, module.w)), tf.ones([13, 64])),
                           input_signature=[tf.TensorSpec([32, 26], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    done = run_cli("doctor", tmp_path / "sm", "--device-type", "GPU", cwd=tmp_path)
    assert done.returncode == 0
    out = done.stdout
    found = [line for line in out.splitlines() if line[:3].strip().rstrip(".").isdigit()]
    assert len(found) == 3 and "tensor_core_shape: " in found[0] and "::" in found[0]
    assert "float32_island: " in found[2] and found[2].endswith("::Exp")
