"""``posenc info``: the versions, the backend of each loop, the engines found."""

from __future__ import annotations

import argparse
from typing import Any


def _info(args: argparse.Namespace) -> int:
    from posenc.faces import info

    print(info.report())
    return 0


def add(sub: Any) -> None:
    """Add ``posenc info`` to the command's subparsers."""
    info = sub.add_parser(
        "info",
        help="versions, the backend of each loop, and the engines found",
        description="Print posenc's, Python's, numpy's, torch's, triton's and transformers' "
        "versions; which backend serves each loop (the compiled C kernels, numpy or torch, "
        "Triton on CUDA) and, where the compiled kernels are missing, why; and the engines "
        "`posenc rope --engines` runs, with where each was found or looked for.",
    )
    info.set_defaults(run=_info)
