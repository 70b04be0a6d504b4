"""FoPE, Fourier Position Embedding: each pair rotated by a learned mix of frequencies.

Hua et al. 2024, arXiv:2412.17739; TsinghuaC3I/Fourier-Position-Embedding
(``FourierEmbedding`` in ``olmo/model.py``) and vLLM's ``FourierRotaryEmbedding``
(``model_executor/layers/rotary_embedding/fope.py``), which loads its checkpoints.

Notation: ``H`` coefficient heads, ``D`` kept frequencies, ``d`` coefficient columns,
``t`` a position. From the RoPE frequencies ``omega_k = base ** (-2k / head_dim)``,
those below ``2 pi / L`` (``L = max_position_embeddings``, the training length:
pairs that never complete a turn in training) are set to zero and dropped, leaving
``D``. Per head ``h``::

    C_h(t) = cos(t omega) @ cos_coef[h]        (D,) @ (D, d) -> (d,)
    S_h(t) = sin(t omega) @ sin_coef[h]

padded to ``head_dim / 2`` columns (cos with 1; sin with 0 in vLLM, with 1 in the
reference: ``padding``), repeated as ``cat(C, C)`` and ``cat(S, S)``, and
``x' = x C + rotate_half(x) S`` in float32 (HF's half layout). posenc evaluates
``cos(t omega)`` and ``sin(t omega)`` exactly and sums ``C`` and ``S`` in float64 (on
CPU and CUDA) before rounding them to float32; the references do both in float32. The
coefficients are ``(H, D, d)`` with ``d = min(D, head_dim // 4)`` in the reference;
``H`` is vLLM's ``num_key_value_heads`` (query head ``i`` of ``q_heads`` uses
coefficient head ``i // (q_heads / H)``, as grouped-query attention shares keys) and
``H = 1`` shares one set across heads (the reference's
``fourier_separate_head=False``). The reference initialises them as identity (a step
identity when ``d < D``) plus xavier-normal noise of gain ``init_gain``
(``fourier_init="eye_xavier_norm"``) and keeps them frozen
(``fourier_learnable=False``); with identity coefficients and sin padding 0, FoPE is
RoPE on the ``d`` highest frequencies and leaves the other pairs as they are.

Shapes: ``q`` and ``k`` are ``(batch, heads, seq, head_dim)`` (``seq_dim=-2``) or
``(batch, seq, heads, head_dim)`` (``seq_dim=-3``).
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from posenc.core import checks
from posenc.core.angles import PI, decimal_context, float64_is_fast, sincos_torch
from posenc.core.buffers import DerivedBuffers
from posenc.families.rotary.schedules import RopeFrequencies, frequencies

#: What ``FoPE(padding=...)`` accepts: vLLM's (sin padded with 0) or the reference's (1).
FOPE_PADDINGS = ("identity", "reference")


def fope_frequencies(head_dim: int, base: float, max_position_embeddings: int) -> RopeFrequencies:
    """The RoPE frequencies FoPE keeps: those of at least ``2 pi / max_position_embeddings``.

    The reference (``rope_clamp_floor_freq`` with ``rope_clamp_floor_to_zero``, then
    ``fourier_ignore_zero``) zeroes ``omega < 2 pi / L`` and drops the zeros; vLLM keeps
    ``omega > 2 pi / L`` (the two differ only at exact equality).

    Raises:
        ValueError: no frequency kept (``max_position_embeddings`` below ``2 pi``).
    """
    length = checks.check_int(max_position_embeddings, "max_position_embeddings", minimum=1)
    freqs = frequencies("default", head_dim, base)
    ctx = decimal_context()
    floor = ctx.divide(ctx.multiply(2, PI), decimal.Decimal(length))
    kept = tuple(w for w in freqs.omega if w >= floor)
    if not kept:
        raise ValueError(
            f"FoPE keeps the frequencies of at least 2 pi / max_position_embeddings; with "
            f"max_position_embeddings={length} none is (the highest is 1 rad per position)"
        )
    return RopeFrequencies(kept)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class FoPE(DerivedBuffers):
    """Fourier Position Embedding for queries and keys (Hua et al. 2024, FoPE).

    ``fope(q, k)`` returns ``q`` and ``k`` with every channel pair ``(i, i +
    head_dim / 2)`` mixed by ``C_h(t)`` and ``S_h(t)`` (see :mod:`posenc.rotary.fope`):
    vLLM's ``FourierRotaryEmbedding.forward_native`` with exact angles ``t * omega``
    (float positions too), the rest in float32 (float64 for float64 inputs).

    ``cos_coef`` and ``sin_coef`` are parameters, ``(num_heads, D, coef_dim)``, in the
    state dict under those names (vLLM's), loaded from a checkpoint with
    ``load_state_dict``; frozen unless ``learnable``.

    Args:
        head_dim: channels per head (even).
        num_heads: coefficient heads ``H``: vLLM's ``num_key_value_heads``; 1 shares
            one set of coefficients across heads. ``q`` and ``k`` head counts must be
            multiples of it.
        max_position_embeddings: the training length ``L``: frequencies below ``2 pi /
            L`` are dropped.
        base: ``rope_theta``.
        coef_dim: ``d``, the coefficient columns (``<= head_dim / 2``); the
            reference's ``min(D, head_dim // 4)`` by default. vLLM's checkpoints hold
            ``(H, D, D)`` coefficients: pass ``coef_dim=D`` (``fope.num_frequencies``
            for a module with the default) to load them.
        padding: the columns past ``coef_dim``: ``"identity"`` (cos 1, sin 0: the
            pair passes through; vLLM) or ``"reference"`` (cos 1, sin 1, as the
            TsinghuaC3I code pads both: ``x + rotate_half(x)``, the same at every
            position). Checkpoints trained with one need that one.
        init_gain: the xavier-normal gain of the noise on the identity at
            initialisation (the reference's ``fourier_init_norm_gain``, 0.3 in its
            configs); 0 starts from the identity exactly.
        learnable: train the coefficients (the reference keeps them frozen).
        seq_dim: ``-2`` for ``(batch, heads, seq, head_dim)``, ``-3`` for ``(batch,
            seq, heads, head_dim)``.

    Attributes:
        inv_freq: float32 ``(D,)`` kept frequencies.
        num_frequencies: ``D``.

    Raises:
        TypeError: non-int sizes, non-numeric ``base`` or ``init_gain``, a non-bool
            ``learnable``.
        ValueError: odd ``head_dim``, sizes out of range, no frequency kept, a
            ``coef_dim`` above ``head_dim / 2``, an unknown ``padding`` or ``seq_dim``.

    Examples:
        >>> import torch
        >>> import posenc
        >>> _ = torch.manual_seed(0)
        >>> fope = posenc.FoPE(64, num_heads=4, max_position_embeddings=2048)
        >>> q, k = torch.randn(1, 4, 8, 64), torch.randn(1, 4, 8, 64)  # (batch, heads, seq, dim)
        >>> q1, k1 = fope(q, k)
        >>> q1.shape, k1.shape
        (torch.Size([1, 4, 8, 64]), torch.Size([1, 4, 8, 64]))
        >>> fope.num_frequencies, tuple(fope.cos_coef.shape)  # 21 of the 32 frequencies kept
        (21, (4, 21, 16))
        >>> sorted(fope.state_dict())  # vLLM's names
        ['cos_coef', 'sin_coef']
    """

    inv_freq: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        num_heads: int = 1,
        *,
        max_position_embeddings: int,
        base: float = 10000.0,
        coef_dim: int | None = None,
        padding: Literal["identity", "reference"] = "identity",
        init_gain: float = 0.3,
        learnable: bool = False,
        seq_dim: int = -2,
    ) -> None:
        super().__init__()
        self.head_dim = checks.check_channels(head_dim, "head_dim", minimum=2)
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even; got {head_dim}")
        self.num_heads = checks.check_int(num_heads, "num_heads", minimum=1)
        self.base = checks.check_number(base, "base", positive=True)
        self.max_position_embeddings = checks.check_int(
            max_position_embeddings, "max_position_embeddings", minimum=1
        )
        self.freqs = fope_frequencies(self.head_dim, self.base, self.max_position_embeddings)
        self.num_frequencies = len(self.freqs.omega)
        half = self.head_dim // 2
        if coef_dim is None:
            coef_dim = min(self.num_frequencies, self.head_dim // 4) or 1
        self.coef_dim = checks.check_int(coef_dim, "coef_dim", minimum=1)
        if self.coef_dim > half:
            raise ValueError(f"coef_dim must be <= head_dim / 2 = {half}; got {coef_dim}")
        checks.check_choice(padding, "padding", FOPE_PADDINGS)
        self.padding = padding
        self.init_gain = checks.check_number(init_gain, "init_gain")
        if self.init_gain < 0:
            raise ValueError(f"init_gain must be >= 0; got {init_gain}")
        checks.check_bool(learnable, "learnable")
        if isinstance(seq_dim, bool) or seq_dim not in (-2, -3):
            raise ValueError(
                f"seq_dim must be -2 (batch, heads, seq, head_dim) or -3 "
                f"(batch, seq, heads, head_dim); got {seq_dim!r}"
            )
        self.seq_dim = seq_dim
        size = (self.num_heads, self.num_frequencies, self.coef_dim)
        checks.check_elements(2 * math.prod(size), f"FoPE coefficients of shape {size}")
        self.cos_coef = nn.Parameter(torch.empty(size), requires_grad=learnable)
        self.sin_coef = nn.Parameter(torch.empty(size), requires_grad=learnable)
        self.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"{self.head_dim}, num_heads={self.num_heads}, "
            f"max_position_embeddings={self.max_position_embeddings}, base={self.base:g}, "
            f"frequencies={self.num_frequencies}, coef_dim={self.coef_dim}, "
            f"padding={self.padding!r}"
        )

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        return {"inv_freq": torch.tensor(self.freqs.inv_freq, dtype=torch.float32)}

    def _init_parameters(self) -> None:
        # the reference's "eye_xavier_norm": xavier-normal noise plus a step identity,
        # column i reading frequency i * ceil(D / d)
        step = -(-self.num_frequencies // self.coef_dim)
        ones = [(i * step, i) for i in range(self.coef_dim) if i * step < self.num_frequencies]
        for coef in (self.cos_coef, self.sin_coef):
            if self.init_gain > 0:
                nn.init.xavier_normal_(coef, gain=self.init_gain)
            else:
                coef.zero_()
            for row, col in ones:
                coef[:, row, col] += 1.0

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(C, S)`` at ``positions``: ``positions.shape + (num_heads, head_dim)``.

        Padded and repeated as ``cat(C, C)``, ready for ``x C + rotate_half(x) S``;
        from exact ``cos(t omega)`` and ``sin(t omega)``, summed in float64 (float32
        on devices without fast float64) and rounded once to ``dtype``.

        Raises:
            TypeError: ``positions`` not an int or float tensor.
            ValueError: positions beyond ``2**31``; a result of more than
                :data:`posenc.core.checks.MAX_ELEMENTS` values (refused before any work).
        """
        positions = checks.check_position_tensor(positions, "positions")
        count = positions.numel() * self.num_heads * self.head_dim
        if count > checks.MAX_ELEMENTS:
            checks.check_elements(
                count,
                f"FoPE tables of positions (shape {tuple(positions.shape)}) x "
                f"num_heads={self.num_heads} x head_dim={self.head_dim}",
            )
        positions = checks.check_position_tensor(positions, "positions", exact=True)
        device = self.cos_coef.device
        sin, cos = sincos_torch(positions.to(device), self.freqs.turns)
        # the D-term sums in float64 where the device has it, rounded once: the same
        # values whatever the batch (a float32 einsum's blocking changes with its size)
        table = torch.float64 if float64_is_fast(device) else torch.float32
        c = torch.einsum("...D,hDd->...hd", cos.to(table), self.cos_coef.to(table)).to(dtype)
        s = torch.einsum("...D,hDd->...hd", sin.to(table), self.sin_coef.to(table)).to(dtype)
        pad = self.head_dim // 2 - self.coef_dim
        if pad:
            c = torch.cat([c, c.new_ones((*c.shape[:-1], pad))], dim=-1)
            fill = 0.0 if self.padding == "identity" else 1.0
            s = torch.cat([s, s.new_full((*s.shape[:-1], pad), fill)], dim=-1)
        return torch.cat([c, c], dim=-1), torch.cat([s, s], dim=-1)

    def _apply_to(
        self, name: str, x: torch.Tensor, c: torch.Tensor, s: torch.Tensor
    ) -> torch.Tensor:
        """``x C + rotate_half(x) S`` with ``c``, ``s`` shaped ``(..., seq, H, head_dim)``
        (the heads repeated to ``x``'s, then moved before ``seq`` for ``seq_dim=-2``)."""
        heads = x.shape[-2] if self.seq_dim == -3 else x.shape[-3]
        if heads % self.num_heads:
            raise ValueError(
                f"{name} has {heads} heads, not a multiple of num_heads={self.num_heads} "
                f"(the coefficient heads); got shape {tuple(x.shape)}"
            )
        group = heads // self.num_heads
        if group > 1:
            c, s = c.repeat_interleave(group, dim=-2), s.repeat_interleave(group, dim=-2)
        if self.seq_dim == -2:
            c, s = c.movedim(-2, -3), s.movedim(-2, -3)  # (..., heads, seq, head_dim)
        xw = x.to(c.dtype)
        return (xw * c + _rotate_half(xw) * s).to(x.dtype)

    def rotate(
        self, xs: Sequence[torch.Tensor], positions: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Every ``x`` ``(batch, heads, seq, head_dim)`` of ``xs`` turned by FoPE at ``positions``.

        The :class:`posenc.rotary.rotation.Rotation` protocol that
        :func:`posenc.attention` reads: ``positions`` ``(seq,)`` or ``(rows, seq)``;
        each tensor's heads a multiple of ``num_heads`` (its coefficient heads).

        Raises:
            ValueError: a tensor without ``head_dim`` channels or whose heads are no
                multiple of ``num_heads``.
        """
        if not xs:
            return ()
        c, s = self.cos_sin(positions, dtype=checks.work_dtype(xs[0].dtype))
        c, s = c.to(xs[0].device).movedim(-2, -3), s.to(xs[0].device).movedim(-2, -3)
        out = []
        for x in xs:
            heads = x.shape[1]
            if x.ndim != 4 or x.shape[-1] != self.head_dim or heads % self.num_heads:
                raise ValueError(
                    f"FoPE takes (batch, heads, seq, head_dim={self.head_dim}) with heads a "
                    f"multiple of num_heads={self.num_heads}; got shape {tuple(x.shape)}"
                )
            group = heads // self.num_heads
            cc, ss = (c, s) if group == 1 else (t.repeat_interleave(group, dim=-3) for t in (c, s))
            xw = x.to(cc.dtype)
            out.append((xw * cc + _rotate_half(xw) * ss).to(x.dtype))
        return tuple(out)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        offset: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply FoPE to ``q`` and ``k``.

        Args:
            q: ``(batch, heads, seq, head_dim)`` (``seq_dim=-2``) or ``(batch, seq,
                heads, head_dim)`` (``seq_dim=-3``); a batch-less form drops the first
                dim.
            k: like ``q``, possibly with another head count (GQA).
            positions: ``(seq,)`` or ``(batch, seq)`` int or float positions; ``None``
                means ``offset .. offset + seq - 1``.
            offset: the first position when ``positions`` is None (tokens already in
                the KV cache).

        Returns:
            ``(q', k')``, shaped and typed like ``q`` and ``k``.

        Raises:
            TypeError: non-float ``q``/``k`` or of different dtypes, a non-int
                ``offset``, bad ``positions``.
            ValueError: wrong ``head_dim``, ranks, sequence lengths or head counts
                (named); ``positions`` and a non-zero ``offset``.
        """
        q = checks.check_float_tensor(q, "q")
        k = checks.check_float_tensor(k, "k")
        if q.dtype != k.dtype:
            raise TypeError(f"q and k must have the same dtype; got {q.dtype} and {k.dtype}")
        dim = self.seq_dim
        for name, t in (("q", q), ("k", k)):
            if t.ndim < 3 or t.shape[-1] != self.head_dim:
                raise ValueError(
                    f"{name} must be (batch, heads, seq, head_dim) or (batch, seq, heads, "
                    f"head_dim) with head_dim={self.head_dim}; got shape {tuple(t.shape)}"
                )
        seq = q.shape[dim]
        if k.shape[dim] != seq:
            raise ValueError(
                f"q and k must have the same sequence length (dim {dim}); got {seq} and "
                f"{k.shape[dim]}"
            )
        if positions is None:
            checks.check_int(offset, "offset", minimum=-(2**31) + 1)
            positions = torch.arange(offset, offset + seq, device=q.device)
        else:
            if not checks.is_zero(offset):
                raise ValueError("pass positions or offset, not both: positions are absolute")
            positions = checks.check_position_tensor(positions, "positions")
            ok = positions.ndim in (1, 2) and positions.shape[-1] == seq
            if positions.ndim == 2:
                ok = ok and q.ndim == k.ndim == 4 and positions.shape[0] in (1, q.shape[0])
            if not ok:
                raise ValueError(
                    f"positions must be (seq,) or (batch, seq) matching q {tuple(q.shape)} "
                    f"(seq_dim={dim}); got shape {tuple(positions.shape)}"
                )
        c, s = self.cos_sin(positions, dtype=checks.work_dtype(q.dtype))
        c, s = c.to(q.device), s.to(q.device)
        return self._apply_to("q", q, c, s), self._apply_to("k", k, c, s)
