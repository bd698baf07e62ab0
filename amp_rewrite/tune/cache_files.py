"""The tuning cache's files in words, and their removal: what ``amp-rewrite cache`` shows and clears.

A cache directory holds one file per device, TensorFlow version and
amp-rewrite version (:mod:`amp_rewrite.tune.cache`). The files of *this
machine* are those made for its CPU, or for its GPU: among them, the one
this TensorFlow and this amp-rewrite read and write. Files made for other
devices (a shared directory) are left alone unless asked for; files that
are not tuning caches of this format (an older amp-rewrite's) serve no run
and go with this machine's.

Each verdict is listed with what was timed (``tf.function train_step,
bfloat16``), what it decided and the two best times; what follows a step's
key (the profiled regions, a mixed body's trial) is listed under it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from amp_rewrite.tune.cache import CacheFile, Timing, cache_files, read_file
from amp_rewrite.tune.keys import MIXED_KEY, PROFILE_KEY
from amp_rewrite.tune.trial import in_ms, is_faster

# A verdict's key: a step's or a graph's, then its digest; what follows it belongs to it.
_VERDICT_KEY = re.compile(r"^(?:step|graph) [0-9a-f]{32}$")
_REGION = " region "


@dataclass(frozen=True)
class Here:
    """What this machine's cache files are made for: its devices' descriptions, this TensorFlow, this amp-rewrite."""

    devices: frozenset[str]
    tensorflow: str
    version: str


@dataclass(frozen=True)
class Listed:
    """One file of the directory: read (``found``), or why it could not be."""

    path: Path
    found: CacheFile | None
    problem: str = ""

    def is_here(self, here: Here) -> bool:
        """Whether it belongs to this machine (its device's), or serves no run (not a cache of this format)."""
        return self.found is None or self.found.device in here.devices

    def is_current(self, here: Here) -> bool:
        """Whether this TensorFlow and this amp-rewrite read it on this machine."""
        return (self.found is not None and self.found.device in here.devices
                and (self.found.tensorflow, self.found.version) == (here.tensorflow, here.version))


def list_files(directory: str | os.PathLike) -> list[Listed]:
    """Every tuning cache file in ``directory``, read."""
    listed = []
    for path in cache_files(directory):
        try:
            listed.append(Listed(path, read_file(path)))
        except (FileNotFoundError, ValueError) as exc:
            listed.append(Listed(path, None, str(exc) or "gone"))
    return listed


def describe(item: Listed, here: Here) -> list[str]:
    """The lines of one file: its path, what it was made for, and each verdict with what followed it."""
    if item.found is None:
        return [f"{item.path}: {item.problem} (no run reads it)"]
    found = item.found
    where = ("read and written here" if item.is_current(here)
             else "this machine's, another TensorFlow or amp-rewrite" if item.is_here(here) else "another device's")
    lines = [f"{item.path} ({where})",
             f"  device: {found.device}",
             f"  TensorFlow {found.tensorflow}, amp-rewrite {found.version}"]
    verdicts = sorted(key for key in found.entries if _VERDICT_KEY.match(key))
    lines.append(f"  {len(verdicts)} verdict{'s' if len(verdicts) != 1 else ''}"
                 + (":" if verdicts else ""))
    for key in sorted(verdicts, key=lambda key: (found.entries[key].what, key)):
        lines += _verdict_lines(key, found.entries)
    return lines


def remove(items: Iterable[Listed]) -> list[Path]:
    """Removes the files; the paths removed (one already gone is not an error)."""
    removed = []
    for item in items:
        try:
            item.path.unlink()
        except FileNotFoundError:
            continue
        removed.append(item.path)
    return removed


def _verdict_lines(key: str, entries: dict[str, Timing]) -> list[str]:
    timing = entries[key]
    what = timing.what or key.split(" ", 1)[0]
    decided = "runs in half" if is_faster(timing) else "stays float32"
    speed = f" ({timing.float32 / timing.half:.2f}x)" if is_faster(timing) and timing.half > 0 else ""
    lines = [f"    {what}: {decided}: {in_ms(timing.half)} in half, {in_ms(timing.float32)} in float32{speed} "
             f"[{key[:key.index(' ') + 11]}]"]
    regions = sum(1 for other in entries if other.startswith(key + _REGION))
    mixed = entries.get(key + MIXED_KEY)
    if mixed is not None:
        lines.append(f"      a mixed body: {in_ms(mixed.half)} against {in_ms(mixed.float32)} for the better pure one, "
                     f"{'kept' if is_faster(mixed) else 'not kept'}")
    if key + PROFILE_KEY in entries:
        lines.append(f"      profiled: {regions} half region{'s' if regions != 1 else ''} timed")
    return lines
