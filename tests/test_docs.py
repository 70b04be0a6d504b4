"""The documentation site: built strictly, every public name on a page, read in a browser.

The site is built once per session by Sphinx (``make docs`` runs the same command) into a
temporary folder, with the session's small report as its explainer. The build must exit
0 under ``-W`` (a warning fails it) and print no warning or error at all (docutils
messages from the command-line page reach stderr without passing Sphinx's logging).
The pages are then opened in Debian's chromium from ``file://``, every other request
refused.
"""

from __future__ import annotations

import argparse
import html
import importlib
import pkgutil
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import background
import conftest
import posenc
from posenc import _moved

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Site:
    root: Path
    log: str

    def pages(self) -> list[Path]:
        return sorted(p for p in self.root.rglob("*.html") if "_static" not in p.parts)


@pytest.fixture(scope="session")
def site(small_report: Any) -> Site:
    for package in ("sphinx", "myst_parser", "furo", "sphinxarg"):
        conftest.anchor(package)
    build = background.wait("docs-site")  # started when the tests were collected
    _, log = build.wait()
    # the explainer, as the build's last step writes it (here the session's small report)
    shutil.copytree(small_report.index.parent, build.out / "explainer")
    return Site(build.out, log)


def test_the_build_is_clean(site: Site) -> None:
    noisy = [line for line in site.log.splitlines() if re.search(r"WARNING|ERROR", line)]
    assert noisy == []
    assert (site.root / "index.html").is_file()
    assert (site.root / "explainer" / "index.html").is_file()


# --- every public name has a page ----------------------------------------------------


def public_modules() -> dict[str, ModuleType]:
    """posenc and its modules with no private part, by the path users import them at."""
    found: dict[str, ModuleType] = {"posenc": posenc}
    for info in pkgutil.walk_packages(posenc.__path__, "posenc."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        found[_moved.short(info.name)] = importlib.import_module(info.name)
    return found


def inventory(site: Site) -> dict[str, set[str]]:
    from sphinx.util.inventory import InventoryFile

    with open(site.root / "objects.inv", "rb") as f:
        inv = InventoryFile.load(f, "", posixpath_join)
    entries = getattr(inv, "data", inv)  # Sphinx 9 returns the mapping itself
    return {kind: set(names) for kind, names in entries.items()}


def posixpath_join(*parts: str) -> str:
    return "/".join(parts)


def test_every_public_module_declares_its_names() -> None:
    undeclared = [s for s, m in public_modules().items() if not hasattr(m, "__all__")]
    assert undeclared == []


def test_every_public_name_has_a_page(site: Site) -> None:
    inv = inventory(site)
    python = set().union(*(names for kind, names in inv.items() if kind.startswith("py:")))
    modules = public_modules()
    assert modules["posenc"] is posenc and len(modules) > 80
    # a re-exported name's anchor is its own, on its module's page
    anchors = set().union(*(parsed(p).ids for p in (site.root / "api").glob("*.html")))
    missing = []
    for short, module in modules.items():
        assert short in python, f"module {short} has no page"
        names = [f"{short}.{name}" for name in module.__all__ if name != "__version__"]
        missing += [dotted for dotted in names if dotted not in python | anchors]
    assert missing == []
    # a re-exported name's entry links to the page that documents it
    page = (site.root / "api" / "posenc.html").read_text()
    assert 'href="posenc.absolute.html#posenc.absolute.sinusoidal.sinusoidal"' in page


def test_search_index_holds_the_reference(site: Site) -> None:
    index = (site.root / "searchindex.js").read_text()
    for name in ("yarn", "alibi", "patch_model", "stick_breaking_attention"):
        assert name in index.lower()


# --- the command line's reference ------------------------------------------------------


def commands(parser: argparse.ArgumentParser, path: str = "posenc") -> Iterator[tuple[str, Any]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{path} {name}")


def test_the_cli_page_has_every_command_and_option(site: Site) -> None:
    from posenc.faces.cli import build_parser

    text = re.sub(r"<[^>]+>", " ", (site.root / "cli.html").read_text())
    text = html.unescape(text)
    missing = []
    for path, parser in commands(build_parser()):
        if path.split()[-1] not in text:
            missing.append(path)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # -h/--help: every command has it; the page does not repeat it
            missing += [f"{path} {o}" for o in action.option_strings if o not in text]
    assert missing == []


# --- in a browser -----------------------------------------------------------------------


@dataclass(frozen=True)
class Links:
    """The hrefs of a page and the ids it defines."""

    hrefs: list[str]
    ids: set[str]


def parsed(page: Path) -> Links:
    text = page.read_text(encoding="utf-8")
    hrefs = [html.unescape(h) for h in re.findall(r"<(?:a|link)\b[^>]*?\shref=\"([^\"]*)\"", text)]
    ids = {html.unescape(i) for i in re.findall(r"\s(?:id|name)=\"([^\"]*)\"", text)}
    return Links(hrefs, ids)


def test_every_internal_link_resolves(site: Site) -> None:
    ids: dict[Path, set[str]] = {}
    broken = []
    for page in site.pages():
        for href in parsed(page).hrefs:
            url = urllib.parse.urlsplit(href)
            if url.scheme or url.netloc or href.startswith("mailto:"):
                continue
            target = (page.parent / urllib.parse.unquote(url.path)).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{page.relative_to(site.root)}: {href}")
                continue
            if url.fragment and target.suffix == ".html":
                if target not in ids:
                    ids[target] = parsed(target).ids
                known = ids[target]
                if urllib.parse.unquote(url.fragment) not in known:
                    broken.append(f"{page.relative_to(site.root)}: {href}")
    assert broken == []


def opened(browser: Any) -> tuple[Any, Any, list[str]]:
    """A context and page that refuse every request but local ones, and what they logged."""
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    messages: list[str] = []

    def route(r: Any) -> None:
        if r.request.url.startswith(conftest.LOCAL):
            r.continue_()
        else:
            messages.append(f"remote: {r.request.url}")
            r.abort()

    def console(m: Any) -> None:
        if m.type == "error":
            messages.append(f"{m.type}: {m.text}")

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", console)
    page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
    return context, page, messages


def test_every_page_loads_without_a_console_error(site: Site, browser: Any) -> None:
    context, page, messages = opened(browser)
    failed = {}
    try:
        for path in site.pages():
            page.goto(path.as_uri(), wait_until="load")
            if messages:
                failed[str(path.relative_to(site.root))] = list(messages)
                messages.clear()
    finally:
        context.close()
    assert failed == {}
    assert len(site.pages()) > 30  # home, guides, Learn, the reference, CLI, search ...


@pytest.mark.parametrize("term", ["yarn", "alibi", "patch_model", "stick_breaking_attention"])
def test_the_search_finds(site: Site, browser: Any, term: str) -> None:
    url = (site.root / "search.html").as_uri() + "?q=" + urllib.parse.quote(term)
    context, page, messages = opened(browser)
    try:
        page.goto(url, wait_until="load")
        page.wait_for_selector("#search-results ul.search li", timeout=20_000)
        hits = page.eval_on_selector_all(
            "#search-results ul.search li a", "as => as.map(a => a.textContent)"
        )
    finally:
        context.close()
    assert messages == []
    assert any(term.lower() in str(hit).lower() for hit in hits), hits


def test_make_docs_runs_the_same_command() -> None:
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(r"^docs:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert rule, "the Makefile has a docs target"
    assert all(option in rule.group(1) for option in background.DOCS_OPTIONS)
