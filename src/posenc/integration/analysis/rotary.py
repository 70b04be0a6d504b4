"""Measured properties of rotary embeddings (RoPE): relative scores, long-term decay, scaling.

- :func:`rope_relative`: ``q_m . k_n`` depends on ``m - n`` only; measured as
  the spread over ``m`` at each fixed offset (needs torch).
- :func:`rope_decay`: RoFormer's bound on ``|q . k|`` against relative
  distance (Su et al. 2021, section 3.4.3).
- :func:`scaling_curves`: the angular frequency of each rotary pair under the
  scaling schedules (default, linear, NTK, YaRN, llama3), from
  :mod:`posenc.rotary.schedules`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc.families.rotary.schedules import frequencies


def rope_decay(head_dim: int, base: float, max_distance: int) -> tuple[Any, Any, Any]:
    """RoFormer's long-term decay bound against relative distance, relative to distance 0.

    With ``S_j = sum_{k<j} e^{i r theta_k}``, ``|q . k|`` is bounded by
    ``max |h| * sum_j |S_j|`` (Su et al. 2021, section 3.4.3); the curve is
    ``(1 / (d/2)) sum_j |S_j|`` divided by its value at ``r = 0``.

    Returns:
        ``(r, bound, mean_abs)``: the distances ``0 .. max_distance``, the
        relative bound at each, and ``|mean_j e^{i r theta_j}|``.

    Examples:
        >>> import posenc.analysis
        >>> r, bound, mean_abs = posenc.analysis.rope_decay(16, 10000.0, 64)
        >>> len(r), bound[[0, 8, 64]].round(3)
        (65, array([1.   , 0.683, 0.807]))
        >>> mean_abs[[0, 8, 64]].round(3)
        array([1.   , 0.674, 0.776])
    """
    half = head_dim // 2
    theta = base ** (-2.0 * np.arange(half) / head_dim)
    r = np.arange(0, max_distance + 1, dtype=np.float64)
    e = np.exp(1j * r[:, None] * theta[None, :])
    partial = np.cumsum(e, axis=1)
    bound = np.abs(partial).mean(axis=1)
    return r, bound / bound[0], np.abs(e.mean(axis=1))


def scaling_curves(head_dim: int, base: float, factor: float, original: int) -> dict[str, Any]:
    """Angular frequency of each rotary pair under default, linear, NTK, YaRN and llama3.

    Args:
        head_dim: rotary channels.
        base: the base (``rope_theta``).
        factor: the scaling factor.
        original: the pretraining length (``original_max_position_embeddings``).

    Returns:
        Schedule name -> float64 array of the ``head_dim // 2`` angular frequencies.

    Examples:
        >>> import posenc.analysis
        >>> curves = posenc.analysis.scaling_curves(8, 10000.0, factor=4.0, original=2048)
        >>> curves["default"]
        array([1.   , 0.1  , 0.01 , 0.001])
        >>> for name, omega in curves.items():  # what each pair's frequency is divided by
        ...     print(name, (curves["default"] / omega).round(2))
        default [1. 1. 1. 1.]
        linear [4. 4. 4. 4.]
        ntk [1.   1.59 2.52 4.  ]
        yarn [1.  1.  1.6 4. ]
        llama3 [1.   1.   1.23 4.  ]
    """
    settings: dict[str, dict[str, Any]] = {
        "default": {},
        "linear": {"factor": factor},
        "ntk": {"factor": factor},
        "yarn": {"factor": factor, "original_max_position_embeddings": original},
        "llama3": {
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        },
    }
    return {
        name: np.array([float(w) for w in frequencies(name, head_dim, base, params).omega])
        for name, params in settings.items()
    }


def rope_relative(head_dim: int = 64, length: int = 64, seed: int = 0) -> dict[str, float]:
    """The spread of ``q_m . k_n`` over ``m`` at each ``m - n``: zero if scores depend on ``m - n``.

    The same random ``q`` and ``k`` at every position, rotated by
    :func:`posenc.apply_rotary`. Needs torch.

    Returns:
        ``"float64"`` and ``"float32"``: the largest spread over all offsets
        with the rotation in that dtype; ``"scale"``: ``|q| . |k|``, the size
        the float32 spread compares with.

    Examples:
        >>> import posenc.analysis
        >>> spread = posenc.analysis.rope_relative(head_dim=16, length=16)
        >>> round(spread["scale"], 3)
        11.859
        >>> spread["float64"] < 1e-13, spread["float32"] / spread["scale"] < 1e-6
        (True, True)
    """
    import torch

    from posenc.families.rotary.apply import apply_rotary
    from posenc.families.rotary.module import Rotary

    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(head_dim, generator=gen, dtype=torch.float64)
    rope = Rotary(head_dim)
    c, s = rope.cos_sin(torch.arange(length), dtype=torch.float64)
    out: dict[str, float] = {}
    for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        qs = apply_rotary(q.expand(length, -1).to(dtype), c, s)
        ks = apply_rotary(k.expand(length, -1).to(dtype), c, s)
        scores = (qs.double() @ ks.double().T).numpy()
        spread = max(
            np.ptp(np.diagonal(scores, offset)) for offset in range(-length + 2, length - 1)
        )
        out[name] = float(spread)
    out["scale"] = float((q.abs() @ k.abs()).item())
    return out
