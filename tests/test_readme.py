"""Every ```python block of the README and of the documentation's pages runs as written,
each in a fresh namespace (the guides under ``docs/`` are the site's pages).

The task pages (getting started, the tutorials, the how-to guides) are left to
``tests/test_tutorials.py``, which runs each page's blocks in order in one namespace and
compares what they print with what the page shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_tutorials import PAGES as RUN_IN_ORDER

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
PAGES = [p for p in PAGES if "_build" not in p.parts and p not in RUN_IN_ORDER]
BLOCKS = [
    (page, page.read_text().count("\n", 0, m.start()) + 2, m.group(1))  # first code line, 1-based
    for page in PAGES
    for m in re.finditer(r"^```python\n(.*?)^```$", page.read_text(), re.DOTALL | re.MULTILINE)
]


def test_the_pages_have_python_blocks():
    assert len([b for b in BLOCKS if b[0].name == "README.md"]) >= 2
    assert len(BLOCKS) >= 20


@pytest.mark.parametrize(
    ("page", "line", "code"),
    BLOCKS,
    ids=[f"{p.relative_to(ROOT)}:{n}" for p, n, _ in BLOCKS],
)
def test_block_runs(page, line, code):
    namespace: dict[str, object] = {"__name__": "readme"}
    padded = "\n" * (line - 1) + code  # a traceback then points at the page's own lines
    exec(compile(padded, str(page), "exec"), namespace)
