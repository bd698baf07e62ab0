"""The allow/infer/deny/clear op lists: loading, overrides and validation.

Lists are data files, one op per line, under ``lists/<target>/<colour>.txt``
(installed as ``amp_rewrite/lists``). ``#`` starts a comment. A directory given
with ``--lists`` replaces the files it contains, colour by colour; edits from
the environment and then from the command line are applied on top, in that
order. After every edit an op may be in at most one list; otherwise a
:class:`ListError` names the op, both lists and where each entry came from.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from amp_rewrite.environment import TF_PREFIX
from amp_rewrite.errors import ListError

logger = logging.getLogger(__name__)



class Colour(str, Enum):
    """The list an op is on; each member is equal to (and prints as) its lower-case name."""

    ALLOW = "allow"
    INFER = "infer"
    DENY = "deny"
    CLEAR = "clear"

    # What enum.StrEnum (Python 3.11) does: print and format as the value.
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)


COLOURS = tuple(Colour)
TARGETS = ("float16", "bfloat16")

# Environment variable names TensorFlow reads, per colour; the second name of
# each pair is the legacy spelling, applied after the current one as TF does.
_ENV_NAMES = {
    "allow": ("ALLOWLIST", "WHITELIST"),
    "infer": ("INFERLIST", "GRAYLIST"),
    "deny": ("DENYLIST", "BLACKLIST"),
    "clear": ("CLEARLIST",),
}
ENV_PREFIX = TF_PREFIX


class ListEdit(NamedTuple):
    """One add or remove of an op in a list, with where it came from."""

    colour: str
    op: str
    is_add: bool
    source: str


@dataclass(frozen=True)
class OpLists:
    """The four effective lists for one target dtype.

    ``origins`` maps (colour, op) to a short description of where the entry
    came from, used in error messages and in the report.
    """

    target: str
    allow: frozenset[str]
    infer: frozenset[str]
    deny: frozenset[str]
    clear: frozenset[str]
    origins: Mapping[tuple[str, str], str]
    _colour_by_op: dict[str, Colour] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        by_op = {op: colour for colour in COLOURS for op in getattr(self, colour)}
        object.__setattr__(self, "_colour_by_op", by_op)

    def colour_of(self, op: str) -> Colour | None:
        """Returns the list an op is on, or None."""
        return self._colour_by_op.get(op)

    def as_dict(self) -> dict[str, list[str]]:
        """Sorted lists by colour, for dumps and reports."""
        return {colour: sorted(getattr(self, colour)) for colour in COLOURS}


@functools.lru_cache(maxsize=1)
def default_lists_root() -> Path:
    """Where the bundled lists live: inside the installed package, or at the top of a checkout."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "lists"
    if (installed / "float16").is_dir():
        return installed
    return package.parent / "lists"


def parse_list_file(path: Path) -> list[str]:
    """Reads one list file: op names, one per line, ``#`` comments ignored.

    The bundled lists are parsed once per process while their size,
    modification time and inode stay the same (every rewrite loads the
    lists); a ``--lists`` file is read every time.
    """
    key = None
    if path.parent.parent == default_lists_root():
        try:
            info = os.stat(path)
            key = (str(path), info.st_mtime_ns, info.st_size, info.st_ino, info.st_dev)
        except OSError:
            pass  # reading it says why
    if key in _PARSED:
        return list(_PARSED[key])
    ops = _parse_list_file(path)
    if key is not None:
        if len(_PARSED) >= 64:
            _PARSED.clear()
        _PARSED[key] = tuple(ops)
    return ops


_PARSED: dict[tuple, tuple[str, ...]] = {}


def _parse_list_file(path: Path) -> list[str]:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise ListError(f"{path}: cannot read op list: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ListError(f"{path}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x})") from None
    ops = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not line.replace("_", "").replace(">", "").isalnum() or " " in line:
            raise ListError(f"{path}:{lineno}: not an op name: {line!r}")
        ops.append(line)
    return ops


def env_edits(environ: Mapping[str, str] | None = None) -> tuple[ListEdit, ...]:
    """The list edits TensorFlow's ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables ask for.

    For each colour: the current name's ADD then REMOVE, then the legacy name's,
    which is the order TensorFlow applies them in.
    """
    environ = os.environ if environ is None else environ
    edits = []
    for colour in COLOURS:
        for name in _ENV_NAMES[colour]:
            for suffix, is_add in (("_ADD", True), ("_REMOVE", False)):
                var = ENV_PREFIX + name + suffix
                for op in _split_ops(environ.get(var, "")):
                    edits.append(ListEdit(colour, op, is_add, var))
    return tuple(edits)


def _split_ops(value: str) -> list[str]:
    return [op.strip() for op in value.split(",") if op.strip()]


def load_lists(
    target: str,
    *,
    lists_dir: str | os.PathLike | None = None,
    edits: Iterable[ListEdit] = (),
    level: str = "DEFAULT",
) -> OpLists:
    """Builds the effective lists for ``target``.

    Args:
        target: ``"float16"`` or ``"bfloat16"``.
        lists_dir: a directory whose ``<colour>.txt`` files (or
            ``<target>/<colour>.txt``) replace the bundled ones.
        edits: adds and removes, applied in order after the files.
        level: ``TENSOR_CORES_ONLY`` empties infer, deny and clear (only allow
            ops convert); ``TREAT_INFER_AS_DENY`` moves infer ops to deny.

    Raises:
        ListError: a file is unreadable or malformed, or an op ends up in two lists.
    """
    if lists_dir is None:  # the bundled files do not change within a process: build each combination once
        return _bundled_lists(target, tuple(edits), level)
    return _build_lists(target, lists_dir, edits, level)


@functools.lru_cache(maxsize=32)
def _bundled_lists(target: str, edits: tuple[ListEdit, ...], level: str) -> OpLists:
    return _build_lists(target, None, edits, level)


def _build_lists(target: str, lists_dir: str | os.PathLike | None, edits: Iterable[ListEdit],
                 level: str) -> OpLists:
    if target not in TARGETS:
        raise ListError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    root = default_lists_root() / target
    members: dict[str, dict[str, str]] = {}
    for colour in COLOURS:
        path = _list_path(root, colour, lists_dir, target)
        members[colour] = {op: str(path) for op in parse_list_file(path)}
        _check_overlap(members)
        if path.parent != root:
            _warn_unknown_ops(members[colour], str(path))
    for edit in edits:
        if edit.colour not in COLOURS:
            raise ListError(f"{edit.source}: unknown list {edit.colour!r}")
        if not edit.op.replace("_", "").replace(">", "").isalnum():
            raise ListError(f"{edit.source}: not an op name: {edit.op!r}")
        _warn_unknown_ops([edit.op], edit.source)
        if edit.is_add:
            members[edit.colour].setdefault(edit.op, edit.source)
        else:
            members[edit.colour].pop(edit.op, None)
    _check_overlap(members)
    if level == "TENSOR_CORES_ONLY":
        for name in ("infer", "deny", "clear"):
            members[name] = {}
    elif level == "TREAT_INFER_AS_DENY":
        members["deny"].update(members["infer"])
        members["infer"] = {}
    origins: dict[tuple[str, str], str] = {
        (colour, op): src for colour in COLOURS for op, src in members[colour].items()}
    return OpLists(
        target=target,
        origins=origins,
        **{colour: frozenset(members[colour]) for colour in COLOURS},
    )


def _warn_unknown_ops(ops: Iterable[str], source: str) -> None:
    """Warns, once per op and source, about ops neither TensorFlow nor a known prefix names (a typo?)."""
    from amp_rewrite.graph.op_registry import OpRegistry

    for op in ops:
        if OpRegistry.registry_op_def(op) is None and (op, source) not in _WARNED:
            _WARNED.add((op, source))
            close = difflib.get_close_matches(op, _registered_op_names(), n=1)
            hint = f" (did you mean {close[0]}?)" if close else " (a custom op must be loaded to match)"
            logger.warning("%s: %s is not an op this TensorFlow registers%s", source, op, hint)


_WARNED: set[tuple[str, str]] = set()


@functools.lru_cache(maxsize=1)
def _registered_op_names() -> tuple[str, ...]:
    try:
        import tensorflow as tf

        return tuple(name for name in dir(tf.raw_ops) if not name.startswith("_"))
    except ImportError:  # pragma: no cover - the registry lookup already needs TensorFlow
        return ()


def _list_path(root: Path, colour: str, lists_dir, target: str) -> Path:
    if lists_dir is not None:
        override = Path(lists_dir)
        if not override.is_dir():
            raise ListError(f"{override}: --lists must be a directory of <colour>.txt files")
        for candidate in (override / target / f"{colour}.txt", override / f"{colour}.txt"):
            if candidate.is_file():
                return candidate
    return root / f"{colour}.txt"


def _check_overlap(members: dict[str, dict[str, str]]) -> None:
    seen: dict[str, str] = {}
    for colour in COLOURS:
        for op in sorted(members.get(colour, ())):
            if op in seen:
                first = seen[op]
                raise ListError(
                    f"op {op} is in both the {first} list ({members[first][op]}) "
                    f"and the {colour} list ({members[colour][op]}); "
                    f"move it with an add to one and a remove from the other"
                )
            seen[op] = colour
