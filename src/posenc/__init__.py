"""posenc: positional encodings for transformers and their relatives.

Exact at any position, numerically matched to the implementations they come
from, and benchmarked against them. ``import posenc`` needs only numpy; the
torch modules (:class:`SinusoidalEmbedding`, :class:`LearnedPositionalEmbedding`)
are imported on first use and need torch.
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
from posenc.positions import cache_positions, fairseq_positions, opt_positions

__version__ = "0.1.0"

_TORCH_MODULES = ("LearnedPositionalEmbedding", "SinusoidalEmbedding")

__all__ = [
    "GRID_PRESETS",
    "PRESETS",
    "GridSpec",
    "LearnedPositionalEmbedding",
    "Sinusoid",
    "SinusoidalEmbedding",
    "__version__",
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
]


def __getattr__(name: str) -> Any:
    # torch modules load lazily so that `import posenc` stays numpy-only
    if name in _TORCH_MODULES:
        from posenc import modules

        return getattr(modules, name)
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
