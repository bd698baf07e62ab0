"""Graph facts several modules share: dtype numbers, input references, sinks, called functions, flat nodes."""

import json

import numpy as np
import pytest
import tensorflow as tf
from helpers import function_call_graph, tf1

from amp_rewrite.errors import first_line
from amp_rewrite.graph import facts as graph_facts
from amp_rewrite.graph.typed_graph import TypedGraph
from amp_rewrite.paint.op_lists import COLOURS, Colour


def test_dtype_numbers_and_half_maxima_are_tensorflows():
    assert graph_facts.DT_FLOAT == tf.float32.as_datatype_enum
    assert graph_facts.DT_DOUBLE == tf.float64.as_datatype_enum
    assert graph_facts.DT_STRING == tf.string.as_datatype_enum
    assert graph_facts.DT_HALF == tf.float16.as_datatype_enum
    assert graph_facts.DT_BFLOAT16 == tf.bfloat16.as_datatype_enum
    assert graph_facts.DT_RESOURCE == tf.resource.as_datatype_enum
    assert graph_facts.DT_VARIANT == tf.variant.as_datatype_enum
    assert graph_facts.HALF_MAX[graph_facts.DT_HALF] == float(np.finfo(np.float16).max)
    assert graph_facts.HALF_MAX[graph_facts.DT_BFLOAT16] == tf.bfloat16.max


@pytest.mark.parametrize("ref, parsed", [
    ("x", ("x", 0, False)),
    ("x:2", ("x", 2, False)),
    ("^x", ("x", -1, True)),
    ("scope/x:10", ("scope/x", 10, False)),
])
def test_input_references(ref, parsed):
    assert graph_facts.parse_input(ref) == parsed
    assert graph_facts.node_name(ref) == parsed[0]


def test_function_input_source_is_the_node_or_argument():
    assert graph_facts.function_input_source("arg") == "arg"
    assert graph_facts.function_input_source("mm:product:0") == "mm"
    assert graph_facts.function_input_source("^mm") == "mm"


def test_sinks_are_the_nodes_nothing_reads_by_data_or_control():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2], name="x")
        y = tf.identity(x, name="y")
        with tf.control_dependencies([y]):
            tf.no_op(name="after")
        tf.square(x, name="z")
    assert graph_facts.sinks(g.as_graph_def()) == {"after", "z"}


def test_called_functions_through_op_and_every_function_attr():
    @tf.function
    def branch(v):
        return v * 2.0

    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2], name="x")
        tf.cond(tf.reduce_sum(x) > 0, lambda: branch(x), lambda: x + 1.0, name="c")
    graph_def = g.as_graph_def()
    library = {f.signature.name for f in graph_def.library.function}
    cond = next(n for n in graph_def.node if n.op in ("If", "StatelessIf"))
    called = graph_facts.called_functions(cond, library)
    assert sorted(called) == sorted([cond.attr["then_branch"].func.name, cond.attr["else_branch"].func.name])
    direct = cond.__class__(name="direct", op=called[0])
    assert graph_facts.called_functions(direct, library) == [called[0]]
    assert graph_facts.called_functions(direct, set()) == []


def test_flat_nodes_list_the_main_graph_then_the_functions_asked_for():
    graph_def = function_call_graph()
    function = graph_def.library.function[0]
    fname = function.signature.name
    function.node_def[-1].input.append("^mul")
    assert graph_facts.functions_of(["out", f"{fname}::allow_in_fn", "x", f"{fname}::mul"]) == [fname]
    main = graph_facts.flat_nodes(graph_def)
    assert [item.name for item in main] == [node.name for node in graph_def.node]
    assert next(item for item in main if item.name == "allow_main").inputs == (("x", False), ("mul", False))
    flat = {item.name: item for item in graph_facts.flat_nodes(graph_def, [fname, "no_such_function"])}
    assert list(flat)[len(main):] == [f"{fname}::{node.name}" for node in function.node_def]
    assert flat[f"{fname}::mul"].node_def.op == "Mul"
    assert flat[f"{fname}::allow_in_fn"].inputs == ((f"{fname}::mul", False),)  # the argument x is no node
    assert flat[f"{fname}::Identity"].inputs == ((f"{fname}::clr_in_fn", False), (f"{fname}::mul", True))


def test_first_line_of_an_exception():
    assert first_line(ValueError("bad thing\nmore detail")) == "bad thing"
    assert first_line(ValueError("bad thing\nmore"), with_type=True) == "ValueError: bad thing"
    assert first_line(KeyError()) == "KeyError"
    assert first_line(KeyError(), with_type=True) == "KeyError"


def test_vertices_name_their_node_and_attr():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2, 2], name="x")
        tf.matmul(x, x, name="mm")
    view = TypedGraph(g.as_graph_def())
    i = view.index["mm"]
    (vid,) = view.node_vertices[i]
    assert view.vertex_node[vid] == i and view.vertex_attr[vid].name == "T"


def test_colours_equal_and_print_as_their_names():
    assert [str(c) for c in COLOURS] == ["allow", "infer", "deny", "clear"]
    assert Colour.DENY == "deny" and f"{Colour.INFER}" == "infer"
    assert json.dumps({Colour.ALLOW: [Colour.CLEAR]}) == '{"allow": ["clear"]}'
