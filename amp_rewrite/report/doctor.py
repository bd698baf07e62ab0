"""Why a rewritten graph may not run faster: findings ranked by the FLOPs or bytes they concern.

:func:`diagnose` reads a :class:`~amp_rewrite.pipeline.RewriteResult` (its
rewritten GraphDef, per-node outcomes and inserted Casts) and returns a
:class:`Diagnosis`: plain data that ``amp-rewrite doctor`` prints and the
``--report`` serializes. Four kinds of finding:

1. ``float32_heavy_op``: a MatMul/Conv/Einsum-type op (the ops
   :mod:`amp_rewrite.graph.flops` counts) left float32, with the reason
   :mod:`amp_rewrite.paint.explain` gives for it sorted into a category: ``list``
   (its op-list entry), ``deny_neighbour``, ``no_half_kernel`` (on the device
   type), ``preserved`` (fetched, preserved, placed elsewhere) or ``other``.
   Ranked by its share of the graph's heavy FLOPs.
2. ``tensor_core_shape`` (float16 on GPU only): a half MatMul/Conv whose K,
   N or channel count is not a multiple of 8, which keeps NVIDIA tensor cores
   from running it at full rate; the fix is the smallest padding. Ranked by
   its share of the FLOPs.
3. ``float32_island``: float32 nodes on a path from a half op back to a half
   op, the Casts in and out of it that run every step, and the list entries
   that keep it float32. Ranked by its share of all inserted Casts' bytes.
4. ``loop_casts``: inserted Casts that run on every iteration of a loop
   (a v1 while frame, or a While/For body function), by loop body.

and a :class:`Bound`: the speed-up the half FLOP share and the Casts' bytes
allow (:func:`speedup_bound` states the model). Shapes come from TensorFlow's
shape inference; unknown dimensions count as 1, as in :mod:`amp_rewrite.graph.flops`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_HALF
from amp_rewrite.graph.flops import FLOP_OPS, imported_ops, op_flops
from amp_rewrite.paint.explain import explain_chain
from amp_rewrite.paint.normalization import REASON as NORMALIZATION_REASON
from amp_rewrite.paint.saturation import REASON as SATURATION_REASON
from amp_rewrite.report.islands import Island, float32_islands

#: NVIDIA tensor cores run float16 MatMul/Conv at full rate when these counts are multiples of 8.
TENSOR_CORE_MULTIPLE = 8
#: FLOPs a device performs in the time it moves one byte (V100: 15.7 TFLOP/s float32 / 900 GB/s ≈ 17).
MACHINE_BALANCE = 16.0
_HALF = (DT_HALF, DT_BFLOAT16)
_CONV_FILTER_INPUT = {"Conv2D": 1, "Conv3D": 1, "_FusedConv2D": 1, "FusedPadConv2D": 2,
                      "Conv2DBackpropInput": 1, "Conv3DBackpropInput": 1, "Conv3DBackpropInputV2": 1}
_CONV_FILTER_OUTPUT = {"Conv2DBackpropFilter", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2"}


@dataclass(frozen=True)
class Finding:
    """One reason the rewritten graph may run slower than it could.

    Attributes:
        kind: ``float32_heavy_op``, ``tensor_core_shape``, ``float32_island`` or ``loop_casts``.
        share: the part of the graph it concerns, from 0 to 1, of ``measure``; None when unknown.
        measure: ``flops`` (of all heavy ops) or ``cast_bytes`` (of all inserted Casts, per step).
        nodes: the nodes it names, most important first.
        why: one sentence.
        fix: one sentence: what to change.
        flops: the FLOPs of the ops concerned, if known.
        cast_bytes: bytes the Casts concerned read and write per step (or iteration), if known.
        details: kind-specific data (see the README's JSON schema).
    """

    kind: str
    share: float | None
    measure: str
    nodes: tuple[str, ...]
    why: str
    fix: str
    flops: int | None = None
    cast_bytes: int | None = None
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Bound:
    """The speed-up the rewrite can give at most, by the model of :func:`speedup_bound`."""

    heavy_flops: int
    half_flop_share: float | None
    cast_bytes: int
    cast_time_share: float | None
    machine_balance: float
    amdahl_limit: float | None
    speedup_bound: float | None


@dataclass(frozen=True)
class Diagnosis:
    """What ``amp-rewrite doctor`` found: the findings, highest share first, and the bound."""

    target: str
    device_type: str
    heavy_ops: int
    findings: tuple[Finding, ...]
    bound: Bound

    def as_dict(self) -> dict:
        """The JSON-able form (the ``doctor`` section of ``--report``)."""
        return {"target": self.target, "device_type": self.device_type, "heavy_ops": self.heavy_ops,
                "bound": asdict(self.bound), "findings": [asdict(f) for f in self.findings]}


def speedup_bound(half_share: float | None, cast_bytes: int, heavy_flops: int,
                  balance: float = MACHINE_BALANCE) -> tuple[float | None, float | None, float | None]:
    """(Amdahl limit, cast time share, speed-up bound) of a rewrite.

    The model: the float32 step's time is its heavy ops' time, proportional
    to their FLOPs. At best the half FLOP share ``f`` then costs nothing, and
    the Casts add the time of moving their bytes, as much as ``balance`` FLOPs
    per byte: ``c = balance * cast_bytes / heavy_flops``. The speed-up is at
    most ``1 / ((1 - f) + c)``; Amdahl's limit ``1 / (1 - f)`` leaves out the
    Casts. Time in other ops only lowers a speed-up above 1, so it is a bound.
    """
    if half_share is None or heavy_flops <= 0:
        return None, None, None
    cast_share = balance * cast_bytes / heavy_flops
    rest = 1.0 - half_share
    limit = None if rest <= 0 else 1.0 / rest
    return limit, cast_share, 1.0 / (rest + cast_share) if rest + cast_share > 0 else None


def diagnose(result) -> Diagnosis:
    """The findings and the bound for a rewrite's result (a :class:`~amp_rewrite.pipeline.RewriteResult`)."""
    outcomes = result.node_outcomes
    ops = imported_ops(result.graph_def, FLOP_OPS | {"Cast"}) or {}
    heavy = {name: entry for name, entry in outcomes.items() if entry["op"] in FLOP_OPS}
    flops = {name: op_flops(ops[name]) if name in ops else None for name in heavy}
    total = sum(f for f in flops.values() if f)
    half = sum(f for name, f in flops.items() if f and heavy[name]["precision"] in ("float16", "bfloat16"))
    cast_bytes = {name: cast_traffic(ops[name]) if name in ops else None for name in result.casts}
    all_bytes = sum(b for b in cast_bytes.values() if b)
    findings = [*_float32_heavy_ops(result, heavy, flops, total)]
    if result.config.target == "float16" and result.config.device_type == "GPU":
        findings += _tensor_core_shapes(heavy, ops, flops, total)
    findings += [_island_finding(island, cast_bytes, all_bytes, outcomes, result.lists.origins)
                 for island in float32_islands(result.graph_def, outcomes, result.casts)]
    findings += _loop_cast_findings(result.applied.casts_in_loops, cast_bytes, all_bytes)
    findings.sort(key=lambda f: (-(f.share or 0.0), f.kind, f.nodes))
    limit, cast_share, bound = speedup_bound(half / total if total else None, all_bytes, total)
    return Diagnosis(
        target=result.config.target, device_type=result.config.device_type or "", heavy_ops=len(heavy),
        findings=tuple(findings),
        bound=Bound(heavy_flops=total, half_flop_share=half / total if total else None, cast_bytes=all_bytes,
                    cast_time_share=cast_share, machine_balance=MACHINE_BALANCE, amdahl_limit=limit,
                    speedup_bound=bound))


def cast_traffic(op) -> int | None:
    """Bytes a Cast reads and writes: elements × (source size + destination size); unknown dims count 1."""
    shape = op.outputs[0].shape
    if shape.rank is None:
        return None
    elements = 1
    for d in shape.as_list():
        elements *= d if d is not None and d >= 0 else 1
    return elements * (op.inputs[0].dtype.size + op.outputs[0].dtype.size)


# -- 1. heavy ops left float32 -----------------------------------------------------------


def _float32_heavy_ops(result, heavy: dict, flops: dict, total: int) -> list[Finding]:
    found = []
    origins = result.lists.origins
    target = result.config.target
    for name, entry in heavy.items():
        if entry["precision"] != "float32":
            continue
        category, fix = _why_float32(entry, target, result.config.device_type)
        f = flops[name]
        if f is None:
            fix += "; its shape is unknown, so its FLOPs are not counted: give the graph static shapes"
        found.append(Finding(
            kind="float32_heavy_op", share=f / total if f is not None and total else None, measure="flops",
            nodes=(name,), why=entry["reason"], fix=fix, flops=f,
            details={"op": entry["op"], "category": category, "shape_known": f is not None,
                     "chain": explain_chain(result.node_outcomes, name, origins)}))
    return found


def _why_float32(entry: dict, target: str, device_type: str | None) -> tuple[str, str]:
    """(category, fix) for a heavy op left float32, from its colour and rule."""
    colour, rule, op = entry["colour"], entry["rule"], entry["op"]
    if colour == "preserved":
        return "preserved", ("drop it from --preserve, or fetch a node after it, if it may change dtype"
                             if rule.startswith("fetched") else f"it is left alone ({rule})")
    if rule.startswith(f"no {target} kernel"):
        return "no_half_kernel", f"no {target} kernel for {op} on {device_type}: run it on a device that has one"
    if "deny" in rule and (colour != "deny" or entry.get("cause")):
        return "deny_neighbour", (f"a deny-list op next to it keeps it float32: if that op is safe in {target} "
                                  "here, move it to the infer list (--deny-remove OP --infer-add OP) and --validate")
    if colour == "deny":
        return "list", f"{op} is on the deny list: --deny-remove {op} --allow-add {op}, then --validate"
    if colour in ("infer", "clear", "none"):
        return "list", f"{op} is not on the allow list: --allow-add {op}"
    return "other", "see the chain of reasons (amp-rewrite explain IN NODE)"


# -- 2. tensor-core shapes ---------------------------------------------------------------------


def _tensor_core_shapes(heavy: dict, ops: dict, flops: dict, total: int) -> list[Finding]:
    found = []
    for name, entry in heavy.items():
        if entry["precision"] != "float16" or name not in ops:
            continue
        dims = tensor_core_dims(ops[name])
        bad = {label: size for label, size in dims.items() if size % TENSOR_CORE_MULTIPLE}
        if not bad:
            continue
        padding = {label: padded(size) for label, size in bad.items()}
        f = flops[name]
        text = ", ".join(f"{label} {size}" for label, size in bad.items())
        fix = ", ".join(f"{label} {size} → {padding[label]} (+{padding[label] - size})" for label, size in bad.items())
        found.append(Finding(
            kind="tensor_core_shape", share=f / total if f is not None and total else None, measure="flops",
            nodes=(name,), flops=f,
            why=f"{name} ({entry['op']}) runs in float16 with {text}: not multiples of {TENSOR_CORE_MULTIPLE}, "
                "so tensor cores cannot run it at full rate",
            fix=f"pad {fix}", details={"op": entry["op"], "dims": dims, "padded": padding}))
    return found


def padded(size: int) -> int:
    """The smallest multiple of :data:`TENSOR_CORE_MULTIPLE` at least ``size``."""
    return -(-size // TENSOR_CORE_MULTIPLE) * TENSOR_CORE_MULTIPLE


def tensor_core_dims(op) -> dict[str, int]:
    """The counts tensor cores care about, by label (``K``, ``N``, ``C_in``, ``C_out``); unknown ones left out."""
    def dims(tensor):
        return tensor.shape.as_list() if tensor.shape.rank is not None else None

    kind = op.type
    found: dict[str, int | None] = {}
    if kind in ("MatMul", "_FusedMatMul"):
        a, b = dims(op.inputs[0]), dims(op.inputs[1])
        found["K"] = a[0 if op.get_attr("transpose_a") else 1] if a else None
        found["N"] = b[0 if op.get_attr("transpose_b") else 1] if b else None
    elif kind in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        a, b = dims(op.inputs[0]), dims(op.inputs[1])
        found["K"] = a[-2 if op.get_attr("adj_x") else -1] if a else None
        found["N"] = b[-2 if op.get_attr("adj_y") else -1] if b else None
    elif kind in _CONV_FILTER_INPUT or kind in _CONV_FILTER_OUTPUT:
        filt = dims(op.outputs[0] if kind in _CONV_FILTER_OUTPUT else op.inputs[_CONV_FILTER_INPUT[kind]])
        found["C_in"], found["C_out"] = (filt[-2], filt[-1]) if filt else (None, None)
    return {label: size for label, size in found.items() if isinstance(size, int) and size > 0}


# -- 3. float32 islands and Casts in loops -------------------------------------------------------


# Islands the painting keeps float32 on purpose: the reason its rule gives, what the island is, why no fix.
_ON_PURPOSE = (
    (NORMALIZATION_REASON, "a batch or layer norm, kept float32 with its gradient",
     "a norm stays float32 on purpose (its variance needs float32's bits)"),
    (SATURATION_REASON, "an activation whose gradient reads its output, kept float32 with that gradient",
     "such an activation stays float32 on purpose (in half a saturated unit's gradient is 0 and it stops learning)"),
)


def _island_finding(island: Island, cast_bytes: dict, all_bytes: int, outcomes: dict, origins) -> Finding:
    casts = island.casts_in + island.casts_out
    sizes = [cast_bytes.get(c) for c in casts]
    known = sum(b for b in sizes if b) if sizes and all(b is not None for b in sizes) else None
    keepers = [name for name in island.nodes if outcomes[name]["colour"] == "deny"
               and outcomes[name].get("rule") == "deny-list op"
               and outcomes[name].get("cause") not in island.nodes]
    entries = sorted({outcomes[name]["op"] for name in keepers})
    kept_by = [{"node": name, "op": outcomes[name]["op"],
                "list": origins.get(("deny", outcomes[name]["op"]), "deny list")} for name in keepers]
    remedy = " ".join(f"--deny-remove {op} --infer-add {op}" for op in entries)
    purpose = next((found for reason, *found in _ON_PURPOSE
                    if any(reason in outcomes[name].get("reason", "") for name in island.nodes)), None)
    fix = (f"if {', '.join(entries)} {'is' if len(entries) == 1 else 'are'} safe in half here, {remedy} "
           "and check with --validate; "
           f"that saves {len(casts)} Casts per step" if entries else
           f"none needed: {purpose[1]}, and its Casts are the price" if purpose else
           "join it to its half neighbours (amp-rewrite explain IN NODE says why it stays float32)")
    why = (f"{len(island.nodes)} float32 node{'s' if len(island.nodes) != 1 else ''} between half ops "
           f"({', '.join(island.nodes[:4])}{', ...' if len(island.nodes) > 4 else ''}) cost "
           f"{len(island.casts_in)} Cast{'s' if len(island.casts_in) != 1 else ''} in and "
           f"{len(island.casts_out)} out per step"
           + (f", {known:,} bytes" if known is not None else ", bytes unknown (no static shapes)")
           + (f"; kept float32 by the deny list entr{'ies' if len(entries) > 1 else 'y'} {', '.join(entries)}"
              if entries else f"; {purpose[0]}" if purpose else ""))
    return Finding(kind="float32_island", share=known / all_bytes if known is not None and all_bytes else None,
                   measure="cast_bytes", nodes=island.nodes, why=why, fix=fix, cast_bytes=known,
                   details={"casts_in": list(island.casts_in), "casts_out": list(island.casts_out),
                            "kept_by": kept_by})


def _loop_cast_findings(casts_in_loops: list[str], cast_bytes: dict, all_bytes: int) -> list[Finding]:
    by_loop: dict[str, list[str]] = {}
    for cast in casts_in_loops:
        by_loop.setdefault(cast.split("::")[0] if "::" in cast else "", []).append(cast)
    found = []
    for loop, casts in sorted(by_loop.items()):
        sizes = [cast_bytes.get(c) for c in casts]
        known = sum(b for b in sizes if b) if all(b is not None for b in sizes) else None
        where = f"loop body function {loop}" if loop else "a while loop of the main graph"
        found.append(Finding(
            kind="loop_casts", share=known / all_bytes if known is not None and all_bytes else None,
            measure="cast_bytes", nodes=tuple(casts), cast_bytes=known,
            why=f"{len(casts)} inserted Cast{'s' if len(casts) != 1 else ''} in {where} run on every iteration"
                + (f", {known:,} bytes each" if known is not None else ""),
            fix="keep the loop body in one precision: add its float32 ops to the infer list, or keep its half "
                "ops float32 with --deny-add, so no value changes type inside the loop",
            details={"loop": loop or None}))
    return found


# -- text -----------------------------------------------------------------------------------------


def render_lines(diagnosis: Diagnosis, *, limit: int = 20) -> list[str]:
    """The doctor's printout: a head line, the bound, then up to ``limit`` findings, highest share first."""
    b = diagnosis.bound
    share = "unknown share" if b.half_flop_share is None else f"{b.half_flop_share:.1%}"
    lines = [f"heavy ops: {diagnosis.heavy_ops}, {b.heavy_flops:,} FLOPs per step (unknown dims count as 1), "
             f"{share} of them in {diagnosis.target} on {diagnosis.device_type}",
             bound_line(b)]
    if diagnosis.device_type == "CPU" and b.speedup_bound is not None:
        lines.append("    (the bound assumes half math is no slower than float32; CPUs without native half "
                     "arithmetic run it slower: measure with --benchmark)")
    in_islands = sum(f.cast_bytes or 0 for f in diagnosis.findings if f.kind == "float32_island")
    if b.cast_bytes:
        lines.append(f"Cast bytes: {in_islands / b.cast_bytes:.1%} in float32 islands, the rest where half "
                     "regions meet inputs, weights, outputs and loops")
    shown = diagnosis.findings[:limit]
    lines.append(f"findings: {len(diagnosis.findings)}" + (", largest share first" if shown else ""))
    for k, finding in enumerate(shown, 1):
        share = "share ?" if finding.share is None else f"{finding.share:.1%} of {finding.measure.replace('_', ' ')}"
        lines += [f"{k:2}. [{share}] {finding.kind}: {', '.join(finding.nodes[:3])}"
                  + (f" (+{len(finding.nodes) - 3} more)" if len(finding.nodes) > 3 else ""),
                  f"    why: {finding.why}", f"    fix: {finding.fix}"]
    if len(diagnosis.findings) > limit:
        lines.append(f"    ... {len(diagnosis.findings) - limit} more in the --report JSON")
    return lines


def bound_line(b: Bound) -> str:
    """One line: the speed-up the model allows, or why there is none to state."""
    if b.speedup_bound is None:
        return "bound: unknown (no heavy op with a known shape)"
    limit = "unbounded" if b.amdahl_limit is None else f"{b.amdahl_limit:.2f}x"
    casts = f"Casts move {b.cast_bytes:,} bytes per step, {b.cast_time_share:.1%} of the float32 step's time"
    if b.speedup_bound < 1:
        return (f"bound: {b.speedup_bound:.2f}x, slower than float32 even at best ({casts}; Amdahl limit of the "
                f"half FLOPs alone {limit}): the Casts outweigh what half saves")
    return f"bound: at most {b.speedup_bound:.2f}x faster than float32 (Amdahl limit {limit}; {casts})"
