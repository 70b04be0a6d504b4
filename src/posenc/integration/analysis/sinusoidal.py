"""Measured properties of a sinusoidal table: shift, norms, dot products, regression, geometry.

Each property is measured on a float64 table and returned as a small frozen
dataclass of numbers, with the bound it must meet derived from float64
rounding (``EPS = 2**-52``).

- :func:`shift_error`: ``PE(p + k) == PE(p) @ M(k).T`` (Vaswani et al. 2017,
  section 3.5, "a linear function of PE(pos)"), with ``M`` from
  :func:`posenc.shift_matrix`.
- :func:`norms`: every row has norm ``amplitude * sqrt(pairs)``, i.e.
  ``sqrt(d / 2)`` for the paper's encoding (each (sin, cos) pair lies on the
  unit circle).
- :func:`offset_dot_products`: ``PE(p) . PE(p + k) = amplitude**2 * sum_j
  cos(k omega_j)`` depends on the offset ``k`` only, not on ``p``.
- :func:`regression_r2`: one sine column at ``p + k`` regressed on the same
  column at ``p`` finds no fit: a single column is not a linear function of
  itself shifted, the (sin, cos) pair is.
- :func:`geometry`: the nearest distinct positions, and how well a position
  survives being added to a token embedding.
- :func:`permutation_check`: self-attention without positions only reorders
  its output when its input is reordered; with positions added it does not.
- :func:`add_concat`: a position added to a token embedding at the paper's
  scale (``sqrt(d)``, section 3.4) and without it, and concatenated instead.

Notation: ``d`` channels, ``K`` frequency pairs, ``p`` position, ``k`` offset,
``omega_j`` the angular frequency of pair ``j``. Tables are ``(length, d)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.core.angles import sincos_numpy
from posenc.families.absolute.sinusoidal import Sinusoid, resolve, shift_matrix, sinusoidal
from posenc.integration.analysis._table import (
    EPS,
    paired_slots,
    real_values,
    shifted64,
    table64,
)


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

    Examples:
        >>> import posenc.analysis
        >>> err = posenc.analysis.shift_error(16, 32, offsets=(1, 5))
        >>> err.offsets, err.ok
        ((1.0, 5.0), True)
        >>> max(err.max_error) <= err.tolerance < 1e-14
        True
    """
    spec = resolve(preset, **overrides)
    paired_slots(spec, dim, "the shift property")
    length = checks.check_int(length, "length", minimum=1)
    ks = real_values(offsets, "offsets")
    base = table64(length, dim, spec)
    errors = []
    for k in ks:
        predicted = base @ shift_matrix(k, dim, preset=spec).T
        errors.append(float(np.max(np.abs(shifted64(length, k, dim, spec) - predicted))))
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

    Examples:
        >>> import posenc.analysis
        >>> n = posenc.analysis.norms(16, 32)
        >>> n.pairs, round(n.expected, 4), n.ok  # sqrt(16 / 2)
        (8, 2.8284, True)
    """
    spec = resolve(preset, **overrides)
    slots = paired_slots(spec, dim, "a constant row norm")
    length = checks.check_int(length, "length", minimum=1)
    table = table64(length, dim, spec)
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

    Examples:
        >>> import posenc.analysis
        >>> dots = posenc.analysis.offset_dot_products(16, 32, offsets=(1, 5))
        >>> [round(c, 4) for c in dots.closed_form], dots.ok
        ([7.4852, 6.137], True)
    """
    spec = resolve(preset, **overrides)
    slots = paired_slots(spec, dim, "offset-only dot products")
    length = checks.check_int(length, "length", minimum=1)
    ks = real_values(offsets, "offsets")
    base = table64(length, dim, spec)
    amp2 = spec.amplitude_for(dim) ** 2
    pairs = slots.n_second
    _, cos_k = sincos_numpy(np.array(ks), spec.turns(dim))
    closed, spread, deviation = [], [], []
    for i, k in enumerate(ks):
        dots = np.einsum("ij,ij->i", base, shifted64(length, k, dim, spec))
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

    There ``cos(k w)**2`` is about 0.29, far from 1. For ``d = 512, k = 10`` it
    is channel 128, ``sin(p / 10000**(128 / 512))`` (``omega = 0.1``).
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

    The experiment of a user reading section 3.5 of Vaswani et al. 2017
    ("PE(pos + k) is a linear function of PE(pos)"): regress ``sin(w (p + k))``
    on ``sin(w p)`` with an intercept, over many ``p``. It fails
    (``R^2 ~ cos(k w)**2``), because
    ``sin(w (p + k)) = cos(k w) sin(w p) + sin(k w) cos(w p)`` needs the cosine
    column as well: with the (sin, cos) pair the fit is exact. numpy
    ``lstsq`` on float64 values.

    Args:
        dim: channels.
        length: positions ``p`` (``0 .. length - 1`` plus the preset's offset); >= 3.
        offset: the shift ``k``.
        column: the channel to predict; by default the first channel of the
            pair whose step ``k omega`` is nearest one radian (channel 128,
            ``sin(p / 10000**(128 / 512))``, for ``d = 512, k = 10``).
        preset: a preset name or :class:`~posenc.Sinusoid`; ``**overrides`` as
            in :func:`posenc.sinusoidal`.

    Returns:
        A :class:`Regression`.

    Raises:
        ValueError: ``column`` out of range, a zero channel or a lone channel;
            a column constant over the positions.

    Examples:
        >>> import posenc.analysis
        >>> fit = posenc.analysis.regression_r2(16, 200, offset=10)
        >>> fit.column, fit.partner
        (4, 5)
        >>> round(fit.single_r2, 2), round(fit.single_r2_limit, 2)  # one column: no line
        (0.31, 0.29)
        >>> 1 - fit.pair_r2 <= fit.pair_tolerance  # the (sin, cos) pair: exact
        True
    """
    spec = resolve(preset, **overrides)
    slots = spec.slots(dim)
    length = checks.check_int(length, "length", minimum=3)
    (k,) = real_values(offset, "offset")
    if column is None:
        column = _default_column(spec, dim, k)
    column = checks.check_int(column, "column")
    if column >= dim:
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
    x = table64(length, dim, spec)
    y = shifted64(length, k, dim, spec)[:, column]
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
        column=column,
        partner=partner,
        omega=omega,
        single_r2=single_r2,
        single_r2_limit=cos_k**2,
        pair_r2=pair_r2,
        pair_tolerance=pair_tolerance,
        pair_coef=(float(coef[0]), float(coef[1]), float(coef[2])),
        expected_coef=(0.0, cos_k, sign * sin_k),
    )


def geometry(dim: int, length: int, preset: str, seed: int = 0) -> dict[str, Any]:
    """Nearest distinct positions, and how well a position survives being added to a token.

    Args:
        dim: channels.
        length: positions of the first table.
        preset: a sinusoidal preset name.
        seed: seed of the random token embeddings.

    Returns:
        ``"first"`` and ``"2000"``: ``(distance, i, j)`` of the two nearest
        distinct rows among the first ``length`` and the first 2000 positions;
        ``"float32 distinct"``: whether the first 2000 float32 rows are all
        different; ``"recovery"``: for token entries of standard deviation
        0.1, 0.5, 1 and 2, the fraction of positions read back (the
        best-matching row) after adding a random token to each row.

    Examples:
        >>> import posenc.analysis
        >>> geo = posenc.analysis.geometry(16, 32, "vaswani")
        >>> round(geo["first"][0], 3), geo["first"][1:]  # the nearest rows, and which
        (1.015, (8, 9))
        >>> geo["float32 distinct"], geo["recovery"][0.1], geo["recovery"][2.0] < 0.5
        (True, 1.0, True)
    """
    t = sinusoidal(length, dim, preset=preset, dtype="float64")
    far = sinusoidal(2000, dim, preset=preset, dtype="float64")
    out: dict[str, Any] = {}
    for name, table in (("first", t), ("2000", far)):
        sq = (table**2).sum(1)
        d2 = sq[:, None] + sq[None, :] - 2 * table @ table.T
        np.fill_diagonal(d2, np.inf)
        i, j = np.unravel_index(np.argmin(d2), d2.shape)
        out[name] = (float(math.sqrt(max(d2[i, j], 0.0))), int(i), int(j))
    t32 = sinusoidal(2000, dim, preset=preset, dtype="float32")
    out["float32 distinct"] = len({row.tobytes() for row in t32}) == len(t32)
    rng = np.random.default_rng(seed)
    recovery = {}
    for sigma in (0.1, 0.5, 1.0, 2.0):
        recovery[sigma] = _position_recovery(t, rng.normal(0, sigma, size=(100, dim)))
    out["recovery"] = recovery
    return out


def _position_recovery(table: Any, tokens: Any) -> float:
    """The fraction of (token, position) sums whose best-matching table row is their position.

    The match is the largest dot product ``(token + PE(p)) . PE(q)`` over
    ``q``: every row has the same norm, so this is also the nearest row. The
    dot product is expanded as ``token . PE(q) + PE(p) . PE(q)``, so no
    ``(tokens, positions, d)`` array is formed.
    """
    scores = (tokens @ table.T)[:, None, :] + (table @ table.T)[None, :, :]
    guess = np.argmax(scores, axis=-1)  # (tokens, positions)
    return float((guess == np.arange(len(table))[None, :]).mean())


def _token_recovery(table: Any, tokens: Any) -> float:
    """The fraction of (token, position) sums whose nearest token embedding is their token.

    Nearest in Euclidean distance: ``argmax_u x . e_u - |e_u|**2 / 2`` with
    ``x = e_v + PE(p)``, expanded as ``e_v . e_u + PE(p) . e_u - |e_u|**2 / 2``.
    """
    half = 0.5 * np.einsum("ij,ij->i", tokens, tokens)
    scores = (tokens @ tokens.T)[:, None, :] + (table @ tokens.T)[None, :, :] - half
    guess = np.argmax(scores, axis=-1)  # (tokens, positions)
    return float((guess == np.arange(len(tokens))[:, None]).mean())


# ------------------------------------------------------------------ permutation


@dataclass(frozen=True)
class PermutationCheck:
    """One self-attention layer on tokens and on the same tokens reordered, without and with PE.

    Attributes:
        dim: channels.
        tokens: tokens in the sequence.
        seed: seed of the token embeddings and the weights.
        permutation: ``perm``; the reordered sequence is ``X[perm]`` (row ``r``
            holds token ``perm[r]``), never the identity.
        output: ``attn(X)``, ``(tokens, dim)`` float64.
        permuted_output: ``attn(X[perm])``.
        max_difference: ``max |attn(X[perm]) - attn(X)[perm]|``: zero in exact
            arithmetic (attention without positions is permutation-equivariant).
        bound: the float64 rounding bound ``max_difference`` must meet (see
            :func:`permutation_check`).
        positioned_output: ``attn(X + PE)``: the sinusoidal table added in order.
        positioned_permuted_output: ``attn(X[perm] + PE)``: tokens reordered,
            positions still ``0, 1, 2, ...``.
        with_positions: ``max |attn(X[perm] + PE) - attn(X + PE)[perm]|``: of
            the order of the outputs themselves, far above ``bound``.
    """

    dim: int
    tokens: int
    seed: int
    permutation: tuple[int, ...]
    output: Any
    permuted_output: Any
    max_difference: float
    bound: float
    positioned_output: Any
    positioned_permuted_output: Any
    with_positions: float

    @property
    def ok(self) -> bool:
        """Whether attention without positions is equivariant up to rounding."""
        return self.max_difference <= self.bound


def _gamma(n: int) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``, ``u = EPS / 2``: the bound of ``n`` roundings."""
    u = EPS / 2
    return n * u / (1 - n * u)


def _attention(x: Any, wq: Any, wk: Any, wv: Any) -> tuple[Any, Any]:
    """``softmax(Q K^T / sqrt(d)) V`` in float64, and an entrywise bound on its rounding error.

    The bound follows each step (Higham, *Accuracy and Stability of Numerical
    Algorithms*, 3.5): a length-``n`` dot product errs by ``gamma_n`` times
    the dot product of the absolute values; errors in the inputs of a product
    add ``|dA| |B| + |A| |dB| + |dA| |dB|``. A softmax row whose scores move
    by at most ``D`` changes each weight by a factor within ``exp(+-2 D)``;
    its own ``exp``, sum and division add ``gamma_(n + 6)`` relative (numpy's
    ``exp`` is within two ulps).
    """
    n, d = x.shape
    q, k, v = x @ wq, x @ wk, x @ wv
    ax = np.abs(x)
    eq, ek, ev = (_gamma(d) * (ax @ np.abs(w)) for w in (wq, wk, wv))
    scale = 1.0 / math.sqrt(d)
    s = (q @ k.T) * scale
    aq, ak = np.abs(q), np.abs(k)
    es = (_gamma(d) * (aq @ ak.T) + eq @ ak.T + aq @ ek.T + eq @ ek.T) * scale
    es += _gamma(3) * np.abs(s)  # sqrt, division and the multiply by scale
    z = s - s.max(axis=1, keepdims=True)
    es += _gamma(1) * np.abs(z)  # the subtraction of the row maximum
    e = np.exp(z)
    a = e / e.sum(axis=1, keepdims=True)
    spread = np.expm1(2 * es.max(axis=1, keepdims=True))
    ea = a * ((1 + spread) * (1 + _gamma(n + 6)) - 1)
    out = a @ v
    av = np.abs(v)
    eout = _gamma(n) * (a @ av) + ea @ av + a @ ev + ea @ ev
    return out, eout


def permutation_check(
    dim: int = 16, tokens: int = 6, seed: int = 0, *, preset: str | Sinusoid = "vaswani"
) -> PermutationCheck:
    """Reorder the input of one self-attention layer: without positions the output only reorders.

    Self-attention ``softmax(X Wq (X Wk)^T / sqrt(d)) X Wv`` (Vaswani et al.
    2017, section 3.2.1) treats its input as a set: for a permutation ``P``,
    ``attn(P X) = P attn(X)``. Hence section 3.5: "since our model contains no
    recurrence and no convolution, in order for the model to make use of the
    order of the sequence, we must inject some information about the ...
    position of the tokens". Adding the sinusoidal table in order (the
    positions stay ``0, 1, 2, ...`` while the tokens move) breaks the
    equivariance. One head, random float64 token embeddings ``N(0, 1)`` and
    weights ``N(0, 1/d)``, numpy only.

    Args:
        dim: channels; at least 2.
        tokens: sequence length; at least 2 (so that a permutation can move something).
        seed: seed of the embeddings, the weights and the permutation.
        preset: the sinusoidal preset added as positions.

    Returns:
        A :class:`PermutationCheck`. Its bound is twice the larger of the
        two runs' summed entrywise rounding bounds (``attn(P X)`` and
        ``P attn(X)`` each within its bound of the exact value, see
        ``_attention``), doubled for the second-order terms the bound
        leaves out and for evaluating it on computed values.

    Raises:
        TypeError: a non-int argument.
        ValueError: ``dim`` or ``tokens`` below 2, a negative seed, a bad preset.

    Examples:
        >>> import posenc.analysis
        >>> check = posenc.analysis.permutation_check(dim=16, tokens=6)
        >>> check.permutation
        (1, 2, 3, 5, 0, 4)
        >>> check.ok  # without positions: the output is only reordered
        True
        >>> check.with_positions > 1000 * check.bound  # with positions: it changes
        True
    """
    dim = checks.check_channels(dim, "dim", minimum=2)
    tokens = checks.check_int(tokens, "tokens", minimum=2)
    seed = checks.check_int(seed, "seed")
    pe = sinusoidal(tokens, dim, preset=preset, dtype="float64")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(tokens, dim))
    wq, wk, wv = (rng.normal(scale=1 / math.sqrt(dim), size=(dim, dim)) for _ in range(3))
    perm = rng.permutation(tokens)
    while np.array_equal(perm, np.arange(tokens)):
        perm = rng.permutation(tokens)
    runs = []
    for added in (0.0, pe):
        out, err = _attention(x + added, wq, wk, wv)
        out_p, err_p = _attention(x[perm] + added, wq, wk, wv)
        runs.append((out, out_p, float(np.max(np.abs(out_p - out[perm]))), err[perm] + err_p))
    (out, out_p, diff, bound), (pos, pos_p, pos_diff, pos_bound) = runs
    limit = 2.0 * float(max(bound.max(), pos_bound.max()))
    return PermutationCheck(
        dim=dim,
        tokens=tokens,
        seed=seed,
        permutation=tuple(int(i) for i in perm),
        output=out,
        permuted_output=out_p,
        max_difference=diff,
        bound=limit,
        positioned_output=pos,
        positioned_permuted_output=pos_p,
        with_positions=pos_diff,
    )


# ------------------------------------------------------------------ add or concatenate


@dataclass(frozen=True)
class AddConcat:
    """Token embeddings plus positions, seen on one (cos, sin) pair, at two scales and concatenated.

    Attributes:
        dim: channels ``d`` of the token embeddings and of the table.
        length: positions ``0 .. length - 1``.
        pair: the frequency pair drawn: the one whose wavelength is nearest ``length``.
        channels: its ``(cos channel, sin channel)``.
        wavelength: ``2 pi / omega`` of the pair, in positions.
        shown: indices (into the vocabulary) of the tokens drawn.
        scaled_tokens: ``(len(shown), 2)``: the drawn tokens' embeddings times
            ``sqrt(d)`` on the two channels (entries of standard deviation about 1).
        unscaled_tokens: the same embeddings without the factor (about ``1/sqrt(d)``).
        scaled_points: ``(len(shown), length, 2)``: ``sqrt(d) e + PE(p)`` on
            the two channels: a circle of radius the amplitude around each token.
        unscaled_points: ``e + PE(p)`` on the two channels: circles on top of
            one another around the origin.
        concat_points: ``(len(shown), length, 2)``: for ``[sqrt(d) e, PE(p)]``
            (``2 d`` channels), the token's value on its cos channel and the
            position's value on the pair's sin channel.
        scaled_std: measured standard deviation of the scaled embedding entries.
        unscaled_std: the same without the factor.
        position_recovery_scaled: fraction of (token, position) sums, over the
            whole vocabulary, whose best-matching table row is their position
            (as :func:`geometry`'s ``"recovery"``), embeddings times ``sqrt(d)``.
        position_recovery_unscaled: the same without the factor.
        token_recovery_scaled: fraction whose nearest token embedding is their token.
        token_recovery_unscaled: the same without the factor.
        concat_position_recovery: position recovery when concatenated (1: the
            position channels are the table's).
        concat_token_recovery: token recovery when concatenated.
    """

    dim: int
    length: int
    pair: int
    channels: tuple[int, int]
    wavelength: float
    shown: tuple[int, ...]
    scaled_tokens: Any
    unscaled_tokens: Any
    scaled_points: Any
    unscaled_points: Any
    concat_points: Any
    scaled_std: float
    unscaled_std: float
    position_recovery_scaled: float
    position_recovery_unscaled: float
    token_recovery_scaled: float
    token_recovery_unscaled: float
    concat_position_recovery: float
    concat_token_recovery: float

    @property
    def recovery(self) -> dict[float, float]:
        """Position recovery after adding, keyed by the nominal std of the token entries.

        ``1.0`` with the ``sqrt(d)`` factor, ``d ** -0.5`` without it.
        """
        return {
            1.0: self.position_recovery_scaled,
            self.dim**-0.5: self.position_recovery_unscaled,
        }


def _far_apart(points: Any, count: int) -> list[int]:
    """Indices of ``count`` rows of ``points`` picked greedily far apart (farthest-point order)."""
    chosen = [int(np.argmax(np.linalg.norm(points, axis=1)))]
    while len(chosen) < min(count, len(points)):
        gap = np.min(np.linalg.norm(points[:, None] - points[chosen][None], axis=-1), axis=1)
        chosen.append(int(np.argmax(gap)))
    return chosen


def add_concat(
    dim: int = 512,
    length: int = 50,
    seed: int = 0,
    *,
    shown: int = 4,
    vocab: int = 100,
    preset: str | Sinusoid = "vaswani",
) -> AddConcat:
    """Add a position to a token embedding at the paper's scale, without it, or concatenate.

    Vaswani et al. 2017 add the table to the embeddings (section 3.5) after
    multiplying the embeddings by ``sqrt(d_model)`` (section 3.4).
    tensor2tensor (``multiply_embedding_by_sqrt_depth``) and fairseq
    (``Embedding``: ``normal_(std=d ** -0.5)``, ``embed_scale = sqrt(d)``)
    initialise the embeddings with entries ``N(0, 1/d)``, so after the factor
    a token's entries have standard deviation 1, like the table's; without it
    they are ``1/sqrt(d)`` and the position swamps the token. On one (sin,
    cos) pair of channels, ``token + PE(p)`` for ``p < length`` is a circle of
    radius the amplitude (1) around the token's point. Concatenating
    ``[token, PE(p)]`` keeps the two in separate channels.

    Args:
        dim: channels; at least 2.
        length: positions; at least 2.
        seed: seed of the embeddings ``N(0, 1/d)``.
        shown: tokens drawn, picked far apart on the pair's channels from the vocabulary.
        vocab: token embeddings drawn; the recovery fractions are over all of
            them and every position.
        preset: the sinusoidal preset.

    Returns:
        An :class:`AddConcat`.

    Raises:
        TypeError: a non-int argument.
        ValueError: ``dim`` or ``length`` below 2, ``shown`` above ``vocab``,
            a preset with no complete (sin, cos) pair at ``dim``.

    Examples:
        >>> import posenc.analysis
        >>> ac = posenc.analysis.add_concat(dim=16, length=20, vocab=20)
        >>> ac.channels, round(ac.scaled_std, 2), round(ac.unscaled_std, 2)
        ((3, 2), 1.02, 0.26)
        >>> ac.token_recovery_scaled, ac.token_recovery_unscaled  # unscaled: swamped
        (1.0, 0.2525)
        >>> ac.concat_position_recovery, ac.concat_token_recovery
        (1.0, 1.0)
    """
    dim = checks.check_channels(dim, "dim", minimum=2)
    length = checks.check_int(length, "length", minimum=2)
    seed = checks.check_int(seed, "seed")
    shown = checks.check_int(shown, "shown", minimum=1)
    vocab = checks.check_int(vocab, "vocab", minimum=1)
    if shown > vocab:
        raise ValueError(f"shown must be at most vocab={vocab}; got {shown}")
    checks.check_elements(vocab * length * max(length, vocab), "add_concat's recovery scores")
    spec = resolve(preset)
    slots = spec.slots(dim)
    pairs = slots.n_second
    if pairs == 0:
        raise ValueError(f"dim={dim} has no complete (sin, cos) pair to draw")
    omega = spec.inv_freq(dim)[:pairs]
    wavelengths = 2 * np.pi / np.abs(omega)
    j = int(np.argmin(np.abs(np.log(wavelengths / length))))
    sin_ch, cos_ch = spec.sin_cos_channels(dim)
    cos_c, sin_c = int(cos_ch[j]), int(sin_ch[j])
    channels = (cos_c, sin_c)
    table = table64(length, dim, spec)
    rng = np.random.default_rng(seed)
    unscaled = rng.normal(scale=1 / math.sqrt(dim), size=(vocab, dim))
    scaled = math.sqrt(dim) * unscaled
    cols = list(channels)
    pick = _far_apart(scaled[:, cols], shown)
    on_pair = table[:, cols]  # (length, 2)

    def circles(emb: Any) -> Any:
        return emb[pick][:, None, cols] + on_pair[None]

    concat = np.empty((len(pick), length, 2))
    concat[..., 0] = scaled[pick][:, None, cos_c]
    concat[..., 1] = table[None, :, sin_c]
    zeros = np.zeros((vocab, dim))
    both_tokens = np.concatenate([scaled, zeros], axis=1)
    both_table = np.concatenate([np.zeros((length, dim)), table], axis=1)
    return AddConcat(
        dim=dim,
        length=length,
        pair=j,
        channels=channels,
        wavelength=float(wavelengths[j]),
        shown=tuple(pick),
        scaled_tokens=scaled[pick][:, cols],
        unscaled_tokens=unscaled[pick][:, cols],
        scaled_points=circles(scaled),
        unscaled_points=circles(unscaled),
        concat_points=concat,
        scaled_std=float(scaled.std()),
        unscaled_std=float(unscaled.std()),
        position_recovery_scaled=_position_recovery(table, scaled),
        position_recovery_unscaled=_position_recovery(table, unscaled),
        token_recovery_scaled=_token_recovery(table, scaled),
        token_recovery_unscaled=_token_recovery(table, unscaled),
        concat_position_recovery=_position_recovery(both_table, both_tokens),
        concat_token_recovery=_token_recovery(both_table, both_tokens),
    )
