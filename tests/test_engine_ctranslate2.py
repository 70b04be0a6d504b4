"""CTranslate2 as a ``posenc rope --engines`` engine, checked once it is built.

The reader (``engine_readers/ctranslate2_reader.py``) runs CTranslate2 4.8.5's
``TransformersConverter`` (its loader for the config's class) on each config, reads the
rotary attributes the converter writes into the model spec, and restates the C++ runtime's
table (``src/layers/attention_layer.cc``: ``RotaryEmbeddings::initialize``; not in the
wheel's Python). The end-to-end logits (a tiny checkpoint converted with
``TransformersConverter``, run by ``ctranslate2.Generator.forward_batch`` on the CPU in
float32) check both against transformers, and the restated step against the runtime.

The expected verdicts are written from CTranslate2's source (``ctranslate2/...`` files of
the 4.8.5 wheel, ``src/...`` files of the C++ source), not from the runner. All configs go
to the reader in one batch (one child process), the logits in another.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import background
from conftest import built_engine
from posenc.integration.analysis import engine_cases, engines

ENGINE = "ctranslate2"
READER = engines.ENGINES[ENGINE].reader
NO_LOADER = "No conversion is registered for the model configuration"
NOT_IMPLEMENTED = "NotImplementedError: RoPE scaling type"

#: Every case of the cross-engine table (engine_cases.CASES): its verdict, and why, from
#: CTranslate2's source. A case missing here fails test_every_case_has_a_verdict.
EXPECTED: dict[str, str] = {
    # converters/transformers.py: LlamaLoader.get_model_spec (ModelLoader.get_rotary_params:
    # rope_theta from transformers 5's rope_scaling = rope_parameters; rotary_dim 0: the
    # whole head, half layout); attention_layer.cc: RotaryEmbeddings::initialize
    "default": "same",
    # get_rotary_params: "linear" -> RotaryScalingType.Linear and its factor
    # (specs/attention_spec.py: MultiHeadAttentionSpec writes rotary_scaling_factor for
    # Linear); initialize: t = i / factor
    "linear": "same",
    # get_rotary_params: _SUPPORTED_ROPE_SCALING has linear, su, llama3, longrope only:
    # NotImplementedError for dynamic, yarn, proportional
    "dynamic": "refused",
    "yarn": "refused",
    "yarn attention_factor": "refused",
    "v5 yarn": "refused",
    "proportional": "refused",
    # TransformersConverter._load: no loader registered for the config's class (ValueError
    # "No conversion is registered ..."): DeepSeek-V2/V3, StableLM, Qwen2-VL, Qwen3-VL,
    # Qwen3.5, GPT-OSS, SmolLM3, Cohere2
    "yarn deepseek mscale": "refused",
    "deepseek-v2 mscale 0.707": "refused",
    "v5 deepseek mscale": "refused",
    "partial_rotary_factor": "refused",
    "mrope sections": "refused",
    "mrope interleaved": "refused",
    "mrope interleaved partial": "refused",
    "gpt-oss yarn truncate": "refused",
    "v5 gpt-oss yarn truncate": "refused",
    "smollm3 no_rope_layers": "refused",
    "v5 smollm3 no_rope_layers": "refused",
    "cohere2 nope": "refused",
    "v5 cohere2 nope": "refused",
    # Phi3Loader.set_decoder reads layer.self_attn.rotary_emb.long_factor: transformers
    # 5's Phi3Attention has no rotary_emb (the model's rotary_emb replaced it in 4.48), an
    # AttributeError for every Phi-3; the converter passes from_pretrained(dtype=...), which
    # only transformers >= 4.56 takes: no transformers release converts a Phi-3
    "longrope": "refused",
    # Phi3Loader.get_model_spec reads rope_scaling["type"]: a config with rope_type only
    "v5 longrope": "refused",
    # LlamaLoader: get_rotary_params maps longrope to RotaryScalingType.Su, but only
    # Phi3Loader sets the factors: specs/model_spec.py: LayerSpec.validate raises for the
    # unset rotary_scaling_long_factor / short_factor
    "longrope inside": "refused",
    # LlamaLoader.get_model_spec sets rotary_low_freq_factor / high_freq_factor only:
    # MultiHeadAttentionSpec writes rotary_scaling_factor for Linear alone and LlamaLoader
    # passes no original_max_position_embeddings, so make_rotary_embeddings reads the
    # defaults (factor 1, original 0) and initialize's Llama3 branch divides by 1: the
    # tables are plain RoPE at base 500000
    "llama3": "different",
    "v5 llama3": "different",
    # Gemma3Loader.get_model_spec: per layer type, rotary_base = getattr(text_config,
    # "rope_theta", 1_000_000) or getattr(..., "rope_local_base_freq", 10_000) (transformers
    # 5 has neither attribute: the defaults, equal to this case's bases) and no
    # rope_scaling: the full-attention layers lose the linear factor 8
    "gemma3": "different",
    "v5 gemma3": "different",
}


def batch() -> dict[str, engines.EngineResult]:
    """Every case's result, from one batch child process."""
    names = list(engine_cases.CASES)
    found = engines.run_cases(ENGINE, [engine_cases.CASES[n].data() for n in names])
    return dict(zip(names, found, strict=True))


@pytest.fixture(scope="module")
def results() -> dict[str, engines.EngineResult]:
    built_engine(ENGINE)
    return background.result("batch-test_engine_ctranslate2")  # type: ignore[return-value]


def test_every_case_has_a_verdict() -> None:
    assert sorted(engine_cases.CASES) == sorted(EXPECTED)


@pytest.mark.parametrize("case", list(EXPECTED))
def test_verdict(results: dict[str, engines.EngineResult], case: str) -> None:
    """CTranslate2's tables against transformers': the verdict written from its source."""
    if case not in results:
        pytest.skip(f"{case!r} is no longer in engine_cases.CASES")
    result = results[case]
    assert result.verdict == EXPECTED[case], (result.note, result.first_difference)
    if result.verdict == "refused":
        # the converter's own error, where ctranslate2's code raised or called it
        assert "ctranslate2/" in result.note, result.note
    else:
        assert result.version is not None and result.version.startswith("ctranslate2 4.8.5")
        assert "RESTATED" in result.note


def test_refusals_name_the_converter(results: dict[str, engines.EngineResult]) -> None:
    for case in ("dynamic", "yarn", "v5 yarn", "proportional"):
        assert NOT_IMPLEMENTED in results[case].note and "get_rotary_params" in results[case].note
    for case in ("yarn deepseek mscale", "partial_rotary_factor", "mrope sections",
                 "gpt-oss yarn truncate", "smollm3 no_rope_layers", "cohere2 nope"):  # fmt: skip
        assert NO_LOADER in results[case].note, results[case].note
    longrope = results["longrope"].note
    assert "'Phi3Attention' object has no attribute 'rotary_emb'" in longrope
    assert "converters/transformers.py" in longrope and "set_decoder" in longrope
    assert "KeyError: 'type'" in results["v5 longrope"].note
    assert "rotary_scaling_long_factor" in results["longrope inside"].note or (
        "required model attributes" in results["longrope inside"].note
    )


def test_differences_are_the_dropped_scalings(results: dict[str, engines.EngineResult]) -> None:
    # llama3: plain RoPE, differing already inside the original context (every pair whose
    # wavelength transformers scales)
    for case in ("llama3", "v5 llama3"):
        result = results[case]
        assert result.first_difference is not None
        assert result.first_difference["seq_len"] == 8192  # the original window already
        assert result.attention_scaling["engine"] == pytest.approx(1.0)
    # gemma3: the sliding layers agree, the full-attention ones miss linear 8
    for case in ("gemma3", "v5 gemma3"):
        same = {w["layer_type"]: w["same"] for w in results[case].windows}
        assert same == {"sliding_attention": True, "full_attention": False}, same


# --------------------------------------------------------------------------------------
# Raw requests: what the converter wrote; a near miss.


def _pipe(request: dict[str, Any]) -> dict[str, Any]:
    python = built_engine(ENGINE)
    proc = subprocess.run([str(python), str(READER)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=600,
                          env=engines.child_env(), check=True)  # fmt: skip
    return dict(json.loads(proc.stdout))


def test_llama3_attributes_the_converter_wrote() -> None:
    """LlamaLoader writes scaling type Llama3 and the low/high factors, no factor and no
    original context: the runtime's defaults (factor 1, original 0) stand."""
    config = engine_cases.CASES["llama3"].data()
    answer = _pipe({"config": config, "windows": [{"seq_len": 16, "positions": [0, 15]}]})
    window = answer["windows"][0]
    assert "LlamaLoader" in answer["module"] and answer["layout"] == "half"
    assert "scaling llama3, factor 1 " in window["module"] and "original 0" in window["module"]
    assert window["rotates"] is True and answer["switching"] is None
    d, p, k = 128, 15, 40  # plain RoPE at base 500000 (transformers divides this pair by 8)
    assert window["cos"][1][k] == pytest.approx(math.cos(p * 500000.0 ** (-2 * k / d)), abs=1e-6)


def test_near_miss_gemma3_bases() -> None:
    """Gemma 3 with its released bases and no scaling agrees; the same config with other
    bases differs: transformers 5's Gemma3TextConfig keeps them in rope_parameters only, so
    Gemma3Loader.get_model_spec's getattr(text_config, "rope_theta", 1_000_000) and
    getattr(..., "rope_local_base_freq", 10_000) always take the defaults."""
    base = engine_cases.CASES["gemma3"].data()
    base.pop("rope_scaling")
    moved = {**base, "rope_theta": 500000.0, "rope_local_base_freq": 20000.0}
    same, different = engines.run_cases(ENGINE, [base, moved], built_engine(ENGINE))
    assert same.verdict == "same", same.note
    assert different.verdict == "different", different.note
    assert all(not w["same"] for w in different.windows)


def _reader_module() -> Any:
    spec = importlib.util.spec_from_file_location("ctranslate2_reader", READER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ctranslate2_reader", module)
    spec.loader.exec_module(module)
    return module


def test_restated_longrope_switch() -> None:
    """initialize's Su branch, restated: one factor set for the whole table, long iff the
    table's rows > original_max_position_embeddings; RotaryEmbeddings::apply's first table
    has at least 2048 rows, so with an original context of 64 even a short prompt takes
    the long factors (a one-off run of the runtime on a Phi-3 checkpoint agreed: see the
    reader's report). Both sets carry sqrt(1 + ln(max // original) / ln(original))."""
    reader = _reader_module()
    short = [1.0 + 0.01 * k for k in range(32)]
    long = [1.0 + 0.25 * k for k in range(32)]
    k, p = 10, 50
    for rows, original, factors in ((2048, 64, long), (4096, 4096, short), (4097, 4096, long)):
        a = {"dim": 64, "base": 10000.0, "scaling_type": 1, "scaling_factor": 1.0,
             "long_factor": long, "short_factor": short,
             "original_max_position_embeddings": original,
             "max_position_embeddings": 4 * original, "high_freq_factor": 4.0,
             "low_freq_factor": 1.0}  # fmt: skip
        cos, sin, chosen = reader._runtime_tables(a, rows, [p])
        assert chosen == ("long" if factors is long else "short")
        scale = math.sqrt(1 + math.log(4) / math.log(original))
        angle = p / (factors[k] * 10000.0 ** (2 * k / 64))
        assert cos[0][k] == pytest.approx(scale * math.cos(angle), abs=2e-6)
        assert sin[0][k] == pytest.approx(scale * math.sin(angle), abs=2e-6)


# --------------------------------------------------------------------------------------
# End-to-end logits: CTranslate2's converted model run by its runtime against transformers.

#: engine_logits.LOGIT_CASES: the verdict, from CTranslate2's source (as the table above)
LOGITS: dict[str, str] = {
    "default": "same",  # LlamaLoader; RotaryEmbeddings::initialize
    "linear": "same",  # get_rotary_params: Linear, t = i / factor
    "dynamic": "refused",  # get_rotary_params: NotImplementedError
    "yarn": "refused",  # Qwen2Loader -> get_rotary_params: NotImplementedError
    "yarn attention_factor": "refused",
    "llama3": "different",  # factor and original context not written: plain RoPE
    "longrope": "refused",  # Phi3Loader.set_decoder: Phi3Attention has no rotary_emb
}


@pytest.fixture(scope="module")
def logits() -> dict[str, Any]:
    """engine_logits.run_logits on every LOGIT_CASES model, one reader batch."""
    from posenc.integration.analysis import engine_logits as el

    built_engine(ENGINE)
    pytest.importorskip("sentencepiece")
    return {r.case: r for r in el.run_logits(ENGINE)}


def test_every_logits_case_has_a_verdict() -> None:
    from posenc.integration.analysis import engine_logits as el

    assert sorted(el.LOGIT_CASES) == sorted(LOGITS)


@pytest.mark.parametrize("case", list(LOGITS))
def test_logits(logits: dict[str, Any], case: str) -> None:
    if case not in logits:
        pytest.skip(f"{case!r} is no longer in engine_logits.LOGIT_CASES")
    result = logits[case]
    assert result.verdict == LOGITS[case], result.note
    if result.verdict == "refused":
        assert "ctranslate2/" in result.note
        return
    assert "TransformersConverter.convert" in (result.converter or "")
    assert "forward_batch" in (result.mode or "")
    if result.verdict == "different":
        # row 0 attends to itself only: no RoPE there; later rows move by ~1
        rows = result.per_row
        assert rows[0]["same"] and max(r["max_abs_diff"] for r in rows[1:]) > 0.1, rows


def _gemma3(full: dict[str, Any]) -> dict[str, Any]:
    return {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
            "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 64, "num_hidden_layers": 2, "intermediate_size": 128,
            "max_position_embeddings": 256, "sliding_window": 512, "query_pre_attn_scalar": 64,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {"full_attention": full, "sliding_attention":
                                {"rope_type": "default", "rope_theta": 10000.0}}}  # fmt: skip


def test_logits_follow_the_restated_tables(tmp_path: Path) -> None:
    """Where the tables differ, CTranslate2's logits are transformers' for the tables the
    reader restated: llama3 is transformers' plain RoPE of the same weights, Gemma 3's
    full-attention layers run without their linear factor. The checkpoints of a pair have
    the same weights (the same seed; RoPE settings make no weights)."""
    from posenc.integration.analysis import engine_logits as el

    python = built_engine(ENGINE)
    pytest.importorskip("sentencepiece")
    llama3 = el.LOGIT_CASES["llama3"].data()
    plain = {k: v for k, v in llama3.items() if k != "rope_scaling"}
    pairs = {
        "llama3": (llama3, plain),
        "gemma3": (_gemma3({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}),
                   _gemma3({"rope_type": "default", "rope_theta": 1e6})),
    }  # fmt: skip
    length = el.prompt_length(llama3)
    tokens, rows = el.prompt(length), el.rows(length)
    requests, refs = [], []
    for name, (config, restated) in pairs.items():
        directory = el.write_checkpoint(config, tmp_path / name)
        twin = el.write_checkpoint(restated, tmp_path / f"{name}-restated")
        assert (directory / "model.safetensors").read_bytes() == (
            twin / "model.safetensors"
        ).read_bytes()
        refs.append((el.reference_logits(directory, tokens, rows),
                     el.reference_logits(twin, tokens, rows), config))  # fmt: skip
        requests.append({"logits": {"checkpoint": str(directory), "tokens": tokens,
                                    "rows": rows}})  # fmt: skip
    status, answer = engines.call_reader(python, engines.ENGINES[ENGINE],
                                         {"batch": requests}, 600)  # fmt: skip
    assert status == "ok", answer
    for name, one, (ref, ref_restated, config) in zip(pairs, answer["batch"], refs, strict=True):
        assert "refused" not in one, one
        theirs = np.asarray(one["logits"])
        tol = el.tolerance(ref_restated, config, length)
        assert float(np.max(np.abs(theirs - ref_restated))) <= tol, name
        assert float(np.max(np.abs(theirs - ref))) > 100 * tol, name
