"""posenc.attention through compiled FlexAttention on CUDA, forward and backward.

``backend="flex"`` (what ``"auto"`` takes on a GPU) against softmax attention
computed densely in float64 on the same device (scores, bias, masks, softmax),
gradients of q, k, v and of the bias module's parameters included, for every
bias: ALiBi, T5, KERPLE, Sandwich, FIRE with every query below its threshold L
(a table) and with queries on both sides of it (its pieces), NoPE; and a user's
term with no table (``Decay``), whose parameter the score mod reads. The inputs
combine the causal mask, left padding, grouped-query attention and a KV cache
(64 keys before the first query); packed documents run bidirectional. Each
error bound is derived from the roundings of the kernel's arithmetic (see
``bounds``). FlexAttention compiles per distinct score mod, mask mod and dtype:
the biases share four graphs (a table with and without a gradient, FIRE's
pieces, none), and the shapes stay small.

Each test runs twice: on CUDA (marked ``gpu``, skipped without a device; ``make
gpu-check`` runs it) and on CPU tensors in the CPU suite, where FlexAttention runs
eager and forward only (``on_cpu`` says why and what stays GPU-only).
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator

import pytest
import torch
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import create_block_mask

import posenc
from conftest import one_thread
from gpu_markers import no_cuda
from posenc.families.bias import FIRE, KERPLE, NoPE, Sandwich, T5Bias
from posenc.families.bias.modules import ALiBi
from posenc.families.terms import TermContext, TermForm
from posenc.integration.attention import flex as flex_engine

NO_CUDA = no_cuda()
BACKEND = "flex"


@pytest.fixture(
    params=[
        # FlexAttention eager (unfused) on CPU tensors, forward only: see on_cpu
        pytest.param(
            "cpu",
            marks=pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
        ),
        pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA]),
    ]
)
def device(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[torch.device]:
    """Where a test runs: CUDA (marked ``gpu``: ``make gpu-check``), or on_cpu's CPU."""
    if request.param == "cuda":
        yield torch.device("cuda")
        return
    on_cpu(monkeypatch)
    with one_thread():  # the CPU variant's tensors are small
        yield torch.device("cpu")


def on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU variant, which the CPU suite runs: posenc's flex path (score and mask
    mods, block masks, the bias tables it captures) through FlexAttention's eager
    implementation, forward only, against the same float64 reference and bounds.

    What stays GPU-only: the gradients, since torch refuses FlexAttention's backward
    on CPU tensors, compiled or eager (tests/test_attention_backward.py pins that),
    and the compiled kernel, which inductor generates for CPUs as C++ instead of the
    GPU's Triton and which takes seconds to compile per graph here (the CPU's compiled
    forward is checked in tests/test_attention.py and tests/test_flex_cache.py).
    Eager FlexAttention computes the scores, softmax and sums in float32 (float64 for
    float64 inputs) as the kernel does, materialised: the bounds, derived for any
    order of the sums, hold for it.
    """
    monkeypatch.setattr(flex_engine, "compiled", lambda fn: fn)


U = 2.0**-24  # float32 unit roundoff: FlexAttention's scores, softmax and sums
# the unit roundoff of what FlexAttention rounds to the inputs' dtype: the weights
# before their product with v, dS before its products with q and k, the outputs
ROUNDING = {torch.float32: 0.0, torch.bfloat16: 2.0**-8}

# (batch, heads, kv_heads, q_len, k_len, head_dim, v_dim)
SHAPE = (2, 4, 2, 192, 256, 64, 64)
# the CPU variant's: the same lengths (the cache, padding, documents and FIRE's
# threshold are positions), fewer and narrower heads, for time (on_cpu)
CPU_SHAPE = (2, 2, 1, 192, 256, 32, 16)
# packed documents of the bidirectional test (q_len = k_len): an empty one, one
# all padding in the last row, ones across FlexAttention's blocks of 128
CU = [0, 37, 37, 160, SHAPE[4]]

BIASES = {
    "alibi": lambda h: ALiBi(h),
    "t5": lambda h: T5Bias(h),
    "kerple": lambda h: KERPLE(h),
    "sandwich": lambda h: Sandwich(h, dim=16),
    # every query below L: a table over key - query
    "fire-below": lambda h: bent(FIRE(h, mlp_width=8, init_L=1e4)),
    # queries at positions 64 .. 255, L = 128: FIRE's pieces
    "fire-past": lambda h: bent(FIRE(h, mlp_width=8, init_L=128.0)),
    "nope": lambda h: NoPE(h),
}


def bent(fire):
    """FIRE with its MLP's bends at x = 0.05 .. 0.45, inside the range of x (psi(|i - j|)
    over psi(max(L, i)) here: up to 0.47 below L = 1e4, 1.25 about L = 128): pieces to
    search between, units that switch on and off."""
    first = fire.mlp[0]
    with torch.no_grad():
        first.bias.copy_(-first.weight[:, 0] * torch.linspace(0.05, 0.45, first.out_features))
    return fire


@pytest.fixture(autouse=True)
def ieee_float32():
    """IEEE float32 products: FlexAttention reads the matmul precision when it
    compiles, and TF32 (10-bit mantissas) would void the float32 bounds.

    Through set_float32_matmul_precision, which keeps torch's legacy and new
    flags consistent whichever the process set (torch refuses a mix).
    """
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)


def trainable(bias):
    return [p for p in bias.parameters() if p.requires_grad]


def make(shape, dtype, seed, device, cu=None):
    """q, k, v, the output's gradient, the key padding, and each key's document and
    position in it (one document without ``cu``)."""
    b, h, hk, lq, lk, d, dv = shape
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = (
        torch.randn(s, generator=gen).to(device, dtype)
        for s in ((b, h, lq, d), (b, hk, lk, d), (b, hk, lk, dv), (b, h, lq, dv))
    )
    mask = torch.ones(b, lk, dtype=torch.bool, device=device)
    mask[-1, : lk // 3] = False  # the last row left-padded
    # each key's document and position in it, computed here, not by posenc
    ids = torch.zeros(lk, dtype=torch.long, device=device)
    local = torch.arange(lk, device=device)
    for n, (a, e) in enumerate(itertools.pairwise(cu or [0, lk])):
        ids[a:e] = n
        local[a:e] = torch.arange(e - a, device=device)
    return q, k, v, dout, mask, ids, local


def allowed_pairs(mask, ids, lq, lk, causal):
    """(batch, 1, q_len, k_len): which keys each query sees, queries bottom-right."""
    at = torch.arange(lk - lq, lk, device=mask.device)  # each query's key position
    keys = torch.arange(lk, device=mask.device)
    allowed = mask[:, None, None, :] & (ids[keys][None, :] == ids[at][:, None])
    if causal:
        allowed = allowed & (keys[None, :] <= at[:, None])
    return allowed


def dense(q, k, v, block, allowed, scale):
    """softmax(q k^T scale + bias, masked) v in float64; a row that sees no key gives 0."""
    h, hk = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    s = q @ k.transpose(-1, -2) * scale
    if block is not None:
        s = s + block
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0)
    return p @ v


def bounds(q, k, v, dout, block, allowed, scale, *, bias_error, rounding, backward=True):
    """Per-element error bounds of FlexAttention's output and q, k, v gradients (the
    output's alone, a 1-tuple, without ``backward``).

    The inputs as float64 (exactly the values the kernel reads); ``block`` the
    float64 bias (heads, q_len, k_len); ``bias_error`` a bound of its float32
    evaluation (a number or per score); ``rounding`` the unit roundoff of what
    the kernel rounds to the inputs' dtype (0 for float32). A running error
    analysis, first order in U, each quantity carrying its own roundings and its
    inputs' errors, every sum bounded by n units times the sum of its terms'
    magnitudes (``dot``: U per addition of a float32 product, 2 U with bfloat16
    operands, whose tensor-core sums need not round to nearest):

    - score s = q . k * scale + bias: es = D dot scale |q|.|k| + bias_error +
      2 U (|q . k scale| + |s|);
    - an unnormalised weight exp2(s / ln 2 - max) is off by ew = es + U (2 |s| +
      |lse|) + 16 U relative (the products by 1 / ln 2, exp2, a few U each);
    - out = sum_j w_j v_j / sum_j w_j moves by sum_j P_j (ew_j + mean ew) |v_j|,
      plus the two sums' (2 k_len + 20) U, the division's 4 U, and in bfloat16
      the weights rounded before P v and the output rounded, a rounding each;
    - lse (saved for the backward) is off by mean ew + (k_len + 16) U + 2 U |lse|,
      so the backward's P by ep = ew + that, relative;
    - dP = dO . v is off by DV dot |dO|.|v|; delta = dO . out (the output as
      returned) by |dO|.err out + DV U |dO|.|out|;
    - dS = P (dP - delta) by E = P (ep |dP - delta| + err dP + err delta + 2 U
      |dP - delta|);
    - dq = sum_j (dS_j scale) k_j: scale (E.|k| + ((k_len + 4) dot + r) |dS|.|k|)
      + (4 U + r) |dq| (dS rounded to the inputs' dtype, dq rounded); dk likewise
      over the group's heads and queries; dv = sum_i P_i dO_i: (P ep).|dO| +
      ((group q_len + 2) dot + r) P.|dO| + (4 U + r) |dv|.

    Each bound is doubled for the second-order terms. Returns the bounds of out,
    dq, dk, dv, and what param_bounds reads: |dS| and P per score (batch,
    heads, q_len, k_len; zero where masked), sum_c (dO out)^2 per query.
    """
    b, h, lq, d = q.shape
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    group, r = h // hk, rounding
    dot = 2 * U if r else U
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    qa, ka, va, da = (t.abs() for t in (q, kk, vv, dout))

    def grouped(t):  # (batch, heads, k_len, n) summed over each kv head's group
        return t.view(b, hk, group, lk, -1).sum(2)

    s0 = q @ kk.transpose(-1, -2) * scale
    s = s0 if block is None else s0 + block
    s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse.nan_to_num(0.0, neginf=0.0))
    s, s0 = s.masked_fill(~allowed, 0.0), s0.masked_fill(~allowed, 0.0)
    lse = lse.masked_fill(~lse.isfinite(), 0.0)

    es = d * dot * scale * (qa @ ka.transpose(-1, -2)) + bias_error + 2 * U * (s0.abs() + s.abs())
    ew = es + U * (2 * s.abs() + lse.abs()) + 16 * U
    mean = (p * ew).sum(-1, keepdim=True)
    out, pv = p @ vv, p @ va
    t_out = (p * ew) @ va + mean * pv + ((2 * lk + 20) * U + r) * pv + (4 * U + r) * out.abs()
    if not backward:
        return (2 * t_out,)
    ep = ew + mean + (lk + 16) * U + 2 * U * lse.abs()

    dp = dout @ vv.transpose(-1, -2)
    gap = (dp - (dout * out).sum(-1, keepdim=True)).abs()
    err_dp = dv * dot * (da @ va.transpose(-1, -2))
    err_delta = (da * t_out).sum(-1, keepdim=True) + dv * U * (da * out.abs()).sum(-1, keepdim=True)
    err_ds = p * (ep * gap + err_dp + err_delta + 2 * U * gap)
    ds = p * gap  # |dS|
    dq = scale * (ds @ ka)
    tq = scale * (err_ds @ ka) + ((lk + 4) * dot + r) * dq + (4 * U + r) * dq
    dk = scale * grouped(ds.transpose(-1, -2) @ qa)
    tk = scale * grouped(err_ds.transpose(-1, -2) @ qa)
    tk = tk + ((group * lq + 4) * dot + r) * dk + (4 * U + r) * dk
    dvs = grouped(p.transpose(-1, -2) @ da)
    tv = grouped((p * ep).transpose(-1, -2) @ da) + ((group * lq + 2) * dot + r) * dvs
    tv = tv + (4 * U + r) * dvs
    do_out = (dout * out).square().sum(-1)
    return 2 * t_out, 2 * tq, 2 * tk, 2 * tv, ds, p, do_out


def fire_x(bias64, q_pos, k_pos):
    """FIRE's MLP input x (q_len, k_len) and the magnitude of its bias's terms (heads,
    q_len, k_len), which bounds the float32 evaluation's error."""
    x = bias64._normalised(q_pos[:, None], k_pos[None, :])
    first, last = bias64.mlp[0], bias64.mlp[2]
    w, c = first.weight[:, 0].detach(), first.bias.detach()
    # sum_u |W2 (w x + c)| + |b2| bounds every float32 term of the bias: the MLP
    # evaluated unit by unit (the table) or one piece's slope x + intercept
    size = torch.einsum("hu,uqk->hqk", last.weight.detach().abs(),
                        w.abs()[:, None, None] * x.detach() + c.abs()[:, None, None])  # fmt: skip
    return x.detach(), size + last.bias.detach().abs()[:, None, None]


def bias_tensors(bias64, form, q_pos, lq, lk):
    """The float64 tensors posenc hands FlexAttention's score mod, as functions of the
    module's trainable parameters: the table (heads, q_len + k_len - 1) over key -
    query, or FIRE's pieces (its table, scale per query, slopes, intercepts)."""
    rel = torch.arange(-(lk - 1), lq, device=q_pos.device)

    class Tensors(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = bias64

        def forward(self):
            if form == "table":
                return (self.bias.relative_bias(rel),)
            f = self.bias.scaled_form(q_pos, rel)
            return f.table, f.scale, f.slopes, f.intercepts

    names = [n for n, p in bias64.named_parameters() if p.requires_grad]
    values = [p.detach() for n, p in bias64.named_parameters() if p.requires_grad]
    module = Tensors()

    def tensors(*vals):
        return torch.func.functional_call(
            module, {f"bias.{n}": t for n, t in zip(names, vals, strict=True)}, ()
        )

    return tensors(*values), torch.func.jacrev(tensors, argnums=tuple(range(len(names))))(*values)


def param_bounds(bias64, form, q_pos, d, ds, p, do_out, rounding):
    """Tolerances of the bias parameters' float32 gradients: per parameter, a few
    hundred U times the magnitude of the terms its gradient sums.

    FlexAttention scatters each score's dS times the score's derivative in
    each tensor it reads (the table; FIRE's table, scale, slopes, intercepts)
    into that tensor's gradient by float32 atomic adds (of float32 dS, bfloat16
    inputs too); autograd carries those on to the parameters in float32. A
    parameter's gradient sums over the scores s the terms dS_s G_s, G_s =
    sum_t |d t_e / d param| |d s / d t_e| over the tensors t (e the entry s
    reads); M = sum_s |dS_s| G_s is their magnitude. The worst-case bound of
    bounds() is of no use here: the terms cancel (dS sums to 0 along each row),
    FIRE's c by a factor 10**4, and first-order worst cases overshoot the real
    error a thousandfold, which would leave tolerances above the gradients.
    Instead:

    - each term is off by a few hundred U relative, as one output element
      (its score a head_dim-term product, its weight normalised over k_len
      keys): (head_dim + k_len + 16) U;
    - the sums of n float32 terms (a table entry: the batch's queries on one
      diagonal, then every entry; a piece: every score) in whatever order the
      atomics take are off by at most lambda sqrt(n) U of their magnitude
      except with probability 2 n exp(-lambda**2 / 2) (Higham and Mary's
      probabilistic rounding analysis, 2019): lambda = 8, below 1e-8 here. The
      worst case n U needs every rounding to go one way;
    - bfloat16: delta_i = dO_i . out_i reads the output rounded to bfloat16,
      each element's rounding a relative r, and moves every dS_ij of its row by
      P_ij times the error: the gradient by sum over rows and channels of
      dO out w r_channel, w = sum_j P_ij G_ij; independent roundings of mean
      zero (the same model) keep that within lambda r sqrt(sum (dO out w)^2).

    Doubled: 2 (head_dim + k_len + 16 + 8 sqrt(n)) U M (+ 2 * 8 r sqrt(...)).
    ``p`` the weights and ``do_out`` sum_c (dO out)^2 per row, from bounds.
    """
    b, h, lq, lk = ds.shape
    n = b * lq * lk + h * (lq + lk) if form == "scaled" else b * min(lq, lk) + h * (lq + lk)
    k_pos = torch.arange(lk, device=q_pos.device)
    entry = k_pos[None, :] - torch.arange(lk - lq, lk, device=q_pos.device)[:, None] + lk - 1
    tensors, jac = bias_tensors(bias64, form, q_pos, lq, lk)
    with torch.no_grad():
        if form == "scaled":
            table, row_scale, slopes, _ = (t.detach() for t in tensors)
            x = table[entry] * row_scale[:, None]
            piece = torch.bucketize(x, fire_knots(bias64, q_pos, lq, lk))[None].expand(h, -1, -1)
            slope = slopes.gather(1, piece.flatten(1)).view(h, lq, lk).abs()
            # |d score / d t_e| of each tensor, (heads, q_len, k_len)
            sens = [slope * row_scale[:, None], slope * table[entry], x.expand(h, -1, -1), 1.0]
        factor = 2 * (d + lk + 16 + 8 * math.sqrt(n)) * U
        out = []
        for i in range(len(jac[0])):  # each parameter
            if form == "table":  # (heads, q_len + k_len - 1, *shape) at each score's entry
                g = jac[0][i].abs()[:, entry]
            else:
                at = [
                    jac[0][i].abs()[entry][None],  # the table, over key - query
                    jac[1][i].abs()[None, :, None].expand(1, lq, lk, *jac[1][i].shape[1:]),
                    *(j[i].abs()[torch.arange(h)[:, None, None], piece] for j in jac[2:]),
                ]
                g = 0.0
                for a, w in zip(at, sens, strict=True):
                    if isinstance(w, torch.Tensor):
                        w = w.reshape(w.shape + (1,) * (a.ndim - 3))
                    g = g + a * w
            tol = factor * torch.einsum("bhij,hij...->...", ds, g)
            if rounding:
                w = torch.einsum("bhij,hij...->bhi...", p, g)
                shaped = do_out.reshape(do_out.shape + (1,) * (w.ndim - 3))
                tol = tol + 2 * 8 * rounding * (shaped * w**2).sum((0, 1, 2)).sqrt()
            out.append(tol)
    return out


def fire_knots(bias64, q_pos, lq, lk):
    """The knots of FIRE's pieces: its MLP's bends inside the range of x."""
    return bias64.scaled_form(q_pos, torch.arange(-(lk - 1), lq, device=q_pos.device)).knots


def run_case(bias_name, device, *, causal, q_len=SHAPE[3], cu=None, dtype=torch.float32, seed=0):
    """FlexAttention's output and gradients against float64, each with its bound (on
    CPU the output alone: see on_cpu)."""
    backward = device.type != "cpu"
    b, h, hk, _, lk, d, dv = SHAPE if backward else CPU_SHAPE
    shape = (b, h, hk, q_len, lk, d, dv)
    lq, scale = q_len, 1 / math.sqrt(d)
    torch.manual_seed(seed)
    bias = BIASES[bias_name](h).to(device)
    q, k, v, dout, mask, ids, local = make(shape, dtype, seed, device, cu)
    leaves = [t.clone().requires_grad_(backward) for t in (q, k, v)]
    params = trainable(bias) if backward else []
    cu_seqlens = None if cu is None else torch.tensor(cu, device=device)
    with torch.set_grad_enabled(backward):
        out = posenc.attention(
            *leaves, bias=bias, causal=causal, attention_mask=mask, cu_seqlens=cu_seqlens,
            backend=BACKEND,
        )  # fmt: skip
    assert out.dtype == dtype and out.shape == (b, h, lq, dv)
    got = [out, *(torch.autograd.grad(out, [*leaves, *params], dout) if backward else ())]

    # the reference: the same inputs (bfloat16 values exactly) and the module in float64
    q64, k64, v64 = (t.double().requires_grad_(backward) for t in (q, k, v))
    bias64 = copy.deepcopy(bias).double()
    q_pos = local[torch.arange(lk - lq, lk, device=device)]
    k_pos = local
    allowed = allowed_pairs(mask, ids, lq, lk, causal)
    block, bias_error, form = None, 0.0, None
    if not isinstance(bias, NoPE):
        block = bias64(q_pos[:, None], k_pos[None, :])
        form = "scaled" if bias_name == "fire-past" else "table"
        if isinstance(bias, FIRE):
            x, size = fire_x(bias64, q_pos, k_pos)
            # a float32 MLP of mlp_width units, or x (eight roundings) into a piece
            bias_error = (bias.mlp[0].out_features + 10) * U * size
            assert_off_the_bends(x, bias64)
        else:
            bias_error = 8 * U * block.detach().abs()
    ref = dense(q64, k64, v64, block, allowed, scale)
    want = [ref]
    if backward:
        want += torch.autograd.grad(ref, [q64, k64, v64, *trainable(bias64)], dout.double())

    with torch.no_grad():
        inputs = [t.detach().double() for t in (q, k, v, dout)]
        fixed = None if block is None else block.detach()
        found = bounds(
            *inputs, fixed, allowed, scale, bias_error=bias_error, rounding=ROUNDING[dtype],
            backward=backward,
        )  # fmt: skip
    tols = list(found[:4])  # out, and on CUDA dq, dk, dv
    if params:
        ds, p, do_out = found[4:]
        tols += param_bounds(bias64, form, q_pos, d, ds, p, do_out, ROUNDING[dtype])
    return got, want, tols


def assert_off_the_bends(x, bias64):
    # FIRE's gradient jumps where a unit of its MLP switches on (a knot of the pieces):
    # an x within float32 rounding of a bend could take the other side. These inputs
    # keep every x 1e-5 away (relative), far beyond the float32 error of x (eight
    # roundings), so the kernel and the reference take the same side
    first = bias64.mlp[0]
    bends = (-first.bias / first.weight[:, 0]).detach()
    gap = (x[..., None] - bends).abs().min(-1).values / x.abs().clamp(min=1e-30)
    assert float(gap.min()) > 1e-5, "an x lies on a bend of FIRE's MLP: take another seed"


def assert_within(got, want, tols):
    names = ["out", "dq", "dk", "dv"] + [f"dparam{i}" for i in range(len(got) - 4)]
    assert len(got) == len(want) == len(tols)
    names = names[: len(got)]
    for name, a, b, t in zip(names, got, want, tols, strict=True):
        err = (a.detach().double() - b.detach()).abs()
        assert bool(err.isfinite().all()), f"{name}: not finite"
        bound = torch.as_tensor(t, dtype=torch.float64, device=err.device)
        worst = float((err - bound).max())
        assert worst <= 0, f"{name}: error {float(err.max()):.3g} past its bound by {worst:.3g}"


@pytest.mark.parametrize("bias_name", BIASES)
def test_causal_cache_gqa_padding_equal_float64(bias_name, device):
    # causal, 64 cached keys before 192 queries, two query heads per key head, the
    # last row's first 85 keys padding: its queries at positions 64 .. 84 see no key
    got, want, tols = run_case(bias_name, device, causal=True)
    assert_within(got, want, tols)
    blind = SHAPE[4] // 3 - (SHAPE[4] - SHAPE[3])
    assert all(g[1, :, :blind].eq(0).all() for g in got[:2])  # out, and dq on CUDA


def test_bidirectional_packed_documents_equal_float64(device):
    got, want, tols = run_case("t5", device, causal=False, q_len=SHAPE[4], cu=CU, seed=1)
    assert_within(got, want, tols)
    # the first document is all padding in the last row: zeros, not NaN
    assert got[0][1, :, :37].eq(0).all()


def test_bfloat16_forward_and_backward_within_bfloat16_rounding(device):
    # bfloat16 q, k, v go to FlexAttention as they are; the reference takes their
    # values exactly, so the bounds count what the kernel rounds to bfloat16 (the
    # weights before P v, dS before dS k and dS q, the outputs): 2**-8 each
    got, want, tols = run_case("t5", device, causal=True, dtype=torch.bfloat16, seed=2)
    assert all(g.dtype == torch.bfloat16 for g in got[:2])
    assert_within(got, want, tols)


class Decay(torch.nn.Module):
    """A user's term through the public protocol alone (posenc.families.terms), with no
    table: ``a_h / (1 + |key - query|)``, its FlexAttention form reading the parameter
    in the score mod, so that its gradient comes from FlexAttention's gradients of
    captured tensors (posenc's biases hand it a table instead)."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.linspace(-2.0, 3.0, heads))

    def score_form(self, ctx: TermContext) -> TermForm:
        offset = ctx.offset

        def block(tensors, q_pos, k_pos):
            rel = (k_pos[None, :] - q_pos[:, None]).abs().to(tensors[0].dtype)
            return tensors[0][:, None, None] / (1 + rel)

        def flex(tensors):
            a = tensors[0]

            def add(b, h, q_idx, kv_idx):
                return a[h] / (1 + (kv_idx - q_idx - offset).abs().to(a.dtype))

            return add

        return TermForm((self.a.to(ctx.dtype),), block, flex)


def test_a_users_term_equal_float64(device):
    """A term written against the protocol, on FlexAttention: forward (and on CUDA
    backward, its parameter's gradient included) against float64, within the bounds
    of ``bounds``; the parameter's as param_bounds derives, every score's dS times
    |d score / d a_h| = 1 / (1 + |key - query|) summed in any order (n = every score
    of the head). The term's float32 evaluation: the division (within 2 ulp on a GPU,
    4 U relative) and the product, 8 U |term| with room."""
    backward = device.type != "cpu"
    b, h, hk, lq, lk, d, dv = SHAPE if backward else CPU_SHAPE
    scale = 1 / math.sqrt(d)
    term = Decay(h).to(device)
    q, k, v, dout, mask, ids, _ = make((b, h, hk, lq, lk, d, dv), torch.float32, 4, device)
    leaves = [t.clone().requires_grad_(backward) for t in (q, k, v)]
    with torch.set_grad_enabled(backward):
        out = posenc.attention(
            *leaves, terms=[term], causal=True, attention_mask=mask, backend=BACKEND
        )
    got = [out, *(torch.autograd.grad(out, [*leaves, term.a], dout) if backward else ())]

    q64, k64, v64 = (t.double().requires_grad_(backward) for t in (q, k, v))
    a64 = term.a.detach().double().requires_grad_(backward)
    q_pos, k_pos = torch.arange(lk - lq, lk, device=device), torch.arange(lk, device=device)
    near = 1 / (1 + (k_pos[None, :] - q_pos[:, None]).abs().double())  # d score / d a_h
    block = a64[:, None, None] * near
    allowed = allowed_pairs(mask, ids, lq, lk, True)
    ref = dense(q64, k64, v64, block, allowed, scale)
    want = [ref]
    if backward:
        want += torch.autograd.grad(ref, [q64, k64, v64, a64], dout.double())
    with torch.no_grad():
        inputs = [t.detach().double() for t in (q, k, v, dout)]
        found = bounds(
            *inputs, block.detach(), allowed, scale, bias_error=8 * U * block.detach().abs(),
            rounding=0.0, backward=backward,
        )  # fmt: skip
        tols = list(found[:4])
        if backward:
            ds = found[4]
            factor = 2 * (d + lk + 16 + 8 * math.sqrt(b * lq * lk)) * U
            tols.append(factor * torch.einsum("bhij,ij->h", ds, near))
    assert_within(got, want, tols)


def compiles():
    """What counts a compilation: dynamo's frames and graphs, AOT autograd's graphs and
    inductor's graph compilations (a backward compiles at its first run)."""
    inductor = sum(n for key, n in counters["inductor"].items() if key.startswith("fxgraph_cache"))
    return (
        counters["frames"]["total"],
        counters["stats"]["unique_graphs"],
        counters["aot_autograd"]["total"],
        inductor,
    )


@pytest.mark.gpu
@NO_CUDA
def test_block_mask_made_once_and_second_call_compiles_nothing(monkeypatch):
    """GPU-only: what it counts are the compiles of the forward and backward kernels,
    and torch refuses FlexAttention's backward on CPU; on CPU the forward's block
    masks and graphs are reused as tests/test_flex_cache.py checks."""
    device = torch.device("cuda")
    builds = []
    compiled = flex_engine.compiled

    def counting(fn):
        made = compiled(fn)
        if fn is not create_block_mask:
            return made

        def count(*args, **kwargs):
            builds.append(args[3:5])
            return made(*args, **kwargs)

        return count

    monkeypatch.setattr(flex_engine, "compiled", counting)
    flex_engine.BLOCK_MASKS.clear()
    torch.manual_seed(3)
    bias = T5Bias(SHAPE[1]).to(device)
    q, k, v, dout, mask, _, _ = make(SHAPE, torch.float32, 3, device)

    def call(mask):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = posenc.attention(*leaves, bias=bias, causal=True, attention_mask=mask,
                               backend=BACKEND)  # fmt: skip
        torch.autograd.grad(out, [*leaves, *trainable(bias)], dout)
        return out

    first = call(mask)
    before = compiles()
    second = call(mask.clone())  # a new tensor of the same content: the same block mask
    assert compiles() == before, "a second call at the same shapes compiled"
    assert builds == [(SHAPE[3], SHAPE[4])] and len(flex_engine.BLOCK_MASKS) == 1
    assert torch.equal(first, second)
