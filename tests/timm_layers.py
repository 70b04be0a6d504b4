"""One file of an installed package, imported without the package's ``__init__``.

timm's and vit-pytorch's package ``__init__`` import torchvision, which the test install
leaves out (``pip install --no-deps``). The parents are stubbed under a private alias
(``_anchor_timm``...): stubbing the real name would make ``importlib.util.find_spec("timm")``
fail in diffusers and transformers, which probe for timm. Not installed: fails under
``CI=true``, skips elsewhere (:func:`conftest.missing_anchor`).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import pathlib
import sys
import types

from conftest import missing_anchor


def load_anchor(
    top: str, subpackages: tuple[str, ...], module: str, why: str = "is not installed"
) -> types.ModuleType:
    """``top.<module>`` (``module`` a dotted path under ``top``), its parent packages
    ``subpackages`` stubbed; ``why`` is said where ``top`` is not installed."""
    spec = importlib.machinery.PathFinder.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        missing_anchor(top, why)
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    alias = f"_anchor_{top}"
    for depth in range(len(subpackages) + 1):
        parts = subpackages[:depth]
        name = ".".join((alias, *parts))
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = [str(root.joinpath(*parts))]
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            stub.__spec__.submodule_search_locations = stub.__path__
            sys.modules[name] = stub
    return importlib.import_module(f"{alias}.{module}")


def timm_layer(module: str) -> types.ModuleType:
    """``timm.layers.<module>`` (e.g. ``"pos_embed_sincos"``), or skip/fail without timm."""
    return load_anchor("timm", ("layers",), f"layers.{module}")
