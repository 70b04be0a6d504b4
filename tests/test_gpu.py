"""posenc on a CUDA device: tables, modules under torch.compile, the fused rotation,
ring attention over nccl, a patched HF model and the lab.

Every test here is marked ``gpu`` and skipped, with its reason, where torch sees no
CUDA device (``make gpu-check`` runs them on a GPU machine; FlexAttention's checks
are in ``tests/test_gpu_attention.py``). The CPU suite tests the same code paths on
CPU tensors (the Triton kernel under ``TRITON_INTERPRET=1``).

Tolerances, with U = 2**-24 (float32's unit roundoff):

- exact tables are computed in float64 on CUDA as on CPU, then rounded once to
  float32: against float64 truth each value is within half a float32 ulp of a value
  below 1 plus float64's own error, so within ``U`` absolutely;
- the rotation multiplies and adds in float32, each product and the sum rounded once
  (the Triton kernel is compiled without fused multiply-adds, as torch's eager ops
  run): the same bits as the eager float32 formula, then one rounding to the input's
  dtype;
- logits of a patched model: as tests/test_hf.py derives, a relative table error
  ``e`` moves them by at most ``10 e max|logits|``.
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import posenc
from posenc.families.rotary.apply import _angles, _rotate_functional

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

U = 2.0**-24
CUDA = torch.device("cuda")


# ------------------------------------------------------------------ exact tables


def test_sinusoidal_on_cuda_is_exact():
    positions = torch.tensor([0, 1, 7, 10_000, 999_999, 10**7, 2**31 - 1], device=CUDA)
    got = posenc.sinusoidal(positions, 64)
    assert got.device.type == CUDA.type and got.dtype == torch.float32
    want = posenc.sinusoidal(positions.cpu().numpy(), 64, dtype=np.float64)
    assert np.abs(got.cpu().double().numpy() - want).max() <= U


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotary_tables_on_cuda_match_cpu_float64(layout):
    rope = posenc.Rotary(128, layout=layout).to(CUDA)
    positions = torch.tensor([0, 3, 2047, 70_000, 2**31 - 1])
    c, s = rope.cos_sin(positions.to(CUDA))
    c64, s64 = posenc.Rotary(128, layout=layout).cos_sin(positions, dtype=torch.float64)
    assert (c.cpu().double() - c64).abs().max() <= U
    assert (s.cpu().double() - s64).abs().max() <= U


# ------------------------------------------------------------------ modules, compiled

Q = (2, 4, 16, 32)


def _modules():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(Q, generator=gen).to(CUDA)
    x = torch.randn(2, 16, 32, generator=gen).to(CUDA)

    def attend(m):
        return posenc.attention(q, q, q, bias=m, causal=True)

    return {  # name -> (module, run): run(module) on CUDA tensors
        "SinusoidalEmbedding": (posenc.SinusoidalEmbedding(32, max_len=64), lambda m: m(x)),
        "LearnedPositionalEmbedding": (
            posenc.LearnedPositionalEmbedding(64, 32),
            lambda m: m(torch.arange(16, device=CUDA)),
        ),
        "Rotary": (posenc.Rotary(32), lambda m: m(q, q)),
        "Rotary interleaved, partial": (
            posenc.Rotary(32, rotary_dim=16, layout="interleaved"),
            lambda m: m(q, q, offset=5),
        ),
        "ALiBi": (posenc.ALiBi(4), attend),
        "T5Bias": (posenc.T5Bias(4), attend),
        "KERPLE": (posenc.KERPLE(4), attend),
        "Sandwich": (posenc.Sandwich(4, dim=32), attend),
        "FIRE": (posenc.FIRE(4), attend),
    }


MODULE_NAMES = [
    "SinusoidalEmbedding",
    "LearnedPositionalEmbedding",
    "Rotary",
    "Rotary interleaved, partial",
    "ALiBi",
    "T5Bias",
    "KERPLE",
    "Sandwich",
    "FIRE",
]


@pytest.mark.parametrize("name", MODULE_NAMES)
def test_module_on_cuda_under_compile(name):
    module, run = _modules()[name]
    module = module.to(CUDA)
    torch._dynamo.reset()
    with torch.no_grad():  # the forward; the backward on CUDA: test_gpu_attention.py
        eager = run(module)
        compiled = torch.compile(run, fullgraph=False)(module)
    eager, compiled = (t if isinstance(t, tuple) else (t,) for t in (eager, compiled))
    for a, b in zip(eager, compiled, strict=True):
        assert a.device.type == CUDA.type and a.shape == b.shape
        # inductor may fuse and reorder float32 sums: a few U of the magnitudes
        torch.testing.assert_close(b, a, rtol=0, atol=64 * U * (1 + float(a.abs().max())))


# ------------------------------------------------------------------ the fused rotation


def _eager_formula(x, cos, sin, layout, rotary_dim):
    """The float32 formula in torch's eager ops (each product and sum rounded once)."""
    c, s = _angles(cos, sin, layout, torch.float32)
    return _rotate_functional(x, c, s, rotary_dim, layout)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rotary_dim", [128, 64])
def test_rotary_forward_and_backward_on_cuda(layout, dtype, rotary_dim):
    gen = torch.Generator().manual_seed(1)
    rope = posenc.Rotary(128, layout=layout, rotary_dim=rotary_dim).to(CUDA)
    q = torch.randn(2, 8, 300, 128, generator=gen).to(CUDA, dtype).requires_grad_(True)
    k = torch.randn(2, 2, 300, 128, generator=gen).to(CUDA, dtype).requires_grad_(True)
    gq = torch.randn(q.shape, generator=gen).to(CUDA, dtype)
    gk = torch.randn(k.shape, generator=gen).to(CUDA, dtype)
    oq, ok = rope(q, k, offset=1000)
    cos, sin = rope.cos_sin(torch.arange(1000, 1300, device=CUDA))
    # the Triton kernel rounds as the eager float32 formula does: the same bits
    assert torch.equal(oq, _eager_formula(q.detach(), cos, sin, layout, rotary_dim))
    assert torch.equal(ok, _eager_formula(k.detach(), cos, sin, layout, rotary_dim))
    dq, dk = torch.autograd.grad((oq, ok), (q, k), (gq, gk))
    # the backward is the inverse rotation (negated sin), by the same kernel
    assert torch.equal(dq, _eager_formula(gq, cos, -sin, layout, rotary_dim))
    assert torch.equal(dk, _eager_formula(gk, cos, -sin, layout, rotary_dim))


def test_triton_backend_is_what_auto_takes_on_cuda(monkeypatch):
    from posenc.core import triton_rotary

    calls = []
    real = triton_rotary.launch
    monkeypatch.setattr(triton_rotary, "launch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rope = posenc.Rotary(64).to(CUDA)
    q = torch.randn(1, 4, 10, 64, device=CUDA)
    rope(q, q[:, :2])
    assert calls == [1]  # q and k in one launch


@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_rotary_packed_and_strided_on_cuda(seq_dim):
    rope = posenc.Rotary(64, seq_dim=seq_dim).to(CUDA)
    x = torch.randn(3, 16, 4, 64, device=CUDA)
    q = x if seq_dim == -3 else x.transpose(1, 2)  # non-contiguous for seq_dim=-2
    got, _ = rope(q, q)
    cpu_rope = posenc.Rotary(64, seq_dim=seq_dim)
    want, _ = cpu_rope(q.cpu().double(), q.cpu().double())
    # float32 products of |x| <= 6 and a sum: within 3 U (|x1| + |x2|) of exact
    assert (got.cpu().double() - want).abs().max() <= 3 * U * 2 * float(q.abs().max())
    packed = posenc.Rotary(64).to(CUDA)
    tokens = torch.randn(20, 4, 64, device=CUDA)
    cu = torch.tensor([0, 7, 20], device=CUDA)
    pq, _ = packed(tokens, tokens, cu_seqlens=cu)
    first, _ = packed(tokens[None, :7].transpose(1, 2), tokens[None, :7].transpose(1, 2))
    assert torch.equal(pq[:7], first[0].transpose(0, 1))


# ------------------------------------------------------------------ ring attention, nccl


def _init_single_nccl(tmp_path: Path) -> None:
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)


def test_ring_attention_over_nccl_world_size_one(tmp_path):
    import torch.distributed as dist

    from posenc.integration.context_parallel import ring_attention

    _init_single_nccl(tmp_path)
    try:
        gen = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(1, 4, 64, 32, generator=gen).to(CUDA) for _ in range(3))
        bias = posenc.ALiBi(4).to(CUDA)
        rope = posenc.Rotary(32).to(CUDA)
        got = ring_attention(q, k, v, bias=bias, rotary=rope, causal=True)
        want = posenc.attention(q, k, v, bias=bias, rotary=rope, causal=True)
        # the same scores summed in another order: float32 rounding of sums of 64 terms
        torch.testing.assert_close(got, want, rtol=0, atol=64 * 8 * U)
    finally:
        dist.destroy_process_group()


_TWO_RANKS = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    import posenc
    from posenc.integration.context_parallel import ring_attention, shard
    rank, world = int(sys.argv[1]), 2
    store = dist.FileStore(sys.argv[2], world)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world)
    torch.cuda.set_device(0)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4, 128, 32, generator=gen).cuda() for _ in range(3))
    bias = posenc.ALiBi(4).cuda()
    whole = posenc.attention(q, k, v, bias=bias, causal=True)
    parts = [shard(t, -2, world, rank, "zigzag") for t in (q, k, v)]
    got = ring_attention(*parts, bias=bias, causal=True, layout="zigzag")
    want = shard(whole, -2, world, rank, "zigzag")
    err = (got - want).abs().max().item()
    print("max error", err)
    dist.destroy_process_group()
    sys.exit(0 if err <= 128 * 8 * 2.0**-24 else 1)
    """
)


def test_ring_attention_two_processes_on_one_gpu(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(_TWO_RANKS)
    env = {**os.environ, "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "0"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(tmp_path / "store")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in range(2)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail("two nccl ranks on one GPU did not finish in 120 s")
    if any("Duplicate GPU" in o for o in outs):
        pytest.skip("nccl refuses two ranks on one GPU here: " + outs[0][-300:])
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)


# ------------------------------------------------------------------ HF and the lab


@pytest.mark.usefixtures("quiet_transformers")
def test_patch_model_on_cuda_keeps_the_logits():
    from transformers import LlamaConfig, LlamaForCausalLM

    from posenc import hf

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        num_hidden_layers=2, vocab_size=100, initializer_range=0.5,
    )  # fmt: skip
    model = LlamaForCausalLM(config).to(CUDA).eval()
    ids = torch.randint(3, 100, (2, 40), device=CUDA)
    with torch.no_grad():
        before = model(ids).logits
        hf.patch_model(model)
        after = model(ids).logits
    assert type(model.model.rotary_emb).__name__ == "HFRotaryEmbedding"
    # HF's float32 tables at positions < 40 err by at most 40 * (2**-23 * (4 + ln 1e4)
    # + U) + 2**-22 relative (tests/test_hf.py); the logits move by 10x that
    e = 40 * (2.0**-23 * (4 + math.log(1e4)) + U) + 2.0**-22
    assert (after - before).abs().max() <= 10 * e * before.abs().max()


def test_lab_trains_fifty_steps_on_cuda(tmp_path):
    from posenc.faces.lab.run import LabConfig, _World, train

    config = LabConfig(
        task="copy", encodings=("rope",), train_len=8, test_len=12, seeds=1, steps=50,
        batch_size=16, lr=3e-3, d_model=64, layers=2, heads=4, eval_examples=8,
        checkpoint_every=25,
    )  # fmt: skip
    model, losses = train(config, "rope", 0, directory=tmp_path, world=_World(device=CUDA))
    assert next(model.parameters()).device.type == CUDA.type
    assert len(losses) == 50 and all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-10:]) < np.mean(losses[:10])  # it learns
    again = copy.deepcopy(model)
    assert next(again.parameters()).device.type == CUDA.type
