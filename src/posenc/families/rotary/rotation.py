"""The rotation protocol: what :func:`posenc.attention` asks of its ``rotary=``.

A rotary encoding turns each query and key by angles of its position. Attention
needs one thing of it: :meth:`Rotation.rotate`, the tensors ``(batch, heads, seq,
head_dim)`` rotated at positions ``(seq,)`` (every row alike) or ``(rows, seq)``
(positions within packed documents, per row). :class:`posenc.Rotary` (every
frequency schedule), :class:`posenc.FoPE` (a learned mix of frequencies per
head) and :class:`RotaryTables` (cos/sin tables made elsewhere: M-RoPE's, or any
model's own) implement it; so can a user's class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from posenc.core import checks
from posenc.families.rotary.apply import rotate_all
from posenc.families.rotary.tables import LAYOUTS


@runtime_checkable
class Rotation(Protocol):
    """Anything that rotates queries and keys by position."""

    def rotate(
        self, xs: Sequence[torch.Tensor], positions: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Every ``x`` of ``xs`` ``(batch, heads, seq, head_dim)`` rotated at ``positions``.

        ``positions`` is ``(seq,)`` or ``(rows, seq)`` (rows 1 or batch), int. The
        tensors of ``xs`` share a dtype and device and may differ in heads (q and k
        under grouped-query attention).

        Raises:
            ValueError: tensors whose head_dim, heads or length the rotation cannot
                take, naming them.
        """
        ...


class RotaryTables:
    """Cos and sin tables made elsewhere, as a :class:`Rotation`.

    For M-RoPE (``posenc.rotary.multiaxis``: its three position axes give one
    table row per token) or any model's own tables: ``rotate`` reads the rows of
    the positions it is given.

    Args:
        cos, sin: ``(seq, rotary_dim)`` for every row, or ``(batch, seq,
            rotary_dim)`` per row, in ``layout`` order (HF's ``cos, sin``).
        layout: ``"half"`` (GPT-NeoX, HF) or ``"interleaved"`` (GPT-J, Meta).

    Raises:
        TypeError: cos or sin not float tensors.
        ValueError: shapes that differ or are not 2-D or 3-D, an odd
            ``rotary_dim``, an unknown layout.
    """

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "half") -> None:
        checks.check_float_tensor(cos, "cos")
        checks.check_float_tensor(sin, "sin")
        if cos.shape != sin.shape or cos.ndim not in (2, 3) or cos.shape[-1] % 2:
            raise ValueError(
                "cos and sin must share one shape, (seq, rotary_dim) or (batch, seq, "
                f"rotary_dim) with rotary_dim even; got {tuple(cos.shape)} and {tuple(sin.shape)}"
            )
        checks.check_choice(layout, "layout", LAYOUTS)
        self.layout = layout
        self.cos, self.sin = cos, sin
        self.rotary_dim = cos.shape[-1]

    def rotate(
        self, xs: Sequence[torch.Tensor], positions: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Every ``x`` of ``xs`` rotated by the rows of the given tables at ``positions``."""
        for x in xs:
            if x.shape[-1] < self.rotary_dim:
                raise ValueError(
                    f"rotary tables have rotary_dim={self.rotary_dim}; the tensors have "
                    f"{x.shape[-1]} channels"
                )
        cos, sin = self.cos.to(xs[0].device), self.sin.to(xs[0].device)
        if cos.ndim == 2:  # (seq, dim): the positions' rows
            c, s = cos[positions], sin[positions]
            if positions.ndim == 2:
                c, s = c[:, None], s[:, None]
        else:  # (batch, seq, dim): each row's own
            rows = torch.arange(cos.shape[0], device=cos.device)[:, None]
            where = positions if positions.ndim == 2 else positions[None]
            c, s = cos[rows, where][:, None], sin[rows, where][:, None]
        return rotate_all(xs, c, s, layout=self.layout, rotary_dim=self.rotary_dim)

    def __repr__(self) -> str:
        return f"RotaryTables(shape={tuple(self.cos.shape)}, layout={self.layout!r})"
