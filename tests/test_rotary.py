"""Rotary embeddings applied: posenc.rotary.apply and posenc.rotary.module.

References: HF transformers' Llama and GPT-NeoX rotary modules and
``apply_rotary_pos_emb`` (half layout, partial rotary), rotary-embedding-torch
(interleaved layout), a float64 formula as the truth.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.families.rotary.apply import apply_rotary
from posenc.families.rotary.module import Rotary
from posenc.families.rotary.schedules import frequencies

F32_EPS = 2.0**-24  # unit roundoff of float32


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def plain(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """The textbook formula, differentiable by autograd (partial rotary included)."""
    r = cos.shape[-1]
    xr, rest = x[..., :r], x[..., r:]
    turn = rotate_half if layout == "half" else rotate_every_two
    return torch.cat([xr * cos + turn(xr) * sin, rest], dim=-1)


def truth(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, layout: str, base=1e4):
    """float64 rotation with float64 angles: errors ~1e-16 * angle, far below float32's."""
    k = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    theta = positions.double()[..., None] * base ** (-k / rotary_dim)
    if layout == "half":
        theta = torch.cat([theta, theta], dim=-1)
    else:
        theta = theta.repeat_interleave(2, dim=-1)
    return plain(x.double(), theta.cos(), theta.sin(), layout)


def hf_tolerance(x: torch.Tensor, max_angle: float) -> float:
    """HF's float32 error: the angle rounds to about 2**-22 relative (inv_freq, then the
    product), which moves a pair of norm <= 2 max|x| by that much; plus float32 ulps."""
    scale = 2 * float(x.abs().max())
    return scale * (max_angle * 2.0**-22 + 8 * F32_EPS)


# ---------------------------------------------------------------------- HF equivalence


def hf_llama(head_dim: int, base: float = 1e4):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize(
    ("q_heads", "k_heads", "offset", "per_batch"),
    [(4, 4, 0, False), (8, 2, 37, False), (4, 1, 0, True), (4, 4, 50_000, True)],
)
def test_half_matches_hf_llama(q_heads: int, k_heads: int, offset: int, per_batch: bool) -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    batch, seq, d = 2, 24, 64
    q = torch.randn(batch, q_heads, seq, d)
    k = torch.randn(batch, k_heads, seq, d)
    if per_batch:
        positions = torch.stack([torch.arange(seq) + offset, torch.arange(seq) * 3 + offset])
    else:
        positions = torch.arange(seq).expand(batch, seq) + offset
    cos, sin = hf_llama(d)(q, positions)
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    rope = Rotary(d)
    if per_batch:
        oq, ok = rope(q, k, positions=positions)
    else:
        oq, ok = rope(q, k, offset=offset)
    max_angle = float(positions.max())
    for ours, hf, x in ((oq, hq, q), (ok, hk, k)):
        tol = hf_tolerance(x, max_angle)
        torch.testing.assert_close(ours, hf, rtol=0, atol=tol)
        exact = truth(x, positions[:, None, :], d, "half")
        err_ours = (ours.double() - exact).abs().max().item()
        err_hf = (hf.double() - exact).abs().max().item()
        assert err_ours <= 8 * F32_EPS * float(x.abs().max())
        assert err_ours <= err_hf


def test_partial_rotary_matches_gpt_neox() -> None:
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import (
        GPTNeoXRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    torch.manual_seed(1)
    heads, d, seq, offset = 4, 64, 20, 1000
    config = GPTNeoXConfig(
        hidden_size=heads * d,
        num_attention_heads=heads,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25},
    )
    q, k = torch.randn(2, heads, seq, d), torch.randn(2, 2, seq, d)
    positions = (torch.arange(seq) + offset)[None].expand(2, seq)
    cos, sin = GPTNeoXRotaryEmbedding(config)(q, positions)
    assert cos.shape[-1] == 16
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    oq, ok = Rotary(d, rotary_dim=16)(q, k, offset=offset)
    assert torch.equal(oq[..., 16:], q[..., 16:])  # the tail passes through untouched
    for ours, hf, x in ((oq, hq, q), (ok, hk, k)):
        torch.testing.assert_close(ours, hf, rtol=0, atol=hf_tolerance(x, seq + offset))
        exact = truth(x, positions[:, None, :], 16, "half")
        assert (ours.double() - exact).abs().max() <= (hf.double() - exact).abs().max()


def test_cos_sin_is_hf_table() -> None:
    rope = Rotary(64)
    positions = torch.arange(100)[None]
    hc, hs = hf_llama(64)(torch.zeros(1), positions)
    c, s = rope.cos_sin(positions)
    assert c.shape == hc.shape and c.dtype == torch.float32
    tol = hf_tolerance(torch.ones(1), 100) / 2
    torch.testing.assert_close(c, hc, rtol=0, atol=tol)
    torch.testing.assert_close(s, hs, rtol=0, atol=tol)
    # HF rounds twice (pow, then 1 / x) plus powf error; ours is rounded once
    torch.testing.assert_close(rope.inv_freq, hf_llama(64).inv_freq, rtol=4 * F32_EPS, atol=0)


# ---------------------------------------------------------------------- interleaved


def test_interleaved_matches_rotary_embedding_torch() -> None:
    from rotary_embedding_torch import RotaryEmbedding

    torch.manual_seed(2)
    d, seq, offset = 32, 40, 300
    ref = RotaryEmbedding(d)
    # its convention: theta ** -(arange(0, dim, 2) / dim), pairs (2i, 2i + 1)
    expected = 10000.0 ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
    # float32 arange / dim, then powf: a few roundings
    torch.testing.assert_close(ref.freqs.double(), expected, rtol=4 * F32_EPS, atol=0)
    t = torch.randn(2, 3, seq, d)
    theirs = ref.rotate_queries_or_keys(t, offset=offset)
    ours, _ = Rotary(d, layout="interleaved")(t, t, offset=offset)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=hf_tolerance(t, seq + offset))
    exact = truth(t, torch.arange(seq) + offset, d, "interleaved")
    assert (ours.double() - exact).abs().max() <= (theirs.double() - exact).abs().max()


def hf_permute(x: torch.Tensor) -> torch.Tensor:
    """HF's convert_llama_weights_to_hf permutation of q/k channels: interleaved -> half."""
    d = x.shape[-1]
    return x.unflatten(-1, (d // 2, 2)).transpose(-1, -2).flatten(-2)


@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_interleaved_is_half_after_permutation(rotary_dim: int) -> None:
    torch.manual_seed(3)
    x = torch.randn(2, 4, 12, 32)
    inter = Rotary(32, rotary_dim=rotary_dim, layout="interleaved")
    half = Rotary(32, rotary_dim=rotary_dim, layout="half")
    a, _ = inter(x, x, offset=5)
    b, _ = half(_perm_head(x, rotary_dim), x, offset=5)
    torch.testing.assert_close(_perm_head(a, rotary_dim), b, rtol=4 * F32_EPS, atol=4 * F32_EPS)


def _perm_head(x: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    return torch.cat([hf_permute(x[..., :rotary_dim]), x[..., rotary_dim:]], dim=-1)


# ---------------------------------------------------------------------- properties

layouts = st.sampled_from(["half", "interleaved"])


@functools.cache
def rotary(head_dim: int, layout: str) -> Rotary:
    return Rotary(head_dim, layout=layout)  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None)
@given(
    layout=layouts,
    half_dim=st.integers(1, 16),
    position=st.integers(-(2**31) + 1, 2**31 - 1),
    seed=st.integers(0, 2**16),
)
def test_norm_preserved(layout: str, half_dim: int, position: int, seed: int) -> None:
    d = 2 * half_dim
    x = torch.randn(3, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    c, s = rotary(d, layout).cos_sin(torch.tensor([position] * 3), dtype=torch.float64)
    y = apply_rotary(x, c, s, layout=layout)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)


@settings(max_examples=30, deadline=None)
@given(
    layout=layouts,
    m=st.integers(0, 10**6),
    n=st.integers(0, 10**6),
    shift=st.integers(-(10**6), 10**6),
    seed=st.integers(0, 2**16),
)
def test_dot_depends_on_distance_only(layout: str, m: int, n: int, shift: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(16, generator=g).double()
    rope = rotary(16, layout)

    def dot(a: int, b: int) -> float:
        ca, sa = rope.cos_sin(torch.tensor([a]), dtype=torch.float64)
        cb, sb = rope.cos_sin(torch.tensor([b]), dtype=torch.float64)
        qa = apply_rotary(q[None], ca, sa, layout=layout)
        kb = apply_rotary(k[None], cb, sb, layout=layout)
        return float((qa * kb).sum())

    scale = float(q.norm() * k.norm())
    assert math.isclose(dot(m, n), dot(m + shift, n + shift), rel_tol=0, abs_tol=1e-12 * scale)


@settings(max_examples=30, deadline=None)
@given(layout=layouts, position=st.integers(0, 2**31 - 1), seed=st.integers(0, 2**16))
def test_rotate_back_is_identity(layout: str, position: int, seed: int) -> None:
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    c, s = rotary(8, layout).cos_sin(torch.full((5,), position), dtype=torch.float64)
    back = apply_rotary(apply_rotary(x, c, s, layout=layout), c, -s, layout=layout)
    torch.testing.assert_close(back, x, rtol=0, atol=1e-14)


# ---------------------------------------------------------------------- autograd


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [8, 6])
def test_gradcheck(layout: str, rotary_dim: int) -> None:
    c, s = Rotary(8, rotary_dim=rotary_dim, layout=layout).cos_sin(
        torch.arange(5) * 7, dtype=torch.float64
    )
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: apply_rotary(t, c, s, layout=layout, rotary_dim=rotary_dim), (x,)
    )
    assert torch.autograd.gradgradcheck(
        lambda t: apply_rotary(t, c, s, layout=layout, rotary_dim=rotary_dim), (x,)
    )


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_equals_autograd_of_formula(layout: str, dtype: torch.dtype) -> None:
    torch.manual_seed(4)
    c, s = Rotary(32, rotary_dim=24, layout=layout).cos_sin(torch.arange(9) + 100, dtype=dtype)
    x = torch.randn(2, 3, 9, 32, dtype=dtype, requires_grad=True)
    g = torch.randn(2, 3, 9, 32, dtype=dtype)
    (ours,) = torch.autograd.grad(apply_rotary(x, c, s, layout=layout), x, g)
    (ref,) = torch.autograd.grad(plain(x, c, s, layout), x, g)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(ours, ref, rtol=0, atol=8 * eps * float(g.abs().max()))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_saves_no_activations(layout: str) -> None:
    c, s = Rotary(64, layout=layout).cos_sin(torch.arange(16))
    x = torch.randn(2, 4, 16, 64, requires_grad=True)
    saved: list[torch.Size] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = apply_rotary(x * 1.0, c, s, layout=layout)
    # x * 1.0 saves nothing (a constant factor); the rotation saves cos and one sin per pair
    assert len(saved) == 2
    assert all(shape[0] == 16 and len(shape) == 2 for shape in saved), saved
    y.sum().backward()
    assert x.grad is not None


def test_cos_sin_requiring_grad_fall_back_to_autograd() -> None:
    c, s = Rotary(8).cos_sin(torch.arange(4), dtype=torch.float64)
    c.requires_grad_(True)
    s.requires_grad_(True)
    x = torch.randn(4, 8, dtype=torch.float64)
    gc, gs = torch.autograd.grad(apply_rotary(x, c, s).sum(), (c, s))
    rc, rs = torch.autograd.grad(plain(x, c, s, "half").sum(), (c, s))
    torch.testing.assert_close(gc, rc)
    # one sin per pair is read: its gradient is the sum over both copies
    torch.testing.assert_close(gs[..., :4] + gs[..., 4:], rs[..., :4] + rs[..., 4:])


# ---------------------------------------------------------------------- dtypes, packing, cache


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_rotated_in_float32(layout: str, dtype: torch.dtype) -> None:
    torch.manual_seed(5)
    rope = Rotary(64, layout=layout, rotary_dim=48)
    q = torch.randn(1, 2, 30, 64).to(dtype)
    k = torch.randn(1, 1, 30, 64).to(dtype)
    oq, ok = rope(q, k, offset=4000)
    fq, fk = rope(q.float(), k.float(), offset=4000)
    assert oq.dtype == ok.dtype == dtype
    assert torch.equal(oq, fq.to(dtype)) and torch.equal(ok, fk.to(dtype))
    qg = q.clone().requires_grad_(True)
    rope(qg, k, offset=4000)[0].float().sum().backward()
    assert qg.grad is not None and qg.grad.dtype == dtype


def _without_kernel(fn):
    """``fn()`` on torch's eager ops, as where the compiled kernel is not built."""
    from posenc.families.rotary import apply as module

    saved = module._KERNEL_DTYPES
    module._KERNEL_DTYPES = ()
    try:
        return fn()
    finally:
        module._KERNEL_DTYPES = saved


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("dtype", "ulp"), [(torch.bfloat16, 2.0**-7), (torch.float16, 2.0**-10)])
def test_low_precision_large_slices(layout: str, dtype: torch.dtype, ulp: float) -> None:
    # without the kernel, (seq, head_dim) slices of 2**15 elements and more are
    # upcast and rotated slice by slice
    torch.manual_seed(8)
    rope = Rotary(64, layout=layout, rotary_dim=40)
    q = torch.randn(2, 3, 512, 64).to(dtype)
    k = torch.randn(2, 1, 512, 64).to(dtype)
    positions = torch.stack([torch.arange(512), torch.arange(512) * 2 + 9])
    oq, ok = _without_kernel(lambda: rope(q, k, positions=positions))
    fq, fk = rope(q.float(), k.float(), positions=positions)
    # rotated in float32 and rounded once. The eager in-place path's addcmul fuses a
    # multiply-add that the float32 kernel rounds, so the float32 values may differ:
    # each is within 6 * 2**-24 * max|x| of the exact value (two products and a sum
    # of terms up to max|x|, each rounded once), so by twice that from each other.
    # Rounding to the low precision adds at most one ulp (`ulp` relative) between
    # the two, half an ulp against the float32 value itself; differences are rare
    drift = 12 * 2.0**-24 * float(q.float().abs().max()) * (1 + ulp)
    for got, want in ((oq, fq.to(dtype)), (ok, fk.to(dtype))):
        assert ((got.float() - want.float()).abs() <= ulp * want.float().abs() + drift).all()
        assert (got != want).float().mean() < 0.01
    # a strided q takes the real (not complex) formula
    strided = q.transpose(2, 3).contiguous().transpose(2, 3)
    oq, _ = _without_kernel(lambda: rope(strided, k, offset=3))
    ref = rope(q.float(), k.float(), offset=3)[0]
    torch.testing.assert_close(oq.float(), ref, rtol=ulp / 2, atol=drift)


def test_model_to_bf16_keeps_float32_inv_freq() -> None:
    rope = Rotary(64, scaling={"rope_type": "linear", "factor": 4.0})
    exact = rope.inv_freq.clone()
    model = torch.nn.Sequential(rope).to(torch.bfloat16)
    assert model[0].inv_freq.dtype == torch.float32
    assert torch.equal(model[0].inv_freq, exact)
    assert "inv_freq" not in model.state_dict() and "0.inv_freq" not in model.state_dict()
    torch.testing.assert_close(exact, Rotary(64).inv_freq / 4, rtol=F32_EPS, atol=0)


def test_seq_before_heads_layout() -> None:
    torch.manual_seed(6)
    q, k = torch.randn(2, 10, 4, 32), torch.randn(2, 10, 2, 32)
    positions = torch.stack([torch.arange(10), torch.arange(10) + 7])
    a, b = Rotary(32, seq_dim=-3)(q, k, positions=positions)
    ra, rb = Rotary(32)(q.transpose(1, 2), k.transpose(1, 2), positions=positions)
    assert torch.equal(a, ra.transpose(1, 2)) and torch.equal(b, rb.transpose(1, 2))
    a, _ = Rotary(32, seq_dim=-3)(q, k, offset=3)
    ra, _ = Rotary(32)(q.transpose(1, 2), k.transpose(1, 2), offset=3)
    assert torch.equal(a, ra.transpose(1, 2))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_cu_seqlens_equals_separate_sequences(layout: str) -> None:
    torch.manual_seed(7)
    lengths = [5, 1, 9, 3]
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q, k = torch.randn(total, 4, 32), torch.randn(total, 2, 32)
    rope = Rotary(32, layout=layout)
    pq, pk = rope(q, k, cu_seqlens=cu)
    sep = Rotary(32, layout=layout, seq_dim=-3)
    for start, n in zip(cu[:-1].tolist(), lengths, strict=True):
        eq, ek = sep(q[start : start + n], k[start : start + n])
        assert torch.equal(pq[start : start + n], eq) and torch.equal(pk[start : start + n], ek)


def test_table_cached_and_grown_by_doubling() -> None:
    rope = Rotary(16)
    key = (torch.device("cpu"), torch.float32)
    table = rope._tables[key]
    q = torch.randn(1, 1, 8, 16)
    rope(q, q, offset=100)
    assert rope._tables[key] is table  # no recomputation within the table
    rope(q, q, offset=5000)
    grown = rope._tables[key]
    assert grown[0].shape[0] == 8192
    rope(q, q, offset=6000)
    assert rope._tables[key] is grown
    rope(q.double(), q.double(), offset=1)  # float64 gets its own, float64-exact table
    assert rope._tables[(torch.device("cpu"), torch.float64)][0].dtype == torch.float64
    c, s = rope.cos_sin(torch.arange(5000, 5008))
    assert torch.equal(c, grown[0][5000:5008]) and torch.equal(s, grown[1][5000:5008])


def test_dynamic_scaling_follows_hf() -> None:
    params = {"rope_type": "dynamic", "factor": 2.0}
    rope = Rotary(32, scaling=params, max_position_embeddings=64)
    default = rope.inv_freq.clone()
    q = torch.randn(1, 1, 16, 32)
    rope(q, q, offset=100)  # needs 116 > 64: recomputed for 116
    longer = frequencies(
        "dynamic", 32, 1e4, {"factor": 2.0, "max_position_embeddings": 64}, seq_len=116
    )
    torch.testing.assert_close(rope.inv_freq, torch.tensor(longer.inv_freq, dtype=torch.float32))
    rope(q, q, offset=80)  # 96: shorter than 116 but above 64, HF keeps the 116 frequencies
    torch.testing.assert_close(rope.inv_freq, torch.tensor(longer.inv_freq, dtype=torch.float32))
    out, _ = rope(q, q)  # 16 < 64: restored (transformers #25104)
    assert torch.equal(rope.inv_freq, default)
    assert torch.equal(out, Rotary(32)(q, q)[0])
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=4,
        head_dim=32,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
    )
    hf = LlamaRotaryEmbedding(config)
    positions = torch.arange(100, 116)[None]
    hc, _ = hf(q, positions)
    c, _ = rope.cos_sin(positions)
    torch.testing.assert_close(c, hc, rtol=0, atol=hf_tolerance(torch.ones(1), 116))


# ---------------------------------------------------------------------- torch.compile


def test_compile_fullgraph_no_recompile_for_new_length() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    rope = Rotary(32, rotary_dim=24)

    def f(q: torch.Tensor, k: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        return rope(q, k, offset=offset)

    compiled = torch.compile(f, fullgraph=True, dynamic=None)
    for seq in (8, 13):
        q, k = torch.randn(2, 4, seq, 32), torch.randn(2, 2, seq, 32)
        torch._dynamo.mark_dynamic(q, 2)
        torch._dynamo.mark_dynamic(k, 2)
        got = compiled(q, k, 7)
        want = f(q, k, 7)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=4 * F32_EPS * float(q.abs().max()))
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"head_dim": 63}, "head_dim"),
        ({"head_dim": 64, "rotary_dim": 15}, "rotary_dim"),
        ({"head_dim": 64, "rotary_dim": 96}, "rotary_dim"),
        ({"head_dim": 64, "layout": "neox"}, "layout"),
        ({"head_dim": 64, "seq_dim": 1}, "seq_dim"),
        ({"head_dim": 64, "scaling": {"rope_type": "linear", "factor": 0.5}}, "factor"),
        ({"head_dim": 64, "scaling": {"rope_type": "bogus"}}, "rope type"),
        ({"head_dim": 64, "scaling": {"factor": 2.0}}, "rope_type"),
        ({"head_dim": 64, "scaling": {"rope_type": "linear", "type": "yarn"}}, "alias"),
    ],
)
def test_constructor_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Rotary(**kwargs)


def test_old_type_alias_accepted() -> None:
    a = Rotary(32, scaling={"type": "linear", "factor": 2.0})
    b = Rotary(32, scaling={"rope_type": "linear", "factor": 2.0})
    assert torch.equal(a.inv_freq, b.inv_freq) and a.attention_scaling == 1.0


def test_call_errors() -> None:
    rope = Rotary(32)
    q = torch.randn(1, 2, 4, 32)
    with pytest.raises(ValueError, match="head_dim"):
        rope(q, torch.randn(1, 2, 4, 16))
    with pytest.raises(TypeError, match="dtype"):
        rope(q, q.double())
    with pytest.raises(ValueError, match="device"):
        rope(q, q.to("meta"))
    with pytest.raises(TypeError, match="q must be a float tensor"):
        rope(q.long(), q)
    with pytest.raises(ValueError, match="2\\*\\*31"):
        rope(q, q, positions=torch.tensor([0, 1, 2, 2**31]))
    with pytest.raises(ValueError, match="2\\*\\*31"):
        rope(q, q, offset=2**31)
    with pytest.raises(ValueError, match="not both"):
        rope(q, q, positions=torch.arange(4), offset=3)
    with pytest.raises(ValueError, match="positions must be"):
        rope(q, q, positions=torch.arange(5))
    with pytest.raises(TypeError, match="offset"):
        rope(q, q, offset=1.5)
    with pytest.raises(ValueError, match="cu_seqlens"):
        rope(q[0].transpose(0, 1), q[0].transpose(0, 1), cu_seqlens=torch.tensor([0, 2, 3]))
    with pytest.raises(TypeError, match="cu_seqlens"):
        rope(q[0], q[0], cu_seqlens=torch.tensor([0.0, 2.0]))
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rotary(q, torch.ones(4, 6), torch.ones(4, 6), rotary_dim=8)
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rotary(q, torch.ones(4, 48), torch.ones(4, 48))
    with pytest.raises(ValueError, match="layout"):
        apply_rotary(q, torch.ones(4, 32), torch.ones(4, 32), layout="gptj")


def test_longrope_switches_at_original_max() -> None:
    short, long = [1.0 + 0.1 * i for i in range(8)], [2.0 + 0.2 * i for i in range(8)]
    params = {"short_factor": short, "long_factor": long, "original_max_position_embeddings": 64}
    rope = Rotary(16, scaling={"rope_type": "longrope", **params}, max_position_embeddings=256)
    full = {**params, "max_position_embeddings": 256}

    def inv(seq_len: int) -> torch.Tensor:
        freqs = frequencies("longrope", 16, 1e4, full, seq_len=seq_len)
        return torch.tensor(freqs.inv_freq, dtype=torch.float32)

    q = torch.randn(1, 1, 4, 16)
    rope(q, q, offset=60)  # 64 positions: exactly original_max stays short (unsloth PR #10681)
    assert torch.equal(rope.inv_freq, inv(64))
    rope(q, q, offset=61)
    assert torch.equal(rope.inv_freq, inv(65)) and not torch.equal(inv(65), inv(64))
    rope(q, q)
    assert torch.equal(rope.inv_freq, inv(4))


def test_concurrent_calls_agree() -> None:
    from concurrent.futures import ThreadPoolExecutor

    rope, fresh = Rotary(16), Rotary(16)
    q = torch.randn(1, 2, 8, 16)
    offsets = [3000, 9000, 17000, 40000, 100, 70000] * 2
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda o: rope(q, q, offset=o)[0], offsets))
    for o, got in zip(offsets, results, strict=True):
        assert torch.equal(got, fresh(q, q, offset=o)[0])


# ------------------------------------------------------------- from an HF config

HF_ROPE_PARAMETERS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
}


@pytest.mark.parametrize("rope_type", sorted(HF_ROPE_PARAMETERS))
def test_from_hf_config_matches_transformers(rope_type):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=1024,
        rope_parameters=dict(HF_ROPE_PARAMETERS[rope_type]),
    )
    rope = Rotary.from_hf_config(config)
    if rope_type == "default":
        inv, scaling = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).double() / 16)), 1.0
    else:
        inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    # HF's float32 inv_freq: a few float32 roundings of base ** (-2k / d) (and a blend)
    rel = ((rope.inv_freq.double() - inv.double()).abs() / inv.double().abs()).max()
    assert rel < 8 * 2.0**-23
    assert rope.attention_scaling == pytest.approx(scaling, rel=1e-12)
    # the same from the plain config.json dict
    again = Rotary.from_hf_config(config.to_dict())
    torch.testing.assert_close(again.inv_freq, rope.inv_freq, rtol=0, atol=0)


# ------------------------------------------------------------------ the fused CPU kernel

# Each test here takes the compiled_kernels fixture (tests/conftest.py): without the
# build it alone skips (under CI=true fails), saying why; the rest of the module runs.


def _reference(x, cos, sin, layout, rotary_dim):
    """The rotation in float64 from the same float32 tables (the exact product)."""
    xd, cd, sd = x.double(), cos.double(), sin.double()
    r = rotary_dim
    if layout == "half":
        x1, x2 = xd[..., : r // 2], xd[..., r // 2 : r]
        rot = torch.cat([-x2, x1], -1)
    else:
        rot = torch.stack([-xd[..., 1:r:2], xd[..., 0:r:2]], -1).flatten(-2)
    return torch.cat([xd[..., :r] * cd + rot * sd, xd[..., r:]], -1)


# (shape of x, head_dim, rotary_dim, heads_last): the kernel's generic rows (partial
# rotary), its vector rows (rotary_dim == head_dim, pairs in multiples of eight),
# several cos/sin tiles per head (seq above the tile of 65536 / (6 * rotary_dim)
# rows), and the (batch, seq, heads, head_dim) layout
KERNEL_CASES = [
    ((2, 3, 40, 64), 48, False),
    ((2, 3, 400, 64), 64, False),
    ((2, 700, 3, 32), 32, True),
]


def _kernel_tolerance(x, want):
    # float32: each product and the sum rounded once, |x1 c| + |x2 s| <= |x|max * 2,
    # so the error is at most 3 * 2**-24 * 2 * max|x|; bfloat16 (7 stored mantissa
    # bits) adds one rounding of the result, half an ulp: 2**-8 relative
    tol = 6 * 2.0**-24 * float(x.float().abs().max()) * (1 + 2.0**-8)
    if x.dtype == torch.bfloat16:
        return tol + 2.0**-8 * want.abs()
    return tol


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("shape", "rotary_dim", "heads_last"), KERNEL_CASES)
def test_kernel_matches_float64_rotation(layout, dtype, shape, rotary_dim, heads_last):
    torch.manual_seed(11)
    rope = Rotary(shape[-1], rotary_dim=rotary_dim, layout=layout)
    x = torch.randn(shape).to(dtype)
    seq = shape[1] if heads_last else shape[2]
    cos, sin = rope.cos_sin(torch.arange(1000, 1000 + seq))
    if heads_last:
        cos, sin = cos[:, None], sin[:, None]
    got = apply_rotary(x, cos, sin, layout=layout)
    want = _reference(x, cos, sin, layout, rotary_dim)
    assert ((got.double() - want).abs() <= _kernel_tolerance(x, want)).all()
    assert got.dtype == dtype


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_large_output_streams_and_stays_exact(dtype):
    # an output above 16 MiB is mapped in up front and written with non-temporal
    # stores; batch-broadcast tables and per-batch positions take the same rows
    torch.manual_seed(12)
    heads = 9 if dtype == torch.float32 else 17  # 18 MiB, 17 MiB
    rope = Rotary(128)
    x = torch.randn(2, heads, 2048, 128).to(dtype)
    positions = torch.stack([torch.arange(2048), torch.arange(2048) * 3 + 5])
    cos, sin = rope.cos_sin(positions)
    got = apply_rotary(x, cos[:, None], sin[:, None])
    want = _reference(x, cos[:, None], sin[:, None], "half", 128)
    assert ((got.double() - want).abs() <= _kernel_tolerance(x, want)).all()


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_kernel_agrees_with_torch_path(layout):
    torch.manual_seed(13)
    rope = Rotary(32, layout=layout)
    q = torch.randn(2, 4, 50, 32).bfloat16()
    k = torch.randn(2, 2, 50, 32).bfloat16()
    positions = torch.stack([torch.arange(50), torch.arange(50) + 77])
    fast = rope(q, k, positions=positions)
    slow = _without_kernel(lambda: rope(q, k, positions=positions))
    # both round the float32 rotation once; torch's in-place addcmul fuses one
    # multiply-add, so the float32 values may differ (each within 6 * 2**-24 * max|x|
    # of exact), which can move the bfloat16 result by one ulp (2**-7 relative)
    for a, b, x in zip(fast, slow, (q, k), strict=True):
        drift = 12 * 2.0**-24 * float(x.float().abs().max()) * (1 + 2.0**-7)
        assert ((a.float() - b.float()).abs() <= 2.0**-7 * b.float().abs() + drift).all()
        assert (a != b).float().mean() < 0.01


@pytest.mark.usefixtures("compiled_kernels")
def test_kernel_strided_inputs_equal_contiguous():
    torch.manual_seed(14)
    base = torch.randn(2, 12, 6, 64).bfloat16()  # (batch, seq, heads, head_dim)
    q = base.transpose(1, 2)  # a (batch, heads, seq, head_dim) view with seq-major strides
    rope = Rotary(64, rotary_dim=32)
    a, b = rope(q, q[:, :2])
    c, d = rope(q.contiguous(), q[:, :2].contiguous())
    assert torch.equal(a, c) and torch.equal(b, d)
    assert a.is_contiguous()


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_kernel_backward_is_the_inverse_rotation(layout):
    torch.manual_seed(15)
    rope = Rotary(32, layout=layout)
    x = torch.randn(1, 2, 30, 32).bfloat16().requires_grad_(True)
    y, _ = rope(x, x)
    (g,) = torch.autograd.grad(y, x, y.detach())  # R^T R x == x, up to two roundings
    # each pass rounds to bfloat16 once: half an ulp (2**-8 relative) of a value of
    # at most |x|max, twice
    bound = 2 * 2.0**-8 * float(x.detach().float().abs().max())
    assert (g.float() - x.detach().float()).abs().max() <= bound


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("head_dim", [8, 32])  # the portable rows, the vector rows
def test_kernel_keeps_nan_in_bfloat16(head_dim):
    rope = Rotary(head_dim)
    x = torch.zeros(1, 1, 3, head_dim, dtype=torch.bfloat16)
    x[0, 0, 1, 2] = float("nan")
    out, _ = rope(x, x)
    assert torch.isnan(out[0, 0, 1]).sum() >= 1 and not torch.isnan(out[0, 0, 0]).any()


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("shape", "rotary_dim", "heads_last"), KERNEL_CASES)
def test_kernel_equals_unfused_float32_formula_bit_for_bit(
    layout, dtype, shape, rotary_dim, heads_last
):
    # the kernel rounds each product, the difference and the sum once (no fused
    # multiply-add), in float32, then rounds once to the input's dtype: the same as
    # torch's separate mul and sub kernels followed by a cast
    torch.manual_seed(16)
    rope = Rotary(shape[-1], rotary_dim=rotary_dim, layout=layout)
    x = torch.randn(shape).mul(50).to(dtype)
    seq = shape[1] if heads_last else shape[2]
    cos, sin = rope.cos_sin(torch.arange(3, 3 + seq) * 7)
    if heads_last:
        cos, sin = cos[:, None], sin[:, None]
    xf = x.float()
    if layout == "half":
        h = rotary_dim // 2
        x1, x2, c1, c2, s = (
            xf[..., :h],
            xf[..., h:rotary_dim],
            cos[..., :h],
            cos[..., h:],
            sin[..., :h],
        )
    else:
        x1, x2, c1, c2, s = (
            xf[..., 0:rotary_dim:2],
            xf[..., 1:rotary_dim:2],
            cos[..., 0::2],
            cos[..., 1::2],
            sin[..., 0::2],
        )
    y1, y2 = x1 * c1 - x2 * s, x2 * c2 + x1 * s
    y = torch.cat([y1, y2], -1) if layout == "half" else torch.stack([y1, y2], -1).flatten(-2)
    want = torch.cat([y.to(dtype), x[..., rotary_dim:]], -1)
    got = apply_rotary(x, cos, sin, layout=layout)
    assert torch.equal(got, want)


# ---------------------------------------------------------------------- copies


@pytest.mark.parametrize(
    "scaling",
    [None, {"rope_type": "dynamic", "factor": 2.0}, {"rope_type": "yarn", "factor": 4.0}],
)
def test_a_used_module_survives_deepcopy_pickle_and_torch_save(scaling) -> None:
    import copy
    import io
    import pickle

    extra = {"original_max_position_embeddings": 8} if scaling and "yarn" in str(scaling) else {}
    rope = Rotary(
        32,
        scaling=None if scaling is None else {**scaling, **extra},
        max_position_embeddings=8,
    )
    q = torch.randn(1, 2, 40, 32)
    want = rope(q, q)  # used: tables built, frequencies' device tensors cached, grown
    buffer = io.BytesIO()
    torch.save(rope, buffer)
    buffer.seek(0)
    copies = (
        copy.deepcopy(rope),
        pickle.loads(pickle.dumps(rope)),
        torch.load(buffer, weights_only=False),
    )
    for clone in copies:
        assert clone._tables == {}  # a cache: every copy drops it, rebuilt on demand
        for got, expected in zip(clone(q, q), want, strict=True):
            assert torch.equal(got, expected)


# Every schedule a Rotary takes, with the parameters it needs for a 16-channel head.
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "ntk": {"rope_type": "ntk", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    },
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.1 * i for i in range(8)],
        "long_factor": [2.0 + 0.2 * i for i in range(8)],
        "original_max_position_embeddings": 8,
    },
}


def _save_and_load(module: torch.nn.Module) -> torch.nn.Module:
    import io

    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _copies(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The module through deepcopy, pickle and torch.save / torch.load."""
    import copy
    import pickle

    return {
        "deepcopy": copy.deepcopy(module),
        "pickle": pickle.loads(pickle.dumps(module)),
        "torch.save": _save_and_load(module),
    }


@pytest.mark.parametrize("used", [False, True])
@pytest.mark.parametrize("name", list(SCALINGS))
def test_every_schedule_survives_copies_and_a_state_dict_round_trip(name: str, used: bool) -> None:
    def build() -> Rotary:
        return Rotary(16, scaling=SCALINGS[name], max_position_embeddings=8)

    rope = build()
    q, k = torch.randn(1, 2, 40, 16), torch.randn(1, 1, 40, 16)
    if used:  # tables built, frequencies' device tensors cached, length-dependent ones switched
        rope(q, k)
    want = rope(q, k)
    clones = _copies(rope)
    fresh = build()
    fresh.load_state_dict(rope.state_dict())  # strict: nothing missing, nothing unexpected
    clones["state_dict"] = fresh
    for how, clone in clones.items():
        for got, expected in zip(clone(q, k), want, strict=True):
            assert torch.equal(got, expected), how
        # after the same call: a state dict does not carry the length a schedule grew to
        assert torch.equal(clone.inv_freq, rope.inv_freq), how


@pytest.mark.parametrize("name", ["default", "dynamic", "longrope"])
def test_meta_device_init_then_to_empty_rebuilds_the_buffers(name: str) -> None:
    """FSDP's and HF's deferred initialisation: meta, to_empty, then the state dict."""

    def build() -> Rotary:
        return Rotary(16, scaling=SCALINGS[name], max_position_embeddings=8)

    with torch.device("meta"):
        rope = build()
    assert rope.inv_freq.is_meta  # built where every other tensor of the model is
    rope.to_empty(device="cpu")
    fresh = build()
    rope.load_state_dict(fresh.state_dict())
    assert rope.inv_freq.dtype == torch.float32
    assert torch.equal(rope.inv_freq, fresh.inv_freq)  # not the uninitialised memory
    q = torch.randn(1, 2, 40, 16)
    for got, expected in zip(rope(q, q), fresh(q, q), strict=True):
        assert torch.equal(got, expected)
    # FSDP's param_init_fn convention: reset_parameters rebuilds them too
    rope.inv_freq.fill_(0.0)
    rope.reset_parameters()
    assert torch.equal(rope.inv_freq, fresh.inv_freq)


# Calls whose sizes would take minutes of 40-digit frequencies (or all memory), and the
# parameter each refusal must name.
ABSURD_CALLS = {
    "Rotary(2**40)": "head_dim",
    "Rotary(2**40, rotary_dim=64)": "head_dim",
    "Rotary(2**18, rotary_dim=2**18)": "head_dim",
    "frequencies('default', 2**40, 1e4)": "rotary_dim",
    "AxialRotary(2**40)": "head_dim",
    "AxialRotary(2**17, 1, axis_dim=2**17)": "head_dim",
    "pixel_frequencies(2**40)": "axis_dim",
    "xpos_scale(torch.arange(4), 2**40, center=0)": "rotary_dim",
    "rope_spec({'head_dim': 2**40})": "head_dim",
    "Rotary.from_hf_config({'hidden_size': 2**40, 'num_attention_heads': 1, 'rope_theta': 1e4})": (
        "head_dim"
    ),
}


def test_absurd_channel_counts_are_refused_before_any_frequency() -> None:
    """Every entry point refuses with a ValueError naming the size, in one fresh
    interpreter with a time limit: a regression that computes the frequencies again
    fails the test instead of hanging the suite."""
    import json
    import subprocess
    import sys

    code = (
        "import json, torch\n"
        "from posenc.families.rotary.config import rope_spec\n"
        "from posenc.families.rotary.module import Rotary\n"
        "from posenc.families.rotary.multiaxis import AxialRotary, pixel_frequencies, xpos_scale\n"
        "from posenc.families.rotary.schedules import frequencies\n"
        f"for call in {list(ABSURD_CALLS)!r}:\n"
        "    try:\n"
        "        eval(call)\n"
        "        print(json.dumps([call, 'accepted', '']))\n"
        "    except Exception as exc:\n"
        "        print(json.dumps([call, type(exc).__name__, str(exc)]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [call for call, _, _ in results] == list(ABSURD_CALLS)
    for call, kind, message in results:
        named = ABSURD_CALLS[call]
        assert kind == "ValueError" and named in message and "65536" in message, (call, message)


def test_apply_rotary_names_the_shapes_that_do_not_broadcast() -> None:
    x = torch.randn(1, 2, 5, 16)
    for shape in [(7, 16), (3, 5, 16), (2, 1, 2, 5, 16)]:
        cos = torch.ones(shape)
        shown = str(shape).replace("(", r"\(").replace(")", r"\)")
        with pytest.raises(ValueError, match=rf"cos and sin of shape {shown} do not broadcast"):
            apply_rotary(x, cos, cos)
    # the shapes Rotary hands it still pass: (seq, r), (batch, 1, seq, r), (seq, 1, r)
    c = torch.ones(5, 16)
    for cos, target in [(c, x), (c[None, None], x), (c[:, None], x.transpose(1, 2))]:
        assert torch.equal(apply_rotary(target, cos, cos * 0), target)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8])
def test_small_int_positions_give_the_int64_results(dtype: torch.dtype) -> None:
    rope = Rotary(16)
    q, k = torch.randn(2, 2, 6, 16), torch.randn(2, 1, 6, 16)
    positions = torch.tensor([0, 3, 100, 127, 5, 9])
    small = positions.to(dtype)
    for got, want in zip(rope.cos_sin(small), rope.cos_sin(positions), strict=True):
        assert torch.equal(got, want)
    for shaped in (lambda p: p, lambda p: p[None].expand(2, -1)):
        got = rope(q, k, positions=shaped(small))
        for a, b in zip(got, rope(q, k, positions=shaped(positions)), strict=True):
            assert torch.equal(a, b)
    packed_q, packed_k = q[0].transpose(0, 1), k[0].transpose(0, 1)  # (6 tokens, heads, dim)
    cu = torch.tensor([0, 2, 6])
    got = rope(packed_q, packed_k, cu_seqlens=cu.to(dtype))
    for a, b in zip(got, rope(packed_q, packed_k, cu_seqlens=cu), strict=True):
        assert torch.equal(a, b)
    got = rope(q, k, offset=torch.tensor(7, dtype=dtype))
    for a, b in zip(got, rope(q, k, offset=7), strict=True):
        assert torch.equal(a, b)
