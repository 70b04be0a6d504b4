"""vLLM as a ``posenc rope --engines`` engine: its reader against transformers' reading.

Runs only where ``posenc engines build vllm`` has built its environment. The
expected verdicts are written from vLLM 0.33.0's source (files named relative to the
``vllm`` package), not from the runner: all configs go to one batch child process
(``engines.run_cases``), since importing vLLM takes seconds.
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

VLLM_PYTHON = engines.engine_python("vllm")
READER = engines.ENGINES["vllm"].reader

#: A tiny Llama: head_dim 64, 4096 positions.
LLAMA: dict[str, Any] = {
    "model_type": "llama",
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


def _longrope(**extra: Any) -> dict[str, Any]:
    scaling = {"type": "longrope", "short_factor": [1.0 + k / 64 for k in range(32)],
               "long_factor": [1.0 + k / 8 for k in range(32)],
               "original_max_position_embeddings": 1024}  # fmt: skip
    return _llama(model_type="phi3", rope_theta=10000.0, rope_scaling=scaling,
                  original_max_position_embeddings=1024, **extra)  # fmt: skip


def _deepseek(**scaling: Any) -> dict[str, Any]:
    return _llama(model_type="deepseek_v3", kv_lora_rank=64, q_lora_rank=None,
                  qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32,
                  n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=2,
                  rope_theta=10000.0, rope_scaling=scaling)  # fmt: skip


def _gemma3(**extra: Any) -> dict[str, Any]:
    return _llama(model_type="gemma3_text", head_dim=64, sliding_window=512,
                  layer_types=["sliding_attention", "full_attention"], **extra)  # fmt: skip


def _qwen2_vl(section: list[int]) -> dict[str, Any]:
    return _llama(model_type="qwen2_vl", rope_theta=1000000.0,
                  rope_scaling={"type": "mrope", "mrope_section": section})  # fmt: skip


def _qwen3_vl() -> dict[str, Any]:
    text = _llama(model_type="qwen3_vl_text", head_dim=64, rope_theta=5000000.0,
                  rope_scaling={"rope_type": "default", "mrope_section": [11, 11, 10],
                                "mrope_interleaved": True})  # fmt: skip
    return {"model_type": "qwen3_vl", "text_config": text, "vision_config": {}}


def _cross(name: str) -> dict[str, Any]:
    """A case of the cross-engine table (engine_cases.py), as the table runs it."""
    return CROSS_CASES[name].data()


YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}

#: (case id, config, expected verdict). Each expectation cites the vLLM code it follows.
CASES: list[tuple[str, dict[str, Any], str]] = [
    # model_executor/layers/rotary_embedding/base.py: RotaryEmbedding._compute_cos_sin_cache
    ("default-v4", _llama(rope_theta=10000.0), "same"),
    (
        "default-v5",
        _llama(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
        "same",
    ),
    # rotary_embedding/linear_scaling_rope.py: LinearScalingRotaryEmbedding
    ("linear", _llama(rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0}), "same"),
    # rotary_embedding/dynamic_ntk_scaling_rope.py: DynamicNTKScalingRotaryEmbedding.
    # _compute_cos_sin_cache: one table of max_position_embeddings rows, its base scaled by
    # (factor * max_position / max_trained_positions - (factor - 1)) = 1 (max_trained
    # defaults to max_position): positions past it raise IndexError in base.py:
    # RotaryEmbedding.forward_static (the runner also asks for 2 * 4096 tokens), although
    # vLLM's own max_model_len for this config is 8192 (config/model.py
    # _get_and_verify_max_len multiplies max_position_embeddings by the dynamic factor)
    (
        "dynamic",
        _llama(rope_theta=10000.0, rope_scaling={"type": "dynamic", "factor": 2.0}),
        "refused",
    ),
    # rotary_embedding/yarn_scaling_rope.py: YaRNScalingRotaryEmbedding
    ("yarn", _llama(rope_theta=10000.0, rope_scaling=YARN), "same"),
    (
        "yarn-attention-factor-v5",
        _llama(
            rope_parameters={
                "factor": 4.0,
                "original_max_position_embeddings": 1024,
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "attention_factor": 1.2,
            }
        ),
        "same",
    ),
    # rotary_embedding/phi3_long_rope_scaled_rope.py: Phi3LongRoPEScaledRotaryEmbedding.
    # __init__ picks one factor set for every length (use_long_rope = max_model_len >
    # original_max_position_embeddings; config/model.py makes max_model_len the original
    # 1024 for longrope), short here: transformers' long factors at seq_len 4096 differ
    ("longrope", _longrope(), "different"),
    # rotary_embedding/llama3_rope.py: Llama3RotaryEmbedding
    (
        "llama3",
        _llama(
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        ),
        "same",
    ),
    # rotary_embedding/gemma4_rope.py: Gemma4RotaryEmbedding (get_rope's "proportional")
    (
        "proportional",
        _llama(
            rope_parameters={
                "rope_type": "proportional",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            }
        ),
        "same",
    ),
    # models/deepseek_v2.py: DeepseekV2MLAAttention renames yarn to deepseek_yarn;
    # rotary_embedding/deepseek_scaling_rope.py: DeepseekScalingRotaryEmbedding
    ("deepseek-mscale", _deepseek(**YARN, mscale=1.0, mscale_all_dim=1.0), "same"),
    ("deepseek-mscale-0.707", _deepseek(**YARN, mscale=0.707, mscale_all_dim=0.707), "same"),
    ("deepseek-mscale-unequal", _deepseek(**YARN, mscale=1.0, mscale_all_dim=0.5), "same"),
    ("deepseek-yarn-plain", _deepseek(**YARN), "same"),
    # transformers_utils/config.py: patch_rope_parameters folds partial_rotary_factor in;
    # rotary_embedding/__init__.py: get_rope's rotary_dim = head_size * factor
    (
        "partial-stablelm",
        _llama(
            model_type="stablelm",
            rope_theta=10000.0,
            partial_rotary_factor=0.25,
            layer_norm_eps=1e-5,
        ),
        "same",
    ),
    # rotary_embedding/mrope.py: MRotaryEmbedding.forward_native (sections)
    ("mrope-qwen2-vl", _qwen2_vl([8, 12, 12]), "same"),
    # rotary_embedding/mrope.py: apply_interleaved_rope
    ("mrope-qwen3-vl-interleaved", _qwen3_vl(), "same"),
    # models/gemma3.py: Gemma3Attention reads rope_parameters[layer_type]
    (
        "gemma3-v4",
        _gemma3(
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
        ),
        "same",
    ),
    (
        "gemma3-v5",
        _gemma3(
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            }
        ),
        "same",
    ),
    # a model_type transformers does not know: read as models/llama.py reads it (the
    # answer's "fallback" says so: test_fallback_is_named)
    ("unknown-model-type", _llama(model_type="posenc_unknown", rope_theta=10000.0), "same"),
    # The cross-engine table's bug-report cases (engine_cases.py).
    # models/gpt_oss.py OAIAttention.__init__: get_rope with rope_type "yarn" and
    # rope_parameters.get("truncate", True): truncate false reaches
    # rotary_embedding/yarn_scaling_rope.py YaRNScalingRotaryEmbedding (the correction
    # range not rounded, as transformers' truncate=False; vllm #28244), float32 tables
    ("gpt-oss yarn truncate", _cross("gpt-oss yarn truncate"), "same"),
    ("v5 gpt-oss yarn truncate", _cross("v5 gpt-oss yarn truncate"), "same"),
    # models/deepseek_v2.py: deepseek_yarn, mscale / mscale_all_dim 0.707 in the tables
    # (deepseek_scaling_rope.py) and mscale(factor, mscale_all_dim) ** 2 in the softmax scale
    ("deepseek-v2 mscale 0.707", _cross("deepseek-v2 mscale 0.707"), "same"),
    ("v5 deepseek mscale", _cross("v5 deepseek mscale"), "same"),
    # models/registry.py: SmolLM3ForCausalLM is in _TRANSFORMERS_SUPPORTED_MODELS, run by
    # the Transformers modeling backend (models/transformers/base.py: AutoModel.from_config,
    # its rotary_emb kept): transformers' SmolLM3Attention skips RoPE where
    # no_rope_layers[layer] is 0 (use_rope), so layer 3 is not rotated, as in transformers
    ("smollm3 no_rope_layers", _cross("smollm3 no_rope_layers"), "same"),
    ("v5 smollm3 no_rope_layers", _cross("v5 smollm3 no_rope_layers"), "same"),
    # models/registry.py: Cohere2ForCausalLM -> models/commandr.py CohereForCausalLM;
    # CohereAttention.__init__ builds get_rope(is_neox_style=False) (interleaved pairs) and
    # CohereAttention.forward applies it only when self.v1 or self.sliding_window (a
    # Cohere2Config's sliding_attention layers): the full-attention layer 3 is not rotated
    ("cohere2 nope", _cross("cohere2 nope"), "same"),
    ("v5 cohere2 nope", _cross("v5 cohere2 nope"), "same"),
    # as "longrope": Phi3LongRoPEScaledRotaryEmbedding.__init__ picks the short factors once
    # (max_model_len defaults to original_max_position_embeddings 4096, config/model.py
    # _get_and_verify_max_len), where transformers takes the long ones past 4096
    ("v5 longrope", _cross("v5 longrope"), "different"),
    # models/qwen3_5.py Qwen3_5DecoderLayer -> models/qwen3_next.py Qwen3NextAttention:
    # get_rope(rope_parameters) reads partial_rotary_factor 0.25 (rotary_dim 64) and
    # mrope_section / mrope_interleaved: rotary_embedding/mrope.py MRotaryEmbedding
    # (ModelConfig itself refuses this config here: the CPU environment lacks the
    # compressed_tensors package models/qwen3_5.py imports; get_config reads it)
    ("mrope interleaved partial", _cross("mrope interleaved partial"), "same"),
]


def batch() -> dict[str, engines.EngineResult]:
    """Every case's result, from one batch child process (vLLM imported once); the suite
    runs it in the background (tests/background.py).

    vLLM's ``dtype="auto"`` computes the tables of these float32 configs in bfloat16 (it
    downcasts float32 models); the cases ask for float32 (vLLM's ``--dtype float32``)
    so that the comparison measures the RoPE, not the cast.
    """
    os.environ["POSENC_VLLM_DTYPE"] = "float32"  # the job's own process
    found = engines.run_cases("vllm", [config for _, config, _ in CASES], VLLM_PYTHON)
    return {case: result for (case, _, _), result in zip(CASES, found, strict=True)}


@pytest.fixture(scope="module")
def results():
    built_engine("vllm")
    return background.result("batch-test_engine_vllm")


@pytest.mark.parametrize(("case", "expected"), [(c, e) for c, _, e in CASES])
def test_verdict(results: dict[str, engines.EngineResult], case: str, expected: str) -> None:
    """vLLM's tables against transformers': the verdict written from vLLM's source."""
    result = results[case]
    assert result.verdict == expected, (result.note, result.first_difference)
    if expected == "same":
        assert result.version is not None and result.version.startswith("vllm 0.33.0")


def test_deepseek_softmax_scale(results: dict[str, engines.EngineResult]) -> None:
    """DeepSeek's YaRN mscale lives in the softmax scale (models/deepseek_v2.py)."""
    scale = results["deepseek-mscale-unequal"].attention_scaling["softmax_scale"]
    mscale = 0.1 * 0.5 * math.log(4.0) + 1.0  # yarn_get_mscale(factor 4, mscale_all_dim)
    assert scale["engine"] == pytest.approx((32 + 64) ** -0.5 * mscale * mscale, rel=1e-12)


def _pipe(request: dict[str, Any], **env: str) -> dict[str, Any]:
    built_engine("vllm")
    proc = subprocess.run([str(VLLM_PYTHON), str(READER)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300,
                          env={**engines.child_env(), **env}, check=True)  # fmt: skip
    return json.loads(proc.stdout)


def test_raw_request_against_formula() -> None:
    """A batch piped into the reader: default RoPE in vLLM's own dtype, and M-RoPE rows.

    cos(p * theta ** (-2k / d)) in float64, within the reader's dtype's half ulp plus the
    float32 angle's error (p * 2 ** -24 relative, as vLLM computes t * inv_freq).
    """
    theta, positions = 10000.0, [0, 1, 7, 1000, 4095]
    mrope = _qwen2_vl([8, 12, 12])
    ids = [[3, 3], [5, 0], [9, 2]]  # (temporal, height, width) of two rows
    answer = _pipe({"batch": [
        {"config": _llama(rope_theta=theta, torch_dtype="bfloat16"),
         "windows": [{"seq_len": 4096, "positions": positions}]},
        {"config": mrope, "windows": [{"seq_len": 16, "positions": [0, 1],
                                       "position_ids": ids}]},
    ]})["batch"]  # fmt: skip
    default, sectioned = answer
    assert default["dtype"] == "bfloat16"  # vLLM's dtype="auto" for a bf16 config
    assert default["layout"] == "half" and default["rotary_dim"] == 64
    eps = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}[default["dtype"]]
    d = 64
    for row, p in enumerate(positions):
        for k in range(d // 2):
            angle = p * theta ** (-2 * k / d)
            tol = eps + abs(angle) * 2.0**-23
            assert default["windows"][0]["cos"][row][k] == pytest.approx(math.cos(angle), abs=tol)
            assert default["windows"][0]["sin"][row][k] == pytest.approx(math.sin(angle), abs=tol)
    # M-RoPE (rotary_embedding/mrope.py: MRotaryEmbedding.forward_native): pair k turns with
    # the temporal, height or width position as mrope_section [8, 12, 12] assigns it
    theta = mrope["rope_theta"]
    for row in range(2):
        for k in range(d // 2):
            axis = 0 if k < 8 else 1 if k < 20 else 2
            angle = ids[axis][row] * theta ** (-2 * k / d)
            got = sectioned["windows"][0]["cos"][row][k]
            assert got == pytest.approx(math.cos(angle), abs=2.0**-8 + abs(angle) * 2.0**-23)


def test_nope_layers_are_not_rotated(results: dict[str, engines.EngineResult]) -> None:
    """The window at the layer transformers leaves without RoPE: vLLM's reader says it does
    not rotate it (commandr.py CohereAttention.forward; transformers' SmolLM3Attention in
    the Transformers backend)."""
    for case in ("cohere2 nope", "v5 cohere2 nope", "smollm3 no_rope_layers"):
        nope = [w for w in results[case].windows if w["nope"]]
        assert nope and all(w["rotates"] is False and w["same"] for w in nope), case
        assert all(w["rotates"] for w in results[case].windows if not w["nope"]), case


def test_longrope_switching_rule(results: dict[str, engines.EngineResult]) -> None:
    """LongRoPE's switch is named from phi3_long_rope_scaled_rope.py; plain RoPEs have none."""
    for case in ("longrope", "v5 longrope"):
        switching = results[case].switching
        assert switching is not None
        assert "Phi3LongRoPEScaledRotaryEmbedding.__init__" in switching
        assert switching.endswith("short factors")  # max_model_len 4096 (1024): short
    assert results["yarn"].switching is None


def test_fallback_and_backend_answers() -> None:
    """A model read as another model's file says so (``fallback``); the Transformers
    backend's answers carry ``rotates`` from the modeling file and its switching rule."""
    smollm3 = _cross("smollm3 no_rope_layers")
    smollm3["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    cohere = _cross("cohere2 nope")
    dynamic = _llama(rope_theta=10000.0, rope_scaling={"type": "dynamic", "factor": 2.0})
    answer = _pipe({"batch": [
        {"config": _llama(model_type="posenc_unknown", rope_theta=10000.0),
         "windows": [{"seq_len": 16, "positions": [0, 1]}]},
        {"config": smollm3, "windows": [{"seq_len": 16, "positions": [0, 1], "layer": 3}]},
        {"config": cohere, "windows": [{"seq_len": 16, "positions": [0, 1], "layer": 2},
                                       {"seq_len": 16, "positions": [0, 1], "layer": 3}]},
        {"config": dynamic, "windows": [{"seq_len": 16, "positions": [0, 1]}]},
    ]}, POSENC_VLLM_DTYPE="float32")["batch"]  # fmt: skip
    unknown, smol, cohere2, ntk = answer
    assert unknown["fallback"] == "models/llama.py"
    assert "fallback" not in smol and "fallback" not in cohere2
    # transformers' SmolLM3Attention.use_rope = no_rope_layers[3] = 0: cos 1, sin 0
    assert smol["windows"][0]["rotates"] is False
    assert smol["windows"][0]["cos"] == [[1.0] * 64] * 2
    # dynamic NTK through the backend: max_model_len = 2 x 65536 (config/model.py scales it
    # by factor), so vLLM keeps transformers' per-forward dynamic_rope_update
    assert "dynamic_rope_update" in smol["switching"]
    assert [w["rotates"] for w in cohere2["windows"]] == [True, False]
    assert cohere2["layout"] == "interleaved"
    # vLLM's own dynamic NTK (a table answered within its 4096 rows): fixed at
    # initialisation, dynamic_ntk_scaling_rope.py _compute_cos_sin_cache
    assert ntk["switching"].startswith("never")
    assert "DynamicNTKScalingRotaryEmbedding._compute_cos_sin_cache" in ntk["switching"]
