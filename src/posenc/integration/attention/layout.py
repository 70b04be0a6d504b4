"""Layout: which keys each query sees, and where each sits, for every attention engine.

The softmax engine, its compiled loop, FlexAttention, the checkpointed path,
stick-breaking, PaTH and ring attention read one description of a call's layout:

- q, k and v checked (:func:`check_qkv`), queries aligned bottom-right: query ``i``
  sits at key position ``i + k_len - q_len`` (a KV cache holds the earlier keys);
- key padding (:func:`key_mask`, HF's ``attention_mask``: 1 attends);
- packed documents (:func:`documents`: flash-attn's ``cu_seqlens`` or HF's
  ``seq_idx``-style ids), each key position's document and position in it;
- Llama 4's chunks (:func:`chunks`), cut within the documents;
- the rotation of q and k at their positions (:func:`rotate`, any
  :class:`posenc.rotary.rotation.Rotation` or ``PairRotation``), and the scores of
  a block, each pair by its query variant (:func:`scores`, :func:`score_grads`);
- a block's mask (:func:`allowed`) and grouped-query heads (:func:`grouped`);
- the :class:`Plan` the softmax engine's paths read: the mask, the scale and the
  score terms' forms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posenc.core import checks
from posenc.core.positions import document_positions, packed_document_ids, packed_positions
from posenc.families.rotary.rotation import Choose, RotatedPair, rotate_pair
from posenc.families.terms import TermForm

#: Scores per block of the torch paths (4 MiB of float32): a block is a run of
#: queries against every key, so its softmax is exact without rescaling.
BLOCK_SCORES = 1 << 20


@dataclass(frozen=True)
class Mask:
    """Which keys each query sees: every engine's mask, in one place.

    Attributes:
        causal: each query sees keys up to its own position only.
        key_mask: ``(batch, k_len)`` bool, True = attend, or None.
        offset: ``k_len - q_len``, the key position of query 0.
        docs: ``(1 or batch, k_len)`` each key position's document (numbers that
            never decrease along a row), or None; a score across documents is masked.
    """

    causal: bool
    key_mask: torch.Tensor | None
    offset: int
    docs: torch.Tensor | None = None


@dataclass(frozen=True)
class Plan:
    """Everything but the tensors autograd tracks: how to score a block.

    Attributes:
        mask: which keys each query sees.
        scale: the score scale.
        forms: the terms' forms without their tensors, in order.
        sizes: how many of the call's tensors each form has.
        variants: how many query variants q holds side by side (a
            :class:`~posenc.rotary.rotation.RotatedPair`'s).
        choose: with several, which one scores each pair; None with one.
    """

    mask: Mask
    scale: float
    forms: tuple[TermForm, ...] = ()
    sizes: tuple[int, ...] = ()
    variants: int = 1
    choose: Choose | None = None

    @classmethod
    def of(
        cls,
        mask: Mask,
        scale: float,
        forms: Sequence[TermForm],
        pair: RotatedPair | None = None,
    ) -> tuple[Plan, tuple[torch.Tensor, ...]]:
        """The plan of ``forms`` (and of a rotated pair's query variants) and the forms'
        tensors, flattened in order."""
        tensors = tuple(t for f in forms for t in f.tensors)
        plan = cls(
            mask,
            scale,
            tuple(f.without_tensors() for f in forms),
            tuple(len(f.tensors) for f in forms),
            1 if pair is None else pair.variants,
            None if pair is None else pair.choose,
        )
        return plan, tensors

    def split(self, tensors: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, ...]]:
        """The call's tensors as one tuple per form."""
        out, start = [], 0
        for size in self.sizes:
            out.append(tuple(tensors[start : start + size]))
            start += size
        return out


def check_qkv(q: Any, k: Any, v: Any) -> None:
    """Refuse q, k and v that are not one attention call's ``(batch, heads, seq, dim)``.

    Raises:
        TypeError: non-float or mixed-dtype tensors.
        ValueError: tensors that are not 4-D, on several devices, of different
            batch sizes, head_dims or key lengths; heads not a multiple of
            kv_heads; ``head_dim`` 0; an empty sequence.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.check_float_tensor(t, name)
        if t.ndim != 4:
            raise ValueError(f"{name} must be (batch, heads, seq, dim); got shape {tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(
            f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}"
        )
    (b, h, _, d), (bk, hk, lk, dk), (bv, hv, lv, _) = q.shape, k.shape, v.shape
    if not b == bk == bv:
        raise ValueError(f"q, k and v must share the batch size; got {b}, {bk}, {bv}")
    if dk != d:
        raise ValueError(f"q and k must share head_dim; got {d} and {dk}")
    if (hk, lk) != (hv, lv):
        raise ValueError(
            f"k and v must have the same heads and length; got k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    if hk < 1 or h % hk:
        raise ValueError(f"q's heads ({h}) must be a multiple of k's and v's heads ({hk})")
    if d < 1:
        # scores of no channels are all 0 and the default scale 1 / sqrt(0) has no value
        raise ValueError(f"head_dim (the last dim of q and k) must be >= 1; got q {tuple(q.shape)}")
    if min(q.shape[2], lk) < 1:
        raise ValueError(f"q_len and k_len must be >= 1; got {q.shape[2]} and {lk}")


def key_mask(mask: Any, batch: int, k_len: int, device: torch.device) -> torch.Tensor:
    """HF's ``attention_mask`` ``(batch, k_len)`` (1 = attend) as a bool tensor on ``device``.

    Raises:
        TypeError: not a bool or int tensor.
        ValueError: not ``(batch, k_len)``.
    """
    if not isinstance(mask, torch.Tensor) or mask.is_floating_point() or mask.is_complex():
        shown = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(
            f"attention_mask must be a bool or int tensor (1 = attend, 0 = padding); got {shown}"
        )
    if tuple(mask.shape) != (batch, k_len):
        raise ValueError(
            f"attention_mask must be (batch, k_len) = ({batch}, {k_len}); got {tuple(mask.shape)}"
        )
    return mask.to(device=device, dtype=torch.bool)


def documents(
    cu_seqlens: Any, document_ids: Any, batch: int, k_len: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each key position's document and position in it, ``(1 or batch, k_len)`` each.

    Documents are numbered along each row from 0, never decreasing (what the
    compiled loops search); None without packing.

    Raises:
        TypeError: ``cu_seqlens`` or ``document_ids`` not an int tensor.
        ValueError: both given; ``cu_seqlens`` not rising from 0 to ``k_len``;
            ``document_ids`` not ``(k_len,)`` or ``(batch, k_len)``.
    """
    if cu_seqlens is None and document_ids is None:
        return None
    if cu_seqlens is not None and document_ids is not None:
        raise ValueError("pass cu_seqlens or document_ids, not both")
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            raise TypeError(f"cu_seqlens must be an int tensor; got {type(cu_seqlens).__name__}")
        docs = packed_document_ids(cu_seqlens, k_len).to(device)[None]
        return docs, packed_positions(cu_seqlens, k_len).to(device)[None]
    ids = document_ids
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
        shown = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise TypeError(f"document_ids must be an int tensor; got {shown}")
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[1] != k_len or ids.shape[0] not in (1, batch):
        raise ValueError(
            f"document_ids must be (k_len,) or (batch, k_len) = ({batch}, {k_len}); "
            f"got {tuple(document_ids.shape)}"
        )
    ids = ids.to(device)
    starts = torch.ones_like(ids, dtype=torch.int64)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return starts.cumsum(1) - 1, document_positions(ids)


def check_chunk_size(chunk_size: Any, q_len: int, k_len: int) -> int:
    """``chunk_size`` as an int >= 1 for a call with these lengths.

    Raises:
        TypeError: not an int.
        ValueError: below 1, or ``q_len > k_len``.
    """
    size = checks.check_int(chunk_size, "chunk_size", minimum=1)
    if q_len > k_len:
        # queries before key 0 would sit at negative positions, in no chunk of keys
        raise ValueError(
            f"chunk_size needs q_len <= k_len (queries are the last keys); got q_len={q_len}, "
            f"k_len={k_len}"
        )
    return size


def chunks(
    docs: tuple[torch.Tensor, torch.Tensor] | None, size: int, k_len: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The documents cut into chunks of ``size`` positions, and the positions unchanged.

    A key's group is its (document, position // size): numbered along each row from
    0, never decreasing, as the documents are, so every path masks and skips by them.
    """
    if docs is None:
        where = torch.arange(k_len, device=device)[None]
        doc = torch.zeros_like(where)
    else:
        doc, where = docs
    chunk = torch.div(where, size, rounding_mode="floor")
    starts = torch.ones(doc.shape, dtype=torch.int64, device=device)
    starts[:, 1:] = (doc[:, 1:] != doc[:, :-1]) | (chunk[:, 1:] != chunk[:, :-1])
    return starts.cumsum(1) - 1, where


def rotate(
    rotary: Any, q: torch.Tensor, k: torch.Tensor, offset: int, positions: torch.Tensor | None
) -> RotatedPair:
    """q and k rotated at their key positions, or at ``positions`` ``(1 or batch, k_len)``.

    Queries at ``offset ..`` of the keys' positions; with ``offset`` 0 a
    :class:`~posenc.rotary.rotation.Rotation` rotates both in one call (one launch on
    CUDA). ``rotary`` is a Rotation or a
    :class:`~posenc.rotary.rotation.PairRotation`
    (:func:`~posenc.rotary.rotation.rotate_pair`).

    Raises:
        TypeError: ``rotary`` neither.
        ValueError: a rotated pair that is not q's and k's.
    """
    where = torch.arange(k.shape[2], device=q.device) if positions is None else positions
    return rotate_pair(rotary, q, k, where if offset == 0 else where[..., offset:], where)


def scores(
    plan: Plan, qb: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor:
    """``q . k`` of a block of queries ``qb`` ``(B, H, n, variants * D)``, ``(B, H, n, m)``.

    Unscaled and unmasked; each pair by the query variant ``plan.choose`` picks
    (key positions ``q_pos`` ``(n,)`` and ``k_pos`` ``(m,)``).
    """
    hk = k.shape[1]
    kt = k.unsqueeze(2).transpose(-1, -2)
    if plan.choose is None:
        return torch.matmul(grouped(qb, hk), kt).flatten(1, 2)
    parts = qb.unflatten(-1, (plan.variants, -1))
    which = plan.choose(q_pos, k_pos)[:, None]
    s = torch.matmul(grouped(parts[..., 0, :], hk), kt).flatten(1, 2)
    for n in range(1, plan.variants):
        s = torch.where(
            which == n, torch.matmul(grouped(parts[..., n, :], hk), kt).flatten(1, 2), s
        )
    return s


def score_grads(
    plan: Plan,
    ds: torch.Tensor,
    qb: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of a block's :func:`scores` ``ds`` ``(B, H, n, m)`` as ``dq`` of the block
    ``(B, H, n, variants * D)`` and ``dk`` ``(B, kv_heads, m, D)``, unscaled."""
    hk = k.shape[1]
    if plan.choose is None:
        dq = torch.matmul(grouped(ds, hk), k.unsqueeze(2)).flatten(1, 2)
        return dq, torch.matmul(grouped(ds, hk).transpose(-1, -2), grouped(qb, hk)).sum(2)
    parts = qb.unflatten(-1, (plan.variants, -1))
    which = plan.choose(q_pos, k_pos)[:, None]
    dqs, dk = [], torch.zeros_like(k)
    for n in range(plan.variants):
        own = grouped(torch.where(which == n, ds, torch.zeros_like(ds)), hk)
        dqs.append(torch.matmul(own, k.unsqueeze(2)).flatten(1, 2))
        dk += torch.matmul(own.transpose(-1, -2), grouped(parts[..., n, :], hk)).sum(2)
    return torch.cat(dqs, -1), dk


def grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``(B, H, ...)`` -> ``(B, kv_heads, H / kv_heads, ...)`` (a view)."""
    b, h = x.shape[:2]
    return x.view(b, kv_heads, h // kv_heads, *x.shape[2:])


def allowed(mask: Mask, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
    """Which keys each query of a block sees, ``(1 or batch, 1, n, m)`` bool; None: all.

    ``q_pos`` ``(n,)`` and ``k_pos`` ``(m,)`` are key positions.
    """
    seen = None
    if mask.causal:
        seen = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if mask.key_mask is not None:
        km = mask.key_mask[:, None, None, k_pos]
        seen = km if seen is None else seen & km
    if mask.docs is not None:
        same = mask.docs[:, None, q_pos, None] == mask.docs[:, None, None, k_pos]
        seen = same if seen is None else seen & same
    return seen


def loop_keys(key_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The key mask as the compiled loops read it: ``(batch, k_len)`` uint8, contiguous."""
    return None if key_mask is None else key_mask.to(torch.uint8).contiguous()


def loop_documents(
    docs: torch.Tensor | None, batch: int, offset: int, q_len: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The documents as the compiled loops read them: int32 ``(batch, q_len)`` of the
    queries (key positions ``offset ..``) and ``(batch, k_len)`` of the keys,
    contiguous; None without packing. ``docs``: ``(1 or batch, k_len)`` or ``(k_len,)``."""
    if docs is None:
        return None
    keys = docs.to(torch.int32).expand(batch, -1).contiguous()
    return keys[:, offset : offset + q_len].contiguous(), keys
