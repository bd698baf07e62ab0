"""Structure counts of a checkout: import cycles, files over 600 lines, the runtime's state outside its value.

Reads the source only (nothing is imported). Imports inside functions count
as imports: a function-level import that reaches back up is still a cycle.
Imports under ``if TYPE_CHECKING:`` do not: they are never executed, and
only name types in annotations. Module-level objects are names bound to an
instance of one of the package's classes, or annotated with one, except
instances of frozen (immutable) classes, which are constants. Attributes set
on other objects are the runtime's ``setattr(...)`` and
``object.__setattr__(...)`` calls outside its ledger (whose one ``setattr`` is
how a patch goes in, recorded with its undo): state stuck on TensorFlow's or
Keras' objects instead of kept on the runtime's value.
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
        tree = ast.parse(path.read_text())
        type_only = {id(inner) for node in ast.walk(tree) if _is_type_checking_block(node)
                     for inner in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [s for s in subs if s in modules] or [node.module]
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    return graph


def _is_type_checking_block(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_frozen(node: ast.ClassDef) -> bool:
    """A ``@dataclass(frozen=True)`` or a ``NamedTuple``: its instances cannot change."""
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and any(
                k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in decorator.keywords):
            return True
    return any(isinstance(base, ast.Name) and base.id == "NamedTuple" for base in node.bases)


def module_objects(modules: dict[str, Path], prefix: str) -> list[str]:
    """Names bound at module level to an instance of one of the package's mutable classes (state, not constants)."""
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}
    class_nodes = [node for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    mutable = {node.name for node in class_nodes if not _is_frozen(node)}
    found = []
    for name, tree in trees.items():
        if not name.startswith(prefix):
            continue
        for node in tree.body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            value = node.value
            is_instance = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
                value.func.id in mutable
            annotation = node.annotation if isinstance(node, ast.AnnAssign) else None
            is_annotated = annotation is not None and any(
                isinstance(part, ast.Name) and part.id in mutable for part in ast.walk(annotation))
            if is_instance or is_annotated:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [f"{name}.{t.id}" for t in targets if isinstance(t, ast.Name)]
    return found


def attributes_set_on_objects(modules: dict[str, Path], prefix: str,
                              patcher: str = "amp_rewrite.runtime.ledger") -> list[str]:
    """``module:line`` of each ``setattr``/``object.__setattr__`` call in ``prefix``'s modules but ``patcher``."""
    found = []
    for name, path in modules.items():
        if not name.startswith(prefix) or name == patcher:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _is_setattr(node.func):
                found.append(f"{name}:{node.lineno}")
    return found


def _is_setattr(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id == "setattr"
    return isinstance(func, ast.Attribute) and func.attr == "__setattr__" and \
        isinstance(func.value, ast.Name) and func.value.id == "object"


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
    attributes = attributes_set_on_objects(modules, "amp_rewrite.runtime")
    print(f"attributes the runtime sets on other objects: {len(attributes)}"
          + "".join(f"\n  {where}" for where in attributes))


if __name__ == "__main__":
    main()
