"""MaxText as a ``posenc rope --engines`` engine: its reader against transformers' reading.

Runs only where ``posenc engines build maxtext`` has built its environment (maxtext 0.2.5
installed --no-deps on Python 3.11 with jax 0.10.2: engine_recipes/maxtext.sh). MaxText reads
its own YAML, so the reader restates the HF config as MaxText keys (its note says so); the
rest is MaxText's own code: ``configs/pyconfig.py: initialize`` (validation by
``configs/types.py: MaxTextConfig``), ``layers/attentions.py: Attention`` (its
``init_rotary_embedding`` picks the class) and the class of ``layers/embeddings.py`` it picks.
The expected verdicts are written from maxtext 0.2.5's source (files named relative to the
``maxtext`` package), not from the runner. All configs go to one batch child process.
"""

from __future__ import annotations

import json
import math
import subprocess
from typing import Any

import pytest

import background
from conftest import built_engine
from posenc.integration.analysis import engine_cases, engines

MAXTEXT_PYTHON = engines.engine_python("maxtext")
READER = engines.ENGINES["maxtext"].reader

#: The verdict on every case of engine_cases.CASES, each with the MaxText code it follows.
EXPECTED: dict[str, str] = {
    # layers/embeddings.py: RotaryEmbedding (timescale = theta ** (2k / d), half split)
    "default": "same",
    # RotaryEmbedding.timescale times rope_linear_scaling_factor (gemma3-4b.yml's key)
    "linear": "same",
    # configs/types.py: RopeType is default, llama3.1 or yarn: MaxText has no dynamic NTK
    "dynamic": "refused",
    # layers/embeddings.py: YarnRotaryEmbedding (rope_interleave false, rope_attention_scaling
    # true, as gpt-oss-20b.yml and olmo3-7b.yml write YaRN)
    "yarn": "same",
    # YarnRotaryEmbedding.__call__ scales by 0.1 ln(factor) + 1; MaxText has no key for HF's
    # attention_factor (configs/types.py: YarnRope), so 1.2 cannot be carried over
    "yarn attention_factor": "different",
    # layers/attention_mla.py: MLA (YaRN interleave=True, no scale in the tables; mscale on
    # the softmax: MLA.__init__'s softmax_scale)
    "yarn deepseek mscale": "same",
    # configs/types.py: RopeType has no longrope
    "longrope": "refused",
    "longrope inside": "refused",
    # layers/embeddings.py: LLaMARotaryEmbedding._apply_scaling_factor hard-codes Llama 3.1's
    # 8, 1, 4, 8192: these configs' own values
    "llama3": "same",
    # configs/types.py: RopeType has no proportional
    "proportional": "refused",
    # configs/types.py: MaxTextConfig refuses partial_rotary_factor outside qwen3_next/qwen3_5
    # (StableLM has no MaxText decoder: base.yml's llama2)
    "partial_rotary_factor": "refused",
    # layers/embeddings.py: Qwen3OmniMoeThinkerTextRotaryEmbedding._apply_interleaved_mrope
    # always interleaves: Qwen2-VL's contiguous sections differ at multi-axis positions
    "mrope sections": "different",
    "mrope interleaved": "same",
    # maxtext #4616 (partial_rotary_factor ignored on the M-RoPE path), fixed in 0.2.5:
    # attentions.py passes partial_rotary_factor to Qwen3OmniMoeThinkerTextRotaryEmbedding
    "mrope interleaved partial": "same",
    "v5 llama3": "same",
    "v5 yarn": "same",
    # attentions.py: local_rope_max_timescale on LOCAL_SLIDING layers, no linear factor there
    # for model_name gemma3*; models/gemma3.py: get_attention_type (5 local, 1 global)
    "gemma3": "same",
    "v5 gemma3": "same",
    # YarnRotaryEmbedding._find_correction_range: truncate=False keeps the fractional bounds
    "gpt-oss yarn truncate": "same",
    "v5 gpt-oss yarn truncate": "same",
    # MLA softmax mscale 0.707 (mscale = mscale_all_dim: no scale in the tables)
    "deepseek-v2 mscale 0.707": "same",
    "v5 deepseek mscale": "same",
    # models/llama2.py (base.yml's decoder for smollm3) builds Attention without
    # is_nope_layer: MaxText rotates layer 3, which transformers leaves without RoPE
    "smollm3 no_rope_layers": "different",
    "v5 smollm3 no_rope_layers": "different",
    # the same for Cohere 2 (layer 3 rotated), and RotaryEmbedding splits halves where
    # Cohere 2 rotates adjacent channels
    "cohere2 nope": "different",
    "v5 cohere2 nope": "different",
    "v5 longrope": "refused",
}

_SIZES = {"hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4,
          "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 32,
          "torch_dtype": "float32"}  # fmt: skip
_LLAMA = {"model_type": "llama", **_SIZES, "max_position_embeddings": 131072,
          "rope_theta": 500000.0}  # fmt: skip

#: More cases: (id, config, expected verdict), each citing the MaxText code it follows.
EXTRA: list[tuple[str, dict[str, Any], str]] = [
    # maxtext #4616 as Qwen3.5-35B-A3B writes it (hf_model_configs.py: qwen3_5_35b_a3b_dict):
    # qwen3_5_moe, three linear-attention layers then a full one (layer 3), M-RoPE
    # [11, 11, 10] on a quarter of head_dim 256. attentions.py: use_mrope ->
    # Qwen3OmniMoeThinkerTextRotaryEmbedding(partial_rotary_factor=config's 0.25)
    (
        "4616-qwen3.5-moe-partial-mrope",
        {
            "model_type": "qwen3_5_moe",
            "torch_dtype": "float32",
            "text_config": {
                **_SIZES,
                "model_type": "qwen3_5_moe_text",
                "head_dim": 256,
                "num_key_value_heads": 2,
                "num_hidden_layers": 4,
                "layer_types": ["linear_attention"] * 3 + ["full_attention"],
                "max_position_embeddings": 262144,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 32,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000000,
                    "partial_rotary_factor": 0.25,
                    "mrope_section": [11, 11, 10],
                    "mrope_interleaved": True,
                },
            },
            "vision_config": {
                "depth": 1,
                "hidden_size": 64,
                "intermediate_size": 64,
                "num_heads": 2,
                "out_hidden_size": 512,
                "patch_size": 16,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "num_position_embeddings": 16,
            },
        },
        "same",
    ),
    # the near miss: Llama 3.2's llama3 factor 32. LLaMARotaryEmbedding._apply_scaling_factor
    # hard-codes scale_factor = 8 (and 1, 4, 8192), and MaxText has no key for the factor:
    # the low frequencies are divided by 8, transformers divides them by 32
    (
        "near-miss-llama3-factor-32",
        {
            **_LLAMA,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
        "different",
    ),
    # configs/types.py: YarnRope.rope_factor is an int: pydantic refuses 2.5
    (
        "yarn-factor-2.5",
        {
            **_LLAMA,
            "rope_theta": 10000.0,
            "max_position_embeddings": 81920,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 2.5,
                "original_max_position_embeddings": 32768,
            },
        },
        "refused",
    ),
    # MLA with mscale != mscale_all_dim: transformers scales cos/sin by their ratio,
    # MaxText's YarnRotaryEmbedding (rope_attention_scaling false for MLA) by nothing
    (
        "deepseek-mscale-unequal",
        {
            **engine_cases.CASES["yarn deepseek mscale"].data(),
            "rope_scaling": {
                "type": "yarn",
                "factor": 40.0,
                "original_max_position_embeddings": 4096,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 0.5,
            },
        },
        "different",
    ),
]


def _all() -> list[tuple[str, dict[str, Any]]]:
    return [(n, c.data()) for n, c in engine_cases.CASES.items()] + [(n, c) for n, c, _ in EXTRA]


def batch() -> dict[str, engines.EngineResult]:
    """Every case's result, from one batch child process (MaxText imported once)."""
    cases = _all()
    found = engines.run_cases("maxtext", [config for _, config in cases], MAXTEXT_PYTHON)
    return {name: result for (name, _), result in zip(cases, found, strict=True)}


@pytest.fixture(scope="module")
def results() -> dict[str, engines.EngineResult]:
    built_engine("maxtext")
    return background.result("batch-test_engine_maxtext")  # type: ignore[return-value]


def test_every_case_has_an_expectation() -> None:
    """A case added to engine_cases.CASES needs its verdict written from MaxText's source."""
    assert set(EXPECTED) == set(engine_cases.CASES)


_PARAMS = [(n, EXPECTED.get(n, "?")) for n in engine_cases.CASES] + [(n, e) for n, _, e in EXTRA]


@pytest.mark.parametrize(("case", "expected"), _PARAMS)
def test_verdict(results: dict[str, engines.EngineResult], case: str, expected: str) -> None:
    """MaxText's tables against transformers': the verdict written from MaxText's source."""
    result = results[case]
    assert result.verdict == expected, (result.note, result.first_difference)
    if expected != "refused":
        assert result.version is not None and result.version.startswith("maxtext 0.2.5")
        assert "restated" in result.note  # the HF -> MaxText keys step is the reader's


def test_refusals_are_maxtext_validation(results: dict[str, engines.EngineResult]) -> None:
    """The refusals come from MaxText's config validation (configs/types.py)."""
    assert "Input should be 'default', 'llama3.1' or 'yarn'" in results["dynamic"].note
    assert "only effective when `decoder_block`" in results["partial_rotary_factor"].note


def test_near_miss_is_the_hard_coded_factor(results: dict[str, engines.EngineResult]) -> None:
    """Llama 3.2's factor 32: the lowest frequency is divided by 8 in MaxText, not 32."""
    result = results["near-miss-llama3-factor-32"]
    assert "hard-codes 8, 1, 4, 8192" in result.note
    assert result.first_difference is not None


def test_deepseek_softmax_scale(results: dict[str, engines.EngineResult]) -> None:
    """DeepSeek's YaRN mscale lives in MLA's softmax scale (layers/attention_mla.py: MLA)."""
    scale = results["deepseek-v2 mscale 0.707"].attention_scaling["softmax_scale"]
    mscale = 0.1 * 0.707 * math.log(40.0) + 1.0
    assert scale["engine"] == pytest.approx((32 + 64) ** -0.5 * mscale * mscale, rel=1e-12)


def _pipe(request: dict[str, Any]) -> dict[str, Any]:
    built_engine("maxtext")
    proc = subprocess.run([str(MAXTEXT_PYTHON), str(READER)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300,
                          env=engines.child_env(), check=True)  # fmt: skip
    return json.loads(proc.stdout)


def test_raw_request_against_formula() -> None:
    """Default RoPE piped into the reader: cos(p * theta ** (-2k / d)) in float64, within
    float32's half ulp plus the float32 angle's error (RotaryEmbedding divides the float32
    position by a float32 timescale); and the note names the restated and stubbed steps."""
    theta, positions, d = 10000.0, [0, 1, 7, 1000, 4095], 64
    config = {**_SIZES, "model_type": "llama", "hidden_size": 256, "rope_theta": theta,
              "max_position_embeddings": 4096}  # fmt: skip
    answer = _pipe({"config": config, "windows": [{"seq_len": 4096, "positions": positions}]})
    assert answer["dtype"] == "float32" and answer["layout"] == "half"
    assert answer["rotary_dim"] == d and answer["switching"] is None
    assert "RotaryEmbedding" in answer["module"]
    assert answer["note"].startswith("restated")
    window = answer["windows"][0]
    assert window["rotates"] is True
    for row, p in enumerate(positions):
        for k in range(d // 2):
            angle = p * theta ** (-2 * k / d)
            tol = 2.0**-24 + abs(angle) * 2.0**-22
            assert window["cos"][row][k] == pytest.approx(math.cos(angle), abs=tol)
            assert window["sin"][row][k] == pytest.approx(math.sin(angle), abs=tol)
