"""Structure counts of a checkout: the import picture, cycles, layers, big files, the runtime's state outside its value.

Reads the source only (nothing is imported). Every import counts, at any
depth: one inside a function still runs, and a type-only one (under
``if TYPE_CHECKING:``) still makes its module know the other's, so a cycle
through either is a cycle. Each arrow keeps how it imports (:data:`KINDS`),
so the picture tells them apart.

The picture: each module's level (0 when it imports nothing of the package,
else 1 + the highest level of what it imports; the modules of a cycle share
one), grouped by folder, and every arrow that goes up :data:`LAYERS` or
sideways into a cycle. Modules directly in ``amp_rewrite/`` (files and
folders) are counted against :data:`TOP_LEVEL_MODULES`.

Module-level objects are names bound to an instance of one of the package's
classes, or annotated with one, except instances of frozen (immutable)
classes, which are constants. Attributes set on other objects are the
runtime's ``setattr(...)`` and ``object.__setattr__(...)`` calls outside its
ledger (whose one ``setattr`` is how a patch goes in, recorded with its
undo): state stuck on TensorFlow's or Keras' objects instead of kept on the
runtime's value.
Usage: ``python tools/runtime_structure.py [CHECKOUT]`` (default: this one).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import networkx as nx

BIG = 600
PACKAGE = "amp_rewrite"
TOP_LEVEL_MODULES = 16

# How a module imports another, strongest first: an arrow made by several
# imports keeps the strongest.
AT_IMPORT, IN_FUNCTION, TYPE_ONLY = "at import", "in a function", "type-only"
KINDS = (AT_IMPORT, IN_FUNCTION, TYPE_ONLY)

# The package's layers, top first: a module may import from its own layer
# (without a cycle) and from the layers below, never from one above. An entry
# names a module or a folder, which holds its modules; the package's own name
# is its ``__init__`` alone (the public face). The start-up modules beside
# the package take part: the bootstrap at the top, the import hook (which
# imports nothing of the package) at the bottom.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the faces: the public API, the command line, the start-up bootstrap
    ("amp_rewrite", "amp_rewrite.__main__", "amp_rewrite.cli", "_amp_rewrite_autoload"),
    # the runtime's faces: its enable() (the package's __init__), and
    # amp_rewrite.function, which installs the tracing hook
    ("amp_rewrite.runtime", "amp_rewrite.function_api"),
    # what enable() installs beside the TF2 hook: the TF1 sessions, which are
    # given the runtime's value itself, and the multi-worker agreement
    ("amp_rewrite.runtime.tf1", "amp_rewrite.runtime.multi_worker"),
    # the runtime's value, which holds the TF2 tracing hook and the TF2 loss scaling
    ("amp_rewrite.runtime.core",),
    # traced tf.function bodies rewritten
    ("amp_rewrite.runtime.tf2",),
    # loss scaling: the algorithm, and how TF1 and TF2 hook it in
    ("amp_rewrite.runtime.loss_scale",),
    # what the runtime's parts share: settings, the target's choice, the ledger,
    # the records, profiling, the overflow probes, a multi-worker job's store
    ("amp_rewrite.runtime.settings", "amp_rewrite.runtime.target", "amp_rewrite.runtime.ledger",
     "amp_rewrite.runtime.records", "amp_rewrite.runtime.profile", "amp_rewrite.runtime.overflow_probe",
     "amp_rewrite.runtime.job"),
    # what runs the pipeline for a purpose: a SavedModel, a guarded rewrite, a report; stripping casts;
    # and the rewrite kept only where it ran faster (--tune)
    ("amp_rewrite.saved_model", "amp_rewrite.validate", "amp_rewrite.report", "amp_rewrite.strip",
     "amp_rewrite.tune.whole_graph"),
    ("amp_rewrite.pipeline",),
    # the rewrite's options (they name the paint lists' targets and edits), and measured precision
    ("amp_rewrite.config", "amp_rewrite.tune"),
    ("amp_rewrite.paint",),
    ("amp_rewrite.graph",),
    ("amp_rewrite.tf_internals", "amp_rewrite.errors", "amp_rewrite.environment", "_amp_rewrite_import_hook"),
)


def module_files(root: Path) -> dict[str, Path]:
    """Module name → file, for the package and the top-level start-up modules."""
    files = sorted([*(root / PACKAGE).rglob("*.py"), *root.glob("_amp_rewrite_*.py")])
    modules = {}
    for path in files:
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_graph(modules: dict[str, Path]) -> nx.DiGraph:
    """An edge per module a module imports, at any depth (``from pkg import sub`` names ``pkg.sub``).

    Each edge's ``kind`` is the strongest of :data:`KINDS` among the imports that make it.
    """
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for node, kind in _imports(ast.parse(path.read_text())):
            for target in _targets(node, modules):
                if target != name and _is_stronger(kind, graph.get_edge_data(name, target)):
                    graph.add_edge(name, target, kind=kind)
    return graph


def _is_stronger(kind: str, edge: dict | None) -> bool:
    """Whether an import of ``kind`` is a stronger arrow than ``edge`` (None: no arrow yet)."""
    return edge is None or KINDS.index(kind) < KINDS.index(edge["kind"])


def _imports(tree: ast.AST, kind: str = AT_IMPORT) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement under ``tree``, with how it imports."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, kind
        elif _is_type_checking_block(child):
            assert isinstance(child, ast.If)
            for statement in child.body:
                yield from _imports_in(statement, TYPE_ONLY)
            for statement in child.orelse:
                yield from _imports_in(statement, kind)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _imports(child, TYPE_ONLY if kind == TYPE_ONLY else IN_FUNCTION)
        else:
            yield from _imports(child, kind)


def _imports_in(statement: ast.stmt, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """The imports of one statement, itself included."""
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        yield statement, kind
    else:
        yield from _imports(statement, kind)


def _targets(node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """The package's modules one import statement names."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    elif node.module:
        subs = [f"{node.module}.{alias.name}" for alias in node.names]
        targets = [s for s in subs if s in modules] or [node.module]
    else:
        targets = []
    return [t for t in targets if t in modules]


def _is_type_checking_block(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


# --- the picture -------------------------------------------------------------


def levels(graph: nx.DiGraph) -> dict[str, int]:
    """Each module's level: 0 when it imports nothing of the package, else 1 + the highest level it imports.

    The modules of a cycle share one level, their cycle's, counted as one module.
    """
    condensed = nx.condensation(graph)
    level_of: dict[int, int] = {}
    for component in reversed(list(nx.topological_sort(condensed))):
        below = [level_of[c] for c in condensed.successors(component)]
        level_of[component] = 1 + max(below) if below else 0
    return {name: level_of[condensed.graph["mapping"][name]] for name in graph}


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int | None:
    """The index in ``layers`` of the longest entry that names ``module`` or its folder; None if none does."""
    best: tuple[int, int] | None = None
    for index, layer in enumerate(layers):
        for entry in layer:
            covers = module == entry or (entry != PACKAGE and module.startswith(entry + "."))
            if covers and (best is None or len(entry) > best[1]):
                best = (index, len(entry))
    return best[0] if best is not None else None


def unplaced(modules: dict[str, Path], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """The modules no entry of ``layers`` places."""
    return sorted(m for m in modules if layer_of(m, layers) is None)


def upward_imports(graph: nx.DiGraph, layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[tuple[str, str, str]]:
    """``(importer, imported, kind)`` for each import from a layer into a higher one."""
    found = []
    for importer, imported, kind in sorted(graph.edges(data="kind")):
        low, high = layer_of(importer, layers), layer_of(imported, layers)
        if low is not None and high is not None and high < low:
            found.append((importer, imported, kind))
    return found


def cycle_imports(graph: nx.DiGraph) -> list[tuple[str, str, str]]:
    """``(importer, imported, kind)`` for each import between two modules of one cycle."""
    component = {name: index for index, names in enumerate(nx.strongly_connected_components(graph))
                 for name in names}
    return [(a, b, kind) for a, b, kind in sorted(graph.edges(data="kind")) if component[a] == component[b]]


def top_level_modules(modules: dict[str, Path]) -> list[str]:
    """The modules directly in the package (``amp_rewrite.X``: a file, or a folder's ``__init__``)."""
    return sorted(m for m in modules if m.startswith(PACKAGE + ".") and m.count(".") == 1)


def picture(modules: dict[str, Path], graph: nx.DiGraph,
            layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """The import picture, as lines: levels by folder, then the arrows that go up or round a cycle."""
    level = levels(graph)
    folders: dict[str, list[str]] = {}
    for name, path in modules.items():
        folder = str(path.parent.relative_to(_root_of(modules)))
        folders.setdefault(folder, []).append(name)
    lines = ["levels (0: imports nothing of the package), by folder:"]
    for folder in sorted(folders):
        members = sorted(folders[folder], key=lambda n: (-level[n], n))
        lines.append(f"  {folder}/: " + ", ".join(f"{_short(n, folder)} {level[n]}" for n in members))
    up = upward_imports(graph, layers)
    lines.append(f"imports up the layers: {len(up)}")
    lines += [f"  {a} -> {b}{_tag(kind)}" for a, b, kind in up]
    around = cycle_imports(graph)
    lines.append(f"imports in a cycle: {len(around)}")
    lines += [f"  {a} -> {b}{_tag(kind)}" for a, b, kind in around]
    return lines


def _root_of(modules: dict[str, Path]) -> Path:
    """The checkout: the folder holding the package's folder."""
    return modules[PACKAGE].parent.parent


def _short(name: str, folder: str) -> str:
    """``name`` without its folder's dotted prefix (a folder's ``__init__`` is ``__init__``)."""
    prefix = folder.replace("/", ".")
    if name == prefix:
        return "__init__"
    return name[len(prefix) + 1:] if folder != "." and name.startswith(prefix + ".") else name


def _tag(kind: str) -> str:
    return "" if kind == AT_IMPORT else f" ({kind})"


# --- the runtime's state -----------------------------------------------------


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
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    modules = module_files(root)
    graph = import_graph(modules)
    print("\n".join(picture(modules, graph)))
    cycles = sorted(nx.simple_cycles(graph), key=lambda c: (len(c), c))
    print(f"import cycles: {len(cycles)}")
    for cycle in cycles:
        print("  " + " -> ".join([*cycle, cycle[0]]))
    print(f"modules not in a layer: {', '.join(unplaced(modules)) or 'none'}")
    top = top_level_modules(modules)
    print(f"modules directly in {PACKAGE}/: {len(top)} (at most {TOP_LEVEL_MODULES})")
    big = sorted(((len(p.read_text().splitlines()), n) for n, p in modules.items()), reverse=True)
    print(f"files over {BIG} lines: " + ", ".join(f"{n} ({lines})" for lines, n in big if lines > BIG))
    print("module-level objects in the runtime: " + ", ".join(module_objects(modules, "amp_rewrite.runtime")))
    attributes = attributes_set_on_objects(modules, "amp_rewrite.runtime")
    print(f"attributes the runtime sets on other objects: {len(attributes)}"
          + "".join(f"\n  {where}" for where in attributes))


if __name__ == "__main__":
    main()
