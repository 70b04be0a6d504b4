"""The lab's outputs: accuracy or perplexity against length, as a figure and an HTML page.

The figure has one line per encoding, the mean over seeds, with the spread
(minimum to maximum over seeds) shaded, and the trained lengths marked. The
page (``out/index.html``) embeds the figure, a table of in-length and
beyond-length means and a table of the position probes per layer;
:func:`section` is the same content as an HTML fragment that ``posenc report
--lab DIR`` embeds.

Reading a run back: :func:`read` turns a ``results.json`` document into
:class:`LabResults` (config, records, probes, bias parameters; files written
before the probes existed read with empty lists), :func:`bundled` reads the
runs bundled with posenc, and :func:`bias_module` rebuilds a trained
attention-bias module from its :class:`BiasParameters`.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from posenc.core.files import atomic_write

if TYPE_CHECKING:
    from posenc.faces.lab.probes import Probe
    from posenc.faces.lab.training import LabConfig, Record
    from posenc.families.bias.modules import AttentionBias

#: The runs bundled with posenc (``posenc/faces/data``), the ``results.json`` of each:
#: ``posenc lab run --encodings alibi,t5,rope,sinusoidal,learned,nope,hybrid-nope,pope,
#: dual-chunk`` (the default run's encodings, PoPE and Dual Chunk Attention), ``posenc lab
#: run --task text --encodings alibi,sinusoidal,rope,pope,dual-chunk`` and ``posenc lab run
#: --task flipflop --encodings path,path-fox,fox,rope,nope``.
BUNDLED = ("lab-copy.json", "lab-text.json", "lab-flipflop.json")


# ------------------------------------------------------------------ reading a run back


@dataclass(frozen=True)
class BiasParameters:
    """A trained attention-bias module's state: one entry of ``results.json``'s
    ``"bias_parameters"``.

    Attributes:
        encoding: the trained encoding (``t5``, ``kerple``, ``fire``, ``sandwich``,
            ``alibi``: every encoding with a bias module).
        seed: the model's seed.
        parameters: the module's ``state_dict``, each tensor as nested lists of
            floats (a float for a 0-d one); ``{}`` for ALiBi and Sandwich, whose
            slopes and tables follow from the sizes and are not saved.
    """

    encoding: str
    seed: int
    parameters: dict[str, Any]


@dataclass(frozen=True)
class LabResults:
    """A ``posenc lab run``'s ``results.json``, read back by :func:`read`.

    Attributes:
        config: the run's :class:`~posenc.lab.training.LabConfig`.
        records: its :class:`~posenc.lab.training.Record` list (accuracy or perplexity
            per encoding, seed and length).
        probes: its :class:`~posenc.lab.probes.Probe` list (per trained encoding,
            seed, layer and metric); empty for a run from before the probes.
        bias_parameters: a :class:`BiasParameters` per trained model with an
            attention-bias module; empty for a run from before they were saved.
    """

    config: LabConfig
    records: list[Record]
    probes: list[Probe] = field(default_factory=list)
    bias_parameters: list[BiasParameters] = field(default_factory=list)


def read(doc: dict[str, Any]) -> LabResults:
    """The :class:`LabResults` of a ``results.json`` document (its parsed JSON).

    ``doc`` holds ``"config"`` (the :class:`~posenc.lab.training.LabConfig` fields) and
    ``"records"`` (:class:`~posenc.lab.training.Record` fields each), and, since the
    probes, ``"probes"`` (:class:`~posenc.lab.probes.Probe` fields each) and
    ``"bias_parameters"`` (``{"encoding", "seed", "parameters"}`` each); a
    document without the last two reads with empty lists.

    Raises:
        TypeError: ``doc`` not a dict, or an entry not a dict.
        ValueError: ``doc`` without ``"config"`` or ``"records"``, or an entry
            whose fields are not those of its kind (the message names which).
    """
    from posenc.faces.lab.probes import Probe
    from posenc.faces.lab.training import LabConfig, Record

    if not isinstance(doc, dict):
        raise TypeError(f"doc must be a dict (a parsed results.json); got {type(doc).__name__}")
    for key in ("config", "records"):
        if key not in doc:
            raise ValueError(f"doc must hold {key!r} (a results.json of posenc lab run)")

    def build(kind: Any, entry: Any, where: str) -> Any:
        if not isinstance(entry, dict):
            raise TypeError(f"doc[{where}] must be a dict; got {type(entry).__name__}")
        try:
            return kind(**entry)
        except TypeError as exc:
            raise ValueError(f"doc[{where}] is not a {kind.__name__}: {exc}") from None

    settings = doc["config"]
    if isinstance(settings, dict) and "encodings" in settings:
        settings = {**settings, "encodings": tuple(settings["encodings"])}
    return LabResults(
        config=build(LabConfig, settings, "'config'"),
        records=[build(Record, r, f"'records'][{i}") for i, r in enumerate(doc["records"])],
        probes=[build(Probe, p, f"'probes'][{i}") for i, p in enumerate(doc.get("probes", []))],
        bias_parameters=[
            build(BiasParameters, b, f"'bias_parameters'][{i}")
            for i, b in enumerate(doc.get("bias_parameters", []))
        ],
    )


def bundled() -> list[LabResults]:
    """The runs bundled with posenc (:data:`BUNDLED`, in that order: copy, text, flipflop), read."""
    where = resources.files("posenc.faces") / "data"
    return [read(json.loads((where / name).read_text())) for name in BUNDLED]


def bias_module(entry: BiasParameters, config: LabConfig) -> AttentionBias:
    """The trained attention-bias module of ``entry``, rebuilt for the sizes of ``config``.

    ``lookup(entry.encoding).bias(config.heads, config.d_model // config.heads)``
    with ``entry.parameters`` loaded (strictly: every name of the module's state
    dict, nothing else), in the module's own dtypes: the very bias of the trained
    model (float32 values survive JSON exactly).

    Raises:
        TypeError: ``entry`` not a :class:`BiasParameters`.
        ValueError: an encoding without a bias module, or parameters that are
            not the module's (names or shapes).
    """
    import torch

    from posenc.faces.lab.encodings import lookup

    if not isinstance(entry, BiasParameters):
        raise TypeError(f"entry must be a BiasParameters; got {type(entry).__name__}")
    factory = lookup(entry.encoding).bias
    if factory is None:
        raise ValueError(f"entry: encoding {entry.encoding!r} has no attention-bias module")
    module = factory(config.heads, config.d_model // config.heads)
    own = module.state_dict()
    if set(entry.parameters) != set(own):
        raise ValueError(
            f"entry: parameters {sorted(entry.parameters)} are not those of "
            f"{entry.encoding}'s module, {sorted(own)}"
        )
    state = {name: torch.tensor(v, dtype=own[name].dtype) for name, v in entry.parameters.items()}
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"entry: parameters do not fit {entry.encoding}'s module: {exc}") from None
    return module


# ------------------------------------------------------------------ summaries and pages


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


def probe_summary(probes: Sequence[Any]) -> list[dict[str, Any]]:
    """Per encoding and metric: each layer's mean and spread over seeds, and the positions.

    Rows in the order the encodings first appear, accuracy before R^2:
    ``{"encoding", "metric", "positions", "layers": {layer: (mean, min, max)}}``
    (chance accuracy is ``1 / positions``).
    """
    values: dict[tuple[str, str], dict[int, list[float]]] = {}
    positions: dict[tuple[str, str], int] = {}
    for p in probes:
        values.setdefault((p.encoding, p.metric), {}).setdefault(p.layer, []).append(p.value)
        positions[p.encoding, p.metric] = p.positions
    order = {"accuracy": 0, "r2": 1}
    encodings = list(dict.fromkeys(p.encoding for p in probes))
    keys = sorted(values, key=lambda k: (encodings.index(k[0]), order.get(k[1], 2), k[1]))
    return [
        {
            "encoding": encoding, "metric": metric, "positions": positions[encoding, metric],
            "layers": {
                layer: (float(np.mean(v)), min(v), max(v))
                for layer, v in sorted(values[encoding, metric].items())
            },
        }
        for encoding, metric in keys
    ]  # fmt: skip


def _probe_table(probes: Sequence[Any]) -> list[str]:
    """The probes as an HTML table: a row per encoding and metric, a column per layer."""
    rows = probe_summary(probes)
    if not rows:
        return []
    layers = sorted({layer for row in rows for layer in row["layers"]})
    head = "".join(
        f"<th>layer {layer}{' (embedding)' if layer == 0 else ''}</th>" for layer in layers
    )
    lines = [
        "<p>Where positions live: linear probes of each layer's residual stream (layer 0 "
        "the embedding output, layer l the output of block l) for the index of every "
        "token in the longest trained sequences, fitted on one set and scored on held-out "
        "sequences. Accuracy: a linear classifier over the positions (chance 1/T); "
        "R<sup>2</sup>: least squares. Mean over seeds (min-max).</p>",
        f"<table><tr><th>encoding</th><th>probe</th>{head}<th>chance</th></tr>",
    ]
    for row in rows:
        cells = []
        for layer in layers:
            if layer in row["layers"]:
                mean, lo, hi = row["layers"][layer]
                cells.append(f"<td>{mean:.3g} ({lo:.3g}-{hi:.3g})</td>")
            else:
                cells.append("<td>-</td>")
        accuracy = row["metric"] == "accuracy"
        name = "accuracy" if accuracy else "R<sup>2</sup>"
        chance = f"{1 / row['positions']:.3g} (T = {row['positions']})" if accuracy else "0"
        lines.append(f"<tr><td>{html.escape(row['encoding'])}</td><td>{name}</td>"
                     f"{''.join(cells)}<td>{chance}</td></tr>")  # fmt: skip
    lines.append("</table>")
    return lines


def probe_figure(probes: Sequence[Any], title: str = "") -> Any:
    """Probe accuracy and R^2 per layer (columns) and encoding (rows): mean over seeds.

    Raises:
        ValueError: no probes (a run from before the lab probed its models).
    """
    from posenc.faces.plot import new_figure

    table: dict[str, dict[str, dict[int, tuple[float, float, float]]]] = {}
    for row in probe_summary(probes):
        table.setdefault(row["encoding"], {})[row["metric"]] = row["layers"]
    if not table:
        raise ValueError("this lab run has no position probes (rerun posenc lab run)")
    encodings = list(table)
    layers = sorted({v for by in table.values() for m in by.values() for v in m})
    chance = 1 / probes[0].positions
    fig, axes = new_figure(10.5, 1.7 + 0.42 * len(encodings), ncols=2)
    for ax, metric, name in (
        (axes[0], "accuracy", f"probe accuracy (chance {chance:.3f})"),
        (axes[1], "r2", "probe R\u00b2"),
    ):
        grid = np.array([[table[e][metric][v][0] for v in layers] for e in encodings])
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto",
                          interpolation="none")  # fmt: skip
        fig.colorbar(image, ax=ax, shrink=0.85, label=metric)
        ax.set_title(name)
        ax.set_xlabel("residual stream after")
        ax.set_xticks(range(len(layers)), ["embedding" if v == 0 else f"block {v}" for v in layers])
        ax.set_yticks(range(len(encodings)), encodings)
        for (r, c), v in np.ndenumerate(grid):
            ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if v < 0.55 else "black")  # fmt: skip
    if title:
        fig.suptitle(title)
    return fig


def figure(records: Sequence[Any], train_len: int, title: str = "", ax: Any = None) -> Any:
    """Metric against length per encoding: mean over seeds, min-max band, trained range marked.

    Drawn on a new figure, or on the matplotlib axes ``ax`` (one panel of a
    larger figure); returns the figure either way.
    """
    from posenc.faces.plot import new_figure

    if ax is None:
        fig, ax = new_figure(8, 4.5)
    else:
        fig = ax.figure
    metric = records[0].metric if records else "accuracy"
    # a task's shortest length (flipflop's is 2) starts the trained band
    start = min((r.length for r in records), default=1) - 0.5 if metric == "accuracy" else 0
    for i, (encoding, by_len) in enumerate(_by_encoding(records).items()):
        lengths = sorted(by_len)
        vals = [by_len[n] for n in lengths]
        mean = [float(np.mean(v)) for v in vals]
        colour = f"C{i % 10}"
        ax.plot(lengths, mean, label=encoding, color=colour, lw=1.6)
        ax.fill_between(lengths, [min(v) for v in vals], [max(v) for v in vals],
                        color=colour, alpha=0.15, lw=0)  # fmt: skip
    ax.axvspan(start, train_len + 0.5, color="0.9", zorder=-1, label="trained lengths")
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


def section(
    records: Sequence[Any], config: Any, svg: bytes | None = None, probes: Sequence[Any] = ()
) -> str:
    """The lab's results as an HTML ``<section id="lab-TASK">``.

    The SVG figure (``svg``, drawn when None), the summary table, and the
    :class:`~posenc.lab.probes.Probe` table per layer when ``probes`` has any.
    """
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
    shortest = min((r.length for r in records), default=1)  # flipflop's is 2
    return "\n".join([
        f'<section id="lab-{html.escape(config.task)}" class="lab">'
        f"<h3>{html.escape(_title(config))}</h3>",
        f"<p>{html.escape(_caption(config))}</p>",
        f'<img src="data:image/svg+xml;base64,{data}" alt="lab results: {config.task}">',
        f"<table><tr><th>encoding</th><th>{metric}, lengths {shortest}-{config.train_len} "
        f"(seed min-max)</th><th>{metric}, lengths {config.train_len + 1}-{config.test_len}"
        "</th></tr>",
        *cells,
        "</table>",
        *_probe_table(probes),
        "</section>",
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


def write(
    out: str | Path, records: Sequence[Any], config: Any, probes: Sequence[Any] = ()
) -> dict[str, Path]:
    """Write ``out/results.png``, ``out/results.svg`` and ``out/index.html``; return the paths.

    The page is :func:`section` of ``records`` and ``probes``.
    """
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
        f"{section(records, config, svg, probes)}</body></html>"
    )
    with atomic_write(out / "index.html", "w") as f:
        f.write(page)
    return {"png": out / "results.png", "svg": out / "results.svg", "html": out / "index.html"}
