#!/usr/bin/env python3
"""``make gpu-check``: posenc's GPU tests and CUDA benchmarks, in one offline command.

Run from the repository root with the GPU machine's own interpreter (its torch,
triton, transformers and numpy stay as they are)::

    python3 tools/gpu_check.py [OUT]        # or: make gpu-check

1. Asks that interpreter whether torch sees a CUDA device. If not (or torch is
   not importable), prints one line saying so and exits 0, writing nothing.
2. Installs, with no network and ``--no-deps`` throughout: each wheel of the
   git-ignored ``gpu-wheels/`` folder (``make gpu-wheels`` fills it) whose
   distribution the interpreter lacks, never torch, triton, transformers or
   numpy; then this checkout, ``pip install --no-build-isolation --no-deps -e .``
   (if that fails, the later steps import posenc from ``src/`` instead).
3. Runs ``pytest -m gpu`` on the test modules that carry the marker (modules
   without it are not even imported, so a module needing a package this machine
   lacks cannot stop the GPU tests), one process per module, all at once, each
   killed at a deadline inside the step's so that the others' reports survive;
   then ``posenc bench --device cuda --json --keep-going`` for the decode, rotary
   and attention-bias cases, one process per case so that one crash or timeout
   loses one case.

Every step has a timeout, and all of them fit in a budget of
``GPU_CHECK_BUDGET_S`` seconds (420 by default: a device machine allows 10 minutes
a command and 15 a session, its start included, and a machine needs 4 minutes left
to start; 7 leave time to start another for a rerun). A step that fails or times
out does not stop the later ones, and the exit status is 1 if any failed. For a
rerun, ``GPU_CHECK_STEPS`` names the steps to run (comma-separated:
``pytest-gpu``, ``bench-decode`` ...; all by default) and ``GPU_CHECK_TESTS`` the
test modules (space-separated; by default every module that carries the marker).
``GPU_CHECK_REHEARSAL=1`` runs the steps without CUDA and installs nothing (the
GPU tests skip, the CUDA bench cases fail): how this script's own tests run it.
Written into ``OUT`` (the first argument, else ``$OUT``, else
``./gpu-check-out``), three files, as the device machine sends back at most eight:

- ``gpu-check.log``: every command and its output;
- ``pytest-gpu.tar.gz``: pytest's JUnit report (``pytest-gpu-<module>.xml``) and
  output (``pytest-gpu-<module>.log``) of each GPU test module;
- ``gpu-check.json``: the figures: the machine (GPU, CUDA, versions), the
  install, each step's status and time, pytest's counts (in all and per module,
  and the modules killed before their report), and every benchmark row.

The end of the output is a summary and the benchmark tables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / "gpu-wheels"
#: The machine's own packages: a wheel for one of these is never installed.
PROTECTED = ("torch", "triton", "transformers", "numpy")
#: Seconds for the whole check: a rerun must still find 4 of the session's 15 minutes.
BUDGET_S = 420.0
#: Seconds kept for each step still to come when a step's timeout is set.
RESERVE_S = 10.0
#: Seconds for the GPU tests (their modules run at once, each mostly compiling).
PYTEST_S = 240.0
#: A step with less time than this left is not started.
MIN_STEP_S = 5.0

#: (step, cases, longest it may take in seconds): decode first (seconds), then the
#: cases whose first calls compile (inductor, FlexAttention) and take longest.
BENCH_STEPS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("bench-decode", ("decode", "decode-bfloat16"), 60),
    ("bench-rotary-float32", ("rotary-float32",), 75),
    ("bench-rotary-bfloat16", ("rotary-bfloat16",), 75),
    ("bench-rotary-float32-backward", ("rotary-float32-backward",), 75),
    ("bench-rotary-bfloat16-backward", ("rotary-bfloat16-backward",), 75),
    ("bench-attention-bias", ("attention-bias",), 120),
    ("bench-attention-bias-train", ("attention-bias-train",), 150),
)

PROBE = """
import json, platform
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
info = {"python": platform.python_version(), "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "cuda_available": bool(torch.cuda.is_available())}
if info["cuda_available"]:
    info["gpu"] = torch.cuda.get_device_name()
    info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    info["gpu_count"] = torch.cuda.device_count()
print(json.dumps(info))
"""

VERSIONS = """
import json, sys
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Liger_Kernel`` -> ``liger-kernel``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_dist(path: Path) -> str:
    """The normalized distribution name of a wheel file (its name's first field)."""
    return normalize(path.name.split("-", 1)[0])


def wheels_to_install(wheels: list[Path], installed: dict[str, str | None]) -> list[Path]:
    """The wheels whose distribution is not installed, protected ones excluded."""
    return [
        w for w in wheels if wheel_dist(w) not in PROTECTED and installed.get(wheel_dist(w)) is None
    ]


def step_timeout(cap: float, left: float, steps_after: int) -> float:
    """A step's timeout: its cap, within the time left less a reserve for each later step."""
    return max(0.0, min(cap, left - RESERVE_S * steps_after))


def junit_counts(path: Path) -> dict[str, Any]:
    """pytest's counts from its JUnit XML: tests, passed, failed, errors, skipped, time."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts: dict[str, Any] = dict.fromkeys(("tests", "failed", "errors", "skipped"), 0)
    time_s = 0.0
    for suite in suites:
        counts["tests"] += int(suite.get("tests", 0))
        counts["failed"] += int(suite.get("failures", 0))
        counts["errors"] += int(suite.get("errors", 0))
        counts["skipped"] += int(suite.get("skipped", 0))
        time_s += float(suite.get("time", 0.0))
    counts["passed"] = counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    counts["time_s"] = round(time_s, 1)
    counts["not_passed"] = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return counts


def merge_counts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts of several JUnit reports, added up."""
    total: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, [] if isinstance(value, list) else 0) + value
    if "time_s" in total:
        total["time_s"] = round(total["time_s"], 1)
    return total


def junit_name(module: str) -> str:
    """The JUnit report of one test module: ``pytest-gpu-<module>.xml``."""
    return f"pytest-gpu-{Path(module).stem}.xml"


def wait_or_kill(proc: subprocess.Popen[Any], timeout: float | None) -> int | None:
    """``proc``'s exit status, or None once it ran past ``timeout`` seconds and was
    killed with its process group (it was started in a session of its own)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended just now
            pass
        proc.wait()
        return None


def pytest_log(module: str) -> str:
    """The output of one test module's pytest: ``pytest-gpu-<module>.log``."""
    return f"pytest-gpu-{Path(module).stem}.log"


def pytest_modules(python: str, out: Path, modules: list[str], timeout: float | None = None) -> int:
    """``pytest -m gpu`` of each module in a process of its own, all at once.

    Each module's output streams into ``out/pytest-gpu-<module>.log`` (a test per line,
    so a module killed midway still shows how far it got); a module still running
    after ``timeout`` seconds is killed, the others keep their reports. Returns 0 if
    every process passed (5, nothing selected, counts as passed), else 1. Their
    outputs then go to this process's stdout, one module's after another's.
    """
    cmd = [python, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", "-rfEs"]
    start = time.monotonic()
    procs = []
    for module in modules:
        log = (out / pytest_log(module)).open("w", encoding="utf-8")
        junit = out / junit_name(module)
        proc = subprocess.Popen(
            [*cmd, f"--junitxml={junit}", module], cwd=ROOT, stdout=log,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        procs.append((module, proc, log))
    status = 0
    for module, proc, log in procs:
        left = None if timeout is None else max(0.1, start + timeout - time.monotonic())
        rc = wait_or_kill(proc, left)
        log.close()
        text = (out / pytest_log(module)).read_text(encoding="utf-8", errors="replace")
        said = f"killed after {timeout:.0f} s" if rc is None else f"rc {rc}"
        print(f"--- {module}: {said}\n{text}", flush=True)
        status |= rc not in (0, 5)
    return status


def pack(out: Path, names: list[str], archive: str) -> Path | None:
    """``names`` (files of ``out``, those that exist) moved into ``out/archive``, a tar.gz:
    the device machine sends back at most 8 files."""
    found = [out / n for n in names if (out / n).is_file()]
    if not found:
        return None
    path = out / archive
    with tarfile.open(path, "w:gz") as tar:
        for f in found:
            tar.add(f, arcname=f.name)
    for f in found:
        f.unlink()
    return path


def wanted(value: str | None, known: list[str]) -> set[str]:
    """The steps ``GPU_CHECK_STEPS`` names (comma-separated), all of ``known`` if unset.

    Raises:
        ValueError: a name that is not a step.
    """
    if not value or not value.strip():
        return set(known)
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = sorted(names - set(known))
    if unknown:
        raise ValueError(f"GPU_CHECK_STEPS names no step {unknown}; the steps are {known}")
    return names


def gpu_test_files(root: Path = ROOT) -> list[str]:
    """The test modules that use the ``gpu`` marker, relative to ``root``."""
    marked = re.compile(r"\bmark\.gpu\b")
    return [
        str(p.relative_to(root))
        for p in sorted((root / "tests").glob("test_*.py"))
        if marked.search(p.read_text(encoding="utf-8", errors="replace"))
    ]


class Log:
    """Lines to stdout and to the log file, flushed as they come."""

    def __init__(self, path: Path) -> None:
        self.file: TextIO = path.open("w", encoding="utf-8")
        self.lock = threading.Lock()

    def write(self, text: str, *, echo: bool = True) -> None:
        with self.lock:
            self.file.write(text)
            self.file.flush()
            if echo:
                sys.stdout.write(text)
                sys.stdout.flush()

    def line(self, text: str) -> None:
        self.write(text + "\n")

    def close(self) -> None:
        self.file.close()


class Check:
    """The steps, their deadline, and what they found."""

    def __init__(self, out: Path, budget_s: float, start: float) -> None:
        self.out = out
        self.start = start
        self.deadline = start + budget_s
        self.budget_s = budget_s
        self.log = Log(out / "gpu-check.log")
        self.steps: list[dict[str, Any]] = []
        self.env = dict(os.environ)
        # no network: nothing may try to reach an index or the hub and wait for it
        self.env.update(
            PIP_DISABLE_PIP_VERSION_CHECK="1",
            PIP_NO_INPUT="1",
            PIP_NO_INDEX="1",
            PIP_BREAK_SYSTEM_PACKAGES="1",  # a distribution's python3 refuses pip without it
            PIP_ROOT_USER_ACTION="ignore",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONUNBUFFERED="1",
        )

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(
        self,
        name: str,
        cmd: list[str],
        cap: float,
        steps_after: int,
        *,
        capture: bool = False,
        ok_codes: tuple[int, ...] = (0,),
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Run one step with its timeout; output to the log (stdout kept with ``capture``)."""
        timeout = step_timeout(cap, self.left(), steps_after)
        step: dict[str, Any] = {"name": name, "command": " ".join(cmd)}
        step["timeout_s"] = round(timeout, 1)
        self.log.line(f"\n=== {name}: {step['command']} (timeout {timeout:.0f} s)")
        if timeout < MIN_STEP_S:
            step.update(status="out of time", rc=None, elapsed_s=0.0)
            self.log.line(f"=== {name}: not run, out of time")
            self.steps.append(step)
            return step
        t0 = time.monotonic()
        out_path = self.out / f".{name}.stdout"
        with out_path.open("w+", encoding="utf-8") as out_file:
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**self.env, **(env or {})},
                stdout=out_file if capture else subprocess.PIPE,
                stderr=subprocess.PIPE if capture else subprocess.STDOUT,
                text=True,
                errors="replace",
                start_new_session=True,  # its own group: a timeout ends its workers too
            )
            stream = proc.stderr if capture else proc.stdout
            assert stream is not None
            reader = threading.Thread(target=self._copy, args=(stream,), daemon=True)
            reader.start()
            rc = wait_or_kill(proc, timeout)
            reader.join(timeout=10)
            stream.close()
            out_file.seek(0)
            stdout = out_file.read() if capture else ""
        out_path.unlink()
        elapsed = time.monotonic() - t0
        if rc is None:
            status = "timeout"
        else:
            status = "ok" if rc in ok_codes else "failed"
        step.update(status=status, rc=rc, elapsed_s=round(elapsed, 1))
        self.log.line(f"=== {name}: {status} (rc {rc}, {elapsed:.1f} s)")
        self.steps.append(step)
        if capture:
            step["stdout"] = stdout
        return step

    def _copy(self, stream: TextIO) -> None:
        for line in stream:
            self.log.write(line)

    def note(self, name: str, status: str, **info: Any) -> None:
        """A step the script did itself (no command)."""
        self.steps.append({"name": name, "status": status, **info})
        self.log.line(f"=== {name}: {status} {json.dumps(info) if info else ''}".rstrip())


def probe(python: str, env: dict[str, str]) -> dict[str, Any]:
    """What the interpreter's torch says about CUDA (``{"error": ...}`` if it cannot import)."""
    try:
        done = subprocess.run(
            [python, "-c", PROBE], capture_output=True, text=True, timeout=180, env=env
        )
    except subprocess.TimeoutExpired:
        return {"error": "importing torch took over 180 s"}
    try:
        info: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the probe failed (rc {done.returncode}): {tail}"}
    return info


def versions(python: str, names: list[str], env: dict[str, str]) -> dict[str, str | None]:
    done = subprocess.run(
        [python, "-c", VERSIONS, *names], capture_output=True, text=True, timeout=60, env=env
    )
    if done.returncode != 0:
        return dict.fromkeys(names)
    result: dict[str, str | None] = json.loads(done.stdout)
    return result


def install(check: Check, python: str, steps_after: int) -> dict[str, Any]:
    """The wheels this interpreter lacks, then the checkout (editable, no build isolation)."""
    wheels = sorted(WHEELS.glob("*.whl"))
    names = sorted({*PROTECTED, *(wheel_dist(w) for w in wheels), "pytest", "setuptools"})
    before = versions(python, names, check.env)
    report: dict[str, Any] = {"present_before": before}
    if not wheels:
        check.note("install-wheels", "skipped", reason=f"no wheels in {WHEELS} (make gpu-wheels)")
    else:
        missing = wheels_to_install(wheels, {normalize(k): v for k, v in before.items()})
        report["wheels_installed"] = [w.name for w in missing]
        if missing:
            cmd = [python, "-m", "pip", "install", "--no-index", "--no-deps"]
            cmd += ["--find-links", str(WHEELS), *map(str, missing)]
            check.run("install-wheels", cmd, 120, steps_after + 1)
        else:
            check.note("install-wheels", "ok", reason="every wheel's distribution is present")
    # the build takes setuptools and wheel from gpu-wheels, put beside the interpreter's
    # own for that one command: an image's setuptools may predate pyproject's license
    # string (setuptools 77), and upgrading the image's own is not this check's business
    tools = [w for w in wheels if wheel_dist(w) in ("setuptools", "wheel")]
    build_env: dict[str, str] = {}
    target = Path(tempfile.mkdtemp(prefix="posenc-build-tools-"))
    if tools:
        cmd = [python, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(target)]
        check.run("install-build-tools", [*cmd, *map(str, tools)], 60, steps_after + 1)
        build_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(target), check.env.get("PYTHONPATH", "")) if p
        )
    cmd = [python, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps"]
    step = check.run("install-posenc", [*cmd, "-e", "."], 240, steps_after, env=build_env)
    shutil.rmtree(target, ignore_errors=True)  # the editable install does not need them
    # where posenc resolves from outside the checkout (found, not imported: no numpy needed)
    where = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('posenc').origin)"],
        capture_output=True, text=True, cwd="/", env=check.env, timeout=60,
    )  # fmt: skip
    if step["status"] == "ok" and where.returncode == 0 and str(ROOT) in where.stdout:
        report["posenc"] = "editable install"
    else:
        # the checks still run, on the source tree (without the optional C kernels)
        check.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "src"), check.env.get("PYTHONPATH", "")) if p
        )
        report["posenc"] = "PYTHONPATH=src (the editable install failed)"
        check.log.line("=== posenc is imported from src/ by the later steps")
    after = versions(python, names, check.env)
    report["versions"] = after
    changed = {n: (before[n], after[n]) for n in PROTECTED if before.get(n) != after.get(n)}
    if changed:
        check.note("protected-packages", "failed", changed=changed)
    report["protected_unchanged"] = not changed
    return report


def bench_tables(rows: list[dict[str, Any]]) -> str:
    """The benchmark rows as posenc prints them (plain text)."""
    sys.path.insert(0, str(ROOT / "src"))
    try:
        from posenc.faces.bench.harness import Timing, format_table

        return format_table([Timing(**r) for r in rows], use_rich=False)
    except Exception as exc:  # the tables are a convenience: the JSON has the numbers
        return f"(no tables: {type(exc).__name__}: {exc})"


def main(argv: list[str]) -> int:
    start = time.monotonic()
    python = sys.executable
    out = Path(argv[1] if len(argv) > 1 else os.environ.get("OUT") or "gpu-check-out").resolve()
    info = probe(python, dict(os.environ))
    rehearsal = os.environ.get("GPU_CHECK_REHEARSAL") == "1"
    if not info.get("cuda_available") and not rehearsal:
        why = info.get("error") or f"torch {info.get('torch')}: torch.cuda.is_available() is False"
        print(f"gpu-check: no CUDA device for {python} ({why}); nothing to check")
        return 0

    steps = ["pytest-gpu", *(name for name, _, _ in BENCH_STEPS)]
    try:
        asked = wanted(os.environ.get("GPU_CHECK_STEPS"), steps)
    except ValueError as exc:
        print(f"gpu-check: {exc}")
        return 2
    out.mkdir(parents=True, exist_ok=True)
    budget = float(os.environ.get("GPU_CHECK_BUDGET_S", BUDGET_S))
    check = Check(out, budget, start)
    check.log.line(f"gpu-check: {python} in {ROOT}; output in {out}; budget {budget:.0f} s")
    check.log.line(f"machine: {json.dumps(info)}")
    figures: dict[str, Any] = {"machine": info, "budget_s": budget, "steps_asked": sorted(asked)}
    later = len(asked)  # the steps after the install

    if rehearsal:  # this script's own test, where there is no GPU: nothing is installed
        check.note("install", "skipped", reason="GPU_CHECK_REHEARSAL=1")
        figures["install"] = {"rehearsal": True}
    else:
        figures["install"] = install(check, python, later)

    tests = os.environ.get("GPU_CHECK_TESTS", "").split() or gpu_test_files()
    if "pytest-gpu" not in asked:
        check.note("pytest-gpu", "skipped", reason="not in GPU_CHECK_STEPS")
    elif tests:
        # one pytest per module, at once: their time is mostly compiling (inductor,
        # FlexAttention), which uses the CPUs, and the GPU work itself is small. The
        # modules get a deadline inside the step's, so that their reports are written
        inner = step_timeout(PYTEST_S, check.left(), later - 1) - 2 * RESERVE_S
        cmd = [python, str(Path(__file__).resolve()), "--pytest-modules", str(out),
               f"{max(inner, MIN_STEP_S):.0f}", *tests]  # fmt: skip
        check.run("pytest-gpu", cmd, PYTEST_S, later - 1)
        later -= 1
        modules = {}
        for t in tests:
            junit = out / junit_name(t)
            modules[t] = junit_counts(junit) if junit.exists() else {"report": "none (killed)"}
        figures["pytest"] = {"files": tests, "modules": modules}
        reports = [m for m in modules.values() if "tests" in m]
        figures["pytest"].update(merge_counts(reports))
        figures["pytest"]["unreported"] = [t for t, m in modules.items() if "tests" not in m]
        names = [junit_name(t) for t in tests] + [pytest_log(t) for t in tests]
        packed = pack(out, names, "pytest-gpu.tar.gz")
        if packed is not None:
            check.log.line(f"=== pytest-gpu: the reports and logs in {packed.name}")
    else:
        check.note("pytest-gpu", "skipped", reason="no test module uses the gpu marker")

    results: list[dict[str, Any]] = []
    environments: dict[str, Any] = {}
    for name, cases, cap in BENCH_STEPS:
        if name not in asked:
            continue
        cmd = [python, "-m", "posenc.cli", "bench", "--device", "cuda", "--json", "--keep-going"]
        for case in cases:
            cmd += ["--case", case]
        later -= 1
        step = check.run(name, cmd, cap, later, capture=True)
        text = step.pop("stdout", "")
        if not text.strip():
            continue
        try:
            doc = json.loads(text)
        except ValueError:
            check.log.line(f"=== {name}: its output is not JSON:\n{text[-4000:]}")
            continue
        results += doc["results"]
        environments[name] = doc["environment"]
        check.log.write(f"=== {name}: JSON\n{text}\n", echo=False)
    figures["bench"] = {
        "environment": next(iter(environments.values()), {}),
        "results": results,
        "rows": {s: sum(r["status"] == s for r in results) for s in ("ok", "skipped", "error")},
    }

    # a step the budget left no time for counts: the check is incomplete
    failed = [s["name"] for s in check.steps if s["status"] in ("failed", "timeout", "out of time")]
    status = 1 if failed else 0
    figures.update(
        ok=not failed,
        exit_status=status,
        elapsed_s=round(time.monotonic() - check.start, 1),
        failed_steps=failed,
        steps=check.steps,
    )
    (out / "gpu-check.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")

    if results:
        check.log.line("\n" + bench_tables(results))
    summary = figures.get("pytest", {})
    tested = (
        f"pytest {summary.get('passed', 0)} passed, {summary.get('failed', 0)} failed, "
        f"{summary.get('errors', 0)} errors, {summary.get('skipped', 0)} skipped"
        + (
            f", no report from {', '.join(summary['unreported'])}"
            if summary.get("unreported")
            else ""
        )
        if "tests" in summary
        else "pytest: no report"
    )
    rows = figures["bench"]["rows"]
    check.log.line(
        f"gpu-check: {info.get('gpu')}, torch {info.get('torch')}, CUDA {info.get('cuda')}; "
        f"{len(check.steps)} steps, failed: {', '.join(failed) or 'none'}; {tested}; bench rows "
        f"{rows['ok']} ok, {rows['error']} errors, {rows['skipped']} skipped; "
        f"{figures['elapsed_s']:.0f} s; {out}/gpu-check.json"
    )
    check.log.close()
    return status


if __name__ == "__main__":
    if sys.argv[1:2] == ["--pytest-modules"]:
        sys.exit(
            pytest_modules(sys.executable, Path(sys.argv[2]), sys.argv[4:], float(sys.argv[3]))
        )
    sys.exit(main(sys.argv))
