"""Measured results bundled with posenc, and the guide pages that show them.

A study that takes minutes to hours (the cross-engine table, the lab's arithmetic and
context-extension studies) is run once with ``make``, and its document is bundled in
``posenc/faces/data`` (:func:`read`); the guide shows it as a table between two marker
lines of its page (:func:`between`), which the same ``make`` target rewrites, and the
explainer and the docs' tests read the bundled document back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from posenc.core.files import atomic_write


def between(text: str, markers: tuple[str, str], content: str, what: str) -> str:
    """``text`` with ``content`` in place of what stands between the two ``markers`` lines.

    Args:
        text: a page.
        markers: the opening and the closing marker (they may be the same line twice).
        content: the new text between them (a newline is put on either side).
        what: what the block holds, for the error.

    Raises:
        ValueError: the page has not both markers, in order.

    Examples:
        >>> between("a\\n<!-- t -->\\nold\\n<!-- t -->\\nb", ("<!-- t -->",) * 2, "new", "t")
        'a\\n<!-- t -->\\nnew\\n<!-- t -->\\nb'
    """
    start, end = markers
    a = text.find(start)
    b = text.find(end, a + len(start)) if a >= 0 else -1
    if a < 0 or b < 0:
        raise ValueError(f"the page has no {start} ... {end} block for the {what}")
    return text[: a + len(start)] + "\n" + content + "\n" + text[b:]


def read(name: str) -> dict[str, Any] | None:
    """The bundled document ``posenc/faces/data/NAME`` (None where the package has none)."""
    path = resources.files("posenc.faces").joinpath("data").joinpath(name)
    try:
        text = path.read_text()
    except (FileNotFoundError, OSError):
        return None
    doc: dict[str, Any] = json.loads(text)
    return doc


def write(name: str, doc: Any) -> Path:
    """Bundle ``doc`` as ``posenc/faces/data/NAME`` (JSON, atomically); its path."""
    path = Path(str(resources.files("posenc.faces"))) / "data" / name
    with atomic_write(path, "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")
    return path


def publish(
    source: Path,
    name: str,
    page: Path,
    rewrite: Callable[[str, dict[str, Any]], str],
    draw: Callable[[dict[str, Any]], Any],
    png: Path,
) -> Path:
    """Bundle a finished study: ``source`` (its JSON document) as ``name``, ``page`` with
    its tables rewritten by ``rewrite(text, doc)``, and ``draw(doc)``'s figure as ``png``
    (each written atomically; the page is read before anything is written). The bundled
    file's path.

    Raises:
        ValueError: ``source`` cannot be read, or ``rewrite`` finds no table markers.
    """
    from posenc.faces.plot import encode, pyplot

    try:
        doc = json.loads(source.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {str(source)!r}: {exc.strerror}") from None
    text = rewrite(page.read_text(), doc)
    path = write(name, doc)
    with atomic_write(page, "w") as f:
        f.write(text)
    fig = draw(doc)
    image = encode(fig, "png")
    pyplot().close(fig)
    png.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(png) as f:
        f.write(image)
    return path
