"""LMDeploy as a ``posenc rope --engines`` engine: its reader against transformers' reading.

Runs only where ``posenc engines build lmdeploy`` has built its environment. The expected
verdicts are written from LMDeploy 0.18.0's source (files named relative to the
``lmdeploy/pytorch`` package), not from the runner: all configs go to one batch child
process (``engines.run_cases``). The rotary modules are the default backend's
(``backends/default/rotary_embedding.py``), which the CUDA backend builds too.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from typing import Any

import pytest

import background
from conftest import built_engine
from posenc.integration.analysis import engines
from posenc.integration.analysis.engine_cases import CASES as CROSS_CASES

LMDEPLOY_PYTHON = engines.engine_python("lmdeploy")
READER = engines.ENGINES["lmdeploy"].reader

#: A tiny Llama: head_dim 64, 4096 positions.
LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}


def _llama(**extra: Any) -> dict[str, Any]:
    return {**LLAMA, **extra}


def _cross(name: str, **extra: Any) -> dict[str, Any]:
    """A case of the cross-engine table (engine_cases.py), as the table runs it."""
    return {**CROSS_CASES[name].data(), **extra}


def _gemma3_v5_default_full() -> dict[str, Any]:
    """Gemma 3 1B's RoPE: no scaling on the full-attention layers."""
    config = _cross("v5 gemma3")
    config["rope_parameters"]["full_attention"] = {"rope_type": "default",
                                                   "rope_theta": 1000000.0}  # fmt: skip
    return config


#: (case id, config, expected verdict). Each expectation cites the LMDeploy code it follows.
CASES: list[tuple[str, dict[str, Any], str]] = [
    # models/llama.py LlamaModel.__init__: build_rotary_embedding_from_config (nn/
    # rotary_embedding.py), get_rope_theta reads rope_parameters' rope_theta;
    # backends/default/rotary_embedding.py RotaryEmbeddingImpl
    ("default", _cross("default"), "same"),
    # nn/rotary_embedding.py _get_linear_scaling_rope_parameters: scaling_factor divides the
    # position ids (_rotary_embedding_fwd)
    ("linear", _cross("linear"), "same"),
    # LlamaDynamicNTKScalingRotaryEmbedding.forward: the base rescaled from max(position_ids)
    # + 1 past max_position_embeddings, as transformers' dynamic_rope_update (a prefill of
    # seq_len tokens)
    ("dynamic", _cross("dynamic"), "same"),
    # nn/rotary_embedding.py _get_yarn_parameters (original_max_position_embeddings as the
    # module's max_position_embeddings, attention_factor 0.1 ln 4 + 1);
    # YarnRotaryEmbeddingImpl
    ("yarn", _cross("yarn"), "same"),
    # _get_yarn_parameters: a given attention_factor is used as the mscale
    ("yarn attention_factor", _cross("yarn attention_factor"), "same"),
    # models/deepseek_v2.py DeepseekV2Model.__init__ (qk_rope_head_dim, build_rotary_params):
    # attention_factor mscale / mscale_all_dim = 1; DeepseekV2Attention.__init__ multiplies
    # yarn_get_mscale(40, 1) ** 2 into the softmax scale, as transformers; rope channels
    # de-interleaved at load (_load_weight_attention: __update_pe), interleaved on the
    # checkpoint's channels
    ("yarn deepseek mscale", _cross("yarn deepseek mscale"), "same"),
    # LongRoPEScalingRotaryEmbeddingImpl.forward: long factors when max(position_ids) + 1 >
    # original_max_position_embeddings (read from the config's top level by
    # _get_longrope_parameters), short below: transformers' rule at each window's prefill;
    # mscale sqrt(1 + ln(131072 / 4096) / ln 4096) from __init__
    ("longrope", _cross("longrope"), "same"),
    # _get_longrope_parameters: rope_scaling's original_max_position_embeddings wins
    ("longrope inside", _cross("longrope inside"), "same"),
    # Llama3RotaryEmbeddingImpl.__init__ (low/high_freq_factor, original_max_position_embeddings)
    ("llama3", _cross("llama3"), "same"),
    # nn/rotary_embedding.py build_rotary_params: build_funcs has no "proportional": KeyError
    ("proportional", _cross("proportional"), "refused"),
    # models/module_map.py has no StableLmForCausalLM: models/patch.py _get_model_class raises
    ("partial_rotary_factor", _cross("partial_rotary_factor"), "refused"),
    # models/qwen2_vl.py Qwen2Model.__init__ (text_config); MRotaryEmbedding.
    # apply_chunked_mrope on [3, tokens] mrope_position_ids
    ("mrope sections", _cross("mrope sections"), "same"),
    # models/qwen3_vl.py Qwen3VLTextModel (config.text_config); MRotaryEmbedding.
    # apply_interleaved_mrope (ModelConfig.from_pretrained raises on this tiny config's
    # text_config without bos_token_id: configurations/default.py; the reader reads it by
    # config_from_pretrained)
    ("mrope interleaved", _cross("mrope interleaved"), "same"),
    # models/qwen3_5.py Qwen3_5TextModel: build_rotary_params reads partial_rotary_factor from
    # rope_parameters (rotary dim 64), interleaved M-RoPE; layer 0 is full_attention
    # (configurations/qwen3_5.py asks is_bf16_supported of the CUDA device: the reader reads
    # the config by config_from_pretrained)
    ("mrope interleaved partial", _cross("mrope interleaved partial"), "same"),
    # get_rope_parameters reads transformers 5's rope_parameters
    ("v5 llama3", _cross("v5 llama3"), "same"),
    ("v5 yarn", _cross("v5 yarn"), "same"),
    # models/gemma.py GemmaModel.build_rope_emb (transformers >= 5 branch): rotary_emb from
    # rope_parameters["full_attention"] (LinearScaling, its factor), rotary_emb_local from
    # ["sliding_attention"]; GemmaAttention.__init__: (layer_idx + 1) % 6 slides, so layer 5
    # is global, as layer_types says
    ("gemma3", _cross("gemma3"), "same"),
    ("v5 gemma3", _cross("v5 gemma3"), "same"),
    # models/gpt_oss.py GptOssModel.__init__: build_rotary_embedding_from_config;
    # _get_yarn_parameters reads truncate (false): yarn_find_correction_range not rounded
    ("gpt-oss yarn truncate", _cross("gpt-oss yarn truncate"), "same"),
    ("v5 gpt-oss yarn truncate", _cross("v5 gpt-oss yarn truncate"), "same"),
    # as "yarn deepseek mscale": attention_factor get_mscale(40, 0.707) / get_mscale(40, 0.707)
    # = 1, softmax scale times yarn_get_mscale(40, 0.707) ** 2
    ("deepseek-v2 mscale 0.707", _cross("deepseek-v2 mscale 0.707"), "same"),
    ("v5 deepseek mscale", _cross("v5 deepseek mscale"), "same"),
    # models/module_map.py has no SmolLM3ForCausalLM nor Cohere2ForCausalLM:
    # models/patch.py _get_model_class raises
    ("smollm3 no_rope_layers", _cross("smollm3 no_rope_layers"), "refused"),
    ("v5 smollm3 no_rope_layers", _cross("v5 smollm3 no_rope_layers"), "refused"),
    ("cohere2 nope", _cross("cohere2 nope"), "refused"),
    ("v5 cohere2 nope", _cross("v5 cohere2 nope"), "refused"),
    # as "longrope": _get_longrope_parameters reads rope_parameters
    ("v5 longrope", _cross("v5 longrope"), "same"),
    # near misses, from the same code:
    # models/gemma.py GemmaModel.build_rope_emb reads full_attention['factor'] whatever its
    # rope_type: Gemma 3 1B's unscaled full-attention RoPE raises KeyError
    ("gemma3 unscaled full attention", _gemma3_v5_default_full(), "refused"),
    # GemmaAttention.__init__ slides every layer but each 6th ((layer_idx + 1) %
    # sliding_window_pattern, default 6), not by layer_types: layer 1, full attention in
    # layer_types, gets the local RoPE (base 10000, unscaled)
    (
        "gemma3 layer_types not every 6th",
        _cross(
            "v5 gemma3", num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"]
        ),
        "different",
    ),
    # _get_yarn_parameters: YarnParameters.mscale defaults to 1, so mscale_all_dim alone
    # gives attention_factor get_mscale(4, 1) / get_mscale(4, 0.707); transformers'
    # _compute_yarn_parameters needs both keys and takes get_mscale(4) = 1.139
    (
        "yarn mscale_all_dim only",
        _cross(
            "yarn",
            rope_scaling={**CROSS_CASES["yarn"].config["rope_scaling"], "mscale_all_dim": 0.707},
        ),
        "different",
    ),
    # models/glm4.py Glm4Model.__init__ (partial_rotary_factor 0.5: rotary dim 32);
    # Glm4Attention.forward rotates interleaved pairs (_extract_rope / _fill_rope), as
    # transformers' Glm4 does
    (
        "glm4 interleaved partial",
        _llama(
            model_type="glm4",
            architectures=["Glm4ForCausalLM"],
            head_dim=64,
            partial_rotary_factor=0.5,
            rope_theta=10000.0,
            pad_token_id=0,
        ),
        "same",
    ),
    # no architectures: the reader names transformers' class for the model_type (what a
    # saved checkpoint lists), LlamaForCausalLM -> models/llama.py
    (
        "no architectures",
        {k: v for k, v in _llama(rope_theta=10000.0).items() if k != "architectures"},
        "same",
    ),
]


def batch() -> dict[str, engines.EngineResult]:
    """Every case's result, from one batch child process (lmdeploy imported once); the suite
    runs it in the background (tests/background.py).

    LMDeploy's ``dtype="auto"`` runs these float32 configs in float16
    (config.py: ``_update_torch_dtype``); the cases ask for float32 (the engine's ``dtype``
    argument) so that the comparison measures the RoPE, not the cast.
    """
    os.environ["POSENC_LMDEPLOY_DTYPE"] = "float32"  # the job's own process
    found = engines.run_cases("lmdeploy", [config for _, config, _ in CASES], LMDEPLOY_PYTHON)
    return {case: result for (case, _, _), result in zip(CASES, found, strict=True)}


@pytest.fixture(scope="module")
def results() -> dict[str, engines.EngineResult]:
    built_engine("lmdeploy")
    return background.result("batch-test_engine_lmdeploy")  # type: ignore[return-value]


def test_every_cross_case_has_a_verdict() -> None:
    assert set(CROSS_CASES) <= {case for case, _, _ in CASES}


@pytest.mark.parametrize(("case", "expected"), [(c, e) for c, _, e in CASES])
def test_verdict(results: dict[str, engines.EngineResult], case: str, expected: str) -> None:
    """LMDeploy's tables against transformers': the verdict written from its source."""
    result = results[case]
    assert result.verdict == expected, (result.note, result.first_difference)
    if expected == "same":
        assert result.version is not None and result.version.startswith("lmdeploy 0.18.0")


def test_deepseek_softmax_scale(results: dict[str, engines.EngineResult]) -> None:
    """DeepSeek's YaRN mscale lives in the softmax scale (models/deepseek_v2.py
    DeepseekV2Attention.__init__)."""
    scale = results["deepseek-v2 mscale 0.707"].attention_scaling["softmax_scale"]
    mscale = 0.1 * 0.707 * math.log(40.0) + 1.0  # yarn_get_mscale(factor 40, mscale_all_dim)
    assert scale["engine"] == pytest.approx((32 + 64) ** -0.5 * mscale * mscale, rel=1e-12)


def test_switching_rules(results: dict[str, engines.EngineResult]) -> None:
    """LongRoPE and dynamic NTK switch per forward pass (backends/default/rotary_embedding.py);
    plain RoPEs have no rule."""
    for case in ("longrope", "v5 longrope", "longrope inside"):
        switching = results[case].switching
        assert switching is not None and switching.startswith("per forward pass")
        assert "LongRoPEScalingRotaryEmbeddingImpl" in switching
    dynamic = results["dynamic"].switching
    assert dynamic is not None and "LlamaDynamicNTKScalingRotaryEmbedding.forward" in dynamic
    assert results["yarn"].switching is None


def _pipe(request: dict[str, Any], **env: str) -> dict[str, Any]:
    built_engine("lmdeploy")
    proc = subprocess.run([str(LMDEPLOY_PYTHON), str(READER)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300,
                          env={**engines.child_env(), **env}, check=True)  # fmt: skip
    return json.loads(proc.stdout)


def test_raw_request_against_formula() -> None:
    """A batch piped into the reader in LMDeploy's own dtype (float16 for a float32 config),
    M-RoPE rows, and a Qwen3.5 linear-attention layer without RoPE.

    cos(p * theta ** (-2k / d)) in float64, within float16's half ulp plus the float32
    angle's error.
    """
    theta, positions = 10000.0, [0, 1, 7, 1000, 4095]
    mrope = _cross("mrope sections")
    ids = [[3, 3], [5, 0], [9, 2]]  # (temporal, height, width) of two rows
    qwen35 = _cross("mrope interleaved partial")
    qwen35["text_config"]["layer_types"] = ["linear_attention", "full_attention"]
    qwen35["text_config"]["num_hidden_layers"] = 2
    answer = _pipe({"batch": [
        {"config": _llama(rope_theta=theta),
         "windows": [{"seq_len": 4096, "positions": positions}]},
        {"config": mrope, "windows": [{"seq_len": 16, "positions": [0, 1],
                                       "position_ids": ids}]},
        {"config": qwen35, "windows": [{"seq_len": 16, "positions": [0, 5], "layer": 0},
                                       {"seq_len": 16, "positions": [0, 5], "layer": 1}]},
    ]}, POSENC_LMDEPLOY_DTYPE="auto")["batch"]  # fmt: skip
    default, sectioned, hybrid = answer
    assert default["dtype"] == "float16"  # config.py _update_torch_dtype: auto, float32 config
    assert default["layout"] == "half" and default["rotary_dim"] == 64
    d = 64
    for row, p in enumerate(positions):
        for k in range(d // 2):
            angle = p * theta ** (-2 * k / d)
            tol = 2.0**-11 + abs(angle) * 2.0**-23
            assert default["windows"][0]["cos"][row][k] == pytest.approx(math.cos(angle), abs=tol)
            assert default["windows"][0]["sin"][row][k] == pytest.approx(math.sin(angle), abs=tol)
    # nn/rotary_embedding.py MRotaryEmbedding.apply_chunked_mrope: pair k turns with the
    # temporal, height or width position as mrope_section [16, 24, 24] assigns it
    theta, d = mrope["rope_theta"], 128
    for row in range(2):
        for k in range(d // 2):
            axis = 0 if k < 16 else 1 if k < 40 else 2
            angle = ids[axis][row] * theta ** (-2 * k / d)
            got = sectioned["windows"][0]["cos"][row][k]
            assert got == pytest.approx(math.cos(angle), abs=2.0**-11 + abs(angle) * 2.0**-23)
    # models/qwen3_5.py Qwen3_5DecoderLayer.__init__: a linear_attention layer has no RoPE
    linear, full = hybrid["windows"]
    assert linear["rotates"] is False and all(v == 1.0 for row in linear["cos"] for v in row)
    assert full["rotates"] is True and hybrid["rotary_dim"] == 64


def test_fallback_is_named() -> None:
    """A model file the reader does not restate (models/glm4_moe.py) is read as
    models/llama.py builds its rotary module, and the answer says so."""
    config = _llama(model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"], head_dim=64,
                    partial_rotary_factor=0.5, rope_theta=10000.0, n_routed_experts=4)  # fmt: skip
    answer = _pipe({"config": config, "windows": [{"seq_len": 8, "positions": [0, 7]}]})
    assert answer["fallback"] == "models/llama.py"
    assert "glm4_moe.py is not restated" in answer["note"]
