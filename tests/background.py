"""Work the suite starts in the background once its tests are collected.

A job is a command that builds something a few tests read (the documentation site, the
survey of transformers' families, the explainer at its default and largest sizes, the
engine tests' batches). Each
runs at a low priority (nice 10), so that it takes the CPU the other tests leave idle
instead of holding up the suite. ``conftest.py`` starts the jobs of the test modules
it collected (:data:`JOBS`) and runs those modules last; a test waits for its job with
:func:`wait`, which starts the job first where the session did not (one test run alone).
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Job:
    """A started job: its process, its output folder and its log."""

    process: subprocess.Popen[bytes]
    out: Path
    log: Path

    def wait(self) -> tuple[int, str]:
        """Its exit status and everything it printed."""
        code = self.process.wait()
        return code, self.log.read_text(encoding="utf-8", errors="replace")


#: the jobs by name: each one's command, given the job's output folder
COMMANDS: dict[str, Callable[[Path], list[str]]] = {}
#: which test modules read which jobs (the modules conftest.py runs last)
JOBS: dict[str, tuple[str, ...]] = {}
STARTED: dict[str, Job] = {}


def register(name: str, modules: tuple[str, ...], command: Callable[[Path], list[str]]) -> None:
    """Declare job ``name``, read by the test files ``modules``; ``command(out)`` its argv."""
    COMMANDS[name] = command
    JOBS[name] = modules


def start(name: str) -> Job:
    """Start job ``name`` (once per session) into a fresh temporary folder."""
    if name in STARTED:
        return STARTED[name]
    root = Path(tempfile.mkdtemp(prefix=f"posenc-{name}-"))
    out, log = root / "out", root / "job.log"
    with open(log, "wb") as f:
        process = subprocess.Popen(
            COMMANDS[name](out), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.nice(10), start_new_session=True,  # its group: stop_all
        )  # fmt: skip
    STARTED[name] = Job(process, out, log)
    return STARTED[name]


def wait(name: str) -> Job:
    """Job ``name`` once it has ended (started here if it was not).

    Raises:
        AssertionError: the job failed; the end of its output says why.
    """
    job = start(name)
    code, log = job.wait()
    assert code == 0, f"the background job {name!r} failed (exit {code}):\n{log[-4000:]}"
    return job


def result(name: str) -> object:
    """What the function of a :func:`register_call` job returned, once it has ended."""
    with open(wait(name).out / "result.pkl", "rb") as f:
        return pickle.load(f)


def register_call(name: str, module: str, function: str) -> None:
    """Declare job ``name``: ``function()`` of test module ``module`` (a file name) run in a
    process of its own; :func:`result` reads what it returned (pickled)."""
    register(
        name,
        (module,),
        lambda out: [sys.executable, str(Path(__file__).resolve()), "--call",
                     f"{Path(module).stem}:{function}", str(out)],
    )  # fmt: skip


def stop_all() -> None:
    """End the jobs still running (the session ended before a test waited for them)."""
    for job in STARTED.values():
        if job.process.poll() is None:
            try:  # the job's process group: its own children too (sphinx -j 2's workers)
                os.killpg(job.process.pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended just now
                pass
            job.process.wait()


def modules() -> set[str]:
    """The test files that read a job: they run last."""
    return {m for files in JOBS.values() for m in files}


# --- the jobs -------------------------------------------------------------------------

#: the documentation site's strict build, as ``make docs`` runs it (less ``-j`` and the
#: explainer, which tests/test_docs.py copies from the session's small report)
DOCS_OPTIONS = ["-b", "html", "-n", "-W", "--keep-going"]
register(
    "docs-site",
    ("test_docs.py",),
    lambda out: [sys.executable, "-m", "sphinx", *DOCS_OPTIONS, "-j", "2", "-q",
                 "-D", "posenc_explainer=none", str(ROOT / "docs"), str(out)],
)  # fmt: skip
#: the sdist, and the wheel built from it, as `python -m build` makes them for a release
register(
    "wheel",
    ("test_wheel.py",),
    lambda out: [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
)
#: every transformers family checked (tests/hf_families.py's command line)
register(
    "hf-survey",
    ("test_hf_families.py",),
    lambda out: [sys.executable, str(ROOT / "tests" / "hf_families.py"), "--out", str(out)],
)
#: the explainer at its defaults, and at its largest sizes (``posenc report``'s maxima)
register(
    "report-defaults",
    ("test_report.py",),
    lambda out: [sys.executable, "-m", "posenc.cli", "report", "--out", str(out),
                 "--train-steps", "2"],
)  # fmt: skip
register(
    "report-maxima",
    ("test_report.py",),
    lambda out: [sys.executable, "-m", "posenc.cli", "report", "--out", str(out),
                 "--train-steps", "2", *_maxima()],
)  # fmt: skip


def _maxima() -> list[str]:
    from posenc.faces import report

    return ["--dim", str(report.MAX_DIM), "--length", str(report.MAX_LENGTH)]


#: the engine tests' batches: every case of a module in one child process of the engine
for _engine_module in ("test_engine_vllm.py", "test_engine_sglang.py",
                       "test_engine_llamacpp.py", "test_rope_engines.py",
                       "test_engine_kerashub.py", "test_engine_maxtext.py",
                       "test_engine_easydel.py", "test_engine_ctranslate2.py",
                       "test_engine_ortgenai.py", "test_engine_lmdeploy.py"):  # fmt: skip
    register_call(f"batch-{Path(_engine_module).stem}", _engine_module, "batch")


if __name__ == "__main__" and sys.argv[1:2] == ["--call"]:
    # a register_call job: import the test module (this folder on the path, as pytest
    # puts it), call the function, pickle what it returns
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    module_name, function_name = sys.argv[2].split(":")
    returned = getattr(importlib.import_module(module_name), function_name)()
    out = Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "result.pkl", "wb") as f:
        pickle.dump(returned, f)
