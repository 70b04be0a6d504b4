"""Attention biases against their anchors: the official ALiBi slopes, HF BLOOM and MPT,
HF T5's bucket function and bias, x-transformers' AlibiPositionalBias and
RelativePositionBias; KERPLE, FIRE and Sandwich against their formulas in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.families.bias import FIRE, KERPLE, NoPE, Sandwich, T5Bias, alibi_slopes, t5_bucket
from posenc.families.bias.modules import ALiBi

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
