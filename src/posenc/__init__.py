"""posenc: positional encodings for transformers and their relatives.

Exact at any position, numerically matched to the implementations they come
from, and benchmarked against them. ``import posenc`` needs only numpy; the
torch parts work when torch is installed.
"""

from posenc.absolute.sinusoidal import PRESETS, Sinusoid, shift_matrix, sinusoidal

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "Sinusoid",
    "__version__",
    "shift_matrix",
    "sinusoidal",
]
