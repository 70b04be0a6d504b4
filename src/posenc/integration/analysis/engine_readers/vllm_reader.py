"""Read a config's RoPE the way vLLM's model file for it does, and print its cos/sin tables.

Runs under vLLM's own Python (``posenc engines build vllm``'s environment): standard
library, vLLM and the torch it runs on, never posenc or numpy. vLLM is made to pick its CPU platform
(``VLLM_TARGET_DEVICE=cpu``) before it is imported.

The config is read by vLLM's own loader: written to a temporary folder as
``config.json`` and loaded by ``vllm.config.ModelConfig(model=folder)``, which calls
``vllm.transformers_utils.config.get_config`` (the transformers config class for its
``model_type``, then vLLM's ``patch_rope_parameters``: legacy ``type`` keys,
``rope_theta`` / ``partial_rotary_factor`` folded into ``rope_parameters``,
transformers' ``standardize_rope_params``) and settles ``max_model_len`` (what LongRoPE
reads) and the dtype (``dtype="auto"``: ``vllm.config.model._get_and_verify_dtype``,
the config's ``torch_dtype``, a float32 model downcast to a 16-bit dtype the platform
supports). ``POSENC_VLLM_DTYPE`` (e.g. ``float32``) is passed instead of ``"auto"``, as
vLLM's ``--dtype``. Where ``ModelConfig`` refuses (a multimodal config without its
processor files), ``get_config`` alone is used with an empty ``VllmConfig``; where that
refuses too (a ``model_type`` transformers does not know), the dict is read as a
``PretrainedConfig`` patched by ``patch_rope_parameters``; the note says which, and the
dtype is then ``_resolve_auto_dtype``'s.

The rotary module is built with ``vllm.model_executor.layers.rotary_embedding.get_rope``
inside ``set_current_vllm_config`` (that ``VllmConfig``), with the arguments the model file for
the ``model_type`` passes it (restated here, as the model's attention ``__init__`` does
it; the note names the file):

- ``models/llama.py``: ``head_dim`` (else ``hidden_size // num_attention_heads``),
  ``max_position_embeddings``, the text config's ``rope_parameters``, neox style;
  Qwen2/Qwen2-VL/Qwen3-VL's text models pass the same, M-RoPE coming from
  ``mrope_section`` / ``mrope_interleaved`` in ``rope_parameters``. A ``model_type``
  without a case here is read the same way, and the answer's ``fallback``
  (``"models/llama.py"``) and note say so, naming the file vLLM's registry maps its
  architecture to;
- ``models/gemma3.py``: ``rope_parameters[layer_type]`` (the window's ``layer_type``,
  else the asked layer's ``layer_types`` entry, else the first), softmax scale
  ``query_pre_attn_scalar ** -0.5``;
- ``models/deepseek_v2.py`` (``deepseek_v2`` / ``deepseek_v3``): ``qk_rope_head_dim``,
  GPT-J (interleaved) style, a non-default ``rope_type`` renamed ``deepseek_yarn`` (or
  ``deepseek_llama_scaling`` when ``attention_factor == 1``), and for ``deepseek_yarn``
  the softmax scale ``qk_head_dim ** -0.5 * yarn_get_mscale(factor, mscale_all_dim) ** 2``;
- ``models/gpt_oss.py`` (``OAIAttention``): a YaRN made of six keys of
  ``rope_parameters``, ``truncate`` defaulting to true, tables in float32;
- ``models/commandr.py`` (``CohereAttention``; ``Cohere2ForCausalLM`` is its
  ``CohereForCausalLM``): GPT-J (interleaved) pairs, ``model_max_length`` or
  ``max_position_embeddings``; its ``forward`` rotates a Cohere 2 layer only where
  ``layer_types`` says ``sliding_attention``;
- ``models/qwen3_5.py`` (``Qwen3_5DecoderLayer``, whose full-attention layers are
  ``models/qwen3_next.py``'s ``Qwen3NextAttention``): the text config's
  ``rope_parameters`` (``partial_rotary_factor``, M-RoPE), no RoPE in the
  ``linear_attention`` (Gated DeltaNet) layers.

An architecture vLLM's registry (``models/registry.py``) gives to its Transformers
modeling backend (``models/transformers/``, e.g. ``SmolLM3ForCausalLM``) runs
transformers' own rotary module and attention layers: the reader builds the model on
the meta device to find them, builds its ``rotary_emb`` class on the CPU and applies
it with the modeling file's ``apply_rotary_pos_emb`` (the layout read from one
rotation), each layer's ``use_rope`` saying whether it rotates (SmolLM3's
``no_rope_layers``); a dynamic or LongRoPE table is read from a prefill of ``seq_len``
tokens, as transformers' ``dynamic_rope_update`` follows it.

Each window's answer says whether the asked ``layer`` rotates (``rotates``; cos 1 and
sin 0 where it does not), and the answer's ``switching`` says when a LongRoPE or
dynamic NTK module changes its tables (null for any other RoPE).

The module's dtype is the model dtype (vLLM builds its layers under that default dtype);
its ``cos_sin_cache`` is computed in float32 and cast to it. The tables come from the
module itself: ``forward_native`` (the PyTorch path, what runs on CPU) applied to unit
query/key vectors in the model dtype (1 in the first channel of every pair, 0 in the
second) returns ``(m cos, m sin)`` in each rotated pair (LongRoPE, which has only
``forward``, itself PyTorch, goes through that). A window's ``position_ids``
(M-RoPE) are passed as vLLM's ``[3, num_tokens]`` positions; otherwise the positions are
token indices. vLLM's tables are fixed at construction: ``seq_len`` changes nothing (its
dynamic NTK is one table of ``max_position_embeddings`` rows; LongRoPE picks short or
long factors once, from ``max_model_len``).

The protocol (request, batch, answer) is :mod:`~posenc.analysis.engine_readers.protocol`'s.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import tempfile
from typing import Any

try:  # run as a script by the engine's Python: its sibling
    from hf_backend import TransformersRope
except ModuleNotFoundError:  # imported as part of posenc (its import checks)
    from .hf_backend import TransformersRope

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the config is a local file

#: The environment variable that sets the dtype vLLM is given (its ``--dtype``; "auto").
DTYPE_VARIABLE = "POSENC_VLLM_DTYPE"

#: model_type -> the vLLM model file whose attention builds the rotary module.
MODEL_FILES = {
    "llama": "models/llama.py",
    "qwen2": "models/qwen2.py",
    "qwen3": "models/qwen3.py",
    "qwen2_vl": "models/qwen2_vl.py (text model: models/qwen2.py)",
    "qwen2_5_vl": "models/qwen2_5_vl.py (text model: models/qwen2.py)",
    "qwen3_vl": "models/qwen3_vl.py (text model: models/qwen3.py)",
    "gemma3": "models/gemma3.py",
    "gemma3_text": "models/gemma3.py",
    "deepseek_v2": "models/deepseek_v2.py",
    "deepseek_v3": "models/deepseek_v2.py",
    "phi3": "models/phi3.py (models/llama.py's attention)",
    "stablelm": "models/stablelm.py",
    "mistral": "models/llama.py",
    "gpt_oss": "models/gpt_oss.py (OAIAttention)",
    "cohere": "models/commandr.py (CohereAttention)",
    "cohere2": "models/commandr.py (CohereAttention: Cohere2ForCausalLM is CohereForCausalLM)",
    "qwen3_5": "models/qwen3_5.py (Qwen3_5DecoderLayer: models/qwen3_next.py Qwen3NextAttention)",
    "qwen3_5_text": "models/qwen3_5.py (Qwen3_5DecoderLayer: models/qwen3_next.py "
    "Qwen3NextAttention)",
}

#: The model file the answer's ``fallback`` names when the reader reads a model as another's.
FALLBACK = "models/llama.py"

_DTYPES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def _config(raw: dict[str, Any]) -> tuple[Any, Any, Any, str]:
    """vLLM's reading of the config: ``(hf_config, vllm_config, dtype, note)``.

    ``ModelConfig(model=folder)`` first (vLLM's ``get_config`` and
    ``patch_rope_parameters``, its ``max_model_len`` and ``dtype``); where vLLM will not
    make a model config of it, ``get_config`` alone with an empty ``VllmConfig``; where
    that refuses too, a ``PretrainedConfig`` patched by ``patch_rope_parameters``. The
    note says which, and the dtype then is what ``dtype="auto"`` resolves to.
    """
    import torch
    from vllm.config import ModelConfig, VllmConfig
    from vllm.transformers_utils.config import get_config, patch_rope_parameters

    dtype_arg = os.environ.get(DTYPE_VARIABLE, "auto")

    def fallback_dtype(config: Any) -> Any:
        if dtype_arg != "auto":
            return getattr(torch, dtype_arg)
        from vllm.config.model import _resolve_auto_dtype

        declared = getattr(config, "dtype", None) or torch.float32
        return _resolve_auto_dtype(config.model_type, declared, is_pooling_model=False)

    def why(exc: BaseException) -> str:
        lines = str(exc).strip().splitlines() or [""]
        # pydantic's ValidationError: its first line counts the errors, the next says which
        detail = next((x.strip() for x in lines if x.strip().startswith("Value error")), "")
        return f"{type(exc).__name__}: {(detail or lines[0])[:200]}"

    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(raw, f)
        try:
            model = ModelConfig(model=folder, skip_tokenizer_init=True, dtype=dtype_arg)
            return model.hf_config, VllmConfig(model_config=model), model.dtype, ""
        except Exception as exc:
            first = why(exc)
        try:
            config = get_config(folder, trust_remote_code=False)
            note = (f"ModelConfig refused it ({first}): read by get_config, "
                    "no model config (max_model_len unknown)")  # fmt: skip
        except Exception as exc:
            from transformers import PretrainedConfig

            config = PretrainedConfig.from_dict(raw)
            patch_rope_parameters(config)
            note = (f"ModelConfig refused it ({first}) and get_config too ({why(exc)}): "
                    "read as a PretrainedConfig patched by patch_rope_parameters")  # fmt: skip
    dtype = fallback_dtype(config)
    return config, VllmConfig(), dtype, f"{note}; dtype {dtype} (_resolve_auto_dtype)"


def _layer_type(text: Any, window: dict[str, Any]) -> str | None:
    if window.get("layer_type"):
        return str(window["layer_type"])
    types_ = getattr(text, "layer_types", None)
    if types_:
        return str(types_[int(window.get("layer") or 0)])
    return None


def _build(
    text: Any, model_type: str, layer_type: str | None, dtype: Any, vllm_config: Any
) -> dict[str, Any]:
    """``get_rope`` called with what the model file passes it; its softmax scale, and
    ``rotates(layer)``: whether the model file's attention applies it in that layer."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.transformers_utils.config import is_rope_parameters_nested

    params = getattr(text, "rope_parameters", None)
    params = dict(params) if isinstance(params, dict) else None
    notes = []
    if params and is_rope_parameters_nested(params):
        if layer_type is None or layer_type not in params:
            layer_type = sorted(params)[0] if layer_type is None else layer_type
        params = dict(params[layer_type])
        notes.append(f"rope_parameters[{layer_type!r}]")
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    softmax_scale = float(head_dim) ** -0.5
    neox = True
    max_position = text.max_position_embeddings
    extra: dict[str, Any] = {}

    def rotates(layer: int) -> bool:
        return True

    if model_type in ("gemma3", "gemma3_text"):
        softmax_scale = float(text.query_pre_attn_scalar) ** -0.5  # Gemma3Attention.scaling
    if model_type in ("deepseek_v2", "deepseek_v3"):
        from vllm.model_executor.layers.rotary_embedding.common import yarn_get_mscale

        head_dim = text.qk_rope_head_dim
        neox = False
        softmax_scale = float(text.qk_nope_head_dim + text.qk_rope_head_dim) ** -0.5
        if params and params["rope_type"] != "default":
            params["rope_type"] = (
                "deepseek_llama_scaling"
                if params.get("attention_factor") == 1.0
                else "deepseek_yarn"
            )
            if params["rope_type"] == "deepseek_yarn":
                m = yarn_get_mscale(params["factor"], float(params.get("mscale_all_dim", False)))
                softmax_scale *= m * m
        notes.append(f"rope_type {params['rope_type'] if params else None!r} (DeepseekV2 MLA)")
    if model_type == "gpt_oss":
        # models/gpt_oss.py OAIAttention.__init__: a YaRN built from six keys of
        # rope_parameters (truncate defaulting to True; vllm #28244), in float32 whatever the
        # model dtype, NeoX pairs (rope_is_neox_style); every layer applies it (forward)
        rp = text.rope_parameters
        params = {"rope_theta": rp["rope_theta"], "rope_type": "yarn", "factor": rp["factor"],
                  "original_max_position_embeddings": rp["original_max_position_embeddings"],
                  "beta_fast": rp["beta_fast"], "beta_slow": rp["beta_slow"],
                  "truncate": rp.get("truncate", True)}  # fmt: skip
        head_dim = text.head_dim
        dtype = torch.float32
        notes.append(f"OAIAttention's YaRN: truncate {params['truncate']}, float32")
    if model_type in ("cohere", "cohere2"):
        # models/commandr.py CohereAttention.__init__: head_dim (else hidden / heads),
        # model_max_length or max_position_embeddings, GPT-J (interleaved) pairs;
        # CohereAttention.forward applies it when the config is a CohereConfig (v1) or the
        # layer's layer_types entry is "sliding_attention" (Cohere 2: none on full layers)
        from transformers import CohereConfig

        max_position = getattr(text, "model_max_length", None) or getattr(
            text, "max_position_embeddings", 8192
        )
        neox = False
        v1 = isinstance(text, CohereConfig)

        def rotates(layer: int) -> bool:
            return v1 or text.layer_types[layer] == "sliding_attention"

        notes.append("CohereAttention.forward rotates "
                     + ("every layer (CohereConfig)" if v1 else "the sliding_attention layers "
                        "only (layer_types)"))  # fmt: skip
    if model_type in ("qwen3_5", "qwen3_5_text"):
        # models/qwen3_5.py Qwen3_5DecoderLayer: a full_attention layer is a
        # models/qwen3_next.py Qwen3NextAttention (get_rope with the text config's
        # rope_parameters, mrope_positions_factor from models/qwen3_vl.py
        # mrope_positions_factor: 1 without video pruning); a linear_attention layer is a
        # Gated DeltaNet, without RoPE
        extra["mrope_positions_factor"] = 1

        def rotates(layer: int) -> bool:
            return text.layer_types[layer] == "full_attention"

        notes.append("Qwen3_5DecoderLayer: RoPE in the full_attention layers only")
    with set_current_vllm_config(vllm_config):
        rope = get_rope(
            head_dim,
            max_position=max_position,
            is_neox_style=neox,
            rope_parameters=params,
            dtype=dtype,
            **extra,
        )
    return {"rope": rope, "head": head_dim, "softmax_scale": softmax_scale, "notes": notes,
            "rotates": rotates}  # fmt: skip


def _cache(rope: Any) -> Any:
    """The module's cos/sin cache buffer (LongRoPE keeps short and long rows in one)."""
    for name in ("cos_sin_cache", "long_short_cos_sin_cache"):
        if hasattr(rope, name):
            return getattr(rope, name)
    raise ValueError(f"{type(rope).__name__} has no cos/sin cache")


def _tables(rope: Any, head: int, window: dict[str, Any]) -> tuple[Any, Any, str]:
    import torch

    rot = int(rope.rotary_dim)
    pairs = rot // 2
    neox = bool(getattr(rope, "is_neox_style", True))  # LongRoPE: neox only
    unit = torch.zeros(head, dtype=torch.float32)
    if neox:
        unit[:pairs] = 1.0
    else:
        unit[0:rot:2] = 1.0
    positions = [int(p) for p in window["positions"]]
    n = len(positions)
    mode = "token positions"
    if window.get("position_ids") is not None and getattr(rope, "mrope_section", None):
        pos = torch.tensor([[int(v) for v in axis] for axis in window["position_ids"]])
        mode = "multi-axis positions [3, num_tokens]"
    else:
        pos = torch.tensor(positions, dtype=torch.long)
        if window.get("position_ids") is not None:
            mode += "; position_ids ignored (the module is not M-RoPE)"
    # q and k as the attention passes them: [num_tokens, heads * head_size], except
    # DeepSeek's MLA, which passes [num_tokens, heads, head_size]
    if type(rope).__name__.startswith("Deepseek"):
        q = unit.to(_cache(rope).dtype).expand(n, 1, head).contiguous()
    else:
        q = unit.to(_cache(rope).dtype).expand(n, head).contiguous()
    k = q.clone()
    # forward_native: the PyTorch path (LongRoPE has only forward, itself PyTorch)
    forward = getattr(rope, "forward_native", None) or rope.forward
    out, _ = forward(pos, q, k)
    out = out.float().reshape(n, -1)[:, :head]
    if neox:
        c, s = out[:, :pairs], out[:, pairs:rot]
    else:
        c, s = out[:, 0:rot:2], out[:, 1:rot:2]
    return c.tolist(), s.tolist(), "forward_native on unit vectors at " + mode


class _TransformersRope(TransformersRope):
    """transformers' own RoPE, as vLLM's Transformers modeling backend runs it.

    ``models/transformers/base.py`` (``Base.__init__``, ``_create_model``) builds the model
    with ``AutoModel.from_config`` and replaces its linear layers, norms and attention
    kernel with vLLM's (``recursive_replace``, ``fusers/``), not its rotary embedding: the
    model's ``rotary_emb`` computes cos/sin from vLLM's positions (``Base.forward``:
    ``position_ids=positions``) and each attention layer of the transformers modeling file
    applies them (its ``apply_rotary_pos_emb``) or not (SmolLM3's and Llama 4's
    ``use_rope``). Here the model is built on the meta device to find those classes and
    attributes; its rotary class is built again on the CPU and applied to unit vectors.
    """

    def __init__(self, config: Any, text: Any, dtype: Any, vllm_config: Any) -> None:
        import torch

        head = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        super().__init__(config, text, dtype, head)
        # Base.__init__: disable_noop_dynamic_rope relabels a dynamic rope_type "default"
        # where max_model_len <= max_position_embeddings (it could never rescale there)
        self.noop: bool | None = None
        if vllm_config.model_config is not None:
            from vllm.model_executor.models.transformers.utils import (
                disable_noop_dynamic_rope,
                dynamic_rope_update_is_noop,
            )

            disable_noop_dynamic_rope(self.module, vllm_config)
            self.noop = dynamic_rope_update_is_noop(vllm_config)
            self.max_model_len = vllm_config.model_config.max_model_len
        # the tables of a RoPE that follows the sequence's length are read from a prefill
        # of seq_len tokens (positions 0 .. seq_len - 1), as the answer sets it per window
        self.seq_len: int | None = None
        self.cos_sin_cache = torch.empty(0, dtype=dtype)  # the dtype the tables come in
        self.attention_scaling = float(getattr(self.module, "attention_scaling", 1.0))

    def forward_native(self, positions: Any, q: Any, k: Any) -> tuple[Any, Any]:
        """q and k ``[tokens, head]`` rotated as the transformers attention rotates them."""
        import torch

        n = q.shape[0]
        q4 = q.reshape(1, n, -1, self.head_size).transpose(1, 2).to(self.dtype)
        k4 = k.reshape(1, n, -1, self.head_size).transpose(1, 2).to(self.dtype)
        with torch.no_grad():
            if self.seq_len:  # one prefill: the module sees every position, rows picked
                cos, sin = self.module(q4, torch.arange(self.seq_len).reshape(1, -1))
                cos, sin = cos[:, positions.reshape(-1)], sin[:, positions.reshape(-1)]
            else:
                cos, sin = self.module(q4, positions.reshape(1, -1))
            q_out, k_out = self.apply(q4, k4, cos, sin)
        return q_out.transpose(1, 2).reshape(n, -1), k_out.transpose(1, 2).reshape(n, -1)


def _rope_types(text: Any) -> set[str]:
    """The ``rope_type`` of every RoPE the text config holds (flat or per layer type)."""
    params = getattr(text, "rope_parameters", None) or {}
    if not isinstance(params, dict):
        return set()
    if params and all(isinstance(v, dict) for v in params.values()):
        return {str(v.get("rope_type", "default")) for v in params.values()}
    return {str(params.get("rope_type", params.get("type", "default")))}


def _switching(rope: Any, text: Any, vllm_config: Any) -> str | None:
    """When the module switches its tables (LongRoPE, dynamic NTK), read from vLLM's code;
    ``None`` for any other RoPE."""
    kinds = _rope_types(text)
    if not kinds & {"longrope", "dynamic"}:
        return None
    if isinstance(rope, _TransformersRope):
        rule = []
        if "dynamic" in kinds and rope.noop:
            rule.append(
                "dynamic NTK: never: vLLM relabels the module's rope_type 'default' since "
                f"max_model_len {rope.max_model_len} <= max_position_embeddings "
                "(models/transformers/utils.py: disable_noop_dynamic_rope)"
            )
        elif "dynamic" in kinds:
            rule.append(
                "dynamic NTK: per forward pass, from max(position_ids) + 1 against "
                "max_position_embeddings (transformers' modeling_rope_utils.py: "
                "dynamic_rope_update; vLLM keeps it since max_model_len "
                f"{getattr(rope, 'max_model_len', None)} > max_position_embeddings: "
                "models/transformers/utils.py dynamic_rope_update_is_noop)"
            )
        if "longrope" in kinds:
            rule.append(
                "LongRoPE: per forward pass, long factors when max(position_ids) + 1 > "
                "original_max_position_embeddings (transformers' modeling_rope_utils.py: "
                "dynamic_rope_update -> longrope_frequency_update)"
            )
        return "; ".join(rule) + " (the Transformers modeling backend runs transformers' RoPE)"
    name = type(rope).__name__
    if name == "Phi3LongRoPEScaledRotaryEmbedding":
        limit = vllm_config.model_config.max_model_len if vllm_config.model_config else None
        return (
            "once at initialisation, from max_model_len: long factors for every length when "
            "max_model_len > original_max_position_embeddings, else short factors for every "
            "length (rotary_embedding/phi3_long_rope_scaled_rope.py: "
            "Phi3LongRoPEScaledRotaryEmbedding.__init__); max_model_len defaults to "
            "original_max_position_embeddings for LongRoPE (config/model.py: "
            f"_get_and_verify_max_len); here max_model_len {limit}, "
            f"original_max_position_embeddings {rope.original_max_position_embeddings}: "
            f"{'long' if rope.use_long_rope else 'short'} factors"
        )
    if name == "DynamicNTKScalingRotaryEmbedding":
        return (
            "never: one table of max_position_embeddings rows computed at initialisation, "
            "its base scaled once by (factor * max_position_embeddings / "
            "max_trained_positions - (factor - 1)) ** (d / (d - 2)), which is 1 when "
            "max_trained_positions is max_position_embeddings (get_rope's default), "
            "whatever the sequence's length (rotary_embedding/dynamic_ntk_scaling_rope.py: "
            "DynamicNTKScalingRotaryEmbedding._compute_cos_sin_cache)"
        )
    if name == "DynamicNTKAlphaRotaryEmbedding":
        return (
            "never: one table computed at initialisation with base * alpha ** (d / (d - 2)) "
            "(rotary_embedding/dynamic_ntk_alpha_rope.py: "
            "DynamicNTKAlphaRotaryEmbedding._compute_cos_sin_cache)"
        )
    return f"{name}: one table computed at initialisation (no switching in its code)"


def _architecture(config: Any, raw: dict[str, Any]) -> tuple[str | None, str | None]:
    """The config's architecture vLLM's registry knows, and the module it maps it to
    (``models/registry.py``: ``_VLLM_MODELS``, ``_TRANSFORMERS_SUPPORTED_MODELS``)."""
    from vllm.model_executor.models.registry import ModelRegistry

    for arch in list(getattr(config, "architectures", None) or raw.get("architectures") or []):
        found = ModelRegistry.models.get(arch)
        if found is not None:
            module = str(getattr(found, "module_name", "") or "")
            return arch, f"{module}:{getattr(found, 'class_name', '')}"
    return None, None


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables vLLM's model applies."""
    import torch

    raw = dict(request["config"])
    config, vllm_config, dtype, note = _config(raw)
    notes = [note] if note else []
    text = config.get_text_config()
    model_type = str(getattr(text, "model_type", "") or raw.get("model_type", ""))
    outer = str(raw.get("model_type", ""))
    arch, target = _architecture(config, raw)
    module_name, _, class_name = (target or "").partition(":")
    backend = module_name.endswith("models.transformers")
    fallback = None
    file = MODEL_FILES.get(outer) or MODEL_FILES.get(model_type)
    if backend:
        file = f"models/transformers/ ({class_name}, the Transformers modeling backend)"
        notes.append(f"{arch} is vLLM's Transformers modeling backend's (models/registry.py: "
                     "_TRANSFORMERS_SUPPORTED_MODELS): transformers' own rotary module and "
                     "attention layers, read from the environment's transformers "
                     f"{importlib.metadata.version('transformers')}")  # fmt: skip
    elif file is None:
        file = fallback = FALLBACK
        where = f"vLLM runs {arch} with {target}" if arch else "no architecture vLLM registers"
        notes.append(f"model_type {outer!r} has no case here ({where}): read as "
                     f"{FALLBACK} reads it")  # fmt: skip
    else:
        notes.append(f"get_rope as {file} calls it")
    if "rope_parameters" in raw and "rope_scaling" not in raw:
        notes.append("the config has rope_parameters (transformers v5's key)")
    built: dict[str | None, dict[str, Any]] = {}
    windows = []
    for w in request["windows"]:
        layer_type = _layer_type(text, w)
        if layer_type not in built:
            if backend:
                rope = _TransformersRope(config, text, dtype, vllm_config)
                built[layer_type] = {"rope": rope, "head": rope.head_size,
                                     "softmax_scale": float(rope.head_size) ** -0.5,
                                     "notes": [], "rotates": rope.rotates}  # fmt: skip
            else:
                built[layer_type] = _build(text, model_type, layer_type, dtype, vllm_config)
        b = built[layer_type]
        layer = int(w.get("layer") or 0)
        rotates = bool(b["rotates"](layer))
        if rotates:
            if isinstance(b["rope"], _TransformersRope):
                follows = _rope_types(text) & {"dynamic", "longrope"}
                b["rope"].seq_len = int(w["seq_len"]) if follows else None
            c, s, mode = _tables(b["rope"], b["head"], w)
            if isinstance(b["rope"], _TransformersRope) and b["rope"].seq_len:
                mode += f" (one prefill of {b['rope'].seq_len} tokens, rows picked)"
        else:
            pairs = int(b["rope"].rotary_dim) // 2
            c = [[1.0] * pairs for _ in w["positions"]]
            s = [[0.0] * pairs for _ in w["positions"]]
            mode = f"layer {layer} not rotated (its attention's forward skips rotary_emb)"
            if isinstance(b["rope"], _TransformersRope):
                mode = (f"layer {layer} not rotated (transformers' "
                        f"{b['rope'].attention[layer]}.use_rope is false)")  # fmt: skip
        windows.append({"seq_len": int(w["seq_len"]), "positions": [int(p) for p in w["positions"]],
                        "layer_type": w.get("layer_type"), "position_ids": w.get("position_ids"),
                        "layer": w.get("layer"), "rotates": rotates, "cos": c, "sin": s,
                        "mode": mode, "module": type(b["rope"]).__name__})  # fmt: skip
    first = built[next(iter(built))]
    for b in built.values():
        notes.extend(n for n in b["notes"] if n not in notes)
    rope0 = first["rope"]
    rotated = [w for w in windows if w["rotates"]] or windows
    # the scale multiplied into the tables, from the module's float32 cache (before
    # the cast to the model dtype): |(cos, sin)| of its first row's first pair
    if isinstance(rope0, _TransformersRope):
        c0, s0 = rope0.attention_scaling, 0.0
        module = f"{rope0.cls.__module__}: {rope0.cls.__name__}"
    else:
        module = f"vllm.model_executor.layers.rotary_embedding: {type(rope0).__name__}"
        try:
            cache = rope0._compute_cos_sin_cache().float()
            c0, s0 = float(cache[0, 0]), float(cache[0, cache.shape[-1] // 2])
        except TypeError:  # LongRoPE's takes (length, factors, mscale): read the table's row
            c0, s0 = rotated[0]["cos"][0][0], rotated[0]["sin"][0][0]
            if getattr(rope0, "use_long_rope", None) is not None:
                c0, s0 = (rope0.long_mscale if rope0.use_long_rope else rope0.short_mscale), 0.0
                limit = vllm_config.model_config.max_model_len if vllm_config.model_config else None
                notes.append(f"LongRoPE use_long_rope={rope0.use_long_rope} (vLLM's max_model_len "
                             f"{limit}, use_long_rope when > original_max_position_embeddings "
                             f"{rope0.original_max_position_embeddings}): one factor set for "
                             "every length")  # fmt: skip
    result = {
        "version": f"vllm {importlib.metadata.version('vllm')}, torch {torch.__version__}",
        # vLLM's config reading, get_rope and its modules run; the few lines of each model
        # file that pick get_rope's arguments are restated (a model needs its whole engine)
        "source": "installed: ModelConfig (get_config, patch_rope_parameters), get_rope and "
        "its rotary modules run; each model file's get_rope arguments restated from vllm "
        f"{importlib.metadata.version('vllm')}",
        "module": module,
        "layout": "half" if getattr(rope0, "is_neox_style", True) else "interleaved",
        "rotary_dim": int(rope0.rotary_dim),
        "dtype": _DTYPES.get(str(_cache(rope0).dtype), str(_cache(rope0).dtype)),
        "attention_scaling": (c0 * c0 + s0 * s0) ** 0.5,
        "softmax_scale": first["softmax_scale"],
        "switching": _switching(rope0, text, vllm_config),
        "windows": windows,
        "note": "; ".join(notes),
    }
    if fallback:
        result["fallback"] = fallback
    return result


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
