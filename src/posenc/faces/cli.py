"""The ``posenc`` command: write tables, check the properties, run the benchmarks.

Subcommands:

- ``posenc table``: write a sinusoidal table to ``.npy``, ``.pt``, ``.csv`` or ``.json``.
- ``posenc check``: measure the properties people ask about (shift, norm,
  offset-only dot products, one column vs the pair, float32 precision) and
  print PASS/FAIL against bounds derived from the arithmetic; exit 1 on a FAIL.
- ``posenc bench``: time posenc against the code users run, in one process.
- ``posenc presets``: list the named conventions and where each comes from.
- ``posenc report``: the explainer (figures and measured numbers) as one HTML file.
- ``posenc plot KIND``: any single figure of the report, as PNG or SVG.
- ``posenc rope CONFIG``: how posenc reads a model's RoPE configuration, exact
  golden tables (``--golden``), and another engine's tables checked (``--compare``,
  ``--engines``).
- ``posenc engines``: build the engines ``--engines`` runs in the user cache.

Each command is a module of :mod:`posenc.faces.commands` (its parser and its handler,
``posenc info`` and ``posenc lab ...`` among them), listed once in
:data:`posenc.faces.commands.COMMANDS`; this module holds the parser they share, the
version and the exit statuses.

Errors in the input (posenc's ``ValueError``/``TypeError``, sizes beyond
posenc's limits) and files that cannot be written (``OSError``) print one line,
``posenc: error: ...``, and exit with status 2, like argparse's own errors.
Every file is written atomically: the previous file or the whole new one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from posenc.faces import commands


class _Parser(argparse.ArgumentParser):
    """argparse, with errors on one line (``posenc report: error: ...``) and no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse's own drops an OSError; a closed stdout (--help | head -1) must reach
        # main, which ends as a Unix tool does (_stdout_closed)
        if message:
            (file or sys.stderr).write(message)


def build_parser() -> argparse.ArgumentParser:
    """The ``posenc`` argument parser with its subcommands."""
    from posenc import __version__

    parser = _Parser(
        prog="posenc",
        description="Positional encodings: exact tables, their properties, and benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_all(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``posenc`` command and return its exit status.

    Args:
        argv: the arguments after the program name (``sys.argv[1:]`` if None).

    Returns:
        0 on success, 1 when ``posenc check`` finds a failing property, 2 for
        invalid input or a file that cannot be written (the message is printed
        on one line as ``posenc: error: ...``), 141 when the reader of stdout
        closed it (``posenc presets | head -1``: see :func:`_stdout_closed`).
    """
    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, in the handler, not at the exit
    except BrokenPipeError:
        return _stdout_closed()
    return status


def _stdout_closed() -> int:
    """End quietly after the reader of stdout closed it; the exit status, 141.

    A Unix tool writing into a pipe whose reader has gone (``seq 1 1000000 | head -1``)
    is killed by SIGPIPE, prints nothing, and the shell reports 128 + 13 = 141. posenc
    ends the same way: nothing on stderr and status 141, so that a pipeline run with
    ``set -o pipefail`` still sees that the output was cut (0 would claim it was all
    read). Python ignores SIGPIPE and raises ``BrokenPipeError`` instead; stdout is
    pointed at ``/dev/null`` so that the interpreter's last flush at the exit does not
    raise again (Python's documented recipe, ``signal`` module, "Note on SIGPIPE").
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is no file (captured): nothing to do
        pass
    return 128 + 13  # 128 + SIGPIPE, as the shell reports a tool the signal ended


def _main(argv: Sequence[str] | None) -> int:
    """:func:`main` without the closed-pipe handling (a ``BrokenPipeError`` goes through)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help and argparse's own errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        return int(args.run(args))
    except BrokenPipeError:  # stdout's reader went away: main ends quietly
        raise
    except (ValueError, TypeError) as exc:
        print(f"posenc: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the file system: a missing directory, a full disk, no permission
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"posenc: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:
        why = str(exc) or "try a smaller size"
        print(f"posenc: error: out of memory ({why})", file=sys.stderr)
        return 2
    except ImportError as exc:  # an extra not installed: the error names it
        from posenc.core import extras

        print(f"posenc: error: {extras.missing(f'posenc {args.command}', exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
