"""DINOv3's RoPE: patch centres in [-1, 1], augmented in training, periods from a base.

Siméoni et al. 2025, "DINOv3" (arXiv:2508.10104); facebookresearch/dinov3
``dinov3/layers/rope_position_encoding.py`` (``RopePositionEmbedding``), transformers'
``DINOv3ViTRopePositionEmbedding`` (``models/dinov3_vit/modeling_dinov3_vit.py``) and
timm's ``RotaryEmbeddingDinoV3``.

The centre of patch ``(i, j)`` of an ``H x W`` grid is ``((i + 1/2) / H, (j + 1/2) / W)``
mapped to ``[-1, 1]`` (``2 c - 1``); ``normalize_coords="max"`` or ``"min"`` divides
both by ``max(H, W)`` or ``min(H, W)`` instead of each by its own size. In training,
one draw per image batch moves every coordinate alike: ``+ U(-shift, shift)`` per axis,
``* exp(U(-ln jitter, ln jitter))`` per axis, ``* exp(U(-ln rescale, ln rescale))`` for
both (transformers' ``augment_patches_center_coordinates``, in that order, with the
global RNG). With ``D = head_dim`` and ``k < D / 4`` the periods are ``base ** (4k /
D)`` (``base`` 100), or ``min_period * (max_period / min_period) ** (k / (D/4 - 1))``,
and the angles::

    theta = 2 pi * [c_row / period, c_col / period]     (D / 2 angles: rows, then columns)

in the half layout (``cat(theta, theta)``, ``rotate_half``). posenc evaluates them with
the exact angle engine (:mod:`posenc.core.angles`) from 40-digit periods; the references
round ``coords / period`` and ``2 pi`` times it to float32 (an error of about ``|theta|
* 2**-23``, with ``|theta| <= 2 pi |c|``).
"""

from __future__ import annotations

import decimal
import math
from typing import Any

import torch

from posenc.core import checks
from posenc.core.angles import PI, decimal_context, sincos_torch
from posenc.core.buffers import DerivedBuffers
from posenc.families.rotary.multiaxis.coordinates import (
    CoordinateRotation,
    check_coords,
    rotate_patches,
)
from posenc.families.rotary.schedules import RopeFrequencies

#: What ``normalize_coords`` accepts: each axis by its own size, or both by the larger
#: or the smaller (DINOv3's ``RopePositionEmbedding``).
NORMALIZE_COORDS = ("separate", "max", "min")

_CTX = decimal_context()


def _periods(
    head_dim: int, base: float | None, min_period: float | None, max_period: float | None
) -> list[decimal.Decimal]:
    count = head_dim // 4
    if base is not None:
        log_base = _CTX.ln(decimal.Decimal(base))
        return [
            _CTX.exp(_CTX.divide(_CTX.multiply(4 * k, log_base), head_dim)) for k in range(count)
        ]
    assert min_period is not None and max_period is not None  # checked by the caller
    lo = decimal.Decimal(min_period)
    log_ratio = _CTX.ln(_CTX.divide(decimal.Decimal(max_period), lo))
    steps = max(count - 1, 1)  # torch.linspace(0, 1, 1) is [0]
    return [
        _CTX.multiply(lo, _CTX.exp(_CTX.divide(_CTX.multiply(k, log_ratio), steps)))
        for k in range(count)
    ]


def _check_schedule(
    head_dim: Any, base: Any, min_period: Any, max_period: Any
) -> tuple[int, float | None, float | None, float | None]:
    head_dim = checks.check_channels(head_dim, "head_dim", minimum=4)
    if head_dim % 4:
        raise ValueError(
            f"head_dim must be a multiple of 4 (rows and columns, two halves); got {head_dim}"
        )
    both = min_period is not None and max_period is not None
    if (base is None) != both or (min_period is None) != (max_period is None):
        raise ValueError(
            "give either base or both min_period and max_period (DINOv3's "
            f"RopePositionEmbedding); got base={base!r}, min_period={min_period!r}, "
            f"max_period={max_period!r}"
        )
    if base is not None:
        base = checks.check_number(base, "base", positive=True)
        return head_dim, base, None, None
    lo = checks.check_number(min_period, "min_period", positive=True)
    hi = checks.check_number(max_period, "max_period", positive=True)
    return head_dim, None, lo, hi


def dinov3_frequencies(
    head_dim: int,
    base: float | None = 100.0,
    *,
    min_period: float | None = None,
    max_period: float | None = None,
) -> RopeFrequencies:
    """DINOv3's ``head_dim / 4`` angular frequencies ``2 pi / period``, exact.

    Periods ``base ** (4k / head_dim)`` (transformers' ``1 / inv_freq``), or
    geometric from ``min_period`` to ``max_period`` (DINOv3's ``RopePositionEmbedding``
    with ``base=None``); 40 digits.

    Raises:
        TypeError: non-numeric arguments.
        ValueError: ``head_dim`` not a multiple of 4; neither or both of ``base`` and
            the pair ``min_period``, ``max_period``; values <= 0.

    Examples:
        >>> import math
        >>> from posenc.rotary.multiaxis import dinov3_frequencies
        >>> f = dinov3_frequencies(16, base=100.0)
        >>> [round(2 * math.pi / float(w), 4) for w in f.inv_freq]  # the periods
        [1.0, 3.1623, 10.0, 31.6228]
        >>> f = dinov3_frequencies(16, None, min_period=0.5, max_period=4.0)
        >>> [round(2 * math.pi / float(w), 4) for w in f.inv_freq]
        [0.5, 1.0, 2.0, 4.0]
    """
    head_dim, base, lo, hi = _check_schedule(head_dim, base, min_period, max_period)
    two_pi = _CTX.multiply(PI, 2)
    return RopeFrequencies(tuple(_CTX.divide(two_pi, p) for p in _periods(head_dim, base, lo, hi)))


def dinov3_coords(
    height: int,
    width: int,
    *,
    normalize_coords: str = "separate",
    device: Any = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Patch centres of a ``height x width`` grid in ``[-1, 1]``, ``(height * width, 2)``.

    Row-major ``(row, column)``: ``2 (i + 1/2) / H - 1`` and ``2 (j + 1/2) / W - 1``
    (transformers' ``get_patches_center_coordinates``), or divided by ``max(H, W)`` or
    ``min(H, W)`` for ``normalize_coords="max"`` or ``"min"`` (DINOv3's). Computed in
    float64 (the references in float32).

    Raises:
        ValueError: sizes below 1, an unknown ``normalize_coords``.

    Examples:
        >>> from posenc.rotary.multiaxis import dinov3_coords
        >>> dinov3_coords(2, 4).tolist()[:4]  # the first row of patches
        [[-0.5, -0.75], [-0.5, -0.25], [-0.5, 0.25], [-0.5, 0.75]]
        >>> dinov3_coords(2, 4, normalize_coords="max")[:, 0].unique().tolist()  # rows / 4
        [-0.75, -0.25]
    """
    height = checks.check_int(height, "height", minimum=1)
    width = checks.check_int(width, "width", minimum=1)
    checks.check_choice(normalize_coords, "normalize_coords", NORMALIZE_COORDS)
    checks.check_elements(2 * height * width, f"the coordinates of a {height} x {width} grid")
    if normalize_coords == "separate":
        h, w = height, width
    else:
        h = w = max(height, width) if normalize_coords == "max" else min(height, width)
    rows = (torch.arange(height, dtype=torch.float64, device=device) + 0.5) / h
    cols = (torch.arange(width, dtype=torch.float64, device=device) + 0.5) / w
    grid = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).flatten(0, 1)
    return (2.0 * grid - 1.0).to(dtype)


def dinov3_cos_sin(
    coords: torch.Tensor, freqs: RopeFrequencies, *, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ``cos`` and ``sin`` of DINOv3's angles, half layout, ``(..., n, 4 * len(freqs))``.

    ``theta = [c_row * omega, c_col * omega]`` (rows' ``D / 4`` angles, then
    columns'), repeated as ``cat(theta, theta)``: transformers'
    ``DINOv3ViTRopePositionEmbedding`` output, each value exact before one rounding.

    Args:
        coords: ``(..., n, 2)`` float ``(row, column)`` coordinates (:func:`dinov3_coords`,
            augmented or not).
        freqs: :func:`dinov3_frequencies`.
        dtype: the result's dtype.

    Raises:
        TypeError: ``coords`` not a float tensor.
        ValueError: ``coords`` not ``(n, 2)``/``(batch, n, 2)``, not finite or beyond
            ``2**31``.

    Examples:
        >>> import torch
        >>> from posenc.rotary.multiaxis import dinov3_cos_sin, dinov3_frequencies
        >>> freqs = dinov3_frequencies(8, base=100.0)  # periods 1 and 10
        >>> cos, sin = dinov3_cos_sin(torch.tensor([[0.25, -0.5]]), freqs)
        >>> torch.atan2(sin, cos)  # 2 pi * [0.25 / 1, 0.25 / 10, -0.5 / 1, -0.5 / 10], twice
        tensor([[ 1.5708,  0.1571, -3.1416, -0.3142,  1.5708,  0.1571, -3.1416, -0.3142]])
    """
    coords = check_coords(coords)
    if not torch.compiler.is_compiling():
        checks.check_elements(
            coords.numel() * 4 * len(freqs.omega), f"DINOv3 tables of coords {tuple(coords.shape)}"
        )
    checks.check_position_tensor(coords, "coords", exact=True)
    s, c = sincos_torch(coords, freqs.turns)  # (..., n, 2, D / 4)
    c, s = c.flatten(-2), s.flatten(-2)
    return torch.cat([c, c], dim=-1).to(dtype), torch.cat([s, s], dim=-1).to(dtype)


def _check_augment(value: Any, name: str, least: float) -> float | None:
    if value is None:
        return None
    v = checks.check_number(value, name)
    if v < least:
        raise ValueError(f"{name} must be None or >= {least:g}; got {value!r}")
    return v


class DINOv3Rope(DerivedBuffers):
    """DINOv3's RoPE: patch centres in ``[-1, 1]``, shift/jitter/rescale in training.

    transformers' ``DINOv3ViTRopePositionEmbedding`` (and DINOv3's
    ``RopePositionEmbedding``, timm's ``RotaryEmbeddingDinoV3``) with exact angles:
    :meth:`coords` gives the patch centres (augmented in ``train()`` mode, one draw per
    call), ``rope(q, k, coords)`` rotates the last ``n`` tokens of ``q`` and ``k``
    (half layout) and leaves the class and register tokens before them, as
    transformers' ``apply_rotary_pos_emb`` does.

    Args:
        head_dim: channels per head, a multiple of 4.
        num_heads: heads of ``q`` and ``k``, checked when given (the angles are the
            same for every head).
        base: the period base (transformers' ``rope_theta``, 100); ``None`` with
            ``min_period`` and ``max_period``.
        min_period, max_period: geometric periods instead of ``base``.
        normalize_coords: ``"separate"`` (transformers), ``"max"`` or ``"min"``.
        shift: training shift bound (transformers' ``pos_embed_shift``), or None.
        jitter: training per-axis scale bound, ``>= 1`` (``pos_embed_jitter``).
        rescale: training scale bound for both axes, ``>= 1`` (``pos_embed_rescale``).

    Attributes:
        inv_freq: float32 ``(head_dim // 4,)``, ``1 / period`` (transformers' buffer).
        periods: float32 ``(head_dim // 4,)`` (DINOv3's and timm's buffer). Both are
            non-persistent and rebuilt exact by every move or cast; a DINOv3 checkpoint's
            ``periods`` (bfloat16) is checked against the schedule when loaded.

    Raises:
        TypeError, ValueError: as :func:`dinov3_frequencies`; an unknown
            ``normalize_coords``; ``shift < 0``, ``jitter`` or ``rescale`` below 1.

    Examples:
        >>> import torch
        >>> from posenc.rotary.multiaxis import DINOv3Rope
        >>> rope = DINOv3Rope(64, 6, shift=1.0, jitter=None, rescale=2.0)
        >>> rope
        DINOv3Rope(head_dim=64, base=100, normalize_coords='separate', shift=1, rescale=2)
        >>> coords = rope.eval().coords(14, 14)  # (196, 2) in [-1, 1]
        >>> q, k = torch.randn(2, 1, 6, 1 + 4 + 196, 64)  # class, 4 registers, patches
        >>> q2, k2 = rope(q, k, coords)
        >>> torch.equal(q2[:, :, :5], q[:, :, :5])
        True
        >>> g = torch.Generator().manual_seed(0)
        >>> moved = rope.train().coords(14, 14, generator=g)  # one shift and rescale drawn
        >>> bool((moved - coords).abs().max() > 0)
        True
    """

    inv_freq: torch.Tensor
    periods: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        num_heads: int | None = None,
        *,
        base: float | None = 100.0,
        min_period: float | None = None,
        max_period: float | None = None,
        normalize_coords: str = "separate",
        shift: float | None = None,
        jitter: float | None = None,
        rescale: float | None = None,
    ) -> None:
        super().__init__()
        self.head_dim, self.base, self.min_period, self.max_period = _check_schedule(
            head_dim, base, min_period, max_period
        )
        self.num_heads = None if num_heads is None else checks.check_int(num_heads, "num_heads", 1)
        checks.check_choice(normalize_coords, "normalize_coords", NORMALIZE_COORDS)
        self.normalize_coords = normalize_coords
        self.shift = _check_augment(shift, "shift", 0.0)
        self.jitter = _check_augment(jitter, "jitter", 1.0)
        self.rescale = _check_augment(rescale, "rescale", 1.0)
        self.freqs = dinov3_frequencies(
            self.head_dim, self.base, min_period=self.min_period, max_period=self.max_period
        )
        self.reset_parameters()  # inv_freq, periods

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        periods = _periods(self.head_dim, self.base, self.min_period, self.max_period)
        return {
            "inv_freq": torch.tensor([float(_CTX.divide(1, p)) for p in periods]).float(),
            "periods": torch.tensor([float(p) for p in periods]).float(),
        }

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # DINOv3's own checkpoints keep ``periods`` (persistent there, in bfloat16): it is
        # checked against this module's schedule to its own precision, then dropped
        key = prefix + "periods"
        value = state_dict.pop(key, None)
        if isinstance(value, torch.Tensor):
            ours = self.periods.detach().to("cpu", torch.float64)
            theirs = value.detach().to("cpu", torch.float64)
            ulp = torch.finfo(value.dtype).eps if value.is_floating_point() else 1.0
            if theirs.shape != ours.shape or bool(((theirs - ours).abs() > ulp * ours).any()):
                raise ValueError(
                    f"{key} of the state dict ({tuple(theirs.shape)}, {value.dtype}) is not "
                    f"this module's schedule ({self.extra_repr()}): build DINOv3Rope with "
                    "the checkpoint's base or min_period/max_period"
                )
        super()._load_from_state_dict(state_dict, prefix, *args)

    def extra_repr(self) -> str:
        schedule = (
            f"base={self.base:g}"
            if self.base is not None
            else f"min_period={self.min_period:g}, max_period={self.max_period:g}"
        )
        augment = "".join(
            f", {name}={value:g}"
            for name, value in (
                ("shift", self.shift),
                ("jitter", self.jitter),
                ("rescale", self.rescale),
            )
            if value is not None
        )
        return (
            f"head_dim={self.head_dim}, {schedule}, "
            f"normalize_coords={self.normalize_coords!r}{augment}"
        )

    def augment(
        self, coords: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``coords`` moved by one draw of the shift, jitter and rescale (in any mode).

        transformers' ``augment_patches_center_coordinates``: ``(1, 2)`` shifts, then
        ``(1, 2)`` log-uniform jitters, then one log-uniform rescale, each drawn as a
        float32 ``uniform_`` on ``coords``' device from ``generator`` (the global RNG by
        default): the same draws as the reference, so a seed gives its coordinates.
        Applied in ``coords``' dtype (float64 from :meth:`coords`).

        Raises:
            TypeError, ValueError: ``coords`` not float ``(..., n, 2)`` or not finite.
        """
        coords = check_coords(coords)
        draw: dict[str, Any] = {"dtype": torch.float32, "device": coords.device}
        if self.shift is not None:
            moved = torch.empty((1, 2), **draw).uniform_(
                -self.shift, self.shift, generator=generator
            )
            coords = coords + moved.to(coords.dtype)
        if self.jitter is not None:
            bound = math.log(self.jitter)
            scale = torch.empty((1, 2), **draw).uniform_(-bound, bound, generator=generator).exp()
            coords = coords * scale.to(coords.dtype)
        if self.rescale is not None:
            bound = math.log(self.rescale)
            scale = torch.empty(1, **draw).uniform_(-bound, bound, generator=generator).exp()
            coords = coords * scale.to(coords.dtype)
        return coords

    def coords(
        self,
        height: int,
        width: int,
        *,
        generator: torch.Generator | None = None,
        device: Any = None,
    ) -> torch.Tensor:
        """The patch centres of a ``height x width`` grid, ``(height * width, 2)`` float64.

        :func:`dinov3_coords` with this module's ``normalize_coords``; in ``train()``
        mode moved by one :meth:`augment` draw (call it once per batch and share the
        result across layers, as DINOv3 computes its tables once per forward pass).

        Raises:
            ValueError: sizes below 1.
        """
        device = self.inv_freq.device if device is None else device
        coords = dinov3_coords(height, width, normalize_coords=self.normalize_coords, device=device)
        if self.training:
            coords = self.augment(coords, generator=generator)
        return coords

    def cos_sin(
        self, coords: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`dinov3_cos_sin` of ``coords``: ``(..., n, head_dim)`` each."""
        return dinov3_cos_sin(coords, self.freqs, dtype=dtype)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, coords: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate the last ``n`` tokens of ``q`` and ``k`` by their ``coords`` ``(n, 2)``.

        ``coords`` as :meth:`coords` gives them (already augmented in training).

        Raises:
            TypeError: non-float ``q``/``k`` of different dtypes, bad ``coords``.
            ValueError: ``q``/``k`` not ``(batch, heads, seq, head_dim)``, more
                coordinates than tokens.
        """

        def tables(c: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
            cos, sin = dinov3_cos_sin(c, self.freqs, dtype=dtype)
            return (cos[:, None], sin[:, None]) if cos.ndim == 3 else (cos, sin)

        return rotate_patches(
            tables, q, k, coords, layout="half", head_dim=self.head_dim, heads=self.num_heads
        )

    def rotation(self, coords: torch.Tensor) -> CoordinateRotation:
        """This rotation for :func:`posenc.attention`'s ``rotary=``: token ``p`` at ``coords[p]``.

        ``coords`` is ``(seq, 2)``, one row per token (a class or register token at
        ``(0, 0)`` is not rotated, as the reference leaves them).

        Examples:
            >>> import torch
            >>> import posenc
            >>> from posenc.rotary.multiaxis import DINOv3Rope
            >>> rope = DINOv3Rope(16).eval()
            >>> coords = torch.cat([torch.zeros(1, 2, dtype=torch.float64), rope.coords(2, 2)])
            >>> q = k = v = torch.randn(1, 2, 5, 16)
            >>> posenc.attention(q, k, v, rotary=rope.rotation(coords)).shape
            torch.Size([1, 2, 5, 16])
        """
        return CoordinateRotation(
            lambda c, dtype: dinov3_cos_sin(c, self.freqs, dtype=dtype),
            coords,
            layout="half",
            head_dim=self.head_dim,
            heads=self.num_heads,
        )
