"""posenc.positions against the code that defines each convention (HF transformers).

Position numbers are integers, so every comparison is exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.core.positions import (
    cache_positions,
    fairseq_positions,
    mask_positions,
    opt_positions,
)


def padded_tokens(rng, batch, seq, padding_idx, *, left=False):
    """Random ids with pads at the end (or start) of each row and a few in the middle."""
    ids = rng.integers(padding_idx + 1, padding_idx + 50, size=(batch, seq))
    for b in range(batch):
        n = int(rng.integers(0, seq))
        if left:
            ids[b, :n] = padding_idx
        else:
            ids[b, seq - n :] = padding_idx
    ids[0, seq // 2] = padding_idx  # fairseq does not advance the count over a pad
    return ids


# ---------------------------------------------------------------------------- fairseq


@pytest.mark.parametrize("padding_idx", [0, 1, 7])
@pytest.mark.parametrize("past_length", [0, 3])
@pytest.mark.parametrize("left", [False, True])
def test_fairseq_positions_is_hf_create_position_ids(padding_idx, past_length, left):
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    anchor_fn = M2M100SinusoidalPositionalEmbedding.create_position_ids_from_input_ids
    rng = np.random.default_rng(padding_idx + 10 * past_length)
    ids = padded_tokens(rng, 4, 11, padding_idx, left=left)
    anchor = anchor_fn(torch.from_numpy(ids), padding_idx, past_length)

    ours = fairseq_positions(torch.from_numpy(ids), padding_idx, past_length)
    assert ours.dtype == torch.int64
    assert torch.equal(ours, anchor)

    ours_np = fairseq_positions(ids, padding_idx, past_length)
    assert isinstance(ours_np, np.ndarray) and ours_np.dtype == np.int64
    np.testing.assert_array_equal(ours_np, anchor.numpy())

    # one row at a time (1-D) gives the same rows
    for b in range(ids.shape[0]):
        np.testing.assert_array_equal(
            fairseq_positions(ids[b], padding_idx, past_length), ours_np[b]
        )


def test_fairseq_positions_literal():
    tokens = [[5, 6, 1, 7], [1, 1, 5, 6]]
    np.testing.assert_array_equal(fairseq_positions(tokens), [[2, 3, 1, 4], [1, 1, 2, 3]])
    np.testing.assert_array_equal(
        fairseq_positions(tokens, past_length=10), [[12, 13, 1, 14], [1, 1, 12, 13]]
    )


def test_fairseq_positions_tensor_past_length():
    ids = torch.tensor([[4, 5, 1]])
    out = fairseq_positions(ids, 1, torch.tensor(2))
    assert out.tolist() == [[4, 5, 1]]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=30),
    st.integers(0, 3),
    st.integers(0, 1000),
)
def test_fairseq_positions_properties(tokens, padding_idx, past_length):
    tokens = np.array(tokens)
    out = fairseq_positions(tokens, padding_idx, past_length)
    real = tokens != padding_idx
    assert (out[~real] == padding_idx).all()
    np.testing.assert_array_equal(
        out[real], padding_idx + 1 + past_length + np.arange(int(real.sum()))
    )
    assert torch.equal(
        fairseq_positions(torch.from_numpy(tokens), padding_idx, past_length),
        torch.from_numpy(out),
    )


# ---------------------------------------------------------------------------- OPT


def opt_anchor_positions(mask, past_length):
    """Read the position ids out of HF's OPTLearnedPositionalEmbedding (row i holds i)."""
    from transformers.models.opt.modeling_opt import OPTLearnedPositionalEmbedding

    total = mask.shape[-1]
    emb = OPTLearnedPositionalEmbedding(total, 1)
    with torch.no_grad():
        emb.weight.copy_(torch.arange(total + 2, dtype=torch.float32)[:, None])
        return emb(mask, past_length)[..., 0].long() - emb.offset


@pytest.mark.parametrize("past_length", [0, 1, 5])
@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.float32, torch.bool])
def test_opt_positions_is_hf_opt(past_length, mask_dtype):
    rng = np.random.default_rng(past_length)
    ids = padded_tokens(rng, 5, 9, 0, left=True)  # OPT pads on the left
    mask = torch.from_numpy(ids != 0).to(mask_dtype)
    anchor_mask = mask.long() if mask_dtype == torch.bool else mask
    anchor = opt_anchor_positions(anchor_mask, past_length)

    ours = opt_positions(mask, past_length)
    assert ours.dtype == torch.int64
    assert ours.shape == (5, 9 - past_length)
    assert torch.equal(ours, anchor)
    np.testing.assert_array_equal(opt_positions(mask.numpy(), past_length), anchor.numpy())


def test_opt_positions_literal():
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(opt_positions(mask), [[-1, -1, 0, 1, 2], [0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(opt_positions(mask, 3), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(opt_positions(mask[0]), [-1, -1, 0, 1, 2])
    assert opt_positions(mask, 5).shape == (2, 0)


# ---------------------------------------------------------------------------- cache


def test_cache_positions():
    out = cache_positions(4, 6)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64
    np.testing.assert_array_equal(out, [6, 7, 8, 9])
    assert cache_positions(0, 6).shape == (0,)

    t = cache_positions(3, 2, device="cpu")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.int64
    assert t.tolist() == [2, 3, 4]
    assert cache_positions(3, 2, like=torch.zeros(1)).tolist() == [2, 3, 4]
    assert isinstance(cache_positions(3, 2, like=np.zeros(1)), np.ndarray)
    # compileable caches pass the offset as a 0-d tensor
    assert cache_positions(3, torch.tensor(5)).tolist() == [5, 6, 7]


def test_cache_positions_is_hf_cache_position():
    from transformers import DynamicCache

    cache = DynamicCache()
    k = torch.zeros(1, 2, 7, 4)
    cache.update(k, k, layer_idx=0)
    past = cache.get_seq_length()
    # HF generate: cache_position = arange(past, past + new_tokens)
    assert torch.equal(
        cache_positions(3, past, device="cpu"), torch.arange(past, past + 3, dtype=torch.int64)
    )


# ---------------------------------------------------------------------------- generate


def hf_generate_positions(mask: torch.Tensor) -> torch.Tensor:
    from transformers.generation.utils import GenerationMixin

    inputs = torch.zeros_like(mask)
    # the method reads only its arguments
    return GenerationMixin._prepare_position_ids_for_generation(
        None, inputs, {"attention_mask": mask}
    )


@pytest.mark.parametrize("side", ["left", "right", "middle"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float32])
def test_mask_positions_is_hf_generate(side, dtype):
    rng = np.random.default_rng(len(side))
    mask = np.ones((4, 9), dtype=np.int64)
    for b in range(4):
        n = int(rng.integers(0, 9))
        if side == "left":
            mask[b, :n] = 0
        elif side == "right":
            mask[b, 9 - n :] = 0
        else:
            mask[b, rng.integers(0, 9, size=n)] = 0
    anchor = hf_generate_positions(torch.from_numpy(mask))
    ours = mask_positions(torch.from_numpy(mask).to(dtype))
    assert ours.dtype == torch.int64 and torch.equal(ours, anchor)
    np.testing.assert_array_equal(mask_positions(mask.astype(bool)), anchor.numpy())
    # generate keeps the last columns behind a cache
    assert torch.equal(mask_positions(torch.from_numpy(mask), past_length=4), anchor[:, 4:])
    # OPT's convention is the same numbering with pads at -1
    np.testing.assert_array_equal(mask_positions(mask, pad_value=-1), opt_positions(mask))


def test_mask_positions_literal():
    mask = [[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]]
    np.testing.assert_array_equal(mask_positions(mask), [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0]])
    # transformers 4's Llama prepare_inputs_for_generation
    np.testing.assert_array_equal(mask_positions(mask, 1), [[1, 1, 0, 1, 2], [0, 1, 2, 1, 1]])
    np.testing.assert_array_equal(mask_positions(mask[0], 1, past_length=3), [1, 2])


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: fairseq_positions(np.array([1.0, 2.0])), TypeError, "tokens must hold integer"),
        (lambda: fairseq_positions(np.zeros((1, 2, 3), int)), ValueError, "tokens must be"),
        (lambda: fairseq_positions(np.int64(3)), ValueError, "tokens must be"),
        (lambda: fairseq_positions([1, 2], padding_idx=1.0), TypeError, "padding_idx"),
        (lambda: fairseq_positions([1, 2], padding_idx=True), TypeError, "padding_idx"),
        (lambda: fairseq_positions([1, 2], past_length=-1), ValueError, "past_length"),
        (lambda: fairseq_positions([1, 2], past_length=1.5), TypeError, "past_length"),
        (lambda: fairseq_positions(["a"]), TypeError, "tokens"),
        (lambda: opt_positions(np.array([0, 2, 1])), ValueError, "only 0 and 1"),
        (lambda: opt_positions(torch.tensor([0.5, 1.0])), ValueError, "only 0 and 1"),
        (lambda: opt_positions(np.array([0.5, 1.0])), ValueError, "only 0 and 1"),
        (lambda: opt_positions(np.ones(3), past_length=4), ValueError, "past_length must be <="),
        (lambda: opt_positions(np.ones(3), past_length=torch.tensor(1)), TypeError, "past_length"),
        (lambda: opt_positions(np.ones((1, 1, 3))), ValueError, "attention_mask must be"),
        (lambda: opt_positions(torch.ones(2, dtype=torch.complex64)), TypeError, "attention_mask"),
        (lambda: mask_positions([0, 2]), ValueError, "only 0 and 1"),
        (lambda: mask_positions([0, 1], pad_value=0.5), TypeError, "pad_value"),
        (lambda: mask_positions([0, 1], pad_value=True), TypeError, "pad_value"),
        (lambda: mask_positions([0, 1], past_length=3), ValueError, "past_length"),
        (lambda: mask_positions(np.ones((1, 1, 2))), ValueError, "attention_mask must be"),
        (lambda: cache_positions(-1), ValueError, "seq_len"),
        (lambda: cache_positions(2.0), TypeError, "seq_len"),
        (lambda: cache_positions(2, -3), ValueError, "past_length"),
        (lambda: cache_positions(2, torch.tensor(1.0)), TypeError, "past_length"),
        (lambda: cache_positions(2, device="cpu", like=torch.zeros(1)), ValueError, "not both"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
