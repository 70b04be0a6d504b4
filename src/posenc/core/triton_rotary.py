"""The rotary rotation as one fused Triton kernel: queries and keys in one launch.

Rotary embeddings (Su et al. 2021, RoFormer, section 3.4.2) rotate each channel
pair ``(x1, x2)`` of a query or key by its angle ``theta``::

    y1 = x1 cos - x2 sin
    y2 = x2 cos + x1 sin

in float32, rounded once to ``x``'s dtype. ``sign=-1`` rotates by ``-theta``:
the inverse of the orthogonal map, and so its gradient.

Shapes::

    x          (..., head_dim)          1 to 4 leading dims, any strides
    cos, sin   (..., rotary_dim // 2)   float32, one value per pair, any strides;
                                        leading dims broadcast against x's

Pairs, by ``layout``:

- ``"half"`` (GPT-NeoX; HF ``apply_rotary_pos_emb`` with ``rotate_half``):
  channel ``i`` pairs with ``i + rotary_dim // 2``.
- ``"interleaved"`` (GPT-J; Meta's llama, which multiplies complex numbers):
  channel ``2i`` pairs with ``2i + 1``.

Channels from ``rotary_dim`` to ``head_dim`` pass through unchanged (GPT-NeoX's
partial rotary).

One launch rotates q and k: each program takes a tile of rows (a row is one
``head_dim`` vector) by all pairs of a row; the programs below q's tile count
take q's tiles, the rest k's. A row's offsets are its leading indices (the flat
row index divided by the leading sizes) times each tensor's own strides, in 64
bits.

The kernel rounds the two products and their sum apart, as torch's eager float32
ops do (fused multiply-add is switched off), so on a GPU it matches the eager
formula bit for bit. Under ``TRITON_INTERPRET=1`` (CPU tensors) float32 and
float16 match too, but Triton's interpreter converts float32 to bfloat16 by
truncation, so a bfloat16 result may lie one bfloat16 ulp from the rounded one.

Triton is imported on first use, so this module imports without it and
:func:`available` says whether it can run.
"""

from __future__ import annotations

import functools
import math
import os
import types
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

LAYOUTS = ("half", "interleaved")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MAX_LEAD = 4  # leading dims the kernel decomposes a row index into
_MAX_XS = 2  # q alone, or q and k
# Row indices are split into leading indices in 32 bits (byte offsets stay 64-bit).
_MAX_ROWS = 2**31 - 1

# Pairs per program (rows x pairs of a row): 4 per thread at 4 warps, each thread's
# channels one vector load where strides allow; ptxas (sm_90) fits that in about 32
# registers without spills.
_TILE_PAIRS = 512
_NUM_WARPS = 4

# triton.language, bound by _triton() on first use (the kernel's annotations name it)
tl: Any = None


@functools.cache
def _triton() -> ModuleType | None:
    """Triton, imported once; None where it does not import."""
    global tl
    try:
        import triton
        import triton.language as language
    except Exception:  # a broken install raises more than ImportError (missing drivers)
        return None
    tl = language
    return triton


def available() -> bool:
    """Whether triton imports (cached). Never raises."""
    return _triton() is not None


def _interpreting() -> bool:
    """Whether Triton runs kernels on the CPU through its interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _rotate_rows(
    X,
    OUT,
    COS,
    SIN,
    STARTS,
    ROWS,
    SIZES,
    X_STRIDES,
    COS_STRIDES,
    SIN_STRIDES,
    HEAD_DIM,
    sign,
    HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    N_X: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HAS_TAIL: tl.constexpr,
):  # pragma: no cover - traced by Triton (or run by its interpreter), not called
    """Rotate a tile of ``BLOCK_R`` rows by ``BLOCK_P`` pairs of one of the ``X``.

    ``X`` and ``OUT`` are tuples of tensors; programs ``STARTS[t]`` to
    ``STARTS[t + 1] - 1`` do ``X[t]``. Per tensor: ``ROWS`` its rows, ``SIZES``
    its last three leading sizes (the first is never needed), ``X_STRIDES`` its
    four leading strides and its channel stride, ``COS_STRIDES`` and
    ``SIN_STRIDES`` those of ``COS`` and ``SIN`` expanded against its leading
    dims (0 where they broadcast), ``HEAD_DIM`` its channels. ``OUT`` is
    contiguous.

    Only ``triton.language`` builtins: Triton's own jitted helpers (``tl.sum``,
    ``tl.cdiv``) are wrapped when triton is imported, interpreted or compiled as
    ``TRITON_INTERPRET`` then said, and the interpreter cannot call compiled ones.
    """
    # int64 before any product with a size or stride: in int32, program_id times a
    # row stride wraps past 2**31 elements (Liger-Kernel issues #803 and #1335)
    pid = tl.program_id(0).to(tl.int64)
    pairs = tl.arange(0, BLOCK_P).to(tl.int64)
    pair_ok = pairs < HALF
    # both members of every pair, side by side (interleaved: adjacent channels)
    both = tl.arange(0, 2 * BLOCK_P).to(tl.int64)
    both_ok = both < 2 * HALF
    # unrolled at compile time: each tensor keeps its own dtype and specialisations
    for t in tl.static_range(N_X):
        if (pid >= STARTS[t]) & (pid < STARTS[t + 1]):
            rows = (pid - STARTS[t]) * BLOCK_R + tl.arange(0, BLOCK_R)
            row_ok = rows[:, None] < ROWS[t]
            # the leading indices, divided out in 32 bits (the host refuses more than
            # _MAX_ROWS rows; a 64-bit division is a long software routine on GPUs),
            # widened before any product with a stride
            rest = rows.to(tl.int32)
            i3 = (rest % SIZES[t][2]).to(tl.int64)
            rest = rest // SIZES[t][2]
            i2 = (rest % SIZES[t][1]).to(tl.int64)
            rest = rest // SIZES[t][1]
            i1 = (rest % SIZES[t][0]).to(tl.int64)
            i0 = (rest // SIZES[t][0]).to(tl.int64)
            xs = X_STRIDES[t]
            cs = COS_STRIDES[t]
            ss = SIN_STRIDES[t]
            x_row = X[t] + (i0 * xs[0] + i1 * xs[1] + i2 * xs[2] + i3 * xs[3])[:, None]
            c_row = COS + (i0 * cs[0] + i1 * cs[1] + i2 * cs[2] + i3 * cs[3])[:, None]
            s_row = SIN + (i0 * ss[0] + i1 * ss[1] + i2 * ss[2] + i3 * ss[3])[:, None]
            o_row = OUT[t] + (rows * HEAD_DIM[t])[:, None]
            mask = row_ok & pair_ok[None, :]

            c = tl.load(c_row + (pairs * cs[4])[None, :], mask=mask, other=0.0)
            s = tl.load(s_row + (pairs * ss[4])[None, :], mask=mask, other=0.0) * sign
            if INTERLEAVED:
                # one contiguous load of the rotary channels, split into pairs: two
                # stride-2 loads would not vectorise
                x = tl.load(x_row + (both * xs[4])[None, :], mask=row_ok & both_ok[None, :])
                x1, x2 = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_R, BLOCK_P, 2)))
            else:
                x1 = tl.load(x_row + (pairs * xs[4])[None, :], mask=mask, other=0.0)
                x2 = tl.load(x_row + ((pairs + HALF) * xs[4])[None, :], mask=mask, other=0.0)
                x1 = x1.to(tl.float32)
                x2 = x2.to(tl.float32)
            # the eager formula's order: two products, then one sum, each rounded
            y1 = x1 * c - x2 * s
            y2 = x2 * c + x1 * s
            out_ty = OUT[t].dtype.element_ty
            if INTERLEAVED:
                y = tl.reshape(tl.join(y1, y2), (BLOCK_R, 2 * BLOCK_P))
                tl.store(o_row + both[None, :], y.to(out_ty), mask=row_ok & both_ok[None, :])
            else:
                tl.store(o_row + pairs[None, :], y1.to(out_ty), mask=mask)
                tl.store(o_row + (pairs + HALF)[None, :], y2.to(out_ty), mask=mask)

            if HAS_TAIL:
                for start in range(2 * HALF, HEAD_DIM[t], BLOCK_T):
                    ch = start + tl.arange(0, BLOCK_T).to(tl.int64)
                    tail = row_ok & (ch < HEAD_DIM[t])[None, :]
                    v = tl.load(x_row + (ch * xs[4])[None, :], mask=tail)
                    tl.store(o_row + ch[None, :], v, mask=tail)


_KERNELS: dict[bool, Any] = {}


def _kernel(triton: ModuleType) -> Any:
    """The jitted kernel for the current mode (compiled, or interpreted on the CPU).

    ``triton.jit`` reads ``TRITON_INTERPRET`` when it wraps a function, so each
    mode gets its own wrapper: a process may run CUDA tensors compiled and CPU
    tensors interpreted. The kernel's globals are a dict of its own holding only
    ``tl``: Triton's interpreter executes the kernel's source in them after copying
    in some sixty names of its own module, which would otherwise land in this one.
    """
    mode = _interpreting()
    if mode not in _KERNELS:
        fn = _rotate_rows
        own = types.FunctionType(fn.__code__, {"__name__": __name__, "tl": tl}, fn.__name__)
        _KERNELS[mode] = triton.jit(functools.update_wrapper(own, fn))
    return _KERNELS[mode]


def _check_xs(xs: Any) -> list[torch.Tensor]:
    if isinstance(xs, torch.Tensor) or not isinstance(xs, Sequence):
        shown = "a tensor" if isinstance(xs, torch.Tensor) else type(xs).__name__
        raise TypeError(f"xs must be a sequence of tensors (q alone, or q and k); got {shown}")
    xs = list(xs)
    if not 1 <= len(xs) <= _MAX_XS:
        raise ValueError(
            f"xs must hold 1 or {_MAX_XS} tensors (q alone, or q and k); got {len(xs)}"
        )
    for i, x in enumerate(xs):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"xs[{i}] must be a torch tensor; got {type(x).__name__}")
        if x.dtype not in _DTYPES:
            raise TypeError(
                f"xs[{i}] must be float32, bfloat16 or float16; got {x.dtype} "
                "(float64 and others rotate through the eager path)"
            )
        if not 1 <= x.ndim - 1 <= _MAX_LEAD:
            raise ValueError(
                f"xs[{i}] must be (..., head_dim) with 1 to {_MAX_LEAD} leading dims; "
                f"got shape {tuple(x.shape)}"
            )
        if math.prod(x.shape[:-1]) > _MAX_ROWS:
            raise ValueError(
                f"xs[{i}] has {math.prod(x.shape[:-1])} rows (..., head_dim); the kernel "
                f"indexes at most {_MAX_ROWS}"
            )
        if x.device != xs[0].device:
            raise ValueError(f"xs must share one device; got {xs[0].device} and {x.device}")
    return xs


def _check_rotary_dim(rotary_dim: Any, xs: list[torch.Tensor]) -> int:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rotary_dim must be an int; got {type(rotary_dim).__name__}")
    head_dim = min(x.shape[-1] for x in xs)
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(
            f"rotary_dim must be even, at least 2 and at most head_dim ({head_dim}); "
            f"got {rotary_dim}"
        )
    return rotary_dim


def _check_angles(cos: Any, sin: Any, xs: list[torch.Tensor], rotary_dim: int) -> None:
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            shown = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name} must be a float32 tensor; got {shown}")
        if t.device != xs[0].device:
            raise ValueError(f"{name} must be on xs' device {xs[0].device}; got {t.device}")
        if t.ndim < 1 or t.shape[-1] != rotary_dim // 2:
            raise ValueError(
                f"{name} must hold one value per pair, (..., rotary_dim // 2 = "
                f"{rotary_dim // 2}); got shape {tuple(t.shape)}"
            )
        for i, x in enumerate(xs):
            lead = tuple(x.shape[:-1])
            try:
                joint = tuple(torch.broadcast_shapes(lead, t.shape[:-1]))
            except RuntimeError:
                joint = None
            if joint != lead:
                raise ValueError(
                    f"{name} of shape {tuple(t.shape)} does not broadcast against the "
                    f"leading dims {lead} of xs[{i}]; its leading dims must be 1 or x's"
                )


def _padded(values: Sequence[int], fill: int) -> tuple[int, ...]:
    """``values`` (leading sizes or strides) padded on the left to ``_MAX_LEAD``."""
    return (fill,) * (_MAX_LEAD - len(values)) + tuple(values)


def _strides(t: torch.Tensor, lead: tuple[int, ...]) -> tuple[int, ...]:
    """``t``'s four leading strides against ``lead`` (0 where it broadcasts), then its last."""
    expanded = t.expand(*lead, t.shape[-1])  # a view: strides only, no copy
    return (*_padded(expanded.stride()[:-1], 0), expanded.stride(-1))


def rotate(
    xs: Sequence[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    rotary_dim: int,
    layout: str,
    sign: float = 1.0,
) -> list[torch.Tensor]:
    """Rotate the first ``rotary_dim`` channels of each tensor of ``xs`` in one launch.

    Args:
        xs: q alone, or q and k: float32, bfloat16 or float16 tensors
            ``(..., head_dim)`` with 1 to 4 leading dims, any strides; their
            leading shapes may differ (grouped-query attention's head counts).
        cos: float32 ``(..., rotary_dim // 2)``, one value per pair, leading dims
            broadcasting against each x's (right-aligned).
        sin: like ``cos``, with its own shape and strides.
        rotary_dim: channels to rotate (even); the rest are copied.
        layout: ``"half"`` (channel ``i`` with ``i + rotary_dim // 2``) or
            ``"interleaved"`` (``2i`` with ``2i + 1``).
        sign: ``1.0`` rotates by the angles, ``-1.0`` by their negatives (the
            inverse rotation, which is the gradient).

    Returns:
        One fresh contiguous tensor per x, of its shape, dtype and device.

    Raises:
        TypeError: ``xs`` not a sequence of tensors, or of an unsupported dtype;
            ``cos`` or ``sin`` not float32 tensors; ``rotary_dim`` not an int.
        ValueError: ``xs`` of other than 1 or 2 tensors, more than 4 leading dims
            or on different devices; ``rotary_dim`` odd or above ``head_dim``;
            ``layout`` unknown; ``sign`` neither 1 nor -1; ``cos`` or ``sin``
            without ``rotary_dim // 2`` values per row, or not broadcasting
            against an x; CPU tensors without ``TRITON_INTERPRET=1``.
        ImportError: triton does not import.
    """
    xs = _check_xs(xs)
    rotary_dim = _check_rotary_dim(rotary_dim, xs)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}; got {layout!r}")
    if isinstance(sign, bool) or not isinstance(sign, (int, float)) or sign not in (1, -1):
        raise ValueError(f"sign must be 1.0 (rotate) or -1.0 (rotate back); got {sign!r}")
    _check_angles(cos, sin, xs, rotary_dim)
    if _triton() is None:
        raise ImportError(
            "the fused rotary kernel needs triton, which does not import here; "
            "install it (pip install triton) or rotate with the eager path"
        )
    if xs[0].device.type == "cpu" and not _interpreting():
        raise ValueError(
            "Triton on CPU tensors runs only under TRITON_INTERPRET=1 (its interpreter, "
            "for tests); move the tensors to a GPU or set TRITON_INTERPRET=1"
        )
    return launch(xs, cos, sin, rotary_dim=rotary_dim, layout=layout, sign=sign)


def launch(
    xs: Sequence[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    rotary_dim: int,
    layout: str,
    sign: float,
) -> list[torch.Tensor]:
    """:func:`rotate` without its checks: for callers that made the inputs so.

    A decode step rotates one position: the checks (broadcast shapes of every
    tensor) would cost more host time than the launch itself.
    """
    triton = _triton()
    assert triton is not None  # rotate's check, or the caller's
    device = xs[0].device
    outs = [torch.empty(x.shape, dtype=x.dtype, device=device) for x in xs]
    rows = [math.prod(x.shape[:-1]) for x in xs]
    if not any(rows):
        return outs
    half = rotary_dim // 2
    block_p = triton.next_power_of_2(half)
    block_r = min(max(1, _TILE_PAIRS // block_p), triton.next_power_of_2(max(rows)))
    starts = [0]
    for n in rows:
        starts.append(starts[-1] + triton.cdiv(n, block_r))
    tail = max(x.shape[-1] for x in xs) - rotary_dim
    leads = [tuple(x.shape[:-1]) for x in xs]
    _kernel(triton)[(starts[-1],)](
        tuple(xs),
        tuple(outs),
        cos,
        sin,
        tuple(starts),
        tuple(rows),
        tuple(_padded(lead, 1)[1:] for lead in leads),  # the first is never divided by
        tuple((*_padded(x.stride()[:-1], 0), x.stride(-1)) for x in xs),
        tuple(_strides(cos, lead) for lead in leads),
        tuple(_strides(sin, lead) for lead in leads),
        tuple(x.shape[-1] for x in xs),
        float(sign),
        HALF=half,
        INTERLEAVED=layout == "interleaved",
        N_X=len(xs),
        BLOCK_R=block_r,
        BLOCK_P=block_p,
        BLOCK_T=min(triton.next_power_of_2(max(tail, 1)), block_p),
        HAS_TAIL=tail > 0,
        num_warps=_NUM_WARPS,
        # separate roundings of the products and the sum, as torch's eager ops
        enable_fp_fusion=False,
    )
    return outs
