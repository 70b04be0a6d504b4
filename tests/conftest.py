"""Fixtures shared by the test modules, and :func:`anchor`, the one way they import an anchor."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator
from types import ModuleType
from typing import NoReturn

import pytest

#: How the CI install (``make test``: the ``[test]`` extra, then the Makefile's
#: NODEPS_ANCHORS with ``--no-deps``) provides each package the tests import with
#: :func:`anchor`. einops comes with x-transformers and rotary-embedding-torch.
INSTALLS = {
    "torch": 'pip install -e ".[test]"',
    "transformers": 'pip install -e ".[test]"',
    "diffusers": 'pip install -e ".[test]"',
    "positional_encodings": 'pip install -e ".[test]"',
    "x_transformers": 'pip install -e ".[test]"',
    "rotary_embedding_torch": 'pip install -e ".[test]"',
    "einops": 'pip install -e ".[test]" (x-transformers needs it)',
    "playwright": 'pip install -e ".[test]"',
    "timm": "pip install --no-deps timm==1.0.31 (the Makefile's NODEPS_ANCHORS)",
    "vit_pytorch": "pip install --no-deps vit-pytorch==1.26.11 (the Makefile's NODEPS_ANCHORS)",
}


def missing_anchor(package: str, why: str) -> NoReturn:
    """A test dependency is unavailable: fail under ``CI=true``, else skip saying why.

    The CI install provides every package in :data:`INSTALLS`, so there a missing one
    means the checks against it silently stopped running: the run fails, as it does
    for triton. Elsewhere the tests skip with the reason and the install command
    (``-ra`` lists it in the summary).
    """
    __tracebackhide__ = True  # reported at the caller's line: the module or test that needs it
    how = INSTALLS.get(package, "")
    reason = f"{package} {why}" + (f"; {how}" if how else "")
    if os.environ.get("CI") == "true":
        pytest.fail(
            f"{reason}. The CI install provides it: under CI=true a missing anchor fails "
            "the run instead of skipping the tests that check posenc against it",
            pytrace=False,
        )
    pytest.skip(reason, allow_module_level=True)


def anchor(name: str) -> ModuleType:
    """Import ``name`` (a module of a test dependency) or :func:`missing_anchor`.

    Works at module level (the whole module skips or, under CI, fails to collect),
    in a fixture and in a test.
    """
    __tracebackhide__ = True
    try:
        return importlib.import_module(name)
    except ImportError as error:
        missing_anchor(name.split(".")[0], f"does not import ({error})")


@pytest.fixture(scope="module")
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' logger for a module.

    HF logs (does not warn) about rope parameters its validators do not expect,
    e.g. ``factor`` for ``proportional``, which its own init function reads; the
    modules that build HF models and configs use this to keep the output readable.
    """
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def perturbed_lab_model(config, encoding):  # type: ignore[no-untyped-def]
    """A lab model (seed 0) whose parameters are all off their initial values (zeros and
    ones included): what the lab's span, loss and probe tests run on."""
    import torch

    from posenc.faces.lab.model import LabModel

    torch.manual_seed(0)
    model = LabModel(config, encoding)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model
