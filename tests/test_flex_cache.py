"""FlexAttention's block masks made once and reused; no recompilation at shapes seen.

``posenc.attention(backend="flex")`` keeps each block mask by everything it
depends on (device, batch, lengths, causal, offset, key padding mask,
documents), the masks compared by content, and gives the compiled score and
mask mods their numbers as tensors, so that a call at shapes already seen
compiles nothing. Compiled FlexAttention runs forward only on the CPU: these
tests run under ``no_grad``. Each compile costs seconds here, so most tests
share one configuration (causal, key padding, packed documents, ALiBi, the
shapes of ``SHAPE``) and the compiled graphs it makes.
"""

from __future__ import annotations

import itertools
import threading

import pytest
import torch
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import posenc
from posenc.families.bias.modules import ALiBi
from posenc.integration.attention import flex as flex_engine
from posenc.integration.attention import layout
from test_attention import dense, inputs, padding, tolerance

# (batch, heads, kv_heads, q_len, k_len, head_dim, v_dim): grouped-query attention
SHAPE = (2, 4, 2, 24, 24, 16, 16)
# packed documents: an empty one, and one all padding in the last row (padding()
# pads its first 8 keys), whose queries see no key
CU = [0, 7, 7, 16, 24]
SCALE = 0.25  # 1 / sqrt(head_dim)


@pytest.fixture(autouse=True)
def empty_cache():
    flex_engine.BLOCK_MASKS.clear()
    yield
    flex_engine.BLOCK_MASKS.clear()


@pytest.fixture
def builds(monkeypatch):
    """The (q_len, k_len) of every block mask built, through the compiled create_block_mask."""
    calls = []
    compiled = flex_engine.compiled

    def counting(fn):
        made = compiled(fn)
        if fn is not create_block_mask:
            return made

        def count(mask_mod, batch, heads, q_len, k_len, **kw):
            calls.append((q_len, k_len))
            return made(mask_mod, batch, heads, q_len, k_len, **kw)

        return count

    monkeypatch.setattr(flex_engine, "compiled", counting)
    return calls


def graphs():
    """Graphs dynamo has compiled in this process."""
    return counters["stats"]["unique_graphs"]


def flex(q, k, v, bias, mask, cu=CU, scale=None):
    with torch.no_grad():
        return posenc.attention(
            q, k, v, bias=bias, causal=True, attention_mask=mask, scale=scale,
            cu_seqlens=torch.tensor(cu), backend="flex",
        )  # fmt: skip


def assert_each_document_dense(out, q, k, v, bias, mask, cu=CU, scale=SCALE):
    # each document alone against dense float64 attention, within the float32 bound of
    # that document: the other documents' keys weigh exactly 0 in the packed call
    for a, b in itertools.pairwise(cu):
        if b == a:
            continue
        part = [t[:, :, a:b] for t in (q, k, v)]
        with torch.no_grad():
            want = dense(*part, bias, causal=True, scale=scale, mask=mask[:, a:b])
        err = (out[:, :, a:b].double() - want).abs().max()
        assert err <= tolerance(*part, bias, scale), f"document {a}:{b}: error {float(err):.3g}"


def test_flex_equals_dense_with_causal_padding_and_documents():
    torch.manual_seed(0)
    bias = ALiBi(SHAPE[1])
    q, k, v = inputs(SHAPE)
    mask = padding(SHAPE[0], SHAPE[4])
    out = flex(q, k, v, bias, mask)
    assert out.shape == (2, 4, 24, 16) and out.dtype == torch.float32
    assert_each_document_dense(out, q, k, v, bias, mask)
    # the first document is all padding in the last row: its queries see no key
    assert out[1, :, :7].eq(0).all() and not out[0, :, :7].eq(0).all()


def test_block_mask_is_built_once_and_reused(builds):
    bias = ALiBi(SHAPE[1])
    q, k, v = inputs(SHAPE)
    mask = padding(SHAPE[0], SHAPE[4])
    first = flex(q, k, v, bias, mask)
    # new tensors of the same content (another layer, the next call): the same mask
    again = flex(q, k, v, bias, mask.clone(), cu=list(CU))
    assert builds == [(24, 24)] and len(flex_engine.BLOCK_MASKS) == 1
    assert torch.equal(first, again)
    # the block mask those calls used comes back, the same object, for equal masks
    docs, _ = layout.documents(torch.tensor(CU), None, 2, 24, torch.device("cpu"))
    plan = layout.Mask(True, mask.clone(), 0, docs)
    made = flex_engine._block_mask(plan, 2, 24, 24, torch.device("cpu"), compiling=False)
    assert flex_engine._block_mask(plan, 2, 24, 24, torch.device("cpu"), compiling=False) is made
    assert builds == [(24, 24)]


def test_a_mask_changed_in_place_gets_a_new_block_mask(builds):
    bias = ALiBi(SHAPE[1])
    q, k, v = inputs(SHAPE, seed=1)
    mask = padding(SHAPE[0], SHAPE[4])
    flex(q, k, v, bias, mask)
    # the same tensor object at the same address, other content
    address = mask.data_ptr()
    mask[0, 9:12] = False
    assert mask.data_ptr() == address
    out = flex(q, k, v, bias, mask)
    assert len(builds) == 2
    assert_each_document_dense(out, q, k, v, bias, mask)
    # the entry kept its own copy of the first mask: changing the caller's tensor back
    # finds the first mask's content again (a new entry, the key's one slot replaced)
    mask[0, 9:12] = True
    assert_each_document_dense(flex(q, k, v, bias, mask), q, k, v, bias, mask)
    assert len(builds) == 3


def test_same_shapes_compile_nothing_the_second_time():
    q, k, v = inputs(SHAPE, seed=2)
    mask = padding(SHAPE[0], SHAPE[4])
    flex(q, k, v, ALiBi(SHAPE[1]), mask)
    before = graphs()
    # the same shapes: another ALiBi, another key mask and other documents (new block
    # mask), another scale (captured as a float, it would be guarded on)
    other = mask.clone()
    other[0, 20:] = False
    bias = ALiBi(SHAPE[1], max_bias=4.0)
    cu = [0, 5, 24, 24, 24]
    out = flex(q, k, v, bias, other, cu=cu, scale=0.3)
    assert graphs() == before, "a second call at the same shapes compiled"
    assert_each_document_dense(out, q, k, v, bias, other, cu=cu, scale=0.3)


def test_decode_steps_compile_nothing_after_the_second():
    # one query against a growing cache: query i sits at key position k_len - 1, the
    # offset changing every step. torch compiles the first step for its shapes and
    # the second once more, with the key length dynamic; no step after that compiles.
    # (Causal only: a key padding mask read by kv index breaks inductor's CPU
    # template once the key length is dynamic, a C++ compile error in torch 2.13.)
    bias = ALiBi(4)
    counts = []
    for lk in range(17, 22):
        q, k, v = inputs((2, 4, 2, 1, lk, 16, 16), seed=lk)
        with torch.no_grad():
            out = posenc.attention(q, k, v, bias=bias, causal=True, backend="flex")
            want = dense(q, k, v, bias, causal=True, scale=SCALE)
        assert (out.double() - want).abs().max() <= tolerance(q, k, v, bias, SCALE)
        counts.append(graphs())
    assert counts[2:] == [counts[1]] * 3, f"graphs compiled after each step: {counts}"


def test_bfloat16_goes_to_flex_as_it_is(monkeypatch):
    seen = []
    compiled = flex_engine.compiled

    def spy(fn):
        made = compiled(fn)
        if fn is not flex_attention:
            return made

        def run(q, k, v, **kw):
            seen.append((q.dtype, k.dtype, v.dtype))
            return made(q, k, v, **kw)

        return run

    monkeypatch.setattr(flex_engine, "compiled", spy)
    bias = ALiBi(SHAPE[1])
    q, k, v = (t.bfloat16() for t in inputs(SHAPE, seed=3))
    mask = padding(SHAPE[0], SHAPE[4])
    out = flex(q, k, v, bias, mask)
    assert seen == [(torch.bfloat16,) * 3] and out.dtype == torch.bfloat16
    # the reference takes the bfloat16 inputs exactly (in float64): beyond float32
    # attention (tolerance) flex rounds each weight to bfloat16 for its product with
    # v and the output once, 2**-8 relative each: 2 * 2**-8 * max|v|
    for a, b in itertools.pairwise(CU):
        if b == a:
            continue
        part = [t[:, :, a:b] for t in (q, k, v)]
        with torch.no_grad():
            want = dense(*part, bias, causal=True, scale=SCALE, mask=mask[:, a:b])
        bound = tolerance(*part, bias, SCALE) + 2 * 2.0**-8 * float(part[2].abs().max())
        assert (out[:, :, a:b].double() - want).abs().max() <= bound


# ------------------------------------------------------------------ the cache itself


def _key(n):
    return (torch.device("cpu"), None, n, n, True, 0, None, None)


def test_cache_is_bounded_least_recently_used_first():
    cache = flex_engine.BlockMasks(3)
    made = []

    def build(*tensors):
        made.append(object())
        return made[-1]

    for n in range(3):
        cache.get(_key(n), (None, None), build)
    first = cache.get(_key(0), (None, None), build)  # used: now the most recent
    assert len(made) == 3 and first is made[0]
    cache.get(_key(3), (None, None), build)  # evicts 1, the least recently used
    assert len(cache) == 3
    assert cache.get(_key(0), (None, None), build) is made[0]
    cache.get(_key(1), (None, None), build)
    assert len(made) == 5 and len(cache) == 3


def test_cache_compares_tensors_by_content_and_keeps_clones():
    cache = flex_engine.BlockMasks(4)
    seen = []

    def build(mask, docs):
        seen.append(mask)
        return len(seen)

    mask = torch.tensor([[True, False, True]])
    key = (torch.device("cpu"), 1, 3, 3, False, 0, ((1, 3), torch.bool), None)
    assert cache.get(key, (mask, None), build) == 1
    assert seen[0] is not mask and torch.equal(seen[0], mask)  # a clone
    assert cache.get(key, (mask.clone(), None), build) == 1
    mask[0, 1] = True
    assert cache.get(key, (mask, None), build) == 2
    assert not seen[0][0, 1]  # the first entry's clone did not follow the change


def test_cache_holds_its_bound_across_threads():
    cache = flex_engine.BlockMasks(5)
    errors = []

    def work(offset):
        try:
            for n in range(200):
                cache.get(_key((n * 7 + offset) % 13), (None, None), lambda *t: object())
        except Exception as error:  # surfaced below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(cache) == 5
