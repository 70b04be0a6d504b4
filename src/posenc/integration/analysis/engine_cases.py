"""The RoPE configs every engine is run on for the cross-engine table.

One small ``config.json`` per case: each ``rope_type`` transformers defines, YaRN with
and without ``attention_factor`` and as DeepSeek writes it (``mscale``,
``mscale_all_dim``), LongRoPE in Phi-3's layout and inside ``rope_scaling``,
``partial_rotary_factor``, M-RoPE in Qwen2-VL's contiguous sections, Qwen3-VL's
interleave and Qwen3.5's interleave on a quarter of the head, the transformers 4 layout
(``rope_theta``, ``rope_scaling``) and the 5 one (``rope_parameters``), and Gemma 3's one
RoPE per layer type in both layouts. Then the configs users filed bugs about, each in both
layouts: GPT-OSS's YaRN with ``truncate`` false, DeepSeek's ``mscale`` and
``mscale_all_dim`` (judged on the softmax scale too), SmolLM3's ``no_rope_layers`` and
Cohere 2's full-attention layers without RoPE (a window at the first such layer), and
Phi-3's LongRoPE on both sides of its switch.

The sizes are tiny (one or a few layers, a vocabulary of 32) so that an engine which
builds the whole model does so in a moment, but the head sizes, bases and scaling
parameters are the released models' (Llama 3.1, Qwen2.5, DeepSeek-V3, Phi-3 128k,
StableLM, Qwen2-VL, Qwen3-VL, Gemma 3), so the frequencies are the ones that matter.
``torch_dtype`` is float32 everywhere: the table measures how each engine reads the
config, not the rounding of a bfloat16 cache.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Case:
    """One config of the cross-engine table: its name, what it checks and the config."""

    name: str
    what: str
    config: dict[str, Any]

    def data(self) -> dict[str, Any]:
        """A copy of the config (a reader may not change the shared one)."""
        return copy.deepcopy(self.config)


_SIZES = {
    "hidden_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "vocab_size": 32,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
}
_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_SIZES,
          "max_position_embeddings": 8192, "rope_theta": 500000.0}  # fmt: skip
_QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **_SIZES,
          "max_position_embeddings": 131072, "rope_theta": 1000000.0}  # fmt: skip
_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
#: Phi-3-mini-128k-instruct's factors (48 pairs of head_dim 96), rounded.
_SHORT = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.01, 1.02, 1.02, 1.04,
          1.05, 1.05, 1.06, 1.07, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9,
          1.95, 2.0, 2.05, 2.1, 2.15, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.0, 3.0,
          3.0]  # fmt: skip
_LONG = [1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 2.4, 2.9, 3.5, 4.2, 5.0, 6.0, 7.2, 8.6, 10.3,
         12.4, 14.9, 17.9, 21.5, 25.8, 31.0, 37.2, 44.6, 53.5, 64.2, 77.0, 85.0, 90.0, 95.0,
         100.0, 105.0, 110.0, 115.0, 120.0, 125.0, 130.0, 135.0, 140.0, 145.0, 150.0, 155.0,
         160.0, 165.0, 170.0, 175.0, 180.0, 185.0]  # fmt: skip
_PHI3 = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], **_SIZES,
         "hidden_size": 384, "max_position_embeddings": 131072,
         "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
         "hidden_act": "silu", "sliding_window": 262144, "pad_token_id": 0}  # fmt: skip
#: DeepSeek-V3's YaRN: factor 40 from 4096, mscale = mscale_all_dim = 1.
_DEEPSEEK_V3_YARN: dict[str, Any] = {
    "type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
    "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
}  # fmt: skip
_DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], **_SIZES,
    "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 256,
    "q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64,
    "v_head_dim": 32, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "moe_layer_freq": 1, "max_position_embeddings": 163840,
    "rope_theta": 10000.0,
    "rope_scaling": dict(_DEEPSEEK_V3_YARN),
}  # fmt: skip
_GEMMA3 = {
    "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], **_SIZES,
    "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 256, "max_position_embeddings": 131072, "sliding_window": 512,
    "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
}  # fmt: skip
_GEMMA3_TYPES = ["sliding_attention"] * 5 + ["full_attention"]

#: GPT-OSS's YaRN: factor 32 from 4096, its correction range not rounded (``truncate``
#: false; vllm #28244).
_GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip
_GPT_OSS = {
    "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], **_SIZES,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "hidden_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2,
    "experts_per_token": 2, "sliding_window": 128, "max_position_embeddings": 131072,
    "layer_types": ["sliding_attention", "full_attention"], "attention_bias": True,
}  # fmt: skip
#: DeepSeek-V2's YaRN: mscale = mscale_all_dim = 0.707 (the softmax scale carries
#: mscale(factor, mscale_all_dim) squared; llama.cpp #17945).
_DEEPSEEK_V2_YARN = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                     "mscale_all_dim": 0.707}  # fmt: skip
#: SmolLM3: every 4th layer without RoPE (``no_rope_layers``: 1 = RoPE, 0 = NoPE;
#: transformers #43756 read it inverted).
_SMOLLM3 = {
    "model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"], **_SIZES,
    "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 4, "max_position_embeddings": 65536, "no_rope_layers": [1, 1, 1, 0],
    "pad_token_id": 0,
    "no_rope_layer_interval": 4,
}  # fmt: skip
#: Cohere 2 (Command R7B): the sliding-window layers rotate (interleaved pairs), every
#: 4th layer is full attention without RoPE.
_COHERE2 = {
    "model_type": "cohere2", "architectures": ["Cohere2ForCausalLM"], **_SIZES,
    "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 4, "max_position_embeddings": 8192, "sliding_window": 4096,
    "layer_norm_eps": 1e-5, "logit_scale": 0.25,
}  # fmt: skip
_COHERE2_TYPES = ["sliding_attention"] * 3 + ["full_attention"]
_PHI3_LONGROPE = {"type": "longrope", "short_factor": _SHORT, "long_factor": _LONG}

#: The RoPE configurations each engine is compared on, by name.
CASES: dict[str, Case] = {c.name: c for c in [
    Case("default", "Llama 3's base 500000, no scaling",
         _LLAMA),
    Case("linear", "position interpolation, factor 2",
         {**_LLAMA, "max_position_embeddings": 16384,
          "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    Case("dynamic", "dynamic NTK, factor 2, read at 2 x max_position_embeddings",
         {**_LLAMA, "max_position_embeddings": 4096, "rope_theta": 10000.0,
          "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}),
    Case("yarn", "YaRN, Qwen2.5's factor 4 from 32768",
         {**_QWEN2, "rope_scaling": dict(_YARN)}),
    Case("yarn attention_factor", "YaRN with attention_factor 1.2 given",
         {**_QWEN2, "rope_scaling": {**_YARN, "attention_factor": 1.2}}),
    Case("yarn deepseek mscale", "DeepSeek-V3's YaRN: factor 40, mscale = mscale_all_dim = 1",
         _DEEPSEEK_V3),
    Case("longrope", "Phi-3 128k: original_max_position_embeddings at the top level",
         {**_PHI3, "rope_scaling": {"type": "longrope", "short_factor": _SHORT,
                                    "long_factor": _LONG}}),
    Case("longrope inside", "LongRoPE with original_max_position_embeddings in rope_scaling",
         {**_LLAMA, "hidden_size": 384, "max_position_embeddings": 131072,
          "rope_theta": 10000.0,
          "rope_scaling": {"rope_type": "longrope", "short_factor": _SHORT,
                           "long_factor": _LONG, "original_max_position_embeddings": 4096}}),
    Case("llama3", "Llama 3.1: factor 8 from 8192",
         {**_LLAMA, "max_position_embeddings": 131072, "rope_scaling": dict(_LLAMA3)}),
    Case("proportional", "proportional RoPE over the whole head, partial_rotary_factor 0.25",
         {**_LLAMA, "rope_scaling": {"rope_type": "proportional",
                                     "partial_rotary_factor": 0.25}}),
    Case("partial_rotary_factor", "StableLM: a quarter of the head rotates",
         {"model_type": "stablelm", "architectures": ["StableLmForCausalLM"], **_SIZES,
          "partial_rotary_factor": 0.25, "layer_norm_eps": 1e-5, "hidden_act": "silu",
          "max_position_embeddings": 4096, "rope_theta": 10000.0, "use_qkv_bias": False}),
    Case("mrope sections", "Qwen2-VL's M-RoPE, contiguous sections [16, 24, 24]",
         {**_QWEN2, "model_type": "qwen2_vl", "architectures":
          ["Qwen2VLForConditionalGeneration"], "max_position_embeddings": 32768,
          "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
          "vision_config": {"depth": 1, "embed_dim": 32, "hidden_size": 512,
                            "num_heads": 2, "in_chans": 3, "spatial_merge_size": 2,
                            "patch_size": 14, "temporal_patch_size": 2}}),
    Case("mrope interleaved", "Qwen3-VL's interleaved M-RoPE [24, 20, 20] (text_config)",
         {"model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"],
          "torch_dtype": "float32", "tie_word_embeddings": False,
          "text_config": {**{k: v for k, v in _QWEN2.items() if k != "architectures"},
                          "model_type": "qwen3_vl_text", "head_dim": 128,
                          "max_position_embeddings": 262144, "rope_theta": 5000000.0,
                          "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20],
                                           "mrope_interleaved": True}},
          "vision_config": {"depth": 1, "hidden_size": 64, "intermediate_size": 64,
                            "num_heads": 2, "out_hidden_size": 512, "patch_size": 16,
                            "spatial_merge_size": 2, "temporal_patch_size": 2,
                            "num_position_embeddings": 16, "deepstack_visual_indexes": []}}),
    Case("mrope interleaved partial", "Qwen3.5's interleaved M-RoPE [11, 11, 10] on a quarter "
         "of head_dim 256 (partial_rotary_factor 0.25; one full-attention layer)",
         {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
          "torch_dtype": "float32", "tie_word_embeddings": False,
          "text_config": {**{k: v for k, v in _SIZES.items() if k != "torch_dtype"},
                          "model_type": "qwen3_5_text", "num_key_value_heads": 2,
                          "head_dim": 256, "max_position_embeddings": 262144,
                          "layer_types": ["full_attention"], "full_attention_interval": 1,
                          "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                                              "partial_rotary_factor": 0.25,
                                              "mrope_section": [11, 11, 10],
                                              "mrope_interleaved": True}},
          "vision_config": {"depth": 1, "hidden_size": 64, "intermediate_size": 64,
                            "num_heads": 2, "out_hidden_size": 512, "patch_size": 16,
                            "spatial_merge_size": 2, "temporal_patch_size": 2,
                            "num_position_embeddings": 16, "deepstack_visual_indexes": []}}),
    Case("v5 llama3", "Llama 3.1 in the transformers 5 layout (rope_parameters)",
         {**{k: v for k, v in _LLAMA.items() if k != "rope_theta"},
          "max_position_embeddings": 131072,
          "rope_parameters": {**_LLAMA3, "rope_theta": 500000.0}}),
    Case("v5 yarn", "YaRN in the transformers 5 layout (rope_parameters)",
         {**{k: v for k, v in _QWEN2.items() if k != "rope_theta"},
          "rope_parameters": {**_YARN, "rope_theta": 1000000.0}}),
    Case("gemma3", "Gemma 3: local base 10000 on sliding layers, linear 8 on global ones",
         {**_GEMMA3, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
          "sliding_window_pattern": 6,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    Case("gpt-oss yarn truncate", "GPT-OSS: YaRN factor 32 with truncate false",
         {**_GPT_OSS, "rope_theta": 150000.0, "rope_scaling": dict(_GPT_OSS_YARN)}),
    Case("v5 gpt-oss yarn truncate", "GPT-OSS's YaRN in the transformers 5 layout",
         {**_GPT_OSS, "rope_parameters": {**_GPT_OSS_YARN, "rope_theta": 150000.0}}),
    Case("deepseek-v2 mscale 0.707", "DeepSeek-V2's YaRN: mscale = mscale_all_dim = 0.707",
         {**_DEEPSEEK_V3, "rope_scaling": dict(_DEEPSEEK_V2_YARN)}),
    Case("v5 deepseek mscale", "DeepSeek-V3's YaRN in the transformers 5 layout",
         {**{k: v for k, v in _DEEPSEEK_V3.items() if k not in ("rope_theta", "rope_scaling")},
          "rope_parameters": {**_DEEPSEEK_V3_YARN, "rope_type": "yarn",
                              "rope_theta": 10000.0}}),
    Case("smollm3 no_rope_layers", "SmolLM3: no_rope_layers [1, 1, 1, 0], layer 3 without RoPE",
         {**_SMOLLM3, "rope_theta": 2000000.0}),
    Case("v5 smollm3 no_rope_layers", "SmolLM3 in the transformers 5 layout",
         {**_SMOLLM3, "rope_parameters": {"rope_type": "default", "rope_theta": 2000000.0}}),
    Case("cohere2 nope", "Cohere 2: interleaved RoPE on sliding layers, none on layer 3",
         {**_COHERE2, "rope_theta": 50000.0, "sliding_window_pattern": 4}),
    Case("v5 cohere2 nope", "Cohere 2 in the transformers 5 layout (layer_types)",
         {**_COHERE2, "layer_types": _COHERE2_TYPES,
          "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}),
    Case("v5 longrope", "Phi-3 128k's LongRoPE in the transformers 5 layout",
         {**{k: v for k, v in _PHI3.items() if k != "rope_theta"},
          "rope_parameters": {"rope_type": "longrope", "short_factor": _SHORT,
                              "long_factor": _LONG, "rope_theta": 10000.0}}),
    Case("v5 gemma3", "Gemma 3 in the transformers 5 layout: rope_parameters per layer type",
         {**_GEMMA3, "layer_types": _GEMMA3_TYPES,
          "rope_parameters": {
              "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
]}  # fmt: skip
