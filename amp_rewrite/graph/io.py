"""Reading and writing graphs: binary ``.pb`` and text ``.pbtxt`` GraphDefs, and SavedModels.

This module is the only one that touches files. Inputs must be regular
files within protobuf's 2 GiB limit. Writes are atomic: every output is
written to a temporary file (or directory) beside its target, and all are
renamed over their targets only once all are complete (:class:`Outputs`), so
a failed or interrupted run leaves nothing half-written. Symlinks are
followed; an existing directory, device or FIFO is never replaced.
"""

from __future__ import annotations

import os
import signal
import stat
import tempfile
from pathlib import Path

from amp_rewrite.errors import GraphError, InputFileError, OutputError, UsageError, first_line
from amp_rewrite.graph.op_registry import graph_pb2

FORMATS = ("pb", "pbtxt")
_TEXT_SUFFIXES = (".pbtxt", ".pb.txt", ".txt", ".prototxt")


def format_of(path: str | os.PathLike, forced: str | None = None) -> str:
    """``"pb"`` or ``"pbtxt"``: forced, else by the file name's ending (binary unless text-like)."""
    if forced:
        return forced
    return "pbtxt" if str(path).lower().endswith(_TEXT_SUFFIXES) else "pb"


MAX_PROTO_BYTES = 2 ** 31 - 1  # protobuf refuses to parse one message larger than this


def _read_input(path: Path, what: str) -> bytes:
    """The bytes of a regular input file; devices, FIFOs and oversized files are refused unread."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputFileError(f"{path}: not a regular file; give a {what}")
    if info.st_size > MAX_PROTO_BYTES:
        raise InputFileError(f"{path}: {info.st_size} bytes, more than protobuf's 2 GiB limit for one "
                             f"{what}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read: {exc.strerror or exc}") from None


def load_graph_def(path: str | os.PathLike, *, input_format: str | None = None):
    """Reads a GraphDef from ``path``.

    Raises:
        InputFileError: the file is missing, unreadable, empty, not a regular
            file, larger than protobuf allows, or not a GraphDef in the
            expected format; the message names the file.
        GraphError: a node's type attribute holds no DataType, or a call names
            a function the library does not define; the message names the node.
    """
    from google.protobuf import message, text_format

    path = Path(path)
    if path.is_dir():
        if not is_saved_model_dir(path):
            raise InputFileError(f"{path}: directory holds no saved_model.pb or saved_model.pbtxt")
        raise InputFileError(f"{path}: is a SavedModel directory; rewrite it with rewrite_saved_model")
    data = _read_input(path, "GraphDef")
    if not data:
        raise InputFileError(f"{path}: file is empty")
    fmt = format_of(path, input_format)
    graph_def = graph_pb2().GraphDef()
    if fmt == "pbtxt":
        try:
            text_format.Parse(data.decode("utf-8-sig"), graph_def)
        except RecursionError:
            raise InputFileError(f"{path}: not a text GraphDef: nested too deeply to parse") from None
        except (text_format.ParseError, UnicodeDecodeError, ValueError) as exc:
            _refuse_saved_model_file(path, data)
            hint = "" if input_format else " (use --input-format pb if it is a binary GraphDef)"
            raise InputFileError(f"{path}: not a text GraphDef: {first_line(exc)}{hint}") from None
    else:
        try:
            graph_def.ParseFromString(data)
        except (message.DecodeError, RecursionError) as exc:
            _refuse_saved_model_file(path, data)
            hint = "" if input_format else " (use --input-format pbtxt if it is a text GraphDef)"
            raise InputFileError(f"{path}: not a binary GraphDef: {first_line(exc)}{hint}") from None
        if not graph_def.node:
            _refuse_saved_model_file(path, data)
        if any(not node.name or not node.op for node in graph_def.node):
            raise InputFileError(f"{path}: not a binary GraphDef: a node has no name or op")
    check_graph_def(graph_def, path)
    return graph_def


def _refuse_saved_model_file(path: Path, data: bytes) -> None:
    """Raises when ``data`` is a SavedModel proto: the user gave saved_model.pb instead of its directory."""
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    try:
        if path.suffix == ".pbtxt":
            text_format.Parse(data.decode("utf-8-sig"), saved)
        else:
            saved.ParseFromString(data)
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError, ValueError, RecursionError):
        return
    if saved.meta_graphs and any(m.graph_def.node for m in saved.meta_graphs):
        raise InputFileError(f"{path}: is the saved_model.pb of a SavedModel; give its directory "
                             f"{path.parent or '.'} instead")


def check_graph_def(graph_def, path: str | os.PathLike = "") -> None:
    """Checks what the rewrite cannot judge a node without: its type attributes and its callees.

    Raises:
        GraphError: a type attribute (``type`` or ``list(type)`` in the op's
            definition) holds something else, or a value that is no DataType;
            or a call names a function the library does not define.
    """
    from tensorflow.core.framework import types_pb2

    from amp_rewrite.graph.importable import missing_function
    from amp_rewrite.graph.op_registry import OpRegistry

    prefix = f"{path}: " if str(path) else ""
    valid = set(types_pb2.DataType.values()) - {types_pb2.DT_INVALID}
    registry = OpRegistry(graph_def.library)
    bodies = [("", graph_def.node)] + [(f" in function {f.signature.name}", f.node_def)
                                       for f in graph_def.library.function]
    for where, nodes in bodies:
        for node in nodes:
            op_def = registry.op_def(node.op)
            if op_def is None:
                continue
            for attr in op_def.attr:
                if attr.type not in ("type", "list(type)") or attr.name not in node.attr:
                    continue
                value = node.attr[attr.name]
                kind = value.WhichOneof("value")
                if attr.type == "type":
                    good = kind == "type" and value.type in valid
                    shown = value.type if kind == "type" else kind
                else:
                    good = kind in ("list", None) and all(t in valid for t in value.list.type)
                    shown = list(value.list.type) if kind == "list" else kind
                if not good:
                    wanted = "DataType" if attr.type == "type" else "list of DataTypes"
                    raise GraphError(f"{prefix}node {node.name} (op {node.op}){where}: type attr {attr.name} "
                                     f"holds {shown!r}, not a {wanted}")
    missing = missing_function(graph_def)
    if missing:
        raise GraphError(prefix + missing)


def graph_def_bytes(graph_def, fmt: str) -> bytes:
    """The bytes a GraphDef is saved as: deterministic binary, or protobuf text."""
    if fmt == "pbtxt":
        from google.protobuf import text_format

        return text_format.MessageToString(graph_def).encode("utf-8")
    return graph_def.SerializeToString(deterministic=True)


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file and a rename (see :class:`Outputs`)."""
    with Outputs() as outputs:
        outputs.add_file(path, data)
        outputs.commit()


def save_graph_def(graph_def, path: str | os.PathLike, *, output_format: str | None = None) -> None:
    """Writes a GraphDef atomically, binary or text by ``output_format`` or the file name."""
    write_atomic(path, graph_def_bytes(graph_def, format_of(path, output_format)))


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def output_file_target(path: str | os.PathLike) -> Path:
    """Where an output file goes: a symlink is followed to its target.

    Raises:
        UsageError: the path (or the symlink's target) exists and is not a
            regular file: a directory, a device, a FIFO or a socket is never replaced.
    """
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{path}: is a {_kind(mode)}; the output must be a regular file or a new path")
    return target


def saved_model_target(path: str | os.PathLike, *, replace: bool) -> Path:
    """Where an output SavedModel goes: a symlink is followed; only a SavedModel directory is replaced."""
    target = Path(os.path.realpath(path))
    if not os.path.lexists(target):
        return target
    if not replace:
        raise InputFileError(f"{path}: already exists; remove it, choose another path, or pass --in-place")
    if not is_saved_model_dir(target):
        what = "directory that holds no SavedModel" if target.is_dir() else _kind(target.stat().st_mode) \
            if not target.is_file() else "file"
        raise UsageError(f"{path}: is a {what}; only a SavedModel directory is replaced")
    return target


class Outputs:
    """Outputs written beside their targets first, and renamed into place only when all are ready.

    A failure while staging (no such directory, no space, no permission)
    leaves nothing behind, and no target is changed. :meth:`commit` renames
    with SIGINT and SIGTERM held back, so an interrupt cannot split it; a
    signal arriving meanwhile is delivered afterwards.
    """

    def __init__(self):
        self._staged: list[tuple[Path, Path, str, bool]] = []  # (staged, target, name given, is a directory)
        self._committed = False

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, *exc) -> None:
        if not self._committed:
            self.discard()

    def add_file(self, path: str | os.PathLike, data: bytes) -> None:
        """Stages ``data`` for ``path``; an existing file keeps its permission bits."""
        target = output_file_target(path)
        try:
            mode = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        except OSError as exc:
            raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
        self._staged.append((Path(tmp), target, str(path), False))
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, mode)  # mkstemp makes private files; outputs get the usual (or the old) mode
        except OSError as exc:
            raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None

    def add_saved_model(self, saved, source: str | os.PathLike, path: str | os.PathLike, *,
                        replace: bool) -> None:
        """Stages ``saved`` as a SavedModel directory for ``path``, with ``source``'s variables and assets.

        The fingerprint file is not copied: it hashes the original ``saved_model.pb``.
        """
        import logging
        import shutil

        source = Path(source)
        target = saved_model_target(path, replace=replace)
        if not (source / "variables").is_dir():
            logging.getLogger(__name__).warning("%s: holds no variables/ directory; %s will hold none either",
                                                source, path)
        try:
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        except OSError as exc:
            raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
        self._staged.append((staging, target, str(path), True))
        try:
            os.chmod(staging, 0o777 & ~_umask())
            for sub in ("variables", "assets", "assets.extra"):
                if (source / sub).is_dir():
                    shutil.copytree(source / sub, staging / sub)
            (staging / "saved_model.pb").write_bytes(saved.SerializeToString(deterministic=True))
        except shutil.Error as exc:
            first = exc.args[0][0] if exc.args and exc.args[0] and isinstance(exc.args[0], list) else None
            detail = f"{first[0]}: {first[2]}" if first and len(first) == 3 else first_line(exc)
            raise OutputError(f"{path}: cannot write: {detail}") from None
        except OSError as exc:
            raise OutputError(f"{path}: cannot write: {exc.strerror or exc}"
                              + (f" ({exc.filename})" if exc.filename else "")) from None

    def commit(self) -> None:
        """Renames every staged output over its target."""
        import shutil

        held = {signal.SIGINT, signal.SIGTERM}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        old_dirs = []
        try:
            for staged, target, given, is_dir in self._staged:
                try:
                    if is_dir and os.path.lexists(target):
                        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
                        os.replace(target, old / target.name)
                        try:
                            os.replace(staged, target)
                        except OSError:
                            os.replace(old / target.name, target)
                            os.rmdir(old)
                            raise
                        old_dirs.append(old)
                    else:
                        os.replace(staged, target)
                except OSError as exc:
                    raise OutputError(f"{given}: cannot write: {exc.strerror or exc}") from None
            self._committed = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for old in old_dirs:
            shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        """Removes whatever was staged and not committed."""
        import shutil

        for staged, _, _, is_dir in self._staged:
            if is_dir:
                shutil.rmtree(staged, ignore_errors=True)
            else:
                try:
                    os.unlink(staged)
                except FileNotFoundError:
                    pass
        self._staged.clear()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def dump_rewrite(directory: str | os.PathLike, before, after, lists) -> list[Path]:
    """Writes a rewrite's input and output graphs (binary and text) and its effective lists.

    Files are named after a digest of the input graph, so the same input
    always dumps to the same names: ``graph_<digest>_{before,after}.{pb,pbtxt}``
    and ``graph_<digest>_lists.txt``.
    """
    import hashlib

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"{directory}: the dump directory is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{directory}: cannot create the dump directory: {exc.strerror or exc}") from None
    stem = "graph_" + hashlib.sha256(graph_def_bytes(before, "pb")).hexdigest()[:12]
    written = []
    for label, graph_def in (("before", before), ("after", after)):
        for fmt in FORMATS:
            path = directory / f"{stem}_{label}.{fmt}"
            write_atomic(path, graph_def_bytes(graph_def, fmt))
            written.append(path)
    text = "".join(f"{colour}:\n" + "".join(f"  {op}\n" for op in ops) for colour, ops in lists.as_dict().items())
    path = directory / f"{stem}_lists.txt"
    write_atomic(path, f"target: {lists.target}\n{text}".encode())
    written.append(path)
    return written


def is_saved_model_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a SavedModel."""
    path = Path(path)
    return path.is_dir() and any((path / n).is_file() for n in ("saved_model.pb", "saved_model.pbtxt"))


def load_saved_model(path: str | os.PathLike):
    """Reads ``saved_model.pb`` (or ``.pbtxt``) from a SavedModel directory.

    Raises:
        InputFileError: no SavedModel there, or it does not parse; the message names the path.
    """
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    path = Path(path)
    saved = saved_model_pb2.SavedModel()
    binary, text = path / "saved_model.pb", path / "saved_model.pbtxt"
    try:
        if binary.is_file():
            saved.ParseFromString(_read_input(binary, "SavedModel"))
        elif text.is_file():
            text_format.Parse(_read_input(text, "SavedModel").decode("utf-8-sig"), saved)
        else:
            raise InputFileError(f"{path}: directory holds no saved_model.pb or saved_model.pbtxt")
    except RecursionError:
        raise InputFileError(f"{path}: not a SavedModel: nested too deeply to parse") from None
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError, ValueError) as exc:
        raise InputFileError(f"{path}: not a SavedModel: {first_line(exc)}") from None
    for meta in saved.meta_graphs:
        try:
            check_graph_def(meta.graph_def, path)
        except GraphError as exc:
            tags = ",".join(meta.meta_info_def.tags)
            raise GraphError(f"{exc} (MetaGraph tagged {tags or 'with no tags'})") from None
    if not saved.meta_graphs:
        raise InputFileError(f"{path}: SavedModel holds no MetaGraph")
    return saved


def save_saved_model(saved, source: str | os.PathLike, target: str | os.PathLike, *, replace: bool) -> None:
    """Writes ``saved`` as a SavedModel directory at ``target``, with ``source``'s variables and assets.

    The directory is assembled beside ``target`` and renamed into place, so a
    failure leaves no partial SavedModel (see :class:`Outputs`).
    """
    with Outputs() as outputs:
        outputs.add_saved_model(saved, source, target, replace=replace)
        outputs.commit()
