"""Fixtures shared by the test modules."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


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
