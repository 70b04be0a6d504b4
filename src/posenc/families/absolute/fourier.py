"""Fourier features of continuous coordinates: NeRF's positional encoding and random features.

Notation: ``x`` has shape ``(..., C)`` (``C`` coordinates per point, e.g. 3
for a 3-D position), numpy or torch; results keep the leading shape and the
array type (torch stays on its device).

- :func:`nerf`: ``[x, sin(f_0 x), cos(f_0 x), sin(f_1 x), cos(f_1 x), ...]``
  with octave frequencies ``f_j = 2**j`` (Mildenhall et al. 2020, NeRF
  ``run_nerf_helpers.py`` ``Embedder``).
- :func:`fourier_features`: ``[sin(2 pi B x), cos(2 pi B x)]`` for a matrix
  ``B`` (Tancik et al. 2020, "Fourier Features Let Networks Learn High
  Frequency Functions"); :func:`gaussian_fourier_matrix` draws the seeded
  ``B ~ N(0, sigma**2)`` and :func:`gaussian_fourier_features` does both.

Precision: NeRF's angles come from the exact angle engine (each frequency held
exactly, the float value of ``x`` taken as given), so a float32 result is
within float32 rounding of the true value even where ``|f x|`` is 1e9. The
random features are computed in turns, where they already live: ``B x`` in
float64, reduced modulo 1 before ``sin``/``cos``, so only float64 rounding of
the dot product remains (``C * |B| |x| * 2**-53`` turns), not the ``2 pi``
product's float32 error.
"""

from __future__ import annotations

import decimal
import functools
import math
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.core.angles import (  # the engine's pi: pi * f / 2 pi == f / 2
    PI,
    Turns,
    decimal_context,
    float64_is_fast,
    sincos_numpy,
    sincos_torch,
    turns_from_radians,
)

#: The order of each band's two values: sin then cos, or cos then sin.
Order = Literal["sin_cos", "cos_sin"]
_ORDERS = ("sin_cos", "cos_sin")
#: Largest ``|x| * f`` (in turns) at which the engine keeps NeRF angles to ~1e-12 turn.
_MAX_TURNS = float(2**40)
#: Most NeRF bands: the engine holds each frequency in float32 pieces (for devices without
#: fast float64), so the top band ``2**(L - 1)``, times pi, must stay below ``2**128``.
MAX_NUM_FREQS = 128


# --------------------------------------------------------------------------------------
# Validation and dispatch


def _check_x(x: Any, name: str = "x") -> Any:
    """Validate coordinates: a numeric array or tensor of shape (..., C), finite."""
    if checks.is_torch(x):
        import torch

        if x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold int or float values; got {x.dtype}")
        arr = x
    else:
        arr = np.asarray(x)
        if arr.dtype.kind not in "iuf":
            raise TypeError(
                f"{name} must be an array or tensor of int or float coordinates (..., C); "
                f"got dtype {arr.dtype} from {type(x).__name__}"
            )
    if arr.ndim < 1:
        raise ValueError(f"{name} must have shape (..., C) with at least one axis; got a scalar")
    return arr


def _max_abs(arr: Any, name: str) -> float:
    """``max |arr|``, rejecting NaN and infinities (syncs a device tensor once)."""
    if checks.is_torch(arr):
        import torch

        if arr.numel() == 0:
            return 0.0
        a = arr.detach()
        if a.is_floating_point() and not bool(torch.isfinite(a).all()):
            raise ValueError(f"{name} must be finite; got NaN or infinite values")
        return float(a.abs().max().double())
    if arr.size == 0:
        return 0.0
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite; got NaN or infinite values")
    return float(np.abs(arr).max())


def _out_dtype(arr: Any, dtype: Any) -> str:
    """The output dtype name: ``dtype``, else the float dtype of ``x``, else float32."""
    if dtype is not None:
        return checks.dtype_name(dtype)
    if checks.is_torch(arr):
        return checks.dtype_name(arr.dtype) if arr.is_floating_point() else "float32"
    return arr.dtype.name if arr.dtype.kind == "f" else "float32"


def _check_order(order: Any) -> None:
    if order not in _ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, _ORDERS))}; got {order!r}")


# --------------------------------------------------------------------------------------
# NeRF


def nerf_frequencies(
    num_freqs: int = 10, *, pi: bool = False, log_sampling: bool = True
) -> npt.NDArray[np.float64]:
    """NeRF's frequency bands, in radians per unit of ``x`` (float64).

    ``2**linspace(0, L-1, L)`` with ``log_sampling``, else
    ``linspace(1, 2**(L-1), L)``; times ``pi`` if asked.

    Examples:
        >>> import posenc
        >>> posenc.nerf_frequencies(4).tolist()
        [1.0, 2.0, 4.0, 8.0]
        >>> posenc.nerf_frequencies(4, log_sampling=False).tolist()
        [1.0, 3.3333333333333335, 5.666666666666667, 8.0]
        >>> posenc.nerf_frequencies(2, pi=True).round(4).tolist()
        [3.1416, 6.2832]
    """
    return _nerf_turns(
        _check_num_freqs(num_freqs),
        checks.check_bool(pi, "pi"),
        checks.check_bool(log_sampling, "log_sampling"),
    ).radians.copy()


def _check_num_freqs(num_freqs: Any) -> int:
    """``L``, from 0 to :data:`MAX_NUM_FREQS`, checked before any frequency is computed."""
    num_freqs = checks.check_int(num_freqs, "num_freqs", minimum=0)
    if num_freqs > MAX_NUM_FREQS:
        raise ValueError(
            f"num_freqs must be at most {MAX_NUM_FREQS}: the top band 2**(num_freqs - 1) "
            f"(times pi) must stay within float32 range, where the engine holds frequencies; "
            f"got {num_freqs}"
        )
    return num_freqs


def _points(arr: Any) -> int:
    """The number of points of ``x`` ``(..., C)``: every axis but the last."""
    return math.prod(int(n) for n in arr.shape[:-1])


@functools.lru_cache(maxsize=64)
def _nerf_turns(num_freqs: int, pi: bool, log_sampling: bool) -> Turns:
    ctx = decimal_context()
    top = num_freqs - 1
    if log_sampling:
        freqs = [decimal.Decimal(2**j) for j in range(num_freqs)]
    else:
        # linspace(1, 2**(L-1), L), held exactly (NeRF rounds the step to float32)
        step = ctx.divide(2**top - 1, top) if top > 0 else decimal.Decimal(0)
        freqs = [
            ctx.add(decimal.Decimal(1), ctx.multiply(decimal.Decimal(j), step))
            for j in range(num_freqs)
        ]
    if pi:
        freqs = [ctx.multiply(f, PI) for f in freqs]
    return turns_from_radians(freqs)


def nerf(
    x: Any,
    num_freqs: int = 10,
    *,
    include_input: bool = True,
    pi: bool = False,
    log_sampling: bool = True,
    dtype: Any = None,
) -> Any:
    """NeRF's positional encoding ``gamma(x)``, exact at any coordinate below 2**31.

    Mildenhall et al. 2020, eq. 4, as the reference code computes it
    (``run_nerf_helpers.py``: ``Embedder`` with ``include_input=True``,
    ``periodic_fns=[sin, cos]``): ``[x, sin(f_0 x), cos(f_0 x), sin(f_1 x), ...]``,
    each term of shape ``(..., C)``.

    Args:
        x: coordinates ``(..., C)``: numpy array, sequence or torch tensor.
            Float values are taken as given (no rounding of ``x`` happens).
        num_freqs: ``L``, the number of frequency bands (``multires``): 10 for
            positions and 4 for view directions in NeRF; at most
            :data:`MAX_NUM_FREQS`.
        include_input: put ``x`` itself first, as NeRF does.
        pi: multiply every frequency by ``pi``, as the paper and tiny-cuda-nn
            do (``sin(2**j pi x)``); the original NeRF code has no ``pi``.
        log_sampling: frequencies ``2**linspace(0, L-1, L)`` (octaves); else
            ``linspace(1, 2**(L-1), L)``.
        dtype: output dtype; by default the float dtype of ``x`` (float32 for
            integer ``x``).

    Returns:
        ``(..., C * (include_input + 2 * num_freqs))``: 63 channels for
        ``L = 10`` on 3-D input. numpy for numpy input, torch on ``x``'s
        device for torch input; no points (``x`` of shape ``(0, C)``) give
        no rows.

    Raises:
        TypeError: ``x`` not numeric, ``num_freqs`` not an int, flags not bool.
        ValueError: ``x`` a scalar, NaN/inf or ``|x| >= 2**31``; ``num_freqs``
            negative or above :data:`MAX_NUM_FREQS`, or a result of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (both refused before
            any work); no channels at all (``num_freqs=0`` without the input);
            ``|x| * f / (2 pi)`` beyond ``2**40`` turns (angles not exact).

    Examples:
        >>> import numpy as np
        >>> import posenc
        >>> posenc.nerf(np.array([[0.5]]), 2).round(4)
        array([[0.5   , 0.4794, 0.8776, 0.8415, 0.5403]])
    """
    arr = _check_x(x)
    num_freqs = _check_num_freqs(num_freqs)
    include_input = checks.check_bool(include_input, "include_input")
    pi = checks.check_bool(pi, "pi")
    log_sampling = checks.check_bool(log_sampling, "log_sampling")
    if not include_input and not num_freqs:
        raise ValueError("num_freqs=0 with include_input=False leaves no channels")
    channels = int(arr.shape[-1]) * (include_input + 2 * num_freqs)
    checks.check_elements(
        _points(arr) * channels, f"the NeRF encoding of x {tuple(arr.shape)}, num_freqs={num_freqs}"
    )
    turns = _nerf_turns(num_freqs, pi, log_sampling)
    name = _out_dtype(arr, dtype)
    biggest = _max_abs(arr, "x")
    checks.check_exact(biggest, biggest, "x")
    if num_freqs and not biggest * float(np.abs(turns.hi).max()) < _MAX_TURNS:
        raise ValueError(
            f"max |x| * f = {biggest * float(turns.radians.max()):.3g} radians exceeds "
            f"2 pi * 2**40: num_freqs={num_freqs} is too many for coordinates this large"
        )
    if checks.is_torch(arr):
        return _nerf_torch(arr, turns, include_input, name)
    if num_freqs:
        s, c = sincos_numpy(arr, turns)  # (..., C, L)
        # (..., C, L, 2) -> (..., L, 2, C): NeRF's band-major order; the width is spelt
        # out, since -1 cannot be inferred where there are no points
        width = 2 * num_freqs * arr.shape[-1]
        bands = np.moveaxis(np.stack([s, c], axis=-1), -3, -1).reshape((*arr.shape[:-1], width))
    else:
        bands = np.empty((*arr.shape[:-1], 0))
    np_dtype = checks.numpy_dtype(name)
    parts = [arr.astype(np_dtype)] if include_input else []
    parts.append(bands.astype(np_dtype))
    return np.concatenate(parts, axis=-1)


def _nerf_torch(x: Any, turns: Turns, include_input: bool, name: str) -> Any:
    import torch

    out_dtype = checks.torch_dtype(name)
    parts = [x.to(out_dtype)] if include_input else []
    if turns.size:
        s, c = sincos_torch(x, turns)
        width = 2 * turns.size * x.shape[-1]  # spelt out: no points, no -1
        bands = torch.stack([s, c], dim=-1).movedim(-3, -1).reshape((*x.shape[:-1], width))
        parts.append(bands.to(out_dtype))
    return torch.cat(parts, dim=-1)


# --------------------------------------------------------------------------------------
# Random Fourier features


def gaussian_fourier_matrix(
    num_features: int, in_features: int, *, sigma: float = 1.0, seed: int = 0
) -> npt.NDArray[np.float64]:
    """The seeded Gaussian matrix ``B`` of Tancik et al. 2020: ``B ~ N(0, sigma**2)``.

    ``B = sigma * numpy.random.default_rng(seed).standard_normal((num_features,
    in_features))``: the same seed gives the same matrix on every machine.

    Args:
        num_features: ``m``, rows of ``B`` (the encoding has ``2 m`` channels).
        in_features: ``C``, coordinates per point.
        sigma: standard deviation (the paper's scale, tuned per task: 1 to 100).
        seed: the generator seed (a non-negative int).

    Returns:
        ``(num_features, in_features)`` float64 numpy array, in cycles per unit.

    Raises:
        TypeError: non-int sizes or seed, non-numeric ``sigma``.
        ValueError: sizes below 1, a negative seed, ``sigma <= 0``, or a matrix
            of more than :data:`posenc.core.checks.MAX_ELEMENTS` entries
            (refused before drawing).

    Examples:
        >>> import numpy as np
        >>> import posenc
        >>> B = posenc.gaussian_fourier_matrix(256, 2, sigma=10.0, seed=0)
        >>> B.shape
        (256, 2)
        >>> np.array_equal(B, 10.0 * np.random.default_rng(0).standard_normal((256, 2)))
        True
    """
    m = checks.check_int(num_features, "num_features", minimum=1)
    c = checks.check_int(in_features, "in_features", minimum=1)
    checks.check_elements(m * c, f"B (num_features={m} x in_features={c})")
    s = checks.check_number(sigma, "sigma", positive=True)
    seed = checks.check_int(seed, "seed", minimum=0)
    return s * np.random.default_rng(seed).standard_normal((m, c))


def fourier_features(x: Any, B: Any, *, order: Order = "sin_cos", dtype: Any = None) -> Any:
    """Fourier features ``[sin(2 pi B x), cos(2 pi B x)]`` (Tancik et al. 2020).

    The reference code (``fourier-feature-networks`` demo, ``input_mapping``)
    concatenates ``[sin, cos]`` of ``(2 pi x) @ B.T``; the paper writes
    ``[cos, sin]`` (``order="cos_sin"``). ``B x`` is in turns, so it is
    reduced modulo one turn in float64 before ``sin``/``cos``.

    Args:
        x: coordinates ``(..., C)``, numpy or torch.
        B: ``(m, C)`` matrix in cycles per unit (numpy, sequence or torch).
        order: ``"sin_cos"`` (code) or ``"cos_sin"`` (paper).
        dtype: output dtype; by default the float dtype of ``x`` (float32 for
            integer ``x``).

    Returns:
        ``(..., 2 m)``: numpy for numpy input, torch on ``x``'s device for torch.

    Raises:
        TypeError: non-numeric ``x`` or ``B``.
        ValueError: ``B`` not 2-D, ``B.shape[1] != x.shape[-1]``, NaN/inf values,
            unknown ``order``, a result of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before any work).

    Examples:
        >>> import numpy as np
        >>> import posenc
        >>> B = np.array([[1.0, 0.0], [0.0, 2.0]])  # cycles per unit along x and along y
        >>> xy = np.array([[0.25, 0.125]])  # a quarter turn in both rows of B
        >>> posenc.fourier_features(xy, B).round(4)  # [sin, sin, cos, cos]
        array([[1., 1., 0., 0.]])
        >>> posenc.fourier_features(xy, B, order="cos_sin").round(4)  # the paper's order
        array([[0., 0., 1., 1.]])
    """
    arr = _check_x(x)
    _check_order(order)
    b = _check_x(B, "B")
    if b.ndim != 2 or b.shape[1] != arr.shape[-1]:
        raise ValueError(
            f"B must have shape (num_features, C) with C = x.shape[-1] = {arr.shape[-1]}; "
            f"got {tuple(b.shape)}"
        )
    checks.check_elements(
        _points(arr) * 2 * int(b.shape[0]),
        f"the Fourier features of x {tuple(arr.shape)} with B {tuple(b.shape)}",
    )
    _max_abs(arr, "x")
    _max_abs(b, "B")
    name = _out_dtype(arr, dtype)
    if checks.is_torch(arr):
        return _fourier_torch(arr, b, order, name)
    bn = b.detach().cpu().numpy() if checks.is_torch(b) else b
    t = np.asarray(arr, dtype=np.float64) @ np.asarray(bn, dtype=np.float64).T
    angle = (2.0 * math.pi) * (t - np.rint(t))  # reduced to [-pi, pi]
    s, c = np.sin(angle), np.cos(angle)
    first, second = (s, c) if order == "sin_cos" else (c, s)
    return np.concatenate([first, second], axis=-1).astype(checks.numpy_dtype(name))


def _fourier_torch(x: Any, b: Any, order: str, name: str) -> Any:
    import torch

    # devices without fast float64 (MPS) compute on the CPU: exactness first
    where = x.device if float64_is_fast(x.device) else torch.device("cpu")
    bt = b if checks.is_torch(b) else torch.from_numpy(np.ascontiguousarray(b))
    with torch.autocast(where.type, enabled=False):
        t = x.to(where, torch.float64) @ bt.to(where, torch.float64).T
        angle = (2.0 * math.pi) * (t - torch.round(t))
        s, c = torch.sin(angle), torch.cos(angle)
    first, second = (s, c) if order == "sin_cos" else (c, s)
    return torch.cat([first, second], dim=-1).to(x.device, checks.torch_dtype(name))


def gaussian_fourier_features(
    x: Any,
    num_features: int,
    *,
    sigma: float = 1.0,
    seed: int = 0,
    order: Order = "sin_cos",
    dtype: Any = None,
) -> Any:
    """Gaussian random Fourier features of ``x``: :func:`fourier_features` with a seeded ``B``.

    ``B = gaussian_fourier_matrix(num_features, x.shape[-1], sigma=sigma, seed=seed)``.

    Returns:
        ``(..., 2 * num_features)``, numpy or torch like ``x``.

    Raises:
        TypeError, ValueError: as :func:`gaussian_fourier_matrix` and
            :func:`fourier_features`; a result of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values is refused before ``B``
            is drawn.

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> xyz = torch.rand(4, 3)  # 4 points in 3-D
        >>> feats = posenc.gaussian_fourier_features(xyz, 16, sigma=10.0)
        >>> feats.shape, feats.dtype
        (torch.Size([4, 32]), torch.float32)
        >>> B = posenc.gaussian_fourier_matrix(16, 3, sigma=10.0)  # the same seed, 0
        >>> torch.allclose(feats, posenc.fourier_features(xyz, B))
        True
    """
    arr = _check_x(x)
    m = checks.check_int(num_features, "num_features", minimum=1)
    checks.check_elements(
        _points(arr) * 2 * m,
        f"the Gaussian Fourier features of x {tuple(arr.shape)} with num_features={m}",
    )
    B = gaussian_fourier_matrix(num_features, int(arr.shape[-1]), sigma=sigma, seed=seed)
    return fourier_features(arr, B, order=order, dtype=dtype)
