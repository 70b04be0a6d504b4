"""tests/background.py: a job starts once per session, its failure fails the test that
reads it, and the session ends the jobs still running."""

from __future__ import annotations

import os
import sys
import time

import pytest

import background


@pytest.fixture
def jobs(monkeypatch):
    """Toy jobs in a registry of their own, none started."""
    monkeypatch.setattr(background, "COMMANDS", {})
    monkeypatch.setattr(background, "JOBS", {})
    monkeypatch.setattr(background, "STARTED", {})
    make = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(); "
        "(p / 'made').write_text('yes'); print('toy ran')"
    )
    background.register("toy", ("test_x.py",), lambda out: [sys.executable, "-c", make, str(out)])
    background.register("fails", ("test_y.py",), lambda out: [sys.executable, "-c", "exit(3)"])
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    background.register("sleeps", ("test_y.py",), lambda out: sleep)
    return background


def test_a_job_starts_once_and_is_read_when_done(jobs):
    assert jobs.start("toy") is jobs.start("toy")
    done = jobs.wait("toy")
    assert (done.out / "made").read_text() == "yes"
    assert done.wait() == (0, "toy ran\n")
    assert jobs.modules() == {"test_x.py", "test_y.py"}


def test_a_failing_job_fails_the_test_that_reads_it(jobs):
    with pytest.raises(AssertionError, match=r"'fails' failed \(exit 3\)"):
        jobs.wait("fails")


def test_the_session_ends_the_jobs_still_running(jobs):
    job = jobs.start("sleeps")
    started = time.monotonic()
    jobs.stop_all()
    assert job.process.returncode is not None and time.monotonic() - started < 10
    with pytest.raises(ProcessLookupError):
        os.killpg(job.process.pid, 0)  # nothing of its group is left
