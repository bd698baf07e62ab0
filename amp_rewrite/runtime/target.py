"""Which half type the runtime rewrites to, chosen for the machine it runs on.

:func:`choose_target` answers once per process, from the ``target`` setting:

- ``float16`` or ``bfloat16``: that type, whatever the machine.
- ``auto``: float16 when TensorFlow can use a GPU (tensor cores run float16
  from compute capability 7.0, and every CUDA GPU has float16 kernels, while
  bfloat16 kernels need compute capability 8.0); with no GPU, bfloat16 when
  the CPU has fast bfloat16 instructions (AVX512_BF16 or AMX-BF16), which
  oneDNN uses for MatMul and Conv2D; otherwise no rewrite at all, because
  float16 and bfloat16 CPU kernels without those instructions are slower
  than float32.

The answer is a :class:`TargetChoice`: the target (None for float32) and a
short reason that goes into the runtime's log line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from amp_rewrite.runtime.settings import TARGETS

AUTO = TARGETS[0]
CPUINFO_PATH = "/proc/cpuinfo"
# Linux's names for the instructions oneDNN's bfloat16 kernels need.
FAST_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class TargetChoice:
    """What the runtime rewrites to.

    Attributes:
        target: ``"float16"``, ``"bfloat16"``, or None to leave the script in float32.
        reason: why, in a few words, for the log.
    """

    target: str | None
    reason: str


def choose_target(setting: str = AUTO, *,
                  list_gpus: Callable[[], list] | None = None,
                  read_cpu_flags: Callable[[], Iterable[str]] | None = None) -> TargetChoice:
    """The target for ``setting`` (one of :data:`TARGETS`) on this machine.

    Args:
        setting: the requested target; ``auto`` looks at the machine.
        list_gpus: the GPUs TensorFlow can use (default:
            :func:`amp_rewrite.graph.op_registry.visible_gpus`, which also decides the
            device type the runtime's rewrites check kernels for).
        read_cpu_flags: the CPU's feature flags (default: :func:`cpu_flags`).
    """
    if setting != AUTO:
        return TargetChoice(setting, f"{setting} was requested")
    gpus = (list_gpus or _tensorflow_gpus)()
    if gpus:
        return TargetChoice("float16", f"TensorFlow sees {len(gpus)} GPU(s)")
    flags = set(read_cpu_flags() if read_cpu_flags is not None else cpu_flags())
    found = [flag for flag in FAST_BF16_FLAGS if flag in flags]
    if found:
        return TargetChoice("bfloat16", f"no GPU; the CPU has {'/'.join(found)}")
    return TargetChoice(None, "no GPU, and the CPU has neither AVX512_BF16 nor AMX-BF16: "
                              "half math would be slower than float32 here")


def cpu_flags(path: str = CPUINFO_PATH) -> frozenset[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo``; empty where there is none."""
    from amp_rewrite.tune.cache import read_cpuinfo

    return read_cpuinfo(path)[1]


def _tensorflow_gpus() -> list:
    from amp_rewrite.graph.op_registry import visible_gpus

    return visible_gpus()
