"""Multi-axis rotary embeddings: posenc.rotary.multiaxis against its anchors.

References: transformers' ``Qwen2VLRotaryEmbedding`` and
``Qwen3VLTextRotaryEmbedding`` (M-RoPE, contiguous and interleaved sections),
rotary-embedding-torch's ``get_axial_freqs`` (axial 2-D/3-D) and
``RotaryEmbedding(use_xpos=True).rotate_queries_and_keys`` (xPos); float64
angles as the truth.

Tolerances are derived. The references compute in float32: a frequency off by
a relative ``delta`` (a few ``2**-24``: the exponent, ``pow`` and the division,
or ``linspace`` and the product with ``pi`` for pixel frequencies) times a
position, rounded once more, gives an angle off by ``|angle| (delta +
2**-24)``; cos and sin round once (``2**-24``) in both ours and theirs. So

    |ours - theirs| <= max|angle| * (delta + 2**-24) + 2**-23,

with ``delta = 3 * 2**-24`` for the float32 ``pow`` ladders and ``4 * 2**-24``
for the pixel ``linspace``. Rotated vectors scale this by their pair norm
(``2 max|x|``) plus the rotation's own roundings (``4 * 2**-24 max|x|``).
posenc's tables are exact before one rounding: within ``2**-24`` of the
float64 truth at any position below ``2**31``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from conftest import anchor
from posenc.families.rotary.multiaxis import (
    AxialRotary,
    axial_cos_sin,
    axial_grid,
    mrope_axes,
    mrope_cos_sin,
    pixel_frequencies,
    xpos_rotate,
    xpos_scale,
    xpos_tables,
)
from posenc.families.rotary.schedules import RopeFrequencies, frequencies
from posenc.families.rotary.tables import cos_sin

F32_EPS = 2.0**-24

transformers = anchor("transformers")
rotary_embedding_torch = anchor("rotary_embedding_torch")


pytestmark = pytest.mark.usefixtures("quiet_transformers")


def _table_tol(max_angle: float, delta_ulps: float = 3.0) -> float:
    return max_angle * (delta_ulps + 1) * F32_EPS + 2 * F32_EPS


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


# --------------------------------------------------------------------------------------
# M-RoPE.

QWEN = {
    # name: (rotary module class, config class, default mrope_section, head_dim, interleaved)
    "qwen2-vl": ("qwen2_vl", "Qwen2VLRotaryEmbedding", "Qwen2VLTextConfig", [16, 24, 24], False),
    "qwen3-vl": (
        "qwen3_vl",
        "Qwen3VLTextRotaryEmbedding",
        "Qwen3VLTextConfig",
        [24, 20, 20],
        True,
    ),
}


def _qwen_rotary(name: str, base: float = 1e6) -> tuple[Any, list[int], bool]:
    """The HF rotary module of a tiny config, with the real head_dim 128 and sections."""
    package, module_cls, config_cls, section, interleaved = QWEN[name]
    modeling = __import__(
        f"transformers.models.{package}.modeling_{package}", fromlist=[module_cls]
    )
    config = getattr(transformers, config_cls)(
        hidden_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        rope_parameters={"rope_type": "default", "rope_theta": base, "mrope_section": section},
    )
    return getattr(modeling, module_cls)(config), section, interleaved


def _grid_positions(t_max: int, batch: int = 2, seq: int = 96) -> torch.Tensor:
    """(3, batch, seq): a video-like T/H/W grid after a temporal offset up to ``t_max``."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randint(0, t_max - seq, (batch, 1), generator=gen)
    i = torch.arange(seq)
    t = start + i // 16
    h = start + (i // 4) % 4
    w = start + i % 4
    return torch.stack([t, h, w])


@pytest.mark.parametrize("name", list(QWEN))
def test_mrope_matches_transformers(name: str) -> None:
    hf_rotary, section, interleaved = _qwen_rotary(name)
    freqs = frequencies("default", 128, 1e6)
    positions = _grid_positions(4096)
    hf_cos, hf_sin = hf_rotary(torch.zeros(1), positions)
    cos, sin = mrope_cos_sin(positions, freqs, section, interleaved=interleaved)
    assert cos.shape == hf_cos.shape == (2, 96, 128) and cos.dtype == torch.float32
    tol = _table_tol(float(positions.max()) * float(freqs.inv_freq.max()))
    assert _max_diff(cos, hf_cos) <= tol
    assert _max_diff(sin, hf_sin) <= tol
    # the other order is far off: the test can tell them apart
    other_section = [24, 20, 20] if not interleaved else [16, 24, 24]
    other, _ = mrope_cos_sin(positions, freqs, other_section, interleaved=not interleaved)
    assert _max_diff(other, hf_cos) > 0.1


@pytest.mark.parametrize("name", list(QWEN))
def test_mrope_exact_at_large_positions(name: str) -> None:
    """Temporal positions near 2**24: HF's float32 angles are off by radians, ours are exact."""
    hf_rotary, section, interleaved = _qwen_rotary(name, base=1e4)
    freqs = frequencies("default", 128, 1e4)
    positions = _grid_positions(2**24)
    cos, sin = mrope_cos_sin(positions, freqs, section, interleaved=interleaved)
    hf_cos, _ = hf_rotary(torch.zeros(1), positions)
    # truth: float64 angles of every axis (error P omega 2**-53 ~ 2e-9), recomposed by HF's code
    angles = positions.double()[..., None] * torch.tensor(freqs.inv_freq)
    true_cos = hf_rotary.recomposition_frequencies(torch.cos(angles))
    true_sin = hf_rotary.recomposition_frequencies(torch.sin(angles))
    truth_err = float(positions.max()) * 2.0**-52
    assert _max_diff(cos, true_cos) <= F32_EPS + truth_err
    assert _max_diff(sin, true_sin) <= F32_EPS + truth_err
    assert _max_diff(hf_cos, true_cos) > 0.1  # HF's float32 angles: |angle| 2**-24 ~ radians


@pytest.mark.parametrize("interleaved", [False, True])
def test_mrope_with_equal_axes_is_plain_rope(interleaved: bool) -> None:
    """Text tokens have T = H = W: M-RoPE reduces to 1-D RoPE in either order."""
    freqs = frequencies("yarn", 16, 1e4, {"factor": 4.0, "original_max_position_embeddings": 64})
    p = torch.tensor([[0, 1, 5, 1000, 123456]])
    cos, sin = mrope_cos_sin(p.expand(3, 1, 5), freqs, [4, 2, 2], interleaved=interleaved)
    plain_cos, plain_sin = cos_sin(p, freqs)
    assert torch.equal(cos, plain_cos) and torch.equal(sin, plain_sin)
    assert cos[0, 0, 0] == pytest.approx(freqs.attention_scaling, rel=1e-7)


def test_mrope_axes_literal() -> None:
    # Qwen2-VL: contiguous chunks, chunk i from axis i % 3
    assert mrope_axes((2, 3, 3), 8) == (0, 0, 1, 1, 1, 2, 2, 2)
    # Qwen3-VL: axis a at k % 3 == a below 3 * section[a]; the rest temporal
    assert mrope_axes((4, 2, 2), 8, interleaved=True) == (0, 1, 2, 0, 1, 2, 0, 0)
    assert mrope_axes((1, 1, 1, 1), 4) == (0, 1, 2, 0)


@pytest.mark.parametrize(
    ("section", "interleaved", "match"),
    [
        ([2, 3, 4], False, r"mrope_section must sum to rotary_dim / 2 = 8; got \[2, 3, 4\]"),
        ([4, 4, -0.5], False, "mrope_section must be a non-empty list of non-negative ints"),
        ([8, True, 0], False, "mrope_section must be a non-empty list"),
        ([], False, "mrope_section must be a non-empty list"),
        ([4, 4], True, "interleaved mrope_section needs one section per axis"),
        ([2, 3, 3], True, r"interleaved mrope_section \[2, 3, 3\] does not fit"),
    ],
)
def test_mrope_section_errors(section: list[Any], interleaved: bool, match: str) -> None:
    freqs = frequencies("default", 16, 1e4)
    positions = torch.zeros(3, 1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        mrope_cos_sin(positions, freqs, section, interleaved=interleaved)


def test_mrope_position_errors() -> None:
    freqs = frequencies("default", 16, 1e4)
    with pytest.raises(ValueError, match=r"\(axes, batch, seq\)"):
        mrope_cos_sin(torch.arange(4), freqs, [2, 3, 3])
    with pytest.raises(ValueError, match="2\\*\\*31"):
        mrope_cos_sin(torch.full((3, 1, 2), 2**31), freqs, [2, 3, 3])
    with pytest.raises(TypeError, match="position_ids"):
        mrope_cos_sin(np.zeros((3, 1, 2)), freqs, [2, 3, 3])


# --------------------------------------------------------------------------------------
# Axial.


def _rte_axial(axis_dim: int, kind: str, max_freq: float = 10.0) -> Any:
    # without its cache: get_axial_freqs with offsets would read positions 0.. from the
    # cache filled by an earlier call (the cache is keyed by length, not by positions)
    return rotary_embedding_torch.RotaryEmbedding(
        dim=axis_dim, freqs_for=kind, max_freq=max_freq, cache_if_possible=False
    )


def _ours_freqs(axis_dim: int, kind: str, max_freq: float = 10.0) -> RopeFrequencies:
    if kind == "pixel":
        return pixel_frequencies(axis_dim, max_freq)
    return frequencies("default", axis_dim, 1e4)


@pytest.mark.parametrize("kind", ["lang", "pixel"])
@pytest.mark.parametrize("sizes", [(6, 9), (3, 4, 5)])
def test_axial_tables_match_rotary_embedding_torch(kind: str, sizes: tuple[int, ...]) -> None:
    rte = _rte_axial(16, kind, max_freq=256)
    freqs = _ours_freqs(16, kind, max_freq=256)
    offsets = (3,) * len(sizes)
    for off in (None, offsets):
        angles = rte.get_axial_freqs(*sizes, offsets=off)
        coords = axial_grid(*sizes, normalized=kind == "pixel", offsets=off)
        cos, sin = axial_cos_sin(coords, freqs)
        assert cos.shape == angles.shape == (*sizes, 16 * len(sizes))
        delta = 4.0 if kind == "pixel" else 3.0
        tol = _table_tol(float(angles.abs().max()), delta)
        assert _max_diff(cos, angles.cos()) <= tol
        assert _max_diff(sin, angles.sin()) <= tol


@pytest.mark.parametrize("kind", ["lang", "pixel"])
def test_axial_rotary_matches_apply_rotary_emb(kind: str) -> None:
    """A (batch, heads, H, W, head_dim) grid and its flattened (batch, heads, H*W, ...) form."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 6, 9, 48, generator=gen)
    k = torch.randn(2, 3, 6, 9, 48, generator=gen)
    rte = _rte_axial(16, kind, max_freq=256)
    angles = rte.get_axial_freqs(6, 9)
    ref_q = rotary_embedding_torch.apply_rotary_emb(angles, q)
    ref_k = rotary_embedding_torch.apply_rotary_emb(angles, k)
    module = AxialRotary(48, 2, axis_dim=16, freqs=_ours_freqs(16, kind, max_freq=256))
    assert module.rotary_dim == 32  # channels 32.. pass through, as in the reference
    coords = axial_grid(6, 9, normalized=kind == "pixel")
    rq, rk = module(q, k, coords)
    delta = 4.0 if kind == "pixel" else 3.0
    tol = 2 * _table_tol(float(angles.abs().max()), delta) + 4 * F32_EPS
    scale = float(max(q.abs().max(), k.abs().max()))
    assert _max_diff(rq, ref_q) <= tol * scale
    assert _max_diff(rk, ref_k) <= tol * scale
    assert torch.equal(rq[..., 32:], q[..., 32:])
    fq, _ = module(q.flatten(2, 3), k.flatten(2, 3), coords.flatten(0, 1))
    assert torch.equal(fq, rq.flatten(2, 3))


def test_axial_default_split_and_base() -> None:
    module = AxialRotary(64, 3)
    assert (module.axis_dim, module.rotary_dim) == (20, 60)
    rte = rotary_embedding_torch.RotaryEmbedding(dim=20)
    angles = rte.get_axial_freqs(2, 3, 4)
    cos, _ = module.cos_sin(axial_grid(2, 3, 4))
    assert _max_diff(cos, angles.cos()) <= _table_tol(float(angles.abs().max()))


def test_axial_exact_at_large_coordinates() -> None:
    freqs = frequencies("default", 8, 1e4)
    coords = torch.tensor([[2**30 - 1, 12345677], [999_999_937, 3]])
    cos, sin = axial_cos_sin(coords, freqs)
    angles = coords.double()[..., None] * torch.tensor(freqs.inv_freq)  # (2, 2, 4)
    true = angles.repeat_interleave(2, -1).flatten(-2)
    truth_err = 2**30 * 2.0**-52
    assert _max_diff(cos, torch.cos(true)) <= F32_EPS + truth_err
    assert _max_diff(sin, torch.sin(true)) <= F32_EPS + truth_err


def test_axial_errors() -> None:
    with pytest.raises(ValueError, match="axis_dim must be even"):
        AxialRotary(64, 2, axis_dim=15)
    with pytest.raises(ValueError, match="axes \\* axis_dim <= head_dim"):
        AxialRotary(64, 3, axis_dim=32)
    with pytest.raises(ValueError, match="axis_dim / 2 = 8 frequencies"):
        AxialRotary(64, 2, axis_dim=16, freqs=frequencies("default", 8, 1e4))
    module = AxialRotary(32, 2)
    with pytest.raises(ValueError, match=r"coords must be \(\.\.\., 2\)"):
        module.cos_sin(axial_grid(2, 3, 4))
    with pytest.raises(ValueError, match="one per axis"):
        axial_cos_sin(axial_grid(2, 3), [frequencies("default", 8, 1e4)] * 3)
    with pytest.raises(ValueError, match="offsets"):
        axial_grid(2, 3, offsets=(1,))


def _axial_copies(module: AxialRotary) -> dict[str, torch.nn.Module]:
    """The module through deepcopy, pickle, torch.save / torch.load and a state dict."""
    import copy
    import io
    import pickle

    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    fresh = AxialRotary(module.head_dim, module.axes, axis_dim=module.axis_dim)
    fresh.load_state_dict(module.state_dict())  # strict: nothing missing, nothing unexpected
    return {
        "deepcopy": copy.deepcopy(module),
        "pickle": pickle.loads(pickle.dumps(module)),
        "torch.save": torch.load(buffer, weights_only=False),
        "state_dict": fresh,
    }


@pytest.mark.parametrize("used", [False, True])
def test_axial_survives_copies_and_a_state_dict_round_trip(used: bool) -> None:
    module = AxialRotary(48, 3, axis_dim=16)
    q, k = torch.randn(2, 2, 3, 4, 5, 48), torch.randn(2, 2, 3, 4, 5, 48)
    coords = axial_grid(3, 4, 5)
    if used:  # the frequencies' device tensors cached (they hold a lock)
        module(q, k, coords)
    want = module(q, k, coords)
    for how, clone in _axial_copies(module).items():
        assert torch.equal(clone.inv_freq, module.inv_freq), how
        for got, expected in zip(clone(q, k, coords), want, strict=True):
            assert torch.equal(got, expected), how


def test_axial_meta_device_init_then_to_empty_rebuilds_inv_freq() -> None:
    with torch.device("meta"):
        module = AxialRotary(32, 2)
    assert module.inv_freq.is_meta
    module.to_empty(device="cpu")
    fresh = AxialRotary(32, 2)
    module.load_state_dict(fresh.state_dict())
    assert torch.equal(module.inv_freq, fresh.inv_freq)  # not the uninitialised memory
    q, coords = torch.randn(1, 2, 4, 4, 32), axial_grid(4, 4)
    for got, expected in zip(module(q, q, coords), fresh(q, q, coords), strict=True):
        assert torch.equal(got, expected)
    # a cast keeps it exact float32, and reset_parameters rebuilds it
    module.to(torch.bfloat16)
    assert module.inv_freq.dtype == torch.float32 and torch.equal(module.inv_freq, fresh.inv_freq)
    module.inv_freq.fill_(0.0)
    module.reset_parameters()
    assert torch.equal(module.inv_freq, fresh.inv_freq)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8])
def test_small_int_positions_and_coordinates_give_the_int64_results(dtype: torch.dtype) -> None:
    freqs = frequencies("default", 16, 1e4)
    position_ids = _grid_positions(120, seq=32)  # every value below 128
    got = mrope_cos_sin(position_ids.to(dtype), freqs, [2, 3, 3])
    for a, b in zip(got, mrope_cos_sin(position_ids, freqs, [2, 3, 3]), strict=True):
        assert torch.equal(a, b)
    module = AxialRotary(32, 2)
    q = torch.randn(1, 2, 6, 5, 32)
    coords = axial_grid(6, 5) + 120  # near the top of int8
    got = module(q, q, coords.to(dtype))
    for a, b in zip(got, module(q, q, coords), strict=True):
        assert torch.equal(a, b)
    positions = torch.arange(100, 128)
    scale = xpos_scale(positions.to(dtype), 16, center=10)
    assert torch.equal(scale, xpos_scale(positions, 16, center=10))


# --------------------------------------------------------------------------------------
# xPos.


def test_xpos_scale_literal() -> None:
    """zeta_k = (2k + 0.4 d) / (1.4 d); exponent (t - center) / scale_base."""
    zeta = [0.4 * 4 / 5.6, (2 + 0.4 * 4) / 5.6]
    scale = xpos_scale(torch.tensor([10, 10 + 512, 10 - 512]), 4, center=10, dtype=torch.float64)
    expected = [[1, 1, 1, 1], [zeta[0], zeta[0], zeta[1], zeta[1]]]
    expected.append([1 / zeta[0], 1 / zeta[0], 1 / zeta[1], 1 / zeta[1]])
    np.testing.assert_allclose(scale.numpy(), expected, rtol=1e-15)
    half = xpos_scale(torch.tensor([522]), 4, center=10, layout="half", dtype=torch.float64)
    np.testing.assert_allclose(half.numpy(), [[zeta[0], zeta[1], zeta[0], zeta[1]]], rtol=1e-15)


def test_xpos_decay_depends_only_on_distance() -> None:
    """q_m's scale over k_n's: zeta ** ((m - n) / scale_base), whatever the center."""
    m, n = torch.tensor([700, 40]), torch.tensor([100, 40])
    ratios = [
        xpos_scale(m, 8, center=c, dtype=torch.float64)
        / xpos_scale(n, 8, center=c, dtype=torch.float64)
        for c in (0, 333)
    ]
    torch.testing.assert_close(ratios[0], ratios[1], rtol=1e-14, atol=0)
    zeta = (torch.arange(0, 8, 2, dtype=torch.float64) + 3.2) / 11.2
    expected = zeta.repeat_interleave(2)[None] ** ((m - n)[:, None] / 512)
    torch.testing.assert_close(ratios[0], expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_xpos_matches_rotary_embedding_torch(seq_dim: int) -> None:
    gen = torch.Generator().manual_seed(0)
    shape = (2, 4, 300, 64) if seq_dim == -2 else (2, 300, 4, 64)
    q, k = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    rte = rotary_embedding_torch.RotaryEmbedding(dim=32, use_xpos=True)
    ref_q, ref_k = rte.rotate_queries_and_keys(q, k, seq_dim=seq_dim)
    rq, rk = xpos_rotate(q, k, frequencies("default", 32, 1e4), seq_dim=seq_dim)
    # angle error as in the tables; the float32 scale adds about (|ln scale| + 4) 2**-24
    max_scale = float(xpos_scale(torch.tensor([0, 299]), 32, center=150).max())
    angle_tol = _table_tol(299.0)
    tol = 2 * max_scale * (angle_tol + (abs(math.log(max_scale)) + 8) * F32_EPS)
    scale = float(max(q.abs().max(), k.abs().max()))
    assert _max_diff(rq, ref_q) <= tol * scale
    assert _max_diff(rk, ref_k) <= tol * scale
    assert torch.equal(rq[..., 32:], q[..., 32:]) and torch.equal(rk[..., 32:], k[..., 32:])


def test_xpos_tables_at_any_positions_are_the_rows_of_the_whole() -> None:
    """Rows at any positions equal the whole's; queries scaled by xpos_scale, keys over it."""
    freqs = frequencies("default", 8, 1e4)
    whole = xpos_tables(torch.arange(30), freqs, center=15, layout="half")
    some = xpos_tables(torch.tensor([3, 17, 29]), freqs, center=15, layout="half")
    for a, b in zip(some, whole, strict=True):
        assert torch.equal(a, b[[3, 17, 29]])
    cq, sq, ck, sk = xpos_tables(torch.arange(30), freqs, center=15, dtype=torch.float64)
    scale = xpos_scale(torch.arange(30), 8, center=15, dtype=torch.float64)
    # a rotation times the scale for queries, over it for keys
    torch.testing.assert_close(cq**2 + sq**2, scale**2, rtol=1e-14, atol=0)
    torch.testing.assert_close(ck**2 + sk**2, scale**-2, rtol=1e-14, atol=0)
    torch.testing.assert_close(sq / cq, sk / ck, rtol=1e-14, atol=1e-300)


def test_xpos_gradients() -> None:
    """The inverse-rotation backward of apply_rotary stays right for scaled cos/sin."""
    freqs = frequencies("default", 4, 1e4)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 5, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(1, 5, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: xpos_rotate(a, b, freqs, scale_base=4.0), (q, k))


def test_xpos_errors() -> None:
    freqs = frequencies("default", 8, 1e4)
    q = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="same length"):
        xpos_rotate(q, torch.zeros(1, 5, 8), freqs)
    with pytest.raises(ValueError, match="seq_dim"):
        xpos_rotate(q, q, freqs, seq_dim=-1)
    with pytest.raises(ValueError, match="scale_base"):
        xpos_scale(torch.arange(3), 8, center=1, scale_base=0)
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        xpos_scale(torch.arange(3), 7, center=1)
