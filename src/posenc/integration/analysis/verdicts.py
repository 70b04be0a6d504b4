"""The verdicts of ``posenc check``: each measured property against its bound, PASS or FAIL.

:func:`check` measures the properties of one sinusoidal encoding with
:mod:`posenc.analysis.sinusoidal` and :mod:`posenc.analysis.precision` and decides
each one here; the
command only prints the rows. A property that does not apply (a lone channel
has no constant norm) or that the positions cannot show (every column nearly
straight over a few positions) is a row with ``passed=None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from posenc.core import checks
from posenc.core.angles import EXACT_LIMIT
from posenc.families.absolute.sinusoidal import Sinusoid, resolve
from posenc.integration.analysis.precision import precision_report
from posenc.integration.analysis.sinusoidal import (
    norms,
    offset_dot_products,
    regression_r2,
    shift_error,
)

#: the shifts ``k`` of the shift and dot-product checks
OFFSETS = (1, 10, 100)
#: the shift of the regression check: one sine column at ``p + 10`` from the same column at ``p``
REGRESSION_OFFSET = 10
#: a fit with ``R^2`` below this is no linear relation; a single column scores about
#: ``cos(k omega)**2`` over many periods (0.29 for the default column), an exact
#: relation ``1 - 1e-28``; a slow column over a few positions is almost straight and
#: scores near 1 although the table is right, so the check picks a column that bends
NOT_LINEAR_R2 = 0.99
#: large positions where the usual float32 formula errs by about 6e-4, 6e-2 and 0.7
PRECISION_POSITIONS = (1e4, 1e6, 1e7)


@dataclass(frozen=True)
class Verdict:
    """One line of ``posenc check``.

    Attributes:
        claim: what is checked, e.g. ``"shift: PE(p+1) = PE(p) @ M(1).T"``.
        measured: the measured value, as printed.
        bound: the expectation it is held to, as printed (``"-"`` if skipped).
        passed: whether the measured value meets the bound; None when the
            property does not apply to this encoding or cannot be seen at these
            sizes (the reason is in ``measured``).
    """

    claim: str
    measured: str
    bound: str
    passed: bool | None


def check(
    dim: int = 512,
    length: int = 50,
    *,
    preset: str | Sinusoid = "vaswani",
    **overrides: Any,
) -> list[Verdict]:
    """Measure every property ``posenc check`` shows and decide each against its bound.

    The rows, in order: the shift matrix reproduces ``PE(p + k)`` for each
    ``k`` of :data:`OFFSETS`; every row has norm ``amplitude * sqrt(pairs)``;
    ``PE(p) . PE(p + k)`` equals its closed form for every ``p``; one sine
    column at ``p + 10`` regressed on the same column at ``p`` is no linear
    fit (``R^2 <`` :data:`NOT_LINEAR_R2`) while its (sin, cos) pair is one (up
    to rounding), on a column that bends over the positions (skipped when
    none does, e.g. ``--override scale=0.001`` at ``d = 4``); posenc's float32
    values are within half an ulp at each of
    :data:`PRECISION_POSITIONS` in range. Bounds are those of
    :func:`shift_error`, :func:`norms`, :func:`offset_dot_products`,
    :func:`regression_r2` and :func:`precision_report`.

    Args:
        dim: channels.
        length: positions ``0 .. length - 1`` (plus the preset's offset).
        preset: a preset name or :class:`~posenc.Sinusoid`; ``**overrides`` as
            in :func:`posenc.sinusoidal`.

    Returns:
        One :class:`Verdict` per line.

    Raises:
        ValueError: an unknown preset or override, or a ``dim`` the preset
            cannot lay out; ``length`` below 1.
        TypeError: ``dim`` or ``length`` not an int.

    Examples:
        >>> import posenc.analysis
        >>> rows = posenc.analysis.check(dim=16, length=32)
        >>> len(rows), all(row.passed for row in rows)
        (12, True)
        >>> rows[0].claim, rows[0].bound
        ('shift: PE(p+1) = PE(p) @ M(1).T', '<= 4.44e-15')
        >>> rows[-1].claim
        'float32 at p=1e+07: posenc (naive float32 formula)'
    """
    spec = resolve(preset, **overrides)
    slots = spec.slots(dim)
    length = checks.check_int(length, "length", minimum=1)
    rows: list[Verdict] = []
    if slots.n_first != slots.n_second:
        why = f"lone channel (dim {dim}, odd={spec.odd!r})"
        for name in ("shift property", "row norm", "offset-only dot product"):
            rows.append(Verdict(name, why, "-", None))
    else:
        shift = shift_error(dim, length, OFFSETS, preset=spec)
        for k, err in zip(shift.offsets, shift.max_error, strict=True):
            rows.append(
                Verdict(
                    f"shift: PE(p+{k:g}) = PE(p) @ M({k:g}).T",
                    f"max err {err:.2e}",
                    f"<= {shift.tolerance:.2e}",
                    err <= shift.tolerance,
                )
            )
        nrm = norms(dim, length, preset=spec)
        rows.append(
            Verdict(
                f"row norm = {nrm.expected:.6g} (a sqrt(pairs), {nrm.pairs} pairs)",
                f"max dev {nrm.max_deviation:.2e}",
                f"<= {nrm.tolerance:.2e}",
                nrm.ok,
            )
        )
        dots = offset_dot_products(dim, length, OFFSETS, preset=spec)
        for k, exact, spread, dev in zip(
            dots.offsets, dots.closed_form, dots.spread, dots.max_deviation, strict=True
        ):
            rows.append(
                Verdict(
                    f"PE(p).PE(p+{k:g}) = sum cos({k:g} w) = {exact:.6g} for all p",
                    f"spread {spread:.1e}, dev {dev:.1e}",
                    f"<= {dots.tolerance:.2e}",
                    max(spread, dev) <= dots.tolerance,
                )
            )
    if slots.n_second and length >= 3:
        rows += _regression_rows(spec, dim, length, REGRESSION_OFFSET)
    else:
        rows.append(
            Verdict("regression: one column vs the pair", "needs a pair and length >= 3", "-", None)
        )
    positions = [p for p in PRECISION_POSITIONS if abs(p + spec.offset) < EXACT_LIMIT]
    report = precision_report(positions, dim, preset=spec)
    for pt in report.points:
        rows.append(
            Verdict(
                f"float32 at p={pt.position:.0e}: posenc (naive float32 formula)",
                f"{pt.posenc_error:.1e} ({pt.naive_error:.1e})",
                f"<= {report.tolerance:.1e}",
                pt.posenc_error <= report.tolerance,
            )
        )
    return rows


def _exact_single_r2(spec: Sinusoid, dim: int, length: int, k: float) -> Any:
    """Per pair, the ``R^2`` of an exact table's first column at ``p + k`` regressed on itself.

    The textbook formula in float64 numpy (not posenc's angle engine): the
    squared correlation of ``sin(w p + phase)`` and ``sin(w (p + k) + phase)``
    over the positions checked. ``cos(k w)**2`` over many periods, but near 1
    when ``w`` is so slow that the column is almost straight over these
    positions. A column constant over them scores 1 (it cannot show anything).
    """
    pairs = spec.slots(dim).n_second
    omega = spec.inv_freq(dim)[:pairs]
    phase = 0.0 if spec.order == "sin_cos" else np.pi / 2  # cos_sin puts the cosine first
    p = np.arange(length, dtype=np.float64)[:, None] + spec.offset
    x, y = np.sin(p * omega + phase), np.sin((p + k) * omega + phase)
    x, y = x - x.mean(axis=0), y - y.mean(axis=0)
    sxx, syy, sxy = (x * x).sum(axis=0), (y * y).sum(axis=0), (x * y).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = sxy**2 / (sxx * syy)
    return np.where(np.isfinite(r2), np.minimum(r2, 1.0), 1.0)


def _regression_rows(spec: Sinusoid, dim: int, length: int, k: float) -> list[Verdict]:
    """The one-column and the pair rows of the regression.

    The one-column claim ("not linear") can only be seen on a column that
    bends over the positions checked. The regression's default column (step
    ``k w`` nearest one radian) is kept when an exact table scores below
    :data:`NOT_LINEAR_R2` on it; otherwise (a few channels or a few positions)
    the column with the lowest exact score is used; when even that one is
    almost straight, the row is skipped with the exact score as the reason.
    The column is chosen from the formula, never from the table under test.
    """
    first, _ = spec.slots(dim).indices()
    exact = _exact_single_r2(spec, dim, length, k)
    reg = regression_r2(dim, length, k, preset=spec)
    score = exact[int(np.flatnonzero(first == reg.column)[0])]
    if score >= NOT_LINEAR_R2 > exact.min():
        best = int(np.argmin(exact))
        reg = regression_r2(dim, length, k, int(first[best]), preset=spec)
        score = exact[best]
    claim = f"one column (ch {reg.column}) at p+{k:g} from itself: not linear"
    if score < NOT_LINEAR_R2:
        single = Verdict(
            claim,
            f"R^2 {reg.single_r2:.3f} (limit {reg.single_r2_limit:.3f})",
            f"< {NOT_LINEAR_R2:g}",
            reg.single_r2 < NOT_LINEAR_R2,
        )
    else:
        why = f"no column bends over {length} positions (exact R^2 >= {float(exact.min()):.3f})"
        single = Verdict(claim, why, "-", None)
    pair = Verdict(
        f"the pair (ch {reg.column}, {reg.partner}) at p+{k:g}: linear",
        f"1 - R^2 {1.0 - reg.pair_r2:.1e}",
        f"<= {reg.pair_tolerance:.1e}",
        1.0 - reg.pair_r2 <= reg.pair_tolerance,
    )
    return [single, pair]
