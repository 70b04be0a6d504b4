"""Read a config's RoPE the way MaxText builds it, and print the cos/sin tables it applies.

Runs under MaxText's own Python (``posenc engines build maxtext``'s environment): standard
library, jax and maxtext only, never posenc. MaxText runs from its own YAML configs, never
from an HF ``config.json``, so one step is restated here, and every answer's ``note`` says
so: the HF config is written as MaxText config keys (:func:`maxtext_keys`), the way MaxText's
own model YAMLs (``configs/models/*.yml``) restate the HF configs its checkpoint conversion
pairs them with (``checkpoint_conversion/utils/hf_model_configs.py``: ``HF_MODEL_CONFIGS``;
``checkpoint_conversion/to_maxtext.py`` converts a MaxText ``model_name`` with that pair).

Everything after that is MaxText's own code:

- ``configs/pyconfig.py: initialize`` merges the keys over ``configs/base.yml`` and validates
  them (``configs/types.py: MaxTextConfig``): a ``rope_type`` outside ``RopeType`` (``default``,
  ``llama3.1``, ``yarn``), a ``partial_rotary_factor`` outside ``qwen3_next``/``qwen3_5``, a
  non-integral YaRN factor (``rope_factor: int``) raise there: a refusal.
- ``layers/attentions.py: Attention`` (``layers/attention_mla.py: MLA`` for DeepSeek) is built
  with the arguments its decoder layer passes (``models/<decoder>.py``: ``attention_type``,
  ``use_mrope``, ``is_nope_layer``; restated, cited per decoder in :func:`_attention_args`);
  its ``__init__`` picks the rotary class (``Attention.init_rotary_embedding``: M-RoPE,
  ``llama3.1``, ``yarn``, the Qwen3-Next hybrid, partial, else ``RotaryEmbedding`` with the
  local timescale and Gemma 3's linear factor).
- That module, ``attention.rotary_embedding``, is applied to unit vectors (1 in the first
  channel of every rotated pair, 0 elsewhere) at the asked positions, passed as MaxText's
  ``inputs_positions``: the rotated pair holds ``(m cos, m sin)``, ``m`` being any scale the
  module multiplies in (YaRN's ``rope_attention_scaling``).

Python 3.11: maxtext 0.2.5 asks for Python >=3.12 and jax >=0.11.1, the recipe installs it
with jax 0.10.2 (the last jax for 3.11). The modules read here parse under 3.11; one name
they import from jax 0.11, ``jax.experimental.xla_metadata.must_fuse_call``, is imported by
``kernels/attention/jax_flash_attention.py`` (through ``layers/attention_op.py``) and called
only inside its flash-attention kernels, never by the RoPE: where jax lacks it the reader
sets a stand-in that raises if called (:func:`_jax_011_names`). Nothing else is stubbed;
MaxText's own ``common/gcloud_stub.py`` stands in for the absent Google Cloud clients.

The protocol (request, batch, answer) is :mod:`~posenc.analysis.engine_readers.protocol`'s.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
import os
import sys
from typing import Any

#: HF ``model_type`` -> MaxText ``decoder_block``, as MaxText's model YAMLs pair them with
#: the HF configs of ``hf_model_configs.py`` (llama3.1-8b.yml and llama2-7b.yml:
#: "llama2"; qwen2.5-7b.yml: "qwen2"; qwen3-vl-4b.yml: "qwen3" with use_mrope; ...).
#: A model_type with no MaxText decoder gets base.yml's default decoder_block, "llama2".
DECODER_BLOCKS = {
    "llama": "llama2",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "qwen2": "qwen2",
    "qwen2_vl": "qwen2",
    "qwen2_vl_text": "qwen2",
    "qwen2_5_vl": "qwen2",
    "qwen3": "qwen3",
    "qwen3_vl": "qwen3",
    "qwen3_vl_text": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "qwen3_vl_moe": "qwen3_moe",
    "qwen3_omni_moe": "qwen3_moe",
    "qwen3_next": "qwen3_next",
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "gpt_oss": "gpt_oss",
    "olmo3": "olmo3",
    "llama4": "llama4",
    "llama4_text": "llama4",
}
#: The decoders whose rotary choice reads ``model_name`` (layers/attentions.py:
#: Attention.init_rotary_embedding), and the MaxText model of that family.
MODEL_NAMES = {"gemma3": "gemma3-4b"}
#: The decoders whose layers pass ``use_mrope=config.use_mrope`` to ``Attention``
#: (models/qwen2.py, models/qwen3.py: Qwen3DecoderLayer, Qwen3NextFullAttention).
MROPE_DECODERS = ("qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5")
#: MaxText keys the reader fixes (the run, not the model): one CPU device, no checkpoint,
#: unscanned layers, a short target length (the RoPE modules take explicit positions).
RUN_KEYS: dict[str, Any] = {
    "run_name": "posenc",
    "skip_jax_distributed_system": True,
    "enable_checkpointing": False,
    "log_config": False,
    "scan_layers": False,
    "max_target_length": 16,
    "max_prefill_predict_length": 8,
    "per_device_batch_size": 1,
    "attention": "dot_product",
}
RESTATED = (
    "restated (not MaxText's code): the HF config written as MaxText config keys, as "
    "MaxText's configs/models/*.yml restate the HF configs of checkpoint_conversion/utils/"
    "hf_model_configs.py (MaxText reads only its own YAML)"
)


def _jax_011_names() -> str:
    """Give jax 0.10 the one jax 0.11 name MaxText's attention modules import.

    ``kernels/attention/jax_flash_attention.py`` imports ``must_fuse_call`` from
    ``jax.experimental.xla_metadata`` (jax >=0.11) and calls it only inside its flash kernels.
    """
    import jax.experimental.xla_metadata as xla_metadata

    if hasattr(xla_metadata, "must_fuse_call"):
        return ""

    def must_fuse_call(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("posenc stand-in: jax 0.10 has no must_fuse_call")

    setattr(xla_metadata, "must_fuse_call", must_fuse_call)  # noqa: B010
    return (
        "stubbed: jax.experimental.xla_metadata.must_fuse_call (jax 0.11; imported by "
        "kernels/attention/jax_flash_attention.py, called only in its flash kernels, never "
        "by the RoPE) is a stand-in that raises"
    )


def _text(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return dict(text) if isinstance(text, dict) else config


def _rope_dicts(text: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The RoPE parameters of the global layers and, where given apart, of the sliding ones.

    transformers 5's ``rope_parameters`` (one dict, or one per layer type) or 4's
    ``rope_theta`` + ``rope_scaling`` (+ ``rope_local_base_freq``, Gemma 3).
    """
    rp = text.get("rope_parameters")
    if isinstance(rp, dict) and rp:
        if all(isinstance(v, dict) for v in rp.values()):
            glob = dict(rp.get("full_attention") or next(iter(rp.values())))
            local = rp.get("sliding_attention")
            return glob, dict(local) if isinstance(local, dict) else None
        return dict(rp), None
    glob = dict(text.get("rope_scaling") or {})
    if "rope_theta" in text:
        glob.setdefault("rope_theta", text["rope_theta"])
    local = None
    if "rope_local_base_freq" in text:
        local = {"rope_type": "default", "rope_theta": text["rope_local_base_freq"]}
    return glob, local


def _num(value: Any) -> Any:
    """A float that is an integer as an int (MaxText's int keys: rope_max_timescale, ...)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def maxtext_keys(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """RESTATED: the HF config as MaxText config keys, and what could not be carried over.

    The keys follow MaxText's model YAMLs: ``rope_theta`` -> ``rope_max_timescale`` (every
    YAML; deepseek3-671b.yml: "DeepSeek uses rope_theta: 10000"); ``rope_local_base_freq`` ->
    ``local_rope_max_timescale`` and a ``linear`` factor -> ``rope_linear_scaling_factor``
    (gemma3-4b.yml); ``llama3`` -> ``rope_type: llama3.1`` (the llama3.1 path of
    layers/attentions.py; to_maxtext.py's rope shuffle tests the same name); ``yarn`` ->
    ``rope_type: yarn`` with ``rope_factor``, ``original_max_position_embeddings``,
    ``max_position_embeddings``, ``beta_fast``/``beta_slow``, ``rope_truncate`` (HF
    ``truncate``), ``rope_interleave`` (DeepSeek's HF ``rope_interleave``, default true, as
    deepseek3-671b.yml; false elsewhere, as gpt-oss-20b.yml and olmo3-7b.yml) and
    ``rope_attention_scaling`` (false for MLA, whose ``mscale`` is DeepSeek's
    ``mscale_all_dim`` on the softmax, as deepseek2-16b.yml; true elsewhere, as
    gpt-oss-20b.yml and olmo3-7b.yml); ``mrope_section`` -> ``use_mrope``/``mrope_section``
    (qwen3-vl-4b.yml); ``partial_rotary_factor`` -> ``partial_rotary_factor``
    (qwen3.5-35b-a3b.yml). Any other ``rope_type`` is passed as MaxText's ``rope_type``, which
    MaxText's config validation then accepts or refuses.
    """
    text = _text(config)
    notes: list[str] = []
    model_type = str(config.get("model_type") or text.get("model_type") or "")
    decoder = DECODER_BLOCKS.get(model_type)
    if decoder is None:
        decoder = "llama2"
        notes.append(f"model_type {model_type!r} has no MaxText decoder block: base.yml's "
                     "default decoder_block 'llama2'")  # fmt: skip
    heads = int(text.get("num_attention_heads") or 1)
    hidden = int(text.get("hidden_size") or 0)
    head_dim = int(text.get("head_dim") or (hidden // heads))
    keys: dict[str, Any] = {
        "decoder_block": decoder,
        "base_emb_dim": hidden,
        "base_num_query_heads": heads,
        "base_num_kv_heads": int(text.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "base_mlp_dim": int(text.get("intermediate_size") or 4 * hidden),
        "base_num_decoder_layers": int(text.get("num_hidden_layers") or 1),
        "vocab_size": int(text.get("vocab_size") or config.get("vocab_size") or 32),
    }
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype")
    if dtype in ("float32", "bfloat16", "float16"):
        keys["dtype"] = dtype
        keys["weight_dtype"] = "float32"
    if decoder == "deepseek":
        keys["attention_type"] = "mla"
        for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                  "v_head_dim"):  # fmt: skip
            if text.get(k) is not None:
                keys[k] = int(text[k])
        if text.get("q_lora_rank") is None:
            keys["q_lora_rank"] = 0
    if decoder in MODEL_NAMES:
        # layers/attentions.py reads model_name (Gemma 3: no linear factor on the local
        # layers); model_name is one of MaxText's own (configs/types.py: a Literal), its
        # YAML applied only to the keys not given here (override_model_config)
        keys["model_name"] = MODEL_NAMES[decoder]
        keys["override_model_config"] = True

    glob, local = _rope_dicts(text)
    if glob.get("rope_theta") is not None:
        keys["rope_max_timescale"] = _num(glob["rope_theta"])
    if local is not None and local.get("rope_theta") is not None:
        keys["local_rope_max_timescale"] = _num(local["rope_theta"])
        if str(local.get("rope_type") or local.get("type") or "default") != "default":
            notes.append("the sliding layers' own rope_type has no MaxText key (dropped)")
    kind = str(glob.get("rope_type") or glob.get("type") or "default")
    factor = glob.get("factor")
    keys["rope_linear_scaling_factor"] = 1.0  # base.yml's; set, as a model YAML may differ
    if kind in ("default", "mrope"):
        keys["rope_type"] = "default"
    elif kind == "linear":
        keys["rope_type"] = "default"
        keys["rope_linear_scaling_factor"] = float(factor if factor is not None else 1.0)
    elif kind == "llama3":
        keys["rope_type"] = "llama3.1"
        given = {k: glob.get(k) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                          "original_max_position_embeddings")}  # fmt: skip
        notes.append(f"llama3 -> rope_type llama3.1; MaxText has no keys for {given} "
                     "(layers/embeddings.py: LLaMARotaryEmbedding._apply_scaling_factor "
                     "hard-codes 8, 1, 4, 8192)")  # fmt: skip
    elif kind == "yarn":
        keys["rope_type"] = "yarn"
        keys["rope_factor"] = _num(factor if factor is not None else 1.0)
        mpe = text.get("max_position_embeddings")
        original = glob.get("original_max_position_embeddings") or text.get(
            "original_max_position_embeddings") or mpe  # fmt: skip
        if mpe is not None:
            keys["max_position_embeddings"] = int(mpe)
        if original is not None:
            keys["original_max_position_embeddings"] = int(original)
        keys["beta_fast"] = _num(glob.get("beta_fast", 32))
        keys["beta_slow"] = _num(glob.get("beta_slow", 1))
        keys["rope_truncate"] = bool(glob.get("truncate", True))
        mla = decoder == "deepseek"
        keys["rope_interleave"] = bool(text.get("rope_interleave", True)) if mla else False
        keys["rope_attention_scaling"] = not mla
        if mla:
            keys["mscale"] = float(glob.get("mscale_all_dim") or 0.0)
            if glob.get("mscale") is not None and glob.get("mscale") != glob.get("mscale_all_dim"):
                notes.append(f"mscale {glob['mscale']} has no MaxText key (MaxText's mscale "
                             "is mscale_all_dim)")  # fmt: skip
        if glob.get("attention_factor") is not None:
            notes.append(f"attention_factor {glob['attention_factor']} has no MaxText key "
                         "(dropped: YarnRotaryEmbedding scales by 0.1 ln(factor) + 1)")  # fmt: skip
    else:
        keys["rope_type"] = kind  # MaxText's RopeType decides
    section = glob.get("mrope_section") or text.get("mrope_section")
    if section:
        keys["use_mrope"] = True
        keys["mrope_section"] = [int(s) for s in section]
        if not glob.get("mrope_interleaved"):
            notes.append("mrope_interleaved is not set; MaxText has no key for it (its M-RoPE, "
                         "Qwen3OmniMoeThinkerTextRotaryEmbedding, always interleaves)")  # fmt: skip
    partial = glob.get("partial_rotary_factor", text.get("partial_rotary_factor"))
    if partial is not None and float(partial) != 1.0:
        keys["partial_rotary_factor"] = float(partial)
    if decoder == "llama4" and text.get("no_rope_layer_interval") is not None:
        keys["nope_layer_interval"] = int(text["no_rope_layer_interval"])
    elif text.get("no_rope_layers") is not None or text.get("no_rope_layer_interval"):
        notes.append(f"MaxText's {decoder} decoder has no NoPE layers (no key for "
                     "no_rope_layers)")  # fmt: skip
    return keys, notes


def _config(keys: dict[str, Any]) -> Any:
    from maxtext.configs import pyconfig
    from maxtext.utils.globals import MAXTEXT_CONFIGS_DIR

    base = os.path.join(MAXTEXT_CONFIGS_DIR, "base.yml")
    return pyconfig.initialize(["", base], **RUN_KEYS, **keys)


def _validation(exc: ValueError) -> ValueError:
    """pydantic's ValidationError (configs/types.py: MaxTextConfig) on one line, where it was
    raised kept (its first line names only the count of errors)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return exc
    parts = []
    for e in errors():
        loc = ".".join(str(x) for x in e.get("loc", ())) or "MaxTextConfig"
        given = e.get("input")
        shown = "" if isinstance(given, dict) else f" (given {given!r})"
        parts.append(f"{loc}: {e.get('msg')}{shown}")
    text = "MaxTextConfig (configs/types.py) refuses the keys: " + "; ".join(parts)
    return ValueError(text).with_traceback(exc.__traceback__)


def _attention_args(cfg: Any, layer: int) -> tuple[dict[str, Any], str]:
    """The rope-relevant arguments the decoder layer passes to ``Attention`` (restated)."""
    from maxtext.common.common_types import AttentionType

    decoder = str(getattr(cfg.decoder_block, "value", cfg.decoder_block))
    args: dict[str, Any] = {}
    where = f"models/{decoder}.py"
    if decoder in MROPE_DECODERS:
        args["use_mrope"] = cfg.use_mrope
        args["mrope_section"] = cfg.mrope_section
    if decoder == "gemma3":
        gemma3 = importlib.import_module("maxtext.models.gemma3")
        args["attention_type"] = gemma3.get_attention_type(layer)
        where += ": get_attention_type"
    elif decoder == "gemma2":
        # models/gemma2.py: each layer pair is a LOCAL_SLIDING then a GLOBAL attention
        args["attention_type"] = (AttentionType.LOCAL_SLIDING if layer % 2 == 0
                                  else AttentionType.GLOBAL)  # fmt: skip
    elif decoder == "llama4":
        llama4 = importlib.import_module("maxtext.models.llama4")
        nope = bool(llama4.determine_is_nope_layer(layer, cfg.nope_layer_interval))
        args["is_nope_layer"] = nope
        args["attention_type"] = AttentionType.GLOBAL if nope else AttentionType.CHUNK
        where += ": determine_is_nope_layer"
    return args, where


def _attention(cfg: Any, layer: int) -> tuple[Any, str]:
    """MaxText's attention of layer ``layer``, built as its decoder layer builds it."""
    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh

    devices = np.array(jax.devices()[:1]).reshape((1,) * len(cfg.mesh_axes))
    mesh = Mesh(devices, cfg.mesh_axes)
    shape = (1, cfg.max_target_length, cfg.emb_dim)
    common = {
        "config": cfg, "num_query_heads": cfg.num_query_heads, "num_kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "max_target_length": cfg.max_target_length, "mesh": mesh,
        "attention_kernel": cfg.attention, "inputs_q_shape": shape, "inputs_kv_shape": shape,
        "dtype": cfg.dtype, "weight_dtype": cfg.weight_dtype, "rngs": nnx.Rngs(0),
    }  # fmt: skip
    if str(getattr(cfg.attention_type, "value", cfg.attention_type)) == "mla":
        from maxtext.common.common_types import AttentionType
        from maxtext.layers import attention_mla

        # models/deepseek.py: DeepSeekGenericLayer builds attention_mla.MLA with these
        mla = attention_mla.MLA(
            **common, attention_type=AttentionType(cfg.attention_type),
            q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank,
            qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim,
            v_head_dim=cfg.v_head_dim, max_position_embeddings=cfg.max_position_embeddings,
            original_max_position_embeddings=cfg.original_max_position_embeddings,
            mscale=cfg.mscale, rope_factor=cfg.rope_factor,
        )  # fmt: skip
        return mla, "models/deepseek.py: DeepSeekGenericLayer -> layers/attention_mla.py: MLA"
    from maxtext.layers import attentions

    args, where = _attention_args(cfg, layer)
    return attentions.Attention(**common, **args), f"{where} -> layers/attentions.py: Attention"


def _pairs(rope: Any) -> tuple[int, int, str]:
    """(input channels, rotated channels, how the module pairs its input channels)."""
    name = type(rope).__name__
    head = int(getattr(rope, "head_dim", 0) or rope.embedding_dims)
    rotated = int(getattr(rope, "rotary_dim", 0) or rope.embedding_dims)
    if name == "Gemma4PartialRotaryEmbedding":
        return head, head, "half"  # inf-padded timescales: the unrotated pairs turn by 0
    if name == "LLaMARotaryEmbedding" or (name == "YarnRotaryEmbedding" and rope.interleave):
        return head, rotated, "adjacent"
    return head, rotated, "half"


def _tables(rope: Any, dtype: Any, positions: list[int], ids: Any) -> tuple[Any, Any, int]:
    import jax.numpy as jnp

    head, rotated, pairing = _pairs(rope)
    half = rotated // 2
    unit = jnp.zeros((head,), dtype=dtype)
    unit = unit.at[0:rotated:2].set(1) if pairing == "adjacent" else unit.at[:half].set(1)
    x = jnp.broadcast_to(unit, (1, len(positions), 1, head))
    if ids is not None:
        pos = jnp.asarray(ids, dtype=jnp.int32).T[jnp.newaxis]  # (1, n, 3)
    else:
        pos = jnp.asarray([positions], dtype=jnp.int32)
    out = rope(x, pos)[0, :, 0, :].astype(jnp.float32)
    if pairing == "adjacent" and type(rope).__name__ == "LLaMARotaryEmbedding":
        c, s = out[:, 0:rotated:2], out[:, 1:rotated:2]
    else:  # half-split output (YaRN always writes [real, imag])
        c, s = out[:, :half], out[:, half:rotated]
    return c.tolist(), s.tolist(), rotated


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables MaxText's attention applies."""
    import jax
    import jax.numpy as jnp

    stub = _jax_011_names()
    config = dict(request["config"])
    keys, notes = maxtext_keys(config)
    notes.insert(0, f"{RESTATED}: {keys}")
    try:
        cfg = _config(keys)  # MaxText's own config and validation
    except ValueError as exc:
        raise _validation(exc) from None
    dtype = jnp.dtype(cfg.dtype)
    built: dict[int, tuple[Any, str]] = {}
    windows = []
    for w in request["windows"]:
        layer = int(w.get("layer") or 0)
        if layer not in built:
            built[layer] = _attention(cfg, layer)
        att, path = built[layer]
        rope = att.rotary_embedding
        positions = [int(p) for p in w["positions"]]
        ids = w.get("position_ids")
        mrope = type(rope).__name__ == "Qwen3OmniMoeThinkerTextRotaryEmbedding"
        use_ids = ids is not None and mrope
        c, s, rotated = _tables(rope, dtype, positions, ids if use_ids else None)
        mode = (f"{type(rope).__name__} applied to unit vectors at the asked positions "
                "(inputs_positions; MaxText's RoPE modules take explicit positions, seq_len "
                "changes no angle)")  # fmt: skip
        if use_ids:
            mode += "; multi-axis positions as (batch, seq, 3) inputs_positions"
        elif ids is not None:
            mode += f"; at the token index ({type(rope).__name__} takes one position per token)"
        rotates = not bool(getattr(att, "is_nope_layer", False))
        if not rotates:
            c = [[1.0] * (rotated // 2) for _ in positions]
            s = [[0.0] * (rotated // 2) for _ in positions]
            mode = f"no rotation: layer {layer} is a NoPE layer (Attention.is_nope_layer)"
        windows.append({"seq_len": int(w["seq_len"]), "positions": positions, "cos": c,
                        "sin": s, "mode": mode, "layer_type": w.get("layer_type"),
                        "position_ids": ids, "rotates": rotates,
                        "module": f"{path}.rotary_embedding: {type(rope).__name__}"})  # fmt: skip
    att0, path0 = built[min(built)]
    rope0 = att0.rotary_embedding
    _, rotated0, pairing = _pairs(rope0)
    if type(rope0).__name__ == "LLaMARotaryEmbedding":
        # the checkpoint's channels: to_maxtext.py (_process_and_stack_weights) and
        # param_mapping.py (LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN: adjust_rope) interleave
        # q/k's halves, so the adjacent pairs it rotates are HF's (k, k + r/2)
        layout = "half"
        notes.append("layout: LLaMARotaryEmbedding rotates adjacent channels of q/k kernels "
                     "that MaxText's converter interleaved (param_mapping.py: "
                     "LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN adjust_rope): half on the "
                     "checkpoint's channels")  # fmt: skip
    else:
        layout = "interleaved" if pairing == "adjacent" else "half"
    if stub:
        notes.append(stub)
    model_type = str(config.get("model_type") or _text(config).get("model_type") or "")
    fallback = None
    if model_type not in DECODER_BLOCKS:
        fallback = (f"models/llama2.py (base.yml's default decoder_block; MaxText has no "
                    f"decoder for model_type {model_type!r})")  # fmt: skip
    # the scale the module multiplies into the table: |(cos, sin)| of a rotated pair
    first = next((w for w in windows if w["rotates"]), windows[0])
    c0, s0 = first["cos"][0][0], first["sin"][0][0]
    softmax = getattr(att0, "softmax_scale", None)
    return {
        "version": f"maxtext {importlib.metadata.version('maxtext')}, "
        f"jax {jax.__version__}, flax {importlib.metadata.version('flax')}",
        "source": "installed",
        "module": f"{path0}.rotary_embedding: {type(rope0).__name__}",
        "layout": layout,
        "rotary_dim": rotated0,
        "dtype": str(dtype),
        "attention_scaling": math.hypot(c0, s0),
        "softmax_scale": float(softmax) if isinstance(softmax, (int, float)) else None,
        "switching": None,
        "fallback": fallback,
        "windows": windows,
        "note": "; ".join(notes),
    }


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
