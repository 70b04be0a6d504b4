"""DINOv3's RoPE (``posenc.rotary.multiaxis.DINOv3Rope``) against transformers and timm.

References: transformers' ``DINOv3ViTRopePositionEmbedding``, its
``get_patches_center_coordinates``, ``augment_patches_center_coordinates`` and
``apply_rotary_pos_emb`` (patch tokens rotated, class and register tokens not), and
timm's ``RotaryEmbeddingDinoV3`` (``normalize_coords`` "separate", "max", "min" and
the min/max period schedule, which transformers' module lacks); float64 formulas as
the truth.

Tolerances are derived. The references work in float32: the coordinates
``2 (i + 1/2) / H - 1`` are off by at most ``2 * 2**-24`` (two roundings of values
below 2), the frequency ``1 / period`` (``pow`` and a division) by ``3 * 2**-24``
relative, and ``2 pi * c * inv_freq`` rounds twice more, so an angle is off by at most
``2**-24 * (6 |theta| + 4 pi)``; cos and sin round once (``2**-24``) in theirs and in
ours (exact before one rounding). So

    |ours - theirs| <= 2**-24 * (6 max|theta| + 4 pi + 2),    max|theta| <= 2 pi max|c|,

and a rotated pair scales it by ``2 max|q|``, plus the rotation's own three roundings.
In training the augmentation multiplies ``c`` in float32 three more times: three more
``|theta|`` terms.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from conftest import anchor
from posenc.families.rotary.multiaxis import (
    DINOv3Rope,
    dinov3_coords,
    dinov3_cos_sin,
    dinov3_frequencies,
)
from timm_layers import timm_layer

F32 = 2.0**-24

dinov3_vit = anchor("transformers.models.dinov3_vit.modeling_dinov3_vit")
transformers = anchor("transformers")

pytestmark = pytest.mark.usefixtures("quiet_transformers")


@pytest.fixture(scope="module")
def timm_sincos():
    return timm_layer("pos_embed_sincos")


def _hf(head_dim: int, heads: int = 2, base: float = 100.0, **augment):
    config = transformers.DINOv3ViTConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        rope_theta=base,
        patch_size=16,
        image_size=224,
        pos_embed_shift=augment.get("shift"),
        pos_embed_jitter=augment.get("jitter"),
        pos_embed_rescale=augment.get("rescale"),
    )
    return dinov3_vit.DINOv3ViTRopePositionEmbedding(config)


def _pixels(height: int, width: int) -> torch.Tensor:
    return torch.zeros(1, 3, 16 * height, 16 * width)


def _table_tol(max_c: float, extra: int = 0) -> float:
    theta = 2 * math.pi * max_c
    return F32 * ((6 + extra) * theta + 4 * math.pi + 2)


def _rotated_tol(table_tol: float, x_max: float) -> float:
    return 2 * x_max * (table_tol + 3 * F32)


@pytest.mark.parametrize(
    ("head_dim", "base", "grid"), [(64, 100.0, (14, 14)), (32, 100.0, (7, 12)), (16, 20.0, (3, 5))]
)
def test_eval_tables_and_rotation_equal_transformers(head_dim, base, grid):
    ref = _hf(head_dim, base=base).eval()
    ours = DINOv3Rope(head_dim, 2, base=base).eval()
    cos_ref, sin_ref = ref(_pixels(*grid))
    coords = ours.coords(*grid)
    cos, sin = ours.cos_sin(coords)
    tol = _table_tol(1.0)
    assert (cos - cos_ref).abs().max() <= tol
    assert (sin - sin_ref).abs().max() <= tol
    # transformers' own coordinates, to the float32 rounding
    hf_coords = dinov3_vit.get_patches_center_coordinates(*grid, torch.float32, "cpu")
    assert (coords - hf_coords.double()).abs().max() <= 2 * F32
    # q and k with a class token and 4 registers before the patches, and their gradients
    n = coords.shape[0]
    gen = torch.Generator().manual_seed(0)
    q, k, gq, gk = (torch.randn(1, 2, 5 + n, head_dim, generator=gen) for _ in range(4))
    qa, ka = q.clone().requires_grad_(), k.clone().requires_grad_()
    qb, kb = q.clone().requires_grad_(), k.clone().requires_grad_()
    want = dinov3_vit.apply_rotary_pos_emb(qa, ka, cos_ref, sin_ref)
    got = ours(qb, kb, coords)
    rot = _rotated_tol(tol, float(max(q.abs().max(), k.abs().max())))
    for w, g in zip(want, got, strict=True):
        assert (w - g).abs().max() <= rot
    assert torch.equal(got[0][:, :, :5], q[:, :, :5])  # class and registers untouched
    torch.autograd.backward(want, (gq, gk))
    torch.autograd.backward(got, (gq, gk))
    g_max = float(max(gq.abs().max(), gk.abs().max()))
    assert (qa.grad - qb.grad).abs().max() <= _rotated_tol(tol, g_max)
    assert (ka.grad - kb.grad).abs().max() <= _rotated_tol(tol, g_max)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "augment", [{"shift": 1.0, "jitter": 1.5, "rescale": 2.0}, {"rescale": 2.0}]
)
def test_training_draws_equal_transformers_seeded(seed, augment):
    ref = _hf(64, **augment).train()
    ours = DINOv3Rope(64, **augment).train()
    torch.manual_seed(seed)
    cos_ref, sin_ref = ref(_pixels(6, 9))
    torch.manual_seed(seed)
    coords = ours.coords(6, 9)  # the global RNG, as the reference
    again = ours.coords(6, 9, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(coords, again)
    # |c| <= (1 + shift) * jitter * rescale
    max_c = (1 + augment.get("shift", 0.0)) * augment.get("jitter", 1.0) * augment["rescale"]
    tol = _table_tol(max_c, extra=3)
    cos, sin = ours.cos_sin(coords)
    assert (cos - cos_ref).abs().max() <= tol
    assert (sin - sin_ref).abs().max() <= tol
    # a different draw is far off: the draws, not the tolerance, make them equal
    cos_other, _ = ours.cos_sin(ours.coords(6, 9))
    assert (cos_other - cos_ref).abs().max() > 100 * tol


def test_training_draws_equal_timms(timm_sincos):
    ref = timm_sincos.RotaryEmbeddingDinoV3(
        64, shift_coords=0.5, jitter_coords=1.2, rescale_coords=1.5
    ).train()
    ours = DINOv3Rope(64, shift=0.5, jitter=1.2, rescale=1.5).train()
    torch.manual_seed(11)
    emb = ref.get_embed([5, 7])
    torch.manual_seed(11)
    cos, sin = ours.cos_sin(ours.coords(5, 7))
    tol = _table_tol(1.5 * 1.2 * 1.5, extra=3)
    assert (emb[:, 64:] - cos).abs().max() <= tol
    assert (emb[:, :64] - sin).abs().max() <= tol


def test_augmentation_bounds():
    rope = DINOv3Rope(16, shift=0.25, jitter=1.5, rescale=2.0)
    base = dinov3_coords(3, 4)
    gen = torch.Generator().manual_seed(3)
    factors = []
    for _ in range(300):
        moved = rope.augment(base, generator=gen)
        # one affine map for every patch: moved = (base + s) * j * r, per axis
        scale = (moved[1:] - moved[:1]) / (base[1:] - base[:1])
        for axis in (0, 1):
            column = scale[:, axis][(base[1:, axis] - base[0, axis]).abs() > 0]
            assert (column - column[0]).abs().max() <= 1e-12
            factor = float(column[0])
            shift = float(moved[0, axis] / factor - base[0, axis])
            factors.append(factor)
            assert abs(shift) <= 0.25 * (1 + 1e-6)
            assert 1 / (1.5 * 2.0) * (1 - 1e-6) <= factor <= 1.5 * 2.0 * (1 + 1e-6)
    assert min(factors) < 0.5 and max(factors) > 2.0  # the draws span the range
    assert torch.equal(rope.eval().coords(3, 4), base)  # eval: no augmentation


@pytest.mark.parametrize("normalize", ["separate", "max", "min"])
@pytest.mark.parametrize(
    "schedule", [{"base": 100.0}, {"base": None, "min_period": 0.5, "max_period": 40.0}]
)
def test_eval_tables_equal_timms(timm_sincos, normalize, schedule):
    timm_schedule = (
        {"temperature": schedule["base"]}
        if schedule["base"] is not None
        else {"temperature": None, "min_period": 0.5, "max_period": 40.0}
    )
    ref = timm_sincos.RotaryEmbeddingDinoV3(32, normalize_coords=normalize, **timm_schedule).eval()
    ours = DINOv3Rope(32, normalize_coords=normalize, **schedule).eval()
    emb = ref.get_embed([4, 9])  # (n, 2 * 32): sin, then cos
    cos, sin = ours.cos_sin(ours.coords(4, 9))
    # periods from 0.5: frequencies up to 2 (not 1), twice the angle bound
    tol = _table_tol(1.0 if schedule["base"] else 2.0)
    assert (emb[:, 32:] - cos).abs().max() <= tol
    assert (emb[:, :32] - sin).abs().max() <= tol
    assert (ours.periods - ref.periods).abs().max() <= 3 * F32 * float(ref.periods.max())


def test_float64_formula():
    rope = DINOv3Rope(32, base=None, min_period=0.25, max_period=8.0)
    coords = torch.tensor([[0.3, -0.9], [1.7, 2.5], [-0.01, 0.0]], dtype=torch.float64)
    cos, sin = rope.cos_sin(coords, dtype=torch.float64)
    periods = 0.25 * 32.0 ** (torch.arange(8, dtype=torch.float64) / 7)
    theta = (2 * math.pi * coords[:, :, None] / periods).flatten(1)  # rows, then columns
    theta = torch.cat([theta, theta], dim=-1)
    # float64 formula within |theta| * 4 * 2**-53 (theta <= 63): well below 1e-13
    assert torch.allclose(cos, theta.cos(), rtol=0, atol=1e-13)
    assert torch.allclose(sin, theta.sin(), rtol=0, atol=1e-13)


def test_near_misses_fail_at_the_tolerance():
    ref = _hf(64).eval()
    cos_ref, _ = ref(_pixels(6, 10))
    tol = _table_tol(1.0)
    rope = DINOv3Rope(64).eval()
    coords = rope.coords(6, 10)
    assert (rope.cos_sin(coords)[0] - cos_ref).abs().max() <= tol
    swapped = coords.flip(-1)  # (column, row): the axes the other way round
    assert (rope.cos_sin(swapped)[0] - cos_ref).abs().max() > 100 * tol
    off = DINOv3Rope(64, base=100.1).eval()  # base off by 0.1%
    assert (off.cos_sin(coords)[0] - cos_ref).abs().max() > tol
    other = DINOv3Rope(64, normalize_coords="max").eval()  # 6 x 10: rows / 10
    assert (other.cos_sin(other.coords(6, 10))[0] - cos_ref).abs().max() > 100 * tol


def test_gradcheck_float64():
    rope = DINOv3Rope(8, 2)
    coords = dinov3_coords(2, 2)
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k: rope(q, k, coords), (q, k))
    freqs = dinov3_frequencies(8)
    assert torch.autograd.gradcheck(
        lambda q: posenc.apply_rotary(q, *dinov3_cos_sin(coords, freqs, dtype=torch.float64)),
        (q[:, :, 1:].detach().requires_grad_(),),
    )


def test_state_dicts_of_the_references_load(timm_sincos):
    rope = DINOv3Rope(64, 6)
    assert rope.state_dict() == {}  # inv_freq and periods are derived, not state
    rope.load_state_dict(_hf(64, 6).state_dict())
    rope.load_state_dict(timm_sincos.RotaryEmbeddingDinoV3(64).state_dict())
    ref = _hf(64, 6)
    assert (rope.inv_freq - ref.inv_freq).abs().max() <= 3 * F32
    assert torch.equal(rope.half().inv_freq, rope.float().inv_freq)  # rebuilt in float32


def test_a_dinov3_checkpoints_periods_are_checked_and_dropped():
    # facebookresearch/dinov3 keeps periods as a persistent buffer, in bfloat16 in its
    # released weights: base 100 at head_dim 64 is base ** (4k / 64), within bfloat16's ulp
    periods = (100.0 ** (torch.arange(16, dtype=torch.float64) / 16)).to(torch.bfloat16)
    rope = DINOv3Rope(64, 6)
    rope.load_state_dict({"periods": periods})
    assert rope.state_dict() == {}
    with pytest.raises(ValueError, match="base or min_period"):
        DINOv3Rope(64, 6, base=200.0).load_state_dict({"periods": periods})
    outer = torch.nn.ModuleDict({"rope_embed": DINOv3Rope(64, 6)})
    outer.load_state_dict({"rope_embed.periods": periods})


@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_its_rotation_equals_float64_softmax(causal):
    torch.manual_seed(4)
    rope = DINOv3Rope(32, 2).eval()
    coords = torch.cat([torch.zeros(2, 2, dtype=torch.float64), rope.coords(4, 4)])
    q, k, v = torch.randn(3, 1, 2, 18, 32)
    out = posenc.attention(q, k, v, rotary=rope.rotation(coords), causal=causal)
    periods = 100.0 ** (torch.arange(8, dtype=torch.float64) / 8)
    theta = (2 * math.pi * coords[:, :, None] / periods).flatten(1)
    c, s = torch.cat([theta, theta], -1).cos(), torch.cat([theta, theta], -1).sin()

    def rotate(x):
        x = x.double()
        half = torch.cat([-x[..., 16:], x[..., :16]], dim=-1)
        return x * c + half * s

    scores = rotate(q) @ rotate(k).transpose(-1, -2) / math.sqrt(32)
    if causal:
        scores = scores.masked_fill(torch.ones(18, 18, dtype=torch.bool).triu(1), float("-inf"))
    want = scores.softmax(-1) @ v.double()
    # float32: each rotated entry within 2 |x| * 5 * 2**-24, each score a 32-term dot
    # product of entries below 5 (32 * 25 * 2**-24 * 2), scaled by 1/sqrt(32); softmax
    # and the average of values add a few ulps of max|v|
    score_err = (2 * 5 * 2 * 5 * 5 * F32 * 32 + 32 * 25 * 2 * F32) / math.sqrt(32)
    tol = float(v.abs().max()) * (2 * score_err + 8 * F32)
    assert (out.double() - want).abs().max() <= tol


def test_rotation_reads_coords_at_positions_per_row():
    rope = DINOv3Rope(16, 2).eval()
    coords = rope.coords(3, 3)
    q = torch.randn(2, 2, 4, 16)
    positions = torch.tensor([[0, 1, 2, 3], [8, 7, 6, 5]])
    (got,) = rope.rotation(coords).rotate([q], positions)
    for row in range(2):
        want, _ = rope(q[row : row + 1], q[row : row + 1], coords[positions[row]])
        assert torch.equal(got[row : row + 1], want)


def test_errors():
    with pytest.raises(ValueError, match="either base or both"):
        DINOv3Rope(64, base=100.0, min_period=1.0, max_period=10.0)
    with pytest.raises(ValueError, match="either base or both"):
        DINOv3Rope(64, base=None)
    with pytest.raises(ValueError, match="either base or both"):
        DINOv3Rope(64, base=None, min_period=1.0)
    with pytest.raises(ValueError, match="multiple of 4"):
        DINOv3Rope(66)
    with pytest.raises(ValueError, match="jitter"):
        DINOv3Rope(64, jitter=0.5)
    with pytest.raises(ValueError, match="shift"):
        DINOv3Rope(64, shift=-0.1)
    with pytest.raises(ValueError, match="normalize_coords"):
        DINOv3Rope(64, normalize_coords="both")
    rope = DINOv3Rope(16, 2)
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(ValueError, match="heads=2"):
        rope(torch.randn(1, 3, 4, 16), torch.randn(1, 3, 4, 16), rope.coords(2, 2))
    with pytest.raises(ValueError, match="only 4 tokens"):
        rope(q, q, rope.coords(3, 2))
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        rope(q, q, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="finite"):
        rope(q, q, torch.full((4, 2), float("inf")))
    with pytest.raises(ValueError, match="height"):
        rope.coords(0, 3)
