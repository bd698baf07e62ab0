"""Whether TensorFlow can import a graph, judged from its call graph before the graph is imported.

Reading a graph refuses a call to a function nobody defines
(:func:`missing_function`, through :func:`amp_rewrite.graph.io.check_graph_def`);
whatever imports a graph into TensorFlow (FLOP shares, measured shapes,
validation runs) asks :func:`import_blocker` first, which also finds the
recursion TensorFlow's importer cannot survive.
"""

from __future__ import annotations

from amp_rewrite.graph.facts import called_functions
from amp_rewrite.graph.op_registry import OpRegistry


def missing_function(graph_def) -> str | None:
    """The first call to a function neither the library nor TensorFlow defines, as a message, or None."""
    library = {f.signature.name for f in graph_def.library.function}
    bodies = [(None, graph_def.node)] + [(f.signature.name, f.node_def) for f in graph_def.library.function]
    for owner, nodes in bodies:
        for node in nodes:
            for callee in called_functions(node, library):
                if callee not in library and OpRegistry.registry_op_def(callee) is None:
                    where = f"node {node.name} (op {node.op})" + (f" in function {owner}" if owner else "")
                    return f"{where} calls function {callee!r}, which the library does not define"
    return None


def import_blocker(graph_def) -> str | None:
    """Why TensorFlow cannot import ``graph_def`` safely, or None.

    A function that calls itself, directly or through others, makes
    TensorFlow's importer recurse until the process dies; a call to a
    function the library lacks fails the import. Both are found here from the
    call graph alone, without importing anything.
    """
    missing = missing_function(graph_def)
    if missing:
        return missing
    library = {f.signature.name for f in graph_def.library.function}
    calls = {f.signature.name: sorted({c for n in f.node_def for c in called_functions(n, library)
                                       if c in library})
             for f in graph_def.library.function}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(calls):
        if state.get(root):
            continue
        state[root] = 1
        stack = [(root, iter(calls[root]))]
        while stack:
            name, pending = stack[-1]
            callee = next(pending, None)
            if callee is None:
                state[name] = 2
                stack.pop()
            elif state.get(callee) == 1:
                path = [n for n, _ in stack]
                cycle = path[path.index(callee):] + [callee]
                return "function " + " -> ".join(cycle) + " calls itself, which TensorFlow cannot import"
            elif not state.get(callee):
                state[callee] = 1
                stack.append((callee, iter(calls[callee])))
    return None
