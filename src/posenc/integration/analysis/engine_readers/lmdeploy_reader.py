"""Read a config's RoPE the way LMDeploy's PyTorch engine does, and print its cos/sin tables.

Runs under LMDeploy's own Python (``posenc engines build lmdeploy``'s environment): standard
library, lmdeploy and the torch and transformers it runs on, never posenc or numpy. ``import
lmdeploy`` runs its serving stack's imports, so the ``lmdeploy`` package is registered by path
without running its ``__init__`` and only ``lmdeploy.pytorch``'s config, model-map and rotary
modules are imported. The environment has the CPU torch 2.13.0 (outside lmdeploy 0.18's
declared ``torch<=2.12.1``) and no CUDA: the rotary modules are those of the default backend
(``pytorch/backends/default/rotary_embedding.py``), which the CUDA backend builds too
(``backends/cuda/op_backend.py``: ``CudaOpsBackend.build_op`` passes a
``RotaryEmbeddingBuildSpec`` to ``DefaultOpsBackend``); only the application of the tables
(a Triton kernel on CUDA) is the default backend's ``DefaultApplyRotaryEmbImpl`` here, the
same ``q * cos + rotate_half(q) * sin``.

The config is read as the engine loads a model: written to a temporary folder as
``config.json`` and read by ``lmdeploy.pytorch.config.ModelConfig.from_pretrained`` (its
``config_from_pretrained``, i.e. transformers' ``AutoConfig``, the per-model
``configurations/`` builder, and ``_update_torch_dtype``: ``dtype="auto"`` keeps a float16 or
bfloat16 ``torch_dtype`` and runs a float32 model in float16). ``POSENC_LMDEPLOY_DTYPE``
(e.g. ``float32``) is passed instead of ``"auto"``, as the engine's ``dtype``. Where
``ModelConfig`` raises (a configuration builder that asks the CUDA device, DeepSeek's
``flash_mla_available`` or Qwen3.5's ``is_bf16_supported``; a tiny config without a key a
builder reads), the config is read by ``config_from_pretrained`` alone, the dtype by
``_update_torch_dtype``, and the note says so.

The model class is the engine's own choice (``pytorch/models/patch.py``: ``_get_model_class``
over ``module_map.py``'s ``MODULE_MAP``, from the config's ``architectures``): an
architecture LMDeploy has no model for is refused there ("Can not found rewrite for
architectures"), as the engine refuses to load it. The rotary module is built as that model
file builds it (restated, each case naming its lines):

- ``models/llama.py`` and the files that build it the same way (``LlamaModel.__init__``:
  ``build_rotary_embedding_from_config(config)``; mistral, mixtral, qwen2, qwen2_moe, qwen3,
  qwen3_moe, phi3, internlm3, gpt_oss, and the VL models' text models, qwen2_vl.py /
  qwen2_5_vl.py ``Qwen2Model(text_config)``, qwen3_vl.py / qwen3_vl_moe.py
  ``Qwen3VLTextModel(config.text_config)``): every layer rotates, half layout;
- ``models/qwen3_5.py`` (and qwen3_5_moe.py): ``build_rotary_embedding_from_config`` of the
  text config; ``Qwen3_5DecoderLayer.__init__`` gives a ``linear_attention`` layer a Gated
  DeltaNet without RoPE (``rotates`` false there);
- ``models/gemma.py``: ``GemmaModel.build_rope_emb`` itself is called (on a stand-in for
  the model object); a layer uses ``rotary_emb_local`` where ``GemmaAttention.__init__``
  makes it sliding (``(layer_idx + 1) % sliding_window_pattern``, default 6, for
  gemma3_text) and ``GemmaDecoderLayer.forward`` picks it (``sliding_window != -1``);
  softmax scale ``query_pre_attn_scalar ** -0.5``;
- ``models/glm4.py``: ``build_rotary_embedding_from_config`` (``partial_rotary_factor``);
  ``Glm4Attention.forward`` rotates interleaved pairs (``_extract_rope`` / ``_fill_rope``);
- ``models/deepseek_v2.py`` (``DeepseekV2Model.__init__``): ``build_rotary_embedding`` of
  ``qk_rope_head_dim`` (``use_mla``), ``LinearScaling`` updated by ``build_rotary_params``;
  softmax scale ``q_head_dim ** -0.5 * yarn_get_mscale(factor, mscale_all_dim) ** 2``
  (``DeepseekV2Attention.__init__``); the checkpoint's interleaved rope channels are
  de-interleaved at load (``_load_weight_attention``: ``__update_pe``) and rotated as halves,
  so the layout on the checkpoint's channels is interleaved.

A model file outside these is read as ``models/llama.py`` builds it, and the answer's
``fallback`` and note say so.

The tables come from the module itself: ``rotary_emb(hidden_states, position_ids)`` with
``hidden_states`` in the model dtype (the module casts its float32 tables to it), then
applied by ``DefaultApplyRotaryEmbImpl`` to unit vectors (1 in the first channel of every
pair): the rotated pair holds ``(m cos, m sin)``. A window is one prefill of ``seq_len``
tokens at positions ``0 .. seq_len - 1`` (what the dynamic NTK and LongRoPE modules read:
``max(position_ids) + 1``), rows picked; when that prefill is large, the position ids are the
asked rows and ``seq_len - 1`` (the same maximum; every module is otherwise position-wise)
and the mode says so. An M-RoPE window's ``position_ids`` are passed as the engine's
``mrope_position_ids`` (``[3, tokens]``, ``MRotaryEmbedding.forward``).

The protocol (request, batch, answer) is :mod:`~posenc.analysis.engine_readers.protocol`'s.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import types
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the config is a local file

#: The environment variable that sets the dtype LMDeploy is given (its ``dtype``; "auto").
DTYPE_VARIABLE = "POSENC_LMDEPLOY_DTYPE"

#: The largest prefill evaluated in one call (positions x rotary channels).
MAX_PREFILL_ELEMENTS = 2**24

#: LMDeploy model files whose model builds ``build_rotary_embedding_from_config`` of its
#: (text) config and rotates every layer with it (each file's ``*Model.__init__``).
PLAIN = {
    "llama": "LlamaModel.__init__",
    "mistral": "MistralModel.__init__",
    "mixtral": "MixtralModel.__init__",
    "qwen2": "Qwen2Model.__init__",
    "qwen2_moe": "Qwen2MoeModel.__init__",
    "qwen3": "Qwen3model.__init__",
    "qwen3_moe": "Qwen3MoeModel.__init__",
    "phi3": "Phi3Model.__init__",
    "internlm3": "InternLM3Model.__init__",
    "gpt_oss": "GptOssModel.__init__",
    "qwen2_vl": "Qwen2Model.__init__ (Qwen2VLForConditionalGeneration: text_config)",
    "qwen2_5_vl": "qwen2_vl.py Qwen2Model.__init__ (Qwen2_5_VLForConditionalGeneration: "
    "text_config)",
    "qwen3_vl": "Qwen3VLTextModel.__init__ (config.text_config)",
    "qwen3_vl_moe": "Qwen3VLMoeTextModel.__init__ (config.text_config)",
}

#: The model file the answer's ``fallback`` names when the reader reads a model as another's.
FALLBACK = "models/llama.py"

_DTYPES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def _package() -> None:
    spec = importlib.util.find_spec("lmdeploy")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("lmdeploy is not installed in this environment")
    if "lmdeploy" not in sys.modules:
        package = types.ModuleType("lmdeploy")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec  # its __init__ never runs; submodules are found by path
        sys.modules["lmdeploy"] = package


def _why(exc: BaseException) -> str:
    import traceback

    lines = str(exc).strip().splitlines() or [""]
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = f" at {last.filename.rpartition('site-packages/')[2]}:{last.lineno} in {last.name}"
    return f"{type(exc).__name__}: {lines[0][:200]}{where}"


def _config(raw: dict[str, Any]) -> tuple[Any, Any, str]:
    """LMDeploy's reading of the config: ``(hf_config, dtype, note)``."""
    import torch
    from lmdeploy.pytorch.config import ModelConfig, _update_torch_dtype
    from lmdeploy.pytorch.transformers import config_from_pretrained

    dtype_arg = os.environ.get(DTYPE_VARIABLE, "auto")
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(raw, f)
        try:
            model = ModelConfig.from_pretrained(folder, dtype=dtype_arg)
            return model.hf_config, model.dtype, f"ModelConfig.from_pretrained: dtype {model.dtype}"
        except Exception as exc:
            first = _why(exc)
        config = config_from_pretrained(folder, trust_remote_code=False)
    holder = types.SimpleNamespace(hf_config=config, dtype=None)
    try:
        dtype = _update_torch_dtype(holder, dtype_arg).dtype
        how = "_update_torch_dtype"
    except Exception as exc:  # is_bf16_supported asks the CUDA device
        declared = str(getattr(config, "dtype", None) or "float16").replace("torch.", "")
        dtype = getattr(torch, declared if dtype_arg == "auto" else dtype_arg)
        how = f"the declared dtype ({_why(exc)}; a CUDA device with bfloat16 assumed)"
    note = (f"ModelConfig.from_pretrained raised ({first}): the config read by "
            f"config_from_pretrained alone, dtype {dtype} ({how})")  # fmt: skip
    return config, dtype, note


def _model_class(config: Any, raw: dict[str, Any]) -> tuple[Any, str]:
    """The model class the engine picks (``_get_model_class``), and a note."""
    from lmdeploy.pytorch.models.patch import _get_model_class, _get_module_map

    note = ""
    if not getattr(config, "architectures", None) and not getattr(config, "auto_map", None):
        from transformers.models.auto import modeling_auto as auto

        model_type = str(raw.get("model_type", ""))
        for mapping in ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
                        "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"):  # fmt: skip
            arch = getattr(auto, mapping, {}).get(model_type)
            if arch:
                config.architectures = [arch]
                note = (f"the config has no architectures: {arch} (transformers' {mapping} for "
                        f"{model_type!r}), what a saved checkpoint names")  # fmt: skip
                break
    return _get_model_class(config, _get_module_map()), note


def _text(config: Any) -> Any:
    # qwen2_vl.py Qwen2VLForConditionalGeneration.__init__: getattr(config, 'text_config',
    # config); qwen3_vl.py, qwen3_5.py, gemma3_vl.py: config.text_config
    return getattr(config, "text_config", None) or config


def _build(config: Any, file: str, window: dict[str, Any]) -> dict[str, Any]:
    """The rotary module the model file builds for the asked layer, its softmax scale,
    whether that layer rotates, the layout and what was done."""
    from lmdeploy.pytorch.nn.rotary_embedding import (
        build_rotary_embedding,
        build_rotary_embedding_from_config,
        build_rotary_params,
        get_rope_parameters,
        get_rope_theta,
    )

    text = _text(config)
    layer = int(window.get("layer") or 0)
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    out: dict[str, Any] = {"softmax_scale": float(head) ** -0.5, "rotates": True,
                           "layout": "half", "fallback": None}  # fmt: skip
    if file == "gemma":
        from lmdeploy.pytorch.models.gemma import GemmaModel

        model_type = text.model_type
        holder = types.SimpleNamespace(model_type=model_type)
        GemmaModel.build_rope_emb(holder, text)
        # gemma.py GemmaAttention.__init__: which layers slide; GemmaDecoderLayer.forward
        # takes rotary_pos_emb_local where the layer slides
        if model_type == "gemma3_text":
            pattern = getattr(text, "sliding_window_pattern", 6)
            sliding = bool((layer + 1) % pattern)
        else:
            sliding = not bool(layer % 2)
        window_size = getattr(text, "sliding_window", -1) if sliding else -1
        local = getattr(holder, "rotary_emb_local", None)
        use_local = local is not None and window_size != -1
        out["rope"] = local if use_local else holder.rotary_emb
        out["how"] = (f"gemma.py GemmaModel.build_rope_emb (called), layer {layer}: "
                      f"{'rotary_emb_local' if use_local else 'rotary_emb'}")  # fmt: skip
        if hasattr(text, "query_pre_attn_scalar"):
            out["softmax_scale"] = float(text.query_pre_attn_scalar) ** -0.5
        return out
    if file == "deepseek_v2":
        from lmdeploy.pytorch.backends.rotary_embedding import RopeType
        from lmdeploy.pytorch.models.deepseek_v2 import yarn_get_mscale

        # deepseek_v2.py DeepseekV2Model.__init__
        use_mla = getattr(text, "use_mla", True)
        dim = text.qk_rope_head_dim if use_mla else text.hidden_size // text.num_attention_heads
        params: dict[str, Any] = dict(emb_type=RopeType.LinearScaling, dim=dim,
                                      max_position_embeddings=text.max_position_embeddings,
                                      base=get_rope_theta(text))  # fmt: skip
        params.update(build_rotary_params(text))
        out["rope"] = build_rotary_embedding(**params)
        # deepseek_v2.py DeepseekV2Attention.__init__: the softmax scale
        scale = float(text.qk_nope_head_dim + text.qk_rope_head_dim) ** -0.5
        rope_scaling = get_rope_parameters(text)
        if rope_scaling is not None:
            mscale_all_dim = rope_scaling.get("mscale_all_dim", 0)
            factor = rope_scaling.get("factor", 1.0)
            if mscale_all_dim:
                m = yarn_get_mscale(factor, mscale_all_dim)
                scale = scale * m * m
        out["softmax_scale"] = scale
        out["layout"] = "interleaved"
        out["how"] = ("deepseek_v2.py DeepseekV2Model.__init__ (build_rotary_embedding of "
                      "qk_rope_head_dim); the checkpoint's interleaved rope channels are "
                      "de-interleaved at load (DeepseekV2ForCausalLM._load_weight_attention: "
                      "__update_pe) and rotated as halves")  # fmt: skip
        return out
    out["rope"] = build_rotary_embedding_from_config(text)
    if file in ("qwen3_5", "qwen3_5_moe"):
        # qwen3_5.py Qwen3_5DecoderLayer.__init__: a linear_attention layer is a Gated DeltaNet
        kind = list(getattr(text, "layer_types", None) or [])
        out["rotates"] = not kind or kind[layer] == "full_attention"
        out["how"] = (f"qwen3_5.py Qwen3_5TextModel.__init__ (build_rotary_embedding_from_config);"
                      f" layer {layer}: {kind[layer] if kind else 'full_attention'}")  # fmt: skip
        return out
    if file == "glm4":
        # glm4.py Glm4Model.__init__: build_rotary_embedding_from_config (partial_rotary_factor);
        # Glm4Attention.forward: _extract_rope takes the first half of the head, de-interleaves
        # its pairs, rotates them as halves, _fill_rope interleaves them back
        out["layout"] = "interleaved"
        out["how"] = ("glm4.py Glm4Model.__init__ (build_rotary_embedding_from_config); "
                      "Glm4Attention._extract_rope / _fill_rope: interleaved pairs")  # fmt: skip
    elif file in PLAIN:
        out["how"] = f"{file}.py {PLAIN[file]} (build_rotary_embedding_from_config)"
    else:
        out["fallback"] = FALLBACK
        out["how"] = (f"models/{file}.py is not restated here: read as {FALLBACK} builds it "
                      "(build_rotary_embedding_from_config of the text config)")  # fmt: skip
    return out


def _impl(rope: Any) -> Any:
    return getattr(rope, "impl", rope)  # MRotaryEmbedding wraps the backend's module


def _tables(rope: Any, dtype: Any, window: dict[str, Any]) -> tuple[Any, Any, int, float, str]:
    """``(cos rows, sin rows, rotary_dim, attention scaling, mode)`` of one window."""
    import torch
    from lmdeploy.pytorch.backends.default.apply_rotary_emb import DefaultApplyRotaryEmbImpl
    from lmdeploy.pytorch.nn.rotary_embedding import MRotaryEmbedding

    positions = [int(p) for p in window["positions"]]
    seq_len = int(window["seq_len"])
    n = len(positions)
    probe = torch.zeros(1, 1, 1)
    with torch.no_grad():
        c1, _ = rope(probe, torch.tensor([[0, seq_len - 1]]))  # float32: the scale at row 0
        rot = int(c1.shape[-1])
        scaling = float(c1.reshape(-1, rot)[0, 0])
        hidden = torch.zeros(1, 1, rot, dtype=dtype)
        if window.get("position_ids") is not None and isinstance(rope, MRotaryEmbedding):
            ids = torch.tensor([[int(v) for v in axis] for axis in window["position_ids"]])
            cos, sin = rope(hidden, ids)  # the model's mrope_position_ids, [3, tokens]
            rows = list(range(n))
            mode = "mrope_position_ids [3, tokens] (the asked rows)"
        elif seq_len * rot <= MAX_PREFILL_ELEMENTS:
            cos, sin = rope(hidden, torch.arange(seq_len).reshape(1, -1))
            rows = positions
            mode = f"one prefill of {seq_len} tokens (position_ids 0 .. {seq_len - 1}), rows picked"
        else:
            cos, sin = rope(hidden, torch.tensor([[*positions, seq_len - 1]]))
            rows = list(range(n))
            mode = (f"position_ids = the asked rows and {seq_len - 1} (a prefill of {seq_len} "
                    "tokens' largest id, all the module reads of the others)")  # fmt: skip
        if window.get("position_ids") is not None and not isinstance(rope, MRotaryEmbedding):
            mode += "; position_ids ignored (the module is not M-RoPE)"
        cos = cos.reshape(-1, rot)[rows]
        sin = sin.reshape(-1, rot)[rows]
        pairs = rot // 2
        unit = torch.zeros(n, 1, rot, dtype=dtype)
        unit[..., :pairs] = 1.0
        q, _ = DefaultApplyRotaryEmbImpl().forward(unit, unit.clone(), cos, sin, inplace=False)
        q = q.float().reshape(n, rot)
    mode += "; applied by DefaultApplyRotaryEmbImpl (rotate_half) to unit vectors"
    return q[:, :pairs].tolist(), q[:, pairs:].tolist(), rot, scaling, mode


def _rope_types(text: Any) -> set[str]:
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        return set()
    if params and all(isinstance(v, dict) for v in params.values()):
        return {str(v.get("rope_type", v.get("type", "default"))) for v in params.values()}
    return {str(params.get("rope_type", params.get("type", "default")))}


_BATCH = ("position_ids hold every token of the step's batch, flattened "
          "(model_inputs.py: StepContext.get_mask_and_position_ids), so the largest position "
          "of any sequence in the step decides, and a chunked prefill's early chunks read "
          "their own largest position")  # fmt: skip


def _switching(rope: Any, text: Any) -> str | None:
    """When the module switches (LongRoPE factors, dynamic NTK base), read from its code."""
    name = type(_impl(rope)).__name__
    if name == "LongRoPEScalingRotaryEmbeddingImpl":
        return ("per forward pass, from the position ids: long factors when max(position_ids) "
                "+ 1 > original_max_position_embeddings, else short factors; the magnitude "
                "(mscale) once at initialisation from max_position_embeddings / "
                "original_max_position_embeddings (backends/default/rotary_embedding.py: "
                f"LongRoPEScalingRotaryEmbeddingImpl.__init__, forward); {_BATCH}")  # fmt: skip
    if name == "LlamaDynamicNTKScalingRotaryEmbedding":
        return ("per forward pass, from the position ids: the base is rescaled from seq_len = "
                "max(position_ids) + 1 when it exceeds max_position_embeddings, else the "
                "original base (backends/default/rotary_embedding.py: "
                "LlamaDynamicNTKScalingRotaryEmbedding.forward, _ntk_inv_freq); "
                f"{_BATCH}")  # fmt: skip
    kinds = _rope_types(text) & {"longrope", "su", "dynamic"}
    if kinds:
        return (f"never: the module applied is {name}, which has no switch: the config's "
                f"{', '.join(sorted(kinds))} scaling is not what it applies")  # fmt: skip
    return None


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables LMDeploy's PyTorch engine applies."""
    _package()
    import torch

    raw = dict(request["config"])
    config, dtype, note = _config(raw)
    notes = [note]
    cls, arch_note = _model_class(config, raw)
    if arch_note:
        notes.append(arch_note)
    file = cls.__module__.rsplit(".", 1)[-1]
    notes.append(f"model class {cls.__module__}.{cls.__name__} (patch.py: _get_model_class)")
    if "rope_parameters" in raw and "rope_scaling" not in raw:
        notes.append("the config has rope_parameters (transformers v5's key)")
    text = _text(config)
    types_ = list(getattr(text, "layer_types", None) or [])
    built: dict[int, dict[str, Any]] = {}
    windows = []
    for w in request["windows"]:
        layer = w.get("layer")
        if layer is None and w.get("layer_type") and w["layer_type"] in types_:
            layer = types_.index(w["layer_type"])
        layer = int(layer or 0)
        if layer not in built:
            built[layer] = _build(config, file, {**w, "layer": layer})
        b = built[layer]
        if b["how"] not in notes:
            notes.append(b["how"])
        if b["rotates"]:
            c, s, rot, scaling, mode = _tables(b["rope"], dtype, w)
        else:
            with torch.no_grad():
                rot = int(b["rope"](torch.zeros(1, 1, 1), torch.tensor([[0]]))[0].shape[-1])
            c = [[1.0] * (rot // 2) for _ in w["positions"]]
            s = [[0.0] * (rot // 2) for _ in w["positions"]]
            scaling = 1.0
            mode = f"layer {layer} not rotated ({b['how']}); cos 1 and sin 0 rows"
        b["rotary_dim"] = rot
        windows.append({"seq_len": int(w["seq_len"]), "positions": [int(p) for p in w["positions"]],
                        "layer_type": w.get("layer_type"), "position_ids": w.get("position_ids"),
                        "layer": w.get("layer"), "rotates": bool(b["rotates"]), "cos": c,
                        "sin": s, "mode": mode, "attention_scaling": scaling,
                        "module": type(_impl(b["rope"])).__name__})  # fmt: skip
    first_layer = next((k for k, v in built.items() if v["rotates"]), next(iter(built)))
    first = built[first_layer]
    rotated = [w for w in windows if w["rotates"]] or windows
    rope0 = first["rope"]
    wrapper = "" if _impl(rope0) is rope0 else f" in {type(rope0).__name__}"
    result = {
        "version": f"lmdeploy {importlib.metadata.version('lmdeploy')}, torch {torch.__version__}, "
        f"transformers {importlib.metadata.version('transformers')}",
        "source": "installed: ModelConfig, _get_model_class, build_rotary_embedding(_from_config) "
        "and the default backend's rotary modules run; each model file's call restated from "
        f"lmdeploy {importlib.metadata.version('lmdeploy')}",
        "module": f"{type(_impl(rope0)).__module__}: {type(_impl(rope0)).__name__}{wrapper}",
        "layout": first["layout"],
        "rotary_dim": int(first.get("rotary_dim") or 0),
        "dtype": _DTYPES.get(str(dtype), str(dtype)),
        "attention_scaling": rotated[0]["attention_scaling"],
        "softmax_scale": first["softmax_scale"],
        "switching": _switching(rope0, text),
        "windows": windows,
        "note": "; ".join(n for n in notes if n),
    }
    fallback = next((b["fallback"] for b in built.values() if b["fallback"]), None)
    if fallback:
        result["fallback"] = fallback
    return result


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
