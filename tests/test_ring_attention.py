"""Ring attention across gloo process groups of 2 and 4 ranks against one process.

Every rank attends with its shard of q, k and v (``"contiguous"`` and ``"zigzag"``
layouts) through ``posenc.context_parallel.ring_attention``; the outputs and the
gradients of q, k, v are gathered back to sequence order, those of the bias
parameters summed over the ranks, and compared with ``posenc.attention`` over the
whole sequence in one process: in float64 (the blockwise path, the same sums in
another order) to rounding, and in float32 (the compiled loops) within the error
bounds of tests/test_attention_backward.py.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import posenc
from gloo_ranks import run_forked
from posenc.families.bias import FIRE, T5Bias
from posenc.families.bias.modules import ALiBi
from posenc.integration.context_parallel import gather, ring_attention, shard
from test_attention_backward import bounds, dense, param_bounds

SEQ, HEADS, KV_HEADS, DIM = 256, 4, 2, 16

BIASES = {
    "none": lambda: None,
    "alibi": lambda: ALiBi(HEADS),
    "t5": lambda: T5Bias(HEADS),
    # past its threshold from position 40 on: the pieces of the whole sequence
    "fire": lambda: FIRE(HEADS, mlp_width=8, init_L=40.0),
}
# float64 checks the ring's bookkeeping (chunk pairs, offsets, table and scale
# slices, the gradients' way home) to rounding, rotary and FIRE included; float32
# the compiled loops under it, within derived bounds (FIRE's pieces in float32 are
# held to theirs in tests/test_attention_backward.py)
CASES = [
    (layout, causal, name, dtype)
    for layout in ("contiguous", "zigzag")
    for causal in (True, False)
    for name in BIASES
    for dtype in (torch.float64, torch.float32)
    if not (dtype == torch.float32 and name == "fire")
]


def _rotary(name, dtype):
    return posenc.Rotary(DIM) if name == "none" and dtype == torch.float64 else None


def _inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, SEQ, DIM, generator=gen)
    k = torch.randn(1, KV_HEADS, SEQ, DIM, generator=gen)
    v = torch.randn(1, KV_HEADS, SEQ, DIM, generator=gen)
    dout = torch.randn(1, HEADS, SEQ, DIM, generator=gen)
    return [t.to(dtype) for t in (q, k, v, dout)]


def _bias(name, dtype):
    torch.manual_seed(1)
    bias = BIASES[name]()
    return None if bias is None else bias.to(dtype)


def _rank_main(rank: int, world_size: int, workdir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world_size
    )
    try:
        results = {}
        for case in CASES:
            layout, causal, name, dtype = case
            bias = _bias(name, dtype)
            q, k, v, dout = (shard(t, -2, world_size, rank, layout) for t in _inputs(dtype))
            inputs = [t.requires_grad_(True) for t in (q, k, v)]
            rotary = _rotary(name, dtype)
            out = ring_attention(
                *inputs, layout=layout, bias=bias, rotary=rotary, causal=causal
            )  # fmt: skip
            params = [] if bias is None else [p for p in bias.parameters() if p.requires_grad]
            grads = torch.autograd.grad(out, [*inputs, *params], dout)
            whole = [gather(t.detach(), -2, layout) for t in (out, *grads[:3])]
            for g in grads[3:]:
                dist.all_reduce(g)  # each rank's share of the parameters' gradients
            results[case] = [*whole, *grads[3:]]
        if rank == 0:
            torch.save(results, Path(workdir, "results.pt"))
        Path(workdir, f"rank{rank}.ok").write_text("ok")
    finally:
        dist.destroy_process_group()


def _run_ranks(world_size, workdir):
    run_forked(_rank_main, world_size, Path(workdir), seconds=300)
    assert len(list(Path(workdir).glob("*.ok"))) == world_size
    return torch.load(Path(workdir, "results.pt"))


def _single(case):
    """posenc.attention over the whole sequence in one process, and its gradients."""
    _, causal, name, dtype = case
    bias = _bias(name, dtype)
    q, k, v, dout = _inputs(dtype)
    inputs = [t.requires_grad_(True) for t in (q, k, v)]
    out = posenc.attention(*inputs, bias=bias, rotary=_rotary(name, dtype), causal=causal)
    params = [] if bias is None else [p for p in bias.parameters() if p.requires_grad]
    return [out.detach(), *torch.autograd.grad(out, [*inputs, *params], dout)]


@pytest.mark.parametrize("world_size", [2, 4])
def test_ring_attention_equals_one_process(tmp_path, world_size):
    posenc.attention(*_inputs(torch.float32)[:3], rotary=posenc.Rotary(DIM))  # lazy imports
    results = _run_ranks(world_size, tmp_path)
    for case, got in results.items():
        _, causal, name, dtype = case
        if dtype == torch.float64:
            # the same sums in another order, and W merges of partial softmaxes: a few
            # hundred roundings of 2**-53 relative to magnitudes of order 1
            for a, b in zip(got, _single(case), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=str(case))
            continue
        # float32 through the compiled loops against float64 in one process. The
        # ring splits each query's keys into at most 2 W blocks merged by their
        # log-sum-exp (3 roundings per merge): fewer terms per sum than the
        # one-process loop's, and the merges are among the online rescales the
        # bounds count, so its bounds hold
        bias = _bias(name, torch.float32)
        q, k, v, dout = _inputs(torch.float32)
        exact = [t.double().requires_grad_(True) for t in (q, k, v)]
        bias64 = None if bias is None else copy.deepcopy(bias).double()
        mask = torch.ones(1, SEQ, dtype=torch.bool)
        ref = dense(*exact, bias64, causal=causal, scale=DIM**-0.5, mask=mask)
        params64 = [] if bias64 is None else [p for p in bias64.parameters() if p.requires_grad]
        want = [ref.detach(), *torch.autograd.grad(ref, [*exact, *params64], dout.double())]
        tq, tk, tv, tt, tmax, _, _, tout = bounds(
            q, k, v, dout, bias, causal=causal, scale=DIM**-0.5, mask=mask
        )
        tols = [tout, tq, tk, tv]
        if params64:
            tols += param_bounds(bias, SEQ, SEQ, tt, tmax)
        names = ["out", "dq", "dk", "dv", "dparam"][: len(tols)]
        for a, b, t, what in zip(got, want, tols, names, strict=True):
            err = (a.double() - b).abs()
            assert bool((err <= t).all()), f"{case} {what}: {float(err.max()):.3g} > bound"


def test_ring_attention_needs_a_process_group():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="group"):
        ring_attention(q, q, q)


def test_ring_attention_refuses_query_variants(tmp_path):
    """A rotation with a query per (query, key) pair (Dual Chunk Attention) is refused:
    the ring's blocks score one query per pair."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdv", rank=0, world_size=1)
    try:
        q = torch.randn(1, 2, 8, 16)
        dca = posenc.DualChunkRotary(16, chunk_size=4, local_size=1)
        with pytest.raises(ValueError, match="query variants"):
            ring_attention(q, q, q, rotary=dca, causal=True)
    finally:
        dist.destroy_process_group()
