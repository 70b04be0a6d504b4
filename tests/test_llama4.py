"""Llama 4's pieces: chunked attention, the NoPE layers' temperature, and ``posenc rope``'s
report of hybrid models (Llama 4, SmolLM3, Cohere 2).

Chunked attention (HF ``create_chunked_causal_mask``): a query at position ``p`` sees the
keys ``j`` with ``j // C == p // C`` (and ``j <= p``), while rotary positions and biases
stay global. Checked against a dense float64 masked attention written here, against the
mask of transformers' own ``chunked_causal_mask_function``, and, in float32 on the
compiled loops, against each chunk attended alone within the error bounds of
tests/test_attention_backward.py. The temperature against HF's formula and against the
queries ``Llama4TextAttention`` itself scales.
"""

from __future__ import annotations

import copy
import itertools
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from conftest import anchor, one_thread
from posenc.faces import rope as rope_cli
from posenc.families.bias import T5Bias
from posenc.families.bias.modules import ALiBi
from posenc.integration.analysis import rope_reading
from posenc.integration.attention import kernel, softmax
from test_attention_backward import bounds, dense

# --------------------------------------------------------------------------------------
# Chunked attention.


def _rotate64(x, positions, base=10000.0, tables=torch.float64):
    """x (..., n, d) rotated at ``positions`` (n,) in float64: HF's half layout, written out,
    cos and sin rounded to ``tables``."""
    d = x.shape[-1]
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[:, None] * omega
    c, s = (t.to(tables).double() for t in (torch.cos(angle), torch.sin(angle)))
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def _chunk_mask(q_len, k_len, chunk, causal, local=None):
    """(q_len, k_len) True where query i (at key position i + k_len - q_len) sees key j:
    the same chunk of ``local`` positions (key positions by default)."""
    where = torch.arange(k_len) if local is None else local
    keys = torch.arange(k_len)
    queries = keys[k_len - q_len :]
    same = (where[None, :] // chunk) == (where[queries][:, None] // chunk)
    return same & (keys[None, :] <= queries[:, None]) if causal else same


def _dense_chunked(q, k, v, *, chunk, causal, bias=None, rotary=False, mask=None, scale=0.25):
    """softmax(q k^T scale + bias, masked to the chunks and padding) v in float64, with
    q and k rotated at their global positions when ``rotary``."""
    h, lq = q.shape[1:3]
    lk = k.shape[2]
    q, k, v = q.double(), k.double(), v.double()
    if rotary:
        # posenc.attention rotates with the Rotary's cos and sin tables, float32 (exact
        # angles rounded once): the reference rounds them alike
        tables = torch.float32
        q = _rotate64(q, torch.arange(lk - lq, lk), tables=tables)
        k = _rotate64(k, torch.arange(lk), tables=tables)
    k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
    s = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        s = s + bias.bias(lq, lk)
    allowed = _chunk_mask(lq, lk, chunk, causal)[None, None]
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0)
    return p @ v


def _inputs(b, h, hk, lq, lk, d, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=gen, dtype=dtype)
    k = torch.randn(b, hk, lk, d, generator=gen, dtype=dtype)
    v = torch.randn(b, hk, lk, d, generator=gen, dtype=dtype)
    dout = torch.randn(b, h, lq, d, generator=gen, dtype=dtype)
    return q, k, v, dout


# (q_len, k_len, chunk): several chunks and a partial last one, a chunk of 1, one larger
# than the keys, a KV cache whose queries start mid-chunk, and a decode step (the compiled
# loops' blocks are crossed in the float32 test below)
SHAPES = {
    "full": (150, 150, 40),
    "chunk-1": (9, 9, 1),
    "one-chunk": (20, 20, 64),
    "cache": (37, 150, 64),
    "decode": (1, 130, 64),
}
BIASES = {
    "none": lambda: None,
    "alibi": lambda: ALiBi(4).double(),
    "t5": lambda: T5Bias(4).double(),
}


@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rotary"])
@pytest.mark.parametrize("bias_name", BIASES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("shape", SHAPES)
def test_chunked_equals_dense_float64(shape, causal, bias_name, rotary):
    # float64, blockwise: the same sums as the dense reference in another order, the
    # masked scores weighing exactly 0; magnitudes of order 1 (q, k, v standard normal,
    # scale 0.25, head_dim 16) and a few hundred terms: a few hundred roundings of 2**-53,
    # far below 1e-12. Padding in the second row; rotary at the global positions
    lq, lk, chunk = SHAPES[shape]
    torch.manual_seed(0)
    bias = BIASES[bias_name]()
    q, k, v, dout = _inputs(2, 4, 2, lq, lk, 16, seed=1)
    mask = torch.ones(2, lk, dtype=torch.bool)
    mask[1, : lk // 3] = False
    inputs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = posenc.attention(
        *inputs, bias=bias, rotary=posenc.Rotary(16) if rotary else None, causal=causal,
        scale=0.25, attention_mask=mask, chunk_size=chunk,
    )  # fmt: skip
    exact = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = _dense_chunked(*exact, chunk=chunk, causal=causal, bias=bias, rotary=rotary, mask=mask)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    params = [] if bias is None else [p for p in bias.parameters() if p.requires_grad]
    got = torch.autograd.grad(out, [*inputs, *params], dout)
    want = torch.autograd.grad(ref, [*exact, *params], dout)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-11)


def test_chunks_of_the_whole_sequence_change_nothing():
    q, k, v, _ = _inputs(1, 4, 4, 20, 50, 16, seed=2)
    kw = {"bias": ALiBi(4).double(), "rotary": posenc.Rotary(16), "causal": True}
    a = posenc.attention(q, k, v, chunk_size=50, **kw)
    b = posenc.attention(q, k, v, **kw)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


def test_causal_chunks_equal_each_chunk_alone_without_rotary_and_cache():
    # a relative bias sees the same distances within a chunk alone: chunked causal
    # attention is the chunks' own causal attention, concatenated
    q, k, v, _ = _inputs(2, 4, 2, 100, 100, 16, seed=3)
    kw = {"bias": ALiBi(4).double(), "causal": True}
    out = posenc.attention(q, k, v, chunk_size=32, **kw)
    for a in range(0, 100, 32):
        b = min(100, a + 32)
        alone = posenc.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], **kw)
        torch.testing.assert_close(out[:, :, a:b], alone, rtol=0, atol=1e-12)


def test_rotary_positions_stay_global_in_a_chunk():
    # with rotary, the second chunk alone would rotate from 0: a different result; with
    # global positions it equals the chunk alone rotated at its positions, which a
    # relative encoding cannot tell apart from 0-based
    q, k, v, _ = _inputs(1, 2, 2, 16, 16, 16, seed=4)
    rot = posenc.Rotary(16)
    out = posenc.attention(q, k, v, rotary=rot, causal=True, chunk_size=8)
    rq, rk = (_rotate64(t, torch.arange(16), tables=torch.float32) for t in (q, k))
    alone = posenc.attention(rq[:, :, 8:], rk[:, :, 8:], v[:, :, 8:], causal=True)
    torch.testing.assert_close(out[:, :, 8:], alone, rtol=0, atol=1e-12)


def test_packed_chunks_start_with_each_document():
    # chunks count positions within each document, so packing stays "each document
    # alone" (rotary restarts with the document; chunks with it)
    cu = [0, 5, 5, 40, 100]
    q, k, v, _ = _inputs(2, 4, 2, 100, 100, 16, seed=5)
    kw = {"bias": ALiBi(4).double(), "rotary": posenc.Rotary(16), "causal": True, "chunk_size": 16}
    out = posenc.attention(q, k, v, cu_seqlens=torch.tensor(cu), **kw)
    for a, b in itertools.pairwise(cu):
        if b > a:
            alone = posenc.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], **kw)
            torch.testing.assert_close(out[:, :, a:b], alone, rtol=0, atol=1e-12)


def test_chunks_match_transformers_mask_with_left_padding():
    # HF's chunked mask (masking_utils.chunked_causal_mask_function) counts chunks from
    # each row's first real token: the left padding given as a document of its own (and
    # masked) does the same here. v = one-hot keys makes the output the weights, whose
    # support is the mask; a KV cache of 40 keys with 24 new queries
    masking = anchor("transformers.masking_utils")
    lq, lk, chunk = 24, 64, 8
    pads = torch.tensor([0, 3, 10])
    keys = torch.arange(lk)
    mask = keys[None, :] >= pads[:, None]
    ids = mask.long()  # pads document 0, the real tokens document 1
    fn = masking.chunked_causal_mask_function(chunk, pads)
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(3, 2, lq, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(3, 2, lk, 16, generator=gen, dtype=torch.float64)
    v = torch.eye(lk, dtype=torch.float64).expand(3, 2, lk, lk)
    out = posenc.attention(
        q, k, v, causal=True, attention_mask=mask, document_ids=ids, chunk_size=chunk
    )
    for row in range(3):
        queries = torch.arange(lk - lq, lk)
        # HF evaluates its mask functions on index tensors (vmap or broadcast)
        theirs = fn(torch.tensor(row), torch.tensor(0), queries[:, None], keys[None, :])
        theirs = theirs & mask[row][None, :]
        assert torch.equal(out[row] > 0, theirs.expand(2, -1, -1))


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_chunked_float32_kernel_within_the_bounds_of_each_chunk(causal, monkeypatch):
    # float32 through the compiled loops, forward and backward, against each chunk's
    # dense float64 attention: without rotary and with a relative bias, chunked attention
    # is the chunks' own, the other chunks' keys weighing exactly 0, so each chunk's
    # bounds (tests/test_attention_backward.py, derived for any order of the sums) hold
    for name in ("forward_blockwise", "backward_blockwise"):
        monkeypatch.setattr(softmax, name, _refuse(name))
    torch.manual_seed(7)
    bias = ALiBi(4)
    q, k, v, dout = _inputs(2, 4, 2, 330, 330, 16, seed=8, dtype=torch.float32)
    mask = torch.ones(2, 330, dtype=torch.bool)
    mask[1, :50] = False
    inputs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = posenc.attention(
        *inputs, bias=bias, causal=causal, scale=0.25, attention_mask=mask, chunk_size=96
    )
    got = torch.autograd.grad(out, inputs, dout)
    bias64 = ALiBi(4).double()
    for a in range(0, 330, 96):
        b = min(330, a + 96)
        part = [t[:, :, a:b] for t in (q, k, v, dout)]
        exact = [t.double().requires_grad_(True) for t in part[:3]]
        ref = dense(*exact, bias64, causal=causal, scale=0.25, mask=mask[:, a:b])
        want = torch.autograd.grad(ref, exact, part[3].double())
        tq, tk, tv, *_, tout = bounds(*part, bias, causal=causal, scale=0.25, mask=mask[:, a:b])
        assert bool(((out[:, :, a:b].double() - ref).abs() <= tout).all())
        for g, w, t in zip(got, want, (tq, tk, tv), strict=True):
            assert bool(((g[:, :, a:b].double() - w).abs() <= t).all())


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} ran")

    return refuse


@pytest.mark.usefixtures("compiled_kernels")
def test_chunked_call_skips_keys_in_the_compiled_loop(monkeypatch):
    # the chunks reach the loop as documents: it reads only the keys of a block's chunks
    seen = []
    forward = kernel.forward

    def spy(plan, params, *tensors):
        result = forward(plan, params, *tensors)
        seen.append((plan.mask.docs is not None, result is not None))
        return result

    monkeypatch.setattr(kernel, "forward", spy)
    q, k, v, _ = _inputs(1, 4, 4, 200, 200, 16, seed=9, dtype=torch.float32)
    posenc.attention(q, k, v, causal=True, chunk_size=64)
    assert seen == [(True, True)]


def _chunk_inputs(device, dtype):
    """q, k, v, the output's gradient, the key padding and T5's bias of the chunk tests."""
    gen = torch.Generator().manual_seed(14)
    shape = [(2, 4, 200, 16), (2, 2, 200, 16), (2, 2, 200, 16), (2, 4, 200, 16)]
    q, k, v, dout = (torch.randn(*s, generator=gen).to(device, dtype) for s in shape)
    mask = torch.ones(2, 200, dtype=torch.bool, device=device)
    mask[1, :30] = False
    torch.manual_seed(15)
    return q, k, v, dout, mask, T5Bias(4).to(device)


def _chunks_and_documents(backend, device, dtype, backward=True):
    """Chunked attention and the same call with the chunks given as documents, with
    their gradients (``backward``): without rotary and with a relative bias, the two
    are the same computation (the documents' restarted positions reach no table of
    key - query)."""
    q, k, v, dout, mask, t5 = _chunk_inputs(device, dtype)
    ids = torch.arange(200, device=device) // 48
    results = []
    for kw in ({"chunk_size": 48}, {"document_ids": ids}):
        bias = copy.deepcopy(t5)
        inputs = [t.clone().requires_grad_(backward) for t in (q, k, v)]
        with torch.set_grad_enabled(backward):
            out = posenc.attention(
                *inputs, bias=bias, causal=True, attention_mask=mask, backend=backend, **kw
            )
        params = [bias.relative_attention_bias.weight]
        grads = torch.autograd.grad(out, [*inputs, *params], dout) if backward else ()
        results.append((out, *grads))
    return results


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
def test_chunks_take_the_documents_path_bit_for_bit(backend):
    # bookkeeping, not evidence of correctness: chunk_size=48 reaches the loops as the
    # documents position // 48, so the call equals the same call given those documents,
    # to the bit, forward and backward. Chunked attention itself is checked against
    # dense float64 attention masked to the chunks (test_chunked_equals_dense_float64,
    # test_chunked_float32_kernel_within_the_bounds_of_each_chunk). One thread: the
    # compiled backward adds the threads' dq and table gradients in the order they took
    # the key blocks, reproducible to rounding only with more (core/csrc/attend.c)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        chunked, packed = _chunks_and_documents(backend, "cpu", torch.float32)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(chunked, packed, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "device",
    [
        pytest.param(
            "cpu",
            marks=pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
        ),
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
            ],
        ),
    ],
)
def test_chunked_flex_equals_dense_float64(device, monkeypatch):
    """Chunked attention through FlexAttention (what "auto" takes on a GPU) against
    attention computed densely in float64 with the mask written out here: same chunk
    (``key // 48 == query // 48``), causal, not padding; T5's bias over the global
    ``key - query``. Within the FlexAttention bounds of tests/test_gpu_attention.py,
    derived from its float32 arithmetic; then, as bookkeeping, equal to the bit to the
    same call with the chunks given as documents.

    On CUDA compiled, forward and backward (q, k, v and T5's table); on CPU eager and
    forward only: torch refuses FlexAttention's backward on CPU tensors, and compiling
    it for CPUs generates C++, not the GPU's Triton (test_gpu_attention.on_cpu).
    """
    import test_gpu_attention as flex

    device = torch.device(device)
    backward = device.type == "cuda"
    if not backward:
        flex.on_cpu(monkeypatch)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # IEEE float32 products, as the bounds
    try:
        with one_thread():  # small tensors
            chunked, packed = _chunks_and_documents("flex", device, torch.float32, backward)
    finally:
        torch.set_float32_matmul_precision(precision)
    for a, b in zip(chunked, packed, strict=True):
        assert torch.equal(a, b)

    q, k, v, dout, mask, t5 = _chunk_inputs(device, torch.float32)
    d, keys = q.shape[3], torch.arange(q.shape[2], device=device)
    same = (keys[None, :] // 48) == (keys[:, None] // 48)
    allowed = mask[:, None, None, :] & same & (keys[None, :] <= keys[:, None])
    bias64 = copy.deepcopy(t5).double()
    block = bias64(keys[:, None], keys[None, :])  # (heads, n, n) over key - query
    q64, k64, v64 = (t.double().requires_grad_(backward) for t in (q, k, v))
    ref = flex.dense(q64, k64, v64, block, allowed, d**-0.5)
    want = [ref]
    if backward:
        params64 = [bias64.relative_attention_bias.weight]
        want += torch.autograd.grad(ref, [q64, k64, v64, *params64], dout.double())
    with torch.no_grad():
        inputs = [t.double() for t in (q, k, v, dout)]
        found = flex.bounds(
            *inputs, block.detach(), allowed, d**-0.5, bias_error=8 * flex.U * block.abs(),
            rounding=0.0, backward=backward,
        )  # fmt: skip
    tols = list(found[:4])
    if backward:
        tols += flex.param_bounds(bias64, "table", keys, d, *found[4:], 0.0)
    flex.assert_within(list(chunked), want, tols)


def test_gradcheck_chunked_blockwise_float64():
    # small sizes, a KV cache, a chunk boundary inside the queries, rotary, T5's weights
    # varied too
    gen = torch.Generator().manual_seed(10)
    q = torch.randn(1, 2, 4, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    t5 = T5Bias(2, num_buckets=8, max_distance=16).double()
    weight = t5.relative_attention_bias.weight.detach().clone().requires_grad_(True)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = t5
            self.rotary = posenc.Rotary(8)

        def forward(self, q, k, v):
            return posenc.attention(
                q, k, v, bias=self.bias, rotary=self.rotary, causal=True, attention_mask=mask,
                chunk_size=3, backend="blockwise",
            )  # fmt: skip

    layer = Layer()

    def fn(q, k, v, w):  # the module's weight swapped for w, so that gradcheck varies it
        return torch.func.functional_call(layer, {"bias.relative_attention_bias.weight": w},
                                          (q, k, v))  # fmt: skip

    assert torch.autograd.gradcheck(fn, (q, k, v, weight))


@pytest.mark.parametrize(
    ("chunk_size", "error"),
    [(0, ValueError), (-4, ValueError), (2.0, TypeError), (True, TypeError), ("8", TypeError)],
)
def test_bad_chunk_size_is_refused(chunk_size, error):
    q, k, v, _ = _inputs(1, 2, 2, 4, 4, 8, seed=11)
    with pytest.raises(error, match="chunk_size"):
        posenc.attention(q, k, v, causal=True, chunk_size=chunk_size)


def test_chunks_need_queries_at_key_positions():
    q, k, v, _ = _inputs(1, 2, 2, 6, 4, 8, seed=12)
    with pytest.raises(ValueError, match="chunk_size needs q_len <= k_len"):
        posenc.attention(q, k, v, chunk_size=2)


# --------------------------------------------------------------------------------------
# The temperature of the NoPE layers.


def _hf_formula(positions, floor_scale, attn_scale, dtype=torch.float64):
    """HF Llama4TextAttention's expression, in ``dtype`` (HF: float32)."""
    p = positions.to(dtype)
    return torch.log1p(torch.floor((p + 1.0) / floor_scale)) * attn_scale + 1.0


def test_temperature_equals_the_formula_in_float64():
    # the same operations in float64: equal to the last bit
    p = torch.cat([torch.arange(0, 40000, 7), torch.tensor([2**31 - 1, 8191, 16383, 16384])])
    for fs, scale in ((8192, 0.1), (3, 0.5), (1000.5, 2.0)):
        got = posenc.attn_temperature(p, floor_scale=fs, attn_scale=scale)
        assert got.dtype == torch.float64
        assert torch.equal(got, _hf_formula(p, fs, scale))
        # numpy's log1p and torch's are each within an ulp, not always the same one:
        # 1 + attn_scale * log1p(n) then differs by at most 2 ulps of a value >= 1 (one
        # from the log, scaled by attn_scale * log1p(n) <= the value, one from rounding)
        theirs = posenc.attn_temperature(p.numpy(), fs, scale)
        np.testing.assert_allclose(theirs, got.numpy(), rtol=2 * 2**-52, atol=0)


def test_temperature_literal_values():
    # positions below floor_scale - 1 are 1 exactly; 8191 the first step: 1 + 0.1 ln 2
    got = posenc.attn_temperature(np.array([0, 8190, 8191, 16383, 24575]))
    want = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3), 1 + 0.1 * math.log(4)]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=2**-52, atol=0)
    assert posenc.attn_temperature(np.array([[0, 8191]])).shape == (1, 2)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 2**31))
def test_temperature_steps_exactly(position, floor_scale):
    # the step is the exact integer quotient, even where (p + 1) / floor_scale lands a
    # hair below an integer: checked against Python's integer floor division (numpy's
    # log1p both sides: math.log1p may round the other way)
    got = float(posenc.attn_temperature(np.array([position]), floor_scale, 1.0)[0])
    assert got == 1.0 + float(np.log1p(np.float64((position + 1) // floor_scale)))


def test_temperature_scales_what_transformers_scales():
    # the queries Llama4TextAttention hands to its attention function in a NoPE layer,
    # over a prompt and then a step with a KV cache (positions from the cache's length):
    # its q_proj output times its float32 scales. Ours in float64 from the same q_proj
    # output; HF's float32 scale rounds log1p, the product by attn_scale and the sum
    # (3 roundings of 2**-24 relative to a scale <= 2, each error at most 2**-24 * 2) and
    # the product with q once more: within 4 * 2**-24 * 2 * |q| + 2**-24 |q scale|
    modeling = anchor("transformers.models.llama4.modeling_llama4")
    transformers = anchor("transformers")
    config = transformers.Llama4TextConfig(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        num_hidden_layers=4, intermediate_size=8, intermediate_size_mlp=8, vocab_size=10,
        num_local_experts=1, floor_scale=3, attn_scale=0.5,
    )  # fmt: skip
    config._attn_implementation = "eager"
    assert config.no_rope_layers[3] == 0  # layer 3 has no RoPE
    layer = modeling.Llama4TextAttention(config, 3)
    seen = []
    eager = modeling.eager_attention_forward

    def spy(module, query, *args, **kwargs):
        seen.append(query.detach())
        return eager(module, query, *args, **kwargs)

    cache = transformers.DynamicCache(config=config)
    gen = torch.Generator().manual_seed(13)
    prompt, step = torch.randn(1, 7, 16, generator=gen), torch.randn(1, 5, 16, generator=gen)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modeling, "eager_attention_forward", spy)
        with torch.no_grad():
            layer(prompt, None, None, cache=cache)
            layer(step, None, None, cache=cache)
    for hidden, start, theirs in ((prompt, 0, seen[0]), (step, 7, seen[1])):
        with torch.no_grad():
            q = layer.q_proj(hidden).view(1, -1, 2, 8).transpose(1, 2).double()
        positions = torch.arange(start, start + hidden.shape[1])
        scale = posenc.attn_temperature(positions, floor_scale=3, attn_scale=0.5)
        ours = q * scale[:, None]
        tol = 9 * 2**-24 * 2 * q.abs()
        assert bool(((theirs.double() - ours).abs() <= tol).all())
        assert float(scale.max()) > 1.5  # the scale did grow over these positions


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([-1],), ValueError, "positions must be >= 0"),
        (([0.5, float("nan")],), ValueError, "positions must be finite"),
        (([2**31],), ValueError, "positions"),
        ((["1"],), TypeError, "positions"),
        ((torch.tensor([True]),), TypeError, "positions"),
        (([1], 0), ValueError, "floor_scale"),
        (([1], "8192"), TypeError, "floor_scale"),
        (([1], 8192, float("inf")), ValueError, "attn_scale"),
    ],
)
def test_temperature_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        posenc.attn_temperature(*args)


def test_temperature_keeps_the_kind_and_device():
    assert isinstance(posenc.attn_temperature([1, 2]), np.ndarray)
    t = posenc.attn_temperature(torch.arange(4, dtype=torch.int32))
    assert isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype == torch.float64
    assert posenc.attn_temperature(np.zeros(0)).shape == (0,)


# --------------------------------------------------------------------------------------
# posenc rope: the layers of hybrid models.


def _settings(config):
    return {s["setting"]: s for s in rope_reading.layer_settings(config)}


def _loaded(config):
    return rope_reading.Loaded(config, "test", "class")


def test_llama4_class_report():
    transformers = anchor("transformers")
    config = transformers.Llama4TextConfig(
        num_hidden_layers=8, hidden_size=64, num_attention_heads=4, head_dim=16,
        floor_scale=4096, attn_scale=0.2, attention_chunk_size=1024, use_qk_norm=True,
    )  # fmt: skip
    nope = rope_reading.nope_layers(config)
    assert nope["layers"] == [3, 7]
    got = _settings(config)
    assert got["attn_temperature_tuning"] == {
        "setting": "attn_temperature_tuning", "value": True, "from": "attn_temperature_tuning",
        "layers": [3, 7], "means": got["attn_temperature_tuning"]["means"],
    }  # fmt: skip
    assert (got["floor_scale"]["value"], got["floor_scale"]["from"]) == (4096, "floor_scale")
    assert (got["attn_scale"]["value"], got["attn_scale"]["from"]) == (0.2, "attn_scale")
    chunk = got["attention_chunk_size"]
    assert (chunk["value"], chunk["from"]) == (1024, "attention_chunk_size")
    # transformers' own layer types say which layers are chunked
    want = [i for i, t in enumerate(config.layer_types) if t == "chunked_attention"]
    assert chunk["layers"] == want == [0, 1, 2, 4, 5, 6]
    assert got["use_qk_norm"]["layers"] == [0, 1, 2, 4, 5, 6]


def test_llama4_composite_and_off_switches():
    transformers = anchor("transformers")
    config = transformers.Llama4Config(
        text_config={
            "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
            "attn_temperature_tuning": False, "attention_chunk_size": None, "use_qk_norm": False,
        }
    )  # fmt: skip
    got = _settings(config)
    assert got["attn_temperature_tuning"]["from"] == "text_config.attn_temperature_tuning"
    assert got["attn_temperature_tuning"]["layers"] == []
    assert got["attention_chunk_size"]["value"] is None
    assert got["attention_chunk_size"]["layers"] == []
    assert got["use_qk_norm"]["layers"] == []


def test_llama4_dict_takes_the_class_defaults():
    # a config.json that omits the keys and gives an empty no_rope_layers, which
    # Llama4TextConfig replaces by every 4th layer
    transformers = anchor("transformers")
    d = {
        "model_type": "llama4_text", "num_hidden_layers": 8, "no_rope_layers": [],
        "rope_theta": 500000.0, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
    }  # fmt: skip
    assert rope_reading.nope_layers(d)["layers"] == [3, 7]
    got = _settings(d)
    default = transformers.Llama4TextConfig()
    for key, value in rope_reading.LLAMA4_DEFAULTS.items():
        assert getattr(default, key) == value
        assert got[key]["value"] == value
        assert got[key]["from"] == f"default (Llama4TextConfig's {key})"
    theirs = transformers.Llama4TextConfig(**{k: v for k, v in d.items() if k != "model_type"})
    assert rope_reading.nope_layers(theirs)["layers"] == [3, 7]


def test_smollm3_nope_layers():
    transformers = anchor("transformers")
    config = transformers.SmolLM3Config(num_hidden_layers=6, no_rope_layer_interval=3)
    nope = rope_reading.nope_layers(config)
    assert nope["layers"] == [2, 5] == [i for i, r in enumerate(config.no_rope_layers) if not r]
    assert nope["from"].startswith("no_rope_layers")
    d = {"model_type": "smollm3", "num_hidden_layers": 8, "rope_theta": 2e6}
    assert rope_reading.nope_layers(d)["layers"] == [3, 7]  # SmolLM3Config's default interval
    assert "SmolLM3Config's default" in rope_reading.nope_layers(d)["from"]
    assert rope_reading.layer_settings(d) == []


def test_cohere2_pattern():
    # Cohere 2 rotates its sliding-window layers only: the full ones are NoPE
    transformers = anchor("transformers")
    config = transformers.Cohere2Config(
        num_hidden_layers=8, hidden_size=64, num_attention_heads=4, sliding_window=512
    )
    full = [i for i, t in enumerate(config.layer_types) if t == "full_attention"]
    nope = rope_reading.nope_layers(config)
    assert nope["layers"] == full == [3, 7]
    assert nope["from"].startswith("layer_types")
    window = _settings(config)["sliding_window"]
    assert (window["value"], window["layers"]) == (512, [0, 1, 2, 4, 5, 6])
    # a config.json in the older form: sliding_window_pattern instead of layer_types
    d = {"model_type": "cohere2", "num_hidden_layers": 6, "sliding_window_pattern": 3,
         "sliding_window": 4096, "rope_theta": 50000.0, "hidden_size": 64,
         "num_attention_heads": 4}  # fmt: skip
    assert rope_reading.nope_layers(d)["layers"] == [2, 5]
    assert "sliding_window_pattern = 3" in rope_reading.nope_layers(d)["from"]
    d.pop("sliding_window_pattern")
    assert rope_reading.nope_layers(d)["layers"] == [3]  # the class's default pattern 4


def test_sliding_only_rope_table_matches_transformers():
    # the model types whose attention rotates under "if self.sliding_window is not None"
    import importlib.util
    import pathlib
    import re

    anchor("transformers")
    spec = importlib.util.find_spec("transformers.models")
    assert spec is not None and spec.submodule_search_locations
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    pattern = re.compile(r"if self\.sliding_window is not None( or self\.force_rope)?:\n(.*\n){0,2}"
                         r".*apply_rotary_pos_emb\(")  # fmt: skip
    found = {
        path.parent.name
        for path in root.glob("*/modeling_*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    }
    assert found == set(posenc.rotary.model_types.SLIDING_ONLY_ROPE)


def test_rope_json_and_text_report(capsys):
    transformers = anchor("transformers")
    assert rope_cli.run("Llama4TextConfig", sets=["num_hidden_layers=4"], as_json=True) == 0
    doc = json.loads(capsys.readouterr().out)
    assert transformers.Llama4TextConfig(num_hidden_layers=4).no_rope_layers == [1, 1, 1, 0]
    got = {s["setting"]: s for s in doc["layer_settings"]}
    assert got["attention_chunk_size"]["layers"] == [0, 1, 2]
    assert got["attn_temperature_tuning"]["layers"] == [3]
    assert doc["nope_layers"]["layers"] == [3]
    assert rope_cli.run("Cohere2Config", sets=["num_hidden_layers=4"]) == 0
    text = capsys.readouterr().out
    assert "NoPE layers (1 of 4): 3" in text
    assert "sliding_window = 4096 (layers 0-2)" in text


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "llama4_text", "num_hidden_layers": 8, "no_rope_layers": [],
         "rope_theta": 500000.0, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16},
        {"model_type": "cohere2", "num_hidden_layers": 6, "sliding_window_pattern": 3,
         "sliding_window": 4096, "rope_theta": 50000.0, "hidden_size": 64,
         "num_attention_heads": 4},
        {"model_type": "smollm3", "num_hidden_layers": 8, "rope_theta": 2e6,
         "hidden_size": 64, "num_attention_heads": 4},
    ],
    ids=["llama4", "cohere2", "smollm3"],
)  # fmt: skip
def test_config_json_reads_as_transformers_class_does(config, tmp_path, capsys):
    # the command cross-checks a config.json against transformers' own class, NoPE layers
    # included: the defaults these configs leave to the class read the same
    anchor("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert rope_cli.run(str(path), as_json=True) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("reads the same RoPE from this file" in n for n in doc["notes"]), doc["notes"]
    assert not any(n.startswith("WARNING") for n in doc["notes"])
    assert doc["nope_layers"]["layers"]
