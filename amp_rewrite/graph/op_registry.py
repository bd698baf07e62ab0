"""The one place that asks TensorFlow about ops: OpDefs and registered kernels.

OpDefs come from TensorFlow's global registry, then from the graph's own
function library (a call to a library function is a node whose op is the
function's name, and its signature is an OpDef). Kernel lookups read the
kernel registry once per op and are cached for the process: the registry is
fixed once TensorFlow is loaded.
"""

from __future__ import annotations

import functools

from amp_rewrite import tf_internals
from amp_rewrite.errors import TensorFlowMissingError


def _tf_modules():
    try:
        from tensorflow.core.framework import function_pb2, graph_pb2, op_def_pb2

        op_def_registry, kernels = tf_internals.op_registry_modules()
    except ImportError as exc:  # pragma: no cover - exercised only without TF
        raise TensorFlowMissingError(
            "TensorFlow is not installed: install amp-rewrite with the extra that fits the "
            "machine, `pip install 'amp-rewrite[gpu]'` or `pip install 'amp-rewrite[cpu]'` "
            f"({exc})"
        ) from exc
    return op_def_registry, kernels, graph_pb2, function_pb2, op_def_pb2


def graph_pb2():
    """TensorFlow's ``graph_pb2`` module (GraphDef), imported on first use."""
    return _tf_modules()[2]


@functools.cache
def _registry_op_def(op: str):
    return _tf_modules()[0].get(op)


@functools.cache
def _kernels(op: str) -> tuple:
    """(device_type, {attr: frozenset(allowed dtypes)}) for each registered kernel of ``op``."""
    kernel_list = _tf_modules()[1].get_registered_kernels_for_op(op)
    result = []
    for kernel in kernel_list.kernel:
        constraints = {c.name: frozenset(c.allowed_values.list.type) for c in kernel.constraint}
        result.append((kernel.device_type, constraints))
    return tuple(result)


@functools.cache
def build_has_device_type(device_type: str) -> bool:
    """Whether this TensorFlow build registers kernels for ``device_type`` at all.

    ``tensorflow-cpu`` has no GPU kernels, so a GPU kernel check there can only
    consult OpDefs.
    """
    return any(dev == device_type for dev, _ in _kernels("MatMul"))


def default_device_type(*, runs_here: bool = False) -> str:
    """The device type a graph runs on when its caller names none: ``"GPU"`` or ``"CPU"``.

    Args:
        runs_here: the graph runs in this process, as the runtime's graphs do:
            GPU when TensorFlow sees a GPU now. Otherwise (a graph rewritten
            offline, perhaps for another machine): GPU when this TensorFlow
            build has GPU kernels.
    """
    if runs_here:
        return "GPU" if visible_gpus() else "CPU"
    return "GPU" if build_has_device_type("GPU") else "CPU"


def visible_gpus() -> list:
    """The GPUs TensorFlow can use in this process (``tf.config.list_physical_devices``)."""
    _tf_modules()  # names a missing TensorFlow
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


@functools.lru_cache(maxsize=1024)
def device_type_of(device: str) -> str | None:
    """The device type a node's device string names (``/device:GPU:0`` → ``GPU``), or None."""
    for part in device.split("/"):
        if part.startswith("device:"):
            return part.split(":")[1].upper() or None
        if ":" in part and not part.startswith(("job:", "replica:", "task:")):
            return part.split(":")[0].upper() or None
    return None


class OpRegistry:
    """OpDefs and kernel availability for the ops of one graph.

    Args:
        library: the graph's ``FunctionDefLibrary``; its functions' signatures
            serve as OpDefs for call nodes.
    """

    def __init__(self, library=None):
        self._functions = {}
        if library is not None:
            for function in library.function:
                self._functions[function.signature.name] = function.signature

    def op_def(self, op: str):
        """The OpDef for ``op``, or None when neither TensorFlow nor the library knows it."""
        found = _registry_op_def(op)
        if found is not None:
            return found
        return self._functions.get(op)

    @staticmethod
    def registry_op_def(op: str):
        """The OpDef TensorFlow registers for ``op``, or None."""
        return _registry_op_def(op)

    def is_library_function(self, op: str) -> bool:
        """Whether ``op`` names a function of the graph's library."""
        return op in self._functions and _registry_op_def(op) is None

    @staticmethod
    def has_kernel(op: str, device_type: str, attrs: dict[str, object]) -> bool | None:
        """Whether some kernel of ``op`` on ``device_type`` accepts these type attrs.

        Args:
            op: the op name.
            device_type: ``"GPU"``, ``"CPU"``, ...
            attrs: attr name → a DataType enum, or a tuple of them for list attrs.

        Returns:
            True or False; None when this build has no kernels for ``device_type``
            at all, so nothing can be said.
        """
        return _has_kernel(op, device_type, tuple(sorted(attrs.items())))


@functools.lru_cache(maxsize=65536)
def _has_kernel(op: str, device_type: str, attrs: tuple) -> bool | None:
    if not build_has_device_type(device_type):
        return None
    values = dict(attrs)
    for dev, constraints in _kernels(op):
        # A DEFAULT kernel serves every device type that has none of its own.
        if dev != device_type and dev != "DEFAULT":
            continue
        if all(_satisfies(values.get(name), allowed) for name, allowed in constraints.items()):
            return True
    return False


def _satisfies(value, allowed: frozenset) -> bool:
    if value is None:
        return True
    if isinstance(value, tuple):
        return all(v in allowed for v in value)
    return value in allowed
