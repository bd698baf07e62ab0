"""Per region: which parts of a step run faster in half, read from one profiled step of each body.

A step that is slower in half as a whole can hold parts that are faster
(ResNet-50's convolutions: bfloat16 wins on one shape and loses on another,
and loses oneDNN's fused filter-and-bias gradient where a Cast sits
between them), and a step that is faster in half can hold parts that are
slower (a recurrent cell's elementwise ops, Casts around a small MatMul).
Timing each op alone in a small graph misjudges both: the kernels, fusions
and threads of a lone op are not the step's. So the times come from the
step itself: one real call of the half body and one of the float32 body,
each profiled, give every executed node's op time.

A *region* is a connected set of nodes the rewrite made half in one body
(the main graph or one function), with the Casts the rewrite put at its
edges (:func:`half_regions`, read off the rewritten GraphDef). The profiler
names an executed node as the graph names it, behind the names of the
calls it was inlined through (``StatefulPartitionedCall/dense/MatMul``);
:class:`ExecutedNames` strips those call names, and only those, to find the
region. A node that Grappler fused with its neighbours (a convolution with
its bias and activation) is named after one of them: the region holds all
of them, so the fused node's time lands in the right region.

:func:`choose` compares, per region, the op time of its nodes in the half
step (its Casts included) with the same nodes' op time in the float32
step, and keeps half only where half saved
:data:`~amp_rewrite.tune.trial.MARGIN` of it, the margin a whole step's
half body must win by. The choice is a proposal: it is kept only when a short interleaved trial of
the mixed step beats the better pure step (the caller's work), since
removing a region from half changes the Casts around it and what oneDNN
fuses. Regions whose nodes the profile did not see keep the precision the
whole step chose.

The result names the nodes to keep float32 as :class:`~amp_rewrite.Config`'s
``keep_float32`` does (``node`` in the main graph, ``function::node`` in a
function, by the names of the graph that was rewritten), each with a reason
that gives the region's two times.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_HALF
from amp_rewrite.tune.cache import Timing, TuneCache
from amp_rewrite.tune.keys import PROFILE_KEY, node_text
from amp_rewrite.tune.trial import MARGIN

#: The key of a region's two op times in the tuning cache: the step's key, this, and a digest of its nodes.
REGION_KEY = " region "
_HALF = frozenset({DT_HALF, DT_BFLOAT16})
_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
# A function the rewrite wrote again under a new name (one per distinct change of its instances).
_VARIANT = re.compile(r"^(?P<name>.+)_amp(?:_\d+)?$")
# Ops that take no time of their own in an executed step.
_FREE_OPS = frozenset({"Const", "Identity", "NoOp", "_Arg", "_Retval", "Placeholder"})


@dataclass(frozen=True)
class Region:
    """One connected set of half nodes in one body, and the Casts at its edges.

    Attributes:
        body: ``""`` for the main graph, else the name of the function (as rewritten).
        nodes: node names in the body, sorted (the Casts the rewrite added excluded).
        casts: the Casts the rewrite added at its edges, sorted.
        ops: op type → how many of its nodes run it.
        content: a digest of what its nodes and Casts compute, not of their names.
        occurrence: how many regions of the same content come before it (:func:`half_regions`' order).
    """

    body: str
    nodes: tuple[str, ...]
    casts: tuple[str, ...]
    ops: tuple[tuple[str, int], ...]
    content: str = ""
    occurrence: int = 0

    @property
    def digest(self) -> str:
        """Which region of the graph it is, whatever the names: the same model traced again (in this run
        or another, under other names) gives its regions the same digests, in the same order."""
        return f"{self.content}.{self.occurrence}"

    def qualified(self, original_functions: Iterable[str] = ()) -> list[str]:
        """Its nodes as ``keep_float32`` names them, the body named as in the graph that was rewritten."""
        if not self.body:
            return list(self.nodes)
        body = original_function(self.body, set(original_functions))
        return [f"{body}::{name}" for name in self.nodes]

    def describe(self, limit: int = 3) -> str:
        """``2 Conv2D, 2 BiasAdd, 1 Relu and 4 more ops``: the region's commonest ops."""
        shown = ", ".join(f"{count} {op}" for op, count in self.ops[:limit])
        rest = sum(count for _, count in self.ops[limit:])
        return f"{shown} and {rest} more ops" if rest else shown


@dataclass(frozen=True)
class RegionTimes:
    """A region's op time in the profiled half step and in the profiled float32 step, in seconds."""

    region: Region
    half: float
    float32: float

    @property
    def is_seen(self) -> bool:
        """Whether the profiles saw any of its nodes run."""
        return self.half > 0.0 or self.float32 > 0.0

    @property
    def is_faster_in_half(self) -> bool:
        return self.float32 > 0.0 and self.half <= (1.0 - MARGIN) * self.float32


@dataclass(frozen=True)
class RegionChoice:
    """Which regions a mixed step keeps half, and what the profiles predict it costs.

    Attributes:
        times: every region's :class:`RegionTimes`, in the order of the regions.
        half: the indices of the regions kept half.
        predicted: the mixed step's predicted op time, in seconds.
        half_total, float32_total: the profiled steps' op times, in seconds.
    """

    times: tuple[RegionTimes, ...]
    half: frozenset[int]
    predicted: float
    half_total: float
    float32_total: float

    def keep_float32(self, target: str, original_functions: Iterable[str] = ()) -> dict[str, str]:
        """The nodes the mixed step keeps float32 (``keep_float32`` names) → the reason the report gives."""
        functions = set(original_functions)
        kept: dict[str, str] = {}
        for index, times in enumerate(self.times):
            if index in self.half:
                continue
            reason = region_reason(times, target)
            kept.update((name, reason) for name in times.region.qualified(functions))
        return kept


def region_reason(times: RegionTimes, target: str) -> str:
    """``kept float32: in the step, its region (2 Conv2D, ...) ran 4.1 ms in bfloat16 and 3.2 ms in float32``."""
    if not times.is_seen:
        return f"kept float32: in the step, its region ({times.region.describe()}) was not seen to run"
    return (f"kept float32: in the step, its region ({times.region.describe()}) ran {_ms(times.half)} in {target} "
            f"and {_ms(times.float32)} in float32")


def half_regions(graph_def, inserted_casts: Iterable[str] = ()) -> list[Region]:
    """The regions of a rewritten GraphDef: per body, each connected set of nodes holding a half type.

    Args:
        graph_def: the rewritten GraphDef, its library included.
        inserted_casts: the Casts the rewrite added (``RewriteResult.casts``: ``name`` or ``function::name``).

    Regions are ordered by body (the main graph first, then functions by
    name) and by their first node's name, so the same rewrite gives the
    same list.
    """
    casts = set(inserted_casts)
    regions = list(_body_regions("", graph_def.node, casts))
    for fdef in sorted(graph_def.library.function, key=lambda f: f.signature.name):
        regions.extend(_body_regions(fdef.signature.name, fdef.node_def, casts))
    seen: Counter[str] = Counter()
    numbered = []
    for region in regions:
        numbered.append(replace(region, occurrence=seen[region.content]))
        seen[region.content] += 1
    return numbered


def _body_regions(body: str, nodes, inserted: set[str]) -> Iterator[Region]:
    """The body's regions: its half nodes joined by data edges; each added Cast goes with the nodes it touches.

    An added Cast is not a join: one Cast of a float32 value can feed two
    regions that share nothing else (both branches reading the input).
    """
    prefix = f"{body}::" if body else ""
    half = {node.name: node for node in nodes if _holds_half(node)}
    casts = {name for name in half if prefix + name in inserted}
    parent = {name: name for name in half if name not in casts}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    touching: dict[str, set[str]] = {name: set() for name in casts}
    for name, node in half.items():
        for source in node.input:
            if source.startswith("^"):
                continue
            source_name = source.split(":", 1)[0]
            if source_name not in half:
                continue
            if name in casts or source_name in casts:
                cast, other = (name, source_name) if name in casts else (source_name, name)
                if other not in casts:
                    touching[cast].add(other)
                continue
            a, b = root(name), root(source_name)
            if a != b:
                parent[max(a, b)] = min(a, b)
    members: dict[str, list[str]] = {}
    for name in sorted(parent):
        members.setdefault(root(name), []).append(name)
    cast_roots = {cast: {root(n) for n in others} for cast, others in touching.items()}
    for key, own in members.items():
        ops = Counter(half[n].op for n in own if half[n].op not in _FREE_OPS)
        edge_casts = tuple(sorted(c for c, roots in cast_roots.items() if key in roots))
        content = hashlib.sha256(b"\n".join(sorted(node_text(half[n]) for n in (*own, *edge_casts))))
        yield Region(body, tuple(own), edge_casts, tuple(sorted(ops.items(), key=lambda item: (-item[1], item[0]))),
                     content.hexdigest()[:16])


def _holds_half(node) -> bool:
    for value in node.attr.values():
        if value.type in _HALF or any(t in _HALF for t in value.list.type):
            return True
    return False


class ExecutedNames:
    """Finds the region of an executed node from the name the profiler gives it.

    Args:
        regions: the regions.
        call_names: the names of the call nodes of every body: the prefixes a
            node inlined from a function is named behind.
    """

    def __init__(self, regions: list[Region], call_names: Iterable[str]):
        self.calls = frozenset(call_names)
        where: dict[str, set[int]] = {}
        for index, region in enumerate(regions):
            for name in (*region.nodes, *region.casts):
                where.setdefault(name, set()).add(index)
        self.regions_of = {name: tuple(sorted(found)) for name, found in where.items()}

    def regions(self, executed: str) -> tuple[int, ...]:
        """The indices of the regions an executed node belongs to (none, one, or the regions a Cast feeds).

        A name several regions hold (a Cast feeding two; a node name two
        functions share) gives its time to each in equal shares.
        """
        name = executed
        while name not in self.regions_of:
            stripped = self._strip_call(name)
            if stripped is None:
                return ()
            name = stripped
        return self.regions_of[name]

    def _strip_call(self, name: str) -> str | None:
        """``name`` without its leading call name (``call/node`` → ``node``), or None when it has none."""
        cut = name.find("/")
        while cut != -1:
            if name[:cut] in self.calls:
                return name[cut + 1:]
            cut = name.find("/", cut + 1)
        return None


def call_names(graph_def) -> set[str]:
    """The names of the nodes that call a function, in every body of ``graph_def``."""
    functions = {f.signature.name for f in graph_def.library.function}
    found = set()
    for nodes in (graph_def.node, *(f.node_def for f in graph_def.library.function)):
        for node in nodes:
            if node.op in _CALL_OPS or node.op in functions:
                found.add(node.name)
    return found


def region_times(regions: list[Region], names: ExecutedNames, half_ops: Mapping[str, float],
                 float32_ops: Mapping[str, float]) -> list[RegionTimes]:
    """Each region's op time in the two profiled steps (executed node name → seconds, summed over its runs)."""
    half = [0.0] * len(regions)
    float32 = [0.0] * len(regions)
    for ops, totals in ((half_ops, half), (float32_ops, float32)):
        for executed, seconds in ops.items():
            found = names.regions(executed)
            for index in found:
                totals[index] += seconds / len(found)
    return [RegionTimes(region, half[i], float32[i]) for i, region in enumerate(regions)]


def choose(times: list[RegionTimes], *, half_total: float, float32_total: float, is_half_step: bool
           ) -> RegionChoice | None:
    """The mixed step the profiles propose, or None when no region's choice differs from the step's.

    Args:
        times: each region's op times (:func:`region_times`).
        half_total, float32_total: the two profiled steps' op times, in seconds.
        is_half_step: what the whole step chose; a region the profiles did not see keeps it.

    A region is half when it was faster in half by :data:`~amp_rewrite.tune.trial.MARGIN`. The
    mixed step is proposed only when its predicted op time (the half step's,
    less what each float32 region saves) is :data:`~amp_rewrite.tune.trial.MARGIN` below the better
    pure step's: a smaller gain would not survive the trial that confirms it.
    """
    half = kept_half(times, is_half_step=is_half_step)
    if not times or len(half) in (0, len(times)):
        return None
    predicted = half_total - sum(t.half - t.float32 for i, t in enumerate(times) if i not in half)
    best = min(half_total, float32_total)
    if predicted > (1.0 - MARGIN) * best:
        return None
    return RegionChoice(tuple(times), half, predicted, half_total, float32_total)


def kept_half(times: list[RegionTimes], *, is_half_step: bool) -> frozenset[int]:
    """The regions a mixed step keeps half: those faster in half, and those not seen when the step chose half."""
    return frozenset(i for i, t in enumerate(times) if t.is_faster_in_half or (is_half_step and not t.is_seen))


def region_key(key: str, region: Region) -> str:
    """The cache key of a region's two op times in the step (or graph) whose key is ``key``."""
    return f"{key}{REGION_KEY}{region.digest}"


def remember(cache: TuneCache, key: str, times: list[RegionTimes], totals: Timing) -> None:
    """Puts each region's op times and the two profiled steps' totals in ``cache`` under the step's ``key``."""
    cache.put(key + PROFILE_KEY, totals)
    for region_times in times:
        cache.put(region_key(key, region_times.region), Timing(float32=region_times.float32, half=region_times.half))


def remembered(cache: TuneCache, key: str, regions: list[Region]) -> tuple[list[RegionTimes], Timing] | None:
    """Each region's op times and the profiles' totals as :func:`remember` put them; None where any is missing
    (another rewrite than the one measured: measure again)."""
    totals = cache.get(key + PROFILE_KEY)
    known = [cache.get(region_key(key, region)) for region in regions]
    if totals is None or any(timing is None for timing in known):
        return None
    return [RegionTimes(region, half=t.half, float32=t.float32) for region, t in zip(regions, known) if t], totals


def original_function(name: str, originals: set[str]) -> str:
    """The function of the rewritten graph that ``name`` (a function of the rewrite's output) was written from."""
    if name in originals or not originals:
        return name
    match = _VARIANT.match(name)
    return match.group("name") if match and match.group("name") in originals else name


def _ms(seconds: float) -> str:
    milliseconds = seconds * 1000.0
    return f"{milliseconds:.2f} ms" if milliseconds < 10 else f"{milliseconds:.1f} ms"
