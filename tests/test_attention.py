"""posenc.attention against softmax attention over the materialised bias, in float64.

Every backend (the compiled kernel, the blockwise torch path, compiled
FlexAttention for the forward) is compared with the dense formula for causal,
bidirectional, KV-cache, grouped-query and padded inputs, gradients included.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from conftest import unavailable
from posenc.faces.bench import peak_memory
from posenc.families.bias import FIRE, KERPLE, NoPE, Sandwich, T5Bias
from posenc.families.bias.modules import ALiBi
from posenc.integration.attention import kernel, layout, softmax

BIASES = {
    "none": lambda h: None,
    "alibi": lambda h: ALiBi(h),
    "alibi-symmetric": lambda h: ALiBi(h, symmetric=True),
    "alibi-falcon": lambda h: ALiBi(h, scale_with_logits=True),
    "t5": lambda h: T5Bias(h),
    "t5-decoder": lambda h: T5Bias(h, bidirectional=False, num_buckets=8, max_distance=20),
    "kerple-log": lambda h: KERPLE(h),
    "kerple-power": lambda h: KERPLE(h, kind="power"),
    "fire": lambda h: FIRE(h, init_L=16.0),
    "sandwich": lambda h: Sandwich(h, dim=16),
    "nope": lambda h: NoPE(h),
}

# (batch, heads, kv_heads, q_len, k_len, head_dim, v_dim): plain, a KV cache with
# grouped-query attention, lengths that leave partial blocks of the kernel (64
# queries, 256 keys, six-key and four-query tiles), a single decoding query
SHAPES = {
    "square": (2, 4, 4, 37, 37, 16, 16),
    "cache-gqa": (2, 4, 2, 5, 41, 16, 32),
    "partial-blocks": (1, 2, 1, 70, 300, 24, 48),
    "decode": (3, 2, 2, 1, 19, 8, 16),
}


def dense(q, k, v, bias, *, causal, scale, mask=None):
    """softmax(q k^T scale + bias + mask) v in float64, the bias materialised."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, lq, _ = q.shape
    hk, lk = k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    s = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        dense_bias = bias.bias(lq, lk).double()
        s = s + (dense_bias * scale if bias.scale_with_logits else dense_bias)
    allowed = torch.ones(b, 1, lq, lk, dtype=torch.bool)
    if causal:
        allowed &= torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + lk - lq
    if mask is not None:
        allowed &= mask[:, None, None, :].bool()
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0)
    return p @ v


def tolerance(q, k, v, bias, scale, eps=2.0**-24):
    """A bound on |float32 attention - exact| derived from the float32 roundings.

    ``eps`` is the unit roundoff: 2**-24 for float32, 2**-53 for float64.

    A score is a dot product of head_dim terms (relative error head_dim * 2**-24
    of sum |q_d k_d| <= |q| |k|) plus a bias rounded once (2**-24 of its size)
    and scaled: its absolute error is delta. Softmax weights then move by at most
    2 delta relative (plus 2 ulps of exp), the weighted sum of values by the
    rounding of k_len + 16 terms of at most max|v|.
    """
    d = q.shape[-1]
    qn = q.double().norm(dim=-1).max()
    kn = k.double().norm(dim=-1).max()
    delta = d * eps * qn * kn * scale
    if bias is not None:
        lq, lk = q.shape[2], k.shape[2]
        delta = delta + 2 * eps * bias.bias(lq, lk).detach().double().abs().max()
    vmax = v.double().abs().max()
    return float(vmax * (2 * delta + 4 * eps + (k.shape[2] + 16) * eps) * 2)


def inputs(shape, seed=0, grad=False):
    b, h, hk, lq, lk, d, dv = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=gen)
    k = torch.randn(b, hk, lk, d, generator=gen)
    v = torch.randn(b, hk, lk, dv, generator=gen)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def padding(b, lk):
    mask = torch.ones(b, lk, dtype=torch.bool)
    mask[-1, : lk // 3] = False  # the last sequence is left-padded
    return mask


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("bias_name", BIASES)
def test_forward_equals_dense(bias_name, causal, shape, backend):
    torch.manual_seed(3)
    bias = BIASES[bias_name](shape[1])
    q, k, v = inputs(shape)
    mask = padding(shape[0], shape[4])
    scale = 1 / math.sqrt(shape[5])
    with torch.no_grad():
        got = posenc.attention(
            q, k, v, bias=bias, causal=causal, attention_mask=mask, backend=backend
        )
        want = dense(q, k, v, bias, causal=causal, scale=scale, mask=mask)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert (got.double() - want).abs().max() <= tolerance(q, k, v, bias, scale)


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
@pytest.mark.parametrize("shape", ["square", "cache-gqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("bias_name", BIASES)
def test_gradients_equal_dense(bias_name, causal, shape, backend):
    torch.manual_seed(4)
    bias = BIASES[bias_name](SHAPES[shape][1])
    q, k, v = inputs(SHAPES[shape], grad=True)
    mask = padding(q.shape[0], k.shape[2])
    scale = 1 / math.sqrt(q.shape[-1])
    out = posenc.attention(q, k, v, bias=bias, causal=causal, attention_mask=mask, backend=backend)
    ref = dense(q, k, v, bias, causal=causal, scale=scale, mask=mask)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    params = [q, k, v] + ([p for p in bias.parameters() if p.requires_grad] if bias else [])
    got = torch.autograd.grad(out, params, g)
    want = torch.autograd.grad(ref, params, g.double())
    for a, b in zip(got, want, strict=True):
        # a gradient sums k_len (or more, for shared bias parameters) products of
        # quantities each within a few float32 roundings: relative to the largest
        # term, (terms + 64) * 2**-24 * 16
        terms = q.shape[2] * k.shape[2] * q.shape[1] * q.shape[0]
        scale_b = float(b.abs().max()) + 1.0
        assert (a.double() - b).abs().max() <= 16 * (terms + 64) * 2.0**-24 * scale_b


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
def test_rotary_and_bias_together(backend):
    torch.manual_seed(6)
    rope = posenc.Rotary(16)
    bias = ALiBi(4)
    q, k, v = inputs(SHAPES["cache-gqa"])
    with torch.no_grad():
        got = posenc.attention(q, k, v, bias=bias, rotary=rope, causal=True, backend=backend)
        lq, lk = q.shape[2], k.shape[2]
        c, s = rope.cos_sin(torch.arange(lk))
        qr = posenc.apply_rotary(q, c[lk - lq :], s[lk - lq :])
        kr = posenc.apply_rotary(k, c, s)
        want = dense(qr, kr, v, bias, causal=True, scale=0.25)
    assert (got.double() - want).abs().max() <= tolerance(qr, kr, v, bias, 0.25)


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
def test_query_that_sees_no_key_gives_zeros(backend):
    q, k, v = inputs((2, 2, 2, 3, 6, 8, 16), grad=True)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False  # the second sequence is all padding
    out = posenc.attention(q, k, v, bias=ALiBi(2), attention_mask=mask, backend=backend)
    assert torch.isfinite(out).all() and out[1].eq(0).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and q.grad[1].eq(0).all()


def test_padded_keys_do_not_leak():
    # whatever a padded key holds, the output is the same
    q, k, v = inputs(SHAPES["square"])
    mask = padding(2, 37)
    bias = T5Bias(4)
    with torch.no_grad():
        a = posenc.attention(q, k, v, bias=bias, attention_mask=mask)
        k2, v2 = k.clone(), v.clone()
        k2[~mask[:, None, :].expand(-1, 4, -1)] = 1e4
        v2[~mask[:, None, :].expand(-1, 4, -1)] = -1e4
        b = posenc.attention(q, k2, v2, bias=bias, attention_mask=mask)
    assert torch.equal(a, b)


def test_kernel_and_blockwise_agree_and_kernel_runs(compiled_kernels):
    assert hasattr(compiled_kernels, "attend")
    q, k, v = inputs(SHAPES["partial-blocks"])
    plan = softmax.Plan(layout.Mask(True, None, k.shape[2] - q.shape[2]), 0.2)
    result = kernel.forward(plan, (), q, k, v)
    assert result is not None  # this machine has AVX-512: the kernel took it
    out, lse = result
    ref_out, ref_lse = softmax.forward_blockwise(plan, (), q, k, v)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_low_precision_inputs_computed_in_float32():
    q, k, v = (t.bfloat16() for t in inputs(SHAPES["square"]))
    out = posenc.attention(q, k, v, bias=ALiBi(4), causal=True)
    want = dense(q, k, v, ALiBi(4), causal=True, scale=0.25)
    assert out.dtype == torch.bfloat16
    # one bfloat16 rounding of the result (2**-8 relative) beyond float32 attention
    assert (out.double() - want).abs().max() <= 2.0**-8 * want.abs().max() + 1e-5


def test_bias_parameters_train():
    torch.manual_seed(7)
    for bias in (T5Bias(2), KERPLE(2), KERPLE(2, kind="power"), FIRE(2, init_L=4.0)):
        q, k, v = inputs((1, 2, 2, 9, 9, 8, 8), grad=True)
        out = posenc.attention(q, k, v, bias=bias, causal=True)
        out.square().sum().backward()
        for p in bias.parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all()
            assert p.grad.abs().sum() > 0


def test_no_quadratic_memory():
    # doubling the length doubles what a call adds (inputs, output, gradients) and
    # leaves the per-block scratch as it is; materialised scores would quadruple
    # (4 heads x 4096 x 4096 float32 scores alone would be 256 MiB)
    def step(length: int, train: bool) -> int | None:
        q, k, v = inputs((1, 4, 4, length, length, 32, 32), grad=train)
        bias = T5Bias(4)

        def call() -> object:
            if not train:
                with torch.no_grad():
                    return posenc.attention(q, k, v, bias=bias, causal=True)
            posenc.attention(q, k, v, bias=bias, causal=True).sum().backward()
            return None

        return peak_memory(call)

    for train in (False, True):
        small, large = step(2048, train), step(4096, train)
        if small is None or large is None:
            unavailable(
                "no peak-memory counter on this platform (/proc/self/clear_refs and "
                "malloc_trim on Linux)",
                provided_by="CI runs on Linux",
            )
        assert large < 3 * small, f"train={train}: {small / 2**20:.0f} -> {large / 2**20:.0f} MiB"
        assert large < 128 << 20


def test_flex_backend_forward_equals_dense():
    # compiled FlexAttention on the CPU (inference only): one compile per bias kind
    q, k, v = inputs((2, 4, 2, 16, 24, 16, 16))
    mask = padding(2, 24)
    for bias in (ALiBi(4), FIRE(4)):
        with torch.no_grad():
            got = posenc.attention(q, k, v, bias=bias, causal=True, attention_mask=mask,
                                   backend="flex")  # fmt: skip
            want = dense(q, k, v, bias, causal=True, scale=0.25, mask=mask)
        assert (got.double() - want).abs().max() <= tolerance(q, k, v, bias, 0.25)


# dynamo reads .grad of the non-leaf tensors it hands to the frame after a graph break
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_inside_torch_compile_on_cpu():
    # the CPU kernel runs behind a graph break; gradients as in eager mode
    bias = T5Bias(4)
    q, k, v = inputs(SHAPES["cache-gqa"], grad=True)

    def layer(q, k, v):
        return posenc.attention(q * 2, k, v, bias=bias, causal=True).relu()

    compiled = torch.compile(layer)
    a = compiled(q, k, v)
    (ga,) = torch.autograd.grad(a.sum(), [bias.relative_attention_bias.weight])
    b = layer(q, k, v)
    (gb,) = torch.autograd.grad(b.sum(), [bias.relative_attention_bias.weight])
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("kind", ["cope", "dape"])
def test_terms_that_read_the_scores_inside_torch_compile(kind, monkeypatch):
    """Their loops run behind the graph break too, gradients as in eager mode; deciding
    that the loop runs never calls into it (under tracing it would get fake addresses)."""
    from posenc.integration.attention import checkpointed

    def refuse(*args, **kwargs):
        raise AssertionError("the checkpointed path ran: the compiled loop was expected")

    monkeypatch.setattr(checkpointed, "attend", refuse)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 40, 16, requires_grad=True) for _ in range(3))
    if kind == "cope":
        term = posenc.CoPE(16, npos_max=9)
        with torch.no_grad():
            term.pos_emb.normal_()
        given = {"cope": term}
    else:
        term = posenc.DAPE(ALiBi(4))
        given = {"bias": term}
    params = list(term.parameters())

    def layer(q, k, v):
        return posenc.attention(q * 2, k, v, causal=True, **given).relu()

    torch._dynamo.reset()
    a = torch.compile(layer)(q, k, v)
    ga = torch.autograd.grad(a.sum(), [q, k, v, *params])
    b = layer(q, k, v)
    gb = torch.autograd.grad(b.sum(), [q, k, v, *params])
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # the forward is deterministic
    # the backward sums dk, dv and the parameters' gradients per thread, in the order the
    # threads take their units: equal to float32 rounding of sums over 40 keys from run
    # to run (40 u ~ 2.4e-6 of the terms' magnitudes), not bit for bit
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ bad input


def test_errors_name_the_problem():
    q, k, v = inputs(SHAPES["cache-gqa"])
    cases = [
        (lambda: posenc.attention(q, k, v, bias=ALiBi(3)), ValueError, "heads"),
        (lambda: posenc.attention(q, k[:1], v[:1]), ValueError, "batch"),
        (lambda: posenc.attention(q, k[..., :8], v), ValueError, "head_dim"),
        (lambda: posenc.attention(q, k, v[:, :, :5]), ValueError, "same heads and length"),
        (lambda: posenc.attention(q[:, :3], k, v), ValueError, "multiple"),
        (
            lambda: posenc.attention(q.new_zeros(2, 4, 50, 16), k, v, causal=True),
            ValueError,
            "q_len <= k_len",
        ),
        (lambda: posenc.attention(q, k, v, backend="cuda"), ValueError, "backend"),
        (lambda: posenc.attention(q, k, v, scale=0.0), ValueError, "scale"),
        (lambda: posenc.attention(q, k, v, attention_mask=torch.ones(2, 5)), TypeError, "mask"),
        (
            lambda: posenc.attention(q, k, v, attention_mask=torch.ones(2, 5, dtype=torch.bool)),
            ValueError,
            "attention_mask",
        ),
        (lambda: posenc.attention(q, k.double(), v), TypeError, "dtype"),
        (lambda: posenc.attention(q, k, v, bias="alibi"), TypeError, "bias"),
        (lambda: posenc.attention(q[0], k, v), ValueError, "batch, heads"),
        (lambda: posenc.attention(q, k, v, rotary=posenc.Rotary(8)), ValueError, "head_dim"),
        (lambda: posenc.attention(q, k, v, causal=1), TypeError, "causal"),
    ]
    for call, error, words in cases:
        with pytest.raises(error, match=words):
            call()


# ------------------------------------------------------------------ float64 end to end


LEARNED = {
    "t5": lambda: T5Bias(2),
    "t5-decoder": lambda: T5Bias(2, bidirectional=False, num_buckets=8, max_distance=20),
    "kerple-log": lambda: KERPLE(2),
    "kerple-power": lambda: KERPLE(2, kind="power"),
    "fire": lambda: FIRE(2, mlp_width=4, init_L=4.0),  # few parameters: a small Jacobian
}


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
@pytest.mark.parametrize("bias_name", LEARNED)
def test_float64_keeps_learned_biases_float64(bias_name, backend):
    # a float32 table of float64 parameters would be off by 2**-24 relative: 1e-8
    torch.manual_seed(8)
    bias = LEARNED[bias_name]().double()
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, n, 4, generator=gen, dtype=torch.float64) for n in (3, 6, 6))
    with torch.no_grad():
        got = posenc.attention(q, k, v, bias=bias, causal=True, backend=backend)
        want = dense(q, k, v, bias, causal=True, scale=0.5)
    assert got.dtype == torch.float64
    assert (got - want).abs().max() <= tolerance(q, k, v, bias, 0.5, eps=2.0**-53)
    params = tuple(bias.parameters())
    # gradcheck perturbs the parameters in place: the module reads them
    assert torch.autograd.gradcheck(
        lambda *_: posenc.attention(q, k, v, bias=bias, causal=True, backend=backend), params
    )


# ------------------------------------------------------------------ NaN and inf


def _sdpa_math(q, k, v, causal):
    # torch's CPU flash kernel turns a NaN query row into a finite one; the math
    # backend is softmax as written
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _non_finite(t):
    return t.isnan(), t.isposinf(), t.isneginf()


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    ("tensor", "causal"),
    [("q", False), ("q", True), ("k", False), ("k", True), ("v", False)],
)
def test_non_finite_inputs_propagate_as_in_softmax(tensor, causal, value):
    # partial blocks of queries and keys, grouped-query heads. A NaN or +inf score
    # (inf - inf in the softmax) makes its query's row NaN, never 0; an infinite
    # value makes its column infinite in the rows that weigh it
    shape = (1, 2, 1, 70, 70, 24, 48)
    q, k, v = inputs(shape)
    target = {"q": q, "k": k, "v": v}[tensor]
    target[0, 0, 40, 3] = value
    plan = softmax.Plan(layout.Mask(causal, None, 0), 0.25)
    result = kernel.forward(plan, (), q, k, v)
    assert result is not None  # the kernel ran
    out, lse = result
    ref_out, ref_lse = softmax.forward_blockwise(plan, (), q, k, v)
    marks = _non_finite(out)
    assert any(m.any() for m in marks)
    for got, want in zip(marks, _non_finite(ref_out), strict=True):
        assert torch.equal(got, want)
    if not causal:
        # SDPA's math backend (its CPU flash kernel hides a NaN query row; its
        # causal mask adds -inf, which turns a masked +inf score into NaN)
        for got, want in zip(marks, _non_finite(_sdpa_math(q, k, v, causal)), strict=True):
            assert torch.equal(got, want)
    if tensor != "v":
        rows = out.isnan().any(-1)
        assert rows.any() and torch.equal(out.isnan(), rows[..., None].expand_as(out))
    # logsumexp takes a +inf score's row to +inf, the kernel to NaN: neither finite
    assert torch.equal(torch.isfinite(lse), torch.isfinite(ref_lse))
    finite = torch.isfinite(out)
    torch.testing.assert_close(out[finite], ref_out[finite], rtol=1e-5, atol=1e-5)
    for backend in ("kernel", "blockwise"):
        got_out = posenc.attention(q, k, v, causal=causal, scale=0.25, backend=backend)
        assert torch.equal(got_out.isnan(), out.isnan())


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
def test_query_that_sees_no_key_gives_zeros_even_with_nan(backend):
    q, k, v = inputs((2, 2, 2, 3, 6, 8, 16))
    q[:, :, 1] = math.nan
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False  # the second sequence sees no key: its NaN query has no score at all
    out = posenc.attention(q, k, v, attention_mask=mask, backend=backend)
    assert out[1].eq(0).all()
    assert out[0, :, 1].isnan().all() and torch.isfinite(out[0, :, [0, 2]]).all()


# ------------------------------------------------------------------ empty inputs

EMPTY = {
    "batch-0": ((0, 2, 5, 16), (0, 2, 7, 16), (0, 2, 7, 16)),
    "heads-0": ((1, 0, 5, 16), (1, 1, 7, 16), (1, 1, 7, 16)),
    "v_dim-0": ((1, 2, 5, 16), (1, 2, 7, 16), (1, 2, 7, 0)),
}


@pytest.mark.parametrize("backend", ["auto", "kernel", "blockwise", "flex"])
@pytest.mark.parametrize("shapes", EMPTY.values(), ids=EMPTY.keys())
def test_empty_inputs_give_the_empty_result_on_every_backend(shapes, backend):
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(s, generator=gen).requires_grad_(True) for s in shapes)
    bias = T5Bias(2) if q.shape[1] == 2 else None
    mask = torch.ones(q.shape[0], k.shape[2], dtype=torch.bool)
    out = posenc.attention(q, k, v, bias=bias, causal=True, attention_mask=mask, backend=backend)
    assert out.shape == (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    assert out.dtype == torch.float32
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.eq(0).all()


@pytest.mark.parametrize("backend", ["auto", "kernel", "blockwise", "flex"])
def test_head_dim_zero_is_refused(backend):
    q, k, v = torch.randn(1, 2, 5, 0), torch.randn(1, 2, 7, 0), torch.randn(1, 2, 7, 16)
    for scale in (None, 1.0):
        with pytest.raises(ValueError, match="head_dim"):
            posenc.attention(q, k, v, scale=scale, backend=backend)
