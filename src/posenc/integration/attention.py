"""``posenc.attention``: attention with RoPE and/or bias, in linear memory.

Shapes::

    q     (batch, heads, q_len, head_dim)
    k     (batch, kv_heads, k_len, head_dim)     heads % kv_heads == 0 (GQA)
    v     (batch, kv_heads, k_len, v_dim)
    out   (batch, heads, q_len, v_dim)

Queries are aligned bottom-right: query ``i`` sits at key position ``i + k_len -
q_len`` (a KV cache holds the earlier keys). ``scores = q . k * scale + bias``,
the bias from an :class:`posenc.bias.AttentionBias` (multiplied by ``scale``
too when the module says ``scale_with_logits``).

No path builds a ``(batch, heads, q_len, k_len)`` tensor:

- ``"kernel"`` (CPU, float32): the compiled flash-attention loop of
  ``posenc.core._kernels.attend``, with a bias that depends on ``key - query`` read
  from one ``(heads, q_len + k_len - 1)`` table;
- ``"blockwise"`` (any device): exact softmax over blocks of queries, every key
  at once, in torch ops; the backward recomputes each block from the saved
  log-sum-exp (as flash attention does), so training needs O(q_len) memory
  beyond a block;
- ``"flex"``: ``torch.nn.attention.flex_attention`` with a score mod and a block
  mask, compiled: what ``"auto"`` takes on GPUs. On this CPU compiled flex
  measured 6x slower than SDPA and has no backward, so ``"auto"`` takes the
  kernel (or blockwise) there, also inside ``torch.compile`` (a graph break).

The forward of ``"kernel"`` and ``"blockwise"`` goes through one autograd
function; gradients reach q, k, v and the bias module's parameters. Its
backward is compiled where the forward was (``attend_backward``: flash-attention
2, the table's gradient summed along its diagonals, from which autograd reaches
the module's parameters) and else the blockwise recomputation (float64, other
devices, a head_dim or v_dim that is no multiple of 16).

FIRE's bias depends on ``key - query`` only for queries below its threshold
``L``: those take the table (every query, when all are below ``L``; under a
causal mask the queries below ``L`` attend apart, with the keys they see, and the
rest block by block; bidirectional with queries at or past ``L``, every query
goes block by block).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posenc.core import checks
from posenc.core.kernels import compiled
from posenc.families.bias.modules import AttentionBias, NoPE

__all__ = ["attention"]

BACKENDS = ("auto", "kernel", "blockwise", "flex")

# Scores per block of the blockwise path (4 MiB of float32): a block is a run of
# queries against every key, so its softmax is exact without rescaling.
_BLOCK_SCORES = 1 << 20

BiasFn = Callable[[Sequence[torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class _Plan:
    """Everything but the tensors autograd tracks: how to score a block."""

    bias_fn: BiasFn | None  # (params, q_pos (n,), k_pos (m,)) -> (heads, n, m)
    causal: bool
    scale: float
    key_mask: torch.Tensor | None  # (batch, k_len) bool, True = attend
    offset: int  # k_len - q_len: the key position of query 0
    kernel_table: bool  # the bias is params[0], a table over key - query (or None)


def _check_inputs(q: Any, k: Any, v: Any) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.check_float_tensor(t, name)
        if t.ndim != 4:
            raise ValueError(f"{name} must be (batch, heads, seq, dim); got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(
            f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}"
        )
    (b, h, _, d), (bk, hk, lk, dk), (bv, hv, lv, _) = q.shape, k.shape, v.shape
    if not b == bk == bv:
        raise ValueError(f"q, k and v must share the batch size; got {b}, {bk}, {bv}")
    if dk != d:
        raise ValueError(f"q and k must share head_dim; got {d} and {dk}")
    if (hk, lk) != (hv, lv):
        raise ValueError(
            f"k and v must have the same heads and length; got k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    if hk < 1 or h % hk:
        raise ValueError(f"q's heads ({h}) must be a multiple of k's and v's heads ({hk})")
    if d < 1:
        # scores of no channels are all 0 and the default scale 1 / sqrt(0) has no value
        raise ValueError(f"head_dim (the last dim of q and k) must be >= 1; got q {tuple(q.shape)}")
    if min(q.shape[2], lk) < 1:
        raise ValueError(f"q_len and k_len must be >= 1; got {q.shape[2]} and {lk}")


def _key_mask(mask: Any, batch: int, k_len: int, device: torch.device) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor) or mask.is_floating_point() or mask.is_complex():
        shown = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(
            f"attention_mask must be a bool or int tensor (1 = attend, 0 = padding); got {shown}"
        )
    if tuple(mask.shape) != (batch, k_len):
        raise ValueError(
            f"attention_mask must be (batch, k_len) = ({batch}, {k_len}); got {tuple(mask.shape)}"
        )
    return mask.to(device=device, dtype=torch.bool)


def _rotate(
    rotary: Any, q: torch.Tensor, k: torch.Tensor, offset: int
) -> tuple[torch.Tensor, torch.Tensor]:
    from posenc.families.rotary.apply import apply_rotary

    for attr in ("cos_sin", "layout", "rotary_dim", "head_dim"):
        if not hasattr(rotary, attr):
            raise TypeError(f"rotary must be a posenc.Rotary; got {type(rotary).__name__}")
    if q.shape[-1] != rotary.head_dim:
        raise ValueError(
            f"rotary has head_dim={rotary.head_dim}; q and k have {q.shape[-1]} channels"
        )
    pos = torch.arange(k.shape[2], device=q.device)
    c, s = rotary.cos_sin(pos)
    kw = {"layout": rotary.layout, "rotary_dim": rotary.rotary_dim}
    return apply_rotary(q, c[offset:], s[offset:], **kw), apply_rotary(k, c, s, **kw)


def _bias_plan(
    bias: AttentionBias,
    heads: int,
    q_len: int,
    k_len: int,
    scale: float,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[BiasFn, tuple[torch.Tensor, ...], bool]:
    """The bias as a block function of its tensors, the tensors, and whether they are a table.

    A bias of ``key - query`` is evaluated once over the ``q_len + k_len - 1``
    relative positions (``-(k_len - 1) .. q_len - 1``) into a ``(heads, n)``
    table that blocks index; autograd carries the table's gradient back to
    the module's parameters. Other biases (FIRE) are evaluated per block. The
    bias is cast to ``dtype``, the scores' (float64 attention keeps a float64
    module's bias float64, gradients included).
    """
    factor = scale if bias.scale_with_logits else 1.0
    if bias.relative or bias.relative_below() > k_len - 1:
        # every query's bias is one of key - query (FIRE's queries below its threshold)
        rel = torch.arange(-(k_len - 1), q_len, device=device)
        table = bias.relative_bias(rel).to(dtype)
        if factor != 1.0:
            table = table * factor
        if tuple(table.shape) != (heads, q_len + k_len - 1):
            raise ValueError(
                f"{type(bias).__name__}.relative_bias gave shape {tuple(table.shape)}; "
                f"expected ({heads}, {q_len + k_len - 1})"
            )

        def from_table(
            params: Sequence[torch.Tensor], q_pos: torch.Tensor, k_pos: torch.Tensor
        ) -> torch.Tensor:
            index = k_pos[None, :] - q_pos[:, None] + (k_len - 1)
            return params[0][:, index]

        return from_table, (table,), True

    params = tuple(p for p in bias.parameters() if p.requires_grad)

    def per_block(
        _: Sequence[torch.Tensor], q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> torch.Tensor:
        out = bias(q_pos[:, None], k_pos[None, :]).to(dtype)
        return out * factor if factor != 1.0 else out

    return per_block, params, False


def _grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``(B, H, ...)`` -> ``(B, kv_heads, H / kv_heads, ...)`` (a view)."""
    b, h = x.shape[:2]
    return x.view(b, kv_heads, h // kv_heads, *x.shape[2:])


def _block_scores(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    qb: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
) -> torch.Tensor:
    """Masked scores ``(B, H, n, k_len)`` of a block of queries ``qb`` (B, H, n, D)."""
    hk = k.shape[1]
    s = torch.matmul(_grouped(qb, hk), k.unsqueeze(2).transpose(-1, -2)).flatten(1, 2)
    s = s * plan.scale
    if plan.bias_fn is not None:
        s = s + plan.bias_fn(params, q_pos, k_pos)
    allowed = None
    if plan.causal:
        allowed = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if plan.key_mask is not None:
        km = plan.key_mask[:, None, None, :]
        allowed = km if allowed is None else allowed & km
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return s


def _safe(lse: torch.Tensor) -> torch.Tensor:
    """The log-sum-exp with rows that see no key (-inf) set to 0: their weights are all 0.

    A NaN or +inf one (a score that is NaN or +inf) stays, so that the row's
    weights and output are NaN, as softmax gives.
    """
    return lse.masked_fill(lse == float("-inf"), 0.0)


def _blocks(batch: int, heads: int, q_len: int, k_len: int) -> int:
    return max(1, min(q_len, _BLOCK_SCORES // max(1, batch * heads * k_len)))


def _forward_blockwise(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    b, h, lq, _ = q.shape
    hk, lk = k.shape[1], k.shape[2]
    out = torch.empty((b, h, lq, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, lq), dtype=q.dtype, device=q.device)
    k_pos = torch.arange(lk, device=q.device)
    step = _blocks(b, h, lq, lk)
    for i0 in range(0, lq, step):
        i1 = min(lq, i0 + step)
        q_pos = torch.arange(i0, i1, device=q.device) + plan.offset
        s = _block_scores(plan, params, q[:, :, i0:i1], k, q_pos, k_pos)
        m = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - _safe(m)[..., None])
        o = torch.matmul(_grouped(p, hk), v.unsqueeze(2)).flatten(1, 2)
        out[:, :, i0:i1] = o
        lse[:, :, i0:i1] = m
    return out, lse


def _forward_kernel(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The compiled forward, or None where it does not apply (the caller goes blockwise)."""
    if compiled is None or not hasattr(compiled, "attend") or q.device.type != "cpu":
        return None
    if q.dtype != torch.float32 or (plan.bias_fn is not None and not plan.kernel_table):
        return None
    if q.shape[0] * q.shape[1] * v.shape[-1] == 0:  # an empty result: nothing to loop over
        return None
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return None
    b, h, lq, _ = q.shape
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    out = torch.empty((b, h, lq, dv), dtype=torch.float32)
    lse = torch.empty((b, h, lq), dtype=torch.float32)
    table, mask = _kernel_operands(plan, params)
    threads = min(torch.get_num_threads(), max(1, b * h * ((lq + 63) // 64)))
    done = compiled.attend(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        0 if table is None else table.data_ptr(), 0 if mask is None else mask.data_ptr(),
        [b, h, hk, lq, lk, q.shape[-1], dv],
        list(q.stride()[:3]), list(k.stride()[:3]), list(v.stride()[:3]),
        plan.causal, plan.scale, threads,
    )  # fmt: skip
    return (out, lse) if done else None


def _kernel_operands(
    plan: _Plan, params: Sequence[torch.Tensor]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The bias table and the key mask as both compiled loops read them (or None)."""
    table = None
    if plan.bias_fn is not None:
        # reversed, so that a row of keys reads it forwards: see core/csrc/attend.c
        table = params[0].detach().float().flip(-1).contiguous()
    mask = None
    if plan.key_mask is not None:
        mask = plan.key_mask.to(torch.uint8).contiguous()
    return table, mask


def _bias_grads(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    wanted: Sequence[bool],
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    dbias: torch.Tensor,
    dparams: list[torch.Tensor | None],
) -> None:
    """Add the gradient of the bias tensors for one block (``dbias``: (heads, n, k_len))."""
    assert plan.bias_fn is not None
    with torch.enable_grad():
        if plan.kernel_table:  # the table itself: differentiate the gather from it
            leaves = [params[0].detach().requires_grad_(True)]
            block = plan.bias_fn(leaves, q_pos, k_pos)
        else:  # the module's parameters, which the block is computed from
            leaves = [p for p, w in zip(params, wanted, strict=True) if w]
            block = plan.bias_fn(params, q_pos, k_pos)
        grads = iter(torch.autograd.grad(block, leaves, dbias, allow_unused=True))
    for n, w in enumerate(wanted):
        if w:
            g, prev = next(grads), dparams[n]
            if g is not None:
                dparams[n] = g if prev is None else prev + g


def _backward_blockwise(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    wanted: Sequence[bool],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    delta: torch.Tensor,
) -> tuple[torch.Tensor | None, ...]:
    """dq, dk, dv and the bias tensors' gradients, block by block in torch ops."""
    b, h, lq, _ = q.shape
    hk, lk = k.shape[1], k.shape[2]
    dq = torch.empty_like(q)
    dk = torch.zeros((b, hk, lk, k.shape[-1]), dtype=q.dtype, device=q.device)
    dv = torch.zeros_like(v)
    dparams: list[torch.Tensor | None] = [None] * len(params)
    k_pos = torch.arange(lk, device=q.device)
    step = _blocks(b, h, lq, lk)
    for i0 in range(0, lq, step):
        i1 = min(lq, i0 + step)
        q_pos = torch.arange(i0, i1, device=q.device) + plan.offset
        qb, dob = q[:, :, i0:i1], dout[:, :, i0:i1]
        with torch.no_grad():
            s = _block_scores(plan, params, qb, k, q_pos, k_pos)
            p = torch.exp(s - _safe(lse[:, :, i0:i1])[..., None])
            dv += torch.matmul(_grouped(p, hk).transpose(-1, -2), _grouped(dob, hk)).sum(2)
            dp = torch.matmul(_grouped(dob, hk), v.unsqueeze(2).transpose(-1, -2))
            ds = p * (dp.flatten(1, 2) - delta[:, :, i0:i1, None])
            dq[:, :, i0:i1] = (
                torch.matmul(_grouped(ds, hk), k.unsqueeze(2)).flatten(1, 2) * plan.scale
            )
            dk += (
                torch.matmul(_grouped(ds, hk).transpose(-1, -2), _grouped(qb, hk)).sum(2)
                * plan.scale
            )
        if plan.bias_fn is not None and any(wanted):
            _bias_grads(plan, params, wanted, q_pos, k_pos, ds.sum(0), dparams)
    return (dq, dk, dv, *dparams)


def _backward_kernel(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    wanted: Sequence[bool],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    delta: torch.Tensor,
) -> tuple[torch.Tensor | None, ...] | None:
    """The compiled backward of a compiled forward: dq, dk, dv and the table's gradient.

    None where it has no loop (the caller goes blockwise). The table's gradient
    is the score gradient summed per head along each diagonal ``key - query``;
    autograd carries it on to the bias module's parameters.
    """
    if compiled is None or not hasattr(compiled, "attend_backward"):
        return None
    b, h, lq, d = q.shape
    hk, lk, dv_dim = k.shape[1], k.shape[2], v.shape[-1]
    table, mask = _kernel_operands(plan, params)  # as the forward read them
    dtable = torch.zeros_like(table) if table is not None and wanted[0] else None
    dq = torch.zeros((b, h, lq, d), dtype=torch.float32)
    dk = torch.empty((b, hk, lk, d), dtype=torch.float32)
    dv = torch.empty((b, hk, lk, dv_dim), dtype=torch.float32)
    delta = delta.contiguous()
    threads = min(torch.get_num_threads(), max(1, b * hk * ((lk + 63) // 64)))
    done = compiled.attend_backward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), lse.data_ptr(), dout.data_ptr(),
        delta.data_ptr(), 0 if table is None else table.data_ptr(),
        0 if mask is None else mask.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
        0 if dtable is None else dtable.data_ptr(),
        [b, h, hk, lq, lk, d, dv_dim],
        list(q.stride()[:3]), list(k.stride()[:3]), list(v.stride()[:3]),
        plan.causal, plan.scale, threads,
    )  # fmt: skip
    if not done:
        return None
    return (dq, dk, dv, None if dtable is None else dtable.flip(-1))


class _Attention(torch.autograd.Function):
    """Attention whose backward recomputes scores block by block from the log-sum-exp:
    compiled when the forward was, else in torch ops."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        plan: _Plan,
        use_kernel: bool,
        *params: torch.Tensor,
    ) -> torch.Tensor:
        result = _forward_kernel(plan, params, q, k, v) if use_kernel else None
        out, lse = result if result is not None else _forward_blockwise(plan, params, q, k, v)
        ctx.plan = plan
        ctx.kernel = result is not None  # float32 on the CPU, the bias a table or none
        ctx.save_for_backward(q, k, v, out, lse, *params)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        plan: _Plan = ctx.plan
        q, k, v, out, lse, *params = ctx.saved_tensors
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        wanted = [p.requires_grad for p in params]
        grads = None
        if ctx.kernel:
            grads = _backward_kernel(plan, params, wanted, q, k, v, lse, dout, delta)
        if grads is None:
            grads = _backward_blockwise(plan, params, wanted, q, k, v, lse, dout, delta)
        return (*grads[:3], None, None, *grads[3:])


def _flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: _Plan,
    params: Sequence[torch.Tensor],
    bias: AttentionBias | None,
) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, h, lq, _ = q.shape
    lk = k.shape[2]
    offset, key_mask = plan.offset, plan.key_mask
    table = params[0] if plan.kernel_table else None
    factor = plan.scale if bias is not None and bias.scale_with_logits else 1.0

    def score_mod(score: Any, bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
        if table is not None:
            return score + table[hi, ki - qi - offset + (lk - 1)]
        if bias is not None and not isinstance(bias, NoPE):
            return score + bias.score(hi, qi + offset, ki) * factor
        return score

    def mask_mod(bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
        keep = ki >= 0
        if plan.causal:
            keep = keep & (ki <= qi + offset)
        if key_mask is not None:
            keep = keep & key_mask[bi, ki]
        return keep

    compiling = torch.compiler.is_compiling()
    block_mask = None
    if plan.causal or key_mask is not None:
        # eager create_block_mask materialises the dense (B, H, q_len, k_len) mask
        # first; compiled, it evaluates mask_mod block by block
        make_mask = create_block_mask if compiling else _compiled(create_block_mask)
        block_mask = make_mask(
            mask_mod, None if key_mask is None else b, None, lq, lk, device=q.device
        )
    run = flex_attention if compiling else _compiled(flex_attention)
    out: torch.Tensor = run(
        q, k, v, score_mod=score_mod, block_mask=block_mask, scale=plan.scale,
        enable_gqa=h != k.shape[1],
    )  # fmt: skip
    return out


_COMPILED: dict[Any, Any] = {}


def _compiled(fn: Any) -> Any:
    """``torch.compile(fn)``, made once per process (FlexAttention runs compiled only)."""
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn)
    return _COMPILED[fn]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    bias: AttentionBias | None = None,
    rotary: Any = None,
    causal: bool = False,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Softmax attention with a rotary encoding and/or a bias, without quadratic memory.

    ``softmax(q . k * scale + bias + mask) v`` per head, queries aligned
    bottom-right (query ``i`` is key position ``i + k_len - q_len``): a KV
    cache (``q_len < k_len``) gets the distances and the causal mask right.

    Args:
        q: ``(batch, heads, q_len, head_dim)``.
        k: ``(batch, kv_heads, k_len, head_dim)``; ``heads`` a multiple of
            ``kv_heads`` (grouped-query attention).
        v: ``(batch, kv_heads, k_len, v_dim)``.
        bias: an :class:`posenc.bias.AttentionBias` with ``heads`` heads (ALiBi,
            T5Bias, KERPLE, FIRE, Sandwich, NoPE), added to the scaled scores.
        rotary: a :class:`posenc.Rotary`; rotates q at positions ``k_len - q_len
            .. k_len - 1`` and k at ``0 .. k_len - 1`` (pass keys already
            rotated, and no rotary, if your cache stores them rotated).
        causal: each query sees keys up to its own position only.
        scale: score scale; ``1 / sqrt(head_dim)`` by default (T5 uses 1.0).
        attention_mask: ``(batch, k_len)`` bool or int, 1 / True for keys to
            attend, 0 / False for padding (HF's convention). A query that sees
            no key gets a zero output. A NaN or infinite input gives what
            softmax gives, never a zero: a NaN or +inf score makes its
            query's row NaN, an infinite value its column infinite.
        backend: ``"auto"``, ``"kernel"`` (CPU float32; falls back to blockwise
            where it does not apply), ``"blockwise"`` or ``"flex"`` (compiled
            FlexAttention; on CPU forward only).

    Returns:
        ``(batch, heads, q_len, v_dim)`` in q's dtype. float16/bfloat16 inputs
        are computed in float32, float64 ones in float64 (the bias too). An
        empty batch, no heads or ``v_dim = 0`` give the empty result on every
        backend.

    Raises:
        TypeError: non-float or mixed-dtype q/k/v; a bias that is not an
            AttentionBias; a bad mask type.
        ValueError: shapes that do not match (batch, head_dim, lengths, heads
            not a multiple of kv_heads); ``head_dim = 0`` (scores of no
            channels: not attention); bias heads not q's heads; a causal
            request with ``q_len > k_len``; a mask of the wrong shape; an
            unknown backend; a non-positive scale.
    """
    _check_inputs(q, k, v)
    checks.check_choice(backend, "backend", BACKENDS)
    checks.check_bool(causal, "causal")
    b, h, lq, d = q.shape
    lk = k.shape[2]
    if causal and lq > lk:
        raise ValueError(
            f"causal attention needs q_len <= k_len (queries are the last keys); got "
            f"q_len={lq}, k_len={lk}"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    scale = checks.check_number(scale, "scale", positive=True)
    if bias is not None:
        if not isinstance(bias, AttentionBias):
            raise TypeError(f"bias must be a posenc.bias.AttentionBias; got {type(bias).__name__}")
        if bias.num_heads != h:
            raise ValueError(f"bias has {bias.num_heads} heads; q has {h}")
    key_mask = None if attention_mask is None else _key_mask(attention_mask, b, lk, q.device)
    offset = lk - lq
    if rotary is not None:
        q, k = _rotate(rotary, q, k, offset)
    dtype = q.dtype
    if dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()

    if backend == "auto":
        backend = "kernel" if q.device.type == "cpu" else "flex"
    split = _table_rows(bias, causal, lq, lk) if backend != "flex" else 0
    if split:
        # FIRE: queries below its threshold L take a table of key - query (and the
        # compiled loop); each query's softmax is its own, so the rest attend apart
        head = _attend(
            q[:, :, :split],
            k[:, :, : offset + split],
            v[:, :, : offset + split],
            bias,
            causal,
            scale,
            None if key_mask is None else key_mask[:, : offset + split],
            backend,
        )
        tail = _attend(q[:, :, split:], k, v, bias, causal, scale, key_mask, backend)
        out = torch.cat((head, tail), dim=2)
    else:
        out = _attend(q, k, v, bias, causal, scale, key_mask, backend)
    return out.to(dtype)


def _table_rows(bias: AttentionBias | None, causal: bool, q_len: int, k_len: int) -> int:
    """How many leading queries to attend apart with a table (0: attend all at once).

    For a bias that depends on ``key - query`` only below a query position (FIRE's
    threshold), under a causal mask: the queries below it see only the keys up to
    them, so they attend as a bottom-right aligned call of their own.
    """
    if bias is None or bias.relative or not causal:
        return 0
    below = bias.relative_below()
    first = k_len - q_len  # the position of query 0
    if not math.isfinite(below) or below <= first or below > k_len - 1:
        return 0  # no query, or every query, has a bias of key - query
    return math.ceil(below) - first


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: AttentionBias | None,
    causal: bool,
    scale: float,
    key_mask: torch.Tensor | None,
    backend: str,
) -> torch.Tensor:
    """Attention of prepared inputs (rotated, float32 or float64), queries bottom-right."""
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    bias_fn: BiasFn | None = None
    params: tuple[torch.Tensor, ...] = ()
    table = False
    if bias is not None and not isinstance(bias, NoPE):
        bias_fn, params, table = _bias_plan(bias, h, lq, lk, scale, q.device, q.dtype)
    plan = _Plan(bias_fn, causal, scale, key_mask, lk - lq, table)

    if backend == "flex" and b * h * v.shape[-1] > 0:
        return _flex(q, k, v, plan, params, bias)
    if torch.compiler.is_compiling():
        # the compiled loop is opaque to the tracer: a graph break around it, and
        # autograd records it as in eager mode (CPU FlexAttention has no backward,
        # and inductor's CPU flex template cannot read a table made in the graph)
        return _eager_apply(q, k, v, plan, backend == "kernel", *params)
    out: torch.Tensor = _Attention.apply(q, k, v, plan, backend == "kernel", *params)
    return out


@torch.compiler.disable
def _eager_apply(*args: Any) -> torch.Tensor:
    out: torch.Tensor = _Attention.apply(*args)
    return out
