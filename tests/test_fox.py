"""The Forgetting Transformer (FoX) in posenc.attention, and its ForgetGate.

Lin et al. 2025; reference zhixuan-lin/forgetting-transformer (the Triton
``ops/forgetting_attention.py`` and ``ForgettingAttentionLayer``): with c the
cumulative sum of the log forget gates along the keys, query i (at key position
p) scores key j ``q.k * scale + c[p] - c[j]``, causal, the diagonal included with
0 (the query's own gate counts, the key's does not). Checked against that formula
written out densely in float64 (``fox_dense``, with its own mask of documents,
chunks, padding and a KV cache): exactly in float64 (the blockwise path, gradcheck
included), and in float32, the compiled loop's and the blockwise path's output and
gradients of q, k, v and the gates, each element within its own derived error bound
(``fox_bounds``), small enough that a 1% error in dS fails. tests/test_fla.py holds
posenc to fla-core's dense reference of the method.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.families.bias import ALiBi, ForgetGate
from posenc.integration.attention import softmax
from test_attention_backward import U, bounds


def key_groups(k_len, cu_seqlens=None, chunk_size=None):
    """Each key position's document and chunk (position in its document // chunk_size)."""
    cu = [0, k_len] if cu_seqlens is None else [int(x) for x in cu_seqlens]
    doc = torch.zeros(k_len, dtype=torch.long)
    where = torch.zeros(k_len, dtype=torch.long)
    for i, (a, b) in enumerate(itertools.pairwise(cu)):
        doc[a:b] = i
        where[a:b] = torch.arange(b - a)
    chunk = torch.zeros_like(where) if chunk_size is None else where // chunk_size
    return doc, chunk


def allowed_pairs(q_len, k_len, mask=None, cu_seqlens=None, chunk_size=None):
    """(batch or 1, 1, q_len, k_len) bool: which keys each query sees, written out.

    Key j <= p (query i at key position p = i + k_len - q_len), of p's document and
    chunk, and not padding (``mask`` False).
    """
    p = torch.arange(q_len) + k_len - q_len
    doc, chunk = key_groups(k_len, cu_seqlens, chunk_size)
    ok = (torch.arange(k_len)[None, :] <= p[:, None]) & (doc[p, None] == doc[None, :])
    ok = (ok & (chunk[p, None] == chunk[None, :]))[None, None]
    return ok if mask is None else ok & mask[:, None, None, :]


def fox_dense(q, k, v, log_fgate, *, scale, bias=None, mask=None, cu_seqlens=None, chunk_size=None):
    """The reference formula in float64, every score materialised.

    ``s_ij = q_i . k_j * scale + bias + sum_{t in (j, p]} log f_t`` for the keys
    :func:`allowed_pairs` lets query i see, the sum written as the difference of
    the cumulative sums (over the whole row: j and p share a document, so the
    gates between them are those of the document); padding keys (``mask``
    False) masked and their gates 0.
    """
    q, k, v, lf = (t.double() for t in (q, k, v, log_fgate))
    h, lq = q.shape[1], q.shape[2]
    hk, lk = k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    if mask is not None:
        lf = lf.masked_fill(~mask[:, None], 0.0)
    c = lf.cumsum(-1)
    p = torch.arange(lq) + lk - lq
    s = q @ k.transpose(-1, -2) * scale + (c[:, :, p, None] - c[:, :, None, :])
    if bias is not None:
        s = s + bias.double().bias(lq, lk).detach()
    allowed = allowed_pairs(lq, lk, mask, cu_seqlens, chunk_size)
    w = torch.softmax(s.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0)
    return w @ v


U64 = 2.0**-53
#: Blocks of keys of the compiled forward (attend.c's ABK): its online softmax
#: rescales a query's running sums once per block.
FORWARD_KEYS = 256


def fox_bounds(q, k, v, dout, lf, *, scale, mask=None, cu_seqlens=None, chunk_size=None,
               bias=None, u=U, naive=False):  # fmt: skip
    """Per-element bounds of the error of out, dq, dk, dv and d log f against float64.

    For a computation in the precision of unit roundoff ``u`` (float32's U, or
    2**-53) of the formula of :func:`fox_dense` with these inputs: posenc's compiled
    loop or blockwise path, or with ``naive`` fla-core's dense reference (test_fla
    .py). Each is a first-order bound built from the float64 magnitudes of its
    terms (``x ~ y``: the operations' roundings, at most u each, then the inputs'
    errors carried through), doubled for the second-order terms: every relative
    error below is under 1e-3 (asserted), so those are under 1e-3 of the first.

    - score s_ij = scale q.k + c_p - c_j (+ bias b): the dot product of D terms
      errs by D u A_ij (A_ij = scale |q_i|.|k_j|), the scaling (before or after
      the product) by u A_ij and the adds by u (A_ij + |b| + |c_p| + |c_j| +
      |s_ij|); c is float64 rounded once (u |c|), and fla sums it in float32 (t u
      |c_t| at position t); ALiBi's float32 table is one rounding (u |b|). |c_t|
      is bounded by C_t, the sum of |log f| up to t (as a document restarts c,
      its c is smaller), so es_ij = u ((D + 2) A + 2 |b| + C_p + C_j + |s|) +
      err c_p + err c_j;
    - lse_i (an online softmax over the blocks of 256 keys, or torch's
      logsumexp): sum_j P es_ij from the scores, and r_i = (n + nb) u + (nb + 2)
      (3 u W_i + e) for the n weights' sum, exp (relative error e = 4 u: the
      compiled exp512 stays below 2 U on every float32 in (-87, 0], torch's exp
      within 1 ulp), the rescales of nb blocks and the subtraction of the max
      (u |s - m| <= 2 u W_i, W_i = max |s_ij| + ln n >= |lse_i|), log and the add;
    - a weight P = exp(s - lse) then errs relatively by ep_ij = es_ij + u (|s_ij|
      + |lse_i|) + e (its own) + err lse_i (common to the row);
    - out_i = sum_j P_ij v_j: sum_j P |v| (ep + r + 2 u) (the sum's n terms, a
      division by the row's sum or none);
    - delta_i = dO_i . out_i (posenc: DV products of a float32 out) or sum_j P dP
      (torch's softmax backward, fla): |dO| . err out + DV u |dO| . |out|, or
      sum_j P (|dP| (ep + (n + 1) u) + DV u |dO| . |v_j|);
    - dS = P (dP - delta), dP = dO . v (DV terms): the row's common errors (lse,
      delta) apart, err dS_ij <= E_ij = P (ep' |g| + 2 u |g| + DV u |dO| . |v|)
      (g = dP - delta, ep' = ep without err lse) + err lse_i |dS_ij| + err
      delta_i P_ij;
    - dq_i = scale sum_j dS_ij k_j: scale (sum_j E |k_j| + (k_len + 1) u sum_j |dS|
      |k_j|), and as err lse_i and err delta_i are common to the row, their
      share is err lse_i |dq_i| + err delta_i scale |sum_j P k_j| (no sum of
      magnitudes); dk_j and dv_j likewise over the group's queries (group q_len
      terms);
    - d log f_t: every score with t in (j, p] holds log f_t, so the gradient is
      the sum of dS_ij over the pairs j < t <= p_i. posenc sums each position's
      row of dS (as a query) minus its column (as a key), dc_s, and sums dc_s
      over s >= t in t's document (the backward of c's cumsum): the pairs with
      t <= j <= p_i are in both, the same float32 value added and subtracted, so
      only the pairs j < t <= p_i bring their errors, sum E_ij (each row's common
      share once: err lse_i |sum_j<t dS_ij| + err delta_i sum_j<t P_ij), and
      the sums round: dc_s is n_s terms (row and column) whose magnitudes add to
      R_s + C_s (|dS| along s's row and column), n_s u (R_s + C_s) in any order;
      fla sums dc in float32 too (k_len u more); c's float64 backward sums every
      dc_s of the row, s >= t: 2 k_len 2**-53 of their magnitudes, not small
      where the document's own terms vanish. Padding's gates get exactly 0.

    The flush to zero of the compiled loop (weights below e**-87 are 0, subnormal
    products are 0) moves no element by more than 2**-100 here (a few thousand
    operations of at most 2**-125 each).
    """
    q, k, v, dout, lf = (t.detach().double() for t in (q, k, v, dout, lf))
    b, h, lq, d = q.shape
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    group = h // hk
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    ok = allowed_pairs(lq, lk, mask, cu_seqlens, chunk_size).expand(b, h, lq, lk)
    live = lf if mask is None else lf.masked_fill(~mask[:, None], 0.0)
    c, cabs = live.cumsum(-1), live.abs().cumsum(-1)
    pos = torch.arange(lq) + lk - lq
    tb = torch.zeros(()) if bias is None else bias.double().bias(lq, lk).detach().abs()
    z = q @ kr.mT * scale
    za = q.abs() @ kr.abs().mT * scale
    s = (z + c[..., pos, None] - c[..., None, :]).masked_fill(~ok, 0.0)
    if bias is not None:
        s = s + bias.double().bias(lq, lk).detach()
    cerr = u * cabs * (torch.arange(lk).clamp(min=1) if naive else 1)
    cp, cj = (cabs + cerr / u)[..., pos, None], (cabs + cerr / u)[..., None, :]
    es = u * ((d + 2) * za + 2 * tb + cp + cj + s.abs())
    lse = torch.logsumexp(s.masked_fill(~ok, -math.inf), -1)
    w = torch.exp(s - lse.nan_to_num(0.0, neginf=0.0)[..., None]).masked_fill(~ok, 0.0)
    n = ok.sum(-1).double()
    nb = -(-lk // FORWARD_KEYS)
    big = s.abs().masked_fill(~ok, 0.0).amax(-1) + n.clamp(min=1).log()
    e = 4 * u
    r = (n + nb) * u + (nb + 2) * (3 * u * big + e)
    err_lse = ((w * es).sum(-1) + r)[..., None]
    own = (es + u * (s.abs() + lse.nan_to_num(0.0, neginf=0.0)[..., None].abs()) + e) * ok
    ep = own + err_lse * ok
    assert float(ep.max()) < 1e-3, "second-order terms no longer negligible"
    out = w @ vr
    t_out = (w * (ep + r[..., None] + 2 * u)) @ vr.abs()
    dp = dout @ vr.mT
    dpa = dout.abs() @ vr.abs().mT
    if naive:
        err_delta = (w * (dp.abs() * (ep + (n[..., None] + 1) * u) + dv * u * dpa)).sum(-1)
    else:
        err_delta = (dout.abs() * t_out).sum(-1) + dv * u * (dout * out).abs().sum(-1)
    err_delta = err_delta[..., None]
    g = dp - (dout * out).sum(-1, keepdim=True)
    ds = w * g
    dsa = ds.abs()
    pair = w * ((own + 2 * u) * g.abs() + dv * u * dpa)  # each pair's own errors
    full = pair + err_lse * dsa + err_delta * w

    def to_kv(x):
        return x.view(b, hk, group, lk, -1).sum(2)

    t_q = scale * (
        pair @ kr.abs() + (lk + 1) * u * dsa @ kr.abs()
        + err_lse * (ds @ kr).abs() + err_delta * (w @ kr).abs()
    )  # fmt: skip
    t_k = scale * to_kv(full.mT @ q.abs() + (group * lq + 1) * u * dsa.mT @ q.abs())
    t_v = to_kv((w * ep).mT @ dout.abs() + (group * lq + 1) * u * w.mT @ dout.abs())
    # the pairs j < t <= p_i of each t: per query, the keys before t
    before = torch.nn.functional.pad(torch.stack([pair, ds, w]).cumsum(-1), (1, -1))
    rect = before[0] + err_lse * before[1].abs() + err_delta * before[2]
    rect = (rect * (pos[:, None] >= torch.arange(lk)[None, :])).sum(-2)
    rows, count = torch.zeros(2, b, h, lk, dtype=torch.float64)
    rows[..., pos], count[..., pos] = dsa.sum(-1), n
    lines = rows + dsa.sum(-2)
    count = count + ok.sum(-2) + (lk if naive else 0)
    doc, _ = key_groups(lk, cu_seqlens)
    later = torch.arange(lk)[None, :] >= torch.arange(lk)[:, None]  # (t, s): s >= t
    same = (later & (doc[:, None] == doc[None, :])).double()
    t_g = rect + (u * count * lines) @ same.mT + 2 * lk * U64 * lines @ later.double().mT
    if mask is not None:
        t_g = t_g.masked_fill(~mask[:, None], 0.0)
    return [2 * t + 2.0**-100 for t in (t_out, t_q, t_k, t_v, t_g)]


def make(shape, seed, dtype=torch.float32):
    """q, k, v, dout and log gates (logsigmoid of N(2, 1) logits: f mostly 0.8 to 0.95)."""
    b, h, hk, lq, lk, d, dv = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=gen, dtype=dtype)
    k = torch.randn(b, hk, lk, d, generator=gen, dtype=dtype)
    v = torch.randn(b, hk, lk, dv, generator=gen, dtype=dtype)
    dout = torch.randn(b, h, lq, dv, generator=gen, dtype=dtype)
    logits = torch.randn(b, h, lk, generator=gen, dtype=dtype) + 2.0
    return q, k, v, dout, torch.nn.functional.logsigmoid(logits)


def refuse(name):
    def refused(*args, **kwargs):
        raise AssertionError(f"{name} ran")

    return refused


# (batch, heads, kv_heads, q_len, k_len, head_dim, v_dim): around the compiled loop's
# blocks (64 queries; 256 keys forward, 64 backward), a KV cache with grouped-query
# attention, a single query
SHAPES = {
    "one": (2, 2, 2, 1, 1, 16, 16),
    "block+1": (2, 2, 1, 65, 65, 16, 32),
    "cache-gqa": (1, 4, 2, 40, 300, 32, 16),
    "long": (1, 2, 2, 260, 260, 16, 16),
}


def test_the_papers_weights_on_three_tokens():
    # q = k = 0: every score is the decay alone, so query 2's weights are
    # (f1 f2, f2, 1) / (f1 f2 + f2 + 1): key 0 decays by the gates of tokens 1 and 2
    f = torch.tensor([0.3, 0.5, 0.25], dtype=torch.float64)
    v = torch.eye(3, dtype=torch.float64)[None, None]
    zeros = torch.zeros(1, 1, 3, 4, dtype=torch.float64)
    out = posenc.attention(zeros, zeros, v, causal=True, log_fgate=f.log()[None, None])
    last = torch.tensor([0.5 * 0.25, 0.25, 1.0], dtype=torch.float64)
    second = torch.tensor([0.5, 1.0, 0.0], dtype=torch.float64)
    assert torch.allclose(out[0, 0, 2], last / last.sum(), rtol=1e-15, atol=0)
    assert torch.allclose(out[0, 0, 1], second / second.sum(), rtol=1e-15, atol=0)
    assert torch.equal(out[0, 0, 0], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_float64_equals_the_dense_formula(shape):
    # float64 takes the blockwise path: the same sums as the dense formula in another
    # order, so 1e-12 covers them (k_len terms of size <= max|v| times 2**-52)
    q, k, v, dout, lf = make(shape, seed=1, dtype=torch.float64)
    lf.requires_grad_()
    for t in (q, k, v):
        t.requires_grad_()
    got = posenc.attention(q, k, v, causal=True, log_fgate=lf)
    want = fox_dense(q, k, v, lf, scale=shape[5] ** -0.5)
    assert (got - want).abs().max() < 1e-12
    for a, b in zip(
        torch.autograd.grad(got, (q, k, v, lf), dout),
        torch.autograd.grad(want, (q, k, v, lf), dout),
        strict=True,
    ):
        assert (a - b).abs().max() < 1e-10


def test_gradcheck_float64():
    q, k, v, _, lf = make((1, 2, 1, 5, 7, 4, 3), seed=2, dtype=torch.float64)
    mask = torch.tensor([[False, True, True, True, True, True, True]])
    inputs = tuple(t.requires_grad_() for t in (q, k, v, lf))

    def fn(q, k, v, lf):
        return posenc.attention(q, k, v, causal=True, log_fgate=lf, attention_mask=mask)

    assert torch.autograd.gradcheck(fn, inputs)
    packed = {"cu_seqlens": torch.tensor([0, 3, 7])}

    def fn_packed(q, k, v, lf):
        return posenc.attention(q, k, v, causal=True, log_fgate=lf, **packed)

    assert torch.autograd.gradcheck(fn_packed, inputs)


# the shapes above, packed documents (an empty one, one of one token, one across the
# compiled loops' blocks) with ALiBi, packed documents under a KV cache, chunks with
# grouped-query heads; in each the last row's first third of keys is padding
CASES = {
    **{name: {"shape": shape} for name, shape in SHAPES.items()},
    "packed-alibi": {
        "shape": (2, 4, 2, 150, 150, 16, 16),
        "cu_seqlens": [0, 3, 3, 4, 90, 150],
        "alibi": True,
    },
    "packed-cache": {"shape": (2, 2, 2, 70, 200, 16, 16), "cu_seqlens": [0, 60, 61, 200]},
    "chunked": {"shape": (2, 2, 1, 130, 130, 16, 16), "chunk_size": 48},
}
NAMES = ("out", "dq", "dk", "dv", "dlog_fgate")


def assert_within(got, exact, bounds, names=NAMES):
    """Every element of each ``got`` within its bound of float64 ``exact``, and the bounds
    small enough to see a 1% error in dS.

    The final rounding of each float32 result (U |exact|) comes on top. A 1% error
    in dS (every dS scaled by 1.01: the row sums stay 0) moves dq, dk and the gates'
    gradient, sums of dS times q, k or 1, by 1% of themselves: the test must then
    fail where the bound (plus the result's own error, itself within the bound) is
    below 0.5% of |exact|; asserted at each one's largest element (dv and out do
    not depend on dS, and a gradient within its bound of 0, as with one key, has no
    1% to see).
    """
    failed = []
    for name, a, want, bound in zip(names, got, exact, bounds, strict=True):
        a, want = a.detach().double(), want.detach()
        limit = bound + U * want.abs()
        err = (a - want).abs()
        if not (err <= limit).all():
            failed.append(f"{name}: error {float((err / limit).max()):.3g} times its bound")
        if name in ("dq", "dk", "dlog_fgate") and bool(want.abs().max() > limit.max()):
            top = want.abs().argmax()
            ratio = float(limit.flatten()[top] / want.abs().flatten()[top])
            assert ratio < 0.005, f"{name}: bound {ratio:.3g} of the largest gradient"
    assert not failed, "; ".join(failed)


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_float32_within_the_bounds(case, backend, monkeypatch):
    if backend == "kernel":  # the compiled loop, forwards and backwards, or a failure
        monkeypatch.setattr(softmax, "forward_blockwise", refuse("the blockwise forward"))
        monkeypatch.setattr(softmax, "backward_blockwise", refuse("the blockwise backward"))
    shape = case["shape"]
    q, k, v, dout, lf = make(shape, seed=3)
    mask = torch.ones(shape[0], shape[4], dtype=torch.bool)
    mask[-1, : shape[4] // 3] = False  # the last row left-padded
    cu, chunk = case.get("cu_seqlens"), case.get("chunk_size")
    bias = ALiBi(shape[1]) if case.get("alibi") else None
    leaves = [t.requires_grad_() for t in (q, k, v, lf)]
    scale = shape[5] ** -0.5
    kw = {"mask": mask, "cu_seqlens": cu, "chunk_size": chunk, "bias": bias}
    out = posenc.attention(
        q, k, v, causal=True, log_fgate=lf, attention_mask=mask, backend=backend, bias=bias,
        cu_seqlens=None if cu is None else torch.tensor(cu), chunk_size=chunk,
    )  # fmt: skip
    grads = torch.autograd.grad(out, leaves, dout)
    ref = [t.detach().double().requires_grad_() for t in leaves]
    want = fox_dense(*ref, scale=scale, **kw)
    want_grads = torch.autograd.grad(want, ref, dout.double())
    assert_within(
        (out, *grads), (want, *want_grads), fox_bounds(q, k, v, dout, lf, scale=scale, **kw)
    )


def _ds_sums(q, k, v, dout, lf, scale, mask):
    """Per position, the float64 sums of |dS| along its row (as a query) and its
    column (as a key), (batch, heads, k_len) each; heads == kv_heads."""
    q, k, v, dout, lf = (t.detach().double() for t in (q, k, v, dout, lf))
    lq, lk = q.shape[2], k.shape[2]
    c = lf.masked_fill(~mask[:, None], 0.0).cumsum(-1)
    p = torch.arange(lq) + lk - lq
    s = q @ k.transpose(-1, -2) * scale + (c[:, :, p, None] - c[:, :, None, :])
    allowed = (torch.arange(lk)[None, :] <= p[:, None])[None, None] & mask[:, None, None, :]
    w = torch.softmax(s.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0)
    dp = dout @ v.transpose(-1, -2)
    ds = (w * (dp - (w * dp).sum(-1, keepdim=True))).abs()
    rows = torch.zeros(c.shape, dtype=torch.float64)
    rows[:, :, p] = ds.sum(-1)
    return rows, ds.sum(-2)


@pytest.mark.parametrize("cache", [False, True])
def test_kernel_gate_gradient_is_its_own_dS(cache, monkeypatch):
    # An extra channel of ones in q and k adds scale to every score (the softmax is
    # the same) and makes the compiled loop's own dq and dk carry dS's row and
    # column sums in that channel: dq_i = scale sum_j dS_ij, dk_j = scale sum_i
    # dS_ij, from the float32 dS the gate's gradient is made of. The gate's dc is
    # then (dq at the query's key position - dk) / scale (scale 1/4: exact), and
    # d log f its reverse cumulative sum within each document (0 on padding).
    # Both are float32 sums of the same dS values in other orders: n terms err by
    # at most (n - 1) U sum |terms| each, so dc_s by 2 (k_len U R_s + q_len U C_s)
    # (R, C: |dS| summed along s's row and column, from float64: doubled for the
    # float32 dS's own error) plus U |dc_s| for the kernel's row-minus-column, and
    # d log f_t by the sum of those over s >= t plus U |d log f_t|.
    monkeypatch.setattr(softmax, "backward_blockwise", refuse("the blockwise backward"))
    monkeypatch.setattr(softmax, "forward_blockwise", refuse("the blockwise forward"))
    lq, lk = (70, 200) if cache else (150, 150)
    q, k, v, dout, lf = make((2, 2, 2, lq, lk, 16, 16), seed=14)
    mask = torch.ones(2, lk, dtype=torch.bool)
    mask[1, :40] = False
    cu = torch.tensor([0, 60, 61, lk]) if cache else None
    ones = torch.zeros(2, 2, 1, 16)
    ones[..., 0] = 1.0
    q = torch.cat([q, ones.expand(2, 2, lq, 16)], -1).requires_grad_()
    k = torch.cat([k, ones.expand(2, 2, lk, 16)], -1).requires_grad_()
    lf.requires_grad_()
    out = posenc.attention(
        q, k, v, causal=True, scale=0.25, log_fgate=lf, attention_mask=mask, cu_seqlens=cu,
        backend="kernel",
    )  # fmt: skip
    dq, dk, dlf = torch.autograd.grad(out, (q, k, lf), dout)
    dc = -dk[..., 16].double() / 0.25
    dc[:, :, lk - lq :] += dq[..., 16].double() / 0.25
    rows, cols = _ds_sums(q, k, v, dout, lf, 0.25, mask)
    err = 2 * 2 * U * (lk * rows + lq * cols) + U * dc.abs()
    starts = [0, lk] if cu is None else cu.tolist()
    want, bound = torch.zeros_like(dc), torch.zeros_like(dc)
    for a, b in itertools.pairwise(starts):
        want[..., a:b] = dc[..., a:b].flip(-1).cumsum(-1).flip(-1)
        bound[..., a:b] = err[..., a:b].flip(-1).cumsum(-1).flip(-1)
    want = want.masked_fill(~mask[:, None], 0.0)
    assert ((dlf.double() - want).abs() <= bound + U * want.abs()).all()
    assert (dlf[1, :, :40] == 0).all()


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
def test_with_alibi_and_rotary(backend, monkeypatch):
    if backend == "kernel":
        monkeypatch.setattr(softmax, "forward_blockwise", refuse("the blockwise forward"))
        monkeypatch.setattr(softmax, "backward_blockwise", refuse("the blockwise backward"))
    # rotary= rotates q and k in float32 before the scores (the output is bit for bit
    # that of the rotated q and k passed in: the forward sums in a fixed order), so the
    # float64 formula is taken at those rotated inputs, with fox_bounds; the gradients
    # of q and k then go back through the rotation: in float64 by exact tables for the
    # reference, in float32 by posenc. With the half layout channel d pairs with d + 8
    # (mod 16): the rotation by -theta carries the error bounds e of a pair into
    # |cos| e_d + |sin| e_pair <= e_d + e_pair, and adds its own rounding, the tables'
    # (U each), the two products' and the add's: 4 U (|g_d| + |g_pair|).
    shape = (1, 4, 2, 70, 70, 16, 16)
    q, k, v, dout, lf = make(shape, seed=4)
    bias, rotary = ALiBi(4), posenc.Rotary(16)
    kw = {"causal": True, "bias": bias, "backend": backend}
    leaves = [t.requires_grad_() for t in (q, k, v, lf)]
    out = posenc.attention(q, k, v, log_fgate=lf, rotary=rotary, **kw)
    grads = torch.autograd.grad(out, leaves, dout)
    with torch.no_grad():
        rq, rk = rotary(q, k)
        assert torch.equal(out, posenc.attention(rq, rk, v, log_fgate=lf, **kw))
    ref = [t.detach().double().requires_grad_() for t in (rq, rk, v, lf)]
    want = fox_dense(*ref, scale=0.25, bias=bias)
    want_grads = list(torch.autograd.grad(want, ref, dout.double()))
    t_out, t_q, t_k, t_v, t_g = fox_bounds(rq, rk, v, dout, lf, scale=0.25, bias=bias)

    def back(bound, grad):
        return bound + bound.roll(8, -1) + 4 * U * (grad.abs() + grad.abs().roll(8, -1))

    t_q, t_k = back(t_q, want_grads[0]), back(t_k, want_grads[1])
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    exact = posenc.Rotary(16).double()(q64, k64)
    want_grads[:2] = torch.autograd.grad(exact, (q64, k64), want_grads[:2])
    assert_within((out, *grads), (want, *want_grads), (t_out, t_q, t_k, t_v, t_g))


def test_zero_gates_are_plain_causal_attention():
    q, k, v, _, lf = make((1, 2, 2, 30, 30, 16, 16), seed=5)
    got = posenc.attention(q, k, v, causal=True, log_fgate=torch.zeros_like(lf))
    assert torch.equal(got, posenc.attention(q, k, v, causal=True))


@settings(max_examples=20, deadline=None)
@given(
    length=st.integers(1, 40),
    q_len=st.integers(1, 40),
    heads=st.sampled_from([1, 2, 4, 8]),
    backend=st.sampled_from(["kernel", "blockwise"]),
)
def test_constant_gates_are_alibi(length, q_len, heads, backend):
    # log f_t = -m per head gives c_p - c_j = -m (p - j): ALiBi's causal bias with
    # slope m. Both runs round the same scores differently (the gate's cumulative
    # sum against ALiBi's table): the scores agree to U (|s| + 2 m L) each, which
    # moves a weight by twice that relatively, and an output element by that
    # times max|v| (weights sum to 1); doubled.
    q_len = min(q_len, length)
    q, k, v, _, _ = make((2, heads, heads, q_len, length, 16, 16), seed=length)
    slopes = torch.tensor(posenc.alibi_slopes(heads), dtype=torch.float32)
    lf = (-slopes)[None, :, None].expand(2, heads, length)
    got = posenc.attention(q, k, v, causal=True, log_fgate=lf, backend=backend)
    want = posenc.attention(q, k, v, causal=True, bias=ALiBi(heads), backend=backend)
    smax = float((q @ k.transpose(-1, -2)).abs().max()) / 4 + float(slopes.max()) * length
    tol = 2 * 2 * U * (smax + 2 * float(slopes.max()) * length) * float(v.abs().max())
    assert (got - want).abs().max() <= tol + 16 * U


def test_a_cache_of_keys_equals_the_last_queries():
    q, k, v, _, lf = make((1, 2, 2, 50, 50, 16, 16), seed=6, dtype=torch.float64)
    full = posenc.attention(q, k, v, causal=True, log_fgate=lf)
    tail = posenc.attention(q[:, :, -7:], k, v, causal=True, log_fgate=lf)
    assert (tail - full[:, :, -7:]).abs().max() < 1e-13


def test_padding_gates_do_not_count():
    # a left-padded row equals its tokens alone, whatever its padding's gates hold
    q, k, v, _, lf = make((1, 2, 2, 20, 20, 16, 16), seed=7, dtype=torch.float64)
    mask = torch.ones(1, 20, dtype=torch.bool)
    mask[0, :6] = False
    noisy = lf.clone()
    noisy[..., :6] = -50.0
    got = posenc.attention(q, k, v, causal=True, log_fgate=noisy, attention_mask=mask)
    alone = posenc.attention(
        q[:, :, 6:], k[:, :, 6:], v[:, :, 6:], causal=True, log_fgate=lf[..., 6:]
    )
    assert (got[:, :, 6:] - alone).abs().max() < 1e-13


CU = [0, 3, 3, 4, 90, 150]


def _alone(q, k, v, lf, cu, **kw):
    return torch.cat(
        [
            posenc.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], log_fgate=lf[..., a:b], **kw)
            for a, b in itertools.pairwise(cu)
            if b > a
        ],
        dim=2,
    )


def test_packed_documents_equal_each_alone():
    # packing restarts the rotary positions and c per document: in float64 (the
    # blockwise path) the same sums as each document alone, in another order, to
    # 1e-12 (150 terms of size < 10 times 2**-52). float32 packed documents are held
    # to the float64 formula in test_float32_within_the_bounds (packed-*), the
    # rotation in test_with_alibi_and_rotary.
    kw = {"causal": True, "rotary": posenc.Rotary(16), "bias": ALiBi(4)}
    q, k, v, dout, lf = make((2, 4, 2, CU[-1], CU[-1], 16, 16), seed=8, dtype=torch.float64)
    leaves = [t.requires_grad_() for t in (q, k, v, lf)]
    got = posenc.attention(q, k, v, log_fgate=lf, cu_seqlens=torch.tensor(CU), **kw)
    want = _alone(q, k, v, lf, CU, **kw)
    assert (got - want).abs().max() < 1e-12
    for a, b in zip(
        torch.autograd.grad(got, leaves, dout),
        torch.autograd.grad(want, leaves, dout),
        strict=True,
    ):
        assert (a - b).abs().max() < 1e-11


def test_document_ids_per_row_equal_each_alone():
    q, k, v, _, lf = make((2, 2, 2, 30, 30, 16, 16), seed=9, dtype=torch.float64)
    ids = torch.tensor([[0] * 10 + [1] * 20, [0] * 25 + [1] * 5])
    got = posenc.attention(q, k, v, causal=True, log_fgate=lf, document_ids=ids)
    for row, cu in ((0, [0, 10, 30]), (1, [0, 25, 30])):
        r = slice(row, row + 1)
        want = _alone(q[r], k[r], v[r], lf[r], cu, causal=True)
        assert (got[r] - want).abs().max() < 1e-13


def test_flex_forward_on_cpu():
    # compiled FlexAttention (forward only on the CPU), with padding and ALiBi:
    # float32, to the float32 bound of the kernel test (1e-5 for these sizes)
    q, k, v, _, lf = make((2, 2, 2, 24, 24, 16, 16), seed=10)
    mask = torch.ones(2, 24, dtype=torch.bool)
    mask[1, :5] = False
    with torch.no_grad():
        got = posenc.attention(
            q, k, v, causal=True, log_fgate=lf, attention_mask=mask, bias=ALiBi(2),
            backend="flex",
        )  # fmt: skip
    want = fox_dense(q, k, v, lf, scale=0.25, bias=ALiBi(2), mask=mask)
    assert (got.double() - want).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"causal": False}, ValueError, "log_fgate .*causal=True"),
        ({"log_fgate": torch.zeros(1, 2, 9)}, ValueError, r"\(batch, heads, k_len\) = \(1, 2, 8\)"),
        ({"log_fgate": torch.zeros(1, 1, 8)}, ValueError, "log_fgate must be"),
        ({"log_fgate": torch.zeros(1, 2, 8, dtype=torch.long)}, TypeError, "log_fgate must be"),
        ({"log_fgate": [0.0] * 8}, TypeError, "log_fgate must be a float"),
    ],
)  # fmt: skip
def test_bad_gates_are_refused(kwargs, error, match):
    q = torch.zeros(1, 2, 8, 16)
    kw = {"causal": True, "log_fgate": torch.zeros(1, 2, 8), **kwargs}
    with pytest.raises(error, match=match):
        posenc.attention(q, q, q, **kw)


def test_forget_gate_is_the_references_layer():
    torch.manual_seed(11)
    gate = ForgetGate(12, 3)
    assert torch.equal(gate.proj.bias, torch.zeros(3))
    # the reference's init: weight ~ N(0, 0.02), drawn by nn.init.normal_ from the same seed
    torch.manual_seed(12)
    gate.reset_parameters()
    torch.manual_seed(12)
    assert torch.equal(gate.proj.weight, torch.nn.init.normal_(torch.empty(3, 12), std=0.02))
    with torch.no_grad():
        gate.proj.bias.copy_(torch.tensor([0.5, -1.0, 3.0]))
    x = torch.randn(2, 5, 12, dtype=torch.bfloat16)
    out = gate.to(torch.bfloat16)(x)
    assert out.dtype == torch.float32 and out.shape == (2, 3, 5)
    # logits in bfloat16 (the Linear's dtype), then logsigmoid in float32, as the reference
    logits = torch.nn.functional.linear(x, gate.proj.weight, gate.proj.bias).double()
    want = torch.nn.functional.logsigmoid(logits).transpose(1, 2)
    assert (out.double() - want).abs().max() <= 4 * U * (1 + want.abs().max())


def test_forget_gate_trains_through_attention():
    torch.manual_seed(13)
    gate = ForgetGate(16, 2)
    x = torch.randn(1, 9, 16)
    q = k = v = x.view(1, 9, 2, 8).transpose(1, 2)
    out = posenc.attention(q, k, v, causal=True, log_fgate=gate(x))
    out.square().sum().backward()
    assert gate.proj.weight.grad is not None and gate.proj.weight.grad.abs().sum() > 0


def test_forget_gate_refuses_bad_input():
    with pytest.raises(TypeError, match="heads"):
        ForgetGate(8, 2.0)
    with pytest.raises(ValueError, match="hidden"):
        ForgetGate(0, 2)
    with pytest.raises(ValueError, match=r"x must be \(batch, seq, hidden\) with hidden=8"):
        ForgetGate(8, 2)(torch.zeros(1, 3, 7))
    with pytest.raises(TypeError, match="x must be a float"):
        ForgetGate(8, 2)(torch.zeros(1, 3, 8, dtype=torch.long))


def _gate_bounds(q, k, v, dout, lf, scale, mask, bias=None):
    """Bounds of float32 out, dq, dk, dv and d log_fgate against float64.

    The gate enters as a bias ``c[p] - c[j]`` (the block below) whose float32 error
    is at most 4 U max|c|: c is rounded once from its float64 sum (U |c|) and the
    difference of two such values adds U (|c_p| + |c_j|) + U |c_p - c_j|.
    tests/test_attention_backward.bounds does the rest (its eta bounds a weight's
    dS error relative to the weight, A the largest |dP| + |delta|). dc of position
    t is the row sum of dS over the keys minus the column sum over the queries;
    d log f is its reverse cumulative sum (taken in float64: c is summed there),
    which adds up parts of every row and column of one head: the weights of all
    rows sum to q_len, so its error is at most q_len (eta + (k_len + 1) U A) from
    the rows and as much, with q_len + 1, from the columns, plus the final
    rounding (folded into the caller's U |exact|). Doubled for second-order terms,
    as there. These worst cases are loose (a wrong gate gradient can pass them):
    the CUDA test below keeps them, as FlexAttention's roundings on the GPU (its
    exp2, Triton's sums) are not those :func:`fox_bounds` counts; on the CPU,
    test_float32_within_the_bounds holds both paths to :func:`fox_bounds`.
    """
    q, k, v, dout, lf = (t.detach() for t in (q, k, v, dout, lf))
    b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
    m = torch.ones(b, lk, dtype=torch.bool) if mask is None else mask
    c = lf.double().masked_fill(~m[:, None], 0.0).cumsum(-1)

    def block(q_pos, k_pos):
        gate = c[:, :, q_pos, None] - c[:, :, None, k_pos]
        if bias is None:
            return gate
        return gate + bias.double().relative_bias(k_pos[None, :] - q_pos[:, None]).detach()

    err_c = 4 * U * float(c.abs().max())
    if bias is not None:
        err_c += 8 * U * float(bias.double().bias(lq, lk).abs().max())
    tq, tk, tv, _, _, eta, amax, err_out = bounds(
        q, k, v, dout, None, causal=True, scale=scale, mask=m, block=block, bias_error=err_c
    )
    dlf = lq * (2 * eta + (lk + lq + 2) * U * amax)
    return err_out, tq, tk, tv, 2 * dlf


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_flex_on_cuda_forward_and_backward():
    # what "auto" takes on a GPU: the gate in FlexAttention's score mod, its gradient
    # through the captured c; float32, held to the float32 bounds above (FlexAttention
    # rounds as the compiled loop does: float32 scores, softmax and sums), with a KV
    # cache, grouped-query attention and left padding
    shape = (2, 4, 2, 96, 160, 64, 64)
    q, k, v, dout, lf = make(shape, seed=15)
    mask = torch.ones(2, shape[4], dtype=torch.bool)
    mask[1, :50] = False
    leaves = [t.cuda().requires_grad_() for t in (q, k, v, lf)]
    out = posenc.attention(
        *leaves[:3], causal=True, log_fgate=leaves[3], attention_mask=mask.cuda(), backend="flex"
    )
    grads = torch.autograd.grad(out, leaves, dout.cuda())
    ref = [t.double().requires_grad_() for t in (q, k, v, lf)]
    want = fox_dense(*ref, scale=0.125, mask=mask)
    want_grads = torch.autograd.grad(want, ref, dout.double())
    tolerances = _gate_bounds(q, k, v, dout, lf, 0.125, mask)
    for got, exact, tol in zip((out, *grads), (want, *want_grads), tolerances, strict=True):
        assert (got.cpu().double() - exact).abs().max() <= tol + U * exact.abs().max()


def test_chunks_equal_each_chunk_alone():
    # chunked attention (chunk_size) confines keys as documents do; the gates' sum
    # over (j, p] is the same whichever chunk c starts in
    q, k, v, _, lf = make((1, 2, 2, 40, 40, 16, 16), seed=16, dtype=torch.float64)
    got = posenc.attention(q, k, v, causal=True, log_fgate=lf, chunk_size=16)
    assert (got - _alone(q, k, v, lf, [0, 16, 32, 40], causal=True)).abs().max() < 1e-13


def test_the_loop_leaves_subnormals_as_they_were():
    # the compiled loop flushes subnormal results to zero on its threads while it
    # runs (strong decay puts weights near 2**-126) and restores the control word
    tiny = np.float32(2.0**-140)
    assert tiny * np.float32(1.0) > 0
    q, k, v, dout, lf = make((1, 2, 2, 64, 64, 16, 16), seed=17)
    lf = (lf - 2.0).requires_grad_()
    posenc.attention(q, k, v, causal=True, log_fgate=lf, backend="kernel").backward(dout)
    assert tiny * np.float32(1.0) == tiny > 0
    assert torch.tensor([2.0**-140]).mul(1.0).item() > 0
