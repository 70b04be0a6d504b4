"""What transformers' model code does with a config's RoPE keys, model type by model type.

A config key does not mean the same to every model: Llama's default RoPE ignores
``partial_rotary_factor`` (its ``compute_default_rope_parameters`` covers the whole
head) where Phi, GPT-NeoX or GLM read it; GLM-4 and Cohere rotate interleaved pairs
where Llama rotates halves; Qwen2-VL is M-RoPE even when its config names no
sections (the module falls back on its own); GPT-J applies RoPE with no RoPE key at
all; EoMT-DINOv3's RoPE settings feed angles of patch coordinates, not of positions.
:func:`posenc.rotary.config.rope_spec` reads a config the way its model's code does
through these tables, taken from the modeling code of transformers 5.24 (the test
suite re-derives every table from the installed transformers and compares).

Model types are the ``model_type`` of the config part that holds the RoPE settings
(``text_config`` for composite models); :func:`candidates` also tries the name
without ``_text`` and the enclosing config's type. A model type in no table is read
as the keys are documented (``partial_rotary_factor`` shortens the rotary dim,
halves layout, one axis).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Model types whose ``compute_default_rope_parameters`` reads ``partial_rotary_factor``.
DEFAULT_READS_PARTIAL = frozenset(
    """
    bamba deepseek_v4 diffusion_gemma_text dots3_note_audio_encoder dots3_note_text
    efficientloftr glm glm4 glm4_moe glm4_moe_lite glm4v glm4v_moe glm_image glm_ocr glmasr
    gpt_neox gpt_neox_japanese laguna mellum mimo_v2_flash minimax_m2 minimax_m3_vl
    moonshine moonshine_streaming musicflamingo nemo_speechlm nemotron nemotron3_diarization
    neomme persimmon phi phi3 phi4_multimodal qwen3_5_moe_text qwen3_5_text qwen3_next
    qwen4_exp_text recurrent_gemma solar_open stablelm step3p7 zaya
    """.split()
)

#: Model types whose ``compute_default_rope_parameters`` ignores ``partial_rotary_factor``
#: (the other rope types read it through ``ROPE_INIT_FUNCTIONS``, for every model).
DEFAULT_IGNORES_PARTIAL = frozenset(
    """
    afmoe apertus apertus1p5_text arcee aria_text axk1 axk2 bailing_hybrid beam bitnet blt
    chameleon cohere cohere2 cohere2_moe cohere_compass_text cosmos3_edge_text csm cwm dbrx
    deepseek_ocr2_text deepseek_ocr2_vision deepseek_v2 deepseek_v3 deepseek_v32 dia
    diffllama doge dory dots1 embedding_gemma2_text emu3 eomt_dinov3 ernie4_5 ernie4_5_moe
    ernie4_5_vl_moe_text esm esmc eurobert evolla exaone4 exaone_moe falcon falcon_h1
    flex_olmo flint gemma gemma2 gemma3_text gemma3n_text gemma4_text gemma4_unified_text
    glm_moe_dsa gpt_oss gradium_phonon_tts granite granite4_vision_text granite_docling_text
    granite_swa granitemoe granitemoe_swa granitemoehybrid granitemoeshared gte helium
    higgs_audio_v2 hrm_text hunyuan_v1_dense hunyuan_v1_moe hunyuan_vl hy_v3 hy_v4
    hy_v4_vl_text hyperclovax idefics jais2 jetmoe jina_embeddings_v3 kolibri1
    kyutai_speech_to_text lara_mini lasr_encoder lfm2 lfm2_moe lfm3 llama llama4_text
    longcat_flash mimi minicpm3 minimax ministral ministral3 mistral mistral4
    mistral_large4_text mixtral mllama_text_model modernbert modernbert-decoder molmo2 moshi
    muse_glimmer muse_glimmer_assistant muse_spark nanochat neucodec nomic_bert olmo olmo2
    olmo3 olmo_hybrid olmoe openai_privacy_filter paddleocr_vl pe_audio_encoder
    pe_audio_video_encoder pe_video_encoder phimoe pocket_tts pocket_tts_audio_tokenizer
    qwen2 qwen2_5_omni qwen2_5_omni_dit qwen2_5_vl qwen2_moe qwen2_vl qwen3 qwen3_moe
    qwen3_omni_moe qwen3_omni_moe_text qwen3_vl_moe_text qwen3_vl_text seed_oss smollm3
    starcoder2 t5gemma t5gemma2_text timesfm2_5 ultrabert unlimited_ocr_text vaultgemma
    voxtral_realtime xcodec2 youtu zamba2
    """.split()
)

#: Model types that rotate pairs (2i, 2i + 1), GPT-J's order, not halves: their
#: ``rotate_half`` takes ``x[..., 0::2]`` and ``x[..., 1::2]``, or their tables are complex
#: numbers over ``reshape(..., -1, 2)`` (DeepSeek-V2, Llama 4).
INTERLEAVED = frozenset(
    """
    blt codegen cohere cohere2 cohere2_moe deepseek_v2 deepseek_v4 efficientloftr ernie4_5
    ernie4_5_moe ernie4_5_vl_moe glm glm4 glm4v glm_ocr gptj helium hy_v4_vl llama4 moonshine
    moonshine_streaming musicflamingo
    """.split()
)

#: Model types whose config class defaults ``rope_interleave`` to true (transformers
#: 5.24's ``DeepseekV3Config`` and its kin): with the key absent, the model still
#: de-interleaves q and k before HF's half rotation, i.e. it turns the checkpoint's
#: channels (2i, 2i + 1) together.
ROPE_INTERLEAVE_DEFAULT = frozenset(
    "axk1 deepseek_v3 glm4_moe_lite mistral4 sarvam_mla youtu".split()
)

#: M-RoPE sections a model's rotary module falls back on when its config names none
#: (``config.rope_parameters.get("mrope_section", [...])``).
MROPE_DEFAULT_SECTIONS: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(
        ("cosmos3_edge", "hy_v4_vl", "qwen3_omni_moe", "qwen3_vl", "qwen3_vl_moe"), (24, 20, 20)
    ),
    **dict.fromkeys(("paddleocr_vl", "qwen2_5_omni", "qwen2_5_vl", "qwen2_vl"), (16, 24, 24)),
    **dict.fromkeys(("glm4v", "glm4v_moe", "glm_image", "glm_ocr"), (8, 12, 12)),
    **dict.fromkeys(("qwen3_5", "qwen3_5_moe", "qwen4_exp"), (11, 11, 10)),
    "cohere_compass": (24, 20, 20),
    "ernie4_5_vl_moe": (22, 22, 20),
}

#: M-RoPE whose module permutes the frequencies before the sections take them
#: (ERNIE-4.5-VL: the height and width sections take the even, then the odd frequencies).
PERMUTED_MROPE = frozenset({"ernie4_5_vl_moe"})

#: Model types that apply RoPE with no RoPE key in their config: base 10000, over the
#: channels the named config key gives, in interleaved pairs (``rotate_every_two``). Their
#: rotary module returns ``(sin, cos)``, each angle once, read from a table made at
#: construction (``create_sinusoidal_positions``).
FIXED_ROPE: dict[str, str] = {"gptj": "rotary_dim", "codegen": "rotary_dim"}

#: The rotary dim of a :data:`FIXED_ROPE` model type whose config omits its key: the
#: default of transformers' config class (``GPTJConfig().rotary_dim``).
FIXED_ROPE_DIM: dict[str, int] = {"gptj": 64, "codegen": 64}

#: Model types whose RoPE settings feed a rotary module of another kind than tables of
#: token positions times ``base ** (-2k / d)``, and what it does instead. A config of
#: one gives no frequencies its model uses: :func:`posenc.rotary.config.rope_spec`
#: refuses it, as :func:`posenc.hf.patch_model` refuses the module (DINOv3's and
#: Sapiens2's, ``*RopePositionEmbedding``, are not even found as rotary modules).
OTHER_KIND: dict[str, str] = {
    "efficientloftr": (
        "forward(x) of a feature map, no position ids: a table over the rows and columns "
        "of its aggregated grid, spread over the whole hidden size (partial_rotary_factor "
        "4.0 of a head)"
    ),
    **dict.fromkeys(
        ("dinov3_vit", "eomt_dinov3", "sapiens2"),
        "DINOv3's forward(pixel_values), no position ids: angles 2 pi times patch-centre "
        "coordinates in [-1, 1] times head_dim / 4 frequencies of its own, per image axis",
    ),
    "esmfold2": (
        "forward(ref_pos, ref_space_uid, dtype) in its atom encoders: 3-D atom coordinates "
        "and a per-atom id as positions, with spatial and id bases of their own"
    ),
    "llama4_vision_model": (
        "one complex table over the image's patch grid, computed at construction from "
        "image_size and patch_size: row and column (from 1) on head_dim / 4 frequencies "
        "each, the class token unrotated; forward(hidden_states) returns it whole"
    ),
    "musicflamingo": (
        "forward(timestamps, seq_len) for the audio encoder: axial RoPE over each audio "
        "window's index and the time index within it, modulated by the timestamps in "
        "seconds"
    ),
    "pixtral": (
        "2-D RoPE over patch rows and columns: base ** (-2k / head_dim) split into its even "
        "and odd frequencies, one set per axis (rope_type 'axial')"
    ),
}


@dataclass(frozen=True)
class LocalGlobal:
    """How a v4 ``config.json`` gives the sliding layers' base apart from the full layers'.

    transformers reads it into ``rope_parameters`` per layer type (``sliding_attention``,
    ``full_attention``), each defaulting to the config class's own base.

    Attributes:
        local_key, global_key: the keys of the sliding and the full layers' bases.
        local_default, global_default: the config class's defaults.
        scaling_both: ``rope_scaling`` applies to both layer types (ModernBERT), not
            only to the full ones (Gemma 3).
    """

    local_key: str
    global_key: str
    local_default: float
    global_default: float
    scaling_both: bool


#: Model types whose sliding-window layers use another base than the global ones, by
#: their v4 keys: Gemma 3's ``rope_local_base_freq`` beside ``rope_theta`` (10000 and
#: 1e6), ModernBERT's ``local_rope_theta`` and ``global_rope_theta`` (10000 and 160000).
LOCAL_GLOBAL: dict[str, LocalGlobal] = {
    **dict.fromkeys(
        ("gemma3", "gemma3n", "t5gemma2"),
        LocalGlobal("rope_local_base_freq", "rope_theta", 10_000.0, 1_000_000.0, False),
    ),
    **dict.fromkeys(
        ("modernbert", "modernbert_decoder"),
        LocalGlobal("local_rope_theta", "global_rope_theta", 10_000.0, 160_000.0, True),
    ),
}

#: Model types that rotate q and k in their sliding-window layers only: their
#: ``full_attention`` layers have no RoPE (Cohere 2's 3 sliding RoPE layers to 1 global
#: NoPE layer). Cohere2-MoE also rotates the full layers among its dense prefix when
#: ``prefix_dense_sliding_window_pattern`` is 1 (its ``force_rope``).
SLIDING_ONLY_ROPE = frozenset({"cohere2", "cohere2_moe", "flint"})

#: Every key a v4 config names a sliding or full layers' base with.
LOCAL_GLOBAL_KEYS = tuple(
    sorted({k for v in LOCAL_GLOBAL.values() for k in (v.local_key, v.global_key)} - {"rope_theta"})
)


#: The base of a model type whose config omits ``rope_theta``, where it is not 10000: the
#: ``default_theta`` of transformers' config class, which standardizes ``rope_parameters``
#: with it (``CohereConfig().rope_parameters["rope_theta"]``). Keyed by the exact model type
#: of the config part holding the RoPE settings (``qwen2_vl_text``, not ``qwen2_vl``: the
#: outer classes keep 10000). Left out: classes with one default per layer type (Gemma 3,
#: ModernBERT, LFM3, ...), and Fuyu's, which its Persimmon text config never reads.
DEFAULT_THETA_BY_TYPE: dict[str, float] = {
    **dict.fromkeys(("eomt_dinov3", "gemma4_vision"), 100.0),
    "nomic_bert": 1_000.0,
    "musicflamingo": 1_200.0,
    **dict.fromkeys(
        ("jina_embeddings_v3", "pe_audio_encoder", "pe_audio_video_encoder", "pe_video_encoder"),
        20_000.0,
    ),
    "helium": 100_000.0,
    **dict.fromkeys(("gpt_oss", "openai_privacy_filter"), 150_000.0),
    "gte": 160_000.0,
    **dict.fromkeys(
        """
        bitnet blt blt_global_transformer blt_local_decoder blt_local_encoder cohere csm
        csm_depth_decoder_model ernie4_5 ernie4_5_moe ernie4_5_vl_moe_text evolla exaone
        flex_olmo llama4_text mllama_text_model muse_glimmer_assistant olmo3 paddleocr_vl_text
        qwen3_vl_moe_text qwen3_vl_text
        """.split(),
        500_000.0,
    ),
    **dict.fromkeys(
        """
        cwm emu3_text_model lfm2 lfm2_moe lfm3_vl_vision minimax mixtral phimoe
        qwen2_5_omni_talker qwen2_5_omni_text qwen2_5_vl_text qwen2_vl_text qwen3_omni_moe_text
        solar_open
        """.split(),
        1_000_000.0,
    ),
    "smollm3": 2_000_000.0,
    **dict.fromkeys(("minimax_m2", "minimax_m3_vl_text"), 5_000_000.0),
    "sarvam_moe": 8_000_000.0,
    "longcat_flash": 10_000_000.0,
    "hy_v3": 11_158_840.0,
    **dict.fromkeys(("apertus", "apertus1p5_text"), 12_000_000.0),
    "cosmos3_edge_text": 100_000_000.0,
}


def candidates(model_type: str | None, outer: str | None = None) -> list[str]:
    """The names to look a model type up by: itself, without ``_text``, the outer type."""
    names: list[str] = []
    for name in (model_type, outer):
        if name:
            for n in (name, name.removesuffix("_text")):
                if n not in names:
                    names.append(n)
    return names


def lookup(table: Iterable[str], model_type: str | None, outer: str | None = None) -> str | None:
    """The first of :func:`candidates` that ``table`` holds, else ``None``."""
    keys = set(table)
    return next((n for n in candidates(model_type, outer) if n in keys), None)
