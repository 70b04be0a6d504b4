"""What the base of the sinusoidal encoding controls: its wavelengths, their reach, their spacing.

``omega_i = base^(-2i/d)``: pair ``i`` turns once every ``2 pi base^(2i/d)``
positions, from ``2 pi`` (pair 0, at any base) to ``2 pi base^((d-2)/d)``, a
little under ``2 pi base``. :func:`base_sweep` measures, base by base, what
that range does to a table: how many pairs turn a full circle within a length
(each of those, read alone, gives ``p`` and ``p + wavelength`` the same
reading), how far the dot product of two rows keeps falling with their
distance, how close the two nearest rows are, and how many channels of a
short table barely move.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from posenc.core import checks
from posenc.families.absolute.sinusoidal import resolve, sinusoidal

#: A channel that changes by less than this over a table's positions is drawn as constant.
STILL = 0.01
#: The bases compared by default: those the report's sinusoidal explorer offers.
BASES = (100.0, 1000.0, 10000.0, 100000.0)


@dataclass(frozen=True)
class BaseSweep:
    """The sinusoidal table at several bases (:func:`base_sweep`); per-base tuples in base order.

    Attributes:
        dim: channels.
        length: positions ``0 .. length - 1`` compared.
        shown: positions of the short table whose still channels are counted.
        preset: the sinusoidal preset, its base replaced by each of ``bases``.
        bases: the bases, ascending.
        longest_wavelength: ``2 pi base^((d-2)/d)``, positions per turn of the slowest pair
            (the fastest, pair 0, turns every ``2 pi`` positions at any base).
        wrapped: pairs whose hand turns a full circle within ``length`` positions
            (wavelength at most ``length - 1``).
        reach: the first offset ``k`` at which ``PE(p) . PE(p + k)`` falls to 0 or
            below (the same at every ``p``), or None if it stays above 0 below ``length``.
        nearest: the smallest distance between the rows of two different positions
            below ``length``.
        nearest_offset: the offset of the two positions where it is reached.
        still: channels that change by less than :data:`STILL` over positions
            ``0 .. shown - 1``.
        offsets: the offsets ``0 .. length - 1`` of ``similarity``.
        similarity: ``(len(bases), length)``: ``PE(p) . PE(p + k) / (d/2)``, the cosine
            of two rows ``k`` apart.
    """

    dim: int
    length: int
    shown: int
    preset: str
    bases: tuple[float, ...]
    longest_wavelength: tuple[float, ...]
    wrapped: tuple[int, ...]
    reach: tuple[int | None, ...]
    nearest: tuple[float, ...]
    nearest_offset: tuple[int, ...]
    still: tuple[int, ...]
    offsets: Any
    similarity: Any


def base_sweep(
    dim: int = 512,
    length: int = 4096,
    bases: Iterable[float] = BASES,
    *,
    shown: int = 50,
    preset: str = "vaswani",
) -> BaseSweep:
    """``preset``'s table at each base: wavelengths, wraps, reach, nearest rows, still channels.

    The distance and dot product of rows ``p`` and ``p + k`` depend on ``k``
    alone (``|PE(p) - PE(p + k)|^2 = 2 sum_i (1 - cos(k omega_i))``), so the
    smallest over the offsets below ``length`` is the smallest over every pair
    of positions.

    Raises:
        ValueError: ``dim`` odd or below 4, ``length`` or ``shown`` below 2, no
            base, a base not above 1, an unknown ``preset``.
    """
    dim = checks.check_int(dim, "dim", minimum=4)
    if dim % 2:
        raise ValueError(f"dim must be even (pairs of sin and cos); got {dim}")
    length = checks.check_int(length, "length", minimum=2)
    shown = checks.check_int(shown, "shown", minimum=2)
    bs = sorted({checks.check_number(b, "bases", positive=True) for b in bases})
    if not bs or bs[0] <= 1:
        raise ValueError(f"bases must hold at least one base, each above 1; got {bs}")
    checks.check_elements(length * (dim // 2) * len(bs), "length x dim/2 x bases")
    k = np.arange(length, dtype=np.float64)
    longest, wrapped, reach, nearest, at, still, similarity = [], [], [], [], [], [], []
    for base in bs:
        omega = resolve(preset, base=base).inv_freq(dim)
        wavelength = 2 * np.pi / omega
        cosines = np.cos(np.outer(k, omega)).sum(axis=1)
        squared = np.maximum(2 * (dim // 2 - cosines[1:]), 0.0)
        below = np.nonzero(cosines <= 0)[0]
        table = np.asarray(sinusoidal(shown, dim, preset=preset, dtype="float64", base=base))
        longest.append(float(wavelength.max()))
        wrapped.append(int((wavelength <= length - 1).sum()))
        reach.append(int(below[0]) if below.size else None)
        nearest.append(float(np.sqrt(squared.min())))
        at.append(int(np.argmin(squared)) + 1)
        still.append(int((np.ptp(table, axis=0) < STILL).sum()))
        similarity.append(cosines / (dim // 2))
    return BaseSweep(
        dim,
        length,
        shown,
        preset,
        tuple(bs),
        tuple(longest),
        tuple(wrapped),
        tuple(reach),
        tuple(nearest),
        tuple(at),
        tuple(still),
        k,
        np.stack(similarity),
    )
