"""posenc.grid against the 2-D and 3-D grid anchors, and its layout and validation.

Tolerances, derived per element from the angle ``theta = i * omega_k`` an anchor forms:

- anchors computing in float32 (timm, vit-pytorch, positional-encodings): the
  exponent ``e = k / K`` is rounded (``e * 2**-24`` absolute), ``T ** e`` adds one
  ulp and inherits ``e * ln(T) * 2**-24`` relative from the rounded exponent,
  ``1 / x`` and ``i * omega`` one rounding each: ``theta`` is off by up to
  ``|theta| * (e ln T + 4) * 2**-24``. (The plain ``|theta| * 2**-24`` misses the
  exponent's share, up to ``ln 1e4 = 9.2`` times larger for the last band.)
  float32 ``sin``/``cos`` and the final rounding add < 1e-6.
- diffusers computes in float64 on float32 coordinates ``arange(n) / (n / base_size)
  / interpolation_scale``: up to three float32 roundings of the coordinate, so
  ``|theta| * 3 * 2**-24 + 1e-6``.
- float64 oracles (MAE, MoCo v3, written below from their published formulas):
  1e-6, which covers posenc's own float32 rounding (2**-25) and nothing else.

posenc is exact to float32 rounding, so it must also never be further from the
float64 truth than the anchor is; at large coordinates it is far closer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc.families.absolute.grid as grid_module
from conftest import anchor
from posenc.families.absolute.grid import PRESETS, GridSpec, grid, grid_frequencies, resolve
from timm_layers import load_anchor

F32 = 2.0**-24  # float32 unit roundoff, relative
LN_1E4 = math.log(1e4)


# ------------------------------------------------------------------ anchors without __init__

# timm's and vit-pytorch's files, loaded without their packages' __init__ (tests/timm_layers.py)
ORACLES = "is not installed (the float64 oracles still check its preset)"


@pytest.fixture(scope="module")
def timm_sincos():
    return load_anchor("timm", ("layers",), "layers.pos_embed_sincos", ORACLES)


@pytest.fixture(scope="module")
def simple_vit():
    anchor("einops")
    return load_anchor("vit_pytorch", (), "simple_vit", ORACLES)


@pytest.fixture(scope="module")
def diffusers_embeddings():
    return anchor("diffusers.models.embeddings")


@pytest.fixture(scope="module")
def positional_encodings():
    return anchor("positional_encodings.torch_encodings")


# ------------------------------------------------------------------ float64 oracles


@dataclass
class Table:
    """A float64 encoding with, per element, its angle and its exponent ``k / K``."""

    values: np.ndarray
    angles: np.ndarray
    exponents: np.ndarray

    @staticmethod
    def cat(*tables: Table) -> Table:
        return Table(
            *(np.concatenate([getattr(t, f) for t in tables], axis=1) for f in Table.fields)
        )

    fields = ("values", "angles", "exponents")

    def cut(self, dim: int) -> Table:
        return Table(self.values[:, :dim], self.angles[:, :dim], self.exponents[:, :dim])

    def zero_rows(self, n: int) -> Table:
        pad = np.zeros((n, self.values.shape[1]))
        return Table(*(np.concatenate([pad, getattr(self, f)]) for f in Table.fields))


def band(pos, count, denom, fn, base=1e4):
    """One block: ``fn(pos * base**(-k/denom))`` for k < count, pos flattened."""
    e = np.arange(count) / denom
    theta = np.asarray(pos, dtype=np.float64).reshape(-1)[:, None] * base**-e
    return Table(fn(theta), theta, np.broadcast_to(e, theta.shape))


def interleaved(pos, count, denom, base=1e4):
    s, c = band(pos, count, denom, np.sin, base), band(pos, count, denom, np.cos, base)
    rows = s.values.shape[0]
    return Table(
        *(np.stack([getattr(s, f), getattr(c, f)], -1).reshape(rows, -1) for f in Table.fields)
    )


def mae_oracle(h, w, dim):
    """MAE util/pos_embed.py get_2d_sincos_pos_embed, in float64 (MAE is square; (h, w) here)."""
    grid_w, grid_h = np.meshgrid(np.arange(w), np.arange(h))  # 'xy': w goes first
    k = dim // 4
    emb_h = Table.cat(band(grid_w, k, k, np.sin), band(grid_w, k, k, np.cos))  # MAE's "h"
    emb_w = Table.cat(band(grid_h, k, k, np.sin), band(grid_h, k, k, np.cos))
    return Table.cat(emb_h, emb_w)


def moco_oracle(h, w, dim, temperature=1e4):
    """MoCo v3 vits.py build_2d_sincos_position_embedding, in float64."""
    grid_w, grid_h = np.meshgrid(np.arange(w), np.arange(h), indexing="ij")  # torch default
    k = dim // 4
    return Table.cat(
        band(grid_w, k, k, np.sin, temperature),
        band(grid_w, k, k, np.cos, temperature),
        band(grid_h, k, k, np.sin, temperature),
        band(grid_h, k, k, np.cos, temperature),
    )


def big_vision_oracle(h, w, dim, temperature=1e4):
    """big_vision posemb_sincos_2d: y, x = mgrid[:h, :w]; k / (dim/4 - 1)."""
    y, x = np.mgrid[:h, :w]
    k = dim // 4
    return Table.cat(
        *(band(a, k, k - 1, fn, temperature) for a in (x, y) for fn in (np.sin, np.cos))
    )


def timm_oracle(h, w, dim, temperature=1e4, interleave=False):
    """timm build_sincos2d_pos_embed: ndgrid (y, x); sin sin cos cos, or sin cos sin cos."""
    y, x = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    k = dim // 4
    parts = [(y, np.sin), (y, np.cos), (x, np.sin), (x, np.cos)]
    if not interleave:
        parts = [parts[0], parts[2], parts[1], parts[3]]
    return Table.cat(*(band(a, k, k, fn, temperature) for a, fn in parts))


def diffusers_2d_oracle(h, w, dim, base_size=16, interpolation_scale=1.0):
    """diffusers get_2d_sincos_pos_embed with exact coordinates."""
    grid_h = np.arange(h) / (h / base_size) / interpolation_scale
    grid_w = np.arange(w) / (w / base_size) / interpolation_scale
    gw, gh = np.meshgrid(grid_w, grid_h)  # 'xy': w goes first
    k = dim // 4
    return Table.cat(*(band(a, k, k, fn) for a in (gw, gh) for fn in (np.sin, np.cos)))


def diffusers_3d_oracle(t, h, w, dim, spatial=1.0, temporal=1.0):
    """diffusers get_3d_sincos_pos_embed (spatial_size=(w, h)) with exact coordinates."""
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    kt, ks = dim // 8, 3 * dim // 16
    temporal_part = [band(tt / temporal, kt, kt, fn) for fn in (np.sin, np.cos)]
    spatial_part = [band(a / spatial, ks, ks, fn) for a in (ww, hh) for fn in (np.sin, np.cos)]
    return Table.cat(*temporal_part, *spatial_part)


def positional_encodings_oracle(shape, dim):
    """positional-encodings PositionalEncoding2D/3D: C = 2 ceil(dim / 2n) per axis, cut to dim."""
    k = math.ceil(dim / (2 * len(shape)))
    coords = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    return Table.cat(*(interleaved(a, k, k) for a in coords)).cut(dim)


def check(ours, anchor, truth: Table, rel, *, base=1e4):
    """posenc within the derived tolerance of the anchor, and no further from the truth.

    ``rel`` is the anchor's relative angle error: ``"pow32"`` for float32 pipelines
    ``(e ln base + 4) * 2**-24``, or a number.
    """
    ours = np.asarray(ours, dtype=np.float64)
    anchor = np.asarray(anchor, dtype=np.float64)
    assert ours.shape == anchor.shape == truth.values.shape
    if rel == "pow32":
        rel = (truth.exponents * math.log(base) + 4) * F32
    tol = np.abs(truth.angles) * rel + 1e-6
    gap = np.abs(ours - anchor)
    assert (gap <= tol).all(), f"max gap {gap.max():.3g}, worst excess {(gap - tol).max():.3g}"
    ours_err = np.abs(ours - truth.values).max()
    anchor_err = np.abs(anchor - truth.values).max()
    # float32 rounding of values in [-1, 1] is at most 2**-25; the oracle adds ~1e-12
    assert ours_err <= max(anchor_err, 2.0**-25 + 1e-9)
    return ours_err, anchor_err


SHAPES_2D = [(1, 1), (14, 14), (7, 9), (3, 50), (16, 1)]


# ------------------------------------------------------------------ anchors


@pytest.mark.parametrize("dim", [4, 8, 64, 768])
@pytest.mark.parametrize("shape", SHAPES_2D)
def test_mae(shape, dim):
    truth = mae_oracle(*shape, dim)
    check(grid(shape, dim), truth.values, truth, 0.0)


def test_mae_cls_token():
    truth = mae_oracle(14, 14, 64).zero_rows(1)
    ours = grid((14, 14), 64, preset="mae", cls_token=True)
    check(ours, truth.values, truth, 0.0)


@pytest.mark.parametrize("dim", [4, 12, 256])
@pytest.mark.parametrize("side", [1, 5, 14])
def test_moco_v3(side, dim):
    # MoCo v3 builds square grids; its (w, h) 'ij' flattening puts the slow index first
    truth = moco_oracle(side, side, dim).zero_rows(1)
    ours = grid((side, side), dim, preset="moco-v3", cls_token=True)
    check(ours, truth.values, truth, 0.0)


def test_moco_v3_non_square_is_the_transposed_shape():
    # For h != w MoCo v3's rows run over (w, h), first half on the slow index: that is
    # posenc's grid of shape (w, h), whose first half encodes its row (slow) axis.
    truth = moco_oracle(3, 5, 16, temperature=100.0)
    ours = grid((5, 3), 16, preset="moco-v3", temperature=100.0)
    check(ours, truth.values, truth, 0.0)


@pytest.mark.parametrize("dim", [8, 16, 64, 768])
@pytest.mark.parametrize("shape", SHAPES_2D)
def test_big_vision_is_vit_pytorch_simple_vit(simple_vit, shape, dim):
    anchor = simple_vit.posemb_sincos_2d(*shape, dim).numpy()
    truth = big_vision_oracle(*shape, dim)
    check(grid(shape, dim, preset="big-vision"), anchor, truth, "pow32")


def test_big_vision_dim_4_fails_where_the_anchor_gives_nan(simple_vit):
    assert torch.isnan(simple_vit.posemb_sincos_2d(2, 2, 4)).any()
    with pytest.raises(ValueError, match=r"dim=4 .* K > shift"):
        grid((2, 2), 4, preset="big-vision")


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("dim", [4, 32, 768])
@pytest.mark.parametrize("shape", SHAPES_2D)
def test_timm(timm_sincos, shape, dim, interleave):
    anchor = timm_sincos.build_sincos2d_pos_embed(
        list(shape), dim, interleave_sin_cos=interleave
    ).numpy()
    truth = timm_oracle(*shape, dim, interleave=interleave)
    ours = grid(shape, dim, preset="timm", interleave_sin_cos=interleave)
    check(ours, anchor, truth, "pow32")


def test_timm_temperature_and_reverse_coord(timm_sincos):
    h, w, dim = 6, 11, 48
    anchor = timm_sincos.build_sincos2d_pos_embed(
        [h, w], dim, temperature=100.0, reverse_coord=True
    ).numpy()
    # reverse_coord stacks (W, H): the grid of the transposed shape
    truth = timm_oracle(w, h, dim, temperature=100.0)
    check(grid((w, h), dim, preset="timm", temperature=100.0), anchor, truth, "pow32", base=100.0)


# ------------------------------------------ the timm and big-vision presets without their anchors
#
# timm and vit-pytorch install with --no-deps (the Makefile's NODEPS_ANCHORS) and may be
# absent outside CI; these check the two presets against the float64 transcriptions above
# (timm_oracle: timm's build_sincos2d_pos_embed; big_vision_oracle: big_vision's
# posemb_sincos_2d) with no anchor imported. The oracles themselves are held to the
# anchors by test_timm and test_big_vision_is_vit_pytorch_simple_vit where installed.


def check_against_oracle(ours, truth: Table, base=1e4):
    """posenc within the derived bound of a float64 oracle, element by element.

    - posenc: the exact value rounded once to the output dtype; for |v| <= 1 that is
      half the spacing of [0.5, 1): 2**-25 in float32, 2**-54 in float64.
    - the oracle's angle: ``e = k / D`` rounded (relative 2**-53), ``base ** -e`` one
      ulp (2 * 2**-53) and the rounded exponent's ``e * ln(base) * 2**-53``, ``i * omega``
      one rounding: ``theta`` is off by ``|theta| * (e ln(base) + 3) * 2**-53``, which
      sin and cos (Lipschitz 1) pass on; their own evaluation adds at most 2 ulps of
      a value <= 1, 2**-52.
    """
    ours = np.asarray(ours)
    assert ours.shape == truth.values.shape
    rounding = 2.0 ** -(np.finfo(ours.dtype).nmant + 2)
    oracle = np.abs(truth.angles) * (truth.exponents * math.log(base) + 3) * 2.0**-53 + 2.0**-52
    gap = np.abs(ours.astype(np.float64) - truth.values)
    tol = rounding + oracle
    assert (gap <= tol).all(), f"max gap {gap.max():.3g}, worst excess {(gap - tol).max():.3g}"


ORACLE_DTYPES = [np.float32, np.float64]


@pytest.mark.parametrize("dtype", ORACLE_DTYPES)
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("dim", [4, 32, 768])
@pytest.mark.parametrize("shape", SHAPES_2D)
def test_timm_float64_oracle(shape, dim, interleave, dtype):
    ours = grid(shape, dim, preset="timm", interleave_sin_cos=interleave, dtype=dtype)
    check_against_oracle(ours, timm_oracle(*shape, dim, interleave=interleave))


@pytest.mark.parametrize("dtype", ORACLE_DTYPES)
@pytest.mark.parametrize("dim", [8, 16, 64, 768])
@pytest.mark.parametrize("shape", SHAPES_2D)
def test_big_vision_float64_oracle(shape, dim, dtype):
    ours = grid(shape, dim, preset="big-vision", dtype=dtype)
    check_against_oracle(ours, big_vision_oracle(*shape, dim))


@pytest.mark.parametrize("dtype", ORACLE_DTYPES)
def test_timm_and_big_vision_temperature_float64_oracle(dtype):
    h, w, dim = 6, 11, 48
    ours = grid((h, w), dim, preset="timm", temperature=100.0, dtype=dtype)
    check_against_oracle(ours, timm_oracle(h, w, dim, temperature=100.0), base=100.0)
    ours = grid((h, w), dim, preset="big-vision", temperature=100.0, dtype=dtype)
    check_against_oracle(ours, big_vision_oracle(h, w, dim, temperature=100.0), base=100.0)


@pytest.mark.parametrize("preset", ["timm", "big-vision"])
def test_large_coordinates_float64_oracle(preset):
    # 60000 columns: angles up to 6e4, where float32 pipelines drift by ~1e-4 (see
    # test_large_coordinates_posenc_exact_where_anchors_drift); posenc stays within
    # its float32 rounding of the truth
    shape, dim = (2, 60000), 16
    oracle = timm_oracle if preset == "timm" else big_vision_oracle
    check_against_oracle(grid(shape, dim, preset=preset), oracle(*shape, dim))


DIFFUSERS_2D = [
    dict(),
    dict(base_size=8),
    dict(interpolation_scale=2.0),
    dict(base_size=7, interpolation_scale=0.75),
]


@pytest.mark.parametrize("knobs", DIFFUSERS_2D)
@pytest.mark.parametrize("dim", [4, 64, 1152])
@pytest.mark.parametrize("shape", SHAPES_2D)
def test_diffusers_2d(diffusers_embeddings, shape, dim, knobs):
    anchor = diffusers_embeddings.get_2d_sincos_pos_embed(dim, shape, **knobs).numpy()
    truth = diffusers_2d_oracle(*shape, dim, **knobs)
    check(grid(shape, dim, preset="diffusers", **knobs), anchor, truth, 3 * F32)


def test_diffusers_extra_tokens(diffusers_embeddings):
    anchor = diffusers_embeddings.get_2d_sincos_pos_embed(
        32, (4, 6), cls_token=True, extra_tokens=3
    ).numpy()
    truth = diffusers_2d_oracle(4, 6, 32).zero_rows(3)
    check(grid((4, 6), 32, preset="diffusers", extra_tokens=3), anchor, truth, 3 * F32)


@pytest.mark.parametrize(
    "knobs",
    [dict(), dict(spatial_interpolation_scale=1.875, temporal_interpolation_scale=4.0)],
)
@pytest.mark.parametrize("dim", [16, 48, 1920])
@pytest.mark.parametrize("shape", [(1, 1, 1), (4, 5, 3), (13, 6, 9)])
def test_diffusers_3d(diffusers_embeddings, shape, dim, knobs):
    t, h, w = shape
    # diffusers takes spatial_size as (width, height) and returns (T, H*W, dim)
    anchor = diffusers_embeddings.get_3d_sincos_pos_embed(dim, (w, h), t, **knobs)
    assert anchor.shape == (t, h * w, dim)
    truth = diffusers_3d_oracle(
        *shape,
        dim,
        spatial=knobs.get("spatial_interpolation_scale", 1.0),
        temporal=knobs.get("temporal_interpolation_scale", 1.0),
    )
    ours = grid(shape, dim, preset="diffusers", **knobs)
    check(ours, anchor.reshape(-1, dim).numpy(), truth, 3 * F32)


@pytest.mark.parametrize("dim", [1, 2, 3, 5, 6, 7, 10, 64, 65, 130])
@pytest.mark.parametrize("shape", [(1, 1), (5, 8), (12, 3)])
def test_positional_encodings_2d(positional_encodings, shape, dim):
    anchor = positional_encodings.PositionalEncoding2D(dim)(torch.zeros(1, *shape, dim))
    truth = positional_encodings_oracle(shape, dim)
    ours = grid(shape, dim, preset="positional-encodings")
    check(ours, anchor.reshape(-1, dim).numpy(), truth, "pow32")


@pytest.mark.parametrize("dim", [1, 5, 6, 7, 13, 64, 100])
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 4, 5)])
def test_positional_encodings_3d(positional_encodings, shape, dim):
    anchor = positional_encodings.PositionalEncoding3D(dim)(torch.zeros(1, *shape, dim))
    truth = positional_encodings_oracle(shape, dim)
    ours = grid(shape, dim, preset="positional-encodings")
    check(ours, anchor.reshape(-1, dim).numpy(), truth, "pow32")


def test_large_coordinates_posenc_exact_where_anchors_drift(timm_sincos, positional_encodings):
    # 60000 columns: the band omega = 0.1 reaches angles of 6e3, which float32 pipelines
    # get wrong by ~1e-4 (omega = 1 is exact in float32, so it stays accurate)
    shape, dim = (2, 60000), 16
    anchor = timm_sincos.build_sincos2d_pos_embed(list(shape), dim).numpy()
    ours_err, anchor_err = check(
        grid(shape, dim, preset="timm"), anchor, timm_oracle(*shape, dim), "pow32"
    )
    assert ours_err < 1e-7 < 1e-4 < anchor_err

    shape = (60000, 2)
    anchor = positional_encodings.PositionalEncoding2D(dim)(torch.zeros(1, *shape, dim))
    ours_err, anchor_err = check(
        grid(shape, dim, preset="positional-encodings"),
        anchor.reshape(-1, dim).numpy(),
        positional_encodings_oracle(shape, dim),
        "pow32",
    )
    assert ours_err < 1e-7 < 1e-4 < anchor_err


# ------------------------------------------------------------------ layout: which axis is which


def varying_axes(table, shape):
    """For each channel, the set of grid axes along which it changes.

    Pass float64 tables: the slowest cosines move by ~1e-7 over a few cells.
    """
    t = np.asarray(table).reshape(*shape, -1)
    assert t.dtype == np.float64
    return [
        {a for a in range(len(shape)) if np.ptp(t[..., ch], axis=a).max() > 0}
        for ch in range(t.shape[-1])
    ]


ROW, COL = {0}, {1}
TIME3, ROW3, COL3 = {0}, {1}, {2}


@pytest.mark.parametrize(
    ("preset", "overrides", "expected"),
    [
        ("mae", {}, [COL] * 8 + [ROW] * 8),
        ("diffusers", {}, [COL] * 8 + [ROW] * 8),
        ("big-vision", {}, [COL] * 8 + [ROW] * 8),
        ("moco-v3", {}, [ROW] * 8 + [COL] * 8),
        ("timm", {}, [ROW] * 4 + [COL] * 4 + [ROW] * 4 + [COL] * 4),
        ("timm", {"interleave_sin_cos": True}, [ROW] * 8 + [COL] * 8),
        ("positional-encodings", {}, [ROW] * 8 + [COL] * 8),
    ],
)
def test_which_channels_encode_rows_and_columns(preset, overrides, expected):
    shape = (5, 7)
    table = grid(shape, 16, preset=preset, dtype=np.float64, **overrides)
    assert varying_axes(table, shape) == expected


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("diffusers", [TIME3] * 8 + [COL3] * 12 + [ROW3] * 12),
        ("positional-encodings", [TIME3] * 12 + [ROW3] * 12 + [COL3] * 8),
    ],
)
def test_3d_axis_blocks(preset, expected):
    shape = (3, 4, 5)
    assert varying_axes(grid(shape, 32, preset=preset, dtype=np.float64), shape) == expected


def test_rows_are_row_major_and_sin_cos_blocks_are_where_stated():
    h, w, dim = 3, 4, 8  # MAE: [sin col, cos col, sin row, cos row], K = 2
    table = grid((h, w), dim, dtype=np.float64)
    omega = np.array([1.0, 1e-2])
    for r in range(h):
        for c in range(w):
            row = table[r * w + c]
            np.testing.assert_allclose(row[0:2], np.sin(c * omega), atol=1e-15)
            np.testing.assert_allclose(row[2:4], np.cos(c * omega), atol=1e-15)
            np.testing.assert_allclose(row[4:6], np.sin(r * omega), atol=1e-15)
            np.testing.assert_allclose(row[6:8], np.cos(r * omega), atol=1e-15)


def test_positional_encodings_interleaves_within_a_block():
    table = grid((2, 3), 8, preset="positional-encodings", dtype=np.float64)
    cell = table[1 * 3 + 2]  # x (row) = 1, y (col) = 2; C = 4, omega = [1, 1e-2]
    expected = [np.sin(1), np.cos(1), np.sin(0.01), np.cos(0.01)]
    expected += [np.sin(2), np.cos(2), np.sin(0.02), np.cos(0.02)]
    np.testing.assert_allclose(cell, expected, atol=1e-15)


def test_zero_rows():
    body = grid((3, 4), 16)
    with_cls = grid((3, 4), 16, cls_token=True)
    assert with_cls.shape == (13, 16)
    assert not with_cls[0].any()
    np.testing.assert_array_equal(with_cls[1:], body)
    extra = grid((3, 4), 16, extra_tokens=4, cls_token=True)  # extra_tokens counts them all
    assert extra.shape == (16, 16)
    assert not extra[:4].any()
    np.testing.assert_array_equal(extra[4:], body)
    three_d = grid((2, 3, 4), 16, preset="diffusers", cls_token=True)
    assert three_d.shape == (25, 16) and not three_d[0].any()


def test_only_sum_of_shape_positions_are_evaluated(monkeypatch):
    calls = []
    real = grid_module.sincos_numpy

    def counting(positions, turns):
        calls.append((positions.size, turns.size))
        return real(positions, turns)

    monkeypatch.setattr(grid_module, "sincos_numpy", counting)
    grid((6, 7, 9), 32, preset="diffusers")
    assert sorted(calls) == sorted([(6, 4), (7, 6), (9, 6)])


# ------------------------------------------------------------------ dtypes and torch


def test_torch_dtype_gives_cpu_tensor():
    ref = grid((4, 5), 16, preset="timm", dtype=np.float64)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        t = grid((4, 5), 16, preset="timm", dtype=dtype)
        assert isinstance(t, torch.Tensor) and t.dtype == dtype and t.device.type == "cpu"
        # rounded once from the float64-exact table
        assert torch.equal(t, torch.from_numpy(ref).to(dtype))
    assert grid((4, 5), 16).dtype == np.float32
    assert grid((4, 5), 16, dtype="float64").dtype == np.float64
    assert grid((4, 5), 16, dtype=np.float16).dtype == np.float16


def test_bfloat16_needs_torch():
    with pytest.raises(TypeError, match="torch"):
        grid((2, 2), 8, dtype="bfloat16")


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (((4, 4), 6), {}, ValueError, r"dim must be a multiple of 4"),
        (((4, 4), 0), {}, ValueError, r"dim must be an int >= 1"),
        (((4, 4), 8.0), {}, TypeError, r"dim must be an int"),
        (((4, 4), True), {}, TypeError, r"dim must be an int"),
        (((2, 2, 2), 24), {"preset": "diffusers"}, ValueError, r"dim must be a multiple of 16"),
        (((2, 2), 4), {"preset": "big-vision"}, ValueError, r"dim=4"),
        ((4, 8), {}, TypeError, r"shape must be a tuple \(H, W\) or \(T, H, W\)"),
        (((4,), 8), {}, ValueError, r"shape must be .* got 1 axes"),
        (((1, 2, 3, 4), 8), {}, ValueError, r"shape must be .* got 4 axes"),
        (((0, 3), 8), {}, ValueError, r"shape must be .* ints >= 1"),
        (((2.0, 3), 8), {}, TypeError, r"shape must be .* float"),
        (((2, 3, 4), 16), {"preset": "mae"}, ValueError, r"preset 'mae' covers shape 2-D"),
        (((2, 3), 8), {"preset": "nope"}, ValueError, r"unknown preset 'nope'; valid presets"),
        (((2, 3), 8), {"bogus": 1}, ValueError, r"unknown override 'bogus'; valid overrides"),
        (((2, 3), 8), {"preset": "timm", "interleave_sin_cos": 1}, TypeError, "bool"),
        (((2, 3), 8), {"temperature": 0.0}, ValueError, r"base must be > 0"),
        (((2, 3), 8), {"base_size": -1}, ValueError, r"base_size must be > 0"),
        (((2, 3), 8), {"temporal_interpolation_scale": 2.0}, ValueError, "3-D grids"),
        (((2, 3), 8), {"cls_token": 1}, TypeError, r"cls_token must be a bool"),
        (((2, 3), 8), {"extra_tokens": -1}, ValueError, r"extra_tokens must be an int >= 0"),
        (((2, 3), 8), {"dtype": "int32"}, TypeError, r"dtype must be"),
        (((2, 3), 8), {"axes": ("row", "row")}, ValueError, r"axes must be a permutation"),
        (((2, 3), 8), {"shares": (0.25, 0.5)}, ValueError, r"shares must sum to 1"),
        (((2, 3), 8), {"layout": "zigzag"}, ValueError, r"layout must be one of"),
    ],
)
def test_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        grid(*args, **kwargs)


def test_gridspec_is_a_preset_and_its_rank_must_match():
    spec = GridSpec(axes=("row", "col"), layout="interleaved")
    np.testing.assert_array_equal(
        grid((3, 5), 8, preset=spec), grid((3, 5), 8, preset="positional-encodings")
    )
    with pytest.raises(ValueError, match="2-D grid"):
        grid((3, 5, 2), 12, preset=spec)


def test_uneven_shares_and_grid_frequencies():
    freqs = grid_frequencies((4, 6, 8), 32, preset="diffusers", spatial_interpolation_scale=2.0)
    np.testing.assert_allclose(freqs["time"], 1e4 ** -(np.arange(4) / 4), rtol=1e-15)
    np.testing.assert_allclose(freqs["col"], 0.5 * 1e4 ** -(np.arange(6) / 6), rtol=1e-15)
    base16 = grid_frequencies((4, 6), 8, preset="diffusers")  # coordinate i * 16 / n
    np.testing.assert_allclose(base16["row"], [4.0, 0.04], rtol=1e-15)
    np.testing.assert_allclose(base16["col"], [16 / 6, 16 / 600], rtol=1e-15)


def test_every_preset_documents_its_axes():
    for name, by_rank in PRESETS.items():
        for rank, spec in by_rank.items():
            assert spec.rank == rank, name
            assert all(axis in spec.anchor for axis in spec.axes), name
            assert resolve(name, rank) is spec


@settings(max_examples=40, deadline=None)
@given(
    preset=st.sampled_from(sorted(PRESETS)),
    sizes=st.lists(st.integers(1, 6), min_size=2, max_size=3),
    mult=st.integers(1, 6),
)
def test_never_nan_and_shape_is_exact(preset, sizes, mult):
    rank = len(sizes)
    if rank not in PRESETS[preset]:
        return
    dim = 16 * mult if preset != "positional-encodings" else mult + 1
    out = grid(tuple(sizes), dim, preset=preset)
    assert out.shape == (math.prod(sizes), dim)
    assert np.isfinite(out).all() and np.abs(out).max() <= 1.0
    # each channel is written by exactly one (axis, sin|cos) slice
    covered = [
        ch
        for a in resolve(preset, rank).channels(dim)
        for sl in (a.sin, a.cos)
        for ch in range(dim)[sl]
    ]
    assert sorted(covered) == list(range(dim))


# ------------------------------------------------------------------ aliases with a meaning


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("preset", ["mae", "diffusers", "big-vision"])
def test_interleave_sin_cos_is_refused_where_the_column_comes_first(preset, interleave):
    # timm's knob means timm's layout, row block first; on MAE's column-first axes it
    # used to give neither timm's layout nor the preset's
    with pytest.raises(ValueError, match=r"interleave_sin_cos is timm's .*preset='timm'"):
        grid((3, 5), 16, preset=preset, interleave_sin_cos=interleave)
    with pytest.raises(ValueError, match=r"interleave_sin_cos is timm's"):
        grid((2, 3, 5), 32, preset="diffusers", interleave_sin_cos=interleave)


@pytest.mark.parametrize("interleave", [False, True])
def test_interleave_sin_cos_where_the_row_comes_first(timm_sincos, interleave):
    anchor = timm_sincos.build_sincos2d_pos_embed([3, 5], 16, interleave_sin_cos=interleave)
    timm = grid((3, 5), 16, preset="timm", interleave_sin_cos=interleave)
    check(timm, anchor.numpy(), timm_oracle(3, 5, 16, interleave=interleave), "pow32")
    for preset in ("moco-v3", "mae"):
        axes = {"axes": ("row", "col")} if preset == "mae" else {}
        same = grid((3, 5), 16, preset=preset, interleave_sin_cos=interleave, **axes)
        np.testing.assert_array_equal(same, timm)


def test_temperature_means_the_base_everywhere():
    for preset in ("mae", "timm", "big-vision"):
        np.testing.assert_array_equal(
            grid((3, 5), 16, preset=preset, temperature=100.0),
            grid((3, 5), 16, preset=preset, base=100.0),
        )


# ------------------------------------------------------------------------ size limits


@pytest.fixture
def no_frequencies(monkeypatch):
    """Fail any call that gets as far as computing frequencies: sizes are checked first."""

    def refuse(*args, **kwargs):
        raise AssertionError("frequencies computed before the size was checked")

    monkeypatch.setattr(grid_module, "geometric_turns", refuse)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: grid((4, 4), 2**40), r"dim must be at most 65536 channels; got 1099511627776"),
        (lambda: grid((2, 2, 2), 65552, preset="diffusers"), r"dim must be at most 65536"),
        (lambda: grid_frequencies((4, 4), 2**40), r"dim must be at most 65536 channels"),
        (
            lambda: grid((2**16, 2**16), 4),
            r"grid encoding of 4294967296 rows \(shape \(65536, 65536\)\) x dim=4 would hold",
        ),
        (lambda: grid((2**10, 2**10, 2**10), 16, preset="diffusers"), r"would hold"),
    ],
)
def test_huge_sizes_are_refused_before_any_work(no_frequencies, call, match):
    with pytest.raises(ValueError, match=match):
        call()
