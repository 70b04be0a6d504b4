"""Attention biases against their anchors: the official ALiBi slopes, HF BLOOM and MPT,
HF T5's bucket function and bias, x-transformers' AlibiPositionalBias and
RelativePositionBias; KERPLE, FIRE and Sandwich against their formulas in float64.
"""

from __future__ import annotations

import copy
import io
import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.families.bias import FIRE, KERPLE, NoPE, Sandwich, T5Bias, alibi_slopes, t5_bucket
from posenc.families.bias.modules import ALiBi, relu_pieces

pytestmark = pytest.mark.usefixtures("quiet_transformers")


def official_slopes(n: int) -> list[float]:
    """The ALiBi paper's slope rule: a geometric sequence from 2^(-8/n) for n a power
    of two; otherwise that of the power of two below n, then every other slope of
    twice it (Press et al. 2022, section 3 and the fairseq code's recursion)."""

    def power_of_two(m: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    c = 2 ** math.floor(math.log2(n))
    return power_of_two(c) + official_slopes(2 * c)[0::2][: n - c]


# ------------------------------------------------------------------ ALiBi slopes


@pytest.mark.parametrize("n", range(1, 65))
def test_alibi_slopes_official_formula(n):
    # the reference multiplies a float64 ratio n times: a few ulps of rounding
    np.testing.assert_allclose(alibi_slopes(n), official_slopes(n), rtol=64 * 2.0**-52, atol=0)


def test_alibi_slopes_paper_examples():
    assert np.array_equal(alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    twelve = np.concatenate([2.0 ** -np.arange(1, 9), 2.0 ** -np.array([0.5, 1.5, 2.5, 3.5])])
    np.testing.assert_allclose(alibi_slopes(12), twelve, rtol=2.0**-52)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 12, 16, 24, 32, 40, 64])
def test_alibi_slopes_equal_hf_bloom(n):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 3, dtype=torch.long), n, torch.float32)
    # BLOOM's alibi is slope * key position; position 1 holds its float32 slopes, a
    # float32 base (2**-24 relative) raised to powers up to n, then rounded: within
    # (n + 1) * 2**-24 of exact
    np.testing.assert_allclose(
        alibi[:, 0, 1].numpy(), alibi_slopes(n), rtol=(n + 1) * 2.0**-24, atol=0
    )


@pytest.mark.parametrize("n", [1, 3, 8, 12, 16, 20, 32])
@pytest.mark.parametrize("max_bias", [8.0, 16.0])
def test_alibi_slopes_equal_hf_mpt(n, max_bias):
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    alibi = build_mpt_alibi_tensor(n, 4, alibi_bias_max=max_bias)  # (n, 1, 4): slope * (j - 3)
    slopes = -alibi[:, 0, 0] / 3
    np.testing.assert_allclose(slopes.numpy(), alibi_slopes(n, max_bias), rtol=2.0**-22)


@pytest.mark.parametrize("n", [4, 6, 8, 12])
def test_alibi_symmetric_equals_x_transformers(n):
    from x_transformers.x_transformers import AlibiPositionalBias

    ours = ALiBi(n, symmetric=True)
    theirs = AlibiPositionalBias(heads=n, total_heads=n)
    for q_len, k_len in ((7, 7), (3, 11), (1, 9)):
        want = theirs(q_len, k_len)
        torch.testing.assert_close(
            ours.bias(q_len, k_len),
            want.reshape(ours.bias(q_len, k_len).shape),
            rtol=2.0**-23,
            atol=0,
        )


@pytest.mark.parametrize("n", [4, 12])
def test_alibi_causal_equals_bloom_after_softmax(n):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    torch.manual_seed(0)
    length = 19
    scores = torch.randn(n, length, length, dtype=torch.float64)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    bloom = build_alibi_tensor(torch.ones(1, length, dtype=torch.long), n, torch.float32)
    ours = ALiBi(n).bias(length, length)
    # BLOOM adds slope * j, the paper -slope * (i - j): a per-row constant apart
    a = torch.softmax((scores + bloom.double()).masked_fill(~causal, -math.inf), -1)
    b = torch.softmax((scores + ours.double()).masked_fill(~causal, -math.inf), -1)
    # float32 biases: each differs from exact by 2**-24 of its size (<= slope * length)
    tol = 4 * 2.0**-24 * length
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("heads", "multi_query"), [(8, False), (12, True)], ids=["8-heads", "12-heads-multi-query"]
)
def test_falcon_alibi_equals_hf_falcon(heads, multi_query):
    # Falcon scales its alibi with the logits: HF's FalconModel builds alibi = slope *
    # key position (build_alibi_tensor) and adds alibi / sqrt(head_dim) to the scaled
    # scores (the mask handed to SDPA, its default attention). A one-layer model of
    # random float64 weights; the output of its attention module (after `dense`)
    # against posenc.attention of the q, k, v that HF's own query_key_value and
    # _split_heads make of the module's input, left padding in the second row
    from transformers import FalconConfig, FalconModel

    head_dim, length = 16, 40
    config = FalconConfig(
        vocab_size=32, hidden_size=heads * head_dim, num_hidden_layers=1,
        num_attention_heads=heads, alibi=True, new_decoder_architecture=False,
        multi_query=multi_query, parallel_attn=True, bias=False, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = FalconModel(config).double().eval()
    attn = model.h[0].self_attention
    seen = {}
    attn.register_forward_hook(
        lambda module, args, kwargs, out: seen.update(args=args, kwargs=kwargs, out=out),
        with_kwargs=True,
    )
    ids = torch.randint(0, 32, (2, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, :5] = 0
    with torch.no_grad():
        model(ids, attention_mask=mask)
        hidden = seen["args"][0] if seen["args"] else seen["kwargs"]["hidden_states"]
        q, k, v = (t.transpose(1, 2) for t in attn._split_heads(attn.query_key_value(hidden)))
        bias = ALiBi(heads, scale_with_logits=True)
        out = posenc.attention(q, k, v, bias=bias.double(), causal=True, attention_mask=mask)
        got = attn.dense(out.transpose(1, 2).reshape(2, length, heads * head_dim))
    want = seen["out"][0]
    real = mask.bool()  # the queries of padding see no key: posenc gives 0, HF anything

    # HF's alibi is slope * key position; posenc's slope * (key - query): a per-row
    # constant apart (nothing after softmax), and each one's rounding of the exact
    # slopes (the paper's rule, official_slopes): HF's bfloat16 slopes and products
    # (exact for a power-of-two slope times a position below 256, up to 2**-8 relative
    # otherwise), measured per head over the real keys; posenc's float32 slopes, 2**-24
    # relative over distances below length
    alibi = seen["kwargs"]["alibi"].reshape(2, heads, length)
    positions = ((mask.cumsum(-1) - 1) * mask)[:, None, :].double()
    slopes = torch.tensor(official_slopes(heads), dtype=torch.float64)
    off = ((alibi.double() - slopes[None, :, None] * positions).abs() * real[:, None]).amax((0, 2))
    scale = 1 / math.sqrt(head_dim)
    shift = scale * (off + 2.0**-24 * slopes * length)  # (heads,)
    # float64 on both sides: a score (head_dim products, the scale, the bias added) within
    # (head_dim + 8) 2**-53 of scale |q||k| + |scaled bias| each side (posenc's |slope (key
    # - query)| < length: slopes are at most 1); a weight within e**(2
    # (shift + that)) - 1 relative, plus (length + 4) 2**-53 of exp, sum and division each
    # side; an output channel within max|v| of those plus length 2**-53 (the weighted
    # sum) each side; `dense` sums them with |W| and rounds hidden_size times more
    u = 2.0**-53
    qk = float(q.norm(dim=-1).max() * k.norm(dim=-1).max()) * scale
    biggest = scale * max(float(alibi.abs().max()), length)
    score = 2 * (head_dim + 8) * u * (qk + biggest)
    per_head = float(v.abs().max()) * (
        torch.expm1(2 * (shift + score)) + 2 * (length + 4) * u + 2 * length * u
    )
    channel = per_head.repeat_interleave(head_dim)  # (hidden,): channel c is head c // head_dim
    weight = attn.dense.weight.abs()
    rounding = 2 * heads * head_dim * u * (weight @ out.transpose(1, 2).reshape(2, length, -1)
                                           .abs().amax((0, 1)))  # fmt: skip
    bound = 2 * (weight @ channel + rounding)  # doubled for the second-order terms
    assert bool(((got - want).abs()[real] <= bound).all())


def test_alibi_kv_cache_distances():
    # the last query of a cache of 10 keys sits at position 9: distances 9 .. 0
    bias = ALiBi(2).bias(1, 10)
    slopes = torch.tensor(alibi_slopes(2), dtype=torch.float32)
    torch.testing.assert_close(bias[:, 0], -slopes[:, None] * torch.arange(9, -1, -1.0))
    assert bias[:, 0, -1].eq(0).all()


def test_alibi_slopes_stay_float32_under_bf16():
    m = ALiBi(8).to(torch.bfloat16)
    assert m.slopes.dtype == torch.float32


# ------------------------------------------------------------------ T5 buckets

T5_SETTINGS = [
    (bidirectional, nb, md)
    for bidirectional in (True, False)
    for nb in (4, 6, 8, 16, 32, 33, 64, 128)
    for md in (5, 16, 20, 64, 128, 1000)
    if md > (nb // 2 if bidirectional else nb) // 2
]


@pytest.mark.parametrize(("bidirectional", "nb", "md"), T5_SETTINGS)
def test_t5_bucket_equals_hf_for_every_int(bidirectional, nb, md):
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.cat([torch.arange(-5000, 5001), torch.tensor([-(2**40), 2**40, 2**62])])
    want = T5Attention._relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=nb, max_distance=md
    )
    kw = {"bidirectional": bidirectional, "num_buckets": nb, "max_distance": md}
    got = t5_bucket(rel, **kw)
    assert got.dtype == torch.long and torch.equal(got, want)
    assert np.array_equal(t5_bucket(rel.numpy(), **kw), want.numpy())
    assert torch.equal(t5_bucket(rel[:-3].int(), **kw), want[:-3])  # int32 in, int64 out


def test_t5_bucket_boundaries_as_documented():
    # bidirectional 32/128: a new bucket starts at each of these distances
    d = np.arange(0, 200)
    b = t5_bucket(-d)
    starts = d[1:][np.diff(b) != 0].tolist()
    assert starts == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 23, 32, 46, 64, 91]
    assert t5_bucket(5) == 16 + 5  # keys after the query use the upper half
    causal = t5_bucket(-np.arange(0, 200), bidirectional=False)
    assert causal[:16].tolist() == list(range(16)) and causal[113:].max() == 31
    assert t5_bucket(7, bidirectional=False) == 0  # a decoder never sees the future


@given(st.lists(st.integers(-(2**31), 2**31), min_size=1, max_size=50))
@settings(max_examples=50, deadline=None)
def test_t5_bucket_property_equals_hf(values):
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.tensor(values)
    assert torch.equal(t5_bucket(rel), T5Attention._relative_position_bucket(rel))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_buckets": 3}, ValueError),
        ({"num_buckets": 1, "bidirectional": False}, ValueError),
        ({"max_distance": 8}, ValueError),
        ({"num_buckets": 32.0}, TypeError),
        ({"bidirectional": 1}, TypeError),
    ],
)
def test_t5_bucket_rejects_bad_settings(kwargs, error):
    with pytest.raises(error, match=r"num_buckets|max_distance|bidirectional"):
        t5_bucket(np.arange(3), **kwargs)


def test_t5_bucket_rejects_floats():
    with pytest.raises(TypeError, match="relative_position"):
        t5_bucket(np.array([1.5]))
    with pytest.raises(TypeError, match="relative_position"):
        t5_bucket(torch.tensor([1.0]))


# ------------------------------------------------------------------ T5 bias


@pytest.mark.parametrize("decoder", [False, True])
def test_t5_bias_equals_hf_compute_bias(decoder):
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(d_model=32, d_kv=8, num_heads=4, is_decoder=decoder)
    hf = T5Attention(config, has_relative_attention_bias=True)
    ours = T5Bias(4, bidirectional=not decoder)
    ours.relative_attention_bias.load_state_dict(hf.relative_attention_bias.state_dict())
    with torch.no_grad():
        for q_len, k_len in ((9, 9), (1, 200), (4, 300)):
            want = hf.compute_bias(q_len, k_len, past_seen_tokens=k_len - q_len)[0]
            assert torch.equal(ours.bias(q_len, k_len), want)


@pytest.mark.parametrize("causal", [False, True])
def test_t5_bias_equals_x_transformers(causal):
    from x_transformers.x_transformers import RelativePositionBias

    theirs = RelativePositionBias(scale=0.125, causal=causal, heads=4)
    ours = T5Bias(4, bidirectional=not causal)
    ours.relative_attention_bias.load_state_dict(theirs.relative_attention_bias.state_dict())
    with torch.no_grad():
        for q_len, k_len in ((12, 12), (3, 150)):
            assert torch.equal(ours.bias(q_len, k_len) * 0.125, theirs(q_len, k_len))


def test_t5_bias_is_shared_and_trains():
    shared = T5Bias(2)
    layers = [shared, shared]  # one table for every layer, as T5
    loss = sum(m.bias(5, 5).square().sum() for m in layers)
    loss.backward()
    assert shared.relative_attention_bias.weight.grad is not None
    assert shared.relative_attention_bias.weight.grad.abs().sum() > 0


# ------------------------------------------------------------------ KERPLE, FIRE, Sandwich


def _dist(q_len, k_len):
    q = torch.arange(k_len - q_len, k_len, dtype=torch.float64)[:, None]
    return q, torch.arange(k_len, dtype=torch.float64)[None, :]


def test_kerple_log_and_power_formulas():
    torch.manual_seed(1)
    for kind in ("log", "power"):
        m = KERPLE(3, kind=kind)
        q, k = _dist(6, 10)
        d = (q - k).abs()
        p, a = m.bias_p.detach().double()[:, None, None], m.bias_a.detach().double()[:, None, None]
        if kind == "log":
            want = -p.clamp(min=1e-2) * torch.log1p(a.clamp(min=1e-2) * d)
        else:
            want = -a.clamp(min=1e-2) * d ** p.clamp(1e-2, 2.0)
        # float32 evaluation of a log or a power: a few ulps of the result
        torch.testing.assert_close(m.bias(6, 10).double(), want, rtol=8 * 2.0**-24, atol=1e-6)


def test_kerple_gradients_are_finite_at_distance_zero():
    m = KERPLE(2, kind="power")
    m.bias(4, 4).sum().backward()
    assert torch.isfinite(m.bias_p.grad).all() and torch.isfinite(m.bias_a.grad).all()
    assert m.bias_a.grad.abs().sum() > 0


def test_fire_formula_and_training():
    torch.manual_seed(2)
    m = FIRE(3)
    q, k = _dist(5, 600)
    c = m.c.detach().double()
    psi = torch.log1p((c * (q - k)).abs())
    norm = (
        torch.log1p((c * torch.maximum(q, torch.tensor(512.0, dtype=torch.float64))).abs()) + 1e-6
    )
    x = (psi / norm).float().unsqueeze(-1)
    want = m.mlp(x).movedim(-1, 0)
    torch.testing.assert_close(m.bias(5, 600), want, rtol=1e-5, atol=1e-6)
    assert not m.relative
    m.bias(5, 600).sum().backward()
    assert m.c.grad is not None and m.L_multiplier.grad is not None
    assert all(p.grad is not None for p in m.mlp.parameters())


def _pieces_bias(form, q_pos, k_pos, k_len):
    """The bias a ScaledForm gives, as posenc.attention's blocks evaluate it."""
    x = form.table[k_pos[None, :] - q_pos[:, None] + k_len - 1] * form.scale[:, None]
    piece = torch.bucketize(x, form.knots)
    return form.slopes[:, piece] * x + form.intercepts[:, piece]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    width=st.integers(1, 40),
    low=st.floats(-3, 3),
    span=st.floats(0.01, 5),
)
def test_relu_pieces_equal_the_mlp(seed, width, low, span):
    # in float64 the pieces are the MLP itself: on each piece the same units are
    # active, so slope x + intercept is the same sum regrouped (a few roundings of
    # 2**-53 relative to the sum of |terms|)
    gen = torch.Generator().manual_seed(seed)
    first, last = torch.nn.Linear(1, width).double(), torch.nn.Linear(width, 3).double()
    with torch.no_grad():
        for p in (*first.parameters(), *last.parameters()):
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
        first.weight[::5] = 0.0  # units without a bend: constant relu(b)
    high = low + span
    x = torch.cat((torch.linspace(low, high, 257, dtype=torch.float64), torch.tensor([low, high])))
    with torch.no_grad():
        knots, slopes, intercepts = relu_pieces(first, last, low, high)
        piece = torch.bucketize(x, knots)
        got = slopes[:, piece] * x + intercepts[:, piece]
        want = last(torch.relu(first(x[:, None]))).T
        size = last.weight.abs() @ (first.weight.abs() * x.abs() + first.bias.abs()[:, None])
    assert bool((knots[1:] >= knots[:-1]).all()) and bool(((knots > low) & (knots < high)).all())
    assert bool(((got - want).abs() <= 64 * 2.0**-53 * (size + last.bias.abs()[:, None])).all())


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("init_l", [3.0, 20.0, 1e4])
def test_fire_scaled_form_is_its_bias(init_l, causal):
    # queries on both sides of L (and all below it): the pieces give the module's
    # bias, and the same gradients through its parameters, in float64
    torch.manual_seed(7)
    module = FIRE(3, mlp_width=24, init_L=init_l).double()
    q_len, k_len = 30, 40
    q_pos, k_pos = torch.arange(k_len - q_len, k_len), torch.arange(k_len)
    form = module.scaled_form(q_pos, torch.arange(-(k_len - 1), q_len))
    assert form is not None and form.knots.requires_grad is False
    got = _pieces_bias(form, q_pos, k_pos, k_len)
    want = module(q_pos[:, None], k_pos[None, :])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    weights = torch.randn(want.shape, dtype=torch.float64)
    if causal:
        weights = weights * (k_pos[None, :] <= q_pos[:, None])
    params = list(module.parameters())
    g_got = torch.autograd.grad((got * weights).sum(), params)
    g_want = torch.autograd.grad((want * weights).sum(), params)
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_fire_scaled_form_needs_finite_parameters():
    module = FIRE(2)
    with torch.no_grad():
        module.mlp[2].weight[0, 0] = float("nan")
    assert module.scaled_form(torch.arange(3), torch.arange(-2, 3)) is None
    assert ALiBi(2).scaled_form(torch.arange(3), torch.arange(-2, 3)) is None


def test_sandwich_formula():
    m = Sandwich(4, dim=16)
    q, k = _dist(3, 40)
    rel = k - q
    kk = torch.arange(1, 9, dtype=torch.float64)
    profile = torch.cos(rel[..., None] / 10000 ** (2 * kk / 16)).sum(-1) - 8
    scales = torch.arange(1, 5, dtype=torch.float64) * 8 / 4
    want = profile / scales[:, None, None]
    torch.testing.assert_close(m.bias(3, 40).double(), want, rtol=2.0**-23, atol=1e-6)
    assert m.bias(1, 1).eq(0).all()  # the inner product of a position with itself


def test_nope_is_zero():
    assert NoPE(3).bias(4, 6).eq(0).all() and NoPE(3).bias(4, 6).shape == (3, 4, 6)


@pytest.mark.parametrize("cls", [ALiBi, T5Bias, KERPLE, FIRE, Sandwich, NoPE])
def test_modules_reject_non_positive_heads(cls):
    for bad in (0, -2):
        with pytest.raises(ValueError, match="num_heads"):
            cls(bad)
    with pytest.raises(TypeError, match="num_heads"):
        cls(2.0)


@pytest.mark.parametrize("cls", [ALiBi, T5Bias, KERPLE, FIRE, Sandwich, NoPE])
def test_bias_shape_and_alignment_errors(cls):
    m = cls(2)
    assert m.bias(3, 5).shape == (2, 3, 5)
    with pytest.raises(ValueError, match="q_len"):
        m.bias(6, 5)


def test_module_option_errors():
    with pytest.raises(ValueError, match="kind"):
        KERPLE(2, kind="cubic")
    with pytest.raises(ValueError, match="dim"):
        Sandwich(2, dim=7)
    with pytest.raises(TypeError, match="symmetric"):
        ALiBi(2, symmetric="yes")
    with pytest.raises(ValueError, match="max_bias"):
        ALiBi(2, max_bias=0)


def test_exported_from_posenc():
    assert posenc.ALiBi is ALiBi and posenc.T5Bias is T5Bias
    assert posenc.alibi_slopes is alibi_slopes and posenc.t5_bucket is t5_bucket


# ------------------------------------------------------------------ T5 at the int64 limits

_INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bucket_does_not_wrap_at_the_int64_limits(bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    kw = {"bidirectional": bidirectional}
    # HF's float32 formula cannot tell 2**63 and above from 2**63 - 1 (its float32 is 2**63)
    past, before = (
        T5Attention._relative_position_bucket(torch.tensor([x]), **kw).item()
        for x in (_INT64_MAX, -_INT64_MAX)
    )
    # the last bucket of each side (a decoder puts keys after the query in bucket 0)
    assert (past, before) == ((31, 15) if bidirectional else (0, 31))
    unsigned = np.array([2**63 - 1, 2**63, 2**63 + 5, 2**64 - 1], dtype=np.uint64)
    assert t5_bucket(unsigned, **kw).tolist() == [past] * 4
    assert (
        t5_bucket(torch.from_numpy(unsigned.view(np.int64)).view(torch.uint64), **kw).tolist()
        == [past] * 4
    )
    assert t5_bucket(2**63, **kw) == past  # a Python int numpy holds as uint64
    # abs(-2**63) wraps in int64
    assert t5_bucket(np.array([-(2**63)]), **kw).tolist() == [before]
    assert t5_bucket(torch.tensor([-(2**63)]), **kw).tolist() == [before]


def t5_formula(rel, *, bidirectional, num_buckets, max_distance):
    """HF T5's bucket formula evaluated distance by distance, in numpy's float32."""
    buckets = num_buckets // 2 if bidirectional else num_buckets
    me = buckets // 2
    base = (rel > 0) * buckets if bidirectional else np.zeros_like(rel)
    dist = np.abs(rel) if bidirectional else np.maximum(-rel, 0)
    ratio = dist.astype(np.float32) / np.float32(me)
    with np.errstate(divide="ignore"):  # log(0), of distances the exact range takes
        scaled = np.log(ratio) / np.float32(math.log(max_distance / me)) * np.float32(buckets - me)
    large = np.minimum(me + np.maximum(scaled, 0).astype(np.int64), buckets - 1)
    return base + np.where(dist < me, dist, large)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("max_distance", [10**12, _INT64_MAX])
def test_t5_bucket_huge_max_distance_equals_the_formula(bidirectional, max_distance):
    # every distance up to 10**12 as int64 would be 8 TB: the boundaries are found by
    # bisection, each where the formula, evaluated distance by distance, puts it
    from posenc.families.bias.functional import t5_boundaries

    kw = {"bidirectional": bidirectional, "num_buckets": 32, "max_distance": max_distance}
    buckets, starts = t5_boundaries(**kw)
    assert len(starts) == buckets - buckets // 2 - 1 and (np.diff(starts) > 0).all()
    near = np.concatenate([starts - 1, starts, starts + 1, [0, 1, 7, 8, 9, 10**6, 2**62]])
    rng = np.random.default_rng(0)
    spread = np.exp2(rng.uniform(0, 62.9, 2000)).astype(np.int64)
    dist = np.concatenate([near, spread, [_INT64_MAX]])
    rel = np.concatenate([dist, -dist])
    want = t5_formula(rel, **kw)
    assert np.array_equal(t5_bucket(rel, **kw), want)
    assert np.array_equal(t5_bucket(torch.from_numpy(rel), **kw).numpy(), want)
    m = T5Bias(2, **kw)
    want_bias = m.relative_attention_bias(t5_bucket(torch.arange(4)[None, :] - 3, **kw))
    assert torch.equal(m.bias(1, 4), want_bias.movedim(-1, 0))


@pytest.mark.parametrize(("bidirectional", "nb", "md"), T5_SETTINGS)
def test_t5_formula_is_hf(bidirectional, nb, md):
    # the oracle above against HF's own function, where numpy's and torch's float32
    # logs round alike
    from transformers.models.t5.modeling_t5 import T5Attention

    kw = {"bidirectional": bidirectional, "num_buckets": nb, "max_distance": md}
    rel = torch.arange(-5000, 5001)
    want = T5Attention._relative_position_bucket(rel, **kw).numpy()
    assert np.array_equal(t5_formula(rel.numpy(), **kw), want)


def test_t5_max_distance_beyond_int64_is_refused():
    with pytest.raises(ValueError, match="max_distance"):
        t5_bucket(np.arange(3), max_distance=2**63)
    with pytest.raises(ValueError, match="max_distance"):
        T5Bias(2, max_distance=10**30)


# ------------------------------------------------------------------ meta device, casts, saving

# heads that are not a power of two: ALiBi slopes such as 2**-0.5, which float16 rounds
MODULES = {
    "alibi": lambda: ALiBi(12),
    "alibi-symmetric-falcon": lambda: ALiBi(12, symmetric=True, scale_with_logits=True),
    "t5": lambda: T5Bias(12),
    "t5-decoder": lambda: T5Bias(12, bidirectional=False, num_buckets=8, max_distance=20),
    "kerple-log": lambda: KERPLE(12),
    "kerple-power": lambda: KERPLE(12, kind="power"),
    "fire": lambda: FIRE(12, mlp_width=8, init_c=0.3, init_L=16.0),
    "sandwich": lambda: Sandwich(12, dim=16),
    "nope": lambda: NoPE(12),
}
# biases read from fixed buffers or looked up from a table: a cast of the module casts
# the result exactly (KERPLE and FIRE compute in their parameters' dtype)
LOOKUPS = {"alibi", "alibi-symmetric-falcon", "t5", "t5-decoder", "sandwich", "nope"}
LENGTHS = ((5, 9), (1, 300))


def fixed_buffers(m):
    """The non-persistent buffers: those a state dict does not carry."""
    saved = m.state_dict()
    return {n: b for n, b in m.named_buffers() if n not in saved}


def assert_same_module(got, want):
    for a, b in ((fixed_buffers(got), fixed_buffers(want)), (got.state_dict(), want.state_dict())):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    for q_len, k_len in LENGTHS:
        assert torch.equal(got.bias(q_len, k_len), want.bias(q_len, k_len))


@pytest.mark.parametrize("start", ["meta", "cpu"])
@pytest.mark.parametrize("name", MODULES)
def test_to_empty_then_load_state_dict_rebuilds_fixed_buffers(name, start):
    # deferred initialisation, as HF's and FSDP's loaders do it
    torch.manual_seed(0)
    fresh = MODULES[name]()
    with torch.device(start):
        m = MODULES[name]()
    if start == "meta":
        assert all(t.is_meta for t in [*m.parameters(), *m.buffers()])
    m.to_empty(device="cpu")
    m.load_state_dict(fresh.state_dict())
    assert_same_module(m, fresh)


@pytest.mark.parametrize("name", MODULES)
def test_reset_parameters_after_to_empty_initialises_as_the_constructor(name):
    # FSDP's default deferred initialisation: reset_parameters() of every submodule
    torch.manual_seed(1)
    fresh = MODULES[name]()
    with torch.device("meta"):
        m = MODULES[name]()
    m.to_empty(device="cpu")
    torch.manual_seed(1)
    for sub in m.modules():
        if hasattr(sub, "reset_parameters"):
            sub.reset_parameters()
    assert_same_module(m, fresh)


@pytest.mark.parametrize("cast", ["double", "half", "bfloat16", "float"])
@pytest.mark.parametrize("name", MODULES)
def test_casts_keep_fixed_buffers_exact(name, cast):
    torch.manual_seed(2)
    fresh = MODULES[name]()
    m = getattr(copy.deepcopy(fresh), cast)()
    want = fixed_buffers(fresh)
    got = fixed_buffers(m)
    assert got.keys() == want.keys()
    for key in want:  # ALiBi's slopes stay float32, Sandwich's frequencies float64
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
    if name in LOOKUPS:
        for q_len, k_len in LENGTHS:
            bias = m.bias(q_len, k_len)
            assert torch.equal(bias, fresh.bias(q_len, k_len).to(bias.dtype))


def _torch_round_trip(m):
    buffer = io.BytesIO()
    torch.save(m, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _state_dict_round_trip(m, name):
    torch.manual_seed(99)  # other parameters, which the state dict replaces
    other = MODULES[name]()
    buffer = io.BytesIO()
    torch.save(m.state_dict(), buffer)
    buffer.seek(0)
    other.load_state_dict(torch.load(buffer, weights_only=True))
    return other


ROUND_TRIPS = {
    "deepcopy": lambda m, name: copy.deepcopy(m),
    "pickle": lambda m, name: pickle.loads(pickle.dumps(m)),
    "torch.save": lambda m, name: _torch_round_trip(m),
    "state_dict": _state_dict_round_trip,
}


@pytest.mark.parametrize("how", ROUND_TRIPS)
@pytest.mark.parametrize("name", MODULES)
def test_round_trips_keep_the_bias_and_attention(name, how):
    torch.manual_seed(3)
    m = MODULES[name]()
    with torch.no_grad():  # parameters that are not the constructor's
        for p in m.parameters():
            p.add_(0.01 * torch.randn(p.shape))
    copied = ROUND_TRIPS[how](m, name)
    assert type(copied) is type(m) and repr(copied) == repr(m)
    assert_same_module(copied, m)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 12, n, 16, generator=gen) for n in (5, 9, 9))
    with torch.no_grad():
        for backend in ("kernel", "blockwise"):
            a = posenc.attention(q, k, v, bias=copied, causal=True, backend=backend)
            b = posenc.attention(q, k, v, bias=m, causal=True, backend=backend)
            assert torch.equal(a, b)
