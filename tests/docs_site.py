"""The documentation site the tests read, built by Sphinx in the background.

``make docs`` and this build run the same strict command (``OPTIONS``). The suite starts
the build once its tests are collected (``conftest.pytest_collection_finish``), at a low
priority, so that it runs on whatever CPU the other tests leave idle; the ``site``
fixture of ``tests/test_docs.py`` waits for it. The explainer is not built here: the
fixture copies the session's small report into ``explainer/``, as the build would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: the strict build's options, as ``make docs`` passes them (less ``-j``)
OPTIONS = ["-b", "html", "-n", "-W", "--keep-going"]


@dataclass
class Build:
    """A started build: its process, its output folder and its log."""

    process: subprocess.Popen[bytes]
    out: Path
    log: Path

    def wait(self) -> tuple[int, str]:
        """Its exit status and everything it printed."""
        code = self.process.wait()
        return code, self.log.read_text(encoding="utf-8", errors="replace")


BUILD: list[Build] = []  # the session's one build, once started


def start() -> Build:
    """Start the build (once per session) into a fresh temporary folder."""
    if BUILD:
        return BUILD[0]
    root = Path(tempfile.mkdtemp(prefix="posenc-site-"))
    out, log = root / "html", root / "sphinx.log"
    argv = [sys.executable, "-m", "sphinx", *OPTIONS, "-j", "2", "-q",
            "-D", "posenc_explainer=none", str(DOCS), str(out)]  # fmt: skip
    with open(log, "wb") as f:
        process = subprocess.Popen(
            argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(10)
        )
    BUILD.append(Build(process, out, log))
    return BUILD[0]
