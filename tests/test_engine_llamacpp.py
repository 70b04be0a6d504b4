"""llama.cpp as a ``posenc rope --engines`` engine, checked once it is built.

The reader runs llama.cpp's converter (``convert_hf_to_gguf.py``'s ``conversion``
package) on each config, reads ggml's arguments off libllama's graph for a tiny
checkpoint of it (or restates that step where no tiny checkpoint can be built), and runs
ggml's rope (``engine_readers/llamacpp_reader.py``, ``llamacpp_graph.py``). The expected
verdicts are written from llama.cpp's source at the commit ``llama-cpp-python`` 0.3.36 vendors
(0c1e57098): each case names the file and function that decide it. All configs go to
the reader in one batch (one child process), in a module-scoped fixture.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

import background
from conftest import built_engine
from posenc.integration.analysis import engine_cases, engines

#: A small llama config (head_dim 128); rope_theta 500000, where ggml's float32 powers of
#: theta_scale stay within HF's float32 rounding (see "default, base 10000").
BASE = {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 4,
        "num_key_value_heads": 4, "num_hidden_layers": 2, "intermediate_size": 8,
        "rms_norm_eps": 1e-5, "vocab_size": 10, "max_position_embeddings": 4096,
        "rope_theta": 500000.0}  # fmt: skip
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}  # fmt: skip
SHORT = [1.0 + 0.01 * k for k in range(64)]
LONG = [1.0 + 0.5 * k for k in range(64)]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
DEEPSEEK = {"model_type": "deepseek_v3", "qk_rope_head_dim": 64, "qk_nope_head_dim": 32,
            "kv_lora_rank": 64, "v_head_dim": 32, "q_lora_rank": 64, "n_routed_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 8, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "max_position_embeddings": 16384}  # fmt: skip
GEMMA3 = {"model_type": "gemma3_text", "head_dim": 128, "num_hidden_layers": 6,
          "max_position_embeddings": 8192, "sliding_window": 512}  # fmt: skip
QWEN3_VL_TEXT = {"model_type": "qwen3_vl_text", "hidden_size": 512, "num_attention_heads": 4,
                 "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 2,
                 "intermediate_size": 8, "vocab_size": 10,
                 "max_position_embeddings": 32768, "rope_theta": 5e6,
                 "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20],
                                  "mrope_interleaved": True}}  # fmt: skip


def _case(name: str) -> dict:
    """A cross-engine case's whole config (engine_cases.CASES)."""
    return engine_cases.CASES[name].data()


#: name: (config changes over BASE, or a whole config; verdict; seq_lens of the windows that
#: differ; why, from llama.cpp's source).
CASES: dict[str, tuple[dict, str, list[int], str]] = {
    "default": ({}, "same", [], "llama-model.cpp load_hparams: rope.freq_base"),
    # ggml-cpu/ops.cpp rope_cache_init: theta_i = p * theta_scale^i by repeated float32
    # products, theta_scale = powf(base, -2/n_dims) rounded once: for base 10000 and 128
    # dims the powers drift like a base of 9999.98, beyond HF's float32 rounding but within
    # what k float32 products cost pair k (the judge's float32 envelope): float32 angles
    "default, base 10000": ({"rope_theta": 10000.0}, "same", [],
                            "ggml-cpu/ops.cpp rope_cache_init"),
    # transformers v5's rope_parameters: TextModel.__init__ reads rope_parameters first
    "v5 rope_parameters": ({"rope_theta": None, "rope_parameters": {"rope_type": "default",
                                                                    "rope_theta": 500000.0}},
                           "same", [], "conversion/base.py TextModel.__init__"),
    # TextModel.set_gguf_parameters: rope.scaling.type linear and factor; load_hparams
    # freq_scale = 1 / factor
    "linear": ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "same", [],
               "conversion/base.py TextModel.set_gguf_parameters"),
    # set_gguf_parameters writes nothing for dynamic (left to HunYuan's class); llama.cpp
    # has no dynamic NTK: the extended window keeps the unscaled base
    "dynamic": ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "different", [8192],
                "conversion/base.py TextModel.set_gguf_parameters"),
    # yarn: the context sets ext_factor 1 and attn_factor = mscale / (1 + 0.1 ln f), which
    # ggml's rope_yarn multiplies back: the tables carry 0.1 ln(factor) + 1
    "yarn": ({"rope_scaling": YARN}, "same", [], "llama-context.cpp llama_context"),
    # the converter writes rope.scaling.yarn_attn_factor, but only models/grok.cpp
    # load_arch_hparams reads it; llama-context.cpp derives attn_factor from the factor
    "yarn attention_factor": ({"rope_scaling": {**YARN, "attention_factor": 1.2}}, "different",
                              [1024, 4096], "models/grok.cpp load_arch_hparams"),
    # yarn_beta_fast / yarn_beta_slow written, read by grok only: ggml gets 32 and 1
    "yarn beta_fast/beta_slow": ({"rope_scaling": {**YARN, "beta_fast": 16, "beta_slow": 2}},
                                 "different", [1024, 4096], "models/grok.cpp load_arch_hparams"),
    # set_gguf_parameters indexes rope_params["original_max_position_embeddings"]
    "yarn without original_max_position_embeddings": (
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "refused", [],
        "conversion/base.py TextModel.set_gguf_parameters"),
    # LlamaModel.generate_extra_tensors: rope_freqs, ggml's freq_factors
    "llama3": ({"rope_scaling": LLAMA3, "max_position_embeddings": 8192}, "same", [],
               "conversion/llama.py LlamaModel.generate_extra_tensors"),
    "llama3 in rope_parameters": ({"rope_theta": None, "max_position_embeddings": 8192,
                                   "rope_parameters": {"rope_theta": 500000.0, **LLAMA3}},
                                  "same", [], "conversion/llama.py generate_extra_tensors"),
    # Phi3MiniModel.generate_extra_tensors: rope_factors_long/short and rope.scaling.attn_factor;
    # llama_model::get_rope_factors picks long past n_ctx_orig_yarn (by the context size)
    "longrope (phi3)": ({"model_type": "phi3", "max_position_embeddings": 8192,
                         "original_max_position_embeddings": 1024,
                         "rope_scaling": {"type": "longrope", "short_factor": SHORT,
                                          "long_factor": LONG}},
                        "same", [], "conversion/phi.py Phi3MiniModel.generate_extra_tensors"),
    # transformers 4.57.6 (llama.cpp's pin) Phi3Config wants rope_scaling["type"]: AutoConfig
    # raises, and ModelBase.load_hparams falls back to the raw config.json, which reads the
    # same (no tiny checkpoint: transformers refuses the config, the step is restated)
    "longrope (phi3) with rope_type only": (
        {"model_type": "phi3", "max_position_embeddings": 8192,
         "original_max_position_embeddings": 1024,
         "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG}},
        "same", [], "conversion/base.py ModelBase.load_hparams"),
    # ... and without AutoConfig's defaults, Phi3MiniModel.set_gguf_parameters' find_hparam
    # finds no num_key_value_heads in the raw config
    "longrope (phi3) with rope_type only, no num_key_value_heads": (
        {"model_type": "phi3", "max_position_embeddings": 8192, "num_key_value_heads": None,
         "original_max_position_embeddings": 1024,
         "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG}},
        "refused", [], "conversion/base.py ModelBase.find_hparam"),
    # on llama, TextModel.set_gguf_parameters writes rope.scaling.type longrope and no
    # factors (only Phi3MiniModel writes them): the angles stay unscaled
    "longrope (llama)": ({"max_position_embeddings": 8192,
                          "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT,
                                           "long_factor": LONG,
                                           "original_max_position_embeddings": 1024}},
                         "different", [1024, 8192], "conversion/base.py set_gguf_parameters"),
    # partial rotary: rope.dimension_count = partial_rotary_factor * head_dim (NEOX)
    "partial rotary (stablelm)": ({"model_type": "stablelm", "partial_rotary_factor": 0.25,
                                   "rope_theta": 10000.0, "layer_norm_eps": 1e-5}, "same", [],
                                  "conversion/stablelm.py set_gguf_parameters"),
    # (Phi2Model writes a feed-forward length of 4 * hidden_size: the tiny checkpoint's too)
    "partial rotary (phi)": ({"model_type": "phi", "partial_rotary_factor": 0.5,
                              "rope_theta": 10000.0, "layer_norm_eps": 1e-5,
                              "intermediate_size": 2048}, "same", [],
                             "conversion/phi.py Phi2Model.set_gguf_parameters"),
    # StableLMModel.set_gguf_parameters writes no rope.freq_base: load_hparams' default 10000
    "stablelm rope_theta 500000": ({"model_type": "stablelm", "partial_rotary_factor": 0.25,
                                    "layer_norm_eps": 1e-5}, "different", [4096],
                                   "conversion/stablelm.py set_gguf_parameters"),
    "qwen2 yarn (type key)": ({"model_type": "qwen2", "rope_theta": 1e6,
                               "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 1024}},
                              "same", [], "conversion/base.py TextModel.__init__ (type)"),
    # DeepseekV2Model writes 0.1 * mscale_all_dim as yarn_log_multiplier; the tables are
    # unscaled and models/deepseek2.cpp puts mscale^2 into kq_scale, as transformers does
    "deepseek_v3 yarn": ({**DEEPSEEK, "rope_scaling": {**YARN, "original_max_position_embeddings":
                                                       4096, "mscale": 1.0,
                                                       "mscale_all_dim": 1.0}},
                         "same", [], "models/deepseek2.cpp load_arch_hparams, graph kq_scale"),
    "deepseek_v3 mscale = mscale_all_dim = 0.707": (
        {**DEEPSEEK, "rope_scaling": {**YARN, "original_max_position_embeddings": 4096,
                                      "mscale": 0.707, "mscale_all_dim": 0.707}},
        "same", [], "llama-context.cpp: mscale = mscale_all_dim for DEEPSEEK2"),
    # the converter never writes mscale; llama-context.cpp takes mscale = mscale_all_dim
    # (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX): transformers' ratio 1.037 is missing from the tables
    "deepseek_v3 mscale 1, mscale_all_dim 0.707": (
        {**DEEPSEEK, "rope_scaling": {**YARN, "original_max_position_embeddings": 4096,
                                      "mscale": 1.0, "mscale_all_dim": 0.707}},
        "different", [4096, 16384], "llama-context.cpp llama_context (yarn_attn_factor)"),
    # M-RoPE: rope.dimension_sections, ggml_rope_multi in MROPE mode (models/qwen2vl.cpp)
    "qwen2_vl mrope": ({"model_type": "qwen2_vl", "rope_theta": 1e6,
                        "max_position_embeddings": 32768,
                        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
                       "same", [], "models/qwen2vl.cpp, ggml_rope_multi"),
    # IMROPE: ggml-cpu/ops.cpp ggml_mrope_cache_init gives pairs past 3 * section (61, 62 of
    # [24, 20, 20]) the 4th position, which llama-graph.cpp llm_graph_input_pos sets to 0
    # for text: those pairs never turn; transformers keeps them temporal
    "qwen3_vl interleaved mrope": (
        {"model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"],
         "text_config": QWEN3_VL_TEXT},
        "different", [32768, 32768], "ggml-cpu/ops.cpp ggml_mrope_cache_init"),
    # per layer type: load_arch_hparams (models/gemma3.cpp) reads rope.freq_base_swa;
    # get_rope_freq_base / get_rope_freq_scale give SWA layers that base and scale 1
    "gemma3 per layer type": (
        {**GEMMA3, "rope_theta": None,
         "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
         "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 20000.0}}},
        "same", [], "models/gemma3.cpp load_arch_hparams"),
    "gemma3 (v4 keys, linear global)": (
        {**GEMMA3, "rope_theta": 1e6, "rope_local_base_freq": 20000.0,
         "sliding_window_pattern": 6, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
        "same", [], "llama_model::get_rope_freq_scale"),
    # Gemma3Model writes no sliding_window_pattern: load_swa_pattern's default period 6
    # makes layer 2 (full attention in a 3-periodic config) a sliding one
    "gemma3 sliding_window_pattern 3": (
        {**GEMMA3, "rope_theta": 1e6, "rope_local_base_freq": 20000.0,
         "sliding_window_pattern": 3},
        "different", [8192], "llama-model.cpp load_swa_pattern"),
    # --- the cross-engine cases (engine_cases.CASES), whole configs ---
    # ggml.c ggml_rope_yarn_corr_dims floors and ceils the correction range always
    # (GptOssModel writes no truncate and libllama has none): GPT-OSS's truncate false
    # keeps it unrounded, so the ramp's pairs turn at other frequencies
    "gpt-oss yarn truncate": (_case("gpt-oss yarn truncate"), "different", [4096, 131072],
                              "ggml.c ggml_rope_yarn_corr_dims"),
    # ... and with truncate true (the rounded range) the same arguments agree
    "gpt-oss yarn truncate true": (
        {**_case("gpt-oss yarn truncate"),
         "rope_scaling": {**_case("gpt-oss yarn truncate")["rope_scaling"], "truncate": True}},
        "same", [], "ggml.c ggml_rope_yarn_corr_dims"),
    # conversion/base.py TextModel.__init__ reads rope_parameters as it reads rope_scaling:
    # the same rounded range
    "v5 gpt-oss yarn truncate": (_case("v5 gpt-oss yarn truncate"), "different",
                                 [4096, 131072], "ggml.c ggml_rope_yarn_corr_dims"),
    # DeepseekV2Model writes 0.1 * mscale_all_dim as yarn_log_multiplier; llama-context.cpp
    # takes mscale = mscale_all_dim (equal here): unscaled tables, mscale^2 in kq_scale
    "deepseek-v2 mscale 0.707": (_case("deepseek-v2 mscale 0.707"), "same", [],
                                 "models/deepseek2.cpp, llama-context.cpp"),
    "v5 deepseek mscale": (_case("v5 deepseek mscale"), "same", [],
                           "conversion/base.py TextModel.__init__ (rope_parameters)"),
    # models/smollm3.cpp: n_no_rope_layer_step = 4 (load_arch_hparams, not read from the
    # GGUF), use_rope = (il + 1) % 4 != 0: no ROPE node in layer 3, as no_rope_layers says
    "smollm3 no_rope_layers": (_case("smollm3 no_rope_layers"), "same", [],
                               "models/smollm3.cpp"),
    "v5 smollm3 no_rope_layers": (_case("v5 smollm3 no_rope_layers"), "same", [],
                                  "models/smollm3.cpp"),
    # ... and SmolLM3Model writes no no_rope_layers: another mask is not read, layer 2
    # (NoPE in transformers) is rotated
    "smollm3 no_rope_layers [1, 1, 0, 1]": (
        {**_case("smollm3 no_rope_layers"), "no_rope_layers": [1, 1, 0, 1]}, "different",
        [65536], "models/smollm3.cpp n_no_rope_layer_step"),
    # Cohere2Model.set_gguf_parameters indexes hparams["rotary_pct"], which the case's
    # config (and transformers' Cohere2Config) has not
    "cohere2 nope": (_case("cohere2 nope"), "refused", [],
                     "conversion/command_r.py Cohere2Model.set_gguf_parameters"),
    "v5 cohere2 nope": (_case("v5 cohere2 nope"), "refused", [],
                        "conversion/command_r.py Cohere2Model.set_gguf_parameters"),
    # with rotary_pct: models/cohere2.cpp calls ggml_rope_ext on SWA layers only
    # (load_swa_pattern(ml, 4): layer 3 is full attention, no ROPE node)
    "cohere2 nope, rotary_pct, tied": (
        {**_case("cohere2 nope"), "rotary_pct": 1.0, "tie_word_embeddings": True}, "same", [],
        "models/cohere2.cpp"),
    # untied, the converter cannot map lm_head.weight (Cohere2 ties its embeddings): no
    # tiny checkpoint, the step (and which layers rotate) is restated
    "cohere2 nope, rotary_pct": ({**_case("cohere2 nope"), "rotary_pct": 1.0}, "same", [],
                                 "models/cohere2.cpp (restated)"),
    # Phi3MiniModel reads rope_parameters through TextModel.__init__: the factors and
    # rope.scaling.attn_factor as in the rope_scaling layout
    "v5 longrope": (_case("v5 longrope"), "same", [], "conversion/phi.py Phi3MiniModel"),
    # conversion/qwen.py (the MTP mixin's __init__): no mtp_num_hidden_layers in the config
    # and no mtp.* tensors: assert opt_num_mtp_layers != 0 (convert_hf_to_gguf.py without
    # --no-mtp)
    "mrope interleaved partial": (_case("mrope interleaved partial"), "refused", [],
                                  "conversion/qwen.py __init__"),
}  # fmt: skip


def _config(changes: dict) -> dict:
    whole = "text_config" in changes or "architectures" in changes
    data = changes if whole else {**BASE, **changes}
    return {k: v for k, v in data.items() if v is not None}


@pytest.fixture(scope="module")
def python():
    return built_engine("llama.cpp")


def batch():
    """Every case's :class:`~engines.EngineResult`, from one batch child process; the
    suite runs it in the background (tests/background.py)."""
    found = engines.run_cases("llama.cpp", [_config(c[0]) for c in CASES.values()])
    return dict(zip(CASES, found, strict=True))


@pytest.fixture(scope="module")
def results(python):
    return background.result("batch-test_engine_llamacpp")


@pytest.mark.parametrize("case", list(CASES))
def test_llamacpp_reading(results, case):
    _, verdict, differing, why = CASES[case]
    result = results[case]
    assert result.verdict == verdict, (result.note, result.first_difference)
    if verdict == "refused":
        # the converter's own error, and where in its code it was raised
        assert why.split()[0] in result.note
        return
    assert result.version.startswith("llama.cpp b11312 (0c1e57098)")
    assert result.source.startswith(RESTATED if case in NO_TINY_CHECKPOINT else RAN)
    assert [w["seq_len"] for w in result.windows if not w["same"]] == differing


#: Cases libllama cannot be run on (no tiny checkpoint: transformers refuses the config):
#: their key-to-argument step is restated.
NO_TINY_CHECKPOINT = {"longrope (phi3) with rope_type only", "longrope (llama)",
                      "cohere2 nope, rotary_pct"}  # fmt: skip
RAN = "converter, libllama (loader, context, graph) and ggml run"
RESTATED = "converter and ggml run; key-to-argument step restated"


@pytest.mark.parametrize(
    "case", [c for c, v in CASES.items() if v[1] != "refused" and c not in NO_TINY_CHECKPOINT]
)
def test_restated_step_agrees_with_libllama(results, case):
    # libllama's graph gave the arguments; the restated step (the fallback) gave the same
    note = results[case].note
    assert "the restated step (rope_arguments) gives the same arguments" in note, note


def test_every_window_says_whether_llamacpp_rotates(results):
    # a layer rotates where libllama's graph has a ROPE node in it (else the restated
    # models/<arch>.cpp rule); only the nope windows of these configs do not
    for case, (_, verdict, _, _) in CASES.items():
        if verdict == "refused":
            continue
        windows = results[case].windows
        if case == "smollm3 no_rope_layers [1, 1, 0, 1]":
            # models/smollm3.cpp's fixed step 4 rotates layer 2, transformers' NoPE layer
            assert [w["rotates"] for w in windows] == [True, True]
            continue
        assert [w["rotates"] for w in windows] == [not w["nope"] for w in windows], case


def test_nope_layers_read_from_libllama_s_graph(results):
    smol = results["smollm3 no_rope_layers"].windows[-1]
    assert smol["nope"] and smol["layer"] == 3 and smol["rotates"] is False
    assert "libllama's graph has no ROPE node in layer 3 (ROPE nodes in layers [0, 1, 2])" \
        in smol["mode"]  # fmt: skip
    cohere = results["cohere2 nope, rotary_pct, tied"].windows[-1]
    assert cohere["rotates"] is False and "no ROPE node in layer 3" in cohere["mode"]
    # without libllama (no tiny checkpoint): the restated models/cohere2.cpp rule
    restated = results["cohere2 nope, rotary_pct"].windows[-1]
    assert restated["rotates"] is False
    assert "restated: models/cohere2.cpp: ggml_rope_ext on the sliding-window layers only" \
        in restated["mode"]  # fmt: skip


def test_switching(results):
    # llama-model.cpp llama_model::get_rope_factors: long factors when n_ctx_seq >
    # n_ctx_orig_yarn, from the context size
    assert results["longrope (phi3)"].switching.startswith("once per context, from its size")
    assert "llama_model::get_rope_factors" in results["v5 longrope"].switching
    # TextModel.set_gguf_parameters writes no factors for llama: nothing to switch
    assert results["longrope (llama)"].switching.startswith(
        "never: LlamaModel wrote no LongRoPE factors"
    )
    # no dynamic NTK in llama.cpp
    assert results["dynamic"].switching.startswith("never: llama.cpp has no dynamic NTK")
    assert results["default"].switching is None and results["yarn"].switching is None


_WITHOUT_RESTATED_ARCH = """
import json, sys
sys.path.insert(0, {readers!r})
import llamacpp_reader as r
del r.ROPE_TYPES["smollm3"]  # as for an architecture the reader does not restate
request = json.loads(sys.argv[1])
answer = r.answer(request)
print(json.dumps({{"source": answer["source"], "note": answer["note"],
                   "rotates": [w["rotates"] for w in answer["windows"]]}}))
"""


def test_restated_step_missing_is_not_fatal_where_libllama_ran(python):
    # rope_arguments raises NotImplementedError for an architecture it does not restate;
    # libllama's graph gives the arguments, so the config is read, and the note says so
    config = CASES["smollm3 no_rope_layers"][0]
    request = {"config": config, "windows": [
        {"seq_len": 4096, "positions": [0, 1, 4095], "layer": 0},
        {"seq_len": 4096, "positions": [0, 1, 4095], "layer": 3, "nope": True}]}  # fmt: skip
    script = _WITHOUT_RESTATED_ARCH.format(readers=str(engines.READERS))
    out = subprocess.run([str(python), "-c", script, json.dumps(request)], capture_output=True,
                         text=True, check=True, timeout=300, env=engines.child_env())  # fmt: skip
    got = json.loads(out.stdout)
    assert got["source"].startswith(RAN)
    assert "the restated step is not available (llama_model_rope_type for architecture " \
        "'smollm3' is not restated in this reader)" in got["note"]  # fmt: skip
    assert got["rotates"] == [True, False]


def test_yarn_scale_is_ggml_s_own(results):
    # llama-context.cpp divides 0.1 ln f + 1 out of attn_factor; ggml's rope_yarn
    # multiplies it back: the tables carry YaRN's mscale, not the config's attention_factor
    yarn_mscale = 0.1 * math.log(4.0) + 1
    assert results["yarn"].attention_scaling["engine"] == pytest.approx(yarn_mscale, rel=1e-6)
    ignored = results["yarn attention_factor"].attention_scaling
    assert ignored["reference"] == pytest.approx(1.2)
    assert ignored["engine"] == pytest.approx(yarn_mscale, rel=1e-6)


def test_deepseek_scale_moves_into_the_softmax(results):
    # models/deepseek2.cpp: kq_scale = mscale^2 / sqrt(head_dim), tables unscaled
    scaling = results["deepseek_v3 yarn"].attention_scaling
    assert scaling["engine"] == pytest.approx(1.0, abs=1e-6)
    softmax = scaling["softmax_scale"]
    assert softmax["engine"] == pytest.approx(softmax["reference"], rel=1e-6)


def test_keys_the_converter_wrote_are_named(results):
    note = results["llama3"].note
    assert "conversion.llama.LlamaModel" in note and "rope_freqs.weight[64]" in note
    note = results["longrope (phi3)"].note
    assert "rope_factors_long.weight[64]" in note and "rope.scaling.attn_factor=" in note
    assert "rope.dimension_sections=[16, 24, 24, 0]" in results["qwen2_vl mrope"].note
    assert "rope.freq_base_swa=20000.0" in results["gemma3 per layer type"].note


# --------------------------------------------------------------------------------------
# ggml's own output against a float64 statement of its formula, at known arguments.

_RUN_GGML = """
import json, sys
sys.path.insert(0, {readers!r})
import llamacpp_reader as r
args = json.loads(sys.argv[1])
c, s, op = r.ggml_rope(args, args.pop("positions"), args.pop("position_ids", None))
print(json.dumps({{"cos": c, "sin": s, "op": op}}))
"""


def _ggml(python, args: dict) -> dict:
    script = _RUN_GGML.format(readers=str(engines.READERS))
    out = subprocess.run([str(python), "-c", script, json.dumps(args)], capture_output=True,
                         text=True, check=True, timeout=60)  # fmt: skip
    return json.loads(out.stdout)


def _yarn_angles(args: dict, position: int) -> list[tuple[float, float]]:
    """ggml's rope angle and magnitude per pair, in float64 (its formula, not its code)."""
    n, base, scale = args["n_dims"], args["freq_base"], args["freq_scale"]

    def corr_dim(rotations: float) -> float:
        return n * math.log(args["n_ctx_orig"] / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(args["beta_fast"])))
    high = min(n - 1.0, math.ceil(corr_dim(args["beta_slow"])))
    factors = args.get("freq_factors") or [1.0] * (n // 2)
    out = []
    for i in range(n // 2):
        extrap = position * base ** (-2 * i / n) / factors[i]
        interp = scale * extrap
        magnitude = args["attn_factor"]
        theta = interp
        if args["ext_factor"] != 0:
            ramp = 1 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))
            mix = ramp * args["ext_factor"]
            theta = interp * (1 - mix) + extrap * mix
            magnitude *= 1 + 0.1 * math.log(1 / scale)
        out.append((theta, magnitude))
    return out


@pytest.mark.parametrize("mode", [0, 2])
def test_ggml_rope_against_its_formula(python, mode):
    args = {"n_dims": 64, "mode": mode, "n_ctx_orig": 1024, "freq_base": 10000.0,
            "freq_scale": 0.25, "ext_factor": 1.0, "attn_factor": 0.9, "beta_fast": 32.0,
            "beta_slow": 1.0, "freq_factors": [1.0 + 0.125 * (k % 5) for k in range(32)],
            "sections": [0, 0, 0, 0]}  # fmt: skip
    positions = [0, 1, 7, 1000, 4095]
    got = _ggml(python, {**args, "positions": positions})
    assert got["op"] == f"ggml_rope_ext (mode {'NORMAL' if mode == 0 else 'NEOX'})"
    eps = 2.0**-24  # float32's unit roundoff
    for row, p in enumerate(positions):
        for i, (theta, m) in enumerate(_yarn_angles(args, p)):
            # theta_i is p times theta_scale^i, i float32 products from a float32
            # theta_scale (2i + 1 roundings), then the factor, the scale and the ramp's mix
            # (a few more): |error| <= |theta| (2i + 8) eps; cos and sin add a few eps
            tol = m * (abs(theta) * (2 * i + 8) * eps + 8 * eps)
            assert got["cos"][row][i] == pytest.approx(m * math.cos(theta), abs=tol)
            assert got["sin"][row][i] == pytest.approx(m * math.sin(theta), abs=tol)


def test_ggml_rope_multi_reads_each_axis(python):
    # sections of pairs (t, h, w) = (8, 12, 12): pair k turns with its axis' position
    args = {"n_dims": 64, "mode": 8, "n_ctx_orig": 4096, "freq_base": 1e6, "freq_scale": 1.0,
            "ext_factor": 0.0, "attn_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "freq_factors": None, "sections": [8, 12, 12, 0]}  # fmt: skip
    ids = [[5, 9], [2, 3], [1, 7]]
    got = _ggml(python, {**args, "positions": [5, 9], "position_ids": ids})
    assert got["op"].startswith("ggml_rope_multi (mode MROPE")
    eps = 2.0**-24
    for row in range(2):
        for i in range(32):
            axis = 0 if i < 8 else 1 if i < 20 else 2
            theta = ids[axis][row] * 1e6 ** (-2 * i / 64)
            tol = abs(theta) * (2 * i + 8) * eps + 8 * eps
            assert got["cos"][row][i] == pytest.approx(math.cos(theta), abs=tol)
            assert got["sin"][row][i] == pytest.approx(math.sin(theta), abs=tol)
