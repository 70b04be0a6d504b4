"""The rotation protocols: what :func:`posenc.attention` asks of its ``rotary=``.

A rotary encoding turns each query and key by angles of its position. Attention
asks one of two things of it:

- :meth:`Rotation.rotate`: the tensors ``(batch, heads, seq, head_dim)`` rotated
  at positions ``(seq,)`` (every row alike) or ``(rows, seq)`` (positions within
  packed documents, per row), queries and keys alike. :class:`posenc.Rotary`
  (every frequency schedule), :class:`posenc.FoPE` (a learned mix of frequencies
  per head) and :class:`RotaryTables` (cos/sin tables made elsewhere: M-RoPE's,
  or any model's own) implement it; so can a user's class.
- :meth:`PairRotation.rotate_pair`, for an encoding that treats queries and keys
  differently: it is given both, with their positions, and returns a
  :class:`RotatedPair`. Its tensors may have another channel count than the
  inputs (PoPE's magnitudes and phases: twice as many), and the query may come
  in several *variants*, one of which scores each (query, key) pair, picked by
  ``choose`` from their positions (Dual Chunk Attention's intra-, successive- and
  inter-chunk queries). The engine scores a pair ``q_variant . k``; the default
  scale stays ``1 / sqrt(head_dim)`` of the inputs.

:func:`rotate_pair` is the one door attention calls: a :class:`Rotation` is
adapted to it (both tensors rotated alike, one variant).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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


#: ``choose(q_pos, k_pos)``: key positions ``(n,)`` of a block's queries and ``(m,)`` of its
#: keys -> the variant scoring each pair, ``(1 or batch, n, m)`` int64 in ``[0, variants)``.
Choose = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class RotatedPair:
    """Queries and keys as a :class:`PairRotation` gives them to the attention engine.

    Attributes:
        q: ``(batch, heads, q_len, variants * dim)``: the query variants side by side.
        k: ``(batch, kv_heads, k_len, dim)``.
        variants: how many query variants ``q`` holds (1: a plain rotation).
        choose: with several variants, which one scores each pair (see
            :data:`Choose`); it reads the positions the rotation was given, so it
            knows the documents of a packed call.
    """

    q: torch.Tensor
    k: torch.Tensor
    variants: int = 1
    choose: Choose | None = None

    def check(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """Refuse a pair that is not ``q``'s and ``k``'s, rotated.

        Raises:
            ValueError: batch, heads or lengths changed; ``q`` not ``variants``
                times ``k``'s channels; several variants without ``choose``.
        """
        if self.variants < 1 or (self.variants > 1) != (self.choose is not None):
            raise ValueError(
                f"a rotated pair needs variants >= 1, and choose exactly when variants > 1; "
                f"got variants={self.variants}, choose={self.choose!r}"
            )
        if self.q.shape[:3] != q.shape[:3] or self.k.shape[:3] != k.shape[:3]:
            raise ValueError(
                f"a rotation must keep batch, heads and lengths: q {tuple(q.shape)} became "
                f"{tuple(self.q.shape)}, k {tuple(k.shape)} became {tuple(self.k.shape)}"
            )
        if self.k.shape[-1] < 1 or self.q.shape[-1] != self.variants * self.k.shape[-1]:
            raise ValueError(
                f"a rotated q must hold {self.variants} variant(s) of k's {self.k.shape[-1]} "
                f"channels; got {self.q.shape[-1]}"
            )


@runtime_checkable
class PairRotation(Protocol):
    """Anything that rotates queries and keys by position, each in its own way."""

    def rotate_pair(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> RotatedPair:
        """``q`` ``(batch, heads, q_len, head_dim)`` and ``k`` ``(batch, kv_heads, k_len,
        head_dim)`` at positions ``(q_len,)`` and ``(k_len,)``, or ``(rows, q_len)`` and
        ``(rows, k_len)`` (rows 1 or batch; positions within packed documents).

        Raises:
            ValueError: tensors the rotation cannot take, naming them.
        """
        ...


def rotate_pair(
    rotary: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
) -> RotatedPair:
    """``q`` and ``k`` rotated by ``rotary``, a :class:`PairRotation` or a :class:`Rotation`.

    A :class:`Rotation` turns both alike (one call when the positions are one
    tensor: one launch on CUDA). The result is checked (:meth:`RotatedPair.check`).

    Raises:
        TypeError: ``rotary`` neither.
        ValueError: a pair that is not q's and k's, rotated.
    """
    if isinstance(rotary, PairRotation):
        pair = rotary.rotate_pair(q, k, q_positions, k_positions)
        if not isinstance(pair, RotatedPair):
            raise TypeError(
                f"{type(rotary).__name__}.rotate_pair must return a RotatedPair; got "
                f"{type(pair).__name__}"
            )
    elif isinstance(rotary, Rotation):
        if q_positions is k_positions:
            rq, rk = rotary.rotate((q, k), k_positions)
        else:
            (rq,) = rotary.rotate((q,), q_positions)
            (rk,) = rotary.rotate((k,), k_positions)
        pair = RotatedPair(rq, rk)
    else:
        raise TypeError(
            "rotary must have rotate(xs, positions) (posenc.rotary.rotation.Rotation: a "
            "posenc.Rotary, FoPE or RotaryTables) or rotate_pair(q, k, q_positions, "
            f"k_positions) (a PairRotation: posenc.PoPE, DualChunkRotary); got "
            f"{type(rotary).__name__}"
        )
    pair.check(q, k)
    return pair


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
