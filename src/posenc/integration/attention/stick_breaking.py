"""``posenc.stick_breaking_attention``: stick-breaking attention in linear memory.

An engine with its own normaliser on the attention package's layout (its input
checks and packed documents).

Stick-breaking attention (Tan et al. 2024, "Scaling Stick-Breaking Attention:
An Efficient Implementation and In-depth Study"; shawntan/stickbreaking-attention,
whose ``sb_ref.stickbreaking`` this matches) replaces the softmax by a stick
broken from the nearest key outwards: with ``z_ij = q_i . k_j * scale`` and
``beta_ij = sigmoid(z_ij)``, key ``j`` takes ``beta_ij`` of what the keys
nearer to query ``i`` left::

    A_ij = beta_ij * prod_{j < m < i} (1 - beta_im)        keys j < i
    out_i = sum_j A_ij v_j,        rem_i = 1 - sum_j A_ij = prod_j (1 - beta_ij)

(``attend_current=True``: keys ``j <= i``, and the query's own key breaks the
stick first.) Nothing normalises the weights; ``rem`` is what no key took. The
position enters through the order of the keys alone: no rotary, no bias.

Shapes::

    q     (batch, heads, q_len, head_dim)
    k     (batch, kv_heads, k_len, head_dim)     heads % kv_heads == 0 (GQA)
    v     (batch, kv_heads, k_len, v_dim)
    out   (batch, heads, q_len, v_dim)
    rem   (batch, heads, q_len)

Everything is computed in log space, ``log A_ij = log sigmoid(z_ij) - sum_{j < m
< i} softplus(z_im)``, so neither a long sequence nor a large ``|z|`` underflows
into a NaN. Keys are taken in blocks from the last to the first (for every query
the nearest first), carrying each query's running log-survival ``-sum softplus``
over the keys already taken: no ``(q_len, k_len)`` tensor is ever built, only
``(q_len, block)`` ones. The backward recomputes every block the same way, in
the same order, carrying the weighted gradients of the nearer keys, so training
needs O(q_len * block) memory too.

float32 CPU tensors whose ``head_dim`` and ``v_dim`` are multiples of 16 take the
compiled loop instead (``core/csrc/breaking.c``: ``breaking`` and
``breaking_backward``), the same formulas in the same order of keys, a block of 64
queries against the keys one at a time; its backward is compiled where its forward
was. Everything else (float64, other devices, other sizes) takes the blocks below.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from posenc.core import checks
from posenc.core.kernels import compiled, threads_for
from posenc.integration.attention.layout import (
    BLOCK_SCORES,
    check_qkv,
    documents,
    grouped,
    loop_documents,
)

# keys per block at least, however many queries: fewer make the loop the cost
_MIN_BLOCK = 16


@dataclass(frozen=True)
class _Breaking:
    """How the stick breaks at one call: everything but the tensors autograd tracks."""

    scale: float
    attend_current: bool
    offset: int  # k_len - q_len: the key position of query 0
    block: int  # keys per block
    docs: torch.Tensor | None  # (k_len,) each key position's document, or None
    cu_seqlens: tuple[int, ...] | None  # the documents' bounds, or None


def _blocks(plan: _Breaking, q_len: int, k_len: int) -> list[tuple[int, int, int, int]]:
    """``(first, last, j0, j1)`` per block of keys ``j0 .. j1 - 1``, the last keys first.

    Queries ``first .. last - 1`` are those that may see a key of the block: none
    before it, and with packed documents none past the end of the document of
    its last key (so that packing costs what the documents alone would). Blocks
    that no query sees are left out.
    """
    out = []
    own = 0 if plan.attend_current else 1
    for j1 in range(k_len, 0, -plan.block):
        j0 = max(0, j1 - plan.block)
        first = max(0, j0 + own - plan.offset)
        last = q_len
        if plan.cu_seqlens is not None:
            end = plan.cu_seqlens[bisect.bisect_right(plan.cu_seqlens, j1 - 1)]
            last = min(q_len, end - plan.offset)
        if first < last:
            out.append((first, last, j0, j1))
    return out


def _block_scores(
    plan: _Breaking, qb: torch.Tensor, kb: torch.Tensor, first: int, j0: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores ``(B, H, n, m)`` of queries ``qb`` (``first ..``) against keys ``kb``
    (``j0 ..``), and which of them a query sees (``(1, 1, n, m)`` bool)."""
    hk = kb.shape[1]
    z = torch.matmul(grouped(qb, hk), kb.unsqueeze(2).transpose(-1, -2)).flatten(1, 2)
    z = z * plan.scale
    q_pos = torch.arange(first, first + qb.shape[2], device=qb.device) + plan.offset
    k_pos = torch.arange(j0, j0 + kb.shape[2], device=qb.device)
    seen = k_pos[None, :] <= q_pos[:, None] if plan.attend_current else k_pos < q_pos[:, None]
    if plan.docs is not None:
        seen = seen & (plan.docs[q_pos, None] == plan.docs[None, k_pos])
    return z, seen[None, None]


def _after(x: torch.Tensor) -> torch.Tensor:
    """``sum_{m > j} x[..., m]`` along the last dim (within the block), for every ``j``."""
    inclusive = x.flip(-1).cumsum(-1).flip(-1)
    return F.pad(inclusive[..., 1:], (0, 1))


def _block_weights(
    z: torch.Tensor, seen: torch.Tensor, log_survival: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights ``A`` of a block, and each seen score's ``softplus`` (0 where unseen).

    ``log_survival`` ``(B, H, n)``: minus the softplus summed over the nearer keys,
    those of the blocks already taken.
    """
    # softplus as -logsigmoid(-z): F.softplus returns z itself above its threshold (20),
    # off by up to exp(-20), which float64 would see
    softplus = (-F.logsigmoid(-z)).masked_fill(~seen, 0.0)
    log_a = F.logsigmoid(z) - _after(softplus) + log_survival[..., None]
    return torch.exp(log_a).masked_fill(~seen, 0.0), softplus


def _forward(
    plan: _Breaking, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``out`` and the log of ``rem`` (the final log-survival)."""
    b, h, lq, _ = q.shape
    hk, lk = k.shape[1], k.shape[2]
    out = torch.zeros((b, h, lq, v.shape[-1]), dtype=q.dtype, device=q.device)
    log_rem = torch.zeros((b, h, lq), dtype=q.dtype, device=q.device)
    for first, last, j0, j1 in _blocks(plan, lq, lk):
        z, seen = _block_scores(plan, q[:, :, first:last], k[:, :, j0:j1], first, j0)
        a, softplus = _block_weights(z, seen, log_rem[:, :, first:last])
        o = torch.matmul(grouped(a, hk), v[:, :, j0:j1].unsqueeze(2)).flatten(1, 2)
        out[:, :, first:last] += o
        log_rem[:, :, first:last] -= softplus.sum(-1)
    return out, log_rem


def _backward(
    plan: _Breaking,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    log_rem: torch.Tensor,
    dout: torch.Tensor,
    drem: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv, recomputing the blocks in the forward's order.

    With ``g_ij = A_ij (dout_i . v_j)``, ``log A_ij = z_ij - sum_{m >= j} softplus(z_im)``
    and ``log rem_i = -sum_m softplus(z_im)`` give::

        dz_ij = g_ij - beta_ij (sum_{m <= j} g_im + rem_i drem_i)

    and ``sum_{m <= j} g_im = dout_i . out_i - sum_{m > j} g_im``: the nearer keys'
    share is carried from block to block, as the log-survival is.
    """
    hk, lq, lk = k.shape[1], q.shape[2], k.shape[2]
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    total = (dout * out).sum(-1) + torch.exp(log_rem) * drem  # (B, H, lq)
    log_survival = torch.zeros_like(log_rem)
    nearer = torch.zeros_like(log_rem)  # sum of g over the keys already taken
    for first, last, j0, j1 in _blocks(plan, lq, lk):
        rows = slice(first, last)
        qb, dob = q[:, :, rows], dout[:, :, rows]
        kb, vb = k[:, :, j0:j1], v[:, :, j0:j1]
        z, seen = _block_scores(plan, qb, kb, first, j0)
        a, softplus = _block_weights(z, seen, log_survival[:, :, rows])
        da = torch.matmul(grouped(dob, hk), vb.unsqueeze(2).transpose(-1, -2)).flatten(1, 2)
        g = a * da
        farther = total[:, :, rows, None] - nearer[:, :, rows, None] - _after(g)
        beta = torch.sigmoid(z).masked_fill(~seen, 0.0)
        dz = grouped((g - beta * farther) * plan.scale, hk)
        dq[:, :, rows] += torch.matmul(dz, kb.unsqueeze(2)).flatten(1, 2)
        dk[:, :, j0:j1] += torch.matmul(dz.transpose(-1, -2), grouped(qb, hk)).sum(2)
        dv[:, :, j0:j1] += torch.matmul(grouped(a, hk).transpose(-1, -2), grouped(dob, hk)).sum(2)
        nearer[:, :, rows] += g.sum(-1)
        log_survival[:, :, rows] -= softplus.sum(-1)
    return dq, dk, dv


def _loop_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the compiled loop takes these inputs, forward and backward alike."""
    if compiled is None or not hasattr(compiled, "breaking") or q.device.type != "cpu":
        return False
    if q.dtype != torch.float32 or q.shape[-1] % 16 or v.shape[-1] % 16 or v.shape[-1] == 0:
        return False
    return q.numel() > 0 and all(t.stride(-1) == 1 for t in (q, k, v))


def _loop_place(
    plan: _Breaking, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[list[Any], tuple[torch.Tensor, ...]]:
    """The arguments both compiled loops share after their addresses (sizes, strides,
    attend_current, scale, threads, the query offset and the documents: ``(qdoc,
    kdoc)``, the addresses of int32 ``(batch, q_len)`` and ``(batch, k_len)``), and
    the tensors those addresses point into, for the caller to hold during the call."""
    b, h, lq, d = q.shape
    hk, lk = k.shape[1], k.shape[2]
    threads = threads_for(b * h * ((lq + 63) // 64))
    held = loop_documents(plan.docs, b, plan.offset, lq) or ()
    docs = (held[0].data_ptr(), held[1].data_ptr()) if held else None
    return [
        [b, h, hk, lq, lk, d, v.shape[-1]],
        list(q.stride()[:3]), list(k.stride()[:3]), list(v.stride()[:3]),
        plan.attend_current, plan.scale, threads, plan.offset, docs,
    ], held  # fmt: skip


def _loop_forward(
    plan: _Breaking, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``out`` and the log of ``rem`` from the compiled loop, or None where it has none."""
    assert compiled is not None
    b, h, lq, _ = q.shape
    out = torch.empty((b, h, lq, v.shape[-1]), dtype=torch.float32)
    log_rem = torch.empty((b, h, lq), dtype=torch.float32)
    place, held = _loop_place(plan, q, k, v)
    done = compiled.breaking(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), log_rem.data_ptr(), *place
    )
    del held  # the documents, read by the loop until here
    return (out, log_rem) if done else None


def _loop_backward(
    plan: _Breaking,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    log_rem: torch.Tensor,
    dout: torch.Tensor,
    drem: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv from the compiled loop (``_backward``'s formulas), of a forward the
    compiled loop made."""
    assert compiled is not None
    total = ((dout * out).sum(-1) + torch.exp(log_rem) * drem).contiguous()
    dq, dk, dv = (torch.zeros_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    place, held = _loop_place(plan, q, k, v)
    done = compiled.breaking_backward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr(), total.data_ptr(),
        dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), *place,
    )  # fmt: skip
    del held  # the documents, read by the loop until here
    if not done:  # no loop (_loop_applies asked for none that it lacks): the blocks
        return _backward(plan, q, k, v, out, log_rem, dout, drem)
    return dq, dk, dv


class _StickBreaking(torch.autograd.Function):
    """Stick-breaking attention whose backward recomputes each block of keys."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Breaking
    ) -> tuple[torch.Tensor, torch.Tensor]:
        made = _loop_forward(plan, q, k, v) if _loop_applies(q, k, v) else None
        out, log_rem = made if made is not None else _forward(plan, q, k, v)
        ctx.plan = plan
        ctx.looped = made is not None
        ctx.save_for_backward(q, k, v, out, log_rem)
        return out, torch.exp(log_rem)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dout: torch.Tensor, drem: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, log_rem = ctx.saved_tensors
        backward = _loop_backward if ctx.looped else _backward
        grads = backward(ctx.plan, q, k, v, out, log_rem, dout.contiguous(), drem.contiguous())
        return (*grads, None)


def stick_breaking_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attend_current: bool = False,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    block_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stick-breaking attention: each key takes a sigmoid's share of what nearer keys left.

    ``A_ij = sigmoid(z_ij) * prod_{j < m < i} (1 - sigmoid(z_im))`` over keys
    ``j < i`` (``z_ij = q_i . k_j * scale``), no softmax and no normalisation;
    ``out_i = sum_j A_ij v_j`` and ``rem_i = 1 - sum_j A_ij``, the share no key
    took. Causal by construction. The formula of ``sb_ref.stickbreaking`` (the
    tests' reference) and of the ``sb_attn`` / ``sb_attn_varlen`` GPU kernels of
    shawntan/stickbreaking-attention (Tan et al. 2024), computed in log space in
    blocks of keys: memory O(q_len * block_size), never ``(q_len, k_len)``.

    The caller decides where ``rem`` goes; the reference's tests give it to the
    query's own value, dolomite-engine to a learned vector per head::

        out, rem = posenc.stick_breaking_attention(q, k, v)
        y = out + rem[..., None] * v          # heads == kv_heads, q_len == k_len
        y = out + rem[..., None] * head_bias[None, :, None, :]  # (heads, v_dim)

    Args:
        q: ``(batch, heads, q_len, head_dim)``; queries aligned bottom-right:
            query ``i`` sits at key position ``i + k_len - q_len`` (a KV cache
            holds the earlier keys).
        k: ``(batch, kv_heads, k_len, head_dim)``; ``heads`` a multiple of
            ``kv_heads`` (grouped-query attention).
        v: ``(batch, kv_heads, k_len, v_dim)``.
        attend_current: also the query's own key (``j <= i``), the first to break
            the stick, as the reference's ``attend_current`` flag.
        scale: score scale; ``1 / sqrt(head_dim)`` by default (the reference's
            ``inv_temp``).
        cu_seqlens: packed documents: ``(n + 1,)`` ints rising from 0 to ``k_len``
            (flash-attn's varlen convention), the same for every row of the batch.
            Each query sees only keys of its own document: the result equals
            running every document alone.
        block_size: keys per block; by default as many as keep a block's scores
            under 2^20 elements, at least 16. Memory and time only: the result is
            the same up to rounding. The compiled loop (float32 on CPU, head_dim
            and v_dim multiples of 16) takes its own blocks of 64 queries and keys.

    Returns:
        ``(out, rem)``: ``(batch, heads, q_len, v_dim)`` and ``(batch, heads,
        q_len)`` in q's dtype; ``rem`` in ``[0, 1]`` (computed as ``prod (1 -
        beta)``, which equals ``1 - sum A``). float16/bfloat16 inputs are computed
        in float32, float64 in float64. A query that sees no key gets ``out = 0``
        and ``rem = 1``.

    Raises:
        TypeError: non-float or mixed-dtype q/k/v; ``attend_current`` not a bool;
            ``block_size`` not an int; ``cu_seqlens`` not an int tensor.
        ValueError: shapes that do not match (batch, head_dim, lengths, heads not
            a multiple of kv_heads); ``q_len > k_len``; a non-positive scale or
            block size; ``cu_seqlens`` not rising from 0 to ``k_len``; a block or
            result of more than ``posenc.core.checks.MAX_ELEMENTS`` elements.

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 4, 8, 16).unbind(0)  # (batch, heads, seq, head_dim)
        >>> out, rem = posenc.stick_breaking_attention(q, k, v)
        >>> out.shape, rem.shape
        (torch.Size([1, 4, 8, 16]), torch.Size([1, 4, 8]))
        >>> rem[0, 0, 0].item()  # the first query sees no key: the whole stick is left
        1.0
        >>> y = out + rem[..., None] * v  # the rest to the query's own value
    """
    check_qkv(q, k, v)
    checks.check_bool(attend_current, "attend_current")
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    if lq > lk:
        raise ValueError(
            f"stick-breaking attention is causal: q_len must be <= k_len (queries are the "
            f"last keys); got q_len={lq}, k_len={lk}"
        )
    scale = checks.check_number(
        1.0 / math.sqrt(d) if scale is None else scale, "scale", positive=True
    )
    rows = b * h * lq
    if block_size is None:
        block_size = max(_MIN_BLOCK, BLOCK_SCORES // max(1, rows))
    block_size = min(checks.check_int(block_size, "block_size", 1), lk)
    checks.check_elements(
        rows * max(dv, 1), "stick-breaking attention's output (batch, heads, q_len, v_dim)"
    )
    checks.check_elements(rows * block_size, "a block of scores (batch, heads, q_len, block_size)")
    docs = documents(cu_seqlens, None, b, lk, q.device)
    bounds = None if cu_seqlens is None else tuple(int(c) for c in cu_seqlens.tolist())
    plan = _Breaking(
        scale, attend_current, lk - lq, block_size, None if docs is None else docs[0][0], bounds
    )
    dtype = q.dtype
    work = checks.work_dtype(dtype)
    q, k, v = q.to(work), k.to(work), v.to(work)
    if torch.compiler.is_compiling() and _loop_applies(q, k, v):
        # the compiled loop is opaque to the tracer: a graph break around it, and
        # autograd records it as in eager mode (the blocks trace as they are)
        out, rem = _eager_apply(q, k, v, plan)
    else:
        out, rem = _StickBreaking.apply(q, k, v, plan)
    return out.to(dtype), rem.to(dtype)


_DISABLED: list[Any] = []


def _eager_apply(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`_StickBreaking` outside the tracer; ``torch.compiler.disable`` is made on
    the first compiled call, so a process that never compiles never imports dynamo."""
    if not _DISABLED:
        _DISABLED.append(torch.compiler.disable(_StickBreaking.apply))
    out, rem = _DISABLED[0](*args)
    return out, rem
