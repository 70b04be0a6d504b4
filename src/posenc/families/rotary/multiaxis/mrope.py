"""M-RoPE (Wang et al. 2024, Qwen2-VL): one position axis per frequency section.

Positions are ``(3, batch, seq)`` (temporal, height, width). transformers'
``Qwen2VLRotaryEmbedding`` cuts the ``rotary_dim / 2`` frequencies into contiguous
chunks of ``mrope_section`` sizes (e.g. ``[16, 24, 24]``), chunk ``i`` reading axis
``i % 3``, and repeats the result as ``cat(theta, theta)`` (half layout), so the
sections apply to both halves. Qwen3-VL (``Qwen3VLTextRotaryEmbedding``) interleaves
instead: frequency ``k`` reads axis ``a`` in ``1, 2`` when ``k % 3 == a`` and
``k < 3 * mrope_section[a]``, and axis 0 (temporal) otherwise (sections ``[24, 20, 20]``).
VideoRoPE (Wei et al. 2025, arXiv:2502.05173; Wiselnn570/VideoRoPE
``apply_m_modify_multimodal_rotary_pos_emb``) gives time the lowest frequencies: the
last ``mrope_section[0]`` of them read axis 0, the others alternate height, width,
height ... from frequency 0 (low-frequency temporal allocation, diagonal layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posenc.core import checks
from posenc.families.rotary.multiaxis.sections import mrope_axes as mrope_axes
from posenc.families.rotary.schedules import RopeFrequencies
from posenc.families.rotary.tables import check_size, cos_sin


def mrope_cos_sin(
    position_ids: Any,
    freqs: RopeFrequencies,
    mrope_section: Sequence[int],
    *,
    interleaved: bool = False,
    videorope: bool = False,
    dtype: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact M-RoPE ``cos`` and ``sin`` in HF's half layout.

    Matches transformers' ``Qwen2VLRotaryEmbedding.forward`` (``interleaved=False``;
    Qwen2.5-VL too) and ``Qwen3VLTextRotaryEmbedding.forward``
    (``interleaved=True``), with exact angles instead of float32 ones; with
    ``videorope=True``, VideoRoPE's ``apply_m_modify_multimodal_rotary_pos_emb``
    (its position ids: :func:`posenc.positions.videorope_positions`, float when the
    temporal stride is).

    Args:
        position_ids: ``(3, batch, seq)`` int (or float) positions, one row per
            axis (temporal, height, width); more generally ``(axes, ...)``.
        freqs: the schedule's frequencies (``rotary_dim / 2`` of them).
        mrope_section: frequencies per section, summing to ``rotary_dim / 2``.
        interleaved: Qwen3-VL's T/H/W interleave instead of Qwen2-VL's chunks.
        videorope: VideoRoPE's order (see :func:`mrope_axes`).
        dtype: result dtype; float32 by default.

    Returns:
        ``(cos, sin)`` of shape ``position_ids.shape[1:] + (rotary_dim,)``,
        times the attention scaling.

    Raises:
        TypeError: ``position_ids`` not an int or float tensor.
        ValueError: ``position_ids`` with no axis dim, positions beyond
            ``2**31``; bad ``mrope_section`` (see :func:`mrope_axes`); tables of
            every axis of more than :data:`posenc.core.checks.MAX_ELEMENTS` values
            (``position_ids.numel() * rotary_dim``, refused before any work).

    Examples:
        >>> import torch
        >>> from posenc.rotary.multiaxis import mrope_cos_sin
        >>> from posenc.rotary.schedules import frequencies
        >>> freqs = frequencies("default", 16, 10000.0)
        >>> text = torch.arange(6).expand(3, 1, 6)  # text tokens: the three axes agree
        >>> cos, sin = mrope_cos_sin(text, freqs, [2, 3, 3])
        >>> cos.shape
        torch.Size([1, 6, 16])
        >>> angles = torch.arange(6.0)[:, None] * torch.from_numpy(freqs.inv_freq).float()
        >>> torch.allclose(cos[0], torch.cat([angles, angles], -1).cos())  # 1-D RoPE's table
        True
    """
    position_ids = checks.check_position_tensor(position_ids, "position_ids")
    if position_ids.ndim < 2:
        raise ValueError(
            f"position_ids must be (axes, batch, seq) (3 axes for M-RoPE); got shape "
            f"{tuple(position_ids.shape)}"
        )
    # the tables of every axis are computed (below): their size, before any work
    check_size(position_ids, 2 * len(freqs.omega), "position_ids")
    checks.check_position_tensor(position_ids, "position_ids", exact=True)
    pairs = freqs.turns.size
    axis = mrope_axes(
        tuple(mrope_section),
        pairs,
        axes=position_ids.shape[0],
        interleaved=bool(interleaved),
        videorope=bool(videorope),
    )
    # every axis at every frequency (exact), then each frequency's own axis: 3x the
    # angles of one table, but one engine call and no per-axis frequency subsets
    c, s = cos_sin(position_ids, freqs, layout="half", dtype=torch.float64)
    half = torch.tensor(axis, device=c.device)
    index = torch.cat([half, half]).expand(1, *c.shape[1:])
    c, s = c.gather(0, index).squeeze(0), s.gather(0, index).squeeze(0)
    out = torch.float32 if dtype is None else dtype
    return c.to(out), s.to(out)
