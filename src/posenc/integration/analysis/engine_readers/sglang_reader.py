"""Read a config's RoPE the way SGLang's model file for it does, and print its cos/sin tables.

Runs under SGLang's own Python (``posenc engines build sglang``'s environment): standard library,
torch and SGLang only, never posenc. ``SGLANG_USE_CPU_ENGINE=1`` is set before SGLang
is imported (its CPU platform: ``is_cpu()``).

The config is read as SGLang's ``hf`` config parser reads it
(``sglang/srt/utils/hf_transformers/config.py``, ``HfModelConfigParser.parse``):
``transformers.AutoConfig.from_pretrained`` on the config written to a temporary
folder, with the transformers release SGLang pins and SGLang's own patches of it
(``sglang/srt/utils/hf_transformers_patches.py``, applied by ``import sglang``); for a
config with a ``text_config`` the text config is the one the language model reads.
``sglang.srt.configs`` (SGLang's own config classes and ``get_rope_config``) imports
torchvision, which needs a CUDA build, so the parser's call and
``get_rope_config``'s four lines are restated here and the note says so.

The rotary module is the one ``sglang.srt.layers.rotary_embedding.get_rope`` (or,
for DeepSeek on CPU, ``get_rope_wrapper`` -> ``get_rope_cpu``) returns for the
arguments the model file for the config's ``model_type`` passes it; those arguments
are restated from the model file's attention ``__init__`` (the model files need
SGLang's tensor-parallel runtime to be built), and the note names the file:

- ``llama`` (and ``phi3``, ``Phi3ForCausalLM`` being ``models/llama.py``'s; any
  ``model_type`` without its own entry here is read as ``models/llama.py`` reads it,
  and the answer's ``fallback`` (``"models/llama.py"``) and note say so):
  ``rope_parameters`` (else ``rope_theta`` / ``rope_scaling``), the top-level
  ``original_max_position_embeddings`` copied into the scaling, ``head_dim`` or
  ``hidden_size // num_attention_heads``, ``partial_rotary_factor``,
  ``rope_is_neox_style``;
- ``qwen2``, ``qwen2_vl``, ``qwen2_5_vl`` (``models/qwen2.py``'s ``Qwen2Model``):
  ``get_rope_config``; an ``mrope_section`` makes ``get_rope`` build an
  ``MRotaryEmbedding``; ``qwen3``, ``qwen3_vl`` (``models/qwen3.py``'s ``Qwen3Model``,
  ``mrope_interleaved``);
- ``gemma3_text`` / ``gemma3`` (``models/gemma3_causal.py``): without SGLang's CPU AMX
  kernels (and on GPUs) ``Gemma3Attention.forward`` runs ``forward_native``, which
  applies the model-level ``Gemma3RotaryEmbedding`` (``Gemma3TextModel.rotary_emb``
  for global layers: ``rope_parameters["full_attention"]`` with its scaling;
  ``rotary_emb_local`` for sliding ones: ``rope_local_base_freq`` or
  ``rope_parameters["sliding_attention"]``'s base, no scaling). That class is
  compiled from the installed model file alone (importing the file reaches
  torchvision) and applied with ``apply_rotary_pos_emb_native_eager``. With AMX
  kernels, ``forward_cpu`` applies the attention's own ``get_rope`` module, built
  with ``{"rope_type": "default"}`` on both layer types, and that one is read;
- ``deepseek_v3`` / ``deepseek_v2`` (``models/deepseek_v2.py``,
  ``DeepseekV2AttentionMLA``): the scaling's ``rope_type`` becomes
  ``deepseek_yarn``, pairs interleaved unless ``rope_interleave`` is false, and the
  softmax scale ``qk_head_dim ** -0.5`` times ``yarn_get_mscale(factor,
  mscale_all_dim) ** 2`` (``configs/model_config.py``, ``compute_mla_mscale_scaling``);
- ``stablelm`` (``models/stablelm.py``): ``rope_pct`` or ``partial_rotary_factor``,
  ``rope_parameters["rope_theta"]``, no scaling;
- ``gpt_oss`` (``models/gpt_oss.py``, ``GptOssAttention``): the whole
  ``rope_parameters`` as the scaling (``get_rope``'s YaRN reads ``truncate``);
- ``cohere`` / ``cohere2`` (``models/commandr.py``, ``CohereAttention``):
  ``hidden_size // num_attention_heads``, GPT-J (interleaved) pairs; its ``forward``
  rotates a Cohere 2 layer only where ``layer_types`` says ``sliding_attention``;
- ``qwen3_5`` (``models/qwen3_5.py``, ``Qwen3_5AttentionDecoderLayer``):
  ``get_rope_config``, the config's top-level ``partial_rotary_factor``; the config is
  SGLang's own ``configs/qwen3_5.py`` class (``_CONFIG_REGISTRY``; imported without the
  ``sglang.srt.configs`` package's ``__init__``), whose ``layers_block_type`` (from
  ``full_attention_interval``) says which layers have attention with RoPE.

An architecture no SGLang model file lists in its ``EntryClass`` (read from the files,
as ``models/registry.py`` collects them) runs on SGLang's Transformers backend
(``models/transformers.py``; ``model_loader/utils.py``, ``get_model_architecture``):
transformers' own rotary module and attention layers, read by building the model on the
meta device, its ``rotary_emb`` class again on the CPU, applied by the modeling file's
``apply_rotary_pos_emb``; each layer's ``use_rope`` (SmolLM3's ``no_rope_layers``) says
whether it rotates.

Each window's answer says whether the asked ``layer`` rotates (``rotates``; cos 1 and
sin 0 where it does not), and the answer's ``switching`` says when a LongRoPE or
dynamic NTK module changes its tables (null for any other RoPE).

The module is built in float32 (``get_rope``'s ``dtype``, the config's
``torch_dtype`` as ``--dtype float32`` serves it; on CPU SGLang casts its
``cos_sin_cache`` to the model's dtype, and ``--dtype auto`` downcasts a float32
config to float16, bfloat16 for Gemma).

The tables come from the module itself, called as the model calls it,
``rotary_emb(positions, q, k)``: ``BaseFusedOp`` dispatches it (on a CPU without
AMX kernels, ``forward_cpu`` -> ``forward_native``; the answer's ``mode`` names the
method that ran). Applied to unit vectors (1 in the first channel of every pair, 0
in the second), the rotated pair holds ``(m cos, m sin)``, ``m`` being any scale the
module multiplies in (YaRN's mscale, LongRoPE's). Each window is one prefill of
``seq_len`` tokens (positions ``0 .. seq_len - 1``, what Phi-3's LongRoPE reads), rows
picked at the asked positions; when that prefill would be too large, only the asked
positions are evaluated and ``mode`` says so. An M-RoPE module gets 3-row positions:
all three axes at the token index, or the window's ``position_ids``.

The protocol (request, batch, answer) is :mod:`~posenc.analysis.engine_readers.protocol`'s.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import json
import math
import os
import sys
import tempfile
from typing import Any

try:  # run as a script by the engine's Python: its sibling
    from hf_backend import TransformersRope
except ModuleNotFoundError:  # imported as part of posenc (its import checks)
    from .hf_backend import TransformersRope

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

#: The largest prefill evaluated in one call (elements of the unit-vector input).
MAX_PREFILL_ELEMENTS = 2**26

_QWEN2 = ("qwen2", "qwen2_vl", "qwen2_5_vl")
_QWEN3 = ("qwen3", "qwen3_vl", "qwen3_vl_text")
_GEMMA3 = ("gemma3_text", "gemma3")
_DEEPSEEK = ("deepseek_v3", "deepseek_v2")
_COHERE = ("cohere", "cohere2")
_QWEN3_5 = ("qwen3_5", "qwen3_5_text")
#: model types whose SGLang model file is restated here (the others are read as
#: ``models/llama.py`` reads them, and the answer's ``fallback`` says so)
_RESTATED = (*_QWEN2, *_QWEN3, *_GEMMA3, *_DEEPSEEK, *_COHERE, *_QWEN3_5, "llama", "phi3",
             "stablelm", "gpt_oss")  # fmt: skip
#: SGLang's own config classes (``utils/hf_transformers/common.py``: ``_CONFIG_REGISTRY``)
#: the hf parser reloads these model types with: module of ``sglang.srt.configs``, class
_SGLANG_CONFIGS = {"qwen3_5": ("qwen3_5", "Qwen3_5Config"),
                   "qwen3_5_moe": ("qwen3_5", "Qwen3_5MoeConfig"),
                   "qwen3_next": ("qwen3_next", "Qwen3NextConfig")}  # fmt: skip
#: The model file the answer's ``fallback`` names when the reader reads a model as another's.
FALLBACK = "models/llama.py"


def _hf_config(config: dict[str, Any]) -> tuple[Any, Any]:
    """The config as SGLang's ``hf`` parser reads it, and the text config the LM reads."""
    import sglang  # noqa: F401  (applies SGLang's transformers patches)
    from transformers import AutoConfig

    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        hf = AutoConfig.from_pretrained(folder, trust_remote_code=False)
        if hf.model_type in _SGLANG_CONFIGS:
            # HfModelConfigParser.parse: a model_type in _CONFIG_REGISTRY is reloaded with
            # SGLang's own class
            hf = _sglang_config_class(hf.model_type).from_pretrained(folder)
    text = getattr(hf, "text_config", None) or hf
    if text is not hf:
        # HfModelConfigParser.parse: the text config's keys the top level lacks
        for key, value in text.to_dict().items():
            if not hasattr(hf, key) and value is not None:
                setattr(hf, key, value)
    return hf, text


def _sglang_config_class(model_type: str) -> Any:
    """SGLang's config class for ``model_type`` (``sglang/srt/configs/``), imported without
    the package's ``__init__`` (which imports every config, some through torchvision, whose
    PyPI build needs CUDA): the package is registered as a bare namespace first."""
    import importlib
    import types

    import sglang

    name = "sglang.srt.configs"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(os.path.dirname(sglang.__file__), "srt", "configs")]
        sys.modules[name] = package
    module, cls = _SGLANG_CONFIGS[model_type]
    return getattr(importlib.import_module(f"{name}.{module}"), cls)


@functools.cache
def _sglang_architectures() -> dict[str, str]:
    """The architectures SGLang implements, each with its model file.

    ``models/registry.py`` (``import_model_classes``) imports every module of
    ``sglang.srt.models`` and collects the names in its ``EntryClass``; importing them all
    here reaches torchvision, so the names are read from each file's ``EntryClass``
    assignment (restated, without importing the files).
    """
    import ast

    import sglang

    folder = os.path.join(os.path.dirname(sglang.__file__), "srt", "models")
    found: dict[str, str] = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name)) as f:
            source = f.read()
        if "EntryClass" not in source:
            continue
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
            ):
                values = node.value.elts if isinstance(node.value, ast.List) else [node.value]
                for v in values:
                    if isinstance(v, ast.Name):
                        found.setdefault(v.id, f"models/{name}")
    return found


def _get_rope_config(config: Any) -> tuple[Any, Any]:
    """``get_rope_config`` (``sglang/srt/utils/hf_transformers/common.py``), restated."""
    rope_params = getattr(config, "rope_parameters", None)
    if rope_params is not None:
        return rope_params.get("rope_theta", getattr(config, "rope_theta", 10000)), rope_params
    return getattr(config, "rope_theta", 10000), getattr(config, "rope_scaling", None)


def _head_dim(config: Any) -> int:
    head_dim = getattr(config, "head_dim", None)
    return int(head_dim or config.hidden_size // config.num_attention_heads)


def _build(hf: Any, text: Any, layer_type: str | None) -> tuple[Any, float | None, str]:
    """The rotary module the model file builds, its attention's softmax scale, and a note."""
    import torch
    from sglang.srt.layers.rotary_embedding import get_rope

    model_type = str(getattr(hf, "model_type", "") or "")
    dtype = torch.float32
    if model_type in _QWEN2 or model_type in _QWEN3:
        # models/qwen2.py / models/qwen3.py: the model's __init__ reads the RoPE
        if model_type in _QWEN2:
            theta, scaling = _get_rope_config(text)
            where = "models/qwen2.py (Qwen2DecoderLayer, get_rope_config)"
        else:
            params = getattr(text, "rope_parameters", None)
            if params and "rope_theta" in params:
                theta, scaling = params["rope_theta"], params
            else:
                theta = getattr(text, "rope_theta", 1000000)
                scaling = getattr(text, "rope_scaling", None)
            where = "models/qwen3.py (Qwen3DecoderLayer)"
        head_dim = _head_dim(text)
        max_pos = getattr(text, "max_position_embeddings", 32768)
        rope = get_rope(head_dim, rotary_dim=head_dim, max_position=max_pos, base=theta,
                        rope_scaling=copy.deepcopy(scaling), dtype=dtype)  # fmt: skip
        return rope, head_dim**-0.5, f"get_rope arguments restated from {where}"
    if model_type in _GEMMA3 and not _amx():
        return _gemma3_model_rope(text, layer_type)
    if model_type in _GEMMA3:
        params = text.rope_parameters
        nested = isinstance(params, dict) and "full_attention" in params
        if layer_type == "sliding_attention":
            if nested:
                theta = params["sliding_attention"].get("rope_theta", 10000.0)
            else:
                theta = getattr(text, "rope_local_base_freq", 10000.0)
        elif nested:
            theta = params["full_attention"].get("rope_theta", 1000000.0)
        else:
            theta = params.get("rope_theta", 10000.0) if params else 10000.0
        head_dim = int(text.head_dim)
        rotary_dim = int(getattr(text, "partial_rotary_factor", 1) * head_dim)
        rope = get_rope(head_dim, rotary_dim=rotary_dim,
                        max_position=text.max_position_embeddings, base=theta,
                        rope_scaling={"rope_type": "default"},
                        is_neox_style=getattr(text, "rope_is_neox_style", True),
                        dtype=dtype)  # fmt: skip
        scalar = getattr(text, "query_pre_attn_scalar", None)
        softmax = float(scalar) ** -0.5 if scalar else None
        return rope, softmax, ("get_rope arguments restated from models/gemma3_causal.py "
                               f"(Gemma3Attention, layer type {layer_type})")  # fmt: skip
    if model_type in _DEEPSEEK:
        from sglang.srt.layers.rotary_embedding import get_rope_wrapper

        params = getattr(text, "rope_parameters", None)
        if params is not None:
            theta = params["rope_theta"]
            kind = params.get("rope_type", params.get("type", "default"))
            scaling = copy.deepcopy(params) if kind != "default" else None
        else:
            theta, scaling = text.rope_theta, copy.deepcopy(text.rope_scaling)
        qk_head_dim = text.qk_nope_head_dim + text.qk_rope_head_dim
        softmax = qk_head_dim**-0.5
        if scaling:
            scaling["rope_type"] = "deepseek_yarn"
        rope = get_rope_wrapper(text.qk_rope_head_dim, rotary_dim=text.qk_rope_head_dim,
                                max_position=text.max_position_embeddings, base=theta,
                                rope_scaling=scaling,
                                is_neox_style=not getattr(text, "rope_interleave", True),
                                dtype=dtype, device="cpu")  # fmt: skip
        if scaling and scaling.get("apply_yarn_scaling", True):
            softmax = _mla_mscale_scaling(scaling, softmax)
        return rope, softmax, ("get_rope_wrapper arguments restated from models/deepseek_v2.py "
                               "(DeepseekV2AttentionMLA); softmax scale as "
                               "configs/model_config.py compute_mla_mscale_scaling")  # fmt: skip
    if model_type == "gpt_oss":
        # models/gpt_oss.py GptOssDecoderLayer.__init__: rope_parameters["rope_theta"] and
        # the whole rope_parameters as the scaling (factory.py get_rope's YaRN takes its
        # truncate, default True), head_dim (else hidden / heads), NeoX pairs
        theta, scaling = text.rope_parameters["rope_theta"], copy.deepcopy(text.rope_parameters)
        head_dim = int(getattr(text, "head_dim", text.hidden_size // text.num_attention_heads))
        rope = get_rope(head_dim, rotary_dim=head_dim,
                        max_position=getattr(text, "max_position_embeddings", 8192),
                        base=theta, rope_scaling=scaling, dtype=dtype)  # fmt: skip
        truncate = scaling.get("truncate", True) if scaling else None
        return rope, head_dim**-0.5, ("get_rope arguments restated from models/gpt_oss.py "
                                      f"(GptOssAttention; YaRN truncate {truncate})")  # fmt: skip
    if model_type in _COHERE:
        # models/commandr.py CohereAttention.__init__: hidden / heads (the config's head_dim
        # unread), model_max_length or max_position_embeddings, the whole rope_parameters
        # as the scaling, GPT-J (interleaved) pairs
        head_dim = text.hidden_size // text.num_attention_heads
        max_pos = getattr(text, "model_max_length", None) or getattr(
            text, "max_position_embeddings", 8192
        )
        rope = get_rope(head_dim, rotary_dim=head_dim, max_position=max_pos,
                        base=text.rope_parameters["rope_theta"],
                        rope_scaling=copy.deepcopy(text.rope_parameters), is_neox_style=False,
                        dtype=dtype)  # fmt: skip
        return rope, head_dim**-0.5, ("get_rope arguments restated from models/commandr.py "
                                      "(CohereAttention; Cohere2ForCausalLM's too)")  # fmt: skip
    if model_type in _QWEN3_5:
        # models/qwen3_5.py Qwen3_5AttentionDecoderLayer.__init__: get_rope_config, a
        # scaling without a type dropped, partial_rotary_factor from the config's top level
        # (SGLang's Qwen3_5TextConfig, a Qwen3NextConfig: default 0.25)
        theta, scaling = _get_rope_config(text)
        if scaling and not ("rope_type" in scaling or "type" in scaling):
            scaling = None
        head_dim = int(getattr(text, "head_dim", None)
                       or text.hidden_size // text.num_attention_heads)  # fmt: skip
        rope = get_rope(head_size=head_dim, rotary_dim=head_dim,
                        max_position=getattr(text, "max_position_embeddings", 8192),
                        rope_scaling=copy.deepcopy(scaling), base=theta,
                        partial_rotary_factor=getattr(text, "partial_rotary_factor", 1.0),
                        is_neox_style=True, dtype=dtype)  # fmt: skip
        return rope, head_dim**-0.5, ("get_rope arguments restated from models/qwen3_5.py "
                                      "(Qwen3_5AttentionDecoderLayer)")  # fmt: skip
    if model_type == "stablelm":
        head_dim = text.hidden_size // text.num_attention_heads
        pct = getattr(text, "rope_pct", getattr(text, "partial_rotary_factor", 1))
        rope = get_rope(head_dim, rotary_dim=int(head_dim * pct),
                        max_position=text.max_position_embeddings,
                        base=text.rope_parameters["rope_theta"], dtype=dtype)  # fmt: skip
        return rope, head_dim**-0.5, "get_rope arguments restated from models/stablelm.py"
    # models/llama.py: LlamaDecoderLayer and LlamaAttention (Phi3ForCausalLM is llama's)
    params = getattr(text, "rope_parameters", None)
    if params is not None:
        theta, scaling = params.get("rope_theta", 10000), copy.deepcopy(params)
    else:
        theta = getattr(text, "rope_theta", 10000)
        scaling = copy.deepcopy(getattr(text, "rope_scaling", None))
    if scaling is not None and getattr(text, "original_max_position_embeddings", None):
        scaling["original_max_position_embeddings"] = text.original_max_position_embeddings
    head_dim = _head_dim(text)
    rotary_dim = int(getattr(text, "partial_rotary_factor", 1) * head_dim)
    rope = get_rope(head_dim, rotary_dim=rotary_dim,
                    max_position=getattr(text, "max_position_embeddings", 8192), base=theta,
                    rope_scaling=scaling,
                    is_neox_style=getattr(text, "rope_is_neox_style", True),
                    dtype=dtype)  # fmt: skip
    note = "get_rope arguments restated from models/llama.py (LlamaAttention)"
    return rope, head_dim**-0.5, note


def _rotates(hf: Any, text: Any) -> Any:
    """``rotates(layer)``: whether the model file's attention applies its RoPE in ``layer``."""
    model_type = str(getattr(hf, "model_type", "") or "")
    if model_type in _COHERE:
        # models/commandr.py CohereAttention: sliding_window_size is the config's
        # sliding_window on a Cohere2Config's sliding_attention layers, else -1, and
        # forward rotates when the config is a CohereConfig (v1) or sliding_window_size > 0
        from transformers import Cohere2Config, CohereConfig

        config: Any = text

        def cohere(layer: int) -> bool:
            size: Any = -1
            v2 = isinstance(config, Cohere2Config)
            if v2 and config.layer_types[layer] == "sliding_attention":
                size = config.sliding_window
            return isinstance(config, CohereConfig) or size > 0

        return cohere
    if model_type in _QWEN3_5:
        # models/qwen3_5.py Qwen3_5ForCausalLM.__init__: layer idx is
        # ALL_DECODER_LAYER_TYPES[config.layers_block_type[idx]]; only the "attention" one
        # (Qwen3_5AttentionDecoderLayer) has a rotary_emb. layers_block_type
        # (configs/qwen3_next.py) follows full_attention_interval, not layer_types
        def qwen3_5(layer: int) -> bool:
            try:
                kinds = text.layers_block_type
            except AttributeError as exc:  # SGLang's own property fails: its refusal
                raise AttributeError(
                    f"{exc} (configs/qwen3_next.py: Qwen3NextConfig.layers_block_type, which "
                    "models/qwen3_5.py Qwen3_5ForCausalLM.__init__ reads for each layer; "
                    "it follows full_attention_interval, not layer_types)"
                ) from exc
            return kinds[layer] == "attention"

        return qwen3_5
    return lambda layer: True


def _amx() -> bool:
    """Whether SGLang runs its CPU AMX kernels here (``cpu_has_amx_support()``)."""
    base = sys.modules.get("sglang.srt.layers.rotary_embedding.base")
    return bool(getattr(base, "_is_cpu_amx_available", False))


class _Gemma3Rope:
    """Gemma 3's model-level rotary module, and how its attention applies it.

    Without AMX kernels (and on GPUs) ``Gemma3Attention.forward`` runs
    ``forward_native``: the tables are ``Gemma3TextModel``'s ``rotary_emb`` (global) or
    ``rotary_emb_local`` (sliding), a ``Gemma3RotaryEmbedding``, applied by
    ``apply_rotary_pos_emb``; the attention's own ``get_rope`` module is used only by
    ``forward_cpu`` (AMX).
    """

    def __init__(self, module: Any, head_dim: int) -> None:
        self.module = module
        self.head_size = head_dim
        self.rotary_dim = head_dim
        self.is_neox_style = True
        self.inv_freq = module.inv_freq

    def named_buffers(self) -> Any:
        """The module's buffers (its ``inv_freq``; the tables are computed per call)."""
        return [("cos_sin_cache", self.module.inv_freq)]

    def __call__(self, positions: Any, q: Any, k: Any) -> tuple[Any, Any]:
        import torch
        from sglang.srt.layers.rotary_embedding.utils import (
            apply_rotary_pos_emb_native_eager,
        )

        cos, sin = self.module(q, positions.reshape(1, -1))
        cos = cos.reshape(-1, cos.shape[-1])
        sin = sin.reshape(-1, sin.shape[-1])
        q3 = q.reshape(q.shape[0], -1, self.head_size)
        k3 = k.reshape(k.shape[0], -1, self.head_size)
        with torch.no_grad():
            return apply_rotary_pos_emb_native_eager(q3, k3, cos, sin)


def _gemma3_model_rope(text: Any, layer_type: str | None) -> tuple[Any, float | None, str]:
    """``Gemma3RotaryEmbedding`` as ``Gemma3TextModel.__init__`` builds it for ``layer_type``.

    ``models/gemma3_causal.py`` cannot be imported here (its imports reach
    torchvision through ``sglang.srt.configs``), so its ``Gemma3RotaryEmbedding`` class
    is compiled from the installed file alone (SGLang's own code, its own file name in
    tracebacks), with the names it uses: torch, ``nn``, transformers'
    ``ROPE_INIT_FUNCTIONS``.
    """
    import ast

    import sglang
    import torch
    import transformers
    from torch import nn

    path = os.path.join(os.path.dirname(sglang.__file__), "srt", "models", "gemma3_causal.py")
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    node = next(n for n in tree.body
                if isinstance(n, ast.ClassDef) and n.name == "Gemma3RotaryEmbedding")  # fmt: skip
    namespace: dict[str, Any] = {"torch": torch, "nn": nn, "copy": copy,
                                 "ROPE_INIT_FUNCTIONS": transformers.ROPE_INIT_FUNCTIONS,
                                 "Gemma3TextConfig": transformers.Gemma3TextConfig,
                                 "__name__": "sglang.srt.models.gemma3_causal"}  # fmt: skip
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    params = text.rope_parameters
    # Gemma3TextModel.__init__: the global and local thetas, each in a flat copy
    if isinstance(params, dict) and "full_attention" in params:
        global_theta = params["full_attention"].get("rope_theta", 1000000.0)
        local_theta = params["sliding_attention"].get("rope_theta", 10000.0)
    else:
        global_theta = params.get("rope_theta", 10000.0) if params else 10000.0
        local_theta = getattr(text, "rope_local_base_freq", 10000.0)
    one = copy.deepcopy(text)
    if layer_type == "sliding_attention":
        one.rope_parameters = {"rope_type": "default", "rope_theta": local_theta}
    else:
        one.rope_parameters = {**params["full_attention"], "rope_theta": global_theta}
    module = namespace["Gemma3RotaryEmbedding"](config=one)
    scalar = getattr(text, "query_pre_attn_scalar", None)
    softmax = float(scalar) ** -0.5 if scalar else None
    name = "rotary_emb_local" if layer_type == "sliding_attention" else "rotary_emb"
    return (
        _Gemma3Rope(module, int(text.head_dim)),
        softmax,
        (
            f"models/gemma3_causal.py Gemma3TextModel.{name} (Gemma3RotaryEmbedding, the "
            "class compiled from the installed file; the thetas as Gemma3TextModel.__init__ "
            "reads them, restated) applied as Gemma3Attention.forward_native applies it "
            "(apply_rotary_pos_emb_native_eager): no AMX kernels here"
        ),
    )


class _TransformersRope(TransformersRope):
    """transformers' own RoPE, as SGLang's Transformers backend runs it.

    ``model_loader/utils.py`` ``get_model_architecture``: an architecture no SGLang model
    file implements (and whose transformers class is backend compatible) is run by
    ``models/transformers.py`` (``TransformersForCausalLM``), which builds the model with
    ``AutoModel.from_config`` and replaces its linear layers and attention kernel, not its
    rotary embedding: the model's ``rotary_emb`` computes cos/sin from SGLang's positions
    (``_run_hf_backbone``: ``position_ids``) and each attention layer of the transformers
    modeling file applies them (``apply_rotary_pos_emb``) or not (SmolLM3's and Llama 4's
    ``use_rope``). The model is built on the meta device to find those classes and
    attributes; its rotary class is built again on the CPU and applied to unit vectors.
    """

    def __init__(self, config: Any, text: Any, dtype: Any) -> None:
        super().__init__(config, text, dtype, _head_dim(text))

    def named_buffers(self) -> Any:
        """The tables' dtype, as a buffer (the tables are computed per call)."""
        import torch

        return [("cos_sin_cache", torch.empty(0, dtype=self.dtype))]

    def __call__(self, positions: Any, q: Any, k: Any) -> tuple[Any, Any]:
        import torch

        n = q.shape[0]
        q4 = q.reshape(1, n, -1, self.head_size).transpose(1, 2).to(self.dtype)
        k4 = k.reshape(1, n, -1, self.head_size).transpose(1, 2).to(self.dtype)
        with torch.no_grad():
            cos, sin = self.module(q4, positions.reshape(1, -1))
            q_out, k_out = self.apply(q4, k4, cos, sin)
        return q_out.transpose(1, 2).reshape(n, -1), k_out.transpose(1, 2).reshape(n, -1)


def _backend(hf: Any) -> tuple[str | None, str | None]:
    """``(architecture, SGLang model file)``, or ``(architecture, None)`` where SGLang runs
    it with its Transformers backend (``model_loader/utils.py``:
    ``get_model_architecture``, ``resolve_transformers_arch``, restated)."""
    import transformers

    archs = list(getattr(hf, "architectures", None) or [])
    native = _sglang_architectures()
    for arch in archs:
        if arch in native:
            return arch, native[arch]
    if not archs:
        return None, FALLBACK
    cls = getattr(transformers, archs[0], None)
    if cls is None:
        raise ValueError(f"Cannot find model module. '{archs[0]}' is not a registered model "
                         "in the Transformers library (model_loader/utils.py: "
                         "resolve_transformers_arch)")  # fmt: skip
    if hasattr(cls, "is_backend_compatible") and not cls.is_backend_compatible():
        raise ValueError(f"{archs[0]} has no SGlang implementation and the Transformers "
                         "implementation is not compatible with SGLang (model_loader/utils.py: "
                         "resolve_transformers_arch)")  # fmt: skip
    return archs[0], None


def _rope_types(text: Any) -> set[str]:
    """The ``rope_type`` of every RoPE the text config holds (flat or per layer type)."""
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        return set()
    if params and all(isinstance(v, dict) for v in params.values()):
        return {str(v.get("rope_type", v.get("type", "default"))) for v in params.values()}
    return {str(params.get("rope_type", params.get("type", "default")))}


def _switching(rope: Any, text: Any) -> str | None:
    """When the module switches its tables (LongRoPE, dynamic NTK), read from SGLang's code;
    ``None`` for any other RoPE."""
    kinds = _rope_types(text)
    if not kinds & {"longrope", "dynamic"}:
        return None
    if isinstance(rope, _TransformersRope):
        rule = []
        if "dynamic" in kinds:
            rule.append("dynamic NTK: per forward pass, from max(position_ids) + 1 against "
                        "max_position_embeddings (transformers' modeling_rope_utils.py: "
                        "dynamic_rope_update)")  # fmt: skip
        if "longrope" in kinds:
            rule.append("LongRoPE: per forward pass, long factors when max(position_ids) + 1 > "
                        "original_max_position_embeddings (transformers' "
                        "modeling_rope_utils.py: longrope_frequency_update)")  # fmt: skip
        return "; ".join(rule) + " (SGLang's Transformers backend runs transformers' RoPE)"
    name = _name(rope)
    if name == "Phi3LongRoPEScaledRotaryEmbedding":
        return (
            "per forward pass, from the positions: long factors for every token of the "
            "batch when any position > original_max_position_embeddings "
            f"({rope.original_max_position_embeddings}), i.e. from a prefill of "
            f"{rope.original_max_position_embeddings + 2} tokens, else short factors "
            "(layers/rotary_embedding/rope_variant.py: Phi3LongRoPEScaledRotaryEmbedding.forward)"
        )
    if name == "DynamicNTKScalingRotaryEmbedding":
        return (
            "never: one table of max_position_embeddings * factor rows computed at "
            "initialisation, its base raised once for that length (base * (factor * max_len / "
            "max_position_embeddings - (factor - 1)) ** (d / (d - 2))), whatever the "
            "sequence's length (layers/rotary_embedding/rope_variant.py: "
            "DynamicNTKScalingRotaryEmbedding._compute_cos_sin_cache)"
        )
    return f"{name}: one table computed at initialisation (no switching in its code)"


def _mla_mscale_scaling(scaling: dict[str, Any], base: float) -> float:
    """``compute_mla_mscale_scaling`` (``configs/model_config.py``), restated around
    SGLang's own ``yarn_get_mscale`` (``layers/rotary_embedding/yarn.py``; the one in
    ``models/deepseek_common/utils.py`` is the same formula but imports torchvision)."""
    from sglang.srt.layers.rotary_embedding.yarn import yarn_get_mscale

    kind = scaling.get("rope_type") or scaling.get("type")
    if kind == "default" or not scaling.get("apply_scale", True):
        return base
    mscale = yarn_get_mscale(
        scaling.get("factor", 1.0), float(scaling.get("mscale_all_dim", False))
    )
    return base * mscale * mscale


def _name(rope: Any, qualified: bool = False) -> str:
    """The SGLang class of ``rope`` (Gemma 3's model-level module for its wrapper)."""
    if isinstance(rope, _TransformersRope):
        cls = rope.cls
    else:
        cls = type(rope.module) if isinstance(rope, _Gemma3Rope) else type(rope)
    return f"{cls.__module__}.{cls.__name__}" if qualified else cls.__name__


def _method(rope: Any) -> str:
    """The name of the forward ``BaseFusedOp`` dispatched ``rope``'s call to."""
    if isinstance(rope, _Gemma3Rope):
        return "Gemma3Attention.forward_native"
    if isinstance(rope, _TransformersRope):
        return "the transformers modeling file's apply_rotary_pos_emb"
    chosen = getattr(rope, "_forward_method", None)
    if chosen is None:
        return "forward (a plain torch module)"
    name = getattr(chosen, "__name__", None) or type(chosen).__name__
    if name == "forward_cpu":
        base = sys.modules.get("sglang.srt.layers.rotary_embedding.base")
        if base is not None and not getattr(base, "_is_cpu_amx_available", False):
            name = "forward_cpu -> forward_native (no AMX kernels)"
    return name


def _neox(rope: Any) -> bool:
    """Whether ``rope`` rotates half-layout pairs (``Phi3LongRoPEScaledRotaryEmbedding``
    keeps no ``is_neox_style``: its ``__init__`` refuses any other layout)."""
    return bool(getattr(rope, "is_neox_style", True))


def _cache_dtype(rope: Any) -> str:
    """The dtype of ``rope``'s cos/sin cache (``cos_sin_cache``, LongRoPE's ``*_cos_sin_cache``)."""
    for name, buffer in rope.named_buffers():
        if name.endswith("cos_sin_cache"):
            return str(buffer.dtype).replace("torch.", "")
    raise ValueError(f"{type(rope).__name__} has no cos/sin cache")


def _tables(rope: Any, w: dict[str, Any]) -> tuple[list[Any], list[Any], str]:
    import torch

    dims = int(rope.rotary_dim)
    head = int(rope.head_size)
    pairs = dims // 2
    neox = _neox(rope)
    unit = torch.zeros(head, dtype=torch.float32)
    if neox:
        unit[:pairs] = 1.0
    else:
        unit[0:dims:2] = 1.0
    seq_len = int(w["seq_len"])
    asked = [int(p) for p in w["positions"]]
    mrope = "MRotaryEmbedding" in [c.__name__ for c in type(rope).__mro__]
    ids = w.get("position_ids") if mrope else None
    if ids is not None or seq_len * head > MAX_PREFILL_ELEMENTS:
        rows = torch.tensor(asked, dtype=torch.long)
        if ids is not None:
            positions = torch.tensor(ids, dtype=torch.long)
            mode = "the asked rows at their multi-axis positions (3 x tokens)"
        else:
            positions = rows
            mode = "the asked positions only (the prefill would be too large)"
        pick = torch.arange(len(asked))
    else:
        positions = torch.arange(seq_len, dtype=torch.long)
        pick = torch.tensor(asked, dtype=torch.long)
        mode = f"one prefill of {seq_len} tokens"
    if mrope and positions.ndim == 1:
        positions = positions.unsqueeze(0).expand(3, -1).contiguous()
        mode += ", all three M-RoPE axes at the token index"
    n = positions.shape[-1]
    # DeepseekV2AttentionMLA passes q_pe / k_pe as (tokens, heads, rope dims): its
    # DeepseekScalingRotaryEmbedding broadcasts its cache against that shape; the
    # other models pass (tokens, heads * head_size)
    mla = type(rope).__name__ == "DeepseekScalingRotaryEmbedding"
    shape = (n, 1, head) if mla else (n, head)
    q = unit.expand(*shape).contiguous()
    k = unit.expand(*shape).contiguous()
    with torch.no_grad():
        out, _ = rope(positions, q, k)
    out = out.reshape(n, -1, head)[:, 0, :].to(torch.float64)[pick]
    if neox:
        c, s = out[:, :pairs], out[:, pairs : 2 * pairs]
    else:
        c, s = out[:, 0:dims:2], out[:, 1:dims:2]
    if w.get("position_ids") is not None and not mrope:
        mode += "; the module is not an M-RoPE: rows at the token index"
    mode += f" ({_name(rope)}: {_method(rope)})"
    return c.tolist(), s.tolist(), mode


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables SGLang's model applies."""
    import torch

    config = copy.deepcopy(dict(request["config"]))
    hf, text = _hf_config(config)
    notes = ["config read by transformers.AutoConfig as SGLang's hf parser reads it "
             "(HfModelConfigParser.parse restated)"]  # fmt: skip
    if hf.model_type in _SGLANG_CONFIGS:
        module, cls = _SGLANG_CONFIGS[hf.model_type]
        notes.append(f"model_type {hf.model_type!r} reloaded with SGLang's own config class "
                     f"(configs/{module}.py {cls}, as _CONFIG_REGISTRY maps it)")  # fmt: skip
    arch, file = _backend(hf)
    model_type = str(getattr(hf, "model_type", "") or "")
    fallback = None
    if file is None:
        notes.append(f"{arch} has no SGLang model file (models/*.py EntryClass, as "
                     "models/registry.py import_model_classes collects them): SGLang runs it "
                     "with its Transformers backend (models/transformers.py "
                     "TransformersForCausalLM); transformers' own rotary module and attention "
                     "layers read, transformers "
                     f"{importlib.metadata.version('transformers')}")  # fmt: skip
    elif model_type not in _RESTATED:
        fallback = FALLBACK
        where = f"SGLang runs {arch} with {file}" if arch else "no architecture in the config"
        notes.append(f"SGLang's model for {model_type!r} not restated ({where}): read as "
                     f"{FALLBACK} reads it")  # fmt: skip
    rotates = _rotates(hf, text)
    built: dict[Any, tuple[Any, float | None, str]] = {}
    windows = []
    for w in request["windows"]:
        lt = w.get("layer_type")
        if lt not in built:
            if file is None:
                rope = _TransformersRope(hf, text, torch.float32)
                built[lt] = (rope, rope.head_size**-0.5, f"{_name(rope, True)}, "
                             "applied by its modeling file's apply_rotary_pos_emb")  # fmt: skip
                rotates = rope.rotates
            else:
                built[lt] = _build(hf, text, lt)
            if built[lt][2] not in notes:
                notes.append(built[lt][2])
        rope = built[lt][0]
        layer = int(w.get("layer") or 0)
        turns = bool(rotates(layer))
        if turns:
            c, s, mode = _tables(rope, w)
        else:
            pairs = int(rope.rotary_dim) // 2
            c = [[1.0] * pairs for _ in w["positions"]]
            s = [[0.0] * pairs for _ in w["positions"]]
            mode = f"layer {layer} not rotated (its attention's forward skips rotary_emb)"
            if isinstance(rope, _TransformersRope):
                mode = (f"layer {layer} not rotated (transformers' "
                        f"{rope.attention[layer]}.use_rope is false)")  # fmt: skip
        windows.append({"seq_len": int(w["seq_len"]), "positions": [int(p) for p in w["positions"]],
                        "layer_type": lt, "position_ids": w.get("position_ids"),
                        "layer": w.get("layer"), "rotates": turns,
                        "cos": c, "sin": s, "mode": mode})  # fmt: skip
    first = built[next(iter(built))]
    rope0 = first[0]
    rotated = [w for w in windows if w["rotates"]] or windows
    c0, s0 = rotated[0]["cos"][0][0], rotated[0]["sin"][0][0]
    result = {
        "version": f"sglang {importlib.metadata.version('sglang')}, "
        f"torch {torch.__version__}, transformers {importlib.metadata.version('transformers')}",
        # the rotary modules and get_rope run; what the model files pass to get_rope is
        # restated (they import torchvision, whose PyPI build needs CUDA)
        "source": "installed: get_rope and its rotary modules run; the config parsing and "
        "each model file's get_rope arguments restated from sglang "
        f"{importlib.metadata.version('sglang')}",
        "module": _name(rope0, qualified=True),
        "layout": "half" if _neox(rope0) else "interleaved",
        "rotary_dim": int(rope0.rotary_dim),
        "dtype": _cache_dtype(rope0),
        "attention_scaling": math.hypot(c0, s0),
        "softmax_scale": first[1],
        "switching": _switching(rope0, text),
        "windows": windows,
        "note": "; ".join(notes),
    }
    if fallback:
        result["fallback"] = fallback
    return result


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
