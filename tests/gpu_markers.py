"""A test that skips for lack of CUDA must be one ``make gpu-check`` runs.

``tools/gpu_check.py`` runs ``pytest -m gpu`` on the modules whose text carries the
marker (:func:`gpu_check.gpu_test_files`); a test that skips without a CUDA device
but lacks the ``gpu`` marker, or sits in a module that check does not import, is
run nowhere: skipped on every CPU run, never selected on the GPU machine.

The hook below (imported by ``conftest.py``) looks at what actually skipped: a
``skipif`` evaluated true, a ``pytest.skip`` in a fixture or in the test's body.
A skip whose reason names CUDA or a GPU becomes a failure unless the test carries
the ``gpu`` marker (its own, its class's, its module's or its parameter's) and its
module is one gpu-check selects. It costs nothing on a run where nothing skips,
and on the CPU suite it covers every test the run collected.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Generator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

#: a skip reason that says the test needs CUDA (or a GPU)
CUDA_REASON = re.compile(r"\b(cuda|gpus?)\b", re.IGNORECASE)
SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.py"


@cache
def _gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _cuda_present() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def no_cuda(reason: str = "no CUDA device") -> pytest.MarkDecorator:
    """Skip, saying ``reason``, where torch sees no CUDA device.

    For a test's CUDA variant, which also carries ``pytest.mark.gpu`` written in its
    module (gpu-check selects modules by that text)::

        pytest.param("cuda", marks=[pytest.mark.gpu, no_cuda()])
    """
    return pytest.mark.skipif(not _cuda_present(), reason=reason)


@cache
def _selected(root: Path) -> frozenset[Path]:
    """The test modules ``make gpu-check`` runs ``pytest -m gpu`` on, under ``root``."""
    return frozenset((root / name).resolve() for name in _gpu_check().gpu_test_files(root))


def skip_reason(report: pytest.TestReport) -> str:
    """What a skipped report says (its longrepr is (path, line, "Skipped: reason"))."""
    text = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    return str(text).removeprefix("Skipped: ")


def unreachable(item: pytest.Item, reason: str) -> str | None:
    """Why a test skipped for ``reason`` is run by no check, or None if gpu-check runs it."""
    # with a device present, a skip naming CUDA (test_bench's "a CUDA device is
    # present") is not one for lack of it
    if not CUDA_REASON.search(reason) or _cuda_present():
        return None
    if item.get_closest_marker("gpu") is None:
        return "it lacks the gpu marker, so `pytest -m gpu` does not select it"
    if item.path.resolve() not in _selected(item.config.rootpath):
        return (
            "tools/gpu_check.py does not select its module (no `mark.gpu` in its text), "
            "so it is never imported there"
        )
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = skip_reason(report)
        why = unreachable(item, reason)
        if why is not None:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} skips for lack of CUDA ({reason!r}) but `make gpu-check` "
                f"would never run it: {why}. Mark it (or its CUDA parameter) "
                "@pytest.mark.gpu in a module gpu-check selects"
            )
    return report
