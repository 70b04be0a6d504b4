"""What the measurements of a sinusoidal table share: float64 tables, offsets, the rounding unit.

Every bound in :mod:`posenc.integration.analysis` is stated in units of
``EPS = 2**-52``, the float64 machine epsilon, times the amplitude.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.families.absolute.sinusoidal import Sinusoid, Slots, sinusoidal

#: float64 machine epsilon (one ulp of 1.0).
EPS = float(np.finfo(np.float64).eps)
#: Error of one float64 table entry, in units of ``amplitude * EPS``: the angle
#: engine is exact to a few 1e-16 (see :mod:`posenc.core.angles`); 4 ulps covers it.
TABLE_ULPS = 4.0


def real_values(values: float | Iterable[float], name: str) -> tuple[float, ...]:
    """One real number or several, as a non-empty tuple of finite floats.

    Raises:
        TypeError: a value that is not a real number.
        ValueError: no value, or a NaN or infinite one.
    """
    items = (values,) if isinstance(values, (int, float, np.number)) else tuple(values)
    if not items:
        raise ValueError(f"{name} must hold at least one value")
    return tuple(checks.check_number(v, name) for v in items)


def paired_slots(spec: Sinusoid, dim: int, what: str) -> Slots:
    """The slots of ``dim``, refusing a lone channel (its value varies alone)."""
    slots = spec.slots(dim)
    if slots.n_first != slots.n_second:
        raise ValueError(
            f"dim={dim} with odd={spec.odd!r} leaves a lone channel without its partner, so "
            f"{what} does not hold; use an even dim or odd='zero'"
        )
    return slots


def table64(positions: int | npt.NDArray[np.float64], dim: int, spec: Sinusoid) -> Any:
    """The float64 table: ``positions`` rows (or these positions), plus the preset's offset."""
    return sinusoidal(positions, dim, preset=spec, dtype="float64")


def shifted64(length: int, k: float, dim: int, spec: Sinusoid) -> Any:
    """Rows at ``p + k`` for ``p < length``, evaluated directly (not by the table's recurrence)."""
    return table64(np.arange(length, dtype=np.float64) + k, dim, spec)
