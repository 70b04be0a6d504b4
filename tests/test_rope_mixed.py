"""RoPE-Mixed (``posenc.rotary.multiaxis.RoPEMixed``) against timm's ``RotaryEmbeddingMixed``.

timm's module (``timm/layers/pos_embed_sincos.py``, which loads naver-ai/rope-vit's
checkpoints) is the installed reference: its ``freqs`` loads into ours, and its
``get_embed`` tables applied with ``apply_rot_embed_cat`` (as timm's ``Attention``
does on the tokens after the prefix) give the rotated q and k. rope-vit itself
(``models/vit_rope.py``) is not on PyPI; its conventions (``init_random_2d_freqs``
with theta 10 and ``rotate=True``, ``init_t_xy``: x the column, y the row) are
checked through timm's copy and a float64 oracle written from the formula.

Tolerances are derived. timm forms ``theta = fl(fl(x fx) + fl(y fy))`` in float32, off
by at most ``2 * 2**-24 * A`` with ``A = max(|x fx| + |y fy|)``; its cos and sin round
once more (``2**-24``), ours round once from float64. A rotated pair ``(x1 c - x2 s,
x2 c + x1 s)`` scales the table error by ``|x1| + |x2| <= 2 max|q|`` and adds its own
float32 roundings (3 per output, ``3 * 2**-24 * 2 max|q|``), so

    |ours - timm| <= 2 max|q| * 2**-24 * (2 A + 2 + 3).

A gradient in ``freqs`` sums ``x * dtheta`` over the batch and the tokens: the bound
times ``batch * n * max|coord| * max|upstream|``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.families.rotary.multiaxis import RoPEMixed, mixed_cos_sin, mixed_frequencies
from posenc.families.rotary.multiaxis.coordinates import rotate_patches, rotate_tables
from timm_layers import timm_layer

F32 = 2.0**-24


@pytest.fixture(scope="module")
def timm_sincos():
    return timm_layer("pos_embed_sincos")


def _timm_pair(timm_sincos, heads: int, head_dim: int, depth: int, seed: int = 0):
    torch.manual_seed(seed)
    ref = timm_sincos.RotaryEmbeddingMixed(heads * head_dim, depth, heads, grid_indexing="xy")
    ours = RoPEMixed(head_dim, heads, depth=depth)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _timm_rotate(timm_sincos, x, emb, prefix):
    """timm's ``Attention``: the prefix tokens as they are, the rest rotated."""
    rotated = timm_sincos.apply_rot_embed_cat(x[:, :, prefix:], emb)
    return torch.cat([x[:, :, :prefix], rotated], dim=2)


def _bound(freqs: torch.Tensor, coords: torch.Tensor, x_max: float) -> float:
    a = (coords[:, :1].abs().max() * freqs[0].abs().max()) + (
        coords[:, 1:].abs().max() * freqs[1].abs().max()
    )
    return 2 * x_max * F32 * (2 * float(a) + 5)


def _oracle(freqs: torch.Tensor, coords: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The paper's rotation in float64, written from the formula: pair c of head h by
    ``x fx[h, c] + y fy[h, c]``, channels (2c, 2c + 1)."""
    f = freqs.double()
    c = coords.double()
    theta = c[:, 0, None, None] * f[0][None] + c[:, 1, None, None] * f[1][None]  # (n, h, pairs)
    theta = theta.permute(1, 0, 2)  # (h, n, pairs)
    x = x.double()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    y1 = x1 * theta.cos() - x2 * theta.sin()
    y2 = x2 * theta.cos() + x1 * theta.sin()
    return torch.stack([y1, y2], dim=-1).flatten(-2)


@pytest.mark.parametrize(
    ("heads", "head_dim", "depth", "grid", "prefix"),
    [(4, 32, 3, (5, 6), 1), (2, 64, 1, (14, 14), 0), (3, 16, 2, (7, 3), 5)],
)
def test_outputs_and_gradients_equal_timm(timm_sincos, heads, head_dim, depth, grid, prefix):
    ref, ours = _timm_pair(timm_sincos, heads, head_dim, depth)
    coords = ours.coords(*grid)
    n = coords.shape[0]
    emb = ref.get_embed(list(grid)).detach()  # (depth, heads, n, 2 head_dim)
    gen = torch.Generator().manual_seed(1)
    q, k, gq, gk = (torch.randn(2, heads, prefix + n, head_dim, generator=gen) for _ in range(4))
    x_max = float(max(q.abs().max(), k.abs().max()))
    tol = _bound(ours.freqs.detach(), coords, x_max)
    g_max = float(max(gq.abs().max(), gk.abs().max()))
    tol_freqs = tol * 2 * n * float(coords.abs().max()) * g_max * 2  # q and k both
    for block in range(depth):
        qa, ka = q.clone().requires_grad_(), k.clone().requires_grad_()
        qb, kb = q.clone().requires_grad_(), k.clone().requires_grad_()
        want = (_timm_rotate(timm_sincos, qa, emb[block], prefix),
                _timm_rotate(timm_sincos, ka, emb[block], prefix))  # fmt: skip
        got = ours(qb, kb, coords, block_index=block)
        for w, g in zip(want, got, strict=True):
            assert (w - g).abs().max() <= tol
        torch.autograd.backward(want, (gq, gk))
        torch.autograd.backward(got, (gq, gk))
        assert (qa.grad - qb.grad).abs().max() <= tol
        assert (ka.grad - kb.grad).abs().max() <= tol
        assert torch.equal(qb.grad[:, :, :prefix], gq[:, :, :prefix])  # prefix: identity
    # the learned frequencies: all blocks at once, through the same loss
    ref.zero_grad()
    ours.zero_grad()
    emb = ref.get_embed(list(grid))
    loss_ref = sum(
        (_timm_rotate(timm_sincos, x, emb[b], prefix) * g).sum()
        for b in range(depth)
        for x, g in ((q, gq), (k, gk))
    )
    loss_ours = sum(
        (ours(q, k, coords, block_index=b)[i] * g).sum()
        for b in range(depth)
        for i, g in enumerate((gq, gk))
    )
    loss_ref.backward()
    loss_ours.backward()
    assert (ref.freqs.grad - ours.freqs.grad).abs().max() <= tol_freqs


def test_near_misses_fail_at_the_tolerance(timm_sincos):
    ref, ours = _timm_pair(timm_sincos, 4, 32, 1)
    coords = ours.coords(6, 9)
    emb = ref.get_embed([6, 9])[0]
    q = torch.randn(1, 4, 54, 32, generator=torch.Generator().manual_seed(2))
    want = timm_sincos.apply_rot_embed_cat(q, emb)
    tol = _bound(ours.freqs.detach(), coords, float(q.abs().max()))
    assert (ours(q, q, coords)[0] - want).abs().max() <= tol
    swapped = coords.flip(-1)  # (row, column): rope-vit's axes the other way round
    assert (ours(q, q, swapped)[0] - want).abs().max() > 10 * tol
    off = RoPEMixed(32, 4)
    off.load_state_dict(ref.state_dict())
    with torch.no_grad():
        off.freqs[0, 0, 1, 0] *= 1.001  # one frequency of one head off by 0.1%
    assert (off(q, q, coords)[0] - want).abs().max() > tol


def test_float64_oracle_from_the_formula():
    torch.manual_seed(3)
    rope = RoPEMixed(16, 3).double()
    coords = torch.cat([rope.coords(4, 5).double(), torch.tensor([[2.5, -7.25]]).double()])
    q = torch.randn(2, 3, 21, 16, dtype=torch.float64)
    got, _ = rope(q, q, coords)
    # float64 throughout: angles below 40 rad, so cos/sin within 40 * 2**-52
    assert torch.allclose(got, _oracle(rope.freqs[:, 0].detach(), coords, q), rtol=0, atol=1e-12)


def test_initialisation_equals_timms_draws(timm_sincos):
    # timm (and rope-vit) form m, a = 2 pi u and cos/sin in float32: each entry of
    # m cos a within 2**-24 * (2 + 2 * 2 pi + 2) of the exact value: 16 ulps
    torch.manual_seed(4)
    ref = timm_sincos.RotaryEmbeddingMixed(6 * 64, 12, 6)
    torch.manual_seed(4)
    ours = RoPEMixed(64, 6, depth=12)
    assert (ref.freqs - ours.freqs).abs().max() <= 16 * F32
    # the convention: one direction per head and block, pairs of the second half at + pi/2
    f = ours.freqs.detach().double()
    quarter = 16
    mag = torch.tensor([10.0 ** (-4 * j / 64) for j in range(quarter)], dtype=torch.float64)
    for half in (slice(0, quarter), slice(quarter, 2 * quarter)):
        assert torch.allclose(f[0, ..., half].hypot(f[1, ..., half]), mag.expand(12, 6, -1),
                              atol=4 * F32)  # fmt: skip
    dot = f[0, ..., :quarter] * f[0, ..., quarter:] + f[1, ..., :quarter] * f[1, ..., quarter:]
    assert dot.abs().max() <= 4 * F32  # the two directions are orthogonal
    g = torch.Generator().manual_seed(9)
    again = torch.Generator().manual_seed(9)
    assert torch.equal(
        mixed_frequencies(8, 2, generator=g), mixed_frequencies(8, 2, generator=again)
    )


def test_gradcheck_float64():
    torch.manual_seed(5)
    freqs = mixed_frequencies(8, 2).double().requires_grad_()
    coords = torch.tensor([[0.0, 0.0], [1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda f: mixed_cos_sin(f, coords, dtype=torch.float64), (freqs,)
    )
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, f: _rotate_with(f, q, k, coords), (q, k, freqs))
    rope = RoPEMixed(8, 2).double()  # the module: q and k, a class token passing through
    q1 = torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k: rope(q, k, coords), (q1, q1.detach().clone().requires_grad_())
    )


def test_gradcheck_float64_of_the_learned_rotation():
    # the module's own path: posenc's rotation forward, the inverse rotation and the
    # tables' gradients backward (an autograd function), a class token passing through
    torch.manual_seed(10)
    freqs = mixed_frequencies(8, 2).double()[:, 0].requires_grad_()
    coords = torch.tensor([[0.0, 1.0], [1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)
    q = torch.randn(2, 2, 4, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 4, 8, dtype=torch.float64, requires_grad=True)

    def fn(q, k, f):
        tables = lambda c, dtype: mixed_cos_sin(f, c, dtype=dtype)  # noqa: E731
        kw = {"layout": "interleaved", "head_dim": 8, "heads": 2}
        return rotate_patches(tables, q, k, coords, **kw)

    assert torch.autograd.gradcheck(fn, (q, k, freqs))
    for layout in ("half", "interleaved"):  # tables per row, broadcast over heads
        theta = torch.randn(2, 1, 4, 4, dtype=torch.float64, requires_grad=True)

        def rotated(x, theta, layout=layout):
            full = (
                torch.cat([theta, theta], -1)
                if layout == "half"
                else theta.repeat_interleave(2, -1)
            )
            return rotate_tables([x], full.cos(), full.sin(), layout=layout)

        assert torch.autograd.gradcheck(rotated, (q, theta))


def _rotate_with(freqs, q, k, coords):
    cos, sin = mixed_cos_sin(freqs, coords, dtype=torch.float64)
    return (posenc.apply_rotary(q, cos, sin, layout="interleaved"),
            posenc.apply_rotary(k, cos, sin, layout="interleaved"))  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(
    shift=st.tuples(st.integers(-20, 20), st.integers(-20, 20)),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_on_coordinate_differences_only(shift, seed):
    torch.manual_seed(seed)
    rope = RoPEMixed(16, 2)
    coords = rope.coords(3, 3)
    moved = coords + torch.tensor(shift, dtype=torch.float32)
    q, k = torch.randn(2, 1, 2, 9, 16)
    a = torch.einsum("bhnd,bhmd->bhnm", *rope(q, k, coords))
    b = torch.einsum("bhnd,bhmd->bhnm", *rope(q, k, moved))
    # both within the bound of the exact rotation: |angle| <= 2 * 22 * max|f| = 44 rad
    tol = 2 * 16 * float(q.abs().max() * k.abs().max()) * F32 * (2 * 44 + 5)
    assert (a - b).abs().max() <= tol


def _attention64(q, k, v, causal):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_its_rotation_equals_float64_softmax(causal):
    torch.manual_seed(6)
    rope = RoPEMixed(32, 4)
    coords = torch.cat([torch.zeros(1, 2), rope.coords(4, 5)])  # a class token at (0, 0)
    q, k, v = torch.randn(3, 2, 4, 21, 32)
    out = posenc.attention(q, k, v, rotary=rope.rotation(coords), causal=causal)
    f = rope.freqs[:, 0].detach()
    want = _attention64(_oracle(f, coords, q), _oracle(f, coords, k), v.double(), causal)
    # float32 scores: q, k rotated within the rotation bound (|x| <= 5, A <= 14 rad),
    # each score a 32-term dot product (32 * 2**-24 relative) scaled by 1/sqrt(32);
    # softmax and the value average add a few ulps of max|v|
    rot = _bound(f, coords, 5.0)
    score_err = (2 * rot * 5 + 32 * 25 * F32) * 32 / math.sqrt(32)
    tol = float(v.abs().max()) * (2 * score_err + 8 * F32)
    assert (out.double() - want).abs().max() <= tol
    # and as the module's own forward: the same rotation
    q2, _ = rope(q, k, coords[1:])
    assert torch.equal(q2[:, :, 0], q[:, :, 0])


def test_a_timm_state_dict_round_trips():
    torch.manual_seed(7)
    rope = RoPEMixed(16, 2, depth=3)
    assert list(rope.state_dict()) == ["freqs"]
    assert rope.freqs.shape == (2, 3, 2, 8)
    fresh = RoPEMixed(16, 2, depth=3)
    fresh.load_state_dict(rope.state_dict())
    assert torch.equal(fresh.freqs, rope.freqs)


def test_rope_vits_flat_freqs_load():
    # rope-vit (models/vit_rope.py) stacks each block's (heads, head_dim / 2) frequencies
    # and views them as (2, depth, heads * head_dim / 2); compute_mixed_cis views them back
    torch.manual_seed(8)
    rope = RoPEMixed(16, 3, depth=2)
    flat = rope.freqs.detach().reshape(2, 2, 3 * 8).clone()
    fresh = RoPEMixed(16, 3, depth=2)
    fresh.load_state_dict({"freqs": flat})
    assert torch.equal(fresh.freqs, rope.freqs)
    coords = rope.coords(2, 3)
    t_x, t_y = coords[:, 0], coords[:, 1]
    # compute_mixed_cis: (t @ f).view(depth, n, heads, -1).permute(0, 2, 1, 3), summed
    angle = sum(
        (t.unsqueeze(-1) @ f.unsqueeze(-2)).view(2, 6, 3, -1).permute(0, 2, 1, 3)
        for t, f in ((t_x, flat[0]), (t_y, flat[1]))
    )
    cos, _ = fresh.cos_sin(coords, block_index=1)
    assert (cos[..., 0::2] - angle[1].cos()).abs().max() <= 4 * F32 * (1 + angle.abs().max())


def test_errors():
    with pytest.raises(ValueError, match="multiple of 4"):
        RoPEMixed(18, 2)
    with pytest.raises(ValueError, match="num_heads"):
        RoPEMixed(16, 0)
    with pytest.raises(TypeError, match="rotate"):
        RoPEMixed(16, 2, rotate=1)
    rope = RoPEMixed(16, 2, depth=2)
    q = torch.randn(1, 2, 4, 16)
    coords = rope.coords(2, 2)
    with pytest.raises(ValueError, match="block_index"):
        rope(q, q, coords, block_index=2)
    with pytest.raises(TypeError, match="block_index"):
        rope(q, q, coords, block_index=True)
    with pytest.raises(ValueError, match="heads=2"):
        rope(torch.randn(1, 3, 4, 16), q, coords)
    with pytest.raises(ValueError, match="only 4 tokens"):
        rope(q, q, rope.coords(3, 2))
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        rope(q, q, torch.zeros(4, 3))
    with pytest.raises(TypeError, match="coords"):
        rope(q, q, torch.zeros(4, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="finite"):
        rope(q, q, torch.full((4, 2), float("nan")))
    with pytest.raises(ValueError, match="fx and fy"):
        mixed_cos_sin(torch.zeros(3, 2, 4), coords)
    with pytest.raises(ValueError, match="positions index"):
        rope.rotation(coords).rotate([q], torch.arange(5))
