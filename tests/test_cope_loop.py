"""CoPE's compiled loop (operand kind "counted") against float64 and the checkpointed path.

``posenc.attention(q, k, v, cope=..., causal=True)`` on float32 CPU inputs runs
``attend_counted`` and ``attend_counted_backward`` (core/csrc/counted.c) through
:mod:`posenc.integration.attention.counted`; every test of the loop asserts that it did
(the checkpointed path is made to fail). Ground truth is the checkpointed path in
float64 (``backend="blockwise"``); the float32 checkpointed path is held to the
same bounds, so both float32 paths answer to one derivation.

The bounds (``cope_bounds``) are a first-order running error analysis of the
formula in float32, U = 2**-24, each quantity carrying its own rounding and its
inputs' errors, evaluated per element in float64 with the actual values. An
n-term sum or dot product is off by gamma(n) = LAMBDA sqrt(n) U times the sum of
its terms' magnitudes (Higham and Mary 2019: independent roundings, exceeded with
probability below 2 exp(-LAMBDA**2 / 2) per sum), and the errors its terms carry in
add in quadrature (``rss``), as independent errors do; n U and plain sums (the
worst case) leave bounds a hundred times looser, which a 1% error in dS passes.

- z = q . k scale: ez = gamma(D) |q| . |k| scale + U |z|;
- a gate g = sigmoid(z) (0 on a key the query does not see): g (1 - g) ez + 4 U g
  (exp within 2 ulp, the division and a product);
- the count p_ij = sum_{k >= j} g_ik: the gates' errors in quadrature, plus 3 U p
  (the loop sums it compensated, the checkpointed path in double); clamping to
  npos - 1 is 1-Lipschitz, and so is w = p - floor p where it matters (the logit is
  continuous across integers);
- QE = q . e: gamma(D) |q| . |e| + U |QE|; the logit (1 - w) lo + w hi: |hi - lo| ep
  plus the ends' errors weighted plus 4 U of the terms; the score s = z + factor
  logit: ez + factor elogit + U (|z| + 2 factor |logit|);
- the weights P = softmax(s): eP_ij = P_ij (es_ij + sum_k P_ik es_ik + 8 U +
  gamma(k_len)) (exp, the sum of k_len terms, the log and the online rescaling);
  out = P v: eP . |v| in quadrature plus gamma(k_len) P . |v|;
- the backward: dP = dO . v (gamma(DV) |dO| . |v|), delta = dO . out (|dO| . eout +
  gamma(DV) |dO| . |out|), dS = P (dP - delta) (eP |dP - delta| + P (edP + edelta)
  + 2 U |dS|), cf = factor dS, dp = cf (hi - lo) where the count is not clamped,
  the gate gradient dg_ik = sum_{j <= k} dp_ij (the loop takes it as a row total
  less a running sum: 2 gamma(k_len) sum_j |dp_ij| besides the dp's own errors),
  dz = dS + dg g (1 - g) (with |dg| |1 - 2 g| eg for the slope's error), dQE the cf
  scattered at floor and ceil (its terms' errors plus gamma(k_len) of their
  magnitudes);
- dq = scale dz . k + dQE . e^T, dk = scale dz^T . q over the group, dv = P^T . dO,
  d pos_emb = q^T . dQE over batch and heads: each an n-term sum, its terms'
  errors in quadrature plus gamma(n) of their magnitudes.

Every bound is doubled for the second-order terms. ``cope_bounds`` also returns
its float64 values, the gradients written out by hand (one more check of the
formula the C code follows), and the part of each gradient that dS gives directly:
1% of it added to the truth must fail (a near miss, as a deliberate 1.01 in the
C code's dS showed), as must an error of 1.01 times the bound.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.core.kernels import compiled
from posenc.integration.attention import checkpointed, counted, kernel

U = 2.0**-24  # float32 unit roundoff
LAMBDA = 6.0  # gamma's confidence: an n-term sum exceeds it with probability < 2 exp(-18)

pytestmark = pytest.mark.skipif(
    compiled is None
    or not hasattr(compiled, "attend_counted")
    or not torch.backends.cpu.get_cpu_capability().startswith("AVX512"),
    reason="CoPE's compiled loop needs the built kernels and AVX-512",
)

# (batch, heads, kv_heads, q_len, k_len, head_dim, v_dim, npos_max): lengths around
# the loop's blocks (64 queries; keys in blocks of 256 forward and 64 backward),
# a KV cache, grouped-query heads, a single query; npos small (counts clamp after
# a few keys: the loop's clamped shortcut) and large (every count crosses integers
# unclamped, up to k_len)
CASES = {
    "square-clamped": (1, 2, 2, 100, 100, 16, 16, 9),
    "cache-gqa": (2, 4, 2, 70, 150, 32, 16, 17),
    "unclamped-257": (1, 2, 1, 257, 257, 64, 32, 300),
    "block-65": (1, 1, 1, 65, 65, 16, 48, 65),
    "decode": (2, 2, 1, 1, 77, 16, 16, 12),
    "two-blocks-63": (1, 3, 3, 63, 319, 32, 32, 40),
}


def make(case, seed=0):
    b, h, hk, lq, lk, d, dv, npos = case
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=gen)
    k = torch.randn(b, hk, lk, d, generator=gen)
    v = torch.randn(b, hk, lk, dv, generator=gen)
    dout = torch.randn(b, h, lq, dv, generator=gen)
    emb = torch.randn(d, npos, generator=gen) * 0.5
    return q, k, v, dout, emb


def run(q, k, v, dout, emb, *, dtype, backend="auto", swl=False, **kw):
    """Output and gradients of q, k, v and pos_emb through posenc.attention."""
    cope = posenc.CoPE(emb.shape[0], emb.shape[1], scale_with_logits=swl).to(dtype)
    with torch.no_grad():
        cope.pos_emb.copy_(emb)
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = posenc.attention(*leaves, cope=cope, causal=True, backend=backend, **kw)
    out.backward(dout.to(dtype))
    return [out.detach(), *(t.grad for t in leaves), cope.pos_emb.grad]


@pytest.fixture
def compiled_only(monkeypatch):
    """The checkpointed path fails: a call that reaches it is a test failure."""

    def refuse(*args, **kwargs):
        raise AssertionError("the checkpointed path ran")

    monkeypatch.setattr(checkpointed, "attend", refuse)


def allowed_of(b, lq, lk, mask=None, docs=None):
    """(b, 1, lq, lk): causal, not padding, the query's own document."""
    i = torch.arange(lq)[:, None] + lk - lq
    ok = (torch.arange(lk)[None, :] <= i)[None, None].expand(b, 1, lq, lk)
    if mask is not None:
        ok = ok & mask[:, None, None, :]
    if docs is not None:
        ids = docs.expand(b, lk)
        ok = ok & (ids[:, None, lk - lq :, None] == ids[:, None, None, :])
    return ok


def gamma(n):
    """The rounding error of an n-term sum, relative to the sum of its terms'
    magnitudes: LAMBDA sqrt(n) U (Higham and Mary's probabilistic bound)."""
    return LAMBDA * math.sqrt(n) * U


def rss(e, x):
    """The error of e-perturbed terms summed against x (a matrix product), independent
    errors adding in quadrature."""
    return (e.square() @ x.square()).sqrt()


def cope_bounds(q, k, v, dout, emb, *, factor, scale, allowed):
    """Float64 values, per-element error bounds of float32, and dS's direct parts.

    Returns three lists over (out, dq, dk, dv, d pos_emb): the values written out by
    hand, their bounds (the module docstring's derivation, doubled), and the part
    that dS gives directly (None for the output).
    """
    q, k, v, dout, emb = (t.double() for t in (q, k, v, dout, emb))
    b, h, lq, d = q.shape
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    npos, group = emb.shape[1], h // hk
    kx, vx = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    aq, ak, av, ado, ae = q.abs(), kx.abs(), vx.abs(), dout.abs(), emb.abs()
    seen = allowed.double()
    z = q @ kx.mT * scale
    ez = gamma(d) * (aq @ ak.mT) * scale + U * z.abs()
    sig = torch.sigmoid(z)
    g = sig * seen
    eg = (sig * (1 - sig) * ez + 4 * U * sig) * seen

    def suffix(x):  # sum over the keys j.. of each query's row
        return x.flip(-1).cumsum(-1).flip(-1)

    raw = suffix(g)
    ep = suffix(eg.square()).sqrt() + 3 * U * raw
    p = raw.clamp(max=npos - 1)
    qe = q @ emb
    eqe = gamma(d) * (aq @ ae) + U * qe.abs()
    fl, ce = p.floor().long(), p.ceil().long()
    w = p - p.floor()
    ew = ep + U * p
    lo, hi = qe.gather(-1, fl), qe.gather(-1, ce)
    elo, ehi = eqe.gather(-1, fl), eqe.gather(-1, ce)
    logit = hi * w + lo * (1 - w)
    elogit = (hi - lo).abs() * ew + w * ehi + (1 - w) * elo
    elogit = elogit + 4 * U * (hi.abs() * w + lo.abs() * (1 - w))
    s = (z + factor * logit).masked_fill(~allowed, -math.inf)
    es = (ez + factor * elogit + U * (z.abs() + 2 * factor * logit.abs())) * seen
    P = torch.softmax(s, -1).nan_to_num(0.0)
    eP = P * (es + (P * es).sum(-1, keepdim=True) + 8 * U + gamma(lk))
    out = P @ vx
    eout = rss(eP, av) + gamma(lk) * (P @ av)
    # the backward
    dP = dout @ vx.mT
    edP = gamma(dv) * (ado @ av.mT)
    delta = (dout * out).sum(-1, keepdim=True)
    edelta = (ado * eout).sum(-1, keepdim=True) + gamma(dv) * (ado * out.abs()).sum(
        -1, keepdim=True
    )
    dS = P * (dP - delta)
    edS = eP * (dP - delta).abs() + P * (edP + edelta) + 2 * U * dS.abs()
    cf, ecf = factor * dS, factor * edS + U * factor * dS.abs()
    open_ = (raw <= npos - 1).double()
    dp = cf * (hi - lo) * open_
    edp = (ecf * (hi - lo).abs() + cf.abs() * (ehi + elo) + 2 * U * dp.abs()) * open_
    dg = dp.cumsum(-1)
    edg = edp.square().cumsum(-1).sqrt() + 2 * gamma(lk) * dp.abs().sum(-1, keepdim=True)
    slope = sig * (1 - sig) * seen
    dz = dS + dg * slope
    edz = (
        edS
        + edg * slope
        + dg.abs() * (1 - 2 * sig).abs() * eg
        + 3 * U * (dS.abs() + dg.abs() * slope)
    )

    def scatter(x_lo, x_hi):  # (.., lk) at floor and ceil -> (.., npos)
        zero = torch.zeros(b, h, lq, npos, dtype=torch.float64)
        return zero.scatter_add(-1, fl, x_lo).scatter_add(-1, ce, x_hi)

    dqe = scatter(cf * (1 - w), cf * w)
    edqe = scatter((ecf * (1 - w) + cf.abs() * ew).square(), (ecf * w + cf.abs() * ew).square())
    edqe = edqe.sqrt() + gamma(lk) * scatter(cf.abs() * (1 - w), cf.abs() * w)

    def by_kv(x):  # (b, h, ..) summed over each kv head's group
        return x.unflatten(1, (hk, group)).sum(2)

    def by_kv_rss(x):
        return x.square().unflatten(1, (hk, group)).sum(2).sqrt()

    dq = scale * (dz @ kx) + dqe @ emb.mT
    edq = scale * (rss(edz, ak) + gamma(lk) * (dz.abs() @ ak)) + rss(edqe, ae.mT)
    edq = edq + gamma(npos) * (dqe.abs() @ ae.mT) + U * dq.abs()
    dk = scale * by_kv(dz.mT @ q)
    edk = scale * (by_kv_rss(rss(edz.mT, aq)) + gamma(group * lq) * by_kv(dz.abs().mT @ aq))
    dvv = by_kv(P.mT @ dout)
    edv = by_kv_rss(rss(eP.mT, ado)) + gamma(group * lq) * by_kv(P.mT @ ado)
    de = torch.einsum("bhid,bhit->dt", q, dqe)
    ede = torch.einsum("bhid,bhit->dt", aq.square(), edqe.square()).sqrt()
    ede = ede + gamma(b * h * lq) * torch.einsum("bhid,bhit->dt", aq, dqe.abs())
    direct = [
        None,
        scale * (dS @ kx) + scatter(cf * (1 - w), cf * w) @ emb.mT,
        scale * by_kv(dS.mT @ q),
        None,
        de,
    ]
    values = [out, dq, dk, dvv, de]
    bounds = [2 * e for e in (eout, edq, edk, edv, ede)]
    return values, bounds, direct


def within(got, want, bound):
    """Whether every element of got is within its bound of want."""
    return bool(((got.double() - want).abs() <= bound).all())


def check(case, *, swl=False, seed=0, doc_row=None, **kw):
    """Inputs, the float64 truth, the bounds' values, bounds and dS parts, and the
    float32 checkpointed path's results (a call of ``posenc.attention`` with ``kw``;
    ``doc_row`` the documents as the bounds' mask reads them)."""
    inputs = make(case, seed)
    scale = 1 / math.sqrt(case[5])
    allowed = allowed_of(case[0], case[3], case[4], kw.get("attention_mask"), doc_row)
    values, bounds, direct = cope_bounds(
        *inputs, factor=scale if swl else 1.0, scale=scale, allowed=allowed
    )
    truth = run(*inputs, dtype=torch.float64, backend="blockwise", swl=swl, **kw)
    reference = run(*inputs, dtype=torch.float32, backend="blockwise", swl=swl, **kw)
    return inputs, truth, values, bounds, direct, reference


def verdicts(monkeypatch, case, *, swl=False, seed=0, **kw):
    """Both float32 paths within the bounds of float64, the compiled one taken; the
    near misses fail."""
    inputs, truth, values, bounds, direct, reference = check(case, swl=swl, seed=seed, **kw)
    kw.pop("doc_row", None)
    names = ("out", "dq", "dk", "dv", "dpos_emb")
    for name, want, mine in zip(names, truth, values, strict=True):
        # the hand-written gradients are autograd's of the float64 path
        assert (mine - want).abs().max() <= 1e-9 * (1 + want.abs().max()), name
    for name, got, want, bound in zip(names, reference, truth, bounds, strict=True):
        assert within(got, want, bound), f"checkpointed float32 {name}"
    with monkeypatch.context() as m:
        m.setattr(checkpointed, "attend", _refuse)
        got_all = run(*inputs, dtype=torch.float32, swl=swl, **kw)
    for name, got, want, bound, part in zip(names, got_all, truth, bounds, direct, strict=True):
        assert got.dtype == torch.float32
        err = (got.double() - want).abs()
        assert within(got, want, bound), f"compiled {name}: {(err - bound).max():.3g} over"
        # near misses: 1.01 times the bound, and dS 1% off where it reaches directly
        assert not within(want + 1.01 * bound, want, bound)
        if part is not None:
            assert not within(want + 0.01 * part, want, bound), f"{name}: 1% of dS passes"


def _refuse(*args, **kwargs):
    raise AssertionError("the checkpointed path ran")


@pytest.mark.parametrize("swl", [False, True], ids=["paper", "scaled"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_compiled_within_the_bounds(case, swl, monkeypatch):
    verdicts(monkeypatch, case, swl=swl)


def padding(b, lk):
    mask = torch.ones(b, lk, dtype=torch.bool)
    mask[-1, : lk // 3] = False  # the last row left-padded: its first queries see no key
    mask[0, lk // 2] = False  # a hole: the count skips it
    return mask


@pytest.mark.parametrize("case", ["cache-gqa", "square-clamped", "unclamped-257"])
def test_key_padding(case, monkeypatch):
    shape = CASES[case]
    verdicts(monkeypatch, shape, attention_mask=padding(shape[0], shape[4]))


def test_packed_documents_restart_the_counts(monkeypatch):
    # documents across the loop's blocks, one of a single token; the counts restart
    shape = (2, 2, 1, 150, 150, 16, 16, 30)
    cu = torch.tensor([0, 40, 41, 110, 150])
    ids = torch.repeat_interleave(torch.arange(4), cu.diff())
    verdicts(monkeypatch, shape, cu_seqlens=cu, doc_row=ids[None])


def test_document_ids_per_row(monkeypatch):
    shape = (2, 2, 2, 90, 130, 16, 16, 20)  # with a KV cache: queries are the last keys
    ids = torch.stack([torch.arange(130) // 50, torch.arange(130) // 17])
    verdicts(monkeypatch, shape, document_ids=ids, doc_row=ids)


def test_seeds_vary(monkeypatch):
    for seed in (1, 2):
        verdicts(monkeypatch, CASES["cache-gqa"], seed=seed, swl=True)


def test_the_compiled_path_is_the_checkpointed_one(monkeypatch):
    # compiled against the float32 checkpointed path directly: their distance is at
    # most the sum of both bounds (each within its own of float64)
    inputs, _, _, bounds, _, reference = check(CASES["two-blocks-63"])
    monkeypatch.setattr(checkpointed, "attend", _refuse)
    got = run(*inputs, dtype=torch.float32)
    for a, b, bound in zip(got, reference, bounds, strict=True):
        assert within(a, b.double(), 2 * bound)
        assert not within(b.double() + 2.02 * bound, b.double(), 2 * bound)


@pytest.mark.parametrize(
    "why",
    ["float64", "head_dim 8", "v_dim 8", "alibi beside", "strided head_dim"],
)
def test_calls_the_loop_cannot_take_go_to_the_checkpointed_path(why, monkeypatch):
    case = (1, 2, 2, 20, 20, 16, 16, 6)
    q, k, v, dout, emb = make(case)
    dtype, extra = torch.float32, {}
    if why == "float64":
        dtype = torch.float64
    elif why == "head_dim 8":
        q, k, emb = q[..., :8], k[..., :8], emb[:8]
    elif why == "v_dim 8":
        v, dout = v[..., :8], dout[..., :8]
    elif why == "alibi beside":
        extra = {"bias": posenc.ALiBi(2)}
    plan_q = q
    if why == "strided head_dim":
        plan_q = torch.randn(1, 2, 20, 32)[..., ::2]
        q = plan_q
    ran = []
    real = checkpointed.attend

    def spy(*args, **kwargs):
        ran.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpointed, "attend", spy)
    monkeypatch.setattr(counted, "forward", _refuse)
    cope = posenc.CoPE(emb.shape[0], emb.shape[1]).to(dtype)
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = posenc.attention(*leaves, cope=cope, causal=True, **extra)
    out.backward(dout.to(dtype))
    assert ran and leaves[0].grad is not None


def test_the_reader_is_registered():
    assert kernel.READERS["counted"] is counted


def test_no_grad_forward_and_pos_emb_frozen(monkeypatch):
    # inference, and a frozen pos_emb (no gradient asked of it)
    case = CASES["cache-gqa"]
    inputs, truth, _, bounds, _, _ = check(case)
    q, k, v, dout, emb = inputs
    monkeypatch.setattr(checkpointed, "attend", _refuse)
    cope = posenc.CoPE(emb.shape[0], emb.shape[1]).requires_grad_(False)
    with torch.no_grad():
        cope.pos_emb.copy_(emb)
        got = posenc.attention(q, k, v, cope=cope, causal=True)
    assert within(got, truth[0], bounds[0])
    leaf = q.clone().requires_grad_()
    posenc.attention(leaf, k, v, cope=cope, causal=True).backward(dout)
    assert within(leaf.grad, truth[1], bounds[1]) and cope.pos_emb.grad is None
