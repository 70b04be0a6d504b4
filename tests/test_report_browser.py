"""The report in a real browser: Debian's chromium, headless, driven by Playwright.

CI installs the ``chromium`` package (``.ci/run``); Playwright's own browser
download is not used. Without it the tests skip, saying why, and under ``CI=true``
fail (``conftest.unavailable``). The page is opened from ``file://`` with every other
request refused: it must load with no console errors or warnings, decode every
image, and its explorers must show what posenc computes (the values, scores and
counts are recomputed here, not read from the page's data). A full-page and an
explorer screenshot are saved as artifacts of the run (``$POSENC_ARTIFACTS`` or
``artifacts/`` in the checkout).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conftest
import posenc
from conftest import LOCAL
from posenc.faces import explorers, report
from posenc.integration.analysis import explorer as data

DIM, LENGTH, PRESET = 32, 16, "vaswani"  # the shared small report's (conftest)
ARTIFACTS = Path(os.environ.get("POSENC_ARTIFACTS", Path(__file__).parents[1] / "artifacts"))


@dataclass
class Opened:
    """A freshly loaded report page, with what it logged and what it tried to fetch."""

    page: Any
    messages: list[str] = field(default_factory=list)
    remote: list[str] = field(default_factory=list)

    def text(self, selector: str) -> str:
        return str(self.page.locator(selector).inner_text())

    def html(self, selector: str) -> str:
        return str(self.page.eval_on_selector(selector, "e => e.innerHTML"))

    def canvas(self, selector: str) -> str:
        return str(self.page.eval_on_selector(selector, "c => c.toDataURL()"))

    def slide(self, selector: str, value: int) -> None:
        # what a dragged slider does: set the value, then fire "input"
        self.page.eval_on_selector(
            selector,
            "(e, v) => { e.value = v; e.dispatchEvent(new Event('input', {bubbles: true})); }",
            str(value),
        )

    def selected(self, selector: str) -> str:
        return str(self.page.eval_on_selector(selector, "s => s.selectedOptions[0].text"))

    def clean(self) -> None:
        assert self.messages == []
        assert self.remote == []


@pytest.fixture(scope="module")
def built(small_report: report.Report) -> report.Report:
    return small_report


@pytest.fixture
def opened(browser: Any, built: report.Report) -> Iterator[Opened]:
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    got = Opened(context.new_page())

    def route(r: Any) -> None:
        if r.request.url.startswith(LOCAL):
            r.continue_()
        else:
            got.remote.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    got.page.on(
        "console",
        lambda m: (
            got.messages.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None
        ),
    )
    got.page.on("pageerror", lambda e: got.messages.append(f"pageerror: {e}"))
    got.page.goto(built.index.resolve().as_uri())
    got.page.wait_for_load_state("load")
    # the explorers draw once their compressed data is inflated (asynchronously)
    got.page.wait_for_selector("html[data-explorers=ready]", timeout=20_000)
    yield got
    context.close()


def test_missing_chromium_skips_saying_why_and_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # the browser fixture's lookup where no candidate exists and PATH holds nothing
    monkeypatch.setattr(conftest, "CHROMIUM", (str(tmp_path / "chromium"), "chromium"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert conftest.chromium() is None
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
        conftest.chromium_executable()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"chromium is not installed.*\.ci/run"):
        conftest.chromium_executable()


def test_report_renders_offline(opened: Opened) -> None:
    page = opened.page
    images = page.evaluate(
        "() => Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])"
    )
    assert images
    assert all(complete and width > 0 for _, complete, width in images), images
    for name in ("sinusoidal", "timestep", "rope", "extension", "bias"):
        text = opened.text(f"#{name}-explorer")
        assert text.strip(), name
        assert "seed" not in text.lower()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    page.locator("#sinusoidal-explorer").screenshot(path=str(ARTIFACTS / "explorer.png"))
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000
    assert (ARTIFACTS / "explorer.png").stat().st_size > 10_000
    opened.clean()


def _shown(opened: Opened, dim: int, base: float, position: int) -> None:
    """``#pe-values`` holds the first channels of posenc's table at ``position``, to 4 decimals."""
    table = np.asarray(posenc.sinusoidal(LENGTH, dim, preset=PRESET, dtype="float64", base=base))
    values = opened.page.locator("#pe-values .pe-value").all_inner_texts()
    assert len(values) == min(8, dim)
    assert values == [f"{v:.4f}" for v in table[position, : len(values)]]
    assert opened.text("#position-value") == str(position)


def test_sinusoidal_explorer_shows_posencs_values(opened: Opened) -> None:
    page = opened.page
    assert int(page.get_attribute("#position", "max")) == LENGTH - 1
    assert opened.selected("#dim") == str(DIM)
    assert opened.selected("#base") == "10,000"
    before = (opened.html("#pe-clocks"), opened.html("#pe-values"))
    for position in (0, 5, LENGTH - 1):
        opened.slide("#position", position)
        _shown(opened, DIM, 10000.0, position)
    assert (opened.html("#pe-clocks"), opened.html("#pe-values")) != before
    # keyboard: the slider takes arrow keys
    page.focus("#position")
    page.keyboard.press("ArrowLeft")
    _shown(opened, DIM, 10000.0, LENGTH - 2)

    canvas = opened.canvas("#sinusoidal-explorer canvas")
    hands = opened.html("#pe-clocks")
    page.select_option("#dim", label="64")
    _shown(opened, 64, 10000.0, LENGTH - 2)
    assert opened.canvas("#sinusoidal-explorer canvas") != canvas
    assert opened.html("#pe-clocks") != hands

    canvas, hands = opened.canvas("#sinusoidal-explorer canvas"), opened.html("#pe-clocks")
    page.select_option("#base", index=0)
    base = float(opened.selected("#base").replace(",", ""))
    assert base != 10000.0
    _shown(opened, 64, base, LENGTH - 2)
    assert opened.canvas("#sinusoidal-explorer canvas") != canvas
    assert opened.html("#pe-clocks") != hands
    opened.slide("#position", 3)
    _shown(opened, 64, base, 3)
    opened.clean()


def test_rope_explorer_scores_depend_on_the_offset(opened: Opened) -> None:
    rope = data.rope_explorer()
    score = rope["score"]
    positions = rope["positions"]
    page = opened.page
    assert int(page.get_attribute("#rope-m", "max")) == positions - 1

    def shown() -> tuple[int, int, str, str]:
        m = int(page.input_value("#rope-m"))
        n = int(page.input_value("#rope-n"))
        offset = opened.text("#rope-offset").replace("\u2212", "-")
        return m, n, offset, opened.text("#rope-score")

    planes = opened.html("#rope-planes")
    opened.slide("#rope-m", 20)
    opened.slide("#rope-n", 7)
    assert shown() == (20, 7, "13", f"{score[20, 7]:.6f}")
    assert opened.html("#rope-planes") != planes
    opened.slide("#rope-n", 41)
    assert shown() == (20, 41, "-21", f"{score[20, 41]:.6f}")

    opened.slide("#rope-n", 7)
    page.check("#rope-lock")
    planes = opened.html("#rope-planes")
    first = shown()
    opened.slide("#rope-m", 30)
    moved = shown()
    assert moved == (30, 17, "13", f"{score[30, 17]:.6f}")
    assert opened.html("#rope-planes") != planes
    # the same offset: the same score up to float64 rounding, within the last printed digit
    assert abs(float(moved[3]) - float(first[3])) <= 1e-6
    opened.slide("#rope-n", 40)
    assert shown()[:3] == (53, 40, "13")
    opened.slide("#rope-m", 5)  # n would be -8: both stop where the offset still fits
    assert shown()[:3] == (13, 0, "13")
    page.uncheck("#rope-lock")
    opened.slide("#rope-m", 2)
    assert shown() == (2, 0, "2", f"{score[2, 0]:.6f}")
    opened.clean()


def test_extension_explorer_matches_the_schedules(opened: Opened) -> None:
    settings = explorers.rope_settings(None)
    schedules = {s.label: s for s in settings["schedules"]}

    def check() -> None:
        schedule = schedules[opened.selected("#ext-schedule")]
        trained = int(opened.selected("#ext-trained"))
        option = re.fullmatch(r"(\d+) \(×([\d.]+)\)", opened.selected("#ext-factor"))
        assert option is not None, opened.selected("#ext-factor")
        target, factor = int(option[1]), float(option[2])
        got = data.extension_explorer(
            settings["head_dim"],
            settings["base"],
            trained=[trained],
            factors=[factor],
            schedules=[schedule],
        )
        want = data.describe(got["cases"][schedule.key, trained, factor], trained, factor)
        assert target == want["target"]
        counts = opened.page.eval_on_selector_all(
            "#ext-summary [data-key]",
            "es => Object.fromEntries(es.map(e => [e.dataset.key, e.textContent]))",
        )
        assert counts == {
            "kept": str(want["kept"]),
            "interpolated": str(want["interpolated"]),
            "blended": str(want["blended"]),
            "in_range": str(want["in_range"]),
            "attention_scaling": f"{want['attention_scaling']:.4f}",
        }
        assert f"of {settings['head_dim'] // 2} pairs" in opened.text("#ext-summary")

    assert opened.selected("#ext-schedule") == settings["schedules"][0].label
    assert int(opened.selected("#ext-trained")) == settings["original"]
    check()
    for selector, index in (
        ("#ext-schedule", 4),
        ("#ext-trained", 0),
        ("#ext-factor", 4),
        ("#ext-schedule", 2),
    ):
        chart = opened.html("#ext-svg")
        opened.page.select_option(selector, index=index)
        assert opened.html("#ext-svg") != chart, selector
        check()
    opened.clean()


def test_timestep_explorer_shows_posencs_similarities(opened: Opened) -> None:
    page = opened.page
    got = data.timestep_explorer(dims=(16, 32, 64))
    t = got["timesteps"]
    assert int(page.get_attribute("#ts-t", "max")) == len(t) - 1

    def check(i: int, dim: int) -> None:
        assert opened.text("#ts-t-value") == f"{t[i]:.1f}"
        ddpm = posenc.sinusoidal(t[i : i + 1], dim, preset="ddpm", dtype="float64")[0]
        ldm = posenc.sinusoidal(t[i : i + 1], dim, preset="ldm", dtype="float64")[0]
        cosine = ddpm @ ldm / (np.linalg.norm(ddpm) * np.linalg.norm(ldm))
        assert opened.text("#ts-cross-0-1").strip() == f"{cosine:.4f}"
        assert opened.text("#ts-cross-0-2").strip() == "1.0000"  # ddpm = annotated at even d
        first = posenc.sinusoidal(np.array([0.0, 1.0]), dim, preset="ddpm", dtype="float64")
        near = first[0] @ first[1] / (np.linalg.norm(first[0]) * np.linalg.norm(first[1]))
        assert opened.text("#ts-next") == f"{near:.4f}"

    assert opened.selected("#ts-dim") == "64"
    strips, lines = opened.html("#ts-strip-svg"), opened.html("#ts-line-svg")
    for i in (0, 3, 1501):  # t = 0, 1.5 (between integers), 750.5
        opened.slide("#ts-t", i)
        check(i, 64)
    assert opened.html("#ts-strip-svg") != strips and opened.html("#ts-line-svg") != lines
    strips = opened.html("#ts-strip-svg")
    page.select_option("#ts-dim", label="32")
    check(1501, 32)
    assert opened.html("#ts-strip-svg") != strips
    lines = opened.html("#ts-line-svg")
    page.select_option("#ts-preset", label="ldm")
    assert opened.html("#ts-line-svg") != lines
    opened.clean()


def test_bias_explorer_shows_each_heads_weights(opened: Opened) -> None:
    page = opened.page
    modules, length, trained = explorers.bias_modules()
    assert int(page.get_attribute("#bias-query", "max")) == length - 1
    labels = [label for label, _ in modules.values()]
    assert "learned by the lab" in labels[1]  # the bundled run's T5 table, not a random one

    def check(which: int, head: int, query: int) -> None:
        module = list(modules.values())[which][1]
        bias = module.bias(length, length).detach().double().numpy()[head, query, : query + 1]
        weights = np.exp(bias - bias.max())
        weights /= weights.sum()
        distance = float((weights * (query - np.arange(query + 1))).sum())
        assert opened.text("#bias-self") == f"{weights[-1]:.4f}"
        assert opened.text("#bias-distance") == f"{distance:.2f}"

    assert opened.selected("#bias-module") == labels[1]
    check(1, 0, trained - 1)
    chart = opened.html("#bias-svg")
    opened.slide("#bias-query", 50)
    check(1, 0, 50)
    assert opened.html("#bias-svg") != chart
    chart = opened.html("#bias-svg")
    page.select_option("#bias-head", index=2)
    check(1, 2, 50)
    assert opened.html("#bias-svg") != chart
    chart = opened.html("#bias-svg")
    page.select_option("#bias-module", index=0)  # ALiBi: the steepest head looks nearby
    check(0, 2, 50)
    assert opened.html("#bias-svg") != chart
    page.select_option("#bias-head", index=0)
    check(0, 0, 50)
    opened.clean()


def test_arithmetic_id_table_shows_posencs_ids(opened: Opened) -> None:
    from posenc.faces.lab import arithmetic

    page = opened.page
    assert page.locator("#arith-table").count() == 1, "the bundled arithmetic study is shown"

    def rows() -> dict[str, list[str]]:
        got = page.eval_on_selector(
            "#arith-table",
            "t => Array.from(t.rows).map(r => Array.from(r.cells).map(c => c.textContent))",
        )
        return {row[0]: row[1:] for row in got}

    for numbers, option, task in (
        ((653, 49), "msd", "add-answer-reversed"),
        ((123, 4567), "reversed", "add-reversed"),
        ((99999, 1, 500), "msd", None),
    ):
        page.fill("#arith-numbers", "+".join(map(str, numbers)))
        page.select_option("#arith-format", option)
        shown = rows()
        if task is None:  # three operands: the ids from the functions, on the format's layout
            import torch

            from posenc.faces.lab.arithmetic_tasks import ArithmeticFormat, example_tokens
            from posenc.families.arithmetic import abacus_positions, coupled_positions

            fmt = ArithmeticFormat("", operands=3, reverse_operands=False)
            _, places, _ = example_tokens(fmt, numbers)
            sig = torch.tensor(places)
            want = {"abacus": abacus_positions(sig).tolist(),
                    "coupled": coupled_positions(sig).tolist()}  # fmt: skip
        else:
            want = arithmetic.id_table(numbers, task)
        for name in ("abacus", "coupled"):
            assert shown[name] == [str(v) for v in want[name]], (numbers, name)
        if task is not None:
            assert shown["token"] == want["token"] and shown["hint"] == want["hint"]
    # a training offset shifts every digit's ids by it
    page.fill("#arith-numbers", "653+49")
    page.select_option("#arith-format", "msd")
    opened.slide("#arith-offset", 5)
    base = arithmetic.id_table((653, 49))
    assert rows()["coupled"] == [str(v + 5 if v else 0) for v in base["coupled"]]
    assert rows()["abacus"] == [str(v + 5 if v else 0) for v in base["abacus"]]
    opened.clean()


def test_no_formula_is_wider_than_its_section(browser: Any, built: report.Report) -> None:
    # at 1024 px every formula fits its section: a long one is split (a narrower window
    # scrolls it inside its section), never cut off at the section's edge
    context = browser.new_context(viewport={"width": 1024, "height": 800})
    page = context.new_page()
    page.goto(built.index.resolve().as_uri())
    page.wait_for_load_state("load")
    overflowing = page.eval_on_selector_all(
        'section math[display="block"]',
        """ms => ms.flatMap(m => {
            const section = m.closest('section'), s = section.getBoundingClientRect();
            const box = (m.closest('.formula') || m).getBoundingClientRect();
            const right = Math.max(...[...m.querySelectorAll('*')].map(
                k => k.getBoundingClientRect().right));  // the glyphs' extent, not the box's
            const fits = box.left >= s.left - 0.5 && Math.max(box.right, right) <= s.right + 0.5;
            return fits ? [] : [section.id + ': ' + m.textContent.slice(0, 40)];
        })""",
    )
    count = page.eval_on_selector_all('section math[display="block"]', "ms => ms.length")
    context.close()
    assert count >= 10
    assert overflowing == []
