"""The public surface is chosen: posenc._api lists it, and nothing else declares one."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import posenc
from posenc import _api, _moved


def modules() -> dict[str, object]:
    found: dict[str, object] = {"posenc": posenc}
    for info in pkgutil.walk_packages(posenc.__path__, "posenc."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found[_moved.short(info.name)] = importlib.import_module(info.name)
    return found


@pytest.mark.parametrize("name", list(_api.PUBLIC))
def test_a_public_modules_all_is_its_listed_names(name: str) -> None:
    module = importlib.import_module(name)
    listed = _api.names(name)
    assert len(set(listed)) == len(listed), "a name listed twice"
    declared = [n for n in module.__all__ if n != "__version__"]
    assert sorted(declared) == sorted(listed)
    assert all(getattr(module, n) is not None for n in listed)


def test_no_other_module_declares_a_public_surface() -> None:
    declaring = sorted(s for s, m in modules().items() if hasattr(m, "__all__"))
    assert declaring == sorted(_api.PUBLIC)


def test_reference_path() -> None:
    assert _api.reference_path("posenc.sinusoidal") == "api/posenc.html#posenc.sinusoidal"
    assert _api.reference_path("posenc.bias") == "api/posenc.bias.html"
    with pytest.raises(ValueError, match="not public"):
        _api.reference_path("posenc.core.angles.angles")
