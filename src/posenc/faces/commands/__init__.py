"""The commands of ``posenc``, one module each: its parser and its handler.

:data:`COMMANDS` orders them as ``posenc --help`` lists them. A command's module
defines ``add(sub)``, which adds its subparser (and sets ``run``, the handler, as its
default); :mod:`.options` holds what several share. A new command is one module here
and one line in :data:`COMMANDS`.
"""

from __future__ import annotations

import importlib
from typing import Any

#: the commands, in the order ``posenc --help`` lists them
COMMANDS: tuple[str, ...] = (
    "table",
    "check",
    "bench",
    "presets",
    "info",
    "report",
    "lab",
    "plot",
    "rope",
    "engines",
)


def add_all(sub: Any) -> None:
    """Add every command of :data:`COMMANDS` to ``posenc``'s subparsers."""
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add(sub)
