"""Context-parallel sharding: every encoding on a shard equals the rows of the whole.

An encoding's value at a position is computed per position (a table row, an
elementwise rotation, a bias of one (query, key) pair), so a shard given its global
positions reproduces the unsharded rows bit for bit: every comparison here is
``torch.equal``. The zigzag layout is checked against torch's own head-tail load
balancer, and gathering runs in real gloo process groups of 2 and 4 ranks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import posenc
from gloo_ranks import run_forked
from posenc.core.positions import packed_positions
from posenc.families.rotary.apply import apply_rotary
from posenc.families.rotary.multiaxis import mrope_cos_sin
from posenc.families.rotary.schedules import frequencies
from posenc.integration.context_parallel import LAYOUTS, gather, shard, shard_positions, unshard

SEQ = 48  # divides 2 * world_size for world sizes 1, 2, 3, 4 and 6
WORLDS = [1, 2, 3, 4]


def every_shard():
    """(world_size, rank, layout) of every shard of a ``seq_len`` sequence."""
    return [(w, r, layout) for w in WORLDS for r in range(w) for layout in LAYOUTS]


# ---------------------------------------------------------------------------- positions


def test_shard_positions_literal():
    assert shard_positions(8, 2, 0).tolist() == [0, 1, 2, 3]
    assert shard_positions(8, 2, 1).tolist() == [4, 5, 6, 7]
    # Megatron-LM's get_batch_on_this_cp_rank: chunks 0 and 3 on rank 0, 1 and 2 on rank 1
    assert shard_positions(8, 2, 0, "zigzag").tolist() == [0, 1, 6, 7]
    assert shard_positions(8, 2, 1, "zigzag").tolist() == [2, 3, 4, 5]
    out = shard_positions(12, 3, 2, "zigzag", device="cpu")
    assert out.dtype == torch.int64 and out.tolist() == [4, 5, 6, 7]
    assert shard_positions(0, 4, 3, "zigzag").shape == (0,)


@pytest.mark.parametrize("world_size", WORLDS)
def test_zigzag_is_torch_head_tail_load_balancer(world_size):
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _HeadTailLoadBalancer,
    )

    # its indices put rank r's tokens at [r * SEQ / W, (r + 1) * SEQ / W)
    theirs = _HeadTailLoadBalancer(SEQ, world_size, "cpu")._generate_indices()[0].long()
    for rank, want in enumerate(theirs.view(world_size, -1)):
        assert torch.equal(shard_positions(SEQ, world_size, rank, "zigzag"), want)


@pytest.mark.parametrize(("world_size", "rank", "layout"), every_shard())
def test_shards_partition_the_sequence(world_size, rank, layout):
    pos = shard_positions(SEQ, world_size, rank, layout)
    assert torch.equal(shard(torch.arange(SEQ), -1, world_size, rank, layout), pos)
    everything = torch.cat([shard_positions(SEQ, world_size, r, layout) for r in range(world_size)])
    assert torch.equal(everything.sort().values, torch.arange(SEQ))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_unshard_inverts_shard(layout, dim):
    x = torch.randn(24, 12, 36)  # every dim a multiple of 2 * 3 chunks
    for world_size in (1, 2, 3):
        shards = [shard(x, dim, world_size, r, layout) for r in range(world_size)]
        assert all(s.shape[dim] == x.shape[dim] // world_size for s in shards)
        assert torch.equal(unshard(shards, dim, layout), x)


def test_multi_axis_position_ids_shard_along_the_last_dim():
    pos3 = torch.arange(3 * 2 * SEQ).view(3, 2, SEQ)  # M-RoPE's (3, batch, seq)
    for world_size, rank, layout in every_shard():
        local = shard(pos3, -1, world_size, rank, layout)
        index = shard_positions(SEQ, world_size, rank, layout)
        assert torch.equal(local, pos3[..., index])


# ---------------------------------------------------------------------------- encodings


def test_sinusoidal_on_shards():
    whole = posenc.sinusoidal(torch.arange(SEQ), 64)
    table = posenc.sinusoidal(SEQ, 64)  # the table path: the same float32 values
    np.testing.assert_array_equal(table, whole.numpy())
    emb = posenc.SinusoidalEmbedding(64, preset="fairseq")
    x = torch.randn(2, SEQ, 64)
    full = emb(x)
    for world_size, rank, layout in every_shard():
        pos = shard_positions(SEQ, world_size, rank, layout)
        assert torch.equal(posenc.sinusoidal(pos, 64), whole[pos])
        got = emb(shard(x, -2, world_size, rank, layout), positions=pos)
        assert torch.equal(got, shard(full, -2, world_size, rank, layout))


def test_learned_on_shards():
    emb = posenc.LearnedPositionalEmbedding(SEQ, 16, offset=2)
    full = emb(shape=SEQ)
    for world_size, rank, layout in every_shard():
        pos = shard_positions(SEQ, world_size, rank, layout)
        assert torch.equal(emb(pos), shard(full, 0, world_size, rank, layout))


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
        {"rope_type": "linear", "factor": 2.0},
    ],
)
@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_rotary_on_shards(scaling, seq_dim):
    torch.manual_seed(0)
    rope = posenc.Rotary(32, scaling=scaling, seq_dim=seq_dim)
    shape = (2, 4, SEQ, 32) if seq_dim == -2 else (2, SEQ, 4, 32)
    q, k = torch.randn(shape), torch.randn(shape)
    full = rope(q, k)
    for world_size, rank, layout in every_shard():
        pos = shard_positions(SEQ, world_size, rank, layout)
        local = (shard(t, seq_dim, world_size, rank, layout) for t in (q, k))
        for got, want in zip(rope(*local, positions=pos), full, strict=True):
            assert torch.equal(got, shard(want, seq_dim, world_size, rank, layout))


def test_dynamic_rotary_needs_the_whole_sequence_cos_sin():
    # HF's dynamic_rope_update picks frequencies from max(position_ids) + 1: a shard's
    # own positions reach less than the sequence, so its frequencies differ; cos/sin of
    # the whole sequence, sharded (Megatron's get_pos_emb_on_this_cp_rank), are exact
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, SEQ, 32), torch.randn(1, 2, SEQ, 32)
    full = posenc.Rotary(32, scaling=scaling, max_position_embeddings=16)(q, k)
    rope = posenc.Rotary(32, scaling=scaling, max_position_embeddings=16)
    cos, sin = rope.cos_sin(torch.arange(SEQ))
    naive = posenc.Rotary(32, scaling=scaling, max_position_embeddings=16)
    mismatched = 0
    for world_size, rank, layout in every_shard():
        local = [shard(t, -2, world_size, rank, layout) for t in (q, k)]
        c, s = (shard(t, 0, world_size, rank, layout) for t in (cos, sin))
        for x, want in zip(local, full, strict=True):
            got = apply_rotary(x, c, s, layout=rope.layout)
            assert torch.equal(got, shard(want, -2, world_size, rank, layout))
        pos = shard_positions(SEQ, world_size, rank, layout)
        got, _ = naive(*local, positions=pos)
        mismatched += not torch.equal(got, shard(full[0], -2, world_size, rank, layout))
    assert mismatched  # the pitfall the module docstring describes is real


def test_mrope_on_shards():
    gen = torch.Generator().manual_seed(0)
    pos3 = torch.randint(0, 5000, (3, 2, SEQ), generator=gen)
    freqs = frequencies("default", 32, 1e6)
    for interleaved, section in ((False, [4, 6, 6]), (True, [6, 5, 5])):
        cos, sin = mrope_cos_sin(pos3, freqs, section, interleaved=interleaved)
        for world_size, rank, layout in every_shard():
            local = shard(pos3, -1, world_size, rank, layout)
            c, s = mrope_cos_sin(local, freqs, section, interleaved=interleaved)
            assert torch.equal(c, shard(cos, -2, world_size, rank, layout))
            assert torch.equal(s, shard(sin, -2, world_size, rank, layout))


def bias_modules():
    torch.manual_seed(0)
    modules = {
        "alibi": posenc.ALiBi(4),
        "t5": posenc.T5Bias(4, num_buckets=8, max_distance=16),
        "kerple": posenc.KERPLE(4),
        "fire": posenc.FIRE(4, init_L=20.0),  # queries on both sides of L
        "sandwich": posenc.Sandwich(4, dim=16),
    }
    with torch.no_grad():  # away from their initial values, so every head differs
        for m in modules.values():
            for p in m.parameters():
                p.add_(torch.rand_like(p) * 0.1)
    return modules


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire", "sandwich"])
def test_bias_rows_on_shards(name):
    bias = bias_modules()[name]
    everywhere = torch.arange(SEQ)
    with torch.no_grad():
        full = bias(everywhere[:, None], everywhere[None, :])  # (heads, q, k)
        for world_size, rank, layout in every_shard():
            q_pos = shard_positions(SEQ, world_size, rank, layout)
            # ring attention: this rank's queries against every rank's keys in turn
            for source in range(world_size):
                k_pos = shard_positions(SEQ, world_size, source, layout)
                got = bias(q_pos[:, None], k_pos[None, :])
                assert torch.equal(got, full[:, q_pos][:, :, k_pos])


def test_packed_documents_shard_with_their_positions():
    # a packed row sharded: each token keeps its position within its document
    cu = torch.tensor([0, 7, 8, 30, 48])
    packed = packed_positions(cu)
    torch.manual_seed(0)
    q, k = torch.randn(SEQ, 2, 32), torch.randn(SEQ, 2, 32)
    rope = posenc.Rotary(32)
    full = rope(q, k, cu_seqlens=cu)
    sequence = posenc.Rotary(32, seq_dim=-3)
    for world_size, rank, layout in every_shard():
        pos = shard(packed, -1, world_size, rank, layout)
        local = (shard(t, 0, world_size, rank, layout) for t in (q, k))
        for got, want in zip(sequence(*local, positions=pos), full, strict=True):
            assert torch.equal(got, shard(want, 0, world_size, rank, layout))


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: shard_positions(10, 4, 0), ValueError, "multiple of 4 .* pad it by 2 to 12"),
        (lambda: shard_positions(12, 4, 0, "zigzag"), ValueError, "multiple of 8 .* by 4 to 16"),
        (lambda: shard_positions(8, 2, 2), ValueError, r"rank must lie in \[0, world_size=2\)"),
        (lambda: shard_positions(8, 2, -1), ValueError, "rank"),
        (lambda: shard_positions(8, 0, 0), ValueError, "world_size"),
        (lambda: shard_positions(8, 2.0, 0), TypeError, "world_size"),
        (lambda: shard_positions(8, 2, 0, "ring"), ValueError, "layout must be one of"),
        (lambda: shard_positions(-8, 2, 0), ValueError, "seq_len"),
        (lambda: shard_positions(2**40, 2, 0), ValueError, "2..31"),
        (lambda: shard_positions(8, 2, 0, device=3.0), TypeError, "device"),
        (lambda: shard(torch.zeros(2, 6), -1, 4, 0), ValueError, r"x.shape\[-1\] = 6 .* by 2"),
        (lambda: shard(torch.zeros(2, 8), 2, 2, 0), ValueError, "dim must be an axis of x"),
        (lambda: shard(torch.zeros(2, 8), 1.0, 2, 0), TypeError, "dim must be an int"),
        (lambda: shard(np.zeros(8), 0, 2, 0), TypeError, "x must be a torch tensor"),
        (lambda: unshard([], 0), ValueError, "shards must hold one tensor per rank"),
        (lambda: unshard([torch.zeros(2), np.zeros(2)], 0), TypeError, "shards"),
        (lambda: unshard([torch.zeros(2), torch.zeros(3)], 0), ValueError, "one shape"),
        (lambda: unshard([torch.zeros(3)] * 2, 0, "zigzag"), ValueError, r"shards\[0\]"),
        (lambda: gather(torch.zeros(4), 0), ValueError, "group: torch.distributed is not"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------------------- gloo


def _single_process():
    """The inputs, the modules and their whole-sequence results (the same on every rank)."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, SEQ, 32), torch.randn(1, 2, SEQ, 32)
    x = torch.randn(1, SEQ, 32)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    rope = posenc.Rotary(32, scaling=yarn)
    emb = posenc.SinusoidalEmbedding(32)
    biases = (posenc.T5Bias(2, num_buckets=8, max_distance=16), posenc.FIRE(2, init_L=20.0))
    everywhere = torch.arange(SEQ)
    with torch.no_grad():
        whole_bias = [b(everywhere[:, None], everywhere[None, :]) for b in biases]
    return (q, k, x), (rope, emb, biases), (rope(q, k), emb(x), whole_bias)


def _rank_main(rank: int, world_size: int, workdir: str) -> None:
    """One rank: shard, compute with global positions, gather, compare with the whole."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world_size
    )
    try:
        (q, k, x), (rope, emb, biases), (whole_qk, whole_x, whole_bias) = _single_process()
        everywhere = torch.arange(SEQ)
        for layout in LAYOUTS:
            pos = shard_positions(SEQ, world_size, rank, layout)
            assert torch.equal(gather(pos, -1, layout), everywhere)
            local = (shard(t, -2, world_size, rank, layout) for t in (q, k))
            for got, whole in zip(rope(*local, positions=pos), whole_qk, strict=True):
                assert torch.equal(gather(got, -2, layout), whole)
            local_x = emb(shard(x, -2, world_size, rank, layout), positions=pos)
            assert torch.equal(gather(local_x, -2, layout), whole_x)
            with torch.no_grad():
                for bias, whole in zip(biases, whole_bias, strict=True):
                    rows = bias(pos[:, None], everywhere[None, :])
                    assert torch.equal(gather(rows, -2, layout), whole)
        Path(workdir, f"rank{rank}.ok").write_text("ok")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 4])
def test_gloo_gather_equals_single_process(tmp_path, world_size):
    # forked ranks inherit this process's imports, including the lazy ones of a first
    # call (torch._refs, ~1 s each): run it once here (spawned ranks took ~4x longer)
    _single_process()
    run_forked(_rank_main, world_size, tmp_path, seconds=120)
    assert sorted(p.name for p in tmp_path.glob("*.ok")) == [
        f"rank{r}.ok" for r in range(world_size)
    ]
