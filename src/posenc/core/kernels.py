"""The one optional import of the compiled kernels, and how many threads a loop gets.

``posenc.core._kernels`` is built by ``setup.py`` from ``core/csrc/`` where a C
compiler exists. It fuses three loops: the sinusoidal table of
:mod:`posenc.core.angles` (``table``), the float32 and bfloat16 rotary rotation
of :mod:`posenc.families.rotary.apply` (``rotate``), and the flash-attention loop
with a relative-bias table of :mod:`posenc.integration.attention` (``attend``)
and its gradients (``attend_backward``).
Every caller imports :data:`compiled` from here and falls back to numpy or torch
when it is ``None``.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType


def _load() -> ModuleType | None:
    try:  # optional: numpy and torch do the same work without it
        return importlib.import_module("posenc.core._kernels")
    except ImportError:  # pragma: no cover - depends on the build
        return None


compiled: ModuleType | None = _load()


def max_workers() -> int:
    """Threads posenc's own pools use: the CPUs, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


def workers_for(elements: int) -> int:
    """Threads for a loop over ``elements`` values: one below 2**18, where starting
    more costs more than it saves, and never more than torch is set to use.

    The kernels run on torch's OpenMP team; a process forked after that team ran
    cannot use it (neither can torch: its own parallel ops hang there), and such a
    worker sets ``torch.set_num_threads(1)`` (DataLoader does): with one thread the
    kernels run inline and never touch the team.
    """
    if elements < 1 << 18:
        return 1
    torch = sys.modules.get("torch")
    return min(max_workers(), torch.get_num_threads()) if torch is not None else max_workers()
