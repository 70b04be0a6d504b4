"""posenc.sinusoidal against every anchor it claims to reproduce, and its properties.

Tolerance against an anchor that computes angles in float32 (derived per element):
the anchor forms ``x_k = -k * c`` (``c`` rounded: ``|x_k| * 2**-23`` absolute error),
``omega_k = exp(x_k)`` (one more ulp, 2**-23 relative) and ``theta = p * omega_k``
(2**-24 relative), so its angle is off by up to ``|theta| * (|x_k| * 2**-23 + 2**-22)``;
sin/cos and the final float32 rounding add < 1e-6. posenc is exact to float32
rounding, so ``|posenc - anchor|`` stays within that bound. (The cruder
``max|theta| * 2**-24 + 1e-6`` is exceeded by the anchors' own error: Whisper at
dim 384 is 9.6e-5 from the exact value where that formula allows 9.0e-5.) And
posenc is never further from the float64 truth than the anchor. Anchors computing
in float64 (DistilBERT, Marian) are held to float32 rounding alone.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from gpu_markers import no_cuda
from posenc import PRESETS, Sinusoid, shift_matrix, sinusoidal
from posenc.families.absolute import sinusoidal as sinusoidal_module
from posenc.families.absolute.sinusoidal import resolve

F32_ROUNDING = 2.0**-24  # one float32 ulp of values in [0.5, 1)


def truth(positions, dim, preset="vaswani", **overrides):
    """Float64 evaluation, independent of posenc's engine (exact to ~1e-11 here)."""
    spec = resolve(preset, **overrides)
    slots = spec.slots(dim)
    omega = spec.inv_freq(dim)
    angles = (np.asarray(positions, dtype=np.float64)[:, None] + spec.offset) * omega[None]
    s, c = np.sin(angles), np.cos(angles)
    first, second = (s, c) if spec.order == "sin_cos" else (c, s)
    out = np.zeros((angles.shape[0], dim))
    out[:, slots.first] = first[:, : slots.n_first]
    out[:, slots.second] = second[:, : slots.n_second]
    return out * spec.amplitude_for(dim), angles


def assert_matches_anchor(ours, anchor, positions, dim, preset, **overrides):
    """posenc is within the derived tolerance of the anchor and no further from the truth."""
    ours = np.asarray(ours, dtype=np.float64)
    anchor = np.asarray(anchor, dtype=np.float64)
    assert ours.shape == anchor.shape
    exact, angles = truth(positions, dim, preset, **overrides)
    spec = resolve(preset, **overrides)
    log_omega = np.abs(np.log(spec.inv_freq(dim) / spec.scale))
    tol = np.abs(angles) * (log_omega * 2.0**-23 + 2.0**-22) + 1e-6
    slots = spec.slots(dim)
    for cols, sel in (
        (slots.first, slice(0, slots.n_first)),
        (slots.second, slice(0, slots.n_second)),
    ):
        assert (np.abs(ours[:, cols] - anchor[:, cols]) <= tol[:, sel]).all()
    ours_err = np.abs(ours - exact).max()
    assert ours_err <= max(np.abs(anchor - exact).max(), F32_ROUNDING / 2 + 1e-12)


DIMS = [2, 3, 4, 5, 8, 9, 64, 127, 512]


# ---------------------------------------------------------------------------- anchors


@pytest.mark.parametrize("dim", DIMS)
def test_vaswani_is_distilbert(dim):
    from transformers.models.distilbert.modeling_distilbert import create_sinusoidal_embeddings

    n = 300
    out = torch.empty(n, dim)
    create_sinusoidal_embeddings(n, dim, out)
    assert_matches_anchor(sinusoidal(n, dim), out.numpy(), np.arange(n), dim, "vaswani")


@pytest.mark.parametrize("dim", DIMS)
def test_marian(dim):
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    n = 300
    anchor = MarianSinusoidalPositionalEmbedding(n, dim).create_weight()
    ours = sinusoidal(n, dim, preset="marian")
    assert_matches_anchor(ours, anchor.numpy(), np.arange(n), dim, "marian")


@pytest.mark.parametrize("dim", [4, 8, 64, 384, 1280])
def test_whisper(dim):
    from transformers.models.whisper.modeling_whisper import sinusoids

    n = 1500
    ours = sinusoidal(n, dim, preset="whisper")
    assert_matches_anchor(ours, sinusoids(n, dim).numpy(), np.arange(n), dim, "whisper")


@pytest.mark.parametrize("dim", [d for d in DIMS if d >= 4])
def test_fairseq_is_m2m100(dim):
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    n = 1026
    anchor = M2M100SinusoidalPositionalEmbedding.get_embedding(n, dim).numpy()
    ours = sinusoidal(n, dim, preset="fairseq")
    assert_matches_anchor(ours, anchor, np.arange(n), dim, "fairseq")


@pytest.mark.parametrize("dim", [2, 3])
def test_h_minus_one_presets_work_at_dim_2_and_3(dim):
    # fairseq and diffusers divide by h - 1 = 0 there (NaN); the only frequency is 1
    for preset in ("fairseq", "musicgen", "ddpm", "annotated-diffusion", "tensor2tensor"):
        out = sinusoidal(5, dim, preset=preset)
        assert out.shape == (5, dim)
        assert np.isfinite(out).all()
        p = np.arange(5.0)
        first, second = (np.sin(p), np.cos(p))
        if resolve(preset).order == "cos_sin":
            first, second = second, first
        np.testing.assert_allclose(out[:, 0], first, atol=1e-7)
        np.testing.assert_allclose(out[:, 1], second, atol=1e-7)
        if dim == 3:
            assert (out[:, 2] == 0).all()


@pytest.mark.parametrize("dim", [d for d in DIMS if d >= 4])
def test_musicgen(dim):
    from transformers.models.musicgen.modeling_musicgen import (
        MusicgenSinusoidalPositionalEmbedding,
    )

    n = 600
    anchor = MusicgenSinusoidalPositionalEmbedding.get_embedding(n, dim).numpy()
    ours = sinusoidal(n, dim, preset="musicgen")
    assert_matches_anchor(ours, anchor, np.arange(n), dim, "musicgen")


DIFFUSERS_CASES = [
    # (preset, overrides, diffusers kwargs)
    ("ddpm", {}, {}),
    ("ldm", {}, {"flip_sin_to_cos": True, "downscale_freq_shift": 0}),
    (
        "ddpm",
        {"flip_sin_to_cos": True, "downscale_freq_shift": 0.5, "scale": 2.5, "max_period": 500},
        {"flip_sin_to_cos": True, "downscale_freq_shift": 0.5, "scale": 2.5, "max_period": 500},
    ),
    ("annotated-diffusion", {}, {}),
]


@pytest.mark.parametrize("dim", [4, 5, 32, 320, 1281])
@pytest.mark.parametrize("case", range(len(DIFFUSERS_CASES)))
def test_diffusers_timestep_embedding(case, dim):
    from diffusers.models.embeddings import get_timestep_embedding

    preset, overrides, kwargs = DIFFUSERS_CASES[case]
    rng = np.random.default_rng(case)
    t = np.concatenate([[0.0, 1.0, 999.0], rng.uniform(0, 1000, 61)]).astype(np.float32)
    anchor = get_timestep_embedding(torch.from_numpy(t), dim, **kwargs).numpy()
    ours = sinusoidal(torch.from_numpy(t), dim, preset=preset, **overrides)
    assert isinstance(ours, torch.Tensor)
    assert_matches_anchor(ours.numpy(), anchor, t, dim, preset, **overrides)


@pytest.mark.parametrize("dim", DIMS)
def test_positional_encodings_1d(dim):
    from positional_encodings.torch_encodings import PositionalEncoding1D

    n = 700
    anchor = PositionalEncoding1D(dim)(torch.zeros(1, n, dim))[0].numpy()
    ours = sinusoidal(n, dim, preset="positional-encodings")
    assert_matches_anchor(ours, anchor, np.arange(n), dim, "positional-encodings")


@pytest.mark.parametrize("dim", [2, 8, 64, 512])
@pytest.mark.parametrize("offset", [0, 5])
def test_x_transformers_scaled_sinusoidal(dim, offset):
    from x_transformers.x_transformers import ScaledSinusoidalEmbedding

    n = 400
    module = ScaledSinusoidalEmbedding(dim)
    with torch.no_grad():
        anchor = module(torch.zeros(1, n, dim), offset=offset).numpy()
    ours = sinusoidal(n, dim, preset="x-transformers", offset=offset)
    assert_matches_anchor(ours, anchor, np.arange(n), dim, "x-transformers", offset=offset)


def tensor2tensor_oracle(length, channels, min_timescale=1.0, max_timescale=1e4, start_index=0):
    """get_timing_signal_1d as its docstring defines it (tensor2tensor is TF-only)."""
    position = np.arange(length, dtype=np.float64) + start_index
    num_timescales = channels // 2
    increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
    inv = min_timescale * np.exp(np.arange(num_timescales) * -increment)
    scaled = position[:, None] * inv[None]
    signal = np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1)
    return np.pad(signal, [[0, 0], [0, channels % 2]])


@pytest.mark.parametrize("dim", DIMS)
def test_tensor2tensor(dim):
    kwargs = {"min_timescale": 2.0, "max_timescale": 5e3, "start_index": 7}
    anchor = tensor2tensor_oracle(200, dim, **kwargs).astype(np.float32)
    ours = sinusoidal(200, dim, preset="tensor2tensor", **kwargs)
    assert_matches_anchor(ours, anchor, np.arange(200), dim, "tensor2tensor", **kwargs)


# ------------------------------------------------------------------- exactness


def test_exact_near_2_to_31():
    mpmath.mp.dps = 40
    dim = 16
    p = np.array([2**31 - 1, -(2**31) + 1, 10**7, 123456789])
    ours = sinusoidal(p, dim, dtype="float64")
    for i, pos in enumerate(p):
        for k in range(dim // 2):
            a = mpmath.mpf(int(pos)) * mpmath.power(10000, -mpmath.mpf(2 * k) / dim)
            assert abs(ours[i, 2 * k] - float(mpmath.sin(a))) < 1e-13
            assert abs(ours[i, 2 * k + 1] - float(mpmath.cos(a))) < 1e-13


def test_table_equals_positionwise_evaluation():
    for preset in PRESETS:
        for dim in (6, 7, 512):
            try:
                spec = resolve(preset)
                spec.slots(dim)
            except ValueError:
                continue
            table = sinusoidal(1000, dim, preset=preset, dtype="float64", offset=2**31 - 1000)
            direct = sinusoidal(
                np.arange(1000), dim, preset=preset, dtype="float64", offset=2**31 - 1000
            )
            assert np.abs(table - direct).max() < 1e-13


def test_paper_values():
    # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), d = 4
    expected = np.array(
        [
            [0.0, 1.0, 0.0, 1.0],
            [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
            [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
        ]
    )
    np.testing.assert_allclose(sinusoidal(3, 4), expected, rtol=0, atol=F32_ROUNDING / 2)


# ------------------------------------------------------------------ dispatch & dtypes


def test_numpy_in_numpy_out_and_torch_in_torch_out():
    assert isinstance(sinusoidal(4, 8), np.ndarray)
    assert isinstance(sinusoidal(np.arange(4), 8), np.ndarray)
    assert isinstance(sinusoidal([0, 1, 2], 8), np.ndarray)
    t = sinusoidal(torch.arange(4), 8)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    assert sinusoidal(4, 8).dtype == np.float32
    assert sinusoidal(4, 8, dtype=np.float64).dtype == np.float64
    assert sinusoidal(4, 8, dtype="float16").dtype == np.float16
    assert sinusoidal(4, 8, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert sinusoidal(torch.arange(4), 8, dtype=torch.float64).dtype == torch.float64
    np.testing.assert_array_equal(sinusoidal(torch.arange(300), 9).numpy(), sinusoidal(300, 9))


def test_bfloat16_is_rounded_once():
    exact = sinusoidal(300, 64, dtype="float64")
    got = sinusoidal(300, 64, dtype=torch.bfloat16).double().numpy()
    # one rounding to 8 bits of mantissa: half an ulp
    assert (np.abs(got - exact) <= np.abs(exact) * 2.0**-8 + 1e-30).all()


@pytest.mark.parametrize("n", [0, 1, 127, 128, 129])
def test_lengths(n):
    assert sinusoidal(n, 6).shape == (n, 6)
    assert sinusoidal(np.arange(n), 6).shape == (n, 6)


def test_negative_positions_are_offsets():
    a = sinusoidal(np.array([-5, 5]), 8, dtype="float64")
    # sin is odd, cos even
    np.testing.assert_allclose(a[0, 0::2], -a[1, 0::2], atol=1e-15)
    np.testing.assert_allclose(a[0, 1::2], a[1, 1::2], atol=1e-15)


def test_overrides_and_aliases():
    a = sinusoidal(10, 8, preset="ddpm", flip_sin_to_cos=True, downscale_freq_shift=0)
    np.testing.assert_array_equal(a, sinusoidal(10, 8, preset="ldm"))
    b = sinusoidal(10, 8, preset=Sinusoid(layout="half", order="cos_sin"))
    np.testing.assert_array_equal(b, sinusoidal(10, 8, preset="ldm"))
    c = sinusoidal(10, 8, theta=500.0)
    np.testing.assert_array_equal(c, sinusoidal(10, 8, base=500.0))
    assert posenc.PRESETS["vaswani"].anchor


@pytest.mark.parametrize("dim", [5, 320])
@pytest.mark.parametrize("shift", [0, 1])
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("preset", ["ddpm", "ldm"])
def test_diffusers_knobs_on_diffusers_layouts_are_diffusers(preset, flip, shift, dim):
    # with both knobs given, either diffusion preset is diffusers' get_timestep_embedding
    from diffusers.models.embeddings import get_timestep_embedding

    t = np.array([0.0, 1.0, 10.0, 500.0, 999.0], dtype=np.float32)
    knobs = {"flip_sin_to_cos": flip, "downscale_freq_shift": shift}
    anchor = get_timestep_embedding(torch.from_numpy(t), dim, **knobs).numpy()
    ours = sinusoidal(t, dim, preset=preset, **knobs)
    assert_matches_anchor(ours, anchor, t, dim, preset, **knobs)


@pytest.mark.parametrize(
    "knobs",
    [
        {"flip_sin_to_cos": True, "downscale_freq_shift": 0},
        {"flip_sin_to_cos": False},
        {"downscale_freq_shift": 1},
        {"downscale_freq_shift": 0, "layout": "half"},  # half, but odd dims extend
    ],
)
@pytest.mark.parametrize("preset", ["vaswani", "positional-encodings", "marian"])
def test_diffusers_knobs_are_refused_on_other_layouts(preset, knobs):
    # on the interleaved default they used to give Vaswani's layout, 2.0 away from
    # diffusers' at dim 320: the knob's name promises diffusers' layout
    alias = next(k for k in knobs if k != "layout")
    with pytest.raises(ValueError, match=rf"{alias} is diffusers' .*preset='ddpm'.*preset='ldm'"):
        sinusoidal(np.array([0.0, 999.0]), 320, preset=preset, **knobs)
    with pytest.raises(ValueError, match=alias):
        resolve(preset).replace(**knobs)


def test_diffusers_knobs_with_diffusers_layout_spelt_out():
    # layout='half', odd='zero' is diffusers' layout on any preset: then the knobs apply
    from diffusers.models.embeddings import get_timestep_embedding

    t = np.array([0.0, 3.0, 999.0], dtype=np.float32)
    knobs = {"flip_sin_to_cos": True, "downscale_freq_shift": 0}
    for dim in (6, 7):
        ours = sinusoidal(t, dim, layout="half", odd="zero", **knobs)
        np.testing.assert_array_equal(ours, sinusoidal(t, dim, preset="ldm"))
        anchor = get_timestep_embedding(torch.from_numpy(t), dim, **knobs).numpy()
        assert_matches_anchor(ours, anchor, t, dim, "ldm")


def test_knobs_that_mean_the_same_everywhere_stay_accepted():
    # max_period is the base and scale multiplies the angles on every preset
    a = sinusoidal(10, 8, max_period=500.0, scale=2.0)
    np.testing.assert_array_equal(a, sinusoidal(10, 8, base=500.0, scale=2.0))


# ---------------------------------------------------------------------------- device


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_device_gives_a_torch_tensor_there(device):
    for positions in (np.arange(300), list(range(300)), torch.arange(300)):
        got = sinusoidal(positions, 8, device=device)
        assert isinstance(got, torch.Tensor) and got.device == torch.device("cpu")
        assert torch.equal(got, sinusoidal(torch.as_tensor(positions), 8))
    table = sinusoidal(300, 8, device=device)  # an int: the table, moved there
    assert isinstance(table, torch.Tensor) and table.dtype == torch.float32
    assert torch.equal(table, torch.from_numpy(sinusoidal(300, 8)))
    for dtype in ("bfloat16", torch.float64, np.float16):
        as_torch = getattr(torch, posenc.core.checks.dtype_name(dtype))
        got = sinusoidal(300, 8, device=device, dtype=dtype)
        assert got.dtype == as_torch
        assert torch.equal(got, sinusoidal(300, 8, dtype=as_torch))  # the CPU table, cast


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, no_cuda()])]
)
def test_device_moves_there(device):
    # the table of an int, numpy or torch positions, on ``device``: computed there in
    # float64 and rounded once to float32, as on the CPU, so it equals the CPU table or,
    # where the two float64 values straddle a rounding boundary, is one float32 ulp
    # away: at most 2**-24 for values below 1. The CPU variant runs these calls in CI,
    # the CUDA one under `make gpu-check`
    cpu = sinusoidal(torch.arange(300), 8)
    for positions in (300, np.arange(300), torch.arange(300)):
        got = sinusoidal(positions, 8, device=device)
        assert got.device.type == device
        torch.testing.assert_close(got.cpu(), cpu, rtol=0, atol=2.0**-24)


@pytest.mark.parametrize(
    ("device", "error"), [("nowhere", ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_bad_device(device, error):
    with pytest.raises(error, match=r"device must be a torch\.device"):
        sinusoidal(4, 8, device=device)


# ------------------------------------------------------------------------ size limits


@pytest.fixture
def no_frequencies(monkeypatch):
    """Fail any call that gets as far as computing frequencies: sizes are checked first.

    A regression then fails at once instead of computing for minutes (2**39
    frequencies for dim 2**40) or touching gigabytes.
    """

    def refuse(*args, **kwargs):
        raise AssertionError("frequencies computed before the size was checked")

    monkeypatch.setattr(sinusoidal_module, "geometric_turns", refuse)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: sinusoidal(4, 2**40), r"dim must be at most 65536 channels; got 1099511627776"),
        (lambda: sinusoidal(np.arange(4), 65537), r"dim must be at most 65536 channels"),
        (lambda: shift_matrix(1, 2**20), r"dim must be at most 65536 channels"),
        (lambda: resolve("ldm").inv_freq(2**40), r"dim must be at most 65536 channels"),
        (
            lambda: sinusoidal(2**31 - 1, 2),
            r"encoding of 2147483647 positions x dim=2 would hold 4294967294 elements",
        ),
        (
            lambda: sinusoidal(2**27, 64, device="cpu"),
            r"encoding of 134217728 positions x dim=64 would hold",
        ),
        (lambda: shift_matrix(1, 65536), r"shift_matrix's \(dim, dim\) matrix, dim=65536"),
    ],
)
def test_huge_sizes_are_refused_before_any_work(no_frequencies, call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"positions": 4, "dim": 0}, ValueError, "dim must be an int >= 1"),
        ({"positions": 4, "dim": -3}, ValueError, "dim"),
        ({"positions": 4, "dim": 2.5}, TypeError, "dim must be an int"),
        ({"positions": 4, "dim": True}, TypeError, "dim"),
        ({"positions": np.zeros((2, 2)), "dim": 4}, ValueError, r"1-D"),
        ({"positions": np.array([0.0, np.nan]), "dim": 4}, ValueError, "finite"),
        ({"positions": np.array([np.inf]), "dim": 4}, ValueError, "finite"),
        ({"positions": torch.tensor([0.0, float("nan")]), "dim": 4}, ValueError, "finite"),
        ({"positions": np.array([2**31]), "dim": 4}, ValueError, r"2\*\*31"),
        ({"positions": torch.tensor([-(2**31)]), "dim": 4}, ValueError, r"2\*\*31"),
        ({"positions": 2**31 + 1, "dim": 4}, ValueError, r"2\*\*31"),
        ({"positions": -1, "dim": 4}, ValueError, "length"),
        ({"positions": np.array([True]), "dim": 4}, TypeError, "int or float"),
        ({"positions": torch.tensor([True]), "dim": 4}, TypeError, "int or float"),
        ({"positions": ["a"], "dim": 4}, TypeError, "int or float"),
        ({"positions": 4, "dim": 4, "preset": "nope"}, ValueError, "valid presets: vaswani"),
        ({"positions": 4, "dim": 4, "colour": 1}, ValueError, "valid overrides: layout"),
        ({"positions": 4, "dim": 4, "base": 0}, ValueError, "base must be > 0"),
        ({"positions": 4, "dim": 4, "base": -1.0}, ValueError, "base"),
        ({"positions": 4, "dim": 4, "min_timescale": 0}, ValueError, "min_timescale"),
        ({"positions": 4, "dim": 4, "layout": "zigzag"}, ValueError, "layout must be one of"),
        ({"positions": 4, "dim": 4, "odd": "drop"}, ValueError, "odd must be one of"),
        ({"positions": 4, "dim": 4, "offset": float("inf")}, ValueError, "offset"),
        ({"positions": 4, "dim": 4, "flip_sin_to_cos": 1}, TypeError, "flip_sin_to_cos"),
        ({"positions": 4, "dim": 4, "dtype": "int32"}, TypeError, "dtype must be"),
        ({"positions": 4, "dim": 4, "dtype": "bfloat16"}, TypeError, "torch"),
        ({"positions": 4, "dim": 5, "preset": "whisper"}, ValueError, "dim must be even"),
        ({"positions": 4, "dim": 8, "shift": 4}, ValueError, "denominator"),
    ],
)
def test_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        sinusoidal(**kwargs)


def test_shift_matrix_refuses_lone_channel():
    with pytest.raises(ValueError, match="lone channel"):
        shift_matrix(3, 7)
    assert shift_matrix(3, 7, odd="zero").shape == (7, 7)


# ------------------------------------------------------------------------ properties

SPECS = st.sampled_from(
    [name for name in PRESETS if name != "x-transformers"] + ["x-transformers"]
).flatmap(
    lambda name: st.tuples(
        st.just(name),
        st.integers(1, 48).map(lambda h: 2 * h)
        | st.integers(1, 48).map(lambda h: 2 * h + 1).filter(lambda d: PRESETS[name].odd == "zero"),
    )
)


@settings(max_examples=60, deadline=None)
@given(spec=SPECS, offset=st.integers(-5000, 5000), start=st.integers(-(10**6), 10**6))
def test_shift_operator_reproduces_the_table(spec, offset, start):
    name, dim = spec
    p = start + np.arange(50)
    m = shift_matrix(offset, dim, preset=name)
    shifted = sinusoidal(p, dim, preset=name, dtype="float64") @ m.T
    np.testing.assert_allclose(
        shifted, sinusoidal(p + offset, dim, preset=name, dtype="float64"), rtol=0, atol=1e-12
    )
    # and shifting back inverts it
    np.testing.assert_allclose(m @ shift_matrix(-offset, dim, preset=name), np.eye(dim), atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(half=st.integers(1, 256), start=st.integers(-(2**31) + 100, 2**31 - 100))
def test_norm_is_sqrt_half_dim(half, start):
    rows = sinusoidal(np.arange(start, start + 50), 2 * half, dtype="float64")
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), math.sqrt(half), rtol=1e-13)


@settings(max_examples=40, deadline=None)
@given(half=st.integers(1, 128), k=st.integers(-1000, 1000), start=st.integers(-(10**8), 10**8))
def test_dot_product_depends_only_on_offset(half, k, start):
    dim = 2 * half
    p = start + np.arange(40)
    a = sinusoidal(p, dim, dtype="float64")
    b = sinusoidal(p + k, dim, dtype="float64")
    closed_form = np.cos(k * resolve("vaswani").inv_freq(dim)).sum()
    np.testing.assert_allclose((a * b).sum(axis=1), closed_form, rtol=0, atol=1e-11 * half)


@settings(max_examples=30, deadline=None)
@given(spec=SPECS, n=st.integers(0, 400))
def test_torch_and_numpy_agree(spec, n):
    name, dim = spec
    t = sinusoidal(torch.arange(n), dim, preset=name).numpy()
    np.testing.assert_array_equal(t, sinusoidal(n, dim, preset=name))


def test_inv_freq_matches_formula():
    spec = resolve("vaswani")
    np.testing.assert_allclose(
        spec.inv_freq(512), 1.0 / 10000 ** (np.arange(0, 512, 2) / 512), rtol=1e-15
    )
