"""Measured step times on disk, one file per (device description, TensorFlow version, amp-rewrite version).

A timing depends on the kernels that ran it: the device (for a CPU, its
model and the instruction sets oneDNN picks kernels by), and the TensorFlow
build; and on the rewrite that made the half body, which changes between
amp-rewrite's versions (its lists, its rules, the Casts it places). The file
is named by a digest of the three and holds them in the clear, so a file
made elsewhere (copied, or a digest that collides) is recognised as foreign
and ignored. The version is the file's, not each key's: every entry of a
file shares it, and an upgrade starts a file of its own rather than leaving
entries no run will read again in the one the runs use (``amp-rewrite
cache`` lists the files, ``amp-rewrite cache --clear`` removes them).

Entries are keyed by what was timed (a traced step's
:func:`~amp_rewrite.tune.keys.step_key`, a GraphDef pair's
:func:`~amp_rewrite.tune.keys.graph_key`, a region of either) and hold the
two best times in seconds, float32's and half's, and for a step what it
was in words (``tf.function train_step``), for the listing. A file that
cannot be read as such a cache is ignored with one warning line and
replaced on the next save; a cache that cannot be written costs a warning
and the next run measures again.

Where: ``$AMP_REWRITE_TUNE_CACHE`` (a directory) when set, else
``$XDG_CACHE_HOME/amp-rewrite``, else ``~/.cache/amp-rewrite``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

FORMAT = "amp-rewrite tuning cache 2"
#: The cache files' names: ``tune-`` and a digest of the device, TensorFlow's version and amp-rewrite's.
FILE_PATTERN = "tune-*.json"
CPUINFO_PATH = "/proc/cpuinfo"
# The CPU features whose presence changes which float32/half kernels oneDNN runs.
KERNEL_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile", "asimd", "fphp", "asimdhp", "bf16", "sve")


@dataclass(frozen=True)
class Timing:
    """The best seconds of what was timed: in float32, and in half; ``what`` names a step's (for the listing)."""

    float32: float
    half: float
    what: str = ""

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"float32": self.float32, "half": self.half}
        if self.what:
            found["what"] = self.what
        return found

    @classmethod
    def from_json(cls, value) -> Timing:
        return cls(float(value["float32"]), float(value["half"]), str(value.get("what", "")))


def read_cpuinfo(path: str = CPUINFO_PATH) -> tuple[str, frozenset[str]]:
    """The first CPU's model name and feature flags from ``/proc/cpuinfo``; empty where there is none."""
    model, flags = "", frozenset[str]()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "CPU part") and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model, flags


def device_description(device_type: str, *, gpu_name: str | None = None, cpuinfo_path: str = CPUINFO_PATH) -> str:
    """What the timings depend on, in words: ``CPU AMD EPYC 7B13 (avx avx2 f16c fma)`` or the GPU's name."""
    if device_type == "GPU":
        return f"GPU {gpu_name or 'unknown'}"
    model, flags = read_cpuinfo(cpuinfo_path)
    features = " ".join(flag for flag in KERNEL_FLAGS if flag in flags)
    return f"CPU {model or 'unknown'} ({features}), {os.cpu_count()} cores"


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user's cache directory (``XDG_CACHE_HOME`` or ``~/.cache``) for amp-rewrite.

    ``AMP_REWRITE_TUNE_CACHE`` is read with the rest of the configuration
    (:meth:`amp_rewrite.Config.from_env`), which passes it as the directory.
    """
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "amp-rewrite"


def first_gpu_name() -> str | None:
    """The first visible GPU's name, as the cache's device description gives it; None without one."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    return str(tf.config.experimental.get_device_details(gpus[0]).get("device_name", "unknown"))


def cache_here(directory: str | os.PathLike | None, device_type: str) -> TuneCache:
    """The tuning cache of this machine's ``device_type``, this TensorFlow and this amp-rewrite, in ``directory``
    (None: the user's)."""
    import tensorflow as tf

    gpu_name = first_gpu_name() if device_type == "GPU" else None
    return TuneCache(directory or default_cache_dir(), tensorflow=tf.__version__,
                     device=device_description(device_type, gpu_name=gpu_name))


@functools.cache
def package_version() -> str:
    """amp-rewrite's installed version, which ``pyproject.toml``'s ``version`` sets (``amp_rewrite.__version__``).

    Read on first use: importing importlib.metadata costs about a third of
    the package's own import. A checkout imported without being installed
    has no metadata and reports ``0+unknown``.
    """
    from importlib import metadata

    try:
        return metadata.version("amp-rewrite")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class TuneCache:
    """The timings measured on one device with one TensorFlow and one amp-rewrite, loaded from and saved to one file.

    Args:
        directory: where the file lives (see :func:`default_cache_dir`).
        device: :func:`device_description` of the device measured.
        tensorflow: the TensorFlow version.
        version: amp-rewrite's version (None: the installed one's).
    """

    def __init__(self, directory: str | os.PathLike, *, device: str, tensorflow: str, version: str | None = None):
        self.device = device
        self.tensorflow = tensorflow
        self.version = package_version() if version is None else version
        self.path = Path(directory) / file_name(device, tensorflow, self.version)
        self._entries: dict[str, Timing] = self._load()
        self._added: dict[str, Timing] = {}
        self._dropped: set[str] = set()
        self._warned = False  # a place that cannot be written is said once, not at every save

    def get(self, key: str) -> Timing | None:
        if key in self._dropped:
            return None
        return self._added.get(key) or self._entries.get(key)

    def put(self, key: str, timing: Timing) -> None:
        self._added[key] = timing
        self._dropped.discard(key)

    def discard(self, key: str) -> None:
        """Forgets ``key``'s times, here and in the file at the next save (a verdict measured again that was not
        clear enough to keep)."""
        self._added.pop(key, None)
        self._dropped.add(key)

    def save(self) -> None:
        """Writes the new timings, merged with what the file holds now (another process may have added some)."""
        if not self._added and not self._dropped:
            return
        entries = {**self._load(quiet=True), **self._entries, **self._added}
        entries = {key: timing for key, timing in entries.items() if key not in self._dropped}
        data = {"format": FORMAT, "device": self.device, "tensorflow": self.tensorflow, "amp_rewrite": self.version,
                "entries": {key: t.as_json() for key, t in sorted(entries.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
            os.replace(temporary, self.path)
        except OSError as exc:
            log = logger.debug if self._warned else logger.warning
            log("amp-rewrite: tuning cache %s not written: %s", self.path, exc.strerror or exc)
            self._warned = True
            return
        self._entries, self._added, self._dropped = entries, {}, set()

    def _load(self, *, quiet: bool = False) -> dict[str, Timing]:
        try:
            found = read_file(self.path)
        except FileNotFoundError:
            return {}  # nothing cached yet; a save says whether the place is writable
        except ValueError as exc:
            return self._ignore(str(exc), quiet)
        if (found.device, found.tensorflow, found.version) != (self.device, self.tensorflow, self.version):
            return self._ignore(f"made for {found.device!r} with TensorFlow {found.tensorflow!r} and amp-rewrite "
                                f"{found.version!r}, not {self.device!r} with TensorFlow {self.tensorflow!r} and "
                                f"amp-rewrite {self.version!r}", quiet)
        return found.entries

    def _ignore(self, why: str, quiet: bool) -> dict[str, Timing]:
        if not quiet:
            logger.warning("amp-rewrite: ignoring tuning cache %s: %s", self.path, why)
        return {}


def file_name(device: str, tensorflow: str, version: str) -> str:
    """``tune-<digest>.json``: the name of the cache file of a device, a TensorFlow and an amp-rewrite."""
    digest = hashlib.sha256(f"{device}\n{tensorflow}\n{version}".encode()).hexdigest()[:16]
    return f"tune-{digest}.json"


@dataclass(frozen=True)
class CacheFile:
    """One cache file as read: what it was made for, and its entries."""

    path: Path
    device: str
    tensorflow: str
    version: str
    entries: dict[str, Timing]


def read_file(path: Path) -> CacheFile:
    """The cache file at ``path``.

    Raises:
        FileNotFoundError: there is none (or its directory is no directory).
        ValueError: it is no tuning cache of this format; the message says why.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except NotADirectoryError:
        raise FileNotFoundError(str(path)) from None
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"unreadable ({exc})") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise ValueError("not a tuning cache of this version")
    try:
        entries = {str(key): Timing.from_json(value) for key, value in data["entries"].items()}
    except (TypeError, ValueError, KeyError, AttributeError):
        raise ValueError("malformed entries") from None
    return CacheFile(path, str(data.get("device")), str(data.get("tensorflow")), str(data.get("amp_rewrite")),
                     entries)


def cache_files(directory: str | os.PathLike) -> list[Path]:
    """The tuning cache files in ``directory``, by name."""
    try:
        return sorted(path for path in Path(directory).glob(FILE_PATTERN) if path.is_file())
    except OSError:
        return []
