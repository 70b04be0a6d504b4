"""The report in a real browser: Debian's chromium, headless, driven by Playwright.

CI installs the ``chromium`` package (``.ci/run``); Playwright's own browser
download is not used. The page must load with no console errors and every
image decoded (``naturalWidth > 0``); a full-page screenshot is saved as an
artifact of the run (``$POSENC_ARTIFACTS`` or ``artifacts/`` in the checkout).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from posenc import report

CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")


def _chromium() -> str | None:
    for name in CANDIDATES:
        found = name if os.path.isfile(name) and os.access(name, os.X_OK) else shutil.which(name)
        if found:
            return found
    return None


def test_report_renders_in_chromium(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    executable = _chromium()
    if executable is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    result = report.build(tmp_path / "report", dim=32, length=16, train_steps=20)
    artifacts = Path(os.environ.get("POSENC_ARTIFACTS", Path(__file__).parents[1] / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(result.index.resolve().as_uri())
            page.wait_for_load_state("load")
            images = page.evaluate(
                "() => Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])"
            )
            page.screenshot(path=str(artifacts / "report.png"), full_page=True)
            sections = page.evaluate("() => document.querySelectorAll('section').length")
        finally:
            browser.close()
    assert errors == []
    assert len(images) == len(result.figures)
    assert all(complete and width > 0 for _, complete, width in images), images
    assert sections == len(result.sections)
    assert (artifacts / "report.png").stat().st_size > 10_000
