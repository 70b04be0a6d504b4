"""``posenc report``: positional encodings explained with figures and numbers measured on the spot.

:func:`build` computes every section (its numbers with :mod:`posenc.analysis`,
its figures with :mod:`posenc.plot`), writes each figure as PNG and
SVG under ``out/figures/`` and one self-contained ``out/index.html`` (figures
embedded as data URIs, no network). Nothing in the HTML is asserted that was
not measured in the same run; the text says what each number is.

Sections: the table (heatmap); frequencies and why ``exp``/``log``; the shift
operator and the one-column regression; clock hands; geometry (norms, dot
products against offset, similarity, nearest distinct position, adding versus
concatenating); precision against position; learned versus sinusoidal (a
tiny training run); RoPE (relative scores, long-term decay, scaling
schedules); ALiBi and T5 biases; 2-D grids.
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posenc.core import checks
from posenc.faces.files import atomic_write
from posenc.families.absolute.sinusoidal import PRESETS, resolve
from posenc.integration import analysis

__all__ = ["Report", "Section", "build", "rope_settings"]


@dataclass
class Section:
    """One section: a title, what it answers, measured numbers, and figure names."""

    key: str
    title: str
    text: str
    numbers: list[tuple[str, str]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)


@dataclass
class Report:
    """What :func:`build` wrote: the sections, the HTML file and the figure files."""

    sections: list[Section]
    index: Path
    figures: dict[str, tuple[Path, Path]]
    seconds: float


def _fmt(x: float, digits: int = 3) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def _sections(
    dim: int,
    length: int,
    preset: str,
    rope: dict[str, Any],
    learned: analysis.Learned,
) -> list[Section]:
    import posenc

    sections: list[Section] = []
    spec = resolve(preset)
    omega = spec.inv_freq(dim)
    table = posenc.sinusoidal(length, dim, preset=preset, dtype="float64")

    sections.append(
        Section(
            "heatmap",
            "The table",
            f"Each row is a position, each column a channel of the {preset} encoding: "
            "pairs of sines and cosines whose frequency falls from left to right. The "
            "fast channels on the left change at every position; the slow ones on the "
            "right barely move over these positions.",
            [
                ("shape (positions x channels)", f"{length} x {dim}"),
                ("smallest and largest value", f"{table.min():.4f}, {table.max():.4f}"),
                (
                    "columns that change by < 0.01 over all rows",
                    str(int((np.ptp(table, axis=0) < 0.01).sum())),
                ),
            ],
            ["heatmap"],
        )
    )

    forms = analysis.exp_log_forms(dim)
    wl = 2 * np.pi / omega
    sections.append(
        Section(
            "frequencies",
            "Frequencies, wavelengths, and why exp and log",
            "The frequencies form a geometric progression, so the wavelengths run from "
            "2 pi to about 10000 * 2 pi positions. Code writes 1/10000^(2i/d) either as a "
            "power or, following tensor2tensor, as exp(2i * -ln(10000)/d): the same "
            "function. The log form needs one exp per channel instead of a power; "
            "the numbers below measure both forms' error against 40-digit mpmath and "
            "their speed (microseconds per call, this machine).",
            [
                ("shortest and longest wavelength", f"{wl.min():.4f}, {wl.max():.5g}"),
                ("ratio of neighbouring frequencies", f"{omega[1] / omega[0]:.6f}"),
            ]
            + [
                (f"{name}: max relative error, time", f"{_fmt(err)}, {t * 1e6:.2f} us")
                for name, (err, t) in forms.items()
            ],
            ["wavelengths"],
        )
    )

    sh = analysis.shift_error(dim, length, (1, 10, 100), preset=preset)
    reg = analysis.regression_r2(dim, length, 10, preset=preset)
    sections.append(
        Section(
            "shift",
            "PE(p + k) is a linear function of PE(p)",
            "For each offset k there is one matrix M_k, block-diagonal with 2x2 "
            "rotations by k * omega_i, such that PE(p + k) = M_k PE(p) for every p. A "
            "regression of one column at p + k on the same column at p fails, because "
            "a sine shifted is a mix of the sine and the cosine: with the (sin, cos) "
            "pair as regressors the fit is exact.",
            [
                (f"max |PE(p+{k:g}) - M_k PE(p)| over all p", _fmt(e))
                for k, e in zip(sh.offsets, sh.max_error, strict=True)
            ]
            + [
                (f"R^2, channel {reg.column} at p+10 from itself", f"{reg.single_r2:.4f}"),
                ("R^2 from its (sin, cos) pair", f"{reg.pair_r2:.15f}"),
            ],
            ["shift", "regression"],
        )
    )

    sections.append(
        Section(
            "clocks",
            "Clock hands",
            "Each (sin, cos) pair is the tip of a hand on a unit circle that turns by "
            "omega_i radians per position: the first hands spin fast, the last ones "
            "hardly move. A position is the reading of all the hands together.",
            [
                ("fastest hand (radians per position)", f"{omega[0]:.4g}"),
                ("slowest hand (radians per position)", f"{omega[-1]:.4g}"),
                ("positions for the slowest hand to turn once", f"{2 * np.pi / omega[-1]:.4g}"),
            ],
            ["clocks"],
        )
    )

    norms = analysis.norms(dim, length, preset=preset)
    dots = analysis.offset_dot_products(dim, length, (1, 10, 100), preset=preset)
    geo = analysis.geometry(dim, length, preset)
    sections.append(
        Section(
            "geometry",
            "Geometry: norms, dot products, distinguishable positions",
            "Every pair lies on a unit circle, so every row has norm sqrt(d/2). The dot "
            "product of two rows depends only on their offset, and all positions are "
            "told apart: the nearest two distinct rows are far from each other compared "
            "with float32 rounding. Added to a token embedding, a position can still be "
            "read back (the best-matching row) while the token's entries are small; "
            "concatenated, it is kept apart and always recoverable, at the cost of "
            "channels.",
            [
                (
                    "row norms min / max / sqrt(d/2)",
                    f"{norms.min:.12g} / {norms.max:.12g} / {math.sqrt(dim / 2):.12g}",
                )
            ]
            + [
                (f"PE(p).PE(p+{k:g}): value, spread over p", f"{cf:.6g}, {_fmt(sp)}")
                for k, cf, sp in zip(dots.offsets, dots.closed_form, dots.spread, strict=True)
            ]
            + [
                (
                    f"nearest distinct rows in the first {length}",
                    f"{geo['first'][0]:.4f} (positions {geo['first'][1]}, {geo['first'][2]})",
                ),
                (
                    "nearest distinct rows in the first 2000",
                    f"{geo['2000'][0]:.4f} (positions {geo['2000'][1]}, {geo['2000'][2]})",
                ),
                ("all 2000 float32 rows distinct", str(geo["float32 distinct"])),
            ]
            + [
                (
                    f"position read back after adding a token, entries of std {s:g}",
                    f"{100 * a:.1f}%",
                )
                for s, a in geo["recovery"].items()
            ]
            + [("position read back when concatenated", "100% (its own channels)")],
            ["offsets", "similarity"],
        )
    )

    curves = analysis.precision_curves(dim, preset)
    sections.append(
        Section(
            "precision",
            "Precision against position",
            "The usual formula multiplies a float32 position by float32 frequencies: the "
            "angle's rounding error grows with the position, and so does the value's. "
            "Under autocast the position itself becomes bfloat16 and nearby positions "
            "collapse. posenc computes the angle exactly and rounds the result once.",
            [
                (
                    f"at position {p:.0e}: posenc / naive float32 / naive bfloat16",
                    f"{_fmt(a)} / {_fmt(b)} / {_fmt(c)}",
                )
                for p, a, b, c in zip(
                    curves["position"],
                    curves["posenc float32"],
                    curves["naive float32"],
                    curves["naive bfloat16"],
                    strict=True,
                )
            ],
            ["precision"],
        )
    )

    lt = learned.table
    near, far_sim = learned.similarity(apart=8)
    sections.append(
        Section(
            "learned",
            "Learned versus sinusoidal",
            f"A learned table ({lt.shape[0]} positions x {lt.shape[1]} channels) trained "
            f"from random initialisation for {learned.steps} steps on a task that needs "
            "positions (copy the previous token, one causal attention layer). It learns "
            "only the positions it sees and has no rule for the ones beyond; the "
            "sinusoidal table is a fixed function of any position. A tiny run: the "
            "learned table's structure is what this task needed, not what a language "
            "model learns.",
            [
                ("copy accuracy after training", f"{100 * learned.accuracy:.1f}%"),
                ("training time", f"{learned.seconds:.1f} s"),
                ("learned: mean cosine of neighbouring positions", f"{near:.3f}"),
                ("learned: mean cosine of positions > 8 apart", f"{far_sim:.3f}"),
            ],
            ["learned"],
        )
    )

    rel = analysis.rope_relative()
    _, bound, _ = analysis.rope_decay(rope["head_dim"], rope["base"], 2000)
    sc = analysis.scaling_curves(rope["head_dim"], rope["base"], rope["factor"], rope["original"])
    longest = {name: 2 * np.pi / w.min() for name, w in sc.items()}
    sections.append(
        Section(
            "rope",
            "RoPE: scores depend on m - n only",
            "RoPE rotates q and k by their own positions; their dot product then depends "
            "only on the offset m - n (measured below as the spread of q_m . k_n over m "
            "for each fixed offset, with the same q and k at every position). The bound "
            "on |q . k| decays with distance (RoFormer, section 3.4.3). Scaling schedules "
            "stretch the wavelengths to reach beyond the pretraining length, each "
            "differently.",
            [
                ("spread of q_m.k_n at fixed m-n, float64", _fmt(rel["float64"])),
                (
                    "same in float32 (scale of the products)",
                    f"{_fmt(rel['float32'])} ({rel['scale']:.3g})",
                ),
                (
                    "decay bound at distance 100 / 1000 (relative to 0)",
                    f"{bound[100]:.3f} / {bound[1000]:.3f}",
                ),
            ]
            + [
                (f"{name}: longest wavelength (positions)", f"{w:.4g}")
                for name, w in longest.items()
            ],
            ["decay", "rope-scaling"],
        )
    )

    slopes = posenc.alibi_slopes(8)
    boundaries = posenc.t5_bucket(-np.arange(200))
    starts = [int(d) for d in np.arange(1, 200)[np.diff(boundaries) != 0]]
    sections.append(
        Section(
            "biases",
            "ALiBi and T5: positions as a bias on the scores",
            "ALiBi adds -m (i - j) to the score of query i and key j, with a fixed slope "
            "m per head; T5 adds a learned value per head for each bucket of the "
            "relative position, exact for small distances and logarithmic beyond.",
            [
                ("ALiBi slopes, 8 heads", ", ".join(f"2^{math.log2(s):g}" for s in slopes)),
                ("T5 bucket starts (bidirectional, 32/128)", ", ".join(map(str, starts))),
            ],
            ["alibi", "t5"],
        )
    )

    g = posenc.grid((14, 14), 64, preset="mae", dtype="float64")
    sections.append(
        Section(
            "grid",
            "2-D grids: positions of image patches",
            "A ViT's patches get a 2-D encoding: half the channels encode the row, half "
            "the column (MAE's layout), each a 1-D sinusoidal encoding. Shown: a 14x14 "
            "grid of 64 channels, one tile per channel.",
            [
                ("grid rows x channels", f"{g.shape[0]} x {g.shape[1]}"),
                (
                    "channels that vary along rows only / columns only",
                    f"{int((np.ptp(g.reshape(14, 14, 64), axis=1).max(0) < 1e-12).sum())} / "
                    f"{int((np.ptp(g.reshape(14, 14, 64), axis=0).max(0) < 1e-12).sum())}",
                ),
            ],
            ["grid"],
        )
    )
    return sections


def _figure_options(
    dim: int, length: int, preset: str, rope: dict[str, Any], learned: analysis.Learned
) -> dict[str, dict[str, Any]]:
    base = {"dim": dim, "length": length, "preset": preset}
    return {
        "heatmap": base,
        "wavelengths": base,
        "shift": {**base, "offset": 10},
        "regression": {**base, "offset": 10},
        "clocks": base,
        "offsets": base,
        "similarity": base,
        "precision": base,
        "learned": {"learned_table": learned.table},
        "decay": {"head_dim": rope["head_dim"], "base": rope["base"]},
        "rope-scaling": {
            "head_dim": rope["head_dim"],
            "base": rope["base"],
            "factor": rope["factor"],
            "original": rope["original"],
        },
        "alibi": {},
        "t5": {},
        "grid": {},
    }


def rope_settings(config: str | Path | None) -> dict[str, Any]:
    """head_dim, base, factor and original length for the RoPE section.

    Llama-3.1's values by default; with a ``config.json`` path, that model's
    (read by :func:`posenc.hf.rope_spec`), its factor defaulting to 8.
    """
    if config is None:
        return {
            "head_dim": 128,
            "base": 500000.0,
            "factor": 8.0,
            "original": 8192,
            "name": "Llama-3.1-like (head_dim 128, theta 500000)",
        }
    from posenc.integration.hf import rope_spec

    path = Path(config)
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"--rope-config: cannot read {str(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--rope-config: {str(path)!r} is not JSON: {exc.msg}") from None
    spec = rope_spec(raw)
    factor = float(spec.params.get("factor", 8.0))
    original = spec.original_max_position_embeddings or spec.max_position_embeddings or 4096
    return {
        "head_dim": spec.rotary_dim,
        "base": spec.base,
        "factor": factor,
        "original": int(original),
        "name": path.name,
    }


def _lab_section(directory: Path) -> str:
    """The results of a ``posenc lab run`` directory as a report section."""
    from posenc.faces.lab import results
    from posenc.faces.lab.run import LabConfig, Record

    try:
        doc = json.loads((directory / "results.json").read_text())
    except OSError as exc:
        raise ValueError(f"--lab: cannot read {str(directory / 'results.json')!r}: "
                         f"{exc.strerror}") from None  # fmt: skip
    config = LabConfig(**{**doc["config"], "encodings": tuple(doc["config"]["encodings"])})
    return results.section([Record(**r) for r in doc["records"]], config)


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(path.stem)}">'


_CSS = """
body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.7em}h2{margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.8em 0}td{padding:.2em .8em;border-bottom:1px solid #eee}
td:last-child{font-family:ui-monospace,monospace}img{max-width:100%;display:block;margin:1em 0}
nav a{margin-right:.8em}
"""


def _html(sections: Sequence[Section], pngs: dict[str, Path], title: str, note: str) -> str:
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p>{html.escape(note)}</p><nav>",
        *(f'<a href="#{s.key}">{html.escape(s.title)}</a>' for s in sections),
        "</nav>",
    ]
    for s in sections:
        parts.append(f'<section id="{s.key}"><h2>{html.escape(s.title)}</h2>')
        parts.append(f"<p>{html.escape(s.text)}</p><table>")
        parts += [
            f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in s.numbers
        ]
        parts.append("</table>")
        parts += [_img(pngs[f]) for f in s.figures]
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def build(
    out: str | Path = "posenc-report",
    *,
    dim: int = 512,
    length: int = 50,
    preset: str = "vaswani",
    rope_config: str | Path | None = None,
    train_steps: int = 300,
    lab: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Compute every section and write ``out/index.html`` and ``out/figures/*.{png,svg}``.

    Args:
        out: output directory (created).
        dim: channels of the sinusoidal table (>= 4, even).
        length: positions (>= 3).
        preset: a sinusoidal preset name (``posenc presets``).
        rope_config: a model's ``config.json`` for the RoPE scaling section.
        train_steps: steps of the learned-table training run.
        lab: a ``posenc lab run`` output directory whose results to include.
        progress: called with a short message as each part starts.

    Raises:
        ValueError: bad sizes, an unknown preset, an unreadable config, or an
            output directory that cannot be written.
    """
    from posenc.faces import plot

    start = time.perf_counter()
    dim = checks.check_int(dim, "dim", minimum=4)
    if dim % 2:
        raise ValueError(f"dim must be even (pairs of sin and cos); got {dim}")
    length = checks.check_int(length, "length", minimum=3)
    checks.check_choice(preset, "preset", tuple(PRESETS))
    train_steps = checks.check_int(train_steps, "train_steps", minimum=1)
    rope = rope_settings(rope_config)
    out = Path(out)
    figures_dir = out / "figures"
    try:
        figures_dir.mkdir(parents=True, exist_ok=True)
        probe = out / ".posenc-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"cannot write to {str(out)!r}: {exc.strerror}") from None

    say = progress or (lambda _: None)
    say("training a learned table")
    learned = analysis.train_learned(steps=train_steps)
    say("measuring")
    sections = _sections(dim, length, preset, rope, learned)
    options = _figure_options(dim, length, preset, rope, learned)
    files: dict[str, tuple[Path, Path]] = {}
    for s in sections:
        for name in s.figures:
            say(f"figure {name}")
            fig = plot.figure(name, **options[name])
            png, svg = figures_dir / f"{name}.png", figures_dir / f"{name}.svg"
            with atomic_write(svg) as f:
                fig.savefig(f, format="svg")
            plot.save(fig, png)
            files[name] = (png, svg)
    note = (
        f"Measured by posenc on this machine: {preset} preset, d = {dim}, {length} "
        f"positions; RoPE section for {rope['name']}."
    )
    index = out / "index.html"
    page = _html(sections, {k: v[0] for k, v in files.items()}, "posenc report", note)
    if lab is not None:
        page = page.replace("</body></html>", _lab_section(Path(lab)) + "\n</body></html>")
    with atomic_write(index, "w") as f:
        f.write(page)
    return Report(sections, index, files, time.perf_counter() - start)
