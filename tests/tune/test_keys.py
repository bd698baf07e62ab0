"""The keys of the tuning cache: what a verdict applies to, not what the graph's parts are named."""

from tensorflow.core.framework import attr_value_pb2, function_pb2

from amp_rewrite.tune import keys


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
    first = keys.step_key([function("__inference_step_12", "__inference_inner_7", NODES)], INPUTS)
    renamed = [(f"x{name}", op, attrs) for name, op, attrs in reversed(NODES)]
    again = keys.step_key([function("__inference_step_48", "__inference_inner_31", renamed)], INPUTS)
    assert first == again and first.startswith(keys.KEY_PREFIX)


def test_the_key_changes_with_an_op_an_attribute_or_the_inputs():
    key = keys.step_key([function("f", "g", NODES)], INPUTS)
    other_op = [("a", "BatchMatMulV2", {"alpha": 1.0}), *NODES[1:]]
    other_attr = [("a", "MatMul", {"alpha": 2.0}), *NODES[1:]]
    assert keys.step_key([function("f", "g", other_op)], INPUTS) != key
    assert keys.step_key([function("f", "g", other_attr)], INPUTS) != key
    assert keys.step_key([function("f", "g", NODES)], [("float32", (16, 8)), ("resource", ())]) != key


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
    key = keys.session_step_key(session_nodes("a/"), fetches, inputs, target="bfloat16")
    assert keys.session_step_key(list(reversed(session_nodes("b/"))), fetches, inputs, target="bfloat16") == key
    assert key.startswith(keys.KEY_PREFIX)
    assert keys.session_step_key(session_nodes("a/"), fetches, inputs, target="float16") != key
    assert keys.session_step_key(session_nodes("a/"), fetches[:1], inputs, target="bfloat16") != key
    assert keys.session_step_key(session_nodes("a/"), fetches, [("float32", (8, 16))], target="bfloat16") != key
    assert keys.session_step_key(session_nodes("a/")[1:], fetches, inputs, target="bfloat16") != key


def test_the_key_changes_with_what_a_captured_variable_holds():
    """A variable's handle is a scalar ``resource`` input: its dtype and shape go into the key."""
    narrow = [("float32", (None, 8)), (keys.resource_input([("float32", (8, 16))]), ())]
    wide = [("float32", (None, 8)), (keys.resource_input([("float32", (8, 2048))]), ())]
    half = [("float32", (None, 8)), (keys.resource_input([("bfloat16", (8, 16))]), ())]
    fdef = [function("f", "g", NODES)]
    assert len({keys.step_key(fdef, narrow), keys.step_key(fdef, wide), keys.step_key(fdef, half)}) == 3
    assert keys.resource_input([]) == "resource"
    assert keys.resource_input([("float32", None)]) == "resource float32?"


def test_the_key_changes_with_the_rewrite_settings_and_only_with_those():
    from dataclasses import replace

    from amp_rewrite.config import Config
    from amp_rewrite.paint.op_lists import ListEdit

    base = Config(target="bfloat16", device_type="CPU")
    settings = keys.rewrite_settings(base)
    changed = [
        replace(base, target="float16"),
        replace(base, level="TREAT_INFER_AS_DENY"),
        replace(base, list_edits=(ListEdit("deny", "Cumprod", True, "TF_..._DENYLIST_ADD"),)),
        replace(base, keep_float32_patterns=("^loss/",)),
        replace(base, device_type="GPU"),
        replace(base, opaque_functions=(("__inference_f_3", "XLA-compiled"),)),
    ]
    texts = {keys.rewrite_settings(config) for config in changed}
    assert settings not in texts and len(texts) == len(changed)
    same = [replace(base, dump_dir="/tmp/d", tune_cache_dir="/tmp/c", is_checking=True, tune_batch=8),
            replace(base, list_edits=(ListEdit("allow", "MatMul", True, "--allow-add"),)),  # MatMul is listed
            replace(base, opaque_functions=(("__inference_g_9", "XLA-compiled"),))]
    assert keys.rewrite_settings(same[0]) == keys.rewrite_settings(same[1]) == settings
    assert keys.rewrite_settings(same[2]) == keys.rewrite_settings(changed[-1])  # the reason, not the name
    fdef = [function("f", "g", NODES)]
    assert keys.step_key(fdef, INPUTS, settings=settings) != keys.step_key(
        fdef, INPUTS, settings=keys.rewrite_settings(changed[2]))
    patterns = keys.rewrite_settings(changed[3])
    assert keys.session_step_key(session_nodes("a/"), [], [], target="bfloat16", settings=settings) != \
        keys.session_step_key(session_nodes("a/"), [], [], target="bfloat16", settings=patterns)


def test_a_replaced_list_file_changes_the_settings(tmp_path):
    from dataclasses import replace

    from amp_rewrite.config import Config
    from amp_rewrite.paint.op_lists import default_lists_root

    base = Config(target="bfloat16", device_type="CPU")
    for colour in ("allow", "infer", "deny", "clear"):
        text = (default_lists_root() / "bfloat16" / f"{colour}.txt").read_text()
        (tmp_path / f"{colour}.txt").write_text(text)
    assert keys.rewrite_settings(replace(base, lists_dir=str(tmp_path))) == keys.rewrite_settings(base)
    (tmp_path / "clear.txt").write_text("\n".join(
        op for op in (tmp_path / "clear.txt").read_text().splitlines() if op.split("#")[0].strip() != "Relu"))
    (tmp_path / "deny.txt").write_text((tmp_path / "deny.txt").read_text() + "\nRelu\n")
    assert keys.rewrite_settings(replace(base, lists_dir=str(tmp_path))) != keys.rewrite_settings(base)


def test_an_xla_compiled_callee_changes_the_key():
    plain = function("f", "g", NODES)
    compiled = function("f", "g", NODES)
    compiled.attr["_XlaMustCompile"].b = True
    assert keys.step_key([plain], INPUTS) != keys.step_key([compiled], INPUTS)
