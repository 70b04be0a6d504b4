"""Applying rotary embeddings: rotate channel pairs of queries and keys by their angles.

Shapes: ``x`` is ``(..., seq, head_dim)`` with any leading dims (``(batch,
heads, seq, head_dim)``, or ``(batch, seq, heads, head_dim)`` with ``cos`` and
``sin`` shaped ``(seq, 1, rotary_dim)``); ``cos`` and ``sin`` are ``(...,
seq, rotary_dim)`` and broadcast against ``x[..., :rotary_dim]``, as HF's
``apply_rotary_pos_emb`` takes them (from :func:`posenc.rotary.tables.cos_sin`
or HF's own rotary module).

Layouts (Su et al. 2021, section 3.4.2; HF ``apply_rotary_pos_emb``, Meta's llama):

- ``"half"`` (GPT-NeoX, HF): channel ``i`` pairs with ``i + rotary_dim / 2``;
  ``x' = x cos + rotate_half(x) sin`` with ``rotate_half(x) = cat(-x2, x1)``.
- ``"interleaved"`` (GPT-J, Meta llama, torchtune, rotary-embedding-torch):
  channel ``2i`` pairs with ``2i + 1``; Meta multiplies complex numbers.

Channels past ``rotary_dim`` pass through unchanged (GPT-NeoX's partial rotary).

Each angle appears twice in ``cos`` and ``sin`` (``cat(theta, theta)`` for
``half``, ``theta0, theta0, theta1, theta1 ...`` for ``interleaved``), and
:func:`apply_rotary` reads one copy per pair: ``cos[..., :rotary_dim // 2]``
for ``half``, ``cos[..., 0::2]`` for ``interleaved``. The rotation is then
orthogonal, so its gradient is the inverse rotation (same cos, negated sin):
the autograd function saves only ``cos`` and ``sin``, never the activations.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from posenc.core import checks
from posenc.core.kernels import compiled, workers_for
from posenc.families.rotary.tables import LAYOUTS, Layout

#: What ``apply_rotary(backend=...)`` accepts.
BACKENDS = ("auto", "kernel", "torch", "triton")


def _halves(t: torch.Tensor, rotary_dim: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members of every pair: ``(x1, x2)`` with ``x' = (x1 c - x2 s, x2 c + x1 s)``."""
    if layout == "half":
        h = rotary_dim // 2
        return t[..., :h], t[..., h:rotary_dim]
    return t[..., 0:rotary_dim:2], t[..., 1:rotary_dim:2]


def _angles(
    cos: torch.Tensor, sin: torch.Tensor, layout: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` whole and one copy of each angle's sin, ``(..., seq, rotary_dim / 2)``."""
    if layout == "half":
        s = sin[..., : sin.shape[-1] // 2]
    else:
        s = sin[..., 0::2]
    return cos.to(dtype), s.to(dtype)


def _complex_ok(t: torch.Tensor, rotary_dim: int) -> bool:
    """Whether ``t[..., :rotary_dim]`` can be viewed as complex pairs without a copy."""
    if t.dtype not in (torch.float32, torch.float64) or t.stride(-1) != 1:
        return False
    if t.storage_offset() % 2:
        return False
    return all(st % 2 == 0 for st, n in zip(t.stride()[:-1], t.shape[:-1], strict=True) if n > 1)


def _as_complex(t: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    return torch.view_as_complex(t[..., :rotary_dim].unflatten(-1, (rotary_dim // 2, 2)))


def _rotate_into(
    xw: torch.Tensor,
    cos: torch.Tensor,
    s: torch.Tensor,
    rotary_dim: int,
    layout: str,
    sign: float,
    out: torch.Tensor,
) -> None:
    """Write the rotation of ``xw[..., :rotary_dim]`` by ``sign * theta`` into ``out``.

    ``xw``, ``cos`` (whole: each angle twice), ``s`` (one sin per pair) and
    ``out`` share the compute dtype; ``out`` may be ``xw`` itself (in place).
    """
    if layout == "interleaved" and _complex_ok(xw, rotary_dim) and _complex_ok(out, rotary_dim):
        # Meta's complex multiply: one pass, pairs read and written together
        freq = torch.complex(cos[..., 0::2], s if sign > 0 else -s)
        torch.mul(_as_complex(xw, rotary_dim), freq, out=_as_complex(out, rotary_dim))
        return
    x1, x2 = _halves(xw, rotary_dim, layout)
    if out is xw:
        # in place, with one half-sized temporary
        c1, c2 = _halves(cos, rotary_dim, layout)
        cross = x2 * s
        x2.mul_(c2).addcmul_(x1, s, value=sign)
        x1.mul_(c1).add_(cross, alpha=-sign)
        return
    # x cos over the whole rotary part, then the cross terms in place on each half:
    # no cat(-x2, x1) temporaries as in HF's rotate_half
    torch.mul(xw[..., :rotary_dim], cos, out=out[..., :rotary_dim])
    o1, o2 = _halves(out, rotary_dim, layout)
    o1.addcmul_(x2, s, value=-sign)
    o2.addcmul_(x1, s, value=sign)


# Low-precision inputs are upcast and rotated slice by slice (over the leading dims)
# when a (seq, head_dim) slice holds at least this many elements: the float32
# temporaries then stay in cache instead of being fresh, page-faulted buffers.
_BLOCK_ELEMENTS = 1 << 15


def _leading_index(t: torch.Tensor, index: tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """The index of ``t`` (broadcast against a tensor of ``ndim`` dims) for its slice ``index``."""
    skip = ndim - t.ndim
    return tuple(index[skip + i] if t.shape[i] > 1 else 0 for i in range(t.ndim - 2))


def _rotate_kernel(
    x: torch.Tensor, cos: torch.Tensor, s: torch.Tensor, rotary_dim: int, layout: str, sign: float
) -> torch.Tensor | None:
    """The rotation in one fused pass (``posenc.core._kernels.rotate``), or None if it cannot.

    For an ``x`` the kernel takes (``_kernel_applies``: CPU float32 and bfloat16
    with unit stride along ``head_dim``, any strides elsewhere; ``cos`` and ``s``
    float32, broadcast through their expanded strides): one read of ``x`` and one
    write of the result, where torch's eager ops take three passes for the half
    layout (and an upcast and a rounding pass more for bfloat16). Rounds as the
    unfused float32 formula does (no fused
    multiply-add), then once to ``x``'s dtype.
    """
    assert compiled is not None  # _kernel_applies(x) holds
    lead = x.shape[:-1]
    if cos.dtype != torch.float32 or s.dtype != torch.float32 or cos.device != x.device:
        return None
    try:
        cos_e = cos.contiguous().expand(*lead, rotary_dim)
        s_e = s.contiguous().expand(*lead, rotary_dim // 2)
    except RuntimeError:  # not broadcastable this way: the general path decides
        return None
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    threads = workers_for(x.numel())
    compiled.rotate(
        x.data_ptr(), out.data_ptr(), cos_e.data_ptr(), s_e.data_ptr(),
        list(lead), list(x.stride()[:-1]), list(cos_e.stride()[:-1]), list(s_e.stride()[:-1]),
        x.shape[-1], rotary_dim, layout == "half", sign, x.dtype == torch.float32, threads,
    )  # fmt: skip
    return out


_KERNEL_DTYPES = (torch.bfloat16, torch.float32)
_KERNEL_MAX_LEAD = 8  # MAX_LEAD in core/csrc/common.h
_TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TRITON_MAX_LEAD = 4


def triton_available() -> bool:
    """Whether the fused Triton kernel can run (``triton`` imports); imports nothing before."""
    from posenc.core import triton_rotary

    return triton_rotary.available()


def _kernel_applies(x: torch.Tensor) -> bool:
    """Whether the compiled C kernel rotates ``x`` (CPU float32 or bfloat16, unit last stride)."""
    return (
        compiled is not None
        and x.device.type == "cpu"
        and x.dtype in _KERNEL_DTYPES
        and x.stride(-1) == 1
        and 1 <= x.ndim - 1 <= _KERNEL_MAX_LEAD
    )


def _triton_applies(x: torch.Tensor) -> bool:
    """Whether the Triton kernel can rotate ``x`` (its dtypes, at most four leading dims)."""
    return x.dtype in _TRITON_DTYPES and 1 <= x.ndim - 1 <= _TRITON_MAX_LEAD


def _resolve_backend(backend: str, xs: Sequence[torch.Tensor]) -> str:
    """The backend that rotates ``xs``: ``"kernel"``, ``"triton"`` or ``"torch"``.

    ``"auto"`` takes Triton on CUDA where triton imports, the compiled C kernel on
    CPU, torch ops otherwise; an explicit backend that cannot rotate ``xs`` is
    refused, naming ``backend`` and what it accepts.
    """
    x = xs[0]
    if backend == "auto":
        if x.device.type == "cuda" and all(map(_triton_applies, xs)) and triton_available():
            return "triton"
        return "kernel" if x.device.type == "cpu" else "torch"
    if backend == "kernel":
        if compiled is None:
            raise ValueError(
                "backend='kernel' needs posenc's compiled kernel, which this install lacks "
                "(no C compiler at build time); use backend='auto' or 'torch'"
            )
        if not all(map(_kernel_applies, xs)):
            raise ValueError(
                "backend='kernel' rotates CPU float32 or bfloat16 tensors with unit stride "
                f"along head_dim and 1 to {_KERNEL_MAX_LEAD} leading dims; got "
                + ", ".join(f"{t.dtype} {tuple(t.shape)} on {t.device}" for t in xs)
            )
    if backend == "triton":
        if not triton_available():
            raise ValueError("backend='triton' needs the triton package, which does not import")
        if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "backend='triton' runs on GPU tensors; on CPU tensors only under "
                "TRITON_INTERPRET=1 (Triton's interpreter)"
            )
        if not all(map(_triton_applies, xs)):
            raise ValueError(
                "backend='triton' rotates float32, bfloat16 or float16 tensors with 1 to "
                f"{_TRITON_MAX_LEAD} leading dims; got "
                + ", ".join(f"{t.dtype} {tuple(t.shape)}" for t in xs)
            )
    return backend


def _rotate_torch(
    x: torch.Tensor, cos: torch.Tensor, s: torch.Tensor, rotary_dim: int, layout: str, sign: float
) -> torch.Tensor:
    """The rotation by ``sign * theta`` as a fresh tensor of ``x``'s dtype, in torch's eager ops."""
    work = checks.work_dtype(x.dtype)
    if x.dtype == work:
        out = torch.empty(x.shape, dtype=work, device=x.device)
        if rotary_dim < x.shape[-1]:
            out[..., rotary_dim:].copy_(x[..., rotary_dim:])
        _rotate_into(x, cos, s, rotary_dim, layout, sign, out)
        return out
    lead = x.shape[:-2]
    if (
        x.ndim >= 3
        and cos.ndim <= x.ndim
        and x.shape[-2] * x.shape[-1] >= _BLOCK_ELEMENTS
        and math.prod(lead) > 1
    ):
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        for index in itertools.product(*map(range, lead)):
            block = x[index].to(work)  # the pass-through channels come along
            c = cos[_leading_index(cos, index, x.ndim)]
            sb = s[_leading_index(s, index, x.ndim)]
            _rotate_into(block, c, sb, rotary_dim, layout, sign, block)
            out[index].copy_(block)
        return out
    xw = x.to(work)  # one upcast copy, rotated in place
    _rotate_into(xw, cos, s, rotary_dim, layout, sign, xw)
    return xw.to(x.dtype)


def _rotate_eager(
    xs: Sequence[torch.Tensor],
    cos: torch.Tensor,
    s: torch.Tensor,
    rotary_dim: int,
    layout: str,
    sign: float,
    backend: str,
) -> tuple[torch.Tensor, ...]:
    """Every ``x`` of ``xs`` rotated by ``sign * theta``, fresh tensors of their dtypes.

    ``backend`` is resolved (``_resolve_backend``): ``"triton"`` rotates all of
    ``xs`` in one launch; ``"kernel"`` takes the C kernel where it applies to an ``x``
    (``"auto"`` on CPU resolves to it, and a gradient may not qualify), torch's ops
    elsewhere.
    """
    if backend == "triton":
        from posenc.core import triton_rotary

        # one cos per pair, as s; the inputs were checked where backend was resolved
        pair = cos[..., : rotary_dim // 2] if layout == "half" else cos[..., 0::2]
        return tuple(
            triton_rotary.launch(xs, pair, s, rotary_dim=rotary_dim, layout=layout, sign=sign)
        )
    out = []
    for x in xs:
        fused = None
        if backend == "kernel" and _kernel_applies(x):
            fused = _rotate_kernel(x, cos, s, rotary_dim, layout, sign)
        out.append(
            fused if fused is not None else _rotate_torch(x, cos, s, rotary_dim, layout, sign)
        )
    return tuple(out)


def _rotate_functional(
    x: torch.Tensor, cos: torch.Tensor, s: torch.Tensor, rotary_dim: int, layout: str
) -> torch.Tensor:
    """The same rotation with out-of-place ops only (for torch.compile and autograd)."""
    work = checks.work_dtype(x.dtype)
    xr = x[..., :rotary_dim].to(work)
    x1, x2 = _halves(xr, rotary_dim, layout)
    c1, c2 = _halves(cos, rotary_dim, layout)
    y1, y2 = x1 * c1 - x2 * s, x2 * c2 + x1 * s
    if layout == "half":
        y = torch.cat([y1, y2], dim=-1)
    else:
        y = torch.stack([y1, y2], dim=-1).flatten(-2)
    y = y.to(x.dtype)
    if rotary_dim < x.shape[-1]:
        y = torch.cat([y, x[..., rotary_dim:]], dim=-1)
    return y


class _Rotate(torch.autograd.Function):
    """Rotation of one or more tensors by ``sign * theta``; the backward rotates by ``-sign``.

    Saves only ``cos`` and ``s``; the backward is itself a ``_Rotate`` (one launch for
    every gradient that is wanted), so double backward works too.
    """

    @staticmethod
    def forward(
        ctx: Any,
        cos: torch.Tensor,
        s: torch.Tensor,
        rotary_dim: int,
        layout: str,
        sign: float,
        backend: str,
        *xs: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.save_for_backward(cos, s)
        ctx.rotary_dim, ctx.layout, ctx.sign, ctx.backend = rotary_dim, layout, sign, backend
        ctx.set_materialize_grads(False)  # an unused output costs no rotation of zeros
        out = _rotate_eager(xs, cos, s, rotary_dim, layout, sign, backend)
        # rotated together, q may need a gradient and k not: k's result does not either
        frozen = [o for i, o in enumerate(out) if not ctx.needs_input_grad[_FIXED + i]]
        ctx.mark_non_differentiable(*frozen)
        return out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        cos, s = ctx.saved_tensors
        wanted = [
            i for i, g in enumerate(grads) if g is not None and ctx.needs_input_grad[_FIXED + i]
        ]
        present = [g for i, g in enumerate(grads) if i in wanted and g is not None]
        rotated: tuple[torch.Tensor, ...] = ()
        if present:
            backend = ctx.backend  # "kernel" falls back per tensor in _rotate_eager
            if backend == "triton" and not all(map(_triton_applies, present)):
                backend = "torch"
            rotated = _Rotate.apply(
                cos, s, ctx.rotary_dim, ctx.layout, -ctx.sign, backend, *present
            )
        out: list[Any] = [None] * len(grads)
        for i, g in zip(wanted, rotated, strict=True):
            out[i] = g
        return (None,) * _FIXED + tuple(out)


_FIXED = 6  # the arguments of _Rotate.forward before the tensors it rotates


def _broadcasts(shape: Sequence[int], target: Sequence[int]) -> bool:
    """Whether ``shape`` broadcasts to exactly ``target`` (numpy's rules, right-aligned)."""
    if len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(target), strict=False))


def _check_broadcast(x: torch.Tensor, cos: torch.Tensor, rotary_dim: int) -> None:
    """Refuse ``cos`` and ``sin`` that do not broadcast to ``x[..., :rotary_dim]``'s shape.

    Broadcasting must not grow the result past ``x``'s shape either: the result is
    shaped like ``x``.
    """
    rotated = (*x.shape[:-1], rotary_dim)
    if not _broadcasts(cos.shape, rotated):
        raise ValueError(
            f"cos and sin of shape {tuple(cos.shape)} do not broadcast against "
            f"x[..., :rotary_dim] of shape {rotated} (x has shape {tuple(x.shape)}); "
            "cos and sin are (..., seq, rotary_dim), their leading dims 1 or x's"
        )


def rotate_all(
    xs: Sequence[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str,
    rotary_dim: int,
    backend: str = "auto",
) -> tuple[torch.Tensor, ...]:
    """:func:`apply_rotary` of every ``x`` in ``xs`` by the same angles, without its checks.

    For callers that built ``cos`` and ``sin`` themselves and checked ``xs`` (the
    rotary modules, attention, ring attention: their q and k, which may differ in
    head count): on CUDA the Triton kernel rotates all of them in one launch, and
    so does the backward. Every ``x`` shares one dtype and device.
    """
    work = checks.work_dtype(xs[0].dtype)
    if torch.compiler.is_compiling() or cos.requires_grad or sin.requires_grad:
        c, s = _angles(cos, sin, layout, work)
        return tuple(_rotate_functional(x, c, s, rotary_dim, layout) for x in xs)
    device = xs[0].device
    c, s = _angles(cos.to(device), sin.to(device), layout, work)
    chosen = _resolve_backend(backend, xs)
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        rotated: tuple[torch.Tensor, ...] = _Rotate.apply(
            c, s, rotary_dim, layout, 1.0, chosen, *xs
        )
        return rotated
    return _rotate_eager(xs, c, s, rotary_dim, layout, 1.0, chosen)


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: Layout = "half",
    rotary_dim: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` channels of ``x`` by the angles of ``cos`` and ``sin``.

    Matches HF's ``apply_rotary_pos_emb`` (``layout="half"``; GPT-NeoX's for
    partial rotary) and Meta's complex multiply (``layout="interleaved"``).
    bfloat16 and float16 inputs are rotated in float32 and rounded once;
    float64 in float64. The result has ``x``'s dtype, device and shape.

    Gradients flow to ``x`` through a custom autograd function whose backward
    is the inverse rotation, saving only ``cos`` and ``sin``. If ``cos`` or
    ``sin`` require grad, plain autograd over the formula is used instead.

    Under ``torch.compile`` every backend traces the formula, out of place: inductor
    fuses it into one generated kernel together with its neighbours (the projection
    that makes q and k, a transpose, a cast), which an opaque custom op would keep
    apart; the graph has no break and no posenc op in it.

    Args:
        x: float tensor ``(..., seq, head_dim)``.
        cos: ``(..., seq, rotary_dim)``, broadcastable against
            ``x[..., :rotary_dim]``, in ``layout`` order (each angle twice).
        sin: like ``cos``.
        layout: ``"half"`` or ``"interleaved"``.
        rotary_dim: channels to rotate; ``cos.shape[-1]`` by default.
        backend: ``"auto"`` (the fused Triton kernel on CUDA where ``triton`` imports,
            the compiled C kernel on CPU, torch's ops otherwise), ``"kernel"`` (the C
            kernel: CPU float32 or bfloat16 with unit stride along ``head_dim``),
            ``"triton"`` (float32, bfloat16 or float16 with at most four leading
            dims, any strides; CUDA tensors, or CPU ones under ``TRITON_INTERPRET=1``)
            or ``"torch"``. Every backend rounds the same float32 products once.

    Returns:
        The rotated tensor, shaped and typed like ``x``.

    Raises:
        TypeError: ``x``, ``cos`` or ``sin`` not float tensors.
        ValueError: unknown ``layout`` or ``backend``, or a backend that cannot
            rotate ``x`` (named, with what it accepts); odd ``rotary_dim``, or larger
            than ``head_dim``, or different from ``cos.shape[-1]``; ``cos`` and ``sin``
            of different shapes, or shapes that do not broadcast against
            ``x[..., :rotary_dim]`` (named, before any work).

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> x = torch.randn(1, 2, 5, 8)  # (batch, heads, seq, head_dim)
        >>> cos, sin = posenc.Rotary(8).cos_sin(torch.arange(5))  # (seq, head_dim) each
        >>> y = posenc.apply_rotary(x, cos, sin)
        >>> y.shape
        torch.Size([1, 2, 5, 8])
        >>> rotate_half = lambda t: torch.cat((-t[..., 4:], t[..., :4]), dim=-1)  # HF's
        >>> torch.allclose(y, x * cos + rotate_half(x) * sin)
        True
    """
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            shown = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name} must be a float tensor; got {shown}")
    checks.check_choice(layout, "layout", LAYOUTS)
    checks.check_choice(backend, "backend", BACKENDS)
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape; got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if rotary_dim is None:
        rotary_dim = int(cos.shape[-1])
    rotary_dim = checks.check_int(rotary_dim, "rotary_dim", minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even; got {rotary_dim}")
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"rotary_dim ({rotary_dim}) must be <= head_dim ({x.shape[-1]})")
    if cos.shape[-1] != rotary_dim:
        raise ValueError(
            f"cos and sin must have rotary_dim={rotary_dim} channels; got {cos.shape[-1]}"
        )
    _check_broadcast(x, cos, rotary_dim)
    return rotate_all((x,), cos, sin, layout=layout, rotary_dim=rotary_dim, backend=backend)[0]
