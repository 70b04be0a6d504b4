"""The public surface: the modules users import by name, and their names grouped by task.

A name is public because a user imports it. ``posenc`` itself is public, and so
are the modules below that users import by their own path (``from
posenc.rotary.schedules import yarn``). Each public module's ``__all__`` is
exactly the names listed here, in this order; every other module of posenc is
internal and declares no ``__all__`` (``tests/test_api.py`` holds both). The
reference (``make docs``) has a page per public module, its names under these
task headings, and nothing else.

A name exported by two public modules (``posenc.ALiBi`` and ``posenc.bias.ALiBi``,
one object) has its full entry on the first module's page listed here and a link
from the other.

Nothing is imported here: this is data, read by the docs build, the explainer's
links and the tests.
"""

from __future__ import annotations

# the bias family, exported by posenc and by posenc.bias alike
_BIAS_MODULES = ("ALiBi", "T5Bias", "KERPLE", "FIRE", "Sandwich", "NoPE", "AttentionBias")
_BIAS_FUNCTIONS = ("alibi_slopes", "t5_bucket", "attn_temperature")

#: public module -> {task heading: names}, in the reference's order
PUBLIC: dict[str, dict[str, tuple[str, ...]]] = {
    "posenc": {
        "Sinusoidal tables and diffusion timesteps": (
            "sinusoidal",
            "Sinusoid",
            "PRESETS",
            "shift_matrix",
        ),
        "Image and video grids, coordinate Fourier features": (
            "grid",
            "GridSpec",
            "GRID_PRESETS",
            "grid_frequencies",
            "fourier_features",
            "gaussian_fourier_features",
            "gaussian_fourier_matrix",
            "nerf",
            "nerf_frequencies",
        ),
        "Modules that add a position to token embeddings": (
            "SinusoidalEmbedding",
            "LearnedPositionalEmbedding",
        ),
        "Rotary embeddings": ("Rotary", "apply_rotary", "FoPE", "PoPE", "DualChunkRotary"),
        "Attention biases": (*_BIAS_MODULES, *_BIAS_FUNCTIONS),
        "Attention with positions": (
            "attention",
            "ForgetGate",
            "CoPE",
            "DAPE",
            "stick_breaking_attention",
            "path_attention",
            "PaTH",
            "PaTHCache",
        ),
        "Position ids: padding, caches, packing, video": (
            "mask_positions",
            "opt_positions",
            "fairseq_positions",
            "cache_positions",
            "document_positions",
            "packed_positions",
            "packed_document_ids",
            "cu_seqlens_from_document_ids",
            "restart_positions",
            "v2pe_positions",
            "videorope_positions",
        ),
    },
    "posenc.rotary.schedules": {
        "Frequencies of a rotary config": ("frequencies", "RopeFrequencies", "SCHEDULES"),
        "Context-extension schedules": (
            "default",
            "linear",
            "ntk",
            "dynamic",
            "yarn",
            "llama3",
            "longrope",
            "proportional",
            "resonance",
            "resonance_yarn",
        ),
        "A schedule set to extend a trained context": ("stretched",),
        "Your own schedule": ("register",),
    },
    "posenc.rotary.multiaxis": {
        "Axial rotary for image and video patches": (
            "AxialRotary",
            "axial_cos_sin",
            "axial_grid",
            "pixel_frequencies",
        ),
        "M-RoPE (Qwen2-VL)": ("mrope_cos_sin", "mrope_axes"),
        "RIFLEx: longer videos from a video model's time axis": ("intrinsic_frequency", "riflex"),
        "xPos": ("xpos_rotate", "xpos_scale", "xpos_tables"),
        "LieRE and ComRoPE: learned dense rotations": ("LieRotary", "lie_rotate"),
        "RoPE-Mixed and DINOv3's RoPE for image patches": (
            "RoPEMixed",
            "mixed_frequencies",
            "mixed_cos_sin",
            "DINOv3Rope",
            "dinov3_frequencies",
            "dinov3_coords",
            "dinov3_cos_sin",
        ),
    },
    "posenc.rotary.rerotate": {
        "Moving cached keys to new positions": ("rerotate_keys", "rerotation_cos_sin"),
    },
    "posenc.bias": {
        "Bias modules": (*_BIAS_MODULES, "ScaledForm"),
        "The Forgetting Transformer": ("ForgetGate", "ForgetGateTerm"),
        "Slopes, buckets and temperature": _BIAS_FUNCTIONS,
    },
    "posenc.terms": {
        "Your own score term": ("ScoreTerm", "TermContext", "TermForm"),
    },
    "posenc.hf": {
        "Patching transformers models": ("patch_model", "rerotate_cache"),
        "Reading a RoPE config as transformers does": (
            "rope_spec",
            "RopeSpec",
            "rope_layer_types",
            "DEFAULT_THETA",
        ),
    },
    "posenc.analysis": {
        "The properties posenc check verifies": ("check", "shift_error", "regression_r2"),
        "Geometry of the sinusoidal table": (
            "norms",
            "offset_dot_products",
            "geometry",
            "permutation_check",
            "add_concat",
            "index_features",
        ),
        "Precision": ("precision_report", "precision_curves", "exp_log_forms", "exp_log_errors"),
        "Rotary": ("rope_relative", "rope_decay", "scaling_curves"),
        "Timesteps and learned tables": ("timestep_presets", "train_learned"),
    },
    "posenc.analysis.rope_reading": {
        "A model's RoPE config, read per layer type": ("read", "describe", "Loaded", "Reading"),
    },
    "posenc.analysis.rope_compare": {
        "Another engine's tables against the exact ones": ("golden_tables", "compare"),
    },
    "posenc.arithmetic": {
        "Digit positions": ("abacus_positions", "coupled_positions", "index_hints"),
        "Random positions in training": ("random_offsets", "randomized_positions"),
        "Where a digit's position is counted": ("AFTER_NUMBER", "OUTSIDE"),
    },
    "posenc.context_parallel": {
        "Ring attention across ranks": ("ring_attention", "LAYOUTS"),
        "Sharding a sequence": ("shard", "unshard", "shard_positions", "gather"),
    },
    "posenc.lab": {
        "Training small models on every encoding": ("LabConfig", "run", "ENCODINGS"),
    },
    "posenc.plot": {"One figure": ("figure", "KINDS", "save")},
    "posenc.report": {"The explainer": ("build",)},
}


def names(module: str) -> list[str]:
    """A public module's names, in the reference's order (its ``__all__``)."""
    return [name for group in PUBLIC[module].values() for name in group]


def reference_path(dotted: str) -> str:
    """Where the reference documents a public module or name, relative to the site's root.

    Each public name has an anchor of its full dotted path on its module's page:
    ``posenc.bias.ALiBi`` is ``api/posenc.bias.html#posenc.bias.ALiBi``.

    Raises:
        ValueError: ``dotted`` is neither a public module nor a public module's name.
    """
    if dotted in PUBLIC:
        return f"api/{dotted}.html"
    module, _, name = dotted.rpartition(".")
    if module in PUBLIC and name in names(module):
        return f"api/{module}.html#{dotted}"
    raise ValueError(f"{dotted!r} is not public: not a module of posenc._api.PUBLIC nor its name")
