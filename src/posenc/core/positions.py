"""Position numbers as the reference models compute them from tokens, masks and caches.

An absolute encoding is only as right as the positions it is given. Each helper
reproduces one convention users already run; numpy in gives numpy out, torch
in gives torch out on the same device (torch is imported only when a torch
object is passed or a ``device`` is asked for). Every result is int64.

Shapes: ``(seq,)`` or ``(batch, seq)``; cumulative sums run along the last axis.

- :func:`fairseq_positions`: fairseq ``utils.make_positions`` (HF M2M100,
  RoBERTa): real tokens are numbered from ``padding_idx + 1``, pads get
  ``padding_idx`` (the zero row of the table).
- :func:`opt_positions`: HF OPT: ``cumsum(mask) * mask - 1``, so left pads get
  ``-1`` and the first real token ``0`` (the embedding adds its offset 2).
- :func:`cache_positions`: ``past_length .. past_length + seq_len - 1``, the
  positions of new tokens behind a KV cache (HF ``cache_position``).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

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


def _as_array(x: Any, name: str, kinds: str, what: str) -> Any:
    """``x`` as a tensor (unchanged) or numpy array, of rank 1 or 2 and dtype kind in ``kinds``."""
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
    if x.ndim not in (1, 2):
        raise ValueError(f"{name} must be (seq,) or (batch, seq); got shape {tuple(x.shape)}")
    return x


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
    """
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
        m = mask.to(torch.int64)
        return (torch.cumsum(m, dim=-1) * m - 1)[..., past_length:]
    if ((mask != 0) & (mask != 1)).any():
        raise ValueError("attention_mask must hold only 0 and 1")
    m = mask.astype(np.int64)
    return (np.cumsum(m, axis=-1) * m - 1)[..., past_length:]


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
        ValueError: negative values, or both ``device`` and ``like`` given.
    """
    seq_len = _check_int(seq_len, "seq_len")
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
