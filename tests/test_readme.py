"""Every ```python block of README.md runs as written, each in a fresh namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
TEXT = README.read_text()
BLOCKS = [
    (TEXT.count("\n", 0, m.start()) + 2, m.group(1))  # the first line of code, 1-based
    for m in re.finditer(r"^```python\n(.*?)^```$", TEXT, re.DOTALL | re.MULTILINE)
]


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"line {n}" for n, _ in BLOCKS])
def test_block_runs(line, code):
    namespace: dict[str, object] = {"__name__": "readme"}
    padded = "\n" * (line - 1) + code  # a traceback then points at README.md's own lines
    exec(compile(padded, str(README), "exec"), namespace)
