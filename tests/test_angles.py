"""The exact angle engine against mpmath truth, in every arithmetic it offers."""

from __future__ import annotations

import decimal
import subprocess
import sys

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.core import angles as _angles
from posenc.core.angles import EXACT_LIMIT, geometric_turns, sincos_numpy, sincos_torch

mpmath.mp.dps = 50

# Frequency ladders that the families use: sinusoidal 10000^(-k/h), a long-context
# RoPE base, a diffusion ladder with scale, and a single frequency.
LADDERS = {
    "vaswani-64": (32, 10000.0, 1.0, 32.0, 1.0),
    "rope-500k": (16, 500000.0, 1.0, 16.0, 1.0),
    "ddpm-scaled": (8, 10000.0, 1.0, 7.0, 1000.0),
    "single": (1, 10000.0, 1.0, 0.0, 1.0),
}

# Budgets, derived in posenc/_angles.py's docstring: float64 keeps ~1e-15 before rounding;
# the compensated float32 path loses at most 2**-25 turn in its sum, 2**-24 relative in
# 2 pi r with |r| <= 1/8, and ~1 ulp in sin/cos: together below 4e-7.
FLOAT64_BUDGET = 1e-13
FLOAT32_BUDGET = 4e-7


def truth(positions, ladder):
    count, base, min_ts, denom, scale = ladder
    out_s = np.empty((len(positions), count))
    out_c = np.empty_like(out_s)
    for k in range(count):
        omega = mpmath.mpf(scale) / min_ts
        if k:
            omega *= mpmath.power(mpmath.mpf(base) / min_ts, -mpmath.mpf(k) / mpmath.mpf(denom))
        for i, p in enumerate(positions):
            a = mpmath.mpf(float(p)) * omega
            out_s[i, k] = float(mpmath.sin(a))
            out_c[i, k] = float(mpmath.cos(a))
    return out_s, out_c


def sample_positions(seed):
    rng = np.random.default_rng(seed)
    ints = rng.integers(-(2**31) + 1, 2**31, 40)
    edges = np.array([0, 1, -1, 255, 256, 257, 10**4, 10**6, 10**7, 2**31 - 1, -(2**31) + 1])
    return np.concatenate([ints, edges]).astype(np.int64)


@pytest.mark.parametrize("name", sorted(LADDERS))
def test_numpy_float64_matches_mpmath(name):
    ladder = LADDERS[name]
    p = sample_positions(1)
    s, c = sincos_numpy(p, geometric_turns(*ladder))
    ts, tc = truth(p, ladder)
    assert np.abs(s - ts).max() < FLOAT64_BUDGET
    assert np.abs(c - tc).max() < FLOAT64_BUDGET


@pytest.mark.parametrize("arithmetic", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(LADDERS))
def test_torch_matches_mpmath(name, arithmetic):
    ladder = LADDERS[name]
    p = sample_positions(2)
    s, c = sincos_torch(torch.from_numpy(p), geometric_turns(*ladder), arithmetic)
    ts, tc = truth(p, ladder)
    budget = FLOAT64_BUDGET if arithmetic == "float64" else FLOAT32_BUDGET
    assert np.abs(s.double().numpy() - ts).max() < budget
    assert np.abs(c.double().numpy() - tc).max() < budget


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_float_positions_are_taken_as_given(dtype):
    # diffusion timesteps are floats; the exact value is position-as-stored times omega
    rng = np.random.default_rng(3)
    raw = torch.from_numpy(rng.uniform(-3e4, 3e4, 30)).to(dtype)
    ladder = LADDERS["vaswani-64"]
    exact = truth(raw.double().numpy(), ladder)
    for arithmetic, budget in (("float64", FLOAT64_BUDGET), ("float32", FLOAT32_BUDGET)):
        s, c = sincos_torch(raw, geometric_turns(*ladder), arithmetic)
        assert np.abs(s.double().numpy() - exact[0]).max() < budget
        assert np.abs(c.double().numpy() - exact[1]).max() < budget


def test_naive_float32_formula_is_as_bad_as_documented():
    # the failure posenc exists to avoid: 6e-2 at 1e6 and ~0.7 at 1e7 (ANCHORS section 6)
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64))
    p = torch.tensor([1e6, 1e7])
    naive = torch.sin(p[:, None] * inv).double().numpy()
    exact = truth([1e6, 1e7], LADDERS["vaswani-64"])[0]
    err = np.abs(naive - exact).max(axis=1)
    assert err[0] > 1e-2 and err[1] > 0.2
    ours = sincos_numpy(np.array([1e6, 1e7]), geometric_turns(*LADDERS["vaswani-64"]))[0]
    assert np.abs(ours.astype(np.float32) - exact).max() < 1e-6


def test_autocast_does_not_lower_precision():
    p = torch.tensor([10**6, 2**31 - 1])
    turns = geometric_turns(*LADDERS["vaswani-64"])
    plain = sincos_torch(p, turns)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = sincos_torch(p, turns)
    assert cast[0].dtype == torch.float64
    torch.testing.assert_close(cast[0], plain[0], rtol=0, atol=0)


def test_turns_pieces_reconstruct_the_frequency():
    turns = geometric_turns(*LADDERS["rope-500k"])
    ctx = decimal.Context(prec=50)
    for k in range(turns.size):
        hi_lo = ctx.add(decimal.Decimal(turns.hi[k]), decimal.Decimal(turns.lo[k]))
        pieces = sum((decimal.Decimal(float(x)) for x in turns.pieces32[:, k]), decimal.Decimal(0))
        rel = abs((pieces - hi_lo) / hi_lo)
        assert rel < decimal.Decimal(2) ** -59
        # every float32 piece has at most 12 significant bits, so products stay exact
        for x in turns.pieces32[:, k]:
            m, _ = np.frexp(np.float64(x))
            assert float(m * 2**12).is_integer()


@settings(max_examples=40, deadline=None)
@given(
    start=st.one_of(
        st.integers(-(2**31) + 70000, 2**31 - 70000),
        # fractional starts with few bits, so that start + i is exact in float64
        st.integers(-(2**30), 2**30).map(lambda i: i / 1024),
    ),
    n=st.integers(1, 3000),
    dim=st.integers(1, 40),
)
def test_progression_equals_direct_evaluation(start, n, dim):
    turns = geometric_turns(dim, 10000.0, 1.0, max(dim, 1), 1.0)
    got = np.empty((n, dim), dtype=np.complex128)

    def emit(row0, w):
        got[row0 : row0 + w.shape[0]] = w

    _angles.progression_blocks(float(start), n, turns, emit)
    want = _angles.unit_phasors(start + np.arange(n, dtype=np.float64), turns)
    # products of two exact phasors: a few float64 roundings
    assert np.abs(got - want).max() < 1e-14


def test_exact_limit_is_2_to_31():
    assert EXACT_LIMIT == 2**31


def test_unknown_arithmetic_is_rejected():
    with pytest.raises(ValueError, match="arithmetic"):
        sincos_torch(torch.arange(3), geometric_turns(*LADDERS["single"]), "float16")


# ------------------------------------------------------------------ the compiled table kernel


def test_kernel_is_built_in_the_dev_install():
    # setup.py builds it wherever a C compiler exists (as on every development and CI
    # machine); without it posenc falls back to numpy, and each test below that takes
    # the compiled_kernels fixture skips (under CI=true fails) on its own
    assert _angles.compiled is not None


def _numpy_only(monkeypatch, fn):
    with monkeypatch.context() as m:
        m.setattr(_angles, "compiled", None)
        return fn()


@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("preset", ["vaswani", "ldm", "marian", "positional-encodings", "ddpm"])
@pytest.mark.parametrize("dim", [2, 3, 7, 64, 129])
@pytest.mark.parametrize("n", [128, 1000, 4099])
def test_kernel_table_equals_numpy_path(monkeypatch, preset, dim, n):
    import posenc

    kw = {"offset": -1234.5} if preset == "ddpm" else {}
    fast = posenc.sinusoidal(n, dim, preset=preset, **kw)
    slow = _numpy_only(monkeypatch, lambda: posenc.sinusoidal(n, dim, preset=preset, **kw))
    # the same complex128 products rounded once: float32 results agree exactly
    np.testing.assert_array_equal(fast, slow)
    fast = posenc.sinusoidal(n, dim, preset=preset, dtype="float64", **kw)
    slow = _numpy_only(
        monkeypatch, lambda: posenc.sinusoidal(n, dim, preset=preset, dtype="float64", **kw)
    )
    # float64: numpy's vectorised loop may round a product differently in the last bit
    np.testing.assert_allclose(fast, slow, rtol=0, atol=4 * 2.0**-53)


@pytest.mark.usefixtures("compiled_kernels")
def test_kernel_threads_without_torch():
    # in this process torch is loaded, and the kernel runs on torch's OpenMP team;
    # without torch (numpy only) it starts POSIX threads: the same table either way
    code = (
        "import sys, numpy as np, posenc\n"
        "from posenc.core import angles\n"
        "assert 'torch' not in sys.modules and angles.compiled is not None\n"
        "fast = posenc.sinusoidal(8192, 256)\n"
        "angles.compiled = None\n"
        "assert np.array_equal(fast, posenc.sinusoidal(8192, 256))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _table_sum() -> float:
    import posenc

    return float(posenc.sinusoidal(8192, 256).sum())


@pytest.mark.usefixtures("compiled_kernels")
def test_kernel_in_a_forked_child():
    # after the parent ran the kernel on torch's OpenMP team, a forked child (as a
    # DataLoader worker is) has no team: the kernel must use threads of its own there
    import multiprocessing

    import posenc

    torch.ones(1 << 20).sum()
    want = float(posenc.sinusoidal(8192, 256).sum())
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_table_sum).get(timeout=60)
    assert got == want


@pytest.mark.usefixtures("compiled_kernels")
def test_kernel_declines_what_it_cannot_write():
    turns = geometric_turns(4, 10000.0, 1.0, 4.0, 1.0)
    place = ((0, 2, 4), (1, 2, 4))
    assert not _angles.progression_table(0.0, 300, turns, np.empty((300, 8), np.float16), *place)
    strided = np.empty((300, 16), np.float32)[:, ::2]
    assert not _angles.progression_table(0.0, 300, turns, strided, *place)
    assert not _angles.progression_table(0.0, 300, turns, np.empty((299, 8), np.float32), *place)
    out = np.full((300, 8), np.nan, np.float32)
    assert _angles.progression_table(0.0, 300, turns, out, *place)
    assert np.isfinite(out).all()


def test_kernel_refuses_bad_arguments(compiled_kernels):
    step = np.zeros((16, 2, 4))
    coarse = fine = np.zeros((4, 4), np.complex128)
    out = np.zeros((64, 8), np.float32)
    table = compiled_kernels.table
    with pytest.raises(ValueError, match="out too small"):
        table(coarse, fine, step, out, 65, 4, 8, 0, 2, 4, 1, 2, 4, False, 1)
    with pytest.raises(ValueError, match="outside the row"):
        table(coarse, fine, step, out, 64, 4, 8, 1, 2, 4, 2, 2, 4, False, 1)
    with pytest.raises(ValueError, match="too short"):
        table(coarse[:1], fine, step, out, 64, 1, 8, 0, 2, 4, 1, 2, 4, False, 1)
