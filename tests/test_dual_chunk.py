"""Dual Chunk Attention (Qwen2.5-1M): posenc.DualChunkRotary against vLLM's own rotation and
against its attention written out in float64.

The rotation is compared with vLLM's ``DualChunkRotaryEmbedding.forward_native``, run in
the vLLM environment that ``posenc engines build vllm`` makes (its module asks
``torch.accelerator`` for a CUDA device in its constructor; the script lets that module
see the CPU instead, and everything else is vLLM's code). vLLM's attention for it (the
``DUAL_CHUNK_FLASH_ATTN`` backend, ``vllm/attention/backends/dual_chunk_flash_attn.py``)
left vLLM with its V0 engine and needs flash-attn's CUDA kernels, so the attention is
compared with its dense paths written out in float64 here: per chunk of queries, an
intra-chunk causal attention, a successive-chunk and an inter-chunk attention, merged by
their log-sum-exps as its ``_merge_attn_outputs`` merges them; keys and the softmax scale
(or the decoding query) each scaled by ``max(1, 0.1 ln(n / original) + 1)``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess

import pytest
import torch

import posenc
from conftest import built_engine

F64 = torch.float64
U32 = 2.0**-24  # float32's unit roundoff

VLLM_SCRIPT = r"""
import json, os, sys, types
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding import get_rope
import vllm.model_executor.layers.rotary_embedding.dual_chunk_rope as module

class CpuTorch:  # the module's torch, but its device is the CPU
    def __getattr__(self, name):
        return getattr(torch, name)
    accelerator = types.SimpleNamespace(current_device_index=lambda: 0)
    @staticmethod
    def device(*args):
        return torch.device("cpu")

module.torch = CpuTorch()
args = json.loads(sys.argv[1])
out = []
for case in args["cases"]:
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(case["head"], case["max_position"], case["neox"],
                        {"rope_theta": case["base"], "partial_rotary_factor": case["partial"]},
                        torch.float32, {"chunk_size": case["chunk"], "local_size": case["local"]})
    assert type(rope).__name__ == "DualChunkRotaryEmbedding", type(rope)
    g = torch.Generator().manual_seed(0)
    n, h = case["n"], case["head"]
    q = torch.randn(n, 2 * h, generator=g)
    k = torch.randn(n, h, generator=g)
    qq, kk = rope.forward_native(torch.arange(n), q.clone(), k.clone())
    out.append({"q": q.tolist(), "k": k.tolist(), "qq": qq.tolist(), "kk": kk.tolist()})
print(json.dumps(out))
"""

CASES = [
    {"head": 64, "partial": 1.0, "neox": True, "chunk": 16, "local": 4, "base": 10000.0},
    {"head": 64, "partial": 0.5, "neox": False, "chunk": 12, "local": 5, "base": 1e6},
]
N = 45  # 3.75 chunks of 12 (and of 7): every variant, inter beyond two chunks


@pytest.fixture(scope="module")
def vllm_rotations():
    python = built_engine("vllm")
    cases = [{**c, "n": N, "max_position": 64} for c in CASES]
    run = subprocess.run(
        [str(python), "-c", VLLM_SCRIPT, json.dumps({"cases": cases})],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _module(case, **extra):
    return posenc.DualChunkRotary(
        case["head"], chunk_size=case["chunk"], local_size=case["local"], base=case["base"],
        rotary_dim=int(case["head"] * case["partial"]),
        layout="half" if case["neox"] else "interleaved", **extra,
    )  # fmt: skip


@pytest.mark.parametrize("which", range(len(CASES)))
def test_rotations_equal_vllms(vllm_rotations, which):
    case, got = CASES[which], vllm_rotations[which]
    h = case["head"]
    q = torch.tensor(got["q"]).view(1, N, 2, h).transpose(1, 2)  # (1, heads, N, h)
    k = torch.tensor(got["k"]).view(1, 1, N, h)
    pos = torch.arange(N)
    pair = _module(case).rotate_pair(q, k, pos, pos)
    # its five variants side by side, each (heads, h): ours are the first three
    want_q = torch.tensor(got["qq"]).view(N, 5, 2, h)[:, :3]
    want_q = want_q.permute(2, 0, 1, 3).reshape(1, 2, N, 3 * h)
    want_k = torch.tensor(got["kk"]).view(1, 1, N, h)
    # vLLM's angles are float32 products t * inv_freq (t <= chunk_size): 2 roundings of an
    # angle below chunk_size, cos/sin rounded once more, then x cos + rot(x) sin (2 more)
    t = case["chunk"]
    bound = (2 * t + 4) * U32 * max(q.abs().max(), k.abs().max()) * 2
    for got_t, want_t in ((pair.q, want_q), (pair.k, want_k)):
        err = (got_t - want_t).abs().max()
        assert err <= bound, (err, bound)
    # near miss: the inter query one position earlier is seen at this bound
    off = pair.q.clone()
    inter = min(2 * (t - case["local"]) - 1, t)
    off[..., 2 * h :] = _module(case).rotary.rotate((q,), torch.full((N,), inter - 1))[0]
    assert (off - want_q).abs().max() > 10 * bound


def _merged_reference(q, k, v, dca, scale, original=None):
    """vLLM's dense prefill of one sequence written out in float64: per chunk of queries,
    intra (causal), successive and inter attentions merged by their log-sum-exps."""
    lq, lk, h = q.shape[2], k.shape[2], q.shape[-1]
    L, c = dca.chunk_len, dca.chunk_size
    rope = posenc.Rotary(h, base=dca.rotary.base, rotary_dim=dca.rotary.rotary_dim,
                         layout=dca.rotary.layout)  # fmt: skip
    k_rot = rope.rotate((k,), torch.arange(lk) % L)[0]
    if original:
        s = max(1.0, 0.1 * math.log(lk / original) + 1)
        k_rot, scale = k_rot * s, scale * s
    out = torch.empty(*q.shape[:3], v.shape[-1], dtype=F64)
    for qi in range(lq):
        i = qi + lk - lq
        chunk = i // L
        parts = []
        for rot_at, keys in (
            (i % L, range(chunk * L, i + 1)),
            (min(i % L + L, c), range(max(0, (chunk - 1) * L), chunk * L)),
            (min(2 * L - 1, c), range(0, max(0, (chunk - 1) * L))),
        ):
            if not len(keys):
                continue
            qr = rope.rotate((q[:, :, qi : qi + 1],), torch.tensor([rot_at]))[0]
            kk = list(keys)
            z = (qr @ k_rot[:, :, kk].transpose(-1, -2)) * scale
            lse = torch.logsumexp(z, -1)
            parts.append((torch.softmax(z, -1) @ v[:, :, kk], lse))
        lses = torch.stack([p[1] for p in parts])
        weights = torch.softmax(lses, 0)
        out[:, :, qi : qi + 1] = sum(
            w[..., None] * p[0] for w, p in zip(weights, parts, strict=True)
        )
    return out


def _qkv(lq, lk, heads=2, kv_heads=2, dim=16, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, lq, dim, generator=g, dtype=F64)
    k, v = (torch.randn(1, kv_heads, lk, dim, generator=g, dtype=F64) for _ in "kv")
    return (t.requires_grad_(requires_grad) for t in (q, k, v))


@pytest.mark.parametrize(("lq", "lk"), [(30, 30), (1, 30), (5, 26)])
@pytest.mark.parametrize("backend", ["kernel", "blockwise"])
def test_attention_equals_vllms_merged_chunks(lq, lk, backend):
    dca = posenc.DualChunkRotary(16, chunk_size=8, local_size=2)  # chunks of 6: 5 chunks
    q, k, v = _qkv(lq, lk)
    out = posenc.attention(q, k, v, rotary=dca, causal=True, backend=backend)
    want = _merged_reference(q, k, v, dca, 16**-0.5)
    # float64: a score sums 16 products of values below ~5, the merge a few exponentials
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


def test_attention_scales_by_the_length_as_vllm():
    dca = posenc.DualChunkRotary(16, chunk_size=8, local_size=2, original_max_position_embeddings=8)
    q, k, v = _qkv(24, 24, seed=1)
    out = posenc.attention(q, k, v, rotary=dca, causal=True)
    torch.testing.assert_close(out, _merged_reference(q, k, v, dca, 0.25, original=8),
                               rtol=0, atol=1e-12)  # fmt: skip
    plain = posenc.attention(q, k, v, rotary=posenc.DualChunkRotary(16, chunk_size=8, local_size=2),
                             causal=True)  # fmt: skip
    assert (plain - out).abs().max() > 1e-3  # the factor ln(3) / 10 + 1 is seen


def test_near_miss_unclamped_successive_query():
    """The successive query at ``i mod L + L`` without vLLM's clamp to chunk_size is seen."""

    class Unclamped(posenc.DualChunkRotary):
        def query_positions(self, positions):
            out = super().query_positions(positions)
            out[1] = torch.remainder(positions, self.chunk_len) + self.chunk_len
            return out

    q, k, v = _qkv(30, 30, seed=2)
    dca = posenc.DualChunkRotary(16, chunk_size=8, local_size=2)
    want = _merged_reference(q, k, v, dca, 0.25)
    off = posenc.attention(q, k, v, rotary=Unclamped(16, chunk_size=8, local_size=2), causal=True)
    assert (off - want).abs().max() > 1e-6


def test_packed_documents_equal_each_alone_and_gqa():
    dca = posenc.DualChunkRotary(16, chunk_size=8, local_size=3)
    q, k, v = _qkv(31, 31, heads=4, kv_heads=2, seed=3)
    cu = torch.tensor([0, 13, 31])
    out = posenc.attention(q, k, v, rotary=dca, causal=True, cu_seqlens=cu)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        alone = posenc.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], rotary=dca, causal=True)
        torch.testing.assert_close(out[:, :, a:b], alone, rtol=0, atol=1e-12)


def test_packed_documents_scale_by_their_own_length():
    dca = posenc.DualChunkRotary(16, chunk_size=8, local_size=3, original_max_position_embeddings=4)
    q, k, v = _qkv(30, 30, seed=4)
    cu = torch.tensor([0, 9, 30])
    out = posenc.attention(q, k, v, rotary=dca, causal=True, cu_seqlens=cu)
    for a, b in ((0, 9), (9, 30)):
        alone = posenc.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], rotary=dca, causal=True)
        torch.testing.assert_close(out[:, :, a:b], alone, rtol=0, atol=1e-12)


def test_gradcheck():
    dca = posenc.DualChunkRotary(4, chunk_size=4, local_size=1)
    q, k, v = _qkv(9, 9, heads=1, kv_heads=1, dim=4, seed=5, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: posenc.attention(q, k, v, rotary=dca, causal=True), (q, k, v)
    )


def test_from_qwen_config_and_saveable():
    config = {"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 1e6,
              "dual_chunk_attention_config": {"chunk_size": 32, "local_size": 8,
                                              "original_max_position_embeddings": 32}}  # fmt: skip
    dca = posenc.DualChunkRotary.from_config(config)
    assert (dca.chunk_len, dca.rotary.head_dim, dca.rotary.base) == (24, 64, 1e6)
    assert dca.original_max_position_embeddings == 32
    q, k, v = _qkv(40, 40, dim=64, seed=6)
    out = posenc.attention(q, k, v, rotary=dca, causal=True)
    copied = copy.deepcopy(dca)
    torch.testing.assert_close(posenc.attention(q, k, v, rotary=copied, causal=True), out)
    with pytest.raises(ValueError, match="dual_chunk_attention_config"):
        posenc.DualChunkRotary.from_config({"hidden_size": 64})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"chunk_size": 1, "local_size": 0}, "chunk_size"),
        ({"chunk_size": 8, "local_size": 8}, "local_size"),
        ({"chunk_size": 8, "local_size": -1}, "local_size"),
        ({"chunk_size": 8, "local_size": 2, "original_max_position_embeddings": -3}, "original"),
    ],
)
def test_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        posenc.DualChunkRotary(16, **kwargs)


def test_more_queries_than_keys_and_flex_are_refused():
    dca = posenc.DualChunkRotary(16, chunk_size=8, local_size=2)
    q, k, v = _qkv(6, 4)
    with pytest.raises(ValueError, match="last keys"):
        posenc.attention(q, k, v, rotary=dca)
    q, k, v = _qkv(4, 4)
    with pytest.raises(ValueError, match="query variants"):
        posenc.attention(q, k, v, rotary=dca, causal=True, backend="flex")
    with pytest.raises(TypeError, match="chunk_size"):
        posenc.DualChunkRotary(16, chunk_size=8.0, local_size=2)
