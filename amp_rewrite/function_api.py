"""TF2 entry points: ``amp_rewrite.function`` and ``amp_rewrite.rewrite_concrete_function``.

Both work without ``ENABLE_AUTO_MP``. They rely on the runtime's machinery
(:mod:`amp_rewrite.runtime.tf2.tracing`, :mod:`amp_rewrite.runtime.tf2.concrete`)
but patch nothing in TensorFlow beyond adding one tracing callback, which
leaves every other ``tf.function`` alone.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

from amp_rewrite.config import Config
from amp_rewrite.environment import STRICT_ENV, is_true


def function(func=None, *, target: str | None = None, config: Config | None = None,
             **tf_function_kwargs):
    """A drop-in for ``tf.function`` whose traced functions run in mixed precision.

    Each ConcreteFunction it traces is rewritten and runs the rewritten body,
    with the traced signature: inputs, outputs and variables keep their dtypes.
    A GradientTape inside the function gets half forward and backward math.

    Args:
        func: the Python function; omit it to use ``function(...)`` as a decorator.
        target: ``"float16"`` or ``"bfloat16"``; overrides ``config.target``.
        config: the rewrite configuration; by default TensorFlow's
            ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables, painted for
            the GPU when this machine has one, else the CPU.
        **tf_function_kwargs: passed to ``tf.function`` (``input_signature``,
            ``jit_compile``, ``reduce_retracing``, ...).

    Returns:
        A ``tf.function`` (``tensorflow.types.experimental.PolymorphicFunction``).

    If a rewrite fails, a warning names the reason and that function runs as
    traced, in float32 (``AMP_REWRITE_STRICT=1`` raises instead).
    """
    if func is None:
        return functools.partial(function, target=target, config=config, **tf_function_kwargs)
    import tensorflow as tf

    from amp_rewrite.runtime.tf2 import tracing

    if target is not None:
        config = replace(config if config is not None else tracing.default_config(), target=target)
    hook = tracing.install_for_marked(is_strict=is_true(os.environ.get(STRICT_ENV)))
    if hook is None:
        return tf.function(func, **tf_function_kwargs)  # untested TensorFlow: plain float32
    return tf.function(tracing.marked(func, config, hook), **tf_function_kwargs)


def rewrite_concrete_function(concrete_function, *, target: str | None = None,
                              config: Config | None = None):
    """Returns a new ConcreteFunction running ``concrete_function``'s rewritten body.

    The new function takes and returns what the original does (same
    signature, same dtypes) and reads the same captured variables. The
    original is not modified. When the rewrite changes nothing, the original
    is returned.

    Args:
        concrete_function: e.g. ``my_tf_function.get_concrete_function(spec)``.
        target: ``"float16"`` or ``"bfloat16"``; overrides ``config.target``.
        config: as for :func:`function`.

    Raises:
        AmpRewriteError: the function's graph cannot be rewritten.

    An error TensorFlow raises while loading the rewritten functions reaches
    the caller as it is.
    """
    from amp_rewrite.runtime.tf2 import tracing
    from amp_rewrite.runtime.tf2.concrete import rewrite_concrete

    config = config if config is not None else tracing.default_config()
    if target is not None:
        config = replace(config, target=target)
    rewritten = rewrite_concrete(concrete_function, config)
    return rewritten.concrete_function or concrete_function
