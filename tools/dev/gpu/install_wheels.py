"""Installs a folder of wheels into a site folder, as ``pip install --no-deps --target`` would, on every core.

A wheel is a zip of what goes into site-packages, so installing one is
unpacking it: ``NAME.data/purelib/`` and ``NAME.data/platlib/`` go to the top,
and the rest of ``NAME.data/`` (scripts, headers) is left out, as nothing
here runs it. Unlike ``zipfile``'s own extraction, a file's mode bits are
kept (``nvidia/cuda_nvcc/bin/ptxas`` must stay executable for XLA). The
large wheels (TensorFlow, cuDNN, cuBLAS: 0.5 to 1.2 GB each once unpacked)
are cut into chunks of members, so all cores unpack at once; every file is
written under a temporary name and renamed, so two wheels holding the same
file (``nvidia/__init__.py``) never leave it half written.

Needs nothing but the standard library (the device image's Python 3.12 has
no pip guaranteed). Usage::

    python3 tools/dev/gpu/install_wheels.py WHEEL_FOLDER SITE_FOLDER
"""

from __future__ import annotations

import os
import shutil
import sys
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

#: Members of one wheel unpacked by one task, in bytes (uncompressed).
CHUNK_BYTES = 256 << 20


def target_name(member: str) -> str | None:
    """Where a wheel member goes, relative to the site folder; None for what an import never reads."""
    top, _, rest = member.partition("/")
    if not top.endswith(".data"):
        return member
    kind, _, inner = rest.partition("/")
    return inner if kind in ("purelib", "platlib") and inner else None


def chunks(wheel: Path) -> list[tuple[str, list[str]]]:
    """The wheel's files cut into tasks of about :data:`CHUNK_BYTES` each: ``(wheel, member names)``."""
    tasks: list[tuple[str, list[str]]] = []
    current: list[str] = []
    size = 0
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.is_dir() or target_name(info.filename) is None:
                continue
            current.append(info.filename)
            size += info.file_size
            if size >= CHUNK_BYTES:
                tasks.append((str(wheel), current))
                current, size = [], 0
    if current:
        tasks.append((str(wheel), current))
    return tasks


def unpack(wheel: str, members: list[str], site: str) -> int:
    """Writes ``members`` of ``wheel`` under ``site``; returns the bytes written."""
    written = 0
    with zipfile.ZipFile(wheel) as archive:
        for member in members:
            info = archive.getinfo(member)
            path = os.path.join(site, target_name(member) or "")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            temporary = f"{path}.{os.getpid()}.part"
            with archive.open(info) as source, open(temporary, "wb") as destination:
                shutil.copyfileobj(source, destination, 1 << 22)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(temporary, (mode or 0o644) | 0o644 | (0o111 if mode & 0o100 else 0))
            os.replace(temporary, path)
            written += info.file_size
    return written


def install(wheels: list[Path], site: Path, workers: int | None = None) -> int:
    """Unpacks every wheel into ``site`` in parallel; returns the bytes written."""
    tasks = [task for wheel in wheels for task in chunks(wheel)]
    tasks.sort(key=lambda task: -len(task[1]))  # the long ones first, so none is left running alone
    site.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count()) as pool:
        futures = [pool.submit(unpack, wheel, members, str(site)) for wheel, members in tasks]
        return sum(future.result() for future in futures)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    wheels = sorted(Path(argv[0]).glob("*.whl"))
    if not wheels:
        print(f"install_wheels.py: no wheel in {argv[0]}", file=sys.stderr)
        return 1
    written = install(wheels, Path(argv[1]))
    print(f"installed {len(wheels)} wheels into {argv[1]}: {written / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
