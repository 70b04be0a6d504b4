"""EasyDeL as a ``posenc rope --engines`` engine: its reader against transformers' reading.

Runs only where ``posenc engines build easydel`` has built its environment. The expected
verdicts are written from EasyDeL 0.3.0's source (files named relative to the ``easydel``
package), not from the runner: all configs go to one batch child process
(``engines.run_cases``), since importing EasyDeL takes tens of seconds.

What EasyDeL's models apply (the reader builds the model and records the cache each
attention receives in one forward pass): ``infra/base_module.py: frequencies`` =
``infra/base_config.py: get_basic_frequencies``, a bfloat16 cache of
``layers/rotary/_rotary.py: get_frequencies`` for ``self.rope_theta`` and
``_get_rope_config()`` (``RopeConfig.from_dict(self.rope_scaling)``), computed once for
``max_position_embeddings`` rows, whatever the sequence length.
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

EASYDEL_PYTHON = engines.engine_python("easydel")
READER = engines.ENGINES["easydel"].reader

#: The verdict on every case of engine_cases.CASES, each with the EasyDeL code it follows.
EXPECTED: dict[str, str] = {
    # layers/rotary/_compute_fns.py: compute_basic_frequencies (cache rounded to bfloat16 by
    # infra/base_config.py: get_basic_frequencies; judged within bfloat16's rounding)
    "default": "same",
    # _compute_fns.py: compute_linear_frequencies (max_position * factor rows, t / factor)
    "linear": "same",
    # _compute_fns.py: compute_dynamic_frequencies scales the base once, for factor x
    # max_position_embeddings (base * 3 ** (d / (d - 2)) here), at every length:
    # transformers keeps the original base up to max_position_embeddings (window 4096)
    "dynamic": "different",
    # _rotary.py: get_frequencies -> compute_yarn_frequencies (mscale 0.1 ln 4 + 1)
    "yarn": "same",
    # _configs.py: RopeConfig.from_dict has no attention_factor field (get_frequencies reads
    # attention_factor only from the dropped keys): mscale 1.1386, transformers 1.2
    "yarn attention_factor": "different",
    # layers/attention/_unified.py: UnifiedAttention.forward_mla rotates q_pe / k_pe in NeoX
    # halves; transformers' DeepSeek-V3 (rope_interleave) rotates interleaved pairs and
    # EasyDeL has no rope_interleave nor weight permutation: layout differs. The cache
    # itself (compute_deepseek_frequencies, mscale / mscale_all_dim = 1) agrees.
    "yarn deepseek mscale": "different",
    # _compute_fns.py: compute_phi3_frequencies picks long_factor once (max_position 131072
    # > original 4096) for every position: transformers' short factors at seq_len 4096 differ
    "longrope": "different",
    "longrope inside": "different",
    # _compute_fns.py: compute_llama3_frequencies builds a cache of only
    # original_max_position_embeddings (8192) rows (get_frequencies passes it as the length):
    # positions from 8192 on read row 8191 (JAX clamps the gather in apply_basic_rope)
    "llama3": "different",
    # _rotary.py: get_rope raises "Unknown RoPE scaling type proportional"
    "proportional": "refused",
    # modules/stablelm/modeling_stablelm.py: StableLmAttention._create_rotary passes
    # head_size = rotary_dim = 32 and infra/base_config.py: get_basic_rope multiplies by
    # partial_rotary_factor again (8 channels); StableLmModel.frequencies returns None, so the
    # module computes its own 4-pair cache: 8 rotated channels of 128, transformers 32
    "partial_rotary_factor": "different",
    # _modules.py: MultiModalRotaryEmbedding._apply_chunked_mrope without repetition_style
    # (get_rope's default) takes channels [0, 2t) of the doubled table from T, [2t, 2t + 2h)
    # from H, the rest from W: transformers' sections [16, 24, 24] * 2. Text positions (all
    # axes equal) agree; the multi-axis window differs
    "mrope sections": "different",
    # _modules.py: MultiModalRotaryEmbedding._apply_interleaved_mrope (Qwen3-VL's pattern)
    "mrope interleaved": "same",
    "mrope interleaved partial": "same",
    # the transformers 5 layout: the config classes keep their rope_theta default (10000.0,
    # modules/llama/llama_configuration.py: LlamaConfig.__init__) and get_basic_frequencies
    # reads self.rope_theta, never rope_parameters["rope_theta"] (500000 here); the llama3
    # cache's 8192 rows also clamp as above
    "v5 llama3": "different",
    # as above: theta 10000 (Qwen2Config's default), not 1000000
    "v5 yarn": "different",
    # modules/gemma3/gemma3_configuration.py: Gemma3TextConfig.__init__ stores the rope
    # parameters per layer type (rope_scaling reads back that mapping, see also
    # infra/base_config.py: _backfill_rope_parameters), so _get_rope_config
    # (RopeConfig.from_dict) finds no top-level rope_type: default. The full-attention
    # layers' cache (theta 1e6) misses the linear factor 8; the sliding layers
    # (modules/gemma3/modeling_gemma3.py: default_frequencies, rope_local_base_freq) agree
    "gemma3": "different",
    # _utils.py: _yarn_find_correction_range always floors and ceils the correction range
    # (no truncate: false)
    "gpt-oss yarn truncate": "different",
    "v5 gpt-oss yarn truncate": "different",
    # forward_mla's NeoX halves against transformers' interleaved pairs, as above (the
    # softmax scale, DeepseekV3Attention._create_attention_performer's mscale ** 2, agrees)
    "deepseek-v2 mscale 0.707": "different",
    "v5 deepseek mscale": "different",
    # modules/smollm3/modeling_smollm3.py: SmolLM3Attention._create_rotary returns a
    # pass-through for no_rope_layers[i] == 0 (layer 3 does not rotate)
    "smollm3 no_rope_layers": "same",
    # SmolLM3Config's rope_theta default is 2000000.0, the config's own: same by coincidence
    "v5 smollm3 no_rope_layers": "same",
    # modules/cohere2/modeling_cohere2.py: Cohere2Attention._apply_rotary rotates (GPT-J
    # interleaved pairs, _create_rotary's is_neox_style False) only sliding layers
    "cohere2 nope": "same",
    # Cohere2Config's rope_theta default 10000.0, not rope_parameters' 50000
    "v5 cohere2 nope": "different",
    # EasyDeL's Phi3Config runs transformers 5.5's rope validation (the engine's own pins):
    # transformers/modeling_rope_utils.py: _check_received_keys wants
    # original_max_position_embeddings inside rope_parameters
    "v5 longrope": "refused",
    # as "gemma3": rope_parameters per layer type, read as default by _get_rope_config
    "v5 gemma3": "different",
}

#: A near miss, the transformers 5 layout's theta: EasyDeL ignores rope_parameters'
#: rope_theta (LlamaConfig keeps its default 10000.0): at 10000 it agrees by coincidence,
#: at 20000 it does not. And a model_type EasyDeL has no module for.
EXTRA: list[tuple[str, dict[str, Any], str]] = [
    (
        "near-miss v5 theta 10000",
        {**{k: v for k, v in engine_cases.CASES["default"].data().items() if k != "rope_theta"},
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        "same",
    ),
    (
        "near-miss v5 theta 20000",
        {**{k: v for k, v in engine_cases.CASES["default"].data().items() if k != "rope_theta"},
         "rope_parameters": {"rope_type": "default", "rope_theta": 20000.0}},
        "different",
    ),
    # a model_type EasyDeL has no module for: infra/factory.py: get_module_registration
    # raises (never read as Llama)
    (
        "unknown model_type",
        {**engine_cases.CASES["default"].data(), "model_type": "posenc_unknown",
         "architectures": ["PosencUnknownForCausalLM"]},
        "refused",
    ),
]  # fmt: skip


def _all() -> list[tuple[str, dict[str, Any]]]:
    return [(n, c.data()) for n, c in engine_cases.CASES.items()] + [(n, c) for n, c, _ in EXTRA]


def batch() -> dict[str, engines.EngineResult]:
    """Every case's result, from one batch child process (EasyDeL imported once)."""
    cases = _all()
    found = engines.run_cases("easydel", [config for _, config in cases], EASYDEL_PYTHON)
    return {name: result for (name, _), result in zip(cases, found, strict=True)}


@pytest.fixture(scope="module")
def results() -> dict[str, engines.EngineResult]:
    built_engine("easydel")
    return background.result("batch-test_engine_easydel")  # type: ignore[return-value]


def test_every_case_has_an_expectation() -> None:
    """A case added to engine_cases.CASES needs its verdict written from EasyDeL's source."""
    assert set(EXPECTED) == set(engine_cases.CASES)


_PARAMS = [(n, EXPECTED.get(n, "?")) for n in engine_cases.CASES] + [(n, e) for n, _, e in EXTRA]


@pytest.mark.parametrize(("case", "expected"), _PARAMS)
def test_verdict(results: dict[str, engines.EngineResult], case: str, expected: str) -> None:
    """EasyDeL's tables against transformers': the verdict written from EasyDeL's source."""
    result = results[case]
    assert result.verdict == expected, (result.note, result.first_difference)
    if expected != "refused":
        assert result.version is not None and result.version.startswith("easydel 0.3.0")


def test_refusals(results: dict[str, engines.EngineResult]) -> None:
    """The refusals are EasyDeL's registry of rope types and its config validation."""
    assert "Unknown RoPE scaling type proportional" in results["proportional"].note
    assert "original_max_position_embeddings" in results["v5 longrope"].note
    assert "model type posenc_unknown is not defined" in results["unknown model_type"].note


def test_switching(results: dict[str, engines.EngineResult]) -> None:
    """LongRoPE and dynamic NTK never switch: one cache, built once (_compute_fns.py)."""
    for case in ("longrope", "longrope inside"):
        assert "compute_phi3_frequencies" in str(results[case].switching)
    assert "compute_dynamic_frequencies" in str(results["dynamic"].switching)
    assert results["yarn"].switching is None


def test_scales(results: dict[str, engines.EngineResult]) -> None:
    """YaRN's mscale in the cache ignores attention_factor; DeepSeek's lives in the softmax
    scale (modules/deepseek_v3/modeling_deepseek.py: _create_attention_performer)."""
    yarn = results["yarn attention_factor"].attention_scaling
    assert yarn["reference"] == pytest.approx(1.2)
    assert yarn["engine"] == pytest.approx(0.1 * math.log(4.0) + 1.0, rel=2.0**-8)
    scale = results["deepseek-v2 mscale 0.707"].attention_scaling["softmax_scale"]
    mscale = 0.1 * 0.707 * math.log(40.0) + 1.0
    assert scale["engine"] == pytest.approx((32 + 64) ** -0.5 * mscale * mscale, rel=1e-12)
    assert "layout: easydel rotates half pairs" in results["yarn deepseek mscale"].note


def _pipe(request: dict[str, Any]) -> dict[str, Any]:
    built_engine("easydel")
    proc = subprocess.run([str(EASYDEL_PYTHON), str(READER)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=600,
                          env=engines.child_env(), check=True)  # fmt: skip
    return json.loads(proc.stdout)


def test_raw_request_against_formula() -> None:
    """A batch piped into the reader: default RoPE in EasyDeL's bfloat16 cache against
    cos(p * theta ** (-2k / d)) in float64 (bfloat16's half ulp plus the float32 angle's
    error), the same rows whatever the seq_len, and SmolLM3's layer 3 without rotation."""
    theta, positions = 500000.0, [0, 1, 7, 1000, 8191]
    smollm3 = engine_cases.CASES["smollm3 no_rope_layers"].data()
    default, short, nope = _pipe({"batch": [
        {"config": engine_cases.CASES["default"].data(),
         "windows": [{"seq_len": 8192, "positions": positions}]},
        {"config": engine_cases.CASES["default"].data(),
         "windows": [{"seq_len": 1001, "positions": positions[:4]}]},
        {"config": smollm3, "windows": [{"seq_len": 16, "positions": [0, 5], "layer": 3}]},
    ]})["batch"]  # fmt: skip
    assert default["dtype"] == "bfloat16" and default["layout"] == "half"
    assert default["rotary_dim"] == 128 and default["switching"] is None
    d = 128
    for row, p in enumerate(positions):
        for k in range(d // 2):
            angle = p * theta ** (-2 * k / d)
            tol = 2.0**-8 + abs(angle) * 2.0**-23
            assert default["windows"][0]["cos"][row][k] == pytest.approx(math.cos(angle), abs=tol)
            assert default["windows"][0]["sin"][row][k] == pytest.approx(math.sin(angle), abs=tol)
    assert short["windows"][0]["cos"] == default["windows"][0]["cos"][:4]
    window = nope["windows"][0]
    assert window["rotates"] is False and window["sin"][1] == [0.0] * (d // 2)
