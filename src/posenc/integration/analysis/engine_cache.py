"""Where the engines of ``posenc rope --engines`` live, and how they are built.

Each engine runs in a virtual environment of its own, built by its recipe: a bash
script and its pins (``engine_recipes/NAME.sh`` and ``NAME.txt``, shipped with the
package), run as ``bash NAME.sh DEST`` with ``PYTHON`` set to the Python that builds
it. The environments live in the user cache::

    $POSENC_ENGINES                    (when set)
    $XDG_CACHE_HOME/posenc/engines     (else, when XDG_CACHE_HOME is set)
    ~/.cache/posenc/engines            (else)

one directory per engine and :func:`key`, ``NAME-KEY``: the key is a hash of what
the build depends on (the recipe's and the pins' commands, comments left out, any
source the recipe compiles, the building Python's version and the machine), so a
new pin is a new directory, built anew, and an unchanged one is reused by every
checkout and install on the machine. An environment counts as built once its
``.built`` record is written and the directory renamed from ``NAME-KEY.tmp``, where
the recipe built it, to ``NAME-KEY``: a build that stopped part-way leaves only the
``.tmp`` directory, which the next build starts over (the recipes begin by removing
their destination). The environments are used where they were renamed to: posenc
runs only their ``bin/python`` (never a console script, whose first line names the
build directory), and the llama.cpp libraries find each other by ``$ORIGIN``. A lock per directory
lets two builds of the same engine (two CI runs, a ``make -j``) wait for each other
instead of writing the same files.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from posenc.core.files import atomic_write

#: The recipes (``NAME.sh`` and its pins ``NAME.txt``), shipped with the package.
RECIPES = Path(__file__).resolve().parent / "engine_recipes"
#: The environment variable that overrides the cache directory.
ENV_VAR = "POSENC_ENGINES"
#: The record a finished build writes in its directory.
MARKER = ".built"
#: The names the cache writes: an environment, its build's log, its lock, a build under way
#: or stopped (``.tmp``, never current).
_CACHED = re.compile(
    r"(?P<stem>[^/]+-[0-9a-f]{12})(\.log)?|\.(?P<locked>[^/]+-[0-9a-f]{12})\.lock|[^/]+\.tmp"
)
#: How many lines of a failed build's log its error shows.
_LOG_TAIL = 15


class Engine(Protocol):
    """What the cache reads of an engine (:class:`posenc.integration.analysis.engines.Engine`)."""

    @property
    def name(self) -> str: ...
    @property
    def recipe(self) -> Path: ...
    @property
    def pins(self) -> Path: ...
    @property
    def sources(self) -> tuple[Path, ...]: ...


def cache_root() -> Path:
    """The directory the engines are built in (``$POSENC_ENGINES``, else the user cache)."""
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "posenc" / "engines"


def _commands(path: Path) -> bytes:
    """A recipe file's lines that do something: comments and blank lines left out."""
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line.rstrip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return "\n".join(kept).encode()


def key(engine: Engine) -> str:
    """The hash that names ``engine``'s build: recipe, pins, sources, Python, machine.

    Twelve hex digits of SHA-256 over the recipe's and the pins' commands (a comment
    changes nothing), the bytes of each other input (:attr:`Engine.sources`), the
    building Python's ``major.minor`` and :func:`platform.machine`.
    """
    digest = hashlib.sha256()
    for path in (engine.recipe, engine.pins):
        digest.update(path.name.encode() + b"\0" + _commands(path) + b"\0")
    for path in engine.sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    python = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    digest.update(f"{python} {platform.machine()}".encode())
    return digest.hexdigest()[:12]


def directory(engine: Engine, root: Path | None = None) -> Path:
    """Where ``engine``'s environment is built: ``ROOT/NAME-KEY`` (it may not exist yet)."""
    return (cache_root() if root is None else root) / f"{engine.name}-{key(engine)}"


def python(engine: Engine, root: Path | None = None) -> Path:
    """``engine``'s Python in the cache: ``ROOT/NAME-KEY/bin/python`` (it may not exist)."""
    return directory(engine, root) / "bin" / "python"


def record(engine: Engine, root: Path | None = None) -> dict[str, Any] | None:
    """The ``.built`` record of ``engine``'s current build, or None where it is not built."""
    try:
        text = (directory(engine, root) / MARKER).read_text(encoding="utf-8")
        doc = json.loads(text)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True)
class Built:
    """One engine's build: where it is, whether it was built now, how long it took.

    Attributes:
        engine: the engine's name.
        path: its environment's directory.
        built_now: False where the cache already held it.
        seconds: the build's wall time (0 where it was cached).
        size: the environment's size on disk, in bytes.
    """

    engine: str
    path: Path
    built_now: bool
    seconds: float
    size: int


class BuildError(RuntimeError):
    """A recipe failed: the message names the engine, its exit status and the log's last lines."""


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created as needed) for the block."""
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def build(engine: Engine, root: Path | None = None, *, force: bool = False) -> Built:
    """Build ``engine``'s environment in the cache, unless its current key is built.

    Runs ``bash RECIPE ROOT/NAME-KEY.tmp`` with ``PYTHON`` set to this Python, its
    output in ``ROOT/NAME-KEY.log``, writes the ``.built`` record there and renames the
    directory to ``ROOT/NAME-KEY``. The recipe starts by removing whatever a stopped
    build left.

    Args:
        engine: the engine (:data:`~posenc.integration.analysis.engines.ENGINES`).
        root: the cache directory; default :func:`cache_root`.
        force: build again even where the cache holds this key.

    Raises:
        BuildError: the recipe exited non-zero (its log's last lines in the message).
        OSError: the cache directory cannot be created or written.
    """
    root = cache_root() if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    dest = directory(engine, root)
    work = dest.with_name(dest.name + ".tmp")
    log = dest.with_name(dest.name + ".log")
    with _locked(dest.with_name(f".{dest.name}.lock")):
        done = record(engine, root)
        if done is not None and not force:
            return Built(engine.name, dest, False, 0.0, int(done.get("size", 0)))
        start = time.perf_counter()
        env = {**os.environ, "PYTHON": sys.executable}
        with open(log, "wb") as out:
            status = subprocess.run(
                ["bash", str(engine.recipe), str(work)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            ).returncode  # fmt: skip
        seconds = time.perf_counter() - start
        if status != 0:
            tail = log.read_text(errors="replace").splitlines()[-_LOG_TAIL:]
            raise BuildError(
                f"{engine.name}: {engine.recipe.name} exited with status {status} after "
                f"{seconds:.0f} s; the last lines of {log}:\n" + "\n".join(tail)
            )
        size = _size(work)
        doc = {"engine": engine.name, "key": key(engine), "python": sys.version.split()[0],
               "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(seconds, 1),
               "size": size}  # fmt: skip
        with atomic_write(work / MARKER, "w") as f:
            json.dump(doc, f, indent=1)
        if dest.exists():  # --force: the old build goes only once the new one is whole
            shutil.rmtree(dest)
        os.rename(work, dest)
        return Built(engine.name, dest, True, seconds, size)


def stale(engines: Sequence[Engine], root: Path | None = None) -> list[Path]:
    """What the cache holds that no current key names: older builds, their logs and locks.

    Only names of the cache's own form (``NAME-KEY``, ``NAME-KEY.log``,
    ``.NAME-KEY.lock``) are considered; anything else in the directory is left alone.
    """
    root = cache_root() if root is None else root
    if not root.is_dir():
        return []
    current = {directory(e, root).name for e in engines}
    out = []
    for path in sorted(root.iterdir()):
        match = _CACHED.fullmatch(path.name)
        if match and (match["stem"] or match["locked"] or path.name) not in current:
            out.append(path)
    return out


def remove(paths: list[Path]) -> int:
    """Remove ``paths`` (directories whole); the bytes freed."""
    freed = 0
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            freed += _size(path)
            shutil.rmtree(path)
        else:
            freed += path.lstat().st_size
            path.unlink()
    return freed
