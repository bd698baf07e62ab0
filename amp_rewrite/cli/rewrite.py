"""IN rewritten in memory as the flags say, for every subcommand that rewrites, and the sample inputs it runs on.

:func:`load_and_rewrite` reads a GraphDef and rewrites it (through
``--validate`` when asked; with ``--tune``, kept only if it ran faster);
:func:`rewrite_saved_model_input` does the same
for a SavedModel directory, and :func:`rewrite_in_memory` picks the one IN
needs. A :class:`~amp_rewrite.errors.GraphError` from them (a fetch naming no
node or a port its node lacks, say: the rewrite checks the fetches) names IN
first. :func:`sample_feeds` and :func:`fetches_or_sinks` are what
``--validate`` and ``doctor --benchmark`` run the graph with: the arrays of
``--inputs FEEDS.npz`` (read by :func:`sample_inputs`, any fault one line
naming the file) or random ones, and the fetches or the graph's outputs;
``--tune`` reads the same ``--inputs``.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from amp_rewrite import pipeline
from amp_rewrite.cli.args import config_from_args
from amp_rewrite.errors import GraphError, UsageError, first_line
from amp_rewrite.graph import io as graph_io
from amp_rewrite.graph.facts import fetchable_sinks
from amp_rewrite.saved_model import rewrite_saved_model


@contextmanager
def naming_input(path: str):
    """A GraphError raised inside names the input file first."""
    try:
        yield
    except GraphError as exc:
        raise GraphError(f"{path}: {exc}") from None


def load_and_rewrite(args):
    """IN (a GraphDef) rewritten, validated with ``--validate``, kept if faster with ``--tune``: the RewriteResult."""
    config = config_from_args(args)
    graph_def = graph_io.load_graph_def(args.input, input_format=args.input_format)
    is_tuning = getattr(args, "tune", False)
    with naming_input(args.input):
        if getattr(args, "validate", False):
            result = _validated(args, graph_def, config)
        else:  # in place unless --tune times the float32 graph
            result = pipeline.rewrite(graph_def, config=config, in_place=not is_tuning)
        if is_tuning:
            result = _tuned(args, graph_def, result)
    return result


def _tuned(args, graph_def, result):
    """``result`` if it ran faster than ``graph_def`` here, else ``graph_def``; the decision said on stderr."""
    from amp_rewrite.tune.whole_graph import decide

    feeds = sample_inputs(args.inputs) if args.inputs else None
    result = decide(graph_def, result, feeds=feeds, seed=args.seed)
    print(f"amp-rewrite: {args.input}: the graph {result.tuning.line(result.config.target)}", file=sys.stderr)
    return result


def rewrite_saved_model_input(args):
    """IN (a SavedModel directory) rewritten: the rewritten proto and the RewriteResult."""
    saved = graph_io.load_saved_model(args.input)
    with naming_input(args.input):
        return rewrite_saved_model(saved, config=config_from_args(args))


def rewrite_in_memory(args):
    """IN rewritten, a GraphDef or a SavedModel directory: the RewriteResult, for the subcommands that write nothing."""
    if graph_io.is_saved_model_dir(args.input):
        return rewrite_saved_model_input(args)[1]
    return load_and_rewrite(args)


def _validated(args, graph_def, config):
    from amp_rewrite import validate

    if bool(args.inputs) == bool(args.random_inputs):
        raise UsageError("--validate needs sample inputs: give exactly one of --inputs FEEDS.npz and --random-inputs")
    feeds = sample_feeds(args, graph_def)
    fetches = fetches_or_sinks(config.fetches, graph_def)
    result, report = validate.validated_rewrite(
        graph_def, feeds=feeds, fetches=fetches, config=config,
        tolerance=validate.Tolerance(rtol=args.rtol, atol=args.atol, metric=args.metric),
        max_runs=args.max_runs, progress=validate.terminal_progress())
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if not report.passed:
        raise validate.ValidationError(f"{args.input}: validation failed: {report.message}")
    return result


def sample_feeds(args, graph_def) -> dict:
    """The arrays of ``--inputs``, else random ones for every placeholder (seeded by ``--seed``)."""
    from amp_rewrite import validate

    return sample_inputs(args.inputs) if args.inputs else validate.random_feeds(graph_def, seed=args.seed)


def fetches_or_sinks(fetches, graph_def) -> tuple[str, ...]:
    """The fetches given, else every node without consumers that has an output to fetch."""
    return fetches or tuple(sorted(fetchable_sinks(graph_def)))


def sample_inputs(path: str) -> dict:
    """The arrays of an ``.npz`` file, by key; anything else is a one-line error naming the file."""
    import numpy as np

    from amp_rewrite import validate

    def refuse(reason: str):
        return validate.ValidationError(f"{path}: cannot read sample inputs: {reason}")

    if not os.path.isfile(path):
        raise refuse("no such file" if not os.path.lexists(path) else "not a regular file")
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - numpy raises many kinds for a damaged file
        raise refuse(f"not an .npz archive ({first_line(exc, with_type=True)})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise refuse("a single .npy array; save the inputs with numpy.savez(path, name=array, ...)")
    try:
        with loaded:
            feeds = {key: loaded[key] for key in loaded.files}
    except Exception as exc:  # noqa: BLE001 - a truncated member, a pickled object, ...
        raise refuse(f"a damaged .npz archive ({first_line(exc, with_type=True)})") from None
    if not feeds:
        raise refuse("the archive holds no arrays")
    return feeds
