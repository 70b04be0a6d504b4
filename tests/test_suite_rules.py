"""Rules the suite keeps for every module, set up in conftest.py, checked as a run sees them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: A Hypothesis test that writes every example it draws, and the settings it ran under.
DRAWING = """
import os

from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=30)  # the profile's other settings stand
@given(st.integers(), st.floats(allow_nan=False))
def test_draws(i, x):
    with open(os.environ["DRAWN"], "a") as f:
        f.write(f"{i!r} {x!r}\\n")


def test_settings():
    now = settings.default
    with open(os.environ["DRAWN"], "a") as f:
        f.write(f"settings {now.derandomize} {now.print_blob} {now.database}\\n")
"""


def _draw(tmp_path: Path, name: str, *, ci: bool) -> tuple[subprocess.Popen[str], Path]:
    """Start one pytest run of :data:`DRAWING` with the suite's conftest.py as its plugin (a
    process of its own: conftest.py chooses the profile when it is imported)."""
    test = tmp_path / "test_drawing.py"
    test.write_text(DRAWING)
    drawn = tmp_path / f"{name}.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env |= {"DRAWN": str(drawn), "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path]),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # fmt: skip
    # -p conftest: the suite's conftest.py (on PYTHONPATH), not a copy; beside it only
    # Hypothesis's own plugin (the others, autoloaded, cost a second a run); the run sits
    # in tmp_path (its own rootdir, no cache, no example database of the suite's)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "_hypothesis_pytestplugin",
               "-p", "conftest", "-p", "no:cacheprovider", "-W", "error", str(test)]  # fmt: skip
    if ci:
        env["CI"] = "true"
    else:
        # Hypothesis itself loads a "ci" profile where it sees any CI's variable (not only
        # CI; GITHUB_ACTIONS, GITLAB_CI, ...): the local runs ask for the default profile
        command.append("--hypothesis-profile=default")
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    return process, drawn


def _drawn(started: tuple[subprocess.Popen[str], Path]) -> list[str]:
    """What a run of :func:`_draw` drew, once it passed."""
    process, drawn = started
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    return drawn.read_text().splitlines()


def test_under_ci_every_run_draws_the_same_examples(tmp_path):
    # CI=true set here, whatever this run's own environment, so the check runs everywhere;
    # the four runs at once (each in its own directory: none sees another's files)
    started = []
    try:
        for name, ci in (("ci-1", True), ("ci-2", True), ("local-1", False), ("local-2", False)):
            (tmp_path / name).mkdir()
            started.append(_draw(tmp_path / name, name, ci=ci))
        first, second, third, fourth = map(_drawn, started)
    finally:  # none outlives the test, even when one failed
        for process, _ in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert first[-1] == "settings True True None"  # derandomize, print_blob, no database
    assert len(first) > 20 and first == second
    # the check can fail: under the default profile two runs draw different examples
    assert third[-1] != first[-1] and third[:-1] != fourth[:-1]
