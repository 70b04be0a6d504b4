"""tests/gpu_markers.py: a test that skips for lack of CUDA must be one gpu-check runs.

The hook (imported by conftest.py) runs on every pytest run of the suite; here it
runs on a small suite of its own, in a pytest subprocess: every way a test can skip
for lack of CUDA, with and without the ``gpu`` marker, in a module
tools/gpu_check.py selects and in one it does not.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import gpu_markers

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from gpu_markers import pytest_runtest_makereport  # noqa: F401
"""

# a module gpu-check selects: its text carries the marker
MARKED = """
import pytest

NO_CUDA = pytest.mark.skipif(True, reason="no CUDA device")


@pytest.mark.gpu
@NO_CUDA
def test_skipif_marked():
    pass


@NO_CUDA
def test_skipif_unmarked():
    pass


@pytest.mark.skipif("True", reason="needs torch.cuda")
def test_string_condition_unmarked():
    pass


@pytest.fixture
def gpu_only():
    pytest.skip("no GPU here")


def test_fixture_skip_unmarked(gpu_only):
    pass


def test_body_skip_unmarked():
    pytest.skip("FlexAttention's backward needs CUDA")


@pytest.mark.gpu
def test_body_skip_marked():
    pytest.skip("FlexAttention's backward needs CUDA")


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA])]
)
def test_device_marked(device):
    pass


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=NO_CUDA)])
def test_device_unmarked(device):
    pass


@pytest.mark.skipif(True, reason="chromium is not installed")
def test_other_skip():
    pass


@pytest.mark.xfail(reason="a GPU would pass it")
def test_xfail():
    assert False
"""

# marked, but through a name: gpu-check (a text search) does not select this module
UNSELECTED = """
import pytest

gpu = getattr(pytest.mark, "g" + "pu")


@gpu
@pytest.mark.skipif(True, reason="no CUDA device")
def test_marked_elsewhere():
    pass
"""

EXPECTED = {
    "test_marked.test_skipif_marked": "skipped",
    "test_marked.test_skipif_unmarked": "error",
    "test_marked.test_string_condition_unmarked": "error",
    "test_marked.test_fixture_skip_unmarked": "error",
    "test_marked.test_body_skip_unmarked": "failure",
    "test_marked.test_body_skip_marked": "skipped",
    "test_marked.test_device_marked[cpu]": "passed",
    "test_marked.test_device_marked[cuda]": "skipped",
    "test_marked.test_device_unmarked[cpu]": "passed",
    "test_marked.test_device_unmarked[cuda]": "error",
    "test_marked.test_other_skip": "skipped",
    "test_marked.test_xfail": "skipped",  # JUnit's word for xfailed
    "test_unselected.test_marked_elsewhere": "error",
}


def outcomes(junit: Path) -> dict[str, str]:
    """Each test's outcome in pytest's JUnit report: passed, skipped, failure or error."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}.{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("skipped", "failure", "error")]
        found[name] = kinds[0] if kinds else "passed"
    return found


def test_a_cuda_skip_outside_gpu_check_fails(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs CUDA\n")
    (tests / "conftest.py").write_text(CONFTEST)
    (tests / "test_marked.py").write_text(textwrap.dedent(MARKED))
    (tests / "test_unselected.py").write_text(textwrap.dedent(UNSELECTED))
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
         f"--junitxml={junit}", "tests"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert outcomes(junit) == EXPECTED, proc.stdout
    # the failure names the test, its reason and what to do
    assert "test_skipif_unmarked skips for lack of CUDA ('no CUDA device')" in proc.stdout
    assert "it lacks the gpu marker" in proc.stdout
    assert "tools/gpu_check.py does not select its module" in proc.stdout


def test_the_reasons_it_reads():
    for reason in ("no CUDA device", "needs torch.cuda", "no GPU here", "two GPUs"):
        assert gpu_markers.CUDA_REASON.search(reason), reason
    for reason in ("chromium is not installed", "root reads any file", "gpustat", "CUDAx"):
        assert not gpu_markers.CUDA_REASON.search(reason), reason
