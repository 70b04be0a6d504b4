"""``posenc rope --engines sglang``: SGLang's own RoPE code on the cross-engine cases.

Runs when ``posenc engines build sglang`` has built its environment; else
the tests skip (fail under ``CI=true``). The expected verdicts are written from the
source of SGLang 0.5.23 (files named from the ``sglang/srt/`` package), not from the
runner: the cases are answered in one batch child process (SGLang's import takes
seconds). One more test pipes a raw request into the reader and checks its table
against a float64 formula written here.
"""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest

import background
from conftest import built_engine
from posenc.integration.analysis import engines

#: case -> (verdict, the windows (seq_len) that differ, the likely cause's start).
SGLANG_EXPECTED = {
    # layers/rotary_embedding/factory.py:get_rope, rope_scaling "default" -> RotaryEmbedding
    "default": ("same", [], None),
    # factory.py:get_rope -> base.py:LinearScalingRotaryEmbedding (t / factor)
    "linear": ("same", [], None),
    # rope_variant.py:DynamicNTKScalingRotaryEmbedding._compute_cos_sin_cache: one cache
    # for max_position * factor with the base already raised for that length, whatever
    # the sequence's length: within max_position_embeddings it differs
    "dynamic": ("different", [4096], "a wrong base"),
    # factory.py:get_rope -> yarn.py:YaRNScalingRotaryEmbedding
    "yarn": ("same", [], None),
    # factory.py:get_rope passes attn_factor, never attention_factor: the mscale is
    # yarn_get_mscale(factor) = 1.1386 instead of the given 1.2
    "yarn attention_factor": ("different", [32768, 131072], None),
    # models/deepseek_v2.py:DeepseekV2AttentionMLA: rope_type -> deepseek_yarn,
    # factory.py:get_rope_cpu -> rope_variant.py:DeepseekScalingRotaryEmbedding
    # (mscale / mscale_all_dim in the tables, mscale_all_dim ** 2 in the softmax scale)
    "yarn deepseek mscale": ("same", [], None),
    # models/llama.py (Phi3ForCausalLM): the top-level original_max_position_embeddings
    # copied into rope_scaling; rope_variant.py:Phi3LongRoPEScaledRotaryEmbedding.forward
    # picks long_factor when any position > original_max_position_embeddings
    "longrope": ("same", [], None),
    "longrope inside": ("same", [], None),
    # factory.py:get_rope -> rope_variant.py:Llama3RotaryEmbedding
    "llama3": ("same", [], None),
    # models/llama.py reads partial_rotary_factor at the config's top level only:
    # factory.py:get_rope's "proportional" -> Gemma4RotaryEmbedding over the whole head
    "proportional": ("different", [8192], "the proportional scaling was not applied"),
    # models/stablelm.py: rotary_ndims = head_dim * partial_rotary_factor
    "partial_rotary_factor": ("same", [], None),
    # models/qwen2.py -> factory.py:get_rope -> mrope.py:MRotaryEmbedding (sections)
    "mrope sections": ("same", [], None),
    # models/qwen3.py -> mrope.py:MRotaryEmbedding(mrope_interleaved=True)
    "mrope interleaved": ("same", [], None),
    # transformers 5 configs (what SGLang reads): llama.py / qwen2.py take rope_parameters
    "v5 llama3": ("same", [], None),
    "v5 yarn": ("same", [], None),
    # models/gemma3_causal.py: without AMX kernels Gemma3Attention.forward_native applies
    # Gemma3TextModel's rotary_emb (linear 8, base 1e6) / rotary_emb_local (base 1e4)
    "gemma3": ("same", [], None),
    "v5 gemma3": ("same", [], None),
    # models/gpt_oss.py GptOssDecoderLayer passes the whole rope_parameters to get_rope;
    # factory.py get_rope's YaRN takes rope_scaling.get("truncate", True): truncate false
    # reaches yarn.py YaRNScalingRotaryEmbedding (correction range not rounded)
    "gpt-oss yarn truncate": ("same", [], None),
    "v5 gpt-oss yarn truncate": ("same", [], None),
    # models/deepseek_v2.py as "yarn deepseek mscale": mscale / mscale_all_dim 0.707 in the
    # tables, compute_mla_mscale_scaling's mscale(factor, mscale_all_dim) ** 2 in the softmax
    "deepseek-v2 mscale 0.707": ("same", [], None),
    "v5 deepseek mscale": ("same", [], None),
    # no models/*.py has SmolLM3ForCausalLM in its EntryClass: model_loader/utils.py
    # get_model_architecture -> resolve_transformers_arch -> models/transformers.py
    # TransformersForCausalLM, which keeps transformers' rotary_emb and SmolLM3Attention
    # (use_rope = no_rope_layers[layer]: layer 3 not rotated, as in transformers)
    "smollm3 no_rope_layers": ("same", [], None),
    "v5 smollm3 no_rope_layers": ("same", [], None),
    # models/commandr.py (EntryClass [CohereForCausalLM, Cohere2ForCausalLM]):
    # CohereAttention builds get_rope(is_neox_style=False) and its forward rotates only
    # when v1 or sliding_window_size > 0 (a Cohere2Config's sliding_attention layers)
    "cohere2 nope": ("same", [], None),
    "v5 cohere2 nope": ("same", [], None),
    # as "longrope" (models/llama.py; rope_variant.py Phi3LongRoPEScaledRotaryEmbedding)
    "v5 longrope": ("same", [], None),
    # utils/hf_transformers/config.py HfModelConfigParser.parse reloads qwen3_5 with
    # SGLang's configs/qwen3_5.py Qwen3_5Config (_CONFIG_REGISTRY), whose text config is a
    # configs/qwen3_next.py Qwen3NextConfig: models/qwen3_5.py builds layer i as
    # layers_block_type[i] says (from full_attention_interval, 1 here; layer_types is
    # not kept); Qwen3_5AttentionDecoderLayer: get_rope(partial_rotary_factor 0.25 from the
    # config's top level) -> mrope.py MRotaryEmbedding(mrope_interleaved=True). Without
    # full_attention_interval SGLang refuses (test_sglang_fallback_and_qwen3_5_layers)
    "mrope interleaved partial": ("same", [], None),
}


def _python():
    return built_engine("sglang")


def batch():
    """Every cross-engine case, run by SGLang in one child process; the suite runs it in
    the background (tests/background.py)."""
    from posenc.integration.analysis.engine_cases import CASES

    results = engines.run_cases("sglang", [c.data() for c in CASES.values()])
    return dict(zip(CASES, results, strict=True))


@pytest.fixture(scope="module")
def sglang_results():
    _python()
    return background.result("batch-test_engine_sglang")


def test_every_case_has_an_expected_sglang_verdict():
    from posenc.integration.analysis.engine_cases import CASES

    assert set(SGLANG_EXPECTED) == set(CASES)


@pytest.mark.parametrize("case", list(SGLANG_EXPECTED))
def test_sglang_reading(sglang_results, case):
    verdict, differing, cause = SGLANG_EXPECTED[case]
    result = sglang_results[case]
    assert result.verdict == verdict, (result.note, result.cause)
    if verdict == "refused":  # SGLang's own error: the expected one
        assert cause in result.note, result.note
        return
    assert result.version.startswith("sglang 0.5")
    assert [w["seq_len"] for w in result.windows if not w["same"]] == differing
    if cause is not None:
        assert result.cause.startswith(cause), result.cause
    softmax = result.attention_scaling["softmax_scale"]
    assert softmax["engine"] == pytest.approx(softmax["reference"], rel=1e-6)


def test_sglang_yarn_attention_factor_is_never_read(sglang_results):
    result = sglang_results["yarn attention_factor"]
    assert result.attention_scaling["reference"] == pytest.approx(1.2)
    yarn_mscale = 0.1 * math.log(4.0) + 1  # yarn.py:yarn_get_mscale(factor 4)
    assert result.attention_scaling["engine"] == pytest.approx(yarn_mscale, rel=1e-6)


def test_sglang_deepseek_softmax_scale_carries_mscale_all_dim(sglang_results):
    result = sglang_results["yarn deepseek mscale"]
    mscale = 0.1 * 1.0 * math.log(40.0) + 1  # yarn_get_mscale(factor 40, mscale_all_dim 1)
    expected = (32 + 64) ** -0.5 * mscale**2  # compute_mla_mscale_scaling
    assert result.attention_scaling["softmax_scale"]["engine"] == pytest.approx(expected)
    assert result.layout == {"engine": "interleaved", "reference": "interleaved"}


def _ask(python, request):
    reader = engines.ENGINES["sglang"].reader
    proc = subprocess.run([str(python), str(reader)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300,
                          env=engines.child_env(), check=True)  # fmt: skip
    return json.loads(proc.stdout)


def test_sglang_reader_against_the_formula():
    """A raw request (a batch: one default RoPE, one Qwen2-VL M-RoPE at multi-axis
    positions, one Gemma 3 sliding layer) against cos(p * theta ** (-2k / d)) in float64."""
    from posenc.integration.analysis.engine_cases import CASES

    python = _python()
    positions = [0, 1, 7, 1000, 8191]
    ids = [[0, 1, 7, 1000, 8191], [0, 0, 3, 500, 4095], [0, 0, 1, 250, 2047]]
    batch = [
        {"config": CASES["default"].data(),
         "windows": [{"seq_len": 8192, "positions": positions}]},
        {"config": CASES["mrope sections"].data(),
         "windows": [{"seq_len": 8192, "positions": positions, "position_ids": ids}]},
        {"config": CASES["gemma3"].data(),
         "windows": [{"seq_len": 8192, "positions": positions,
                      "layer_type": "sliding_attention"}]},
    ]  # fmt: skip
    answers = _ask(python, {"batch": batch})["batch"]
    # llama: head 128, base 500000; Qwen2-VL: head 128, base 1e6, sections [16, 24, 24]
    # (pairs 0..15 turn with the temporal axis, 16..39 height, 40..63 width); Gemma 3
    # sliding layers: head 256, rope_local_base_freq 10000
    for answer, (dim, base, sections) in zip(
        answers,
        [(128, 500000.0, None), (128, 1e6, [16, 24, 24]), (256, 10000.0, None)],
        strict=True,
    ):
        assert "refused" not in answer, answer
        window = answer["windows"][0]
        k = np.arange(dim // 2)
        omega = base ** (-2.0 * k / dim)
        if sections is None:
            p = np.asarray(positions, dtype=np.float64)[:, None] * np.ones(dim // 2)
        else:
            axis = np.repeat(np.arange(3), sections)
            p = np.asarray(ids, dtype=np.float64)[axis].T
        angle = p * omega
        # the tables are float32 (the reader's dtype): angles rounded to float32 turn
        # by up to p * eps32 radians
        assert answer["dtype"] == "float32"
        eps = float(np.finfo(np.float32).eps)
        tolerance = 4 * eps * (1 + np.abs(angle))
        assert np.all(np.abs(np.asarray(window["cos"]) - np.cos(angle)) <= tolerance)
        assert np.all(np.abs(np.asarray(window["sin"]) - np.sin(angle)) <= tolerance)
        assert answer["attention_scaling"] == pytest.approx(1.0)


def test_sglang_longrope_switches_one_token_later():
    """rope_variant.py:Phi3LongRoPEScaledRotaryEmbedding.forward takes long_factor when
    any position > original_max_position_embeddings (4096): a prefill of 4097 tokens
    (positions up to 4096) still gets short_factor, where transformers' seq_len > 4096
    takes long_factor; 4098 tokens get long_factor."""
    from posenc.integration.analysis.engine_cases import CASES

    windows = [{"seq_len": n, "positions": [1000]} for n in (4096, 4097, 4098)]
    answer = _ask(_python(), {"config": CASES["longrope"].data(), "windows": windows})
    rows = [w["cos"][0] for w in answer["windows"]]
    assert rows[0] == rows[1]
    assert rows[1] != rows[2]


def test_sglang_nope_layers_and_switching(sglang_results):
    """The window at the layer transformers leaves without RoPE is not rotated
    (commandr.py CohereAttention.forward; transformers' SmolLM3Attention.use_rope in the
    Transformers backend); LongRoPE's and dynamic NTK's switching rules name SGLang's code."""
    for case in ("cohere2 nope", "v5 cohere2 nope", "smollm3 no_rope_layers"):
        nope = [w for w in sglang_results[case].windows if w["nope"]]
        assert nope and all(w["rotates"] is False and w["same"] for w in nope), case
    longrope = sglang_results["longrope"].switching
    assert "Phi3LongRoPEScaledRotaryEmbedding.forward" in longrope
    assert "a prefill of 4098 tokens" in longrope
    dynamic = sglang_results["dynamic"].switching
    assert "DynamicNTKScalingRotaryEmbedding._compute_cos_sin_cache" in dynamic
    assert sglang_results["yarn"].switching is None


def test_sglang_fallback_and_qwen3_5_layers():
    """A model SGLang implements but the reader does not restate is read as
    models/llama.py, and the answer says so (``fallback``). Qwen3.5: SGLang's
    Qwen3NextConfig.layers_block_type (configs/qwen3_next.py) needs
    full_attention_interval, layer_types being dropped: without it SGLang refuses; with it
    a quarter of head_dim 256 rotates (partial_rotary_factor 0.25), interleaved M-RoPE."""
    from posenc.integration.analysis.engine_cases import CASES

    olmo2 = {**CASES["default"].data(), "model_type": "olmo2",
             "architectures": ["Olmo2ForCausalLM"]}  # fmt: skip
    qwen = CASES["mrope interleaved partial"].data()
    qwen["text_config"]["full_attention_interval"] = 1
    without = CASES["mrope interleaved partial"].data()
    without["text_config"].pop("full_attention_interval", None)
    window = {"seq_len": 16, "positions": [0, 1], "layer": 0}
    batch = [
        {"config": olmo2, "windows": [{"seq_len": 16, "positions": [0, 1]}]},
        {"config": qwen, "windows": [window]},
        {"config": without, "windows": [window]},
    ]
    olmo, qwen3_5, refused = _ask(_python(), {"batch": batch})["batch"]
    assert olmo["fallback"] == "models/llama.py"
    assert "models/olmo2.py" in olmo["note"]
    assert "fallback" not in qwen3_5
    assert qwen3_5["rotary_dim"] == 64 and qwen3_5["windows"][0]["rotates"] is True
    assert qwen3_5["module"].endswith("MRotaryEmbedding")
    # pair 1 at position 1: cos(theta ** (-2 / 64)), base 1e7 over the 64 rotated channels
    assert qwen3_5["windows"][0]["cos"][1][1] == pytest.approx(math.cos(1e7 ** (-2 / 64)))
    assert "full_attention_interval" in refused["refused"]
