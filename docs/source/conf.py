"""Sphinx configuration of fxquant's documentation (``sphinx-build -W docs/source OUT``)."""

from __future__ import annotations

import warnings

import fxquant

# autodoc reads every attribute of the recipe classes, the deprecated one too
warnings.filterwarnings("ignore", "Recipe.command is deprecated", FutureWarning)

project = "fxquant"
author = "the fxquant authors"
copyright = "the fxquant authors"  # noqa: A001  (Sphinx reads this name)
version = release = fxquant.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "furo"
html_title = f"fxquant {release}"
exclude_patterns = ["_build"]
nitpicky = False
