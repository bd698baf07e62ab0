"""The ``amp-rewrite`` command: read a graph, rewrite it, write it and a report.

Exit codes: 0 done; 1 bad input (the message names the file, node or op);
2 usage (a bad flag, an OUT that is no regular file); 130/143 interrupted by
SIGINT/SIGTERM. Every failure is one ``amp-rewrite:`` line on stderr. Nothing
is written unless every part succeeded: OUT and the report are staged beside
their targets and renamed into place together.

:func:`main` is the dispatch: it picks the subcommand's parser
(:mod:`amp_rewrite.cli.args`), sets up the process's output and SIGTERM
(:mod:`amp_rewrite.cli.process`), runs the subcommand
(:mod:`amp_rewrite.cli.commands`, which checks paths with
:mod:`amp_rewrite.cli.paths` and rewrites through :mod:`amp_rewrite.cli.rewrite`),
and turns a failure into its stderr line and exit code.
"""

from __future__ import annotations

import logging
import sys

from amp_rewrite.cli.args import (
    build_cache_parser,
    build_doctor_parser,
    build_explain_parser,
    build_parser,
    build_strip_parser,
)
from amp_rewrite.cli.commands import run, run_cache, run_doctor, run_explain, run_strip
from amp_rewrite.cli.process import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    Terminated,
    set_up_output,
    sigterm_raises_terminated,
)
from amp_rewrite.errors import AmpRewriteError, UsageError, first_line

_SUBCOMMANDS = {
    "explain": (build_explain_parser, run_explain),
    "doctor": (build_doctor_parser, run_doctor),
    "strip": (build_strip_parser, run_strip),
    "cache": (build_cache_parser, run_cache),
}


def main(argv: list[str] | None = None) -> int:
    """``amp-rewrite [explain|doctor|strip|cache] ARGS``: the exit code (a bad flag exits 2 from argparse)."""
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
