"""``posenc.path_attention``: PaTH attention, positions by accumulated Householder transforms.

An engine with its own scores on the attention package's layout (its input checks);
the forget gates' cumulative sum is FoX's (:func:`posenc.families.bias.forget.forget_cumsum`).

PaTH (Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating
Householder Transformations"; reference: flash-linear-attention's
``fla/ops/path_attn``, whose ``naive_path_attn`` this matches) puts between a
query and an earlier key the product of one data-dependent Householder-like
transform per position in between::

    H_s = I - beta_s w_s w_s^T                       (|w_s| = 1, 0 < beta_s < 2)
    score(i, j) = q_i^T H_i H_{i-1} ... H_{j+1} k_j      keys j <= i (j = i: q_i . k_i)
    out_i = sum_j softmax_j((score(i, j) + c_i - c_j) * scale) v_j

``c`` is the cumulative sum of optional log forget gates (PaTH-FoX; 0 without).
The gate difference is added *before* the scale, as fla's reference and its
Triton kernel do: posenc's Forgetting Transformer (``posenc.attention(...,
log_fgate=...)``) adds ``c_i - c_j`` to the scaled score instead.

Shapes::

    q          (batch, heads, seq, head_dim)
    k, w       (batch, kv_heads, seq, head_dim)      heads % kv_heads == 0 (GQA)
    v          (batch, kv_heads, seq, v_dim)
    beta       (batch, kv_heads, seq)
    log_fgate  (batch, heads, seq)
    out        (batch, heads, seq, v_dim)

Algorithm (the UT transform of the paper, as fla's kernels): positions are cut
into chunks of ``block_size``. Within a chunk ``T = (I + tril_-1(diag(beta) W
W^T))^-1`` (a triangular solve) gives at once the chunk's scores, each query
carried to the start of its chunk (``q^T H_i ... H_start``), each key carried to
the end of its chunk (``H_end ... H_{j+1} k_j``) and the chunk's whole product as
``I - W^T T diag(beta) W``, a ``(head_dim, head_dim)`` matrix. A query chunk
then meets the earlier key chunks from the nearest back, its carried queries
multiplied by one chunk product per step. Nothing of ``(seq, seq)`` is built:
a query chunk's row of scores is ``(block_size, seq)``. The backward recomputes
each query chunk's carried queries (at most ``seq / block_size`` of them, ``(seq,
head_dim)`` in all) and runs the chain back; autograd differentiates the
per-chunk preprocessing. For float32 CPU inputs with head and value dims multiples
of 16 the core (forward and backward) is the compiled loop of
``posenc/core/csrc/path.c``, one block of at most 64 queries of one chunk per unit
with an online softmax over the key chunks; elsewhere (float64, other devices, no
compiled kernels) the torch loop below, the same computation.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import torch

from posenc.core import checks
from posenc.core.kernels import compiled, threads_for
from posenc.core.positions import packed_document_ids
from posenc.families.bias.forget import forget_cumsum
from posenc.integration.attention.layout import check_qkv

#: Where float32's exp leaves its normal range (``exp(-87.34) = 2**-126``): weights
#: below it are set to 0 (see ``_exp_``).
_UNDERFLOW = -87.0

#: Positions per chunk by default: the chunks' own work grows with it (seq * block
#: * head_dim), the chain between chunks shrinks with it (seq^2 * head_dim^2 / block).
DEFAULT_BLOCK = 128


@dataclass(frozen=True)
class _Plan:
    """What the chunked core needs besides the tensors autograd tracks."""

    block: int  # positions per chunk, C
    groups: int  # query heads per kv head
    first: tuple[int, ...]  # per query chunk, the first key chunk any of its queries sees
    docs: torch.Tensor | None  # (n * C,) each padded position's document, or None


def _check_tensor(t: Any, name: str, shape: tuple[int, ...], device: torch.device) -> None:
    checks.check_float_tensor(t, name)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}; got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on q's device {device}; got {t.device}")


def _check_inputs(
    q: Any, k: Any, v: Any, w: Any, beta: Any, log_fgate: Any
) -> tuple[int, int, int, int, int, int]:
    """``(batch, heads, kv_heads, seq, head_dim, v_dim)`` of valid inputs, or raise."""
    check_qkv(q, k, v)  # the attention layout's own checks, then PaTH's
    checks.check_float_tensor(w, "w")
    if w.dtype != q.dtype:
        raise TypeError(f"q, k, v and w must share a dtype; got {q.dtype} and w {w.dtype}")
    if w.device != q.device:
        raise ValueError(f"q, k, v and w must be on one device; got {q.device} and w {w.device}")
    b, h, length, d = q.shape
    hk = k.shape[1]
    dv = v.shape[-1]
    if dv < 1:
        raise ValueError(f"v_dim must be >= 1; got v {tuple(v.shape)}")
    expected = {"k": (b, hk, length, d), "w": (b, hk, length, d), "v": (b, hk, length, dv)}
    for name, t in (("k", k), ("w", w), ("v", v)):
        if tuple(t.shape) != expected[name]:
            raise ValueError(
                f"{name} must be (batch, kv_heads, seq, {'v_dim' if name == 'v' else 'head_dim'})"
                f" = {expected[name]} (q_len == k_len: training or prefill); got "
                f"{tuple(t.shape)}"
            )
    _check_tensor(beta, "beta", (b, hk, length), q.device)
    if log_fgate is not None:
        _check_tensor(log_fgate, "log_fgate", (b, h, length), q.device)
    return b, h, hk, length, d, dv


def _documents(
    cu_seqlens: Any, length: int, padded: int, block: int, device: torch.device
) -> tuple[tuple[int, ...], torch.Tensor | None]:
    """Per query chunk the first key chunk it may see, and each position's document."""
    n = padded // block
    if cu_seqlens is None:
        return (0,) * n, None
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be an int tensor; got {type(cu_seqlens).__name__}")
    # checks the values too: an int tensor rising from 0 to seq
    docs = packed_document_ids(cu_seqlens, length)
    bounds = [int(c) for c in cu_seqlens.tolist()]
    # the start of the document of each chunk's first query: no earlier key is seen
    starts = [bounds[bisect.bisect_right(bounds, i * block) - 1] for i in range(n)]
    # padding gets a document of its own: no real query sees a padded key, nor the reverse
    pad = torch.full((padded - length,), len(bounds), dtype=docs.dtype, device=docs.device)
    return tuple(s // block for s in starts), torch.cat([docs, pad]).to(device)


def _chunk_mask(plan: _Plan, i: int, j0: int, device: torch.device) -> torch.Tensor:
    """Which keys (chunks ``j0 .. i``) the queries of chunk ``i`` see: ``(m, 1, 1, C, C)``
    bool, key chunk first (the layout of the scores)."""
    c = plan.block
    q_pos = torch.arange(i * c, (i + 1) * c, device=device)
    k_pos = torch.arange(j0 * c, (i + 1) * c, device=device)
    seen = k_pos[None, :] <= q_pos[:, None]
    if plan.docs is not None:
        seen = seen & (plan.docs[q_pos, None] == plan.docs[None, k_pos])
    return seen.view(c, i - j0 + 1, c).transpose(0, 1)[:, None, None]


def _mask(plan: _Plan, s: torch.Tensor, gate: torch.Tensor | None, i: int, j0: int) -> None:
    """Gate and mask, in place, the scaled scores ``s`` ``(m, BK, g C, C)`` of query chunk
    ``i`` against key chunks ``j0 .. i``.

    Of the gate difference ``c_i - c_j`` only ``-c_j`` is applied: ``c_i`` is the same
    for every key of query ``i`` and leaves its softmax unchanged (its gradient, the
    row's ``sum_j dS_ij``, is 0). ``c_j`` is taken relative to the chunk's last query,
    so that a long sequence's large cumulative gates do not reach the exponent.
    """
    m, bk, _, c = s.shape
    view = s.view(m, bk, -1, c, c)
    if gate is not None:
        view.sub_((gate[j0 : i + 1] - gate[i][..., -1:])[:, :, :, None, :])
    if plan.docs is None and j0 == 0:
        # one document: only the diagonal chunk has keys after a query
        causal = torch.ones(c, c, dtype=torch.bool, device=s.device).triu(1)
        view[m - 1].masked_fill_(causal, -math.inf)
    else:
        view.masked_fill_(~_chunk_mask(plan, i, j0, s.device), -math.inf)


def _exp_(s: torch.Tensor) -> torch.Tensor:
    """``exp`` in place, 0 below ``_UNDERFLOW``.

    Scores shifted by their row's maximum (or log-sum-exp) whose weight would be below
    ``exp(-87)``, under float32's smallest normal number: the row's largest weight is
    about 1, so dropping them changes no sum by a unit in its last place (float64
    neither: ``2**-126`` is far below its rounding). CPU ``exp`` takes a slow path
    for them (about 25x for results below the normal range), which a forget gate's
    decay over thousands of positions reaches for most pairs.
    """
    return s.masked_fill_(s < _UNDERFLOW, -math.inf).exp_()


def _carried(qhat: torch.Tensor, hmat: torch.Tensor, i: int, j0: int) -> torch.Tensor:
    """``(i - j0, BK, g C, d)``: query chunk ``i`` carried to the end of each key chunk
    ``j0 .. i - 1`` (entry ``j - j0``)."""
    states = qhat.new_empty((i - j0, *qhat.shape[1:]))
    states[i - j0 - 1] = qhat[i]
    for j in range(i - 1, j0, -1):
        # x_{j-1} = x_j (I - H_j): one chunk's product of Householder transforms
        torch.baddbmm(states[j - j0], states[j - j0], hmat[j], alpha=-1, out=states[j - j0 - 1])
    return states


def _flat(x: torch.Tensor) -> torch.Tensor:
    """``(m, BK, r, c)`` -> ``(m BK, r, c)`` for ``bmm`` (a view of a contiguous tensor)."""
    return x.reshape(-1, *x.shape[2:])


def _rows(x: torch.Tensor, m: int) -> torch.Tensor:
    """A per-row value ``(BK, g C)`` as ``baddbmm``'s input for ``m`` key chunks:
    ``(m BK, g C, 1)``, broadcast along the keys."""
    return x[None, :, :, None].expand(m, *x.shape, 1).reshape(-1, x.shape[-1], 1)


def _scores(
    plan: _Plan,
    qhat: torch.Tensor,
    khat: torch.Tensor,
    hmat: torch.Tensor,
    intra: torch.Tensor,
    i: int,
    j0: int,
    shift: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores ``(m, BK, g C, C)`` of query chunk ``i`` against key chunks ``j0 .. i``
    (minus ``shift`` ``(BK, g C)`` per row, if given), and the carried queries (None
    when no earlier chunk is seen)."""
    m = i - j0 + 1
    s = intra.new_empty((m, *intra.shape[1:]))
    states = None
    if m > 1:
        states = _carried(qhat, hmat, i, j0)
        k = _flat(khat[j0:i]).mT
        if shift is None:
            torch.bmm(_flat(states), k, out=_flat(s[: m - 1]))
        else:
            torch.baddbmm(
                _rows(shift, m - 1), _flat(states), k, alpha=1, beta=-1, out=_flat(s[: m - 1])
            )
    if shift is None:
        s[m - 1] = intra[i]
    else:
        torch.sub(intra[i], shift[..., None], out=s[m - 1])
    return s, states


def _compiled_docs(plan: _Plan, *tensors: torch.Tensor | None) -> torch.Tensor | None:
    """The documents as the compiled core reads them (int32; an empty tensor without
    documents), or None where it does not apply: no compiled loops, not float32 on the
    CPU, an empty batch, head or value dims not multiples of 16 (the loops' vectors), a
    tensor not C-contiguous."""
    if compiled is None or not hasattr(compiled, "path_core"):
        return None
    ts = [t for t in tensors if t is not None]
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in ts):
        return None
    if ts[0].numel() == 0:
        return None  # an empty batch: nothing to loop over
    if ts[0].shape[-1] % 16 or ts[2].shape[-1] % 16:
        return None
    if not all(t.is_contiguous() for t in ts):
        return None
    if plan.docs is None:
        return torch.empty(0, dtype=torch.int32)
    return plan.docs.to(torch.int32).contiguous()


def _address(t: torch.Tensor | None) -> int:
    """A tensor's address for the compiled core; 0 for None or an empty tensor."""
    return 0 if t is None or t.numel() == 0 else t.data_ptr()


def _sizes(plan: _Plan, qhat: torch.Tensor, v: torch.Tensor) -> list[int]:
    """The compiled core's ``[N, BK, G, C, D, DV]``."""
    n, bk, _, d = qhat.shape
    return [n, bk, plan.groups, plan.block, d, v.shape[-1]]


def _threads(qhat: torch.Tensor) -> int:
    """Threads for the compiled core: torch's, at most one per unit of 64 queries."""
    n, bk, gc, _ = qhat.shape
    return threads_for(n * bk * -(-gc // 64))


def _loop_forward(
    plan: _Plan,
    docs: torch.Tensor,
    qhat: torch.Tensor,
    khat: torch.Tensor,
    v: torch.Tensor,
    hmat: torch.Tensor,
    intra: torch.Tensor,
    gate: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> bool:
    """The compiled forward (``core/csrc/path.c``) into ``out`` and ``lse``; False where
    it has no loop (no AVX-512)."""
    assert compiled is not None  # _compiled_docs said so
    return bool(
        compiled.path_core(
            qhat.data_ptr(), khat.data_ptr(), v.data_ptr(), hmat.data_ptr(),
            intra.data_ptr(), _address(gate), _address(docs), list(plan.first),
            out.data_ptr(), lse.data_ptr(), _sizes(plan, qhat, v), _threads(qhat),
        )
    )  # fmt: skip


def _loop_backward(
    plan: _Plan,
    docs: torch.Tensor,
    saved: tuple[torch.Tensor | None, ...],
    grads: tuple[torch.Tensor | None, ...],
) -> bool:
    """The compiled backward of a compiled forward: ``saved`` (qhat, khat, v, hmat,
    intra, gate, out, lse, dout) in, ``grads`` (dq, dk, dv, dh, dintra, dgate; zeroed
    but dintra) written; False where it has no loop."""
    assert compiled is not None
    qhat, khat, v, hmat, intra, gate, out, lse, dout = saved
    assert qhat is not None and v is not None and hmat is not None
    # the chain run back multiplies by each chunk's transpose: rows of hmat^T, held
    # here for the call (a temporary's address would be freed before it)
    hmat_t = hmat.mT.contiguous()
    return bool(
        compiled.path_core_backward(
            *(_address(t) for t in (qhat, khat, v, hmat, hmat_t, intra, gate, docs)),
            list(plan.first),
            *(_address(t) for t in (out, lse, dout, *grads)),
            _sizes(plan, qhat, v), _threads(qhat),
        )
    )  # fmt: skip


class _PaTHCore(torch.autograd.Function):
    """The scores between chunks, the softmax and the values, recomputed in the backward.

    Inputs in chunk-first layout (``n`` chunks of ``C`` positions, ``BK = batch *
    kv_heads``, ``g`` query heads per kv head), the score scale already applied to
    ``qhat``, ``intra`` and ``gate``: ``qhat`` ``(n, BK, g C, d)`` queries carried to
    their chunk's start, ``khat`` ``(n, BK, C, d)`` keys carried to their chunk's end,
    ``v`` ``(n, BK, C, dv)``, ``hmat`` ``(n, BK, d, d)`` (the chunk's product is ``I -
    hmat``), ``intra`` ``(n, BK, g C, C)`` the scores within each chunk, ``gate``
    ``(n, BK, g, C)`` cumulative log forget gates or None.

    The compiled loops run both passes where :func:`_compiled_docs` allows (the
    backward iff the forward did); the torch loops otherwise.
    """

    @staticmethod
    def forward(
        ctx: Any,
        qhat: torch.Tensor,
        khat: torch.Tensor,
        v: torch.Tensor,
        hmat: torch.Tensor,
        intra: torch.Tensor,
        gate: torch.Tensor | None,
        plan: _Plan,
    ) -> torch.Tensor:
        n, bk, gc, _ = qhat.shape
        out = v.new_empty((n, bk, gc, v.shape[-1]))
        lse = v.new_empty((n, bk, gc))
        docs = _compiled_docs(plan, qhat, khat, v, hmat, intra, gate)
        ctx.docs = docs
        ctx.compiled = docs is not None and _loop_forward(
            plan, docs, qhat, khat, v, hmat, intra, gate, out, lse
        )
        for i in range(0 if ctx.compiled else n):
            j0 = plan.first[i]
            s, _ = _scores(plan, qhat, khat, hmat, intra, i, j0)
            _mask(plan, s, gate, i, j0)
            top = s.amax(dim=(0, 3))
            p = _exp_(s.sub_(top[None, :, :, None]))
            total = p.sum(dim=(0, 3))
            # normalised once per row, after the values: P / total never formed
            out[i] = torch.matmul(p, v[j0 : i + 1]).sum(0).div_(total[..., None])
            lse[i] = top + total.log()
        ctx.plan = plan
        ctx.has_gate = gate is not None
        ctx.save_for_backward(qhat, khat, v, hmat, intra, gate, out, lse)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        qhat, khat, v, hmat, intra, gate, out, lse = ctx.saved_tensors
        plan: _Plan = ctx.plan
        dout = dout.contiguous()
        n, bk, _, _ = qhat.shape
        c = plan.block
        dq, dk, dv = torch.zeros_like(qhat), torch.zeros_like(khat), torch.zeros_like(v)
        dh, dintra = torch.zeros_like(hmat), torch.empty_like(intra)
        dgate = torch.zeros_like(gate) if ctx.has_gate else None
        if ctx.compiled and _loop_backward(
            plan, ctx.docs, (qhat, khat, v, hmat, intra, gate, out, lse, dout),
            (dq, dk, dv, dh, dintra, dgate),
        ):  # fmt: skip
            return dq, dk, dv, dh, dintra, dgate, None
        delta = (dout * out).sum(-1)  # (n, BK, g C): dout_i . out_i
        for i in range(n):
            j0 = plan.first[i]
            m = i - j0 + 1
            # P = exp(score - lse): lse subtracted inside the products
            s, states = _scores(plan, qhat, khat, hmat, intra, i, j0, shift=lse[i])
            _mask(plan, s, gate, i, j0)
            p = _exp_(s)
            do = dout[i]
            vs = v[j0 : i + 1]
            dv[j0 : i + 1] += torch.matmul(p.mT, do)
            # dS = P (dP - delta), dP = dout . v
            ds = (
                torch.baddbmm(
                    _rows(delta[i], m), _flat(do.expand(m, *do.shape)), _flat(vs).mT, beta=-1
                )
                .view_as(p)
                .mul_(p)
            )
            dintra[i] = ds[m - 1]
            if dgate is not None:
                # the keys' side -c_j only (the rows' +c_i has gradient 0, see _mask)
                dgate[j0 : i + 1] -= ds.view(m, bk, -1, c, c).sum(3)
            if states is None:
                continue
            dsi = ds[: m - 1]
            dk[j0:i] += torch.matmul(dsi.mT, states)
            # the gradient of each carried query, then the chain run back: with
            # x_{j-1} = x_j (I - H_j), dx_j gathers dx_{j-1} (I - H_j)^T
            dx = torch.matmul(dsi, khat[j0:i])
            for j in range(j0 + 1, i):
                dx[j - j0].add_(dx[j - j0 - 1]).baddbmm_(dx[j - j0 - 1], hmat[j].mT, alpha=-1)
            dq[i] = dx[m - 2]
            if m > 2:
                # dH_j = -x_j^T dx_{j-1}, summed over the group's query heads
                dh[j0 + 1 : i] -= torch.matmul(states[1:].mT, dx[:-1])
        return dq, dk, dv, dh, dintra, dgate, None


def _ut(
    w: torch.Tensor, beta: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each chunk's UT transform, in chunk-first layout (``w``, ``k`` ``(n, BK, C, d)``).

    ``T = (I + tril_-1(diag(beta) W W^T))^-1`` (implicit: two triangular solves) gives
    ``U = T diag(beta) W`` and ``V = T tril_-1(diag(beta) W K^T)``, from which the
    chunk's product is ``H_end ... H_start = I - W^T U`` and key ``j`` carried to the
    chunk's end is ``k_j - sum_r V_rj w_r``.

    Returns:
        ``(U, V, W^T U, keys carried to the chunk's end)``.
    """
    bw = beta[..., None] * w
    # unitriangular: the solve reads the strictly lower part of ``a`` and a unit
    # diagonal, and its backward keeps that triangle of ``a``'s gradient (torch's
    # linalg_solve_triangular_backward): no tril needed, forward or back
    a = torch.matmul(bw, w.mT)
    u = torch.linalg.solve_triangular(a, bw, upper=False, unitriangular=True)
    vk = torch.linalg.solve_triangular(
        a, torch.tril(torch.matmul(bw, k.mT), -1), upper=False, unitriangular=True
    )
    return u, vk, torch.matmul(w.mT, u), k - torch.matmul(vk.mT, w)


def _chunked(x: torch.Tensor, n: int, c: int) -> torch.Tensor:
    """``(b, h, n c, ...)`` -> ``(n, b h, c, ...)``: chunk-first, a C-contiguous copy
    (what the compiled core reads; the products on it follow its layout)."""
    b, h = x.shape[:2]
    rest = x.shape[3:]
    return x.reshape(b, h, n, c, *rest).movedim(2, 0).reshape(n, b * h, c, *rest).contiguous()


def _grouped_chunks(x: torch.Tensor, hk: int, n: int, c: int) -> torch.Tensor:
    """``(b, h, n c, ...)`` query heads -> ``(n, b hk, g, c, ...)``: head ``kv * g + r``
    at ``[.., kv, r]`` (query head h reads kv head h // g); a C-contiguous copy."""
    b, h = x.shape[:2]
    rest = x.shape[3:]
    g = h // hk
    x = x.reshape(b, hk, g, n, c, *rest).movedim(3, 0)
    return x.reshape(n, b * hk, g, c, *rest).contiguous()


def path_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    *,
    log_fgate: torch.Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    block_size: int | None = None,
) -> torch.Tensor:
    """PaTH attention: causal softmax attention through accumulated Householder transforms.

    ``score(i, j) = q_i^T H_i H_{i-1} ... H_{j+1} k_j`` over keys ``j <= i``, with
    ``H_s = I - beta_s w_s w_s^T``; then ``out_i = sum_j softmax_j((score(i, j) + c_i -
    c_j) * scale) v_j`` with ``c`` the cumulative log forget gates (0 without
    ``log_fgate``). Yang et al. 2025 (PaTH); the formula of flash-linear-attention's
    ``naive_path_attn`` and ``parallel_path_attention`` (fla-org), computed in chunks
    of ``block_size`` positions through the UT transform, in memory O(seq *
    block_size) for the forward and the backward alike.

    The gate difference is added before the scale, as fla's PaTH does (both its
    reference and its kernel); the Forgetting Transformer in ``posenc.attention``
    adds it after.

    Args:
        q: ``(batch, heads, seq, head_dim)``.
        k: ``(batch, kv_heads, seq, head_dim)``; ``heads`` a multiple of ``kv_heads``:
            query head ``h`` reads kv head ``h // (heads // kv_heads)``.
        v: ``(batch, kv_heads, seq, v_dim)``.
        w: ``(batch, kv_heads, seq, head_dim)``, the transforms' directions, per kv
            head as in fla. They must have unit L2 norm (the caller normalises, as
            fla's layer and :class:`posenc.integration.path_layer.PaTH` do); any
            other length gives a transform other than the paper's, computed as written.
        beta: ``(batch, kv_heads, seq)``, the transforms' strengths, in ``(0, 2)`` for
            the paper's (``2 * sigmoid``): then every ``H_s`` is a contraction. Not
            checked (the caller's business, as in fla).
        log_fgate: ``(batch, heads, seq)`` log forget gates (PaTH-FoX), any float
            dtype; computed in the work dtype.
        scale: score scale; ``1 / sqrt(head_dim)`` by default.
        cu_seqlens: packed documents: ``(n + 1,)`` ints rising from 0 to seq
            (flash-attn's varlen convention), the same for every row of the batch.
            Each document is attended alone (no transform, gate or key crosses a
            document's bounds): the result equals running every document apart.
        block_size: positions per chunk; 128 by default (at most seq). Time and
            memory only: the result is the same up to rounding.

    Returns:
        ``(batch, heads, seq, v_dim)`` in q's dtype. float16 and bfloat16 are computed
        in float32, float64 in float64.

    Raises:
        TypeError: non-float q, k, v, w, beta or log_fgate; q, k, v and w of mixed
            dtypes; ``cu_seqlens`` not an int tensor; ``block_size`` not an int.
        ValueError: shapes that do not match (see above; q_len must equal k_len),
            heads not a multiple of kv_heads, tensors on other devices than q, a
            non-positive scale or block size, ``cu_seqlens`` not rising from 0 to
            seq, or a result or block of scores of more than
            ``posenc.core.checks.MAX_ELEMENTS`` elements (refused before any work).

    Examples:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> q, k, v, w = torch.randn(4, 1, 2, 8, 16).unbind(0)  # (batch, heads, seq, head_dim)
        >>> w = F.normalize(w, dim=-1)  # unit directions
        >>> beta = 2 * torch.randn(1, 2, 8).sigmoid()  # strengths in (0, 2)
        >>> posenc.path_attention(q, k, v, w, beta).shape
        torch.Size([1, 2, 8, 16])
        >>> out = posenc.path_attention(q, k, v, w, torch.zeros(1, 2, 8))  # identity transforms
        >>> torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)
        True
    """
    b, h, hk, length, d, dv = _check_inputs(q, k, v, w, beta, log_fgate)
    scale = checks.check_number(
        1.0 / math.sqrt(d) if scale is None else scale, "scale", positive=True
    )
    block = DEFAULT_BLOCK if block_size is None else checks.check_int(block_size, "block_size", 1)
    block = min(block, length)
    n = -(-length // block)
    padded = n * block
    checks.check_elements(b * h * padded * max(d, dv), "PaTH attention's output and states")
    checks.check_elements(
        b * h * padded * block, "a chunk's row of scores (batch, heads, block_size, seq)"
    )
    first, docs = _documents(cu_seqlens, length, padded, block, q.device)
    dtype = q.dtype
    work = checks.work_dtype(dtype)
    q, k, v, w, beta = (t.to(work) for t in (q, k, v, w, beta))
    pad = padded - length
    if pad:
        # padded positions come last: no real query sees them, and beta = 0 makes
        # their transforms the identity
        q, k, v, w = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v, w))
        beta = torch.nn.functional.pad(beta, (0, pad))
    wc, kc, vc = (_chunked(t, n, block) for t in (w, k, v))
    u, vk, hmat, khat = _ut(wc, _chunked(beta, n, block), kc)
    # the score scale applied to q here, on a (seq, head_dim) tensor, carries into
    # qhat and intra: the core's inputs come scaled without a pass over either
    qc = _grouped_chunks(q * scale, hk, n, block)  # (n, BK, g, C, d)
    qw = torch.tril(torch.matmul(qc, wc[:, :, None].mT))  # q_i . w_r, r <= i
    # query i carried back to its chunk's start: q_i^T H_i ... H_start
    qhat = qc - torch.matmul(qw, u[:, :, None])
    intra = torch.matmul(qc, kc[:, :, None].mT) - torch.matmul(qw, vk[:, :, None])
    gate = None
    if log_fgate is not None:
        # c summed in float64 (FoX's one home of it), then fla's convention: (score + c_i -
        # c_j) * scale; across documents no pair is kept, so c needs no restart
        c = forget_cumsum(log_fgate, None, None, work)
        if pad:
            c = torch.nn.functional.pad(c, (0, pad))
        gate = _grouped_chunks(c * scale, hk, n, block)
    g = h // hk
    plan = _Plan(block, g, first, docs)
    out = _PaTHCore.apply(qhat.flatten(2, 3), khat, vc, hmat, intra.flatten(2, 3), gate, plan)
    # (n, BK, g C, dv) -> (b, h, seq, dv)
    out = out.view(n, b, hk, g, block, dv).permute(1, 2, 3, 0, 4, 5).reshape(b, h, padded, dv)
    return out[:, :, :length].to(dtype)


def path_keys(
    k: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    *,
    block_size: int | None = None,
) -> torch.Tensor:
    """Every key carried to the last position: ``H_{seq-1} ... H_{j+1} k_j``, what a decoder caches.

    With these, the score of a next query ``q_t`` is ``q_t^T H_t k'_j``: each new
    position applies its own transform to every cached key (``k' <- k' - beta_t (k' .
    w_t) w_t``), as fla's ``PaTHAttention`` does when decoding. Computed in chunks as
    :func:`path_attention` (each chunk's product ``I - W^T U``), without autograd's
    bookkeeping for the chain between chunks.

    Args:
        k: ``(batch, kv_heads, seq, head_dim)``.
        w: ``(batch, kv_heads, seq, head_dim)``, unit directions.
        beta: ``(batch, kv_heads, seq)``.
        block_size: positions per chunk; as :func:`path_attention`.

    Returns:
        ``(batch, kv_heads, seq, head_dim)`` in k's dtype (float16 and bfloat16
        computed in float32).

    Raises:
        TypeError: non-float tensors, k and w of different dtypes, a non-int block size.
        ValueError: shapes that do not match, other devices, a non-positive block size.
    """
    for name, t in (("k", k), ("w", w)):
        checks.check_float_tensor(t, name)
        if t.ndim != 4:
            raise ValueError(f"{name} must be (batch, kv_heads, seq, dim); got {tuple(t.shape)}")
    if k.dtype != w.dtype:
        raise TypeError(f"k and w must share a dtype; got {k.dtype} and {w.dtype}")
    if tuple(w.shape) != tuple(k.shape) or w.device != k.device:
        raise ValueError(
            f"w must match k's shape and device; got {tuple(w.shape)} on {w.device}, k "
            f"{tuple(k.shape)} on {k.device}"
        )
    b, hk, length, d = k.shape
    _check_tensor(beta, "beta", (b, hk, length), k.device)
    block = DEFAULT_BLOCK if block_size is None else checks.check_int(block_size, "block_size", 1)
    if length == 0:
        return k.clone()
    block = min(block, length)
    n = -(-length // block)
    checks.check_elements(b * hk * n * block * max(d, block), "path_keys' chunks")
    dtype = k.dtype
    work = checks.work_dtype(dtype)
    k, w, beta = (t.to(work) for t in (k, w, beta))
    pad = n * block - length
    if pad:
        k, w = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (k, w))
        beta = torch.nn.functional.pad(beta, (0, pad))
    with torch.no_grad():
        _, _, hmat, khat = _ut(
            _chunked(w, n, block), _chunked(beta, n, block), _chunked(k, n, block)
        )
        # the keys of chunks before j pass through chunk j's product (a column vector:
        # (I - H_j) k, i.e. the row k^T (I - H_j)^T), the latest chunk last
        for j in range(1, n):
            khat[:j] = khat[:j] - torch.matmul(khat[:j], hmat[j].mT)
    out = khat.view(n, b, hk, block, d).permute(1, 2, 0, 3, 4).reshape(b, hk, n * block, d)
    return out[:, :, :length].to(dtype)
