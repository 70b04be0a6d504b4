"""tools/gpu_check.py (``make gpu-check``) where there is no GPU: its refusal and its parts.

The check itself runs on a GPU machine; here a stand-in ``torch`` package on
PYTHONPATH answers the interpreter's question about CUDA, so these tests take
well under a second each and never install anything.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "gpu_check.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = load()


def fake_torch(tmp_path, body):
    package = tmp_path / "fake" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(body))
    return package.parent


def run_script(tmp_path, fake, *args, **env):
    environ = {**os.environ, "PYTHONPATH": str(fake), **env}
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=60
    )


NO_CUDA = """
__version__ = "9.9-fake"
class version:
    cuda = None
class cuda:
    @staticmethod
    def is_available():
        return False
"""


def test_without_cuda_one_line_exit_0_nothing_written(tmp_path):
    fake = fake_torch(tmp_path, NO_CUDA)
    out = tmp_path / "out"
    for args, env in (((str(out),), {}), ((), {"OUT": str(out)})):
        proc = run_script(tmp_path, fake, *args, **env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.count("\n") == 1 and proc.stderr == ""
        assert proc.stdout.startswith("gpu-check: no CUDA device for ")
        assert "torch.cuda.is_available() is False" in proc.stdout and "9.9-fake" in proc.stdout
    assert not out.exists() and not (tmp_path / "gpu-check-out").exists()


def test_without_torch_one_line_exit_0(tmp_path):
    fake = fake_torch(tmp_path, "raise ImportError('no torch in this image')\n")
    proc = run_script(tmp_path, fake)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1
    assert "ImportError: no torch in this image" in proc.stdout
    assert not (tmp_path / "gpu-check-out").exists()


def test_wheels_to_install_skips_present_and_protected():
    wheels = [
        Path("gpu-wheels/liger_kernel-0.8.5-py3-none-any.whl"),
        Path("gpu-wheels/pytest-9.2.0-py3-none-any.whl"),
        Path("gpu-wheels/numpy-2.0.0-py3-none-any.whl"),
        Path("gpu-wheels/Torch_Einops_Utils-0.2.0-py3-none-any.whl"),
    ]
    installed = {"pytest": "8.3.0", "liger-kernel": None}
    chosen = gpu_check.wheels_to_install(wheels, installed)
    # the machine's pytest stays; numpy is the machine's own, whatever the folder holds
    assert [w.name for w in chosen] == [
        "liger_kernel-0.8.5-py3-none-any.whl",
        "Torch_Einops_Utils-0.2.0-py3-none-any.whl",
    ]
    assert gpu_check.normalize("Liger_Kernel") == "liger-kernel"
    assert set(gpu_check.PROTECTED) == {"torch", "triton", "transformers", "numpy"}


def test_make_gpu_wheels_pins_pure_python_wheels_of_what_the_check_needs():
    text = (ROOT / "Makefile").read_text()
    block = re.search(r"^GPU_WHEELS := \\\n((?:\t.*\n)+)", text, re.M)
    assert block is not None
    pins = block.group(1).replace("\\", " ").split()
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", p) for p in pins), pins
    names = {gpu_check.normalize(p.split("==")[0]) for p in pins}
    needed = {"pytest", "hypothesis", "sortedcontainers", "mpmath", "liger-kernel"}
    needed |= {"x-transformers", "einops", "einx", "loguru", "frozendict", "torch-einops-utils"}
    needed |= {"rotary-embedding-torch", "positional-encodings", "setuptools", "wheel"}
    assert needed <= names
    assert not names & set(gpu_check.PROTECTED)  # --no-deps everywhere; never these
    assert "--only-binary=:all: --platform any" in text and "-none-any" in text
    assert "/gpu-wheels/" in (ROOT / ".gitignore").read_text().splitlines()


def test_step_timeouts_fit_the_budget():
    # a step gets its cap while time allows, less a reserve for each later step
    assert gpu_check.step_timeout(60, 400, 3) == 60
    assert gpu_check.step_timeout(60, 50, 2) == 50 - 2 * gpu_check.RESERVE_S
    assert gpu_check.step_timeout(60, 5, 3) == 0
    # a session's 15 device minutes: the machine's start (about 2), this run, and 4 left
    # for a second machine to start for a rerun
    assert gpu_check.BUDGET_S <= (15 - 2 - 4) * 60 - 120
    assert all(cap < gpu_check.BUDGET_S / 2 for _, _, cap in gpu_check.BENCH_STEPS)


def test_a_step_past_its_timeout_is_killed_and_later_ones_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 0.0)
    check = gpu_check.Check(tmp_path, 60.0, gpu_check.time.monotonic())
    slow = check.run("slow", [sys.executable, "-c", "import time; time.sleep(30)"], 0.5, 1)
    assert slow["status"] == "timeout" and slow["rc"] is None and slow["elapsed_s"] < 10
    echo = check.run("echo", [sys.executable, "-c", "print('{}')"], 10, 0, capture=True)
    assert (echo["status"], echo["rc"], echo["stdout"].strip()) == ("ok", 0, "{}")
    bad = check.run("bad", [sys.executable, "-c", "raise SystemExit(3)"], 10, 0)
    assert bad["status"] == "failed" and bad["rc"] == 3
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 5.0)
    check.deadline = gpu_check.time.monotonic() + 1
    late = check.run("late", [sys.executable, "-c", "pass"], 10, 0)
    assert late["status"] == "out of time" and late["rc"] is None
    check.log.close()
    log = (tmp_path / "gpu-check.log").read_text()
    assert "=== slow: timeout" in log and "=== bad: failed (rc 3" in log
    assert not list(tmp_path.glob(".*.stdout"))


def test_junit_counts(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="4" failures="1" '
        'errors="0" skipped="1" time="2.5">'
        '<testcase classname="tests.test_gpu" name="test_a"/>'
        '<testcase classname="tests.test_gpu" name="test_b"><failure message="x"/></testcase>'
        '<testcase classname="tests.test_gpu" name="test_c"><skipped/></testcase>'
        '<testcase classname="tests.test_gpu" name="test_d"/>'
        "</testsuite></testsuites>"
    )
    counts = gpu_check.junit_counts(xml)
    assert counts == {
        "tests": 4, "failed": 1, "errors": 0, "skipped": 1, "passed": 2, "time_s": 2.5,
        "not_passed": ["tests.test_gpu::test_b"],
    }  # fmt: skip


def test_pytest_modules_run_at_once_and_add_up(tmp_path, capsys):
    # each module in its own pytest process; one failure makes the status 1, a module
    # with nothing marked gpu (pytest's 5) does not
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_ok.py").write_text(
        "import pytest\n@pytest.mark.gpu\ndef test_a(): pass\ndef test_cpu(): pass\n"
    )
    (tests / "test_bad.py").write_text("import pytest\n@pytest.mark.gpu\ndef test_b(): assert 0\n")
    (tests / "test_none.py").write_text("def test_c(): pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: gpu\n")
    modules = [str(tests / n) for n in ("test_ok.py", "test_bad.py", "test_none.py")]
    assert gpu_check.pytest_modules(sys.executable, tmp_path, modules) == 1
    assert gpu_check.pytest_modules(sys.executable, tmp_path, modules[::2]) == 0
    assert "test_bad.py: rc 1" in capsys.readouterr().out
    counts = [gpu_check.junit_counts(tmp_path / gpu_check.junit_name(m)) for m in modules]
    total = gpu_check.merge_counts(counts)
    assert (total["tests"], total["passed"], total["failed"]) == (2, 1, 1)
    assert total["not_passed"] == ["tests.test_bad::test_b"]
    # each module's output is its own file, a test per line
    assert "test_ok.py::test_a PASSED" in (tmp_path / gpu_check.pytest_log(modules[0])).read_text()


def test_a_module_past_the_deadline_is_killed_and_the_others_report(tmp_path, capsys):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_ok.py").write_text("import pytest\n@pytest.mark.gpu\ndef test_a(): pass\n")
    (tests / "test_slow.py").write_text(
        "import time, pytest\n@pytest.mark.gpu\ndef test_quick(): pass\n"
        "@pytest.mark.gpu\ndef test_slow(): time.sleep(60)\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: gpu\n")
    modules = [str(tests / n) for n in ("test_slow.py", "test_ok.py")]
    start = gpu_check.time.monotonic()
    assert gpu_check.pytest_modules(sys.executable, tmp_path, modules, timeout=8.0) == 1
    assert gpu_check.time.monotonic() - start < 30
    assert "test_slow.py: killed after 8 s" in capsys.readouterr().out
    assert not (tmp_path / gpu_check.junit_name(modules[0])).exists()
    assert gpu_check.junit_counts(tmp_path / gpu_check.junit_name(modules[1]))["passed"] == 1
    # how far the killed module got
    assert "test_quick PASSED" in (tmp_path / gpu_check.pytest_log(modules[0])).read_text()


def test_reports_are_packed_into_one_file(tmp_path):
    # the device machine sends back at most 8 files
    for name in ("a.xml", "a.log", "b.xml"):
        (tmp_path / name).write_text(name)
    packed = gpu_check.pack(tmp_path, ["a.xml", "a.log", "b.xml", "missing.log"], "r.tar.gz")
    assert packed == tmp_path / "r.tar.gz" and sorted(p.name for p in tmp_path.iterdir()) == [
        "r.tar.gz"
    ]
    with gpu_check.tarfile.open(packed) as tar:
        assert sorted(tar.getnames()) == ["a.log", "a.xml", "b.xml"]
        assert tar.extractfile("b.xml").read() == b"b.xml"
    assert gpu_check.pack(tmp_path, ["none"], "x.tar.gz") is None


def test_steps_to_rerun_are_named():
    known = ["pytest-gpu", "bench-decode", "bench-rotary-float32"]
    assert gpu_check.wanted(None, known) == set(known) == gpu_check.wanted(" ", known)
    assert gpu_check.wanted("bench-decode, pytest-gpu", known) == {"bench-decode", "pytest-gpu"}
    with pytest.raises(ValueError, match=r"names no step \['bench'\]; the steps are"):
        gpu_check.wanted("bench", known)


def test_gpu_test_files_are_the_marked_modules(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text("import pytest\npytestmark = pytest.mark.gpu\n")
    (tests / "test_b.py").write_text("import pytest\n@pytest.mark.gpu\ndef test(): pass\n")
    (tests / "test_c.py").write_text("def test_gpuish(): pass  # mark.gpus\n")
    assert gpu_check.gpu_test_files(tmp_path) == ["tests/test_a.py", "tests/test_b.py"]


@pytest.mark.parametrize("cases", [c for _, c, _ in gpu_check.BENCH_STEPS])
def test_bench_steps_name_cases_that_run_on_cuda(cases):
    from posenc import bench

    for name in cases:
        assert "cuda" in bench.CASES[name].devices


def test_the_modules_with_cuda_variants_are_selected():
    # each of these has tests (or CUDA variants of tests) marked gpu: gpu-check must
    # import it. tests/gpu_markers.py fails, on every CPU run, any test that skips for
    # lack of CUDA where gpu-check would not run it; this names the modules outright
    modules = ("gpu", "gpu_attention", "triton_rotary", "llama4", "sinusoidal")
    modules += ("attention_backward", "fox", "contextual", "path", "stick_breaking", "gpu_lab")
    assert {f"tests/test_{m}.py" for m in modules} <= set(gpu_check.gpu_test_files())


def test_a_rehearsal_without_cuda_writes_the_three_files(tmp_path):
    # the whole script, as on the GPU machine but installing nothing: two steps asked
    # for, one test module; the CUDA variants skip and the CUDA bench case is refused
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, cwd=ROOT,
        timeout=180,
        env={**os.environ, "GPU_CHECK_REHEARSAL": "1", "GPU_CHECK_BUDGET_S": "150",
             "GPU_CHECK_STEPS": "pytest-gpu,bench-decode",
             "GPU_CHECK_TESTS": "tests/test_gpu_lab.py"},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # the bench step failed
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu-check.json", "gpu-check.log", "pytest-gpu.tar.gz",
    ]  # fmt: skip
    figures = json.loads((out / "gpu-check.json").read_text())
    assert figures["steps_asked"] == ["bench-decode", "pytest-gpu"]
    assert [s["name"] for s in figures["steps"]] == ["install", "pytest-gpu", "bench-decode"]
    assert figures["failed_steps"] == ["bench-decode"]
    module = figures["pytest"]["modules"]["tests/test_gpu_lab.py"]
    assert (module["tests"], module["skipped"]) == (2, 2) and not figures["pytest"]["unreported"]
    with tarfile.open(out / "pytest-gpu.tar.gz") as tar:
        assert sorted(tar.getnames()) == [
            "pytest-gpu-test_gpu_lab.log",
            "pytest-gpu-test_gpu_lab.xml",
        ]
    assert "gpu-check: None, torch" in done.stdout.splitlines()[-1]
