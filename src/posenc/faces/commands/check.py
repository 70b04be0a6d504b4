"""``posenc check``: the properties people ask about, measured, PASS/FAIL."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from posenc.faces.commands.options import (
    add_spec_options,
    spec_args,
    width,
)


def _check(args: argparse.Namespace) -> int:
    from posenc.integration import analysis

    verdicts = analysis.check(args.dim, args.length, preset=args.preset, **spec_args(args))
    result = {True: "PASS", False: "FAIL", None: "SKIP"}
    rows = [(v.claim, v.measured, v.bound, result[v.passed]) for v in verdicts]
    title = f"posenc check: preset {args.preset}, dim {args.dim}, positions 0..{args.length - 1}"
    header = ("property", "measured", "bound", "result")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[c]) for r in [header, *rows]) for c in range(4)]
        print(title)
        for r in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    else:
        table = Table(title=title, title_justify="left")
        for head in header:
            table.add_column(head)
        colour = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}
        for r in rows:
            table.add_row(*r[:3], f"[{colour[r[3]]}]{r[3]}[/]")
        Console(file=sys.stdout, width=max(120, width())).print(table)
    counts = {status: sum(r[3] == status for r in rows) for status in ("PASS", "FAIL", "SKIP")}
    print(", ".join(f"{n} {status}" for status, n in counts.items() if n))
    return 1 if counts["FAIL"] else 0


def add(sub: Any) -> None:
    """Add ``posenc check`` to the command's subparsers."""
    check = sub.add_parser(
        "check",
        help="verify the shift, norm, dot-product, regression and precision properties",
        description="Measure the properties of the encoding and print each against a bound "
        "derived from float64 rounding: the shift matrix reproduces PE(p+k) from PE(p); "
        "every row has norm sqrt(d/2) (amplitude times sqrt(pairs)); PE(p).PE(p+k) depends "
        "on k only; one column is not a linear function of itself shifted but its "
        "(sin, cos) pair is; posenc's float32 values stay within half an ulp at "
        "positions 1e4, 1e6, 1e7 where the usual float32 formula errs by up to 0.7. "
        "Exit status 1 if any line fails.",
    )
    add_spec_options(check, length=50, min_length=1)
    check.set_defaults(run=_check, offset=None)
