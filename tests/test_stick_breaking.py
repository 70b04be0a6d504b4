"""posenc.stick_breaking_attention against the reference formula, dense and in float64.

The reference is ``sb_ref.stickbreaking`` of shawntan/stickbreaking-attention (Tan et
al. 2024), as its tests call it: ``log A = logsigmoid(z)`` masked to -1e5 above the
allowed diagonal, plus ``logsigmoid(-z)`` (masked to 0) summed over the nearer keys
through the matrix ``tril(-1)``; ``rem = 1 - sum A``. The package is not on PyPI and
imports triton and CUDA kernels, so ``dense`` below restates it in float64.

Error bounds (``bound``), u the unit roundoff of the dtype computed in: ``log A_ij``
is ``logsigmoid(z_ij)`` plus at most L softplus terms, all of one sign, so summing
them errs by at most ``(L + 2) u |log A_ij|`` (gamma_L, the terms' own rounding in the
2), and a score computed with error ``dz`` moves each of the L terms by at most
``dz`` (softplus' slope is below 1): ``|d log A_ij| <= (L + 2) u |log A_ij| + L dz``,
``dz <= d u max_ij sum_c |q_ic k_jc| scale`` (a dot product of d terms). Then
``|dA_ij| <= A_ij |d log A_ij| + u A_ij`` (exp's rounding), and since
``sum_j A_ij |log A_ij| <= ln L + 1/e`` (the entropy of a sub-probability over L keys)
and ``sum_j A_ij <= 1``, ``|d out_i| <= max|v| u ((L + 2)(ln L + 1) + L d Z + L + 1)``
with ``Z`` that score scale and the last ``L`` for the product with v. ``rem = exp(log
rem)`` and the reference's ``1 - sum A`` obey the same bound with ``max|v| = 1``.
Comparing two computations doubles it.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import posenc
from gpu_markers import no_cuda
from posenc.core.checks import MAX_ELEMENTS

U64 = 2.0**-53
U32 = 2.0**-24


def dense(q, k, v, *, attend_current=False, scale=None, cu_seqlens=None):
    """The reference formula with the whole ``(L, L)`` matrix, in q's dtype.

    ``q`` ``(B, H, L, D)``; k and v are repeated to H heads (GQA); packed documents
    are cut apart and run one by one, as the reference's varlen test does.
    """
    if cu_seqlens is not None:
        outs, rems = [], []
        for a, b in itertools.pairwise(cu_seqlens):
            if b > a:
                o, r = dense(
                    q[:, :, a:b],
                    k[:, :, a:b],
                    v[:, :, a:b],
                    attend_current=attend_current,
                    scale=scale,
                )
                outs.append(o)
                rems.append(r)
        return torch.cat(outs, 2), torch.cat(rems, 2)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    lq, lk = q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    z = q @ k.transpose(-1, -2) * scale
    # query i sits at key position i + lk - lq; True = hidden
    hidden = torch.ones(lk, lk, dtype=torch.bool).triu(1 if attend_current else 0)[lk - lq :]
    nearer = torch.ones(lk, lk, dtype=q.dtype).tril(-1)  # (m, j): m > j
    log_beta = F.logsigmoid(z).masked_fill(hidden, -1e5)
    log_rest = F.logsigmoid(-z).masked_fill(hidden, 0.0)
    att = torch.exp(log_beta + log_rest @ nearer)
    return att @ v, 1 - att.sum(-1)


def bound(q, k, v, scale=None, u=U64, lk=None):
    """The error bound of the module docstring for these inputs (one computation)."""
    lk = k.shape[2] if lk is None else lk
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    groups = q.shape[1] // k.shape[1]
    z_abs = (q.abs() @ k.abs().repeat_interleave(groups, 1).transpose(-1, -2)).max().item() * scale
    terms = (lk + 2) * (math.log(lk) + 1) + lk * d * z_abs + lk + 1
    return u * terms * max(1.0, v.abs().max().item())


def grad_bounds(q, k, v, dout, drem, *, attend_current=False, scale=None, u=U64):
    """Per-element bounds of out, rem, dq, dk and dv of one computation, unit roundoff u.

    posenc's blocks (the backward's ``dz_ij = g_ij - beta_ij F_ij``, F_ij = sum_{m
    <= j} g_im + rem_i drem_i taken as ``dout . out + rem drem`` minus the nearer
    keys' g) or fla-core's dense reference (autograd through ``logsigmoid`` and
    a reversed cumsum: ``g_ij sigmoid(-z_ij) - beta_ij (F_ij - g_ij)``, the same
    value), for the loss ``sum dout . out + drem rem``; first order, built from the
    float64 magnitudes of the terms (g_ij = A_ij G_ij, G_ij = dout_i . v_j), then
    doubled for the second-order terms (every relative error below is under 1e-3,
    asserted):

    - a score errs by dz_ij = (D + 2) u scale |q_i|.|k_j| (the dot product, the scale);
    - log A_ij sums logsigmoid(z_ij) and the -softplus(z_im) of the nearer keys, all
      of one sign (fla: a reversed cumsum that also holds softplus(z_ij), then takes
      it off): at most L + 1 roundings of sums below |log A_ij| + softplus(z_ij),
      each term's own (min(z, 0) - log1p(exp(-|z|)): exp, log1p, the subtraction,
      6 u relative) and each score's error (slope below 1), twice for fla's own
      term: A relatively by alpha_ij = (L + 8) u (|log A_ij| + softplus(z_ij)) + 2
      sum dz + 2 u (exp within 1 ulp); log rem likewise, without the own term;
    - out_i = sum_j A_ij v_j: sum_j A |v| (alpha + (L + 1) u);
    - G (DV terms) errs by DV u |dout_i|.|v_j|, so g by |g| (alpha + u) + A DV u
      |dout|.|v|; F_ij, whichever way, by the sum of the row's g errors, dout .
      err out (posenc's total), rem |drem| (alpha_rem + 2 u) and (L + 3) u times the
      row's sum_m |g_im| + rem |drem| (L terms and three adds);
    - beta = sigmoid(z), or fla's sigmoid(-z) from logsigmoid's backward: 8 u
      relative and dz (slope beta (1 - beta)); dz_ij then errs by 2 err g + beta err
      F + (|g| + beta (|F| + |g|)) (12 u + dz) (either form, its products and
      subtraction);
    - dq_i = scale sum_j dz_ij k_j: scale (sum_j err dz |k_j| + (L + 2) u sum_j |dz|
      |k_j|); dk likewise over the group's queries; dv_j = sum_i A_ij dout_i:
      sum_i A alpha |dout| + (group q_len + 1) u sum_i A |dout|.
    """
    q, k, v, dout, drem = (t.detach().double() for t in (q, k, v, dout, drem))
    b, h, lq, d = q.shape
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    group = h // hk
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    pos = torch.arange(lq) + lk - lq
    keys = torch.arange(lk)[None, :]
    seen = keys <= pos[:, None] if attend_current else keys < pos[:, None]
    z = q @ kr.mT * scale
    dz = (d + 2) * u * (q.abs() @ kr.abs().mT) * scale * seen
    softplus = -F.logsigmoid(-z) * seen

    def after(x):  # sum over the nearer keys m > j
        return x.flip(-1).cumsum(-1).flip(-1) - x

    log_a = (F.logsigmoid(z) - after(softplus)) * seen
    a = torch.exp(log_a) * seen
    alpha = ((lk + 8) * u * (log_a.abs() + softplus) + 2 * (dz + after(dz)) + 2 * u) * seen
    assert float(alpha.max()) < 1e-3, "second-order terms no longer negligible"
    log_rem = -softplus.sum(-1)
    rem = torch.exp(log_rem)
    alpha_rem = (lk + 7) * u * log_rem.abs() + dz.sum(-1) + 2 * u
    out = a @ vr
    t_out = (a * (alpha + (lk + 1) * u)) @ vr.abs()
    big = dout @ vr.mT
    big_abs = dout.abs() @ vr.abs().mT
    g = a * big
    err_g = a * (big.abs() * (alpha + u) + dv * u * big_abs)
    stick = rem * drem
    f = g.cumsum(-1) + stick[..., None]
    err_f = (
        err_g.sum(-1)
        + (a * (alpha + (lk + 1) * u) * big_abs).sum(-1)
        + dv * u * (dout * out).abs().sum(-1)
        + stick.abs() * (alpha_rem + 2 * u)
        + (lk + 3) * u * (g.abs().sum(-1) + stick.abs())
    )[..., None]
    beta = torch.sigmoid(z) * seen
    grad_z = (g - beta * f) * seen
    err_z = 2 * err_g + (g.abs() + beta * (f.abs() + g.abs())) * (12 * u + dz) + beta * err_f
    err_z = err_z * seen

    def to_kv(x):
        return x.view(b, hk, group, lk, -1).sum(2)

    t_q = scale * (err_z @ kr.abs() + (lk + 2) * u * grad_z.abs() @ kr.abs())
    t_k = scale * to_kv(err_z.mT @ q.abs() + (group * lq + 2) * u * grad_z.abs().mT @ q.abs())
    t_v = to_kv((a * alpha).mT @ dout.abs() + (group * lq + 1) * u * a.mT @ dout.abs())
    return [2 * t for t in (t_out, rem * alpha_rem, t_q, t_k, t_v)]


def inputs(b, h, hk, length, d, dv, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, length, d, generator=gen, dtype=dtype)
    k = torch.randn(b, hk, length, d, generator=gen, dtype=dtype)
    v = torch.randn(b, hk, length, dv, generator=gen, dtype=dtype)
    return q, k, v


def assert_within(actual, expected, tol):
    err = (actual - expected).abs().max().item()
    assert err <= tol, f"max error {err:.3g} above the bound {tol:.3g}"


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("block_size", [1, 5, 16, None])
def test_matches_the_reference_formula(attend_current, block_size):
    q, k, v = inputs(2, 3, 3, 37, 8, 5, seed=1)
    out, rem = posenc.stick_breaking_attention(
        q, k, v, attend_current=attend_current, block_size=block_size
    )
    ref_out, ref_rem = dense(q, k, v, attend_current=attend_current)
    tol = 2 * bound(q, k, v)
    assert_within(out, ref_out, tol)
    assert_within(rem, ref_rem, 2 * bound(q, k, torch.ones(1)))


def test_literal_halves():
    # q = 0: every beta is 1/2, so the nearest key takes 1/2, the next 1/4, ...
    # and rem_i = 2^-(number of keys seen); log 2 is rounded, hence the bound
    length = 5
    q = torch.zeros(1, 1, length, 2, dtype=torch.float64)
    k = torch.randn(1, 1, length, 2, dtype=torch.float64)
    v = torch.arange(length, dtype=torch.float64).reshape(1, 1, length, 1) + 1
    tol = bound(q, k, v)
    out, rem = posenc.stick_breaking_attention(q, k, v)
    # query 2 sees keys 1 and 0: 1/2 * 2 + 1/4 * 1
    assert_within(out[0, 0, :, 0], torch.tensor([0.0, 0.5, 1.25, 2.125, 3.0625]), tol)
    assert_within(rem[0, 0], torch.tensor([1.0, 0.5, 0.25, 0.125, 0.0625]), tol)
    out, rem = posenc.stick_breaking_attention(q, k, v, attend_current=True)
    # the query's own key first: query 1 gives 1/2 to v_1 = 2 and 1/4 to v_0 = 1
    assert_within(out[0, 0, :2, 0], torch.tensor([0.5, 1.25]), tol)
    assert_within(rem[0, 0], torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.03125]), tol)


def test_first_query_sees_nothing():
    q, k, v = inputs(1, 2, 1, 6, 4, 3, seed=2)
    out, rem = posenc.stick_breaking_attention(q, k, v)
    assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
    assert torch.equal(rem[:, :, 0], torch.ones_like(rem[:, :, 0]))


@pytest.mark.parametrize("attend_current", [False, True])
def test_kv_cache_queries_are_the_last_rows(attend_current):
    q, k, v = inputs(1, 2, 2, 20, 4, 3, seed=3)
    full_out, full_rem = posenc.stick_breaking_attention(
        q, k, v, attend_current=attend_current, block_size=3
    )
    out, rem = posenc.stick_breaking_attention(
        q[:, :, 13:], k, v, attend_current=attend_current, block_size=3
    )
    ref_out, ref_rem = dense(q[:, :, 13:], k, v, attend_current=attend_current)
    assert_within(out, ref_out, 2 * bound(q, k, v))
    assert_within(rem, ref_rem, 2 * bound(q, k, torch.ones(1)))
    assert_within(out, full_out[:, :, 13:], 2 * bound(q, k, v))
    assert_within(rem, full_rem[:, :, 13:], 2 * bound(q, k, torch.ones(1)))


def test_grouped_query_attention_equals_repeated_heads():
    q, k, v = inputs(2, 6, 2, 23, 4, 3, seed=4)
    out, rem = posenc.stick_breaking_attention(q, k, v, block_size=4)
    rep = posenc.stick_breaking_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), block_size=4
    )
    assert_within(out, rep[0], 2 * bound(q, k, v))
    assert_within(rem, rep[1], 2 * bound(q, k, torch.ones(1)))
    ref_out, _ = dense(q, k, v)
    assert_within(out, ref_out, 2 * bound(q, k, v))


# an empty document, one of one token, and documents across blocks of 4 keys
CU = [0, 3, 3, 4, 13, 30]


@pytest.mark.parametrize("attend_current", [False, True])
def test_packed_documents_equal_each_document_alone(attend_current):
    q, k, v = inputs(2, 4, 2, CU[-1], 4, 3, seed=5)
    cu = torch.tensor(CU, dtype=torch.int32)
    out, rem = posenc.stick_breaking_attention(
        q, k, v, attend_current=attend_current, cu_seqlens=cu, block_size=4
    )
    alone = [
        posenc.stick_breaking_attention(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], attend_current=attend_current
        )
        for a, b in itertools.pairwise(CU)
        if b > a
    ]
    lk = max(b - a for a, b in itertools.pairwise(CU))
    tol = 2 * bound(q, k, v, lk=lk)
    assert_within(out, torch.cat([o for o, _ in alone], 2), tol)
    assert_within(rem, torch.cat([r for _, r in alone], 2), tol)
    ref_out, ref_rem = dense(q, k, v, attend_current=attend_current, cu_seqlens=CU)
    assert_within(out, ref_out, tol)
    assert_within(rem, ref_rem, tol)


@pytest.mark.parametrize(
    "case",
    [
        dict(attend_current=False),
        dict(attend_current=True),
        dict(attend_current=False, cu_seqlens=torch.tensor([0, 2, 2, 6, 8])),
        dict(attend_current=True, cu_seqlens=torch.tensor([0, 3, 8])),
        dict(attend_current=True, queries=3),  # a KV cache
        dict(attend_current=False, scale=16.0),  # |z| in the tens: saturated sigmoids
    ],
    ids=["plain", "current", "packed", "packed-current", "cache", "large-z"],
)
def test_gradients_float64(case):
    case = dict(case)
    # small enough for gradcheck's one forward per input element and side
    queries = case.pop("queries", 8)
    q, k, v = inputs(1, 2, 1, 8, 3, 2, seed=6)
    q = q[:, :, 8 - queries :].clone()
    for t in (q, k, v):
        t.requires_grad_(True)

    def both(q, k, v):
        return posenc.stick_breaking_attention(q, k, v, block_size=2, **case)

    assert torch.autograd.gradcheck(both, (q, k, v))


def test_gradients_reach_through_rem_only():
    # rem's own gradient path (out unused), checked apart from out's
    q, k, v = inputs(1, 2, 1, 7, 3, 2, seed=7)
    for t in (q, k):
        t.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda q, k: posenc.stick_breaking_attention(q, k, v, block_size=3)[1], (q, k)
    )


@settings(max_examples=25, deadline=None)
@given(
    length=st.integers(1, 24),
    block=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    spread=st.sampled_from([0.1, 1.0, 10.0]),
)
def test_weights_and_rem_share_the_stick(length, block, seed, spread):
    # v = 1: out_i = sum_j A_ij, and sum_j A_ij + rem_i = 1; rem in [0, 1];
    # the query's own key takes sigmoid(z_ii) of what the others leave
    q, k, _ = inputs(1, 2, 2, length, 4, 1, seed)
    q = q * spread
    v = torch.ones(1, 2, length, 1, dtype=torch.float64)
    for current in (False, True):
        out, rem = posenc.stick_breaking_attention(
            q, k, v, attend_current=current, block_size=block
        )
        assert ((rem >= 0) & (rem <= 1)).all()
        assert_within(out[..., 0] + rem, torch.ones_like(rem), bound(q, k, v))
    _, rem = posenc.stick_breaking_attention(q, k, v, block_size=block)
    _, rem_current = posenc.stick_breaking_attention(q, k, v, attend_current=True, block_size=block)
    z_own = (q * k).sum(-1) / 2.0  # scale 1 / sqrt(4)
    assert_within(rem_current, rem * torch.sigmoid(-z_own), 2 * bound(q, k, v))


@pytest.mark.parametrize("scale", [16.0, 0.25])
def test_long_sequences_stay_finite(scale):
    # scale 16: |z| up to 512, past float32's exp (88); scale 1/4: rem = exp(-sum of
    # ~1000 softplus terms near log 2) underflows float32. Integer q and k and a
    # power-of-two scale make z exact in float32, so the bound has no score term.
    length = 1024
    gen = torch.Generator().manual_seed(8)
    q = torch.randint(-2, 3, (1, 2, length, 8), generator=gen).float()
    k = torch.randint(-2, 3, (1, 2, length, 8), generator=gen).float()
    v = torch.randn(1, 2, length, 4, generator=gen)
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    out, rem = posenc.stick_breaking_attention(q, k, v, scale=scale)
    ref_out, ref_rem = dense(q.double(), k.double(), v.double(), scale=scale)
    vmax = v.abs().max().item()
    tol = U32 * ((length + 2) * (math.log(length) + 1) + length + 1)
    assert_within(
        out.double(), ref_out, tol * vmax + bound(q.double(), k.double(), v.double(), scale)
    )
    assert_within(rem.double(), ref_rem, tol + bound(q.double(), k.double(), torch.ones(1), scale))
    assert ((rem >= 0) & (rem <= 1)).all()
    (out.sum() + rem.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


def test_low_precision_is_computed_in_float32():
    q, k, v = inputs(1, 2, 1, 12, 4, 3, seed=9, dtype=torch.float32)
    q16, k16, v16 = q.half(), k.half(), v.half()
    out, rem = posenc.stick_breaking_attention(q16, k16, v16, block_size=4)
    out32, rem32 = posenc.stick_breaking_attention(
        q16.float(), k16.float(), v16.float(), block_size=4
    )
    assert out.dtype == rem.dtype == torch.float16
    assert torch.equal(out, out32.half())
    assert torch.equal(rem, rem32.half())


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, no_cuda()])]
)
@pytest.mark.parametrize("attend_current", [False, True])
def test_float32_on_the_device_within_the_bounds(attend_current, device):
    """float32 on the device (``make gpu-check`` runs the CUDA variant), forward and
    backward, against float64 on CPU: within the sum of the two computations' bounds
    (grad_bounds), which hold for any order of the sums. IEEE float32 products: TF32
    would void them."""
    gen = torch.Generator().manual_seed(23)
    b, h, hk, length, d, dv = 2, 4, 2, 40, 8, 6
    q, k, v, dout = (
        torch.randn(size, generator=gen).double()  # float32-exact
        for size in ((b, h, length, d), (b, hk, length, d), (b, hk, length, dv), (b, h, length, dv))
    )
    drem = torch.randn(b, h, length, generator=gen).double()
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        there = [t.float().to(device).requires_grad_() for t in (q, k, v)]
        out, rem = posenc.stick_breaking_attention(
            *there, attend_current=attend_current, block_size=16
        )
        grads = torch.autograd.grad(
            (out, rem), there, (dout.float().to(device), drem.float().to(device))
        )
    finally:
        torch.set_float32_matmul_precision(old)
    assert out.device.type == device and out.dtype == rem.dtype == torch.float32
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out, ref_rem = posenc.stick_breaking_attention(
        *ours, attend_current=attend_current, block_size=16
    )
    ref_grads = torch.autograd.grad((ref_out, ref_rem), ours, (dout, drem))
    f32, f64 = (
        grad_bounds(q, k, v, dout, drem, attend_current=attend_current, u=u) for u in (U32, U64)
    )
    bounds = [a + c for a, c in zip(f32, f64, strict=True)]
    names = ("out", "rem", "dq", "dk", "dv")
    got = (out, rem, *grads)
    for name, a, want, bound in zip(
        names, got, (ref_out, ref_rem, *ref_grads), bounds, strict=True
    ):
        err = (a.detach().cpu().double() - want.detach()).abs()
        assert (err <= bound).all(), f"{name}: {float((err / bound).max()):.3g} x its bound"


class _Largest(TorchDispatchMode):
    """Records the most elements any op's output holds."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return result


def _largest(block_size):
    q, k, v = inputs(1, 2, 2, 64, 4, 4, seed=10)
    for t in (q, k, v):
        t.requires_grad_(True)
    with _Largest() as mode:
        out, rem = posenc.stick_breaking_attention(q, k, v, block_size=block_size)
        (out.sum() + rem.sum()).backward()
    return mode.largest


def test_block_size_bounds_the_largest_intermediate():
    # forward and backward: no tensor beyond (batch, heads, L, max(block, head_dim,
    # v_dim)) = 2 * 64 * 4; one block of every key holds the scores of the 63
    # queries that see one against all 64 keys
    assert _largest(4) <= 2 * 64 * 4
    assert _largest(64) == 2 * 63 * 64


class _Scores(TorchDispatchMode):
    """Counts the scores whose log-sigmoid is taken (twice per score and pass)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.log_sigmoid_forward, torch.ops.aten.sigmoid):
            self.count += result[0].numel() if isinstance(result, tuple) else result.numel()
        return result


def _scores(q, k, v, **kwargs):
    for t in (q, k, v):
        t.requires_grad_(True)
    with _Scores() as mode:
        out, rem = posenc.stick_breaking_attention(q, k, v, block_size=4, **kwargs)
        (out.sum() + rem.sum()).backward()
    return mode.count


def test_packing_costs_what_the_documents_cost_alone():
    # documents at multiples of the block size: the packed run scores exactly the
    # pairs the separate runs do, none across documents
    cu = [0, 8, 16, 32, 64]
    q, k, v = inputs(1, 2, 1, 64, 4, 4, seed=12)
    packed = _scores(q, k, v, cu_seqlens=torch.tensor(cu))
    alone = sum(
        _scores(*(t[:, :, a:b].detach().clone() for t in (q, k, v)))
        for a, b in itertools.pairwise(cu)
    )
    assert packed == alone
    assert packed < _scores(*(t.detach().clone() for t in (q, k, v))) / 2


def test_empty_batch():
    q, k, v = inputs(0, 2, 1, 5, 4, 3, seed=11)
    out, rem = posenc.stick_breaking_attention(q, k, v)
    assert out.shape == (0, 2, 5, 3)
    assert rem.shape == (0, 2, 5)


def _q(*shape, **kw):
    return torch.zeros(*shape, **kw)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(q=_q(2, 5, 4)), ValueError, "q must be"),
        (dict(k=_q(1, 3, 6, 4), v=_q(1, 3, 6, 3)), ValueError, "multiple of k's"),
        (dict(k=_q(1, 2, 6, 5)), ValueError, "head_dim"),
        (dict(v=_q(1, 2, 5, 3)), ValueError, "same heads and length"),
        (dict(q=_q(1, 4, 7, 4)), ValueError, "q_len must be <= k_len"),
        (dict(q=_q(1, 4, 6, 4, dtype=torch.float64)), TypeError, "share a dtype"),
        (dict(q=_q(1, 4, 6, 4, dtype=torch.int64)), TypeError, "q must be a float tensor"),
        (dict(attend_current=1), TypeError, "attend_current"),
        (dict(scale=0.0), ValueError, "scale"),
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(block_size=0), ValueError, "block_size"),
        (dict(block_size=2.0), TypeError, "block_size"),
        (dict(cu_seqlens=[0, 6]), TypeError, "cu_seqlens"),
        (dict(cu_seqlens=torch.tensor([0.0, 6.0])), TypeError, "cu_seqlens"),
        (dict(cu_seqlens=torch.tensor([0, 5])), ValueError, "cu_seqlens must end"),
        (dict(cu_seqlens=torch.tensor([1, 6])), ValueError, "cu_seqlens must start at 0"),
        (dict(cu_seqlens=torch.tensor([0, 4, 2, 6])), ValueError, "cu_seqlens must never decrease"),
    ],
)
def test_bad_inputs_are_named(kwargs, error, match):
    args = dict(q=_q(1, 4, 6, 4), k=_q(1, 2, 6, 4), v=_q(1, 2, 6, 3))
    args.update(kwargs)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(error, match=match):
        posenc.stick_breaking_attention(q, k, v, **args)


def test_huge_sizes_fail_before_any_work():
    side = 1 << 16
    q = torch.empty(1, 1, side, side, device="meta")
    with pytest.raises(ValueError, match="output"):
        posenc.stick_breaking_attention(q, q, q)
    q = torch.empty(1, 1, 1 << 20, 1, device="meta")
    assert (1 << 20) * (1 << 12) > MAX_ELEMENTS
    with pytest.raises(ValueError, match="a block of scores"):
        posenc.stick_breaking_attention(q, q, q, block_size=1 << 12)
