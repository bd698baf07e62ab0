"""The package's structure: no import cycles, and the runtime's state in one place.

Reads the source as ``tools/runtime_structure.py`` does (nothing imported).
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
    spec = importlib.util.spec_from_file_location("runtime_structure", ROOT / "tools" / "runtime_structure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_has_no_import_cycle():
    tool = structure_tool()
    graph = tool.import_graph(tool.module_files(ROOT))
    assert "amp_rewrite.runtime.core" in graph and graph.number_of_edges() > 50
    assert sorted(nx.simple_cycles(graph)) == []


def test_the_runtime_keeps_its_state_in_one_reference():
    tool = structure_tool()
    assert tool.module_objects(tool.module_files(ROOT), "amp_rewrite.runtime") == ["amp_rewrite.runtime._ACTIVE"]


def test_the_runtime_sets_no_attribute_on_other_objects():
    tool = structure_tool()
    assert tool.attributes_set_on_objects(tool.module_files(ROOT), "amp_rewrite.runtime") == []


def test_the_tool_sees_what_it_counts(tmp_path):
    """A cycle through a function-level import, and module-level state, are found; type-only imports are not."""
    package = tmp_path / "amp_rewrite"
    (package / "runtime").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from amp_rewrite import b\n")
    (package / "b.py").write_text("def f():\n    from amp_rewrite import c\n")
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
    cycles = list(nx.simple_cycles(tool.import_graph(modules)))
    assert [sorted(c) for c in cycles] == [["amp_rewrite.b", "amp_rewrite.c"]]
    assert tool.module_objects(modules, "amp_rewrite.runtime") == ["amp_rewrite.runtime.HOOK",
                                                                    "amp_rewrite.runtime._ACTIVE"]
    assert tool.attributes_set_on_objects(modules, "amp_rewrite.runtime") == ["amp_rewrite.runtime:11",
                                                                              "amp_rewrite.runtime:12"]
