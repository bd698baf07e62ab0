"""Reading and writing graphs: binary ``.pb`` and text ``.pbtxt`` GraphDefs, and SavedModels.

This module is the only one that touches files. Writes are atomic: the
output is written to a temporary file beside the target and renamed over
it, so an interrupted run never leaves a half-written graph.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from amp_rewrite.errors import InputFileError
from amp_rewrite.op_registry import graph_pb2

FORMATS = ("pb", "pbtxt")
_TEXT_SUFFIXES = (".pbtxt", ".pb.txt", ".txt", ".prototxt")


def format_of(path: str | os.PathLike, forced: str | None = None) -> str:
    """``"pb"`` or ``"pbtxt"``: forced, else by the file name's ending (binary unless text-like)."""
    if forced:
        return forced
    return "pbtxt" if str(path).lower().endswith(_TEXT_SUFFIXES) else "pb"


def load_graph_def(path: str | os.PathLike, *, input_format: str | None = None):
    """Reads a GraphDef from ``path``.

    Raises:
        InputFileError: the file is missing, unreadable, empty or not a GraphDef
            in the expected format; the message names the file.
    """
    from google.protobuf import message, text_format

    path = Path(path)
    if path.is_dir():
        if not is_saved_model_dir(path):
            raise InputFileError(f"{path}: directory holds no saved_model.pb or saved_model.pbtxt")
        raise InputFileError(f"{path}: is a SavedModel directory; rewrite it with rewrite_saved_model")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not data:
        raise InputFileError(f"{path}: file is empty")
    fmt = format_of(path, input_format)
    graph_def = graph_pb2().GraphDef()
    if fmt == "pbtxt":
        try:
            text_format.Parse(data.decode("utf-8"), graph_def)
        except (text_format.ParseError, UnicodeDecodeError) as exc:
            hint = "" if input_format else " (use --input-format pb if it is a binary GraphDef)"
            raise InputFileError(f"{path}: not a text GraphDef: {_first_line(exc)}{hint}") from None
    else:
        try:
            graph_def.ParseFromString(data)
        except message.DecodeError as exc:
            hint = "" if input_format else " (use --input-format pbtxt if it is a text GraphDef)"
            raise InputFileError(f"{path}: not a binary GraphDef: {_first_line(exc)}{hint}") from None
        if any(not node.name or not node.op for node in graph_def.node):
            raise InputFileError(f"{path}: not a binary GraphDef: a node has no name or op")
    return graph_def


def graph_def_bytes(graph_def, fmt: str) -> bytes:
    """The bytes a GraphDef is saved as: deterministic binary, or protobuf text."""
    if fmt == "pbtxt":
        from google.protobuf import text_format

        return text_format.MessageToString(graph_def).encode("utf-8")
    return graph_def.SerializeToString(deterministic=True)


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes private files; outputs get the usual mode
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def save_graph_def(graph_def, path: str | os.PathLike, *, output_format: str | None = None) -> None:
    """Writes a GraphDef atomically, binary or text by ``output_format`` or the file name."""
    write_atomic(path, graph_def_bytes(graph_def, format_of(path, output_format)))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def dump_rewrite(directory: str | os.PathLike, before, after, lists) -> list[Path]:
    """Writes a rewrite's input and output graphs (binary and text) and its effective lists.

    Files are named after a digest of the input graph, so the same input
    always dumps to the same names: ``graph_<digest>_{before,after}.{pb,pbtxt}``
    and ``graph_<digest>_lists.txt``.
    """
    import hashlib

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
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
            saved.ParseFromString(binary.read_bytes())
        elif text.is_file():
            text_format.Parse(text.read_text(encoding="utf-8"), saved)
        else:
            raise InputFileError(f"{path}: directory holds no saved_model.pb or saved_model.pbtxt")
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as exc:
        raise InputFileError(f"{path}: not a SavedModel: {_first_line(exc)}") from None
    if not saved.meta_graphs:
        raise InputFileError(f"{path}: SavedModel holds no MetaGraph")
    return saved


def save_saved_model(saved, source: str | os.PathLike, target: str | os.PathLike, *, replace: bool) -> None:
    """Writes ``saved`` as a SavedModel directory at ``target``, with ``source``'s variables and assets.

    The directory is assembled beside ``target`` and renamed into place, so a
    failure leaves no partial SavedModel. The fingerprint file is not copied:
    it hashes the original ``saved_model.pb``.
    """
    import shutil

    source, target = Path(source), Path(target)
    if target.exists() and not replace:
        raise InputFileError(f"{target}: already exists; remove it, choose another path, or pass --in-place")
    parent = target.parent if str(target.parent) else Path(".")
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    os.chmod(staging, 0o777 & ~_umask())
    try:
        for sub in ("variables", "assets", "assets.extra"):
            if (source / sub).is_dir():
                shutil.copytree(source / sub, staging / sub)
        (staging / "saved_model.pb").write_bytes(saved.SerializeToString(deterministic=True))
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=parent))
            os.replace(target, old / target.name)
            os.replace(staging, target)
            shutil.rmtree(old)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
