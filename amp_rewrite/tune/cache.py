"""Measured step times on disk, one file per (device description, TensorFlow version).

A timing depends on the kernels that ran it: the device (for a CPU, its
model and the instruction sets oneDNN picks kernels by), and the TensorFlow
build. The file is named by a digest of both and holds them in the clear, so
a file made elsewhere (copied, or a digest that collides) is recognised as
foreign and ignored. Entries are keyed by what was timed (a traced step's
:func:`~amp_rewrite.tune.trial.step_key`, a GraphDef pair's
:func:`~amp_rewrite.tune.keys.graph_key`, a region of either) and
hold the two best times in seconds, float32's and half's. A file that cannot be read as such a
cache is ignored with one warning line and replaced on the next save; a
cache that cannot be written costs a warning and the next run measures again.

Where: ``$AMP_REWRITE_TUNE_CACHE`` (a directory) when set, else
``$XDG_CACHE_HOME/amp-rewrite``, else ``~/.cache/amp-rewrite``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

FORMAT = "amp-rewrite tuning cache 1"
CPUINFO_PATH = "/proc/cpuinfo"
# The CPU features whose presence changes which float32/half kernels oneDNN runs.
KERNEL_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile", "asimd", "fphp", "asimdhp", "bf16", "sve")


@dataclass(frozen=True)
class Timing:
    """The best seconds of what was timed: in float32, and in half."""

    float32: float
    half: float


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
    """The tuning cache of this machine's ``device_type`` and this TensorFlow, in ``directory`` (None: the user's)."""
    import tensorflow as tf

    gpu_name = first_gpu_name() if device_type == "GPU" else None
    return TuneCache(directory or default_cache_dir(), tensorflow=tf.__version__,
                     device=device_description(device_type, gpu_name=gpu_name))


class TuneCache:
    """The timings measured on one device with one TensorFlow, loaded from and saved to one file.

    Args:
        directory: where the file lives (see :func:`default_cache_dir`).
        device: :func:`device_description` of the device measured.
        tensorflow: the TensorFlow version.
    """

    def __init__(self, directory: str | os.PathLike, *, device: str, tensorflow: str):
        self.device = device
        self.tensorflow = tensorflow
        digest = hashlib.sha256(f"{device}\n{tensorflow}".encode()).hexdigest()[:16]
        self.path = Path(directory) / f"tune-{digest}.json"
        self._entries: dict[str, Timing] = self._load()
        self._added: dict[str, Timing] = {}
        self._warned = False  # a place that cannot be written is said once, not at every save

    def get(self, key: str) -> Timing | None:
        return self._added.get(key) or self._entries.get(key)

    def put(self, key: str, timing: Timing) -> None:
        self._added[key] = timing

    def save(self) -> None:
        """Writes the new timings, merged with what the file holds now (another process may have added some)."""
        if not self._added:
            return
        entries = {**self._load(quiet=True), **self._entries, **self._added}
        data = {"format": FORMAT, "device": self.device, "tensorflow": self.tensorflow,
                "entries": {key: [t.float32, t.half] for key, t in sorted(entries.items())}}
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
        self._entries, self._added = entries, {}

    def _load(self, *, quiet: bool = False) -> dict[str, Timing]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return {}  # nothing cached yet; a save says whether the place is writable
        except (OSError, UnicodeDecodeError) as exc:
            return self._ignore(f"unreadable ({exc})", quiet)
        try:
            data = json.loads(text)
        except ValueError:
            return self._ignore("not JSON", quiet)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            return self._ignore("not a tuning cache of this version", quiet)
        if data.get("device") != self.device or data.get("tensorflow") != self.tensorflow:
            return self._ignore(f"made for {data.get('device')!r} with TensorFlow {data.get('tensorflow')!r}, "
                                f"not {self.device!r} with TensorFlow {self.tensorflow!r}", quiet)
        try:
            return {str(k): Timing(float(v[0]), float(v[1])) for k, v in data["entries"].items()}
        except (TypeError, ValueError, IndexError, KeyError):
            return self._ignore("malformed entries", quiet)

    def _ignore(self, why: str, quiet: bool) -> dict[str, Timing]:
        if not quiet:
            logger.warning("amp-rewrite: ignoring tuning cache %s: %s", self.path, why)
        return {}
