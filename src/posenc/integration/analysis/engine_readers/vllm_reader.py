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

- ``models/llama.py`` (and any ``model_type`` without a case below): ``head_dim`` (else
  ``hidden_size // num_attention_heads``), ``max_position_embeddings``, the text
  config's ``rope_parameters``, neox style; Qwen2/Qwen2-VL/Qwen3-VL's text models pass
  the same, M-RoPE coming from ``mrope_section`` / ``mrope_interleaved`` in
  ``rope_parameters``;
- ``models/gemma3.py``: ``rope_parameters[layer_type]`` (the window's ``layer_type``,
  else the asked layer's ``layer_types`` entry, else the first), softmax scale
  ``query_pre_attn_scalar ** -0.5``;
- ``models/deepseek_v2.py`` (``deepseek_v2`` / ``deepseek_v3``): ``qk_rope_head_dim``,
  GPT-J (interleaved) style, a non-default ``rope_type`` renamed ``deepseek_yarn`` (or
  ``deepseek_llama_scaling`` when ``attention_factor == 1``), and for ``deepseek_yarn``
  the softmax scale ``qk_head_dim ** -0.5 * yarn_get_mscale(factor, mscale_all_dim) ** 2``.

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
}

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
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"

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
    """``get_rope`` called with what the model file passes it; its softmax scale."""
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
    with set_current_vllm_config(vllm_config):
        rope = get_rope(
            head_dim,
            max_position=text.max_position_embeddings,
            is_neox_style=neox,
            rope_parameters=params,
            dtype=dtype,
        )
    return {"rope": rope, "head": head_dim, "softmax_scale": softmax_scale, "notes": notes}


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


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables vLLM's model applies."""
    import torch

    raw = dict(request["config"])
    config, vllm_config, dtype, note = _config(raw)
    notes = [note] if note else []
    text = config.get_text_config()
    model_type = str(getattr(text, "model_type", "") or raw.get("model_type", ""))
    outer = str(raw.get("model_type", ""))
    file = MODEL_FILES.get(outer) or MODEL_FILES.get(model_type)
    if file is None:
        file = "models/llama.py"
        notes.append(f"model_type {outer!r} has no case here: built as models/llama.py does")
    notes.append(f"get_rope as {file} calls it")
    if "rope_parameters" in raw and "rope_scaling" not in raw:
        notes.append("the config has rope_parameters (transformers v5's key)")
    built: dict[str | None, dict[str, Any]] = {}
    windows = []
    for w in request["windows"]:
        layer_type = _layer_type(text, w)
        if layer_type not in built:
            built[layer_type] = _build(text, model_type, layer_type, dtype, vllm_config)
        b = built[layer_type]
        c, s, mode = _tables(b["rope"], b["head"], w)
        windows.append({"seq_len": int(w["seq_len"]), "positions": [int(p) for p in w["positions"]],
                        "layer_type": w.get("layer_type"), "position_ids": w.get("position_ids"),
                        "cos": c, "sin": s, "mode": mode,
                        "module": type(b["rope"]).__name__})  # fmt: skip
    first = built[next(iter(built))]
    for b in built.values():
        notes.extend(n for n in b["notes"] if n not in notes)
    rope0 = first["rope"]
    # the scale multiplied into the tables, from the module's float32 cache (before
    # the cast to the model dtype): |(cos, sin)| of its first row's first pair
    try:
        cache = rope0._compute_cos_sin_cache().float()
        c0, s0 = float(cache[0, 0]), float(cache[0, cache.shape[-1] // 2])
    except TypeError:  # LongRoPE's takes (length, factors, mscale): read the table's row
        c0, s0 = windows[0]["cos"][0][0], windows[0]["sin"][0][0]
        if getattr(rope0, "use_long_rope", None) is not None:
            c0, s0 = (rope0.long_mscale if rope0.use_long_rope else rope0.short_mscale), 0.0
            limit = vllm_config.model_config.max_model_len if vllm_config.model_config else None
            notes.append(f"LongRoPE use_long_rope={rope0.use_long_rope} (vLLM's max_model_len "
                         f"{limit}, use_long_rope when > original_max_position_embeddings "
                         f"{rope0.original_max_position_embeddings}): one factor set for "
                         "every length")  # fmt: skip
    return {
        "version": f"vllm {importlib.metadata.version('vllm')}, torch {torch.__version__}",
        # vLLM's config reading, get_rope and its modules run; the few lines of each model
        # file that pick get_rope's arguments are restated (a model needs its whole engine)
        "source": "installed: ModelConfig (get_config, patch_rope_parameters), get_rope and "
        "its rotary modules run; each model file's get_rope arguments restated from vllm "
        f"{importlib.metadata.version('vllm')}",
        "module": f"vllm.model_executor.layers.rotary_embedding: {type(rope0).__name__}",
        "layout": "half" if getattr(rope0, "is_neox_style", True) else "interleaved",
        "rotary_dim": int(rope0.rotary_dim),
        "dtype": _DTYPES.get(str(_cache(rope0).dtype), str(_cache(rope0).dtype)),
        "attention_scaling": (c0 * c0 + s0 * s0) ** 0.5,
        "softmax_scale": first["softmax_scale"],
        "windows": windows,
        "note": "; ".join(notes),
    }


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
