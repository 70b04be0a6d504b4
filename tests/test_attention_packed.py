"""Packed documents in posenc.attention: equal to attending to every document alone.

``cu_seqlens`` (flash-attn's varlen convention) or ``document_ids`` confine each
query to its own document; rotary positions and every bias restart with it.
In float64 (the blockwise path) packed and per-document results are the same
sums in another order; the float32 compiled loops are held to the error bounds
of tests/test_attention_backward.py, derived per document.
"""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

import posenc
from posenc.families.bias import FIRE, KERPLE, NoPE, Sandwich, T5Bias
from posenc.families.bias.modules import ALiBi
from posenc.integration.attention import kernel, softmax
from test_attention_backward import U, bounds, dense, table_block, weight_stats

BIASES = {
    "none": lambda h: None,
    "nope": lambda h: NoPE(h),
    "alibi": lambda h: ALiBi(h),
    "t5": lambda h: T5Bias(h),
    "kerple": lambda h: KERPLE(h),
    "sandwich": lambda h: Sandwich(h, dim=16),
    # past its threshold within the longer documents: the bias reads positions
    "fire": lambda h: FIRE(h, mlp_width=8, init_L=12.0),
}

# an empty document, one of one token, and documents across the compiled loop's
# blocks of 64 queries and 256 keys
CU = [0, 3, 3, 4, 90, 330, 345]


def _inputs(batch, total, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 4, total, 16, generator=gen, dtype=dtype)
    k = torch.randn(batch, 2, total, 16, generator=gen, dtype=dtype)
    v = torch.randn(batch, 2, total, 16, generator=gen, dtype=dtype)
    dout = torch.randn(batch, 4, total, 16, generator=gen, dtype=dtype)
    return q, k, v, dout


def _grads(out, inputs, bias, dout):
    params = [] if bias is None else [p for p in bias.parameters() if p.requires_grad]
    return torch.autograd.grad(out, [*inputs, *params], dout)


def _per_document(q, k, v, cu, **kw):
    """Each document attended alone, concatenated along the sequence."""
    pieces = [
        posenc.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], **kw)
        for a, b in itertools.pairwise(cu)
        if b > a
    ]
    return torch.cat(pieces, dim=2)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("bias_name", BIASES)
def test_packed_equals_each_document_alone_float64(bias_name, causal):
    # float64 takes the blockwise path: the same sums as per document, in another
    # order, with masked scores weighing exactly 0: a few hundred roundings of
    # 2**-53 relative to magnitudes of order 1, far below 1e-12
    torch.manual_seed(1)
    bias = BIASES[bias_name](4)
    bias = None if bias is None else bias.double()
    rotary = posenc.Rotary(16)
    q, k, v, dout = _inputs(2, CU[-1], seed=2)
    inputs = [t.requires_grad_(True) for t in (q, k, v)]
    kw = {"bias": bias, "rotary": rotary, "causal": causal}
    out = posenc.attention(*inputs, cu_seqlens=torch.tensor(CU), **kw)
    ref = _per_document(*inputs, CU, **kw)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, b in zip(_grads(out, inputs, bias, dout), _grads(ref, inputs, bias, dout), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("bias_name", ["none", "alibi", "t5", "kerple"])
def test_packed_kernel_within_the_bounds_of_each_document(bias_name, causal, monkeypatch):
    # float32 through the compiled loops (forward and backward), against each
    # document's dense float64 attention; the bounds of each document hold for the
    # packed call too: the other documents' keys weigh exactly 0 and the bounds
    # hold for any order of the sums
    monkeypatch.setattr(softmax, "backward_blockwise", _refuse)
    torch.manual_seed(3)
    bias = BIASES[bias_name](4)
    q, k, v, dout = _inputs(2, CU[-1], seed=4, dtype=torch.float32)
    inputs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = posenc.attention(*inputs, bias=bias, causal=causal, cu_seqlens=torch.tensor(CU))
    got = torch.autograd.grad(out, inputs, dout)
    bias64 = None if bias is None else bias.double()
    for a, b in itertools.pairwise(CU):
        if b == a:
            continue
        part = [t[:, :, a:b] for t in (q, k, v, dout)]
        exact = [t.double().requires_grad_(True) for t in part[:3]]
        mask = torch.ones(2, b - a, dtype=torch.bool)
        ref = dense(*exact, bias64, causal=causal, scale=0.25, mask=mask)
        want = torch.autograd.grad(ref, exact, part[3].double())
        tq, tk, tv, *_, tout = bounds(*part, bias, causal=causal, scale=0.25, mask=mask)
        assert bool(((out[:, :, a:b].double() - ref).abs() <= tout).all())
        for g, w, t in zip(got, want, (tq, tk, tv), strict=True):
            assert bool(((g[:, :, a:b].double() - w).abs() <= t).all())


def _refuse(*args, **kwargs):
    raise AssertionError("the blockwise backward ran")


# float32 with rotary (its positions restart per document), Sandwich's table, FIRE past
# its threshold (its linear pieces; the documents of 84 and 240 keys pass init_L = 12)
# and rotary with FIRE: (rotary, bias)
FLOAT32_CASES = {
    "rotary": (True, "none"),
    "sandwich": (False, "sandwich"),
    "fire": (False, "fire"),
    "rotary-fire": (True, "fire"),
}


def _ran(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} ran")

    return refuse


def _rotate64(x, base=10000.0):
    """x (..., n, d) rotated at positions 0 .. n - 1 in float64, written out here.

    HF's half layout: pair i is channels i and i + d / 2, turned by p * base ** (-2i / d).
    """
    n, d = x.shape[-2:]
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(n, dtype=torch.float64)[:, None] * omega
    c, s = torch.cos(angle), torch.sin(angle)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def _fire_error(bias, n):
    """A bound of FIRE's float32 bias (its pieces, on either path) over a document of n.

    x = psi(|rel|) * (1 / norm) is off by 7 U relative (seven roundings: c |rel| and c
    max(i, L), log1p of each, + eps, the reciprocal, table * scale; log1p passes its
    argument's relative error on at most as large): |slope| 7 U |x| in the bias. A knot
    rounded to float32 (U |knot|) may pick the neighbouring piece, whose line differs
    there by (|slope_a| + |slope_b|) U |x|; the slopes and intercepts rounded to float32
    (U each) and slope x + intercept rounded twice: 3 U |slope x| + 2 U |intercept|. In
    all 12 U (max|slope| max x + max|intercept|).
    """
    with torch.no_grad():
        form = bias.scaled_form(torch.arange(n), torch.arange(-(n - 1), n))
        size = form.slopes.abs().amax() * float(form.table.max() * form.scale.max())
        return 12 * U * float(size + form.intercepts.abs().amax())


def _document_bounds(q, k, v, dout, block, bias_error, *, causal, rotary):
    """Bounds of one document's float32 output, dq, dk and dv (q, k rotated in float64).

    ``bounds`` (tests/test_attention_backward.py) with the bias as ``block``, plus what
    rotating in float32 adds: cos and sin rounded once from exact (U each) and x_i c -
    x_j s rounded three times put a rotated element of the pair (x_i, x_j) within 3 U
    (|x_i c| + |x_j s|) <= 3 U |(x_i, x_j)|, a row within 3 sqrt(2) U |x|. A score then
    errs by 6 sqrt(2) U scale |q||k| more (added to the bias's error, both enter the
    score alike). dq is R^T dq' of the rotated query's gradient dq': R^T mixes each
    pair's errors (sqrt(2) of the larger), rounds as the rotation does (3 U |dq'| <= 3 U
    scale |k| A) and dq' multiplies dS by the float32-rotated keys (3 sqrt(2) U scale |k|
    A more); dk alike with colsum; dv is a sum of the weights, covered by the score's
    error. The added terms doubled for the second order, as ``bounds`` does.
    """
    n = q.shape[2]
    scale, mask = 0.25, torch.ones(q.shape[0], n, dtype=torch.bool)
    nq, nk = float(q.norm(dim=-1).max()), float(k.norm(dim=-1).max())
    if bias_error is None:
        bmax = 0.0 if block is None else float(block(torch.arange(n), torch.arange(n)).abs().max())
        bias_error = 8 * U * bmax
    if rotary:
        bias_error += 6 * math.sqrt(2) * U * scale * nq * nk
    tq, tk, tv, _, _, _, amax, tout = bounds(
        q, k, v, dout, None, causal=causal, scale=scale, mask=mask, block=block,
        bias_error=bias_error,
    )  # fmt: skip
    if rotary:
        colsum = weight_stats(q, k, v, dout, block, causal=causal, scale=scale, mask=mask)[0]
        extra = 2 * (3 * math.sqrt(2) + 3) * U * scale * amax
        tq = math.sqrt(2) * tq + extra * nk
        tk = math.sqrt(2) * tk + extra * nq * colsum
    return tout, tq, tk, tv


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("case", FLOAT32_CASES)
def test_packed_float32_within_the_bounds_of_each_document(
    case, causal, backend, monkeypatch, request
):
    # the packed float32 call (the compiled loops or torch's blockwise ops, forward and
    # backward) against each document alone in dense float64, rotated here, its bias
    # the float64 module's; the bounds of each document hold for the packed call: the
    # other documents' keys weigh exactly 0 and the bounds hold for any order of the
    # sums. The float64 reference's own errors are 2**-29 of the float32 ones: the
    # bounds' doubling covers them
    if backend == "kernel":
        request.getfixturevalue("compiled_kernels")  # without the build this one skips
    other = "blockwise" if backend == "kernel" else "kernel"
    # the other path's forward and backward: the compiled loop's or the blockwise ones
    engines = {
        "kernel": (kernel, "forward", "backward"),
        "blockwise": (softmax, "forward_blockwise", "backward_blockwise"),
    }
    module, *names = engines[other]
    for name in names:
        monkeypatch.setattr(module, name, _ran(name))
    rotated, bias_name = FLOAT32_CASES[case]
    torch.manual_seed(12)
    bias = BIASES[bias_name](4)
    rotary = posenc.Rotary(16, base=10000.0) if rotated else None
    q, k, v, dout = _inputs(2, CU[-1], seed=13, dtype=torch.float32)
    inputs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = posenc.attention(
        *inputs, bias=bias, rotary=rotary, causal=causal, cu_seqlens=torch.tensor(CU),
        backend=backend,
    )  # fmt: skip
    got = torch.autograd.grad(out, inputs, dout)
    bias64 = None if bias is None else copy.deepcopy(bias).double()
    for a, b in itertools.pairwise(CU):
        if b == a:
            continue
        n = b - a
        part = [t[:, :, a:b].double() for t in (q, k, v, dout)]
        exact = [t.clone().requires_grad_(True) for t in part[:3]]
        rq, rk = (_rotate64(t) if rotated else t for t in exact[:2])
        mask = torch.ones(2, n, dtype=torch.bool)
        ref = dense(rq, rk, exact[2], bias64, causal=causal, scale=0.25, mask=mask)
        want = torch.autograd.grad(ref, exact, part[3])
        if bias_name == "fire":
            fixed = bias64.bias(n, n).detach()
            block = lambda qp, kp, fixed=fixed: fixed[:, qp][:, :, kp]  # noqa: E731
            error = _fire_error(bias, n)
        else:
            block, error = table_block(bias, n, n), None
        tols = _document_bounds(
            rq.detach(), rk.detach(), *part[2:], block, error, causal=causal, rotary=rotated
        )
        for g, w, t in zip((out, *got), (ref, *want), tols, strict=True):
            err = (g[:, :, a:b].double() - w).abs()
            assert bool((err <= t).all()), f"document {a}:{b}: error {float(err.max()):.3g}"


@pytest.mark.usefixtures("compiled_kernels")
def test_packed_call_takes_the_compiled_loop(monkeypatch):
    seen = []
    forward = kernel.forward

    def spy(plan, params, q, k, v, *gate):
        result = forward(plan, params, q, k, v, *gate)
        seen.append((plan.mask.docs is not None, result is not None))
        return result

    monkeypatch.setattr(kernel, "forward", spy)
    q, k, v, _ = _inputs(1, CU[-1], seed=5, dtype=torch.float32)
    posenc.attention(q, k, v, bias=ALiBi(4), causal=True, cu_seqlens=torch.tensor(CU))
    assert seen == [(True, True)]


def test_document_ids_per_row_equal_each_document_alone():
    # rows packed differently; ids are any ints, a new document where they change
    torch.manual_seed(6)
    ids = torch.tensor([[7, 7, 7, 2, 2, 9, 9, 9, 9, 9], [1, 1, 1, 1, 1, 1, 4, 4, 5, 5]])
    q, k, v, dout = _inputs(2, 10, seed=7)
    for bias in (ALiBi(4).double(), FIRE(4, mlp_width=8, init_L=2.0).double()):
        inputs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        kw = {"bias": bias, "rotary": posenc.Rotary(16), "causal": True}
        out = posenc.attention(*inputs, document_ids=ids, **kw)
        got = _grads(out, inputs, bias, dout)
        for row, cu in ((0, [0, 3, 5, 10]), (1, [0, 6, 8, 10])):
            one = [t[row : row + 1] for t in inputs]
            ref = _per_document(*one, cu, **kw)
            torch.testing.assert_close(out[row : row + 1], ref, rtol=0, atol=1e-12)
            want = torch.autograd.grad(ref, one, dout[row : row + 1])
            for g, w in zip(got[:3], want, strict=True):
                torch.testing.assert_close(g[row : row + 1], w, rtol=1e-10, atol=1e-11)


def test_cu_seqlens_and_document_ids_agree():
    q, k, v, _ = _inputs(2, CU[-1], seed=8, dtype=torch.float32)
    ids = torch.repeat_interleave(torch.arange(len(CU) - 1), torch.tensor(CU).diff())
    kw = {"bias": T5Bias(4), "causal": True}
    a = posenc.attention(q, k, v, cu_seqlens=torch.tensor(CU, dtype=torch.int32), **kw)
    b = posenc.attention(q, k, v, document_ids=ids, **kw)
    assert torch.equal(a, b)


def test_a_document_of_padding_only_gets_zeros():
    q, k, v, _ = _inputs(1, 6, seed=9, dtype=torch.float32)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    out = posenc.attention(q, k, v, cu_seqlens=torch.tensor([0, 3, 6]), attention_mask=mask)
    assert out[:, :, 3:].eq(0).all() and out.isfinite().all()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cu_seqlens": torch.tensor([1, 3, 6])}, ValueError, "cu_seqlens"),
        ({"cu_seqlens": torch.tensor([0, 4, 3, 6])}, ValueError, "cu_seqlens"),
        ({"cu_seqlens": torch.tensor([0, 3, 5])}, ValueError, "cu_seqlens"),
        ({"cu_seqlens": torch.tensor([0.0, 3.0, 6.0])}, TypeError, "cu_seqlens"),
        ({"cu_seqlens": [0, 3, 6]}, TypeError, "cu_seqlens"),
        ({"document_ids": torch.zeros(6)}, TypeError, "document_ids"),
        ({"document_ids": torch.zeros(3, 6, dtype=torch.long)}, ValueError, "document_ids"),
        ({"document_ids": torch.zeros(5, dtype=torch.long)}, ValueError, "document_ids"),
        (
            {"cu_seqlens": torch.tensor([0, 6]), "document_ids": torch.zeros(6, dtype=torch.long)},
            ValueError,
            "not both",
        ),
    ],
)
def test_bad_packing_is_refused(kwargs, error, match):
    q, k, v, _ = _inputs(2, 6, seed=10, dtype=torch.float32)
    with pytest.raises(error, match=match):
        posenc.attention(q, k, v, **kwargs)


def test_packed_with_a_cache_of_keys():
    # queries bottom-right in the last document: its earlier keys are a cache
    q, k, v, _ = _inputs(1, 20, seed=11)
    cu = torch.tensor([0, 8, 20])
    kw = {"bias": ALiBi(4).double(), "rotary": posenc.Rotary(16), "causal": True}
    out = posenc.attention(q[:, :, -5:], k, v, cu_seqlens=cu, **kw)
    ref = posenc.attention(q[:, :, -5:], k[:, :, 8:], v[:, :, 8:], **kw)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert math.isfinite(float(out.abs().max()))
