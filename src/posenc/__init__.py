"""posenc: positional encodings for transformers and their relatives.

Exact at any position, numerically matched to the implementations they come
from, and benchmarked against them. ``import posenc`` needs only numpy; the
torch parts (:class:`SinusoidalEmbedding`, :class:`LearnedPositionalEmbedding`,
:class:`Rotary`, :func:`apply_rotary`, :func:`attention`, the bias modules
:class:`ALiBi`, :class:`T5Bias`, :class:`KERPLE`, :class:`FIRE`, :class:`Sandwich`,
:class:`NoPE`, the methods after 2023 (:class:`ForgetGate` for FoX's
``attention(log_fgate=)``, :func:`stick_breaking_attention`, :class:`CoPE`,
:class:`DAPE`, :class:`FoPE`, :class:`PoPE`, :class:`DualChunkRotary`,
:func:`path_attention`, :class:`PaTH` and its :class:`PaTHCache`),
:mod:`posenc.hf`) are imported on first use and need torch.
"""

from typing import Any

from posenc import _moved
from posenc.core import extras as _extras
from posenc.core.positions import (
    cache_positions,
    cu_seqlens_from_document_ids,
    document_positions,
    fairseq_positions,
    mask_positions,
    opt_positions,
    packed_document_ids,
    packed_positions,
    restart_positions,
    v2pe_positions,
    videorope_positions,
)
from posenc.families.absolute.fourier import (
    fourier_features,
    gaussian_fourier_features,
    gaussian_fourier_matrix,
    nerf,
    nerf_frequencies,
)
from posenc.families.absolute.grid import PRESETS as GRID_PRESETS
from posenc.families.absolute.grid import GridSpec, grid, grid_frequencies
from posenc.families.absolute.sinusoidal import PRESETS, Sinusoid, shift_matrix, sinusoidal
from posenc.families.bias.functional import alibi_slopes, t5_bucket
from posenc.families.bias.temperature import attn_temperature

__version__ = "0.2.0"

_moved.install()  # posenc.rotary, posenc.hf ...: the short paths of the layered modules

# torch-backed names, imported on first use so that `import posenc` stays numpy-only
_LAZY = {
    "LearnedPositionalEmbedding": "posenc.families.absolute.modules",
    "SinusoidalEmbedding": "posenc.families.absolute.modules",
    "Rotary": "posenc.families.rotary.module",
    "FoPE": "posenc.families.rotary.fope",
    "PoPE": "posenc.families.rotary.pope",
    "DualChunkRotary": "posenc.families.rotary.dual_chunk",
    "apply_rotary": "posenc.families.rotary.apply",
    "ALiBi": "posenc.families.bias.modules",
    "CoPE": "posenc.families.contextual",
    "DAPE": "posenc.families.contextual",
    "AttentionBias": "posenc.families.bias.modules",
    "FIRE": "posenc.families.bias.modules",
    "ForgetGate": "posenc.families.bias.forget",
    "KERPLE": "posenc.families.bias.modules",
    "NoPE": "posenc.families.bias.modules",
    "Sandwich": "posenc.families.bias.modules",
    "T5Bias": "posenc.families.bias.modules",
    "attention": "posenc.integration.attention",
    "stick_breaking_attention": "posenc.integration.attention.stick_breaking",
    "path_attention": "posenc.integration.attention.path",
    "PaTH": "posenc.integration.path_layer",
    "PaTHCache": "posenc.integration.path_layer",
}
# submodules reachable as attributes (posenc.hf ...), through their short paths
_SUBMODULES = (
    "absolute", "analysis", "arithmetic", "bench", "bias", "context_parallel", "hf", "rotary",
)  # fmt: skip

__all__ = [
    "DAPE",
    "FIRE",
    "GRID_PRESETS",
    "KERPLE",
    "PRESETS",
    "ALiBi",
    "AttentionBias",
    "CoPE",
    "DualChunkRotary",
    "FoPE",
    "ForgetGate",
    "GridSpec",
    "LearnedPositionalEmbedding",
    "NoPE",
    "PaTH",
    "PaTHCache",
    "PoPE",
    "Rotary",
    "Sandwich",
    "Sinusoid",
    "SinusoidalEmbedding",
    "T5Bias",
    "__version__",
    "alibi_slopes",
    "apply_rotary",
    "attention",
    "attn_temperature",
    "cache_positions",
    "cu_seqlens_from_document_ids",
    "document_positions",
    "fairseq_positions",
    "fourier_features",
    "gaussian_fourier_features",
    "gaussian_fourier_matrix",
    "grid",
    "grid_frequencies",
    "mask_positions",
    "nerf",
    "nerf_frequencies",
    "opt_positions",
    "packed_document_ids",
    "packed_positions",
    "path_attention",
    "restart_positions",
    "shift_matrix",
    "sinusoidal",
    "stick_breaking_attention",
    "t5_bucket",
    "v2pe_positions",
    "videorope_positions",
]


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"posenc.{name}")
    return _extras.attribute("posenc", _LAZY, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
