"""The explorers' data: what the page draws is what posenc computes."""

from __future__ import annotations

import base64
import json
import math
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc.faces import explorers
from posenc.families.rotary.config import rope_spec
from posenc.families.rotary.schedules import frequencies
from posenc.integration.analysis import explorer as ex


def decode(blob):
    dtype = {"float64": "<f8", "float32": "<f4", "uint8": "u1"}[blob["dtype"]]
    raw = base64.b64decode(blob["b64"])
    if blob.get("deflate"):
        raw = zlib.decompress(raw)
    return np.frombuffer(raw, dtype=dtype).reshape(blob["shape"])


def test_arrays_are_stored_compressed_when_that_is_shorter():
    slow = explorers.encode(np.zeros((64, 64)))
    assert slow["deflate"] is True and len(slow["b64"]) < 64 * 64 * 8 / 10
    assert np.array_equal(decode(slow), np.zeros((64, 64)))
    noise = np.random.default_rng(0).integers(0, 256, 200).astype(np.uint8)
    short = explorers.encode(noise, "uint8")  # random bytes do not compress
    assert "deflate" not in short and np.array_equal(decode(short), noise)


def test_hand_pairs_at_d_512():
    assert ex.hand_pairs(256, 8) == [0, 1, 4, 10, 23, 52, 115, 255]
    assert ex.hand_pairs(5, 8) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="count"):
        ex.hand_pairs(10, 0)


@given(st.integers(1, 4096), st.integers(2, 12))
def test_hand_pairs_spread_log_uniformly(pairs, count):
    picked = ex.hand_pairs(pairs, count)
    assert picked == sorted(set(picked)) and len(picked) == min(pairs, count)
    assert picked[0] == 0 and picked[-1] == pairs - 1
    if pairs >= 8 * count:  # log spacing: the middle hand sits near the geometric middle
        expected = pairs ** ((count // 2) / (count - 1))
        assert expected / 2 <= picked[count // 2] + 1 <= expected * 2


@pytest.mark.parametrize("preset", ["vaswani", "ldm", "fairseq"])
def test_sinusoidal_data_is_the_table(preset):
    got = ex.sinusoidal_explorer(12, preset=preset, dims=(16, 64), bases=(100.0, 10000.0))
    for (dim, base), c in got["combos"].items():
        table = posenc.sinusoidal(12, dim, preset=preset, dtype="float64", base=base)
        np.testing.assert_array_equal(c["table"], table)
        np.testing.assert_array_equal(c["first"], table[:, :8])
        # each hand is (cos, sin) of one pair: on the unit circle, at omega * p
        p = np.arange(12)[:, None]
        np.testing.assert_allclose(c["sin"], np.sin(p * c["omega"]), atol=1e-12)
        np.testing.assert_allclose(c["cos"], np.cos(p * c["omega"]), atol=1e-12)


def test_sinusoidal_data_refuses_bad_sizes():
    with pytest.raises(ValueError, match="dims must be even"):
        ex.sinusoidal_explorer(8, dims=(15,))
    with pytest.raises(ValueError, match="bases must be > 1"):
        ex.sinusoidal_explorer(8, bases=(1.0,))
    with pytest.raises(ValueError, match="length"):
        ex.sinusoidal_explorer(1)


def test_rope_scores_depend_on_the_offset_only():
    r = ex.rope_explorer(head_dim=8, positions=32)
    np.testing.assert_array_equal(r["score"], r["q_rot"] @ r["k_rot"].T)
    # rotations keep norms: each |q_rot[m]| is |q|
    np.testing.assert_allclose(np.linalg.norm(r["q_rot"], axis=1), np.linalg.norm(r["q"]))
    # a score is a sum of head_dim products of size <= |q||k|: rounding of a few ulp each
    bound = 8 * r["head_dim"] * 2**-52 * np.abs(r["q"]) @ np.abs(r["k"]) * 4
    for offset in range(-30, 31):
        assert np.ptp(np.diagonal(r["score"], offset)) <= bound
    assert r["score"][0, 0] == pytest.approx(r["unrotated"], abs=bound)


def test_extension_classes_follow_each_schedule():
    got = ex.extension_explorer(128, 500000.0, trained=(8192,), factors=(8.0,))
    original = got["original"]
    case = {s.key: got["cases"][s.key, 8192, 8.0] for s in got["schedules"]}
    # linear divides every frequency: all interpolated, all angles within the trained range
    assert (case["linear"].kind == 1).all() and case["linear"].in_range.all()
    np.testing.assert_allclose(case["linear"].omega, original / 8, rtol=1e-15)
    # NTK raises the base: pair 0 kept, the last pair divided exactly by the factor
    assert case["ntk"].kind[0] == 0 and case["ntk"].kind[-1] == 1
    assert (case["ntk"].kind[1:-1] == 2).all()
    # llama3 (Meta's reference): wavelengths below 8192/4 kept, above 8192/1 divided
    wavelength = 2 * math.pi / original
    kind = case["llama3"].kind
    assert (kind[wavelength < 8192 / 4] == 0).all()
    assert (kind[wavelength > 8192] == 1).all()
    assert ((wavelength >= 8192 / 4) & (wavelength <= 8192) == (kind == 2)).all()
    assert case["yarn"].attention_scaling == pytest.approx(0.1 * math.log(8) + 1)
    # NTK leaves slow pairs out of range: at 8x the length they turn further than trained
    assert not case["ntk"].in_range.all()
    for c in case.values():
        d = ex.describe(c, 8192, 8.0)
        assert d["kept"] + d["interpolated"] + d["blended"] == 64 and d["target"] == 65536


def test_classify_and_in_range_on_hand_made_ratios():
    ratio = np.array([1.0, 0.25, 0.5, 1 + 1e-9])
    assert ex.classify(ratio, 4.0).tolist() == [0, 1, 2, 2]
    assert ex.classify(np.array([1.0]), 1.0).tolist() == [0]
    original = np.array([1.0, 1e-4, 1e-4])
    scaled = np.array([1.0, 1e-4, 0.25e-4])
    # pair 0 turns fully within 100 positions; pair 1 is not slowed; pair 2 is, by the factor
    assert ex.in_range(original, scaled, 100, 400).tolist() == [True, False, True]


def test_model_schedule_first_with_its_own_lengths():
    spec = rope_spec(
        {
            "hidden_size": 256, "num_attention_heads": 4, "rope_theta": 10000.0,
            "max_position_embeddings": 4096,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 1024, "beta_fast": 16.0},
        }
    )  # fmt: skip
    schedule, trained, factor = ex.model_schedule(spec, "config.json")
    assert (schedule.key, schedule.rope_type, trained, factor) == ("model", "yarn", 1024, 4.0)
    got = ex.extension_explorer(64, 10000.0, trained=(1024,), factors=(4.0,), schedules=[schedule])
    params = {"factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 16.0}
    want = frequencies("yarn", 64, 10000.0, params).inv_freq
    np.testing.assert_array_equal(got["cases"]["model", 1024, 4.0].omega, want)


def test_extension_refuses_bad_input():
    with pytest.raises(ValueError, match="factors must be >= 1"):
        ex.extension_explorer(64, 10000.0, factors=(0.5,))
    with pytest.raises(ValueError, match="head_dim must be even"):
        ex.extension_explorer(63, 10000.0)
    with pytest.raises(ValueError, match="rope_type"):
        ex.extension_explorer(64, 10000.0, schedules=[ex.ExtensionSchedule("x", "bogus", "bogus")])


def test_payload_round_trips_through_json():
    data = json.loads(json.dumps(explorers.payload(length=6, dim=16)))
    s = data["sinusoidal"]
    key = f"{s['dims'].index(16)}|{s['bases'].index(10000.0)}"
    first = decode(s["combos"][key]["first"])
    np.testing.assert_array_equal(first, posenc.sinusoidal(6, 16, dtype="float64")[:, :8])
    hands = decode(s["combos"][key]["cos"])
    assert hands.dtype == np.float32 and hands.shape == (6, 8)
    heat = decode(s["combos"][key]["heat"])
    lo, hi = s["combos"][key]["heat_range"]
    table = posenc.sinusoidal(6, 16, dtype="float64")
    # 256 colour levels over the table's own range: half a level of error at most
    assert np.abs(lo + heat / 255 * (hi - lo) - table).max() <= (hi - lo) / 510 + 1e-15
    e = data["extension"]
    assert e["schedules"][0]["rope_type"] == "llama3"
    d = e["default"]
    case = e["cases"][f"{d['schedule']}|{d['trained']}|{d['factor']}"]
    assert decode(case["kind"]).shape == (64,)
    assert set(decode(case["kind"]).tolist()) <= {0, 1, 2}
    r = data["rope"]
    np.testing.assert_array_equal(decode(r["score"]), ex.rope_explorer()["score"])


def test_script_text_cannot_end_the_script_element():
    assert "</script" not in explorers._script_text('{"a": "</script>"}')


def _rotate_pairs(x, positions, base):
    """``x`` rotated at positions ``0 .. positions - 1``, written out in numpy float64.

    HF's ``half`` layout: pair ``i`` is channels ``i`` and ``i + d / 2``, turned by
    ``p * omega_i`` with ``omega_i = base ** (-2 i / d)``; no posenc code involved.
    """
    half = x.size // 2
    omega = base ** (-2.0 * np.arange(half) / x.size)
    angle = np.arange(positions)[:, None] * omega[None, :]
    c, s = np.cos(angle), np.sin(angle)
    a, b = x[:half], x[half:]
    return omega, np.concatenate([a * c - b * s, a * s + b * c], axis=1)


@pytest.mark.parametrize(
    ("head_dim", "base", "positions"),
    [(8, 10000.0, 64), (16, 500000.0, 40), (2, 10.0, 5)],
    ids=["report", "d16-b500k", "d2-b10"],
)
def test_rope_explorer_equals_an_independent_rotation(head_dim, base, positions):
    r = ex.rope_explorer(head_dim=head_dim, base=base, positions=positions)
    q, k = r["q"], r["k"]
    omega, q_rot = _rotate_pairs(q, positions, base)
    _, k_rot = _rotate_pairs(k, positions, base)
    half = head_dim // 2
    assert r["pairs"].tolist() == [[i, i + half] for i in range(half)]
    u = 2.0**-53
    # omega here: the exponent -2i/d rounded once (a relative error of |ln omega| u in
    # omega) and pow within an ulp: (2 + |ln omega|) u relative; posenc's is exact
    # before one rounding (u)
    log_omega = np.abs(np.log(omega))
    assert np.all(np.abs(r["omega"] - omega) <= (3 + log_omega) * u * omega)
    # an angle p omega here is off by p omega (3 + |ln omega|) u, its cos and sin by
    # that plus 2u (numpy within an ulp); posenc's cos and sin are exact before one
    # rounding (u); each side's a c - b s rounds three times (3u (|a| + |b|)): an
    # element of a pair (a, b) differs by (|a| + |b|) eps
    p = np.arange(positions)[:, None]
    eps = p * omega * (3 + log_omega) * u + 9 * u  # (positions, half)
    tol_q = np.tile(np.abs(q[:half]) + np.abs(q[half:]), 2) * np.tile(eps, 2)
    tol_k = np.tile(np.abs(k[:half]) + np.abs(k[half:]), 2) * np.tile(eps, 2)
    assert np.all(np.abs(r["q_rot"] - q_rot) <= tol_q)
    assert np.all(np.abs(r["k_rot"] - k_rot) <= tol_k)
    # a score: the elements' errors times the other vector's, plus each side's dot
    # product of head_dim terms (head_dim u of the sum of |products|); doubled for the
    # second-order terms
    size = np.abs(q_rot) @ np.abs(k_rot).T
    tol = 2 * (tol_q @ np.abs(k_rot).T + np.abs(q_rot) @ tol_k.T + 2 * head_dim * u * size)
    assert np.all(np.abs(r["score"] - q_rot @ k_rot.T) <= tol)
    # and the explorer's score is the offset's: sum_i (q_a k_a + q_b k_b) cos((n - m) w)
    # - (q_a k_b - q_b k_a) sin((n - m) w), here from the unrotated vectors
    lag = (np.arange(positions)[None, :] - p)[..., None] * omega
    a, b = (q[:half], q[half:]), (k[:half], k[half:])
    dots = a[0] * b[0] + a[1] * b[1]
    cross = a[0] * b[1] - a[1] * b[0]
    closed = (dots * np.cos(lag) - cross * np.sin(lag)).sum(-1)
    # the lag's angle |m - n| omega (3 + |ln omega|) u off and cos, sin within 2u: per
    # term (|dots| + |cross|) of that, plus half + 2 roundings of the sums
    lag_eps = np.abs(lag) * (3 + log_omega) * u + 2 * u
    tol_closed = ((np.abs(dots) + np.abs(cross)) * lag_eps).sum(-1) + (half + 4) * u * (
        np.abs(dots) + np.abs(cross)
    ).sum()
    assert np.all(np.abs(r["score"] - closed) <= tol + 2 * tol_closed)


# ------------------------------------------------------------- timesteps and biases


@pytest.fixture(scope="module")
def timesteps():
    return ex.timestep_explorer(dims=(16, 32), last=99.5, step=0.5)


@given(st.integers(0, 199), st.integers(0, 199), st.sampled_from([16, 32]))
def test_timestep_similarity_is_the_cosine_of_the_two_embeddings(timesteps, i, j, dim):
    t = timesteps["timesteps"]
    for name in timesteps["presets"]:
        c = timesteps["combos"][name, dim]
        a, b = (posenc.sinusoidal(t[[k]], dim, preset=name, dtype="float64")[0] for k in (i, j))
        want = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
        # the curve is indexed by the offset t_j - t_i, from -(T - 1) steps
        got = c["similarity"][j - i + len(t) - 1]
        assert got == pytest.approx(want, abs=64 * dim * 2**-52)


def test_timestep_cross_cosines(timesteps):
    t = timesteps["timesteps"]
    ddpm = posenc.sinusoidal(t, 32, preset="ddpm", dtype="float64")
    ldm = posenc.sinusoidal(t, 32, preset="ldm", dtype="float64")
    want = (ddpm * ldm).sum(1) / (np.linalg.norm(ddpm, axis=1) * np.linalg.norm(ldm, axis=1))
    assert np.allclose(timesteps["cross"]["ddpm", "ldm", 32], want, rtol=0, atol=1e-14)
    assert timesteps["cross"]["ddpm", "ldm", 32][0] == 0.0  # [0 | 1] against [1 | 0]
    same = timesteps["cross"]["ddpm", "annotated-diffusion", 32]
    assert np.abs(same - 1).max() < 1e-14  # one convention under two names at even d


def test_timestep_explorer_refuses_bad_settings():
    with pytest.raises(ValueError, match="dims"):
        ex.timestep_explorer(dims=(33,))
    with pytest.raises(ValueError, match="preset"):
        ex.timestep_explorer(presets=("ddpm", "nope"))
    with pytest.raises(ValueError, match="step"):
        ex.timestep_explorer(step=0.0)


def test_timestep_payload_stores_equal_tables_once():
    got = explorers.payload(length=8, dim=16)["timestep"]
    names = got["presets"]
    ddpm, annotated = names.index("ddpm"), names.index("annotated-diffusion")
    for d in range(len(got["dims"])):
        assert got["combos"][f"{annotated}|{d}"] == {"same": f"{ddpm}|{d}"}
        levels = decode(got["combos"][f"{ddpm}|{d}"]["levels"])  # (d, T): channel by channel
        table = posenc.sinusoidal(
            np.arange(got["timesteps"]["count"]) * got["timesteps"]["step"],
            got["dims"][d],
            preset="ddpm",
            dtype="float64",
        )
        assert np.abs(levels.T / 127.5 - 1 - table).max() <= 0.5 / 127.5 + 1e-12


def test_bias_explorer_weights_are_the_softmax_of_the_bias():
    alibi, t5 = posenc.ALiBi(4), posenc.T5Bias(4, bidirectional=False)
    got = ex.bias_explorer({"alibi": alibi, "t5": t5}, 40)
    for entry in got.values():
        w = entry["weights"]
        assert np.allclose(w.sum(-1), 1, atol=1e-12)
        assert (np.triu(w, 1) == 0).all() and (np.triu(entry["bias"], 1) == 0).all()
    # ALiBi: weights exp(-m d) over d = 0..i, so the mean distance has a closed form
    m = posenc.alibi_slopes(4)
    d = np.arange(40)
    for h in range(4):
        e = np.exp(-m[h] * d)
        want = (d * e).sum() / e.sum()
        assert got["alibi"]["mean_distance"][h, 39] == pytest.approx(want, rel=1e-12)
        assert got["alibi"]["self_weight"][h, 39] == pytest.approx(1 / e.sum(), rel=1e-12)
    assert "buckets" not in got["alibi"]
    assert (
        got["t5"]["buckets"].tolist()
        == posenc.t5_bucket(-np.arange(40), bidirectional=False).tolist()
    )
    with pytest.raises(ValueError, match="modules"):
        ex.bias_explorer({}, 10)
    with pytest.raises(ValueError, match="length"):
        ex.bias_explorer({"alibi": alibi}, 1)
