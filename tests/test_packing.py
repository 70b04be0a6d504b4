"""Positions of packed documents against the code that packs them.

HF's ``DataCollatorWithFlattening`` (position ids, ``seq_idx``, ``cu_seq_lens``), its
``prepare_fa_kwargs_from_position_ids`` and Qwen2-VL's ``get_rope_index`` (M-RoPE)
are the anchors. Position numbers are
integers and cos/sin rows are computed per position, so every comparison is exact.
"""

from __future__ import annotations

import functools
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.core.positions import (
    cu_seqlens_from_document_ids,
    document_positions,
    mask_positions,
    packed_document_ids,
    packed_positions,
    restart_positions,
)
from posenc.families.rotary.multiaxis import mrope_cos_sin
from posenc.families.rotary.schedules import frequencies

LENGTHS = [5, 1, 9, 3]


def cu_of(lengths: list[int]) -> list[int]:
    return [0, *np.cumsum(lengths).tolist()]


def flattened(lengths: list[int]) -> dict[str, torch.Tensor]:
    """HF's collator output for documents of ``lengths`` tokens."""
    from transformers import DataCollatorWithFlattening

    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    features = [{"input_ids": list(range(10, 10 + n))} for n in lengths]
    return collator(features, return_tensors="pt")


# ---------------------------------------------------------------------------- cu_seqlens


def test_packed_positions_is_hf_data_collator_with_flattening():
    batch = flattened(LENGTHS)
    cu = batch["cu_seq_lens_q"]  # int32, as flash-attn wants
    assert cu.tolist() == cu_of(LENGTHS)
    ours = packed_positions(cu)
    assert ours.dtype == torch.int64 and torch.equal(ours, batch["position_ids"][0])
    assert torch.equal(packed_document_ids(cu), batch["seq_idx"][0].long())
    assert torch.equal(document_positions(batch["seq_idx"]), batch["position_ids"])
    assert torch.equal(cu_seqlens_from_document_ids(batch["seq_idx"][0]), cu.long())
    # numpy in, numpy out
    np_out = packed_positions(cu.numpy())
    assert isinstance(np_out, np.ndarray) and np_out.dtype == np.int64
    np.testing.assert_array_equal(np_out, batch["position_ids"][0].numpy())
    np.testing.assert_array_equal(packed_positions(cu_of(LENGTHS)), np_out)


def test_hf_reads_the_packing_back_from_packed_positions():
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    cu = torch.tensor(cu_of(LENGTHS))
    (cu_q, cu_k), _ = prepare_fa_kwargs_from_position_ids(packed_positions(cu)[None])
    assert torch.equal(cu_q.long(), cu) and torch.equal(cu_k.long(), cu)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=8))
def test_packed_positions_properties(lengths):
    cu = cu_of(lengths)
    want = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    docs = np.repeat(np.arange(len(lengths)), lengths)
    np.testing.assert_array_equal(packed_positions(cu), want)
    np.testing.assert_array_equal(packed_document_ids(cu), docs)
    assert torch.equal(
        packed_positions(torch.tensor(cu, dtype=torch.int32)), torch.from_numpy(want)
    )
    # document ids cannot show empty documents: the packing without them comes back
    np.testing.assert_array_equal(
        cu_seqlens_from_document_ids(docs), cu_of([n for n in lengths if n])
    )
    np.testing.assert_array_equal(document_positions(docs), want)
    np.testing.assert_array_equal(
        restart_positions(np.arange(sum(lengths)) + 7, cu_seqlens=cu), want
    )


def test_packed_positions_literal():
    np.testing.assert_array_equal(packed_positions([0, 3, 3, 5]), [0, 1, 2, 0, 1])
    np.testing.assert_array_equal(packed_document_ids([0, 3, 3, 5]), [0, 0, 0, 2, 2])
    np.testing.assert_array_equal(packed_positions([0, 2], total=2), [0, 1])
    assert packed_positions([0]).shape == (0,)
    for dtype in (torch.uint8, torch.int16, torch.int32):
        assert packed_positions(torch.tensor([0, 2, 5], dtype=dtype)).tolist() == [0, 1, 0, 1, 2]


def test_rotary_cu_seqlens_is_rotary_with_packed_positions():
    torch.manual_seed(0)
    cu = torch.tensor(cu_of(LENGTHS), dtype=torch.int32)
    q, k = torch.randn(sum(LENGTHS), 4, 32), torch.randn(sum(LENGTHS), 2, 32)
    packed = posenc.Rotary(32)(q, k, cu_seqlens=cu)
    # the same tokens as one (seq, heads, dim) sequence with explicit positions
    explicit = posenc.Rotary(32, seq_dim=-3)(q, k, positions=packed_positions(cu))
    for a, b in zip(packed, explicit, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="cu_seqlens must end at the number of packed tokens"):
        posenc.Rotary(32)(q, k, cu_seqlens=cu[:-1])


# ---------------------------------------------------------------------------- document ids


def test_document_positions_rows_and_recurring_ids():
    ids = np.array([[7, 7, 7, 2, 2, 7], [0, 0, 0, 0, 1, 1]])
    want = [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    np.testing.assert_array_equal(document_positions(ids), want)
    assert document_positions(torch.from_numpy(ids)).tolist() == want
    for row, w in zip(ids, want, strict=True):
        np.testing.assert_array_equal(document_positions(row), w)
    np.testing.assert_array_equal(cu_seqlens_from_document_ids(ids[0]), [0, 3, 5, 6])
    assert document_positions(np.zeros((2, 0), dtype=np.int64)).shape == (2, 0)
    assert cu_seqlens_from_document_ids(torch.zeros(0, dtype=torch.int64)).tolist() == [0]


# ---------------------------------------------------------------------------- M-RoPE


def qwen2_vl_rope_index(types_: list[int], grids: list[list[int]]) -> torch.Tensor:
    """Qwen2-VL's ``get_rope_index`` of one row, ``(3, seq)`` (spatial merge 2); ``grids``
    are the (t, h, w) of the vision runs of ``types_`` in order."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    vision = types.SimpleNamespace(spatial_merge_size=2)
    model = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    # get_rope_index reads only the config and this method of its model
    model.get_vision_position_ids = functools.partial(Qwen2VLModel.get_vision_position_ids, model)
    tt = torch.tensor([types_])
    runs = [t for i, t in enumerate(types_) if t and (i == 0 or types_[i - 1] != t)]
    images = [g for g, t in zip(grids, runs, strict=True) if t == 1]
    videos = [g for g, t in zip(grids, runs, strict=True) if t == 2]
    ids, _ = Qwen2VLModel.get_rope_index(
        model,
        torch.zeros_like(tt),
        tt,
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    return ids[:, 0]


# (token types: 0 text, 1 image, 2 video; the grids (t, h, w) of the vision runs)
DOCS = [
    ([0, 0, 0] + [1] * 6 + [0, 0], [[1, 4, 6]]),
    ([1] * 6 + [0] * 4, [[1, 6, 4]]),  # starts with an image
    ([0, 0] + [2] * 8 + [0] + [1] * 4 + [0, 0, 0], [[2, 4, 4], [1, 4, 4]]),
    ([0] * 5, []),
]


def test_restart_positions_gives_each_document_its_own_mrope_ids():
    alone = [qwen2_vl_rope_index(t, g) for t, g in DOCS]
    packed = qwen2_vl_rope_index(
        [x for t, _ in DOCS for x in t], [grid for _, g in DOCS for grid in g]
    )
    cu = cu_of([len(t) for t, _ in DOCS])
    want = torch.cat(alone, dim=-1)
    assert not torch.equal(packed, want)  # get_rope_index over the row continues across documents
    assert torch.equal(restart_positions(packed, cu_seqlens=torch.tensor(cu)), want)
    doc_ids = packed_document_ids(torch.tensor(cu))
    assert torch.equal(restart_positions(packed, document_ids=doc_ids), want)
    np.testing.assert_array_equal(restart_positions(packed.numpy(), cu_seqlens=cu), want.numpy())

    # (3, batch, seq) with per-row document ids: a second row packed in another order
    order = [2, 0, 3, 1]
    row2 = qwen2_vl_rope_index(
        [x for i in order for x in DOCS[i][0]], [grid for i in order for grid in DOCS[i][1]]
    )
    ids2 = np.repeat(order, [len(DOCS[i][0]) for i in order])
    batched = torch.stack([packed, row2], dim=1)
    doc_rows = torch.stack([doc_ids, torch.from_numpy(ids2)])
    got = restart_positions(batched, document_ids=doc_rows)
    assert torch.equal(got[:, 0], want)
    assert torch.equal(got[:, 1], torch.cat([alone[i] for i in order], dim=-1))

    # M-RoPE's cos/sin of the restarted row are those of each document alone
    freqs = frequencies("default", 32, 1e6)
    section = [4, 6, 6]
    cos, sin = mrope_cos_sin(restart_positions(packed[:, None], cu_seqlens=cu), freqs, section)
    for i, doc in enumerate(alone):
        c, s = mrope_cos_sin(doc[:, None], freqs, section)
        assert torch.equal(cos[0, cu[i] : cu[i + 1]], c[0])
        assert torch.equal(sin[0, cu[i] : cu[i + 1]], s[0])


# ---------------------------------------------------------------------------- compile


def test_packing_helpers_trace_without_graph_breaks():
    rope = posenc.Rotary(32)

    def f(cu, ids, mask, pos3, q):
        return (
            packed_positions(cu, total=ids.shape[-1]),
            packed_document_ids(cu, total=ids.shape[-1]),
            document_positions(ids),
            mask_positions(mask),
            restart_positions(pos3, cu_seqlens=cu),
            *rope(q, q, cu_seqlens=cu),
        )

    cu = torch.tensor(cu_of(LENGTHS), dtype=torch.int32)
    ids = packed_document_ids(cu)
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[0, :3] = 0
    pos3 = torch.arange(sum(LENGTHS)).expand(3, -1) * torch.tensor([[1], [2], [3]])
    q = torch.randn(sum(LENGTHS), 2, 32)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(cu, ids, mask, pos3, q), f(cu, ids, mask, pos3, q), strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: packed_positions([1, 3]), ValueError, "cu_seqlens must start at 0"),
        (lambda: packed_positions([0, 3, 2, 5]), ValueError, "entry 2 drops below entry 1"),
        (lambda: packed_positions([0, 3], total=4), ValueError, "end at .* total=4"),
        (lambda: packed_positions([0.0, 3.0]), TypeError, "cu_seqlens must hold integer"),
        (lambda: packed_positions(torch.tensor([0.0, 3.0])), TypeError, "cu_seqlens"),
        (lambda: packed_positions(torch.tensor([True])), TypeError, "cu_seqlens"),
        (lambda: packed_positions([[0, 3]]), ValueError, "cu_seqlens must be 1-D"),
        (
            lambda: packed_positions(np.array([], np.int64)),
            ValueError,
            "cu_seqlens must hold at least",
        ),
        (lambda: packed_positions([0, 3], total=3.0), TypeError, "total"),
        (lambda: packed_positions([0, 3], total=-1), ValueError, "total"),
        (lambda: packed_positions([0, 2**40]), ValueError, "2..31"),
        (lambda: packed_document_ids([2]), ValueError, "cu_seqlens must start at 0"),
        (lambda: document_positions([0.5, 1.0]), TypeError, "document_ids must hold integer"),
        (lambda: document_positions(np.zeros((1, 1, 2), int)), ValueError, "document_ids must"),
        (lambda: cu_seqlens_from_document_ids([[0, 1]]), ValueError, r"document_ids must be \(seq"),
        (lambda: restart_positions([0, 1]), ValueError, "exactly one of"),
        (
            lambda: restart_positions([0, 1], cu_seqlens=[0, 2], document_ids=[0, 0]),
            ValueError,
            "exactly one of",
        ),
        (lambda: restart_positions([0, 1, 2], cu_seqlens=[0, 2]), ValueError, "total=3"),
        (lambda: restart_positions([0.0, 1.0], cu_seqlens=[0, 2]), TypeError, "position_ids"),
        (
            lambda: restart_positions(np.zeros((3, 2, 4), int), document_ids=np.zeros((3, 4), int)),
            ValueError,
            "document_ids must be .* broadcasting",
        ),
        (
            lambda: restart_positions(np.zeros((2, 4), int), document_ids=[0, 0, 1]),
            ValueError,
            "document_ids must be",
        ),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
