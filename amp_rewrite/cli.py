"""The ``amp-rewrite`` command: read a graph, rewrite it, write it and a report.

Exit codes: 0 done; 1 bad input (the message names the file, node or op);
2 usage (a bad flag, an OUT that is no regular file); 130/143 interrupted by
SIGINT/SIGTERM. Every failure is one ``amp-rewrite:`` line on stderr. Nothing
is written unless every part succeeded: OUT and the report are staged beside
their targets and renamed into place together.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import contextmanager

import numpy as np

from amp_rewrite.cli_args import (
    build_doctor_parser,
    build_explain_parser,
    build_parser,
    build_strip_parser,
    config_from_args,
    split_names,
)
from amp_rewrite.cli_paths import check_output_is_not_input, check_rewrite_paths
from amp_rewrite.cli_process import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    Terminated,
    set_up_output,
    sigterm_raises_terminated,
)
from amp_rewrite.errors import AmpRewriteError, GraphError, UsageError, first_line
from amp_rewrite.graph_facts import parse_input, sinks


def run_strip(args) -> int:
    """Strips IN to OUT; prints the summary line."""
    from amp_rewrite import graph_io
    from amp_rewrite.strip import strip, strip_saved_model

    check_output_is_not_input(args)
    if graph_io.is_saved_model_dir(args.input):
        graph_io.saved_model_target(args.output, replace=args.in_place)
        saved = graph_io.load_saved_model(args.input)
        with _naming_input(args.input):
            stripped, result = strip_saved_model(saved, target=args.target)
        graph_io.save_saved_model(stripped, args.input, args.output, replace=args.in_place)
    else:
        graph_io.output_file_target(args.output)
        graph_def = graph_io.load_graph_def(args.input, input_format=args.input_format)
        with _naming_input(args.input):
            result = strip(graph_def, target=args.target, fetches=split_names(args.fetch) or None)
        graph_io.save_graph_def(result.graph_def, args.output,
                                output_format=graph_io.format_of(args.output, args.output_format))
    if not args.quiet:
        print(result.summary())
    return EXIT_OK


@contextmanager
def _naming_input(path: str):
    """A GraphError raised inside names the input file first."""
    try:
        yield
    except GraphError as exc:
        raise GraphError(f"{path}: {exc}") from None


def _load_and_rewrite(args):
    from amp_rewrite import graph_io
    from amp_rewrite.pipeline import rewrite

    config = config_from_args(args)
    graph_def = graph_io.load_graph_def(args.input, input_format=args.input_format)
    try:
        _check_fetch_ports(graph_def, config.fetches or ())
        if getattr(args, "validate", False):
            return _validated(args, graph_def, config)
        return rewrite(graph_def, config=config, in_place=True)  # nothing reads the float32 graph again
    except GraphError as exc:
        raise GraphError(f"{args.input}: {exc}") from None


def _check_fetch_ports(graph_def, fetches) -> None:
    """A fetch ``name:port`` must name an output the node has (when its op is known)."""
    from amp_rewrite.op_registry import OpRegistry
    from amp_rewrite.typed_graph import output_count

    with_port = [f for f in fetches if ":" in f]
    if not with_port:
        return
    nodes = {node.name: node for node in graph_def.node}
    registry = OpRegistry(graph_def.library)
    for fetch in with_port:
        name, port, _ = parse_input(fetch)
        # None: a missing node is the rewrite's error; an unknown op's outputs are unknown.
        outputs = output_count(nodes[name], registry) if name in nodes else None
        if outputs is not None and not 0 <= port < outputs:
            raise GraphError(f"fetch {fetch!r}: node {name} (op {nodes[name].op}) has "
                             f"{outputs} output{'s' if outputs != 1 else ''}")


def _validated(args, graph_def, config):
    from amp_rewrite import validate

    if bool(args.inputs) == bool(args.random_inputs):
        raise UsageError("--validate needs sample inputs: give exactly one of --inputs FEEDS.npz and --random-inputs")
    if args.inputs:
        feeds = _sample_inputs(args.inputs)
    else:
        feeds = validate.random_feeds(graph_def, seed=args.seed)
    fetches = config.fetches or tuple(sorted(_sinks_with_outputs(graph_def)))
    result, report = validate.validated_rewrite(
        graph_def, feeds=feeds, fetches=fetches, config=config,
        tolerance=validate.Tolerance(rtol=args.rtol, atol=args.atol, metric=args.metric),
        max_runs=args.max_runs, progress=validate.terminal_progress())
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if not report.passed:
        raise validate.ValidationError(f"{args.input}: validation failed: {report.message}")
    return result


def _sample_inputs(path: str) -> dict:
    """The arrays of an ``.npz`` file, by key; anything else is a one-line error naming the file."""
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


def _sinks_with_outputs(graph_def):
    no_output = {"NoOp", "Assert", "SaveV2", "AssignVariableOp"}
    unread = sinks(graph_def)
    return [n.name for n in graph_def.node if n.name in unread and n.op not in no_output]


def run(args) -> int:
    """Rewrites IN to OUT; writes the report; prints the summary line."""
    from amp_rewrite import graph_io

    check_rewrite_paths(args)
    if graph_io.is_saved_model_dir(args.input):
        return run_saved_model(args)
    graph_io.output_file_target(args.output)
    result = _load_and_rewrite(args)
    _finish(args, result, lambda outputs: outputs.add_file(
        args.output, graph_io.graph_def_bytes(result.graph_def, graph_io.format_of(args.output, args.output_format))))
    return EXIT_OK


def run_saved_model(args) -> int:
    """Rewrites a SavedModel directory into another."""
    from amp_rewrite import graph_io

    if args.validate or args.inputs or args.random_inputs:
        flag = "--validate" if args.validate else "--inputs" if args.inputs else "--random-inputs"
        raise UsageError(f"{args.input}: {flag} takes a GraphDef input (.pb or .pbtxt), not a SavedModel; "
                         "validate a frozen graph of the model instead")
    graph_io.saved_model_target(args.output, replace=args.in_place)
    rewritten, result = _rewrite_saved_model(args)
    _finish(args, result, lambda outputs: outputs.add_saved_model(rewritten, args.input, args.output,
                                                                  replace=args.in_place))
    return EXIT_OK


def _rewrite_saved_model(args):
    from amp_rewrite import graph_io
    from amp_rewrite.saved_model import rewrite_saved_model

    saved = graph_io.load_saved_model(args.input)
    try:
        return rewrite_saved_model(saved, config=config_from_args(args))
    except GraphError as exc:
        raise GraphError(f"{args.input}: {exc}") from None


def _finish(args, result, stage) -> None:
    """Renders the report; stages the output and the report; renames both into place; prints the summary."""
    from amp_rewrite import graph_io

    report_bytes = None
    doctor = _doctor_section(result) if args.report else None
    if args.report and args.report.endswith(".html"):
        from amp_rewrite.html_report import render_html

        report_bytes = render_html(result, title=os.path.basename(args.input), doctor=doctor).encode()
    elif args.report:
        report_bytes = (json.dumps({**result.report(), "doctor": doctor}, indent=1, sort_keys=True) + "\n").encode()
    _warn_unmatched(args, result)
    with graph_io.Outputs() as outputs:
        if report_bytes is not None:
            outputs.add_file(args.report, report_bytes)
        stage(outputs)
        outputs.commit()
    if not args.quiet:
        print(result.summary())


def _doctor_section(result) -> dict:
    from amp_rewrite.doctor import diagnose

    return diagnose(result).as_dict()


def _warn_unmatched(args, result) -> None:
    for pattern in result.unmatched_patterns:
        logging.getLogger(__name__).warning("%s: --keep-float32 %r matches no node", args.input, pattern)


def run_explain(args) -> int:
    """Prints the chain of reasons for one node."""
    from amp_rewrite import graph_io
    from amp_rewrite.explain import explain_chain

    if graph_io.is_saved_model_dir(args.input):
        result = _rewrite_saved_model(args)[1]
    else:
        result = _load_and_rewrite(args)
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
    from amp_rewrite import graph_io
    from amp_rewrite.doctor import diagnose, render_lines

    saved_model = graph_io.is_saved_model_dir(args.input)
    if saved_model and (args.benchmark or args.inputs):
        raise UsageError(f"{args.input}: {'--benchmark' if args.benchmark else '--inputs'} takes a GraphDef input "
                         "(.pb or .pbtxt), not a SavedModel; time a frozen graph of the model instead")
    result = _rewrite_saved_model(args)[1] if saved_model else _load_and_rewrite(args)
    print(f"{args.input}: {result.summary(with_flops=False)}")
    diagnosis = diagnose(result)
    for line in render_lines(diagnosis, limit=args.top):
        print(line)
    if args.benchmark:
        print(_benchmark_line(args, result, diagnosis.bound.speedup_bound))
    return EXIT_OK


def _benchmark_line(args, result, bound) -> str:
    """Times the float32 graph (read again) against the rewritten one; the measured line."""
    from amp_rewrite import graph_io, validate
    from amp_rewrite.measure import measure_speedup, measurement_line

    original = graph_io.load_graph_def(args.input, input_format=args.input_format)
    feeds = _sample_inputs(args.inputs) if args.inputs else validate.random_feeds(original, seed=args.seed)
    fetches = result.config.fetches or tuple(sorted(_sinks_with_outputs(original)))
    init_op = args.init_op or ("init" if any(n.name == "init" for n in original.node) else None)
    if init_op and not any(n.name == init_op for n in original.node):
        raise UsageError(f"{args.input}: --init-op {init_op!r} names no node of the graph")
    measured = measure_speedup(original, result.graph_def, feeds=feeds, fetches=fetches, runs=args.runs,
                               init_op=init_op)
    return measurement_line(measured, target=result.config.target, bound=bound)


_SUBCOMMANDS = {
    "explain": (build_explain_parser, run_explain),
    "doctor": (build_doctor_parser, run_doctor),
    "strip": (build_strip_parser, run_strip),
}


def main(argv: list[str] | None = None) -> int:
    """``amp-rewrite [explain|doctor|strip] ARGS``: the exit code (a bad flag exits 2 from argparse)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in _SUBCOMMANDS else ""
    build, run_command = _SUBCOMMANDS.get(command, (build_parser, run))
    args = build().parse_args(argv[1:] if command else argv)
    set_up_output(args.verbose)
    with sigterm_raises_terminated():
        return _exit_code(run_command, args)


def _exit_code(run_command, args) -> int:
    """Runs the command; a failure becomes one ``amp-rewrite:`` line on stderr and its exit code."""
    try:
        return run_command(args)
    except UsageError as exc:
        print(f"amp-rewrite: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AmpRewriteError as exc:
        print(f"amp-rewrite: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"amp-rewrite: error: {exc.filename or args.input}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("amp-rewrite: interrupted (SIGINT); no partial file is left", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print("amp-rewrite: terminated (SIGTERM); no partial file is left", file=sys.stderr)
        return EXIT_TERMINATED
    except RecursionError:
        print(f"amp-rewrite: error: {args.input}: the graph nests too deeply to process", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError:
        print(f"amp-rewrite: error: {args.input}: out of memory", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - the user gets one line, never a traceback
        logging.getLogger(__name__).info("unexpected failure", exc_info=True)
        print(f"amp-rewrite: error: {args.input}: cannot rewrite: {first_line(exc, with_type=True)} "
              f"(unexpected; run with -v for details)", file=sys.stderr)
        return EXIT_BAD_INPUT
