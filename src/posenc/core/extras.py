"""Which extra of ``pip install posenc[...]`` brings a missing package, and the error saying so.

``import posenc`` needs only numpy. The rest comes with an extra: torch with
``[torch]``, transformers (and torch) with ``[hf]``, matplotlib, mpmath, rich and
latex2mathml with ``[plot]``. A name that needs a missing one raises an
:class:`ImportError` that names the extra to install, not a bare
``ModuleNotFoundError`` from deep inside posenc.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

#: a package posenc imports on demand -> the extra that brings it
EXTRAS = {
    "torch": "torch",
    "transformers": "hf",
    "matplotlib": "plot",
    "mpmath": "plot",
    "rich": "plot",
    "latex2mathml": "plot",
}


def missing(what: str, exc: ImportError) -> ImportError:
    """The error for ``what`` (a name or a command) failing on ``exc``: one that names the
    extra when ``exc`` is a missing package an extra brings, else ``exc`` itself."""
    package = (getattr(exc, "name", None) or "").split(".")[0]
    extra = EXTRAS.get(package)
    if not isinstance(exc, ModuleNotFoundError) or extra is None:
        return exc
    return ImportError(
        f"{what} needs {package}, which is not installed: pip install 'posenc[{extra}]'",
        name=package,
    )


def lazy(module: str, name: str, what: str) -> Any:
    """``module.name``, imported on first use, for the public name ``what``: a missing
    package an extra brings is :func:`missing`'s error."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        error = missing(what, exc)
        if error is exc:
            raise
        raise error from exc


def attribute(package: str, homes: Mapping[str, str], name: str) -> Any:
    """A package's ``__getattr__`` (PEP 562) for the names it imports on first use:
    ``homes[name]`` is the module that defines ``name``, ``package`` the path users
    import it by (what an error names); any other name is an ``AttributeError``."""
    if name not in homes:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return lazy(homes[name], name, f"{package}.{name}")
