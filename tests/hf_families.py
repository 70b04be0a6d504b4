"""Every transformers model family with a rotary module, built tiny and patched.

For each family of the installed transformers whose modeling code defines a
``*RotaryEmbedding`` class, :func:`tiny_model` builds a small random-weight model
from the family's own config class (nothing is downloaded), and :func:`check`
runs it before and after :func:`posenc.hf.patch_model`. The outcome is one of:

- ``same``: the patched model's main output equals the original's within
  :func:`tolerance`, and by parts: each patched rotary module's outputs equal HF's
  within the table error call by call, and the patched model fed HF's recorded
  outputs gives HF's output exactly (where the output is chaotic, e.g. routed or
  halted, so that table rounding moves it as far as a wrong table would, the parts
  decide alone);
- ``refused``: ``patch_model`` raised ``ValueError`` (the detail is its message); and
  :attr:`Outcome.read_config` names each refused module whose config
  :func:`posenc.rotary.config.rope_spec` still reads into frequencies (which the model
  does not use: its module was refused);
- ``different``: patched without error, but the output moved beyond the
  tolerance (a silent change: the one outcome that must never happen);
- ``crash``: ``patch_model`` or the patched forward raised anything else;
- ``build-failed``: the harness could not build or run the unpatched model (a
  harness problem, not posenc's).

Run as a script (``python tests/hf_families.py [family ...]``) it checks every
family in a few worker processes and writes ``survey.json`` plus a summary.
Workers run families one after another, each in a child with a CPU-time limit
(:data:`CPU_LIMIT`) and a wall-clock deadline that only a hung child reaches; a
worker whose child overruns either, or dies, is replaced, and the phase it last
reported (build, patch, forward) decides whether that family ``build-failed`` or
``crash``-ed.

The sizes are small but the depth is the config's own: per-layer settings
(``layer_types``, ``mlp_layer_types``, layer index lists, KV-sharing sources)
then stay consistent without being rewritten, and a 64-wide layer costs little.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import resource
import selectors
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

STATUSES = ("same", "refused", "different", "crash", "build-failed")
SEQ_LEN = 12
WIDTH = 64
HEADS = 4
HEAD_DIM = WIDTH // HEADS
FFN = 128
EXPERT_FFN = 64
EXPERTS = 4
# every token goes to every expert: top-k routing is discontinuous, and an output that
# jumps when a near tie between experts flips could not tell a table error from a wrong table
TOP_K = EXPERTS
# weights well above HF's default scale (0.02): attention is then sharp enough that the
# output feels the positions, so a wrong table would move it by O(1); not as sharp as
# tests/test_hf.py's 0.5, with which deep models come near hard attention and their
# output jumps when a near tie flips
INIT_RANGE = 0.2
# The work of one family is bounded, not its wall time: the child that checks it may use
# CPU_LIMIT seconds of CPU (RLIMIT_CPU, all its threads; torch runs one), whatever the
# machine's load, and the kernel stops it past that (SIGXCPU). The slowest family, blt,
# used 11 s of CPU (transformers 5.24; the survey records each one's cpu_seconds; all 199
# took 134 s): 120 s leaves room for slower CPUs without letting a runaway family eat the
# suite. The wall clock only catches a child that hangs using no CPU (a lock held at
# fork time): HANG_TIMEOUT is far beyond what any family takes even on a loaded machine
# (CPU_LIMIT at a tenth of a core), and such a family runs once more before it counts as
# lost.
CPU_LIMIT = 120
HANG_TIMEOUT = 1200.0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What :func:`check` found for one family."""

    family: str
    status: str
    detail: str
    target: str = ""
    seconds: float = 0.0
    max_diff: float | None = None
    scale: float | None = None
    sensitivity: float | None = None
    rotary: tuple[str, ...] = ()
    exercised: tuple[str, ...] = ()
    read_config: str = ""
    cpu_seconds: float = 0.0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        """An outcome from its JSON object (a worker's line, or the survey's file)."""
        return cls(
            **{**data, "rotary": tuple(data["rotary"]), "exercised": tuple(data["exercised"])}
        )


# --------------------------------------------------------------------------------------
# Families.


def _models_dir() -> Path:
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise ImportError("transformers is not installed")
    return Path(spec.origin).parent / "models"


ROTARY_CLASS = re.compile(r"^class (\w*RotaryEmbedding)\(", re.M)


def families() -> list[str]:
    """Sorted names of the transformers model families that define a ``*RotaryEmbedding``."""
    found = {
        path.parent.name
        for path in _models_dir().glob("*/modeling_*.py")
        if ROTARY_CLASS.search(path.read_text(encoding="utf-8"))
    }
    return sorted(found)


# --------------------------------------------------------------------------------------
# Shrinking configs.

HIDDEN_KEYS = {
    "hidden_size",
    "d_model",
    "n_embd",
    "embed_dim",
    "dim",
    "hidden_dim",
    "width",
    "embedding_dim",
    "embedding_size",
    "lru_width",
    "out_hidden_size",
    "text_hidden_size",
    "thinker_hidden_size",
    "vision_output_dim",
    "projector_hidden_size",
    "projection_dim",
    "encoder_hidden_size",
    "decoder_hidden_size",
    "audio_hidden_size",
    "hidden_size_global",
    "attention_hidden_size",
    "moe_hidden_size",
    "cross_attention_hidden_size",
    "output_hidden_size",
    "projection_hidden_size",
    "projector_input_dim",
    "projector_output_dim",
    "projection_hidden_dim",
    "adapter_out_dim",
    "decoder_dim",
    "audio_embed_dim",
    "mm_embed_dim",
    "merged_hidden_size",
    "hidden_size_per_layer_input",
    "ple_embed_dim",
    "condition_dim",
}
HEAD_KEYS = {
    "num_attention_heads",
    "num_heads",
    "n_head",
    "n_heads",
    "attention_heads",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_num_attention_heads",
    "decoder_num_attention_heads",
    "index_n_heads",
    "linear_num_heads",
    "linear_num_key_heads",
    "num_sliding_attention_heads",
    "resampler_heads",
}
# which head count a KV head count is compared with: the attention's own first
_OWN_HEADS = ("num_attention_heads", "num_heads", "n_head", "n_heads", "attention_heads")
HEAD_ORDER = (*_OWN_HEADS, *sorted(HEAD_KEYS - set(_OWN_HEADS)))
KV_HEAD_KEYS = {
    "num_key_value_heads",
    "num_kv_heads",
    "kv_n_heads",
    "encoder_num_key_value_heads",
    "decoder_num_key_value_heads",
    "num_query_groups",
}
HEAD_DIM_KEYS = {
    "head_dim",
    "kv_channels",
    "attention_head_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_head_dim",
    "index_head_dim",
    "mamba_d_head",
    "mamba_head_dim",
    "mamba_headdim",
    "resampler_dim_head",
}
FFN_SUFFIXES = ("intermediate_size", "ffn_dim", "ffn_hidden_size", "mlp_dim", "intermediate_dim")
EXPERT_FFN_KEYS = {
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "moe_shared_expert_intermediate_size",
    "expert_ffn_hidden_size",
    "share_expert_dim",
    "shared_intermediate_size",
}
EXPERT_KEYS = {"num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"}
TOP_K_KEYS = {"num_experts_per_tok", "moe_k", "moe_topk", "moe_top_k", "num_experts_per_token"}
STATE_KEYS = {"mamba_d_state", "ssm_state_size", "d_state", "state_size"}
MLA = {
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "o_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
}
NONE_FILL = {
    "num_key_value_heads": HEADS,
    "num_experts_per_tok": TOP_K,
    "n_routed_experts": EXPERTS,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "vocab_size": 128,
}


def _alternate(*kinds: str) -> Callable[[Mapping[str, Any]], list[str]]:
    """Per-layer types cycling through ``kinds``, as many as the config has layers."""
    return lambda d: [kinds[i % len(kinds)] for i in range(d["num_hidden_layers"])]


def _first_dense(d: Mapping[str, Any]) -> list[str]:
    return ["dense"] + ["sparse"] * (d["num_hidden_layers"] - 1)


def _acoustic_and_semantic(d: Mapping[str, Any]) -> int:
    """The width of a codec's acoustic and semantic states concatenated (its quantizer's input)."""
    return int(d["hidden_size"] + d["semantic_model_config"]["hidden_size"])


def _last_layers(n: int) -> dict[str, Any]:
    """Overrides keeping the last ``n`` layers of every (sub-)config with ``layer_types``.

    Its other per-layer lists are cut to match; a config without ``layer_types`` keeps
    its depth (its layers may be sized by lists of another kind).
    """

    def cut(key: str) -> Callable[[Mapping[str, Any]], Any]:
        return lambda d: d[key][-n:] if d.get("layer_types") and d[key] else d[key]

    lists = ("layer_types", "mlp_layer_types", "layer_rope_theta")
    depth = {"num_hidden_layers": lambda d: n if d.get("layer_types") else d["num_hidden_layers"]}
    # the lists are cut after num_hidden_layers has read layer_types
    return {**depth, **{key: cut(key) for key in lists}}


def _sam_video(side: int) -> dict[str, Any]:
    """Overrides giving a SAM 2-style video tracker ``side`` x ``side`` frames.

    The image size is read in several places (the backbone's, the prompt encoder's, the
    feature map sizes per level and the memory attention's rotary grid, at strides 4 to
    16, and EdgeTAM's resampled memory grid) and these must agree. So must the widths:
    the memory is 64 wide (the memory attention's cross-attention reads 64 channels
    whatever the config says) and the model twice that, as in the released models (each
    object pointer is split into model width / 64 memory tokens, a step the code skips,
    wrongly, when the two are equal).
    """
    levels = [[side // s, side // s] for s in (4, 8, 16)]
    width = 2 * WIDTH
    return {
        "image_size": lambda d: [side, side] if isinstance(d["image_size"], list) else side,
        "backbone_feature_sizes": levels,
        "memory_attention_rope_feat_sizes": levels[-1],
        # EdgeTAM resamples the memory to a grid of windows of 2 x 2 features (rotated on
        # that grid): 16 x 16 from the released 64 x 64
        "memory_attention_rope_k_sizes": [side // 32, side // 32],
        "perceiver_resampler_num_latents_2d": (side // 32) ** 2,
        # Hiera's hidden_size is its first stage's width, the stages doubling from it
        "hidden_size": lambda d: d["hidden_size"] if "embed_dim_per_stage" in d else width,
        "embed_dim_per_stage": [WIDTH * 2**i for i in range(4)],
        "backbone_channel_list": [WIDTH * 2**i for i in (3, 2, 1, 0)],
        **dict.fromkeys(
            [
                "fpn_hidden_size",
                "memory_attention_hidden_size",
                "memory_encoder_hidden_size",
                "mask_downsampler_embed_dim",
                "memory_fuser_embed_dim",
            ],
            width,
        ),
        "memory_encoder_output_channels": 64,
        # one mask per click, not the best of three by predicted IoU (or by stability):
        # an argmax that flips on a near tie would make the output jump
        "multimask_output_in_sam": False,
        "dynamic_multimask_via_stability": False,
    }


# An OVERRIDES value that removes the key: a setting the config derives in __post_init__,
# which to_dict() writes out and from_dict() would pass back unchanged, unshrunk.
DERIVED = object()

# Per-family settings, applied after the generic shrink to every (sub-)config dict that
# has the key (set, or None): a value, or a callable of that dict. Most fill settings
# that the family's default config leaves unset but its model needs, or switch on the
# rotary path of hybrid models whose default config has no attention layer using it.
OVERRIDES: dict[str, dict[str, Any]] = {
    "bamba": {"attn_layer_indices": [1, 3]},
    "chameleon": {"vocabulary_map": {"<image>": 8196}},
    "cohere_compass": {
        "rope_parameters": lambda d: (
            d["rope_parameters"]
            or {
                t: {"rope_type": "default", "rope_theta": 10000.0}
                for t in set(d.get("layer_types") or ["full_attention"])
            }
        )
    },
    "deepseek_ocr2": {"mlp_layer_types": _first_dense},
    "diffusion_gemma": {
        "num_experts": EXPERTS,
        "top_k_experts": EXPERTS,
        "moe_intermediate_size": EXPERT_FFN,
    },
    "dots3_note": {
        "num_key_value_heads": HEADS,
        "head_dim": lambda d: d["qk_nope_head_dim"] + d["qk_rope_head_dim"],
    },
    # DBRX checkpoints name rope_theta in attn_config too, where its attention reads it, and
    # clip_qkv (with HF's default None its attention calls clamp() with no bound)
    "dbrx": {
        "attn_config": lambda d: {
            **d["attn_config"],
            "rope_theta": d["rope_parameters"]["rope_theta"],
            "clip_qkv": 8.0,
        }
    },
    # the backbone's last stage feeds the attention: its width must be hidden_size; the 2D
    # rotary fills hidden_size // 2 with head_dim * partial_rotary_factor (4.0) angles, so
    # the heads stay 2 * 4.0 = 8
    "efficientloftr": {
        "out_features": lambda d: [
            v * d["hidden_size"] // d["out_features"][-1] for v in d["out_features"]
        ],
        "num_attention_heads": 8,
        **dict.fromkeys(
            (
                "stage_in_channels",
                "stage_block_in_channels",
                "stage_block_out_channels",
                "fine_fusion_dims",
                "num_key_value_heads",
            ),
            DERIVED,
        ),
    },
    "esm": {"position_embedding_type": "rotary", "vocab_size": 33, "pad_token_id": 1},
    # the atom encoders' 3D rotary fills half a head (3 axes x 2 pairs + 10 UID pairs for
    # 32-wide heads): halved with the head. The atom stacks scatter into hidden_size-wide
    # tokens, and the single inputs are those plus two residue-type one-hots and a scalar.
    "esmfold2": {
        "num_spatial_rope_pairs_per_axis": 1,
        "num_uid_rope_pairs": 5,
        "output_dim": WIDTH,
        "single_inputs_size": lambda d: WIDTH + 2 * d["num_res_types"] + 1,
    },
    "glm5_next": {"num_key_value_heads": HEADS},
    "granitemoehybrid": {
        "position_embedding_type": "rope",
        "layer_types": _alternate("mamba", "attention"),
    },
    "lfm2_moe": {"layer_types": _alternate("conv", "full_attention")},
    "muse_spark": {
        # q and k are RMS-normalised and q then scaled by qk_scale_factor (5.5): attention
        # logits up to ~20 whatever the weights, near-hard attention; over its 62 layers a
        # table error of 5e-5 then moves the output as much as removing the rotation does
        "qk_scale_factor": 1.0,
        **_last_layers(16),
        # the vision adapter reads merge_size**2 concatenated vision states (the audio
        # config's out_hidden_size is the text width, and stays)
        "out_hidden_size": lambda d: (
            d["vision_config"]["hidden_size"] * d["vision_config"]["merge_size"] ** 2
            if "vision_config" in d
            else d["out_hidden_size"]
        ),
    },
    # the diarization model reaches the output only through speaker activities thresholded
    # at 0.5, which a table error of 1e-5 can flip: never active, the output is continuous
    "nemotron3_5_transcribe": {"speaker_activity_threshold": 1.0},
    # the first convolutions of these codecs run on raw audio, doubling the channels at
    # each stride: at 64 they take seconds, at 8 the encoder is still 128 wide at the end
    "mimi": {"num_filters": 8},
    "pe_audio": {"encoder_hidden_size": 8},
    # PE-AV's frame encoder is a timm ViT-L, and timm needs torchvision (absent; PyPI has
    # only CUDA builds of it): a tiny HF ViT classifier stands in, since the rotary module
    # runs in the temporal encoder over the frame embeddings, whatever made them
    "pe_audio_video": {"encoder_hidden_size": 8, "vision_config": lambda _d: _frame_encoder()},
    "pe_video": {"vision_config": lambda _d: _frame_encoder()},
    # (and their quantizer reads the acoustic and semantic states concatenated)
    "neucodec": {"encoder_hidden_size": 8, "quantization_dim": _acoustic_and_semantic},
    "xcodec2": {"encoder_hidden_size": 8, "quantization_dim": _acoustic_and_semantic},
    # HunYuan-VL's 4-axis M-RoPE reads its sections from the config (no module default)
    "hunyuan_vl": {
        "rope_parameters": lambda d: {**(d["rope_parameters"] or {}), "mrope_section": [2] * 4}
    },
    "qwen4_exp": {
        "indexer_n_heads": HEADS,
        "indexer_kv_heads": 1,
        "indexer_head_dim": HEAD_DIM,
        "indexer_budget": 8,
        "indexer_compress_ratio": 4,
    },
    **dict.fromkeys(["edgetam_video", "sam2_video"], _sam_video(128)),
    "sam3_tracker_video": {
        **_sam_video(128),
        # its 32-layer ViT backbone (rotary, no layer scale) at the common 0.2 is chaotic:
        # table noise of 5e-5 moved the masks by 1.4e4 (of 4.8e4), removing the rotation
        # by 5.7e4; at 0.1 by 15 and 6e3
        "initializer_range": lambda d: (
            0.1 if "global_attn_indexes" in d else d["initializer_range"]
        ),
    },
    "step3p7": {"sliding_window": 8},
    # Zamba2's shared attention block reads the concatenation of two hidden states
    "zamba2": {
        "use_mem_rope": True,
        "attention_hidden_size": 2 * WIDTH,
        "attention_head_dim": 2 * HEAD_DIM,
    },
    # ZAYA supports top-1 routing only
    "zaya": {"num_experts_per_tok": 1},
}


# Settings a family's config class does not declare but its model reads (the released
# checkpoints' config files have them), added to the top-level config when absent.
MISSING: dict[str, dict[str, Any]] = {
    "moonshine_streaming": {"num_key_value_heads": HEADS},
}


# Per-family parameters (by name suffix) drawn again, from a normal distribution of the
# given (mean, std), before the model is probed: mostly ones that the family's
# _init_weights sets to zero, which cuts the rotary path out of the output (a trained
# model's are not zero).
_SAM_VIDEO_WEIGHTS = {
    # the tracker judges whether the object is in the frame by the sign of this score,
    # and replaces every mask logit by -1024 when not: a random score's sign would decide
    # between an output that feels the rotary tables and a constant one
    "pred_obj_score_head.proj_out.bias": (30.0, 0.0),
}
WEIGHTS: dict[str, dict[str, tuple[float, float]]] = {
    # NeoMME zero-initialises each attention's output projection (and each MLP's down
    # projection), so that at initialisation no layer adds anything to the residual
    "neomme": {
        "output_projection.o_proj.weight": (0.0, INIT_RANGE),
        "mlp.down_proj.weight": (0.0, INIT_RANGE),
    },
    # ZAYA's learned per-head key scale starts at 0: every key is then 0, attention uniform
    "zaya": {"qk_norm.temp": (0.0, 1.0)},
    **dict.fromkeys(["edgetam_video", "sam2_video", "sam3_tracker_video"], _SAM_VIDEO_WEIGHTS),
}


def _frame_encoder() -> Any:
    """A small ViT image classifier config: PE-AV's stand-in per-frame encoder."""
    from transformers import ViTConfig

    config = ViTConfig(
        hidden_size=WIDTH,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        image_size=16,
        patch_size=8,
        initializer_range=INIT_RANGE,
    )
    config.num_labels = WIDTH  # the width of the frame embeddings
    return config


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_sub_config(value: Any) -> bool:
    return isinstance(value, dict) and "model_type" in value


def _shrink_int(key: str, value: int, original: Mapping[str, Any]) -> int:
    """The small value of one integer config entry (``value`` when it is not a size)."""
    if key in MLA:
        return min(value, MLA[key]) if value > 0 else value
    if key in HIDDEN_KEYS or (key.endswith("_hidden_size") and key not in EXPERT_FFN_KEYS):
        return min(value, WIDTH)
    if key in HEAD_KEYS:
        return min(value, HEADS)
    if key in KV_HEAD_KEYS:
        heads = next((original[k] for k in HEAD_ORDER if _is_int(original.get(k))), None)
        # multi-head attention stays multi-head, grouped stays grouped
        return min(value, HEADS) if value == heads else min(value, 2)
    if key == "linear_num_value_heads":
        keys = original.get("linear_num_key_heads")
        ratio = value // keys if _is_int(keys) and keys and value % keys == 0 else 1
        return min(value, HEADS * ratio)
    if key in HEAD_DIM_KEYS:
        return min(value, HEAD_DIM)
    if key in EXPERT_FFN_KEYS:
        return min(value, EXPERT_FFN)
    if key.endswith(FFN_SUFFIXES):
        return min(value, FFN)
    if key in EXPERT_KEYS:
        return min(value, EXPERTS)
    if key in TOP_K_KEYS:
        experts = next((original[k] for k in sorted(EXPERT_KEYS) if _is_int(original.get(k))), None)
        return min(experts, TOP_K) if experts else min(value, TOP_K)
    if key in ("n_group", "topk_group", "num_expert_group"):
        return 1
    if key in STATE_KEYS:
        return min(value, 16)
    if key in ("mamba_chunk_size", "chunk_size") and any(k in original for k in STATE_KEYS):
        # Mamba-2's scan pads the sequence to whole chunks: 16 positions, not 256, per forward
        return min(value, 16)
    if key.endswith("_groups") and value == original.get("hidden_size"):
        # a depthwise convolution over the hidden channels (Mimi's upsampler) stays depthwise
        return _shrink_int("hidden_size", value, original)
    return value


def _rescale_section(section: list[int], total: int) -> list[int]:
    """``section`` scaled to sum to ``total``, by largest remainders (each part >= 1)."""
    whole = sum(section)
    raw = [s * total / whole for s in section]
    parts = [max(1, math.floor(r)) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - math.floor(raw[i]), reverse=True)
    i = 0
    while sum(parts) < total:
        parts[order[i % len(order)]] += 1
        i += 1
    while sum(parts) > total:
        j = max(range(len(parts)), key=lambda k: parts[k])
        parts[j] -= 1
    return parts


def _head_dim(d: Mapping[str, Any]) -> int | None:
    if _is_int(d.get("head_dim")):
        return int(d["head_dim"])
    hidden = next((d[k] for k in ("hidden_size", "d_model", "n_embd") if _is_int(d.get(k))), None)
    heads = next(
        (d[k] for k in ("num_attention_heads", "num_heads", "n_head") if _is_int(d.get(k))), None
    )
    if hidden and heads:
        return int(hidden) // int(heads)
    return None


def _shrink_rope(params: Any, old_dim: int | None, new_dim: int | None) -> Any:
    """Rope parameters whose per-frequency lists and M-RoPE sections follow the new head_dim."""
    if not isinstance(params, dict) or not old_dim or not new_dim:
        return params
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, dict):
            out[key] = _shrink_rope(value, old_dim, new_dim)
        elif key == "mrope_section":
            out[key] = value  # _fix_mrope rescales it
        elif isinstance(value, list) and len(value) in (old_dim // 2, old_dim):
            out[key] = value[: new_dim // 2 if len(value) == old_dim // 2 else new_dim]
        else:
            out[key] = value
    return out


def _rope_dicts(params: Any) -> list[dict[str, Any]]:
    """The rope parameter dicts in ``params``: itself, or one per layer type."""
    if not isinstance(params, dict):
        return []
    if "rope_type" in params or "rope_theta" in params or "mrope_section" in params:
        return [params]
    return [v for v in params.values() if isinstance(v, dict)]


def _fix_mrope(new: dict[str, Any], default: list[int] | None) -> None:
    """Scale M-RoPE sections (the config's, or the module's default) to the new head_dim.

    The sections split the rotary half-dimension; scaled with the head, each must keep
    at least one frequency, so a head too small for them is widened.
    """
    for rope in _rope_dicts(new.get("rope_parameters")):
        section = rope.get("mrope_section") or default
        if not section:
            continue
        partial = rope.get("partial_rotary_factor", new.get("partial_rotary_factor")) or 1.0
        head = _head_dim(new) or HEAD_DIM
        if head * partial < 2 * len(section):
            head = 4 * math.ceil(len(section) / partial / 2)
            new["head_dim"] = head
        rope["mrope_section"] = _rescale_section(list(section), int(head * partial) // 2)


def _even_rotary(new: dict[str, Any], old_dim: int | None) -> None:
    """Widen ``head_dim`` until each partial rotary dim is even, as the full config's are.

    HF rotates ``int(head_dim * partial_rotary_factor)`` dims: 192 * 0.334 gives 64, but
    the small 16 * 0.334 gives 5, an odd rotary dim no real checkpoint has.
    """
    factors = [new.get("partial_rotary_factor")]
    for key in ("rope_parameters", "rope_scaling"):
        factors += [r.get("partial_rotary_factor") for r in _rope_dicts(new.get(key))]
    # only the factors whose full-size rotary dim is even (a factor of 4.0 is no fraction)
    parts = [f for f in factors if isinstance(f, float) and 0 < f < 1]
    parts = [f for f in parts if old_dim and int(old_dim * f) % 2 == 0 and int(old_dim * f)]
    if not _is_int(new.get("head_dim")) or not parts:
        return
    head = int(new["head_dim"])
    for wider in range(head, 8 * head + 1, 2):
        if all(int(wider * f) % 2 == 0 and int(wider * f) for f in parts):
            new["head_dim"] = wider
            return


def _shrink_layer(
    layer: dict[str, Any], full: Mapping[str, Any], small: Mapping[str, Any]
) -> dict[str, Any]:
    """One ``per_layer_config`` entry (the settings where a layer differs), made small."""
    out: dict[str, Any] = {}
    for key, value in layer.items():
        if not _is_int(value):
            out[key] = value
        elif key in HEAD_DIM_KEYS and _is_int(full.get(key)) and _is_int(small.get(key)):
            # a layer's heads keep their width relative to the others' (Gemma 4's global
            # layers have heads twice as wide as its sliding ones)
            out[key] = max(1, value * small[key] // full[key])
        else:
            out[key] = _shrink_int(key, value, {**full, **layer})
    return out


def shrink(config: dict[str, Any], mrope_default: list[int] | None = None) -> dict[str, Any]:
    """A config dict (``to_dict()``) with its sizes made small, sub-configs included.

    Args:
        config: a config's ``to_dict()``.
        mrope_default: the M-RoPE sections the family's rotary module assumes when the
            config names none (they must shrink with the head too).
    """
    old_dim = _head_dim(config)
    out: dict[str, Any] = {}
    for key, value in config.items():
        if _is_sub_config(value):
            out[key] = shrink(value, mrope_default)
        elif _is_int(value):
            out[key] = _shrink_int(key, value, config)
        elif (
            isinstance(value, list)
            and value
            and all(_is_int(v) for v in value)
            and (key in EXPERT_FFN_KEYS or key.endswith(FFN_SUFFIXES))
        ):
            out[key] = [min(v, EXPERT_FFN if key in EXPERT_FFN_KEYS else FFN) for v in value]
        else:
            out[key] = value
    for key, value in NONE_FILL.items():
        # some default configs leave a size unset that their models then need
        if key in out and out[key] is None:
            out[key] = value
    if "head_dim" in out and out["head_dim"] is None and "num_attention_heads" in out:
        out["head_dim"] = HEAD_DIM
    if "initializer_range" in out and isinstance(out["initializer_range"], float):
        out["initializer_range"] = INIT_RANGE
    if _is_int(config.get("head_dim")) and config.get("head_dim") == config.get("qk_rope_head_dim"):
        # MLA (DeepSeek): head_dim names the rotary part of each head
        out["head_dim"] = out["qk_rope_head_dim"]
    _even_rotary(out, old_dim)
    new_dim = _head_dim(out)
    if "qk_head_dim" in out and _is_int(out.get("qk_nope_head_dim")):
        out["qk_head_dim"] = out["qk_nope_head_dim"] + out.get("qk_rope_head_dim", 0)
    if _is_int(out.get("rotary_dim")) and old_dim and new_dim:
        out["rotary_dim"] = max(2, out["rotary_dim"] * new_dim // old_dim // 2 * 2)
    if _is_int(out.get("mamba_n_heads")) and _is_int(out.get("mamba_d_head")):
        expand = out.get("mamba_expand", 2)
        inner = int(expand * out.get("hidden_size", WIDTH))
        if _is_int(out.get("mamba_d_ssm")):
            # Falcon-H1 names the Mamba inner width apart from expand * hidden_size
            inner = out["mamba_d_ssm"] = min(out["mamba_d_ssm"], inner)
        out["mamba_n_heads"] = max(1, inner // out["mamba_d_head"])
    for key in ("rope_parameters", "rope_scaling"):
        if key in out:
            rope_dim = old_dim
            if _is_int(out.get("qk_rope_head_dim")) and _is_int(config.get("qk_rope_head_dim")):
                rope_dim, new_rope = config["qk_rope_head_dim"], out["qk_rope_head_dim"]
                out[key] = _shrink_rope(out[key], rope_dim, new_rope)
            else:
                out[key] = _shrink_rope(out[key], old_dim, new_dim)
    _fix_mrope(out, mrope_default)
    if isinstance(out.get("per_layer_config"), dict):
        out["per_layer_config"] = {
            i: _shrink_layer(layer, config, out) for i, layer in out["per_layer_config"].items()
        }
    for key in list(out):
        # layer counts stay (see the module docstring); image sizes shrink to 4x4 patches
        if key == "image_size" and _is_int(out.get("patch_size")):
            value = out[key]
            small = 4 * out["patch_size"]
            out[key] = [small, small] if isinstance(value, list) else small
    return out


def _apply_overrides(family: str, config: dict[str, Any]) -> None:
    override = OVERRIDES.get(family, {})
    for value in config.values():
        if _is_sub_config(value):
            _apply_overrides(family, value)
    for key, value in override.items():
        if key in config and value is DERIVED:
            del config[key]
        elif key in config:
            config[key] = value(config) if callable(value) else value


# --------------------------------------------------------------------------------------
# Building models.


def _family_modules(family: str) -> list[Any]:
    folder = _models_dir() / family
    names = sorted(p.stem for p in folder.glob("modeling_*.py"))
    return [importlib.import_module(f"transformers.models.{family}.{n}") for n in names]


def _model_classes(family: str) -> list[type]:
    """The family's concrete model classes, best first: causal LM, base model, the rest."""
    from transformers import PreTrainedModel

    modules = _family_modules(family)
    seen: dict[str, type] = {}
    for module in modules:
        for name, obj in vars(module).items():
            if (
                isinstance(obj, type)
                and issubclass(obj, PreTrainedModel)
                and obj.__module__ == module.__name__
                and not name.endswith("PreTrainedModel")
                and getattr(obj, "config_class", None) is not None
            ):
                seen[name] = obj

    def rank(name: str) -> tuple[int, int, str]:
        if name.endswith("ForCausalLM"):
            r = 0
        elif name.endswith("Model") and "For" not in name:
            r = 1
        elif name.endswith("ForConditionalGeneration"):
            r = 2
        else:
            r = 3
        return (r, len(name), name)

    return [seen[n] for n in sorted(seen, key=rank)]


def _rotary_names(model: Any) -> list[str]:
    return [
        name
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RotaryEmbedding")
    ]


MROPE_DEFAULT = re.compile(r"\"mrope_section\",\s*(\[[\d,\s]+\])")


def _mrope_default(family: str) -> list[int] | None:
    """The ``mrope_section`` the family's rotary module falls back on, read from its source."""
    for path in sorted((_models_dir() / family).glob("modeling_*.py")):
        match = MROPE_DEFAULT.search(path.read_text(encoding="utf-8"))
        if match:
            return [int(v) for v in json.loads(match.group(1))]
    return None


def build_config(family: str, model_cls: type) -> Any:
    """A small config of ``model_cls``'s config class: its defaults, shrunk."""
    config_cls = model_cls.config_class  # type: ignore[attr-defined]
    full = config_cls().to_dict()
    small = shrink(full, _mrope_default(family))
    _apply_overrides(family, small)
    for key, value in MISSING.get(family, {}).items():
        small.setdefault(key, value)
    config = config_cls.from_dict(small)
    return config


def _instantiate(model_cls: type, config: Any, family: str = "") -> Any:
    import torch

    torch.manual_seed(0)
    with torch.device("cpu"):
        model = model_cls(config)
    weights = WEIGHTS.get(family, {})
    with torch.no_grad():
        for name, param in model.named_parameters():
            drawn = next((v for k, v in weights.items() if name.endswith(k)), None)
            if drawn is not None:
                param.normal_(*drawn)
    return model.float().eval()


def tiny_model(family: str) -> Any:
    """A small random-weight model of ``family`` that contains a rotary module, in eval mode.

    The family's model classes are tried best first (:func:`_model_classes`); the
    first that builds, holds a ``*RotaryEmbedding`` and runs a forward on
    :func:`probe_inputs` is kept.

    Raises:
        RuntimeError: no class of the family could; the message lists each class's error.
    """
    return _tiny(family)[0]


def _tiny(family: str) -> tuple[Any, dict[str, Any], Any, list[str]]:
    """The model of :func:`tiny_model`, its probe inputs, its output, and the classes skipped."""
    import torch

    torch.set_default_dtype(torch.float32)
    errors: list[str] = []
    for model_cls in _model_classes(family):
        try:
            model = _instantiate(model_cls, build_config(family, model_cls), family)
            if not _rotary_names(model):
                errors.append(f"{model_cls.__name__}: no rotary module")
                continue
            kwargs = probe_inputs(model)
            output = _forward(model, kwargs)
        except Exception as exc:
            errors.append(f"{model_cls.__name__}: {_describe(exc)}")
            continue
        return model, kwargs, output, errors
    if not errors:
        errors.append("no model classes")
    raise RuntimeError(" | ".join(errors))


# --------------------------------------------------------------------------------------
# Inputs and outputs.


def _special_ids(config: Any) -> set[int]:
    """Every integer a config names as a token id, at any depth."""
    ids: set[int] = set()

    def visit(d: Mapping[str, Any]) -> None:
        for key, value in d.items():
            key = str(key)
            if isinstance(value, Mapping):
                visit(value)
            elif key.endswith(("token_id", "token_ids", "token_index", "_id")) or "token" in key:
                values = value if isinstance(value, list) else [value]
                ids.update(v for v in values if _is_int(v))

    visit(config.to_dict())
    return ids


def _vocab_size(model: Any) -> int:
    try:
        emb = model.get_input_embeddings()
        size = getattr(emb, "num_embeddings", None)
        if isinstance(size, int):
            return size
    except (NotImplementedError, AttributeError):
        pass
    text = (
        model.config.get_text_config(decoder=True)
        if hasattr(model.config, "get_text_config")
        else model.config
    )
    return int(getattr(text, "vocab_size", 0) or 128)


def _token_ids(model: Any, n: int = SEQ_LEN) -> Any:
    import torch

    specials = _special_ids(model.config)
    vocab = _vocab_size(model)
    pool = [i for i in range(3, min(vocab, 4096)) if i not in specials]
    gen = torch.Generator().manual_seed(1)
    pick = torch.randint(0, len(pool), (1, n), generator=gen)
    return torch.tensor(pool)[pick]


def _pixels(config: Any) -> Any:
    """A random image batch of one, at the (shrunk) size the vision config names."""
    import torch

    vision = getattr(config, "vision_config", None) or config
    size = getattr(vision, "image_size", None) or 4 * getattr(vision, "patch_size", 14)
    size = size if isinstance(size, (list, tuple)) else (size, size)
    channels = getattr(vision, "num_channels", None) or 3
    gen = torch.Generator().manual_seed(3)
    return torch.randn(1, channels, *size, generator=gen)


# spectrogram frames for about SEQ_LEN encoder positions: the audio encoders here subsample
# their frames by at most 8 (Voxtral Realtime's by exactly 8, its text then has SEQ_LEN tokens)
AUDIO_FRAMES = 8 * SEQ_LEN


def _config_value(config: Any, keys: Iterable[str]) -> Any:
    """The first of ``keys`` set in ``config`` or its sub-configs, shallowest first."""
    keys = tuple(keys)
    level = [config.to_dict()]
    while level:
        for d in level:
            for key in keys:
                if d.get(key) is not None:
                    return d[key]
        level = [v for d in level for v in d.values() if _is_sub_config(v)]
    return None


def _spectrogram(config: Any, time_first: bool, frames: int = AUDIO_FRAMES) -> Any:
    """A random spectrogram with the bins the config names."""
    import torch

    bins = _config_value(config, ("num_mel_bins", "feature_size", "feature_projection_input_dim"))
    shape = (1, frames, bins) if time_first else (1, bins, frames)
    return torch.randn(shape, generator=torch.Generator().manual_seed(4))


def _waveform(config: Any) -> Any:
    """Random audio, (1, channels, samples): SEQ_LEN frames of the codec's encoder.

    A codec's encoder strides by its ``downsampling_ratios`` (Mimi's names the decoder's
    ``upsampling_ratios``, the same strides reversed): their product is one frame.
    """
    import torch

    ratios = _config_value(config, ("downsampling_ratios", "upsampling_ratios"))
    channels = _config_value(config, ("audio_channels",)) or 1
    shape = (1, channels, SEQ_LEN * math.prod(ratios))
    return torch.randn(shape, generator=torch.Generator().manual_seed(4))


def _audio_probe(
    time_first: bool = True, frames: int = AUDIO_FRAMES
) -> Callable[[Any], dict[str, Any]]:
    """A probe giving every audio input the forward takes, and text tokens if it takes them.

    Args:
        time_first: the spectrogram's layout, (1, frames, bins) or (1, bins, frames).
        frames: the spectrogram's length.
    """

    def probe(model: Any) -> dict[str, Any]:
        params = inspect.signature(model.forward).parameters
        kwargs: dict[str, Any] = {}
        if "input_values" in params:
            kwargs["input_values"] = _waveform(model.config)
        if "input_features" in params:
            kwargs["input_features"] = _spectrogram(model.config, time_first, frames)
        if "input_ids" in params:
            kwargs["input_ids"] = _token_ids(model)
        if "use_cache" in params:
            kwargs["use_cache"] = False
        return kwargs

    return probe


def _judged_elsewhere(why: str) -> Callable[[Any], dict[str, Any]]:
    """A probe that refuses a model class, so that the family's next class is tried."""

    def probe(model: Any) -> dict[str, Any]:
        raise NotImplementedError(f"{type(model).__name__}: {why}")

    return probe


def _frames_and_text(model: Any) -> dict[str, Any]:
    """Moonshine Streaming's input: raw audio (no channel axis), in frames of ``frame_ms``."""
    import torch

    encoder = model.config.encoder_config
    samples = AUDIO_FRAMES * round(encoder.sample_rate * encoder.frame_ms / 1000)
    audio = torch.randn(1, samples, generator=torch.Generator().manual_seed(4))
    return {"input_values": audio, "decoder_input_ids": _token_ids(model), "use_cache": False}


def _codebook_tokens(model: Any) -> dict[str, Any]:
    """Kyutai's input: per position, a text token and one token per audio codebook."""
    import torch

    config = model.config
    text = _token_ids(model)
    gen = torch.Generator().manual_seed(5)
    shape = (1, SEQ_LEN, config.num_codebooks)
    audio = torch.randint(0, config.codebook_vocab_size - 1, shape, generator=gen)
    return {"input_ids": torch.cat([text[..., None], audio], dim=-1), "use_cache": False}


def _series(model: Any) -> dict[str, Any]:
    """A random time series of SEQ_LEN patches."""
    import torch

    length = SEQ_LEN * model.config.patch_length
    return {"past_values": torch.randn(1, length, generator=torch.Generator().manual_seed(4))}


def _noise_and_context(model: Any) -> dict[str, Any]:
    """A block-diffusion drafter's input: a block of noise embeddings and the target's states.

    The context is SEQ_LEN positions of the target model's hidden states, one slice per
    layer the drafter reads (``target_layer_ids``).
    """
    import torch

    config = model.config
    gen = torch.Generator().manual_seed(4)
    width = config.hidden_size
    noise = torch.randn(1, config.block_size, width, generator=gen)
    context = torch.randn(1, SEQ_LEN, width * len(config.target_layer_ids), generator=gen)
    return {"noise_embeds": noise, "context_hidden_states": context, "use_cache": False}


def _patch_values(model: Any) -> int:
    """How many values one patch feeds the vision tower: its patch embedding's fan-in."""
    import torch

    for name, module in model.named_modules():
        if "patch" in name and isinstance(module, (torch.nn.Linear, torch.nn.Conv3d)):
            return int(module.weight[0].numel())
    raise NotImplementedError(f"no patch embedding found in {type(model).__name__}")


def _grid_image(model: Any, tokens_grid: bool = False) -> dict[str, Any]:
    """Text with one image, for models whose rotary (or only rotary) is the vision tower's.

    The image is given as Qwen2-VL's processor gives it: flattened patches in the order
    the tower merges them, and ``image_grid_thw``; its grid is 2 x 2 merged patches, as
    many image tokens in the text. Without the image such a model never runs its vision
    rotary, and a text model without rotary (NoPE) would have nothing to check at all.

    Args:
        tokens_grid: the grid is counted in image tokens (merged patches), not patches.
    """
    import torch

    vision = model.config.vision_config
    merge = getattr(vision, "spatial_merge_size", None) or getattr(vision, "merge_size", None) or 1
    side = 2 * int(merge)
    gen = torch.Generator().manual_seed(3)
    pixels = torch.randn(side * side, _patch_values(model), generator=gen)
    grid = [1, 2, 2] if tokens_grid else [1, side, side]
    ids = _token_ids(model)
    ids[0, 2:6] = model.config.image_token_id
    return {
        "input_ids": ids,
        "pixel_values": pixels,
        "image_grid_thw": torch.tensor([grid]),
        "use_cache": False,
    }


def _inkling2(model: Any) -> dict[str, Any]:
    # one entry per image token: its merge x merge patches as pixels, channels last
    kwargs = _grid_image(model, tokens_grid=True)
    vision = model.config.vision_config
    side = vision.patch_size * vision.spatial_merge_size
    n = kwargs["input_ids"].eq(model.config.image_token_id).sum()
    kwargs["pixel_values"] = kwargs["pixel_values"].reshape(int(n), side, side, -1)
    return kwargs


def _row_column(model: Any) -> dict[str, Any]:
    """Text placed on a 3 x 4 grid: row and column positions differ, as in a document image.

    With text positions (the same index on both axes) a table that swapped or mixed
    the two axes would give the same output.
    """
    import torch

    index = torch.arange(SEQ_LEN)
    return {
        "input_ids": _token_ids(model),
        "position_ids": torch.stack([index // 4, index % 4])[:, None, :],
    }


def _idefics(model: Any) -> dict[str, Any]:
    # its forward needs an image (the text cross-attends to it), one per sequence, seen by
    # every token
    import torch

    return {
        "input_ids": _token_ids(model),
        "pixel_values": _pixels(model.config)[:, None],
        "image_attention_mask": torch.ones(1, SEQ_LEN, 1, dtype=torch.long),
        "use_cache": False,
    }


def _video_session(model: Any) -> dict[str, Any]:
    """The second frame of a two-frame video, tracking an object clicked on the first.

    SAM 2-style trackers run their rotary (in the memory attention) only on a frame
    that attends to earlier frames' memories: the probe builds an inference session as
    the processor would, runs the first frame (the click, which makes its memory), and
    returns the forward of the second. That forward reads frame 0's stored outputs and
    stores its own under frame 1, which no later forward of frame 1 reads: it can be
    repeated.
    """
    import torch

    module = importlib.import_module(type(model).__module__)
    session_cls = next(v for k, v in vars(module).items() if k.endswith("InferenceSession"))
    side = model.config.image_size
    gen = torch.Generator().manual_seed(3)
    video = torch.randn(2, 3, side, side, generator=gen)
    session = session_cls(video, side, side, dtype=torch.float32)
    obj_idx = session.obj_id_to_idx(1)
    click = {
        "point_coords": torch.tensor([[[[side / 3, side / 2]]]]),
        "point_labels": torch.ones(1, 1, 1, dtype=torch.int32),
    }
    session.add_point_inputs(obj_idx, 0, click)
    session.obj_with_new_inputs = [1]
    with torch.no_grad():
        model(inference_session=session, frame_idx=0)
    # keep no frame's vision features: each forward then runs the backbone (SAM 3's has
    # rotary layers) instead of reusing what the unpatched model computed
    session.cache.cache_vision_features = lambda *args, **kwargs: None
    return {"inference_session": session, "frame_idx": 1}


def _image_pair(model: Any) -> dict[str, Any]:
    """Two 64x64 images to match: the coarse map is 8x8, 2x2 once aggregated."""
    import torch

    gen = torch.Generator().manual_seed(3)
    return {"pixel_values": torch.randn(1, 2, 3, 64, 64, generator=gen)}


def _video(model: Any) -> dict[str, Any]:
    """SEQ_LEN - 1 frames of 16x16 (the encoder prepends a class token)."""
    import torch

    gen = torch.Generator().manual_seed(3)
    return {"pixel_values_videos": torch.randn(1, SEQ_LEN - 1, 3, 16, 16, generator=gen)}


def _audio_and_video(model: Any) -> dict[str, Any]:
    """The frames of :func:`_video` and SEQ_LEN frames of audio."""
    return {**_audio_probe()(model), **_video(model)}


def _protein(model: Any) -> dict[str, Any]:
    """A protein of SEQ_LEN // 2 residues of 2 atoms each, for ESMFold2's trunk.

    Its atom encoder's rotary angles are atom coordinates and token ids (3D RoPE).
    """
    import torch
    from transformers.models.esmfold2.modeling_esmfold2 import EsmFold2AtomInputs

    config = model.config
    tokens, atoms = SEQ_LEN // 2, SEQ_LEN
    gen = torch.Generator().manual_seed(4)
    index = torch.arange(tokens)[None]
    owner = index.repeat_interleave(atoms // tokens, dim=1)
    zeros = torch.zeros(1, tokens, dtype=torch.long)
    atom_inputs = EsmFold2AtomInputs(
        ref_pos=torch.randn(1, atoms, 3, generator=gen),
        ref_charge=torch.zeros(1, atoms),
        atom_attention_mask=torch.ones(1, atoms, dtype=torch.bool),
        ref_element=torch.randint(1, config.max_atomic_number, (1, atoms), generator=gen),
        ref_atom_name_chars=torch.randint(
            0, config.char_vocab_size, (1, atoms, config.max_chars), generator=gen
        ),
        ref_space_uid=owner,
        atom_to_token=owner,
    )
    return {
        "token_index": index,
        "residue_index": index,
        "asym_id": zeros,
        "sym_id": zeros,
        "entity_id": zeros,
        "mol_type": zeros,
        "res_type": torch.randint(0, 20, (1, tokens), generator=gen),
        "token_bonds": torch.zeros(1, tokens, tokens, 1),
        "attention_mask": torch.ones(1, tokens, dtype=torch.long),
        "atom_inputs": atom_inputs,
        "num_loops": 1,  # the rotary runs once, before the trunk's loops
    }


# Inputs of models whose forward takes other things than token ids or an image, keyed by
# config model_type or model class name.
PROBES: dict[str, Callable[[Any], dict[str, Any]]] = {
    # a code flipped by a table error of 1e-5 would move the decoded audio by O(1)
    "MimiModel": _judged_elsewhere("quantizes between its encoder and decoder"),
    # all its rotary modules are in the audio model; its language model (Nemotron-H, 52
    # layers, no rotary) would take most of the time
    "Nemotron3_5TranscribeModel": _judged_elsewhere("judged on its audio model"),
    "nemotron3_5_transcribe_audio": _audio_probe(),
    "lasr_ctc": _audio_probe(),
    "nemotron3_diarization": _audio_probe(),
    "voxtral_realtime": _audio_probe(time_first=False),
    # the semantic encoder's features come at the acoustic encoder's frame rate
    "neucodec": _audio_probe(frames=SEQ_LEN),
    "xcodec2": _audio_probe(frames=SEQ_LEN),
    "pe_audio_encoder": _audio_probe(),
    "mimi_encoder": _audio_probe(),
    "pocket_tts_audio_tokenizer": _audio_probe(),
    "kyutai_speech_to_text": _codebook_tokens,
    "moonshine_streaming": _frames_and_text,
    "timesfm2_5": _series,
    "muse_glimmer_assistant": _noise_and_context,
    # the rotary is (or is only exercised) in the vision tower, or needs other inputs
    "glm5_next": _grid_image,
    "idefics": _idefics,
    "inkling2": _inkling2,
    "muse_spark": _grid_image,
    "neomme": _row_column,
    **dict.fromkeys(["edgetam_video", "sam2_video", "sam3_tracker_video"], _video_session),
    "efficientloftr": _image_pair,
    "esmfold2": _protein,
    # the video-text (and audio-video) logits have zero-initialised scales: always 0
    "PeVideoModel": _judged_elsewhere("its logits are 0 times a similarity"),
    "PeAudioVideoModel": _judged_elsewhere("its logits are 0 times a similarity"),
    "pe_video_encoder": _video,
    "pe_audio_video_encoder": _audio_and_video,
}


def probe_inputs(model: Any) -> dict[str, Any]:
    """Keyword arguments for a forward of ``model`` that runs its rotary module(s)."""
    import torch

    family = getattr(model.config, "model_type", "")
    for key in (family, type(model).__name__):
        if key in PROBES:
            return PROBES[key](model)
    params = inspect.signature(model.forward).parameters
    kwargs: dict[str, Any] = {}
    if "input_ids" in params:
        kwargs["input_ids"] = _token_ids(model)
    if "decoder_input_ids" in params and "input_ids" in params:
        kwargs["decoder_input_ids"] = _token_ids(model, SEQ_LEN // 2)
    if "use_cache" in params:
        kwargs["use_cache"] = False
    if "input_ids" not in kwargs and "pixel_values" in params:
        kwargs["pixel_values"] = _pixels(model.config)
        if "image_sizes" in params:
            kwargs["image_sizes"] = torch.tensor([kwargs["pixel_values"].shape[-2:]])
    if not kwargs or set(kwargs) == {"use_cache"}:
        raise NotImplementedError(
            f"no probe for {type(model).__name__}: forward takes {list(params)[:6]}"
        )
    return kwargs


def main_output(output: Any) -> Any:
    """The tensor a forward is judged by: logits, the last hidden state, a feature map, a tensor."""
    import torch

    if isinstance(output, torch.Tensor):
        return output
    for name in ("logits", "last_hidden_state", "prediction_logits", "audio_values"):
        value = getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    maps = getattr(output, "feature_maps", None)
    if isinstance(maps, tuple) and maps and isinstance(maps[0], torch.Tensor):
        # a backbone's outputs: EfficientLoFTR's first map is the one its attention made
        return maps[0]
    items = output.values() if isinstance(output, Mapping) else output
    for value in items:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    raise TypeError(f"no tensor in the output ({type(output).__name__})")


def _forward(model: Any, kwargs: Mapping[str, Any]) -> Any:
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        return main_output(model(**kwargs)).detach().float().clone()


# |posenc - HF| for the tables over SEQ_LEN positions (tests/test_hf.py derives it):
# s (P omega (delta + 2**-24) + 2**-22), HF's frequency error delta being a few 2**-23
# plus ln(base) of them (<= 30 2**-23 for base <= 1e10); omega <= 1, s <= about 1.5
TABLE_ERROR = 1.5 * (SEQ_LEN * 31 * 2.0**-23 + 2.0**-22)


def tolerance(scale: float, floor: float = 0.0) -> float:
    """How far the patched output may move from the original.

    posenc's tables differ from HF's float32 ones by at most ``TABLE_ERROR`` (about
    ``5e-5`` over these positions). How much a table error moves the output depends
    on the model: measured here as ``floor``, the output's response when HF's own
    tables are moved by ``TABLE_ERROR`` in random directions; the patched model may
    move 4 times that. Deep random models amplify the error chaotically, so ``floor``
    is what keeps the check honest for them; ``1e-4`` of the output's scale is the
    least allowed (a shallow model can respond less to noise than to a systematic
    shift of the same size). A wrong table (another rotary dim, section order,
    scaling) moves the output by O(scale), far beyond either.
    """
    bound = max(1e-4 * scale, 4 * floor) if math.isfinite(floor) else 1e-4 * scale
    return bound + 1e-30


# --------------------------------------------------------------------------------------
# The check.


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text[:limit] + ("..." if len(text) > limit else "")


def _where(exc: BaseException) -> str:
    """The innermost frame of ``exc``'s traceback: file:line (function)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    path = f.filename
    for marker in ("site-packages/", "/src/", "/tests/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f" [at {path}:{f.lineno} {f.name}]"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_one_line(exc)}{_where(exc)}"


def _tensors(out: Any) -> list[Any]:
    """The tensors of a rotary output: itself, or the members of its tuple, in order."""
    import torch

    items = out if isinstance(out, (tuple, list)) else (out,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def _record_outputs(model: Any, names: Iterable[str]) -> tuple[dict[str, list[Any]], list[Any]]:
    """Hooks that keep every output of the modules ``names``, call by call, per module."""
    outputs: dict[str, list[Any]] = {}
    handles = []
    for name in names:

        def hook(_m: Any, _args: Any, out: Any, name: str = name) -> None:
            outputs.setdefault(name, []).append(out)

        handles.append(model.get_submodule(name).register_forward_hook(hook))
    return outputs, handles


def _table_diff(ours: Mapping[str, list[Any]], theirs: Mapping[str, list[Any]]) -> float:
    """The largest entry difference, relative to each table's scale, between two recordings.

    Infinite when the recordings differ in their calls, structure, shapes or dtypes.
    """
    worst = 0.0
    if set(ours) != set(theirs):
        return math.inf
    for name, calls in theirs.items():
        if len(ours[name]) != len(calls):
            return math.inf
        for a_out, b_out in zip(ours[name], calls, strict=True):
            a, b = _tensors(a_out), _tensors(b_out)
            if len(a) != len(b) or type(a_out) is not type(b_out):
                return math.inf
            for x, y in zip(a, b, strict=True):
                if x.shape != y.shape or x.dtype != y.dtype:
                    return math.inf
                if not x.is_floating_point() and not x.is_complex():
                    if not bool((x == y).all()):
                        return math.inf
                    continue
                scale = float(y.abs().amax().clamp(min=1.0)) if y.numel() else 1.0
                diff = float((x - y).abs().amax()) if x.numel() else 0.0
                worst = max(worst, diff / scale)
    return worst


def _with_outputs(model: Any, recorded: Mapping[str, list[Any]], kwargs: Mapping[str, Any]) -> Any:
    """The model's output when each module in ``recorded`` returns its recorded outputs."""
    handles = []
    for name, calls in recorded.items():
        queue = list(calls)

        def hook(_m: Any, _args: Any, _out: Any, queue: list[Any] = queue) -> Any:
            if not queue:
                raise RuntimeError("the patched model called a rotary module more often")
            return queue.pop(0)

        handles.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        return _forward(model, kwargs)
    finally:
        for h in handles:
            h.remove()


def _record_calls(model: Any, names: Iterable[str]) -> tuple[list[str], list[Any]]:
    called: list[str] = []
    handles = []
    for name in names:
        module = model.get_submodule(name)

        def hook(_m: Any, _args: Any, _out: Any, name: str = name) -> None:
            if name not in called:
                called.append(name)

        handles.append(module.register_forward_hook(hook))
    return called, handles


def _no_rotation(out: Any) -> Any:
    """A rotary output that rotates by nothing: cos 1 and sin 0 (angles 0 for raw angles)."""
    import torch

    if isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out):
        return torch.ones_like(out[0]), torch.zeros_like(out[1])
    if isinstance(out, torch.Tensor):
        return torch.zeros_like(out)
    return out


def _table_noise(out: Any) -> Any:
    """A rotary output moved by ``TABLE_ERROR`` in random directions, entry by entry."""
    import torch

    gen = torch.Generator().manual_seed(2)

    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        sign = torch.randint(0, 2, t.shape, generator=gen).to(t.dtype) * 2 - 1
        return t + TABLE_ERROR * sign * t.abs().amax().clamp(min=1.0)

    if isinstance(out, tuple):
        return tuple(move(t) for t in out)
    return move(out)


def _respond(
    model: Any,
    names: Iterable[str],
    kwargs: Mapping[str, Any],
    ref: Any,
    change: Callable[[Any], Any],
) -> float:
    """How far the output moves when every rotary module's output goes through ``change``."""
    handles = [
        model.get_submodule(n).register_forward_hook(lambda _m, _a, out: change(out)) for n in names
    ]
    try:
        moved = _forward(model, kwargs)
    except Exception:
        return float("nan")
    finally:
        for h in handles:
            h.remove()
    if moved.shape != ref.shape:
        return float("nan")
    return float((moved - ref).abs().max())


def _enclosing_config(model: Any, name: str) -> Any:
    """The config of the module ``name``, or of the nearest module around it that has one."""
    parts = name.split(".")
    for depth in range(len(parts), -1, -1):
        config = getattr(model.get_submodule(".".join(parts[:depth])), "config", None)
        if config is not None:
            return config
    return None


def _configs_read(model: Any, names: Iterable[str]) -> str:
    """The rotary modules ``patch_model`` refuses whose config posenc still reads as RoPE.

    Each module is patched on its own (in a holder carrying its enclosing config, so the
    model stays as it is). A refused module's config must be refused too: by
    :func:`rope_spec` (for every layer type), or, for a config naming no RoPE setting
    (ESMFold2's atom encoders), by ``Rotary.from_hf_config``; or its spec must say that
    posenc does not reproduce it (``mrope_permuted``: ERNIE-4.5-VL). Returns ``""`` when
    every one is, else which modules and what their config reads as.
    """
    import torch

    from posenc import Rotary, hf
    from posenc.families.rotary.config import has_rope_settings, rope_layer_types, rope_spec

    read = []
    for name in names:
        config = _enclosing_config(model, name)
        holder = torch.nn.Module()
        holder.config = config
        holder.add_module("rotary", model.get_submodule(name))
        try:
            hf.patch_model(holder)
            continue  # patched on its own: not a refused module
        except ValueError:
            pass
        try:
            specs = [rope_spec(config, t) for t in rope_layer_types(config) or (None,)]
        except ValueError:
            continue
        if any(spec.mrope_permuted for spec in specs):
            continue
        try:
            Rotary.from_hf_config(config)
        except ValueError:
            if not has_rope_settings(config):
                continue
        spec = specs[0]
        read.append(
            f"{name}: {getattr(config, 'model_type', '') or type(config).__name__} read as "
            f"{spec.rope_type} RoPE, base {spec.base:g}, rotary_dim {spec.rotary_dim}"
        )
    return "; ".join(read)


def check(family: str, report: Callable[[str], None] | None = None) -> Outcome:
    """Build ``family`` tiny, patch it with :func:`posenc.hf.patch_model`, compare outputs.

    Args:
        family: a name from :func:`families`.
        report: called with the phase ("build", "patch", "forward") as it starts, so
            that a supervisor can tell where a hung or killed check was.
    """
    import torch

    from posenc import hf

    say = report or (lambda _phase: None)
    start, cpu = time.monotonic(), time.process_time()

    def done(status: str, detail: str, **extra: Any) -> Outcome:
        seconds = round(time.monotonic() - start, 2)
        used = round(time.process_time() - cpu, 2)
        return Outcome(family, status, detail, seconds=seconds, cpu_seconds=used, **extra)

    say("build")
    try:
        model, kwargs, before, skipped = _tiny(family)
        target = type(model).__name__
        rotary = _rotary_names(model)
        called, handles = _record_calls(model, rotary)
        tables, more = _record_outputs(model, rotary)
        again = _forward(model, kwargs)
        for h in handles + more:
            h.remove()
        if not torch.isfinite(before).all():
            raise FloatingPointError(f"{target}: the unpatched output is not finite")
        if not torch.equal(before, again):
            raise RuntimeError(f"{target}: the unpatched forward is not deterministic")
        sensitivity = _respond(model, called, kwargs, before, _no_rotation) if called else 0.0
        floor = _respond(model, called, kwargs, before, _table_noise) if called else 0.0
    except Exception as exc:
        return done("build-failed", _describe(exc))
    info = {"target": target, "rotary": tuple(rotary), "exercised": tuple(called)}
    notes = []
    if skipped:
        notes.append("skipped " + "; ".join(s.split(":")[0] for s in skipped))
    unexercised = [n for n in rotary if n not in called]
    if unexercised:
        notes.append(f"not exercised: {', '.join(unexercised)}")
    note = "".join(f"; {n}" for n in notes)

    say("patch")
    try:
        hf.patch_model(model)
    except ValueError as exc:
        read = _configs_read(model, rotary)
        return done("refused", _one_line(exc, 500), **info, read_config=read)
    except Exception as exc:
        return done("crash", "patch_model: " + _describe(exc), **info)

    say("forward")
    try:
        ours, handles = _record_outputs(model, called)
        after = _forward(model, kwargs)
        for h in handles:
            h.remove()
    except Exception as exc:
        return done("crash", "patched forward: " + _describe(exc), **info)
    # by parts, which deep chaotic models need (below): the patched modules' own outputs
    # against HF's, call by call; and the patched model fed HF's recorded outputs, which
    # must give HF's output exactly (the model reads nothing else off the new modules)
    table_diff = _table_diff(ours, tables)
    try:
        fed = _with_outputs(model, tables, kwargs)
        fed_diff = float((fed - before).abs().max()) if fed.shape == before.shape else math.inf
    except Exception as exc:
        return done("crash", "patched forward with HF's tables: " + _describe(exc), **info)
    parts = (
        f"tables max|diff| {table_diff:.3g} (<= {TABLE_ERROR:.3g}), fed HF's tables {fed_diff:.3g}"
    )
    parts_ok = table_diff <= TABLE_ERROR and fed_diff == 0.0
    scale = float(before.abs().max())
    tol = tolerance(scale, floor)
    numbers = {"scale": scale, "sensitivity": sensitivity}
    measured = f"(scale {scale:.3g}, sensitivity {sensitivity:.3g}){note}"
    if after.shape != before.shape:
        detail = f"output shape {tuple(after.shape)} != {tuple(before.shape)}"
        return done("different", detail, **info, **numbers)
    diff = float((after - before).abs().max()) if after.numel() else 0.0
    if not parts_ok:
        detail = f"by parts: {parts}; max|diff| {diff:.3g} {measured}"
        return done("different", detail, max_diff=diff, **info, **numbers)
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        # the output does not depend on the tables: neither check could see a wrong one
        detail = f"the probed output does not depend on the rotary tables{note}"
        return done("build-failed", detail, max_diff=diff, **info, **numbers)
    if not sensitivity > 10 * tol:
        # end to end, a wrong table could not be told from table rounding amplified by
        # the model's chaos (routing, halting, thresholds), so the parts decide alone
        detail = f"by parts: {parts} (end to end: sensitivity {sensitivity:.3g}, tol {tol:.3g})"
        return done("same", detail + note, max_diff=diff, **info, **numbers)
    if not math.isfinite(diff) or diff > tol:
        detail = f"max|diff| {diff:.3g} > tol {tol:.3g} {measured}"
        return done("different", detail, max_diff=diff, **info, **numbers)
    detail = f"max|diff| {diff:.3g} <= tol {tol:.3g} {measured}"
    return done("same", detail, max_diff=diff, **info, **numbers)


# --------------------------------------------------------------------------------------
# Running many families in worker processes.


def _worker() -> None:
    """Read family names on stdin; write one JSON line per phase and result on stdout.

    Each family is checked in a child forked from this process, which has imported
    torch, transformers and posenc once: a fresh copy of that state per family (some
    models change global state, such as registered attention functions), without
    paying for the imports again. The model code may print: the real stdout is kept
    for the protocol and fd 1 is pointed at stderr.
    """
    import logging
    import warnings

    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch
    import transformers  # noqa: F401 - imported once, before the forks

    import posenc.integration.hf_module  # noqa: F401

    torch.set_num_threads(1)
    for line in sys.stdin:
        family, _, limit = line.strip().partition("\t")
        if not family:
            continue
        # the family's modules are imported here, before the fork, so that later
        # families of the same lineage find them imported (importing changes no model
        # state); the building itself happens in the child
        with contextlib.suppress(Exception):
            _family_modules(family)
        out.flush()
        pid = os.fork()
        if pid == 0:
            try:
                # the family's CPU budget (module constants): past it the kernel stops
                # the child with SIGXCPU, and no core file is written
                seconds = int(limit or CPU_LIMIT)
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 10))

                def report(phase: str, family: str = family) -> None:
                    out.write(json.dumps({"family": family, "phase": phase}) + "\n")

                try:
                    outcome = check(family, report)
                except BaseException as exc:  # a child must answer for its family
                    outcome = Outcome(family, "crash", "harness: " + _describe(exc))
                out.write(json.dumps({"outcome": dataclasses.asdict(outcome)}) + "\n")
                out.flush()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            out.write(json.dumps({"died": family, "status": status}) + "\n")


class _Worker:
    def __init__(self, log: Any) -> None:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONWARNINGS": "ignore",
            # transformers iterates sets in places; a fixed hash seed makes every run alike
            "PYTHONHASHSEED": "0",
        }
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,
            text=True,
            bufsize=1,
        )
        assert self.proc.stdout is not None
        self.stdout: IO[str] = self.proc.stdout
        self.family: str | None = None
        self.phase = "start"
        self.deadline = math.inf
        self.buffer = ""

    def lines(self) -> list[str] | None:
        """The whole lines the worker wrote since the last call; None once its output closed.

        Read from the pipe itself, never through the file object's buffer: a readline
        after select() would leave a second line that arrived with the first (a phase
        and then the outcome) in that buffer, where select() never sees it, and the
        family would wait for its deadline.
        """
        chunk = os.read(self.stdout.fileno(), 1 << 16)
        if not chunk:
            return None
        self.buffer += chunk.decode()  # JSON lines: ASCII, so no character is split
        *done, self.buffer = self.buffer.split("\n")
        return done

    def send(self, family: str, timeout: float, cpu_limit: int) -> None:
        self.family, self.phase = family, "start"
        self.deadline = time.monotonic() + timeout
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{family}\t{cpu_limit}\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        # the worker and the child it forked for the family
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.close()

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _lost(family: str, phase: str, why: str, seconds: float) -> Outcome:
    status = "crash" if phase in ("patch", "forward") else "build-failed"
    return Outcome(family, status, f"{why} during {phase}", seconds=round(seconds, 2))


def run(
    names: Iterable[str] | None = None,
    workers: int = 2,
    timeout: float = HANG_TIMEOUT,
    log: Any = subprocess.DEVNULL,
    cpu_limit: int = CPU_LIMIT,
) -> list[Outcome]:
    """:func:`check` every family in ``names`` (default: all) in ``workers`` processes.

    Each family may use ``cpu_limit`` seconds of CPU; ``timeout`` (wall clock) only
    catches a hung check (see :data:`CPU_LIMIT`).
    """
    todo = list(families() if names is None else names)
    results: dict[str, Outcome] = {}
    pool = [_Worker(log) for _ in range(min(workers, len(todo)))]
    sel = selectors.DefaultSelector()
    started: dict[str, float] = {}
    retried: set[str] = set()

    def feed(w: _Worker) -> None:
        if todo:
            family = todo.pop(0)
            started[family] = time.monotonic()
            w.send(family, timeout, cpu_limit)
        else:
            w.family = None
            w.deadline = math.inf

    def replace(w: _Worker) -> _Worker:
        sel.unregister(w.stdout)
        w.kill()
        fresh = _Worker(log)
        sel.register(fresh.stdout, selectors.EVENT_READ, fresh)
        return fresh

    for w in pool:
        sel.register(w.stdout, selectors.EVENT_READ, w)
        feed(w)
    while any(w.family is not None for w in pool):
        now = time.monotonic()
        wait = max(0.0, min(w.deadline for w in pool) - now)
        for key, _ in sel.select(timeout=min(wait, 5.0)):
            w = key.data
            lines = w.lines()
            if lines is None:  # the worker died
                fam = w.family
                if fam is not None:
                    code = w.proc.poll()
                    why = f"worker died (exit {code})"
                    results[fam] = _lost(fam, w.phase, why, time.monotonic() - started[fam])
                i = pool.index(w)
                pool[i] = replace(w)
                feed(pool[i])
                continue
            for line in lines:
                msg = json.loads(line)
                if "phase" in msg:
                    w.phase = msg["phase"]
                elif "died" in msg:
                    fam, status = msg["died"], msg["status"]
                    why = f"checking process died (wait status {status})"
                    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
                        why = f"used its {cpu_limit} s of CPU"
                    results[fam] = _lost(fam, w.phase, why, time.monotonic() - started[fam])
                    feed(w)
                elif "outcome" in msg:
                    results[msg["outcome"]["family"]] = Outcome.from_json(msg["outcome"])
                    feed(w)
        now = time.monotonic()
        for i, w in enumerate(pool):
            if w.family is not None and now > w.deadline:
                fam = w.family
                if fam not in retried:
                    # a forked child can, rarely, hang on a lock held at fork time: such a
                    # hang says nothing about posenc, so the family runs once more, fresh
                    retried.add(fam)
                    todo.insert(0, fam)
                else:
                    why = f"hung twice (no result after {timeout:.0f}s)"
                    results[fam] = _lost(fam, w.phase, why, now - started[fam])
                pool[i] = replace(w)
                feed(pool[i])
    for w in pool:
        sel.unregister(w.stdout)
        assert w.proc.stdin is not None
        w.proc.stdin.close()
        w.proc.wait()
        w.close()
    return [results[f] for f in sorted(results)]


# --------------------------------------------------------------------------------------
# The survey in the background.


def surveyed() -> list[Outcome]:
    """Every family's outcome, from the suite's background job ``hf-survey`` (this
    file's command line, tests/background.py), waiting for it."""
    import background

    job = background.wait("hf-survey")
    payload = json.loads((job.out / "survey.json").read_text())
    return [Outcome.from_json(o) for o in payload["outcomes"]]


# --------------------------------------------------------------------------------------
# The survey.


def summary(outcomes: list[Outcome]) -> str:
    """Counts per status, then every family that is not ``same`` with its detail."""
    lines = []
    counts = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    lines.append("  ".join(f"{s}: {n}" for s, n in counts.items()) + f"  (total {len(outcomes)})")
    for status in STATUSES[1:]:
        group = [o for o in outcomes if o.status == status]
        if group:
            lines.append(f"\n== {status} ({len(group)})")
            lines.extend(
                f"{o.family:28s} {o.target:40s} {o.detail}"
                + (f" [but rope_spec reads {o.read_config}]" if o.read_config else "")
                for o in group
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Survey the families named in ``argv`` (default: all) and write the results."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("families", nargs="*")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=HANG_TIMEOUT)
    parser.add_argument("--cpu-limit", type=int, default=CPU_LIMIT)
    out = Path(__file__).parents[1] / "artifacts" / "hf-families"
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(args.out / "workers.log", "w") as log:
        outcomes = run(args.families or None, args.workers, args.timeout, log, args.cpu_limit)
    elapsed = time.monotonic() - start
    name = "survey.json" if not args.families else "survey-partial.json"
    payload = {"seconds": round(elapsed, 1), "outcomes": [dataclasses.asdict(o) for o in outcomes]}
    from posenc.core.files import atomic_write

    with atomic_write(args.out / name, "w") as f:
        f.write(json.dumps(payload, indent=1))
    print(summary(outcomes))
    print(f"\n{len(outcomes)} families in {elapsed:.0f}s with {args.workers} workers")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
    else:
        sys.exit(main(sys.argv[1:]))
