#!/usr/bin/env python3
"""The wall time of ``posenc report`` at its defaults: the median of fresh processes.

Run from the repository root::

    .venv/bin/python tools/time_report.py [--runs 5] [--before SRC] [-- REPORT OPTIONS]

Each run is a new process, ``python -m posenc.cli report --out TMPDIR`` (imports,
the build, the page and every figure written, the interpreter's exit), into a fresh
temporary directory. ``--before SRC`` also times the ``src`` folder of another tree
(``git archive HEAD src | tar -x -C /tmp/before``, with the compiled kernels copied in),
run for run alternately with this checkout's, so that both see the same load. The load
average is printed beside each run: on a shared machine the times are noise unless the
cores are quiet. Not a test: a timing in a unit test fails on a busy machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(src: Path, options: list[str]) -> float:
    """Seconds of one ``posenc report`` in a new process importing posenc from ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "posenc.cli", "report", "--out", out, *options]
        start = time.perf_counter()
        subprocess.run(
            command, check=True, env=env, cwd=out, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each tree (default 5)")
    parser.add_argument("--before", type=Path, default=None, metavar="SRC",
                        help="another tree's src folder, timed alternately")  # fmt: skip
    parser.add_argument("options", nargs="*", help="posenc report's options, after --")
    args = parser.parse_args(argv)
    trees = {"this checkout": ROOT / "src"}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    times: dict[str, list[float]] = {name: [] for name in trees}
    for i in range(args.runs):
        for name, src in trees.items():
            load = os.getloadavg()[0]
            seconds = run_once(src, args.options)
            times[name].append(seconds)
            print(f"run {i + 1} {name}: {seconds:.2f} s (load average {load:.2f})", flush=True)
    for name, got in times.items():
        print(
            f"{name}: median {statistics.median(got):.2f} s "
            f"(min {min(got):.2f}, max {max(got):.2f}, {len(got)} runs)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
