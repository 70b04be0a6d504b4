"""Forked gloo process groups for the distributed tests.

Each rank runs ``target(rank, world_size, workdir)`` in a forked process (fork: the
parent's imports and compiled kernels are reused, where spawn took about 4x longer)
and rendezvouses through a file in ``workdir``; a hung collective fails the test at
its deadline instead of hanging the suite, and no process outlives the call.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.multiprocessing as mp


def run_forked(
    target: Callable[[int, int, str], None], world_size: int, workdir: Path, *, seconds: float
) -> None:
    """Run ``world_size`` forked ranks of ``target`` and wait for them, at most ``seconds``."""
    context = mp.start_processes(
        target, args=(world_size, str(workdir)), nprocs=world_size, join=False,
        start_method="fork",
    )  # fmt: skip
    deadline = time.monotonic() + seconds
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world_size} gloo processes did not finish in {seconds} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
            with contextlib.suppress(Exception):
                process.join(5)
