"""One module of timm's ``layers`` package, imported without timm's ``__init__``.

timm's package ``__init__`` imports torchvision, which the test install leaves out
(``pip install --no-deps timm``): as ``tests/test_grid.py`` does, the parents are
stubbed under a private alias, ``_anchor_timm``, so ``importlib.util.find_spec("timm")``
still finds the real package for diffusers and transformers. Not installed: fails under
``CI=true``, skips elsewhere (:func:`conftest.missing_anchor`).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import pathlib
import sys
import types

from conftest import missing_anchor


def timm_layer(module: str) -> types.ModuleType:
    """``timm.layers.<module>`` (e.g. ``"pos_embed_sincos"``), or skip/fail without timm."""
    spec = importlib.machinery.PathFinder.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        missing_anchor("timm", "is not installed")
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    for name, path in (("_anchor_timm", root), ("_anchor_timm.layers", root / "layers")):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = [str(path)]
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            stub.__spec__.submodule_search_locations = stub.__path__
            sys.modules[name] = stub
    return importlib.import_module(f"_anchor_timm.layers.{module}")
