"""What the blockwise attention paths share: grouped heads and the mask of a block.

:mod:`posenc.integration.attention`, :mod:`~posenc.integration.contextual` and
:mod:`~posenc.integration.stick_breaking` score blocks of queries in torch; each
views q's heads as groups over k's (grouped-query attention) and masks a block's
scores by the causal mask, padding and packed documents alike.
"""

from __future__ import annotations

import torch

__all__ = ["allowed", "grouped"]


def grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``(B, H, ...)`` -> ``(B, kv_heads, H / kv_heads, ...)`` (a view)."""
    b, h = x.shape[:2]
    return x.view(b, kv_heads, h // kv_heads, *x.shape[2:])


def allowed(
    causal: bool,
    key_mask: torch.Tensor | None,
    docs: torch.Tensor | None,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
) -> torch.Tensor | None:
    """Which keys each query of a block sees, ``(1 or batch, 1, n, m)`` bool; None: all.

    ``q_pos`` ``(n,)`` and ``k_pos`` ``(m,)`` are key positions; ``key_mask``
    ``(batch, k_len)`` is True for keys to attend; ``docs`` ``(1 or batch, k_len)``
    each key position's document (a query sees its own document only).
    """
    seen = None
    if causal:
        seen = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if key_mask is not None:
        km = key_mask[:, None, None, :]
        seen = km if seen is None else seen & km
    if docs is not None:
        same = docs[:, None, q_pos, None] == docs[:, None, None, k_pos]
        seen = same if seen is None else seen & same
    return seen
