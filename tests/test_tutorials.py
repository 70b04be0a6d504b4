"""The task pages run top to bottom as a reader runs them, and print what they show.

The pages: ``docs/getting-started.md``, ``docs/tutorials/*.md`` and ``docs/howto/*.md``
(:data:`PAGES`). Each page is one test, run in a fresh temporary working directory, its
blocks in the page's order:

- A ```` ```python ```` block runs in the page's one namespace: a block sees the names of
  the blocks above it. What it prints (stdout) is compared with the ```` ```text ````
  block that follows it (nothing between but blank lines and the comment below); a
  block that prints with no such block after it fails the test: a page shows what its
  code prints.
- A ```` ```console ```` block is a terminal: each line that starts with ``$ `` is a
  command, and the lines after it, up to the next command, are what it prints (stdout
  and stderr together). ``posenc ARGS`` runs as ``python -m posenc.cli ARGS`` and
  ``python ARGS`` as itself, both with this Python; any other command fails the test.
  A command exits 0 unless its line ends with ``# exit status N``. Commands run with
  ``COLUMNS=80`` and ``NO_COLOR=1`` (posenc's tables are then 120 columns, uncoloured).
- Every other block (```` ```sh ````: installs and long runs; ```` ```json ````; a
  ```` ```text ```` block after prose) is shown, not run.

Shown and printed output compare after this normalisation, and nothing else:

- trailing whitespace on every line, and blank lines at the start and the end, are
  dropped on both sides;
- ``...`` in a shown line stands for any text within that line (a path under the
  temporary directory, a duration); a line that is ``...`` alone stands for any number
  of lines, none included (a table printed again);
- a page may put ``<!-- numbers within X -->`` on the line just above a block: then each
  number shown in that block's output may differ from the one printed by at most X
  (absolute), for the values that change with the CPU and its number of threads (a
  training run, a probe's fit, the last digits of float arithmetic). The rest of the
  text still compares exactly.

A page needs the packages its blocks import and its commands use (:func:`requirements`):
where one is missing the page skips, or under ``CI=true`` fails (:func:`conftest.anchor`).
A command with ``--engines NAMES`` runs those engines' own code, each in the environment
``posenc engines build`` builds in the user cache (``make engines``). Where one is
not built the command is left out and the rest of the page still runs; the test then
skips, naming what was left out, except under ``CI=true``, where a missing engine fails
it (:func:`conftest.unavailable`, as ``tests/test_rope_engines.py`` does).

``tests/test_readme.py`` runs every other page's ```` ```python ```` blocks, each on its
own; it leaves these pages to this module.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import shlex
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import anchor, one_thread, unavailable

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: the pages this module runs in order (tests/test_readme.py leaves them out)
PAGES = [
    DOCS / "getting-started.md",
    *sorted((DOCS / "tutorials").glob("*.md")),
    *sorted((DOCS / "howto").glob("*.md")),
]

FENCE = re.compile(r"^```([^\s`]*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
TOLERANCE = re.compile(r"<!--\s*numbers within\s+(\S+)\s*-->\s*$")
STATUS = re.compile(r"#\s*exit status\s+(\d+)\s*$")
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
#: seconds a command may take (a lab run, an engine's import)
COMMAND_TIMEOUT = 300


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, its text and where it starts."""

    lang: str
    text: str
    line: int  # the block's first line of code, 1-based
    before: str  # the page's text between the previous block and this one
    tolerance: float | None  # from a "numbers within X" comment just above it


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, in order."""
    text = page.read_text()
    found, end = [], 0
    for m in FENCE.finditer(text):
        before = text[end : m.start()]
        last = before.rstrip("\n").rsplit("\n", 1)[-1]
        tol = TOLERANCE.search(last)
        line = text.count("\n", 0, m.start()) + 2
        found.append(Block(m.group(1), m.group(2), line, before, tol and float(tol.group(1))))
        end = m.end()
    return found


def normalise(text: str) -> list[str]:
    """Lines without trailing whitespace, without blank lines at the start and the end."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def matches(shown: str, printed: str, tolerance: float | None = None) -> bool:
    """Whether ``printed`` is what ``shown`` shows, under the module's normalisation."""
    numbers: list[float] = []
    pattern = []
    for line in normalise(shown):
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
            continue
        pieces = []
        for piece in line.split("..."):
            if tolerance is None:
                pieces.append(re.escape(piece))
                continue
            part, at = "", 0
            for number in NUMBER.finditer(piece):
                part += re.escape(piece[at : number.start()]) + f"({NUMBER.pattern})"
                numbers.append(float(number.group()))
                at = number.end()
            pieces.append(part + re.escape(piece[at:]))
        pattern.append("[^\n]*".join(pieces) + "\n")
    text = "".join(line + "\n" for line in normalise(printed))
    found = re.fullmatch("".join(pattern), text)
    if found is None:
        return False
    if tolerance is None:
        return True
    got = [float(g) for g in found.groups()]
    return all(abs(a - b) <= tolerance for a, b in zip(numbers, got, strict=True))


def check_output(page: Path, line: int, what: str, shown: str, printed: str, tol: float | None):
    """Fail, with the difference, where ``printed`` is not what the page shows."""
    if matches(shown, printed, tol):
        return
    diff = "\n".join(
        difflib.unified_diff(
            normalise(shown), normalise(printed), "shown", "printed", lineterm="", n=2
        )
    )
    within = f" (numbers within {tol})" if tol is not None else ""
    pytest.fail(f"{page.relative_to(ROOT)}:{line}: {what} printed otherwise{within}:\n{diff}")


def commands(text: str) -> list[tuple[str, str, int]]:
    """A console block's commands: (command line, shown output, line offset in the block)."""
    found: list[tuple[str, list[str], int]] = []
    for i, line in enumerate(text.splitlines()):
        if line.startswith("$ "):
            found.append((line[2:], [], i))
        elif found:
            found[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console block: output before any command ({line!r})")
    return [(command, "\n".join(out), i) for command, out, i in found]


#: what a command's shown output needs besides posenc: its tables (rich), the lab's
#: training and figures, transformers' own reading of a config
COMMAND_NEEDS = {
    "check": ("rich",),
    "rope": ("rich", "torch", "transformers"),
    "lab": ("rich", "torch", "matplotlib"),
    "report": ("rich", "torch", "matplotlib", "mpmath", "latex2mathml"),
}


def requirements(page: Path) -> list[str]:
    """The packages a page needs: what its python blocks import, what its commands use."""
    needed: set[str] = set()
    for block in blocks(page):
        if block.lang == "python":
            for m in re.finditer(r"^\s*(?:import|from)\s+(\w+)", block.text, re.MULTILINE):
                needed.add(m.group(1))
        elif block.lang == "console":
            for command, _, _ in commands(block.text):
                argv = shlex.split(command, comments=True)
                if argv[0] == "posenc" and len(argv) > 1:
                    needed.update(COMMAND_NEEDS.get(argv[1], ()))
    return sorted(n for n in needed if n != "posenc" and n not in sys.stdlib_module_names)


def missing_engines(argv: list[str]) -> list[str]:
    """The engines a command names with ``--engines`` whose environment is not built."""
    if "--engines" not in argv:
        return []
    from posenc.integration.analysis import engines

    names = argv[argv.index("--engines") + 1].split(",")
    names = list(engines.ENGINES) if names == ["all"] else names
    return [
        f"{name} ({engines.engine_python(name)})"
        for name in names
        if not engines.engine_python(name).exists()
    ]


def run_command(command: str, cwd: Path) -> tuple[int, str, int]:
    """Run one console command: (exit status, stdout and stderr, the status it should have)."""
    status = STATUS.search(command)
    argv = shlex.split(command, comments=True)
    if argv[0] == "posenc":
        argv = [sys.executable, "-m", "posenc.cli", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    else:
        raise ValueError(f"a console block runs posenc and python only; got {command!r}")
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "PYTHONWARNINGS")}
    env |= {"COLUMNS": "80", "NO_COLOR": "1"}
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    return done.returncode, done.stdout, int(status.group(1)) if status else 0


def run_page(page: Path, cwd: Path) -> list[str]:
    """Run a page's blocks in order; return what was left out (engines not built)."""
    # the page's namespace is a module of its own in sys.modules, as a script's is:
    # torch.compile guards on a global by its module, and dataclasses look theirs up
    module = types.ModuleType(f"page_{re.sub(r'[^0-9a-zA-Z]', '_', page.stem)}")
    namespace = module.__dict__
    sys.modules[module.__name__] = module
    try:
        return _run_blocks(page, cwd, namespace)
    finally:
        del sys.modules[module.__name__]


def _run_blocks(page: Path, cwd: Path, namespace: dict[str, object]) -> list[str]:
    left_out: list[str] = []
    found = blocks(page)
    for i, block in enumerate(found):
        after = found[i + 1] if i + 1 < len(found) else None
        if block.lang == "python":
            out = io.StringIO()
            padded = "\n" * (block.line - 1) + block.text  # tracebacks show the page's lines
            # one torch thread: the pages' tensors are tiny, and on shared cores a second
            # thread mostly waits at each op's barrier (conftest.one_thread)
            with contextlib.redirect_stdout(out), one_thread():
                exec(compile(padded, str(page), "exec"), namespace)
            shown = (
                after is not None
                and after.lang == "text"
                and not TOLERANCE.sub("", after.before).strip()
            )
            if shown:
                assert after is not None
                what = f"the python block at line {block.line}"
                check_output(page, after.line, what, after.text, out.getvalue(), after.tolerance)
            elif out.getvalue().strip():
                pytest.fail(
                    f"{page.relative_to(ROOT)}:{block.line}: the block prints, and the page "
                    f"does not show it (a ```text block right after it):\n{out.getvalue()}"
                )
        elif block.lang == "console":
            for command, shown, offset in commands(block.text):
                missing = missing_engines(shlex.split(command, comments=True))
                if missing:
                    left_out.append(f"`{command}`: not built: {', '.join(missing)}")
                    continue
                status, printed, wanted = run_command(command, cwd)
                where = block.line + offset
                if status != wanted:
                    pytest.fail(
                        f"{page.relative_to(ROOT)}:{where}: `{command}` exited {status} "
                        f"(the page says {wanted}):\n{printed[-4000:]}"
                    )
                what = f"`{command}`"
                check_output(page, where, what, shown, printed, block.tolerance)
    return left_out


def test_the_pages_are_there():
    names = {p.relative_to(DOCS).as_posix() for p in PAGES}
    assert {
        "getting-started.md",
        "tutorials/yarn-llama3.md",
        "tutorials/lab-two-encodings.md",
        "tutorials/score-term.md",
    } <= names
    assert len([n for n in names if n.startswith("howto/")]) >= 5


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_page_runs_as_shown(page, tmp_path, monkeypatch):
    found = blocks(page)
    assert any(b.lang in ("python", "console") for b in found), "a page with nothing to run"
    for package in requirements(page):
        anchor(package)  # skips, or fails under CI=true, naming what is missing
    monkeypatch.chdir(tmp_path)
    left_out = run_page(page, tmp_path)
    if left_out:
        unavailable(
            "the rest of the page ran; left out: " + "; ".join(left_out),
            provided_by=".ci/run builds the engines (posenc engines build all)",
        )


# --- the runner's own rules ------------------------------------------------------------


def test_ellipsis_and_whitespace():
    assert matches("a  \nb\n\n", "\na\nb")
    assert matches("results: .../lab/results.json", "results: /tmp/x/lab/results.json")
    assert matches("head\n...\ntail", "head\ntail")
    assert matches("head\n...\ntail", "head\n1\n2\ntail")
    assert not matches("head\ntail", "head\n1\ntail")
    assert not matches("0.25", "0.26")


def test_numbers_within_a_tolerance():
    assert matches("accuracy 0.25 at 6", "accuracy 0.26 at 6", 0.05)
    assert not matches("accuracy 0.25 at 6", "accuracy 0.35 at 6", 0.05)
    assert not matches("accuracy 0.25 at 6", "accuracy 0.25 at 7", 0.5)
    assert not matches("accuracy 0.25 at 6", "precision 0.25 at 6", 0.05)
    assert matches("max err 8.60e-16 ...", "max err 9.1e-16 (x)", 1e-12)


def test_console_blocks_and_statuses(tmp_path):
    text = "$ posenc presets   # exit status 0\nvaswani\n...\n$ python -c 'print(1)'\n1\n"
    (_, a_out, _), (b, b_out, at) = commands(text)
    assert a_out == "vaswani\n..." and at == 3 and b_out == "1"
    status, printed, wanted = run_command(b, tmp_path)
    assert (status, printed, wanted) == (0, "1\n", 0)
    assert STATUS.search("posenc rope c.json --compare t.npz  # exit status 1").group(1) == "1"
    with pytest.raises(ValueError, match="posenc and python only"):
        run_command("ls", tmp_path)
