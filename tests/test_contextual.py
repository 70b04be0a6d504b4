"""CoPE and DAPE through posenc.attention, against dense float64 statements of their formulas.

CoPE (Golovneva et al. 2024) is written out as the paper's listing (the
reference code, facebookresearch/RAM ``projects/cope/src/cope/context_position.py``,
computes the same); DAPE (Zheng et al. 2024) as the ``forward`` of the
reference modules in chuanyang-Zheng/DAPE ``DAPE.py``: ``x + a + mlp([x ; a])``.
Both references build the full ``(batch, heads, q_len, k_len)`` scores; posenc
computes blocks of queries, which the tests force to be small.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call

import posenc
from gpu_markers import no_cuda
from posenc.integration.attention import checkpointed as contextual

# (batch, heads, kv_heads, q_len, k_len, head_dim, v_dim)
SHAPES = {
    "square": (2, 4, 4, 11, 11, 8, 8),
    "cache-gqa": (2, 4, 2, 5, 13, 8, 6),
    "decode": (3, 2, 2, 1, 9, 4, 4),
}

BASES = {
    "alibi": lambda h: posenc.ALiBi(h),
    "alibi-falcon": lambda h: posenc.ALiBi(h, scale_with_logits=True),
    "kerple-log": lambda h: posenc.KERPLE(h),
    "kerple-power": lambda h: posenc.KERPLE(h, kind="power"),
    "fire": lambda h: posenc.FIRE(h, init_L=4.0),  # queries beyond L: not a table
    "t5": lambda h: posenc.T5Bias(h, num_buckets=8, max_distance=16),
    "nope": lambda h: posenc.NoPE(h),
}


def inputs(shape, seed=0, dtype=torch.float64, grad=False):
    b, h, hk, lq, lk, d, dv = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=gen, dtype=dtype)
    k = torch.randn(b, hk, lk, d, generator=gen, dtype=dtype)
    v = torch.randn(b, hk, lk, dv, generator=gen, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def cope_module(head_dim, npos_max, seed=1, dtype=torch.float64, **kw):
    cope = posenc.CoPE(head_dim, npos_max, **kw).to(dtype)
    with torch.no_grad():  # zero at the start; random, so that the term shows
        cope.pos_emb.copy_(
            torch.randn(cope.pos_emb.shape, generator=torch.Generator().manual_seed(seed))
        )
    return cope


def allowed_mask(b, lq, lk, *, causal, mask=None, doc_ids=None):
    """(b, 1, lq, lk): the keys each query sees, queries bottom-right."""
    i = torch.arange(lq)[:, None] + lk - lq
    j = torch.arange(lk)[None, :]
    allowed = torch.ones(b, 1, lq, lk, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if mask is not None:
        allowed &= mask[:, None, None, :].bool()
    if doc_ids is not None:
        ids = doc_ids.expand(b, lk)
        allowed &= ids[:, None, lk - lq :, None] == ids[:, None, None, :]
    return allowed


def softmax_out(logits, allowed, v):
    p = torch.softmax(logits.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0)
    return p @ v


def expand_kv(q, k, v):
    h, hk = q.shape[1], k.shape[1]
    return k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)


def dense_cope(
    q,
    k,
    v,
    pos_emb,
    *,
    npos_max,
    scale,
    scale_with_logits=False,
    bias=None,
    mask=None,
    doc_ids=None,
    extra=None,
):
    """The paper's listing in float64: gates on the causal keys, their reverse
    cumsum, q . pos_emb interpolated at floor and ceil, added to the logits."""
    q, k, v = q.double(), k.double(), v.double()
    k, v = expand_kv(q, k, v)
    b, _, lq, _ = q.shape
    lk = k.shape[2]
    allowed = allowed_mask(b, lq, lk, causal=True, mask=mask, doc_ids=doc_ids)
    attn_logits = q @ k.transpose(-1, -2)
    gates = torch.sigmoid(attn_logits * scale) * allowed
    pos = gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=npos_max - 1)
    pos_ceil, pos_floor = pos.ceil().long(), pos.floor().long()
    logits_int = q @ pos_emb.double()
    w = pos - pos_floor
    pos_logits = logits_int.gather(-1, pos_ceil) * w + logits_int.gather(-1, pos_floor) * (1 - w)
    if scale_with_logits:  # the reference repository's default: (q.k + pos) / sqrt(d)
        logits = (attn_logits + pos_logits) * scale
    else:  # the paper's listing
        logits = attn_logits * scale + pos_logits
    if bias is not None:
        dense_bias = bias.bias(lq, lk).double()
        logits = logits + (dense_bias * scale if bias.scale_with_logits else dense_bias)
    if extra is not None:
        logits = logits + extra
    return softmax_out(logits, allowed, v)


def dense_dape(q, k, v, dape, *, causal, scale, mask=None):
    """``x + a + mlp([x ; a])`` in float64: x the scaled scores before the mask, a the
    base bias (lower-triangular when causal), the MLP over the 2H channels."""
    q, k, v = q.double(), k.double(), v.double()
    k, v = expand_kv(q, k, v)
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    x = q @ k.transpose(-1, -2) * scale
    a = dape.base.bias(lq, lk).double()
    if dape.base.scale_with_logits:
        a = a * scale
    if causal:
        a = a * allowed_mask(1, lq, lk, causal=True)[0]
    both = torch.cat((x, a.expand(b, h, lq, lk)), dim=1).permute(0, 2, 3, 1)
    first, last = dape.mlp[0], dape.mlp[2]
    hidden = nn.functional.leaky_relu(both @ first.weight.double().T + first.bias.double())
    refined = (hidden @ last.weight.double().T + last.bias.double()).permute(0, 3, 1, 2)
    allowed = allowed_mask(b, lq, lk, causal=causal, mask=mask)
    return softmax_out(x + a + refined, allowed, v)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few queries: every test crosses block boundaries."""
    monkeypatch.setattr(contextual, "BLOCK_SCORES", 64)


def padding(b, lk):
    mask = torch.ones(b, lk, dtype=torch.bool)
    mask[-1, : lk // 3] = False  # the last sequence left-padded
    return mask


# float64 on both sides: every value is a sum of at most k_len + head_dim + npos_max
# terms of size below 1e3, each rounded once (2**-53 ~ 1.1e-16), and the softmax and
# the output are Lipschitz in them with constant max|v| ~ 5: 1e-10 leaves room
F64 = 1e-10


@pytest.mark.parametrize("scale_with_logits", [False, True])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_cope_equals_the_listing(shape, scale_with_logits, small_blocks):
    q, k, v = inputs(shape)
    # npos_max below k_len: some positions are clamped
    cope = cope_module(shape[5], 6, scale_with_logits=scale_with_logits)
    mask = padding(shape[0], shape[4])
    scale = 1 / math.sqrt(shape[5])
    got = posenc.attention(q, k, v, cope=cope, causal=True, attention_mask=mask)
    want = dense_cope(
        q, k, v, cope.pos_emb, npos_max=6, scale=scale,
        scale_with_logits=scale_with_logits, mask=mask,
    )  # fmt: skip
    assert got.shape == want.shape and got.dtype == torch.float64
    assert (got - want).abs().max() <= F64


def test_cope_positions_count_the_gates():
    # the paper's example of counting: gates 1 on the keys that matter, 0 elsewhere
    cope = posenc.CoPE(4, 8)
    gates = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]])
    assert cope.positions(gates).tolist() == [[3.0, 2.0, 2.0, 1.0, 0.0]]
    # all ones: the relative position counted from 1 at the query's own key, clamped
    ones = torch.ones(1, 10)
    assert cope.positions(ones).tolist() == [[7.0] * 3 + [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]]


def test_cope_interpolates_between_embeddings():
    # q . e[p] at a fractional position: (1 - w) q . e[floor] + w q . e[ceil]
    cope = posenc.CoPE(2, 4)
    with torch.no_grad():
        cope.pos_emb.copy_(torch.tensor([[0.0, 10.0, 20.0, 30.0], [0.0, 1.0, 2.0, 3.0]]))
    q = torch.tensor([[[[1.0, 1.0]]]])  # q . e[n] = 11 n
    gates = torch.tensor([[[[0.25, 0.5, 1.0]]]])  # positions 1.75, 1.5, 1.0
    assert torch.allclose(cope(q, gates), torch.tensor([[[[19.25, 16.5, 11.0]]]]))


def test_cope_with_a_bias_and_rotary(small_blocks):
    shape = SHAPES["square"]
    q, k, v = inputs(shape)
    cope = cope_module(shape[5], 12)
    bias = posenc.ALiBi(shape[1]).double()
    rotary = posenc.Rotary(shape[5])
    scale = 1 / math.sqrt(shape[5])
    got = posenc.attention(q, k, v, cope=cope, bias=bias, rotary=rotary, causal=True)
    # rotary rotates q and k first: gates, scores and position logits all read them
    c, s = rotary.cos_sin(torch.arange(k.shape[2]))
    qr, kr = posenc.apply_rotary(q, c, s), posenc.apply_rotary(k, c, s)
    want = dense_cope(qr, kr, v, cope.pos_emb, npos_max=12, scale=scale, bias=bias)
    assert (got - want).abs().max() <= F64


@settings(max_examples=15, deadline=None)
@given(
    lq=st.integers(1, 9),
    extra=st.integers(0, 5),
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2)]),
    seed=st.integers(0, 2**16),
)
def test_cope_with_zero_embeddings_is_plain_attention(lq, extra, heads, seed):
    # pos_emb starts at zero: the position term vanishes, whatever the gates
    q, k, v = inputs((2, heads[0], heads[1], lq, lq + extra, 4, 3), seed=seed)
    cope = posenc.CoPE(4, 5).double()
    got = posenc.attention(q, k, v, cope=cope, causal=True)
    want = posenc.attention(q, k, v, causal=True)
    assert (got - want).abs().max() <= F64


def test_cope_float32_within_derived_bound(small_blocks):
    shape = SHAPES["cache-gqa"]
    q, k, v = inputs(shape, dtype=torch.float32)
    cope = cope_module(shape[5], 8, dtype=torch.float32)
    scale = 1 / math.sqrt(shape[5])
    got = posenc.attention(q, k, v, cope=cope, causal=True)
    want = dense_cope(q, k, v, cope.pos_emb, npos_max=8, scale=scale)
    assert got.dtype == torch.float32
    # float32 roundings (eps = 2**-24), propagated: a score q . k * scale is off by
    # dz = d eps |q| |k| scale; a gate by dz / 4 + eps (sigmoid' <= 1/4); a position,
    # a sum of at most k_len gates, by k_len (dz / 4 + eps) plus the cumsum's own
    # k_len * k_len * eps; the position logit, piecewise linear in p with slope at
    # most 2 max|q . e|, by that slope times dp plus d eps |q| max|e| for q . e; the
    # output moves by 2 max|v| times the logit error, plus the sum's (k_len + 16) eps
    eps = 2.0**-24
    d, lk = shape[5], shape[4]
    qn, kn = q.double().norm(dim=-1).max(), k.double().norm(dim=-1).max()
    en = cope.pos_emb.double().norm(dim=0).max()
    dz = d * eps * qn * kn * scale
    dp = lk * (dz / 4 + eps) + lk * lk * eps
    dpos = 2 * qn * en * dp + d * eps * qn * en
    bound = v.double().abs().max() * (2 * (dz + dpos) + (lk + 16) * eps) * 2
    assert (got.double() - want).abs().max() <= bound


def wrapped(cope=None, bias=None, causal=True, **kw):
    """A module whose parameters functional_call (and gradcheck) can replace."""

    class Attend(nn.Module):
        def __init__(self):
            super().__init__()
            self.cope, self.bias = cope, bias

        def forward(self, q, k, v):
            return posenc.attention(q, k, v, cope=self.cope, bias=self.bias, causal=causal, **kw)

    return Attend()


def test_cope_gradcheck(small_blocks):
    q, k, v = inputs((1, 2, 1, 5, 6, 4, 3), grad=True)
    cope = cope_module(4, 4)
    module = wrapped(
        cope, posenc.ALiBi(2).double(), attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1]])
    )
    pos_emb = cope.pos_emb.detach().clone().requires_grad_(True)

    def run(q, k, v, pos_emb):
        return functional_call(module, {"cope.pos_emb": pos_emb}, (q, k, v))

    assert torch.autograd.gradcheck(run, (q, k, v, pos_emb))


def test_cope_gradients_equal_the_listing(small_blocks):
    shape = SHAPES["cache-gqa"]
    q, k, v = inputs(shape, grad=True)
    cope = cope_module(shape[5], 7, scale_with_logits=True)
    mask = padding(shape[0], shape[4])
    scale = 1 / math.sqrt(shape[5])
    out = posenc.attention(q, k, v, cope=cope, causal=True, attention_mask=mask)
    ref = dense_cope(
        q, k, v, cope.pos_emb, npos_max=7, scale=scale, scale_with_logits=True, mask=mask
    )
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    leaves = [q, k, v, cope.pos_emb]
    for a, b in zip(
        torch.autograd.grad(out, leaves, g), torch.autograd.grad(ref, leaves, g), strict=True
    ):
        assert (a - b).abs().max() <= F64


def test_cope_with_forget_gates_and_chunks(small_blocks):
    # the Forgetting Transformer's c_i - c_j is one more additive term of the logits;
    # chunks confine the keys (and so the gates) as documents do
    q, k, v = inputs((2, 2, 2, 8, 8, 4, 4))
    cope = cope_module(4, 6)
    log_f = torch.nn.functional.logsigmoid(
        torch.randn(2, 2, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    )
    got = posenc.attention(q, k, v, cope=cope, causal=True, log_fgate=log_f)
    c = log_f.cumsum(-1)
    gate = c[..., :, None] - c[..., None, :]
    scale = 1 / math.sqrt(4)
    want = dense_cope(q, k, v, cope.pos_emb, npos_max=6, scale=scale, extra=gate)
    assert (got - want).abs().max() <= F64
    chunked = posenc.attention(q, k, v, cope=cope, causal=True, chunk_size=3)
    ids = torch.arange(8) // 3
    assert (
        chunked - posenc.attention(q, k, v, cope=cope, causal=True, document_ids=ids)
    ).abs().max() <= F64
    want = dense_cope(q, k, v, cope.pos_emb, npos_max=6, scale=scale, doc_ids=ids)
    assert (chunked - want).abs().max() <= F64


def test_cope_needs_causal():
    q, k, v = inputs(SHAPES["square"])
    with pytest.raises(ValueError, match="cope needs causal=True"):
        posenc.attention(q, k, v, cope=posenc.CoPE(8, 4).double())


def test_cope_padding_equals_the_unpadded_sequence(small_blocks):
    # left padding: the padded keys have no gate and no weight; the padded queries
    # that see no key give zeros, and their gradients are zeros, never NaN
    q, k, v = inputs((1, 2, 2, 9, 9, 4, 4), grad=True)
    cope = cope_module(4, 10)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    got = posenc.attention(q, k, v, cope=cope, causal=True, attention_mask=mask)
    alone = posenc.attention(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], cope=cope, causal=True)
    assert (got[:, :, 3:] - alone).abs().max() <= F64
    assert torch.equal(got[:, :, :3], torch.zeros_like(got[:, :, :3]))
    g = torch.randn(got.shape, generator=torch.Generator().manual_seed(1), dtype=got.dtype)
    grads = torch.autograd.grad(got, (q, k, v, cope.pos_emb), g)
    want = torch.autograd.grad(alone, (q, k, v, cope.pos_emb), g[:, :, 3:])
    for a, b in zip(grads[:3], want[:3], strict=True):
        assert torch.equal(a[:, :, :3], torch.zeros_like(a[:, :, :3]))
        assert (a[:, :, 3:] - b[:, :, 3:]).abs().max() <= F64
    assert (grads[3] - want[3]).abs().max() <= F64


@pytest.mark.parametrize("name", ["cope", "dape-kerple", "dape-fire"])
def test_packed_documents_equal_each_document_alone(name, small_blocks):
    q, k, v = inputs((2, 2, 2, 10, 10, 4, 4))
    cu = torch.tensor([0, 4, 7, 10])
    if name == "cope":
        kw = {"cope": cope_module(4, 5)}
    else:
        base = posenc.KERPLE(2) if name == "dape-kerple" else posenc.FIRE(2, init_L=2.0)
        kw = {"bias": posenc.DAPE(base, width=8).double()}
    got = posenc.attention(q, k, v, causal=True, cu_seqlens=cu, **kw)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        alone = posenc.attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], causal=True, **kw)
        assert (got[:, :, s:e] - alone).abs().max() <= F64


def test_documents_that_differ_per_row(small_blocks):
    # FIRE past its threshold reads positions within documents: one row at a time
    q, k, v = inputs((2, 2, 2, 7, 7, 4, 4))
    ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [5, 5, 6, 6, 6, 6, 6]])
    dape = posenc.DAPE(posenc.FIRE(2, init_L=2.0), width=8).double()
    got = posenc.attention(q, k, v, bias=dape, causal=True, document_ids=ids)
    for row, cut in ((0, 3), (1, 2)):
        for s, e in ((0, cut), (cut, 7)):
            part = (t[row : row + 1, :, s:e] for t in (q, k, v))
            alone = posenc.attention(*part, bias=dape, causal=True)
            assert (got[row : row + 1, :, s:e] - alone).abs().max() <= F64


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("base", BASES)
def test_dape_equals_the_reference_forward(base, shape, causal, small_blocks):
    torch.manual_seed(2)
    dape = posenc.DAPE(BASES[base](shape[1]), width=16).double()
    q, k, v = inputs(shape)
    mask = padding(shape[0], shape[4])
    scale = 1 / math.sqrt(shape[5])
    got = posenc.attention(q, k, v, bias=dape, causal=causal, attention_mask=mask)
    want = dense_dape(q, k, v, dape, causal=causal, scale=scale, mask=mask)
    assert got.shape == want.shape
    assert (got - want).abs().max() <= F64


def test_dape_module_is_the_formula():
    dape = posenc.DAPE(posenc.ALiBi(2), width=4)
    assert isinstance(dape.mlp[0], nn.Linear) and dape.mlp[0].in_features == 4
    assert isinstance(dape.mlp[1], nn.LeakyReLU)
    assert isinstance(dape.mlp[2], nn.Linear) and dape.mlp[2].out_features == 2
    s, b = torch.randn(3, 2, 5, 6), torch.randn(2, 5, 6)
    want = s + b + dape.mlp(torch.cat((s, b.expand_as(s)), 1).movedim(1, -1)).movedim(-1, 1)
    assert torch.allclose(dape(s, b), want, atol=1e-6)


def test_dape_with_a_zero_mlp_is_its_base(small_blocks):
    q, k, v = inputs(SHAPES["cache-gqa"])
    base = posenc.KERPLE(4).double()
    dape = posenc.DAPE(base)
    with torch.no_grad():
        dape.mlp[2].weight.zero_()
        dape.mlp[2].bias.zero_()
    got = posenc.attention(q, k, v, bias=dape, causal=True)
    want = posenc.attention(q, k, v, bias=base, causal=True)
    assert (got - want).abs().max() <= F64


@pytest.mark.parametrize("base", ["kerple-log", "fire"])
def test_dape_gradcheck(base, small_blocks):
    q, k, v = inputs((1, 2, 2, 4, 5, 3, 2), grad=True)
    torch.manual_seed(0)
    dape = posenc.DAPE(BASES[base](2), width=4).double()
    module = wrapped(bias=dape, attention_mask=torch.tensor([[0, 1, 1, 1, 1]]))
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    start = [
        p.detach().clone().requires_grad_(True)
        for _, p in module.named_parameters()
        if p.requires_grad
    ]
    if base == "fire":
        # beyond its threshold FIRE is evaluated per block from the module's own
        # attributes, which functional_call does not reach in the recomputing
        # backward: its gradients are checked against the dense statement below
        keep = [n.startswith("bias.mlp.") for n in names]
        names = [n for n, kept in zip(names, keep, strict=True) if kept]
        start = [p for p, kept in zip(start, keep, strict=True) if kept]
    assert len(names) == (4 if base == "fire" else 6)

    def run(q, k, v, *params):
        return functional_call(module, dict(zip(names, params, strict=True)), (q, k, v))

    assert torch.autograd.gradcheck(run, (q, k, v, *start))


def test_dape_gradients_reach_every_parameter(small_blocks):
    # FIRE beyond its threshold: the base's MLP, c and L through the per-block bias
    shape = SHAPES["square"]
    q, k, v = inputs(shape, grad=True)
    torch.manual_seed(3)
    dape = posenc.DAPE(posenc.FIRE(shape[1], init_L=4.0), width=8).double()
    scale = 1 / math.sqrt(shape[5])
    out = posenc.attention(q, k, v, bias=dape, causal=True)
    ref = dense_dape(q, k, v, dape, causal=True, scale=scale)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    leaves = [q, k, v, *(p for p in dape.parameters() if p.requires_grad)]
    assert len(leaves) == 3 + 4 + 4 + 2  # DAPE's MLP, FIRE's MLP, c and L_multiplier
    for a, b in zip(
        torch.autograd.grad(out, leaves, g), torch.autograd.grad(ref, leaves, g), strict=True
    ):
        assert (a - b).abs().max() <= F64 * max(1.0, float(b.abs().max()))


def test_the_blocking_does_not_change_the_result(small_blocks, monkeypatch):
    # one query per block with small_blocks, all of them in one block here
    q, k, v = inputs(SHAPES["square"])
    dape = posenc.DAPE(posenc.ALiBi(4)).double()
    small = posenc.attention(q, k, v, bias=dape, causal=True)
    monkeypatch.setattr(contextual, "BLOCK_SCORES", 1 << 20)
    whole = posenc.attention(q, k, v, bias=dape, causal=True)
    assert (small - whole).abs().max() <= F64


@pytest.mark.parametrize("name", ["cope", "dape"])
def test_training_keeps_linear_memory(name):
    # what autograd holds from the forward to the backward: the blocks' inputs (q, k,
    # v and the parameters), never their scores, which the backward recomputes block
    # by block. Counted as the distinct storages the saved tensors point to.
    def held(length: int) -> int:
        q, k, v = inputs((1, 2, 2, length, length, 16, 16), dtype=torch.float32, grad=True)
        kw = (
            {"cope": posenc.CoPE(16, 64)}
            if name == "cope"
            else {"bias": posenc.DAPE(posenc.ALiBi(2), width=8)}
        )
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            posenc.attention(q, k, v, causal=True, **kw)
        return sum(storages.values())

    small, large = held(256), held(512)
    assert large <= 2 * small + (1 << 16)  # linear, give or take the parameters
    assert large < 4 * 512 * 512 // 2  # half of one head's float32 scores


def test_low_precision_inputs_compute_in_float32():
    q, k, v = inputs(SHAPES["square"], dtype=torch.bfloat16)
    cope = posenc.CoPE(8, 12)
    out = posenc.attention(q, k, v, cope=cope, causal=True)
    want = posenc.attention(q.float(), k.float(), v.float(), cope=cope, causal=True)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, want.to(torch.bfloat16))


def test_bad_arguments_are_named():
    q, k, v = inputs(SHAPES["square"])
    with pytest.raises(TypeError, match=r"cope must be a posenc\.CoPE"):
        posenc.attention(q, k, v, cope=posenc.ALiBi(4), causal=True)
    with pytest.raises(ValueError, match="cope has head_dim=16; q and k have 8"):
        posenc.attention(q, k, v, cope=posenc.CoPE(16, 4), causal=True)
    with pytest.raises(ValueError, match="cope and a DAPE bias"):
        posenc.attention(
            q, k, v, cope=posenc.CoPE(8, 4), bias=posenc.DAPE(posenc.ALiBi(4)), causal=True
        )
    with pytest.raises(ValueError, match="backend must be one of"):
        posenc.attention(q, k, v, cope=posenc.CoPE(8, 4), causal=True, backend="flex")
    with pytest.raises(ValueError, match="bias has 2 heads; q has 4"):
        posenc.attention(q, k, v, bias=posenc.DAPE(posenc.ALiBi(2)), causal=True)
    with pytest.raises(TypeError, match=r"base_bias must be a posenc\.bias\.AttentionBias"):
        posenc.DAPE(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="width"):
        posenc.DAPE(posenc.ALiBi(2), width=0)
    with pytest.raises(ValueError, match="npos_max"):
        posenc.CoPE(8, 0)
    with pytest.raises(ValueError, match="pos_emb"):
        posenc.CoPE(1 << 16, 1 << 16)
    with pytest.raises(ValueError, match="cope has head_dim=4; q has 8 channels"):
        posenc.CoPE(4, 3)(q, torch.zeros(2, 4, 11, 11))
    with pytest.raises(ValueError, match="gates must be"):
        posenc.CoPE(8, 3)(q, torch.zeros(2, 4, 10, 11))
    with pytest.raises(ValueError, match=r"bias must be \(heads, n, m\)"):
        posenc.DAPE(posenc.ALiBi(4))(torch.zeros(1, 4, 3, 3), torch.zeros(4, 3, 2))
    with pytest.raises(ValueError, match=r"scores must be \(batch, heads=4"):
        posenc.DAPE(posenc.ALiBi(4))(torch.zeros(1, 2, 3, 3), None)


def test_empty_results():
    q = torch.randn(0, 2, 5, 8)
    assert posenc.attention(q, q, q, cope=posenc.CoPE(8, 4), causal=True).shape == (0, 2, 5, 8)
    q, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 0)
    dape = posenc.DAPE(posenc.ALiBi(2))
    assert posenc.attention(q, q, v, bias=dape, causal=True).shape == (1, 2, 5, 0)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, no_cuda()])]
)
@pytest.mark.parametrize("name", ["cope", "dape-fire"])
def test_auto_on_the_device_trains_as_the_formula(name, device, small_blocks):
    """What ``backend="auto"`` takes on the device, forward and backward, against the
    dense float64 formula on CPU. FlexAttention has no form of a term that reads the
    scores, so on CUDA "auto" takes the blockwise path there (``make gpu-check`` runs
    the CUDA variant); on CPU, the same path."""
    shape = SHAPES["cache-gqa"]
    q, k, v = inputs(shape, seed=4, grad=True)
    mask = padding(shape[0], shape[4])
    scale = 1 / math.sqrt(shape[5])
    torch.manual_seed(6)
    if name == "cope":
        module = cope_module(shape[5], 6, scale_with_logits=True)
        key = "cope"
        ref = dense_cope(
            q, k, v, module.pos_emb, npos_max=6, scale=scale, scale_with_logits=True, mask=mask
        )
    else:  # FIRE past its threshold: the per-block bias, not a table
        module = posenc.DAPE(posenc.FIRE(shape[1], init_L=4.0), width=8).double()
        key = "bias"
        ref = dense_dape(q, k, v, module, causal=True, scale=scale, mask=mask)
    there = copy.deepcopy(module).to(device)
    qd, kd, vd = (t.detach().to(device).requires_grad_(True) for t in (q, k, v))
    out = posenc.attention(qd, kd, vd, causal=True, attention_mask=mask.to(device), **{key: there})
    assert out.device.type == device and out.dtype == torch.float64
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    trained = [p for p in module.parameters() if p.requires_grad]
    got = torch.autograd.grad(
        out, [qd, kd, vd, *(p for p in there.parameters() if p.requires_grad)], g.to(device)
    )
    want = torch.autograd.grad(ref, [q, k, v, *trained], g)
    assert (out.detach().cpu() - ref.detach()).abs().max() <= F64
    for a, b in zip(got, want, strict=True):
        assert (a.cpu() - b).abs().max() <= F64 * max(1.0, float(b.abs().max()))
