"""Benchmarks: posenc against the code users run today, timed in one process.

A *case* is data plus callables: a name, a full and a quick size, and a
builder that, for a size, returns the implementations to time. Each
:class:`Impl` holds a ``make`` function that imports what it needs and
returns the zero-argument callable to time, so a peer that is not installed
shows up as *skipped* (its ``make`` raises ``ImportError``) rather than as an
error. The first ``"baseline"`` implementation of a case is the memory-bound
reference (allocate and fill an array of the output's size); every other row
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

Later families add their cases with :func:`register` (rotary, biases):

    register(Case("rotary-apply", "...", build=_rotary, full={...}, quick={...}))

Nothing here imports torch or a peer at module import time.
"""

from __future__ import annotations

import functools
import gc
import io
import json
import math
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
            ``ImportError`` means "not installed" and the row is skipped.
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
        status: ``"ok"``, ``"skipped"`` (not installed) or ``"error"`` (a
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
        ValueError: ``repeat`` or ``warmup`` below 1, or a size key the case
            does not know.
        Exception: whatever posenc's own implementation or a baseline raises.
    """
    if repeat is None:
        repeat = case.quick_repeat if quick else 15
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int >= 1; got {repeat!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup must be an int >= 1; got {warmup!r}")
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


# --------------------------------------------------------------------------------------
# sinusoidal-table: the seeds' code, written out as users wrote it


def seed002_positional_encoding(
    sequence_length: int, d_model: int, dtype: Any = np.float64
) -> np.ndarray:
    """Seed 002's numpy table (a tutorial's ``positional_encoding``), optionally in float32.

    With ``dtype=np.float64`` it is the tutorial's code as published; with
    ``np.float32`` every array is float32 (faster, and inexact at large
    positions). Interleaved sin/cos, ``exp(-2i ln(1e4) / d)``.
    """
    positions = np.arange(sequence_length, dtype=dtype)[:, np.newaxis]
    div_terms = np.exp(np.arange(0, d_model, 2, dtype=dtype) * -(np.log(dtype(10000.0)) / d_model))
    pos_enc = np.zeros((sequence_length, d_model), dtype=dtype)
    pos_enc[:, 0::2] = np.sin(positions * div_terms)
    pos_enc[:, 1::2] = np.cos(positions * div_terms)
    return pos_enc


def seed000_embeddings(time: Any, dim: int) -> Any:
    """Seed 000's ``SinusoidalPositionEmbeddings.forward`` (The Annotated Diffusion Model).

    ``[sin, cos]`` halves, ``exp(-k ln(1e4) / (h - 1))``, float32 on the
    device of ``time``.
    """
    import torch

    device = time.device
    half_dim = dim // 2
    embeddings: Any = math.log(10000) / (half_dim - 1)
    embeddings = torch.exp(torch.arange(half_dim, device=device) * -embeddings)
    embeddings = time[:, None] * embeddings[None, :]
    embeddings = torch.cat((embeddings.sin(), embeddings.cos()), dim=-1)
    return embeddings


def _sinusoidal_table(length: int, dim: int) -> list[Impl]:
    shape = (length, dim)

    def np_fill() -> Callable[[], object]:
        return lambda: np.empty(shape, dtype=np.float32).fill(1.0)

    def np_full() -> Callable[[], object]:
        return lambda: np.full(shape, 1.0, dtype=np.float32)

    def torch_fill() -> Callable[[], object]:
        import torch

        return lambda: torch.empty(shape, dtype=torch.float32).fill_(1.0)

    def ours_numpy() -> Callable[[], object]:
        return lambda: posenc.sinusoidal(length, dim)

    def ours_torch() -> Callable[[], object]:
        import torch

        return lambda: posenc.sinusoidal(length, dim, dtype=torch.float32)

    def seed002_f64() -> Callable[[], object]:
        return lambda: seed002_positional_encoding(length, dim).astype(np.float32)

    def seed002_f32() -> Callable[[], object]:
        return lambda: seed002_positional_encoding(length, dim, np.float32)

    def seed000() -> Callable[[], object]:
        import torch

        time = torch.arange(length)
        return lambda: seed000_embeddings(time, dim)

    def positional_encodings() -> Callable[[], object]:
        import torch
        from positional_encodings.torch_encodings import PositionalEncoding1D

        module = PositionalEncoding1D(dim)
        x = torch.zeros((1, length, dim))

        def call() -> object:
            # it caches its output by shape: clear it so every call computes
            module.cached_penc = None
            return module(x)

        return call

    def hf_distilbert() -> Callable[[], object]:
        import torch
        from transformers.models.distilbert.modeling_distilbert import (
            create_sinusoidal_embeddings,
        )

        out = torch.empty(shape, dtype=torch.float32)
        return lambda: create_sinusoidal_embeddings(length, dim, out)

    return [
        Impl("np.empty().fill", np_fill, "baseline", "allocate + fill float32 (reference)"),
        Impl("np.full", np_full, "baseline", "allocate + fill float32"),
        Impl("torch.empty().fill_", torch_fill, "baseline", "allocate + fill float32"),
        Impl("posenc numpy", ours_numpy, "ours", "posenc.sinusoidal(n, d): exact"),
        Impl("posenc torch", ours_torch, "ours", "dtype=torch.float32: exact"),
        Impl("seed 002 numpy f64", seed002_f64, "peer", "tutorial code, float64, cast"),
        Impl("seed 002 numpy f32", seed002_f32, "peer", "same in float32: inexact"),
        Impl("seed 000 torch", seed000, "peer", "annotated diffusion: float32"),
        Impl(
            "positional-encodings",
            positional_encodings,
            "peer",
            "PositionalEncoding1D, cache cleared",
        ),
        Impl(
            "HF DistilBERT",
            hf_distilbert,
            "peer",
            "create_sinusoidal_embeddings: Python loop",
        ),
    ]


register(
    Case(
        "sinusoidal-table",
        "A float32 sinusoidal table (positions 0..n-1, d channels) against filling "
        "an array of the same size.",
        build=_sinusoidal_table,
        full={"length": 8192, "dim": 1024},
        # quick saves repetitions, not size: a smaller table sits in cache, and then
        # "fill" is no longer the memory-bound reference the ratio is meant against
        quick={"length": 8192, "dim": 1024},
    )
)


# --------------------------------------------------------------------------------------
# rotary: applying RoPE to q and k, against copying them


def _hf_rotate_half(x: Any) -> Any:
    """HF's ``rotate_half`` written out (the formula torch.compile is given)."""
    import torch

    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _hf_formula(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    return q * cos + _hf_rotate_half(q) * sin, k * cos + _hf_rotate_half(k) * sin


def _rotary(
    batch: int, heads: int, seq: int, head_dim: int, *, dtype: str, backward: bool
) -> list[Impl]:
    """Rotate q and k of ``(batch, heads, seq, head_dim)``; optionally backward too.

    With ``backward`` each row also runs ``backward()`` from a fixed upstream
    gradient into ``q.grad`` and ``k.grad`` (reset to None before each call), as
    a training step does: a fresh gradient is stored as it is, one that is
    still referenced elsewhere (clone's passes the upstream one through) is
    copied, so every row writes both gradients once.
    """
    shape = (batch, heads, seq, head_dim)

    def inputs() -> tuple[Any, Any, Any]:
        import torch

        gen = torch.Generator().manual_seed(0)
        tdtype = getattr(torch, dtype)
        q, k, g = (torch.randn(shape, generator=gen).to(tdtype) for _ in range(3))
        if backward:
            q.requires_grad_(True)
            k.requires_grad_(True)
        return q, k, g

    def timed(step: Callable[[Any, Any], tuple[Any, Any]]) -> Callable[[], object]:
        import torch

        q, k, g = inputs()
        if not backward:
            return lambda: step(q, k)

        def call() -> object:
            q.grad = k.grad = None
            a, b = step(q, k)
            torch.autograd.backward((a, b), (g, g))
            return q.grad, k.grad

        return call

    def clone() -> Callable[[], object]:
        return timed(lambda q, k: (q.clone(), k.clone()))

    def ours(layout: str) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            rope = posenc.Rotary(head_dim, layout=layout)
            return timed(rope)

        return make

    def hf_tables() -> tuple[Any, Any]:
        import torch

        rope = posenc.Rotary(head_dim)
        cos, sin = rope.cos_sin(torch.arange(seq)[None], dtype=getattr(torch, dtype))
        return cos[:, None], sin[:, None]  # (1, 1, seq, head_dim), as HF unsqueezes

    def hf() -> Callable[[], object]:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        cos, sin = hf_tables()
        return timed(lambda q, k: apply_rotary_pos_emb(q, k, cos[:, 0], sin[:, 0]))

    def hf_compiled() -> Callable[[], object]:
        import torch

        cos, sin = hf_tables()
        fn = torch.compile(_hf_formula, fullgraph=True, dynamic=False)
        call = timed(lambda q, k: fn(q, k, cos, sin))
        call()  # compile here, so that the warm-up and the run budget time the kernel
        return call

    def rotary_embedding_torch() -> Callable[[], object]:
        from rotary_embedding_torch import RotaryEmbedding

        module = RotaryEmbedding(head_dim)
        return timed(
            lambda q, k: (module.rotate_queries_or_keys(q), module.rotate_queries_or_keys(k))
        )

    def complex_multiply() -> Callable[[], object]:
        import torch

        rope = posenc.Rotary(head_dim, layout="interleaved")
        cos, sin = rope.cos_sin(torch.arange(seq))
        freqs = torch.complex(cos[:, 0::2], sin[:, 0::2])

        def step(q: Any, k: Any) -> tuple[Any, Any]:
            out = []
            for x in (q, k):
                z = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
                out.append(torch.view_as_real(z * freqs).flatten(-2).to(x.dtype))
            return out[0], out[1]

        return timed(step)

    rows = [
        Impl("q.clone(), k.clone()", clone, "baseline", f"copy both ({dtype}, reference)"),
        Impl("posenc half", ours("half"), "ours", "Rotary(layout='half'): exact tables"),
        Impl("posenc interleaved", ours("interleaved"), "ours", "layout='interleaved'"),
        Impl("HF apply_rotary_pos_emb", hf, "peer", "transformers Llama, half"),
        Impl("rotary-embedding-torch", rotary_embedding_torch, "peer", "interleaved"),
        Impl("complex multiply", complex_multiply, "peer", "Meta's formula, interleaved"),
    ]
    if not backward and dtype == "float32":
        rows.insert(4, Impl("torch.compile(HF)", hf_compiled, "peer", "HF formula, inductor"))
    return rows


for _dtype in ("float32", "bfloat16"):
    for _backward in (False, True):
        register(
            Case(
                f"rotary-{_dtype}" + ("-backward" if _backward else ""),
                f"RoPE on q and k ({_dtype}), "
                + ("forward and backward" if _backward else "forward")
                + ", against copying them.",
                build=functools.partial(_rotary, dtype=_dtype, backward=_backward),
                full={"batch": 1, "heads": 32, "seq": 2048, "head_dim": 128},
                # as for the table: quick saves repetitions, not size (memory-bound)
                quick={"batch": 1, "heads": 32, "seq": 2048, "head_dim": 128},
                quick_repeat=3,
            )
        )


# --------------------------------------------------------------------------------------
# attention-bias: attention with a positional bias, against attention with none


def _attention_bias(batch: int, heads: int, seq: int, head_dim: int) -> list[Impl]:
    """Forward attention over ``(batch, heads, seq, head_dim)`` float32 q, k, v.

    The baseline is SDPA with no bias and no mask (torch's CPU flash kernel). The
    peers add the bias the way users do today: x-transformers materialises a
    ``(heads, seq, seq)`` ALiBi bias and hands it to SDPA as a float mask;
    FlexAttention (compiled) adds it in a score mod.
    """
    shape = (batch, heads, seq, head_dim)

    def inputs() -> tuple[Any, Any, Any]:
        import torch

        gen = torch.Generator().manual_seed(0)
        return tuple(torch.randn(shape, generator=gen) for _ in range(3))  # type: ignore[return-value]

    def sdpa(causal: bool) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch
            import torch.nn.functional as F

            q, k, v = inputs()

            def call() -> object:
                with torch.no_grad():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            return call

        return make

    def ours(kind: str, causal: bool) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch

            q, k, v = inputs()
            bias = {
                "none": None,
                "alibi": posenc.ALiBi(heads, symmetric=not causal),
                "t5": posenc.T5Bias(heads),
                "kerple": posenc.KERPLE(heads),
            }[kind]

            def call() -> object:
                with torch.no_grad():
                    return posenc.attention(q, k, v, bias=bias, causal=causal)

            return call

        return make

    def materialised() -> Callable[[], object]:
        import torch
        import torch.nn.functional as F
        from x_transformers.x_transformers import AlibiPositionalBias

        q, k, v = inputs()
        alibi = AlibiPositionalBias(heads=heads, total_heads=heads)

        def call() -> object:
            with torch.no_grad():
                alibi.bias = None  # x-transformers caches the dense bias: build it each call
                mask = alibi(seq, seq)  # (heads, seq, seq) float32
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        return call

    def flex() -> Callable[[], object]:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        q, k, v = inputs()
        slopes = torch.tensor(posenc.alibi_slopes(heads), dtype=torch.float32)

        def score_mod(score: Any, b: Any, h: Any, qi: Any, ki: Any) -> Any:
            return score - slopes[h] * (qi - ki).abs()

        compiled = torch.compile(flex_attention)

        def call() -> object:
            with torch.no_grad():
                return compiled(q, k, v, score_mod=score_mod)

        call()  # compile here: the warm-up and the run budget time the kernel
        return call

    return [
        Impl("SDPA, no bias", sdpa(False), "baseline", "torch CPU flash kernel (reference)"),
        Impl("SDPA causal, no bias", sdpa(True), "baseline", "is_causal=True"),
        Impl("posenc, no bias", ours("none", False), "ours", "posenc.attention"),
        Impl("posenc ALiBi", ours("alibi", False), "ours", "symmetric, bidirectional"),
        Impl("posenc ALiBi causal", ours("alibi", True), "ours", "causal=True"),
        Impl("posenc T5", ours("t5", False), "ours", "T5Bias, bidirectional"),
        Impl("posenc KERPLE", ours("kerple", False), "ours", "KERPLE log"),
        Impl("x-transformers ALiBi", materialised, "peer", "dense bias as SDPA mask"),
        Impl("flex_attention ALiBi", flex, "peer", "compiled score_mod"),
    ]


register(
    Case(
        "attention-bias",
        "Attention with a positional bias (float32, forward), against SDPA with none; "
        "peak MiB is what one call adds.",
        build=_attention_bias,
        full={"batch": 1, "heads": 8, "seq": 8192, "head_dim": 64},
        quick={"batch": 1, "heads": 8, "seq": 2048, "head_dim": 64},
        quick_repeat=3,
        memory=True,
    )
)
