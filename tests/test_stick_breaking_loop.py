"""The compiled stick-breaking loop (core/csrc/breaking.c) against float64 and the blocks.

float32 CPU inputs whose head_dim and v_dim are multiples of 16 take the compiled
loop, forward and backward; everything else takes the blockwise torch path. Each
case runs the loop on float32-exact inputs and compares ``out``, ``rem`` and the
gradients of ``q``, ``k``, ``v`` (for the loss ``sum dout . out + drem rem``) with:

- posenc's blockwise path in float64 (ground truth within
  test_stick_breaking.grad_bounds at u = 2**-53): the loop is one float32
  computation of the same formulas, so the sum of grad_bounds at u = 2**-24 and at
  u = 2**-53 bounds the difference. That derivation holds for any order of the sums
  and for the loop's own pieces: its softplus ``max(z, 0) + log1p(exp(-|z|))``
  (Goldberg's log1p: exp512 within 2 ulp, Cephes' log within 1 ulp, a division, a
  product and the add: within the 6 u relative grad_bounds allows for exp, log1p
  and the subtraction, since d log1p(x) / dx <= 1 and x <= 1 take exp's error in
  at most once), its sigmoid ``x / (1 + x)`` or ``1 / (1 + x)`` (x = exp(-|z|):
  within 8 u as grad_bounds allows) and its exp of log A (2 ulp = 4 u against the
  2 u grad_bounds' first order allows, covered by its factor 2 for second-order
  terms while alpha < 1e-3: 2 u of 2 * (alpha + 2 u) >= alpha + 4 u). A weight or
  product flushed to 0 (below 2**-125, the loop's exp cut-off and flush-to-zero) is
  below the unit roundoff times any live weight of its row; a row with no live
  weight has every bound term near 0, and only the large-|z| case could make one:
  its draws keep |z| under 20, far from the cut-off (87);
- the same blockwise path in float32 (the compiled loop switched off): two float32
  computations, twice grad_bounds at u = 2**-24;
- the dense float64 reference formula (test_stick_breaking.dense) for out and
  rem: test_stick_breaking.bound at u = 2**-24 (the loop) plus at u = 2**-53 (dense).

grad_bounds knows no documents: a packed run's bounds are each document's alone,
concatenated along the sequence (a query sees, and a key is seen by, its own
document only). Every verdict is also tested on a near miss: the reference moved to
just above its bound at one element must fail, just below must pass.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import posenc
from posenc.core.kernels import compiled
from posenc.integration.attention import stick_breaking as sb
from test_stick_breaking import U32, U64, bound, dense, grad_bounds

pytestmark = pytest.mark.skipif(
    compiled is None or not hasattr(compiled, "breaking"), reason="no compiled kernels"
)

NAMES = ("out", "rem", "dq", "dk", "dv")

# (batch, heads, kv_heads, q_len, k_len, head_dim, v_dim) and the call's options;
# lengths past one block of 64 queries and of 64 keys, none a multiple of 16
CASES = {
    "plain": {"shape": (1, 2, 2, 70, 70, 16, 16)},
    "current": {"shape": (1, 2, 2, 70, 70, 16, 16), "attend_current": True},
    "cache-gqa": {"shape": (2, 4, 2, 37, 70, 16, 32)},
    "cache-current": {"shape": (1, 2, 1, 5, 69, 16, 32), "attend_current": True},
    "gqa": {"shape": (1, 6, 2, 70, 70, 16, 16)},
    # an empty document, one of one token (its query sees nothing), two across blocks
    "packed": {"shape": (2, 4, 2, 70, 70, 16, 16), "cu_seqlens": [0, 3, 3, 4, 50, 70]},
    "packed-current": {
        "shape": (1, 2, 1, 70, 70, 16, 16),
        "cu_seqlens": [0, 1, 66, 70],
        "attend_current": True,
    },
    # scale 10, q and k drawn at 0.3: |z| in the tens, saturated sigmoids
    "large-z": {"shape": (1, 2, 2, 24, 24, 16, 16), "scale": 10.0, "spread": 0.3},
    "one": {"shape": (1, 2, 1, 1, 1, 16, 16), "attend_current": True},
    "nothing": {"shape": (1, 1, 1, 1, 1, 16, 16)},  # the one query sees no key
}


def draw(case, seed=0):
    """q, k, v, dout, drem: float32 draws held in float64 (float32-exact)."""
    b, h, hk, lq, lk, d, dv = case["shape"]
    gen = torch.Generator().manual_seed(seed)
    spread = case.get("spread", 1.0)
    sizes = ((b, h, lq, d), (b, hk, lk, d), (b, hk, lk, dv), (b, h, lq, dv), (b, h, lq))
    q, k, v, dout, drem = (torch.randn(s, generator=gen) for s in sizes)
    q, k = (t * spread for t in (q, k))
    return [t.double() for t in (q, k, v, dout, drem)]


def options(case):
    opts = {key: case[key] for key in ("attend_current", "scale") if key in case}
    if "cu_seqlens" in case:
        opts["cu_seqlens"] = torch.tensor(case["cu_seqlens"])
    return opts


def run(q, k, v, dout, drem, dtype, **opts):
    """out, rem, dq, dk, dv of posenc in dtype, as float64."""
    ts = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, rem = posenc.stick_breaking_attention(*ts, **opts)
    grads = torch.autograd.grad((out, rem), ts, (dout.to(dtype), drem.to(dtype)))
    return [t.detach().double() for t in (out, rem, *grads)]


def bounds(q, k, v, dout, drem, u, *, attend_current=False, scale=None, cu_seqlens=None):
    """grad_bounds at u, document by document with packing."""
    opts = dict(attend_current=attend_current, scale=scale, u=u)
    if cu_seqlens is None:
        return grad_bounds(q, k, v, dout, drem, **opts)
    parts = [
        grad_bounds(*(t[:, :, a:b] for t in (q, k, v, dout, drem)), **opts)
        for a, b in itertools.pairwise(cu_seqlens.tolist())
        if b > a
    ]
    return [torch.cat(p, 2) for p in zip(*parts, strict=True)]


def within(got, want, limit):
    """Whether every element of got is within limit of want (elementwise)."""
    return bool(((got - want).abs() <= limit).all())


def assert_near(got, want, limits, names=NAMES):
    for name, a, w, lim in zip(names, got, want, limits, strict=False):
        worst = float(((a - w).abs() / lim).nan_to_num(nan=0.0, posinf=math.inf).max())
        assert within(a, w, lim), f"{name}: {worst:.3g} x its bound"


@pytest.fixture
def counted(monkeypatch):
    """Counts the compiled loop's forward and backward calls."""
    calls = {"forward": 0, "backward": 0}
    forward, backward = sb._loop_forward, sb._loop_backward

    def count_forward(*args):
        calls["forward"] += 1
        return forward(*args)

    def count_backward(*args):
        calls["backward"] += 1
        return backward(*args)

    monkeypatch.setattr(sb, "_loop_forward", count_forward)
    monkeypatch.setattr(sb, "_loop_backward", count_backward)
    return calls


def references(case, q, k, v, dout, drem, monkeypatch):
    """``(label, values, limits)`` per verdict: the float64 blocks (all five), the
    float32 blocks (all five) and the dense float64 formula (out and rem)."""
    opts = options(case)
    f32, f64 = (bounds(q, k, v, dout, drem, u, **opts) for u in (U32, U64))
    exact = run(q, k, v, dout, drem, torch.float64, **opts)
    with monkeypatch.context() as m:
        m.setattr(sb, "_loop_applies", lambda *args: False)
        blocks = run(q, k, v, dout, drem, torch.float32, **opts)
    cu, scale = case.get("cu_seqlens"), case.get("scale")
    ref = dense(q, k, v, attend_current=opts.get("attend_current", False), scale=scale,
                cu_seqlens=cu)  # fmt: skip
    lk = case["shape"][4] if cu is None else max(b - a for a, b in itertools.pairwise(cu))
    tols = [sum(bound(q, k, t, scale, u=u, lk=lk) for u in (U32, U64)) for t in (v, torch.ones(1))]
    return [
        ("float64 blocks", exact, [a + b for a, b in zip(f32, f64, strict=True)]),
        ("float32 blocks", blocks, [2 * b for b in f32]),
        ("dense", list(ref), [torch.full_like(r, t) for r, t in zip(ref, tols, strict=True)]),
    ]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_loop_within_the_bounds_of_float64_and_the_blocks(case, counted, monkeypatch):
    q, k, v, dout, drem = draw(case)
    if "scale" in case:  # the module docstring's claim: far from the exp cut-off
        group = q.shape[1] // k.shape[1]
        z = q @ k.repeat_interleave(group, 1).mT * case["scale"]
        assert 10 < float(z.abs().max()) < 20
    got = run(q, k, v, dout, drem, torch.float32, **options(case))
    assert counted == {"forward": 1, "backward": 1}
    # the references take the blocks: float64, and float32 with the loop switched off
    for label, want, limits in references(case, q, k, v, dout, drem, monkeypatch):
        assert_near(got[: len(want)], want, limits, [f"{label}: {n}" for n in NAMES])
    assert counted == {"forward": 1, "backward": 1}


@pytest.mark.parametrize("case", ["plain", "packed", "large-z"])
def test_near_misses_fail(case, monkeypatch):
    # every verdict: a reference moved to just above its bound at one element fails,
    # just below passes
    case = CASES[case]
    q, k, v, dout, drem = draw(case, seed=1)
    for label, want, limits in references(case, q, k, v, dout, drem, monkeypatch):
        for name, w, lim in zip(NAMES, want, limits, strict=False):
            at = int(lim.flatten().argmax())
            for factor, verdict in ((1 + 2**-20, False), (1 - 2**-20, True)):
                moved = w.clone()
                moved.view(-1)[at] += lim.view(-1)[at] * factor
                assert within(moved, w, lim) is verdict, f"{label}: {name}"


def test_the_loop_alone_serves_float32(monkeypatch):
    # the blocks fail if called: float32 with dims multiple of 16 never reaches them
    def no_blocks(*args):
        raise AssertionError("the blockwise path ran")

    monkeypatch.setattr(sb, "_forward", no_blocks)
    monkeypatch.setattr(sb, "_backward", no_blocks)
    case = CASES["packed"]
    q, k, v, dout, drem = draw(case)
    got = run(q, k, v, dout, drem, torch.float32, **options(case))
    assert all(torch.isfinite(t).all() for t in got)
    # head_dim 8: no loop, the blocks
    with pytest.raises(AssertionError, match="blockwise"):
        run(q[..., :8], k[..., :8], v, dout, drem, torch.float32)
    with pytest.raises(AssertionError, match="blockwise"):
        run(q, k, v, dout, drem, torch.float64)


def test_queries_that_see_nothing_get_the_whole_stick():
    # the first query (no key before it) and a one-token document's: out 0 and rem 1
    # exactly, and no gradient reaches q through them
    case = CASES["packed"]
    q, k, v, dout, drem = draw(case)
    out, rem, dq, _, _ = run(q, k, v, dout, drem, torch.float32, **options(case))
    for i in (0, 3, 4):  # document starts: 0, 3 (one token), 4
        assert torch.equal(out[:, :, i], torch.zeros_like(out[:, :, i]))
        assert torch.equal(rem[:, :, i], torch.ones_like(rem[:, :, i]))
        assert torch.equal(dq[:, :, i], torch.zeros_like(dq[:, :, i]))


@pytest.mark.parametrize("scale", [16.0, 0.25])
def test_long_sequences_stay_finite(scale, counted):
    # test_stick_breaking's test of the same name, at head_dim 16 for the loop: scale
    # 16 puts |z| in the hundreds, past exp's cut-off; scale 1/4 underflows rem. Integer
    # q and k and a power-of-two scale make z exact in float32 (its bound below: the
    # float32 sums of L terms, without the score term)
    length = 1024
    gen = torch.Generator().manual_seed(8)
    q = torch.randint(-2, 3, (1, 2, length, 16), generator=gen).float()
    k = torch.randint(-2, 3, (1, 2, length, 16), generator=gen).float()
    v = torch.randn(1, 2, length, 16, generator=gen)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, rem = posenc.stick_breaking_attention(*leaves, scale=scale)
    ref_out, ref_rem = dense(q.double(), k.double(), v.double(), scale=scale)
    tol = U32 * ((length + 2) * (math.log(length) + 1) + length + 1)
    qd, kd, vd = q.double(), k.double(), v.double()
    vmax = v.abs().max().item()
    assert (out.double() - ref_out).abs().max().item() <= tol * vmax + bound(qd, kd, vd, scale)
    assert (rem.double() - ref_rem).abs().max().item() <= tol + bound(qd, kd, torch.ones(1), scale)
    assert ((rem >= 0) & (rem <= 1)).all()
    (out.sum() + rem.sum()).backward()
    assert counted == {"forward": 1, "backward": 1}
    for t in leaves:
        assert torch.isfinite(t.grad).all()


def test_strided_inputs_equal_contiguous_ones(counted):
    # (batch, seq, heads, dim) memory seen as (batch, heads, seq, dim), fla's layout:
    # the loop reads the strides, so the forward is the same arithmetic bit for bit;
    # dk and dv sum the threads' buffers in the order the threads took the units, so
    # the gradients agree within two float32 computations' bounds
    case = CASES["cache-gqa"]
    q, k, v, dout, drem = draw(case)
    flat = run(q, k, v, dout, drem, torch.float32)
    strided = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    assert not strided[0].float().is_contiguous()  # as run hands it to posenc
    got = run(*strided, dout, drem, torch.float32)
    assert counted == {"forward": 2, "backward": 2}
    assert torch.equal(got[0], flat[0]) and torch.equal(got[1], flat[1])
    f32 = grad_bounds(q, k, v, dout, drem, u=U32)
    assert_near(got[2:], flat[2:], [2 * b for b in f32[2:]], NAMES[2:])


# dynamo reads .grad of the non-leaf tensors it hands to the frame after a graph break
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_inside_torch_compile_the_loop_runs_behind_a_graph_break(counted):
    # the same loop on the same inputs, and around it only an exact doubling: out, rem
    # and dq (a unit owns its queries' dq, summed over the keys in one order) bit for
    # bit; dk and dv sum the threads' buffers in the order the threads took the
    # units, so they are left out
    q, k, v, dout, drem = draw(CASES["cache-gqa"])
    q, k, v = (t.float().requires_grad_() for t in (q, k, v))
    dout, drem = dout.float(), drem.float()

    def layer(q, k, v):
        return posenc.stick_breaking_attention(q * 2, k, v)

    got = torch.compile(layer)(q, k, v)
    (dq_got,) = torch.autograd.grad(got, [q], (dout, drem))
    assert counted == {"forward": 1, "backward": 1}
    want = layer(q, k, v)
    (dq_want,) = torch.autograd.grad(want, [q], (dout, drem))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(dq_got, dq_want)
