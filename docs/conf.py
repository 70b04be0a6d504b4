"""Sphinx configuration of posenc's documentation site (``make docs``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import posenc  # noqa: E402

# the command line's usage blocks, as argparse wraps them for an 80-column terminal
os.environ["COLUMNS"] = "80"

project = "posenc"
author = "the posenc developers"
copyright = "2026, the posenc developers"
release = version = posenc.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
    "sphinxarg.ext",
    "posenc_docs",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]

# strict: every reference resolves (-n); the only unresolved ones allowed are to the
# packages posenc's signatures mention, whose own inventories are not fetched (offline)
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(torch|numpy|np|transformers|diffusers|matplotlib|mpmath|triton|argparse|"
        r"collections|typing|typing_extensions|types|pathlib|os|enum|dataclasses|concurrent|"
        r"multiprocessing|subprocess|io|json|random|functools|contextlib|numbers|decimal|"
        r"fractions|hashlib|threading|_thread)(\..*)?",
    ),
    (
        r"py:.*",
        r"(Tensor|ndarray|Module|Path|Callable|Iterator|Iterable|Sequence|Mapping|"
        r"Any|TextIO|Literal|NoReturn|Self|ModuleType|PathLike|DTypeLike|ArrayLike|"
        r"NDArray|EllipsisType|Generator)",
    ),
]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# a method's docstring is its own: torch's Function.forward text says nothing of posenc's
autodoc_inherit_docstrings = False
autodoc_default_options = {"show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# quotes and ellipses are typeset, dashes are not: "--out" stays two hyphens
smartquotes_action = "qe"
# the search's ranking: the task pages first, argparse's long descriptions and the
# changelog last (docs/_ext/scorer.js)
html_search_scorer = str(HERE / "_ext" / "scorer.js")

myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath"]

html_theme = "furo"
html_title = f"posenc {release}"
html_static_path = ["_static"]
# nothing wider than its column (code wraps, table cells break): docs/_static/posenc.css
html_css_files = ["posenc.css"]
html_last_updated_fmt = None
# no general index: the search and the reference's summary tables find a name
html_use_index = False
# results without the page snippets, which the search would fetch: file:// refuses that
html_show_search_summary = False
napoleon_use_ivar = True
# objects stay out of the navigation tree: with them, furo's sidebar for ~100 reference
# pages dominated the build's time
toc_object_entries = False
