"""The HTML report: one self-contained page, every node in its data, deterministic."""

import importlib.resources
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import amp, function_call_graph, rng, tf1, v1_control_flow

from amp_rewrite.report.html import CATEGORIES, render_html


def loop_graph():
    g = tf.Graph()
    r = rng(7)
    with g.as_default(), v1_control_flow():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        h = x
        for i in range(2):
            w = tf.constant(r.standard_normal((8, 8)).astype(np.float32) * 0.3, name=f"w{i}")
            h = tf.nn.relu(tf.matmul(h, w, name=f"allow{i}"), name=f"clr{i}")

        def body(i, h):
            return i + 1, tf.tanh(tf.matmul(h, tf.eye(8) * 0.5, name="allow_loop"))

        _, h = tf1.while_loop(lambda i, h: i < 2, body, [tf.constant(0), h], name="loop")
        logits = tf.identity(h, name="logits")
        with tf.control_dependencies([logits]):
            tf.reduce_mean(tf.exp(logits, name="deny1"), name="loss")
        tf.no_op(name="after_loss")
    return g.as_graph_def()


@pytest.fixture(scope="module")
def result():
    return amp(loop_graph(), ["logits", "loss"])


def page_data(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="graph-data">(.*?)</script>', page, re.S)
    assert found, "no embedded graph data"
    return json.loads(found.group(1))


def test_page_is_self_contained(result):
    page = render_html(result, title="loop graph")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"https?://", page, re.I)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert not re.search(r"<script[^>]*\ssrc=", page, re.I)


def test_page_is_the_installed_template_with_title_and_data_filled_in(result):
    folder = importlib.resources.files("amp_rewrite.report") / "template"
    skeleton, style, script = ((folder / name).read_text(encoding="utf-8")
                               for name in ("report.html", "report.css", "report.js"))
    assert skeleton.count("{{STYLE}}") == skeleton.count("{{SCRIPT}}") == skeleton.count("{{DATA}}") == 1
    page = render_html(result, title="loop graph")
    assert f"<style>\n{style}</style>" in page and f"<script>\n{script}</script>" in page
    assert "{{" not in page and page.count("loop graph") == 2  # <title> and the header
    before, after = skeleton.split("{{STYLE}}")[0], skeleton.split("{{SCRIPT}}")[1]
    assert page.startswith(before.replace("{{TITLE}}", "loop graph")) and page.endswith(after)


def test_embedded_data_names_every_node_of_the_rewritten_graph(result):
    data = page_data(render_html(result, title="t"))
    assert data["name"] == [node.name for node in result.graph_def.node]
    n = len(data["name"])
    for key in ("op", "cat", "colour", "rule", "dtype", "cause", "converted", "col", "row", "control_of"):
        assert len(data[key]) == n, key
    assert data["summary"]["casts"] == len(result.casts) > 0


def test_categories_follow_what_the_rewrite_did(result):
    data = page_data(render_html(result, title="t"))
    category = {name: CATEGORIES[c] for name, c in zip(data["name"], data["cat"])}
    assert category["allow0"] == category["clr1"] == category["loop/allow_loop"] == "half"
    assert all(category[name] == "cast" for name in result.casts)
    assert category["logits"] == category["loss"] == "preserved"
    assert category["deny1"] == "deny"
    assert category["x"] == "float32"


def test_causes_and_edges_point_at_the_right_nodes(result):
    data = page_data(render_html(result, title="t"))
    index = {name: i for i, name in enumerate(data["name"])}
    report = result.report()["nodes"]
    for name, entry in report.items():
        if entry.get("cause"):
            assert data["name"][data["cause"][index[name]]] == entry["cause"], name
    edges = set(zip(data["edges"][0::2], data["edges"][1::2]))
    for node in result.graph_def.node:
        for ref in node.input:
            if ref.startswith("^"):
                sources = data["control_sets"][data["control_of"][index[node.name]]]
                assert index[ref[1:]] in sources
            else:
                assert (index[ref.split(":")[0]], index[node.name]) in edges


def test_same_result_gives_the_same_page_and_the_title_is_escaped(result):
    title = 'graph <b>"&</b>'
    first = render_html(result, title=title)
    again = render_html(amp(loop_graph(), ["logits", "loss"]), title=title)
    assert first == again
    assert "<b>" not in first and "graph &lt;b&gt;&quot;&amp;&lt;/b&gt;" in first


def test_page_size_per_node_stays_small():
    g = tf.Graph()
    with g.as_default():
        h = tf1.placeholder(tf.float32, [2, 8], name="x")
        for _ in range(150):
            h = tf.nn.relu(tf.nn.bias_add(tf.matmul(h, tf.ones([8, 8]) * 0.1), tf.zeros([8])))
        tf.identity(h, name="out")
    result = amp(g.as_graph_def(), ["out"])
    page = render_html(result, title="deep")
    names = sum(len(node.name) + 3 for node in result.graph_def.node)
    overhead = len(page) - names - 40_000  # the page's CSS and script
    assert overhead / len(result.graph_def.node) < 80, overhead / len(result.graph_def.node)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs a headless chromium")
def test_page_runs_in_a_browser_and_honours_the_search_hash(result):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.html"
        path.write_text(render_html(result, title="t"))
        dom = subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp}/profile", "--virtual-time-budget=3000", "--dump-dom",
             f"file://{path}#search=MatMul"],
            capture_output=True, text=True, timeout=60).stdout
    count = re.search(r'<div id="count"[^>]*>([^<]*)<', dom)
    assert count, dom[-2000:]
    n = len(result.graph_def.node)
    assert count.group(1) == f"3 of {n} nodes match \u201cMatMul\u201d"  # allow0, allow1, loop/allow_loop
    listed = re.findall(r'<span class="nm" title="([^"]*)"', dom)
    assert listed[:3] == ["allow0", "allow1", "loop/allow_loop"]


def test_function_bodies_are_drawn_with_counts_equal_to_the_summary():
    result = amp(function_call_graph(), ["out"])
    function = next(f.signature.name for f in result.graph_def.library.function)
    data = page_data(render_html(result, title="t"))
    category = {name: CATEGORIES[c] for name, c in zip(data["name"], data["cat"])}
    assert category[f"{function}::allow_in_fn"] == category[f"{function}::clr_in_fn"] == "half"
    assert category["allow_main"] == "half"
    counts = {c: list(category.values()).count(c) for c in CATEGORIES}
    assert counts["half"] == data["summary"]["converted"] == len(result.converted)
    assert counts["cast"] == data["summary"]["casts"] == len(result.casts)
    assert set(result.report()["nodes"]) <= set(data["name"])
    index = {name: i for i, name in enumerate(data["name"])}
    edges = set(zip(data["edges"][0::2], data["edges"][1::2]))
    assert (index[f"{function}::allow_in_fn"], index[f"{function}::clr_in_fn"]) in edges


def test_list_shows_compute_ops_before_consts_and_casts(result):
    data = page_data(render_html(result, title="t"))
    order = data["list_order"]
    assert sorted(order) == list(range(len(data["name"])))
    ops = [data["ops"][data["op"][i]] for i in order]
    groups = [2 if op == "Cast" else 1 if op == "Const" else 0 for op in ops]
    assert groups == sorted(groups) and groups[0] == 0 and 1 in groups and 2 in groups
    computed = [i for i in order if groups[order.index(i)] == 0]
    assert computed == sorted(computed)  # graph order within a group


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's script")
def test_long_names_lose_their_middle_not_their_ends(result):
    page = render_html(result, title="t")
    script = re.search(r"function shortenMiddle\(text, fits\) \{.*?\n\}\n", page, re.S).group(0)
    name = "mobilenetv2_0.35_96_1/block_13_expand_BN_1/batchnorm/mul_1"
    program = script + (f"console.log(JSON.stringify([shortenMiddle({json.dumps(name)}, s => s.length <= 30), "
                        f"shortenMiddle('short/name', s => s.length <= 30)]));")
    short, kept = json.loads(subprocess.run(["node", "-e", program], capture_output=True, text=True,
                                            timeout=60, check=True).stdout)
    assert kept == "short/name"
    assert len(short) == 30 and "\u2026" in short
    assert short.startswith("mobilenetv2") and short.endswith("batchnorm/mul_1")
