"""``posenc plot``: one figure of the explainer, as PNG or SVG."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from posenc.faces.commands.options import (
    UsageError,
    int_at_least,
)
from posenc.families.absolute.sinusoidal import PRESETS


def _plot(args: argparse.Namespace) -> int:
    from posenc.faces import plot

    out = Path(args.o)
    if out.suffix not in (".png", ".svg"):
        raise UsageError(f"-o must end in .png or .svg; got {args.o!r}")
    options = {"dim": args.dim, "length": args.length, "preset": args.preset}
    options = {k: v for k, v in options.items() if v is not None}
    fig = plot.figure(args.kind, **options)
    try:
        plot.save(fig, out)
    except OSError as exc:
        raise UsageError(f"cannot write {args.o!r}: {exc.strerror}") from None
    print(out)
    return 0


def add(sub: Any) -> None:
    """Add ``posenc plot`` to the command's subparsers."""
    from posenc.faces.plot import KINDS

    pl = sub.add_parser(
        "plot",
        help="render one figure of the report to PNG or SVG",
        description=f"Render one figure. Kinds: {', '.join(KINDS)}.",
    )
    pl.add_argument("kind", choices=list(KINDS), metavar="KIND", help=f"one of: {', '.join(KINDS)}")
    pl.add_argument("-o", required=True, metavar="FILE", help="output file, .png or .svg")
    pl.add_argument("--dim", type=int_at_least(4), default=None, help="channels")
    pl.add_argument("--length", type=int_at_least(3), default=None, help="positions")
    pl.add_argument(
        "--preset",
        default=None,
        choices=sorted(PRESETS),
        metavar="NAME",
        help="sinusoidal preset (see `posenc presets`)",
    )
    pl.set_defaults(run=_plot)
