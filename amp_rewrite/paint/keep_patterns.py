"""Nodes kept float32 by name pattern (``--keep-float32``, ``AMP_REWRITE_KEEP_FLOAT32``).

A pattern is a Python regular expression, found anywhere in a node's name
(:func:`re.search`): ``softmax`` keeps ``attn/softmax``; anchor it
(``^loss/``, ``/BiasAdd$``) to say more. A node inside a function is matched
as ``function::node``, with the function's name in the input library. Kept
nodes are left alone like preserved ones: the painting skips them, with a
reason that names the pattern.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from amp_rewrite.errors import UsageError

# Patterns may hold commas (``a{2,3}``) and colons (``f::n``); a semicolon
# rarely appears in a node name.
ENV_SEPARATOR = ";"


def compile_patterns(patterns: Iterable[str], *, source: str = "--keep-float32") -> tuple[re.Pattern, ...]:
    """Each pattern compiled; an invalid one is a :class:`UsageError` naming it and ``source``."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise UsageError(f"{source} {pattern!r}: not a regular expression: {exc}") from None
    return tuple(compiled)


def split_env(value: str) -> tuple[str, ...]:
    """The patterns of an environment value: separated by ``;``, blanks dropped."""
    return tuple(p.strip() for p in value.split(ENV_SEPARATOR) if p.strip())


def reason_for(pattern: str) -> str:
    """The reason the report and ``explain`` give for a node a pattern kept."""
    return f"kept float32: name matches keep-float32 pattern {pattern!r}"


def match_patterns(graph, patterns: tuple[str, ...]) -> tuple[dict[int, str], tuple[str, ...]]:
    """The nodes of the typed view the patterns keep, and the patterns that matched nothing.

    Args:
        graph: the :class:`~amp_rewrite.graph.typed_graph.TypedGraph`.
        patterns: the patterns, in the order given; a node takes the first that matches.

    Returns:
        Global node index → reason (virtual args and results excluded), and
        the patterns that matched no node.
    """
    if not patterns:
        return {}, ()
    compiled = compile_patterns(patterns)
    kept: dict[int, str] = {}
    used: set[int] = set()
    for body in graph.bodies:
        prefix = f"{body.function}::" if body.function else ""
        for name, i in body.index.items():
            if i in graph.virtual:
                continue
            qualified = prefix + name
            for k, regex in enumerate(compiled):
                if regex.search(qualified):
                    kept[i] = reason_for(patterns[k])
                    used.add(k)
                    break
    unmatched = tuple(p for k, p in enumerate(patterns) if k not in used)
    return kept, unmatched
