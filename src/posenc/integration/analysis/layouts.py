"""RoPE's two channel layouts: the same rotation after a permutation of channels.

The interleaved layout (the RoFormer paper, GPT-J, Meta's original Llama
code) rotates the pairs ``(2i, 2i+1)``; the half layout (HF's
``rotate_half``, GPT-NeoX) rotates ``(i, i + d/2)``, both by ``m theta_i``.
Channel ``i`` of the half layout is channel ``2i`` of the interleaved one and
channel ``i + d/2`` is ``2i + 1``: permuting the rows of ``W_q`` and ``W_k``
by that map turns a checkpoint of one layout into the other with the same
scores (transformers' Llama conversion script does it). :func:`rope_layouts`
measures it, and what the same weights give under the wrong layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from posenc.core import checks
from posenc.integration.analysis._table import EPS

if TYPE_CHECKING:
    from posenc.families.rotary.tables import Layout


@dataclass(frozen=True)
class RopeLayouts:
    """Scores of one set of weights under both layouts (:func:`rope_layouts`).

    Attributes:
        head_dim: rotary channels.
        length: positions ``0 .. length - 1`` of the queries and keys.
        seed: the seed of the tokens and weights.
        permutation: ``permutation[j]`` is the interleaved channel that half-layout
            channel ``j`` takes: ``0, 2, 4, ..., 1, 3, 5, ...``.
        scores: ``(length, length)`` float64 scores ``q_m . k_n`` of the interleaved
            model (queries ``m``, keys ``n``).
        wrong: the same weights rotated in the half layout.
        permuted_difference: the largest ``|difference|`` between ``scores`` and the
            half layout on the rows of ``W_q`` and ``W_k`` permuted by ``permutation``.
        wrong_difference: the largest ``|wrong - scores|``.
        diagonal_difference: the largest ``|wrong - scores|`` at ``m = n``, where the
            rotations cancel in any layout.
        size: the largest ``|score|``.
        tolerance: the difference float64 rounding allows: ``16 * head_dim * EPS``
            times the largest ``|q_m| |k_n|``.
    """

    head_dim: int
    length: int
    seed: int
    permutation: tuple[int, ...]
    scores: Any
    wrong: Any
    permuted_difference: float
    wrong_difference: float
    diagonal_difference: float
    size: float
    tolerance: float


def half_from_interleaved(head_dim: int) -> tuple[int, ...]:
    """The interleaved channel each half-layout channel takes: ``0, 2, ..., 1, 3, ...``."""
    head_dim = checks.check_int(head_dim, "head_dim", minimum=2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (pairs of channels); got {head_dim}")
    return (*range(0, head_dim, 2), *range(1, head_dim, 2))


def rope_layouts(
    head_dim: int = 64, length: int = 32, d_model: int = 128, seed: int = 0
) -> RopeLayouts:
    """One interleaved checkpoint's scores, then under the half layout permuted and not.

    Tokens ``(length, d_model)`` of standard deviation 1 and ``W_q``, ``W_k``
    ``(head_dim, d_model)`` of standard deviation ``1 / sqrt(d_model)``, drawn
    from numpy's generator seeded by ``seed``; :func:`posenc.apply_rotary` in
    float64 with :class:`posenc.Rotary`'s tables of each layout (base 10000).
    Needs torch.

    Raises:
        ValueError: odd or too small ``head_dim``, ``length`` below 2, ``d_model``
            below 1, a negative ``seed``.
    """
    import torch

    from posenc.families.rotary.apply import apply_rotary
    from posenc.families.rotary.module import Rotary

    permutation = half_from_interleaved(head_dim)
    length = checks.check_int(length, "length", minimum=2)
    d_model = checks.check_int(d_model, "d_model", minimum=1)
    seed = checks.check_int(seed, "seed")
    rng = np.random.default_rng(seed)
    tokens = rng.normal(size=(length, d_model))
    w_q, w_k = rng.normal(scale=d_model**-0.5, size=(2, head_dim, d_model))
    positions = torch.arange(length)

    def scores(layout: Layout, wq: Any, wk: Any) -> Any:
        cos, sin = Rotary(head_dim, layout=layout).cos_sin(positions, dtype=torch.float64)
        q = apply_rotary(torch.from_numpy(tokens @ wq.T), cos, sin, layout=layout)
        k = apply_rotary(torch.from_numpy(tokens @ wk.T), cos, sin, layout=layout)
        return (q @ k.T).numpy()

    reference = scores("interleaved", w_q, w_k)
    perm = list(permutation)
    permuted = scores("half", w_q[perm], w_k[perm])
    wrong = scores("half", w_q, w_k)
    norms_q = np.linalg.norm(tokens @ w_q.T, axis=1)
    norms_k = np.linalg.norm(tokens @ w_k.T, axis=1)
    return RopeLayouts(
        head_dim,
        length,
        seed,
        permutation,
        reference,
        wrong,
        float(np.abs(permuted - reference).max()),
        float(np.abs(wrong - reference).max()),
        float(np.abs(np.diagonal(wrong - reference)).max()),
        float(np.abs(reference).max()),
        16 * head_dim * EPS * float(norms_q.max() * norms_k.max()),
    )
