"""The pair-rotation extension point: a rotation that treats queries and keys each its own way.

``posenc.attention(rotary=)`` takes a ``PairRotation``: it is given q and k with their
positions and returns a ``RotatedPair``, whose channels may differ from the inputs' and
whose query may come in several variants, one per (query, key) pair picked by
``choose``. These tests use a toy pair rotation (no family's), written here, against an
explicit float64 softmax; the families' own tests (PoPE, Dual Chunk Attention) check
their methods.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.families.rotary.rotation import RotatedPair, rotate_pair

DTYPE = torch.float64


class Toy:
    """Variant 0 scales q by its position + 1, variant 1 negates it; keys get a third channel
    block of their position. Pairs with an odd key position - query position use variant 1."""

    def __init__(self, variants: int = 2) -> None:
        self.variants = variants

    def rotate_pair(self, q, k, q_positions, k_positions):
        qp = q_positions.to(q.dtype)[..., None, :, None] + 1
        kp = k_positions.to(k.dtype)[..., None, :, None]
        parts = [q * qp, -q][: self.variants]
        q2 = torch.cat([torch.cat((p, p[..., :1] * 0 + 1), -1) for p in parts], -1)
        k2 = torch.cat((k, kp.expand(*k.shape[:-1], 1)), -1)
        if self.variants == 1:
            return RotatedPair(q2, k2)
        qpos, kpos = q_positions, k_positions

        def choose(qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
            # key positions index the given positions (rows 1 here: unpacked)
            offset = kpos.shape[-1] - qpos.shape[-1]
            a = qpos.reshape(-1, qpos.shape[-1])[:, qi - offset]
            b = kpos.reshape(-1, kpos.shape[-1])[:, ki]
            return ((b[:, None, :] - a[:, :, None]) % 2).long()

        return RotatedPair(q2, k2, 2, choose)


def _reference(q, k, v, causal):
    """The toy's attention written out: every pair's score from its own variant."""
    lq, lk, d = q.shape[2], k.shape[2], q.shape[-1]
    offset = lk - lq
    qi = torch.arange(lq)[:, None] + offset
    kj = torch.arange(lk)[None, :]
    one = (q * (qi[None, None] + 1)) @ k.transpose(-1, -2) + kj
    two = -q @ k.transpose(-1, -2) + kj
    s = torch.where((kj - qi) % 2 == 1, two, one) / math.sqrt(d)
    if causal:
        s = s.masked_fill(kj > qi, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
@pytest.mark.parametrize(("lq", "causal"), [(7, True), (3, True), (7, False)])
def test_query_variants_score_each_pair_by_its_own(backend, lq, causal):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, lq, 4, generator=g, dtype=DTYPE, requires_grad=True)
    k, v = (torch.randn(2, 2, 7, 4, generator=g, dtype=DTYPE, requires_grad=True) for _ in "kv")
    out = posenc.attention(q, k, v, rotary=Toy(), causal=causal, backend=backend)
    want = _reference(q, k, v, causal)
    # float64 throughout: a handful of roundings of values below 50
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    wanted = torch.autograd.grad(want.square().sum(), (q, k, v))
    for got, exp in zip(grads, wanted, strict=True):
        torch.testing.assert_close(got, exp, rtol=0, atol=1e-11)


def test_the_variant_matters():
    """Near miss: the same toy scored by variant 0 everywhere is far from the reference."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 6, 4, generator=g, dtype=DTYPE) for _ in "qkv")
    one = posenc.attention(q, k, v, rotary=Toy(1), causal=True)
    assert (one - _reference(q, k, v, True)).abs().max() > 1e-3


def test_gradcheck_through_variants():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 5, 3, generator=g, dtype=DTYPE, requires_grad=True) for _ in "qkv")
    assert torch.autograd.gradcheck(
        lambda q, k, v: posenc.attention(q, k, v, rotary=Toy(), causal=True, backend="blockwise"),
        (q, k, v),
    )


def test_a_rotation_is_adapted_to_the_pair_door():
    rope = posenc.Rotary(8)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8)
    pos = torch.arange(5)
    pair = rotate_pair(rope, q, k, pos[2:], pos)
    want_q, want_k = rope.rotate((q,), pos[2:])[0], rope.rotate((k,), pos)[0]
    assert pair.variants == 1 and pair.choose is None
    torch.testing.assert_close(pair.q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(pair.k, want_k, rtol=0, atol=0)


class _Bad:
    def __init__(self, what):
        self.what = what

    def rotate_pair(self, q, k, q_positions, k_positions):
        if self.what == "type":
            return q, k
        if self.what == "length":
            return RotatedPair(q[:, :, :1], k)
        if self.what == "channels":
            return RotatedPair(torch.cat((q, q[..., :1]), -1), k)
        return RotatedPair(torch.cat((q, q), -1), k, 2, None)


@pytest.mark.parametrize(
    ("what", "error", "match"),
    [
        ("type", TypeError, "must return a RotatedPair"),
        ("length", ValueError, "keep batch, heads and lengths"),
        ("channels", ValueError, "variant"),
        ("choose", ValueError, "choose exactly when variants > 1"),
    ],
)
def test_a_bad_pair_is_refused(what, error, match):
    q = torch.randn(1, 1, 4, 4)
    with pytest.raises(error, match=match):
        posenc.attention(q, q, q, rotary=_Bad(what))


def test_flex_and_reading_terms_are_refused_where_they_cannot_score_variants():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="query variants"):
        posenc.attention(q, q, q, rotary=Toy(), backend="flex")
    with pytest.raises(ValueError, match="reads q's 8 channels"):
        posenc.attention(q, q, q, rotary=Toy(), causal=True, cope=posenc.CoPE(8, 4))
    with pytest.raises(TypeError, match="rotate_pair"):
        posenc.attention(q, q, q, rotary=object())
