"""KV-cache re-rotation: keys cached under one length's RoPE tables moved to another's.

Every comparison is with the keys recomputed from the unrotated ones with the new
tables. Tolerances, per channel, in units of ``u = 2**-24`` (float32's unit
roundoff) times the attention scaling ``a`` and the norm ``r`` of the channel's pair:

- one float32 rotation by tables rounded once is within ``3 u a r`` of exact (the
  tables' rounding, ``|x1| |dc| + |x2| |ds| <= u a r`` by Cauchy-Schwarz, then the two
  products' and the sum's roundings); the cached keys, their re-rotation and the
  recomputation add up to ``9 u a_new r`` (the exact engine's angles err by about
  1e-15 radians: negligible at any position);
- HF's own tables are off by ``t = a (P max(omega) (delta + 2**-24) + 2**-22)`` over
  positions up to ``P`` (tests/test_hf.py derives it: ``delta`` is the relative error
  of HF's float32 ``inv_freq``, measured from the module and checked against its
  bound), so its rotation of a pair errs by ``sqrt(2) r t`` more: keys cached by HF and
  re-rotated differ from HF's recomputation by ``sqrt(2) r (t_old + t_new) + 9 u a r``.

Logits go through the model: as in tests/test_hf.py, a relative key error ``e`` moves
them by at most ``10 e max|logits|`` (bounded loosely, not derived).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest

from conftest import anchor

torch = anchor("torch")
transformers = anchor("transformers")

from posenc import Rotary, hf  # noqa: E402
from posenc.families.rotary.apply import apply_rotary  # noqa: E402
from posenc.families.rotary.rerotate import rerotate_keys, rerotation_cos_sin  # noqa: E402
from posenc.families.rotary.schedules import RopeFrequencies, frequencies  # noqa: E402
from posenc.families.rotary.tables import cos_sin  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_transformers")

U = 2.0**-24
#: the cached keys', the re-rotation's and the recomputation's roundings (module docstring)
ROTATIONS = 9
BF16_U = 2.0**-8


def _pair_norms(k: Any, rotary_dim: int, layout: str) -> Any:
    """Per rotated channel, the norm of the pair it belongs to (float64)."""
    k = k[..., :rotary_dim].to(torch.float64)
    if layout == "half":
        h = rotary_dim // 2
        r = torch.sqrt(k[..., :h] ** 2 + k[..., h:] ** 2)
        return torch.cat([r, r], dim=-1)
    r = torch.sqrt(k[..., 0::2] ** 2 + k[..., 1::2] ** 2)
    return r.repeat_interleave(2, dim=-1)


def _ratio(out: Any, ref: Any, bound: Any) -> float:
    """``max |out - ref| / bound`` over the rotated channels: at most 1 when within bound."""
    diff = (out.to(torch.float64) - ref.to(torch.float64)).abs()
    return float((diff / bound).max())


def _positions(seed: int = 0) -> Any:
    """Small positions, 100k, and random ones up to the exact engine's limit."""
    gen = torch.Generator().manual_seed(seed)
    far = torch.randint(0, 2**31 - 1, (60,), generator=gen)
    return torch.cat([torch.arange(64), torch.tensor([99_999, 100_000, 2**31 - 1]), far])


def _rotate(k: Any, positions: Any, freqs: RopeFrequencies, layout: str) -> Any:
    c, s = cos_sin(positions, freqs, layout=layout)
    return apply_rotary(k, c, s, layout=layout, rotary_dim=c.shape[-1])


def _longrope(rotary_dim: int) -> dict[str, Any]:
    count = rotary_dim // 2
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(count)],
        "long_factor": [1.0 + 0.5 * i for i in range(count)],
        "original_max_position_embeddings": 4096,
        "factor": 32.0,
    }


# --------------------------------------------------------------------------------------
# posenc: Rotary.rerotate and rerotate_keys.

SCHEDULE_CASES = {
    # name: (scaling(rotary_dim), max_position_embeddings, old_len, new_len)
    "dynamic-grown": (lambda rd: {"rope_type": "dynamic", "factor": 4.0}, 4096, 5000, 200_000),
    "dynamic-original": (lambda rd: {"rope_type": "dynamic", "factor": 4.0}, 4096, 100, 131_072),
    "dynamic-restore": (lambda rd: {"rope_type": "dynamic", "factor": 4.0}, 4096, 200_000, 10),
    "longrope-short-to-long": (_longrope, None, 4096, 4097),
    "longrope-long-to-short": (_longrope, None, 8192, 100),
}


@pytest.mark.parametrize("case", list(SCHEDULE_CASES))
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [64, 24])
def test_rotary_rerotate_equals_the_new_tables(case: str, layout: str, rotary_dim: int) -> None:
    scaling, max_pos, old_len, new_len = SCHEDULE_CASES[case]
    rope = Rotary(
        64,
        rotary_dim=rotary_dim,
        layout=layout,
        scaling=scaling(rotary_dim),
        max_position_embeddings=max_pos,
    )
    inv_freq = rope.inv_freq.clone()
    positions = _positions()
    old, new = rope._frequencies(old_len), rope._frequencies(new_len)
    assert old.omega != new.omega  # the tables do change
    k = torch.randn(2, 3, positions.numel(), 64, generator=torch.Generator().manual_seed(1))
    cached = _rotate(k, positions, old, layout)
    ref = _rotate(k, positions, new, layout)

    out = rope.rerotate(cached, positions, old_len=old_len, new_len=new_len)

    assert out.shape == k.shape and out.dtype == k.dtype
    bound = ROTATIONS * U * new.attention_scaling * _pair_norms(k, rotary_dim, layout)
    assert _ratio(out[..., :rotary_dim], ref[..., :rotary_dim], bound) <= 1.0
    assert torch.equal(out[..., rotary_dim:], k[..., rotary_dim:])  # partial: passed through
    assert torch.equal(rope.inv_freq, inv_freq)  # the module's own frequencies stay


def test_rotary_rerotate_defaults_to_a_whole_sequence_and_seq_before_heads() -> None:
    rope = Rotary(
        32, scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=64, seq_dim=-3
    )
    k = torch.randn(2, 300, 4, 32, generator=torch.Generator().manual_seed(2))
    positions = torch.arange(300)
    old, new = rope._frequencies(100), rope._frequencies(300)
    c, s = cos_sin(positions, old)
    cached = apply_rotary(k, c[:, None], s[:, None])
    c, s = cos_sin(positions, new)
    ref = apply_rotary(k, c[:, None], s[:, None])

    out = rope.rerotate(cached, old_len=100, new_len=300)

    bound = ROTATIONS * U * _pair_norms(k, 32, "half")
    assert _ratio(out, ref, bound) <= 1.0


@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_rerotate_keys_per_row_positions(seq_dim: int) -> None:
    # left-padded rows: each batch row has its own positions
    old = frequencies(
        "dynamic", 32, 10000.0, {"factor": 2.0, "max_position_embeddings": 64}, seq_len=80
    )
    new = frequencies(
        "dynamic", 32, 10000.0, {"factor": 2.0, "max_position_embeddings": 64}, seq_len=5000
    )
    positions = torch.stack([torch.arange(50), torch.arange(50) + 30_000])
    k = torch.randn(2, 3, 50, 32, generator=torch.Generator().manual_seed(3))
    cached = torch.stack([_rotate(k[i], positions[i], old, "half") for i in range(2)])
    ref = torch.stack([_rotate(k[i], positions[i], new, "half") for i in range(2)])
    if seq_dim == -3:
        cached, ref, k = (t.transpose(1, 2) for t in (cached, ref, k))

    out = rerotate_keys(cached, positions, old, new, seq_dim=seq_dim)

    assert _ratio(out, ref, ROTATIONS * U * _pair_norms(k, 32, "half")) <= 1.0


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rerotate_keys_rescales_the_attention_scaling(layout: str) -> None:
    # YaRN at two factors: other frequencies and another mscale (1.069 and 1.277)
    def yarn(factor: float) -> RopeFrequencies:
        params = {"factor": factor, "original_max_position_embeddings": 4096}
        return frequencies("yarn", 64, 10000.0, params)

    pairs = [
        (yarn(2.0), yarn(16.0)),
        (yarn(16.0), yarn(2.0)),
        (frequencies("default", 64, 1e4), yarn(8.0)),
    ]
    positions = _positions(4)
    k = torch.randn(3, positions.numel(), 64, generator=torch.Generator().manual_seed(4))
    for old, new in pairs:
        assert old.attention_scaling != new.attention_scaling
        cached = _rotate(k, positions, old, layout)
        ref = _rotate(k, positions, new, layout)
        out = rerotate_keys(cached, positions, old, new, layout=layout)
        bound = ROTATIONS * U * new.attention_scaling * _pair_norms(k, 64, layout)
        assert _ratio(out, ref, bound) <= 1.0


def test_rerotate_keys_is_exact_where_float32_angle_differences_are_not() -> None:
    # the usual way, float32 angles p * inv_freq subtracted, errs by p * omega * 2**-24:
    # at 100k far beyond one rounding, which the exact difference stays within
    params = {"factor": 4.0, "max_position_embeddings": 4096}
    old = frequencies("dynamic", 64, 10000.0, params, seq_len=5000)
    new = frequencies("dynamic", 64, 10000.0, params, seq_len=200_000)
    positions = torch.arange(100_000, 100_064)
    k = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(5))
    cached = _rotate(k, positions, old, "half")
    ref = _rotate(k, positions, new, "half")
    bound = ROTATIONS * U * _pair_norms(k, 64, "half")

    p = positions.float()[:, None]
    inv_old = torch.tensor(old.inv_freq, dtype=torch.float32)
    inv_new = torch.tensor(new.inv_freq, dtype=torch.float32)
    angle = torch.cat([p * inv_new - p * inv_old] * 2, dim=-1)
    naive = apply_rotary(cached, angle.cos(), angle.sin())
    assert _ratio(naive, ref, bound) > 100.0

    assert _ratio(rerotate_keys(cached, positions, old, new), ref, bound) <= 1.0


def test_rerotate_keys_same_tables_is_the_identity_and_back_is_the_inverse() -> None:
    params = {k: v for k, v in _longrope(32).items() if k != "rope_type"}
    old = frequencies("longrope", 32, 10000.0, params, seq_len=10)
    new = frequencies("longrope", 32, 10000.0, params, seq_len=5000)
    positions = _positions(6)
    k = torch.randn(2, positions.numel(), 40, generator=torch.Generator().manual_seed(6))
    c, s = rerotation_cos_sin(positions, old, old)
    assert torch.equal(c, torch.ones_like(c)) and torch.equal(s, torch.zeros_like(s))
    assert torch.equal(rerotate_keys(k, positions, old, old), k)
    there_and_back = rerotate_keys(rerotate_keys(k, positions, old, new), positions, new, old)
    # two float32 rotations of exact tables: 3 u r each
    assert _ratio(there_and_back[..., :32], k[..., :32], 6 * U * _pair_norms(k, 32, "half")) <= 1
    assert torch.equal(there_and_back[..., 32:], k[..., 32:])


def test_rerotate_keys_bfloat16_rounds_once_more() -> None:
    # cached keys rounded to bfloat16 (u_b = 2**-8 per channel: the pair's error vector
    # sqrt(2) u_b a r, rotated), the re-rotation rounded again (u_b a r), the
    # recomputation once (u_b a r): (2 + sqrt(2)) u_b a r, plus the float32 arithmetic
    params = {"factor": 4.0, "max_position_embeddings": 4096}
    old = frequencies("dynamic", 64, 10000.0, params, seq_len=5000)
    new = frequencies("dynamic", 64, 10000.0, params, seq_len=200_000)
    positions = _positions(7)
    k = torch.randn(2, 2, positions.numel(), 64, generator=torch.Generator().manual_seed(7))
    k = k.to(torch.bfloat16)
    cached = _rotate(k, positions, old, "half")
    ref = _rotate(k, positions, new, "half")
    out = rerotate_keys(cached, positions, old, new)
    assert out.dtype == torch.bfloat16
    bound = ((2 + math.sqrt(2)) * BF16_U + ROTATIONS * U) * _pair_norms(k, 64, "half")
    assert _ratio(out, ref, bound) <= 1.0


def test_rerotate_keys_of_an_empty_cache() -> None:
    old = frequencies("default", 16, 10000.0)
    new = frequencies("linear", 16, 10000.0, {"factor": 2.0})
    out = rerotate_keys(torch.zeros(1, 2, 0, 16), torch.zeros(0, dtype=torch.int64), old, new)
    assert out.shape == (1, 2, 0, 16)


def _bad_rerotate_keys() -> list[tuple[dict[str, Any], type, str]]:
    f16 = frequencies("default", 16, 10000.0)
    f8 = frequencies("default", 8, 10000.0)
    k = torch.zeros(1, 2, 5, 16)
    p = torch.arange(5)
    base = {"keys": k, "positions": p, "old": f16, "new": f16}
    return [
        ({**base, "keys": k.numpy()}, TypeError, "keys"),
        ({**base, "keys": k.long()}, TypeError, "keys"),
        ({**base, "keys": torch.zeros(1, 2, 5, 8)}, ValueError, "keys"),
        ({**base, "keys": torch.zeros(16)}, ValueError, "keys"),
        ({**base, "positions": [0, 1, 2, 3, 4]}, TypeError, "positions"),
        ({**base, "positions": p > 2}, TypeError, "positions"),
        ({**base, "positions": torch.arange(6)}, ValueError, "positions"),
        ({**base, "positions": torch.zeros(3, 5, dtype=torch.int64)}, ValueError, "positions"),
        ({**base, "positions": torch.zeros(1, 1, 5, dtype=torch.int64)}, ValueError, "positions"),
        ({**base, "positions": p + 2**31}, ValueError, "positions"),
        (
            {**base, "positions": torch.tensor([0.0, 1, 2, 3, float("nan")])},
            ValueError,
            "positions",
        ),
        ({**base, "old": f16.inv_freq}, TypeError, "old"),
        ({**base, "new": None}, TypeError, "new"),
        ({**base, "new": f8}, ValueError, "old and new"),
        ({**base, "old": RopeFrequencies(f16.omega, 0.0)}, ValueError, "old.attention_scaling"),
        ({**base, "layout": "neox"}, ValueError, "layout"),
        ({**base, "seq_dim": -1}, ValueError, "seq_dim"),
        ({**base, "seq_dim": True}, ValueError, "seq_dim"),
    ]


@pytest.mark.parametrize(("kwargs", "exc", "named"), _bad_rerotate_keys())
def test_rerotate_keys_names_bad_input(kwargs: dict[str, Any], exc: type, named: str) -> None:
    with pytest.raises(exc, match=named):
        rerotate_keys(**kwargs)


def test_rotary_rerotate_names_bad_input() -> None:
    dynamic = Rotary(
        16, scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=32
    )
    k = torch.zeros(1, 2, 5, 16)
    with pytest.raises(ValueError, match=r"rope type 'default'.*never need"):
        Rotary(16).rerotate(k, old_len=10, new_len=100)
    with pytest.raises(ValueError, match="rope type 'yarn'"):
        Rotary(
            16, scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8}
        ).rerotate(k, old_len=10, new_len=100)
    with pytest.raises(ValueError, match="old_len"):
        dynamic.rerotate(k, old_len=0, new_len=100)
    with pytest.raises(TypeError, match="new_len"):
        dynamic.rerotate(k, old_len=10, new_len=100.0)
    with pytest.raises(ValueError, match="head_dim=16"):
        dynamic.rerotate(torch.zeros(1, 2, 5, 8), old_len=10, new_len=100)
    with pytest.raises(TypeError, match="keys"):
        dynamic.rerotate(k.int(), old_len=10, new_len=100)
    with pytest.raises(ValueError, match="positions"):
        dynamic.rerotate(k, torch.arange(4), old_len=10, new_len=100)


# --------------------------------------------------------------------------------------
# posenc.hf.rerotate_cache against transformers' own rotary modules.

TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "vocab_size": 100,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _config(family: str, **extra: Any) -> Any:
    if family == "llama":
        return transformers.LlamaConfig(
            **{
                **TINY,
                "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
                "max_position_embeddings": 64,
                **extra,
            }
        )
    if family == "glm":  # interleaved pairs, half the head rotates
        return transformers.GlmConfig(
            **TINY,
            rope_parameters={
                "rope_type": "dynamic",
                "rope_theta": 10000.0,
                "factor": 3.0,
                "partial_rotary_factor": 0.5,
            },
            max_position_embeddings=64,
            head_dim=16,
            **extra,
        )
    assert family == "phi3"  # half the head rotates
    return transformers.Phi3Config(
        **TINY,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0, 1.0, 1.1, 1.3],
            "long_factor": [1.0, 2.0, 4.0, 8.0],
            "partial_rotary_factor": 0.5,
        },
        max_position_embeddings=512,
        original_max_position_embeddings=128,
        **extra,
    )


HF_CASES = {
    # name: (family, modeling module, rotary class, old_len, new_len)
    "llama-dynamic-grown": ("llama", "llama", "LlamaRotaryEmbedding", 80, 200),
    "llama-dynamic-original": ("llama", "llama", "LlamaRotaryEmbedding", 40, 300),
    "glm-dynamic-interleaved-partial": ("glm", "glm", "GlmRotaryEmbedding", 100, 250),
    "phi3-longrope-short-to-long": ("phi3", "phi3", "Phi3RotaryEmbedding", 100, 300),
    "phi3-longrope-long-to-short": ("phi3", "phi3", "Phi3RotaryEmbedding", 300, 100),
}


def _hf_table_error(module: Any, spec: Any, length: int, positions: int) -> float:
    """Bound on HF's table error over ``positions`` positions for a call of ``length``."""
    freqs = spec.frequencies(length)
    theirs = module.inv_freq.detach().to(torch.float64).numpy()
    delta = float(np.max(np.abs(theirs / freqs.inv_freq - 1)))
    factor = max(float(spec.params.get("factor") or 1.0), 1.0)
    assert delta <= (4 + math.log(spec.base) + factor) * 2.0**-23  # HF's inv_freq, bounded
    top = float(np.max(freqs.inv_freq))
    return freqs.attention_scaling * (positions * top * (delta + U) + 2.0**-22)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_rerotate_cache_equals_hf_recomputed_keys(case: str) -> None:
    family, modeling_name, rotary_name, old_len, new_len = HF_CASES[case]
    config = _config(family)
    modeling = getattr(transformers.models, modeling_name)
    modeling = getattr(modeling, f"modeling_{modeling_name}")
    spec = hf.rope_spec(config)
    tokens = min(old_len, new_len)  # the cache holds the shorter sequence's tokens
    gen = torch.Generator().manual_seed(8)
    k = torch.randn(2, 2, tokens, spec.head_dim, generator=gen)
    x = torch.zeros(1)

    def hf_keys(length: int) -> tuple[Any, float]:
        rotary = getattr(modeling, rotary_name)(config)  # fresh: dynamic keeps state
        cos, sin = rotary(x, torch.arange(length)[None])
        _, keys = modeling.apply_rotary_pos_emb(k, k, cos[:, :tokens], sin[:, :tokens])
        return keys, _hf_table_error(rotary, spec, length, tokens)

    cached, t_old = hf_keys(old_len)
    ref, t_new = hf_keys(new_len)
    cache = transformers.DynamicCache()
    for layer in range(2):
        cache.update(cached.clone(), torch.zeros_like(cached), layer)

    assert hf.rerotate_cache(config, cache, old_len, new_len) is cache

    rd, layout = spec.rotary_dim, spec.layout
    a_new = spec.frequencies(new_len).attention_scaling
    ratio = a_new / spec.frequencies(old_len).attention_scaling
    r = _pair_norms(k, rd, layout)
    bound = math.sqrt(2) * r * (ratio * t_old + t_new) + ROTATIONS * U * a_new * r
    for layer in cache.layers:
        assert _ratio(layer.keys[..., :rd], ref[..., :rd], bound) <= 1.0
        assert torch.equal(layer.keys[..., rd:], cached[..., rd:])
        assert torch.equal(layer.values, torch.zeros_like(cached))


def _exact_keys(k: Any, positions: Any, spec: Any, lengths: list[int]) -> Any:
    """``k`` rotated at each position with the exact tables of its own length."""
    out = torch.empty_like(k)
    for i, length in enumerate(lengths):
        c, s = cos_sin(positions[i : i + 1], spec.frequencies(length), layout=spec.layout)
        out[..., i : i + 1, :] = apply_rotary(
            k[..., i : i + 1, :], c, s, layout=spec.layout, rotary_dim=spec.rotary_dim
        )
    return out


def test_rerotate_cache_per_token_lengths_static_and_sliding_layers() -> None:
    # keys cached as HF's generate leaves them past max_position_embeddings: a prefill
    # of 70 under its tables, then one decode step per token, each under a grown base
    config = _config("llama")
    spec = hf.rope_spec(config)
    n, prefill, window = 90, 70, 16
    lengths = [prefill] * prefill + list(range(prefill + 1, n + 1))
    positions = torch.arange(n)
    k = torch.randn(1, 2, n, spec.head_dim, generator=torch.Generator().manual_seed(9))
    cached = _exact_keys(k, positions, spec, lengths)
    ref = _exact_keys(k, positions, spec, [n + 10] * n)

    cu = transformers.cache_utils
    static = transformers.StaticCache(config=config, max_cache_len=128)
    dynamic = transformers.cache_utils.Cache(
        layers=[cu.DynamicLayer(), cu.DynamicSlidingWindowLayer(sliding_window=window)]
    )
    for cache in (static, dynamic):
        for layer in range(2):
            cache.update(cached[..., :prefill, :], cached[..., :prefill, :], layer)
            for i in range(prefill, n):  # one decode step at a time, as generate does
                cache.update(cached[..., i : i + 1, :], cached[..., i : i + 1, :], layer)
        hf.rerotate_cache(config, cache, lengths, n + 10)

    bound = ROTATIONS * U * _pair_norms(k, spec.rotary_dim, "half")
    assert static.layers[0].keys.shape[-2] == 128  # the static buffer, filled in place
    for layer in static.layers:
        assert _ratio(layer.keys[..., :n, :], ref, bound) <= 1.0
        assert not layer.keys[..., n:, :].any()  # empty slots stay empty
    assert _ratio(dynamic.layers[0].keys, ref, bound) <= 1.0
    held = dynamic.layers[1].keys.shape[-2]
    assert held == window - 1  # the window's last tokens
    assert _ratio(dynamic.layers[1].keys, ref[..., -held:, :], bound[..., -held:, :]) <= 1.0
    assert torch.equal(dynamic.layers[1].values, cached[..., -held:, :])  # values untouched


def test_rerotate_cache_with_left_padded_positions() -> None:
    config = _config("phi3")
    spec = hf.rope_spec(config)
    positions = torch.stack([torch.arange(150), (torch.arange(150) - 20).clamp(min=1)])
    k = torch.randn(2, 2, 150, spec.head_dim, generator=torch.Generator().manual_seed(10))
    cached = torch.stack(
        [_exact_keys(k[i : i + 1], positions[i], spec, [100] * 150)[0] for i in range(2)]
    )
    ref = torch.stack(
        [_exact_keys(k[i : i + 1], positions[i], spec, [200] * 150)[0] for i in range(2)]
    )
    cache = transformers.DynamicCache()
    cache.update(cached.clone(), cached.clone(), 0)
    hf.rerotate_cache(config, cache, 100, 200, positions=positions)
    bound = ROTATIONS * U * spec.frequencies(200).attention_scaling
    bound = bound * _pair_norms(k, spec.rotary_dim, "half")
    assert (
        _ratio(cache.layers[0].keys[..., : spec.rotary_dim], ref[..., : spec.rotary_dim], bound)
        <= 1
    )


def _refusals() -> list[tuple[Any, Any, dict[str, Any], type, str]]:
    llama = _config("llama")
    cu = transformers.cache_utils

    def filled(*layers: Any, head_dim: int = 16, tokens: int = 5) -> Any:
        cache = cu.Cache(layers=list(layers))
        for i in range(len(layers)):
            key = torch.zeros(1, 2, tokens, head_dim)
            cache.update(key, key, i)
        return cache

    own_layer = type("OwnLayer", (cu.DynamicLayer,), {})  # a layer kind it does not know
    default = transformers.LlamaConfig(**TINY)
    yarn = transformers.LlamaConfig(
        **TINY,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0},
        max_position_embeddings=64,
    )
    per_type = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 2.0},
        },
        "max_position_embeddings": 64,
    }
    mrope = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
    }
    ok = filled(cu.DynamicLayer())
    return [
        (default, ok, {}, ValueError, "'default' has the same tables"),
        (yarn, ok, {}, ValueError, "'yarn' has the same tables"),
        (per_type, ok, {}, ValueError, "one RoPE per layer type"),
        (mrope, ok, {}, ValueError, "M-RoPE"),
        ({"rope_parameters": "dynamic"}, ok, {}, TypeError, "rope_parameters"),
        ({"rope_parameters": {"rope_type": "dynamic"}}, ok, {}, ValueError, "model_or_config"),
        (llama, [(torch.zeros(1), torch.zeros(1))], {}, TypeError, "cache must be a transformers"),
        (llama, filled(own_layer()), {}, ValueError, r"cache.layers\[0\] is a OwnLayer"),
        (llama, filled(cu.DynamicLayer(), head_dim=8), {}, ValueError, "head_dim=16"),
        (
            llama,
            filled(cu.DynamicLayer(), cu.DynamicLayer(), tokens=5),
            {"old_len": [10] * 4},
            ValueError,
            "old_len",
        ),
        (llama, ok, {"old_len": 0}, ValueError, "old_len"),
        (llama, ok, {"old_len": [10, 10, 10, 10, 10.0]}, TypeError, r"old_len\[4\]"),
        (llama, ok, {"old_len": torch.ones(5)}, TypeError, "old_len"),
        (llama, ok, {"new_len": "100"}, TypeError, "new_len"),
        (llama, ok, {"positions": torch.arange(6)}, ValueError, "positions"),
        (llama, ok, {"positions": torch.zeros(3, 5, dtype=torch.int64)}, ValueError, "positions"),
        (llama, ok, {"positions": torch.arange(5.0)}, TypeError, "positions"),
    ]


@pytest.mark.parametrize(("config", "cache", "kwargs", "exc", "named"), _refusals())
def test_rerotate_cache_refuses_what_it_cannot_do(
    config: Any, cache: Any, kwargs: dict[str, Any], exc: type, named: str
) -> None:
    layers = getattr(cache, "layers", [])
    before = [layer.keys.clone() for layer in layers]
    args = {"old_len": 10, "new_len": 100, **kwargs}
    with pytest.raises(exc, match=named):
        hf.rerotate_cache(config, cache, **args)
    for layer, keys in zip(layers, before, strict=True):
        assert torch.equal(layer.keys, keys)  # a refusal changes nothing


def test_rerotate_cache_refuses_inconsistent_layers_before_changing_any() -> None:
    cu = transformers.cache_utils
    cache = cu.Cache(layers=[cu.DynamicLayer(), cu.DynamicLayer()])
    cache.update(torch.ones(1, 2, 5, 16), torch.ones(1, 2, 5, 16), 0)
    cache.update(torch.ones(1, 2, 4, 16), torch.ones(1, 2, 4, 16), 1)
    with pytest.raises(ValueError, match="disagree"):
        hf.rerotate_cache(_config("llama"), cache, 80, 100)
    assert torch.equal(cache.layers[0].keys, torch.ones(1, 2, 5, 16))


def test_rerotate_cache_skips_empty_layers_and_takes_a_model() -> None:
    config = _config("llama", num_hidden_layers=1)
    model = transformers.LlamaForCausalLM(config)
    cache = transformers.DynamicCache()
    assert hf.rerotate_cache(model, cache, 80, 100) is cache  # nothing cached yet


# --------------------------------------------------------------------------------------
# End to end: a random-weight Llama decoding past max_position_embeddings.

MAX_POSITIONS = 32  # dynamic grows its base for any longer call


def _llama_model(layers: int, patched: bool) -> Any:
    torch.manual_seed(0)
    config = _config(
        "llama",
        num_hidden_layers=layers,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 8.0},
        initializer_range=0.5,  # as in tests/test_hf.py: attention sharp enough to feel positions
    )
    model = transformers.LlamaForCausalLM(config).double().eval()  # float64: only tables differ
    return hf.patch_model(model) if patched else model


def _cache(cache: Any) -> dict[str, Any]:
    """The keyword a causal LM's forward takes its KV cache by: ``cache`` from
    transformers 5.24 (``past_key_values`` is deprecated there), before it
    ``past_key_values``."""
    import inspect

    from transformers import LlamaForCausalLM

    name = (
        "cache"
        if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters
        else ("past_key_values")
    )
    return {name: cache}


def _hf_key_error(spec: Any, positions: int) -> float:
    """Relative error of HF-cached keys, re-rotated, against HF's recomputation (docstring).

    With HF's ``inv_freq`` error at its bound (``(4 + ln base + factor) 2**-23``) and
    the largest frequency 1 (dynamic never scales ``k = 0``), for every table involved.
    """
    delta = (4 + math.log(spec.base) + spec.params["factor"]) * 2.0**-23
    return math.sqrt(2) * 2 * (positions * (delta + U) + 2.0**-22)


# float64 model with posenc's exact tables: cos/sin within 1e-15 (the engine) per entry
# in both paths, and float64 roundings (2**-53) of the rotations and of the two paths'
# summation orders over the 64 hidden channels
EXACT_F64_KEY_ERROR = math.sqrt(2) * 2 * 1e-15 + 64 * 2.0**-53


@pytest.mark.parametrize("patched", [False, True], ids=["hf-tables", "posenc-tables"])
def test_rerotated_cache_decodes_as_a_re_prefill(patched: bool) -> None:
    # one layer: its keys and values are functions of the tokens alone, so a re-rotated
    # cache is exactly what a re-prefill caches, and the next logits must agree
    model = _llama_model(1, patched)
    spec = hf.rope_spec(model.config)
    stale_model, ref_model = copy.deepcopy(model), copy.deepcopy(model)
    ids = torch.randint(3, 100, (2, 48), generator=torch.Generator().manual_seed(11))
    prefill = 40  # past max_position_embeddings: the prefill's own grown base
    cache, stale = transformers.DynamicCache(), transformers.DynamicCache()
    worst_stale = 0.0
    with torch.no_grad():
        model(ids[:, :prefill], **_cache(cache))
        stale_model(ids[:, :prefill], **_cache(stale))
        for t in range(prefill, ids.shape[1]):
            hf.rerotate_cache(model, cache, t, t + 1)  # before the call that uses t + 1's
            logits = model(ids[:, t : t + 1], **_cache(cache)).logits[:, -1]
            # HF's own way: the cached keys keep the bases they were cached under
            stale_logits = stale_model(ids[:, t : t + 1], **_cache(stale)).logits[:, -1]
            ref = ref_model(ids[:, : t + 1]).logits[:, -1]  # re-prefill under t + 1's base
            error = EXACT_F64_KEY_ERROR if patched else _hf_key_error(spec, t + 1)
            tol = 10 * error * ref.abs().max().item()
            assert (logits - ref).abs().max().item() <= tol, (t, tol)
            worst_stale = max(worst_stale, (stale_logits - ref).abs().max().item() / tol)
    assert worst_stale > 1.0  # HF's mixed bases are outside the tolerance


def test_rerotate_cache_repairs_a_cache_hf_decoding_left_mixed() -> None:
    # HF past max_position_embeddings: every decode step caches its key under a new base;
    # re-rotating each token from its own length brings the whole cache to one base
    model = _llama_model(1, patched=True)
    ref_model = copy.deepcopy(model)
    ids = torch.randint(3, 100, (1, 50), generator=torch.Generator().manual_seed(12))
    prefill, n = 40, 49
    cache = transformers.DynamicCache()
    with torch.no_grad():
        model(ids[:, :prefill], **_cache(cache))
        for t in range(prefill, n):
            model(ids[:, t : t + 1], **_cache(cache))
        lengths = [prefill] * prefill + list(range(prefill + 1, n + 1))
        hf.rerotate_cache(model, cache, lengths, n + 1)
        logits = model(ids[:, n : n + 1], **_cache(cache)).logits[:, -1]
        ref = ref_model(ids[:, : n + 1]).logits[:, -1]
    tol = 10 * EXACT_F64_KEY_ERROR * ref.abs().max().item()
    assert (logits - ref).abs().max().item() <= tol


def test_deeper_layers_keep_what_attention_computed_under_the_old_tables() -> None:
    # layer 0's keys come from the tokens alone: re-rotated, they are the re-prefill's;
    # layer 1's come from hidden states that attended under the old tables: a re-rotation
    # makes them consistent with the new tables but cannot make them the re-prefill's
    model = _llama_model(2, patched=True)
    ref_model = copy.deepcopy(model)
    ids = torch.randint(3, 100, (1, 60), generator=torch.Generator().manual_seed(13))
    cache, ref = transformers.DynamicCache(), transformers.DynamicCache()
    with torch.no_grad():
        model(ids[:, :40], **_cache(cache))
        hf.rerotate_cache(model, cache, 40, 60)
        ref_model(ids)  # grows the base to 60's, which a shorter call past 32 then keeps
        ref_model(ids[:, :40], **_cache(ref))  # the 40 tokens prefilled under 60's
    rd = hf.rope_spec(model.config).rotary_dim
    keys = [layer.keys for layer in cache.layers]
    ref_keys = [layer.keys for layer in ref.layers]
    assert _ratio(keys[0], ref_keys[0], EXACT_F64_KEY_ERROR * _pair_norms(keys[0], rd, "half")) <= 1
    assert (
        _ratio(keys[1], ref_keys[1], EXACT_F64_KEY_ERROR * _pair_norms(keys[1], rd, "half")) > 1e6
    )
