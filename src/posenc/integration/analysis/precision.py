"""Precision of sinusoidal tables: float32 at large positions, and the two forms of the frequencies.

- :func:`precision_report`: the error of posenc's float32 output and of the
  usual float32 formula (float32 frequencies times float32 positions) at large
  positions, with the bound posenc must meet.
- :func:`precision_curves`: the same errors against position, with the usual
  formula in float32 and in bfloat16 (as under autocast); needs torch.
- :func:`exp_log_forms`: the frequencies written as a power and as ``exp`` of
  a log, their error against mpmath and their speed; needs mpmath.
- :func:`exp_log_errors`: the same two forms pair by pair in float32, and the
  ``h - 1`` denominator some code uses next to the paper's; needs mpmath.
"""

from __future__ import annotations

import math
import timeit
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from posenc.core import checks
from posenc.families.absolute.sinusoidal import Sinusoid, Slots, resolve, sinusoidal
from posenc.integration.analysis._table import EPS, TABLE_ULPS, real_values, table64


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

    Examples:
        >>> import posenc.analysis
        >>> report = posenc.analysis.precision_report((1e4, 1e6), dim=16)
        >>> report.ok, f"{report.tolerance:.1e}"
        (True, '6.0e-08')
        >>> [f"{pt.naive_error:.0e}" for pt in report.points]  # the usual float32 formula
        ['7e-05', '2e-02']
    """
    spec = resolve(preset, **overrides)
    slots = spec.slots(dim)
    ps = real_values(positions, "positions")
    omega = spec.inv_freq(dim)
    points = []
    for p in ps:
        at = np.array([p], dtype=np.float64)
        exact = table64(at, dim, spec)[0]
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
    return PrecisionReport(dim, tuple(points), amp * (2.0**-24 + TABLE_ULPS * EPS))


def precision_curves(
    dim: int = 512, preset: str = "vaswani", points: Sequence[float] | None = None
) -> dict[str, Any]:
    """Errors of one row against position: posenc float32, naive float32, naive bfloat16.

    The naive formulas multiply a float32 (or bfloat16) position by float32 (or
    bfloat16) frequencies, as code under autocast does; errors are measured
    against posenc's float64 values (exact to a few 1e-16). Needs torch.

    Args:
        dim: channels.
        preset: a sinusoidal preset name.
        points: the positions; ``10, 100, ..., 1e7`` by default.

    Returns:
        ``"position"``: the positions; ``"posenc float32"``, ``"naive float32"``
        and ``"naive bfloat16"``: per position, the largest error over the row.

    Examples:
        >>> import posenc.analysis
        >>> curves = posenc.analysis.precision_curves(dim=16, points=[1e3, 1e6])
        >>> list(curves)
        ['position', 'posenc float32', 'naive float32', 'naive bfloat16']
        >>> [f"{e:.0e}" for e in curves["naive float32"]]
        ['1e-05', '2e-02']
        >>> bool(curves["posenc float32"].max() < 6e-8)  # within half a float32 ulp
        True
    """
    import torch

    positions = np.asarray(points if points is not None else 10.0 ** np.arange(1, 8))
    spec = resolve(preset)
    slots = spec.slots(dim)
    omega = spec.inv_freq(dim)
    exact = sinusoidal(positions, dim, preset=preset, dtype="float64")
    ours = sinusoidal(positions, dim, preset=preset, dtype="float32").astype(np.float64)
    curves: dict[str, Any] = {"position": positions}
    curves["posenc float32"] = np.abs(ours - exact).max(axis=1)
    for name, dtype in (("naive float32", torch.float32), ("naive bfloat16", torch.bfloat16)):
        p = torch.tensor(positions).to(dtype)[:, None]
        ang = (p * torch.tensor(omega).to(dtype)).float()
        naive = np.zeros_like(exact)
        naive[:, slots.first] = torch.sin(ang).to(dtype).double().numpy()[:, : slots.n_first]
        naive[:, slots.second] = torch.cos(ang).to(dtype).double().numpy()[:, : slots.n_second]
        curves[name] = np.abs(naive - exact).max(axis=1)
    return curves


def _power_form(k: Any, dim: int, base: float, dtype: Any) -> Any:
    """``1 / base ** (k / d)`` in ``dtype``: the paper's formula, ``k = 2i`` the even channel."""
    return dtype(1.0) / np.power(dtype(base), k / dtype(dim))


def _exp_log_form(k: Any, dim: int, base: float, dtype: Any) -> Any:
    """``exp(k * -(ln base / d))`` in ``dtype``: the constant rounded once, then one multiply.

    As tensor2tensor and the PyTorch tutorial write it:
    ``torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))``.
    """
    return np.exp(k * dtype(-math.log(base) / dim))


def exp_log_forms(dim: int, base: float = 10000.0) -> dict[str, Any]:
    """The two ways code writes the frequencies, their error against mpmath and their speed.

    ``1 / base ** (2i / d)`` (the paper's formula) and ``exp(2i * -(ln base / d))``
    (tensor2tensor's, copied by most code): the same function; the log form
    turns the power into one multiply per channel plus one ``exp``. Needs mpmath.

    Returns:
        ``"power float32"``, ``"exp-log float32"``, ``"power float64"`` and
        ``"exp-log float64"``: each ``(max relative error against 40-digit
        mpmath, seconds per call on this machine)``.

    Examples:
        >>> import posenc.analysis
        >>> forms = posenc.analysis.exp_log_forms(16)
        >>> sorted(forms)
        ['exp-log float32', 'exp-log float64', 'power float32', 'power float64']
        >>> error, seconds = forms["exp-log float32"]
        >>> 1e-8 < error < 1e-6, forms["exp-log float64"][0] < 1e-14
        (True, True)
    """
    import mpmath

    i2 = np.arange(0, dim - dim % 2, 2)
    with mpmath.workdps(40):
        exact = np.array(
            [float(mpmath.power(mpmath.mpf(base), -mpmath.mpf(int(k)) / dim)) for k in i2]
        )
    out: dict[str, Any] = {}
    for dtype in (np.float32, np.float64):
        k = i2.astype(dtype)

        def power(k: Any = k, dtype: Any = dtype) -> Any:
            return _power_form(k, dim, base, dtype)

        def logform(k: Any = k, dtype: Any = dtype) -> Any:
            return _exp_log_form(k, dim, base, dtype)

        name = np.dtype(dtype).name
        for label, fn in (("power", power), ("exp-log", logform)):
            rel = np.max(np.abs(fn().astype(np.float64) - exact) / exact)
            runs = timeit.repeat(fn, number=200, repeat=5)
            out[f"{label} {name}"] = (float(rel), min(runs) / 200)
    return out


#: float32 unit roundoff: rounding to float32 errs by at most this, relative.
UNIT32 = 2.0**-24


@dataclass(frozen=True)
class ExpLogErrors:
    """The frequencies pair by pair: two float32 forms against mpmath, and two denominators.

    Attributes:
        dim: channels ``d``.
        base: the base (10000 in the paper).
        pair: the pair indices ``i = 0 .. d // 2 - 1``.
        exact: ``base ** (-2i / d)``, from 40-digit mpmath rounded to float64.
        power_error: per pair, ``|fl32 - exact| / exact`` of the float32 power
            form ``1 / base ** (2i / d)``.
        exp_log_error: the same for the float32 exp-log form
            ``exp(2i * -(ln base / d))``.
        unit: ``2**-24``, the float32 unit roundoff, the scale of both errors.
        paper: the paper's schedule ``base ** (-2i / d)``, which is
            ``exp(-i ln(base) / h)`` with ``h = d / 2`` for even ``d`` (the
            values of ``exact``), float64.
        variant: the ``h - 1`` denominator schedule ``exp(-i ln(base) / (h - 1))``
            (``max(h - 1, 1)``, as tensor2tensor guards it), float64 from mpmath.
    """

    dim: int
    base: float
    pair: Any
    exact: Any
    power_error: Any
    exp_log_error: Any
    unit: float
    paper: Any
    variant: Any


def exp_log_errors(dim: int, base: float = 10000.0) -> ExpLogErrors:
    """Per-pair float32 errors of the power and exp-log frequency forms, and the two denominators.

    Vaswani et al. 2017 (section 3.5) write ``omega_i = 1 / 10000 ** (2i / d)``;
    tensor2tensor's ``get_timing_signal_1d``, the PyTorch tutorial and the
    Annotated Transformer compute ``exp(2i * -(ln 10000 / d))``: the constant
    ``ln(base) / d`` is rounded once and multiplied by ``2i``, so its rounding
    grows with the pair index, up to about ``ln(base)`` units of ``2**-24``.
    tensor2tensor, fairseq, the original DDPM code and the Annotated Diffusion
    Model divide by ``h - 1`` instead of ``h = d / 2``
    (``exp(-i ln(base) / (h - 1))``), so their last pair reaches exactly
    ``1 / base``; the paper's stops at ``base ** (-(d - 2) / d)``. Needs mpmath.

    Args:
        dim: channels; at least 2 (one pair).
        base: the base, > 0.

    Returns:
        An :class:`ExpLogErrors`; errors are computed in 40-digit mpmath from
        the float32 values.

    Raises:
        TypeError: ``dim`` not an int, ``base`` not a real number.
        ValueError: ``dim`` below 2 or too large, ``base`` not finite and positive.

    Examples:
        >>> import posenc.analysis
        >>> errors = posenc.analysis.exp_log_errors(8)
        >>> errors.pair, errors.paper
        (array([0, 1, 2, 3]), array([1.   , 0.1  , 0.01 , 0.001]))
        >>> float(errors.variant[-1])  # the h - 1 denominator reaches 1 / base
        0.0001
        >>> bool(errors.exp_log_error.max() < 10 * errors.unit)
        True
    """
    import mpmath

    dim = checks.check_channels(dim, "dim", minimum=2)
    base = checks.check_number(base, "base", positive=True)
    h = dim // 2
    pair = np.arange(h)
    k32 = (2 * pair).astype(np.float32)
    forms = {
        "power": _power_form(k32, dim, base, np.float32),
        "exp-log": _exp_log_form(k32, dim, base, np.float32),
    }
    errors: dict[str, Any] = {}
    with mpmath.workdps(40):
        b = mpmath.mpf(base)
        exact_mp = [mpmath.power(b, -mpmath.mpf(2 * int(i)) / dim) for i in pair]
        variant = [mpmath.power(b, -mpmath.mpf(int(i)) / max(h - 1, 1)) for i in pair]
        for name, values in forms.items():
            errors[name] = np.array(
                [
                    float(abs(mpmath.mpf(float(v)) - e) / e)
                    for v, e in zip(values, exact_mp, strict=True)
                ]
            )
        exact = np.array([float(e) for e in exact_mp])
        variant_f = np.array([float(e) for e in variant])
    return ExpLogErrors(
        dim=dim,
        base=base,
        pair=pair,
        exact=exact,
        power_error=errors["power"],
        exp_log_error=errors["exp-log"],
        unit=UNIT32,
        paper=exact.copy(),
        variant=variant_f,
    )
