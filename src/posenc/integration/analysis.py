"""Measured properties of sinusoidal encodings: the claims people ask about, as numbers.

Each function measures one property on a float64 table and returns a small
frozen dataclass of numbers, with the bound the property must meet derived
from float64 rounding (``EPS = 2**-52``). Nothing here prints; the ``posenc
check`` command turns these into PASS/FAIL lines.

- :func:`shift_error`: ``PE(p + k) == PE(p) @ M(k).T`` (paper section 3.5,
  "a linear function of PE(pos)"), with ``M`` from :func:`posenc.shift_matrix`.
- :func:`norms`: every row has norm ``amplitude * sqrt(pairs)``, i.e.
  ``sqrt(d / 2)`` for the paper's encoding (each (sin, cos) pair lies on the
  unit circle).
- :func:`offset_dot_products`: ``PE(p) . PE(p + k) = amplitude**2 * sum_j
  cos(k omega_j)`` depends on the offset ``k`` only, not on ``p``.
- :func:`regression_r2`: the experiment of a user who regressed one sine
  column at ``p + k`` on the same column at ``p`` and found no fit: a single
  column is not a linear function of itself shifted, the (sin, cos) pair is.
- :func:`precision_report`: the error of posenc's float32 output and of the
  usual float32 formula (float32 frequencies times float32 positions) at large
  positions.

Notation: ``d`` channels, ``K`` frequency pairs, ``p`` position, ``k`` offset,
``omega_j`` the angular frequency of pair ``j``. Tables are ``(length, d)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.core.angles import sincos_numpy
from posenc.families.absolute.sinusoidal import Sinusoid, Slots, resolve, shift_matrix, sinusoidal

__all__ = [
    "DotProducts",
    "Norms",
    "PrecisionPoint",
    "PrecisionReport",
    "Regression",
    "ShiftError",
    "norms",
    "offset_dot_products",
    "precision_report",
    "regression_r2",
    "shift_error",
]

#: float64 machine epsilon (one ulp of 1.0).
EPS = float(np.finfo(np.float64).eps)
#: Error of one float64 table entry, in units of ``amplitude * EPS``: the angle
#: engine is exact to a few 1e-16 (see ``posenc._angles``); 4 ulps covers it.
_TABLE_ULPS = 4.0


@dataclass(frozen=True)
class ShiftError:
    """How well the shift matrix reproduces shifted rows, for each offset.

    Attributes:
        dim: channels.
        length: rows compared (positions ``0 .. length - 1`` plus the preset offset).
        offsets: the shifts ``k``.
        max_error: per offset, ``max |PE(p + k) - PE(p) @ M(k).T|`` over all
            rows and channels (float64).
        tolerance: the bound every entry of ``max_error`` must meet.
    """

    dim: int
    length: int
    offsets: tuple[float, ...]
    max_error: tuple[float, ...]
    tolerance: float

    @property
    def ok(self) -> bool:
        """Whether every offset meets the tolerance."""
        return all(e <= self.tolerance for e in self.max_error)


@dataclass(frozen=True)
class Norms:
    """Row norms of the table against ``amplitude * sqrt(pairs)``.

    Attributes:
        dim: channels.
        length: rows measured.
        pairs: complete (sin, cos) pairs (``d // 2`` for even ``d``).
        expected: ``amplitude * sqrt(pairs)``; ``sqrt(d / 2)`` for the paper.
        min: smallest row norm.
        max: largest row norm.
        max_deviation: ``max |norm - expected|`` over rows.
        tolerance: the bound ``max_deviation`` must meet.
    """

    dim: int
    length: int
    pairs: int
    expected: float
    min: float
    max: float
    max_deviation: float
    tolerance: float

    @property
    def ok(self) -> bool:
        """Whether ``max_deviation`` meets the tolerance."""
        return self.max_deviation <= self.tolerance


@dataclass(frozen=True)
class DotProducts:
    """``PE(p) . PE(p + k)`` over positions ``p``, for each offset ``k``.

    Attributes:
        dim: channels.
        length: positions ``p`` measured.
        offsets: the offsets ``k``.
        closed_form: per offset, ``amplitude**2 * sum_j cos(k omega_j)``.
        spread: per offset, ``max_p - min_p`` of the dot product: zero in exact
            arithmetic, because it depends on ``k`` only.
        max_deviation: per offset, ``max_p |dot - closed_form|``.
        tolerance: the bound every spread and deviation must meet.
    """

    dim: int
    length: int
    offsets: tuple[float, ...]
    closed_form: tuple[float, ...]
    spread: tuple[float, ...]
    max_deviation: tuple[float, ...]
    tolerance: float

    @property
    def ok(self) -> bool:
        """Whether every spread and deviation meets the tolerance."""
        return all(v <= self.tolerance for v in (*self.spread, *self.max_deviation))


@dataclass(frozen=True)
class Regression:
    """Least-squares fits of column ``column`` at ``p + offset`` from the table at ``p``.

    Attributes:
        dim: channels.
        length: positions ``p`` (``0 .. length - 1`` plus the preset offset).
        offset: the shift ``k``.
        column: the regressed channel.
        partner: the other member of ``column``'s (sin, cos) pair.
        omega: the angular frequency of the pair.
        single_r2: R^2 of ``y(p + k) ~ a + b y(p)``: the single column with an
            intercept. Below 1 whenever ``k omega`` is not a multiple of pi.
        single_r2_limit: ``cos(k omega)**2``, the value ``single_r2`` tends to
            when the positions cover many periods.
        pair_r2: R^2 of ``y(p + k) ~ a + b y(p) + c partner(p)``: 1 up to rounding.
        pair_tolerance: the bound ``1 - pair_r2`` must meet. lstsq is backward
            stable, and the table entries are exact to a few ulps, so the
            residual of an exact relation is at most about
            ``EPS (|X| |coef| + |y|)``; with a factor 32 for the constants,
            ``1 - R^2 = |r|**2 / SS_tot <= (32 EPS (|X| |coef| + |y|))**2 / SS_tot``.
        pair_coef: the fitted ``(a, b, c)``.
        expected_coef: the exact ``(0, cos(k omega), +-sin(k omega))``.
    """

    dim: int
    length: int
    offset: float
    column: int
    partner: int
    omega: float
    single_r2: float
    single_r2_limit: float
    pair_r2: float
    pair_tolerance: float
    pair_coef: tuple[float, float, float]
    expected_coef: tuple[float, float, float]


@dataclass(frozen=True)
class PrecisionPoint:
    """Errors of one row at one position against the float64-exact values.

    Attributes:
        position: the position ``p``.
        max_angle: the largest angle ``|p omega_j|`` in the row (radians).
        posenc_error: ``max |posenc float32 - exact|`` over the row.
        naive_error: ``max |naive float32 - exact|``: the usual formula with
            float32 frequencies and a float32 product ``p * omega``.
        naive_angle_error: ``max |fl32(fl32(p) * fl32(omega)) - p omega|``,
            the angle error that causes ``naive_error`` (about ``max_angle * 2**-24``).
    """

    position: float
    max_angle: float
    posenc_error: float
    naive_error: float
    naive_angle_error: float


@dataclass(frozen=True)
class PrecisionReport:
    """float32 errors at large positions: posenc against the usual float32 formula.

    Attributes:
        dim: channels.
        points: one :class:`PrecisionPoint` per position.
        tolerance: the bound every ``posenc_error`` must meet: half a float32
            ulp of the amplitude (posenc rounds the exact value once), plus
            the float64 value's few ulps.
    """

    dim: int
    points: tuple[PrecisionPoint, ...]
    tolerance: float

    @property
    def ok(self) -> bool:
        """Whether posenc meets the tolerance at every position."""
        return all(pt.posenc_error <= self.tolerance for pt in self.points)


# --------------------------------------------------------------------------------------
# helpers


def _check_length(length: Any, minimum: int = 1) -> int:
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
        raise TypeError(f"length must be an int >= {minimum}; got {type(length).__name__}")
    if length < minimum:
        raise ValueError(f"length must be an int >= {minimum}; got {length}")
    return int(length)


def _check_offsets(offsets: Any) -> tuple[float, ...]:
    values = (offsets,) if isinstance(offsets, (int, float, np.number)) else tuple(offsets)
    if not values:
        raise ValueError("offsets must hold at least one offset")
    out = []
    for k in values:
        if isinstance(k, bool) or not isinstance(k, (int, float, np.integer, np.floating)):
            raise TypeError(f"offsets must be real numbers; got {type(k).__name__} {k!r}")
        if not math.isfinite(float(k)):
            raise ValueError(f"offsets must be finite; got {k!r}")
        out.append(float(k))
    return tuple(out)


def _paired_slots(spec: Sinusoid, dim: int, what: str) -> Slots:
    """The slots of ``dim``, refusing a lone channel (its value varies alone)."""
    slots = spec.slots(dim)
    if slots.n_first != slots.n_second:
        raise ValueError(
            f"dim={dim} with odd={spec.odd!r} leaves a lone channel without its partner, so "
            f"{what} does not hold; use an even dim or odd='zero'"
        )
    return slots


def _table64(positions: int | npt.NDArray[np.float64], dim: int, spec: Sinusoid) -> Any:
    return sinusoidal(positions, dim, preset=spec, dtype="float64")


def _shifted64(length: int, k: float, dim: int, spec: Sinusoid) -> Any:
    """Rows at ``p + k``, evaluated directly (not by the table's recurrence)."""
    return _table64(np.arange(length, dtype=np.float64) + k, dim, spec)


def _r2(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> tuple[float, Any, float]:
    """R^2, coefficients and the rounding bound on ``1 - R^2`` of the fit ``y ~ x``.

    ``x`` includes the intercept column. The bound is what an exact linear
    relation can leave after rounding (see :class:`Regression`).
    """
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    total = float(np.sum((y - y.mean()) ** 2))
    if total == 0.0:
        raise ValueError("the regressed column is constant over these positions: R^2 is undefined")
    floor = 32.0 * EPS * (np.linalg.norm(x) * np.linalg.norm(coef) + np.linalg.norm(y))
    return 1.0 - float(resid @ resid) / total, coef, float(floor**2 / total)


# --------------------------------------------------------------------------------------
# properties


def shift_error(
    dim: int,
    length: int,
    offsets: float | Iterable[float] = (1, 10, 100),
    *,
    preset: str | Sinusoid = "vaswani",
    **overrides: Any,
) -> ShiftError:
    """Measure ``max |PE(p + k) - PE(p) @ shift_matrix(k).T|`` over ``p < length``.

    Both sides are float64; ``PE(p)`` comes from the table (block recurrence),
    ``PE(p + k)`` from direct evaluation at the shifted positions, so the two
    paths check each other.

    Args:
        dim: channels.
        length: rows (positions ``0 .. length - 1`` plus the preset's offset).
        offsets: one shift ``k`` or several (int or float, may be negative).
        preset: a preset name or :class:`~posenc.Sinusoid`; ``**overrides`` as
            in :func:`posenc.sinusoidal`.

    Returns:
        A :class:`ShiftError`. Its tolerance: each entry of the product is
        ``cos(k w) x + sin(k w) y`` (the other terms of a row of ``M`` are exact
        zeros), with ``x, y`` and the rotation exact to ``4`` ulps of the
        amplitude ``a``; two products and a sum add 3 roundings. So
        ``|error| <= a EPS (4 (1 + sqrt 2) + 3 sqrt 2 + 4) < 20 a EPS``.

    Raises:
        ValueError: a lone channel (odd ``dim`` with ``odd="extend"`` or
            ``"truncate"``), bad length or offsets.
    """
    spec = resolve(preset, **overrides)
    _paired_slots(spec, dim, "the shift property")
    length = _check_length(length)
    ks = _check_offsets(offsets)
    base = _table64(length, dim, spec)
    errors = []
    for k in ks:
        predicted = base @ shift_matrix(k, dim, preset=spec).T
        errors.append(float(np.max(np.abs(_shifted64(length, k, dim, spec) - predicted))))
    amp = abs(spec.amplitude_for(dim))
    return ShiftError(dim, length, ks, tuple(errors), 20.0 * amp * EPS)


def norms(dim: int, length: int, *, preset: str | Sinusoid = "vaswani", **overrides: Any) -> Norms:
    """Measure the row norms against ``amplitude * sqrt(pairs)`` (``sqrt(d/2)`` for the paper).

    Each pair ``(a sin x, a cos x)`` has norm ``a``; a zero channel adds
    nothing; so every row has norm ``a sqrt(K)`` whatever the position.

    Args:
        dim: channels.
        length: rows (positions ``0 .. length - 1`` plus the preset's offset).
        preset: a preset name or :class:`~posenc.Sinusoid`; ``**overrides`` as
            in :func:`posenc.sinusoidal`.

    Returns:
        A :class:`Norms`. Its tolerance: the squares carry ``4`` ulps from the
        table and one rounding each, their recursive float64 sum at most
        ``d - 1`` relative roundings, and the square root halves the relative
        error and adds one: ``|error| <= expected * EPS * (d + 8)``.

    Raises:
        ValueError: a lone channel (its square varies with the position).
    """
    spec = resolve(preset, **overrides)
    slots = _paired_slots(spec, dim, "a constant row norm")
    length = _check_length(length)
    table = _table64(length, dim, spec)
    row = np.sqrt(np.einsum("ij,ij->i", table, table))
    pairs = slots.n_second
    expected = abs(spec.amplitude_for(dim)) * math.sqrt(pairs)
    return Norms(
        dim=dim,
        length=length,
        pairs=pairs,
        expected=expected,
        min=float(row.min()),
        max=float(row.max()),
        max_deviation=float(np.max(np.abs(row - expected))),
        tolerance=expected * EPS * (dim + 8),
    )


def offset_dot_products(
    dim: int,
    length: int,
    offsets: float | Iterable[float] = (1, 10, 100),
    *,
    preset: str | Sinusoid = "vaswani",
    **overrides: Any,
) -> DotProducts:
    """Measure ``PE(p) . PE(p + k)`` for ``p < length``: it depends on ``k`` only.

    ``sin(p w) sin((p + k) w) + cos(p w) cos((p + k) w) = cos(k w)``, so the
    dot product is ``a**2 * sum_j cos(k omega_j)`` for every ``p`` (for the
    ``"cos_sin"`` order too: the pair's terms are the same two products).

    Args:
        dim: channels.
        length: positions ``p`` (``0 .. length - 1`` plus the preset's offset).
        offsets: one offset ``k`` or several.
        preset: a preset name or :class:`~posenc.Sinusoid`; ``**overrides`` as
            in :func:`posenc.sinusoidal`.

    Returns:
        A :class:`DotProducts`. Its tolerance: a float64 dot product of ``d``
        terms errs by at most ``d EPS sum |x_i y_i| <= d EPS a**2 K``; table
        entries off by ``4 a EPS`` add ``8 a EPS sum |x_i| <= 8 a**2 EPS d``;
        the closed form's sum adds ``K a**2 EPS``. Together
        ``a**2 EPS (d K + 8 d + K)``, and a spread is at most twice a deviation.

    Raises:
        ValueError: a lone channel (its product depends on ``p``).
    """
    spec = resolve(preset, **overrides)
    slots = _paired_slots(spec, dim, "offset-only dot products")
    length = _check_length(length)
    ks = _check_offsets(offsets)
    base = _table64(length, dim, spec)
    amp2 = spec.amplitude_for(dim) ** 2
    pairs = slots.n_second
    _, cos_k = sincos_numpy(np.array(ks), spec.turns(dim))
    closed, spread, deviation = [], [], []
    for i, k in enumerate(ks):
        dots = np.einsum("ij,ij->i", base, _shifted64(length, k, dim, spec))
        exact = amp2 * float(np.sum(cos_k[i, :pairs]))
        closed.append(exact)
        spread.append(float(dots.max() - dots.min()))
        deviation.append(float(np.max(np.abs(dots - exact))))
    tolerance = 2.0 * amp2 * EPS * (dim * pairs + 8 * dim + pairs)
    return DotProducts(
        dim, length, ks, tuple(closed), tuple(spread), tuple(deviation), max(tolerance, 0.0)
    )


def _default_column(spec: Sinusoid, dim: int, offset: float) -> int:
    """The first channel of the pair whose step ``offset * omega`` is nearest 1 radian.

    There ``cos(k w)**2`` is about 0.29, far from 1: the seed experiment's
    ``PE_even(p, 64)`` at ``d = 512, k = 10`` (``omega = 0.1``) is this column.
    """
    slots = spec.slots(dim)
    pairs = slots.n_second
    if pairs == 0:
        raise ValueError(f"dim={dim} has no complete (sin, cos) pair to regress on")
    omega = spec.inv_freq(dim)[:pairs]
    j = int(np.argmin(np.abs(np.abs(offset * omega) - 1.0)))
    first, _ = slots.indices()
    return int(first[j])


def regression_r2(
    dim: int,
    length: int,
    offset: float,
    column: int | None = None,
    *,
    preset: str | Sinusoid = "vaswani",
    **overrides: Any,
) -> Regression:
    """R^2 of predicting one column at ``p + offset`` from one column, then from its pair.

    The experiment of a user reading section 3.5 ("PE(pos + k) is a linear
    function of PE(pos)"): regress ``sin(w (p + k))`` on ``sin(w p)`` with an
    intercept, over many ``p``. It fails (``R^2 ~ cos(k w)**2``), because
    ``sin(w (p + k)) = cos(k w) sin(w p) + sin(k w) cos(w p)`` needs the cosine
    column as well: with the (sin, cos) pair the fit is exact. numpy
    ``lstsq`` on float64 values.

    Args:
        dim: channels.
        length: positions ``p`` (``0 .. length - 1`` plus the preset's offset); >= 3.
        offset: the shift ``k``.
        column: the channel to predict; by default the first channel of the
            pair whose step ``k omega`` is nearest one radian (the seed's
            ``PE_even(p, 64)`` for ``d = 512, k = 10``).
        preset: a preset name or :class:`~posenc.Sinusoid`; ``**overrides`` as
            in :func:`posenc.sinusoidal`.

    Returns:
        A :class:`Regression`.

    Raises:
        ValueError: ``column`` out of range, a zero channel or a lone channel;
            a column constant over the positions.
    """
    spec = resolve(preset, **overrides)
    slots = spec.slots(dim)
    length = _check_length(length, minimum=3)
    (k,) = _check_offsets(offset)
    if column is None:
        column = _default_column(spec, dim, k)
    if isinstance(column, bool) or not isinstance(column, (int, np.integer)):
        raise TypeError(f"column must be an int channel index; got {type(column).__name__}")
    if not 0 <= column < dim:
        raise ValueError(f"column must be a channel index in [0, {dim}); got {column}")
    first, second = slots.indices()
    pairs = slots.n_second
    if column in first[:pairs]:
        j = int(np.flatnonzero(first == column)[0])
        partner, is_first = int(second[j]), True
    elif column in second:
        j = int(np.flatnonzero(second == column)[0])
        partner, is_first = int(first[j]), False
    else:
        raise ValueError(
            f"column {column} has no (sin, cos) partner (a zero or lone channel) for dim={dim}"
        )
    omega = float(spec.inv_freq(dim)[j])
    x = _table64(length, dim, spec)
    y = _shifted64(length, k, dim, spec)[:, column]
    ones = np.ones(length)
    single_r2, _, _ = _r2(np.stack([ones, x[:, column]], axis=1), y)
    pair_r2, coef, pair_tolerance = _r2(np.stack([ones, x[:, column], x[:, partner]], axis=1), y)
    s, c = sincos_numpy(np.array([k]), spec.turns(dim))
    sin_k, cos_k = float(s[0, j]), float(c[0, j])
    # u = first member, v = second: for sin_cos u(p+k) = c u + s v, v(p+k) = c v - s u;
    # cos_sin swaps which member is the sine, so the signs swap too
    sign = 1.0 if (spec.order == "sin_cos") == is_first else -1.0
    return Regression(
        dim=dim,
        length=length,
        offset=k,
        column=int(column),
        partner=partner,
        omega=omega,
        single_r2=single_r2,
        single_r2_limit=cos_k**2,
        pair_r2=pair_r2,
        pair_tolerance=pair_tolerance,
        pair_coef=(float(coef[0]), float(coef[1]), float(coef[2])),
        expected_coef=(0.0, cos_k, sign * sin_k),
    )


def _naive_float32(p: float, spec: Sinusoid, slots: Slots) -> tuple[Any, Any]:
    """The usual float32 formula at one position: float32 omega times float32 position.

    The frequencies are the exact ones rounded once to float32 (the best a
    float32 formula can start from; code that computes them with ``exp`` in
    float32 adds its own error), so the error shown is the product's.
    """
    omega32 = spec.inv_freq(slots.dim).astype(np.float32)
    angle = np.float32(p + spec.offset) * omega32  # rounded to float32: the error source
    first, second = (np.sin(angle), np.cos(angle))
    if spec.order == "cos_sin":
        first, second = second, first
    amp = np.float32(spec.amplitude_for(slots.dim))
    row = np.zeros(slots.dim, dtype=np.float32)
    row[slots.first] = amp * first[: slots.n_first]
    row[slots.second] = amp * second[: slots.n_second]
    return row, angle


def precision_report(
    positions: Sequence[float] = (1e4, 1e6, 1e7),
    dim: int = 512,
    *,
    preset: str | Sinusoid = "vaswani",
    **overrides: Any,
) -> PrecisionReport:
    """Measure float32 errors at large positions: posenc and the usual float32 formula.

    The usual formula rounds ``p * omega`` to 24 bits, so its angle is off by
    about ``|p omega| * 2**-24``: 6e-4 at ``p = 1e4``, 6e-2 at ``1e6`` and
    0.7 at ``1e7`` (a wrong value, not a rounded one). posenc reduces the
    angle exactly and rounds the result once.

    Args:
        positions: positions to measure (each ``|p + offset| < 2**31``).
        dim: channels.
        preset: a preset name or :class:`~posenc.Sinusoid`; ``**overrides`` as
            in :func:`posenc.sinusoidal`.

    Returns:
        A :class:`PrecisionReport`; the truth is posenc's float64 value (exact
        to about 1e-15; checked against mpmath in the tests).
    """
    spec = resolve(preset, **overrides)
    slots = spec.slots(dim)
    ps = _check_offsets(positions)
    omega = spec.inv_freq(dim)
    points = []
    for p in ps:
        at = np.array([p], dtype=np.float64)
        exact = _table64(at, dim, spec)[0]
        ours = sinusoidal(at, dim, preset=spec, dtype="float32")[0].astype(np.float64)
        naive, angle32 = _naive_float32(p, spec, slots)
        angle = (p + spec.offset) * omega  # float64: good to ~1e-16 relative, plenty here
        points.append(
            PrecisionPoint(
                position=p,
                max_angle=float(np.max(np.abs(angle))),
                posenc_error=float(np.max(np.abs(ours - exact))),
                naive_error=float(np.max(np.abs(naive.astype(np.float64) - exact))),
                naive_angle_error=float(np.max(np.abs(angle32.astype(np.float64) - angle))),
            )
        )
    # rounding |v| <= a to float32 errs by half an ulp, at most |v| 2**-24 <= a 2**-24;
    # the float64 value it rounds is exact to a few ulps more
    amp = abs(spec.amplitude_for(dim))
    return PrecisionReport(dim, tuple(points), amp * (2.0**-24 + _TABLE_ULPS * EPS))
