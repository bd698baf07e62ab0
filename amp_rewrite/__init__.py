"""amp-rewrite: automatic mixed precision for TensorFlow graphs.

``rewrite(graph_def, fetches=[...], target="float16")`` returns a
:class:`RewriteResult` holding the rewritten GraphDef and a report. Importing
this package patches nothing and does not import TensorFlow until a graph is
rewritten. :func:`enable` (what ``ENABLE_AUTO_MP=1`` does at start-up) makes
TF1 sessions and traced ``tf.function``s run rewritten graphs, and TF1
optimizers and Keras ``compile`` scale the loss. :func:`function` is a
``tf.function`` that runs rewritten without the switch. ``__version__`` is
the installed distribution's version (``amp-rewrite --version`` prints it).

Beside those: :func:`validated_rewrite` checks a rewrite against float32 on
sample inputs; :func:`tuned_rewrite` keeps a rewrite only where it ran
faster than float32 here (``--tune``); :func:`diagnose` and :func:`render_lines` say why a rewritten
graph may not run faster, and :func:`measure_speedup` times both graphs;
:func:`disagreements` checks each node's reported reason against its dtype;
:func:`default_device_type` is the device type rewrites target when none is
given; :func:`is_enabled`, :func:`current_runtime`, :func:`target_choice`
and :class:`RuntimeSettings` describe the ``ENABLE_AUTO_MP`` runtime.

The modules behind the face (internal: they may move between releases):

- :mod:`amp_rewrite.pipeline`: the pass, ``rewrite()``;
  :mod:`amp_rewrite.config`: its one frozen configuration;
  :mod:`amp_rewrite.errors`: the exceptions it and the rest raise;
- :mod:`amp_rewrite.graph`: a GraphDef read and viewed typed;
  :mod:`amp_rewrite.paint`: the lists, the painting rules and the Casts;
  :mod:`amp_rewrite.tune`: measured precision;
- :mod:`amp_rewrite.validate`: the accuracy-guarded rewrite;
  :mod:`amp_rewrite.report`: the doctor, the HTML report, step times;
- :mod:`amp_rewrite.saved_model`: a SavedModel rewritten;
  :mod:`amp_rewrite.strip`: a mixed graph back to float32;
  :mod:`amp_rewrite.function_api`: ``function`` and ``rewrite_concrete_function``;
- :mod:`amp_rewrite.runtime`: the ``ENABLE_AUTO_MP`` runtime;
  :mod:`amp_rewrite.environment`: every environment variable read, by name;
  :mod:`amp_rewrite.tf_internals`: TensorFlow's private parts, all reached from there;
- :mod:`amp_rewrite.cli`: the ``amp-rewrite`` command, which ``python -m amp_rewrite`` runs too.
"""

from amp_rewrite.config import Config
from amp_rewrite.errors import AmpRewriteError, GraphError, InputFileError, ListError, RuntimeRewriteError, UsageError
from amp_rewrite.paint.op_lists import OpLists, load_lists
from amp_rewrite.pipeline import RewriteResult, rewrite

# Name → its home module, loaded on first use: these pull in NumPy, TensorFlow
# or the runtime, which importing the package must not.
_LAZY = {
    "validated_rewrite": "amp_rewrite.validate",
    "Tolerance": "amp_rewrite.validate",
    "ValidationReport": "amp_rewrite.validate",
    "rewrite_saved_model": "amp_rewrite.saved_model",
    "function": "amp_rewrite.function_api",
    "rewrite_concrete_function": "amp_rewrite.function_api",
    "diagnose": "amp_rewrite.report.doctor",
    "render_lines": "amp_rewrite.report.doctor",
    "measure_speedup": "amp_rewrite.report.measure",
    "tuned_rewrite": "amp_rewrite.tune.whole_graph",
    "disagreements": "amp_rewrite.paint.explain",
    "default_device_type": "amp_rewrite.graph.op_registry",
    "current_runtime": "amp_rewrite.runtime",
    "is_enabled": "amp_rewrite.runtime",
    "target_choice": "amp_rewrite.runtime",
    "RuntimeSettings": "amp_rewrite.runtime.settings",
}


def __getattr__(name: str):
    if name == "__version__":
        return _installed_version()
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'amp_rewrite' has no attribute {name!r}")


def _installed_version() -> str:
    """The installed distribution's version (:func:`amp_rewrite.tune.cache.package_version`, which the tuning
    cache's files are made for)."""
    from amp_rewrite.tune.cache import package_version

    return package_version()


def enable(**kwargs) -> None:
    """Turns on mixed precision for TF1 sessions and optimizers; see :mod:`amp_rewrite.runtime`."""
    from amp_rewrite import runtime

    runtime.enable(**kwargs)


def disable() -> None:
    """Undoes :func:`enable`; see :mod:`amp_rewrite.runtime`."""
    from amp_rewrite import runtime

    runtime.disable()


__all__ = [
    "AmpRewriteError",
    "Config",
    "GraphError",
    "InputFileError",
    "ListError",
    "OpLists",
    "RewriteResult",
    "RuntimeRewriteError",
    "RuntimeSettings",
    "Tolerance",
    "UsageError",
    "ValidationReport",
    "current_runtime",
    "default_device_type",
    "diagnose",
    "disable",
    "disagreements",
    "enable",
    "function",
    "is_enabled",
    "load_lists",
    "measure_speedup",
    "render_lines",
    "rewrite",
    "rewrite_concrete_function",
    "rewrite_saved_model",
    "target_choice",
    "tuned_rewrite",
    "validated_rewrite",
]
