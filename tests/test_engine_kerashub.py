"""KerasHub as a ``posenc rope --engines`` engine: its reader against transformers' reading.

Runs only where ``posenc engines build keras-hub`` has built its environment. The
expected verdicts are written from keras-hub 0.32.0's source (files named relative to the
``keras_hub/src`` package), not from the runner: all configs go to one batch child process
(``engines.run_cases``), since importing KerasHub and JAX takes seconds.

KerasHub loads a transformers checkpoint with ``Backbone.from_preset``:
``utils/transformers/preset_loader.py: TransformersPresetLoader.__init__`` picks the
converter by ``model_type`` (and refuses a ``model_type`` it has none for), whose
``convert_backbone_config`` reads the config; most converters read ``rope_theta`` and
nothing else of the RoPE, so a scaled RoPE is either refused (``convert_llama3``) or
dropped (``convert_qwen``, ``convert_mistral``).
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

KERASHUB_PYTHON = engines.engine_python("keras-hub")
READER = engines.ENGINES["keras-hub"].reader

#: Every case of the cross-engine table (engine_cases.CASES), with the verdict keras-hub
#: 0.32.0's code gives and why.
TABLE: dict[str, tuple[str, str]] = {
    "default": ("same", "utils/transformers/convert_llama3.py: convert_backbone_config passes "
                "rope_theta as rope_max_wavelength; models/llama/llama_rotary_embedding.py"),
    "linear": ("refused", "convert_llama3.convert_backbone_config: 'The config should be a "
               "valid llama3 config.' for any rope_type but llama3"),
    "dynamic": ("refused", "convert_llama3.convert_backbone_config, as linear"),
    "yarn": ("different", "utils/transformers/convert_qwen.py: convert_backbone_config reads "
             "rope_theta only: rope_scaling is dropped (plain RoPE, attention scaling 1)"),
    "yarn attention_factor": ("different", "convert_qwen.convert_backbone_config, as yarn"),
    "yarn deepseek mscale": ("refused", "utils/transformers/preset_loader.py: "
                             "TransformersPresetLoader.__init__ has no deepseek_v3 converter"),
    "longrope": ("refused", "TransformersPresetLoader.__init__ has no phi3 converter "
                 "(models/phi3 exists, without an HF converter)"),
    "longrope inside": ("refused", "convert_llama3.convert_backbone_config: not llama3"),
    "llama3": ("same", "convert_llama3.convert_backbone_config reads rope_scaling's llama3 "
               "factors; llama_rotary_embedding.py: LlamaRotaryEmbedding._get_inverse_freq"),
    "proportional": ("refused", "convert_llama3.convert_backbone_config: not llama3"),
    "partial_rotary_factor": ("refused", "TransformersPresetLoader.__init__: no stablelm "
                              "converter"),
    "mrope sections": ("refused", "TransformersPresetLoader.__init__: no qwen2_vl converter"),
    "mrope interleaved": ("refused", "TransformersPresetLoader.__init__: no qwen3_vl converter"),
    "mrope interleaved partial": ("same", "utils/transformers/convert_qwen3_5.py reads "
                                  "partial_rotary_factor and mrope_section from "
                                  "rope_parameters; models/qwen3_5/qwen3_5_attention.py: "
                                  "_apply_partial_rope, _apply_mrope"),
    "v5 llama3": ("different", "convert_llama3.convert_backbone_config takes rope_theta from "
                  "rope_parameters but the llama3 factors only from rope_scaling, absent: "
                  "plain RoPE"),
    "v5 yarn": ("different", "convert_qwen.convert_backbone_config, as yarn"),
    "gemma3": ("same", "models/gemma3/gemma3_backbone.py: Gemma3Backbone hardcodes the "
               "wavelengths 10000 (i % 6 < 5) and 1000000, the config's; "
               "convert_gemma3.convert_backbone_config reads rope_scaling's factor"),
    "gpt-oss yarn truncate": ("same", "models/gpt_oss/gpt_oss_attention.py: GptOssAttention."
                              "build hardcodes YaRN's beta 32/1, original 4096, truncate=False: "
                              "the config's; convert_gpt_oss reads rope_scaling's factor"),
    "v5 gpt-oss yarn truncate": ("different", "utils/transformers/convert_gpt_oss.py reads the "
                                 "factor only from rope_scaling, absent: factor 1.0 (no "
                                 "interpolation, attention scaling 1)"),
    "deepseek-v2 mscale 0.707": ("refused", "TransformersPresetLoader.__init__: no deepseek "
                                 "converter"),
    "v5 deepseek mscale": ("refused", "TransformersPresetLoader.__init__: no deepseek "
                           "converter"),
    "smollm3 no_rope_layers": ("same", "utils/transformers/convert_smollm3.py: no_rope_layers "
                               "-> rope_layer_enabled_list; models/smollm3/smollm3_layers.py: "
                               "SmolLM3Attention.use_rope, SmolLM3RotaryEmbedding"),
    "v5 smollm3 no_rope_layers": ("same", "convert_smollm3 takes rope_theta from "
                                  "rope_parameters"),
    "cohere2 nope": ("refused", "TransformersPresetLoader.__init__: no cohere2 converter"),
    "v5 cohere2 nope": ("refused", "TransformersPresetLoader.__init__: no cohere2 converter"),
    "v5 longrope": ("refused", "TransformersPresetLoader.__init__: no phi3 converter"),
    "v5 gemma3": ("same", "convert_gemma3.convert_backbone_config reads "
                  "rope_parameters['full_attention'] when there is no rope_scaling"),
}  # fmt: skip

_SIZES: dict[str, Any] = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "vocab_size": 32,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}
_GPT_OSS = dict(engine_cases.CASES["gpt-oss yarn truncate"].config)
_GEMMA3 = dict(engine_cases.CASES["gemma3"].config)


def _with(config: dict[str, Any], **scaling: Any) -> dict[str, Any]:
    """``config`` with its rope_scaling updated (a key given None is removed)."""
    out = json.loads(json.dumps(config))
    for key, value in scaling.items():
        if value is None:
            out["rope_scaling"].pop(key, None)
        else:
            out["rope_scaling"][key] = value
    return out


#: (case id, config, expected verdict) beyond the table. Each cites the KerasHub code.
OWN: list[tuple[str, dict[str, Any], str]] = [
    # convert_qwen.py with the keys a saved Qwen2 config.json has: plain RoPE
    ("qwen2-default", {**_SIZES, "model_type": "qwen2", "rope_theta": 1000000.0,
                       "use_sliding_window": False, "sliding_window": 4096}, "same"),
    # convert_qwen3.py: head_dim read from the config (here 128, not hidden / heads)
    ("qwen3-head-dim", {**_SIZES, "model_type": "qwen3", "head_dim": 128,
                        "rope_theta": 1000000.0, "use_sliding_window": False,
                        "sliding_window": None}, "same"),
    # convert_mistral.py: rope_theta only
    ("mistral-default", {**_SIZES, "model_type": "mistral", "rope_theta": 1000000.0}, "same"),
    # convert_mistral.py drops rope_scaling (YaRN): plain RoPE
    ("mistral-yarn", {**_SIZES, "model_type": "mistral", "rope_theta": 1000000.0,
                      "max_position_embeddings": 16384,
                      "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 4096}},
     "different"),
    # convert_llama3.py reads rope_scaling["rope_type"]: the legacy "type" key is a KeyError
    ("llama3-legacy-type", {**_SIZES, "model_type": "llama", "rope_theta": 500000.0,
                            "max_position_embeddings": 32768,
                            "rope_scaling": {"type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 4096}},
     "refused"),
    # models/gemma/gemma_attention.py: GemmaAttention's RotaryEmbedding(max_wavelength=10000)
    ("gemma-10000", {**_SIZES, "model_type": "gemma", "head_dim": 64,
                     "rope_theta": 10000.0}, "same"),
    # ... whatever the config's rope_theta: a Gemma with base 20000 is read with 10000
    ("gemma-20000", {**_SIZES, "model_type": "gemma", "head_dim": 64,
                     "rope_theta": 20000.0}, "different"),
    # NEAR MISSES of "gemma3" and "gpt-oss yarn truncate" (same), one value changed each:
    # gemma3_backbone.py hardcodes the global wavelength 1000000 (rope_theta is not read)
    ("gemma3-theta-500000", {**_GEMMA3, "rope_theta": 500000.0}, "different"),
    # gpt_oss_attention.py hardcodes truncate=False; transformers' default (the key
    # absent) is True, the rounded correction range
    ("gpt-oss-truncate-default", _with(_GPT_OSS, truncate=None), "different"),
    # gpt_oss_attention.py hardcodes original_max_position_embeddings=4096
    ("gpt-oss-original-8192", _with(_GPT_OSS, original_max_position_embeddings=8192),
     "different"),
    # preset_loader.py: TransformersPresetLoader.__init__ raises for an unknown model_type
    # (never read as Llama)
    ("unknown-model-type", {**_SIZES, "model_type": "posenc_unknown", "rope_theta": 10000.0},
     "refused"),
]  # fmt: skip

CASES: list[tuple[str, dict[str, Any], str]] = [
    *((name, engine_cases.CASES[name].data(), verdict) for name, (verdict, _) in TABLE.items()
      if name in engine_cases.CASES),
    *OWN,
]  # fmt: skip


def batch() -> dict[str, engines.EngineResult]:
    """Every case's result, from one batch child process (KerasHub imported once)."""
    found = engines.run_cases("keras-hub", [config for _, config, _ in CASES], KERASHUB_PYTHON)
    return {case: result for (case, _, _), result in zip(CASES, found, strict=True)}


@pytest.fixture(scope="module")
def results() -> dict[str, engines.EngineResult]:
    built_engine("keras-hub")
    return background.result("batch-test_engine_kerashub")  # type: ignore[return-value]


def test_every_table_case_has_an_expectation() -> None:
    """A case added to engine_cases.CASES needs its keras-hub verdict written here."""
    assert sorted(set(engine_cases.CASES) - set(TABLE)) == []


@pytest.mark.parametrize(("case", "expected"), [(c, e) for c, _, e in CASES])
def test_verdict(results: dict[str, engines.EngineResult], case: str, expected: str) -> None:
    """KerasHub's tables against transformers': the verdict written from its source."""
    result = results[case]
    assert result.verdict == expected, (result.note, result.first_difference)
    if expected != "refused":
        assert result.version is not None and result.version.startswith("keras-hub 0.32.0")


def test_refusals_are_kerashub_errors(results: dict[str, engines.EngineResult]) -> None:
    """Each refusal is raised in KerasHub's own code (its file in the note), not the reader's."""
    for case, _, expected in CASES:
        if expected == "refused":
            assert "keras_hub/src/utils/transformers/" in results[case].note, case


def test_dropped_scaling_shows_as_attention_scaling(
    results: dict[str, engines.EngineResult],
) -> None:
    """convert_qwen drops YaRN: KerasHub scales by 1 where transformers scales by 0.1 ln 4 + 1."""
    scaling = results["yarn"].attention_scaling
    assert scaling["engine"] == pytest.approx(1.0, abs=1e-6)
    assert scaling["reference"] == pytest.approx(0.1 * math.log(4.0) + 1.0, rel=1e-9)


def _pipe(request: dict[str, Any], **env: str) -> dict[str, Any]:
    built_engine("keras-hub")
    proc = subprocess.run([str(KERASHUB_PYTHON), str(READER)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300,
                          env={**engines.child_env(), **env}, check=True)  # fmt: skip
    return json.loads(proc.stdout)


def test_raw_request_against_formula() -> None:
    """A batch piped into the reader: Llama's tables against the formula; SmolLM3's NoPE
    layer; Gemma 3's softmax scale; the strict mode's refusal of a hand-written file.

    cos(p * theta ** (-2k / d)) in float64, within float32's unit roundoff plus the
    float32 angle's error (p * 2 ** -23 relative).
    """
    theta, positions = 10000.0, [0, 1, 7, 1000, 4095]
    llama = {**_SIZES, "model_type": "llama", "rope_theta": theta}
    smollm3 = engine_cases.CASES["smollm3 no_rope_layers"].data()
    answer = _pipe({"batch": [
        {"config": llama, "windows": [{"seq_len": 4096, "positions": positions}]},
        {"config": smollm3, "windows": [{"seq_len": 16, "positions": [0, 5], "layer": 3,
                                          "nope": True}]},
        {"config": _GEMMA3, "windows": [{"seq_len": 16, "positions": [0, 5], "layer": 5}]},
    ]})["batch"]  # fmt: skip
    default, nope, gemma3 = answer
    assert default["layout"] == "half" and default["rotary_dim"] == 64
    assert default["dtype"] == "float32" and default["switching"] is None
    assert default["softmax_scale"] == pytest.approx(64**-0.5)  # LlamaAttention._inv_norm_factor
    d = 64
    for row, p in enumerate(positions):
        for k in range(d // 2):
            angle = p * theta ** (-2 * k / d)
            tol = 2.0**-23 + abs(angle) * 2.0**-22
            assert default["windows"][0]["cos"][row][k] == pytest.approx(math.cos(angle), abs=tol)
            assert default["windows"][0]["sin"][row][k] == pytest.approx(math.sin(angle), abs=tol)
    # smollm3_layers.py: SmolLM3Attention.use_rope = rope_layer_enabled_list[3] = False
    window = nope["windows"][0]
    assert window["rotates"] is False and window["cos"] == [[1.0] * 64] * 2
    # gemma3_attention.py: query_head_dim_normalize (query_pre_attn_scalar == head_dim)
    assert gemma3["softmax_scale"] == pytest.approx(256**-0.5)
    strict = _pipe({"config": engine_cases.CASES["yarn"].data(),
                    "windows": [{"seq_len": 16, "positions": [0]}]},
                   POSENC_KERASHUB_STRICT="1")  # fmt: skip
    assert strict["refused"] == "KeyError: 'use_sliding_window'"
    assert "convert_qwen.py" in strict["where"]


def test_yarn_matches_transformers_since_pr_2981() -> None:
    """layers/modeling/rotary_embedding.py: RotaryEmbedding._get_yarn_inverse_freq (and
    _compute_cos_sin_embedding's 0.1 ln(factor) + 1) against transformers' YaRN.

    keras-hub PR #2981 (merged) measured up to 0.27 (factor 8) from YaRN differences it
    fixed before 0.32.0, among them ``truncate`` defaulting to False (transformers: True)
    and ``high`` clamped to ``rotary_dim // 2 - 1``. No HF converter reaches this layer but
    GPT-OSS's (which hardcodes truncate=False, as GPT-OSS's config sets it: see the
    ``gpt-oss-truncate-default`` near miss), so the layer is run directly: at its defaults
    it agrees with transformers to float32's angle error (5e-4 here); with the old default
    truncate=False the tables differ again (by 2.1 at positions up to 32767).
    """
    from posenc.integration.analysis.rope_compare import golden_tables
    from posenc.integration.analysis.rope_reading import Loaded, read

    built_engine("keras-hub")
    config = {**_SIZES, "model_type": "llama", "rope_theta": 10000.0, "hidden_size": 256,
              "max_position_embeddings": 32768,
              "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                               "original_max_position_embeddings": 4096}}  # fmt: skip
    positions = [0, 1, 100, 4095, 4096, 16384, 32767]
    golden = golden_tables(read(Loaded(config, "config.json", "file")), np.array(positions))
    script = f"""
import json, os
os.environ["KERAS_BACKEND"] = "jax"
import numpy as np
from keras_hub.src.layers.modeling.rotary_embedding import RotaryEmbedding
out = {{}}
for truncate in (True, False):
    rope = RotaryEmbedding(max_wavelength=10000.0, scaling_factor=8.0, rope_type="yarn",
                           original_max_position_embeddings=4096, truncate=truncate)
    x = np.zeros((1, 32768, 1, 64), "float32"); x[..., :32] = 1.0
    y = np.asarray(rope(x))[0, {positions}, 0]
    out[str(truncate)] = [y[:, :32].tolist(), y[:, 32:].tolist()]
print(json.dumps(out))
"""
    proc = subprocess.run([str(KERASHUB_PYTHON), "-c", script], capture_output=True, text=True,
                          timeout=300, env=engines.child_env(), check=True)  # fmt: skip
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    pairs = golden["cos"].shape[1] // 2
    ref_cos, ref_sin = golden["cos"][:, :pairs], golden["sin"][:, :pairs]

    def diff(key: str) -> float:
        cos, sin = np.array(out[key][0]), np.array(out[key][1])
        return float(max(np.abs(cos - ref_cos).max(), np.abs(sin - ref_sin).max()))

    assert diff("True") < 5e-3  # float32 angles up to 32767 * 2 ** -24 relative
    assert diff("False") > 0.1  # the pre-#2981 default: issue #2981's 0.27 at factor 8
