"""The short import paths users know, served from the modules' homes in the layers.

``posenc.rotary.schedules`` is :mod:`posenc.families.rotary.schedules`, the same
module object (not a copy), imported on first use: the layers show the
architecture, the short paths stay what users type. ``python -m posenc.cli``
and ``torchrun -m posenc.cli`` run the command through the same table.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

#: short path -> home; a short path's submodules follow it
MOVED = {
    "posenc.absolute": "posenc.families.absolute",
    "posenc.rotary": "posenc.families.rotary",
    "posenc.bias": "posenc.families.bias",
    "posenc.arithmetic": "posenc.families.arithmetic",
    "posenc.terms": "posenc.families.terms",
    "posenc.modules": "posenc.families.absolute.modules",
    "posenc.positions": "posenc.core.positions",
    "posenc.attend": "posenc.integration.attention",
    "posenc.hf": "posenc.integration.hf",
    "posenc.context_parallel": "posenc.integration.context_parallel",
    "posenc.analysis": "posenc.integration.analysis",
    "posenc.plot": "posenc.faces.plot",
    "posenc.report": "posenc.faces.report",
    "posenc.bench": "posenc.faces.bench",
    "posenc.lab": "posenc.faces.lab",
    "posenc.cli": "posenc.faces.cli",
}


def home(name: str) -> str | None:
    """The module a short path names, or None if ``name`` is not a short path."""
    for short, target in MOVED.items():
        if name == short or name.startswith(short + "."):
            return target + name[len(short) :]
    return None


def short(name: str) -> str:
    """``name``'s path under the short path that serves it, the most specific one
    (``posenc.modules`` over ``posenc.absolute.modules``), or ``name`` itself."""
    served = [(h, s) for s, h in MOVED.items() if name == h or name.startswith(h + ".")]
    if not served:
        return name
    target, path = max(served, key=lambda hs: len(hs[0]))
    return path + name[len(target) :]


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """Import a short path as its home module, registered under both names."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        target_name = home(fullname)
        if target_name is None or importlib.util.find_spec(target_name) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=target_name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        try:
            module = importlib.import_module(str(spec.origin))
        except ImportError as exc:  # a module that needs an extra: say which
            from posenc.core import extras

            error = extras.missing(spec.name, exc)
            if error is exc:
                raise
            raise error from exc
        # importlib stamps the alias spec on the module it gets: keep the home's
        _real_specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = _real_specs.pop(module.__name__, module.__spec__)

    def get_code(self, fullname: str) -> CodeType | None:  # runpy: python -m posenc.cli
        target_name = home(fullname)
        spec = importlib.util.find_spec(target_name) if target_name else None
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.abc.InspectLoader):
            return None
        return loader.get_code(str(target_name))

    def get_source(self, fullname: str) -> str | None:
        return None

    def is_package(self, fullname: str) -> bool:
        target_name = home(fullname)
        spec = importlib.util.find_spec(target_name) if target_name else None
        return bool(spec is not None and spec.submodule_search_locations is not None)


_real_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
