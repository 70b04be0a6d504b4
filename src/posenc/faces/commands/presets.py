"""``posenc presets``: the named conventions and where each comes from."""

from __future__ import annotations

import argparse
from typing import Any

from posenc.families.absolute.sinusoidal import PRESETS


def _presets(args: argparse.Namespace) -> int:
    for name, spec in PRESETS.items():
        fields = f"layout={spec.layout} order={spec.order} base={spec.base:g} shift={spec.shift:g}"
        print(f"{name}\n    {fields} odd={spec.odd}\n    {spec.anchor}")
    return 0


def add(sub: Any) -> None:
    """Add ``posenc presets`` to the command's subparsers."""
    presets = sub.add_parser(
        "presets",
        help="list the named conventions and their sources",
        description="List every preset with its parameters and the code or paper it reproduces.",
    )
    presets.set_defaults(run=_presets)
