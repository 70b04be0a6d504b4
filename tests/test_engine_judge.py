"""The judge of ``posenc rope --engines`` on near misses: small, real differences are seen.

Real engine bugs are small: a base off by 0.1 %, one band of frequencies wrong, a
position off by one, YaRN's attention factor taken once where transformers' score takes
it twice (q and k each carry it), interleaved pairs where transformers rotates halves,
DeepSeek's ``mscale_all_dim`` read once into the softmax scale. Each rung of the ladder
below is the table an engine with such a bug would send, computed here in float64 from
the formulas (not by posenc) and stored in the engine's dtype (float32, bfloat16,
float16); a fake reader answers with it through the readers' protocol, and the verdict
is the one users see. Honest engines, the same angles through other float32
arithmetic (transformers' ``positions.float() * inv_freq``, ggml's ``theta *=
theta_scale``), must stay "same".

**How the tolerances are derived** (:mod:`posenc.integration.analysis.rope_compare`).
With ``u`` the unit roundoff of the engine's dtype (2**-24 float32, 2**-8 bfloat16,
2**-11 float16), ``s`` the attention scaling and ``a = p omega_k`` the exact angle of
pair ``k`` at position ``p``, a value may differ from the exact one by

- ``s (4 u + a rho64)``: cos or sin rounded to the dtype, the scaling rounded and
  multiplied in (one rounding each), one more for the engine's float32 evaluation, and
  what float64 frequencies cost (``rho64``, negligible);
- and, for tables stored in float32 or coarser, as float32 angles do: ``s (4 u +
  8 * 2**-24 + a r_k)``, ``r_k = max(rho32, (2k + 8) 2**-24)``, where ``rho32 = 2 (4 +
  ln base + factor) 2**-24 + 2**-23`` is a float32 frequency and product
  (transformers' arithmetic) and ``(2k + 8) 2**-24`` is pair ``k``'s frequency made by
  ``k`` float32 products (ggml's ``rope_cache_init``). Such tables are "same".

A change of ``delta`` in an angle moves cos or sin by at least ``|delta| / sqrt(2)``,
and the stored value rounds by up to ``u`` more; the transformers-style float32 table
the judge also compares against may itself be ``a rho32`` off the exact one. So a
miss is certainly seen when, at some ``(p, k)``, ``|delta| / sqrt(2) > 5 u + 8 *
2**-24 + a (rho32 + r_k)`` (:func:`envelope`). Each kind of miss has a derived
threshold (:func:`threshold`: the magnitude at which the largest ratio reaches 1),
and its rung sits at twice it. The attention scaling a reader reports (the norm of
its own cos/sin pair at position 0) may differ by a float32 computation (2**-20) plus
one rounding to the dtype (``u``); the softmax scale by the float32 computation alone.

**Smallest differences seen** by the values alone (Llama 3's RoPE, d = 128, base
500000, positions up to 8191; YaRN's factor for the scale), measured on a fine grid with
:func:`smallest_seen`, and the derived thresholds (:func:`threshold`) the ladder's rungs
double; the reported attention scaling is seen past ``2 u + 2**-20`` (its tolerance and
the report's own rounding):

=========  ====================  ====================  ===================  ========
dtype      base x (1 + e)        pair 32's frequency   table x (1 + e)      scaling
=========  ====================  ====================  ===================  ========
float32    9.0e-06 (1.8e-05)     5.1e-06 (9.4e-06)     6.9e-07 (7.7e-07)    1.0e-06
bfloat16   9.9e-05 (1.9e-04)     1.6e-03 (2.4e-03)     1.2e-02 (2.0e-02)    7.8e-03
float16    2.7e-05 (6.1e-05)     2.1e-04 (3.1e-04)     1.5e-03 (2.4e-03)    9.8e-04
=========  ====================  ====================  ===================  ========
"""

from __future__ import annotations

import copy
import dataclasses
import math
import pathlib
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conftest import anchor
from posenc.integration.analysis import engines, rope_compare, rope_reading
from posenc.integration.analysis.engine_cases import CASES

torch = anchor("torch")
anchor("transformers")  # the softmax scale's reference: transformers' own attention

U = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
DTYPES = list(U)
U32 = 2.0**-24

#: Llama 3's RoPE without scaling: 64 pairs of head_dim 128, base 500000.
LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
         "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 32,
         "max_position_embeddings": 8192, "rope_theta": 500000.0}  # fmt: skip
#: Position interpolation, factor 4.
LINEAR = {**LLAMA, "max_position_embeddings": 32768,
          "rope_scaling": {"rope_type": "linear", "factor": 4.0}}  # fmt: skip
#: Qwen2.5's YaRN: factor 4 from 32768, attention factor 0.1 ln 4 + 1 = 1.1386.
YARN = {**LLAMA, "model_type": "qwen2", "max_position_embeddings": 131072, "rope_theta": 1e6,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 32768}}  # fmt: skip

#: The fake engine: it answers with the tables the test put in the config.
ECHO_READER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {readers!r})
    from protocol import serve

    sys.exit(serve(lambda request: request["config"]["fake_answer"]))
    """
)

Tables = Callable[[rope_reading.Reading, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


# --------------------------------------------------------------------------------------
# Tables an engine could send, in float64 before they are stored in its dtype.


def default_omega(base: float, rotary_dim: int) -> np.ndarray:
    """``base ** (-2k / d)``, the default schedule (Su et al. 2021, section 3.4.2)."""
    return base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)


def exact(
    omega: Callable[[np.ndarray], np.ndarray] = lambda w: w,
    scale: Callable[[float], float] = lambda s: s,
    position: Callable[[np.ndarray], np.ndarray] = lambda p: p,
) -> Tables:
    """Tables from the reading's frequencies and scaling (``omega``, ``scale`` and
    ``position`` change them: a rung's miss)."""

    def tables(r: rope_reading.Reading, pos: np.ndarray, seq_len: int) -> tuple:
        if r.spec.rope_type == "default":
            w = default_omega(r.spec.base, r.spec.rotary_dim)
            s = 1.0
        else:  # a scaled schedule: posenc's frequencies (tested against transformers')
            freqs = r.spec.frequencies(seq_len=seq_len)
            w, s = np.asarray(freqs.inv_freq, dtype=np.float64), freqs.attention_scaling
        angle = position(pos.astype(np.float64))[:, None] * omega(w)[None, :]
        return np.cos(angle) * scale(s), np.sin(angle) * scale(s)

    return tables


def other_spec(**changes: Callable[[Any], object]) -> Tables:
    """Tables of the reading's schedule with some of its fields read otherwise."""

    def tables(r: rope_reading.Reading, pos: np.ndarray, seq_len: int) -> tuple:
        spec = dataclasses.replace(r.spec, **{k: f(r.spec) for k, f in changes.items()})
        freqs = spec.frequencies(seq_len=seq_len)
        angle = pos.astype(np.float64)[:, None] * np.asarray(freqs.inv_freq)[None, :]
        return np.cos(angle) * freqs.attention_scaling, np.sin(angle) * freqs.attention_scaling

    return tables


def hf_float32(r: rope_reading.Reading, pos: np.ndarray, seq_len: int) -> tuple:
    """transformers' forward: float32 ``inv_freq``, ``positions.float() * inv_freq``,
    cos and sin in float32, times the float32 attention scaling."""
    freqs = r.spec.frequencies(seq_len=seq_len)
    inv = torch.as_tensor(np.asarray(freqs.inv_freq), dtype=torch.float32)
    angle = torch.as_tensor(pos).float()[:, None] * inv[None]
    s = torch.tensor(freqs.attention_scaling, dtype=torch.float32)
    return (angle.cos() * s).double().numpy(), (angle.sin() * s).double().numpy()


def ggml_float32(r: rope_reading.Reading, pos: np.ndarray, seq_len: int) -> tuple:
    """ggml's ``rope_cache_init`` (default schedule): ``theta = p``, then for each pair
    ``cos(theta), sin(theta)`` and ``theta *= theta_scale``, all in float32, with
    ``theta_scale = base ** (-2 / d)``: pair k's frequency is k float32 products."""
    pairs = r.spec.rotary_dim // 2
    theta_scale = np.float32(r.spec.base ** (-2.0 / r.spec.rotary_dim))
    theta = pos.astype(np.float32)
    cos, sin = np.empty((pos.size, pairs)), np.empty((pos.size, pairs))
    for k in range(pairs):
        cos[:, k], sin[:, k] = np.cos(theta), np.sin(theta)
        theta = (theta * theta_scale).astype(np.float32)
    return cos, sin


def stored(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` rounded to ``dtype`` (to nearest even), back in float64."""
    return torch.as_tensor(values).to(getattr(torch, dtype)).double().numpy()


def readings_of(config: dict) -> list[rope_reading.Reading]:
    """``config``'s RoPEs as ``posenc rope`` reads a file."""
    return rope_reading.read(rope_reading.Loaded(copy.deepcopy(config), "c", "file"))


def stored_windows(config: dict, tables: Tables, dtype: str) -> list[tuple]:
    """``(window, positions, cos, sin)`` for each window the judge asks of ``config`` (one
    RoPE): ``tables`` at its positions, stored in ``dtype``."""
    readings = readings_of(config)
    (reading,) = readings
    out = []
    for w in engines.windows(readings):
        positions = np.asarray(w["positions"], dtype=np.int64)
        cos, sin = (stored(t, dtype) for t in tables(reading, positions, w["seq_len"]))
        out.append((w, positions, cos, sin))
    return out


def answer(
    config: dict, tables: Tables, dtype: str, *, layout: str = "half",
    scaling: float | None = None, softmax: float | None = None,
) -> dict:  # fmt: skip
    """The reader's answer for ``config``'s windows: ``tables`` stored in ``dtype``, the
    attention scaling read off them as the readers do (the norm of the pair at position 0,
    unless ``scaling`` says otherwise) and ``softmax``."""
    windows = [
        {"seq_len": w["seq_len"], "positions": w["positions"], "cos": c.tolist(), "sin": s.tolist()}
        for w, _, c, s in stored_windows(config, tables, dtype)
    ]
    c0, s0 = windows[0]["cos"][0][0], windows[0]["sin"][0][0]
    return {"version": "fake 3.0", "source": "test", "layout": layout, "dtype": dtype,
            "attention_scaling": math.hypot(c0, s0) if scaling is None else scaling,
            "softmax_scale": softmax, "windows": windows, "note": ""}  # fmt: skip


# --------------------------------------------------------------------------------------
# The derived thresholds.


def envelope(u: float, angle: np.ndarray, base: float, factor: float = 1.0) -> np.ndarray:
    """What a near miss must exceed at each ``(position, pair)`` (module docstring), in
    units of the attention scaling: ``5 u + 8 * 2**-24 + a (rho32 + r_k)``."""
    rho32 = 2 * (4 + math.log(base) + factor) * U32 + 2 * U32
    k = np.arange(angle.shape[-1], dtype=np.float64)
    r = np.maximum(rho32, (2 * k + 8) * U32)
    return 5 * u + 8 * U32 + np.abs(angle) * (rho32 + r)


def threshold(u: float, config: dict, change: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    """The smallest magnitude of a miss that is certainly seen: ``change(p, omega)`` is its
    angle change per unit magnitude at each ``(p, k)`` of the windows, to first order."""
    readings = readings_of(config)
    (reading,) = readings
    best = 0.0
    for w in engines.windows(readings):
        p = np.asarray(w["positions"], dtype=np.float64)[:, None]
        omega = np.asarray(reading.spec.frequencies(seq_len=w["seq_len"]).inv_freq)[None, :]
        ratio = np.abs(change(p, omega)) / math.sqrt(2) / envelope(u, p * omega, reading.spec.base)
        best = max(best, float(ratio.max()))
    return 1.0 / best


def base_change(p: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """``d angle / d ln(base) = -(2k / d) p omega_k`` of the default schedule."""
    k = np.arange(omega.shape[-1])
    return -2 * k / (2 * omega.shape[-1]) * p * omega


def band_change(pair: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Pair ``pair``'s frequency times ``1 + e``: its angle moves by ``e p omega``."""
    return lambda p, omega: np.where(np.arange(omega.shape[-1]) == pair, p * omega, 0.0)


def scale_threshold(u: float) -> float:
    """Tables times ``1 + e``: at position 0, cos = 1 moves by ``e`` (in units of the
    scaling), seen past ``5 u + 8 * 2**-24`` (the envelope at angle 0)."""
    return 5 * u + 8 * U32


# --------------------------------------------------------------------------------------
# The ladder, run by the fake engine in one child process.


def rung_magnitudes(dtype: str) -> dict[str, float]:
    """Twice each derived threshold (the rungs of the ladder for ``dtype``)."""
    u = U[dtype]
    return {
        "base": 2 * threshold(u, LLAMA, base_change),
        "band": 2 * threshold(u, LLAMA, band_change(32)),
        "scale": 2 * scale_threshold(u),
    }


def ladder(dtype: str) -> dict[str, tuple[dict, dict, str, str | None]]:
    """``name -> (config, answer, expected verdict, the cause's start or None)``."""
    m = rung_magnitudes(dtype)
    eps, band = m["base"], m["band"]
    mid = 4096  # the middle position of the window, read one position late
    yarn_m = 0.1 * math.log(4.0) + 1
    cases = {
        # honest: the exact angles, and float32 arithmetic of them
        "exact": (LLAMA, exact(), "same", None),
        "transformers float32": (LLAMA, hf_float32, "same", None),
        "ggml float32": (LLAMA, ggml_float32, "same", None),
        "yarn exact": (YARN, exact(), "same", None),
        "yarn transformers float32": (YARN, hf_float32, "same", None),
        # near misses: twice what this dtype can show
        "base near miss": (LLAMA, other_spec(base=lambda s: s.base * (1 + eps)), "different",
                           "a wrong base"),
        "one band near miss": (LLAMA, exact(omega=lambda w: w * np.where(
            np.arange(w.size) == 32, 1 + band, 1.0)), "different", None),
        # misses of the size real engines make
        "base x (1 + 1e-4)": (LLAMA, other_spec(base=lambda s: s.base * 1.0001), "different",
                              "a wrong base: their frequencies fit base 500050"),
        "base x (1 + 1e-3)": (LLAMA, other_spec(base=lambda s: s.base * 1.001), "different",
                              "a wrong base: their frequencies fit base 500500"),
        "factor off by 1e-3": (LINEAR, other_spec(params=lambda s: {**s.params, "factor": 4.004}),
                               "different", None),
        "one position off by one": (LLAMA, exact(position=lambda p: p + (p == mid)), "different",
                                    None),
        "yarn attention factor once": (YARN, exact(scale=lambda s: s / math.sqrt(yarn_m)),
                                       "different", None),
    }  # fmt: skip
    return {
        name: (config, answer(config, tables, dtype), verdict, cause)
        for name, (config, tables, verdict, cause) in cases.items()
    }


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    """The fake reader registered as engine ``mlx`` (run by this Python) for the module."""
    reader = tmp_path_factory.mktemp("echo") / "echo_reader.py"
    reader.write_text(ECHO_READER.format(readers=str(engines.READERS)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(engines.ENGINES, "mlx", engines.Engine("mlx", reader, timeout_s=120.0))
        yield pathlib.Path(sys.executable)


def judge(echo, cases: dict[str, tuple]) -> dict[str, engines.EngineResult]:
    """Every case's answer judged by ``posenc rope --engines``'s judge, in one batch."""
    configs = [{**config, "fake_answer": ans} for config, ans, *_ in cases.values()]
    return dict(zip(cases, engines.run_cases("mlx", configs, echo), strict=True))


@pytest.fixture(scope="module")
def ladders(echo):
    """``dtype -> (cases, results)``, one child process for all of them."""
    cases = {(dtype, name): case for dtype in DTYPES for name, case in ladder(dtype).items()}
    results = judge(echo, cases)
    return {d: ({n: c for (dt, n), c in cases.items() if dt == d},
                {n: r for (dt, n), r in results.items() if dt == d}) for d in DTYPES}  # fmt: skip


#: The ladder's rungs (:func:`ladder`), honest ones first.
RUNGS = [
    "exact", "transformers float32", "ggml float32", "yarn exact", "yarn transformers float32",
    "base near miss", "one band near miss", "base x (1 + 1e-4)", "base x (1 + 1e-3)",
    "factor off by 1e-3", "one position off by one", "yarn attention factor once",
]  # fmt: skip


def test_every_rung_is_tested():
    assert list(ladder("float32")) == RUNGS


@pytest.mark.parametrize("name", RUNGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_ladder(ladders, dtype, name):
    cases, results = ladders[dtype]
    _, _, verdict, cause = cases[name]
    got = results[name]
    assert got.verdict == verdict, (got.note, got.cause, got.max_abs_diff)
    if verdict == "same":
        return
    assert got.first_difference is not None or got.note, got
    if cause is not None:
        assert got.cause is not None and got.cause.startswith(cause), got.cause
    elif got.cause is not None:  # a cause named must not be float32 arithmetic
        assert not got.cause.startswith("float32 angles"), got.cause


# --------------------------------------------------------------------------------------
# What the tables alone show, in process (``rope_compare.compare``, as ``--compare`` reads).


def seen_by_tables(config: dict, tables: Tables, dtype: str) -> bool:
    """Whether the judge calls ``tables`` (stored in ``dtype``) different from the exact
    ones by their values alone: a divergence not explained as float32 angles."""
    readings = readings_of(config)
    for _, positions, cos, sin in stored_windows(config, tables, dtype):
        arrays = {"positions": positions, "cos": cos, "sin": sin}
        for v in rope_compare.compare(readings, arrays, rounding=U[dtype]):
            if not v.agree and not (v.cause or "").startswith("float32 angles"):
                return True
    return False


#: Each kind of near miss: its config, its tables at magnitude ``e`` and its threshold.
KINDS = {
    "base": (LLAMA, lambda e: other_spec(base=lambda s: s.base * (1 + e)),
             lambda u: threshold(u, LLAMA, base_change)),
    "band": (LLAMA, lambda e: exact(omega=lambda w: w * np.where(np.arange(w.size) == 32,
                                                                 1 + e, 1.0)),
             lambda u: threshold(u, LLAMA, band_change(32))),
    "scale": (YARN, lambda e: exact(scale=lambda s: s * (1 + e)), scale_threshold),
}  # fmt: skip


def smallest_seen(kind: str, dtype: str, low: float, high: float, steps: int = 24) -> float:
    """The smallest magnitude of a ``kind`` miss, on a geometric grid from ``low`` to
    ``high``, from which on every larger one is seen by the tables alone."""
    config, make, _ = KINDS[kind]
    grid = np.geomspace(low, high, steps)
    seen = [seen_by_tables(config, make(float(e)), dtype) for e in grid]
    assert seen[-1], f"{kind} in {dtype}: not seen at {high:.3g}"
    missed = [i for i, s in enumerate(seen) if not s]
    return float(grid[missed[-1] + 1 if missed else 0])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_what_the_tables_show_is_near_the_derived_threshold(dtype, kind):
    # every miss at or past its derived threshold is seen, and the judge sees no less
    # than an eighth of it: the threshold is a near miss, not a gross one (the docstring's
    # table lists the measured values)
    limit = KINDS[kind][2](U[dtype])
    smallest = smallest_seen(kind, dtype, limit / 16, limit, steps=13)
    assert limit / 8 <= smallest <= limit, (smallest, limit)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tables_off_by_a_factor_are_seen_by_their_values(dtype):
    # YaRN's attention factor times 1 + e: twice the derived threshold is seen by the
    # values alone (whatever the reported scaling says), and so is 1 + 5e-4 in float32
    config, make, limit = KINDS["scale"]
    assert seen_by_tables(config, make(2 * limit(U[dtype])), dtype)
    if dtype == "float32":
        assert seen_by_tables(config, make(5e-4), dtype)
    assert not seen_by_tables(config, make(0.0), dtype)


# --------------------------------------------------------------------------------------
# The checks beside the tables: the layout, the attention scaling, the softmax scale.

#: DeepSeek-V2-Lite's YaRN at a small factor: mscale = mscale_all_dim = 0.707, factor 1.1,
#: so get_mscale(1.1, 0.707) = 1.0067: its square in the softmax scale differs from one
#: factor of it by 0.67 %.
DEEPSEEK = CASES["yarn deepseek mscale"].data()
DEEPSEEK["rope_scaling"] = {**DEEPSEEK["rope_scaling"], "factor": 1.1, "mscale": 0.707,
                            "mscale_all_dim": 0.707}  # fmt: skip


def deepseek_softmax() -> tuple[float, float]:
    """DeepSeek's softmax scale (``DeepseekV3Attention``: ``qk_head_dim ** -0.5 * m * m``,
    ``m = 0.1 * mscale_all_dim * ln(factor) + 1``), and ``m``."""
    m = 0.1 * 0.707 * math.log(1.1) + 1
    head = DEEPSEEK["qk_nope_head_dim"] + DEEPSEEK["qk_rope_head_dim"]
    return head**-0.5 * m * m, m


def checks_beside(dtype: str) -> dict[str, tuple[dict, dict, str, str | None]]:
    """``name -> (config, answer, verdict, a note's part)`` for the layout, the reported
    scaling and the softmax scale."""
    softmax, m = deepseek_softmax()
    u = U[dtype]
    # tables times 1 + e with 2 u + 2**-20 < e < 3 u: the values stay within 4 u of the
    # exact ones (e + u), the scaling read off them is past its tolerance (e - u > u + 2**-20)
    e = {"float32": None, "bfloat16": 0.01, "float16": 1.2e-3}[dtype]
    cases = {
        "interleaved where transformers rotates halves": (
            LLAMA, answer(LLAMA, exact(), dtype, layout="interleaved"), "different",
            "layout: mlx rotates interleaved pairs, transformers half"),
        "halves where DeepSeek's checkpoint pairs are interleaved": (
            DEEPSEEK, answer(DEEPSEEK, exact(), dtype, layout="half"), "different",
            "layout: mlx rotates half pairs, transformers interleaved"),
        "deepseek honest": (
            DEEPSEEK, answer(DEEPSEEK, exact(), dtype, layout="interleaved",
                             softmax=float(np.float32(softmax))), "same", None),
        "deepseek mscale_all_dim once in the softmax scale": (
            DEEPSEEK, answer(DEEPSEEK, exact(), dtype, layout="interleaved",
                             softmax=softmax / m), "different", "softmax scale: mlx"),
        "softmax scale x 1.005": (
            DEEPSEEK, answer(DEEPSEEK, exact(), dtype, layout="interleaved",
                             softmax=softmax * 1.005), "different", "softmax scale: mlx"),
        "softmax scale x (1 + 2**-19)": (
            DEEPSEEK, answer(DEEPSEEK, exact(), dtype, layout="interleaved",
                             softmax=softmax * (1 + 2.0**-19)), "different", "softmax scale"),
    }  # fmt: skip
    if e is not None:
        assert 2 * u + 2.0**-20 < e < 3 * u
        cases["attention scaling x (1 + e)"] = (
            YARN, answer(YARN, exact(scale=lambda s: s * (1 + e)), dtype), "different",
            "attention scaling: mlx")  # fmt: skip
    return cases


@pytest.fixture(scope="module")
def beside(echo):
    cases = {(d, n): c for d in DTYPES for n, c in checks_beside(d).items()}
    return cases, judge(echo, cases)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layout_scaling_and_softmax_scale(beside, dtype):
    cases, results = beside
    names = [n for d, n in cases if d == dtype]
    for name in names:
        _, _, verdict, note = cases[dtype, name]
        got = results[dtype, name]
        assert got.verdict == verdict, (name, got.note, got.cause)
        if note is not None:
            assert note in got.note, (name, got.note)
        if name == "attention scaling x (1 + e)":
            # the values alone agree: the reported scaling is what tells
            assert all(w["same"] for w in got.windows), (name, got.windows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("config", "base", "named"),
    [
        (LLAMA, 10000.0, "base 10000 "),  # Llama 2's base read for Llama 3's
        ({**LLAMA, "rope_theta": 10000.0}, 500000.0, "base 500000 "),
        (LLAMA, 750000.0, "base 750000 "),
        (LLAMA, 500000.0 * 1.0001, "base 500050 "),
    ],
    ids=["10000 for 500000", "500000 for 10000", "x 1.5", "x (1 + 1e-4)"],
)
def test_a_wrong_base_is_named_in_every_dtype(config, base, named, dtype):
    # bfloat16's first positions cannot tell a base to 10 % (a 2**-8 rounding of an angle
    # near 1, raised to the power d / 2); its last positions, read against posenc's
    # angles, can: the cause is named there too, with the base the engine used
    ((_, positions, cos, sin),) = stored_windows(config, other_spec(base=lambda s: base), dtype)
    arrays = {"positions": positions, "cos": cos, "sin": sin}
    (verdict,) = rope_compare.compare(readings_of(config), arrays, rounding=U[dtype])
    assert not verdict.agree
    assert verdict.cause is not None and verdict.cause.startswith("a wrong base"), verdict.cause
    assert named in verdict.cause, verdict.cause
