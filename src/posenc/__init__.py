"""posenc: positional encodings for transformers and their relatives.

Exact at any position, numerically matched to the implementations they come
from, and benchmarked against them. ``import posenc`` needs only numpy; the
torch parts (:class:`SinusoidalEmbedding`, :class:`LearnedPositionalEmbedding`,
:class:`Rotary`, :func:`apply_rotary`, :func:`attention`, the bias modules
:class:`ALiBi`, :class:`T5Bias`, :class:`KERPLE`, :class:`FIRE`, :class:`Sandwich`,
:class:`NoPE`, :mod:`posenc.hf`) are imported on first use and need torch.
"""

from typing import Any

from posenc.absolute.fourier import (
    fourier_features,
    gaussian_fourier_features,
    gaussian_fourier_matrix,
    nerf,
    nerf_frequencies,
)
from posenc.absolute.grid import PRESETS as GRID_PRESETS
from posenc.absolute.grid import GridSpec, grid, grid_frequencies
from posenc.absolute.sinusoidal import PRESETS, Sinusoid, shift_matrix, sinusoidal
from posenc.bias.functional import alibi_slopes, t5_bucket
from posenc.positions import cache_positions, fairseq_positions, opt_positions

__version__ = "0.1.0"

# torch-backed names, imported on first use so that `import posenc` stays numpy-only
_LAZY = {
    "LearnedPositionalEmbedding": "posenc.modules",
    "SinusoidalEmbedding": "posenc.modules",
    "Rotary": "posenc.rotary.module",
    "apply_rotary": "posenc.rotary.apply",
    "ALiBi": "posenc.bias.modules",
    "AttentionBias": "posenc.bias.modules",
    "FIRE": "posenc.bias.modules",
    "KERPLE": "posenc.bias.modules",
    "NoPE": "posenc.bias.modules",
    "Sandwich": "posenc.bias.modules",
    "T5Bias": "posenc.bias.modules",
    "attention": "posenc.attend",
}
_SUBMODULES = ("analysis", "bench", "bias", "hf", "rotary")

__all__ = [
    "FIRE",
    "GRID_PRESETS",
    "KERPLE",
    "PRESETS",
    "ALiBi",
    "AttentionBias",
    "GridSpec",
    "LearnedPositionalEmbedding",
    "NoPE",
    "Rotary",
    "Sandwich",
    "Sinusoid",
    "SinusoidalEmbedding",
    "T5Bias",
    "__version__",
    "alibi_slopes",
    "apply_rotary",
    "attention",
    "cache_positions",
    "fairseq_positions",
    "fourier_features",
    "gaussian_fourier_features",
    "gaussian_fourier_matrix",
    "grid",
    "grid_frequencies",
    "nerf",
    "nerf_frequencies",
    "opt_positions",
    "shift_matrix",
    "sinusoidal",
    "t5_bucket",
]


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"posenc.{name}")
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
