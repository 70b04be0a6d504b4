"""Why an added encoding is not relative once the query and key projections have read it.

With ``x_p = e_p + PE(p)`` and ``A = W_q^T W_k``, the score of query ``m`` and
key ``n`` is ``x_m^T A x_n``: four terms, content-content ``e_m^T A e_n``,
content-position ``e_m^T A PE(n)``, position-content ``PE(m)^T A e_n`` and
position-position ``PE(m)^T A PE(n)``. ``PE(n) = M_{n-m} PE(m)`` (the shift
rotation), so the position-position term is ``PE(0)^T M_m^T A M_m M_{n-m}
PE(0)``: a function of ``n - m`` alone when ``A`` commutes with every
rotation ``M_k`` (the identity, a sum of shift rotations), and of ``m`` too
for a general ``A``. RoPE rotates after the projections:
``(R_m W_q e)^T (R_n W_k e) = e^T W_q^T R_{n-m} W_k e`` for any weights.
:func:`position_terms` measures the four cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from posenc.core import checks
from posenc.families.absolute.sinusoidal import shift_matrix, sinusoidal
from posenc.integration.analysis._table import EPS

#: The cases of :func:`position_terms`, in the order of its figure.
CASES = ("identity", "commuting", "random", "rope")


@dataclass(frozen=True)
class PositionTerms:
    """The position-position term of the score under four projections (:func:`position_terms`).

    Attributes:
        dim: channels of the table and of the projections (one head of ``dim``).
        length: positions ``0 .. length - 1`` of the query and the key.
        seed: the seed of the random weights and token vectors.
        terms: case of :data:`CASES` -> ``(length, length)`` float64 matrix over
            ``(m, n)``: ``"identity"`` ``PE(m) . PE(n)``; ``"commuting"``
            ``PE(m)^T A PE(n)`` with ``A`` a sum of shift rotations; ``"random"``
            ``PE(m)^T W_q^T W_k PE(n)`` with random ``W_q``, ``W_k``; ``"rope"``
            ``(R_m W_q e) . (R_n W_k e')`` for two token vectors and the same weights.
        spread: case -> the largest spread (max - min) of the term over the pairs
            ``(m, n)`` with one offset ``m - n``, over every offset.
        size: case -> the largest ``|entry|`` of the term.
        tolerance: case -> the spread float64 rounding allows:
            ``16 * dim * EPS * scale``, ``scale`` bounding every entry (Cauchy-Schwarz).
        decomposition_error: the largest ``|x_m^T A x_n - (sum of the four terms)|``
            with ``x_p = e_p + PE(p)`` and the random weights.
        decomposition_tolerance: its float64 bound, as ``tolerance``.
    """

    dim: int
    length: int
    seed: int
    terms: dict[str, Any]
    spread: dict[str, float]
    size: dict[str, float]
    tolerance: dict[str, float]
    decomposition_error: float
    decomposition_tolerance: float


def diagonal_spread(matrix: Any) -> float:
    """The largest ``max - min`` along any diagonal (one offset ``m - n``) of a square matrix."""
    n = matrix.shape[0]
    return float(max(np.ptp(np.diagonal(matrix, k)) for k in range(-(n - 2), n - 1)))


def position_terms(dim: int = 64, length: int = 32, seed: int = 0) -> PositionTerms:
    """The position-position term of an added encoding's score, and RoPE's, over ``(m, n)``.

    The vaswani table in float64; weights ``W_q``, ``W_k`` with entries of
    standard deviation ``1 / sqrt(dim)`` and token vectors of standard
    deviation 1, drawn from numpy's generator seeded by ``seed``; the commuting
    case's ``A`` is ``I + 0.7 M_3 - 0.4 M_11`` (:func:`posenc.shift_matrix`);
    RoPE's rotation is :func:`posenc.apply_rotary` (half layout) in float64. Needs torch.

    Raises:
        ValueError: ``dim`` odd or below 4, ``length`` below 3, a negative ``seed``.
    """
    import torch

    from posenc.families.rotary.apply import apply_rotary
    from posenc.families.rotary.module import Rotary

    dim = checks.check_channels(dim, "dim", minimum=4)
    if dim % 2:
        raise ValueError(f"dim must be even (pairs of sin and cos); got {dim}")
    length = checks.check_int(length, "length", minimum=3)
    seed = checks.check_int(seed, "seed")
    rng = np.random.default_rng(seed)
    w_q, w_k = rng.normal(scale=dim**-0.5, size=(2, dim, dim))
    tokens = rng.normal(size=(length, dim))
    pe = np.asarray(sinusoidal(length, dim, dtype="float64"))
    commuting = np.eye(dim) + 0.7 * shift_matrix(3, dim) - 0.4 * shift_matrix(11, dim)
    random = w_q.T @ w_k
    row = float(np.sqrt(dim / 2))  # the norm of every row of the table
    terms = {
        "identity": pe @ pe.T,
        "commuting": pe @ commuting @ pe.T,
        "random": pe @ random @ pe.T,
    }
    scales = {
        "identity": row * row,
        "commuting": row * row * float(np.linalg.norm(commuting, 2)),
        "random": row * row * float(np.linalg.norm(random, 2)),
    }
    rope = Rotary(dim)
    cos, sin = rope.cos_sin(torch.arange(length), dtype=torch.float64)
    q = torch.from_numpy(np.tile(w_q @ tokens[0], (length, 1)))
    k = torch.from_numpy(np.tile(w_k @ tokens[1], (length, 1)))
    q_rot, k_rot = apply_rotary(q, cos, sin).numpy(), apply_rotary(k, cos, sin).numpy()
    terms["rope"] = q_rot @ k_rot.T
    scales["rope"] = float(np.linalg.norm(q[0].numpy()) * np.linalg.norm(k[0].numpy()))

    x = tokens + pe
    parts = (
        tokens @ random @ tokens.T
        + tokens @ random @ pe.T
        + pe @ random @ tokens.T
        + terms["random"]
    )
    full = x @ random @ x.T
    decomposition_scale = float(np.linalg.norm(x, axis=1).max() ** 2 * np.linalg.norm(random, 2))
    return PositionTerms(
        dim,
        length,
        seed,
        terms,
        {name: diagonal_spread(t) for name, t in terms.items()},
        {name: float(np.abs(t).max()) for name, t in terms.items()},
        {name: 16 * dim * EPS * s for name, s in scales.items()},
        float(np.abs(full - parts).max()),
        16 * dim * EPS * decomposition_scale,
    )
