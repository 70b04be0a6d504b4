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
