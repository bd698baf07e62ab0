"""The one frozen configuration of a rewrite, and how the environment fills it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from amp_rewrite.environment import (
    CHECK_ENV,
    DUMP_DIR_ENV,
    LEVEL_ENV,
    STRICT_ENV,
    TF_LOG_PATH_ENV,
    TUNE_CACHE_ENV,
    any_true,
)
from amp_rewrite.errors import UsageError
from amp_rewrite.paint.keep_patterns import compile_patterns
from amp_rewrite.paint.op_lists import TARGETS, ListEdit, env_edits

LEVELS = ("DEFAULT", "TENSOR_CORES_ONLY", "TREAT_INFER_AS_DENY", "UNSAFE_FORCE_ALL")
DUMP_ENVS = (DUMP_DIR_ENV, TF_LOG_PATH_ENV)
DEVICE_TYPES = ("GPU", "CPU")


@dataclass(frozen=True)
class Config:
    """What to rewrite to, and how.

    Attributes:
        target: ``"float16"`` or ``"bfloat16"``.
        level: one of :data:`LEVELS`; ``DEFAULT`` is TensorFlow's normal behaviour.
        fetches: node names (``name`` or ``name:port``) the caller will fetch; they
            keep their dtype. ``None`` means every node that has no consumers.
        preserve: further node names never to change (feeds, for instance).
        device_type: the device the graph will run on (``"GPU"``/``"CPU"``);
            nodes pinned to another device type are left alone, and half
            kernels are checked for this type. ``None`` picks GPU when this
            TensorFlow build has GPU kernels, else CPU.
        lists_dir: a directory of list files replacing the bundled ones.
        list_edits: adds/removes applied on top of the files, in order.
        dump_dir: when set, each rewrite writes the graph before and after, and
            the effective lists, into this directory.
        keep_float32: (node name, reason) pairs: nodes that must stay float32,
            as accuracy validation or a profiled step decides (``function::node``
            names a node of a function); the reason goes into the report.
        release: nodes a deny op upstream does not taint (the elementwise tail
            of a layer norm whose statistics stay float32).
        fixed_signatures: library functions whose arguments and results keep
            their dtypes for every caller (the functions a SavedModel restores);
            their bodies are rewritten, with Casts inside.
        keep_float32_patterns: regular expressions; a node whose name (``function::node``
            inside a function) contains a match stays float32, like a preserved
            node (see :mod:`amp_rewrite.paint.keep_patterns`).
        tune_cache_dir: where measured step times are kept (``--tune``,
            :func:`amp_rewrite.tuned_rewrite`); None for
            :func:`amp_rewrite.tune.cache.default_cache_dir`. The rewrite itself
            measures nothing: its output depends only on the graph and the lists.
        tune_batch: with ``--tune`` and random inputs, the size of an unknown
            placeholder dimension; 0 leaves a graph with one to the lists.
        opaque_functions: (function name, reason) pairs: library functions
            left as they are; every call of one is opaque (the runtime's
            XLA-compiled functions on a CPU).
        is_checking: check the output's structural postconditions
            (:mod:`amp_rewrite.paint.checks`) and raise on the first one broken;
            ``AMP_REWRITE_CHECK=1`` or ``AMP_REWRITE_STRICT=1`` set it.
    """

    target: str = "float16"
    level: str = "DEFAULT"
    fetches: tuple[str, ...] | None = None
    preserve: tuple[str, ...] = ()
    device_type: str | None = None
    lists_dir: str | None = None
    list_edits: tuple[ListEdit, ...] = field(default=())
    dump_dir: str | None = None
    keep_float32: tuple[tuple[str, str], ...] = ()
    release: tuple[str, ...] = ()
    fixed_signatures: tuple[str, ...] = ()
    keep_float32_patterns: tuple[str, ...] = ()
    tune_cache_dir: str | None = None
    tune_batch: int = 32
    opaque_functions: tuple[tuple[str, str], ...] = ()
    is_checking: bool = False

    def __post_init__(self):
        if self.target not in TARGETS:
            raise UsageError(f"unknown target {self.target!r}; choose one of {', '.join(TARGETS)}")
        if self.level not in LEVELS:
            raise UsageError(f"unknown level {self.level!r}; choose one of {', '.join(LEVELS)}")
        if self.device_type is not None and self.device_type not in DEVICE_TYPES:
            raise UsageError(
                f"unknown device type {self.device_type!r}; choose one of {', '.join(DEVICE_TYPES)}"
            )
        compile_patterns(self.keep_float32_patterns)
        if self.level == "UNSAFE_FORCE_ALL" and self.target == "bfloat16":
            # TensorFlow refuses this too: few ops have bfloat16 kernels.
            raise UsageError("level UNSAFE_FORCE_ALL is only available for float16")
        if not (isinstance(self.tune_batch, int) and 0 <= self.tune_batch <= 1 << 20):
            raise UsageError(f"tuning batch {self.tune_batch!r}: must be an integer from 0 to {1 << 20}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **fields) -> Config:
        """A config whose level, list edits, dump directory, checks and timing cache come from the environment.

        Explicit ``fields`` win over the environment; ``list_edits`` given here
        are applied after the environment's.
        """
        environ = os.environ if environ is None else environ
        level = fields.get("level") or environ.get(LEVEL_ENV, "").strip().upper() or "DEFAULT"
        if level not in LEVELS and "level" not in fields:
            raise UsageError(f"{LEVEL_ENV}={environ[LEVEL_ENV]!r}: choose one of {', '.join(LEVELS)}")
        extra_edits = tuple(fields.pop("list_edits", ()))
        dump_dir = next((environ[name] for name in DUMP_ENVS if environ.get(name)), None)
        base = cls(level=level, list_edits=env_edits(environ) + extra_edits, dump_dir=dump_dir,
                   is_checking=any_true(environ, (CHECK_ENV, STRICT_ENV)),
                   tune_cache_dir=environ.get(TUNE_CACHE_ENV) or None)
        return replace(base, **fields)
