"""posenc on a CUDA device: tables, modules under torch.compile, the fused rotation,
ring attention over nccl, a patched HF model and the lab.

Each test takes the ``device`` fixture: its CUDA variant is marked ``gpu`` and
skipped, with its reason, where torch sees no CUDA device (``make gpu-check`` runs
it on a GPU machine; FlexAttention's checks are in ``tests/test_gpu_attention.py``),
and its CPU variant runs the same body on CPU tensors in the CPU suite, so the
imports, signatures and arithmetic these tests rely on stay checked between GPU
runs. On CPU the fused Triton rotation runs under Triton's interpreter
(``TRITON_INTERPRET=1``), taken by ``"auto"`` as on CUDA (``fused``), and the shapes
are smaller. What needs a GPU stays GPU-only and each such test says why: what
``"auto"`` takes on CUDA tensors, nccl between two processes.

Tolerances, with U = 2**-24 (float32's unit roundoff):

- exact tables are computed in float64 on CUDA as on CPU, then rounded once to
  float32: against float64 truth each value is within half a float32 ulp of a value
  below 1 plus float64's own error, so within ``U`` absolutely;
- the rotation multiplies and adds in float32, each product and the sum rounded once
  (the Triton kernel is compiled without fused multiply-adds, as torch's eager ops
  run): the same bits as the eager float32 formula, then one rounding to the input's
  dtype (which Triton's interpreter does toward zero for bfloat16: ``same_bits``);
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
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import posenc
from conftest import anchor, one_thread
from gpu_markers import no_cuda
from posenc.families.rotary import apply
from posenc.families.rotary.apply import _angles, _rotate_functional

U = 2.0**-24
NO_CUDA = no_cuda()


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA])])
def device(request: pytest.FixtureRequest) -> Iterator[torch.device]:
    """The CPU variant (the CPU suite) and the CUDA one (``make gpu-check``) of a test.

    The CPU variants' tensors are tiny: they run on one torch thread
    (conftest.one_thread; the lab's training here: 20x slower on 2 loaded cores).
    """
    if request.param == "cuda":
        yield torch.device("cuda")
        return
    with one_thread():
        yield torch.device("cpu")


@pytest.fixture
def fused(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The launches of the fused Triton rotation that "auto" takes on CUDA.

    On CPU tensors it runs under Triton's interpreter (``TRITON_INTERPRET=1``, for
    this test only: ``triton.jit`` reads it when it wraps the kernel, which
    posenc.core.triton_rotary does once per mode), and "auto" is made to take it
    wherever it applies, as on CUDA (on CPU it takes the C kernel).
    """
    from posenc.core import triton_rotary

    launches: list[int] = []
    launch = triton_rotary.launch
    monkeypatch.setattr(
        triton_rotary, "launch", lambda *a, **kw: launches.append(1) or launch(*a, **kw)
    )
    if device.type == "cpu":
        anchor("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        resolve = apply._resolve_backend

        def auto_takes_triton(backend, xs):
            if backend == "auto" and all(map(apply._triton_applies, xs)):
                backend = "triton"
            return resolve(backend, xs)

        monkeypatch.setattr(apply, "_resolve_backend", auto_takes_triton)
    yield launches


# ------------------------------------------------------------------ exact tables


def test_sinusoidal_is_exact(device):
    positions = torch.tensor([0, 1, 7, 10_000, 999_999, 10**7, 2**31 - 1], device=device)
    got = posenc.sinusoidal(positions, 64)
    assert got.device.type == device.type and got.dtype == torch.float32
    want = posenc.sinusoidal(positions.cpu().numpy(), 64, dtype=np.float64)
    assert np.abs(got.cpu().double().numpy() - want).max() <= U


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotary_tables_match_cpu_float64(layout, device):
    rope = posenc.Rotary(128, layout=layout).to(device)
    positions = torch.tensor([0, 3, 2047, 70_000, 2**31 - 1])
    c, s = rope.cos_sin(positions.to(device))
    c64, s64 = posenc.Rotary(128, layout=layout).cos_sin(positions, dtype=torch.float64)
    assert (c.cpu().double() - c64).abs().max() <= U
    assert (s.cpu().double() - s64).abs().max() <= U


# ------------------------------------------------------------------ modules, compiled

Q = (2, 4, 16, 32)


def _modules(device):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(Q, generator=gen).to(device)
    x = torch.randn(2, 16, 32, generator=gen).to(device)

    def attend(m):
        return posenc.attention(q, q, q, bias=m, causal=True)

    return {  # name -> (module, run): run(module) on tensors on device
        "SinusoidalEmbedding": (posenc.SinusoidalEmbedding(32, max_len=64), lambda m: m(x)),
        "LearnedPositionalEmbedding": (
            posenc.LearnedPositionalEmbedding(64, 32),
            lambda m: m(torch.arange(16, device=device)),
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
def test_module_under_compile(name, device):
    """Each module's forward under torch.compile (graph breaks allowed) equals eager.

    On CUDA inductor compiles it (Triton code); on CPU the graphs are traced and run
    by ``aot_eager`` (dynamo and AOT autograd, no code generation): inductor would
    generate C++ there, not the GPU's Triton, at seconds per module.
    """
    module, run = _modules(device)[name]
    module = module.to(device)
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    torch._dynamo.reset()
    with torch.no_grad():  # the forward; the backward on CUDA: test_gpu_attention.py
        eager = run(module)
        compiled = torch.compile(run, fullgraph=False, backend=backend)(module)
    eager, compiled = (t if isinstance(t, tuple) else (t,) for t in (eager, compiled))
    for a, b in zip(eager, compiled, strict=True):
        assert a.device.type == device.type and a.shape == b.shape
        # inductor may fuse and reorder float32 sums: a few U of the magnitudes
        torch.testing.assert_close(b, a, rtol=0, atol=64 * U * (1 + float(a.abs().max())))


# ------------------------------------------------------------------ the fused rotation


def _eager_formula(x, cos, sin, layout, rotary_dim):
    """The float32 formula in torch's eager ops (each product and sum rounded once)."""
    c, s = _angles(cos, sin, layout, torch.float32)
    return _rotate_functional(x, c, s, rotary_dim, layout)


def same_bits(got, x, cos, sin, layout, rotary_dim):
    """``got`` is the eager formula's result for ``x``, bit for bit; but where Triton's
    interpreter (CPU tensors) rounds float32 to bfloat16, which it does toward zero
    where torch rounds to nearest even: there ``got`` is one of the two bfloat16
    neighbours of the float32 result ``y``, torch's or ``y`` truncated."""
    want = _eager_formula(x, cos, sin, layout, rotary_dim)
    if x.dtype != torch.bfloat16 or got.device.type == "cuda":
        return torch.equal(got, want)
    y = _eager_formula(x.float(), cos, sin, layout, rotary_dim).contiguous()
    truncated = (y.view(torch.int32) & -(2**16)).view(torch.float32).to(torch.bfloat16)
    return bool(((got == want) | (got == truncated)).all())


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rotary_dim", [128, 64])
def test_rotary_forward_and_backward(layout, dtype, rotary_dim, device, fused):
    # 300 positions on CUDA, 5 under the interpreter; 128 channels, 64 of them rotated
    # in the partial case, either way. bfloat16 bit for bit is CUDA's alone: the
    # interpreter rounds it toward zero (same_bits)
    seq = 300 if device.type == "cuda" else 5
    gen = torch.Generator().manual_seed(1)
    rope = posenc.Rotary(128, layout=layout, rotary_dim=rotary_dim).to(device)
    q = torch.randn(2, 8, seq, 128, generator=gen).to(device, dtype).requires_grad_(True)
    k = torch.randn(2, 2, seq, 128, generator=gen).to(device, dtype).requires_grad_(True)
    gq = torch.randn(q.shape, generator=gen).to(device, dtype)
    gk = torch.randn(k.shape, generator=gen).to(device, dtype)
    oq, ok = rope(q, k, offset=1000)
    cos, sin = rope.cos_sin(torch.arange(1000, 1000 + seq, device=device))
    # the Triton kernel rounds as the eager float32 formula does: the same bits
    assert same_bits(oq, q.detach(), cos, sin, layout, rotary_dim)
    assert same_bits(ok, k.detach(), cos, sin, layout, rotary_dim)
    dq, dk = torch.autograd.grad((oq, ok), (q, k), (gq, gk))
    # the backward is the inverse rotation (negated sin), by the same kernel
    assert same_bits(dq, gq, cos, -sin, layout, rotary_dim)
    assert same_bits(dk, gk, cos, -sin, layout, rotary_dim)
    assert fused == [1, 1]  # q and k in one launch, forward and backward


@pytest.mark.gpu
@NO_CUDA
def test_triton_backend_is_what_auto_takes_on_cuda(monkeypatch):
    """GPU-only: what "auto" chooses for CUDA tensors, which only CUDA tensors ask
    (tests/test_rotary_backends.py checks the CPU's choice, the C kernel)."""
    from posenc.core import triton_rotary

    cuda = torch.device("cuda")
    calls = []
    real = triton_rotary.launch
    monkeypatch.setattr(triton_rotary, "launch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rope = posenc.Rotary(64).to(cuda)
    q = torch.randn(1, 4, 10, 64, device=cuda)
    rope(q, q[:, :2])
    assert calls == [1]  # q and k in one launch


@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_rotary_packed_and_strided(seq_dim, device, fused):
    rope = posenc.Rotary(64, seq_dim=seq_dim).to(device)
    x = torch.randn(3, 16, 4, 64, device=device)
    q = x if seq_dim == -3 else x.transpose(1, 2)  # non-contiguous for seq_dim=-2
    got, _ = rope(q, q)
    cpu_rope = posenc.Rotary(64, seq_dim=seq_dim)
    want, _ = cpu_rope(q.cpu().double(), q.cpu().double())
    # float32 products of |x| <= 6 and a sum: within 3 U (|x1| + |x2|) of exact
    assert (got.cpu().double() - want).abs().max() <= 3 * U * 2 * float(q.abs().max())
    packed = posenc.Rotary(64).to(device)
    tokens = torch.randn(20, 4, 64, device=device)
    cu = torch.tensor([0, 7, 20], device=device)
    pq, _ = packed(tokens, tokens, cu_seqlens=cu)
    first, _ = packed(tokens[None, :7].transpose(1, 2), tokens[None, :7].transpose(1, 2))
    assert torch.equal(pq[:7], first[0].transpose(0, 1))
    assert len(fused) == 3  # every float32 rotation here took the Triton kernel


# ------------------------------------------------------------------ ring attention


def _rotate64(x, base=10000.0):
    """x (..., n, d) rotated at positions 0 .. n - 1 in float64, the half layout written
    out, its cos and sin rounded to float32 as posenc's tables are (exact angles,
    rounded once)."""
    n, d = x.shape[-2:]
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(n, dtype=torch.float64)[:, None] * omega
    c, s = (t.float().double() for t in (torch.cos(angle), torch.sin(angle)))
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def test_ring_attention_world_size_one_equals_dense_float64(tmp_path, device):
    """The ring in a process group of one (nccl on CUDA, gloo on CPU) against softmax
    attention written out here in float64: ALiBi's ``slope_h (key - query)``, rotary
    at positions 0 .. 63, the causal mask.

    A world of one holds the whole sequence and exchanges nothing: this checks the
    ring's own arithmetic and bookkeeping (global positions, the bias table over the
    sequence's relative positions, the causal blocks, the merge by log-sum-exp) and
    that it runs in a real process group of that backend. Its exchanges between
    ranks: test_ring_attention_two_processes_on_one_gpu below (nccl) and
    tests/test_ring_attention.py (gloo, 2 and 4 ranks against one process).
    """
    import torch.distributed as dist

    from posenc.integration.context_parallel import ring_attention

    n, d = 64, 32
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4, n, d, generator=gen, dtype=torch.float64) for _ in range(3))
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store,
                            rank=0, world_size=1)  # fmt: skip
    try:
        got = ring_attention(
            *(t.to(device) for t in (q, k, v)), bias=posenc.ALiBi(4).double().to(device),
            rotary=posenc.Rotary(d).to(device), causal=True,
        ).cpu()  # fmt: skip
    finally:
        dist.destroy_process_group()

    i = torch.arange(n, dtype=torch.float64)
    slopes = 2.0 ** (-2.0 * torch.arange(1, 5, dtype=torch.float64))  # 2**(-8 h / 4)
    bias = slopes[:, None, None] * (i[None, :] - i[:, None])
    rq, rk = _rotate64(q), _rotate64(k)
    scores = rq @ rk.transpose(-1, -2) / math.sqrt(d) + bias
    causal = i[None, :] <= i[:, None]
    want = torch.softmax(scores.masked_fill(~causal, -math.inf), -1) @ v
    # Both sides round in float64 (u = 2**-53), the ring's rotation with float32 tables
    # as the reference's. A score carries the d-term dot product's d u, the rotation's
    # 4 u of each factor (8 u), the scale and the bias add: e_s <= (d + 10) u S, S the
    # largest sum of |terms| (|rq|.|rk| / sqrt(d) + |bias|). A weight is off by 2 e_s
    # (its score and the normaliser's) plus (n + 4) u (exp, the n-term sum, the
    # division), the merge of partial softmaxes adds 8 u, and out = sum_j p_j v_j its
    # n u: |error| <= max|v| (2 e_s + (2 n + 12) u), for each side: twice that
    u = 2.0**-53
    big = float((rq.abs() @ rk.abs().transpose(-1, -2) / math.sqrt(d) + bias.abs()).max())
    e_s = (d + 10) * u * big
    bound = 2 * float(v.abs().max()) * (2 * e_s + (2 * n + 12) * u)
    assert got.dtype == torch.float64
    assert float((got - want).abs().max()) <= bound


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


@pytest.mark.gpu
@NO_CUDA
def test_ring_attention_two_processes_on_one_gpu(tmp_path):
    """GPU-only: two nccl ranks on one GPU against one process (the same with gloo
    on CPU: tests/test_ring_attention.py)."""
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
def test_patch_model_keeps_the_logits(device):
    transformers = anchor("transformers")
    from posenc import hf

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        num_hidden_layers=2, vocab_size=100, initializer_range=0.5,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).to(device).eval()
    ids = torch.randint(3, 100, (2, 40), device=device)
    with torch.no_grad():
        before = model(ids).logits
        hf.patch_model(model)
        after = model(ids).logits
    assert type(model.model.rotary_emb).__name__ == "HFRotaryEmbedding"
    # HF's float32 tables at positions < 40 err by at most 40 * (2**-23 * (4 + ln 1e4)
    # + U) + 2**-22 relative (tests/test_hf.py); the logits move by 10x that
    e = 40 * (2.0**-23 * (4 + math.log(1e4)) + U) + 2.0**-22
    assert (after - before).abs().max() <= 10 * e * before.abs().max()


def test_lab_trains_on_the_device(tmp_path, device):
    """Fifty steps of a two-layer model on CUDA; on CPU, for time, thirty steps of a
    one-layer model (tests/test_lab.py trains every encoding on CPU): the model, its
    batches, checkpoints and copies on the device."""
    from posenc.faces.lab.training import LabConfig, _World, train

    size = {"d_model": 64, "layers": 2, "heads": 4, "train_len": 8, "steps": 50}
    if device.type == "cpu":
        size = {"d_model": 32, "layers": 1, "heads": 2, "train_len": 3, "steps": 30}
    config = LabConfig(
        task="copy", encodings=("rope",), test_len=12, seeds=1, batch_size=16, lr=3e-3,
        eval_examples=8, checkpoint_every=25, **size,
    )  # fmt: skip
    model, losses = train(config, "rope", 0, directory=tmp_path, world=_World(device=device))
    assert next(model.parameters()).device.type == device.type
    assert len(losses) == config.steps and all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-10:]) < np.mean(losses[:10])  # it learns
    again = copy.deepcopy(model)
    assert next(again.parameters()).device.type == device.type
