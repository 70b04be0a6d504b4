"""Position numbers as the reference models compute them from tokens, masks and caches.

An absolute encoding is only as right as the positions it is given. Each helper
reproduces one convention users already run; numpy in gives numpy out, torch
in gives torch out on the same device (torch is imported only when a torch
object is passed or a ``device`` is asked for). Every result is int64, except
the float64 positions of the two multimodal conventions below.

Shapes: ``(seq,)`` or ``(batch, seq)``; cumulative sums run along the last axis.

- :func:`fairseq_positions`: fairseq ``utils.make_positions`` (HF M2M100,
  RoBERTa): real tokens are numbered from ``padding_idx + 1``, pads get
  ``padding_idx`` (the zero row of the table).
- :func:`opt_positions`: HF OPT: ``cumsum(mask) * mask - 1``, so left pads get
  ``-1`` and the first real token ``0`` (the embedding adds its offset 2).
- :func:`cache_positions`: ``past_length .. past_length + seq_len - 1``, the
  positions of new tokens behind a KV cache (HF ``cache_position``).
- :func:`mask_positions`: HF ``generate``'s ``cumsum(mask) - 1`` with pads set to
  ``pad_value``, for left or right padding.

Packed sequences (several documents in one row, attention kept within each):

- :func:`packed_positions`: ``i - cu_seqlens[doc(i)]``, positions restarting at 0
  per document, as flash-attn's ``varlen`` functions and HF's
  ``DataCollatorWithFlattening`` number them.
- :func:`document_positions`: the same from per-token document ids (HF's
  ``seq_idx``), restarting wherever the id changes.
- :func:`packed_document_ids` and :func:`cu_seqlens_from_document_ids`: the two
  descriptions of a packing, each from the other.
- :func:`restart_positions`: any position ids of a packed row (M-RoPE's
  ``(3, seq)`` ones too) made to restart per document, axis by axis.

Multimodal position ids (text tokens and images or videos in one sequence), float:

- :func:`videorope_positions`: VideoRoPE's ``(3, seq)`` temporal/height/width ids
  (diagonal layout, frames ``delta`` apart), for
  ``mrope_cos_sin(..., videorope=True)``.
- :func:`v2pe_positions`: V2PE's ids, visual tokens ``stride / 256`` apart, for
  :class:`posenc.Rotary` (which rotates float positions exactly).

``cu_seqlens`` is flash-attn's: ``(n + 1,)`` ints rising from 0 to the number of
packed tokens; equal neighbours are empty documents, which flash-attn allows too.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.core import checks


def _is_symint(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.SymInt)


def _check_int(value: Any, name: str, minimum: int = 0, *, tensor_ok: bool = False) -> Any:
    """An int of at least ``minimum``; under torch.compile a SymInt; with ``tensor_ok`` a
    0-d int tensor too (returned as is)."""
    if _is_symint(value) or (tensor_ok and checks.is_torch(value)):
        checks.is_int_offset(value, name)  # rejects tensors of another shape or dtype
        return value
    return checks.check_int(value, name, minimum)


def _as_array(
    x: Any,
    name: str,
    kinds: str,
    what: str,
    ranks: tuple[int, ...] = (1, 2),
    shapes: str = "(seq,) or (batch, seq)",
) -> Any:
    """``x`` as a tensor (unchanged) or numpy array, of a rank in ``ranks`` (described by
    ``shapes``) and dtype kind in ``kinds``."""
    if checks.is_torch(x):
        import torch

        kind = (
            "b"
            if x.dtype == torch.bool
            else "f"
            if x.is_floating_point()
            else "c"
            if x.is_complex()
            else "i"
        )
        shown = str(x.dtype)
    else:
        try:
            x = np.asarray(x)
        except Exception as exc:  # pragma: no cover - numpy raises various errors
            raise TypeError(f"{name} must be an array or a tensor of {what}: {exc}") from None
        kind = "i" if x.dtype.kind == "u" else x.dtype.kind
        shown = str(x.dtype)
    if kind not in kinds:
        raise TypeError(f"{name} must hold {what}; got dtype {shown}")
    if x.ndim not in ranks:
        raise ValueError(f"{name} must be {shapes}; got shape {tuple(x.shape)}")
    return x


def _int64(x: Any) -> Any:
    """An int array or tensor as int64 (the dtype of every result here)."""
    if checks.is_torch(x):
        import torch

        return x.to(torch.int64)
    return x.astype(np.int64)


def _arange(n: Any, like: Any) -> Any:
    """``0 .. n - 1`` as int64, a tensor on ``like``'s device when ``like`` is one."""
    if checks.is_torch(like):
        import torch

        return torch.arange(n, dtype=torch.int64, device=like.device)
    return np.arange(n, dtype=np.int64)


def fairseq_positions(tokens: Any, padding_idx: int = 1, past_length: Any = 0) -> Any:
    """Position numbers of the non-pad tokens, counted from ``padding_idx + 1``.

    This is fairseq's ``utils.make_positions`` and HF's
    ``create_position_ids_from_input_ids`` (M2M100, RoBERTa, XLM-R): with
    ``mask = tokens != padding_idx``, ``(cumsum(mask) + past_length) * mask +
    padding_idx``. Pads keep ``padding_idx`` (fairseq zeroes that table row);
    a pad in the middle does not advance the count.

    Args:
        tokens: token ids, ``(seq,)`` or ``(batch, seq)``, numpy, list or torch.
        padding_idx: the pad token id, which is also the pad row of the table.
        past_length: tokens already in the KV cache (an int, or a 0-d int
            tensor for torch tokens, as compileable caches pass it).

    Returns:
        int64 positions shaped like ``tokens`` (numpy or torch, as ``tokens``).

    Raises:
        TypeError: ``tokens`` not integer ids, ``padding_idx`` or
            ``past_length`` not ints.
        ValueError: ``tokens`` not 1-D or 2-D, ``past_length`` negative.

    Examples:
        >>> import torch
        >>> import posenc
        >>> tokens = torch.tensor([[1, 1, 5, 6, 7], [5, 6, 7, 8, 9]])  # pad id 1, left padding
        >>> posenc.fairseq_positions(tokens, padding_idx=1).tolist()
        [[1, 1, 2, 3, 4], [2, 3, 4, 5, 6]]
    """
    tokens = _as_array(tokens, "tokens", "i", "integer token ids")
    padding_idx = _check_int(padding_idx, "padding_idx")
    past_length = _check_int(past_length, "past_length", tensor_ok=checks.is_torch(tokens))
    if checks.is_torch(tokens):
        import torch

        mask = tokens.ne(padding_idx).to(torch.int64)
        return (torch.cumsum(mask, dim=-1) + past_length) * mask + padding_idx
    mask = (tokens != padding_idx).astype(np.int64)
    return (np.cumsum(mask, axis=-1) + past_length) * mask + padding_idx


def opt_positions(attention_mask: Any, past_length: int = 0) -> Any:
    """HF OPT's position ids: ``cumsum(mask) * mask - 1``, keeping the last tokens.

    Matches ``OPTLearnedPositionalEmbedding.forward`` and ``OPTDecoder.forward``
    in transformers: the mask covers the cached and the new tokens, real
    tokens count from 0, pads get -1, and the first ``past_length`` columns
    (already cached) are dropped. The embedding adds its offset 2 itself
    (:class:`posenc.modules.LearnedPositionalEmbedding` with ``offset=2``).

    Args:
        attention_mask: 1 for real tokens, 0 for pads; ``(total,)`` or
            ``(batch, total)`` with ``total = past_length + seq``; bool, int
            or float (OPT builds a float mask of ones when none is given).
        past_length: tokens already in the KV cache, ``0 <= past_length <= total``.

    Returns:
        int64 positions ``(seq,)`` or ``(batch, seq)``.

    Raises:
        TypeError: ``attention_mask`` not numeric, ``past_length`` not an int.
        ValueError: mask values other than 0 and 1, wrong rank, ``past_length``
            outside ``[0, total]``.

    Examples:
        >>> import torch
        >>> import posenc
        >>> mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # left padding
        >>> posenc.opt_positions(mask).tolist()
        [[-1, -1, 0, 1, 2], [0, 1, 2, 3, 4]]
        >>> posenc.opt_positions(mask, past_length=4).tolist()  # the last token, 4 cached
        [[2], [4]]
    """
    return _mask_positions(attention_mask, -1, past_length)


def mask_positions(attention_mask: Any, pad_value: int = 0, past_length: int = 0) -> Any:
    """Real tokens numbered ``0, 1, ...`` in order, pads set to ``pad_value``.

    HF ``generate``'s position ids (``GenerationMixin._prepare_position_ids_for_generation``
    in transformers 5): ``cumsum(mask) - 1``, then ``masked_fill(mask == 0, 0)``; the
    value of a pad is never read where attention masks it, but must index a table.
    Left and right padding, and pads in the middle, give the same numbers to the same
    real tokens. ``pad_value=1`` is transformers 4's Llama ``prepare_inputs_for_generation``
    (and Idefics, Qwen2.5-Omni still), ``pad_value=-1`` is :func:`opt_positions`.

    Args:
        attention_mask: 1 for real tokens, 0 for pads; ``(total,)`` or
            ``(batch, total)`` with ``total = past_length + seq``; bool, int or float.
        pad_value: the position of every pad (any int).
        past_length: tokens already in the KV cache, ``0 <= past_length <= total``:
            their columns are dropped, as ``generate`` keeps the last ``seq``.

    Returns:
        int64 positions ``(seq,)`` or ``(batch, seq)`` (numpy or torch, as the mask).

    Raises:
        TypeError: ``attention_mask`` not numeric, ``pad_value`` or ``past_length`` not
            ints.
        ValueError: mask values other than 0 and 1, wrong rank, ``past_length``
            outside ``[0, total]``.

    Examples:
        >>> import torch
        >>> import posenc
        >>> mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # left padding
        >>> posenc.mask_positions(mask).tolist()
        [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
        >>> step = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)  # one new token
        >>> posenc.mask_positions(step, past_length=5).tolist()
        [[3], [5]]
    """
    if isinstance(pad_value, bool) or not isinstance(pad_value, (int, np.integer)):
        raise TypeError(f"pad_value must be an int; got {type(pad_value).__name__} {pad_value!r}")
    return _mask_positions(attention_mask, int(pad_value), past_length)


def _mask_positions(attention_mask: Any, pad_value: int, past_length: int) -> Any:
    """``cumsum(mask) - 1`` at real tokens, ``pad_value`` at pads, the last columns only."""
    mask = _as_array(attention_mask, "attention_mask", "bif", "0/1 values")
    past_length = _check_int(past_length, "past_length")
    total = mask.shape[-1]
    if not _is_symint(past_length) and past_length > total:
        raise ValueError(
            f"past_length must be <= attention_mask.shape[-1] = {total} (the mask covers "
            f"cached and new tokens); got {past_length}"
        )
    if checks.is_torch(mask):
        import torch

        # one device sync; skipped while tracing, where the values are unknown
        if not torch.compiler.is_compiling() and bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError("attention_mask must hold only 0 and 1")
        real = mask != 0
        count = torch.cumsum(real.to(torch.int64), dim=-1) - 1
        return count.masked_fill(~real, pad_value)[..., past_length:]
    if ((mask != 0) & (mask != 1)).any():
        raise ValueError("attention_mask must hold only 0 and 1")
    kept = mask != 0
    numbered = np.cumsum(kept, axis=-1, dtype=np.int64) - 1
    return np.where(kept, numbered, np.int64(pad_value))[..., past_length:]


def cache_positions(
    seq_len: int, past_length: Any = 0, *, device: Any = None, like: Any = None
) -> Any:
    """Positions ``past_length .. past_length + seq_len - 1`` of new tokens behind a KV cache.

    HF's ``cache_position`` and the ``offset`` of rotary-embedding-torch's
    ``rotate_queries_or_keys``: forgetting it restarts every decoding step at
    position 0.

    Args:
        seq_len: number of new tokens.
        past_length: tokens already cached (an int, or a 0-d int tensor).
        device: a torch device: returns a torch tensor there.
        like: an array or tensor: returns the same kind (on its device).

    Returns:
        int64 ``(seq_len,)``: numpy unless ``device``, ``like`` or ``past_length``
        is torch.

    Raises:
        TypeError: ``seq_len``/``past_length`` not ints.
        ValueError: negative values, or both ``device`` and ``like`` given;
            ``seq_len`` above :data:`posenc.core.checks.MAX_ELEMENTS` (refused
            before any work).

    Examples:
        >>> import torch
        >>> import posenc
        >>> posenc.cache_positions(3).tolist()  # the prompt
        [0, 1, 2]
        >>> posenc.cache_positions(1, past_length=3, device="cpu")  # the next token, 3 cached
        tensor([3])
    """
    seq_len = _check_int(seq_len, "seq_len")
    if not _is_symint(seq_len):
        checks.check_elements(seq_len, f"the positions of seq_len={seq_len} new tokens")
    past_length = _check_int(past_length, "past_length", tensor_ok=True)
    if device is not None and like is not None:
        raise ValueError("pass device or like, not both")
    if checks.is_torch(like):
        device = like.device
    if checks.is_torch(past_length) and device is None:
        device = past_length.device
    if device is None:
        return np.arange(past_length, past_length + seq_len, dtype=np.int64)
    import torch

    out = torch.arange(seq_len, dtype=torch.int64, device=device)
    if checks.is_torch(past_length):
        return out + past_length.to(device=device, dtype=torch.int64)
    return out + past_length


# ---------------------------------------------------------------------------- packing


def _check_cu_seqlens(cu_seqlens: Any, total: Any) -> tuple[Any, Any]:
    """``cu_seqlens`` as int64 and the packed length (``cu_seqlens[-1]`` when ``total`` is None).

    The values are checked in eager mode only: while ``torch.compile`` traces they are
    unknown, and ``total`` must be given.
    """
    cu = _as_array(
        cu_seqlens,
        "cu_seqlens",
        "i",
        "integer cumulative lengths",
        ranks=(1,),
        shapes="1-D, (n + 1,) cumulative lengths of n documents",
    )
    if cu.shape[0] < 1:
        raise ValueError("cu_seqlens must hold at least its leading 0; got an empty array")
    cu = _int64(cu)
    if total is None:
        if checks.compiling():
            raise ValueError(
                "pass total (the packed length) under torch.compile: cu_seqlens[-1] is a "
                "value, unknown while tracing"
            )
        total = int(cu[-1])
    else:
        total = _check_int(total, "total")
    if checks.compiling():
        return cu, total
    checks.check_exact(0, total - 1, "packed positions 0 .. total - 1")
    # one sync of a device tensor: the first and last entries and the first decrease
    drops = cu[1:] < cu[:-1]
    if checks.is_torch(cu):
        import torch

        first, last, dropped = torch.stack([cu[0], cu[-1], drops.any()]).tolist()
    else:
        first, last, dropped = int(cu[0]), int(cu[-1]), bool(drops.any())
    shown = cu.tolist() if cu.shape[0] <= 16 else f"{cu.shape[0]} entries"
    if first != 0:
        raise ValueError(f"cu_seqlens must start at 0; got {shown}")
    if dropped:
        at = int(np.flatnonzero(np.asarray(drops.tolist()))[0]) + 1
        raise ValueError(
            "cu_seqlens must never decrease (equal neighbours are empty documents, as "
            f"flash-attn allows); entry {at} drops below entry {at - 1} in {shown}"
        )
    if last != total:
        raise ValueError(
            f"cu_seqlens must end at the number of packed tokens, total={total}; got {shown}"
        )
    return cu, total


def _packed(cu_seqlens: Any, total: Any) -> tuple[Any, Any, Any]:
    """``(index, doc, cu)``: every packed token's index and document, and the checked
    ``cu_seqlens``; a sorted search, so no shape depends on the values."""
    cu, total = _check_cu_seqlens(cu_seqlens, total)
    index = _arange(total, cu)
    if checks.is_torch(cu):
        import torch

        # right: an empty document (equal neighbours) owns no token
        doc = torch.searchsorted(cu[1:].contiguous(), index, right=True)
    else:
        doc = np.searchsorted(cu[1:], index, side="right").astype(np.int64)
    return index, doc, cu


def packed_positions(cu_seqlens: Any, total: Any = None) -> Any:
    """Positions restarting at 0 in every packed document: ``i - cu_seqlens[doc(i)]``.

    How flash-attn's ``varlen`` functions and HF's ``DataCollatorWithFlattening``
    (its ``position_ids``) number the tokens of documents packed into one row:
    ``cu_seqlens = [0, 3, 5]`` gives ``[0, 1, 2, 0, 1]``. ``Rotary.forward(cu_seqlens=...)``
    rotates by these.

    Args:
        cu_seqlens: ``(n + 1,)`` ints (any int dtype; flash-attn's are int32), rising
            from 0 to the number of packed tokens; equal neighbours are empty
            documents (allowed, as in flash-attn).
        total: the number of packed tokens; ``cu_seqlens[-1]`` by default. Needed
            under ``torch.compile``, where that value is unknown while tracing.

    Returns:
        int64 ``(total,)`` positions: numpy, or torch on ``cu_seqlens``' device.

    Raises:
        TypeError: ``cu_seqlens`` not integers, ``total`` not an int.
        ValueError: ``cu_seqlens`` not 1-D or empty, not starting at 0, decreasing, or
            not ending at ``total``; ``total`` of ``2**31`` or more (refused before any
            work).

    Examples:
        >>> import torch
        >>> import posenc
        >>> cu_seqlens = torch.tensor([0, 3, 5, 9], dtype=torch.int32)  # lengths 3, 2, 4
        >>> posenc.packed_positions(cu_seqlens).tolist()
        [0, 1, 2, 0, 1, 0, 1, 2, 3]
    """
    index, doc, cu = _packed(cu_seqlens, total)
    return index - cu[doc]


def packed_document_ids(cu_seqlens: Any, total: Any = None) -> Any:
    """The document of every packed token, ``0 .. n - 1`` (empty documents own none).

    HF's ``DataCollatorWithFlattening(return_seq_idx=True)`` ``seq_idx`` (without its
    batch dim); what a block-diagonal (document) attention mask compares.

    Args:
        cu_seqlens: as in :func:`packed_positions`.
        total: as in :func:`packed_positions`.

    Returns:
        int64 ``(total,)`` document indices: numpy, or torch on ``cu_seqlens``' device.

    Raises:
        TypeError: ``cu_seqlens`` not integers, ``total`` not an int.
        ValueError: as :func:`packed_positions`.

    Examples:
        >>> import torch
        >>> import posenc
        >>> cu_seqlens = torch.tensor([0, 3, 5, 9], dtype=torch.int32)  # lengths 3, 2, 4
        >>> posenc.packed_document_ids(cu_seqlens).tolist()
        [0, 0, 0, 1, 1, 2, 2, 2, 2]
    """
    return _packed(cu_seqlens, total)[1]


def _run_starts(document_ids: Any) -> tuple[Any, Any, Any]:
    """``(ids, index, start)``: ``start[..., i]`` is where the run of equal ids holding
    token ``i`` begins, along the last axis (a running maximum, no loop over runs)."""
    ids = _as_array(document_ids, "document_ids", "i", "integer document ids")
    index = _arange(ids.shape[-1], ids)
    if checks.is_torch(ids):
        import torch

        first = torch.ones_like(ids[..., :1], dtype=torch.bool)
        change = torch.cat([first, ids[..., 1:] != ids[..., :-1]], dim=-1)
        start = torch.cummax(torch.where(change, index, 0), dim=-1).values
        return ids, index, start
    changes = np.concatenate(
        [np.ones_like(ids[..., :1], dtype=bool), ids[..., 1:] != ids[..., :-1]], -1
    )
    return ids, index, np.maximum.accumulate(np.where(changes, index, 0), axis=-1)


def document_positions(document_ids: Any) -> Any:
    """Positions restarting at 0 wherever the document id changes along the last axis.

    From per-token document ids (HF's ``seq_idx``, Mamba-2's ``seq_idx``, a flex
    attention ``document_id``): ``[7, 7, 7, 2, 2]`` gives ``[0, 1, 2, 0, 1]``. A run
    of equal ids is one document, so an id that comes back after another
    (``[0, 0, 1, 0]``) starts a new document.

    Args:
        document_ids: ``(seq,)`` or ``(batch, seq)`` integer ids; each row restarts
            at its first token.

    Returns:
        int64 positions shaped like ``document_ids`` (numpy or torch, as the ids).

    Raises:
        TypeError: ``document_ids`` not integers.
        ValueError: ``document_ids`` not 1-D or 2-D.

    Examples:
        >>> import torch
        >>> import posenc
        >>> ids = torch.tensor([7, 7, 7, 2, 2, 7])  # 3 documents: 7 comes back as a new one
        >>> posenc.document_positions(ids).tolist()
        [0, 1, 2, 0, 1, 0]
    """
    _, index, start = _run_starts(document_ids)
    return index - start


def cu_seqlens_from_document_ids(document_ids: Any) -> Any:
    """flash-attn's ``cu_seqlens`` of a packed row given by per-token document ids.

    The inverse of :func:`packed_document_ids` (up to empty documents, which ids
    cannot show): ``[7, 7, 7, 2, 2]`` gives ``[0, 3, 5]``. Its length depends on
    the values, so it is for eager code (data collators), not ``torch.compile``.

    Args:
        document_ids: ``(seq,)`` integer ids, a run of equal ids per document.

    Returns:
        int64 ``(n + 1,)`` (numpy, or torch on the ids' device); flash-attn wants
        int32: ``.int()``.

    Raises:
        TypeError: ``document_ids`` not integers.
        ValueError: ``document_ids`` not 1-D.

    Examples:
        >>> import torch
        >>> import posenc
        >>> ids = torch.tensor([7, 7, 7, 2, 2, 5, 5, 5, 5])
        >>> posenc.cu_seqlens_from_document_ids(ids).int()  # for flash-attn's varlen functions
        tensor([0, 3, 5, 9], dtype=torch.int32)
    """
    ids = _as_array(document_ids, "document_ids", "i", "integer document ids", (1,), "(seq,)")
    _, index, start = _run_starts(ids)
    starts = index[start == index]
    if checks.is_torch(ids):
        import torch

        return torch.cat([starts, index.new_full((1,), ids.shape[0])])
    return np.append(starts, np.int64(ids.shape[0]))


def restart_positions(
    position_ids: Any, *, cu_seqlens: Any = None, document_ids: Any = None
) -> Any:
    """Position ids of a packed row made to restart per document, axis by axis.

    Each token's ids minus those of its document's first token. For 1-D positions
    ``0 .. seq - 1`` this is :func:`packed_positions`; its use is multi-axis ids,
    such as M-RoPE's ``(3, seq)`` or ``(3, batch, seq)`` (Qwen2-VL's
    ``get_rope_index``), computed over a packed row as one sequence: every document
    after the first is shifted by the same amount on every axis (its first token,
    text or the first cell of an image grid, is at that shift on all three), which
    this removes, giving each document the ids it gets alone.

    Args:
        position_ids: ``(..., seq)`` integer ids: ``(seq,)``, ``(batch, seq)``,
            ``(axes, seq)``, ``(axes, batch, seq)``.
        cu_seqlens: the documents of the row, as in :func:`packed_positions`
            (``total`` is ``seq``).
        document_ids: instead of ``cu_seqlens``: ``(seq,)`` or ``(batch, seq)`` ids,
            as in :func:`document_positions`, broadcasting against ``position_ids``.

    Returns:
        int64 ids shaped like ``position_ids`` (numpy or torch, as ``position_ids``;
        the packing is moved to its kind and device).

    Raises:
        TypeError: non-integer ids or packing.
        ValueError: not exactly one of ``cu_seqlens`` and ``document_ids``; a packing
            whose length is not ``position_ids.shape[-1]`` or that does not broadcast
            against it; bad ``cu_seqlens`` (see :func:`packed_positions`).

    Examples:
        >>> import torch
        >>> import posenc
        >>> ids = torch.tensor([[0, 1, 2, 3, 3, 3, 3],  # M-RoPE (t, h, w) ids of a packed row:
        ...                     [0, 1, 2, 3, 3, 4, 4],  # 3 text tokens, then a 2x2 image
        ...                     [0, 1, 2, 3, 4, 3, 4]])
        >>> posenc.restart_positions(ids, cu_seqlens=torch.tensor([0, 3, 7]))
        tensor([[0, 1, 2, 0, 0, 0, 0],
                [0, 1, 2, 0, 0, 1, 1],
                [0, 1, 2, 0, 1, 0, 1]])
    """
    if (cu_seqlens is None) == (document_ids is None):
        raise ValueError("pass exactly one of cu_seqlens and document_ids")
    pos = _as_array(
        position_ids,
        "position_ids",
        "i",
        "integer position ids",
        ranks=(1, 2, 3),
        shapes="(seq,), (batch, seq), (axes, seq) or (axes, batch, seq)",
    )
    packing = cu_seqlens if document_ids is None else document_ids
    if checks.is_torch(pos):
        import torch

        packing = torch.as_tensor(packing, device=pos.device)
    elif checks.is_torch(packing):
        packing = packing.cpu().numpy()
    seq = pos.shape[-1]
    if document_ids is None:
        offsets = packed_positions(packing, seq)
    else:
        offsets = document_positions(packing)
        try:
            np.broadcast_shapes(tuple(offsets.shape), tuple(pos.shape))
            ok = offsets.shape[-1] == seq and offsets.ndim <= pos.ndim
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"document_ids must be (seq,) or (batch, seq) broadcasting against "
                f"position_ids {tuple(pos.shape)}; got shape {tuple(offsets.shape)}"
            )
    pos = _int64(pos)
    start = _arange(seq, pos) - offsets
    if checks.is_torch(pos):
        return pos - torch.gather(pos, -1, start.expand(pos.shape))
    return pos - np.take_along_axis(pos, np.broadcast_to(start, pos.shape), -1)


# ---------------------------------------------------------------------------- multimodal


def _float_out(values: Any, device: Any) -> Any:
    """float64 ``values`` (numpy) as a torch tensor on ``device``, or unchanged if None."""
    if device is None:
        return values
    import torch

    return torch.as_tensor(values, dtype=torch.float64, device=device)


def _grid(segment: Any, index: int) -> tuple[int, int, int]:
    if isinstance(segment, (str, bytes)) or not hasattr(segment, "__len__") or len(segment) != 3:
        raise TypeError(
            f"segments[{index}] must be a number of text tokens (int) or a (frames, rows, "
            f"cols) grid of 3 ints; got {segment!r}"
        )
    t, h, w = (
        checks.check_int(v, f"segments[{index}][{axis}]", minimum=1)
        for axis, v in enumerate(segment)
    )
    return t, h, w


def videorope_positions(segments: Any, delta: float = 2.0, *, device: Any = None) -> Any:
    """VideoRoPE's ``(3, seq)`` temporal, height and width position ids.

    Wei et al. 2025 (arXiv:2502.05173), Wiselnn570/VideoRoPE ``get_t_scale_rope_index``
    (``which_rope="videorope"``, ``scale_factor=2.0``). The sequence is a list of
    segments: text runs and vision grids (a video of ``T`` frames, or an image with
    ``T = 1``, of ``H x W`` tokens after the vision encoder's spatial merge), in order.
    With ``s`` the position where a segment starts:

    - a text token ``i`` of a run is at ``s + i`` on all three axes;
    - the vision token of frame ``f``, row ``r``, column ``c`` (frame-major, then
      row-major, as the tokens come) is at ``t = s + delta f``,
      ``h = t + r - (H - 1) // 2``, ``w = t + c - (W - 1) // 2`` (the grid centred on
      the diagonal ``t = h = w``, so text and video positions line up);
    - the next segment starts at ``max(t) + 1`` (text, a generated token too, follows
      the last frame's time, not the largest height or width).

    Args:
        segments: in order, ints (a run of that many text tokens, 0 allowed) and
            ``(T, H, W)`` grids of positive ints.
        delta: the time step between frames (VideoRoPE's ``scale_factor``, 2.0 in
            its training); any positive number.
        device: a torch device: returns a float64 torch tensor there.

    Returns:
        float64 ``(3, seq)`` (numpy unless ``device``), rows temporal, height, width;
        tokens in the order of ``segments``. Rotate with
        ``mrope_cos_sin(positions[:, None], freqs, mrope_section, videorope=True)``.

    Raises:
        TypeError: ``segments`` not a list of ints and 3-int grids, ``delta`` not a
            number.
        ValueError: negative text runs, empty grids, ``delta <= 0``; more than
            :data:`posenc.core.checks.MAX_ELEMENTS` tokens (refused before any work).

    Examples:
        >>> import posenc
        >>> posenc.videorope_positions([2, (2, 2, 2), 1])  # 2 text, 2 frames of 2x2, 1 text
        array([[0., 1., 2., 2., 2., 2., 4., 4., 4., 4., 5.],
               [0., 1., 2., 2., 3., 3., 4., 4., 5., 5., 5.],
               [0., 1., 2., 3., 2., 3., 4., 5., 4., 5., 5.]])
    """
    delta = checks.check_number(delta, "delta", positive=True)
    if isinstance(segments, (str, bytes)) or not hasattr(segments, "__iter__"):
        raise TypeError(f"segments must be a list of ints and (T, H, W) grids; got {segments!r}")
    parts: list[tuple[int, tuple[int, int, int] | None]] = []
    total = 0
    for i, segment in enumerate(segments):
        if isinstance(segment, (int, np.integer)) and not isinstance(segment, bool):
            n = checks.check_int(segment, f"segments[{i}]")
            parts.append((n, None))
        else:
            frames, rows, cols = _grid(segment, i)
            n = frames * rows * cols
            parts.append((n, (frames, rows, cols)))
        total += n
    checks.check_elements(3 * total, f"the (3, seq) positions of {total} tokens")
    out = np.empty((3, total), dtype=np.float64)
    start, at = 0.0, 0
    for n, grid in parts:
        if grid is None:
            out[:, at : at + n] = start + np.arange(n, dtype=np.float64)
            start += n
        else:
            frames, rows, cols = grid
            f, r, c = np.meshgrid(
                np.arange(frames), np.arange(rows), np.arange(cols), indexing="ij"
            )
            t = start + delta * f.reshape(-1)
            out[0, at : at + n] = t
            out[1, at : at + n] = t + (r.reshape(-1) - (rows - 1) // 2)
            out[2, at : at + n] = t + (c.reshape(-1) - (cols - 1) // 2)
            start += delta * (frames - 1) + 1
        at += n
    checks.check_exact(float(out.min(initial=0.0)), float(out.max(initial=0.0)), "positions")
    return _float_out(out, device)


def v2pe_positions(
    visual_mask: Any,
    stride: float,
    *,
    tokens_per_image: int = 256,
    attention_mask: Any = None,
    pad_value: float = 1.0,
) -> Any:
    """V2PE's position ids: visual tokens a fraction of a position apart, float.

    Ge et al. 2024 (arXiv:2412.09616), OpenGVLab/V2PE ``get_rope_pos_id`` (versions
    ``v2pe_fix`` and, with a stride drawn per image in training, ``v2pe_rnd``). Every
    visual token advances the position by ``delta = stride / tokens_per_image``;
    every text token continues at ``ceil(previous) + 1``; the count starts at -1
    before the first token. So a run of ``n`` visual tokens after text at ``P`` sits
    at ``P + delta, ..., P + n delta`` and the next text token at ``ceil(P + n delta)
    + 1``. The reference draws ``stride`` from ``{1, 2, 4, ..., 256}`` per image in
    training and fixes it at evaluation (``rope_pos_id_stride``).

    Mark as visual the image-content tokens only (InternVL's ``<IMG_CONTEXT>``); the
    ``<img>`` and ``</img>`` tokens around them are text, as in the reference. Pads
    (``attention_mask`` 0) do not advance the count and get ``pad_value`` (1.0, the
    reference's ``masked_fill``).

    The positions are float64 (the reference's float32 holds ``delta = 1/256``
    steps exactly only below ``2**16``); :class:`posenc.Rotary` rotates them exactly.

    Args:
        visual_mask: ``(seq,)`` or ``(batch, seq)``, true (1) at visual tokens; bool,
            int or float 0/1, numpy or torch.
        stride: the positions an image of ``tokens_per_image`` tokens spans (any
            positive number).
        tokens_per_image: the denominator of ``delta`` (InternVL's
            ``num_image_token``, 256 per tile).
        attention_mask: 1 for real tokens, 0 for pads, shaped like ``visual_mask``;
            None means all real.
        pad_value: the position of every pad.

    Returns:
        float64 positions shaped like ``visual_mask`` (numpy, or torch on its device).

    Raises:
        TypeError: masks not numeric, ``stride`` or ``pad_value`` not numbers,
            ``tokens_per_image`` not an int.
        ValueError: mask values other than 0 and 1, wrong ranks, an
            ``attention_mask`` of another shape, ``stride <= 0``,
            ``tokens_per_image < 1``; positions beyond ``2**31``.

    Examples:
        >>> import torch
        >>> import posenc
        >>> visual = torch.tensor([0, 1, 1, 1, 1, 0, 0])  # text, 4 image tokens, text
        >>> posenc.v2pe_positions(visual, stride=2, tokens_per_image=4).tolist()
        [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    """
    visual = _as_array(visual_mask, "visual_mask", "bif", "0/1 values")
    stride = checks.check_number(stride, "stride", positive=True)
    tokens = checks.check_int(tokens_per_image, "tokens_per_image", minimum=1)
    pad_value = checks.check_number(pad_value, "pad_value")
    device = visual.device if checks.is_torch(visual) else None
    vis = _zero_one(visual, "visual_mask")
    if attention_mask is None:
        real = np.ones_like(vis)
    else:
        mask = _as_array(attention_mask, "attention_mask", "bif", "0/1 values")
        if tuple(mask.shape) != tuple(vis.shape):
            raise ValueError(
                f"attention_mask must be shaped like visual_mask {tuple(vis.shape)}; got "
                f"shape {tuple(mask.shape)}"
            )
        real = _zero_one(mask, "attention_mask")
    delta = stride / tokens
    vis &= real
    text = real & ~vis
    before = np.zeros_like(vis)
    before[..., 1:] = vis[..., :-1]
    after = np.zeros_like(vis)
    after[..., :-1] = vis[..., 1:]
    count = np.cumsum(vis, axis=-1, dtype=np.int64)
    # j: the index (from 1) of a visual token in its run, from the count at the run start
    run_base = np.maximum.accumulate(np.where(vis & ~before, count - 1, 0), axis=-1)
    j = count - run_base
    # a run of n ends by moving the integer anchor ceil(n delta) on (exclusive sum:
    # the run's own tokens still count from the text before it)
    ends = np.where(vis & ~after, np.ceil(j * delta), 0.0)
    anchor = (np.cumsum(text, axis=-1, dtype=np.int64) - 1) + (np.cumsum(ends, axis=-1) - ends)
    out = np.where(vis, anchor + j * delta, anchor)
    out = np.where(real, out, pad_value)
    if out.size:
        checks.check_exact(float(out.min()), float(out.max()), "positions")
    return _float_out(out, device)


def _zero_one(mask: Any, name: str) -> npt.NDArray[np.bool_]:
    """A 0/1 mask (numpy or torch) as a numpy bool array."""
    if checks.is_torch(mask):
        mask = mask.detach().cpu().numpy()
    if ((mask != 0) & (mask != 1)).any():
        raise ValueError(f"{name} must hold only 0 and 1")
    out: npt.NDArray[np.bool_] = mask != 0
    return out
