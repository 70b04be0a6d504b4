"""The timing harness: cases, the interleaved timing loop, peak memory, tables and JSON.

A *case* is data plus callables: a name, a full and a quick size, and a
builder that, for a size, returns the implementations to time. Each
:class:`Impl` holds a ``make`` function that imports what it needs and
returns the zero-argument callable to time, so a peer that is not installed
shows up as *skipped* (its ``make`` raises ``ImportError``) rather than as an
error, and so does a peer that cannot run here (``NotImplementedError``). The
first ``"baseline"`` implementation of a case is the memory-bound reference
(allocate and fill an array of the output's size); every other row
is reported as a ratio to its median.

The harness (:func:`run`) warms every implementation up once, then times them
**interleaved**: round ``r`` calls each implementation once, in an order that
rotates from round to round, so drift in the machine's speed (thermal,
other processes) spreads over all rows alike. It reports the median and the
minimum of the runs. An implementation slow enough that ``repeat`` runs
would exceed ``budget_s`` gets as many runs as fit (at least one; if the
warm-up call alone exceeds the budget, that call is the run): a pure-Python
loop taking seconds needs no median of 15 to show it is thousands of times
slower.

Threads: after a parallel torch op, torch's OpenMP workers keep spinning for
a while, and a numpy row that runs next on its own worker threads (posenc's
table builder) competes with them for the cores. On a 2-core machine this
makes such a row's median noisier and up to 2x slower than in isolation;
``OMP_WAIT_POLICY=PASSIVE`` in the environment removes the effect (and makes
the torch rows slightly slower). The JSON output records the variable.

The registry :data:`CASES` is filled by :mod:`posenc.faces.bench` from the
case modules, in a fixed order; :func:`register` adds one more case:

    register(Case("rotary-apply", "...", build=impls, full={...}, quick={...}))

Nothing here imports torch or a peer at module import time.
"""

from __future__ import annotations

import gc
import io
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TextIO

import numpy as np

import posenc
from posenc.core.checks import check_int

__all__ = [
    "CASES",
    "Case",
    "Impl",
    "Timing",
    "format_table",
    "peak_memory",
    "register",
    "run",
    "run_case",
    "to_json",
]

Role = Literal["baseline", "ours", "peer"]
Status = Literal["ok", "skipped", "error"]


@dataclass(frozen=True)
class Impl:
    """One row of a case: how to build the callable that is timed.

    Attributes:
        name: short label shown in the table (unique within a case).
        make: builds the zero-argument callable to time; imports live here.
            ``ImportError`` means "not installed" and the row is skipped; so does
            ``NotImplementedError`` from a peer ("unsupported here").
        role: ``"baseline"`` (memory-bound reference; the first one is the
            denominator of every ratio), ``"ours"`` (posenc) or ``"peer"``.
        note: what the row computes, in a few words.
    """

    name: str
    make: Callable[[], Callable[[], object]]
    role: Role = "peer"
    note: str = ""


@dataclass(frozen=True)
class Case:
    """A benchmark: sizes plus a builder of implementations.

    Attributes:
        name: the case's name (``posenc bench --case NAME``).
        description: one line shown above the table.
        build: ``build(**size) -> implementations``; it must not do the
            timed work itself (heavy setup belongs in each ``Impl.make``).
        full: the size used by default, e.g. ``{"length": 8192, "dim": 1024}``.
        quick: a smaller size for ``--quick``.
        quick_repeat: runs per implementation with ``--quick``.
        memory: also measure each implementation's peak memory (one more,
            untimed call; see :func:`peak_memory`).
    """

    name: str
    description: str
    build: Callable[..., Sequence[Impl]]
    full: Mapping[str, int]
    quick: Mapping[str, int]
    quick_repeat: int = 5
    memory: bool = False


@dataclass(frozen=True)
class Timing:
    """The measured result of one implementation in one case.

    Attributes:
        case: case name.
        impl: implementation name.
        role: ``"baseline"``, ``"ours"`` or ``"peer"``.
        note: the implementation's note.
        size: the size the case was built with.
        status: ``"ok"``, ``"skipped"`` (not installed, or unsupported here) or ``"error"`` (a
            peer that failed; posenc's own failures raise).
        reason: why a row was skipped or failed.
        runs: timed calls.
        median_s: median seconds per call (None unless ok).
        min_s: fastest call in seconds (None unless ok).
        ratio: ``median_s`` over the case baseline's ``median_s``.
        peak_bytes: for cases that measure memory, the peak resident memory one
            call adds above what the process held before it (None otherwise, or
            where the platform cannot tell).
        memory_ratio: ``peak_bytes`` over the baseline's.
    """

    case: str
    impl: str
    role: str
    note: str
    size: dict[str, int]
    status: Status
    reason: str = ""
    runs: int = 0
    median_s: float | None = None
    min_s: float | None = None
    ratio: float | None = None
    peak_bytes: int | None = None
    memory_ratio: float | None = None


#: The registered cases, by name, in registration order.
CASES: dict[str, Case] = {}


def register(case: Case) -> Case:
    """Add ``case`` to :data:`CASES` (its name must be new) and return it."""
    if case.name in CASES:
        raise ValueError(f"a bench case named {case.name!r} is already registered")
    if not case.full or not case.quick:
        raise ValueError(f"case {case.name!r} needs a full and a quick size")
    CASES[case.name] = case
    return case


# --------------------------------------------------------------------------------------
# progress


class _Progress:
    """Status on stderr, shown only once a case has run for more than a second.

    A daemon thread writes the latest message every half second, so a single
    call that takes long (a slow peer's warm-up) is announced while it runs;
    a terminal gets one line redrawn in place, a log a line per new message.
    """

    def __init__(self, stream: TextIO | None, interval: float = 0.5) -> None:
        self.stream = stream
        self.start = time.perf_counter()
        self.message = ""
        self.written = ""
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if stream is not None:
            self._thread = threading.Thread(
                target=self._loop, args=(interval,), name="posenc-bench-progress", daemon=True
            )
            self._thread.start()

    def __call__(self, message: str) -> None:
        self.message = message

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.flush()

    def flush(self) -> None:
        """Write the latest message if the case has run over a second and it is new."""
        message = self.message
        if self.stream is None or message == self.written:
            return
        if time.perf_counter() - self.start < 1.0:
            return
        self.stream.write(f"\r\x1b[K{message}" if self.tty else message + "\n")
        self.stream.flush()
        self.written = message

    def done(self) -> None:
        """Stop the thread and clear a redrawn line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.stream is not None and self.written and self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


# --------------------------------------------------------------------------------------
# the harness


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ImportError):
        return f"not installed ({exc.name or exc})"
    if isinstance(exc, NotImplementedError):
        return f"unsupported here: {exc}"
    return f"{type(exc).__name__}: {exc}"


_SETTLE_S = 0.005


def _measure(
    label: str,
    impls: Sequence[Impl],
    rows: dict[int, Timing],
    row: Callable[..., Timing],
    repeat: int,
    warmup: int,
    budget_s: float,
    say: _Progress,
) -> tuple[dict[int, list[float]], dict[int, Callable[[], object]]]:
    """Warm up, then time interleaved; failed or skipped rows go into ``rows``.

    Returns the times of each implementation that ran, and its callable.
    """
    # build and warm up; a peer that fails is reported, posenc failing is a bug
    fns: dict[int, Callable[[], object]] = {}
    runs: dict[int, int] = {}
    first_call: dict[int, float] = {}
    for i, impl in enumerate(impls):
        say(f"{label}: warming up {impl.name}")
        try:
            fn = impl.make()
            for w in range(warmup):
                t0 = time.perf_counter()
                fn()
                elapsed = time.perf_counter() - t0
                if w == 0:
                    first_call[i] = elapsed
                if elapsed > budget_s:
                    break
        except ImportError as exc:
            rows[i] = row(impl, "skipped", reason=_describe(exc))
            continue
        except NotImplementedError as exc:
            if impl.role != "peer":
                raise
            # a peer that says it cannot run here (FlexAttention's backward on a CPU)
            rows[i] = row(impl, "skipped", reason=_describe(exc))
            continue
        except Exception as exc:
            if impl.role != "peer":
                raise
            rows[i] = row(impl, "error", reason=_describe(exc))
            continue
        fns[i] = fn
        runs[i] = min(repeat, max(1, int(budget_s // max(first_call[i], 1e-9))))

    times: dict[int, list[float]] = {i: [] for i in fns}
    for i in fns:
        if first_call[i] > budget_s:
            times[i].append(first_call[i])
            runs[i] = 0
    rounds = max(runs.values(), default=0)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()  # a collection inside one timed call would charge it to that row
    try:
        for r in range(rounds):
            say(f"{label}: round {r + 1}/{rounds}")
            # rows still running in this round, in an order rotating with r
            order = [i for i in fns if runs[i] > r]
            shift = r % len(order)
            for i in order[shift:] + order[:shift]:
                # let the previous row's worker threads (torch's OpenMP pool spins
                # after a parallel op) go idle, so they do not compete with this row
                time.sleep(_SETTLE_S)
                t0 = time.perf_counter()
                fns[i]()
                times[i].append(time.perf_counter() - t0)
    finally:
        if enabled:
            gc.enable()
    return times, fns


def run_case(
    case: Case,
    *,
    size: Mapping[str, int] | None = None,
    quick: bool = False,
    repeat: int | None = None,
    warmup: int = 1,
    budget_s: float = 10.0,
    progress: TextIO | None = None,
) -> list[Timing]:
    """Time every implementation of ``case``, interleaved, and return one row each.

    Args:
        case: the case.
        size: the size to build (overrides ``full``/``quick``), e.g. a tiny
            size in tests.
        quick: use ``case.quick`` and ``case.quick_repeat``.
        repeat: timed runs per implementation (default 15, or the case's
            quick repeat with ``quick``).
        warmup: untimed calls per implementation before timing (>= 1: the
            first call pays imports, allocations and thread start-up).
        budget_s: time allowed for one implementation's runs: a slow one gets
            ``floor(budget_s / first call)`` runs (at least 1); one whose first
            warm-up call exceeds it is timed from that call alone.
        progress: stream for progress messages (stderr in the CLI), or None.

    Returns:
        One :class:`Timing` per implementation, in the case's order.

    Raises:
        TypeError: ``repeat`` or ``warmup`` not an int.
        ValueError: ``repeat`` or ``warmup`` below 1, or a size key the case
            does not know.
        Exception: whatever posenc's own implementation or a baseline raises.
    """
    if repeat is None:
        repeat = case.quick_repeat if quick else 15
    repeat = check_int(repeat, "repeat", minimum=1)
    warmup = check_int(warmup, "warmup", minimum=1)
    chosen = dict(case.quick if quick else case.full)
    if size is not None:
        unknown = set(size) - set(case.full)
        if unknown:
            raise ValueError(
                f"size keys {sorted(unknown)} are not used by case {case.name!r}; "
                f"it takes {sorted(case.full)}"
            )
        chosen.update(size)
    impls = list(case.build(**chosen))
    if not impls or impls[0].role != "baseline":
        raise ValueError(f"case {case.name!r} must list its baseline first")
    label = f"{case.name} {'x'.join(str(v) for v in chosen.values())}"

    def row(impl: Impl, status: Status, **kw: Any) -> Timing:
        return Timing(case.name, impl.name, impl.role, impl.note, chosen, status, **kw)

    rows: dict[int, Timing] = {}
    say = _Progress(progress)
    try:
        times, fns = _measure(label, impls, rows, row, repeat, warmup, budget_s, say)
        peaks: dict[int, int | None] = {}
        if case.memory:
            for i in fns:
                say(f"{label}: peak memory of {impls[i].name}")
                peaks[i] = peak_memory(fns[i])
    finally:
        say.done()

    base_median = base_peak = None
    for i, impl in enumerate(impls):
        if impl.role == "baseline" and i in times:
            base_median = statistics.median(times[i])
            base_peak = peaks.get(i)
            break
    for i, impl in enumerate(impls):
        if i in rows:
            continue
        median = statistics.median(times[i])
        ratio = median / base_median if base_median else None
        peak = peaks.get(i)
        rows[i] = row(
            impl, "ok", runs=len(times[i]), median_s=median, min_s=min(times[i]), ratio=ratio,
            peak_bytes=peak,
            memory_ratio=peak / base_peak if peak is not None and base_peak else None,
        )  # fmt: skip
    return [rows[i] for i in range(len(impls))]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def peak_memory(fn: Callable[[], object]) -> int | None:
    """The peak resident memory one call of ``fn`` adds above the process's level before it.

    Linux: free heap memory is first handed back (``malloc_trim``), so that the
    call's allocations show up as new resident pages; the peak counter is reset
    (``/proc/self/clear_refs``), and its value after the call, minus the
    resident size before it, is the answer, in bytes. The call's result is
    released before returning. None where the platform offers no such counter.
    """
    if not (os.path.exists("/proc/self/status") and os.access("/proc/self/clear_refs", os.W_OK)):
        return None
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident size to the current one
    before = _status_kib("VmRSS")
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    return max(0, peak - before) * 1024


def run(
    names: Iterable[str] | None = None,
    *,
    quick: bool = False,
    repeat: int | None = None,
    warmup: int = 1,
    budget_s: float = 10.0,
    progress: TextIO | None = None,
) -> list[Timing]:
    """Run the named cases (all registered cases by default), one after the other.

    Args:
        names: case names from :data:`CASES`.
        quick, repeat, warmup, budget_s, progress: as in :func:`run_case`.

    Returns:
        Every case's rows, concatenated.

    Raises:
        ValueError: an unknown case name.
    """
    chosen = list(CASES) if names is None else list(names)
    for name in chosen:
        if name not in CASES:
            raise ValueError(f"unknown bench case {name!r}; valid cases: {', '.join(CASES)}")
    out: list[Timing] = []
    for name in chosen:
        out += run_case(
            CASES[name],
            quick=quick,
            repeat=repeat,
            warmup=warmup,
            budget_s=budget_s,
            progress=progress,
        )
    return out


# --------------------------------------------------------------------------------------
# output


def environment() -> dict[str, Any]:
    """The facts a timing depends on: versions, cores, threads."""
    info: dict[str, Any] = {
        "posenc": posenc.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    for name in _THREAD_ENV:
        if name in os.environ:
            info[name] = os.environ[name]
    return info


#: Environment variables that change how thread pools share the cores.
_THREAD_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")


def to_json(timings: Sequence[Timing]) -> str:
    """The rows as JSON: ``{"environment": {...}, "results": [{case, impl, median_s, ...}]}``."""
    return json.dumps(
        {"environment": environment(), "results": [asdict(t) for t in timings]}, indent=2
    )


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.3g}" if seconds < 1 else f"{seconds * 1e3:,.0f}"


def _ratio(t: Timing) -> str:
    if t.ratio is None:
        return "-"
    return f"{t.ratio:.2f}x" if t.ratio < 10 else f"{t.ratio:,.0f}x"


def _mib(t: Timing) -> tuple[str, str]:
    if t.peak_bytes is None:
        return "-", "-"
    ratio = "-" if t.memory_ratio is None else f"{t.memory_ratio:.2f}x"
    return f"{t.peak_bytes / 2**20:,.1f}", ratio


def _table_rows(timings: Sequence[Timing], memory: bool) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for t in timings:
        mem = _mib(t) if memory else ()
        if t.status == "ok":
            runs = "" if t.runs > 1 else " (1 run)"
            cells = (t.impl, _ms(t.median_s), _ms(t.min_s), _ratio(t), *mem, t.note + runs)
        else:
            cells = (t.impl, "-", "-", t.status, *(("-", "-") if memory else ()), t.reason)
        out.append(cells)
    return out


_HEADER = ("implementation", "median ms", "min ms", "x baseline", "note")
_MEMORY_HEADER = ("peak MiB", "x baseline")


def _header(memory: bool) -> tuple[str, ...]:
    return (*_HEADER[:4], *_MEMORY_HEADER, _HEADER[4]) if memory else _HEADER


def format_table(timings: Sequence[Timing], *, use_rich: bool | None = None) -> str:
    """A human-readable table per case (rich if installed, else plain text).

    Cases that measure memory get two more columns: the peak MiB a call adds
    and its ratio to the baseline's.
    """
    cases: dict[str, list[Timing]] = {}
    for t in timings:
        cases.setdefault(t.case, []).append(t)
    if use_rich is None:
        use_rich = _has_rich()
    blocks = []
    for name, rows in cases.items():
        size = " x ".join(str(v) for v in rows[0].size.values())
        runs = max((t.runs for t in rows), default=0)
        title = f"{name} ({size}): median of {runs} interleaved runs, ratio to the first baseline"
        desc = CASES[name].description if name in CASES else ""
        memory = any(t.peak_bytes is not None for t in rows)
        render = _rich_table if use_rich else _plain
        blocks.append(render(title, desc, rows, memory))
    return "\n".join(blocks)


def _has_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _plain(title: str, description: str, rows: Sequence[Timing], memory: bool) -> str:
    header = _header(memory)
    body = [header, *_table_rows(rows, memory)]
    last = len(header) - 1
    widths = [max(len(r[c]) for r in body) for c in range(last)]
    lines = [title] + ([description] if description else [])
    for r in body:
        cells = [r[0].ljust(widths[0])] + [r[c].rjust(widths[c]) for c in range(1, last)]
        lines.append("  ".join([*cells, r[last]]).rstrip())
    return "\n".join(lines) + "\n"


def _rich_table(title: str, description: str, rows: Sequence[Timing], memory: bool) -> str:
    from rich.console import Console
    from rich.table import Table

    header = _header(memory)
    table = Table(title=title, caption=description or None, title_justify="left")
    for c, head in enumerate(header):
        table.add_column(head, justify="left" if c in (0, len(header) - 1) else "right")
    for t, cells in zip(rows, _table_rows(rows, memory), strict=True):
        style = "bold" if t.role == "ours" else ("dim" if t.role == "baseline" else None)
        table.add_row(*cells, style=style)
    console = Console(width=max(110, _terminal_width()), record=True, file=io.StringIO())
    console.print(table)
    return console.export_text(styles=False)


def _terminal_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 0
