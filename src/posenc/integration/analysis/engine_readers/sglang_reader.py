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

- ``llama`` (and ``phi3``, ``Phi3ForCausalLM`` being ``models/llama.py``'s, and any
  ``model_type`` without its own entry here, as ``models/llama.py`` reads it):
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
  ``rope_parameters["rope_theta"]``, no scaling.

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
import importlib.metadata
import json
import math
import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

#: The largest prefill evaluated in one call (elements of the unit-vector input).
MAX_PREFILL_ELEMENTS = 2**26

_QWEN2 = ("qwen2", "qwen2_vl", "qwen2_5_vl")
_QWEN3 = ("qwen3", "qwen3_vl", "qwen3_vl_text")
_GEMMA3 = ("gemma3_text", "gemma3")
_DEEPSEEK = ("deepseek_v3", "deepseek_v2")


def _hf_config(config: dict[str, Any]) -> tuple[Any, Any]:
    """The config as SGLang's ``hf`` parser reads it, and the text config the LM reads."""
    import sglang  # noqa: F401  (applies SGLang's transformers patches)
    from transformers import AutoConfig

    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        hf = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    text = getattr(hf, "text_config", None) or hf
    if text is not hf:
        # HfModelConfigParser.parse: the text config's keys the top level lacks
        for key, value in text.to_dict().items():
            if not hasattr(hf, key) and value is not None:
                setattr(hf, key, value)
    return hf, text


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
    if model_type not in ("llama", "phi3"):
        note += (
            f"; SGLang's model for {model_type!r} not restated: read as models/llama.py reads it"
        )
    return rope, head_dim**-0.5, note


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
    cls = type(rope.module) if isinstance(rope, _Gemma3Rope) else type(rope)
    return f"{cls.__module__}.{cls.__name__}" if qualified else cls.__name__


def _method(rope: Any) -> str:
    """The name of the forward ``BaseFusedOp`` dispatched ``rope``'s call to."""
    if isinstance(rope, _Gemma3Rope):
        return "Gemma3Attention.forward_native"
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
    built: dict[Any, tuple[Any, float | None, str]] = {}
    windows = []
    for w in request["windows"]:
        lt = w.get("layer_type")
        if lt not in built:
            built[lt] = _build(hf, text, lt)
            if built[lt][2] not in notes:
                notes.append(built[lt][2])
        rope = built[lt][0]
        c, s, mode = _tables(rope, w)
        windows.append({"seq_len": int(w["seq_len"]), "positions": [int(p) for p in w["positions"]],
                        "layer_type": lt, "position_ids": w.get("position_ids"),
                        "cos": c, "sin": s, "mode": mode})  # fmt: skip
    first = built[next(iter(built))]
    rope0 = first[0]
    c0, s0 = windows[0]["cos"][0][0], windows[0]["sin"][0][0]
    return {
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
        "windows": windows,
        "note": "; ".join(notes),
    }


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
