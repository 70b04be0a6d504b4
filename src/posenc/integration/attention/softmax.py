"""The softmax engine: exact attention over blocks, forward and backward, in linear memory.

``softmax(q . k * scale + sum of terms + mask) v`` for a
:class:`~posenc.integration.attention.layout.Plan` (a call's
layout, scale and score terms' forms) and the terms' tensors:

- the compiled loop (:mod:`posenc.integration.attention.kernel`, float32 on the
  CPU) where it can read every term;
- else blockwise in torch ops: a block is a run of queries against every key,
  so its softmax is exact without rescaling; no ``(batch, heads, q_len, k_len)``
  tensor exists beyond a block.

:class:`SoftmaxAttention` is the autograd function: it keeps the log-sum-exp and
its backward recomputes each block from it (as flash attention does), compiled
where the forward was, else blockwise; a term's gradient is autograd's of its
block form against the block's score gradient, so any term trains. Ring
attention calls :func:`forward_block` and :func:`backward_block` on pairs of
chunks and merges them by their log-sum-exps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posenc.integration.attention import kernel
from posenc.integration.attention.layout import (
    BLOCK_SCORES,
    Plan,
    allowed,
    grouped,
    score_grads,
    scores,
)


def block_scores(
    plan: Plan,
    tensors: Sequence[torch.Tensor],
    qb: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
) -> torch.Tensor:
    """Masked scores ``(B, H, n, k_len)`` of a block of queries ``qb`` (B, H, n, variants * D)."""
    s = scores(plan, qb, k, q_pos, k_pos) * plan.scale
    for form, own in zip(plan.forms, plan.split(tensors), strict=True):
        if form.block is not None:
            s = s + form.block(own, q_pos, k_pos)
    seen = allowed(plan.mask, q_pos, k_pos)
    if seen is not None:
        s = s.masked_fill(~seen, float("-inf"))
    return s


def _safe(lse: torch.Tensor) -> torch.Tensor:
    """The log-sum-exp with rows that see no key (-inf) set to 0: their weights are all 0.

    A NaN or +inf one (a score that is NaN or +inf) stays, so that the row's
    weights and output are NaN, as softmax gives.
    """
    return lse.masked_fill(lse == float("-inf"), 0.0)


def _step(batch: int, heads: int, q_len: int, k_len: int) -> int:
    return max(1, min(q_len, BLOCK_SCORES // max(1, batch * heads * k_len)))


def forward_blockwise(
    plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp, block by block in torch ops."""
    b, h, lq, _ = q.shape
    hk, lk = k.shape[1], k.shape[2]
    out = torch.empty((b, h, lq, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, lq), dtype=q.dtype, device=q.device)
    k_pos = torch.arange(lk, device=q.device)
    step = _step(b, h, lq, lk)
    for i0 in range(0, lq, step):
        i1 = min(lq, i0 + step)
        q_pos = torch.arange(i0, i1, device=q.device) + plan.mask.offset
        s = block_scores(plan, tensors, q[:, :, i0:i1], k, q_pos, k_pos)
        m = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - _safe(m)[..., None])
        out[:, :, i0:i1] = torch.matmul(grouped(p, hk), v.unsqueeze(2)).flatten(1, 2)
        lse[:, :, i0:i1] = m
    return out, lse


def _term_grads(
    plan: Plan,
    tensors: Sequence[torch.Tensor],
    wanted: Sequence[bool],
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    ds: torch.Tensor,
    grads: list[torch.Tensor | None],
) -> None:
    """Add each term's gradient for one block: autograd's of its block form against ``ds``."""
    start = 0
    for form, size in zip(plan.forms, plan.sizes, strict=True):
        own = range(start, start + size)
        start += size
        if form.block is None or not any(wanted[i] for i in own):
            continue
        with torch.enable_grad():
            detached = [tensors[i].detach().requires_grad_(wanted[i]) for i in own]
            block = form.block(detached, q_pos, k_pos)
            # the score gradient summed over what the block broadcasts over
            g = ds
            if block.ndim < g.ndim:
                g = g.sum(0)
            elif block.shape[0] == 1 and g.shape[0] > 1:
                g = g.sum(0, keepdim=True)
            leaves = [t for t in detached if t.requires_grad]
            found = iter(torch.autograd.grad(block, leaves, g, allow_unused=True))
        for i in own:
            if wanted[i]:
                part, prev = next(found), grads[i]
                if part is not None:
                    grads[i] = part if prev is None else prev + part


def backward_blockwise(
    plan: Plan,
    tensors: Sequence[torch.Tensor],
    wanted: Sequence[bool],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    delta: torch.Tensor,
) -> tuple[torch.Tensor | None, ...]:
    """dq, dk, dv and each tracked tensor's gradient, block by block in torch ops."""
    if any(f.read is not None for f in plan.forms):
        # such a call runs here only where its reader ran the forward (kernel.reads)
        raise RuntimeError("a term that reads the scores has no blockwise backward")
    b, h, lq, _ = q.shape
    hk, lk = k.shape[1], k.shape[2]
    dq = torch.empty_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    grads: list[torch.Tensor | None] = [None] * len(tensors)
    k_pos = torch.arange(lk, device=q.device)
    step = _step(b, h, lq, lk)
    for i0 in range(0, lq, step):
        i1 = min(lq, i0 + step)
        q_pos = torch.arange(i0, i1, device=q.device) + plan.mask.offset
        qb, dob = q[:, :, i0:i1], dout[:, :, i0:i1]
        with torch.no_grad():
            s = block_scores(plan, tensors, qb, k, q_pos, k_pos)
            p = torch.exp(s - _safe(lse[:, :, i0:i1])[..., None])
            dv += torch.matmul(grouped(p, hk).transpose(-1, -2), grouped(dob, hk)).sum(2)
            dp = torch.matmul(grouped(dob, hk), v.unsqueeze(2).transpose(-1, -2))
            ds = p * (dp.flatten(1, 2) - delta[:, :, i0:i1, None])
            dqb, dkb = score_grads(plan, ds, qb, k, q_pos, k_pos)
            dq[:, :, i0:i1] = dqb * plan.scale
            dk += dkb * plan.scale
        if any(wanted):
            _term_grads(plan, tensors, wanted, q_pos, k_pos, ds, grads)
    return (dq, dk, dv, *grads)


def forward_block(
    plan: Plan,
    tensors: Sequence[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    use_kernel: bool,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Output, log-sum-exp, and whether the compiled loop made them (else blockwise)."""
    result = kernel.forward(plan, tensors, q, k, v) if use_kernel else None
    if result is not None:
        return (*result, True)
    return (*forward_blockwise(plan, tensors, q, k, v), False)


def backward_block(
    plan: Plan,
    tensors: Sequence[torch.Tensor],
    wanted: Sequence[bool],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    delta: torch.Tensor,
    use_kernel: bool,
) -> tuple[torch.Tensor | None, ...]:
    """dq, dk, dv and the tracked tensors' gradients of one call, from its (or a larger
    softmax's) log-sum-exp and ``delta``: compiled where the forward was."""
    grads = None
    if use_kernel:
        grads = kernel.backward(plan, tensors, wanted, q, k, v, lse, dout, delta)
    if grads is None:
        grads = backward_blockwise(plan, tensors, wanted, q, k, v, lse, dout, delta)
    return grads


class SoftmaxAttention(torch.autograd.Function):
    """Attention whose backward recomputes scores block by block from the log-sum-exp:
    compiled when the forward was, else in torch ops."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        plan: Plan,
        use_kernel: bool,
        *tensors: torch.Tensor,
    ) -> torch.Tensor:
        """The attention output, block by block; saves q, k, v, the output and the
        log-sum-exp (not the scores) for :meth:`backward`."""
        out, lse, ctx.kernel = forward_block(plan, tensors, q, k, v, use_kernel)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, out, lse, *tensors)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        """The gradients of q, k, v and of each score term's tensors that asks for one,
        recomputed block by block from the saved output and log-sum-exp."""
        q, k, v, out, lse, *tensors = ctx.saved_tensors
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        wanted = [t.requires_grad for t in tensors]
        grads = backward_block(ctx.plan, tensors, wanted, q, k, v, lse, dout, delta, ctx.kernel)
        return (*grads[:3], None, None, *grads[3:])
