"""Fixtures shared by the test modules, and :func:`anchor`, the one way they import an anchor."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest
from hypothesis import settings

# a test that skips for lack of CUDA must be one `make gpu-check` runs: see gpu_markers
from gpu_markers import pytest_runtest_makereport  # noqa: F401

#: Under ``CI=true`` every Hypothesis test draws the same examples on every run
#: (``derandomize``: the seed comes from the test itself), so a failure CI saw replays
#: here; a failing example is printed with the blob ``@reproduce_failure`` takes.
#: Elsewhere the default profile explores new examples on each run.
settings.register_profile("ci", derandomize=True, print_blob=True, database=None)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")

#: How the CI install (``make test``: the ``[test]`` extra, then the Makefile's
#: NODEPS_ANCHORS with ``--no-deps``) provides each package the tests import with
#: :func:`anchor`. einops comes with x-transformers and rotary-embedding-torch.
INSTALLS = {
    "torch": 'pip install -e ".[test]"',
    "transformers": 'pip install -e ".[test]"',
    "sentencepiece": 'pip install -e ".[test]"',
    "diffusers": 'pip install -e ".[test]"',
    "positional_encodings": 'pip install -e ".[test]"',
    "x_transformers": 'pip install -e ".[test]"',
    "rotary_embedding_torch": 'pip install -e ".[test]"',
    "PoPE_pytorch": 'pip install -e ".[test]" (pope-pytorch)',
    "einops": 'pip install -e ".[test]" (x-transformers needs it)',
    "playwright": 'pip install -e ".[test]"',
    "triton": 'pip install -e ".[test]" (the fused rotary kernel, interpreted on CPU)',
    "timm": "pip install --no-deps timm==1.0.31 (the Makefile's NODEPS_ANCHORS)",
    "vit_pytorch": "pip install --no-deps vit-pytorch==1.26.11 (the Makefile's NODEPS_ANCHORS)",
    "fla-core": "pip install --no-deps --target .venv/fla-core fla-core==0.6.0 (the Makefile's "
    "FLA_CORE: on no import path, see tests/test_fla.py)",
}


def unavailable(reason: str, *, provided_by: str = "The CI install provides it") -> NoReturn:
    """Something a test needs is missing: fail under ``CI=true``, else skip saying why.

    CI provides everything the suite needs (the ``[test]`` extra, the compiled kernels,
    Debian's chromium), so there a missing piece means checks silently stopped running:
    the test fails. Elsewhere it skips with ``reason`` (``-ra`` lists it in the summary).
    Called in a test or fixture, only that test is affected; at module level (as
    :func:`anchor` may be) the whole module.
    """
    __tracebackhide__ = True
    if os.environ.get("CI") == "true":
        pytest.fail(
            f"{reason}. {provided_by}: under CI=true a missing requirement fails the run "
            "instead of skipping the tests that need it",
            pytrace=False,
        )
    pytest.skip(reason, allow_module_level=True)


def built_engine(name: str) -> Path:
    """Engine ``name``'s Python for ``posenc rope --engines`` (in the user cache): skip, or
    under ``CI=true`` fail, when ``posenc engines build`` has not built it (``.ci/run``
    does)."""
    from posenc.integration.analysis import engines

    python = engines.engine_python(name)
    if not python.exists():
        unavailable(f"{name}'s environment is not built ({python}): run `posenc engines "
                    f"build {name}`", provided_by=".ci/run builds it (make engines)")  # fmt: skip
    return python


def missing_anchor(package: str, why: str) -> NoReturn:
    """A test dependency is unavailable: fail under ``CI=true``, else skip saying why.

    The CI install provides every package in :data:`INSTALLS`, so there a missing one
    means the checks against it silently stopped running: the run fails, as it does
    for triton. Elsewhere the tests skip with the reason and the install command
    (``-ra`` lists it in the summary).
    """
    __tracebackhide__ = True  # reported at the caller's line: the module or test that needs it
    how = INSTALLS.get(package, "")
    unavailable(f"{package} {why}" + (f"; {how}" if how else ""))


def anchor(name: str) -> ModuleType:
    """Import ``name`` (a module of a test dependency) or :func:`missing_anchor`.

    Works at module level (the whole module skips or, under CI, fails to collect),
    in a fixture and in a test.
    """
    __tracebackhide__ = True
    try:
        return importlib.import_module(name)
    except ImportError as error:
        missing_anchor(name.split(".")[0], f"does not import ({error})")


@pytest.fixture
def compiled_kernels() -> ModuleType:
    """posenc's compiled kernels (``posenc.core._kernels``), or :func:`unavailable`.

    setup.py builds them with ``optional=True``: where the build fails, posenc runs
    on numpy and torch, and each test that needs the kernels skips (under ``CI=true``
    fails) on its own, saying why, while the tests around it still run.
    """
    from posenc.core import kernels

    if kernels.compiled is None:
        unavailable(
            "posenc.core._kernels is not built (setup.py goes on without it where the C "
            "build fails; `pip install -e .` with a C compiler builds it)",
            provided_by="The CI install builds it",
        )
    return kernels.compiled


@pytest.fixture(scope="module")
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' logger for a module.

    HF logs (does not warn) about rope parameters its validators do not expect,
    e.g. ``factor`` for ``proportional``, which its own init function reads; the
    modules that build HF models and configs use this to keep the output readable.
    """
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def perturbed_lab_model(config, encoding):  # type: ignore[no-untyped-def]
    """A lab model (seed 0) whose parameters are all off their initial values (zeros and
    ones included): what the lab's span, loss and probe tests run on."""
    import torch

    from posenc.faces.lab.model import LabModel

    torch.manual_seed(0)
    model = LabModel(config, encoding)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@contextlib.contextmanager
def one_thread() -> Iterator[int]:
    """torch on one intra-op thread inside the block (restored after); yields the count before.

    For tests whose tensors are tiny (the lab's, the GPU tests' CPU variants): a second
    OpenMP thread gains little on them, and where other processes share the cores every
    parallel region waits at its barrier for a thread the kernel descheduled. The lab's
    probes (thousands of small float64 ops) ran 4 to 12 times slower on 2 threads than
    on 1 on 2 loaded cores.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield before
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[int]:
    """:func:`one_thread` for a whole module (the lab's); yields the count before."""
    with one_thread() as before:
        yield before


@pytest.fixture
def torchrun_gloo() -> Callable[[list[str]], None]:
    """Run ``posenc.cli ARGV`` under torchrun: 2 gloo processes here, one thread each.

    ``--standalone``: torchrun's rendezvous store binds port 0 (the kernel picks a free
    port, which the store keeps open), and the workers' process group meets in a second
    store torchrun binds the same way and holds (torch shares it unless
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, removed from the environment here). No port
    is found free, released and bound again, as with ``--master_port`` and a port the test
    picked: another process could take it in between, and the run failed (EADDRINUSE).
    """
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "posenc.cli"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    env["OMP_NUM_THREADS"] = "1"

    def run(argv: list[str]) -> None:
        done = subprocess.run([*command, *argv], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]

    return run


@pytest.fixture
def figure_placeholders(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[str]]:
    """Have ``posenc.faces.plot.save`` write placeholders for a test, except figures kept.

    ``figure_placeholders(keep={"probes"})`` patches the save for the test and returns the
    list the kept figures' names are appended to as they are rendered for real. Every
    other figure is still drawn (its code runs) and closed, but its files hold a minimal
    SVG or the PNG signature: encoding is most of a report's build time, and
    tests/test_report.py renders and checks every figure of the explainer.
    """
    from pathlib import Path

    from posenc.faces import plot

    real_save = plot.save

    def use(keep: Iterable[str] = ()) -> list[str]:
        kept, rendered = set(keep), []

        def save(fig: Any, path: Any, *more: Any) -> Path:
            if Path(path).stem in kept:
                rendered.append(Path(path).stem)
                return real_save(fig, path, *more)
            plot.pyplot().close(fig)
            for p in (Path(path), *map(Path, more)):
                p.write_bytes(b"<svg/>" if p.suffix == ".svg" else b"\x89PNG\r\n\x1a\n")
            return Path(path)

        monkeypatch.setattr(plot, "save", save)
        return rendered

    return use


# --- a real browser (the report's and the documentation site's tests) -------------------

#: where Debian's chromium may be; Playwright's own browser download is not used
CHROMIUM = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")
#: the only URLs a page opened from file:// may load; anything else is refused
LOCAL = ("file:", "data:", "blob:", "about:")


def chromium() -> str | None:
    """The path of Debian's chromium, or None."""
    import shutil

    for name in CHROMIUM:
        found = name if os.path.isfile(name) and os.access(name, os.X_OK) else shutil.which(name)
        if found:
            return found
    return None


def chromium_executable() -> str:
    """Debian's chromium, or :func:`unavailable`: CI installs it, so there its absence
    fails the run instead of skipping every check of a page in a real browser."""
    found = chromium()
    if found is None:
        unavailable(
            f"Debian's chromium is not installed (none of {', '.join(CHROMIUM)})",
            provided_by=".ci/run installs it (apt-get install chromium)",
        )
    return found


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless chromium through Playwright, shared by the session's browser tests."""
    sync_api = anchor("playwright.sync_api")
    executable = chromium_executable()
    with sync_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=executable, headless=True)
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def small_report(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One small report (d 32, 16 positions, 20 training steps), built once per session:
    the report's browser tests read it, and the documentation site carries it, so it is
    built as the docs build builds it (``site="../"``: its names link into the site)."""
    from posenc.faces import report

    out = tmp_path_factory.mktemp("report") / "report"
    return report.build(out, dim=32, length=16, train_steps=20, site="../")


def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    """Run last the test modules that read work done in the background
    (``tests/background.py``), by when it is done."""
    import background

    last = background.modules()
    items.sort(key=lambda item: item.path.name in last)  # stable: order kept otherwise


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the background jobs of the collected test modules (``tests/background.py``):
    they work beside the other tests, on the CPU those leave idle."""
    import background

    names = {item.path.name for item in session.items}
    for job, modules in background.JOBS.items():
        if names & set(modules):
            background.start(job)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the background jobs still running if the session ends before a test read them."""
    import sys

    background = sys.modules.get("background")
    if background is not None:
        background.stop_all()
