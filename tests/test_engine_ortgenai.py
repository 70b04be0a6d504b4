"""ONNX Runtime GenAI as a ``posenc rope --engines`` engine, checked once it is built.

The reader (``engine_readers/ortgenai_reader.py``) saves a tiny random-weight checkpoint
of each config, builds it with onnxruntime-genai 0.18.0's model builder
(``onnxruntime_genai/models/builder.py``: ``create_model``, ``-p fp32 -e cpu``) and reads
the rotary caches the builder wrote into the ONNX graph (running LongRoPE's ``If`` and the
graph's ``RotaryEmbedding`` / ``MRotaryEmbedding`` nodes with ONNX Runtime). The expected
verdicts are written from the builder's source (files named relative to
``onnxruntime_genai/models/``), not from the runner. All configs go to the reader in one
batch (one child process: torch, transformers and the builder imported once), and the
end-to-end logits in another.
"""

from __future__ import annotations

import json
import math
import subprocess
from typing import Any

import numpy as np
import pytest

import background
from conftest import built_engine
from posenc.integration.analysis import engine_cases, engines

ENGINE = "onnxruntime-genai"
READER = engines.ENGINES[ENGINE].reader

#: Every case of the cross-engine table (engine_cases.CASES): its verdict, and why, from
#: the builder's source. A case missing here fails test_every_case_has_a_verdict.
EXPECTED: dict[str, str] = {
    # builders/base.py: Model.make_rotary_embedding_caches_from_scratch, theta from
    # rope_theta (Model.__init__), max_position_embeddings rows, half layout
    # (rope_attrs["interleaved"] = 0), fused in GroupQueryAttention (do_rotary) on CPU fp32
    "default": "same",
    # builders/llama.py: LlamaModel.make_rope_init replaces Model.make_rope_init and handles
    # "llama3" only: the linear factor is dropped (plain RoPE tables)
    "linear": "different",
    # builders/llama.py: LlamaModel.make_rope_init drops "dynamic" too: a cache of
    # max_position_embeddings (4096) rows; a prefill of 8192 tokens is ONNX Runtime's
    # GroupQueryAttention's error ("cos_cache dimension 0 shall not be less than
    # total_sequence_length")
    "dynamic": "refused",
    # builders/base.py: Model.make_rope_init reads beta_fast / beta_slow with a default of
    # 0 (transformers: 32 / 1): Model.make_inv_freq_rescaled_with_ntk divides by
    # ntk_beta * 2 pi = 0 (ZeroDivisionError) for Qwen2.5's YaRN, which gives neither
    "yarn": "refused",
    "yarn attention_factor": "refused",
    "v5 yarn": "refused",
    # builder.py: create_model dispatches on architectures[0]: no DeepseekV2/V3 builder
    # (NotImplementedError "... model is not currently supported")
    "yarn deepseek mscale": "refused",
    "deepseek-v2 mscale 0.707": "refused",
    "v5 deepseek mscale": "refused",
    # builder.py: Phi3ForCausalLM with max_position_embeddings != original ->
    # builders/phi.py: Phi3MiniLongRoPEModel.make_rope_init (short/long factors, mscale
    # sqrt(1 + ln(f) / ln(original)): Model.make_mscale_su) and
    # builders/base.py: Model.make_rotary_embedding_multi_cache: an If on the attention
    # mask's length > original_max_position_embeddings picks the long set, as transformers
    "longrope": "same",
    # builders/phi.py: Phi3MiniLongRoPEModel.make_rope_init reads rope_parameters["type"]:
    # a config with rope_type only (no legacy "type") is a KeyError
    "v5 longrope": "refused",
    # a llama model_type: builders/llama.py: LlamaModel.make_rope_init drops longrope
    # (plain tables, scaling 1)
    "longrope inside": "different",
    # builders/llama.py: LlamaModel.make_rope_init (low/high_freq_factor) and
    # builders/base.py: Model.make_inv_freq_rescaled_with_freq_factors
    "llama3": "same",
    "v5 llama3": "same",
    # builders/base.py: Model.make_config_init lifts partial_rotary_factor out of
    # rope_parameters and LlamaModel.make_rope_init ignores the "proportional" type: the
    # caches rotate a quarter of the head with that quarter's own frequencies
    "proportional": "different",
    # builder.py: create_model: no StableLM builder
    "partial_rotary_factor": "refused",
    # builder.py: create_model: Qwen2-VL is not dispatched (Qwen2.5-VL and Qwen3-VL are)
    "mrope sections": "refused",
    # builders/qwen.py: Qwen3VLTextModel (mrope_layout = 1) and Qwen35Model:
    # MRotaryEmbedding nodes with the config's mrope_section
    "mrope interleaved": "same",
    "mrope interleaved partial": "same",
    # transformers 5 saves Gemma 3's rope settings per layer type (rope_parameters
    # {"full_attention": ..., "sliding_attention": ...}): builders/base.py:
    # Model.make_rope_init reads rope_parameters["rope_type"] (KeyError); only Gemma 4's
    # builder (builders/gemma.py: Gemma4Model.make_rope_init) reads the nested form
    "gemma3": "refused",
    "v5 gemma3": "refused",
    # builders/base.py: Model.make_inv_freq_rescaled_with_ntk ramps between the unrounded
    # low/high (transformers' truncate=False) and builders/gptoss.py computes the tables
    # in float32: GPT-OSS's YaRN matches
    "gpt-oss yarn truncate": "same",
    "v5 gpt-oss yarn truncate": "same",
    # builders/smollm.py: SmolLM3Model.make_attention turns the fused rotary off on a NoPE
    # layer but leaves attention_attrs["rope"] on: builders/base.py:
    # Model.make_attention_qk_rope then builds a RotaryEmbedding node on position_ids,
    # an input GroupQueryAttention's fused rotary removed (KeyError 'position_ids')
    "smollm3 no_rope_layers": "refused",
    "v5 smollm3 no_rope_layers": "refused",
    # builder.py: create_model: no Cohere2 builder
    "cohere2 nope": "refused",
    "v5 cohere2 nope": "refused",
}


def batch() -> dict[str, engines.EngineResult]:
    """Every case's result, from one batch child process."""
    names = list(engine_cases.CASES)
    found = engines.run_cases(ENGINE, [engine_cases.CASES[n].data() for n in names])
    return dict(zip(names, found, strict=True))


@pytest.fixture(scope="module")
def results() -> dict[str, engines.EngineResult]:
    built_engine(ENGINE)
    return background.result("batch-test_engine_ortgenai")  # type: ignore[return-value]


def test_every_case_has_a_verdict() -> None:
    assert sorted(engine_cases.CASES) == sorted(EXPECTED)


@pytest.mark.parametrize("case", list(EXPECTED))
def test_verdict(results: dict[str, engines.EngineResult], case: str) -> None:
    """The builder's tables against transformers': the verdict written from its source."""
    if case not in results:
        pytest.skip(f"{case!r} is no longer in engine_cases.CASES")
    result = results[case]
    assert result.verdict == EXPECTED[case], (result.note, result.first_difference)
    if result.verdict == "refused":
        # the builder's (or ONNX Runtime's) own error, not the reader's
        assert "onnxruntime" in result.note, result.note
    else:
        assert result.version is not None and result.version.startswith("onnxruntime-genai 0.18.0")


def test_differences_are_the_dropped_scalings(results: dict[str, engines.EngineResult]) -> None:
    # LlamaModel.make_rope_init drops "linear" and "longrope": the tables are plain RoPE,
    # scaling 1 where transformers has LongRoPE's sqrt(1 + ln 32 / ln 4096)
    assert results["linear"].attention_scaling["engine"] == pytest.approx(1.0)
    scaling = results["longrope inside"].attention_scaling
    assert scaling["engine"] == pytest.approx(1.0)
    assert scaling["reference"] == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))


def test_refusals_name_the_builder(results: dict[str, engines.EngineResult]) -> None:
    assert "base.py" in results["yarn"].note and "ZeroDivisionError" in results["yarn"].note
    assert "not currently supported" in results["yarn deepseek mscale"].note
    assert "DeepseekV3ForCausalLM" in results["yarn deepseek mscale"].note
    assert "KeyError: 'type'" in results["v5 longrope"].note
    assert "cos_cache dimension 0" in results["dynamic"].note


# --------------------------------------------------------------------------------------
# Raw requests: LongRoPE's switch, read from the graph; a near miss.


def _pipe(request: dict[str, Any]) -> dict[str, Any]:
    python = built_engine(ENGINE)
    proc = subprocess.run([str(python), str(READER)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=600,
                          env=engines.child_env(), check=True)  # fmt: skip
    return json.loads(proc.stdout)


PHI3_SMALL = {
    "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 128,
    "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
    "intermediate_size": 64, "vocab_size": 32, "max_position_embeddings": 4096,
    "original_max_position_embeddings": 1024, "rope_theta": 10000.0, "pad_token_id": 0,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0 + k / 64 for k in range(32)],
                     "long_factor": [1.0 + k / 4 for k in range(32)]},
}  # fmt: skip
GPT_OSS = engine_cases.CASES["gpt-oss yarn truncate"].config if (
    "gpt-oss yarn truncate" in engine_cases.CASES) else None  # fmt: skip


def test_longrope_switch_is_the_graphs_if() -> None:
    """builders/base.py: Model.make_rotary_embedding_multi_cache: the If compares the
    attention mask's length with original_max_position_embeddings (1024): 1024 tokens
    take the short factors, 1025 the long ones, as transformers (seq_len > original)."""
    windows = [{"seq_len": n, "positions": [0, 1, 1000]} for n in (1024, 1025)]
    answer = _pipe({"config": PHI3_SMALL, "windows": windows})
    assert "> 1024" in answer["switching"] and "attention mask" in answer["switching"]
    short, long = answer["windows"]
    assert "1024 rows" in short["mode"] and "4096 rows" in long["mode"]
    mscale = math.sqrt(1 + math.log(4) / math.log(1024))  # both sets: Model.make_mscale_su
    d, p, k = 64, 1000, 20
    for window, factor in ((short, 1.0 + k / 64), (long, 1.0 + k / 4)):
        angle = p / (factor * 10000.0 ** (2 * k / d))
        assert window["cos"][2][k] == pytest.approx(mscale * math.cos(angle), abs=2e-5)
        assert window["attention_scaling"] == pytest.approx(mscale, rel=1e-6)


@pytest.mark.skipif(GPT_OSS is None, reason="engine_cases has no GPT-OSS YaRN case")
def test_near_miss_yarn_truncate() -> None:
    """The GPT-OSS YaRN case agrees (truncate false); the same config with transformers'
    default truncate (floor/ceil of the ramp's ends) differs: the builder never rounds
    them (builders/base.py: Model.make_inv_freq_rescaled_with_ntk)."""
    assert GPT_OSS is not None
    config = json.loads(json.dumps(GPT_OSS))
    config["rope_scaling"].pop("truncate")
    same, different = engines.run_cases(ENGINE, [GPT_OSS, config])
    assert same.verdict == "same", same.note
    assert different.verdict == "different", different.note
    assert different.first_difference is not None


def test_yarn_mscale_keys() -> None:
    """DeepSeek's mscale / mscale_all_dim on a model the builder does build (Qwen2's YaRN,
    betas and truncate false given so that the ramp matches): builders/base.py:
    Model.make_mscale multiplies get_mscale(f, mscale) / get_mscale(f, mscale_all_dim)
    into the caches (transformers' attention_factor), but a lone ``mscale`` is taken as
    the multiplier itself (Ministral-3's convention), where transformers keeps
    0.1 ln f + 1; ``attention_factor`` is never read."""
    base = engine_cases.CASES["yarn"].data()
    yarn = {**base["rope_scaling"], "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    variants = {
        "betas": ({}, "same", 0.1 * math.log(4) + 1),
        "mscale 1, mscale_all_dim 0.5": (
            {"mscale": 1.0, "mscale_all_dim": 0.5},
            "same",
            (0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1),
        ),
        "mscale 1 alone": ({"mscale": 1.0}, "different", 1.0),
        "attention_factor 1.2": ({"attention_factor": 1.2}, "different", 0.1 * math.log(4) + 1),
    }
    configs = [{**base, "rope_scaling": {**yarn, **extra}} for extra, _, _ in variants.values()]
    for (name, (_, verdict, scale)), result in zip(
        variants.items(), engines.run_cases(ENGINE, configs), strict=True
    ):
        assert result.verdict == verdict, (name, result.note)
        assert result.attention_scaling["engine"] == pytest.approx(scale, rel=1e-6), name


# --------------------------------------------------------------------------------------
# End-to-end logits: the builder's ONNX model run by ONNX Runtime against transformers.

#: Sizes of the logits checkpoints: intermediate_size 96 so that no MLP projection has
#: 256 (= the vocabulary) outputs: the builder takes any nn.Linear with vocab_size outputs
#: for the LM head (builders/base.py: Model.has_lm_head), and Phi-3's fused gate_up_proj
#: of 2 x 128 would be taken for it.
TINY = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 64, "num_hidden_layers": 2, "intermediate_size": 96,
        "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False}  # fmt: skip
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **TINY}
QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **TINY}
#: beta_fast 8: Model.make_inv_freq_rescaled_with_ntk asserts 0 < low, which an original
#: context of 64 breaks with beta_fast 32 (transformers clamps low at 0)
YARN64 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
          "beta_fast": 8.0, "beta_slow": 1.0}  # fmt: skip
LENGTH = 192
ROWS = [0, 63, 64, 128, 191]

#: name: (config, verdict, why from the builder's source)
LOGITS: dict[str, tuple[dict[str, Any], str]] = {
    # builders/base.py: Model.make_rotary_embedding_caches_from_scratch
    "llama default": (LLAMA, "same"),
    # builders/llama.py: LlamaModel.make_rope_init drops yarn: the table difference
    # ("linear" / "longrope inside" in the table) moves the logits by ~1
    "llama yarn": ({**LLAMA, "rope_scaling": {**YARN64, "truncate": False}}, "different"),
    # builders/llama.py: LlamaModel.make_rope_init, llama3's frequency factors
    "llama llama3": (
        {
            **LLAMA,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
        "same",
    ),
    # builders/phi.py: Phi3MiniLongRoPEModel, the If on the mask's length > 64: a prompt
    # of 192 tokens takes the long factors in both
    "phi3 longrope": (
        {
            **LLAMA,
            "model_type": "phi3",
            "architectures": ["Phi3ForCausalLM"],
            "hidden_act": "silu",
            "original_max_position_embeddings": 64,
            "pad_token_id": 0,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0 + 0.01 * k for k in range(32)],
                "long_factor": [1.0 + 0.25 * k for k in range(32)],
            },
        },
        "same",
    ),
    # builders/base.py: Model.make_rope_init + make_inv_freq_rescaled_with_ntk: YaRN with
    # the ramp's ends unrounded (truncate false in transformers): the same
    "qwen2 yarn truncate false": ({**QWEN2, "rope_scaling": {**YARN64, "truncate": False}}, "same"),
    # builders/base.py: Model.make_mscale: attention_factor is never read (mscale
    # 0.1 ln 4 + 1 = 1.139 multiplied into the caches, transformers 1.2)
    "qwen2 yarn attention_factor": (
        {**QWEN2, "rope_scaling": {**YARN64, "truncate": False, "attention_factor": 1.2}},
        "different",
    ),
    # the near miss of "qwen2 yarn truncate false": transformers' default truncate rounds
    # the ramp's ends (floor / ceil), the builder does not
    "qwen2 yarn truncate default": ({**QWEN2, "rope_scaling": dict(YARN64)}, "different"),
}


@pytest.fixture(scope="module")
def logits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Any, float]]:
    """Each case's (engine answer, float64 reference, tolerance), one reader batch."""
    from posenc.integration.analysis import engine_logits as el

    python = built_engine(ENGINE)
    pytest.importorskip("sentencepiece")
    root = tmp_path_factory.mktemp("ortgenai-logits")
    tokens = el.prompt(LENGTH)
    requests, refs = [], []
    for name, (config, _) in LOGITS.items():
        directory = el.write_checkpoint(config, root / name.replace(" ", "-"))
        ref = el.reference_logits(directory, tokens, ROWS)
        refs.append((ref, el.tolerance(ref, config, LENGTH)))
        requests.append({"logits": {"checkpoint": str(directory), "tokens": tokens,
                                    "rows": ROWS}})  # fmt: skip
    status, answer = engines.call_reader(python, engines.ENGINES[ENGINE],
                                         {"batch": requests}, 900)  # fmt: skip
    assert status == "ok", answer
    return {
        name: (one, ref, tol)
        for name, one, (ref, tol) in zip(LOGITS, answer["batch"], refs, strict=True)
    }


@pytest.mark.parametrize("case", list(LOGITS))
def test_logits(logits: dict[str, tuple[Any, Any, float]], case: str) -> None:
    answer, ref, tol = logits[case]
    assert "refused" not in answer, answer
    assert answer["rows"] == ROWS and answer["dtype"] == "float32"
    assert "builder.py: create_model" in answer["converter"]
    diff = np.max(np.abs(np.asarray(answer["logits"]) - ref), axis=1)
    if LOGITS[case][1] == "same":
        assert float(np.max(diff)) <= tol, diff
    else:
        # row 0 attends to itself only: no RoPE there, the same; later rows move by ~1
        assert diff[0] <= tol and float(np.max(diff[1:])) > 100 * tol, diff


def test_genai_generator_gives_the_last_row_only(
    logits: dict[str, tuple[Any, Any, float]],
) -> None:
    # og.Generator.get_output("logits") after append_tokens: one row, the prompt's last,
    # equal to ONNX Runtime's last row of the full prefill
    answer, _, _ = logits["llama default"]
    assert "last position only" in answer["note"] and "by 0" in answer["note"], answer["note"]
