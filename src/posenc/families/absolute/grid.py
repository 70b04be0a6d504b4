"""Sinusoidal encodings of 2-D and 3-D grids: image patches and video tubelets.

A grid of ``shape = (H, W)`` or ``(T, H, W)`` gets one row per cell, in
row-major order of ``shape`` (the order ``x.flatten(2).transpose(1, 2)`` gives
a patch embedding). Every convention is a point in one parameter space,
:class:`GridSpec`: each axis encodes its own index with a 1-D sinusoid, and
the per-axis blocks are laid side by side.

Axes are named by what they index, because the anchors disagree on which half
is the row: ``"row"`` is the index along ``H``, ``"col"`` along ``W`` and
``"time"`` along ``T`` (frames, or depth for a volume). For an axis ``a`` with
``K_a`` frequencies and ``n_a`` cells,

``angle = i * c_a * omega_k``, ``omega_k = base ** (-k / (K_a - shift))``,
``k = 0 .. K_a - 1``, ``i = 0 .. n_a - 1``,

where ``c_a`` is the coordinate rule: ``1 / interpolation_scale``, or
``base_size / n_a / interpolation_scale`` when ``base_size`` is set (diffusers
stretches every grid over ``base_size`` cells). The channel rule gives axis
``a`` a share ``s_a`` of ``dim`` (equal shares unless stated), ``K_a = s_a dim / 2``;
with ``fit="truncate"`` each ``K_a`` is rounded up and the concatenation is
cut to ``dim`` (positional-encodings). ``layout`` places the blocks:

- ``"half"``: per axis ``[sin x K_a, cos x K_a]``, axes in ``axes`` order
  (MAE, diffusers, big_vision, MoCo v3, timm with ``interleave_sin_cos``);
- ``"interleaved"``: per axis ``[sin k0, cos k0, sin k1, cos k1, ...]``
  (positional-encodings);
- ``"by_function"``: the sines of every axis, then the cosines
  (``[sin row, sin col, cos row, cos col]``: timm's default).

Every sine and cosine comes from the exact angle engine, evaluated once per
axis (``sum(shape) * K`` evaluations) and broadcast over the grid.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from posenc.core import checks
from posenc.core.angles import Turns, geometric_turns, sincos_numpy

#: How a grid's channels are laid out: each axis's [sin | cos] halves, interleaved pairs, or
#: all sines then all cosines (``by_function``).
GridLayout = Literal["half", "interleaved", "by_function"]
#: What to do when the channels do not divide among the axes: refuse, or drop the rest.
Fit = Literal["exact", "truncate"]

_LAYOUTS = ("half", "interleaved", "by_function")
_FITS = ("exact", "truncate")
#: Axis names in ``shape`` order, by rank.
AXES = {2: ("row", "col"), 3: ("time", "row", "col")}


@dataclass(frozen=True)
class AxisChannels:
    """Where the sines and cosines of one axis land in a ``dim``-channel row.

    Attributes:
        axis: ``"time"``, ``"row"`` or ``"col"``.
        index: position of the axis in ``shape``.
        n_freq: ``K``, the frequencies of the axis (before any truncation).
        denominator: ``K - shift``, the exponent denominator.
        sin: channels of ``sin(i c omega_k)`` for ``k < n_sin``.
        cos: channels of ``cos(i c omega_k)`` for ``k < n_cos``.
        n_sin: sine channels kept (``K`` unless truncated to ``dim``).
        n_cos: cosine channels kept.
    """

    axis: str
    index: int
    n_freq: int
    denominator: float
    sin: slice
    cos: slice
    n_sin: int
    n_cos: int


@dataclass(frozen=True)
class GridSpec:
    """One grid convention for one rank, a point of its fields' space: every preset is one.

    Attributes:
        axes: the axes in channel order: a permutation of ``("row", "col")``
            (2-D) or ``("time", "row", "col")`` (3-D). It fixes the rank.
        layout: ``"half"``, ``"interleaved"`` or ``"by_function"``.
        base: the maximum timescale (``temperature`` in big_vision, timm, MoCo v3).
        shift: subtracted from the exponent denominator ``K`` (big_vision: 1).
        shares: the fraction of ``dim`` for each axis, in ``axes`` order;
            ``None`` splits equally (diffusers 3-D: ``(1/4, 3/8, 3/8)``).
        fit: ``"exact"`` (``dim`` must split into whole sin/cos blocks) or
            ``"truncate"`` (round each axis up, cut to ``dim``).
        base_size: if set, the row and column coordinates are
            ``i / (n / base_size)`` (diffusers 2-D); ``None`` uses ``i``.
        interpolation_scale: divides the row and column coordinates.
        temporal_interpolation_scale: divides the time coordinate (3-D only).
        anchor: where the convention comes from, and which axis each block encodes.

    Examples:
        >>> import posenc
        >>> spec = posenc.GridSpec(axes=("row", "col"), base=100.0)  # row channels first
        >>> pe = posenc.grid((2, 3), 8, preset=spec)  # 2 rows x 3 columns, row-major
        >>> pe.shape
        (6, 8)
        >>> bool((pe[:3, :4] == pe[0, :4]).all())  # the cells of row 0 share the row half
        True
    """

    axes: tuple[str, ...] = ("col", "row")
    layout: GridLayout = "half"
    base: float = 10000.0
    shift: float = 0.0
    shares: tuple[Fraction, ...] | None = None
    fit: Fit = "exact"
    base_size: float | None = None
    interpolation_scale: float = 1.0
    temporal_interpolation_scale: float = 1.0
    anchor: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.axes, tuple) or len(self.axes) not in AXES:
            raise ValueError(
                "axes must be a tuple ordering ('row', 'col') or ('time', 'row', 'col'); "
                f"got {self.axes!r}"
            )
        if sorted(self.axes) != sorted(AXES[len(self.axes)]):
            raise ValueError(
                f"axes must be a permutation of {AXES[len(self.axes)]!r}; got {self.axes!r}"
            )
        checks.check_choice(self.layout, "layout", _LAYOUTS)
        checks.check_choice(self.fit, "fit", _FITS)
        checks.check_number(self.base, "base", positive=True)
        checks.check_number(self.shift, "shift")
        if self.base_size is not None:
            checks.check_number(self.base_size, "base_size", positive=True)
        checks.check_number(self.interpolation_scale, "interpolation_scale", positive=True)
        checks.check_number(
            self.temporal_interpolation_scale, "temporal_interpolation_scale", positive=True
        )
        if self.rank == 2 and self.temporal_interpolation_scale != 1.0:
            raise ValueError(
                "temporal_interpolation_scale applies to 3-D grids (T, H, W) only; got "
                f"{self.temporal_interpolation_scale!r} for a 2-D grid"
            )
        self._fractions()  # validates shares

    @property
    def rank(self) -> int:
        """The number of grid axes (2 or 3)."""
        return len(self.axes)

    def replace(self, **overrides: Any) -> GridSpec:
        """A copy with some fields changed (names and aliases as in :func:`grid`).

        Raises:
            ValueError: an unknown name, or timm's ``interleave_sin_cos`` on a
                convention whose axes are not timm's (:data:`TIMM_ONLY`).
        """
        spec = dataclasses.replace(self, **_canonical_overrides(overrides))
        if TIMM_ONLY in overrides and spec.axes != _TIMM_AXES:
            raise ValueError(
                f"{TIMM_ONLY} is timm's build_sincos2d_pos_embed knob and means its axis "
                f"order: the row (y) block first, axes={_TIMM_AXES!r}; this convention has "
                f"axes={spec.axes!r}. Pass preset='timm' (or axes={_TIMM_AXES!r} with it); "
                "layout= changes the layout without implying an axis order"
            )
        return spec

    def _fractions(self) -> tuple[Fraction, ...]:
        if self.shares is None:
            return (Fraction(1, self.rank),) * self.rank
        if not isinstance(self.shares, tuple) or len(self.shares) != self.rank:
            raise ValueError(
                f"shares must be a tuple of {self.rank} fractions (one per axis in {self.axes}) "
                f"or None; got {self.shares!r}"
            )
        out = []
        for s in self.shares:
            if isinstance(s, bool) or not isinstance(s, (int, float, Fraction)):
                raise TypeError(f"shares must hold fractions or floats; got {s!r}")
            f = Fraction(s).limit_denominator(1 << 20)
            if f <= 0:
                raise ValueError(f"shares must be > 0; got {self.shares!r}")
            out.append(f)
        if sum(out) != 1:
            raise ValueError(f"shares must sum to 1; got {self.shares!r}")
        return tuple(out)

    def channels(self, dim: int) -> tuple[AxisChannels, ...]:
        """The per-axis channel placement for ``dim`` channels, in ``axes`` order.

        Raises:
            TypeError: ``dim`` is not an int.
            ValueError: ``dim`` is not positive or above
                :data:`posenc.core.checks.MAX_CHANNELS` (refused before any
                frequency is computed), does not split into whole sin/cos blocks
                (``fit="exact"``), or leaves an axis whose exponent denominator
                ``K - shift`` is not positive.
        """
        dim = checks.check_channels(dim, "dim")
        shares = self._fractions()
        halves = [share * dim / 2 for share in shares]
        if self.fit == "exact":
            divisor = math.lcm(*((share / 2).denominator for share in shares))
            if dim % divisor:
                split = ", ".join(f"{a} {s}" for a, s in zip(self.axes, shares, strict=True))
                raise ValueError(
                    f"dim must be a multiple of {divisor} for this {self.rank}-D grid (axis "
                    f"shares {split}, each a sin and a cos block of equal size); got {dim}"
                )
            counts = [int(h) for h in halves]
        else:
            counts = [math.ceil(h) for h in halves]
        for axis, k in zip(self.axes, counts, strict=True):
            if k - self.shift <= 0:
                # big_vision's k / (dim/4 - 1) is 0/0 at dim 4: refuse rather than NaN
                raise ValueError(
                    f"dim={dim} gives axis {axis!r} K={k} frequencies, and the exponent "
                    f"k / (K - shift) = k / ({k} - {self.shift:g}) needs K > shift; use a "
                    "larger dim"
                )
        total = sum(counts)
        out = []
        start = 0
        for axis, k in zip(self.axes, counts, strict=True):
            if self.layout == "half":
                sin, cos = slice(start, start + k), slice(start + k, start + 2 * k)
                start += 2 * k
            elif self.layout == "interleaved":
                sin, cos = slice(start, start + 2 * k, 2), slice(start + 1, start + 2 * k, 2)
                start += 2 * k
            else:  # by_function
                sin, cos = slice(start, start + k), slice(total + start, total + start + k)
                start += k
            sin, n_sin = _truncate(sin, dim)
            cos, n_cos = _truncate(cos, dim)
            index = AXES[self.rank].index(axis)
            out.append(AxisChannels(axis, index, k, k - self.shift, sin, cos, n_sin, n_cos))
        return tuple(out)

    def coordinate_scale(self, axis: str, n: int) -> float:
        """``c_a``: the coordinate of cell ``i`` along ``axis`` (of ``n`` cells) is ``i * c_a``."""
        if axis == "time":
            return 1.0 / self.temporal_interpolation_scale
        stretch = 1.0 if self.base_size is None else self.base_size / n
        return stretch / self.interpolation_scale

    def turns(self, axis: AxisChannels, n: int) -> Turns:
        """The exact frequencies of one axis of ``n`` cells, per grid index (``c_a`` folded in)."""
        return geometric_turns(
            axis.n_freq,
            float(self.base),
            1.0,
            float(axis.denominator),
            self.coordinate_scale(axis.axis, n),
        )


def _truncate(s: slice, dim: int) -> tuple[slice, int]:
    """Keep the channels of ``s`` below ``dim``: the slice and how many remain."""
    kept = range(s.start, s.stop, s.step or 1)[: len(range(dim)[s])]
    return slice(kept.start, kept.start + len(kept) * kept.step, kept.step), len(kept)


_COL_ROW = ("col", "row")

#: The named conventions: preset name -> {rank: GridSpec}.
PRESETS: dict[str, dict[int, GridSpec]] = {
    "mae": {
        2: GridSpec(
            axes=_COL_ROW,
            anchor="MAE get_2d_sincos_pos_embed (He et al. 2022, facebookresearch/mae "
            "util/pos_embed.py): [sin col, cos col, sin row, cos row], dim/4 frequencies "
            "10000^(-k/(dim/4)). The half MAE calls emb_h encodes the column (meshgrid 'xy' "
            "puts w first); MAE prepends one zero cls row (cls_token=True)",
        )
    },
    "diffusers": {
        2: GridSpec(
            axes=_COL_ROW,
            base_size=16.0,
            anchor="diffusers get_2d_sincos_pos_embed (DiT, PixArt, SD3 PatchEmbed): "
            "[sin col, cos col, sin row, cos row] as MAE, coordinates "
            "arange(n) / (n / base_size) / interpolation_scale with base_size 16; "
            "diffusers' cls_token=True, extra_tokens=n is extra_tokens=n here",
        ),
        3: GridSpec(
            axes=("time", "col", "row"),
            shares=(Fraction(1, 4), Fraction(3, 8), Fraction(3, 8)),
            anchor="diffusers get_3d_sincos_pos_embed (CogVideoX): [sin time, cos time] on "
            "dim/4 channels, then the 2-D [sin col, cos col, sin row, cos row] on 3 dim/4, "
            "coordinates arange(n) / spatial_interpolation_scale (no base_size) and "
            "arange(T) / temporal_interpolation_scale; diffusers' spatial_size is (W, H)",
        ),
    },
    "big-vision": {
        2: GridSpec(
            axes=_COL_ROW,
            shift=1.0,
            anchor="big_vision posemb_sincos_2d (Beyer et al. 2022, 'Better plain ViT "
            "baselines'), vit-pytorch simple_vit: [sin col, cos col, sin row, cos row] "
            "(x = column), 10000^(-k/(dim/4 - 1)); dim/4 == 1 is rejected (0/0 there)",
        )
    },
    "moco-v3": {
        2: GridSpec(
            axes=("row", "col"),
            anchor="MoCo v3 build_2d_sincos_position_embedding (Chen et al. 2021, "
            "facebookresearch/moco-v3 vits.py): [sin row, cos row, sin col, cos col], "
            "10000^(-k/(dim/4)); its 'ij' meshgrid of (w, h) makes the first half follow the "
            "slow (row) index; MoCo v3 prepends one zero cls row (cls_token=True)",
        )
    },
    "timm": {
        2: GridSpec(
            axes=("row", "col"),
            layout="by_function",
            anchor="timm build_sincos2d_pos_embed: [sin row, sin col, cos row, cos col] "
            "(y = row first), temperature^(-k/(dim/4)); interleave_sin_cos=True gives "
            "[sin row, cos row, sin col, cos col]; timm's reverse_coord=True is the grid "
            "of shape (W, H)",
        )
    },
    "positional-encodings": {
        2: GridSpec(
            axes=("row", "col"),
            layout="interleaved",
            fit="truncate",
            anchor="positional-encodings PositionalEncoding2D: [x block, y block], each C = "
            "2 ceil(dim/4) channels of interleaved sin/cos at 10000^(-2k/C), cut to dim; "
            "x is the first axis of (batch, x, y, ch): the row here, y the col",
        ),
        3: GridSpec(
            axes=("time", "row", "col"),
            layout="interleaved",
            fit="truncate",
            anchor="positional-encodings PositionalEncoding3D: [x, y, z blocks], each C = "
            "2 ceil(dim/6) channels of interleaved sin/cos at 10000^(-2k/C), cut to dim; "
            "x, y, z are the axes of (batch, x, y, z, ch) in order: time, row, col here",
        ),
    },
}

_FIELDS = tuple(f.name for f in dataclasses.fields(GridSpec) if f.name != "anchor")
#: Names users know from the anchors, mapped to posenc's fields. ``temperature``
#: (big_vision, timm, MoCo v3) and ``max_period`` are ``base``, and
#: ``spatial_interpolation_scale`` (diffusers 3-D) is ``interpolation_scale``, on every
#: preset; timm's ``interleave_sin_cos`` (``layout``) only where the axes are timm's
#: (:data:`TIMM_ONLY`).
ALIASES = {
    "temperature": "base",
    "max_period": "base",
    "spatial_interpolation_scale": "interpolation_scale",
    "interleave_sin_cos": "layout",
}


#: timm's ``build_sincos2d_pos_embed`` knob. Its meaning includes timm's axis order, the
#: row (y) block first: on the default MAE convention (column first) it would silently
#: give another layout than timm's, so it is accepted only where ``axes`` is
#: ``("row", "col")``: ``preset="timm"`` (and MoCo v3, positional-encodings).
TIMM_ONLY = "interleave_sin_cos"
_TIMM_AXES = ("row", "col")


def _canonical_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    # timm's interleave_sin_cos stacks sin, cos per axis instead of all sines, all cosines
    return checks.canonical_overrides(
        overrides, _FIELDS, ALIASES, {"interleave_sin_cos": ("half", "by_function")}
    )


def resolve(preset: str | GridSpec = "mae", rank: int = 2, **overrides: Any) -> GridSpec:
    """The :class:`GridSpec` named by ``preset`` for a ``rank``-D grid, with ``overrides``."""
    if isinstance(preset, GridSpec):
        spec = preset
        if spec.rank != rank:
            raise ValueError(
                f"the GridSpec has axes {spec.axes} (a {spec.rank}-D grid) but shape has "
                f"{rank} axes"
            )
    elif isinstance(preset, str) and preset in PRESETS:
        by_rank = PRESETS[preset]
        if rank not in by_rank:
            shapes = " or ".join(f"{r}-D {_SHAPE_NAMES[r]}" for r in sorted(by_rank))
            raise ValueError(f"preset {preset!r} covers shape {shapes}; got a {rank}-D shape")
        spec = by_rank[rank]
    else:
        raise ValueError(
            f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)} (or a GridSpec)"
        )
    return spec.replace(**overrides) if overrides else spec


_SHAPE_NAMES = {2: "(H, W)", 3: "(T, H, W)"}


def _check_shape(shape: Any) -> tuple[int, ...]:
    accepted = "a tuple (H, W) or (T, H, W) of ints >= 1"
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"shape must be {accepted}; got {type(shape).__name__} {shape!r}")
    if len(shape) not in AXES:
        raise ValueError(f"shape must be {accepted}; got {len(shape)} axes: {tuple(shape)!r}")
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"shape must be {accepted}; got {type(n).__name__} {n!r} in it")
        if n < 1:
            raise ValueError(f"shape must be {accepted}; got {tuple(shape)!r}")
    return tuple(int(n) for n in shape)


def _zero_rows(cls_token: Any, extra_tokens: Any) -> int:
    checks.check_bool(cls_token, "cls_token")
    extra = checks.check_int(extra_tokens, "extra_tokens", minimum=0)
    return extra if extra else int(cls_token)


# --------------------------------------------------------------------------------------
# Evaluation


def grid(
    shape: tuple[int, ...],
    dim: int,
    *,
    preset: str | GridSpec = "mae",
    dtype: Any = None,
    cls_token: bool = False,
    extra_tokens: int = 0,
    **overrides: Any,
) -> Any:
    """Sinusoidal encodings of a 2-D or 3-D grid, one row per cell in row-major order.

    Args:
        shape: ``(H, W)`` or ``(T, H, W)``, ints >= 1.
        dim: number of channels (a positive int; each preset says what it must
            divide, e.g. 4 for the 2-D MAE layout, 16 for diffusers 3-D).
        preset: a name from :data:`PRESETS` or a :class:`GridSpec`.
        dtype: output dtype (float16, bfloat16 for torch, float32, float64);
            float32 by default. A torch dtype gives a CPU torch tensor.
        cls_token: prepend one all-zero row (MAE, MoCo v3).
        extra_tokens: the number of all-zero rows to prepend, cls token
            included (diffusers' ``cls_token=True, extra_tokens=n``); it wins
            over ``cls_token`` when both are given.
        **overrides: any :class:`GridSpec` field (``base``, ``shift``,
            ``layout``, ``axes``, ``shares``, ``fit``, ``base_size``,
            ``interpolation_scale``, ``temporal_interpolation_scale``) or an
            alias from :data:`ALIASES` (``temperature``, ``interleave_sin_cos``,
            ``spatial_interpolation_scale``). timm's ``interleave_sin_cos``
            brings timm's axis order (row first) with it: it is refused on a
            convention with another one, such as the default MAE one (use
            ``preset="timm"``, see :data:`TIMM_ONLY`).

    Returns:
        ``(zero_rows + prod(shape), dim)``; row ``zero_rows + ((t * H) + h) * W + w``
        encodes cell ``(t, h, w)``. Each value is the float64-exact encoding
        rounded once to ``dtype``.

    Raises:
        TypeError: ``shape`` or ``dim`` not made of ints, bad ``dtype``.
        ValueError: ``shape`` of the wrong rank or with values < 1, ``dim``
            not a multiple the preset needs; ``dim`` above
            :data:`posenc.core.checks.MAX_CHANNELS` or a result of more than
            :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before any
            work); unknown preset or override; ``interleave_sin_cos`` where the
            axes are not timm's.

    Examples:
        >>> import posenc
        >>> posenc.grid((2, 2), 4).round(4)  # [sin col, cos col, sin row, cos row]
        array([[0.    , 1.    , 0.    , 1.    ],
               [0.8415, 0.5403, 0.    , 1.    ],
               [0.    , 1.    , 0.8415, 0.5403],
               [0.8415, 0.5403, 0.8415, 0.5403]], dtype=float32)
    """
    shape = _check_shape(shape)
    spec = resolve(preset, len(shape), **overrides)
    axes = spec.channels(dim)
    zero_rows = _zero_rows(cls_token, extra_tokens)
    rows = zero_rows + math.prod(shape)
    checks.check_elements(
        rows * dim, f"the grid encoding of {rows} rows (shape {shape}) x dim={dim}"
    )
    name = checks.dtype_name("float32" if dtype is None else dtype)
    to_torch = checks.is_torch_dtype(dtype)
    # bfloat16 has no numpy type: round the float64 table once, in torch
    table_dtype = "float64" if to_torch and name == "bfloat16" else name
    out = np.empty((rows, dim), dtype=checks.numpy_dtype(table_dtype))
    out[:zero_rows] = 0
    # every channel below dim belongs to exactly one (axis, sin|cos) slice: no gaps to zero
    body = out[zero_rows:].reshape((*shape, dim))
    for axis in axes:
        n = shape[axis.index]
        s, c = sincos_numpy(np.arange(n, dtype=np.float64), spec.turns(axis, n))
        view = [1] * len(shape)
        view[axis.index] = n
        body[..., axis.sin] = s[:, : axis.n_sin].reshape((*view, axis.n_sin))
        body[..., axis.cos] = c[:, : axis.n_cos].reshape((*view, axis.n_cos))
    if to_torch:
        import torch

        return torch.from_numpy(out).to(checks.torch_dtype(name))
    return out


def grid_frequencies(
    shape: tuple[int, ...], dim: int, *, preset: str | GridSpec = "mae", **overrides: Any
) -> dict[str, npt.NDArray[np.float64]]:
    """The angular frequency per grid index of each axis, coordinate scale included.

    ``angle = i * frequencies(...)[axis][k]`` for cell index ``i``; float64
    (rounded from the exact values the encoding uses).

    Examples:
        >>> import posenc
        >>> posenc.grid_frequencies((4, 4), 8)
        {'col': array([1.  , 0.01]), 'row': array([1.  , 0.01])}
        >>> posenc.grid_frequencies((4, 4), 8, interpolation_scale=2.0)["row"].tolist()
        [0.5, 0.005]
    """
    shape = _check_shape(shape)
    spec = resolve(preset, len(shape), **overrides)
    return {a.axis: spec.turns(a, shape[a.index]).radians.copy() for a in spec.channels(dim)}
