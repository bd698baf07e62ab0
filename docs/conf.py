"""Sphinx configuration of amp-rewrite's documentation.

Build it from the repository root (the README's development section)::

    pip install ".[docs]"
    sphinx-build -W --keep-going -b html docs docs/_build/html

Why Sphinx with MyST rather than MkDocs with Material: the package's
docstrings are written for Sphinx (Google-style sections, which napoleon
reads, and some 430 cross-references such as :class:`RewriteResult`), so
autodoc renders them as they are, while mkdocstrings would show the roles as
raw text. MyST lets the pages be Markdown, which reads the same on GitHub as
in the built site. Furo, the theme, ships its scripts and fonts with it: the
site loads nothing from the network.

Warnings are errors (``-W``), and ``nitpicky`` makes every cross-reference
that resolves to nothing a warning; MyST warns about a link to a missing page
or heading anchor. So a renamed page, heading or documented name fails the
build instead of leaving a dead link.
"""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent

project = "amp-rewrite"
author = "the amp-rewrite authors"
copyright = "the amp-rewrite authors; Apache License 2.0"  # noqa: A001 (Sphinx's name)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Headings down to ### get anchors, so pages can link to sections (page.md#anchor)
# and MyST checks that each such anchor exists.
myst_heading_anchors = 3
myst_enable_extensions = ["deflist"]

# The reference documents the face (amp_rewrite.__all__) only; the modules
# behind it are internal and may move between releases.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

nitpicky = True
# Types from other libraries (TensorFlow's protos and functions, NumPy) and the
# internal modules a docstring names for the curious: they are not documented
# here, so a reference to one renders as code instead of a link.
nitpick_ignore_regex = [
    (r"py:.*", r"(tf|tensorflow|np|numpy|google\.protobuf|keras|tf_keras)(\..*)?"),
    (r"py:.*", r"amp_rewrite\.(cli|graph|paint|report|runtime|tune|validate|pipeline|config|errors|strip|"
               r"saved_model|function_api|environment|tf_internals)(\..*)?"),
    (r"py:.*", r"(GraphDef|SavedModel|ConcreteFunction|PolymorphicFunction|Path|PathLike|os\.PathLike|"
               r"Callable|Iterable|Mapping|Sequence|collections\.abc\..*|typing\..*)"),
]
# Internal values a face docstring names by their short name: the result's
# ``applied`` record, the levels tuple, the runtime's value, validation's error.
nitpick_ignore = [
    ("py:class", "AppliedNames"),
    ("py:data", "LEVELS"),
    ("py:class", "Runtime"),
    ("py:exc", "ValidationError"),
]

# A block without a language (command lines, program output) is shown as it is.
highlight_language = "none"

html_theme = "furo"
html_title = "amp-rewrite"
html_show_sourcelink = False
html_static_path = ["_static"]
html_css_files = ["custom.css"]
