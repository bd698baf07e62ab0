"""Structure counts of a checkout: import cycles, files over 600 lines, module-level runtime objects.

Reads the source only (nothing is imported). Imports inside functions count
as imports: a function-level import that reaches back up is still a cycle.
Usage: ``python tools/runtime_structure.py [CHECKOUT]`` (default: this one).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx

BIG = 600


def module_files(root: Path) -> dict[str, Path]:
    """Module name → file, for the package and the top-level start-up modules."""
    files = sorted([*(root / "amp_rewrite").rglob("*.py"), *root.glob("_amp_rewrite_*.py")])
    modules = {}
    for path in files:
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_graph(modules: dict[str, Path]) -> nx.DiGraph:
    """An edge per module a module imports, at any depth (``from pkg import sub`` names ``pkg.sub``)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [s for s in subs if s in modules] or [node.module]
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    return graph


def module_objects(modules: dict[str, Path], prefix: str) -> list[str]:
    """Names bound at module level to an instance of one of the package's classes (state, not constants)."""
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}
    classes = {node.name for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    found = []
    for name, tree in trees.items():
        if not name.startswith(prefix):
            continue
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in classes:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [f"{name}.{t.id}" for t in targets if isinstance(t, ast.Name)]
    return found


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    modules = module_files(root)
    graph = import_graph(modules)
    cycles = sorted(nx.simple_cycles(graph), key=lambda c: (len(c), c))
    print(f"import cycles: {len(cycles)}")
    for cycle in cycles:
        print("  " + " -> ".join([*cycle, cycle[0]]))
    big = sorted(((len(p.read_text().splitlines()), n) for n, p in modules.items()), reverse=True)
    print(f"files over {BIG} lines: " + ", ".join(f"{n} ({lines})" for lines, n in big if lines > BIG))
    print("module-level objects in the runtime: " + ", ".join(module_objects(modules, "amp_rewrite.runtime")))


if __name__ == "__main__":
    main()
