"""The ``amp-rewrite`` command line, read: each subcommand's parser, its flags' value types, and the Config they make.

:func:`build_parser` is the rewrite (``amp-rewrite IN OUT``); ``explain``,
``doctor`` and ``strip`` have their own. The rewrite options they share are
added by one function, so the three that rewrite take the same flags. A bad
value is argparse's usage error (exit 2), raised while parsing, before any
file is read. :func:`config_from_args` turns parsed flags into the rewrite's
:class:`~amp_rewrite.config.Config`, over what the environment sets.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import amp_rewrite
from amp_rewrite.config import DEVICE_TYPES, LEVELS, Config
from amp_rewrite.paint.op_lists import COLOURS, TARGETS, ListEdit
from amp_rewrite.tune.trial import ROUNDS


def build_parser() -> argparse.ArgumentParser:
    """``amp-rewrite IN OUT [options]``."""
    parser = argparse.ArgumentParser(
        prog="amp-rewrite",
        description="Rewrite a float32 TensorFlow graph to mixed precision (float16 or bfloat16). "
                    "`amp-rewrite explain IN NODE` says why a node got its precision; "
                    "`amp-rewrite doctor IN` says why the result may not run faster; "
                    "`amp-rewrite strip IN OUT` turns a mixed graph back into float32; "
                    "`amp-rewrite cache` lists (and --clear removes) the measured step times.",
    )
    _add_version_flag(parser)
    parser.add_argument("input", help="input graph: .pb (binary GraphDef), .pbtxt (text), or a SavedModel directory")
    parser.add_argument("output", help="output graph (format from its name unless --output-format), "
                                       "or a SavedModel directory when the input is one")
    _add_rewrite_options(parser)
    parser.add_argument("--report", metavar="FILE", default=None,
                        help="write a report: FILE.json (totals, converted nodes, casts, per-node colour, "
                             "rule and reason) or FILE.html (the graph coloured by precision, searchable)")
    parser.add_argument("--output-format", choices=("pb", "pbtxt"), default=None)
    parser.add_argument("--in-place", action="store_true", help="allow OUTPUT to be INPUT")
    parser.add_argument("-q", "--quiet", action="store_true", help="print no summary line")
    _add_tuning_options(parser)
    _add_validation_options(parser)
    return parser


def _add_tuning_options(parser: argparse.ArgumentParser) -> None:
    """The rewrite's ``--tune`` group."""
    tune = parser.add_argument_group("measured precision (GraphDef input)")
    tune.add_argument("--tune", action="store_true",
                      help="run the float32 graph and the rewritten one on this machine, interleaved, and write "
                           "the rewritten graph only if its best step is at least 5%% faster, else the input "
                           "unchanged (times cached in $AMP_REWRITE_TUNE_CACHE, else $XDG_CACHE_HOME/amp-rewrite); "
                           "inputs: --inputs FEEDS.npz, else random ones (--seed)")
    tune.add_argument("--tune-batch", type=_integer(0, 1 << 20), default=32, metavar="N",
                      help="with --tune and random inputs: the size of an unknown placeholder dimension; "
                           "0 leaves a graph with one to the lists (default 32)")


def _add_validation_options(parser: argparse.ArgumentParser) -> None:
    """The rewrite's ``--validate`` group."""
    check = parser.add_argument_group("accuracy validation (GraphDef input)")
    check.add_argument("--validate", action="store_true",
                       help="run float32 and half graphs on sample inputs; keep in float32 what overflows or "
                            "misses the tolerance")
    check.add_argument("--inputs", metavar="FEEDS.npz", default=None,
                       help="sample inputs (for --validate and --tune): an .npz whose keys are placeholder or "
                            "tensor names")
    check.add_argument("--random-inputs", action="store_true",
                       help="sample inputs drawn for every placeholder (unknown dimensions = 2)")
    check.add_argument("--seed", type=_integer(0, 2 ** 63 - 1), default=0, help="seed for --random-inputs")
    check.add_argument("--rtol", type=_tolerance, default=2e-2)
    check.add_argument("--atol", type=_tolerance, default=2e-2, help="relative to each output's largest |value|")
    check.add_argument("--metric", choices=("allclose", "cosine", "top1"), default="allclose")
    check.add_argument("--max-runs", type=_integer(2, 10_000), default=24,
                       help="most graph executions validation may use (at least 2)")


def _tolerance(text: str) -> float:
    """A tolerance flag's value: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and 0 <= value <= 1e6):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number from 0 to 1e6")
    return value


def _integer(low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: must be from {low} to {high}")
        return value

    parse.__name__ = "integer"
    return parse


class _PrintVersion(argparse.Action):
    """``--version``: prints ``amp-rewrite X.Y.Z`` and exits 0, whatever else the command line holds.

    Like argparse's own version action, but the version is read from the package
    metadata only when the flag is given.
    """

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"amp-rewrite {amp_rewrite.__version__}")
        parser.exit()


def _add_version_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action=_PrintVersion, help="print the installed version and exit")


def build_explain_parser() -> argparse.ArgumentParser:
    """``amp-rewrite explain IN NODE [options]``."""
    parser = argparse.ArgumentParser(
        prog="amp-rewrite explain",
        description="Rewrite IN in memory and print why NODE got its precision, following each "
                    "cause back to the op-list entry that started it.",
    )
    _add_version_flag(parser)
    parser.add_argument("input", help="input graph: .pb, .pbtxt, or a SavedModel directory")
    parser.add_argument("node", help="the node to explain; a node inside a function is FUNCTION::NODE")
    _add_rewrite_options(parser)
    return parser


def build_doctor_parser() -> argparse.ArgumentParser:
    """``amp-rewrite doctor IN [options]``."""
    parser = argparse.ArgumentParser(
        prog="amp-rewrite doctor",
        description="Rewrite IN in memory and say why it may not run faster: heavy ops left float32, "
                    "shapes tensor cores cannot use, float32 islands and Casts in loops, ranked by the "
                    "share of FLOPs or bytes each concerns, and the speed-up they allow at most.",
    )
    parser.add_argument("input", help="input graph: .pb, .pbtxt, or a SavedModel directory")
    _add_rewrite_options(parser)
    parser.add_argument("--top", type=_integer(1, 10_000), default=20, help="findings to print (default 20)")
    _add_benchmark_options(parser)
    return parser


def _add_benchmark_options(parser: argparse.ArgumentParser) -> None:
    """The doctor's ``--benchmark`` group."""
    bench = parser.add_argument_group("measured speed-up (GraphDef input)")
    bench.add_argument("--benchmark", action="store_true",
                       help="time the graph in float32 and rewritten on this machine, interleaved as --tune does "
                            "(best step of each), and print the measured speed-up beside the bound")
    bench.add_argument("--inputs", metavar="FEEDS.npz", default=None,
                       help="inputs: an .npz whose keys are placeholder or tensor names (default: random)")
    bench.add_argument("--seed", type=_integer(0, 2 ** 63 - 1), default=0, help="seed for the random inputs")
    bench.add_argument("--runs", type=_integer(1, 100_000), default=ROUNDS,
                       help=f"timed steps of each graph, after one untimed step of each (default {ROUNDS})")
    bench.add_argument("--init-op", metavar="NAME", default=None,
                       help="a node to run once before timing, such as a training graph's variable "
                            "initializer (default: a node named 'init', if there is one)")


def build_cache_parser() -> argparse.ArgumentParser:
    """``amp-rewrite cache [--clear] [--all]``."""
    parser = argparse.ArgumentParser(
        prog="amp-rewrite cache",
        description="List the tuning cache of this machine: each file's device, TensorFlow and amp-rewrite "
                    "versions, and every verdict measured (what was timed, what it decided, the two best "
                    "times). --clear removes the files, so that every step and --tune is measured again. The "
                    "cache is $AMP_REWRITE_TUNE_CACHE, else $XDG_CACHE_HOME/amp-rewrite, else "
                    "~/.cache/amp-rewrite.",
    )
    parser.add_argument("--clear", action="store_true",
                        help="remove this machine's files (and any file no run reads) instead of listing them")
    parser.add_argument("--all", action="store_true",
                        help="every file in the directory, other devices' too (a directory shared by machines)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="TensorFlow's start-up messages too")
    parser.set_defaults(input="the tuning cache")
    return parser


def build_strip_parser() -> argparse.ArgumentParser:
    """``amp-rewrite strip IN OUT [options]``."""
    parser = argparse.ArgumentParser(
        prog="amp-rewrite strip",
        description="Turn a mixed-precision graph (Keras mixed_float16, or one amp-rewrite wrote) back into "
                    "float32, or retarget its half type (--target bfloat16 on a float16 graph, and the reverse).",
    )
    parser.add_argument("input", help="input graph: .pb, .pbtxt, or a SavedModel directory")
    parser.add_argument("output", help="output graph, or a SavedModel directory when the input is one")
    parser.add_argument("--target", choices=("float32", "float16", "bfloat16"), default="float32",
                        help="float32 (default) undoes mixed precision; a half type retypes the other half type")
    parser.add_argument("--fetch", action="append", default=[], metavar="NAME",
                        help="a node the graph's user fetches; it keeps its dtype (repeatable). "
                             "Default: every node without consumers")
    parser.add_argument("--input-format", choices=("pb", "pbtxt"), default=None)
    parser.add_argument("--output-format", choices=("pb", "pbtxt"), default=None)
    parser.add_argument("--in-place", action="store_true", help="allow OUTPUT to be INPUT")
    parser.add_argument("-q", "--quiet", action="store_true", help="print no summary line")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="TensorFlow's start-up messages too")
    return parser


def _add_rewrite_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fetch", action="append", default=[], metavar="NAME",
                        help="a node the graph's user fetches; it keeps its dtype (repeatable; "
                             "comma-separated lists allowed). Default: every node without consumers")
    parser.add_argument("--preserve", action="append", default=[], metavar="NAME",
                        help="a further node never to change, e.g. a fed tensor (repeatable)")
    parser.add_argument("--keep-float32", action="append", default=[], metavar="REGEX",
                        help="keep float32 every node whose name contains a match of REGEX (Python syntax, "
                             "re.search; FUNCTION::NODE inside functions); repeatable")
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
    parser.add_argument("--input-format", choices=("pb", "pbtxt"), default=None)
    parser.add_argument("--dump-dir", metavar="DIR", default=None,
                        help="write the graph before and after, and the effective lists, here "
                             "(default: $AMP_REWRITE_DUMP_DIR or $TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="-v: INFO logs and TensorFlow's own start-up messages; -vv: also what each painting "
                             "rule changed and every node's decision, in the words of explain")


def _flag_edits(args) -> tuple[ListEdit, ...]:
    edits = []
    for colour in COLOURS:
        for action in ("add", "remove"):
            flag = f"--{colour}-{action}"
            for value in getattr(args, f"{colour}_{action}"):
                for op in filter(None, (o.strip() for o in value.split(","))):
                    edits.append(ListEdit(colour, op, action == "add", flag))
    return tuple(edits)


def split_names(values: list[str]) -> tuple[str, ...]:
    return tuple(n.strip() for v in values for n in v.split(",") if n.strip())


def config_from_args(args, environ=None) -> Config:
    """The rewrite's Config: environment first, then the flags."""
    explicit = {"level": args.level} if args.level else {}
    config = Config.from_env(environ, list_edits=_flag_edits(args), **explicit)
    fields = {"target": args.target, "lists_dir": args.lists, "device_type": args.device_type,
              "preserve": split_names(args.preserve), "keep_float32_patterns": tuple(args.keep_float32),
              "tune_batch": getattr(args, "tune_batch", 32)}
    if args.dump_dir:
        fields["dump_dir"] = args.dump_dir
    if args.level:
        fields["level"] = args.level
    fetches = split_names(args.fetch)
    if fetches:
        fields["fetches"] = fetches
    return replace(config, **fields)
