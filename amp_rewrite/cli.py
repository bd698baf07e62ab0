"""The ``amp-rewrite`` command: read a graph, rewrite it, write it and a report.

Exit codes: 0 done; 1 bad input (the message names the file, node or op);
2 usage. Nothing is written unless the rewrite succeeded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import replace

from amp_rewrite.config import DEVICE_TYPES, LEVELS, Config
from amp_rewrite.errors import AmpRewriteError, GraphError, UsageError
from amp_rewrite.op_lists import COLOURS, TARGETS, ListEdit

EXIT_OK, EXIT_BAD_INPUT, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amp-rewrite",
        description="Rewrite a float32 TensorFlow graph to mixed precision (float16 or bfloat16).",
    )
    parser.add_argument("input", help="input graph: .pb (binary GraphDef) or .pbtxt (text)")
    parser.add_argument("output", help="output graph; format from its name unless --output-format")
    parser.add_argument("--fetch", action="append", default=[], metavar="NAME",
                        help="a node the graph's user fetches; it keeps its dtype (repeatable; "
                             "comma-separated lists allowed). Default: every node without consumers")
    parser.add_argument("--preserve", action="append", default=[], metavar="NAME",
                        help="a further node never to change, e.g. a fed tensor (repeatable)")
    parser.add_argument("--target", choices=TARGETS, default="float16")
    parser.add_argument("--level", choices=LEVELS, default=None,
                        help="default: $TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL or DEFAULT")
    parser.add_argument("--device-type", choices=DEVICE_TYPES, default=None,
                        help="device the graph will run on (kernel checks, device filter); "
                             "default GPU if this TensorFlow has GPU kernels, else CPU")
    parser.add_argument("--lists", metavar="DIR", default=None,
                        help="directory of allow/infer/deny/clear.txt replacing the bundled lists")
    for colour in COLOURS:
        for action in ("add", "remove"):
            parser.add_argument(f"--{colour}-{action}", action="append", default=[], metavar="OPS",
                                help=f"comma-separated ops to {action} {'to' if action == 'add' else 'from'} "
                                     f"the {colour} list")
    parser.add_argument("--report", metavar="FILE.json", default=None,
                        help="write a JSON report: totals, converted nodes, casts, per-node colour and rule")
    parser.add_argument("--input-format", choices=("pb", "pbtxt"), default=None)
    parser.add_argument("--output-format", choices=("pb", "pbtxt"), default=None)
    parser.add_argument("--in-place", action="store_true", help="allow OUTPUT to be INPUT")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="-v: INFO logs; -vv: every painting decision")
    parser.add_argument("-q", "--quiet", action="store_true", help="print no summary line")
    return parser


def _flag_edits(args) -> tuple[ListEdit, ...]:
    edits = []
    for colour in COLOURS:
        for action in ("add", "remove"):
            flag = f"--{colour}-{action}"
            for value in getattr(args, f"{colour}_{action}"):
                for op in filter(None, (o.strip() for o in value.split(","))):
                    edits.append(ListEdit(colour, op, action == "add", flag))
    return tuple(edits)


def _split_names(values: list[str]) -> tuple[str, ...]:
    return tuple(n.strip() for v in values for n in v.split(",") if n.strip())


def config_from_args(args, environ=None) -> Config:
    """The rewrite's Config: environment first, then the flags."""
    config = Config.from_env(environ, list_edits=_flag_edits(args))
    fields = {"target": args.target, "lists_dir": args.lists, "device_type": args.device_type,
              "preserve": _split_names(args.preserve)}
    if args.level:
        fields["level"] = args.level
    fetches = _split_names(args.fetch)
    if fetches:
        fields["fetches"] = fetches
    return replace(config, **fields)


def run(args) -> int:
    from amp_rewrite import graph_io
    from amp_rewrite.pipeline import rewrite

    if (os.path.abspath(args.input) == os.path.abspath(args.output)) and not args.in_place:
        raise UsageError(f"{args.output}: output is the input file; pass --in-place to overwrite it")
    config = config_from_args(args)
    graph_def = graph_io.load_graph_def(args.input, input_format=args.input_format)
    try:
        result = rewrite(graph_def, config=config)
    except GraphError as exc:
        raise GraphError(f"{args.input}: {exc}") from None
    report_bytes = None
    if args.report:
        report_bytes = (json.dumps(result.report(), indent=1, sort_keys=True) + "\n").encode()
    graph_io.save_graph_def(result.graph_def, args.output, output_format=args.output_format)
    if report_bytes is not None:
        graph_io.write_atomic(args.report, report_bytes)
    if not args.quiet:
        print(result.summary())
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="amp-rewrite: %(levelname)s: %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return run(args)
    except UsageError as exc:
        print(f"amp-rewrite: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AmpRewriteError as exc:
        print(f"amp-rewrite: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"amp-rewrite: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
