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


@pytest.mark.usefixtures("compiled_kernels")
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


# What the threads claims read: the process's threads (Linux's /proc/self/task) sampled
# by a watcher thread in a tight loop while the kernels run (each call releases the
# GIL, so the watcher runs throughout), and a spy that the compiled kernels ran.
_WATCH = """
import os, sys, threading
import torch

# imported before the watcher starts, which would slow importing them (the GIL)
import posenc
import posenc.integration.attention

def tasks():
    return len(os.listdir("/proc/self/task"))

class Watch:
    def __init__(self):
        self.peak, self.stop, self.ready = 0, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        self.ready.wait()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, tasks())
            self.ready.set()

    def done(self):
        self.stop.set()
        self.thread.join()
        return max(self.peak, tasks())

def kernels():
    # the sinusoidal table, the rotation and attention forward and backward, each large
    # enough for several threads (2**18 elements and more; 64 blocks of queries),
    # through the compiled kernels, which a spy counts
    from posenc.core import angles, kernels as glue
    from posenc.families.rotary import apply
    from posenc.integration.attention import kernel as attention

    calls = []

    class Spy:
        def __getattr__(self, name):
            real = getattr(glue.compiled, name)

            def call(*args):
                calls.append(name)
                return real(*args)

            return call

    for module in (angles, apply, attention):
        module.compiled = Spy()
    try:
        posenc.sinusoidal(1 << 18, 64)
        x = torch.randn(2, 8, 2048, 64)
        c, s = posenc.Rotary(64).cos_sin(torch.arange(2048))
        apply.apply_rotary(x, c, s, backend="kernel")
        q, k, v = (torch.randn(2, 4, 512, 64, requires_grad=True) for _ in range(3))
        out = posenc.attention(q, k, v, bias=posenc.ALiBi(4), causal=True, backend="kernel")
        out.backward(torch.ones_like(out))
    finally:
        for module in (angles, apply, attention):
            module.compiled = glue.compiled
    assert set(calls) == {"table", "rotate", "attend", "attend_backward"}, calls

def torch_parallel_work():
    float(torch.exp(torch.randn(1 << 22)).sum())

def first_backward():
    # autograd starts a thread per accelerator at its first backward (none on a CPU-only
    # build): started before the count, they are not the kernels'
    torch.ones(1, requires_grad=True).sum().backward()
"""

# In the process that imported posenc: the threads before any parallel work (the main
# thread, torch's helpers, the watcher), then torch's parallel ops (its OpenMP team:
# threads - 1 more) and the kernels, before and after torch's: never a thread beyond.
_AT_MOST = """
torch.set_num_threads(threads)
first_backward()
watch = Watch()
base = tasks()
kernels()
torch_parallel_work()
kernels()
peak = watch.done()
if peak > base + threads - 1:
    sys.exit(f"{peak} threads with torch.get_num_threads() = {threads}; {base} before")
"""

# A worker forked after the parent's parallel work (torch's and posenc's, on two
# threads) sets one thread, as DataLoader does: the kernels start no thread there.
_FORKED_ONE_THREAD = """
import multiprocessing

def child(queue):
    torch.set_num_threads(1)
    first_backward()
    watch = Watch()
    base = tasks()
    kernels()
    queue.put((base, watch.done()))

torch.set_num_threads(2)
torch_parallel_work()
kernels()
ctx = multiprocessing.get_context("fork")
queue = ctx.Queue()
worker = ctx.Process(target=child, args=(queue,), daemon=True)
worker.start()
worker.join(60)
if worker.is_alive():
    worker.kill()
    sys.exit("the forked child hung")
assert worker.exitcode == 0, worker.exitcode
base, peak = queue.get(timeout=10)
if peak != base:
    sys.exit(f"the child with one thread went from {base} threads to {peak}")
"""


def _run_script(script):
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the script or its forked child hung")
    assert proc.returncode == 0, err


_LINUX = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="counts threads in /proc/self/task, which only Linux has",
)


@_LINUX
@pytest.mark.usefixtures("compiled_kernels")
@pytest.mark.parametrize("threads", [1, 2])
def test_kernels_never_run_more_threads_than_torch_is_set_to(threads):
    _run_script(f"{_WATCH}\nthreads = {threads}\n{_AT_MOST}")


@_LINUX
@pytest.mark.usefixtures("compiled_kernels")
def test_forked_child_with_one_thread_starts_none():
    _run_script(_WATCH + _FORKED_ONE_THREAD)
