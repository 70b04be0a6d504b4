"""The exact angle engine: position x frequency, reduced modulo one turn.

Every encoding in posenc evaluates ``sin`` and ``cos`` of ``position * omega``
through this module, so precision lives in one place.

Why it is needed: the usual float32 formula rounds ``omega`` and the product
``position * omega`` to 24 bits, so the angle is off by about
``|angle| * 2**-24``: 6e-2 radians at position 1e6 and 0.7 at 1e7. posenc
instead works in *turns* (``angle / 2 pi``):

1. Each frequency is computed once in decimal arithmetic (40 digits, the
   standard library's ``decimal``) and stored as turns per unit position, in
   pieces whose products with a position are exact in floating point.
2. ``position * turns`` is formed piece by piece; the integer part of each
   exact partial product is dropped (``x - rint(x)`` is exact), so only the
   fraction of a turn, which is all that ``sin`` and ``cos`` need, is kept.
3. ``sin`` and ``cos`` are evaluated on the reduced angle in ``[-pi, pi]``.

Two arithmetics implement this, with one error budget (float32 results
within 1e-6 of the exact value for ``|position| < 2**31``):

- float64 (numpy, and torch on CPU and CUDA): positions and ``turns`` are
  split in two 26-bit halves (Veltkamp); the error before rounding to float32
  is about 1e-15.
- compensated float32 (torch devices without fast float64, such as MPS):
  positions are cut in 11- or 12-bit pieces, the turns in five 12-bit
  pieces, the exact partial products are summed with TwoSum, and the final
  angle is reduced to an octant before ``sin``/``cos``; the error is below
  4e-7.

The module also builds tables for arithmetic progressions of positions fast:
``e^{i w (s + B P + j)} = e^{i w (s + B P)} e^{i w j}``, with both factors
exact to a few 1e-15 (doublings of exact phasors at the powers of two), so a
table of n rows costs about log2(n) exact evaluations and one complex multiply
per entry, done on several threads: in the optional compiled kernel
(``posenc.core._kernels``, one fused pass) or block by block in numpy.
"""

from __future__ import annotations

import decimal
import functools
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.core.kernels import compiled, max_workers, workers_for

#: Positions (after any offset) must satisfy ``|p| < EXACT_LIMIT``.
EXACT_LIMIT = 2**31

_DIGITS = 40
#: pi to 80 digits: every exact frequency in posenc that involves pi uses this one.
PI = decimal.Decimal(
    "3.14159265358979323846264338327950288419716939937510582097494459230781640628620899"
)
_TWO_PI_F64 = 2.0 * math.pi
_VELTKAMP64 = 134217729.0  # 2**27 + 1: splits a float64 into two 26-bit halves
_VELTKAMP32 = 4097.0  # 2**12 + 1: splits a float32 into two 12-bit halves
_PIECES32 = 5  # 12-bit float32 pieces of each frequency: 60 bits in all


def decimal_context() -> decimal.Context:
    """The decimal arithmetic of every exact frequency: 40 digits, no exponent limits."""
    return decimal.Context(prec=_DIGITS, Emin=-999999, Emax=999999)


def _round_bits(x: decimal.Decimal, bits: int) -> float:
    """Round ``x`` to a float with at most ``bits`` significant bits."""
    if x == 0:
        return 0.0
    _, exponent = math.frexp(float(x))
    ctx, shift = decimal_context(), bits - exponent
    scaled = ctx.multiply(x, 2**shift) if shift >= 0 else ctx.divide(x, 2**-shift)
    mantissa = scaled.to_integral_value(decimal.ROUND_HALF_EVEN)
    return math.ldexp(int(mantissa), exponent - bits)


@dataclass(frozen=True, eq=False)
class Turns:
    """Exact frequencies, in turns per unit position, ready for the engine.

    Attributes:
        hi: float64 nearest to each frequency in turns, shape ``(K,)``.
        lo: float64 remainder ``turns - hi``.
        pieces32: ``(5, K)`` float32 pieces of at most 12 significant bits each,
            summing to the frequency to 60 bits (the compensated float32 path).
        radians: ``2 pi * turns`` rounded to float64: the usual ``inv_freq``.
    """

    hi: npt.NDArray[np.float64]
    lo: npt.NDArray[np.float64]
    pieces32: npt.NDArray[np.float32]
    radians: npt.NDArray[np.float64]
    _split: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] = field(repr=False)
    _device_cache: dict[Any, Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def size(self) -> int:
        """How many frequencies the table holds."""
        return int(self.hi.shape[0])

    def __getstate__(self) -> dict[str, Any]:
        # the per-device tensors are a cache and the lock cannot be pickled: a copy
        # (deepcopy, pickle, torch.save of a module holding frequencies) starts afresh
        state = dict(self.__dict__)
        state["_device_cache"], state["_lock"] = {}, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def torch_parts(self, device: Any, arithmetic: str) -> tuple[Any, ...]:
        """The frequency pieces as torch tensors on ``device`` (cached per device)."""
        import torch

        key = (str(device), arithmetic)
        parts = self._device_cache.get(key)
        if parts is None:
            with self._lock:
                parts = self._device_cache.get(key)
                if parts is None:
                    if arithmetic == "float64":
                        arrays, dtype = (*self._split, self.hi, self.lo), torch.float64
                    else:
                        arrays, dtype = tuple(self.pieces32), torch.float32
                    parts = tuple(
                        torch.tensor(np.array(a), dtype=dtype, device=device) for a in arrays
                    )
                    self._device_cache[key] = parts
        return parts


def turns_from_radians(omega: Sequence[decimal.Decimal]) -> Turns:
    """Build :class:`Turns` from exact angular frequencies (radians per unit)."""
    ctx = decimal_context()
    two_pi = ctx.multiply(PI, 2)
    exact = [ctx.divide(w, two_pi) for w in omega]
    hi = np.array([float(t) for t in exact], dtype=np.float64)
    lo = np.array(
        [float(ctx.subtract(t, decimal.Decimal(h))) for t, h in zip(exact, hi, strict=True)],
        dtype=np.float64,
    )
    pieces = np.zeros((_PIECES32, len(exact)), dtype=np.float32)
    for k, t in enumerate(exact):
        rest = t
        for j in range(_PIECES32):
            piece = _round_bits(rest, 12)
            pieces[j, k] = piece
            rest = ctx.subtract(rest, decimal.Decimal(piece))
    radians = np.array([float(w) for w in omega], dtype=np.float64)
    c = _VELTKAMP64 * hi
    g1 = c - (c - hi)
    for a in (hi, lo, pieces, radians, g1):
        a.setflags(write=False)
    return Turns(hi, lo, pieces, radians, (g1, hi - g1))


@functools.lru_cache(maxsize=256)
def geometric_turns(
    count: int, base: float, min_timescale: float, denominator: float, scale: float
) -> Turns:
    """Frequencies ``scale * min_timescale * (base / min_timescale) ** (-k / denominator)``.

    This is the frequency ladder of every sinusoidal and rotary encoding
    (``k = 0 .. count - 1``). ``min_timescale`` multiplies, as in tensor2tensor's
    ``get_timing_signal_1d`` code (its docstring calls it a timescale, its code
    makes it the highest frequency). With ``count == 1`` only ``k = 0`` exists
    and ``denominator`` is not used (tensor2tensor's guard against ``h - 1 == 0``).
    """
    ctx = decimal_context()
    base_d = decimal.Decimal(base)
    min_d = decimal.Decimal(min_timescale)
    top = ctx.multiply(decimal.Decimal(scale), min_d)
    log_ratio = ctx.divide(base_d, min_d).ln(ctx)
    omega = [top]
    if count > 1:
        denom = decimal.Decimal(denominator)
        for k in range(1, count):
            omega.append(ctx.multiply(top, ctx.exp(ctx.divide(ctx.multiply(-k, log_ratio), denom))))
    return turns_from_radians(omega)


# --------------------------------------------------------------------------------------
# Reduction: numpy and torch float64 share one formula; compensated float32 is torch only.


def _reduced_turns_f64(p: Any, g1: Any, g2: Any, lo: Any, rint: Callable[[Any], Any]) -> Any:
    """``p * turns`` reduced to [-1/2, 1/2] (float64, numpy or torch, broadcasting)."""
    c = _VELTKAMP64 * p
    p1 = c - (c - p)
    p2 = p - p1
    a = p1 * g1  # exact: 26 x 26 bits
    b = p1 * g2  # exact: 26 x 27 bits
    c = p2 * g1  # exact: 27 x 26 bits
    # the rest is below 2**-20 turn for |p| < 2**31: its rounding is negligible
    t = (a - rint(a)) + (b - rint(b)) + (c - rint(c)) + (p2 * g2 + p * lo)
    return t - rint(t)


def sincos_numpy(
    positions: npt.NDArray[Any], turns: Turns
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Exact ``sin`` and ``cos`` of ``positions[..., None] * omega`` in float64."""
    p = np.asarray(positions, dtype=np.float64)[..., None]
    g1, g2 = turns._split
    x = _TWO_PI_F64 * _reduced_turns_f64(p, g1, g2, turns.lo, np.rint)
    return np.sin(x), np.cos(x)


def _two_sum(a: Any, b: Any) -> tuple[Any, Any]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _position_pieces32(p: Any) -> list[Any]:
    """Cut torch positions in float32 pieces of at most 12 significant bits."""
    import torch

    if not p.is_floating_point():
        p = p.to(torch.int64)
        top = torch.div(p, 1 << 22, rounding_mode="floor")
        rest = p - top * (1 << 22)
        mid = torch.div(rest, 1 << 11, rounding_mode="floor")
        low = rest - mid * (1 << 11)
        return [(top * (1 << 22)).float(), (mid * (1 << 11)).float(), low.float()]
    if p.dtype == torch.float64:  # only on devices that have it: keep all 53 bits
        hi = p.to(torch.float32)
        parts = [hi, (p - hi.double()).to(torch.float32)]
    else:
        parts = [p.to(torch.float32)]
    pieces = []
    for part in parts:
        c = _VELTKAMP32 * part
        top = c - (c - part)
        pieces += [top, part - top]
    return pieces


def _sincos_torch_f32(p: Any, pieces: Sequence[Any]) -> tuple[Any, Any]:
    import torch

    total = torch.zeros((), dtype=torch.float32, device=p.device)
    comp = torch.zeros((), dtype=torch.float32, device=p.device)
    for piece in _position_pieces32(p):
        q = piece[..., None]
        for g in pieces:
            term = q * g  # exact: at most 12 x 12 bits
            total, err = _two_sum(total, term - torch.round(term))
            comp = comp + err
    t = total - torch.round(total)
    quarter = torch.round(4.0 * t)
    r = (t - 0.25 * quarter) + comp
    x = r * float(np.float32(_TWO_PI_F64))
    s, c = torch.sin(x), torch.cos(x)
    k = torch.remainder(quarter, 4.0)
    # rotate (cos, sin) by k quarter turns
    sin = torch.where(k == 0, s, torch.where(k == 1, c, torch.where(k == 2, -s, -c)))
    cos = torch.where(k == 0, c, torch.where(k == 1, -s, torch.where(k == 2, -c, s)))
    return sin, cos


def float64_is_fast(device: Any) -> bool:
    """Whether the float64 path is used on ``device`` (else compensated float32)."""
    return getattr(device, "type", str(device)) in ("cpu", "cuda")


def sincos_torch(positions: Any, turns: Turns, arithmetic: str = "auto") -> tuple[Any, Any]:
    """Exact ``sin`` and ``cos`` of ``positions[..., None] * omega`` for a torch tensor.

    Args:
        positions: tensor of int or float positions, any shape, on any device.
        turns: the frequencies.
        arithmetic: ``"float64"``, ``"float32"`` (compensated) or ``"auto"``
            (float64 on CPU and CUDA, compensated float32 elsewhere).

    Returns:
        ``(sin, cos)`` of shape ``positions.shape + (K,)``, float64 or float32.
        Autocast is disabled inside: it never lowers the precision.
    """
    import torch

    if arithmetic == "auto":
        arithmetic = "float64" if float64_is_fast(positions.device) else "float32"
    elif arithmetic not in ("float64", "float32"):
        raise ValueError(f"arithmetic must be 'auto', 'float64' or 'float32'; got {arithmetic!r}")
    with torch.autocast(positions.device.type, enabled=False):
        parts = turns.torch_parts(positions.device, arithmetic)
        if arithmetic == "float32":
            return _sincos_torch_f32(positions, parts)
        g1, g2, _, lo = parts
        p = positions.to(torch.float64)[..., None]
        x = _TWO_PI_F64 * _reduced_turns_f64(p, g1, g2, lo, torch.round)
        return torch.sin(x), torch.cos(x)


# --------------------------------------------------------------------------------------
# Tables for arithmetic progressions of positions.

_BLOCK_ROWS = 16  # rows of the exact step table
_CHUNK_BYTES = 1 << 20  # complex128 rows handed to ``emit`` at once: about one L2 cache
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers(), thread_name_prefix="posenc")
        return _POOL


def unit_phasors(positions: npt.NDArray[Any], turns: Turns) -> npt.NDArray[np.complex128]:
    """``exp(i * positions[..., None] * omega)``, exact, complex128."""
    s, c = sincos_numpy(positions, turns)
    out = np.empty(s.shape, dtype=np.complex128)
    out.real = c
    out.imag = s
    return out


def _doubling(
    origin: npt.NDArray[np.complex128], powers: npt.NDArray[np.complex128], count: int
) -> npt.NDArray[np.complex128]:
    """Rows ``origin * z**i`` for ``i < count``, from ``powers[e] = z**(2**e)``.

    Row ``i`` is reached through at most ``ceil(log2(count))`` products, each
    adding at most ``2**-52`` to these unit-modulus values.
    """
    out = np.empty((count, origin.shape[-1]), dtype=np.complex128)
    out[0] = origin
    filled = 1
    for power in powers:
        if filled >= count:
            break
        take = min(filled, count - filled)
        np.multiply(out[:take], power, out=out[filled : filled + take])
        filled += take
    return out


def _progression_factors(
    start: float, n: int, turns: Turns, coefficient: complex, conjugate: bool
) -> tuple[npt.NDArray[np.complex128], npt.NDArray[np.complex128], npt.NDArray[np.complex128]]:
    """``(step, coarse, fine)``: row ``P B + j`` is ``coarse[P // m] * fine[P % m] * step[j]``.

    ``B = _BLOCK_ROWS`` and ``m = len(fine)`` are powers of two, ``m`` near
    ``sqrt(n / B)``. The three tables are doublings (``_doubling``) of
    exact phasors at ``start`` and at the powers of two, so the exact engine
    runs on about ``log2(n)`` positions; every entry is within ``(log2(n) + 2)
    * 3e-16`` of exact. ``coefficient`` is folded into ``coarse``; with
    ``conjugate`` every factor is conjugated.
    """
    b = _BLOCK_ROWS
    nblocks = -(-n // b)
    m = 1 << ((math.isqrt(nblocks - 1) + 1).bit_length() - 1) if nblocks > 1 else 1
    ncoarse = -(-nblocks // m)
    levels = max(1, (b * m * max(ncoarse - 1, 1)).bit_length())
    exact = unit_phasors(np.array([start, *(2.0**e for e in range(levels))]), turns)
    if conjugate:
        exact = exact.conj()
    powers, one = exact[1:], np.ones(turns.size, dtype=np.complex128)
    step = _doubling(one, powers, b)
    fine = _doubling(one, powers[b.bit_length() - 1 :], m)
    coarse = _doubling(exact[0] * coefficient, powers[(b * m).bit_length() - 1 :], ncoarse)
    return step, coarse, fine


def progression_table(
    start: float,
    n: int,
    turns: Turns,
    out: npt.NDArray[Any],
    first: tuple[int, int, int],
    second: tuple[int, int, int],
    *,
    coefficient: complex = 1.0,
    conjugate: bool = False,
) -> bool:
    """Write a progression table straight into the rows of ``out``, if the kernel can.

    The values of :func:`progression_blocks` (``w = coefficient * z**(+-1)`` for
    positions ``start + i``), computed by the optional compiled kernel
    (``posenc.core._kernels``) with the same complex128 arithmetic, rounded once:
    ``Re(w_k)`` goes to channel ``first[0] + k * first[1]`` for ``k < first[2]``,
    ``Im(w_k)`` to ``second[0] + k * second[1]`` for ``k < second[2]``.

    Returns:
        False, having written nothing, when the kernel is not built or ``out``
        is not a C-contiguous ``(n, dim)`` float32 or float64 array; the caller
        then uses :func:`progression_blocks`.
    """
    if compiled is None or n <= 0 or out.ndim != 2 or out.shape[0] != n:
        return False
    if out.dtype not in (np.float32, np.float64) or not out.flags.c_contiguous:
        return False
    step, coarse, fine = _progression_factors(start, n, turns, coefficient, conjugate)
    threads = workers_for(n * turns.size)
    planes = np.stack([step.real, step.imag], axis=1)  # (B, 2, K): vector loads
    compiled.table(
        coarse, fine, planes, out, n, fine.shape[0], out.shape[1], *first, *second,
        out.dtype == np.float64, threads,
    )  # fmt: skip
    return True


def progression_blocks(
    start: float,
    n: int,
    turns: Turns,
    emit: Callable[[int, npt.NDArray[np.complex128]], None] | None = None,
    *,
    target: npt.NDArray[Any] | None = None,
    coefficient: complex = 1.0,
    conjugate: bool = False,
) -> None:
    """Compute ``w = coefficient * z**(+-1)`` for positions ``start + i``, ``i < n``.

    ``z = exp(i * position * omega)``; with ``conjugate`` its conjugate. The rows
    go either straight into ``target``, an ``(n, K)`` complex64 or complex128 array
    (any row stride; each value is computed in complex128 and rounded once), or
    to ``emit(row0, w_rows)``, which receives consecutive chunks of rows (about
    1 MiB each) and must copy them before returning (the buffer is reused).
    Chunks are processed on several threads at once, each row exactly once.

    Each row is ``start_phasor(block) * step_phasor(row in block)``, both within
    ``(log2(n) + 2) * 3e-16`` of exact (``_progression_factors``), so the
    float64 product is exact to a few 1e-15.
    """
    if n <= 0:
        return
    b = _BLOCK_ROWS
    k = turns.size
    nblocks = -(-n // b)
    step, coarse, fine = _progression_factors(start, n, turns, coefficient, conjugate)
    m = fine.shape[0]
    group = max(1, _CHUNK_BYTES // (16 * k * b))  # blocks per chunk

    if (target is None) == (emit is None):
        raise TypeError("progression_blocks takes exactly one of emit and target")

    def run(first: int, last: int) -> None:
        buf = np.empty((group, b, k), dtype=np.complex128)
        starts = np.empty((group, k), dtype=np.complex128)
        for q in range(first, last, group):
            g = min(group, last - q)
            blocks = np.arange(q, q + g)
            np.multiply(coarse[blocks // m], fine[blocks % m], out=starts[:g])
            rows = min(g * b, n - q * b)
            if target is not None and rows == g * b:
                # one ufunc call computes in complex128 and rounds into the target
                dest = target[q * b : q * b + rows].reshape(g, b, k)
                np.multiply(starts[:g, None, :], step[None], out=dest, casting="same_kind")
                continue
            np.multiply(starts[:g, None, :], step[None], out=buf[:g])
            w = buf[:g].reshape(g * b, k)[:rows]
            if target is not None:
                target[q * b : q * b + rows] = w
            else:
                assert emit is not None
                emit(q * b, w)

    workers = workers_for(n * k)
    per = -(-nblocks // workers)
    per = -(-per // group) * group
    jobs = [(i, min(nblocks, i + per)) for i in range(0, nblocks, per)]
    if len(jobs) == 1:
        run(*jobs[0])
        return
    for f in [_pool().submit(run, *job) for job in jobs]:
        f.result()
