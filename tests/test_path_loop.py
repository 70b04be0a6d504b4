"""PaTH attention's compiled chunk core (core/csrc/path.c: path_core, path_core_backward).

``posenc.path_attention`` hands its chunk core (``_PaTHCore``: the scores between
chunks through carried queries, the softmax, the values, and all their gradients)
to the compiled loops for float32 CPU inputs whose head and value dims are
multiples of 16. Checked here through ``posenc.path_attention`` (out and every
gradient: q, k, v, w, beta, log_fgate) against posenc's float64 computation (the
torch core, itself checked against the dense formula in tests/test_path.py) and
against the float32 torch core, with gates, GQA, packed documents, lengths that are
not a multiple of the block, and blocks of 16, 64, 100 and 128 positions.

Error bounds (tests/test_path.py's model, its ``propagate`` and
``chunk_score_errors``). The compiled core does the torch core's arithmetic, the
products and sums in another order; the model's componentwise bounds hold for any
order of a sum (n terms err by at most ``(n - 1) u`` times their magnitudes).
Two steps differ:

- online softmax: each query's running sum and output row are rescaled by
  ``exp(m_old - m_new)`` once per key chunk, at most ``n <= seq`` more roundings
  of each than the torch core's one pass, i.e. at most the ``(seq + 1) u`` that the
  model already counts for the row's sums once more;
- exp512 (tiles.h): within 2 ulp, the model's 4 u for exp.

So the compiled core's error is within the model's with ``u`` doubled throughout
(``U_LOOP = 2 U32``, conservative: the scores' own products are the torch core's).
Against the float64 core: that bound plus float64's, doubled for the second-order
terms (``total_bounds``). Against the float32 torch core: the sum of the two
float32 computations' bounds against float64 (the triangle inequality).

Packed documents: each document's rows are its own attention, so the bounds are the
model's per document, with the document's first log gate standing for the whole
prefix (its cumulative sum then equals posenc's ``c``, which is summed over the row
and so rounded at the size of the whole prefix).

Each verdict is tried on a near miss: the compiled result moved by just over its
bound at one entry must fail, just under must pass.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import posenc.integration.attention.path as path_module
from posenc.core.kernels import compiled
from posenc.integration.attention.path import path_attention
from test_path import (
    U32,
    U64,
    assert_within,
    chunk_score_errors,
    make,
    propagate,
    total_bounds,
    worst_ratio,
)

pytestmark = pytest.mark.skipif(
    compiled is None or not hasattr(compiled, "path_core"), reason="no compiled kernels"
)

#: the compiled core's unit roundoff in the model (module docstring)
U_LOOP = 2 * U32

NAMES = ["out", "dq", "dk", "dv", "dw", "dbeta", "dg"]

# (batch, heads, kv_heads, seq, head_dim, v_dim), block, gate, cu_seqlens. Blocks of
# more than 16 take strengths beta * 16 / block (the sum of a row of |L| as in blocks
# of 16): the model bounds a chunk's inverse T componentwise, by |T| |I + L| |T|,
# which grows exponentially with that sum, and at float32 would leave the first
# order (the model asserts it stays there); the loop is the same for any strength.
CASES = {
    "mha-block-16": ((2, 2, 2, 70, 16, 16), 16, False, None),
    # short chunks: most transforms sit between chunks, in the chain (hmat's gradient)
    "fox-block-4": ((1, 2, 2, 48, 16, 16), 4, True, None),
    "gqa-fox-block-64": ((1, 4, 2, 150, 16, 32), 64, True, None),
    "fox-block-128": ((1, 2, 2, 160, 32, 16), 128, True, None),
    "mqa-fox-block-100": ((1, 3, 1, 180, 16, 16), 100, True, None),
    "docs-block-16": ((1, 2, 1, 90, 16, 16), 16, False, (0, 20, 21, 55, 55, 90)),
    "docs-gqa-fox-block-64": ((1, 4, 2, 170, 16, 16), 64, True, (0, 40, 100, 170)),
}


def _data(shape, block):
    q, k, v, w, beta, lf, dout = make(*shape, seed=11, gate=True)
    return q, k, v, w, beta * min(1.0, 16 / block), lf, dout


def _run(ins, gate, block, cu, *, torch_core=False):
    """out and the gradients of q, k, v, w, beta (and log_fgate) through path_attention."""
    ins = [t.clone().requires_grad_() for t in ins]
    saved = path_module.compiled
    if torch_core:
        path_module.compiled = None
    try:
        out = path_attention(
            *ins[:5],
            log_fgate=ins[5] if gate else None,
            block_size=block,
            cu_seqlens=None if cu is None else torch.tensor(cu),
        )
        return out, ins
    finally:
        path_module.compiled = saved


def _results(data, gate, block, cu, dtype, *, torch_core=False):
    q, k, v, w, beta, lf, dout = data
    ins = [t.to(dtype) for t in (q, k, v, w, beta) + ((lf,) if gate else ())]
    out, leaves = _run(ins, gate, block, cu, torch_core=torch_core)
    saved = path_module.compiled
    if torch_core:
        path_module.compiled = None
    try:
        grads = torch.autograd.grad(out, leaves, dout.to(dtype))
    finally:
        path_module.compiled = saved
    return [out.detach(), *grads]


def _part_bounds(data, gate, scale, u, a, b, err):
    """The model's bounds of rows a .. b - 1 (one document) of a computation whose
    scores err by ``err`` (the whole row's), the prefix's gates folded into the
    document's first."""
    q, k, v, w, beta, lf, dout = (t[:, :, a:b] for t in data)
    if gate:
        lf = lf.clone()
        lf[:, :, 0] += data[5][:, :, :a].sum(-1)
    return propagate(q, k, v, w, beta, lf if gate else None, dout, scale, err[..., a:b, a:b], u)


def _bounds(data, gate, block, cu, u):
    """A computation of unit roundoff ``u`` in chunks of ``block`` against posenc's
    float64 one: the model's bounds, added and doubled, per document."""
    q, k, _, w, beta, _, _ = data
    length, scale = q.shape[2], q.shape[-1] ** -0.5
    chunk = min(block, length)
    # the whole row's score errors (transforms across documents included: more)
    errs = {uu: chunk_score_errors(q, k, w, beta, chunk, uu) for uu in (u, U64)}
    bounds = []
    for a, b in itertools.pairwise(cu if cu is not None else (0, length)):
        if b > a:
            parts = [_part_bounds(data, gate, scale, uu, a, b, errs[uu]) for uu in (u, U64)]
            bounds.append(total_bounds(*parts))
    # every bound along the sequence (dim 2), one document after the other
    return [torch.cat(parts, 2) for parts in zip(*bounds, strict=True)][: 7 if gate else 6]


@pytest.fixture(scope="module", params=CASES.values(), ids=CASES.keys())
def case(request):
    shape, block, gate, cu = request.param
    data = _data(shape, block)
    ref = _results(data, gate, block, cu, torch.float64)
    loop = _results(data, gate, block, cu, torch.float32)
    core = _results(data, gate, block, cu, torch.float32, torch_core=True)
    return {
        "gate": gate,
        "ref": ref,
        "loop": loop,
        "core": core,
        "loop_bounds": _bounds(data, gate, block, cu, U_LOOP),
        "core_bounds": _bounds(data, gate, block, cu, U32),
    }


def test_compiled_core_within_its_bound_of_float64(case):
    names = NAMES[: len(case["ref"])]
    assert_within(names, case["loop"], case["ref"], case["loop_bounds"])


def test_compiled_core_within_its_bound_of_the_torch_core(case):
    names = NAMES[: len(case["ref"])]
    both = [a + b for a, b in zip(case["loop_bounds"], case["core_bounds"], strict=False)]
    assert_within(names, case["loop"], case["core"], both)
    # and the two are different computations (the compiled one was taken)
    assert any(not torch.equal(a, b) for a, b in zip(case["loop"], case["core"], strict=True))


@pytest.mark.parametrize("which", range(7))
def test_a_near_miss_fails(case, which):
    """The verdict of the float64 comparison: the compiled result moved at one entry
    by 1.01 times the bound's room there fails, by 0.99 passes."""
    if which >= len(case["ref"]):
        pytest.skip("no gate")
    name, got, want = NAMES[which], case["loop"][which], case["ref"][which]
    bound = case["loop_bounds"][which]
    err = (got.double() - want.double()).abs()
    room = (bound - err).masked_fill(bound == 0, -1.0)
    at = int(room.flatten().argmax())
    sign = 1.0 if float(got.double().flatten()[at] - want.flatten()[at]) >= 0 else -1.0

    def moved(factor):
        out = want.double().clone().flatten()
        out[at] += sign * factor * float(bound.flatten()[at])
        return out.view_as(want)

    assert worst_ratio(moved(0.99), want, bound) <= 1.0
    assert worst_ratio(moved(1.01), want, bound) > 1.0
    with pytest.raises(AssertionError, match=name):
        assert_within([name], [moved(1.01)], [want], [bound])


def _forbid_torch_core(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the torch core ran")

    monkeypatch.setattr(path_module, "_scores", fail)


@pytest.mark.parametrize("gate", [False, True], ids=["path", "fox"])
def test_float32_takes_the_compiled_core(monkeypatch, gate):
    data = make(2, 4, 2, 50, 16, 32, seed=12, gate=True)
    _forbid_torch_core(monkeypatch)
    got = _results(data, gate, 16, (0, 17, 50), torch.float32)
    assert all(torch.isfinite(t).all() for t in got)


@pytest.mark.parametrize(
    "dtype, d, dv",
    [(torch.float64, 16, 16), (torch.float32, 8, 16), (torch.float32, 16, 8)],
    ids=["float64", "head-dim-8", "v-dim-8"],
)
def test_other_inputs_take_the_torch_core(monkeypatch, dtype, d, dv):
    data = make(1, 2, 2, 30, d, dv, seed=13, gate=True)
    _forbid_torch_core(monkeypatch)
    with pytest.raises(AssertionError, match="the torch core ran"):
        _results(data, True, 8, None, dtype)


def test_the_loop_is_refused_without_vectors_of_16():
    # the compiled functions themselves: False, nothing written, for a head dim of 8
    n, bk, g, c, d, dv = 2, 1, 1, 4, 8, 16
    t = torch.zeros(n * bk * g * c * max(d, dv, c))
    out = torch.full((n, bk, g * c, dv), 7.0)
    lse = torch.full((n, bk, g * c), 7.0)
    done = compiled.path_core(
        *(t.data_ptr() for _ in range(5)), 0, 0, [0, 0], out.data_ptr(), lse.data_ptr(),
        [n, bk, g, c, d, dv], 1,
    )  # fmt: skip
    assert done is False
    assert bool((out == 7.0).all()) and bool((lse == 7.0).all())


def test_first_outside_its_range_is_refused():
    t = torch.zeros(64)
    with pytest.raises(ValueError, match="first"):
        compiled.path_core(
            *(t.data_ptr() for _ in range(5)), 0, 0, [1], t.data_ptr(), t.data_ptr(),
            [1, 1, 1, 1, 16, 16], 1,
        )  # fmt: skip


@pytest.fixture(scope="module")
def naive_path():
    from test_fla import _naive

    return _naive("path_attn", "naive_path_attn")


@pytest.mark.parametrize("gate", [False, True], ids=["path", "fox"])
def test_compiled_core_matches_flas_reference_in_float32(monkeypatch, gate, naive_path):
    """fla-core's ``naive_path_attn`` (float32, chunks of 8) against the compiled core
    (float32, blocks of 16; the torch core forbidden): the two float32 computations'
    bounds, added and doubled (tests/test_path.py's test_matches_flas_reference runs
    posenc in float64, at head dims the loop does not take)."""
    shape, chunk, block = (1, 4, 2, 40, 16, 16), 8, 16
    q, k, v, w, beta, lf, dout = make(*shape, seed=14, gate=True)
    if not gate:
        lf = torch.zeros_like(lf)  # fla's reference needs g: plain PaTH is g = 0
    scale = shape[4] ** -0.5
    _forbid_torch_core(monkeypatch)
    ours = [t.float().requires_grad_() for t in [q, k, v, w, beta] + ([lf] if gate else [])]
    out = path_attention(*ours[:5], log_fgate=ours[5] if gate else None, block_size=block)
    grads = torch.autograd.grad(out, ours, dout.float())
    theirs = [t.transpose(1, 2).float().requires_grad_() for t in (q, k, v, w, beta, lf)]
    ref = naive_path(*theirs, scale=scale, chunk_size=chunk)
    ref_grads = torch.autograd.grad(ref, theirs, dout.transpose(1, 2).float())
    got = [t.transpose(1, 2) for t in (ref, *ref_grads[: len(ours)])]
    lf_model = lf if gate else None
    bounds = total_bounds(
        *(
            propagate(q, k, v, w, beta, lf_model, dout, scale,
                      chunk_score_errors(q, k, w, beta, c, u), u)
            for c, u in ((chunk, U32), (block, U_LOOP))
        )
    )  # fmt: skip
    assert_within(NAMES[: len(ours) + 1], got, [out, *grads], bounds)
