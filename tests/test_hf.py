"""posenc.hf against HF transformers: config reading, and models patched with exact tables.

Tolerances are derived, not guessed. HF builds its tables in float32 as
``cos(fl(p * inv_freq))`` with ``inv_freq`` off from the exact frequency by a
relative ``delta`` (measured here from the module's own ``inv_freq``, and
bounded as tests/test_rotary_schedules.py derives: a few ``2**-23`` plus
``ln(base)`` of them), so its angle at position ``p`` is off by at most ``p *
omega * (delta + 2**-24)``; float32 cos/sin and the attention scaling add
``2**-23`` (times the scaling). posenc's tables are exact before one rounding:
off by ``2**-24`` times the scaling. Hence, over positions up to ``P``:

    |posenc - HF| <= s * (P * max(omega) * (delta + 2**-24) + 2**-22)

and posenc is the closer of the two to a float64 truth (``p * omega`` in float64
from the exact frequencies: off by ``P * omega * 2**-53``, negligible here).

The logits go through two layers of a random-weight model (initialised at 25
times HF's scale, so that attention is sharp and the logits do feel the
positions: wrong factors move them by O(1)). Their sensitivity to the tables is
not derived but bounded loosely: a relative table error ``e`` moves the logits
by at most ``10 e max|logits|`` (measured: about ``0.5 e max|logits|``).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

from conftest import anchor

torch = anchor("torch")
transformers = anchor("transformers")

from posenc import Rotary, hf  # noqa: E402
from posenc.families.rotary.schedules import SCHEDULES, RopeFrequencies  # noqa: E402

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
    # weights 25x HF's default scale: attention sharp enough that logits feel the positions
    "initializer_range": 0.5,
}
VOCAB = 100


pytestmark = pytest.mark.usefixtures("quiet_transformers")


def _need(*rope_types: str) -> None:
    """The schedules a test runs are posenc's: one missing fails the test (never a skip,
    which would hide under CI the checks of a schedule that went missing)."""
    missing = [t for t in rope_types if t not in SCHEDULES]
    assert not missing, f"posenc.rotary.schedules has no {', '.join(missing)} schedule"


# --------------------------------------------------------------------------------------
# Tolerances and truth.


def _truth(positions: Any, freqs: RopeFrequencies) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin in float64 from the exact frequencies, half layout, scaled."""
    p = positions.to(torch.float64).numpy()[..., None]
    angle = p * freqs.inv_freq
    s = freqs.attention_scaling
    cos, sin = np.cos(angle) * s, np.sin(angle) * s
    return np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)


def _hf_delta(hf_inv_freq: Any, freqs: RopeFrequencies, base: float, factor: float) -> float:
    """HF's measured relative frequency error, checked against its derived bound."""
    theirs = hf_inv_freq.detach().to(torch.float64).numpy()
    ours = freqs.inv_freq
    nz = ours != 0
    delta = float(np.max(np.abs(theirs[nz] / ours[nz] - 1), initial=0.0))
    bound = (4 + math.log(base) + max(factor, 1.0)) * 2.0**-23
    assert delta <= bound, (delta, bound)
    return delta


def _table_tol(max_pos: int, freqs: RopeFrequencies, delta: float) -> float:
    s = freqs.attention_scaling
    return s * (max_pos * float(np.max(freqs.inv_freq)) * (delta + 2.0**-24) + 2.0**-22)


# --------------------------------------------------------------------------------------
# Models.


def _llama(rope_parameters: dict[str, Any], **extra: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**TINY, rope_parameters=rope_parameters, **extra)
    return LlamaForCausalLM(config)


def _qwen2(rope_parameters: dict[str, Any], **extra: Any) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**TINY, rope_parameters=rope_parameters, **extra)
    return Qwen2ForCausalLM(config)


def _phi3(rope_parameters: dict[str, Any], **extra: Any) -> Any:
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(**TINY, rope_parameters=rope_parameters, **extra)
    return Phi3ForCausalLM(config)


def _neox(**extra: Any) -> Any:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    kw = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}
    return GPTNeoXForCausalLM(GPTNeoXConfig(**kw, **extra))


LONG_FACTORS = [1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0, 10.0]
SHORT_FACTORS = [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0]

MODELS: dict[str, tuple[Any, tuple[str, ...], tuple[int, ...]]] = {
    # name: (build, rope types it needs, sequence lengths to run)
    "llama-llama3": (
        lambda: _llama(
            {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            max_position_embeddings=512,
        ),
        ("llama3",),
        (300,),
    ),
    "qwen2-yarn": (
        lambda: _qwen2(
            {
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            max_position_embeddings=256,
        ),
        ("yarn",),
        (250,),
    ),
    "phi3-longrope": (
        lambda: _phi3(
            {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": SHORT_FACTORS,
                "long_factor": LONG_FACTORS,
            },
            max_position_embeddings=512,
            original_max_position_embeddings=128,
        ),
        ("longrope",),
        (300, 128, 100),  # long factors, then short at exactly the original length, then short
    ),
    "gpt-neox-partial": (
        lambda: _neox(rotary_pct=0.25, max_position_embeddings=256),
        ("default",),
        (200,),
    ),
    "llama-dynamic": (
        lambda: _llama(
            {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
            max_position_embeddings=64,
        ),
        ("dynamic",),
        (160, 200, 40),  # grow past max_position_embeddings, grow further, fall back below
    ),
}


def _rotary(model: Any) -> Any:
    found = [m for _, m in model.named_modules() if type(m).__name__.endswith("RotaryEmbedding")]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_patched_model_matches_hf(name: str) -> None:
    build, needs, lengths = MODELS[name]
    _need(*needs)
    torch.manual_seed(0)
    model = build().eval()
    hf_rotary = _rotary(model)
    reference = hf.rope_spec(model.config)
    gen = torch.Generator().manual_seed(1)
    inputs = {n: torch.randint(3, VOCAB, (2, n), generator=gen) for n in lengths}
    with torch.no_grad():
        before = {n: model(ids).logits for n, ids in inputs.items()}
    hf.patch_model(model)
    ours_rotary = _rotary(model)
    assert type(ours_rotary).__name__ == "HFRotaryEmbedding"
    assert ours_rotary.rope_type == reference.rope_type
    with torch.no_grad():
        after = {n: model(ids).logits for n, ids in inputs.items()}

    x = torch.zeros(1, dtype=torch.float32)
    for n in lengths:
        positions = torch.arange(n)[None]
        hf_cos, hf_sin = hf_rotary(x, positions)  # HF updates its inv_freq for dynamic/longrope
        cos, sin = ours_rotary(x, positions)
        assert cos.dtype == sin.dtype == torch.float32
        assert cos.shape == hf_cos.shape == (1, n, reference.rotary_dim)
        freqs = reference.frequencies(seq_len=n)
        factor = reference.params.get("factor") or 1.0
        delta = _hf_delta(hf_rotary.inv_freq, freqs, reference.base, factor)
        tol = _table_tol(n, freqs, delta)
        table_diff = max((cos - hf_cos).abs().max().item(), (sin - hf_sin).abs().max().item())
        assert table_diff <= tol, (n, table_diff, tol)

        # closer to the float64 truth than HF, and within one rounding of it
        true_cos, true_sin = _truth(positions, freqs)
        ours_err = max(np.abs(cos.numpy() - true_cos).max(), np.abs(sin.numpy() - true_sin).max())
        hf_err = max(
            np.abs(hf_cos.numpy() - true_cos).max(), np.abs(hf_sin.numpy() - true_sin).max()
        )
        assert ours_err <= freqs.attention_scaling * 2.0**-24 * 1.01 + 1e-15
        assert ours_err <= hf_err

        # small positions (a fresh call: dynamic and longrope pick their frequencies by it)
        small = torch.arange(8)[None]
        hf_c8, hf_s8 = hf_rotary(x, small)
        c8, s8 = ours_rotary(x, small)
        small_freqs = reference.frequencies(seq_len=8)
        small_delta = _hf_delta(hf_rotary.inv_freq, small_freqs, reference.base, factor)
        small_tol = _table_tol(8, small_freqs, small_delta)
        assert (c8 - hf_c8).abs().max() <= small_tol
        assert (s8 - hf_s8).abs().max() <= small_tol

        logit_diff = (after[n] - before[n]).abs().max().item()
        assert logit_diff <= 10 * tol * before[n].abs().max().item(), (n, logit_diff, tol)


def test_patched_tables_match_hf_at_small_positions() -> None:
    """Default RoPE at positions < 16: both tables are within a few float32 ulps."""
    torch.manual_seed(0)
    model = _llama({"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=64)
    hf_rotary = _rotary(model)
    hf.patch_model(model)
    ours = _rotary(model)
    x = torch.zeros(1)
    positions = torch.arange(16)[None].expand(3, -1)
    hf_cos, hf_sin = hf_rotary(x, positions)
    cos, sin = ours(x, positions)
    freqs = hf.rope_spec(model.config).frequencies()
    delta = _hf_delta(hf_rotary.inv_freq, freqs, 10000.0, 1.0)
    tol = _table_tol(16, freqs, delta)
    assert (cos - hf_cos).abs().max() <= tol
    assert (sin - hf_sin).abs().max() <= tol
    # position 0 is exact in both
    assert torch.equal(cos[:, 0], hf_cos[:, 0]) and torch.equal(sin[:, 0], hf_sin[:, 0])


def test_patched_module_follows_dtype_and_layer_position_shapes() -> None:
    torch.manual_seed(0)
    model = hf.patch_model(_llama({"rope_type": "default", "rope_theta": 10000.0}))
    rotary = _rotary(model)
    x = torch.zeros(2, 5, 64, dtype=torch.bfloat16)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    cos, sin = rotary(x, positions)
    assert cos.dtype == sin.dtype == torch.bfloat16
    assert cos.shape == (2, 5, 16)
    truth, _ = _truth(positions, hf.rope_spec(model.config).frequencies())
    np.testing.assert_array_equal(cos.float().numpy(), torch.tensor(truth).bfloat16().float())


def test_dynamic_restores_below_max_position_embeddings() -> None:
    _need("dynamic")
    torch.manual_seed(0)
    model = _llama(
        {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
        max_position_embeddings=32,
    )
    hf.patch_model(model)
    rotary = _rotary(model)
    x = torch.zeros(1)
    short = torch.arange(20)[None]
    first, _ = rotary(x, short)
    grown, _ = rotary(x, torch.arange(100)[None])
    assert not torch.equal(grown[:, :20], first)  # the base grew
    again, _ = rotary(x, short)
    assert torch.equal(again, first)  # and was restored
    at_max, _ = rotary(x, torch.arange(32)[None])
    assert torch.equal(at_max[:, :20], first)  # seq_len == max_position_embeddings: unscaled


def _gemma3_config() -> Any:
    """Gemma 3: default RoPE on sliding-window layers, linear on full-attention ones."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        **{**TINY, "head_dim": 16},
        sliding_window=16,
        max_position_embeddings=256,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        },
        query_pre_attn_scalar=16,
    )


def test_gemma3_per_layer_type() -> None:
    from transformers import Gemma3ForCausalLM

    _need("linear")
    config = _gemma3_config()
    assert hf.rope_layer_types(config) == ("sliding_attention", "full_attention")
    full = hf.rope_spec(config, layer_type="full_attention")
    assert (full.rope_type, full.base, dict(full.params)) == ("linear", 1e6, {"factor": 8.0})
    with pytest.raises(ValueError, match="layer_type"):
        hf.rope_spec(config)

    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    hf_rotary = _rotary(model)
    ids = torch.randint(3, VOCAB, (1, 120), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(ids).logits
    hf.patch_model(model)
    rotary = _rotary(model)
    with torch.no_grad():
        after = model(ids).logits
    x = torch.zeros(1)
    positions = torch.arange(120)[None]
    tol = 0.0
    for layer_type in ("sliding_attention", "full_attention"):
        spec = hf.rope_spec(config, layer_type=layer_type)
        freqs = spec.frequencies()
        delta = _hf_delta(
            getattr(hf_rotary, f"{layer_type}_inv_freq"),
            freqs,
            spec.base,
            spec.params.get("factor", 1.0),
        )
        layer_tol = _table_tol(120, freqs, delta)
        tol = max(tol, layer_tol)
        hf_cos, _ = hf_rotary(x, positions, layer_type)
        cos, _ = rotary(x, positions, layer_type)
        assert (cos - hf_cos).abs().max() <= layer_tol
    assert (after - before).abs().max() <= 10 * tol * before.abs().max()


MROPE_MODELS: dict[str, tuple[str, list[int], bool]] = {
    # name: (transformers model class, mrope_section, interleaved)
    "qwen2-vl": ("Qwen2VLTextModel", [2, 3, 3], False),
    "qwen3-vl": ("Qwen3VLTextModel", [4, 2, 2], True),
}


def _mrope_model(name: str) -> Any:
    cls_name, section, _ = MROPE_MODELS[name]
    config_cls = getattr(transformers, cls_name.replace("Model", "Config"))
    config = config_cls(
        **{**TINY, "head_dim": 16},
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
    )
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(config).eval()


def _mrope_positions(n: int, batch: int = 2) -> Any:
    """(3, batch, n) M-RoPE positions: a long temporal axis, a small image-like grid."""
    t = torch.arange(n) * 97  # up to ~ 97 n: HF's float32 angles err visibly there
    h, w = torch.arange(n) // 8 + 3, torch.arange(n) % 8 + 5
    return torch.stack([t, h, w])[:, None].expand(3, batch, n)


def _logits(model: Any, ids: Any, positions: Any) -> Any:
    """Tied-embedding logits of a text-only VL model (it has no LM head of its own)."""
    hidden = model(input_ids=ids, position_ids=positions).last_hidden_state
    return hidden @ model.embed_tokens.weight.T


@pytest.mark.parametrize("name", list(MROPE_MODELS))
def test_patched_mrope_model_matches_hf(name: str) -> None:
    """Qwen2-VL / Qwen3-VL text models: tables and logits as HF's, closer to float64 truth."""
    _, section, interleaved = MROPE_MODELS[name]
    model = _mrope_model(name)
    hf_rotary = _rotary(model)
    reference = hf.rope_spec(model.config)
    assert reference.mrope_section == tuple(section)
    n = 200
    positions = _mrope_positions(n)
    ids = torch.randint(3, VOCAB, (2, n), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = _logits(model, ids, positions)
    hf.patch_model(model)
    ours_rotary = _rotary(model)
    assert type(ours_rotary).__name__ == "HFRotaryEmbedding"
    assert ours_rotary.specs[None].mrope_interleaved is interleaved  # read from the module
    assert ours_rotary.mrope_section == section
    with torch.no_grad():
        after = _logits(model, ids, positions)

    x = torch.zeros(1)
    hf_cos, hf_sin = hf_rotary(x, positions)
    cos, sin = ours_rotary(x, positions)
    assert cos.shape == hf_cos.shape == (2, n, 16)
    freqs = reference.frequencies()
    delta = _hf_delta(hf_rotary.inv_freq, freqs, reference.base, 1.0)
    tol = _table_tol(int(positions.max()), freqs, delta)
    table_diff = max((cos - hf_cos).abs().max().item(), (sin - hf_sin).abs().max().item())
    assert table_diff <= tol, (table_diff, tol)

    # truth: float64 angles of every axis, recomposed by HF's own code
    angles = positions.to(torch.float64)[..., None] * torch.tensor(freqs.inv_freq)
    true_cos = hf_rotary.recomposition_frequencies(torch.cos(angles)).numpy()
    true_sin = hf_rotary.recomposition_frequencies(torch.sin(angles)).numpy()
    ours_err = max(np.abs(cos.numpy() - true_cos).max(), np.abs(sin.numpy() - true_sin).max())
    hf_err = max(np.abs(hf_cos.numpy() - true_cos).max(), np.abs(hf_sin.numpy() - true_sin).max())
    assert ours_err <= 2.0**-24 * 1.01
    assert ours_err < hf_err

    # (batch, seq) positions broadcast to the three axes, as HF does
    flat = torch.arange(12)[None]
    for a, b in zip(hf_rotary(x, flat), ours_rotary(x, flat), strict=True):
        assert (a - b).abs().max() <= _table_tol(12, freqs, delta)

    logit_diff = (after - before).abs().max().item()
    assert logit_diff <= 10 * tol * before.abs().max().item(), (logit_diff, tol)


def test_patch_refuses_mrope_module_in_an_unknown_order() -> None:
    model = _mrope_model("qwen2-vl")
    rotary = _rotary(model)
    # a module mixing its axes (any order of (axis, frequency) channels is read and kept;
    # a sum of two axes' cosines is no channel of exact tables)
    rotary.recomposition_frequencies = lambda f: torch.cat([f[2] + f[1], f[2] + f[1]], -1)
    with pytest.raises(ValueError, match="does not recognise"):
        hf.patch_model(model)


def test_patch_mrope_rejects_bad_position_shapes() -> None:
    model = hf.patch_model(_mrope_model("qwen3-vl"))
    with pytest.raises(ValueError, match=r"\(3, batch, seq\)"):
        _rotary(model)(torch.zeros(1), torch.zeros(2, 1, 5, dtype=torch.long))


def test_patch_refuses_models_without_rotary() -> None:
    with pytest.raises(ValueError, match="RotaryEmbedding"):
        hf.patch_model(torch.nn.Linear(2, 2))


def test_patch_refuses_foreign_rotary_modules() -> None:
    class FooRotaryEmbedding(torch.nn.Module):
        def forward(self, seq_len: int) -> Any:
            return seq_len

    model = torch.nn.Sequential(FooRotaryEmbedding())
    with pytest.raises(ValueError, match="contract"):
        hf.patch_model(model)


def test_patch_refuses_mismatched_frequencies() -> None:
    torch.manual_seed(0)
    model = _llama({"rope_type": "default", "rope_theta": 10000.0})
    rotary = _rotary(model)
    rotary.original_inv_freq.mul_(1.001)  # a model computing RoPE its own way
    with pytest.raises(ValueError, match="does not recognise"):
        hf.patch_model(model)


# --------------------------------------------------------------------------------------
# The module's own output decides the form of the tables, and is checked before the swap.

FORMS = {
    # family: (config class, its kwargs, rotary class, form the module returns)
    "cohere": ("CohereConfig", {}, "CohereRotaryEmbedding", "interleaved"),
    "gpt_oss": ("GptOssConfig", {}, "GptOssRotaryEmbedding", "half_width"),
    "deepseek_v2": ("DeepseekV2Config", {}, "DeepseekV2RotaryEmbedding", "complex"),
    "llama": ("LlamaConfig", {}, "LlamaRotaryEmbedding", "half"),
}


def _module_of(family: str) -> torch.nn.Module:
    import importlib

    config_name, kwargs, rotary_name, _ = FORMS[family]
    models = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    configs = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    holder = torch.nn.Module()
    holder.rotary_emb = getattr(models, rotary_name)(getattr(configs, config_name)(**kwargs))
    return holder


@pytest.mark.parametrize("family", list(FORMS))
def test_patch_returns_tables_in_the_modules_own_form(family: str) -> None:
    holder = _module_of(family)
    x = torch.zeros(1, 4096, 8)
    positions = torch.arange(4096)[None]
    theirs = holder.rotary_emb(x, positions)
    hf.patch_model(holder)
    assert holder.rotary_emb.form == FORMS[family][3]
    ours = holder.rotary_emb(x, positions)
    pairs = [(theirs, ours)] if isinstance(theirs, torch.Tensor) else zip(theirs, ours, strict=True)
    freqs = holder.rotary_emb.frequencies(None)
    # the module docstring's bound, P = 4095, delta from its inv_freq (a few 2**-23)
    tol = freqs.attention_scaling * (4095 * max(freqs.inv_freq) * 40 * 2.0**-23 + 2.0**-22)
    for t, o in pairs:
        assert t.shape == o.shape and t.dtype == o.dtype
        assert float((t - o).abs().max()) <= tol


def test_patch_refuses_a_module_whose_tables_differ() -> None:
    holder = _module_of("llama")
    real = type(holder.rotary_emb).forward

    def doubled(self: Any, x: Any, position_ids: Any) -> Any:  # a model with its own twist
        cos, sin = real(self, x, position_ids)
        return cos, sin * 1.01

    holder.rotary_emb.forward = doubled.__get__(holder.rotary_emb)
    with pytest.raises(ValueError, match=r"rotary_emb \(LlamaRotaryEmbedding\).*differ.*half"):
        hf.patch_model(holder)
    assert type(holder.rotary_emb).__name__ == "LlamaRotaryEmbedding"  # left as it was


def test_patch_turns_a_failing_module_or_config_into_a_value_error() -> None:
    holder = _module_of("llama")

    def broken(self: Any, x: Any, position_ids: Any) -> Any:
        raise RuntimeError("boom")

    holder.rotary_emb.forward = broken.__get__(holder.rotary_emb)
    with pytest.raises(ValueError, match=r"forward.*RuntimeError: boom"):
        hf.patch_model(holder)

    class Ambiguous(Exception):
        pass

    holder = _module_of("llama")

    class Raising:  # transformers' configs can raise their own errors on attribute access
        def __init__(self, config: Any) -> None:
            self._config = config

        def __getattr__(self, name: str) -> Any:
            if name == "head_dim":
                raise Ambiguous("head_dim differs per layer")
            return getattr(self._config, name)

    holder.rotary_emb.config = Raising(holder.rotary_emb.config)
    with pytest.raises(ValueError, match=r"reading its config failed.*Ambiguous"):
        hf.patch_model(holder)


def test_patch_refuses_an_unknown_output_form() -> None:
    holder = _module_of("llama")

    def three(self: Any, x: Any, position_ids: Any) -> Any:
        return x, x, x

    holder.rotary_emb.forward = three.__get__(holder.rotary_emb)
    with pytest.raises(ValueError, match="returns a tuple of"):
        hf.patch_model(holder)


# --------------------------------------------------------------------------------------
# GPT-J and CodeGen: a table of their model's config, on a module without config or rope_type.

FIXED_TABLE = {
    "gptj": ("GPTJConfig", "GPTJForCausalLM"),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM"),
}


def _fixed_table_model(family: str) -> Any:
    config_name, model_name = FIXED_TABLE[family]
    config = getattr(transformers, config_name)(
        vocab_size=VOCAB,
        n_embd=64,
        n_head=4,
        n_layer=2,
        rotary_dim=8,
        n_positions=256,
        initializer_range=0.5,  # TINY's scale: the logits feel the positions
    )
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


@pytest.mark.parametrize("family", list(FIXED_TABLE))
def test_patched_gptj_and_codegen_match_hf(family: str) -> None:
    model = _fixed_table_model(family)
    theirs = model.transformer.rotary_emb
    n = 200
    ids = torch.randint(3, VOCAB, (2, n), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    hf.patch_model(model)
    ours = model.transformer.rotary_emb
    assert type(ours).__name__ == "HFRotaryEmbedding"
    assert ours.form == "half_width_sin_first"
    # GPT-J's tables come in x's dtype, CodeGen's in its table's own (float32 here)
    assert ours.table_dtype == (None if family == "gptj" else torch.float32)
    with torch.no_grad():
        after = model(ids).logits

    spec = hf.rope_spec(model.config)
    assert (spec.base, spec.rotary_dim, spec.layout) == (10000.0, 8, "interleaved")
    freqs = spec.frequencies()
    positions = torch.arange(n)[None]
    x = torch.zeros(1)
    hf_sin, hf_cos = theirs(x, positions)  # (sin, cos), each angle once
    sin, cos = ours(x, positions)
    assert sin.shape == hf_sin.shape == (1, n, 4) and sin.dtype == hf_sin.dtype
    # HF's float32 inv_freq (create_sinusoidal_positions): its bound, (4 + ln base + 1) ulps
    tol = _table_tol(n, freqs, (5 + math.log(spec.base)) * 2.0**-23)
    table_diff = max((cos - hf_cos).abs().max().item(), (sin - hf_sin).abs().max().item())
    assert table_diff <= tol, (table_diff, tol)
    angle = positions[0].double().numpy()[:, None] * freqs.inv_freq
    ours_err = max(
        np.abs(cos[0].numpy() - np.cos(angle)).max(), np.abs(sin[0].numpy() - np.sin(angle)).max()
    )
    hf_err = max(
        np.abs(hf_cos[0].numpy() - np.cos(angle)).max(),
        np.abs(hf_sin[0].numpy() - np.sin(angle)).max(),
    )
    assert ours_err <= 2.0**-24 * 1.01 and ours_err <= hf_err
    logit_diff = (after - before).abs().max().item()
    assert logit_diff <= 10 * tol * before.abs().max().item(), (logit_diff, tol)


@pytest.mark.parametrize("family", list(FIXED_TABLE))
def test_patched_gptj_and_codegen_tables_keep_hf_dtypes(family: str) -> None:
    import copy

    model = _fixed_table_model(family)
    original = copy.deepcopy(model)
    hf.patch_model(model)
    positions = torch.arange(5)[None]
    for cast in (None, torch.bfloat16):
        if cast is not None:  # CodeGen's table is a buffer: a cast of the model casts it
            model.to(cast)
            original.to(cast)
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            x = torch.zeros(1, dtype=dtype)
            theirs = original.transformer.rotary_emb(x, positions)
            ours = model.transformer.rotary_emb(x, positions)
            assert [t.dtype for t in ours] == [t.dtype for t in theirs], (cast, dtype)


# --------------------------------------------------------------------------------------
# rope_spec on dicts and config objects.

BASE_DICT = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 256}


def test_rope_spec_v4_dict_with_type_alias() -> None:
    spec = hf.rope_spec(
        {**BASE_DICT, "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    )
    assert spec.rope_type == "linear"
    assert spec.base == 500000.0
    assert dict(spec.params) == {"factor": 2.0}
    assert (spec.head_dim, spec.rotary_dim) == (16, 16)
    assert spec.max_position_embeddings == 256


def test_rope_spec_v4_dynamic_takes_max_position_embeddings() -> None:
    _need("dynamic")
    spec = hf.rope_spec({**BASE_DICT, "rope_scaling": {"type": "dynamic", "factor": 2.0}})
    assert spec.base == hf.DEFAULT_THETA
    assert dict(spec.params) == {"factor": 2.0, "max_position_embeddings": 256}


def test_rope_spec_v5_dict() -> None:
    spec = hf.rope_spec(
        {
            **BASE_DICT,
            "head_dim": 32,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e6,
                "partial_rotary_factor": 0.5,
            },
        }
    )
    assert (spec.rope_type, spec.base, spec.head_dim, spec.rotary_dim) == ("default", 1e6, 32, 16)
    assert dict(spec.params) == {}
    assert spec.frequencies().inv_freq.shape == (8,)


def test_rope_spec_original_max_defaults_and_priority() -> None:
    _need("yarn", "longrope")
    yarn = hf.rope_spec({**BASE_DICT, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    assert yarn.original_max_position_embeddings == 256  # HF's default: max_position_embeddings
    # Phi-3: the top-level original_max_position_embeddings wins, as in HF
    phi3 = hf.rope_spec(
        {
            **BASE_DICT,
            "model_type": "phi3",
            "original_max_position_embeddings": 64,
            "rope_scaling": {
                "type": "su",
                "short_factor": [1.0] * 8,
                "long_factor": [2.0] * 8,
                "original_max_position_embeddings": 128,
            },
        }
    )
    assert phi3.rope_type == "longrope"
    assert phi3.original_max_position_embeddings == 64
    assert phi3.params["max_position_embeddings"] == 256
    assert phi3.frequencies(seq_len=65).inv_freq[-1] < phi3.frequencies(seq_len=64).inv_freq[-1]
    # DeepSeek-V3: a null yarn factor is max_position_embeddings / original
    ds = hf.rope_spec(
        {
            **BASE_DICT,
            "rope_scaling": {
                "type": "yarn",
                "factor": None,
                "original_max_position_embeddings": 64,
            },
        }
    )
    assert ds.params["factor"] == 4.0
    # the factor left out (not null): transformers raises KeyError, and posenc refuses it
    with pytest.raises(ValueError, match=re.escape("'rope_type'='yarn': {'factor'}")):
        hf.rope_spec(
            {**BASE_DICT, "rope_scaling": {"type": "yarn", "original_max_position_embeddings": 64}}
        )


def test_rope_spec_gpt_neox_dict_names() -> None:
    spec = hf.rope_spec({**BASE_DICT, "rotary_pct": 0.25, "rotary_emb_base": 20000})
    assert (spec.rotary_dim, spec.base, spec.partial_rotary_factor) == (4, 20000.0, 0.25)


def test_rope_spec_per_layer_type_dict() -> None:
    config = {
        **BASE_DICT,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"type": "linear", "factor": 8.0, "rope_theta": 1e6},
        },
    }
    assert hf.rope_layer_types(config) == ("sliding_attention", "full_attention")
    assert hf.rope_spec(config, layer_type="full_attention").rope_type == "linear"
    local = hf.rope_spec(config, layer_type="sliding_attention")
    assert (local.rope_type, local.base, local.layer_type) == ("default", 1e4, "sliding_attention")
    with pytest.raises(ValueError, match="one RoPE per layer type"):
        hf.rope_spec(config)
    with pytest.raises(ValueError, match="unknown layer_type"):
        hf.rope_spec(config, layer_type="chunked_attention")
    with pytest.raises(ValueError, match="one RoPE for all layers"):
        hf.rope_spec({**BASE_DICT, "rope_theta": 1e4}, layer_type="full_attention")
    assert hf.rope_layer_types({**BASE_DICT, "rope_theta": 1e4}) == ()


def test_rope_spec_errors() -> None:
    with pytest.raises(ValueError, match="head dim"):
        hf.rope_spec({"rope_theta": 1e4})
    with pytest.raises(ValueError, match="unknown rope type 'wobbly'"):
        hf.rope_spec({**BASE_DICT, "rope_scaling": {"type": "wobbly", "factor": 2.0}})
    with pytest.raises(ValueError, match="does not take colour"):
        hf.rope_spec({**BASE_DICT, "rope_scaling": {"type": "linear", "factor": 2.0, "colour": 1}})
    # a key transformers requires: refused with transformers' own reason (its KeyError)
    with pytest.raises(ValueError, match=re.escape(
        "Missing required keys in `rope_parameters` for 'rope_type'='linear': {'factor'}"
    )):  # fmt: skip
        hf.rope_spec({**BASE_DICT, "rope_scaling": {"type": "linear"}})
    # a type transformers does not know: the schedule names what it needs
    with pytest.raises(ValueError, match="rope type 'resonance_yarn' needs factor"):
        hf.rope_spec({**BASE_DICT, "rope_scaling": {"type": "resonance_yarn"}})
    with pytest.raises(ValueError, match="two rope types"):
        hf.rope_spec({**BASE_DICT, "rope_scaling": {"type": "linear", "rope_type": "yarn"}})
    with pytest.raises(ValueError, match="differ"):
        hf.rope_spec(
            {
                **BASE_DICT,
                "rope_scaling": {"type": "linear", "factor": 2.0},
                "rope_parameters": {"rope_type": "default"},
            }
        )
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        hf.rope_spec({**BASE_DICT, "partial_rotary_factor": 0})
    with pytest.raises(TypeError, match="rope_scaling must be a dict"):
        hf.rope_spec({**BASE_DICT, "rope_scaling": "linear"})
    with pytest.raises(ValueError, match="mrope_section must sum to rotary_dim / 2 = 8"):
        hf.rope_spec({**BASE_DICT, "rope_scaling": {"type": "default", "mrope_section": [2, 3, 4]}})
    with pytest.raises(ValueError, match="interleaved mrope_section"):
        hf.rope_spec(
            {
                **BASE_DICT,
                "rope_scaling": {"mrope_section": [2, 3, 3], "mrope_interleaved": True},
            }
        )
    with pytest.raises(TypeError, match="mrope_interleaved"):
        hf.rope_spec(
            {**BASE_DICT, "rope_scaling": {"mrope_section": [4, 2, 2], "mrope_interleaved": 1}}
        )


def test_rope_spec_reads_mrope_keys() -> None:
    spec = hf.rope_spec(
        {**BASE_DICT, "rope_scaling": {"type": "default", "mrope_section": [2, 3, 3]}}
    )
    assert (spec.rope_type, spec.mrope_section, spec.mrope_interleaved) == (
        "default",
        (2, 3, 3),
        None,
    )
    assert dict(spec.params) == {}
    spec = hf.rope_spec(
        {**BASE_DICT, "rope_parameters": {"mrope_section": [4, 2, 2], "mrope_interleaved": True}}
    )
    assert (spec.mrope_section, spec.mrope_interleaved) == ((4, 2, 2), True)
    assert hf.rope_spec({**BASE_DICT, "rope_theta": 1e4}).mrope_section is None


def test_rope_spec_is_frozen_and_hashable() -> None:
    spec = hf.rope_spec({**BASE_DICT, "rope_theta": 1e4})
    with pytest.raises(AttributeError):
        spec.base = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.params["factor"] = 2.0  # type: ignore[index]
    assert hash(spec) == hash(hf.rope_spec({**BASE_DICT, "rope_theta": 1e4}))


CONFIG_CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn-mscale": {
        "rope_type": "yarn",
        "rope_theta": 1e4,
        "factor": 40.0,
        "original_max_position_embeddings": 64,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
        "beta_fast": 16,
        "truncate": False,
    },
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "longrope": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": SHORT_FACTORS,
        "long_factor": LONG_FACTORS,
        "original_max_position_embeddings": 64,
    },
    "proportional": {
        "rope_type": "proportional",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "factor": 8.0,
    },
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_rope_spec_on_config_objects_matches_hf_init(case: str) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parameters = CONFIG_CASES[case]
    rope_type = parameters["rope_type"]
    _need(rope_type)
    config = LlamaConfig(**TINY, max_position_embeddings=256, rope_parameters=dict(parameters))
    spec = hf.rope_spec(config)
    assert spec.rope_type == rope_type
    # the same settings read from the config.json dict, v5 and v4
    as_dict = config.to_dict()
    assert hf.rope_spec(as_dict) == spec
    v4 = {k: v for k, v in as_dict.items() if k != "rope_parameters"}
    v4_scaling = {k: v for k, v in parameters.items() if k not in ("rope_type", "rope_theta")}
    v4 = {
        **v4,
        "rope_theta": parameters["rope_theta"],
        "rope_scaling": {"type": rope_type, **v4_scaling},
    }
    assert hf.rope_spec(v4) == spec
    for seq_len in (None, 300):
        freqs = spec.frequencies(seq_len=seq_len)
        assert freqs.inv_freq.shape == (8,)  # proportional too: it covers the whole head
        if rope_type == "default":
            scaling = 1.0
            theirs = 1.0 / (spec.base ** (torch.arange(0, 16, 2, dtype=torch.float) / 16))
        else:
            theirs, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
        factor = spec.params.get("factor") or 1.0
        _hf_delta(theirs, freqs, spec.base, factor)
        assert freqs.attention_scaling == pytest.approx(scaling, rel=1e-12)


def test_rope_spec_reads_text_config_of_composite_configs() -> None:
    spec = hf.rope_spec({"model_type": "x", "text_config": {**BASE_DICT, "rope_theta": 5e5}})
    assert spec.base == 5e5


def test_dynamic_keeps_the_grown_base_as_hf_does() -> None:
    # one policy for Rotary and the patched module: HF's dynamic_rope_update keeps the
    # base it grew to until a call falls below max_position_embeddings
    _need("dynamic")
    torch.manual_seed(0)
    model = _llama(
        {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        max_position_embeddings=64,
    )
    hf_rotary = _rotary(model)
    hf.patch_model(model)
    ours = _rotary(model)
    rope = Rotary.from_hf_config(model.config)
    reference = hf.rope_spec(model.config)
    x = torch.zeros(1)
    grown = reference.frequencies(seq_len=200)
    for n in (200, 150, 100):
        positions = torch.arange(n)[None]
        hf_cos, _ = hf_rotary(x, positions)
        cos, _ = ours(x, positions)
        rope_cos, _ = rope.cos_sin(positions)
        tol = _table_tol(n, grown, _hf_delta(hf_rotary.inv_freq, grown, 10000.0, 2.0))
        assert (cos - hf_cos).abs().max() <= tol, n
        assert torch.equal(rope_cos, cos), n  # Rotary follows the same policy
        truth, _ = _truth(positions, grown)  # still the frequencies grown for 200
        assert np.abs(cos.numpy() - truth).max() <= 2.0**-24 * 1.01


def test_longrope_first_call_past_the_original_length_uses_the_long_factors() -> None:
    _need("longrope")
    torch.manual_seed(0)
    model = MODELS["phi3-longrope"][0]()
    hf_rotary = _rotary(model)
    rope = Rotary.from_hf_config(model.config)
    reference = hf.rope_spec(model.config)
    long = reference.frequencies(seq_len=reference.original_max_position_embeddings + 1)
    x = torch.zeros(1)
    positions = torch.arange(300)[None]  # the first call is already longer than 128
    hf_cos, _ = hf_rotary(x, positions)
    cos, _ = rope.cos_sin(positions)
    tol = _table_tol(300, long, _hf_delta(hf_rotary.inv_freq, long, reference.base, 1.0))
    assert (cos - hf_cos).abs().max() <= tol
    truth, _ = _truth(positions, long)
    assert np.abs(cos.numpy() - truth).max() <= long.attention_scaling * 2.0**-24 * 1.01


# --------------------------------------------------------------------------------------
# Copies, saving and deferred (meta-device) initialisation of patched models.


def _causal(build: Any) -> Any:
    """A causal LM builder and its logits function, for :data:`SAVED_MODELS`."""

    def logits(model: Any, ids: Any) -> Any:
        return model(ids).logits

    return build, logits


def _mrope(name: str) -> Any:
    """A text-only M-RoPE model and its tied-embedding logits on M-RoPE positions."""

    def logits(model: Any, ids: Any) -> Any:
        return _logits(model, ids, _mrope_positions(ids.shape[1], ids.shape[0]))

    return (lambda: _mrope_model(name)), logits


def _gemma3() -> Any:
    from transformers import Gemma3ForCausalLM

    return Gemma3ForCausalLM(_gemma3_config())


SAVED_MODELS: dict[str, tuple[Any, Any]] = {
    # name: (build, logits(model, ids)); lengths reach past every model's switch points
    "llama-default": _causal(
        lambda: _llama({"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=64)
    ),
    "llama-llama3": _causal(MODELS["llama-llama3"][0]),
    "qwen2-yarn": _causal(MODELS["qwen2-yarn"][0]),
    "phi3-longrope": _causal(MODELS["phi3-longrope"][0]),
    "llama-dynamic": _causal(MODELS["llama-dynamic"][0]),
    "gemma3-per-layer-type": _causal(_gemma3),
    "qwen2-vl-mrope": _mrope("qwen2-vl"),
    "qwen3-vl-mrope": _mrope("qwen3-vl"),
    # a module without config (the enclosing model's is read) whose tables keep a dtype
    "codegen-fixed-table": _causal(lambda: _fixed_table_model("codegen")),
}


def _patched(name: str) -> Any:
    torch.manual_seed(0)
    return hf.patch_model(SAVED_MODELS[name][0]().eval())


def _ids(n: int = 150) -> Any:
    return torch.randint(3, VOCAB, (2, n), generator=torch.Generator().manual_seed(1))


def _patched_rotaries(model: Any) -> list[Any]:
    found = [m for m in model.modules() if isinstance(m, hf.HFRotaryEmbedding)]
    assert len(found) == 1
    return found


@pytest.mark.parametrize("name", list(SAVED_MODELS))
def test_patched_model_survives_copies_and_a_state_dict_round_trip(name: str) -> None:
    import copy
    import io
    import pickle

    model = _patched(name)
    logits = SAVED_MODELS[name][1]
    ids = _ids()
    with torch.no_grad():
        logits(model, ids)  # used: tables and device tensors cached, dynamic grown
        want = logits(model, ids)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    fresh = _patched(name)
    fresh.load_state_dict(model.state_dict())  # strict: the patched module adds no state
    clones = {
        "deepcopy": copy.deepcopy(model),
        "pickle": pickle.loads(pickle.dumps(model)),
        "torch.save": torch.load(buffer, weights_only=False),
        "state_dict": fresh,
    }
    for how, clone in clones.items():
        with torch.no_grad():
            assert torch.equal(logits(clone, ids), want), how
        (rotary,) = _patched_rotaries(clone)
        for spec in rotary.specs.values():
            with pytest.raises(TypeError):
                spec.params["factor"] = 3.0  # still read-only
        for (n1, b1), (n2, b2) in zip(
            rotary.named_buffers(), _patched_rotaries(model)[0].named_buffers(), strict=True
        ):
            assert n1 == n2 and torch.equal(b1, b2), how


@pytest.mark.parametrize("name", list(SAVED_MODELS))
def test_patched_model_built_on_the_meta_device(name: str) -> None:
    """Deferred initialisation: build on meta, patch, to_empty, then load the weights."""
    build, logits = SAVED_MODELS[name]
    reference = _patched(name)
    with torch.device("meta"):
        model = build().eval()
    hf.patch_model(model)  # checked against CPU twins of the meta modules
    (rotary,) = _patched_rotaries(model)
    assert all(b.is_meta for b in rotary.buffers())
    model.to_empty(device="cpu")
    model.load_state_dict(reference.state_dict())
    (want,) = _patched_rotaries(reference)
    for (n1, b1), (n2, b2) in zip(rotary.named_buffers(), want.named_buffers(), strict=True):
        assert n1 == n2 and b1.dtype == torch.float32 and torch.equal(b1, b2)  # rebuilt
    ids = _ids()
    with torch.no_grad():
        if name.startswith("gemma3"):
            # Gemma 3's own non-persistent embed_scale is HF's loader's to restore
            position_ids = torch.arange(ids.shape[1])[None]
            for layer_type in rotary.layer_types:
                got = rotary(torch.zeros(1), position_ids, layer_type)
                expected = want(torch.zeros(1), position_ids, layer_type)
                assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        else:
            assert torch.equal(logits(model, ids), logits(reference, ids))


def test_patched_module_built_on_the_meta_device_per_layer_type() -> None:
    config = _gemma3_config()
    specs = {lt: hf.rope_spec(config, layer_type=lt) for lt in hf.rope_layer_types(config)}
    fresh = hf.HFRotaryEmbedding(specs, config=config)
    with torch.device("meta"):
        module = hf.HFRotaryEmbedding(specs, config=config)
    assert all(b.is_meta for b in module.buffers())
    module.to_empty(device="cpu")
    module.load_state_dict(fresh.state_dict())
    names = sorted(n for n, _ in module.named_buffers())
    assert names == ["full_attention_inv_freq", "sliding_attention_inv_freq"]
    for n in names:
        assert torch.equal(getattr(module, n), getattr(fresh, n))
    getattr(module, names[0]).fill_(0.0)
    module.reset_parameters()  # FSDP's param_init_fn convention
    assert torch.equal(getattr(module, names[0]), getattr(fresh, names[0]))


def test_patch_refuses_a_meta_module_it_cannot_rebuild() -> None:
    model = _patched("llama-default")
    (rotary,) = _patched_rotaries(model)

    class BrokenRotaryEmbedding(torch.nn.Module):
        def __init__(self) -> None:  # takes no config: cannot be rebuilt on the CPU
            super().__init__()
            self.config, self.rope_type = rotary.config, "default"
            self.register_buffer("inv_freq", torch.empty(8, device="meta"), persistent=False)

    model.model.rotary_emb = BrokenRotaryEmbedding()
    with pytest.raises(ValueError, match="meta device"):
        hf.patch_model(model)


def test_hf_module_class_lives_at_module_level_and_needs_no_torch_import() -> None:
    import pickle
    import subprocess
    import sys

    assert hf.HFRotaryEmbedding.__module__ == "posenc.integration.hf_module"
    assert pickle.loads(pickle.dumps(hf.HFRotaryEmbedding)) is hf.HFRotaryEmbedding
    code = "import sys, posenc.hf; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_rope_spec_pickles_and_copies() -> None:
    import copy
    import pickle

    spec = hf.rope_spec(MODELS["phi3-longrope"][0]().config)
    for clone in (copy.deepcopy(spec), pickle.loads(pickle.dumps(spec))):
        assert clone == spec and hash(clone) == hash(spec)
        assert clone.frequencies(seq_len=300) == spec.frequencies(seq_len=300)
        with pytest.raises(TypeError):
            clone.params["factor"] = 2.0  # type: ignore[index]
    # a spec built from a plain dict is read-only too
    direct = hf.RopeSpec("linear", 1e4, {"factor": 2.0}, head_dim=16, rotary_dim=16)
    with pytest.raises(TypeError):
        direct.params["factor"] = 4.0  # type: ignore[index]
    assert pickle.loads(pickle.dumps(direct)) == direct


@pytest.mark.parametrize(
    ("config", "exc", "named"),
    [
        ({"rope_theta": "fast"}, TypeError, "rope_theta must be a real number"),
        ({"rope_theta": True}, TypeError, "rope_theta must be a real number"),
        ({"rope_theta": float("nan")}, ValueError, "rope_theta must be finite"),
        ({"rope_theta": -1.0}, ValueError, "rope_theta must be > 0"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": "fast"}},
            TypeError,
            r"rope_parameters\['rope_theta'\] must be a real number",
        ),
        ({"rotary_emb_base": "fast"}, TypeError, "rotary_emb_base must be a real number"),
        ({"partial_rotary_factor": "half"}, TypeError, "partial_rotary_factor must be a real"),
        ({"partial_rotary_factor": float("nan")}, ValueError, "partial_rotary_factor must be"),
        ({"rotary_pct": 1.5}, ValueError, r"rotary_pct must lie in \(0, 1\]"),
        ({"max_position_embeddings": 2.5}, TypeError, "max_position_embeddings must be an int"),
        ({"max_position_embeddings": 0.0}, ValueError, "max_position_embeddings must be an int"),
    ],
)
def test_rope_spec_names_bad_values(config: dict[str, Any], exc: type, named: str) -> None:
    with pytest.raises(exc, match=named):
        hf.rope_spec({**BASE_DICT, **config})
    with pytest.raises(exc, match=named):
        Rotary.from_hf_config({**BASE_DICT, **config})


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8])
def test_patched_module_takes_small_int_position_ids(dtype: torch.dtype) -> None:
    for name in ("llama-dynamic", "qwen2-vl-mrope"):
        (rotary,) = _patched_rotaries(_patched(name))
        position_ids = torch.arange(100, 128)[None]
        if name.endswith("mrope"):
            position_ids = torch.stack([position_ids, position_ids // 4, position_ids % 4])
        got = rotary(torch.zeros(1), position_ids.to(dtype))
        for a, b in zip(got, rotary(torch.zeros(1), position_ids), strict=True):
            assert torch.equal(a, b)


def test_from_hf_config_refuses_to_guess() -> None:
    # no RoPE settings at all: no base of 10000 is assumed
    with pytest.raises(ValueError, match=r"no RoPE settings.*Rotary\(head_dim, base=10000.0\)"):
        Rotary.from_hf_config(dict(BASE_DICT))
    assert Rotary.from_hf_config({**BASE_DICT, "rope_theta": 10000.0}).rotary_dim == 16
    # M-RoPE: one rotation per axis; the error names what to call instead
    scaling = {"rope_type": "default", "mrope_section": [2, 3, 3]}
    mrope = {**BASE_DICT, "rope_theta": 1e6, "rope_scaling": scaling}
    with pytest.raises(ValueError, match=r"M-RoPE.*mrope_cos_sin.*patch_model"):
        Rotary.from_hf_config(mrope)


# --------------------------------------------------------------------------------------
# Vision towers' axial RoPE: each output channel's axis and frequency read from the module.

AXIAL = {
    # family: (vision config class, rotary class)
    "qwen2_vl": ("Qwen2VLVisionConfig", "Qwen2VLVisionRotaryEmbedding"),
    "qwen3_vl": ("Qwen3VLVisionConfig", "Qwen3VLVisionRotaryEmbedding"),
    "glm4v": ("Glm4vVisionConfig", "Glm4vVisionRotaryEmbedding"),
}


def _axial_holder(family: str) -> torch.nn.Module:
    import importlib

    config_name, rotary_name = AXIAL[family]
    models = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    configs = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    holder = torch.nn.Module()
    holder.rotary_pos_emb = getattr(models, rotary_name)(getattr(configs, config_name)())
    return holder


@pytest.mark.parametrize("family", list(AXIAL))
def test_patched_vision_rotary_matches_on_a_patch_grid(family: str) -> None:
    import copy
    import pickle

    from transformers.models.qwen2_vl.modeling_qwen2_vl import get_vision_position_ids

    holder = _axial_holder(family)
    # what the vision towers pass: (patches, 2) rows and columns of a 40 x 60 patch image
    grid = get_vision_position_ids(torch.tensor([[1, 40, 60]]), 2, kwargs={})
    x = torch.zeros(1, grid.numel() // 2, 8)
    theirs = holder.rotary_pos_emb(x, grid)
    hf.patch_model(holder)
    new = holder.rotary_pos_emb
    assert type(new).__name__ == "HFGatheredRotaryEmbedding" and new.axis_last
    ours = new(x, grid)
    # HF's float32 angles at positions up to P = 59: P * omega * (delta + 2**-24), omega <= 1
    tol = 59 * (4 + math.log(10000.0)) * 2.0**-23 + 2.0**-22
    for t, o in zip(theirs, ours, strict=True):
        assert t.shape == o.shape and t.dtype == o.dtype
        assert float((t - o).abs().max()) <= tol
    for twin in (copy.deepcopy(new), pickle.loads(pickle.dumps(new))):
        for a, b in zip(twin(x, grid), ours, strict=True):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="position_ids must be"):
        new(x, torch.zeros(5, 3, dtype=torch.long))


def test_patch_refuses_vision_frequencies_it_does_not_recognise() -> None:
    from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding

    holder = torch.nn.Module()
    holder.rope = PixtralVisionRotaryEmbedding(PixtralVisionConfig())
    with pytest.raises(ValueError, match=r"rope \(PixtralVisionRotaryEmbedding\).*inv_freq"):
        hf.patch_model(holder)


def test_rope_spec_takes_a_whole_float_size() -> None:
    # MusicFlamingo's config.json has max_position_embeddings 1200.0; transformers takes it
    spec = hf.rope_spec({**BASE_DICT, "max_position_embeddings": 1200.0, "rope_theta": 1e4})
    assert spec.max_position_embeddings == 1200 and isinstance(spec.max_position_embeddings, int)


def test_rope_spec_skips_keys_hf_never_reads_for_the_frequencies() -> None:
    # Ministral 3 / Mistral 4: llama_4_scaling_beta scales queries in attention, and a copy of
    # max_position_embeddings inside a yarn dict is not read by HF's yarn init
    yarn = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
            "original_max_position_embeddings": 16384}  # fmt: skip
    plain = hf.rope_spec({**BASE_DICT, "rope_parameters": yarn})
    extra = {**yarn, "llama_4_scaling_beta": 0.1, "max_position_embeddings": 262144}
    assert hf.rope_spec({**BASE_DICT, "rope_parameters": extra}) == plain
    with pytest.raises(ValueError, match="does not take bogus"):
        hf.rope_spec({**BASE_DICT, "rope_parameters": {**yarn, "bogus": 1}})


def test_rope_spec_reads_qwen2_vl_mrope_type_as_default() -> None:
    # Qwen2-VL's config.json: rope_scaling {"type": "mrope", "mrope_section": [...]}
    config = {**BASE_DICT, "rope_theta": 1e6,
              "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}  # fmt: skip
    spec = hf.rope_spec(config)
    assert spec.rope_type == "default" and spec.mrope_section == (2, 3, 3)


def test_patched_glm4v_text_mrope_in_its_own_order() -> None:
    # GLM-4V repeats each M-RoPE section's angles: neither Qwen order, read from the output
    from transformers.models.glm4v.configuration_glm4v import Glm4vTextConfig
    from transformers.models.glm4v.modeling_glm4v import Glm4vTextRotaryEmbedding

    holder = torch.nn.Module()
    config = Glm4vTextConfig(hidden_size=256, num_attention_heads=4)  # head_dim 64: 8+12+12
    holder.rotary_emb = Glm4vTextRotaryEmbedding(config)
    steps = torch.arange(300)
    positions = torch.stack([steps // 100, (steps // 10) % 10 + 3, steps % 10 + 7])[:, None]
    x = torch.zeros(1, 300, 8)
    theirs = holder.rotary_emb(x, positions)
    hf.patch_model(holder)
    assert type(holder.rotary_emb).__name__ == "HFGatheredRotaryEmbedding"
    ours = holder.rotary_emb(x, positions)
    tol = 16 * (4 + math.log(10000.0)) * 2.0**-23 + 2.0**-22  # positions up to 16
    for t, o in zip(theirs, ours, strict=True):
        assert t.shape == o.shape and float((t - o).abs().max()) <= tol
    # (batch, seq) positions: the same on every axis, as HF broadcasts them
    flat = torch.arange(20)[None]
    for t, o in zip(
        Glm4vTextRotaryEmbedding(config)(x, flat),
        holder.rotary_emb(x, flat),
        strict=True,
    ):
        assert float((t - o).abs().max()) <= 20 * (4 + math.log(10000.0)) * 2.0**-23 + 2.0**-22


def test_patched_vision_rotary_saves_and_builds_on_the_meta_device() -> None:
    import io

    from transformers.models.qwen2_vl.modeling_qwen2_vl import get_vision_position_ids

    grid = get_vision_position_ids(torch.tensor([[1, 8, 12]]), 2, kwargs={})
    x = torch.zeros(1, grid.shape[0], 8)
    want = hf.patch_model(_axial_holder("qwen2_vl")).rotary_pos_emb(x, grid)
    buffer = io.BytesIO()
    torch.save(hf.patch_model(_axial_holder("qwen2_vl")), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for a, b in zip(loaded.rotary_pos_emb(x, grid), want, strict=True):
        assert torch.equal(a, b)
    with torch.device("meta"):
        deferred = _axial_holder("qwen2_vl")
    hf.patch_model(deferred)  # checked against a twin built on the CPU from its config
    deferred.to_empty(device="cpu")
    for a, b in zip(deferred.rotary_pos_emb(x, grid), want, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("family", ["neomme"])
def test_patched_mrope_per_layer_type(family: str) -> None:
    # NeoMME (2 axes, no mrope_section in its config): one M-RoPE per layer type, each read
    # channel by channel from the module's output (Cohere Compass, 3 axes, in the family test)
    import copy
    import importlib

    models = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    configs = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    config_class = next(getattr(configs, n) for n in dir(configs) if n.endswith("Config")
                        and n != "PreTrainedConfig" and "Vision" not in n)  # fmt: skip
    config = config_class()
    config = getattr(config, "text_config", None) or config
    rotary_class = next(getattr(models, n) for n in dir(models) if n.endswith("RotaryEmbedding")
                        and "Vision" not in n)  # fmt: skip
    holder = torch.nn.Module()
    holder.rotary_emb = rotary_class(config)
    steps = torch.arange(60)
    axes = 2 if family == "neomme" else 3
    positions = torch.stack([steps // 7 + a * (steps % 7) for a in range(axes)])[:, None]
    x = torch.zeros(1, 60, 8)
    want = {lt: holder.rotary_emb(x, positions, lt) for lt in holder.rotary_emb.rope_type}
    hf.patch_model(holder)
    new = holder.rotary_emb
    assert type(new).__name__ == "HFLayerTypes"
    tol = 70 * (4 + math.log(1e6)) * 2.0**-23 + 2.0**-22  # positions below 70
    for lt, tables in want.items():
        assert torch.equal(getattr(new, f"{lt}_inv_freq"), new.per_type[lt].inv_freq)
        for t, o in zip(tables, new(x, positions, lt), strict=True):
            assert t.shape == o.shape and float((t - o).abs().max()) <= tol
        for a, b in zip(copy.deepcopy(new)(x, positions, lt), new(x, positions, lt), strict=True):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="layer_type must be one of"):
        new(x, positions, "nope")


def test_patched_module_keeps_the_settings_models_read_off_it() -> None:
    # HunYuan-VL reads its rotary module's mrope_section to build position ids (the family
    # test runs it); here a plain setting of a one-axis module
    holder = _module_of("llama")
    holder.rotary_emb.window_layout = [2, 2, 2, 2]
    cached = holder.rotary_emb.max_seq_len_cached
    hf.patch_model(holder)
    assert type(holder.rotary_emb).__name__ == "HFRotaryEmbedding"
    assert holder.rotary_emb.window_layout == [2, 2, 2, 2]
    assert holder.rotary_emb.max_seq_len_cached == cached
