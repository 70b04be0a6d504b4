"""The checkpointed path: softmax attention with terms that read the scores.

A term whose form has ``read`` (CoPE's gates, DAPE's MLP of the scores) needs
``q . k`` itself, which neither the compiled loop nor a FlexAttention score mod can
give per score, so a call with one is exact softmax attention in torch ops over
blocks of queries, every key at once:

- a block of ``n`` queries builds its scaled scores ``z`` ``(batch, heads, n,
  k_len)``, adds each reading term's value (read from ``z``) and then every other
  term's block form, in the order the terms were given; its softmax and its
  output: no ``(batch, heads, q_len, k_len)`` tensor exists beyond a block;
- training: each block runs under ``torch.utils.checkpoint`` (non-reentrant),
  which keeps only the block's inputs (views of q, k and v and the terms'
  tensors) and recomputes the block in the backward, so memory stays one
  block's beyond the O(q_len) inputs and outputs; autograd differentiates the
  recomputed block. The terms' parameters enter each block as inputs, so
  ``torch.func.functional_call`` reaches them too.

Shapes as :mod:`posenc.integration.attention`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

from posenc.integration.attention.layout import BLOCK_SCORES, Plan, allowed, grouped, scores


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: Plan,
    tensors: Sequence[torch.Tensor],
    per_query: int = 0,
) -> torch.Tensor:
    """Softmax attention of prepared inputs with terms that read the scores.

    q, k and v are rotated already and of one float dtype (the work dtype).
    ``per_query``: the values a reading term keeps per query row beyond the scores
    (sizes the blocks). A query that sees no key gets a zero output.

    Returns:
        ``(batch, heads, q_len, v_dim)``.
    """
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    step = max(1, min(lq, BLOCK_SCORES // max(1, b * (h * lk + per_query))))
    tracked = [q, k, v, *tensors]
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in tracked)
    blocks = []
    for i0 in range(0, lq, step):
        i1 = min(lq, i0 + step)
        q_pos = torch.arange(i0, i1, device=q.device) + plan.mask.offset
        run = partial(_block, plan, q_pos)
        if recompute:
            out = checkpoint(run, q[:, :, i0:i1], k, v, *tensors, use_reentrant=False)
        else:
            out = run(q[:, :, i0:i1], k, v, *tensors)
        blocks.append(out)
    return torch.cat(blocks, 2)


def _block(
    plan: Plan,
    q_pos: torch.Tensor,
    qb: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *tensors: torch.Tensor,
) -> torch.Tensor:
    """The output ``(B, H, n, v_dim)`` of a block of queries ``qb`` (B, H, n, D)."""
    hk = k.shape[1]
    k_pos = torch.arange(k.shape[2], device=k.device)
    z = scores(plan, qb, k, q_pos, k_pos) * plan.scale
    seen = allowed(plan.mask, q_pos, k_pos)
    unseen = None if seen is None else ~seen
    s = z
    owned = plan.split(tensors)
    for form, own in zip(plan.forms, owned, strict=True):
        if form.read is not None:
            s = s + form.read(own, z, qb, q_pos, k_pos, unseen)
    for form, own in zip(plan.forms, owned, strict=True):
        if form.read is None and form.block is not None:
            s = s + form.block(own, q_pos, k_pos)
    if unseen is not None:
        s = s.masked_fill(unseen, float("-inf"))
    # softmax whose rows without a key give 0 (the max is only a shift: no gradient)
    top = s.detach().amax(-1, keepdim=True)
    top = top.masked_fill(top == float("-inf"), 0.0)
    e = torch.exp(s - top)
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    return torch.matmul(grouped(p, hk), v.unsqueeze(2)).flatten(1, 2)
