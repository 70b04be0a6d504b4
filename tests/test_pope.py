"""PoPE against pope-pytorch, x-transformers' polar path and a float64 formula from the paper.

References (both installed by the ``test`` extra):

- pope-pytorch 0.2.1 (``PoPE_pytorch/pope.py``): ``PoPE`` (``inv_freqs = theta **
  -(arange(dim) / dim)``, ``bias`` ``(heads, dim)``), ``apply_pope_to_qk`` (interleaved
  ``(d two)`` channels, partial rotation, queries at the last ``q_len`` positions) and
  ``PoPE_pytorch/attention.py`` (``compute_attn_similarity``, ``flash_attn_with_pope``,
  whose CPU path is the unfused one).
- x-transformers (``x_transformers.py``): ``PolarEmbedding`` (``inv_freq = 1 / base **
  (arange(dim) / dim)``, ``learned_bias`` ``(heads, 1, dim)``) and
  ``apply_polar_pos_emb`` (cos channels, then sin channels).

Both build their bias with ``bias_uniform_init=True`` by an in-place ``uniform_`` on a
parameter that requires grad, which autograd refuses: they are built under
``torch.no_grad()`` here.

Tolerances are derived from float32's unit roundoff ``u = 2**-24``:

- The references' phase of channel ``c`` at position ``p`` is ``fl(p * fl(theta_c))``:
  ``fl(theta_c)`` is ``pow`` (or ``1 / pow``) of a rounded exponent ``c / d``, off by
  ``(4 + (c / d) ln(base)) u`` relative; the product adds ``u`` relative, the keys' sum
  with the bias ``(|p theta_c| + 2 pi) u``. So the phase is off by at most
  ``(|p| theta_c (5 + (c / d) ln(base)) + 2 pi) u`` (:func:`_phase_error`).
- posenc's ``cos`` and ``sin`` are exact before one rounding; the bias enters by the
  angle-addition formula (``cos`` and ``sin`` of the bias, two products and a sum):
  within ``8 u`` of exact. ``cos`` and ``sin`` of the references' rounded angle add
  ``2 u``, ``softplus`` and the product with it ``4 u`` relative: a polar channel differs
  by at most ``mu (phase error + 16 u)``.
- A score sums ``2 d`` products: ``2 d mu_max**2 (2 e + 2 d u)`` for channel error ``e``
  relative; a softmax moves by at most twice the scaled score error, times ``max |v|``,
  plus ``k_len u max |v|`` for the weighted sum.
- Gradients: ``softplus' = sigmoid <= 1`` and ``|cos|, |sin| <= 1``: per channel twice
  the upstream gradient times the channel error; the bias sums ``n`` of them (``n``
  terms of batch and positions, plus ``n u`` for their sum).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from conftest import anchor
from posenc.families.rotary.pope import PoPE, pope_frequencies, pope_qk
from posenc.families.rotary.rotation import PairRotation

pope_ref = anchor("PoPE_pytorch")
pope_attention = anchor("PoPE_pytorch.attention")
xt = anchor("x_transformers.x_transformers")

U = 2.0**-24
TWO_PI = 2.0 * math.pi


def _phase_error(dim: int, base: float, max_position: float) -> torch.Tensor:
    """``(dim,)``: how far a float32 reference's phase of each channel may be from exact."""
    c = torch.arange(dim, dtype=torch.float64)
    theta = base ** (-c / dim)
    return (abs(max_position) * theta * (5 + c / dim * math.log(base)) + TWO_PI) * U


def _channel_tol(x: torch.Tensor, dim: int, base: float, max_position: float, layout: str):
    """Elementwise bound between posenc's and a reference's polar channels of ``x``."""
    mu = F.softplus(x[..., :dim].double())
    e = _phase_error(dim, base, max_position) + 16 * U
    bound = mu * e
    polar = torch.cat([bound, bound], -1) if layout == "half" else bound.repeat_interleave(2, -1)
    rest = x[..., dim:].double().abs() * U
    return torch.cat([polar, rest], -1)


def _amax(t: torch.Tensor) -> float:
    return float(t.detach().abs().max())


def _ref_pope(dim: int, heads: int, base: float = 10000.0, **kw):
    with torch.no_grad():  # the reference's uniform_ on a parameter needs it
        return pope_ref.PoPE(dim, heads=heads, theta=base, bias_uniform_init=True, **kw)


def _inputs(b, h, hk, lq, lk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g)
    k = torch.randn(b, hk, lk, d, generator=g)
    v = torch.randn(b, hk, lk, d, generator=g)
    return q, k, v


def _grads(out, inputs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return g, torch.autograd.grad(out, inputs, g)


# ======================================================================================
# pope-pytorch


@pytest.mark.parametrize(
    ("dim", "head_dim", "lq", "lk"),
    [(16, 16, 12, 12), (8, 16, 12, 12), (32, 32, 4, 40), (12, 20, 1, 9)],
)
def test_equals_pope_pytorch_apply(dim, head_dim, lq, lk):
    """``apply_pope_to_qk``: full and partial rotation, a KV cache (queries at the end)."""
    heads, base = 3, 10000.0
    ref = _ref_pope(dim, heads, base)
    mine = PoPE(dim, heads=heads, base=base)
    mine.load_state_dict(ref.state_dict())
    q, k, _ = _inputs(2, heads, heads, lq, lk, head_dim)
    q.requires_grad_(True)
    k.requires_grad_(True)
    rq, rk = pope_ref.apply_pope_to_qk(ref(lk), q, k)
    mq, mk = mine(q, k)
    assert mq.shape == rq.shape == (2, heads, lq, 2 * dim + head_dim - dim)
    assert mk.shape == rk.shape
    assert ((mq - rq).abs().double() <= _channel_tol(q, dim, base, lk - 1, "interleaved")).all()
    assert ((mk - rk).abs().double() <= _channel_tol(k, dim, base, lk - 1, "interleaved")).all()
    # gradients: the same upstream gradient through both
    out_ref = torch.cat([rq.flatten(), rk.flatten()])
    out_mine = torch.cat([mq.flatten(), mk.flatten()])
    g, (gq_ref, gk_ref, gb_ref) = _grads(out_ref, (q, k, ref.bias))
    gq, gk, gb = torch.autograd.grad(out_mine, (q, k, mine.bias), g)
    e = float(_phase_error(dim, base, lk - 1).max()) + 16 * U
    gmax = _amax(g)
    mu_max = _amax(F.softplus(k))
    n = 2 * lk  # bias gradient terms: batch x key positions
    assert (gq - gq_ref).abs().max() <= 2 * gmax * e
    assert (gk - gk_ref).abs().max() <= 2 * gmax * e
    assert (gb - gb_ref).abs().max() <= n * 2 * gmax * mu_max * (e + n * U)


def test_near_miss_base_fails_pope_pytorch():
    """A base 0.1% off, or an unclamped bias, is caught at the tolerance above."""
    dim, heads, lk = 16, 2, 64
    ref = _ref_pope(dim, heads)
    q, k, _ = _inputs(1, heads, heads, lk, lk, dim)
    rq, _ = pope_ref.apply_pope_to_qk(ref(lk), q, k)
    tol_q = _channel_tol(q, dim, 10000.0, lk - 1, "interleaved")
    off = PoPE(dim, heads=heads, base=10010.0)
    off.load_state_dict({"bias": ref.bias.detach()})
    oq, _ = off(q, k)
    assert not ((oq - rq).abs().double() <= tol_q).all()
    # the reference without its clamp: a bias above 0 turns the keys further
    with torch.no_grad():
        ref.bias.add_(TWO_PI + 1.0)
    mine = PoPE(dim, heads=heads)
    mine.load_state_dict(ref.state_dict())
    _, mk = mine(q, k)
    freqs, _ = ref(lk)
    _, rk_unclamped = pope_ref.apply_pope_to_qk((freqs, ref.bias), q, k)
    tol_k = _channel_tol(k, dim, 10000.0, lk - 1, "interleaved")
    _, rk_clamped = pope_ref.apply_pope_to_qk(ref(lk), q, k)
    assert ((mk - rk_clamped).abs().double() <= tol_k).all()
    assert not ((mk - rk_unclamped).abs().double() <= tol_k).all()


def test_scores_equal_compute_attn_similarity():
    """``compute_attn_similarity`` (its unfused CPU path) gives posenc's ``q' . k'``."""
    dim, head_dim, heads, lq, lk, base = 32, 32, 2, 5, 24, 10000.0
    ref = _ref_pope(dim, heads, base)
    mine = PoPE(dim, heads=heads)
    mine.load_state_dict(ref.state_dict())
    q, k, _ = _inputs(2, heads, heads, lq, lk, head_dim)
    want = pope_attention.compute_attn_similarity(q, k, ref(lk))
    mq, mk = mine(q, k)
    got = mq @ mk.mT
    e = float(_phase_error(dim, base, lk - 1).max()) + 16 * U
    mu_max = _amax(F.softplus(torch.cat([q.flatten(), k.flatten()])))
    tol = 2 * dim * mu_max**2 * (2 * e + 2 * dim * U)
    assert (got - want).abs().max() <= tol


def _attention_tols(q, k, v, g, dim, e):
    """``(output, gradient)`` bounds between two attentions whose polar channels differ by
    ``mu e`` at most (``e`` relative, :func:`_channel_tol`).

    Scores ``q' . k'`` differ by ``ds = 2 d mu**2 (2 e + 2 d u)`` (scaled: ``ds s``,
    ``s = head_dim ** -0.5``); the softmax weights by ``p 2 ds s``, so the output by
    ``2 ds s max|v| + k_len u max|v|``. Backward: ``sum_j |dL/ds_ij| <= G = 2 v_dim
    max|g| max|v|``; ``dL/dq'`` moves by ``s G mu (4 ds s + e)``, ``dL/dq`` (``sigmoid
    <= 1``, two channels) by twice that plus ``2 s G mu e``; ``dL/dk`` sums ``q_len``
    queries, the bias ``batch k_len`` keys (``mu`` more), ``dL/dv`` moves by ``q_len 2 ds
    s max|g|``. One bound takes the largest: ``4 batch q_len k_len s G mu**2 (4 ds s +
    2 e)``.
    """
    b, _, lq, head_dim = q.shape
    lk = k.shape[2]
    mu = max(1.0, _amax(F.softplus(torch.cat([q.flatten(), k.flatten()]))))
    s, vmax = head_dim**-0.5, _amax(v)
    ds = 2 * dim * mu**2 * (2 * e + 2 * dim * U)
    big_g = 2 * v.shape[-1] * _amax(g) * vmax
    out = 2 * ds * s * vmax + lk * U * vmax
    return out, 4 * b * lq * lk * s * big_g * mu**2 * (4 * ds * s + 2 * e)


@pytest.mark.parametrize(("causal", "lq"), [(False, 6), (True, 10)])
def test_attention_equals_flash_attn_with_pope(causal, lq):
    """``posenc.attention(rotary=PoPE)`` equals pope-pytorch's attention, output and grads.

    Causal with ``q_len == k_len`` only: the reference's unfused path hands ``is_causal``
    to ``scaled_dot_product_attention``, which aligns a shorter query block top-left,
    where its Triton kernel and posenc align it bottom-right (the KV-cache convention).
    """
    dim, heads, lk, base = 16, 2, 10, 10000.0
    ref = _ref_pope(dim, heads, base)
    mine = PoPE(dim, heads=heads)
    mine.load_state_dict(ref.state_dict())
    q, k, v = _inputs(2, heads, heads, lq, lk, dim)
    for t in (q, k, v):
        t.requires_grad_(True)
    want = pope_attention.flash_attn_with_pope(q, k, v, pos_emb=ref(lk), causal=causal)
    got = posenc.attention(q, k, v, rotary=mine, causal=causal)
    e = float(_phase_error(dim, base, lk - 1).max()) + 16 * U
    g, grads_ref = _grads(want, (q, k, v, ref.bias))
    grads = torch.autograd.grad(got, (q, k, v, mine.bias), g)
    out_tol, grad_tol = _attention_tols(q, k, v, g, dim, e)
    assert (got - want).abs().max() <= out_tol
    for a, b in zip(grads, grads_ref, strict=True):
        assert (a - b).abs().max() <= grad_tol


def test_grouped_query_attention_equals_pope_pytorch_up_to_its_head_order():
    """Grouped-query heads: posenc (HF's ``repeat_kv``: query head ``i`` reads key head
    ``i // group``) with the bias moved onto the queries equals ``flash_attn_with_pope``,
    which tiles the key heads (``repeat(k, 'b h ... -> b (g h) ...')``: query head ``i``
    reads key head ``i % kv_heads``), once the query heads are put in its order."""
    dim, heads, kv_heads, n, base = 8, 4, 2, 9, 10000.0
    group = heads // kv_heads
    perm = torch.tensor([(r % kv_heads) * group + r // kv_heads for r in range(heads)])
    mine = PoPE(dim, heads=heads, bias_uniform_init=True)
    ref = _ref_pope(dim, heads, base)
    with torch.no_grad():
        ref.bias.copy_(mine.bias[perm])
    q, k, v = _inputs(2, heads, kv_heads, n, n, dim)
    got = posenc.attention(q, k, v, rotary=mine, causal=True)
    want = pope_attention.flash_attn_with_pope(q[:, perm], k, v, pos_emb=ref(n), causal=True)
    e = float(_phase_error(dim, base, n - 1).max()) + 16 * U
    out_tol, _ = _attention_tols(q, k, v, torch.ones(1), dim, e)
    assert (got[:, perm] - want).abs().max() <= out_tol


# ======================================================================================
# x-transformers


def _x_polar(dim: int, heads: int, base: float = 10000.0):
    with torch.no_grad():
        return xt.PolarEmbedding(dim, heads, bias_uniform_init=True, base=base)


@pytest.mark.parametrize("causal", [False, True])
def test_equals_x_transformers(causal):
    """``apply_polar_pos_emb``: polar channels, scores, attention output and gradients."""
    dim, heads, n, base = 16, 3, 20, 10000.0
    ref = _x_polar(dim, heads, base)
    mine = PoPE(dim, heads=heads, layout="half")
    mine.load_state_dict(ref.state_dict())
    assert torch.equal(mine.bias, ref.learned_bias.detach()[:, 0])
    q, k, v = _inputs(2, heads, heads, n, n, dim)
    for t in (q, k, v):
        t.requires_grad_(True)
    freqs, bias = ref(torch.arange(n))
    rq = xt.apply_polar_pos_emb(q, freqs)
    rk = xt.apply_polar_pos_emb(k, freqs + bias)
    mq, mk = mine(q, k)
    assert ((mq - rq).abs().double() <= _channel_tol(q, dim, base, n - 1, "half")).all()
    assert ((mk - rk).abs().double() <= _channel_tol(k, dim, base, n - 1, "half")).all()
    e = float(_phase_error(dim, base, n - 1).max()) + 16 * U
    mu_max = _amax(F.softplus(torch.cat([q.flatten(), k.flatten()])))
    score_tol = 2 * dim * mu_max**2 * (2 * e + 2 * dim * U)
    assert (mq @ mk.mT - rq @ rk.mT).abs().max() <= score_tol
    # x-transformers' Attend: scaled dot product at dim_head ** -0.5 of the input
    want = F.scaled_dot_product_attention(rq, rk, v, is_causal=causal, scale=dim**-0.5)
    got = posenc.attention(q, k, v, rotary=mine, causal=causal)
    g, grads_ref = _grads(want, (q, k, v, ref.learned_bias))
    grads = torch.autograd.grad(got, (q, k, v, mine.bias), g)
    out_tol, grad_tol = _attention_tols(q, k, v, g, dim, e)
    assert (got - want).abs().max() <= out_tol
    for a, b in zip(grads, (*grads_ref[:3], grads_ref[3][:, 0]), strict=True):
        assert (a - b).abs().max() <= grad_tol


def test_near_miss_base_fails_x_transformers():
    dim, heads, n = 16, 2, 64
    ref = _x_polar(dim, heads)
    q, k, _ = _inputs(1, heads, heads, n, n, dim)
    freqs, _ = ref(torch.arange(n))
    rq = xt.apply_polar_pos_emb(q, freqs)
    off = PoPE(dim, heads=heads, layout="half", base=10010.0)
    mq, _ = off(q, k)
    assert not ((mq - rq).abs().double() <= _channel_tol(q, dim, 10000.0, n - 1, "half")).all()


# ======================================================================================
# float64: gradcheck and the formula of the paper


@pytest.mark.parametrize(
    ("heads", "kv_heads", "bias_heads", "dim", "head_dim", "layout"),
    [
        (2, 2, 2, 3, 3, "interleaved"),
        (4, 2, 4, 2, 3, "half"),  # the bias on the queries (GQA)
        (2, 1, 1, 3, 4, "interleaved"),  # one shared bias, partial
    ],
)
def test_gradcheck_float64(heads, kv_heads, bias_heads, dim, head_dim, layout):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, 3, head_dim, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(2, kv_heads, 4, head_dim, dtype=torch.float64, generator=g, requires_grad=True)
    # strictly inside (-2 pi, 0): the clamp's kinks are not differentiable
    bias = -0.5 - 5 * torch.rand(bias_heads, dim, dtype=torch.float64, generator=g)
    bias.requires_grad_(True)
    freqs = pope_frequencies(dim, 100.0)
    qp, kp = torch.tensor([[5, 6, 7], [1, 2, 3]]), torch.arange(4) + 4

    def fn(q, k, bias):
        return pope_qk(q, k, qp, kp, bias, freqs, layout=layout)

    assert torch.autograd.gradcheck(fn, (q, k, bias))


def _oracle_scores(q, k, q_pos, k_pos, bias, dim, base):
    """Scores from the paper's formula in float64: ``sum_c mu_q mu_k cos((i - j) theta_c -
    delta_c)`` plus the plain product of the channels past ``dim``; GQA as HF's repeat_kv.

    ``q_pos`` and ``k_pos`` are ``(rows, len)``."""
    q, k, bias = q.double(), k.double(), bias.double()
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    theta = base ** (-torch.arange(dim, dtype=torch.float64) / dim)
    delta = bias.clamp(-TWO_PI, 0.0)  # (heads, dim)
    dist = (q_pos[:, :, None] - k_pos[:, None, :]).double()  # (rows, lq, lk)
    angle = dist[:, None, :, :, None] * theta - delta[None, :, None, None, :]
    mu_q, mu_k = F.softplus(q[..., :dim]), F.softplus(k[..., :dim])
    s = torch.einsum(
        "bhic,bhjc,bhijc->bhij", mu_q, mu_k, torch.cos(angle).expand(q.shape[0], -1, -1, -1, -1)
    )
    return s + q[..., dim:] @ k[..., dim:].mT


def _oracle_attention(q, k, v, q_pos, k_pos, bias, dim, base, mask):
    s = _oracle_scores(q, k, q_pos, k_pos, bias, dim, base) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, float("-inf"))
    v = v.double().repeat_interleave(q.shape[1] // v.shape[1], 1)
    return torch.softmax(s, -1).nan_to_num() @ v


def _engine_tol(q, k, v, dim):
    """posenc's float32 attention against the float64 formula: its channels are within
    ``16 u`` of exact (the angles exact), so the scores within ``2 d mu**2 (32 + 2 d) u``
    plus the plain channels' ``head_dim**2 max|q| max|k| u``."""
    mu = _amax(F.softplus(torch.cat([q.flatten(), k.flatten()])))
    head_dim = q.shape[-1]
    score = 2 * dim * mu**2 * (32 + 2 * dim) * U + head_dim**2 * mu**2 * U
    vmax = _amax(v)
    return 2 * score / math.sqrt(head_dim) * vmax + k.shape[2] * 4 * U * vmax


@pytest.mark.parametrize(
    ("heads", "kv_heads", "lq", "lk", "dim", "head_dim"),
    [(4, 4, 9, 9, 8, 8), (4, 2, 9, 9, 8, 12), (4, 2, 3, 11, 8, 8), (2, 1, 1, 7, 6, 6)],
)
@pytest.mark.parametrize("backend", ["auto", "blockwise"])
def test_attention_causal_gqa_cache_equals_formula(heads, kv_heads, lq, lk, dim, head_dim, backend):
    torch.manual_seed(0)
    pope = PoPE(dim, heads=heads, bias_uniform_init=True)
    q, k, v = _inputs(2, heads, kv_heads, lq, lk, head_dim)
    out = posenc.attention(q, k, v, rotary=pope, causal=True, backend=backend)
    k_pos = torch.arange(lk)[None]
    q_pos = k_pos[:, lk - lq :]
    mask = q_pos[0, :, None] >= k_pos[0, None, :]
    want = _oracle_attention(q, k, v, q_pos, k_pos, pope.bias.detach(), dim, 10000.0, mask)
    assert (out.double() - want).abs().max() <= _engine_tol(q, k, v, dim)


def test_attention_packed_documents():
    """``cu_seqlens``: positions restart with each document, equal to each one alone."""
    torch.manual_seed(0)
    cu = [0, 5, 12, 16]
    pope = PoPE(8, heads=4, bias_uniform_init=True)
    q, k, v = _inputs(2, 4, 2, 16, 16, 8)
    out = posenc.attention(q, k, v, rotary=pope, causal=True, cu_seqlens=torch.tensor(cu))
    tol = _engine_tol(q, k, v, 8)
    for a, b in itertools.pairwise(cu):
        alone = posenc.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], rotary=pope, causal=True)
        assert (out[:, :, a:b] - alone).abs().max() <= 2 * tol
        pos = torch.arange(b - a)[None]
        mask = pos[0, :, None] >= pos[0, None, :]
        want = _oracle_attention(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], pos, pos, pope.bias.detach(), 8,
            10000.0, mask,
        )  # fmt: skip
        assert (out[:, :, a:b].double() - want).abs().max() <= tol


@settings(max_examples=25, deadline=None)
@given(shift=st.integers(0, 2**30), seed=st.integers(0, 2**16))
def test_scores_see_the_distance_only(shift, seed):
    """Exact angles: moving every position by up to ``2**30`` keeps the scores, where a
    float32 phase would be off by ``shift * 2**-24`` radians."""
    pope = PoPE(8, heads=2)
    q, k, _ = _inputs(1, 2, 2, 6, 6, 8, seed)
    with torch.no_grad():
        pope.bias.uniform_(-TWO_PI, 0.0, generator=torch.Generator().manual_seed(seed))
        a = pope(q, k)
        b = pope(q, k, offset=shift)
    mu = _amax(F.softplus(torch.cat([q.flatten(), k.flatten()])))
    tol = 2 * 8 * mu**2 * (32 + 2 * 8) * U
    assert (a[0] @ a[1].mT - b[0] @ b[1].mT).abs().max() <= tol


# ======================================================================================
# the module: state dicts, dtypes, protocol, errors


def test_state_dicts_of_the_references_load():
    ref = _ref_pope(8, 2)
    mine = PoPE(8, heads=2)
    mine.load_state_dict(ref.state_dict())
    assert torch.equal(mine.bias, ref.bias)
    assert torch.allclose(mine.inv_freqs, ref.inv_freqs, rtol=(math.log(1e4) + 4) * U, atol=0)
    assert sorted(mine.state_dict()) == ["bias"]
    # another theta is refused, naming the way to keep it
    with pytest.raises(ValueError, match="inv_freqs"):
        PoPE(8, heads=2).load_state_dict(_ref_pope(8, 2, base=500000.0).state_dict())
    custom = torch.tensor([1.0, 0.5, 0.25, 0.125, 0.1, 0.01, 0.001, 1e-4])
    ref_custom = _ref_pope(8, 2, inv_freqs=custom)
    mine_custom = PoPE(8, heads=2, inv_freqs=ref_custom.inv_freqs)
    mine_custom.load_state_dict(ref_custom.state_dict())
    q, k, _ = _inputs(1, 2, 2, 5, 5, 8)
    rq, rk = pope_ref.apply_pope_to_qk(ref_custom(5), q, k)
    mq, mk = mine_custom(q, k)
    assert (mq @ mk.mT - rq @ rk.mT).abs().max() <= 2 * 8 * 25 * (2 * 64 + 16) * U
    with pytest.raises(ValueError, match="inv_freqs"):
        mine.load_state_dict(ref_custom.state_dict())


def test_module_and_protocol():
    pope = PoPE(8, heads=4)
    assert isinstance(pope, PairRotation)
    assert "PoPE(8, heads=4, base=10000" in repr(pope)
    q, k, _ = _inputs(1, 4, 2, 3, 3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = pope(q, k)
    assert a[0].dtype == torch.float32
    b = pope(q.bfloat16(), k.bfloat16())
    assert b[0].dtype == b[1].dtype == torch.bfloat16
    # computed in float32 from the bfloat16 inputs, rounded once
    c = pope(q.bfloat16().float(), k.bfloat16().float())
    assert torch.equal(b[0], c[0].bfloat16()) and torch.equal(b[1], c[1].bfloat16())
    with torch.device("meta"):
        meta = PoPE(8, heads=4)
        custom = PoPE(2, heads=1, inv_freqs=[1.0, 0.5])
    meta.to_empty(device="cpu")
    custom.to_empty(device="cpu")
    assert torch.equal(meta.inv_freqs, pope.inv_freqs)
    assert custom.inv_freqs.tolist() == [1.0, 0.5]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dim": 0, "heads": 2}, ValueError, "dim"),
        ({"dim": 8.0, "heads": 2}, TypeError, "dim"),
        ({"dim": 8, "heads": 0}, ValueError, "heads"),
        ({"dim": 8, "heads": 2, "base": -1.0}, ValueError, "base"),
        ({"dim": 8, "heads": 2, "layout": "polar"}, ValueError, "layout"),
        ({"dim": 8, "heads": 2, "inv_freqs": [1.0, 2.0]}, ValueError, "inv_freqs"),
        ({"dim": 2, "heads": 2, "inv_freqs": ["a", "b"]}, TypeError, "inv_freqs"),
        ({"dim": 2, "heads": 2, "inv_freqs": [1.0, float("nan")]}, ValueError, "inv_freqs"),
        ({"dim": 8, "heads": 2, "bias_uniform_init": 1}, TypeError, "bias_uniform_init"),
    ],
)
def test_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        PoPE(**kwargs)


def test_call_errors():
    pope = PoPE(8, heads=2)
    q, k, _ = _inputs(2, 2, 2, 4, 4, 8)
    with pytest.raises(ValueError, match="heads=2"):
        pope(q.repeat(1, 2, 1, 1), k)
    with pytest.raises(ValueError, match="dim=16"):
        PoPE(16, heads=2)(q, k)
    with pytest.raises(ValueError, match="q_len <= k_len"):
        pope(q, k[:, :, :2])
    with pytest.raises(TypeError, match="same dtype"):
        pope(q, k.double())
    with pytest.raises(TypeError, match="positions"):
        pope(q, k, positions=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions"):
        pope(q, k, positions=torch.arange(3))
    with pytest.raises(ValueError, match="positions"):
        pope(q, k, positions=torch.arange(12).reshape(3, 4))
    with pytest.raises(ValueError, match="positions"):
        pope(q, k, positions=torch.arange(4) + 2**31)
    with pytest.raises(ValueError, match="not both"):
        pope(q, k, positions=torch.arange(4), offset=1)
    with pytest.raises(ValueError, match="bias"):
        pope_qk(q, k, torch.arange(4), torch.arange(4), torch.zeros(3, 8), pope.freqs)
    with pytest.raises(ValueError, match="multiple"):
        pope_qk(q, k[:, :1].repeat(1, 3, 1, 1), torch.arange(4), torch.arange(4),
                torch.zeros(1, 8), pope.freqs)  # fmt: skip
