"""The compiled kernels in a forked child (a DataLoader worker): never a hang.

Each case runs in a fresh interpreter, because what matters is what the parent did
before the fork; the child there is killed after a time limit, so a regression fails
instead of hanging the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from posenc.core import kernels

# The parent runs torch's parallel ops on two threads (its OpenMP team) but no posenc
# kernel, then forks; the child sets one thread, as DataLoader workers do, and builds
# two tables large enough for the kernel's threads; the parent then builds the same.
# posenc is imported by the parent before the fork (parent=True) or only in the child.
_SCRIPT = """
import hashlib, multiprocessing, sys
import numpy as np
import torch
if {parent!r}:
    import posenc

def tables():
    import posenc

    a = posenc.sinusoidal(1 << 15, 64)
    b = posenc.SinusoidalEmbedding(512).table.numpy()
    return [hashlib.sha256(np.ascontiguousarray(t)).hexdigest() for t in (a, b)]

def child(queue):
    torch.set_num_threads(1)
    queue.put(tables())

torch.set_num_threads(2)
x = torch.randn(512, 512)
float((x @ x).sum() + torch.exp(torch.randn(1 << 22)).sum())
ctx = multiprocessing.get_context("fork")
queue = ctx.Queue()
worker = ctx.Process(target=child, args=(queue,), daemon=True)
worker.start()
worker.join(60)
if worker.is_alive():
    worker.kill()
    sys.exit("the forked child hung")
assert worker.exitcode == 0, worker.exitcode
assert queue.get(timeout=10) == tables()
"""


@pytest.mark.skipif(kernels.compiled is None, reason="posenc.core._kernels not built")
@pytest.mark.parametrize("parent", [True, False], ids=["posenc-in-parent", "posenc-in-child"])
def test_child_of_a_parent_that_ran_torch_but_no_kernel(parent):
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT.format(parent=parent)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: a time-out kills the child too
    )
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the parent or its forked child hung")
    assert proc.returncode == 0, err
