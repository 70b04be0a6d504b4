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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from posenc.core import checks
from posenc.faces.files import atomic_write

__all__ = ["KINDS", "figure", "new_figure", "pyplot", "save"]

PAIR_COLOURS = "viridis"


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


def _image(fig: Any, ax: Any, data: Any, title: str, xlabel: str, ylabel: str, **kw: Any) -> None:
    """``data`` as an image on ``ax`` (viridis unless ``cmap``), labelled, with a colour bar."""
    kw = {"cmap": "viridis", "interpolation": "nearest", **kw}
    im = ax.imshow(data, **kw)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax, shrink=0.8)


def save(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (``.png`` at 110 dpi, or ``.svg``) atomically and close it.

    Raises:
        ValueError: a suffix other than .png or .svg.
        OSError: ``path`` cannot be written (any previous file is left as it was).
    """
    path = Path(path)
    if path.suffix not in (".png", ".svg"):
        raise ValueError(f"figure file must end in .png or .svg; got {str(path)!r}")
    with atomic_write(path) as f:
        fig.savefig(f, format=path.suffix[1:], dpi=110)
    pyplot().close(fig)
    return path


# ------------------------------------------------------------------ sinusoidal


def heatmap(*, dim: int = 512, length: int = 50, preset: str = "vaswani", **_: Any) -> Any:
    """The table as an image: positions down, channels across (viridis)."""
    import posenc

    table = posenc.sinusoidal(length, dim, preset=preset, dtype="float64")
    fig, ax = new_figure(8, 4)
    title = f"{preset}: PE(position, channel), d = {dim}, {length} positions"
    _image(fig, ax, table, title, "channel (depth)", "position", aspect="auto", vmin=-1, vmax=1)
    return fig


def wavelengths(*, dim: int = 512, preset: str = "vaswani", **_: Any) -> Any:
    """Wavelength of each (sin, cos) pair: a geometric progression from 2 pi upwards."""
    from posenc.families.absolute.sinusoidal import resolve

    omega = resolve(preset).inv_freq(dim)
    fig, ax = new_figure(7, 3.6)
    ax.semilogy(np.arange(len(omega)), 2 * np.pi / omega, marker=".", lw=1)
    ax.axhline(2 * np.pi, color="grey", lw=0.8, ls="--")
    ax.axhline(2 * np.pi * 10000, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength (positions)")
    ax.set_title("wavelength 2 pi / omega_i, omega_i = 10000^(-2i/d)")
    return fig


def shift(*, dim: int = 512, offset: float = 10, preset: str = "vaswani", **_: Any) -> Any:
    """M_k, the exact linear map PE(p) -> PE(p + k): its first 16 x 16 channels."""
    import posenc

    m = posenc.shift_matrix(offset, dim, preset=preset)
    n = min(16, dim)
    fig, ax = new_figure(4.8, 4.2)
    title = f"M_k for k = {offset:g}: 2x2 rotations on the diagonal"
    _image(
        fig,
        ax,
        m[:n, :n],
        title,
        "channel of PE(p)",
        "channel of PE(p + k)",
        cmap="RdBu_r",
        vmin=-1,
        vmax=1,
    )
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
    fig, (left, right) = new_figure(8, 3.6, ncols=2)
    left.scatter(x, y, s=10)
    left.set_xlabel(f"channel {r.column} at p")
    left.set_ylabel(f"channel {r.column} at p + {offset:g}")
    left.set_title(f"one column: R^2 = {r.single_r2:.3f}")
    right.scatter(fit, y, s=10)
    right.set_xlabel(f"fit from channels {r.column} and {r.partner} at p")
    right.set_title(f"the (sin, cos) pair: R^2 = {r.pair_r2:.12f}")
    return fig


def clocks(
    *, dim: int = 512, preset: str = "vaswani", positions: Any = (0, 1, 2, 5, 10, 20), **_: Any
) -> Any:
    """Each (sin, cos) pair as a clock hand on a unit circle: fast hands on the left."""
    import posenc
    from posenc.families.absolute.sinusoidal import resolve

    spec = resolve(preset)
    slots = spec.slots(dim)
    pairs = min(8, slots.n_first, slots.n_second)
    shown = [
        0,
        1,
        2,
        3,
        *np.linspace(4, min(slots.n_first, slots.n_second) - 1, pairs - 4, dtype=int),
    ]
    shown = sorted(set(int(i) for i in shown))[:pairs]
    pos = list(positions)
    table = posenc.sinusoidal(
        np.asarray(pos, dtype=np.float64), dim, preset=preset, dtype="float64"
    )
    omega = spec.inv_freq(dim)
    first, second = slots.indices()
    if spec.order == "cos_sin":
        first, second = second, first
    fig, axes = new_figure(
        1.35 * len(shown) + 1, 1.35 * len(pos) + 0.6, ncols=len(shown), nrows=len(pos)
    )
    axes = np.atleast_2d(axes)
    theta = np.linspace(0, 2 * np.pi, 100)
    for r, p in enumerate(pos):
        for c, j in enumerate(shown):
            ax = axes[r, c]
            s, co = table[r, first[j]], table[r, second[j]]
            ax.plot(np.cos(theta), np.sin(theta), color="0.8", lw=0.8)
            ax.plot([0, co], [0, s], color="C3", lw=2)
            ax.set_xlim(-1.2, 1.2)
            ax.set_ylim(-1.2, 1.2)
            ax.set_aspect("equal")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"pair {j}\nomega={omega[j]:.2g}", fontsize=7)
            if c == 0:
                ax.set_ylabel(f"p = {p}", fontsize=8)
    fig.suptitle("(cos, sin) of each pair: a hand turning omega radians per position")
    return fig


def similarity(*, dim: int = 512, length: int = 50, preset: str = "vaswani", **_: Any) -> Any:
    """Cosine similarity of every pair of positions."""
    import posenc

    t = posenc.sinusoidal(length, dim, preset=preset, dtype="float64")
    unit = t / np.linalg.norm(t, axis=1, keepdims=True)
    fig, ax = new_figure(5, 4.2)
    title = "cos(PE(p), PE(q)): a function of p - q"
    _image(fig, ax, unit @ unit.T, title, "position q", "position p", vmin=-1, vmax=1)
    return fig


def offsets(*, dim: int = 512, length: int = 50, preset: str = "vaswani", **_: Any) -> Any:
    """PE(p) . PE(p + k) against k (the same for every p), and the row norms."""
    import posenc

    t = posenc.sinusoidal(length + 200, dim, preset=preset, dtype="float64")
    ks = np.arange(0, 200)
    dots = np.array([[t[p] @ t[p + k] for k in ks] for p in (0, length // 2, length - 1)])
    fig, (left, right) = new_figure(9, 3.4, ncols=2)
    for row, p in zip(dots, (0, length // 2, length - 1), strict=True):
        left.plot(ks, row, lw=1, label=f"p = {p}")
    left.set_xlabel("offset k")
    left.set_ylabel("PE(p) . PE(p + k)")
    left.legend(fontsize=7)
    left.set_title("dot product depends on k only")
    norms = np.linalg.norm(t[:length], axis=1)
    right.plot(np.arange(length), norms, marker=".")
    right.axhline(math.sqrt(dim / 2), color="grey", ls="--", lw=0.8)
    right.set_ylim(0, math.sqrt(dim / 2) * 1.3)
    right.set_xlabel("position")
    right.set_title(f"norm of every row: sqrt(d/2) = {math.sqrt(dim / 2):.4g}")
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
    ax.set_xlabel("position")
    ax.set_ylabel("max |value - exact| over the row")
    ax.set_title("precision against position")
    ax.legend(fontsize=8)
    return fig


# ------------------------------------------------------------------ learned, RoPE, biases, grids


def learned(*, learned_table: Any = None, dim: int = 32, length: int = 32, **_: Any) -> Any:
    """A learned table next to the sinusoidal one, with their position similarities."""
    import posenc

    if learned_table is None:
        from posenc.integration.analysis import train_learned

        learned_table = train_learned(length=length, dim=dim).table
    sin = posenc.sinusoidal(learned_table.shape[0], learned_table.shape[1], dtype="float64")
    fig, axes = new_figure(9, 6, ncols=2, nrows=2)
    for col, (name, t) in enumerate((("learned", learned_table), ("sinusoidal", sin))):
        axes[0, col].imshow(t, aspect="auto", cmap="viridis", interpolation="nearest")
        axes[0, col].set_title(f"{name} table")
        unit = t / np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12)
        axes[1, col].imshow(unit @ unit.T, cmap="viridis", vmin=-1, vmax=1)
        axes[1, col].set_title(f"{name}: cosine similarity of positions")
    return fig


def decay(*, head_dim: int = 128, base: float = 10000.0, max_distance: int = 2000, **_: Any) -> Any:
    """RoPE's long-term decay: RoFormer's bound on |sum_j e^{i r theta_j}| against distance."""
    from posenc.integration.analysis import rope_decay

    r, bound, mean_abs = rope_decay(head_dim, base, max_distance)
    fig, ax = new_figure(7, 3.6)
    ax.plot(r, bound, lw=1, label="(1/(d/2)) sum_j |S_j| (RoFormer 3.4.3)")
    ax.plot(r, mean_abs, lw=1, label="|mean_j e^{i r theta_j}|")
    ax.set_xlabel("relative distance m - n")
    ax.set_ylabel("relative upper bound")
    ax.set_title(f"RoPE long-term decay, head_dim {head_dim}, base {base:g}")
    ax.legend(fontsize=8)
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
    ax.axhline(original, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("pair index")
    ax.set_ylabel("wavelength (positions)")
    ax.set_title(f"rotary schedules, factor {factor:g}, original length {original}")
    ax.legend(fontsize=8)
    return fig


def alibi(*, heads: int = 8, length: int = 24, **_: Any) -> Any:
    """ALiBi slopes and the causal bias of one head."""
    import posenc

    slopes = posenc.alibi_slopes(heads)
    bias = posenc.ALiBi(heads).bias(length, length).detach().numpy()
    mask = np.triu(np.ones((length, length), dtype=bool), 1)
    fig, (left, right) = new_figure(9, 3.6, ncols=2)
    left.bar(np.arange(1, heads + 1), slopes)
    left.set_yscale("log", base=2)
    left.set_xlabel("head")
    left.set_title("slopes 2^(-8h/n)")
    title = f"head 1 bias -m (i - j), causal, {length} tokens"
    _image(fig, right, np.ma.masked_array(bias[0], mask), title, "key j", "query i")
    return fig


def t5(*, length: int = 200, num_buckets: int = 32, max_distance: int = 128, **_: Any) -> Any:
    """T5's bucket of each relative position (encoder and decoder)."""
    import posenc

    rel = np.arange(-length, length + 1)
    fig, (left, right) = new_figure(9, 3.6, ncols=2)
    for bidirectional in (True, False):
        b = posenc.t5_bucket(
            rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        left.step(rel, b, where="mid", label="encoder" if bidirectional else "decoder")
    left.set_xlabel("relative position key - query")
    left.set_ylabel("bucket")
    left.legend(fontsize=8)
    left.set_title(f"{num_buckets} buckets, max_distance {max_distance}")
    n = 48
    q = np.arange(n)[:, None]
    grid = posenc.t5_bucket(np.arange(n)[None, :] - q)
    _image(fig, right, grid, "encoder bucket of (query, key)", "key", "query")
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
    fig, ax = new_figure(6.5, 6.5 * rows / cols + 0.4)
    ax.imshow(mosaic, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_axis_off()
    ax.set_title(f"{preset} grid {size}x{size}, {dim} channels, one tile per channel")
    return fig


KINDS: dict[str, Callable[..., Any]] = {
    "heatmap": heatmap,
    "wavelengths": wavelengths,
    "shift": shift,
    "regression": regression,
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
}


def figure(kind: str, **options: Any) -> Any:
    """The figure ``kind`` (a key of :data:`KINDS`) with ``options``.

    Raises:
        ValueError: an unknown kind (the valid ones are listed).
    """
    checks.check_choice(kind, "kind", tuple(KINDS))
    return KINDS[kind](**options)
