"""The package's structure: no import cycles, imports down the layers, and the runtime's state in one place.

Reads the source as ``tools/dev/runtime_structure.py`` does (nothing imported).
A module-level object in the runtime besides the one optional reference to
the enabled :class:`~amp_rewrite.runtime.core.Runtime`, or an attribute the
runtime sets on TensorFlow's objects, would be a second answer to "is the
runtime on, with what settings" (what it knows of objects is in the value's records).
"""

import importlib.util
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]


def structure_tool():
    spec = importlib.util.spec_from_file_location("runtime_structure", ROOT / "tools" / "dev" / "runtime_structure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_has_no_import_cycle():
    """Type-only imports and imports inside functions count: each makes a module know the other."""
    tool = structure_tool()
    graph = tool.import_graph(tool.module_files(ROOT))
    assert "amp_rewrite.runtime.core" in graph and graph.number_of_edges() > 50
    assert {kind for _, _, kind in graph.edges(data="kind")} == set(tool.KINDS)
    assert sorted(nx.simple_cycles(graph)) == []


def test_every_import_points_down_the_layers():
    tool = structure_tool()
    modules = tool.module_files(ROOT)
    assert tool.unplaced(modules) == []
    assert tool.upward_imports(tool.import_graph(modules)) == []


def test_the_runtime_layers_run_from_its_faces_down_to_what_its_parts_share():
    """enable(), the TF1 sessions, the runtime's value, the TF2 hook, loss scaling, the shared base: top to bottom.

    The value sits between the two paths: the TF1 sessions are given it, and
    it holds the TF2 tracing hook and loss scaling (a type-only import counts).
    """
    tool = structure_tool()
    order = ["amp_rewrite.runtime", "amp_rewrite.runtime.tf1.session.runner", "amp_rewrite.runtime.core",
             "amp_rewrite.runtime.tf2.tracing", "amp_rewrite.runtime.loss_scale.core", "amp_rewrite.runtime.settings",
             "amp_rewrite.saved_model"]
    layers = [tool.layer_of(module) for module in order]
    assert layers == sorted(set(layers))
    graph = tool.import_graph(tool.module_files(ROOT))
    assert graph.has_edge("amp_rewrite.runtime.tf1.session.runner", "amp_rewrite.runtime.core")
    assert graph.get_edge_data("amp_rewrite.runtime.core", "amp_rewrite.runtime.tf2.tracing")["kind"] == tool.TYPE_ONLY


def test_loss_scaling_is_one_folder_below_the_tf1_and_tf2_paths_and_knows_neither():
    """One algorithm, one home: every loss-scaling module shares one layer, and none imports tf1/ or tf2/."""
    tool = structure_tool()
    modules = tool.module_files(ROOT)
    graph = tool.import_graph(modules)
    loss_scale = sorted(m for m in modules if m.startswith("amp_rewrite.runtime.loss_scale"))
    paths = sorted(m for m in modules if m.startswith(("amp_rewrite.runtime.tf1", "amp_rewrite.runtime.tf2")))
    assert len(loss_scale) == 11 and len(paths) > 10
    assert {tool.layer_of(m) for m in loss_scale} == {tool.layer_of("amp_rewrite.runtime.loss_scale")}
    assert min(tool.layer_of(m) for m in loss_scale) > max(tool.layer_of(m) for m in paths)
    assert [(a, b) for a, b in graph.edges if a in loss_scale and b in paths] == []
    # the paths reach it from above: the sessions read the reports its TF1 optimizer builds
    assert graph.has_edge("amp_rewrite.runtime.tf1.session.plans", "amp_rewrite.runtime.loss_scale.tf1_optimizer")


def test_the_package_keeps_few_modules_at_its_top():
    tool = structure_tool()
    assert len(tool.top_level_modules(tool.module_files(ROOT))) <= tool.TOP_LEVEL_MODULES


def test_the_runtime_keeps_its_state_in_one_reference():
    tool = structure_tool()
    assert tool.module_objects(tool.module_files(ROOT), "amp_rewrite.runtime") == ["amp_rewrite.runtime._ACTIVE"]


def test_the_runtime_sets_no_attribute_on_other_objects():
    tool = structure_tool()
    assert tool.attributes_set_on_objects(tool.module_files(ROOT), "amp_rewrite.runtime") == []


def test_the_tool_sees_what_it_counts(tmp_path):
    """Cycles through a type-only and a function-level import, and module-level state, are found."""
    package = tmp_path / "amp_rewrite"
    (package / "runtime").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from amp_rewrite import b\n")
    (package / "b.py").write_text("import amp_rewrite.a\ndef f():\n    from amp_rewrite import c\n")
    (package / "c.py").write_text("import amp_rewrite.b\n")
    (package / "runtime" / "__init__.py").write_text(
        "from dataclasses import dataclass\n"
        "class Hook:\n    pass\n"
        "@dataclass(frozen=True)\nclass Choice:\n    pass\n"
        "HOOK = Hook()\nCHOICE = Choice()\n_ACTIVE: Hook | None = None\n"
        "def mark(session):\n    setattr(session, 'seen', True)\n    object.__setattr__(session, 'kept', 1)\n")
    (package / "runtime" / "ledger.py").write_text("def install(owner, patched):\n    setattr(owner, 'run', patched)\n")
    tool = structure_tool()
    modules = tool.module_files(tmp_path)
    graph = tool.import_graph(modules)
    assert sorted(sorted(c) for c in nx.simple_cycles(graph)) == [["amp_rewrite.a", "amp_rewrite.b"],
                                                                  ["amp_rewrite.b", "amp_rewrite.c"]]
    assert tool.cycle_imports(graph) == [("amp_rewrite.a", "amp_rewrite.b", tool.TYPE_ONLY),
                                         ("amp_rewrite.b", "amp_rewrite.a", tool.AT_IMPORT),
                                         ("amp_rewrite.b", "amp_rewrite.c", tool.IN_FUNCTION),
                                         ("amp_rewrite.c", "amp_rewrite.b", tool.AT_IMPORT)]
    assert tool.module_objects(modules, "amp_rewrite.runtime") == ["amp_rewrite.runtime.HOOK",
                                                                    "amp_rewrite.runtime._ACTIVE"]
    assert tool.attributes_set_on_objects(modules, "amp_rewrite.runtime") == ["amp_rewrite.runtime:11",
                                                                              "amp_rewrite.runtime:12"]


def test_the_tool_finds_levels_and_imports_up_the_layers(tmp_path):
    """Levels count from the modules that import nothing; an import into a higher layer is named, with its kind."""
    package = tmp_path / "amp_rewrite"
    (package / "paint").mkdir(parents=True)
    (package / "__init__.py").write_text("from amp_rewrite import pipeline\n")
    (package / "pipeline.py").write_text("from amp_rewrite.paint import rules\n")
    (package / "paint" / "__init__.py").write_text("")
    (package / "paint" / "rules.py").write_text("from amp_rewrite import errors\n"
                                                "def f():\n    from amp_rewrite import saved_model\n")
    (package / "errors.py").write_text("")
    (package / "saved_model.py").write_text("")
    (package / "strip.py").write_text("")
    tool = structure_tool()
    modules = tool.module_files(tmp_path)
    graph = tool.import_graph(modules)
    layers = (("amp_rewrite", "amp_rewrite.saved_model"), ("amp_rewrite.pipeline",), ("amp_rewrite.paint",),
              ("amp_rewrite.errors",))
    assert tool.levels(graph) == {"amp_rewrite": 3, "amp_rewrite.pipeline": 2, "amp_rewrite.paint": 0,
                                  "amp_rewrite.paint.rules": 1, "amp_rewrite.errors": 0,
                                  "amp_rewrite.saved_model": 0, "amp_rewrite.strip": 0}
    assert tool.upward_imports(graph, layers) == [("amp_rewrite.paint.rules", "amp_rewrite.saved_model",
                                                   tool.IN_FUNCTION)]
    assert tool.unplaced(modules, layers) == ["amp_rewrite.strip"]
    assert tool.layer_of("amp_rewrite.paint.rules", layers) == 2 and tool.layer_of("amp_rewrite", layers) == 0
    assert tool.top_level_modules(modules) == ["amp_rewrite.errors", "amp_rewrite.paint", "amp_rewrite.pipeline",
                                               "amp_rewrite.saved_model", "amp_rewrite.strip"]
    lines = tool.picture(modules, graph, layers)
    assert "  amp_rewrite/paint/: rules 1, __init__ 0" in lines
    assert lines[lines.index("imports up the layers: 1") + 1] == \
        "  amp_rewrite.paint.rules -> amp_rewrite.saved_model (in a function)"
