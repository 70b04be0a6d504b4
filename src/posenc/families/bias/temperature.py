"""Llama 4's attention temperature: the query scale of its layers without RoPE.

Llama 4 (HF ``Llama4TextAttention.forward``, ``attn_temperature_tuning``) multiplies
the queries of its NoPE layers by a factor that grows with the query's position,
one step every ``floor_scale`` positions, so that attention over a long context
stays sharp (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", which
it cites). Position enters those layers only here and through the causal mask.

numpy in gives numpy out, torch in gives torch out on the same device; torch is
imported only when a tensor is passed.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from posenc.core import checks


def attn_temperature(positions: Any, floor_scale: float = 8192, attn_scale: float = 0.1) -> Any:
    """Llama 4's query scale at each position, float64.

    ``1 + attn_scale * log1p(floor((positions + 1) / floor_scale))``, as HF's
    ``Llama4TextAttention`` computes it for its NoPE layers when
    ``attn_temperature_tuning`` is set, with ``positions`` the queries' absolute
    positions (``cache_position``: the cache's length plus the index in the
    chunk of new tokens); the queries are multiplied by it before the scores.
    Every position below ``floor_scale - 1`` gets exactly 1.

    HF computes it in float32; here every step is float64, and the floor is
    exact for integer positions and ``floor_scale`` (their quotient is rounded
    once, below ``2**53``, and never up to the next integer).

    Args:
        positions: token positions, any shape: a numpy array (or a list, an
            int) or a torch tensor, ints or floats, each in ``0 .. 2**31 - 1``.
        floor_scale: positions per step, > 0 (HF ``floor_scale``, 8192).
        attn_scale: the strength, a finite number (HF ``attn_scale``, 0.1).

    Returns:
        The scales, the shape of ``positions``: a float64 numpy array, or a
        float64 tensor on ``positions``' device.

    Raises:
        TypeError: ``positions`` not of int or float values (bool, complex,
            strings); ``floor_scale`` or ``attn_scale`` not a real number.
        ValueError: a negative, NaN, infinite or too large position (``2**31``
            and up); ``floor_scale`` not > 0, ``attn_scale`` not finite.

    Examples:
        >>> import torch
        >>> import posenc
        >>> positions = torch.tensor([0, 8190, 8191, 100_000])  # cache_position
        >>> posenc.attn_temperature(positions)
        tensor([1.0000, 1.0000, 1.0693, 1.2565], dtype=torch.float64)
    """
    fs = checks.check_number(floor_scale, "floor_scale", positive=True)
    scale = checks.check_number(attn_scale, "attn_scale")
    if checks.is_torch(positions):
        torch = sys.modules["torch"]
        if positions.dtype == torch.bool or positions.is_complex():
            raise TypeError(f"positions must hold int or float values; got {positions.dtype}")
        p = positions.detach().to(torch.float64)
        _check_values(p, positions.numel())
        return 1.0 + scale * torch.log1p(torch.floor((p + 1.0) / fs))
    arr = np.asarray(positions)
    if arr.dtype.kind not in "iuf":
        raise TypeError(
            f"positions must hold int or float values; got dtype {arr.dtype} from "
            f"{type(positions).__name__}"
        )
    p = arr.astype(np.float64)
    _check_values(p, p.size)
    return 1.0 + scale * np.log1p(np.floor((p + 1.0) / fs))


def _check_values(p: Any, count: int) -> None:
    """Positions (float64) finite and in ``0 .. 2**31 - 1``: the log of a negative step has
    no value (position -2 gives log1p(-1))."""
    if not count or checks.compiling():
        return
    lo, _ = checks.check_range(p.reshape(-1), 0.0, "positions")
    if lo < 0:
        raise ValueError(f"positions must be >= 0; got {lo:g}")
