"""The one optional import of the compiled kernels, and how many threads a loop gets.

``posenc.core._kernels`` is built by ``setup.py`` from ``core/csrc/`` where a C
compiler exists. It fuses the sinusoidal table of :mod:`posenc.core.angles`
(``table``), the float32 and bfloat16 rotary rotation of
:mod:`posenc.families.rotary.apply` (``rotate``), and the float32 attention loops,
each with its gradients (``*_backward``): the flash-attention loop with a
relative-bias table, scaled pieces or forget gates of
:mod:`posenc.integration.attention` (``attend``), its loops for terms that read
the scores (``attend_counted``: CoPE's counted positions; ``attend_mixed``:
DAPE's MLP over the heads), stick-breaking attention (``breaking``) and PaTH's
chunk core (``path_core``).
Every caller imports :data:`compiled` from here and falls back to numpy or torch
when it is ``None``. A build that failed (or never ran: no C compiler) is announced
once, when posenc is first imported, by a :class:`KernelWarning` that says how to fix
it; nothing is checked again on the way through the loops.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from types import ModuleType

#: the kernels' module, as setup.py names it
MODULE = "posenc.core._kernels"


class KernelWarning(RuntimeWarning):
    """posenc's compiled kernels are missing: the same results, computed more slowly."""


#: why the compiled kernels are missing (the import's error), or None where they load
missing_reason: str | None = None


def _load() -> ModuleType | None:
    global missing_reason
    try:  # optional: numpy and torch do the same work without it
        return importlib.import_module(MODULE)
    except ImportError as exc:
        missing_reason = str(exc)
        warnings.warn(
            f"posenc's compiled kernels are not built ({exc}): the sinusoidal tables, the "
            "CPU rotary rotation and the attention loop run on numpy and torch instead, "
            "with the same results, about 3 times slower. With a C compiler installed "
            "(gcc or clang), reinstall posenc to build them; `pip install -v posenc` shows "
            "why a build failed. `posenc info` says which backend serves each loop.",
            KernelWarning,
            stacklevel=2,
        )
        return None


compiled: ModuleType | None = _load()


def max_workers() -> int:
    """Threads posenc's own pools use: the CPUs, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


def threads_for(units: int) -> int:
    """Threads for a compiled attention loop of ``units`` work units (blocks of queries
    or keys): at most one per unit, never more than torch is set to use (one in a
    forked worker that set it so: see :func:`workers_for`)."""
    import torch

    return min(torch.get_num_threads(), max(1, units))


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
