"""``posenc bench``: posenc timed against the code users run, side by side in one process."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from posenc.faces.commands.options import (
    UsageError,
    int_at_least,
)


def _bench(args: argparse.Namespace) -> int:
    from posenc import bench

    device = args.device
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError(
                "--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is "
                "False); use --device cpu"
            )
    for name in args.case or ():
        devices = bench.CASES[name].devices
        if device not in devices:
            raise UsageError(
                f"--case {name} runs on {' and '.join(devices)} only, not --device {device}"
            )
    timings = bench.run(
        args.case,
        device=device,
        quick=args.quick,
        repeat=args.repeat,
        budget_s=3.0 if args.quick else 10.0,
        progress=sys.stderr,
        strict=not args.keep_going,
    )
    print(bench.to_json(timings) if args.json else bench.format_table(timings))
    # with --keep-going, posenc's own failures are rows: the status still says so
    failed = [t for t in timings if t.status == "error" and t.role != "peer"]
    for t in failed:
        print(f"posenc bench: {t.case}: {t.impl} failed: {t.reason}", file=sys.stderr)
    return 1 if failed else 0


def add(sub: Any) -> None:
    """Add ``posenc bench`` to the command's subparsers."""
    bench = sub.add_parser(
        "bench",
        help="time posenc against the code users run (one process, interleaved)",
        description="Time every implementation of each case interleaved in this process "
        "(warm-up, then round-robin runs) and report the median and minimum, and the "
        "ratio to the case's baseline (allocating and filling an array of the output's "
        "size). Peers that are not installed are listed as skipped. Progress goes to "
        "stderr. With --device cuda, inputs live on the GPU and every timed call ends "
        "with torch.cuda.synchronize(); cases that do not run there are left out.",
    )
    from posenc.faces.bench import CASES

    bench.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes and fewer runs (seconds rather than a minute)",
    )
    bench.add_argument(
        "--json",
        action="store_true",
        help="print machine-readable JSON (case, impl, median_s, min_s, ratio ...) instead "
        "of a table",
    )
    bench.add_argument(
        "--case",
        action="append",
        choices=list(CASES),
        metavar="NAME",
        help=f"run only this case (repeatable; cases: {', '.join(CASES)}); default: all",
    )
    bench.add_argument(
        "--repeat",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="timed runs per implementation; default: 15, or 5 with --quick",
    )
    bench.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the tensors live and the work runs; cuda needs a CUDA device "
        "(default: %(default)s)",
    )
    bench.add_argument(
        "--keep-going",
        action="store_true",
        help="report a failing posenc row or baseline as an error row and go on, as for a "
        "failing peer (exit status 1 if any did)",
    )
    bench.set_defaults(run=_bench)
