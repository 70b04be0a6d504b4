"""Dual Chunk Attention's rotation (An et al. 2024, "Training-Free Long-Context Scaling of
Large Language Models"; Qwen2.5-1M's ``dual_chunk_attention_config``).

A model trained with RoPE on ``chunk_size`` positions reads a longer sequence in chunks
of ``chunk_len = chunk_size - local_size`` tokens, so that no relative distance it sees
exceeds what it was trained on. Keys are rotated at their position within their chunk,
``j mod chunk_len``; a query at ``i`` is rotated three ways, and each (query, key) pair
is scored by one of them, as vLLM's ``DualChunkRotaryEmbedding`` rotates them
(``model_executor/layers/rotary_embedding/dual_chunk_rope.py``) and its Dual Chunk
Flash Attention backend pairs them (``attention/backends/dual_chunk_flash_attn.py``,
its dense prefill and decode paths):

============  =================================  ======================================
 key's chunk   query rotated at                   distance seen
============  =================================  ======================================
 same          ``i mod L``          (intra)       ``i - j``, as trained
 previous      ``min(i mod L + L, chunk_size)``   at most ``chunk_size``
               (successive)
 earlier       ``min(2L - 1, chunk_size)``        at most ``chunk_size``
               (inter)
============  =================================  ======================================

(``L = chunk_len``). The three parts form one softmax (vLLM computes them apart and
merges them by their log-sum-exps, which is the same). Within one chunk everything is
plain RoPE. With ``original_max_position_embeddings``, queries and keys are both
scaled by ``s = max(1, 0.1 ln(n / original) + 1)``, ``n`` the sequence's length (the
document's, when packed), so the scores gain ``s**2``, as vLLM scales the keys in the
cache and the softmax scale (or the decoding query) each by ``s``.

:class:`DualChunkRotary` is a :class:`posenc.rotary.rotation.PairRotation`: its
``rotate_pair`` gives attention the three query variants side by side and which one
scores each pair. Causal attention only (vLLM refuses anything else).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from posenc.core import checks
from posenc.families.rotary.module import Rotary
from posenc.families.rotary.rotation import RotatedPair
from posenc.families.rotary.tables import Layout

#: The query variants, in the order they sit side by side (and their index in ``choose``).
VARIANTS = ("intra", "successive", "inter")


class DualChunkRotary(nn.Module):
    """Dual Chunk Attention's rotation of queries and keys, for :func:`posenc.attention`.

    Args:
        head_dim: channels of a head.
        chunk_size: the positions the model was trained on (vLLM's and Qwen2.5-1M's
            ``dual_chunk_attention_config["chunk_size"]``).
        local_size: the overlap kept for the successive chunk; chunks hold
            ``chunk_size - local_size`` tokens (``local_size``).
        base: RoPE's base (a config's ``rope_theta``).
        rotary_dim: channels rotated (the first ones; ``head_dim`` by default).
        layout: ``"half"`` (GPT-NeoX, HF, vLLM's ``is_neox_style``) or ``"interleaved"``.
        original_max_position_embeddings: scale queries and keys by ``max(1, 0.1
            ln(n / original) + 1)`` for a sequence of ``n`` tokens, as vLLM does where
            the config gives it; None (or 0, vLLM's default): no scaling.

    Raises:
        TypeError: a size that is not an int.
        ValueError: ``chunk_size < 2``, ``local_size`` not in ``[0, chunk_size)``, and
            the errors of :class:`posenc.Rotary` for ``head_dim``, ``rotary_dim``,
            ``base`` and ``layout``.

    Examples:
        >>> import torch
        >>> import posenc
        >>> dca = posenc.DualChunkRotary(16, chunk_size=8, local_size=2)  # chunks of 6
        >>> q, k, v = torch.randn(3, 1, 2, 20, 16).unbind(0)
        >>> out = posenc.attention(q, k, v, rotary=dca, causal=True)
        >>> out.shape
        torch.Size([1, 2, 20, 16])
        >>> dca.query_positions(torch.tensor([0, 5, 6, 13])).tolist()  # intra, succ., inter
        [[0, 5, 0, 1], [6, 8, 6, 7], [8, 8, 8, 8]]
        >>> rope = posenc.attention(q[:, :, :6], k[:, :, :6], v[:, :, :6],
        ...                         rotary=posenc.Rotary(16), causal=True)
        >>> torch.allclose(out[:, :, :6], rope, atol=1e-6)  # one chunk: plain RoPE
        True
    """

    def __init__(
        self,
        head_dim: int,
        *,
        chunk_size: int,
        local_size: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Layout = "half",
        original_max_position_embeddings: int | None = None,
    ) -> None:
        super().__init__()
        self.chunk_size = checks.check_int(chunk_size, "chunk_size", minimum=2)
        self.local_size = checks.check_int(local_size, "local_size", minimum=0)
        if self.local_size >= self.chunk_size:
            raise ValueError(
                f"local_size must be in [0, chunk_size) = [0, {chunk_size}); got {local_size}"
            )
        original = original_max_position_embeddings
        self.original_max_position_embeddings = (
            None
            if not original
            else checks.check_int(original, "original_max_position_embeddings", minimum=1)
        )
        self.rotary = Rotary(head_dim, base=base, rotary_dim=rotary_dim, layout=layout)

    @property
    def chunk_len(self) -> int:
        """Tokens per chunk: ``chunk_size - local_size``."""
        return self.chunk_size - self.local_size

    def query_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The positions each query is rotated at, ``(3, *positions.shape)``: intra,
        successive and inter (the module docstring's table)."""
        within = torch.remainder(positions, self.chunk_len)
        successive = (within + self.chunk_len).clamp(max=self.chunk_size)
        inter = torch.full_like(within, min(2 * self.chunk_len - 1, self.chunk_size))
        return torch.stack((within, successive, inter))

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The positions keys are rotated at: within their chunk, ``j mod chunk_len``."""
        return torch.remainder(positions, self.chunk_len)

    def variant(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Which query variant scores each pair, ``(..., n, m)`` from positions ``(..., n)`` and
        ``(..., m)``: 0 in the key's chunk (or a later key's), 1 in the next, 2 beyond."""
        chunk_q = torch.div(q_positions, self.chunk_len, rounding_mode="floor")
        chunk_k = torch.div(k_positions, self.chunk_len, rounding_mode="floor")
        return (chunk_q[..., :, None] - chunk_k[..., None, :]).clamp(0, len(VARIANTS) - 1)

    def scaling(self, positions: torch.Tensor) -> torch.Tensor | None:
        """Each position's factor ``max(1, 0.1 ln(n / original) + 1)`` (``n`` its sequence's
        or packed document's length: positions restart at 0 with each), or None without
        ``original_max_position_embeddings``."""
        if self.original_max_position_embeddings is None:
            return None
        rows = positions.reshape(-1, positions.shape[-1])
        doc = (rows == 0).cumsum(-1).clamp(min=1) - 1
        top = torch.zeros_like(rows).scatter_reduce(-1, doc, rows, "amax", include_self=True)
        length = (top.gather(-1, doc) + 1).to(torch.float64)
        factor = (0.1 * torch.log(length / self.original_max_position_embeddings) + 1).clamp(min=1)
        return factor.reshape(positions.shape)

    def rotate_pair(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> RotatedPair:
        """The three query variants side by side and the keys, rotated; ``choose`` picks a
        pair's variant from the positions given here (within packed documents).

        Raises:
            ValueError: more queries than keys (queries are the last keys), or tensors
                without ``head_dim`` channels.
        """
        lq, lk = q.shape[2], k.shape[2]
        if lq > lk:
            raise ValueError(
                f"Dual Chunk Attention's queries are the last keys (causal attention); got "
                f"q_len={lq} > k_len={lk}"
            )
        (rk,) = self.rotary.rotate((k,), self.key_positions(k_positions))
        parts = [self.rotary.rotate((q,), p)[0] for p in self.query_positions(q_positions)]
        factor = self.scaling(k_positions)
        if factor is not None:
            rk = rk * _rows(factor, rk)
            qf = _rows(factor[..., lk - lq :], q)
            parts = [p * qf for p in parts]
        offset = lk - lq
        q_rows, k_rows = q_positions.reshape(-1, lq), k_positions.reshape(-1, lk)

        def choose(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
            return self.variant(q_rows[:, q_pos - offset], k_rows[:, k_pos])

        return RotatedPair(torch.cat(parts, -1), rk, len(VARIANTS), choose)

    @classmethod
    def from_config(cls, config: Any) -> DualChunkRotary:
        """From a transformers config (or its dict) with ``dual_chunk_attention_config``
        (Qwen2.5-1M): ``head_dim`` (else ``hidden_size / num_attention_heads``),
        ``rope_theta`` (or transformers 5's ``rope_parameters["rope_theta"]``) and the
        dict's ``chunk_size``, ``local_size`` (vLLM's defaults 8192 and 1024) and
        ``original_max_position_embeddings``.

        Raises:
            ValueError: no ``dual_chunk_attention_config``, or sizes the module refuses.

        Examples:
            >>> import posenc
            >>> config = {"hidden_size": 5120, "num_attention_heads": 40, "rope_theta": 1e7,
            ...           "dual_chunk_attention_config": {"chunk_size": 262144,
            ...           "local_size": 8192, "original_max_position_embeddings": 262144}}
            >>> dca = posenc.DualChunkRotary.from_config(config)
            >>> dca.chunk_len, dca.rotary.base
            (253952, 10000000.0)
        """

        def get(name: str) -> Any:
            return config.get(name) if isinstance(config, dict) else getattr(config, name, None)

        dca = get("dual_chunk_attention_config")
        if not dca:
            raise ValueError("config has no dual_chunk_attention_config")
        head_dim = get("head_dim")
        if not head_dim:
            heads, hidden = get("num_attention_heads"), get("hidden_size")
            if not heads or not hidden:
                raise ValueError("config needs head_dim, or hidden_size and num_attention_heads")
            head_dim = hidden // heads
        params = get("rope_parameters") or {}
        base = params.get("rope_theta") or get("rope_theta") or 10000.0
        return cls(
            head_dim,
            chunk_size=dca.get("chunk_size", 8192),
            local_size=dca.get("local_size", 1024),
            base=base,
            original_max_position_embeddings=dca.get("original_max_position_embeddings"),
        )

    def extra_repr(self) -> str:
        """The sizes."""
        extra = ""
        if self.original_max_position_embeddings is not None:
            extra = f", original_max_position_embeddings={self.original_max_position_embeddings}"
        return f"chunk_size={self.chunk_size}, local_size={self.local_size}{extra}"


def _rows(factor: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``factor`` ``(seq,)`` or ``(rows, seq)`` as a multiplier of ``x`` ``(B, H, seq, D)``."""
    f = factor.to(x.dtype)
    return f[:, None, :, None] if f.ndim == 2 else f[:, None]
