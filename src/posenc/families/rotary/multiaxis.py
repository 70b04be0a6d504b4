"""Multi-axis rotary embeddings: M-RoPE (Qwen2-VL, Qwen3-VL), axial 2-D/3-D grids, xPos.

One mechanism underlies all three: every frequency ``omega_k`` of a schedule
is assigned to one position axis, the exact engine evaluates ``position_axis(k)
* omega_k`` (:func:`posenc.rotary.tables.cos_sin`), and the result is applied
with :func:`posenc.rotary.apply.apply_rotary`.

- M-RoPE (Wang et al. 2024, Qwen2-VL; transformers ``Qwen2VLRotaryEmbedding``):
  positions are ``(3, batch, seq)`` (temporal, height, width). The
  ``rotary_dim / 2`` frequencies are cut into contiguous chunks of
  ``mrope_section`` sizes (e.g. ``[16, 24, 24]``) and chunk ``i`` reads axis
  ``i % 3``; the result is repeated as ``cat(theta, theta)`` (half layout), so
  the sections apply to both halves. Qwen3-VL (transformers
  ``Qwen3VLTextRotaryEmbedding``) interleaves instead: frequency ``k`` reads
  axis ``a`` in ``1, 2`` when ``k % 3 == a`` and ``k < 3 * mrope_section[a]``,
  and axis 0 (temporal) otherwise (sections ``[24, 20, 20]``).
- Axial (rotary-embedding-torch ``RotaryEmbedding.get_axial_freqs``, ViTs):
  each of the ``axes`` coordinates of a patch gets its own block of
  ``axis_dim`` channels, rotated by the same frequencies; the blocks are
  concatenated in axis order, each in the interleaved layout by default.
- xPos (Sun et al. 2022, arXiv:2212.10554; rotary-embedding-torch
  ``RotaryEmbedding(use_xpos=True).rotate_queries_and_keys``): the rotated
  channels of ``q`` are also scaled by ``zeta_k ** ((t - T // 2) / scale_base)``
  with ``zeta_k = (2k + 0.4 d) / (1.4 d)``, and those of ``k`` by the
  inverse, so ``q_m . k_n`` decays with ``m - n``. Causal attention only: the
  factor grows without bound for ``n > m``.

Shapes: ``rotary_dim`` channels are rotated; ``cos`` and ``sin`` are
``(..., rotary_dim)`` and broadcast against ``x[..., :rotary_dim]`` as in
:func:`posenc.rotary.apply.apply_rotary`.
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from posenc.core import checks
from posenc.core.angles import _PI, EXACT_LIMIT
from posenc.families.rotary.apply import apply_rotary
from posenc.families.rotary.schedules import RopeFrequencies, base_exponents
from posenc.families.rotary.tables import LAYOUTS, Layout, cos_sin

__all__ = [
    "AxialRotary",
    "axial_cos_sin",
    "axial_grid",
    "mrope_axes",
    "mrope_cos_sin",
    "pixel_frequencies",
    "xpos_rotate",
    "xpos_scale",
]

_CTX = decimal.Context(prec=40, Emin=-999999, Emax=999999)


def _positions(t: Any, name: str) -> torch.Tensor:
    """An int or float tensor whose values lie where the engine is exact."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor; got {type(t).__name__}")
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name} must be an int or float tensor; got {t.dtype}")
    if t.numel() and not torch.compiler.is_compiling():
        lo, hi = (float(v) for v in torch.aminmax(t.detach().double()))
        if not max(abs(lo), abs(hi)) < EXACT_LIMIT:
            raise ValueError(
                f"{name} must lie in (-2**31, 2**31), the range in which posenc is exact; "
                f"got values in [{lo:.6g}, {hi:.6g}]"
            )
    return t


# --------------------------------------------------------------------------------------
# M-RoPE.


@functools.lru_cache(maxsize=64)
def mrope_axes(
    mrope_section: tuple[int, ...], pairs: int, axes: int = 3, interleaved: bool = False
) -> tuple[int, ...]:
    """The position axis that each of the ``pairs`` frequencies reads.

    Args:
        mrope_section: frequencies per section (transformers' ``mrope_section``).
        pairs: ``rotary_dim / 2``; the sections must sum to it.
        axes: number of position axes (3: temporal, height, width).
        interleaved: Qwen3-VL's order (one section per axis) instead of
            Qwen2-VL's contiguous chunks.

    Returns:
        ``axis[k]`` for ``k < pairs``.

    Raises:
        ValueError: sections that are not non-negative ints summing to
            ``pairs``; for ``interleaved``, not one section per axis, or
            sections too long to interleave.
    """
    sections = tuple(mrope_section)
    if not sections or any(
        isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sections
    ):
        raise ValueError(
            f"mrope_section must be a non-empty list of non-negative ints; got {list(sections)}"
        )
    if sum(sections) != pairs:
        raise ValueError(
            f"mrope_section must sum to rotary_dim / 2 = {pairs}; got {list(sections)} "
            f"(sum {sum(sections)})"
        )
    if not interleaved:
        # transformers Qwen2-VL: freq.split(mrope_section)[i] from axis i % 3
        return tuple(i % axes for i, s in enumerate(sections) for _ in range(s))
    if len(sections) != axes:
        raise ValueError(
            f"interleaved mrope_section needs one section per axis ({axes}); got {list(sections)}"
        )
    # transformers Qwen3-VL: axis a >= 1 takes slice(a, 3 * section[a], 3); the rest is axis 0
    axis = [0] * pairs
    for a in range(1, axes):
        for k in range(a, min(axes * sections[a], pairs), axes):
            axis[k] = a
    counts = [axis.count(a) for a in range(axes)]
    if counts != list(sections):
        raise ValueError(
            f"interleaved mrope_section {list(sections)} does not fit rotary_dim / 2 = {pairs}: "
            f"axes would get {counts} frequencies"
        )
    return tuple(axis)


def mrope_cos_sin(
    position_ids: Any,
    freqs: RopeFrequencies,
    mrope_section: Sequence[int],
    *,
    interleaved: bool = False,
    dtype: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact M-RoPE ``cos`` and ``sin`` in HF's half layout.

    Matches transformers' ``Qwen2VLRotaryEmbedding.forward`` (``interleaved=False``;
    Qwen2.5-VL too) and ``Qwen3VLTextRotaryEmbedding.forward``
    (``interleaved=True``), with exact angles instead of float32 ones.

    Args:
        position_ids: ``(3, batch, seq)`` int (or float) positions, one row per
            axis (temporal, height, width); more generally ``(axes, ...)``.
        freqs: the schedule's frequencies (``rotary_dim / 2`` of them).
        mrope_section: frequencies per section, summing to ``rotary_dim / 2``.
        interleaved: Qwen3-VL's T/H/W interleave instead of Qwen2-VL's chunks.
        dtype: result dtype; float32 by default.

    Returns:
        ``(cos, sin)`` of shape ``position_ids.shape[1:] + (rotary_dim,)``,
        times the attention scaling.

    Raises:
        TypeError: ``position_ids`` not an int or float tensor.
        ValueError: ``position_ids`` with no axis dim, positions beyond
            ``2**31``; bad ``mrope_section`` (see :func:`mrope_axes`).
    """
    position_ids = _positions(position_ids, "position_ids")
    if position_ids.ndim < 2:
        raise ValueError(
            f"position_ids must be (axes, batch, seq) (3 axes for M-RoPE); got shape "
            f"{tuple(position_ids.shape)}"
        )
    pairs = freqs.turns.size
    axis = mrope_axes(
        tuple(mrope_section), pairs, axes=position_ids.shape[0], interleaved=bool(interleaved)
    )
    # every axis at every frequency (exact), then each frequency's own axis: 3x the
    # angles of one table, but one engine call and no per-axis frequency subsets
    c, s = cos_sin(position_ids, freqs, layout="half", dtype=torch.float64)
    half = torch.tensor(axis, device=c.device)
    index = torch.cat([half, half]).expand(1, *c.shape[1:])
    c, s = c.gather(0, index).squeeze(0), s.gather(0, index).squeeze(0)
    out = torch.float32 if dtype is None else dtype
    return c.to(out), s.to(out)


# --------------------------------------------------------------------------------------
# Axial.


def pixel_frequencies(axis_dim: int, max_freq: float = 10.0) -> RopeFrequencies:
    """rotary-embedding-torch's ``freqs_for="pixel"``: ``linspace(1, max_freq / 2, n) * pi``.

    ``n = axis_dim // 2``; meant for coordinates in ``[-1, 1]``
    (:func:`axial_grid` with ``normalized=True``). Computed exactly (the
    reference rounds ``linspace`` and the product with ``pi`` to float32).
    """
    axis_dim = checks.check_int(axis_dim, "axis_dim", minimum=2)
    top = checks.check_number(max_freq, "max_freq", positive=True) / 2
    n = axis_dim // 2
    step = _CTX.divide(decimal.Decimal(top) - 1, n - 1) if n > 1 else decimal.Decimal(0)
    return RopeFrequencies(tuple(_CTX.multiply(_CTX.add(1, k * step), _PI) for k in range(n)))


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
    """
    if not sizes:
        raise ValueError("axial_grid needs at least one size")
    sizes = tuple(checks.check_int(n, "sizes", minimum=1) for n in sizes)
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
    """
    coords = _positions(coords, "coords")
    checks.check_choice(layout, "layout", LAYOUTS)
    if coords.ndim < 1:
        raise ValueError("coords must be (..., axes); got a 0-d tensor")
    axes = coords.shape[-1]
    per_axis = [freqs] * axes if isinstance(freqs, RopeFrequencies) else list(freqs)
    if len(per_axis) != axes:
        raise ValueError(
            f"freqs must be one RopeFrequencies or one per axis ({axes}); got {len(per_axis)}"
        )
    blocks = [
        cos_sin(coords[..., a], f, layout=layout, dtype=dtype) for a, f in enumerate(per_axis)
    ]
    return torch.cat([b[0] for b in blocks], -1), torch.cat([b[1] for b in blocks], -1)


class AxialRotary(nn.Module):
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
        head_dim = checks.check_int(head_dim, "head_dim", minimum=2)
        axes = checks.check_int(axes, "axes", minimum=1)
        checks.check_choice(layout, "layout", LAYOUTS)
        if axis_dim is None:
            axis_dim = head_dim // axes // 2 * 2
        axis_dim = checks.check_int(axis_dim, "axis_dim", minimum=2)
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
        self.register_buffer(
            "inv_freq", torch.tensor(freqs.inv_freq, dtype=torch.float32), persistent=False
        )

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, axes={self.axes}, axis_dim={self.axis_dim}"

    def cos_sin(
        self, coords: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of ``coords`` (``(..., axes)``), ``(..., axes * axis_dim)``."""
        if coords.shape[-1:] != (self.axes,):
            raise ValueError(f"coords must be (..., {self.axes}); got shape {tuple(coords.shape)}")
        return axial_cos_sin(coords, self.freqs, layout=self.layout, dtype=dtype)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, coords: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k`` by the coordinates of their tokens."""
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        c, s = self.cos_sin(coords.to(q.device), dtype=work)
        kw: dict[str, Any] = {"layout": self.layout, "rotary_dim": self.rotary_dim}
        return apply_rotary(q, c, s, **kw), apply_rotary(k, c, s, **kw)


# --------------------------------------------------------------------------------------
# xPos.


def xpos_scale(
    positions: Any,
    rotary_dim: int,
    *,
    center: float,
    scale_base: float = 512.0,
    layout: Layout = "interleaved",
    dtype: Any = None,
) -> torch.Tensor:
    """xPos's per-channel scale of the queries: ``zeta_k ** ((t - center) / scale_base)``.

    ``zeta_k = (2k + 0.4 d) / (1.4 d)`` with ``d = rotary_dim`` (Sun et al.
    2022; rotary-embedding-torch ``get_scale``, where ``center = len(t) // 2``).
    The keys take the reciprocal. Computed in float64 before one rounding.

    Returns:
        ``positions.shape + (rotary_dim,)``, each ``zeta_k`` twice in ``layout``
        order; float32 by default.
    """
    positions = _positions(positions, "positions")
    rotary_dim = checks.check_int(rotary_dim, "rotary_dim", minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even; got {rotary_dim}")
    scale_base = checks.check_number(scale_base, "scale_base", positive=True)
    center = checks.check_number(center, "center")
    checks.check_choice(layout, "layout", LAYOUTS)
    d = rotary_dim
    log_zeta = torch.tensor(
        [math.log((2 * k + 0.4 * d) / (1.4 * d)) for k in range(d // 2)],
        dtype=torch.float64,
        device=positions.device,
    )
    power = (positions.to(torch.float64) - center) / scale_base
    scale = torch.exp(power[..., None] * log_zeta)
    if layout == "half":
        scale = torch.cat([scale, scale], -1)
    else:
        scale = scale.repeat_interleave(2, -1)
    return scale.to(torch.float32 if dtype is None else dtype)


def xpos_rotate(
    q: torch.Tensor,
    k: torch.Tensor,
    freqs: RopeFrequencies,
    *,
    scale_base: float = 512.0,
    layout: Layout = "interleaved",
    seq_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate and xPos-scale ``q`` and ``k`` of one whole causal sequence.

    rotary-embedding-torch's ``RotaryEmbedding(use_xpos=True)
    .rotate_queries_and_keys(q, k)``: positions ``0 .. T - 1``, ``q``'s
    rotated channels times :func:`xpos_scale` (``center = T // 2``), ``k``'s
    divided by it; channels past ``rotary_dim`` untouched. Causal only (the
    scale of a key after its query grows without bound); no KV-cache offsets.

    Args:
        q: ``(..., seq, head_dim)`` (``seq_dim=-2``) or ``(..., seq, heads,
            head_dim)`` (``seq_dim=-3``).
        k: like ``q`` (same length).
        freqs: the rotary frequencies (``rotary_dim / 2`` of them).
        scale_base: xPos's ``scale_base`` (512 in the paper).
        layout: pair order (rotary-embedding-torch: ``"interleaved"``).
        seq_dim: ``-2`` or ``-3``.

    Returns:
        ``(q', k')``, shaped and typed like ``q`` and ``k``.
    """
    if seq_dim not in (-2, -3):
        raise ValueError(f"seq_dim must be -2 or -3; got {seq_dim}")
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a float tensor")
        if t.ndim < -seq_dim:
            raise ValueError(f"{name} must have at least {-seq_dim} dims; got {tuple(t.shape)}")
    seq = q.shape[seq_dim]
    if k.shape[seq_dim] != seq:
        raise ValueError(
            f"q and k must have the same length (dim {seq_dim}); got {seq} and {k.shape[seq_dim]}"
        )
    rotary_dim = 2 * freqs.turns.size
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    positions = torch.arange(seq, device=q.device)
    c, s = cos_sin(positions, freqs, layout=layout, dtype=torch.float64)
    scale = xpos_scale(
        positions,
        rotary_dim,
        center=seq // 2,
        scale_base=scale_base,
        layout=layout,
        dtype=torch.float64,
    )
    if seq_dim == -3:
        c, s, scale = c.unsqueeze(-2), s.unsqueeze(-2), scale.unsqueeze(-2)
    # a rotation times a positive per-pair scale is still linear with transpose
    # (same cos, negated sin): apply_rotary's inverse-rotation backward stays right
    cq, sq = (c * scale).to(work), (s * scale).to(work)
    ck, sk = (c / scale).to(work), (s / scale).to(work)
    kw: dict[str, Any] = {"layout": layout, "rotary_dim": rotary_dim}
    return apply_rotary(q, cq, sq, **kw), apply_rotary(k, ck, sk, **kw)
