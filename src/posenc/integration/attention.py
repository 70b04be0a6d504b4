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
  mask, compiled: what ``"auto"`` takes on GPUs. Its block masks are made once
  per shapes and masks and reused across calls and layers, and a call at shapes
  already seen compiles nothing (a decode step neither, once torch has made the
  key length dynamic); float16/bfloat16 inputs go in as they are. On this CPU
  compiled flex measured 6x slower than SDPA and has no backward, so ``"auto"``
  takes the kernel (or blockwise) there, also inside ``torch.compile`` (a graph
  break).

The forward of ``"kernel"`` and ``"blockwise"`` goes through one autograd
function; gradients reach q, k, v and the bias module's parameters. Its
backward is compiled where the forward was (``attend_backward``: flash-attention
2, the table's gradient summed along its diagonals, from which autograd reaches
the module's parameters) and else the blockwise recomputation (float64, other
devices, a head_dim or v_dim that is no multiple of 16).

FIRE's bias depends on ``key - query`` only for queries below its threshold
``L``: when every query is, it takes the table. Otherwise its
:meth:`~posenc.bias.AttentionBias.scaled_form` does: the MLP as linear pieces of
``x = table[key - query] * scale[query]``, which the compiled loops evaluate per
score (a search over at most 63 knots; more, and the blockwise path evaluates the
same pieces) and differentiate into the table, the scales, and each piece's slope
and intercept, from which autograd reaches the MLP, ``c`` and ``L``.

CoPE (``cope=``) and DAPE (a :class:`posenc.DAPE` as ``bias=``) read the
scores themselves, which no additive bias can give: once the inputs are
prepared here, :mod:`posenc.integration.contextual` computes them blockwise in
torch (``"auto"`` and ``"kernel"`` go there; ``"flex"`` is refused).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posenc.core import checks
from posenc.core.kernels import compiled
from posenc.core.positions import document_positions, packed_document_ids, packed_positions
from posenc.families.bias.modules import AttentionBias, NoPE, ScaledForm
from posenc.families.contextual import DAPE, CoPE
from posenc.integration import contextual
from posenc.integration._blocks import allowed, grouped

__all__ = ["attention"]

BACKENDS = ("auto", "kernel", "blockwise", "flex")

# inputs FlexAttention takes as they are and the other paths compute in float32
_LOW_PRECISION = (torch.float16, torch.bfloat16)

# Scores per block of the blockwise path (4 MiB of float32): a block is a run of
# queries against every key, so its softmax is exact without rescaling.
_BLOCK_SCORES = 1 << 20

# The compiled loops keep a scaled form's knots in four vectors of 16, one a +inf pad
_MAX_KNOTS = 63

BiasFn = Callable[[Sequence[torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class _Plan:
    """Everything but the tensors autograd tracks: how to score a block."""

    bias_fn: BiasFn | None  # (params, q_pos (n,), k_pos (m,)) -> (heads, n, m)
    causal: bool
    scale: float
    key_mask: torch.Tensor | None  # (batch, k_len) bool, True = attend
    offset: int  # k_len - q_len: the key position of query 0
    # "table": params are a table over key - query; "scaled": a ScaledForm's table,
    # scale, slopes and intercepts (its knots here); None: none, or the module's own
    form: str | None
    knots: torch.Tensor | None = None
    # packed sequences: each key position's document, (1 or batch, k_len), numbers
    # that never decrease along a row; a score is masked across documents
    docs: torch.Tensor | None = None
    # the Forgetting Transformer's gate: the last tracked tensor is c (batch, heads,
    # k_len), and a score gains c[query's key position] - c[key]
    gated: bool = False


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
    rotary: Any, q: torch.Tensor, k: torch.Tensor, offset: int, local: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated at their key positions, or at ``local`` ones (1 or batch, k_len)."""
    from posenc.families.rotary.apply import rotate_all

    for attr in ("cos_sin", "layout", "rotary_dim", "head_dim"):
        if not hasattr(rotary, attr):
            raise TypeError(f"rotary must be a posenc.Rotary; got {type(rotary).__name__}")
    if q.shape[-1] != rotary.head_dim:
        raise ValueError(
            f"rotary has head_dim={rotary.head_dim}; q and k have {q.shape[-1]} channels"
        )
    if local is None:
        c, s = rotary.cos_sin(torch.arange(k.shape[2], device=q.device))
    else:  # positions restart in every document: (rows, k_len, rotary_dim), per head
        c, s = (t[:, None] for t in rotary.cos_sin(local))
    kw = {"layout": rotary.layout, "rotary_dim": rotary.rotary_dim}
    if offset == 0:  # queries at the keys' positions: one launch rotates both on CUDA
        q, k = rotate_all((q, k), c, s, **kw)
    else:
        (q,) = rotate_all((q,), c[..., offset:, :], s[..., offset:, :], **kw)
        (k,) = rotate_all((k,), c, s, **kw)
    return q, k


def _bias_plan(
    bias: AttentionBias,
    heads: int,
    q_len: int,
    k_len: int,
    scale: float,
    device: torch.device,
    dtype: torch.dtype,
    pieces: bool = True,
    local: torch.Tensor | None = None,
) -> tuple[BiasFn, tuple[torch.Tensor, ...], str | None, torch.Tensor | None]:
    """The bias as a block function of its tensors, the tensors, their form, and knots.

    A bias of ``key - query`` is evaluated once over the ``q_len + k_len - 1``
    relative positions (``-(k_len - 1) .. q_len - 1``) into a ``(heads, n)``
    table that blocks index ("table"); one with a scaled form (FIRE) into that
    form's tensors ("scaled"); autograd carries their gradients back to the
    module's parameters. Other biases (and, without ``pieces``, scaled forms)
    are evaluated per block by the module (form None). The bias is cast to
    ``dtype``, the scores' (float64 attention keeps a float64 module's bias
    float64, gradients included). ``local`` (k_len,) gives each key position's
    position within its document (packed sequences): what a bias that is not
    one of ``key - query`` sees (within a document ``key - query`` is the same
    either way).
    """
    factor = scale if bias.scale_with_logits else 1.0
    rel = torch.arange(-(k_len - 1), q_len, device=device)
    if bias.relative or bias.relative_below() > k_len - 1:
        # every query's bias is one of key - query (FIRE's queries below its threshold)
        table = bias.relative_bias(rel).to(dtype)
        if factor != 1.0:
            table = table * factor
        if tuple(table.shape) != (heads, q_len + k_len - 1):
            raise ValueError(
                f"{type(bias).__name__}.relative_bias gave shape {tuple(table.shape)}; "
                f"expected ({heads}, {q_len + k_len - 1})"
            )
        return table_fn(k_len - 1), (table,), "table", None

    queries = torch.arange(k_len - q_len, k_len, device=device)
    form = bias.scaled_form(queries if local is None else local[queries], rel) if pieces else None
    if form is not None:
        return _scaled_plan(form, heads, q_len, k_len, factor, dtype)

    params = tuple(p for p in bias.parameters() if p.requires_grad)

    def per_block(
        _: Sequence[torch.Tensor], q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> torch.Tensor:
        if local is not None:
            q_pos, k_pos = local[q_pos], local[k_pos]
        out = bias(q_pos[:, None], k_pos[None, :]).to(dtype)
        return out * factor if factor != 1.0 else out

    return per_block, params, None, None


def _scaled_plan(
    form: ScaledForm, heads: int, q_len: int, k_len: int, factor: float, dtype: torch.dtype
) -> tuple[BiasFn, tuple[torch.Tensor, ...], str, torch.Tensor]:
    """A scaled form as the block function of its table, scale, slopes and intercepts."""
    pieces = form.knots.numel() + 1
    shapes = {
        "table": (form.table, (q_len + k_len - 1,)),
        "scale": (form.scale, (q_len,)),
        "slopes": (form.slopes, (heads, pieces)),
        "intercepts": (form.intercepts, (heads, pieces)),
    }
    for name, (t, want) in shapes.items():
        if tuple(t.shape) != want:
            raise ValueError(
                f"the scaled form's {name} has shape {tuple(t.shape)}; expected {want}"
            )
    slopes, intercepts = form.slopes.to(dtype), form.intercepts.to(dtype)
    if factor != 1.0:
        slopes, intercepts = slopes * factor, intercepts * factor
    knots = form.knots.detach().to(dtype)
    params = (form.table.to(dtype), form.scale.to(dtype), slopes, intercepts)
    return pieces_fn(k_len - 1, k_len - q_len, knots), params, "scaled", knots


def table_fn(base: int) -> BiasFn:
    """The block function of a table over ``key - query``: entry ``base`` is distance 0.

    Queries and keys are given by key position (query ``i`` at ``i + offset``);
    ``base = q_len - 1 + offset``, ``k_len - 1`` bottom-right aligned.
    """

    def from_table(
        params: Sequence[torch.Tensor], q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> torch.Tensor:
        return params[0][:, k_pos[None, :] - q_pos[:, None] + base]

    return from_table


def pieces_fn(base: int, offset: int, knots: torch.Tensor) -> BiasFn:
    """The block function of a scaled form's table, scale, slopes and intercepts.

    The table as :func:`table_fn`'s; the scale per query (query ``i`` at key
    position ``i + offset``).
    """

    def from_pieces(
        params: Sequence[torch.Tensor], q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> torch.Tensor:
        table, row_scale, slope, intercept = params
        x = table[k_pos[None, :] - q_pos[:, None] + base] * row_scale[q_pos - offset, None]
        piece = torch.bucketize(x, knots)
        return slope[:, piece] * x + intercept[:, piece]

    return from_pieces


def _block_scores(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    qb: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked scores ``(B, H, n, k_len)`` of a block of queries ``qb`` (B, H, n, D);
    ``gate`` the forget gates' cumulative sums c (B, H, k_len), or None."""
    hk = k.shape[1]
    s = torch.matmul(grouped(qb, hk), k.unsqueeze(2).transpose(-1, -2)).flatten(1, 2)
    s = s * plan.scale
    if plan.bias_fn is not None:
        s = s + plan.bias_fn(params, q_pos, k_pos)
    if gate is not None:
        s = s + (gate[:, :, q_pos, None] - gate[:, :, None, k_pos])
    seen = allowed(plan.causal, plan.key_mask, plan.docs, q_pos, k_pos)
    if seen is not None:
        s = s.masked_fill(~seen, float("-inf"))
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
    gate: torch.Tensor | None = None,
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
        s = _block_scores(plan, params, q[:, :, i0:i1], k, q_pos, k_pos, gate)
        m = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - _safe(m)[..., None])
        o = torch.matmul(grouped(p, hk), v.unsqueeze(2)).flatten(1, 2)
        out[:, :, i0:i1] = o
        lse[:, :, i0:i1] = m
    return out, lse


def _forward_kernel(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The compiled forward, or None where it does not apply (the caller goes blockwise)."""
    if compiled is None or not hasattr(compiled, "attend") or q.device.type != "cpu":
        return None
    if q.dtype != torch.float32 or (plan.bias_fn is not None and plan.form is None):
        return None
    if plan.knots is not None and plan.knots.numel() > _MAX_KNOTS:
        return None
    if q.shape[0] * q.shape[1] * v.shape[-1] == 0:  # an empty result: nothing to loop over
        return None
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return None
    b, h, lq, _ = q.shape
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    out = torch.empty((b, h, lq, dv), dtype=torch.float32)
    lse = torch.empty((b, h, lq), dtype=torch.float32)
    ops = _kernel_operands(plan, params, b, lq)
    threads = min(torch.get_num_threads(), max(1, b * h * ((lq + 63) // 64)))
    # the gate's c (an argument only when there is one)
    extra = () if gate is None else (gate.detach().contiguous().data_ptr(),)
    done = compiled.attend(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        _address(ops.table), _address(ops.mask),
        [b, h, hk, lq, lk, q.shape[-1], dv],
        list(q.stride()[:3]), list(k.stride()[:3]), list(v.stride()[:3]),
        plan.causal, plan.scale, threads, ops.form(), plan.offset, ops.documents(), *extra,
    )  # fmt: skip
    return (out, lse) if done else None


@dataclass(frozen=True)
class _Operands:
    """The bias, key mask and scaled form as both compiled loops read them."""

    table: torch.Tensor | None  # (heads, n) or, scaled, (n,): reversed
    mask: torch.Tensor | None  # (batch, k_len) uint8
    pieces: tuple[torch.Tensor, ...] = ()  # scaled: scale, knots (64), slopes, intercepts
    levels: int = 0  # scaled: binary search steps over the knots
    docs: tuple[torch.Tensor, torch.Tensor] | None = None  # int32 (batch, q_len), (batch, k_len)

    def documents(self) -> tuple[int, int] | None:
        """The documents' argument: the addresses of the queries' and keys', or None."""
        return None if self.docs is None else (self.docs[0].data_ptr(), self.docs[1].data_ptr())

    def form(self, grads: Sequence[torch.Tensor] | None = None) -> tuple[int, ...] | None:
        """The scaled form's argument, or None; for the backward (``grads`` given) with
        the addresses of the scale's, slopes' and intercepts' gradients (0s: none)."""
        if not self.pieces:
            return None
        out = (*(t.data_ptr() for t in self.pieces), self.levels)
        if grads is None:
            return out
        return (*out, *(g.data_ptr() for g in grads)) if grads else (*out, 0, 0, 0)


def _address(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _kernel_operands(
    plan: _Plan, params: Sequence[torch.Tensor], batch: int, q_len: int
) -> _Operands:
    """The bias, key mask and documents as both compiled loops read them (core/csrc/attend.c)."""
    mask = None if plan.key_mask is None else plan.key_mask.to(torch.uint8).contiguous()
    docs = None
    if plan.docs is not None:
        keys = plan.docs.to(torch.int32).expand(batch, -1).contiguous()
        docs = (keys[:, plan.offset : plan.offset + q_len].contiguous(), keys)
    if plan.bias_fn is None:
        return _Operands(None, mask, docs=docs)
    # reversed, so that a row of keys reads it forwards
    table = params[0].detach().float().flip(-1).contiguous()
    if plan.form != "scaled":
        return _Operands(table, mask, docs=docs)
    assert plan.knots is not None
    n = plan.knots.numel()
    knots = torch.full((_MAX_KNOTS + 1,), math.inf)
    knots[:n] = plan.knots.float()
    slopes, intercepts = (
        torch.nn.functional.pad(t.detach().float(), (0, _MAX_KNOTS - n)).contiguous()
        for t in params[2:]
    )
    scale = params[1].detach().float().contiguous()
    return _Operands(table, mask, (scale, knots, slopes, intercepts), n.bit_length(), docs)


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
        if plan.form is not None:  # the tensors themselves: differentiate the block of them
            detached = [p.detach().requires_grad_(w) for p, w in zip(params, wanted, strict=True)]
            leaves = [p for p in detached if p.requires_grad]
            block = plan.bias_fn(detached, q_pos, k_pos)
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
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """dq, dk, dv and the bias tensors' gradients, block by block in torch ops; with a
    gate c, its gradient last: each position's row sum of dS as a query minus its column
    sum as a key."""
    b, h, lq, _ = q.shape
    hk, lk = k.shape[1], k.shape[2]
    dq = torch.empty_like(q)
    dk = torch.zeros((b, hk, lk, k.shape[-1]), dtype=q.dtype, device=q.device)
    dv = torch.zeros_like(v)
    dparams: list[torch.Tensor | None] = [None] * len(params)
    dgate = None if gate is None else torch.zeros_like(gate)
    k_pos = torch.arange(lk, device=q.device)
    step = _blocks(b, h, lq, lk)
    for i0 in range(0, lq, step):
        i1 = min(lq, i0 + step)
        q_pos = torch.arange(i0, i1, device=q.device) + plan.offset
        qb, dob = q[:, :, i0:i1], dout[:, :, i0:i1]
        with torch.no_grad():
            s = _block_scores(plan, params, qb, k, q_pos, k_pos, gate)
            p = torch.exp(s - _safe(lse[:, :, i0:i1])[..., None])
            dv += torch.matmul(grouped(p, hk).transpose(-1, -2), grouped(dob, hk)).sum(2)
            dp = torch.matmul(grouped(dob, hk), v.unsqueeze(2).transpose(-1, -2))
            ds = p * (dp.flatten(1, 2) - delta[:, :, i0:i1, None])
            dq[:, :, i0:i1] = (
                torch.matmul(grouped(ds, hk), k.unsqueeze(2)).flatten(1, 2) * plan.scale
            )
            dk += (
                torch.matmul(grouped(ds, hk).transpose(-1, -2), grouped(qb, hk)).sum(2) * plan.scale
            )
            if dgate is not None:
                dgate[:, :, q_pos] += ds.sum(-1)
                dgate -= ds.sum(-2)
        if plan.bias_fn is not None and any(wanted):
            _bias_grads(plan, params, wanted, q_pos, k_pos, ds.sum(0), dparams)
    return (dq, dk, dv, *dparams) if dgate is None else (dq, dk, dv, *dparams, dgate)


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
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, ...] | None:
    """The compiled backward of a compiled forward: dq, dk, dv and the bias tensors' gradients
    (and, with a gate, its gradient last, as :func:`_backward_blockwise`'s).

    None where it has no loop (the caller goes blockwise). A table's gradient
    is the score gradient summed per head along each diagonal ``key - query``;
    a scaled form's are its table's, its scale's and its pieces'. Autograd
    carries them on to the bias module's parameters.
    """
    if compiled is None or not hasattr(compiled, "attend_backward"):
        return None
    b, h, lq, d = q.shape
    hk, lk, dv_dim = k.shape[1], k.shape[2], v.shape[-1]
    ops = _kernel_operands(plan, params, b, lq)  # as the forward read them
    dtable = torch.zeros_like(ops.table) if ops.table is not None and any(wanted) else None
    dpieces: list[torch.Tensor] = []  # the scale's, slopes' and intercepts': all or none
    if ops.pieces and dtable is not None:
        scale, _, slopes, intercepts = ops.pieces
        dpieces = [torch.zeros_like(t) for t in (scale, slopes, intercepts)]
    dq = torch.zeros((b, h, lq, d), dtype=torch.float32)
    dk = torch.empty((b, hk, lk, d), dtype=torch.float32)
    dv = torch.empty((b, hk, lk, dv_dim), dtype=torch.float32)
    # the loop indexes lse, dout and delta as C-contiguous (ring attention passes rows)
    lse, dout, delta = lse.contiguous(), dout.contiguous(), delta.contiguous()
    threads = min(torch.get_num_threads(), max(1, b * hk * ((lk + 63) // 64)))
    extra: tuple[tuple[int, int, int], ...] = ()
    if gate is not None:  # c, and the row sums (per query) and column sums (per key) of dS
        gate = gate.detach().contiguous()
        rows, cols = torch.zeros((b, h, lq)), torch.zeros((b, h, lk))
        extra = ((gate.data_ptr(), rows.data_ptr(), cols.data_ptr()),)
    done = compiled.attend_backward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), lse.data_ptr(), dout.data_ptr(),
        delta.data_ptr(), _address(ops.table), _address(ops.mask),
        dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), _address(dtable),
        [b, h, hk, lq, lk, d, dv_dim],
        list(q.stride()[:3]), list(k.stride()[:3]), list(v.stride()[:3]),
        plan.causal, plan.scale, threads, ops.form(dpieces), plan.offset, ops.documents(), *extra,
    )  # fmt: skip
    if not done:
        return None
    tail: tuple[torch.Tensor, ...] = ()
    if extra:
        cols.neg_()[:, :, plan.offset :] += rows
        tail = (cols,)
    if ops.table is None:
        return (dq, dk, dv, *tail)
    grads: list[torch.Tensor | None] = [None if dtable is None else dtable.flip(-1)]
    if plan.form == "scaled":
        pieces = plan.knots.numel() + 1 if plan.knots is not None else 0
        grads += [None] * 3 if not dpieces else [dpieces[0]] + [g[:, :pieces] for g in dpieces[1:]]
    return (dq, dk, dv, *(g if w else None for g, w in zip(grads, wanted, strict=True)), *tail)


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
        gate = params[-1] if plan.gated else None
        bias = params[:-1] if plan.gated else params
        out, lse, ctx.kernel = forward_block(plan, bias, q, k, v, use_kernel, gate)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, out, lse, *params)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        plan: _Plan = ctx.plan
        q, k, v, out, lse, *params = ctx.saved_tensors
        gate = params.pop() if plan.gated else None
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        wanted = [p.requires_grad for p in params]
        grads = backward_block(plan, params, wanted, q, k, v, lse, dout, delta, ctx.kernel, gate)
        return (*grads[:3], None, None, *grads[3:])


def forward_block(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    use_kernel: bool,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Output, log-sum-exp, and whether the compiled loop made them (else blockwise)."""
    result = _forward_kernel(plan, params, q, k, v, gate) if use_kernel else None
    if result is not None:  # float32 on the CPU, the bias a table, pieces or none
        return (*result, True)
    return (*_forward_blockwise(plan, params, q, k, v, gate), False)


def backward_block(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    wanted: Sequence[bool],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    delta: torch.Tensor,
    kernel: bool,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """dq, dk, dv and the bias tensors' gradients of one call, from its (or a larger
    softmax's) log-sum-exp and ``delta``: compiled where the forward was; with a gate,
    its gradient last."""
    grads = None
    if kernel:
        grads = _backward_kernel(plan, params, wanted, q, k, v, lse, dout, delta, gate)
    if grads is None:
        grads = _backward_blockwise(plan, params, wanted, q, k, v, lse, dout, delta, gate)
    return grads


def _flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: _Plan,
    params: Sequence[torch.Tensor],
    bias: AttentionBias | None,
    local: torch.Tensor | None,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Compiled FlexAttention of prepared inputs, in their own dtype.

    Every number the score and mask mods read (offset, scale, table base) is a
    0-d tensor on the device: compiled code guards on captured Python numbers,
    recompiling for each new value (a float at every one; an int at its first
    change), while a tensor is an input whose value it does not guard on.
    """
    from torch.nn.attention.flex_attention import flex_attention

    b, h, lq, _ = q.shape
    lk = k.shape[2]
    compiling = torch.compiler.is_compiling()
    score_mod = _score_mod(plan, params, bias, local, q, lk)
    if gate is not None:
        score_mod = _gated(score_mod, gate, plan.offset)
    block_mask = _block_mask(plan, b, lq, lk, q.device, compiling)
    run = flex_attention if compiling else _compiled(flex_attention)
    # scale=1.0: the score mod applies the scale, a tensor (flex's scale is a float)
    out: torch.Tensor = run(
        q, k, v, score_mod=score_mod, block_mask=block_mask, scale=1.0,
        enable_gqa=h != k.shape[1],
    )  # fmt: skip
    return out


ScoreMod = Callable[[Any, Any, Any, Any, Any], Any]


def _gated(score_mod: ScoreMod, gate: torch.Tensor, offset: int) -> ScoreMod:
    """``score_mod`` plus the forget gates' ``c[query's key position] - c[key]``.

    The queries' c is a copy of its own: FlexAttention's backward scatters the
    gradient of a captured tensor by index and takes each tensor indexed once.
    """
    at_queries, at_keys = gate[:, :, offset:].clone(), gate

    def gated(score: Any, bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
        decay = at_queries[bi, hi, qi] - at_keys[bi, hi, ki]
        return score_mod(score, bi, hi, qi, ki) + decay

    return gated


def _score_mod(
    plan: _Plan,
    params: Sequence[torch.Tensor],
    bias: AttentionBias | None,
    local: torch.Tensor | None,
    q: torch.Tensor,
    lk: int,
) -> ScoreMod:
    """FlexAttention's score mod: the scaled score plus the bias, in float32 or float64.

    The bias is a table (relative biases, FIRE below its threshold) or a scaled
    form (FIRE past it), each tensor indexed once per score: FlexAttention's
    backward scatters the gradient of a captured tensor into it by index, and
    refuses a tensor indexed more than once, as FIRE's ``score`` indexes its
    MLP's weights, unit by unit. Only biases with neither form (a FIRE with
    non-finite parameters, a non-relative bias of the caller's own) take the
    module's ``score``: forward, and backward where the module's allows.
    """
    device, lq = q.device, q.shape[2]
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = torch.full((), plan.scale, dtype=dtype, device=device)
    # query qi sits at key position qi + k_len - q_len, and the tables run over key -
    # query from -(k_len - 1): key ki's entry is ki - qi + q_len - 1
    base = torch.full((), lq - 1, device=device)

    if plan.form == "table":
        # contiguous: one layout for every bias (T5's table comes transposed), one graph
        table = params[0].contiguous()

        def from_table(score: Any, bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
            return score * scale + table[hi, ki - qi + base]

        return from_table

    if plan.form == "scaled":
        assert plan.knots is not None
        rel_table, row_scale, slopes, intercepts = params
        # the knots padded with +inf to a power of two (at least 64, so that the
        # shapes, and the compiled graph, stay as the number of knots changes): a
        # branchless binary search counts the knots below x, as torch.bucketize does
        n = plan.knots.numel()
        size = 1 << max(6, n.bit_length())
        knots = torch.full((size,), math.inf, dtype=rel_table.dtype, device=device)
        knots[:n] = plan.knots
        steps = [size >> i for i in range(1, size.bit_length())]
        pad = (0, size - slopes.shape[1])
        slopes = torch.nn.functional.pad(slopes, pad)
        intercepts = torch.nn.functional.pad(intercepts, pad)

        def from_pieces(score: Any, bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
            x = rel_table[ki - qi + base] * row_scale[qi]
            piece = (knots[steps[0] - 1] < x) * steps[0]
            for step in steps[1:]:
                piece = piece + (knots[piece + step - 1] < x) * step
            return score * scale + slopes[hi, piece] * x + intercepts[hi, piece]

        return from_pieces

    if bias is not None and not isinstance(bias, NoPE):
        module = bias
        offset = torch.full((), plan.offset, device=device)
        times = plan.scale if bias.scale_with_logits else 1.0
        factor = torch.full((), times, dtype=dtype, device=device)
        where = torch.arange(lk, device=device) if local is None else local

        def from_module(score: Any, bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
            return score * scale + module.score(hi, where[qi + offset], where[ki]) * factor

        return from_module

    def scaled(score: Any, bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
        return score * scale

    return scaled


MaskMod = Callable[[Any, Any, Any, Any], Any]


def _mask_mod(
    causal: bool,
    offset: torch.Tensor,
    key_mask: torch.Tensor | None,
    docs: torch.Tensor | None,
) -> MaskMod:
    """FlexAttention's mask mod; ``offset`` (0-d) is query 0's key position and
    ``docs`` each key's document, ``(k_len,)`` for every row or ``(batch, k_len)``."""

    def mask_mod(bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
        at = qi + offset
        keep = ki <= at if causal else ki >= 0
        if key_mask is not None:
            keep = keep & key_mask[bi, ki]
        if docs is not None:
            same = docs[ki] == docs[at] if docs.ndim == 1 else docs[bi, ki] == docs[bi, at]
            keep = keep & same
        return keep

    return mask_mod


def _block_mask(
    plan: _Plan, b: int, lq: int, lk: int, device: torch.device, compiling: bool
) -> Any:
    """The block mask of the causal mask, key padding and documents (None without any):
    made once per everything it depends on and reused (``_BLOCK_MASKS``)."""
    from torch.nn.attention.flex_attention import create_block_mask

    key_mask, docs = plan.key_mask, plan.docs
    if not (plan.causal or key_mask is not None or docs is not None):
        return None
    if docs is not None and docs.shape[0] == 1:
        docs = docs[0]  # the same documents in every row: a mask for the whole batch
    batch = b if key_mask is not None or (docs is not None and docs.ndim == 2) else None

    def build(key_mask: torch.Tensor | None, docs: torch.Tensor | None) -> Any:
        offset = torch.full((), plan.offset, device=device)
        mask_mod = _mask_mod(plan.causal, offset, key_mask, docs)
        # eager create_block_mask materialises the dense (B, H, q_len, k_len) mask
        # first; compiled, it evaluates mask_mod block by block
        make = create_block_mask if compiling else _compiled(create_block_mask)
        return make(mask_mod, batch, None, lq, lk, device=device)

    if compiling:  # traced into the caller's graph, which holds it
        return build(key_mask, docs)
    key = (device, batch, lq, lk, plan.causal, plan.offset, _layout(key_mask), _layout(docs))
    return _BLOCK_MASKS.get(key, (key_mask, docs), build)


def _layout(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    return None if t is None else (tuple(t.shape), t.dtype)


class _BlockMasks:
    """FlexAttention block masks by what they depend on: a bounded LRU, thread-safe.

    A key holds the device, the batch (None: one mask for every row), the
    lengths, ``causal`` and the offset, and the shape and dtype of the key
    padding mask and of the documents. Those two are tensors, so a hit also
    compares them whole with the clones its entry keeps (``torch.equal``): a
    tensor's address is reused by a new tensor once it is freed, and its version
    counter misses writes through ``.data``, numpy or other libraries' kernels
    (and inference tensors have none), while the comparison is sound at the cost
    of reading ``(batch, k_len)`` values (on CUDA, a wait for the device:
    ``torch.equal`` returns a Python bool). The entry's mask mod reads the
    clones, so a caller's later in-place change alters no cached mask. A
    mismatch replaces the entry: one mask per key.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def get(
        self,
        key: tuple[Any, ...],
        tensors: tuple[torch.Tensor | None, ...],
        build: Callable[..., Any],
    ) -> Any:
        """The mask of ``key`` and ``tensors``; on a miss ``build(*clones of tensors)``."""
        with self._lock:
            entry = self._entries.get(key)
        # compared outside the lock: on CUDA torch.equal waits for the device
        if entry is not None and all(
            a is None if b is None else a is not None and torch.equal(a, b)
            for a, b in zip(entry[0], tensors, strict=True)
        ):
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
            return entry[1]
        clones = tuple(None if t is None else t.detach().clone() for t in tensors)
        mask = build(*clones)  # outside the lock: a first build compiles (seconds)
        with self._lock:
            self._entries[key] = (clones, mask)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return mask


# a few dozen: every layer of a model shares one mask; a decode loop makes one per step
_BLOCK_MASKS = _BlockMasks(32)

_COMPILED: dict[Any, Any] = {}


def _compiled(fn: Any) -> Any:
    """``torch.compile(fn)``, made once per process (FlexAttention runs compiled only)."""
    made = _COMPILED.get(fn)
    if made is None:  # two threads may both wrap it; setdefault keeps the first wrapper
        made = _COMPILED.setdefault(fn, torch.compile(fn))
    return made


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    bias: AttentionBias | DAPE | None = None,
    cope: CoPE | None = None,
    rotary: Any = None,
    causal: bool = False,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    chunk_size: int | None = None,
    log_fgate: torch.Tensor | None = None,
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
            T5Bias, KERPLE, FIRE, Sandwich, NoPE), added to the scaled scores;
            or a :class:`posenc.DAPE`, whose MLP reads the scores and its base
            bias (:mod:`posenc.integration.contextual` computes it).
        cope: a :class:`posenc.CoPE` (needs ``causal=True``): positions counted
            by gates on the scores, their embeddings' logits added to the
            scores (:mod:`posenc.integration.contextual`). Combines with
            padding, packed documents, ``chunk_size``, ``rotary`` (its gates
            read the rotated q and k), a bias and ``log_fgate`` (added to the
            logits); not with a DAPE bias, nor ``backend="flex"``.
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
        cu_seqlens: packed documents: ``(n + 1,)`` ints rising from 0 to
            ``k_len`` (flash-attn's varlen convention), the same for every row
            of the batch. Each query attends only to keys of its own document,
            and rotary positions and the bias restart with each document: the
            result equals running every document alone.
        document_ids: packed documents as ids: ``(k_len,)`` or ``(batch, k_len)``
            ints, a new document wherever the id changes along a row (HF's
            ``seq_idx``); as ``cu_seqlens`` otherwise.
        chunk_size: chunked attention (Llama 4's RoPE layers, HF
            ``attention_chunk_size``): a query at position ``p`` sees only keys
            ``j`` with ``j // chunk_size == p // chunk_size`` (and, causal,
            ``j <= p``). Positions are the rotary ones: key positions, or
            positions within each document when packed (a document's chunks
            start with it). Rotary positions and the bias stay as they are: a
            chunk restarts neither. Needs ``q_len <= k_len``.
        log_fgate: the Forgetting Transformer's log forget gates (Lin et al.
            2025, :class:`posenc.ForgetGate` makes them), ``(batch, heads,
            k_len)`` floats, one per key position and head (q's heads). With
            ``c`` their cumulative sum along the keys (float32, float64 for
            float64 inputs), query ``i`` at key position ``p`` and key ``j``
            score ``c[p] - c[j]`` more: the sum of the gates over ``(j, p]``,
            0 for the query's own position. Causal only; gates of padding
            (``attention_mask`` 0) count as 0, and ``c`` restarts with each
            packed document. Gradients reach it.
        backend: ``"auto"``, ``"kernel"`` (CPU float32; falls back to blockwise
            where it does not apply), ``"blockwise"`` or ``"flex"`` (compiled
            FlexAttention; on CPU forward only).

    Returns:
        ``(batch, heads, q_len, v_dim)`` in q's dtype. On ``"flex"``
        float16/bfloat16 q, k and v go to FlexAttention in their own dtype: it
        computes the scores, the softmax and its sums in float32, as
        FlashAttention does (the bias is float32 too), rounding the weights to
        that dtype for their product with v. ``"kernel"`` and ``"blockwise"``
        compute float16/bfloat16 inputs in float32. float64 inputs are computed
        in float64 (the bias too). An empty batch, no heads or ``v_dim = 0``
        give the empty result on every backend.

    Raises:
        TypeError: non-float or mixed-dtype q/k/v; a bias that is not an
            AttentionBias or a DAPE; a ``cope`` that is not a CoPE; a bad mask type.
        ValueError: shapes that do not match (batch, head_dim, lengths, heads
            not a multiple of kv_heads); ``head_dim = 0`` (scores of no
            channels: not attention); bias heads not q's heads; a causal
            request with ``q_len > k_len``; a mask of the wrong shape; an
            unknown backend; a non-positive scale; ``cu_seqlens`` not rising
            from 0 to ``k_len``, or given with ``document_ids``;
            ``chunk_size`` not an int >= 1, or with ``q_len > k_len``;
            ``log_fgate`` of another shape or device, or without ``causal``;
            ``cope`` without ``causal``, of another head_dim, or with a DAPE
            bias; either with ``backend="flex"``.
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
        if not isinstance(bias, AttentionBias | DAPE):
            raise TypeError(
                f"bias must be a posenc.bias.AttentionBias or a posenc.DAPE; "
                f"got {type(bias).__name__}"
            )
        if bias.num_heads != h:
            raise ValueError(f"bias has {bias.num_heads} heads; q has {h}")
    contextual.check(cope, bias, causal, backend, d)
    key_mask = None if attention_mask is None else _key_mask(attention_mask, b, lk, q.device)
    docs = _documents(cu_seqlens, document_ids, b, lk, q.device)
    gate = None
    if log_fgate is not None:
        gate = _forget_cumsum(log_fgate, causal, key_mask, docs, q, lk)
    offset = lk - lq
    if rotary is not None:
        q, k = _rotate(rotary, q, k, offset, None if docs is None else docs[1])
    if chunk_size is not None:
        # after the rotation: chunks confine the keys as documents do, but restart no position
        docs = _chunks(docs, _check_chunk_size(chunk_size, lq, lk), lk, q.device)
    dtype = q.dtype
    if backend == "auto":
        backend = "kernel" if q.device.type == "cpu" else "flex"
    if dtype in _LOW_PRECISION and backend != "flex":
        q, k, v = q.float(), k.float(), v.float()
    if docs is not None and docs[0].shape[0] > 1 and _sees_positions(bias, lk):
        # a bias of more than key - query reads positions within documents, which
        # differ from row to row here: one row at a time
        rows = []
        for i in range(b):
            row_mask = None if key_mask is None else key_mask[i : i + 1]
            row_docs = (docs[0][i : i + 1], docs[1][i : i + 1])
            row = (q[i : i + 1], k[i : i + 1], v[i : i + 1])
            row_gate = None if gate is None else gate[i : i + 1]
            rows.append(
                _attend(*row, bias, causal, scale, row_mask, backend, row_docs, row_gate, cope)
            )
        out = torch.cat(rows) if rows else q.new_empty((0, h, lq, v.shape[-1]))
    else:
        out = _attend(q, k, v, bias, causal, scale, key_mask, backend, docs, gate, cope)
    return out.to(dtype)


def _forget_cumsum(
    log_fgate: Any,
    causal: bool,
    key_mask: torch.Tensor | None,
    docs: tuple[torch.Tensor, torch.Tensor] | None,
    q: torch.Tensor,
    k_len: int,
) -> torch.Tensor:
    """c, the forget gates' cumulative sum along the keys ``(batch, heads, k_len)``.

    Summed in float64 (float32 on MPS, which has none), so that restarting it at
    each document (subtracting the sum before the document) cancels nothing, then
    cast to float64 for float64 inputs and float32 otherwise. Gates of padding
    are 0: a left-padded row's c starts at its first token, as the
    Forgetting Transformer's reference sets them.
    """
    if not causal:
        raise ValueError(
            "log_fgate (the Forgetting Transformer) needs causal=True: a query "
            "decays the keys before it"
        )
    checks.check_float_tensor(log_fgate, "log_fgate")
    b, h = q.shape[:2]
    if tuple(log_fgate.shape) != (b, h, k_len):
        raise ValueError(
            f"log_fgate must be (batch, heads, k_len) = ({b}, {h}, {k_len}); "
            f"got {tuple(log_fgate.shape)}"
        )
    if log_fgate.device != q.device:
        raise ValueError(f"log_fgate must be on q's device {q.device}; got {log_fgate.device}")
    wide = torch.float32 if q.device.type == "mps" else torch.float64
    gates = log_fgate.to(wide)
    if key_mask is not None:
        gates = gates.masked_fill(~key_mask[:, None], 0.0)
    c = gates.cumsum(-1)
    if docs is not None:
        # each key's document starts at its position minus its position in the document
        start = torch.arange(k_len, device=q.device) - docs[1]
        before = torch.nn.functional.pad(c, (1, 0))
        c = c - before.gather(-1, start[:, None].expand(b, h, k_len))
    return c.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


def _sees_positions(bias: AttentionBias | DAPE | None, k_len: int) -> bool:
    """Whether the bias (a DAPE's base) depends on more than ``key - query`` at these lengths."""
    if isinstance(bias, DAPE):
        bias = bias.base
    if bias is None or isinstance(bias, NoPE) or bias.relative:
        return False
    return bias.relative_below() <= k_len - 1


def _check_chunk_size(chunk_size: Any, q_len: int, k_len: int) -> int:
    size = checks.check_int(chunk_size, "chunk_size", minimum=1)
    if q_len > k_len:
        # queries before key 0 would sit at negative positions, in no chunk of keys
        raise ValueError(
            f"chunk_size needs q_len <= k_len (queries are the last keys); got q_len={q_len}, "
            f"k_len={k_len}"
        )
    return size


def _chunks(
    docs: tuple[torch.Tensor, torch.Tensor] | None, size: int, k_len: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The documents cut into chunks of ``size`` positions, and the positions unchanged.

    A key's group is its (document, position // size): numbered along each row from
    0, never decreasing, as the documents are, so every path masks and skips by them.
    """
    if docs is None:
        where = torch.arange(k_len, device=device)[None]
        doc = torch.zeros_like(where)
    else:
        doc, where = docs
    chunk = torch.div(where, size, rounding_mode="floor")
    starts = torch.ones(doc.shape, dtype=torch.int64, device=device)
    starts[:, 1:] = (doc[:, 1:] != doc[:, :-1]) | (chunk[:, 1:] != chunk[:, :-1])
    return starts.cumsum(1) - 1, where


def _documents(
    cu_seqlens: Any, document_ids: Any, batch: int, k_len: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each key position's document and position in it, ``(1 or batch, k_len)`` each.

    Documents are numbered along each row from 0, never decreasing (what the
    compiled loops search); None without packing.
    """
    if cu_seqlens is None and document_ids is None:
        return None
    if cu_seqlens is not None and document_ids is not None:
        raise ValueError("pass cu_seqlens or document_ids, not both")
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            raise TypeError(f"cu_seqlens must be an int tensor; got {type(cu_seqlens).__name__}")
        docs = packed_document_ids(cu_seqlens, k_len).to(device)[None]
        return docs, packed_positions(cu_seqlens, k_len).to(device)[None]
    ids = document_ids
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
        shown = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise TypeError(f"document_ids must be an int tensor; got {shown}")
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[1] != k_len or ids.shape[0] not in (1, batch):
        raise ValueError(
            f"document_ids must be (k_len,) or (batch, k_len) = ({batch}, {k_len}); "
            f"got {tuple(document_ids.shape)}"
        )
    ids = ids.to(device)
    starts = torch.ones_like(ids, dtype=torch.int64)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return starts.cumsum(1) - 1, document_positions(ids)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: AttentionBias | DAPE | None,
    causal: bool,
    scale: float,
    key_mask: torch.Tensor | None,
    backend: str,
    docs: tuple[torch.Tensor, torch.Tensor] | None = None,
    gate: torch.Tensor | None = None,
    cope: CoPE | None = None,
) -> torch.Tensor:
    """Attention of prepared inputs (rotated; float32 or float64, or float16/bfloat16
    for the flex path), queries bottom-right.

    ``docs``: each key position's document and position in it (packed
    sequences), one row when the bias reads the positions. ``gate``: the forget
    gates' cumulative sums c (batch, heads, k_len), or None. ``cope`` or a DAPE
    bias: computed by :func:`posenc.integration.contextual.attend`.
    """
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    bias_fn: BiasFn | None = None
    params: tuple[torch.Tensor, ...] = ()
    form, knots = None, None
    local = None if docs is None else docs[1][0]
    # float16/bfloat16 reach here on the flex path only; their bias stays float32
    work = torch.float32 if q.dtype in _LOW_PRECISION else q.dtype
    dape = bias if isinstance(bias, DAPE) else None
    base = bias.base if isinstance(bias, DAPE) else bias
    if base is not None and not isinstance(base, NoPE):
        bias_fn, params, form, knots = _bias_plan(
            base, h, lq, lk, scale, q.device, work, cope is None and dape is None, local
        )
    if cope is not None or dape is not None:
        q, k, v = q.to(work), k.to(work), v.to(work)
        if gate is not None:  # c of the key positions, an additive term like the bias
            gate = gate.to(work)
        return contextual.attend(
            q, k, v, params, cope=cope, dape=dape, bias_fn=bias_fn, causal=causal,
            scale=scale, key_mask=key_mask, docs=None if docs is None else docs[0], gate=gate,
        )  # fmt: skip
    plan = _Plan(
        bias_fn, causal, scale, key_mask, lk - lq, form, knots,
        None if docs is None else docs[0], gated=gate is not None,
    )  # fmt: skip

    if backend == "flex" and b * h * v.shape[-1] > 0:
        return _flex(q, k, v, plan, params, base, local, gate)
    if gate is not None:  # tracked by the autograd function, last
        params = (*params, gate)
    q, k, v = q.to(work), k.to(work), v.to(work)  # an empty result of the flex path
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
