"""posenc report and posenc plot: every section with its measured numbers, figures that decode."""

from __future__ import annotations

import base64
import errno
import json
import math
import os
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import matplotlib.image
import numpy as np
import pytest

import background
from posenc import analysis, plot, report
from posenc.core import files
from posenc.faces.cli import main

SECTIONS = [
    "why", "index", "sinusoidal", "why-10000", "exp-log", "timesteps", "shift", "add-concat",
    "geometry", "precision", "learned", "layers", "projections", "rope", "rope-layouts",
    "extension", "extend", "nope", "biases", "arithmetic", "grid",
]  # fmt: skip
# the formulas the page must render, by section: the definition, the shift rotation, the
# norm, RoPE's rotation and the ALiBi bias
FORMULAS = {"sinusoidal": r"\sin", "shift": r"\begin{pmatrix}", "geometry": r"\frac{d}{2}",
            "rope": r"m\theta_i", "biases": r"m_h"}  # fmt: skip
MiB = 2**20


@pytest.fixture(scope="module")
def small(small_report):
    return small_report  # the session's (d 32, 16 positions), shared with the browser tests


def numbers(result, key):
    (section,) = [s for s in result.sections if s.key == key]
    return dict(section.numbers)


def first_float(text):
    return float(re.search(r"-?\d+(\.\d+)?(e[-+]?\d+)?", text).group())


def test_every_section_answers_with_numbers_and_a_figure_or_explorer(small):
    assert [s.key for s in small.sections] == SECTIONS
    for s in small.sections:
        assert s.title and s.text and s.numbers and s.code, s.key
        assert s.figures or s.explorer, s.key
        for label, value in s.numbers:
            assert label and value, s.key
    page = small.index.read_text()
    for key in SECTIONS:
        assert f'id="{key}"' in page
    for name in ("sinusoidal", "timestep", "rope", "extension", "bias"):
        assert f'id="{name}-explorer"' in page
    assert 'id="posenc-data"' in page


def test_formulas_are_mathml(small):
    page = small.index.read_text()
    by_key = {s.key: s for s in small.sections}
    for key, piece in FORMULAS.items():
        assert any(piece in f for f in by_key[key].formulas), key
    rendered = re.findall(r'<math[^>]*display="block"', page)
    assert len(rendered) == sum(len(s.formulas) for s in small.sections) >= len(FORMULAS)
    # no LaTeX left unconverted, inside or outside the formulas
    assert "\\frac" not in page.split('id="posenc-data"')[0]
    assert "\\" not in "".join(re.findall(r"<math.*?</math>", page, re.S))


def test_the_page_loads_nothing_and_names_no_private_document(small):
    page = small.index.read_text()
    # nothing fetched: no src outside the page itself, no stylesheet or other <link>
    assert not re.findall(r'\bsrc="(?!data:)[^"]*"', page)
    assert "<link" not in page
    # links only: within the page, into the documentation site, or to a paper's arXiv page
    hrefs = re.findall(r'<a\b[^>]*\shref="([^"]*)"', page)
    assert hrefs and not [h for h in hrefs if not re.match(r"#|\.\./|https://arxiv\.org/abs/", h)]
    lowered = page.lower()
    for word in ("anchors.md", "style.md", "seed text", "seed 00", "seed-00", "shared/"):
        assert word not in lowered
    # a rounding-noise measurement is not shown as if it meant something
    assert "nearest distinct" not in lowered


def test_code_snippets_run(small, capsys):
    for s in small.sections:
        exec(compile(s.code, f"<{s.key} snippet>", "exec"), {})
    capsys.readouterr()


def test_numbers_are_the_measured_properties(small):
    geo = numbers(small, "geometry")
    (norm,) = [v for k, v in geo.items() if k.startswith("norm of every row")]
    assert norm.startswith(f"{math.sqrt(32 / 2):.6g}") and "within float64 rounding" in norm
    shift = numbers(small, "shift")
    assert "within float64 rounding" in shift["PE(p + 10) = M_10 PE(p) at every p"]
    assert shift["R\u00b2 from its (sin, cos) pair"] == "1 (to float64 rounding)"
    single = [v for k, v in shift.items() if k.startswith("R\u00b2 of channel")]
    assert float(single[0]) < 0.99
    prec = numbers(small, "precision")
    posenc_err, naive32, naive16 = (
        first_float(x)
        for x in prec["at position 1e+06: posenc / usual float32 / usual bfloat16"].split(" / ")
    )
    assert posenc_err < 1e-7 < naive32 < naive16
    why = numbers(small, "why")
    assert "within float64 rounding" in next(iter(why.values()))
    assert first_float(why["largest change of an output row once positions are added"]) > 1e-3
    assert "within float64 rounding" in next(iter(numbers(small, "rope").values()))


def test_the_index_question_is_answered_with_numbers(small):
    rows = numbers(small, "index")
    assert rows["position 5 as p / (L \u2212 1), for L = 11, 101, 4096"].startswith("0.5, 0.05, ")
    assert rows["the raw index at the end of those sequences"] == "10, 100, 4095"
    (nearest,) = [v for k, v in rows.items() if k.startswith("smallest distance")]
    assert first_float(nearest) > 0.1 and "every code distinct" in nearest


def test_the_frequencies_are_fixed_and_said_to_be(small):
    (section,) = [s for s in small.sections if s.key == "sinusoidal"]
    assert "Nothing here is learned" in section.text
    rows = numbers(small, "sinusoidal")
    (params,) = [v for k, v in rows.items() if k.startswith("trainable parameters")]
    assert params == f"0 / {16 * 32:,}"  # a learned table of 16 positions x 32 channels


def test_timesteps_section_measures_the_presets(small):
    rows = numbers(small, "timesteps")
    (mismatch,) = [v for k, v in rows.items() if k.startswith("cosine of the ddpm and ldm")]
    mean, low, high = (float(x) for x in re.findall(r"-?\d+\.\d+", mismatch))
    assert mismatch.startswith("mean ")
    assert low <= mean <= high < 0.5  # far from the same vector
    assert (
        "within float64 rounding"
        in rows["ddpm and annotated-diffusion, the same t: identical at even d"]
    )
    near = [first_float(v) for k, v in rows.items() if k.startswith("cos(e(t), e(t + ")]
    assert 1 > near[0] > near[1] > near[2] > 0  # neighbours alike, far ones less
    (odd,) = [v for k, v in rows.items() if k.startswith("d = 33")]
    assert odd == "32 / 33 (zero)"
    (section,) = [s for s in small.sections if s.key == "timesteps"]
    assert "timestep" in section.text and section.explorer == "timestep"
    order = [s.key for s in small.sections]
    assert order.index("sinusoidal") < order.index("timesteps")


def test_layers_section_reads_the_bundled_probes(small):
    rows = numbers(small, "layers")
    chance = first_float(rows["chance accuracy (1 / positions)"])
    accuracy = {k.split(":")[0]: v for k, v in rows.items() if "probe accuracy" in k}
    assert {"nope", "rope", "sinusoidal", "learned", "alibi", "t5"} <= set(accuracy)
    for encoding in ("sinusoidal", "learned"):  # an absolute table: read at the embedding
        assert first_float(accuracy[encoding]) > 0.9
    for encoding in ("nope", "rope", "alibi"):  # nothing added to the vectors
        assert first_float(accuracy[encoding]) < 10 * chance


def test_nope_section_has_the_labs_numbers(small):
    rows = numbers(small, "nope")
    assert {"rope", "nope", "hybrid-nope"} == {k.split(":")[0] for k in rows if "exact match" in k}
    (layers,) = [v for k, v in rows.items() if k.startswith("NoPE layers of a 12-layer")]
    assert layers == "3, 7, 11"
    order = [s.key for s in small.sections]
    assert order.index("extension") < order.index("nope") < order.index("biases")


def test_the_base_section_measures_what_the_base_controls(small):
    from posenc.integration.analysis.bases import BASES, base_sweep

    rows = numbers(small, "why-10000")
    sweep = base_sweep(32, 4096, BASES, shown=16)
    (section,) = [s for s in small.sections if s.key == "why-10000"]

    def row(start):
        (value,) = [v for k, v in rows.items() if k.startswith(start)]
        return [None if v.startswith(">") else float(v) for v in value.replace(",", "").split()]

    assert row("bases compared") == list(BASES) == list(sweep.bases)
    longest = row("wavelength of the slowest pair")
    assert longest == [round(w) for w in sweep.longest_wavelength]
    assert longest == sorted(longest) and longest[0] > 2 * math.pi
    wrapped = row("pairs (of 16) whose hand turns")
    assert wrapped == list(sweep.wrapped) and wrapped == sorted(wrapped, reverse=True)
    assert wrapped[0] == 16 > wrapped[-1]  # base 100: every hand wraps within 4096
    reach = row("first offset k at which")
    assert reach == list(sweep.reach) and None not in reach and reach == sorted(reach)
    nearest = row("smallest distance between the codes")
    assert nearest == [float(f"{d:.4g}") for d in sweep.nearest]
    assert nearest == sorted(nearest, reverse=True)  # a larger base: closer neighbours
    still = row("channels (of 32) that change")
    assert still == list(sweep.still) and still == sorted(still) and still[-1] > still[0]
    # the text says what the numbers say, and explains the explorer's selector
    assert f"reaches 0 at offset {sweep.reach[2]}" in section.text
    assert "base selector" in section.text and "10000" in section.title
    order = [s.key for s in small.sections]
    assert order.index("sinusoidal") < order.index("why-10000") < order.index("exp-log")


def test_the_projections_section_measures_the_position_term(small):
    from posenc.integration.analysis.projections import position_terms

    rows = numbers(small, "projections")
    got = position_terms(32, 24, seed=0)
    holding = [v for k, v in rows.items() if not k.startswith("random")]
    assert len(holding) == 4 and all("within float64 rounding" in v for v in holding)
    (random,) = [v for k, v in rows.items() if k.startswith("random")]
    spread, size = (float(x) for x in re.fullmatch(r"(\S+) \((\S+)\)", random).groups())
    assert spread == float(f"{got.spread['random']:.3g}") and size == float(
        f"{got.size['random']:.3g}"
    )
    assert got.spread["random"] > 1e10 * got.tolerance["random"]  # not rounding: m matters
    for case in ("identity", "commuting", "rope"):
        assert got.spread[case] <= got.tolerance[case], case
    (section,) = [s for s in small.sections if s.key == "projections"]
    assert "commutes" in section.text and "after the projections" in section.text
    order = [s.key for s in small.sections]
    assert order.index("projections") == order.index("rope") - 1


def test_the_layouts_section_measures_both_layouts(small):
    from posenc.integration.analysis.layouts import half_from_interleaved, rope_layouts

    rows = numbers(small, "rope-layouts")
    got = rope_layouts(64, 32, seed=0)
    assert got.permutation == half_from_interleaved(64)
    assert got.permutation[:3] == (0, 2, 4) and got.permutation[32:35] == (1, 3, 5)
    (permuted,) = [v for k, v in rows.items() if "permuted (" in k]
    assert "within float64 rounding" in permuted
    assert got.permuted_difference <= got.tolerance
    (wrong,) = [v for k, v in rows.items() if "unpermuted:" in k]
    assert first_float(wrong) == float(f"{got.wrong_difference:.3g}")
    assert got.wrong_difference > 0.1 * got.size  # a wrong model, not a rounding
    (diagonal,) = [v for k, v in rows.items() if "m = n" in k]
    assert "within float64 rounding" in diagonal
    (section,) = [s for s in small.sections if s.key == "rope-layouts"]
    assert 'layout="interleaved"' in section.text and "rotate_half" in section.text
    (rope,) = [s for s in small.sections if s.key == "rope"]
    assert "half layout" in rope.text and "2i + 1" in rope.text  # the formula's pairs, explained


def test_lab_findings_say_what_the_lab_numbers_say(small):
    from posenc.faces.lab import results

    copy = results.bundled()[0]
    rows = {r["encoding"]: r for r in results.summary(copy.records, copy.config.train_len)}
    alibi_within, alibi_beyond = rows["alibi"]["within"][0], rows["alibi"]["beyond"][0]
    assert alibi_beyond < 0.5 * alibi_within  # the bundled numbers: ALiBi does not hold
    by_key = {s.key: s for s in small.sections}
    for key in ("learned", "biases"):
        text = by_key[key].text
        assert "holds" not in text and "extrapolates" not in text, key
        assert f"{alibi_beyond:.3g}" in text and f"{alibi_within:.3g}" in text, key
    # every encoding of the copy run, with the number its table shows
    for encoding, row in rows.items():
        assert f"{encoding} {row['beyond'][0]:.3g}" in by_key["learned"].text


def test_figures_stacked_below_each_other_are_not_called_left_or_right(small):
    # a section's figures are stacked (img is a block); left and right are panels of one
    side = re.compile(r"\((left|right)\b|\b(left|right) figure", re.I)
    for s in small.sections:
        if len(s.figures) > 1:
            assert not side.search(s.text), (s.key, side.search(s.text))
    assert side.search("(right, left panel)") and side.search("the left figure")


def msup_bars(math):
    """The norm bars of a MathML formula that carry a script alone: ``‖ ... ‖^2`` drawn with
    the closing bar as the base of the 2 (a tiny subscript-like bar in browsers)."""
    root = ET.fromstring(math)
    scripted = ("msup", "msub", "msubsup")
    return [
        el for el in root.iter()
        if el.tag.rpartition("}")[2] in scripted
        and el[0].tag.rpartition("}")[2] == "mo" and (el[0].text or "").strip() in ("\u2016", "|")
    ]  # fmt: skip


def test_norms_are_squared_as_a_whole_in_the_mathml(small):
    from posenc.faces.explainer.shared import mathml

    page = small.index.read_text()
    formulas = re.findall(r"<math.*?</math>", page, re.S)
    assert formulas and not [f for f in formulas if msup_bars(f)]
    # the offset distance: the closing bar at full size inside the base, the 2 its superscript
    (index,) = [s for s in small.sections if s.key == "index"]
    (norm,) = [f for f in index.formulas if "rVert" in f]
    root = ET.fromstring(mathml(norm))
    m = "{http://www.w3.org/1998/Math/MathML}"
    squared = [e for e in root.iter(f"{m}msup") if e[1].tag == f"{m}mn" and e[1].text == "2"]
    base = squared[0][0]
    assert base.tag == f"{m}mrow" and base[0].text == base[-1].text == "\u2016"
    assert base[0].get("form") == "prefix" and base[-1].get("form") == "postfix"
    assert len(base) > 3  # the whole difference between the bars
    # what the page used to write is what the check catches
    assert msup_bars(mathml(r"\lVert x - y \rVert^2")) and msup_bars(mathml(r"\| x \|^2"))


# ------------------------------------------------------------------------ links


def public_names():
    from posenc import _api

    return set(_api.PUBLIC) | {f"{m}.{n}" for m in _api.PUBLIC for n in _api.names(m)}


class _Links(HTMLParser):
    """Every posenc name a page mentions, with the links around it."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.hrefs, self.skip = [], [], 0
        self.code: list[str] | None = None
        self.found = []  # (name, text, enclosing hrefs, is the whole text of a <code>)

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "math"):
            self.skip += 1
        self.stack.append(tag)
        self.hrefs.append(dict(attrs).get("href") if tag == "a" else None)
        if tag == "code":
            self.code = []

    def handle_endtag(self, tag):
        while self.stack:
            open_ = self.stack.pop()
            self.hrefs.pop()
            if open_ in ("script", "style", "math"):
                self.skip -= 1
            if open_ == "code" and self.code is not None:
                text = "".join(self.code)
                if text in public_names():
                    self.found.append((text, text, [h for h in self.hrefs if h], True))
                self.code = None
            if open_ == tag:
                break

    def handle_data(self, data):
        if self.skip:
            return
        if self.code is not None:
            self.code.append(data)
        for name in re.findall(r"(?<![\w.])posenc(?:\.[A-Za-z_]\w*)+", data):
            self.found.append((name, data, [h for h in self.hrefs if h], False))


def unlinked_names(page, site):
    """Mentions of public posenc names not inside a link to their reference entry (every
    mention, when ``site`` is None: then no name may be linked)."""
    from posenc import _api, _moved

    parser = _Links()
    parser.feed(page)
    wrong = []
    for name, text, hrefs, whole in parser.found:
        if whole:  # the same mention, seen as a <code> element (checked by the test below)
            continue
        public = next((n for n in (name, _moved.short(name)) if n in public_names()), None)
        if public is None:
            continue
        if site is None:
            if hrefs:
                wrong.append(f"{name} linked in a standalone page")
        elif site + _api.reference_path(public) not in hrefs:
            wrong.append(f"{name} unlinked in {text[:60]!r}")
    return wrong


def test_every_public_name_links_to_its_reference_entry(small):
    from posenc import _api

    page = small.index.read_text()
    assert unlinked_names(page, "../") == []
    parser = _Links()
    parser.feed(page)
    codes = [(name, hrefs) for name, _, hrefs, whole in parser.found if whole]
    assert len(codes) >= 5
    for name, hrefs in codes:  # every <code> that is a public name sits in its link
        assert "../" + _api.reference_path(name) in hrefs, name
    assert '<a href="../index.html">' in page  # and the page links back to the site
    # the check fails on one mention left plain: one link taken away, in prose and in code
    for plain, linked in (("<code>posenc.Rotary</code>", "<code>posenc.Rotary</code>"),
                          ("posenc.sinusoidal", "posenc.sinusoidal")):  # fmt: skip
        href = "../" + _api.reference_path(plain.removeprefix("<code>").removesuffix("</code>"))
        tag = f'<a class="ref" href="{href}">{linked}</a>'
        assert tag in page
        broken = page.replace(tag, plain, 1)
        assert len(unlinked_names(broken, "../")) == 1


def test_every_cited_paper_links_to_its_arxiv_page(small):
    from posenc.faces.explainer.shared import PAPERS, arxiv

    page = small.index.read_text()
    cited = {c for s in small.sections for c in re.findall(r"\b[A-Z][a-z]+ et al\.", s.text)}
    assert {"Vaswani et al.", "Su et al.", "Press et al.", "Raffel et al.", "Peng et al."} <= cited
    assert cited <= set(PAPERS)
    for name in (*cited, "RoFormer"):
        assert f'<a href="{arxiv(PAPERS[name])}">{name}</a>' in page, name
    assert all(re.fullmatch(r"\d{4}\.\d{5}", paper) for paper in PAPERS.values())
    assert PAPERS["Vaswani et al."] == "1706.03762" and PAPERS["RoFormer"] == "2104.09864"


def test_extension_table_tells_the_schedules_apart(small):
    rows = numbers(small, "extension")
    assert next(iter(rows)) == "llama3"  # the default model's schedule comes first
    assert len(set(rows.values())) == len(rows)  # every schedule's row differs
    assert rows["linear (position interpolation)"].startswith("0 kept, 64 interpolated, 0 blended")


def test_figures_are_svg_in_the_page_and_png_at_twice_the_resolution(small):
    assert set(small.figures) == {f for s in small.sections for f in s.figures}
    for png, svg in small.figures.values():
        image = matplotlib.image.imread(png)
        assert image.ndim == 3 and min(image.shape[:2]) > 100
        assert ET.parse(svg).getroot().tag.endswith("svg")
    page = small.index.read_text()
    embedded = re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', page)
    # the figures, and one per bundled lab run
    assert len(embedded) == len(small.figures) + len(report.BUNDLED_LAB)
    for data in embedded:
        assert ET.fromstring(base64.b64decode(data)).tag.endswith("svg")


def test_bundled_lab_results_by_default(small):
    page = small.index.read_text()
    assert 'id="lab-copy"' in page and 'id="lab-text"' in page
    learned = page[page.index('id="learned"') : page.index('id="rope"')]
    assert 'id="lab-copy"' in learned  # inside the learned-versus-sinusoidal section


@pytest.mark.parametrize("size", ["defaults", "maxima"])
def test_page_fits_in_4_mib(size):
    # `posenc report` at its defaults and at its largest sizes (report.MAX_DIM and
    # MAX_LENGTH), built in the background while the other tests run (tests/background.py)
    index = background.wait(f"report-{size}").out / "index.html"
    assert index.stat().st_size <= 4 * MiB
    values = re.findall(r'<math[^>]*display="block"', index.read_text())
    assert values


@pytest.mark.parametrize("kind", list(plot.KINDS))
def test_every_plot_kind_renders(tmp_path, kind):
    small_options = {"dim": 16, "length": 8}
    assert (
        main(["plot", kind, "-o", str(tmp_path / f"{kind}.png"), "--dim", "16", "--length", "8"])
        == 0
    )
    assert matplotlib.image.imread(tmp_path / f"{kind}.png").size > 0
    fig = plot.figure(kind, **small_options)
    plot.save(fig, tmp_path / f"{kind}.svg")
    assert ET.parse(tmp_path / f"{kind}.svg").getroot().tag.endswith("svg")


def test_cli_report_prints_summary_and_path(tmp_path, capsys, figure_placeholders):
    figure_placeholders()  # the command's output is checked here, the figures by `small`
    out = tmp_path / "r"
    assert (
        main(["report", "--out", str(out), "--dim", "16", "--length", "8", "--train-steps", "3"])
        == 0
    )
    printed = capsys.readouterr().out
    assert str((out / "index.html").resolve()) in printed
    assert "sqrt(d/2)" in printed or "norm" in printed
    # standalone (no site): no link into a site, the names plain code, the papers linked
    page = (out / "index.html").read_text()
    assert 'href="../' not in page and 'class="site"' not in page
    assert "<code>posenc.Rotary</code>" in page and not unlinked_names(page, None)
    assert 'href="https://arxiv.org/abs/1706.03762"' in page


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["report", "--dim", "-3"], "--dim"),
        (["report", "--dim", "7"], "dim must be even"),
        (["report", "--dim", "4096"], "at most 1024"),
        (["report", "--length", "100000"], "length must be at most 128"),
        (["report", "--preset", "nope"], "--preset"),
        (["report", "--length", "1"], "--length"),
        (["plot", "nope", "-o", "x.png"], "KIND"),
        (["plot", "heatmap", "-o", "x.gif"], ".png or .svg"),
        (["plot", "heatmap", "-o", "x.png", "--preset", "nope"], "preset"),
    ],
)
def test_bad_options_end_with_one_line(tmp_path, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err and "Traceback" not in err


def test_unwritable_out_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["report", "--out", str(blocker / "sub"), "--dim", "8", "--length", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc: error: cannot write") and "\n" not in err


def test_rope_config_from_a_config_json(tmp_path, figure_placeholders):
    config = {
        "hidden_size": 256, "num_attention_heads": 4, "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "rope_scaling": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024
        },
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    settings = report.rope_settings(path)
    assert settings["head_dim"] == 64 and settings["factor"] == 4.0 and settings["original"] == 1024
    assert settings["schedules"][0].rope_type == "yarn"  # the model's schedule first
    # the config reaches the extension section's numbers and explorer, no figure: every
    # figure (rendered and checked through `small`) a placeholder
    figure_placeholders()
    built = report.build(tmp_path / "r", dim=8, length=4, train_steps=2, rope_config=path)
    rows = dict(next(s for s in built.sections if s.key == "extension").numbers)
    assert next(iter(rows)) == "config.json: yarn"
    with pytest.raises(ValueError, match="rope-config"):
        report.rope_settings(tmp_path / "missing.json")


def test_learned_table_learns_the_task():
    run = analysis.train_learned(length=12, dim=16, steps=150)
    assert run.accuracy > 0.9  # copying the previous token needs positions
    assert run.table.shape == (12, 16) and np.isfinite(run.table).all()


# ------------------------------------------------------------------------ atomic writes


def _fail_writing(monkeypatch, name):
    """Make the faces' write of a file called ``name`` fail part-way, as on a full disk."""
    real_open = open

    class FullDisk:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            self._f.write(data[:10])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, attr):
            return getattr(self._f, attr)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    def open_(path, *args, **kwargs):
        f = real_open(path, *args, **kwargs)
        return FullDisk(f) if os.path.basename(path).startswith(f".{name}.") else f

    monkeypatch.setattr(files, "open", open_, raising=False)


def test_plot_save_failing_part_way_keeps_the_previous_figure(tmp_path, monkeypatch):
    path = tmp_path / "fig.png"
    plot.save(plot.figure("heatmap", dim=8, length=4), path)
    previous = path.read_bytes()
    fig = plot.figure("heatmap", dim=8, length=4)

    def broken(target, **kwargs):  # writes a little, then the disk is full
        if isinstance(target, (str, os.PathLike)):
            with open(target, "wb") as f:
                f.write(b"\x89PNG partial")
        else:
            target.write(b"\x89PNG partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fig, "savefig", broken)
    with pytest.raises(OSError, match="No space left"):
        plot.save(fig, path)
    assert path.read_bytes() == previous
    assert [p.name for p in tmp_path.iterdir()] == ["fig.png"]


def test_plot_into_a_missing_directory_is_one_line(tmp_path, capsys):
    out = tmp_path / "missing" / "x.png"
    assert main(["plot", "heatmap", "-o", str(out), "--dim", "8", "--length", "4"]) == 2
    err = capsys.readouterr().err
    assert err == f"posenc: error: cannot write {str(out)!r}: No such file or directory\n"


@pytest.mark.parametrize("failing", ["heatmap.svg", "heatmap.png", "index.html"])
def test_report_write_failing_part_way_keeps_the_previous_files(tmp_path, monkeypatch, failing):
    # only the writing is real: one section, no training run (the learned table is bundled)
    section = report.Section("heatmap", "The table", "text", [("shape", "8 x 8")], ["heatmap"])
    monkeypatch.setattr(report, "_sections", lambda *args: [section])
    out = tmp_path / "r"
    (out / "figures").mkdir(parents=True)
    previous = {"index.html": b"old page", "heatmap.svg": b"old svg", "heatmap.png": b"old png"}
    where = {"index.html": out, "heatmap.svg": out / "figures", "heatmap.png": out / "figures"}
    for name, data in previous.items():
        (where[name] / name).write_bytes(data)
    _fail_writing(monkeypatch, failing)
    with pytest.raises(OSError, match="No space left"):
        report.build(out, dim=8, length=4)
    assert (where[failing] / failing).read_bytes() == previous[failing]
    assert sorted(p.name for p in out.rglob("*")) == sorted(["figures", *previous])
    monkeypatch.setattr(files, "open", open)
    built = report.build(out, dim=8, length=4)
    assert "The table" in built.index.read_text()
    assert sorted(p.name for p in out.rglob("*")) == sorted(["figures", *previous])


def test_a_lab_run_without_probes_leaves_them_to_the_bundled_copy_run(
    tmp_path, figure_placeholders
):
    from importlib import resources

    from posenc.faces.lab import results

    lab = tmp_path / "lab"
    lab.mkdir()
    doc = json.loads((resources.files("posenc.faces") / "data" / "lab-text.json").read_text())
    doc["probes"] = []  # the bundled text run, as a run without probes
    (lab / "results.json").write_text(json.dumps(doc))
    assert results.read(doc).probes == []
    # the probes figure (from the bundled copy run) is rendered; the others are placeholders
    rendered = figure_placeholders(keep={"probes"})
    built = report.build(tmp_path / "r", dim=8, length=4, train_steps=2, lab=lab)
    assert rendered == ["probes"]
    by_key = {s.key: s for s in built.sections}
    assert "the lab's copy run" in by_key["layers"].text  # the bundled copy run's probes
    assert "the lab's copy run" in by_key["nope"].text
    page = built.index.read_text()
    assert 'id="lab-text"' in page and 'id="lab-copy"' not in page  # the run asked for
    with pytest.raises(ValueError, match="no position probes"):
        results.probe_figure([])
