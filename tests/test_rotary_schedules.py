"""The rotary frequency schedules against HF transformers' ``ROPE_INIT_FUNCTIONS``, and exactly.

HF computes ``inv_freq`` in float32 (the reference); posenc in 40-digit decimal (checked
here against mpmath). The tolerance against HF is derived, not guessed: HF evaluates
``1 / base ** float32(2k / d)`` with the exponent and the base rounded to float32, so
its exponent ``x_k = (2k / d) ln base`` is off by about ``|x_k| 2**-24`` and pow, the
reciprocal and the division by a factor add a rounding of ``2**-24`` each: in all,
``(1 + |x_k|) 2**-23`` relative. YaRN and llama3 blend ``omega`` with ``omega / factor``
with a float32 ramp (smooth factor) whose few ``2**-24`` of rounding move the result by
up to ``factor - 1`` times as much (the blend's sensitivity ``(1 - 1/f) / (r/f + 1 - r)``
peaks at ``f - 1``): they get ``(f - 1) 2**-23`` more.
"""

from __future__ import annotations

import decimal
import functools
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import anchor
from posenc.families.rotary import schedules
from posenc.families.rotary.schedules import PARAMETERS, SCHEDULES, frequencies

transformers = anchor("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

HEAD_DIMS = (32, 64, 80, 128, 256)
PARTIALS = (1.0, 0.5, 0.25)
ULP = 2.0**-23
MAX_POS = 4096
ORIGINAL = 1024


pytestmark = pytest.mark.usefixtures("quiet_transformers")


@functools.cache
def _llama(head_dim: int, max_pos: int):
    return transformers.LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        num_hidden_layers=1,
        vocab_size=8,
        intermediate_size=8,
    )


def hf(rope_type, head_dim, partial, base, params, *, seq_len=None, max_pos=MAX_POS):
    """HF's (inv_freq as float64, attention_scaling) for v5 ``rope_parameters``.

    A real LlamaConfig per head dim (building one costs ~40 ms, so the sweep reuses it);
    the init functions read only ``rope_parameters`` (which they standardize themselves),
    ``head_dim`` and ``max_position_embeddings``.
    """
    config = _llama(head_dim, max_pos)
    config.rope_parameters = {
        "rope_type": rope_type,
        "rope_theta": base,
        "partial_rotary_factor": partial,
        **params,
    }
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, device="cpu", seq_len=seq_len)
    return inv_freq.double().numpy(), float(scaling)


def compare(ours, theirs, log_base, *, dim, blend=1.0):
    """Check posenc against HF within the derived float32 tolerance (module docstring)."""
    inv_freq, scaling = theirs
    assert ours.inv_freq.shape == inv_freq.shape
    k = np.arange(inv_freq.size)
    x = np.abs(2 * k / dim * log_base)
    tol = (1 + x + (blend - 1)) * ULP
    zero = ours.inv_freq == 0
    np.testing.assert_array_equal(inv_freq[zero], 0.0)
    rel = np.abs(inv_freq[~zero] - ours.inv_freq[~zero]) / ours.inv_freq[~zero]
    assert (rel <= tol[~zero]).all(), f"max relative deviation {rel.max():.3g}"
    assert ours.attention_scaling == pytest.approx(scaling, rel=1e-6)


def cases():
    for i, head_dim in enumerate(HEAD_DIMS):
        for j, partial in enumerate(PARTIALS):
            base = (10000.0, 500000.0, 1e6)[(i + j) % 3]
            yield pytest.param(head_dim, partial, base, id=f"d{head_dim}-p{partial}-b{base:g}")


SWEEP = list(cases())


@pytest.mark.parametrize(("head_dim", "partial", "base"), SWEEP)
def test_linear_matches_hf(head_dim, partial, base):
    dim = int(head_dim * partial)
    for factor in (1.0, 2.0, 8.0, 32.5):
        ours = frequencies("linear", dim, base, {"factor": factor})
        compare(
            ours, hf("linear", head_dim, partial, base, {"factor": factor}), math.log(base), dim=dim
        )


@pytest.mark.parametrize(("head_dim", "partial", "base"), SWEEP)
def test_dynamic_matches_hf_below_at_and_above_max_pos(head_dim, partial, base):
    dim = int(head_dim * partial)
    for factor in (1.0, 2.0, 4.5):
        for seq_len in (None, 1, MAX_POS - 1, MAX_POS, MAX_POS + 1, 3 * MAX_POS, 20 * MAX_POS):
            params = {"factor": factor, "max_position_embeddings": MAX_POS}
            ours = frequencies("dynamic", dim, base, params, seq_len=seq_len)
            theirs = hf("dynamic", head_dim, partial, base, {"factor": factor}, seq_len=seq_len)
            length = max(seq_len or 0, MAX_POS)
            scale = factor * length / MAX_POS - (factor - 1)
            log_base = math.log(base) + dim / (dim - 2) * math.log(scale)
            compare(ours, theirs, log_base, dim=dim)


@pytest.mark.parametrize(("head_dim", "partial", "base"), SWEEP)
def test_ntk_is_hf_dynamic_frozen_at_factor_times_max_pos(head_dim, partial, base):
    # HF has no static NTK; its dynamic type with factor 1 at seq_len = a * max_pos
    # has scale a, which is static NTK with factor a
    dim = int(head_dim * partial)
    for a in (2, 4, 8):
        ours = frequencies("ntk", dim, base, {"factor": float(a)})
        theirs = hf("dynamic", head_dim, partial, base, {"factor": 1.0}, seq_len=a * MAX_POS)
        compare(ours, theirs, math.log(base) + dim / (dim - 2) * math.log(a), dim=dim)


YARN_EXTRAS = (
    {},
    {"mscale": 0.707, "mscale_all_dim": 0.707},  # DeepSeek V3: attention scaling 1
    {"mscale": 1.0, "mscale_all_dim": 0.5},
    {"mscale": 1.0},  # mscale alone is ignored
    {"attention_factor": 0.9, "mscale": 1.0, "mscale_all_dim": 0.5},  # explicit wins
    {"beta_fast": 16, "beta_slow": 2},
)


@pytest.mark.parametrize(("head_dim", "partial", "base"), SWEEP)
def test_yarn_matches_hf(head_dim, partial, base):
    dim = int(head_dim * partial)
    for factor in (1.0, 4.0, 32.0):
        for truncate in (True, False):
            for extra in YARN_EXTRAS:
                params = {
                    "factor": factor,
                    "original_max_position_embeddings": ORIGINAL,
                    "truncate": truncate,
                    **extra,
                }
                ours = frequencies("yarn", dim, base, params)
                theirs = hf("yarn", head_dim, partial, base, params)
                compare(ours, theirs, math.log(base), dim=dim, blend=factor)


@pytest.mark.parametrize(("head_dim", "partial", "base"), SWEEP)
def test_llama3_matches_hf(head_dim, partial, base):
    dim = int(head_dim * partial)
    for factor in (1.0, 8.0, 32.0):
        for original in (1024, 8192):
            for low, high in ((1.0, 4.0), (2.0, 8.0)):
                params = {
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": original,
                }
                ours = frequencies("llama3", dim, base, params)
                theirs = hf("llama3", head_dim, partial, base, params)
                compare(ours, theirs, math.log(base), dim=dim, blend=factor)


@pytest.mark.parametrize(("head_dim", "partial", "base"), SWEEP)
def test_longrope_matches_hf_around_the_original_length(head_dim, partial, base):
    dim = int(head_dim * partial)
    rng = np.random.default_rng(dim)
    short = rng.uniform(1.0, 3.0, dim // 2).tolist()
    long = rng.uniform(1.0, 40.0, dim // 2).tolist()
    lists = {"short_factor": short, "long_factor": long}
    for factor in (1.0, 16.0):
        max_pos = int(factor * ORIGINAL)
        for seq_len in (None, ORIGINAL - 1, ORIGINAL, ORIGINAL + 1, 4 * ORIGINAL):
            # factor given explicitly, then derived from max_position_embeddings (Phi-3)
            for given_factor in (True, False):
                params = {**lists, "original_max_position_embeddings": ORIGINAL}
                if given_factor:
                    params["factor"] = factor
                theirs = hf(
                    "longrope", head_dim, partial, base, params, seq_len=seq_len, max_pos=max_pos
                )
                if not given_factor:
                    params["max_position_embeddings"] = max_pos
                ours = frequencies("longrope", dim, base, params, seq_len=seq_len)
                compare(ours, theirs, math.log(base), dim=dim)
    explicit = {**lists, "original_max_position_embeddings": ORIGINAL, "factor": 16.0}
    explicit["attention_factor"] = 1.25
    ours = frequencies("longrope", dim, base, explicit, seq_len=5000)
    compare(
        ours,
        hf("longrope", head_dim, partial, base, explicit, seq_len=5000),
        math.log(base),
        dim=dim,
    )


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_proportional_matches_hf(head_dim):
    # the schedule covers the whole head: rotary_dim = head_dim, the partial factor in params
    for partial in (1.0, 0.75, 0.5, 0.25, 0.0):
        for factor in (1.0, 8.0):
            params = {"partial_rotary_factor": partial, "factor": factor}
            ours = frequencies("proportional", head_dim, 10000.0, params, head_dim=head_dim)
            theirs = hf("proportional", head_dim, partial, 10000.0, {"factor": factor})
            compare(ours, theirs, math.log(10000.0), dim=head_dim)
            rotated = int(partial * head_dim // 2)
            assert all(w == 0 for w in ours.omega[rotated:])  # exact zeros
            assert all(w > 0 for w in ours.omega[:rotated])


@pytest.mark.parametrize(
    ("rope_type", "params"),
    [
        ("linear", {"factor": 4.0}),
        ("dynamic", {"factor": 2.0}),
        ("yarn", {"factor": 8.0, "original_max_position_embeddings": 1024, "truncate": False}),
        (
            "llama3",
            {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        ),
    ],
)
def test_hf_config_built_and_validated_by_its_constructor(rope_type, params):
    config = transformers.LlamaConfig(
        hidden_size=256,
        num_attention_heads=2,
        max_position_embeddings=MAX_POS,
        num_hidden_layers=1,
        vocab_size=8,
        intermediate_size=8,
        partial_rotary_factor=0.5,
        rope_parameters={"rope_type": rope_type, "rope_theta": 500000.0, **dict(params)},
    )
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, device="cpu", seq_len=3 * MAX_POS)
    ours_params = dict(params)
    if rope_type == "dynamic":
        ours_params["max_position_embeddings"] = MAX_POS
    ours = frequencies(rope_type, 64, 500000.0, ours_params, seq_len=3 * MAX_POS)
    log_base = math.log(500000.0)
    if rope_type == "dynamic":
        log_base += 64 / 62 * math.log(2.0 * 3 - 1.0)
    blend = params["factor"] if rope_type in ("yarn", "llama3") else 1.0
    compare(ours, (inv_freq.double().numpy(), scaling), log_base, dim=64, blend=blend)


# ------------------------------------------------------------------------------------
# Exactness: mpmath at 50 digits against the 40-digit decimal frequencies.


def _close(ours: decimal.Decimal, truth) -> bool:
    return abs(mpmath.mpf(str(ours)) - truth) <= mpmath.mpf(10) ** -38 * abs(truth)


def test_frequencies_agree_with_mpmath():
    with mpmath.workdps(50):
        mp = mpmath.mpf
        d, base = 128, mp(500000)
        pw = [base ** (-mp(2 * k) / d) for k in range(d // 2)]

        default = frequencies("default", d, 500000.0)
        assert all(_close(default.omega[k], pw[k]) for k in (0, 1, 37, 63))

        ntk = frequencies("ntk", d, 500000.0, {"factor": 4.0})
        base_ntk = base * mp(4) ** (mp(d) / (d - 2))
        assert _close(ntk.omega[50], base_ntk ** (-mp(100) / d))

        dyn = frequencies(
            "dynamic", d, 500000.0, {"factor": 2.5, "max_position_embeddings": 4096}, seq_len=9000
        )
        base_dyn = base * (mp(2.5) * 9000 / 4096 - mp(1.5)) ** (mp(d) / (d - 2))
        assert _close(dyn.omega[20], base_dyn ** (-mp(40) / d))

        # an untruncated ramp gives fractional weights: the interesting case
        yarn = frequencies(
            "yarn",
            d,
            500000.0,
            {"factor": 8.0, "original_max_position_embeddings": 4096, "truncate": False},
        )

        def corr(r):
            return d * mpmath.log(4096 / (2 * mpmath.pi * r)) / (2 * mpmath.log(base))

        low, high = max(corr(32), 0), min(corr(1), d - 1)
        for k in range(int(low) + 1, int(high) + 1):
            ramp = min(max((k - low) / (high - low), 0), 1)
            assert 0 < ramp < 1 or k == int(high)
            assert _close(yarn.omega[k], pw[k] * (ramp / 8 + 1 - ramp))

        llama = frequencies(
            "llama3",
            d,
            500000.0,
            {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        )
        medium = [k for k in range(d // 2) if 2048 <= 2 * mpmath.pi / pw[k] <= 8192]
        assert medium
        for k in medium:
            s = (8192 * pw[k] / (2 * mpmath.pi) - 1) / 3
            assert _close(llama.omega[k], (1 - s) * pw[k] / 8 + s * pw[k])


# ------------------------------------------------------------------------------------
# Properties.

dims = st.integers(1, 128).map(lambda h: 2 * h)
bases = st.floats(1.5, 1e7)
factors = st.floats(1.0, 1000.0)


@settings(max_examples=40, deadline=None)
@given(dim=dims, base=bases, factor=factors)
def test_linear_is_default_over_factor(dim, base, factor):
    default = frequencies("default", dim, base)
    linear = frequencies("linear", dim, base, {"factor": factor})
    f = decimal.Decimal(factor)
    ctx = schedules._CTX
    assert linear.omega == tuple(ctx.divide(w, f) for w in default.omega)
    np.testing.assert_allclose(linear.inv_freq, default.inv_freq / factor, rtol=2**-52, atol=0)


@settings(max_examples=40, deadline=None)
@given(
    dim=st.integers(2, 128).map(lambda h: 2 * h),
    base=bases,
    factor=factors,
    max_pos=st.integers(1, 1 << 20),
    data=st.data(),
)
def test_dynamic_restores_default_at_or_below_max_pos(dim, base, factor, max_pos, data):
    seq_len = data.draw(st.one_of(st.none(), st.integers(0, max_pos)))
    params = {"factor": factor, "max_position_embeddings": max_pos}
    dynamic = frequencies("dynamic", dim, base, params, seq_len=seq_len)
    assert dynamic.omega == frequencies("default", dim, base).omega
    if factor > 1:
        longer = frequencies("dynamic", dim, base, params, seq_len=max_pos + 1)
        assert all(a < b for a, b in zip(longer.omega[1:], dynamic.omega[1:], strict=True))


@settings(max_examples=25, deadline=None)
@given(dim=dims, original=st.integers(2, 1 << 20), data=st.data())
def test_longrope_switches_strictly_above_original(dim, original, data):
    factor_lists = st.lists(st.floats(0.5, 64.0), min_size=dim // 2, max_size=dim // 2)
    short, long = data.draw(factor_lists), data.draw(factor_lists)
    params = {
        "short_factor": short,
        "long_factor": long,
        "original_max_position_embeddings": original,
        "factor": 4.0,
    }
    default = frequencies("default", dim, 10000.0).omega
    ctx = schedules._CTX

    def scaled(ext):
        return tuple(ctx.divide(w, decimal.Decimal(e)) for w, e in zip(default, ext, strict=True))

    for seq_len in (None, 0, original - 1, original):
        assert frequencies("longrope", dim, 10000.0, params, seq_len=seq_len).omega == scaled(short)
    assert frequencies("longrope", dim, 10000.0, params, seq_len=original + 1).omega == scaled(long)


def test_yarn_explicit_attention_factor_wins():
    params = {"factor": 40.0, "original_max_position_embeddings": 4096}
    implied = frequencies("yarn", 64, 10000.0, params).attention_scaling
    assert implied == pytest.approx(0.1 * math.log(40.0) + 1)
    for extra in ({}, {"mscale": 1.0, "mscale_all_dim": 1.0}):
        chosen = frequencies("yarn", 64, 10000.0, {**params, **extra, "attention_factor": 0.5})
        assert chosen.attention_scaling == 0.5


def test_yarn_truncate_changes_the_ramp_and_low_equals_high_is_guarded():
    params = {"factor": 8.0, "original_max_position_embeddings": 4096}
    truncated = frequencies("yarn", 128, 500000.0, params)
    smooth = frequencies("yarn", 128, 500000.0, {**params, "truncate": False})
    assert truncated.omega != smooth.omega
    # betas this large put both correction dims in (-1, 0): after floor/ceil and the clamp
    # low == high == 0, and HF's guard (high += 0.001) keeps pair 0 and scales the rest
    same = {**params, "beta_fast": 800.0, "beta_slow": 700.0}
    guarded = frequencies("yarn", 128, 500000.0, same)
    default = frequencies("default", 128, 500000.0).omega
    ctx = schedules._CTX
    assert guarded.omega == (default[0], *(ctx.divide(w, 8) for w in default[1:]))
    compare(guarded, hf("yarn", 128, 1.0, 500000.0, same), math.log(500000.0), dim=128, blend=8.0)


# ------------------------------------------------------------------------------------
# Bad input fails loudly, naming what is wrong.


def test_unknown_type_lists_the_valid_types():
    with pytest.raises(ValueError, match="unknown rope type 'yarn2'") as info:
        frequencies("yarn2", 64, 10000.0)
    for name in ("default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope"):
        assert name in str(info.value)
    assert set(SCHEDULES) == set(PARAMETERS)


@pytest.mark.parametrize(
    ("rope_type", "params", "named"),
    [
        ("linear", {}, "needs factor"),
        ("dynamic", {"factor": 2.0}, "needs max_position_embeddings"),
        ("yarn", {"factor": 2.0}, "needs original_max_position_embeddings"),
        ("llama3", {"factor": 8.0}, "needs high_freq_factor, low_freq_factor"),
        ("longrope", {"short_factor": [1.0] * 32}, "needs long_factor, original_max"),
        ("default", {"factor": 2.0}, "does not take factor"),
        ("linear", {"factor": 2.0, "beta_fast": 32}, "does not take beta_fast"),
        (
            "yarn",
            {"factor": 2.0, "original_max_position_embeddings": 8, "rope_theta": 1.0},
            "rope_theta",
        ),
        ("proportional", {"head_dim": 64}, "does not take head_dim"),
    ],
)
def test_missing_and_extra_keys_are_named(rope_type, params, named):
    with pytest.raises(ValueError, match=named):
        frequencies(rope_type, 64, 10000.0, params)


@pytest.mark.parametrize(
    ("rope_type", "params"),
    [
        ("linear", {"factor": 0.5}),
        ("ntk", {"factor": 0.99}),
        ("dynamic", {"factor": 0.5, "max_position_embeddings": 2048}),
        ("yarn", {"factor": 0.5, "original_max_position_embeddings": 2048}),
        (
            "llama3",
            {
                "factor": 0.5,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
        (
            "longrope",
            {
                "short_factor": [1.0] * 32,
                "long_factor": [1.0] * 32,
                "original_max_position_embeddings": 2048,
                "factor": 0.5,
            },
        ),
        ("proportional", {"factor": 0.5}),
    ],
)
def test_factor_below_one_is_rejected(rope_type, params):
    with pytest.raises(ValueError, match="factor must be >= 1"):
        frequencies(rope_type, 64, 10000.0, params)


def test_odd_or_tiny_rotary_dim_is_rejected():
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        frequencies("linear", 63, 10000.0, {"factor": 2.0})
    with pytest.raises(ValueError, match="rotary_dim must be an int >= 2"):
        frequencies("default", 0, 10000.0)
    for rope_type, params in (
        ("ntk", {"factor": 2.0}),
        ("dynamic", {"factor": 2.0, "max_position_embeddings": 16}),
    ):
        with pytest.raises(ValueError, match="rotary_dim >= 4"):
            frequencies(rope_type, 2, 10000.0, params)


def test_rotary_dim_past_the_channel_limit_is_refused_before_any_frequency():
    from posenc.core.checks import MAX_CHANNELS

    # just past the limit (the far larger sizes run in a subprocess in test_rotary.py)
    for rope_type, params in (("default", {}), ("linear", {"factor": 2.0})):
        with pytest.raises(ValueError, match=f"rotary_dim must be at most {MAX_CHANNELS}"):
            frequencies(rope_type, MAX_CHANNELS + 2, 10000.0, params)


def test_other_bad_parameters_are_named():
    yarn = {"factor": 2.0, "original_max_position_embeddings": 1024}
    with pytest.raises(TypeError, match="truncate must be a bool"):
        frequencies("yarn", 64, 10000.0, {**yarn, "truncate": None})
    with pytest.raises(ValueError, match="beta_fast must be > 0"):
        frequencies("yarn", 64, 10000.0, {**yarn, "beta_fast": 0})
    with pytest.raises(ValueError, match="high_freq_factor must be > low_freq_factor"):
        llama = {"factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}
        frequencies("llama3", 64, 10000.0, {**llama, "original_max_position_embeddings": 8192})
    lists = {"short_factor": [1.0] * 32, "long_factor": [1.0] * 31}
    with pytest.raises(ValueError, match="long_factor must have rotary_dim / 2 = 32 entries"):
        frequencies("longrope", 64, 10000.0, {**lists, "original_max_position_embeddings": 8})
    lists["long_factor"] = [1.0] * 32
    with pytest.raises(ValueError, match="needs factor or max_position_embeddings"):
        frequencies("longrope", 64, 10000.0, {**lists, "original_max_position_embeddings": 8})
    with pytest.raises(ValueError, match="rotary_dim = head_dim"):
        frequencies("proportional", 32, 10000.0, {"partial_rotary_factor": 0.5}, head_dim=64)
    with pytest.raises(ValueError, match=r"partial_rotary_factor must lie in \[0, 1\]"):
        frequencies("proportional", 64, 10000.0, {"partial_rotary_factor": 1.5})


# ------------------------------------------------------------------------------------
# stretched: each context-extension schedule set for a model trained at `original` tokens

#: the schedules that extend a context; a new one registers its stretch (and the
#: context-extension study takes it from there)
EXTENDING = ("linear", "ntk", "dynamic", "yarn", "llama3", "longrope", "resonance_yarn")


def test_every_context_extension_schedule_says_how_it_stretches():
    assert tuple(schedules.STRETCH) == EXTENDING
    assert set(SCHEDULES) - set(EXTENDING) == {"default", "proportional", "resonance"}


def _params(scaling):
    return {k: v for k, v in scaling.items() if k != "rope_type"}


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
@pytest.mark.parametrize("rope_type", EXTENDING)
def test_stretched_reaches_the_factor(rope_type, factor):
    import posenc

    original, dim, base = 64, 32, 10000.0
    scaling = schedules.stretched(rope_type, factor, original, rotary_dim=dim, base=base)
    assert scaling["rope_type"] == rope_type
    longest = int(factor * original)
    ours = frequencies(rope_type, dim, base, _params(scaling), seq_len=longest)
    plain = schedules.default(dim, base, {})

    # the slowest pair (a wavelength of ~35000 tokens, far beyond `original`) is stretched
    # by the factor: exactly up to float64's rounding, and for resonance_yarn up to its
    # wavelength rounded to an integer (half a token of ~35000 * factor)
    def tol(k: int) -> float:
        rounded = rope_type == "resonance_yarn"
        return 0.5 * plain.inv_freq[k] / (2 * math.pi) / (1 - 1e-9) if rounded else 1e-12

    ratio = plain.inv_freq[-1] / ours.inv_freq[-1]
    assert abs(ratio / factor - 1) <= tol(-1)
    # the fastest pair turns many times within `original`: only position interpolation
    # (linear) moves it (resonance_yarn rounds its wavelength, 2 pi, to 6)
    fast = plain.inv_freq[0] / ours.inv_freq[0]
    assert abs(fast / (factor if rope_type == "linear" else 1.0) - 1) <= tol(0)
    # the schedules that read the length give the trained frequencies within it
    if rope_type in ("dynamic", "longrope"):
        within = frequencies(rope_type, dim, base, _params(scaling), seq_len=original)
        np.testing.assert_array_equal(within.inv_freq, plain.inv_freq)
    posenc.Rotary(dim, base=base, scaling=scaling)  # the module takes it as it is


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "llama3", "longrope"])
def test_stretched_as_transformers_reads_it(rope_type):
    # the same rope_parameters in a transformers config: HF's init functions agree
    original, factor, head_dim, base = 1024, 4.0, 64, 500000.0
    scaling = schedules.stretched(rope_type, factor, original, rotary_dim=head_dim, base=base)
    params = _params(scaling)
    longest = int(factor * original)
    hf_params = {k: v for k, v in params.items() if k != "max_position_embeddings"}
    max_pos = original if rope_type == "dynamic" else longest  # a config attribute in HF
    theirs = hf(rope_type, head_dim, 1.0, base, hf_params, seq_len=longest, max_pos=max_pos)
    ours = frequencies(rope_type, head_dim, base, params, seq_len=longest)
    log_base = math.log(base)
    if rope_type == "dynamic":
        log_base += head_dim / (head_dim - 2) * math.log(factor)
    blend = factor if rope_type in ("yarn", "llama3", "longrope") else 1.0
    compare(ours, theirs, log_base, dim=head_dim, blend=blend)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("default", 4.0, 64), "rope_type 'default' extends no context; accepted: linear, ntk"),
        (("resonance", 4.0, 64), "rope_type 'resonance' extends no context"),
        (("yarn", 1.0, 64), "factor must be > 1"),
        (("yarn", 0.5, 64), "factor must be > 1"),
        (("yarn", float("nan"), 64), "factor"),
        (("yarn", 4.0, 1), "original"),
    ],
)
def test_stretched_refuses(args, message):
    with pytest.raises(ValueError, match=message):
        schedules.stretched(*args, rotary_dim=16, base=10000.0)
    # near miss: just above 1 is a stretch
    assert schedules.stretched("yarn", 1.0 + 2**-40, 64, rotary_dim=16, base=10000.0)
