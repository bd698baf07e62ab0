"""Names the package's face is to export, and the module each lives in today.

The documentation calls every public name as ``amp_rewrite.NAME``. These
are being added to ``amp_rewrite.__all__`` (loaded lazily, as
``validated_rewrite`` is). Until the package exports one, the docs build
(``conf.py``) and the docs tests (``tests/docs/``) take it from the module
named here; once it is exported, :func:`install` leaves it alone, and its
entry can go.
"""

from __future__ import annotations

import importlib

HOMES = {
    "diagnose": "amp_rewrite.report.doctor",
    "render_lines": "amp_rewrite.report.doctor",
    "measure_speedup": "amp_rewrite.report.measure",
    "disagreements": "amp_rewrite.paint.explain",
    "default_device_type": "amp_rewrite.graph.op_registry",
    "current_runtime": "amp_rewrite.runtime",
    "is_enabled": "amp_rewrite.runtime",
    "target_choice": "amp_rewrite.runtime",
    "RuntimeSettings": "amp_rewrite.runtime.settings",
}


def missing() -> list[str]:
    """The names of :data:`HOMES` that ``amp_rewrite`` does not export yet."""
    import amp_rewrite

    return [name for name in HOMES if name not in getattr(amp_rewrite, "__all__", ())]


def install() -> list[str]:
    """Makes each missing name an attribute of ``amp_rewrite``; returns the names it set."""
    import amp_rewrite

    names = missing()
    for name in names:
        setattr(amp_rewrite, name, getattr(importlib.import_module(HOMES[name]), name))
    return names
