"""The verdicts of ``posenc check``: each measured property against its bound, PASS or FAIL.

:func:`check` measures the properties of one sinusoidal encoding with
:mod:`.sinusoidal` and :mod:`.precision` and decides each one here; the
command only prints the rows. A property that does not apply (a lone channel
has no constant norm) is a row with ``passed=None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

__all__ = ["Verdict", "check"]

#: the shifts ``k`` of the shift and dot-product checks
OFFSETS = (1, 10, 100)
#: the shift of the regression check: one sine column at ``p + 10`` from the same column at ``p``
REGRESSION_OFFSET = 10
#: a fit with ``R^2`` below this is no linear relation; a single column scores about
#: ``cos(k omega)**2`` (0.29 for the default column), an exact relation ``1 - 1e-28``
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
            property does not apply to this encoding (the reason is in ``measured``).
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
    to rounding); posenc's float32 values are within half an ulp at each of
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
        k = REGRESSION_OFFSET
        reg = regression_r2(dim, length, k, preset=spec)
        rows.append(
            Verdict(
                f"one column (ch {reg.column}) at p+{k:g} from itself: not linear",
                f"R^2 {reg.single_r2:.3f} (limit {reg.single_r2_limit:.3f})",
                f"< {NOT_LINEAR_R2:g}",
                reg.single_r2 < NOT_LINEAR_R2,
            )
        )
        rows.append(
            Verdict(
                f"the pair (ch {reg.column}, {reg.partner}) at p+{k:g}: linear",
                f"1 - R^2 {1.0 - reg.pair_r2:.1e}",
                f"<= {reg.pair_tolerance:.1e}",
                1.0 - reg.pair_r2 <= reg.pair_tolerance,
            )
        )
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
