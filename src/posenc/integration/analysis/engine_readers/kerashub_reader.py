"""Read a config's RoPE the way KerasHub loads a transformers checkpoint, and print its tables.

Runs under KerasHub's own Python (``posenc engines build keras-hub``'s environment):
standard library, keras-hub, Keras 3 and JAX (the backend: ``KERAS_BACKEND=jax`` and JAX
on CPU are set before Keras is imported), and numpy, which Keras depends on; never posenc.

The config is loaded by KerasHub's own entry point for a transformers checkpoint: written
to a temporary folder as ``config.json`` and read by
``keras_hub.models.Backbone.from_preset(folder, load_weights=False)``:
``utils/preset_utils.py: get_preset_loader`` sees ``model_type`` and makes a
``utils/transformers/preset_loader.py: TransformersPresetLoader``, which picks the
converter by ``model_type`` (``llama`` -> ``convert_llama3``, ``qwen2`` -> ``convert_qwen``,
``gemma3``/``gemma3_text`` -> ``convert_gemma3``, ...) and raises ``ValueError: KerasHub
has no converter ...`` for any other (``phi3``, ``stablelm``, ``deepseek_v3``,
``qwen2_vl``, ``qwen3_vl``: refused, never read as Llama); ``load_backbone`` builds
``backbone_cls(**converter.convert_backbone_config(config))`` at the config's own sizes
(the dtype is Keras' default policy, float32: ``from_preset`` passes no dtype and the
converters read no ``torch_dtype``). Whatever the converter raises on the config is the
refusal, with one restated step: a ``config.json`` that transformers' ``save_pretrained``
writes always holds a few non-RoPE keys that a hand-written one may lack
(``use_sliding_window``, ``rms_norm_eps``, SmolLM3's ``layer_types``, a vision config's
``in_channels``, ...); where a converter raises ``KeyError`` for one of :data:`FILLED`
(:data:`VISION_FILLED`), the key is added (to ``text_config`` where there is one) with
transformers' default for it and the load retried, and the note names it.
``POSENC_KERASHUB_STRICT=1`` turns that off. RoPE keys are never filled.

The rotary layer is the one the asked layer's attention holds (the window's ``layer``,
else layer 0, of ``backbone.transformer_layers``): a ``RotaryEmbedding`` subclass
(``layers/modeling/rotary_embedding.py``; Llama's ``LlamaRotaryEmbedding``, Gemma 3's and
GPT-OSS's ``RotaryEmbedding``), or another rotary layer that returns ``(cos, sin)``
(SmolLM3's), applied with its model file's own ``apply_rotary_pos_emb``, as the attention
applies it. A layer whose attention does not rotate (SmolLM3's ``use_rope`` False) answers
``rotates: false``, and its rows are cos 1, sin 0.
The tables come from the layer itself: applied to unit vectors (1 in the first channel of
every pair, 0 in the second) of the rotated width (the attention's ``rotary_dim``, else
its head size), the rotated pair holds ``(m cos, m sin)``, ``m`` being any scale the layer
multiplies in (YaRN's ``0.1 ln(factor) + 1``). Each window is one prefill of ``seq_len``
tokens from ``start_index`` 0, as the attention calls it, rows picked at the asked
positions; when that prefill would be too large, each position is one decode step
(``start_index`` = position, one token) and ``mode`` says so. M-RoPE: a window's
``position_ids`` go to the attention's own ``_apply_partial_rope`` where it has one and an
``mrope_section`` (Qwen3.5); otherwise the rows are at the token index and ``mode`` says so.

``switching`` is null: no converter of keras-hub 0.32 builds a rotary layer that switches
(``RotaryEmbedding``'s ``"dynamic"`` is one fixed table; Phi-3's LongRoPE,
``models/phi3/phi3_rotary_embedding.py: Phi3SuScaledRotaryEmbedding``, which picks its
factors per call from ``start_index + seq_len``, has no HF converter); :func:`_switching`
names the rule where a layer has one. The softmax scale is the attention's
``_inv_norm_factor`` where it keeps one, else Gemma's ``query_head_dim_normalize`` rule
(restated from ``gemma3_attention.py``), else null.

The protocol (request, batch, answer) is :mod:`~posenc.analysis.engine_readers.protocol`'s.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import sys
import tempfile
from typing import Any

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

#: The largest prefill evaluated in one call (elements of the unit-vector input).
MAX_PREFILL_ELEMENTS = 2**24
#: The environment variable that turns off the filling of missing non-RoPE keys.
STRICT_VARIABLE = "POSENC_KERASHUB_STRICT"

#: Non-RoPE keys a converter reads with ``config[key]`` and that transformers always writes
#: to config.json: transformers' default for each (its config classes' ``__init__`` and
#: ``__post_init__``), as a function of the (text) config. A ``KeyError`` for one of these is
#: the hand-written file's, not KerasHub's reading of a real checkpoint.
FILLED: dict[str, Any] = {
    "use_sliding_window": lambda c: False,  # Qwen2Config, Qwen3Config
    "sliding_window": lambda c: 4096,  # Qwen2Config, Qwen3Config
    "tie_word_embeddings": lambda c: False,  # LlamaConfig, Qwen2Config, ...
    "rms_norm_eps": lambda c: 1e-6,  # LlamaConfig, Qwen2Config, MistralConfig
    "num_key_value_heads": lambda c: c["num_attention_heads"],  # None -> the heads
    "attention_bias": lambda c: False,  # SmolLM3Config
    "attention_dropout": lambda c: 0.0,
    "mlp_bias": lambda c: False,
    # SmolLM3Config.__post_init__: sliding only where use_sliding_window and no RoPE
    "layer_types": lambda c: [
        "sliding_attention"
        if c.get("use_sliding_window") and c.get("sliding_window") is not None and not rope
        else "full_attention"
        for rope in c["no_rope_layers"][: c["num_hidden_layers"]]
    ],
    # Qwen3_5TextConfig (its linear-attention layers' sizes)
    "linear_conv_kernel_dim": lambda c: 4,
    "linear_key_head_dim": lambda c: 128,
    "linear_value_head_dim": lambda c: 128,
    "linear_num_key_heads": lambda c: 16,
    "linear_num_value_heads": lambda c: 32,
}
#: The same for a ``vision_config`` (Qwen3_5VisionConfig).
VISION_FILLED: dict[str, Any] = {"in_channels": lambda c: 3}

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _version() -> str:
    import jax
    import keras

    return (f"keras-hub {importlib.metadata.version('keras-hub')}, keras {keras.__version__}, "
            f"jax {jax.__version__} (backend {keras.config.backend()})")  # fmt: skip


def _load(raw: dict[str, Any]) -> tuple[Any, Any, list[str]]:
    """KerasHub's backbone for the config (``Backbone.from_preset``), its loader, notes."""
    import keras_hub
    from keras_hub.src.utils.preset_utils import get_preset_loader

    config = dict(raw)
    notes: list[str] = []
    strict = os.environ.get(STRICT_VARIABLE, "") not in ("", "0")
    with tempfile.TemporaryDirectory() as folder:
        while True:
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(config, f)
            loader = get_preset_loader(folder)
            try:
                backbone = keras_hub.models.Backbone.from_preset(folder, load_weights=False)
                break
            except KeyError as exc:
                if strict or not _fill(config, exc, loader, notes):
                    raise
    return backbone, loader, notes


def _fill(config: dict[str, Any], exc: KeyError, loader: Any, notes: list[str]) -> bool:
    """Add the key ``exc`` names with transformers' default (:data:`FILLED`); False if not."""
    key = exc.args[0] if exc.args else None
    text = config.get("text_config")
    vision = config.get("vision_config")
    places = [(d, FILLED, p) for d, p in ((text, "text_config."), (config, ""))
              if isinstance(d, dict)]  # fmt: skip
    if isinstance(vision, dict):
        places.append((vision, VISION_FILLED, "vision_config."))
    for place, table, prefix in places:
        if key in table and key not in place:
            try:
                place[key] = table[key](place)
            except (KeyError, TypeError, ValueError):
                return False
            converter = loader.converter.__name__.rpartition(".")[2]
            notes.append(f"config.json lacks {prefix}{key} (transformers writes it; "
                         f"{converter}.convert_backbone_config reads it): filled with "
                         f"transformers' default {place[key]!r}")  # fmt: skip
            return True
    return False


def _sublayers(layer: Any) -> list[Any]:
    """``layer`` and every layer under it, depth first."""
    out, stack, seen = [], [layer], set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        out.append(item)
        children = getattr(item, "_layers", None) or []
        stack.extend(reversed(list(children)))
        for value in vars(item).values():
            if _is_layer(value) and id(value) not in seen:
                stack.append(value)
    return out


def _is_layer(value: Any) -> bool:
    import keras

    return isinstance(value, keras.layers.Layer)


def _is_rotary(value: Any) -> bool:
    from keras_hub.src.layers.modeling.rotary_embedding import RotaryEmbedding

    return isinstance(value, RotaryEmbedding) or (
        _is_layer(value) and "rotary" in type(value).__name__.lower()
    )


def _rotary(backbone: Any, layer: int) -> dict[str, Any]:
    """Layer ``layer``'s rotary layer, the attention that holds it, and what it reads."""
    layers = backbone.transformer_layers
    if not 0 <= layer < len(layers):
        raise ValueError(f"layer {layer}: the backbone has {len(layers)} transformer layers")
    block = layers[layer]
    for owner in _sublayers(block):
        found = [(name, v) for name, v in vars(owner).items() if _is_rotary(v)]
        if found:
            break
    else:
        raise ValueError(f"transformer_layers[{layer}] ({type(block).__name__}) holds no "
                         "rotary layer")  # fmt: skip
    name, rope = found[0]
    head = _head_dim(owner, backbone)
    rot = getattr(owner, "rotary_dim", None) or getattr(owner, "_rotary_dim", None) or head
    use_rope = getattr(owner, "use_rope", True)
    return {"rope": rope, "owner": owner, "path": f"transformer_layers[{layer}]"
            f"({type(block).__name__}).{owner.name}.{name}", "head": int(head),
            "rotary_dim": int(rot), "rotates": bool(use_rope),
            "softmax_scale": _softmax_scale(owner)}  # fmt: skip


def _head_dim(owner: Any, backbone: Any) -> int:
    for attr in ("head_dim", "_head_dim"):
        value = getattr(owner, attr, None)
        if isinstance(value, int):
            return value
    for attr in ("_query_dense", "query_dense", "q_proj"):
        dense = getattr(owner, attr, None)
        kernel = getattr(dense, "kernel", None)
        if kernel is not None and len(kernel.shape) == 3:
            return int(kernel.shape[-1])  # EinsumDense (hidden, heads, head_dim)
    value = getattr(backbone, "head_dim", None)
    if isinstance(value, int):
        return value
    return int(backbone.hidden_dim // backbone.num_query_heads)


def _softmax_scale(owner: Any) -> tuple[float | None, str]:
    """The attention's inverse-square-root factor, where it keeps one."""
    value = getattr(owner, "_inv_norm_factor", None)
    if isinstance(value, (int, float)):
        return float(value), f"{type(owner).__name__}._inv_norm_factor"
    if hasattr(owner, "query_head_dim_normalize") and hasattr(owner, "head_dim"):
        # gemma3_attention.py: Gemma3Attention._compute_attention's query_normalization
        if owner.query_head_dim_normalize:
            return 1.0 / math.sqrt(owner.head_dim), "1/sqrt(head_dim) (query_head_dim_normalize)"
        width = owner.hidden_dim // owner.num_query_heads
        return 1.0 / math.sqrt(width), "1/sqrt(hidden_dim // num_query_heads)"
    return None, ""


def _axes(rope: Any) -> tuple[int, int]:
    """The (sequence, feature) axes of a rank-4 input, as the layer reads them."""
    seq = int(getattr(rope, "sequence_axis", 1)) % 4
    feat = int(getattr(rope, "feature_axis", -1)) % 4
    return seq, feat


def _apply(found: dict[str, Any], x: Any, start: int, ids: Any = None) -> Any:
    """The rotary layer (or the attention's own rotation) applied to ``x`` (b, s, h, d)."""
    from keras import ops

    rope, owner = found["rope"], found["owner"]
    if ids is not None:
        return owner._apply_partial_rope(x, start, position_ids=ids)
    from keras_hub.src.layers.modeling.rotary_embedding import RotaryEmbedding

    if isinstance(rope, RotaryEmbedding):
        seq, feat = _axes(rope)
        moved = ops.moveaxis(x, (1, 3), (seq, feat))
        out = rope(moved, start_index=start)
        return ops.moveaxis(out, (seq, feat), (1, 3))
    result = rope(x, start_index=start)
    if isinstance(result, (tuple, list)) and len(result) == 2:
        # a layer returning (cos, sin): applied as the attention applies it, with its model
        # file's apply_rotary_pos_emb(query, key, cos, sin, expansion_axis=2) (SmolLM3's)
        module = sys.modules[type(owner).__module__]
        apply = getattr(module, "apply_rotary_pos_emb", None)
        if apply is None:
            raise ValueError(f"{type(rope).__name__} returns (cos, sin) and "
                             f"{module.__name__} has no apply_rotary_pos_emb")  # fmt: skip
        return apply(x, x, result[0], result[1], expansion_axis=2)[0]
    return result


def _layout(found: dict[str, Any]) -> str:
    """Where channel 0's rotation goes: channel r/2 (half) or channel 1 (interleaved)."""
    import numpy as np

    rot = found["rotary_dim"]
    e0 = np.zeros((1, 2, 1, rot), dtype="float32")
    e0[..., 0] = 1.0
    out = np.asarray(_apply(found, e0, 0))[0, 1, 0]
    return "interleaved" if abs(out[1]) > abs(out[rot // 2]) else "half"


def _tables(found: dict[str, Any], layout: str, w: dict[str, Any]) -> tuple[Any, Any, str]:
    import numpy as np

    rot = found["rotary_dim"]
    pairs = rot // 2
    unit = np.zeros(rot, dtype="float32")
    if layout == "half":
        unit[:pairs] = 1.0
    else:
        unit[0::2] = 1.0
    positions = [int(p) for p in w["positions"]]
    seq_len = int(w["seq_len"])
    ids = w.get("position_ids")
    if not found["rotates"]:
        mode = "not rotated: the attention's use_rope is False (rows of cos 1, sin 0)"
        return [[1.0] * pairs for _ in positions], [[0.0] * pairs for _ in positions], mode

    def split(out: Any) -> tuple[Any, Any]:
        out = np.asarray(out, dtype="float64")
        if layout == "half":
            return out[..., :pairs], out[..., pairs:rot]
        return out[..., 0:rot:2], out[..., 1:rot:2]

    mrope = ids is not None and getattr(found["owner"], "mrope_section", None) is not None
    if ids is not None and mrope:
        # the attention's own path: the whole head, position_ids (batch, 4, seq) with the
        # text position first, then temporal, height, width (qwen3_5_attention.py: _apply_mrope)
        head = found["head"]
        x = np.zeros((1, len(positions), 1, head), dtype="float32")
        x[..., :rot] = unit
        pid = np.asarray([[positions, *[list(map(int, axis)) for axis in ids]]], dtype="int32")
        rows = np.asarray(_apply(found, x, 0, pid))[0, :, 0, :rot]
        c, s = split(rows)
        mode = "the attention's _apply_partial_rope at position_ids (1, 4, n): text, T, H, W"
    elif seq_len * rot <= MAX_PREFILL_ELEMENTS:
        x = np.broadcast_to(unit, (1, seq_len, 1, rot)).copy()
        out = np.asarray(_apply(found, x, 0))[0, :, 0]
        c, s = split(out[positions])
        mode = f"one prefill of {seq_len} tokens from start_index 0"
    else:
        cs, ss = [], []
        for p in positions:
            out = np.asarray(_apply(found, unit.reshape(1, 1, 1, rot), p))[0, 0, 0]
            c1, s1 = split(out)
            cs.append(c1)
            ss.append(s1)
        c, s = np.stack(cs), np.stack(ss)
        mode = "one decode step per position (start_index = position, one token)"
    if ids is not None and not mrope:
        mode += "; at the token index (this attention takes no multi-axis positions)"
    return c.tolist(), s.tolist(), mode


def _switching(rope: Any) -> str | None:
    """The rotary layer's rule for LongRoPE's factor sets or dynamic NTK's base, if it has one.

    No converter of keras-hub 0.32 builds either (Phi-3 has no HF converter; convert_llama3
    refuses any rope_type but llama3), but a layer that has one says so.
    """
    if type(rope).__name__ == "Phi3SuScaledRotaryEmbedding":
        return ("per forward call, from start_index + sequence length > "
                "pretraining_sequence_length: long factors, else short (phi3_rotary_embedding.py: "
                "Phi3SuScaledRotaryEmbedding._compute_cos_sin_embedding)")  # fmt: skip
    if getattr(rope, "rope_type", None) == "dynamic":
        return (
            "never: one fixed table, inverse frequencies divided by factor ** (d / (d - 2)) at "
            "every length (rotary_embedding.py: RotaryEmbedding._get_inverse_freq)"
        )
    return None


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables KerasHub's backbone applies."""
    raw = dict(request["config"])
    backbone, loader, notes = _load(raw)
    converter = loader.converter.__name__.rpartition(".")[2]
    notes.insert(0, f"TransformersPresetLoader -> {converter}.convert_backbone_config -> "
                 f"{type(backbone).__name__}")  # fmt: skip
    if "rope_parameters" in raw and "rope_scaling" not in raw:
        notes.append("the config has rope_parameters (transformers v5's key) and no rope_scaling")
    found: dict[int, dict[str, Any]] = {}
    layouts: dict[int, str] = {}
    windows = []
    for w in request["windows"]:
        layer = int(w.get("layer") or 0)
        if layer not in found:
            found[layer] = _rotary(backbone, layer)
            layouts[layer] = _layout(found[layer]) if found[layer]["rotates"] else "half"
        f = found[layer]
        c, s, mode = _tables(f, layouts[layer], w)
        windows.append({"seq_len": int(w["seq_len"]), "positions": [int(p) for p in w["positions"]],
                        "layer_type": w.get("layer_type"), "position_ids": w.get("position_ids"),
                        "layer": layer, "cos": c, "sin": s, "mode": mode, "rotates": f["rotates"],
                        "module": f["path"], "layout": layouts[layer]})  # fmt: skip
    first = min(found)
    f0 = found[first]
    rope0 = f0["rope"]
    scale, where = f0["softmax_scale"]
    if where:
        notes.append(f"softmax scale: {where}")
    rotating = [w for w in windows if w["rotates"]]
    if rotating:
        c0, s0 = rotating[0]["cos"][0][0], rotating[0]["sin"][0][0]
        attention_scaling = (c0 * c0 + s0 * s0) ** 0.5
    else:
        attention_scaling = 1.0
    return {
        "version": _version(),
        "source": "installed: Backbone.from_preset (TransformersPresetLoader, the model_type's "
        "convert_backbone_config, the backbone class) and its rotary layers run",
        "module": f"{type(rope0).__module__}: {type(rope0).__name__}",
        "layout": layouts[first],
        "rotary_dim": f0["rotary_dim"],
        "dtype": _DTYPES.get(str(rope0.compute_dtype), str(rope0.compute_dtype)),
        "attention_scaling": attention_scaling,
        "softmax_scale": scale,
        "switching": _switching(rope0),
        "windows": windows,
        "note": "; ".join(notes),
    }


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
