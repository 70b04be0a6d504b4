"""Figures of positional encodings: one function per figure, each returning a matplotlib Figure.

Every figure computes what it shows with posenc itself (the exact engine, the
bias modules, the rotary schedules), so a figure and the numbers printed
beside it in ``posenc report`` come from the same code. matplotlib is imported
on first use (``pip install posenc[plot]``) with the Agg backend: no display.

:data:`KINDS` maps the names of ``posenc plot KIND`` to these functions; all
of them take keyword arguments with defaults (Vaswani et al.'s encoding at
d = 512, 50 positions) and ignore the ones they do not use. What a figure
measures (errors, decay bounds, schedules, a trained table) comes from
:mod:`posenc.analysis`.

Images are coloured on their own data's range (:func:`colour_scale`:
symmetric about 0 on a diverging map when the values have both signs), with
a labelled colour bar. :func:`save` writes PNG at 220 dpi and SVG with its
text as text and its images at data resolution.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from posenc.core import checks
from posenc.core.files import atomic_write
from posenc.integration.analysis.explorer import hand_pairs

__all__ = [
    "KINDS",
    "figure",
    "save",
]

#: PNG resolution: twice matplotlib's screen resolution, sharp on high-density displays.
PNG_DPI = 220

#: Text size of the small labels on dense figures (clock panels, token names).
SMALL = 8


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the Agg backend (no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def new_figure(width: float = 7.0, height: float = 4.0, ncols: int = 1, nrows: int = 1) -> Any:
    """A new ``(figure, axes)`` of ``width`` x ``height`` inches, ``nrows`` x ``ncols`` panels."""
    plt = pyplot()
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), layout="constrained")
    return fig, axes


def colour_scale(*arrays: Any, signed: bool | None = None) -> tuple[Any, str]:
    """A colour scale fitted to the data shown: ``(Normalize, colormap name)``.

    Data with both signs (or ``signed=True``) gets limits symmetric about 0,
    ``+-max |x|``, on the diverging ``RdBu_r`` (white is 0); one-signed data
    gets its own ``[min, max]`` on ``viridis``. NaN and masked entries are
    ignored.
    """
    pyplot()
    from matplotlib.colors import Normalize

    values = np.concatenate(
        [np.ma.masked_invalid(np.ma.asarray(a, dtype=np.float64)).compressed() for a in arrays]
    )
    lo, hi = float(values.min()), float(values.max())
    if signed is None:
        signed = lo < 0 < hi
    if signed:
        top = max(-lo, hi)
        return Normalize(-top, top), "RdBu_r"
    return Normalize(lo, hi), "viridis"


def _image(
    fig: Any,
    ax: Any,
    data: Any,
    title: str,
    xlabel: str,
    ylabel: str,
    label: str = "",
    *,
    scale: tuple[Any, str] | None = None,
    colorbar: bool = True,
    **kw: Any,
) -> Any:
    """``data`` as an image on ``ax``, labelled, with a colour bar labelled ``label``.

    The scale is :func:`colour_scale` of ``data`` unless ``scale`` is given
    (one scale shared by several images). ``interpolation="none"``: Agg draws
    the cells as blocks, and SVG embeds the raster at data resolution (one
    pixel per cell) instead of resampling it.
    """
    norm, cmap = scale if scale is not None else colour_scale(data)
    im = ax.imshow(data, norm=norm, cmap=cmap, interpolation="none", **kw)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if colorbar:
        fig.colorbar(im, ax=ax, shrink=0.85, label=label)
    return im


def _num(x: float) -> str:
    """A wavelength for a small title: 3 digits below 100, whole positions above."""
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def encode(fig: Any, fmt: str) -> bytes:
    """``fig`` as ``"png"`` (at :data:`PNG_DPI`) or ``"svg"`` bytes, posenc's way.

    The SVG keeps its text as text (``svg.fonttype = "none"``: searchable,
    small, drawn by the browser's font) and its images at data resolution; its
    ids and metadata do not depend on the run, so the same figure gives the
    same bytes.
    """
    import io

    import matplotlib

    buf = io.BytesIO()
    if fmt == "svg":
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "posenc"}):
            fig.savefig(buf, format="svg", metadata={"Date": None})
        return _rounded_geometry(buf.getvalue())
    fig.savefig(buf, format="png", dpi=PNG_DPI)
    return buf.getvalue()


# the SVG attributes that hold drawing coordinates (in points): never text, never data URIs
_GEOMETRY = re.compile(rb'\b(d|x|y|x1|x2|y1|y2|width|height|transform)="([^"]*)"')
_LONG_DECIMAL = re.compile(rb"(-?\d+\.\d{2})\d+")


def _rounded_geometry(svg: bytes) -> bytes:
    """``svg`` with its drawing coordinates cut to 0.01 point (matplotlib writes six
    decimals): a third smaller, the same picture at any zoom a page is read at. Text,
    tick labels and embedded images are left as they are.

    Examples:
        >>> _rounded_geometry(b'<path d="M 38.743209 280.908627 L 1 2"/><text>0.123456</text>')
        b'<path d="M 38.74 280.90 L 1 2"/><text>0.123456</text>'
    """
    return _GEOMETRY.sub(lambda m: m[1] + b'="' + _LONG_DECIMAL.sub(rb"\1", m[2]) + b'"', svg)


def save(fig: Any, path: str | Path, *more: str | Path) -> Path:
    """Write ``fig`` to ``path`` (``.png`` at 220 dpi, or ``.svg``) atomically and close it.

    ``more`` paths get the same figure in their own format, as :func:`encode`
    renders it; the first path is returned. The figure is laid out once: the
    first file's rendering runs matplotlib's constrained layout (a pass over every
    artist before drawing, as costly as the drawing itself), and the others draw
    at the positions it set.

    Raises:
        ValueError: a suffix other than .png or .svg.
        OSError: ``path`` cannot be written (any previous file is left as it was).

    Examples:
        >>> import pathlib, tempfile
        >>> import posenc.plot
        >>> fig = posenc.plot.figure("wavelengths", dim=16)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = posenc.plot.save(fig, pathlib.Path(tmp, "w.png"), pathlib.Path(tmp, "w.svg"))
        ...     written = sorted(p.suffix for p in pathlib.Path(tmp).iterdir())
        >>> path.suffix, written
        ('.png', ['.png', '.svg'])
    """
    paths = [Path(p) for p in (path, *more)]
    for p in paths:
        if p.suffix not in (".png", ".svg"):
            raise ValueError(f"figure file must end in .png or .svg; got {str(p)!r}")
    try:
        for i, p in enumerate(paths):
            with atomic_write(p) as f:
                f.write(encode(fig, p.suffix[1:]))
            if i == 0 and len(paths) > 1:
                _keep_layout(fig)
    finally:
        pyplot().close(fig)
    return paths[0]


def _keep_layout(fig: Any) -> None:
    """Keep ``fig``'s artists where its layout engine last put them, and drop the engine.

    With no layout engine, ``savefig`` draws once; with one, even matplotlib's
    ``"none"`` placeholder, it draws twice (a pass that lays out, then the drawing).
    """
    import matplotlib

    # None means "no engine" only where the rc does not ask for one by default
    with matplotlib.rc_context(
        {"figure.autolayout": False, "figure.constrained_layout.use": False}
    ):
        fig.set_layout_engine(None)


# ------------------------------------------------------------------ why positions, exp and log


def permutation(
    *, dim: int = 16, tokens: int = 6, seed: int = 0, preset: str = "vaswani", **_: Any
) -> Any:
    """Self-attention on tokens and on the tokens reordered, without and with positions added."""
    from posenc.integration.analysis import permutation_check

    r = permutation_check(dim, tokens, seed, preset=preset)
    perm = np.asarray(r.permutation)
    rows = (
        ("no positions", "X", r.output, r.permuted_output, r.max_difference),
        ("PE added", "X + PE", r.positioned_output, r.positioned_permuted_output, r.with_positions),
    )
    diffs = [moved - out[perm] for _, _, out, moved, _ in rows]
    scale = colour_scale(*(a for row in rows for a in row[2:4]), *diffs, signed=True)
    names = [f"t{i}" for i in range(tokens)]
    moved_names = [names[i] for i in perm]
    fig, axes = new_figure(10, 5.8, ncols=3, nrows=2)
    im = None
    for k, ((what, inp, out, moved, worst), diff) in enumerate(zip(rows, diffs, strict=True)):
        verdict = "rows only reordered" if k == 0 else "rows changed"
        panels = (
            (out, f"attn({inp})", f"{what}: token", names),
            (
                moved,
                f"attn({inp.replace('X', 'X[perm]')}): {verdict}",
                "token (reordered)",
                moved_names,
            ),
            (diff, f"minus attn({inp})[perm]: max {worst:.1e}", "token (reordered)", moved_names),
        )
        for ax, (data, title, ylabel, ticks) in zip(axes[k], panels, strict=True):
            im = _image(
                fig,
                ax,
                data,
                title,
                "output channel",
                ylabel,
                scale=scale,
                colorbar=False,
                aspect="auto",
            )
            ax.set_yticks(range(tokens), ticks, fontsize=SMALL)
            ax.title.set_fontsize(9)
    fig.colorbar(im, ax=axes, shrink=0.7, label="attention output (one scale, 0 white)")
    fig.suptitle(
        "Reordering the tokens only reorders self-attention's output, until positions are added\n"
        f"random tokens X ({tokens} x {dim}), one softmax head; rounding bound {r.bound:.1e}"
    )
    return fig


def exp_log(*, dim: int = 512, base: float = 10000.0, **_: Any) -> Any:
    """float32 error of the power and exp-log frequency forms, and the h versus h - 1 schedules."""
    from posenc.integration.analysis import exp_log_errors

    e = exp_log_errors(dim, base)
    fig, (left, right) = new_figure(10, 4.0, ncols=2)
    left.plot(e.pair, e.power_error / e.unit, ".", ms=3, label="power: 1 / base^(2i/d)")
    left.plot(
        e.pair, e.exp_log_error / e.unit, ".", ms=3, label="exp-log: exp(2i · (−ln base / d))"
    )
    left.set_xlabel("pair index i")
    left.set_ylabel("relative error of ωᵢ (units of 2⁻²⁴)")
    left.set_title("float32 ωᵢ against 40-digit mpmath")
    left.legend(fontsize=SMALL)
    h = dim // 2
    right.semilogy(e.pair, e.paper, lw=1.5, label="paper: base^(−i/h)")
    right.semilogy(e.pair, e.variant, "--", lw=1.5, label="variant: base^(−i/(h−1))")
    right.axhline(1 / base, color="grey", ls=":", lw=0.8, label=f"1/base = {1 / base:g}")
    right.set_xlabel("pair index i")
    right.set_ylabel("ωᵢ (radians per position, log scale)")
    right.set_title(f"denominator h = d/2 or h − 1 (d = {dim}, h = {h})")
    right.legend(fontsize=SMALL, loc="lower left")
    # on four decades the two schedules differ by a few percent: zoom on the last pairs
    last = max(h - 8, 0)
    inset = right.inset_axes((0.6, 0.6, 0.37, 0.33))
    inset.plot(e.pair[last:], e.paper[last:] * base, lw=1.2, marker=".")
    inset.plot(e.pair[last:], e.variant[last:] * base, "--", lw=1.2, marker=".")
    inset.axhline(1.0, color="grey", ls=":", lw=0.8)
    inset.set_xlabel("pair i", fontsize=7, labelpad=1)
    inset.set_ylabel("ωᵢ · base", fontsize=7, labelpad=1)
    inset.tick_params(labelsize=6)
    inset.set_title(
        f"last pair: {e.paper[-1] * base:.4g}/base and {e.variant[-1] * base:.4g}/base",
        fontsize=7,
    )
    return fig


def add_concat(*, dim: int = 512, length: int = 50, preset: str = "vaswani", **_: Any) -> Any:
    """Tokens plus positions on one (cos, sin) pair: scaled by sqrt(d), unscaled, concatenated."""
    from posenc.integration.analysis import add_concat as measure

    a = measure(dim, length, preset=preset)
    cos_c, sin_c = a.channels
    fig, axes = new_figure(12, 4.6, ncols=3)
    panels = (
        (f"added, token × √d (entries' std {a.scaled_std:.2g})", a.scaled_tokens, a.scaled_points),
        (f"added, no √d (std {a.unscaled_std:.2g})", a.unscaled_tokens, a.unscaled_points),
        ("concatenated [√d token, PE]", a.concat_points[:, 0], a.concat_points),
    )
    reach = float(np.max(np.abs(np.concatenate([a.scaled_points, a.unscaled_points])))) * 1.1
    radius = float(np.mean(np.linalg.norm(a.scaled_points - a.scaled_tokens[:, None], axis=-1)))
    top = float(np.max(np.abs(a.concat_points[..., 1])))
    dots = None
    positions = np.arange(a.length)
    for k, (ax, (title, centres, points)) in enumerate(zip(axes, panels, strict=True)):
        for n, (centre, pts) in enumerate(zip(centres, points, strict=True)):
            dots = ax.scatter(pts[:, 0], pts[:, 1], c=positions, cmap="viridis", s=9, zorder=2)
            if k == 0:
                ax.plot(*centre, "kx", ms=7, mew=1.5, zorder=3)
                ax.annotate(
                    f"token {n}", centre, xytext=(4, 4), textcoords="offset points", fontsize=SMALL
                )
            elif k == 1:  # the labels would sit on top of each other
                ax.plot(*centre, "kx", ms=7, mew=1.5, zorder=3)
            else:  # one column per token, labelled above it, staggered
                ax.annotate(
                    f"token {n}",
                    (centre[0], top * (1.08 + 0.12 * (n % 2))),
                    ha="center",
                    fontsize=SMALL,
                )
        ax.set_title(title, fontsize=10)
        if k < 2:
            ax.set_xlim(-reach, reach)
            ax.set_ylim(-reach, reach)
            ax.set_aspect("equal")
            ax.set_xlabel(f"channel {cos_c}: token + cos(ω p)")
            ax.set_ylabel(f"channel {sin_c}: token + sin(ω p)")
        else:
            ax.set_xlabel(f"token channel {cos_c} (first {a.dim})")
            ax.set_ylabel(f"position channel {a.dim} + {sin_c}: sin(ω p)")
            ax.set_ylim(-1.15 * top, 1.35 * top)
    fig.colorbar(dots, ax=axes, shrink=0.8, label="position p")
    rs, ru = a.position_recovery_scaled, a.position_recovery_unscaled
    ts, tu = a.token_recovery_scaled, a.token_recovery_unscaled
    fig.suptitle(
        f"token + PE(p), p < {a.length}, on pair {a.pair} (wavelength {a.wavelength:.3g}): a "
        f"circle of radius {radius:.3g} around each token\nread back after adding (√d / none): "
        f"position {rs:.0%} / {ru:.0%}, token {ts:.0%} / {tu:.0%}; concatenated: "
        f"{a.concat_position_recovery:.0%} / {a.concat_token_recovery:.0%}"
    )
    return fig


# ------------------------------------------------------------------ sinusoidal


def heatmap(*, dim: int = 512, length: int = 50, preset: str = "vaswani", **_: Any) -> Any:
    """The table as an image: positions down, channels across."""
    import posenc

    table = posenc.sinusoidal(length, dim, preset=preset, dtype="float64")
    fig, ax = new_figure(8, 4)
    title = f"{preset}: PE(position, channel), d = {dim}, {length} positions"
    _image(fig, ax, table, title, "channel", "position", "PE value", aspect="auto")
    return fig


def wavelengths(*, dim: int = 512, preset: str = "vaswani", **_: Any) -> Any:
    """Wavelength of each (sin, cos) pair: a geometric progression from 2 pi upwards."""
    from posenc.families.absolute.sinusoidal import resolve

    spec = resolve(preset)
    omega = spec.inv_freq(dim)
    fig, ax = new_figure(7, 3.6)
    ax.semilogy(np.arange(len(omega)), 2 * np.pi / omega, marker=".", lw=1, label=preset)
    ax.axhline(2 * np.pi, color="grey", lw=0.8, ls="--", label="2π (ω = 1)")
    ax.axhline(2 * np.pi * spec.base, color="grey", lw=0.8, ls=":", label="2π · base")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength 2π/ωᵢ (positions, log)")
    ax.set_title(f"wavelength of each pair, ωᵢ = base^(−2i/d), base {spec.base:g}, d = {dim}")
    ax.legend(fontsize=SMALL)
    return fig


def shift(*, dim: int = 512, offset: float = 10, preset: str = "vaswani", **_: Any) -> Any:
    """M_k, the exact linear map PE(p) -> PE(p + k): its first 16 x 16 channels."""
    import posenc

    m = posenc.shift_matrix(offset, dim, preset=preset)
    n = min(16, dim)
    fig, ax = new_figure(5, 4.4)
    title = f"M_k, k = {offset:g} (first {n} channels):\n2×2 rotations on the diagonal"
    _image(fig, ax, m[:n, :n], title, "channel of PE(p)", "channel of PE(p + k)", "entry of M_k")
    return fig


def regression(
    *, dim: int = 512, length: int = 50, offset: float = 10, preset: str = "vaswani", **_: Any
) -> Any:
    """One column at p + k against the same column at p (no line fits), and the pair fit."""
    import posenc
    from posenc.integration.analysis import regression_r2

    r = regression_r2(dim, length, offset, preset=preset)
    t = posenc.sinusoidal(np.arange(length + offset), dim, preset=preset, dtype="float64")
    x, y = t[:length, r.column], t[offset : offset + length, r.column]
    a, b, c = r.pair_coef
    fit = a + b * t[:length, r.column] + c * t[:length, r.partner]
    fig, (left, right) = new_figure(8.5, 3.8, ncols=2)
    left.scatter(x, y, s=10)
    left.set_xlabel(f"channel {r.column} at p")
    left.set_ylabel(f"channel {r.column} at p + {offset:g}")
    left.set_title(f"one column: R² = {r.single_r2:.3f}")
    right.scatter(fit, y, s=10)
    right.set_xlabel(f"fit from channels {r.column} and {r.partner} at p")
    right.set_ylabel(f"channel {r.column} at p + {offset:g}")
    right.set_title(f"the (sin, cos) pair: R² = {r.pair_r2:.12f}")
    return fig


def clocks(
    *,
    dim: int = 512,
    preset: str = "vaswani",
    positions: Any = (0, 1, 2, 5, 10, 20),
    pairs: int = 8,
    trail: int = 3,
    **_: Any,
) -> Any:
    """Each (sin, cos) pair as a clock hand (cos, sin) on a unit circle, with a trail of dots.

    Rows are positions, columns pairs (log-spaced by
    :func:`posenc.analysis.explorer.hand_pairs`, the fastest and the slowest included).
    The hand of pair ``i`` at ``p`` is
    ``(cos(omega_i p), sin(omega_i p))`` read from the table's two channels of
    the pair (which one holds the sine depends on the preset's order), divided
    by the amplitude; with y up it turns counter-clockwise by ``omega_i``
    radians per position. The dots are the ``trail`` previous positions.

    Raises:
        ValueError: ``dim`` has no complete (sin, cos) pair.
    """
    import posenc
    from posenc.families.absolute.sinusoidal import resolve

    spec = resolve(preset)
    slots = spec.slots(dim)
    complete = min(slots.n_first, slots.n_second)
    if complete == 0:
        raise ValueError(f"dim={dim} has no complete (sin, cos) pair to draw as a clock")
    trail = checks.check_int(trail, "trail")
    shown = hand_pairs(complete, pairs)
    pos = [float(checks.check_number(p, "positions")) for p in positions]
    if not pos:
        raise ValueError("positions must hold at least one position")
    # the hand is (cos, sin) whichever member of the pair comes first in the row
    sin_ch, cos_ch = spec.sin_cos_channels(dim)
    needed = sorted({p - t for p in pos for t in range(trail + 1) if p - t >= 0} | set(pos))
    table = posenc.sinusoidal(np.asarray(needed), dim, preset=preset, dtype="float64")
    row = {p: i for i, p in enumerate(needed)}
    amp = spec.amplitude_for(dim) or 1.0
    omega = spec.inv_freq(dim)

    def hand(p: float, j: int) -> tuple[float, float]:
        return table[row[p], cos_ch[j]] / amp, table[row[p], sin_ch[j]] / amp

    fig, axes = new_figure(
        1.3 * len(shown) + 0.9, 1.3 * len(pos) + 1.5, ncols=len(shown), nrows=len(pos)
    )
    axes = np.asarray(axes).reshape(len(pos), len(shown))
    theta = np.linspace(0, 2 * np.pi, 73)
    for r, p in enumerate(pos):
        for c, j in enumerate(shown):
            ax = axes[r, c]
            ax.plot(np.cos(theta), np.sin(theta), color="0.8", lw=0.8)
            ax.plot([-1.1, 1.1], [0, 0], color="0.9", lw=0.5)
            ax.plot([0, 0], [-1.1, 1.1], color="0.9", lw=0.5)
            for t in range(trail, 0, -1):
                if p - t in row:
                    ax.plot(
                        *hand(p - t, j),
                        "o",
                        color="C3",
                        ms=3.5,
                        mec="none",
                        alpha=0.7 * (trail + 1 - t) / (trail + 1),
                        gid=f"trail-p{p - t:g}-i{j}",
                    )
            x, y = hand(p, j)
            ax.plot(
                [0, x], [0, y], color="C3", lw=2, solid_capstyle="round", gid=f"hand-p{p:g}-i{j}"
            )
            ax.set_xlim(-1.2, 1.2)
            ax.set_ylim(-1.2, 1.2)
            ax.set_aspect("equal")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"pair i = {j}\nλ = {_num(2 * np.pi / omega[j])}", fontsize=SMALL)
            if c == 0:
                ax.set_ylabel(f"p = {p:g}", fontsize=SMALL + 1)
    fig.suptitle(
        f"{preset}, d = {dim}: pair i drawn as the hand (cos ωᵢ p, sin ωᵢ p), y up;\n"
        f"each hand turns counter-clockwise by ωᵢ radians per position "
        f"(dots: the {trail} previous positions)",
        fontsize=11,
    )
    fig.supxlabel(
        "columns: pairs i, log-spaced from the fastest to the slowest; λ = 2π/ωᵢ in positions",
        fontsize=9,
    )
    fig.supylabel("rows: position p", fontsize=9)
    return fig


def similarity(*, dim: int = 512, length: int = 50, preset: str = "vaswani", **_: Any) -> Any:
    """Cosine similarity of every pair of positions."""
    import posenc

    t = posenc.sinusoidal(length, dim, preset=preset, dtype="float64")
    unit = t / np.linalg.norm(t, axis=1, keepdims=True)
    fig, ax = new_figure(5.2, 4.4)
    title = "cos(PE(p), PE(q)): a function of p − q"
    _image(fig, ax, unit @ unit.T, title, "position q", "position p", "cosine similarity")
    return fig


def offsets(*, dim: int = 512, length: int = 50, preset: str = "vaswani", **_: Any) -> Any:
    """PE(p) . PE(p + k) against k (the same for every p), and the row norms."""
    import posenc

    t = posenc.sinusoidal(length + 200, dim, preset=preset, dtype="float64")
    ks = np.arange(0, 200)
    dots = np.array([[t[p] @ t[p + k] for k in ks] for p in (0, length // 2, length - 1)])
    fig, (left, right) = new_figure(8, 3.8, ncols=2)
    for row, p in zip(dots, (0, length // 2, length - 1), strict=True):
        left.plot(ks, row, lw=1, label=f"p = {p}")
    left.set_xlabel("offset k (positions)")
    left.set_ylabel("PE(p) · PE(p + k)")
    left.legend(fontsize=SMALL)
    left.set_title("the dot product depends on k only")
    norms = np.linalg.norm(t[:length], axis=1)
    right.plot(np.arange(length), norms, marker=".")
    right.axhline(math.sqrt(dim / 2), color="grey", ls="--", lw=0.8)
    right.set_ylim(0, math.sqrt(dim / 2) * 1.3)
    right.set_xlabel("position p")
    right.set_ylabel("norm |PE(p)|")
    right.set_title(f"norm of every row: √(d/2) = {math.sqrt(dim / 2):.4g}")
    return fig


def precision(
    *, dim: int = 512, preset: str = "vaswani", points: tuple[float, ...] | None = None, **_: Any
) -> Any:
    """Error against position: the usual float32 and bfloat16 formulas, and posenc's float32."""
    from posenc.integration.analysis import precision_curves

    curves = precision_curves(dim, preset, points)
    fig, ax = new_figure(7, 3.8)
    for name, errs in curves.items():
        if name == "position":
            continue
        ax.loglog(curves["position"], np.maximum(errs, 1e-12), marker=".", label=name)
    ax.set_xlabel("position p (log)")
    ax.set_ylabel("max |value − exact| over the row")
    ax.set_title("error of one row against position (floored at 1e-12)")
    ax.legend(fontsize=SMALL)
    return fig


# ------------------------------------------------------------------ learned, RoPE, biases, grids


def learned(*, learned_table: Any = None, dim: int = 32, length: int = 32, **_: Any) -> Any:
    """A learned table next to the sinusoidal one, with their position similarities.

    Without ``learned_table``, the table of :func:`posenc.analysis.train_learned` at
    ``length`` x ``dim``: at 32 x 32 the run bundled with posenc, otherwise trained now.
    """
    import posenc

    if learned_table is None:
        from posenc.faces.learned_table import trained

        learned_table = trained(length=length, dim=dim).table
    table = np.asarray(learned_table, dtype=np.float64)
    sin = posenc.sinusoidal(table.shape[0], table.shape[1], dtype="float64")
    fig, axes = new_figure(9.5, 7, ncols=2, nrows=2)
    for col, (name, t) in enumerate((("learned", table), ("sinusoidal", sin))):
        _image(fig, axes[0, col], t, f"{name} table", "channel", "position", "value", aspect="auto")
        unit = t / np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12)
        _image(
            fig,
            axes[1, col],
            unit @ unit.T,
            f"{name}: cosine similarity of positions",
            "position q",
            "position p",
            "cosine similarity",
        )
    return fig


def decay(*, head_dim: int = 128, base: float = 10000.0, max_distance: int = 2000, **_: Any) -> Any:
    """RoPE's long-term decay: RoFormer's bound on |sum_j e^{i r theta_j}| against distance."""
    from posenc.integration.analysis import rope_decay

    r, bound, mean_abs = rope_decay(head_dim, base, max_distance)
    fig, ax = new_figure(7, 3.6)
    ax.plot(r, bound, lw=1, label="(1/(d/2)) Σ_j |S_j| (RoFormer 3.4.3)")
    ax.plot(r, mean_abs, lw=1, label="|mean_j e^(i r θⱼ)|")
    ax.set_xlabel("relative distance m − n (positions)")
    ax.set_ylabel("relative upper bound")
    ax.set_title(f"RoPE long-term decay, head_dim {head_dim}, base {base:g}")
    ax.legend(fontsize=SMALL)
    return fig


def rope_scaling(
    *,
    head_dim: int = 128,
    base: float = 500000.0,
    factor: float = 8.0,
    original: int = 8192,
    **_: Any,
) -> Any:
    """Wavelength of each rotary pair under the scaling types (linear, NTK, YaRN, llama3)."""
    from posenc.integration.analysis import scaling_curves

    curves = scaling_curves(head_dim, base, factor, original)
    fig, ax = new_figure(7, 4)
    for name, omega in curves.items():
        ax.semilogy(2 * np.pi / omega, label=name, lw=1.2)
    ax.axhline(
        original, color="grey", ls="--", lw=0.8, label=f"original (trained) length {original}"
    )
    ax.axhline(
        original * factor,
        color="grey",
        ls=":",
        lw=0.8,
        label=f"extended length {original * factor:g}",
    )
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength 2π/ωᵢ (positions, log)")
    ax.set_title(f"rotary schedules, factor {factor:g}, base {base:g}")
    ax.legend(fontsize=SMALL)
    return fig


def riflex(
    *,
    axis_dim: int = 16,
    base: float = 256.0,
    k: int = 4,
    train_frames: int = 33,
    test_frames: int = 66,
    **_: Any,
) -> Any:
    """RIFLEx on a video model's time axis: the intrinsic component before and after.

    Defaults: HunyuanVideo (16 time channels, base 256, trained on 33 latent frames, k = 4
    as thu-ml/RIFLEx sets it), generating 66 (261 frames).
    """
    from posenc.families.rotary.multiaxis.intrinsic import riflex as lowered
    from posenc.families.rotary.schedules import default

    before = default(axis_dim, base, {}).inv_freq
    after = lowered(default(axis_dim, base, {}), k, test_frames).inv_freq
    fig, (left, right) = new_figure(8, 3.8, ncols=2)
    t = np.linspace(0.0, test_frames * 1.15, 600)
    for w, style, name in ((before, "-", "original"), (after, "--", "RIFLEx")):
        period = 2 * np.pi / w[k - 1]
        left.plot(t, np.cos(w[k - 1] * t), style, lw=1.2,
                  label=f"{name}: ω = {w[k - 1]:.4g}, period {_num(period)}")  # fmt: skip
    for frames, ls, name in ((train_frames, "--", "trained"), (test_frames, ":", "generated")):
        left.axvline(frames, color="grey", ls=ls, lw=0.8, label=f"{name}: {frames} frames")
    left.set_xlabel("latent frame t")
    left.set_ylabel(f"cos(ω_{k} t)")
    left.set_title(f"intrinsic component k = {k}", fontsize=10)
    left.legend(fontsize=SMALL, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)
    j = np.arange(1, len(before) + 1)
    right.semilogy(j, 2 * np.pi / before, "o", ms=4, label="original")
    right.semilogy([k], [2 * np.pi / after[k - 1]], "x", ms=8, mew=2, label="RIFLEx, k")
    right.axhline(train_frames, color="grey", ls="--", lw=0.8, label="trained length")
    right.axhline(test_frames, color="grey", ls=":", lw=0.8, label="generated length")
    right.set_xlabel("component j (1-based)")
    right.set_ylabel("period 2π/ω_j (latent frames, log)")
    right.set_title("period of every time component", fontsize=10)
    right.legend(fontsize=SMALL, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)
    fig.suptitle(f"RIFLEx: ω_k = 0.9 · 2π / {test_frames} (time axis {axis_dim} channels, "
                 f"base {base:g})")  # fmt: skip
    return fig


def alibi(*, heads: int = 8, length: int = 24, **_: Any) -> Any:
    """ALiBi slopes and the causal bias of one head."""
    import posenc

    slopes = posenc.alibi_slopes(heads)
    bias = posenc.ALiBi(heads).bias(length, length).detach().numpy()
    mask = np.triu(np.ones((length, length), dtype=bool), 1)
    fig, (left, right) = new_figure(9, 3.8, ncols=2)
    left.bar(np.arange(1, heads + 1), slopes)
    left.set_yscale("log", base=2)
    left.set_xlabel("head h")
    left.set_ylabel("slope m_h (log₂)")
    left.set_title(f"slopes m_h = 2^(−8h/n), n = {heads}")
    title = f"head 1: bias −m (i − j), causal, {length} tokens"
    _image(
        fig,
        right,
        np.ma.masked_array(bias[0], mask),
        title,
        "key position j",
        "query position i",
        "bias added to the score",
    )
    return fig


def t5(*, length: int = 200, num_buckets: int = 32, max_distance: int = 128, **_: Any) -> Any:
    """T5's bucket of each relative position (encoder and decoder)."""
    import posenc

    rel = np.arange(-length, length + 1)
    fig, (left, right) = new_figure(9, 3.8, ncols=2)
    for bidirectional in (True, False):
        b = posenc.t5_bucket(
            rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        left.step(rel, b, where="mid", label="encoder" if bidirectional else "decoder")
    left.set_xlabel("relative position key − query")
    left.set_ylabel("bucket")
    left.legend(fontsize=SMALL)
    left.set_title(f"{num_buckets} buckets, max_distance {max_distance}")
    n = 48
    q = np.arange(n)[:, None]
    grid = posenc.t5_bucket(np.arange(n)[None, :] - q)
    _image(
        fig,
        right,
        grid,
        "encoder bucket of (query, key)",
        "key position j",
        "query position i",
        "bucket",
    )
    return fig


def grid(*, size: int = 14, dim: int = 64, preset: str = "mae", **_: Any) -> Any:
    """A 2-D grid encoding of an image's patches: each channel as a size x size tile."""
    import posenc

    g = posenc.grid((size, size), dim, preset=preset, dtype="float64")
    tiles = g.reshape(size, size, dim)
    cols = math.ceil(math.sqrt(dim))
    rows = math.ceil(dim / cols)
    mosaic = np.full((rows * (size + 1), cols * (size + 1)), np.nan)
    for c in range(dim):
        r0, c0 = (c // cols) * (size + 1), (c % cols) * (size + 1)
        mosaic[r0 : r0 + size, c0 : c0 + size] = tiles[:, :, c]
    fig, ax = new_figure(7.4, 6.4 * rows / cols + 0.6)
    title = (
        f"{preset} grid encoding, {size}×{size} patches, {dim} channels: one tile per channel\n"
        f"(channels left to right, {cols} a row; in a tile, patch row down, column across)"
    )
    _image(fig, ax, mosaic, title, "", "", "PE value")
    ax.set_axis_off()
    ax.title.set_fontsize(9)
    return fig


def index(*, dim: int = 512, **_: Any) -> Any:
    """The index p and p / (L - 1) as features, against the bounded sinusoidal table."""
    from posenc.integration.analysis import index_features

    feats = index_features(dim=dim)
    fig, (left, right) = new_figure(10.5, 4.0, ncols=2)
    for n, colour in zip(feats.lengths[:2], ("C0", "C1"), strict=True):
        p = np.arange(n)
        left.plot(p, p / (n - 1), color=colour, lw=1.6, label=f"p / (L \u2212 1), L = {n}")
        value = feats.position / (n - 1)
        left.plot([feats.position], [value], "o", color=colour)
        left.annotate(
            f"position {feats.position}: {value:g}", (feats.position, value),
            xytext=(12, 6 if n < 50 else -14), textcoords="offset points", color=colour,
        )  # fmt: skip
    left.set_xlabel("position p")
    left.set_ylabel("feature value")
    left.set_title("the index over the length: one position, two values")
    left.legend(fontsize=SMALL, loc="lower right")
    lengths = np.geomspace(10, 10**6, 60)
    right.loglog(lengths, lengths - 1, color="C3", lw=1.8, label="raw index at the end, L \u2212 1")
    right.axhline(feats.sinusoidal_bound, color="C2", lw=1.8,
                  label="largest sinusoidal value, any L")  # fmt: skip
    right.axhline(0.02, color="0.4", lw=1.2, ls="--",
                  label="token-embedding entries, std 0.02 (GPT-2's initialisation)")  # fmt: skip
    right.set_xlabel("sequence length L")
    right.set_ylabel("magnitude")
    right.set_title("the raw index outgrows everything it is added to")
    right.legend(fontsize=SMALL, loc="upper left")
    return fig


def timesteps(*, dim: int = 64, **_: Any) -> Any:
    """Diffusion timesteps 0..999 through the ddpm, ldm and annotated-diffusion presets."""
    import posenc
    from posenc.integration.analysis import TIMESTEP_PRESETS, timestep_presets

    t = np.arange(1000, dtype=np.float64)
    fig, axes = new_figure(13, 4.2, ncols=4)
    # every 4th timestep: the rows of a figure, and a quarter of the bytes of every row
    rows = t[::4]
    tables = [posenc.sinusoidal(rows, dim, preset=p, dtype="float64") for p in TIMESTEP_PRESETS]
    scale = colour_scale(*tables)
    for ax, name, table in zip(axes[:3], TIMESTEP_PRESETS, tables, strict=True):
        _image(fig, ax, table, name, "channel", "timestep t", "value", scale=scale,
               colorbar=name == TIMESTEP_PRESETS[-1], aspect="auto",
               extent=(-0.5, dim - 0.5, rows[-1] + 2, -2))  # fmt: skip
        ax.axvline(dim / 2 - 0.5, color="k", lw=0.8)
    # only what is drawn: ddpm's neighbours (the mean over the figure's rows: the cosine of
    # e(t) and e(t + k) does not depend on t), and ddpm against ldm at t = 0..300
    got = timestep_presets(dim, TIMESTEP_PRESETS[:1], timesteps=rows, offsets=np.arange(1, 301))
    pair = timestep_presets(dim, TIMESTEP_PRESETS[:2], timesteps=t[:301], offsets=(1,))
    ax = axes[3]
    ax.plot(got.offsets, got.neighbour[0], color="C0", lw=1.4, label="e(t) and e(t + k), ddpm")
    mismatch = pair.cosine[0, 1]
    ax.plot(t[:301], mismatch, color="C1", lw=1.2, ls="--",
            label="ddpm(t) and ldm(t), the same t")  # fmt: skip
    ax.set_xlabel("offset k / timestep t")
    ax.set_ylabel("cosine similarity")
    ax.set_title(f"similarity (d = {dim})")
    ax.legend(fontsize=SMALL)
    return fig


# ------------------------------------------------------------------ the base, projections, layouts


def bases(*, dim: int = 512, length: int = 4096, preset: str = "vaswani", **_: Any) -> Any:
    """What the base controls: each pair's wavelength, and the similarity of rows k apart."""
    from posenc.families.absolute.sinusoidal import resolve
    from posenc.integration.analysis.bases import BASES, base_sweep

    sweep = base_sweep(dim, length, BASES, shown=2, preset=preset)
    fig, (left, right) = new_figure(10, 4.0, ncols=2)
    pairs = np.arange(dim // 2)
    # log-spaced offsets: the ripples of every decade, at a twentieth of the points
    ks = np.unique(np.geomspace(1, length - 1, 200).round().astype(int))
    for j, base in enumerate(sweep.bases):
        wavelength = 2 * np.pi / resolve(preset, base=base).inv_freq(dim)
        left.semilogy(pairs, wavelength, lw=1.4, color=f"C{j}", label=f"base {base:,g}")
        right.semilogx(ks, sweep.similarity[j, ks], lw=1, color=f"C{j}", label=f"base {base:,g}")
    left.axhline(length, color="grey", ls="--", lw=0.8, label=f"{length:,} positions")
    left.set_xlabel("pair index i")
    left.set_ylabel("wavelength 2π·base^(2i/d) (positions, log)")
    left.set_title(f"wavelength of each pair, d = {dim} (below the line: wraps)")
    left.legend(fontsize=SMALL)
    right.axhline(0, color="grey", lw=0.8)
    right.set_xlabel("offset k (positions, log)")
    right.set_ylabel("PE(p) · PE(p + k) / (d/2)")
    right.set_title("cosine of two rows k apart, by base")
    right.legend(fontsize=SMALL, loc="lower left")
    return fig


def projections(*, dim: int = 32, length: int = 24, seed: int = 0, **_: Any) -> Any:
    """The position-position term of the score over (m, n) under four projections."""
    from posenc.integration.analysis.projections import CASES, position_terms

    got = position_terms(dim, length, seed)
    titles = {
        "identity": "W_q = W_k = I: PE(m) · PE(n)",
        "commuting": "A = I + 0.7 M₃ − 0.4 M₁₁ (commutes)",
        "random": "random W_q, W_k: PE(m)ᵀ W_qᵀ W_k PE(n)",
        "rope": "RoPE after the same W_q, W_k",
    }
    fig, axes = new_figure(9, 7.6, ncols=2, nrows=2)
    for ax, case in zip(axes.flat, CASES, strict=True):
        spread = got.spread[case]
        verdict = "constant diagonals" if spread <= got.tolerance[case] else "diagonals vary"
        _image(fig, ax, got.terms[case], f"{titles[case]}\n{verdict} (spread {spread:.1e})",
               "key position n", "query position m", "position-position term")  # fmt: skip
        ax.title.set_fontsize(9)
    fig.suptitle(f"The score's position-position term, d = {dim}, seed {seed}")
    return fig


def rope_layouts(
    *, head_dim: int = 64, length: int = 32, seed: int = 0, measured: Any = None, **_: Any
) -> Any:
    """Which channels each RoPE layout pairs, and the scores' error of the wrong layout.

    ``measured``: ``posenc.integration.analysis.layouts.rope_layouts`` of these sizes
    if already measured (the report's section has it); otherwise it is measured here.
    """
    from posenc.integration.analysis.layouts import rope_layouts as measure

    got = measure(head_dim, length, seed=seed) if measured is None else measured
    shown = 8  # a small head: the pattern, not its size
    channel = np.arange(shown)
    pairing = np.stack([channel // 2, channel % (shown // 2)])
    fig, (left, right) = new_figure(11, 4.2, ncols=2)
    _image(fig, left, pairing, f"the pair of each channel (head_dim {shown})", "channel",
           "layout", "pair index i (angle m θᵢ)")  # fmt: skip
    for (row, col), i in np.ndenumerate(pairing):
        ink = "black" if i >= shown // 4 else "white"  # dark text on the light cells
        left.text(col, row, str(i), ha="center", va="center", color=ink, fontsize=SMALL)
    left.set_yticks([0, 1], ["interleaved", "half"])
    left.set_xticks(channel)
    error = np.abs(got.wrong - got.scores)
    _image(fig, right, error, "half layout on interleaved weights: 0 only on m = n",
           "key position n", "query position m", "|score difference|")  # fmt: skip
    fig.suptitle(
        f"RoPE layouts: max |difference| {got.wrong_difference:.3g} unpermuted, "
        f"{got.permuted_difference:.1e} with W_q, W_k permuted (head_dim {head_dim})"
    )
    return fig


#: Every figure ``posenc plot`` draws, by name: the function that draws it.
KINDS: dict[str, Callable[..., Any]] = {
    "permutation": permutation,
    "index": index,
    "heatmap": heatmap,
    "wavelengths": wavelengths,
    "shift": shift,
    "regression": regression,
    "exp-log": exp_log,
    "timesteps": timesteps,
    "add-concat": add_concat,
    "clocks": clocks,
    "similarity": similarity,
    "offsets": offsets,
    "precision": precision,
    "learned": learned,
    "decay": decay,
    "rope-scaling": rope_scaling,
    "alibi": alibi,
    "t5": t5,
    "grid": grid,
    "bases": bases,
    "projections": projections,
    "rope-layouts": rope_layouts,
    "riflex": riflex,
}


def figure(kind: str, **options: Any) -> Any:
    """The figure ``kind`` (a key of :data:`KINDS`) with ``options``.

    Raises:
        ValueError: an unknown kind (the valid ones are listed).

    Examples:
        >>> import posenc.plot
        >>> fig = posenc.plot.figure("heatmap", dim=16, length=20)
        >>> type(fig).__name__, len(fig.axes)  # the table and its colour bar
        ('Figure', 2)
        >>> fig.axes[0].get_title()
        'vaswani: PE(position, channel), d = 16, 20 positions'
    """
    checks.check_choice(kind, "kind", tuple(KINDS))
    return KINDS[kind](**options)
