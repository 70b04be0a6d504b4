"""NeRF positional encoding and random Fourier features against their formulas and mpmath.

Neither reference is pip-installable (NeRF's ``run_nerf_helpers.py``, Tancik et al.'s
notebook), so each is transcribed below from its published formula, in float32
torch as the originals compute, and the truth comes from mpmath.

Tolerances: NeRF's float32 ``x * 2**j`` is exact (a power of two), so the float32
reference only adds float32 ``sin``/``cos`` and rounding (< 1e-6). Multiplying by
``pi`` or rounding a linear-sampling frequency adds ``|theta| * 2**-24`` per rounding.
float64 results from posenc are held to 1e-12 of mpmath at angles of 1e9 radians.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.families.absolute import fourier as fourier_module
from posenc.families.absolute.fourier import (
    fourier_features,
    gaussian_fourier_features,
    gaussian_fourier_matrix,
    nerf,
    nerf_frequencies,
)

mpmath.mp.dps = 40
F32 = 2.0**-24


def nerf_truth(x, num_freqs, *, pi=False, log_sampling=True, include_input=True):
    """NeRF's gamma(x) in mpmath, from the formula (exact frequencies)."""
    x = np.asarray(x, dtype=np.float64)
    top = num_freqs - 1
    if log_sampling:
        freqs = [mpmath.mpf(2) ** j for j in range(num_freqs)]
    else:
        step = mpmath.mpf(2**top - 1) / top if top else 0
        freqs = [1 + j * step for j in range(num_freqs)]
    if pi:
        freqs = [f * mpmath.pi for f in freqs]
    flat = x.reshape(-1, x.shape[-1])
    rows = []
    for point in flat:
        row = list(point) if include_input else []
        for f in freqs:
            angles = [mpmath.mpf(float(v)) * f for v in point]
            row += [float(mpmath.sin(a)) for a in angles]
            row += [float(mpmath.cos(a)) for a in angles]
        rows.append(row)
    return np.array(rows).reshape((*x.shape[:-1], -1))


def nerf_reference_float32(x, num_freqs, *, pi=False, log_sampling=True):
    """NeRF run_nerf_helpers.py Embedder (include_input, sin and cos), float32 torch.

    The formula of the reference Embedder (bands 2**linspace(0, L - 1, L), or linspace of
    2**0 to 2**(L - 1) without log sampling), written out; ``pi`` as tiny-cuda-nn.
    """
    x = torch.as_tensor(x, dtype=torch.float32)
    top = num_freqs - 1
    if log_sampling:
        bands = 2.0 ** torch.linspace(0.0, top, steps=num_freqs)
    else:
        bands = torch.linspace(2.0**0.0, 2.0**top, steps=num_freqs)
    if pi:
        bands = bands * math.pi
    out = [x]
    for f in bands:
        out += [torch.sin(x * f), torch.cos(x * f)]
    return torch.cat(out, -1).numpy()


def points(n, scale, seed, c=3):
    return np.random.default_rng(seed).uniform(-scale, scale, (n, c))


# ------------------------------------------------------------------ NeRF


def test_nerf_channel_counts():
    x = np.zeros((4, 3))
    assert nerf(x).shape == (4, 63)  # the NeRF position encoding, L = 10
    assert nerf(x, 4).shape == (4, 27)  # the NeRF view-direction encoding
    assert nerf(x, include_input=False).shape == (4, 60)
    assert nerf(np.zeros((2, 5, 3)), 6).shape == (2, 5, 39)
    assert nerf(np.zeros(3), 2).shape == (15,)
    np.testing.assert_array_equal(nerf(points(4, 1.0, 0), 0), points(4, 1.0, 0))


@pytest.mark.parametrize("log_sampling", [True, False])
@pytest.mark.parametrize("pi", [False, True])
@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_nerf_matches_the_reference_formula(scale, pi, log_sampling):
    x = points(20, scale, 1).astype(np.float32)
    ours = nerf(x, 10, pi=pi, log_sampling=log_sampling)
    assert ours.dtype == np.float32
    reference = nerf_reference_float32(x, 10, pi=pi, log_sampling=log_sampling)
    truth = nerf_truth(x, 10, pi=pi, log_sampling=log_sampling)
    # per-channel angle bound |x| * f_j: the reference's roundings are relative to it
    freqs = nerf_frequencies(10, pi=pi, log_sampling=log_sampling)
    theta = np.concatenate([np.abs(x)] + [np.abs(x) * f for f in freqs for _ in (0, 1)], axis=-1)
    # float32 roundings in the reference's angle: none for x * 2**j (exact); pi rounded
    # and f * pi rounded: 2; linspace's step, i * step and 1 + i * step: 3; then x * f: 1
    roundings = 0 if log_sampling and not pi else 2 * pi + 3 * (not log_sampling) + 1
    tol = theta * roundings * F32 + 1e-6
    assert (np.abs(ours - reference) <= tol).all()
    assert np.abs(ours - truth).max() <= max(np.abs(reference - truth).max(), 2.0**-25 + 1e-12)
    np.testing.assert_array_equal(ours[:, :3], x)  # the input passes through untouched


@pytest.mark.parametrize("pi", [False, True])
def test_nerf_exact_at_large_coordinates(pi):
    # |x| up to 1e6 with 2**9 pi: angles of 1.6e9 radians
    x = points(12, 1e6, 2)
    truth = nerf_truth(x, 10, pi=pi)
    ours64 = nerf(x, 10, pi=pi)
    assert ours64.dtype == np.float64
    assert np.abs(ours64 - truth).max() < 1e-12
    ours32 = nerf(x, 10, pi=pi, dtype=np.float32)
    ours_err = np.abs(ours32[:, 3:] - truth[:, 3:]).max()
    assert ours_err <= 2.0**-25 + 1e-12
    # the float32 reference at these coordinates: x rounds to float32 first, and pi
    # adds |theta| * 2**-24 on top; posenc keeps the float value of x as given
    reference_err = np.abs(nerf_reference_float32(x, 10, pi=pi)[:, 3:] - truth[:, 3:]).max()
    assert reference_err > 0.1 > ours_err


def test_nerf_frequencies():
    np.testing.assert_array_equal(nerf_frequencies(4), [1.0, 2.0, 4.0, 8.0])
    np.testing.assert_allclose(nerf_frequencies(3, pi=True), [np.pi, 2 * np.pi, 4 * np.pi])
    np.testing.assert_allclose(nerf_frequencies(4, log_sampling=False), [1, 10 / 3, 17 / 3, 8])
    np.testing.assert_array_equal(nerf_frequencies(1, log_sampling=False), [1.0])


def test_nerf_torch_stays_torch():
    x = points(6, 3.0, 3)
    ref = nerf(x, 8)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = torch.from_numpy(x).to(dtype)
        out = nerf(t, 8)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device == t.device
        exact = nerf(t.double().numpy(), 8)  # the same coordinates, float64 numpy
        torch.testing.assert_close(out, torch.from_numpy(exact).to(dtype), atol=0, rtol=0)
    out = nerf(torch.from_numpy(x), 8, dtype=torch.float64)
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-15, rtol=0)
    ints = nerf(torch.arange(6).reshape(2, 3), 2)
    assert ints.dtype == torch.float32
    assert nerf(np.arange(6).reshape(2, 3), 2).dtype == np.float32


def test_nerf_bands_are_octaves():
    # sin(2a) = 2 sin(a) cos(a): each band is the double angle of the previous one
    x = points(50, 10.0, 4)
    out = nerf(x, 6, include_input=False).reshape(50, 6, 2, 3)
    s, c = out[:, :, 0], out[:, :, 1]
    np.testing.assert_allclose(s[:, 1:], 2 * s[:, :-1] * c[:, :-1], atol=1e-12)
    np.testing.assert_allclose(s**2 + c**2, 1.0, atol=1e-12)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((np.float64(1.0),), {}, ValueError, r"x must have shape \(\.\.\., C\)"),
        ((np.array([[np.nan, 0.0]]),), {}, ValueError, r"x must be finite"),
        ((np.array([[2.0**31]]),), {}, ValueError, r"x must lie in \(-2\*\*31, 2\*\*31\)"),
        ((np.array([["a"]]),), {}, TypeError, r"x must be an array or tensor"),
        ((np.zeros((2, 3)), -1), {}, ValueError, r"num_freqs must be an int >= 0"),
        ((np.zeros((2, 3)), 2.0), {}, TypeError, r"num_freqs must be an int"),
        ((np.zeros((2, 3)), 0), {"include_input": False}, ValueError, r"no channels"),
        ((np.zeros((2, 3)),), {"pi": 1}, TypeError, r"pi must be a bool"),
        ((np.zeros((2, 3)),), {"log_sampling": None}, TypeError, r"log_sampling must be"),
        ((np.full((1, 3), 1e9), 40), {}, ValueError, r"num_freqs=40 is too many"),
        ((torch.tensor([[float("inf")]]),), {}, ValueError, r"x must be finite"),
        ((np.zeros((2, 3)),), {"dtype": "int8"}, TypeError, r"dtype must be"),
    ],
)
def test_nerf_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        nerf(*args, **kwargs)


@pytest.mark.parametrize("shape", [(0, 3), (2, 0, 3)])
def test_nerf_of_no_points_is_empty(shape):
    # no points, no rows: the band reshape cannot infer its width from zero values
    for include_input, channels in ((True, 27), (False, 24)):
        out = nerf(np.zeros(shape, np.float32), 4, include_input=include_input)
        assert out.shape == (*shape[:-1], channels) and out.dtype == np.float32
        t = nerf(torch.zeros(shape, dtype=torch.float64), 4, include_input=include_input)
        assert isinstance(t, torch.Tensor)
        assert t.shape == (*shape[:-1], channels) and t.dtype == torch.float64
    assert nerf(np.zeros(shape, np.int64), 0).shape == shape


@pytest.fixture
def no_frequencies(monkeypatch):
    """Fail any call that gets as far as computing NeRF bands or reading x: sizes first."""

    def refuse(*args, **kwargs):
        raise AssertionError("work done before the size was checked")

    monkeypatch.setattr(fourier_module, "_nerf_turns", refuse)
    monkeypatch.setattr(fourier_module, "_max_abs", refuse)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: nerf(np.zeros((1, 3)), 2000), r"num_freqs must be at most 128: .* got 2000"),
        (lambda: nerf(np.zeros((1, 3)), 2**40), r"num_freqs must be at most 128"),
        (lambda: nerf(torch.zeros(1, 3), 129), r"num_freqs must be at most 128"),
        (lambda: nerf_frequencies(2000), r"num_freqs must be at most 128"),
        (
            lambda: nerf(np.broadcast_to(np.zeros(3), (2**24, 3)), 40),
            r"NeRF encoding of x \(16777216, 3\), num_freqs=40 would hold",
        ),
        (
            lambda: fourier_features(
                np.broadcast_to(np.zeros(3), (2**20, 3)), np.zeros((2**11, 3))
            ),
            r"Fourier features of x \(1048576, 3\) with B \(2048, 3\) would hold",
        ),
        (lambda: gaussian_fourier_matrix(2**40, 3), r"B \(num_features=1099511627776 x in_"),
        (lambda: gaussian_fourier_features(np.zeros((1, 3)), 2**40), r"num_features=1099511627776"),
    ],
)
def test_huge_sizes_are_refused_before_any_work(no_frequencies, call, match):
    # num_freqs=2000 used to raise OverflowError after computing 2000 exact frequencies
    with pytest.raises(ValueError, match=match):
        call()


def test_the_most_bands_stay_finite():
    # at num_freqs=128 the top band 2**127 (times pi) still fits every arithmetic
    x = np.array([[0.0], [2.0**-100]])
    for pi in (False, True):
        out = nerf(x, 128, pi=pi)
        assert out.shape == (2, 257) and np.isfinite(out).all()
        np.testing.assert_array_equal(out[0, 1::2], 0.0)  # sin 0
        np.testing.assert_array_equal(out[0, 2::2], 1.0)  # cos 0
        assert np.isfinite(nerf(torch.from_numpy(x), 128, pi=pi).numpy()).all()


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(
        st.floats(-1e5, 1e5, allow_nan=False, allow_infinity=False), min_size=3, max_size=3
    ),
    pi=st.booleans(),
)
def test_nerf_matches_mpmath_anywhere(values, pi):
    x = np.array([values])
    np.testing.assert_allclose(nerf(x, 6, pi=pi), nerf_truth(x, 6, pi=pi), atol=1e-13, rtol=0)


# ------------------------------------------------------------------ random Fourier features


def test_gaussian_matrix_is_seeded():
    b = gaussian_fourier_matrix(16, 3, sigma=10.0, seed=7)
    assert b.shape == (16, 3) and b.dtype == np.float64
    np.testing.assert_array_equal(b, gaussian_fourier_matrix(16, 3, sigma=10.0, seed=7))
    np.testing.assert_array_equal(b, 10.0 * np.random.default_rng(7).standard_normal((16, 3)))
    assert not np.array_equal(b, gaussian_fourier_matrix(16, 3, sigma=10.0, seed=8))


def tancik_float64(x, b):
    """Tancik et al. input_mapping: [sin(2 pi x B^T), cos(2 pi x B^T)], in float64."""
    proj = (2.0 * np.pi * x) @ b.T
    return np.concatenate([np.sin(proj), np.cos(proj)], axis=-1)


def fourier_truth(x, b):
    """mpmath: the exact dot product of the float64 inputs, then sin and cos."""
    x2 = x.reshape(-1, x.shape[-1])
    out = np.empty((x2.shape[0], 2 * b.shape[0]))
    for i, v in enumerate(x2):
        for j, row in enumerate(b):
            t = mpmath.fsum(
                mpmath.mpf(float(bj)) * mpmath.mpf(float(vj)) for bj, vj in zip(row, v, strict=True)
            )
            out[i, j] = float(mpmath.sinpi(2 * t))
            out[i, b.shape[0] + j] = float(mpmath.cospi(2 * t))
    return out.reshape((*x.shape[:-1], -1))


def test_fourier_features_match_the_formula():
    x = points(30, 1.0, 5, c=2)
    b = gaussian_fourier_matrix(64, 2, sigma=10.0, seed=0)
    ours = fourier_features(x, b)
    assert ours.shape == (30, 128) and ours.dtype == np.float64
    np.testing.assert_allclose(ours, tancik_float64(x, b), atol=1e-12, rtol=0)
    np.testing.assert_allclose(ours, fourier_truth(x, b), atol=1e-13, rtol=0)
    paper = fourier_features(x, b, order="cos_sin")
    np.testing.assert_array_equal(paper, np.concatenate([ours[:, 64:], ours[:, :64]], -1))
    assert fourier_features(x.astype(np.float32), b).dtype == np.float32
    np.testing.assert_array_equal(gaussian_fourier_features(x, 64, sigma=10.0, seed=0), ours)
    assert gaussian_fourier_features(np.zeros((2, 4, 3)), 5).shape == (2, 4, 10)


def test_fourier_features_exact_when_b_x_is_large():
    # |B x| ~ 1e6 turns. posenc rounds only the float64 dot product (C + 1 roundings of
    # at most |t| * 2**-53 turn each) and reduces in turns; a float32 port of
    # 2 pi x @ B.T is off by ~|2 pi t| * 2**-24, far beyond a radian.
    x = points(8, 1e5, 6)
    b = gaussian_fourier_matrix(16, 3, sigma=10.0, seed=1)
    truth = fourier_truth(x, b)
    ours = fourier_features(x, b)
    t = np.abs(x) @ np.abs(b).T
    budget = 2 * np.pi * (x.shape[1] + 1) * t.max() * 2.0**-53 + 1e-15
    assert np.abs(ours - truth).max() <= budget < 2.0**-25  # below float32 resolution
    proj32 = (2 * np.pi * x.astype(np.float32)) @ b.T.astype(np.float32)
    float32_port = np.concatenate([np.sin(proj32), np.cos(proj32)], -1)
    assert np.abs(float32_port - truth).max() > 0.1


def test_fourier_features_torch():
    x = points(10, 2.0, 7)
    b = gaussian_fourier_matrix(8, 3, seed=3)
    ref = fourier_features(x, b)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = torch.from_numpy(x).to(dtype)
        out = fourier_features(t, b)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype
        exact = fourier_features(t.double().numpy(), b)
        torch.testing.assert_close(out.double(), torch.from_numpy(exact), atol=2**-8, rtol=0)
    out = fourier_features(torch.from_numpy(x), torch.from_numpy(b))
    # torch and numpy may sum the dot product in different orders: float64 rounding only
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-13, rtol=0)
    g = gaussian_fourier_features(torch.from_numpy(x).float(), 8, seed=3, order="cos_sin")
    assert g.shape == (10, 16) and g.dtype == torch.float32


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: fourier_features(np.zeros((2, 3)), np.zeros((4, 2))), ValueError, r"B must"),
        (lambda: fourier_features(np.zeros((2, 3)), np.zeros(3)), ValueError, r"B must"),
        (
            lambda: fourier_features(np.zeros((2, 3)), np.zeros((4, 3)), order="x"),
            ValueError,
            r"order must be one of",
        ),
        (
            lambda: fourier_features(np.zeros((2, 3)), np.full((4, 3), np.nan)),
            ValueError,
            r"B must be finite",
        ),
        (lambda: gaussian_fourier_matrix(0, 3), ValueError, r"num_features must be an int >= 1"),
        (lambda: gaussian_fourier_matrix(4, 3, sigma=0.0), ValueError, r"sigma must be > 0"),
        (lambda: gaussian_fourier_matrix(4, 3, seed=-1), ValueError, r"seed must be an int"),
        (lambda: gaussian_fourier_features(np.zeros(()), 4), ValueError, r"x must have shape"),
    ],
)
def test_fourier_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
