"""The compiled backward of posenc.attention against float64 attention, gradients included.

A float32 CPU call whose forward took the compiled kernel (``attend``) takes its
compiled backward (``attend_backward``) too; these tests check its gradients of
q, k, v and of the bias module's parameters against softmax attention computed
densely in float64 and differentiated by autograd, with error bounds derived
from the float32 roundings (see ``bounds``), and that the fused path really ran.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import posenc
from posenc.families.bias import FIRE, KERPLE, NoPE, T5Bias
from posenc.families.bias.modules import ALiBi
from posenc.families.terms import TermContext
from posenc.integration.attention import kernel, layout, softmax

U = 2.0**-24  # float32 unit roundoff

BIASES = {
    "none": lambda h: None,
    "nope": lambda h: NoPE(h),
    "alibi": lambda h: ALiBi(h),
    "t5": lambda h: T5Bias(h),
    "kerple-log": lambda h: KERPLE(h),
    "kerple-power": lambda h: KERPLE(h, kind="power"),
    # every query below FIRE's threshold: its bias is one of key - query, a table
    "fire": lambda h: FIRE(h, init_L=1e4),
}

# (batch, heads, kv_heads, q_len, k_len, head_dim, v_dim): lengths around the
# kernel's blocks (64 queries, 64 keys per backward unit), a KV cache with
# grouped-query attention, head_dim 16 / 64 / 80, single-query and two-key ends
SHAPES = {
    "one": (2, 2, 2, 1, 1, 16, 16),
    "two": (1, 2, 1, 2, 2, 16, 32),
    "block-1": (2, 2, 2, 63, 63, 16, 16),
    "cache-gqa": (2, 4, 2, 5, 65, 64, 32),
    "gqa-257": (1, 4, 1, 257, 257, 80, 16),
    "cache-65": (1, 2, 2, 65, 130, 64, 64),
}


def make(shape, seed):
    b, h, hk, lq, lk, d, dv = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=gen)
    k = torch.randn(b, hk, lk, d, generator=gen)
    v = torch.randn(b, hk, lk, dv, generator=gen)
    dout = torch.randn(b, h, lq, dv, generator=gen)
    mask = torch.ones(b, lk, dtype=torch.bool)
    mask[-1, : lk // 3] = False  # the last sequence left-padded (none of a 1-key one)
    return q, k, v, dout, mask


def trainable(bias):
    return [] if bias is None else [p for p in bias.parameters() if p.requires_grad]


def dense(q, k, v, bias, *, causal, scale, mask):
    """softmax(q k^T scale + bias + mask) v in float64, everything materialised."""
    b, h, lq, _ = q.shape
    hk, lk = k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    s = q @ k.transpose(-1, -2) * scale
    if bias is not None and not isinstance(bias, NoPE):
        s = s + bias.bias(lq, lk)
    allowed = mask[:, None, None, :].expand(b, 1, lq, lk)
    if causal:
        keys, queries = torch.arange(lk, device=q.device), torch.arange(lq, device=q.device)
        allowed = allowed & (keys[None, :] <= queries[:, None] + lk - lq)
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0)
    return p @ v


def table_block(bias, q_len, k_len):
    """The float64 bias of a relative bias as a block function (None without a bias)."""
    if bias is None or isinstance(bias, NoPE):
        return None
    table = bias.relative_bias(torch.arange(-(k_len - 1), q_len)).double().detach()
    return lambda q_pos, k_pos: table[:, k_pos[None, :] - q_pos[:, None] + k_len - 1]


def weight_stats(q, k, v, dout, block, *, causal, scale, mask):
    """Float64 magnitudes the error bounds need, over blocks of queries (linear memory).

    ``block(q_pos, k_pos)`` is the float64 bias (heads, n, k_len) of key
    positions ``q_pos``, or None.

    colsum: the largest sum of weights one key gets (over its group's heads and
    all queries); diag: the sum of weights along each diagonal ``key - query`` of
    each head (over the batch), (heads, q_len + k_len - 1); amax: the largest
    ``|dP| + |delta|`` of a weight that is not 0; smax, lmax: the largest |score|
    and |lse|.
    """
    b, h, lq, _ = q.shape
    hk, lk = k.shape[1], k.shape[2]
    q, k, v, dout = (t.double() for t in (q, k, v, dout))
    k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    col = torch.zeros(b, h, lk, dtype=torch.float64)
    diag = torch.zeros(h, lq + lk - 1, dtype=torch.float64)
    amax = smax = lmax = 0.0
    k_pos = torch.arange(lk)
    for i0 in range(0, lq, 512):
        i1 = min(lq, i0 + 512)
        q_pos = torch.arange(i0, i1) + lk - lq
        rel = k_pos[None, :] - q_pos[:, None] + lk - 1
        s = q[:, :, i0:i1] @ k.transpose(-1, -2) * scale
        if block is not None:
            s = s + block(q_pos, k_pos)
        allowed = mask[:, None, None, :].expand(b, 1, i1 - i0, lk)
        if causal:
            allowed = allowed & (k_pos[None, :] <= q_pos[:, None])
        s = s.masked_fill(~allowed, -math.inf)
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse.nan_to_num(0.0, neginf=0.0)[..., None])
        dp = dout[:, :, i0:i1] @ v.transpose(-1, -2)
        delta = (dout[:, :, i0:i1] * (p @ v)).sum(-1)
        live = p > 0
        amax = max(amax, float(((dp.abs() + delta.abs()[..., None]) * live).max()))
        smax = max(smax, float(s.masked_fill(~allowed, 0.0).abs().max()))
        lmax = max(lmax, float(lse.masked_fill(~lse.isfinite(), 0.0).abs().max()))
        col += p.sum(2)
        diag.scatter_add_(1, rel.flatten().expand(h, -1), p.sum(0).flatten(1))
    colsum = float(col.view(b, hk, h // hk, lk).sum(2).max())
    return colsum, diag, amax, smax, lmax


def bounds(q, k, v, dout, bias, *, causal, scale, mask, block=None, bias_error=None):
    """Per-element error bounds of float32 dq, dk, dv and the table gradient.

    The bias is ``bias``'s table, or ``block`` (see weight_stats) with the bound
    ``bias_error`` of its float32 evaluation.

    First order in U = 2**-24, each quantity carrying its own rounding and its
    inputs' errors (row norms bound dot products by Cauchy-Schwarz):

    - a score is a head_dim-term dot product, scaled, plus the bias (itself a few
      float32 operations): |err| <= es = D U |q||k| scale + 8 U |bias| + 2 U |s|;
    - lse is max + log of a sum of k_len weights, each off by 2 es relative, and
      a weight P = exp(s - lse) is then off by ep = 4 es + (k_len + 8) U + 2 U
      (|lse| + |s|) relative (exp, log, the subtraction and online rescales: a few
      U each, and the sum's k_len U);
    - dP = dO . v (v_dim terms) is off by DV U |dO||v|; delta = dO . out by
      |dO| |err out| + DV U |dO||out|, out a weighted mean of v rows off by ep +
      (k_len + 2) U of max|v| per element;
    - dS = P (dP - delta) is off by P eta, eta = ep A + err dP + err delta + 3 U A
      (A = the largest |dP| + |delta|);
    - dq = scale sum_j dS k_j (k_len terms, sum_j P = 1): scale |k| (eta + (k_len +
      1) U A); dk = scale sum_i dS q_i (heads * q_len terms whose weights sum to
      at most colsum): scale |q| colsum (eta + (group q_len + 1) U A); dv = sum_i
      P dO_i: colsum max|dO| (ep + (group q_len + 1) U); each table gradient entry
      (the dS of one diagonal, over the batch: n = batch * min(q_len, k_len) terms
      whose weights sum to diag): diag (eta + (n + 1) U A), per entry.

    Returns the bounds of dq, dk, dv and the table gradient (per entry), a
    bound of |the table gradient| (diag A), eta and A, and the output's bound.

    Each bound is doubled for the second-order terms.
    """
    b, h, lq, d = q.shape
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    if block is None:
        block = table_block(bias, lq, lk)
    colsum, diag, amax, smax, lmax = weight_stats(
        q, k, v, dout, block, causal=causal, scale=scale, mask=mask
    )
    group = h // hk

    def norm(t):
        return float(t.double().norm(dim=-1).max())

    if bias_error is None:
        bmax = 0.0
        if block is not None:
            bmax = float(block(torch.arange(lk - lq, lk), torch.arange(lk)).abs().max())
        bias_error = 8 * U * bmax
    es = d * U * norm(q) * norm(k) * scale + bias_error + 2 * U * smax
    ep = 4 * es + (lk + 8) * U + 2 * U * (lmax + smax)
    vmax, omax = float(v.abs().max()), float(dout.abs().max())
    err_out = math.sqrt(dv) * vmax * (ep + (lk + 2) * U)
    err_delta = norm(dout) * err_out + dv * U * norm(dout) * math.sqrt(dv) * vmax
    eta = ep * amax + dv * U * norm(dout) * norm(v) + err_delta + 3 * U * amax
    tq = scale * norm(k) * (eta + (lk + 1) * U * amax)
    tk = scale * norm(q) * colsum * (eta + (group * lq + 1) * U * amax)
    tv = colsum * omax * (ep + (group * lq + 1) * U)
    tt = diag * (eta + (b * min(lq, lk) + 1) * U * amax)
    return 2 * tq, 2 * tk, 2 * tv, 2 * tt, diag * amax, eta, amax, 2 * err_out


def param_bounds(bias, lq, lk, table_bound, table_max):
    """Bounds of the bias parameters' float32 gradients from the table gradient's.

    A parameter's gradient is sum_r J_r dtable_r over the table's entries r (J =
    d table / d parameter; table_bound and table_max per entry): off by sum_r
    |J_r| (table_bound_r + (n + 8) U table_max_r), the n + 8 covering autograd's
    float32 sum of the n = heads (q_len + k_len - 1) entries and J evaluated in
    float32. Each bound doubled, as above.
    """
    names = [n for n, p in bias.named_parameters() if p.requires_grad]
    base = {n: p.detach().double() for n, p in bias.named_parameters()}
    module = copy.deepcopy(bias).double()
    rel = torch.arange(-(lk - 1), lq)

    def table(*values):
        params = dict(base, **dict(zip(names, values, strict=True)))
        # forward(q_pos, k_pos) is relative_bias(k_pos - q_pos)
        return torch.func.functional_call(module, params, (torch.zeros((), dtype=torch.long), rel))

    jac = torch.func.jacrev(table, argnums=tuple(range(len(names))))(*(base[n] for n in names))
    n = table_bound.numel()
    per_entry = table_bound + (n + 8) * U * table_max
    out = []
    for j in jac:  # (heads, q_len + k_len - 1, *param shape)
        flat = j.abs().reshape(*j.shape[:2], -1)  # 0-d parameters (FIRE's c, L) too
        out.append(2 * (flat * per_entry[..., None]).sum((0, 1)).view(j.shape[2:]))
    return out


def run_case(bias_name, shape, causal, seed=0):
    """Kernel gradients (float32) and dense float64 ones, with their bounds."""
    h = shape[1]
    torch.manual_seed(seed)
    bias = BIASES[bias_name](h)
    q, k, v, dout, mask = make(shape, seed)
    scale = 1 / math.sqrt(q.shape[-1])
    q32, k32, v32 = (t.clone().requires_grad_(True) for t in (q, k, v))
    params = trainable(bias)
    out = posenc.attention(q32, k32, v32, bias=bias, causal=causal, attention_mask=mask)
    got = torch.autograd.grad(out, [q32, k32, v32, *params], dout)

    bias64 = None if bias is None else copy.deepcopy(bias).double()
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    ref = dense(q64, k64, v64, bias64, causal=causal, scale=scale, mask=mask)
    want = torch.autograd.grad(ref, [q64, k64, v64, *trainable(bias64)], dout.double())
    tq, tk, tv, tt, tmax, *_ = bounds(q, k, v, dout, bias, causal=causal, scale=scale, mask=mask)
    tols = [tq, tk, tv]
    if params:
        tols += param_bounds(bias, shape[3], shape[4], tt, tmax)
    return got, want, tols


def assert_within(got, want, tols):
    names = ["dq", "dk", "dv"] + [f"dparam{i}" for i in range(len(got) - 3)]
    for name, a, b, t in zip(names, got, want, tols, strict=True):
        err = (a.double() - b).abs()
        assert bool((err <= t).all()), f"{name}: error {float(err.max()):.3g} > bound"


@pytest.fixture
def kernel_only(monkeypatch, compiled_kernels):
    """The blockwise backward raises: a test passing with this ran the compiled one."""
    assert hasattr(compiled_kernels, "attend_backward")

    def refuse(*args, **kwargs):
        raise AssertionError("the blockwise backward ran")

    monkeypatch.setattr(softmax, "backward_blockwise", refuse)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("bias_name", BIASES)
def test_kernel_gradients_equal_dense(bias_name, causal, shape, kernel_only):
    got, want, tols = run_case(bias_name, shape, causal)
    assert_within(got, want, tols)


@pytest.mark.parametrize("bias_name", ["alibi", "t5"])
def test_long_sequence(bias_name, kernel_only):
    # 4097 keys: 65 units of 64 keys, the last one a single key; one head keeps the
    # float64 reference (4097 x 4097 scores) cheap
    shape = (1, 1, 1, 4097, 4097, 64, 64)
    got, want, tols = run_case(bias_name, shape, causal=True, seed=1)
    assert_within(got, want, tols)


def test_sequence_of_padding_only_gets_zero_gradients(kernel_only):
    q, k, v, dout, _ = make((2, 2, 2, 3, 6, 16, 16), 2)
    q.requires_grad_(True)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False
    bias = T5Bias(2)
    out = posenc.attention(q, k, v, bias=bias, attention_mask=mask)
    (dq, dw) = torch.autograd.grad(out, [q, bias.relative_attention_bias.weight], dout)
    assert torch.isfinite(dq).all() and dq[1].eq(0).all() and torch.isfinite(dw).all()


def test_nan_query_gives_nan_where_the_blockwise_backward_does(monkeypatch):
    q, k, v, dout, _ = make((1, 2, 2, 70, 70, 16, 16), 3)
    q[0, 1, 5, 3] = float("nan")

    def grads():
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = posenc.attention(qq, kk, vv, bias=ALiBi(2))
        return torch.autograd.grad(out, [qq, kk, vv], dout)

    fused = grads()
    monkeypatch.setattr(kernel, "backward", lambda *a: None)
    blockwise = grads()
    for a, b in zip(fused, blockwise, strict=True):
        assert torch.equal(a.isnan(), b.isnan())
    assert fused[0][0, 1, 5].isnan().all() and not fused[0][0, 0].isnan().any()


@pytest.mark.parametrize("bias_name", ["t5", "kerple-log", "none"])
def test_fallback_when_kernel_declines(bias_name, monkeypatch):
    # the blockwise backward of a compiled forward: the kernel declining (as it
    # does without AVX-512) must still give the dense gradients
    monkeypatch.setattr(kernel, "backward", lambda *a: None)
    got, want, tols = run_case(bias_name, SHAPES["cache-gqa"], causal=True)
    # the blockwise path sums in torch's order, a different one: the same first-order
    # bound holds for any order of the sums
    assert_within(got, want, tols)


def test_head_dim_off_the_vector_width_falls_back(compiled_kernels):
    # head_dim 24 is no multiple of 16: attend_backward declines, blockwise runs
    shape = (1, 2, 2, 9, 9, 24, 16)
    args = [0] * 12 + [list(shape), [0, 0, 0], [0, 0, 0], [0, 0, 0], True, 0.2, 1, None, 0, None]
    assert compiled_kernels.attend_backward(*args) is False
    got, want, tols = run_case("t5", shape, causal=True)
    assert_within(got, want, tols)


def test_gradcheck_blockwise_float64():
    gen = torch.Generator().manual_seed(5)
    bias = T5Bias(2, num_buckets=8, max_distance=8).double()
    q = torch.randn(1, 2, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 6, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    weight = bias.relative_attention_bias.weight.detach().clone().requires_grad_(True)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = bias

        def forward(self, q, k, v):
            return posenc.attention(q, k, v, bias=self.bias, causal=True, attention_mask=mask)

    layer = Layer()

    def fn(q, k, v, w):  # the module's weight swapped for w, so that gradcheck varies it
        return torch.func.functional_call(layer, {"bias.relative_attention_bias.weight": w},
                                          (q, k, v))  # fmt: skip

    assert torch.autograd.gradcheck(fn, (q, k, v, weight))


# dynamo reads .grad of the non-leaf tensors it hands to the frame after a graph break
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_compiled_graph_takes_the_fused_backward(kernel_only):
    bias = KERPLE(4)
    q, k, v, dout, mask = make(SHAPES["cache-gqa"], 6)
    q.requires_grad_(True)

    def layer(q, k, v):
        return posenc.attention(q * 2, k, v, bias=bias, causal=True, attention_mask=mask)

    params = [q, bias.bias_p, bias.bias_a]
    compiled = torch.compile(layer)
    got = torch.autograd.grad(compiled(q, k, v), params, dout)
    want = torch.autograd.grad(layer(q, k, v), params, dout)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# FIRE past its threshold: (batch, heads, kv_heads, q_len, k_len, head_dim, v_dim)
FIRE_SHAPES = {
    "block-1": (2, 2, 2, 63, 63, 16, 16),
    "cache-gqa": (2, 4, 2, 5, 65, 64, 32),
    "gqa-130": (1, 4, 1, 130, 130, 80, 16),
}


def fire_case(shape, causal, init_l, seed=0):
    """FIRE's pieces through the compiled loops against exact arithmetic on their inputs.

    The reference takes the float32 inputs the kernel reads (table, scale, slopes,
    intercepts) in float64 and each score's piece as the kernel picks it (from x
    rounded to float32: at a knot both pieces give the same bias, so the choice
    moves only which piece's gradient a score adds to). Returns the kernel's and
    the reference's gradients of q, k, v and of the four tensors, and bounds.
    """
    b, h, hk, lq, lk, d, _ = shape
    torch.manual_seed(seed)
    bias = FIRE(h, mlp_width=16, init_L=init_l)
    q, k, v, dout, mask = make(shape, seed)
    scale = 1 / math.sqrt(d)
    cpu = torch.device("cpu")
    ctx = TermContext(b, h, d, lq, lk, scale, causal, torch.float32, cpu)
    found = bias.score_form(ctx)
    params, knots = found.tensors, found.knots
    assert found.operand == "pieces" and 0 < knots.numel() <= kernel.MAX_KNOTS
    plan, _ = softmax.Plan.of(layout.Mask(causal, mask, lk - lq), scale, [found])
    leaves = [p.detach().requires_grad_(True) for p in params]
    inputs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = softmax.SoftmaxAttention.apply(*inputs, plan, True, *leaves)
    got = torch.autograd.grad(out, [*inputs, *leaves], dout)

    q_pos, k_pos = torch.arange(lk - lq, lk), torch.arange(lk)
    idx = k_pos[None, :] - q_pos[:, None] + lk - 1
    piece = torch.bucketize(params[0].detach()[idx] * params[1].detach()[:, None], knots)
    exact = [p.detach().double().requires_grad_(True) for p in params]
    table, row_scale, slopes, intercepts = exact
    x = table[idx] * row_scale[:, None]
    dense_bias = slopes[:, piece] * x + intercepts[:, piece]  # (heads, q_len, k_len)
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    kk, vv = k64.repeat_interleave(h // hk, 1), v64.repeat_interleave(h // hk, 1)
    s = q64 @ kk.transpose(-1, -2) * scale + dense_bias
    allowed = mask[:, None, None, :].expand(b, 1, lq, lk)
    if causal:
        allowed = allowed & (k_pos[None, :] <= q_pos[:, None])
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0)
    want = torch.autograd.grad(p @ vv, [q64, k64, v64, *exact], dout.double())

    with torch.no_grad():
        fixed = dense_bias.detach()
        sx, ic = (slopes[:, piece] * x).abs(), intercepts[:, piece].abs()
        # the kernel rounds x = table * scale once and fuses slope x + intercept: U (|slope
        # x| + |bias|) <= 2 U (|slope x| + |intercept|) per score
        bias_error = 2 * U * float((sx + ic).max())
        tq, tk, tv, _, _, eta, amax, _ = bounds(
            q, k, v, dout, None, causal=causal, scale=scale, mask=mask,
            block=lambda qp, kp: fixed[:, qp - (lk - lq)][:, :, kp], bias_error=bias_error,
        )  # fmt: skip
        # each tensor's gradient sums dS (off by P eta; |dS| <= P A) times a factor of
        # the score: any order of at most n float32 sums adds (n + 8) U A P per term
        n = b * h * lq * lk
        per = p.sum(0) * (eta + (n + 8) * U * amax)  # (heads, q_len, k_len)
        slope = slopes.detach()[:, piece].abs()
        tt = torch.zeros(lq + lk - 1, dtype=torch.float64)
        on_table = (per * slope * row_scale.detach()[:, None]).sum(0)
        tt.scatter_add_(0, idx.flatten(), on_table.flatten())
        ts = (per * slope * table.detach()[idx]).sum((0, 2))
        tsl = torch.zeros(h, knots.numel() + 1, dtype=torch.float64)
        tsl.scatter_add_(1, piece.flatten().expand(h, -1), (per * x.detach()).flatten(1))
        tin = torch.zeros_like(tsl).scatter_add_(1, piece.flatten().expand(h, -1), per.flatten(1))
    return got, want, [tq, tk, tv, 2 * tt, 2 * ts, 2 * tsl, 2 * tin]


@pytest.mark.parametrize("shape", FIRE_SHAPES.values(), ids=FIRE_SHAPES.keys())
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_fire_past_its_threshold_takes_the_pieces(shape, causal, kernel_only):
    # L a third of the way in: queries on both sides of it
    got, want, tols = fire_case(shape, causal, init_l=shape[4] / 3)
    names = ["dq", "dk", "dv", "dtable", "dscale", "dslopes", "dintercepts"]
    for name, a, b, t in zip(names, got, want, tols, strict=True):
        err = (a.double() - b).abs()
        assert bool((err <= t).all()), f"{name}: error {float(err.max()):.3g} > bound"


@pytest.mark.usefixtures("compiled_kernels")
def test_fire_routes_by_its_threshold(monkeypatch):
    # every query below L: the table; any at or past it: the pieces, through the
    # compiled loop forwards and backwards
    calls = []
    forward = kernel.forward

    def spy(plan, params, q, k, v, *gate):
        result = forward(plan, params, q, k, v, *gate)
        calls.append((plan.forms[0].operand, result is not None))
        return result

    monkeypatch.setattr(kernel, "forward", spy)
    q, k, v, _, _ = make((1, 2, 2, 90, 100, 16, 16), seed=4)
    for init_l, form in ((100.5, "table"), (40.5, "pieces"), (1.0, "pieces")):
        bias = FIRE(2, mlp_width=8, init_L=init_l)
        out = posenc.attention(q, k, v, bias=bias, causal=True)
        assert calls.pop() == (form, True) and out.isfinite().all()


def _many_knots(heads, knots):
    """A FIRE whose MLP bends at ``knots`` points inside (0, 1)."""
    bias = FIRE(heads, mlp_width=knots, init_L=4.0)
    with torch.no_grad():
        bias.mlp[0].weight.fill_(1.0)
        bias.mlp[0].bias.copy_(-torch.linspace(0.01, 0.99, knots))
    return bias


def test_fire_with_more_knots_than_the_loop_holds_goes_blockwise(monkeypatch):
    calls = []
    forward = kernel.forward

    def spy(plan, params, q, k, v, *gate):
        result = forward(plan, params, q, k, v, *gate)
        calls.append((plan.forms[0].operand, plan.forms[0].knots.numel(), result is None))
        return result

    monkeypatch.setattr(kernel, "forward", spy)
    shape = (1, 2, 2, 40, 40, 16, 16)
    q, k, v, dout, mask = make(shape, seed=8)
    bias = _many_knots(2, 100)
    out = posenc.attention(q, k, v, bias=bias, causal=True, attention_mask=mask)
    (form, knots, declined), *_ = calls
    assert form == "pieces" and knots > kernel.MAX_KNOTS and declined
    exact = copy.deepcopy(bias).double()
    ref = dense(*(t.double() for t in (q, k, v)), exact, causal=True, scale=0.25, mask=mask)
    # the pieces in float32: x = psi / norm off by 7 U relative (log1p twice, the
    # reciprocal, two products), then slope x + intercept rounded twice
    with torch.no_grad():
        form = bias.scaled_form(torch.arange(40), torch.arange(-39, 40))
        size = form.slopes.abs().amax() * float(form.table.max() * form.scale.max())
        bias_error = 10 * U * float(size + form.intercepts.abs().amax())
        *_, out_bound = bounds(
            q, k, v, dout, None, causal=True, scale=0.25, mask=mask, bias_error=bias_error,
            block=lambda qp, kp: exact(qp[:, None], kp[None, :]),
        )  # fmt: skip
    assert bool(((out.double() - ref).abs() <= out_bound).all())


def test_fire_with_nan_parameters_gives_nan_as_dense_does():
    bias = FIRE(2, mlp_width=8, init_L=4.0)
    with torch.no_grad():
        bias.mlp[2].weight[1, 3] = float("nan")
    q, k, v, _, _ = make((1, 2, 2, 20, 20, 16, 16), seed=9)
    out = posenc.attention(q, k, v, bias=bias, causal=True)
    causal = torch.ones(20, 20, dtype=torch.bool).tril()
    s = (q @ k.transpose(-1, -2) * 0.25 + bias.bias(20, 20)).masked_fill(~causal, -math.inf)
    ref = torch.softmax(s, -1) @ v  # head 1's bias is NaN, so are its rows
    assert torch.equal(out.isnan(), ref.isnan()) and out[0, 1].isnan().all()
    assert not out[0, 0].isnan().any()


def test_flex_backward_is_refused_on_cpu():
    # why test_flex_backward_on_gpu below has no CPU variant: torch (2.13) refuses
    # FlexAttention's backward on CPU tensors, compiled or eager, before it traces
    # anything. A torch that accepts it fails this test: give that one a CPU variant
    q, k, v = (t.requires_grad_(True) for t in make((1, 2, 2, 8, 8, 16, 16), seed=7)[:3])
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        posenc.attention(q, k, v, bias=ALiBi(2), backend="flex")


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device: FlexAttention's backward (the GPU path) runs only where one exists",
)
@pytest.mark.parametrize("bias_name", ["alibi", "t5", "fire"])
def test_flex_backward_on_gpu(bias_name):
    """On a GPU "auto" takes compiled FlexAttention, whose backward torch derives from
    the score mod: the same gradients as dense attention, within float32 rounding.

    GPU-only (``make gpu-check`` runs it): torch refuses FlexAttention's backward on
    CPU tensors (test_flex_backward_is_refused_on_cpu); its forward on CPU is checked
    by the CPU variants of tests/test_gpu_attention.py.
    """
    torch.manual_seed(5)
    bias = BIASES[bias_name](4).cuda()
    q, k, v, dout, mask = (t.cuda() for t in make((1, 4, 2, 128, 128, 64, 64), seed=6))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    params = trainable(bias)
    out = posenc.attention(q, k, v, bias=bias, causal=True, attention_mask=mask)
    got = torch.autograd.grad(out, [q, k, v, *params], dout)
    bias64 = copy.deepcopy(bias).double()
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = dense(q64, k64, v64, bias64, causal=True, scale=0.125, mask=mask)
    want = torch.autograd.grad(ref, [q64, k64, v64, *trainable(bias64)], dout.double())
    for a, b in zip(got, want, strict=True):
        # float32 sums over 128 keys of terms of magnitude <= max|b|: 128 * 2**-24 each,
        # times a factor 8 for the chain of products (score, weight, dS)
        torch.testing.assert_close(a.double(), b, rtol=0, atol=8 * 128 * U * (1 + b.abs().max()))
