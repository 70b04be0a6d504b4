"""xPos (Sun et al. 2022, arXiv:2212.10554): RoPE whose scores decay with distance.

As rotary-embedding-torch's ``RotaryEmbedding(use_xpos=True).rotate_queries_and_keys``:
the rotated channels of ``q`` are also scaled by ``zeta_k ** ((t - T // 2) /
scale_base)`` with ``zeta_k = (2k + 0.4 d) / (1.4 d)``, and those of ``k`` by the
inverse, so ``q_m . k_n`` decays with ``m - n``. Causal attention only: the factor
grows without bound for ``n > m``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from posenc.core import checks
from posenc.families.rotary.apply import apply_rotary
from posenc.families.rotary.schedules import RopeFrequencies
from posenc.families.rotary.tables import LAYOUTS, Layout, check_size, cos_sin


def xpos_scale(
    positions: Any,
    rotary_dim: int,
    *,
    center: float,
    scale_base: float = 512.0,
    layout: Layout = "interleaved",
    dtype: Any = None,
) -> torch.Tensor:
    """xPos's per-channel scale of the queries: ``zeta_k ** ((t - center) / scale_base)``.

    ``zeta_k = (2k + 0.4 d) / (1.4 d)`` with ``d = rotary_dim`` (Sun et al.
    2022; rotary-embedding-torch ``get_scale``, where ``center = len(t) // 2``).
    The keys take the reciprocal. Computed in float64 before one rounding.

    Returns:
        ``positions.shape + (rotary_dim,)``, each ``zeta_k`` twice in ``layout``
        order; float32 by default.

    Raises:
        TypeError: ``positions`` not an int or float tensor.
        ValueError: positions beyond ``2**31``; ``rotary_dim`` odd or above
            :data:`posenc.core.checks.MAX_CHANNELS`, or a result of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (``positions.numel() *
            rotary_dim``), both refused before any work.

    Examples:
        >>> import torch
        >>> from posenc.rotary.multiaxis import xpos_scale
        >>> xpos_scale(torch.tensor([0, 512, 1024]), 4, center=512).round(decimals=4)
        tensor([[3.5000, 3.5000, 1.5556, 1.5556],
                [1.0000, 1.0000, 1.0000, 1.0000],
                [0.2857, 0.2857, 0.6429, 0.6429]])
    """
    positions = checks.check_position_tensor(positions, "positions")
    rotary_dim = checks.check_channels(rotary_dim, "rotary_dim", minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even; got {rotary_dim}")
    check_size(positions, rotary_dim, what="xPos's scale")
    checks.check_position_tensor(positions, "positions", exact=True)
    scale_base = checks.check_number(scale_base, "scale_base", positive=True)
    center = checks.check_number(center, "center")
    checks.check_choice(layout, "layout", LAYOUTS)
    d = rotary_dim
    log_zeta = torch.tensor(
        [math.log((2 * k + 0.4 * d) / (1.4 * d)) for k in range(d // 2)],
        dtype=torch.float64,
        device=positions.device,
    )
    power = (positions.to(torch.float64) - center) / scale_base
    scale = torch.exp(power[..., None] * log_zeta)
    if layout == "half":
        scale = torch.cat([scale, scale], -1)
    else:
        scale = scale.repeat_interleave(2, -1)
    return scale.to(torch.float32 if dtype is None else dtype)


def xpos_tables(
    positions: Any,
    freqs: RopeFrequencies,
    *,
    center: float,
    scale_base: float = 512.0,
    layout: Layout = "interleaved",
    dtype: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``(cos, sin)`` tables of xPos's queries and of its keys at ``positions``.

    RoPE's tables times :func:`xpos_scale` for the queries, divided by it for the
    keys, computed in float64 and rounded once to ``dtype`` (float32 by default).
    A rotation times a positive per-pair scale is still linear with transpose
    (same cos, negated sin), so :func:`~posenc.apply_rotary` applies each pair
    and its backward stays right. Queries and keys at any positions of one
    sequence whose centre is ``center`` (:func:`xpos_rotate` uses ``T // 2``; the
    centre cancels in ``q . k``).

    Returns:
        ``(cos_q, sin_q, cos_k, sin_k)``, each ``positions.shape + (rotary_dim,)``.

    Raises:
        TypeError: ``positions`` not an int or float tensor.
        ValueError: positions beyond ``2**31``; tables of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (``positions.numel() *
            rotary_dim``, refused before any work).

    Examples:
        >>> import torch
        >>> import posenc
        >>> from posenc.rotary.multiaxis import xpos_tables
        >>> from posenc.rotary.schedules import frequencies
        >>> freqs = frequencies("default", 8, 10000.0)
        >>> cos_q, sin_q, cos_k, sin_k = xpos_tables(torch.arange(4), freqs, center=2)
        >>> q = posenc.apply_rotary(torch.randn(1, 2, 4, 8), cos_q, sin_q, layout="interleaved")
        >>> q.shape
        torch.Size([1, 2, 4, 8])
        >>> torch.allclose(cos_q * cos_k + sin_q * sin_k, torch.ones(4, 8))  # scales cancel
        True
    """
    positions = checks.check_position_tensor(positions, "positions")
    rotary_dim = 2 * len(freqs.omega)
    check_size(positions, rotary_dim)
    checks.check_position_tensor(positions, "positions", exact=True)
    c, s = cos_sin(positions, freqs, layout=layout, dtype=torch.float64)
    scale = xpos_scale(
        positions, rotary_dim, center=center, scale_base=scale_base, layout=layout,
        dtype=torch.float64,
    )  # fmt: skip
    work = torch.float32 if dtype is None else dtype
    return (c * scale).to(work), (s * scale).to(work), (c / scale).to(work), (s / scale).to(work)


def xpos_rotate(
    q: torch.Tensor,
    k: torch.Tensor,
    freqs: RopeFrequencies,
    *,
    scale_base: float = 512.0,
    layout: Layout = "interleaved",
    seq_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate and xPos-scale ``q`` and ``k`` of one whole causal sequence.

    rotary-embedding-torch's ``RotaryEmbedding(use_xpos=True)
    .rotate_queries_and_keys(q, k)``: positions ``0 .. T - 1``, ``q``'s
    rotated channels times :func:`xpos_scale` (``center = T // 2``), ``k``'s
    divided by it; channels past ``rotary_dim`` untouched. Causal only (the
    scale of a key after its query grows without bound); no KV-cache offsets.

    Args:
        q: ``(..., seq, head_dim)`` (``seq_dim=-2``) or ``(..., seq, heads,
            head_dim)`` (``seq_dim=-3``).
        k: like ``q`` (same length).
        freqs: the rotary frequencies (``rotary_dim / 2`` of them).
        scale_base: xPos's ``scale_base`` (512 in the paper).
        layout: pair order (rotary-embedding-torch: ``"interleaved"``).
        seq_dim: ``-2`` or ``-3``.

    Returns:
        ``(q', k')``, shaped and typed like ``q`` and ``k``.

    Examples:
        >>> import torch
        >>> from posenc.rotary.multiaxis import xpos_rotate
        >>> from posenc.rotary.schedules import frequencies
        >>> _ = torch.manual_seed(0)
        >>> q, k = torch.randn(2, 1, 2, 5, 16)  # (batch, heads, seq, head_dim) each
        >>> q2, k2 = xpos_rotate(q, k, frequencies("default", 16, 10000.0))
        >>> q2.shape
        torch.Size([1, 2, 5, 16])
        >>> torch.allclose((q2 * k2).sum(-1), (q * k).sum(-1), atol=1e-5)  # same position
        True
    """
    if seq_dim not in (-2, -3):
        raise ValueError(f"seq_dim must be -2 or -3; got {seq_dim}")
    for name, t in (("q", q), ("k", k)):
        checks.check_float_tensor(t, name)
        if t.ndim < -seq_dim:
            raise ValueError(f"{name} must have at least {-seq_dim} dims; got {tuple(t.shape)}")
    seq = q.shape[seq_dim]
    if k.shape[seq_dim] != seq:
        raise ValueError(
            f"q and k must have the same length (dim {seq_dim}); got {seq} and {k.shape[seq_dim]}"
        )
    rotary_dim = 2 * freqs.turns.size
    cq, sq, ck, sk = xpos_tables(
        torch.arange(seq, device=q.device), freqs, center=seq // 2, scale_base=scale_base,
        layout=layout, dtype=checks.work_dtype(q.dtype),
    )  # fmt: skip
    if seq_dim == -3:
        cq, sq, ck, sk = (t.unsqueeze(-2) for t in (cq, sq, ck, sk))
    kw: dict[str, Any] = {"layout": layout, "rotary_dim": rotary_dim}
    return apply_rotary(q, cq, sq, **kw), apply_rotary(k, ck, sk, **kw)
