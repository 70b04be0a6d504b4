"""The timing harness: cases, the interleaved timing loop, peak memory, tables and JSON.

A *case* is data plus callables: a name, a full and a quick size, and a
builder that, for a size, returns the implementations to time. Each
:class:`Impl` holds a ``make`` function that imports what it needs and
returns the zero-argument callable to time, so a peer that is not installed
shows up as *skipped* (its ``make`` raises ``ImportError``) rather than as an
error, and so does a peer that cannot run here (``NotImplementedError``). The
first ``"baseline"`` implementation of a case is the memory-bound reference
(allocate and fill an array of the output's size); every other row
is reported as a ratio to its median. A case may also mark one row as its
*reference* (:attr:`Impl.reference`): every row then gets a second ratio, to
that row (the attention cases on CUDA mark SDPA, whose ratio says more about
attention than one to a copy does).

The harness (:func:`run`) warms every implementation up once, then times them
**interleaved**: round ``r`` calls each implementation once, in an order that
rotates from round to round, so drift in the machine's speed (thermal,
other processes) spreads over all rows alike. It reports the median and the
minimum of the runs. An implementation slow enough that ``repeat`` runs
would exceed ``budget_s`` gets as many runs as fit (at least one; if the
warm-up call alone exceeds the budget, that call is the run): a pure-Python
loop taking seconds needs no median of 15 to show it is thousands of times
slower. Calls of microseconds (one decode step) are timed ``Case.inner`` at a
time, each run's time being their mean, so that the clock's and the loop's own
cost stay small beside them.

Devices: a case lists the devices it runs on (:attr:`Case.devices`; ``"cpu"``
unless it says more) and may give other sizes for CUDA. On ``"cuda"`` the
inputs are made on the GPU and every timed call ends with
``torch.cuda.synchronize()``: the clock is the host's, so without it a row
would be charged for queueing its kernels, not for running them. Peak memory
on CUDA is the allocator's (:func:`peak_memory`). :func:`run` with no names
leaves out the cases that do not run on the chosen device, saying so on the
progress stream; naming such a case is refused (``ValueError``).

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

Role = Literal["baseline", "ours", "peer"]
Status = Literal["ok", "skipped", "error"]

#: The devices a case can run on (``posenc bench --device``).
DEVICES = ("cpu", "cuda")


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
        reference: the first row of a case marked so is a second denominator:
            every row's :attr:`Timing.reference_ratio` is its median over this
            row's (a compute-bound peer such as SDPA, where a ratio to the
            memory-bound baseline alone says little).
    """

    name: str
    make: Callable[[], Callable[[], object]]
    role: Role = "peer"
    note: str = ""
    reference: bool = False


@dataclass(frozen=True)
class Case:
    """A benchmark: sizes plus a builder of implementations.

    Attributes:
        name: the case's name (``posenc bench --case NAME``).
        description: one line shown above the table.
        build: ``build(**size) -> implementations``; a case whose ``devices``
            name more than the CPU is built as ``build(**size, device=...)``
            and makes its inputs there. It must not do the timed work itself
            (heavy setup belongs in each ``Impl.make``).
        full: the size used by default, e.g. ``{"length": 8192, "dim": 1024}``.
        quick: a smaller size for ``--quick``.
        quick_repeat: runs per implementation with ``--quick``.
        memory: also measure each implementation's peak memory (one more,
            untimed call; see :func:`peak_memory`).
        devices: the devices the case runs on, from :data:`DEVICES`.
        cuda_full: the size on CUDA (default ``full``): a GPU needs larger
            tensors than a CPU before it is bound by memory rather than by
            launching kernels.
        cuda_quick: the ``--quick`` size on CUDA (default ``quick``).
        inner: calls per timed run, whose mean is the run's time (for calls of
            microseconds; each call is still synchronized on CUDA).
    """

    name: str
    description: str
    build: Callable[..., Sequence[Impl]]
    full: Mapping[str, int]
    quick: Mapping[str, int]
    quick_repeat: int = 5
    memory: bool = False
    devices: tuple[str, ...] = ("cpu",)
    cuda_full: Mapping[str, int] | None = None
    cuda_quick: Mapping[str, int] | None = None
    inner: int = 1

    def size(self, device: str = "cpu", *, quick: bool = False) -> dict[str, int]:
        """The size the case is built with on ``device``, full or ``quick``."""
        if device == "cuda":
            chosen = self.cuda_quick if quick else self.cuda_full
            if chosen is not None:
                return dict(chosen)
        return dict(self.quick if quick else self.full)


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
        device: where it ran, ``"cpu"`` or ``"cuda"``.
        reference_ratio: ``median_s`` over the median of the case's reference
            row (:attr:`Impl.reference`), None in a case without one.
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
    device: str = "cpu"
    reference_ratio: float | None = None


#: The registered cases, by name, in registration order.
CASES: dict[str, Case] = {}


def qk_rows(
    shape: tuple[int, ...], *, backward: bool, device: str = "cpu", dtype: str = "float32"
) -> Callable[..., Callable[[], object]]:
    """The timer of the rows that turn q and k: ``timed(step, *params)`` builds the
    callable that times ``step(q, k) -> (q', k')`` on seeded q and k of ``shape``.

    Each row gets the same q and k (drawn where they are used, in ``dtype``: tensors
    of hundreds of MiB from the CPU's generator would take seconds each on the way to
    a GPU). With ``backward`` each call also runs ``backward()`` from a fixed upstream
    gradient into ``q.grad``, ``k.grad`` and each of ``params``' (reset to None before
    each call), as a training step does; the upstream gradient is drawn once per
    output shape (PoPE's outputs are twice as wide as its inputs), outside the timed
    calls after the first.
    """

    def timed(step: Callable[[Any, Any], tuple[Any, Any]], *params: Any) -> Callable[[], object]:
        import torch

        gen = torch.Generator(device=device).manual_seed(0)
        q, k = (torch.randn(shape, generator=gen, device=device).to(getattr(torch, dtype))
                for _ in range(2))  # fmt: skip
        if not backward:
            return lambda: step(q, k)
        q.requires_grad_(True)
        k.requires_grad_(True)
        upstream: dict[tuple[int, ...], Any] = {}

        def call() -> object:
            q.grad = k.grad = None
            for p in params:
                p.grad = None
            a, b = step(q, k)
            if a.shape not in upstream:
                seeded = torch.Generator(device=device).manual_seed(1)
                g = torch.randn(a.shape, generator=seeded, device=device)
                upstream[a.shape] = g.to(a.dtype)
            g = upstream[a.shape]
            torch.autograd.backward((a, b), (g, g))
            return q.grad, k.grad

        return call

    return timed


def register(case: Case) -> Case:
    """Add ``case`` to :data:`CASES` (its name must be new) and return it."""
    if case.name in CASES:
        raise ValueError(f"a bench case named {case.name!r} is already registered")
    if not case.full or not case.quick:
        raise ValueError(f"case {case.name!r} needs a full and a quick size")
    if not case.devices or not set(case.devices) <= set(DEVICES):
        raise ValueError(
            f"case {case.name!r}: devices must be some of {', '.join(DEVICES)}; "
            f"got {case.devices!r}"
        )
    for label, other in (("cuda_full", case.cuda_full), ("cuda_quick", case.cuda_quick)):
        if other is not None and set(other) != set(case.full):
            raise ValueError(
                f"case {case.name!r}: {label} must have the keys of full, {sorted(case.full)}"
            )
    check_int(case.inner, "inner", minimum=1)
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


def check_device(device: Any) -> str:
    """``device`` if it is one of :data:`DEVICES` and present here.

    Raises:
        TypeError: ``device`` not a str.
        ValueError: a name outside :data:`DEVICES`, or ``"cuda"`` where torch
            sees no CUDA device.
    """
    if not isinstance(device, str):
        raise TypeError(f"device must be a str, one of {', '.join(DEVICES)}; got {device!r}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "device='cuda' needs a CUDA device; torch.cuda.is_available() is False here"
            )
    return device


def _synchronizer(device: str) -> Callable[[], None] | None:
    """What ends every timed call on ``device``: None on the CPU, whose calls are synchronous."""
    if device == "cuda":
        import torch

        return torch.cuda.synchronize
    return None


def _release(device: str) -> None:
    """Free what a failed or finished row left behind, so that later rows find the memory.

    On CUDA a peer that ran out of memory leaves the allocator's cache full of blocks
    that the next row (another size, another dtype) may not be able to reuse.
    """
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def _measure(
    label: str,
    impls: Sequence[Impl],
    rows: dict[int, Timing],
    row: Callable[..., Timing],
    repeat: int,
    warmup: int,
    budget_s: float,
    say: _Progress,
    *,
    device: str = "cpu",
    inner: int = 1,
    strict: bool = True,
) -> tuple[dict[int, list[float]], dict[int, Callable[[], object]]]:
    """Warm up, then time interleaved; failed or skipped rows go into ``rows``.

    Each call is followed by the device's synchronize (``_synchronizer``); a
    run, warm-up runs included, is ``inner`` such calls and records their mean
    (a warm-up run stops early once it exceeds ``budget_s``). With ``strict``
    False, posenc's rows and the baselines fail into an error row as a peer does.

    Returns the times of each implementation that ran, and its callable.
    """
    sync = _synchronizer(device)
    # build and warm up; a peer that fails is reported, posenc failing is a bug
    fns: dict[int, Callable[[], object]] = {}
    runs: dict[int, int] = {}
    first_run: dict[int, float] = {}  # the first warm-up run's time per call
    for i, impl in enumerate(impls):
        say(f"{label}: warming up {impl.name}")
        fn: Callable[[], object] | None = None
        try:
            fn = impl.make()
            for w in range(warmup):
                # a whole run, so that one cold call (a table built on first use) is
                # averaged as in the timed runs rather than taken for every call's cost
                calls, t0 = 0, time.perf_counter()
                while calls < inner:
                    fn()
                    if sync is not None:
                        sync()
                    calls += 1
                    if time.perf_counter() - t0 > budget_s:
                        break
                elapsed = time.perf_counter() - t0
                if w == 0:
                    first_run[i] = elapsed / calls
                if elapsed > budget_s:
                    break
        except ImportError as exc:
            rows[i] = row(impl, "skipped", reason=_describe(exc))
        except NotImplementedError as exc:
            if impl.role != "peer" and strict:
                raise
            # a peer that says it cannot run here (FlexAttention's backward on a CPU)
            rows[i] = row(impl, "skipped", reason=_describe(exc))
        except Exception as exc:
            if impl.role != "peer" and strict:
                raise
            rows[i] = row(impl, "error", reason=_describe(exc))
        if i in rows or fn is None:
            # out of the handler, the exception's frames (and the tensors they hold) are gone
            fn = None
            _release(device)
            continue
        fns[i] = fn
        per_run = max(first_run[i] * inner, 1e-9)
        runs[i] = min(repeat, max(1, int(budget_s // per_run)))

    times: dict[int, list[float]] = {i: [] for i in fns}
    for i in fns:
        if first_run[i] * inner > budget_s:
            times[i].append(first_run[i])
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
                fn = fns[i]
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                    if sync is not None:
                        sync()
                times[i].append((time.perf_counter() - t0) / inner)
    finally:
        if enabled:
            gc.enable()
    return times, fns


def run_case(
    case: Case,
    *,
    device: str = "cpu",
    size: Mapping[str, int] | None = None,
    quick: bool = False,
    repeat: int | None = None,
    warmup: int = 1,
    budget_s: float = 10.0,
    progress: TextIO | None = None,
    strict: bool = True,
) -> list[Timing]:
    """Time every implementation of ``case``, interleaved, and return one row each.

    On ``device="cuda"`` every timed call (warm-up included) ends with
    ``torch.cuda.synchronize()``: the clock is the host's ``perf_counter``, and a
    CUDA call returns once its kernels are queued. Peak memory there is the CUDA
    allocator's (:func:`peak_memory`).

    Args:
        case: the case.
        device: ``"cpu"`` or ``"cuda"``; one of ``case.devices``.
        size: the size to build (overrides ``full``/``quick``), e.g. a tiny
            size in tests.
        quick: use the case's quick size and ``case.quick_repeat``.
        repeat: timed runs per implementation (default 15, or the case's
            quick repeat with ``quick``).
        warmup: untimed calls per implementation before timing (>= 1: the
            first call pays imports, allocations and thread start-up).
        budget_s: time allowed for one implementation's runs: a slow one gets
            ``floor(budget_s / first call)`` runs (at least 1); one whose first
            warm-up call exceeds it is timed from that call alone.
        progress: stream for progress messages (stderr in the CLI), or None.
        strict: False reports a failing posenc row or baseline as an
            ``"error"`` row with its reason, as a failing peer is, instead of
            raising (``posenc bench --keep-going``: one unattended run that
            reports all it can).

    Returns:
        One :class:`Timing` per implementation, in the case's order.

    Raises:
        TypeError: ``repeat`` or ``warmup`` not an int, ``device`` not a str.
        ValueError: ``repeat`` or ``warmup`` below 1, a size key the case
            does not know, a ``device`` the case does not run on, or ``"cuda"``
            without a CUDA device.
        Exception: with ``strict``, whatever posenc's own implementation or a
            baseline raises.
    """
    check_device(device)
    if device not in case.devices:
        raise ValueError(
            f"case {case.name!r} does not run on device={device!r}; it runs on "
            f"{', '.join(case.devices)}"
        )
    if repeat is None:
        repeat = case.quick_repeat if quick else 15
    repeat = check_int(repeat, "repeat", minimum=1)
    warmup = check_int(warmup, "warmup", minimum=1)
    chosen = case.size(device, quick=quick)
    if size is not None:
        unknown = set(size) - set(case.full)
        if unknown:
            raise ValueError(
                f"size keys {sorted(unknown)} are not used by case {case.name!r}; "
                f"it takes {sorted(case.full)}"
            )
        chosen.update(size)
    # cases written for the CPU alone take the size alone
    if case.devices == ("cpu",):
        impls = list(case.build(**chosen))
    else:
        impls = list(case.build(**chosen, device=device))
    if not impls or impls[0].role != "baseline":
        raise ValueError(f"case {case.name!r} must list its baseline first")
    label = f"{case.name} {'x'.join(str(v) for v in chosen.values())}"
    if device != "cpu":
        label += f" on {device}"

    def row(impl: Impl, status: Status, **kw: Any) -> Timing:
        return Timing(
            case.name, impl.name, impl.role, impl.note, chosen, status, device=device, **kw
        )

    rows: dict[int, Timing] = {}
    say = _Progress(progress)
    try:
        times, fns = _measure(
            label, impls, rows, row, repeat, warmup, budget_s, say,
            device=device, inner=case.inner, strict=strict,
        )  # fmt: skip
        peaks: dict[int, int | None] = {}
        if case.memory:
            for i in fns:
                say(f"{label}: peak memory of {impls[i].name}")
                try:
                    peaks[i] = peak_memory(fns[i], device=device)
                except Exception:
                    # one more call of a row that ran (a peer out of GPU memory this time):
                    # its timing stands, without a peak
                    if impls[i].role != "peer" and strict:
                        raise
                    peaks[i] = None
    finally:
        say.done()
    del fns
    _release(device)

    base_median = base_peak = ref_median = None
    for i, impl in enumerate(impls):
        if impl.role == "baseline" and i in times:
            base_median = statistics.median(times[i])
            base_peak = peaks.get(i)
            break
    for i, impl in enumerate(impls):
        if impl.reference and i in times:
            ref_median = statistics.median(times[i])
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
            reference_ratio=median / ref_median if ref_median else None,
        )  # fmt: skip
    return [rows[i] for i in range(len(impls))]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def peak_memory(fn: Callable[[], object], *, device: str = "cpu") -> int | None:
    """The peak memory one call of ``fn`` adds above what was held before it, in bytes.

    CPU, Linux: free heap memory is first handed back (``malloc_trim``), so that
    the call's allocations show up as new resident pages; the peak resident
    size is reset (``/proc/self/clear_refs``), and its value after the call,
    minus the resident size before it, is the answer. None where the platform
    offers no such counter.

    CUDA: the allocator's peak (``torch.cuda.reset_peak_memory_stats()``, then
    ``torch.cuda.max_memory_allocated()`` after the synchronized call) minus
    what was allocated before the call: tensors only, not the allocator's cache
    nor the memory a library takes outside it (cuBLAS workspaces, Triton's).

    The call's result is released before returning.
    """
    if device == "cuda":
        import torch

        gc.collect()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        result = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        del result
        return max(0, peak - before)
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
    device: str = "cpu",
    quick: bool = False,
    repeat: int | None = None,
    warmup: int = 1,
    budget_s: float = 10.0,
    progress: TextIO | None = None,
    strict: bool = True,
) -> list[Timing]:
    """Run the named cases (all that run on ``device`` by default), one after the other.

    With no ``names``, a registered case that does not run on ``device`` is
    left out, with one line on ``progress`` saying so; a named one is refused.

    Args:
        names: case names from :data:`CASES`.
        device, quick, repeat, warmup, budget_s, progress, strict: as in
            :func:`run_case`.

    Returns:
        Every case's rows, concatenated.

    Raises:
        ValueError: an unknown case name, a named case that does not run on
            ``device``, or ``"cuda"`` without a CUDA device.
        TypeError: ``device`` not a str.
    """
    check_device(device)
    if names is None:
        chosen = [name for name, case in CASES.items() if device in case.devices]
        if progress is not None:
            for name, case in CASES.items():
                if device not in case.devices:
                    progress.write(
                        f"posenc bench: {name} left out: it runs on "
                        f"{', '.join(case.devices)}, not {device}\n"
                    )
    else:
        chosen = list(names)
    for name in chosen:
        if name not in CASES:
            raise ValueError(f"unknown bench case {name!r}; valid cases: {', '.join(CASES)}")
        if device not in CASES[name].devices:
            raise ValueError(
                f"bench case {name!r} does not run on device={device!r}; it runs on "
                f"{', '.join(CASES[name].devices)}"
            )
    out: list[Timing] = []
    for name in chosen:
        out += run_case(
            CASES[name],
            device=device,
            quick=quick,
            repeat=repeat,
            warmup=warmup,
            budget_s=budget_s,
            progress=progress,
            strict=strict,
        )
    return out


# --------------------------------------------------------------------------------------
# output


def environment(device: str = "cpu") -> dict[str, Any]:
    """The facts a timing depends on: versions, cores, threads; the GPU on ``"cuda"``.

    On CUDA: the GPU's name, compute capability and memory, and the CUDA and
    triton versions torch was built with and runs. The versions of the peers
    a run imported are recorded too (their speed is theirs to change).
    """
    info: dict[str, Any] = {
        "posenc": posenc.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "device": device,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if device == "cuda":
            info["cuda"] = torch.version.cuda
            info["triton"] = _version("triton")
            try:
                info["gpu"] = torch.cuda.get_device_name()
                info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
                total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
                info["gpu_memory_gib"] = round(total / 2**30, 1)
            except Exception as exc:  # the timings matter more than the GPU's description
                info["gpu_error"] = f"{type(exc).__name__}: {exc}"
    for dist, module in _PEERS:
        if module in sys.modules and dist not in info:
            info[dist] = _version(dist)
    for name in _THREAD_ENV:
        if name in os.environ:
            info[name] = os.environ[name]
    return info


#: Environment variables that change how thread pools share the cores.
_THREAD_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")

#: Peers whose version :func:`environment` records when a run imported them (dist, module).
_PEERS = (
    ("triton", "triton"),
    ("transformers", "transformers"),
    ("liger-kernel", "liger_kernel"),
    ("x-transformers", "x_transformers"),
    ("rotary-embedding-torch", "rotary_embedding_torch"),
    ("positional-encodings", "positional_encodings"),
)


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def to_json(timings: Sequence[Timing]) -> str:
    """The rows as JSON: ``{"environment": {...}, "results": [{case, impl, median_s, ...}]}``.

    The environment is that of the device the rows ran on (the first row's).
    """
    device = timings[0].device if timings else "cpu"
    return json.dumps(
        {"environment": environment(device), "results": [asdict(t) for t in timings]}, indent=2
    )


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.3g}" if seconds < 1 else f"{seconds * 1e3:,.0f}"


def _times(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:,.0f}x"


def _mib(t: Timing) -> tuple[str, str]:
    if t.peak_bytes is None:
        return "-", "-"
    return f"{t.peak_bytes / 2**20:,.1f}", _times(t.memory_ratio)


def _table_rows(timings: Sequence[Timing], memory: bool, reference: bool) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for t in timings:
        mem = _mib(t) if memory else ()
        if t.status == "ok":
            runs = "" if t.runs > 1 else " (1 run)"
            ref = (_times(t.reference_ratio),) if reference else ()
            cells = (
                t.impl, _ms(t.median_s), _ms(t.min_s), _times(t.ratio), *ref, *mem, t.note + runs,
            )  # fmt: skip
        else:
            blank = ("-",) * (int(reference) + (2 if memory else 0))
            cells = (t.impl, "-", "-", t.status, *blank, t.reason)
        out.append(cells)
    return out


_HEADER = ("implementation", "median ms", "min ms", "x baseline", "note")
_MEMORY_HEADER = ("peak MiB", "x baseline")
_REFERENCE_HEADER = ("x ref",)


def _header(memory: bool, reference: bool = False) -> tuple[str, ...]:
    extra = (_REFERENCE_HEADER if reference else ()) + (_MEMORY_HEADER if memory else ())
    return (*_HEADER[:4], *extra, _HEADER[4])


def format_table(timings: Sequence[Timing], *, use_rich: bool | None = None) -> str:
    """A human-readable table per case (rich if installed, else plain text).

    Cases that measure memory get two more columns: the peak MiB a call adds
    and its ratio to the baseline's; cases with a reference row one more, ``x
    ref``, the ratio to that row. A case run on CUDA says so in its title.
    """
    cases: dict[tuple[str, str], list[Timing]] = {}
    for t in timings:
        cases.setdefault((t.case, t.device), []).append(t)
    if use_rich is None:
        use_rich = _has_rich()
    blocks = []
    for (name, device), rows in cases.items():
        size = " x ".join(str(v) for v in rows[0].size.values())
        runs = max((t.runs for t in rows), default=0)
        where = "" if device == "cpu" else f" on {device}"
        title = (
            f"{name}{where} ({size}): median of {runs} interleaved runs, ratio to the first "
            "baseline"
        )
        case = CASES.get(name)
        inner = case.inner if case is not None else 1
        if inner > 1:
            title = title.replace(" interleaved runs", f" interleaved runs of {inner} calls")
        refs = [t for t in rows if t.reference_ratio is not None]
        reference = bool(refs)
        if reference:
            # the reference row's median over itself is exactly 1
            ref_name = next((t.impl for t in refs if t.reference_ratio == 1.0), "the reference")
            title += f"; x ref: ratio to {ref_name}"
        desc = case.description if case is not None else ""
        memory = any(t.peak_bytes is not None for t in rows)
        render = _rich_table if use_rich else _plain
        blocks.append(render(title, desc, rows, memory, reference))
    return "\n".join(blocks)


def _has_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _plain(
    title: str, description: str, rows: Sequence[Timing], memory: bool, reference: bool = False
) -> str:
    header = _header(memory, reference)
    body = [header, *_table_rows(rows, memory, reference)]
    last = len(header) - 1
    widths = [max(len(r[c]) for r in body) for c in range(last)]
    lines = [title] + ([description] if description else [])
    for r in body:
        cells = [r[0].ljust(widths[0])] + [r[c].rjust(widths[c]) for c in range(1, last)]
        lines.append("  ".join([*cells, r[last]]).rstrip())
    return "\n".join(lines) + "\n"


def _rich_table(
    title: str, description: str, rows: Sequence[Timing], memory: bool, reference: bool = False
) -> str:
    from rich.console import Console
    from rich.table import Table

    header = _header(memory, reference)
    table = Table(title=title, caption=description or None, title_justify="left")
    for c, head in enumerate(header):
        table.add_column(head, justify="left" if c in (0, len(header) - 1) else "right")
    for t, cells in zip(rows, _table_rows(rows, memory, reference), strict=True):
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
