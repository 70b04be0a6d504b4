"""Resonance RoPE, VideoRoPE, V2PE and FoPE against float64 copies of their reference code.

None of the reference implementations installs as a package (sheryc/resonance_rope,
Wiselnn570/VideoRoPE, OpenGVLab/V2PE and TsinghuaC3I/Fourier-Position-Embedding are
training repositories; vLLM's ``FourierRotaryEmbedding`` needs a GPU build), so each
test writes the reference's formula densely in float64, as its code computes it:

- Resonance: ``ResonanceEmbedding.resonance_register`` and ``compute_freqs`` on the
  ``inv_freq`` of ``LlamaRotaryEmbedding`` / ``LlamaYaRNScaledRotaryEmbedding.yarn``.
- VideoRoPE: ``get_t_scale_rope_index`` (position ids) and
  ``apply_m_modify_multimodal_rotary_pos_emb`` (frequency allocation).
- V2PE: ``get_rope_pos_id`` (``v2pe_fix``).
- FoPE: vLLM's ``_compute_inv_freq``, ``_compute_cos_sin_cache`` and
  ``forward_native`` (and the reference's padding of sin with 1).

Tolerances (derived, per test): posenc's frequencies are 40-digit decimals rounded
once to float64; its angles are exact before one rounding; a float32 result is within
half an ulp, ``2**-25`` relative, of the exact value. The float64 copies here round
``base ** x`` (a few ulps, ``2**-50`` relative covers it) and the product ``p * omega``
(``|angle| 2**-53``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import posenc
from posenc.core.positions import v2pe_positions, videorope_positions
from posenc.families.rotary.config import rope_spec
from posenc.families.rotary.fope import FoPE, fope_frequencies
from posenc.families.rotary.multiaxis import mrope_axes, mrope_cos_sin
from posenc.families.rotary.schedules import frequencies

F32_EPS = 2.0**-24
F64_EPS = 2.0**-53
TWO_PI = 2 * math.pi


def _inv_freq64(dim: int, base: float) -> np.ndarray:
    """``LlamaRotaryEmbedding``'s ``1 / base ** (arange(0, dim, 2) / dim)`` in float64."""
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


# ======================================================================================
# Resonance RoPE


def _resonance64(inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``resonance_register``: ``(r_wavelengths, r_inv_freq)``; np.round ties to even as
    torch.round does."""
    wavelengths = np.round(TWO_PI / inv_freq)
    return wavelengths, TWO_PI / wavelengths


def _yarn64(dim: int, base: float, scale: float, original: int, fast=32.0, slow=1.0):
    """``LlamaYaRNScaledRotaryEmbedding.yarn`` (extrapolation_factor 1, attn_factor 1)."""

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(fast)), 0)
    high = min(math.ceil(correction_dim(slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    mask = 1 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv_freq = 1 / (scale * pos_freqs) * (1 - mask) + 1 / pos_freqs * mask
    mscale = 1.0 if scale <= 1 else 0.1 * math.log(scale) + 1.0
    return inv_freq, mscale


def _compute_freqs64(seq_len: int, wavelengths: np.ndarray, r_inv: np.ndarray) -> np.ndarray:
    """``ResonanceEmbedding.compute_freqs``: a pair whose wavelength fits in the sequence
    repeats ``arange(lambda) * r_inv_freq``; the others take ``arange(seq_len) * r_inv``."""
    columns = []
    for lam, w in zip(wavelengths, r_inv, strict=True):
        if seq_len >= lam:
            period = np.arange(int(lam), dtype=np.float64) * w
            column = np.tile(period, math.ceil(seq_len / lam))[:seq_len]
        else:
            column = np.arange(seq_len, dtype=np.float64) * w
        columns.append(column)
    return np.stack(columns, axis=1)


@pytest.mark.parametrize(
    ("dim", "base"), [(128, 10000.0), (64, 500000.0), (96, 1e6), (16, 10000.0), (128, 2.0)]
)
def test_resonance_rounds_every_wavelength_as_the_reference(dim: int, base: float) -> None:
    ours = frequencies("resonance", dim, base)
    wavelengths, r_inv = _resonance64(_inv_freq64(dim, base))
    # the float64 wavelengths are within 2**-50 relative of the exact ones, far from
    # any half-integer at these sizes, so they round to the same integers
    assert np.array_equal(np.round(TWO_PI / ours.inv_freq), wavelengths)
    # ours: the exact 2 pi / lambda rounded once; the copy: 2 pi and the division
    # rounded, 1.5 ulp in all
    np.testing.assert_allclose(ours.inv_freq, r_inv, rtol=2 * 2.0**-52, atol=0)
    assert ours.attention_scaling == 1.0


@pytest.mark.parametrize(
    ("dim", "base", "factor", "original"),
    [(128, 10000.0, 4.0, 2048), (64, 10000.0, 16.0, 4096), (128, 500000.0, 8.0, 8192)],
)
def test_resonance_yarn_rounds_yarns_frequencies_after_the_blend(
    dim: int, base: float, factor: float, original: int
) -> None:
    params = {"factor": factor, "original_max_position_embeddings": original}
    ours = frequencies("resonance_yarn", dim, base, params)
    inv_freq, mscale = _yarn64(dim, base, factor, original)
    wavelengths, r_inv = _resonance64(inv_freq)
    assert np.array_equal(np.round(TWO_PI / ours.inv_freq), wavelengths)
    np.testing.assert_allclose(ours.inv_freq, r_inv, rtol=2 * 2.0**-52, atol=0)
    assert ours.attention_scaling == pytest.approx(mscale, rel=1e-15)
    # rounding before the blend would give other frequencies: the order matters
    plain = frequencies("yarn", dim, base, params)
    assert not np.array_equal(plain.inv_freq, ours.inv_freq)


def test_rotary_with_resonance_matches_compute_freqs_past_every_wavelength() -> None:
    dim, base, seq = 64, 10000.0, 3000
    params = {"rope_type": "resonance_yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    rope = posenc.Rotary(dim, base=base, scaling=params)
    inv_freq, mscale = _yarn64(dim, base, 4.0, 512)
    angles = _compute_freqs64(seq, *_resonance64(inv_freq))
    want_cos = np.concatenate([np.cos(angles)] * 2, -1) * mscale
    want_sin = np.concatenate([np.sin(angles)] * 2, -1) * mscale
    cos, sin = rope.cos_sin(torch.arange(seq))
    # ours within half a float32 ulp of the exact (times mscale, < 2); the copy's angles
    # (below 2 pi * 3000) within 3000 * 2 pi * 2**-52
    tol = mscale * F32_EPS + seq * TWO_PI * 2.0**-52
    np.testing.assert_allclose(cos.double().numpy(), want_cos, rtol=0, atol=tol)
    np.testing.assert_allclose(sin.double().numpy(), want_sin, rtol=0, atol=tol)


@settings(max_examples=25, deadline=None)
@given(start=st.integers(0, 2**20), pair=st.integers(0, 31))
@example(start=4, pair=1)  # sin(pi) and sin(3 pi): +-1.2e-16
def test_resonance_angles_repeat_every_rounded_wavelength(start: int, pair: int) -> None:
    freqs = frequencies("resonance", 64, 10000.0)
    lam = round(TWO_PI / freqs.inv_freq[pair])
    rope = posenc.Rotary(64, scaling={"rope_type": "resonance"})
    cos, sin = rope.cos_sin(torch.tensor([start, start + lam]))
    # each is the exact angle of the float64 frequency, rounded once to float32; lam times
    # that frequency is 2 pi to within lam * ulp(omega) / 2 <= 2 pi * 2**-53, so the exact
    # values differ by at most that (it shows near a zero crossing, where float32 keeps
    # 1e-16 and its sign: start 4, pair 1 gives +-1.2e-16), and their roundings by one
    # float32 ulp where the tiny difference straddles a rounding boundary
    for table in (cos, sin):
        a, b = float(table[0, pair]), float(table[1, pair])
        assert abs(a - b) <= 2 * F32_EPS * abs(a) + TWO_PI * 2.0**-52  # ulp <= 2**-23 |a|


def test_resonance_from_the_config_reader() -> None:
    config = {
        "hidden_size": 256,
        "num_attention_heads": 4,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "resonance_yarn", "factor": None},
    }
    spec = rope_spec(config)
    # as for yarn: original defaults to max_position_embeddings, then factor to their ratio
    assert dict(spec.params) == {"factor": 1.0, "original_max_position_embeddings": 8192}
    config["original_max_position_embeddings"] = 2048
    spec = rope_spec(config)
    assert dict(spec.params) == {"factor": 4.0, "original_max_position_embeddings": 2048}
    from_config = posenc.Rotary.from_hf_config(config)
    direct = posenc.Rotary(64, scaling={"rope_type": "resonance_yarn", **spec.params})
    q = torch.randn(1, 2, 9, 64, generator=torch.Generator().manual_seed(0))
    for a, b in zip(from_config(q, q), direct(q, q), strict=True):
        assert torch.equal(a, b)
    plain = rope_spec({**config, "rope_scaling": {"rope_type": "resonance"}})
    assert plain.rope_type == "resonance" and dict(plain.params) == {}


def test_resonance_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="'resonance' does not take factor"):
        frequencies("resonance", 64, 10000.0, {"factor": 2.0})
    with pytest.raises(ValueError, match="'resonance_yarn' needs factor"):
        frequencies("resonance_yarn", 64, 10000.0, {"original_max_position_embeddings": 8})
    # base < 1: frequency 1 is 1e-4 ** -0.5 = 100 rad per position, wavelength 0.06
    with pytest.raises(ValueError, match=r"frequency 1 .* rounds to 0"):
        frequencies("resonance", 4, 1e-4)


# ======================================================================================
# VideoRoPE

VISION_START, VIDEO, TEXT = 151652, 151656, 7


def _reference_videorope_ids(input_ids: list[int], grids: list[tuple[int, int, int]], delta):
    """``get_t_scale_rope_index`` for one row without padding (spatial_merge_size 1)."""
    tokens = list(input_ids)
    blocks: list[np.ndarray] = []
    st_ = 0
    for t, h, w in grids:
        ed = tokens.index(VIDEO, st_)
        text_len = ed - st_
        st_idx = blocks[-1][0].max() + 1 if blocks else 0
        blocks.append(np.broadcast_to(np.arange(text_len) + st_idx, (3, text_len)))
        t_index = np.repeat(np.arange(t), h * w).astype(np.float64)
        h_index = np.tile(np.repeat(np.arange(h), w), t) - (h - 1) // 2
        w_index = np.tile(np.arange(w), t * h) - (w - 1) // 2
        t_index = t_index * delta + text_len + st_idx
        blocks.append(np.stack([t_index, h_index + t_index, w_index + t_index]))
        st_ = ed + t * h * w
    if st_ < len(tokens):
        st_idx = blocks[-1][0].max() + 1 if blocks else 0
        blocks.append(
            np.broadcast_to(np.arange(len(tokens) - st_) + st_idx, (3, len(tokens) - st_))
        )
    return np.concatenate(blocks, axis=1).astype(np.float64)


def _tokens(segments: list[Any]) -> tuple[list[int], list[tuple[int, int, int]]]:
    """input_ids and grids of ``segments``; a text run before a video ends in vision_start."""
    ids: list[int] = []
    grids = []
    for s in segments:
        if isinstance(s, int):
            ids += [TEXT] * (s - 1) + [VISION_START] if s else []
        else:
            ids += [VIDEO] * (s[0] * s[1] * s[2])
            grids.append(s)
    return ids, grids


@pytest.mark.parametrize(
    ("segments", "delta"),
    [
        ([3, (4, 3, 5), 6], 2.0),
        ([1, (1, 4, 4), 2, (3, 2, 3), 1, (2, 5, 2), 4], 2.0),
        ([5, (6, 1, 1), 3], 0.5),
        ([2, (2, 3, 4), (3, 2, 2), 2], 3.0),  # two videos back to back
    ],
)
def test_videorope_positions_match_get_t_scale_rope_index(segments: list[Any], delta) -> None:
    ids, grids = _tokens(segments)
    want = _reference_videorope_ids(ids, grids, delta)
    got = videorope_positions(segments, delta=delta)
    assert got.dtype == np.float64 and got.shape == want.shape
    assert np.array_equal(got, want)  # dyadic deltas: every value exact on both sides


def test_videorope_positions_literal() -> None:
    # text 0; a 2-frame 2x3 grid from s = 1: t = 1 + 2f, h = t + r, w = t + c - 1;
    # text again at max(t) + 1 = 4
    got = videorope_positions([1, (2, 2, 3), 1])
    assert got.tolist() == [
        [0, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 4],
        [0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4],
        [0, 0, 1, 2, 0, 1, 2, 2, 3, 4, 2, 3, 4, 4],
    ]
    on = videorope_positions([1, (2, 2, 3)], device="cpu")
    assert on.dtype == torch.float64 and on.shape == (3, 13)


def _reference_videorope_cos(cos3: np.ndarray, mrope_section: list[int]) -> np.ndarray:
    """``apply_m_modify_multimodal_rotary_pos_emb`` on ``(3, ..., head_dim)`` tables."""
    sections = [mrope_section[0], mrope_section[1] + mrope_section[2]] * 2
    sections = sections[::-1]
    index, parts = 0, []
    for i, section in enumerate(sections):
        if i % 2 == 0:
            for j in range(section):
                parts.append(cos3[1 if j % 2 == 0 else 2, ..., index : index + 1])
                index += 1
        else:
            parts.append(cos3[0, ..., index : index + section])
            index += section
    return np.concatenate(parts, axis=-1)


@pytest.mark.parametrize(
    ("head_dim", "section"), [(128, [16, 24, 24]), (64, [8, 12, 12]), (16, [2, 3, 3])]
)
def test_videorope_allocation_matches_the_reference(head_dim: int, section: list[int]) -> None:
    pos = videorope_positions([3, (3, 4, 5), 2], delta=2.0)
    freqs = frequencies("default", head_dim, 10000.0)
    angles = pos[..., None] * _inv_freq64(head_dim, 10000.0)
    emb = np.concatenate([angles, angles], -1)
    want_cos = _reference_videorope_cos(np.cos(emb), section)
    want_sin = _reference_videorope_cos(np.sin(emb), section)
    cos, sin = mrope_cos_sin(torch.from_numpy(pos), freqs, section, videorope=True)
    # ours: half a float32 ulp; the copy: base ** x and p * omega in float64, angles < 64
    tol = F32_EPS / 2 + 64 * 2.0**-50
    np.testing.assert_allclose(cos.double().numpy(), want_cos, rtol=0, atol=tol)
    np.testing.assert_allclose(sin.double().numpy(), want_sin, rtol=0, atol=tol)
    axes = mrope_axes(tuple(section), head_dim // 2, videorope=True)
    assert axes[-section[0] :] == (0,) * section[0]  # time on the lowest frequencies


def test_videorope_rotates_queries_at_float_positions() -> None:
    pos = torch.from_numpy(videorope_positions([2, (3, 2, 2), 1], delta=0.75))
    freqs = frequencies("default", 32, 10000.0)
    cos, sin = mrope_cos_sin(pos, freqs, [4, 6, 6], videorope=True, dtype=torch.float64)
    q = torch.randn(1, 2, pos.shape[1], 32, dtype=torch.float64)
    out = posenc.apply_rotary(q, cos, sin)
    # a rotation: every pair keeps its norm (float64 roundings, a few 2**-53)
    pairs = (q[..., :16] ** 2 + q[..., 16:] ** 2).sqrt()
    pairs_out = (out[..., :16] ** 2 + out[..., 16:] ** 2).sqrt()
    torch.testing.assert_close(pairs_out, pairs, rtol=8 * F64_EPS, atol=0)


def test_videorope_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match=r"gives the axes \[16, 24, 24\]"):
        mrope_axes((16, 20, 28), 64, videorope=True)
    with pytest.raises(ValueError, match="not both"):
        mrope_axes((16, 24, 24), 64, interleaved=True, videorope=True)
    with pytest.raises(ValueError, match="sum to rotary_dim / 2 = 64"):
        mrope_axes((16, 24, 20), 64, videorope=True)
    with pytest.raises(ValueError, match="delta"):
        videorope_positions([1, (1, 2, 2)], delta=0.0)
    with pytest.raises(ValueError, match=r"segments\[1\]\[2\]"):
        videorope_positions([1, (1, 2, 0)])
    with pytest.raises(TypeError, match=r"segments\[0\]"):
        videorope_positions([(1, 2)])
    with pytest.raises(ValueError, match=r"segments\[0\]"):
        videorope_positions([-1])


# ======================================================================================
# V2PE

IMG_START, IMG_END, IMG_CONTEXT = 92544, 92545, 92546


def _reference_v2pe(input_ids: np.ndarray, attention_mask: np.ndarray, num_tiles, stride):
    """``get_rope_pos_id(..., rope_pos_id_version="v2pe_fix")`` for one row, float64."""
    num_image_token = 256
    starts = np.flatnonzero(input_ids == IMG_START)
    out = []
    last = -1
    start_index = 0
    for i, s in enumerate(starts):
        seg = attention_mask[start_index : s + 1].astype(np.int64)
        pre = np.cumsum(seg) - 1 + (last + 1)
        pre = np.where(seg == 0, 1, pre).astype(np.float64)
        out.append(pre)
        last = int(pre[-1])
        small = stride / num_image_token
        n = num_image_token * num_tiles[i]
        idxs = last + small * np.arange(1, n + 1, dtype=np.float64)
        out.append(idxs)
        last = int(np.ceil(idxs[-1]))
        start_index = s + n + 1
        assert input_ids[start_index] == IMG_END
    seg = attention_mask[start_index:].astype(np.int64)
    pre = np.cumsum(seg) - 1 + (last + 1)
    out.append(np.where(seg == 0, 1, pre).astype(np.float64))
    return np.concatenate(out)


def _v2pe_row(text: list[int], tiles: list[int], pads: int = 0):
    """input_ids, attention mask and visual mask: text runs around images of 256 x tiles."""
    ids = [0] * pads
    for i, n in enumerate(text):
        ids += [5] * n
        if i < len(tiles):
            ids += [IMG_START] + [IMG_CONTEXT] * (256 * tiles[i]) + [IMG_END]
    ids_np = np.array(ids)
    mask = np.ones_like(ids_np)
    mask[:pads] = 0
    return ids_np, mask, ids_np == IMG_CONTEXT


@pytest.mark.parametrize("stride", [1, 2, 16, 64, 256, 3])
@pytest.mark.parametrize(("text", "tiles", "pads"), [([4, 3], [1], 0), ([2, 0, 5], [2, 1], 3)])
def test_v2pe_positions_match_get_rope_pos_id(stride, text, tiles, pads) -> None:
    ids, mask, visual = _v2pe_row(text, tiles, pads)
    want = _reference_v2pe(ids, mask, tiles, stride)
    got = v2pe_positions(visual, stride, attention_mask=mask)
    assert got.dtype == np.float64
    assert np.array_equal(got, want)  # stride / 256 is dyadic: exact on both sides


def test_v2pe_positions_literal_and_batched_torch() -> None:
    visual = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    got = v2pe_positions(visual, 0.5, tokens_per_image=2)  # delta 1/4
    assert got.dtype == torch.float64 and got.device == visual.device
    assert got.tolist() == [[0, 0.25, 0.5, 0.75, 2, 3], [0, 1, 1.25, 1.5, 1.75, 2.0]]


def test_rotary_rotates_float_positions_exactly() -> None:
    *_, visual = _v2pe_row([3, 2], [1])
    pos = torch.from_numpy(v2pe_positions(visual, 16))
    freqs = frequencies("default", 64, 10000.0)
    rope = posenc.Rotary(64)
    cos, _ = rope.cos_sin(pos, dtype=torch.float64)
    # truth: float64 angles of positions below 300 (error 300 * 2**-52 each)
    want = np.cos(pos.numpy()[:, None] * freqs.inv_freq)
    np.testing.assert_allclose(cos[:, :32].numpy(), want, rtol=0, atol=300 * 2.0**-52 + 2**-52)
    # integer-valued float positions give what the int positions give (both within
    # half a float32 ulp of the exact value: at most one ulp apart)
    whole = torch.arange(0, 600, 7)
    a = rope.cos_sin(whole)[0]
    b = rope.cos_sin(whole.double())[0]
    torch.testing.assert_close(a, b, rtol=0, atol=F32_EPS)
    q = torch.randn(1, 2, pos.shape[0], 64)
    q1, _ = rope(q, q, positions=pos)
    q2, _ = rope(q, q, positions=pos.float())  # float32 holds these 1/16 steps exactly
    assert torch.equal(q1, q2)


def test_v2pe_bad_input_is_named() -> None:
    visual = np.array([0, 1, 1, 0])
    with pytest.raises(ValueError, match="stride must be > 0"):
        v2pe_positions(visual, 0)
    with pytest.raises(ValueError, match="tokens_per_image must be an int >= 1"):
        v2pe_positions(visual, 1, tokens_per_image=0)
    with pytest.raises(ValueError, match="visual_mask must hold only 0 and 1"):
        v2pe_positions(np.array([0, 2]), 1)
    with pytest.raises(ValueError, match=r"attention_mask must be shaped like visual_mask \(4,\)"):
        v2pe_positions(visual, 1, attention_mask=np.ones(3))
    with pytest.raises(ValueError, match="visual_mask must be"):
        v2pe_positions(np.zeros((1, 1, 4)), 1)


# ======================================================================================
# FoPE


def _reference_fope(q, k, positions, cos_coef, sin_coef, head_dim, base, length, sin_pad):
    """vLLM ``FourierRotaryEmbedding`` (sep head) in float64, any padding of sin.

    q, k: (seq, heads, head_dim) float64; coefficients (H, D, d).
    """
    inv_freq = _inv_freq64(head_dim, base)
    inv_freq = inv_freq[inv_freq >= 2 * math.pi / length]  # the reference's floor
    t = positions.double()[:, None]
    freqs = t * torch.from_numpy(inv_freq)
    pos_cos = freqs.cos()[None].expand(cos_coef.shape[0], -1, -1)
    pos_sin = freqs.sin()[None].expand(cos_coef.shape[0], -1, -1)
    sin = torch.einsum("htD,hDd->thd", pos_sin, sin_coef.double())
    cos = torch.einsum("htD,hDd->thd", pos_cos, cos_coef.double())
    pad = head_dim // 2 - sin.shape[-1]
    sin = torch.nn.functional.pad(sin, (0, pad), value=sin_pad)
    cos = torch.nn.functional.pad(cos, (0, pad), value=1.0)
    sin, cos = torch.cat([sin, sin], -1), torch.cat([cos, cos], -1)

    def rotate_neox(x):
        return torch.cat([-x[..., head_dim // 2 :], x[..., : head_dim // 2]], -1)

    def apply(x):
        seq, heads = x.shape[:2]
        c = cos.flatten(0, 1)[:, None]  # (seq * H, 1, head_dim)
        s = sin.flatten(0, 1)[:, None]
        xv = x.reshape(seq * cos.shape[1], -1, head_dim)
        return (xv * c + rotate_neox(xv) * s).reshape(seq, heads, head_dim)

    return apply(q), apply(k)


@pytest.mark.parametrize("padding", ["identity", "reference"])
@pytest.mark.parametrize(
    ("head_dim", "kv_heads", "q_heads", "coef_dim"),
    [(64, 2, 8, None), (32, 1, 4, 6), (64, 4, 4, "D")],
)
def test_fope_matches_vllm_forward_native(padding, head_dim, kv_heads, q_heads, coef_dim) -> None:
    torch.manual_seed(0)
    length, base, seq = 512, 10000.0, 40
    num_freq = len(fope_frequencies(head_dim, base, length).omega)
    fope = FoPE(
        head_dim,
        kv_heads,
        max_position_embeddings=length,
        base=base,
        coef_dim=num_freq if coef_dim == "D" else coef_dim,
        padding=padding,
    )
    assert fope.cos_coef.shape == (kv_heads, num_freq, fope.coef_dim)
    q = torch.randn(1, seq, q_heads, head_dim, dtype=torch.float64)
    k = torch.randn(1, seq, kv_heads, head_dim, dtype=torch.float64)
    positions = torch.arange(seq) * 37 + 1000  # past the training length too
    fope_bs = FoPE(
        head_dim,
        kv_heads,
        max_position_embeddings=length,
        base=base,
        coef_dim=fope.coef_dim,
        padding=padding,
        seq_dim=-3,
    )
    fope_bs.load_state_dict(fope.state_dict())
    got_q, got_k = fope_bs(q, k, positions)
    want_q, want_k = _reference_fope(
        q[0], k[0], positions, fope.cos_coef, fope.sin_coef, head_dim, base, length,
        0.0 if padding == "identity" else 1.0,
    )  # fmt: skip
    # float64 on both sides: angles below 4e3 (4e3 * 2**-52 each), then D-term sums of
    # coefficients below 2 in magnitude: 1e-10 bounds both by far
    torch.testing.assert_close(got_q[0], want_q, rtol=0, atol=1e-10)
    torch.testing.assert_close(got_k[0], want_k, rtol=0, atol=1e-10)
    # the (batch, heads, seq, head_dim) order gives the same
    bh_q, bh_k = fope(q.transpose(1, 2), k.transpose(1, 2), positions)
    torch.testing.assert_close(bh_q.transpose(1, 2), got_q, rtol=0, atol=0)
    torch.testing.assert_close(bh_k.transpose(1, 2), got_k, rtol=0, atol=0)


def test_fope_float32_within_the_derived_bound() -> None:
    torch.manual_seed(1)
    fope = FoPE(64, 2, max_position_embeddings=512)
    q = torch.randn(2, 4, 30, 64)
    positions = torch.arange(30) + 0.5
    q32, _ = fope(q, q, positions)
    q64, _ = fope(q.double(), q.double(), positions)
    # float32: C and S rounded once from float64 sums (2**-24 relative of s = max
    # sum_D |coef|), then two products and a sum in float32 (3 * 2**-24 of each term):
    # |err| <= 4 * 2**-24 * s * (|x| + |rotate_half(x)|)
    s = max(fope.cos_coef.abs().sum(1).max(), fope.sin_coef.abs().sum(1).max(), 1.0)
    bound = 4 * F32_EPS * float(s) * 2 * float(q.abs().max())
    assert float((q32.double() - q64).abs().max()) <= bound


def test_fope_with_identity_coefficients_is_rope_on_the_kept_frequencies() -> None:
    head_dim, length = 64, 512
    fope = FoPE(head_dim, 1, max_position_embeddings=length, init_gain=0.0, coef_dim=16)
    assert fope.num_frequencies == 16  # 10000 ** (-k / 32) >= 2 pi / 512 for k <= 15
    rope = posenc.Rotary(
        head_dim, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.5}
    )
    q = torch.randn(2, 3, 20, head_dim, dtype=torch.float64)
    positions = torch.arange(20) * 100
    a, _ = fope(q, q, positions)
    b, _ = rope(q, q, positions)
    # both exact angles in float64; products and sums of the identity add nothing
    torch.testing.assert_close(a, b, rtol=0, atol=4 * F64_EPS * float(q.abs().max()))


def test_fope_reference_padding_is_the_same_at_every_position() -> None:
    fope = FoPE(32, 1, max_position_embeddings=64, padding="reference")
    c, s = fope.cos_sin(torch.tensor([0, 5, 1000]), dtype=torch.float64)
    padded = slice(fope.coef_dim, 16)
    assert torch.equal(c[..., padded], torch.ones_like(c[..., padded]))
    assert torch.equal(s[..., padded], torch.ones_like(s[..., padded]))
    _, s0 = FoPE(32, 1, max_position_embeddings=64).cos_sin(torch.tensor([7]))
    assert torch.equal(s0[..., padded], torch.zeros_like(s0[..., padded]))


def test_fope_initialisation_and_frozen_coefficients() -> None:
    fope = FoPE(64, 2, max_position_embeddings=512, init_gain=0.0, coef_dim=8)
    # the reference's step identity: column i reads frequency i * ceil(16 / 8)
    eye = torch.zeros(16, 8)
    eye[torch.arange(8) * 2, torch.arange(8)] = 1
    assert torch.equal(fope.cos_coef, eye.expand(2, -1, -1))
    assert torch.equal(fope.sin_coef, eye.expand(2, -1, -1))
    assert not fope.cos_coef.requires_grad and not fope.sin_coef.requires_grad
    default = FoPE(64, 2, max_position_embeddings=512)
    assert default.coef_dim == 16  # min(D, head_dim // 4)
    assert not torch.equal(default.cos_coef, torch.eye(16).expand(2, -1, -1))  # the noise
    assert FoPE(64, max_position_embeddings=512, learnable=True).cos_coef.requires_grad


def test_fope_loads_vllm_shaped_coefficients() -> None:
    d = fope_frequencies(64, 10000.0, 512).omega
    state = {"cos_coef": torch.randn(2, len(d), len(d)), "sin_coef": torch.randn(2, len(d), len(d))}
    fope = FoPE(64, 2, max_position_embeddings=512, coef_dim=len(d))
    fope.load_state_dict(state)
    assert torch.equal(fope.cos_coef, state["cos_coef"])
    assert torch.equal(fope.inv_freq, torch.tensor([float(w) for w in d], dtype=torch.float32))


def test_fope_gradients() -> None:
    fope = FoPE(8, 2, max_position_embeddings=16, base=10.0, learnable=True).double()
    q = torch.randn(1, 4, 5, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([0.0, 1.5, 3.0, 7.25, 20.0])

    assert torch.autograd.gradcheck(lambda a, b: fope(a, b, pos), (q, k))

    def with_coefficients(c: torch.Tensor, s: torch.Tensor) -> Any:
        return torch.func.functional_call(fope, {"cos_coef": c, "sin_coef": s}, (q, k, pos))

    coefs = (fope.cos_coef.detach().clone(), fope.sin_coef.detach().clone())
    assert torch.autograd.gradcheck(with_coefficients, tuple(c.requires_grad_() for c in coefs))
    out = fope(q, k, pos)
    (out[0].sum() + out[1].sum()).backward()
    assert fope.cos_coef.grad is not None and fope.sin_coef.grad is not None


def test_fope_packed_documents_restart_their_positions() -> None:
    # flash-attn's varlen layout (total_tokens, heads, head_dim) with seq_dim=-3:
    # positions restarting per document give each document what it gets alone
    fope = FoPE(32, 2, max_position_embeddings=64, seq_dim=-3)
    cu = torch.tensor([0, 5, 5, 12])
    q, k = torch.randn(12, 4, 32), torch.randn(12, 2, 32)
    packed_q, packed_k = fope(q, k, posenc.packed_positions(cu))
    # the tables are float64 sums rounded once, whatever the batch; the float32
    # rotation of the same tables and inputs is the same arithmetic: equal
    for a, b in ((0, 5), (5, 12)):
        alone_q, alone_k = fope(q[a:b], k[a:b])
        assert torch.equal(packed_q[a:b], alone_q) and torch.equal(packed_k[a:b], alone_k)


def test_fope_bad_input_is_named() -> None:
    fope = FoPE(32, 2, max_position_embeddings=64)
    q = torch.randn(1, 4, 5, 32)
    with pytest.raises(ValueError, match="k has 3 heads, not a multiple of num_heads=2"):
        fope(q, torch.randn(1, 3, 5, 32))
    with pytest.raises(ValueError, match="head_dim=32"):
        fope(q, torch.randn(1, 2, 5, 16))
    with pytest.raises(ValueError, match="same sequence length"):
        fope(q, torch.randn(1, 2, 4, 32))
    with pytest.raises(ValueError, match="positions must be"):
        fope(q, q, torch.arange(4))
    with pytest.raises(ValueError, match="not both"):
        fope(q, q, torch.arange(5), offset=2)
    with pytest.raises(ValueError, match="coef_dim must be <= head_dim / 2 = 16"):
        FoPE(32, max_position_embeddings=64, coef_dim=17)
    with pytest.raises(ValueError, match="padding must be one of"):
        FoPE(32, max_position_embeddings=64, padding="vllm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_position_embeddings=6 none is"):
        FoPE(32, max_position_embeddings=6)
    with pytest.raises(TypeError, match="learnable must be a bool"):
        FoPE(32, max_position_embeddings=64, learnable=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positions must lie in"):
        fope(q, q, torch.tensor([0.0, 1, 2, 3, 2.0**31]))
