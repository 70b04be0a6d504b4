"""posenc.analysis: each measured property against an independent computation.

The independent side is plain float64 numpy on the preset's frequencies (good
to about ``|angle| * 1e-16`` at the small positions used) or mpmath, never
posenc's angle engine.
"""

from __future__ import annotations

import math
import subprocess
import sys

import mpmath
import numpy as np
import pytest

import posenc
from posenc import analysis, sinusoidal
from posenc.families.absolute.sinusoidal import resolve
from posenc.integration.analysis.verdicts import OFFSETS

mpmath.mp.dps = 50

PRESETS_EVEN = ["vaswani", "tensor2tensor", "marian", "musicgen", "ldm", "x-transformers"]


def naive64(positions, dim, preset="vaswani", **overrides):
    """float64 table from the textbook formula (exact enough for small positions)."""
    spec = resolve(preset, **overrides)
    slots = spec.slots(dim)
    angles = (np.asarray(positions, dtype=np.float64)[:, None] + spec.offset) * spec.inv_freq(dim)
    s, c = np.sin(angles), np.cos(angles)
    first, second = (s, c) if spec.order == "sin_cos" else (c, s)
    out = np.zeros((angles.shape[0], dim))
    out[:, slots.first] = first[:, : slots.n_first]
    out[:, slots.second] = second[:, : slots.n_second]
    return out * spec.amplitude_for(dim)


# ------------------------------------------------------------------------------- shift


@pytest.mark.parametrize("preset", PRESETS_EVEN)
def test_shift_error_is_a_few_ulps(preset):
    r = analysis.shift_error(64, 300, (1, -3, 0.5, 77), preset=preset)
    assert r.offsets == (1.0, -3.0, 0.5, 77.0)
    assert len(r.max_error) == 4
    assert r.ok
    amp = abs(resolve(preset).amplitude_for(64))
    assert r.tolerance == 20 * amp * analysis.EPS  # a few ulps, not a guess like 1e-6
    assert all(0 <= e <= r.tolerance for e in r.max_error)


def test_shift_error_measures_a_wrong_matrix(monkeypatch):
    # the measurement must see a defect: rotate by k + 1 instead of k
    real = analysis.sinusoidal.shift_matrix
    monkeypatch.setattr(
        analysis.sinusoidal, "shift_matrix", lambda k, dim, **kw: real(k + 1, dim, **kw)
    )
    r = analysis.shift_error(16, 20, 5)
    assert not r.ok
    assert r.max_error[0] > 0.1


def test_shift_error_with_zero_channel_and_offset():
    r = analysis.shift_error(33, 130, (2, 1000), preset="ldm", offset=1e6)
    assert r.ok


def test_lone_channel_is_refused():
    for fn in (
        lambda: analysis.shift_error(5, 10),
        lambda: analysis.norms(5, 10),
        lambda: analysis.offset_dot_products(5, 10),
    ):
        with pytest.raises(ValueError, match="lone channel"):
            fn()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: analysis.shift_error(8, 0), "length"),
        (lambda: analysis.shift_error(8, 5, ()), "offsets"),
        (lambda: analysis.shift_error(8, 5, (float("nan"),)), "offsets"),
        (lambda: analysis.norms(8, 5, preset="nope"), "preset"),
        (lambda: analysis.regression_r2(8, 2, 1), "length"),
        (lambda: analysis.regression_r2(8, 10, 1, column=8), "column"),
        (lambda: analysis.regression_r2(9, 10, 1, column=8, odd="zero"), "partner"),
    ],
)
def test_bad_arguments_name_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------- norms


def test_norm_is_sqrt_half_d():
    r = analysis.norms(512, 1000)
    assert r.pairs == 256
    assert r.expected == 16.0  # sqrt(512 / 2)
    assert r.ok
    assert abs(r.min - 16.0) <= r.tolerance and abs(r.max - 16.0) <= r.tolerance
    independent = np.linalg.norm(naive64(np.arange(1000), 512), axis=1)
    np.testing.assert_allclose(independent, 16.0, rtol=1e-13)


@pytest.mark.parametrize(
    ("dim", "preset", "overrides", "expected"),
    [
        (64, "x-transformers", {}, math.sqrt(0.5)),  # d**-0.5 * sqrt(d / 2)
        (33, "ldm", {}, 4.0),  # 16 pairs and a zero channel
        (10, "vaswani", {"amplitude": 3.0}, 3.0 * math.sqrt(5)),
    ],
)
def test_norm_amplitude_and_pairs(dim, preset, overrides, expected):
    r = analysis.norms(dim, 200, preset=preset, **overrides)
    assert r.expected == pytest.approx(expected, rel=1e-15)
    assert r.ok


# ------------------------------------------------------------------------ dot products


@pytest.mark.parametrize("preset", PRESETS_EVEN)
def test_dot_product_depends_on_offset_only(preset):
    dim, length, offsets = 128, 300, (0, 1, 10, 100)
    r = analysis.offset_dot_products(dim, length, offsets, preset=preset)
    assert r.ok
    spec = resolve(preset)
    amp2 = spec.amplitude_for(dim) ** 2
    for k, closed in zip(offsets, r.closed_form, strict=True):
        expected = amp2 * np.sum(np.cos(k * spec.inv_freq(dim)))
        assert closed == pytest.approx(expected, rel=1e-13, abs=1e-13)
        # and the dot product itself, from the textbook formula at one position
        a = naive64(np.array([37.0]), dim, preset)[0]
        b = naive64(np.array([37.0 + k]), dim, preset)[0]
        assert float(a @ b) == pytest.approx(closed, rel=1e-12, abs=1e-12)
    assert r.closed_form[0] == pytest.approx(amp2 * dim / 2, rel=1e-15)  # k = 0: the norm


# -------------------------------------------------------------------------- regression


def pe_even(pos, i):
    """PE(pos, 2i) = sin(pos / 10000**(2i / d_model)) for d_model 512, written out by hand."""
    return np.sin(pos / (10000 ** (2 * i / 512)))


def r2_simple(x, y):
    # with an intercept, R^2 of a one-variable fit is the squared correlation
    return float(np.corrcoef(x, y)[0, 1] ** 2)


def test_one_column_regressed_on_itself_fails_pair_is_exact():
    # one sine column at p + 10 regressed on the same column at p (d = 512), as a user tries it
    p = np.arange(1000.0)
    r = analysis.regression_r2(512, 1000, 10)
    assert r.column == 128 and r.partner == 129  # PE(p, 2i) for i = 64
    assert r.omega == pytest.approx(0.1, rel=1e-15)
    expected = r2_simple(pe_even(p, 64), pe_even(p + 10, 64))
    assert r.single_r2 == pytest.approx(expected, abs=1e-12)
    assert r.single_r2 < 0.99
    assert r.single_r2 == pytest.approx(r.single_r2_limit, abs=0.02)  # cos(1)**2 = 0.29
    assert r.pair_r2 > 1 - 1e-12
    assert 1 - r.pair_r2 <= r.pair_tolerance
    np.testing.assert_allclose(r.pair_coef, (0.0, math.cos(1.0), math.sin(1.0)), atol=1e-12)
    np.testing.assert_allclose(r.expected_coef, (0.0, math.cos(1.0), math.sin(1.0)), atol=1e-15)


@pytest.mark.parametrize("preset", ["vaswani", "ldm", "musicgen", "marian"])
@pytest.mark.parametrize("which", ["first", "second"])
def test_pair_coefficients_rotate_with_the_right_sign(preset, which):
    spec = resolve(preset)
    first, second = spec.slots(64).indices()
    column = int((first if which == "first" else second)[5])
    r = analysis.regression_r2(64, 400, 7, column, preset=preset)
    assert r.pair_r2 > 1 - 1e-12
    np.testing.assert_allclose(r.pair_coef, r.expected_coef, atol=1e-12)
    assert abs(r.expected_coef[2]) > 0.1


def test_single_column_r2_matches_an_independent_fit():
    table = naive64(np.arange(200), 32)
    shifted = naive64(np.arange(200) + 3.0, 32)
    for column in (0, 3, 10):
        r = analysis.regression_r2(32, 200, 3, column)
        assert r.single_r2 == pytest.approx(
            r2_simple(table[:, column], shifted[:, column]), abs=1e-12
        )


# --------------------------------------------------------------------------- precision


def mp_row(p, dim, base=10000):
    """Exact vaswani row at position p, by mpmath."""
    out = []
    for k in range(dim // 2):
        a = mpmath.mpf(p) * mpmath.power(base, -mpmath.mpf(2 * k) / dim)
        out += [float(mpmath.sin(a)), float(mpmath.cos(a))]
    return np.array(out)


def test_precision_report_against_mpmath():
    dim = 16
    positions = (1e4, 1e6, 1e7, 123456789.0)
    r = analysis.precision_report(positions, dim)
    assert [pt.position for pt in r.points] == list(positions)
    assert r.tolerance == pytest.approx(2.0**-24, rel=1e-6)
    omega32 = resolve("vaswani").inv_freq(dim).astype(np.float32)
    for pt in r.points:
        exact = mp_row(pt.position, dim)
        ours = sinusoidal(np.array([pt.position]), dim)[0].astype(np.float64)
        assert pt.posenc_error == pytest.approx(np.abs(ours - exact).max(), abs=1e-14)
        assert pt.posenc_error <= r.tolerance
        angle = np.float32(pt.position) * omega32
        naive = np.empty(dim)
        naive[0::2], naive[1::2] = np.sin(angle), np.cos(angle)
        assert pt.naive_error == pytest.approx(np.abs(naive - exact).max(), abs=1e-6)
        assert pt.max_angle == pytest.approx(pt.position, rel=1e-15)  # omega_0 = 1
    assert r.ok


def test_precision_story_at_d512():
    # the numbers users meet: the float32 formula is off by ~6e-4, ~6e-2, ~0.7
    r = analysis.precision_report((1e4, 1e6, 1e7), 512)
    naive = [pt.naive_error for pt in r.points]
    assert 1e-4 < naive[0] < 2e-3
    assert 1e-2 < naive[1] < 0.2
    assert 0.2 < naive[2] <= 2.0
    for pt in r.points:
        # the product's rounding: at most one float32 rounding of omega and one of p*omega
        assert pt.naive_angle_error <= pt.max_angle * 2.0**-23
    assert r.ok


# ------------------------------------------------------------------------ the verdicts


def test_check_decides_every_row():
    rows = analysis.check(512, 50)
    assert len(rows) == 12
    assert all(row.passed is True for row in rows)
    claims = [row.claim for row in rows]
    assert claims[0] == "shift: PE(p+1) = PE(p) @ M(1).T"
    assert claims[3] == "row norm = 16 (a sqrt(pairs), 256 pairs)"
    assert claims[7] == "one column (ch 128) at p+10 from itself: not linear"
    assert rows[7].bound == "< 0.99"
    assert claims[-1] == "float32 at p=1e+07: posenc (naive float32 formula)"


def test_check_fails_a_wrong_shift_matrix(monkeypatch):
    real = analysis.sinusoidal.shift_matrix
    monkeypatch.setattr(
        analysis.sinusoidal, "shift_matrix", lambda k, dim, **kw: real(k + 1, dim, **kw)
    )
    rows = analysis.check(16, 50)
    assert [row.passed for row in rows[:3]] == [False, False, False]
    assert all(row.passed for row in rows[3:])


def test_check_fails_a_shift_matrix_a_few_tolerances_off(monkeypatch):
    # the near miss: M(k + delta) for M(k), delta 3 tolerances over the fastest frequency
    # (omega_0 = 1 in the paper's table, amplitude 1). PE(p) @ M(k + delta).T then differs
    # from PE(p + k) by the turn delta of pair 0 (|2 sin(delta / 2)| ~ delta, 3 tolerances)
    # less the honest rounding, which stays within one tolerance: at least 2 tolerances,
    # at most 4 (a tolerance 4 times looser than shift_error's would let it pass)
    tolerance = analysis.shift_error(16, 50, 1).tolerance
    delta = 3 * tolerance
    real = analysis.sinusoidal.shift_matrix
    monkeypatch.setattr(
        analysis.sinusoidal, "shift_matrix", lambda k, dim, **kw: real(k + delta, dim, **kw)
    )
    near = analysis.shift_error(16, 50, OFFSETS)
    assert all(2 * tolerance <= e <= 4 * tolerance for e in near.max_error), near.max_error
    rows = analysis.check(16, 50)
    shift_rows = [row for row in rows if row.claim.startswith("shift:")]
    assert len(shift_rows) == len(OFFSETS)
    assert [row.passed for row in shift_rows] == [False] * len(shift_rows)


def test_check_skips_what_a_lone_channel_breaks():
    rows = analysis.check(63, 50)  # vaswani extends an odd dim: a lone channel
    skipped = [row for row in rows if row.passed is None]
    assert [row.claim for row in skipped] == [
        "shift property", "row norm", "offset-only dot product",
    ]  # fmt: skip
    assert all("lone channel" in row.measured and row.bound == "-" for row in skipped)
    assert all(row.passed for row in rows if row not in skipped)


def test_check_short_table_skips_the_regression():
    rows = analysis.check(8, 2)
    (skipped,) = [row for row in rows if row.passed is None]
    assert skipped.claim == "regression: one column vs the pair"


def regression_row(rows):
    (row,) = [row for row in rows if row.claim.startswith("one column")]
    return row


@pytest.mark.parametrize(
    ("dim", "length", "preset"),
    [(4, 50, "vaswani"), (6, 50, "tensor2tensor"), (8, 3, "vaswani"), (2, 3, "vaswani")],
)
def test_check_tiny_tables_pass(dim, length, preset):
    # the default column is too slow to bend over these positions (R^2 ~ 1 for a
    # correct table); the check regresses a column that bends instead
    rows = analysis.check(dim, length, preset=preset)
    assert all(row.passed is True for row in rows), [r for r in rows if not r.passed]
    row = regression_row(rows)
    assert row.claim == "one column (ch 0) at p+10 from itself: not linear"
    r2 = r2_simple(naive64(np.arange(length), dim, preset)[:, 0],
                   naive64(np.arange(length) + 10.0, dim, preset)[:, 0])  # fmt: skip
    assert r2 < 0.99
    assert row.measured.startswith(f"R^2 {r2:.3f} ")


def test_check_skips_the_regression_when_no_column_bends():
    # every angle step is below 0.01 rad: over 50 positions each column is almost a line
    rows = analysis.check(4, 50, scale=0.001)
    row = regression_row(rows)
    assert row.passed is None
    assert row.bound == "-"
    assert row.measured == "no column bends over 50 positions (exact R^2 >= 1.000)"
    assert all(r.passed is True for r in rows if r is not row)


def test_check_fails_a_table_whose_columns_are_straight(monkeypatch):
    # a wrong table: every column a line in p, so one column predicts itself shifted
    def ramp(positions, dim, spec):
        p = np.arange(positions, dtype=np.float64) if isinstance(positions, int) else positions
        return (p[:, None] + spec.offset) * np.linspace(0.01, 0.02, dim)

    monkeypatch.setattr(analysis.sinusoidal, "table64", ramp)
    monkeypatch.setattr(
        analysis.sinusoidal, "shifted64",
        lambda length, k, dim, spec: ramp(np.arange(length) + k, dim, spec),
    )  # fmt: skip
    for dim, length in ((512, 50), (4, 50), (8, 3)):
        row = regression_row(analysis.check(dim, length))
        assert row.passed is False
        assert row.measured.startswith("R^2 1.000")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"length": 0}, ValueError, "length must be an int >= 1"),
        ({"length": 2.0}, TypeError, "length must be an int"),
        ({"dim": 0}, ValueError, "dim"),
        ({"preset": "nope"}, ValueError, "preset"),
    ],
)
def test_check_bad_arguments_name_the_parameter(kwargs, error, match):
    with pytest.raises(error, match=match):
        analysis.check(**kwargs)


# ------------------------------------------------------------------- report measurements


def test_learned_similarity_of_a_known_table():
    # rows on a circle, 10 degrees apart: neighbours have cosine cos(10 degrees)
    angle = np.deg2rad(10.0) * np.arange(4)
    table = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    near, far = analysis.Learned(table, 1.0, 0, 0.0).similarity(apart=2)
    assert near == pytest.approx(math.cos(np.deg2rad(10.0)), rel=1e-15)
    assert far == pytest.approx(math.cos(np.deg2rad(30.0)), rel=1e-15)  # rows 0 and 3 only


def test_rope_decay_starts_at_one_and_falls():
    r, bound, mean_abs = analysis.rope_decay(128, 10000.0, 1000)
    assert r[0] == 0 and r[-1] == 1000
    assert bound[0] == 1.0 and mean_abs[0] == pytest.approx(1.0, rel=1e-15)
    assert bound[1000] < bound[100] < 1.0


def test_scaling_curves_linear_is_default_over_factor():
    curves = analysis.scaling_curves(64, 10000.0, 8.0, 4096)
    assert set(curves) == {"default", "linear", "ntk", "yarn", "llama3"}
    np.testing.assert_allclose(curves["linear"], curves["default"] / 8.0, rtol=1e-15)
    expected = 10000.0 ** (-np.arange(0, 64, 2) / 64)
    np.testing.assert_allclose(curves["default"], expected, rtol=1e-14)


def test_rope_scores_depend_on_the_offset_only():
    rel = analysis.rope_relative(head_dim=32, length=16)
    assert rel["float64"] <= 1e-12 * rel["scale"]
    assert rel["float32"] <= 1e-5 * rel["scale"]


def test_geometry_tells_every_position_apart():
    geo = analysis.geometry(64, 20, "vaswani")
    distance, i, j = geo["first"]
    table = naive64(np.arange(20), 64)
    assert distance == pytest.approx(np.linalg.norm(table[i] - table[j]), rel=1e-12)
    assert distance > 1.0 and geo["float32 distinct"]
    assert set(geo["recovery"]) == {0.1, 0.5, 1.0, 2.0}
    assert geo["recovery"][0.1] == 1.0


def test_exp_log_forms_are_the_same_function():
    with mpmath.workdps(23):  # a precision of the caller's, which the measurement keeps
        forms = analysis.exp_log_forms(64)
        assert mpmath.mp.dps == 23
    assert set(forms) == {"power float32", "exp-log float32", "power float64", "exp-log float64"}
    for name, (error, seconds) in forms.items():
        assert error < (1e-6 if "float32" in name else 1e-14), name
        assert seconds > 0


def test_import_needs_only_numpy():
    code = (
        "import sys, posenc.analysis; "
        "print(sorted(m for m in ('torch', 'matplotlib', 'mpmath') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ permutation, exp-log, add


@pytest.mark.parametrize(("dim", "tokens", "seed"), [(16, 6, 0), (64, 10, 1), (2, 2, 2)])
def test_attention_without_positions_only_reorders(dim, tokens, seed):
    r = analysis.permutation_check(dim, tokens, seed)
    perm = np.array(r.permutation)
    assert sorted(perm) == list(range(tokens)) and not np.array_equal(perm, np.arange(tokens))
    assert r.output.shape == r.permuted_output.shape == (tokens, dim)
    assert r.ok and 0 <= r.max_difference <= r.bound
    assert r.max_difference == np.abs(r.permuted_output - r.output[perm]).max()
    # the bound is rounding-sized: a few thousand ulps of the outputs, not a guess like 1e-6
    assert r.bound <= 1e5 * analysis.EPS * np.abs(r.output).max()
    # positions added in order: the outputs change by as much as they are large
    assert r.with_positions > 1e6 * r.bound
    assert r.with_positions > 0.05 * np.abs(r.positioned_output).max()
    diff = np.abs(r.positioned_permuted_output - r.positioned_output[perm]).max()
    assert r.with_positions == diff


def test_permutation_check_arguments():
    with pytest.raises(ValueError, match="tokens"):
        analysis.permutation_check(tokens=1)
    with pytest.raises(TypeError, match="dim"):
        analysis.permutation_check(dim=4.0)
    with pytest.raises(ValueError, match="seed"):
        analysis.permutation_check(seed=-1)


@pytest.mark.parametrize(("dim", "base"), [(512, 10000.0), (64, 10000.0), (10, 500.0)])
def test_exp_log_errors_against_mpmath(dim, base):
    e = analysis.exp_log_errors(dim, base)
    h = dim // 2
    assert list(e.pair) == list(range(h))
    u = 2.0**-24
    assert e.unit == u
    for i in range(h):
        exact = mpmath.power(mpmath.mpf(base), mpmath.mpf(-2 * i) / dim)  # 50 digits
        assert e.exact[i] == float(exact)
        # the two float32 forms, written out independently
        k, d = np.float32(2 * i), np.float32(dim)
        power = np.float32(1.0) / np.power(np.float32(base), k / d)
        explog = np.exp(k * np.float32(-math.log(base) / dim))
        for got, value in ((e.power_error[i], power), (e.exp_log_error[i], explog)):
            assert value.dtype == np.float32
            rel = abs(mpmath.mpf(float(value)) - exact) / exact
            assert got == pytest.approx(float(rel), rel=1e-12, abs=1e-30)
        # derived bounds: the exponent 2i/d is rounded once (relative u, times |ln omega|),
        # the power or exp and the division add at most a few ulps; the exp-log form's
        # constant and product are rounded (2u times the argument |ln omega|)
        log_omega = 2 * i / dim * math.log(base)
        assert e.power_error[i] <= (log_omega + 4) * u
        assert e.exp_log_error[i] <= (2 * log_omega + 4) * u
    # the exp-log form's rounding grows with the pair index: larger on the slow half
    assert e.exp_log_error[h // 2 :].max() > e.power_error[h // 2 :].max() or dim < 64


@pytest.mark.parametrize("dim", [4, 16, 512, 513])
def test_h_minus_one_variant_reaches_one_over_base(dim):
    base = 10000.0
    e = analysis.exp_log_errors(dim, base)
    h = dim // 2
    assert e.variant[0] == e.paper[0] == 1.0
    assert e.variant[-1] == 1 / base
    assert e.paper[-1] == float(mpmath.power(base, mpmath.mpf(-2 * (h - 1)) / dim))
    assert e.paper[-1] > 1 / base
    ratio = float(mpmath.power(base, mpmath.mpf(1) / (h - 1)))  # a geometric schedule
    np.testing.assert_allclose(e.variant[:-1] / e.variant[1:], ratio, rtol=1e-14)


def test_exp_log_errors_arguments():
    with pytest.raises(ValueError, match="dim"):
        analysis.exp_log_errors(1)
    with pytest.raises(ValueError, match="base"):
        analysis.exp_log_errors(8, base=-1.0)


def test_add_concat_scales_and_recovery():
    a = analysis.add_concat(512, 50)
    values = (
        a.position_recovery_scaled,
        a.position_recovery_unscaled,
        a.token_recovery_scaled,
        a.token_recovery_unscaled,
        a.concat_position_recovery,
        a.concat_token_recovery,
    )
    assert all(0.0 <= v <= 1.0 for v in values)
    # sqrt(d): tokens stay apart, positions blur a little; without it, the reverse
    assert a.token_recovery_scaled > a.token_recovery_unscaled
    assert a.position_recovery_unscaled >= a.position_recovery_scaled
    assert a.concat_position_recovery == a.concat_token_recovery == 1.0
    assert a.recovery == {1.0: a.position_recovery_scaled, 512**-0.5: a.position_recovery_unscaled}
    # 100 x 512 entries of N(0, 1/d), times sqrt(d): std within 2% of 1 (about 7 sigma)
    assert a.scaled_std == pytest.approx(1.0, rel=0.02)
    assert a.unscaled_std == pytest.approx(512**-0.5, rel=0.02)
    # the drawn pair: wavelength nearest the length, and circles of radius 1 around tokens
    omega = resolve("vaswani").inv_freq(512)
    assert a.wavelength == pytest.approx(2 * np.pi / omega[a.pair], rel=1e-15)
    assert np.argmin(np.abs(np.log(2 * np.pi / omega / 50))) == a.pair
    assert a.channels == (2 * a.pair + 1, 2 * a.pair)  # (cos, sin), interleaved
    for tokens, points in (
        (a.scaled_tokens, a.scaled_points),
        (a.unscaled_tokens, a.unscaled_points),
    ):
        radius = np.linalg.norm(points - tokens[:, None], axis=-1)
        np.testing.assert_allclose(radius, 1.0, rtol=1e-12)
    assert np.allclose(a.scaled_tokens, a.unscaled_tokens * math.sqrt(512), rtol=1e-15)


def test_add_concat_recovery_against_brute_force():
    dim, length, vocab = 32, 12, 20
    a = analysis.add_concat(dim, length, seed=3, vocab=vocab)
    # the same draws, then every sum formed and every distance measured
    tokens = np.random.default_rng(3).normal(scale=dim**-0.5, size=(vocab, dim))
    table = naive64(np.arange(length), dim)
    for scale, pos, tok in (
        (math.sqrt(dim), a.position_recovery_scaled, a.token_recovery_scaled),
        (1.0, a.position_recovery_unscaled, a.token_recovery_unscaled),
    ):
        e = scale * tokens
        x = e[:, None, :] + table[None, :, :]
        to_rows = np.linalg.norm(x[:, :, None, :] - table[None, None], axis=-1)
        to_tokens = np.linalg.norm(x[:, :, None, :] - e[None, None], axis=-1)
        assert pos == np.mean(to_rows.argmin(-1) == np.arange(length)[None, :])
        assert tok == np.mean(to_tokens.argmin(-1) == np.arange(vocab)[:, None])


@pytest.mark.parametrize("preset", ["ldm", "musicgen"])
def test_add_concat_cos_sin_order(preset):
    a = analysis.add_concat(64, 20, preset=preset, vocab=10)
    spec = resolve(preset)
    omega = spec.inv_freq(64)[a.pair]
    p = np.arange(20)
    np.testing.assert_allclose(
        a.scaled_points[0, :, 0] - a.scaled_tokens[0, 0], np.cos(omega * p), atol=1e-12
    )
    np.testing.assert_allclose(
        a.scaled_points[0, :, 1] - a.scaled_tokens[0, 1], np.sin(omega * p), atol=1e-12
    )


def test_add_concat_arguments():
    with pytest.raises(ValueError, match="shown"):
        analysis.add_concat(16, 8, shown=5, vocab=4)
    with pytest.raises(ValueError, match="length"):
        analysis.add_concat(16, 1)
    with pytest.raises(TypeError, match="vocab"):
        analysis.add_concat(16, 8, vocab=2.5)


# ------------------------------------------------------------- timesteps and the index


U64 = 2.0**-53  # float64 unit roundoff: the timestep tables and their cosines are float64


def _gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u): the relative error of n float64 roundings in a row."""
    return n * U64 / (1 - n * U64)


def timestep_cosine_error(omega: np.ndarray, first: float, second: float) -> float:
    """Bound on the float64 cosine of two unit-amplitude timestep rows at ``t <= first`` and
    ``t + k <= second``, against its exact value ``mean_i cos(k omega_i)`` (``omega_i`` the
    float64 frequencies, ``inv_freq``; ``n`` pairs, ``u = 2**-53``), to first order in ``u``
    (products of two of these errors, squares of the angle errors included, stay below
    1e-24: ten orders under the bound).

    - The angles: a float64 table evaluates ``t omega_i`` within ``2 u t omega_i`` (its
      frequency one rounding from ``omega_i``, the product one more). A pair contributes
      ``cos(angle(t + k) - angle(t))`` to the dot product and exactly 1 to each squared
      norm, so the cosine moves by at most the mean over the pairs of the two angle
      errors: ``2 u (first + second) mean(omega)``.
    - The values: one ulp of each entry (<= u, as ``|entry| <= 1``), ``sqrt(2n) u`` for a
      row of 2n channels. A row ``a`` of norm ``sqrt(n)`` moves the cosine by at most
      ``|delta a| / |a|`` (its gradient in ``a`` has norm ``sqrt(1 - cos^2) / |a|``):
      ``sqrt(2) u`` a row, ``2 sqrt(2) u`` the two.
    - The cosine itself: the dot product of 2n terms is off by ``gamma_2n |a| |b|``
      (Cauchy-Schwarz); each norm by ``gamma_2n / 2 + u`` relative (a sum of squares, then
      a square root); their product and the division add ``2 u``: ``2 gamma_2n + 4 u``.
    """
    n = len(omega)
    angles = 2 * U64 * (first + second) * float(np.mean(omega))
    values = 2 * math.sqrt(2) * U64
    cosine = 2 * _gamma(2 * n) + 4 * U64
    return angles + values + cosine


def test_timestep_presets_compare_one_t_under_three_conventions():
    t = np.arange(0, 1000, 7.5)
    got = analysis.timestep_presets(64, timesteps=t)
    mean, low, high = got.mismatch("ddpm", "ldm")
    assert low <= mean <= high < 0.5  # [sin | cos] against [cos | sin]: far apart
    assert got.cosine[0, 1, 0] == 0.0  # t = 0: [0 | 1] against [1 | 0]
    omegas = {name: resolve(name).inv_freq(64) for name in got.presets}
    assert all(resolve(name).amplitude_for(64) == 1.0 for name in got.presets)
    # the same convention: the cosine of a row with itself is 1 (k = 0 in the bound)
    _, same_low, _ = got.mismatch("ddpm", "annotated-diffusion")
    assert 1 - same_low <= timestep_cosine_error(omegas["ddpm"], t[-1], t[-1])
    # e(t) . e(t + k) depends on k alone: each timestep's cosine lies within the bound of
    # the exact value; their mean (T values of magnitude <= 1 summed, gamma_T, then divided,
    # u) within that plus gamma_T + u; the difference of the two, one more rounding (u)
    averaged = _gamma(len(t)) + U64
    spread_bound = max(
        2 * timestep_cosine_error(omegas[name], t[-1], t[-1] + k) + averaged + U64
        for name in got.presets
        for k in got.offsets
    )
    assert got.neighbour_spread <= spread_bound
    # the library's own verdict on its numbers holds (a tolerance below its spread fails)
    assert got.neighbour_spread <= got.tolerance
    # and the mean equals the mean of cos(k omega) over the pairs, summed exactly (mpmath)
    for p, name in enumerate(got.presets):
        omega = omegas[name]
        for k, v in zip(got.offsets, got.neighbour[p], strict=True):
            exact = mpmath.fsum(mpmath.cos(k * mpmath.mpf(w)) for w in omega) / len(omega)
            bound = timestep_cosine_error(omega, t[-1], t[-1] + k) + averaged
            assert abs(mpmath.mpf(v) - exact) <= bound, (name, k)
    with pytest.raises(ValueError, match="preset"):
        analysis.timestep_presets(64, presets=("ddpm", "wrong"))
    with pytest.raises(ValueError, match="presets"):
        analysis.timestep_presets(64, presets=())


def test_index_features_by_brute_force():
    got = analysis.index_features(position=5, lengths=(11, 101), dim=16)
    assert got.normalised == (0.5, 0.05) and got.largest_index == (10, 100)
    table = posenc.sinusoidal(101, 16, dtype="float64")
    dist = np.linalg.norm(table[:, None] - table[None], axis=-1)
    dist[np.diag_indices(101)] = np.inf
    assert got.nearest == pytest.approx(dist.min(), rel=1e-9)
    assert got.sinusoidal_bound <= 1.0 and got.row_norm == pytest.approx(np.sqrt(8), rel=1e-15)
    with pytest.raises(ValueError, match="position"):
        analysis.index_features(position=20, lengths=(11,))
    with pytest.raises(ValueError, match="lengths"):
        analysis.index_features(lengths=(1,))
