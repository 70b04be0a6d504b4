"""posenc plot: every figure decodes as a 2x PNG and a text SVG, is labelled, fits, and is honest.

Honest: colour limits are the data's own range (or symmetric about 0), the
clock hands are the table's values and turn the way the title says.
"""

from __future__ import annotations

import base64
import itertools
import math
import re
import struct
import xml.etree.ElementTree as ET

import matplotlib
import matplotlib.image
import numpy as np
import pytest

import posenc
from posenc import plot
from posenc.families.absolute.sinusoidal import resolve
from posenc.integration.analysis.explorer import hand_pairs

SVG = "{http://www.w3.org/2000/svg}"

#: Small settings per kind, so that every figure renders fast (a learned table is not trained).
SMALL = {
    "learned": {"learned_table": np.random.default_rng(0).normal(size=(12, 10))},
    "precision": {"dim": 16, "points": (10.0, 1e4, 1e7)},
    "rope-scaling": {"head_dim": 32},
    "decay": {"head_dim": 32, "max_distance": 300},
    "t5": {"length": 60},
    "grid": {"size": 6, "dim": 16},
    "clocks": {},  # the densest figure (48 panels), at its defaults
}


def small(kind):
    return SMALL.get(kind, {"dim": 16, "length": 8})


def colourbar_axes(fig):
    out = set()
    for ax in fig.axes:
        for artist in (*ax.images, *ax.collections):
            if getattr(artist, "colorbar", None) is not None:
                out.add(artist.colorbar.ax)
    return out


def all_axes(fig):
    """Every Axes of the figure, insets included."""
    found = []
    for ax in fig.axes:
        found.append(ax)
        found.extend(ax.child_axes)
    return found


def check_labels(kind, fig):
    """Every visible panel has x and y labels (or a title when axis-off); colour bars a label."""
    bars = colourbar_axes(fig)
    for ax in all_axes(fig):
        if not ax.get_visible():
            continue
        if ax in bars:
            assert ax.get_ylabel() or ax.get_xlabel(), f"{kind}: unlabelled colour bar"
        elif kind == "clocks":
            continue  # checked in test_clocks_panels_say_what_rows_and_columns_are
        elif not ax.axison:
            assert ax.get_title(), f"{kind}: an axis-off panel must say what it shows"
        else:
            assert ax.get_xlabel() and ax.get_ylabel(), f"{kind}: {ax.get_title()!r}"


def check_fits(kind, fig):
    """Nothing drawn (titles, labels, tick labels, legends) reaches past the figure's edge."""
    box = fig.bbox
    extents = [ax.get_tightbbox() for ax in fig.axes if ax.get_visible()]
    extents += [t.get_window_extent() for t in fig.texts if t.get_text()]
    for sup in (fig._suptitle, fig._supxlabel, fig._supylabel):
        if sup is not None and sup.get_text():
            extents.append(sup.get_window_extent())
    for extent in extents:
        assert extent.x0 >= box.x0 - 1 and extent.x1 <= box.x1 + 1, (kind, extent)
        assert extent.y0 >= box.y0 - 1 and extent.y1 <= box.y1 + 1, (kind, extent)


def check_colours(kind, fig):
    """Each colour scale is its images' data range, or symmetric about 0 for signed data."""
    groups: dict[int, list] = {}
    for ax in fig.axes:
        for im in ax.images:
            groups.setdefault(id(im.norm), []).append(im)
    for images in groups.values():
        values = np.concatenate(
            [np.ma.masked_invalid(im.get_array()).compressed().astype(float) for im in images]
        )
        lo, hi = float(values.min()), float(values.max())
        top = max(abs(lo), abs(hi))
        clim = images[0].get_clim()
        if lo < 0 < hi:  # a sign: symmetric about 0 on a diverging map
            assert clim == (-top, top), kind
            assert images[0].get_cmap().name == "RdBu_r", kind
        else:
            assert clim in ((lo, hi), (-top, top)), kind
        labelled = [im.colorbar for im in images if im.colorbar is not None]
        assert labelled and labelled[0].ax.get_ylabel(), f"{kind}: image without a colour bar"


@pytest.mark.parametrize("kind", list(plot.KINDS))
def test_figure_is_labelled_fits_and_saves(tmp_path, kind):
    fig = plot.figure(kind, **small(kind))
    fig.draw_without_rendering()  # the constrained layout, without pixels
    check_labels(kind, fig)
    check_fits(kind, fig)
    check_colours(kind, fig)
    width_in = fig.get_figwidth()
    plot.save(fig, tmp_path / "f.png")  # closes the figure; it can still be saved
    image = matplotlib.image.imread(tmp_path / "f.png")
    assert image.shape[1] >= 2 * width_in * 110 - 1  # twice the former 110 dpi
    plot.save(fig, tmp_path / "f.svg")
    root = ET.parse(tmp_path / "f.svg").getroot()
    assert root.tag == f"{SVG}svg"
    assert list(root.iter(f"{SVG}text")), "svg.fonttype 'none' keeps text as <text>"
    assert "DejaVuSans-" not in (tmp_path / "f.svg").read_text()  # no glyph outlines
    assert (tmp_path / "f.svg").stat().st_size < 300 * 1024


def test_svg_embeds_images_at_data_resolution(tmp_path):
    plot.save(plot.figure("heatmap", dim=24, length=10), tmp_path / "h.svg")
    text = (tmp_path / "h.svg").read_text()
    sizes = []
    for data in re.findall(r'xlink:href="data:image/png;base64,([^"]+)"', text):
        png = base64.b64decode(data.replace("\n", ""))
        sizes.append(struct.unpack(">II", png[16:24]))
    assert (24, 10) in sizes  # one pixel per table entry, not resampled
    assert "image-rendering:pixelated" in text.replace(" ", "")


def test_fitted_not_fixed_limits():
    # the cosine similarity of sinusoidal rows stays above 0 at d = 512: its own range
    fig = plot.figure("similarity")
    (im,) = fig.axes[0].images
    lo, hi = im.get_clim()
    assert lo > 0 and hi == pytest.approx(1.0)
    plot.pyplot().close(fig)


def test_colour_scale():
    norm, cmap = plot.colour_scale(np.array([-0.2, 0.5]))
    assert (norm.vmin, norm.vmax, cmap) == (-0.5, 0.5, "RdBu_r")
    norm, cmap = plot.colour_scale(np.array([[0.3, np.nan], [0.9, 0.4]]))
    assert (norm.vmin, norm.vmax, cmap) == (0.3, 0.9, "viridis")
    norm, cmap = plot.colour_scale(np.array([0.1, 0.2]), np.array([-1.0]))
    assert (norm.vmin, norm.vmax) == (-1.0, 1.0)


# ------------------------------------------------------------------------------ clocks


def hands(fig):
    """``{(p, i): (x, y)}`` of the drawn hands and of the trail dots."""
    out: dict[str, dict] = {"hand": {}, "trail": {}}
    for ax in fig.axes:
        for line in ax.lines:
            m = re.fullmatch(r"(hand|trail)-p(-?[\d.e+]+)-i(\d+)", line.get_gid() or "")
            if m:
                x, y = line.get_xdata()[-1], line.get_ydata()[-1]
                out[m.group(1)][(float(m.group(2)), int(m.group(3)))] = (x, y)
    return out


@pytest.mark.parametrize(
    ("preset", "dim"),
    [("vaswani", 512), ("ldm", 512), ("tensor2tensor", 22), ("x-transformers", 22)],
)  # sin_cos and cos_sin orders, interleaved and half layouts, an amplitude, h - 1
def test_clock_hands_are_the_table_and_turn_counter_clockwise(preset, dim):
    positions = (0, 1, 2, 5, 10, 20)
    fig = plot.figure("clocks", dim=dim, preset=preset, positions=positions)
    drawn_hands = hands(fig)
    plot.pyplot().close(fig)
    spec = resolve(preset)
    slots = spec.slots(dim)
    shown = hand_pairs(slots.n_second, 8)
    assert shown[0] == 0 and shown[-1] == slots.n_second - 1
    assert {i for _, i in drawn_hands["hand"]} == set(shown)
    omega = spec.inv_freq(dim)
    amp = spec.amplitude_for(dim)
    table = posenc.sinusoidal(np.arange(21.0), dim, preset=preset, dtype="float64")
    first, second = slots.indices()
    for kind in ("hand", "trail"):
        for (p, i), (x, y) in drawn_hands[kind].items():
            angle = omega[i] * (p + spec.offset)
            # the textbook hand (cos, sin), independent of the preset's channel order
            assert (x, y) == pytest.approx((math.cos(angle), math.sin(angle)), abs=1e-12)
            # and the two channels of the pair in posenc's table, in some order
            pair = sorted([table[int(p), first[i]] / amp, table[int(p), second[i]] / amp])
            assert sorted([x, y]) == pytest.approx(pair, abs=1e-12)
    assert drawn_hands["trail"]
    # counter-clockwise: a positive cross product between consecutive hands of slow pairs
    for i in shown:
        for p, q in itertools.pairwise(positions):
            if omega[i] * (q - p) >= math.pi:
                continue  # a fast hand may turn more than half a circle between rows
            (x0, y0), (x1, y1) = drawn_hands["hand"][(p, i)], drawn_hands["hand"][(q, i)]
            assert x0 * y1 - y0 * x1 > 0, (preset, i, p, q)


def test_clocks_panels_say_what_rows_and_columns_are():
    fig = plot.figure("clocks")
    grid = np.array(fig.axes).reshape(6, -1)
    titles = [ax.get_title() for ax in grid[0]]
    picked = [int(re.search(r"pair i = (\d+)", t).group(1)) for t in titles]
    assert picked == [0, 1, 4, 10, 23, 52, 115, 255]
    omega = resolve("vaswani").inv_freq(512)
    for t, i in zip(titles, picked, strict=True):
        wavelength = float(re.search(r"λ = ([\d.,]+)", t).group(1).replace(",", ""))
        assert wavelength == pytest.approx(2 * np.pi / omega[i], rel=5e-3)
    assert [ax.get_ylabel() for ax in grid[:, 0]] == [f"p = {p}" for p in (0, 1, 2, 5, 10, 20)]
    assert "counter-clockwise" in fig._suptitle.get_text()
    assert "columns" in fig._supxlabel.get_text() and "rows" in fig._supylabel.get_text()
    plot.pyplot().close(fig)


# ------------------------------------------------------------------------------ other figures


def test_rope_scaling_marks_the_trained_length():
    fig = plot.figure("rope-scaling", head_dim=32, original=4096)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel()
    labels = [line.get_label() for line in ax.lines]
    assert any("original" in label and "4096" in label for label in labels)
    marked = [line for line in ax.lines if "original" in line.get_label()]
    assert marked[0].get_ydata()[0] == 4096
    plot.pyplot().close(fig)


def test_permutation_figure_shows_the_measured_outputs():
    from posenc import analysis

    r = analysis.permutation_check(12, 5, 3)
    fig = plot.figure("permutation", dim=12, tokens=5, seed=3)
    images = [im.get_array() for ax in fig.axes for im in ax.images]
    assert len(images) == 6
    np.testing.assert_array_equal(images[0], r.output)
    np.testing.assert_array_equal(images[1], r.permuted_output)
    np.testing.assert_array_equal(images[3], r.positioned_output)
    assert np.abs(images[2]).max() == r.max_difference
    assert np.abs(images[5]).max() == r.with_positions
    plot.pyplot().close(fig)


def test_add_concat_figure_draws_circles_around_the_tokens():
    from posenc import analysis

    a = analysis.add_concat(64, 20)
    fig = plot.figure("add-concat", dim=64, length=20)
    scaled, unscaled, _ = fig.axes[:3]
    for ax, points in ((scaled, a.scaled_points), (unscaled, a.unscaled_points)):
        drawn_points = np.concatenate([c.get_offsets() for c in ax.collections])
        np.testing.assert_array_equal(drawn_points, points.reshape(-1, 2))
        assert ax.get_xlim() == ax.get_ylim()  # the same scale in both panels, round circles
    assert scaled.get_xlim() == unscaled.get_xlim()
    plot.pyplot().close(fig)
