"""``posenc report``: the explainer, one HTML page."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from posenc.faces.commands.options import (
    int_at_least,
    width,
)
from posenc.families.absolute.sinusoidal import PRESETS


def _report(args: argparse.Namespace) -> int:
    from posenc.faces import report

    def say(message: str) -> None:
        print(f"posenc report: {message}", file=sys.stderr, flush=True)

    result = report.build(
        args.out,
        dim=args.dim,
        length=args.length,
        preset=args.preset,
        rope_config=args.rope_config,
        train_steps=args.train_steps,
        lab=args.lab,
        progress=say,
    )
    rows = [(s.title, k, v) for s in result.sections for k, v in s.numbers[:3]]
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="posenc report: a few of the measured numbers", title_justify="left")
        for head in ("section", "measured", "value"):
            table.add_column(head)
        last = None
        for title, k, v in rows:
            table.add_row(title if title != last else "", k, v)
            last = title
        Console(width=max(100, width())).print(table)
    except ImportError:
        for title, k, v in rows:
            print(f"{title}: {k}: {v}")
    print(
        f"report: {result.index.resolve()} ({len(result.figures)} figures, {result.seconds:.1f} s)"
    )
    return 0


def add(sub: Any) -> None:
    """Add ``posenc report`` to the command's subparsers."""
    rep = sub.add_parser(
        "report",
        help="write the explainer: one interactive HTML page that works offline",
        description="Explain positional encodings with figures, formulas, code and numbers "
        "measured now: why positions at all, the sinusoidal table and its clock hands (with "
        "a position slider and d and base controls), why exp and log, the shift rotation, "
        "adding versus concatenating, the norm sqrt(d/2), precision, learned versus "
        "sinusoidal beyond the trained length, RoPE (an explorer of q and k), context "
        "extension schedules (an explorer), ALiBi and T5, 2-D grids. Writes DIR/index.html "
        "(one file, no network needed) and every figure as PNG and SVG in DIR/figures/.",
    )
    rep.add_argument(
        "--out",
        default="posenc-report",
        metavar="DIR",
        help="output directory; default: %(default)s",
    )
    rep.add_argument(
        "--dim",
        type=int_at_least(4),
        default=512,
        help="channels (even, at most 1024); default: %(default)s",
    )
    rep.add_argument(
        "--length",
        type=int_at_least(3),
        default=50,
        help="positions: the table's rows and the slider's range (at most 128); "
        "default: %(default)s",
    )
    rep.add_argument(
        "--preset",
        default="vaswani",
        choices=sorted(PRESETS),
        metavar="NAME",
        help="sinusoidal preset (see `posenc presets`); default: %(default)s",
    )
    rep.add_argument(
        "--rope-config",
        default=None,
        metavar="FILE",
        help="a model's config.json: its RoPE schedule first in the context-extension explorer",
    )
    rep.add_argument(
        "--train-steps",
        type=int_at_least(1),
        default=300,
        metavar="N",
        help="steps of the learned-table training run; default: %(default)s, whose run is "
        "bundled with posenc and read back (another N trains a table now, a few seconds)",
    )
    rep.add_argument("--lab", default=None, metavar="DIR",
                     help="show the results of `posenc lab run --out DIR` instead of the "
                     "bundled copy and text runs")  # fmt: skip
    rep.set_defaults(run=_report)
