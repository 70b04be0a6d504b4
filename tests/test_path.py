"""PaTH attention (posenc.integration.attention.path) and its layer (path_layer.PaTH).

PaTH (Yang et al. 2025): ``score(i, j) = q_i^T H_i ... H_{j+1} k_j``, ``H_s = I -
beta_s w_s w_s^T``, causal softmax, optional forget gates added before the scale
(flash-linear-attention's convention). Checked against:

- :func:`dense`, this file's float64 restatement of the formula with every product
  of transforms materialised as a ``(head_dim, head_dim)`` matrix (GQA by repeating
  kv heads, packed documents one by one);
- fla-core's ``naive_path_attn`` (``fla/ops/path_attn/naive.py``, loaded by path as
  tests/test_fla.py loads fla's other references), in float32 as it computes.

Error bounds. Every bound here is first order, built in float64 from the magnitudes
of the terms of one computation in a precision of unit roundoff u (``U32 = 2^-24``,
``U64 = 2^-53``); a comparison of two computations adds their two bounds, and the
sum is doubled for the second-order terms (every relative error involved is below
1e-2, asserted: the second-order terms are below 1% of the first). A product of
inner dimension n errs by at most ``n u |X||Y|`` (componentwise), a sum or
difference by u times its terms' magnitudes.

Scores ``a_ij = q_i^T H_i ... H_{j+1} k_j`` (:func:`chunk_score_errors`, for fla's
algorithm and posenc's: chunks of C positions, ``T = (I + tril_-1(diag(beta) W
W^T))^-1``, queries carried to their chunk's start, keys to its end, one chunk
product ``I - W^T T diag(beta) W`` per chunk between them):

- within a chunk, componentwise through every product; the computed inverse (fla's
  row loop, posenc's solve: both substitution) errs by at most ``C u |T||I + L||T|``
  (Higham, Accuracy and Stability of Numerical Algorithms, Thm 8.5, column by column)
  plus ``|T| err(L) |T|`` from its entries' own error;
- between chunks, normwise per query: each chunk product is exactly a product of
  transforms of 2-norm at most 1 (unit ``w``, ``0 < beta < 2``), so the carried
  query's error never grows, it only gains each step's rounding.

The sequential algorithms (:func:`dense`'s explicit matrices; the layer's decoding,
one rank-one update per position) are bounded normwise per step
(:func:`chain_score_errors`): ``u |q_i| |k_j| ((i - j) per_step + base)``.

Softmax, output and gradients (:func:`propagate`): the score errors, the gate's
cumulative sum (``(t + 5) u sum |g|``), exp (4 u), the row max, sum and division, as
tests/test_fox.py's fox_bounds; then the backward's ``dP``, ``delta`` and ``dS``.
The gradients of q, k, w and beta are sums over the pairs (i, j) of ``dA_ij``
times the exact sensitivities of ``a_ij``, bounded with the transforms being
contractions: ``|d a/d q_i| <= |k_j|``, ``|d a/d k_j| <= |q_i|``, ``|d a/d w_t| <=
2 beta_t |q_i||k_j|`` and ``|d a/d beta_t| <= |q_i||k_j|`` (``j < t <= i``). Their
error: ``err(dA_ij)`` carried by those sensitivities, plus the reverse pass's own
rounding, which applies the transposes of the forward's factors over the same
inner dimensions (at most twice the forward's relative error ``eps_ij``, one
product per operand) and sums the pairs' contributions (``N = group * L^2`` terms
at most, ``N u``).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

from gpu_markers import no_cuda
from posenc.core.checks import MAX_ELEMENTS
from posenc.integration.attention.path import path_attention, path_keys
from posenc.integration.path_layer import PaTH, PaTHCache
from test_stick_breaking import _Largest  # records the largest op output

U32 = 2.0**-24
U64 = 2.0**-53
#: how far above the bound a deliberate mistake must land (the bound is that tight)
MUTANT_FACTOR = 100.0


def make(b, h, hk, length, d, dv, seed, *, gate=True):
    """float32-exact float64 inputs: q, k, v, unit w, beta in (0, 2), log gates, dout."""
    gen = torch.Generator().manual_seed(seed)

    def draw(*size):
        return torch.randn(size, generator=gen)

    q, k, v = draw(b, h, length, d), draw(b, hk, length, d), draw(b, hk, length, dv)
    w = F.normalize(draw(b, hk, length, d).double(), dim=-1).float()
    beta = 2 * torch.sigmoid(draw(b, hk, length))
    lf = F.logsigmoid(draw(b, h, length) + 2) if gate else None
    dout = draw(b, h, length, dv)
    return tuple(None if t is None else t.double() for t in (q, k, v, w, beta, lf, dout))


def _heads(t, h):
    """kv heads -> query heads (query head h reads kv head h // group)."""
    return t.repeat_interleave(h // t.shape[1], 1)


def dense_scores(q, k, w, beta):
    """``a_ij = q_i^T H_i ... H_{j+1} k_j`` ``(B, H, L, L)``, -inf above the diagonal,
    each product of transforms materialised as a (D, D) matrix."""
    b, h, length, d = q.shape
    k, w, beta = (_heads(t, h) for t in (k, w, beta))
    eye = torch.eye(d, dtype=q.dtype)
    a = torch.full((b, h, length, length), -math.inf, dtype=q.dtype)
    for i in range(length):
        m = eye.expand(b, h, d, d)
        for j in range(i, -1, -1):
            a[:, :, i, j] = ((q[:, :, i, None] @ m) @ k[:, :, j, :, None])[..., 0, 0]
            hj = eye - beta[:, :, j, None, None] * w[:, :, j, :, None] * w[:, :, j, None, :]
            m = m @ hj
    return a


def dense(q, k, v, w, beta, log_fgate=None, *, scale=None, cu_seqlens=None):
    """The formula in q's dtype with every score materialised; documents one by one."""
    if cu_seqlens is not None:
        outs = []
        for a, b in itertools.pairwise(cu_seqlens.tolist()):
            if b > a:
                part = [t[:, :, a:b] for t in (q, k, v, w, beta)]
                lf = None if log_fgate is None else log_fgate[:, :, a:b]
                outs.append(dense(*part, lf, scale=scale))
        return torch.cat(outs, 2)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    a = dense_scores(q, k, w, beta)
    if log_fgate is not None:
        c = log_fgate.cumsum(-1)
        a = a + c[..., :, None] - c[..., None, :]
    return torch.softmax(a * scale, -1) @ _heads(v, q.shape[1])


# ----------------------------------------------------------------------------- bounds


def chunk_stages(q, k, w, beta, chunk, u):
    """The chunked algorithm's per-chunk quantities and their componentwise error
    bounds (module docstring), ``(B, H, n, C, ...)`` with k, w, beta on q's heads."""
    b, h, length, d = k.shape
    n = -(-length // chunk)
    pad = n * chunk - length
    c = chunk
    k, w = (F.pad(t, (0, 0, 0, pad)).view(b, h, n, c, d) for t in (k, w))
    beta = F.pad(beta, (0, pad)).view(b, h, n, c)
    a = torch.abs
    lower = torch.ones(c, c, dtype=torch.bool).tril(-1)
    eye = torch.eye(c, dtype=k.dtype)
    wb = w * beta[..., None]
    e_wb = u * a(wb)
    lm = (wb @ w.mT) * lower
    e_l = (d + 1) * u * (a(wb) @ a(w).mT) * lower
    t = torch.linalg.solve_triangular(eye + lm, eye.expand_as(lm), upper=False)
    e_t = c * u * a(t) @ a(eye + lm) @ a(t) + a(t) @ e_l @ a(t)
    m1 = (wb @ k.mT) * lower
    e_m1 = (d + 1) * u * (a(wb) @ a(k).mT) * lower
    tk, tw = t @ m1, t @ wb
    e_tk = e_t @ a(m1) + a(t) @ e_m1 + c * u * a(t) @ a(m1)
    e_tw = e_t @ a(wb) + a(t) @ e_wb + c * u * a(t) @ a(wb)
    out = {
        "n": n,
        "kh": k - tk.mT @ w,
        "e_kh": e_tk.mT @ a(w) + c * u * a(tk).mT @ a(w) + u * (a(k) + a(tk.mT @ w)),
        "hm": w.mT @ tw,
        "e_h": a(w).mT @ e_tw + c * u * a(w).mT @ a(tw),
    }
    if q is None:
        return out
    q = F.pad(q, (0, 0, 0, pad)).view(b, h, n, c, d)
    tri = torch.ones(c, c, dtype=torch.bool).tril()
    qw = (q @ w.mT) * tri
    e_qw = d * u * (a(q) @ a(w).mT) * tri
    qk = (q @ k.mT) * tri
    out["e_loc"] = (
        d * u * (a(q) @ a(k).mT)
        + e_qw @ a(tk)
        + a(qw) @ e_tk
        + c * u * a(qw) @ a(tk)
        + u * (a(qk) + a(qw @ tk))
    ) * tri
    out["qh"] = q - qw @ tw
    out["e_qh"] = e_qw @ a(tw) + a(qw) @ e_tw + c * u * a(qw) @ a(tw) + u * (a(q) + a(qw @ tw))
    return out


def chunk_score_errors(q, k, w, beta, chunk, u):
    """``(B, H, L, L)`` bounds on the error of every score of the chunked algorithm."""
    b, h, length, d = q.shape
    s = chunk_stages(q, *(_heads(t, h) for t in (k, w, beta)), chunk, u)
    n, c, a = s["n"], chunk, torch.abs
    err = torch.zeros(b, h, n * c, n * c, dtype=q.dtype)
    for i in range(n):
        rows = slice(i * c, (i + 1) * c)
        err[..., rows, rows] = s["e_loc"][:, :, i]
        x = s["qh"][:, :, i]
        e = s["e_qh"][:, :, i].norm(dim=-1)  # normwise from here: contractions follow
        for j in range(i - 1, -1, -1):
            kh, hm = s["kh"][:, :, j], s["hm"][:, :, j]
            err[..., rows, j * c : (j + 1) * c] = (
                e[..., None] * kh.norm(dim=-1)[..., None, :]
                + a(x) @ s["e_kh"][:, :, j].mT
                + d * u * a(x) @ a(kh).mT
            )
            xh = x @ hm
            step = a(x) @ s["e_h"][:, :, j] + d * u * a(x) @ a(hm) + u * (a(x) + a(xh))
            e = e + step.norm(dim=-1)
            x = x - xh
    return err[..., :length, :length]


def chain_score_errors(q, k, u, per_step, base, *, start=None):
    """``u |q_i| |k_j| ((i - max(j, start)) per_step + base)``: a score reached by one
    rank-one transform per position, each erring by ``per_step u`` times the carried
    vector (no growth: contractions); ``start`` the first position so reached."""
    h, length = q.shape[1], q.shape[2]
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    steps = (i - (j if start is None else j.clamp(min=start - 1))).clamp(min=0)
    size = q.norm(dim=-1)[..., :, None] * _heads(k, h).norm(dim=-1)[..., None, :]
    return u * size * (steps * per_step + base) * (j <= i)


def dense_errors(q, k, u):
    """:func:`dense`'s scores: ``m <- m (I - beta w w^T)`` with H formed explicitly
    (9 u |m|: two products and a difference, ``|H| <= 1 + beta``) and the product's
    ``d u |m||H|``, ``|| |m| || <= sqrt(d) |m|``; then ``q^T m k``, 2 d sqrt(d) u."""
    d = q.shape[-1]
    return chain_score_errors(q, k, u, 3 * d * math.sqrt(d) + 9, 2 * d * math.sqrt(d))


def propagate(q, k, v, w, beta, lf, dout, scale, err_a, u):
    """Bounds of ``[out, dq, dk, dv, dw, dbeta, dg]`` (module docstring) of one
    computation whose scores err by ``err_a``; only ``[out]`` without ``dout``."""
    b, h, length, d = q.shape
    group = h // k.shape[1]
    a_abs = torch.abs
    seen = torch.ones(length, length, dtype=torch.bool).tril()
    scores = dense_scores(q, k, w, beta).masked_fill(~seen, 0.0)
    if lf is None:
        c = err_c = torch.zeros(b, h, length, dtype=q.dtype)
    else:
        c = lf.cumsum(-1)
        err_c = (torch.arange(length) + 5) * u * lf.abs().cumsum(-1)
    ci, cj = c[..., :, None], c[..., None, :]
    z = scale * (scores + ci - cj) * seen
    err_c2 = err_c[..., :, None] + err_c[..., None, :]
    err_z = scale * (err_a + err_c2 + 2 * u * (a_abs(scores) + a_abs(ci) + a_abs(cj)))
    err_z = err_z + 2 * u * a_abs(z)
    p = torch.softmax(z.masked_fill(~seen, -math.inf), -1)
    top = z.masked_fill(~seen, -math.inf).amax(-1, keepdim=True)
    ep = (err_z + u * a_abs(z - top) + 4 * u) * seen
    r = (p * ep).sum(-1, keepdim=True) + (length + 1) * u
    assert float((ep + r).max()) < 1e-2, "second-order terms no longer negligible"
    err_p = p * (ep + r)
    vh = _heads(v, h)
    bounds = [err_p @ a_abs(vh) + (length + 1) * u * p @ a_abs(vh)]
    if dout is None:
        return bounds

    def to_kv(x):
        return x.view(b, h // group, group, *x.shape[2:]).sum(2)

    dv = v.shape[-1]
    dp = dout @ vh.mT
    err_dp = dv * u * a_abs(dout) @ a_abs(vh).mT
    err_dv = to_kv(err_p.mT @ a_abs(dout) + (length + group + 1) * u * p.mT @ a_abs(dout))
    delta = (p * dp).sum(-1, keepdim=True)
    err_delta = (err_p * a_abs(dp) + p * err_dp).sum(-1, keepdim=True) + (length + 1) * u * (
        p * a_abs(dp)
    ).sum(-1, keepdim=True)
    dz = p * (dp - delta)
    err_dz = (
        err_p * a_abs(dp - delta)
        + p * (err_dp + err_delta)
        + p * u * (a_abs(dp) + a_abs(delta))
        + u * a_abs(dz)
    )
    da = scale * dz
    err_da = scale * err_dz + 2 * u * a_abs(da)
    # the score map's reverse: sensitivities bounded by the inputs' norms
    nq, nk = q.norm(dim=-1), _heads(k, h).norm(dim=-1)
    size = nq[..., :, None] * nk[..., None, :]
    eps = torch.where(seen, err_a / size, 0.0)
    assert float(eps.max()) < 1e-2, "second-order terms no longer negligible"
    weight = (err_da + a_abs(da) * (2 * eps + group * length * length * u)) * seen
    err_dq = (weight @ nk[..., None]).expand(-1, -1, -1, d)
    err_dk = to_kv(weight.mT @ nq[..., None]).expand(-1, -1, -1, d)
    # the pairs j < t <= i, whose product holds H_t: sum over i >= t, then over j < t
    spans = (weight * size).flip(-2).cumsum(-2).flip(-2).cumsum(-1)
    across = F.pad(torch.diagonal(spans, offset=-1, dim1=-2, dim2=-1), (1, 0))
    err_dw = to_kv(2 * _heads(beta, h) * across)[..., None].expand(-1, -1, -1, d)
    err_dbeta = to_kv(across)
    rows, cols = da.sum(-1), da.sum(-2)
    err_rows = err_da.sum(-1) + (length + 1) * u * a_abs(da).sum(-1)
    err_cols = err_da.sum(-2) + (length + 1) * u * a_abs(da).sum(-2)
    dc = rows - cols
    err_dc = err_rows + err_cols + u * (a_abs(rows) + a_abs(cols))

    def suffix(x):
        return x.flip(-1).cumsum(-1).flip(-1)

    err_dg = suffix(err_dc) + (length + 1) * u * suffix(a_abs(dc))
    return [*bounds, err_dq, err_dk, err_dv, err_dw, err_dbeta, err_dg]


def total_bounds(*bound_lists):
    """Two (or more) computations' bounds added, doubled for the second-order terms."""
    return [2 * sum(parts) for parts in zip(*bound_lists, strict=True)]


def float32_bounds(q, k, v, w, beta, lf, dout, scale, chunk, block):
    """A float32 computation in chunks of ``chunk`` against posenc's float64 one in
    blocks of ``block``: their bounds (:func:`propagate`) added and doubled."""
    return total_bounds(
        propagate(
            q, k, v, w, beta, lf, dout, scale, chunk_score_errors(q, k, w, beta, chunk, U32), U32
        ),
        propagate(
            q, k, v, w, beta, lf, dout, scale, chunk_score_errors(q, k, w, beta, block, U64), U64
        ),
    )


def worst_ratio(a, b, bound):
    """The largest ``|a - b| / bound`` (exact agreement where the bound is 0: position
    0's w and beta move no score, and have gradient 0)."""
    err = (a.detach().double() - b.detach().double()).abs()
    return float(torch.where(err == 0, 0.0, err / bound).max())


def assert_within(names, got, want, bounds):
    for name, a, b, bound in zip(names, got, want, bounds[: len(names)], strict=True):
        ratio = worst_ratio(a, b, bound)
        assert ratio <= 1.0, f"{name}: {ratio:.3g} x its bound"


# -------------------------------------------------------------------------- the formula


def _inputs(ts):
    return [t.clone().requires_grad_() for t in ts]


# (batch, heads, kv_heads, seq, head_dim, v_dim), posenc's block
DENSE_CASES = {
    "mha-blocks-3": ((2, 2, 2, 17, 4, 3), 3),
    "gqa-blocks-5": ((1, 4, 2, 23, 5, 6), 5),
    "mqa-one-block": ((1, 3, 1, 12, 4, 4), 64),
    "blocks-of-1": ((1, 2, 1, 9, 3, 2), 1),
}


@pytest.mark.parametrize("gate", [False, True], ids=["path", "fox"])
@pytest.mark.parametrize("case", DENSE_CASES.values(), ids=DENSE_CASES.keys())
def test_matches_the_dense_formula(case, gate):
    shape, block = case
    q, k, v, w, beta, lf, dout = make(*shape, seed=1, gate=gate)
    scale = shape[4] ** -0.5
    ours = _inputs([q, k, v, w, beta] + ([lf] if gate else []))
    out = path_attention(*ours[:5], log_fgate=ours[5] if gate else None, block_size=block)
    grads = torch.autograd.grad(out, ours, dout)
    theirs = _inputs([q, k, v, w, beta] + ([lf] if gate else []))
    ref = dense(*theirs)
    ref_grads = torch.autograd.grad(ref, theirs, dout)
    err_ours = chunk_score_errors(q, k, w, beta, min(block, shape[3]), U64)
    bounds = total_bounds(
        propagate(q, k, v, w, beta, lf, dout, scale, err_ours, U64),
        propagate(q, k, v, w, beta, lf, dout, scale, dense_errors(q, k, U64), U64),
    )
    names = ["out", "dq", "dk", "dv", "dw", "dbeta", "dg"][: len(ours) + 1]
    assert_within(names, [out, *grads], [ref, *ref_grads], bounds)


def test_packed_documents_are_attended_alone():
    # documents of 5, 1, 0 (empty), 9 and 8 positions; blocks of 4 cross their bounds
    q, k, v, w, beta, lf, _ = make(2, 4, 2, 23, 4, 3, seed=2)
    cu = torch.tensor([0, 5, 6, 6, 15, 23], dtype=torch.int32)
    block, scale = 4, q.shape[-1] ** -0.5
    packed = path_attention(q, k, v, w, beta, log_fgate=lf, cu_seqlens=cu, block_size=block)
    # the packed run's chunks hold several documents: its scores' bounds are those of
    # the whole row's chunks (a pair of one document meets only that document's
    # transforms, in exact arithmetic as in the bound)
    err_packed = chunk_score_errors(q, k, w, beta, block, U64)
    to_dense, to_alone = [], []
    for a, b in itertools.pairwise(cu.tolist()):
        if b == a:
            continue
        part = [t[:, :, a:b] for t in (q, k, v, w, beta, lf)]
        alone = path_attention(*part[:5], log_fgate=part[5], block_size=block)
        err_alone = chunk_score_errors(*part[:2], *part[3:5], min(block, b - a), U64)
        ours = propagate(*part, None, scale, err_packed[..., a:b, a:b], U64)
        to_dense.append(
            total_bounds(ours, propagate(*part, None, scale, dense_errors(*part[:2], U64), U64))
        )
        to_alone.append(total_bounds(ours, propagate(*part, None, scale, err_alone, U64)))
        assert worst_ratio(packed[:, :, a:b], alone, to_alone[-1][0]) <= 1.0
    # the formula written with the documents cut apart
    ref = dense(q, k, v, w, beta, lf, cu_seqlens=cu)
    assert worst_ratio(packed, ref, torch.cat([t[0] for t in to_dense], 2)) <= 1.0
    # the bound sees a transform that crosses a document's start: the whole row as one
    crossed = dense(q, k, v, w, beta, lf)
    bound = torch.cat([t[0] for t in to_dense], 2)
    assert worst_ratio(crossed[:, :, 6:], packed[:, :, 6:], bound[:, :, 6:]) > MUTANT_FACTOR


def test_packing_does_not_leak_across_documents():
    # chunks aligned with the documents: the second one's arithmetic never reads the
    # first one's values, so changing them changes none of its bits
    q, k, v, w, beta, lf, _ = make(1, 2, 2, 20, 4, 4, seed=3)
    cu = torch.tensor([0, 8, 20])
    base = path_attention(q, k, v, w, beta, log_fgate=lf, cu_seqlens=cu, block_size=4)
    k2, v2, w2, beta2 = k.clone(), v.clone(), w.clone(), beta.clone()
    k2[:, :, :8] += 1.0
    v2[:, :, :8] -= 1.0
    w2[:, :, :8] = w2[:, :, :8].flip(-1)
    beta2[:, :, :8] = 2 - beta2[:, :, :8]
    other = path_attention(q, k2, v2, w2, beta2, log_fgate=lf, cu_seqlens=cu, block_size=4)
    assert torch.equal(base[:, :, 8:], other[:, :, 8:])
    assert (base[:, :, :8] - other[:, :, :8]).abs().max() > 1e-2


def test_gradcheck():
    # blocks of 3 over 10 positions: four chunks, the last one short
    q, k, v, w, beta, lf, _ = make(1, 2, 1, 10, 3, 2, seed=4)
    ins = _inputs([q, k, v, w, beta, lf])

    def f(q, k, v, w, beta, lf):
        return path_attention(q, k, v, w, beta, log_fgate=lf, block_size=3)

    assert torch.autograd.gradcheck(f, ins)

    def packed(q, k, v, w, beta, lf):
        cu = torch.tensor([0, 4, 10])
        return path_attention(q, k, v, w, beta, log_fgate=lf, block_size=3, cu_seqlens=cu)

    assert torch.autograd.gradcheck(packed, ins)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weights_past_exps_normal_range_are_zero_and_nothing_else_is(dtype):
    # gates of -4 per position and scale 1: most pairs decay below exp(-87) (2**-126,
    # where CPU exp turns slow), which the engine sets to 0. Those weights are under
    # 2**-126 of a row whose largest weight is 1: the output moves by less than
    # length * 2**-126 * max|v|, far under float32's and float64's rounding, so the
    # engine stays within its float32 rounding of the exact formula (the dense float64
    # softmax, which keeps every weight); a pair dropped above the threshold would not
    q, k, v, w, beta, _, _ = make(1, 2, 2, 80, 8, 8, seed=31, gate=False)
    lf = torch.full((1, 2, 80), -4.0, dtype=torch.float64)
    want = dense(q, k, v, w, beta, lf, scale=1.0)
    got = path_attention(
        *(t.to(dtype) for t in (q, k, v, w, beta)), log_fgate=lf.to(dtype), scale=1.0, block_size=16
    )
    assert float(torch.exp(-4.0 * torch.tensor(80.0))) < 2.0**-126  # the threshold is reached
    # the float32 engine's own rounding: scores of 8 terms of size |q||k| and the chain's
    # products, each a few units of 2**-24 relative (test_matches_the_dense_formula's bounds
    # are the derivation; 2**-12 covers them at these sizes), the float64 one's 2**-40
    tol = 2.0**-12 if dtype == torch.float32 else 2.0**-40
    assert float((got.double() - want).abs().max()) <= tol * float(v.abs().max())
    assert bool(got.isfinite().all())


def test_low_precision_is_computed_in_float32():
    q, k, v, w, beta, lf, _ = make(1, 2, 2, 30, 8, 8, seed=5)
    for dtype in (torch.float16, torch.bfloat16):
        low = [t.to(dtype) for t in (q, k, v, w, beta)]
        out = path_attention(*low, log_fgate=lf.float(), block_size=8)
        assert out.dtype == dtype
        # the same float32 computation, rounded once at the end
        ref = path_attention(*(t.float() for t in low), log_fgate=lf.float(), block_size=8)
        assert torch.equal(out, ref.to(dtype))


def test_path_keys_carries_every_key_to_the_end():
    # against one rank-one update per position, k <- k - beta (k . w) w, which errs
    # by at most (2 d + 7) u |k| per step (the dot product, three products, the
    # difference; contractions after); path_keys: its chunk's stage (e_kh), then
    # normwise through each later chunk's product (contractions), gaining that
    # product's rounding
    _, k, _, w, beta, _, _ = make(2, 2, 2, 19, 4, 4, seed=6, gate=False)
    seq = k.clone()
    for t in range(1, k.shape[2]):
        dot = (seq[:, :, :t] * w[:, :, t, None]).sum(-1, keepdim=True)
        seq[:, :, :t] = seq[:, :, :t] - beta[:, :, t, None, None] * dot * w[:, :, t, None]
    d, length = k.shape[-1], k.shape[2]
    steps = length - 1 - torch.arange(length)
    for block in (1, 4, 19, 128):
        got = path_keys(k, w, beta, block_size=block)
        s = chunk_stages(None, k, w, beta, min(block, length), U64)
        keys = s["kh"].clone()  # (B, H, n, C, d)
        err = s["e_kh"].norm(dim=-1)
        for j in range(1, s["n"]):
            hm, e_h = s["hm"][:, :, j, None], s["e_h"][:, :, j, None]
            prev = keys[:, :, :j]
            moved = prev @ hm.mT
            step = prev.abs() @ e_h.mT + d * U64 * prev.abs() @ hm.abs().mT
            err[:, :, :j] += (step + U64 * (prev.abs() + moved.abs())).norm(dim=-1)
            keys[:, :, :j] = prev - moved
        err = err.flatten(2)[..., :length]
        bound = 2 * (err + U64 * k.norm(dim=-1) * steps * (2 * d + 7))
        assert float(((got - seq).norm(dim=-1) / bound).max()) <= 1.0, block
        # a key left where it was is far outside the bound
        assert float(((k - seq)[:, :, :-1].norm(dim=-1) / bound[..., :-1]).max()) > 1e3


# --------------------------------------------------------------------- fla's reference


@pytest.fixture(scope="module")
def naive_path():
    from test_fla import _naive

    return _naive("path_attn", "naive_path_attn")


def seq_first(t):
    return t.transpose(1, 2)


# (batch, heads, kv_heads, seq, head_dim, v_dim), fla's chunk, posenc's block
FLA_CASES = {
    "gqa-40": ((1, 4, 2, 40, 8, 8), 8, 12),
    "mha-70": ((2, 2, 2, 70, 8, 4), 16, 32),
}


def _fla(naive, q, k, v, w, beta, lf, scale, chunk):
    theirs = [seq_first(t).float().clone().requires_grad_() for t in (q, k, v, w, beta, lf)]
    out = naive(*theirs, scale=scale, chunk_size=chunk)
    assert out.dtype == torch.float32
    return out, theirs


@pytest.mark.parametrize("gate", [False, True], ids=["path", "fox"])
@pytest.mark.parametrize("case", FLA_CASES.values(), ids=FLA_CASES.keys())
def test_matches_flas_reference(case, gate, naive_path):
    shape, chunk, block = case
    q, k, v, w, beta, lf, dout = make(*shape, seed=7, gate=True)
    if not gate:
        lf = torch.zeros_like(lf)  # fla's reference needs g: plain PaTH is g = 0
    scale = shape[4] ** -0.5
    ours = _inputs([q, k, v, w, beta] + ([lf] if gate else []))
    out = path_attention(*ours[:5], log_fgate=ours[5] if gate else None, block_size=block)
    grads = torch.autograd.grad(out, ours, dout)
    ref, theirs = _fla(naive_path, q, k, v, w, beta, lf, scale, chunk)
    ref_grads = torch.autograd.grad(ref, theirs, seq_first(dout).float())
    got = [seq_first(ref), *(seq_first(g) for g in ref_grads[: len(ours)])]
    bounds = float32_bounds(q, k, v, w, beta, lf, dout, scale, chunk, block)
    names = ["out", "dq", "dk", "dv", "dw", "dbeta", "dg"][: len(ours) + 1]
    assert_within(names, got, [out, *grads], bounds)

    # the bound is tight enough to see a mistake: beta one position late, or no gate
    late = torch.cat([beta[:, :, :1], beta[:, :, :-1]], 2)
    mutant, _ = _fla(naive_path, q, k, v, w, late, lf, scale, chunk)
    assert worst_ratio(seq_first(mutant), out, bounds[0]) > MUTANT_FACTOR
    if gate:
        mutant, _ = _fla(naive_path, q, k, v, w, beta, torch.zeros_like(lf), scale, chunk)
        assert worst_ratio(seq_first(mutant), out, bounds[0]) > MUTANT_FACTOR


@pytest.fixture
def ieee_float32():
    """IEEE float32 products: TF32 (10-bit mantissas, what a GPU's matmuls may take)
    would void the float32 bounds."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, no_cuda()])]
)
@pytest.mark.parametrize("gate", [False, True], ids=["path", "fox"])
def test_float32_on_the_device_within_the_bounds(gate, device, ieee_float32):
    """posenc's PaTH in float32 on the device (``make gpu-check`` runs the CUDA
    variant), forward and backward, against posenc's in float64 on CPU: the two
    computations' bounds (module docstring) hold for any order of the sums, cuBLAS's
    and the CPU's alike."""
    shape, block = (2, 4, 2, 45, 8, 6), 16
    q, k, v, w, beta, lf, dout = make(*shape, seed=8, gate=gate)
    scale = shape[4] ** -0.5
    leaves = [q, k, v, w, beta] + ([lf] if gate else [])
    there = [t.float().to(device).requires_grad_() for t in leaves]
    out = path_attention(*there[:5], log_fgate=there[5] if gate else None, block_size=block)
    assert out.device.type == device and out.dtype == torch.float32
    grads = torch.autograd.grad(out, there, dout.float().to(device))
    ours = _inputs(leaves)
    ref = path_attention(*ours[:5], log_fgate=ours[5] if gate else None, block_size=block)
    ref_grads = torch.autograd.grad(ref, ours, dout)
    bounds = float32_bounds(q, k, v, w, beta, lf, dout, scale, block, block)
    names = ["out", "dq", "dk", "dv", "dw", "dbeta", "dg"][: len(leaves) + 1]
    got = [t.detach().cpu() for t in (out, *grads)]
    assert_within(names, got, [ref, *ref_grads], bounds)


# ------------------------------------------------------------------------------ memory


@pytest.mark.parametrize("gate", [False, True], ids=["path", "fox"])
def test_memory_is_linear_in_the_sequence(gate):
    b, h, hk, length, d, block = 1, 2, 1, 512, 8, 32
    q, k, v, w, beta, lf, dout = make(b, h, hk, length, d, d, seed=8)
    ins = _inputs([q, k, v, w, beta, lf])
    with _Largest() as mode:
        out = path_attention(*ins[:5], log_fgate=ins[5] if gate else None, block_size=block)
        out.backward(dout)
    bound = b * h * length * max(block, d)
    assert b * h * length * length >= 16 * bound  # a (seq, seq) tensor would not pass
    assert mode.largest <= bound
    assert all(t.grad is not None for t in ins[: 6 if gate else 5])


# ------------------------------------------------------------------------------ inputs


def _good():
    q, k, v, w, beta, lf, _ = make(1, 4, 2, 6, 4, 4, seed=9)
    return {"q": q, "k": k, "v": v, "w": w, "beta": beta, "log_fgate": lf}


def _call(**kw):
    args = _good()
    args.update(kw)
    extra = {key: args.pop(key) for key in ("scale", "cu_seqlens", "block_size") if key in args}
    return path_attention(
        args["q"],
        args["k"],
        args["v"],
        args["w"],
        args["beta"],
        log_fgate=args["log_fgate"],
        **extra,
    )


BAD = [
    ({"q": torch.zeros(1, 4, 6, 4, dtype=torch.int64)}, TypeError, "q must be a float tensor"),
    ({"w": [0.0]}, TypeError, "w must be a float tensor"),
    ({"beta": torch.ones(1, 2, 6, dtype=torch.int32)}, TypeError, "beta must be a float"),
    ({"log_fgate": torch.ones(1, 4, 6, dtype=torch.bool)}, TypeError, "log_fgate must be a float"),
    ({"k": torch.zeros(1, 2, 6, 4, dtype=torch.float32)}, TypeError, "share a dtype"),
    ({"k": torch.zeros(1, 3, 6, 4, dtype=torch.float64)}, ValueError, "k and v must have the same"),
    ({"k": torch.zeros(1, 2, 5, 4, dtype=torch.float64)}, ValueError, r"k \(1, 2, 5, 4\)"),
    (
        {
            "k": torch.zeros(1, 3, 6, 4, dtype=torch.float64),
            "v": torch.zeros(1, 3, 6, 4, dtype=torch.float64),
            "w": torch.zeros(1, 3, 6, 4, dtype=torch.float64),
        },
        ValueError,
        "multiple of k's and v's heads",
    ),
    (
        {
            "k": torch.zeros(1, 2, 5, 4, dtype=torch.float64),
            "v": torch.zeros(1, 2, 5, 4, dtype=torch.float64),
        },
        ValueError,
        "q_len == k_len",
    ),
    ({"w": torch.zeros(1, 2, 6, 3, dtype=torch.float64)}, ValueError, "w must be"),
    ({"v": torch.zeros(2, 2, 6, 4, dtype=torch.float64)}, ValueError, "share the batch size"),
    ({"q": torch.zeros(1, 4, 6, dtype=torch.float64)}, ValueError, "q must be"),
    ({"beta": torch.zeros(1, 4, 6, dtype=torch.float64)}, ValueError, "beta must have shape"),
    ({"log_fgate": torch.zeros(1, 2, 6, dtype=torch.float64)}, ValueError, "log_fgate must"),
    ({"w": torch.zeros(1, 2, 6, 4, dtype=torch.float64, device="meta")}, ValueError, "one device"),
    (
        {"beta": torch.zeros(1, 2, 6, dtype=torch.float64, device="meta")},
        ValueError,
        "beta must be on q's device",
    ),
    ({"scale": 0.0}, ValueError, "scale must be > 0"),
    ({"scale": "1"}, TypeError, "scale must be a real number"),
    ({"block_size": 0}, ValueError, "block_size must be an int >= 1"),
    ({"block_size": 2.0}, TypeError, "block_size must be an int"),
    ({"cu_seqlens": [0, 6]}, TypeError, "cu_seqlens must be an int tensor"),
    ({"cu_seqlens": torch.tensor([0.0, 6.0])}, TypeError, "cu_seqlens"),
    ({"cu_seqlens": torch.tensor([1, 6])}, ValueError, "cu_seqlens must start at 0"),
    ({"cu_seqlens": torch.tensor([0, 4, 3, 6])}, ValueError, "cu_seqlens must never decrease"),
    ({"cu_seqlens": torch.tensor([0, 5])}, ValueError, "cu_seqlens must end"),
]


@pytest.mark.parametrize("kw,error,match", BAD, ids=[m for *_, m in BAD])
def test_bad_inputs_name_the_parameter(kw, error, match):
    with pytest.raises(error, match=match):
        _call(**kw)


def test_huge_sizes_fail_before_any_work():
    # expand: no memory behind these; the check must refuse before computing
    big = torch.zeros(1, 1, 1, 1).expand(1, 64, 1 << 20, 64)
    small = torch.zeros(1, 1, 1, 1).expand(1, 64, 1 << 20, 64)
    beta = torch.zeros(1, 1, 1).expand(1, 64, 1 << 20)
    with pytest.raises(ValueError, match=f"more than {MAX_ELEMENTS}"):
        path_attention(big, small, small, small, beta)


# ------------------------------------------------------------------------------- layer


def _dyadic_(module, x):
    """Weights and inputs on a grid of 1/64 in [-1, 1]: every projection is then exact
    in float64 whatever the order of its sums (few bits), so that the full pass and
    decoding see the same q, k, v, directions' inputs and gate inputs."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(((torch.randn_like(p) * 8).round() / 64).clamp(-1, 1))
    return ((x * 16).round() / 64).clamp(-1, 1)


def _layer_inputs(m, x):
    """The layer's q, k, v, unit w, beta and log gates for ``x`` (its own pieces)."""
    work = torch.float64
    p = m._project(x, work)
    w = m._directions(m._conv(p["raw"].to(work), None))
    return [
        None if t is None else t.detach()
        for t in (p["q"], p["k"], p["v"], w, p["beta"], p["log_f"])
    ]


def _kernel_errors(q, k):
    """Two passes of the layer over the same (exactly projected) inputs may evaluate
    SiLU, sigmoid, logsigmoid and rsqrt with other kernels (vector lanes, scalar
    tails), each within a few ulps: a transform's w relatively by at most ``(d + 6)
    u``, its beta by ``4 u``, moving a score by ``(2 beta (d + 6) + 4 beta) u |q||k|``
    (the sensitivities, beta < 2) per transform between query and key."""
    d = q.shape[-1]
    return chain_score_errors(q, k, U64, 2 * 2 * (d + 6) + 2 * 4, 0)


def _layer_bound(m, x, errs):
    """The bound of the layer's output from its attention's score errors, one per pass.

    Each pass's attention output by :func:`propagate`; then o_proj, the same matrix
    applied to both (rows of other batches): ``|W_o| err(o) + 2 hidden u |W_o||o|``.
    """
    q, k, v, w, beta, lf = _layer_inputs(m, x)
    b, _, length, d = q.shape
    bound_o = sum(propagate(q, k, v, w, beta, lf, None, d**-0.5, e, U64)[0] for e in errs)
    o = dense(q, k, v, w, beta, lf)
    wo = m.o_proj.weight.detach().abs()

    def flat(z):
        return z.transpose(1, 2).reshape(b, length, -1)

    return 2 * (flat(bound_o) @ wo.T + 2 * m.hidden * U64 * flat(o.abs()) @ wo.T)


def _chain_bounds(q, k, w, beta, prefill, u):
    """The score bounds of the full pass and of decoding, their algorithms' rounding in
    precision ``u`` alone (no kernels' ulps): ``(full, decoded)``, each ``(B, H, L, L)``.

    Full pass: path_attention in one chunk (the default block exceeds the length).
    Prefill (positions < T): the same on the first T positions. Decoding position
    i >= T: its keys j < T are path_keys' (the prefill's chunk, ``e_kh``), then every
    key takes one rank-one update per position up to i, each ``(2 d + 7) u`` relative
    (as test_path_keys_carries_every_key_to_the_end), and ``q . k`` its ``d u``.
    """
    h, length, d = q.shape[1], q.shape[2], q.shape[3]
    t = prefill
    full = chunk_score_errors(q, k, w, beta, length, u)
    dec = chain_score_errors(q, k, u, 2 * d + 7, d, start=t)
    stages = chunk_stages(None, *(_heads(z, h)[:, :, :t] for z in (k, w, beta)), t, u)
    e_kh = stages["e_kh"][:, :, 0].norm(dim=-1)  # (B, H, T)
    dec[..., :, :t] += q.norm(dim=-1)[..., :, None] * e_kh[..., None, :]
    dec[..., :t, :t] = chunk_score_errors(*(z[:, :, :t] for z in (q, k, w, beta)), t, u)
    return full, dec


def _decode_bound(m, x, prefill):
    """Bound of |full pass - (prefill, then one position at a time)| on the scores of a
    float64 layer: :func:`_chain_bounds` in U64, plus, in both passes, the kernels' ulps
    (:func:`_kernel_errors`)."""
    q, k, _, w, beta, _ = _layer_inputs(m, x)
    full, dec = _chain_bounds(q, k, w, beta, prefill, U64)
    kernels = _kernel_errors(q, k)
    return full + kernels, dec + kernels


LAYERS = {
    "mha": (4, None, False),
    "gqa-fox": (4, 2, True),
    "mqa-fox": (4, 1, True),
}


@pytest.mark.parametrize("layer", LAYERS.values(), ids=LAYERS.keys())
def test_decoding_equals_the_full_pass(layer):
    heads, kv_heads, gate = layer
    torch.manual_seed(10)
    m = PaTH(32, heads, kv_heads, forget_gate=gate).double()
    x = _dyadic_(m, torch.randn(2, 15, 32, dtype=torch.float64))
    full = m(x)
    prefill = 6
    out, cache = m(x[:, :prefill], cache=PaTHCache())
    assert cache.length == prefill
    outs = [out]
    for t in range(prefill, x.shape[1]):
        o, cache = m(x[:, t : t + 1], cache=cache)
        outs.append(o)
    assert cache.length == x.shape[1] and (cache.gates is not None) == gate
    decoded = torch.cat(outs, 1)
    err_full, err_dec = _decode_bound(m, x, prefill)
    bound = _layer_bound(m, x, [err_full, err_dec])
    assert worst_ratio(decoded, full, bound) <= 1.0
    # several new positions in one call are decoded one after another (o_proj over
    # all of them at once: two decoding passes' bound)
    _, cache = m(x[:, :prefill], cache=PaTHCache())
    rest, _ = m(x[:, prefill:], cache=cache)
    both = _layer_bound(m, x, [err_dec, err_dec])
    assert worst_ratio(rest, decoded[:, prefill:], both[:, prefill:]) <= 1.0
    # the bound sees a cache whose keys were not carried to the latest position
    k = _layer_inputs(m, x)[1]
    uncarried = dataclasses.replace(cache, keys=k[:, :, :prefill])
    wrong, _ = m(x[:, prefill : prefill + 1], cache=uncarried)
    at = slice(prefill, prefill + 1)
    assert worst_ratio(wrong, full[:, at], bound[:, at]) > MUTANT_FACTOR


# ------------------------------------------------------------------ layer in half precision

#: unit roundoffs of the half-precision dtypes, to which the layer rounds at its boundaries
U_HALF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _rounded(b, r, dtype):
    """``(f(b), e)``: ``b`` (float64) rounded to ``dtype``, and a bound ``e`` on ``|low(a) -
    f(b)|`` for every float32 ``a`` within ``r`` of ``b``, rounded to ``dtype``.

    Rounding is monotone: where ``b - r`` and ``b + r`` round alike, every ``a`` between
    them rounds to ``f(b)`` too and ``e = 0`` (two passes whose float32 values lie there
    agree to the bit). Elsewhere a rounding boundary lies within ``r`` of ``b``, which two
    passes' values may straddle (one ulp apart): ``|low(a) - f(b)| <= |low(a) - a| + |a -
    b| + |b - f(b)| <= u (|b| + r) + eta + r + |b - f(b)|``, u the dtype's unit roundoff
    and ``eta`` half its subnormals' spacing (float16's, ``2^-25``, below ``2^-14``).
    """
    u = U_HALF[dtype]
    low = b.to(dtype).double()
    straddle = (b - r).to(dtype) != (b + r).to(dtype)
    e = u * (b.abs() + r) + u * torch.finfo(dtype).smallest_normal + r + (b - low).abs()
    return low, torch.where(straddle, e, 0.0)


def _spans(per_t):
    """``sum_{j < t <= i} per_t[..., t]`` ``(B, H, L, L)``, 0 above the diagonal."""
    c = per_t.cumsum(-1)
    below = torch.ones(c.shape[-1], c.shape[-1], dtype=torch.bool).tril()
    return ((c[..., :, None] - c[..., None, :]) * below).clamp(min=0)


def _half_bounds(m, x, prefill, dtype, passes):
    """Bounds ``(e_o, e_y)``, ``(B, L, hidden)`` each, of the distance of each pass's
    o_proj input (its attention output rounded to ``dtype``) and of its output to one
    reference: ``m`` a layer in ``dtype`` on :func:`_dyadic_`'s grid, fed ``x`` in ``dtype``;
    a pass given by its calls' spans of positions (``[(0, L)]`` the full pass; else a
    prefill of ``(0, prefill)``, then decoding). Two passes' bounds added bound their
    difference.

    The reference: the exact layer (float64) on the full pass's inputs, with each rounding
    to ``dtype`` taken of its exact argument (:func:`_rounded`: a pass's rounding costs
    nothing unless its float32 argument may lie across a rounding boundary from the exact
    one, where it costs an ulp and the distance). The inputs: q, k, v and the directions'
    ``raw`` are the same bits in every pass (the test asserts it); the maps with a bias
    (beta's, the gates') are each pass's own, from its own calls (torch's F.linear on a
    non-contiguous 3-d input, as these slices are, rounds the product to the dtype before
    adding the bias, on a contiguous one once: passes may differ there by an ulp of the
    argument, whose effect the bound charges). Each pass:

    - ``w``: the convolution in float32 (exact products, two sums: ``2 U32`` of the taps'
      magnitudes), SiLU (slope < 1.1; 4 ulps), the normalisation (``(d + 6) U32`` relative,
      as :func:`_kernel_errors`; slope ``1 / sqrt(|s|^2 + eps)`` on its input), doubled for
      second order; then rounded to ``dtype`` (``e_w``);
    - ``beta = 2 low(sigmoid(z))``: sigmoid in float32 (4 ulps), doubled; then rounded,
      plus the distance to the reference's beta (another ``z``);
    - the log gates, float32 (not rounded to ``dtype``): logsigmoid's 4 ulps, doubled, plus
      the distance to the reference's;
    - the scores: the algorithm's float32 rounding (:func:`_chain_bounds` in U32) plus what
      the inputs moved them, ``|d a / d w_t| <= 2 beta_t |q||k|`` and ``|d a / d beta_t|
      <= |q||k|`` for each transform ``j < t <= i`` (contractions), and the gates between;
    - the attention output in float32 (:func:`propagate` in U32), plus the float64
      reference's own error (:func:`dense_errors`), doubled; then rounded (``e_o``);
    - o_proj: ``W_o`` on an input within ``e_o`` of the reference's, summed in float32
      (exact products: ``hidden U32 |W_o||o|``), doubled; then rounded: the pass's bound.
    """
    b, length, _ = x.shape
    h, hk, d = m.heads, m.kv_heads, m.head_dim
    xl = x.to(dtype)
    p = m._project(xl, torch.float32)
    q, k, v, raw = (p[key].detach().double() for key in ("q", "k", "v", "raw"))
    # the directions
    weight = m.w_conv1d.weight.detach().double()

    def conv(z, wt):
        return F.conv1d(F.pad(z.transpose(1, 2), (2, 0)), wt, groups=z.shape[-1]).transpose(1, 2)

    def heads(z):
        return z.view(b, length, hk, d).transpose(1, 2)

    s = F.silu(conv(raw, weight))
    err_s = heads(1.1 * 2 * U32 * conv(raw.abs(), weight.abs()) + 4 * U32 * s.abs())
    s = heads(s)
    inv = torch.rsqrt((s * s).sum(-1, keepdim=True) + 1e-6)
    w = s * inv
    w, e_w = _rounded(
        w, 2 * (err_s.norm(dim=-1, keepdim=True) * inv + (d + 6) * U32 * w.abs()), dtype
    )

    # beta and the log gates of each pass, from its own calls
    def biased(linear, calls):
        with torch.no_grad():
            return torch.cat([linear(xl[:, a:c]) for a, c in calls], 1).double().transpose(1, 2)

    def gated(calls):
        sigma = torch.sigmoid(biased(m.bt_proj, calls))
        sigma, e_sigma = _rounded(sigma, 2 * 4 * U32 * sigma, dtype)
        lf = None if m.g_proj is None else F.logsigmoid(biased(m.g_proj, calls))
        return 2 * sigma, 2 * e_sigma, lf

    beta, _, lf = gated(passes[0])
    size = q.norm(dim=-1)[..., :, None] * _heads(k, h).norm(dim=-1)[..., None, :]
    scale = d**-0.5
    o = dense(q, k, v, w, beta, lf)
    err_ref = propagate(q, k, v, w, beta, lf, None, scale, dense_errors(q, k, U64), U64)[0]
    wo = m.o_proj.weight.detach().double()

    def flat(z):
        return z.transpose(1, 2).reshape(b, length, -1)

    full, dec = _chain_bounds(q, k, w, beta, prefill, U32)
    bounds = []
    for calls in passes:
        beta_p, e_beta, lf_p = gated(calls)
        e_beta = e_beta + (beta_p - beta).abs()
        moved = _spans(_heads(2 * beta * e_w.norm(dim=-1) + e_beta, h)) * size
        if lf is not None:
            moved = moved + _spans(2 * 4 * U32 * lf_p.abs() + (lf_p - lf).abs())
        alg = full if calls == [(0, length)] else dec
        err_o = propagate(q, k, v, w, beta, lf, None, scale, alg + moved, U32)[0]
        o_low, e_o = (flat(t) for t in _rounded(o, 2 * (err_o + err_ref), dtype))
        r_y = 2 * (e_o + m.hidden * U32 * (o_low.abs() + e_o)) @ wo.abs().T
        bounds.append((e_o, _rounded(o_low @ wo.T, r_y, dtype)[1]))
    return bounds


HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.mark.parametrize("dtype", HALF.values(), ids=HALF.keys())
@pytest.mark.parametrize("layer", LAYERS.values(), ids=LAYERS.keys())
def test_half_precision_decoding_equals_the_full_pass(layer, dtype):
    """A bfloat16 or float16 layer decodes in float32 (its cache and steps; rounded to the
    dtype where the full pass rounds): against the same layer's full pass (path_attention
    in float32, rounded to the dtype at the module's boundaries), within the bounds of
    :func:`_half_bounds`, on o_proj's input (the attention output rounded to the dtype)
    and on the output. A layer decoding in the dtype itself fails here."""
    heads, kv_heads, gate = layer
    torch.manual_seed(10)
    m = PaTH(32, heads, kv_heads, forget_gate=gate).double()
    x = _dyadic_(m, torch.randn(2, 15, 32, dtype=torch.float64))
    exact = [p.detach().clone() for p in m.parameters()]
    m.to(dtype)
    xl = x.to(dtype)
    # the grid (7 bits) is exact in both dtypes
    assert torch.equal(xl.double(), x)
    assert all(torch.equal(p.double(), e) for p, e in zip(m.parameters(), exact, strict=True))
    prefill, length = 6, x.shape[1]
    one_calls = [(0, prefill)] + [(t, t + 1) for t in range(prefill, length)]
    rest_calls = [(0, prefill), (prefill, length)]
    seen = []  # o_proj's inputs: the attention outputs rounded to the dtype
    m.o_proj.register_forward_pre_hook(lambda _, args: seen.append(args[0]))

    def run(calls, cache=None):
        """The layer over ``calls``' spans of ``xl`` in turn: (output, o_proj's input)."""
        seen.clear()
        outs = []
        for a, b in calls:
            if cache is None:
                outs.append(m(xl[:, a:b]))
            else:
                out, cache = m(xl[:, a:b], cache=cache)
                outs.append(out)
        return torch.cat(outs, 1), torch.cat(seen, 1), cache

    with torch.no_grad():
        # q, k, v and the directions' inputs are the same bits in every pass, whatever the
        # call's shape: a product of two grid values is an integer / 4096, an entry's sum of
        # 32 below 2^17 / 4096, exact in float32, then rounded once (the float64 map rounded);
        # MHA's second directions' map (on rounded values) is asserted alike
        want = m._project(xl, torch.float32)
        for key, proj in (("q", m.q_proj), ("k", m.k_proj), ("v", m.v_proj)):
            assert torch.equal(proj(xl), F.linear(x, proj.weight.double()).to(dtype)), key
        for a, b in one_calls + rest_calls:
            got = m._project(xl[:, a:b], torch.float32)
            assert torch.equal(got["raw"], want["raw"][:, a:b])
            assert all(torch.equal(got[key], want[key][:, :, a:b]) for key in "qkv")
        full, o_full, _ = run([(0, length)])
        decoded, o_one, cache = run(one_calls, PaTHCache())
        rest, o_rest, _ = run(rest_calls, PaTHCache())
    assert full.dtype == decoded.dtype == rest.dtype == dtype
    assert all(bool(t.isfinite().all()) for t in (full, decoded, rest))
    kept = [cache.keys, cache.values, cache.conv] + ([cache.gates] if gate else [])
    assert cache.length == length and all(t.dtype == torch.float32 for t in kept)
    (eo_full, ey_full), (eo_one, ey_one), (eo_rest, ey_rest) = _half_bounds(
        m, x, prefill, dtype, [[(0, length)], one_calls, rest_calls]
    )
    assert worst_ratio(o_one, o_full, eo_full + eo_one) <= 1.0
    assert worst_ratio(decoded, full, ey_full + ey_one) <= 1.0
    # several new positions in one call
    assert worst_ratio(o_rest, o_one, eo_rest + eo_one) <= 1.0
    assert worst_ratio(rest, decoded, ey_rest + ey_one) <= 1.0
    # the bound sees a cache whose keys were not carried to the latest position: its
    # attention outputs move where no rounding to the dtype can (bound 0). (Not asserted on
    # the output: one o that may flip loosens, through W_o, the bound of a whole row.)
    after = slice(prefill, length)
    with torch.no_grad():
        _, _, cache = run(one_calls[:1], PaTHCache())
        uncarried = dataclasses.replace(cache, keys=want["k"][:, :, :prefill].float())
        _, o_wrong, _ = run(rest_calls[1:], uncarried)
    assert worst_ratio(o_wrong, o_full[:, after], (eo_full + eo_rest)[:, after]) > MUTANT_FACTOR


def test_the_layer_is_path_attention_on_its_projections():
    torch.manual_seed(11)
    m = PaTH(24, 6, 2, forget_gate=True).double()
    x = torch.randn(2, 13, 24, dtype=torch.float64)
    q, k, v, w, beta, lf = _layer_inputs(m, x)
    # fla's layer: beta = 2 sigmoid in (0, 2), log gates <= 0, unit w (|w|^2 + 1e-6
    # under the root: |w| = 1 / sqrt(1 + 1e-6 / |conv|^2))
    assert 0 < float(beta.min()) and float(beta.max()) < 2 and float(lf.max()) <= 0
    o = path_attention(q, k, v, w, beta, log_fgate=lf)
    want = m.o_proj(o.transpose(1, 2).reshape(2, 13, 24))
    assert torch.equal(m(x).detach(), want.detach())
    # the directions: a causal convolution of width 3, then SiLU, as torch's Conv1d with
    # two zeros in front: each output a sum of 3 products (3 u of its terms' sum in
    # either order), SiLU's slope below 1.1 and its own rounding (4 u); two computations
    raw = m.w_proj(x).detach()
    ours = m._conv(raw, None)
    weight = m.w_conv1d.weight.detach()
    pre = F.conv1d(F.pad(raw.transpose(1, 2), (2, 0)), weight, groups=raw.shape[-1])
    ref = F.silu(pre).transpose(1, 2)
    terms = F.conv1d(F.pad(raw.abs().transpose(1, 2), (2, 0)), weight.abs(), groups=raw.shape[-1])
    bound = 2 * (2 * 1.1 * 3 * U64 * terms.transpose(1, 2) + 2 * 4 * U64 * ref.abs())
    assert worst_ratio(ours, ref, bound) <= 1.0
    # and the convolution is causal: a later input changes no earlier direction
    later = raw.clone()
    later[:, 7:] += 1.0
    assert torch.equal(m._conv(later, None)[:, :7], ours[:, :7])
    assert not torch.equal(m._conv(later, None)[:, 7], ours[:, 7])
    # MHA: a rank-32 map for w; GQA: one map; no gate projection without the gate
    assert isinstance(m.w_proj, torch.nn.Linear)
    mha = PaTH(24, 6)
    assert isinstance(mha.w_proj, torch.nn.Sequential) and mha.w_proj[0].out_features == 32
    assert mha.g_proj is None


def test_the_layer_packs_documents():
    torch.manual_seed(12)
    m = PaTH(16, 2, forget_gate=True).double()
    x = _dyadic_(m, torch.randn(1, 11, 16, dtype=torch.float64))
    cu = torch.tensor([0, 4, 11])
    packed = m(x, cu_seqlens=cu)
    alone = torch.cat([m(x[:, :4]), m(x[:, 4:])], 1)
    # the convolution restarts with the document (masked taps: exactly the zeros a
    # document alone starts with); attention in one chunk of 11 against chunks of
    # 4 and 7: each pass's score bound per document, plus the kernels' ulps
    whole = _layer_inputs(m, x)
    err_packed = chunk_score_errors(whole[0], whole[1], whole[3], whole[4], 11, U64)
    bounds = []
    for a, b in ((0, 4), (4, 11)):
        q, k, _, w, beta, _ = _layer_inputs(m, x[:, a:b])
        kernels = _kernel_errors(q, k)
        errs = [
            err_packed[..., a:b, a:b] + kernels,
            chunk_score_errors(q, k, w, beta, b - a, U64) + kernels,
        ]
        bounds.append(_layer_bound(m, x[:, a:b], errs))
    assert worst_ratio(packed, alone, torch.cat(bounds, 1)) <= 1.0
    # without the documents, the second one sees the first
    assert worst_ratio(m(x), alone, torch.cat(bounds, 1)) > MUTANT_FACTOR


def test_the_layer_trains():
    torch.manual_seed(13)
    m = PaTH(16, 4, 2, forget_gate=True)
    x = torch.randn(2, 9, 16, requires_grad=True)
    m(x).square().sum().backward()
    assert x.grad is not None
    for name, p in m.named_parameters():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0, name


def test_the_layer_survives_copies_and_meta_init():
    torch.manual_seed(14)
    m = PaTH(16, 4, 2, forget_gate=True)
    x = torch.randn(1, 5, 16)
    want = m(x)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert torch.equal(other(x), want)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf, weights_only=False)(x), want)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    fresh = PaTH(16, 4, 2, forget_gate=True)
    fresh.load_state_dict(torch.load(buf))
    assert torch.equal(fresh(x), want)
    with torch.device("meta"):
        meta = PaTH(16, 4, 2, forget_gate=True)
    assert all(p.is_meta for p in meta.parameters())
    meta.to_empty(device="cpu")
    meta.reset_parameters()
    y = meta(x)
    assert y.shape == (1, 5, 16) and bool(torch.isfinite(y).all())
    assert not torch.equal(meta.q_proj.weight, m.q_proj.weight)
    assert "forget_gate=True" in repr(m)


LAYER_BAD = [
    ({"hidden": 10, "heads": 4}, ValueError, r"hidden \(10\) must be a multiple of heads"),
    ({"hidden": 16, "heads": 4, "kv_heads": 3}, ValueError, "multiple of kv_heads"),
    ({"hidden": 16, "heads": 4.0}, TypeError, "heads must be an int"),
    ({"hidden": 16, "heads": 4, "forget_gate": 1}, TypeError, "forget_gate must be a bool"),
    ({"hidden": 0, "heads": 4}, ValueError, "hidden must be an int >= 1"),
]


@pytest.mark.parametrize("kw,error,match", LAYER_BAD, ids=[m for *_, m in LAYER_BAD])
def test_bad_layers_name_the_parameter(kw, error, match):
    with pytest.raises(error, match=match):
        PaTH(**kw)


def test_bad_layer_calls_name_the_parameter():
    m = PaTH(16, 4, forget_gate=True)
    x = torch.randn(2, 5, 16)
    with pytest.raises(TypeError, match="x must be a float tensor"):
        m(x.long())
    with pytest.raises(ValueError, match=r"x must be \(batch, seq, hidden=16\)"):
        m(torch.randn(2, 5, 8))
    with pytest.raises(TypeError, match="cache must be a PaTHCache"):
        m(x, cache={})
    with pytest.raises(ValueError, match="cu_seqlens and cache"):
        m(x, cache=PaTHCache(), cu_seqlens=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="cu_seqlens must end"):
        m(x, cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(TypeError, match="cu_seqlens must be an int tensor"):
        m(x, cu_seqlens=[0, 5])
    _, cache = m(x, cache=PaTHCache())
    with pytest.raises(ValueError, match=r"batch \(1\) must match the cache's \(2\)"):
        m(x[:1], cache=cache)
    with pytest.raises(ValueError, match="forget_gate"):
        PaTH(16, 4)(x, cache=cache)
