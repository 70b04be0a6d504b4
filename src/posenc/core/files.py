"""Atomic file writes: a file posenc writes is either the old one or the whole new one.

Every file written by the command line, the report, the figures and the lab
goes through :func:`atomic_write`: the content goes to a temporary file in the
target's directory, is flushed to disk (``fsync``), and only then renamed onto
the target with :func:`os.replace`, which is atomic on POSIX and Windows. A
write that fails part-way (disk full, an exception in the writer, Ctrl-C)
leaves the previous file untouched and removes the temporary one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; when the block ends, put it in ``path``'s place.

    ``with atomic_write("table.npy") as f: np.save(f, table)``. On a clean exit
    the file is flushed, fsynced and renamed onto ``path`` (replacing any
    previous file); if the block raises, the temporary file is removed, the
    previous ``path`` is left as it was, and the exception propagates. A
    symbolic link is written through, as ``open`` does. The new file gets the
    usual permissions (``0o666`` less the umask).

    Args:
        path: the file to write.
        mode: ``"wb"`` (bytes) or ``"w"`` (text, UTF-8).

    Yields:
        The open temporary file.

    Raises:
        ValueError: a mode other than ``"wb"`` or ``"w"``.
        OSError: the directory is missing or not writable, or ``path`` is a
            directory (raised by the file system, the temporary file removed).
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w'; got {mode!r}")
    target = Path(os.path.realpath(path))
    encoding = None if mode == "wb" else "utf-8"
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:  # "x": created here or refused, with the umask applied as for any new file
            f = open(tmp, mode.replace("w", "x"), encoding=encoding)
            break
        except FileExistsError:  # another writer's temporary file: draw another name
            continue
        except OSError as exc:
            raise _about(exc, path) from None
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename == str(tmp):
            raise _about(exc, path) from None
        raise
    _sync_directory(target.parent)


def _about(exc: OSError, path: str | os.PathLike[str]) -> OSError:
    """The same error, naming the file the caller asked for rather than the temporary one."""
    return type(exc)(exc.errno, exc.strerror, os.fspath(path))


def _sync_directory(directory: Path) -> None:
    """fsync the directory so the rename itself survives a crash (where the OS allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open a directory
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
