"""Axial 2-D/3-D rotary embeddings of patch grids (ViTs; rotary-embedding-torch).

As rotary-embedding-torch's ``RotaryEmbedding.get_axial_freqs``: each of the
``axes`` coordinates of a patch gets its own block of ``axis_dim`` channels, rotated
by the same frequencies; the blocks are concatenated in axis order, each in the
interleaved layout by default.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Sequence
from typing import Any

import torch

from posenc.core import checks
from posenc.core.angles import PI, decimal_context
from posenc.core.buffers import DerivedBuffers
from posenc.families.rotary.apply import apply_rotary
from posenc.families.rotary.schedules import RopeFrequencies, base_exponents
from posenc.families.rotary.tables import LAYOUTS, Layout, cos_sin

_CTX = decimal_context()


def pixel_frequencies(axis_dim: int, max_freq: float = 10.0) -> RopeFrequencies:
    """rotary-embedding-torch's ``freqs_for="pixel"``: ``linspace(1, max_freq / 2, n) * pi``.

    ``n = axis_dim // 2``; meant for coordinates in ``[-1, 1]``
    (:func:`axial_grid` with ``normalized=True``). Computed exactly (the
    reference rounds ``linspace`` and the product with ``pi`` to float32).

    Examples:
        >>> import math
        >>> from posenc.rotary.multiaxis import AxialRotary, pixel_frequencies
        >>> freqs = pixel_frequencies(8, max_freq=10.0)
        >>> (freqs.inv_freq / math.pi).round(4).tolist()  # linspace(1, max_freq / 2, 4)
        [1.0, 2.3333, 3.6667, 5.0]
        >>> AxialRotary(16, axes=2, freqs=freqs)  # then coords from axial_grid(normalized=True)
        AxialRotary(head_dim=16, axes=2, axis_dim=8)
    """
    axis_dim = checks.check_channels(axis_dim, "axis_dim", minimum=2)
    top = checks.check_number(max_freq, "max_freq", positive=True) / 2
    n = axis_dim // 2
    step = _CTX.divide(decimal.Decimal(top) - 1, n - 1) if n > 1 else decimal.Decimal(0)
    return RopeFrequencies(tuple(_CTX.multiply(_CTX.add(1, k * step), PI) for k in range(n)))


def axial_grid(
    *sizes: int,
    normalized: bool = False,
    offsets: Sequence[float] | None = None,
    device: Any = None,
) -> torch.Tensor:
    """Coordinates of every cell of a ``sizes`` grid, ``(*sizes, len(sizes))``.

    As rotary-embedding-torch's ``get_axial_freqs`` numbers them: ``arange(n)``
    per axis (int64), or ``linspace(-1, 1, n)`` (float64) when ``normalized``
    (its ``freqs_for="pixel"``), plus ``offsets`` per axis.

    Raises:
        ValueError: no size, a size below 1, ``offsets`` of another length; a grid
            of more than :data:`posenc.core.checks.MAX_ELEMENTS` values
            (``prod(sizes) * len(sizes)``, refused before any work).

    Examples:
        >>> from posenc.rotary.multiaxis import axial_grid
        >>> axial_grid(2, 3).tolist()  # (row, column) of each cell of a 2 x 3 grid
        [[[0, 0], [0, 1], [0, 2]], [[1, 0], [1, 1], [1, 2]]]
        >>> axial_grid(3, normalized=True).flatten().tolist()
        [-1.0, 0.0, 1.0]
        >>> axial_grid(2, 8, 8).shape  # video: (frames, height, width, 3)
        torch.Size([2, 8, 8, 3])
    """
    if not sizes:
        raise ValueError("axial_grid needs at least one size")
    sizes = tuple(checks.check_int(n, "sizes", minimum=1) for n in sizes)
    checks.check_elements(
        math.prod(sizes) * len(sizes), f"the grid of sizes {sizes} x {len(sizes)} axes"
    )
    if offsets is not None and len(offsets) != len(sizes):
        raise ValueError(f"offsets must give one value per axis ({len(sizes)}); got {offsets}")
    axes = []
    for i, n in enumerate(sizes):
        if normalized:
            pos = torch.linspace(-1.0, 1.0, n, dtype=torch.float64, device=device)
        else:
            pos = torch.arange(n, device=device)
        if offsets is not None:
            pos = pos + offsets[i]
        axes.append(pos)
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)


def axial_cos_sin(
    coords: Any,
    freqs: RopeFrequencies | Sequence[RopeFrequencies],
    *,
    layout: Layout = "interleaved",
    dtype: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact axial ``cos`` and ``sin``: one channel block per coordinate axis.

    Matches rotary-embedding-torch's ``get_axial_freqs`` (``cos``/``sin`` of
    its angles): block ``a`` holds ``coords[..., a] * omega`` in ``layout``
    order, blocks concatenated in axis order.

    Args:
        coords: ``(..., axes)`` int or float coordinates (:func:`axial_grid`,
            or the patch coordinates of a flattened ``(seq, axes)`` sequence).
        freqs: the frequencies of every axis, or one per axis.
        layout: order within each block (rotary-embedding-torch:
            ``"interleaved"``).
        dtype: result dtype; float32 by default.

    Returns:
        ``(cos, sin)``, ``coords.shape[:-1] + (sum of the blocks' channels,)``.

    Raises:
        TypeError: ``coords`` not an int or float tensor.
        ValueError: ``coords`` 0-d or beyond ``2**31``, ``freqs`` not one per axis,
            an unknown ``layout``; tables of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before any work).

    Examples:
        >>> from posenc.rotary.multiaxis import axial_cos_sin, axial_grid
        >>> from posenc.rotary.schedules import frequencies
        >>> cos, sin = axial_cos_sin(axial_grid(2, 2), frequencies("default", 4, 100.0))
        >>> cos.shape  # (rows, columns, 2 axes x 4 channels)
        torch.Size([2, 2, 8])
        >>> cos[1, 0].round(decimals=4)  # row 1, column 0: only the row block turns
        tensor([0.5403, 0.5403, 0.9950, 0.9950, 1.0000, 1.0000, 1.0000, 1.0000])
    """
    coords = checks.check_position_tensor(coords, "coords")
    checks.check_choice(layout, "layout", LAYOUTS)
    if coords.ndim < 1:
        raise ValueError("coords must be (..., axes); got a 0-d tensor")
    axes = coords.shape[-1]
    per_axis = [freqs] * axes if isinstance(freqs, RopeFrequencies) else list(freqs)
    if len(per_axis) != axes:
        raise ValueError(
            f"freqs must be one RopeFrequencies or one per axis ({axes}); got {len(per_axis)}"
        )
    channels = sum(2 * len(f.omega) for f in per_axis)
    if not torch.compiler.is_compiling():
        checks.check_elements(
            math.prod(coords.shape[:-1]) * channels,
            f"the (cos, sin) tables of coords (shape {tuple(coords.shape)}) x {channels} channels",
        )
    checks.check_position_tensor(coords, "coords", exact=True)
    blocks = [
        cos_sin(coords[..., a], f, layout=layout, dtype=dtype) for a, f in enumerate(per_axis)
    ]
    return torch.cat([b[0] for b in blocks], -1), torch.cat([b[1] for b in blocks], -1)


class AxialRotary(DerivedBuffers):
    """Axial 2-D/3-D rotary embedding of patch grids, exact.

    rotary-embedding-torch's ``RotaryEmbedding(dim=axis_dim).get_axial_freqs``
    followed by ``apply_rotary_emb``: the first ``axes * axis_dim`` channels of
    each head are cut into one block per axis, each rotated by its coordinate
    (interleaved pairs by default); the rest pass through.

    Args:
        head_dim: channels per head.
        axes: coordinate axes (2 for images, 3 for video).
        axis_dim: channels per axis (even); ``head_dim // axes`` rounded down
            to even by default.
        base: the frequency base (``omega_k = base ** (-2k / axis_dim)``, its
            ``freqs_for="lang"``); ignored when ``freqs`` is given.
        freqs: explicit frequencies, e.g. :func:`pixel_frequencies` (its
            ``freqs_for="pixel"``, with ``axial_grid(normalized=True)``).
        layout: pair order within each block.

    Shapes: ``q`` and ``k`` ``(..., head_dim)``; ``coords`` ``(..., axes)``
    whose leading dims broadcast against theirs: ``(H, W, 2)`` for ``q`` of
    ``(batch, heads, H, W, head_dim)``, or ``(seq, 2)`` for ``(batch, heads,
    seq, head_dim)``.

    Attributes:
        inv_freq: float32 ``(axis_dim // 2,)`` frequencies, a non-persistent buffer
            rebuilt exact by every move, cast and ``to_empty``
            (:mod:`posenc.core.buffers`).

    Raises:
        ValueError: ``head_dim`` or ``axis_dim`` above
            :data:`posenc.core.checks.MAX_CHANNELS` (refused before any frequency is
            computed), an odd ``axis_dim``, ``axes * axis_dim > head_dim``, ``freqs``
            of another size, an unknown ``layout``.

    Examples:
        >>> import torch
        >>> from posenc.rotary.multiaxis import AxialRotary, axial_grid
        >>> rope = AxialRotary(head_dim=32, axes=2)
        >>> rope
        AxialRotary(head_dim=32, axes=2, axis_dim=16)
        >>> q, k = torch.randn(2, 1, 4, 16, 32)  # (batch, heads, 4 x 4 patches, head_dim)
        >>> q, k = rope(q, k, axial_grid(4, 4).flatten(0, 1))  # coords (16, 2)
        >>> q.shape
        torch.Size([1, 4, 16, 32])
    """

    def __init__(
        self,
        head_dim: int,
        axes: int = 2,
        *,
        axis_dim: int | None = None,
        base: float = 10000.0,
        freqs: RopeFrequencies | None = None,
        layout: Layout = "interleaved",
    ) -> None:
        super().__init__()
        head_dim = checks.check_channels(head_dim, "head_dim", minimum=2)
        axes = checks.check_int(axes, "axes", minimum=1)
        checks.check_choice(layout, "layout", LAYOUTS)
        if axis_dim is None:
            axis_dim = head_dim // axes // 2 * 2
        axis_dim = checks.check_channels(axis_dim, "axis_dim", minimum=2)
        if axis_dim % 2 or axes * axis_dim > head_dim:
            raise ValueError(
                f"axis_dim must be even with axes * axis_dim <= head_dim ({head_dim}); "
                f"got axis_dim={axis_dim}, axes={axes}"
            )
        if freqs is None:
            base = checks.check_number(base, "base", positive=True)
            freqs = RopeFrequencies(tuple(base_exponents(axis_dim, base)))
        if 2 * freqs.turns.size != axis_dim:
            raise ValueError(
                f"freqs must hold axis_dim / 2 = {axis_dim // 2} frequencies; "
                f"got {freqs.turns.size}"
            )
        self.head_dim, self.axes, self.axis_dim, self.layout = head_dim, axes, axis_dim, layout
        self.rotary_dim = axes * axis_dim
        self.freqs = freqs
        self.reset_parameters()  # inv_freq

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        return {"inv_freq": torch.tensor(self.freqs.inv_freq, dtype=torch.float32)}

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, axes={self.axes}, axis_dim={self.axis_dim}"

    def cos_sin(
        self, coords: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of ``coords`` (``(..., axes)``), ``(..., axes * axis_dim)``.

        Raises:
            ValueError: ``coords`` not ``(..., axes)``; as :func:`axial_cos_sin`.
        """
        if coords.shape[-1:] != (self.axes,):
            raise ValueError(f"coords must be (..., {self.axes}); got shape {tuple(coords.shape)}")
        return axial_cos_sin(coords, self.freqs, layout=self.layout, dtype=dtype)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, coords: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k`` by the coordinates of their tokens."""
        work = checks.work_dtype(q.dtype)
        c, s = self.cos_sin(coords.to(q.device), dtype=work)
        kw: dict[str, Any] = {"layout": self.layout, "rotary_dim": self.rotary_dim}
        return apply_rotary(q, c, s, **kw), apply_rotary(k, c, s, **kw)
