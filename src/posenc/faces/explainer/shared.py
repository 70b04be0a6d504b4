"""What the explainer's sections share: the section record, the build's inputs, wording, links.

- :class:`Section`: one question of the page, as a section module builds it.
- :class:`Inputs`: what :func:`posenc.report.build` hands every section (sizes,
  preset, RoPE settings, the learned table, the lab runs).
- wording: :func:`fmt`, :func:`holds`, :func:`spread`, :func:`lab_note`,
  :func:`lab_rows`, :func:`mathml`.
- links: :data:`PAPERS` (each cited paper's arXiv id, by how the page cites
  it), :func:`link_papers`, and :func:`link_names`, which makes every mention of
  a public posenc name a link to its reference entry (:mod:`posenc._api`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from posenc import _api, _moved


@dataclass
class Section:
    """One question of the page: its answer, measured numbers, figures, formulas and code.

    Attributes:
        key: the section's HTML id.
        title: the question, as a heading.
        text: the answer, one paragraph per blank-line-separated block.
        numbers: ``(what, value)`` rows measured in this run.
        figures: names of the figures shown (their files' names).
        formulas: LaTeX, each rendered as a MathML block.
        code: a few lines of posenc code that compute what the section shows.
        explorer: the interactive explorer shown (``"sinusoidal"``, ``"rope"``,
            ``"extension"``), if any.
        extra: HTML appended to the section (the lab's results).
        draw: figure name -> a function that draws it; a figure not here is
            :func:`posenc.plot.figure` of that name at the page's sizes.
    """

    key: str
    title: str
    text: str
    numbers: list[tuple[str, str]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    formulas: list[str] = field(default_factory=list)
    code: str = ""
    explorer: str | None = None
    extra: str = ""
    draw: dict[str, Callable[[], Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Inputs:
    """What every section is built from.

    Attributes:
        dim: channels of the sinusoidal table.
        length: positions of the table and of the explorer's slider.
        preset: the sinusoidal preset.
        rope: the RoPE settings (:func:`posenc.faces.explorers.rope_settings`).
        learned: the learned table's training run (:func:`posenc.analysis.train_learned`).
        labs: the lab runs the page shows (:mod:`posenc.lab.results` records).
        learned_bundled: ``learned`` is the run bundled with posenc
            (:mod:`posenc.faces.learned_table`), read back rather than trained now.
    """

    dim: int
    length: int
    preset: str
    rope: dict[str, Any]
    learned: Any
    labs: Sequence[Any] = ()
    learned_bundled: bool = False

    def lab(self, want: Callable[[Any], bool]) -> Any:
        """The first lab run that has what a section needs, else the bundled copy run."""
        from posenc.faces.lab import results

        for run in self.labs:
            if want(run):
                return run
        return results.bundled()[0]


def plotted(name: str, **options: Any) -> Callable[[], Any]:
    """A function drawing :func:`posenc.plot.figure` ``name`` with ``options``."""

    def draw() -> Any:
        from posenc.faces import plot

        return plot.figure(name, **options)

    return draw


# ---------------------------------------------------------------------------- wording


def fmt(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits, in exponent form when very large or small."""
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def holds(error: float, bound: float) -> str:
    """A property that holds to rounding, said as such rather than as a noise number."""
    if error <= bound:
        return f"yes: within float64 rounding (bound {fmt(bound, 2)})"
    return f"NO: error {fmt(error)} above the float64 bound {fmt(bound, 2)}"


def spread(values: tuple[float, float, float], digits: int = 2) -> str:
    """``mean (min-max)`` of a lab measurement over its trained models."""
    mean, lo, hi = values
    return f"{mean:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def encodings(run: Any) -> set[str]:
    """The encodings a lab run trained."""
    return {r.encoding for r in run.records}


def lab_note(run: Any) -> str:
    """A lab run's settings, in words."""
    c = run.config
    seeds = "seed 0" if c.seeds == 1 else f"seeds 0-{c.seeds - 1}"
    return (
        f"the lab's {c.task} run ({c.layers} layers, {c.heads} heads, width {c.d_model}, "
        f"{c.steps} steps, trained on lengths 1-{c.train_len}, {seeds})"
    )


def lab_rows(run: Any) -> dict[str, dict[str, Any]]:
    """A lab run's summary (mean and spread within and beyond its trained lengths), by encoding."""
    from posenc.faces.lab import results

    return {r["encoding"]: r for r in results.summary(run.records, run.config.train_len)}


def mathml(latex: str) -> str:
    """``latex`` as a MathML ``<math display="block">`` element (latex2mathml)."""
    from latex2mathml.converter import convert

    return convert(latex, display="block")


# ---------------------------------------------------------------------------- links

#: How the page cites a paper -> its arXiv id (``https://arxiv.org/abs/ID``).
PAPERS: dict[str, str] = {
    "Vaswani et al.": "1706.03762",  # Attention Is All You Need
    "Su et al.": "2104.09864",  # RoFormer
    "RoFormer": "2104.09864",
    "Press et al.": "2108.12409",  # ALiBi: Train Short, Test Long
    "Raffel et al.": "1910.10683",  # T5
    "Ho et al.": "2006.11239",  # DDPM
    "latent diffusion": "2112.10752",  # Rombach et al.
    "DiT": "2212.09748",  # Peebles and Xie
    "He et al.": "2111.06377",  # MAE
    "Kazemnejad et al.": "2305.19466",  # NoPE and length generalisation
    "Haviv et al.": "2203.16634",  # LMs without positional encodings
    "Ruoss et al.": "2305.16843",  # randomized positional encodings
    "McLeish et al.": "2405.17399",  # Abacus
    "Cho et al.": "2405.20671",  # position coupling
    "Zhou et al.": "2402.09371",  # length generalization, index hints
    "Peng et al.": "2309.00071",  # YaRN
    "Chen et al.": "2306.15595",  # position interpolation
    "Black et al.": "2204.06745",  # GPT-NeoX-20B
    "Touvron et al.": "2302.13971",  # LLaMA
}

_PAPER = re.compile(
    r"(?<![\w>])(" + "|".join(re.escape(k) for k in sorted(PAPERS, key=len, reverse=True)) + r")"
    r"(?![\w<])"
)
#: A dotted name under posenc, as written in prose or code (``posenc.Rotary``).
NAME = re.compile(r"(?<![\w.])posenc(?:\.[A-Za-z_]\w*)+")


def arxiv(paper: str) -> str:
    """The arXiv page of an id of :data:`PAPERS`."""
    return f"https://arxiv.org/abs/{paper}"


def link_papers(escaped: str) -> str:
    """Escaped prose with every citation of :data:`PAPERS` a link to the paper's arXiv page."""
    return _PAPER.sub(lambda m: f'<a href="{arxiv(PAPERS[m[1]])}">{m[1]}</a>', escaped)


def public(dotted: str) -> str | None:
    """The public name ``dotted`` spells (itself, or its short path), or None if it is none."""
    for name in (dotted, _moved.short(dotted)):
        try:
            _api.reference_path(name)
        except ValueError:
            continue
        return name
    return None


def link_names(escaped: str, site: str | None, *, code: bool = False) -> str:
    """Escaped text with every public posenc name a link to its entry in the reference.

    In prose (``code=False``) a name becomes ``<code>`` (inside ``<a href=site +
    reference path>`` when ``site`` is given); in a code block only the link is
    added. Names that are not public stay as they are.
    """

    def sub(m: re.Match[str]) -> str:
        name = public(m[0])
        if name is None:
            return m[0]
        shown = m[0] if code else f"<code>{m[0]}</code>"
        if site is None:
            return shown
        href = html.escape(site + _api.reference_path(name))
        return f'<a class="ref" href="{href}">{shown}</a>'

    return NAME.sub(sub, escaped)


def prose(text: str, site: str | None) -> str:
    """Plain text as HTML: escaped, papers and public names linked."""
    return link_names(link_papers(html.escape(text)), site)
