"""The lab's outputs: accuracy or perplexity against length, as a figure and an HTML page.

The figure has one line per encoding, the mean over seeds, with the spread
(minimum to maximum over seeds) shaded, and the trained lengths marked. The
page (``out/index.html``) embeds the figure and a table of in-length and
beyond-length means; :func:`section` is the same content as an HTML fragment
that ``posenc report --lab DIR`` embeds.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.faces.files import atomic_write

__all__ = ["figure", "section", "summary", "write"]


def _by_encoding(records: Sequence[Any]) -> dict[str, dict[int, list[float]]]:
    out: dict[str, dict[int, list[float]]] = {}
    for r in records:
        out.setdefault(r.encoding, {}).setdefault(r.length, []).append(r.value)
    return out


def summary(records: Sequence[Any], train_len: int) -> list[dict[str, Any]]:
    """Per encoding: mean and spread over seeds of the metric within and beyond ``train_len``.

    Each seed's values are averaged over the lengths of a range first; the
    row holds the mean of those per-seed averages and their minimum and maximum.
    """
    rows = []
    for encoding in dict.fromkeys(r.encoding for r in records):
        mine = [r for r in records if r.encoding == encoding]
        row: dict[str, Any] = {"encoding": encoding, "metric": mine[0].metric}
        for name, keep in (
            ("within", lambda n: n <= train_len),
            ("beyond", lambda n: n > train_len),
        ):
            seeds: dict[int, list[float]] = {}
            for r in mine:
                if keep(r.length):
                    seeds.setdefault(r.seed, []).append(r.value)
            per_seed = [float(np.mean(v)) for v in seeds.values()]
            if per_seed:
                row[name] = (float(np.mean(per_seed)), min(per_seed), max(per_seed))
        rows.append(row)
    return rows


def figure(records: Sequence[Any], train_len: int, title: str = "") -> Any:
    """Metric against length per encoding: mean over seeds, min-max band, trained range marked."""
    from posenc.faces.plot import new_figure

    fig, ax = new_figure(8, 4.5)
    metric = records[0].metric if records else "accuracy"
    for i, (encoding, by_len) in enumerate(_by_encoding(records).items()):
        lengths = sorted(by_len)
        vals = [by_len[n] for n in lengths]
        mean = [float(np.mean(v)) for v in vals]
        colour = f"C{i % 10}"
        ax.plot(lengths, mean, label=encoding, color=colour, lw=1.6)
        ax.fill_between(lengths, [min(v) for v in vals], [max(v) for v in vals],
                        color=colour, alpha=0.15, lw=0)  # fmt: skip
    ax.axvspan(0.5 if metric == "accuracy" else 0, train_len + 0.5, color="0.9", zorder=-1,
               label="trained lengths")  # fmt: skip
    ax.set_xlabel("length")
    if metric == "perplexity":
        ax.set_yscale("log")
        ax.set_ylabel("perplexity (bytes)")
    else:
        ax.set_ylabel("exact-match accuracy")
        ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=2)
    return fig


def section(records: Sequence[Any], config: Any, svg: bytes | None = None) -> str:
    """The lab's results as an HTML ``<section id="lab-TASK">`` (SVG figure, summary table)."""
    if svg is None:
        from posenc.faces.plot import encode, pyplot

        fig = figure(records, config.train_len, _title(config))
        svg = encode(fig, "svg")
        pyplot().close(fig)
    data = base64.b64encode(svg).decode()
    rows = summary(records, config.train_len)
    cells = []
    for row in rows:

        def fmt(key: str, row: dict[str, Any] = row) -> str:
            if key not in row:
                return "-"
            mean, lo, hi = row[key]
            return f"{mean:.3g} ({lo:.3g}-{hi:.3g})"

        cells.append(f"<tr><td>{html.escape(row['encoding'])}</td><td>{fmt('within')}</td>"
                     f"<td>{fmt('beyond')}</td></tr>")  # fmt: skip
    metric = rows[0]["metric"] if rows else "accuracy"
    return "\n".join([
        f'<section id="lab-{html.escape(config.task)}" class="lab">'
        f"<h3>{html.escape(_title(config))}</h3>",
        f"<p>{html.escape(_caption(config))}</p>",
        f'<img src="data:image/svg+xml;base64,{data}" alt="lab results: {config.task}">',
        f"<table><tr><th>encoding</th><th>{metric}, lengths 1-{config.train_len} "
        f"(seed min-max)</th><th>{metric}, lengths {config.train_len + 1}-{config.test_len}"
        "</th></tr>",
        *cells,
        "</table></section>",
    ])  # fmt: skip


def _title(config: Any) -> str:
    return (f"posenc lab: {config.task}, trained to length {config.train_len}, "
            f"tested to {config.test_len}")  # fmt: skip


def _caption(config: Any) -> str:
    return (
        f"{config.seeds} seeds per encoding; {config.steps} steps of batch {config.batch_size}; "
        f"a {config.layers}-layer, {config.heads}-head transformer of width {config.d_model}; "
        f"{config.eval_examples} examples per length. Lines: mean over seeds; bands: min-max."
    )


def write(out: str | Path, records: Sequence[Any], config: Any) -> dict[str, Path]:
    """Write ``out/results.png``, ``out/results.svg`` and ``out/index.html``; return the paths."""
    from posenc.faces.plot import encode, pyplot

    out = Path(out)
    fig = figure(records, config.train_len, _title(config))
    svg = encode(fig, "svg")
    with atomic_write(out / "results.svg") as f:
        f.write(svg)
    png = encode(fig, "png")
    pyplot().close(fig)
    with atomic_write(out / "results.png") as f:
        f.write(png)
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(_title(config))}</title></head><body>"
        f"{section(records, config, svg)}</body></html>"
    )
    with atomic_write(out / "index.html", "w") as f:
        f.write(page)
    return {"png": out / "results.png", "svg": out / "results.svg", "html": out / "index.html"}
