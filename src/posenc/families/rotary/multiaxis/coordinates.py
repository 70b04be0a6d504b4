"""Rotations by the float coordinates of image patches, shared by RoPE-Mixed and DINOv3's RoPE.

Both rotate the last ``n`` tokens of ``(batch, heads, seq, head_dim)`` queries and
keys by angles of their ``(n, 2)`` patch coordinates and leave the first ``seq - n``
(the class and register tokens) as they are: timm's ``Attention`` with ``rope`` (its
``num_prefix_tokens``), transformers' DINOv3 ``apply_rotary_pos_emb`` (patch tokens
only) and rope-vit's ``q[:, :, 1:]``. :class:`CoordinateRotation` gives the same
rotation to :func:`posenc.attention` as a :class:`posenc.rotary.rotation.Rotation`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from posenc.core import checks
from posenc.families.rotary.apply import rotate_all

#: ``tables(coords, dtype)``: ``(cos, sin)`` of coordinates ``(..., n, 2)`` in ``dtype``,
#: broadcasting against ``(batch, heads, n, head_dim)`` tensors, in the rotation's layout.
Tables = Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]]


def check_coords(coords: Any, name: str = "coords") -> torch.Tensor:
    """A float tensor ``(n, 2)`` or ``(batch, n, 2)`` of patch coordinates.

    Raises:
        TypeError: not a float tensor.
        ValueError: another shape, or values that are not finite.
    """
    coords = checks.check_float_tensor(coords, name)
    if coords.ndim not in (2, 3) or coords.shape[-1] != 2:
        raise ValueError(
            f"{name} must be (n, 2) or (batch, n, 2) float coordinates; got shape "
            f"{tuple(coords.shape)}"
        )
    if not torch.compiler.is_compiling() and not bool(torch.isfinite(coords).all()):
        raise ValueError(f"{name} must be finite; got NaN or infinite values")
    return coords


def _pairs(t: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members of every pair, as :func:`posenc.apply_rotary` pairs them."""
    if layout == "half":
        h = t.shape[-1] // 2
        return t[..., :h], t[..., h:]
    return t[..., 0::2], t[..., 1::2]


def _join(a: torch.Tensor, b: torch.Tensor, layout: str) -> torch.Tensor:
    return torch.cat([a, b], dim=-1) if layout == "half" else torch.stack([a, b], -1).flatten(-2)


class _LearnedRotate(torch.autograd.Function):
    """The rotation by tables that need a gradient: the fast rotation forward (posenc's
    kernels), the inverse rotation backward, and the tables' gradients in one pass.

    ``y1 = x1 c1 - x2 s``, ``y2 = x2 c2 + x1 s`` (``c1``, ``c2`` the two copies of each
    cos, ``s`` the first copy of each sin, as :func:`posenc.apply_rotary` reads them), so
    ``dc1 = g1 x1``, ``dc2 = g2 x2`` and ``ds = g2 x1 - g1 x2``, summed over the dims the
    tables broadcast along. Saves the tables and the inputs, as autograd over the formula
    would.
    """

    @staticmethod
    def forward(
        ctx: Any, cos: torch.Tensor, sin: torch.Tensor, layout: str, *xs: torch.Tensor
    ) -> Any:
        ctx.layout = layout
        ctx.save_for_backward(cos, sin, *xs)
        # detached: rotate_all takes its fast (kernel) path for tables without a gradient
        return rotate_all(xs, cos.detach(), sin.detach(), layout=layout, rotary_dim=cos.shape[-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        cos, sin, *xs = ctx.saved_tensors
        layout, dim = ctx.layout, cos.shape[-1]
        given = [(i, g) for i, g in enumerate(grads) if g is not None]
        out_x: list[Any] = [None] * len(xs)
        wanted = [(i, g) for i, g in given if ctx.needs_input_grad[3 + i]]
        if wanted:  # the inverse rotation: the same cos, sin negated
            back = rotate_all([g for _, g in wanted], cos, -sin, layout=layout, rotary_dim=dim)
            for (i, _), gx in zip(wanted, back, strict=True):
                out_x[i] = gx
        d_cos = d_sin = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            work = checks.work_dtype(xs[0].dtype)
            half = (*cos.shape[:-1], dim // 2)
            c1 = c2 = s1 = None
            for i, g in given:  # reduced to the tables' shape first: no full-size join
                x1, x2 = _pairs(xs[i].to(work), layout)
                g1, g2 = _pairs(g.to(work), layout)
                terms = (
                    (g1 * x1).sum_to_size(half),
                    (g2 * x2).sum_to_size(half),
                    (g2 * x1 - g1 * x2).sum_to_size(half),
                )
                if c1 is None or c2 is None or s1 is None:
                    c1, c2, s1 = terms
                else:
                    c1, c2, s1 = c1 + terms[0], c2 + terms[1], s1 + terms[2]
            if c1 is not None and c2 is not None and s1 is not None:
                d_cos = _join(c1, c2, layout).to(cos.dtype)
                d_sin = _join(s1, torch.zeros_like(s1), layout).to(sin.dtype)
        return (d_cos, d_sin, None, *out_x)


def rotate_tables(
    xs: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, *, layout: str
) -> tuple[torch.Tensor, ...]:
    """Every ``x`` of ``xs`` rotated by all its channels' ``cos`` and ``sin`` (``layout``).

    Tables that need a gradient (learned frequencies) go through one autograd function
    that keeps posenc's fast rotation and computes their gradients in one pass; others
    (and every call under ``torch.compile``) through :func:`rotate_all`.
    """
    if (
        (cos.requires_grad or sin.requires_grad)
        and torch.is_grad_enabled()
        and not (torch.compiler.is_compiling())
    ):
        rotated: tuple[torch.Tensor, ...] = _LearnedRotate.apply(cos, sin, layout, *xs)
        return rotated
    return rotate_all(xs, cos, sin, layout=layout, rotary_dim=cos.shape[-1])


def rotate_patches(
    tables: Tables,
    q: torch.Tensor,
    k: torch.Tensor,
    coords: torch.Tensor,
    *,
    layout: str,
    head_dim: int,
    heads: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` with their last ``n`` tokens rotated by ``coords`` ``(n, 2)``.

    Raises:
        TypeError: ``q`` or ``k`` not float tensors of one dtype; bad ``coords``.
        ValueError: ``q``/``k`` not ``(batch, heads, seq, head_dim)`` with that
            ``head_dim`` (and ``heads``, when given); more coordinates than tokens.
    """
    q = checks.check_float_tensor(q, "q")
    k = checks.check_float_tensor(k, "k")
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype; got {q.dtype} and {k.dtype}")
    coords = check_coords(coords)
    n = coords.shape[-2]
    for name, t in (("q", q), ("k", k)):
        if t.ndim != 4 or t.shape[-1] != head_dim or (heads is not None and t.shape[1] != heads):
            want = "heads" if heads is None else f"heads={heads}"
            raise ValueError(
                f"{name} must be (batch, {want}, seq, head_dim={head_dim}); got shape "
                f"{tuple(t.shape)}"
            )
        if t.shape[2] < n:
            raise ValueError(
                f"coords hold {n} patches but {name} has only {t.shape[2]} tokens (the last n "
                "tokens are the patches; the first seq - n, class and register tokens, pass "
                "through)"
            )
    if coords.ndim == 3 and coords.shape[0] not in (1, q.shape[0]):
        raise ValueError(
            f"coords (batch, n, 2) must have batch 1 or q's {q.shape[0]}; got {tuple(coords.shape)}"
        )
    cos, sin = tables(coords.to(q.device), checks.work_dtype(q.dtype))
    prefix_q, prefix_k = q.shape[2] - n, k.shape[2] - n
    qr, kr = rotate_tables((q[:, :, prefix_q:], k[:, :, prefix_k:]), cos, sin, layout=layout)
    if prefix_q:
        qr = torch.cat([q[:, :, :prefix_q], qr], dim=2)
    if prefix_k:
        kr = torch.cat([k[:, :, :prefix_k], kr], dim=2)
    return qr, kr


class CoordinateRotation:
    """A :class:`posenc.rotary.rotation.Rotation` whose position ``p`` reads ``coords[p]``.

    For :func:`posenc.attention`'s ``rotary=``: positions index the rows of
    ``coords`` ``(seq, 2)`` (a class token given ``(0, 0)`` is not rotated: its
    angles are 0).
    """

    def __init__(
        self, tables: Tables, coords: torch.Tensor, *, layout: str, head_dim: int, heads: int | None
    ) -> None:
        coords = check_coords(coords)
        if coords.ndim != 2:
            raise ValueError(
                f"coords must be (seq, 2): positions index its rows; got {tuple(coords.shape)}"
            )
        self.tables, self.coords = tables, coords
        self.layout, self.head_dim, self.heads = layout, head_dim, heads

    def rotate(
        self, xs: Sequence[torch.Tensor], positions: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Every ``x`` ``(batch, heads, seq, head_dim)`` of ``xs`` rotated by ``coords[positions]``.

        Raises:
            ValueError: a tensor of other ``head_dim`` or heads; positions outside
                ``coords``.
        """
        if not xs:
            return ()
        for x in xs:
            if (
                x.ndim != 4
                or x.shape[-1] != self.head_dim
                or (self.heads is not None and x.shape[1] != self.heads)
            ):
                want = "heads" if self.heads is None else f"heads={self.heads}"
                raise ValueError(
                    f"the tensors must be (batch, {want}, seq, head_dim={self.head_dim}); got "
                    f"shape {tuple(x.shape)}"
                )
        n = self.coords.shape[0]
        if positions.numel() and not torch.compiler.is_compiling():
            lo, hi = int(positions.min()), int(positions.max())
            if lo < 0 or hi >= n:
                raise ValueError(
                    f"positions index the {n} rows of coords; got positions {lo} .. {hi}"
                )
        where = self.coords.to(xs[0].device)[positions.to(xs[0].device)]
        cos, sin = self.tables(where, checks.work_dtype(xs[0].dtype))
        if positions.ndim == 2 and cos.ndim == 3:  # (rows, seq, dim), the same for all heads
            cos, sin = cos[:, None], sin[:, None]
        return rotate_tables(xs, cos, sin, layout=self.layout)

    def __repr__(self) -> str:
        return f"CoordinateRotation(coords={tuple(self.coords.shape)}, layout={self.layout!r})"
