"""``posenc report``: positional encodings explained, with figures, formulas and exact numbers.

:func:`build` writes one self-contained page, ``out/index.html``, that works
offline from ``file://``: each section asks a question, answers it in a few
sentences, gives the formula (MathML, converted from LaTeX by latex2mathml),
a few lines of posenc code, a figure, and the numbers measured in this run
(:mod:`posenc.analysis`). Five explorers let the reader move the position,
the size and the base; a continuous diffusion timestep through the three
timestep conventions; the positions of a query and a key under RoPE; the
trained and target lengths of a context-extension schedule; and a query
position under each head of ALiBi and of a trained T5 table
(:mod:`posenc.faces.explorers`: their data computed by posenc, drawn with d3).
The sections follow a learner's order: why positions, why not the index, the
sinusoid, what its base controls and its timestep use, its properties, learned
tables and what the layers keep of a position (the lab's linear probes), why an
added position is not relative after the projections, RoPE, its two layouts and
long contexts, NoPE layers, biases, grids. Each section is a module of
:mod:`posenc.faces.explainer` (its text, formulas, code, numbers, figures and
explorer together), in the order of :data:`posenc.faces.explainer.SECTIONS`.
Static figures (:mod:`posenc.plot`) are embedded as SVG and also written to
``out/figures/*.{png,svg}``.

Every paper the page cites links to its arXiv page. Built with ``site`` (the
documentation site's root, as the docs build does), the page links back to the
site and every mention of a public posenc name links to its reference entry;
standalone, the names are plain code.

By default the page also shows the lab's bundled results (a copy task, a
byte-level language model and the flip-flop task, trained at one length and
tested beyond it, and the copy run's position probes and trained T5 table);
``lab=DIR`` shows a
fresh ``posenc lab run`` instead (a section whose data that run lacks, such
as probes, falls back to the bundled copy run).
"""

from __future__ import annotations

import base64
import html
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc.core import checks
from posenc.core.files import atomic_write
from posenc.faces import explainer, learned_table
from posenc.faces.explainer.shared import Inputs, Section, link_names, mathml, prose
from posenc.faces.explorers import rope_settings
from posenc.families.absolute.sinusoidal import PRESETS
from posenc.integration import analysis

__all__ = [
    "build",
]

#: The page embeds the explorer's table for every d and base it offers, so its size grows
#: with both; at these maxima it stays under 4 MiB.
MAX_LENGTH = 128
#: The largest ``--dim`` (see :data:`MAX_LENGTH`).
MAX_DIM = 1024

#: The lab results shown when no ``lab`` directory is given: ``posenc lab run`` and
#: ``posenc lab run --task text`` at their defaults, and the flip-flop run of PaTH,
#: PaTH-FoX, FoX, RoPE and NoPE (results.json of each).
BUNDLED_LAB = ("lab-copy.json", "lab-text.json", "lab-flipflop.json")


@dataclass
class Report:
    """What :func:`build` wrote: the sections, the HTML file and the figure files."""

    sections: list[Section]
    index: Path
    figures: dict[str, tuple[Path, Path]]
    seconds: float


def _sections(inputs: Inputs) -> list[Section]:
    """The page's sections (:func:`posenc.faces.explainer.sections`)."""
    return explainer.sections(inputs)


def _lab_runs(directory: Path | None) -> list[Any]:
    """The lab runs the page shows: a fresh run's directory, or the bundled copy and text runs."""
    from posenc.faces.lab import results

    if directory is None:
        return results.bundled()
    path = directory / "results.json"
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"--lab: cannot read {str(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--lab: {str(path)!r} is not JSON: {exc.msg}") from None
    return [results.read(doc)]


def _figures(
    sections: Sequence[Section], inputs: Inputs, directory: Path, say: Callable[[str], None]
) -> dict[str, tuple[Path, Path]]:
    """Draw every section's figures into ``directory`` as PNG and SVG: name -> (png, svg).

    A figure a section does not draw itself is :func:`posenc.plot.figure` of that name at
    the page's sizes.
    """
    from posenc.faces import plot

    files: dict[str, tuple[Path, Path]] = {}
    for s in sections:
        for name in s.figures:
            say(f"figure {name}")
            png, svg = directory / f"{name}.png", directory / f"{name}.svg"
            draw = s.draw.get(name)
            made = (
                draw()
                if draw is not None
                else plot.figure(name, dim=inputs.dim, length=inputs.length, preset=inputs.preset)
            )
            plot.save(made, svg, png)
            files[name] = (png, svg)
    return files


def _img(svg: Path, alt: str) -> str:
    data = base64.b64encode(svg.read_bytes()).decode()
    return f'<img src="data:image/svg+xml;base64,{data}" alt="{html.escape(alt)}">'


_CSS = """
:root{--ink:#1d2330;--muted:#5b6475;--rule:#e3e6ec;--accent:#3b5bdb;--code:#f5f6f8}
body{font:16px/1.55 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--ink);
max-width:980px;margin:0 auto;padding:1.5em 1.2em 4em}
h1{font-size:2em;margin:.3em 0 .1em}h2{font-size:1.4em;margin:2.4em 0 .6em;
padding-bottom:.2em;border-bottom:1px solid var(--rule)}
p{margin:.6em 0}.lead{color:var(--muted)}
nav{columns:2;font-size:.92em;margin:1em 0 2em;padding:.8em 1em;background:var(--code);
border-radius:6px}nav a{display:block;color:var(--accent);text-decoration:none}
math{font-family:"STIX Two Math","Cambria Math","Latin Modern Math","DejaVu Math TeX Gyre",
math}math[display=block]{margin:.8em 0;font-size:1.12em}
.formula{max-width:100%;overflow-x:auto;overflow-y:hidden}
pre{background:var(--code);padding:.7em 1em;border-radius:6px;overflow-x:auto;
font-size:.88em;line-height:1.4}
table.numbers{border-collapse:collapse;margin:.8em 0;font-size:.92em}
table.numbers caption{text-align:left;color:var(--muted);font-size:.9em;padding-bottom:.2em}
table.numbers td{padding:.25em .9em .25em 0;border-bottom:1px solid var(--rule);
vertical-align:top}table.numbers td:last-child{font-family:ui-monospace,monospace}
img{max-width:100%;display:block;margin:1em auto}
section#lab img,section.lab img{max-width:100%}
table.engines td.v-same{color:#2b8a3e}table.engines td.v-different{color:#c92a2a;
font-weight:600}table.engines td.v-refused,table.engines td.v-error{color:#e67700}
table.engines td:last-child,.engine-case td:last-child{font-family:inherit}
a{color:var(--accent)}pre a{color:inherit;text-decoration:underline dotted}
.site{font-size:.92em;margin:0}
pre{white-space:pre-wrap;overflow-wrap:anywhere}
table{display:block;max-width:100%;overflow-x:auto}select{max-width:100%}
"""


def _section_html(
    s: Section, figures: dict[str, Path], explorers: dict[str, str], site: str | None = None
) -> str:
    parts = [f'<section id="{s.key}"><h2>{html.escape(s.title)}</h2>']
    paragraphs = s.text.split("\n\n")
    parts += [f"<p>{prose(p, site)}</p>" for p in paragraphs[:1]]
    parts += [f'<div class="formula">{mathml(f)}</div>' for f in s.formulas]
    parts += [f"<p>{prose(p, site)}</p>" for p in paragraphs[1:]]
    if s.explorer is not None:
        parts.append(explorers[s.explorer])
    parts += [_img(figures[f], f) for f in s.figures]
    if s.code:
        code = link_names(html.escape(s.code), site, code=True)
        parts.append(f'<pre><code class="language-python">{code}</code></pre>')
    if s.numbers:
        parts.append('<table class="numbers"><caption>measured in this run</caption>')
        parts += [
            f"<tr><td>{prose(k, site)}</td><td>{prose(v, site)}</td></tr>" for k, v in s.numbers
        ]
        parts.append("</table>")
    parts.append(s.extra)
    parts.append("</section>")
    return "\n".join(parts)


def _html(
    sections: Sequence[Section],
    figures: dict[str, Path],
    title: str,
    note: str,
    explorer_data: dict[str, Any],
    site: str | None = None,
) -> str:
    from posenc.faces import explorers

    boxes = explorers.containers()
    home = (
        []
        if site is None
        else [
            f'<p class="site">Part of <a href="{html.escape(site)}index.html">the posenc '
            "documentation</a>: its guides, and the reference every posenc name on this page "
            "links to.</p>"
        ]
    )
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}{explorers.style()}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        *home,
        f'<p class="lead">{html.escape(note)}</p><nav>',
        *(f'<a href="#{s.key}">{html.escape(s.title)}</a>' for s in sections),
        "</nav>",
        *(_section_html(s, figures, boxes, site) for s in sections),
        explorers.scripts(explorer_data),
        "</body></html>",
    ]
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
    site: str | None = None,
) -> Report:
    """Compute every section and write ``out/index.html`` and ``out/figures/*.{png,svg}``.

    Args:
        out: output directory (created).
        dim: channels of the sinusoidal table (even, 4 to :data:`MAX_DIM`); the
            explorer also offers 16 to 512.
        length: positions (3 to :data:`MAX_LENGTH`): the table's rows and the
            slider's range.
        preset: a sinusoidal preset name (``posenc presets``).
        rope_config: a model's ``config.json``: its RoPE schedule is shown first.
        train_steps: steps of the learned-table training run. At 300 (the default)
            the page shows the run bundled with posenc
            (:mod:`posenc.faces.learned_table`, the same table, as training is
            deterministic); any other count trains a table now (a few seconds).
        lab: a ``posenc lab run`` output directory whose results replace the
            bundled ones.
        progress: called with a short message as each part starts.
        site: the root URL of the documentation site the page is part of (``"../"``
            when the docs build puts it at ``explainer/`` inside the site; a ``/`` is
            added if missing): the page then links back to the site, and every
            public posenc name it mentions links to its reference entry
            (:func:`posenc._api.reference_path`). None (``posenc report``): a
            standalone page, names as plain code.

    Raises:
        ValueError: bad sizes, an unknown preset, an unreadable config or lab
            directory, or an output directory that cannot be written.

    Examples:
        A build draws every figure, and here trains a table (50 steps, not the bundled
        300), which takes seconds even at small sizes (so this first example is not run
        by the tests):

        >>> import tempfile
        >>> import posenc.report
        >>> with tempfile.TemporaryDirectory() as out:  # doctest: +SKIP
        ...     report = posenc.report.build(out, dim=64, length=32, train_steps=50)
        ...     report.index.name, len(report.figures)
        ('index.html', 21)

        The sizes are checked before anything is computed or written:

        >>> posenc.report.build("unused", dim=7)
        Traceback (most recent call last):
        ValueError: dim must be even (pairs of sin and cos) and at most 1024; got 7
    """
    from posenc.faces import explorers

    start = time.perf_counter()
    dim = checks.check_int(dim, "dim", minimum=4)
    if dim % 2 or dim > MAX_DIM:
        raise ValueError(
            f"dim must be even (pairs of sin and cos) and at most {MAX_DIM}; got {dim}"
        )
    length = checks.check_int(length, "length", minimum=3)
    if length > MAX_LENGTH:
        raise ValueError(
            f"length must be at most {MAX_LENGTH} (the page embeds the table for every d and "
            f"base its explorer offers); got {length}"
        )
    checks.check_choice(preset, "preset", tuple(PRESETS))
    train_steps = checks.check_int(train_steps, "train_steps", minimum=1)
    if site is not None and not isinstance(site, str):
        raise TypeError(f"site must be a URL string or None; got {type(site).__name__}")
    if site is not None and not site.endswith("/"):
        site += "/"
    rope = rope_settings(rope_config)
    labs = _lab_runs(None if lab is None else Path(lab))
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
    bundled = train_steps == learned_table.SETTINGS["steps"]
    say("reading the bundled learned table" if bundled else "training a learned table")
    learned = learned_table.bundled() if bundled else analysis.train_learned(steps=train_steps)
    say("measuring")
    inputs = Inputs(dim, length, preset, rope, learned, labs, learned_bundled=bundled)
    sections = _sections(inputs)
    say("explorers")
    t5_run = inputs.lab(lambda run: any(b.encoding == "t5" for b in run.bias_parameters))
    data = explorers.payload(length=length, preset=preset, dim=dim, rope=rope, lab=t5_run)
    files = _figures(sections, inputs, figures_dir, say)
    note = (
        "Positional encodings explained with numbers that posenc computed on this "
        f"machine: the {preset} preset at d = {dim} over {length} positions; RoPE scaling "
        f"for {rope['name']}."
    )
    index = out / "index.html"
    page = _html(
        sections,
        {k: v[1] for k, v in files.items()},
        "Positional encodings, explained and measured",
        note,
        data,
        site,
    )
    with atomic_write(index, "w") as f:
        f.write(page)
    return Report(sections, index, files, time.perf_counter() - start)
