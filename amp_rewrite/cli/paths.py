"""The command's path checks: an output, report or dump directory that would overwrite the input, or a non-file.

They run before anything is read, so a mistyped path costs no rewrite. Each
refusal is a :class:`~amp_rewrite.errors.UsageError` (exit 2) naming the path.
The same file is recognized through symlinks and hard links.
"""

from __future__ import annotations

import os

from amp_rewrite.errors import UsageError
from amp_rewrite.graph import io as graph_io


def check_output_is_not_input(args) -> None:
    """OUT may be IN only with ``--in-place``."""
    if _same_path(args.input, args.output) and not args.in_place:
        raise UsageError(f"{args.output}: output is the input file; pass --in-place to overwrite it")


def check_rewrite_paths(args) -> None:
    """Refuses, before any work, an OUT or report that would overwrite IN, OUT, or a non-file."""
    check_output_is_not_input(args)
    if args.report:
        _check_report_path(args)
    _check_dump_dir(args.dump_dir, args.input)


def _check_report_path(args) -> None:
    """``--report``: a .json or .html path that is neither IN nor OUT, nor inside them, nor a non-file."""
    if not args.report.endswith((".json", ".html")):
        raise UsageError(f"{args.report}: --report must end in .json or .html")
    for name, other in (("input", args.input), ("output", args.output)):
        if _same_path(args.report, other) or _inside(args.report, other):
            raise UsageError(f"{args.report}: --report would overwrite the {name}; choose another path")
    graph_io.output_file_target(args.report)


def _check_dump_dir(dump_dir: str | None, input_path: str) -> None:
    """``--dump-dir``: a directory (or a new path) outside IN."""
    if dump_dir and os.path.exists(dump_dir) and not os.path.isdir(dump_dir):
        raise UsageError(f"{dump_dir}: --dump-dir is not a directory")
    if dump_dir and (_same_path(dump_dir, input_path) or _inside(dump_dir, input_path)):
        raise UsageError(f"{dump_dir}: --dump-dir would write into the input; choose another directory")


def _same_path(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.isdir(directory) and os.path.commonpath([path, directory]) == directory
