"""Packed documents in posenc.attention: equal to attending to every document alone.

``cu_seqlens`` (flash-attn's varlen convention) or ``document_ids`` confine each
query to its own document; rotary positions and every bias restart with it.
In float64 (the blockwise path) packed and per-document results are the same
sums in another order; the float32 compiled loops are held to the error bounds
of tests/test_attention_backward.py, derived per document. Rows packed differently
(``document_ids`` per row) go through every backend, FlexAttention included, with a bias
in each of its forms as a score term (a table, FIRE's pieces, per score).
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
from posenc.integration.attention import flex as flex_engine
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


# ---------------------------------------------- rows packed differently, every backend

# two rows of 24 keys packed differently: ids are any ints, a new document wherever they
# change (row 0's 7 comes back as a third document), one of one token; documents of up to
# 12 tokens, so that FIRE's positions within them pass init_L = 2
ROWS = torch.tensor([[7] * 5 + [2] * 3 + [7] * 9 + [3] * 7, [1] * 11 + [4] + [5] * 12])
# the same documents in every row: (k_len,) ids
SHARED = torch.tensor([0] * 6 + [1] * 2 + [2] * 10 + [3] * 6)

# each form of a bias as a score term (AttentionBias.score_form): the bias, the documents
# and the operand its TermForm must have (None: per score, the module evaluated per block
# and, on FlexAttention, per score at each row's positions)
FORMS = {
    # a bias of key - query: a table, whatever the documents
    "table": (lambda: T5Bias(4), ROWS, "table"),
    # FIRE past its threshold with the same documents in every row: its linear pieces
    "pieces": (lambda: FIRE(4, mlp_width=8, init_L=2.0), SHARED, "pieces"),
    # FIRE past its threshold with rows of different documents: per score
    "per-score": (lambda: FIRE(4, mlp_width=8, init_L=2.0), ROWS, None),
}

# backend and dtype: the compiled loops read float32 only; FlexAttention forward only (torch
# refuses its backward on CPU: test_attention_backward.test_flex_backward_is_refused_on_cpu)
RUNS = {
    "kernel": ("kernel", torch.float32),
    "blockwise": ("blockwise", torch.float64),
    "flex": ("flex", torch.float64),
}

# (causal, q_len) of 24 keys; the cache's 13 queries are the last keys, across a boundary in
# each row (row 1's document of one token among them), the first documents' keys all cache
LAYOUTS = {"causal": (True, 24), "bidirectional": (False, 24), "causal-cache": (True, 13)}

# float64 rounds by 2**-53, float32 by U = 2**-24: every bound below is linear in the unit
# roundoff (first order, each doubled for the second), so float64's are 2**-29 of float32's
UNIT = {torch.float32: 1.0, torch.float64: 2.0**-29}


def _documents(ids):
    """Each position's document (numbered along its row) and position within it."""
    new = torch.ones_like(ids, dtype=torch.bool)
    new[:, 1:] = ids[:, 1:] != ids[:, :-1]
    at = torch.arange(ids.shape[1]).expand_as(ids)
    start = torch.where(new, at, 0).cummax(1).values
    return new.cumsum(1), at - start


def _dense_rows(q, k, v, bias, ids, *, causal, scale=0.25):
    """softmax(q k^T scale + bias + mask) v in float64, everything materialised: each query
    sees the keys of its row's document, the bias (the module itself) at positions
    within documents."""
    b, h, lq, _ = q.shape
    hk, lk = k.shape[1], k.shape[2]
    doc, pos = _documents(ids.expand(b, lk))
    keys = torch.arange(lk)
    queries = keys[lk - lq :]
    allowed = doc[:, queries, None] == doc[:, None, :]
    if causal:
        allowed = allowed & (keys[None, :] <= queries[:, None])
    k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    s = q @ k.transpose(-1, -2) * scale + bias(pos[:, queries, None], pos[:, None, :]).movedim(0, 1)
    # every query sees a key (itself): no row without one
    return torch.softmax(s.masked_fill(~allowed[:, None], -math.inf), -1) @ v


def _fire_module_error(bias, n):
    """A bound of FIRE's float32 bias evaluated as its module (the MLP per block, or unit
    by unit per score on FlexAttention) at positions within a document of n.

    x = psi(|i - j|) / norm(i) is off by 7 U relative (see ``_fire_error``); a first unit
    w1 x + b1 then by 7 U |w1 x| + U |w1 x| + U |w1 x + b1| <= 9 U (|w1 x| + |b1|) (ReLU
    passes it on at most as large); the output b2 + sum_u w2_u relu_u, width products and
    width + 1 terms summed in any order, by sum_u |w2_u| 9 U (|w1_u x| + |b1_u|) + (width
    + 2) U (sum_u |w2_u| relu_u + |b2|). In all (width + 11) U max_h (sum_u |w2_hu| (|w1_u|
    X + |b1_u|) + |b2_h|), X the largest x (in float64).
    """
    with torch.no_grad():
        exact = copy.deepcopy(bias).double()
        pos = torch.arange(n)
        x = float(exact._normalised(pos[:, None], pos[None, :]).max())
        first, last = exact.mlp[0], exact.mlp[2]
        units = first.weight[:, 0].abs() * x + first.bias.abs()
        size = float((last.weight.abs() @ units + last.bias.abs()).max())
        return (first.out_features + 11) * U * size


def _row_bounds(q, k, v, dout, bias64, ids, bias_error, *, causal):
    """Per-element float32 bounds of out, dq, dk and dv: each document of each row alone.

    ``bounds`` (tests/test_attention_backward.py) per document, with the module's float64
    bias at positions within it: the other documents' keys weigh exactly 0 and the bounds
    hold for any order of the sums. Keys of a document no query is in get bound 0: their
    dk and dv must be exactly 0.
    """
    b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
    offset = lk - lq
    tols = [torch.zeros((*t.shape[:3], 1), dtype=torch.float64) for t in (dout, q, k, v)]
    doc, _ = _documents(ids.expand(b, lk))
    for r in range(b):
        edges = [0, *(torch.nonzero(doc[r].diff()).flatten() + 1).tolist(), lk]
        for a, e in itertools.pairwise(edges):
            first = max(a, offset)  # the document's first query (its queries are its last keys)
            if e <= first:
                continue
            local = torch.arange(e - a)
            fixed = bias64(local[:, None], local[None, :]).detach()
            queries, keys = slice(first - offset, e - offset), slice(a, e)
            part = [q[r : r + 1, :, queries], k[r : r + 1, :, keys], v[r : r + 1, :, keys]]
            tq, tk, tv, *_, tout = bounds(
                *part, dout[r : r + 1, :, queries], None, causal=causal, scale=0.25,
                mask=torch.ones(1, e - a, dtype=torch.bool), bias_error=bias_error,
                block=lambda qp, kp, fixed=fixed: fixed[:, qp][:, :, kp],
            )  # fmt: skip
            at = (queries, queries, keys, keys)
            for t, where, bound in zip(tols, at, (tout, tq, tk, tv), strict=True):
                t[r, :, where] = bound
    return tols


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("form", FORMS)
def test_rows_packed_differently_on_every_backend(form, run, layout, monkeypatch, request):
    # document_ids of rows packed differently (or, for FIRE's pieces, the same in every
    # row) through one backend, its bias in the form named, against (a) the blockwise path
    # in float64 and (b) the dense float64 formula of _dense_rows: the output and, but on
    # FlexAttention (forward only on CPU), dq, dk and dv.
    # Tolerances: each result, the tested one and both float64 references, is within the
    # per-document bounds of _row_bounds (float32 ones, 2**-29 of them in float64) of the
    # exact attention, so within the sum of two of them of each other. The bias's own
    # error: T5's table 8 U |bias| (``bounds``' default; its values are the weights,
    # exact); FIRE's pieces (_fire_error) or its module (_fire_module_error), their sum,
    # which bounds the tested path and the references alike (the float64 blockwise path
    # takes the pieces where the tested one does, the dense formula the module)
    backend, dtype = RUNS[run]
    causal, lq = LAYOUTS[layout]
    make, ids, operand = FORMS[form]
    if backend == "kernel":
        request.getfixturevalue("compiled_kernels")  # without the build this one skips
    torch.manual_seed(14)
    bias = make()
    bias64 = copy.deepcopy(bias).double()
    q, k, v, dout = _inputs(2, 24, seed=15, dtype=torch.float32)
    q, dout = q[:, :, -lq:], dout[:, :, -lq:]
    grads = backend != "flex"
    inputs = [t.to(dtype, copy=True).requires_grad_(grads) for t in (q, k, v)]
    tested = bias if dtype == torch.float32 else copy.deepcopy(bias64)
    forms, engines = [], []
    own = tested.score_form

    def spy_form(ctx):
        found = own(ctx)
        forms.append(found.operand)
        return found

    tested.score_form = spy_form
    with monkeypatch.context() as m:
        # the engine named, and only it, makes the result (and its gradients)
        if backend == "kernel":
            forward = kernel.forward

            def spy(plan, params, *args):
                result = forward(plan, params, *args)
                engines.append("kernel" if result is not None else "declined")
                return result

            m.setattr(kernel, "forward", spy)
            if operand is not None:  # the compiled loops read tables and pieces
                for name in ("forward_blockwise", "backward_blockwise"):
                    m.setattr(softmax, name, _ran(name))
        else:
            for name in ("forward", "backward"):
                m.setattr(kernel, name, _ran(f"kernel.{name}"))
        if backend == "flex":
            m.setattr(softmax, "forward_blockwise", _ran("forward_blockwise"))
            # eager FlexAttention (no compile: seconds, not minutes), its block mask made
            # here (not one a test before left in the cache)
            m.setattr(flex_engine, "BLOCK_MASKS", flex_engine.BlockMasks(1))
            m.setattr(flex_engine, "compiled", lambda fn: engines.append(fn.__name__) or fn)
        with torch.set_grad_enabled(grads):
            out = posenc.attention(
                *inputs, bias=tested, document_ids=ids, causal=causal, backend=backend
            )
            got = [out, *torch.autograd.grad(out, inputs, dout.to(dtype))] if grads else [out]
    assert forms == [operand]
    want_engines = {
        "kernel": ["kernel" if operand is not None else "declined"],
        "blockwise": [],
        "flex": ["create_block_mask", "flex_attention"],
    }
    assert engines == want_engines[backend]

    exact = [t.double().requires_grad_(True) for t in (q, k, v)]
    blockwise = posenc.attention(
        *exact, bias=bias64, document_ids=ids, causal=causal, backend="blockwise"
    )
    formula = _dense_rows(*exact, bias64, ids, causal=causal)
    refs = [[ref, *torch.autograd.grad(ref, exact, dout.double())] for ref in (blockwise, formula)]
    error = None
    if form != "table":
        error = _fire_error(bias, 24) + _fire_module_error(bias, 24)
    tols = _row_bounds(*(t.double() for t in (q, k, v, dout)), bias64, ids, error, causal=causal)
    n = len(got)  # FlexAttention: the output alone
    names = ("out", "dq", "dk", "dv")[:n]
    for name, g, t, *want in zip(names, got, tols[:n], *(r[:n] for r in refs), strict=True):
        bound = t * (UNIT[dtype] + UNIT[torch.float64])
        for which, w in zip(("blockwise", "dense"), want, strict=True):
            err = (g.detach().double() - w.detach()).abs()
            over = (err / bound).masked_fill(err == 0, 0.0)
            assert bool((err <= bound).all()), (
                f"{name} vs {which}: error {float(err.max()):.3g} (row "
                f"{int(err.flatten(1).amax(1).argmax())}), {float(over.max()):.3g} x its bound"
            )
