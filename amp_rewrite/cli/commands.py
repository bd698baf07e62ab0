"""What each subcommand does with its parsed flags: :func:`run` (the rewrite), explain, doctor, strip and cache.

Each returns the exit code on success and raises on failure; ``cli.main``
turns the exception into its one stderr line and exit code. The rewrite
checks its paths first, renders the report, and stages OUT and the report
beside their targets, renaming both into place only when both are complete.
``explain`` and ``doctor`` rewrite in memory and write nothing; ``strip``
undoes mixed precision; ``cache`` lists or clears the tuning cache.
"""

from __future__ import annotations

import json
import logging
import os

from amp_rewrite.cli.args import split_names
from amp_rewrite.cli.paths import check_output_is_not_input, check_rewrite_paths
from amp_rewrite.cli.process import EXIT_OK
from amp_rewrite.cli.rewrite import (
    fetches_or_sinks,
    load_and_rewrite,
    naming_input,
    rewrite_in_memory,
    rewrite_saved_model_input,
    sample_feeds,
)
from amp_rewrite.errors import GraphError, UsageError
from amp_rewrite.graph import io as graph_io
from amp_rewrite.paint.explain import explain_chain
from amp_rewrite.report.doctor import diagnose, render_lines
from amp_rewrite.report.html import render_html


def run(args) -> int:
    """Rewrites IN to OUT; writes the report; prints the summary line."""
    check_rewrite_paths(args)
    if graph_io.is_saved_model_dir(args.input):
        return run_saved_model(args)
    graph_io.output_file_target(args.output)
    result = load_and_rewrite(args)
    _finish(args, result, lambda outputs: outputs.add_file(
        args.output, graph_io.graph_def_bytes(result.graph_def, graph_io.format_of(args.output, args.output_format))))
    return EXIT_OK


def run_saved_model(args) -> int:
    """Rewrites a SavedModel directory into another."""
    if args.validate or args.inputs or args.random_inputs or args.tune:
        flag = ("--validate" if args.validate else "--tune" if args.tune else "--inputs" if args.inputs
                else "--random-inputs")
        raise UsageError(f"{args.input}: {flag} takes a GraphDef input (.pb or .pbtxt), not a SavedModel; "
                         "validate or tune a frozen graph of the model instead")
    graph_io.saved_model_target(args.output, replace=args.in_place)
    rewritten, result = rewrite_saved_model_input(args)
    _finish(args, result, lambda outputs: outputs.add_saved_model(rewritten, args.input, args.output,
                                                                  replace=args.in_place))
    return EXIT_OK


def _finish(args, result, stage) -> None:
    """Renders the report; stages the output and the report; renames both into place; prints the summary."""
    report_bytes = _report_bytes(args, result)
    _warn_unmatched(args, result)
    with graph_io.Outputs() as outputs:
        if report_bytes is not None:
            outputs.add_file(args.report, report_bytes)
        stage(outputs)
        outputs.commit()
    if not args.quiet:
        print(result.summary())


def _report_bytes(args, result) -> bytes | None:
    """The ``--report`` file (JSON, or the HTML page), with the doctor's section; None without ``--report``."""
    if not args.report:
        return None
    doctor = _doctor_section(result)
    if args.report.endswith(".html"):
        return render_html(result, title=os.path.basename(args.input), doctor=doctor).encode()
    return (json.dumps({**result.report(), "doctor": doctor}, indent=1, sort_keys=True) + "\n").encode()


def _doctor_section(result) -> dict:
    return diagnose(result).as_dict()


def _warn_unmatched(args, result) -> None:
    for pattern in result.unmatched_patterns:
        logging.getLogger(__name__).warning("%s: --keep-float32 %r matches no node", args.input, pattern)


def run_explain(args) -> int:
    """Prints the chain of reasons for one node."""
    result = rewrite_in_memory(args)
    _warn_unmatched(args, result)
    if args.node not in result.node_outcomes:
        inside = [name for name in result.node_outcomes if name.endswith("::" + args.node)]
        hint = f"; inside functions: {', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''}" if inside else ""
        raise GraphError(f"{args.input}: no node named {args.node!r}{hint}")
    for line in explain_chain(result.node_outcomes, args.node, result.lists.origins):
        print(line)
    return EXIT_OK


def run_doctor(args) -> int:
    """Prints the doctor's findings and bound for IN."""
    if graph_io.is_saved_model_dir(args.input) and (args.benchmark or args.inputs):
        raise UsageError(f"{args.input}: {'--benchmark' if args.benchmark else '--inputs'} takes a GraphDef input "
                         "(.pb or .pbtxt), not a SavedModel; time a frozen graph of the model instead")
    result = rewrite_in_memory(args)
    print(f"{args.input}: {result.summary(with_flops=False)}")
    diagnosis = diagnose(result)
    for line in render_lines(diagnosis, limit=args.top):
        print(line)
    if args.benchmark:
        print(_benchmark_line(args, result, diagnosis.bound.speedup_bound))
    return EXIT_OK


def _benchmark_line(args, result, bound) -> str:
    """Times the float32 graph (read again) against the rewritten one; the measured line."""
    from amp_rewrite.report.measure import measure_speedup, measurement_line

    original = graph_io.load_graph_def(args.input, input_format=args.input_format)
    feeds = sample_feeds(args, original)
    fetches = fetches_or_sinks(result.config.fetches, original)
    init_op = _init_op(args, original)
    measured = measure_speedup(original, result.graph_def, feeds=feeds, fetches=fetches, runs=args.runs,
                               init_op=init_op)
    return measurement_line(measured, target=result.config.target, bound=bound)


def _init_op(args, graph_def) -> str | None:
    """``--init-op``, else a node named ``init`` if the graph has one; a name the graph lacks is a usage error."""
    init_op = args.init_op or ("init" if any(n.name == "init" for n in graph_def.node) else None)
    if init_op and not any(n.name == init_op for n in graph_def.node):
        raise UsageError(f"{args.input}: --init-op {init_op!r} names no node of the graph")
    return init_op


def run_strip(args) -> int:
    """Strips IN to OUT; prints the summary line."""
    check_output_is_not_input(args)
    result = _strip_saved_model(args) if graph_io.is_saved_model_dir(args.input) else _strip_graph_def(args)
    if not args.quiet:
        print(result.summary())
    return EXIT_OK


def _strip_saved_model(args):
    """A SavedModel directory stripped into another: the StripResult."""
    from amp_rewrite.strip import strip_saved_model

    graph_io.saved_model_target(args.output, replace=args.in_place)
    saved = graph_io.load_saved_model(args.input)
    with naming_input(args.input):
        stripped, result = strip_saved_model(saved, target=args.target)
    graph_io.save_saved_model(stripped, args.input, args.output, replace=args.in_place)
    return result


def _strip_graph_def(args):
    """A GraphDef stripped into OUT: the StripResult."""
    from amp_rewrite.strip import strip

    graph_io.output_file_target(args.output)
    graph_def = graph_io.load_graph_def(args.input, input_format=args.input_format)
    with naming_input(args.input):
        result = strip(graph_def, target=args.target, fetches=split_names(args.fetch) or None)
    graph_io.save_graph_def(result.graph_def, args.output,
                            output_format=graph_io.format_of(args.output, args.output_format))
    return result


def run_cache(args) -> int:
    """Lists this machine's tuning cache files (every file with ``--all``), or removes them (``--clear``)."""
    from amp_rewrite.config import Config
    from amp_rewrite.tune import cache_files
    from amp_rewrite.tune.cache import default_cache_dir

    directory = Config.from_env().tune_cache_dir or default_cache_dir()
    here = _cache_here()
    listed = cache_files.list_files(directory)
    chosen = [item for item in listed if args.all or item.is_here(here)]
    if args.clear:
        removed = cache_files.remove(chosen)
        print(f"removed {len(removed)} tuning cache file{'s' if len(removed) != 1 else ''} from {directory}")
        return EXIT_OK
    if not chosen:
        print(f"no tuning cache of this machine in {directory}")
    for index, item in enumerate(chosen):
        if index:
            print()
        for line in cache_files.describe(item, here):
            print(line)
    others = len(listed) - len(chosen)
    if others:
        print(f"{'' if not chosen else chr(10)}{others} more file{'s' if others != 1 else ''} of other devices in "
              f"{directory} (--all lists them)")
    return EXIT_OK


def _cache_here():
    """This machine's devices, TensorFlow and amp-rewrite, as the cache files name them."""
    import tensorflow as tf

    from amp_rewrite.tune.cache import device_description, first_gpu_name, package_version
    from amp_rewrite.tune.cache_files import Here

    gpu = first_gpu_name()
    devices = {device_description("CPU")} | ({device_description("GPU", gpu_name=gpu)} if gpu else set())
    return Here(frozenset(devices), tf.__version__, package_version())
