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
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import background
import conftest
from posenc import _api

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


# --- the reference: the public surface, and nothing else -------------------------------


def reference_pages(site: Site) -> list[Path]:
    return sorted(p for p in (site.root / "api").glob("*.html") if p.stem != "index")


def test_the_reference_has_a_page_per_public_module_and_an_entry_per_name(site: Site) -> None:
    assert {p.stem for p in reference_pages(site)} == set(_api.PUBLIC)
    missing = []
    for module in _api.PUBLIC:
        page = site.root / "api" / f"{module}.html"
        ids = parsed(page).ids
        missing += [f"{module}.{n}" for n in _api.names(module) if f"{module}.{n}" not in ids]
        # the page opens with a summary table of its names
        assert "posenc-summary" in page.read_text(), module
    assert missing == []
    # a name two public modules export: one entry (posenc's), a link from the other
    page = (site.root / "api" / "posenc.bias.html").read_text()
    assert 'href="posenc.html#posenc.ALiBi"' in page
    assert 'id="posenc.bias.ALiBi"' in page


def value_lines(page: Path) -> list[str]:
    """The signature line of each data entry of a reference page, as text."""
    text = page.read_text(encoding="utf-8")
    blocks = re.findall(r'<dl class="py data">\s*<dt[^>]*>(.*?)</dt>', text, re.S)
    text_of = (re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", b)) for b in blocks)
    return [html.unescape(t).strip() for t in text_of]


#: what a value longer than a line, or one of the build machine, looks like in a page
MACHINE = re.compile(r"PosixPath|/work/|/home/|/tmp/|site-packages|<function |<class ")


def test_no_value_is_longer_than_a_line_nor_the_build_machines(site: Site) -> None:
    long, machine = [], []
    for page in reference_pages(site):
        long += [f"{page.stem}: {v[:80]}" for v in value_lines(page) if len(v) > 100]
        text = html.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8")))
        machine += [f"{page.stem}: {m}" for m in MACHINE.findall(text)]
    assert long == [] and machine == []


def test_the_value_check_sees_a_long_value(tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    value = "x" * 101
    page.write_text(f'<dl class="py data">\n<dt class="sig"><span>A</span> = {value}</dt>')
    assert [len(v) > 100 for v in value_lines(page)] == [True]
    assert MACHINE.search("= PosixPath('/work/checkout/.engines')")


def test_search_index_holds_the_reference(site: Site) -> None:
    index = (site.root / "searchindex.js").read_text()
    for name in ("yarn", "alibi", "patch_model", "stick_breaking_attention"):
        assert name in index.lower()


# --- links: every posenc.X a user reads leads to its entry ------------------------------

#: the pages for maintainers (they may name internal modules; their mentions stay code)
DEVELOPMENT = (
    "dev/", "guides/architecture", "guides/gpu", "guides/benchmarks",
    "guides/explainer-internals", "changelog", "api/", "search", "explainer/",
)  # fmt: skip
MENTION = re.compile(r"posenc(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?:\(\))?")


class Mentions(HTMLParser):
    """Each ``<code>`` whose text is a dotted posenc name, and whether a link holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.links = 0  # <a> elements open around the current position
        self.code: list[tuple[str, bool]] = []  # (text so far, inside a link)
        self.found: list[tuple[str, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links += 1
        elif tag == "code":
            self.code.append(("", self.links > 0))

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self.links -= 1
        elif tag == "code" and self.code:
            text, linked = self.code.pop()
            if MENTION.fullmatch(text.strip()):
                self.found.append((text.strip(), linked))

    def handle_data(self, data: str) -> None:
        if self.code:
            text, linked = self.code[-1]
            self.code[-1] = (text + data, linked)


def unlinked(text: str) -> list[str]:
    """The posenc names a page mentions in code outside any link."""
    parser = Mentions()
    parser.feed(text)
    return [name for name, linked in parser.found if not linked]


def test_every_mention_in_a_users_page_links_to_its_entry(site: Site) -> None:
    found = {}
    users = [p for p in site.pages() if not str(p.relative_to(site.root)).startswith(DEVELOPMENT)]
    assert len(users) > 15  # the front page, getting started, tutorials, how-tos, guides ...
    for page in users:
        names = unlinked(page.read_text(encoding="utf-8"))
        if names:
            found[str(page.relative_to(site.root))] = names
    assert found == {}


def test_the_mention_check_sees_an_unlinked_name() -> None:
    linked = '<a href="api/posenc.html#posenc.Rotary"><code><span>posenc.Rotary</span></code></a>'
    assert unlinked(f"<p>{linked} and <code>posenc.ALiBi</code></p>") == ["posenc.ALiBi"]
    assert unlinked("<p><code>posenc rope</code> <code>torch.nn</code></p>") == []


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


def test_the_cli_page_prints_options_as_typed_and_each_default_once(site: Site) -> None:
    text = html.unescape(re.sub(r"<[^>]+>", " ", (site.root / "cli.html").read_text()))
    assert re.findall(r"[\u2013\u2014]-?[a-z]", text) == []  # "--preset", never "–preset"
    assert "--preset" in text and "--out" in text and "--device" in text
    assert "Default:" not in text  # sphinx-argparse's own line, beside the help's "default:"


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


#: query -> the page (or page#entry) a user asking it wants among the first three results
SEARCHES = {
    "yarn": "tutorials/yarn-llama3.html",
    "rotary": "api/posenc.html#posenc.Rotary",
    "alibi": "howto/bias-sdpa-flex.html",
    "qwen": "howto/patch-a-model.html",
    "llama 3": "tutorials/yarn-llama3.html",
    "install": "getting-started.html",
    "patch_model": "api/posenc.hf.html#posenc.hf.patch_model",
    "timestep": "howto/timesteps.html",
    "fire": "api/posenc.html#posenc.FIRE",
    "context extension": "howto/choose-schedule.html",
    "stick-breaking": "guides/contextual.html",
    "vllm": "howto/check-engine.html",
}


def search(site: Site, browser: Any, query: str) -> list[str]:
    """The hrefs of the site's search results for ``query``, best first (relative to
    the site's root, without the highlight query)."""
    url = (site.root / "search.html").as_uri() + "?q=" + urllib.parse.quote(query)
    context, page, messages = opened(browser)
    try:
        page.goto(url, wait_until="load")
        page.wait_for_selector("#search-results ul.search li", timeout=20_000)
        hrefs = page.eval_on_selector_all(
            "#search-results ul.search li a", "as => as.map(a => a.getAttribute('href'))"
        )
    finally:
        context.close()
    assert messages == []
    return [re.sub(r"\?[^#]*", "", str(h)) for h in hrefs]


def found(expected: str, hrefs: list[str]) -> bool:
    """Whether ``expected`` is among the first three: a page matches any of its
    anchors; page#entry only itself."""
    return any(h == expected or ("#" not in expected and h.split("#")[0] == expected)
               for h in hrefs[:3])  # fmt: skip


@pytest.mark.parametrize("query", list(SEARCHES))
def test_the_search_puts_the_page_asked_for_among_the_first_three(
    site: Site, browser: Any, query: str
) -> None:
    hrefs = search(site, browser, query)
    assert found(SEARCHES[query], hrefs), hrefs[:6]


def test_the_search_check_sees_a_fourth_place() -> None:
    hits = ["a.html", "b.html#x", "c.html", "guides/patching.html#qwen"]
    assert not found("guides/patching.html", hits)
    assert found("b.html", hits) and not found("b.html#y", hits)


# --- layout: nothing wider than its column -----------------------------------------------

#: for each code block and table of the page's article: its box against the column,
#: and its content against its box (a table's box is furo's scrolling wrapper)
OVERFLOW = """() => {
  const column = document.querySelector('article') || document.body;
  const wide = [];
  for (const el of column.querySelectorAll('pre, table')) {
    const wrapped = el.tagName === 'TABLE' && el.parentElement.classList.contains('table-wrapper');
    const box = wrapped ? el.parentElement : el;
    const width = box.getBoundingClientRect().width;
    if (width === 0) continue;  // hidden
    if (width > column.clientWidth + 8 || box.scrollWidth > box.clientWidth + 1) {
      wide.push(`${el.tagName} ${box.scrollWidth}px: ${el.textContent.trim().slice(0, 50)}`);
    }
  }
  // sideways: the page wider than the window, or the column wider than its box (furo's
  // headings and table wrappers reach 8 px past it by design)
  const beyond = Math.max(0, column.scrollWidth - column.clientWidth - 8);
  const page = Math.max(document.documentElement.scrollWidth, window.innerWidth + beyond);
  return {wide, page};
}"""


def overflow(
    browser: Any, site: Site, pages: list[Path], width: int, before: str = ""
) -> dict[str, Any]:
    """page -> what is wider than its column at ``width`` px, and the page's own width
    where it scrolls sideways (``before``: a script run first, the near miss's)."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    found: dict[str, Any] = {}
    try:
        for path in pages:
            page.goto(path.as_uri(), wait_until="load")
            if before:
                page.evaluate(before)
            seen = page.evaluate(OVERFLOW)
            if seen["wide"] or seen["page"] > width:
                found[str(path.relative_to(site.root))] = seen
    finally:
        context.close()
    return found


def test_no_code_block_or_table_is_wider_than_its_column_at_1024px(
    site: Site, browser: Any
) -> None:
    pages = [p for p in site.pages() if "explainer" not in p.parts]
    assert overflow(browser, site, pages, 1024) == {}


def test_the_guides_and_the_explainer_do_not_scroll_sideways_at_420px(
    site: Site, browser: Any
) -> None:
    users = [p for p in site.pages() if not str(p.relative_to(site.root)).startswith(DEVELOPMENT)]
    pages = [*users, site.root / "explainer" / "index.html"]
    wide = {name: seen["page"] for name, seen in overflow(browser, site, pages, 420).items()}
    assert {name: w for name, w in wide.items() if w > 420} == {}


def test_the_layout_checks_see_one_wide_cell_and_one_wide_block(site: Site, browser: Any) -> None:
    """On a page that passes both: a table cell of 300 characters that cannot wrap (seen
    at 1024 px), and a block 440 px wide (the page scrolls sideways at 420 px)."""
    cell = "'<table><tr><td style=\"white-space:nowrap\">' + 'x'.repeat(300) + '</td></tr></table>'"
    add = "document.querySelector('article').insertAdjacentHTML('beforeend', {})"
    found = overflow(browser, site, [site.root / "cli.html"], 1024, before=add.format(cell))
    assert list(found) == ["cli.html"] and found["cli.html"]["wide"], found
    block = "'<div style=\"width: 440px; height: 4px\"></div>'"
    started = [site.root / "getting-started.html"]
    found = overflow(browser, site, started, 420, before=add.format(block))
    assert found["getting-started.html"]["page"] > 420, found


def test_make_docs_runs_the_same_command() -> None:
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(r"^docs:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert rule, "the Makefile has a docs target"
    assert all(option in rule.group(1) for option in background.DOCS_OPTIONS)


def test_the_changelog_is_by_release_with_dates() -> None:
    import posenc

    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (.+)$", text, re.M)
    dated = [r for r in releases if re.fullmatch(r"\d+\.\d+\.\d+ \(\d{4}-\d{2}-\d{2}\)", r)]
    assert releases and set(releases) - set(dated) <= {"Unreleased"}
    # the newest: the version installed, or the changes since it
    assert releases[0] == "Unreleased" or releases[0].startswith(f"{posenc.__version__} (")
    assert f"## {posenc.__version__} (" in text
    for body in re.split(r"^## .+$", text, flags=re.M)[1:]:
        headings = re.findall(r"^### (.+)$", body, re.M)
        assert len(headings) == len(set(headings)), headings  # one of each per release
