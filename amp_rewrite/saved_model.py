"""Rewriting a SavedModel: every function it holds, with its signatures kept float32.

A TF2 SavedModel's graph holds little beyond variables and the calls behind
its signatures and saver; the model lives in the function library, and the
object graph names the concrete functions ``tf.saved_model.load`` restores.
Each of those is an *entry*: its inputs and outputs keep their dtypes for
every caller (so serving signatures and restored methods take and return
float32), while its body and everything it calls are rewritten, once: a
function called both by the loader and by a signature wrapper is one
function, rewritten in place. Entries not called from the graph get a
synthetic preserved call, so that the rewrite reaches them; those calls are
removed again, from the graph and from the report. Variables are never
changed; they are read in float32 and cast after the read.
"""

from __future__ import annotations

from dataclasses import replace

from amp_rewrite.config import Config
from amp_rewrite.graph.facts import node_name, sinks
from amp_rewrite.graph.functions import ENTRY_PREFIX, entry_call
from amp_rewrite.pipeline import RewriteResult, rewrite


def rewrite_saved_model(saved, *, config: Config | None = None) -> tuple[object, RewriteResult]:
    """Rewrites every MetaGraph of a SavedModel proto; returns (new proto, result of the serving graph).

    Args:
        saved: a ``SavedModel`` proto; never modified.
        config: the rewrite configuration (``fetches`` and ``preserve`` are set here).
    """
    config = config if config is not None else Config.from_env()
    out = type(saved)()
    out.CopyFrom(saved)
    results = []
    for meta in out.meta_graphs:
        results.append(_rewrite_meta_graph(meta, config))
    serving = next((r for m, r in zip(out.meta_graphs, results) if "serve" in m.meta_info_def.tags), results[0])
    return out, serving


def _rewrite_meta_graph(meta, config: Config) -> RewriteResult:
    graph_def = meta.graph_def
    originals = [node.name for node in graph_def.node]
    called = {node.attr["f"].func.name for node in graph_def.node if "f" in node.attr}
    entries = [name for name in sorted(meta.object_graph_def.concrete_functions) if name not in called]
    staged = type(graph_def)()
    staged.CopyFrom(graph_def)
    synthetic = _entry_calls(staged, entries)
    del staged.node[:]
    staged.node.extend(synthetic + list(graph_def.node))
    restored = tuple(sorted(meta.object_graph_def.concrete_functions))
    if restored:
        keep = tuple(originals) + tuple(node.name for node in synthetic)
        preserve: tuple[str, ...] = ()
    else:
        keep, preserve = _v1_interface(meta)
    result = rewrite(staged, config=replace(config, fetches=keep, preserve=preserve, fixed_signatures=restored),
                     in_place=True)
    rewritten = result.graph_def
    kept = [node for node in rewritten.node if not node.name.startswith(ENTRY_PREFIX + "/")]
    del rewritten.node[:]
    rewritten.node.extend(kept)
    meta.graph_def.CopyFrom(rewritten)
    explain = result.explain
    return replace(result, nodes_total=result.nodes_total - len(synthetic),
                   explain=lambda: _without_entry_calls(explain()))


def _without_entry_calls(outcomes: dict[str, dict]) -> dict[str, dict]:
    """The outcomes without the synthetic calls, which the written SavedModel does not hold.

    A node whose cause was one of them (an argument of a restored function)
    keeps its verdict and rule, without the clause naming the call.
    """
    prefix = ENTRY_PREFIX + "/"
    kept = {}
    for name, entry in outcomes.items():
        if name.startswith(prefix):
            continue
        if entry.get("cause", "").startswith(prefix):
            entry = dict(entry)
            del entry["cause"]
            entry["reason"] = entry["reason"][:entry["reason"].rindex("; its ")]
        kept[name] = entry
    return kept


def _v1_interface(meta) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a TF1 MetaGraph's users reach: (fetched, fed) node names.

    Fetched: signature outputs, the saver's tensors, every node a collection
    names (train ops, initializers, variables) and every node without
    consumers; fed: signature inputs. The rest of the graph is free to change.
    """
    names = {node.name for node in meta.graph_def.node}
    fetched = sinks(meta.graph_def)
    fed: set[str] = set()
    for signature in meta.signature_def.values():
        fetched.update(node_name(t.name) for t in signature.outputs.values() if t.name)
        fed.update(node_name(t.name) for t in signature.inputs.values() if t.name)
    saver = meta.saver_def
    for ref in (saver.filename_tensor_name, saver.save_tensor_name, saver.restore_op_name):
        if ref:
            fetched.add(node_name(ref))
    for collection in meta.collection_def.values():
        if collection.WhichOneof("kind") == "node_list":
            fetched.update(node_name(ref) for ref in collection.node_list.value)
    return tuple(sorted(fetched & names)), tuple(sorted(fed & names))


def _entry_calls(graph_def, entries: list[str]) -> list:
    """A placeholder per input and a preserved call for each monomorphic entry function."""
    library = {f.signature.name: f for f in graph_def.library.function}
    nodes = []
    for name in entries:
        signature = library[name].signature if name in library else None
        if signature is None or any(a.type_attr or a.number_attr or a.type_list_attr
                                    for a in list(signature.input_arg) + list(signature.output_arg)):
            continue
        nodes.extend(entry_call(signature, f"{ENTRY_PREFIX}/{name}"))
    return nodes
