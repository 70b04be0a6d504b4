"""RIFLEx (posenc.rotary.multiaxis.riflex, intrinsic_frequency) against its references.

diffusers (0.42.1, the installed reference) does not carry RIFLEx: its source has no
``riflex``, ``L_test`` or intrinsic-frequency code. So the modified frequencies are
compared with a float64 formula written from thu-ml/RIFLEx ``riflex_utils.py`` (commit
18e0bc34): ``get_1d_rotary_pos_embed_riflex`` sets ``freqs[k-1] = 0.9 * 2 * pi / L_test``
(1-based ``k``) on diffusers' ``1 / theta ** (arange(0, dim, 2) / dim)``, and
``identify_k(b, d, N)`` picks the component whose ``round(2 pi / theta_j)`` is nearest
``N``, the first index on a tie. The reference's own float32 arithmetic is reproduced too.

diffusers is the reference for what RIFLEx modifies: the time axis of HunyuanVideo
(``HunyuanVideoRotaryPosEmbed``), Wan 2.1 (``WanRotaryPosEmbed``) and CogVideoX
(``get_3d_rotary_pos_embed``), their dims and thetas read from diffusers' defaults.

Tolerances, with u = 2**-24 (float32) and e = 2**-53 (float64), for tables of angles up
to A = max t * omega. A reference computes ``omega = 1 / theta ** (2j / d)`` with the
exponent rounded (u relative, which ``theta **`` turns into ``ln(theta) * u``), the power
within 1 ulp (2u) and the reciprocal (u): omega within ``(ln(theta) + 3) u`` relative.
The product ``t * omega`` adds u relative and cos/sin 2u, so a float32 reference is within
``(ln(theta) + 4) u A + 2u`` of the truth; one that computes in float64 and rounds to
float32 within ``u + (ln(theta) + 4) e A``, and a float64 formula within
``(ln(theta) + 4) e A + 2e``. posenc's float64 tables are exact, rounded once (e).
"""

from __future__ import annotations

import decimal
import inspect
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import anchor

torch = anchor("torch")

from posenc.rotary.multiaxis import (  # noqa: E402
    axial_cos_sin,
    axial_grid,
    intrinsic_frequency,
    riflex,
)
from posenc.rotary.schedules import RopeFrequencies, frequencies  # noqa: E402

import posenc  # noqa: E402

U, E = 2.0**-24, 2.0**-53
FRAMES = 132  # past every test length below (HunyuanVideo's 66 x 2)


def _default(fn, name):
    return inspect.signature(fn).parameters[name].default


@pytest.fixture(scope="module")
def models():
    """Each model's time axis from diffusers' defaults: (dim, theta, table function)."""
    hunyuan = anchor("diffusers.models.transformers.transformer_hunyuan_video")
    wan = anchor("diffusers.models.transformers.transformer_wan")
    emb = anchor("diffusers.models.embeddings")
    cog = anchor("diffusers.models.transformers.cogvideox_transformer_3d")

    init = hunyuan.HunyuanVideoTransformer3DModel.__init__
    h_dims, h_theta = list(_default(init, "rope_axes_dim")), _default(init, "rope_theta")

    def hunyuan_table(t):
        rope = hunyuan.HunyuanVideoRotaryPosEmbed(1, 1, h_dims, h_theta)
        cos, sin = rope(torch.zeros(1, 1, t, 1, 1))
        return cos[:, : h_dims[0]], sin[:, : h_dims[0]]

    w_head = _default(wan.WanTransformer3DModel.__init__, "attention_head_dim")
    w_theta = _default(wan.WanRotaryPosEmbed.__init__, "theta")
    w_dim = wan.WanRotaryPosEmbed(w_head, (1, 1, 1), 1).t_dim

    def wan_table(t):
        cos, sin = wan.WanRotaryPosEmbed(w_head, (1, 1, 1), t)(torch.zeros(1, 1, t, 1, 1))
        return cos[0, :, 0, :w_dim], sin[0, :, 0, :w_dim]

    c_head = _default(cog.CogVideoXTransformer3DModel.__init__, "attention_head_dim")
    c_theta = _default(emb.get_3d_rotary_pos_embed, "theta")
    c_dim = c_head // 4  # get_3d_rotary_pos_embed: dim_t = embed_dim // 4

    def cog_table(t):
        cos, sin = emb.get_3d_rotary_pos_embed(c_head, ((0, 0), (1, 1)), (1, 1), t)
        return cos[:, :c_dim], sin[:, :c_dim]

    return {
        "HunyuanVideo": (h_dims[0], float(h_theta), hunyuan_table),
        "Wan2.1": (w_dim, float(w_theta), wan_table),
        "CogVideoX": (c_dim, float(c_theta), cog_table),
    }


def test_the_time_axes_read_from_diffusers(models):
    # the time axes RIFLEx's scripts and the community's Wan ports work on
    dims = {name: (d, theta) for name, (d, theta, _) in models.items()}
    assert dims == {
        "HunyuanVideo": (16, 256.0),
        "Wan2.1": (44, 10000.0),
        "CogVideoX": (16, 10000.0),
    }


def _table(freqs, frames=FRAMES, dtype=torch.float64):
    return axial_cos_sin(torch.arange(frames)[:, None], freqs, dtype=dtype)


def _bound(freqs, frames, theta, *, float32_angles):
    angle = (frames - 1) * float(freqs.inv_freq.max())
    per_angle = math.log(theta) + 4
    return per_angle * U * angle + 2 * U if float32_angles else U + per_angle * E * angle


def _error(got, want):
    return max(float((g - w.double()).abs().max()) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("name", ["HunyuanVideo", "Wan2.1", "CogVideoX"])
def test_the_time_axis_matches_diffusers(models, name):
    dim, theta, table = models[name]
    want = table(FRAMES)
    assert want[0].dtype == torch.float32
    time = frequencies("default", dim, theta)
    # Wan computes its table in float64 and rounds it once; the others in float32
    bound = _bound(time, FRAMES, theta, float32_angles=name != "Wan2.1")
    assert _error(_table(time), want) <= bound
    # near miss: the base 0.1 % off is seen at this bound
    assert _error(_table(frequencies("default", dim, theta * 1.001)), want) > 10 * bound


def _reference_f64(dim, theta, k, test_frames):
    """``get_1d_rotary_pos_embed_riflex``'s frequencies, in float64."""
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64)[: dim // 2] / dim)
    freqs[k - 1] = 0.9 * 2 * math.pi / test_frames
    return freqs


def _reference_table_f64(freqs, frames=FRAMES):
    angles = np.outer(np.arange(frames, dtype=np.float64), freqs)
    return torch.from_numpy(np.cos(angles).repeat(2, 1)), torch.from_numpy(
        np.sin(angles).repeat(2, 1)
    )


def _reference_table_f32(dim, theta, k, test_frames, frames=FRAMES):
    """The reference as it runs: float32 frequencies, positions, products and tables."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    freqs[k - 1] = 0.9 * 2 * torch.pi / test_frames
    angles = torch.outer(torch.arange(frames, dtype=torch.float32), freqs)
    return angles.cos().repeat_interleave(2, 1), angles.sin().repeat_interleave(2, 1)


#: (model, k, L_test): the reference's scripts (HunyuanVideo --k 4 at 261 frames, L_test 66;
#: CogVideoX --k 2 at 97 frames, L_test 25) and Wan 2.1's k = 6 (alibaba-pai VideoX-Fun's
#: and Wan2GP's riflex_k) at 3 x 21 latent frames
CASES = [("HunyuanVideo", 4, 66), ("CogVideoX", 2, 25), ("Wan2.1", 6, 63)]


@pytest.mark.parametrize(("name", "k", "test_frames"), CASES)
def test_riflex_matches_the_reference_formula(models, name, k, test_frames):
    dim, theta, _ = models[name]
    time = frequencies("default", dim, theta)
    got = riflex(time, k, test_frames)
    want = _reference_f64(dim, theta, k, test_frames)
    # omega: posenc's rounded once (e), the formula's within (ln(theta) + 3) e relative
    np.testing.assert_allclose(got.inv_freq, want, rtol=(math.log(theta) + 4) * E, atol=0)
    assert got.attention_scaling == time.attention_scaling
    bound = (math.log(theta) + 4) * E * (FRAMES - 1) * float(want.max()) + 3 * E
    assert _error(_table(got), _reference_table_f64(want)) <= bound
    # the reference's own float32 arithmetic, at the float32 bound
    want32 = _reference_table_f32(dim, theta, k, test_frames)
    bound32 = _bound(got, FRAMES, theta, float32_angles=True)
    assert _error(_table(got), want32) <= bound32
    # near miss: k off by one, either way, fails at both bounds
    for wrong in (k - 1, k + 1):
        assert _error(_table(riflex(time, wrong, test_frames)), want32) > 100 * bound32


@pytest.mark.parametrize(("name", "k", "test_frames"), CASES)
def test_riflex_lowers_only_the_intrinsic_period_past_the_test_length(models, name, k, test_frames):
    dim, theta, _ = models[name]
    time = frequencies("default", dim, theta)
    got = riflex(time, k, test_frames)
    changed = np.flatnonzero(got.inv_freq != time.inv_freq)
    assert changed.tolist() == [k - 1]
    period = 2 * math.pi / got.inv_freq[k - 1]
    assert period == pytest.approx(test_frames / 0.9, rel=4 * E)
    assert 2 * math.pi / time.inv_freq[k - 1] < test_frames < period  # was inside, now past


def test_hunyuan_video_riflex_grid_matches_the_reference_rope(models):
    """The reference's HunyuanVideoRotaryPosEmbedRifleX: RIFLEx on time, diffusers on h, w."""
    hunyuan = anchor("diffusers.models.transformers.transformer_hunyuan_video")
    dim, theta, _ = models["HunyuanVideo"]
    dims = list(_default(hunyuan.HunyuanVideoTransformer3DModel.__init__, "rope_axes_dim"))
    frames, h, w, k, test_frames = 70, 3, 2, 4, 66
    cos, sin = hunyuan.HunyuanVideoRotaryPosEmbed(1, 1, dims, theta)(
        torch.zeros(1, 1, frames, h, w)
    )
    t_cos, t_sin = _reference_table_f32(dim, theta, k, test_frames, frames)
    rows = torch.arange(frames).repeat_interleave(h * w)  # (t, h, w) order, flattened
    want = (
        torch.cat([t_cos[rows], cos[:, dim:]], 1),
        torch.cat([t_sin[rows], sin[:, dim:]], 1),
    )
    per_axis = [riflex(frequencies("default", dim, theta), k, test_frames)]
    per_axis += [frequencies("default", d, theta) for d in dims[1:]]
    coords = axial_grid(frames, h, w).flatten(0, 2)
    got = axial_cos_sin(coords, per_axis, dtype=torch.float64)
    # every block is a float32 table of angles up to (frames - 1) * 1 (omega_0 = 1)
    assert _error(got, want) <= (math.log(theta) + 4) * U * (frames - 1) + 2 * U


def _identify_k(b, d, n):
    """thu-ml/RIFLEx ``identify_k``, in float64 (1-based k, first index on a tie)."""
    periods = [round(2 * math.pi / (1.0 / b ** (2 * (j - 1) / d))) for j in range(1, d // 2 + 1)]
    gaps = [abs(p - n) for p in periods]
    return gaps.index(min(gaps)) + 1


@pytest.mark.parametrize("name", ["HunyuanVideo", "Wan2.1", "CogVideoX"])
def test_intrinsic_frequency_is_identify_k_for_every_frame(models, name):
    dim, theta, _ = models[name]
    time = frequencies("default", dim, theta)
    got = [intrinsic_frequency(time, n) for n in range(1, 400)]
    assert got == [_identify_k(theta, dim, n) for n in range(1, 400)]
    # near miss: periods truncated instead of rounded pick another k for some frames
    periods = [int(2 * math.pi / w) for w in time.inv_freq]
    truncated = [
        min(range(len(periods)), key=lambda j: abs(periods[j] - n)) + 1 for n in range(1, 400)
    ]
    assert truncated != got


def test_the_index_rule_on_the_models():
    # HunyuanVideo: identify_k's own example (b=256, d=16, N=48 -> k 4, N_k 50), the
    # repository's --k 4 --N_k 50; the component nearest its 33 trained frames is 3
    hunyuan = frequencies("default", 16, 256.0)
    assert intrinsic_frequency(hunyuan, 48) == 4
    assert round(2 * math.pi / hunyuan.inv_freq[3]) == 50
    assert intrinsic_frequency(hunyuan, 33) == 3
    # CogVideoX: --k 2 --N_k 20 (13 latent frames trained: 6 and 20 tie, the first wins)
    cog = frequencies("default", 16, 10000.0)
    assert round(2 * math.pi / cog.inv_freq[1]) == 20
    assert [intrinsic_frequency(cog, n) for n in (13, 14, 41, 42)] == [1, 2, 2, 3]
    # Wan 2.1: k = 6 has period 51 (43 to 64 pick it)
    wan = frequencies("default", 44, 10000.0)
    assert round(2 * math.pi / wan.inv_freq[5]) == 51
    assert [intrinsic_frequency(wan, n) for n in (42, 43, 64, 65)] == [5, 6, 6, 7]


def test_a_component_that_never_turns_has_no_period():
    freqs = RopeFrequencies((decimal.Decimal(0), decimal.Decimal("0.5")))
    assert intrinsic_frequency(freqs, 1000) == 2
    with pytest.raises(ValueError, match="no component that turns"):
        intrinsic_frequency(RopeFrequencies((decimal.Decimal(0),)), 10)


@settings(max_examples=60, deadline=None)
@given(
    pairs=st.integers(1, 32),
    base=st.floats(2.0, 1e6),
    data=st.data(),
    test_frames=st.integers(1, 10_000),
    margin=st.floats(0.05, 1.0),
)
def test_the_test_length_fits_in_the_new_period(pairs, base, data, test_frames, margin):
    time = frequencies("default", 2 * pairs, base)
    k = data.draw(st.integers(1, pairs))
    got = riflex(time, k, test_frames, margin=margin)
    # the last frame turns margin (<= 1) turns; 1e-15 covers Decimal(math.pi)'s error
    turns = test_frames * got.omega[k - 1] / (2 * decimal.Decimal(math.pi))
    assert abs(turns - decimal.Decimal(margin)) < decimal.Decimal(10) ** -15
    assert 2 * math.pi / got.inv_freq[k - 1] >= test_frames * (1 - 4 * E)
    others = [j for j in range(pairs) if j != k - 1]
    kept = [w for j, w in enumerate(got.omega) if j != k - 1]
    assert kept == [time.omega[j] for j in others]


def test_rotating_with_riflex_tables_passes_gradcheck():
    time = riflex(frequencies("default", 16, 256.0), 4, 66)
    cos, sin = _table(time, 8)
    x = torch.randn(1, 1, 8, 16, dtype=torch.float64, requires_grad=True)
    rotate = lambda x: posenc.apply_rotary(x, cos, sin, layout="interleaved")  # noqa: E731
    assert torch.autograd.gradcheck(rotate, (x,))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda f: riflex([1.0, 0.5], 1, 10), TypeError, "freqs must be a RopeFrequencies"),
        (lambda f: riflex(RopeFrequencies(()), 1, 10), ValueError, "at least one frequency"),
        (lambda f: riflex(f, 0, 10), ValueError, "k must be an int >= 1"),
        (lambda f: riflex(f, 9, 10), ValueError, "from 1 to 8"),
        (lambda f: riflex(f, 2.0, 10), TypeError, "k must be an int"),
        (lambda f: riflex(f, True, 10), TypeError, "k must be an int"),
        (lambda f: riflex(f, 4, 0), ValueError, "test_frames must be an int >= 1"),
        (lambda f: riflex(f, 4, 66.5), TypeError, "test_frames must be an int"),
        (lambda f: riflex(f, 4, 66, margin=0.0), ValueError, "margin must be > 0"),
        (lambda f: riflex(f, 4, 66, margin=1.5), ValueError, r"margin must be in \(0, 1\]"),
        (lambda f: riflex(f, 4, 66, margin=math.nan), ValueError, "margin must be finite"),
        (lambda f: riflex(f, 4, 66, margin="0.9"), TypeError, "margin must be a real"),
        (lambda f: intrinsic_frequency(f, 0), ValueError, "repeat_frame must be an int >= 1"),
        (lambda f: intrinsic_frequency(f, 48.0), TypeError, "repeat_frame must be an int"),
        (lambda f: intrinsic_frequency(None, 48), TypeError, "freqs must be a RopeFrequencies"),
    ],
)
def test_bad_input_is_refused_by_name(call, error, match):
    with pytest.raises(error, match=match):
        call(frequencies("default", 16, 256.0))
